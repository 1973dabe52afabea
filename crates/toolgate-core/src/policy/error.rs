//! Errors of loading a policy.

/// A policy file that cannot be used; start-up stops on any of these.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policy is not valid policy JSON")]
    Malformed {
        #[source]
        source: serde_json::Error,
    },
    #[error("policy version {found} is not supported (this build reads version 1)")]
    UnsupportedVersion { found: String },
    #[error("policy rule for {tool}.{arg} can never pass: {detail}")]
    ImpossibleRule {
        tool: String,
        arg: String,
        detail: String,
    },
}
