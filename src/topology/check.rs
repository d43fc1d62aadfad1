//! The checks of a whole topology: [`Topology::validate`] reports every problem at once, each
//! with the path of the field it concerns. The sections with fields of their own (Avro, HTTP,
//! outbox, PostgreSQL) check those in their own files; this puts them together with the
//! checks across sections (names, routes, limits, client settings).

use std::collections::BTreeSet;

use super::{
    Codec, ConfigIssue, Output, PROTECTED_CLIENT_SETTINGS, Processor, RouteConfig, Topology, avro,
    is_field_path,
};

impl Topology {
    /// Every problem in the topology, each with its field path; empty when it is valid.
    pub fn validate(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        let mut issue = |path: String, message: &str| {
            issues.push(ConfigIssue {
                path,
                message: message.to_string(),
            })
        };
        self.validate_name(&mut issue);
        self.validate_inputs(&mut issue);
        self.validate_outputs(&mut issue);
        self.validate_pipeline(&mut issue);
        self.validate_state(&mut issue);
        for i in self.validate_postgres_outputs() {
            issue(i.path, &i.message);
        }
        self.validate_limits(&mut issue);
        self.validate_dead_letter(&mut issue);
        self.validate_transaction_timeout(&mut issue);
        self.validate_client_settings(&mut issue);
        self.validate_avro(&mut issue);
        issues
    }

    /// Avro, Protobuf and JSON Schema inputs and outputs, and their registry. The schemas
    /// themselves are parsed when the pipeline is compiled ([`crate::codec`]).
    fn validate_avro(&self, issue: &mut dyn FnMut(String, &str)) {
        let mut uses_registry = false;
        for (i, input) in self.inputs.iter().enumerate() {
            uses_registry |= input.codec.uses_registry() || input.key_codec.uses_registry();
            if input.avro.is_some() && input.codec != Codec::Avro {
                issue(
                    format!("inputs[{i}].avro"),
                    "is for `codec: avro` inputs only",
                );
            }
            if let Some(a) = &input.avro
                && a.reader_schema.is_some()
                && a.reader_schema_file.is_some()
            {
                issue(
                    format!("inputs[{i}].avro"),
                    "give `reader_schema` or `reader_schema_file`, not both",
                );
            }
        }
        for (o, output) in self.outputs.iter().enumerate() {
            uses_registry |= self.validate_output_schemas(o, output, issue);
        }
        match &self.schema_registry {
            Some(r) => {
                let mut found = Vec::new();
                avro::validate_registry(r, &mut found);
                for i in found {
                    issue(i.path, &i.message);
                }
            }
            None if uses_registry => issue(
                "schema_registry".into(),
                "Avro, Protobuf and JSON Schema inputs and outputs need a schema registry: \
                 `schema_registry: {url: ...}`",
            ),
            None => {}
        }
    }

    /// The schema settings of output `o`; whether it uses the registry.
    fn validate_output_schemas(
        &self,
        o: usize,
        output: &super::Output,
        issue: &mut dyn FnMut(String, &str),
    ) -> bool {
        let mut uses_registry = false;
        for (codec, settings, field, codec_field, wanted) in [
            (
                output.codec,
                output.avro.is_some(),
                "avro",
                "codec",
                Codec::Avro,
            ),
            (
                output.key_codec,
                output.key_avro.is_some(),
                "key_avro",
                "key_codec",
                Codec::Avro,
            ),
            (
                output.codec,
                output.protobuf.is_some(),
                "protobuf",
                "codec",
                Codec::Protobuf,
            ),
            (
                output.codec,
                output.json_schema.is_some(),
                "json_schema",
                "codec",
                Codec::JsonSchema,
            ),
        ] {
            let on = codec == Some(wanted);
            uses_registry |= on;
            let at = format!("outputs[{o}].{field}");
            let name = wanted.name();
            match (settings, on) {
                (true, false) => issue(at, &format!("is for `{codec_field}: {name}` outputs only")),
                (false, true) => issue(
                    at,
                    &format!(
                        "`{name}` needs its schema: `{field}: {{schema: ...}}` or `{field}: {{schema_file: ...}}`"
                    ),
                ),
                (true, true) if output.topic.is_none() => issue(
                    format!("outputs[{o}].{codec_field}"),
                    &format!("`{name}` is for Kafka topic outputs"),
                ),
                _ => {}
            }
        }
        let sources = [
            output
                .avro
                .as_ref()
                .map(|a| (a.schema.is_some(), a.schema_file.is_some(), "avro")),
            output
                .key_avro
                .as_ref()
                .map(|a| (a.schema.is_some(), a.schema_file.is_some(), "key_avro")),
            output
                .protobuf
                .as_ref()
                .map(|p| (p.schema.is_some(), p.schema_file.is_some(), "protobuf")),
            output
                .json_schema
                .as_ref()
                .map(|j| (j.schema.is_some(), j.schema_file.is_some(), "json_schema")),
        ];
        for (schema, file, field) in sources.into_iter().flatten() {
            if schema == file {
                issue(
                    format!("outputs[{o}].{field}"),
                    "needs exactly one of `schema` and `schema_file`",
                );
            }
        }
        if let Some(k @ (Codec::Protobuf | Codec::JsonSchema)) = output.key_codec {
            issue(
                format!("outputs[{o}].key_codec"),
                &format!(
                    "`{}` is for values; keys are written `raw`, `json` or `avro`",
                    k.name()
                ),
            );
        }
        uses_registry
    }

    /// The job's name.
    fn validate_name(&self, issue: &mut dyn FnMut(String, &str)) {
        if !is_valid_name(&self.name) {
            issue(
                "name".into(),
                "must be 1-100 characters of [A-Za-z0-9._-]; it is part of the transactional id",
            );
        }
    }

    /// The input topics.
    fn validate_inputs(&self, issue: &mut dyn FnMut(String, &str)) {
        if self.inputs.is_empty() {
            issue("inputs".into(), "at least one input topic is needed");
        }
        for (i, input) in self.inputs.iter().enumerate() {
            if input.id_header.is_empty() {
                issue(format!("inputs[{i}].id_header"), "must not be empty");
            }
            match &input.postgres_outbox {
                None if input.topic.trim().is_empty() => {
                    issue(format!("inputs[{i}].topic"), "must not be empty");
                }
                None => {}
                Some(_) if !input.topic.is_empty() => issue(
                    format!("inputs[{i}]"),
                    "needs exactly one of `topic` and `postgres_outbox`",
                ),
                Some(outbox) => {
                    if self.inputs.len() > 1 {
                        issue(
                            format!("inputs[{i}].postgres_outbox"),
                            "must be the only input of its topology (a relay is a job of its own)",
                        );
                    }
                    if input.codec != Codec::Json {
                        issue(
                            format!("inputs[{i}].codec"),
                            "must be `json` for a `postgres_outbox` input (its payloads are JSON)",
                        );
                    }
                    for i in outbox.validate(&format!("inputs[{i}].postgres_outbox")) {
                        issue(i.path, &i.message);
                    }
                    if self.outputs.is_empty() && !self.pipeline.is_empty() {
                        issue(
                            "pipeline".into(),
                            "a relay without outputs publishes rows as they are (to `topic_prefix` + aggregate type): give outputs to transform them",
                        );
                    }
                    for (o, output) in self.outputs.iter().enumerate() {
                        if output.postgres.is_some() || output.http.is_some() {
                            issue(
                                format!("outputs[{o}]"),
                                "a relay writes Kafka topics only (`topic`)",
                            );
                        }
                    }
                }
            }
        }
    }

    /// That there are outputs; the topics and names of topic outputs.
    fn validate_outputs(&self, issue: &mut dyn FnMut(String, &str)) {
        if self.outputs.is_empty() && self.outbox().is_none() {
            issue("outputs".into(), "at least one output is needed");
        }
        let mut names = BTreeSet::new();
        for (i, output) in self.outputs.iter().enumerate() {
            let Some(topic) = &output.topic else {
                if !output.lineage {
                    issue(
                        format!("outputs[{i}].lineage"),
                        "is for Kafka topic outputs (a PostgreSQL output's inbox always records the origin)",
                    );
                }
                continue;
            };
            if topic.trim().is_empty() {
                issue(format!("outputs[{i}].topic"), "must not be empty");
            }
            if self.inputs.iter().any(|input| &input.topic == topic) {
                issue(
                    format!("outputs[{i}].topic"),
                    "must differ from every input topic (the job would consume its own output)",
                );
            }
            if !names.insert(output.name()) {
                issue(
                    format!("outputs[{i}].name"),
                    "another output has the same name (the name defaults to the topic)",
                );
            }
        }
    }

    /// The limits of a transaction and of the attempts at a record.
    fn validate_limits(&self, issue: &mut dyn FnMut(String, &str)) {
        let rt = &self.runtime;
        if rt.commit_interval_ms == 0 {
            issue("runtime.commit_interval_ms".into(), "must be at least 1");
        }
        if rt.max_records_per_txn == 0 {
            issue("runtime.max_records_per_txn".into(), "must be at least 1");
        }
        if rt.max_attempts == 0 {
            issue("runtime.max_attempts".into(), "must be at least 1");
        }
        if rt.retry_backoff_ms > rt.retry_backoff_max_ms {
            issue(
                "runtime.retry_backoff_ms".into(),
                "must not exceed runtime.retry_backoff_max_ms",
            );
        }
    }

    /// The dead-letter topic.
    fn validate_dead_letter(&self, issue: &mut dyn FnMut(String, &str)) {
        let dlq = self.dead_letter_topic();
        if self.inputs.iter().any(|i| i.topic == dlq) {
            issue(
                "dead_letter.topic".into(),
                "must differ from every input topic (failed records would come back forever)",
            );
        }
    }

    /// The transaction timeout, alone and against the commit interval.
    fn validate_transaction_timeout(&self, issue: &mut dyn FnMut(String, &str)) {
        let rt = &self.runtime;
        if rt.transaction_timeout_ms < 1000 {
            issue(
                "runtime.transaction_timeout_ms".into(),
                "must be at least 1000",
            );
        }
        if rt.transaction_timeout_ms <= rt.commit_interval_ms {
            issue(
                "runtime.transaction_timeout_ms".into(),
                "must be greater than runtime.commit_interval_ms, or every transaction times out before it commits",
            );
        } else if rt.commit_interval_ms.saturating_mul(5) > rt.transaction_timeout_ms {
            issue(
                "runtime.commit_interval_ms".into(),
                "must be at most a fifth of runtime.transaction_timeout_ms, or transactions time out before they commit",
            );
        }
    }

    /// The Kafka client settings: none that onceflow sets itself.
    fn validate_client_settings(&self, issue: &mut dyn FnMut(String, &str)) {
        for (section, map) in [
            ("common", &self.kafka.common),
            ("consumer", &self.kafka.consumer),
            ("producer", &self.kafka.producer),
        ] {
            for (key, value) in map {
                let path = format!("kafka.{section}.{key}");
                if PROTECTED_CLIENT_SETTINGS.contains(&key.as_str()) {
                    issue(
                        path,
                        "is set by onceflow for exactly-once and cannot be overridden",
                    );
                } else if section != "consumer"
                    && let Some(message) = idempotence_needs(key, value)
                {
                    issue(path, message);
                }
            }
        }
    }

    /// Checks of the pipeline that need no expression compiled: JSON-only processors on raw
    /// inputs, `route` placement, and the wiring of routes to outputs.
    fn validate_pipeline(&self, issue: &mut dyn FnMut(String, &str)) {
        let document_inputs = self.document_inputs();
        let mut routed: BTreeSet<&str> = BTreeSet::new();
        let mut routes = 0;
        for (i, p) in self.pipeline.iter().enumerate() {
            let here = format!("pipeline[{i}].{}", p.kind());
            if p.needs_json() && !document_inputs {
                issue(
                    here.clone(),
                    "works on JSON values: set `codec: json` on every input",
                );
            }
            match p {
                Processor::Route(route) => {
                    routes += 1;
                    self.validate_route(i, &here, route, &mut routed, issue);
                }
                _ => validate_processor(&here, p, issue),
            }
        }
        self.validate_routing(routes, &routed, issue);
    }

    /// The `route` processor `route`, the `i`th of the pipeline, found at `here`; adds the
    /// outputs it names to `routed`.
    fn validate_route<'a>(
        &'a self,
        i: usize,
        here: &str,
        route: &'a RouteConfig,
        routed: &mut BTreeSet<&'a str>,
        issue: &mut dyn FnMut(String, &str),
    ) {
        if i + 1 != self.pipeline.len() {
            issue(
                here.to_string(),
                "must be the last processor: it hands records to the outputs",
            );
        }
        if route.routes.is_empty() {
            issue(format!("{here}.routes"), "needs at least one route");
        }
        let mut targets: Vec<(String, &String)> = Vec::new();
        for (r, rule) in route.routes.iter().enumerate() {
            for (t, name) in rule.to.iter().enumerate() {
                targets.push((format!("{here}.routes[{r}].to[{t}]"), name));
            }
        }
        for (t, name) in route.default.iter().enumerate() {
            targets.push((format!("{here}.default[{t}]"), name));
        }
        for (path, name) in targets {
            if self.outputs.iter().any(|o| o.name() == name) {
                routed.insert(name);
            } else {
                let known: Vec<&str> = self.outputs.iter().map(Output::name).collect();
                issue(
                    path,
                    &format!("no output is named `{name}` (outputs: {known:?})"),
                );
            }
        }
        for (r, rule) in route.routes.iter().enumerate() {
            if rule.to.is_empty() {
                issue(
                    format!("{here}.routes[{r}].to"),
                    "names no output (drop records with `filter` instead)",
                );
            }
        }
    }

    /// How many `route` processors there are (`routes`), and that every output is `routed`
    /// when there is one.
    fn validate_routing(
        &self,
        routes: usize,
        routed: &BTreeSet<&str>,
        issue: &mut dyn FnMut(String, &str),
    ) {
        if routes > 1 {
            issue(
                "pipeline".into(),
                "at most one `route` processor (it must be the last one)",
            );
        }
        if routes == 0 {
            if self.outputs.len() > 1 {
                issue(
                    "outputs".into(),
                    "several outputs need a `route` processor at the end of the pipeline to say which records go where",
                );
            }
        } else {
            for (i, output) in self.outputs.iter().enumerate() {
                if !output.allow_unused && !routed.contains(output.name()) {
                    issue(
                        format!("outputs[{i}]"),
                        &format!(
                            "output `{}` is named by no route: it would stay empty (remove it, route to it, or set `allow_unused: true`)",
                            output.name()
                        ),
                    );
                }
            }
        }
    }

    /// Problems of the outputs' shapes and of every `postgres` and `http` section.
    fn validate_postgres_outputs(&self) -> Vec<ConfigIssue> {
        let mut issues = Vec::new();
        for (i, output) in self.outputs.iter().enumerate() {
            let at = format!("outputs[{i}]");
            let given = [
                output.topic.is_some(),
                output.postgres.is_some(),
                output.http.is_some(),
            ];
            if given.iter().filter(|g| **g).count() != 1 {
                issues.push(ConfigIssue {
                    path: at.clone(),
                    message: "needs exactly one of `topic`, `postgres` or `http`".into(),
                });
            }
            if let Some(http) = &output.http {
                self.validate_sink_name(
                    i,
                    "an http output needs a name of 1-100 characters of [A-Za-z0-9._-]",
                    &mut issues,
                );
                http.validate(&format!("{at}.http"), &mut issues);
            }
            let Some(pg) = &output.postgres else {
                continue;
            };
            self.validate_sink_name(i, "a postgres output needs a name of 1-100 characters of [A-Za-z0-9._-]; it keys the output's inbox, so keep it stable", &mut issues);
            // Each output applies its batch in a database transaction of its own, and all of
            // them commit together: two writing one table would wait on each other's rows.
            if self.outputs[..i].iter().any(|o| {
                o.postgres
                    .as_ref()
                    .is_some_and(|p| p.url_env == pg.url_env && p.table == pg.table)
            }) {
                issues.push(ConfigIssue {
                    path: format!("{at}.postgres.table"),
                    message: format!(
                        "another postgres output writes `{}` through `{}` too; one output per table (its `columns` can take every field needed)",
                        pg.table, pg.url_env
                    ),
                });
            }
            pg.validate(&format!("{at}.postgres"), &mut issues);
        }
        issues
    }

    /// The name of the sink output at `i`: given, valid and unique.
    fn validate_sink_name(&self, i: usize, rule: &str, issues: &mut Vec<ConfigIssue>) {
        let path = format!("outputs[{i}].name");
        match self.outputs[i].name.as_deref() {
            Some(name) if is_valid_name(name) => {
                if self.outputs[..i]
                    .iter()
                    .any(|o| o.name.as_deref() == Some(name))
                {
                    issues.push(ConfigIssue {
                        path,
                        message: format!("`{name}` names another output too"),
                    });
                }
            }
            _ => issues.push(ConfigIssue {
                path,
                message: rule.to_string(),
            }),
        }
    }
}

/// Checks of processor `p` (any but `route`, see [`Topology::validate_pipeline`]), found at
/// `here`.
fn validate_processor(here: &str, p: &Processor, issue: &mut dyn FnMut(String, &str)) {
    match p {
        Processor::SetHeader(h) => {
            if h.value.is_some() == h.expr.is_some() {
                issue(here.to_string(), "needs exactly one of `value` and `expr`");
            }
            if h.name.is_empty() {
                issue(format!("{here}.name"), "must not be empty");
            }
        }
        Processor::DropFields(fields) => {
            for (f, field) in fields.iter().enumerate() {
                if !is_field_path(field) {
                    issue(format!("{here}[{f}]"), FIELD_PATH_RULE);
                }
            }
        }
        Processor::Rename(map) => {
            for (from, to) in map {
                if !is_field_path(from) || !is_field_path(to) {
                    issue(format!("{here}.{from}"), FIELD_PATH_RULE);
                }
            }
        }
        Processor::Map(map) => {
            for field in map.keys() {
                if !is_field_path(field) {
                    issue(format!("{here}.{field}"), FIELD_PATH_RULE);
                }
            }
        }
        Processor::Explode(e) => {
            if !is_field_path(&e.field) {
                issue(format!("{here}.field"), FIELD_PATH_RULE);
            }
            if e.into.as_deref().is_some_and(|f| !is_field_path(f)) {
                issue(format!("{here}.as"), FIELD_PATH_RULE);
            }
        }
        // Stateful steps are checked with what they need of the whole topology, in
        // `Topology::validate_state`.
        Processor::Route(_)
        | Processor::Filter(_)
        | Processor::SetKey(_)
        | Processor::DropEmpty {}
        | Processor::Aggregate(_)
        | Processor::Dedupe(_)
        | Processor::Join(_)
        | Processor::Delay(_) => {}
    }
}

const FIELD_PATH_RULE: &str =
    "a field path is one or more names separated by dots, e.g. `customer.id`";

/// What the idempotent (and transactional) producer needs of a setting, when `value` does
/// not give it: every record on all in-sync replicas before it counts, and at most 5
/// requests in flight per connection, so that retries keep the order and never duplicate.
fn idempotence_needs(key: &str, value: &str) -> Option<&'static str> {
    match key {
        "acks" | "request.required.acks" if !matches!(value.trim(), "all" | "-1") => Some(
            "must be `all` (or -1): exactly-once needs every record on all in-sync replicas before it counts; leave it unset",
        ),
        "max.in.flight.requests.per.connection" | "max.in.flight"
            if value.trim().parse::<u64>().is_ok_and(|n| n > 5) =>
        {
            Some(
                "must be at most 5: more requests in flight per connection break the idempotent producer's ordering and deduplication; leave it unset",
            )
        }
        _ => None,
    }
}

pub(super) fn is_valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

#[cfg(test)]
mod tests {
    use crate::topology::*;

    #[test]
    fn every_problem_is_reported_at_once_with_its_path() {
        let text = "name: 'bad name'\ninputs: []\noutputs: [{topic: ''}]\n\
                    runtime: {commit_interval_ms: 5000, transaction_timeout_ms: 10000}\n\
                    kafka: {consumer: {isolation.level: read_uncommitted}, producer: {transactional.id: x}}\n";
        let Err(TopologyError::Invalid { issues, .. }) = Topology::parse(text, "t.yaml") else {
            panic!("expected validation errors");
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "name",
                "inputs",
                "outputs[0].topic",
                "runtime.commit_interval_ms",
                "kafka.consumer.isolation.level",
                "kafka.producer.transactional.id",
            ]
        );
    }

    #[test]
    fn routes_must_name_existing_outputs_and_use_every_output() {
        let text = "name: t\ninputs: [{topic: in, codec: json}]\n\
                    pipeline:\n  - route:\n      routes:\n        - {when: 'true', to: [a, nope]}\n      default: [b]\n\
                    outputs: [{topic: a}, {topic: b}, {topic: c}, {topic: d, allow_unused: true}]\n";
        let Err(TopologyError::Invalid { issues, .. }) = Topology::parse(text, "t.yaml") else {
            panic!("expected validation errors");
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            vec!["pipeline[0].route.routes[0].to[1]", "outputs[2]"]
        );
    }

    #[test]
    fn several_outputs_need_a_route_and_json_processors_need_json_inputs() {
        let text = "name: t\ninputs: [{topic: in}]\npipeline: [{drop_fields: [a]}]\n\
                    outputs: [{topic: a}, {topic: b}]\nruntime: {commit_interval_ms: 2000, transaction_timeout_ms: 2000}\n";
        let Err(TopologyError::Invalid { issues, .. }) = Topology::parse(text, "t.yaml") else {
            panic!("expected validation errors");
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "pipeline[0].drop_fields",
                "outputs",
                "runtime.transaction_timeout_ms"
            ]
        );
    }

    #[test]
    fn output_equal_to_input_is_refused() {
        let text = "name: t\ninputs: [{topic: a}]\noutputs: [{topic: a}]\n";
        let err = Topology::parse(text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("outputs[0].topic"), "{err}");
    }

    #[test]
    fn lineage_settings_are_checked_where_they_are_written() {
        let text = "name: t\ninputs: [{topic: in, id_header: ''}]\npipeline:\n  - route: {routes: [{when: 'true', to: [out, db]}], default: []}\noutputs:\n  - topic: out\n  - name: db\n    lineage: false\n    postgres: {url_env: U, table: t, id_columns: [id], columns: {id: id}}\n";
        let err = Topology::parse(text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("inputs[0].id_header"), "{err}");
        assert!(err.contains("outputs[1].lineage"), "{err}");
        assert!(!err.contains("outputs[0].lineage"), "{err}");
    }
}

#[cfg(test)]
mod postgres_tests {
    use crate::topology::*;

    const PG: &str = "name: t\ninputs: [{topic: in}]\noutputs:\n  - name: orders_db\n    postgres:\n      url_env: ORDERS_DB_URL\n      table: sales.orders\n      id_columns: [id]\n      version_column: version\n      columns: {id: id, version: meta.version, name: customer.name, k: $key}\n      delete_when: deleted\n";

    #[test]
    fn a_postgres_output_gets_defaults() {
        let t = Topology::parse(PG, "t.yaml").unwrap();
        assert_eq!(t.output_topics(), vec![""]);
        let (name, pg) = t.postgres_outputs().next().unwrap();
        assert_eq!(name, "orders_db");
        assert_eq!(pg.batch_size, 5_000);
        assert_eq!(pg.inbox_table, "onceflow_inbox");
        assert_eq!(pg.inbox_retention_hours, 168);
        assert_eq!(pg.columns["version"], "meta.version");
    }

    #[test]
    fn a_topic_and_a_postgres_output_go_together() {
        let text = PG.replace(
            "outputs:\n",
            "pipeline:\n  - route: {routes: [{when: 'true', to: [out, orders_db]}], default: [out]}\noutputs:\n  - topic: out\n",
        );
        let t = Topology::parse(&text, "t.yaml").unwrap();
        assert_eq!(t.output_topics(), vec!["out", ""]);
        assert_eq!(t.postgres_outputs().count(), 1);
    }

    #[test]
    fn each_output_has_one_target_and_only_topics_are_kafka_outputs() {
        let text = PG.replace(
            "outputs:\n",
            "pipeline:\n  - route: {routes: [{when: 'true', to: [out, orders_db]}], default: [out]}\noutputs:\n  - topic: out\n",
        );
        let t = Topology::parse(&text, "t.yaml").unwrap();
        assert!(matches!(t.outputs[0].target(), Some(Target::Topic("out"))));
        assert!(
            matches!(t.outputs[1].target(), Some(Target::Postgres(pg)) if pg.table == "sales.orders")
        );
        assert_eq!(t.kafka_output_topics(), vec!["out"]);

        let both = "name: t\ninputs: [{topic: in}]\noutputs:\n  - topic: a\n    postgres: {url_env: U, table: t, id_columns: [id], columns: {id: id}}\n  - {}\n";
        let t = Topology::parse_unchecked(both).unwrap();
        assert!(t.outputs.iter().all(|o| o.target().is_none()));
        assert!(t.kafka_output_topics().is_empty());
    }

    #[test]
    fn two_postgres_outputs_may_not_write_one_table() {
        let second = "  - name: again\n    postgres:\n      url_env: ORDERS_DB_URL\n      table: sales.orders\n      id_columns: [id]\n      columns: {id: id}\n";
        let text = format!("{PG}{second}").replace(
            "outputs:\n",
            "pipeline:\n  - route: {routes: [{when: 'true', to: [orders_db, again]}], default: [again]}\noutputs:\n",
        );
        let issues = Topology::parse(&text, "t.yaml").unwrap_err().to_string();
        assert!(
            issues.contains(
                "outputs[1].postgres.table: another postgres output writes `sales.orders`"
            ),
            "{issues}"
        );
    }

    #[test]
    fn every_postgres_problem_is_reported_with_its_path() {
        let text = "name: t\ninputs: [{topic: in}]\noutputs:\n  - topic: a\n    postgres: {url_env: U, table: t, id_columns: [id], columns: {id: id}}\n  - {}\n  - topic: b\n  - postgres:\n      url_env: 'no way'\n      table: 'a.b.c'\n      id_columns: [id, x, id]\n      version_column: v\n      columns: {id: id, n: $nope, $bad: x}\n      increment_columns: [n, id]\n      batch_size: 0\n      event_id: {field: ''}\n";
        let Err(TopologyError::Invalid { issues, .. }) = Topology::parse(text, "t.yaml") else {
            panic!("expected validation errors");
        };
        let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "outputs",
                "outputs[0]",
                "outputs[0].name",
                "outputs[1]",
                "outputs[3].name",
                "outputs[3].postgres.url_env",
                "outputs[3].postgres.table",
                "outputs[3].postgres.columns.$bad",
                "outputs[3].postgres.columns.n",
                "outputs[3].postgres.id_columns[1]",
                "outputs[3].postgres.id_columns[2]",
                "outputs[3].postgres.version_column",
                "outputs[3].postgres.increment_columns[1]",
                "outputs[3].postgres.increment_columns",
                "outputs[3].postgres.event_id.field",
                "outputs[3].postgres.batch_size",
            ],
            "{issues:#?}"
        );
    }

    #[test]
    fn a_sequence_column_is_mapped_and_orders_alone() {
        let base = "name: t\ninputs: [{topic: in}]\noutputs:\n  - name: db\n    postgres:\n      url_env: U\n      table: t\n      id_columns: [id]\n      columns: {id: id, seq: seq, n: n}\n";
        let ok = format!("{base}      sequence_column: seq\n      on_sequence_gap: dead_letter\n");
        let t = Topology::parse(&ok, "t.yaml").unwrap();
        let (_, pg) = t.postgres_outputs().next().unwrap();
        assert_eq!(pg.ordering_column(), Some("seq"));
        assert_eq!(pg.on_sequence_gap(), postgres::OnSequenceGap::DeadLetter);
        let issues = |extra: &str| -> Vec<String> {
            match Topology::parse(&format!("{base}{extra}"), "t.yaml") {
                Err(TopologyError::Invalid { issues, .. }) => {
                    issues.iter().map(|i| i.path.clone()).collect()
                }
                other => panic!("expected validation errors: {other:?}"),
            }
        };
        let at = "outputs[0].postgres";
        assert_eq!(
            issues("      sequence_column: seq\n      version_column: n\n"),
            vec![format!("{at}.sequence_column")]
        );
        assert_eq!(
            issues("      sequence_column: nope\n      increment_columns: [n]\n"),
            vec![
                format!("{at}.sequence_column"),
                format!("{at}.sequence_column")
            ]
        );
        assert_eq!(
            issues("      sequence_column: id\n"),
            vec![format!("{at}.sequence_column")]
        );
        assert_eq!(
            issues("      on_sequence_gap: fail\n"),
            vec![format!("{at}.on_sequence_gap")]
        );
        let bad = Topology::parse(
            &format!("{base}      sequence_column: seq\n      on_sequence_gap: skip\n"),
            "t.yaml",
        );
        assert!(bad.is_err());
    }

    #[test]
    fn the_example_topology_is_valid() {
        let text = include_str!("../../topologies/orders-postgres.yaml");
        let t = Topology::parse(text, "topologies/orders-postgres.yaml").unwrap();
        assert_eq!(t.output_topics(), vec!["orders.enriched", ""]);
        assert_eq!(t.postgres_outputs().count(), 1);
    }

    #[test]
    fn postgres_output_names_must_be_unique() {
        let text = format!(
            "{PG}  - name: orders_db\n    postgres: {{url_env: U, table: t, id_columns: [id], columns: {{id: id}}}}\n"
        );
        let err = Topology::parse(&text, "t.yaml").unwrap_err().to_string();
        assert!(err.contains("outputs[1].name"), "{err}");
    }
}

#[cfg(test)]
mod avro_tests {
    use crate::topology::*;

    fn issues(yaml: &str) -> Vec<(String, String)> {
        Topology::parse_unchecked(yaml)
            .unwrap()
            .validate()
            .into_iter()
            .map(|i| (i.path, i.message))
            .collect()
    }

    #[test]
    fn avro_settings_are_checked_where_they_are_written() {
        let found = issues(
            "name: t\ninputs: [{topic: in, codec: json, avro: {}}]\noutputs:\n  - {topic: a, codec: avro}\n  - {topic: b, key_avro: {schema: '\"string\"'}}\n  - {name: db, postgres: {url_env: U, table: t, id_columns: [id], columns: {id: id}}, codec: avro, avro: {schema: '\"string\"', schema_file: x.avsc}}\n",
        );
        let paths: Vec<&str> = found.iter().map(|(p, _)| p.as_str()).collect();
        for expected in [
            "inputs[0].avro",
            "outputs[0].avro",
            "outputs[1].key_avro",
            "outputs[2].avro",
            "outputs[2].codec",
            "schema_registry",
        ] {
            assert!(paths.contains(&expected), "{expected} not in {found:?}");
        }
        let registry = issues(
            "name: t\nschema_registry: {url: 'registry:8081', password: p}\ninputs: [{topic: in, codec: avro}]\noutputs: [{topic: out}]\n",
        );
        let paths: Vec<&str> = registry.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["schema_registry.url", "schema_registry.password"]);
    }
}
