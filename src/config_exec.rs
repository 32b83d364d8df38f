//! The config's `[exec]` table: whether the `execute` tool is offered, and how its sandbox runs
//! a command.

use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, Parser, RouteConfig};
use crate::exec::identity::Identity;
use crate::vpath::VPath;

/// `[exec]`: whether `execute` is offered, and how its sandbox runs a command.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecConfig {
    pub enabled: bool,
    /// Used when a call gives no `timeout` (Deep Agents' LocalShellBackend default: 120 s).
    pub timeout: Duration,
    /// The largest `timeout` a call may ask for (Deep Agents' `max_execute_timeout`: 3600 s).
    pub max_timeout: Duration,
    /// Output beyond this many UTF-8 bytes is cut (LocalShellBackend's `max_output_bytes`).
    pub max_output_bytes: usize,
    /// Whether the command shares the host's network (otherwise it gets an empty namespace).
    pub network: bool,
    /// The command's working directory, a virtual path.
    pub cwd: VPath,
    /// The uid and gid the command runs as, and why (see [`Identity::resolve`]).
    pub identity: Identity,
}

impl ExecConfig {
    /// The defaults; `cwd` is `/workspace` when that route exists, else `/`; the identity is
    /// the sudo user's, else the first host route's owner's, else nobody's.
    pub fn defaults(routes: &[RouteConfig]) -> ExecConfig {
        let workspace = VPath::parse("/workspace").expect("a valid path");
        let cwd = if routes.iter().any(|r| r.path == workspace) { workspace } else { VPath::root() };
        ExecConfig {
            enabled: false,
            timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(3600),
            max_output_bytes: 100_000,
            network: false,
            cwd,
            identity: Identity::for_routes(None, None, routes),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExec {
    enabled: Option<bool>,
    timeout_seconds: Option<u64>,
    max_timeout_seconds: Option<u64>,
    max_output_bytes: Option<usize>,
    network: Option<bool>,
    cwd: Option<Spanned<String>>,
    uid: Option<Spanned<u32>>,
    gid: Option<Spanned<u32>>,
}

impl Parser<'_> {
    /// `[exec]`, with the defaults of [`ExecConfig::defaults`] for missing keys.
    pub(super) fn exec(
        &self,
        raw: Option<&Spanned<RawExec>>,
        routes: &[RouteConfig],
    ) -> Result<ExecConfig, ConfigError> {
        let mut exec = ExecConfig::defaults(routes);
        let Some(raw) = raw else { return Ok(exec) };
        let span = raw.span();
        let raw = raw.get_ref();
        exec.enabled = raw.enabled.unwrap_or(exec.enabled);
        exec.network = raw.network.unwrap_or(exec.network);
        for (key, value) in [("uid", &raw.uid), ("gid", &raw.gid)] {
            if let Some(v) = value.as_ref().filter(|v| *v.get_ref() == 0) {
                return Err(self.err(
                    Some(v.span()),
                    format!(
                        "[exec] {key} = 0 would run commands as root, able to write every file of \
                         every route; name an unprivileged user, or leave {key} unset for the \
                         workspace's owner"
                    ),
                ));
            }
        }
        if raw.uid.is_some() || raw.gid.is_some() {
            let (uid, gid) = (raw.uid.as_ref().map(|u| *u.get_ref()), raw.gid.as_ref().map(|g| *g.get_ref()));
            exec.identity = Identity::for_routes(uid, gid, routes);
        }
        exec.max_output_bytes = raw.max_output_bytes.unwrap_or(exec.max_output_bytes);
        if let Some(t) = raw.timeout_seconds {
            exec.timeout = Duration::from_secs(t);
        }
        if let Some(t) = raw.max_timeout_seconds {
            exec.max_timeout = Duration::from_secs(t);
        }
        if exec.timeout.is_zero() {
            return Err(self.err(Some(span), "[exec] timeout_seconds must be positive"));
        }
        if exec.timeout > exec.max_timeout {
            return Err(self.err(
                Some(span),
                format!(
                    "[exec] timeout_seconds ({}) exceeds max_timeout_seconds ({})",
                    exec.timeout.as_secs(),
                    exec.max_timeout.as_secs()
                ),
            ));
        }
        if exec.max_output_bytes == 0 {
            return Err(self.err(Some(span), "[exec] max_output_bytes must be positive"));
        }
        if let Some(cwd) = &raw.cwd {
            exec.cwd = VPath::parse(cwd.get_ref()).map_err(|e| {
                self.err(
                    Some(cwd.span()),
                    format!("[exec] cwd {:?} is not a virtual path: {e}", cwd.get_ref()),
                )
            })?;
        }
        Ok(exec)
    }
}
