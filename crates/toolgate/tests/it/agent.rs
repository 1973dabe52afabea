//! The agent loop (seed 003) on the real orders toolset, a real data directory and the real gate:
//! the seed's guarantees (`test_gates.py`) and the issue's, each asserted on what a user relies on
//! (the shop's own effects log, the approval rows, the audit chain, the run's events).

use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tempfile::TempDir;
use toolgate::agent::scripted::Scripted;
use toolgate::agent::{Agent, DO_NOT_RETRY, Ending, EventLog, Message, Report, Settings};
use toolgate::server::Gate;
use toolgate_core::policy::Policy;
use toolgate_core::principal::Principal;
use toolgate_core::redact::Redactor;
use toolgate_core::secret::Secret;
use toolgate_core::time::now_ms;
use toolgate_store::approval::{ApprovalStore, Verdict};
use toolgate_store::journal::Durability;
use toolgate_store::runs::{RunStatus, RunStore};
use toolgate_store::state::StateStore;

/// The demo policy of seed 003, with a short expiry so a test can see it.
const POLICY: &str = r#"
version = 2
name = "orders"
[defaults]
tier = "blocked"
approval_ttl = "2s"
medium_budget = 5
medium_window = "1h"
[tools.lookup_order]
tier = "low"
[tools.add_note]
tier = "medium"
[tools.refund]
tier = "medium"
escalate = [{ when = "args.amount > 25", tier = "high" }]
[tools.delete_customer]
tier = "blocked"
"#;

/// A buffer the run's events are written to, read back as JSON lines.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Lines {
    fn events(&self) -> Vec<Value> {
        String::from_utf8(self.0.lock().unwrap().clone())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn named(&self, event: &str) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e["event"] == event)
            .collect()
    }
}

/// One agent process's view of a data directory: its gate, the orders shop, its events.
struct Setup {
    dir: TempDir,
    /// Secrets the gate's redactor knows (as `--secret-file` gives them).
    secrets: Vec<String>,
}

impl Setup {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            secrets: Vec::new(),
        }
    }

    /// An agent named `name` with `plan` and `settings`, as one process would open it (call
    /// again for "another process" once the first is dropped: the journal is exclusive).
    async fn agent(
        &self,
        name: &str,
        plan: Value,
        settings: Settings,
        policy: &str,
    ) -> (Agent, Lines) {
        self.agent_on("orders", name, plan, settings, policy).await
    }

    /// [`Setup::agent`] on the built-in toolset `toolset`.
    async fn agent_on(
        &self,
        toolset: &str,
        name: &str,
        plan: Value,
        settings: Settings,
        policy: &str,
    ) -> (Agent, Lines) {
        // The previous "process" (a dropped agent) lets go of the journal's lock when its writer
        // thread ends, a moment after the drop.
        let mut tries = 0;
        let gate = loop {
            let policy = Policy::from_bytes(policy.as_bytes()).unwrap();
            match Gate::open(policy, self.dir.path(), Durability::Synced).await {
                Ok(gate) => break gate,
                Err(_) if tries < 100 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(error) => panic!("{error}"),
            }
        }
        .with_principal(Principal::new(Agent::principal(name)))
        .with_redactor(Redactor::new(
            self.secrets
                .iter()
                .map(|s| Secret::new(s.clone()))
                .collect(),
        ));
        let toolset = toolgate_demos::by_name(
            toolset,
            self.dir.path(),
            &toolgate_demos::Options::default(),
        )
        .unwrap();
        let model = Scripted::from_json(&plan.to_string()).unwrap();
        let lines = Lines::default();
        let agent = Agent::new(
            gate,
            Arc::from(toolset),
            Arc::new(model),
            self.dir.path(),
            EventLog::new(lines.clone()),
        )
        .unwrap()
        .with_settings(settings);
        (agent, lines)
    }

    async fn bot(&self, plan: Value) -> (Agent, Lines) {
        self.agent("support-bot", plan, Settings::default(), POLICY)
            .await
    }

    /// The shop's own record of what happened: one line per effect.
    fn effects(&self) -> Vec<Value> {
        effects(self.dir.path())
    }

    async fn approvals(&self) -> ApprovalStore {
        ApprovalStore::open(self.dir.path()).await.unwrap()
    }

    async fn decide(&self, id: &str, who: &str, verdict: Verdict) -> bool {
        self.approvals()
            .await
            .decide(id, who, verdict, Some("checked order history"), now_ms())
            .await
            .is_ok()
    }

    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("audit.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

fn effects(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("orders").join("orders-effects.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The seed's plan: look the order up, refund `amount`, delete the customer.
fn plan(order: &str, amount: u64) -> Value {
    json!({"steps": [
        {"name": "lookup_order", "arguments": {"order_id": order}},
        {"name": "refund", "arguments": {"order_id": order, "amount": amount}},
        {"name": "delete_customer", "arguments": {"email": "sam@example.net"}},
    ]})
}

fn paused(report: &Report) -> String {
    match &report.ending {
        Ending::Paused { approval_id } => approval_id.clone(),
        other => panic!("expected a pause, got {other:?}"),
    }
}

/// The answers the model was given, in order.
async fn tool_answers(setup: &Setup, run_id: &str) -> Vec<Value> {
    let run = RunStore::open(setup.dir.path())
        .await
        .unwrap()
        .get(run_id)
        .await
        .unwrap()
        .unwrap();
    let messages: Vec<Message> = serde_json::from_value(run.state["messages"].clone()).unwrap();
    messages
        .into_iter()
        .filter_map(|m| match m {
            Message::Tool { content, .. } => Some(content),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_small_refund_runs_and_the_delete_is_blocked() {
    let setup = Setup::new();
    let (agent, lines) = setup.bot(plan("ord_1001", 10)).await;
    let report = agent.start("Refund $10 on ord_1001").await.unwrap();
    assert!(matches!(&report.ending, Ending::Finished(text) if text.contains("not done")));
    let refunds = setup.effects();
    assert_eq!(refunds.len(), 1);
    assert_eq!(refunds[0]["amount_cents"], 1000);
    assert_eq!(refunds[0]["by"], "agent:support-bot");
    let ran = lines.named("tool_ran");
    assert_eq!(ran[1]["tool"], "refund");
    assert_eq!(ran[1]["tier"], "medium");
    let blocked = lines.named("tool_blocked");
    assert_eq!(blocked[0]["tool"], "delete_customer");
    // Every event carries the run's id, and the run ends with `run_finished`.
    let events = lines.events();
    assert!(events.iter().all(|e| e["run_id"] == report.run_id.as_str()));
    assert_eq!(events.last().unwrap()["event"], "run_finished");
    // The gate audited every call under the agent's principal.
    let calls: Vec<Value> = setup
        .audit()
        .into_iter()
        .filter(|r| r["method"] == "tools/call")
        .collect();
    assert_eq!(calls.len(), 3);
    assert_eq!(calls[2]["decision"], "deny");
}

#[tokio::test]
async fn a_large_refund_pauses_and_runs_once_after_another_process_approves() {
    let setup = Setup::new();
    let run_id = {
        let (agent, lines) = setup.bot(plan("ord_1001", 49)).await;
        let report = agent.start("Refund ord_1001 in full").await.unwrap();
        let approval = paused(&report);
        assert_eq!(
            lines.named("approval_requested")[0]["request_id"],
            approval.as_str()
        );
        assert!(setup.effects().is_empty(), "nothing paid while it waits");
        // The agent can never approve its own request; a person can.
        assert!(
            !setup
                .decide(&approval, "agent:support-bot", Verdict::Approve)
                .await
        );
        assert!(
            setup
                .decide(&approval, "human:dana", Verdict::Approve)
                .await
        );
        report.run_id
    };
    let (agent, lines) = setup.bot(plan("ord_1001", 49)).await;
    let report = agent.resume(&run_id).await.unwrap();
    assert!(matches!(report.ending, Ending::Finished(_)));
    let resolved = &lines.named("approval_resolved")[0];
    assert_eq!(resolved["status"], "approved");
    assert_eq!(resolved["approver"], "human:dana");
    assert_eq!(resolved["reason"], "checked order history");
    assert_eq!(
        setup.effects().len(),
        1,
        "the approved refund ran exactly once"
    );
    assert_eq!(setup.effects()[0]["amount_cents"], 4900);
    // Over: resuming again changes nothing.
    assert!(agent.resume(&run_id).await.is_err());
    assert_eq!(setup.effects().len(), 1);
    // The decision is in the chain before the call it allowed.
    let audit = setup.audit();
    let decided = audit
        .iter()
        .position(|r| r["outcome"] == "approved")
        .unwrap();
    let ran = audit
        .iter()
        .position(|r| r["name"] == "refund" && r["decision"] == "allow")
        .unwrap();
    assert!(decided < ran);
}

#[tokio::test]
async fn an_unanswered_request_expires_and_counts_as_denied() {
    let setup = Setup::new();
    let (agent, lines) = setup.bot(plan("ord_1001", 49)).await;
    let report = agent.start("Refund ord_1001 in full").await.unwrap();
    let approval = paused(&report);
    tokio::time::sleep(Duration::from_millis(2_300)).await;
    // A late click changes nothing.
    assert!(
        !setup
            .decide(&approval, "human:dana", Verdict::Approve)
            .await
    );
    let report = agent.resume(&report.run_id).await.unwrap();
    assert!(matches!(report.ending, Ending::Finished(_)));
    assert_eq!(lines.named("approval_resolved")[0]["status"], "expired");
    let answers = tool_answers(&setup, &report.run_id).await;
    assert_eq!(answers[1]["ran"], false);
    assert_eq!(answers[1]["approval"], "expired");
    assert_eq!(answers[1]["note"], DO_NOT_RETRY);
    assert!(setup.effects().is_empty());
}

#[tokio::test]
async fn an_approval_for_49_does_not_run_4900() {
    let setup = Setup::new();
    let (agent, _) = setup.bot(plan("ord_1003", 49)).await;
    let first = agent.start("Refund 49").await.unwrap();
    let approval = paused(&first);
    assert!(
        setup
            .decide(&approval, "human:dana", Verdict::Approve)
            .await
    );
    drop(agent);
    // Another run asks for 4900 on the same order: past the schema's maximum, refused before
    // any risk is weighed (no request opened, nothing run).
    let (agent, lines) = setup.bot(plan("ord_1003", 4900)).await;
    let second = agent.start("Refund 4900").await.unwrap();
    assert!(matches!(second.ending, Ending::Finished(_)));
    assert_eq!(lines.named("tool_invalid_args")[0]["tool"], "refund");
    drop(agent);
    // And 99, which the schema allows: a request of its own; the approval for 49 is not its.
    let (agent, lines) = setup.bot(plan("ord_1003", 99)).await;
    let third = agent.start("Refund 99").await.unwrap();
    let other = paused(&third);
    assert_ne!(other, approval);
    assert_eq!(lines.named("approval_requested")[0]["args"]["amount"], 99);
    assert!(
        setup.effects().is_empty(),
        "nothing ran under the approval for 49"
    );
}

#[tokio::test]
async fn max_steps_ends_the_run_with_run_aborted() {
    let setup = Setup::new();
    let looping: Vec<Value> = (0..10)
        .map(|_| json!({"name": "lookup_order", "arguments": {"order_id": "ord_1001"}}))
        .collect();
    let settings = Settings {
        max_steps: 3,
        ..Settings::default()
    };
    let (agent, lines) = setup
        .agent("support-bot", json!({"steps": looping}), settings, POLICY)
        .await;
    let report = agent.start("loop").await.unwrap();
    assert_eq!(report.ending, Ending::Aborted("max_steps".to_owned()));
    assert_eq!(report.steps, 3);
    assert_eq!(lines.named("tool_ran").len(), 3);
    assert_eq!(lines.named("run_aborted")[0]["reason"], "max_steps");
    let run = agent.runs().get(&report.run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Aborted);
}

#[tokio::test]
async fn junk_arguments_are_fed_back_and_never_reach_an_approver() {
    let setup = Setup::new();
    let plan = json!({"steps": [
        // Invalid JSON, as a model sends it.
        {"name": "refund", "arguments": "{\"order_id\": \"ord_1001\", \"amount\": 49"},
        // Valid JSON of the wrong type: validation comes before risk.
        {"name": "refund", "arguments": {"order_id": "ord_1001", "amount": "49"}},
        // An integer where the schema says number is fine (low tier: $10).
        {"name": "refund", "arguments": {"order_id": "ord_1001", "amount": 10}},
    ]});
    let (agent, lines) = setup.bot(plan).await;
    let report = agent.start("refund").await.unwrap();
    assert!(matches!(report.ending, Ending::Finished(_)));
    let invalid = lines.named("tool_invalid_args");
    assert_eq!(invalid.len(), 2);
    assert!(
        invalid[0]["error"]
            .as_str()
            .unwrap()
            .contains("not valid JSON")
    );
    let answers = tool_answers(&setup, &report.run_id).await;
    assert_eq!(answers[0]["ran"], false);
    assert_eq!(answers[1]["status"], "invalid_args");
    assert_eq!(answers[2]["ran"], true);
    let approvals = setup.approvals().await;
    assert!(
        approvals.list(true, now_ms()).await.unwrap().is_empty(),
        "no approver saw junk"
    );
    assert!(
        setup
            .audit()
            .iter()
            .any(|r| r["outcome"] == "invalid_args" && r["rule"] == "agent.arguments")
    );
}

#[tokio::test]
async fn a_spent_medium_budget_escalates_to_a_person() {
    let setup = Setup::new();
    let policy = POLICY.replace("medium_budget = 5", "medium_budget = 2");
    let notes: Vec<Value> = (0..3)
        .map(|i| json!({"name": "add_note", "arguments": {"order_id": "ord_1001", "note": format!("note {i}")}}))
        .collect();
    let (agent, lines) = setup
        .agent(
            "support-bot",
            json!({"steps": notes}),
            Settings::default(),
            &policy,
        )
        .await;
    let report = agent.start("notes").await.unwrap();
    paused(&report);
    assert_eq!(lines.named("tool_ran").len(), 2);
    let asked = &lines.named("approval_requested")[0];
    assert_eq!(asked["tool"], "add_note");
    assert_eq!(asked["tier"], "high");
    assert_eq!(setup.effects().len(), 2);
}

#[tokio::test]
async fn the_kill_switch_for_one_agent_blocks_every_tier_for_it_alone() {
    let setup = Setup::new();
    let state = StateStore::open(setup.dir.path()).await.unwrap();
    state
        .set_principal_killswitch("agent:support-bot", true, "human:op", now_ms())
        .await
        .unwrap();
    let lookup =
        json!({"steps": [{"name": "lookup_order", "arguments": {"order_id": "ord_1001"}}]});
    let (agent, lines) = setup.bot(lookup.clone()).await;
    agent.start("look").await.unwrap();
    let blocked = lines.named("tool_blocked");
    assert_eq!(blocked[0]["rule"], "killswitch.principal");
    assert!(lines.named("tool_ran").is_empty(), "even the low tier");
    drop(agent);
    let (other, lines) = setup
        .agent("other-bot", lookup, Settings::default(), POLICY)
        .await;
    other.start("look").await.unwrap();
    assert_eq!(
        lines.named("tool_ran").len(),
        1,
        "another agent is not switched off"
    );
}

#[tokio::test]
async fn approval_requests_are_capped_per_run_and_a_repeat_attaches_to_its_request() {
    let setup = Setup::new();
    let plan = json!({"steps": [
        {"name": "refund", "arguments": {"order_id": "ord_1003", "amount": 49}},
        // The model tries again after the denial: the same request answers, no new one.
        {"name": "refund", "arguments": {"order_id": "ord_1003", "amount": 49}},
        // Another high call past the cap: no request is opened.
        {"name": "refund", "arguments": {"order_id": "ord_1005", "amount": 60}},
    ]});
    let settings = Settings {
        max_pending: 1,
        ..Settings::default()
    };
    let (agent, lines) = setup.agent("support-bot", plan, settings, POLICY).await;
    let report = agent.start("refunds").await.unwrap();
    let approval = paused(&report);
    assert!(setup.decide(&approval, "human:dana", Verdict::Deny).await);
    let report = agent.resume(&report.run_id).await.unwrap();
    assert!(matches!(report.ending, Ending::Finished(_)));
    assert_eq!(lines.named("approval_requested").len(), 1);
    let answers = tool_answers(&setup, &report.run_id).await;
    assert_eq!(answers[0]["approval"], "denied");
    assert_eq!(
        answers[1]["approval"], "denied",
        "the repeat got the same decision"
    );
    assert!(
        answers[2]["error"]
            .as_str()
            .unwrap()
            .contains("the most one run may ask for")
    );
    let rows = setup.approvals().await.list(true, now_ms()).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(setup.effects().is_empty());
}

#[tokio::test]
async fn wait_holds_the_run_until_a_person_decides() {
    let setup = Setup::new();
    let settings = Settings {
        wait: Some(Duration::from_secs(10)),
        ..Settings::default()
    };
    let (agent, lines) = setup
        .agent("support-bot", plan("ord_1001", 49), settings, POLICY)
        .await;
    let approvals = setup.approvals().await;
    let decider = tokio::spawn(async move {
        loop {
            let pending = approvals.list(false, now_ms()).await.unwrap();
            if let Some(row) = pending.first() {
                approvals
                    .decide(&row.id, "human:dana", Verdict::Approve, None, now_ms())
                    .await
                    .unwrap();
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let report = agent.start("Refund ord_1001 in full").await.unwrap();
    decider.await.unwrap();
    assert!(matches!(report.ending, Ending::Finished(_)));
    assert_eq!(lines.named("approval_resolved")[0]["status"], "approved");
    assert_eq!(setup.effects().len(), 1);
}

const LEDGER_VERIFY: &str = include_str!("../../../../policies/ledger-verify.toml");

fn write_then_read(text: &str) -> Value {
    json!({"steps": [
        {"name": "write_note", "arguments": {"request_id": "req-agent-0001", "text": text}},
        {"name": "read_ledger", "arguments": {}},
    ]})
}

#[tokio::test]
async fn a_write_the_ledger_holds_is_verified_and_the_run_goes_on() {
    let setup = Setup::new();
    let (agent, lines) = setup
        .agent_on(
            "ledger",
            "scribe",
            write_then_read("gate applied"),
            Settings::default(),
            LEDGER_VERIFY,
        )
        .await;
    let report = agent.start("write the note").await.unwrap();
    assert!(matches!(report.ending, Ending::Finished(_)), "{report:?}");
    assert_eq!(lines.named("verify_continue")[0]["tool"], "write_note");
    assert_eq!(
        tool_answers(&setup, &report.run_id).await[0]["verified"],
        true
    );
    assert!(
        setup
            .audit()
            .iter()
            .any(|r| r["decision"] == "verify" && r["outcome"] == "continue")
    );
}

#[tokio::test]
async fn a_write_that_does_not_hold_stops_the_run_whatever_the_model_planned() {
    let setup = Setup::new();
    // The condition expects a text the note never has: the observed state diverges.
    let policy = LEDGER_VERIFY.replace("n.text == args.text", "n.text == args.text + '!'");
    let (agent, lines) = setup
        .agent_on(
            "ledger",
            "scribe",
            write_then_read("gate applied"),
            Settings::default(),
            &policy,
        )
        .await;
    let report = agent.start("write the note").await.unwrap();
    assert_eq!(report.ending, Ending::Aborted("verify_stop".to_owned()));
    assert_eq!(lines.named("verify_stop")[0]["tool"], "write_note");
    assert_eq!(lines.named("run_aborted")[0]["reason"], "verify_stop");
    // The model's next step (read_ledger) was never asked for: the harness stopped the run.
    let ran: Vec<Value> = lines
        .named("tool_ran")
        .into_iter()
        .map(|e| e["tool"].clone())
        .collect();
    assert_eq!(ran, [json!("write_note")]);
    let answer = &tool_answers(&setup, &report.run_id).await[0];
    assert_eq!(
        (answer["ran"].clone(), answer["verified"].clone()),
        (json!(true), json!(false))
    );
    let run = agent.runs().get(&report.run_id).await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Aborted);
}

#[tokio::test]
async fn wrong_types_are_refused_before_risk_and_an_integer_is_a_number() {
    // Seed 003's test_validation_rejects_wrong_types, through the agent: each bad call is fed
    // back as invalid arguments, none reaches the tier decision (no approval is asked for, though
    // amount 49 would be high), and 49 for a number field is fine.
    let setup = Setup::new();
    let bad = [
        json!({"order_id": "ord_1001"}),
        json!({"order_id": "ord_1001", "amount": "49"}),
        json!({"order_id": "ord_1001", "amount": true}),
        json!({"order_id": "ord_1001", "amount": 1.0, "x": 1}),
    ];
    let mut steps: Vec<Value> = bad
        .iter()
        .map(|arguments| json!({"name": "refund", "arguments": arguments}))
        .collect();
    steps.push(json!({"name": "refund", "arguments": {"order_id": "ord_1001", "amount": 10}}));
    let settings = Settings {
        max_steps: 6,
        ..Settings::default()
    };
    let (agent, lines) = setup
        .agent("support-bot", json!({"steps": steps}), settings, POLICY)
        .await;
    let report = agent.start("refund").await.unwrap();
    assert!(matches!(report.ending, Ending::Finished(_)));
    assert_eq!(lines.named("tool_invalid_args").len(), 4);
    assert!(lines.named("approval_requested").is_empty());
    let answers = tool_answers(&setup, &report.run_id).await;
    assert!(
        answers[..4]
            .iter()
            .all(|a| a["status"] == "invalid_args" && a["ran"] == false)
    );
    assert_eq!(answers[4]["ran"], true);
    assert_eq!(setup.effects().len(), 1);
}

#[tokio::test]
async fn a_secret_in_the_arguments_never_reaches_the_event_log() {
    let mut setup = Setup::new();
    let secret = "sk-live-7d1f0c9a4b2e8f6a1c3d5e7f9a0b2c4d";
    setup.secrets.push(secret.to_owned());
    let plan = json!({"steps": [
        {"name": "send_email", "arguments": {"to": "ops@example.com", "subject": "key", "body": format!("the key is {secret}")}},
        {"name": "delete_customer", "arguments": {"email": secret}},
    ]});
    let (agent, lines) = setup.bot(plan).await;
    agent.start(&format!("mail {secret}")).await.unwrap();
    let log = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    assert!(log.contains("tool_blocked"), "{log}");
    assert!(!log.contains(secret), "{log}");
}
