//! The tables onceflow keeps beside the user's, in the inbox's schema: the inbox (one row per
//! message applied, by consumer), its origins table (the consumed record behind each message)
//! and the deletion markers (`onceflow_tombstones`). Their names and DDL, creating them when
//! missing, and the statements that remove expired rows. The PostgreSQL sink writes all three;
//! the HTTP sink's deduplication writes an inbox of its own.

use std::fmt::Write;

use tokio_postgres::Client;

use super::error::PgError;

/// Quotes an identifier (`"a""b"`).
pub(crate) fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Quotes a possibly schema-qualified name (`sales.orders` -> `"sales"."orders"`).
pub(crate) fn qualified(name: &str) -> String {
    name.split('.').map(ident).collect::<Vec<_>>().join(".")
}

/// The unqualified part of a name.
fn base_name(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// The tombstones table: beside the inbox, in the same schema.
pub(crate) fn tombstones_table(inbox: &str) -> String {
    match inbox.rsplit_once('.') {
        Some((schema, _)) => format!("{schema}.onceflow_tombstones"),
        None => "onceflow_tombstones".to_string(),
    }
}

/// The origins table of an inbox: beside it, named after it (`<inbox>_origins`). One row per
/// inbox row of a PostgreSQL output: the consumed record (topic, partition, offset) that
/// brought the message first, so that a row's origin is a join away
/// (`USING (consumer, message_id)`) and `onceflow reconcile` can check the output by origin.
/// A table of its own rather than columns of the inbox: an existing inbox stays as it is
/// (nothing to migrate), and the HTTP outputs' inboxes do without it.
pub(crate) fn origins_table(inbox: &str) -> String {
    format!("{inbox}_origins")
}

/// Creates the origins table of `inbox` if missing (see [`origins_table`]).
pub(crate) fn create_origins_table(inbox: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {q} (\n\
         \x20 consumer         text COLLATE \"C\" NOT NULL,\n\
         \x20 message_id       text COLLATE \"C\" NOT NULL,\n\
         \x20 origin_topic     text   NOT NULL,\n\
         \x20 origin_partition int    NOT NULL,\n\
         \x20 origin_offset    bigint NOT NULL,\n\
         \x20 PRIMARY KEY (consumer, message_id)\n\
         );\n",
        q = qualified(&origins_table(inbox)),
    )
}

/// Deletes up to `$3` expired inbox rows of consumer `$1` (older than `$2` hours) and their
/// origins, returning how many inbox rows went.
pub(crate) fn cleanup_inbox_and_origins(inbox: &str) -> String {
    let q = qualified(inbox);
    format!(
        "WITH gone AS (DELETE FROM {q} WHERE ctid IN (SELECT ctid FROM {q} \
         WHERE consumer = $1::text AND received_at < now() - make_interval(hours => $2::int) \
         LIMIT $3::int) RETURNING consumer, message_id),\n\
         unlinked AS (DELETE FROM {origins} o USING gone g \
         WHERE o.consumer = g.consumer AND o.message_id = g.message_id)\n\
         SELECT count(*) FROM gone",
        origins = qualified(&origins_table(inbox)),
    )
}

/// Creates the inbox (and, when deletions are versioned, the tombstones table) if missing.
/// Run under an advisory lock: two instances starting together must not race on DDL.
pub(crate) fn create_tables(inbox: &str, tombstones: bool) -> String {
    let inbox_base = base_name(inbox);
    let mut sql = format!(
        "CREATE TABLE IF NOT EXISTS {inbox_q} (\n\
         \x20 consumer    text COLLATE \"C\" NOT NULL,\n\
         \x20 message_id  text COLLATE \"C\" NOT NULL,\n\
         \x20 received_at timestamptz NOT NULL DEFAULT now(),\n\
         \x20 PRIMARY KEY (consumer, message_id)\n\
         );\n\
         CREATE INDEX IF NOT EXISTS {index} ON {inbox_q} (received_at);\n",
        inbox_q = qualified(inbox),
        index = ident(&format!("{inbox_base}_received_at")),
    );
    if tombstones {
        let table = tombstones_table(inbox);
        let _ = write!(
            sql,
            "CREATE TABLE IF NOT EXISTS {q} (\n\
             \x20 target     text        NOT NULL,\n\
             \x20 id_key     text        NOT NULL,\n\
             \x20 version    text        NOT NULL,\n\
             \x20 deleted_at timestamptz NOT NULL DEFAULT now(),\n\
             \x20 PRIMARY KEY (target, id_key)\n\
             );\n\
             CREATE INDEX IF NOT EXISTS onceflow_tombstones_deleted_at ON {q} (deleted_at);\n",
            q = qualified(&table),
        );
    }
    sql
}

/// Deletes up to `$3` expired inbox rows of consumer `$1` (older than `$2` hours).
pub(crate) fn cleanup_inbox(inbox: &str) -> String {
    let q = qualified(inbox);
    format!(
        "DELETE FROM {q} WHERE ctid IN (SELECT ctid FROM {q} \
         WHERE consumer = $1::text AND received_at < now() - make_interval(hours => $2::int) \
         LIMIT $3::int)"
    )
}

/// Deletes up to `$3` expired deletion markers of table `$1` (older than `$2` hours).
pub(crate) fn cleanup_tombstones(inbox: &str) -> String {
    let q = qualified(&tombstones_table(inbox));
    format!(
        "DELETE FROM {q} WHERE ctid IN (SELECT ctid FROM {q} \
         WHERE target = $1::text AND deleted_at < now() - make_interval(hours => $2::int) \
         LIMIT $3::int)"
    )
}

/// Whether a table exists.
const TABLE_EXISTS: &str = "SELECT to_regclass($1::text) IS NOT NULL";

/// Creates the inbox (and the deletion markers' table with `markers`) when missing, under
/// an advisory lock: instances starting together must not race on DDL. Only what is missing
/// is created: a user without the right to create tables can run on tables made for it.
pub(crate) async fn ensure_tables(
    client: &Client,
    inbox: &str,
    markers: bool,
) -> Result<(), PgError> {
    let mut needed = vec![inbox.to_string()];
    if markers {
        needed.push(tombstones_table(inbox));
    }
    let mut missing = false;
    for table in &needed {
        let found: bool = client
            .query_one(TABLE_EXISTS, &[&qualified(table)])
            .await?
            .get(0);
        missing |= !found;
    }
    if missing {
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext('onceflow.schema'));\n{}COMMIT;",
                create_tables(inbox, markers)
            ))
            .await?;
    }
    Ok(())
}

/// Creates the origins table of `inbox` ([`origins_table`]) when missing, under the
/// same advisory lock as [`ensure_tables`]. An inbox made before the table existed keeps its
/// rows; their messages simply have no recorded origin.
pub(crate) async fn ensure_origins(client: &Client, inbox: &str) -> Result<(), PgError> {
    let table = origins_table(inbox);
    let found: bool = client
        .query_one(TABLE_EXISTS, &[&qualified(&table)])
        .await?
        .get(0);
    if !found {
        client
            .batch_execute(&format!(
                "BEGIN; SELECT pg_advisory_xact_lock(hashtext('onceflow.schema'));\n{}COMMIT;",
                create_origins_table(inbox)
            ))
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers_are_quoted() {
        assert_eq!(ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(qualified("sales.orders"), "\"sales\".\"orders\"");
        assert_eq!(tombstones_table("x.inbox"), "x.onceflow_tombstones");
        assert_eq!(tombstones_table("inbox"), "onceflow_tombstones");
    }

    #[test]
    fn the_origins_table_is_created_and_cleaned_with_its_inbox() {
        assert_eq!(origins_table("ops.inbox"), "ops.inbox_origins");
        let ddl = create_origins_table("ops.inbox");
        assert!(
            ddl.contains("CREATE TABLE IF NOT EXISTS \"ops\".\"inbox_origins\""),
            "{ddl}"
        );
        assert!(ddl.contains("PRIMARY KEY (consumer, message_id)"), "{ddl}");
        let clean = cleanup_inbox_and_origins("ops.inbox");
        assert!(
            clean.contains("DELETE FROM \"ops\".\"inbox_origins\" o USING gone g"),
            "{clean}"
        );
        assert!(clean.ends_with("SELECT count(*) FROM gone"), "{clean}");
    }

    #[test]
    fn ddl_creates_inbox_and_tombstones_if_missing() {
        let sql = create_tables("ops.inbox", true);
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"ops\".\"inbox\""));
        assert!(
            sql.contains("message_id  text COLLATE \"C\" NOT NULL"),
            "{sql}"
        );
        assert!(sql.contains("CREATE INDEX IF NOT EXISTS \"inbox_received_at\""));
        assert!(sql.contains("CREATE TABLE IF NOT EXISTS \"ops\".\"onceflow_tombstones\""));
        assert!(!create_tables("inbox", false).contains("tombstones"));
    }
}
