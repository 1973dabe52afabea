//! Policy decision latency and approval store throughput, for docs/performance.md.
//!
//! `cargo run --release -p toolgate-cli --example decide_bench [-- --dir DIR]`
//!
//! Decision: a 100-tool policy where every tool has a CEL escalation rule; each sample is one
//! `Policy::assess` + `Policy::decide` for a call with a few arguments, timed one by one (the clock
//! costs ~20 ns here); prints p50 / p99 / mean. A baseline in the same run: the same tool lookup
//! with no escalation rule, so the cost of CEL is visible on its own.
//!
//! Approvals: open -> decide -> consume cycles against a real SQLite file in DIR (default: a temp
//! dir under ./target, the same disk as the benchmark script's other figures), sequentially, and
//! the kill-switch read that every call makes.

use std::io::Write;
use std::time::Instant;

use serde_json::{Map, Value, json};
use toolgate_core::policy::Policy;
use toolgate_core::principal::Principal;
use toolgate_store::approval::{ApprovalStore, NewApproval, Verdict};
use toolgate_store::state::StateStore;

fn policy_text(tools: usize) -> String {
    let mut text = String::from("version = 2\nname = \"bench\"\n[defaults]\ntier = \"blocked\"\n");
    for i in 0..tools {
        text.push_str(&format!(
            "[tools.tool_{i}]\ntier = \"medium\"\nescalate = [{{ when = \"args.amount > {i} && args.to.endsWith('@example.com')\", tier = \"high\" }}]\n"
        ));
    }
    text.push_str("[tools.plain]\ntier = \"low\"\n");
    text
}

fn percentiles(mut samples: Vec<u128>) -> (f64, f64, f64) {
    samples.sort_unstable();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    let mean = samples.iter().sum::<u128>() as f64 / samples.len() as f64 / 1000.0;
    (at(0.5), at(0.99), mean)
}

fn time_decisions(
    policy: &Policy,
    tool: &str,
    args: &Map<String, Value>,
    n: usize,
) -> (f64, f64, f64) {
    let principal = Principal::new("local:bench");
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let assessment = policy.assess(tool, args, &principal);
        let verdict = policy.decide(tool, &assessment, false);
        std::hint::black_box(verdict);
        samples.push(start.elapsed().as_nanos());
    }
    percentiles(samples)
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis(),
    )
    .unwrap_or(i64::MAX)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let policy = Policy::from_bytes(policy_text(100).as_bytes())?;
    let args = json!({"amount": 49.5, "to": "ops@example.com", "order_id": "ord_1001"})
        .as_object()
        .cloned()
        .unwrap_or_default();
    // Warm up, then measure.
    time_decisions(&policy, "tool_50", &args, 10_000);
    let (p50, p99, mean) = time_decisions(&policy, "tool_50", &args, 100_000);
    let (b50, b99, bmean) = time_decisions(&policy, "plain", &args, 100_000);
    writeln!(
        out,
        "{}",
        json!({"figure": "decision", "tools": 101, "p50_us": p50, "p99_us": p99, "mean_us": mean, "baseline_no_cel_p50_us": b50, "baseline_no_cel_p99_us": b99, "baseline_no_cel_mean_us": bmean})
    )?;

    let base = std::env::args()
        .skip_while(|a| a != "--dir")
        .nth(1)
        .map_or_else(
            || std::path::PathBuf::from("target"),
            std::path::PathBuf::from,
        );
    std::fs::create_dir_all(&base)?;
    let dir = tempfile::tempdir_in(&base)?;
    let store = ApprovalStore::open(dir.path()).await?;
    let state = StateStore::open(dir.path()).await?;
    let n = 500;
    let start = Instant::now();
    for i in 0..n {
        let now = now_ms();
        let new = NewApproval {
            fingerprint: format!("fp-{i}"),
            requester: "local:bench".to_owned(),
            tool: "refund".to_owned(),
            args_redacted: json!({"amount": i}),
            tier: "high".to_owned(),
            reason: "bench".to_owned(),
            dry_run: json!({"would": "bench"}),
            policy_sha256: "0".repeat(64),
            expires_at: now + 60_000,
            approvers: None,
            approvals_required: 1,
        };
        let (row, _) = store.request(new, now).await?;
        store
            .decide(&row.id, "human:bench", Verdict::Approve, None, now)
            .await?;
        anyhow::ensure!(store.consume(&row.id, now).await?, "consume failed");
    }
    let cycle = start.elapsed();
    let reads = 5_000;
    let start = Instant::now();
    for _ in 0..reads {
        std::hint::black_box(state.killswitch().await?);
    }
    let read = start.elapsed();
    writeln!(
        out,
        "{}",
        json!({
            "figure": "approval_store",
            "cycles": n,
            "cycles_per_s": n as f64 / cycle.as_secs_f64(),
            "ops_per_s": 3.0 * n as f64 / cycle.as_secs_f64(),
            "killswitch_reads_per_s": reads as f64 / read.as_secs_f64(),
            "killswitch_read_us": read.as_secs_f64() * 1e6 / reads as f64,
        })
    )?;
    Ok(())
}
