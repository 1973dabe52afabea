//! Canonical JSON: the one byte form that hashes, digests and fingerprints are computed over.
//!
//! The form is seed 000's `json.dumps(sort_keys=True, separators=(",", ":"), ensure_ascii=False)`:
//! object keys sorted by code point, no insignificant whitespace, non-ASCII written as raw UTF-8,
//! control characters escaped the way JSON requires (`\n`, `\t`, … and `\u00XX` in lower-case hex).
//! Keys are sorted here explicitly rather than trusting `serde_json::Map` order, because any crate in
//! the build can switch `serde_json/preserve_order` on through feature unification, and a silent
//! change of order would make every deployed audit log stop verifying.
//!
//! Numbers: integers are written in decimal; other numbers in serde_json's shortest round-trip form,
//! which can differ from Python's `repr` for exponents (`1e16` against `1e+16`). Audit records hold
//! only integers, so the chain is unaffected; argument digests of calls with such floats are
//! toolgate's own.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Encodes `value` in canonical form.
#[must_use]
pub fn to_vec(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write(value, &mut out);
    out
}

/// Appends the canonical form of `value` to `out`.
pub fn write(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
        Value::String(s) => write_str(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => write_object(map, out),
    }
}

/// Appends the canonical form of the object `map` to `out`.
pub fn write_object(map: &Map<String, Value>, out: &mut Vec<u8>) {
    out.push(b'{');
    for (i, (key, item)) in sorted(map).into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(key, out);
        out.push(b':');
        write(item, out);
    }
    out.push(b'}');
}

/// The members of `map` in canonical order.
pub(crate) fn sorted(map: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut entries: Vec<(&String, &Value)> = map.iter().collect();
    // Byte order of UTF-8 is code-point order, which is what Python's sort_keys uses.
    entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    entries
}

/// Appends `s` as a JSON string literal in canonical form.
///
/// Runs of bytes that need no escape are found with a table and copied whole: every audit record
/// and argument digest of a call goes through here, byte by byte.
pub fn write_str(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    while let Some(offset) = bytes[start..].iter().position(|&b| ESCAPED[usize::from(b)]) {
        let i = start + offset;
        out.extend_from_slice(&bytes[start..i]);
        let b = bytes[i];
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            0x08 => out.extend_from_slice(b"\\b"),
            0x0c => out.extend_from_slice(b"\\f"),
            _ => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0x0f)]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Bytes a JSON string must escape: `"`, `\` and the control characters below 0x20.
const ESCAPED: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        table[b] = true;
        b += 1;
    }
    table[b'"' as usize] = true;
    table[b'\\' as usize] = true;
    table
};

/// SHA-256 of `bytes` as 64 lower-case hex characters.
#[must_use]
pub fn sha256_hex(bytes: &[u8]) -> String {
    lower_hex(&Sha256::digest(bytes))
}

/// `bytes` as lower-case hex. Every record and digest of a call is hashed and written this way;
/// `hex::encode` goes through a `char` iterator, several times the cost of this loop.
#[must_use]
pub fn lower_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

/// SHA-256 of the canonical form of `value`, as 64 lower-case hex characters.
///
/// This is the `args_digest` of an audit record when `value` is a call's arguments.
#[must_use]
pub fn digest(value: &Value) -> String {
    sha256_hex(&to_vec(value))
}

/// [`digest`] of a call's arguments, without copying them into a `Value` first.
#[must_use]
pub fn digest_object(map: &Map<String, Value>) -> String {
    let mut out = Vec::with_capacity(256);
    write_object(map, &mut out);
    sha256_hex(&out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_at_every_level_and_drops_whitespace() {
        let value = json!({"b": 1, "a": {"z": [true, null], "y": "x"}});
        assert_eq!(to_vec(&value), br#"{"a":{"y":"x","z":[true,null]},"b":1}"#);
    }

    #[test]
    fn escapes_like_python_json_dumps_with_ensure_ascii_false() {
        let value = json!("q\"b\\n\n\u{1}\u{7f}é😀\u{2028}\u{202e}");
        let expected = "\"q\\\"b\\\\n\\n\\u0001\u{7f}é😀\u{2028}\u{202e}\"";
        assert_eq!(String::from_utf8(to_vec(&value)).unwrap(), expected);
    }

    #[test]
    fn every_ascii_character_is_escaped_as_json_requires() {
        for c in (0_u8..0x80).map(char::from) {
            let text = format!("a{c}b{c}");
            let mut out = Vec::new();
            write_str(&text, &mut out);
            assert_eq!(out, serde_json::to_vec(&text).unwrap(), "{c:?}");
        }
    }

    #[test]
    fn lower_hex_is_hex_encode() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(lower_hex(&bytes), hex::encode(&bytes));
    }

    #[test]
    fn empty_arguments_digest_matches_the_seed() {
        // read_ledger() records this digest in the seed's audit log (vectors, line 3).
        assert_eq!(
            digest(&json!({})),
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }
}
