//! `dlq inspect`: the dead-letter records of a topic as a table.

use super::{DeadLetter, DlqError, Filter};
use super::{H_FAILED_AT, H_KIND, H_MESSAGE, H_OFFSET, H_PARTITION, H_STAGE, H_TOPIC};
use crate::kafka::Cluster;
use crate::kafka::read::{read_to_end, reader};

fn shorten(bytes: Option<&[u8]>, max: usize) -> String {
    match bytes {
        None => "(null)".into(),
        Some(b) => {
            let text: String = String::from_utf8_lossy(b)
                .chars()
                .map(|c| if c.is_control() { ' ' } else { c })
                .collect();
            if text.chars().count() > max {
                format!("{}…", text.chars().take(max).collect::<String>())
            } else {
                text
            }
        }
    }
}

/// Prints the dead-letter records of `topic` as a table.
pub fn inspect(
    kafka: &Cluster,
    topic: &str,
    filter: &Filter,
    limit: usize,
    out: &mut dyn std::io::Write,
) -> Result<usize, DlqError> {
    // A throwaway group: inspecting never moves anybody's offsets.
    let group = format!("onceflow.inspect.{}", std::process::id());
    let consumer = reader(kafka, &group)?;
    let mut shown = 0;
    writeln!(
        out,
        "{:<12} {:<24} {:<12} {:<28} {:<16} {:<40} payload",
        "at", "failed at (ms)", "kind", "origin", "stage", "message"
    )?;
    read_to_end(&consumer, topic, |msg| -> Result<(), DlqError> {
        let d = DeadLetter::from_message(msg);
        if shown < limit && filter.matches(&d) {
            shown += 1;
            writeln!(
                out,
                "{:<12} {:<24} {:<12} {:<28} {:<16} {:<40} {}",
                format!("{}@{}", d.partition, d.offset),
                d.meta(H_FAILED_AT),
                d.meta(H_KIND),
                format!(
                    "{}[{}]@{}",
                    d.meta(H_TOPIC),
                    d.meta(H_PARTITION),
                    d.meta(H_OFFSET)
                ),
                shorten(Some(d.meta(H_STAGE).as_bytes()), 16),
                shorten(Some(d.meta(H_MESSAGE).as_bytes()), 40),
                shorten(d.value.as_deref(), 60),
            )?;
        }
        Ok(())
    })?;
    Ok(shown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_are_shortened_for_display() {
        assert_eq!(shorten(None, 5), "(null)");
        assert_eq!(shorten(Some(b"abc"), 5), "abc");
        assert_eq!(shorten(Some(b"abcdefgh"), 5), "abcde…");
        assert_eq!(shorten(Some(b"a\nb"), 5), "a b");
    }
}
