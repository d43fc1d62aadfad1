//! Every test failpoint, read from the environment in this one place.
//!
//! Failpoints exist for the integration tests: they make the job abort transactions, fail
//! transiently or crash at chosen moments, so that recovery can be checked on a real broker.
//! Nothing sets them in production; an unset or unparsable variable turns its failpoint off.

/// The failure [`TRANSIENT_FAILURES`] injects.
pub fn injected_failure() -> crate::record::RecordError {
    crate::record::RecordError {
        kind: crate::record::ErrorKind::Unavailable,
        stage: crate::record::Stage::Decode,
        message: "injected transient failure".into(),
    }
}

/// Abort every n-th transaction instead of committing it.
pub const ABORT_EVERY: &str = "ONCEFLOW_FAILPOINT_ABORT_EVERY";
/// The pipeline fails transiently this many times (in all) first.
pub const TRANSIENT_FAILURES: &str = "ONCEFLOW_FAILPOINT_TRANSIENT_FAILURES";
/// The n-th Kafka commit (and every n-th after it) is answered by an error though the
/// transaction committed: the answer lost on the way, as when the coordinator's broker
/// dies after it wrote the commit.
pub const LOSE_COMMIT_EVERY: &str = "ONCEFLOW_FAILPOINT_LOSE_COMMIT_EVERY";
/// The n-th call of `send_offsets_to_transaction` in the process does not return for an
/// hour: a call whose answer never reaches the client.
pub const HANG_SEND_OFFSETS: &str = "ONCEFLOW_FAILPOINT_HANG_SEND_OFFSETS";
/// The process aborts right after the n-th database commit of its sinks, before the Kafka
/// transaction commits.
pub const EXIT_AFTER_DB_COMMIT: &str = "ONCEFLOW_FAILPOINT_EXIT_AFTER_DB_COMMIT";

/// An outbox relay aborts the process right after its n-th Kafka commit, before the
/// database commit that deletes the rows it published.
pub const EXIT_AFTER_KAFKA_COMMIT: &str = "ONCEFLOW_FAILPOINT_EXIT_AFTER_KAFKA_COMMIT";

/// `onceflow run` waits this many milliseconds right after it starts, before it loads the
/// topology: the time a slow start takes, made long enough to signal the process in it.
pub const START_DELAY_MS: &str = "ONCEFLOW_FAILPOINT_START_DELAY_MS";

/// The failpoints of this process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Failpoints {
    pub abort_every: Option<u64>,
    pub lose_commit_every: Option<u64>,
    pub hang_send_offsets: Option<u64>,
    pub transient_failures: u64,
    pub exit_after_db_commit: Option<u64>,
    pub exit_after_kafka_commit: Option<u64>,
    pub start_delay_ms: Option<u64>,
}

impl Failpoints {
    /// The failpoints the environment sets.
    pub fn from_env() -> Failpoints {
        Failpoints::from_lookup(|name| std::env::var(name).ok())
    }

    fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Failpoints {
        let number = |name: &str| get(name).and_then(|v| v.trim().parse::<u64>().ok());
        Failpoints {
            abort_every: number(ABORT_EVERY).filter(|n| *n > 0),
            lose_commit_every: number(LOSE_COMMIT_EVERY).filter(|n| *n > 0),
            hang_send_offsets: number(HANG_SEND_OFFSETS).filter(|n| *n > 0),
            transient_failures: number(TRANSIENT_FAILURES).unwrap_or(0),
            exit_after_db_commit: number(EXIT_AFTER_DB_COMMIT),
            exit_after_kafka_commit: number(EXIT_AFTER_KAFKA_COMMIT),
            start_delay_ms: number(START_DELAY_MS),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_or_unparsable_failpoints_are_off() {
        assert_eq!(Failpoints::from_lookup(|_| None), Failpoints::default());
        let junk = Failpoints::from_lookup(|_| Some("many".into()));
        assert_eq!(junk, Failpoints::default());
    }

    #[test]
    fn failpoints_are_read_by_name() {
        let fp = Failpoints::from_lookup(|name| match name {
            ABORT_EVERY => Some("4".into()),
            LOSE_COMMIT_EVERY => Some("5".into()),
            HANG_SEND_OFFSETS => Some("9".into()),
            TRANSIENT_FAILURES => Some(" 3".into()),
            EXIT_AFTER_DB_COMMIT => Some("2".into()),
            _ => None,
        });
        assert_eq!(
            fp,
            Failpoints {
                abort_every: Some(4),
                lose_commit_every: Some(5),
                hang_send_offsets: Some(9),
                transient_failures: 3,
                exit_after_db_commit: Some(2),
                exit_after_kafka_commit: None,
                start_delay_ms: None,
            }
        );
        let zero = Failpoints::from_lookup(|name| (name == ABORT_EVERY).then(|| "0".into()));
        assert_eq!(zero.abort_every, None, "every 0th transaction means none");
    }

    #[test]
    fn the_relay_failpoint_is_read_by_name() {
        let fp =
            Failpoints::from_lookup(|name| (name == EXIT_AFTER_KAFKA_COMMIT).then(|| "7".into()));
        assert_eq!(fp.exit_after_kafka_commit, Some(7));
        assert_eq!(fp.exit_after_db_commit, None);
    }
}
