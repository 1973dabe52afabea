//! Protocol eras across the gateway: the client's era and the upstream's are negotiated
//! separately, so a 2026-07-28 client reaches a server that only knows `initialize`, and a client
//! that only knows `initialize` reaches a 2026-07-28-only server. (The filesystem tests run a
//! legacy-only third-party server behind a 2026-07-28 client too.)

use serde_json::{Value, json};

use super::{Bench, Era, Proxy, assert_ran, peer, testbed, text};

fn echo_through(proxy: &mut Proxy, era: Era) -> Value {
    let names = proxy.tool_names();
    assert!(names.iter().any(|n| n == "echo"), "{era:?}: {names:?}");
    let reply = proxy.call("echo", json!({"text": format!("{era:?}")}));
    assert_ran(&reply, &format!("echo from a {era:?} client"));
    assert_eq!(text(&reply), format!("echo: {era:?}"), "{reply}");
    assert_eq!(
        reply["result"]["structuredContent"]["text"],
        format!("{era:?}"),
        "{reply}"
    );
    reply
}

/// The protocol the gateway says it agreed with its upstream (its "upstream connected" log line).
fn upstream_protocol(proxy: &Proxy) -> String {
    let log = std::fs::read_to_string(&proxy.log).unwrap_or_default();
    log.lines()
        .find(|l| l.contains("upstream connected"))
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .and_then(|v| v["fields"]["protocol"].as_str().map(str::to_owned))
        .unwrap_or_else(|| panic!("no \"upstream connected\" line\n{}", proxy.log_tail()))
}

#[test]
fn a_legacy_only_upstream_serves_a_2026_client() {
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "legacy"), Era::Modern);
    echo_through(&mut proxy, Era::Modern);
    assert!(
        upstream_protocol(&proxy).contains("2025-11-25"),
        "{}",
        proxy.log_tail()
    );
    proxy.close();
    bench.assert_audit_verifies();
}

#[test]
fn a_2026_client_gets_result_type_complete_from_a_legacy_upstream() {
    // 2026-07-28: "Servers implementing this protocol version MUST include resultType in every
    // result". A result from an `initialize`-era upstream has none of its own.
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let mut proxy = bench.proxy("tb", &testbed(&up, "legacy"), Era::Modern);
    let reply = proxy.call("echo", json!({"text": "shape"}));
    proxy.close();
    assert_ran(&reply, "echo");
    assert_eq!(reply["result"]["resultType"], "complete", "{reply}");
}

#[test]
fn a_modern_only_upstream_serves_legacy_initialize_clients() {
    for version in ["2025-11-25", "2024-11-05"] {
        let bench = Bench::new("testbed.toml");
        let up = bench.mkdir("up");
        let era = Era::Legacy(version);
        let mut proxy = bench.proxy("tb", &testbed(&up, "modern"), era);
        assert_eq!(
            proxy.init["result"]["serverInfo"]["name"], "toolgate",
            "{}",
            proxy.init
        );
        let reply = echo_through(&mut proxy, era);
        assert!(
            reply["result"].get("resultType").is_none(),
            "{version}: a legacy result carries no resultType: {reply}"
        );
        assert!(
            upstream_protocol(&proxy).contains("2026-07-28"),
            "{}",
            proxy.log_tail()
        );
        proxy.close();
        bench.assert_audit_verifies();
    }
}

#[test]
fn an_upstream_narrowed_to_legacy_revisions_in_rmcp_is_reached_through_initialize() {
    // This testbed answers server/discover with -32022 listing only `initialize` revisions (what
    // an rmcp server does when told to speak only those), rather than -32601.
    let bench = Bench::new("testbed.toml");
    let up = bench.mkdir("up");
    let mut upstream = testbed(&up, "legacy");
    upstream.extend(["--legacy-discover".to_owned(), "rmcp".to_owned()]);
    let mut proxy = bench.proxy("tb", &upstream, Era::Modern);
    echo_through(&mut proxy, Era::Modern);
    proxy.close();
    bench.assert_audit_verifies();
}

#[test]
fn mcp_server_time_serves_clients_of_both_eras() {
    let server = peer("venv/bin/mcp-server-time");
    let upstream = [
        server.display().to_string(),
        "--local-timezone".to_owned(),
        "Etc/UTC".to_owned(),
    ];
    for era in [Era::Modern, Era::Legacy("2025-11-25")] {
        let bench = Bench::new("time.toml");
        let mut proxy = bench.proxy("time", &upstream, era);
        let names = proxy.tool_names();
        assert_eq!(names, ["get_current_time"], "{era:?}");
        let reply = proxy.call("get_current_time", json!({"timezone": "Etc/UTC"}));
        assert_ran(&reply, &format!("get_current_time, {era:?} client"));
        assert_eq!(
            reply["result"]["structuredContent"]["timezone"], "Etc/UTC",
            "{reply}"
        );
        assert!(
            upstream_protocol(&proxy).contains("2026-07-28"),
            "{}",
            proxy.log_tail()
        );
        proxy.close();
        bench.assert_audit_verifies();
    }
}

/// In both eras the gateway declares `prompts` and `resources` exactly when the policy passes
/// some through (`tools` always), and what it does not declare it answers as an unknown method
/// (-32601), not with an empty list a client would take for "none right now".
#[test]
fn prompts_and_resources_are_declared_exactly_when_the_policy_passes_some() {
    let cases = [
        ("", false, false),
        ("[passthrough]\nprompts = [\"greeting\"]\n", true, false),
        ("[passthrough]\nresources = [\"file:///*\"]\n", false, true),
    ];
    for (passthrough, prompts, resources) in cases {
        let bench = Bench::with_policy_text(
            "testbed.toml",
            &format!("{}\n{passthrough}", super::gateway_policy("testbed.toml")),
        );
        let up = bench.mkdir("up");
        for era in [Era::Modern, Era::Legacy("2025-11-25")] {
            let mut proxy = bench.proxy("tb", &testbed(&up, "modern"), era);
            let capabilities = if era == Era::Modern {
                let id = proxy.request("server/discover", json!({}));
                proxy.answer(id).0["result"]["capabilities"].clone()
            } else {
                proxy.init["result"]["capabilities"].clone()
            };
            let what = format!("{passthrough:?}, {era:?}: {capabilities}");
            assert!(capabilities["tools"].is_object(), "{what}");
            assert_eq!(capabilities["prompts"].is_object(), prompts, "{what}");
            assert_eq!(capabilities["resources"].is_object(), resources, "{what}");
            for (method, params, declared) in [
                ("prompts/list", json!({}), prompts),
                ("prompts/get", json!({"name": "greeting"}), prompts),
                ("resources/list", json!({}), resources),
                ("resources/templates/list", json!({}), resources),
                ("resources/read", json!({"uri": "file:///x"}), resources),
            ] {
                let id = proxy.request(method, params);
                let reply = proxy.answer(id).0;
                let unknown = super::error_code(&reply) == Some(-32601);
                assert_eq!(unknown, !declared, "{what}: {method}: {reply}");
            }
            proxy.close();
        }
    }
}

/// A prompt an upstream renders is text a model reads: a secret registered with the gateway
/// (`--secret-file`) that the upstream puts in it comes back redacted in both eras, even when the
/// caller sent it, as it would in a tool's result; the rest of the prompt is as the upstream gave it.
#[test]
fn a_registered_secret_in_a_passed_prompt_is_redacted_in_both_eras() {
    let secret = "tg-prompt-secret-6f1c2a9e0b7d";
    let bench = Bench::with_policy_text(
        "testbed.toml",
        &format!(
            "{}\n[passthrough]\nprompts = [\"greeting\"]\n",
            super::gateway_policy("testbed.toml")
        ),
    );
    let secret_file = bench.path("secret");
    std::fs::write(&secret_file, secret).expect("write the secret file");
    let up = bench.mkdir("up");
    for era in [Era::Modern, Era::Legacy("2025-11-25")] {
        let flags = [
            "--name".to_owned(),
            "tb".to_owned(),
            "--secret-file".to_owned(),
            secret_file.display().to_string(),
        ];
        let mut proxy = Proxy::start(
            bench.proxy_command(&flags, &testbed(&up, "both")),
            era,
            &bench.log_path(),
        );
        for (who, expected) in [
            (secret, "Say hello to [REDACTED]."),
            ("Ada", "Say hello to Ada."),
        ] {
            let id = proxy.request(
                "prompts/get",
                json!({"name": "greeting", "arguments": {"name": who}}),
            );
            let reply = proxy.answer(id).0;
            let messages = &reply["result"]["messages"];
            assert_eq!(messages[0]["content"]["text"], expected, "{era:?}: {reply}");
            assert_eq!(reply["result"]["description"], "A greeting", "{reply}");
            assert!(!reply.to_string().contains(secret), "{era:?}: {reply}");
        }
        proxy.close();
    }
}
