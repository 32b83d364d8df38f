//! The command line: `agentvfs mount | check | explain` work from a config file; the other
//! commands talk to a running daemon: `tools`, `call`, `mcp`, `paths`, `explain` and `run`
//! over the agent socket, `status`, `reload`, `interrupts`, `approve` and `reject` over the
//! control socket.

use std::ffi::OsString;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{anyhow, bail, Result};
use clap::{Args, Parser, Subcommand};
use serde_json::{json, Value};

use crate::config::Config;
use crate::control::client::{connect_stream, Client, ClientError};
use crate::control::methods::{explain, explain_text};
use crate::control::roles::{self, Role, Socket};
use crate::display::escape;
use crate::policy::RuleSet;

#[path = "cli_interrupts.rs"]
mod interrupts;

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

/// How to reach the daemon, shared by every client command.
#[derive(Args, Clone)]
struct Remote {
    /// The socket [default: the one --config names; else $AGENTVFS_SOCKET for the agent
    /// socket (tools, call, paths, explain), $AGENTVFS_CONTROL_SOCKET for the control socket
    /// (status, reload, interrupts, approve, reject); else the default config's].
    #[arg(long, value_name = "S")]
    socket: Option<PathBuf>,
    /// The daemon's config file, to take its socket from (`explain`: the rules to explain,
    /// without asking a daemon).
    #[arg(long, value_name = "FILE", conflicts_with = "socket")]
    config: Option<PathBuf>,
    /// Print the daemon's JSON answer instead of text.
    #[arg(long)]
    json: bool,
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
    /// Show the decision for one operation on one path, and the rule that made it
    /// (from --config, else from the running daemon, else from the embedded default; the
    /// first line says which).
    Explain {
        #[command(flatten)]
        remote: Remote,
        /// `read` or `write`.
        operation: String,
        /// A virtual path, e.g. /workspace/.env (a trailing `/` judges it as a directory).
        path: String,
    },
    /// Show the running daemon: mountpoint, routes, rules, counters.
    Status {
        #[command(flatten)]
        remote: Remote,
    },
    /// Show where each route is in the mount, and a system-prompt section saying so.
    Paths {
        #[command(flatten)]
        remote: Remote,
        /// Print only the prompt section.
        #[arg(long, conflicts_with = "json")]
        prompt: bool,
    },
    /// List the agent tools the daemon serves.
    Tools {
        #[command(flatten)]
        remote: Remote,
    },
    /// Call one tool and print its text (exit 2 when the tool reports an error).
    Call {
        #[command(flatten)]
        remote: Remote,
        /// The tool's name, e.g. read_file.
        tool: String,
        /// The arguments as a JSON object, e.g. '{"file_path": "/workspace/README.md"}'.
        arguments: Option<String>,
    },
    /// Re-read the rules from the daemon's config file (like SIGHUP).
    Reload {
        #[command(flatten)]
        remote: Remote,
    },
    /// List the approvals waiting for a human (--watch: follow them as they come and go).
    Interrupts {
        #[command(flatten)]
        remote: Remote,
        #[arg(long)]
        watch: bool,
    },
    /// Approve a pending interrupt (`--scope session`: also what follows in that directory).
    Approve {
        #[command(flatten)]
        remote: Remote,
        id: u64,
        /// `once` (default) or `session`.
        #[arg(long, default_value = "once")]
        scope: String,
    },
    /// Reject a pending interrupt: the syscall gets EACCES, the tool call the reason.
    Reject {
        #[command(flatten)]
        remote: Remote,
        id: u64,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Start COMMAND on this terminal in a sandbox whose whole file system is the gated tree
    /// (as execute's), as the invoking user (the sudo user under sudo; never root), and exit
    /// with its status.
    Run {
        /// The agent socket [default: the one --config names, else $AGENTVFS_SOCKET, else the
        /// default config's].
        #[arg(long, value_name = "S")]
        socket: Option<PathBuf>,
        /// The daemon's config file: its agent socket, `[run]` (home, env, network) and
        /// `[exec] cwd` [default: `[run]`'s defaults].
        #[arg(long, value_name = "FILE", conflicts_with = "socket")]
        config: Option<PathBuf>,
        /// The program and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<OsString>,
    },
    /// Inside `agentvfs run`'s sandbox: starts the program with SIGINT and SIGQUIT at their
    /// defaults, in a process group of its own that holds the sandbox's terminal.
    #[command(name = "run-program", hide = true)]
    RunProgram {
        #[arg(last = true, required = true)]
        command: Vec<OsString>,
    },
    /// Bridge MCP over stdio to the daemon's agent socket (for MCP clients that launch
    /// servers); only the agent's methods are forwarded.
    Mcp {
        /// The socket [default: the agent socket --config names, else $AGENTVFS_SOCKET, else
        /// the default config's agent socket].
        #[arg(long, value_name = "S")]
        socket: Option<PathBuf>,
        /// The daemon's config file, to take its agent socket from.
        #[arg(long, value_name = "FILE", conflicts_with = "socket")]
        config: Option<PathBuf>,
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
    // Colours only on a terminal: a log file or the journal gets plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr)
        .try_init();
    match run(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("agentvfs: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// The environment variable that names `socket` for the client commands.
fn socket_variable(socket: Socket) -> &'static str {
    match socket {
        Socket::Agent => "AGENTVFS_SOCKET",
        Socket::Control => "AGENTVFS_CONTROL_SOCKET",
    }
}

/// The socket to use (the agent's or the control one): `--socket`, then the one `--config`
/// names, then its environment variable ([`socket_variable`]), then the default config's.
fn socket_path(flag: Option<&PathBuf>, config: Option<&PathBuf>, socket: Socket) -> Result<PathBuf> {
    if let Some(path) = flag {
        return Ok(path.clone());
    }
    if let Some(config) = config {
        let config = Config::load(config)?;
        return Ok(match socket {
            Socket::Agent => config.agent_socket,
            Socket::Control => config.socket,
        });
    }
    Ok(match std::env::var_os(socket_variable(socket)) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => match socket {
            Socket::Agent => crate::config::default_agent_socket(&crate::config::default_socket()),
            Socket::Control => crate::config::default_socket(),
        },
    })
}

/// The socket a method is asked on: the agent socket for the agent's methods, else the
/// control socket.
fn socket_for(method: &str) -> Socket {
    match roles::role_of(method) {
        Some(Role::Agent) => Socket::Agent,
        _ => Socket::Control,
    }
}

impl Remote {
    fn path(&self, socket: Socket) -> Result<PathBuf> {
        socket_path(self.socket.as_ref(), self.config.as_ref(), socket)
    }

    fn call(&self, method: &str, params: Option<Value>) -> Result<Value> {
        let mut client = connect(&self.path(socket_for(method))?, method)?;
        Ok(client.call(method, params)?)
    }
}

/// Connects to the socket that serves `method`; inside `agentvfs run`'s sandbox, where no
/// control socket exists, a failure for an approver's or operator's method says so.
fn connect(path: &Path, method: &str) -> Result<Client> {
    match Client::connect(path) {
        Err(_) if socket_for(method) == Socket::Control && crate::run::inside() => {
            bail!("{}", crate::run::no_control_socket(method))
        }
        connected => Ok(connected?),
    }
}

fn print_json(value: &Value) {
    println!("{}", serde_json::to_string_pretty(value).expect("JSON serialises"));
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
            println!("{}: ok", shown_path(&config));
            println!("routes:");
            for route in &loaded.routes {
                let detail = match &route.backend {
                    crate::config::BackendConfig::Host { root } => format!("host {}", shown_path(root)),
                    crate::config::BackendConfig::Memory { max_bytes: Some(m), .. } => {
                        format!("memory (max {m} bytes)")
                    }
                    crate::config::BackendConfig::Memory { max_bytes: None, .. } => "memory".to_string(),
                    crate::config::BackendConfig::Sqlite { database, namespace } => {
                        format!("sqlite {} (namespace {})", shown_path(database), escape(namespace))
                    }
                    backend @ crate::config::BackendConfig::Postgres { schema, namespace, layout, .. } => {
                        format!(
                            "postgres {} (schema {schema}, namespace {}{})",
                            escape(&backend.location().unwrap_or_default()),
                            escape(namespace),
                            match layout {
                                crate::config::PgLayout::Tree => "",
                                crate::config::PgLayout::LangGraph => ", layout langgraph",
                            }
                        )
                    }
                };
                println!("  {:<20} {}", escape(route.path.as_str()), detail);
            }
            println!("rules ({}, first match wins, no match allows):", loaded.rules.len());
            for (i, rule) in loaded.rules.iter().enumerate() {
                println!("  #{i} {}", escape(&rule.describe()));
            }
            let exec = &loaded.exec;
            let identity = escape(&exec.identity.to_string()).into_owned();
            match exec.enabled {
                true => println!("execute: runs as {identity}, in {}", escape(exec.cwd.as_str())),
                false => println!("execute: off ([exec] enabled = false); would run as {identity}"),
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Explain { remote, operation, path } => {
            let (source, result) = explain_from(&remote, &operation, &path)?;
            let source = format!("(from {})", escape(&source));
            if remote.json {
                // stdout stays one JSON document; the source still reaches the reader.
                eprintln!("{source}");
                print_json(&result);
            } else {
                print!("{source}\n{}", explain_text(&result));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Status { remote } => {
            let status = remote.call("vfs/status", None)?;
            if remote.json {
                print_json(&status);
            } else {
                print!("{}", status_text(&status));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Paths { remote, prompt } => {
            let paths = remote.call("vfs/paths", None)?;
            if remote.json {
                print_json(&paths);
            } else if prompt {
                println!("{}", text(&paths["prompt"]));
            } else {
                print!("{}", paths_text(&paths));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Tools { remote } => {
            let tools = remote.call("tools/list", None)?;
            if remote.json {
                print_json(&tools);
            } else {
                print!("{}", tools_text(&tools));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Call { remote, tool, arguments } => {
            let arguments: Value = match &arguments {
                None => json!({}),
                Some(text) => {
                    serde_json::from_str(text).map_err(|e| anyhow!("the arguments are not JSON: {e}"))?
                }
            };
            if !arguments.is_object() {
                bail!("the arguments must be a JSON object, e.g. '{{\"path\": \"/\"}}'");
            }
            let result = remote.call("tools/call", Some(json!({"name": tool, "arguments": arguments})))?;
            if remote.json {
                print_json(&result);
            } else {
                print!("{}", call_text(&result));
            }
            let failed = result.get("isError") == Some(&json!(true));
            Ok(if failed { ExitCode::from(2) } else { ExitCode::SUCCESS })
        }
        Command::Reload { remote } => {
            let result = remote.call("vfs/reload", None)?;
            if remote.json {
                print_json(&result);
            } else {
                println!("reloaded {} rule(s) from {}", result["rules"], shown(&result["config"]));
                for warning in result["warnings"].as_array().into_iter().flatten() {
                    println!("warning: {}", shown(warning));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Interrupts { remote, watch } => {
            let method = if watch { "interrupts/subscribe" } else { "interrupts/list" };
            interrupts::show(&mut connect(&remote.path(Socket::Control)?, method)?, watch, remote.json)
        }
        Command::Approve { remote, id, scope } => {
            let params = json!({"id": id, "decision": "approve", "scope": scope});
            interrupts::resolved(&remote.call("interrupts/resolve", Some(params))?, remote.json)
        }
        Command::Reject { remote, id, reason } => {
            let params = json!({"id": id, "decision": "reject", "message": reason});
            interrupts::resolved(&remote.call("interrupts/resolve", Some(params))?, remote.json)
        }
        Command::Run { socket, config, command } => {
            // The config is read by `run` itself, as the invoking user (see there).
            let socket = match config {
                Some(_) => None,
                None => Some(socket_path(socket.as_ref(), None, Socket::Agent)?),
            };
            let request = crate::run::Request {
                socket: socket.as_deref(),
                config_file: config.as_deref(),
                argv: &command,
            };
            crate::run::run(&request)
        }
        Command::RunProgram { command } => Ok(crate::run::exec_program(&command)),
        Command::Mcp { socket, config } => {
            mcp_bridge(&socket_path(socket.as_ref(), config.as_ref(), Socket::Agent)?)
        }
    }
}

/// Where `explain` takes its answer from, and the answer: the config file `--config` names;
/// else the daemon on `--socket`; else the daemon on the agent socket (`$AGENTVFS_SOCKET`,
/// else the default's), and only when no daemon listens there the embedded default config.
/// The source is said in words, unescaped.
fn explain_from(remote: &Remote, operation: &str, path: &str) -> Result<(String, Value)> {
    let judge = |config: &Config| -> Result<Value> {
        let rules = RuleSet::new(config.rules.clone()).map_err(|e| anyhow!("{e}"))?;
        explain(&rules, operation, path).map_err(|e| anyhow!(e))
    };
    if let Some(file) = &remote.config {
        let result = judge(&Config::load(file)?)?;
        return Ok((format!("the config file {}", file.display()), result));
    }
    let socket = socket_path(remote.socket.as_ref(), None, Socket::Agent)?;
    let params = json!({"operation": operation, "path": path});
    let asked = Client::connect(&socket).and_then(|mut client| client.call("vfs/explain", Some(params)));
    match asked {
        Ok(result) => Ok((format!("the daemon at {}", socket.display()), result)),
        // An explicit --socket must answer; without one, no daemon means the embedded default.
        Err(ClientError::NotRunning(_)) if remote.socket.is_none() => {
            let result = judge(&load(None)?)?;
            Ok((format!("the embedded default config: no daemon answers at {}", socket.display()), result))
        }
        Err(e) => Err(e.into()),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
}

/// A value for a one-line field of the text output: [`text`], escaped.
fn shown(v: &Value) -> String {
    escape(&text(v)).into_owned()
}

/// A path in `check`'s output, escaped.
fn shown_path(p: &Path) -> String {
    escape(&p.display().to_string()).into_owned()
}

fn status_text(s: &Value) -> String {
    let c = &s["counters"];
    let names = |list: &Value| -> String {
        let names: Vec<String> = list.as_array().into_iter().flatten().map(shown).collect();
        names.join(", ")
    };
    let mut out = format!(
        "agentvfs {} (pid {}), up {}s\nmountpoint    {}\nsocket        {} (approvers: {})\nagent socket  {} (agents: {})\nconfig        {}\nroutes:\n",
        shown(&s["version"]),
        s["pid"],
        s["uptime_seconds"],
        shown(&s["mountpoint"]),
        shown(&s["socket"]),
        names(&s["roles"]["approvers"]),
        shown(&s["agent_socket"]),
        names(&s["roles"]["agents"]),
        shown(&s["config"])
    );
    for r in s["routes"].as_array().into_iter().flatten() {
        let mut detail = shown(&r["location"]);
        if let Some(ns) = r.get("namespace").and_then(Value::as_str) {
            detail = format!("{detail} (namespace {})", escape(ns));
        }
        if r["backend"] == "memory" {
            detail = match r.get("max_bytes").and_then(Value::as_u64) {
                Some(max) => format!("(in memory, max {max} bytes)"),
                None => "(in memory)".to_string(),
            };
        }
        if r["read_only"] == true {
            detail += " (read-only)";
        }
        out += &format!("  {:<20} {:<7} {detail}\n", shown(&r["path"]), shown(&r["backend"]));
    }
    out += &format!("rules: {} (observation: {})\n", s["rules"], shown(&s["observation"]));
    out += &match s["fuse_transport"].as_str() {
        Some("io_uring") if s["fuse_ring_idle_class"] == true => {
            format!("FUSE transport: io_uring ({} queues, idle-class threads)\n", s["fuse_ring_queues"])
        }
        Some("io_uring") => format!("FUSE transport: io_uring ({} queues)\n", s["fuse_ring_queues"]),
        _ => "FUSE transport: /dev/fuse\n".to_string(),
    };
    out += &format!("pending interrupts: {}\n", s["pending_interrupts"]);
    out += &format!("files open through the mount: {}\n", c["fuse_open_files"]);
    out += &format!("audit records: {} ({} dropped)\n", c["audit_records"], c["audit_dropped"]);
    out += &format!(
        "connections: {} open, {} total, {} refused; requests: {}; tool calls: {}\n",
        c["connections_open"], c["connections_total"], c["peers_refused"], c["requests"], c["tool_calls"]
    );
    out += &match &s["execute"] {
        Value::Null => "execute: off\n".to_string(),
        e => format!("execute: runs as {}, in {}\n", shown(&e["identity"]), shown(&e["cwd"])),
    };
    out
}

fn paths_text(p: &Value) -> String {
    let mut out = String::new();
    for r in p["routes"].as_array().into_iter().flatten() {
        out += &format!(
            "{:<20} {:<36} {:<7} {}\n",
            shown(&r["virtual"]),
            shown(&r["shell"]),
            shown(&r["backend"]),
            shown(&r["location"])
        );
    }
    // The prompt is several lines of the daemon's own text, printed as it is.
    out + "\n" + &text(&p["prompt"]) + "\n"
}

fn tools_text(t: &Value) -> String {
    let mut out = String::new();
    for tool in t["tools"].as_array().into_iter().flatten() {
        let a = &tool["annotations"];
        let kind = if a["readOnlyHint"] == true {
            "read-only"
        } else if a["destructiveHint"] == true {
            "destructive"
        } else {
            "writes"
        };
        let summary = escape(text(&tool["description"]).lines().next().unwrap_or("")).into_owned();
        out += &format!("{:<12} {:<12} {summary}\n", shown(&tool["name"]), kind);
    }
    out
}

/// A `CallToolResult` as text: text blocks as they are, other blocks summarised.
fn call_text(result: &Value) -> String {
    let mut out = String::new();
    for block in result["content"].as_array().into_iter().flatten() {
        match block["type"].as_str() {
            Some("text") => out += &text(&block["text"]),
            _ => {
                let size = block["data"].as_str().map_or(0, str::len);
                out += &format!(
                    "[{} block, {}, {size} bytes of base64]",
                    shown(&block["type"]),
                    shown(&block["mimeType"])
                );
            }
        }
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

/// What the MCP bridge answers itself instead of forwarding `line`: a request for a method the
/// agent's role does not have (interrupts, reload, status) gets the permission error the agent
/// socket would send, whichever socket the bridge was pointed at. Everything else (the agent's
/// methods, unknown ones, notifications, lines that do not parse) goes to the daemon.
fn bridge_refusal(line: &[u8]) -> Option<Vec<u8>> {
    let Ok(crate::control::proto::Message::Request { id, method, .. }) = crate::control::proto::parse(line)
    else {
        return None;
    };
    let role = roles::role_of(&method).filter(|r| *r != Role::Agent)?;
    let error = roles::needs(&method, role, "agentvfs mcp forwards only the agent's methods");
    Some(crate::control::proto::encode(&crate::control::proto::response(&id, Err(error))))
}

/// Writes one whole line to stdout and flushes it; false once stdout is gone.
fn stdout_line(line: &[u8]) -> bool {
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(line).and_then(|_| stdout.flush()).is_ok()
}

/// `agentvfs mcp`: copies stdin lines to the socket and socket lines to stdout until stdin
/// ends; then half-closes, so replies still due arrive before the daemon closes its side.
/// Requests for methods that are not the agent's are answered here ([`bridge_refusal`]), and so
/// is a line longer than the daemon's limit, which is skipped without being held.
fn mcp_bridge(path: &Path) -> Result<ExitCode> {
    let stream = connect_stream(path)?;
    let mut to_daemon = stream.try_clone()?;
    let from_daemon = stream;
    // Set before the half-close, so the daemon's resulting close is known to be expected.
    let stdin_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = stdin_done.clone();
    std::thread::spawn(move || {
        use crate::control::proto::{self, Line};
        // Read as the daemon reads: a line longer than the daemon takes is answered here as the
        // daemon would, and skipped, so the bridge never holds (nor forwards) more of it.
        let mut stdin = proto::LineReader::new(std::io::stdin().lock(), proto::MAX_LINE);
        loop {
            let mut line = match stdin.read_line() {
                Ok(Line::Complete(line)) => line,
                Ok(Line::TooLong) => {
                    stdout_line(&proto::encode(&proto::response(
                        &proto::Id::null(),
                        Err(proto::line_too_long()),
                    )));
                    continue;
                }
                Ok(Line::Eof) | Err(_) => break,
            };
            if let Some(refusal) = bridge_refusal(&line) {
                stdout_line(&refusal);
                continue;
            }
            line.push(b'\n');
            if to_daemon.write_all(&line).is_err() {
                // The daemon closed; the reader below reports it.
                return;
            }
        }
        done.store(true, std::sync::atomic::Ordering::SeqCst);
        let _ = to_daemon.shutdown(std::net::Shutdown::Write);
    });
    let mut reader = std::io::BufReader::new(from_daemon);
    let mut line = Vec::new();
    loop {
        line.clear();
        match reader.read_until(b'\n', &mut line) {
            Ok(0) => break,
            Ok(_) => {
                if !stdout_line(&line) {
                    // The client went away; nothing is left to deliver.
                    return Ok(ExitCode::SUCCESS);
                }
            }
            Err(e) => bail!("reading from the daemon on {}: {e}", path.display()),
        }
    }
    // After stdin's end the daemon closes once every reply is out; before it, the daemon quit.
    if stdin_done.load(std::sync::atomic::Ordering::SeqCst) {
        Ok(ExitCode::SUCCESS)
    } else {
        bail!("the daemon on {} closed the connection", path.display())
    }
}
