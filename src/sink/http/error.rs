//! What an answer means, and what can go wrong in the HTTP sink: the one place that decides
//! between done, retry (transient), the record's fault (permanent) and the job's setup
//! (fatal).

use std::time::Duration;

use super::url_template::TemplateError;
use crate::record::ErrorKind;
use crate::sink::SinkErrorKind;

/// How much of a refusing answer's body goes into the error.
pub const BODY_EXCERPT: usize = 200;

/// What to do after an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// 2xx: the call is made.
    Done,
    /// 408, 429 and 5xx: call again, not before `after` when the server said so.
    Retry { after: Option<Duration> },
    /// Any other status: the endpoint refuses the record for good.
    Refused,
}

/// Classifies an answer's status; `retry_after` is its `Retry-After` header, if any.
pub fn classify(status: u16, retry_after: Option<&str>) -> Verdict {
    match status {
        200..=299 => Verdict::Done,
        408 | 429 | 500..=599 => Verdict::Retry {
            after: retry_after.and_then(|v| retry_after_delay(v, std::time::SystemTime::now())),
        },
        _ => Verdict::Refused,
    }
}

/// `Retry-After` as a delay at `now`: its seconds, or the time until its HTTP date (none once
/// that has passed: the backoff applies).
fn retry_after_delay(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    httpdate::parse_http_date(value)
        .ok()?
        .duration_since(now)
        .ok()
}

/// The status's class, a bounded label: `2xx` ... `5xx`, or `error` when no answer came.
pub fn status_class(status: Option<u16>) -> &'static str {
    match status {
        Some(200..=299) => "2xx",
        Some(300..=399) => "3xx",
        Some(400..=499) => "4xx",
        Some(500..=599) => "5xx",
        Some(_) => "other",
        None => "error",
    }
}

/// The first [`BODY_EXCERPT`] bytes of a body, as text, cut at a character boundary.
pub fn excerpt(body: &[u8]) -> String {
    let mut text = String::from_utf8_lossy(&body[..body.len().min(BODY_EXCERPT)]).into_owned();
    if text.ends_with('\u{FFFD}') && body.len() > BODY_EXCERPT {
        text.pop();
    }
    let text = text.trim().to_string();
    if body.len() > BODY_EXCERPT {
        format!("{text}...")
    } else {
        text
    }
}

/// Why an HTTP output failed.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error("cannot read ca_file `{path}`: {message}")]
    CaFile { path: String, message: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("cannot start the sink's runtime: {0}")]
    Runtime(std::io::Error),
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("{method} {url} answered {status}: {body}")]
    Refused {
        method: String,
        url: String,
        status: u16,
        body: String,
    },
    /// The dedup inbox could not be read or written (`transient`: retried with the batch).
    #[error("dedup inbox: {message}")]
    Dedup { transient: bool, message: String },
    #[error(
        "{method} {url} still failing when the transaction's time ran out ({calls} call(s) of the batch not made): {last}"
    )]
    OutOfTime {
        method: String,
        url: String,
        calls: usize,
        last: String,
    },
}

impl crate::sink::SinkCause for HttpError {
    fn sink(&self) -> &'static str {
        "http"
    }

    fn severity(&self) -> SinkErrorKind {
        match self {
            HttpError::Template(_) | HttpError::Refused { .. } => SinkErrorKind::Permanent,
            HttpError::OutOfTime { .. }
            | HttpError::Dedup {
                transient: true, ..
            } => SinkErrorKind::Transient,
            HttpError::Dedup { .. } => SinkErrorKind::Fatal,
            HttpError::CaFile { .. } | HttpError::Client(_) | HttpError::Runtime(_) => {
                SinkErrorKind::Fatal
            }
        }
    }

    fn record_kind(&self) -> ErrorKind {
        match self {
            HttpError::Template(TemplateError::NoKey | TemplateError::Missing(_)) => {
                ErrorKind::MissingField
            }
            HttpError::Template(
                TemplateError::NotScalar(..) | TemplateError::NotJson(_) | TemplateError::BadUrl(_),
            ) => ErrorKind::WrongType,
            _ => ErrorKind::Rejected,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sink::SinkCause;

    #[test]
    fn retry_after_is_seconds_or_an_http_date() {
        let now = httpdate::parse_http_date("Sun, 06 Dec 2026 23:00:00 GMT").unwrap();
        assert_eq!(
            retry_after_delay("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(
            retry_after_delay("Sun, 06 Dec 2026 23:00:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            retry_after_delay("Sun, 06 Dec 2026 22:59:00 GMT", now),
            None
        );
        assert_eq!(retry_after_delay("soon", now), None);
    }

    #[test]
    fn answers_are_classified() {
        assert_eq!(classify(200, None), Verdict::Done);
        assert_eq!(classify(204, Some("3")), Verdict::Done);
        for status in [408, 429, 500, 502, 503, 599] {
            assert_eq!(
                classify(status, None),
                Verdict::Retry { after: None },
                "{status}"
            );
        }
        assert_eq!(
            classify(429, Some(" 1 ")),
            Verdict::Retry {
                after: Some(Duration::from_secs(1))
            }
        );
        // An HTTP date already past: the backoff applies.
        assert_eq!(
            classify(503, Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            Verdict::Retry { after: None }
        );
        for status in [301, 400, 401, 403, 404, 409, 422] {
            assert_eq!(classify(status, None), Verdict::Refused, "{status}");
        }
        assert_eq!(status_class(Some(201)), "2xx");
        assert_eq!(status_class(Some(429)), "4xx");
        assert_eq!(status_class(None), "error");
    }

    #[test]
    fn a_refusal_keeps_the_start_of_the_body() {
        assert_eq!(excerpt(b" short \n"), "short");
        let long = "é".repeat(150);
        let cut = excerpt(long.as_bytes());
        assert!(cut.ends_with("..."), "{cut}");
        assert_eq!(cut.trim_end_matches("...").chars().count(), 100);
        let e = HttpError::Refused {
            method: "POST".into(),
            url: "http://h/x".into(),
            status: 400,
            body: excerpt(b"{\"error\":\"bad\"}"),
        };
        assert_eq!(e.severity(), SinkErrorKind::Permanent);
        assert_eq!(e.record_kind(), ErrorKind::Rejected);
        assert_eq!(
            e.to_string(),
            "POST http://h/x answered 400: {\"error\":\"bad\"}"
        );
    }
}
