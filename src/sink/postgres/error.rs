//! What can go wrong in the PostgreSQL sink, and the one place that decides what each error
//! means: retry (transient), the record's fault (permanent), or the job's setup (fatal). A
//! database error means what its [`Class`] says.

use std::time::Duration;

use super::gaps::Gap;
use crate::pg::{self, Class, PgError, RecordError};
use crate::sink::SinkErrorKind;
use crate::topology::postgres::OnSequenceGap;

/// Why a PostgreSQL output failed.
#[derive(Debug, thiserror::Error)]
pub enum PostgresError {
    #[error("environment variable `{0}` (named by url_env) is not set")]
    MissingUrl(String),
    #[error("the connection URL in `{var}` is invalid: {message}")]
    BadUrl { var: String, message: String },
    #[error("{0}")]
    Schema(String),
    #[error("cannot start the sink's runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Record(#[from] RecordError),
    #[error("{}", pg::describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("no answer from the database within {0:?}")]
    Timeout(Duration),
    #[error("the batch fails as a whole but none of its records does alone: {0}")]
    NotIsolated(Box<PostgresError>),
    /// A record's sequence does not follow its id's, and `on_sequence_gap` is not `apply`.
    #[error("{gap} (on_sequence_gap: {})", .policy.as_str())]
    SequenceGap { gap: Gap, policy: OnSequenceGap },
}

impl PostgresError {
    /// Transient errors are retried with backoff; permanent ones are a record's fault (the
    /// dead-letter topic's business); fatal ones stop the job (configuration, permissions,
    /// schema).
    pub fn kind(&self) -> SinkErrorKind {
        match self {
            PostgresError::Timeout(_) => SinkErrorKind::Transient,
            PostgresError::Record(_) => SinkErrorKind::Permanent,
            // `fail` stops the job whatever runtime.on_error says; `dead_letter` refuses the
            // record, which then goes the way runtime.on_error says.
            PostgresError::SequenceGap { policy, .. } => match policy {
                OnSequenceGap::Fail => SinkErrorKind::Fatal,
                OnSequenceGap::Apply | OnSequenceGap::DeadLetter => SinkErrorKind::Permanent,
            },
            PostgresError::Db(e) => severity(pg::class_of(e)),
            PostgresError::MissingUrl(_)
            | PostgresError::BadUrl { .. }
            | PostgresError::Schema(_)
            | PostgresError::Runtime(_)
            | PostgresError::NotIsolated(_) => SinkErrorKind::Fatal,
        }
    }
}

impl crate::sink::SinkCause for PostgresError {
    fn sink(&self) -> &'static str {
        "postgres"
    }

    fn severity(&self) -> SinkErrorKind {
        self.kind()
    }

    fn record_kind(&self) -> crate::record::ErrorKind {
        use crate::record::ErrorKind;
        match self {
            PostgresError::Record(RecordError::NotAnObject(_)) => ErrorKind::WrongType,
            PostgresError::Record(RecordError::Missing { .. } | RecordError::NoEventId(_)) => {
                ErrorKind::MissingField
            }
            PostgresError::SequenceGap { .. } => ErrorKind::SequenceGap,
            _ => ErrorKind::Rejected,
        }
    }
}

/// Each error of [`crate::pg`] as the sink's variant of the same name.
impl From<PgError> for PostgresError {
    fn from(e: PgError) -> Self {
        match e {
            PgError::MissingUrl(var) => PostgresError::MissingUrl(var),
            PgError::BadUrl { var, message } => PostgresError::BadUrl { var, message },
            PgError::Runtime(e) => PostgresError::Runtime(e),
            PgError::Db(e) => PostgresError::Db(e),
            PgError::Timeout(limit) => PostgresError::Timeout(limit),
        }
    }
}

/// What a class of database error is to a sink.
fn severity(class: Class) -> SinkErrorKind {
    match class {
        Class::Transient => SinkErrorKind::Transient,
        Class::Data => SinkErrorKind::Permanent,
        Class::Setup => SinkErrorKind::Fatal,
    }
}

/// Classifies a SQLSTATE (PostgreSQL's appendix A, [`crate::pg::Class`]).
pub fn kind_of_sqlstate(code: &str) -> SinkErrorKind {
    severity(pg::class_of_sqlstate(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_are_classified_by_class_or_code() {
        use SinkErrorKind::*;
        for (code, kind) in [
            ("08006", Transient),
            ("08001", Transient),
            ("40001", Transient),
            ("40P01", Transient),
            ("53100", Transient),
            ("57P01", Transient),
            ("57P03", Transient),
            ("55P03", Transient),
            ("23505", Permanent),
            ("23514", Permanent),
            ("23502", Permanent),
            ("22P02", Permanent),
            ("22003", Permanent),
            ("42P01", Fatal),
            ("42501", Fatal),
            ("28P01", Fatal),
            ("3D000", Fatal),
            ("57000", Fatal),
            ("XX000", Fatal),
        ] {
            assert_eq!(kind_of_sqlstate(code), kind, "{code}");
        }
    }

    #[test]
    fn record_faults_are_permanent_and_setup_faults_fatal() {
        let record = PostgresError::Record(RecordError::NotAnObject("a number".into()));
        assert_eq!(record.kind(), SinkErrorKind::Permanent);
        assert_eq!(
            PostgresError::Schema("no table".into()).kind(),
            SinkErrorKind::Fatal
        );
        assert_eq!(
            PostgresError::Timeout(Duration::from_secs(1)).kind(),
            SinkErrorKind::Transient
        );
    }

    #[test]
    fn a_sequence_gap_is_the_records_fault_or_stops_the_job() {
        use crate::record::ErrorKind;
        use crate::sink::SinkCause;
        let gap = |policy| PostgresError::SequenceGap {
            gap: Gap {
                row: 0,
                id: "[7]".into(),
                from: 3,
                to: 4,
            },
            policy,
        };
        let refused = gap(OnSequenceGap::DeadLetter);
        assert_eq!(refused.kind(), SinkErrorKind::Permanent);
        assert_eq!(refused.record_kind(), ErrorKind::SequenceGap);
        assert_eq!(ErrorKind::SequenceGap.name(), "sequence_gap");
        assert!(ErrorKind::SequenceGap.is_permanent());
        assert_eq!(
            refused.to_string(),
            "sequence gap: id [7] has sequence 5 after 2 (missing 3..4) (on_sequence_gap: dead_letter)"
        );
        assert_eq!(gap(OnSequenceGap::Fail).kind(), SinkErrorKind::Fatal);
    }
}
