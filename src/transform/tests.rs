use serde_json::json;

use super::*;

fn topology(yaml: &str) -> Topology {
    Topology::parse(yaml, "t.yaml").unwrap_or_else(|e| panic!("{e}"))
}

fn pipeline(yaml: &str) -> Pipeline {
    Pipeline::compile(&topology(yaml)).unwrap_or_else(|e| panic!("{e:?}"))
}

/// A JSON topology with `pipeline` (YAML flow list) and outputs `a`, `b`.
fn json_job(pipeline_yaml: &str) -> Pipeline {
    pipeline(&format!(
        "name: t\ninputs: [{{topic: in, codec: json}}]\npipeline: {pipeline_yaml}\noutputs: [{{topic: a}}]\n"
    ))
}

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

fn run(p: &Pipeline, value: &str) -> Result<Vec<(usize, Record)>, RecordError> {
    let mut out = Vec::new();
    p.process(record(Some(value)), &mut out).map(|()| out)
}

fn values(out: &[(usize, Record)]) -> Vec<serde_json::Value> {
    out.iter()
        .map(|(_, r)| serde_json::from_slice(r.value.as_deref().unwrap_or(b"null")).unwrap())
        .collect()
}

const RAW: &str = "name: t\ninputs: [{topic: in}]\noutputs: [{topic: out}]\n";

#[test]
fn empty_pipeline_passes_raw_records_through() {
    let p = pipeline(RAW);
    let mut out = Vec::new();
    p.process(record(Some("not json")), &mut out).unwrap();
    assert_eq!(out, vec![(0, record(Some("not json")))]);
}

#[test]
fn set_header_replaces_a_header_of_the_same_name() {
    let p = pipeline(&format!(
        "{RAW}pipeline: [{{set_header: {{name: h, value: new}}}}, {{set_header: {{name: t, expr: 'topic + \":\" + string(offset)'}}}}]\n"
    ));
    let mut out = Vec::new();
    p.process(record(Some("v")), &mut out).unwrap();
    assert_eq!(
        out[0].1.headers,
        vec![
            ("h".to_string(), b"new".to_vec()),
            ("t".to_string(), b"in:7".to_vec())
        ]
    );
}

#[test]
fn drop_empty_drops_tombstones_and_empty_values_only() {
    let p = pipeline(&format!("{RAW}pipeline: [{{drop_empty: {{}}}}]\n"));
    let mut out = Vec::new();
    p.process(record(None), &mut out).unwrap();
    p.process(record(Some("")), &mut out).unwrap();
    p.process(record(Some("x")), &mut out).unwrap();
    assert_eq!(out, vec![(0, record(Some("x")))]);
}

#[test]
fn filter_keeps_records_matching_the_predicate() {
    let p = json_job("[{filter: 'value.n > 1'}]");
    assert_eq!(run(&p, r#"{"n": 1}"#).unwrap().len(), 0);
    assert_eq!(run(&p, r#"{"n": 2}"#).unwrap().len(), 1);
}

#[test]
fn map_sets_fields_from_the_record_as_it_entered() {
    let p = json_job(
        "[{map: {total: 'value.price * double(value.qty)', meta.src: 'topic', price: '0'}}]",
    );
    let out = run(&p, r#"{"price": 2.5, "qty": 4}"#).unwrap();
    assert_eq!(
        values(&out),
        vec![json!({"price": 0, "qty": 4, "total": 10.0, "meta": {"src": "in"}})]
    );
}

#[test]
fn drop_fields_and_rename_work_on_nested_paths() {
    let p = json_job("[{drop_fields: [a, b.c, nope.x]}, {rename: {b.d: e, zz: y}}]");
    let out = run(&p, r#"{"a": 1, "b": {"c": 2, "d": 3}, "z": 4}"#).unwrap();
    assert_eq!(values(&out), vec![json!({"b": {}, "e": 3, "z": 4})]);
}

#[test]
fn set_key_takes_the_expression_result() {
    let p = json_job("[{set_key: 'value.id'}]");
    let out = run(&p, r#"{"id": 42}"#).unwrap();
    assert_eq!(out[0].1.key, Some(b"42".to_vec()));
    let p = json_job("[{set_key: 'value.id'}]");
    let out = run(&p, r#"{"id": "x-1"}"#).unwrap();
    assert_eq!(out[0].1.key, Some(b"x-1".to_vec()));
}

#[test]
fn explode_makes_one_record_per_element() {
    let p = json_job("[{explode: {field: items, as: item}}, {set_key: 'string(value.item.sku)'}]");
    let out = run(&p, r#"{"order": 1, "items": [{"sku": 10}, {"sku": 11}]}"#).unwrap();
    assert_eq!(
        values(&out),
        vec![
            json!({"order": 1, "item": {"sku": 10}}),
            json!({"order": 1, "item": {"sku": 11}})
        ]
    );
    assert_eq!(out[1].1.key, Some(b"11".to_vec()));
    assert!(run(&p, r#"{"items": []}"#).unwrap().is_empty());
    let err = run(&p, r#"{"items": 3}"#).unwrap_err();
    assert_eq!(err.kind, ErrorKind::WrongType);
    let err = run(&p, r#"{"other": 3}"#).unwrap_err();
    assert_eq!(err.kind, ErrorKind::MissingField);
    assert_eq!(
        err.stage,
        Stage::Processor {
            index: 0,
            name: "explode"
        }
    );
}

#[test]
fn route_sends_records_by_predicate_with_a_default() {
    let yaml = "name: t\ninputs: [{topic: in, codec: json}]\npipeline:\n  - route:\n      routes:\n        - {when: 'value.s == \"a\"', to: [a]}\n        - {when: 'value.n > 1', to: [a, b]}\n      default: [c]\n      mode: all\noutputs: [{topic: a}, {topic: b, key: 'value.s', headers: drop}, {topic: c, codec: raw}]\n";
    let p = pipeline(yaml);
    let idx = |v: &str| -> Vec<usize> { run(&p, v).unwrap().iter().map(|(i, _)| *i).collect() };
    assert_eq!(idx(r#"{"s": "a", "n": 1}"#), vec![0]);
    assert_eq!(idx(r#"{"s": "a", "n": 2}"#), vec![0, 1]);
    assert_eq!(idx(r#"{"s": "b", "n": 2}"#), vec![0, 1]);
    assert_eq!(idx(r#"{"s": "b", "n": 0}"#), vec![2]);
    let out = run(&p, r#"{"s": "b", "n": 2}"#).unwrap();
    assert_eq!(out[1].1.key, Some(b"b".to_vec()));
    assert!(out[1].1.headers.is_empty());
    assert_eq!(out[0].1.headers.len(), 1);
}

#[test]
fn first_mode_stops_at_the_first_matching_route() {
    let yaml = "name: t\ninputs: [{topic: in, codec: json}]\npipeline:\n  - route:\n      routes:\n        - {when: 'true', to: [a]}\n        - {when: 'true', to: [b]}\n      default: []\noutputs: [{topic: a}, {topic: b}]\n";
    let out = run(&pipeline(yaml), "{}").unwrap();
    assert_eq!(out.iter().map(|(i, _)| *i).collect::<Vec<_>>(), vec![0]);
}

#[test]
fn bad_json_and_failing_expressions_are_permanent_errors_with_their_stage() {
    let p = json_job("[{drop_empty: {}}, {filter: 'value.n > 1'}]");
    let err = run(&p, "{not json").unwrap_err();
    assert_eq!(
        (err.kind, err.stage.clone()),
        (ErrorKind::BadJson, Stage::Decode)
    );
    assert!(err.is_permanent());
    let err = run(&p, r#"{"m": 1}"#).unwrap_err();
    assert_eq!(err.kind, ErrorKind::MissingField);
    assert_eq!(
        err.stage,
        Stage::Processor {
            index: 1,
            name: "filter"
        }
    );
    assert!(err.to_string().contains("pipeline[1] (filter)"), "{err}");
    let err = run(&p, r#"{"n": "x"}"#).unwrap_err();
    assert_eq!(err.kind, ErrorKind::WrongType);
    let p = json_job("[{filter: 'value.n'}]");
    assert_eq!(
        run(&p, r#"{"n": 1}"#).unwrap_err().kind,
        ErrorKind::WrongType
    );
}

#[test]
fn compile_reports_every_bad_expression_with_its_path() {
    let t = topology(
        "name: t\ninputs: [{topic: in, codec: json}]\npipeline: [{filter: 'value.a ='}, {map: {x: 'bogus + 1', y: '1'}}]\noutputs: [{topic: a, key: '(('}]\n",
    );
    let issues = Pipeline::compile(&t).unwrap_err();
    let paths: Vec<&str> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        vec!["pipeline[0].filter", "pipeline[1].map.x", "outputs[0].key"]
    );
}

#[test]
fn raw_values_are_bytes_or_strings_to_expressions() {
    let p = pipeline(&format!(
        "{RAW}pipeline: [{{filter: 'value.startsWith(\"ok\")'}}]\n"
    ));
    assert_eq!(run(&p, "ok then").unwrap().len(), 1);
    assert_eq!(run(&p, "no").unwrap().len(), 0);
}

#[test]
fn expressions_reach_into_lazily_decoded_documents_like_into_decoded_ones() {
    let p = json_job(
        "[{map: {a: 'has(value.customer.id)', b: 'has(value.customer.nope)', \
         c: 'value.items.exists(i, i.sku == \"a\")', d: 'size(value.items)', \
         e: 'value[\"status\"]', f: 'value.customer.address.city == \"London\"', \
         g: 'value.customer.address', h: 'has(value.zz)', i: 'value.esc'}}, \
         {set_key: 'value.customer.address.city'}]",
    );
    let out = run(
        &p,
        r#"{"status":"paid","esc":"a\"b","customer":{"id":1,"address":{"city":"London","zip":"N1"}},"items":[{"sku":"a"},{"sku":"b"}]}"#,
    )
    .unwrap();
    assert_eq!(out[0].1.key, Some(b"London".to_vec()));
    assert_eq!(
        values(&out),
        vec![json!({
            "status": "paid", "esc": "a\"b",
            "customer": {"id": 1, "address": {"city": "London", "zip": "N1"}},
            "items": [{"sku": "a"}, {"sku": "b"}],
            "a": true, "b": false, "c": true, "d": 2, "e": "paid", "f": true,
            "g": {"city": "London", "zip": "N1"}, "h": false, "i": "a\"b"
        })]
    );
    let err = run(&p, r#"{"customer": {}}"#).unwrap_err();
    assert_eq!(err.kind, ErrorKind::MissingField);
}

#[test]
fn untouched_fields_keep_their_bytes_and_order() {
    let p = json_job("[{map: {z: '1'}}, {drop_fields: [b]}]");
    let out = run(&p, r#"{"c": 1.50, "b": 2, "a": "\u00e9"}"#).unwrap();
    assert_eq!(
        out[0].1.value.as_deref(),
        Some(br#"{"c":1.50,"a":"\u00e9","z":1}"#.as_slice())
    );
}

/// Expressions over Avro records (the Avro codec's own tests are in [`crate::codec::avro`]).
mod avro {
    use std::sync::Arc;

    use apache_avro::types::Value as Avro;
    use serde_json::{Value as Json, json};

    use crate::codec::avro::parsed_schema as schema;
    use crate::codec::avro::{
        AvroDecoder, ORDER, decode_json, frame, order_value, reference_encode, registry_with,
    };
    use crate::record::ErrorKind;

    #[test]
    fn keys_decode_for_expressions_and_encode_with_their_own_schema() {
        use crate::record::{Origin, Record};
        let yaml = r#"
name: keys
schema_registry: {url: "http://127.0.0.1:1"}
inputs: [{topic: in, codec: avro, key_codec: avro}]
pipeline:
  - filter: 'key.region == "eu"'
  - route: {routes: [{when: 'key.n > 1', to: [same-key]}], default: [by-customer]}
outputs:
  - topic: by-customer
    codec: json
    key_codec: avro
    key_avro: {schema: '{"type":"record","name":"CustomerKey","fields":[{"name":"customer","type":"string"}]}'}
    key: '{"customer": value.customer}'
  - topic: same-key
    codec: json
    key_codec: json
"#;
        let topology = crate::topology::Topology::parse(yaml, "keys").unwrap();
        let pipeline = crate::transform::Pipeline::compile(&topology).unwrap();
        let key_schema = r#"{"type":"record","name":"K","fields":[{"name":"region","type":"string"},{"name":"n","type":"long"}]}"#;
        let registry = Arc::clone(pipeline.registry());
        registry.add(100, schema(key_schema)).unwrap();
        registry.add(101, schema(ORDER)).unwrap();
        let key = |region: &str| {
            frame(
                100,
                &reference_encode(
                    &schema(key_schema),
                    Avro::Record(vec![
                        ("region".into(), Avro::String(region.into())),
                        ("n".into(), Avro::Long(1)),
                    ]),
                ),
            )
        };
        let record = |region: &str| Record {
            key: Some(key(region)),
            value: Some(frame(
                101,
                &reference_encode(&schema(ORDER), order_value(5)),
            )),
            headers: Vec::new(),
            timestamp: None,
            origin: Origin {
                topic: "in".into(),
                partition: 0,
                offset: 0,
            },
        };
        let mut out = Vec::new();
        pipeline.process(record("us"), &mut out).unwrap();
        assert!(out.is_empty(), "filtered on the decoded key");
        pipeline.process(record("eu"), &mut out).unwrap();
        assert_eq!(out.len(), 1);
        let written = out[0].1.key.clone().unwrap();
        let decoder = AvroDecoder::new(Arc::clone(&registry), None);
        assert_eq!(
            decode_json(&decoder, &written).unwrap(),
            json!({"customer": "ada"})
        );
        // A key that is not Avro fails the record, naming the key.
        let mut bad = record("eu");
        bad.key = Some(b"plain".to_vec());
        let err = pipeline.process(bad, &mut out).unwrap_err();
        assert_eq!(err.kind, ErrorKind::BadAvro);
        assert!(err.message.starts_with("the key: "), "{err}");
    }

    #[test]
    fn expressions_work_on_avro_records_as_on_json_documents() {
        use crate::record::{Origin, Record};
        // The same pipeline over the same order, once Avro and once JSON: the same outputs.
        let pipeline_over = |codec: &str| {
            let yaml = format!(
                r#"
name: cel
schema_registry: {{url: "http://127.0.0.1:1"}}
inputs: [{{topic: in, codec: {codec}}}]
pipeline:
  - filter: 'value.status == "PAID" && value.coupon != null && value.tags.exists(t, t == "b")'
  - filter: 'value.attributes.weight > 5 && timestamp(value.placed_at) > timestamp("2024-01-01T00:00:00Z")'
  - map:
      total: 'value.amount * double(value.quantity)'
      first_tag: 'value.tags[0]'
      day: 'string(timestamp(value.placed_at).getFullYear())'
  - set_key: 'value.customer + "-" + string(value.id)'
outputs: [{{topic: out, codec: json}}]
"#
            );
            let topology = crate::topology::Topology::parse(&yaml, "cel").unwrap();
            crate::transform::Pipeline::compile(&topology).unwrap()
        };
        let avro = pipeline_over("avro");
        avro.registry().add(7, schema(ORDER)).unwrap();
        let json = pipeline_over("json");
        let avro_bytes = frame(7, &reference_encode(&schema(ORDER), order_value(42)));
        let doc = decode_json(
            &AvroDecoder::new(registry_with(7, ORDER), None),
            &avro_bytes,
        )
        .unwrap();
        let record = |value: Vec<u8>| Record {
            key: None,
            value: Some(value),
            headers: Vec::new(),
            timestamp: None,
            origin: Origin {
                topic: "in".into(),
                partition: 0,
                offset: 0,
            },
        };
        let (mut from_avro, mut from_json) = (Vec::new(), Vec::new());
        avro.process(record(avro_bytes), &mut from_avro).unwrap();
        json.process(record(doc.to_string().into_bytes()), &mut from_json)
            .unwrap();
        assert_eq!(from_avro.len(), 1, "the filters passed the Avro record");
        let out = |v: &[(usize, Record)]| {
            (
                v[0].1.key.clone(),
                serde_json::from_slice::<Json>(v[0].1.value.as_deref().unwrap()).unwrap(),
            )
        };
        assert_eq!(out(&from_avro), out(&from_json));
        let (key, value) = out(&from_avro);
        assert_eq!(key.as_deref(), Some(b"ada-42".as_slice()));
        assert_eq!(value["total"], json!(37.5));
        assert_eq!(value["first_tag"], json!("a"));
        assert_eq!(value["day"], json!("2024"));
    }
}
