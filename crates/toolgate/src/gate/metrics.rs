//! What the gate counts for Prometheus: every call's answer by tool, decision and outcome, how long
//! calls and audit appends take, and, read when scraped, the approval queue, unresolved idempotency
//! keys, the kill switch, the journal and readiness. Rendered in the Prometheus text format (version 0.0.4) by
//! [`Gate::metrics_text`]; the CLI serves it on an opt-in local port (`--metrics ADDR`).
//!
//! Design decisions: counted in the gate, shared by every clone of it (as the rate limits are), so
//! kit servers, the gateway and the agent count the same way; two short locks per call, taken after
//! the answer is recorded, each held for a few map updates only: one for the step times (gathered
//! on the call's own [`Laps`] and written when they are dropped), one for the call's count and
//! duration. A tool seen before costs no allocation. A tool label is only ever a tool of the
//! catalog: any other name a caller sent is counted as `(unknown)`, so a caller cannot grow the
//! series without bound, and a hidden tool's name never reaches a scrape unless it is served.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use toolgate_core::audit::{Decision, Outcome};

use super::Gate;

/// Upper bounds of the latency buckets, in seconds (a call through the gate takes from tens of
/// microseconds to the seconds an upstream or a person takes).
const BOUNDS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0,
];

/// The label of a call to a tool that is not in the catalog.
pub(crate) const UNKNOWN_TOOL: &str = "(unknown)";

/// Counters since start; cheap to share.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Per tool: answers by decision and outcome, and the calls' durations.
    calls: Mutex<BTreeMap<String, PerTool>>,
    /// Per corridor step, whatever the tool (steps are few and fixed).
    steps: Mutex<BTreeMap<&'static str, Histogram>>,
    audit_append: Mutex<Histogram>,
    /// Policy reloads put in force, and refused.
    reloads: [std::sync::atomic::AtomicU64; 2],
}

#[derive(Debug, Default)]
struct PerTool {
    answers: BTreeMap<(&'static str, &'static str), u64>,
    duration: Histogram,
}

/// Most laps one [`Laps`] holds before it writes them out (a walk of the corridor has twelve).
const LAPS: usize = 16;

/// Times the corridor's steps one after another: each [`Laps::time`] records the time since the
/// previous one (or since the laps began) under its step's name. The laps are kept here and
/// written to the metrics in one go when the `Laps` is dropped, so that timing a call's steps
/// takes the metrics' lock once, not once a step.
pub(crate) struct Laps<'m> {
    metrics: &'m Metrics,
    last: Instant,
    laps: [(&'static str, Duration); LAPS],
    len: usize,
}

impl Laps<'_> {
    /// Records `step` as taking the time since the last lap, and hands `value` (what the step
    /// returned, evaluated before this call) back.
    pub(crate) fn time<T>(&mut self, step: &'static str, value: T) -> T {
        self.lap(step);
        value
    }

    /// Records `step` as taking the time since the last lap (a step that returns nothing).
    pub(crate) fn lap(&mut self, step: &'static str) {
        if self.len == LAPS {
            self.flush();
        }
        let now = Instant::now();
        self.laps[self.len] = (step, now.duration_since(self.last));
        self.len += 1;
        self.last = now;
    }

    fn flush(&mut self) {
        if self.len == 0 {
            return;
        }
        let mut steps = crate::lock(&self.metrics.steps);
        for (step, took) in &self.laps[..self.len] {
            steps.entry(step).or_default().observe(*took);
        }
        self.len = 0;
    }
}

impl Drop for Laps<'_> {
    fn drop(&mut self) {
        self.flush();
    }
}

#[derive(Clone, Debug, Default)]
struct Histogram {
    /// Observations at or under each of [`BOUNDS`] (not cumulative; summed when rendered).
    buckets: [u64; BOUNDS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, took: Duration) {
        let seconds = took.as_secs_f64();
        if let Some(i) = BOUNDS.iter().position(|&bound| seconds <= bound) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        let sep = if labels.is_empty() { "" } else { "," };
        for (bound, n) in BOUNDS.iter().zip(self.buckets) {
            cumulative += n;
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}",
            self.count
        );
        let labels = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{labels} {}", self.sum);
        let _ = writeln!(out, "{name}_count{labels} {}", self.count);
    }
}

impl Metrics {
    /// One call answered: its tool (a catalog name, or [`UNKNOWN_TOOL`]), what was decided, its
    /// outcome, and how long the corridor took from the call's arrival to its answer.
    pub(crate) fn call(&self, tool: &str, decision: Decision, outcome: Outcome, took: Duration) {
        let mut calls = crate::lock(&self.calls);
        let per_tool = match calls.get_mut(tool) {
            Some(per_tool) => per_tool,
            None => calls.entry(tool.to_owned()).or_default(),
        };
        *per_tool
            .answers
            .entry((decision.as_str(), outcome.as_str()))
            .or_default() += 1;
        per_tool.duration.observe(took);
    }

    /// Laps for one call's steps, starting now.
    pub(crate) fn laps(&self) -> Laps<'_> {
        Laps {
            metrics: self,
            last: Instant::now(),
            laps: [("", Duration::ZERO); LAPS],
            len: 0,
        }
    }

    /// One audit record appended (durably, under the journal's durability), and how long it took.
    pub(crate) fn audit_append(&self, took: Duration) {
        crate::lock(&self.audit_append).observe(took);
    }

    /// One policy reload: put in force, or refused (the old policy stayed).
    pub(crate) fn policy_reload(&self, loaded: bool) {
        self.reloads[usize::from(!loaded)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    fn render_counted(&self, out: &mut String) {
        header(
            out,
            "toolgate_calls_total",
            "counter",
            "Tool calls answered, by tool, decision and outcome.",
        );
        let calls = crate::lock(&self.calls);
        for (tool, per_tool) in calls.iter() {
            for ((decision, outcome), n) in &per_tool.answers {
                let _ = writeln!(
                    out,
                    "toolgate_calls_total{{tool=\"{}\",decision=\"{decision}\",outcome=\"{outcome}\"}} {n}",
                    escape(tool)
                );
            }
        }
        header(
            out,
            "toolgate_call_duration_seconds",
            "histogram",
            "Time from a call's arrival to its answer, through every step of the gate.",
        );
        for (tool, per_tool) in calls.iter() {
            let labels = format!("tool=\"{}\"", escape(tool));
            per_tool
                .duration
                .render(out, "toolgate_call_duration_seconds", &labels);
        }
        drop(calls);
        header(
            out,
            "toolgate_step_duration_seconds",
            "histogram",
            "Time each step of the gate took (kill_switch, visibility, rate_limit, schema, decide, approve, claim, run, settle, clean, audit, verify); a call that ends at a step is timed up to it.",
        );
        for (step, histogram) in crate::lock(&self.steps).iter() {
            histogram.render(
                out,
                "toolgate_step_duration_seconds",
                &format!("step=\"{step}\""),
            );
        }
        header(
            out,
            "toolgate_audit_append_seconds",
            "histogram",
            "Time to append one audit record, written as the journal's durability says.",
        );
        let audit = crate::lock(&self.audit_append).clone();
        audit.render(out, "toolgate_audit_append_seconds", "");
    }
}

/// The series of the upstreams a gateway forwards to, given as names and whether each is
/// connected now (the toolset knows them; this module only spells them).
#[must_use]
pub fn upstream_series(upstreams: &[(String, bool)]) -> String {
    let mut out = String::new();
    if upstreams.is_empty() {
        return out;
    }
    header(
        &mut out,
        "toolgate_upstream_up",
        "gauge",
        "1 while the gateway is connected to the upstream.",
    );
    for (name, up) in upstreams {
        let _ = writeln!(
            out,
            "toolgate_upstream_up{{upstream=\"{}\"}} {}",
            escape(name),
            u8::from(*up)
        );
    }
    out
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value as the text format spells it.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Gate {
    /// The counters since start and, read now, the approval queue, the kill switch, the journal
    /// and readiness, in the Prometheus text format. A store that cannot answer leaves its series
    /// out (and `toolgate_ready` at 0); it never reports a zero it did not read.
    pub async fn metrics_text(&self) -> String {
        let mut out = String::new();
        self.metrics.render_counted(&mut out);

        let stats = self.journal.stats();
        header(
            &mut out,
            "toolgate_audit_records_total",
            "counter",
            "Audit records committed since start.",
        );
        let _ = writeln!(out, "toolgate_audit_records_total {}", stats.records);
        header(
            &mut out,
            "toolgate_audit_syncs_total",
            "counter",
            "fdatasync calls of the journal since start.",
        );
        let _ = writeln!(out, "toolgate_audit_syncs_total {}", stats.syncs);

        if let Some(approvals) = &self.approvals {
            let now = toolgate_core::time::now_ms();
            match approvals.counts(now).await {
                Ok(counts) => {
                    header(
                        &mut out,
                        "toolgate_approvals",
                        "gauge",
                        "Approval requests in the queue, by status (pending past expiry counts as expired).",
                    );
                    for (status, n) in [
                        ("pending", counts.pending),
                        ("approved", counts.approved),
                        ("denied", counts.denied),
                        ("expired", counts.expired),
                    ] {
                        let _ = writeln!(out, "toolgate_approvals{{status=\"{status}\"}} {n}");
                    }
                }
                Err(error) => tracing::warn!(error = %error, "metrics: approvals not counted"),
            }
        }
        if let Some(keys) = &self.idempotency {
            match keys
                .unresolved_counts(&self.owner, toolgate_core::time::now_ms())
                .await
            {
                Ok((running, doubt)) => {
                    header(
                        &mut out,
                        "toolgate_idempotency_keys",
                        "gauge",
                        "Idempotency keys without an outcome: in flight in this process, or in doubt (marked so, or cut off by a crash) for an operator to check.",
                    );
                    let _ = writeln!(
                        out,
                        "toolgate_idempotency_keys{{state=\"in_flight\"}} {running}"
                    );
                    let _ = writeln!(
                        out,
                        "toolgate_idempotency_keys{{state=\"in_doubt\"}} {doubt}"
                    );
                }
                Err(error) => {
                    tracing::warn!(error = %error, "metrics: idempotency keys not counted")
                }
            }
        }
        if let Some(state) = &self.state {
            match state.killswitch_on().await {
                Ok(on) => {
                    header(
                        &mut out,
                        "toolgate_killswitch_on",
                        "gauge",
                        "1 while the kill switch for every caller is on.",
                    );
                    let _ = writeln!(out, "toolgate_killswitch_on {}", u8::from(on));
                }
                Err(error) => tracing::warn!(error = %error, "metrics: kill switch not read"),
            }
        }
        let ready = self.readiness(Duration::from_secs(2)).await.ready();
        header(
            &mut out,
            "toolgate_ready",
            "gauge",
            "1 when the gate can decide a call now (see /readyz).",
        );
        let _ = writeln!(out, "toolgate_ready {}", u8::from(ready));
        header(
            &mut out,
            "toolgate_policy_info",
            "gauge",
            "The policy in force, by its SHA-256.",
        );
        let _ = writeln!(
            out,
            "toolgate_policy_info{{sha256=\"{}\"}} 1",
            self.current().policy().sha256()
        );
        header(
            &mut out,
            "toolgate_policy_reloads_total",
            "counter",
            "Policy reloads since start: loaded (in force for calls after it) or refused (the file did not load or fit the tools; the old policy stayed).",
        );
        for (result, n) in ["loaded", "refused"].iter().zip(&self.metrics.reloads) {
            let n = n.load(std::sync::atomic::Ordering::Relaxed);
            let _ = writeln!(
                out,
                "toolgate_policy_reloads_total{{result=\"{result}\"}} {n}"
            );
        }
        let verifies = self.verify_counts();
        if !verifies.is_empty() {
            header(
                &mut out,
                "toolgate_verify_total",
                "counter",
                "Postconditions checked after a call, by tool and decision (continue, stop, rollback).",
            );
            for ((tool, decision), n) in verifies {
                let _ = writeln!(
                    out,
                    "toolgate_verify_total{{tool=\"{}\",decision=\"{}\"}} {n}",
                    escape(&tool),
                    decision.as_str()
                );
            }
        }
        out
    }
}
