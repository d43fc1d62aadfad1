//! A cell's processes started: a ceiling client (this bench's own binary with `--client`),
//! the Kafka Streams peer, or onceflow instances (`onceflow run` on a topology written for
//! the cell).

use std::path::Path;
use std::process::Command;

use super::CellCtx;
use crate::BenchError;
use crate::client::CLIENT_READY;
use crate::kstreams::java;
use crate::plan::{Kind, Spec, Workload};
use crate::procs::Proc;

impl CellCtx<'_> {
    /// Starts the cell's processes (not yet processing: they report readiness).
    pub(super) fn launch(
        &self,
        spec: Spec,
        output: &str,
        probe: &str,
        dir: &Path,
    ) -> Result<Vec<Proc>, BenchError> {
        let name = format!(
            "bench-{}-p{}-{}-r{}",
            self.run_id,
            self.partitions,
            spec.label(),
            self.round
        );
        match spec.kind {
            Kind::Produce => self.client(
                spec,
                &[
                    "--client",
                    "produce",
                    "--client-topic",
                    output,
                    "--records",
                    &self.records.to_string(),
                ],
            ),
            Kind::Rpw => self.client(
                spec,
                &[
                    "--client",
                    "rpw",
                    "--client-topic",
                    self.input,
                    "--client-output",
                    output,
                    "--partitions",
                    &self.partitions.to_string(),
                ],
            ),
            Kind::ProducerPerf | Kind::ConsumerPerf => Err(BenchError::Other(
                "a cross-check is not a timed cell".into(),
            )),
            Kind::KStreams => self.kstreams(spec, &name, output, probe, dir),
            Kind::Alos | Kind::Eos | Kind::EosOverlap => {
                self.onceflow(spec, &name, output, probe, dir)
            }
        }
    }

    /// A ceiling client: this bench's own binary with `--client`.
    fn client(&self, spec: Spec, args: &[&str]) -> Result<Vec<Proc>, BenchError> {
        let cfg = self.cfg;
        let mut cmd = Command::new(&cfg.client_bin);
        cmd.args(args)
            .args(["--bootstrap-servers", self.bootstrap])
            .args(["--record-size", &cfg.record_size.to_string()])
            .args(["--linger-ms", &cfg.tuning.linger_ms.to_string()])
            .args(["--batch-size", &cfg.tuning.batch_size.to_string()]);
        Proc::spawn(&spec.label(), cmd, CLIENT_READY).map(|p| vec![p])
    }

    /// The Kafka Streams peer, one thread.
    fn kstreams(
        &self,
        spec: Spec,
        name: &str,
        output: &str,
        probe: &str,
        dir: &Path,
    ) -> Result<Vec<Proc>, BenchError> {
        let cfg = self.cfg;
        let commit_ms = spec.commit_ms.unwrap_or(100);
        let libs = self
            .kstreams_libs
            .ok_or_else(|| BenchError::Other("Kafka Streams libraries not fetched".into()))?;
        let mut cmd = Command::new(java());
        cmd.args(&cfg.java_opts)
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .arg("-cp")
            .arg(format!("{}/*", libs.display()))
            .arg(cfg.repo_dir()?.join("benches/kstreams/Bench.java"))
            .args(["--bootstrap-servers", self.bootstrap])
            .args(["--application-id", name])
            .args(["--input", self.input, "--probe-input", probe])
            .args(["--output", output])
            .args(["--commit-interval-ms", &commit_ms.to_string()])
            .args(["--threads", "1"])
            .args(["--linger-ms", &cfg.tuning.linger_ms.to_string()])
            .args(["--batch-size", &cfg.tuning.batch_size.to_string()])
            .args(["--workload", workload_name(cfg.workload)])
            .arg("--state-dir")
            .arg(dir.join("state"));
        Ok(vec![Proc::spawn(
            "Kafka Streams",
            cmd,
            "onceflow-bench: running",
        )?])
    }

    /// onceflow's instances, `onceflow run` on a topology written for the cell.
    fn onceflow(
        &self,
        spec: Spec,
        name: &str,
        output: &str,
        probe: &str,
        dir: &Path,
    ) -> Result<Vec<Proc>, BenchError> {
        let cfg = self.cfg;
        let commit_ms = spec.commit_ms.unwrap_or(100);
        let guarantee = if spec.kind == Kind::Alos {
            "at_least_once"
        } else {
            "exactly_once"
        };
        let overlap = spec.kind == Kind::EosOverlap;
        // Counting by key: one input (a store is kept per partition of it), the count as
        // the value, the store on disk in the cell's folder.
        let (inputs, pipeline, state) = match cfg.workload {
            Workload::PassThrough => (
                format!("{}, {{topic: {probe}}}", topic(self.input)),
                "",
                String::new(),
            ),
            Workload::CountByKey => (
                topic(self.input),
                "pipeline: [{aggregate: {name: counts, op: count}}]\n",
                format!("  state_dir: {}\n", dir.join("state").display()),
            ),
        };
        // The commit interval alone decides when a transaction commits, as in Kafka Streams.
        let yaml = format!(
            "name: {name}\ninputs: [{inputs}]\n{pipeline}outputs: [{{topic: {output}}}]\n\
             runtime:\n{state}  guarantee: {guarantee}\n  commit_interval_ms: {commit_ms}\n  \
             overlap_commits: {overlap}\n  \
             max_records_per_txn: 100000000\n  max_bytes_per_txn: 100000000000\n  \
             transaction_timeout_ms: {timeout}\n  session_timeout_ms: 10000\n\
             kafka:\n  producer:\n    linger.ms: '{linger}'\n    batch.size: '{batch}'\n",
            timeout = (commit_ms * 10).max(10_000),
            linger = cfg.tuning.linger_ms,
            batch = cfg.tuning.batch_size,
        );
        let topology = dir.join("topology.yaml");
        std::fs::write(&topology, yaml).map_err(BenchError::io(topology.display()))?;
        (0..spec.instances)
            .map(|i| {
                let mut cmd = Command::new(&cfg.onceflow_bin);
                cmd.arg("run")
                    .arg(&topology)
                    .args(["--bootstrap-servers", self.bootstrap])
                    .args(["--instance-id", &format!("i{i}")])
                    .args(["--progress-interval", "0"])
                    .arg("--summary-json")
                    .arg(dir.join(format!("summary-{i}.json")))
                    .env("RUST_LOG", "onceflow=info")
                    .env("NO_COLOR", "1");
                Proc::spawn(
                    &format!("onceflow instance i{i}"),
                    cmd,
                    "partitions assigned",
                )
            })
            .collect()
    }
}

/// A topic in a topology's `inputs`.
fn topic(name: &str) -> String {
    format!("{{topic: {name}}}")
}

/// The workload as the Kafka Streams peer's `--workload` names it.
fn workload_name(w: Workload) -> &'static str {
    match w {
        Workload::PassThrough => "pass-through",
        Workload::CountByKey => "count-by-key",
    }
}
