//! The SQL of the PostgreSQL sink, built once per output from its configuration and the
//! target table's column types. Pure text: unit-tested without a database.
//!
//! One statement applies a whole batch, inside one database transaction:
//!
//! 1. `batch`: the staged rows, sent by column as `text[]` parameters, unnested and cast to the
//!    table's own column types (input functions, as a `COPY` would);
//! 2. `fresh`: the batch's messages inserted into the inbox, `ON CONFLICT DO NOTHING
//!    RETURNING`: the messages applied before (a replay after a crash) come back absent;
//! 3. `latest`: of the fresh rows, one per id: the highest version (the last one in the
//!    batch when unversioned), compared by PostgreSQL in the version column's own type;
//!    counters are summed over the batch instead;
//! 4. `deleted`/`marked`: deletions, applied only over an older stored version, and
//!    remembered with their version (`onceflow_tombstones`) so that an older upsert arriving
//!    later does not bring the row back;
//! 5. `upserted`: `INSERT ... ON CONFLICT (ids) DO UPDATE ... WHERE stored version <
//!    incoming version`, skipping ids deleted at a newer or equal version.
//!
//! 6. `stepped`/`gaps`, with a sequence column: the fresh rows newer than the stored sequence
//!    (of the row, or of its deletion marker), each with the sequence before it in the batch
//!    (sorted by sequence within the id) or the stored one (0 for an id never seen): a row
//!    whose sequence is more than one past it follows missing sequences. Under
//!    `on_sequence_gap: apply` every such row is a gap; otherwise every row from an id's first
//!    hole on is (the row would stay before the hole), and the sink rolls the batch back.
//!
//! Every part sees the same snapshot, and each id appears once in `latest`, so no row is
//! touched twice.
//!
//! The statement comes in two forms. The careful one is the above. The optimistic one inserts
//! into the inbox without `ON CONFLICT` and takes every row as fresh: when no message of the
//! batch was applied before (nearly always) it does the same work without the cost of
//! speculative insertion; when one was, the inbox's unique key fails the whole statement,
//! nothing of it stays, and the sink applies the batch again with the careful form.

use std::fmt::Write;

use crate::pg::{ident, origins_table, qualified, tombstones_table};
use crate::topology::postgres::{OnSequenceGap, PostgresOutput};

/// The number of the first parameter of the origin arrays in [`apply_batch`]'s statement:
/// after the inbox consumer and, when deletions leave markers, the target's name.
pub fn origin_params(config: &PostgresOutput) -> usize {
    let markers = config.delete_when.is_some() && config.ordering_column().is_some();
    4 + config.columns.len() + usize::from(markers)
}

/// The target's columns with their types (`format_type` without modifiers: the insert itself
/// applies them, refusing a value too long rather than truncating it as an explicit cast
/// would), and whether they are generated.
pub const TABLE_COLUMNS: &str = "SELECT a.attname::text, format_type(a.atttypid, NULL), \
     a.attgenerated <> '' FROM pg_attribute a \
     WHERE a.attrelid = to_regclass($1::text) AND a.attnum > 0 AND NOT a.attisdropped \
     ORDER BY a.attnum";

/// The target's schema and name, when it exists.
pub const TABLE_NAME: &str = "SELECT n.nspname::text, c.relname::text FROM pg_class c \
     JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($1::text)";

/// The column sets of the target's unique indexes (plain ones: no expression, no predicate).
pub const UNIQUE_KEYS: &str = "SELECT ARRAY(SELECT a.attname::text FROM unnest(i.indkey::int2[]) k \
     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k) \
     FROM pg_index i WHERE i.indrelid = to_regclass($1::text) AND i.indisunique \
     AND i.indpred IS NULL AND i.indexprs IS NULL";

/// The statement that applies one batch. Parameters: `$1` the message ids (`text[]`), `$2`
/// the deletion flags (`boolean[]`), then one `text[]` per mapped column in the order of
/// `config.columns`, then the inbox consumer and, when deletions are versioned, the target's
/// name for deletion markers, then the origin of each row: topics (`text[]`), partitions
/// (`int[]`) and offsets (`bigint[]`), from [`origin_params`] on. Returns one row: fresh messages (the others were applied
/// before), rows upserted, rows deleted and, with a sequence column, the gaps as a JSON array
/// of `[row, id key, first missing, last missing]` (`row` 1-based in the batch).
///
/// `types` gives the type of every mapped column.
pub fn apply_batch(
    config: &PostgresOutput,
    target: &str,
    types: &[(String, String)],
    optimistic: bool,
) -> String {
    let statement = Statement::new(config, target, types);
    let mut sql = String::new();
    statement.batch(&mut sql);
    let fresh_rows = statement.fresh(&mut sql, optimistic);
    statement.linked(&mut sql, fresh_rows, optimistic);
    let source = statement.once(&mut sql, fresh_rows);
    statement.latest(&mut sql, source);
    if statement.sequence.is_some() {
        statement.gaps(&mut sql, source);
    }
    if statement.deletes {
        statement.deleted(&mut sql);
    }
    if let Some(v) = statement.marked_version() {
        statement.marked(&mut sql, v);
    }
    statement.upserted(&mut sql);
    statement.counts(&mut sql);
    sql
}

/// What the parts of [`apply_batch`]'s statement share: the configuration's names, quoted.
struct Statement<'c> {
    config: &'c PostgresOutput,
    types: &'c [(String, String)],
    /// The target table.
    table: String,
    /// The id columns.
    ids: Vec<String>,
    /// The version column (or the sequence column, which orders as one).
    version: Option<String>,
    /// The sequence column.
    sequence: Option<String>,
    deletes: bool,
    /// Whether deletions leave markers: when they are versioned.
    markers: bool,
    counters: bool,
    /// The tombstones table.
    tombstones: String,
    /// The mapped columns, unquoted, in the order of their parameters.
    columns: Vec<&'c String>,
    consumer_param: String,
    target_param: String,
    /// The first of the origin arrays' parameters.
    origin_param: usize,
}

impl<'c> Statement<'c> {
    fn new(config: &'c PostgresOutput, target: &str, types: &'c [(String, String)]) -> Self {
        let version = config.ordering_column().map(ident);
        let deletes = config.delete_when.is_some();
        let columns: Vec<&String> = config.columns.keys().collect();
        Statement {
            config,
            types,
            table: qualified(target),
            ids: config.id_columns.iter().map(|c| ident(c)).collect(),
            markers: deletes && version.is_some(),
            version,
            sequence: config.sequence_column.as_deref().map(ident),
            deletes,
            counters: !config.increment_columns.is_empty(),
            tombstones: qualified(&tombstones_table(&config.inbox_table)),
            consumer_param: format!("${}", 3 + columns.len()),
            target_param: format!("${}", 4 + columns.len()),
            origin_param: origin_params(config),
            columns,
        }
    }

    /// The table's type of a mapped column.
    fn type_of(&self, column: &str) -> &str {
        self.types
            .iter()
            .find(|(c, _)| c == column)
            .map_or("text", |(_, t)| t.as_str())
    }

    /// The version column's type, for comparing stored markers.
    fn version_type(&self) -> &str {
        self.type_of(self.config.ordering_column().unwrap_or(""))
    }

    /// The ids of row `alias` as one text, the key of its deletion marker.
    fn id_key(&self, alias: &str) -> String {
        let parts: Vec<String> = self.ids.iter().map(|c| format!("{alias}.{c}")).collect();
        format!("jsonb_build_array({})::text", parts.join(", "))
    }

    /// The version column, when deletions leave markers.
    fn marked_version(&self) -> Option<&str> {
        self.version.as_deref().filter(|_| self.markers)
    }

    /// `batch`: the parameters unnested, cast to the table's column types.
    fn batch(&self, sql: &mut String) {
        let mut arrays = vec!["$1::text[]".to_string(), "$2::boolean[]".to_string()];
        let mut names = vec!["\"$mid\"".to_string(), "\"$del\"".to_string()];
        let mut typed = vec![
            "r.\"$seq\"".to_string(),
            "r.\"$mid\" COLLATE \"C\" AS \"$mid\"".to_string(),
            "r.\"$del\"".to_string(),
        ];
        for (i, c) in self.columns.iter().enumerate() {
            let q = ident(c);
            arrays.push(format!("${}::text[]", 3 + i));
            typed.push(format!("r.{q}::{} AS {q}", self.type_of(c)));
            names.push(q);
        }
        names.push("\"$seq\"".to_string());
        let _ = write!(
            sql,
            "WITH batch AS (\n  SELECT {}\n  FROM unnest({}) WITH ORDINALITY AS r({})\n),\n",
            typed.join(", "),
            arrays.join(", "),
            names.join(", "),
        );
    }

    /// `fresh`: the messages inserted into the inbox. Returns the rows of the batch taken as
    /// fresh: all of them in the optimistic form, those of the inserted messages otherwise.
    fn fresh(&self, sql: &mut String, optimistic: bool) -> &'static str {
        let _ = write!(
            sql,
            "fresh AS (\n  INSERT INTO {inbox} AS i (consumer, message_id)\n  \
             SELECT {consumer_param}::text, \"$mid\" FROM batch\n  {on_conflict}RETURNING i.message_id\n),\n",
            inbox = qualified(&self.config.inbox_table),
            consumer_param = self.consumer_param,
            on_conflict = if optimistic {
                ""
            } else {
                "ON CONFLICT (consumer, message_id) DO NOTHING\n  "
            },
        );
        if optimistic {
            "batch b"
        } else {
            "batch b WHERE b.\"$mid\" IN (SELECT message_id FROM fresh)"
        }
    }

    /// `linked`: the origin of each fresh message (its first row's) in the origins table. The
    /// optimistic form inserts without `ON CONFLICT`, as it does into the inbox: an origin
    /// already there fails it the same way, and the careful form does nothing for it.
    fn linked(&self, sql: &mut String, fresh_rows: &str, optimistic: bool) {
        let p = self.origin_param;
        let _ = write!(
            sql,
            "linked AS (\n  INSERT INTO {origins} (consumer, message_id, origin_topic, origin_partition, origin_offset)\n  \
             SELECT DISTINCT ON (b.\"$mid\") {consumer_param}::text, b.\"$mid\", u.t, u.p, u.o\n  \
             FROM (SELECT b.* FROM {fresh_rows}) b\n  \
             JOIN unnest(${p}::text[], ${}::int[], ${}::bigint[]) WITH ORDINALITY AS u(t, p, o, n) ON u.n = b.\"$seq\"\n  \
             ORDER BY b.\"$mid\", b.\"$seq\"{on_conflict}\n),\n",
            p + 1,
            p + 2,
            on_conflict = if optimistic {
                ""
            } else {
                "\n  ON CONFLICT DO NOTHING"
            },
            origins = qualified(&origins_table(&self.config.inbox_table)),
            consumer_param = self.consumer_param,
        );
    }

    /// `once`, for counters: each message once per id, even if it came twice in the batch
    /// (the same event id on two offsets). Returns the rows `latest` reads.
    fn once(&self, sql: &mut String, fresh_rows: &'static str) -> &'static str {
        if !self.counters {
            return fresh_rows;
        }
        let _ = write!(
            sql,
            "once AS (\n  SELECT DISTINCT ON (b.\"$mid\", {ids}) b.*\n  \
             FROM {fresh_rows}\n  \
             ORDER BY b.\"$mid\", {ids}, b.\"$seq\"\n),\n",
            ids = prefixed("b", &self.ids),
        );
        "once b"
    }

    /// `latest`: one row per id, the newest version or the last in the batch; counters
    /// summed.
    fn latest(&self, sql: &mut String, source: &str) {
        let sums: String = self
            .config
            .increment_columns
            .iter()
            .map(|c| {
                format!(
                    ", sum(b.{col}) OVER (PARTITION BY {part}) AS {alias}",
                    col = ident(c),
                    part = prefixed("b", &self.ids),
                    alias = ident(&format!("$sum_{c}")),
                )
            })
            .collect();
        let order = match &self.version {
            Some(v) => format!(
                "{}, b.{v} DESC NULLS LAST, b.\"$seq\" DESC",
                prefixed("b", &self.ids)
            ),
            None => format!("{}, b.\"$seq\" DESC", prefixed("b", &self.ids)),
        };
        let _ = write!(
            sql,
            "latest AS (\n  SELECT DISTINCT ON ({on}) b.*{sums}\n  FROM {source}\n  ORDER BY {order}\n)",
            on = prefixed("b", &self.ids),
        );
    }

    /// `stepped`, `holes` and `gaps`: the rows that follow missing sequences. `source` gives
    /// the fresh rows.
    fn gaps(&self, sql: &mut String, source: &str) {
        let Some(s) = &self.sequence else {
            return;
        };
        let ids = prefixed("b", &self.ids);
        let matches: Vec<String> = self.ids.iter().map(|c| format!("t.{c} = b.{c}")).collect();
        let stored = if self.markers {
            format!(
                "coalesce(t.{s}::bigint, (SELECT d.version::bigint FROM {tombstones} d \
                 WHERE d.target = {target_param}::text AND d.id_key = {key}))",
                tombstones = self.tombstones,
                target_param = self.target_param,
                key = self.id_key("b"),
            )
        } else {
            format!("t.{s}::bigint")
        };
        let _ = write!(
            sql,
            ",\nstepped AS (\n  SELECT b.\"$seq\", {ids}, b.{s}::bigint AS \"$s\", \
             coalesce(lag(b.{s}::bigint) OVER (PARTITION BY {ids} ORDER BY b.{s}, b.\"$seq\"), \
             b.\"$stored\", 0) AS \"$prev\"\n  \
             FROM (SELECT b.*, {stored} AS \"$stored\"\n    \
             FROM (SELECT b.* FROM {source}) b LEFT JOIN {table} t ON {on}) b\n  \
             WHERE b.\"$stored\" IS NULL OR b.{s} > b.\"$stored\"\n)",
            table = self.table,
            on = matches.join(" AND "),
        );
        let key = self.id_key("st");
        if self.config.on_sequence_gap() == OnSequenceGap::Apply {
            let _ = write!(
                sql,
                ",\ngaps AS (\n  SELECT st.\"$seq\" AS \"$row\", {key} AS \"$id\", \
                 st.\"$prev\" + 1 AS \"$from\", st.\"$s\" - 1 AS \"$to\"\n  \
                 FROM stepped st WHERE st.\"$s\" > st.\"$prev\" + 1\n)",
            );
        } else {
            let st_ids = prefixed("st", &self.ids);
            let on: Vec<String> = self.ids.iter().map(|c| format!("h.{c} = st.{c}")).collect();
            let _ = write!(
                sql,
                ",\nholes AS (\n  SELECT DISTINCT ON ({st_ids}) {st_ids}, st.\"$s\" AS \"$hole\", \
                 st.\"$prev\" AS \"$end\"\n  \
                 FROM stepped st WHERE st.\"$s\" > st.\"$prev\" + 1\n  \
                 ORDER BY {st_ids}, st.\"$s\", st.\"$seq\"\n),\n\
                 gaps AS (\n  SELECT st.\"$seq\" AS \"$row\", {key} AS \"$id\", \
                 h.\"$end\" + 1 AS \"$from\", st.\"$s\" - 1 AS \"$to\"\n  \
                 FROM stepped st JOIN holes h ON {on} WHERE st.\"$s\" >= h.\"$hole\"\n)",
                on = on.join(" AND "),
            );
        }
    }

    /// `deleted`: the deletions, over an older stored version when versioned.
    fn deleted(&self, sql: &mut String) {
        let matches: Vec<String> = self.ids.iter().map(|c| format!("t.{c} = l.{c}")).collect();
        let newer = self
            .version
            .as_ref()
            .map(|v| format!(" AND t.{v} < l.{v}"))
            .unwrap_or_default();
        let _ = write!(
            sql,
            ",\ndeleted AS (\n  DELETE FROM {table} AS t USING latest l\n  \
             WHERE l.\"$del\" AND {}{newer}\n  RETURNING 1\n)",
            matches.join(" AND "),
            table = self.table,
        );
    }

    /// `marked`: the deletions remembered with their version `v`.
    fn marked(&self, sql: &mut String, v: &str) {
        let vtype = self.version_type();
        let _ = write!(
            sql,
            ",\nmarked AS (\n  INSERT INTO {tombstones} AS d (target, id_key, version)\n  \
             SELECT {target_param}::text, {key}, l.{v}::text FROM latest l WHERE l.\"$del\"\n  \
             ON CONFLICT (target, id_key) DO UPDATE SET version = EXCLUDED.version, deleted_at = now()\n  \
             WHERE d.version::{vtype} < EXCLUDED.version::{vtype}\n  RETURNING 1\n)",
            tombstones = self.tombstones,
            target_param = self.target_param,
            key = self.id_key("l"),
        );
    }

    /// `upserted`: the rows of `latest` that are no deletion, inserted or updated.
    fn upserted(&self, sql: &mut String) {
        let insert_cols: Vec<String> = self.columns.iter().map(|c| ident(c)).collect();
        let select_cols: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                if self.config.increment_columns.contains(c) {
                    format!("l.{}::{}", ident(&format!("$sum_{c}")), self.type_of(c))
                } else {
                    format!("l.{}", ident(c))
                }
            })
            .collect();
        let filters = self.upsert_filters();
        let _ = write!(
            sql,
            ",\nupserted AS (\n  INSERT INTO {table} AS t ({cols})\n  SELECT {sel} FROM latest l{filter}\n  \
             ON CONFLICT ({ids_list}) {on_conflict}\n  RETURNING 1\n)\n",
            table = self.table,
            cols = insert_cols.join(", "),
            sel = select_cols.join(", "),
            filter = if filters.is_empty() {
                String::new()
            } else {
                format!(" WHERE {}", filters.join(" AND "))
            },
            ids_list = self.ids.join(", "),
            on_conflict = self.on_conflict(),
        );
    }

    /// The rows `upserted` skips: deletions, and ids deleted at a newer or equal version.
    fn upsert_filters(&self) -> Vec<String> {
        let mut filters = Vec::new();
        if self.deletes {
            filters.push("NOT l.\"$del\"".to_string());
        }
        if let Some(v) = self.marked_version() {
            let vtype = self.version_type();
            filters.push(format!(
                "NOT EXISTS (SELECT 1 FROM {tombstones} d WHERE d.target = {target_param}::text \
                 AND d.id_key = {key} AND d.version::{vtype} >= l.{v})",
                tombstones = self.tombstones,
                target_param = self.target_param,
                key = self.id_key("l"),
            ));
        }
        filters
    }

    /// What `upserted` does with a stored row: the update, guarded by the version.
    fn on_conflict(&self) -> String {
        let updates: Vec<String> = self
            .columns
            .iter()
            .filter(|c| !self.config.id_columns.contains(c))
            .map(|c| {
                let q = ident(c);
                if self.config.increment_columns.contains(c) {
                    format!("{q} = coalesce(t.{q}, 0) + coalesce(EXCLUDED.{q}, 0)")
                } else {
                    format!("{q} = EXCLUDED.{q}")
                }
            })
            .collect();
        if updates.is_empty() {
            return "DO NOTHING".to_string();
        }
        let guard = self
            .version
            .as_ref()
            .map(|v| format!("\n  WHERE t.{v} < EXCLUDED.{v}"))
            .unwrap_or_default();
        format!("DO UPDATE SET {}{guard}", updates.join(", "))
    }

    /// The row returned: fresh messages, rows upserted, rows deleted, and the gaps.
    fn counts(&self, sql: &mut String) {
        let _ = write!(
            sql,
            "SELECT (SELECT count(*) FROM fresh), (SELECT count(*) FROM upserted), {}",
            if self.deletes {
                "(SELECT count(*) FROM deleted)"
            } else {
                "0::bigint"
            }
        );
        if self.sequence.is_some() {
            sql.push_str(
                ",\n  (SELECT coalesce(jsonb_agg(jsonb_build_array(\"$row\", \"$id\", \"$from\", \"$to\") \
                 ORDER BY \"$row\"), '[]')::text FROM gaps)",
            );
        }
    }
}

fn prefixed(alias: &str, columns: &[String]) -> String {
    columns
        .iter()
        .map(|c| format!("{alias}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::Topology;

    fn config(extra: &str) -> PostgresOutput {
        let text = format!(
            "name: t\ninputs: [{{topic: in}}]\noutputs:\n  - name: db\n    postgres:\n      url_env: U\n      table: sales.orders\n      id_columns: [id]\n      columns: {{id: id, v: v, name: name, n: n}}\n{extra}"
        );
        Topology::parse(&text, "t.yaml")
            .unwrap()
            .postgres_outputs()
            .next()
            .unwrap()
            .1
            .clone()
    }

    fn types() -> Vec<(String, String)> {
        [
            ("id", "bigint"),
            ("v", "bigint"),
            ("name", "text"),
            ("n", "integer"),
        ]
        .iter()
        .map(|(c, t)| (c.to_string(), t.to_string()))
        .collect()
    }

    #[test]
    fn versioned_upsert_with_deletes_guards_on_versions_and_tombstones() {
        let sql = apply_batch(
            &config("      version_column: v\n      delete_when: deleted\n"),
            "sales.orders",
            &types(),
            false,
        );
        for part in [
            "SELECT r.\"$seq\", r.\"$mid\" COLLATE \"C\" AS \"$mid\", r.\"$del\", r.\"id\"::bigint AS \"id\", r.\"n\"::integer AS \"n\", r.\"name\"::text AS \"name\", r.\"v\"::bigint AS \"v\"",
            "FROM unnest($1::text[], $2::boolean[], $3::text[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS r(\"$mid\", \"$del\", \"id\", \"n\", \"name\", \"v\", \"$seq\")",
            "SELECT $7::text, \"$mid\" FROM batch",
            "INSERT INTO \"onceflow_inbox\" AS i (consumer, message_id)",
            "ON CONFLICT (consumer, message_id) DO NOTHING",
            "SELECT DISTINCT ON (b.\"id\") b.*\n  FROM batch b WHERE b.\"$mid\" IN (SELECT message_id FROM fresh)",
            "ORDER BY b.\"id\", b.\"v\" DESC NULLS LAST, b.\"$seq\" DESC",
            "DELETE FROM \"sales\".\"orders\" AS t USING latest l",
            "WHERE l.\"$del\" AND t.\"id\" = l.\"id\" AND t.\"v\" < l.\"v\"",
            "INSERT INTO \"onceflow_tombstones\" AS d (target, id_key, version)",
            "WHERE d.version::bigint < EXCLUDED.version::bigint",
            "SELECT $8::text, jsonb_build_array(l.\"id\")::text, l.\"v\"::text FROM latest l WHERE l.\"$del\"",
            "WHERE NOT l.\"$del\" AND NOT EXISTS (SELECT 1 FROM \"onceflow_tombstones\" d WHERE d.target = $8::text AND d.id_key = jsonb_build_array(l.\"id\")::text AND d.version::bigint >= l.\"v\")",
            "ON CONFLICT (\"id\") DO UPDATE SET \"n\" = EXCLUDED.\"n\", \"name\" = EXCLUDED.\"name\", \"v\" = EXCLUDED.\"v\"",
            "WHERE t.\"v\" < EXCLUDED.\"v\"",
            "(SELECT count(*) FROM deleted)",
        ] {
            assert!(sql.contains(part), "missing {part}\nin\n{sql}");
        }
    }

    #[test]
    fn unversioned_upsert_keeps_the_last_row_of_the_batch_and_never_guards() {
        let sql = apply_batch(&config(""), "sales.orders", &types(), false);
        assert!(sql.contains("ORDER BY b.\"id\", b.\"$seq\" DESC"), "{sql}");
        assert!(!sql.contains("EXCLUDED.\"v\"\n  WHERE"), "{sql}");
        assert!(!sql.contains("DELETE"), "{sql}");
        assert!(!sql.contains("onceflow_tombstones"), "{sql}");
        assert!(sql.contains("0::bigint"), "{sql}");
    }

    #[test]
    fn counters_are_summed_in_the_batch_and_added_to_the_stored_value() {
        let sql = apply_batch(
            &config("      increment_columns: [n]\n"),
            "sales.orders",
            &types(),
            false,
        );
        assert!(
            sql.contains("sum(b.\"n\") OVER (PARTITION BY b.\"id\") AS \"$sum_n\""),
            "{sql}"
        );
        assert!(sql.contains("l.\"$sum_n\"::integer"), "{sql}");
        assert!(
            sql.contains(
                "SELECT DISTINCT ON (b.\"$mid\", b.\"id\") b.*\n  FROM batch b WHERE b.\"$mid\" IN (SELECT message_id FROM fresh)"
            ),
            "each message counts once per id: {sql}"
        );
        assert!(sql.contains("FROM once b"), "{sql}");
        assert!(
            sql.contains("\"n\" = coalesce(t.\"n\", 0) + coalesce(EXCLUDED.\"n\", 0)"),
            "{sql}"
        );
    }

    #[test]
    fn deletes_without_versions_leave_no_markers() {
        let sql = apply_batch(
            &config("      delete_when: gone\n"),
            "sales.orders",
            &types(),
            false,
        );
        assert!(
            sql.contains("WHERE l.\"$del\" AND t.\"id\" = l.\"id\"\n"),
            "{sql}"
        );
        assert!(!sql.contains("onceflow_tombstones"), "{sql}");
    }

    #[test]
    fn a_table_of_ids_only_does_nothing_on_conflict() {
        let mut c = config("");
        c.columns.retain(|k, _| k == "id");
        let sql = apply_batch(&c, "t", &types(), false);
        assert!(sql.contains("ON CONFLICT (\"id\") DO NOTHING"), "{sql}");
    }

    #[test]
    fn the_optimistic_form_takes_every_row_as_fresh_and_fails_on_a_known_message() {
        let c = config("      version_column: v\n");
        let sql = apply_batch(&c, "sales.orders", &types(), true);
        assert!(!sql.contains("ON CONFLICT (consumer, message_id)"), "{sql}");
        assert!(!sql.contains("IN (SELECT message_id FROM fresh)"), "{sql}");
        assert!(
            sql.contains("SELECT DISTINCT ON (b.\"id\") b.*\n  FROM batch b\n"),
            "{sql}"
        );
        // Everything else is the careful form's.
        let careful = apply_batch(&c, "sales.orders", &types(), false);
        let tail = |s: &str| s[s.find("upserted AS").unwrap()..].to_string();
        assert_eq!(tail(&sql), tail(&careful));
    }

    #[test]
    fn sequences_order_as_versions_and_gaps_are_found_against_the_stored_row() {
        let sql = apply_batch(
            &config("      sequence_column: v\n"),
            "sales.orders",
            &types(),
            false,
        );
        for part in [
            "ORDER BY b.\"id\", b.\"v\" DESC NULLS LAST, b.\"$seq\" DESC",
            "WHERE t.\"v\" < EXCLUDED.\"v\"",
            "coalesce(lag(b.\"v\"::bigint) OVER (PARTITION BY b.\"id\" ORDER BY b.\"v\", b.\"$seq\"), b.\"$stored\", 0) AS \"$prev\"",
            "FROM (SELECT b.*, t.\"v\"::bigint AS \"$stored\"\n    FROM (SELECT b.* FROM batch b WHERE b.\"$mid\" IN (SELECT message_id FROM fresh)) b LEFT JOIN \"sales\".\"orders\" t ON t.\"id\" = b.\"id\") b",
            "WHERE b.\"$stored\" IS NULL OR b.\"v\" > b.\"$stored\"",
            "SELECT st.\"$seq\" AS \"$row\", jsonb_build_array(st.\"id\")::text AS \"$id\", st.\"$prev\" + 1 AS \"$from\", st.\"$s\" - 1 AS \"$to\"\n  FROM stepped st WHERE st.\"$s\" > st.\"$prev\" + 1",
            "jsonb_agg(jsonb_build_array(\"$row\", \"$id\", \"$from\", \"$to\") ORDER BY \"$row\"), '[]')::text FROM gaps)",
        ] {
            assert!(sql.contains(part), "missing {part}\nin\n{sql}");
        }
        assert!(!sql.contains("holes AS"), "{sql}");
        assert!(!sql.contains("onceflow_tombstones"), "{sql}");
        let plain = apply_batch(&config(""), "sales.orders", &types(), false);
        assert!(!plain.contains("stepped"), "{plain}");
    }

    #[test]
    fn refused_gaps_run_from_the_first_hole_and_deleted_ids_keep_their_sequence() {
        let sql = apply_batch(
            &config(
                "      sequence_column: v\n      on_sequence_gap: dead_letter\n      delete_when: gone\n",
            ),
            "sales.orders",
            &types(),
            false,
        );
        for part in [
            "coalesce(t.\"v\"::bigint, (SELECT d.version::bigint FROM \"onceflow_tombstones\" d WHERE d.target = $8::text AND d.id_key = jsonb_build_array(b.\"id\")::text)) AS \"$stored\"",
            "holes AS (\n  SELECT DISTINCT ON (st.\"id\") st.\"id\", st.\"$s\" AS \"$hole\", st.\"$prev\" AS \"$end\"\n  FROM stepped st WHERE st.\"$s\" > st.\"$prev\" + 1\n  ORDER BY st.\"id\", st.\"$s\", st.\"$seq\"",
            "h.\"$end\" + 1 AS \"$from\", st.\"$s\" - 1 AS \"$to\"\n  FROM stepped st JOIN holes h ON h.\"id\" = st.\"id\" WHERE st.\"$s\" >= h.\"$hole\"",
            "WHERE l.\"$del\" AND t.\"id\" = l.\"id\" AND t.\"v\" < l.\"v\"",
        ] {
            assert!(sql.contains(part), "missing {part}\nin\n{sql}");
        }
    }

    #[test]
    fn fresh_messages_record_their_origin_beside_the_inbox() {
        let sql = apply_batch(&config(""), "sales.orders", &types(), false);
        for part in [
            "linked AS (\n  INSERT INTO \"onceflow_inbox_origins\" (consumer, message_id, origin_topic, origin_partition, origin_offset)",
            "SELECT DISTINCT ON (b.\"$mid\") $7::text, b.\"$mid\", u.t, u.p, u.o",
            "FROM (SELECT b.* FROM batch b WHERE b.\"$mid\" IN (SELECT message_id FROM fresh)) b",
            "JOIN unnest($8::text[], $9::int[], $10::bigint[]) WITH ORDINALITY AS u(t, p, o, n) ON u.n = b.\"$seq\"",
        ] {
            assert!(sql.contains(part), "missing {part}\nin\n{sql}");
        }
        // With deletion markers the target's name takes $8, and the origins come after it.
        let marked = config("      version_column: v\n      delete_when: deleted\n");
        assert_eq!(origin_params(&marked), 9);
        let sql = apply_batch(&marked, "sales.orders", &types(), true);
        assert!(
            sql.contains("unnest($9::text[], $10::int[], $11::bigint[])"),
            "{sql}"
        );
        assert!(sql.contains("FROM (SELECT b.* FROM batch b) b"), "{sql}");
        assert!(!sql.contains("ON CONFLICT DO NOTHING"), "{sql}");
        let careful = apply_batch(&marked, "sales.orders", &types(), false);
        assert!(
            careful.contains("ORDER BY b.\"$mid\", b.\"$seq\"\n  ON CONFLICT DO NOTHING\n)"),
            "{careful}"
        );
    }
}
