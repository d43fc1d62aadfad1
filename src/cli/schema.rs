//! `onceflow schema`: the JSON Schema of topology files, for editors and validators
//! (`docs/topology.schema.json` is its output).

use std::io::Write;

pub fn run() -> anyhow::Result<bool> {
    std::io::stdout().write_all(crate::topology::file_schema::text().as_bytes())?;
    Ok(true)
}
