//! Errors of loading a policy, and of its escalation conditions.

/// A policy file that cannot be used; start-up stops on any of these.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// A JSON (version 1) file that does not parse or has fields the format does not know.
    #[error("policy is not valid policy JSON")]
    Malformed {
        /// The JSON parser's error, with line and column.
        #[source]
        source: serde_json::Error,
    },
    /// A TOML (version 2) file that does not parse or has fields the format does not know.
    #[error("policy is not valid policy TOML")]
    MalformedToml {
        /// The TOML parser's error, with the offending span.
        #[source]
        source: toml::de::Error,
    },
    /// JSON whose `version` is not 1, or TOML whose `version` is not 2.
    #[error(
        "policy version {found} is not supported (this build reads version 1 as JSON and version 2 as TOML)"
    )]
    UnsupportedVersion {
        /// The `version` the file gave, as written.
        found: String,
    },
    /// An argument rule no call can pass, or that names an argument the served tool lacks.
    #[error("policy rule for {tool}.{arg} can never pass: {detail}")]
    ImpossibleRule {
        /// The tool the rule is about.
        tool: String,
        /// The argument the rule is about.
        arg: String,
        /// Why it can never pass.
        detail: String,
    },
    /// A value the format does not accept (an unknown tier, a malformed duration, scope, name or
    /// variable name), or a file that is not UTF-8.
    #[error("policy {field}: {detail}")]
    Invalid {
        /// The field's dotted path, e.g. `tools.deploy.timeout`.
        field: String,
        /// What is wrong with its value.
        detail: String,
    },
    /// An escalation condition that does not compile or cannot be evaluated for the tool.
    #[error("policy tools.{tool}.escalate[{index}] `{when}`: {detail}")]
    Condition {
        /// The tool whose rule it is.
        tool: String,
        /// The rule's 0-based position in the tool's `escalate` list.
        index: usize,
        /// The condition as written.
        when: String,
        /// Why it cannot be used.
        detail: ConditionError,
    },
    /// An expression of a postcondition (`[tools.NAME.verify]`) that does not compile or reads a
    /// variable its place does not define.
    #[error("policy {field} `{expression}`: {detail}")]
    Verify {
        /// The field's dotted path, e.g. `tools.write_note.verify.expect`.
        field: String,
        /// The expression as written.
        expression: String,
        /// Why it cannot be used.
        detail: ConditionError,
    },
}

/// Why an escalation condition or a postcondition's expression cannot be used (at load) or
/// decided (for one call).
///
/// Each message carries its cause: it is read as one line, inside a [`PolicyError`] at load and
/// in an assessment's `undecided` list at call time.
#[derive(Debug, thiserror::Error)]
pub enum ConditionError {
    /// The expression does not compile; the CEL parser's message.
    #[error("{0}")]
    Syntax(cel::ParseErrors),
    /// It reads an argument the tool's input schema does not declare (found at load).
    #[error("names argument `{arg}`, which {tool} does not have")]
    UnknownArgument {
        /// The argument it reads.
        arg: String,
        /// The tool whose rule it is.
        tool: String,
    },
    /// No value of the declared types lets it evaluate to a boolean; `last` is the last try's
    /// failure.
    #[error("can never be evaluated for the declared argument types ({last})")]
    NeverEvaluates {
        /// Why the last sample combination failed.
        last: Box<ConditionError>,
    },
    /// A value could not be turned into a CEL value.
    #[error("cannot pass `{variable}` to the expression: {error}")]
    Convert {
        /// The variable being passed: `args`, `principal` or `result`.
        variable: &'static str,
        /// The conversion's error.
        error: cel::SerializationError,
    },
    /// The call left out an argument the expression reads.
    #[error("argument `{name}` is missing")]
    MissingArgument {
        /// The argument's name.
        name: String,
    },
    /// Evaluation failed, e.g. a comparison of a value of an unexpected type; CEL's message.
    #[error("{0}")]
    Evaluation(Box<cel::ExecutionError>),
    /// It evaluated to something other than a boolean.
    #[error("evaluates to {value}, not true or false")]
    NotBoolean {
        /// The result, as CEL's `Debug` writes it.
        value: String,
    },
    /// It reads a variable its place in the policy does not define (found at load).
    #[error("reads `{name}`, which is not defined here (only {allowed})")]
    UnknownVariable {
        /// The variable it reads.
        name: String,
        /// The variables the place defines, for the message, e.g. "`args` and `result`".
        allowed: &'static str,
    },
    /// An argument expression gave a value that has no JSON form (a function, a type).
    #[error("evaluates to {value}, which has no JSON form")]
    NotJson {
        /// The result, as CEL's `Debug` writes it.
        value: String,
    },
    /// An argument of a postcondition's read or compensating call could not be built.
    #[error("argument `{name}`: {detail}")]
    Argument {
        /// The argument of the read or compensating call.
        name: String,
        /// Why its expression gave no value.
        detail: Box<ConditionError>,
    },
}
