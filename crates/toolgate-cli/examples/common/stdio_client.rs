//! The raw JSON-RPC stdio client that the benchmark examples `stdio_load` (`bench/run.sh`) and
//! `proxy_bench` (`bench/proxy.sh`) share: start the server, send one request and wait for its
//! answer, run a phase of `tools/call`s, stop the server, and the numbers and the one JSON line
//! they print.
//!
//! It owns the wire and the clock, not the benchmark: which calls go out, what counts as a good
//! answer and which fields the output line has stay with each example, because the scripts parse
//! those and the two examples judge answers differently (`committed` vs any non-error result).
//!
//! Newline-delimited JSON-RPC written by hand rather than through an SDK, so that the client costs
//! next to nothing: every request line is built before the clock starts, one task only writes, one
//! task only reads, and the measured time is the server's.
//!
//! Included by each example with `#[path = "common/stdio_client.rs"] mod stdio_client;` instead of
//! living in the `toolgate-cli` crate: it is bench code that must not ship in the `toolgate`
//! binary, and each example is its own crate. It sits in `examples/common/` and is not called
//! `main.rs`, so cargo does not build it as an example of its own.

use std::io::Write;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Semaphore;

/// The MCP version the requests' `_meta` names (MCP 2026-07-28).
pub(crate) const PROTOCOL_VERSION: &str = "2026-07-28";

/// How long the server may take to exit once its stdin is closed.
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// The server's stdout, a line at a time.
pub(crate) type Reader = Lines<BufReader<ChildStdout>>;

/// Starts `server` (program, then its arguments) with piped stdin and stdout; its stderr stays
/// ours. The child is killed if dropped before [`finish`].
pub(crate) fn spawn(server: &[String]) -> anyhow::Result<(Child, ChildStdin, Reader)> {
    let (program, rest) = server
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
    let stdin = child.stdin.take().context("no stdin")?;
    let lines = BufReader::new(child.stdout.take().context("no stdout")?).lines();
    Ok((child, stdin, lines))
}

/// `_meta` of a 2026-07-28 request: the protocol version and empty client capabilities.
pub(crate) fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": PROTOCOL_VERSION,
        "io.modelcontextprotocol/clientCapabilities": {},
    })
}

/// `message` as one line of the wire.
pub(crate) fn line(message: &Value) -> Vec<u8> {
    let mut line = serde_json::to_vec(message).unwrap_or_default();
    line.push(b'\n');
    line
}

/// A `tools/call` request line with a numeric id; `with_meta` adds [`meta`] to its params.
pub(crate) fn call_line(id: usize, tool: &str, arguments: Value, with_meta: bool) -> Vec<u8> {
    let mut params = json!({"name": tool, "arguments": arguments});
    if with_meta {
        params["_meta"] = meta();
    }
    line(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}))
}

/// Sends one request and returns the message that answers it (skipping notifications and
/// anything else on the way).
pub(crate) async fn request(
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

/// A result that is not `isError`, and no JSON-RPC error.
pub(crate) fn succeeded(message: &Value) -> bool {
    message.get("error").is_none()
        && message
            .get("result")
            .is_some_and(|result| result.get("isError").and_then(Value::as_bool) != Some(true))
}

/// What one phase of calls came to.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) calls: usize,
    pub(crate) answered: usize,
    /// Answers the phase's `accept` turned down.
    pub(crate) failed: usize,
    pub(crate) latencies_ns: Vec<u64>,
    pub(crate) first_failure: Option<String>,
    pub(crate) seconds: f64,
}

impl Tally {
    /// Failed answers plus calls never answered.
    pub(crate) fn errors(&self) -> usize {
        self.failed + (self.calls - self.answered)
    }
}

/// What a phase leaves behind. The two halves fail apart because `stdio_load` still prints its
/// tally when writing failed, where `proxy_bench` gives up on either.
#[derive(Debug)]
pub(crate) struct Phase {
    /// The server's stdin, handed back for the next phase or to be closed.
    pub(crate) stdin: anyhow::Result<ChildStdin>,
    pub(crate) tally: anyhow::Result<Tally>,
}

/// Sends `requests` (ids `base..base + len`, as built by [`call_line`]) keeping `inflight`
/// outstanding, and collects every answer, judging each with `accept`. `who` prefixes the
/// diagnostic printed if the server closes its stdout early. Fails only if the writer panicked.
pub(crate) async fn run_phase(
    stdin: ChildStdin,
    lines: &mut Reader,
    requests: Vec<Vec<u8>>,
    base: usize,
    inflight: usize,
    accept: fn(&Value) -> bool,
    who: &str,
) -> anyhow::Result<Phase> {
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
    let read = read_responses(lines, calls, base, accept, &permits, &sent_at, start).await;
    let seconds = start.elapsed().as_secs_f64();
    // The reader stops short of `calls` only when stdout ends.
    if let Ok(tally) = &read
        && tally.answered < calls
    {
        eprintln!(
            "{who}: server closed stdout after {} of {calls} answers",
            tally.answered
        );
    }
    // Wakes the writer if it waits for a permit that will not come (answers went missing).
    permits.close();
    let stdin = writer
        .await
        .context("writer task panicked")?
        .context("cannot write requests");
    let tally = read.map(|tally| Tally { seconds, ..tally });
    Ok(Phase { stdin, tally })
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
    accept: fn(&Value) -> bool,
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
        if !accept(&message) {
            tally.failed += 1;
            tally.first_failure.get_or_insert(text);
        }
        permits.add_permits(1);
    }
    Ok(tally)
}

/// Waits for the server to exit after its stdin was closed; kills it if it takes too long.
pub(crate) async fn finish(child: &mut Child) -> anyhow::Result<ExitStatus> {
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

/// Prints the result line on stdout and flushes it.
pub(crate) fn print_line(value: &Value) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}")?;
    out.flush()?;
    Ok(())
}

pub(crate) fn elapsed_ns(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Nearest-rank percentile of sorted values.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1] as f64
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}
