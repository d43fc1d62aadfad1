//! `onceflow validate`: every problem of each file, then the checks only a broker can answer.

use std::path::PathBuf;
use std::time::Duration;

use super::Status;
use crate::topology::env::Strictness;
use crate::validate;
use crate::{load, relay};

#[derive(clap::Args)]
pub struct ValidateArgs {
    /// Topology files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Also check against these brokers: their transaction.max.timeout.ms allows the
    /// topology's transaction timeout, and the topics exist (and, with a schema registry,
    /// that it takes the outputs' schemas).
    #[arg(long, alias = "broker", value_name = "SERVERS")]
    bootstrap_servers: Option<String>,
    /// With --bootstrap-servers: the network timeout of each request to the brokers, e.g.
    /// 10s.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = super::duration)]
    timeout: Duration,
    /// Do not require the environment: unset variables expand to their default or to
    /// their own name instead of being errors.
    #[arg(long)]
    no_env: bool,
    /// Also connect to the database of an outbox input (the URL in its `url_env`) and check
    /// that the table exists with the columns the relay needs.
    #[arg(long)]
    database: bool,
}

/// Every file checked, each with its verdict printed: [`Status::Problems`] when a file has a
/// problem, [`Status::Unchecked`] when something could not be checked (a file unread, a
/// broker, registry or database without an answer), whatever else was found.
pub fn run(args: &ValidateArgs) -> anyhow::Result<Status> {
    let strictness = if args.no_env {
        Strictness::Lenient
    } else {
        Strictness::Strict
    };
    let mut status = Status::Ok;
    for file in &args.files {
        let checked = load::load(file, strictness);
        let mut diagnostics = checked.diagnostics;
        if let (Some(bootstrap), Some(topology)) = (&args.bootstrap_servers, &checked.topology) {
            diagnostics.extend(validate::check_broker(
                topology,
                bootstrap,
                &file.display().to_string(),
                &checked.lines,
                args.timeout,
            ));
        }
        if let (true, Some(topology)) = (args.database, &checked.topology) {
            diagnostics.extend(relay::check_outbox_table(
                topology,
                &file.display().to_string(),
                &checked.lines,
            ));
        }
        let unchecked = diagnostics.iter().filter(|d| d.unchecked).count();
        let problems = diagnostics.len() - unchecked;
        for d in &diagnostics {
            println!("{d}");
        }
        let verdict = match (problems, unchecked) {
            (0, 0) => "ok".to_string(),
            (p, 0) => format!("{p} problem(s)"),
            (0, u) => format!("{u} check(s) could not be made"),
            (p, u) => format!("{p} problem(s), {u} check(s) could not be made"),
        };
        println!("{}: {verdict}", file.display());
        if unchecked > 0 {
            status = status.max(Status::Unchecked);
        } else if problems > 0 {
            status = status.max(Status::Problems);
        }
    }
    Ok(status)
}
