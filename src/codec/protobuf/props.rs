//! The property test of [`mod@super::read`]: random messages of the test schemas (every kind,
//! nested, repeated packed and unpacked, maps, enums with unknown numbers, oneofs, optional
//! fields, well-known types, unknown fields, repeated and merged fields), and the same bytes
//! cut short or with bytes changed, read by the tables and by prost-reflect's dynamic message
//! with its JSON mapping ([`super::doc::to_doc`]): both refuse, or both give the same document.

use prost_reflect::prost::encoding::{WireType, encode_key, encode_varint};
use prost_reflect::{DynamicMessage, FieldDescriptor, Kind, MessageDescriptor};
use rand::{Rng, RngCore, SeedableRng};

use super::table::Table;
use super::{Schema, doc, read};
use crate::codec::json::Doc;

pub const ALL: &str = r#"
syntax = "proto3";
package prop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/duration.proto";
import "google/protobuf/wrappers.proto";
import "google/protobuf/struct.proto";
message All {
  enum Colour { option allow_alias = true; RED = 0; GREEN = 1; BLUE = 2; AZURE = 2; }
  message Inner { string s = 1; int32 i = 2; repeated Inner children = 3; Colour c = 4; }
  int32 i32 = 1; int64 i64 = 2; uint32 u32 = 3; uint64 u64 = 4; sint32 s32 = 5;
  sint64 s64 = 6; fixed32 f32 = 7; fixed64 f64 = 8; sfixed32 sf32 = 9; sfixed64 sf64 = 10;
  float fl = 11; double db = 12; bool b = 13; string s = 14; bytes by = 15;
  Colour colour = 16; Inner inner = 17;
  repeated int32 ri32 = 18; repeated sint64 rs64 = 19 [packed = false];
  repeated double rdb = 20; repeated string rs = 21; repeated Inner rinner = 22;
  repeated Colour rcolour = 23; repeated bool rb = 24 [packed = false];
  repeated fixed32 rf32 = 51; repeated float rfl = 52;
  map<string, int64> m_si = 25; map<int32, string> m_is = 26; map<bool, Inner> m_bi = 27;
  map<uint64, Colour> m_uc = 28; map<sint32, bytes> m_sb = 29; map<fixed64, double> m_fd = 30;
  oneof choice { string o_s = 31; Inner o_inner = 32; int64 o_i = 33; }
  optional int32 opt_i = 34; optional string opt_s = 35; optional Colour opt_c = 36;
  google.protobuf.Timestamp ts = 37; google.protobuf.Duration dur = 38;
  google.protobuf.StringValue w_s = 39; google.protobuf.Int64Value w_i = 40;
  google.protobuf.FloatValue w_f = 41; google.protobuf.BytesValue w_b = 42;
  google.protobuf.BoolValue w_bo = 43; google.protobuf.UInt32Value w_u = 44;
  google.protobuf.DoubleValue w_d = 45;
  google.protobuf.Struct st = 46; google.protobuf.Value val = 47;
  google.protobuf.NullValue nv = 48;
  repeated google.protobuf.Timestamp rts = 49;
  map<string, google.protobuf.Duration> m_dur = 50;
  uint32 big_number = 1000; string far = 536870911;
}
"#;

pub const TWO: &str = r#"
syntax = "proto2";
package prop2;
message Two {
  enum Kind { A = 1; B = 2; }
  optional int32 a = 1 [default = 7]; required string r = 2; repeated int32 ri = 3;
  repeated int32 rp = 4 [packed = true]; optional Kind k = 5; map<string, Kind> mk = 6;
  optional Two child = 7; repeated Kind rk = 8; optional bytes by = 9 [default = "x"];
}
"#;

/// The test schemas' root messages.
pub fn messages() -> Vec<MessageDescriptor> {
    [(ALL, "prop.All"), (TWO, "prop2.Two")]
        .iter()
        .map(|(text, name)| {
            let schema = Schema::compile(text, &[]).expect("the test schema compiles");
            schema.message(Some(name)).expect("the test message")
        })
        .collect()
}

fn key(number: u32, wire: WireType, out: &mut Vec<u8>) {
    encode_key(number, wire, out);
}

fn delimited(bytes: &[u8], out: &mut Vec<u8>) {
    encode_varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

fn varint_value(rng: &mut dyn RngCore) -> u64 {
    match rng.random_range(0..6) {
        0 => 0,
        1 => u64::MAX,
        2 => rng.random_range(0..300),
        3 => rng.random::<i32>() as i64 as u64,
        4 => u64::from(rng.random::<u32>()),
        _ => rng.random(),
    }
}

fn text(rng: &mut dyn RngCore) -> String {
    let n = rng.random_range(0..10);
    (0..n)
        .map(|_| char::from_u32(rng.random_range(32..0x2FF)).unwrap_or('x'))
        .collect()
}

fn float_bits(rng: &mut dyn RngCore) -> f64 {
    match rng.random_range(0..8) {
        0 => f64::NAN,
        1 => f64::INFINITY,
        2 => f64::NEG_INFINITY,
        3 => -0.0,
        4 => 0.0,
        5 => f64::from(rng.random::<f32>()),
        _ => rng.random_range(-1e12..1e12),
    }
}

/// One value of `kind`, as its wire type's payload (with the length for a message).
fn value(rng: &mut dyn RngCore, kind: &Kind, depth: u32, out: &mut Vec<u8>) {
    match kind {
        Kind::Int32 | Kind::Int64 | Kind::Uint32 | Kind::Uint64 | Kind::Bool => {
            encode_varint(varint_value(rng), out)
        }
        Kind::Sint32 | Kind::Sint64 => encode_varint(varint_value(rng), out),
        Kind::Enum(e) => {
            let n = if rng.random_ratio(1, 4) {
                rng.random_range(-3..40)
            } else {
                let values: Vec<i32> = e.values().map(|v| v.number()).collect();
                values[rng.random_range(0..values.len())]
            };
            encode_varint(n as i64 as u64, out)
        }
        Kind::Fixed32 | Kind::Sfixed32 => out.extend_from_slice(&rng.random::<u32>().to_le_bytes()),
        Kind::Float => out.extend_from_slice(&(float_bits(rng) as f32).to_le_bytes()),
        Kind::Fixed64 | Kind::Sfixed64 => out.extend_from_slice(&rng.random::<u64>().to_le_bytes()),
        Kind::Double => out.extend_from_slice(&float_bits(rng).to_le_bytes()),
        Kind::String => delimited(text(rng).as_bytes(), out),
        Kind::Bytes => {
            let b: Vec<u8> = (0..rng.random_range(0..8)).map(|_| rng.random()).collect();
            delimited(&b, out)
        }
        Kind::Message(m) => {
            let mut inner = Vec::new();
            message(rng, m, depth + 1, &mut inner);
            delimited(&inner, out)
        }
    }
}

/// A timestamp's or a duration's fields, mostly within the mapping's range.
fn time(rng: &mut dyn RngCore, out: &mut Vec<u8>) {
    if rng.random_ratio(7, 8) {
        key(1, WireType::Varint, out);
        let seconds: i64 = if rng.random_ratio(1, 10) {
            rng.random()
        } else {
            rng.random_range(-100_000_000_000..100_000_000_000)
        };
        encode_varint(seconds as u64, out);
    }
    if rng.random_ratio(3, 4) {
        key(2, WireType::Varint, out);
        let nanos: i32 = if rng.random_ratio(1, 10) {
            rng.random()
        } else {
            rng.random_range(0..1_000_000_000)
        };
        encode_varint(nanos as i64 as u64, out);
    }
}

/// A random message of `m`.
pub fn message(rng: &mut dyn RngCore, m: &MessageDescriptor, depth: u32, out: &mut Vec<u8>) {
    if matches!(
        m.full_name(),
        "google.protobuf.Timestamp" | "google.protobuf.Duration"
    ) {
        return time(rng, out);
    }
    let fields: Vec<FieldDescriptor> = m.fields().collect();
    let count = if depth > 3 {
        0
    } else {
        rng.random_range(0..14)
    };
    for _ in 0..count {
        if fields.is_empty() || rng.random_ratio(1, 12) {
            unknown(rng, out);
            continue;
        }
        let f = &fields[rng.random_range(0..fields.len())];
        field(rng, f, depth, out);
    }
}

fn unknown(rng: &mut dyn RngCore, out: &mut Vec<u8>) {
    let number = rng.random_range(2000..2010);
    match rng.random_range(0..5) {
        0 => {
            key(number, WireType::Varint, out);
            encode_varint(varint_value(rng), out);
        }
        1 => {
            key(number, WireType::SixtyFourBit, out);
            out.extend_from_slice(&rng.random::<u64>().to_le_bytes());
        }
        2 => {
            key(number, WireType::ThirtyTwoBit, out);
            out.extend_from_slice(&rng.random::<u32>().to_le_bytes());
        }
        3 => {
            key(number, WireType::StartGroup, out);
            key(1, WireType::Varint, out);
            encode_varint(5, out);
            key(number, WireType::EndGroup, out);
        }
        _ => {
            key(number, WireType::LengthDelimited, out);
            delimited(text(rng).as_bytes(), out);
        }
    }
}

fn wire_of(kind: &Kind) -> WireType {
    match kind {
        Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => WireType::SixtyFourBit,
        Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => WireType::ThirtyTwoBit,
        Kind::String | Kind::Bytes | Kind::Message(_) => WireType::LengthDelimited,
        _ => WireType::Varint,
    }
}

fn field(rng: &mut dyn RngCore, f: &FieldDescriptor, depth: u32, out: &mut Vec<u8>) {
    let kind = f.kind();
    if f.is_map() {
        let Kind::Message(entry) = &kind else { return };
        let mut bytes = Vec::new();
        for _ in 0..rng.random_range(0..4) {
            let part = if rng.random() {
                entry.map_entry_key_field()
            } else {
                entry.map_entry_value_field()
            };
            let k = part.kind();
            key(part.number(), wire_of(&k), &mut bytes);
            value(rng, &k, depth, &mut bytes);
        }
        key(f.number(), WireType::LengthDelimited, out);
        delimited(&bytes, out);
        return;
    }
    let packable = f.is_list() && wire_of(&kind) != WireType::LengthDelimited;
    if packable && rng.random() {
        let mut bytes = Vec::new();
        for _ in 0..rng.random_range(0..5) {
            value(rng, &kind, depth, &mut bytes);
        }
        key(f.number(), WireType::LengthDelimited, out);
        delimited(&bytes, out);
        return;
    }
    // Now and then the wrong wire type: both readers must refuse it.
    let wire = if rng.random_ratio(1, 200) {
        WireType::Varint
    } else {
        wire_of(&kind)
    };
    key(f.number(), wire, out);
    value(rng, &kind, depth, out);
}

/// `bytes` cut short, with a byte added, or with bytes changed (or left as they are).
fn mutate(rng: &mut dyn RngCore, mut bytes: Vec<u8>) -> Vec<u8> {
    match rng.random_range(0..6) {
        0 if !bytes.is_empty() => {
            let cut = rng.random_range(0..bytes.len());
            bytes.truncate(cut);
        }
        1 => bytes.push(rng.random()),
        2 if !bytes.is_empty() => {
            for _ in 0..rng.random_range(1..4) {
                let i = rng.random_range(0..bytes.len());
                bytes[i] = rng.random();
            }
        }
        _ => {}
    }
    bytes
}

/// The document by prost-reflect's path, or `None` when it refuses the bytes.
pub fn reference(m: &MessageDescriptor, bytes: &[u8]) -> Result<serde_json::Value, String> {
    let message = DynamicMessage::decode(m.clone(), bytes).map_err(|e| e.to_string())?;
    doc::to_doc(&message).map(|d| d.to_json())
}

fn names(doc: &Doc<'_>) -> Vec<String> {
    match doc {
        Doc::Object(fields) => fields.iter().map(|(k, _)| k.to_string()).collect(),
        Doc::Other(_) => Vec::new(),
    }
}

/// Runs `cases` random inputs per test message: (accepted, refused).
pub fn run(cases: u64, seed: u64) -> (u64, u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut accepted, mut refused) = (0, 0);
    for m in messages() {
        let table = Table::compile(&m).expect("the test message compiles to tables");
        for case in 0..cases {
            let mut bytes = Vec::new();
            message(&mut rng, &m, 0, &mut bytes);
            let bytes = mutate(&mut rng, bytes);
            let theirs = reference(&m, &bytes);
            let ours = read::decode(&table, &bytes);
            match (&theirs, &ours) {
                (Ok(t), Ok(o)) => {
                    assert_eq!(&o.to_json(), t, "{} case {case}: {bytes:?}", m.full_name());
                    let reference_doc = doc::to_doc(
                        &DynamicMessage::decode(m.clone(), bytes.as_slice())
                            .expect("it decoded above"),
                    )
                    .expect("it mapped above");
                    assert_eq!(names(o), names(&reference_doc), "field order");
                    accepted += 1;
                }
                (Err(_), Err(_)) => refused += 1,
                _ => panic!(
                    "{} case {case}: prost-reflect {theirs:?}, tables {ours:?}: {bytes:?}",
                    m.full_name()
                ),
            }
        }
    }
    (accepted, refused)
}

#[test]
fn random_and_mutated_messages_read_as_prost_reflect_reads_them() {
    let cases = std::env::var("ONCEFLOW_PROTOBUF_PROPERTY_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    let seed = std::env::var("ONCEFLOW_PROTOBUF_PROPERTY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("seed {seed} (ONCEFLOW_PROTOBUF_PROPERTY_SEED to run it again)");
    let (accepted, refused) = run(cases, seed);
    eprintln!("{accepted} accepted, {refused} refused");
    // Most inputs are valid messages: the comparison is not only of refusals.
    assert!(accepted > cases, "{accepted} accepted of {}", 2 * cases);
}

#[test]
fn a_message_given_twice_merges_and_a_oneof_member_clears_the_others() {
    let m = messages().remove(0);
    let table = Table::compile(&m).unwrap();
    let mut bytes = Vec::new();
    // inner {s: "a"} then inner {i: 2}: merged.
    key(17, WireType::LengthDelimited, &mut bytes);
    delimited(&[0x0a, 1, b'a'], &mut bytes);
    key(17, WireType::LengthDelimited, &mut bytes);
    delimited(&[0x10, 2], &mut bytes);
    // o_s then o_i: only o_i is left.
    key(31, WireType::LengthDelimited, &mut bytes);
    delimited(b"x", &mut bytes);
    key(33, WireType::Varint, &mut bytes);
    encode_varint(9, &mut bytes);
    let got = read::decode(&table, &bytes).unwrap().to_json();
    assert_eq!(got["inner"]["s"], "a");
    assert_eq!(got["inner"]["i"], 2);
    assert!(got.get("o_s").is_none());
    assert_eq!(got["o_i"], 9);
    assert_eq!(Ok(got), reference(&m, &bytes));
}
