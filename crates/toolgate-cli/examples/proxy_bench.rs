//! Latency client for `bench/proxy.sh`: drives one stdio MCP server (an upstream called directly, or
//! `toolgate proxy` in front of it) with `tools/call`s and prints the per-call latency distribution.
//!
//! Same approach as `stdio_load`, and the same client (`common/stdio_client.rs`): newline-delimited
//! JSON-RPC written by hand, every request line built before the clock starts, one task only writes,
//! one task only reads, both on one thread, so the client costs next to nothing and the measured time
//! is the server's.
//!
//! ```text
//! proxy_bench --calls 5000 --inflight 1 --tool echo --warmup 500 -- target/release/examples/testbed_upstream --dir D
//! proxy_bench --calls 5000 --inflight 16 -- target/release/toolgate proxy --policy P --data D -- testbed_upstream --dir D2
//! ```
//!
//! Protocol: by default `server/discover` (MCP 2026-07-28, full `_meta`), then `tools/call`s each
//! carrying `_meta` with the protocol version and empty client capabilities. A server whose discover
//! fails, or does not list 2026-07-28, is spoken to with `initialize` (2025-11-25) instead, and the
//! output says `"protocol":"legacy"`; `--legacy` goes there directly.
//!
//! Tools: `echo` (`{"text": "call N"}`) and `write_record` (`{"id": "PREFIX-N", "value": "vN"}`, a
//! fresh id per call so that an idempotency key in front of it is claimed anew every time).
//!
//! Output, one JSON line on stdout: `calls`, `inflight`, `tool`, `protocol`, `p50_us`, `p90_us`,
//! `p99_us`, `max_us`, `mean_us`, `seconds`, `calls_per_s`, `errors`. A call is an error when its
//! answer is a JSON-RPC error or a result with `isError: true`, or when it is never answered; any
//! error makes the exit status non-zero (1), as does a server that does not exit cleanly once its
//! stdin is closed. Warm-up calls are checked the same way and not timed.

#[path = "common/stdio_client.rs"]
mod stdio_client;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, ensure};
use clap::{Parser, ValueEnum};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;

use stdio_client::{
    PROTOCOL_VERSION, Reader, Tally, call_line, finish, line, meta, percentile, print_line,
    request, round3, run_phase, spawn, succeeded,
};

const LEGACY_VERSION: &str = "2025-11-25";

/// How long the server may take to answer the handshake (it may be starting its own upstream).
const HANDSHAKE_WAIT: Duration = Duration::from_secs(60);

#[derive(Debug, Parser)]
#[command(about = "tools/call latency of a stdio MCP server, for bench/proxy.sh")]
struct Args {
    /// Timed calls.
    #[arg(long, default_value_t = 5000)]
    calls: usize,
    /// Requests kept outstanding; 1 means strictly sequential.
    #[arg(long, default_value_t = 1)]
    inflight: usize,
    /// Tool to call.
    #[arg(long, value_enum, default_value_t = Tool::Echo)]
    tool: Tool,
    /// Untimed calls first (same tool, same concurrency), so that start-up, first-touch
    /// allocations and the upstream's first connection are not charged to the timed calls.
    #[arg(long, default_value_t = 500)]
    warmup: usize,
    /// Prefix of `write_record` ids (`PREFIX-N`); warm-up ids are `PREFIX-warm-N`.
    #[arg(long, default_value = "bench")]
    prefix: String,
    /// Skip `server/discover`: `initialize` (2025-11-25), `notifications/initialized`, then calls
    /// without `_meta`.
    #[arg(long)]
    legacy: bool,
    /// The server command line.
    #[arg(last = true, value_name = "SERVER", required = true)]
    server: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Tool {
    /// `echo {text}`: read-only, no effect.
    Echo,
    /// `write_record {id, value}`: appends and fsyncs a line upstream.
    #[value(name = "write_record")]
    WriteRecord,
}

impl Tool {
    fn name(self) -> &'static str {
        match self {
            Self::Echo => "echo",
            Self::WriteRecord => "write_record",
        }
    }

    fn arguments(self, prefix: &str, i: usize) -> Value {
        match self {
            Self::Echo => json!({"text": format!("call {i}")}),
            Self::WriteRecord => {
                json!({"id": format!("{prefix}-{i:08}"), "value": format!("v{i}")})
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    Modern,
    Legacy,
}

impl Protocol {
    fn as_str(self) -> &'static str {
        match self {
            Self::Modern => "modern",
            Self::Legacy => "legacy",
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    // One thread: the writer and reader tasks hand permits to each other on every call, and a
    // hand-off within a thread costs a queue push where one across threads costs a wake-up.
    let result = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")
        .and_then(|runtime| runtime.block_on(bench(&args)));
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("proxy_bench: {err:#}");
            ExitCode::from(2)
        }
    }
}

async fn bench(args: &Args) -> anyhow::Result<bool> {
    ensure!(args.calls > 0, "--calls must be at least 1");
    ensure!(args.inflight > 0, "--inflight must be at least 1");
    let (mut child, mut stdin, mut lines) = spawn(&args.server)?;

    let protocol = tokio::time::timeout(
        HANDSHAKE_WAIT,
        handshake(&mut stdin, &mut lines, args.legacy),
    )
    .await
    .context("the server did not answer the handshake in time")??;

    // Ids: warm-up calls 0..W, timed calls W..W+N, so a late answer can never be mistaken.
    let with_meta = protocol == Protocol::Modern;
    let warmup: Vec<Vec<u8>> = (0..args.warmup)
        .map(|i| {
            let arguments = args.tool.arguments(&format!("{}-warm", args.prefix), i);
            call_line(i, args.tool.name(), arguments, with_meta)
        })
        .collect();
    let timed: Vec<Vec<u8>> = (0..args.calls)
        .map(|i| {
            let arguments = args.tool.arguments(&args.prefix, i);
            call_line(args.warmup + i, args.tool.name(), arguments, with_meta)
        })
        .collect();

    let phase = run_phase(
        stdin,
        &mut lines,
        warmup,
        0,
        args.inflight,
        succeeded,
        "proxy_bench",
    )
    .await?;
    let (stdin, warm) = (phase.stdin?, phase.tally?);
    let (stdin, tally) = if warm.errors() == 0 {
        let phase = run_phase(
            stdin,
            &mut lines,
            timed,
            args.warmup,
            args.inflight,
            succeeded,
            "proxy_bench",
        )
        .await?;
        (phase.stdin?, phase.tally?)
    } else {
        (stdin, Tally::default())
    };
    // Closing stdin is how an stdio server is told to finish and exit.
    drop(stdin);
    let status = finish(&mut child).await;

    let mut ok = true;
    if warm.errors() > 0 {
        eprintln!(
            "proxy_bench: {} of {} warm-up calls failed; nothing timed. First failure: {}",
            warm.errors(),
            args.warmup,
            warm.first_failure.as_deref().unwrap_or("(no answer)")
        );
        ok = false;
    }
    if warm.errors() == 0 {
        let mut latencies = tally.latencies_ns.clone();
        latencies.sort_unstable();
        let us = |p: f64| round1(percentile(&latencies, p) / 1e3);
        let mean = latencies.iter().map(|&n| n as f64).sum::<f64>() / latencies.len().max(1) as f64;
        let errors = tally.errors();
        print_line(&json!({
            "calls": args.calls,
            "inflight": args.inflight,
            "tool": args.tool.name(),
            "protocol": protocol.as_str(),
            "p50_us": us(0.50),
            "p90_us": us(0.90),
            "p99_us": us(0.99),
            "max_us": round1(latencies.last().copied().unwrap_or(0) as f64 / 1e3),
            "mean_us": round1(mean / 1e3),
            "seconds": round3(tally.seconds),
            "calls_per_s": round1(args.calls as f64 / tally.seconds),
            "errors": errors,
        }))?;
        if errors > 0 {
            eprintln!(
                "proxy_bench: FAILED: {errors} of {} calls failed ({} answered). First failure: {}",
                args.calls,
                tally.answered,
                tally.first_failure.as_deref().unwrap_or("(no answer)")
            );
            ok = false;
        }
    }
    match status {
        Ok(status) if status.success() => {}
        Ok(status) => {
            eprintln!("proxy_bench: server exited with {status}");
            ok = false;
        }
        Err(err) => {
            eprintln!("proxy_bench: {err:#}");
            ok = false;
        }
    }
    Ok(ok)
}

/// `_meta` of `server/discover`: the request `_meta` plus `clientInfo`.
fn discover_meta() -> Value {
    let mut meta = meta();
    meta["io.modelcontextprotocol/clientInfo"] =
        json!({"name": "proxy_bench", "version": env!("CARGO_PKG_VERSION")});
    meta
}

/// `server/discover` unless told `--legacy`; falls back to `initialize` when the server does not
/// serve 2026-07-28.
async fn handshake(
    stdin: &mut ChildStdin,
    lines: &mut Reader,
    legacy: bool,
) -> anyhow::Result<Protocol> {
    if !legacy {
        let params = json!({"_meta": discover_meta()});
        let answer = request(stdin, lines, "discover", "server/discover", params).await?;
        let modern = answer
            .pointer("/result/supportedVersions")
            .and_then(Value::as_array)
            .is_some_and(|versions| versions.iter().any(|v| v == PROTOCOL_VERSION));
        if modern {
            return Ok(Protocol::Modern);
        }
        eprintln!(
            "proxy_bench: server/discover did not offer {PROTOCOL_VERSION} ({answer}); using initialize"
        );
    }
    let params = json!({
        "protocolVersion": LEGACY_VERSION,
        "capabilities": {},
        "clientInfo": {"name": "proxy_bench", "version": env!("CARGO_PKG_VERSION")},
    });
    let answer = request(stdin, lines, "initialize", "initialize", params).await?;
    ensure!(
        answer.get("result").is_some(),
        "initialize failed: {answer}"
    );
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    stdin.write_all(&line(&initialized)).await?;
    stdin.flush().await?;
    Ok(Protocol::Legacy)
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
