//! Errors of loading a policy, and of its escalation conditions.

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
        detail: ConditionError,
    },
}

/// Why an escalation condition cannot be used (at load) or decided (for one call).
///
/// Each message carries its cause: it is read as one line, inside a [`PolicyError`] at load and
/// in an assessment's `undecided` list at call time.
#[derive(Debug, thiserror::Error)]
pub enum ConditionError {
    /// The expression does not compile; the CEL parser's message.
    #[error("{0}")]
    Syntax(cel::ParseErrors),
    #[error("names argument `{arg}`, which {tool} does not have")]
    UnknownArgument { arg: String, tool: String },
    /// No value of the declared types lets it evaluate to a boolean; `last` is the last try's
    /// failure.
    #[error("can never be evaluated for the declared argument types ({last})")]
    NeverEvaluates { last: Box<ConditionError> },
    #[error("cannot pass `{variable}` to the expression: {error}")]
    Convert {
        variable: &'static str,
        error: cel::SerializationError,
    },
    /// The call left out an argument the expression reads.
    #[error("argument `{name}` is missing")]
    MissingArgument { name: String },
    #[error("{0}")]
    Evaluation(Box<cel::ExecutionError>),
    /// `value` is the result as CEL's `Debug` writes it.
    #[error("evaluates to {value}, not true or false")]
    NotBoolean { value: String },
}
