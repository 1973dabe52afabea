//! Tool arguments checked against the tool's own `inputSchema` before any handler runs.
//!
//! It owns compiling a tool's JSON Schema once, validating each call's arguments against it, and
//! turning failures into short messages the model can read and act on (an `isError` result,
//! MCP 2025-06-18 "Tools", "Error Handling"). It also reports each declared top-level argument's
//! JSON types, so the policy loader can refuse at load time a rule about an argument the tool
//! does not have or a comparison no argument value could satisfy.
//!
//! It must not decide whether a call is allowed (that is `policy`), must not fetch anything
//! (a `$ref` to another document is a compile error, whatever features `jsonschema` is built
//! with), and must not echo large argument values: every value quoted in a message is clipped.
//!
//! Semantics are JSON Schema 2020-12's (the default dialect when `$schema` is absent), with one
//! deliberate choice: `format` is an assertion, not the annotation 2020-12 makes it by default.
//! A tool that declares `"format": "email"` means it, and a handler that trusts the schema
//! should not receive `"not-an-email"`. Format names this build does not know (`"password"`,
//! `"textarea"`, …, common in generated schemas) stay annotations rather than failing the tool.

mod error;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;

use jsonschema::error::{TypeKind, ValidationErrorKind};
use jsonschema::{Retrieve, Uri, ValidationError, Validator};
use serde_json::Value;

pub use error::{Invalid, SHOWN_VIOLATIONS, SchemaError, Violation};

/// Characters of an instance value, pattern or name quoted in a message, ellipsis included.
const MAX_QUOTED_CHARS: usize = 80;

/// Characters of a violation's path; a pathological property name must not make it long.
const MAX_PATH_CHARS: usize = 200;

/// Violations kept per call. The rest are only counted: a model-written array of a million bad
/// items must not become a million messages held in memory.
const MAX_KEPT_VIOLATIONS: usize = 100;

/// Names or values listed in one message (unexpected properties, `enum` options) before the
/// rest are summarised as a count.
const MAX_LISTED: usize = 5;

/// How deep `$ref`s are followed when reading a property's declared types; a cycle stops here.
const MAX_REF_DEPTH: usize = 16;

/// A JSON type as JSON Schema's `type` keyword names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum JsonType {
    /// `null`.
    Null,
    /// `true` or `false`.
    Boolean,
    /// A number without a fractional part (`3`, `3.0`).
    Integer,
    /// Any number; as a value's own type ([`JsonType::of`]), one with a fractional part.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl JsonType {
    /// Every type, in declaration order: what a property without a `type` may hold.
    pub const ALL: [Self; 7] = [
        Self::Null,
        Self::Boolean,
        Self::Integer,
        Self::Number,
        Self::String,
        Self::Array,
        Self::Object,
    ];

    /// The name `type` uses.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Null => "null",
            Self::Boolean => "boolean",
            Self::Integer => "integer",
            Self::Number => "number",
            Self::String => "string",
            Self::Array => "array",
            Self::Object => "object",
        }
    }

    /// The type `name` denotes, if it is one of the seven.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == name)
    }

    /// The narrowest type of `value`: a number without a fractional part, `49.0` included, is
    /// an `Integer` (JSON Schema 2020-12 Validation §6.1.1).
    #[must_use]
    pub fn of(value: &Value) -> Self {
        match value {
            Value::Null => Self::Null,
            Value::Bool(_) => Self::Boolean,
            Value::Number(n) if is_integer(n) => Self::Integer,
            Value::Number(_) => Self::Number,
            Value::String(_) => Self::String,
            Value::Array(_) => Self::Array,
            Value::Object(_) => Self::Object,
        }
    }

    /// Whether `value` satisfies `"type": self`; every integer is also a `Number`.
    #[must_use]
    pub fn admits(self, value: &Value) -> bool {
        let actual = Self::of(value);
        actual == self || (self == Self::Number && actual == Self::Integer)
    }
}

impl fmt::Display for JsonType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

fn is_integer(n: &serde_json::Number) -> bool {
    n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
}

/// A tool's `inputSchema`, compiled once and used for every call to the tool.
#[derive(Clone, Debug)]
pub struct ToolSchema {
    validator: Validator,
    properties: BTreeMap<String, Vec<JsonType>>,
}

impl ToolSchema {
    /// Compiles an `inputSchema`.
    ///
    /// # Errors
    /// [`SchemaError::RootNotObject`] when the root is not an object schema with
    /// `"type": "object"`; [`SchemaError::Invalid`] when it breaks its dialect's meta-schema
    /// (e.g. `"minimum": "x"`), uses an unsupported `$schema`, or `$ref`s another document.
    pub fn compile(schema: &Value) -> Result<Self, SchemaError> {
        let root_type = schema.get("type");
        if root_type.and_then(Value::as_str) != Some("object") {
            let found = match (schema, root_type) {
                (Value::Object(_), None) => "no \"type\"".to_owned(),
                (Value::Object(_), Some(found)) => format!("\"type\": {}", quote(found)),
                (other, _) => format!("a {} instead of a schema object", JsonType::of(other)),
            };
            return Err(SchemaError::RootNotObject { found });
        }
        let validator = jsonschema::options()
            .should_validate_formats(true)
            .with_retriever(NoRetrieval)
            .build(schema)
            .map_err(|error| SchemaError::Invalid {
                location: clip(display_path(error.instance_path().as_str()), MAX_PATH_CHARS),
                message: describe(&error),
            })?;
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
            .map(|(name, property)| (name.clone(), declared_types(schema, property, 0)))
            .collect();
        Ok(Self {
            validator,
            properties,
        })
    }

    /// Checks a call's arguments.
    ///
    /// # Errors
    /// [`Invalid`], listing the violations by path, when the arguments break the schema.
    pub fn validate(&self, arguments: &Value) -> Result<(), Invalid> {
        // The boolean check allocates nothing; only a failing call pays for messages.
        if self.validator.is_valid(arguments) {
            return Ok(());
        }
        let mut violations = Vec::new();
        let mut total = 0;
        for error in self.validator.iter_errors(arguments) {
            total += 1;
            if violations.len() < MAX_KEPT_VIOLATIONS {
                violations.push(Violation {
                    path: clip(error.instance_path().as_str().to_owned(), MAX_PATH_CHARS),
                    keyword: error.kind().keyword().to_owned(),
                    message: describe(&error),
                });
            }
        }
        // Keyword order inside one path is kept (the sort is stable); across paths, sorting
        // makes the message the same for the same call whatever order the validator walks in.
        violations.sort_by(|a, b| a.path.cmp(&b.path));
        if total == 0 {
            // The two checks disagreeing would be a validator bug; the call still does not run.
            violations.push(Violation {
                path: String::new(),
                keyword: String::new(),
                message: "arguments do not match the input schema".to_owned(),
            });
            total = 1;
        }
        Err(Invalid { violations, total })
    }

    /// The declared top-level arguments and the JSON types each may hold.
    ///
    /// Read from `type`, else the values of `enum`/`const`, else a local `$ref` or the union of
    /// `anyOf`/`oneOf` branches; anything else admits all seven types. The lists are thus never
    /// narrower than what the schema accepts, so a rule refused because of them could never
    /// have matched. `Number` here also admits integers (see [`JsonType::admits`]).
    #[must_use]
    pub fn property_types(&self) -> &BTreeMap<String, Vec<JsonType>> {
        &self.properties
    }

    /// Whether `name` is a declared top-level argument (listed under `properties`). An
    /// argument only `additionalProperties` or `patternProperties` would admit is not.
    #[must_use]
    pub fn has_property(&self, name: &str) -> bool {
        self.properties.contains_key(name)
    }
}

/// Refuses every external document, so compiling a tool's schema never touches the network or
/// the disk even if another crate turns on `jsonschema`'s `resolve-http`/`resolve-file`.
struct NoRetrieval;

impl Retrieve for NoRetrieval {
    fn retrieve(
        &self,
        uri: &Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!("toolgate does not fetch {uri}").into())
    }
}

/// The types `schema` admits, as far as can be read without evaluating it; see
/// [`ToolSchema::property_types`].
fn declared_types(root: &Value, schema: &Value, depth: usize) -> Vec<JsonType> {
    let all = || JsonType::ALL.to_vec();
    let object = match schema {
        Value::Bool(true) => return all(),
        Value::Bool(false) => return Vec::new(),
        Value::Object(object) => object,
        _ => return all(),
    };
    let collect = |types: BTreeSet<JsonType>| types.into_iter().collect::<Vec<_>>();
    if let Some(declared) = object.get("type") {
        let names = match declared {
            Value::String(name) => vec![name.as_str()],
            Value::Array(names) => names.iter().filter_map(Value::as_str).collect(),
            _ => return all(),
        };
        return collect(names.into_iter().filter_map(JsonType::from_name).collect());
    }
    if let Some(value) = object.get("const") {
        return vec![JsonType::of(value)];
    }
    if let Some(Value::Array(values)) = object.get("enum") {
        return collect(values.iter().map(JsonType::of).collect());
    }
    if let Some(Value::String(reference)) = object.get("$ref") {
        // Only a same-document pointer is followed; anything else might admit anything.
        return match reference.strip_prefix('#').and_then(|p| root.pointer(p)) {
            Some(target) if depth < MAX_REF_DEPTH => declared_types(root, target, depth + 1),
            _ => all(),
        };
    }
    for union in ["anyOf", "oneOf"] {
        if let Some(Value::Array(branches)) = object.get(union) {
            if depth >= MAX_REF_DEPTH {
                return all();
            }
            return collect(
                branches
                    .iter()
                    .flat_map(|branch| declared_types(root, branch, depth + 1))
                    .collect(),
            );
        }
    }
    all()
}

/// A violation in words, built from the error's parts rather than its `Display`: that one
/// prints whole instances, which here are model-written and may be documents.
fn describe(error: &ValidationError<'_>) -> String {
    let instance = error.instance();
    let value = || quote(instance);
    match error.kind() {
        ValidationErrorKind::Type { kind } => {
            let types: Vec<String> = match kind {
                TypeKind::Single(t) => vec![t.to_string()],
                TypeKind::Multiple(set) => set.iter().map(|t| t.to_string()).collect(),
            };
            let quoted: Vec<String> = types.iter().map(|t| format!("\"{t}\"")).collect();
            format!(
                "{} is not of type {}",
                value(),
                joined(&quoted, quoted.len(), "or")
            )
        }
        ValidationErrorKind::Required { property } => {
            format!("missing required property {}", quote(property))
        }
        ValidationErrorKind::AdditionalProperties { unexpected } => {
            names_not_allowed("additional", unexpected)
        }
        ValidationErrorKind::UnevaluatedProperties { unexpected } => {
            names_not_allowed("unevaluated", unexpected)
        }
        ValidationErrorKind::UnevaluatedItems { unexpected } => {
            format!("{} unevaluated items are not allowed", unexpected.len())
        }
        ValidationErrorKind::AdditionalItems { limit } => {
            format!("has more than the {limit} items allowed")
        }
        ValidationErrorKind::Format { format } => {
            format!("{} is not a valid \"{}\"", value(), clip_str(format))
        }
        ValidationErrorKind::Pattern { pattern } => {
            format!(
                "{} does not match the pattern \"{}\"",
                value(),
                clip_str(pattern)
            )
        }
        ValidationErrorKind::BacktrackLimitExceeded { .. }
        | ValidationErrorKind::RegexEngineFailure { .. } => {
            format!("{} could not be checked against the pattern", value())
        }
        ValidationErrorKind::Minimum { limit } => {
            format!("{} is less than the minimum of {}", value(), quote(limit))
        }
        ValidationErrorKind::Maximum { limit } => {
            format!(
                "{} is greater than the maximum of {}",
                value(),
                quote(limit)
            )
        }
        ValidationErrorKind::ExclusiveMinimum { limit } => {
            format!(
                "{} is not greater than the exclusive minimum of {}",
                value(),
                quote(limit)
            )
        }
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            format!(
                "{} is not less than the exclusive maximum of {}",
                value(),
                quote(limit)
            )
        }
        ValidationErrorKind::MultipleOf { multiple_of } => {
            format!("{} is not a multiple of {multiple_of}", value())
        }
        ValidationErrorKind::MinLength { limit } => format!(
            "{} has {} characters, fewer than the minimum of {limit}",
            value(),
            char_count(instance)
        ),
        ValidationErrorKind::MaxLength { limit } => format!(
            "{} has {} characters, more than the maximum of {limit}",
            value(),
            char_count(instance)
        ),
        ValidationErrorKind::MinItems { limit } => format!(
            "has {} items, fewer than the minimum of {limit}",
            instance.as_array().map_or(0, Vec::len)
        ),
        ValidationErrorKind::MaxItems { limit } => format!(
            "has {} items, more than the maximum of {limit}",
            instance.as_array().map_or(0, Vec::len)
        ),
        ValidationErrorKind::UniqueItems => "has duplicate items".to_owned(),
        ValidationErrorKind::Contains => "has no item matching \"contains\"".to_owned(),
        ValidationErrorKind::MinProperties { limit } => format!(
            "has {} properties, fewer than the minimum of {limit}",
            instance.as_object().map_or(0, serde_json::Map::len)
        ),
        ValidationErrorKind::MaxProperties { limit } => format!(
            "has {} properties, more than the maximum of {limit}",
            instance.as_object().map_or(0, serde_json::Map::len)
        ),
        ValidationErrorKind::PropertyNames { error } => {
            format!("property name {}", describe(error))
        }
        ValidationErrorKind::Enum { options } => {
            format!("{} is not one of {}", value(), enum_list(options))
        }
        ValidationErrorKind::Constant { expected_value } => {
            format!(
                "{} is not the required value {}",
                value(),
                quote(expected_value)
            )
        }
        ValidationErrorKind::AnyOf { .. } => {
            format!("{} matches none of the schemas in \"anyOf\"", value())
        }
        ValidationErrorKind::OneOfNotValid { .. } => {
            format!("{} matches none of the schemas in \"oneOf\"", value())
        }
        ValidationErrorKind::OneOfMultipleValid { .. } => {
            format!("{} matches more than one schema in \"oneOf\"", value())
        }
        ValidationErrorKind::Not { .. } => {
            format!("{} matches a schema it must not match (\"not\")", value())
        }
        ValidationErrorKind::FalseSchema => "no value is allowed here".to_owned(),
        ValidationErrorKind::ContentEncoding { content_encoding } => {
            format!(
                "{} is not valid {} content",
                value(),
                clip_str(content_encoding)
            )
        }
        ValidationErrorKind::ContentMediaType { content_media_type } => {
            format!(
                "{} is not valid {} content",
                value(),
                clip_str(content_media_type)
            )
        }
        ValidationErrorKind::FromUtf8 { .. } => "decoded content is not valid UTF-8".to_owned(),
        ValidationErrorKind::Custom { message, .. } => clip_str(message),
        // The referencing crate's sentences are long; the URI in them is what matters.
        ValidationErrorKind::Referencing(error) => clip(
            format!("unresolvable reference: {error}"),
            3 * MAX_QUOTED_CHARS,
        ),
    }
}

fn char_count(instance: &Value) -> usize {
    instance.as_str().map_or(0, |s| s.chars().count())
}

fn names_not_allowed(which: &str, names: &[String]) -> String {
    let quoted = quote_some(names.iter().map(|name| Value::String(name.clone())));
    match names {
        [_] => format!("{which} property {} is not allowed", quoted[0]),
        _ => format!(
            "{which} properties {} are not allowed",
            joined(&quoted, names.len(), "and")
        ),
    }
}

fn enum_list(options: &Value) -> String {
    let options = options.as_array().map(Vec::as_slice).unwrap_or_default();
    joined(&quote_some(options.iter().cloned()), options.len(), "or")
}

/// The first [`MAX_LISTED`] values quoted; the rest are only ever counted.
fn quote_some(values: impl Iterator<Item = Value>) -> Vec<String> {
    values.take(MAX_LISTED).map(|v| quote(&v)).collect()
}

/// `a`, `a or b`, `a, b or c`; past [`MAX_LISTED`] items, `a, b, c, d, e or 3 others`.
fn joined(shown: &[String], total: usize, conjunction: &str) -> String {
    match shown {
        [] => String::new(),
        [only] if total == 1 => only.clone(),
        _ if total > shown.len() => format!(
            "{} {conjunction} {} others",
            shown.join(", "),
            total - shown.len()
        ),
        [init @ .., last] => format!("{} {conjunction} {last}", init.join(", ")),
    }
}

/// `value` as JSON, clipped to [`MAX_QUOTED_CHARS`]. Serialization stops once enough is
/// written, so quoting a huge value costs no more than quoting a small one.
fn quote(value: &Value) -> String {
    let mut out = Bounded {
        bytes: Vec::new(),
        // Enough bytes for one character past the limit however wide the characters are.
        limit: 4 * MAX_QUOTED_CHARS + 4,
    };
    // The only error is `Bounded` being full, which is the point.
    let _ = serde_json::to_writer(&mut out, value);
    let text = match std::str::from_utf8(&out.bytes) {
        Ok(text) => text,
        Err(cut) => std::str::from_utf8(&out.bytes[..cut.valid_up_to()]).unwrap_or_default(),
    };
    clip(text.to_owned(), MAX_QUOTED_CHARS)
}

fn clip_str(text: &str) -> String {
    clip(text.to_owned(), MAX_QUOTED_CHARS)
}

/// `text` cut to at most `max` characters, the last being `…` when anything was cut.
fn clip(mut text: String, max: usize) -> String {
    if let Some((cut, _)) = text.char_indices().nth(max.saturating_sub(1))
        && text[cut..].chars().nth(1).is_some()
    {
        text.truncate(cut);
        text.push('…');
    }
    text
}

fn display_path(pointer: &str) -> String {
    if pointer.is_empty() {
        "the root".to_owned()
    } else {
        pointer.to_owned()
    }
}

/// An `io::Write` that takes up to `limit` bytes and then fails, ending serialization early.
struct Bounded {
    bytes: Vec<u8>,
    limit: usize,
}

impl io::Write for Bounded {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = self.limit.saturating_sub(self.bytes.len());
        if room == 0 {
            return Err(io::Error::other("quote limit reached"));
        }
        let taken = data.len().min(room);
        self.bytes.extend_from_slice(&data[..taken]);
        Ok(taken)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
