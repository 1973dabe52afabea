//! Approvals across real processes: `toolgate serve --toolset orders` holds a high-tier call while
//! people decide from other processes (`toolgate approvals ...`), and the guarantees of DESIGN.md §6
//! are checked on what a user can see: the effects log of the shop, the rows the CLI shows, the
//! audit log and its verifier. toolgate.db is only ever read through the CLI.

use std::io::Write;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Scratch, eventually, policy_with, toolgate, verify_json};

/// What a denied or expired call tells the model (DESIGN.md §4).
const DO_NOT_RETRY: &str = "Do not retry this action. Tell the user it needs a person.";

/// The shipped orders policy with another wait and time to live, so that a test gets a pending
/// answer (or an expiry) in about a second instead of the demo's 10 s.
fn orders(wait: &str, ttl: &str) -> Scratch {
    let text = policy_with(
        "orders.toml",
        &[
            ("approval_wait", &format!("{wait:?}")),
            ("approval_ttl", &format!("{ttl:?}")),
        ],
    );
    Scratch::with_policy_text("orders", &text)
}

fn refund(order_id: &str, amount: u64) -> Value {
    json!({"order_id": order_id, "amount": amount})
}

pub(super) fn structured(reply: &Value) -> &Value {
    &reply["result"]["structuredContent"]
}

pub(super) fn text(reply: &Value) -> &str {
    reply["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
}

pub(super) fn is_error(reply: &Value) -> bool {
    reply["result"]["isError"] == true
}

/// The approval id of a `pending_approval` answer.
pub(super) fn pending_id(reply: &Value) -> String {
    assert!(
        is_error(reply),
        "a pending answer is not a success: {reply}"
    );
    assert_eq!(structured(reply)["status"], "pending_approval", "{reply}");
    structured(reply)["approval_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no approval_id: {reply}"))
        .to_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `approvals list --json` (with `--all`, decided rows too).
fn rows(scratch: &Scratch, all: bool) -> Vec<Value> {
    let mut args = vec!["approvals", "list", "--json"];
    if all {
        args.push("--all");
    }
    let out = scratch.cli(&args);
    assert!(out.status.success(), "list: {}", stderr(&out));
    let value: Value = serde_json::from_slice(&out.stdout).expect("list --json is JSON");
    value.as_array().cloned().expect("list --json is an array")
}

/// The first pending row, once the server has opened it.
fn first_pending(scratch: &Scratch) -> Value {
    eventually("a pending approval", Duration::from_secs(10), || {
        rows(scratch, false).into_iter().next()
    })
}

fn show(scratch: &Scratch, id: &str) -> Value {
    let out = scratch.cli(&["approvals", "show", id, "--json"]);
    assert!(out.status.success(), "show {id}: {}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("show --json is JSON")
}

fn approve(scratch: &Scratch, id: &str, who: &str) -> Output {
    scratch.cli(&["approvals", "approve", id, "--as", who])
}

#[test]
fn a_large_refund_waits_runs_once_when_approved_and_a_repeat_replays_it() {
    let scratch = Scratch::with_policy("orders.toml");
    let mut server = scratch.serve(&[]);
    let sent = Instant::now();
    let call = server.send_call("refund", refund("ord_1001", 49));

    let row = first_pending(&scratch);
    let approval = row["id"].as_str().expect("id").to_owned();
    assert_eq!(
        (
            &row["tool"],
            &row["tier"],
            row["arguments"]["amount"].as_f64()
        ),
        (&json!("refund"), &json!("high"), Some(49.0)),
        "{row}"
    );
    assert!(scratch.refunds().is_empty(), "nothing runs while it waits");

    // A person at another terminal, about a second later.
    std::thread::sleep(Duration::from_secs(1).saturating_sub(sent.elapsed()));
    let out = approve(&scratch, &approval, "human:approver");
    assert!(out.status.success(), "approve: {}", stderr(&out));
    let decided = Instant::now();

    let (reply, _) = server.answer(call);
    // The held call notices within a couple of polls (200 ms each), not at the end of its wait.
    assert!(decided.elapsed() < Duration::from_secs(2), "{reply}");
    assert!(!is_error(&reply), "{reply}");
    let result = structured(&reply);
    assert_eq!(
        (result["status"].as_str(), result["amount"].as_f64()),
        (Some("refunded"), Some(49.0)),
        "{reply}"
    );
    let done = scratch.refunds();
    assert_eq!(done.len(), 1, "{done:?}");
    assert_eq!(
        (&done[0]["order_id"], &done[0]["amount_cents"]),
        (&json!("ord_1001"), &json!(4900))
    );
    assert_eq!(done[0]["by"], row["requester"]);

    // The same call again: the stored result, at once, and no second refund.
    let started = Instant::now();
    let again = server.call("refund", refund("ord_1001", 49));
    assert!(started.elapsed() < Duration::from_secs(2), "{again}");
    assert!(!is_error(&again), "{again}");
    assert_eq!(structured(&again)["refund_id"], result["refund_id"]);
    assert_eq!(scratch.refunds().len(), 1);
    assert_eq!(show(&scratch, &approval)["used"], true);
    server.close();
}

fn decider(scratch: &Scratch, approval: &str, who: &str, approves: bool) -> Child {
    let mut command = toolgate();
    command.args(["approvals", "--data"]).arg(scratch.data());
    if approves {
        command.args(["approve", approval, "--as", who]);
    } else {
        command.args(["deny", approval, "--as", who, "--reason", "not this one"]);
    }
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a decider")
}

#[test]
fn of_many_concurrent_deciders_exactly_one_wins_and_the_others_are_told_it_was_decided() {
    let scratch = orders("1s", "60s");
    let mut server = scratch.serve(&[]);
    let rounds = [2_usize, 8, 64];
    // One pending approval per round: different amounts are different calls.
    let calls: Vec<u64> = (0..rounds.len())
        .map(|i| server.send_call("refund", refund("ord_1003", 26 + i as u64)))
        .collect();
    let approvals: Vec<String> = calls
        .iter()
        .map(|&call| pending_id(&server.answer(call).0))
        .collect();

    for (&n, approval) in rounds.iter().zip(&approvals) {
        // Started together, half approving, half denying, each as someone else.
        let deciders: Vec<(String, bool, Child)> = (0..n)
            .map(|i| {
                let who = format!("human:decider-{n}-{i}");
                let approves = i % 2 == 0;
                let child = decider(&scratch, approval, &who, approves);
                (who, approves, child)
            })
            .collect();
        let mut winners = Vec::new();
        for (who, approves, child) in deciders {
            let out = child.wait_with_output().expect("decider exits");
            match out.status.code() {
                Some(0) => winners.push((who, approves)),
                Some(1) => assert!(
                    stderr(&out).contains(&format!("approval {approval} was already")),
                    "{n} deciders, {who}: {}",
                    stderr(&out)
                ),
                other => panic!("{n} deciders, {who}: exit {other:?}: {}", stderr(&out)),
            }
        }
        assert_eq!(winners.len(), 1, "{n} deciders: winners {winners:?}");
        let (winner, approved) = &winners[0];
        let row = show(&scratch, approval);
        assert_eq!(row["decided_by"], json!(winner), "{n} deciders: {row}");
        let status = if *approved { "approved" } else { "denied" };
        assert_eq!(row["status"], status, "{n} deciders: {row}");
        assert_eq!(row["used"], false, "{row}");
    }
    assert!(scratch.refunds().is_empty());
    server.close();
}

#[test]
fn the_requester_cannot_approve_its_own_request() {
    let scratch = orders("1s", "30s");
    let mut server = scratch.serve(&[]);
    let approval = pending_id(&server.call("refund", refund("ord_1001", 49)));
    let requester = show(&scratch, &approval)["requester"]
        .as_str()
        .expect("requester")
        .to_owned();
    assert!(requester.starts_with("local:"), "{requester}");

    let out = approve(&scratch, &approval, &requester);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot be decided by the principal that requested it"),
        "{}",
        stderr(&out)
    );
    let row = show(&scratch, &approval);
    assert_eq!(
        (&row["status"], &row["decided_by"]),
        (&json!("pending"), &Value::Null)
    );
    // Asking again still waits on the same row: nothing was approved.
    assert_eq!(
        pending_id(&server.call("refund", refund("ord_1001", 49))),
        approval
    );
    assert!(scratch.refunds().is_empty());
    server.close();
}

#[test]
fn a_decision_after_expiry_changes_nothing_and_the_held_call_was_told_not_to_retry() {
    let scratch = orders("10s", "2s");
    let mut server = scratch.serve(&[]);
    let sent = Instant::now();
    let call = server.send_call("refund", refund("ord_1001", 49));
    let approval = first_pending(&scratch)["id"]
        .as_str()
        .expect("id")
        .to_owned();

    let (reply, _) = server.answer(call);
    // Expiry ends the hold (2 s), long before the 10 s wait would.
    assert!(sent.elapsed() < Duration::from_secs(5), "{reply}");
    assert!(is_error(&reply), "{reply}");
    assert!(text(&reply).contains(DO_NOT_RETRY), "{reply}");
    assert_eq!(
        (
            &structured(&reply)["status"],
            &structured(&reply)["approval_id"]
        ),
        (&json!("expired"), &json!(approval))
    );

    let late = approve(&scratch, &approval, "human:late");
    assert_eq!(late.status.code(), Some(1), "{}", stderr(&late));
    assert!(stderr(&late).contains("expired"), "{}", stderr(&late));
    let row = show(&scratch, &approval);
    assert_eq!(
        (&row["status"], &row["decided_by"], &row["used"]),
        (&json!("expired"), &Value::Null, &json!(false))
    );
    assert!(scratch.refunds().is_empty());
    server.close();
}

#[test]
fn an_approval_is_bound_to_the_exact_arguments_it_was_given_for() {
    let scratch = orders("1s", "30s");
    let mut server = scratch.serve(&[]);
    let approved = pending_id(&server.call("refund", refund("ord_1003", 49)));
    let out = approve(&scratch, &approved, "human:approver");
    assert!(out.status.success(), "{}", stderr(&out));

    // A hundred times the amount: refused before any decision is looked at.
    let huge = server.call("refund", refund("ord_1003", 4900));
    assert!(is_error(&huge), "{huge}");
    assert_eq!(structured(&huge)["status"], "invalid_args", "{huge}");
    assert!(text(&huge).contains("/amount"), "{huge}");
    // Another amount, or the same amount on another order: each waits for its own approval.
    let more = server.send_call("refund", refund("ord_1003", 50));
    let other = server.send_call("refund", refund("ord_1001", 49));
    let more = pending_id(&server.answer(more).0);
    let other = pending_id(&server.answer(other).0);
    assert_ne!(more, approved);
    assert_ne!(other, approved);
    assert_ne!(more, other);

    assert!(scratch.refunds().is_empty(), "{:?}", scratch.effects());
    let row = show(&scratch, &approved);
    assert_eq!(
        (&row["status"], &row["used"]),
        (&json!("approved"), &json!(false)),
        "the approval of 49 is still unused: {row}"
    );
    server.close();
}

#[test]
fn a_second_identical_call_while_pending_attaches_to_the_same_row() {
    let scratch = orders("1s", "30s");
    let mut server = scratch.serve(&[]);
    let first = server.send_call("refund", refund("ord_1001", 49));
    let second = server.send_call("refund", refund("ord_1001", 49));
    let first = pending_id(&server.answer(first).0);
    let second = pending_id(&server.answer(second).0);
    assert_eq!(first, second);
    let third = pending_id(&server.call("refund", refund("ord_1001", 49)));
    assert_eq!(third, first);
    let all = rows(&scratch, true);
    assert_eq!(all.len(), 1, "{all:?}");

    let out = approve(&scratch, &first, "human:approver");
    assert!(out.status.success(), "{}", stderr(&out));
    let ran = server.call("refund", refund("ord_1001", 49));
    let replayed = server.call("refund", refund("ord_1001", 49));
    assert!(!is_error(&ran) && !is_error(&replayed), "{ran} {replayed}");
    assert_eq!(
        structured(&replayed)["refund_id"],
        structured(&ran)["refund_id"]
    );
    assert_eq!(scratch.refunds().len(), 1);
    assert_eq!(rows(&scratch, true).len(), 1);
    server.close();
}

/// Sends `copies` identical large refunds, spread over one poll interval of the held calls (so
/// that whichever copy runs the call, others look at the row while it runs), approves the one row
/// they share, and returns every answer.
fn approve_held_copies(copies: usize) -> (Scratch, Vec<Value>) {
    let scratch = orders("10s", "30s");
    let mut server = scratch.serve(&[]);
    let first = server.send_call("refund", refund("ord_1001", 49));
    let approval = first_pending(&scratch)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let spacing = Duration::from_millis(200) / u32::try_from(copies).expect("few copies");
    let mut calls = vec![first];
    for _ in 1..copies {
        std::thread::sleep(spacing);
        calls.push(server.send_call("refund", refund("ord_1001", 49)));
    }
    // Let the last copies reach the queue and start waiting beside the first.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(rows(&scratch, true).len(), 1, "one row for every copy");

    let out = approve(&scratch, &approval, "human:approver");
    assert!(out.status.success(), "{}", stderr(&out));
    let answers = calls.iter().map(|&call| server.answer(call).0).collect();
    server.close();
    (scratch, answers)
}

#[test]
fn held_copies_of_one_approved_call_run_it_exactly_once() {
    let (scratch, answers) = approve_held_copies(2);
    assert_eq!(scratch.refunds().len(), 1, "one execution for one approval");
    let refunded: Vec<&Value> = answers
        .iter()
        .filter(|a| !is_error(a))
        .map(|a| &structured(a)["refund_id"])
        .collect();
    assert!(!refunded.is_empty(), "{answers:#?}");
    // No copy may report a refund other than the one that happened.
    assert!(refunded.iter().all(|id| *id == refunded[0]), "{answers:#?}");
}

#[test]
fn every_held_copy_of_an_approved_call_gets_its_result() {
    let (scratch, answers) = approve_held_copies(40);
    assert_eq!(scratch.refunds().len(), 1, "one execution for one approval");
    let in_doubt: Vec<&Value> = answers.iter().filter(|a| is_error(a)).collect();
    assert!(
        in_doubt.is_empty(),
        "{} of {} copies were told the outcome is unknown, e.g. {}",
        in_doubt.len(),
        answers.len(),
        in_doubt[0]
    );
    let first = &structured(&answers[0])["refund_id"];
    assert!(
        answers.iter().all(|a| structured(a)["refund_id"] == *first),
        "{answers:#?}"
    );
}

/// The audit records of one approval, by outcome.
fn approval_records<'a>(records: &'a [Value], approval: &str, outcome: &str) -> Vec<&'a Value> {
    records
        .iter()
        .filter(|r| r["approval_id"] == approval && r["outcome"] == outcome)
        .collect()
}

#[test]
fn the_audit_log_records_the_request_the_decision_and_the_execution_and_verifies() {
    let scratch = Scratch::with_policy("orders.toml");
    let mut server = scratch.serve(&[]);

    let call = server.send_call("refund", refund("ord_1001", 49));
    let approved = first_pending(&scratch)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let out = scratch.cli(&[
        "approvals",
        "approve",
        &approved,
        "--as",
        "human:auditor",
        "--reason",
        "receipt checked",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let decided = Instant::now();
    // The server writes the decision to its log itself (the decider cannot: the log is locked).
    eventually("the approved record", Duration::from_secs(3), || {
        (!approval_records(&scratch.records(), &approved, "approved").is_empty()).then_some(())
    });
    assert!(decided.elapsed() < Duration::from_millis(1500));
    let (reply, _) = server.answer(call);
    assert!(!is_error(&reply), "{reply}");

    let call = server.send_call("refund", refund("ord_1003", 30));
    let denied = eventually("a second pending approval", Duration::from_secs(10), || {
        rows(&scratch, false)
            .into_iter()
            .find(|r| r["id"] != approved)
    })["id"]
        .as_str()
        .expect("id")
        .to_owned();
    let out = scratch.cli(&[
        "approvals",
        "deny",
        &denied,
        "--as",
        "human:auditor",
        "--reason",
        "no receipt",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let decided = Instant::now();
    eventually("the denied record", Duration::from_secs(3), || {
        approval_records(&scratch.records(), &denied, "denied")
            .iter()
            .any(|r| r["method"] == "approvals/resolve")
            .then_some(())
    });
    assert!(decided.elapsed() < Duration::from_millis(1500));
    let (reply, _) = server.answer(call);
    assert!(text(&reply).contains(DO_NOT_RETRY), "{reply}");
    server.close();

    let records = scratch.records();
    let requested = approval_records(&records, &approved, "requested");
    assert_eq!(requested.len(), 1, "{records:#?}");
    assert_eq!(
        (
            &requested[0]["decision"],
            &requested[0]["name"],
            &requested[0]["tier"]
        ),
        (&json!("approval"), &json!("refund"), &json!("high"))
    );
    let yes = approval_records(&records, &approved, "approved");
    assert_eq!(yes.len(), 1, "{records:#?}");
    assert_eq!(
        (
            &yes[0]["decision"],
            &yes[0]["approver"],
            &yes[0]["reason"],
            &yes[0]["requester"]
        ),
        (
            &json!("approval"),
            &json!("human:auditor"),
            &json!("receipt checked"),
            &show(&scratch, &approved)["requester"]
        )
    );
    let committed: Vec<&Value> = records
        .iter()
        .filter(|r| r["decision"] == "allow" && r["outcome"] == "committed")
        .collect();
    assert_eq!(committed.len(), 1, "{records:#?}");
    assert_eq!(committed[0]["name"], "refund");
    assert_eq!(committed[0]["args_digest"], requested[0]["args_digest"]);
    assert_eq!(approval_records(&records, &denied, "requested").len(), 1);
    let no: Vec<&Value> = approval_records(&records, &denied, "denied")
        .into_iter()
        .filter(|r| r["method"] == "approvals/resolve")
        .collect();
    assert_eq!(no.len(), 1, "{records:#?}");
    assert_eq!(
        (&no[0]["approver"], &no[0]["reason"]),
        (&json!("human:auditor"), &json!("no receipt"))
    );

    let (code, report) = verify_json(&scratch.audit());
    assert_eq!(
        (code, report["intact"].as_bool()),
        (0, Some(true)),
        "{report}"
    );
    assert_eq!(report["records"].as_u64(), Some(records.len() as u64));
}

#[test]
fn a_held_call_that_asked_for_progress_gets_notifications_before_its_answer() {
    let scratch = Scratch::with_policy("orders.toml");
    let mut server = scratch.serve(&[]);
    let call = server.send_call_with_meta(
        "refund",
        refund("ord_1001", 49),
        json!({"progressToken": "refund-49"}),
    );
    let approval = first_pending(&scratch)["id"]
        .as_str()
        .expect("id")
        .to_owned();
    // Progress comes about once a second while the call is held.
    std::thread::sleep(Duration::from_millis(2200));
    let out = approve(&scratch, &approval, "human:approver");
    assert!(out.status.success(), "{}", stderr(&out));

    let (reply, notifications) = server.answer(call);
    assert!(!is_error(&reply), "{reply}");
    assert!(!notifications.is_empty(), "no progress before the answer");
    let mut last = f64::MIN;
    for note in &notifications {
        assert_eq!(note["method"], "notifications/progress", "{note}");
        let params = &note["params"];
        assert_eq!(params["progressToken"], "refund-49", "{note}");
        let progress = params["progress"].as_f64().expect("progress");
        assert!(progress > last, "progress must increase: {notifications:?}");
        last = progress;
        assert!(
            params["message"]
                .as_str()
                .is_some_and(|m| m.contains(&approval)),
            "{note}"
        );
    }
    server.close();
}

/// `_meta` of a 2026-07-28 request whose client declared the tasks extension.
fn with_tasks() -> Value {
    json!({"io.modelcontextprotocol/clientCapabilities": {
        "extensions": {"io.modelcontextprotocol/tasks": {}},
    }})
}

/// `tasks/get` (or `tasks/cancel`) of `task`: the whole response.
fn task_request(server: &mut super::Server, method: &str, task: &str) -> Value {
    let id = server.send(method, json!({"taskId": task, "_meta": with_tasks()}));
    server.answer(id).0
}

#[test]
fn a_held_call_becomes_a_durable_task_that_survives_a_restart_and_runs_once_when_approved() {
    // The wait is long on purpose: a caller that takes tasks must not be held for it.
    let scratch = orders("60s", "5m");
    let mut server = scratch.serve(&[]);
    let discover = server.send("server/discover", json!({}));
    let (discovered, _) = server.answer(discover);
    assert!(
        discovered["result"]["capabilities"]["extensions"]
            .get("io.modelcontextprotocol/tasks")
            .is_some(),
        "the extension is declared: {discovered}"
    );

    let asked = Instant::now();
    let call = server.send_call_with_meta("refund", refund("ord_1001", 49), with_tasks());
    let (created, _) = server.answer(call);
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "not held: {created:?}"
    );
    let task = &created["result"];
    assert_eq!(
        (task["resultType"].as_str(), task["status"].as_str()),
        (Some("task"), Some("working")),
        "{created}"
    );
    let task_id = task["taskId"].as_str().expect("taskId").to_owned();
    let approval = first_pending(&scratch)["id"].as_str().unwrap().to_owned();
    assert!(
        task["statusMessage"]
            .as_str()
            .unwrap_or_default()
            .contains(&approval),
        "{created}"
    );
    let working = task_request(&mut server, "tasks/get", &task_id);
    assert_eq!(working["result"]["status"], "working", "{working}");
    assert!(scratch.refunds().is_empty());

    // A crash, and a new server on the same directory: the task is still there.
    server.kill();
    let mut server = scratch.serve(&[]);
    let after_restart = task_request(&mut server, "tasks/get", &task_id);
    assert_eq!(
        after_restart["result"]["status"], "working",
        "{after_restart}"
    );
    let unknown = task_request(
        &mut server,
        "tasks/get",
        "tgt_00000000000000000000000000000000",
    );
    assert_eq!(unknown["error"]["code"], -32602, "{unknown}");

    // Approved by a person; the next poll runs the call, and every poll after replays it.
    let out = approve(&scratch, &approval, "human:approver");
    assert!(out.status.success(), "approve: {}", stderr(&out));
    let done = task_request(&mut server, "tasks/get", &task_id);
    let result = &done["result"];
    assert_eq!(result["status"], "completed", "{done}");
    assert_eq!(
        result["result"]["structuredContent"]["status"], "refunded",
        "{done}"
    );
    let again = task_request(&mut server, "tasks/get", &task_id);
    assert_eq!(again["result"]["result"], result["result"], "{again}");
    assert_eq!(scratch.refunds().len(), 1, "exactly one refund");

    // A cancelled task runs nothing, even when its request is approved afterwards.
    let call = server.send_call_with_meta("refund", refund("ord_1005", 30), with_tasks());
    let (second, _) = server.answer(call);
    let second_id = second["result"]["taskId"].as_str().unwrap().to_owned();
    let cancelled = task_request(&mut server, "tasks/cancel", &second_id);
    assert!(cancelled.get("error").is_none(), "{cancelled}");
    let pending = rows(&scratch, false);
    let second_approval = pending[0]["id"].as_str().unwrap().to_owned();
    assert!(
        approve(&scratch, &second_approval, "human:approver")
            .status
            .success()
    );
    let read = task_request(&mut server, "tasks/get", &second_id);
    assert_eq!(read["result"]["status"], "cancelled", "{read}");
    assert_eq!(scratch.refunds().len(), 1);

    // A denial is the call's answer: completed, an error result that says not to retry.
    let call = server.send_call_with_meta("refund", refund("ord_1003", 40), with_tasks());
    let (third, _) = server.answer(call);
    let third_id = third["result"]["taskId"].as_str().unwrap().to_owned();
    let third_approval = rows(&scratch, false)[0]["id"].as_str().unwrap().to_owned();
    let out = scratch.cli(&[
        "approvals",
        "deny",
        &third_approval,
        "--as",
        "human:approver",
        "--reason",
        "not today",
    ]);
    assert!(out.status.success(), "deny: {}", stderr(&out));
    let denied = task_request(&mut server, "tasks/get", &third_id);
    assert_eq!(denied["result"]["status"], "completed", "{denied}");
    let answer = &denied["result"]["result"];
    assert_eq!(answer["isError"], true, "{denied}");
    assert_eq!(
        answer["structuredContent"]["reason"], "not today",
        "{denied}"
    );
    assert!(answer.to_string().contains(DO_NOT_RETRY), "{denied}");
    assert_eq!(scratch.refunds().len(), 1);

    server.close();
    let records = scratch.records();
    let ran: Vec<&Value> = records
        .iter()
        .filter(|r| r["task_id"] == task_id.as_str() && r["outcome"] == "committed")
        .collect();
    assert_eq!(
        ran.len(),
        1,
        "the run is recorded once, under its task: {records:?}"
    );
    let (code, report) = verify_json(&scratch.audit());
    assert_eq!(code, 0, "{report}");
}

#[test]
fn a_held_legacy_caller_that_opens_links_is_sent_the_console_page_of_its_request() {
    let scratch = orders("30s", "5m");
    let mut command = scratch.serve_command();
    command.args(["--console-url", "http://127.0.0.1:8710/console/"]);
    let mut server = super::Server::start(command, &[]);
    let line = |server: &mut super::Server, message: Value| {
        let stdin = server.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{message}").expect("write");
        stdin.flush().expect("flush");
    };
    line(
        &mut server,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {"elicitation": {"form": {}, "url": {}}},
            "clientInfo": {"name": "url-elicitation-test", "version": "1"},
        }}),
    );
    let (init, _) = server.answer(1);
    assert!(init.get("result").is_some(), "{init}");
    line(
        &mut server,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    line(
        &mut server,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
               "params": {"name": "refund", "arguments": refund("ord_1001", 49)}}),
    );

    // The server asks the client to open the request's page, on the held call's stream.
    let question = loop {
        let message = server.read();
        if message["method"] == "elicitation/create" {
            break message;
        }
        assert!(
            message["id"] != 2,
            "answered before the question: {message}"
        );
    };
    let approval = first_pending(&scratch)["id"].as_str().unwrap().to_owned();
    let params = &question["params"];
    assert_eq!(params["mode"], "url", "{question}");
    assert_eq!(
        params["url"],
        format!("http://127.0.0.1:8710/console/approvals/{approval}"),
        "{question}"
    );
    assert_eq!(params["elicitationId"], approval.as_str(), "{question}");
    line(
        &mut server,
        json!({"jsonrpc": "2.0", "id": question["id"], "result": {"action": "accept"}}),
    );

    // The call still waits for the decision, and runs once after it.
    std::thread::sleep(Duration::from_millis(500));
    assert!(scratch.refunds().is_empty());
    let out = approve(&scratch, &approval, "human:approver");
    assert!(out.status.success(), "approve: {}", stderr(&out));
    let (reply, _) = server.answer(2);
    assert!(!is_error(&reply), "{reply}");
    assert_eq!(scratch.refunds().len(), 1);
    server.close();
}
