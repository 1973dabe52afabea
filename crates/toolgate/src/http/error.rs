//! The errors of setting up the HTTP endpoint. Requests are never answered with these: a refused
//! request gets an HTTP answer of its own (`challenge.rs`, `layers.rs`).

/// Why a resource URI (this server's canonical URI, RFC 8707; the tokens' audience) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    #[error("resource {resource:?} is not a valid URI")]
    Invalid {
        resource: String,
        #[source]
        source: url::ParseError,
    },
    #[error("resource {resource:?} is not an absolute http(s) URI")]
    NotHttp { resource: String },
    #[error("resource {resource:?} must not have a query or fragment")]
    QueryOrFragment { resource: String },
    #[error("resource {resource:?} must not carry credentials")]
    Credentials { resource: String },
}
