//! The command line as a person or a script meets it, without a broker: the exit statuses of
//! the checks (0 nothing wrong, 1 a problem found, 2 could not check or asked wrongly), the
//! committed topology schema as `onceflow schema` prints it, the completion scripts and the
//! manual pages.

use std::path::Path;
use std::process::{Command, Output};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Runs onceflow in the repository with `args`, without a broker in its environment.
fn onceflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onceflow"))
        .args(args)
        .current_dir(ROOT)
        .env_remove("ONCEFLOW_BOOTSTRAP_SERVERS")
        .output()
        .expect("cannot start onceflow")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `args` exits with `code`; what it said, for more checks.
fn exits(args: &[&str], code: i32) -> String {
    let out = onceflow(args);
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(code), "onceflow {args:?}:\n{said}");
    said
}

#[test]
fn validate_exits_0_when_clean_1_on_a_problem_and_2_when_it_could_not_check() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "name: t\ninputs: [{topic: in}]\noutputs: [{topic: out}]\nruntime: {commit_interval: 5}\n",
    )
    .expect("write");
    let bad = bad.to_str().expect("a UTF-8 path");
    let missing = dir.path().join("missing.yaml");
    let missing = missing.to_str().expect("a UTF-8 path");

    exits(&["validate", "topologies/orders.yaml"], 0);
    let said = exits(&["validate", "topologies/orders.yaml", bad], 1);
    assert!(said.contains("runtime.commit_interval"), "{said}");
    let said = exits(&["validate", missing], 2);
    assert!(said.contains("cannot read"), "{said}");
    // A file that could not be checked outweighs one with a problem.
    exits(&["validate", bad, missing], 2);
    // No broker answers there: the file's own checks pass, the broker's cannot be made.
    let said = exits(
        &[
            "validate",
            "topologies/orders.yaml",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--timeout",
            "1s",
        ],
        2,
    );
    assert!(said.contains("could not be made"), "{said}");
}

#[test]
fn usage_errors_exit_2() {
    exits(&["validate"], 2);
    exits(&["validate", "topologies/orders.yaml", "--no-such-flag"], 2);
    exits(&["nosuchcommand"], 2);
    exits(
        &[
            "txn",
            "doctor",
            "--bootstrap-servers",
            "x",
            "--older-than",
            "60",
        ],
        2,
    );
    exits(&["man", "nosuchcommand"], 2);
    exits(&["completions", "tcsh"], 2);
    exits(&["--help"], 0);
}

#[test]
fn the_other_checks_exit_2_when_they_cannot_look() {
    // Nothing listens on port 1: the connection is refused at once.
    let said = exits(
        &[
            "txn",
            "doctor",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--timeout",
            "2s",
        ],
        2,
    );
    assert!(said.contains("cannot reach"), "{said}");
    exits(
        &[
            "reconcile",
            "no-such-topology.yaml",
            "--bootstrap-servers",
            "127.0.0.1:1",
        ],
        2,
    );
    // A command that is not a check exits 1 when it fails.
    exits(&["run", "no-such-topology.yaml"], 1);
}

#[test]
fn the_committed_schema_is_what_onceflow_schema_prints() {
    let out = onceflow(&["schema"]);
    assert!(out.status.success(), "{out:?}");
    let printed = stdout(&out);
    let committed = std::fs::read_to_string(Path::new(ROOT).join("docs/topology.schema.json"))
        .expect("docs/topology.schema.json");
    assert!(
        printed == committed,
        "docs/topology.schema.json is not what `onceflow schema` prints: write it again with\n  cargo run -- schema > docs/topology.schema.json"
    );
    let schema: serde_json::Value = serde_json::from_str(&committed).expect("JSON");
    assert_eq!(
        schema["$schema"],
        "https://json-schema.org/draft/2020-12/schema"
    );
    assert_eq!(schema["additionalProperties"], false);
}

#[test]
fn completions_for_every_shell_name_the_commands() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = onceflow(&["completions", shell]);
        assert!(out.status.success(), "{shell}: {out:?}");
        let script = stdout(&out);
        for word in ["validate", "reconcile", "doctor", "--bootstrap-servers"] {
            assert!(script.contains(word), "{shell}: no `{word}` in\n{script}");
        }
    }
}

#[test]
fn the_manual_pages_are_roff_naming_the_commands() {
    let out = onceflow(&["man"]);
    assert!(out.status.success(), "{out:?}");
    let page = stdout(&out);
    assert!(page.contains(".TH onceflow 1"), "{page}");
    for command in ["run", "validate", "reconcile", "txn", "schema"] {
        assert!(
            page.contains(&format!("onceflow\\-{command}(1)")),
            "no onceflow-{command}(1) in\n{page}"
        );
    }
    let out = onceflow(&["man", "txn", "doctor"]);
    assert!(out.status.success(), "{out:?}");
    let page = stdout(&out);
    assert!(page.contains(".TH onceflow-txn-doctor 1"), "{page}");
    assert!(page.contains("\\-\\-older\\-than"), "{page}");
    // A former spelling, still understood, is not taught.
    let page = stdout(&onceflow(&["man", "reconcile"]));
    assert!(page.contains("\\-\\-marker\\-timeout"), "{page}");
    assert!(!page.contains("timeout\\-ms"), "{page}");
}
