use std::fs;
use std::path::Path;

use serde_json::json;
use toolgate_core::audit::{self, Decision, Event, Outcome};

use super::*;

/// A ledger-shaped effect: the body is the call's arguments, the key its request_id.
fn note(id: &str, text: &str) -> (Effect, Event) {
    let args = json!({"request_id": id, "text": text});
    let event = Event::tool_call(id, "write_note", Decision::Allow, Outcome::Committed, &args);
    (Effect::new(id, args), event)
}

fn verify(dir: &Path) -> audit::Report {
    let file = fs::File::open(dir.join(AUDIT_FILE)).unwrap();
    audit::verify(std::io::BufReader::new(file), None).unwrap()
}

fn outcomes(dir: &Path) -> Vec<String> {
    fs::read_to_string(dir.join(AUDIT_FILE))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["outcome"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

#[tokio::test]
async fn one_effect_per_key_with_replay_and_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path()).unwrap();
    let (n, e) = note("req-0001", "hello");
    assert_eq!(
        journal.put_effect(n.clone(), e.clone()).await.unwrap().0,
        EffectOutcome::Committed
    );
    assert_eq!(
        journal.put_effect(n.clone(), e.clone()).await.unwrap().0,
        EffectOutcome::Replay
    );
    let (other, e2) = note("req-0001", "other");
    assert_eq!(
        journal.put_effect(other, e2).await.unwrap().0,
        EffectOutcome::Conflict
    );
    assert_eq!(journal.effects(), vec![n]);
    assert_eq!(outcomes(dir.path()), ["committed", "replay", "conflict"]);
    let report = verify(dir.path());
    assert!(report.intact());
    assert_eq!(report.head, journal.head());
}

#[tokio::test]
async fn concurrent_calls_with_one_key_commit_once() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path()).unwrap();
    let mut tasks = Vec::new();
    for i in 0..200 {
        let journal = journal.clone();
        let (n, e) = note(&format!("req-{:04}", i % 50), "same text");
        tasks.push(tokio::spawn(async move {
            journal.put_effect(n, e).await.unwrap().0
        }));
    }
    let mut committed = 0;
    for task in tasks {
        committed += usize::from(task.await.unwrap() == EffectOutcome::Committed);
    }
    assert_eq!(committed, 50);
    assert_eq!(journal.effects().len(), 50);
    assert_eq!(verify(dir.path()).records, 200);
}

/// A caller alone at the journal commits on its own thread (module header, "Group commit"); a
/// burst that arrives together must still share syncs, on one worker as on several.
#[tokio::test(flavor = "current_thread")]
async fn a_lone_caller_commits_alone_and_a_burst_still_shares_its_syncs() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path()).unwrap();
    for i in 0..3 {
        let (n, e) = note(&format!("seq-{i:04}"), "alone");
        journal.put_effect(n, e).await.unwrap();
    }
    assert_eq!(journal.stats().syncs, 3, "one sync per sequential effect");
    assert_eq!(journal.stats().lone, 3, "a sequential caller commits alone");
    let mut tasks = Vec::new();
    for i in 0..64 {
        let journal = journal.clone();
        let (n, e) = note(&format!("burst-{i:04}"), "together");
        tasks.push(tokio::spawn(async move { journal.put_effect(n, e).await }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().0, EffectOutcome::Committed);
    }
    let stats = journal.stats();
    assert_eq!(stats.records, 67);
    assert!(
        stats.syncs - 3 <= 4,
        "a burst of 64 took {} syncs; it should share a few",
        stats.syncs - 3
    );
    assert_eq!(verify(dir.path()).records, 67);
}

/// Under load, calls reach the journal one at a time between other work; while a server serves
/// more than one call, none of them commits alone, so they keep sharing the writer's syncs.
#[tokio::test(flavor = "current_thread")]
async fn while_other_calls_are_served_no_caller_commits_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path()).unwrap();
    let mut tasks = Vec::new();
    for i in 0..16 {
        let journal = journal.clone();
        let occupant = journal.occupy();
        tasks.push(tokio::spawn(async move {
            // Other work first, a different amount for each call: they arrive one by one.
            for _ in 0..i * 3 {
                tokio::task::yield_now().await;
            }
            let (n, e) = note(&format!("load-{i:04}"), "served");
            let outcome = journal.put_effect(n, e).await;
            drop(occupant);
            outcome
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().0, EffectOutcome::Committed);
    }
    let stats = journal.stats();
    assert_eq!(stats.records, 16);
    // The last one may find itself the only call left: that one commits alone.
    assert!(stats.lone <= 1, "{} of 16 committed alone", stats.lone);
    assert_eq!(verify(dir.path()).records, 16);
}

#[tokio::test]
async fn reopening_recovers_head_and_index_and_a_second_writer_is_locked_out() {
    let dir = tempfile::tempdir().unwrap();
    let head = {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let (n, e) = note("req-0001", "a");
        journal.put_effect(n, e).await.unwrap();
        assert!(matches!(
            Journal::open(dir.path()),
            Err(JournalError::Locked { .. })
        ));
        journal.head()
    };
    // The writer thread releases the lock once the last handle is gone.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (journal, recovery) = Journal::open(dir.path()).unwrap();
    assert_eq!(recovery, Recovery::default());
    assert_eq!(journal.head(), head);
    let (n, e) = note("req-0001", "a");
    assert_eq!(
        journal.put_effect(n, e).await.unwrap().0,
        EffectOutcome::Replay
    );
    assert!(verify(dir.path()).intact());
}

#[tokio::test]
async fn a_torn_audit_tail_is_moved_aside_and_lost_effect_records_come_back_from_the_wal() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        journal
            .record(Event::tool_call(
                "x",
                "rm_rf",
                Decision::Deny,
                Outcome::NotExecuted,
                &json!({}),
            ))
            .await
            .unwrap();
        for i in 0..3 {
            let (n, e) = note(&format!("req-000{i}"), "t");
            journal.put_effect(n, e).await.unwrap();
        }
        fs::read(dir.path().join(AUDIT_FILE)).unwrap()
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    // As after a crash: the last effect line lost, the one before torn in half.
    let lines: Vec<&[u8]> = before.split_inclusive(|b| *b == b'\n').collect();
    let mut damaged = lines[..2].concat();
    damaged.extend_from_slice(&lines[2][..40]);
    fs::write(dir.path().join(AUDIT_FILE), &damaged).unwrap();

    let (journal, recovery) = Journal::open(dir.path()).unwrap();
    assert_eq!(recovery.replayed, 2);
    let (aside, bytes) = recovery.torn_audit.unwrap();
    assert_eq!(fs::read(&aside).unwrap(), &lines[2][..40]);
    assert_eq!(bytes, 40);
    let after = fs::read(dir.path().join(AUDIT_FILE)).unwrap();
    assert!(
        after.starts_with(&before),
        "every acknowledged record is back, byte for byte"
    );
    assert_eq!(
        outcomes(dir.path()).last().unwrap(),
        "torn_tail_moved_aside"
    );
    let report = verify(dir.path());
    assert!(report.intact());
    assert_eq!(report.head, journal.head());
    assert_eq!(journal.effects().len(), 3);
}

#[tokio::test]
async fn a_torn_wal_frame_is_cut_and_was_never_an_effect() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let (n, e) = note("req-0001", "kept");
        journal.put_effect(n, e).await.unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let wal = dir.path().join(WAL_FILE);
    let mut bytes = fs::read(&wal).unwrap();
    let good = bytes.len();
    bytes.extend_from_slice(br#"{"audit":{"args_digest":"ab"#);
    fs::write(&wal, &bytes).unwrap();
    let (journal, recovery) = Journal::open(dir.path()).unwrap();
    assert_eq!(recovery.torn_wal_bytes, (bytes.len() - good) as u64);
    assert_eq!(fs::read(&wal).unwrap().len(), good);
    assert_eq!(journal.effects().len(), 1);
}

#[tokio::test]
async fn a_tampered_last_record_stops_start_up_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let (n, e) = note("req-0001", "a");
        journal.put_effect(n, e).await.unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let path = dir.path().join(AUDIT_FILE);
    let tampered = fs::read_to_string(&path)
        .unwrap()
        .replace("committed", "replay");
    fs::write(&path, &tampered).unwrap();
    let err = Journal::open(dir.path()).unwrap_err();
    assert!(
        err.to_string().contains("does not match its own sha256"),
        "{err}"
    );
    assert_eq!(fs::read_to_string(&path).unwrap(), tampered);
}

/// Every audit record, parsed.
fn records(dir: &Path) -> Vec<serde_json::Value> {
    fs::read_to_string(dir.join(AUDIT_FILE))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// An effect that is not its call's arguments, keyed other than the call's request_id.
fn refund(cents: u64) -> (Effect, Event) {
    let args = json!({"order": 7, "request_id": "req-refund"});
    let event = Event::tool_call(
        "req-refund",
        "refund",
        Decision::Allow,
        Outcome::Committed,
        &args,
    );
    (
        Effect::new("order-7/refund", json!({"cents": cents, "op": "refund"})),
        event,
    )
}

/// Opening fails as [`JournalError::Corrupt`] saying `reason`, and changes neither file.
fn assert_refused(dir: &Path, reason: &str) {
    let audit = fs::read(dir.join(AUDIT_FILE)).unwrap();
    let wal = fs::read(dir.join(WAL_FILE)).unwrap();
    let err = Journal::open(dir).unwrap_err();
    assert!(
        matches!(err, JournalError::Corrupt { .. }) && err.to_string().contains(reason),
        "{err}"
    );
    assert_eq!(fs::read(dir.join(AUDIT_FILE)).unwrap(), audit);
    assert_eq!(fs::read(dir.join(WAL_FILE)).unwrap(), wal);
}

/// Rewrites line `index` of the WAL (0-based) through `edit`, in canonical form.
fn edit_wal_line(dir: &Path, index: usize, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join(WAL_FILE);
    let text = fs::read_to_string(&path).unwrap();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let mut frame: serde_json::Value = serde_json::from_str(&lines[index]).unwrap();
    edit(&mut frame);
    lines[index] = String::from_utf8(toolgate_core::canonical::to_vec(&frame)).unwrap();
    fs::write(&path, lines.join("\n") + "\n").unwrap();
}

/// An effect that is its call's arguments adds nothing to its record; one that is not is named
/// in its record by `effect_sha256` and `effect_key`, and both come back from the WAL.
#[tokio::test]
async fn a_record_names_its_effect_and_only_adds_fields_when_its_call_does_not() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let (n, e) = note("req-0001", "hello");
        let (r, re) = refund(1200);
        assert_eq!(
            journal.put_effect(n, e).await.unwrap().0,
            EffectOutcome::Committed
        );
        assert_eq!(
            journal.put_effect(r, re).await.unwrap().0,
            EffectOutcome::Committed
        );
    }
    let records = records(dir.path());
    assert!(records[0].get(EFFECT_SHA256).is_none(), "{}", records[0]);
    assert!(records[0].get(EFFECT_KEY).is_none(), "{}", records[0]);
    let body = json!({"cents": 1200, "op": "refund"});
    assert_eq!(
        records[1][EFFECT_SHA256],
        toolgate_core::canonical::digest(&body)
    );
    assert_eq!(records[1][EFFECT_KEY], "order-7/refund");
    // The WAL holds each record exactly as the audit log does.
    let wal = fs::read_to_string(dir.path().join(WAL_FILE)).unwrap();
    for (line, record) in wal.lines().zip(&records) {
        let frame: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(&frame["audit"], record);
    }

    std::thread::sleep(std::time::Duration::from_millis(50));
    let (journal, recovery) = Journal::open(dir.path()).unwrap();
    assert_eq!(recovery, Recovery::default());
    assert_eq!(
        journal.effects(),
        [note("req-0001", "hello").0, refund(1200).0]
    );
    let (r, re) = refund(1200);
    assert_eq!(
        journal.put_effect(r, re).await.unwrap().0,
        EffectOutcome::Replay
    );
    let (r, re) = refund(1);
    assert_eq!(
        journal.put_effect(r, re).await.unwrap().0,
        EffectOutcome::Conflict
    );
    assert_eq!(journal.effects().len(), 2);
    assert!(verify(dir.path()).intact());
}

/// A frame edited in the WAL no longer matches its record, and the record cannot be edited to
/// match without breaking its hash: start-up stops, whichever way the record names the effect.
#[tokio::test]
async fn an_effect_edited_in_the_wal_stops_start_up_and_changes_nothing() {
    type Edit = fn(&mut serde_json::Value);
    let edits: [(usize, Edit, &str); 7] = [
        (
            0,
            |f| f["body"]["text"] = json!("forged"),
            "body does not match its audit record",
        ),
        (
            0,
            |f| f["key"] = json!("req-0009"),
            "key does not match its audit record",
        ),
        (
            1,
            |f| f["body"]["cents"] = json!(1),
            "body does not match its audit record",
        ),
        (
            1,
            |f| f["key"] = json!("order-8/refund"),
            "key does not match its audit record",
        ),
        // A record that names its effect by effect_sha256 / effect_key vouches for nothing else,
        // not even for what its args_digest and request_id name.
        (
            1,
            |f| f["body"] = json!({"order": 7, "request_id": "req-refund"}),
            "body does not match its audit record",
        ),
        (
            1,
            |f| f["key"] = json!("req-refund"),
            "key does not match its audit record",
        ),
        (
            1,
            |f| {
                let forged = json!({"cents": 1, "op": "refund"});
                f["audit"][EFFECT_SHA256] = json!(toolgate_core::canonical::digest(&forged));
                f["body"] = forged;
            },
            "its audit record does not match its sha256",
        ),
    ];
    for (line, edit, reason) in edits {
        let dir = tempfile::tempdir().unwrap();
        {
            let (journal, _) = Journal::open(dir.path()).unwrap();
            let (n, e) = note("req-0001", "hello");
            journal.put_effect(n, e).await.unwrap();
            let (r, re) = refund(1200);
            journal.put_effect(r, re).await.unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        edit_wal_line(dir.path(), line, edit);
        assert_refused(dir.path(), reason);
    }
}

/// A complete JSON line is never a torn write: one this version cannot read stops start-up, even
/// as the last line, instead of being cut as torn.
#[tokio::test]
async fn a_complete_line_that_is_no_frame_stops_start_up_even_when_last() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let (n, e) = note("req-0001", "kept");
        journal.put_effect(n, e).await.unwrap();
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let wal = dir.path().join(WAL_FILE);
    let mut bytes = fs::read(&wal).unwrap();
    bytes.extend_from_slice(b"{\"audit\":{},\"frame\":\"effect/9\"}\n");
    fs::write(&wal, &bytes).unwrap();
    assert_refused(dir.path(), "not a frame this version can read");
}

/// `ledger.wal` and `audit.jsonl` as the version before generic effects wrote them: two note
/// frames `{"audit":…,"request_id":…,"text":…}` (the second with an escaped newline, a quote and
/// non-ASCII text) and their two records. Never edit these: add new vectors instead.
const NOTE_WAL: &[u8] = include_bytes!("vectors/note-frames.wal");
const NOTE_AUDIT: &[u8] = include_bytes!("vectors/note-frames.audit.jsonl");
const NOTE_HEAD: &str = "628c8d4b87893a3f87dd6ff448d7936b177d6193d26ebfd52a0c3f2474133f74";

fn note_frames_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join(WAL_FILE), NOTE_WAL).unwrap();
    fs::write(dir.path().join(AUDIT_FILE), NOTE_AUDIT).unwrap();
    dir
}

#[tokio::test]
async fn note_frames_of_an_earlier_version_open_as_effects_and_new_frames_follow_them() {
    let dir = note_frames_dir();
    {
        let (journal, recovery) = Journal::open(dir.path()).unwrap();
        assert_eq!(recovery, Recovery::default());
        assert_eq!(journal.head(), NOTE_HEAD);
        let second = "second\nline \u{fc} \"q\"";
        assert_eq!(
            journal.effects(),
            [note("req-0001", "hello").0, note("req-0002", second).0]
        );
        // The converted notes keep their idempotency: what the ledger puts for them now matches.
        let (n, e) = note("req-0002", second);
        assert_eq!(
            journal.put_effect(n, e).await.unwrap().0,
            EffectOutcome::Replay
        );
        let (n, e) = note("req-0001", "other");
        assert_eq!(
            journal.put_effect(n, e).await.unwrap().0,
            EffectOutcome::Conflict
        );
        let (n, e) = note("req-0003", "new");
        assert_eq!(
            journal.put_effect(n, e).await.unwrap().0,
            EffectOutcome::Committed
        );
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let wal = fs::read(dir.path().join(WAL_FILE)).unwrap();
    assert!(
        wal.starts_with(NOTE_WAL),
        "the old frames are left as they are"
    );
    let appended: serde_json::Value = serde_json::from_slice(&wal[NOTE_WAL.len()..]).unwrap();
    assert_eq!(appended["key"], "req-0003");
    assert_eq!(
        appended["body"],
        json!({"request_id": "req-0003", "text": "new"})
    );
    let (journal, recovery) = Journal::open(dir.path()).unwrap();
    assert_eq!(recovery, Recovery::default());
    assert_eq!(journal.effects().len(), 3);
    let report = verify(dir.path());
    assert!(report.intact());
    assert_eq!(report.head, journal.head());
}

#[tokio::test]
async fn a_lost_audit_line_of_a_note_frame_comes_back_byte_for_byte() {
    let dir = note_frames_dir();
    let first = NOTE_AUDIT.iter().position(|b| *b == b'\n').unwrap() + 1;
    fs::write(dir.path().join(AUDIT_FILE), &NOTE_AUDIT[..first]).unwrap();
    let (journal, recovery) = Journal::open(dir.path()).unwrap();
    assert_eq!(recovery.replayed, 1);
    assert_eq!(fs::read(dir.path().join(AUDIT_FILE)).unwrap(), NOTE_AUDIT);
    assert_eq!(journal.head(), NOTE_HEAD);
}

#[tokio::test]
async fn a_note_frame_edited_in_the_wal_stops_start_up_as_before() {
    for (field, forged) in [("text", "hellO"), ("request_id", "req-0009")] {
        let dir = note_frames_dir();
        edit_wal_line(dir.path(), 0, |f| f[field] = json!(forged));
        assert_refused(
            dir.path(),
            "the note does not match its audit record's args_digest",
        );
    }
}

/// Repairs wait until both files have been read: a corrupt WAL stops start-up before a torn audit
/// tail is moved aside, so the person repairing by hand finds both files as the crash left them.
#[tokio::test]
async fn a_corrupt_wal_stops_start_up_before_a_torn_audit_tail_is_repaired() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        for i in 0..2 {
            let (n, e) = note(&format!("req-000{i}"), "t");
            journal.put_effect(n, e).await.unwrap();
        }
    }
    std::thread::sleep(std::time::Duration::from_millis(50));
    let audit = dir.path().join(AUDIT_FILE);
    let mut bytes = fs::read(&audit).unwrap();
    bytes.extend_from_slice(br#"{"args_digest":"ab"#);
    fs::write(&audit, &bytes).unwrap();
    edit_wal_line(dir.path(), 0, |f| f["body"]["text"] = json!("forged"));
    assert_refused(dir.path(), "body does not match its audit record");
    let names: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains(".torn-")),
        "nothing moved aside: {names:?}"
    );
}

/// The reserved fields are the journal's: a caller's own value is dropped when the call names the
/// effect already, and replaced when it does not, so the record always names the effect it holds.
#[tokio::test]
async fn a_callers_own_effect_fields_are_replaced_or_removed() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let stray = |e: Event| e.with(EFFECT_SHA256, "ab").with(EFFECT_KEY, "elsewhere");
        let (n, e) = note("req-0001", "hello");
        journal.put_effect(n, stray(e)).await.unwrap();
        let (r, re) = refund(1200);
        journal.put_effect(r, stray(re)).await.unwrap();
    }
    let records = records(dir.path());
    assert!(records[0].get(EFFECT_SHA256).is_none(), "{}", records[0]);
    assert!(records[0].get(EFFECT_KEY).is_none(), "{}", records[0]);
    let body = json!({"cents": 1200, "op": "refund"});
    assert_eq!(
        records[1][EFFECT_SHA256],
        toolgate_core::canonical::digest(&body)
    );
    assert_eq!(records[1][EFFECT_KEY], "order-7/refund");
    std::thread::sleep(std::time::Duration::from_millis(50));
    let (journal, _) = Journal::open(dir.path()).unwrap();
    assert_eq!(journal.effects().len(), 2);
}

/// Opens the journal again once the last one's writer thread let go of the log's lock (it does so
/// after the last handle is dropped, on its own thread).
fn reopen(dir: &Path, durability: Durability) -> (Journal, Recovery) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match Journal::open_with(dir, durability) {
            Err(JournalError::Locked { .. }) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            opened => return opened.unwrap(),
        }
    }
}

/// A denial, as the gate records one: a synced record without an effect.
fn denial(id: &str) -> Event {
    Event::tool_call(
        id,
        "rm_rf",
        Decision::Deny,
        Outcome::NotExecuted,
        &json!({}),
    )
}

/// Records `n` denials, `req-0` to `req-{n-1}`, one call after another.
async fn record_denials(journal: &Journal, n: usize) {
    for i in 0..n {
        journal.record(denial(&format!("req-{i}"))).await.unwrap();
    }
}

/// The log's lines, each with its newline.
fn log_lines(dir: &Path) -> Vec<Vec<u8>> {
    fs::read(dir.join(AUDIT_FILE))
        .unwrap()
        .split_inclusive(|b| *b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

#[tokio::test]
async fn synced_records_the_log_lost_come_back_from_the_ring() {
    let dir = tempfile::tempdir().unwrap();
    let before = {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        record_denials(&journal, 4).await;
        fs::read(dir.path().join(AUDIT_FILE)).unwrap()
    };
    // Each record was synced in the ring, where a power cut cannot take it.
    assert_eq!(ring::scan(&dir.path().join(RING_FILE)).unwrap().len(), 4);
    // As after a power cut: the log's tail, never synced in the log itself, lost.
    let lines = log_lines(dir.path());
    fs::write(dir.path().join(AUDIT_FILE), &lines[0]).unwrap();

    let (journal, recovery) = reopen(dir.path(), Durability::Synced);
    assert_eq!(recovery.replayed, 3);
    assert!(recovery.torn_audit.is_none());
    assert_eq!(
        fs::read(dir.path().join(AUDIT_FILE)).unwrap(),
        before,
        "every acknowledged record is back, byte for byte"
    );
    let report = verify(dir.path());
    assert!(report.intact());
    assert_eq!(report.head, journal.head());
}

#[tokio::test]
async fn the_ring_wraps_only_after_the_log_is_synced_and_keeps_its_size() {
    // A ring that holds two and a half records of this size: it wraps every second record.
    let line = {
        let scratch = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(scratch.path()).unwrap();
        journal.record(denial("req-0")).await.unwrap();
        log_lines(scratch.path())[0].len()
    };
    let dir = tempfile::tempdir().unwrap();
    let ring_path = dir.path().join(RING_FILE);
    fs::write(&ring_path, vec![0; line * 5 / 2]).unwrap();
    let (journal, _) = Journal::open(dir.path()).unwrap();
    record_denials(&journal, 9).await;
    // Nine records, one sync each, and one sync of the log before each of the four wraps.
    assert_eq!(journal.stats().syncs, 9 + 4);
    drop(journal);
    assert_eq!(
        fs::metadata(&ring_path).unwrap().len(),
        (line * 5 / 2) as u64
    );
    // The ring holds the last record whole and the one before it, or what a wrap left of it.
    let copies = ring::scan(&ring_path).unwrap();
    assert!(!copies.is_empty() && copies.len() <= 2, "{}", copies.len());

    let before = fs::read(dir.path().join(AUDIT_FILE)).unwrap();
    let lines = log_lines(dir.path());
    fs::write(dir.path().join(AUDIT_FILE), lines[..8].concat()).unwrap();
    let (journal, recovery) = reopen(dir.path(), Durability::Synced);
    assert_eq!(recovery.replayed, 1);
    assert_eq!(fs::read(dir.path().join(AUDIT_FILE)).unwrap(), before);
    assert!(verify(dir.path()).intact());
    assert_eq!(verify(dir.path()).head, journal.head());
}

#[tokio::test]
async fn a_damaged_or_forged_ring_is_ignored_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let head = {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        record_denials(&journal, 3).await;
        journal.head()
    };
    let before = fs::read(dir.path().join(AUDIT_FILE)).unwrap();
    // A record that claims to continue the log but was changed after it was hashed, a torn
    // record, and bytes that are no record, where the ring's copies were.
    let last = String::from_utf8(log_lines(dir.path())[2].clone()).unwrap();
    let prev = serde_json::from_str::<serde_json::Value>(&last).unwrap()["prev_sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    let forged = last.replace(&prev, &head);
    let mut ring = forged.into_bytes();
    ring.extend_from_slice(&before[..before.len() / 3]);
    ring.extend_from_slice(b"\n\xff\xfe not a record {\"sha256\":1}\n");
    ring.resize(ring::RING_BYTES as usize, 0);
    fs::write(dir.path().join(RING_FILE), &ring).unwrap();

    let (journal, recovery) = reopen(dir.path(), Durability::Synced);
    assert_eq!(recovery, Recovery::default());
    assert_eq!(fs::read(dir.path().join(AUDIT_FILE)).unwrap(), before);
    assert_eq!(journal.head(), head);
}

#[tokio::test]
async fn a_buffered_journal_has_no_ring_and_still_recovers_from_one() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (journal, _) = Journal::open_with(dir.path(), Durability::Buffered).unwrap();
        journal.record(denial("req-0")).await.unwrap();
        assert_eq!(journal.stats().syncs, 0);
    }
    assert!(!dir.path().join(RING_FILE).exists());

    // A synced server's ring, read by the buffered server that follows it.
    let before = {
        let (journal, _) = reopen(dir.path(), Durability::Synced);
        journal.record(denial("req-1")).await.unwrap();
        fs::read(dir.path().join(AUDIT_FILE)).unwrap()
    };
    let lines = log_lines(dir.path());
    fs::write(dir.path().join(AUDIT_FILE), &lines[0]).unwrap();
    let (_, recovery) = reopen(dir.path(), Durability::Buffered);
    assert_eq!(recovery.replayed, 1);
    assert_eq!(fs::read(dir.path().join(AUDIT_FILE)).unwrap(), before);
}
