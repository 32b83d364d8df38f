//! The command line: `agentvfs mount | check | explain`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Result};
use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::policy::{Mode, Op, RuleSet};
use crate::vpath::VPath;

#[derive(Parser)]
#[command(
    name = "agentvfs",
    version,
    about = "A FUSE filesystem for AI agents: routes, and path rules on every syscall"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount the virtual tree and serve it in the foreground (until SIGINT/SIGTERM).
    Mount {
        /// The config file; without it an embedded default is used (`/workspace` = the current directory).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Where to mount; overrides `mountpoint` in the config.
        mountpoint: Option<PathBuf>,
    },
    /// Validate a config file and print its routes and rules.
    Check {
        #[arg(long)]
        config: PathBuf,
    },
    /// Show the decision for one operation on one path, and the rule that made it.
    Explain {
        #[arg(long)]
        config: Option<PathBuf>,
        /// `read` or `write`.
        operation: String,
        /// A virtual path, e.g. /workspace/.env (a trailing `/` judges it as a directory).
        path: String,
    },
}

fn load(config: Option<&PathBuf>) -> Result<Config> {
    match config {
        Some(path) => Ok(Config::load(path)?),
        None => Ok(Config::embedded(&std::env::current_dir()?)?),
    }
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentvfs: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn run(cli: Cli) -> Result<ExitCode> {
    match cli.command {
        Command::Mount { config, mountpoint } => {
            let loaded = load(config.as_ref())?;
            let mountpoint = mountpoint
                .or_else(|| loaded.mountpoint.clone())
                .ok_or_else(|| anyhow!("no mountpoint: pass one (`agentvfs mount /tmp/agentvfs`) or set `mountpoint` in the config"))?;
            let config_path = config.map(|c| std::path::absolute(&c).unwrap_or(c));
            crate::daemon::run(loaded, &mountpoint, config_path)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { config } => {
            let loaded = Config::load(&config)?;
            RuleSet::new(loaded.rules.clone()).map_err(|e| anyhow!("{e}"))?;
            println!("{}: ok", config.display());
            println!("routes:");
            for route in &loaded.routes {
                let detail = match &route.backend {
                    crate::config::BackendConfig::Host { root } => format!("host {}", root.display()),
                    crate::config::BackendConfig::Memory { max_bytes: Some(m) } => {
                        format!("memory (max {m} bytes)")
                    }
                    crate::config::BackendConfig::Memory { max_bytes: None } => "memory".to_string(),
                    crate::config::BackendConfig::Sqlite { database, namespace } => {
                        format!("sqlite {} (namespace {namespace})", database.display())
                    }
                };
                println!("  {:<20} {}", route.path.to_string(), detail);
            }
            println!("rules ({}, first match wins, no match allows):", loaded.rules.len());
            for (i, rule) in loaded.rules.iter().enumerate() {
                println!("  #{i} {}", rule.describe());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain { config, operation, path } => {
            let loaded = load(config.as_ref())?;
            let op = Op::parse(&operation)
                .ok_or_else(|| anyhow!("unknown operation {operation:?} (expected read or write)"))?;
            let is_dir = path.len() > 1 && path.ends_with('/');
            let vpath = VPath::parse(&path).map_err(|e| anyhow!("invalid path {path:?}: {e}"))?;
            let rules = RuleSet::new(loaded.rules.clone()).map_err(|e| anyhow!("{e}"))?;
            let verdict = rules.decide(op, &vpath, is_dir);
            let effect = match (verdict.mode, op, verdict.hide) {
                (Mode::Allow, _, _) => "allowed".to_string(),
                (Mode::Deny, Op::Read, true) => "denied: hidden (ENOENT, absent from listings)".to_string(),
                (Mode::Deny, _, _) => "denied (EACCES)".to_string(),
                (Mode::Interrupt, _, _) => "interrupt: waits for a human's approval".to_string(),
            };
            println!("{} {}{}: {effect}", op.as_str(), vpath, if is_dir { "/" } else { "" });
            match verdict.rule {
                Some(i) => println!("by rule #{i}: {}", rules.rules()[i].describe()),
                None => println!("no rule matches (default allow)"),
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
