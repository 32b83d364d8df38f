//! Tests of the postgres backend on a private server: the shared backend suite, and what only
//! a shared store has (several daemons on one namespace, notifications, orphans, faults).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::testing::TestServer;
use super::{PgSettings, PostgresBackend};

/// A backend on a namespace of its own of the shared test server.
pub fn backend(namespace: &str) -> PostgresBackend {
    let server = TestServer::shared();
    let settings = PgSettings::new(&server.url(), "agentvfs").unwrap();
    PostgresBackend::open(settings, namespace).unwrap()
}

/// A namespace no other test of this process uses.
fn fresh_namespace() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("test-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

crate::backend::suite::backend_suite!(((), backend(&fresh_namespace())));
