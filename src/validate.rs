//! `onceflow validate`: every problem of a topology file at once, each with its field path and
//! line. Environment interpolation, parsing, structural validation and expression compilation
//! are all checked; [`check_broker`] adds what only a broker can tell (its transaction timeout
//! ceiling, whether the topics exist).

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::kafka::Cluster;
use crate::kafka::admin::{Admin, AdminError};

use crate::topology::env::{self, Strictness};
use crate::topology::lines::LineMap;
use crate::topology::{PROTECTED_CLIENT_SETTINGS, Target, Topology};
use crate::transform::Pipeline;

/// One problem, located.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file (or the name given to the text).
    pub file: String,
    /// 1-based line, when the problem has a place in the file.
    pub line: Option<usize>,
    /// Dotted field path (`pipeline[2].route.routes[0].when`); empty for the whole file.
    pub path: String,
    /// What is wrong and what to do.
    pub message: String,
}

impl std::fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        if !self.path.is_empty() {
            write!(f, ": {}", self.path)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The outcome of checking a file: what could be built, and every problem.
#[derive(Debug, Default)]
pub struct Checked {
    pub topology: Option<Topology>,
    pub pipeline: Option<Pipeline>,
    pub diagnostics: Vec<Diagnostic>,
    /// Line numbers of the interpolated text, to place later problems (broker checks).
    pub lines: LineMap,
}

impl Checked {
    /// The topology and its pipeline when there is no problem; every problem otherwise.
    pub fn into_result(self) -> Result<(Topology, Pipeline), Vec<Diagnostic>> {
        match (self.topology, self.pipeline) {
            (Some(t), Some(p)) if self.diagnostics.is_empty() => Ok((t, p)),
            _ => Err(self.diagnostics),
        }
    }
}

/// Reads and checks a topology file; `strictness` says whether unset variables are errors.
pub fn check_file(path: &Path, strictness: Strictness) -> Checked {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => check_text(&text, &file, &|n| std::env::var(n).ok(), strictness),
        Err(e) => Checked {
            diagnostics: vec![Diagnostic {
                file,
                line: None,
                path: String::new(),
                message: format!("cannot read: {e}"),
            }],
            ..Checked::default()
        },
    }
}

/// Checks topology text; `file` names it in diagnostics, `lookup` reads the environment.
pub fn check_text(
    text: &str,
    file: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    strictness: Strictness,
) -> Checked {
    let mut diagnostics = Vec::new();
    let raw_lines = LineMap::build(text);
    let (text, env_issues) = env::interpolate(text, lookup, strictness);
    for issue in env_issues {
        diagnostics.push(Diagnostic {
            file: file.to_string(),
            line: Some(issue.line),
            path: raw_lines
                .path_at(issue.line, issue.column)
                .unwrap_or_default(),
            message: issue.message,
        });
    }
    let lines = LineMap::build(&text);
    let topology = match Topology::parse_unchecked(&text) {
        Ok(t) => t,
        Err(e) => {
            let at = e
                .location()
                .map(|l| (l.line() as usize, l.column() as usize));
            diagnostics.push(Diagnostic {
                file: file.to_string(),
                line: at.map(|(l, _)| l),
                path: at
                    .and_then(|(l, c)| lines.path_at(l, c))
                    .unwrap_or_default(),
                message: first_line(&e.to_string()),
            });
            return Checked {
                diagnostics,
                lines,
                ..Checked::default()
            };
        }
    };
    let mut issues = topology.validate();
    let pipeline = match Pipeline::compile(&topology) {
        Ok(p) => Some(p),
        Err(more) => {
            for issue in more {
                // Wiring problems are found by both; report each once.
                if !issues.iter().any(|i| i.path == issue.path) {
                    issues.push(issue);
                }
            }
            None
        }
    };
    for issue in issues {
        diagnostics.push(Diagnostic {
            file: file.to_string(),
            line: lines.line_of(&issue.path),
            path: issue.path,
            message: issue.message,
        });
    }
    diagnostics.sort_by_key(|d| d.line.unwrap_or(usize::MAX));
    Checked {
        topology: Some(topology),
        pipeline,
        diagnostics,
        lines,
    }
}

/// serde-saphyr's message without what is given separately (its `error: line L column C:`
/// prefix, the snippet of the file after the first line) or meant for Rust developers (a
/// hint to use `Option<...>`).
fn first_line(message: &str) -> String {
    let first = message.lines().next().unwrap_or(message);
    let bare = first
        .strip_prefix("error: line ")
        .and_then(|rest| rest.split_once(": "))
        .map_or(first, |(_, msg)| msg);
    let bare = bare.split("; use Option<").next().unwrap_or(bare);
    bare.to_string()
}

/// Checks `topology` against a running broker: `transaction.max.timeout.ms` must allow the
/// topology's transaction timeout, and every input and output topic must exist. Every
/// problem is returned, located with `lines`.
pub fn check_broker(
    topology: &Topology,
    bootstrap: &str,
    file: &str,
    lines: &LineMap,
    timeout: Duration,
) -> Vec<Diagnostic> {
    let at = Locator { file, lines };
    let cluster = Cluster {
        bootstrap: bootstrap.to_string(),
        settings: topology
            .kafka
            .common
            .iter()
            .filter(|(k, _)| !PROTECTED_CLIENT_SETTINGS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
    };
    let admin = match Admin::new(&cluster) {
        Ok(a) => a,
        Err(e) => {
            return vec![at.diag(
                "",
                format!("cannot create a client for {bootstrap}: {}", cause(&e)),
            )];
        }
    };
    let metadata = match admin.metadata(timeout) {
        Ok(m) => m,
        Err(e) => {
            return vec![at.diag(
                "",
                format!(
                    "cannot read the cluster metadata from {bootstrap}: {}",
                    cause(&e)
                ),
            )];
        }
    };
    let mut out = missing_topics(topology, &metadata.topics, bootstrap, &at);
    out.extend(transaction_timeout_ceilings(
        topology,
        &admin,
        &metadata.brokers,
        timeout,
        &at,
    ));
    out
}

/// Places a broker check's problems in the file.
struct Locator<'a> {
    file: &'a str,
    lines: &'a LineMap,
}

impl Locator<'_> {
    fn diag(&self, path: &str, message: String) -> Diagnostic {
        Diagnostic {
            file: self.file.to_string(),
            line: self.lines.line_of(path),
            path: path.to_string(),
            message,
        }
    }
}

/// What the client or the broker answered, for a diagnostic that says what was asked.
fn cause(e: &AdminError) -> String {
    match e {
        AdminError::Client(e) | AdminError::Request { source: e, .. } => e.to_string(),
        AdminError::Refused { code, .. } => code.to_string(),
        AdminError::NoAnswer { .. } => "no answer".to_string(),
        other => other.to_string(),
    }
}

/// Every input and output topic of `topology` that is not among `existing`.
fn missing_topics(
    topology: &Topology,
    existing: &BTreeSet<String>,
    bootstrap: &str,
    at: &Locator<'_>,
) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for (i, input) in topology.inputs.iter().enumerate() {
        if !existing.contains(&input.topic) {
            out.push(at.diag(
                &format!("inputs[{i}].topic"),
                format!("topic `{}` does not exist on {bootstrap}", input.topic),
            ));
        }
    }
    for (i, output) in topology.outputs.iter().enumerate() {
        let Some(Target::Topic(topic)) = output.target() else {
            continue;
        };
        if !existing.contains(topic) {
            out.push(at.diag(
                &format!("outputs[{i}].topic"),
                format!("topic `{topic}` does not exist on {bootstrap}"),
            ));
        }
    }
    out
}

/// A problem for every broker whose `transaction.max.timeout.ms` is below the topology's
/// transaction timeout, or cannot be read.
fn transaction_timeout_ceilings(
    topology: &Topology,
    admin: &Admin,
    brokers: &[i32],
    timeout: Duration,
    at: &Locator<'_>,
) -> Vec<Diagnostic> {
    const KEY: &str = "transaction.max.timeout.ms";
    let wanted = topology.runtime.transaction_timeout_ms;
    let path = "runtime.transaction_timeout_ms";
    let mut out = Vec::new();
    for &broker in brokers {
        let ceiling = match admin.broker_config(broker, KEY, timeout) {
            Err(AdminError::Runtime(e)) => {
                out.push(at.diag(path, format!("cannot start an async runtime: {e}")));
                return out;
            }
            Err(e) => Err(cause(&e)),
            Ok(value) => value
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(|| format!("{KEY} is not reported")),
        };
        match ceiling {
            Ok(max) if max < wanted => out.push(at.diag(
                path,
                format!(
                    "{wanted} ms is more than the {KEY} of broker {broker} ({max} ms): producers would fail to initialise; lower it or raise the broker's"
                ),
            )),
            Ok(_) => {}
            Err(e) => out.push(at.diag(
                path,
                format!("cannot read {KEY} of broker {broker}: {e}"),
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Vec<String> {
        let env = |n: &str| (n == "SET").then(|| "x".to_string());
        check_text(text, "t.yaml", &env, Strictness::Strict)
            .diagnostics
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    #[test]
    fn every_problem_has_its_path_and_line() {
        let text = "\
name: t
inputs:
  - topic: in
    codec: json
pipeline:
  - filter: 'value.a >'
  - map:
      b: 'nope.c'
  - route:
      routes:
        - when: 'value.a == 1'
          to: [a, missing]
      default: []
outputs:
  - topic: a
  - topic: b
runtime:
  commit_interval_ms: 2000
  transaction_timeout_ms: 2000
kafka:
  consumer:
    isolation.level: read_uncommitted
";
        let got = check(text);
        let expected_starts = [
            "t.yaml:6: pipeline[0].filter: ",
            "t.yaml:8: pipeline[1].map.b: ",
            "t.yaml:12: pipeline[2].route.routes[0].to[1]: ",
            "t.yaml:16: outputs[1]: ",
            "t.yaml:19: runtime.transaction_timeout_ms: ",
            "t.yaml:22: kafka.consumer.isolation.level: ",
        ];
        assert_eq!(got.len(), expected_starts.len(), "{got:#?}");
        for (g, e) in got.iter().zip(expected_starts) {
            assert!(g.starts_with(e), "{g} should start with {e}");
        }
    }

    #[test]
    fn unset_variables_are_reported_with_line_and_path_along_with_the_rest() {
        let text = "name: t\ninputs: [{topic: '${NOPE}'}]\noutputs: [{topic: '${SET}'}]\nruntime: {commit_interval_ms: 0}\n";
        let got = check(text);
        assert_eq!(got.len(), 2, "{got:#?}");
        assert!(
            got[0].starts_with("t.yaml:2: inputs[0].topic: environment variable NOPE"),
            "{got:#?}"
        );
        assert!(
            got[1].starts_with("t.yaml:4: runtime.commit_interval_ms"),
            "{got:#?}"
        );
    }

    #[test]
    fn parse_errors_carry_their_line() {
        let got = check(
            "name: t\ninputs: [{topic: a}]\noutputs: [{topic: b}]\nruntime:\n  commit_interval: 5\n",
        );
        assert_eq!(got.len(), 1, "{got:#?}");
        assert!(got[0].starts_with("t.yaml:5"), "{got:#?}");
        assert!(got[0].contains("commit_interval"), "{got:#?}");
    }
}
