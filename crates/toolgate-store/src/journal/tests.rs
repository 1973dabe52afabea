use std::fs;
use std::path::Path;

use serde_json::json;
use toolgate_core::audit::{self, Decision, Event, Outcome};

use super::*;

fn note(id: &str, text: &str) -> (Note, Event) {
    let args = json!({"request_id": id, "text": text});
    let event = Event::tool_call(id, "write_note", Decision::Allow, Outcome::Committed, &args);
    (
        Note {
            request_id: id.to_owned(),
            text: text.to_owned(),
        },
        event,
    )
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
async fn one_note_per_request_id_with_replay_and_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let (journal, _) = Journal::open(dir.path()).unwrap();
    let (n, e) = note("req-0001", "hello");
    assert_eq!(
        journal.put_note(n.clone(), e.clone()).await.unwrap().0,
        NoteOutcome::Committed
    );
    assert_eq!(
        journal.put_note(n.clone(), e.clone()).await.unwrap().0,
        NoteOutcome::Replay
    );
    let (other, e2) = note("req-0001", "other");
    assert_eq!(
        journal.put_note(other, e2).await.unwrap().0,
        NoteOutcome::Conflict
    );
    assert_eq!(journal.notes(), vec![n]);
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
            journal.put_note(n, e).await.unwrap().0
        }));
    }
    let mut committed = 0;
    for task in tasks {
        committed += usize::from(task.await.unwrap() == NoteOutcome::Committed);
    }
    assert_eq!(committed, 50);
    assert_eq!(journal.notes().len(), 50);
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
        journal.put_note(n, e).await.unwrap();
    }
    assert_eq!(journal.stats().syncs, 3, "one sync per sequential note");
    assert_eq!(journal.stats().lone, 3, "a sequential caller commits alone");
    let mut tasks = Vec::new();
    for i in 0..64 {
        let journal = journal.clone();
        let (n, e) = note(&format!("burst-{i:04}"), "together");
        tasks.push(tokio::spawn(async move { journal.put_note(n, e).await }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().0, NoteOutcome::Committed);
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
            let outcome = journal.put_note(n, e).await;
            drop(occupant);
            outcome
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().unwrap().0, NoteOutcome::Committed);
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
        journal.put_note(n, e).await.unwrap();
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
    assert_eq!(journal.put_note(n, e).await.unwrap().0, NoteOutcome::Replay);
    assert!(verify(dir.path()).intact());
}

#[tokio::test]
async fn a_torn_audit_tail_is_moved_aside_and_lost_note_records_come_back_from_the_wal() {
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
            journal.put_note(n, e).await.unwrap();
        }
        fs::read(dir.path().join(AUDIT_FILE)).unwrap()
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    // As after a crash: the last note line lost, the one before torn in half.
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
    assert_eq!(journal.notes().len(), 3);
}

#[tokio::test]
async fn a_torn_wal_frame_is_cut_and_was_never_a_note() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let (n, e) = note("req-0001", "kept");
        journal.put_note(n, e).await.unwrap();
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
    assert_eq!(journal.notes().len(), 1);
}

#[tokio::test]
async fn a_tampered_last_record_stops_start_up_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (journal, _) = Journal::open(dir.path()).unwrap();
        let (n, e) = note("req-0001", "a");
        journal.put_note(n, e).await.unwrap();
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
