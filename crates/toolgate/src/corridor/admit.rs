//! The corridor's first steps, before anything waits or runs: the audit log and kill switch, the
//! tool's visibility and the policy's argument rules, the rate limit, the schema, and the decision.
//!
//! Order matters and is DESIGN.md §1's: a refused call must not spend a rate-limit token it did not
//! use, and the medium budget is charged last, only by a call the policy will run (a gated tool
//! answered with a dry run, or a blocked one, spends nothing). A store that cannot answer refuses
//! (the kill switch reads as on; the budget as spent, which asks a person).

use std::ops::ControlFlow::{Break, Continue};
use std::time::Duration;

use serde_json::{Value, json};
use toolgate_core::policy::{Action, Denial, Tier, Verdict};
use toolgate_core::sanitize;
use toolgate_core::time::now_ms;
use toolgate_store::state::Blocked;

use super::{Answer, CallState, Corridor, Flow};

impl Corridor<'_> {
    /// Nothing runs once the audit log has failed (only a restart brings it back) or while the kill
    /// switch is on, for everyone or for this caller; a switch that cannot be read counts as on.
    pub(super) async fn kill_switch(&self, call: &CallState<'_>) -> Flow {
        if self.gate.audit_failed() {
            return Break(Answer::NotRun {
                rule: "audit.unavailable".to_owned(),
                why: super::AuditUnavailable::NeedsRestart.to_string(),
            });
        }
        let Some(state) = self.gate.state() else {
            return Continue(());
        };
        let blocked = state
            .blocks(&self.gate.principal().sub)
            .await
            .unwrap_or_else(|error| {
                tracing::error!(error = %error, "kill switch unreadable; refusing");
                Some(Blocked::All)
            });
        match blocked {
            None => Continue(()),
            Some(Blocked::All) => Break(denied(call.name, "killswitch", false)),
            Some(Blocked::Principal) => Break(denied(call.name, "killswitch.principal", false)),
        }
    }

    /// A tool the caller may not see, or a call that breaks a policy argument rule, is refused
    /// before anything else is looked at.
    pub(super) fn visibility(&self, call: &CallState<'_>) -> Flow {
        let name = call.name;
        if let Some(withheld) = self.catalog.withheld(name) {
            // Known but not offered (a pinned definition changed, say): refused like an unknown
            // tool, with the real reason in the audit and the log.
            tracing::warn!(tool = name, rule = %withheld.rule, reason = %withheld.reason, "withheld tool called");
            return Break(denied(name, &withheld.rule, false));
        }
        match self
            .gate
            .admission(name, call.arguments(), self.catalog.has(name))
        {
            Ok(()) => Continue(()),
            Err((denial, visible)) => Break(Answer::Denied { denial, visible }),
        }
    }

    /// The caller's bucket for this tool; an empty one answers "retry after N s" (rounded up).
    pub(super) async fn rate_limit(&self, call: &CallState<'_>) -> Flow {
        let gate = self.gate;
        let Some(limit) = gate.policy().rate_limit(call.name) else {
            return Continue(());
        };
        let principal = &gate.principal().sub;
        // Replicas share one bucket in their shared store; one process keeps its own in memory.
        let taken = match gate.state().filter(|state| state.shared()) {
            None => gate.limits().take(limit, principal, call.name),
            Some(state) => {
                let every = i64::try_from(limit.every.as_millis()).unwrap_or(i64::MAX);
                match state
                    .take_rate(principal, call.name, every, limit.burst.get(), now_ms())
                    .await
                {
                    Ok(taken) => taken
                        .map_err(|ms| Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))),
                    Err(error) => {
                        tracing::error!(error = %error, tool = call.name, "rate limit unreadable; refusing");
                        return Break(Answer::NotRun {
                            rule: "rate_limit.unavailable".to_owned(),
                            why: "the shared rate limit did not answer".to_owned(),
                        });
                    }
                }
            }
        };
        match taken {
            Ok(()) => Continue(()),
            Err(wait) => {
                let seconds = crate::seconds_up(wait);
                tracing::info!(tool = call.name, principal = %principal, retry_after_s = seconds, "rate limit reached");
                Break(Answer::RateLimited {
                    retry_after_s: seconds,
                })
            }
        }
    }

    /// The arguments against the tool's own JSON Schema: a reason the model can act on.
    pub(super) fn schema(&self, call: &CallState<'_>) -> Flow {
        let Some(schema) = self.catalog.schema(call.name) else {
            return Continue(());
        };
        match schema.validate(&call.arguments) {
            Ok(()) => Continue(()),
            Err(invalid) => {
                let reason = self
                    .gate
                    .redactor()
                    .redact(&format!("invalid arguments for {}: {invalid}", call.name))
                    .into_owned();
                Break(Answer::Invalid {
                    rule: "schema".to_owned(),
                    reason,
                })
            }
        }
    }

    /// Tier (raised by escalation), gate switch, then the medium budget for a call that will run.
    /// A gated tool whose switch is off answers with its dry run.
    pub(super) async fn decide(&self, call: &mut CallState<'_>) -> Flow {
        let gate = self.gate;
        let name = call.name;
        let policy = gate.policy();
        let assessment = policy.assess(name, call.arguments(), gate.principal());
        for why in &assessment.undecided {
            tracing::warn!(tool = name, condition = %why, "escalation condition undecidable; counted as matched");
        }
        let mut verdict = policy.decide(name, &assessment, gate.gate_open(name));
        if verdict.action == Action::ChargeBudget {
            let within = self.charge_budget().await;
            verdict = verdict.charged(within);
        }
        let answer = match verdict.action {
            // The tool is listed for this caller; the arguments made it blocked. Saying so is no
            // leak, and "unknown tool" would be a lie the model cannot act on.
            Action::Deny => Some(denied(name, &verdict.rule, gate.visible(name))),
            Action::RefuseWithDryRun => Some(Answer::DryRun {
                rule: verdict.rule.clone(),
                gate_env: policy.gate_env(name),
                preview: self.dry_run(call, &verdict).await,
                tool_description: self
                    .catalog
                    .get(name)
                    .and_then(|tool| tool.description.as_deref())
                    .map(str::to_owned),
                arguments: gate
                    .redactor()
                    .redact_value_echoing(&call.arguments, &call.echoes),
            }),
            Action::NeedsApproval | Action::Run | Action::ChargeBudget => None,
        };
        call.verdict = Some(verdict);
        match answer {
            Some(answer) => Break(answer),
            None => Continue(()),
        }
    }

    /// Counts a medium call; false when the principal is over budget or the store cannot say (then
    /// the call needs a person, which is the safe side).
    async fn charge_budget(&self) -> bool {
        let Some(state) = self.gate.state() else {
            return true;
        };
        let defaults = self.gate.policy().defaults();
        let window = i64::try_from(defaults.medium_window.as_millis()).unwrap_or(i64::MAX);
        let principal = &self.gate.principal().sub;
        // Boxed: a store's future is kilobytes (module `corridor`, "Sizes").
        let charged =
            Box::pin(state.charge_budget(principal, defaults.medium_budget, window, now_ms()));
        match charged.await {
            Ok(within) => within,
            Err(error) => {
                tracing::error!(error = %error, "budget store unavailable; treating as over budget");
                false
            }
        }
    }

    /// What a refused or held call would have done: the tool's own dry run
    /// (`preview_available: true`), or, for a tool without one, a preview that says no exact one
    /// is available and shows the arguments (seed 004).
    pub(super) async fn dry_run(&self, call: &CallState<'_>, verdict: &Verdict) -> Value {
        let redactor = self.gate.redactor();
        let mut preview = match self.toolset.dry_run(call.name, call.arguments()).await {
            // An upstream's preview is someone else's text, like its output.
            Some(preview) if self.origin.is_some() => {
                let mut report = sanitize::Report::default();
                sanitize::clean_value(&preview, redactor, sanitize::DEFAULT_MAX_CHARS, &mut report)
            }
            Some(preview) => redactor.redact_value(&preview),
            None => json!({
                "preview_available": false,
                "note": "No exact preview is available: this tool has no dry run. The arguments it was called with are shown instead.",
                "would": format!("call {} with the arguments below", call.name),
                "arguments": redactor.redact_value_echoing(&call.arguments, &call.echoes),
                "reversible": Value::Null,
                "rule": verdict.rule,
                "tier": verdict.tier.as_str(),
                "synthesised": true,
            }),
        };
        if let Value::Object(fields) = &mut preview {
            // A tool that said it itself (a preview that failed) keeps its own word.
            fields
                .entry("preview_available")
                .or_insert(Value::Bool(true));
        }
        preview
    }
}

/// The -32602 refusal of `tool` under `rule`.
pub(super) fn denied(tool: &str, rule: &str, visible: bool) -> Answer<rmcp::model::CallToolResult> {
    Answer::Denied {
        denial: Denial {
            tool: tool.to_owned(),
            rule: rule.to_owned(),
        },
        visible,
    }
}

/// Why a call waits for a person, for the approval request a person reads.
pub(super) fn approval_reason(verdict: &Verdict) -> String {
    if verdict.rule == "defaults.medium_budget" {
        "the caller's budget of unattended medium calls is used up".to_owned()
    } else if verdict.declared == Tier::High {
        "the tool is high risk".to_owned()
    } else {
        format!(
            "the arguments raise it from {} to {}",
            verdict.declared.as_str(),
            verdict.tier.as_str()
        )
    }
}
