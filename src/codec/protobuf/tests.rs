use super::*;
use crate::codec::json::Doc;
use serde_json::json;

const ORDER: &str = r#"
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "common/money.proto";

message Order {
  enum Status { NEW = 0; PAID = 1; SHIPPED = 2; }
  message Line { string sku = 1; int32 quantity = 2; common.Money price = 3; }
  int64 id = 1;
  string customer = 2;
  Status status = 3;
  repeated Line lines = 4;
  map<string, string> tags = 5;
  google.protobuf.Timestamp placed_at = 6;
  google.protobuf.Duration hold = 7;
  google.protobuf.StringValue note = 8;
  bytes blob = 9;
  uint64 big = 10;
  double ratio = 11;
  bool gift = 12;
  optional int32 priority = 13;
}

message Refund { int64 order_id = 1; }
"#;

const MONEY: &str = r#"
syntax = "proto3";
package common;
message Money { string currency = 1; int64 units = 2; }
"#;

fn imports() -> Vec<Reference> {
    vec![Reference {
        name: "common/money.proto".into(),
        subject: "common/money.proto".into(),
        text: MONEY.into(),
    }]
}

fn order_json() -> Json {
    json!({
        "id": 9_007_199_254_740_993_i64,
        "customer": "c-1",
        "status": "PAID",
        "lines": [{"sku": "a", "quantity": 2, "price": {"currency": "EUR", "units": 12}}],
        "tags": {"channel": "web"},
        "placed_at": "2026-12-07T10:00:00.250Z",
        "hold": "1.500s",
        "note": "ring twice",
        "blob": "AAEC",
        "big": 18_446_744_073_709_551_615_u64,
        "ratio": 0.25,
        "gift": true,
        "priority": 3
    })
}

use serde_json::Value as Json;

fn setup(message: Option<&str>) -> (Arc<Registry>, ProtobufEncoder, ProtobufDecoder) {
    let registry = Arc::new(Registry::offline());
    let (registered, descriptor) = registered(ORDER.into(), imports(), message).unwrap();
    let id = registry
        .register_schema("orders-value", &registered, true)
        .unwrap();
    let encoder = ProtobufEncoder::new(id, "orders-value".into(), descriptor);
    let decoder = ProtobufDecoder::new(Arc::clone(&registry));
    (registry, encoder, decoder)
}

fn encode(e: &ProtobufEncoder, v: &Json) -> Result<Vec<u8>, CodecError> {
    let text = v.to_string();
    let doc = Doc::parse(text.as_bytes()).unwrap();
    e.encode(&Value::Json(Some(doc)), 0).map(Option::unwrap)
}

fn decode(d: &ProtobufDecoder, bytes: &[u8]) -> Result<Json, CodecError> {
    match d.decode(Some(bytes))? {
        Value::Json(Some(doc)) => Ok(doc.to_json()),
        other => panic!("not a document: {other:?}"),
    }
}

#[test]
fn a_message_with_every_kind_of_field_round_trips_as_a_document() {
    let (_, e, d) = setup(None);
    let bytes = encode(&e, &order_json()).unwrap();
    // The file's first message: the single index byte 0.
    assert_eq!(&bytes[..6], &[0, 0, 0, 0, 1, 0]);
    let got = decode(&d, &bytes).unwrap();
    assert_eq!(got, order_json());
    // Field order is the message's.
    let Value::Json(Some(Doc::Object(fields))) = d.decode(Some(&bytes)).unwrap() else {
        panic!()
    };
    let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_ref()).collect();
    assert_eq!(&names[..4], &["id", "customer", "status", "lines"]);
}

#[test]
fn unset_fields_read_as_their_defaults_and_unset_messages_as_null() {
    let (_, e, d) = setup(None);
    let got = decode(&d, &encode(&e, &json!({"id": 1})).unwrap()).unwrap();
    assert_eq!(got["customer"], json!(""));
    assert_eq!(got["status"], json!("NEW"));
    assert_eq!(got["lines"], json!([]));
    assert_eq!(got["placed_at"], Json::Null);
    assert_eq!(got["priority"], Json::Null);
    assert_eq!(got["big"], json!(0));
}

#[test]
fn another_message_of_the_file_is_written_with_its_indexes() {
    let (_, e, d) = setup(Some("Refund"));
    let bytes = encode(&e, &json!({"order_id": 5})).unwrap();
    // Count 1, index 1 (zigzag: 2, 2).
    assert_eq!(&bytes[5..7], &[2, 2]);
    assert_eq!(decode(&d, &bytes).unwrap(), json!({"order_id": 5}));
    let (_, nested, _) = setup(Some("shop.Order.Line"));
    let bytes = encode(&nested, &json!({"sku": "x"})).unwrap();
    // Count 2, indexes 0 and 0 (the enum and the map's entry are not messages declared).
    assert_eq!(&bytes[5..8], &[4, 0, 0]);
    assert_eq!(decode(&d, &bytes).unwrap()["sku"], json!("x"));
}

#[test]
fn a_message_the_schema_does_not_declare_is_named_with_the_ones_it_does() {
    let err = registered(ORDER.into(), imports(), Some("Nope")).unwrap_err();
    assert!(err.contains("no message `Nope`"), "{err}");
    assert!(err.contains("shop.Order, shop.Refund"), "{err}");
    let err = registered(ORDER.into(), Vec::new(), None).unwrap_err();
    assert!(err.contains("common/money.proto"), "{err}");
    let err = registered("syntax = \"proto3\"; message {".into(), Vec::new(), None).unwrap_err();
    assert!(!err.is_empty());
}

#[test]
fn a_document_that_does_not_fit_the_message_is_a_schema_mismatch_naming_the_field() {
    let (_, e, _) = setup(None);
    for (value, says) in [
        (json!({"id": 1, "colour": "red"}), "colour"),
        (json!({"id": "x"}), "id"),
        (json!({"status": "LOST"}), "LOST"),
        (json!({"id": 1.5}), "id"),
        (json!({"placed_at": "yesterday"}), "placed_at"),
    ] {
        let err = encode(&e, &value).unwrap_err();
        assert_eq!(err.kind, ErrorKind::SchemaMismatch, "{value}");
        assert!(
            err.message.contains(says) || err.message.contains("timestamp"),
            "{value}: {err}"
        );
    }
}

#[test]
fn bad_input_is_a_record_error_of_its_kind() {
    let (registry, e, d) = setup(None);
    registry.add_registered(50, Registered::new(Format::JsonSchema, "{}"));
    registry.add_registered(51, Registered::new(Format::Protobuf, "message {"));
    let good = encode(&e, &order_json()).unwrap();
    let err = |bytes: &[u8]| d.decode(Some(bytes)).unwrap_err();
    let mut wrong_magic = good.clone();
    wrong_magic[0] = 1;
    assert_eq!(err(&wrong_magic).kind, ErrorKind::BadProtobuf);
    assert!(err(&wrong_magic).message.contains("magic byte"));
    assert_eq!(err(&good[..3]).kind, ErrorKind::BadProtobuf);
    // Message index [5]: the file has 2 top-level messages.
    let mut unknown_index = good[..5].to_vec();
    unknown_index.extend_from_slice(&[2, 10]);
    let e5 = err(&unknown_index);
    assert_eq!(e5.kind, ErrorKind::BadProtobuf);
    assert!(e5.message.contains("no message at index [5]"), "{e5}");
    let truncated = err(&good[..good.len() - 3]);
    assert_eq!(truncated.kind, ErrorKind::BadProtobuf);
    assert!(truncated.message.contains("shop.Order"), "{truncated}");
    let unknown_id = err(&[0, 0, 0, 0, 99, 0]);
    assert_eq!(unknown_id.kind, ErrorKind::UnknownSchema);
    let other_format = err(&[0, 0, 0, 0, 50, 0]);
    assert_eq!(other_format.kind, ErrorKind::UnknownSchema);
    assert!(
        other_format.message.contains("JSON schema, not PROTOBUF"),
        "{other_format}"
    );
    let broken = err(&[0, 0, 0, 0, 51, 0]);
    assert!(
        broken.message.contains("not a valid Protobuf schema"),
        "{broken}"
    );
    assert!(matches!(d.decode(None), Ok(Value::Json(None))));
}

#[test]
fn indexes_count_declared_messages_only() {
    let schema = Schema::compile(
        "syntax = \"proto3\"; message A { map<string, int32> m = 1; message B {} message C { message D {} } } message E {}",
        &[],
    )
    .unwrap();
    let d = schema.message(Some("A.C.D")).unwrap();
    // The map's entry message is not counted: B is 0, C is 1.
    assert_eq!(indexes_of(&d), vec![0, 1, 0]);
    assert_eq!(schema.message_at(&[0, 1, 0]).unwrap(), d);
    assert_eq!(indexes_of(&schema.message(Some("E")).unwrap()), vec![1]);
    assert!(schema.message_at(&[0, 2]).is_none());
}

#[test]
fn a_schema_registered_as_a_serialized_descriptor_compiles_as_its_text_does() {
    use base64::Engine as _;
    // The descriptors of MONEY and ORDER, as Confluent's Python serializer registers them.
    let text = Schema::compile(ORDER, &imports()).unwrap();
    let b64 = |f: &FileDescriptor| {
        base64::engine::general_purpose::STANDARD.encode(f.file_descriptor_proto().encode_to_vec())
    };
    let money = text
        .file
        .parent_pool()
        .get_file_by_name("common/money.proto")
        .unwrap();
    let serialized_imports = vec![Reference {
        text: b64(&money),
        ..imports().remove(0)
    }];
    let from_serialized = Schema::compile(&b64(&text.file), &serialized_imports).unwrap();
    let order = from_serialized.message(Some("shop.Order")).unwrap();
    let (_, e, _) = setup(None);
    let bytes = encode(&e, &order_json()).unwrap();
    let message = DynamicMessage::decode(order, &bytes[6..]).unwrap();
    assert_eq!(
        doc::to_doc(&message).unwrap().to_json(),
        order_json(),
        "read with the schema from its serialized form"
    );
}

#[test]
fn an_output_takes_json_names_enum_numbers_and_64_bit_integers_as_text() {
    let (_, e, d) = setup(None);
    let bytes = encode(
        &e,
        &json!({"id": "12", "placedAt": "2026-12-07T10:00:00Z", "status": 2, "big": "7"}),
    )
    .unwrap();
    let got = decode(&d, &bytes).unwrap();
    assert_eq!(got["id"], json!(12));
    assert_eq!(got["placed_at"], json!("2026-12-07T10:00:00Z"));
    assert_eq!(got["status"], json!("SHIPPED"));
    assert_eq!(got["big"], json!(7));
    let err = encode(&e, &json!({"colour": "red"})).unwrap_err();
    assert!(
        err.message.contains("unrecognized field name 'colour'"),
        "{err}"
    );
}
