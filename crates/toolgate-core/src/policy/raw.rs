//! The policy files as written: version 1 (the seed's JSON) and version 2 (TOML), before validation.
//! Unknown fields are errors in both, so a typo is a start-up failure rather than a rule that is
//! silently not there.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

/// Version 1, the seed's `policy.json`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawV1 {
    pub(super) version: Value,
    #[serde(default)]
    pub(super) allow: Vec<String>,
    #[serde(default)]
    pub(super) deny: Vec<String>,
    #[serde(default)]
    pub(super) arg_rules: BTreeMap<String, BTreeMap<String, RawArgRule>>,
}

/// Version 2, TOML (DESIGN.md §3).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawV2 {
    pub(super) version: i64,
    pub(super) name: Option<String>,
    #[serde(default)]
    pub(super) defaults: RawDefaults,
    #[serde(default)]
    pub(super) tools: BTreeMap<String, RawTool>,
    #[serde(default)]
    pub(super) passthrough: RawPassthrough,
}

/// Gateway: upstream prompts and resources allowed through, by name and URI, and the upstreams
/// whose requests of the caller (sampling, elicitation, roots) and whose tasks pass; `None` is the
/// default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPassthrough {
    #[serde(default)]
    pub(super) prompts: Vec<String>,
    #[serde(default)]
    pub(super) resources: Vec<String>,
    pub(super) sampling: Option<Vec<String>>,
    pub(super) elicitation: Option<Vec<String>>,
    pub(super) roots: Option<Vec<String>>,
    pub(super) tasks: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDefaults {
    pub(super) tier: Option<String>,
    pub(super) approval_ttl: Option<String>,
    pub(super) approval_wait: Option<String>,
    pub(super) medium_budget: Option<u32>,
    pub(super) medium_window: Option<String>,
    pub(super) timeout: Option<String>,
    pub(super) rate_limit: Option<RawRateLimit>,
    pub(super) approvers: Option<Vec<String>>,
    pub(super) approvals_required: Option<u32>,
    pub(super) approval_fatigue: Option<f64>,
}

/// `{ burst = 20, every = "2s" }`: a call may use one of `burst` saved tokens; one comes back
/// every `every`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRateLimit {
    pub(super) burst: u32,
    pub(super) every: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTool {
    pub(super) tier: Option<String>,
    #[serde(default)]
    pub(super) escalate: Vec<RawEscalation>,
    #[serde(default)]
    pub(super) args: BTreeMap<String, RawArgRule>,
    pub(super) gated: Option<bool>,
    pub(super) gate_env: Option<String>,
    pub(super) idempotency_key: Option<String>,
    pub(super) idempotent: Option<bool>,
    pub(super) timeout: Option<String>,
    pub(super) scope: Option<String>,
    pub(super) rate_limit: Option<RawRateLimit>,
    pub(super) output: Option<String>,
    pub(super) approvers: Option<Vec<String>>,
    pub(super) approvals_required: Option<u32>,
    pub(super) dry_run_tool: Option<String>,
    #[serde(default)]
    pub(super) dry_run_args: serde_json::Map<String, Value>,
    pub(super) verify: Option<RawVerify>,
}

/// `[tools.NAME.verify]`: the read that checks a mutation, and what to do when it does not hold.
/// Every argument value is a CEL expression over `args` (the call's arguments), kept as text here.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVerify {
    pub(super) read: String,
    #[serde(default)]
    pub(super) args: BTreeMap<String, String>,
    pub(super) expect: String,
    pub(super) rollback: Option<String>,
    #[serde(default)]
    pub(super) rollback_args: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEscalation {
    pub(super) when: String,
    pub(super) tier: String,
}

/// Bounds on one string argument, in characters (Python's `len`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(super) struct RawArgRule {
    pub(super) min_len: Option<usize>,
    pub(super) max_len: Option<usize>,
}

/// `"500ms"`, `"30s"`, `"5m"`, `"1h"`, `"2d"`: a positive whole number and a unit.
pub(super) fn duration(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let number: u64 = number.parse().ok()?;
    let millis = match unit {
        "ms" => number,
        "s" => number.checked_mul(1_000)?,
        "m" => number.checked_mul(60_000)?,
        "h" => number.checked_mul(3_600_000)?,
        "d" => number.checked_mul(86_400_000)?,
        _ => return None,
    };
    (millis > 0).then(|| Duration::from_millis(millis))
}
