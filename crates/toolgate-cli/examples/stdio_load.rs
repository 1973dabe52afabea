//! Load client for `bench/run.sh`: drives any stdio MCP server with `write_note` calls; also three
//! helpers that need no server (a bare append + `fdatasync` loop, an audit-chain generator, and an
//! echo server that measures the client itself).
//!
//! It speaks newline-delimited JSON-RPC directly instead of going through an SDK so that the client
//! costs next to nothing: every request line is built before the clock starts, one task only writes,
//! one task only reads, and the measured time is the server's. That client is shared with
//! `proxy_bench` in `common/stdio_client.rs`.
//!
//! ```text
//! stdio_load --calls 2000 --inflight 1 -- target/release/toolgate serve --policy P --data D
//! stdio_load --fsync-loop 2000 --dir D --record-bytes 450
//! stdio_load --gen-audit 100000 --out D/audit.jsonl
//! stdio_load --calls 2000 -- stdio_load --echo
//! ```

#[path = "common/stdio_client.rs"]
mod stdio_client;

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, ensure};
use clap::Parser;
use serde_json::{Value, json};
use tokio::process::ChildStdin;
use toolgate_core::audit::{Chain, Decision, Event, GENESIS, Outcome};
use toolgate_core::canonical;

use stdio_client::{
    Reader, call_line, elapsed_ns, finish, meta, percentile, print_line, request, round3,
    run_phase, spawn, succeeded,
};

#[derive(Debug, Parser)]
#[command(about = "Load client and baselines for bench/run.sh")]
struct Args {
    /// Number of `write_note` calls to send.
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// Requests kept outstanding; 1 means strictly sequential.
    #[arg(long, default_value_t = 1)]
    inflight: usize,
    /// Prefix of every request_id (ids are `<prefix>-<i>`, `i` zero-padded to 8 digits).
    #[arg(long, default_value = "load")]
    prefix: String,
    /// Instead of a server: append and `fdatasync` this many records to a new file in `--dir`, and
    /// as many written over a file of zeros (the journal's sync ring) and synced, in turns.
    #[arg(long, value_name = "N", requires = "dir")]
    fsync_loop: Option<usize>,
    /// Directory for `--fsync-loop`.
    #[arg(long, value_name = "D")]
    dir: Option<PathBuf>,
    /// Bytes per record of `--fsync-loop`, newline excluded.
    #[arg(long, value_name = "B", default_value_t = 450)]
    record_bytes: usize,
    /// Instead of a server: write a valid audit chain of this many records to `--out`.
    #[arg(long, value_name = "N", requires = "out")]
    gen_audit: Option<usize>,
    /// Output file of `--gen-audit` (appended to if it exists, so it should not).
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Instead of a client: be a stdio server that answers every request at once with a committed
    /// result, so that a load run against it measures the client and the pipes alone.
    #[arg(long)]
    echo: bool,
    /// The server command line.
    #[arg(last = true, value_name = "SERVER")]
    server: Vec<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let result = if args.echo {
        echo().map(|()| true)
    } else if let (Some(n), Some(dir)) = (args.fsync_loop, args.dir.as_deref()) {
        fsync_loop(n, dir, args.record_bytes).map(|()| true)
    } else if let (Some(n), Some(out)) = (args.gen_audit, args.out.as_deref()) {
        gen_audit(n, out).map(|()| true)
    } else {
        // One thread: the writer and reader tasks hand permits to each other on every call, and a
        // hand-off within a thread costs a queue push where one across threads costs a wake-up.
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the runtime")
            .and_then(|runtime| runtime.block_on(load(&args)))
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("stdio_load: {err:#}");
            ExitCode::from(2)
        }
    }
}

/// `request_id` of call `i`: unique per call, and long enough for the seed policy's `min_len: 8`.
fn request_id(prefix: &str, i: usize) -> String {
    format!("{prefix}-{i:08}")
}

async fn load(args: &Args) -> anyhow::Result<bool> {
    ensure!(args.calls > 0, "--calls must be at least 1");
    ensure!(args.inflight > 0, "--inflight must be at least 1");

    let requests: Vec<Vec<u8>> = (0..args.calls)
        .map(|i| {
            let arguments =
                json!({"request_id": request_id(&args.prefix, i), "text": format!("note {i}")});
            call_line(i, "write_note", arguments, true)
        })
        .collect();

    let (mut child, mut stdin, mut lines) = spawn(&args.server)?;

    warm_up(&mut stdin, &mut lines).await?;

    let calls = args.calls;
    let phase = run_phase(
        stdin,
        &mut lines,
        requests,
        0,
        args.inflight,
        committed,
        "stdio_load",
    )
    .await?;
    drop(lines);
    // Closing stdin is how an stdio server is told to finish and exit.
    let status = match phase.stdin {
        Ok(stdin) => {
            drop(stdin);
            finish(&mut child).await
        }
        Err(err) => Err(err),
    };

    let tally = phase.tally?;
    let seconds = tally.seconds;
    let failures = tally.errors();
    let mut latencies = tally.latencies_ns;
    latencies.sort_unstable();
    print_line(&json!({
        "calls": calls,
        "inflight": args.inflight,
        "seconds": round3(seconds),
        "calls_per_s": round3(calls as f64 / seconds),
        "p50_ms": round3(percentile(&latencies, 0.50) / 1e6),
        "p99_ms": round3(percentile(&latencies, 0.99) / 1e6),
        "failures": failures,
    }))?;
    if let Some(first) = tally.first_failure {
        eprintln!("stdio_load: first failed response: {first}");
    }
    let exited_ok = match status {
        Ok(status) if status.success() => true,
        Ok(status) => {
            eprintln!("stdio_load: server exited with {status}");
            false
        }
        Err(err) => {
            eprintln!("stdio_load: {err:#}");
            false
        }
    };
    Ok(failures == 0 && exited_ok)
}

/// One `tools/list` first, so that process start, imports and first-touch allocations are not
/// charged to the first timed call.
async fn warm_up(stdin: &mut ChildStdin, lines: &mut Reader) -> anyhow::Result<()> {
    let params = json!({"_meta": meta()});
    let message = request(stdin, lines, "warm-up", "tools/list", params).await?;
    ensure!(
        message.get("result").is_some(),
        "tools/list failed: {message}"
    );
    Ok(())
}

/// A successful `write_note`: toolgate says the note was committed.
fn committed(message: &Value) -> bool {
    succeeded(message)
        && message.pointer("/result/structuredContent/status") == Some(&json!("committed"))
}

/// Answers each request line with a result shaped like toolgate's `write_note` answer. Responses
/// are flushed only when no more input is buffered, as a server that batches its writes would.
fn echo() -> anyhow::Result<()> {
    let stdin = std::io::stdin().lock();
    let mut input = std::io::BufReader::new(stdin);
    let mut out = BufWriter::new(std::io::stdout().lock());
    let mut line = String::new();
    loop {
        line.clear();
        if std::io::BufRead::read_line(&mut input, &mut line)? == 0 {
            break;
        }
        let Ok(request) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let Some(id) = request.get("id") else {
            continue;
        };
        let result = json!({
            "content": [{"type": "text", "text": "{\"status\":\"committed\"}"}],
            "structuredContent": {"status": "committed"},
            "isError": false,
        });
        serde_json::to_writer(
            &mut out,
            &json!({"jsonrpc": "2.0", "id": id, "result": result}),
        )?;
        out.write_all(b"\n")?;
        if input.buffer().is_empty() {
            out.flush()?;
        }
    }
    out.flush()?;
    Ok(())
}

/// The floor any durable append-only log pays per record when nothing is shared: one write and one
/// `fdatasync` on a file that grows, as toolgate's WAL does for a lone call. Beside it, in turns of
/// 100 records, the same records written over a file of zeros and synced, as the journal's sync
/// ring (`audit.ring`) takes them: the data only, no new file size to commit. Each is timed per
/// record and charged the thread's CPU time (`/proc/thread-self/schedstat`).
fn fsync_loop(n: usize, dir: &Path, record_bytes: usize) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;

    const TURN: usize = 100;
    let id = std::process::id();
    let path = dir.join(format!("fsync-loop-{id}.dat"));
    let ring_path = dir.join(format!("fsync-loop-{id}.ring"));
    let mut file = OpenOptions::new()
        .append(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    let mut record = vec![b'x'; record_bytes];
    record.push(b'\n');
    let ring = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&ring_path)
        .with_context(|| format!("cannot create {}", ring_path.display()))?;
    ring.write_all_at(&vec![0; n * record.len()], 0)?;
    ring.sync_all()?;

    let mut appends = Vec::with_capacity(n);
    let mut overwrites = Vec::with_capacity(n);
    let (mut append_cpu_ns, mut overwrite_cpu_ns) = (0_u64, 0_u64);
    let start = Instant::now();
    let mut at = 0_u64;
    for turn in 0..n.div_ceil(TURN) {
        let count = TURN.min(n - turn * TURN);
        let cpu = thread_cpu_ns()?;
        for _ in 0..count {
            let before = elapsed_ns(start);
            file.write_all(&record)?;
            file.sync_data()?;
            appends.push(elapsed_ns(start) - before);
        }
        let between = thread_cpu_ns()?;
        append_cpu_ns += between - cpu;
        for _ in 0..count {
            let before = elapsed_ns(start);
            ring.write_all_at(&record, at)?;
            ring.sync_data()?;
            overwrites.push(elapsed_ns(start) - before);
            at += record.len() as u64;
        }
        overwrite_cpu_ns += thread_cpu_ns()? - between;
    }
    let seconds = start.elapsed().as_secs_f64();
    drop((file, ring));
    std::fs::remove_file(&path)?;
    std::fs::remove_file(&ring_path)?;
    // The appends' own rate, as before the overwrites took turns with them.
    let append_seconds = appends.iter().sum::<u64>() as f64 / 1e9;
    appends.sort_unstable();
    overwrites.sort_unstable();
    let per_record_us = |ns: u64| round3(ns as f64 / n as f64 / 1e3);
    print_line(&json!({
        "fsync_loop": n,
        "seconds": round3(seconds),
        "per_s": round3(n as f64 / append_seconds),
        "p50_ms": round3(percentile(&appends, 0.50) / 1e6),
        "p99_ms": round3(percentile(&appends, 0.99) / 1e6),
        "cpu_us": per_record_us(append_cpu_ns),
        "overwrite_p50_ms": round3(percentile(&overwrites, 0.50) / 1e6),
        "overwrite_p99_ms": round3(percentile(&overwrites, 0.99) / 1e6),
        "overwrite_cpu_us": per_record_us(overwrite_cpu_ns),
    }))
}

/// CPU time this thread has run, in nanoseconds (the first field of its schedstat).
fn thread_cpu_ns() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")
        .context("cannot read /proc/thread-self/schedstat")?;
    text.split_whitespace()
        .next()
        .and_then(|ns| ns.parse().ok())
        .context("unexpected /proc/thread-self/schedstat")
}

/// A chain as `toolgate serve` would have written it for `n` committed notes, sealed by the same
/// code, so `audit verify` and journal open see exactly what production leaves behind.
fn gen_audit(n: usize, out: &Path) -> anyhow::Result<()> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .open(out)
        .with_context(|| format!("cannot open {}", out.display()))?;
    ensure!(
        file.metadata()?.len() == 0,
        "{} is not empty; a chain cannot be continued blindly",
        out.display()
    );
    let mut writer = BufWriter::with_capacity(1 << 20, file);
    let mut chain = Chain::new(GENESIS.to_owned());
    let base = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or_default();
    let start = Instant::now();
    for i in 0..n {
        let request_id = request_id("gen", i);
        let arguments = json!({"request_id": request_id, "text": format!("note {i}")});
        let event = Event {
            request_id,
            method: "tools/call".to_owned(),
            name: "write_note".to_owned(),
            decision: Decision::Allow,
            outcome: Outcome::Committed,
            args_digest: canonical::digest(&arguments),
            detail: Default::default(),
        };
        writer.write_all(&chain.seal(&event, base + i as u64).line)?;
    }
    let file: File = writer.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    let bytes = file.metadata()?.len();
    print_line(&json!({
        "gen_audit": n,
        "bytes": bytes,
        "head": chain.head(),
        "seconds": round3(start.elapsed().as_secs_f64()),
    }))
}
