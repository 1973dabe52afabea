//! Errors of loading a policy.

/// A policy file that cannot be used; start-up stops on any of these.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("policy is not valid policy JSON")]
    Malformed {
        #[source]
        source: serde_json::Error,
    },
    #[error("policy is not valid policy TOML")]
    MalformedToml {
        #[source]
        source: toml::de::Error,
    },
    #[error(
        "policy version {found} is not supported (this build reads version 1 as JSON and version 2 as TOML)"
    )]
    UnsupportedVersion { found: String },
    #[error("policy rule for {tool}.{arg} can never pass: {detail}")]
    ImpossibleRule {
        tool: String,
        arg: String,
        detail: String,
    },
    #[error("policy {field}: {detail}")]
    Invalid { field: String, detail: String },
    #[error("policy tools.{tool}.escalate[{index}] `{when}`: {detail}")]
    Condition {
        tool: String,
        index: usize,
        when: String,
        detail: String,
    },
}
