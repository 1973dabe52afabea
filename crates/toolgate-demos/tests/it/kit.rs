//! Seed 004's behaviours, against a server built on the kit's public API only (the probe): each
//! test names the guarantee a kit user relies on.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Probe, audit, structured};

/// `wipe` ran (its handler's answer) or was refused with its dry run.
fn wiped(answer: &Value) -> bool {
    match structured(answer)["status"].as_str() {
        Some("ok") => {
            assert_eq!(structured(answer)["data"]["wiped"], "/srv", "{answer}");
            true
        }
        Some("refused") => {
            assert_eq!(structured(answer)["reason"], "gated", "{answer}");
            assert_eq!(structured(answer)["dry_run"]["would"], "wipe /srv");
            assert_eq!(structured(answer)["executed"], false);
            false
        }
        _ => panic!("neither ran nor refused: {answer}"),
    }
}

#[tokio::test]
async fn a_gated_tool_opens_only_for_an_enabling_value_of_its_variable() {
    let accepted = [
        "1", "true", "TRUE", "Yes", "on", "Enable", "ENABLED", "allow", " yes ",
    ];
    let rejected = [
        "0", "", "no", "off", "false", "2", "enabled!", "allowed", "y",
    ];
    for (value, opens) in accepted
        .iter()
        .map(|v| (Some(*v), true))
        .chain(rejected.iter().map(|v| (Some(*v), false)))
        .chain([(None, false)])
    {
        let env: Vec<(&str, &str)> = value
            .map(|v| ("PROBE_ALLOW_GATED", v))
            .into_iter()
            .collect();
        let mut probe = Probe::start(&env).await;
        let answer = probe.call(1, "wipe", json!({"target": "/srv"})).await;
        assert_eq!(
            wiped(&answer),
            opens,
            "PROBE_ALLOW_GATED={value:?}: {answer}"
        );
        let (_, status, _, data) = probe.finish().await;
        assert!(status.success());
        let outcomes: Vec<Value> = audit(&data)
            .iter()
            .map(|r| json!([r["decision"], r["outcome"]]))
            .collect();
        let expected = if opens {
            json!([["allow", "committed"]])
        } else {
            json!([["refuse", "dry_run"]])
        };
        assert_eq!(Value::Array(outcomes), expected, "{value:?}");
    }
}

#[tokio::test]
async fn a_tool_with_its_own_gate_variable_ignores_the_servers() {
    let mut probe = Probe::start(&[("PROBE_ALLOW_GATED", "1")]).await;
    let refused = probe.call(1, "own_switch", json!({})).await;
    assert_eq!(structured(&refused)["status"], "refused", "{refused}");
    assert_eq!(
        structured(&refused)["enable_with"]["env_var"],
        "PROBE_OWN_SWITCH"
    );
    probe.finish().await;

    let mut probe = Probe::start(&[("PROBE_OWN_SWITCH", "on")]).await;
    let ran = probe.call(1, "own_switch", json!({})).await;
    assert_eq!(structured(&ran)["data"], "switched", "{ran}");
    assert!(!wiped(
        &probe.call(2, "wipe", json!({"target": "/srv"})).await
    ));
    probe.finish().await;
}

#[tokio::test]
async fn a_gated_tool_without_a_dry_run_says_no_exact_preview_is_available() {
    let mut probe = Probe::start(&[]).await;
    let answer = probe.call(1, "zap", json!({"what": "cache"})).await;
    let refusal = structured(&answer);
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert_eq!(refusal["status"], "refused");
    assert_eq!(refusal["dry_run"]["preview_available"], false, "{answer}");
    assert!(
        refusal["dry_run"]["note"]
            .as_str()
            .is_some_and(|n| n.contains("No exact preview is available")),
        "{answer}"
    );
    assert_eq!(refusal["dry_run"]["arguments"], json!({"what": "cache"}));
    assert_eq!(refusal["arguments_received"], json!({"what": "cache"}));
    let (_, _, _, data) = probe.finish().await;
    assert_eq!(audit(&data)[0]["outcome"], "dry_run");
}

#[tokio::test]
async fn a_verified_empty_result_never_looks_like_a_failed_lookup() {
    let mut probe = Probe::start(&[]).await;
    let empty = probe.call(1, "found_nothing", json!({})).await;
    assert_ne!(empty["result"]["isError"], true, "{empty}");
    let body = structured(&empty);
    assert_eq!(
        (
            &body["ok"],
            &body["status"],
            &body["verified_empty"],
            &body["count"]
        ),
        (&json!(true), &json!("empty"), &json!(true), &json!(0)),
        "{empty}"
    );
    assert_eq!(
        (&body["what"], &body["source"]),
        (&json!("invoices"), &json!("billing db"))
    );

    let failed = probe.call(2, "lookup_failed", json!({})).await;
    assert_eq!(failed["result"]["isError"], true, "{failed}");
    assert_eq!(structured(&failed)["code"], "COLLECT_FAILED");
    assert_eq!(structured(&failed)["executed"], true);
    let reason = structured(&failed)["error"].as_str().unwrap_or_default();
    assert!(reason.contains("billing api returned 503"), "{failed}");
    assert!(structured(&failed).get("items").is_none(), "{failed}");

    let nothing = probe.call(3, "lookup_no_value", json!({})).await;
    assert_eq!(nothing["result"]["isError"], true, "{nothing}");
    assert_eq!(structured(&nothing)["code"], "COLLECT_NO_VALUE");
    let (_, _, _, data) = probe.finish().await;
    let outcomes: Vec<Value> = audit(&data)
        .into_iter()
        .map(|r| r["outcome"].clone())
        .collect();
    assert_eq!(outcomes, ["committed", "failed", "failed"]);
}

#[tokio::test]
async fn a_loaded_secret_is_redacted_in_log_lines_errors_and_stray_output() {
    let secrets = tempfile::tempdir().expect("secret dir");
    let secret = "s3cr3t-billing-key-7f1d9a";
    let file = secrets.path().join("billing-key");
    std::fs::write(&file, format!("{secret}\n")).expect("secret file");
    let file = file.display().to_string();
    let mut probe = Probe::start(&[("PROBE_SECRET_FILE", file.as_str())]).await;
    let leak = probe.call(1, "leak", json!({})).await;
    assert_eq!(leak["result"]["isError"], true, "{leak}");
    assert_eq!(structured(&leak)["code"], "UPSTREAM_DOWN");
    let text = leak.to_string();
    assert!(!text.contains(secret), "{text}");
    assert!(
        text.contains("the billing api refused key [REDACTED]"),
        "{text}"
    );
    probe.call(2, "stray", json!({})).await;
    let (rest, _, stderr, data) = probe.finish().await;
    assert!(rest.is_empty(), "{rest:?}");
    assert!(!stderr.contains(secret), "{stderr}");
    assert!(stderr.contains("using the key [REDACTED]"), "{stderr}");
    assert!(stderr.contains("key=[REDACTED]"), "{stderr}");
    let log = std::fs::read_to_string(data.path().join("audit.jsonl")).expect("audit");
    assert!(!log.contains(secret));
}

#[tokio::test]
async fn stray_stdout_writes_go_to_stderr_and_the_stream_stays_valid() {
    let mut probe = Probe::start(&[]).await;
    // `Probe::next` fails the test on any stdout line that is not JSON.
    let stray = probe.call(1, "stray", json!({})).await;
    assert_eq!(structured(&stray)["data"], "wrote to stdout", "{stray}");
    let echo = probe.call(2, "echo", json!({"n": 2})).await;
    assert_eq!(structured(&echo)["data"], json!({"n": 2}), "{echo}");
    let (rest, status, stderr, _) = probe.finish().await;
    assert!(rest.is_empty(), "{rest:?}");
    assert!(status.success());
    assert!(
        stderr.contains("a write to stdout was moved to stderr")
            && stderr.contains(r#"stray output {"jsonrpc":"2.0"}"#),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_hung_handler_times_out_while_other_tools_keep_answering() {
    let mut probe = Probe::start(&[]).await;
    let started = Instant::now();
    probe.call_async(1, "hang", json!({})).await;
    let echo = probe.call(2, "echo", json!({"n": 2})).await;
    assert_eq!(structured(&echo)["data"], json!({"n": 2}), "{echo}");
    assert!(
        probe.seen.iter().all(|m| m["id"] != 1),
        "the hung call answered before the other one"
    );
    let hung = probe.answer(1).await;
    let waited = started.elapsed();
    assert_eq!(hung["result"]["isError"], true, "{hung}");
    assert_eq!(structured(&hung)["timeout_ms"], 300, "{hung}");
    assert_eq!(structured(&hung)["executed"], "unknown", "{hung}");
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    let (_, _, _, data) = probe.finish().await;
    let records = audit(&data);
    let hang = records
        .iter()
        .find(|r| r["name"] == "hang")
        .expect("a record of the hung call");
    assert_eq!(hang["outcome"], "timeout");
}

#[tokio::test]
async fn a_cancelled_call_gets_no_response_and_stops_its_handler() {
    let mut probe = Probe::start(&[]).await;
    probe.call_async(1, "sleep", json!({"ms": 3000})).await;
    // Let the call reach its handler before cancelling it.
    let echo = probe.call(2, "echo", json!({})).await;
    assert!(echo["result"].is_object(), "{echo}");
    probe
        .send(&json!({
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": 1, "reason": "the user changed their mind"},
        }))
        .await;
    let after = probe.call(3, "echo", json!({})).await;
    assert!(after["result"].is_object(), "{after}");
    let started = Instant::now();
    let (rest, status, _, data) = probe.finish().await;
    // Had the handler kept sleeping, it would have answered within the shutdown grace.
    assert!(rest.iter().all(|m| m["id"] != 1), "{rest:?}");
    assert!(status.success());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let sleep = audit(&data)
        .into_iter()
        .find(|r| r["name"] == "sleep")
        .expect("a record of the cancelled call");
    assert_eq!(sleep["outcome"], "cancelled");
}

#[tokio::test]
async fn calls_received_before_stdin_closes_still_get_their_answers() {
    let mut probe = Probe::start(&[]).await;
    probe.call_async(1, "sleep", json!({"ms": 300})).await;
    probe.call_async(2, "echo", json!({"n": 2})).await;
    let (rest, status, _, _) = probe.finish().await;
    assert!(status.success());
    let ids: Vec<&Value> = rest.iter().map(|m| &m["id"]).collect();
    assert_eq!(ids.len(), 2, "{rest:?}");
    let slept = rest
        .iter()
        .find(|m| m["id"] == 1)
        .expect("the slow call's answer");
    assert_eq!(structured(slept)["data"]["slept_ms"], 300, "{slept}");
}

#[tokio::test]
async fn a_call_still_running_after_the_grace_is_cut_off_in_doubt_and_the_server_exits() {
    let mut probe = Probe::start(&[("PROBE_GRACE_MS", "200")]).await;
    probe.call_async(1, "sleep", json!({"ms": 10000})).await;
    // The call is in its handler once a later one has been answered.
    probe.call(2, "echo", json!({})).await;
    let started = Instant::now();
    let (rest, status, _, _) = probe.finish().await;
    assert!(status.success());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    // The caller is told the outcome is unknown, not that it cancelled the call itself.
    let cut = rest
        .iter()
        .find(|m| m["id"] == 1)
        .expect("an answer to the cut-off call");
    assert_eq!(cut["result"]["isError"], true, "{cut}");
    assert_eq!(structured(cut)["executed"], "unknown", "{cut}");
    assert_eq!(structured(cut)["status"], "in_doubt", "{cut}");
}

#[tokio::test]
async fn arguments_the_schema_refuses_never_reach_the_handler() {
    let mut probe = Probe::start(&[("PROBE_ALLOW_GATED", "1")]).await;
    let answer = probe.call(1, "wipe", json!({"target": 7})).await;
    assert_eq!(answer["result"]["isError"], true, "{answer}");
    assert_eq!(structured(&answer)["executed"], false, "{answer}");
    assert_eq!(structured(&answer)["rule"], "schema", "{answer}");
    let (_, _, _, data) = probe.finish().await;
    let records = audit(&data);
    assert_eq!(
        (&records[0]["decision"], &records[0]["outcome"]),
        (&json!("deny"), &json!("invalid_args"))
    );
}

#[tokio::test]
async fn both_protocol_eras_are_served() {
    let mut probe = Probe::start(&[]).await;
    // 2026-07-28: the revision in each request's `_meta`.
    let meta = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    });
    probe
        .send(
            &json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta}}),
        )
        .await;
    let listed = probe.answer(1).await;
    let tools = listed["result"]["tools"].as_array().expect("tools");
    let wipe = tools
        .iter()
        .find(|t| t["name"] == "wipe")
        .expect("wipe listed");
    assert_eq!(
        wipe["_meta"]["io.toolgate/gated"]["env"],
        "PROBE_ALLOW_GATED"
    );
    assert!(
        wipe.get("annotations").is_none(),
        "the kit adds no annotations: {wipe}"
    );
    assert_eq!(listed["result"]["ttlMs"], 0, "{listed}");
    assert_eq!(
        listed["result"]["_meta"]["io.modelcontextprotocol/serverInfo"]["name"],
        "probe"
    );
    probe
        .send(&json!({
            "jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "echo", "arguments": {"era": 2026}, "_meta": meta},
        }))
        .await;
    let modern = probe.answer(2).await;
    assert_eq!(modern["result"]["resultType"], "complete", "{modern}");
    assert_eq!(structured(&modern)["data"]["era"], 2026);

    let (rest, status, _, _) = probe.finish().await;
    assert!(rest.is_empty(), "{rest:?}");
    assert!(status.success());

    // An `initialize` session, as a client of the earlier revisions opens one.
    let mut probe = Probe::start(&[]).await;
    probe
        .send(&json!({
            "jsonrpc": "2.0", "id": 3, "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "test", "version": "0"},
            },
        }))
        .await;
    let init = probe.answer(3).await;
    assert_eq!(init["result"]["protocolVersion"], "2025-06-18", "{init}");
    assert_eq!(init["result"]["serverInfo"]["name"], "probe");
    assert_eq!(init["result"]["serverInfo"]["version"], "0.1.0");
    probe
        .send(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    let legacy = probe.call(4, "echo", json!({"era": 2025})).await;
    assert_eq!(structured(&legacy)["data"]["era"], 2025, "{legacy}");
    assert!(legacy["result"].get("resultType").is_none(), "{legacy}");
    let (rest, status, _, _) = probe.finish().await;
    assert!(rest.is_empty(), "{rest:?}");
    assert!(status.success());
}
