//! Errors of compiling a tool's input schema, and the violations of a call that does not match it.

use std::fmt;

/// How many violations [`Invalid`]'s `Display` lists before summarising the rest as a count.
pub const SHOWN_VIOLATIONS: usize = 5;

/// An `inputSchema` that cannot gate calls; the tool is refused rather than run unchecked.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// MCP requires `"type": "object"` at the root: arguments are always a JSON object.
    #[error("input schema root must declare \"type\": \"object\" (found {found})")]
    RootNotObject {
        /// What the root holds instead, e.g. `no "type"` or `"type": "array"`.
        found: String,
    },
    /// The schema breaks its dialect's meta-schema, or a `$ref` in it cannot be resolved.
    #[error("input schema is not valid JSON Schema at {location}: {message}")]
    Invalid {
        /// Where in the schema, as a JSON pointer, or `the root`.
        location: String,
        /// What is wrong there.
        message: String,
    },
}

/// One way in which a call's arguments break the schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// RFC 6901 pointer into the arguments, `""` for the arguments object itself.
    pub path: String,
    /// The JSON Schema keyword that failed, e.g. `type`, `format`, `required`.
    pub keyword: String,
    /// Short and self-contained; instance values in it are clipped, never whole documents.
    pub message: String,
}

/// Arguments that do not match the tool's input schema.
///
/// `Display` is meant to be handed back to the model as an `isError` tool result: one line per
/// violation, `path: message`, at most [`SHOWN_VIOLATIONS`] of them and then how many more.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub(super) violations: Vec<Violation>,
    pub(super) total: usize,
}

impl Invalid {
    /// The violations kept, ordered by path. A call with very many violations keeps only the
    /// first ones found; [`Invalid::total`] still counts them all.
    #[must_use]
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// How many violations the arguments have in all.
    #[must_use]
    pub fn total(&self) -> usize {
        self.total
    }
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, violation) in self.violations.iter().take(SHOWN_VIOLATIONS).enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            // "/" would be ambiguous: it is the pointer to a property named "".
            let path = if violation.path.is_empty() {
                "(root)"
            } else {
                &violation.path
            };
            write!(f, "{path}: {}", violation.message)?;
        }
        let shown = self.violations.len().min(SHOWN_VIOLATIONS);
        if self.total > shown {
            write!(f, "\nand {} more", self.total - shown)?;
        }
        Ok(())
    }
}

impl std::error::Error for Invalid {}
