//! `onceflow validate`'s checks that need a service: what only a broker can tell (its
//! transaction timeout ceiling, whether the topics exist), what only the schema registry can
//! (whether each Avro output's schema may be written under its subject). Whether a relay's
//! outbox table is there is [`crate::relay::check_outbox_table`]'s; everything that needs no
//! service is [`crate::load`]'s.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::kafka::Cluster;
use crate::kafka::admin::{Admin, AdminError};

use crate::load::Diagnostic;
use crate::topology::lines::LineMap;
use crate::topology::{PROTECTED_CLIENT_SETTINGS, StoreSource, Target, Topology};

/// Checks `topology` against a running broker: `transaction.max.timeout.ms` must allow the
/// topology's transaction timeout, and every input and output topic must exist. Every
/// problem is returned, located with `lines`; what could not be asked (no answer from the
/// broker or the registry) is returned [unchecked](Diagnostic::unchecked).
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
            return vec![
                at.diag(
                    "",
                    format!("cannot create a client for {bootstrap}: {}", cause(&e)),
                )
                .unchecked(),
            ];
        }
    };
    let metadata = match admin.metadata(timeout) {
        Ok(m) => m,
        Err(e) => {
            return vec![
                at.diag(
                    "",
                    format!(
                        "cannot read the cluster metadata from {bootstrap}: {}",
                        cause(&e)
                    ),
                )
                .unchecked(),
            ];
        }
    };
    let mut out = missing_topics(topology, &metadata.topics, bootstrap, &at);
    out.extend(changelog_partitions(topology, &metadata.partitions, &at));
    out.extend(transaction_timeout_ceilings(
        topology,
        &admin,
        &metadata.brokers,
        timeout,
        &at,
    ));
    out.extend(check_registry(topology, &at));
    out
}

/// The schema registry of a topology with Avro, Protobuf or JSON Schema: it answers, and
/// each output's schema is compatible with its subject (or, with `auto_register: false`,
/// registered there). Asks only: nothing is registered.
fn check_registry(topology: &Topology, at: &Locator<'_>) -> Vec<Diagnostic> {
    let Some(config) = &topology.schema_registry else {
        return Vec::new();
    };
    let registry = match crate::codec::Registry::connect(config) {
        Ok(r) => r,
        Err(e) => return vec![at.diag("schema_registry.url", e).unchecked()],
    };
    if let Err(e) = registry.ping() {
        return vec![at.diag("schema_registry.url", e).unchecked()];
    }
    let mut out = Vec::new();
    for o in 0..topology.outputs.len() {
        for key in [false, true] {
            // A schema that does not compile is reported by the checks of the file already.
            let Some(Ok(schema)) = crate::codec::output_schema(topology, o, key) else {
                continue;
            };
            let path = format!("outputs[{o}].{}", schema.field);
            match subject_problem(&registry, &schema) {
                Ok(None) => {}
                Ok(Some(problem)) => out.push(at.diag(&path, problem)),
                Err(e) => out.push(at.diag(&path, e).unchecked()),
            }
        }
    }
    out
}

/// What is wrong with writing `schema` under its subject, if anything; `Err` when the
/// registry could not be asked.
fn subject_problem(
    registry: &crate::codec::Registry,
    schema: &crate::codec::OutputSchema,
) -> Result<Option<String>, String> {
    let subject = &schema.subject;
    if schema.auto_register {
        registry
            .is_compatible_schema(subject, &schema.registered)
            .map(|ok| {
                (!ok).then(|| {
                    format!(
                        "the schema is not compatible with subject `{subject}` of {} (the registry would refuse it)",
                        registry.url()
                    )
                })
            })
    } else {
        registry
            .lookup_schema(subject, &schema.registered)
            .map(|found| found.err())
    }
}

/// Places a broker check's problems in the file.
struct Locator<'a> {
    file: &'a str,
    lines: &'a LineMap,
}

impl Locator<'_> {
    fn diag(&self, path: &str, message: String) -> Diagnostic {
        Diagnostic::problem(
            self.file,
            self.lines.line_of(path),
            path.to_string(),
            message,
        )
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
        // An outbox input reads no topic.
        if input.postgres_outbox.is_none() && !existing.contains(&input.topic) {
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

/// A problem for every store topic whose partitions do not line up with the input's: a
/// changelog that exists with another count (a missing one is no problem: the job creates
/// it), a `join`'s table that does not exist, or a co-partitioned one with another count.
fn changelog_partitions(
    topology: &Topology,
    partitions: &BTreeMap<String, usize>,
    at: &Locator<'_>,
) -> Vec<Diagnostic> {
    let Some(expected) = topology
        .input_topics()
        .first()
        .and_then(|input| partitions.get(*input))
    else {
        return Vec::new();
    };
    topology
        .stores()
        .zip(topology.store_topics())
        .filter_map(|((i, _), (topic, source))| {
            let kind = topology.pipeline.get(i).map_or("", |p| p.kind());
            let message = match (source, partitions.get(&topic)) {
                (StoreSource::Changelog, Some(found)) if found != expected => format!(
                    "its changelog `{topic}` has {found} partitions, the input has {expected}: partition p of a changelog holds the state of input partition p. Delete the changelog (its state is rebuilt from nothing) or recreate it with {expected} partitions"
                ),
                (StoreSource::Table | StoreSource::GlobalTable, None) => {
                    format!("the table topic `{topic}` does not exist")
                }
                (StoreSource::Table, Some(found)) if found != expected => format!(
                    "the table `{topic}` has {found} partitions, the input has {expected}: a co-partitioned table needs the input's key and partition count. Repartition the table, or read it whole with `global: true`"
                ),
                _ => return None,
            };
            let field = if source == StoreSource::Changelog {
                "name"
            } else {
                "table"
            };
            Some(at.diag(&format!("pipeline[{i}].{kind}.{field}"), message))
        })
        .collect()
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
                out.push(
                    at.diag(path, format!("cannot start an async runtime: {e}"))
                        .unchecked(),
                );
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
            Err(e) => out.push(
                at.diag(path, format!("cannot read {KEY} of broker {broker}: {e}")).unchecked(),
            ),
        }
    }
    out
}
