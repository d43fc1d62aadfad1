//! Environment interpolation of topology files, done on the text before it is parsed.
//!
//! * `${VAR}`: the value of `VAR`; an error naming it (and its line) when it is unset;
//! * `${VAR:-default}`: `default` when `VAR` is unset or empty;
//! * `${VAR:?message}`: an error with `message` when `VAR` is unset or empty;
//! * `$$`: a literal `$` (so `$${VAR}` is the text `${VAR}`).
//!
//! A `$` followed by anything else is kept as it is. Values are inserted verbatim: quote the
//! place in the YAML when a value may contain YAML syntax.

/// A variable that could not be interpolated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct EnvIssue {
    /// 1-based line of the `${...}`.
    pub line: usize,
    /// 1-based column (in characters) of its `$`.
    pub column: usize,
    /// The variable's name (empty when the reference itself is malformed).
    pub variable: String,
    /// What is wrong and what to do.
    pub message: String,
}

/// How unset variables are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strictness {
    /// An unset variable without default is an error.
    Strict,
    /// Unset variables expand to their default, or to an empty string: for checking a file
    /// without the environment it will run in.
    Lenient,
}

/// Interpolates `text` with `lookup` (usually `std::env::var`). Returns the interpolated text
/// and every problem found. An unset variable without default expands to its own name
/// (`${TOPIC}` gives `TOPIC`): a valid string, so that the rest of the file can still be
/// checked (in [`Strictness::Lenient`] mode, and alongside the errors of the strict one).
pub fn interpolate(
    text: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    strictness: Strictness,
) -> (String, Vec<EnvIssue>) {
    let mut out = String::with_capacity(text.len());
    let mut issues = Vec::new();
    let mut rest = text;
    while let Some(pos) = rest.find('$') {
        let before = &rest[..pos];
        // Where this `$` is, for messages (files are small: counting from the start is fine).
        let place = Place::after(&text[..text.len() - rest.len() + pos]);
        out.push_str(before);
        let after = &rest[pos + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
            continue;
        }
        let Some(body_and_tail) = after.strip_prefix('{') else {
            out.push('$');
            rest = after;
            continue;
        };
        let line_end = body_and_tail.find('\n').unwrap_or(body_and_tail.len());
        let Some(end) = body_and_tail[..line_end].find('}') else {
            issues.push(place.issue("", "`${` without a closing `}`".into()));
            out.push('$');
            rest = after;
            continue;
        };
        let body = &body_and_tail[..end];
        rest = &body_and_tail[end + 1..];
        if let Some((variable, message)) = expand(body, lookup, strictness, &mut out) {
            issues.push(place.issue(variable, message));
        }
    }
    out.push_str(rest);
    (out, issues)
}

/// Where a `$` is in the text: its 1-based line and column (in characters).
#[derive(Clone, Copy)]
struct Place {
    line: usize,
    column: usize,
}

impl Place {
    /// The place right after `upto`, the text before the `$`.
    fn after(upto: &str) -> Place {
        let line = upto.matches('\n').count() + 1;
        let column = upto[upto.rfind('\n').map_or(0, |i| i + 1)..]
            .chars()
            .count()
            + 1;
        Place { line, column }
    }

    /// A problem of the reference here, to `variable` (empty when it is malformed).
    fn issue(self, variable: &str, message: String) -> EnvIssue {
        EnvIssue {
            line: self.line,
            column: self.column,
            variable: variable.to_string(),
            message,
        }
    }
}

/// Appends what the reference `${body}` expands to. Returns its problem, if any: the
/// variable's name and what is wrong.
fn expand<'b>(
    body: &'b str,
    lookup: &dyn Fn(&str) -> Option<String>,
    strictness: Strictness,
    out: &mut String,
) -> Option<(&'b str, String)> {
    let (name, op) = match body.find([':', '-', '?']) {
        Some(i) => (&body[..i], Some(&body[i..])),
        None => (body, None),
    };
    if !is_var_name(name) {
        return Some((
            name,
            format!("`${{{body}}}` is not a variable reference (use `$$` for a literal `$`)"),
        ));
    }
    let value = lookup(name).filter(|v| op.is_none() || !v.is_empty());
    match (value, op) {
        (Some(v), _) => out.push_str(&v),
        (None, Some(op)) if op.starts_with(":-") => out.push_str(&op[2..]),
        (None, Some(op)) if op.starts_with(":?") => {
            out.push_str(name);
            if strictness == Strictness::Strict {
                let message = &op[2..];
                return Some((
                    name,
                    if message.is_empty() {
                        format!("environment variable {name} is unset or empty")
                    } else {
                        format!("environment variable {name}: {message}")
                    },
                ));
            }
        }
        (None, Some(op)) => {
            return Some((
                name,
                format!(
                    "`{op}` after {name}: only `${{VAR}}`, `${{VAR:-default}}` and `${{VAR:?message}}` are understood"
                ),
            ));
        }
        (None, None) => {
            out.push_str(name);
            if strictness == Strictness::Strict {
                return Some((
                    name,
                    format!(
                        "environment variable {name} is not set (give a default with ${{{name}:-default}})"
                    ),
                ));
            }
        }
    }
    None
}

fn is_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        match name {
            "HOST" => Some("kafka:9092".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    fn run(text: &str) -> (String, Vec<EnvIssue>) {
        interpolate(text, &env, Strictness::Strict)
    }

    #[test]
    fn plain_default_and_escape() {
        let (out, issues) = run("a: ${HOST}\nb: ${NOPE:-x-y}\nc: $${HOST} $5 $\nd: ${EMPTY:-e}\n");
        assert!(issues.is_empty(), "{issues:?}");
        assert_eq!(out, "a: kafka:9092\nb: x-y\nc: ${HOST} $5 $\nd: e\n");
    }

    #[test]
    fn unset_variables_are_errors_with_name_and_line() {
        let (_, issues) = run("a: 1\nb: ${NOPE}\nc: ${GONE:?set it to the region}\n");
        assert_eq!(issues.len(), 2);
        assert_eq!((issues[0].line, issues[0].variable.as_str()), (2, "NOPE"));
        assert_eq!(issues[0].column, 4);
        assert!(issues[0].message.contains("NOPE"));
        assert_eq!((issues[1].line, issues[1].variable.as_str()), (3, "GONE"));
        assert!(issues[1].message.contains("set it to the region"));
    }

    #[test]
    fn lenient_mode_accepts_unset_variables() {
        let (out, issues) = interpolate("a: '${NOPE}'\n", &env, Strictness::Lenient);
        assert!(issues.is_empty());
        assert_eq!(out, "a: 'NOPE'\n");
    }

    #[test]
    fn malformed_references_are_errors() {
        let (_, issues) = run("a: ${1X}\nb: ${HOST\n");
        assert_eq!(issues.len(), 2, "{issues:?}");
        assert_eq!(issues[1].line, 2);
    }
}
