//! The commit onceflow is built from, for `onceflow --version`: `ONCEFLOW_COMMIT` when set
//! (an image built without the repository's `.git`), else `git rev-parse`, else "unknown".
use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=ONCEFLOW_COMMIT");
    for watched in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if Path::new(watched).exists() {
            println!("cargo:rerun-if-changed={watched}");
        }
    }
    let commit = std::env::var("ONCEFLOW_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| {
            let out = Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .output()
                .ok()?;
            let commit = String::from_utf8(out.stdout).ok()?.trim().to_string();
            (out.status.success() && !commit.is_empty()).then_some(commit)
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=ONCEFLOW_COMMIT={commit}");
}
