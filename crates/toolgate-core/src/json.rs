//! JSON with one reading only: the parser for every text toolgate checks before someone else
//! reads it again (an HTTP request body before rmcp dispatches it, a token's JOSE header and claims
//! before jsonwebtoken decodes them, an audit record before `grep` or a log shipper reads it).
//!
//! Two parsers read each of those texts, and they must never disagree about what it says.
//! serde_json keeps the last of two members with the same name and says nothing, another parser
//! may keep the first, and a text that is not UTF-8 may be repaired differently by each. So a
//! text is accepted here only when every reading is the same one (RFC 8259 §4 leaves repeated
//! names to the parser; I-JSON, RFC 7493 §2.3, forbids them): valid UTF-8, one JSON value and
//! nothing after it but white space, no object with a member name twice anywhere in it (names
//! compared after their escapes are decoded), and not nested deeper than [`MAX_DEPTH`], well
//! inside serde_json's own recursion limit, so that no reader runs out of stack first.
//!
//! Design decision: the check and the parse are one pass that builds the `serde_json::Value` the
//! caller goes on to read, instead of a check followed by a second, ordinary parse: there is then
//! no second reading that could differ from the checked one.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Arrays and objects nested in each other at most this deep (the outermost counts as one).
pub const MAX_DEPTH: usize = 64;

/// Why a text has no single reading as JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsonError {
    /// The bytes are not valid UTF-8.
    #[error("not UTF-8")]
    NotUtf8,
    /// Not one JSON value followed only by white space.
    #[error("not JSON: {reason}")]
    Syntax {
        /// serde_json's message, with line and column.
        reason: String,
    },
    /// Arrays and objects nest deeper than the limit.
    #[error("nested deeper than {max} levels")]
    TooDeep {
        /// The limit that was passed ([`MAX_DEPTH`] unless [`parse_nested`] set another).
        max: usize,
    },
    /// An object names the same member twice.
    #[error("member {name:?} appears twice in one object")]
    Duplicate {
        /// The repeated member name, escapes decoded.
        name: String,
    },
}

/// The one value `text` holds, nested at most [`MAX_DEPTH`] deep.
///
/// # Errors
/// `text` is not UTF-8, not one JSON value, repeats a member name or nests too deep.
pub fn parse(text: &[u8]) -> Result<Value, JsonError> {
    parse_nested(text, MAX_DEPTH)
}

/// [`parse`] with another nesting limit.
///
/// # Errors
/// As for [`parse`].
pub fn parse_nested(text: &[u8], max_depth: usize) -> Result<Value, JsonError> {
    let text = std::str::from_utf8(text).map_err(|_| JsonError::NotUtf8)?;
    let problem = Cell::new(None);
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let seed = Strict {
        depth: 0,
        max_depth,
        problem: &problem,
    };
    match seed
        .deserialize(&mut deserializer)
        .and_then(|value| deserializer.end().map(|()| value))
    {
        Ok(value) => Ok(value),
        // Our own refusals travel through serde as text; the kind is kept beside it.
        Err(error) => Err(problem.take().unwrap_or(JsonError::Syntax {
            reason: error.to_string(),
        })),
    }
}

/// Builds a `Value` like serde_json's own, refusing repeated names and deep nesting.
#[derive(Clone, Copy)]
struct Strict<'p> {
    /// Containers around the value being read.
    depth: usize,
    max_depth: usize,
    problem: &'p Cell<Option<JsonError>>,
}

impl Strict<'_> {
    /// The seed for the values inside a container that opens here.
    fn inside<E: de::Error>(self) -> Result<Self, E> {
        if self.depth >= self.max_depth {
            return Err(self.refuse(JsonError::TooDeep {
                max: self.max_depth,
            }));
        }
        Ok(Self {
            depth: self.depth + 1,
            ..self
        })
    }

    fn refuse<E: de::Error>(self, problem: JsonError) -> E {
        let error = E::custom(&problem);
        self.problem.set(Some(problem));
        error
    }
}

impl<'de> DeserializeSeed<'de> for Strict<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, value: bool) -> Result<Value, E> {
        Ok(Value::Bool(value))
    }

    fn visit_i64<E>(self, value: i64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_u64<E>(self, value: u64) -> Result<Value, E> {
        Ok(Value::Number(value.into()))
    }

    fn visit_f64<E: de::Error>(self, value: f64) -> Result<Value, E> {
        // serde_json refuses out-of-range numbers itself, so this is always finite.
        Number::from_f64(value)
            .map(Value::Number)
            .ok_or_else(|| E::custom("number out of range"))
    }

    fn visit_str<E>(self, value: &str) -> Result<Value, E> {
        Ok(Value::String(value.to_owned()))
    }

    fn visit_string<E>(self, value: String) -> Result<Value, E> {
        Ok(Value::String(value))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let inside = self.inside()?;
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(inside)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let inside = self.inside()?;
        let mut members = Map::new();
        while let Some(name) = map.next_key::<String>()? {
            if members.contains_key(&name) {
                return Err(self.refuse(JsonError::Duplicate { name }));
            }
            let value = map.next_value_seed(inside)?;
            members.insert(name, value);
        }
        Ok(Value::Object(members))
    }
}
