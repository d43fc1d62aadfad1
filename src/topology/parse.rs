//! Parsing a topology file so that every problem of it comes at once.
//!
//! A YAML syntax error or a field of the wrong type would stop a plain deserialization at the
//! first problem, hiding the expression, wiring and exactly-once problems of the same file
//! behind it. So the text is read in two passes:
//!
//! 1. into a loose tree ([`serde_json::Value`]): a syntax error is reported with its line,
//!    the line is blanked, and the text read again (a few times at most);
//! 2. the tree is written back as YAML and deserialized into the typed [`Topology`] by
//!    serde-saphyr itself (so scalars mean exactly what they mean in the file), with the field
//!    path of the first error tracked. The problem is reported at that path, the tree is
//!    repaired there (an unknown or ill-typed field is removed so its default applies, or
//!    given a placeholder of another shape; a missing field is given one), and the typed pass
//!    runs again.
//!
//! Every repaired path is returned, so that later checks do not report the placeholders'
//! own problems.

use serde::Deserialize;
use serde_json::{Map, Value};

use super::Topology;
use super::lines::LineMap;

/// At most this many problems are collected by repairing; past it the rest stays hidden.
const MAX_REPAIRS: usize = 64;
/// At most this many syntax errors are reported, each by blanking its line.
const MAX_SYNTAX_ERRORS: usize = 8;

/// A problem found while parsing: where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseProblem {
    /// Dotted field path (`runtime.commit_interval_ms`); empty for the document.
    pub path: String,
    /// The 1-based line and column in the text, for a syntax error; for the others the path
    /// places it.
    pub line: Option<usize>,
    pub column: Option<usize>,
    pub message: String,
}

/// What parsing made of a text.
#[derive(Debug, Default)]
pub struct Parsed {
    /// The typed topology: as written when `problems` is empty, else with the problems'
    /// places repaired (for checking the rest of the file, never for running).
    pub topology: Option<Topology>,
    pub problems: Vec<ParseProblem>,
    /// Paths given a placeholder or removed: later problems at or under them are artifacts.
    pub repaired: Vec<String>,
}

impl Parsed {
    /// Whether `path` is at or under a repaired place.
    pub fn is_repaired(&self, path: &str) -> bool {
        self.repaired.iter().any(|r| is_under(path, r))
    }
}

fn is_under(path: &str, base: &str) -> bool {
    base.is_empty()
        || path == base
        || path
            .strip_prefix(base)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

/// Parses topology text (already interpolated), collecting every problem.
pub fn parse(text: &str) -> Parsed {
    let mut parsed = Parsed::default();
    // A file without problems is read as it is, directly: only a file with problems goes
    // through the loose tree, whose scalars are re-read from text of its own.
    if let Ok(topology) = serde_saphyr::from_str::<Topology>(text) {
        parsed.topology = Some(topology);
        return parsed;
    }
    let Some(mut tree) = loose_tree(text, &mut parsed.problems) else {
        return parsed;
    };
    // What blanking a line broke is the syntax error's doing, reported already: the
    // places of the blanked lines and everything above them are repaired silently.
    let lines = LineMap::build(text);
    let blanked: Vec<String> = parsed
        .problems
        .iter()
        .filter_map(|p| p.line)
        .filter_map(|l| lines.path_at(l, usize::MAX))
        .collect();
    let mut attempts: Vec<(String, usize)> = Vec::new();
    for _ in 0..MAX_REPAIRS {
        let (path, message) = match typed(&tree) {
            Ok(topology) => {
                parsed.topology = Some(topology);
                return parsed;
            }
            Err(e) => e,
        };
        let (path, message, missing) = match missing_field(&message) {
            Some(field) => (child(&path, field), "missing".to_string(), true),
            None => (path, message, false),
        };
        // The same place failing again is the placeholder's doing: try the next one, and
        // report the place once.
        let attempt = match attempts.iter_mut().find(|(p, _)| *p == path) {
            Some((_, n)) => {
                *n += 1;
                *n
            }
            None => {
                attempts.push((path.clone(), 0));
                if !blanked
                    .iter()
                    .any(|b| is_under(b, &path) || is_under(&path, b))
                {
                    parsed.problems.push(ParseProblem {
                        path: path.clone(),
                        line: None,
                        column: None,
                        message: explain(&tree, &path, message),
                    });
                }
                0
            }
        };
        if !repair(&mut tree, &path, attempt, missing) {
            return parsed;
        }
        if !parsed.repaired.contains(&path) {
            parsed.repaired.push(path);
        }
    }
    parsed
}

/// The loose tree of `text`; each syntax error is reported and its line blanked.
fn loose_tree(text: &str, problems: &mut Vec<ParseProblem>) -> Option<Value> {
    let mut text = text.to_string();
    for _ in 0..MAX_SYNTAX_ERRORS {
        // YAML 1.2 booleans only, numbers with leading zeros or underscores kept as text: a
        // plain `n` or `010` written back stays what it was.
        let options = serde_saphyr::options! {
            strict_booleans: true,
            leading_zero_numbers_as_strings: true,
            underscored_numbers_as_strings: true,
        };
        match serde_saphyr::from_str_with_options::<Value>(&text, options) {
            Ok(tree) => return Some(tree),
            Err(e) => {
                let line = e.location().map(|l| l.line() as usize);
                problems.push(ParseProblem {
                    path: String::new(),
                    line,
                    column: e.location().map(|l| l.column() as usize),
                    message: first_line(&e.to_string()),
                });
                let blanked = line.and_then(|l| blank_line(&text, l))?;
                if blanked == text {
                    return None;
                }
                text = blanked;
            }
        }
    }
    None
}

fn blank_line(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.split('\n').collect();
    if line == 0 || line > lines.len() {
        return None;
    }
    let mut out: Vec<&str> = lines.clone();
    out[line - 1] = "";
    Some(out.join("\n"))
}

/// The typed topology of the tree, or the path and message of the first error.
fn typed(tree: &Value) -> Result<Topology, (String, String)> {
    let yaml = serde_saphyr::to_string(tree).map_err(|e| (String::new(), e.to_string()))?;
    let mut track = serde_path_to_error::Track::new();
    let result = serde_saphyr::with_deserializer_from_str(&yaml, |de| {
        Topology::deserialize(serde_path_to_error::Deserializer::new(de, &mut track))
    });
    result.map_err(|e| (path_text(&track.path()), first_line(&e.to_string())))
}

/// serde_path_to_error's path in the form validation messages use: `a.b[2].c`, empty for
/// the document.
fn path_text(path: &serde_path_to_error::Path) -> String {
    let text = path.to_string();
    if text == "." { String::new() } else { text }
}

/// A plainer message for a number that does not fit its field ("invalid u64").
fn explain(tree: &Value, path: &str, message: String) -> String {
    let what = match message.as_str() {
        "invalid u64" | "invalid u32" | "invalid u16" | "invalid usize" => {
            "a whole number of 0 or more"
        }
        "invalid i64" | "invalid i32" => "a whole number",
        "invalid f64" | "invalid f32" => "a number",
        "invalid bool" => "true or false",
        _ => return message,
    };
    let found = segments(path)
        .and_then(|s| get(tree, &s))
        .map(|v| format!(", found `{}`", serde_json::to_string(v).unwrap_or_default()))
        .unwrap_or_default();
    format!("expected {what}{found}")
}

fn get<'t>(tree: &'t Value, path: &[Segment]) -> Option<&'t Value> {
    let mut node = tree;
    for segment in path {
        node = match (node, segment) {
            (Value::Object(map), Segment::Key(k)) => map.get(k)?,
            (Value::Array(items), Segment::Index(i)) => items.get(*i)?,
            _ => return None,
        };
    }
    Some(node)
}

/// The field a "missing field `x`" message names.
fn missing_field(message: &str) -> Option<&str> {
    let rest = message.split("missing field `").nth(1)?;
    rest.split('`').next()
}

fn child(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

/// serde-saphyr's message without what is given separately (its `error: line L column C:`
/// prefix, the snippet of the file after the first line) or meant for Rust developers (a
/// hint to use `Option<...>`).
pub fn first_line(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message);
    let bare = first
        .strip_prefix("error: line ")
        .and_then(|rest| rest.split_once(": "))
        .map_or(first, |(_, msg)| msg);
    let bare = bare.split("; use Option<").next().unwrap_or(bare);
    bare.to_string()
}

/// Placeholders tried in turn where a value is missing or of the wrong shape. The last one
/// is a pipeline step that does nothing visible to the checks.
fn placeholder(attempt: usize) -> Option<Value> {
    let mut drop_empty = Map::new();
    drop_empty.insert("drop_empty".into(), Value::Object(Map::new()));
    [
        Value::Array(Vec::new()),
        Value::Object(Map::new()),
        Value::String(String::new()),
        Value::from(0),
        Value::Bool(false),
        Value::Object(drop_empty),
    ]
    .into_iter()
    .nth(attempt)
}

/// Repairs the tree at `path`, the `attempt`-th time for that place; false when nothing is
/// left to try. A field of a mapping is first removed (its default applies), unless it is
/// the one missing.
fn repair(tree: &mut Value, path: &str, attempt: usize, missing: bool) -> bool {
    let Some((parent, last)) = split_last(path) else {
        return false;
    };
    let Some(node) = lookup(tree, &parent) else {
        return false;
    };
    match (node, last) {
        (Value::Object(map), Segment::Key(key)) => {
            let attempt = if missing {
                Some(attempt)
            } else {
                attempt.checked_sub(1)
            };
            match attempt {
                None => map.remove(&key).is_some(),
                Some(n) => match placeholder(n) {
                    Some(v) => {
                        map.insert(key, v);
                        true
                    }
                    None => false,
                },
            }
        }
        (Value::Array(items), Segment::Index(i)) if i < items.len() => match placeholder(attempt) {
            Some(v) => {
                items[i] = v;
                true
            }
            None => false,
        },
        _ => false,
    }
}

enum Segment {
    Key(String),
    Index(usize),
}

/// Splits `a.b[2].c` into its segments.
fn segments(path: &str) -> Option<Vec<Segment>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (name, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !name.is_empty() {
            out.push(Segment::Key(name.to_string()));
        }
        while let Some(stripped) = rest.strip_prefix('[') {
            let (index, after) = stripped.split_once(']')?;
            out.push(Segment::Index(index.parse().ok()?));
            rest = after;
        }
    }
    Some(out)
}

fn split_last(path: &str) -> Option<(Vec<Segment>, Segment)> {
    let mut all = segments(path)?;
    let last = all.pop()?;
    Some((all, last))
}

fn lookup<'t>(tree: &'t mut Value, path: &[Segment]) -> Option<&'t mut Value> {
    let mut node = tree;
    for segment in path {
        node = match (node, segment) {
            (Value::Object(map), Segment::Key(k)) => map.get_mut(k)?,
            (Value::Array(items), Segment::Index(i)) => items.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problems(text: &str) -> Vec<String> {
        parse(text)
            .problems
            .iter()
            .map(|p| format!("{}: {}", p.path, p.message))
            .collect()
    }

    fn paths(parsed: &Parsed) -> Vec<&str> {
        parsed.problems.iter().map(|p| p.path.as_str()).collect()
    }

    #[test]
    fn a_clean_file_parses_as_it_would_directly() {
        let text = "name: t\ninputs: [{topic: a, codec: json}]\noutputs: [{topic: b}]\nkafka:\n  producer:\n    linger.ms: 20\n";
        let parsed = parse(text);
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        let t = parsed.topology.expect("typed");
        let direct: Topology = serde_saphyr::from_str(text).unwrap();
        assert_eq!(format!("{t:?}"), format!("{direct:?}"));
        assert_eq!(t.kafka.producer["linger.ms"], "20", "a number read as text");
    }

    #[test]
    fn every_type_error_is_reported_and_the_rest_still_parses() {
        let text = "name: t\ninputs: [{topic: a}]\noutputs: [{topic: b}]\nruntime:\n  commit_interval_ms: -5\n  max_attempts: lots\n  on_error: explode\n";
        let parsed = parse(text);
        assert_eq!(
            paths(&parsed),
            [
                "runtime.commit_interval_ms",
                "runtime.max_attempts",
                "runtime.on_error"
            ],
            "{:?}",
            parsed.problems
        );
        assert_eq!(
            parsed.problems[0].message,
            "expected a whole number of 0 or more, found `-5`"
        );
        assert!(parsed.is_repaired("runtime.on_error"));
        assert!(!parsed.is_repaired("runtime"));
        let t = parsed.topology.expect("repaired");
        assert_eq!(t.runtime.commit_interval_ms, 100, "the default applies");
        assert_eq!(t.inputs[0].topic, "a");
    }

    #[test]
    fn a_missing_top_level_field_is_named_at_the_top_level() {
        let got = problems("name: t\noutputs: [{topic: b}]\nruntime:\n  commit_interval_ms: 5\n");
        assert_eq!(got, ["inputs: missing"]);
        let got = problems("name: t\ninputs: [{codec: json}]\noutputs: [{topic: b}]\n");
        assert_eq!(got, ["inputs[0].topic: missing"]);
    }

    #[test]
    fn an_unknown_field_and_an_unknown_processor_do_not_hide_the_others() {
        let text = "name: t\ninputs: [{topic: a, cdec: json}]\npipeline:\n  - filtr: 'true'\n  - filter: 'value.x'\noutputs: [{topic: b}]\nruntime: {commit_interval_ms: x}\n";
        let parsed = parse(text);
        assert_eq!(
            paths(&parsed),
            [
                "inputs[0].cdec",
                "pipeline[0]",
                "runtime.commit_interval_ms"
            ],
            "{:?}",
            parsed.problems
        );
        let t = parsed.topology.expect("repaired");
        assert_eq!(t.pipeline.len(), 2, "the bad step holds its place");
        assert_eq!(t.pipeline[1].kind(), "filter");
    }

    #[test]
    fn a_syntax_error_is_reported_with_its_line_and_the_rest_read() {
        let text = "name: t\ninputs: [{topic: a}]\noutputs: [{topic: b}]\nruntime:\n  commit_interval_ms: [1, 2\n  max_attempts: 3\n";
        let parsed = parse(text);
        assert!(!parsed.problems.is_empty());
        assert!(parsed.problems[0].line.is_some(), "{:?}", parsed.problems);
        assert!(
            parsed.problems.iter().all(|p| p.line.is_some()),
            "what blanking broke is not reported again: {:?}",
            parsed.problems
        );
        assert!(parsed.topology.is_some(), "{:?}", parsed.problems);
    }

    #[test]
    fn scalars_keep_their_meaning_through_the_loose_tree() {
        // `n` is a column name here (YAML 1.1 would read it as false), `010` a string.
        let text = "name: t\ninputs: [{topic: a}]\noutputs: [{topic: b}]\nkafka:\n  producer: {x.y: 010}\nruntime: {max_attempts: many}\npipeline:\n  - drop_fields: [n, y, 'off']\n";
        let parsed = parse(text);
        assert_eq!(parsed.problems.len(), 1, "{:?}", parsed.problems);
        let t = parsed.topology.expect("repaired");
        assert_eq!(t.kafka.producer["x.y"], "010");
        match &t.pipeline[0] {
            crate::topology::Processor::DropFields(fields) => {
                assert_eq!(fields, &["n", "y", "off"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn paths_split_into_segments() {
        let s = segments("pipeline[2].route.routes[0].to[1]").unwrap();
        assert_eq!(s.len(), 7);
        assert!(is_under("runtime.x", "runtime"));
        assert!(is_under("outputs[0].topic", "outputs[0]"));
        assert!(!is_under("outputs[10]", "outputs[1]"));
        assert!(!is_under("runtimes", "runtime"));
    }
}
