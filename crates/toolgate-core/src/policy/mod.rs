//! The policy: which tools exist for a caller, how risky each call is, and what must happen before
//! it runs.
//!
//! Two formats, one model (DESIGN.md §3): version 1 is the seed's `policy.json` (`allow`, `deny`,
//! `arg_rules`), accepted verbatim; version 2 is TOML with per-tool tiers, CEL escalation rules,
//! gated tools, budgets and approval settings. Both are validated strictly: an unknown version or
//! field, a rule that can never pass, a condition that does not compile is a load error, never a
//! silent denial at call time. A loaded policy is immutable and carries the SHA-256 of its file, so
//! every decision names the exact policy that made it.
//!
//! Precedence: `deny` (v1) and `tier = "blocked"` hide a tool; a tool the policy does not name gets
//! `defaults.tier`, which is `blocked` unless the file says otherwise (a v1 file hides everything it
//! does not allow, as the seed does). Escalation only ever raises a tier.

mod condition;
mod declared;
mod error;
mod raw;
mod verify;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::num::NonZeroU32;
use std::time::Duration;

use serde_json::{Map, Value};

pub use condition::Condition;
pub use declared::Declared;
pub use error::{ConditionError, PolicyError};
pub use verify::{Compensation, Expression, Postcondition};

use crate::principal::Principal;
use raw::{RawArgRule, RawRateLimit, RawTool, RawV1, RawV2};

/// The policy of seed 000, verbatim: what `toolgate demo` runs with and the README's example.
pub const SEED_POLICY: &str = include_str!("seed-policy.json");

/// How much scrutiny a call gets. Ordered: `Low < Medium < High < Blocked`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Runs.
    Low,
    /// Runs and counts against the principal's budget; past it, high.
    Medium,
    /// Needs a person's approval.
    High,
    /// Hidden and refused, always.
    Blocked,
}

impl Tier {
    /// The name the policy file and the audit record use: `low`, `medium`, `high` or `blocked`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Low => "low",
            Self::Medium => "medium",
            Self::High => "high",
            Self::Blocked => "blocked",
        }
    }

    fn parse(text: &str, field: &str) -> Result<Self, PolicyError> {
        match text {
            "low" => Ok(Self::Low),
            "medium" => Ok(Self::Medium),
            "high" => Ok(Self::High),
            "blocked" => Ok(Self::Blocked),
            other => Err(invalid(
                field,
                format!("unknown tier {other:?} (low, medium, high, blocked)"),
            )),
        }
    }
}

/// Bounds on one string argument, in Unicode scalar values (Python's `len`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArgRule {
    /// Fewest characters allowed, inclusive.
    pub min_len: Option<usize>,
    /// Most characters allowed, inclusive; never below `min_len` in a loaded policy.
    pub max_len: Option<usize>,
}

/// A rule that raises a tier when its condition holds.
#[derive(Debug)]
pub struct Escalation {
    /// The CEL condition over `args`, `principal` and `tool`.
    pub when: Condition,
    /// The tier the call gets when `when` holds (if higher than it has already).
    pub tier: Tier,
}

/// Everything the policy says about one tool.
#[derive(Debug, Default)]
pub struct ToolRule {
    /// The tool's own tier; `None` takes `defaults.tier`.
    pub tier: Option<Tier>,
    /// Escalation rules in file order; every one that matches may raise the tier.
    pub escalate: Vec<Escalation>,
    /// Length bounds per string argument, by argument name.
    pub args: BTreeMap<String, ArgRule>,
    /// Off until its environment switch is set; a refused call answers with a dry run.
    pub gated: bool,
    /// Overrides the policy-wide `<PREFIX>_ALLOW_GATED` variable for this tool.
    pub gate_env: Option<String>,
    /// The argument that names the effect (idempotency key); `"*"`: the canonical arguments are
    /// the key.
    pub idempotency_key: Option<String>,
    /// The tool dedupes by itself: safe to forward again when an earlier outcome is unknown.
    pub idempotent: bool,
    /// The tool's own handler timeout; `None` takes `defaults.timeout`.
    pub timeout: Option<Duration>,
    /// HTTP: the OAuth scope this tool needs.
    pub scope: Option<String>,
    /// Calls per principal to this tool; overrides `defaults.rate_limit`.
    pub rate_limit: Option<RateLimit>,
    /// `untrusted` output is sanitised before it reaches the model.
    pub untrusted_output: bool,
    /// Gateway: a tool of the same upstream that previews this one, called instead of it when the
    /// gate answers with a dry run.
    pub dry_run_tool: Option<String>,
    /// Arguments set over the call's own when `dry_run_tool` is called (e.g. `dryRun = true`).
    pub dry_run_args: Map<String, Value>,
    /// What the gate reads back after a successful call, and what it does when that does not hold
    /// (`[tools.NAME.verify]`, seed 000's execute-verify-stop).
    pub verify: Option<Postcondition>,
    /// Who may decide this tool's approvals (`approvers`, `approvals_required`); `None` takes
    /// `defaults`'.
    pub approvers: Option<Approvers>,
}

/// Policy-wide settings.
#[derive(Clone, Debug)]
pub struct Defaults {
    /// Tier of a tool the policy does not name.
    pub tier: Tier,
    /// Unanswered approvals expire after this; expiry is denial.
    pub approval_ttl: Duration,
    /// How long a call is held open waiting for a decision before it answers "pending".
    pub approval_wait: Duration,
    /// Unattended medium calls per principal per window; past it, medium becomes high.
    pub medium_budget: u32,
    /// The window `medium_budget` counts over.
    pub medium_window: Duration,
    /// A handler that runs longer gets an error result.
    pub timeout: Duration,
    /// Calls per principal and tool for tools without their own limit (none: unlimited).
    pub rate_limit: Option<RateLimit>,
    /// Who may decide the approvals of tools that name none of their own.
    pub approvers: Approvers,
    /// A tool whose ended approval requests were approved at least this often (a share, 0 to 1)
    /// is flagged: people may be approving without reading (seed 003's approval fatigue).
    pub approval_fatigue: f64,
}

/// Who may decide a tool's approvals, and how many must agree (issue 14, seed 003's "check the
/// approver's role as well"). The requester never may, whatever the list says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Approvers {
    /// `user:NAME` and `group:NAME` entries; `None`: anyone but the requester.
    pub allowed: Option<Vec<String>>,
    /// Distinct approvers that must approve; any one denial denies.
    pub required: u32,
}

impl Default for Approvers {
    fn default() -> Self {
        Self {
            allowed: None,
            required: 1,
        }
    }
}

/// A token bucket: `burst` calls at once, then one more every `every` (per principal and tool).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RateLimit {
    /// Calls that may be made at once with a full bucket (its size).
    pub burst: NonZeroU32,
    /// How long it takes one spent call to come back; never zero in a loaded policy.
    pub every: Duration,
}

impl Default for Defaults {
    fn default() -> Self {
        Self {
            tier: Tier::Blocked,
            approval_ttl: Duration::from_secs(300),
            approval_wait: Duration::from_secs(60),
            medium_budget: 5,
            medium_window: Duration::from_secs(3600),
            timeout: Duration::from_secs(60),
            rate_limit: None,
            approvers: Approvers::default(),
            approval_fatigue: 0.9,
        }
    }
}

/// The values of a gate variable that switch its gated tools on (seed 004), in any case.
pub const ENABLING: &[&str] = &["1", "true", "yes", "on", "enable", "enabled", "allow"];

/// Whether `value` of a gate variable switches its tools on: one of [`ENABLING`], in any case,
/// around any whitespace. Anything else (`0`, empty, `no`, a typo) leaves them off.
#[must_use]
pub fn enabling(value: &str) -> bool {
    let value = value.trim();
    ENABLING.iter().any(|e| value.eq_ignore_ascii_case(e))
}

/// A validated policy.
#[derive(Debug)]
pub struct Policy {
    sha256: String,
    version: u8,
    name: Option<String>,
    defaults: Defaults,
    tools: BTreeMap<String, ToolRule>,
    /// Gateway: prompt names allowed through from upstreams (none by default).
    prompts: Vec<String>,
    /// Gateway: resource URIs allowed through; an entry ending in `*` is a prefix.
    resources: Vec<String>,
    /// Gateway: the upstreams whose requests of the caller pass, per kind.
    requests: ClientRequests,
    /// Gateway: the upstreams whose tasks (MCP tasks extension) pass to callers that declare it.
    tasks: Vec<String>,
}

/// What an upstream may ask of the caller through the gateway (MCP's server-to-client requests,
/// or the same carried in an `input_required` result).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientRequest {
    /// `sampling/createMessage`: the caller's model, on the upstream's prompt.
    Sampling,
    /// `elicitation/create`: a question to the caller's user (a form, or a URL to open).
    Elicitation,
    /// `roots/list`: the caller's roots (directories it works in).
    Roots,
}

impl ClientRequest {
    /// The MCP method.
    #[must_use]
    pub fn method(self) -> &'static str {
        match self {
            Self::Sampling => "sampling/createMessage",
            Self::Elicitation => "elicitation/create",
            Self::Roots => "roots/list",
        }
    }

    /// The policy rule that decides it (`[passthrough] sampling = [...]`).
    #[must_use]
    pub fn rule(self) -> &'static str {
        match self {
            Self::Sampling => "passthrough.sampling",
            Self::Elicitation => "passthrough.elicitation",
            Self::Roots => "passthrough.roots",
        }
    }
}

/// Per kind, the upstream names whose requests pass (`*`: every upstream).
#[derive(Clone, Debug, PartialEq, Eq)]
struct ClientRequests {
    sampling: Vec<String>,
    elicitation: Vec<String>,
    roots: Vec<String>,
}

impl Default for ClientRequests {
    /// Elicitation and roots pass (they ask the caller's own user, or tell where it works);
    /// sampling does not (it spends the caller's model on an upstream's prompt).
    fn default() -> Self {
        Self {
            sampling: Vec::new(),
            elicitation: vec![ANY_UPSTREAM.to_owned()],
            roots: vec![ANY_UPSTREAM.to_owned()],
        }
    }
}

/// In `[passthrough] sampling / elicitation / roots / tasks`: every upstream.
const ANY_UPSTREAM: &str = "*";

/// Tasks pass from every upstream by default: the call that became a task was gated before it
/// was forwarded (tier, approval, key), the upstream alone chose to run it as a task, and its
/// result, questions and end pass through the same redaction, policy and audit as a call's.
fn default_tasks() -> Vec<String> {
    vec![ANY_UPSTREAM.to_owned()]
}

/// Why a call was refused, in words the client may see and a rule name the audit can keep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    /// The tool the call named.
    pub tool: String,
    /// Which rule refused, e.g. `deny`, `not_allowed`, `arg_rules.write_note.request_id.min_len`.
    pub rule: String,
}

/// A call's tier as the policy sees it, before any state (kill switch, budget, gate switch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assessment {
    /// The tool's own tier.
    pub declared: Tier,
    /// After escalation.
    pub tier: Tier,
    /// The rule that set `tier`: `tools.NAME.tier`, `tools.NAME.escalate[i]`, `defaults.tier`.
    pub rule: String,
    /// Conditions that could not be evaluated and were counted as matched, with why.
    pub undecided: Vec<String>,
}

/// What the gate does with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// Runs now: a low call.
    Run,
    /// A medium call that runs if the principal's budget of unattended medium calls has room, and
    /// otherwise needs a person ([`Verdict::charged`]). The only action that spends budget, so a
    /// call that will not run (blocked, gated with its switch off) never does.
    ChargeBudget,
    /// A gated tool whose switch is off: refused, answered with what it would have done.
    RefuseWithDryRun,
    /// Held until a person approves it: a high call.
    NeedsApproval,
    /// Refused outright: the tier is `blocked`.
    Deny,
}

/// The decision and the rule that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// What the gate does with the call.
    pub action: Action,
    /// The tool's own tier, before escalation.
    pub declared: Tier,
    /// The call's tier after escalation; `high` once [`Verdict::charged`] finds the budget spent.
    pub tier: Tier,
    /// The rule that decided, e.g. `tools.NAME.gated` or `defaults.medium_budget`.
    pub rule: String,
}

impl Verdict {
    /// A [`Action::ChargeBudget`] verdict once the budget has answered: it runs when `within`,
    /// else it needs a person under the rule `defaults.medium_budget`. Other verdicts are
    /// returned as they are.
    #[must_use]
    pub fn charged(self, within: bool) -> Self {
        match self.action {
            Action::ChargeBudget if within => Self {
                action: Action::Run,
                ..self
            },
            Action::ChargeBudget => Self {
                action: Action::NeedsApproval,
                tier: Tier::High,
                rule: "defaults.medium_budget".to_owned(),
                ..self
            },
            _ => self,
        }
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
    crate::canonical::digest(&serde_json::json!({
        "principal": principal.sub,
        "tool": tool,
        "arguments": arguments,
        "policy_sha256": policy_sha256,
    }))
}

impl Policy {
    /// Parses and validates a policy file: JSON is version 1, anything else is read as TOML
    /// version 2.
    ///
    /// # Errors
    /// The file is not of the expected shape, names an unsupported version, or holds a rule that
    /// can never be satisfied or a condition that does not compile.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, PolicyError> {
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        if first == Some(&b'{') {
            return Self::from_json(bytes);
        }
        let text =
            std::str::from_utf8(bytes).map_err(|_| invalid("file", "is not UTF-8".to_owned()))?;
        let raw: RawV2 =
            toml::from_str(text).map_err(|source| PolicyError::MalformedToml { source })?;
        if raw.version != 2 {
            return Err(PolicyError::UnsupportedVersion {
                found: raw.version.to_string(),
            });
        }
        Self::from_v2(raw, sha256(bytes))
    }

    /// Parses and validates a version 1 (JSON) policy.
    ///
    /// # Errors
    /// As [`Policy::from_bytes`].
    pub fn from_json(bytes: &[u8]) -> Result<Self, PolicyError> {
        let raw: RawV1 =
            serde_json::from_slice(bytes).map_err(|source| PolicyError::Malformed { source })?;
        if raw.version != 1 {
            return Err(PolicyError::UnsupportedVersion {
                found: raw.version.to_string(),
            });
        }
        let mut tools: BTreeMap<String, ToolRule> = BTreeMap::new();
        for name in raw.allow {
            tools.entry(name).or_default().tier = Some(Tier::Low);
        }
        // deny beats allow (seed 000).
        for name in raw.deny {
            tools.entry(name).or_default().tier = Some(Tier::Blocked);
        }
        for (tool, rules) in raw.arg_rules {
            let rule = tools.entry(tool.clone()).or_default();
            rule.args = arg_rules(&tool, rules)?;
        }
        Ok(Self {
            sha256: sha256(bytes),
            version: 1,
            name: None,
            defaults: Defaults::default(),
            tools,
            prompts: Vec::new(),
            resources: Vec::new(),
            requests: ClientRequests::default(),
            tasks: default_tasks(),
        })
    }

    fn from_v2(raw: RawV2, sha256: String) -> Result<Self, PolicyError> {
        let base = Defaults::default();
        let d = raw.defaults;
        let defaults = Defaults {
            tier: d
                .tier
                .as_deref()
                .map(|t| Tier::parse(t, "defaults.tier"))
                .transpose()?
                .unwrap_or(base.tier),
            approval_ttl: dur(d.approval_ttl.as_deref(), "defaults.approval_ttl")?
                .unwrap_or(base.approval_ttl),
            approval_wait: dur(d.approval_wait.as_deref(), "defaults.approval_wait")?
                .unwrap_or(base.approval_wait),
            medium_budget: d.medium_budget.unwrap_or(base.medium_budget),
            medium_window: dur(d.medium_window.as_deref(), "defaults.medium_window")?
                .unwrap_or(base.medium_window),
            timeout: dur(d.timeout.as_deref(), "defaults.timeout")?.unwrap_or(base.timeout),
            rate_limit: rate_limit(d.rate_limit, "defaults.rate_limit")?,
            approvers: approvers(d.approvers, d.approvals_required, "defaults")?
                .unwrap_or_default(),
            approval_fatigue: match d.approval_fatigue {
                None => base.approval_fatigue,
                Some(share) if (0.0..=1.0).contains(&share) && share > 0.0 => share,
                Some(share) => {
                    return Err(invalid(
                        "defaults.approval_fatigue",
                        format!("{share} is not a share of requests above 0 and at most 1"),
                    ));
                }
            },
        };
        if let Some(name) = &raw.name {
            check_name(name)?;
        }
        let defaults_requests = ClientRequests::default();
        let mut tools = BTreeMap::new();
        for (name, tool) in raw.tools {
            let rule = tool_rule(&name, tool)?;
            tools.insert(name, rule);
        }
        verify::check_policy(&tools, defaults.tier)?;
        Ok(Self {
            sha256,
            version: 2,
            name: raw.name,
            defaults,
            tools,
            requests: ClientRequests {
                sampling: raw
                    .passthrough
                    .sampling
                    .unwrap_or(defaults_requests.sampling),
                elicitation: raw
                    .passthrough
                    .elicitation
                    .unwrap_or(defaults_requests.elicitation),
                roots: raw.passthrough.roots.unwrap_or(defaults_requests.roots),
            },
            tasks: raw.passthrough.tasks.unwrap_or_else(default_tasks),
            prompts: raw.passthrough.prompts,
            resources: raw.passthrough.resources,
        })
    }

    /// Whether the gateway passes `kind` from `upstream` to the caller (`[passthrough]`).
    #[must_use]
    pub fn passes_request(&self, kind: ClientRequest, upstream: &str) -> bool {
        let names = match kind {
            ClientRequest::Sampling => &self.requests.sampling,
            ClientRequest::Elicitation => &self.requests.elicitation,
            ClientRequest::Roots => &self.requests.roots,
        };
        names.iter().any(|n| n == ANY_UPSTREAM || n == upstream)
    }

    /// Whether a tool call forwarded to `upstream` may come back as a task (the MCP tasks
    /// extension, `[passthrough] tasks`), for a caller that declared the extension.
    #[must_use]
    pub fn passes_tasks_from(&self, upstream: &str) -> bool {
        self.tasks
            .iter()
            .any(|n| n == ANY_UPSTREAM || n == upstream)
    }

    /// Whether some call may have to wait for a person: a tier of medium (past the budget it is
    /// high) or high, as the default, a tool's own, or an escalation's. A server offers tasks for
    /// calls held for a person only then.
    #[must_use]
    pub fn may_need_approval(&self) -> bool {
        let asks = |tier: Tier| matches!(tier, Tier::Medium | Tier::High);
        asks(self.defaults().tier)
            || self.tools().any(|(_, rule)| {
                rule.tier.is_some_and(asks) || rule.escalate.iter().any(|e| asks(e.tier))
            })
    }

    /// Whether any upstream's tasks may pass (`[passthrough] tasks` names one): the gateway then
    /// declares the tasks extension, whichever upstreams are connected at the moment.
    #[must_use]
    pub fn passes_tasks(&self) -> bool {
        !self.tasks.is_empty()
    }

    /// Whether the gateway passes the upstream prompt `name` through (`[passthrough] prompts`).
    #[must_use]
    pub fn prompt_allowed(&self, name: &str) -> bool {
        self.prompts.iter().any(|p| p == name)
    }

    /// Whether any upstream prompt may pass (`[passthrough] prompts` names one).
    #[must_use]
    pub fn passes_prompts(&self) -> bool {
        !self.prompts.is_empty()
    }

    /// Whether any upstream resource may pass (`[passthrough] resources` names one).
    #[must_use]
    pub fn passes_resources(&self) -> bool {
        !self.resources.is_empty()
    }

    /// Whether the gateway passes the upstream resource `uri` through (`[passthrough] resources`:
    /// exact URIs, or prefixes written with a trailing `*`).
    #[must_use]
    pub fn resource_allowed(&self, uri: &str) -> bool {
        self.resources.iter().any(|r| match r.strip_suffix('*') {
            Some(prefix) => uri.starts_with(prefix),
            None => r == uri,
        })
    }

    /// SHA-256 of the policy file's bytes.
    #[must_use]
    pub fn sha256(&self) -> &str {
        &self.sha256
    }

    /// The policy's `name` (version 2), which also gives the gate variables their prefix.
    #[must_use]
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// 1 (the seed's JSON) or 2 (TOML).
    #[must_use]
    pub fn version(&self) -> u8 {
        self.version
    }

    /// The policy-wide settings, with the built-in values wherever the file is silent.
    #[must_use]
    pub fn defaults(&self) -> &Defaults {
        &self.defaults
    }

    /// The tools the policy names, with their rules.
    pub fn tools(&self) -> impl Iterator<Item = (&str, &ToolRule)> {
        self.tools.iter().map(|(name, rule)| (name.as_str(), rule))
    }

    /// What the policy says about `tool` (`None` when it does not name it).
    #[must_use]
    pub fn rule(&self, tool: &str) -> Option<&ToolRule> {
        self.tools.get(tool)
    }

    /// The postcondition the gate checks after a successful call to `tool`, if the policy
    /// declares one.
    #[must_use]
    pub fn postcondition(&self, tool: &str) -> Option<&Postcondition> {
        self.rule(tool).and_then(|r| r.verify.as_ref())
    }

    /// The tool's own tier and the rule it comes from.
    fn declared(&self, tool: &str) -> (Tier, String) {
        match self.tools.get(tool).and_then(|r| r.tier) {
            Some(tier) => (tier, format!("tools.{tool}.tier")),
            None => (self.defaults.tier, "defaults.tier".to_owned()),
        }
    }

    /// The OAuth scope a call to `tool` needs on HTTP (none: any authenticated caller).
    #[must_use]
    pub fn scope(&self, tool: &str) -> Option<&str> {
        self.rule(tool).and_then(|r| r.scope.as_deref())
    }

    /// Every scope the policy names, for the protected resource metadata's `scopes_supported`.
    #[must_use]
    pub fn scopes(&self) -> BTreeSet<&str> {
        self.tools
            .values()
            .filter_map(|r| r.scope.as_deref())
            .collect()
    }

    /// The rate limit on `tool`: its own, else the policy's default, else none.
    #[must_use]
    pub fn rate_limit(&self, tool: &str) -> Option<RateLimit> {
        self.rule(tool)
            .and_then(|r| r.rate_limit)
            .or(self.defaults.rate_limit)
    }

    /// Whether `tool` exists for the caller: listed by `tools/list` and callable at all.
    #[must_use]
    pub fn visible(&self, tool: &str) -> bool {
        self.declared(tool).0 != Tier::Blocked
    }

    /// The environment variable that opens `tool` when it is gated: `gate_env`, else
    /// `<NAME>_ALLOW_GATED` from the policy's name (`notes` and `notes-mcp` give `NOTES_ALLOW_GATED`).
    #[must_use]
    pub fn gate_env(&self, tool: &str) -> String {
        if let Some(env) = self.tools.get(tool).and_then(|r| r.gate_env.clone()) {
            return env;
        }
        let name = self
            .name
            .as_deref()
            .unwrap_or("toolgate")
            .to_ascii_uppercase();
        let base = name
            .strip_suffix("-MCP")
            .or_else(|| name.strip_suffix("_MCP"))
            .unwrap_or(&name);
        let prefix: String = base
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        format!("{prefix}_ALLOW_GATED")
    }

    /// Visibility and argument rules for a call.
    ///
    /// # Errors
    /// The [`Denial`] naming the first rule the call breaks.
    pub fn admit(&self, tool: &str, arguments: &Map<String, Value>) -> Result<(), Denial> {
        let deny = |rule: String| Denial {
            tool: tool.to_owned(),
            rule,
        };
        let (tier, rule) = self.declared(tool);
        if tier == Tier::Blocked {
            let rule = match (self.version, self.tools.contains_key(tool)) {
                (1, true) => "deny".to_owned(),
                (1, false) => "not_allowed".to_owned(),
                _ => rule,
            };
            return Err(deny(rule));
        }
        let rules = self.tools.get(tool).map(|r| &r.args);
        for (arg, rule) in rules.into_iter().flatten() {
            let name = |bound: &str| {
                if self.version == 1 {
                    format!("arg_rules.{tool}.{arg}.{bound}")
                } else {
                    format!("tools.{tool}.args.{arg}.{bound}")
                }
            };
            let Some(Value::String(value)) = arguments.get(arg) else {
                return Err(deny(name("string")));
            };
            let len = value.chars().count();
            if rule.min_len.is_some_and(|min| len < min) {
                return Err(deny(name("min_len")));
            }
            if rule.max_len.is_some_and(|max| len > max) {
                return Err(deny(name("max_len")));
            }
        }
        Ok(())
    }

    /// The call's tier: the tool's own, raised by every escalation rule that matches.
    #[must_use]
    pub fn assess(
        &self,
        tool: &str,
        arguments: &Map<String, Value>,
        principal: &Principal,
    ) -> Assessment {
        let (declared, mut rule) = self.declared(tool);
        let mut tier = declared;
        let mut undecided = Vec::new();
        let escalations = self
            .tools
            .get(tool)
            .map(|r| r.escalate.as_slice())
            .unwrap_or_default();
        for (index, escalation) in escalations.iter().enumerate() {
            let matched = match escalation.when.eval(arguments, principal, tool) {
                Ok(matched) => matched,
                Err(why) => {
                    undecided.push(format!("tools.{tool}.escalate[{index}]: {why}"));
                    true
                }
            };
            if matched && escalation.tier > tier {
                tier = escalation.tier;
                rule = format!("tools.{tool}.escalate[{index}]");
            }
        }
        Assessment {
            declared,
            tier,
            rule,
            undecided,
        }
    }

    /// The decision for an assessed call, in DESIGN.md §1's order: blocked, gate switch, then
    /// approval or the medium budget. The kill switch is not here: it is read from a store before
    /// anything else, by the corridor's first step, and refuses the call outright.
    #[must_use]
    pub fn decide(&self, tool: &str, assessment: &Assessment, gate_open: bool) -> Verdict {
        let verdict = |action, tier, rule: String| Verdict {
            action,
            declared: assessment.declared,
            tier,
            rule,
        };
        let gated = self.tools.get(tool).is_some_and(|r| r.gated);
        match assessment.tier {
            Tier::Blocked => verdict(Action::Deny, Tier::Blocked, assessment.rule.clone()),
            _ if gated && !gate_open => verdict(
                Action::RefuseWithDryRun,
                assessment.tier,
                format!("tools.{tool}.gated"),
            ),
            Tier::Medium => verdict(Action::ChargeBudget, Tier::Medium, assessment.rule.clone()),
            Tier::High => verdict(Action::NeedsApproval, Tier::High, assessment.rule.clone()),
            Tier::Low => verdict(Action::Run, Tier::Low, assessment.rule.clone()),
        }
    }

    /// Who may decide `tool`'s approvals: its own rule, else the defaults'.
    #[must_use]
    pub fn approvers(&self, tool: &str) -> &Approvers {
        self.rule(tool)
            .and_then(|r| r.approvers.as_ref())
            .unwrap_or(&self.defaults.approvers)
    }

    /// The tool's timeout: its own, else the default.
    #[must_use]
    pub fn timeout(&self, tool: &str) -> Duration {
        self.rule(tool)
            .and_then(|r| r.timeout)
            .unwrap_or(self.defaults.timeout)
    }

    /// Checks the policy against the tools really served: `tools` maps each tool name to its
    /// argument names and their declared JSON types. Returns warnings (a tool the toolset lacks,
    /// among them a postcondition's read or compensating tool: every call it verifies would stop).
    ///
    /// # Errors
    /// A rule names an argument the tool does not have, a condition can never be evaluated for
    /// the declared types, or a postcondition reads an argument its tool lacks or passes one its
    /// read or compensating tool does not take.
    pub fn check_tools(
        &self,
        tools: &BTreeMap<String, BTreeMap<String, Vec<String>>>,
    ) -> Result<Vec<String>, PolicyError> {
        let mut warnings = Vec::new();
        for (name, rule) in &self.tools {
            let Some(properties) = tools.get(name) else {
                warnings.push(format!(
                    "policy names tool `{name}`, which the served tools do not include"
                ));
                continue;
            };
            for arg in rule.args.keys() {
                if !properties.contains_key(arg) {
                    return Err(PolicyError::ImpossibleRule {
                        tool: name.clone(),
                        arg: arg.clone(),
                        detail: format!("{name} has no argument `{arg}`"),
                    });
                }
            }
            if let Some(key) = &rule.idempotency_key
                && key != "*"
                && !properties.contains_key(key)
            {
                return Err(invalid(
                    &format!("tools.{name}.idempotency_key"),
                    format!("{name} has no argument `{key}`"),
                ));
            }
            for (index, escalation) in rule.escalate.iter().enumerate() {
                escalation.when.check(name, properties).map_err(|detail| {
                    PolicyError::Condition {
                        tool: name.clone(),
                        index,
                        when: escalation.when.source().to_owned(),
                        detail,
                    }
                })?;
            }
            if let Some(verify) = &rule.verify {
                verify::check_served(name, verify, properties, tools, &mut warnings)?;
            }
        }
        Ok(warnings)
    }
}

fn tool_rule(name: &str, raw: RawTool) -> Result<ToolRule, PolicyError> {
    let field = |f: &str| format!("tools.{name}.{f}");
    let tier = raw
        .tier
        .as_deref()
        .map(|t| Tier::parse(t, &field("tier")))
        .transpose()?;
    let mut escalate = Vec::new();
    for (index, e) in raw.escalate.into_iter().enumerate() {
        let when = Condition::compile(&e.when).map_err(|detail| PolicyError::Condition {
            tool: name.to_owned(),
            index,
            when: e.when.clone(),
            detail,
        })?;
        let tier = Tier::parse(&e.tier, &field(&format!("escalate[{index}].tier")))?;
        escalate.push(Escalation { when, tier });
    }
    let untrusted_output = match raw.output.as_deref() {
        None | Some("trusted") => false,
        Some("untrusted") => true,
        Some(other) => {
            return Err(invalid(
                &field("output"),
                format!("{other:?} is not \"trusted\" or \"untrusted\""),
            ));
        }
    };
    if let Some(scope) = &raw.scope
        && !is_scope_token(scope)
    {
        return Err(invalid(
            &field("scope"),
            format!(
                "{scope:?} is not one OAuth scope (RFC 6749 §3.3: no spaces, quotes or backslashes)"
            ),
        ));
    }
    if let Some(env) = &raw.gate_env {
        check_gate_env(&field("gate_env"), env)?;
    }
    Ok(ToolRule {
        tier,
        escalate,
        args: arg_rules(name, raw.args)?,
        gated: raw.gated.unwrap_or(false),
        gate_env: raw.gate_env,
        idempotency_key: raw.idempotency_key,
        idempotent: raw.idempotent.unwrap_or(false),
        timeout: dur(raw.timeout.as_deref(), &field("timeout"))?,
        scope: raw.scope,
        rate_limit: rate_limit(raw.rate_limit, &field("rate_limit"))?,
        untrusted_output,
        dry_run_tool: raw.dry_run_tool,
        dry_run_args: raw.dry_run_args,
        verify: raw
            .verify
            .map(|v| verify::postcondition(name, v))
            .transpose()?,
        approvers: approvers(
            raw.approvers,
            raw.approvals_required,
            &format!("tools.{name}"),
        )?,
    })
}

/// `approvers` and `approvals_required` of one table (`defaults` or `tools.NAME`): each entry
/// `user:NAME` or `group:NAME`, at least one approval required, and no more than a list of users
/// alone could ever give.
fn approvers(
    list: Option<Vec<String>>,
    required: Option<u32>,
    table: &str,
) -> Result<Option<Approvers>, PolicyError> {
    if list.is_none() && required.is_none() {
        return Ok(None);
    }
    let required = required.unwrap_or(1);
    if required == 0 {
        return Err(invalid(
            &format!("{table}.approvals_required"),
            "must be at least 1 (an approval nobody gives is not an approval)".to_owned(),
        ));
    }
    if let Some(list) = &list {
        let field = format!("{table}.approvers");
        if list.is_empty() {
            return Err(invalid(
                &field,
                "is empty: nobody could approve; block the tool instead".to_owned(),
            ));
        }
        for entry in list {
            let valid = ["user:", "group:"].iter().any(|prefix| {
                entry
                    .strip_prefix(prefix)
                    .is_some_and(|name| !name.is_empty() && !name.contains(char::is_whitespace))
            });
            if !valid {
                return Err(invalid(
                    &field,
                    format!("{entry:?} is not \"user:NAME\" or \"group:NAME\""),
                ));
            }
        }
        let users = list.iter().filter(|e| e.starts_with("user:")).count();
        let groups = list.len() - users;
        if groups == 0 && usize::try_from(required).unwrap_or(usize::MAX) > users {
            return Err(invalid(
                &format!("{table}.approvals_required"),
                format!("is {required}, but only {users} users may approve"),
            ));
        }
    }
    Ok(Some(Approvers {
        allowed: list,
        required,
    }))
}

/// A scope token per RFC 6749 §3.3: `%x21 / %x23-5B / %x5D-7E`, at least one.
fn is_scope_token(scope: &str) -> bool {
    !scope.is_empty()
        && scope
            .bytes()
            .all(|b| b == 0x21 || (0x23..=0x5B).contains(&b) || (0x5D..=0x7E).contains(&b))
}

fn rate_limit(raw: Option<RawRateLimit>, field: &str) -> Result<Option<RateLimit>, PolicyError> {
    let Some(raw) = raw else {
        return Ok(None);
    };
    let burst = NonZeroU32::new(raw.burst)
        .ok_or_else(|| invalid(&format!("{field}.burst"), "must be at least 1".to_owned()))?;
    let every = dur(Some(&raw.every), &format!("{field}.every"))?
        .ok_or_else(|| invalid(&format!("{field}.every"), "is required".to_owned()))?;
    Ok(Some(RateLimit { burst, every }))
}

fn arg_rules(
    tool: &str,
    raw: BTreeMap<String, RawArgRule>,
) -> Result<BTreeMap<String, ArgRule>, PolicyError> {
    raw.into_iter()
        .map(|(arg, rule)| {
            if let (Some(min), Some(max)) = (rule.min_len, rule.max_len)
                && min > max
            {
                return Err(PolicyError::ImpossibleRule {
                    tool: tool.to_owned(),
                    arg,
                    detail: format!("min_len {min} is greater than max_len {max}"),
                });
            }
            Ok((
                arg,
                ArgRule {
                    min_len: rule.min_len,
                    max_len: rule.max_len,
                },
            ))
        })
        .collect()
}

/// A duration as the policy writes one (`"500ms"`, `"30s"`, `"5m"`, `"1h"`, `"7d"`), for commands
/// that take one the same way.
#[must_use]
pub fn parse_duration(text: &str) -> Option<Duration> {
    raw::duration(text)
}

fn dur(text: Option<&str>, field: &str) -> Result<Option<Duration>, PolicyError> {
    text.map(|t| {
        raw::duration(t).ok_or_else(|| {
            invalid(
                field,
                format!("{t:?} is not a duration like \"30s\", \"5m\", \"1h\""),
            )
        })
    })
    .transpose()
}

/// A policy's `name`, which is also its gate prefix: letters, digits, `-` or `_`.
fn check_name(name: &str) -> Result<(), PolicyError> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    {
        return Err(invalid(
            "name",
            format!("{name:?} must be letters, digits, '-' or '_'"),
        ));
    }
    Ok(())
}

/// A gate variable named at `field`: an environment variable name.
fn check_gate_env(field: &str, env: &str) -> Result<(), PolicyError> {
    if env.is_empty() || !env.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(invalid(
            field,
            format!("{env:?} is not an environment variable name"),
        ));
    }
    Ok(())
}

fn invalid(field: &str, detail: String) -> PolicyError {
    PolicyError::Invalid {
        field: field.to_owned(),
        detail,
    }
}

fn sha256(bytes: &[u8]) -> String {
    crate::canonical::sha256_hex(bytes)
}
