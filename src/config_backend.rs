//! What each backend kind is, in one place (its defaults, in one exhaustive match), and what
//! the config can tell of a route's store without opening it: namespace, location, sharing.

use std::time::Duration;

use super::BackendConfig;

/// What a backend kind is, in one place: its config name, the kernel cache lifetime it gets
/// when the config does not say, and whether others than this daemon change its tree.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KindDefaults {
    pub name: &'static str,
    pub cache_ttl: Duration,
    /// Changed behind this daemon's back (other programs on the host, other daemons on a
    /// shared store), so the daemon must watch it to keep a long cache lifetime honest.
    pub changed_by_others: bool,
}

impl BackendConfig {
    /// The defaults of this backend's kind. A new kind is a new arm here.
    pub fn defaults(&self) -> KindDefaults {
        let hour = Duration::from_secs(3600);
        let (name, cache_ttl, changed_by_others) = match self {
            // Short until the host-changes watcher is known to work (see daemon.rs).
            BackendConfig::Host { .. } => ("host", Duration::from_secs(1), true),
            BackendConfig::Memory { .. } => ("memory", hour, false),
            BackendConfig::Sqlite { .. } => ("sqlite", hour, false),
            // Other daemons' changes arrive as notifications, which invalidate the kernel's
            // caches, so a long lifetime stays correct.
            BackendConfig::Postgres { .. } => ("postgres", hour, true),
        };
        KindDefaults { name, cache_ttl, changed_by_others }
    }

    pub fn kind(&self) -> &'static str {
        self.defaults().name
    }
}

impl BackendConfig {
    /// Both are one namespace of one database (which serves one route of a daemon at a time).
    pub(super) fn shares_namespace_with(&self, other: &BackendConfig) -> bool {
        match (self, other) {
            (
                BackendConfig::Sqlite { database: a, namespace: m },
                BackendConfig::Sqlite { database: b, namespace: n },
            ) => a == b && m == n,
            (
                BackendConfig::Postgres { url: a, schema: s, namespace: m, layout: x, .. },
                BackendConfig::Postgres { url: b, schema: t, namespace: n, layout: y, .. },
                // Every schema's langgraph routes read the one store table: the schema (of the
                // side table) does not set them apart.
            ) => a == b && m == n && x == y && (s == t || *x == crate::config::PgLayout::LangGraph),
            _ => false,
        }
    }

    /// The namespace of a database backend.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            BackendConfig::Sqlite { namespace, .. } | BackendConfig::Postgres { namespace, .. } => {
                Some(namespace)
            }
            BackendConfig::Host { .. } | BackendConfig::Memory { .. } => None,
        }
    }

    /// Where the route's data lives, for people: a host path, a database file, or a server
    /// (`user@host:port/db`, never the password); `None` for memory.
    pub fn location(&self) -> Option<String> {
        match self {
            BackendConfig::Host { root } => Some(root.display().to_string()),
            BackendConfig::Sqlite { database, .. } => Some(database.display().to_string()),
            BackendConfig::Postgres { url, schema, .. } => Some(
                crate::backend::postgres::PgSettings::new(url, schema)
                    .map(|s| s.server())
                    .unwrap_or_default(),
            ),
            BackendConfig::Memory { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    fn parse(text: &str) -> Result<Config, crate::config::ConfigError> {
        Config::parse_str(text, "t.toml", Path::new("/"))
    }

    const PG: &str = "[[routes]]\npath = \"/pg\"\nbackend = \"postgres\"\n";

    #[test]
    fn postgres_routes_are_checked_and_get_their_kinds_defaults() {
        let c = parse(&format!("{PG}url = \"postgresql://alice:secret@db:6543/agents\"\n")).unwrap();
        let route = &c.routes[1];
        assert_eq!(route.cache_ttl, Duration::from_secs(3600));
        assert!(route.backend.defaults().changed_by_others);
        assert_eq!(route.backend.namespace(), Some("default"));
        // The location never shows the password.
        assert_eq!(route.backend.location().as_deref(), Some("alice@db:6543/agents"));

        let e = parse(PG).unwrap_err();
        assert!(e.message.contains("backend \"postgres\" needs `url`"), "{e}");
        let e = parse(&format!("{PG}url = \"postgresql://a@h/d\"\nschema = \"No-Such\"\n")).unwrap_err();
        assert!(e.message.contains("schema \"No-Such\" must be a plain lowercase SQL name"), "{e}");
        let e = parse(&format!("{PG}url = \"postgresql://a@h/d\"\nroot = \"/\"\n")).unwrap_err();
        assert!(e.message.contains("key `root` does not apply to backend \"postgres\""), "{e}");
        let lg = format!(
            "{PG}url = \"postgresql://a@h/d\"\nlayout = \"langgraph\"\nnamespace = \"alice.filesystem\"\n"
        );
        let c = parse(&lg).unwrap();
        assert!(matches!(
            &c.routes[1].backend,
            BackendConfig::Postgres { layout: crate::config::PgLayout::LangGraph, namespace, .. } if namespace == "alice.filesystem"
        ));
        let e = parse(&format!("{PG}url = \"postgresql://a@h/d\"\nlayout = \"flat\"\n")).unwrap_err();
        assert!(
            e.message.contains("unknown postgres layout \"flat\" (expected \"tree\" or \"langgraph\")"),
            "{e}"
        );
        let e = parse(
            "[[routes]]\npath = \"/s\"\nbackend = \"sqlite\"\ndatabase = \"s.db\"\nlayout = \"tree\"\n",
        )
        .unwrap_err();
        assert!(e.message.contains("key `layout` does not apply to backend \"sqlite\""), "{e}");
        // Two langgraph routes on one prefix read the same rows, whatever their schemas.
        let e = parse(&format!("{lg}{}schema = \"other\"\n", lg.replace("/pg", "/pg2"))).unwrap_err();
        assert!(e.message.contains("give each route a namespace of its own"), "{e}");
        let twice = format!(
            "{PG}url = \"postgresql://a@h/d\"\n{}url = \"postgresql://a@h/d\"\n",
            PG.replace("/pg", "/pg2")
        );
        let e = parse(&twice).unwrap_err();
        assert!(e.message.contains("give each route a namespace of its own"), "{e}");
    }

    #[test]
    fn a_postgres_close_waits_for_the_servers_disk_only_when_asked() {
        let sync_of = |text: &str| match parse(text).unwrap().routes[1].backend {
            BackendConfig::Postgres { sync_on_close, .. } => sync_on_close,
            ref other => panic!("{other:?}"),
        };
        assert!(!sync_of(&format!("{PG}url = \"postgresql://a@h/d\"\n")));
        assert!(sync_of(&format!("{PG}url = \"postgresql://a@h/d\"\nsync_on_close = true\n")));
        let e = parse(&format!("{PG}url = \"postgresql://a@h/d\"\nsync_on_close = \"yes\"\n")).unwrap_err();
        assert!(e.message.contains("expected a boolean"), "{e}");
        let e = parse(&format!(
            "{PG}url = \"postgresql://a@h/d\"\nlayout = \"langgraph\"\nsync_on_close = false\n"
        ))
        .unwrap_err();
        assert!(e.message.contains("`sync_on_close` does not apply to layout \"langgraph\""), "{e}");
        let e = parse(
            "[[routes]]\npath = \"/s\"\nbackend = \"sqlite\"\ndatabase = \"s.db\"\nsync_on_close = true\n",
        )
        .unwrap_err();
        assert!(e.message.contains("key `sync_on_close` does not apply to backend \"sqlite\""), "{e}");
    }
}
