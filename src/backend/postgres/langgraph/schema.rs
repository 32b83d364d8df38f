//! What the `langgraph` layout keeps in the database: LangGraph's `store` table (created as
//! LangGraph's own migrations would, when missing), agentvfs's side table of POSIX metadata
//! (a migration of agentvfs's schema), and the trigger by which every writer of the store
//! table, LangGraph included, announces its changes on the prefix's notification channel.

use postgres::Client;

use super::super::PgSettings;
use crate::error::{Errno, FsError, FsResult};

/// LangGraph's table, where `PostgresStore` finds it with the default search path.
pub(super) const STORE: &str = "public.store";

/// The `S_IFMT` bits the side table stores in `kind`.
pub(super) const KIND_DIR: i32 = libc::S_IFDIR as i32;
pub(super) const KIND_FILE: i32 = libc::S_IFREG as i32;

/// Migration 2 of agentvfs's schema (see `postgres::schema`): the side table and the
/// functions that read the store's values. Run with the search path at agentvfs's schema.
///
/// `lg_nodes` holds what the store has no column for: a row per directory made by `mkdir`
/// (directories are otherwise implied by the keys below them) and per file whose mode, owner
/// or times were set. `path` is below the route (`''` its root, `a/b` the key `/a/b`).
pub(in crate::backend::postgres) const SIDE_TABLES: &str = r#"
CREATE TABLE lg_nodes (
    prefix text NOT NULL,
    path   text NOT NULL,
    kind   integer NOT NULL,
    perm   integer NOT NULL,
    uid    bigint NOT NULL,
    gid    bigint NOT NULL,
    atime  bigint NOT NULL,
    mtime  bigint NOT NULL,
    ctime  bigint NOT NULL,
    crtime bigint NOT NULL,
    PRIMARY KEY (prefix, path)
);
-- A value's bytes: Deep Agents writes `content` as text with `encoding` "utf-8", or base64
-- with "base64"; values of older versions hold a list of lines.
CREATE FUNCTION lg_content(v jsonb) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE
        WHEN jsonb_typeof(v->'content') = 'array' THEN convert_to(array_to_string(
            ARRAY(SELECT jsonb_array_elements_text(v->'content')), E'\n'), 'UTF8')
        WHEN v->>'encoding' = 'base64' THEN decode(v->>'content', 'base64')
        ELSE convert_to(coalesce(v->>'content', ''), 'UTF8')
    END
$$;
-- A value as StoreBackend writes one: text with "utf-8", or base64 (one line) with "base64".
CREATE FUNCTION lg_value(data bytea, utf8 boolean, created text, modified text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'content', CASE WHEN utf8 THEN convert_from(data, 'UTF8')
                        ELSE translate(encode(data, 'base64'), E'\n', '') END,
        'encoding', CASE WHEN utf8 THEN 'utf-8' ELSE 'base64' END,
        'created_at', created,
        'modified_at', modified)
$$;
-- An ISO 8601 time (Python's isoformat) in nanoseconds since the epoch; NULL if it is none.
CREATE FUNCTION lg_ns(t text) RETURNS bigint LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN round(extract(epoch FROM t::timestamptz) * 1000000)::bigint * 1000;
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$;
-- Nanoseconds since the epoch as Python's `datetime.now(UTC).isoformat()` writes them.
CREATE FUNCTION lg_iso(ns bigint) RETURNS text LANGUAGE sql IMMUTABLE AS $$
    SELECT to_char(to_timestamp(ns / 1e9) AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')
$$;
"#;

/// LangGraph's migrations (langgraph-checkpoint-postgres 3.2.0, `MIGRATIONS` of
/// `langgraph/store/postgres/base.py`), versions 0 to 3, for a database that has no store
/// yet; its index is built plainly rather than `CONCURRENTLY`, which a transaction cannot do.
const LANGGRAPH_MIGRATIONS: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS store (
        -- 'prefix' represents the doc's 'namespace'
        prefix text NOT NULL,
        key text NOT NULL,
        value jsonb NOT NULL,
        created_at TIMESTAMP WITH TIME ZONE DEFAULT CURRENT_TIMESTAMP,
        updated_at TIMESTAMP WITH TIME ZONE DEFAULT CURRENT_TIMESTAMP,
        PRIMARY KEY (prefix, key)
    )",
    "CREATE INDEX IF NOT EXISTS store_prefix_idx ON store USING btree (prefix text_pattern_ops)",
    "ALTER TABLE store
        ADD COLUMN IF NOT EXISTS expires_at TIMESTAMP WITH TIME ZONE,
        ADD COLUMN IF NOT EXISTS ttl_minutes INT",
    "CREATE INDEX IF NOT EXISTS idx_store_expires_at ON store (expires_at) WHERE expires_at IS NOT NULL",
];

/// The notification channel of `prefix`, as the trigger names it (a digest: a prefix may be
/// longer than a channel name may be).
pub(super) fn channel(client: &mut Client, settings: &PgSettings, prefix: &str) -> FsResult<String> {
    let row = client
        .query_one("SELECT 'agentvfs_lg_' || left(md5($1 || ':' || $2), 20)", &[&settings.schema, &prefix])
        .map_err(|e| settings.error(e))?;
    Ok(row.get(0))
}

/// The trigger functions: `lg_announce` sends one notification for a key that came, went or
/// changed (for a key that came or went, the topmost directory that came or went with it, so
/// that a kernel's cached absence of that directory is dropped too); `lg_notify` is the row
/// trigger. `SECURITY DEFINER`: LangGraph's role runs it, and needs no rights on agentvfs's
/// schema. The writer's instance comes from `agentvfs.instance` (set by a daemon's
/// transactions, absent for LangGraph: 0), so a daemon skips its own changes.
fn trigger_functions(schema: &str) -> String {
    format!(
        r#"
CREATE OR REPLACE FUNCTION {schema}.lg_announce(who text, pfx text, k text, what text) RETURNS void
LANGUAGE plpgsql SET search_path = {schema}, pg_catalog AS $$
DECLARE
    chan text := 'agentvfs_lg_' || left(md5('{schema}' || ':' || pfx), 20);
    rel text;
    top text;
    anc text;
    parts text[];
    kind text := 'n';
BEGIN
    IF left(k, 1) <> '/' THEN
        RETURN; -- not a file of Deep Agents' (see the module docs)
    END IF;
    rel := substr(k, 2);
    top := rel;
    IF what = 'c' THEN
        kind := 'c';
    ELSE
        parts := string_to_array(rel, '/');
        FOR i IN 1 .. coalesce(array_length(parts, 1), 0) - 1 LOOP
            anc := array_to_string(parts[1:i], '/');
            IF NOT EXISTS (SELECT 1 FROM {store} s WHERE s.prefix = pfx AND s.key <> k
                           AND starts_with(s.key, '/' || anc || '/'))
               AND NOT EXISTS (SELECT 1 FROM lg_nodes m WHERE m.prefix = pfx AND m.path = anc
                               AND m.kind = {dir}) THEN
                top := anc;
                EXIT;
            END IF;
        END LOOP;
    END IF;
    IF octet_length(top) > 7900 THEN
        PERFORM pg_notify(chan, who || E'\t*\t');
    ELSE
        PERFORM pg_notify(chan, who || E'\t' || kind || E'\t' || top);
    END IF;
END
$$;
CREATE OR REPLACE FUNCTION {schema}.lg_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = {schema}, pg_catalog AS $$
DECLARE
    who text := coalesce(nullif(current_setting('agentvfs.instance', true), ''), '0');
BEGIN
    -- Only the prefixes a daemon has served (they have a root row) are worth the work: the
    -- store may hold much else of LangGraph's.
    IF NOT EXISTS (SELECT 1 FROM lg_nodes m WHERE m.path = '' AND m.prefix IN (OLD.prefix, NEW.prefix)) THEN
        RETURN NULL;
    END IF;
    IF TG_OP = 'UPDATE' AND NEW.prefix = OLD.prefix AND NEW.key = OLD.key THEN
        PERFORM lg_announce(who, NEW.prefix, NEW.key, 'c');
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        PERFORM lg_announce(who, OLD.prefix, OLD.key, 'gone');
    END IF;
    IF TG_OP = 'DELETE' THEN
        -- A file deleted by LangGraph takes its metadata along.
        DELETE FROM lg_nodes WHERE prefix = OLD.prefix AND path = substr(OLD.key, 2) AND kind = {file};
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        PERFORM lg_announce(who, NEW.prefix, NEW.key, 'came');
    END IF;
    RETURN NULL;
END
$$;
"#,
        store = STORE,
        dir = KIND_DIR,
        file = KIND_FILE,
    )
}

/// Makes sure LangGraph's store table exists (creating it, and its `store_migrations`, as
/// LangGraph's `PostgresStore.setup()` would, so that a later `setup()` has nothing to do),
/// that it has the columns this layout reads, and that it carries this schema's trigger.
/// Under the migration lock of agentvfs's schema, so that daemons starting together do it once.
pub(super) fn prepare_store(client: &mut Client, settings: &PgSettings, migrate_lock: &str) -> FsResult<()> {
    let schema = &settings.schema;
    let err = |e| settings.error(e);
    let mut tx = client.transaction().map_err(err)?;
    tx.batch_execute(migrate_lock).map_err(err)?;
    let exists: bool =
        tx.query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&STORE]).map_err(err)?.get(0);
    if !exists {
        tx.batch_execute("SET LOCAL search_path TO public; CREATE TABLE IF NOT EXISTS store_migrations (v INTEGER PRIMARY KEY)")
            .map_err(err)?;
        for (v, sql) in LANGGRAPH_MIGRATIONS.iter().enumerate() {
            tx.batch_execute(sql).map_err(err)?;
            tx.execute("INSERT INTO store_migrations (v) VALUES ($1) ON CONFLICT DO NOTHING", &[&(v as i32)])
                .map_err(err)?;
        }
        tx.batch_execute(&format!("SET LOCAL search_path TO {schema}")).map_err(err)?;
    }
    let columns: Vec<(String, String)> = tx
        .query(
            "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute
             WHERE attrelid = $1::text::regclass AND attnum > 0 AND NOT attisdropped",
            &[&STORE],
        )
        .map_err(err)?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    for (name, ty) in [("prefix", "text"), ("key", "text"), ("value", "jsonb")] {
        if !columns.iter().any(|(n, t)| n == name && t == ty) {
            return Err(FsError::new(
                Errno::EINVAL,
                format!(
                    "postgres {}: {STORE} is not LangGraph's store table (no column {name} {ty}); \
                     the langgraph layout reads the table of langgraph-checkpoint-postgres's PostgresStore",
                    settings.server()
                ),
            ));
        }
    }
    tx.batch_execute(&trigger_functions(schema)).map_err(err)?;
    let trigger = format!("agentvfs_{schema}");
    let installed: bool = tx
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::text::regclass AND tgname = $2)",
            &[&STORE, &trigger],
        )
        .map_err(err)?
        .get(0);
    if !installed {
        tx.batch_execute(&format!(
            "CREATE TRIGGER {trigger} AFTER INSERT OR UPDATE OR DELETE ON {STORE}
             FOR EACH ROW EXECUTE FUNCTION {schema}.lg_notify()"
        ))
        .map_err(err)?;
    }
    tx.commit().map_err(err)
}
