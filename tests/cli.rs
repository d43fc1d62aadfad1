//! The command line as a person or a script meets it, without a broker: the committed
//! topology schema as `onceflow schema` prints it.

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
