//! `onceflow test`: a topology's pipeline over the records of a cases file, no broker.

use std::path::PathBuf;

use crate::testing;

#[derive(clap::Args)]
pub struct TestArgs {
    /// The topology file.
    topology: PathBuf,
    /// The cases file.
    #[arg(long)]
    cases: PathBuf,
}

pub fn run(args: &TestArgs) -> anyhow::Result<bool> {
    let (topology, pipeline) = super::load(&args.topology)?;
    let cases = testing::load_cases(&args.cases)?;
    let reports = testing::run_cases(&topology, &pipeline, &cases);
    let failed = reports.iter().filter(|r| !r.passed()).count();
    for r in &reports {
        if r.passed() {
            println!("ok      {}", r.name);
        } else {
            println!("MISMATCH {}", r.name);
            for m in &r.mismatches {
                for line in m.lines() {
                    println!("    {line}");
                }
            }
        }
    }
    println!(
        "cases: {} passed, {failed} mismatched",
        reports.len() - failed
    );
    Ok(failed == 0)
}
