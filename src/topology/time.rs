//! Event time in a topology file: the `window` of an `aggregate` and the `delay` step, with
//! their checks. What they do with the state is in [`crate::transform`] (`window`, `delay`);
//! the docs are in `docs/state.md`, "Time".

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `window` of an `aggregate`: the state is kept per key and per time window, the windows
/// cut by each record's event time.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WindowConfig {
    /// Tumbling windows of this size, e.g. `1m`: each record falls in one.
    #[serde(default)]
    pub tumbling: Option<String>,
    /// Hopping windows of this size, a new one every `advance`: a record falls in
    /// size / advance of them.
    #[serde(default)]
    pub hopping: Option<String>,
    /// Hopping windows only: how far each window starts after the one before.
    #[serde(default)]
    pub advance: Option<String>,
    /// Session windows with this inactivity gap, e.g. `30m`: a key's records less than the
    /// gap apart (by event time) are one session; a record that bridges two sessions merges
    /// them.
    #[serde(default)]
    pub session: Option<String>,
    /// Sliding windows of this length, e.g. `5m`: each record's window holds the records of
    /// its key at most this much older than it (`[time - sliding, time]`).
    #[serde(default)]
    pub sliding: Option<String>,
    /// How long after its end a window still takes records (by stream time). Default: 0.
    #[serde(default)]
    pub grace: Option<String>,
    /// CEL: the record's event time, in milliseconds since the epoch (a number) or an RFC
    /// 3339 string, e.g. `value.clicked_at`. Default: the record's timestamp.
    #[serde(default)]
    pub time: Option<String>,
    /// What becomes of a record whose every window has closed. Default: `drop`.
    #[serde(default)]
    pub late: Late,
}

/// What becomes of a record that comes after its windows closed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Late {
    /// Dropped, and counted (`onceflow_state_late_records_total`).
    #[default]
    Drop,
    /// Sent to the dead-letter topic with its context (error kind `late`).
    DeadLetter,
}

/// A window's kind and times in milliseconds, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSpec {
    pub kind: WindowKind,
    pub grace_ms: i64,
}

/// Windows cut by the clock, or by the records of each key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowKind {
    /// Tumbling (`advance_ms` = `size_ms`) or hopping windows.
    Time { size_ms: i64, advance_ms: i64 },
    /// Sessions: a key's records less than the gap apart.
    Session { gap_ms: i64 },
    /// Each record's window: its key's records within `within_ms` before it.
    Sliding { within_ms: i64 },
}

impl WindowConfig {
    /// The windows' sizes; `Err((field, message))` naming the first field that is wrong.
    pub fn spec(&self) -> Result<WindowSpec, (&'static str, String)> {
        let grace_ms = match &self.grace {
            Some(g) => duration_ms(g).map_err(|m| ("grace", m))?,
            None => 0,
        };
        if let Some(within) = &self.sliding {
            if self.tumbling.is_some()
                || self.hopping.is_some()
                || self.advance.is_some()
                || self.session.is_some()
            {
                return Err((
                    "sliding",
                    "a window is `tumbling`, `hopping`, `session` or `sliding`: one of them".into(),
                ));
            }
            let within_ms = positive(within).map_err(|m| ("sliding", m))?;
            return Ok(WindowSpec {
                kind: WindowKind::Sliding { within_ms },
                grace_ms,
            });
        }
        if let Some(gap) = &self.session {
            if self.tumbling.is_some() || self.hopping.is_some() || self.advance.is_some() {
                return Err((
                    "session",
                    "a window is `tumbling`, `hopping`, `session` or `sliding`: one of them".into(),
                ));
            }
            let gap_ms = positive(gap).map_err(|m| ("session", m))?;
            return Ok(WindowSpec {
                kind: WindowKind::Session { gap_ms },
                grace_ms,
            });
        }
        let (size_ms, advance_ms) = match (&self.tumbling, &self.hopping, &self.advance) {
            (Some(size), None, None) => {
                let size = positive(size).map_err(|m| ("tumbling", m))?;
                (size, size)
            }
            (None, Some(size), Some(advance)) => {
                let size = positive(size).map_err(|m| ("hopping", m))?;
                let advance = positive(advance).map_err(|m| ("advance", m))?;
                if advance > size || size % advance != 0 {
                    return Err((
                        "advance",
                        format!(
                            "must divide the window's size ({size} ms) and be at most it; it is {advance} ms"
                        ),
                    ));
                }
                (size, advance)
            }
            (None, Some(_), None) => {
                return Err((
                    "advance",
                    "hopping windows need `advance`, how far each starts after the one before, e.g. `1m`".into(),
                ));
            }
            (Some(_), _, Some(_)) => {
                return Err((
                    "advance",
                    "is for hopping windows; tumbling windows advance by their size".into(),
                ));
            }
            (Some(_), Some(_), _) => {
                return Err((
                    "hopping",
                    "a window is either `tumbling` or `hopping`, not both".into(),
                ));
            }
            (None, None, _) => {
                return Err((
                    "tumbling",
                    "a window needs its kind and size: `tumbling: 1m`, `hopping: 5m` with `advance: 1m`, `session: 30m` or `sliding: 5m`".into(),
                ));
            }
        };
        Ok(WindowSpec {
            kind: WindowKind::Time {
                size_ms,
                advance_ms,
            },
            grace_ms,
        })
    }
}

/// Settings of `delay`: holds each record until it is due, then lets it go on to the outputs,
/// by the wall clock (a due record goes out even when no record comes in).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DelayConfig {
    /// The store's name, unique in the topology; its changelog is the topic
    /// `<topology>.<name>.changelog`.
    pub name: String,
    /// CEL: when the record is due, in milliseconds since the epoch (a number) or an RFC 3339
    /// string, e.g. `value.deliver_at`.
    #[serde(default)]
    pub until: Option<String>,
    /// A fixed delay after the record's timestamp, e.g. `15m`.
    #[serde(default, rename = "for")]
    pub for_: Option<String>,
}

impl DelayConfig {
    /// The fixed delay in milliseconds, when `for` is given; `Err((field, message))` when
    /// neither or both of `until` and `for` are, or `for` does not parse.
    pub fn fixed_ms(&self) -> Result<Option<i64>, (&'static str, String)> {
        match (&self.until, &self.for_) {
            (Some(_), None) => Ok(None),
            (None, Some(d)) => duration_ms(d).map(Some).map_err(|m| ("for", m)),
            (Some(_), Some(_)) => Err((
                "for",
                "a delay is either `until` (a time) or `for` (a duration), not both".into(),
            )),
            (None, None) => Err((
                "until",
                "a delay needs `until`, the CEL time a record is due (e.g. `value.deliver_at`), or `for`, a duration after its timestamp (e.g. `15m`)".into(),
            )),
        }
    }
}

/// `text` as milliseconds: a duration like `90s`, `5m`, `1h 30m`.
pub fn duration_ms(text: &str) -> Result<i64, String> {
    humantime::parse_duration(text)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .map_err(|e| format!("`{text}` is not a duration like 30s, 5m or 1h: {e}"))
}

fn positive(text: &str) -> Result<i64, String> {
    match duration_ms(text)? {
        0 => Err(format!("`{text}` is no time: a window lasts at least 1 ms")),
        ms => Ok(ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(yaml: &str) -> Result<WindowSpec, (&'static str, String)> {
        serde_saphyr::from_str::<WindowConfig>(yaml)
            .expect("a window")
            .spec()
    }

    #[test]
    fn a_window_is_tumbling_or_hopping_with_an_advance_that_divides_it() {
        assert_eq!(
            window("{tumbling: 1m, grace: 10s}"),
            Ok(WindowSpec {
                kind: WindowKind::Time {
                    size_ms: 60_000,
                    advance_ms: 60_000
                },
                grace_ms: 10_000
            })
        );
        assert_eq!(
            window("{hopping: 5m, advance: 1m}").unwrap().kind,
            WindowKind::Time {
                size_ms: 300_000,
                advance_ms: 60_000
            }
        );
        assert_eq!(
            window("{session: 30m}").unwrap().kind,
            WindowKind::Session { gap_ms: 1_800_000 }
        );
        assert_eq!(
            window("{sliding: 5m}").unwrap().kind,
            WindowKind::Sliding { within_ms: 300_000 }
        );
        for (yaml, field) in [
            ("{hopping: 5m}", "advance"),
            ("{hopping: 5m, advance: 2m}", "advance"),
            ("{hopping: 1m, advance: 5m}", "advance"),
            ("{tumbling: 1m, advance: 1m}", "advance"),
            ("{tumbling: 1m, hopping: 1m}", "hopping"),
            ("{tumbling: 0s}", "tumbling"),
            ("{tumbling: soon}", "tumbling"),
            ("{tumbling: 1m, grace: a while}", "grace"),
            ("{grace: 1m}", "tumbling"),
            ("{session: 1m, tumbling: 1m}", "session"),
            ("{session: 0s}", "session"),
            ("{sliding: 5m, session: 1m}", "sliding"),
        ] {
            assert_eq!(window(yaml).map_err(|(f, _)| f), Err(field), "{yaml}");
        }
    }

    #[test]
    fn a_delay_is_until_a_time_or_for_a_duration() {
        let delay = |yaml: &str| {
            serde_saphyr::from_str::<DelayConfig>(yaml)
                .expect("a delay")
                .fixed_ms()
                .map_err(|(f, _)| f)
        };
        assert_eq!(delay("{name: d, until: value.at}"), Ok(None));
        assert_eq!(delay("{name: d, for: 15m}"), Ok(Some(900_000)));
        assert_eq!(delay("{name: d}"), Err("until"));
        assert_eq!(delay("{name: d, until: value.at, for: 1m}"), Err("for"));
        assert_eq!(delay("{name: d, for: later}"), Err("for"));
    }
}
