use serde_json::{Map, Value, json};

use super::*;

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
