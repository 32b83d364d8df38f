//! Quiet while alone: a daemon that is the only one on its namespace sends no change
//! notifications, which otherwise wake its own listening connection and the server process
//! behind it on every change (a tenth to a fifth of a change's cost on a small machine). The
//! protocol, whose every guarantee the server keeps (a daemon that dies or loses its
//! listening connection cannot leave another one blind):
//!
//! - **Members.** Each daemon's listening connection holds a shared session lock
//!   `(member, ns)` while it listens. Joining and going quiet both happen under the
//!   namespace's join lock (an exclusive transaction lock), so each sees the other.
//! - **The lease.** A daemon that finds no other member takes its *alone lease*, an exclusive
//!   session lock `(hashtext(channel || ':alone'), instance)`, on the same connection. Every
//!   change calls the server function `notice(channel, payload)` instead of `pg_notify`; it
//!   sends the notification unless the lease of the instance named in the payload is held.
//!   So a daemon whose listening connection is gone notifies again at once.
//! - **The guard.** `notice` first takes the shared transaction lock
//!   `(hashtext(channel), 0)`, held until its change commits.
//! - **Joining.** A daemon that starts (or whose listening connection came back) registers as
//!   a member, announces itself (`instance \t j`), waits until no lease is held on the
//!   namespace (a quiet daemon gives its lease up when it hears the announcement; one that
//!   does not within [`LEASE_WAIT`] has its listening connection ended by the server), then
//!   takes the guard exclusively once: that waits for every change that was decided quiet and
//!   has not committed. Everything it reads afterwards is either committed before, or
//!   notified.
//! - A daemon whose peers are gone takes its lease again at its next look
//!   ([`Listener`](super::notify::Listener) looks every few seconds).
//!
//! A daemon of an older version listens without being a member; while one holds an
//! instance lock without a member lock, nobody goes quiet.

use std::time::{Duration, Instant};

use postgres::Client;

use super::schema;
use super::PgSettings;
use crate::error::FsResult;

/// How long a joining daemon waits for a quiet one to give its lease up.
const LEASE_WAIT: Duration = Duration::from_secs(3);
/// Pause between two looks at the leases while waiting.
const LEASE_POLL: Duration = Duration::from_millis(5);

/// Migration 5: `notice`, and the tree functions of migrations 3 and 4 calling it. They are
/// re-created from their current text (which also reads each node by its key, see
/// `walk_to_dir`); a later change to them re-creates them the same way, in a migration of its
/// own.
pub(super) fn migration() -> String {
    let redefined = |sql: &str| {
        sql.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION").replace("pg_notify(", "notice(")
    };
    format!(
        "{NOTICE}{}{}",
        redefined(super::functions::MIGRATION),
        redefined(super::functions::RENAME_MIGRATION)
    )
}

/// `notice(channel, payload)`: `pg_notify`, unless the instance that the payload names (its
/// first field) holds its alone lease on the channel's namespace. The guard is taken first,
/// so that a joining daemon can wait for the quiet changes under way.
const NOTICE: &str = "
CREATE FUNCTION notice(channel text, payload text) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(hashtext(channel), 0);
    IF pg_try_advisory_xact_lock_shared(hashtext(channel || ':alone'),
            split_part(payload, E'\\t', 1)::integer) THEN
        PERFORM pg_notify(channel, payload);
    END IF;
END $$;
";

/// The first key of the alone leases on the namespace of `channel` (the second is the
/// instance), as an SQL expression; `notice` computes the same.
fn lease_key(channel: &str) -> String {
    format!("hashtext('{channel}:alone')")
}

/// The server processes holding an alone lease on the namespace of `channel`.
pub(super) fn lease_holders(channel: &str) -> String {
    format!("SELECT pid FROM pg_locks WHERE {} AND mode = 'ExclusiveLock'", locks_of("", &lease_key(channel)))
}

/// The join lock of the namespace of `channel`, for the current transaction.
fn join_lock(channel: &str) -> String {
    format!("SELECT pg_advisory_xact_lock(hashtext('{channel}:join'), 0)")
}

/// The `pg_locks` condition (columns prefixed by `alias`) for granted advisory locks whose
/// first key is the SQL expression `key1`.
fn locks_of(alias: &str, key1: &str) -> String {
    format!(
        "{alias}locktype = 'advisory' AND {alias}granted AND {alias}objsubid = 2
         AND {alias}classid = ({key1}::bigint & 4294967295)::oid"
    )
}

/// The statement taking this listening connection's member lock (with the instance lock and
/// the LISTEN that precede it, see [`super::notify`]).
pub(super) fn member_lock(schema: &str, ns: i64) -> String {
    format!("SELECT pg_advisory_lock_shared({}, {ns})", schema::key(schema, "member"))
}

/// Joins the namespace on `client` (a listening connection that holds its member lock):
/// announces this daemon, waits until no other daemon is quiet, and then until every quiet
/// change under way has committed.
pub(super) fn join(client: &mut Client, settings: &PgSettings, channel: &str, instance: i64) -> FsResult<()> {
    let err = |e| settings.error(e);
    // (A joining connection holds no lease: it is new, or its old session went with it.)
    let leases = lease_holders(channel);
    let quiet: Vec<i32> = {
        client.batch_execute(&format!("BEGIN; {}", join_lock(channel))).map_err(err)?;
        let found = client.query(&leases, &[]);
        client.batch_execute("COMMIT").map_err(err)?;
        found.map_err(err)?.iter().map(|r| r.get(0)).collect()
    };
    if !quiet.is_empty() {
        client.batch_execute(&format!("NOTIFY \"{channel}\", '{instance}\tj'")).map_err(err)?;
        let deadline = Instant::now() + LEASE_WAIT;
        loop {
            let held: Vec<i32> = client.query(&leases, &[]).map_err(err)?.iter().map(|r| r.get(0)).collect();
            if held.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    "postgres {}: a daemon on this namespace kept its quiet lease for {LEASE_WAIT:?} after being told that another one joined; ending its listening connection (server process {held:?}) so that it notifies again",
                    settings.server()
                );
                for pid in held {
                    if let Err(e) = client.query("SELECT pg_terminate_backend($1)", &[&pid]) {
                        tracing::warn!(
                            "postgres {}: cannot end server process {pid}: {e}",
                            settings.server()
                        );
                    }
                }
                break;
            }
            std::thread::sleep(LEASE_POLL);
        }
    }
    client
        .batch_execute(&format!("BEGIN; SELECT pg_advisory_xact_lock(hashtext('{channel}'), 0); COMMIT"))
        .map_err(err)
}

/// Takes this daemon's alone lease if no other daemon is on the namespace `ns` (and none of
/// an older version listens anywhere on the schema); true when it holds it.
pub(super) fn try_alone(
    client: &mut Client,
    settings: &PgSettings,
    channel: &str,
    ns: i64,
    instance: i64,
) -> FsResult<bool> {
    let err = |e| settings.error(e);
    let member = schema::key(&settings.schema, "member");
    let instance_key = schema::key(&settings.schema, "instance");
    let others = format!(
        "SELECT (SELECT count(*) FROM pg_locks WHERE {members} AND objid = {ns} AND pid <> pg_backend_pid())
              + (SELECT count(*) FROM pg_locks i WHERE {instances}
                   AND NOT EXISTS (SELECT 1 FROM pg_locks m WHERE m.pid = i.pid AND {any_member}))",
        members = locks_of("", &member.to_string()),
        instances = locks_of("i.", &instance_key.to_string()),
        any_member = locks_of("m.", &member.to_string()),
    );
    client.batch_execute(&format!("BEGIN; {}", join_lock(channel))).map_err(err)?;
    let alone = (|| {
        let others: i64 = client.query_one(&others, &[])?.get(0);
        if others > 0 {
            return Ok(false);
        }
        let taken: bool = client
            .query_one(&format!("SELECT pg_try_advisory_lock({}, {instance})", lease_key(channel)), &[])?
            .get(0);
        Ok(taken)
    })();
    let end = client.batch_execute(if alone.is_ok() { "COMMIT" } else { "ROLLBACK" });
    let alone = alone.map_err(err)?;
    end.map_err(err)?;
    Ok(alone)
}

/// Gives the alone lease up (another daemon joined).
pub(super) fn give_up(
    client: &mut Client,
    settings: &PgSettings,
    channel: &str,
    instance: i64,
) -> FsResult<()> {
    client
        .batch_execute(&format!("SELECT pg_advisory_unlock({}, {instance})", lease_key(channel)))
        .map_err(|e| settings.error(e))
}
