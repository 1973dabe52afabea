//! The gate as the handlers see it: the loaded policy and the journal its decisions land in.

use std::sync::Arc;

use rmcp::ErrorData;
use serde_json::{Map, Value};
use toolgate_core::audit::{Decision, Event, Outcome};
use toolgate_core::policy::{Denial, Policy};
use toolgate_store::journal::Journal;

use crate::outcome;

/// Policy plus journal; cloned into every call.
#[derive(Clone, Debug)]
pub struct Gate {
    policy: Arc<Policy>,
    journal: Journal,
}

impl Gate {
    #[must_use]
    pub fn new(policy: Policy, journal: Journal) -> Self {
        Self {
            policy: Arc::new(policy),
            journal,
        }
    }

    #[must_use]
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    #[must_use]
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Visibility and argument rules for a call. A refusal is audited `deny / not_executed` and
    /// answered -32602; it stays a refusal even when the audit cannot be written (fail closed).
    ///
    /// # Errors
    /// The -32602 error to send instead of running anything.
    pub async fn admit(
        &self,
        tool: &str,
        arguments: &Map<String, Value>,
        registered: bool,
    ) -> Result<(), ErrorData> {
        match self.policy.admit(tool, arguments) {
            Ok(()) if registered => Ok(()),
            Ok(()) => Err(self
                .refuse(
                    tool,
                    arguments,
                    Denial {
                        tool: tool.to_owned(),
                        rule: "unknown_tool".to_owned(),
                    },
                    false,
                )
                .await),
            Err(denial) => {
                let visible = registered && self.policy.visible(tool);
                Err(self.refuse(tool, arguments, denial, visible).await)
            }
        }
    }

    async fn refuse(
        &self,
        tool: &str,
        arguments: &Map<String, Value>,
        denial: Denial,
        visible: bool,
    ) -> ErrorData {
        let event = Event::tool_call(
            request_label(arguments),
            tool,
            Decision::Deny,
            Outcome::NotExecuted,
            &Value::Object(arguments.clone()),
        );
        if let Err(error) = self.journal.record(event).await {
            tracing::error!(tool, error = %error, "denial could not be audited; refusing anyway");
        }
        tracing::info!(tool, rule = %denial.rule, "call denied before dispatch");
        outcome::denied(&denial, visible, self.policy.sha256())
    }
}

/// The `request_id` an audit record carries: the call's own `request_id` argument when it has one
/// (seed 000), else `missing`.
#[must_use]
pub fn request_label(arguments: &Map<String, Value>) -> String {
    match arguments.get("request_id") {
        Some(Value::String(id)) => id.clone(),
        Some(other) => other.to_string(),
        None => "missing".to_owned(),
    }
}
