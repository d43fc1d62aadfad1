//! The README's commands stay runnable: its first lines are the two commands (the main job,
//! the whole test suite), every `onceflow` command it shows parses with the command line of
//! this build and names files that exist, its quickstart YAML is the file it names, and the
//! main job's command runs (on the embedded cluster: no broker given).

use std::path::Path;
use std::process::Command;

use clap::Parser;
use onceflow::cli::Cli;

const README: &str = include_str!("../README.md");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The README's fenced blocks in a given language, each as its lines.
fn blocks(lang: &str) -> Vec<Vec<&'static str>> {
    let mut out = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in README.lines() {
        match (&mut current, line.trim_start().strip_prefix("```")) {
            (None, Some(info)) if info.trim() == lang => current = Some(Vec::new()),
            (Some(_), Some(_)) => out.extend(current.take()),
            (Some(lines), None) => lines.push(line),
            _ => {}
        }
    }
    out
}

/// A shell line as the words of the command it runs: quotes removed, a `$(...)` as one word,
/// an optional `[...]` as its contents, and nothing from a comment, a redirection or a pipe on.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match c {
            '"' => quoted = !quoted,
            '$' if chars.peek() == Some(&'(') => {
                let mut depth = 0;
                for d in chars.by_ref() {
                    depth += match d {
                        '(' => 1,
                        ')' => -1,
                        _ => 0,
                    };
                    if depth == 0 {
                        break;
                    }
                }
                word.push_str("substituted");
            }
            '[' | ']' if !quoted => {}
            ' ' | '\t' if !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            '#' | '>' | '|' if !quoted && word.is_empty() => break,
            _ => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// Every `onceflow` command of the README's shell blocks, as the arguments after the program
/// (`cargo run --release -- x` counts as `onceflow x`).
fn onceflow_commands() -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for block in blocks("sh") {
        for line in block {
            let w = words(line);
            let args = match w.first().map(String::as_str) {
                Some("onceflow") => w[1..].to_vec(),
                Some("cargo") if w.starts_with(&["cargo".into(), "run".into()]) => {
                    match w.iter().position(|a| a == "--") {
                        Some(i) if !w.contains(&"-p".to_string()) => w[i + 1..].to_vec(),
                        _ => continue,
                    }
                }
                _ => continue,
            };
            out.push((line.trim().to_string(), args));
        }
    }
    out
}

#[test]
fn the_first_lines_are_the_two_commands() {
    let first = blocks("sh")
        .into_iter()
        .next()
        .expect("README has no sh block");
    let before: Vec<&str> = README
        .lines()
        .take_while(|l| !l.starts_with("```"))
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(
        before,
        ["# onceflow"],
        "the two commands come right after the title"
    );
    let commands: Vec<Vec<String>> = first.iter().map(|l| words(l)).collect();
    assert_eq!(
        commands,
        [
            words("cargo run --release -- run topologies/quickstart.yaml"),
            words("scripts/test"),
        ],
        "the README's first block is the main job and the whole test suite"
    );
    let meta = std::fs::metadata(Path::new(ROOT).join("scripts/test")).expect("scripts/test");
    assert!(
        std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0,
        "scripts/test is not executable"
    );
}

#[test]
fn every_onceflow_command_parses_and_names_existing_files() {
    let commands = onceflow_commands();
    assert!(
        commands.len() >= 10,
        "only {} onceflow commands found in the README: is the parser of its blocks broken?",
        commands.len()
    );
    let mut subcommands = std::collections::BTreeSet::new();
    for (line, args) in &commands {
        let argv = std::iter::once("onceflow".to_string()).chain(args.iter().cloned());
        if let Err(e) = Cli::try_parse_from(argv) {
            panic!("README command `{line}` does not parse: {e}");
        }
        subcommands.insert(args[0].clone());
        for arg in args.iter().filter(|a| a.starts_with("topologies/")) {
            let found = if arg.contains('*') {
                let dir = Path::new(ROOT).join(arg.rsplit_once('/').map_or("", |(d, _)| d));
                std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
            } else {
                Path::new(ROOT).join(arg).exists()
            };
            assert!(
                found,
                "README command `{line}` names {arg}, which does not exist"
            );
        }
    }
    // Every command of the command line is shown at least once.
    for name in [
        "run",
        "validate",
        "test",
        "dlq",
        "reconcile",
        "txn",
        "deploy",
        "probe",
    ] {
        assert!(
            subcommands.contains(name),
            "the README shows no `onceflow {name}`"
        );
    }
}

#[test]
fn a_renamed_flag_would_be_caught() {
    // The check above is only worth something if a wrong command fails to parse.
    for wrong in [
        "onceflow run topologies/quickstart.yaml --bootstrap-server x",
        "onceflow runn topologies/quickstart.yaml",
        "onceflow dlq inspekt orders.dlq --bootstrap-servers x",
    ] {
        assert!(
            Cli::try_parse_from(words(wrong)).is_err(),
            "`{wrong}` parsed"
        );
    }
}

#[test]
fn the_quickstart_yaml_is_the_file_it_names() {
    let file = std::fs::read_to_string(Path::new(ROOT).join("topologies/quickstart.yaml"))
        .expect("topologies/quickstart.yaml");
    let shown = blocks("yaml")
        .into_iter()
        .next()
        .expect("README has no yaml block")
        .join("\n");
    assert!(
        file.contains(&shown),
        "the README's quickstart YAML differs from topologies/quickstart.yaml:\n{shown}"
    );
}

#[test]
fn the_main_job_runs_on_the_embedded_cluster() {
    let out = Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args(["run", "topologies/quickstart.yaml"])
        .current_dir(ROOT)
        .env_remove("ONCEFLOW_BOOTSTRAP_SERVERS")
        .output()
        .expect("cannot start onceflow");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "`onceflow run topologies/quickstart.yaml` failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("records in: 10000  records out: 10000"),
        "the embedded run did not pass every generated record through:\n{stdout}"
    );
}
