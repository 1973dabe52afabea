//! `Secret`: a credential held in memory that cannot reach a log, an error or a serialised struct
//! by accident.
//!
//! It owns holding the value and nothing else. It must not read files or the environment (the CLI
//! reads the files the configuration names and wraps what it read), and it does not wipe memory on
//! drop: that needs `unsafe` or another dependency, and the threat here is a careless `{:?}`, not a
//! core dump. Register every secret with [`crate::redact::Redactor`] as well, so a copy that escaped
//! through [`Secret::expose`] (an upstream's error message echoing a header, say) is still caught.
//!
//! `Debug`, `Display` and `Serialize` all write `<redacted>` rather than failing: a configuration or
//! status struct that derives them can be printed or dumped while debugging without a special case,
//! and no formatting path can carry the value out. `expose` is deliberately the only reader, so a
//! reviewer can grep for every place the value is used.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// What every printing path writes instead of the value.
const MASK: &str = "<redacted>";

/// A secret value: printed, logged and serialised as `<redacted>`; read only through
/// [`Secret::expose`].
#[derive(Clone, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`; from here on only [`Secret::expose`] reads it.
    #[must_use]
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The value itself. Every call site is a place the secret leaves this type: keep them few.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(value: String) -> Self {
        Self(value)
    }
}

impl From<&str> for Secret {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(MASK)
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(MASK)
    }
}

/// Reading a secret from configuration is how one arrives; the asymmetry with `Serialize` is the
/// point: a value can come in through serde but never go out through it.
impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self)
    }
}
