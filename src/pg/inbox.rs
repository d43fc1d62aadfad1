//! Reading an inbox: which messages one consumer's inbox holds, and the origin recorded beside
//! each. The HTTP sink's deduplication asks which keys of a batch were delivered before;
//! `onceflow reconcile` asks which messages arrived, and where each came from.

use std::collections::HashSet;

use futures_util::{StreamExt, pin_mut};
use tokio_postgres::Client;

use super::error::PgError;
use super::tables::{origins_table, qualified};

/// The rows of one consumer (`<topology>/<output>`) in an inbox, and their origins.
#[derive(Debug, Clone)]
pub(crate) struct InboxReader {
    consumer: String,
    /// Which of the message ids `$2` the inbox holds.
    known_sql: String,
    /// The origin of every message.
    origins_sql: String,
}

impl InboxReader {
    /// Reads the rows of `consumer` in `inbox` (the table as configured: schema-qualified or
    /// not, unquoted) and in its origins table.
    pub(crate) fn new(inbox: &str, consumer: &str) -> InboxReader {
        InboxReader {
            consumer: consumer.to_string(),
            known_sql: format!(
                "SELECT message_id FROM {} WHERE consumer = $1::text AND message_id = ANY($2::text[])",
                qualified(inbox)
            ),
            origins_sql: format!(
                "SELECT origin_topic, origin_partition, origin_offset FROM {} WHERE consumer = $1",
                qualified(&origins_table(inbox))
            ),
        }
    }

    /// Which of `mids` the inbox holds, asked in one query.
    pub(crate) async fn known(
        &self,
        client: &Client,
        mids: &[&str],
    ) -> Result<HashSet<String>, PgError> {
        let rows = client
            .query(self.known_sql.as_str(), &[&self.consumer, &mids])
            .await?;
        rows.iter()
            .map(|row| Ok(row.try_get::<_, String>(0)?))
            .collect()
    }

    /// Calls `each` with the origin of every message that has one recorded (topic, partition,
    /// offset), row by row as they arrive; returns how many there were.
    pub(crate) async fn origins(
        &self,
        client: &Client,
        mut each: impl FnMut(&str, i32, i64),
    ) -> Result<u64, PgError> {
        let rows = client
            .query_raw(self.origins_sql.as_str(), [&self.consumer])
            .await?;
        pin_mut!(rows);
        let mut n = 0u64;
        while let Some(row) = rows.next().await {
            let row = row?;
            n += 1;
            let topic: &str = row.try_get(0)?;
            let partition: i32 = row.try_get(1)?;
            let offset: i64 = row.try_get(2)?;
            each(topic, partition, offset);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_asks_the_inbox_and_its_origins_table_by_consumer() {
        let reader = InboxReader::new("ops.inbox", "t/db");
        assert_eq!(
            reader.known_sql,
            "SELECT message_id FROM \"ops\".\"inbox\" WHERE consumer = $1::text AND message_id = ANY($2::text[])"
        );
        assert_eq!(
            reader.origins_sql,
            "SELECT origin_topic, origin_partition, origin_offset FROM \"ops\".\"inbox_origins\" WHERE consumer = $1"
        );
    }
}
