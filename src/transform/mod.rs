//! Pure record processors. Nothing here knows about Kafka clients or async runtimes: a
//! processor takes a [`Record`] and pushes zero or more records to an output vector, so every
//! processor is tested with plain values.

use serde::Deserialize;

/// Where a consumed record came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// A record flowing through the pipeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Vec<u8>)>,
    /// Milliseconds since the epoch, when the source record had one.
    pub timestamp: Option<i64>,
    pub origin: Origin,
}

/// One step of a pipeline, as written in the topology file.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Processor {
    /// Adds (or replaces) a header on every record.
    SetHeader {
        /// Header name.
        name: String,
        /// Header value (UTF-8).
        value: String,
    },
    /// Drops records whose value is missing or empty (tombstones included).
    DropEmpty {},
}

/// A processor failed on a record. The record is not lost: the engine decides what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("processor {stage} failed: {message}")]
pub struct TransformError {
    pub stage: usize,
    pub message: String,
}

/// The compiled pipeline of a topology.
#[derive(Debug, Clone, Default)]
pub struct Pipeline {
    processors: Vec<Processor>,
}

impl Pipeline {
    pub fn new(processors: &[Processor]) -> Pipeline {
        Pipeline {
            processors: processors.to_vec(),
        }
    }

    /// Runs `record` through every processor and appends the survivors to `out`.
    pub fn process(&self, record: Record, out: &mut Vec<Record>) -> Result<(), TransformError> {
        let mut current = Some(record);
        for processor in &self.processors {
            let Some(mut rec) = current.take() else {
                return Ok(());
            };
            match processor {
                Processor::SetHeader { name, value } => {
                    rec.headers.retain(|(n, _)| n != name);
                    rec.headers.push((name.clone(), value.as_bytes().to_vec()));
                    current = Some(rec);
                }
                Processor::DropEmpty {} => {
                    if rec.value.as_ref().is_some_and(|v| !v.is_empty()) {
                        current = Some(rec);
                    }
                }
            }
        }
        out.extend(current);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(value: Option<&str>) -> Record {
        Record {
            key: Some(b"k".to_vec()),
            value: value.map(|v| v.as_bytes().to_vec()),
            headers: vec![("h".into(), b"old".to_vec())],
            timestamp: Some(1),
            origin: Origin {
                topic: "in".into(),
                partition: 0,
                offset: 7,
            },
        }
    }

    #[test]
    fn empty_pipeline_passes_records_through() {
        let mut out = Vec::new();
        Pipeline::new(&[])
            .process(record(Some("v")), &mut out)
            .unwrap();
        assert_eq!(out, vec![record(Some("v"))]);
    }

    #[test]
    fn set_header_replaces_a_header_of_the_same_name() {
        let p = Pipeline::new(&[Processor::SetHeader {
            name: "h".into(),
            value: "new".into(),
        }]);
        let mut out = Vec::new();
        p.process(record(Some("v")), &mut out).unwrap();
        assert_eq!(out[0].headers, vec![("h".to_string(), b"new".to_vec())]);
    }

    #[test]
    fn drop_empty_drops_tombstones_and_empty_values_only() {
        let p = Pipeline::new(&[Processor::DropEmpty {}]);
        let mut out = Vec::new();
        p.process(record(None), &mut out).unwrap();
        p.process(record(Some("")), &mut out).unwrap();
        p.process(record(Some("x")), &mut out).unwrap();
        assert_eq!(out, vec![record(Some("x"))]);
    }
}
