//! The policy: which tools exist for a caller, and which arguments a call may carry.
//!
//! This is the seed's `policy.json`, version 1 (`allow`, `deny`, `arg_rules`), accepted verbatim and
//! validated strictly: an unknown version, an unknown field or a rule that can never pass is a load
//! error, never a silent denial at call time. The policy is immutable once loaded; it carries the
//! SHA-256 of the file it came from so a decision can name the exact policy that made it.
//!
//! Precedence (seed 000): `deny` beats `allow`; a tool in neither list does not exist for the caller.

mod error;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub use error::PolicyError;

/// The policy of seed 000, verbatim: what `toolgate demo` runs with and the README's example.
pub const SEED_POLICY: &str = include_str!("seed-policy.json");

/// The policy file as written, before validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    version: Value,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    arg_rules: BTreeMap<String, BTreeMap<String, ArgRule>>,
}

/// Bounds on one string argument, in Unicode scalar values (Python's `len`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ArgRule {
    pub min_len: Option<usize>,
    pub max_len: Option<usize>,
}

/// A validated policy.
#[derive(Clone, Debug)]
pub struct Policy {
    sha256: String,
    allow: BTreeSet<String>,
    deny: BTreeSet<String>,
    arg_rules: BTreeMap<String, BTreeMap<String, ArgRule>>,
}

/// Why a call was refused, in words the client may see and a rule name the audit can keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    pub tool: String,
    /// Which rule refused, e.g. `deny`, `not_allowed`, `arg_rules.write_note.request_id.min_len`.
    pub rule: String,
}

impl Policy {
    /// Parses and validates a policy file's bytes.
    ///
    /// # Errors
    /// The file is not JSON of the expected shape, names an unsupported version, or holds a rule
    /// that can never be satisfied.
    pub fn from_json(bytes: &[u8]) -> Result<Self, PolicyError> {
        let raw: RawPolicy =
            serde_json::from_slice(bytes).map_err(|source| PolicyError::Malformed { source })?;
        if raw.version != 1 {
            return Err(PolicyError::UnsupportedVersion {
                found: raw.version.to_string(),
            });
        }
        for (tool, rules) in &raw.arg_rules {
            for (arg, rule) in rules {
                if let (Some(min), Some(max)) = (rule.min_len, rule.max_len)
                    && min > max
                {
                    return Err(PolicyError::ImpossibleRule {
                        tool: tool.clone(),
                        arg: arg.clone(),
                        detail: format!("min_len {min} is greater than max_len {max}"),
                    });
                }
            }
        }
        Ok(Self {
            sha256: hex::encode(Sha256::digest(bytes)),
            allow: raw.allow.into_iter().collect(),
            deny: raw.deny.into_iter().collect(),
            arg_rules: raw.arg_rules,
        })
    }

    /// SHA-256 of the policy file's bytes.
    #[must_use]
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// Whether `tool` exists for the caller: listed by `tools/list` and callable at all.
    #[must_use]
    pub fn visible(&self, tool: &str) -> bool {
        self.allow.contains(tool) && !self.deny.contains(tool)
    }

    /// The whole check for a call: visibility, then every argument rule.
    ///
    /// # Errors
    /// The [`Denial`] naming the first rule the call breaks.
    pub fn admit(&self, tool: &str, arguments: &Map<String, Value>) -> Result<(), Denial> {
        let deny = |rule: String| Denial {
            tool: tool.to_owned(),
            rule,
        };
        if self.deny.contains(tool) {
            return Err(deny("deny".to_owned()));
        }
        if !self.allow.contains(tool) {
            return Err(deny("not_allowed".to_owned()));
        }
        for (arg, rule) in self.arg_rules.get(tool).into_iter().flatten() {
            let name = |bound: &str| format!("arg_rules.{tool}.{arg}.{bound}");
            let Some(Value::String(value)) = arguments.get(arg) else {
                return Err(deny(name("string")));
            };
            let len = value.chars().count();
            if rule.min_len.is_some_and(|min| len < min) {
                return Err(deny(name("min_len")));
            }
            if rule.max_len.is_some_and(|max| len > max) {
                return Err(deny(name("max_len")));
            }
        }
        Ok(())
    }
}
