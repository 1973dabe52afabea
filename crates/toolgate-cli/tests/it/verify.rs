//! `toolgate audit verify` against the fixed vectors: same verdicts, same lines, documented exit codes.

use std::path::PathBuf;

use super::{toolgate, verify_json};

fn vector(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/vectors")
        .join(name)
}

#[test]
fn the_good_vector_is_intact_with_its_head() {
    let (code, report) = verify_json(&vector("audit-chain-good.jsonl"));
    assert_eq!(code, 0);
    assert_eq!(report["intact"], true);
    assert_eq!(report["records"], 8);
    let text = std::fs::read_to_string(vector("audit-chain-good.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.split('\n').nth(7).unwrap()).unwrap();
    assert_eq!(report["head"], last["sha256"]);

    let out = toolgate()
        .args(["audit", "verify"])
        .arg(vector("audit-chain-good.jsonl"))
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(
        stdout,
        format!(
            "intact: 8 records\nhead: {}\n",
            last["sha256"].as_str().unwrap()
        )
    );
}

#[test]
fn each_tampered_vector_is_broken_at_its_line_with_exit_1() {
    for (name, line) in [
        ("audit-chain-edited-line3.jsonl", 3),
        ("audit-chain-deleted-line4.jsonl", 4),
        ("audit-chain-swapped-line5.jsonl", 5),
        ("audit-chain-rehashed-line3.jsonl", 3),
        ("audit-chain-torn-line8.jsonl", 8),
    ] {
        let (code, report) = verify_json(&vector(name));
        assert_eq!(code, 1, "{name}");
        assert_eq!(report["broken"]["line"], line, "{name}: {report}");
        let out = toolgate()
            .args(["audit", "verify"])
            .arg(vector(name))
            .output()
            .unwrap();
        assert!(
            String::from_utf8(out.stdout)
                .unwrap()
                .starts_with(&format!("broken at line {line}: ")),
            "{name}"
        );
    }
}

#[test]
fn expect_head_catches_a_truncated_log() {
    let good = vector("audit-chain-good.jsonl");
    let text = std::fs::read_to_string(&good).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.split('\n').nth(7).unwrap()).unwrap();
    let head = last["sha256"].as_str().unwrap();
    let status = toolgate()
        .args(["audit", "verify", "--expect-head", head])
        .arg(&good)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));

    let dir = tempfile::tempdir().unwrap();
    let truncated = dir.path().join("audit.jsonl");
    let seven: String = text.split_inclusive('\n').take(7).collect();
    std::fs::write(&truncated, seven).unwrap();
    assert_eq!(
        verify_json(&truncated).0,
        0,
        "a truncated chain is still a chain"
    );
    let status = toolgate()
        .args(["audit", "verify", "--expect-head", head])
        .arg(&truncated)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(1), "but not the published head");
}

#[test]
fn an_unreadable_file_exits_2() {
    let (code, report) = verify_json(&PathBuf::from("/nonexistent/audit.jsonl"));
    assert_eq!(code, 2);
    assert_eq!(report["intact"], false);
    assert!(
        report["error"]
            .as_str()
            .unwrap()
            .contains("cannot read audit log")
    );
}

#[test]
fn a_forged_duplicate_decision_is_broken_at_its_line() {
    // Line 4 records a denied `rm_rf`. A forged `"decision":"allow"` placed before the real member
    // leaves the content's hash unchanged (serde_json keeps the last member) while `grep` and
    // first-member readers see "allow".
    let text = std::fs::read_to_string(vector("audit-chain-good.jsonl")).unwrap();
    let mut lines: Vec<String> = text.split_inclusive('\n').map(str::to_owned).collect();
    assert!(lines[3].contains(r#""decision":"deny","method":"tools/call","name":"rm_rf""#));
    lines[3] = lines[3].replace(
        r#""decision":"deny""#,
        r#""decision":"allow","decision":"deny""#,
    );
    let dir = tempfile::tempdir().unwrap();
    let forged = dir.path().join("audit.jsonl");
    std::fs::write(&forged, lines.concat()).unwrap();

    let (code, report) = verify_json(&forged);
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["broken"]["line"], 4, "{report}");
    assert_eq!(report["records"], 3, "{report}");
    let out = toolgate()
        .args(["audit", "verify"])
        .arg(&forged)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.starts_with(r#"broken at line 4: duplicate key "decision""#),
        "{stdout}"
    );
}
