//! The corridor (DESIGN.md §1): the one path every `tools/call` walks, in order.
//!
//! kill switch → visibility (with the token's scopes) and argument rules (-32602) → rate limit
//! (isError) → schema (isError) → tier, escalation,
//! budget, gate switch → approval (`approval.rs`) → idempotency claim, execute with timeout and
//! cancellation, sanitise untrusted output (`execute.rs`) → audit. Each refusal is audited before it
//! is answered; a store that cannot answer means the call does not run. Kit tools and upstream tools
//! (the gateway) walk the same steps; only the toolset behind `Toolset::call` differs.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rmcp::model::CallToolResult;
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer};
use serde_json::{Map, Value, json};
use toolgate_core::audit::{Decision, Event, Outcome};
use toolgate_core::canonical;
use toolgate_core::policy::{Action, Denial, Situation, Tier, Verdict};
use toolgate_core::principal::Principal;
use toolgate_core::sanitize;

use super::Gate;
use crate::outcome;
use crate::toolset::{Catalog, Toolset};

/// Everything the corridor needs besides the call: the gate, the toolset, and the catalog as it
/// was when the call arrived (a list change mid-call does not change what this call checks).
pub(super) struct Corridor<'a> {
    pub(super) gate: &'a Gate,
    pub(super) toolset: &'a dyn Toolset,
    pub(super) catalog: Arc<Catalog>,
    /// The upstream that serves the tool, named in every audit record of the call.
    pub(super) origin: Option<String>,
}

impl<'a> Corridor<'a> {
    pub(super) fn new(gate: &'a Gate, toolset: &'a dyn Toolset, name: &str) -> Self {
        Self {
            gate,
            toolset,
            catalog: toolset.catalog(),
            origin: toolset.origin(name),
        }
    }

    pub(super) async fn call(
        &self,
        name: &str,
        arguments: Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let gate = self.gate;
        if self.killswitch_on().await {
            let denial = Denial {
                tool: name.to_owned(),
                rule: "killswitch".to_owned(),
            };
            return Err(self.refuse(name, &arguments, denial, false).await);
        }
        if let Some(withheld) = self.catalog.withheld(name) {
            // Known but not offered (a pinned definition changed, say): refused like an unknown
            // tool, with the real reason in the audit and the log.
            tracing::warn!(tool = name, rule = %withheld.rule, reason = %withheld.reason, "withheld tool called");
            let denial = Denial {
                tool: name.to_owned(),
                rule: withheld.rule.clone(),
            };
            return Err(self.refuse(name, &arguments, denial, false).await);
        }
        // The gate's own admission rule; refused here so that the record names the upstream.
        let admitted = gate.admission(name, &arguments, self.catalog.has(name));
        if let Err((denial, visible)) = admitted {
            return Err(self.refuse(name, &arguments, denial, visible).await);
        }
        if let Some(limit) = gate.policy().rate_limit(name)
            && let Err(wait) = gate.limits().take(limit, &gate.principal().sub, name)
        {
            return Ok(self.rate_limited(name, &arguments, wait).await);
        }
        let args = Value::Object(arguments.clone());
        if let Some(schema) = self.catalog.schema(name)
            && let Err(invalid) = schema.validate(&args)
        {
            let event = self.event(
                name,
                &arguments,
                Decision::Deny,
                Outcome::InvalidArgs,
                "schema",
            );
            if !gate.record(event).await {
                return Ok(outcome::audit_unavailable(name));
            }
            let reason = gate
                .redactor()
                .redact(&format!("invalid arguments for {name}: {invalid}"))
                .into_owned();
            let detail = json!({"status": "invalid_args", "rule": "schema", "policy_sha256": gate.policy().sha256()});
            return Ok(outcome::tool_error(reason, detail));
        }

        let principal = gate.principal().clone();
        let policy = gate.policy();
        let assessment = policy.assess(name, &arguments, &principal);
        for why in &assessment.undecided {
            tracing::warn!(tool = name, condition = %why, "escalation condition undecidable; counted as matched");
        }
        let over_budget = if assessment.tier == Tier::Medium {
            !self.charge_budget(&principal).await
        } else {
            false
        };
        let situation = Situation {
            killswitch: false,
            gate_open: gate.gate_open(name),
            over_budget,
        };
        let verdict = policy.decide(name, &assessment, situation);
        match verdict.action {
            Action::Deny => {
                let denial = Denial {
                    tool: name.to_owned(),
                    rule: verdict.rule.clone(),
                };
                // The tool is listed for this caller; the arguments made it blocked. Saying so is
                // no leak, and "unknown tool" would be a lie the model cannot act on.
                let visible = gate.visible(name);
                Err(self.refuse(name, &arguments, denial, visible).await)
            }
            Action::RefuseWithDryRun => Ok(self.refuse_gated(name, &arguments, &verdict).await),
            Action::NeedsApproval => {
                self.approval(name, arguments, &principal, &verdict, context)
                    .await
            }
            Action::Run => {
                self.execute(name, arguments, &principal, &verdict, context)
                    .await
            }
        }
    }

    /// An audit event for this call, naming the upstream when there is one.
    pub(super) fn event(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        decision: Decision,
        outcome: Outcome,
        rule: &str,
    ) -> Event {
        let event = self.gate.event(name, arguments, decision, outcome, rule);
        super::from_upstream(event, self.origin.as_deref())
    }

    /// Audits a refusal before dispatch and builds the -32602 answer.
    async fn refuse(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        denial: Denial,
        visible: bool,
    ) -> ErrorData {
        let event = self.event(
            name,
            arguments,
            Decision::Deny,
            Outcome::NotExecuted,
            &denial.rule,
        );
        self.gate.refuse_recorded(event, &denial, visible).await
    }

    /// The caller's bucket for this tool is empty: an error result it can relay ("retry after N
    /// s", rounded up), audited `deny / rate_limited`; nothing ran.
    async fn rate_limited(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        wait: std::time::Duration,
    ) -> CallToolResult {
        let event = self.event(
            name,
            arguments,
            Decision::Deny,
            Outcome::RateLimited,
            "rate_limit",
        );
        if !self.gate.record(event).await {
            return outcome::audit_unavailable(name);
        }
        let seconds = crate::seconds_up(wait);
        tracing::info!(tool = name, principal = %self.gate.principal().sub, retry_after_s = seconds, "rate limit reached");
        outcome::tool_error(
            format!("rate limit reached, retry after {seconds} s"),
            json!({"status": "rate_limited", "retry_after_s": seconds, "rule": "rate_limit"}),
        )
    }

    /// Whether the kill switch is on; a switch that cannot be read counts as on.
    async fn killswitch_on(&self) -> bool {
        let Some(state) = self.gate.state() else {
            return false;
        };
        state.killswitch_on().await.unwrap_or_else(|error| {
            tracing::error!(error = %error, "kill switch unreadable; refusing");
            true
        })
    }

    /// Counts a medium call; false when the principal is over budget or the store cannot say (then
    /// the call needs a person, which is the safe side).
    async fn charge_budget(&self, principal: &Principal) -> bool {
        let Some(state) = self.gate.state() else {
            return true;
        };
        let defaults = self.gate.policy().defaults();
        let window = i64::try_from(defaults.medium_window.as_millis()).unwrap_or(i64::MAX);
        match state
            .charge_budget(&principal.sub, defaults.medium_budget, window, now_ms())
            .await
        {
            Ok(within) => within,
            Err(error) => {
                tracing::error!(error = %error, "budget store unavailable; treating as over budget");
                false
            }
        }
    }

    /// What a refused or held call would have done: the tool's own dry run, or a preview.
    pub(super) async fn dry_run(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        verdict: &Verdict,
    ) -> Value {
        let redactor = self.gate.redactor();
        match self.toolset.dry_run(name, arguments).await {
            // An upstream's preview is someone else's text, like its output.
            Some(preview) if self.origin.is_some() => {
                let mut report = sanitize::Report::default();
                sanitize::clean_value(&preview, redactor, sanitize::DEFAULT_MAX_CHARS, &mut report)
            }
            Some(preview) => redactor.redact_value(&preview),
            None => json!({
                "would": format!("call {name} with the arguments below"),
                "arguments": redactor.redact_value(&Value::Object(arguments.clone())),
                "reversible": Value::Null,
                "rule": verdict.rule,
                "tier": verdict.tier.as_str(),
                "synthesised": true,
            }),
        }
    }

    async fn refuse_gated(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        verdict: &Verdict,
    ) -> CallToolResult {
        let gate = self.gate;
        let env = gate.policy().gate_env(name);
        let event = self.event(
            name,
            arguments,
            Decision::Refuse,
            Outcome::DryRun,
            &verdict.rule,
        );
        if !gate.record(event).await {
            return outcome::audit_unavailable(name);
        }
        let reason =
            format!("{name} is gated: it stays off until {env} is set in the server's environment");
        outcome::tool_error(
            format!("{reason}. Nothing was done. Dry run attached."),
            json!({
                "status": "refused",
                "reason": reason,
                "rule": verdict.rule,
                "policy_sha256": gate.policy().sha256(),
                "enable": format!("restart the server with {env}=1 (accepted: 1 true yes on enable enabled allow)"),
                "gate_env": env,
                "dry_run": self.dry_run(name, arguments, verdict).await,
            }),
        )
    }
}

/// Binds an approval to exactly this call: who, what, with which arguments, under which policy.
#[must_use]
pub fn fingerprint(
    principal: &Principal,
    tool: &str,
    arguments: &Map<String, Value>,
    policy_sha256: &str,
) -> String {
    canonical::digest(&json!({
        "principal": principal.sub,
        "tool": tool,
        "arguments": arguments,
        "policy_sha256": policy_sha256,
    }))
}

pub(super) fn store_error(error: impl std::fmt::Display) -> ErrorData {
    tracing::error!(error = %error, "approval store unavailable; call not run");
    ErrorData::internal_error("approval store unavailable; the call was not run", None)
}

/// Unix milliseconds now.
#[must_use]
pub fn now_ms() -> i64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
}

/// `2026-11-30T09:52:58Z` from unix milliseconds (civil-from-days, proleptic Gregorian).
#[must_use]
pub fn rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
