//! Who is calling: the identity every decision, budget, approval and audit record is about.
//!
//! On stdio it is the local user the server runs as (a stdio process does not authenticate its parent;
//! MCP leaves that to the transport). On HTTP it will be the token's subject and scopes.

use serde::Serialize;

/// The caller of a tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Principal {
    /// Stable identifier, e.g. `local:alice` or a token's `sub`.
    pub sub: String,
    /// Granted scopes (empty on stdio).
    pub scopes: Vec<String>,
}

impl Principal {
    /// A principal with no scopes.
    #[must_use]
    pub fn new(sub: impl Into<String>) -> Self {
        Self {
            sub: sub.into(),
            scopes: Vec::new(),
        }
    }
}
