//! `onceflow deploy render`: the Kubernetes manifests of one job per topology, derived from
//! the topology itself. Pure: a topology (and the text and files it was read from) in,
//! manifest documents out.
//!
//! * a StatefulSet: the pod name is the instance id, stable across restarts, so a restarted
//!   pod fences its own zombie (same `transactional.id`) and static membership hands its
//!   partitions back without a rebalance; `terminationGracePeriodSeconds` is the job's own
//!   stop grace ([`crate::supervise::stop_grace`]) plus a margin, so Kubernetes never
//!   SIGKILLs a stop that is committing;
//! * a ConfigMap with the topology file and the schema files it names;
//! * a headless Service (the StatefulSet's) and a metrics Service;
//! * a PodDisruptionBudget of one pod at a time;
//! * every `${VAR}` of the topology and every `url_env` it names, from a Secret named
//!   `<job>-env` (a variable with a default is optional there).

use std::collections::BTreeSet;

use serde_json::{Value as Json, json};

use crate::topology::Topology;
use crate::topology::env::{self, Strictness};

/// What the manifests are made for.
#[derive(Debug, Clone)]
pub struct RenderOptions {
    pub replicas: u32,
    pub image: String,
    pub namespace: Option<String>,
    /// `ONCEFLOW_BOOTSTRAP_SERVERS` of the pods.
    pub bootstrap_servers: String,
}

/// The port of `/metrics`, `/healthz` and `/readyz` in the pods.
pub const METRICS_PORT: u16 = 9090;

/// Where the ConfigMap is mounted.
const CONFIG_DIR: &str = "/etc/onceflow/job";

/// The working directory of the pods of a topology with disk state: a relative
/// `runtime.state_dir` is below it, on the pod's own volume.
const STATE_HOME: &str = "/var/lib/onceflow";

/// The size each pod's state volume asks for.
const STATE_VOLUME_SIZE: &str = "10Gi";

/// Resource requests, from the benchmark (docs/benchmarks.md, 1 KiB records): exactly-once
/// peaked at 244-408 MiB of RSS from 1 to 64 partitions on a fast broker and at 252-436 MiB
/// on a slow one (the producer's queue holds what the broker has not taken yet; freed memory
/// is kept for reuse), and used 4.3-5.9 us of CPU per record: 0.6-0.8 of a core at the
/// 135,000-183,000 records/s one instance reached on a 2-core machine. The request is half a
/// core, for a job that runs below its peak most of the time; the memory limit leaves room
/// for a producer queue deeper than the benchmark's and the consumer's prefetch (64 MiB).
const CPU_REQUEST: &str = "500m";
const MEMORY_REQUEST: &str = "512Mi";
const MEMORY_LIMIT: &str = "1Gi";

/// The job's name as a Kubernetes object name (DNS-1123: lower case, `-` for `_` and `.`).
pub fn object_name(topology_name: &str) -> Result<String, String> {
    let name: String = topology_name
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let name = name.trim_matches('-').to_string();
    // Pod names append `-<ordinal>`, and the controller a revision hash to the StatefulSet's.
    if name.is_empty() || name.len() > 52 {
        return Err(format!(
            "the topology name `{topology_name}` does not make a Kubernetes name of 1-52 characters"
        ));
    }
    Ok(name)
}

/// The variables the pods need: every `${VAR}` of `text` (with whether it has a default),
/// and every `url_env` of the topology.
pub fn variables(topology: &Topology, text: &str) -> Vec<(String, bool)> {
    let seen = std::cell::RefCell::new(BTreeSet::new());
    let (_, issues) = env::interpolate(
        text,
        &|name| {
            seen.borrow_mut().insert(name.to_string());
            None
        },
        Strictness::Strict,
    );
    // Without a value, a variable without default is an issue; with a default it is not.
    let required: BTreeSet<String> = issues.into_iter().map(|i| i.variable).collect();
    let mut out: Vec<(String, bool)> = seen
        .into_inner()
        .into_iter()
        .map(|n| {
            let optional = !required.contains(&n);
            (n, optional)
        })
        .collect();
    let mut url_envs: Vec<String> = Vec::new();
    for input in &topology.inputs {
        if let Some(o) = &input.postgres_outbox {
            url_envs.push(o.url_env.clone());
        }
    }
    for output in &topology.outputs {
        if let Some(p) = &output.postgres {
            url_envs.push(p.url_env.clone());
        }
        if let Some(crate::topology::http::Dedup::Postgres(pg)) =
            output.http.as_ref().and_then(|h| h.dedup.as_ref())
        {
            url_envs.push(pg.url_env.clone());
        }
    }
    for name in url_envs {
        if !out.iter().any(|(n, _)| *n == name) {
            out.push((name, false));
        }
    }
    out
}

/// The schema files the topology names (paths relative to it), for the ConfigMap.
pub fn schema_files(topology: &Topology) -> Vec<String> {
    let mut files = BTreeSet::new();
    for input in &topology.inputs {
        if let Some(f) = input
            .avro
            .as_ref()
            .and_then(|a| a.reader_schema_file.clone())
        {
            files.insert(f);
        }
    }
    for output in &topology.outputs {
        for a in [&output.avro, &output.key_avro].into_iter().flatten() {
            if let Some(f) = &a.schema_file {
                files.insert(f.clone());
            }
        }
        if let Some(p) = &output.protobuf {
            files.extend(p.schema_file.iter().cloned());
            files.extend(p.imports.values().cloned());
        }
        if let Some(j) = &output.json_schema {
            files.extend(j.schema_file.iter().cloned());
        }
    }
    files.into_iter().collect()
}

/// The SHA-256 of a ConfigMap's data (its keys in order), in hex.
fn config_checksum(data: &serde_json::Map<String, Json>) -> String {
    openssl::sha::sha256(Json::Object(data.clone()).to_string().as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A ConfigMap key for a file path (keys cannot hold `/`).
fn key_of(path: &str) -> String {
    path.replace('/', "__")
}

/// `terminationGracePeriodSeconds` of the pods: the job's own stop grace plus a margin.
fn termination_grace(topology: &Topology) -> u64 {
    crate::supervise::stop_grace(topology).as_secs() + 15
}

/// What the Helm chart (deploy/helm/onceflow) needs of a topology to make the objects
/// [`render`] makes, as its values: the files of the ConfigMap and what render derives from
/// the topology (the variables, the grace period, the state volume's mount), so that the
/// chart derives nothing itself. `scripts/check-deploy` holds the chart's objects equal to
/// render's for every example topology.
pub fn chart_values(
    topology: &Topology,
    file_name: &str,
    text: &str,
    files: &[(String, String)],
) -> Result<Json, String> {
    let name = object_name(&topology.name)?;
    let variables: Vec<Json> = variables(topology, text)
        .into_iter()
        .map(|(name, optional)| json!({ "name": name, "optional": optional }))
        .collect();
    let mut job = json!({
        "file": file_name,
        "config": text,
        "variables": variables,
        "terminationGracePeriodSeconds": termination_grace(topology),
    });
    if !files.is_empty() {
        let files: Vec<Json> = files
            .iter()
            .map(|(path, content)| json!({ "path": path, "key": key_of(path), "content": content }))
            .collect();
        job["files"] = json!(files);
    }
    if let Some(mount) = state_mount(topology) {
        job["stateDir"] = json!(mount);
    }
    Ok(json!({ "topologies": { name: job } }))
}

/// The manifests of `topology`, read from `file_name` with `text`; `files` are the schema
/// files it names, with their contents.
pub fn render(
    topology: &Topology,
    file_name: &str,
    text: &str,
    files: &[(String, String)],
    options: &RenderOptions,
) -> Result<Vec<Json>, String> {
    let name = object_name(&topology.name)?;
    let labels = json!({
        "app.kubernetes.io/name": "onceflow",
        "app.kubernetes.io/instance": name,
    });
    let metadata = |object: &str| {
        let mut m = json!({ "name": object, "labels": labels });
        if let Some(ns) = &options.namespace {
            m["namespace"] = json!(ns);
        }
        m
    };
    let (data, items) = config_files(file_name, text, files);
    let checksum = config_checksum(&data);
    let env = pod_env(topology, text, &name, options);
    let pod = pod_spec(topology, &name, file_name, env, items, options);
    let selector = json!({ "matchLabels": labels });
    let config_map = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(&format!("{name}-topology")),
        "data": data,
    });
    let mut stateful_set = json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(&name),
        "spec": {
            "serviceName": name,
            "replicas": options.replicas,
            // Instances are peers: start and stop them together, not one after the other.
            "podManagementPolicy": "Parallel",
            "selector": selector,
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        // The pods roll when the ConfigMap changes: its content is part of
                        // the pod template.
                        "onceflow.io/config-sha256": checksum,
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": METRICS_PORT.to_string(),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod,
            },
        },
    });
    if state_mount(topology).is_some() {
        // Each pod keeps its stores on a volume of its own, across restarts: a restarted
        // pod restores only the changelogs' tail.
        stateful_set["spec"]["volumeClaimTemplates"] = json!([{
            "metadata": { "name": "state" },
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": { "requests": { "storage": STATE_VOLUME_SIZE } },
            },
        }]);
    }
    let headless = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(&name),
        "spec": {
            "clusterIP": "None",
            "selector": labels,
            "ports": [{ "name": "metrics", "port": METRICS_PORT, "targetPort": "metrics" }],
        },
    });
    // Its own label, for a ServiceMonitor to pick this Service and not the headless one.
    let mut metrics_metadata = metadata(&format!("{name}-metrics"));
    metrics_metadata["labels"]["app.kubernetes.io/component"] = json!("metrics");
    let metrics = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metrics_metadata,
        "spec": {
            "selector": labels,
            "ports": [{ "name": "metrics", "port": METRICS_PORT, "targetPort": "metrics" }],
        },
    });
    let budget = json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(&name),
        "spec": { "maxUnavailable": 1, "selector": selector },
    });
    Ok(vec![config_map, stateful_set, headless, metrics, budget])
}

/// The ConfigMap's data (the topology file and the schema files it names, each under its
/// key) and the items that mount them at their paths.
fn config_files(
    file_name: &str,
    text: &str,
    files: &[(String, String)],
) -> (serde_json::Map<String, Json>, Vec<Json>) {
    let mut data = serde_json::Map::new();
    data.insert(file_name.to_string(), json!(text));
    let mut items = vec![json!({ "key": file_name, "path": file_name })];
    for (path, content) in files {
        data.insert(key_of(path), json!(content));
        items.push(json!({ "key": key_of(path), "path": path }));
    }
    (data, items)
}

/// The environment of the pods: onceflow's own variables, then every variable the topology
/// needs, from the Secret `<name>-env`.
fn pod_env(topology: &Topology, text: &str, name: &str, options: &RenderOptions) -> Vec<Json> {
    let secret = format!("{name}-env");
    let mut env = vec![
        json!({ "name": "ONCEFLOW_INSTANCE_ID", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } }),
        json!({ "name": "ONCEFLOW_BOOTSTRAP_SERVERS", "value": options.bootstrap_servers }),
        json!({ "name": "ONCEFLOW_METRICS_ADDR", "value": format!("0.0.0.0:{METRICS_PORT}") }),
        json!({ "name": "ONCEFLOW_LOG_JSON", "value": "true" }),
    ];
    for (var, optional) in variables(topology, text) {
        env.push(json!({
            "name": var,
            "valueFrom": { "secretKeyRef": { "name": secret, "key": var, "optional": optional } },
        }));
    }
    env
}

/// Where a topology's disk stores go in its pods (the state volume's mount), when it keeps
/// state on disk: `runtime.state_dir`, below [`STATE_HOME`] when relative.
fn state_mount(topology: &Topology) -> Option<String> {
    let runtime = &topology.runtime;
    if topology.stores().next().is_none()
        || runtime.state_store != crate::topology::StateStore::Disk
    {
        return None;
    }
    let dir = std::path::Path::new(STATE_HOME).join(&runtime.state_dir);
    Some(dir.display().to_string())
}

/// The pod of the StatefulSet: one onceflow container running `file_name` from the
/// ConfigMap `<name>-topology` (mounted with `items`), with `env`, and with disk state its
/// volume.
fn pod_spec(
    topology: &Topology,
    name: &str,
    file_name: &str,
    env: Vec<Json>,
    items: Vec<Json>,
    options: &RenderOptions,
) -> Json {
    let grace = termination_grace(topology);
    let mut pod = json!({
        "terminationGracePeriodSeconds": grace,
        // Pod Security "restricted": non-root, the runtime's default seccomp profile, and
        // (on the container) no privilege escalation and no capabilities.
        "securityContext": {
            "runAsNonRoot": true,
            "runAsUser": 10001,
            "runAsGroup": 10001,
            "seccompProfile": { "type": "RuntimeDefault" },
        },
        "containers": [{
            "name": "onceflow",
            "image": options.image,
            "args": ["run", format!("{CONFIG_DIR}/{file_name}")],
            "env": env,
            "ports": [{ "name": "metrics", "containerPort": METRICS_PORT }],
            "livenessProbe": {
                "httpGet": { "path": "/healthz", "port": "metrics" },
                "periodSeconds": 10,
                "failureThreshold": 3,
            },
            "readinessProbe": {
                "httpGet": { "path": "/readyz", "port": "metrics" },
                "periodSeconds": 5,
                "failureThreshold": 3,
            },
            "resources": {
                "requests": { "cpu": CPU_REQUEST, "memory": MEMORY_REQUEST },
                "limits": { "memory": MEMORY_LIMIT },
            },
            "securityContext": {
                "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true,
                "capabilities": { "drop": ["ALL"] },
            },
            "volumeMounts": [{ "name": "job", "mountPath": CONFIG_DIR, "readOnly": true }],
        }],
        "volumes": [{
            "name": "job",
            "configMap": { "name": format!("{name}-topology"), "items": items },
        }],
    });
    if let Some(mount) = state_mount(topology) {
        let container = &mut pod["containers"][0];
        container["workingDir"] = json!(STATE_HOME);
        if let Some(mounts) = container["volumeMounts"].as_array_mut() {
            mounts.push(json!({ "name": "state", "mountPath": mount }));
        }
    }
    pod
}

/// The chart's values ([`chart_values`]) as a YAML file, with a header saying how they were
/// made.
pub fn values_to_yaml(values: &Json, command: &str) -> Result<String, String> {
    let mut out = format!(
        "# Generated by `{command}`: values of the chart deploy/helm/onceflow (helm install -f);\n\
         # edit the topology and render again.\n"
    );
    out.push_str(&serde_saphyr::to_string(values).map_err(|e| e.to_string())?);
    Ok(out)
}

/// The documents as one YAML stream, with a header saying how they were made.
pub fn to_yaml(documents: &[Json], command: &str) -> Result<String, String> {
    let mut out = format!(
        "# Generated by `{command}`: edit the topology (or the options) and render again.\n"
    );
    for d in documents {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(d).map_err(|e| e.to_string())?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(yaml: &str) -> Topology {
        Topology::parse_unchecked(yaml).unwrap()
    }

    #[test]
    fn a_topology_with_disk_state_gets_a_volume_per_pod_at_its_state_dir() {
        let stateful = "name: totals\ninputs: [{topic: in, codec: json}]\npipeline: [{aggregate: {name: n, op: count}}]\noutputs: [{topic: out}]\n";
        let docs = render_of(stateful);
        let set = &docs[1];
        assert_eq!(
            set["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
            "state"
        );
        let container = &set["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["workingDir"], STATE_HOME);
        assert_eq!(
            container["volumeMounts"][1],
            json!({ "name": "state", "mountPath": "/var/lib/onceflow/onceflow-state" })
        );
        let absolute = render_of(&format!("{stateful}runtime: {{state_dir: /data/state}}\n"));
        assert_eq!(
            absolute[1]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][1]["mountPath"],
            "/data/state"
        );
        for stateless in [
            "name: t\ninputs: [{topic: in}]\noutputs: [{topic: out}]\n".to_string(),
            format!("{stateful}runtime: {{state_store: memory}}\n"),
        ] {
            let docs = render_of(&stateless);
            assert!(docs[1]["spec"].get("volumeClaimTemplates").is_none());
        }
    }

    fn render_of(yaml: &str) -> Vec<Json> {
        let options = RenderOptions {
            replicas: 3,
            image: "onceflow:test".into(),
            namespace: None,
            bootstrap_servers: "kafka:9092".into(),
        };
        render(&topology(yaml), "t.yaml", yaml, &[], &options).expect("render")
    }

    #[test]
    fn the_charts_values_carry_what_render_derives() {
        let text = "name: Totals\ninputs: [{topic: '${IN:-in}', codec: json}]\npipeline: [{aggregate: {name: n, op: count}}]\noutputs: [{topic: out}]\nruntime: {transaction_timeout_ms: 30000}\n";
        let files = [("schemas/a.avsc".to_string(), "{}".to_string())];
        let values = chart_values(&topology(text), "t.yaml", text, &files).unwrap();
        let job = &values["topologies"]["totals"];
        assert_eq!(job["file"], "t.yaml");
        assert_eq!(job["config"], text);
        assert_eq!(
            job["variables"],
            json!([{ "name": "IN", "optional": true }])
        );
        assert_eq!(job["terminationGracePeriodSeconds"], 75);
        assert_eq!(job["stateDir"], "/var/lib/onceflow/onceflow-state");
        assert_eq!(
            job["files"],
            json!([{ "path": "schemas/a.avsc", "key": "schemas__a.avsc", "content": "{}" }])
        );
        let yaml = values_to_yaml(&values, "onceflow deploy render t.yaml --values").unwrap();
        assert!(yaml.starts_with("# Generated by"));
    }

    #[test]
    fn names_become_kubernetes_names() {
        assert_eq!(object_name("Orders_By.Status").unwrap(), "orders-by-status");
        assert!(object_name("___").is_err());
        assert!(object_name(&"a".repeat(60)).is_err());
    }

    #[test]
    fn every_variable_and_url_env_comes_from_the_secret() {
        let text = "name: ${JOB:-j}\ninputs: [{topic: '${IN}'}]\noutputs:\n  - name: db\n    postgres: {url_env: ORDERS_DB_URL, table: t, id_columns: [id], columns: {id: 'value.id'}}\n";
        let t = topology(text);
        assert_eq!(
            variables(&t, text),
            vec![
                ("IN".to_string(), false),
                ("JOB".to_string(), true),
                ("ORDERS_DB_URL".to_string(), false)
            ]
        );
    }

    #[test]
    fn the_grace_period_outlasts_the_jobs_own_stop() {
        let text = "name: j\ninputs: [{topic: a}]\noutputs: [{topic: b}]\nruntime: {transaction_timeout_ms: 30000}\n";
        let t = topology(text);
        let options = RenderOptions {
            replicas: 3,
            image: "onceflow:1".into(),
            namespace: Some("streams".into()),
            bootstrap_servers: "kafka:9092".into(),
        };
        let docs = render(&t, "j.yaml", text, &[], &options).unwrap();
        let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "ConfigMap",
                "StatefulSet",
                "Service",
                "Service",
                "PodDisruptionBudget"
            ]
        );
        let pod = &docs[1]["spec"]["template"]["spec"];
        // The job gives up its stop after 2 x 30 s; Kubernetes waits 15 s more.
        assert_eq!(pod["terminationGracePeriodSeconds"], 75);
        assert_eq!(docs[1]["spec"]["replicas"], 3);
        assert_eq!(docs[1]["metadata"]["namespace"], "streams");
        assert_eq!(
            pod["containers"][0]["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.name"
        );
        assert_eq!(docs[0]["data"]["j.yaml"], text);
        assert!(
            to_yaml(&docs, "onceflow deploy render j.yaml")
                .unwrap()
                .contains("kind: PodDisruptionBudget")
        );
    }

    /// Pod Security Standards, "restricted" profile (Kubernetes 1.30): every control it
    /// checks, on the pods of a stateless and of a stateful job.
    #[test]
    fn the_pods_pass_pod_security_restricted() {
        let stateless = "name: a\ninputs: [{topic: i}]\noutputs: [{topic: o}]\n";
        let stateful = "name: b\ninputs: [{topic: i, codec: json}]\npipeline:\n  - dedupe: {name: d, id: value.id}\noutputs: [{topic: o}]\n";
        for yaml in [stateless, stateful] {
            let docs = render_of(yaml);
            let set = docs
                .iter()
                .find(|d| d["kind"] == "StatefulSet")
                .expect("a StatefulSet");
            let pod = &set["spec"]["template"]["spec"];
            for host in ["hostNetwork", "hostPID", "hostIPC", "hostUsers"] {
                assert!(pod[host].is_null() || pod[host] == false, "{host}");
            }
            assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
            assert_ne!(pod["securityContext"]["runAsUser"], 0);
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"],
                "RuntimeDefault"
            );
            // Volume types the profile allows.
            for v in pod["volumes"].as_array().expect("volumes") {
                let kinds: Vec<&String> = v
                    .as_object()
                    .expect("a volume")
                    .keys()
                    .filter(|k| *k != "name")
                    .collect();
                assert!(
                    kinds.iter().all(|k| [
                        "configMap",
                        "emptyDir",
                        "projected",
                        "secret",
                        "persistentVolumeClaim",
                        "downwardAPI",
                        "ephemeral",
                        "csi"
                    ]
                    .contains(&k.as_str())),
                    "{v}"
                );
            }
            for c in pod["containers"].as_array().expect("containers") {
                let sc = &c["securityContext"];
                assert!(sc["privileged"].is_null() || sc["privileged"] == false);
                assert_eq!(sc["allowPrivilegeEscalation"], false);
                assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
                assert!(sc["capabilities"]["add"].is_null());
                assert!(
                    c["ports"]
                        .as_array()
                        .is_none_or(|p| p.iter().all(|p| p["hostPort"].is_null()))
                );
                assert!(sc["runAsUser"].is_null() || sc["runAsUser"] != 0);
            }
        }
    }

    #[test]
    fn a_changed_topology_rolls_the_pods() {
        let checksum = |yaml: &str| {
            render_of(yaml)
                .iter()
                .find(|d| d["kind"] == "StatefulSet")
                .expect("a StatefulSet")["spec"]["template"]["metadata"]["annotations"]
                ["onceflow.io/config-sha256"]
                .as_str()
                .expect("the checksum")
                .to_string()
        };
        let a = checksum("name: a\ninputs: [{topic: i}]\noutputs: [{topic: o}]\n");
        let b = checksum("name: a\ninputs: [{topic: i}]\noutputs: [{topic: o2}]\n");
        assert_eq!(a.len(), 64);
        assert_ne!(a, b);
        assert_eq!(
            a,
            checksum("name: a\ninputs: [{topic: i}]\noutputs: [{topic: o}]\n")
        );
    }
}
