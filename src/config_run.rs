//! The config's `[run]` table: how `agentvfs run` sets up the program it starts.

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, Parser};
use crate::vpath::VPath;

/// `[run]`: how `agentvfs run` sets up the program it starts (see `doc/run.md`).
#[derive(Debug, Clone, PartialEq)]
pub struct RunConfig {
    /// `HOME` inside, a virtual path created through the mount if missing; `None`: the
    /// default, `/home/<user name>` (on whatever route serves it, the scratch area by default).
    pub home: Option<VPath>,
    /// The caller's environment variables let through (when set), besides `HOME`, `PATH` and
    /// `AGENTVFS_SOCKET`.
    pub env: Vec<String>,
    /// Whether the program shares the host's network (otherwise an empty namespace).
    pub network: bool,
}

/// The variables `[run] env` lets through by default.
pub const DEFAULT_RUN_ENV: [&str; 4] = ["TERM", "LANG", "LC_ALL", "COLORTERM"];

impl Default for RunConfig {
    fn default() -> RunConfig {
        RunConfig { home: None, env: DEFAULT_RUN_ENV.iter().map(|s| s.to_string()).collect(), network: true }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRun {
    home: Option<Spanned<String>>,
    env: Option<Vec<Spanned<String>>>,
    network: Option<bool>,
}

impl Parser<'_> {
    /// `[run]`, with [`RunConfig::default`] for missing keys.
    pub(super) fn run(&self, raw: Option<&RawRun>) -> Result<RunConfig, ConfigError> {
        let mut run = RunConfig::default();
        let Some(raw) = raw else { return Ok(run) };
        run.network = raw.network.unwrap_or(run.network);
        if let Some(home) = &raw.home {
            let text = home.get_ref();
            let path = VPath::parse(text).ok().filter(|p| text.starts_with('/') && !p.is_root()).ok_or_else(
                || {
                    self.err(
                        Some(home.span()),
                        format!("[run] home {text:?} must be a virtual path below `/`, e.g. \"/home/agent\""),
                    )
                },
            )?;
            run.home = Some(path);
        }
        if let Some(names) = &raw.env {
            run.env.clear();
            for name in names {
                let n = name.get_ref();
                let valid = !n.is_empty() && !n.contains(['=', '\0']);
                if !valid {
                    return Err(self.err(
                        Some(name.span()),
                        format!("[run] env: {n:?} is not an environment variable name"),
                    ));
                }
                if !run.env.contains(n) {
                    run.env.push(n.clone());
                }
            }
        }
        Ok(run)
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::Config;
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse_str(text, "t.toml", Path::new("/"))
    }

    #[test]
    fn run_defaults_keys_and_errors() {
        let r = parse("").unwrap().run;
        assert_eq!(r, RunConfig::default());
        assert!(r.network && r.home.is_none());
        assert_eq!(r.env, ["TERM", "LANG", "LC_ALL", "COLORTERM"]);
        let text = "[run]\nhome = \"/home/agent\"\nenv = [\"TERM\", \"ANTHROPIC_API_KEY\", \"TERM\"]\nnetwork = false\n";
        let r = parse(text).unwrap().run;
        assert_eq!(r.home.as_ref().map(VPath::as_str), Some("/home/agent"));
        assert_eq!((r.env.join(","), r.network), ("TERM,ANTHROPIC_API_KEY".to_string(), false));
        let e = parse("[run]\n\nhme = \"/x\"\n").unwrap_err();
        assert!(e.message.contains("unknown field `hme`"), "{e}");
        assert_eq!(e.line, Some(3));
        let e = parse("[run]\nhome = \"relative\"\n").unwrap_err();
        assert_eq!(e.line, Some(2));
        assert!(e.message.starts_with("[run] home \"relative\" must be a virtual path"), "{e}");
        assert!(parse("[run]\nhome = \"/\"\n").is_err());
        let e = parse("[run]\nenv = [\"TERM\",\n \"A=B\"]\n").unwrap_err();
        assert_eq!(
            (e.line, e.message.as_str()),
            (Some(3), "[run] env: \"A=B\" is not an environment variable name")
        );
    }
}
