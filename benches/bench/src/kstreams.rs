//! The Kafka Streams peer's libraries (fetched by `benches/kstreams/fetch`) and the JVM that
//! runs it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::BenchError;

/// Fetches Kafka Streams and its dependencies (once; the script caches them) and returns
/// the directory of their jars.
pub(crate) fn fetch_kstreams(repo: &Path) -> Result<PathBuf, BenchError> {
    let script = repo.join("benches/kstreams/fetch");
    let out = Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(BenchError::io(format!("cannot run {}", script.display())))?;
    let libs = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || libs.is_empty() {
        return Err(BenchError::Other(format!(
            "{} failed ({})",
            script.display(),
            out.status
        )));
    }
    Ok(PathBuf::from(libs))
}

/// `$JAVA_HOME/bin/java`, or `java` on the path.
pub(crate) fn java() -> PathBuf {
    match std::env::var_os("JAVA_HOME") {
        Some(home) if Path::new(&home).join("bin/java").is_file() => {
            Path::new(&home).join("bin/java")
        }
        _ => PathBuf::from("java"),
    }
}
