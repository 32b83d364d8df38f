//! The postgres route's layout: its tables (in the route's own schema, so it can share a
//! database with other applications), their versions in a `migrations` table, namespace roots,
//! daemon instances, the advisory-lock keys, and the cleanup of dead daemons' orphans.
//!
//! The tables have the sqlite store's shape (`namespaces`, `inodes`, `dentries`, `chunks`,
//! `xattrs`); chunks are keyed by `(ino, idx)` here, and inode numbers come from a sequence
//! that hands out blocks of [`INO_BLOCK`](super::INO_BLOCK).

use std::borrow::Cow;
use std::collections::HashMap;

use postgres::Client;

use super::store::Sql;
use super::PgSettings;
use crate::backend::tree::NewNode;
use crate::error::{Errno, FsError, FsResult};

/// The layouts, oldest first: entry `i` makes version `i + 1`. To change the layout, append a
/// migration; a daemon upgrades an older schema at start and refuses a newer one.
fn migrations() -> Vec<Cow<'static, str>> {
    let mut all: Vec<Cow<'static, str>> = FIXED_MIGRATIONS.iter().map(|m| Cow::Borrowed(*m)).collect();
    all.push(Cow::Owned(super::quiet::migration()));
    all.push(Cow::Borrowed(super::splice::MIGRATION));
    all.push(Cow::Borrowed(super::drafts::MIGRATION));
    all.push(Cow::Borrowed(super::journal::MIGRATION));
    all.push(Cow::Borrowed(super::journal::MOVES_MIGRATION));
    all.push(Cow::Borrowed(super::held_writes::MIGRATION));
    all.push(Cow::Borrowed(super::splice::APPEND_MIGRATION));
    all
}

/// The migrations written out as text: versions 1 to 4.
const FIXED_MIGRATIONS: &[&str] = &[
    "
CREATE SEQUENCE inode_seq INCREMENT BY 1024 START WITH 1;
CREATE SEQUENCE instance_seq;
CREATE TABLE namespaces (
    id   serial PRIMARY KEY,
    name text NOT NULL UNIQUE,
    root bigint NOT NULL
);
CREATE TABLE inodes (
    ino       bigint PRIMARY KEY,
    ns        integer NOT NULL,
    kind      integer NOT NULL,
    perm      integer NOT NULL,
    uid       bigint NOT NULL,
    gid       bigint NOT NULL,
    rdev      bigint NOT NULL,
    size      bigint NOT NULL,
    nlink     integer NOT NULL,
    atime     bigint NOT NULL,
    mtime     bigint NOT NULL,
    ctime     bigint NOT NULL,
    crtime    bigint NOT NULL,
    target    bytea,
    -- the daemon instance whose open handle keeps a nameless inode
    orphan_of integer
);
CREATE INDEX inodes_orphans ON inodes (ns) WHERE nlink = 0;
CREATE TABLE dentries (
    parent bigint NOT NULL,
    name   text NOT NULL,
    child  bigint NOT NULL,
    PRIMARY KEY (parent, name)
);
CREATE TABLE chunks (
    ino  bigint NOT NULL,
    idx  bigint NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (ino, idx)
);
CREATE TABLE xattrs (
    ino   bigint NOT NULL,
    name  text NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (ino, name)
);
",
    super::langgraph::SIDE_TABLES,
    super::functions::MIGRATION,
    super::functions::RENAME_MIGRATION,
];

/// A stable 32-bit key for advisory locks of `purpose` in `schema` (FNV-1a).
pub(super) fn key(schema: &str, purpose: &str) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in schema.bytes().chain([b':']).chain(purpose.bytes()) {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h as i32
}

/// The statement that takes, for the current transaction, the lock under which the schema is
/// created or migrated.
pub(super) fn migrate_lock(schema: &str) -> String {
    format!("SELECT pg_advisory_xact_lock({}, 0)", key(schema, "migrate"))
}

/// The statement that takes the name lock of namespace `ns` for the current transaction.
pub(super) fn tree_lock(schema: &str, ns: i64) -> String {
    format!("SELECT pg_advisory_xact_lock({}, {ns})", tree_lock_key(schema))
}

/// The first key of every namespace's name lock (the second is the namespace).
pub(super) fn tree_lock_key(schema: &str) -> i32 {
    key(schema, "tree")
}

/// The session lock a live daemon instance holds.
pub(super) fn instance_lock(schema: &str, instance: i64) -> String {
    format!("pg_advisory_lock({}, {instance})", key(schema, "instance"))
}

fn instance_try_lock(schema: &str, instance: i64) -> String {
    format!("SELECT pg_try_advisory_lock({}, {instance})", key(schema, "instance"))
}

/// Creates the schema and its tables, or brings them to the latest version, under a lock so
/// that daemons starting together do it once.
pub(super) fn create_or_migrate(client: &mut Client, settings: &PgSettings) -> FsResult<()> {
    let schema = &settings.schema;
    let err = |e| settings.error(e);
    let mut tx = client.transaction().map_err(err)?;
    tx.batch_execute(&format!(
        "SELECT pg_advisory_xact_lock({}, 0);
         CREATE SCHEMA IF NOT EXISTS {schema};
         CREATE TABLE IF NOT EXISTS {schema}.migrations (
             version    integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
        key(schema, "migrate")
    ))
    .map_err(err)?;
    let version: i32 = tx
        .query_one(&format!("SELECT coalesce(max(version), 0) FROM {schema}.migrations"), &[])
        .map_err(err)?
        .get(0);
    let migrations = migrations();
    let latest = migrations.len() as i32;
    if version > latest {
        return Err(FsError::new(
            Errno::EINVAL,
            format!(
                "postgres {}: schema {schema} is at version {version}, newer than this agentvfs supports ({latest}); upgrade agentvfs",
                settings.server()
            ),
        ));
    }
    for (i, migration) in migrations.iter().enumerate().skip(version as usize) {
        tx.batch_execute(&format!("SET LOCAL search_path TO {schema}; {migration}")).map_err(err)?;
        tx.execute(&format!("INSERT INTO {schema}.migrations (version) VALUES ($1)"), &[&(i as i32 + 1)])
            .map_err(err)?;
    }
    tx.commit().map_err(err)
}

/// Finds or creates a namespace; returns its id and root inode. The root of a new namespace
/// belongs to the daemon's user.
pub(super) fn namespace(client: &mut Client, settings: &PgSettings, name: &str) -> FsResult<(i64, u64)> {
    let err = |e| settings.error(e);
    client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock({}, 1)",
            key(&settings.schema, "migrate")
        ))
        .map_err(err)?;
    let mut stmts = HashMap::new();
    let found = (|| {
        let sql = Sql::new(client, &mut stmts, settings);
        if let Some(found) = sql.find_namespace(name)? {
            return Ok(found);
        }
        let ns = sql.insert_namespace(name)?;
        let root = sql.reserve_inos()?;
        crate::backend::tree::Tree::insert_node(&sql, root, &NewNode::root(ns))?;
        sql.set_namespace_root(ns, root)?;
        Ok((ns, root))
    })();
    let end = if found.is_ok() { "COMMIT" } else { "ROLLBACK" };
    client.batch_execute(end).map_err(err)?;
    found
}

/// A number of its own for this daemon's use of the namespace.
pub(super) fn new_instance(client: &mut Client, settings: &PgSettings) -> FsResult<i64> {
    let row = client.query_one("SELECT nextval('instance_seq')", &[]).map_err(|e| settings.error(e))?;
    Ok(row.get(0))
}

/// Deletes nameless inodes of namespace `ns` that daemons no longer running kept for their
/// open handles: an instance is gone when its session lock can be taken.
pub(super) fn remove_dead_orphans(client: &mut Client, settings: &PgSettings, ns: i64) -> FsResult<()> {
    let err = |e| settings.error(e);
    let owners: Vec<Option<i32>> = client
        .query("SELECT DISTINCT orphan_of FROM inodes WHERE ns = $1 AND nlink = 0", &[&(ns as i32)])
        .map_err(err)?
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut stmts = HashMap::new();
    for owner in owners {
        let owner = owner.unwrap_or(0);
        let free: bool =
            client.query_one(&instance_try_lock(&settings.schema, owner.into()), &[]).map_err(err)?.get(0);
        if !free {
            continue;
        }
        let inos: Vec<i64> = client
            .query(
                "SELECT ino FROM inodes WHERE ns = $1 AND nlink = 0 AND coalesce(orphan_of, 0) = $2",
                &[&(ns as i32), &owner],
            )
            .map_err(err)?
            .iter()
            .map(|r| r.get(0))
            .collect();
        for ino in inos {
            Sql::new(client, &mut stmts, settings).drop_nameless(ino as u64)?;
        }
        let unlock =
            instance_lock(&settings.schema, owner.into()).replace("pg_advisory_lock", "pg_advisory_unlock");
        client.query_one(&format!("SELECT {unlock}"), &[]).map_err(err)?;
    }
    Ok(())
}
