//! `toolgate audit verify | export | prune`: whether an audit log's chain is intact (and holds
//! every signed checkpoint), the central ledger as that log, and its retention.
//! `verify` exits 0 intact, 1 broken (first broken line and why), 2 could not read.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;
use toolgate_core::audit;
use toolgate_core::time::now_ms;
use toolgate_store::ledger::{Checkpoint, Ledger};

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Check every record's hash and link; report the first break, the record count and the head.
    Verify(VerifyArgs),
    /// Write the central audit ledger (--store postgres://…) as the JSON lines `verify` checks.
    Export(ExportArgs),
    /// Retention: move the central ledger's records up to the newest signed checkpoint older than
    /// --before into an archive file; what stays verifies from that checkpoint onward.
    Prune(PruneArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct ExportArgs {
    #[command(flatten)]
    store: crate::store::StoreArgs,
    /// Only the records after this count (0: all the ledger holds).
    #[arg(long, value_name = "N", default_value_t = 0)]
    after: u64,
    /// Write here instead of standard output.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct PruneArgs {
    #[command(flatten)]
    store: crate::store::StoreArgs,
    /// Prune up to the newest checkpoint made before this: a time (`2026-11-01T00:00:00Z`) or an
    /// age (`90d`: ninety days ago).
    #[arg(long, value_name = "TIME|AGE")]
    before: String,
    /// The file the pruned records are written to first (JSON lines; must not exist).
    #[arg(long, value_name = "FILE")]
    archive: PathBuf,
}

#[derive(Debug, clap::Args)]
pub(crate) struct VerifyArgs {
    /// The audit log (JSON Lines, seed 000 format).
    file: PathBuf,
    /// Also require the chain to end at this head (catches truncation and wholesale rewrites
    /// when the head was published elsewhere).
    #[arg(long, value_name = "HASH")]
    expect_head: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Hashing threads (default: one per core). Records hash independently; only the links are
    /// checked in order, so the verdict does not depend on this.
    #[arg(long, value_name = "N")]
    threads: Option<std::num::NonZeroUsize>,
    /// Signed checkpoints (JSON lines, as a checkpoint sink file holds them): each must verify
    /// with --key, and the log must hold each checkpointed head at its count. A log pruned to a
    /// checkpoint verifies from it.
    #[arg(long, value_name = "FILE", requires = "key")]
    checkpoints: Option<PathBuf>,
    /// The Ed25519 public key the checkpoints were signed with (SPKI PEM).
    #[arg(long, value_name = "PUB", requires = "checkpoints")]
    key: Option<PathBuf>,
}

pub(crate) async fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        // Hashing on every core: the command's one job, nothing else waits on this runtime.
        Command::Verify(args) => verify(&args),
        Command::Export(args) => export(args).await,
        Command::Prune(args) => prune(args).await,
    }
}

fn verify(args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let checkpoints = match (&args.checkpoints, &args.key) {
        (Some(file), Some(key)) => Some((
            crate::checkpoint::read(file)?,
            crate::checkpoint::public_key(key)?,
        )),
        _ => None,
    };
    let threads = args
        .threads
        .or_else(|| std::thread::available_parallelism().ok())
        .unwrap_or(std::num::NonZeroUsize::MIN);
    let report = match &checkpoints {
        None => std::fs::File::open(&args.file)
            .map_err(audit::VerifyError::from)
            .and_then(|file| {
                let reader = BufReader::with_capacity(1 << 18, file);
                audit::verify_with(reader, args.expect_head.as_deref(), threads)
            }),
        Some((checkpoints, key)) => with_checkpoints(args, checkpoints, key, threads),
    };
    let mut out = std::io::stdout().lock();
    let file = args.file.display().to_string();
    let code = match report {
        Err(err) => {
            let reason = format!(
                "{err}: {}",
                std::error::Error::source(&err)
                    .map(ToString::to_string)
                    .unwrap_or_default()
            );
            if args.json {
                writeln!(
                    out,
                    "{}",
                    json!({"file": file, "intact": false, "error": reason})
                )?;
            } else {
                eprintln!("toolgate: {file}: {reason}");
            }
            2
        }
        Ok(report) => {
            if args.json {
                let broken = report
                    .broken
                    .as_ref()
                    .map(|b| json!({"line": b.line, "reason": b.reason}));
                let mut value = json!({
                    "file": file,
                    "intact": report.intact(),
                    "records": report.records,
                    "head": report.head,
                    "broken": broken,
                });
                if let Some((checkpoints, _)) = &checkpoints {
                    value["checkpoints"] = json!(checkpoints.len());
                }
                writeln!(out, "{value}")?;
            } else if let Some(broken) = &report.broken {
                writeln!(out, "broken at line {}: {}", broken.line, broken.reason)?;
                writeln!(out, "records verified before the break: {}", report.records)?;
                writeln!(out, "last good head: {}", report.head)?;
            } else {
                writeln!(out, "intact: {} records", report.records)?;
                writeln!(out, "head: {}", report.head)?;
                if let Some((checkpoints, _)) = &checkpoints {
                    writeln!(out, "signed checkpoints held: {}", checkpoints.len())?;
                }
            }
            u8::from(!report.intact())
        }
    };
    Ok(ExitCode::from(code))
}

/// The chain of `args.file` checked against signed `checkpoints`: every signature must verify
/// with `key`; the log may start after a checkpoint (pruned to it) instead of at the beginning;
/// and each checkpoint after its start must name the hash of the record at its count. The first
/// failure is the report's break, as for any other.
fn with_checkpoints(
    args: &VerifyArgs,
    checkpoints: &[Checkpoint],
    key: &[u8],
    threads: std::num::NonZeroUsize,
) -> Result<audit::Report, audit::VerifyError> {
    let broken = |line: u64, reason: String| audit::Report {
        records: 0,
        head: audit::GENESIS.to_owned(),
        broken: Some(audit::Break { line, reason }),
    };
    if let Some(forged) = checkpoints
        .iter()
        .find(|c| !crate::checkpoint::signed_by(c, key))
    {
        return Ok(broken(
            0,
            format!(
                "the checkpoint at count {} is not signed by this key",
                forged.count
            ),
        ));
    }
    // Where the log starts: the beginning, or a checkpoint it was pruned to.
    let first = std::fs::File::open(&args.file).and_then(|file| {
        let mut line = String::new();
        BufReader::new(file).read_line(&mut line).map(|_| line)
    })?;
    let start = serde_json::from_str::<serde_json::Value>(&first)
        .ok()
        .and_then(|record| record["prev_sha256"].as_str().map(str::to_owned))
        .unwrap_or_else(|| audit::GENESIS.to_owned());
    let offset = if start == audit::GENESIS {
        0
    } else if let Some(base) = checkpoints.iter().find(|c| c.head == start) {
        base.count
    } else {
        return Ok(broken(
            1,
            format!("the log starts after record {start}, which no signed checkpoint names"),
        ));
    };
    let file = std::fs::File::open(&args.file)?;
    let report = audit::verify_from(
        BufReader::with_capacity(1 << 18, file),
        &start,
        args.expect_head.as_deref(),
        threads,
    )?;
    if !report.intact() {
        return Ok(report);
    }
    // Each checkpoint after the start names the record at its count.
    let wanted: std::collections::BTreeMap<u64, &Checkpoint> = checkpoints
        .iter()
        .filter(|c| c.count > offset)
        .map(|c| (c.count - offset, c))
        .collect();
    let mut found = std::collections::BTreeMap::new();
    if !wanted.is_empty() {
        let file = BufReader::with_capacity(1 << 18, std::fs::File::open(&args.file)?);
        for (line, text) in (1_u64..).zip(file.lines()) {
            let text = text?;
            if wanted.contains_key(&line) {
                let head = serde_json::from_str::<serde_json::Value>(&text)
                    .ok()
                    .and_then(|record| record["sha256"].as_str().map(str::to_owned));
                found.insert(line, head);
            }
        }
    }
    for (line, checkpoint) in wanted {
        let reason = match found.get(&line) {
            None => format!(
                "the log ends at record {} before the checkpoint at count {} (truncated)",
                offset + report.records,
                checkpoint.count
            ),
            Some(Some(head)) if *head == checkpoint.head => continue,
            Some(_) => format!(
                "record {} is not the one checkpointed at that count (rewritten)",
                checkpoint.count
            ),
        };
        return Ok(audit::Report {
            broken: Some(audit::Break {
                line: line.min(report.records),
                reason,
            }),
            ..report
        });
    }
    Ok(report)
}

/// The central ledger of `store`, which must be a shared one.
async fn ledger(store: &crate::store::StoreArgs) -> anyhow::Result<Ledger> {
    let approvals = store.approvals(Path::new(".")).await?;
    Ledger::beside(&approvals).context("the central audit ledger")
}

async fn export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let ledger = ledger(&args.store).await?;
    let written = match &args.out {
        Some(path) => {
            let mut file = std::io::BufWriter::new(
                std::fs::File::create(path)
                    .with_context(|| format!("cannot create {}", path.display()))?,
            );
            let written = ledger.export(args.after, &mut file).await?;
            file.into_inner()
                .map_err(std::io::IntoInnerError::into_error)
                .and_then(|file| file.sync_all())
                .with_context(|| format!("cannot write {}", path.display()))?;
            written
        }
        None => {
            // The lines are this command's output (a file or a pipe, not a protocol).
            let mut out = std::io::BufWriter::new(std::io::stdout());
            let written = ledger.export(args.after, &mut out).await?;
            out.flush()?;
            written
        }
    };
    tracing::info!(records = written, "ledger exported");
    Ok(ExitCode::SUCCESS)
}

async fn prune(args: PruneArgs) -> anyhow::Result<ExitCode> {
    let before = match toolgate_core::time::parse_rfc3339(&args.before) {
        Some(at) => at,
        None => {
            let age = toolgate_core::policy::parse_duration(&args.before).with_context(|| {
                format!(
                    "--before {:?}: a time like 2026-11-01T00:00:00Z or an age like 90d",
                    args.before
                )
            })?;
            now_ms().saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
        }
    };
    let ledger = ledger(&args.store).await?;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&args.archive)
        .with_context(|| format!("cannot create the archive {}", args.archive.display()))?;
    let pruned = ledger.prune(before, file).await?;
    let mut out = std::io::stdout().lock();
    match pruned.through {
        Some(checkpoint) => writeln!(
            out,
            "pruned {} records into {}; the ledger now starts after checkpoint {} (head {})",
            pruned.records,
            args.archive.display(),
            checkpoint.count,
            checkpoint.head
        )?,
        None => writeln!(
            out,
            "no signed checkpoint is older than that: nothing pruned"
        )?,
    }
    Ok(ExitCode::SUCCESS)
}
