//! Audit append latency and throughput: the local journal (`audit.jsonl`, synced) beside the
//! central ledger (PostgreSQL), in one process and one run, for docs/performance.md (issue 15).
//!
//! `cargo run --release -p toolgate-cli --example ledger_bench -- --store URL [--dir DIR]
//!  [--records N] [--concurrency "1 16 64"]`
//!
//! For each concurrency level C and each sink, C tasks append N/C records each (the record a
//! `tools/call` writes), one after another, timing every append from the call to its durable
//! answer. Prints one JSON line per sink and level: records/s, p50, p99 (µs). The two sinks take
//! turns at each level on the same machine; the journal's directory is DIR (default: a temporary
//! directory under ./target, the disk the other figures use), the ledger a fresh schema of URL.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use toolgate_core::audit::{Decision, Event, Outcome};
use toolgate_store::Location;
use toolgate_store::approval::ApprovalStore;
use toolgate_store::journal::{Durability, Journal};
use toolgate_store::ledger::Ledger;

struct Args {
    store: String,
    dir: Option<std::path::PathBuf>,
    records: usize,
    levels: Vec<usize>,
}

fn args() -> Args {
    let mut out = Args {
        store: String::new(),
        dir: None,
        records: 20_000,
        levels: vec![1, 16, 64],
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--store" => out.store = value,
            "--dir" => out.dir = Some(value.into()),
            "--records" => out.records = value.parse().expect("--records N"),
            "--concurrency" => {
                out.levels = value
                    .split_whitespace()
                    .map(|v| v.parse().expect("--concurrency \"1 16\""))
                    .collect();
            }
            other => panic!("unknown argument {other}"),
        }
    }
    assert!(
        out.store.starts_with("postgres"),
        "--store postgres://… is required"
    );
    out
}

fn event(i: usize) -> Event {
    let args = json!({"order_id": "ord_1001", "i": i});
    Event::tool_call(
        "missing",
        "lookup_order",
        Decision::Allow,
        Outcome::Committed,
        &args,
    )
    .with("rule", "tools.lookup_order.tier")
    .with("policy_sha256", "ab".repeat(32))
    .with("principal", "bench-user")
}

/// Appends `records` events from `level` tasks through `append`; returns (records/s, p50 µs,
/// p99 µs).
async fn measure<F, Fut>(records: usize, level: usize, append: F) -> (f64, f64, f64)
where
    F: Fn(Event) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send,
{
    let append = Arc::new(append);
    let per_task = records / level;
    let start = Instant::now();
    let tasks: Vec<_> = (0..level)
        .map(|t| {
            let append = Arc::clone(&append);
            tokio::spawn(async move {
                let mut samples = Vec::with_capacity(per_task);
                for i in 0..per_task {
                    let began = Instant::now();
                    append(event(t * per_task + i)).await;
                    samples.push(began.elapsed());
                }
                samples
            })
        })
        .collect();
    let mut samples: Vec<Duration> = Vec::with_capacity(records);
    for task in tasks {
        samples.extend(task.await.expect("task"));
    }
    let took = start.elapsed();
    samples.sort_unstable();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e6;
    (samples.len() as f64 / took.as_secs_f64(), at(0.5), at(0.99))
}

async fn fresh_schema(base: &str) -> String {
    let pool = sqlx::postgres::PgPool::connect(base)
        .await
        .expect("PostgreSQL");
    let schema = format!("tg_bench_{}", std::process::id());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema}"
    )))
    .execute(&pool)
    .await
    .expect("a schema");
    pool.close().await;
    let separator = if base.contains('?') { '&' } else { '?' };
    format!("{base}{separator}options=-c%20search_path%3D{schema}")
}

#[tokio::main]
async fn main() {
    let args = args();
    let parent = args.dir.clone().unwrap_or_else(|| "target".into());
    std::fs::create_dir_all(&parent).expect("bench dir");
    let url = fresh_schema(&args.store).await;
    let approvals = ApprovalStore::at(&Location::Postgres(url))
        .await
        .expect("store");
    let ledger = Ledger::beside(&approvals).expect("ledger");
    let mut out = std::io::stdout().lock();
    for &level in &args.levels {
        // A fresh journal per level, so each starts from an empty file as the ledger's rows grow.
        let dir = tempfile::tempdir_in(&parent).expect("journal dir");
        let (journal, _) = Journal::open_with(dir.path(), Durability::Synced).expect("journal");
        let local = measure(args.records, level, move |event| {
            let journal = journal.clone();
            async move {
                journal.record(event).await.expect("journal append");
            }
        })
        .await;
        let central = {
            let ledger = ledger.clone();
            measure(args.records, level, move |event| {
                let ledger = ledger.clone();
                async move {
                    ledger.append(event).await.expect("ledger append");
                }
            })
            .await
        };
        for (sink, (rate, p50, p99)) in [("journal", local), ("ledger", central)] {
            let line = json!({
                "sink": sink, "concurrency": level, "records": args.records,
                "records_per_s": rate.round(), "p50_us": p50.round(), "p99_us": p99.round(),
            });
            writeln!(out, "{line}").expect("stdout");
        }
    }
}
