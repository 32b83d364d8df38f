//! The control socket's methods (MCP and `vfs/*`): what each request does, given the
//! daemon's state and the connection's session. Transport lives in `server.rs`; the wire
//! format and the method table in `proto.rs`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Map, Value};

use crate::config::{BackendConfig, Config};
use crate::control::deferred::Deferred;
use crate::control::interrupts;
use crate::control::proto::{self, RpcError};
use crate::control::roles::{Roles, Socket};
use crate::control::session::{Observation, Session};
use crate::control::tools::execute::ExecEnv;
use crate::control::tools::{registry, Listed, ToolEnv};
use crate::control::transfer;
use crate::control::vfs::ToolFs;
use crate::engine::{Engine, Principal};
use crate::policy::{Mode, Op, RuleSet};
use crate::vpath::VPath;

/// What a successful reload did.
#[derive(Clone, Debug, PartialEq)]
pub struct Reloaded {
    pub rules: usize,
    /// The file the rules came from.
    pub config: PathBuf,
    /// Changes in the file that a reload does not apply (routes need a restart).
    pub warnings: Vec<String>,
}

/// Re-reads the rules (the daemon's SIGHUP path, shared so both behave the same).
pub type ReloadFn = Box<dyn Fn() -> Result<Reloaded, String> + Send + Sync>;

/// Live numbers for `vfs/status`.
#[derive(Default)]
pub struct Counters {
    pub connections_open: AtomicU64,
    pub connections_total: AtomicU64,
    pub peers_refused: AtomicU64,
    pub requests: AtomicU64,
    pub tool_calls: AtomicU64,
}

impl Counters {
    fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Everything the control door knows about the daemon it belongs to.
pub struct State {
    pub engine: Arc<Engine>,
    /// The config the daemon started with (routes and their backing locations).
    pub config: Config,
    pub mountpoint: PathBuf,
    /// The control socket.
    pub socket: PathBuf,
    pub agent_socket: PathBuf,
    /// Who may use which socket.
    pub roles: Roles,
    pub reload: ReloadFn,
    pub started: Instant,
    pub counters: Counters,
    /// The `execute` sandbox's settings, when `[exec] enabled`.
    pub exec: Option<ExecEnv>,
    /// Approvals of tool calls that did not wait (`tools/call` with `wait: false`).
    pub deferred: Arc<Deferred>,
}

/// Who is on the other end of a connection (from SO_PEERCRED), and on which socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
    pub groups: crate::engine::Groups,
    pub socket: Socket,
}

impl Peer {
    /// The peer as audit records and tickets name it.
    pub fn principal(&self) -> Principal {
        Principal { uid: self.uid, gid: self.gid, groups: self.groups, pid: self.pid, socket: self.socket }
    }
}

impl State {
    pub fn new(
        engine: Arc<Engine>,
        config: Config,
        mountpoint: PathBuf,
        reload: ReloadFn,
        roles: Roles,
    ) -> State {
        let exec = config
            .exec
            .enabled
            .then(|| ExecEnv { config: config.exec.clone(), mountpoint: mountpoint.clone() });
        let uid = config.exec.identity.uid;
        if config.exec.enabled && !config.allow_other && uid != nix::unistd::geteuid().as_raw() {
            // The kernel keeps other users off a mount without allow_other.
            tracing::warn!(
                "[exec] uid {uid} cannot use the mount while [fuse] allow_other = false; execute will fail"
            );
        }
        State {
            engine,
            exec,
            socket: config.socket.clone(),
            agent_socket: config.agent_socket.clone(),
            roles,
            config,
            mountpoint,
            reload,
            started: Instant::now(),
            counters: Counters::default(),
            deferred: Arc::default(),
        }
    }

    /// Which optional tools this daemon offers.
    pub fn listed(&self) -> Listed {
        Listed { execute: self.exec.is_some() }
    }

    /// Answers one request (`id` is the request's JSON-RPC id).
    pub fn handle(
        &self,
        session: &Session,
        peer: &Peer,
        id: &proto::Id,
        method: &str,
        params: Option<&Value>,
    ) -> Result<Value, RpcError> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        match method {
            "initialize" => initialize(&proto::params_object(params)?, self),
            "ping" => Ok(json!({})),
            "tools/list" => {
                proto::params_object(params)?;
                Ok(tools_list(&self.listed()))
            }
            "tools/call" => self.tools_call(session, peer, id, &proto::params_object(params)?),
            "vfs/upload" => {
                let params = proto::params_object(params)?;
                let env = self.tool_env(session, peer, "vfs/upload", &Value::Object(params.clone()), None);
                transfer::upload(&env, &session.staging, &params)
            }
            "vfs/download" => {
                let params = proto::params_object(params)?;
                let env = self.tool_env(session, peer, "vfs/download", &Value::Object(params.clone()), None);
                let Some(_turn) = session.replies.turn() else {
                    return Err(RpcError::internal("the client went away"));
                };
                transfer::download(&env, &params)
            }
            "vfs/status" => Ok(self.status()),
            "vfs/paths" => {
                let mut answer = paths(&self.config, &self.mountpoint);
                // Which socket answered: `agentvfs run` binds only the agent socket into its
                // sandbox, and a control socket there would let the program approve itself.
                answer["socket"] = json!(peer.socket.as_str());
                Ok(answer)
            }
            "vfs/explain" => {
                let params = proto::params_object(params)?;
                let operation = string_param(&params, "operation")?;
                let path = string_param(&params, "path")?;
                explain(&self.engine.gate.rules(), operation, path).map_err(RpcError::invalid_params)
            }
            "vfs/reload" => match (self.reload)() {
                Ok(r) => Ok(json!({"rules": r.rules, "config": r.config, "warnings": r.warnings})),
                Err(e) => Err(RpcError::new(
                    proto::OPERATION_FAILED,
                    format!("reload failed, keeping the current rules: {e}"),
                )),
            },
            "interrupts/list" => Ok(interrupts::list(&self.engine.gate.approvals)),
            "interrupts/resolve" => {
                let mut view = interrupts::resolve(
                    &self.engine.gate.approvals,
                    peer,
                    session,
                    &proto::params_object(params)?,
                )?;
                // Tell the approver which guarded paths a session grant opens: a listing
                // approved for the session opens the guarded files beneath it too.
                let grant = view.get("session_grant").cloned();
                let op = grant.as_ref().and_then(|g| Op::parse(g["op"].as_str()?));
                let root = grant.as_ref().and_then(|g| VPath::parse(g["root"].as_str()?).ok());
                if let (Some(op), Some(root)) = (op, root) {
                    let rules = self.engine.gate.rules();
                    let guarded = rules.overlapping_patterns(&root, &[op], &[Mode::Interrupt]);
                    view["session_grant"]["opens"] = json!(guarded);
                }
                Ok(view)
            }
            _ => Err(RpcError::new(proto::METHOD_NOT_FOUND, format!("method not found: {method}"))),
        }
    }

    fn tools_call(
        &self,
        session: &Session,
        peer: &Peer,
        id: &proto::Id,
        params: &Map<String, Value>,
    ) -> Result<Value, RpcError> {
        let name = string_param(params, "name")?;
        let mut arguments = match params.get("arguments") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(a)) => a.clone(),
            Some(other) => {
                return Err(RpcError::invalid_params(format!("`arguments` must be an object, got {other}")))
            }
        };
        // A string request id plays Deep Agents' tool_call_id: it names an offloaded result. A
        // number is a connection's request counter (every client starts at 1), so two clients'
        // results would overwrite each other: such a result gets a generated name instead.
        let call_id = id.as_string();
        let structured = match params.get("structured") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(RpcError::invalid_params(format!("`structured` must be a boolean, got {other}")))
            }
        };
        let wait = match (params.get("wait"), params.get("ticket")) {
            (_, Some(t)) if !t.is_null() => match t.as_u64() {
                Some(id) => interrupts::Wait::Ticket(id),
                None => {
                    return Err(RpcError::invalid_params(format!(
                        "`ticket` must be an approval's number, got {t}"
                    )))
                }
            },
            (None | Some(Value::Null) | Some(Value::Bool(true)), _) => interrupts::Wait::Block,
            (Some(Value::Bool(false)), _) => interrupts::Wait::Defer,
            (Some(other), _) => {
                return Err(RpcError::invalid_params(format!("`wait` must be a boolean, got {other}")))
            }
        };
        // Taken once the rest of the request is known to be good (a bad one would have used
        // them up for nothing); held until the call is over.
        let _holding = transfer::take_staged_arguments(&session.staging, params, &mut arguments)?;
        let arguments = Value::Object(arguments);
        let mut env = self.tool_env(session, peer, name, &arguments, call_id);
        env.structured = structured;
        match interrupts::call(&mut env, peer, name, &arguments, wait, &self.deferred)? {
            Some(output) => {
                self.counters.tool_calls.fetch_add(1, Ordering::Relaxed);
                Ok(output.to_mcp())
            }
            None => {
                let names: Vec<&str> = registry(&self.listed()).iter().map(|t| t.name).collect();
                Err(RpcError::invalid_params(format!(
                    "unknown tool {name:?} (the tools are: {})",
                    names.join(", ")
                )))
            }
        }
    }

    /// The tool door's view for one call of `peer` (`name` and `arguments` are what the
    /// audit log records).
    fn tool_env<'s>(
        &'s self,
        session: &'s Session,
        peer: &Peer,
        name: &str,
        arguments: &Value,
        call_id: Option<String>,
    ) -> ToolEnv<'s> {
        let mut fs = ToolFs::new(&self.engine);
        // Files are still created as the daemon; the peer is the principal that audit records
        // name.
        fs.ctx.caller.pid = peer.pid;
        fs.ctx.principal = Some(peer.principal());
        fs.tool = name.to_string();
        fs.arguments = crate::audit::arguments_text(arguments);
        ToolEnv { fs, session, exec: self.exec.as_ref(), call_id, structured: false }
    }

    fn status(&self) -> Value {
        let c = &self.counters;
        let relaxed = std::sync::atomic::Ordering::Relaxed;
        let rings = self.engine.fuse_rings.get();
        let ring_requests: Vec<u64> = match rings {
            Some(r) => r.served.iter().map(|n| n.load(relaxed)).collect(),
            None => Vec::new(),
        };
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "mountpoint": self.mountpoint,
            "socket": self.socket,
            "agent_socket": self.agent_socket,
            "roles": self.roles.describe(),
            "config": self.config.source,
            "uptime_seconds": self.started.elapsed().as_secs(),
            "routes": self.config.routes.iter().map(|r| {
                let mut route = json!({"path": r.path.as_str(), "backend": r.backend.kind(), "location": location(&r.backend), "read_only": r.read_only});
                match &r.backend {
                    BackendConfig::Sqlite { namespace, .. } => route["namespace"] = json!(namespace),
                    BackendConfig::Postgres { namespace, schema, layout, .. } => {
                        route["namespace"] = json!(namespace);
                        route["schema"] = json!(schema);
                        route["layout"] = json!(match layout {
                            crate::config::PgLayout::Tree => "tree",
                            crate::config::PgLayout::LangGraph => "langgraph",
                        });
                    }
                    BackendConfig::Memory { max_bytes, .. } => route["max_bytes"] = json!(max_bytes),
                    BackendConfig::Host { .. } => {}
                }
                route
            }).collect::<Vec<_>>(),
            "rules": self.engine.gate.rules().len(),
            "pending_interrupts": self.engine.gate.approvals.pending_count(),
            "fuse_transport": if ring_requests.is_empty() { "dev_fuse" } else { "io_uring" },
            "fuse_ring_queues": ring_requests.len(),
            "fuse_ring_idle_class": rings.is_some_and(|r| r.idle_class),
            "observation": match self.config.observation {
                Observation::Strict => "strict",
                Observation::Off => "off",
            },
            "execute": self.config.exec.enabled.then(|| {
                let id = &self.config.exec.identity;
                json!({"uid": id.uid, "gid": id.gid, "identity": id.to_string(), "cwd": self.config.exec.cwd.as_str()})
            }),
            "counters": {
                "audit_records": self.engine.audit.recorded(),
                "audit_dropped": self.engine.audit.dropped(),
                "connections_open": Counters::get(&c.connections_open),
                "connections_total": Counters::get(&c.connections_total),
                "peers_refused": Counters::get(&c.peers_refused),
                "requests": Counters::get(&c.requests),
                "tool_calls": Counters::get(&c.tool_calls),
                "fuse_lookups": Counters::get(&self.engine.fuse_lookups),
                "fuse_listings": Counters::get(&self.engine.fuse_listings),
                "fuse_reads": Counters::get(&self.engine.fuse_reads),
                "fuse_opendirs": Counters::get(&self.engine.fuse_opendirs),
                "fuse_open_files": Counters::get(&self.engine.fuse_open_files),
                "fuse_ring_requests": ring_requests,
                "fuse_ring_promotions": rings.map_or(0, |r| r.promotions.load(relaxed)),
                "host_change_events": self.engine.host_change_events.get().map(|n| n.load(relaxed)),
            },
        })
    }
}

fn string_param<'p>(params: &'p Map<String, Value>, name: &str) -> Result<&'p str, RpcError> {
    match params.get(name) {
        Some(Value::String(s)) => Ok(s),
        None | Some(Value::Null) => {
            Err(RpcError::invalid_params(format!("missing parameter `{name}` (a string)")))
        }
        Some(other) => {
            Err(RpcError::invalid_params(format!("parameter `{name}` must be a string, got {other}")))
        }
    }
}

fn initialize(params: &Map<String, Value>, state: &State) -> Result<Value, RpcError> {
    let asked = string_param(params, "protocolVersion")?;
    // MCP: echo the client's revision when we speak it, otherwise offer ours and let the
    // client decide whether to go on.
    let version =
        if proto::MCP_KNOWN_VERSIONS.contains(&asked) { asked } else { proto::MCP_PROTOCOL_VERSION };
    Ok(json!({
        "protocolVersion": version,
        "capabilities": {"tools": {"listChanged": false}},
        "serverInfo": {"name": "agentvfs", "version": env!("CARGO_PKG_VERSION")},
        "instructions": paths_prompt(&state.config, &state.mountpoint),
    }))
}

/// The `tools/list` result: every offered tool in the registry's fixed order, described
/// for that set (so no description names a tool that is not listed).
pub fn tools_list(listed: &Listed) -> Value {
    let tools: Vec<Value> = registry(listed)
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "description": (t.description)(listed),
                "inputSchema": (t.input_schema)(),
                "annotations": {
                    "readOnlyHint": t.read_only,
                    "destructiveHint": t.destructive,
                    // Only reads are safe to repeat blindly; writes may race another writer.
                    "idempotentHint": t.read_only,
                    // The tools act on the mount's closed world, never the network.
                    "openWorldHint": false,
                },
            })
        })
        .collect();
    json!({"tools": tools})
}

/// Where a route's data lives on the host (`null` for memory).
fn location(backend: &BackendConfig) -> Value {
    match backend {
        BackendConfig::Host { root } => json!(root),
        BackendConfig::Sqlite { database, .. } => json!(database),
        BackendConfig::Postgres { .. } => json!(backend.location()),
        BackendConfig::Memory { .. } => Value::Null,
    }
}

/// `virtual` (a route prefix ending in `/`) under the mountpoint.
fn shell_path(mountpoint: &Path, virtual_prefix: &str) -> String {
    let mount = mountpoint.to_string_lossy();
    format!("{}{}", mount.trim_end_matches('/'), virtual_prefix)
}

fn with_slash(path: &VPath) -> String {
    if path.is_root() {
        "/".to_string()
    } else {
        format!("{path}/")
    }
}

/// The `vfs/paths` result: each route's virtual prefix and its path in the mount, and the
/// ready-made prompt section.
pub fn paths(config: &Config, mountpoint: &Path) -> Value {
    let routes: Vec<Value> = config
        .routes
        .iter()
        .map(|r| {
            let prefix = with_slash(&r.path);
            json!({
                "virtual": prefix,
                "shell": shell_path(mountpoint, &prefix),
                "backend": r.backend.kind(),
                "location": location(&r.backend),
            })
        })
        .collect();
    // Inside `execute` the tree is the file system: a virtual path is the shell path there.
    let execute = config.exec.enabled.then(|| json!({"shell": "virtual", "cwd": config.exec.cwd.as_str()}));
    json!({"mountpoint": mountpoint, "routes": routes, "execute": execute, "prompt": paths_prompt(config, mountpoint)})
}

/// A system-prompt section in the manner of Deep Agents' "Shell paths vs. virtual paths":
/// every route is reachable from a shell, under the mount, through the same rules.
pub fn paths_prompt(config: &Config, mountpoint: &Path) -> String {
    let mount = mountpoint.to_string_lossy();
    let mut prefixes: Vec<String> = config.routes.iter().map(|r| with_slash(&r.path)).collect();
    // Longest prefix first, as Deep Agents orders its mappings (and as routing decides).
    prefixes.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
    let mut lines = vec![
        "## Shell paths vs. virtual paths".to_string(),
        String::new(),
        "The file tools use virtual paths, which start with `/`.".to_string(),
        format!(
            "A shell reaches the same files under the agentvfs mount at `{mount}`: put `{}` in front of a virtual path to use it in a shell command.",
            mount.trim_end_matches('/')
        ),
        "The same access rules apply to both: a file the tools cannot read or write cannot be read or written from the shell either.".to_string(),
        String::new(),
    ];
    if config.exec.enabled {
        lines.push(format!(
            "The execute tool is different: its commands see the virtual tree itself, so there a virtual path is the shell path (`/dir/x.py` is `/dir/x.py`), and commands start in `{}`. The mappings below are for shells outside execute.",
            config.exec.cwd
        ));
    } else {
        lines.push(
            "Do not assume that a path returned by a file tool can be used directly in a shell command."
                .to_string(),
        );
    }
    lines.extend([String::new(), "Host path mappings:".to_string()]);
    for prefix in prefixes {
        let shell = shell_path(mountpoint, &prefix);
        lines.push(format!("- `{prefix}` -> `{shell}` (e.g. `{prefix}dir/x.py` -> `{shell}dir/x.py`)"));
    }
    lines.join("\n")
}

/// Decides `operation` on `path` under `rules` (a trailing `/` judges a directory): the
/// `vfs/explain` result, also used by `agentvfs explain --config` so both print alike.
///
/// The answer is what both doors do, not only the path's own rule: a path beneath a hidden
/// directory cannot be reached (ENOENT) whatever its own rule says, and a write needs the
/// lookup of its path, which a read denial refuses. Without a trailing `/` the kind is not
/// known (the daemon does not look, which would tell of hidden directories): where a
/// directory there would be judged otherwise, `as_directory` says how.
pub fn explain(rules: &RuleSet, operation: &str, path: &str) -> Result<Value, String> {
    let op = Op::parse(operation)
        .ok_or_else(|| format!("unknown operation {operation:?} (expected \"read\" or \"write\")"))?;
    let is_dir = path.len() > 1 && path.ends_with('/');
    let vpath = VPath::parse(path).map_err(|e| format!("invalid path {path:?}: {e}"))?;
    let mut result = judged(rules, op, &vpath, is_dir);
    if !is_dir && !vpath.is_root() {
        let as_dir = judged(rules, op, &vpath, true);
        if as_dir["effect"] != result["effect"] {
            let mut shown = serde_json::Map::new();
            for key in ["decision", "hidden", "effect", "rule", "rule_text"] {
                shown.insert(key.to_string(), as_dir[key].clone());
            }
            result["as_directory"] = Value::Object(shown);
        }
    }
    Ok(result)
}

/// [`explain`] of one kind of node.
fn judged(rules: &RuleSet, op: Op, vpath: &VPath, is_dir: bool) -> Value {
    let hiding = |v: &crate::policy::Verdict| v.mode == Mode::Deny && v.hide;
    let above = vpath.ancestors().filter(|a| !a.is_root()).find_map(|a| {
        let v = rules.decide(Op::Read, &a, true);
        hiding(&v).then_some((a, v))
    });
    let verdict = rules.decide(op, vpath, is_dir);
    let own_read = if op == Op::Read { verdict } else { rules.decide(Op::Read, vpath, is_dir) };
    let (verdict, hidden, effect) = match above {
        // Its own denial says enough (`/s/**` hides both `/s` and `/s/x`).
        Some((dir, v)) if verdict.mode != Mode::Deny => {
            (v, true, format!("denied: beneath the hidden directory {dir} (ENOENT)"))
        }
        _ if op == Op::Write && verdict.mode != Mode::Deny && own_read.mode == Mode::Deny => {
            let (hidden, errno) = if own_read.hide { (true, "ENOENT") } else { (false, "EACCES") };
            (own_read, hidden, format!("denied ({errno}): reaching it is a read, which is denied"))
        }
        _ => {
            let hidden = verdict.mode == Mode::Deny && op == Op::Read && verdict.hide;
            let effect = match (verdict.mode, hidden) {
                (Mode::Allow, _) => "allowed",
                (Mode::Deny, true) => "denied: hidden (ENOENT, absent from listings)",
                (Mode::Deny, false) => "denied (EACCES)",
                (Mode::Interrupt, _) => "interrupt: waits for a human's approval",
            };
            (verdict, hidden, effect.to_string())
        }
    };
    let decision = if effect.starts_with("denied") { "deny" } else { verdict.mode.as_str() };
    json!({
        "operation": op.as_str(),
        "path": vpath.as_str(),
        "directory": is_dir,
        "decision": decision,
        "hidden": hidden,
        "effect": effect,
        "rule": verdict.rule,
        "rule_text": verdict.rule.map(|i| rules.rules()[i].describe()),
    })
}

/// The lines `agentvfs explain` prints for an [`explain`] result, every string escaped for
/// the terminal.
pub fn explain_text(result: &Value) -> String {
    let s = |v: &Value, key: &str| {
        crate::display::escape(v.get(key).and_then(Value::as_str).unwrap_or("?")).into_owned()
    };
    let by = |v: &Value| match v.get("rule").and_then(Value::as_u64) {
        Some(i) => format!("by rule #{i}: {}", s(v, "rule_text")),
        None if v.get("decision") == Some(&json!("deny")) => {
            "a tool's temporary file: the daemon's own, hidden whatever the rules say".to_string()
        }
        None => "no rule matches (default allow)".to_string(),
    };
    let slash = if result.get("directory") == Some(&json!(true)) { "/" } else { "" };
    let mut text = format!(
        "{} {}{slash}: {}\n{}\n",
        s(result, "operation"),
        s(result, "path"),
        s(result, "effect"),
        by(result)
    );
    if let Some(dir) = result.get("as_directory") {
        text.push_str(&format!("as a directory: {}\n{}\n", s(dir, "effect"), by(dir)));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Rule;

    fn config() -> Config {
        let text = "[[routes]]\npath = \"/memories\"\nbackend = \"memory\"\n\n[[rules]]\noperations = [\"read\"]\npaths = [\"/s/**\"]\nmode = \"deny\"\n";
        Config::parse_str(text, "test.toml", Path::new("/")).unwrap()
    }

    #[test]
    fn the_prompt_maps_every_route_under_the_mount() {
        let prompt = paths_prompt(&config(), Path::new("/mnt/agent"));
        assert!(prompt.starts_with("## Shell paths vs. virtual paths\n\n"), "{prompt}");
        assert!(prompt.ends_with(
            "Host path mappings:\n- `/memories/` -> `/mnt/agent/memories/` (e.g. `/memories/dir/x.py` -> `/mnt/agent/memories/dir/x.py`)\n- `/` -> `/mnt/agent/` (e.g. `/dir/x.py` -> `/mnt/agent/dir/x.py`)"
        ), "{prompt}");
        let p = paths(&config(), Path::new("/mnt/agent/"));
        assert_eq!(
            p["routes"][1],
            json!({"virtual": "/memories/", "shell": "/mnt/agent/memories/", "backend": "memory", "location": null})
        );
    }

    #[test]
    fn with_execute_the_prompt_says_virtual_paths_are_shell_paths() {
        let mut c = config();
        assert_eq!(paths(&c, Path::new("/m"))["execute"], Value::Null);
        c.exec.enabled = true;
        let prompt = paths_prompt(&c, Path::new("/m"));
        assert!(prompt.contains("The execute tool is different: its commands see the virtual tree itself, so there a virtual path is the shell path (`/dir/x.py` is `/dir/x.py`), and commands start in `/`."), "{prompt}");
        assert!(!prompt.contains("Do not assume"), "{prompt}");
        assert_eq!(paths(&c, Path::new("/m"))["execute"], json!({"shell": "virtual", "cwd": "/"}));
    }

    #[test]
    fn explain_reports_decision_and_rule() {
        let rules = RuleSet::new(vec![Rule {
            operations: vec![Op::Read],
            paths: vec!["/s/**".into()],
            mode: Mode::Deny,
            hide: true,
        }])
        .unwrap();
        let v = explain(&rules, "read", "/s/").unwrap();
        assert_eq!(
            explain_text(&v),
            "read /s/: denied: hidden (ENOENT, absent from listings)\nby rule #0: deny read /s/**\n"
        );
        assert_eq!(v["rule"], json!(0));
        // Beneath a hidden directory nothing is reached, whatever its own rule says.
        let v = explain(&rules, "write", "/s/x").unwrap();
        assert_eq!(
            explain_text(&v),
            "write /s/x: denied: beneath the hidden directory /s (ENOENT)\nby rule #0: deny read /s/**\n"
        );
        assert_eq!(v["decision"], json!("deny"));
        let v = explain(&rules, "write", "/t/x").unwrap();
        assert_eq!(explain_text(&v), "write /t/x: allowed\nno rule matches (default allow)\n");
        assert!(explain(&rules, "delete", "/x").unwrap_err().contains("unknown operation \"delete\""));
        // Without a trailing slash the kind is not known: both are told where they differ.
        let v = explain(&rules, "read", "/s").unwrap();
        assert_eq!(
            explain_text(&v),
            "read /s: allowed\nno rule matches (default allow)\n\
             as a directory: denied: hidden (ENOENT, absent from listings)\nby rule #0: deny read /s/**\n"
        );
        // A write needs the lookup of its path, which a read denial refuses.
        let shown = RuleSet::new(vec![Rule {
            operations: vec![Op::Read],
            paths: vec!["/w/f".into()],
            mode: Mode::Deny,
            hide: false,
        }])
        .unwrap();
        let v = explain(&shown, "write", "/w/f").unwrap();
        assert_eq!(
            explain_text(&v),
            "write /w/f: denied (EACCES): reaching it is a read, which is denied\nby rule #0: deny read /w/f (hide = false)\n"
        );
        assert!(explain(&rules, "read", "/../x").unwrap_err().contains("invalid path"));
        // A path cannot rewrite the line it is shown on, nor add one.
        let v = explain(&rules, "read", "/s/\r\x1b[2Kx\nby rule #9").unwrap();
        assert_eq!(
            explain_text(&v),
            "read /s/\\r\\x1b[2Kx\\nby rule #9: denied: hidden (ENOENT, absent from listings)\nby rule #0: deny read /s/**\n"
        );
    }
}
