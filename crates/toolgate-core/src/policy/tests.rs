use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::*;
use crate::principal::Principal;

fn args(value: Value) -> Map<String, Value> {
    value.as_object().cloned().unwrap()
}

#[test]
fn the_seed_policy_loads_verbatim_and_hides_rm_rf() {
    let policy = Policy::from_json(SEED_POLICY.as_bytes()).unwrap();
    assert!(policy.visible("write_note"));
    assert!(policy.visible("read_ledger"));
    assert!(!policy.visible("rm_rf"));
    assert!(!policy.visible("unknown"));
    assert_eq!(policy.sha256().len(), 64);
}

#[test]
fn deny_beats_allow() {
    let policy = Policy::from_json(br#"{"version":1,"allow":["x"],"deny":["x"]}"#).unwrap();
    assert!(!policy.visible("x"));
    assert_eq!(policy.admit("x", &Map::new()).unwrap_err().rule, "deny");
}

#[test]
fn argument_rules_count_characters_not_bytes() {
    let policy = Policy::from_json(SEED_POLICY.as_bytes()).unwrap();
    let ok = args(json!({"request_id": "ééééééé1", "text": "t"}));
    assert_eq!(policy.admit("write_note", &ok), Ok(()));
    let short = args(json!({"request_id": "req-1", "text": "t"}));
    assert_eq!(
        policy.admit("write_note", &short).unwrap_err().rule,
        "arg_rules.write_note.request_id.min_len"
    );
    let long = args(json!({"request_id": "req-00001", "text": "x".repeat(2001)}));
    assert_eq!(
        policy.admit("write_note", &long).unwrap_err().rule,
        "arg_rules.write_note.text.max_len"
    );
    let not_string = args(json!({"request_id": 123_456_789, "text": "t"}));
    assert_eq!(
        policy.admit("write_note", &not_string).unwrap_err().rule,
        "arg_rules.write_note.request_id.string"
    );
}

#[test]
fn bad_files_are_load_errors() {
    for (text, expected) in [
        (r#"{"version":2}"#, "policy version 2 is not supported"),
        (
            r#"{"version":"1"}"#,
            "policy version \"1\" is not supported",
        ),
        (
            r#"{"version":1,"allow":"x"}"#,
            "policy is not valid policy JSON",
        ),
        (
            r#"{"version":1,"alow":["x"]}"#,
            "policy is not valid policy JSON",
        ),
        (
            r#"{"version":1,"arg_rules":{"t":{"a":{"min":1}}}}"#,
            "policy is not valid policy JSON",
        ),
        (
            r#"{"version":1,"arg_rules":{"t":{"a":{"min_len":5,"max_len":2}}}}"#,
            "can never pass",
        ),
        ("not json", "policy is not valid policy JSON"),
    ] {
        let err = Policy::from_json(text.as_bytes()).unwrap_err().to_string();
        assert!(err.contains(expected), "{text}: {err}");
    }
}

const ORDERS: &str = r#"
version = 2
name = "orders-mcp"

[defaults]
tier = "low"
approval_ttl = "2m"
medium_budget = 5
medium_window = "1h"

[tools.lookup_order]
tier = "low"

[tools.refund]
tier = "medium"
escalate = [{ when = "args.amount > 25", tier = "high" }]
scope = "payments:write"
idempotency_key = "order_id"

[tools.send_email]
tier = "low"
escalate = [{ when = "!args.to.endsWith('@example.com')", tier = "high" }]

[tools.delete_customer]
tier = "blocked"

[tools.delete_note]
gated = true
"#;

fn orders() -> Policy {
    Policy::from_bytes(ORDERS.as_bytes()).unwrap()
}

fn alice() -> Principal {
    Principal::new("local:alice")
}

#[test]
fn v2_tiers_escalate_with_the_arguments() {
    let policy = orders();
    assert_eq!(policy.version(), 2);
    let small = policy.assess(
        "refund",
        &args(json!({"order_id": "o1", "amount": 10})),
        &alice(),
    );
    assert_eq!(
        (small.declared, small.tier, small.rule.as_str()),
        (Tier::Medium, Tier::Medium, "tools.refund.tier")
    );
    let large = policy.assess(
        "refund",
        &args(json!({"order_id": "o1", "amount": 49.5})),
        &alice(),
    );
    assert_eq!(
        (large.tier, large.rule.as_str()),
        (Tier::High, "tools.refund.escalate[0]")
    );
    let internal = policy.assess(
        "send_email",
        &args(json!({"to": "ops@example.com"})),
        &alice(),
    );
    assert_eq!(internal.tier, Tier::Low);
    let external = policy.assess("send_email", &args(json!({"to": "x@evil.test"})), &alice());
    assert_eq!(external.tier, Tier::High);
}

#[test]
fn a_condition_that_cannot_be_decided_escalates() {
    let policy = orders();
    for bad in [
        json!({"order_id": "o1"}),
        json!({"order_id": "o1", "amount": "49"}),
    ] {
        let a = policy.assess("refund", &args(bad.clone()), &alice());
        assert_eq!(a.tier, Tier::High, "{bad}");
        assert_eq!(a.undecided.len(), 1, "{bad}");
    }
}

#[test]
fn decisions_follow_blocked_gate_budget_approval() {
    let policy = orders();
    let decide = |tool: &str, a: Value, gate_open: bool| {
        let assessment = policy.assess(tool, &args(a), &alice());
        policy.decide(tool, &assessment, gate_open)
    };
    assert_eq!(decide("lookup_order", json!({}), false).action, Action::Run);
    let refund = json!({"order_id": "o1", "amount": 5});
    let v = decide("refund", refund.clone(), false);
    assert_eq!(v.action, Action::ChargeBudget);
    assert_eq!(v.clone().charged(true).action, Action::Run);
    let over = v.charged(false);
    assert_eq!(
        (over.action, over.tier, over.rule.as_str()),
        (Action::NeedsApproval, Tier::High, "defaults.medium_budget")
    );
    assert_eq!(
        decide("refund", json!({"order_id": "o1", "amount": 500}), false).action,
        Action::NeedsApproval
    );
    assert_eq!(
        decide("delete_customer", json!({}), true).action,
        Action::Deny
    );
    assert!(!policy.visible("delete_customer"));
    let v = decide("delete_note", json!({}), false);
    assert_eq!(
        (v.action, v.rule.as_str()),
        (Action::RefuseWithDryRun, "tools.delete_note.gated")
    );
    assert_eq!(decide("delete_note", json!({}), true).action, Action::Run);
}

#[test]
fn a_gated_medium_call_with_its_switch_off_charges_no_budget() {
    // policies/filesystem.toml's edit_file: medium and gated. Only `ChargeBudget` spends budget,
    // and a call answered with a dry run never gets it.
    let policy = Policy::from_bytes(
        b"version = 2\nname = \"fs\"\n[tools.edit_file]\ntier = \"medium\"\ngated = true\n",
    )
    .unwrap();
    let assessment = policy.assess("edit_file", &args(json!({})), &alice());
    let shut = policy.decide("edit_file", &assessment, false);
    assert_eq!(shut.action, Action::RefuseWithDryRun);
    assert_eq!(
        shut.clone().charged(false),
        shut,
        "charging only applies to ChargeBudget"
    );
    let open = policy.decide("edit_file", &assessment, true);
    assert_eq!(open.action, Action::ChargeBudget);
    // A blocked call never charges either, whatever its declared tier.
    let blocked = Policy::from_bytes(
        b"version = 2\n[tools.wipe]\ntier = \"medium\"\nescalate = [{ when = \"true\", tier = \"blocked\" }]\n",
    )
    .unwrap();
    let assessment = blocked.assess("wipe", &args(json!({})), &alice());
    assert_eq!(
        blocked.decide("wipe", &assessment, true).action,
        Action::Deny
    );
}

#[test]
fn gate_variables_come_from_the_policy_name() {
    assert_eq!(orders().gate_env("delete_note"), "ORDERS_ALLOW_GATED");
    let notes =
        Policy::from_bytes(b"version = 2\nname = \"notes\"\n[tools.x]\ngated = true\n").unwrap();
    assert_eq!(notes.gate_env("x"), "NOTES_ALLOW_GATED");
    let custom =
        Policy::from_bytes(b"version = 2\n[tools.x]\ngated = true\ngate_env = \"X_ON\"\n").unwrap();
    assert_eq!(custom.gate_env("x"), "X_ON");
    assert_eq!(custom.gate_env("y"), "TOOLGATE_ALLOW_GATED");
}

#[test]
fn a_tool_the_v2_policy_does_not_name_gets_the_default_tier_blocked_unless_set() {
    let strict = Policy::from_bytes(b"version = 2\n").unwrap();
    assert!(!strict.visible("anything"));
    assert_eq!(
        strict.admit("anything", &Map::new()).unwrap_err().rule,
        "defaults.tier"
    );
    assert!(orders().visible("anything"));
}

#[test]
fn v2_load_errors_are_precise() {
    for (text, expected) in [
        ("version = 3\n", "policy version 3 is not supported"),
        (
            "version = 2\n[tools.x]\ntier = \"huge\"\n",
            "tools.x.tier: unknown tier \"huge\"",
        ),
        (
            "version = 2\n[tools.x]\ntyer = \"low\"\n",
            "not valid policy TOML",
        ),
        (
            "version = 2\n[defaults]\napproval_ttl = \"5 minutes\"\n",
            "defaults.approval_ttl",
        ),
        (
            "version = 2\n[tools.x]\nescalate = [{ when = \"args.a >\", tier = \"high\" }]\n",
            "tools.x.escalate[0] `args.a >`",
        ),
        ("version = 2\nname = \"a b\"\n", "policy name"),
    ] {
        let err = Policy::from_bytes(text.as_bytes()).unwrap_err().to_string();
        assert!(err.contains(expected), "{text}: {err}");
    }
}

#[test]
fn conditions_are_checked_against_the_tools_schemas() {
    let policy = orders();
    let props = |pairs: &[(&str, &[&str])]| -> BTreeMap<String, Vec<String>> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.iter().map(|t| (*t).to_owned()).collect()))
            .collect()
    };
    let mut tools = BTreeMap::new();
    tools.insert(
        "lookup_order".to_owned(),
        props(&[("order_id", &["string"])]),
    );
    tools.insert(
        "refund".to_owned(),
        props(&[("order_id", &["string"]), ("amount", &["number"])]),
    );
    tools.insert(
        "send_email".to_owned(),
        props(&[("to", &["string"]), ("body", &["string"])]),
    );
    tools.insert("delete_customer".to_owned(), props(&[]));
    let warnings = policy.check_tools(&tools).unwrap();
    assert_eq!(
        warnings,
        ["policy names tool `delete_note`, which the served tools do not include"]
    );

    // Amount declared as a string: `args.amount > 25` can never be evaluated.
    tools.insert(
        "refund".to_owned(),
        props(&[("order_id", &["string"]), ("amount", &["string"])]),
    );
    let err = policy.check_tools(&tools).unwrap_err().to_string();
    assert!(
        err.contains("tools.refund.escalate[0]") && err.contains("can never be evaluated"),
        "{err}"
    );
    // An argument the tool does not have.
    tools.insert(
        "refund".to_owned(),
        props(&[("order_id", &["string"]), ("total", &["number"])]),
    );
    let err = policy.check_tools(&tools).unwrap_err().to_string();
    assert!(
        err.contains("names argument `amount`, which refund does not have"),
        "{err}"
    );
}

#[test]
fn rate_limits_and_scopes_come_from_the_tool_or_the_defaults() {
    let policy = Policy::from_bytes(
        br#"
version = 2
[defaults]
tier = "low"
rate_limit = { burst = 20, every = "2s" }
[tools.search]
scope = "tickets:read"
rate_limit = { burst = 5, every = "1m" }
[tools.note]
scope = "tickets:write"
"#,
    )
    .unwrap();
    let own = policy.rate_limit("search").unwrap();
    assert_eq!(
        (own.burst.get(), own.every),
        (5, std::time::Duration::from_secs(60))
    );
    let default = policy.rate_limit("note").unwrap();
    assert_eq!(
        (default.burst.get(), default.every),
        (20, std::time::Duration::from_secs(2))
    );
    assert_eq!(policy.scope("search"), Some("tickets:read"));
    assert_eq!(policy.scope("unnamed"), None);
    assert_eq!(
        policy.scopes().into_iter().collect::<Vec<_>>(),
        ["tickets:read", "tickets:write"]
    );
    let unlimited = Policy::from_bytes(b"version = 2\n").unwrap();
    assert_eq!(unlimited.rate_limit("anything"), None);
}

#[test]
fn bad_rate_limits_and_scopes_are_load_errors() {
    for (text, field) in [
        (
            "[tools.a]\nrate_limit = { burst = 0, every = \"1s\" }",
            "tools.a.rate_limit.burst",
        ),
        (
            "[tools.a]\nrate_limit = { burst = 3, every = \"soon\" }",
            "tools.a.rate_limit.every",
        ),
        (
            "[defaults]\nrate_limit = { burst = 3 }",
            "not valid policy TOML",
        ),
        ("[tools.a]\nscope = \"two scopes\"", "tools.a.scope"),
        ("[tools.a]\nscope = \"\"", "tools.a.scope"),
    ] {
        let err = Policy::from_bytes(format!("version = 2\n{text}").as_bytes())
            .unwrap_err()
            .to_string();
        assert!(err.contains(field), "{text}: {err}");
    }
}

/// What an upstream may ask of the caller: elicitation and roots pass from every upstream and
/// sampling from none unless the policy says otherwise; a list names upstreams (`*`: all), and an
/// empty list refuses the kind from all of them.
#[test]
fn questions_from_upstreams_pass_as_the_policy_says_with_sampling_refused_by_default() {
    use super::ClientRequest::{Elicitation, Roots, Sampling};
    let default = Policy::from_bytes(b"version = 2\n").expect("policy");
    for upstream in ["fs", "anything"] {
        assert!(!default.passes_request(Sampling, upstream));
        assert!(default.passes_request(Elicitation, upstream));
        assert!(default.passes_request(Roots, upstream));
    }
    let named = Policy::from_bytes(
        b"version = 2\n[passthrough]\nsampling = [\"llm\"]\nelicitation = []\nroots = [\"*\"]\n",
    )
    .expect("policy");
    assert!(named.passes_request(Sampling, "llm"));
    assert!(!named.passes_request(Sampling, "fs"));
    assert!(!named.passes_request(Elicitation, "llm"));
    assert!(named.passes_request(Roots, "fs"));
    let typo = Policy::from_bytes(b"version = 2\n[passthrough]\nsampling = \"llm\"\n");
    assert!(typo.is_err(), "a list is required: {typo:?}");
}

/// Tasks pass from every upstream unless the policy names fewer; an empty list passes none and
/// the gateway then does not declare the extension.
#[test]
fn tasks_pass_from_every_upstream_unless_the_policy_names_fewer() {
    let default = Policy::from_bytes(b"version = 2\n").expect("policy");
    assert!(default.passes_tasks());
    assert!(default.passes_tasks_from("anything"));
    let named =
        Policy::from_bytes(b"version = 2\n[passthrough]\ntasks = [\"jobs\"]\n").expect("policy");
    assert!(named.passes_tasks());
    assert!(named.passes_tasks_from("jobs"));
    assert!(!named.passes_tasks_from("fs"));
    let none = Policy::from_bytes(b"version = 2\n[passthrough]\ntasks = []\n").expect("policy");
    assert!(!none.passes_tasks());
    assert!(!none.passes_tasks_from("jobs"));
    let typo = Policy::from_bytes(b"version = 2\n[passthrough]\ntasks = \"jobs\"\n");
    assert!(typo.is_err(), "a list is required: {typo:?}");
}

// What a kit's code declares, laid under the policy (`declared.rs`).

fn decide_open(policy: &Policy, tool: &str, open: bool) -> Action {
    let assessment = policy.assess(tool, &Map::new(), &Principal::new("local:test"));
    policy.decide(tool, &assessment, open).action
}

#[test]
fn a_kit_without_a_policy_file_runs_every_tool_and_gates_what_the_code_gates() {
    let mut policy = Policy::for_kit("notes-mcp", Duration::from_secs(60)).unwrap();
    let gated = Declared {
        gated: true,
        ..Declared::default()
    };
    policy.declare("delete_note", &gated).unwrap();
    assert!(policy.visible("list_notes") && policy.visible("delete_note"));
    assert_eq!(decide_open(&policy, "list_notes", false), Action::Run);
    assert_eq!(
        decide_open(&policy, "delete_note", false),
        Action::RefuseWithDryRun
    );
    assert_eq!(decide_open(&policy, "delete_note", true), Action::Run);
    assert_eq!(policy.gate_env("delete_note"), "NOTES_ALLOW_GATED");
    assert_eq!(policy.timeout("list_notes"), Duration::from_secs(60));
    // The same name and timeout read the same policy: its hash names it in every record.
    let again = Policy::for_kit("notes-mcp", Duration::from_secs(60)).unwrap();
    assert_eq!(policy.sha256(), again.sha256());
    assert!(Policy::for_kit("no spaces", Duration::from_secs(1)).is_err());
    assert!(Policy::for_kit("notes", Duration::ZERO).is_err());
}

#[test]
fn a_policy_file_cannot_ungate_what_the_code_gates_but_its_own_settings_win() {
    let file = b"version = 2\n[defaults]\ntier = \"low\"\n\n[tools.wipe]\ngate_env = \"FILE_SWITCH\"\ntimeout = \"2s\"\n\n[tools.read]\ntier = \"high\"\n";
    let mut policy = Policy::from_bytes(file).unwrap();
    let sha = policy.sha256().to_owned();
    policy.name_if_unnamed("kit");
    let code = Declared {
        gated: true,
        gate_env: Some("CODE_SWITCH".to_owned()),
        timeout: Some(Duration::from_secs(9)),
    };
    policy.declare("wipe", &code).unwrap();
    policy.declare("read", &Declared::default()).unwrap();
    policy
        .declare(
            "other",
            &Declared {
                timeout: Some(Duration::from_secs(7)),
                ..Declared::default()
            },
        )
        .unwrap();
    assert_eq!(
        decide_open(&policy, "wipe", false),
        Action::RefuseWithDryRun,
        "the file does not say gated; the code does"
    );
    assert_eq!(policy.gate_env("wipe"), "FILE_SWITCH");
    assert_eq!(policy.timeout("wipe"), Duration::from_secs(2));
    assert_eq!(policy.timeout("other"), Duration::from_secs(7));
    assert_eq!(decide_open(&policy, "read", false), Action::NeedsApproval);
    assert_eq!(policy.gate_env("unnamed_tool"), "KIT_ALLOW_GATED");
    assert_eq!(
        policy.sha256(),
        sha,
        "the file's hash still names the policy"
    );
    let bad = Declared {
        gate_env: Some("NOT A NAME".to_owned()),
        ..Declared::default()
    };
    assert!(policy.declare("wipe", &bad).is_err());
}

#[test]
fn a_version_1_policy_keeps_refusing_a_tool_it_does_not_allow_as_not_allowed() {
    let mut policy = Policy::from_json(br#"{"version":1,"allow":["x"]}"#).unwrap();
    let gated = Declared {
        gated: true,
        ..Declared::default()
    };
    policy.declare("y", &gated).unwrap();
    policy.declare("x", &gated).unwrap();
    assert_eq!(
        policy.admit("y", &Map::new()).unwrap_err().rule,
        "not_allowed"
    );
    assert_eq!(decide_open(&policy, "x", false), Action::RefuseWithDryRun);
}

/// The shipped worked example of seed 000's execute-verify-stop.
const LEDGER_VERIFY: &str = include_str!("../../../../policies/ledger-verify.toml");

/// A postcondition policy with a compensating tool, `{verify}` being the body of
/// `[tools.put_file.verify]`.
fn files_policy(verify: &str) -> String {
    format!(
        r#"
version = 2
name = "files"

[defaults]
tier = "blocked"

[tools.put_file]
tier = "low"

[tools.put_file.verify]
{verify}

[tools.read_file]
tier = "low"

[tools.remove_file]
tier = "low"

[tools.purge]
tier = "blocked"

[tools.cached_read]
tier = "low"
idempotency_key = "*"
"#
    )
}

const FILES_VERIFY: &str = r#"read = "read_file"
args = { name = "args.name" }
expect = "result.text == args.text"
rollback = "remove_file"
rollback_args = { name = "args.name" }"#;

#[test]
fn the_ledger_postcondition_builds_its_read_and_judges_what_it_reads() {
    let policy = Policy::from_bytes(LEDGER_VERIFY.as_bytes()).unwrap();
    let verify = policy.postcondition("write_note").expect("a postcondition");
    assert!(policy.postcondition("read_ledger").is_none());
    assert_eq!(verify.read, "read_ledger");
    assert!(verify.rollback.is_none());
    let call = args(json!({"request_id": "req-0001", "text": "gate aplicado"}));
    assert_eq!(verify.read_arguments(&call).unwrap(), Map::new());
    let note = |id: &str, text: &str| json!({"request_id": id, "text": text});
    let exactly = json!({"notes": [note("req-0000", "x"), note("req-0001", "gate aplicado")]});
    assert!(verify.expect.holds(&call, &exactly).unwrap());
    let other_text = json!({"notes": [note("req-0001", "gate aplicado!")]});
    assert!(!verify.expect.holds(&call, &other_text).unwrap());
    let missing = json!({"notes": []});
    assert!(!verify.expect.holds(&call, &missing).unwrap());
    let twice =
        json!({"notes": [note("req-0001", "gate aplicado"), note("req-0001", "gate aplicado")]});
    assert!(!verify.expect.holds(&call, &twice).unwrap());
    // A result without the field the condition reads is undecided, never true.
    assert!(verify.expect.holds(&call, &json!({"rows": []})).is_err());
    assert!(verify.expect.holds(&call, &json!("notes")).is_err());
}

#[test]
fn a_compensating_calls_arguments_are_built_from_the_calls() {
    let policy = Policy::from_bytes(files_policy(FILES_VERIFY).as_bytes()).unwrap();
    let verify = policy.postcondition("put_file").unwrap();
    let call = args(json!({"name": "a.txt", "text": "hello"}));
    assert_eq!(
        verify.read_arguments(&call).unwrap(),
        args(json!({"name": "a.txt"}))
    );
    let rollback = verify.rollback.as_ref().unwrap();
    assert_eq!(rollback.tool, "remove_file");
    assert_eq!(
        rollback.arguments(&call).unwrap(),
        args(json!({"name": "a.txt"}))
    );
    // An argument the call left out: the read's arguments cannot be built, and say which.
    let err = verify
        .read_arguments(&args(json!({"text": "hello"})))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("argument `name`:"), "{err}");
    // Expressions give any JSON value: lists, maps, numbers, literals.
    let policy = Policy::from_bytes(
        files_policy(
            r#"read = "read_file"
args = { name = "args.name + '.txt'", tags = "[1, 'a', {'k': true}]" }
expect = "true""#,
        )
        .as_bytes(),
    )
    .unwrap();
    let built = policy
        .postcondition("put_file")
        .unwrap()
        .read_arguments(&args(json!({"name": "a"})))
        .unwrap();
    assert_eq!(
        Value::Object(built),
        json!({"name": "a.txt", "tags": [1, "a", {"k": true}]})
    );
}

#[test]
fn postcondition_load_errors_are_precise() {
    let cases = [
        (
            FILES_VERIFY.replace("read = \"read_file\"", "read = \"read_fiel\""),
            "policy tools.put_file.verify.read: names `read_fiel`, which the policy does not name: add a [tools.read_fiel] entry",
        ),
        (
            FILES_VERIFY.replace("rollback = \"remove_file\"", "rollback = \"rm\""),
            "policy tools.put_file.verify.rollback: names `rm`, which the policy does not name",
        ),
        (
            FILES_VERIFY.replace("read = \"read_file\"", "read = \"purge\""),
            "policy tools.put_file.verify.read: names `purge`, which the policy blocks",
        ),
        (
            FILES_VERIFY.replace("read = \"read_file\"", "read = \"put_file\""),
            "put_file cannot be its own read",
        ),
        (
            FILES_VERIFY.replace("read = \"read_file\"", "read = \"cached_read\""),
            "policy tools.put_file.verify.read: `cached_read` has an idempotency_key",
        ),
        (
            FILES_VERIFY.replace("result.text == args.text", "result.text =="),
            "policy tools.put_file.verify.expect `result.text ==`: ",
        ),
        (
            FILES_VERIFY.replace("result.text == args.text", "reslt.text == args.text"),
            "policy tools.put_file.verify.expect `reslt.text == args.text`: reads `reslt`, which is not defined here (only `args` and `result`)",
        ),
        (
            FILES_VERIFY.replace(
                "args = { name = \"args.name\" }",
                "args = { name = \"result.name\" }",
            ),
            "policy tools.put_file.verify.args.name `result.name`: reads `result`, which is not defined here (only `args`)",
        ),
        (
            FILES_VERIFY.replace(
                "rollback_args = { name = \"args.name\" }",
                "rollback_args = { name = \"principal.sub\" }",
            ),
            "policy tools.put_file.verify.rollback_args.name `principal.sub`: reads `principal`",
        ),
        (
            FILES_VERIFY.replace("rollback = \"remove_file\"\n", ""),
            "policy tools.put_file.verify.rollback_args: is given without `rollback`",
        ),
        (
            format!("{FILES_VERIFY}\nexpected = \"true\""),
            "not valid policy TOML",
        ),
        (
            FILES_VERIFY.replace("args = { name = \"args.name\" }", "args = { name = 7 }"),
            "not valid policy TOML",
        ),
    ];
    for (verify, expected) in cases {
        let text = files_policy(&verify);
        let err = Policy::from_bytes(text.as_bytes()).unwrap_err().to_string();
        assert!(err.contains(expected), "{verify}\n=> {err}");
    }
    // A blocked tool never runs: a postcondition on it is a mistake, not a rule.
    let text = files_policy(FILES_VERIFY).replace(
        "[tools.put_file]\ntier = \"low\"",
        "[tools.put_file]\ntier = \"blocked\"",
    );
    let err = Policy::from_bytes(text.as_bytes()).unwrap_err().to_string();
    assert_eq!(
        err,
        "policy tools.put_file.verify: put_file is blocked, so it never runs and there is nothing to verify"
    );
    // So is one on a tool left to a blocking default.
    let text = "version = 2\n[tools.read]\ntier = \"low\"\n[tools.write.verify]\nread = \"read\"\nexpect = \"true\"\n";
    let err = Policy::from_bytes(text.as_bytes()).unwrap_err().to_string();
    assert!(err.contains("write is blocked"), "{err}");
    // A comprehension's own variable is no unknown variable.
    let fine = FILES_VERIFY.replace(
        "result.text == args.text",
        "result.lines.all(line, line.size() < 80) && [1, 2].exists(x, x == 2)",
    );
    Policy::from_bytes(files_policy(&fine).as_bytes()).expect("loads");
}

#[test]
fn postconditions_are_checked_against_the_served_tools() {
    let policy = Policy::from_bytes(files_policy(FILES_VERIFY).as_bytes()).unwrap();
    let props = |names: &[&str]| -> BTreeMap<String, Vec<String>> {
        names
            .iter()
            .map(|n| ((*n).to_owned(), vec!["string".to_owned()]))
            .collect()
    };
    let served = |put: &[&str], read: Option<&[&str]>, remove: Option<&[&str]>| {
        let mut tools = BTreeMap::new();
        tools.insert("put_file".to_owned(), props(put));
        if let Some(read) = read {
            tools.insert("read_file".to_owned(), props(read));
        }
        if let Some(remove) = remove {
            tools.insert("remove_file".to_owned(), props(remove));
        }
        tools.insert("purge".to_owned(), props(&[]));
        tools.insert("cached_read".to_owned(), props(&[]));
        tools
    };
    let fits = served(&["name", "text"], Some(&["name"]), Some(&["name"]));
    assert_eq!(policy.check_tools(&fits).unwrap(), Vec::<String>::new());

    // The read is not served: every verified call would stop, and start-up says so.
    let warnings = policy
        .check_tools(&served(&["name", "text"], None, Some(&["name"])))
        .unwrap();
    assert!(
        warnings.contains(
            &"policy tools.put_file.verify.read names `read_file`, which the served tools do not include: every call to put_file will stop unverified".to_owned()
        ),
        "{warnings:?}"
    );
    let warnings = policy
        .check_tools(&served(&["name", "text"], Some(&["name"]), None))
        .unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("policy tools.put_file.verify.rollback names `remove_file`")),
        "{warnings:?}"
    );
    // The condition reads an argument the verified tool does not have.
    let err = policy
        .check_tools(&served(&["name", "body"], Some(&["name"]), Some(&["name"])))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "policy tools.put_file.verify.expect `result.text == args.text`: names argument `text`, which put_file does not have"
    );
    // The read does not take the argument the rule passes it.
    let err = policy
        .check_tools(&served(&["name", "text"], Some(&["path"]), Some(&["name"])))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "policy tools.put_file.verify.args.name: read_file has no argument `name`"
    );
    let err = policy
        .check_tools(&served(&["name", "text"], Some(&["name"]), Some(&["id"])))
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "policy tools.put_file.verify.rollback_args.name: remove_file has no argument `name`"
    );
}

#[test]
fn approvers_come_from_the_tool_else_the_defaults_and_bad_lists_are_load_errors() {
    let policy = Policy::from_bytes(
        br#"
version = 2
[defaults]
tier = "high"
approvers = ["group:support"]
[tools.refund]
approvers = ["group:finance", "user:dana"]
approvals_required = 2
[tools.add_note]
"#,
    )
    .unwrap();
    let refund = policy.approvers("refund");
    assert_eq!(
        refund.allowed.as_deref(),
        Some(&["group:finance".to_owned(), "user:dana".to_owned()][..])
    );
    assert_eq!(refund.required, 2);
    let note = policy.approvers("add_note");
    assert_eq!(
        note.allowed.as_deref(),
        Some(&["group:support".to_owned()][..])
    );
    assert_eq!(note.required, 1);
    // A policy that says nothing: anyone but the requester, one approval.
    let open = Policy::from_bytes(b"version = 2\n[tools.x]\ntier = \"high\"\n").unwrap();
    assert_eq!(open.approvers("x"), &Approvers::default());

    let cases = [
        (
            "approvers = []",
            "policy tools.x.approvers: is empty: nobody could approve; block the tool instead",
        ),
        (
            "approvers = [\"dana\"]",
            "policy tools.x.approvers: \"dana\" is not \"user:NAME\" or \"group:NAME\"",
        ),
        (
            "approvers = [\"user:\"]",
            "policy tools.x.approvers: \"user:\" is not \"user:NAME\" or \"group:NAME\"",
        ),
        (
            "approvals_required = 0",
            "policy tools.x.approvals_required: must be at least 1 (an approval nobody gives is not an approval)",
        ),
        (
            "approvers = [\"user:dana\"]\napprovals_required = 2",
            "policy tools.x.approvals_required: is 2, but only 1 users may approve",
        ),
    ];
    for (table, expected) in cases {
        let text = format!("version = 2\n[tools.x]\ntier = \"high\"\n{table}\n");
        let err = Policy::from_bytes(text.as_bytes()).unwrap_err().to_string();
        assert_eq!(err, expected, "{table}");
    }
}

#[test]
fn a_policy_may_need_approval_only_where_some_tier_can_ask_a_person() {
    let load = |text: &str| Policy::from_bytes(text.as_bytes()).unwrap();
    assert!(
        !Policy::from_json(SEED_POLICY.as_bytes())
            .unwrap()
            .may_need_approval()
    );
    assert!(
        !load("version = 2\n[defaults]\ntier = \"low\"\n[tools.x]\ntier = \"blocked\"\n")
            .may_need_approval()
    );
    assert!(load("version = 2\n[defaults]\ntier = \"medium\"\n").may_need_approval());
    assert!(
        load("version = 2\n[defaults]\ntier = \"blocked\"\n[tools.x]\ntier = \"high\"\n")
            .may_need_approval()
    );
    assert!(
        load(
            "version = 2\n[defaults]\ntier = \"low\"\n[tools.x]\nescalate = [{ when = \"args.n > 1\", tier = \"high\" }]\n"
        )
        .may_need_approval()
    );
}
