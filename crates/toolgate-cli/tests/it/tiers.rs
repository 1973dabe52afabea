//! Risk tiers end to end with the real `toolgate serve`: what runs at once, what waits for a
//! person, what never exists, the kill switch flipped from another process, the gated notes
//! toolset, schema refusals, redaction of secrets, and `toolgate policy check | explain`.

use std::fs::File;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::approvals::{is_error, pending_id, structured, text};
use super::{Observation, Scratch, Server, observe, policy_with, toolgate};

/// The orders policy with a quick pending answer (1 s instead of 10 s) and `changes`.
fn orders_quick(changes: &[(&str, &str)]) -> Scratch {
    let mut all = vec![("approval_wait", "\"1s\"")];
    all.extend_from_slice(changes);
    Scratch::with_policy_text("orders", &policy_with("orders.toml", &all))
}

fn kinds(scratch: &Scratch, kind: &str) -> usize {
    scratch
        .effects()
        .iter()
        .filter(|e| e["kind"] == kind)
        .count()
}

#[test]
fn small_refunds_run_at_once_until_the_medium_budget_is_spent_then_the_next_waits() {
    let scratch = orders_quick(&[("medium_budget", "5")]);
    let mut server = scratch.serve(&[]);
    for amount in 1..=5 {
        let reply = server.call("refund", json!({"order_id": "ord_1003", "amount": amount}));
        assert!(!is_error(&reply), "refund {amount}: {reply}");
        assert_eq!(structured(&reply)["status"], "refunded", "{reply}");
    }
    // Medium runs unattended: nobody was asked.
    let asked = scratch.cli(&["approvals", "list", "--all", "--json"]);
    assert_eq!(String::from_utf8_lossy(&asked.stdout).trim(), "[]");
    // Low calls are not medium ones: they neither use the budget nor wait.
    let lookup = server.call("lookup_order", json!({"order_id": "ord_1003"}));
    assert!(!is_error(&lookup), "{lookup}");

    let sixth = server.call("refund", json!({"order_id": "ord_1003", "amount": 6}));
    let approval = pending_id(&sixth);
    assert!(
        structured(&sixth)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("budget")),
        "{sixth}"
    );
    assert_eq!(structured(&sixth)["tier"], "high", "{sixth}");
    assert_eq!(kinds(&scratch, "refund"), 5);
    let out = scratch.cli(&["approvals", "show", &approval, "--json"]);
    let row: Value = serde_json::from_slice(&out.stdout).expect("show --json");
    assert_eq!(
        (&row["status"], &row["tool"], &row["arguments"]["amount"]),
        (&json!("pending"), &json!("refund"), &json!(6))
    );
    server.close();
}

#[test]
fn the_kill_switch_stops_a_running_servers_next_call_and_off_restores_it() {
    let scratch = Scratch::with_policy("orders.toml");
    let mut server = scratch.serve(&[]);
    let before = server.call("lookup_order", json!({"order_id": "ord_1001"}));
    assert!(!is_error(&before), "{before}");

    let on = scratch.cli(&["killswitch", "on", "--as", "human:oncall", "--json"]);
    assert!(
        on.status.success(),
        "{}",
        String::from_utf8_lossy(&on.stderr)
    );
    // Give the server's audit sweep (every 500 ms) time to see the flip.
    std::thread::sleep(std::time::Duration::from_millis(700));
    let status = scratch.cli(&["killswitch", "status", "--json"]);
    let status: Value = serde_json::from_slice(&status.stdout).expect("status --json");
    assert_eq!(
        (&status["on"], &status["changed_by"]),
        (&json!(true), &json!("human:oncall"))
    );

    // The same process, no restart: its next calls are refused as if the tools did not exist.
    for (tool, arguments) in [
        ("lookup_order", json!({"order_id": "ord_1001"})),
        (
            "add_note",
            json!({"order_id": "ord_1001", "note": "while off"}),
        ),
        ("refund", json!({"order_id": "ord_1002", "amount": 1})),
    ] {
        let reply = server.call(tool, arguments);
        assert_eq!(reply["error"]["code"], -32602, "{tool}: {reply}");
    }
    assert!(scratch.effects().is_empty(), "{:?}", scratch.effects());

    let off = scratch.cli(&["killswitch", "off"]);
    assert!(off.status.success());
    std::thread::sleep(std::time::Duration::from_millis(700));
    let after = server.call("add_note", json!({"order_id": "ord_1001", "note": "back"}));
    assert!(!is_error(&after), "{after}");
    assert_eq!(kinds(&scratch, "note"), 1);
    server.close();

    let refusals = scratch
        .records()
        .into_iter()
        .filter(|r| r["decision"] == "deny" && r["outcome"] == "not_executed")
        .count();
    assert_eq!(refusals, 3, "each refusal is audited");
    let flips: Vec<(String, String)> = scratch
        .records()
        .into_iter()
        .filter(|r| r["decision"] == "control")
        .map(|r| {
            (
                r["outcome"].as_str().unwrap_or("").to_owned(),
                r["changed_by"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let by = |o: &str, who: &str| (o.to_owned(), who.to_owned());
    assert_eq!(
        flips[..2],
        [
            by("switch_on", "human:oncall"),
            by("switch_off", &flips[1].1)
        ],
        "the server audits each flip it sees"
    );
}

#[test]
fn delete_customer_never_exists_and_email_outside_the_domain_waits_for_a_person() {
    let scratch = orders_quick(&[]);
    let mut server = scratch.serve(&[]);
    let names: Vec<String> = server
        .list_tools()
        .iter()
        .map(|t| t["name"].as_str().expect("name").to_owned())
        .collect();
    assert!(!names.contains(&"delete_customer".to_owned()), "{names:?}");
    assert!(names.contains(&"send_email".to_owned()), "{names:?}");

    let unknown = server.call("no_such_tool", json!({}));
    for _ in 0..3 {
        let reply = server.call("delete_customer", json!({"customer_id": "cus_201"}));
        assert_eq!(reply["error"]["code"], -32602, "{reply}");
        // Indistinguishable from a tool that does not exist, apart from the name.
        assert_eq!(
            reply["error"]["message"],
            unknown["error"]["message"]
                .as_str()
                .map(|m| m.replace("no_such_tool", "delete_customer"))
                .expect("message"),
            "{reply} vs {unknown}"
        );
    }

    let mail = |to: &str| json!({"to": to, "subject": "Your order", "body": "It shipped."});
    let internal = server.call("send_email", mail("ops@example.com"));
    assert!(!is_error(&internal), "{internal}");
    assert_eq!(structured(&internal)["status"], "sent");
    assert_eq!(kinds(&scratch, "email"), 1);

    // Addresses that only look internal escalate too; sent together, held side by side.
    let outside = [
        "sam@example.net",
        "ops@example.com.attacker.net",
        "ops@mail.example.com",
        "ops@notexample.com",
    ];
    let calls: Vec<(&str, u64)> = outside
        .iter()
        .map(|to| (*to, server.send_call("send_email", mail(to))))
        .collect();
    for (to, call) in calls {
        let (reply, _) = server.answer(call);
        pending_id(&reply);
        assert_eq!(structured(&reply)["tier"], "high", "{to}: {reply}");
    }
    assert_eq!(kinds(&scratch, "email"), 1);
    server.close();
}

fn observe_notes(dir: &Path) -> Vec<(String, Observation)> {
    let mut notes: Vec<(String, Observation)> = std::fs::read_dir(dir)
        .expect("notes dir")
        .map(|e| {
            let path = e.expect("entry").path();
            (
                path.file_name()
                    .expect("name")
                    .to_string_lossy()
                    .into_owned(),
                observe(&path),
            )
        })
        .collect();
    notes.sort_by(|a, b| a.0.cmp(&b.0));
    notes
}

fn gated_entry(server: &mut Server) -> Value {
    server
        .list_tools()
        .into_iter()
        .find(|t| t["name"] == "delete_note")
        .expect("delete_note is listed")
}

#[test]
fn a_gated_delete_answers_with_a_dry_run_and_touches_nothing_until_its_switch_is_set() {
    let scratch = Scratch::with_policy("notes.toml");
    let notes = scratch.data().join("notes");
    let trip = notes.join("trip.md");
    let mut server = scratch.serve(&[]);
    let listed = gated_entry(&mut server);
    assert!(
        listed["description"]
            .as_str()
            .is_some_and(|d| d.contains("NOTES_ALLOW_GATED")),
        "{listed}"
    );
    assert_eq!(
        listed["_meta"]["io.toolgate/gated"],
        json!({"env": "NOTES_ALLOW_GATED", "enabled": false})
    );
    // Annotations reach the client as the tool wrote them.
    assert_eq!(listed["annotations"]["destructiveHint"], true);

    // An hour in the past, so that any write during the call would show in the mtime.
    File::options()
        .write(true)
        .open(&trip)
        .and_then(|f| f.set_modified(SystemTime::now() - Duration::from_secs(3600)))
        .expect("set mtime");
    let before = observe_notes(&notes);
    let reply = server.call("delete_note", json!({"name": "trip"}));
    assert!(is_error(&reply), "{reply}");
    let refusal = structured(&reply);
    assert_eq!(
        (
            &refusal["status"],
            &refusal["executed"],
            &refusal["gate_env"]
        ),
        (
            &json!("refused"),
            &json!(false),
            &json!("NOTES_ALLOW_GATED")
        ),
        "{reply}"
    );
    let dry_run = &refusal["dry_run"];
    assert!(
        dry_run["would"]
            .as_str()
            .is_some_and(|w| w.contains("trip")),
        "{reply}"
    );
    assert_eq!(dry_run["reversible"], false, "{reply}");
    assert_eq!(dry_run["bytes"], observe(&trip).size, "{reply}");
    assert_eq!(
        observe_notes(&notes),
        before,
        "a refused call touched a note"
    );
    server.close();

    // A value that does not enable leaves it off.
    let mut server = scratch.serve(&[("NOTES_ALLOW_GATED", "0".to_owned())]);
    let reply = server.call("delete_note", json!({"name": "trip"}));
    assert_eq!(structured(&reply)["status"], "refused", "{reply}");
    assert_eq!(observe_notes(&notes), before);
    server.close();

    let mut server = scratch.serve(&[("NOTES_ALLOW_GATED", "Yes".to_owned())]);
    assert_eq!(
        gated_entry(&mut server)["_meta"]["io.toolgate/gated"]["enabled"],
        true
    );
    let reply = server.call("delete_note", json!({"name": "trip"}));
    assert!(!is_error(&reply), "{reply}");
    server.close();
    let expected: Vec<(String, Observation)> = before
        .into_iter()
        .filter(|(name, _)| name != "trip.md")
        .collect();
    assert_eq!(observe_notes(&notes), expected, "exactly trip.md is gone");
}

#[test]
fn an_amount_of_the_wrong_type_is_refused_by_the_schema_and_runs_nothing() {
    let scratch = orders_quick(&[]);
    let mut server = scratch.serve(&[]);
    for amount in [json!("49"), json!(true), json!(null), json!([49])] {
        let reply = server.call("refund", json!({"order_id": "ord_1003", "amount": amount}));
        assert!(is_error(&reply), "{amount}: {reply}");
        assert_eq!(structured(&reply)["status"], "invalid_args", "{reply}");
        assert!(text(&reply).contains("/amount"), "{reply}");
    }
    assert!(scratch.effects().is_empty());

    // Integers are numbers: 20 runs (medium), 49 passes the schema and waits (high).
    let small = server.call("refund", json!({"order_id": "ord_1003", "amount": 20}));
    assert_eq!(structured(&small)["status"], "refunded", "{small}");
    pending_id(&server.call("refund", json!({"order_id": "ord_1003", "amount": 49})));
    assert_eq!(kinds(&scratch, "refund"), 1);
    server.close();
}

/// Serves orders with each of `SECRETS` registered by `--secret-file`, logging to `log` at
/// `level` (the server's default when `None`).
fn serve_with_secrets(scratch: &Scratch, log: &Path, level: Option<&str>) -> Server {
    let mut serve = scratch.serve_command();
    for (i, secret) in SECRETS.iter().enumerate() {
        let file = scratch.path(&format!("secret-{i}"));
        std::fs::write(&file, format!("{secret}\n")).expect("secret file");
        serve.arg("--secret-file").arg(file);
    }
    let env: Vec<(&str, String)> = level
        .map(|l| ("TOOLGATE_LOG", l.to_owned()))
        .into_iter()
        .collect();
    Server::spawn(serve, &env, Stdio::from(File::create(log).expect("log")))
}

/// One credential-shaped value and one that only its registration can catch.
const SECRETS: [&str; 2] = [
    "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
    "correct-horse-battery-staple-4711",
];

/// Adds a note holding both secrets and reads it back; returns everything the client received.
fn note_with_secrets(server: &mut Server) -> String {
    let note = format!(
        "customer pasted {} and said the password is {}",
        SECRETS[0], SECRETS[1]
    );
    let added = server.call("add_note", json!({"order_id": "ord_1001", "note": note}));
    assert!(!is_error(&added), "{added}");
    let reply = server.call("lookup_order", json!({"order_id": "ord_1001"}));
    assert!(!is_error(&reply), "{reply}");
    let shown = structured(&reply)["notes"]
        .as_array()
        .and_then(|n| n.last())
        .and_then(|n| n["note"].as_str())
        .expect("the note")
        .to_owned();
    assert!(shown.contains("[REDACTED]"), "{shown}");
    // A refused argument is not echoed back with the secret in it either.
    let echoed = server.call("lookup_order", json!({"order_id": SECRETS[1]}));
    assert!(is_error(&echoed), "{echoed}");
    format!("{added}{reply}{echoed}")
}

#[test]
fn a_registered_secret_never_reaches_the_client_the_log_or_the_audit() {
    let scratch = Scratch::with_policy("orders.toml");
    let log = scratch.path("serve.log");
    let mut server = serve_with_secrets(&scratch, &log, None);
    let wire = note_with_secrets(&mut server);
    server.close();

    let logged = std::fs::read_to_string(&log).expect("log");
    let audit = std::fs::read_to_string(scratch.audit()).expect("audit");
    assert!(!logged.is_empty());
    for secret in SECRETS {
        assert!(
            !wire.contains(secret),
            "{secret} reached the client: {wire}"
        );
        assert!(!logged.contains(secret), "{secret} reached the log");
        assert!(!audit.contains(secret), "{secret} reached the audit log");
    }
}

#[test]
fn a_registered_secret_never_reaches_a_debug_log() {
    let scratch = Scratch::with_policy("orders.toml");
    let log = scratch.path("serve.log");
    let mut server = serve_with_secrets(&scratch, &log, Some("debug"));
    note_with_secrets(&mut server);
    server.close();
    let logged = std::fs::read_to_string(&log).expect("log");
    for secret in SECRETS {
        let leaks: Vec<&str> = logged.lines().filter(|l| l.contains(secret)).collect();
        assert!(leaks.is_empty(), "{secret} reached the log: {leaks:#?}");
    }
}

fn policy_cli(args: &[&str]) -> (Option<i32>, String, String) {
    let out = toolgate().arg("policy").args(args).output().expect("run");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn policy_check_names_the_broken_field_and_explain_names_the_rule() {
    let scratch = Scratch::with_policy("orders.toml");
    let good = scratch.path("orders.toml");
    let good = good.to_str().expect("utf-8 path");
    let (code, out, err) = policy_cli(&["check", good, "--toolset", "orders"]);
    assert_eq!(code, Some(0), "{out}{err}");

    let text = std::fs::read_to_string(good).expect("policy");
    for (name, from, to, named) in [
        (
            "missing-arg.toml",
            "args.amount > 25",
            "args.amont > 25",
            ["tools.refund.escalate[0]", "amont"],
        ),
        (
            "tier-typo.toml",
            "tier = \"medium\"",
            "tier = \"meduim\"",
            ["tools.refund.tier", "meduim"],
        ),
    ] {
        assert!(text.contains(from), "{from}");
        let bad = scratch.path(name);
        std::fs::write(&bad, text.replacen(from, to, 1)).expect("write");
        let bad = bad.to_str().expect("utf-8 path");
        let (code, _, err) = policy_cli(&["check", bad, "--toolset", "orders"]);
        assert_eq!(code, Some(2), "{name}: {err}");
        for field in named {
            assert!(err.contains(field), "{name}: {field} not in {err}");
        }
    }

    let args = r#"{"order_id":"ord_1001","amount":49}"#;
    let (code, out, err) = policy_cli(&["explain", good, "refund", args, "--toolset", "orders"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("tier: medium -> high"), "{out}");
    assert!(out.contains("rule: tools.refund.escalate[0]"), "{out}");
    let (code, out, err) = policy_cli(&[
        "explain",
        good,
        "refund",
        args,
        "--toolset",
        "orders",
        "--json",
    ]);
    assert_eq!(code, Some(0), "{err}");
    let report: Value = serde_json::from_str(&out).expect("explain --json");
    assert_eq!(
        (
            &report["tier_declared"],
            &report["tier"],
            &report["rule"],
            &report["decision"]
        ),
        (
            &json!("medium"),
            &json!("high"),
            &json!("tools.refund.escalate[0]"),
            &json!("needs_approval")
        ),
        "{report}"
    );
    let (_, out, _) = policy_cli(&[
        "explain",
        good,
        "refund",
        r#"{"order_id":"ord_1001","amount":20}"#,
        "--toolset",
        "orders",
    ]);
    assert!(out.contains("tier: medium -> medium"), "{out}");
}

#[test]
fn a_policy_that_does_not_fit_the_tools_stops_start_up_before_anything_is_written() {
    let text = policy_with("orders.toml", &[]).replacen("args.amount", "args.amont", 1);
    let scratch = Scratch::with_policy_text("orders", &text);
    let out = scratch
        .serve_command()
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tools.refund.escalate[0]"));
    assert!(
        !scratch.data().exists(),
        "a refused start changes nothing on disk"
    );
}
