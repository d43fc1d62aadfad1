//! The Confluent wire format's Protobuf framing: magic byte 0, the schema id (4 bytes, big
//! endian), then the message indexes: their count and each index as zigzag varints (Kafka's
//! `ByteUtils.writeVarint`), the common `[0]` (the file's first message) written as the single
//! byte 0.

use crate::codec::registry::MAGIC;
pub use crate::codec::registry::split_header;

/// At most this many indexes (nesting levels) in a value's message path.
const MAX_DEPTH: i32 = 100;

/// The message indexes at the start of `bytes`, and the message after them.
pub fn read_indexes(bytes: &[u8]) -> Result<(Vec<i32>, &[u8]), String> {
    let (count, mut rest) = read_varint(bytes)?;
    if count == 0 {
        return Ok((vec![0], rest));
    }
    if !(1..=MAX_DEPTH).contains(&count) {
        return Err(format!("their count is {count}, not 1 to {MAX_DEPTH}"));
    }
    let mut indexes = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (index, after) = read_varint(rest)?;
        if index < 0 {
            return Err(format!("index {index} is negative"));
        }
        indexes.push(index);
        rest = after;
    }
    Ok((indexes, rest))
}

/// Magic byte, schema id and message indexes: what every value of one output starts with.
pub fn header(id: u32, indexes: &[i32]) -> Vec<u8> {
    let mut out = vec![MAGIC];
    out.extend_from_slice(&id.to_be_bytes());
    if indexes == [0] {
        out.push(0);
    } else {
        write_varint(indexes.len() as i32, &mut out);
        for i in indexes {
            write_varint(*i, &mut out);
        }
    }
    out
}

/// A zigzag varint of at most 5 bytes.
fn read_varint(bytes: &[u8]) -> Result<(i32, &[u8]), String> {
    let mut raw: u32 = 0;
    for (n, b) in bytes.iter().enumerate().take(5) {
        raw |= u32::from(b & 0x7f) << (7 * n);
        if b & 0x80 == 0 {
            let value = ((raw >> 1) as i32) ^ -((raw & 1) as i32);
            return Ok((value, &bytes[n + 1..]));
        }
    }
    Err(if bytes.len() < 5 {
        "the value ends inside them".to_string()
    } else {
        "a varint is longer than 5 bytes".to_string()
    })
}

fn write_varint(value: i32, out: &mut Vec<u8>) {
    let mut raw = ((value << 1) ^ (value >> 31)) as u32;
    while raw >= 0x80 {
        out.push((raw as u8) | 0x80);
        raw >>= 7;
    }
    out.push(raw as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_indexes_round_trip_and_the_first_message_is_one_zero_byte() {
        for indexes in [vec![0], vec![1], vec![0, 2], vec![3, 0, 70], vec![200]] {
            let h = header(7, &indexes);
            let (id, rest) = split_header(&h).unwrap();
            assert_eq!(id, 7);
            let mut body = rest.to_vec();
            body.extend_from_slice(b"msg");
            let (got, msg) = read_indexes(&body).unwrap();
            assert_eq!(got, indexes);
            assert_eq!(msg, b"msg");
        }
        assert_eq!(header(1, &[0]), vec![0, 0, 0, 0, 1, 0]);
        // [1]: count 1 (zigzag 2), index 1 (zigzag 2); [0, 2]: count 2 (4), 0, 2 (4).
        assert_eq!(&header(1, &[1])[5..], &[2, 2]);
        assert_eq!(&header(1, &[0, 2])[5..], &[4, 0, 4]);
    }

    #[test]
    fn broken_indexes_are_named() {
        assert!(read_indexes(&[]).unwrap_err().contains("ends inside"));
        assert!(read_indexes(&[0x80]).unwrap_err().contains("ends inside"));
        assert!(
            read_indexes(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01])
                .unwrap_err()
                .contains("longer than 5")
        );
        // Count -1 (zigzag 1).
        assert!(read_indexes(&[1]).unwrap_err().contains("count is -1"));
        // Count 1, index -1.
        assert!(read_indexes(&[2, 1]).unwrap_err().contains("negative"));
        assert!(
            split_header(&[1, 0, 0, 0, 1])
                .unwrap_err()
                .contains("magic")
        );
        assert!(split_header(&[0, 0]).unwrap_err().contains("shorter"));
    }
}
