//! Line numbers of field paths, so that every problem in a topology file points at its line.
//!
//! The YAML text is walked once with the event parser under serde-saphyr, and the line of
//! every node is recorded under the same dotted path that validation messages use:
//! `pipeline[2].route.routes[0].to[1]`, `kafka.consumer.isolation.level`.

use std::collections::HashMap;

use serde_saphyr::granit_parser::{Event, Parser};

/// The line and column (1-based) where every field path of a YAML document starts.
#[derive(Debug, Default, Clone)]
pub struct LineMap {
    lines: HashMap<String, (usize, usize)>,
}

enum Frame {
    /// A mapping; `key` is the pending key, when its value comes next.
    Map { path: String, key: Option<String> },
    /// A sequence and the index of its next element.
    Seq { path: String, next: usize },
}

fn child(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

impl LineMap {
    /// Walks `text`; a document that does not parse gives the lines found before the error.
    pub fn build(text: &str) -> LineMap {
        let mut lines = HashMap::new();
        let mut stack: Vec<Frame> = Vec::new();
        for next in Parser::new_from_str(text) {
            let Ok((event, span)) = next else { break };
            let line = (span.start.line(), span.start.col() + 1);
            // The path of a value node starting here.
            let node_path = |stack: &mut Vec<Frame>| -> Option<String> {
                match stack.last_mut() {
                    None => Some(String::new()),
                    Some(Frame::Map { path, key }) => key.take().map(|k| child(path, &k)),
                    Some(Frame::Seq { path, next }) => {
                        let p = format!("{path}[{next}]");
                        *next += 1;
                        Some(p)
                    }
                }
            };
            match event {
                Event::Scalar(value, ..) => {
                    if let Some(Frame::Map { path, key }) = stack.last_mut()
                        && key.is_none()
                    {
                        let p = child(path, &value);
                        lines.entry(p).or_insert(line);
                        *key = Some(value.into_owned());
                        continue;
                    }
                    if let Some(p) = node_path(&mut stack) {
                        lines.entry(p).or_insert(line);
                    }
                }
                Event::Alias(_) => {
                    let _ = node_path(&mut stack);
                }
                Event::MappingStart(..) => {
                    let p = node_path(&mut stack).unwrap_or_default();
                    lines.entry(p.clone()).or_insert(line);
                    stack.push(Frame::Map { path: p, key: None });
                }
                Event::SequenceStart(..) => {
                    let p = node_path(&mut stack).unwrap_or_default();
                    lines.entry(p.clone()).or_insert(line);
                    stack.push(Frame::Seq { path: p, next: 0 });
                }
                Event::MappingEnd | Event::SequenceEnd => {
                    stack.pop();
                }
                _ => {}
            }
        }
        LineMap { lines }
    }

    /// The line of `path`, or of its closest ancestor present in the file (a field left out
    /// and defaulted has no line of its own).
    pub fn line_of(&self, path: &str) -> Option<usize> {
        let mut p = path;
        loop {
            if let Some((line, _)) = self.lines.get(p) {
                return Some(*line);
            }
            let cut = p.rfind(['.', '['])?;
            p = &p[..cut];
        }
    }
}

impl LineMap {
    /// The field path of what is at `line` and `column`: of the paths starting on that line
    /// at or before the column, the last one to start (the deepest, when several start at
    /// the same place).
    pub fn path_at(&self, line: usize, column: usize) -> Option<String> {
        self.lines
            .iter()
            .filter(|(_, (l, c))| *l == line && *c <= column)
            .max_by_key(|(p, (_, c))| (*c, p.matches(['.', '[']).count(), p.len()))
            .map(|(p, _)| p.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_get_the_line_of_their_key() {
        let text = "name: t\npipeline:\n  - filter: 'value.x > 1'\n  - route:\n      routes:\n        - when: 'true'\n          to: [a, b]\n      default: []\nkafka:\n  consumer: {isolation.level: x}\n";
        let map = LineMap::build(text);
        assert_eq!(map.line_of("name"), Some(1));
        assert_eq!(map.line_of("pipeline[0].filter"), Some(3));
        assert_eq!(map.line_of("pipeline[1].route.routes[0].to[1]"), Some(7));
        assert_eq!(map.line_of("pipeline[1].route.default"), Some(8));
        assert_eq!(map.line_of("kafka.consumer.isolation.level"), Some(10));
        assert_eq!(map.line_of("pipeline[1].route.routes[0].when"), Some(6));
        let flow = LineMap::build("inputs: [{topic: '${X}', codec: json}]\n");
        assert_eq!(flow.path_at(1, 19).as_deref(), Some("inputs[0].topic"));
        assert_eq!(flow.path_at(1, 30).as_deref(), Some("inputs[0].codec"));
        // absent field: the closest ancestor
        assert_eq!(map.line_of("pipeline[1].route.mode"), Some(4));
        assert_eq!(map.line_of("runtime.commit_interval_ms"), None);
    }
}
