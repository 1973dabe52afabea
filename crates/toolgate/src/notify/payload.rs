//! What is sent: the generic webhook's JSON and its signature, and the Slack-compatible message.
//!
//! Both are built from the approval row as stored, whose arguments and dry run were redacted when
//! the row was written: what a receiver sees is what `toolgate approvals show` shows, never more.

use std::fmt::Write as _;

use ring::hmac;
use serde_json::{Value, json};
use toolgate_core::time::rfc3339;
use toolgate_store::approval::Approval;

use super::Console;

/// The `type` of the generic webhook's body.
pub(super) const EVENT: &str = "approval.requested";

/// Slack's limits (Block Kit): a header's text, a section's text and a field's text, in characters.
const SLACK_HEADER_MAX: usize = 150;
const SLACK_SECTION_MAX: usize = 3000;
const SLACK_FIELD_MAX: usize = 2000;
/// How much of the arguments a Slack message shows; the console shows them whole.
const SLACK_ARGUMENTS_MAX: usize = 1500;

/// The generic webhook's body: one JSON object a receiver can act on without calling back.
pub(super) fn webhook(approval: &Approval, console: Option<&Console>) -> Value {
    json!({
        "type": EVENT,
        "approval_id": approval.id,
        "tool": approval.tool,
        "arguments": approval.args_redacted,
        "requester": approval.requester,
        "tier": approval.tier,
        "reason": approval.reason,
        "dry_run": approval.dry_run,
        "requested_at": rfc3339(approval.created_at),
        "expires_at": rfc3339(approval.expires_at),
        "policy_sha256": approval.policy_sha256,
        "approvers": approval.approvers,
        "approvals_required": approval.approvals_required,
        "console_url": console.map(|c| c.link(&approval.id)),
    })
}

/// `HEX(HMAC-SHA256(key, timestamp + "." + body))`: what `X-Toolgate-Signature` carries after
/// `sha256=`. The timestamp is inside the MAC so that a captured request cannot be replayed later
/// under a fresh timestamp.
pub(super) fn signature(key: &hmac::Key, timestamp: u64, body: &[u8]) -> String {
    let mut mac = hmac::Context::with_key(key);
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let tag = mac.sign();
    let mut hex = String::with_capacity(tag.as_ref().len() * 2);
    for byte in tag.as_ref() {
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// A Slack incoming-webhook message: `text` for notifications and clients without blocks, and
/// blocks with the context a person needs to decide (seed 003: reviewers who see only "refund:
/// approve?" end up rubber-stamping).
pub(super) fn slack(approval: &Approval, console: Option<&Console>) -> Value {
    let id = &approval.id;
    let tool = escape(&approval.tool);
    let requester = escape(&approval.requester);
    let tier = escape(&approval.tier);
    let expires = slack_date(approval.expires_at);
    let link = console.map(|c| format!("<{}|Review request {id}>", c.link(id)));
    let mut text =
        format!("Approval requested: `{tool}` by {requester} (tier {tier}), expires {expires}.");
    if let Some(link) = &link {
        let _ = write!(text, " {link}");
    }
    let arguments = serde_json::to_string_pretty(&approval.args_redacted).unwrap_or_default();
    let mut blocks = vec![
        json!({
            "type": "header",
            "text": {
                "type": "plain_text",
                "text": clip(&format!("Approval requested: {}", approval.tool), SLACK_HEADER_MAX),
            },
        }),
        json!({
            "type": "section",
            "fields": [
                mrkdwn(&format!("*Tool*\n`{tool}`"), SLACK_FIELD_MAX),
                mrkdwn(&format!("*Requester*\n{requester}"), SLACK_FIELD_MAX),
                mrkdwn(&format!("*Tier*\n{tier}"), SLACK_FIELD_MAX),
                mrkdwn(&format!("*Expires*\n{expires}"), SLACK_FIELD_MAX),
            ],
        }),
        json!({
            "type": "section",
            "text": mrkdwn(&format!("*Reason*\n{}", escape(&approval.reason)), SLACK_SECTION_MAX),
        }),
        json!({
            "type": "section",
            "text": mrkdwn(
                &format!(
                    "*Arguments* (redacted)\n```{}```",
                    clip(&escape(&arguments), SLACK_ARGUMENTS_MAX)
                ),
                SLACK_SECTION_MAX,
            ),
        }),
    ];
    if let Some(would) = approval.dry_run.get("would").and_then(Value::as_str) {
        blocks.push(json!({
            "type": "section",
            "text": mrkdwn(&format!("*Dry run*\n{}", escape(would)), SLACK_SECTION_MAX),
        }));
    }
    blocks.push(json!({
        "type": "section",
        "text": match &link {
            Some(link) => mrkdwn(link, SLACK_SECTION_MAX),
            None => mrkdwn(
                &format!(
                    "Decide with `toolgate approvals approve {id}` or `toolgate approvals deny {id} \
                     --reason …`"
                ),
                SLACK_SECTION_MAX,
            ),
        },
    }));
    blocks.push(json!({
        "type": "context",
        "elements": [mrkdwn(
            &format!(
                "{id} · policy {} · toolgate {}",
                approval.policy_sha256.get(..12).unwrap_or(&approval.policy_sha256),
                env!("CARGO_PKG_VERSION")
            ),
            SLACK_SECTION_MAX,
        )],
    }));
    json!({"text": text, "blocks": blocks})
}

/// A `mrkdwn` text object, clipped to Slack's limit for where it goes.
fn mrkdwn(text: &str, max: usize) -> Value {
    json!({"type": "mrkdwn", "text": clip(text, max)})
}

/// The expiry as Slack's date token, which each reader sees in their own time zone; the RFC 3339
/// form is the fallback Slack shows where it cannot format dates.
fn slack_date(ms: i64) -> String {
    format!(
        "<!date^{}^{{date_short_pretty}} at {{time}}|{}>",
        ms.div_euclid(1000),
        rfc3339(ms)
    )
}

/// Escapes the three characters Slack's `mrkdwn` gives meaning to, so that text from a caller (a
/// tool's arguments, a reason) cannot become a link, a mention or `<!channel>`.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            _ => out.push(c),
        }
    }
    out
}

/// `text` cut to `max` characters, the cut marked with `…`.
fn clip(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let mut out: String = text.chars().take(max.saturating_sub(1)).collect();
    // An entity cut in half would show as text; drop the half.
    if let Some(amp) = out.rfind('&')
        && !out[amp..].contains(';')
    {
        out.truncate(amp);
    }
    out.push('…');
    out
}
