//! `onceflow man [COMMAND]...`: the manual page (roff) of onceflow or of one of its commands,
//! made from the command line's own definition.

use anyhow::Context;
use clap::CommandFactory;

#[derive(clap::Args)]
pub struct ManArgs {
    /// The command whose page to print, e.g. `txn doctor` (default: onceflow's own page, which
    /// lists the commands).
    #[arg(value_name = "COMMAND")]
    command: Vec<String>,
}

pub fn run(args: &ManArgs) -> anyhow::Result<bool> {
    let mut out = Vec::new();
    page(&args.command)?.render(&mut out)?;
    std::io::Write::write_all(&mut std::io::stdout(), &out)?;
    Ok(true)
}

/// The page of the command at `path` (`[]` for onceflow's own), titled as git titles its
/// commands' pages (`onceflow-txn-doctor`), its synopsis as it is typed (`onceflow txn doctor`).
fn page(path: &[String]) -> anyhow::Result<clap_mangen::Man> {
    let mut command = super::Cli::command();
    // Gives every command its full name and its synopsis's.
    command.build();
    for word in path {
        let found = command.find_subcommand(word).cloned().with_context(|| {
            let known: Vec<&str> = command.get_subcommands().map(|c| c.get_name()).collect();
            format!(
                "`{}` has no command `{word}` (it has: {})",
                command.get_bin_name().unwrap_or("onceflow"),
                known.join(", ")
            )
        })?;
        command = found;
    }
    let source = format!("onceflow {}", env!("CARGO_PKG_VERSION"));
    Ok(clap_mangen::Man::new(command)
        .source(source)
        .manual("onceflow"))
}
