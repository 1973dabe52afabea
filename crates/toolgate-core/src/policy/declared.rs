//! What a program says about its own tools in code (the kit's `gated`, `gate_env` and timeout), laid
//! under the policy: the policy a kit runs without a file, and the merge when it has one.
//!
//! Design decision: declarations only ever make a tool stricter or fill what the policy left
//! unsaid. A tool the code marks gated stays gated whatever the file says (a policy written for
//! another version of the server cannot switch a gate off by not naming it), and the file's own
//! `gate_env` and `timeout` win over the code's, because the person running the server wrote them.

use std::time::Duration;

use super::{Policy, PolicyError, check_gate_env, check_name, invalid};

/// What a kit's code declares about one tool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Declared {
    /// Off until its gate variable is set to an enabling value; a refused call answers with the
    /// tool's dry run.
    pub gated: bool,
    /// The gate variable of this tool, instead of the policy-wide `<NAME>_ALLOW_GATED`.
    pub gate_env: Option<String>,
    /// How long the handler may run before the call is answered with a timeout.
    pub timeout: Option<Duration>,
}

impl Policy {
    /// The policy a kit runs under when it has no policy file: every tool runs (tier `low`), the
    /// server's `name` gives the gate variables their prefix (`notes` gives `NOTES_ALLOW_GATED`),
    /// and a handler gets `timeout` unless its tool declares its own. Its SHA-256 is that of the
    /// TOML text it is read from, so audit records name it as they name a file.
    ///
    /// # Errors
    /// `name` is not letters, digits, `-` or `_`, or `timeout` is shorter than a millisecond.
    pub fn for_kit(name: &str, timeout: Duration) -> Result<Self, PolicyError> {
        let millis = timeout.as_millis();
        if millis == 0 {
            return Err(invalid(
                "defaults.timeout",
                "must be at least 1 ms".to_owned(),
            ));
        }
        // Checked before it is written into the TOML text, where a quote would break the text.
        check_name(name)?;
        let text = format!(
            "version = 2\nname = \"{name}\"\n\n[defaults]\ntier = \"low\"\ntimeout = \"{millis}ms\"\n"
        );
        Self::from_bytes(text.as_bytes())
    }

    /// Lays what the code declares about `tool` under this policy: the tool is gated if either
    /// says so; the policy's own `gate_env` and `timeout` for it win over the declaration's.
    ///
    /// # Errors
    /// The declared `gate_env` is not an environment variable name; the policy is unchanged.
    pub fn declare(&mut self, tool: &str, declared: &Declared) -> Result<(), PolicyError> {
        if let Some(env) = &declared.gate_env {
            check_gate_env(&format!("tools.{tool}.gate_env"), env)?;
        }
        if *declared == Declared::default() || (self.version == 1 && !self.tools.contains_key(tool))
        {
            // Nothing to lay down, or a version 1 policy that does not allow the tool: it never
            // runs, and its refusal keeps the rule name `not_allowed`.
            return Ok(());
        }
        let rule = self.tools.entry(tool.to_owned()).or_default();
        rule.gated |= declared.gated;
        if rule.gate_env.is_none() {
            rule.gate_env.clone_from(&declared.gate_env);
        }
        if rule.timeout.is_none() {
            rule.timeout = declared.timeout;
        }
        Ok(())
    }

    /// Gives the policy `name` (the gate prefix) when its file named none.
    pub fn name_if_unnamed(&mut self, name: &str) {
        self.name.get_or_insert_with(|| name.to_owned());
    }
}
