//! `onceflow txn doctor`: finds open and hanging transactions and, with `--abort`, ends the
//! hanging ones.

use std::collections::BTreeSet;
use std::io::{BufRead, IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Subcommand;

use super::KafkaArgs;
use crate::doctor::{self, Diagnosis, Scope};
use crate::kafka::Cluster;
use crate::kafka::transactions::TxnAdmin;
use crate::topology::env::Strictness;

#[derive(Subcommand)]
pub enum TxnCommand {
    /// List open transactions, which of them hang, and the partitions they hold back (last
    /// stable offset below the high watermark). Exit status 0 when nothing hangs, 1 when
    /// something does, 2 when it could not look. With --abort, end the hanging ones and check
    /// again.
    Doctor(DoctorArgs),
}

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// A topology file: examine its input, output and dead-letter topics, and name its
    /// instances' transactional ids with whether each one runs.
    topology: Option<PathBuf>,
    /// Examine this topic (repeat it). Without a topology or a topic: every topic.
    #[arg(long = "topic", value_name = "TOPIC")]
    topics: Vec<String>,
    #[command(flatten)]
    kafka: KafkaArgs,
    /// A transaction open longer than this hangs, e.g. 90s, 15m.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = super::duration)]
    older_than: Duration,
    /// End the hanging transactions, after confirmation: a transactional id its coordinator
    /// knows is fenced there (its open transaction is aborted; a live producer with that id
    /// is fenced), an orphaned producer gets abort markers on its partitions.
    #[arg(long)]
    abort: bool,
    /// Do not ask for confirmation (for scripts).
    #[arg(long, requires = "abort")]
    yes: bool,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// Show every partition examined, not only those held back.
    #[arg(long)]
    all: bool,
    /// Network timeout of each request, and how long an abort may take to clear, e.g. 30s.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = super::duration)]
    timeout: Duration,
}

pub fn run(command: TxnCommand) -> anyhow::Result<bool> {
    match command {
        TxnCommand::Doctor(args) => doctor(args),
    }
}

fn scope(args: &DoctorArgs) -> anyhow::Result<Scope> {
    let mut topics: BTreeSet<String> = args.topics.iter().cloned().collect();
    let mut topology = None;
    if let Some(path) = &args.topology {
        // Only names are needed: the file's variables may be unset where the doctor runs.
        let (t, _) = crate::load::load(path, Strictness::Lenient)
            .into_result()
            .map_err(|diagnostics| super::problems(path, &diagnostics))?;
        topics.extend(t.input_topics().into_iter().map(str::to_string));
        topics.extend(t.kafka_output_topics().into_iter().map(str::to_string));
        topics.insert(t.dead_letter_topic());
        topology = Some((t.name.clone(), t.group_id()));
    }
    Ok(Scope {
        topics: (!topics.is_empty()).then_some(topics),
        topology,
    })
}

fn examine(admin: &mut TxnAdmin, scope: &Scope, older_than: Duration) -> anyhow::Result<Diagnosis> {
    let snapshot = doctor::examine(admin, scope).context("cannot examine the cluster")?;
    let ms = i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
    Ok(doctor::diagnose(&snapshot, ms))
}

fn confirm(count: usize) -> anyhow::Result<bool> {
    if !std::io::stdin().is_terminal() {
        anyhow::bail!(
            "--abort asks for confirmation on a terminal; pass --yes to abort without it"
        );
    }
    eprint!("end {count} hanging transaction(s) as listed above? [y/N] ");
    std::io::stderr().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

fn doctor(args: DoctorArgs) -> anyhow::Result<bool> {
    let scope = scope(&args)?;
    let cluster: Cluster = args.kafka.into();
    let mut admin = TxnAdmin::connect(&cluster, args.timeout)
        .with_context(|| format!("cannot reach {}", cluster.bootstrap))?;
    let before = examine(&mut admin, &scope, args.older_than)?;
    if !args.abort || before.healthy {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&before)?);
        } else {
            print!("{}", doctor::render(&before, args.all));
        }
        return Ok(before.healthy);
    }
    if !args.json {
        print!("{}", doctor::render(&before, args.all));
    }
    if !args.yes && !confirm(before.cures.len())? {
        eprintln!("nothing done");
        return Ok(false);
    }
    let treatments = doctor::cure(&mut admin, &before.cures, args.timeout);
    if !args.json {
        print!("{}", doctor::render_treatments(&treatments));
    }
    // Markers become visible and coordinators finish their aborts within moments; look
    // again until the cluster is healthy or the timeout passes.
    let started = Instant::now();
    let after = loop {
        let after = examine(&mut admin, &scope, args.older_than)?;
        if after.healthy || started.elapsed() > args.timeout {
            break after;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let worked = treatments.iter().all(|t| t.error.is_none());
    if args.json {
        let report = serde_json::json!({
            "before": before,
            "treatments": treatments,
            "after": after,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("after the cure:");
        print!("{}", doctor::render(&after, args.all));
    }
    Ok(worked && after.healthy)
}
