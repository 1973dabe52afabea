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
fn the_scanner_leaves_what_it_cannot_prove_to_the_slow_path() {
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

/// Three sealed records; the second has a nested object and an `A` to respell.
fn three_records() -> Vec<String> {
    let mut chain = Chain::new(GENESIS.to_owned());
    (1..=3_u64)
        .map(|i| {
            let event = Event::tool_call(
                format!("req-A{i}"),
                "write_note",
                Decision::Allow,
                Outcome::Committed,
                &json!({"n": i}),
            )
            .with("scope", json!({"b": 2, "c": 3}));
            String::from_utf8(chain.seal(&event, i).line).unwrap()
        })
        .collect()
}

#[test]
fn a_line_that_is_not_exactly_its_canonical_encoding_breaks_at_that_line() {
    let good = three_records();
    assert_eq!(check(good.concat().as_bytes()).broken, None);
    // (what, from, to): the second line with `from` replaced by `to`. Every respelling but the
    // last keeps the content, and so the hash, of the sealed record: only the bytes betray it.
    let cases: &[(&str, &str, &str, &str)] = &[
        (
            "forged duplicate before the real member",
            r#""decision":"allow""#,
            r#""decision":"deny","decision":"allow""#,
            r#"duplicate key "decision""#,
        ),
        (
            "forged duplicate after the real member",
            r#""decision":"allow""#,
            r#""decision":"allow","decision":"deny""#,
            r#"duplicate key "decision""#,
        ),
        (
            "nested duplicate before the real member",
            r#"{"b":2,"#,
            r#"{"b":9,"b":2,"#,
            r#"duplicate key "b""#,
        ),
        (
            "nested duplicate after the real member",
            r#""c":3}"#,
            r#""c":3,"c":9}"#,
            r#"duplicate key "c""#,
        ),
        (
            "reordered keys",
            r#""method":"tools/call","name":"write_note""#,
            r#""name":"write_note","method":"tools/call""#,
            "key order, an escape or a number",
        ),
        (
            "reordered nested keys",
            r#"{"b":2,"c":3}"#,
            r#"{"c":3,"b":2}"#,
            "key order, an escape or a number",
        ),
        (
            "space after a colon",
            r#""decision":"allow""#,
            r#""decision": "allow""#,
            "whitespace outside strings",
        ),
        (
            "space after a comma",
            r#""allow","method""#,
            r#""allow", "method""#,
            "whitespace outside strings",
        ),
        (
            "space before the object",
            r#"{"args_digest""#,
            r#" {"args_digest""#,
            "whitespace outside strings",
        ),
        (
            "CRLF line end",
            "}\n",
            "}\r\n",
            "a carriage return before the newline",
        ),
        (
            "trailing space",
            "}\n",
            "} \n",
            "whitespace outside strings",
        ),
        (
            "escape for a plain character",
            r#""req-A2""#,
            r#""req-\u00412""#,
            "key order, an escape or a number",
        ),
        (
            "escaped solidus",
            r#""tools/call""#,
            r#""tools\/call""#,
            "key order, an escape or a number",
        ),
        (
            "escaped key",
            r#""name":"#,
            r#""n\u0061me":"#,
            "key order, an escape or a number",
        ),
        (
            "exponent for an integer",
            r#""c":3"#,
            r#""c":3e0"#,
            "key order, an escape or a number",
        ),
        // `2.0` is the canonical spelling of a float (Python's `json.dumps(2.0)` agrees), and a
        // float is not the integer that was sealed: the content changed, so the hash says so.
        (
            "1.0 for 1",
            r#""ts":2}"#,
            r#""ts":2.0}"#,
            "sha256 does not match the record",
        ),
    ];
    for (what, from, to, reason) in cases {
        assert_eq!(good[1].matches(from).count(), 1, "{what}: {from}");
        let mut lines = good.clone();
        lines[1] = lines[1].replace(from, to);
        let report = check(lines.concat().as_bytes());
        let broken = report.broken.unwrap_or_else(|| panic!("{what}: verified"));
        assert_eq!(broken.line, 2, "{what}: {}", broken.reason);
        assert!(broken.reason.contains(reason), "{what}: {}", broken.reason);
        assert_eq!(report.records, 1, "{what}");
        assert_eq!(
            line_head(lines[1].trim_end_matches('\n').as_bytes()),
            None,
            "{what}"
        );
    }
}

#[test]
fn the_writers_own_lines_off_the_fast_path_still_verify() {
    // Floats, escaped keys and control characters send a line down the strict slow path; the
    // writer's encoding of them must be the one it checks against.
    let mut chain = Chain::new(GENESIS.to_owned());
    let mut file = Vec::new();
    for detail in [
        json!(1.5),
        json!(-0.0),
        json!(1e300),
        json!({"z\n": [0.1, {"\u{1f}": "\u{1}"}], "a": null}),
        json!(u64::MAX),
        json!(i64::MIN),
    ] {
        let sealed = chain.seal(
            &Event::tool_call("r", "t", Decision::Allow, Outcome::Committed, &json!({}))
                .with("detail", detail.clone()),
            1,
        );
        let body = sealed.line.strip_suffix(b"\n").unwrap();
        if detail.is_f64() || detail.is_object() {
            assert!(scan::canonical_record(body).is_none(), "{detail}");
        }
        assert_eq!(line_head(body), Some(sealed.sha256), "{detail}");
        file.extend_from_slice(&sealed.line);
    }
    let report = check(&file);
    assert_eq!((report.records, report.broken), (6, None));
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

#[test]
fn a_sealed_line_is_the_canonical_encoding_of_its_record_whatever_its_detail() {
    // Detail keys before and after `sha256` in byte order, nested values, escapes, and a key that
    // tries to override a core field (ignored): the line is the record's canonical form, hashed
    // over that form without `sha256`.
    let event = Event::tool_call_digested(
        "r\"1\n",
        "write_note",
        Decision::Deny,
        Outcome::Conflict,
        "d".repeat(64),
    )
    .with("approval_id", "a")
    .with("rule", "arg_rules.write_note.text")
    .with("policy_sha256", "p")
    .with("tier", json!({"z": [1, "é", null], "a": {"y": true}}))
    .with("zz", 7)
    .with("ts", "forged")
    .with("sha256", "forged");
    for detail in [
        event.clone(),
        Event {
            detail: Default::default(),
            ..event
        },
    ] {
        let mut chain = Chain::new(GENESIS.to_owned());
        let sealed = chain.seal(&detail, 1_700_000_000_123_456_789);
        let mut record: serde_json::Value = serde_json::from_slice(&sealed.line).unwrap();
        assert_eq!(
            sealed.line,
            [canonical::to_vec(&record), b"\n".to_vec()].concat()
        );
        assert_eq!(record["ts"], json!(1_700_000_000_123_456_789_u64));
        let sha = record.as_object_mut().unwrap().remove("sha256").unwrap();
        assert_eq!(sha, json!(sealed.sha256));
        assert_eq!(
            sealed.sha256,
            record_hash(GENESIS, &canonical::to_vec(&record))
        );
        assert_eq!(chain.head(), sealed.sha256);
    }
}

/// A sealed chain, as the writer writes it, of one record per entry of `texts`, each with a `text`
/// argument of that many characters.
fn chain_of(texts: impl IntoIterator<Item = usize>) -> Vec<u8> {
    let mut chain = Chain::new(GENESIS.to_owned());
    let mut file = Vec::new();
    for (i, text) in (0_u64..).zip(texts) {
        let args = json!({"request_id": format!("req-{i}"), "text": "x".repeat(text)});
        let event = Event::tool_call(
            format!("req-{i}"),
            "write_note",
            Decision::Allow,
            Outcome::Committed,
            &args,
        );
        file.extend_from_slice(&chain.seal(&event, i).line);
    }
    file
}

fn lines_of(file: &[u8]) -> Vec<Vec<u8>> {
    file.split_inclusive(|b| *b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

#[test]
fn the_report_is_the_same_for_every_block_size_and_thread_count() {
    use std::num::NonZeroUsize;

    let good = chain_of((0..200).map(|i| i % 17));
    let lines = lines_of(&good);
    let head = check(&good).head;
    let mut files: Vec<(String, Vec<u8>, Option<u64>)> = vec![
        ("intact".to_owned(), good.clone(), None),
        ("empty".to_owned(), Vec::new(), None),
        (
            "torn".to_owned(),
            good[..good.len() - 5].to_vec(),
            Some(200),
        ),
    ];
    for at in [0_usize, 1, 57, 58, 199] {
        let mut edited = lines.clone();
        let byte = edited[at].len() / 2;
        edited[at][byte] ^= 0x01;
        files.push((
            format!("byte flipped in {at}"),
            edited.concat(),
            Some(at as u64 + 1),
        ));
        let mut deleted = lines.clone();
        deleted.remove(at);
        let expect = (at < 199).then_some(at as u64 + 1);
        files.push((format!("{at} deleted"), deleted.concat(), expect));
        if at < 199 {
            let mut swapped = lines.clone();
            swapped.swap(at, at + 1);
            files.push((
                format!("{at} swapped"),
                swapped.concat(),
                Some(at as u64 + 1),
            ));
        }
        let mut blank = lines.clone();
        blank.insert(at, b"\n".to_vec());
        files.push((
            format!("blank before {at}"),
            blank.concat(),
            Some(at as u64 + 1),
        ));
    }
    for (name, file, expect) in files {
        let reference = verify_with(file.as_slice(), None, NonZeroUsize::MIN).unwrap();
        assert_eq!(reference.broken.as_ref().map(|b| b.line), expect, "{name}");
        if name == "intact" {
            assert_eq!((reference.records, &reference.head), (200, &head));
        }
        for block in [1, 64, 400, 401, 4096, 1 << 20] {
            for threads in [1, 2, 3, 8] {
                let threads = NonZeroUsize::new(threads).unwrap();
                let report =
                    verify::verify_in_blocks(file.as_slice(), GENESIS, None, threads, block)
                        .unwrap();
                assert_eq!(
                    report, reference,
                    "{name}, blocks of {block}, {threads} threads"
                );
            }
        }
    }
}

#[test]
fn a_line_longer_than_a_block_is_checked_whole() {
    use std::num::NonZeroUsize;

    let file = chain_of([10, 5000, 10, 20_000]);
    let head = check(&file).head;
    for threads in [1, 2] {
        let threads = NonZeroUsize::new(threads).unwrap();
        let report =
            verify::verify_in_blocks(file.as_slice(), GENESIS, Some(&head), threads, 256).unwrap();
        assert_eq!((report.records, report.broken), (4, None));
    }
}
