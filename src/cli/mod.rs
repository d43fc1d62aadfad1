//! The command line: one file per command. `main.rs` only parses the arguments and calls
//! [`main`]; each command turns its arguments into calls of the library and an exit status.

mod completions;
mod deploy;
mod dlq;
mod man;
mod probe;
mod reconcile;
mod run;
mod schema;
mod test;
mod txn;
mod validate;

use std::path::Path;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::load::Diagnostic;
use crate::topology::Topology;
use crate::topology::env::Strictness;

#[derive(Parser)]
#[command(
    name = "onceflow",
    version,
    about = "Exactly-once stream jobs for Apache Kafka"
)]
pub struct Cli {
    /// Log as JSON lines instead of human-readable text.
    #[arg(long, global = true, env = "ONCEFLOW_LOG_JSON")]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a topology until SIGTERM/SIGINT. Without any broker given, runs it once on an
    /// embedded cluster over generated records.
    Run(run::RunArgs),
    /// Inspect or replay a dead-letter topic.
    Dlq {
        #[command(subcommand)]
        command: dlq::DlqCommand,
    },
    /// Check topology files: environment variables, fields, expressions, wiring and the
    /// settings exactly-once depends on. Every problem is printed with its field path and
    /// line. Exit status 0 when every file is clean, 1 when one has a problem, 2 when a check
    /// could not be made (a file unreadable, no answer from the brokers).
    Validate(validate::ValidateArgs),
    /// Run a topology's pipeline in-process over the records of a cases file (no broker) and
    /// compare every output with what the cases expect.
    Test(test::TestArgs),
    /// Prove that a finished or paused run's outputs agree with what it consumed: per input
    /// partition consumed, produced, filtered, dead-lettered, missing and duplicated records
    /// (by the lineage headers every output carries), PostgreSQL outputs through their inbox,
    /// and a marker per output partition that no hanging transaction holds back. Exit status
    /// 0 when nothing is missing, duplicated or hanging, 1 when something is, 2 when it could
    /// not look.
    Reconcile(reconcile::ReconcileArgs),
    /// Ask a running job's health endpoint; exit 0 on a 200 (the image's HEALTHCHECK).
    Probe(probe::ProbeArgs),
    /// Transactions as the brokers see them: `txn doctor` finds hanging ones and ends them.
    Txn {
        #[command(subcommand)]
        command: txn::TxnCommand,
    },
    /// Kubernetes manifests of a topology's job.
    Deploy {
        #[command(subcommand)]
        command: deploy::DeployCommand,
    },
    /// Print the JSON Schema of topology files (the file docs/topology.schema.json), for
    /// editors and validators. It accepts a `${VAR}` reference wherever a value may be written.
    Schema,
    /// Print a completion script for a shell, e.g. `onceflow completions bash >
    /// /etc/bash_completion.d/onceflow`.
    Completions(completions::CompletionsArgs),
    /// Print the manual page (roff) of onceflow or of one of its commands, e.g. `onceflow man
    /// txn doctor | man -l -`.
    Man(man::ManArgs),
}

impl Cli {
    /// Parses the process's arguments (exits with clap's message on a wrong one). `-V` prints
    /// onceflow's version; `--version` also the commit it was built from, and the librdkafka
    /// it carries with that library's built-in features (its compression codecs, SASL
    /// mechanisms, TLS).
    pub fn from_args() -> Cli {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().long_version(long_version()).get_matches();
        Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

/// What `onceflow --version` prints after the name.
fn long_version() -> String {
    let (librdkafka, features) = crate::kafka::clients::librdkafka();
    format!(
        "{} (commit {})\nlibrdkafka {librdkafka} (with onceflow's patches)\nlibrdkafka builtin.features: {features}",
        env!("CARGO_PKG_VERSION"),
        env!("ONCEFLOW_COMMIT"),
    )
}

pub use crate::supervise::hold_stop_signals;

/// How a command ended: its exit status (docs/running.md, "Exit status", has the table).
/// Ordered from the best to the worst: when a command checks several things, the worst says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    /// 0: done; for a check, nothing wrong was found.
    Ok,
    /// 1: a check found a problem, or the command failed.
    Problems,
    /// 2: a check could not be made (a file that cannot be read, a broker, registry or
    /// database that does not answer, a topology that does not load) or was asked wrongly.
    /// clap's own usage errors exit 2 too.
    Unchecked,
}

impl Status {
    /// The status of a verdict: ok or problems.
    pub fn of(ok: bool) -> Status {
        if ok { Status::Ok } else { Status::Problems }
    }

    pub fn code(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::Problems => 1,
            Status::Unchecked => 2,
        }
    }
}

/// Runs the parsed command line. The checks (`validate`, `reconcile`, `txn doctor`) exit 0
/// when nothing is wrong, 1 when they found a problem and 2 when they could not look; the
/// other commands 0 when done and 1 when they failed.
pub fn main(cli: Cli) -> ExitCode {
    crate::telemetry::init_tracing(cli.log_json);
    if !matches!(cli.command, Command::Run(_)) {
        // `run` lets them through once its handlers are installed (Supervisor::start).
        crate::supervise::release_stop_signals();
    }
    // An error of a check means it could not be made, of `man` that it was asked for a
    // command there is not; of another command, that it failed.
    let failed = match cli.command {
        Command::Validate(_) | Command::Reconcile(_) | Command::Txn { .. } | Command::Man(_) => {
            Status::Unchecked
        }
        _ => Status::Problems,
    };
    let result = match cli.command {
        Command::Run(args) => run::run(args).map(Status::of),
        Command::Dlq { command } => dlq::run(command).map(Status::of),
        Command::Validate(args) => validate::run(&args),
        Command::Test(args) => test::run(&args).map(Status::of),
        Command::Txn { command } => txn::run(command).map(Status::of),
        Command::Deploy { command } => deploy::run(command).map(Status::of),
        Command::Probe(args) => probe::run(&args).map(Status::of),
        Command::Reconcile(args) => reconcile::run(args).map(Status::of),
        Command::Schema => schema::run().map(Status::of),
        Command::Completions(args) => completions::run(&args).map(Status::of),
        Command::Man(args) => man::run(&args).map(Status::of),
    };
    let status = result.unwrap_or_else(|e| {
        eprintln!("error: {}", chain(&e));
        failed
    });
    ExitCode::from(status.code())
}

/// An error with its causes, each once: the crate's errors already show their cause in
/// their own message, and a cause already said is not repeated.
pub fn chain(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    let mut last = text.clone();
    for cause in e.chain().skip(1) {
        let said = cause.to_string();
        if !last.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        last = said;
    }
    text
}

/// Loads a topology for running: the environment must provide every variable, and every
/// problem of the file is reported at once.
fn load(path: &Path) -> anyhow::Result<(Topology, crate::transform::Pipeline)> {
    crate::load::load(path, Strictness::Strict)
        .into_result()
        .map_err(|diagnostics| problems(path, &diagnostics))
}

fn problems(path: &Path, diagnostics: &[Diagnostic]) -> anyhow::Error {
    let list: Vec<String> = diagnostics.iter().map(|d| format!("  {d}")).collect();
    anyhow::anyhow!(
        "{} has {} problem(s):\n{}",
        path.display(),
        diagnostics.len(),
        list.join("\n")
    )
}

/// Where a command's Kafka cluster is, and librdkafka settings for its clients.
#[derive(clap::Args)]
struct KafkaArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "ONCEFLOW_BOOTSTRAP_SERVERS")]
    bootstrap_servers: String,
    /// A librdkafka setting for the command's clients, `key=value`; repeat it
    /// (e.g. -X security.protocol=SSL -X ssl.ca.location=/etc/kafka/ca.pem).
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_setting)]
    kafka_setting: Vec<(String, String)>,
}

impl From<KafkaArgs> for crate::kafka::Cluster {
    fn from(a: KafkaArgs) -> crate::kafka::Cluster {
        crate::kafka::Cluster {
            bootstrap: a.bootstrap_servers,
            settings: a.kafka_setting,
        }
    }
}

/// The value of a duration flag: a number with its unit (`30s`, `500ms`, `1h 30m`; `0` alone
/// is zero), as every duration on the command line is written.
fn duration(text: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("`{text}` is not a duration like 30s, 500ms or 2m: {e}"))
}

fn parse_setting(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("`{s}` is not key=value")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_are_key_value() {
        assert_eq!(
            parse_setting(" security.protocol =SSL").unwrap(),
            ("security.protocol".into(), "SSL".into())
        );
        assert_eq!(parse_setting("a=b=c").unwrap(), ("a".into(), "b=c".into()));
        assert!(parse_setting("novalue").is_err());
        assert!(parse_setting("=x").is_err());
    }

    #[test]
    fn causes_are_shown_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("kafka: {0}")]
        struct Wraps(#[source] std::io::Error);
        let io = || std::io::Error::other("refused");
        let e = anyhow::Error::from(Wraps(io())).context("cannot start");
        assert_eq!(chain(&e), "cannot start: kafka: refused");
        let plain = anyhow::Error::from(io()).context("cannot write x");
        assert_eq!(chain(&plain), "cannot write x: refused");
    }

    #[test]
    fn the_long_version_names_the_commit_and_librdkafka() {
        let v = long_version();
        assert!(v.starts_with(env!("CARGO_PKG_VERSION")), "{v}");
        assert!(v.contains("(commit "), "{v}");
        assert!(v.contains("\nlibrdkafka 2."), "{v}");
        assert!(v.contains("zstd"), "{v}");
    }

    #[test]
    fn the_command_line_parses() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// Every argument of every command, hidden ones included, says what it is for.
    #[test]
    fn every_argument_has_help() {
        use clap::CommandFactory;
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let path = format!("{path} {}", command.get_name());
            for arg in command.get_arguments() {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path}: {}", arg.get_id()));
                }
            }
            for sub in command.get_subcommands() {
                if sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(format!("{path} {}: no about", sub.get_name()));
                }
                walk(sub, &path, missing);
            }
        }
        let mut command = Cli::command();
        command.build();
        let mut missing = Vec::new();
        walk(&command, "", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:#?}");
        // The walk sees what it must: a command's flags, its subcommands' too.
        let doctor = command
            .find_subcommand("txn")
            .and_then(|t| t.find_subcommand("doctor"))
            .expect("txn doctor");
        assert!(doctor.get_arguments().any(|a| a.get_id() == "older_than"));
    }

    fn parses(line: &str) -> bool {
        Cli::try_parse_from(line.split_whitespace()).is_ok()
    }

    /// The former spellings of renamed flags still parse, hidden from --help.
    #[test]
    fn former_spellings_still_parse() {
        for line in [
            "onceflow validate t.yaml --broker k:9092",
            "onceflow validate t.yaml --bootstrap-servers k:9092",
            "onceflow reconcile t.yaml --bootstrap-servers k --marker-timeout-ms 3000",
            "onceflow reconcile t.yaml --bootstrap-servers k --marker-timeout 3s",
            "onceflow run t.yaml --progress-secs 0 --statistics-secs 5",
            "onceflow run t.yaml --progress-interval 0 --statistics-interval 500ms",
            "onceflow probe --addr 127.0.0.1:9090",
            "onceflow probe --metrics-addr 127.0.0.1:9090",
        ] {
            assert!(parses(line), "{line}");
        }
        for wrong in [
            // Both spellings at once, or a duration without its unit.
            "onceflow reconcile t.yaml --bootstrap-servers k --marker-timeout 3s --marker-timeout-ms 5",
            "onceflow reconcile t.yaml --bootstrap-servers k --marker-timeout 3000",
            "onceflow run t.yaml --progress-interval 10",
            "onceflow txn doctor --bootstrap-servers k --older-than 60",
        ] {
            assert!(!parses(wrong), "{wrong}");
        }
        use clap::CommandFactory;
        let mut help = Vec::new();
        Cli::command()
            .find_subcommand_mut("reconcile")
            .expect("reconcile")
            .write_long_help(&mut help)
            .expect("help");
        let help = String::from_utf8_lossy(&help);
        assert!(help.contains("--marker-timeout <DURATION>"), "{help}");
        assert!(!help.contains("--marker-timeout-ms"), "{help}");
    }

    #[test]
    fn durations_name_their_unit() {
        assert_eq!(duration("1m 30s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(duration("0"), Ok(std::time::Duration::ZERO));
        let e = duration("30000").unwrap_err();
        assert!(e.contains("30000ms"), "{e}");
    }

    #[test]
    fn the_worst_status_wins() {
        assert_eq!(Status::Ok.max(Status::Problems), Status::Problems);
        assert_eq!(Status::Unchecked.max(Status::Problems), Status::Unchecked);
        assert_eq!(
            [Status::Ok, Status::Problems, Status::Unchecked].map(Status::code),
            [0, 1, 2]
        );
        assert_eq!(Status::of(true), Status::Ok);
        assert_eq!(Status::of(false), Status::Problems);
    }
}
