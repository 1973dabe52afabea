//! The errors of setting up the HTTP endpoint. Requests are never answered with these: a refused
//! request gets an HTTP answer of its own (`challenge.rs`, `layers.rs`).

/// Why a resource URI (this server's canonical URI, RFC 8707; the tokens' audience) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    /// It does not parse as an absolute URI.
    #[error("resource {resource:?} is not a valid URI")]
    Invalid {
        /// The URI, as given.
        resource: String,
        /// The parser's error.
        #[source]
        source: url::ParseError,
    },
    /// Its scheme is not `http` or `https`, or it names no host.
    #[error("resource {resource:?} is not an absolute http(s) URI")]
    NotHttp {
        /// The URI, as given.
        resource: String,
    },
    /// It has a `?query` or a `#fragment`, which a canonical resource URI may not have.
    #[error("resource {resource:?} must not have a query or fragment")]
    QueryOrFragment {
        /// The URI, as given.
        resource: String,
    },
    /// It has a user name or password.
    #[error("resource {resource:?} must not carry credentials")]
    Credentials {
        /// The URI, as given.
        resource: String,
    },
}
