//! `toolgate agent` as a user runs it: real processes on one data directory. A run pauses for a
//! person and the process exits; a person approves from another process; the resumed run makes
//! the call once. A run killed (SIGKILL) at each stage of a call resumes with no duplicate effect
//! and an audit chain that verifies.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{toolgate, verify_json};

const ORDERS_POLICY: &str = include_str!("../../../../policies/orders.toml");

/// A data directory, the orders policy and a plan file.
struct Shop {
    dir: tempfile::TempDir,
}

impl Shop {
    fn new(plan: &Value) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("orders.toml"), ORDERS_POLICY).expect("policy");
        std::fs::write(dir.path().join("plan.json"), plan.to_string()).expect("plan");
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `toolgate agent SUB ARG` with the agent's flags.
    fn agent(&self, sub: &str, arg: &str) -> Command {
        let mut command = toolgate();
        command
            .args([
                "agent",
                sub,
                arg,
                "--toolset",
                "orders",
                "--agent",
                "support-bot",
            ])
            .arg("--policy")
            .arg(self.path("orders.toml"))
            .arg("--data")
            .arg(self.path("data"))
            .arg("--plan")
            .arg(self.path("plan.json"));
        command
    }

    fn refunds(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("data/orders/orders-effects.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str::<Value>(l).expect("effect"))
            .filter(|e| e["kind"] == "refund")
            .collect()
    }

    fn audit(&self) -> PathBuf {
        self.path("data/audit.jsonl")
    }
}

fn events(output: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("an event line"))
        .collect()
}

fn named<'a>(events: &'a [Value], event: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["event"] == event).collect()
}

fn lookup_refund_delete(amount: u64) -> Value {
    json!({"steps": [
        {"name": "lookup_order", "arguments": {"order_id": "ord_1001"}},
        {"name": "refund", "arguments": {"order_id": "ord_1001", "amount": amount}},
        {"name": "delete_customer", "arguments": {"email": "sam@example.net"}},
    ]})
}

#[test]
fn a_paused_run_exits_and_runs_the_call_once_after_another_process_approves() {
    let shop = Shop::new(&lookup_refund_delete(49));
    let first = shop
        .agent("run", "Refund ord_1001 in full")
        .output()
        .expect("run");
    assert_eq!(first.status.code(), Some(3), "paused: {first:?}");
    let events = events(&first);
    let run_id = events[0]["run_id"].as_str().expect("run id").to_owned();
    let approval = named(&events, "approval_requested")[0]["request_id"]
        .as_str()
        .expect("approval id")
        .to_owned();
    let stderr = String::from_utf8_lossy(&first.stderr);
    assert!(stderr.contains(&approval), "{stderr}");
    assert!(shop.refunds().is_empty());

    // The agent cannot approve itself, from any process.
    let selfish = toolgate()
        .args([
            "approvals",
            "approve",
            &approval,
            "--as",
            "agent:support-bot",
            "--data",
        ])
        .arg(shop.path("data"))
        .output()
        .expect("approve");
    assert_ne!(selfish.status.code(), Some(0));
    let approve = toolgate()
        .args([
            "approvals",
            "approve",
            &approval,
            "--as",
            "human:dana",
            "--data",
        ])
        .arg(shop.path("data"))
        .output()
        .expect("approve");
    assert_eq!(approve.status.code(), Some(0), "{approve:?}");

    let runs = toolgate()
        .args(["agent", "runs", "--json", "--data"])
        .arg(shop.path("data"))
        .output()
        .expect("runs");
    let listed: Value = serde_json::from_slice(&runs.stdout).expect("one run");
    assert_eq!(
        (listed["status"].as_str(), listed["approval_id"].as_str()),
        (Some("paused"), Some(approval.as_str()))
    );

    let resumed = shop.agent("resume", &run_id).output().expect("resume");
    assert_eq!(resumed.status.code(), Some(0), "{resumed:?}");
    let events = self::events(&resumed);
    assert_eq!(
        named(&events, "approval_resolved")[0]["approver"],
        "human:dana"
    );
    assert_eq!(named(&events, "tool_ran")[0]["tool"], "refund");
    assert_eq!(shop.refunds().len(), 1);
    assert_eq!(shop.refunds()[0]["amount_cents"], 4900);

    let again = shop.agent("resume", &run_id).output().expect("resume");
    assert_eq!(again.status.code(), Some(2), "a finished run cannot go on");
    assert_eq!(shop.refunds().len(), 1);
    let (code, report) = verify_json(&shop.audit());
    assert_eq!(code, 0, "{report}");
}

/// Starts a run armed to stop at `point` after it was passed `skip` times, kills it there, and
/// returns the run's id and the data directory's shop.
fn killed_at(point: &str, skip: u32) -> (Shop, String) {
    let shop = Shop::new(&lookup_refund_delete(10));
    let marker = shop.path("reached");
    let mut child = shop
        .agent("run", "Refund $10 on ord_1001")
        .env(
            "FAILPOINTS",
            format!("{point}={skip}*off->return({})", marker.display()),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !marker.exists() {
        assert!(Instant::now() < deadline, "{point}: never reached");
        assert!(
            child.try_wait().expect("wait").is_none(),
            "{point}: exited first"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    let stdout = child.stdout.take().expect("stdout");
    let first = BufReader::new(stdout)
        .lines()
        .next()
        .expect("an event")
        .expect("line");
    let started: Value = serde_json::from_str(&first).expect("run_started");
    let run_id = started["run_id"].as_str().expect("run id").to_owned();
    (shop, run_id)
}

fn resume_after_crash(point: &str, skip: u32) -> Vec<Value> {
    let (shop, run_id) = killed_at(point, skip);
    let resumed = shop.agent("resume", &run_id).output().expect("resume");
    assert_eq!(resumed.status.code(), Some(0), "{point}: {resumed:?}");
    let events = events(&resumed);
    assert!(
        named(&events, "run_finished").len() == 1,
        "{point}: {events:?}"
    );
    assert_eq!(shop.refunds().len(), 1, "{point}: exactly one refund");
    let (code, report) = verify_json(&shop.audit());
    assert_eq!(code, 0, "{point}: {report}");
    assert_journal_untouched(&shop.path("data"));
    events
}

/// The journal's lock was released by the kill and taken again cleanly.
fn assert_journal_untouched(data: &Path) {
    assert!(data.join("audit.jsonl").exists());
}

#[test]
fn killed_after_the_turn_is_saved_the_resumed_run_makes_the_call_once() {
    let events = resume_after_crash("agent.turn_saved", 1);
    assert_eq!(named(&events, "tool_ran")[0]["tool"], "refund");
}

#[test]
fn killed_before_the_call_is_recorded_the_resumed_run_replays_it() {
    // The refund's effect is durable in the shop and its key settled with its answer; its audit
    // record is not written. The resumed run's call replays the answer, never runs it again.
    let events = resume_after_crash("journal.before_append", 1);
    let ran = named(&events, "tool_ran");
    assert_eq!(
        (&ran[0]["tool"], &ran[0]["replay"]),
        (&json!("refund"), &json!(true))
    );
}

#[test]
fn killed_after_the_record_before_the_answer_the_resumed_run_replays_it() {
    let events = resume_after_crash("journal.before_answer", 1);
    let ran = named(&events, "tool_ran");
    assert_eq!(
        (&ran[0]["tool"], &ran[0]["replay"]),
        (&json!("refund"), &json!(true))
    );
}

#[test]
fn killed_after_the_answer_before_the_run_saved_it_the_call_is_replayed() {
    let events = resume_after_crash("agent.call_answered", 1);
    let ran = named(&events, "tool_ran");
    assert_eq!(ran[0]["tool"], "refund");
    assert_eq!(ran[0]["replay"], true);
}

#[test]
fn an_agent_in_front_of_an_upstream_server_is_gated_like_a_proxy_client() {
    // The upstream is a real MCP server process (the testbed), started by the agent as `proxy`
    // starts it; its own log says which calls reached it.
    let scratch = tempfile::tempdir().expect("temp dir");
    let up = scratch.path().join("upstream");
    let policy = scratch.path().join("policy.toml");
    std::fs::write(
        &policy,
        "version = 2\nname = \"records\"\n[defaults]\ntier = \"blocked\"\n\
         [tools.write_record]\ntier = \"low\"\n[tools.delete_record]\ntier = \"blocked\"\n",
    )
    .expect("policy");
    let plan = scratch.path().join("plan.json");
    let steps = json!({"steps": [
        {"name": "write_record", "arguments": {"id": "r-1", "value": "kept"}},
        {"name": "delete_record", "arguments": {"id": "r-1"}},
    ]});
    std::fs::write(&plan, steps.to_string()).expect("plan");
    let data = scratch.path().join("data");
    let output = toolgate()
        .args([
            "agent",
            "run",
            "keep r-1",
            "--agent",
            "archivist",
            "--name",
            "testbed",
        ])
        .arg("--policy")
        .arg(&policy)
        .arg("--data")
        .arg(&data)
        .arg("--plan")
        .arg(&plan)
        .arg("--")
        .args(super::gateway::testbed(&up, "both"))
        .output()
        .expect("agent");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let events = events(&output);
    assert_eq!(named(&events, "tool_ran")[0]["tool"], "write_record");
    assert_eq!(named(&events, "tool_blocked")[0]["tool"], "delete_record");
    assert_eq!(super::gateway::calls_of(&up, "write_record"), 1);
    assert_eq!(
        super::gateway::calls_of(&up, "delete_record"),
        0,
        "never reached the upstream"
    );
    let audit = std::fs::read_to_string(data.join("audit.jsonl")).expect("audit");
    let written: Value = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("record"))
        .find(|r| r["name"] == "write_record")
        .expect("write_record's record");
    assert_eq!(written["upstream"], "testbed");
    assert_eq!(verify_json(&data.join("audit.jsonl")).0, 0);
}

#[test]
fn only_the_named_approvers_decide_and_two_must_agree() {
    let shop = Shop::new(&lookup_refund_delete(49));
    let policy = ORDERS_POLICY.replace(
        "[tools.refund]\n",
        "[tools.refund]\napprovers = [\"user:dana\", \"user:lee\"]\napprovals_required = 2\n",
    );
    assert_ne!(policy, ORDERS_POLICY);
    std::fs::write(shop.path("orders.toml"), policy).expect("policy");
    let first = shop
        .agent("run", "Refund ord_1001 in full")
        .output()
        .expect("run");
    assert_eq!(first.status.code(), Some(3), "{first:?}");
    let events = events(&first);
    let run_id = events[0]["run_id"].as_str().expect("run id").to_owned();
    let approval = named(&events, "approval_requested")[0]["request_id"]
        .as_str()
        .expect("approval id")
        .to_owned();
    let decide = |who: &str| {
        toolgate()
            .args(["approvals", "approve", &approval, "--as", who, "--data"])
            .arg(shop.path("data"))
            .output()
            .expect("approve")
    };
    let eve = decide("human:eve");
    assert_eq!(eve.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&eve.stderr).contains("may not decide"),
        "{eve:?}"
    );
    assert_eq!(decide("human:dana").status.code(), Some(0));
    let shown = toolgate()
        .args(["approvals", "show", &approval, "--json", "--data"])
        .arg(shop.path("data"))
        .output()
        .expect("show");
    let shown: Value = serde_json::from_slice(&shown.stdout).expect("one approval");
    assert_eq!(shown["status"], "pending");
    assert_eq!(shown["approvals_required"], 2);
    assert_eq!(shown["votes"][0]["decider"], "human:dana");
    assert_eq!(shown["votes"][0]["verdict"], "approve");
    // One of two: the run is still waiting.
    let waiting = shop.agent("resume", &run_id).output().expect("resume");
    assert_eq!(waiting.status.code(), Some(3), "{waiting:?}");
    assert!(shop.refunds().is_empty());
    let again = decide("human:dana");
    assert_eq!(
        again.status.code(),
        Some(1),
        "the same approver counts once"
    );
    assert_eq!(decide("human:lee").status.code(), Some(0));
    let resumed = shop.agent("resume", &run_id).output().expect("resume");
    assert_eq!(resumed.status.code(), Some(0), "{resumed:?}");
    let resolved = named(&self::events(&resumed), "approval_resolved")[0].clone();
    assert_eq!(resolved["approver"], "human:dana, human:lee");
    assert_eq!(shop.refunds().len(), 1);
}
