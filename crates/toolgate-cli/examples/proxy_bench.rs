//! Latency client for `bench/proxy.sh`: drives one stdio MCP server (an upstream called directly, or
//! `toolgate proxy` in front of it) with `tools/call`s and prints the per-call latency distribution.
//!
//! Same approach as `stdio_load`: newline-delimited JSON-RPC written by hand, every request line built
//! before the clock starts, one task only writes, one task only reads, both on one thread, so the
//! client costs next to nothing and the measured time is the server's.
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

use std::io::Write;
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::{Parser, ValueEnum};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Semaphore;

const MODERN_VERSION: &str = "2026-07-28";
const LEGACY_VERSION: &str = "2025-11-25";

/// How long the server may take to answer the handshake (it may be starting its own upstream).
const HANDSHAKE_WAIT: Duration = Duration::from_secs(60);
/// How long the server may take to exit once its stdin is closed.
const EXIT_WAIT: Duration = Duration::from_secs(30);

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

type Reader = Lines<BufReader<ChildStdout>>;

async fn bench(args: &Args) -> anyhow::Result<bool> {
    ensure!(args.calls > 0, "--calls must be at least 1");
    ensure!(args.inflight > 0, "--inflight must be at least 1");
    let (program, rest) = args
        .server
        .split_first()
        .context("no server command given after `--`")?;

    let mut child = Command::new(program)
        .args(rest)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("cannot start {program}"))?;
    let mut stdin = child.stdin.take().context("no stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();

    let protocol = tokio::time::timeout(
        HANDSHAKE_WAIT,
        handshake(&mut stdin, &mut lines, args.legacy),
    )
    .await
    .context("the server did not answer the handshake in time")??;

    // Ids: warm-up calls 0..W, timed calls W..W+N, so a late answer can never be mistaken.
    let warmup: Vec<Vec<u8>> = (0..args.warmup)
        .map(|i| {
            let arguments = args.tool.arguments(&format!("{}-warm", args.prefix), i);
            call_line(protocol, i, args.tool.name(), arguments)
        })
        .collect();
    let timed: Vec<Vec<u8>> = (0..args.calls)
        .map(|i| {
            let arguments = args.tool.arguments(&args.prefix, i);
            call_line(protocol, args.warmup + i, args.tool.name(), arguments)
        })
        .collect();

    let (stdin, lines, warm) = run_phase(stdin, lines, warmup, 0, args.inflight).await?;
    let (stdin, _lines, tally) = if warm.errors() == 0 {
        run_phase(stdin, lines, timed, args.warmup, args.inflight).await?
    } else {
        (stdin, lines, Tally::default())
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

/// `_meta` of a 2026-07-28 request; `full` adds `clientInfo` (what `server/discover` carries).
fn meta(full: bool) -> Value {
    let mut meta = json!({
        "io.modelcontextprotocol/protocolVersion": MODERN_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    if full {
        meta["io.modelcontextprotocol/clientInfo"] =
            json!({"name": "proxy_bench", "version": env!("CARGO_PKG_VERSION")});
    }
    meta
}

fn line(message: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).unwrap_or_default();
    line.push(b'\n');
    line
}

fn call_line(protocol: Protocol, id: usize, tool: &str, arguments: Value) -> Vec<u8> {
    let mut params = json!({"name": tool, "arguments": arguments});
    if protocol == Protocol::Modern {
        params["_meta"] = meta(false);
    }
    line(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}))
}

/// Sends one request and returns the message that answers it (skipping notifications and
/// anything else on the way).
async fn request(
    stdin: &mut ChildStdin,
    lines: &mut Reader,
    id: &str,
    method: &str,
    params: Value,
) -> anyhow::Result<Value> {
    let request = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    stdin.write_all(&line(&request)).await?;
    stdin.flush().await?;
    loop {
        let text = lines
            .next_line()
            .await?
            .with_context(|| format!("server closed stdout before answering {method}"))?;
        let Ok(message) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        if message.get("id").and_then(Value::as_str) == Some(id) {
            return Ok(message);
        }
    }
}

/// `server/discover` unless told `--legacy`; falls back to `initialize` when the server does not
/// serve 2026-07-28.
async fn handshake(
    stdin: &mut ChildStdin,
    lines: &mut Reader,
    legacy: bool,
) -> anyhow::Result<Protocol> {
    if !legacy {
        let params = json!({"_meta": meta(true)});
        let answer = request(stdin, lines, "discover", "server/discover", params).await?;
        let modern = answer
            .pointer("/result/supportedVersions")
            .and_then(Value::as_array)
            .is_some_and(|versions| versions.iter().any(|v| v == MODERN_VERSION));
        if modern {
            return Ok(Protocol::Modern);
        }
        eprintln!(
            "proxy_bench: server/discover did not offer {MODERN_VERSION} ({answer}); using initialize"
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

#[derive(Debug, Default)]
struct Tally {
    calls: usize,
    answered: usize,
    failed: usize,
    latencies_ns: Vec<u64>,
    first_failure: Option<String>,
    seconds: f64,
}

impl Tally {
    /// Failed answers plus calls never answered.
    fn errors(&self) -> usize {
        self.failed + (self.calls - self.answered)
    }
}

/// Sends `requests` (ids `base..base + len`) keeping `inflight` outstanding, and collects every
/// answer. Gives the pipes back for the next phase.
async fn run_phase(
    stdin: ChildStdin,
    mut lines: Reader,
    requests: Vec<Vec<u8>>,
    base: usize,
    inflight: usize,
) -> anyhow::Result<(ChildStdin, Reader, Tally)> {
    let calls = requests.len();
    let permits = Arc::new(Semaphore::new(inflight));
    let sent_at: Arc<Vec<AtomicU64>> = Arc::new((0..calls).map(|_| AtomicU64::new(0)).collect());
    let start = Instant::now();
    let writer = tokio::spawn(write_requests(
        stdin,
        requests,
        Arc::clone(&permits),
        Arc::clone(&sent_at),
        start,
    ));
    let read = read_responses(&mut lines, calls, base, &permits, &sent_at, start).await;
    let seconds = start.elapsed().as_secs_f64();
    // Wakes the writer if it waits for a permit that will not come (answers went missing).
    permits.close();
    let stdin = writer
        .await
        .context("writer task panicked")?
        .context("cannot write requests")?;
    let mut tally = read?;
    tally.seconds = seconds;
    Ok((stdin, lines, tally))
}

async fn write_requests(
    mut stdin: ChildStdin,
    requests: Vec<Vec<u8>>,
    permits: Arc<Semaphore>,
    sent_at: Arc<Vec<AtomicU64>>,
    start: Instant,
) -> anyhow::Result<ChildStdin> {
    let mut batch = Vec::new();
    let mut next = 0;
    while next < requests.len() {
        let Ok(permit) = permits.acquire().await else {
            break;
        };
        permit.forget();
        let mut count = 1;
        // Whatever else is free goes in the same write: fewer syscalls, same order.
        while next + count < requests.len() {
            match permits.try_acquire() {
                Ok(permit) => {
                    permit.forget();
                    count += 1;
                }
                Err(_) => break,
            }
        }
        batch.clear();
        let now = elapsed_ns(start);
        for (i, request) in requests[next..next + count].iter().enumerate() {
            sent_at[next + i].store(now, Ordering::Relaxed);
            batch.extend_from_slice(request);
        }
        stdin.write_all(&batch).await?;
        next += count;
    }
    stdin.flush().await?;
    Ok(stdin)
}

async fn read_responses(
    lines: &mut Reader,
    calls: usize,
    base: usize,
    permits: &Semaphore,
    sent_at: &[AtomicU64],
    start: Instant,
) -> anyhow::Result<Tally> {
    let mut tally = Tally {
        calls,
        latencies_ns: Vec::with_capacity(calls),
        ..Tally::default()
    };
    let mut seen = vec![false; calls];
    while tally.answered < calls {
        let Some(text) = lines.next_line().await? else {
            eprintln!(
                "proxy_bench: server closed stdout after {} of {calls} answers",
                tally.answered
            );
            break;
        };
        let now = elapsed_ns(start);
        let Ok(message) = serde_json::from_str::<Value>(&text) else {
            continue;
        };
        // Notifications and server-to-client requests carry no id of ours.
        let Some(i) = message
            .get("id")
            .and_then(Value::as_u64)
            .and_then(|id| usize::try_from(id).ok())
            .and_then(|id| id.checked_sub(base))
            .filter(|&i| i < calls && !seen[i])
        else {
            continue;
        };
        seen[i] = true;
        tally.answered += 1;
        tally
            .latencies_ns
            .push(now.saturating_sub(sent_at[i].load(Ordering::Relaxed)));
        if !succeeded(&message) {
            tally.failed += 1;
            tally.first_failure.get_or_insert(text);
        }
        permits.add_permits(1);
    }
    Ok(tally)
}

/// A result that is not `isError`, and no JSON-RPC error.
fn succeeded(message: &Value) -> bool {
    message.get("error").is_none()
        && message
            .get("result")
            .is_some_and(|result| result.get("isError").and_then(Value::as_bool) != Some(true))
}

async fn finish(child: &mut Child) -> anyhow::Result<ExitStatus> {
    match tokio::time::timeout(EXIT_WAIT, child.wait()).await {
        Ok(status) => Ok(status?),
        Err(_) => {
            child.start_kill()?;
            bail!(
                "server did not exit within {}s of stdin closing; killed",
                EXIT_WAIT.as_secs()
            )
        }
    }
}

fn print_line(value: &Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}")?;
    out.flush()?;
    Ok(())
}

fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Nearest-rank percentile of sorted values.
fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
