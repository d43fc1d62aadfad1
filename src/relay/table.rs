//! The outbox table as a relay sees it: its columns as the catalogue describes them, checked
//! against the input's configuration ([`Layout::check`]), and the SQL statements a relay runs
//! against it (claim, delete, count, the age of the oldest row, the shards' advisory locks).
//! Pure: the connection ([`super::conn`]) runs them.

use crate::topology::OutboxInput;
use crate::topology::outbox::OutboxColumns;

/// How the payload column is read, by its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PayloadType {
    /// `bytea`: the bytes as they are.
    Bytes,
    /// `jsonb`, `json`, `text` or another type PostgreSQL can cast to text: its text.
    Text,
}

/// The outbox table as the relay found it at start.
#[derive(Debug, Clone)]
pub(super) struct Layout {
    table: String,
    columns: OutboxColumns,
    /// The id column's type as PostgreSQL names it (`bigint`, `uuid`), to cast ids given as
    /// text back to it (so the primary key's index serves the deletes).
    id_type: String,
    /// The column rows are published in the order of.
    order_by: String,
    payload: PayloadType,
    pub(super) shards: u32,
}

/// A column of the outbox table, as the catalogue describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Column {
    pub(super) name: String,
    /// `format_type` of the column: `bigint`, `uuid`, `jsonb`, `timestamp with time zone`...
    pub(super) type_name: String,
}

/// The columns of `table` (schema-qualified or on the search path), in order.
pub(super) const COLUMNS_SQL: &str = "SELECT a.attname::text, format_type(a.atttypid, a.atttypmod) \
     FROM pg_attribute a WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped \
     ORDER BY a.attnum";

/// What is wrong with an outbox table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("outbox table {0} does not exist")]
    NoTable(String),
    #[error("outbox table {table} has no column `{column}` (columns.{field}); it has: {has}")]
    NoColumn {
        table: String,
        column: String,
        field: &'static str,
        has: String,
    },
    #[error(
        "outbox table {table}: columns.{field} `{column}` is {type_name}, it must be {expected}"
    )]
    WrongType {
        table: String,
        column: String,
        field: &'static str,
        type_name: String,
        expected: &'static str,
    },
}

impl Layout {
    /// Checks the table's columns against the input's configuration.
    pub(super) fn check(config: &OutboxInput, columns: &[Column]) -> Result<Layout, LayoutError> {
        if columns.is_empty() {
            return Err(LayoutError::NoTable(config.table.clone()));
        }
        let c = &config.columns;
        let find = |field: &'static str, name: &str| {
            columns
                .iter()
                .find(|col| col.name == name)
                .ok_or_else(|| LayoutError::NoColumn {
                    table: config.table.clone(),
                    column: name.to_string(),
                    field,
                    has: columns
                        .iter()
                        .map(|c| c.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })
        };
        let id = find("id", &c.id)?;
        find("aggregatetype", &c.aggregatetype)?;
        find("aggregateid", &c.aggregateid)?;
        find("type", &c.r#type)?;
        let payload = find("payload", &c.payload)?;
        if let Some(h) = &c.headers {
            let headers = find("headers", h)?;
            if !matches!(headers.type_name.as_str(), "jsonb" | "json") {
                return Err(LayoutError::WrongType {
                    table: config.table.clone(),
                    column: h.clone(),
                    field: "headers",
                    type_name: headers.type_name.clone(),
                    expected: "jsonb or json (an object of header names to strings)",
                });
            }
        }
        if let Some(t) = &c.created_at {
            let created = find("created_at", t)?;
            if !created.type_name.starts_with("timestamp") {
                return Err(LayoutError::WrongType {
                    table: config.table.clone(),
                    column: t.clone(),
                    field: "created_at",
                    type_name: created.type_name.clone(),
                    expected: "a timestamp",
                });
            }
        }
        let integer = |c: &Column| {
            matches!(
                c.type_name.as_str(),
                "bigint" | "integer" | "smallint" | "numeric"
            )
        };
        let order_by = match &c.order {
            Some(o) => {
                let order = find("order", o)?;
                if !integer(order) {
                    return Err(LayoutError::WrongType {
                        table: config.table.clone(),
                        column: o.clone(),
                        field: "order",
                        type_name: order.type_name.clone(),
                        expected: "an integer in insert order (bigserial)",
                    });
                }
                o.clone()
            }
            // The ids give the order of publication: a uuid or text id has none.
            None if !integer(id) => {
                return Err(LayoutError::WrongType {
                    table: config.table.clone(),
                    column: c.id.clone(),
                    field: "id",
                    type_name: id.type_name.clone(),
                    expected: "an integer (bigserial), or name columns.order, an integer column in insert order",
                });
            }
            None => c.id.clone(),
        };
        Ok(Layout {
            table: config.table.clone(),
            columns: c.clone(),
            id_type: id.type_name.clone(),
            order_by,
            payload: if payload.type_name == "bytea" {
                PayloadType::Bytes
            } else {
                PayloadType::Text
            },
            shards: config.shards,
        })
    }

    /// The shard of the rows a statement is about, as SQL over the aggregate id: `$1` is the
    /// shard count and `$2` the shard. With one shard, every row.
    fn shard_predicate(&self) -> String {
        if self.shards <= 1 {
            return "($1::int4 = $1 AND $2::int4 = $2)".into();
        }
        format!(
            "(hashtext({}::text) & 2147483647) % $1::int4 = $2::int4",
            self.columns.aggregateid
        )
    }

    /// Claims the next rows of a shard (`$1` shards, `$2` shard, `$3` how many), oldest
    /// first, locking them for the claiming transaction: id, aggregate type, aggregate id,
    /// type, payload, headers (text or NULL), insert time in ms (or NULL).
    pub(super) fn claim_sql(&self) -> String {
        let c = &self.columns;
        let payload = match self.payload {
            PayloadType::Bytes => c.payload.clone(),
            PayloadType::Text => format!("convert_to({}::text, 'UTF8')", c.payload),
        };
        let headers = c
            .headers
            .as_ref()
            .map_or("NULL::text".to_string(), |h| format!("{h}::text"));
        let created = c.created_at.as_ref().map_or("NULL::int8".to_string(), |t| {
            format!("(extract(epoch from {t}) * 1000)::int8")
        });
        format!(
            // The output columns are aliased: `ORDER BY id` would otherwise sort by the output
            // column `id::text`, and "10" comes before "9".
            "SELECT {id}::text AS o_id, {at}::text AS o_at, {ai}::text AS o_ai, {ty}::text AS o_ty, \
             {payload} AS o_payload, {headers} AS o_headers, {created} AS o_created \
             FROM {table} WHERE {shard} ORDER BY {order} LIMIT $3::int8 FOR UPDATE SKIP LOCKED",
            id = c.id,
            at = c.aggregatetype,
            ai = c.aggregateid,
            ty = c.r#type,
            table = self.table,
            order = self.order_by,
            shard = self.shard_predicate(),
        )
    }

    /// Deletes rows by id (`$1`, ids as text).
    pub(super) fn delete_sql(&self) -> String {
        format!(
            "DELETE FROM {} WHERE {} = ANY($1::text[]::{}[])",
            self.table, self.columns.id, self.id_type
        )
    }

    /// Rows waiting (a scan of the table: run it seldom while a backlog is large).
    pub(super) fn count_sql(&self) -> String {
        format!("SELECT count(*)::int8 FROM {}", self.table)
    }

    /// The age in ms of the next row to publish, by the order index (no row: none), when the
    /// table has `created_at`.
    pub(super) fn oldest_sql(&self) -> Option<String> {
        self.columns.created_at.as_ref().map(|t| {
            format!(
                "SELECT (extract(epoch from (now() - {t})) * 1000)::int8 FROM {} ORDER BY {} LIMIT 1",
                self.table, self.order_by
            )
        })
    }

    /// The advisory lock of a shard: a pair of keys, the table's and the shard's.
    pub(super) fn lock_keys(&self, shard: u32) -> (i32, i32) {
        (table_key(&self.table), shard as i32)
    }
}

/// The first key of a table's shard locks: a stable hash of its name (FNV-1a), so that every
/// relay of the table computes the same one.
fn table_key(table: &str) -> i32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in table.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(yaml: &str) -> OutboxInput {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn cols(list: &[(&str, &str)]) -> Vec<Column> {
        list.iter()
            .map(|(n, t)| Column {
                name: n.to_string(),
                type_name: t.to_string(),
            })
            .collect()
    }

    fn debezium() -> Vec<Column> {
        cols(&[
            ("id", "bigint"),
            ("aggregatetype", "text"),
            ("aggregateid", "text"),
            ("type", "text"),
            ("payload", "jsonb"),
        ])
    }

    #[test]
    fn a_debezium_table_makes_its_statements() {
        let layout =
            Layout::check(&config("url_env: PG\ntable: orders_outbox\n"), &debezium()).unwrap();
        assert_eq!(layout.payload, PayloadType::Text);
        assert_eq!(
            layout.claim_sql(),
            "SELECT id::text AS o_id, aggregatetype::text AS o_at, aggregateid::text AS o_ai, type::text AS o_ty, convert_to(payload::text, 'UTF8') AS o_payload, NULL::text AS o_headers, NULL::int8 AS o_created FROM orders_outbox WHERE ($1::int4 = $1 AND $2::int4 = $2) ORDER BY id LIMIT $3::int8 FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            layout.delete_sql(),
            "DELETE FROM orders_outbox WHERE id = ANY($1::text[]::bigint[])"
        );
    }

    #[test]
    fn the_oldest_row_is_found_by_the_order_index_and_only_with_an_insert_time() {
        let layout = Layout::check(&config("url_env: PG\n"), &debezium()).unwrap();
        assert_eq!(layout.oldest_sql(), None);
        let mut cols = debezium();
        cols.push(Column {
            name: "created_at".into(),
            type_name: "timestamp with time zone".into(),
        });
        let layout = Layout::check(
            &config("url_env: PG\ncolumns: {created_at: created_at}\n"),
            &cols,
        )
        .unwrap();
        assert_eq!(
            layout.oldest_sql().as_deref(),
            Some(
                "SELECT (extract(epoch from (now() - created_at)) * 1000)::int8 FROM outbox ORDER BY id LIMIT 1"
            )
        );
        assert_eq!(layout.count_sql(), "SELECT count(*)::int8 FROM outbox");
    }

    #[test]
    fn shards_split_by_a_hash_of_the_aggregate_id() {
        let layout = Layout::check(&config("url_env: PG\nshards: 4\n"), &debezium()).unwrap();
        assert!(layout.claim_sql().contains(
            "WHERE (hashtext(aggregateid::text) & 2147483647) % $1::int4 = $2::int4 ORDER BY id"
        ));
        assert_eq!(layout.lock_keys(3).1, 3);
        assert_eq!(layout.lock_keys(3).0, layout.lock_keys(0).0);
    }

    #[test]
    fn a_missing_column_or_an_unordered_id_is_named() {
        let c = config("url_env: PG\ncolumns: {payload: body}\n");
        let e = Layout::check(&c, &debezium()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "outbox table outbox has no column `body` (columns.payload); it has: id, aggregatetype, aggregateid, type, payload"
        );
        let mut uuid = debezium();
        uuid[0].type_name = "uuid".into();
        let e = Layout::check(&config("url_env: PG\n"), &uuid).unwrap_err();
        assert!(
            e.to_string()
                .contains("columns.id `id` is uuid, it must be an integer"),
            "{e}"
        );
        uuid.push(Column {
            name: "seq".into(),
            type_name: "bigint".into(),
        });
        let layout = Layout::check(&config("url_env: PG\ncolumns: {order: seq}\n"), &uuid).unwrap();
        assert!(layout.claim_sql().contains("ORDER BY seq LIMIT"));
        assert!(layout.delete_sql().ends_with("ANY($1::text[]::uuid[])"));
        assert_eq!(
            Layout::check(&config("url_env: PG\n"), &[]).unwrap_err(),
            LayoutError::NoTable("outbox".into())
        );
    }

    #[test]
    fn a_bytea_payload_is_claimed_as_it_is_with_the_headers_and_insert_time_columns_named() {
        let mut cols = debezium();
        cols[4].type_name = "bytea".into();
        cols.push(Column {
            name: "meta".into(),
            type_name: "jsonb".into(),
        });
        cols.push(Column {
            name: "at".into(),
            type_name: "timestamp without time zone".into(),
        });
        let c =
            config("url_env: PG\ntable: app.outbox\ncolumns: {headers: meta, created_at: at}\n");
        let layout = Layout::check(&c, &cols).unwrap();
        assert_eq!(layout.payload, PayloadType::Bytes);
        assert_eq!(
            layout.claim_sql(),
            "SELECT id::text AS o_id, aggregatetype::text AS o_at, aggregateid::text AS o_ai, type::text AS o_ty, payload AS o_payload, meta::text AS o_headers, (extract(epoch from at) * 1000)::int8 AS o_created FROM app.outbox WHERE ($1::int4 = $1 AND $2::int4 = $2) ORDER BY id LIMIT $3::int8 FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            layout.oldest_sql().as_deref(),
            Some(
                "SELECT (extract(epoch from (now() - at)) * 1000)::int8 FROM app.outbox ORDER BY id LIMIT 1"
            )
        );
    }

    #[test]
    fn headers_insert_time_and_order_columns_of_another_type_are_refused() {
        let mut cols = debezium();
        cols.push(Column {
            name: "meta".into(),
            type_name: "text".into(),
        });
        let e = Layout::check(&config("url_env: PG\ncolumns: {headers: meta}\n"), &cols);
        assert!(
            matches!(&e, Err(LayoutError::WrongType { field: "headers", type_name, .. }) if type_name == "text"),
            "{e:?}"
        );
        let e = Layout::check(&config("url_env: PG\ncolumns: {created_at: meta}\n"), &cols);
        assert!(
            matches!(
                &e,
                Err(LayoutError::WrongType {
                    field: "created_at",
                    ..
                })
            ),
            "{e:?}"
        );
        let e = Layout::check(&config("url_env: PG\ncolumns: {order: meta}\n"), &cols);
        assert_eq!(
            e.unwrap_err().to_string(),
            "outbox table outbox: columns.order `meta` is text, it must be an integer in insert order (bigserial)"
        );
        cols[5].type_name = "json".into();
        assert!(Layout::check(&config("url_env: PG\ncolumns: {headers: meta}\n"), &cols).is_ok());
        let mut numeric = debezium();
        numeric[0].type_name = "numeric".into();
        let layout = Layout::check(&config("url_env: PG\n"), &numeric).unwrap();
        assert!(layout.delete_sql().ends_with("ANY($1::text[]::numeric[])"));
    }

    #[test]
    fn the_lock_key_of_a_table_is_the_fnv1a_hash_of_its_name() {
        // Every relay of a table, of any version, must take the same locks.
        assert_eq!(table_key(""), 0x811c_9dc5_u32 as i32);
        assert_eq!(table_key("a"), 0xe40c_292c_u32 as i32);
        let c = config("url_env: PG\ntable: orders_outbox\nshards: 8\n");
        let layout = Layout::check(&c, &debezium()).unwrap();
        assert_eq!(layout.lock_keys(5), (table_key("orders_outbox"), 5));
        assert_ne!(table_key("orders_outbox"), table_key("payments_outbox"));
    }
}
