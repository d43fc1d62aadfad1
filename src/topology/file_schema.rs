//! The JSON Schema of a topology file, made from the model's own types (`onceflow schema`;
//! committed as `docs/topology.schema.json`, which the example topologies name for editors).
//!
//! The types derive [`JsonSchema`](schemars::JsonSchema), which reads their serde attributes
//! (`deny_unknown_fields` becomes `additionalProperties: false`, a field with a default is not
//! required, `Input` is described by the `InputFile` it is made from) and their doc comments
//! (the descriptions). What the derive cannot know is how the file is read: [`Scalars`]
//! widens the scalars to what reading them accepts, so that a file onceflow takes is never
//! refused by an editor or a validator:
//!
//! * `${VAR}` interpolation happens on the text before parsing ([`super::env`]), so a number
//!   or a boolean may be written as a string with a `${VAR}` reference in it, and so may an
//!   enumerated string (`codec: ${CODEC:-json}`);
//! * serde-saphyr reads a scalar by its text, so a number may be quoted (`"100"`), a boolean
//!   may be any of YAML 1.1's spellings (`yes`, `off`, quoted or not), and a string field
//!   takes a number or a boolean as its text (`linger.ms: 20`).
//!
//! `Scalars` also drops `"default": null` (an optional field's `None`) and turns the
//! descriptions' rustdoc into plain text.

use schemars::Schema;
use schemars::generate::SchemaSettings;
use schemars::transform::{Transform, transform_subschemas};
use serde_json::{Map, Value};

use super::Topology;

/// A `${VAR}`, `${VAR:-default}` or `${VAR:?message}` reference anywhere in a string, as
/// [`super::env::interpolate`] reads them (an ECMA-262 regular expression, as JSON Schema's
/// `pattern` is).
pub const VARIABLE: &str = r"\$\{[A-Za-z_][A-Za-z0-9_]*(:[-?][^}]*)?\}";

/// A whole number as serde-saphyr reads one from text: decimal, `0x` or `0o`, with `_`
/// between digits. `SIGNED` allows a sign.
const UNSIGNED: &str =
    r"^\s*\+?(0x[0-9A-Fa-f]+(_[0-9A-Fa-f]+)*|0o[0-7]+(_[0-7]+)*|[0-9]+(_[0-9]+)*)\s*$";
const SIGNED: &str =
    r"^\s*[-+]?(0x[0-9A-Fa-f]+(_[0-9A-Fa-f]+)*|0o[0-7]+(_[0-7]+)*|[0-9]+(_[0-9]+)*)\s*$";
/// A number with a fraction or an exponent (or infinity, not-a-number) as YAML writes them.
const NUMBER: &str = r"^\s*[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?\s*$|^\s*[-+]?\.(inf|Inf|INF)\s*$|^\s*\.(nan|NaN|NAN)\s*$";
/// A boolean as serde-saphyr reads one from text (YAML 1.1's words, in any case).
const BOOLEAN: &str = r"^\s*([Tt][Rr][Uu][Ee]|[Ff][Aa][Ll][Ss][Ee]|[Yy]([Ee][Ss])?|[Nn][Oo]?|[Oo][Nn]|[Oo][Ff][Ff])\s*$";

/// The schema of a topology file.
pub fn schema() -> Schema {
    SchemaSettings::draft2020_12()
        .with_transform(Scalars)
        .into_generator()
        .into_root_schema_for::<Topology>()
}

/// The schema as `onceflow schema` prints it (and `docs/topology.schema.json` holds it):
/// pretty JSON and a final newline.
pub fn text() -> String {
    let mut text = serde_json::to_string_pretty(&schema()).unwrap_or_default();
    text.push('\n');
    text
}

/// Widens every scalar of a schema to what reading a topology file accepts for it (see the
/// module's documentation), recursively.
#[derive(Debug, Clone, Copy)]
pub struct Scalars;

impl Transform for Scalars {
    fn transform(&mut self, schema: &mut Schema) {
        transform_subschemas(self, schema);
        let Some(object) = schema.as_object_mut() else {
            return;
        };
        if object.get("default") == Some(&Value::Null) {
            object.remove("default");
        }
        if let Some(Value::String(text)) = object.get_mut("description") {
            *text = plain(text);
        }
        if let Some(choices) = enumerated(object) {
            // `enum` and `const` hold for every type: the reference goes beside them.
            let original = Value::Object(std::mem::take(object));
            let reference = serde_json::json!({ "type": "string", "pattern": VARIABLE });
            object.insert("anyOf".into(), Value::Array(vec![original, reference]));
            if let Some(description) = choices {
                object.insert("description".into(), description);
            }
            return;
        }
        widen(object);
    }
}

/// For a schema that is a choice among fixed strings (an `enum`, or a `oneOf` of `const`s):
/// `Some` of its description (moved out to the wrapper), `None` for any other schema.
fn enumerated(object: &mut Map<String, Value>) -> Option<Option<Value>> {
    let fixed = object.contains_key("enum")
        || object
            .get("oneOf")
            .and_then(Value::as_array)
            .is_some_and(|choices| {
                choices
                    .iter()
                    .all(|c| c.get("const").is_some_and(Value::is_string))
            });
    fixed.then(|| object.remove("description"))
}

/// Adds the string forms a scalar schema's types take when read from text.
fn widen(object: &mut Map<String, Value>) {
    let types: Vec<String> = match object.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
        _ => return,
    };
    let has = |t: &str| types.iter().any(|x| x == t);
    if has("string") {
        // A constrained string (one of an enum's names, a pattern) stays as it is.
        let constrained = ["const", "enum", "pattern", "format"]
            .iter()
            .any(|k| object.contains_key(*k));
        if !constrained {
            let mut more = types.clone();
            more.extend(["number".to_string(), "boolean".to_string()]);
            set_types(object, more);
        }
        return;
    }
    let text = if has("integer") {
        let unsigned = object
            .get("minimum")
            .and_then(Value::as_f64)
            .is_some_and(|m| m >= 0.0);
        if unsigned { UNSIGNED } else { SIGNED }
    } else if has("number") {
        NUMBER
    } else if has("boolean") {
        BOOLEAN
    } else {
        return;
    };
    let mut more = types.clone();
    more.push("string".to_string());
    set_types(object, more);
    // `pattern` holds for strings only, `minimum` and `format` for numbers only.
    object.insert("pattern".into(), format!("{text}|{VARIABLE}").into());
}

fn set_types(object: &mut Map<String, Value>, types: Vec<String>) {
    let mut types = types;
    types.dedup();
    object.insert(
        "type".into(),
        Value::Array(types.into_iter().map(Value::String).collect()),
    );
}

/// A doc comment as plain text: the lines of a paragraph joined, rustdoc's links
/// (``[`Topology::validate`]``) as the code they name.
fn plain(doc: &str) -> String {
    let paragraphs: Vec<String> = doc
        .split("\n\n")
        .map(|p| {
            p.lines()
                .map(str::trim)
                .collect::<Vec<_>>()
                .join(" ")
                .replace("[`", "`")
                .replace("`]", "`")
        })
        .collect();
    paragraphs.join("\n\n")
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use super::*;
    use crate::topology::env::{self, Strictness};

    fn validator() -> jsonschema::Validator {
        jsonschema::validator_for(schema().as_value()).expect("the schema is a valid JSON Schema")
    }

    /// YAML text as a YAML 1.2 reader sees it (editors, check-jsonschema): `yes` is a string,
    /// `${VAR}` a string.
    fn as_json(text: &str) -> Value {
        let options = serde_saphyr::options! { strict_booleans: true };
        serde_saphyr::from_str_with_options(text, options).expect("YAML")
    }

    /// The schema's problems with `text`, as check-jsonschema would find them.
    fn schema_problems(validator: &jsonschema::Validator, text: &str) -> Vec<String> {
        let value = as_json(text);
        validator
            .iter_errors(&value)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect()
    }

    /// Whether serde reads `text` as a topology, its variables expanded as onceflow does:
    /// `COMMIT_MS` set, the others unset (to their defaults).
    fn serde_takes(text: &str) -> bool {
        let env = |name: &str| (name == "COMMIT_MS").then(|| "300".to_string());
        let (text, _) = env::interpolate(text, &env, Strictness::Lenient);
        super::super::Topology::parse_unchecked(&text).is_ok()
    }

    fn examples() -> Vec<PathBuf> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("topologies");
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .expect("topologies/")
            .map(|e| e.expect("entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        files
    }

    #[test]
    fn the_schema_takes_what_serde_takes_and_refuses_what_it_refuses() {
        const BASE: &str = "name: t\ninputs: [{topic: in}]\noutputs: [{topic: out}]\n";
        let with_base = [
            ("", true),
            // Numbers: plain, quoted, in hex, from a variable; not words, fractions, or signs
            // where they are unsigned.
            ("runtime:\n  commit_interval_ms: 250\n", true),
            ("runtime:\n  commit_interval_ms: '250'\n", true),
            ("runtime:\n  commit_interval_ms: 0x10\n", true),
            ("runtime:\n  commit_interval_ms: ${COMMIT_MS:-250}\n", true),
            (
                "runtime:\n  commit_interval_ms: \"${COMMIT_MS:?say how often}\"\n",
                true,
            ),
            ("runtime:\n  commit_interval_ms: lots\n", false),
            ("runtime:\n  commit_interval_ms: 2.5\n", false),
            ("runtime:\n  commit_interval_ms: -5\n", false),
            ("runtime:\n  commit_interval_ms: '-5'\n", false),
            ("runtime:\n  commit_interval_ms: ~\n", false),
            // Booleans: YAML 1.1's words too, and variables.
            ("runtime:\n  static_membership: ${STATIC:-false}\n", true),
            ("runtime:\n  static_membership: yes\n", true),
            ("runtime:\n  static_membership: 'Off'\n", true),
            ("runtime:\n  static_membership: maybe\n", false),
            // Enumerations: a name, or a variable.
            ("runtime:\n  on_error: ${ON_ERROR:-skip}\n", true),
            ("runtime:\n  on_error: explode\n", false),
            // Unknown fields, everywhere.
            ("runtime:\n  commit_interval: 5\n", false),
            ("dead_letter:\n  topc: x\n", false),
            ("dead_letter: ~\n", false),
            // Strings take numbers and booleans as their text; a null only where optional.
            (
                "kafka:\n  producer:\n    linger.ms: 20\n    x.y: true\n",
                true,
            ),
            ("kafka:\n  common:\n    a: ~\n", false),
            ("group_id: 12\n", true),
            ("group_id: ~\n", true),
            // Processors: one known step per item, its settings known.
            (
                "pipeline:\n  - drop_empty: {}\n  - filter: 'value.x > 1'\n  - set_header: {name: a, value: b}\n",
                true,
            ),
            ("pipeline:\n  - filtr: x\n", false),
            ("pipeline:\n  - drop_empty: {x: 1}\n", false),
            ("pipeline:\n  - filter: a\n    set_key: b\n", false),
            (
                "pipeline:\n  - aggregate: {name: n, op: count, window: {tumbling: 1m}}\n",
                true,
            ),
            ("pipeline:\n  - aggregate: {name: n, op: average}\n", false),
            (
                "schema_registry:\n  url: http://registry\n  timeout_ms: ${TIMEOUT_MS:-5000}\n",
                true,
            ),
        ];
        let whole = [
            // An input is a topic or an outbox.
            (
                "name: t\ninputs:\n  - codec: json\noutputs: [{topic: o}]\n",
                false,
            ),
            (
                "name: t\ninputs:\n  - postgres_outbox:\n      url_env: U\n      max_shards: ~\n",
                true,
            ),
            ("name: t\ninputs:\n  - topic: a\n    cdec: json\n", false),
            ("name: t\noutputs: [{topic: o}]\n", false),
            ("inputs: [{topic: a}]\n", false),
            (
                "name: t\ninputs: [{topic: a}]\noutputs:\n  - topic: o\n    lineage: 'false'\n",
                true,
            ),
            (
                "name: t\ninputs: [{topic: a}]\noutputs:\n  - topic: o\n    headers: none\n",
                false,
            ),
        ];
        let validator = validator();
        let mut wrong = Vec::new();
        let cases = with_base
            .iter()
            .map(|(more, ok)| (format!("{BASE}{more}"), *ok))
            .chain(whole.iter().map(|(text, ok)| (text.to_string(), *ok)));
        for (text, expected) in cases {
            let problems = schema_problems(&validator, &text);
            let serde = serde_takes(&text);
            if problems.is_empty() != expected || serde != expected {
                wrong.push(format!(
                    "{text}--- expected {expected}, serde {serde}, schema {problems:?}"
                ));
            }
        }
        assert!(wrong.is_empty(), "\n{}", wrong.join("\n\n"));
    }

    #[test]
    fn every_example_topology_names_the_schema_and_follows_it() {
        let validator = validator();
        let mut wrong = Vec::new();
        let files = examples();
        assert!(files.len() >= 5, "{files:?}");
        for file in files {
            let text = std::fs::read_to_string(&file).expect("read");
            if text.lines().next() != Some(MODELINE) {
                wrong.push(format!(
                    "{}: the first line is not `{MODELINE}`",
                    file.display()
                ));
            }
            for problem in schema_problems(&validator, &text) {
                wrong.push(format!("{}: {problem}", file.display()));
            }
        }
        assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
    }

    /// The first line of every example topology: the schema for editors (yaml-language-server).
    const MODELINE: &str = "# yaml-language-server: $schema=../docs/topology.schema.json";

    #[test]
    fn every_field_has_a_description() {
        let schema = schema();
        let mut missing = Vec::new();
        let mut objects: Vec<(String, &Value)> = vec![("".into(), schema.as_value())];
        if let Some(defs) = schema.get("$defs").and_then(Value::as_object) {
            objects.extend(defs.iter().map(|(name, s)| (name.clone(), s)));
        }
        for (name, object) in objects {
            let properties = object.get("properties").and_then(Value::as_object);
            for (field, s) in properties.into_iter().flatten() {
                if s.get("description").is_none() {
                    missing.push(format!("{name}.{field}"));
                }
            }
        }
        assert!(
            missing.is_empty(),
            "fields without a doc comment: {missing:?}"
        );
    }

    #[test]
    fn descriptions_are_plain_text() {
        assert_eq!(
            plain("One line\nand its wrap, see [`Topology::validate`].\n\nA second."),
            "One line and its wrap, see `Topology::validate`.\n\nA second."
        );
    }
}
