//! The configuration file (TOML): its shape, validation with file-and-line errors, and the
//! embedded default used when no file is given.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::Spanned;

use crate::control::roles::Member;
use crate::control::session::Observation;
use crate::policy::rules::{check_pattern, Mode, Op, Rule};
use crate::vpath::VPath;

#[path = "config_run.rs"]
mod run_table;
pub use run_table::{RunConfig, DEFAULT_RUN_ENV};

#[path = "config_exec.rs"]
mod exec_table;
pub use exec_table::ExecConfig;

/// A configuration error: where it is and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: String,
    pub line: Option<usize>,
    pub message: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file, line, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

#[derive(Debug, Clone, PartialEq)]
pub enum BackendConfig {
    Host {
        root: PathBuf,
    },
    Memory {
        max_bytes: Option<u64>,
        store: MemoryStore,
    },
    Sqlite {
        database: PathBuf,
        namespace: String,
    },
    /// `url` may hold a password: show [`BackendConfig::location`], never the URL.
    Postgres {
        url: String,
        schema: String,
        namespace: String,
        /// `tree` (agentvfs's own tables) or `langgraph` (LangGraph's `store` table).
        layout: PgLayout,
        /// Whether the close of a descriptor that wrote waits for the server's disk, as `fsync`
        /// does (`sync_on_close`; tree layout).
        sync_on_close: bool,
    },
}

/// How a postgres route keeps its files (`layout = "tree" | "langgraph"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgLayout {
    /// A POSIX tree in agentvfs's own tables.
    Tree,
    /// The files of Deep Agents' `StoreBackend` in LangGraph's `PostgresStore` table
    /// (see `backend::postgres::langgraph`).
    LangGraph,
}

#[path = "config_backend.rs"]
mod backend_kinds;
pub use backend_kinds::KindDefaults;

/// Where a memory route keeps its tree (`store = "tmpfs" | "daemon"`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryStore {
    /// A private tmpfs no path leads to, served like a host directory (so file data can go
    /// through kernel passthrough); the in-daemon store when the daemon may not create one.
    Tmpfs,
    /// A tree in the daemon's own memory.
    Daemon,
}

#[derive(Debug, Clone, PartialEq)]
pub struct RouteConfig {
    pub path: VPath,
    pub backend: BackendConfig,
    /// How long the kernel may cache entries and attributes.
    pub cache_ttl: Duration,
    /// `cache_ttl_seconds` was given (not the backend's default).
    pub cache_ttl_set: bool,
    /// `read_only = true`: the route is served read-only on purpose (EROFS for every change).
    pub read_only: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// Where the file came from ("<embedded default>" for the built-in one).
    pub source: String,
    /// The config file itself, absolute; `None` for the embedded default. One of the
    /// daemon's own files: no route shows it.
    pub file: Option<PathBuf>,
    pub mountpoint: Option<PathBuf>,
    /// The control socket (approvers and operators: every method).
    pub socket: PathBuf,
    /// The agent socket (tools, path mappings, explain); beside `socket` by default.
    pub agent_socket: PathBuf,
    /// `[control]`: who may use which socket.
    pub control: ControlConfig,
    /// The route for `/` first, then the configured routes in file order.
    pub routes: Vec<RouteConfig>,
    pub rules: Vec<Rule>,
    pub interrupt_timeout: Duration,
    pub audit_database: Option<PathBuf>,
    /// `[audit] max_records`: the newest this many records are kept; older ones are deleted.
    pub audit_max_records: u64,
    pub fuse_threads: usize,
    pub allow_other: bool,
    /// `[fuse] passthrough`: serve file data kept in real files (host routes, the memory
    /// route's tmpfs) through kernel FUSE passthrough.
    pub passthrough: bool,
    /// `[fuse] cached_reads_max_kb`, in bytes: files of routes with passthrough up to this size,
    /// opened only for reading, are served from the kernel's page cache (0: none are).
    pub cached_reads_max: u64,
    /// `[fuse] xattrs`: serve extended attributes (off: the kernel stops asking at all).
    pub xattrs: bool,
    /// `[fuse] read_ahead_kb`: the mount's readahead window (0: the kernel's default).
    pub read_ahead_kb: u64,
    /// `[fuse] io_uring`: take requests over FUSE-over-io_uring rings (one per CPU) when the
    /// kernel offers it, instead of reading `/dev/fuse`.
    pub io_uring: bool,
    /// `[fuse] io_uring_idle_class`: run the ring threads in `SCHED_IDLE`, under a guard that
    /// moves a stalled one back to the normal class (see `fuse::ring_guard`).
    pub io_uring_idle_class: bool,
    /// `[fuse] io_uring_spin_us`: how long a ring thread in the idle class looks for the next
    /// request before it sleeps (see `fuse::ring`); zero: it sleeps at once.
    pub io_uring_spin: std::time::Duration,
    /// `[tools] observation`: whether tool writes need a prior read of the current version.
    pub observation: Observation,
    /// `[exec]`: the `execute` tool and its sandbox.
    pub exec: ExecConfig,
    /// `[run]`: `agentvfs run`, a program in the same sandbox on the caller's terminal.
    pub run: RunConfig,
}

/// `[control]`: the users and groups of each role, as the file lists them (`None`: the key
/// is absent, and the list holds the default user; see `control::roles`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ControlConfig {
    /// May use the agent socket.
    pub agents: Option<Vec<Member>>,
    /// May use the control socket: interrupts, reload, status.
    pub approvers: Option<Vec<Member>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    mountpoint: Option<String>,
    socket: Option<String>,
    agent_socket: Option<Spanned<String>>,
    default: Option<Spanned<RawBackend>>,
    #[serde(default)]
    routes: Vec<Spanned<RawRoute>>,
    #[serde(default)]
    rules: Vec<Spanned<RawRule>>,
    interrupts: Option<RawInterrupts>,
    exec: Option<Spanned<exec_table::RawExec>>,
    run: Option<run_table::RawRun>,
    tools: Option<RawTools>,
    fuse: Option<RawFuse>,
    audit: Option<RawAudit>,
    control: Option<RawControl>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawControl {
    agents: Option<Vec<Spanned<String>>>,
    approvers: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    backend: Spanned<String>,
    url: Option<Spanned<String>>,
    schema: Option<Spanned<String>>,
    layout: Option<Spanned<String>>,
    sync_on_close: Option<Spanned<bool>>,
    root: Option<Spanned<String>>,
    database: Option<Spanned<String>>,
    namespace: Option<String>,
    max_bytes: Option<u64>,
    store: Option<Spanned<String>>,
    cache_ttl_seconds: Option<f64>,
    read_only: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRoute {
    path: Spanned<String>,
    backend: Spanned<String>,
    url: Option<Spanned<String>>,
    schema: Option<Spanned<String>>,
    layout: Option<Spanned<String>>,
    sync_on_close: Option<Spanned<bool>>,
    root: Option<Spanned<String>>,
    database: Option<Spanned<String>>,
    namespace: Option<String>,
    max_bytes: Option<u64>,
    store: Option<Spanned<String>>,
    cache_ttl_seconds: Option<f64>,
    read_only: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    operations: Spanned<Vec<Spanned<String>>>,
    paths: Spanned<Vec<Spanned<String>>>,
    mode: Spanned<String>,
    hide: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTools {
    observation: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInterrupts {
    timeout_seconds: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFuse {
    threads: Option<usize>,
    allow_other: Option<bool>,
    passthrough: Option<bool>,
    xattrs: Option<bool>,
    read_ahead_kb: Option<u64>,
    cached_reads_max_kb: Option<Spanned<u64>>,
    io_uring: Option<bool>,
    io_uring_idle_class: Option<bool>,
    io_uring_spin_us: Option<Spanned<u64>>,
}

/// The mount's readahead window by default: one request of the largest size (1 MiB), where the
/// kernel's 128 KiB took eight round trips (reads the daemon serves: sqlite, memory in the
/// daemon; passthrough files read ahead on their own filesystem).
pub const DEFAULT_READ_AHEAD_KB: u64 = 1024;

/// Files up to this size opened only for reading are served from the kernel's page cache by
/// default: the largest request (1 MiB), so one read fills it at `open`.
pub const DEFAULT_CACHED_READS_MAX_KB: u64 = 1024;

/// The largest `cached_reads_max_kb`: the daemon reads such a file whole at `open`.
const CACHED_READS_MAX_KB_LIMIT: u64 = 16 * 1024;

/// How long a ring thread looks for the next request before it sleeps, by default.
pub const DEFAULT_IO_URING_SPIN_US: u64 = 50;

/// The longest `io_uring_spin_us`: past a millisecond a thread would look long after the
/// caller's next request could have come.
const IO_URING_SPIN_US_LIMIT: u64 = 1000;

/// How many audit records are kept by default (a few hundred MB, depending on command lines).
pub const DEFAULT_AUDIT_MAX_RECORDS: u64 = 1_000_000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAudit {
    database: Option<String>,
    max_records: Option<Spanned<u64>>,
}

/// The configuration used when no file is given: `/` is memory scratch, `/workspace` the
/// current directory, `/memories` a SQLite store in the user's data directory, and common
/// secrets are denied.
pub const EMBEDDED_DEFAULT: &str = include_str!("default.toml");

/// The postgres route's own keys: `url`, `schema`, `layout`, `sync_on_close`.
type PgKeys<'a> = (
    &'a Option<Spanned<String>>,
    &'a Option<Spanned<String>>,
    &'a Option<Spanned<String>>,
    &'a Option<Spanned<bool>>,
);

struct Parser<'a> {
    file: &'a str,
    text: &'a str,
    /// Relative paths in the file are taken from here.
    base: PathBuf,
}

impl Parser<'_> {
    fn err(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigError {
        let line = span.map(|s| self.text[..s.start.min(self.text.len())].matches('\n').count() + 1);
        ConfigError { file: self.file.to_string(), line, message: message.into() }
    }

    fn path(&self, s: &Spanned<String>, what: &str) -> Result<PathBuf, ConfigError> {
        let v = s.get_ref();
        if v.starts_with('~') {
            return Err(
                self.err(Some(s.span()), format!("{what} {v:?}: '~' is not supported; write the full path"))
            );
        }
        if v.is_empty() {
            return Err(self.err(Some(s.span()), format!("{what} must not be empty")));
        }
        Ok(self.base.join(v))
    }

    #[allow(clippy::too_many_arguments)]
    fn backend(
        &self,
        kind: &Spanned<String>,
        root: &Option<Spanned<String>>,
        database: &Option<Spanned<String>>,
        namespace: &Option<String>,
        max_bytes: Option<u64>,
        store: &Option<Spanned<String>>,
        (url, schema, layout, sync_on_close): PgKeys<'_>,
        span: Range<usize>,
    ) -> Result<BackendConfig, ConfigError> {
        let only = |allowed: &[&str]| -> Result<(), ConfigError> {
            for (key, present) in [
                ("root", root.is_some()),
                ("database", database.is_some()),
                ("namespace", namespace.is_some()),
                ("max_bytes", max_bytes.is_some()),
                ("store", store.is_some()),
                ("url", url.is_some()),
                ("schema", schema.is_some()),
                ("layout", layout.is_some()),
                ("sync_on_close", sync_on_close.is_some()),
            ] {
                if present && !allowed.contains(&key) {
                    return Err(self.err(
                        Some(span.clone()),
                        format!("key `{key}` does not apply to backend {:?}", kind.get_ref()),
                    ));
                }
            }
            Ok(())
        };
        match kind.get_ref().as_str() {
            "host" => {
                only(&["root"])?;
                let root = root
                    .as_ref()
                    .ok_or_else(|| self.err(Some(span.clone()), "backend \"host\" needs `root`"))?;
                let path = self.path(root, "host root")?;
                match std::fs::metadata(&path) {
                    Ok(m) if m.is_dir() => Ok(BackendConfig::Host { root: path }),
                    Ok(_) => Err(self.err(
                        Some(root.span()),
                        format!("host root {:?} is not a directory", root.get_ref()),
                    )),
                    Err(e) => Err(self.err(
                        Some(root.span()),
                        format!("host root {:?} does not exist or cannot be read: {e}", root.get_ref()),
                    )),
                }
            }
            "memory" => {
                only(&["max_bytes", "store"])?;
                let store = match store.as_ref().map(|s| (s.get_ref().as_str(), s.span())) {
                    None | Some(("tmpfs", _)) => MemoryStore::Tmpfs,
                    Some(("daemon", _)) => MemoryStore::Daemon,
                    Some((other, at)) => {
                        return Err(self.err(
                            Some(at),
                            format!("unknown memory store {other:?} (expected \"tmpfs\" or \"daemon\")"),
                        ))
                    }
                };
                Ok(BackendConfig::Memory { max_bytes, store })
            }
            "sqlite" => {
                only(&["database", "namespace"])?;
                let db = database
                    .as_ref()
                    .ok_or_else(|| self.err(Some(span.clone()), "backend \"sqlite\" needs `database`"))?;
                Ok(BackendConfig::Sqlite {
                    database: self.path(db, "database")?,
                    namespace: namespace.clone().unwrap_or_else(|| "default".to_string()),
                })
            }
            "postgres" => {
                only(&["url", "schema", "namespace", "layout", "sync_on_close"])?;
                let url = url.as_ref().ok_or_else(|| {
                    self.err(
                        Some(span.clone()),
                        "backend \"postgres\" needs `url` (postgresql://user@host/db)",
                    )
                })?;
                let at = schema.as_ref().map(|s| s.span()).unwrap_or_else(|| url.span());
                let schema = schema.as_ref().map_or("agentvfs", |s| s.get_ref().as_str());
                crate::backend::postgres::PgSettings::new(url.get_ref(), schema)
                    .map_err(|e| self.err(Some(at), format!("backend \"postgres\": {e}")))?;
                let layout = match layout.as_ref().map(|l| (l.get_ref().as_str(), l.span())) {
                    None | Some(("tree", _)) => PgLayout::Tree,
                    Some(("langgraph", _)) => PgLayout::LangGraph,
                    Some((other, at)) => {
                        return Err(self.err(
                            Some(at),
                            format!("unknown postgres layout {other:?} (expected \"tree\" or \"langgraph\")"),
                        ))
                    }
                };
                if let (PgLayout::LangGraph, Some(s)) = (layout, sync_on_close) {
                    return Err(self.err(
                        Some(s.span()),
                        "key `sync_on_close` does not apply to layout \"langgraph\", whose every close \
                         waits for the server's disk",
                    ));
                }
                Ok(BackendConfig::Postgres {
                    url: url.get_ref().clone(),
                    schema: schema.to_string(),
                    namespace: namespace.clone().unwrap_or_else(|| "default".to_string()),
                    layout,
                    sync_on_close: sync_on_close.as_ref().is_some_and(|s| *s.get_ref()),
                })
            }
            other => Err(self.err(
                Some(kind.span()),
                format!(
                    "unknown backend {other:?} (expected \"memory\", \"host\", \"sqlite\" or \"postgres\")"
                ),
            )),
        }
    }

    fn ttl(
        &self,
        seconds: Option<f64>,
        kind: &BackendConfig,
        span: Range<usize>,
    ) -> Result<Duration, ConfigError> {
        match seconds {
            Some(s) if !(0.0..=86_400.0 * 365.0).contains(&s) => {
                Err(self.err(Some(span), format!("cache_ttl_seconds {s} is out of range")))
            }
            Some(s) => Ok(Duration::from_secs_f64(s)),
            None => Ok(kind.defaults().cache_ttl),
        }
    }

    fn parse(&self) -> Result<Config, ConfigError> {
        let raw: RawConfig =
            toml::from_str(self.text).map_err(|e| self.err(e.span(), e.message().to_string()))?;
        let observation = self.observation(raw.tools.as_ref())?;
        let mut routes = Vec::new();
        let default_backend = match &raw.default {
            Some(d) => {
                let b = d.get_ref();
                let cfg = self.backend(
                    &b.backend,
                    &b.root,
                    &b.database,
                    &b.namespace,
                    b.max_bytes,
                    &b.store,
                    (&b.url, &b.schema, &b.layout, &b.sync_on_close),
                    d.span(),
                )?;
                let ttl = self.ttl(b.cache_ttl_seconds, &cfg, d.span())?;
                (cfg, ttl)
            }
            None => (
                BackendConfig::Memory { max_bytes: None, store: MemoryStore::Tmpfs },
                Duration::from_secs(3600),
            ),
        };
        routes.push(RouteConfig {
            path: VPath::root(),
            backend: default_backend.0,
            cache_ttl: default_backend.1,
            cache_ttl_set: raw.default.as_ref().is_some_and(|d| d.get_ref().cache_ttl_seconds.is_some()),
            read_only: raw.default.as_ref().and_then(|d| d.get_ref().read_only).unwrap_or(false),
        });
        for r in &raw.routes {
            let span = r.span();
            let r = r.get_ref();
            let text = r.path.get_ref();
            if !text.starts_with('/') {
                return Err(self.err(Some(r.path.span()), format!("route path {text:?} must start with '/'")));
            }
            if text.split('/').any(|c| c == ".." || c == ".") {
                return Err(self.err(
                    Some(r.path.span()),
                    format!("route path {text:?} must not contain '.' or '..' components"),
                ));
            }
            let path = VPath::parse(text).map_err(|e| self.err(Some(r.path.span()), e.to_string()))?;
            if path.is_root() {
                return Err(self.err(
                    Some(r.path.span()),
                    "route path \"/\" is the [default] backend; configure it there",
                ));
            }
            if routes.iter().any(|x: &RouteConfig| x.path == path) {
                return Err(self.err(Some(r.path.span()), format!("duplicate route path {text:?}")));
            }
            let backend = self.backend(
                &r.backend,
                &r.root,
                &r.database,
                &r.namespace,
                r.max_bytes,
                &r.store,
                (&r.url, &r.schema, &r.layout, &r.sync_on_close),
                span.clone(),
            )?;
            if let (Some(namespace), Some(store)) = (backend.namespace(), backend.location()) {
                if let Some(other) = routes.iter().find(|x| x.backend.shares_namespace_with(&backend)) {
                    let message = format!(
                        "route {text:?} uses namespace {namespace:?} of {store}, as route \"{}\" does; \
                         give each route a namespace of its own",
                        other.path
                    );
                    return Err(self.err(Some(span), message));
                }
            }
            let cache_ttl = self.ttl(r.cache_ttl_seconds, &backend, span)?;
            routes.push(RouteConfig {
                path,
                backend,
                cache_ttl,
                cache_ttl_set: r.cache_ttl_seconds.is_some(),
                read_only: r.read_only.unwrap_or(false),
            });
        }
        let audit_max_records = match raw.audit.as_ref().and_then(|a| a.max_records.as_ref()) {
            Some(m) if *m.get_ref() == 0 => {
                return Err(self.err(Some(m.span()), "max_records must be at least 1"));
            }
            Some(m) => *m.get_ref(),
            None => DEFAULT_AUDIT_MAX_RECORDS,
        };
        let mut rules = Vec::new();
        for r in &raw.rules {
            let r = r.get_ref();
            let mut operations = Vec::new();
            for op in r.operations.get_ref() {
                let parsed = Op::parse(op.get_ref()).ok_or_else(|| {
                    self.err(
                        Some(op.span()),
                        format!("unknown operation {:?} (expected \"read\" or \"write\")", op.get_ref()),
                    )
                })?;
                if !operations.contains(&parsed) {
                    operations.push(parsed);
                }
            }
            if operations.is_empty() {
                return Err(self.err(Some(r.operations.span()), "a rule needs at least one operation"));
            }
            if r.paths.get_ref().is_empty() {
                return Err(self.err(Some(r.paths.span()), "a rule needs at least one path"));
            }
            let mut paths = Vec::new();
            for p in r.paths.get_ref() {
                check_pattern(p.get_ref()).map_err(|m| self.err(Some(p.span()), m))?;
                paths.push(p.get_ref().clone());
            }
            let mode = Mode::parse(r.mode.get_ref()).ok_or_else(|| {
                self.err(
                    Some(r.mode.span()),
                    format!(
                        "unknown mode {:?} (expected \"allow\", \"deny\" or \"interrupt\")",
                        r.mode.get_ref()
                    ),
                )
            })?;
            rules.push(Rule { operations, paths, mode, hide: r.hide.unwrap_or(true) });
        }
        let socket = match &raw.socket {
            Some(s) => self.base.join(s),
            None => default_socket(),
        };
        let agent_socket = match &raw.agent_socket {
            Some(s) => {
                let path = self.path(s, "agent_socket")?;
                if path == socket {
                    return Err(self.err(
                        Some(s.span()),
                        format!(
                            "agent_socket {:?} is the control socket too; give it a path of its own",
                            s.get_ref()
                        ),
                    ));
                }
                path
            }
            None => default_agent_socket(&socket),
        };
        let control = self.control(raw.control.as_ref())?;
        let threads = raw.fuse.as_ref().and_then(|f| f.threads).unwrap_or(0);
        let cached_reads_max_kb = raw.fuse.as_ref().and_then(|f| f.cached_reads_max_kb.as_ref());
        if let Some(kb) = cached_reads_max_kb.filter(|kb| *kb.get_ref() > CACHED_READS_MAX_KB_LIMIT) {
            let why = "the daemon reads such a file whole when it is opened";
            let text = format!(
                "cached_reads_max_kb = {} is too large: at most {CACHED_READS_MAX_KB_LIMIT} ({why})",
                kb.get_ref()
            );
            return Err(self.err(Some(kb.span()), text));
        }
        let cached_reads_max_kb = cached_reads_max_kb.map_or(DEFAULT_CACHED_READS_MAX_KB, |kb| *kb.get_ref());
        let spin_us = raw.fuse.as_ref().and_then(|f| f.io_uring_spin_us.as_ref());
        if let Some(us) = spin_us.filter(|us| *us.get_ref() > IO_URING_SPIN_US_LIMIT) {
            let text =
                format!("io_uring_spin_us = {} is too large: at most {IO_URING_SPIN_US_LIMIT}", us.get_ref());
            return Err(self.err(Some(us.span()), text));
        }
        let spin_us = spin_us.map_or(DEFAULT_IO_URING_SPIN_US, |us| *us.get_ref());
        let exec = self.exec(raw.exec.as_ref(), &routes)?;
        let run = self.run(raw.run.as_ref())?;
        Ok(Config {
            source: self.file.to_string(),
            file: None,
            mountpoint: raw.mountpoint.as_ref().map(|m| self.base.join(m)),
            socket,
            agent_socket,
            control,
            routes,
            rules,
            interrupt_timeout: Duration::from_secs(
                raw.interrupts.as_ref().and_then(|i| i.timeout_seconds).unwrap_or(300),
            ),
            audit_database: raw.audit.as_ref().and_then(|a| a.database.as_ref()).map(|d| self.base.join(d)),
            audit_max_records,
            fuse_threads: if threads == 0 { default_threads() } else { threads },
            allow_other: raw.fuse.as_ref().and_then(|f| f.allow_other).unwrap_or(true),
            passthrough: raw.fuse.as_ref().and_then(|f| f.passthrough).unwrap_or(true),
            cached_reads_max: cached_reads_max_kb * 1024,
            xattrs: raw.fuse.as_ref().and_then(|f| f.xattrs).unwrap_or(false),
            read_ahead_kb: raw.fuse.as_ref().and_then(|f| f.read_ahead_kb).unwrap_or(DEFAULT_READ_AHEAD_KB),
            io_uring: raw.fuse.as_ref().and_then(|f| f.io_uring).unwrap_or(true),
            io_uring_idle_class: raw.fuse.as_ref().and_then(|f| f.io_uring_idle_class).unwrap_or(true),
            io_uring_spin: std::time::Duration::from_micros(spin_us),
            observation,
            exec,
            run,
        })
    }

    /// `[control]`: every name looked up now, so that a misspelt one is an error with its line.
    fn control(&self, raw: Option<&RawControl>) -> Result<ControlConfig, ConfigError> {
        let Some(raw) = raw else { return Ok(ControlConfig::default()) };
        let list =
            |key: &str, names: &Option<Vec<Spanned<String>>>| -> Result<Option<Vec<Member>>, ConfigError> {
                let Some(names) = names else { return Ok(None) };
                let mut members = Vec::new();
                for name in names {
                    let member = Member::lookup(name.get_ref())
                        .map_err(|e| self.err(Some(name.span()), format!("[control] {key}: {e}")))?;
                    if !members.contains(&member) {
                        members.push(member);
                    }
                }
                Ok(Some(members))
            };
        Ok(ControlConfig {
            agents: list("agents", &raw.agents)?,
            approvers: list("approvers", &raw.approvers)?,
        })
    }

    /// `[tools] observation = "strict" | "off"` (default strict).
    fn observation(&self, tools: Option<&RawTools>) -> Result<Observation, ConfigError> {
        let Some(value) = tools.and_then(|t| t.observation.as_ref()) else {
            return Ok(Observation::Strict);
        };
        match value.get_ref().as_str() {
            "strict" => Ok(Observation::Strict),
            "off" => Ok(Observation::Off),
            other => Err(self.err(
                Some(value.span()),
                format!("[tools] observation = {other:?}: expected \"strict\" or \"off\""),
            )),
        }
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism().map(|n| n.get() * 2).unwrap_or(4).max(4)
}

/// The control socket when the config names none: `/run/agentvfs/agentvfs.sock` for root,
/// else `agentvfs.sock` in the user's runtime directory (or the temp directory).
pub fn default_socket() -> PathBuf {
    if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run/agentvfs/agentvfs.sock")
    } else {
        dirs::runtime_dir().unwrap_or_else(std::env::temp_dir).join("agentvfs.sock")
    }
}

/// The agent socket when the config names none: beside the control socket, its name with
/// `-agent` added (`agentvfs.sock` -> `agentvfs-agent.sock`), so that daemons whose control
/// sockets share a directory do not share an agent socket.
pub fn default_agent_socket(socket: &Path) -> PathBuf {
    let stem = socket.file_stem().map_or("agentvfs".into(), |s| s.to_string_lossy().into_owned());
    socket.with_file_name(format!("{stem}-agent.sock"))
}

/// The directory for persistent data (the default `/memories` store and the audit log).
pub fn data_dir() -> PathBuf {
    dirs::data_dir().unwrap_or_else(|| PathBuf::from("/var/lib")).join("agentvfs")
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: None,
            message: format!("cannot read: {e}"),
        })?;
        Config::load_text(path, &text)
    }

    /// [`Config::load`] of `text`, read from the file at `path` by the caller (`agentvfs run`
    /// reads it through the descriptor whose owner it judges).
    pub fn load_text(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let base = std::path::absolute(&base).unwrap_or(base);
        let mut config = Parser { file: &file, text, base }.parse()?;
        config.file = Some(std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()));
        Ok(config)
    }

    pub fn parse_str(text: &str, file: &str, base: &Path) -> Result<Config, ConfigError> {
        Parser { file, text, base: base.to_path_buf() }.parse()
    }

    /// The embedded default, with `/workspace` bound to `cwd`.
    pub fn embedded(cwd: &Path) -> Result<Config, ConfigError> {
        let data = data_dir();
        let text = EMBEDDED_DEFAULT
            .replace("@CWD@", &toml_escape(&cwd.to_string_lossy()))
            .replace("@DATA@", &toml_escape(&data.to_string_lossy()));
        let mut config =
            Parser { file: "<embedded default>", text: &text, base: cwd.to_path_buf() }.parse()?;
        if config.audit_database.is_none() {
            config.audit_database = Some(data.join("audit.db"));
        }
        Ok(config)
    }
}

fn toml_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
