//! `toolgate audit verify`: stream an audit log and say whether its chain is intact.
//! Exit 0 intact, 1 broken (first broken line and why), 2 could not read.

use std::io::{BufReader, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use serde_json::json;
use toolgate_core::audit;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Check every record's hash and link; report the first break, the record count and the head.
    Verify(VerifyArgs),
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
}

pub(crate) fn run(command: Command) -> anyhow::Result<ExitCode> {
    let Command::Verify(args) = command;
    let report = std::fs::File::open(&args.file)
        .map_err(audit::VerifyError::from)
        .and_then(|file| {
            let reader = BufReader::with_capacity(1 << 18, file);
            let expect_head = args.expect_head.as_deref();
            match args.threads {
                Some(threads) => audit::verify_with(reader, expect_head, threads),
                None => audit::verify(reader, expect_head),
            }
        });
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
                let value = json!({
                    "file": file,
                    "intact": report.intact(),
                    "records": report.records,
                    "head": report.head,
                    "broken": broken,
                });
                writeln!(out, "{value}")?;
            } else if let Some(broken) = &report.broken {
                writeln!(out, "broken at line {}: {}", broken.line, broken.reason)?;
                writeln!(out, "records verified before the break: {}", report.records)?;
                writeln!(out, "last good head: {}", report.head)?;
            } else {
                writeln!(out, "intact: {} records", report.records)?;
                writeln!(out, "head: {}", report.head)?;
            }
            u8::from(!report.intact())
        }
    };
    Ok(ExitCode::from(code))
}
