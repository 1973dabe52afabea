//! The console's HTML, rendered on the server: every value from a request, a tool or a person is
//! escaped here, once, by [`esc`], so no path into a page skips it.
//!
//! The pages work without script; `console.js` only replaces the live region when the server
//! sends a new one and counts the time left down. Everything is in the markup a screen reader
//! reads: headings per request, labels on every field, the outcome of a decision in a
//! `role="status"` (or `role="alert"` for a refusal) region.

use std::fmt::Write as _;

use serde_json::Value;
use toolgate_core::time::rfc3339;
use toolgate_store::approval::{Approval, Status, ToolStats, Vote};

/// `text` safe inside HTML text and double- or single-quoted attributes. Carriage returns are
/// written as references too: a server-sent event's data cannot carry them.
pub(super) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            '\r' => out.push_str("&#13;"),
            c => out.push(c),
        }
    }
    out
}

/// Where the console is mounted (`""` standalone, `/console` beside an MCP endpoint).
#[derive(Clone, Debug)]
pub(super) struct Base(pub(super) String);

impl Base {
    /// The path of `rest` (which starts with `/`) under the base.
    pub(super) fn at(&self, rest: &str) -> String {
        format!("{}{rest}", self.0)
    }

    /// The console's front page: `/` standalone, the base itself when mounted (`/console`).
    pub(super) fn home(&self) -> String {
        if self.0.is_empty() {
            "/".to_owned()
        } else {
            self.0.clone()
        }
    }
}

/// A whole page: `title`, who is signed in (and the CSRF token of their sign-out form), `body`.
pub(super) fn layout(
    base: &Base,
    title: &str,
    who: Option<(&str, &str)>,
    body: &str,
    now: i64,
) -> String {
    let mut signed_in = String::new();
    if let Some((identity, csrf)) = who {
        let _ = write!(
            signed_in,
            r#"<form class="signout" method="post" action="{action}">
<span>Signed in as <strong>{identity}</strong></span>
<input type="hidden" name="csrf" value="{csrf}">
<button type="submit">Sign out</button>
</form>"#,
            action = esc(&base.at("/logout")),
            identity = esc(identity),
            csrf = esc(csrf),
        );
    }
    format!(
        r##"<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · toolgate approvals</title>
<link rel="stylesheet" href="{css}">
<script src="{js}" defer></script>
</head>
<body data-now="{now}">
<a class="skip" href="#main">Skip to content</a>
<header class="top">
<p class="brand"><a href="{home}">toolgate approvals</a></p>
{signed_in}
</header>
<main id="main">
{body}
</main>
</body>
</html>
"##,
        title = esc(title),
        css = esc(&base.at("/static/console.css")),
        js = esc(&base.at("/static/console.js")),
        home = esc(&base.home()),
    )
}

/// What the front page shows, in the live region the server re-sends when it changes.
pub(super) struct Live<'a> {
    pub(super) pending: &'a [(Approval, Vec<Vote>)],
    pub(super) decided: &'a [Approval],
    pub(super) now: i64,
}

/// The live region: pending requests, then the recently decided ones.
pub(super) fn live(base: &Base, live: &Live<'_>) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<section aria-labelledby="pending-h"><h2 id="pending-h">Waiting for a decision ({n})</h2>"#,
        n = live.pending.len()
    );
    if live.pending.is_empty() {
        out.push_str(r#"<p class="empty">Nothing is waiting for a decision.</p>"#);
    }
    for (row, votes) in live.pending {
        out.push_str(&card(base, row, votes, live.now));
    }
    out.push_str("</section>");
    let _ = write!(
        out,
        r#"<section aria-labelledby="decided-h"><h2 id="decided-h">Recently decided</h2>{}</section>"#,
        decided_table(base, live.decided, "No request has been decided yet.")
    );
    out
}

/// One pending request on the front page: enough to judge it, and the way to its page.
fn card(base: &Base, row: &Approval, votes: &[Vote], now: i64) -> String {
    let id = esc(&row.id);
    format!(
        r#"<article class="request" id="req-{id}" aria-labelledby="h-{id}">
<h3 id="h-{id}"><a href="{href}">{tool}</a> <span class="tier tier-{tier_class}">{tier}</span></h3>
<dl class="facts">
<dt>Requested by</dt><dd>{requester}</dd>
<dt>Rule</dt><dd>{rule}</dd>
<dt>Time left</dt><dd>{left}</dd>
<dt>Would</dt><dd>{would}</dd>
{needs}</dl>
<p class="args-label">Arguments (redacted)</p>
<pre class="args">{args}</pre>
<p><a class="button" href="{href}">Review and decide</a></p>
</article>
"#,
        href = esc(&base.at(&format!("/approvals/{}", row.id))),
        tool = esc(&row.tool),
        tier_class = css_name(&row.tier),
        tier = esc(&row.tier),
        requester = esc(&row.requester),
        rule = esc(&row.reason),
        left = countdown(row, now),
        would = esc(&would(&row.dry_run)),
        needs = needs(row, votes),
        args = esc(&pretty(&row.args_redacted)),
    )
}

/// The full page of one request: context, votes, the decision form while it is pending, and the
/// same requester's recent history with the same tool.
pub(super) struct Detail<'a> {
    pub(super) row: &'a Approval,
    pub(super) votes: &'a [Vote],
    pub(super) history: &'a [Approval],
    pub(super) csrf: &'a str,
    /// The outcome of the decision just posted: `(refused, message)`.
    pub(super) notice: Option<(bool, String)>,
    pub(super) now: i64,
}

pub(super) fn detail(base: &Base, detail: &Detail<'_>) -> String {
    let row = detail.row;
    let mut out = String::new();
    if let Some((refused, message)) = &detail.notice {
        let (role, class) = if *refused {
            ("alert", "notice refused")
        } else {
            ("status", "notice done")
        };
        let _ = write!(
            out,
            r#"<p class="{class}" role="{role}" id="notice">{}</p>"#,
            esc(message)
        );
    }
    let _ = write!(
        out,
        r#"<h1>{tool} <span class="tier tier-{tier_class}">{tier}</span> <span class="status status-{status}" id="status">{status}</span></h1>
<dl class="facts">
<dt>Request</dt><dd><code>{id}</code></dd>
<dt>Requested by</dt><dd>{requester}</dd>
<dt>Rule</dt><dd>{rule}</dd>
<dt>Requested at</dt><dd>{created}</dd>
<dt>{deadline_label}</dt><dd>{deadline}</dd>
{needs}{outcome}</dl>
<h2>Arguments (redacted)</h2>
<pre class="args" id="arguments">{args}</pre>
<h2>Dry run: what it would do</h2>
<pre class="args" id="dry-run">{dry_run}</pre>
<p class="policy">Policy <code>{policy}</code></p>
"#,
        tool = esc(&row.tool),
        tier_class = css_name(&row.tier),
        tier = esc(&row.tier),
        status = row.status.as_str(),
        id = esc(&row.id),
        requester = esc(&row.requester),
        rule = esc(&row.reason),
        created = esc(&rfc3339(row.created_at)),
        deadline_label = if row.status == Status::Pending {
            "Time left"
        } else {
            "Decision deadline"
        },
        deadline = if row.status == Status::Pending {
            countdown(row, detail.now)
        } else {
            esc(&rfc3339(row.expires_at))
        },
        needs = needs(row, detail.votes),
        outcome = outcome(row),
        args = esc(&pretty(&row.args_redacted)),
        dry_run = esc(&pretty(&row.dry_run)),
        policy = esc(&row.policy_sha256),
    );
    if row.status == Status::Pending {
        out.push_str(&decision_form(base, row, detail.csrf));
    }
    if !detail.votes.is_empty() {
        out.push_str("<h2>Votes</h2><ul class=\"votes\">");
        for vote in detail.votes {
            let _ = write!(
                out,
                "<li>{who} {verdict} at {at}{why}</li>",
                who = esc(&vote.decider),
                verdict = if vote.approve { "approved" } else { "denied" },
                at = esc(&rfc3339(vote.at)),
                why = vote
                    .reason
                    .as_deref()
                    .map(|r| format!(": “{}”", esc(r)))
                    .unwrap_or_default(),
            );
        }
        out.push_str("</ul>");
    }
    let _ = write!(
        out,
        r#"<h2>Recent history: {tool} for {requester}</h2>{table}"#,
        tool = esc(&row.tool),
        requester = esc(&row.requester),
        table = decided_table(
            base,
            detail.history,
            "No earlier request of this tool by this requester."
        ),
    );
    out
}

fn decision_form(base: &Base, row: &Approval, csrf: &str) -> String {
    format!(
        r#"<form class="decide" method="post" action="{action}">
<h2>Decide</h2>
<input type="hidden" name="csrf" value="{csrf}">
<label for="reason">Reason (required to deny; the caller and the audit log see it)</label>
<textarea id="reason" name="reason" rows="3" maxlength="500"></textarea>
<div class="buttons">
<button type="submit" name="verdict" value="approve" class="approve" id="approve">Approve: run it once</button>
<button type="submit" name="verdict" value="deny" class="deny" id="deny">Deny</button>
</div>
<p class="hint">Denying tells the caller not to retry. Approving runs exactly this call, with these arguments, once.</p>
</form>
"#,
        action = esc(&base.at(&format!("/approvals/{}", row.id))),
        csrf = esc(csrf),
    )
}

/// Who decided, when and why, for a request that is no longer pending.
fn outcome(row: &Approval) -> String {
    match row.status {
        Status::Pending => String::new(),
        Status::Expired => "<dt>Outcome</dt><dd>Expired: nobody decided in time, so the call was denied</dd>".to_owned(),
        Status::Approved | Status::Denied => format!(
            "<dt>Decided by</dt><dd id=\"decided-by\">{by}</dd><dt>Decided at</dt><dd>{at}</dd><dt>Why</dt><dd>{why}</dd>{used}",
            by = esc(row.decided_by.as_deref().unwrap_or("")),
            at = esc(&row.decided_at.map(rfc3339).unwrap_or_default()),
            why = esc(row.decision_reason.as_deref().unwrap_or("(no reason given)")),
            used = match (row.status, row.used_at) {
                (Status::Approved, Some(at)) => format!("<dt>Ran</dt><dd>{}</dd>", esc(&rfc3339(at))),
                (Status::Approved, None) => "<dt>Ran</dt><dd>not yet: it runs when its caller asks again, or at once if it is waiting</dd>".to_owned(),
                _ => String::new(),
            },
        ),
    }
}

/// The ended requests as a table: tool, requester, outcome, who, when, why.
fn decided_table(base: &Base, rows: &[Approval], empty: &str) -> String {
    if rows.is_empty() {
        return format!(r#"<p class="empty">{}</p>"#, esc(empty));
    }
    let mut out = String::from(
        r#"<div class="table"><table><thead><tr><th scope="col">Request</th><th scope="col">Requested by</th><th scope="col">Outcome</th><th scope="col">By</th><th scope="col">When</th><th scope="col">Why</th></tr></thead><tbody>"#,
    );
    for row in rows {
        let when = row.decided_at.unwrap_or(row.expires_at);
        let _ = write!(
            out,
            r#"<tr><td><a href="{href}">{tool}</a></td><td>{requester}</td><td><span class="status status-{status}">{status}</span></td><td>{by}</td><td>{when}</td><td>{why}</td></tr>"#,
            href = esc(&base.at(&format!("/approvals/{}", row.id))),
            tool = esc(&row.tool),
            requester = esc(&row.requester),
            status = row.status.as_str(),
            by = esc(row.decided_by.as_deref().unwrap_or("nobody")),
            when = esc(&rfc3339(when)),
            why = esc(row.decision_reason.as_deref().unwrap_or("")),
        );
    }
    out.push_str("</tbody></table></div>");
    out
}

/// The approval-fatigue table: per tool, how requests ended over the window.
pub(super) fn fatigue(
    stats: &[ToolStats],
    threshold: f64,
    min_decided: u64,
    window: &str,
) -> String {
    let mut out = format!(
        r#"<section aria-labelledby="fatigue-h"><h2 id="fatigue-h">How requests ended, last {}</h2>"#,
        esc(window)
    );
    if stats.is_empty() {
        out.push_str(r#"<p class="empty">No approval requests in this window.</p></section>"#);
        return out;
    }
    out.push_str(
        r#"<div class="table"><table><thead><tr><th scope="col">Tool</th><th scope="col">Approved</th><th scope="col">Denied</th><th scope="col">Expired</th><th scope="col">Pending</th><th scope="col">Approved share</th></tr></thead><tbody>"#,
    );
    for tool in stats {
        let fatigued = tool.decided() >= min_decided && tool.approval_rate() >= threshold;
        let _ = write!(
            out,
            r#"<tr{class}><td>{name}</td><td>{a}</td><td>{d}</td><td>{e}</td><td>{p}</td><td>{rate:.0}%{flag}</td></tr>"#,
            class = if fatigued { r#" class="fatigue""# } else { "" },
            name = esc(&tool.tool),
            a = tool.approved,
            d = tool.denied,
            e = tool.expired,
            p = tool.pending,
            rate = tool.approval_rate() * 100.0,
            flag = if fatigued {
                r#" <strong class="flag">approved nearly always: look closer, or change its tier</strong>"#
            } else {
                ""
            },
        );
    }
    out.push_str("</tbody></table></div></section>");
    out
}

/// The sign-in page: what to do to get in; `provider` is the identity provider's button (where
/// it starts, and the issuer it names).
pub(super) fn login(message: Option<&str>, provider: Option<(&str, &str)>) -> String {
    let notice = message
        .map(|m| {
            format!(
                r#"<p class="notice refused" role="alert" id="notice">{}</p>"#,
                esc(m)
            )
        })
        .unwrap_or_default();
    let button = provider
        .map(|(start, issuer)| {
            format!(
                r#"<p><a class="button" id="oidc" href="{}">Sign in with your identity provider</a> <span class="hint">({})</span></p>"#,
                esc(start),
                esc(issuer)
            )
        })
        .unwrap_or_default();
    format!(
        r#"<h1>Sign in</h1>
{notice}
{button}
<p>Or open the login link that <code>toolgate console</code> printed when it started. Each link works once; for another one, run <code>toolgate console link --data DIR</code> on the machine that holds the data directory.</p>
"#
    )
}

/// A page that only says something (not found, store unavailable).
pub(super) fn message(heading: &str, text: &str) -> String {
    format!("<h1>{}</h1><p>{}</p>", esc(heading), esc(text))
}

/// The time left before `row` expires, as a `<time>` the script counts down.
fn countdown(row: &Approval, now: i64) -> String {
    let left = (row.expires_at - now).max(0) / 1000;
    format!(
        r#"<time class="countdown" datetime="{at}" data-expires="{ms}">{m}m {s:02}s</time>"#,
        at = esc(&rfc3339(row.expires_at)),
        ms = row.expires_at,
        m = left / 60,
        s = left % 60,
    )
}

/// Who may decide and how many must, with the votes so far; nothing for one decider of any name.
fn needs(row: &Approval, votes: &[Vote]) -> String {
    let who = match (&row.approvers, row.approvals_required) {
        (None, 1) => return String::new(),
        (None, n) => format!("{n} distinct approvers"),
        (Some(list), n) => format!("{n} of {}", list.join(", ")),
    };
    let approvals: Vec<&str> = votes
        .iter()
        .filter(|v| v.approve)
        .map(|v| v.decider.as_str())
        .collect();
    let so_far = if approvals.is_empty() {
        String::new()
    } else {
        format!("; approved so far by {}", approvals.join(", "))
    };
    format!("<dt>Needs</dt><dd>{}{}</dd>", esc(&who), esc(&so_far))
}

fn would(dry_run: &Value) -> String {
    dry_run
        .get("would")
        .and_then(Value::as_str)
        .map_or_else(|| "(the tool gives no dry run)".to_owned(), str::to_owned)
}

fn pretty(value: &Value) -> String {
    serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
}

/// A tier as a class name: letters and digits only (a policy names tiers, but never trust it
/// into an attribute unchecked).
fn css_name(tier: &str) -> String {
    tier.chars().filter(char::is_ascii_alphanumeric).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_markup_character_is_escaped() {
        assert_eq!(
            esc("<script>alert('x')</script>&\"\r"),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;&amp;&quot;&#13;"
        );
        assert_eq!(css_name("high\" onmouseover=x"), "highonmouseoverx");
    }
}
