//! What fits in a Kafka message: a dead letter too large keeps its headers without its
//! value. (Outputs too large are refused before any is sent: [`crate::record::check_sizes`].)

use crate::dlq;
use crate::record::{Record, encoded_size};

/// A dead-letter record too large to send keeps its headers and drops its value, saying so
/// ([`dlq::H_VALUE_DROPPED`]): `dlq replay` reads the original back from its origin.
pub(super) fn fit_dead_letter(mut letter: Record, max: usize) -> Record {
    let size = encoded_size(&letter);
    if size > max {
        letter.value = None;
        let why = format!(
            "too large: about {size} bytes with its value, over message.max.bytes ({max}); the original stays at its origin"
        );
        letter
            .headers
            .push((dlq::H_VALUE_DROPPED.into(), why.into_bytes()));
    }
    letter
}
