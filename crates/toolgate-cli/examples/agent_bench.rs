//! What the gate costs an agent per step, for docs/performance.md (issue 13).
//!
//! `cargo run --release -p toolgate-cli --example agent_bench [-- --calls N --rounds R --dir DIR]`
//!
//! One process, one data directory (default: a temp dir under ./target, the disk the other
//! figures use), the orders toolset and the demo policy; `lookup_order` (low tier) every time.
//! Measured in the same run, rounds interleaved, medians printed:
//! - **direct**: the toolset's handler called in-process, no gate (the baseline);
//! - **corridor**: the same call through `toolgate::corridor::call` as an MCP client's call walks
//!   it (kill switch, visibility, schema, decision, audit record synced before the answer);
//! - **corridor + key**: the same with the agent's per-call idempotency key (claimed and settled
//!   in SQLite around the call);
//! - **agent step**: a whole step of `toolgate agent` with the scripted model: the model's turn,
//!   the run saved, the call through the corridor with its key, its answer saved; runs of 8 steps
//!   (the default `max_steps`), their start and final answer included.

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use toolgate::agent::scripted::Scripted;
use toolgate::agent::{Agent, EventLog, Settings};
use toolgate::corridor::{self, Request};
use toolgate::server::Gate;
use toolgate::toolset::{Call, Toolset};
use toolgate_core::policy::Policy;
use toolgate_core::principal::Principal;
use toolgate_store::journal::Durability;

const POLICY: &str = include_str!("../../../policies/orders.toml");

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn dir_arg() -> std::path::PathBuf {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == "--dir")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from("target"))
}

fn lookup() -> Map<String, Value> {
    json!({"order_id": "ord_1001"})
        .as_object()
        .cloned()
        .unwrap_or_default()
}

/// Microseconds per call of `n` direct handler calls.
async fn direct(gate: &Gate, toolset: &dyn Toolset, n: usize) -> f64 {
    let digest = toolgate_core::canonical::digest_object(&lookup());
    let started = Instant::now();
    for _ in 0..n {
        let call = Call {
            gate,
            name: "lookup_order",
            arguments: lookup(),
            args_digest: &digest,
            principal: gate.principal(),
            rule: "bench",
            ct: CancellationToken::new(),
            caller: None,
            progress_token: None,
        };
        let result = toolset.call(call).await.expect("lookup_order");
        assert_ne!(result.is_error, Some(true));
    }
    started.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// Microseconds per call of `n` calls through the corridor, keyed per call when `keyed`.
async fn through(gate: &Gate, toolset: &dyn Toolset, n: usize, keyed: bool, round: usize) -> f64 {
    let started = Instant::now();
    for i in 0..n {
        let outcome = corridor::call(
            gate,
            toolset,
            Request {
                name: "lookup_order".to_owned(),
                arguments: lookup(),
                key: keyed.then(|| format!("bench:{round}:{i}")),
                approvals_closed: None,
                ct: CancellationToken::new(),
            },
        )
        .await;
        assert_eq!(outcome.kind, toolgate_core::answer::Kind::Ran);
    }
    started.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// Model turns per agent run: the default `max_steps`, what a real run is bounded by.
const STEPS_PER_RUN: usize = 8;

/// Microseconds per step of agent runs of [`STEPS_PER_RUN`] lookup steps, about `n` steps in all.
async fn agent_steps(
    gate: &Gate,
    toolset: Arc<dyn Toolset>,
    dir: &std::path::Path,
    n: usize,
) -> f64 {
    let runs = n.div_ceil(STEPS_PER_RUN);
    let mut total = 0.0;
    for _ in 0..runs {
        total += agent_run(gate, toolset.clone(), dir, STEPS_PER_RUN).await;
    }
    total / (runs * STEPS_PER_RUN) as f64
}

/// Microseconds for one agent run of `n` lookup steps (its final turn included).
async fn agent_run(gate: &Gate, toolset: Arc<dyn Toolset>, dir: &std::path::Path, n: usize) -> f64 {
    let steps: Vec<Value> = (0..n)
        .map(|_| json!({"name": "lookup_order", "arguments": {"order_id": "ord_1001"}}))
        .collect();
    let plan = Scripted::from_json(&json!({"steps": steps}).to_string()).expect("plan");
    let settings = Settings {
        max_steps: u32::try_from(n + 1).unwrap_or(u32::MAX),
        ..Settings::default()
    };
    let agent = Agent::new(
        gate.clone(),
        toolset,
        Arc::new(plan),
        dir,
        EventLog::new(std::io::sink()),
    )
    .expect("agent")
    .with_settings(settings);
    let started = Instant::now();
    let report = agent.start("bench").await.expect("run");
    assert!(matches!(
        report.ending,
        toolgate::agent::Ending::Finished(_)
    ));
    started.elapsed().as_secs_f64() * 1e6
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let calls = arg("--calls", 300);
    let rounds = arg("--rounds", 5);
    let parent = dir_arg();
    std::fs::create_dir_all(&parent).expect("dir");
    let scratch = tempfile::Builder::new()
        .prefix("agent-bench-")
        .tempdir_in(&parent)
        .expect("temp dir");
    let data = scratch.path();
    let policy = Policy::from_bytes(POLICY.as_bytes()).expect("policy");
    let gate = Gate::open(policy, data, Durability::Synced)
        .await
        .expect("gate")
        .with_principal(Principal::new("agent:bench"));
    let toolset: Arc<dyn Toolset> = Arc::from(
        toolgate_demos::by_name("orders", data, &toolgate_demos::Options::default())
            .expect("orders"),
    );
    let (mut d, mut c, mut k, mut a) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        d.push(direct(&gate, toolset.as_ref(), calls).await);
        c.push(through(&gate, toolset.as_ref(), calls, false, round).await);
        k.push(through(&gate, toolset.as_ref(), calls, true, round).await);
        a.push(agent_steps(&gate, toolset.clone(), data, calls).await);
    }
    let (d, c, k, a) = (median(d), median(c), median(k), median(a));
    let mut out = std::io::stdout().lock();
    let line = |name: &str, value: f64| {
        format!(
            "  {name:<24}{value:>9.1} µs   {:.2}×   (+{:.1} µs)",
            value / d,
            value - d
        )
    };
    let report = [
        format!(
            "agent_bench: {calls} calls per round, {rounds} rounds, medians, µs per call or step"
        ),
        line("direct handler", d),
        line("corridor", c),
        line("corridor + per-call key", k),
        line("agent step (scripted)", a),
    ];
    for text in report {
        writeln!(out, "{text}").expect("stdout");
    }
}
