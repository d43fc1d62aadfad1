//! The pipelines' commit summaries, read back once they stopped: onceflow's `--summary-json`
//! and the Kafka Streams peer's last summary line.

use onceflow::histogram::Histogram;
use onceflow::txn::CommitSteps;

/// Reads a commit summary: onceflow's `--summary-json` (`committed` and `commit_us` as
/// `[[µs, count], ...]`) or the Kafka Streams peer's line (`commits` and `commit_us` as a
/// list of durations).
pub(crate) fn parse_commits(text: &str) -> Option<(u64, Histogram)> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let mut h = Histogram::default();
    for item in v.get("commit_us")?.as_array()? {
        match item {
            serde_json::Value::Array(pair) => {
                h.record_us(pair.first()?.as_u64()?, pair.get(1)?.as_u64()?)
            }
            other => h.record_us(other.as_u64()?, 1),
        }
    }
    let n = v.get("committed").or_else(|| v.get("commits"))?.as_u64()?;
    Some((n, h))
}

/// Reads onceflow's commits step by step from its `--summary-json` (`commit_steps_us`, each
/// step as `[[µs, count], ...]`); `None` for a summary without them (Kafka Streams').
pub(crate) fn parse_commit_steps(text: &str) -> Option<CommitSteps> {
    let v: serde_json::Value = serde_json::from_str(text.trim()).ok()?;
    let steps = v.get("commit_steps_us")?;
    let step = |name: &str| -> Option<Histogram> {
        let mut h = Histogram::default();
        for pair in steps.get(name)?.as_array()? {
            let pair = pair.as_array()?;
            h.record_us(pair.first()?.as_u64()?, pair.get(1)?.as_u64()?);
        }
        Some(h)
    };
    Some(CommitSteps {
        deliveries: step("deliveries")?,
        offsets: step("offsets")?,
        end: step("end")?,
    })
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_summary_forms_parse() {
        let (n, h) =
            parse_commits(r#"{"committed": 3, "commit_us": [[1000, 2], [20000, 1]]}"#).unwrap();
        assert_eq!((n, h.count()), (3, 3));
        let (n, h) = parse_commits(r#"{"commits":2,"commit_us":[5000,7000]}"#).unwrap();
        assert_eq!((n, h.count(), h.max_us()), (2, 2, 7000));
        assert!(parse_commits("not json").is_none());
    }

    #[test]
    fn commit_steps_parse_from_onceflow_s_summary_only() {
        let summary = r#"{"committed": 2, "commit_us": [[9000, 2]], "commit_steps_us": {"deliveries": [[4000, 2]], "offsets": [[3000, 1], [3500, 1]], "end": [[2000, 2]]}}"#;
        let steps = parse_commit_steps(summary).unwrap();
        assert_eq!(steps.deliveries.percentile(0.5), Some(4000));
        assert_eq!((steps.offsets.count(), steps.offsets.max_us()), (2, 3500));
        assert_eq!(steps.end.count(), 2);
        assert!(parse_commit_steps(r#"{"commits":2,"commit_us":[5000,7000]}"#).is_none());
    }
}
