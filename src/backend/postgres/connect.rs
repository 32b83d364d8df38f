//! How the postgres route reaches its server: the `url` of its config with libpq's defaults
//! filled in (`PGHOST`, `PGPORT`, `PGUSER`, `PGDATABASE`, `PGPASSWORD`, the password file
//! `PGPASSFILE` or `~/.pgpass`), the timeouts that keep a lost server from hanging the mount,
//! and what the server's errors mean to a filesystem caller.

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use postgres::config::Host;
use postgres::error::SqlState;
use postgres::{Client, Config, NoTls};

use crate::error::{Errno, FsError};

/// How long connecting may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Where Debian's server puts its socket, libpq's default host there.
const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";
/// The context of an error that asks for the transaction to be run again.
const RETRY: &str = "postgres: the server asks to try again";

/// The connection settings and schema of one route.
pub struct PgSettings {
    config: Config,
    pub schema: String,
    /// `user@host:port/db`, for messages (never the password).
    server: String,
    /// Whether the close of a descriptor that wrote waits for the server's disk.
    pub sync_on_close: bool,
    /// Counts the times the server was found gone (a connection closed under us, or the
    /// server shutting down). A connection made before the last time is stale: a server
    /// restart closes every connection it had, and the pool must not hand those out.
    lost: AtomicU64,
}

impl PgSettings {
    /// Settings from a route's `url` (`postgresql://user@host:port/db?...` or libpq's
    /// `key=value` form) and `schema`; the error says what is wrong, for the config check.
    pub fn new(url: &str, schema: &str) -> Result<PgSettings, String> {
        let valid = schema.chars().next().is_some_and(|c| c.is_ascii_lowercase() || c == '_')
            && schema.len() <= 63
            && schema.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(format!(
                "schema {schema:?} must be a plain lowercase SQL name (a-z, 0-9, _; at most 63 characters)"
            ));
        }
        let mut config =
            Config::from_str(url).map_err(|e| format!("url is not a PostgreSQL connection URL: {e}"))?;
        let env = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
        if config.get_hosts().is_empty() {
            let host = env("PGHOST").unwrap_or_else(|| DEFAULT_SOCKET_DIR.to_string());
            match host.starts_with('/') {
                true => config.host_path(&host),
                false => config.host(&host),
            };
        }
        if config.get_ports().is_empty() {
            if let Some(port) = env("PGPORT").and_then(|p| p.parse().ok()) {
                config.port(port);
            }
        }
        if config.get_user().is_none() {
            let user = env("PGUSER").or_else(os_user).ok_or("url names no user, and PGUSER is not set")?;
            config.user(&user);
        }
        if config.get_dbname().is_none() {
            if let Some(db) = env("PGDATABASE") {
                config.dbname(&db);
            }
        }
        if config.get_password().is_none() {
            if let Some(password) = env("PGPASSWORD").or_else(|| password_file(&config)) {
                config.password(password);
            }
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        // A server host that vanished is noticed in about ten seconds rather than never.
        config
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5))
            .keepalives_interval(Duration::from_secs(2));
        config.keepalives_retries(3);
        config.application_name("agentvfs");
        let server = describe(&config);
        Ok(PgSettings {
            config,
            schema: schema.to_string(),
            server,
            sync_on_close: false,
            lost: AtomicU64::new(0),
        })
    }

    /// The same settings, whose closes wait for the server's disk (`sync_on_close`) or not.
    pub fn sync_on_close(self, sync: bool) -> PgSettings {
        PgSettings { sync_on_close: sync, ..self }
    }

    /// A new connection whose unqualified table names are the route's schema.
    pub(super) fn connect(&self) -> Result<Client, postgres::Error> {
        let mut client = self.config.connect(NoTls)?;
        // Commits do not wait for the server's disk: what a call commits is seen by every
        // daemon and survives a kill -9 of this one at once, and becomes crash-proof on the
        // server with the next `fsync` or `fsyncdir` (and, with `sync_on_close`, `close` of
        // written data: `Inner::sync_durable`), or by the server itself within about 0.6 s.
        //
        // No sequential scans: every statement of the route reads rows by their keys, and a
        // plan made while a table was small (or just emptied and vacuumed) would keep
        // scanning it whole as it grows (an untar went from 2 to 6.4 s that way).
        client.batch_execute(&format!(
            "SET search_path TO {}; SET synchronous_commit TO off; SET enable_seqscan TO off",
            self.schema
        ))?;
        Ok(client)
    }

    /// `user@host:port/db`, for status and messages.
    pub fn server(&self) -> String {
        self.server.clone()
    }

    /// The first connection failed: the daemon does not start (no "until it is back" line,
    /// since nothing will be served meanwhile).
    pub(super) fn unreachable_at_start(&self, e: postgres::Error) -> FsError {
        FsError::new(
            Errno::EIO,
            format!("cannot reach {}: {e}; is the server running, and the url right?", self.server),
        )
    }

    /// How many times the server was found gone so far ([`PgSettings::server_lost`]).
    pub(super) fn generation(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// The server was found gone: every connection made before now is stale.
    pub(super) fn server_lost(&self) {
        self.lost.fetch_add(1, Ordering::Relaxed);
    }

    /// What a server error means to a filesystem caller, with the server named. A closed
    /// connection, an I/O error, or the server ending connections (57P01 `admin_shutdown`,
    /// 57P02 `crash_shutdown`, 57P03 `cannot_connect_now`) means the server was lost; a
    /// statement timeout or a cancel (57014) does not.
    pub(super) fn error(&self, e: postgres::Error) -> FsError {
        let code = e.code().cloned();
        let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
        let ended = matches!(&code, Some(c) if ["57P01", "57P02", "57P03"].contains(&c.code()));
        if e.is_closed() || io || ended {
            self.server_lost();
        }
        let errno = match &code {
            Some(c) if *c == SqlState::UNIQUE_VIOLATION => Errno::EEXIST,
            Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE => {
                return FsError::new(Errno::EAGAIN, RETRY);
            }
            Some(c) if *c == SqlState::DISK_FULL => Errno::ENOSPC,
            _ => Errno::EIO,
        };
        if code.is_none() {
            super::unreachable_line(&self.server, &e);
        }
        FsError::new(errno, format!("postgres {}: {e}", self.server))
    }
}

/// Whether a failed commit asks for the transaction to be run again.
pub(super) fn retryable(e: &postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::T_R_DEADLOCK_DETECTED || *c == SqlState::T_R_SERIALIZATION_FAILURE)
}

/// Whether an operation's error asks for its transaction to be run again.
pub(super) fn is_retry(e: &FsError) -> bool {
    e.is(Errno::EAGAIN) && e.context == RETRY
}

fn os_user() -> Option<String> {
    nix::unistd::User::from_uid(nix::unistd::geteuid()).ok().flatten().map(|u| u.name)
}

fn host_name(host: &Host) -> String {
    match host {
        Host::Tcp(h) => h.clone(),
        Host::Unix(p) => p.display().to_string(),
    }
}

fn describe(config: &Config) -> String {
    let host = config.get_hosts().first().map(host_name).unwrap_or_default();
    let port = config.get_ports().first().copied().unwrap_or(5432);
    let user = config.get_user().unwrap_or_default();
    let db = config.get_dbname().unwrap_or(user);
    format!("{user}@{host}:{port}/{db}")
}

/// The password for `config` from libpq's password file (`PGPASSFILE`, else `~/.pgpass`): the
/// first line `host:port:database:user:password` that matches, `*` matching anything and a
/// socket connection matching `localhost`. Like libpq, a file others may read is ignored.
fn password_file(config: &Config) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let path = match std::env::var_os("PGPASSFILE") {
        Some(p) => PathBuf::from(p),
        None => dirs::home_dir()?.join(".pgpass"),
    };
    let meta = std::fs::metadata(&path).ok()?;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!("{} is ignored: others may read it (chmod 0600 it)", path.display());
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let host = match config.get_hosts().first()? {
        Host::Tcp(h) => h.clone(),
        Host::Unix(_) => "localhost".to_string(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = config.get_user()?.to_string();
    let db = config.get_dbname().unwrap_or(&user).to_string();
    let wanted = [host, port, db, user];
    text.lines().filter(|l| !l.starts_with('#')).find_map(|line| {
        let fields = split_pgpass(line);
        let [h, p, d, u, password] = <[String; 5]>::try_from(fields).ok()?;
        let matches = [h, p, d, u].iter().zip(&wanted).all(|(field, want)| field == "*" || field == want);
        matches.then_some(password)
    })
}

/// The `:`-separated fields of a password-file line, `\:` and `\\` unescaped.
fn split_pgpass(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => fields.last_mut().expect("one field").extend(chars.next()),
            ':' => fields.push(String::new()),
            c => fields.last_mut().expect("one field").push(c),
        }
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn password_file_lines_unescape() {
        assert_eq!(split_pgpass(r"h:5432:*:me:pa\:ss\\"), ["h", "5432", "*", "me", r"pa:ss\"]);
    }

    #[test]
    fn bad_settings_are_refused_with_the_reason() {
        let e = PgSettings::new("postgresql://u@h/db", "Bad-Name").err().unwrap();
        assert!(e.contains("schema \"Bad-Name\""), "{e}");
        let e = PgSettings::new("mysql://u@h/db", "agentvfs").err().unwrap();
        assert!(e.contains("not a PostgreSQL connection URL"), "{e}");
        let s = PgSettings::new("postgresql://alice:secret@db.example:6543/store", "agentvfs").unwrap();
        assert_eq!(s.server(), "alice@db.example:6543/store");
    }
}
