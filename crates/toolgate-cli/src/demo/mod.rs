//! `toolgate demo`: the seeds' scenarios, end to end, against real `toolgate serve` child processes:
//! seed 000's ledger, seed 003's orders (tiers, an approval by a second process, an expiry, a
//! blocked tool), its gated agent (`agent.rs`, `toolgate agent` children with the scripted model)
//! and its helpdesk over HTTP with OAuth (`http.rs`), seed 004's gated notes, and the gateway.
//!
//! Nothing to set up: a temporary data directory, the seed's policy, and this very binary as the
//! server. The harness, not a model, decides at the end: execute, verify by observation, then
//! CONTINUE or STOP. Exit 0 when every check held, 1 when one did not.

mod agent;
mod http;

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

/// The demo policies, shipped in `policies/`.
const ORDERS_POLICY: &str = include_str!("../../../../policies/orders.toml");
const NOTES_POLICY: &str = include_str!("../../../../policies/notes.toml");

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
    steps.push(verify_step("audit verify", &report));
    steps.extend(orders_scenario(&root).await?);
    steps.extend(agent::agent_scenario(&root).await?);
    steps.extend(notes_scenario(&root).await?);
    steps.extend(gateway_scenario(&root).await?);
    steps.extend(http::http_scenario(&root).await?);
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
    let client = connect("ledger", policy, data, &[]).await?;
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
        "toolgate demo: the seed scenarios (000 ledger, 003 orders, 004 notes) against real `toolgate serve` children,\nthen `toolgate proxy` gating an ungated MCP server it did not write, then the helpdesk over HTTP with OAuth\n"
    )?;
    for step in steps {
        writeln!(
            out,
            "  {} {:<24} {}",
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

/// Starts `toolgate serve` for `toolset` on `policy` and `data` (with extra environment) as a child
/// and connects an rmcp client.
async fn connect(
    toolset: &str,
    policy: &Path,
    data: &Path,
    envs: &[(&str, &str)],
) -> anyhow::Result<Client> {
    let exe = std::env::current_exe().context("cannot find the toolgate binary")?;
    let mut command = tokio::process::Command::new(exe);
    command
        .arg("serve")
        .arg("--toolset")
        .arg(toolset)
        .arg("--policy")
        .arg(policy)
        .arg("--data")
        .arg(data);
    for (key, value) in envs {
        command.env(key, value);
    }
    attach(command).await
}

/// Starts `command` (an MCP server on stdio) and connects an rmcp client in either era.
async fn attach(command: tokio::process::Command) -> anyhow::Result<Client> {
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .context("cannot start `toolgate`")?;
    let lifecycle = ClientLifecycleMode::Auto {
        preferred_versions: vec![ProtocolVersion::V_2026_07_28],
        legacy_version: Some(ProtocolVersion::V_2025_11_25),
    };
    ().serve_with_lifecycle(transport, lifecycle)
        .await
        .context("cannot connect to `toolgate serve`")
}

fn verify_step(name: &'static str, report: &audit::Report) -> Step {
    Step {
        name,
        ok: report.intact(),
        detail: match &report.broken {
            None => format!("intact, {} records, head {}", report.records, report.head),
            Some(b) => format!("broken at line {}: {}", b.line, b.reason),
        },
    }
}

fn verify_dir(data: &Path) -> anyhow::Result<audit::Report> {
    std::fs::File::open(data.join("audit.jsonl"))
        .map_err(audit::VerifyError::from)
        .and_then(|f| audit::verify(std::io::BufReader::new(f), None))
        .with_context(|| format!("cannot read the audit log in {}", data.display()))
}

/// The `status` of a tool result's structured content.
fn status(result: &rmcp::model::CallToolResult) -> String {
    result
        .structured_content
        .as_ref()
        .and_then(|v| v["status"].as_str())
        .unwrap_or("?")
        .to_owned()
}

/// Seed 003: a small refund runs; a large one waits and is approved by a second process; one nobody
/// answers expires and is denied; delete_customer is refused every time.
async fn orders_scenario(root: &Path) -> anyhow::Result<Vec<Step>> {
    let policy = root.join("orders.toml");
    let data = root.join("orders-data");
    std::fs::write(&policy, ORDERS_POLICY).context("cannot write the orders policy")?;
    let client = connect("orders", &policy, &data, &[]).await?;
    let mut steps = Vec::new();

    let small = call(
        &client,
        "refund",
        json!({"order_id": "ord_1001", "amount": 10}),
    )
    .await
    .context("refund failed")?;
    steps.push(Step {
        name: "small refund",
        ok: status(&small) == "refunded",
        detail: format!(
            "refund 10.00 (medium tier, within budget) → {}",
            status(&small)
        ),
    });

    let approver = tokio::spawn(approve_when_pending(data.clone()));
    let started = std::time::Instant::now();
    let large = call(
        &client,
        "refund",
        json!({"order_id": "ord_1003", "amount": 49}),
    )
    .await
    .context("refund failed")?;
    let approved_by = approver.await.context("approver task failed")??;
    steps.push(Step {
        name: "large refund",
        ok: status(&large) == "refunded",
        detail: format!(
            "refund 49.00 escalated to high, held open, approved by {approved_by} from another process after {:.1} s → {}",
            started.elapsed().as_secs_f64(),
            status(&large)
        ),
    });

    let started = std::time::Instant::now();
    let unanswered = call(
        &client,
        "refund",
        json!({"order_id": "ord_1003", "amount": 30}),
    )
    .await
    .context("refund failed")?;
    steps.push(Step {
        name: "unanswered refund",
        ok: status(&unanswered) == "expired" && unanswered.is_error == Some(true),
        detail: format!(
            "nobody decided; after {:.1} s → {} (\"Do not retry this action\")",
            started.elapsed().as_secs_f64(),
            status(&unanswered)
        ),
    });

    let mut codes = Vec::new();
    for _ in 0..2 {
        let refused = call(
            &client,
            "delete_customer",
            json!({"customer_id": "cus_201"}),
        )
        .await;
        codes.push(match refused {
            Err(ServiceError::McpError(error)) => error.code.0,
            _ => 0,
        });
    }
    steps.push(Step {
        name: "delete_customer",
        ok: codes.iter().all(|c| *c == -32602),
        detail: format!("blocked: refused each time with {codes:?}"),
    });
    client
        .cancel()
        .await
        .context("cannot stop `toolgate serve`")?;
    steps.push(verify_step("orders audit verify", &verify_dir(&data)?));
    Ok(steps)
}

/// Plays the person: waits for the pending approval, then approves it with the real CLI, as a
/// second process, about a second later.
async fn approve_when_pending(data: PathBuf) -> anyhow::Result<String> {
    let exe = std::env::current_exe().context("cannot find the toolgate binary")?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let listed = tokio::process::Command::new(&exe)
            .arg("approvals")
            .arg("--data")
            .arg(&data)
            .args(["list", "--json"])
            .output()
            .await?;
        let rows: Value = serde_json::from_slice(&listed.stdout).unwrap_or(Value::Null);
        let Some(id) = rows.get(0).and_then(|r| r["id"].as_str()) else {
            continue;
        };
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let who = "human:demo-approver";
        let decided = tokio::process::Command::new(&exe)
            .arg("approvals")
            .arg("--data")
            .arg(&data)
            .args([
                "approve",
                id,
                "--as",
                who,
                "--reason",
                "checked with the customer",
            ])
            .output()
            .await?;
        anyhow::ensure!(
            decided.status.success(),
            "approve failed: {}",
            String::from_utf8_lossy(&decided.stderr)
        );
        return Ok(who.to_owned());
    }
    anyhow::bail!("no approval request appeared")
}

/// Seed 004: delete_note is gated; refused with a dry run that leaves the note untouched, then run
/// once the server is restarted with NOTES_ALLOW_GATED set.
async fn notes_scenario(root: &Path) -> anyhow::Result<Vec<Step>> {
    let policy = root.join("notes.toml");
    let data = root.join("notes-data");
    std::fs::write(&policy, NOTES_POLICY).context("cannot write the notes policy")?;
    let note = data.join("notes").join("groceries.md");
    let mut steps = Vec::new();

    let client = connect("notes", &policy, &data, &[("NOTES_ALLOW_GATED", "")]).await?;
    let before = observe(&note);
    let refused = call(&client, "delete_note", json!({"name": "groceries"}))
        .await
        .context("delete_note failed")?;
    let after = observe(&note);
    let would = refused
        .structured_content
        .as_ref()
        .and_then(|v| v["dry_run"]["would"].as_str())
        .unwrap_or("?")
        .to_owned();
    steps.push(Step {
        name: "gated delete_note",
        ok: status(&refused) == "refused" && before == after && after.exists,
        detail: format!("refused, switch off; dry run: {would}; note untouched"),
    });
    client
        .cancel()
        .await
        .context("cannot stop `toolgate serve`")?;

    let client = connect("notes", &policy, &data, &[("NOTES_ALLOW_GATED", "1")]).await?;
    let deleted = call(&client, "delete_note", json!({"name": "groceries"}))
        .await
        .context("delete_note failed")?;
    steps.push(Step {
        name: "switch on",
        ok: deleted.is_error != Some(true) && !observe(&note).exists,
        detail: format!(
            "NOTES_ALLOW_GATED=1: delete_note ran → note exists: {}",
            observe(&note).exists
        ),
    });
    client
        .cancel()
        .await
        .context("cannot stop `toolgate serve`")?;
    steps.push(verify_step("notes audit verify", &verify_dir(&data)?));
    Ok(steps)
}

/// An MCP server that gates nothing (the notes tools under an allow-everything policy), as a
/// third-party server would be.
const UNGATED_NOTES: &str = "version = 2\nname = \"upstream\"\n[defaults]\ntier = \"low\"\n";

/// The gateway's policy for it: only the named tools exist, reads are untrusted, delete is gated.
const GATEWAY_POLICY: &str = r#"version = 2
name = "notes-gateway"
[defaults]
tier = "blocked"
[tools.list_notes]
tier = "low"
[tools.read_note]
tier = "low"
output = "untrusted"
[tools.delete_note]
tier = "low"
gated = true
"#;

/// The gateway: `toolgate proxy` in front of a server that would delete anything it is asked to.
/// The unnamed tool is gone, the delete answers with a dry run and touches nothing, reads arrive
/// labelled as untrusted, and the gateway's own audit chain names the upstream.
async fn gateway_scenario(root: &Path) -> anyhow::Result<Vec<Step>> {
    let upstream_policy = root.join("upstream.toml");
    let policy = root.join("gateway.toml");
    let upstream_data = root.join("upstream-data");
    let data = root.join("gateway-data");
    std::fs::write(&upstream_policy, UNGATED_NOTES).context("cannot write the upstream policy")?;
    std::fs::write(&policy, GATEWAY_POLICY).context("cannot write the gateway policy")?;
    let note = upstream_data.join("notes").join("trip.md");
    let exe = std::env::current_exe().context("cannot find the toolgate binary")?;
    let mut command = tokio::process::Command::new(&exe);
    command
        .arg("proxy")
        .arg("--policy")
        .arg(&policy)
        .arg("--data")
        .arg(&data)
        .arg("--name")
        .arg("notes")
        .arg("--")
        .arg(&exe)
        .arg("serve")
        .arg("--toolset")
        .arg("notes")
        .arg("--policy")
        .arg(&upstream_policy)
        .arg("--data")
        .arg(&upstream_data)
        .env("NOTES_GATEWAY_ALLOW_GATED", "");
    let client = attach(command).await?;
    let mut steps = Vec::new();

    let tools = client
        .peer()
        .list_all_tools()
        .await
        .context("tools/list through the gateway failed")?;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    steps.push(Step {
        name: "gateway tools/list",
        ok: names.len() == 3 && !names.contains(&"search_notes"),
        detail: format!("{names:?}; the upstream's search_notes is not named, so it is not there"),
    });

    let before = observe(&note);
    let refused = call(&client, "delete_note", json!({"name": "trip"}))
        .await
        .context("delete_note through the gateway failed")?;
    let after = observe(&note);
    steps.push(Step {
        name: "gateway gated delete",
        ok: status(&refused) == "refused" && before == after && after.exists,
        detail: "refused with a dry run; the upstream was never asked; note untouched".to_owned(),
    });

    let read = call(&client, "read_note", json!({"name": "trip"}))
        .await
        .context("read_note through the gateway failed")?;
    let text = read
        .content
        .first()
        .and_then(|c| c.as_text())
        .map(|t| t.text.clone())
        .unwrap_or_default();
    steps.push(Step {
        name: "gateway untrusted read",
        ok: read.is_error != Some(true)
            && text.contains("<untrusted-content source=\"upstream notes, tool read_note\">"),
        detail: "the note arrives sanitised, inside a labelled untrusted-content envelope"
            .to_owned(),
    });
    client
        .cancel()
        .await
        .context("cannot stop `toolgate proxy`")?;

    let report = verify_dir(&data)?;
    let audit = std::fs::read_to_string(data.join("audit.jsonl")).unwrap_or_default();
    let named = audit
        .lines()
        .filter(|l| l.contains("\"upstream\":\"notes\""))
        .count();
    let mut step = verify_step("gateway audit verify", &report);
    step.ok &= named >= 2;
    step.detail = format!("{}; {named} records name the upstream", step.detail);
    steps.push(step);
    Ok(steps)
}
