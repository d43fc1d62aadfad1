//! What `onceflow validate --database` asks of a relay: its outbox table exists and has the
//! columns the topology tells the relay to use.

use crate::load::Diagnostic;
use crate::topology::lines::LineMap;
use crate::topology::{OutboxInput, Topology};

use super::RelayError;
use super::conn::{database, inspect};

/// Checks the outbox table of a relay (its URL from the environment variable `url_env`
/// names): it exists, and has the columns the topology tells the relay to use.
pub fn check_outbox_table(topology: &Topology, file: &str, lines: &LineMap) -> Vec<Diagnostic> {
    let Some((i, outbox)) = topology
        .inputs
        .iter()
        .enumerate()
        .find_map(|(i, input)| input.postgres_outbox.as_ref().map(|o| (i, o)))
    else {
        return Vec::new();
    };
    match check_table(&topology.name, outbox) {
        Ok(()) => Vec::new(),
        Err(e) => {
            let path = format!("inputs[{i}].postgres_outbox.table");
            vec![Diagnostic {
                file: file.to_string(),
                line: lines.line_of(&path),
                path,
                message: e.to_string(),
            }]
        }
    }
}

/// Connects with the URL of `config.url_env` and checks the outbox table.
fn check_table(topology: &str, config: &OutboxInput) -> Result<(), RelayError> {
    let (pg, tls, runtime) = database(config, &format!("onceflow/{topology}/validate"))?;
    runtime.block_on(inspect(&pg, &tls, config))??;
    Ok(())
}
