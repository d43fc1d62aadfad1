//! `join`: a record looks a key up in a table, a compacted topic held in a store
//! ([`crate::state`]), and goes on with the row in a field of its value. The table is kept by
//! the state layer; this step only reads it. What a miss does ([`on_miss`]) is a pure
//! decision.

use serde_json::Value as Json;

use super::expr::Expression;
use super::{FieldPath, Work, eval_bytes, json_mut};
use crate::record::{ErrorKind, RecordError};
use crate::state::{GLOBAL, KeyedState};
use crate::topology::OnMiss;

/// A compiled `join` step.
pub(super) struct Join {
    /// Its store's index (the order of stateful steps in the pipeline).
    pub store: usize,
    /// The table's topic, for messages.
    pub table: String,
    /// Whether every instance holds the whole table (looked up across its partitions).
    pub global: bool,
    /// The key to look up; `None`: the record key.
    pub key: Option<Expression>,
    pub into: FieldPath,
    pub on_miss: OnMiss,
}

/// What a miss does to the record: `Some(true)` goes on with `null`, `Some(false)` is
/// dropped, `None` fails (to the dead-letter topic).
pub fn on_miss(policy: OnMiss) -> Option<bool> {
    match policy {
        OnMiss::Keep => Some(true),
        OnMiss::Drop => Some(false),
        OnMiss::DeadLetter => None,
    }
}

impl Join {
    /// Puts the row of `work`'s key in its field; whether the record goes on.
    pub fn apply(
        &self,
        work: &mut Work<'_>,
        state: &mut dyn KeyedState,
        fail: &impl Fn(ErrorKind, String) -> RecordError,
    ) -> Result<bool, RecordError> {
        let key = match &self.key {
            Some(e) => eval_bytes(e, work, fail)?,
            None => work.key.clone(),
        };
        let partition = if self.global {
            GLOBAL
        } else {
            work.origin.partition
        };
        let row = match &key {
            None => None,
            Some(key) => state.get(self.store, partition, key).map_err(|e| {
                fail(
                    ErrorKind::Unavailable,
                    format!("table {} cannot be read: {e}", self.table),
                )
            })?,
        };
        let row: Json = match row {
            Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
                fail(
                    ErrorKind::BadJson,
                    format!(
                        "the row of key {} in table {} is not JSON: {e}",
                        shown(key.as_deref()),
                        self.table
                    ),
                )
            })?,
            None => {
                state.missed(self.store);
                match on_miss(self.on_miss) {
                    Some(true) => Json::Null,
                    Some(false) => return Ok(false),
                    None => {
                        return Err(fail(
                            ErrorKind::NoMatch,
                            format!(
                                "table {} has no row of key {}",
                                self.table,
                                shown(key.as_deref())
                            ),
                        ));
                    }
                }
            }
        };
        json_mut(work, fail)?
            .set(&self.into, row)
            .map_err(|m| fail(ErrorKind::WrongType, m))?;
        Ok(true)
    }
}

/// A key for a message: its UTF-8 text quoted, or "(none)".
fn shown(key: Option<&[u8]>) -> String {
    match key {
        Some(k) => format!("{:?}", String::from_utf8_lossy(k)),
        None => "(none)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_keeps_drops_or_fails_the_record_as_configured() {
        assert_eq!(on_miss(OnMiss::Keep), Some(true));
        assert_eq!(on_miss(OnMiss::Drop), Some(false));
        assert_eq!(on_miss(OnMiss::DeadLetter), None);
    }
}
