//! `onceflow completions <shell>`: a completion script of the command line, for bash, zsh,
//! fish, elvish or PowerShell.

use clap::CommandFactory;
use clap_complete::Shell;

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    shell: Shell,
}

pub fn run(args: &CompletionsArgs) -> anyhow::Result<bool> {
    let mut command = super::Cli::command();
    clap_complete::generate(args.shell, &mut command, "onceflow", &mut std::io::stdout());
    Ok(true)
}
