//! What `onceflow validate --database` asks of a relay: its outbox table exists and has the
//! columns the topology tells the relay to use.

use crate::load::Diagnostic;
use crate::sink::postgres::client_config;
use crate::topology::lines::LineMap;
use crate::topology::{OutboxInput, Topology};

use super::RelayError;
use super::conn::inspect;

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
    let url = std::env::var(&config.url_env)
        .map_err(|_| RelayError::MissingUrl(config.url_env.clone()))?;
    let (pg, tls) = client_config(
        &url,
        &config.url_env,
        &format!("onceflow/{topology}/validate"),
    )?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RelayError::Runtime)?;
    runtime.block_on(inspect(&pg, &tls, config))??;
    Ok(())
}
