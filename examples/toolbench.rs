//! Times one agent tool call through the engine, without a mount or a control socket (used by
//! scripts/bench.sh to compare `grep`/`glob` with ripgrep over the same tree).
//!
//! Usage: toolbench CONFIG TOOL JSON_ARGS [--runs N] [--print]
//! Builds the engine from CONFIG as the daemon does, calls TOOL with JSON_ARGS N times (default
//! 1), and prints the fastest call's seconds on stdout (`--print` also shows the result text
//! of the last call on stderr).

use std::path::PathBuf;
use std::time::Instant;

use agentvfs::config::Config;
use agentvfs::control::session::{Observation, Session};
use agentvfs::control::tools::{glob, grep, ToolEnv, ToolSpec};
use agentvfs::control::vfs::ToolFs;
use anyhow::{bail, Context, Result};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [config, tool, json_args, rest @ ..] = args.as_slice() else {
        bail!("usage: toolbench CONFIG TOOL JSON_ARGS [--runs N] [--print]");
    };
    let mut runs = 1;
    let mut print = false;
    let mut rest = rest.iter();
    while let Some(flag) = rest.next() {
        match flag.as_str() {
            "--runs" => runs = rest.next().context("--runs needs a number")?.parse()?,
            "--print" => print = true,
            other => bail!("unknown flag {other}"),
        }
    }
    // Only the tools a benchmark needs; others can be added as they land.
    let spec: &ToolSpec = match tool.as_str() {
        "glob" => &glob::SPEC,
        "grep" => &grep::SPEC,
        other => bail!("unknown tool {other}"),
    };
    let call_args: serde_json::Value = serde_json::from_str(json_args).context("JSON_ARGS")?;
    let config = Config::load(&PathBuf::from(config))?;
    let engine = agentvfs::daemon::build_engine(&config)?;
    let session = Session::new(Observation::Off);
    let env =
        ToolEnv { fs: ToolFs::new(&engine), session: &session, exec: None, call_id: None, structured: false };
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        let out = (spec.call)(&env, &call_args);
        best = best.min(start.elapsed().as_secs_f64());
        last = Some(out);
    }
    if print {
        let out = last.expect("at least one run");
        eprintln!("{}", out.joined_text());
    }
    println!("{best:.4}");
    Ok(())
}
