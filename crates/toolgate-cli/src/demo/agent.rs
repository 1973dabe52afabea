//! The demo's seed 003 agent: `toolgate agent` children driven by the scripted model, on the orders
//! shop and its policy. A $10 refund runs; a $49 one waits and is approved by a second process
//! about a second later; one nobody answers expires and is denied; the delete is blocked each
//! time. Then seed 000's execute-verify-stop on the ledger: the agent writes a note, and the gate,
//! not the model, reads the ledger back and says CONTINUE. Each scenario prints the run's event
//! log, as the seed's demo does.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use serde_json::{Value, json};

use super::{ORDERS_POLICY, Step, approve_when_pending, verify_dir, verify_step};

/// The seed's plan: look the order up, refund `amount`, delete the customer.
fn plan(amount: u64) -> Value {
    json!({"steps": [
        {"name": "lookup_order", "arguments": {"order_id": "ord_1001"}},
        {"name": "refund", "arguments": {"order_id": "ord_1001", "amount": amount}},
        {"name": "delete_customer", "arguments": {"email": "sam@example.net"}},
    ]})
}

/// What one run printed: its events, in order.
struct Run {
    events: Vec<Value>,
    code: Option<i32>,
    seconds: f64,
}

impl Run {
    fn named(&self, event: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["event"] == event).collect()
    }

    fn first(&self, event: &str) -> Value {
        self.named(event)
            .first()
            .map_or(Value::Null, |e| (*e).clone())
    }

    /// The event log, as the seed prints it (the time stamps trimmed).
    fn log(&self) -> String {
        self.events
            .iter()
            .map(|e| {
                let mut e = e.clone();
                if let Some(map) = e.as_object_mut() {
                    map.remove("ts");
                }
                format!("\n      {e}")
            })
            .collect()
    }
}

/// The policy of seed 000's verified write.
const LEDGER_VERIFY: &str = include_str!("../../../../policies/ledger-verify.toml");

/// What one run is given: its toolset, policy and plan.
struct Setup<'a> {
    toolset: &'a str,
    policy: &'a str,
    plan: Value,
}

impl Setup<'_> {
    fn orders(amount: u64) -> Self {
        Setup {
            toolset: "orders",
            policy: ORDERS_POLICY,
            plan: plan(amount),
        }
    }
}

/// `toolgate agent run TASK` on a data directory of its own, holding up to 10 s for a person.
async fn run(root: &Path, name: &str, task: &str, setup: Setup<'_>) -> anyhow::Result<Run> {
    let exe = std::env::current_exe().context("cannot find the toolgate binary")?;
    let policy = root.join(format!("{name}-policy.toml"));
    std::fs::write(&policy, setup.policy).context("cannot write the policy")?;
    let plan_file = root.join(format!("{name}-plan.json"));
    std::fs::write(&plan_file, setup.plan.to_string()).context("cannot write the plan")?;
    let started = Instant::now();
    let output = tokio::process::Command::new(exe)
        .args(["agent", "run", task, "--toolset", setup.toolset])
        .args(["--agent", "support-bot"])
        .args(["--wait", "10"])
        .arg("--policy")
        .arg(&policy)
        .arg("--data")
        .arg(root.join(name))
        .arg("--plan")
        .arg(&plan_file)
        .output()
        .await
        .context("cannot run `toolgate agent`")?;
    let events = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    Ok(Run {
        events,
        code: output.status.code(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn blocked(run: &Run) -> bool {
    run.first("tool_blocked")["tool"] == "delete_customer"
}

pub(super) async fn agent_scenario(root: &Path) -> anyhow::Result<Vec<Step>> {
    let root = root.join("agent");
    std::fs::create_dir_all(&root).context("cannot create the agent's directory")?;
    let mut steps = Vec::new();

    let small = run(&root, "small", "Refund $10 on ord_1001", Setup::orders(10)).await?;
    let refund = small
        .named("tool_ran")
        .into_iter()
        .find(|e| e["tool"] == "refund")
        .cloned();
    steps.push(Step {
        name: "agent: $10 refund",
        ok: small.code == Some(0)
            && refund.as_ref().is_some_and(|e| e["tier"] == "medium")
            && blocked(&small),
        detail: format!("runs at medium; the delete is blocked{}", small.log()),
    });

    let approver = tokio::spawn(approve_when_pending(root.join("large")));
    let large = run(&root, "large", "Refund ord_1001 in full", Setup::orders(49)).await?;
    let approved_by = approver.await.context("approver task failed")??;
    let resolved = large.first("approval_resolved");
    steps.push(Step {
        name: "agent: $49 refund",
        ok: large.code == Some(0)
            && resolved["status"] == "approved"
            && resolved["approver"] == approved_by.as_str()
            && large
                .named("tool_ran")
                .iter()
                .any(|e| e["tool"] == "refund")
            && blocked(&large),
        detail: format!(
            "waits; {approved_by} approves from another process; it runs ({:.1} s){}",
            large.seconds,
            large.log()
        ),
    });

    let unanswered = run(
        &root,
        "unanswered",
        "Refund ord_1001 in full",
        Setup::orders(49),
    )
    .await?;
    let finished = unanswered.first("run_finished");
    steps.push(Step {
        name: "agent: unanswered",
        ok: unanswered.code == Some(0)
            && unanswered.first("approval_resolved")["status"] == "expired"
            && !unanswered
                .named("tool_ran")
                .iter()
                .any(|e| e["tool"] == "refund")
            && blocked(&unanswered)
            && finished["output"]
                .as_str()
                .is_some_and(|o| o.contains("not done (expired)")),
        detail: format!(
            "nobody answers; the request expires and counts as denied ({:.1} s){}",
            unanswered.seconds,
            unanswered.log()
        ),
    });
    let note = json!({"request_id": "req-agent-0001", "text": "gate applied"});
    let write = Setup {
        toolset: "ledger",
        policy: LEDGER_VERIFY,
        plan: json!({"steps": [{"name": "write_note", "arguments": note}]}),
    };
    let verified = run(&root, "verified", "Write the note", write).await?;
    steps.push(Step {
        name: "agent: verified write",
        ok: verified.code == Some(0) && verified.first("verify_continue")["tool"] == "write_note",
        detail: format!(
            "write_note, then the gate reads the ledger back: exactly the note → CONTINUE{}",
            verified.log()
        ),
    });
    for name in ["small", "large", "unanswered", "verified"] {
        steps.push(verify_step(
            "agent audit verify",
            &verify_dir(&root.join(name))?,
        ));
    }
    Ok(steps)
}
