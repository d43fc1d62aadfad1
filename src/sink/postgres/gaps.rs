//! Sequence gaps: the rows of a batch whose sequence does not follow the one before it (the
//! stored one, or the previous one of the id in the batch), as the batch statement reports
//! them ([`super::sql::apply_batch`]). Pure: unit-tested without a database.

use serde_json::Value;

/// A row that follows missing sequences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The row's position in the batch (0-based).
    pub row: usize,
    /// The row's id values, as a JSON array (`[42]`, `["eu", 7]`).
    pub id: String,
    /// The first and last missing sequences.
    pub from: i64,
    pub to: i64,
}

impl Gap {
    /// How many sequences are missing.
    pub fn missing(&self) -> u64 {
        u64::try_from(self.to - self.from + 1).unwrap_or(0)
    }

    /// The row's own sequence.
    pub fn sequence(&self) -> i64 {
        self.to + 1
    }

    /// The missing range, `5` or `5..7`.
    pub fn range(&self) -> String {
        if self.from == self.to {
            self.from.to_string()
        } else {
            format!("{}..{}", self.from, self.to)
        }
    }
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "sequence gap: id {} has sequence {} after {} (missing {})",
            self.id,
            self.sequence(),
            self.from - 1,
            self.range()
        )
    }
}

/// Reads the statement's JSON array of `[row, id key, first missing, last missing]`, rows
/// 1-based. Entries of another shape are skipped.
pub fn parse(text: &str) -> Vec<Gap> {
    let Ok(Value::Array(items)) = serde_json::from_str::<Value>(text) else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(|item| {
            let [row, id, from, to] = item.as_array()?.as_slice() else {
                return None;
            };
            Some(Gap {
                row: usize::try_from(row.as_u64()?.checked_sub(1)?).ok()?,
                id: id.as_str()?.to_string(),
                from: from.as_i64()?,
                to: to.as_i64()?,
            })
        })
        .collect()
}

/// Missing sequences over all gaps.
pub fn missing(gaps: &[Gap]) -> u64 {
    gaps.iter().map(Gap::missing).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_statements_gaps_are_read_with_rows_from_zero() {
        let gaps =
            parse(r#"[[1, "[5]", 2, 2], [4, "[\"eu\", 7]", 1, 3], ["x"], [0, "[1]", 1, 1]]"#);
        assert_eq!(
            gaps,
            vec![
                Gap {
                    row: 0,
                    id: "[5]".into(),
                    from: 2,
                    to: 2
                },
                Gap {
                    row: 3,
                    id: "[\"eu\", 7]".into(),
                    from: 1,
                    to: 3
                },
            ]
        );
        assert_eq!(missing(&gaps), 4);
        assert_eq!(gaps[1].range(), "1..3");
        assert_eq!(
            gaps[0].to_string(),
            "sequence gap: id [5] has sequence 3 after 1 (missing 2)"
        );
        assert!(parse("[]").is_empty());
        assert!(parse("not json").is_empty());
    }
}
