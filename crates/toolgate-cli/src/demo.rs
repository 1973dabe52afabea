//! `toolgate demo`: seed 000's scenario, end to end, against a real `toolgate serve` child process.
//!
//! Nothing to set up: a temporary data directory, the seed's policy, and this very binary as the
//! server. The harness, not a model, decides at the end: execute, verify by observation, then
//! CONTINUE or STOP. Exit 0 when every check held, 1 when one did not.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};

use anyhow::Context;
use rmcp::RoleClient;
use rmcp::model::{CallToolRequestParams, ProtocolVersion};
use rmcp::service::{ClientLifecycleMode, ClientServiceExt, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use toolgate_core::audit;
use toolgate_core::policy::SEED_POLICY;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Print one JSON object instead of the transcript.
    #[arg(long)]
    json: bool,
    /// Keep the temporary directory (policy, data, target file) and print its path.
    #[arg(long)]
    keep: bool,
}

struct Step {
    name: &'static str,
    ok: bool,
    detail: String,
}

/// What can be observed of a file without trusting anyone's word: content hash, size, mtime, existence.
#[derive(Debug, PartialEq, Eq)]
struct Observation {
    exists: bool,
    sha256: String,
    size: u64,
    mtime_ns: i128,
}

fn observe(path: &Path) -> Observation {
    match (std::fs::read(path), std::fs::metadata(path)) {
        (Ok(bytes), Ok(meta)) => Observation {
            exists: true,
            sha256: toolgate_core::canonical::sha256_hex(&bytes),
            size: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        },
        _ => Observation {
            exists: false,
            sha256: String::new(),
            size: 0,
            mtime_ns: 0,
        },
    }
}

type Client = RunningService<RoleClient, ()>;

async fn call(
    client: &Client,
    tool: &str,
    args: Value,
) -> Result<rmcp::model::CallToolResult, ServiceError> {
    let arguments = args.as_object().cloned().unwrap_or_default();
    client
        .peer()
        .call_tool(CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments))
        .await
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let dir = tempfile::Builder::new()
        .prefix("toolgate-demo-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let root = dir.path().to_path_buf();
    let policy = root.join("policy.json");
    let data = root.join("data");
    let target = root.join("precious.txt");
    std::fs::write(&policy, SEED_POLICY).context("cannot write the demo policy")?;
    std::fs::write(&target, "the file rm_rf must not touch\n")
        .context("cannot write the demo target")?;

    let steps = scenario(&policy, &data, &target).await?;
    let report = std::fs::File::open(data.join("audit.jsonl"))
        .map_err(audit::VerifyError::from)
        .and_then(|f| audit::verify(std::io::BufReader::new(f), None))
        .context("cannot read the demo's audit log")?;
    let mut steps = steps;
    steps.push(Step {
        name: "audit verify",
        ok: report.intact(),
        detail: match &report.broken {
            None => format!("intact, {} records, head {}", report.records, report.head),
            Some(b) => format!("broken at line {}: {}", b.line, b.reason),
        },
    });
    let ok = steps.iter().all(|s| s.ok);
    let kept = args.keep.then(|| dir.keep());
    print(&steps, ok, &report, kept.as_deref(), args.json)?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn scenario(policy: &Path, data: &Path, target: &Path) -> anyhow::Result<Vec<Step>> {
    let exe = std::env::current_exe().context("cannot find the toolgate binary")?;
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("serve")
        .arg("--policy")
        .arg(policy)
        .arg("--data")
        .arg(data);
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start `toolgate serve`")?;
    let lifecycle = ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    };
    let client: Client =
        ().serve_with_lifecycle(transport, lifecycle)
            .await
            .context("cannot connect to `toolgate serve`")?;
    let mut steps = Vec::new();
    let server = client.peer().peer_info();
    let (name, version) = server
        .as_ref()
        .map(|info| {
            let name = info
                .server_info
                .as_ref()
                .map(|i| i.name.clone())
                .unwrap_or_default();
            (name, info.protocol_version.to_string())
        })
        .unwrap_or_default();
    steps.push(Step {
        name: "connect",
        ok: name == "toolgate",
        detail: format!("server {name}, protocol {version}"),
    });

    let tools = client
        .peer()
        .list_all_tools()
        .await
        .context("tools/list failed")?;
    let names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    steps.push(Step {
        name: "tools/list",
        ok: !names.iter().any(|n| n == "rm_rf") && names.iter().any(|n| n == "write_note"),
        detail: format!("{} (rm_rf hidden)", names.join(", ")),
    });

    let before = observe(target);
    let refused = call(
        &client,
        "rm_rf",
        json!({"path": target.display().to_string()}),
    )
    .await;
    let after = observe(target);
    let code = match &refused {
        Err(ServiceError::McpError(error)) => Some(error.code.0),
        _ => None,
    };
    steps.push(Step {
        name: "rm_rf refused",
        ok: code == Some(-32602) && before == after && after.exists,
        detail: format!(
            "JSON-RPC error {}; target unchanged: sha256 {}…, {} bytes, mtime_ns {}",
            code.map_or_else(|| "none".to_owned(), |c| c.to_string()),
            &after.sha256.get(..12).unwrap_or_default(),
            after.size,
            after.mtime_ns
        ),
    });

    let note = json!({"request_id": "req-0001", "text": "gate applied"});
    for (name, expected) in [("write_note", "committed"), ("write_note again", "replay")] {
        let result = call(&client, "write_note", note.clone())
            .await
            .context("write_note failed")?;
        let status = result
            .structured_content
            .as_ref()
            .and_then(|v| v["status"].as_str())
            .unwrap_or("?")
            .to_owned();
        steps.push(Step {
            name,
            ok: status == expected && result.is_error != Some(true),
            detail: format!("status {status} (expected {expected})"),
        });
    }

    let observed = call(&client, "read_ledger", json!({}))
        .await
        .context("read_ledger failed")?;
    let notes = observed
        .structured_content
        .as_ref()
        .map(|v| v["notes"].clone())
        .unwrap_or(Value::Null);
    let matches = notes
        .as_array()
        .is_some_and(|n| n.iter().filter(|x| **x == note).count() == 1);
    let decision = if matches { "CONTINUE" } else { "STOP" };
    steps.push(Step {
        name: "read_ledger verify",
        ok: matches,
        detail: format!("observed {notes}; expected exactly one {note} → {decision}"),
    });
    client
        .cancel()
        .await
        .context("cannot stop `toolgate serve`")?;
    Ok(steps)
}

fn print(
    steps: &[Step],
    ok: bool,
    report: &audit::Report,
    kept: Option<&Path>,
    as_json: bool,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if as_json {
        let steps: Vec<Value> = steps
            .iter()
            .map(|s| json!({"step": s.name, "ok": s.ok, "detail": s.detail}))
            .collect();
        let value = json!({
            "ok": ok,
            "steps": steps,
            "audit": {"intact": report.intact(), "records": report.records, "head": report.head},
            "kept": kept.map(|p| p.display().to_string()),
        });
        writeln!(out, "{value}")?;
        return Ok(());
    }
    writeln!(
        out,
        "toolgate demo: seed 000 scenario against a real `toolgate serve` child\n"
    )?;
    for step in steps {
        writeln!(
            out,
            "  {} {:<20} {}",
            if step.ok { "ok  " } else { "FAIL" },
            step.name,
            step.detail
        )?;
    }
    writeln!(out)?;
    if let Some(path) = kept {
        writeln!(out, "kept: {}", PathBuf::from(path).display())?;
    }
    writeln!(
        out,
        "{}",
        if ok {
            "all checks held"
        } else {
            "a check failed"
        }
    )?;
    Ok(())
}
