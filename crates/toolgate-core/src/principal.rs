//! Who is calling: the identity every decision, budget, approval and audit record is about.
//!
//! On stdio it is the local user the server runs as (a stdio process does not authenticate its parent;
//! MCP leaves that to the transport). On HTTP it is a verified access token's subject, client and
//! scopes; only such a principal is held to per-tool scopes.

use serde::Serialize;

/// The caller of a tool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Principal {
    /// Stable identifier, e.g. `local:alice` or a token's `sub`.
    pub sub: String,
    /// Granted scopes (empty on stdio).
    pub scopes: Vec<String>,
    /// The OAuth client the token was issued to, when it names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// Whether the caller came with a token, so that tool scopes apply to it.
    #[serde(skip)]
    pub token: bool,
}

impl Principal {
    /// A principal with no scopes, trusted by where it runs (stdio's local user).
    #[must_use]
    pub fn new(sub: impl Into<String>) -> Self {
        Self {
            sub: sub.into(),
            scopes: Vec::new(),
            client_id: None,
            token: false,
        }
    }

    /// The subject of a verified access token, with the scopes it grants.
    #[must_use]
    pub fn from_token(sub: String, scopes: Vec<String>, client_id: Option<String>) -> Self {
        Self {
            sub,
            scopes,
            client_id,
            token: true,
        }
    }

    /// Whether this caller may use something that needs `scope` (always, when it needs none or
    /// the caller did not come with a token).
    #[must_use]
    pub fn may(&self, scope: Option<&str>) -> bool {
        match scope {
            Some(scope) if self.token => self.scopes.iter().any(|s| s == scope),
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Principal;

    #[test]
    fn only_token_callers_are_held_to_scopes() {
        let local = Principal::new("local:alice");
        assert!(local.may(Some("tickets:write")));
        let token = Principal::from_token("alice".into(), vec!["tickets:read".into()], None);
        assert!(token.may(Some("tickets:read")));
        assert!(!token.may(Some("tickets:write")));
        assert!(token.may(None));
        let none = Principal::from_token("bob".into(), Vec::new(), None);
        assert!(!none.may(Some("tickets:read")));
    }
}
