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
            let found = Diagnostic::problem(file, lines.line_of(&path), path, e.to_string());
            // The table's own problems are found; anything else kept the check from looking.
            vec![match e {
                RelayError::Layout(_) => found,
                _ => found.unchecked(),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_topology_without_an_outbox_has_no_table_to_check() {
        let text = "name: job\ninputs: [{topic: in}]\noutputs: [{topic: out}]\n";
        let topology = Topology::parse_unchecked(text).unwrap();
        assert!(check_outbox_table(&topology, "job.yaml", &LineMap::build(text)).is_empty());
    }

    #[test]
    fn a_url_variable_not_set_is_reported_at_the_outbox_table() {
        // A variable no environment sets: the check stops before any connection.
        let text = "name: relay\ninputs:\n  - topic: ''\n  - postgres_outbox:\n      url_env: ONCEFLOW_RELAY_TEST_NEVER_SET\n      table: orders_outbox\n";
        let topology = Topology::parse_unchecked(text).unwrap();
        let found = check_outbox_table(&topology, "relay.yaml", &LineMap::build(text));
        assert_eq!(
            found,
            [Diagnostic {
                file: "relay.yaml".into(),
                line: Some(6),
                path: "inputs[1].postgres_outbox.table".into(),
                message: "outbox: environment variable ONCEFLOW_RELAY_TEST_NEVER_SET (url_env) is not set".into(),
                unchecked: true,
            }]
        );
    }
}
