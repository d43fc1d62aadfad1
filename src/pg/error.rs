//! What can go wrong talking to PostgreSQL, and the one place that says what a database error
//! means for the call that met it ([`Class`]): try again, the data's fault, or the setup's.

use std::time::Duration;

/// Why a connection or a statement failed.
#[derive(Debug, thiserror::Error)]
pub enum PgError {
    #[error("environment variable `{0}` (named by url_env) is not set")]
    MissingUrl(String),
    #[error("the connection URL in `{var}` is invalid: {message}")]
    BadUrl { var: String, message: String },
    #[error("cannot start the sink's runtime: {0}")]
    Runtime(std::io::Error),
    #[error("{}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("no answer from the database within {0:?}")]
    Timeout(Duration),
}

/// What an error says of the call that met it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// The same call may succeed later: the connection broke, could not be made or did not
    /// answer; the server is stopping, starting or short of resources; a conflict with
    /// another transaction.
    Transient,
    /// The data's fault: a value that does not fit its column, a constraint it breaks.
    Data,
    /// Configuration, permissions, schema, or a client-side error: no retry fixes it.
    Setup,
}

impl PgError {
    pub fn class(&self) -> Class {
        match self {
            PgError::Timeout(_) => Class::Transient,
            PgError::Db(e) => class_of(e),
            PgError::MissingUrl(_) | PgError::BadUrl { .. } | PgError::Runtime(_) => Class::Setup,
        }
    }
}

/// The class of a database error: by its SQLSTATE when the server sent one.
pub(crate) fn class_of(e: &tokio_postgres::Error) -> Class {
    match e.code() {
        Some(code) => class_of_sqlstate(code.code()),
        None if is_connection_error(e) => Class::Transient,
        // A client-side error (parameters, types, configuration): a bug or a setup
        // problem that no retry fixes.
        None => Class::Setup,
    }
}

/// Whether an error without SQLSTATE is about the connection: it broke, closed, could not be
/// made, or the server did not answer.
fn is_connection_error(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        if cause.is::<std::io::Error>() {
            return true;
        }
        source = cause.source();
    }
    let text = e.to_string();
    [
        "error connecting to server",
        "error communicating with the server",
        "timeout waiting for server",
        "connection closed",
        "unexpected message from server",
    ]
    .iter()
    .any(|m| text.starts_with(m))
}

/// Classifies a SQLSTATE (PostgreSQL's appendix A).
pub(crate) fn class_of_sqlstate(code: &str) -> Class {
    const TRANSIENT: &[&str] = &[
        "08",    // connection exception
        "40001", // serialization failure
        "40P01", // deadlock detected
        "53",    // insufficient resources (disk full, out of memory, too many connections)
        "57P01", // admin shutdown (the server is stopping)
        "57P02", // crash shutdown
        "57P03", // cannot connect now (starting up, recovering)
        "57014", // query canceled (statement timeout)
        "55P03", // lock not available
        "58",    // system error (I/O)
    ];
    const DATA: &[&str] = &[
        "22", // data exception: a value that does not fit its column
        "23", // integrity constraint violation: not null, unique, check, foreign key
    ];
    if TRANSIENT.iter().any(|p| code.starts_with(p)) {
        Class::Transient
    } else if DATA.iter().any(|p| code.starts_with(p)) {
        Class::Data
    } else {
        Class::Setup
    }
}

/// A database error with its SQLSTATE, message, detail and hint; other errors with their
/// causes (tokio-postgres says only "db error" or "error connecting to server" otherwise).
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{} {}: {}", db.severity(), db.code().code(), db.message());
        if let Some(detail) = db.detail() {
            s.push_str(&format!(" (detail: {detail})"));
        }
        if let Some(hint) = db.hint() {
            s.push_str(&format!(" (hint: {hint})"));
        }
        return s;
    }
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_answer_is_transient_outside_the_database() {
        assert_eq!(
            PgError::Timeout(Duration::from_secs(1)).class(),
            Class::Transient
        );
        assert_eq!(PgError::MissingUrl("U".into()).class(), Class::Setup);
        let bad = PgError::BadUrl {
            var: "U".into(),
            message: "no host".into(),
        };
        assert_eq!(bad.class(), Class::Setup);
        assert_eq!(class_of_sqlstate("23505"), Class::Data);
        assert_eq!(class_of_sqlstate("40P01"), Class::Transient);
        assert_eq!(class_of_sqlstate("42501"), Class::Setup);
    }
}
