//! The one loader of a topology file, which every command calls (`run`, `validate`, `test`,
//! `deploy`, `txn`, `reconcile`): the environment interpolated into the text, the text
//! parsed, the topology checked, its client settings judged by librdkafka, its pipeline
//! compiled. Every problem comes at once, each with its field path and line.
//!
//! It lives above [`crate::topology`] and [`crate::transform`] rather than in the model:
//! compiling the pipeline is transform's, and transform depends on the model. What only a
//! broker or a schema registry can answer is [`crate::validate`]'s.

use std::path::Path;

use crate::kafka::clients::{self, Identity};
use crate::topology::ConfigIssue;
use crate::topology::Topology;
use crate::topology::env::{self, Strictness};
use crate::topology::lines::LineMap;
use crate::topology::parse;
use crate::transform::Pipeline;
use rdkafka::consumer::BaseConsumer;
use rdkafka::error::KafkaError;
use rdkafka::producer::BaseProducer;

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
    /// The check could not be made (the file cannot be read; a broker, registry or database
    /// did not answer): no verdict on what it concerns, rather than a problem of it.
    pub unchecked: bool,
}

impl Diagnostic {
    /// A problem found at `path` of `file`.
    pub fn problem(file: &str, line: Option<usize>, path: String, message: String) -> Diagnostic {
        Diagnostic {
            file: file.to_string(),
            line,
            path,
            message,
            unchecked: false,
        }
    }

    /// This diagnostic as a check that could not be made.
    pub fn unchecked(self) -> Diagnostic {
        Diagnostic {
            unchecked: true,
            ..self
        }
    }
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

/// Reads and checks a topology file and compiles its pipeline; `strictness` says whether
/// unset variables are errors.
pub fn load(path: &Path, strictness: Strictness) -> Checked {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => load_text(&text, &file, &|n| std::env::var(n).ok(), strictness),
        Err(e) => Checked {
            diagnostics: vec![
                Diagnostic::problem(&file, None, String::new(), format!("cannot read: {e}"))
                    .unchecked(),
            ],
            ..Checked::default()
        },
    }
}

/// [`load`] for topology text; `file` names it in diagnostics, `lookup` reads the
/// environment.
pub fn load_text(
    text: &str,
    file: &str,
    lookup: &dyn Fn(&str) -> Option<String>,
    strictness: Strictness,
) -> Checked {
    let mut diagnostics = Vec::new();
    let raw_lines = LineMap::build(text);
    let (text, env_issues) = env::interpolate(text, lookup, strictness);
    for issue in env_issues {
        diagnostics.push(Diagnostic::problem(
            file,
            Some(issue.line),
            raw_lines
                .path_at(issue.line, issue.column)
                .unwrap_or_default(),
            issue.message,
        ));
    }
    let lines = LineMap::build(&text);
    let mut parsed = parse::parse(&text);
    // Files the topology names (schemas) are relative to its own.
    if let Some(t) = parsed.topology.as_mut()
        && Path::new(file).is_file()
    {
        t.dir = Path::new(file).parent().map(Path::to_path_buf);
    }
    for p in &parsed.problems {
        diagnostics.push(Diagnostic::problem(
            file,
            // A field missing from the document is placed at its start.
            p.line
                .or_else(|| lines.line_of(&p.path))
                .or_else(|| document_start(&text)),
            match (p.line, p.column) {
                (Some(l), Some(c)) => lines.path_at(l, c).unwrap_or_default(),
                _ => p.path.clone(),
            },
            p.message.clone(),
        ));
    }
    let Some(topology) = parsed.topology.as_ref() else {
        return Checked {
            diagnostics,
            lines,
            ..Checked::default()
        };
    };
    // Past a problem of parsing, the places it repaired are not checked again.
    let mut issues = topology.validate();
    for issue in check_clients(topology) {
        // A setting refused on onceflow's own terms is said once, in its words.
        if !issues.iter().any(|i| i.path == issue.path) {
            issues.push(issue);
        }
    }
    issues.retain(|i| !parsed.is_repaired(&i.path));
    let pipeline = match Pipeline::compile(topology) {
        Ok(p) => Some(p),
        Err(more) => {
            for issue in more {
                // Wiring problems are found by both; report each once.
                if !issues.iter().any(|i| i.path == issue.path) && !parsed.is_repaired(&issue.path)
                {
                    issues.push(issue);
                }
            }
            None
        }
    };
    for issue in issues {
        diagnostics.push(Diagnostic::problem(
            file,
            lines.line_of(&issue.path),
            issue.path,
            issue.message,
        ));
    }
    diagnostics.sort_by_key(|d| d.line.unwrap_or(usize::MAX));
    // A topology repaired for checking is never one to run (nor to check against a broker).
    let whole = parsed.problems.is_empty();
    Checked {
        pipeline: pipeline.filter(|_| whole),
        topology: parsed.topology.filter(|_| whole),
        diagnostics,
        lines,
    }
}

/// The client configurations `run` builds, judged by librdkafka itself: every property it
/// refuses (unknown, or a value it cannot take), and settings it refuses together, each at
/// the field of the topology that set it. Settings validation already names (protected
/// ones) are left to it.
fn check_clients(topology: &Topology) -> Vec<ConfigIssue> {
    let identity = Identity {
        bootstrap_servers: String::new(),
        instance_id: "validate".into(),
    };
    let mut issues = Vec::new();
    for (client, mut config) in [
        ("producer", clients::producer_config(topology, &identity)),
        ("consumer", clients::consumer_config(topology, &identity)),
    ] {
        // One property at a time: librdkafka stops at the first it refuses.
        for _ in 0..64 {
            match config.create_native_config() {
                Ok(_) => break,
                Err(KafkaError::ClientConfig(_, description, key, _)) => {
                    let path = field_of(topology, client, &key);
                    if !issues.iter().any(|i: &ConfigIssue| i.path == path) {
                        issues.push(ConfigIssue {
                            path,
                            message: format!(
                                "librdkafka refuses it for the {client}: {description}"
                            ),
                        });
                    }
                    config.remove(&key);
                }
                Err(_) => break,
            }
        }
        // Then what it refuses together, which only creating the client finds (no broker is
        // contacted: there is none to bootstrap from).
        let created = match client {
            "producer" => config.create::<BaseProducer>().err(),
            _ => config.create::<BaseConsumer>().err(),
        };
        if let Some(KafkaError::ClientCreation(message)) = created {
            let path = user_setting_in(topology, client, &message)
                .unwrap_or_else(|| format!("kafka.{client}"));
            if !issues.iter().any(|i| i.path == path) {
                issues.push(ConfigIssue {
                    path,
                    message: format!("librdkafka refuses the {client}'s settings: {message}"),
                });
            }
        }
    }
    issues
}

/// The field of the topology that gives client setting `key` to `client`.
fn field_of(topology: &Topology, client: &str, key: &str) -> String {
    let own = match client {
        "producer" => &topology.kafka.producer,
        _ => &topology.kafka.consumer,
    };
    if own.contains_key(key) {
        format!("kafka.{client}.{key}")
    } else if topology.kafka.common.contains_key(key) {
        format!("kafka.common.{key}")
    } else {
        match key {
            "session.timeout.ms" => "runtime.session_timeout_ms".into(),
            "transaction.timeout.ms" => "runtime.transaction_timeout_ms".into(),
            _ => format!("kafka.{client}.{key}"),
        }
    }
}

/// The field of a setting of the topology that a librdkafka message names.
fn user_setting_in(topology: &Topology, client: &str, message: &str) -> Option<String> {
    let own = match client {
        "producer" => &topology.kafka.producer,
        _ => &topology.kafka.consumer,
    };
    // librdkafka's messages name a property by its own name, which a topology may give
    // under an alias.
    const ALIASES: &[(&str, &str)] = &[
        ("max.in.flight.requests.per.connection", "max.in.flight"),
        ("request.required.acks", "acks"),
        ("queue.buffering.max.ms", "linger.ms"),
        ("batch.num.messages", "batch.size"),
    ];
    let named = |k: &str| {
        let canonical = ALIASES
            .iter()
            .find(|(alias, _)| *alias == k)
            .map_or(k, |(_, name)| name);
        message.contains(&format!("`{k}`")) || message.contains(&format!("`{canonical}`"))
    };
    own.keys()
        .map(|k| (k, client))
        .chain(topology.kafka.common.keys().map(|k| (k, "common")))
        .find(|(k, _)| named(k))
        .map(|(k, section)| format!("kafka.{section}.{k}"))
}

/// The first line of the document that holds anything but blanks and comments.
fn document_start(text: &str) -> Option<usize> {
    text.lines()
        .position(|l| {
            let t = l.trim();
            !t.is_empty() && !t.starts_with('#') && t != "---"
        })
        .map(|i| i + 1)
        .or(Some(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str) -> Vec<String> {
        let env = |n: &str| (n == "SET").then(|| "x".to_string());
        load_text(text, "t.yaml", &env, Strictness::Strict)
            .diagnostics
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    /// One problem per expected start, in order.
    fn assert_starts(got: &[String], expected_starts: &[&str]) {
        assert_eq!(got.len(), expected_starts.len(), "{got:#?}");
        for (g, e) in got.iter().zip(expected_starts) {
            assert!(g.starts_with(e), "{g} should start with {e}");
        }
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
        assert_starts(&got, &expected_starts);
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

    #[test]
    fn a_type_error_does_not_hide_the_other_problems_of_the_file() {
        let text = "\
name: t
inputs:
  - topic: in
    codec: json
pipeline:
  - filter: 'value.a >'
outputs:
  - topic: a
runtime:
  commit_interval_ms: -5
  max_attempts: lots
kafka:
  consumer:
    isolation.level: read_uncommitted
";
        let got = check(text);
        let expected_starts = [
            "t.yaml:6: pipeline[0].filter: ",
            "t.yaml:10: runtime.commit_interval_ms: expected a whole number of 0 or more, found `-5`",
            "t.yaml:11: runtime.max_attempts: ",
            "t.yaml:14: kafka.consumer.isolation.level: ",
        ];
        assert_starts(&got, &expected_starts);
    }

    #[test]
    fn a_missing_top_level_field_is_placed_at_the_top_level() {
        let got =
            check("# a job\nname: t\noutputs: [{topic: b}]\nruntime:\n  commit_interval_ms: 5\n");
        assert_eq!(got, ["t.yaml:2: inputs: missing"], "{got:#?}");
    }

    #[test]
    fn a_syntax_error_does_not_hide_the_other_problems_of_the_file() {
        let text = "name: t\ninputs: [{topic: a}]\npipeline:\n  - filter: 'value.a >'\noutputs: [{topic: b}]\nruntime:\n  commit_interval_ms: [1, 2\n";
        let got = check(text);
        assert!(got.iter().any(|g| g.starts_with("t.yaml:7")), "{got:#?}");
        assert!(
            got.iter()
                .any(|g| g.starts_with("t.yaml:4: pipeline[0].filter: ")),
            "{got:#?}"
        );
    }

    #[test]
    fn a_repaired_topology_is_never_one_to_run() {
        let env = |_: &str| None;
        let checked = load_text(
            "name: t\ninputs: [{topic: a}]\noutputs: [{topic: b}]\nruntime: {max_attempts: x}\n",
            "t.yaml",
            &env,
            Strictness::Strict,
        );
        assert_eq!(checked.diagnostics.len(), 1);
        assert!(checked.topology.is_none() && checked.pipeline.is_none());
    }

    #[test]
    fn validate_refuses_what_run_refuses_and_names_what_exactly_once_needs() {
        let text = "\
name: t
inputs: [{topic: a}]
outputs: [{topic: b}]
kafka:
  common:
    sesion.timeout.ms: 100
  producer:
    acks: 1
    request.required.acks: 0
    max.in.flight.requests.per.connection: 20
    linger.ms: soon
  consumer:
    fetch.max.bytes: 1000
";
        let got = check(text);
        let expected_starts = [
            "t.yaml:6: kafka.common.sesion.timeout.ms: librdkafka refuses it for the producer: No such configuration property",
            "t.yaml:8: kafka.producer.acks: must be `all`",
            "t.yaml:9: kafka.producer.request.required.acks: must be `all`",
            "t.yaml:10: kafka.producer.max.in.flight.requests.per.connection: must be at most 5",
            "t.yaml:11: kafka.producer.linger.ms: librdkafka refuses it for the producer: ",
            "t.yaml:13: kafka.consumer.fetch.max.bytes: librdkafka refuses the consumer's settings: ",
        ];
        assert_starts(&got, &expected_starts);
    }

    #[test]
    fn the_settings_every_example_uses_pass_librdkafka() {
        let text = "name: t\ninputs: [{topic: a}]\noutputs: [{topic: b}]\nkafka:\n  producer:\n    acks: all\n    linger.ms: 20\n    compression.type: lz4\n  consumer:\n    fetch.min.bytes: 1\n";
        assert_eq!(check(text), Vec::<String>::new());
    }
}
