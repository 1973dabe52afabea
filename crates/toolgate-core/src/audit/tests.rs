use std::path::PathBuf;

use serde_json::json;

use super::*;
use crate::canonical;

fn vector(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/vectors")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn check(bytes: &[u8]) -> Report {
    verify(bytes, None).unwrap()
}

#[test]
fn the_good_vector_is_intact() {
    let good = vector("audit-chain-good.jsonl");
    let report = check(&good);
    assert_eq!(report.broken, None);
    assert_eq!(report.records, 8);
    let last = good.split(|b| *b == b'\n').nth(7).unwrap();
    let last: serde_json::Value = serde_json::from_slice(last).unwrap();
    assert_eq!(report.head, last["sha256"].as_str().unwrap());
}

#[test]
fn each_tampered_vector_breaks_at_the_stated_line() {
    for (name, line, reason) in [
        ("audit-chain-edited-line3.jsonl", 3, "sha256 does not match"),
        (
            "audit-chain-deleted-line4.jsonl",
            4,
            "prev_sha256 does not link",
        ),
        (
            "audit-chain-swapped-line5.jsonl",
            5,
            "prev_sha256 does not link",
        ),
        (
            "audit-chain-rehashed-line3.jsonl",
            3,
            "prev_sha256 does not link",
        ),
        (
            "audit-chain-torn-line8.jsonl",
            8,
            "not a complete JSON record",
        ),
    ] {
        let report = check(&vector(name));
        let broken = report.broken.unwrap_or_else(|| panic!("{name} verified"));
        assert_eq!(broken.line, line, "{name}: {}", broken.reason);
        assert!(broken.reason.contains(reason), "{name}: {}", broken.reason);
        assert_eq!(report.records, line - 1, "{name}");
    }
}

#[test]
fn every_good_line_takes_the_fast_path_and_agrees_with_the_slow_one() {
    let good = vector("audit-chain-good.jsonl");
    for line in good.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        assert!(
            scan::canonical_record(line).is_some(),
            "{}",
            String::from_utf8_lossy(line)
        );
        let value: serde_json::Value = serde_json::from_slice(line).unwrap();
        assert_eq!(canonical::to_vec(&value), line);
    }
}

#[test]
fn non_canonical_lines_fall_back_and_still_verify_by_content() {
    let mut chain = Chain::new(GENESIS.to_owned());
    let sealed = chain.seal(
        &Event::tool_call("r", "t", Decision::Allow, Outcome::Committed, &json!({})),
        7,
    );
    let value: serde_json::Value = serde_json::from_slice(&sealed.line).unwrap();
    let pretty = serde_json::to_string_pretty(&value)
        .unwrap()
        .replace('\n', " ");
    let line = format!("{pretty}\n");
    assert!(scan::canonical_record(pretty.as_bytes()).is_none());
    assert_eq!(check(line.as_bytes()).broken, None);
    // Fractions, exponents, escaped keys and upper-case escapes are never taken on trust.
    for odd in [
        r#"{"a":1.5}"#,
        r#"{"a":1e3}"#,
        r#"{"\u0061":1}"#,
        r#"{"a":"\u001F"}"#,
        r#"{"a":"\/"}"#,
    ] {
        assert!(scan::canonical_record(odd.as_bytes()).is_none(), "{odd}");
    }
}

#[test]
fn sealed_records_chain_and_verify() {
    let mut chain = Chain::new(GENESIS.to_owned());
    let mut file = Vec::new();
    for i in 0..5_u64 {
        let args = json!({"request_id": format!("req-{i}"), "text": "é\u{2028}\n"});
        let sealed = chain.seal(
            &Event::tool_call(
                format!("req-{i}"),
                "write_note",
                Decision::Allow,
                Outcome::Committed,
                &args,
            ),
            i,
        );
        assert_eq!(
            line_head(sealed.line.strip_suffix(b"\n").unwrap()),
            Some(sealed.sha256.clone())
        );
        file.extend_from_slice(&sealed.line);
    }
    let report = check(&file);
    assert_eq!(
        (report.records, report.broken, report.head.as_str()),
        (5, None, chain.head())
    );
    assert!(
        verify(file.as_slice(), Some(chain.head()))
            .unwrap()
            .intact()
    );
    let stale = verify(file.as_slice(), Some(GENESIS)).unwrap();
    assert!(
        stale
            .broken
            .unwrap()
            .reason
            .contains("not the expected head")
    );
}

#[test]
fn a_missing_final_newline_is_a_torn_append() {
    let good = vector("audit-chain-good.jsonl");
    let report = check(&good[..good.len() - 1]);
    assert_eq!(report.broken.unwrap().line, 8);
}

#[test]
fn the_encoder_reproduces_the_vector_byte_for_byte() {
    // Re-seal the vector's records from their fields: same bytes, same hashes.
    let good = vector("audit-chain-good.jsonl");
    let mut chain = Chain::new(GENESIS.to_owned());
    for line in good.split_inclusive(|b| *b == b'\n') {
        let v: serde_json::Value = serde_json::from_slice(line).unwrap();
        let text = |k: &str| v[k].as_str().unwrap().to_owned();
        let decision = match v["decision"].as_str().unwrap() {
            "allow" => Decision::Allow,
            "deny" => Decision::Deny,
            other => panic!("{other}"),
        };
        let outcome = [
            Outcome::Committed,
            Outcome::Replay,
            Outcome::Observed,
            Outcome::NotExecuted,
            Outcome::Conflict,
        ]
        .into_iter()
        .find(|o| o.as_str() == v["outcome"].as_str().unwrap())
        .unwrap();
        let event = Event {
            request_id: text("request_id"),
            method: text("method"),
            name: text("name"),
            decision,
            outcome,
            args_digest: text("args_digest"),
            detail: Default::default(),
        };
        let sealed = chain.seal(&event, v["ts"].as_u64().unwrap());
        assert_eq!(sealed.line, line);
    }
}
