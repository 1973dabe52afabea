//! The central audit ledger on PostgreSQL: replicas append to one chain in commit order, the export
//! is a log `audit verify` checks, a row deleted, altered or reordered in the database is found at
//! its record, and pruning to a checkpoint leaves a chain that verifies from it.

use std::num::NonZeroUsize;

use serde_json::json;
use toolgate_core::audit::{self, Decision, Event, GENESIS, Outcome};
use toolgate_store::Location;
use toolgate_store::approval::ApprovalStore;
use toolgate_store::ledger::{Checkpoint, Ledger};

use crate::backends;

fn event(i: usize) -> Event {
    let args = json!({"request_id": format!("req-{i}"), "text": "hello"});
    Event::tool_call(
        format!("req-{i}"),
        "write_note",
        Decision::Allow,
        Outcome::Committed,
        &args,
    )
}

async fn ledgers(location: &Location, n: usize) -> Vec<Ledger> {
    let mut out = Vec::new();
    for _ in 0..n {
        let approvals = ApprovalStore::at(location).await.unwrap();
        out.push(Ledger::beside(&approvals).unwrap());
    }
    out
}

async fn exported(ledger: &Ledger) -> Vec<u8> {
    let mut out = Vec::new();
    ledger.export(0, &mut out).await.unwrap();
    out
}

fn verify(log: &[u8], start: &str) -> audit::Report {
    audit::verify_from(log, start, None, NonZeroUsize::MIN).unwrap()
}

async fn sql(location: &Location, statement: &str) {
    let Location::Postgres(url) = location else {
        unreachable!()
    };
    let pool = sqlx::postgres::PgPool::connect(url).await.unwrap();
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement.to_owned()))
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_appending_at_once_make_one_chain_that_verifies() {
    let location = backends::fresh_postgres().await;
    let replicas = ledgers(&location, 3).await;
    let mut tasks = Vec::new();
    for (r, ledger) in replicas.iter().enumerate() {
        for i in 0..100 {
            let ledger = ledger.clone();
            tasks.push(tokio::spawn(async move {
                ledger.append(event(r * 1000 + i)).await.unwrap()
            }));
        }
    }
    let mut counts = Vec::new();
    for task in tasks {
        counts.push(task.await.unwrap().count);
    }
    counts.sort_unstable();
    assert_eq!(
        counts,
        (1..=300).collect::<Vec<u64>>(),
        "one place each, no gaps"
    );
    let log = exported(&replicas[1]).await;
    let report = verify(&log, GENESIS);
    assert!(report.intact(), "{report:?}");
    assert_eq!(report.records, 300);
    assert_eq!(replicas[2].head().await.unwrap(), (300, report.head));
}

#[tokio::test]
async fn a_row_deleted_altered_or_reordered_in_the_database_is_found_at_its_record() {
    for (tamper, line) in [
        ("DELETE FROM audit_ledger WHERE seq = 4", 4),
        (
            "UPDATE audit_ledger SET line = replace(line, 'req-5', 'req-X') WHERE seq = 6",
            6,
        ),
        (
            "UPDATE audit_ledger SET seq = 1000 WHERE seq = 7;
             UPDATE audit_ledger SET seq = 7 WHERE seq = 8;
             UPDATE audit_ledger SET seq = 8 WHERE seq = 1000;",
            7,
        ),
    ] {
        let location = backends::fresh_postgres().await;
        let ledger = ledgers(&location, 1).await.remove(0);
        for i in 0..10 {
            ledger.append(event(i)).await.unwrap();
        }
        assert!(verify(&exported(&ledger).await, GENESIS).intact());
        sql(&location, tamper).await;
        let report = verify(&exported(&ledger).await, GENESIS);
        assert_eq!(
            report.broken.as_ref().map(|b| b.line),
            Some(line),
            "{tamper}: {report:?}"
        );
    }
}

#[tokio::test]
async fn pruned_to_a_checkpoint_the_chain_verifies_from_it_and_the_archive_holds_the_rest() {
    let location = backends::fresh_postgres().await;
    let ledger = ledgers(&location, 1).await.remove(0);
    for i in 0..10 {
        ledger.append(event(i)).await.unwrap();
    }
    let (count, head) = ledger.head().await.unwrap();
    let checkpoint = Checkpoint {
        count,
        head: head.clone(),
        time: 1_000,
        key_id: "test".to_owned(),
        signature: "unchecked-here".to_owned(),
    };
    assert!(ledger.add_checkpoint(&checkpoint).await.unwrap());
    assert!(
        !ledger.add_checkpoint(&checkpoint).await.unwrap(),
        "once per count"
    );
    for i in 10..15 {
        ledger.append(event(i)).await.unwrap();
    }
    let whole = exported(&ledger).await;

    let dir = tempfile::tempdir().unwrap();
    let nothing = ledger
        .prune(999, std::fs::File::create(dir.path().join("none")).unwrap())
        .await
        .unwrap();
    assert_eq!(
        (nothing.through, nothing.records),
        (None, 0),
        "no checkpoint that old"
    );

    let archive = dir.path().join("archive.jsonl");
    let pruned = ledger
        .prune(2_000, std::fs::File::create(&archive).unwrap())
        .await
        .unwrap();
    assert_eq!(pruned.records, 10);
    assert_eq!(pruned.through, Some(checkpoint));
    let archived = std::fs::read(&archive).unwrap();
    let rest = exported(&ledger).await;
    assert_eq!([archived.as_slice(), rest.as_slice()].concat(), whole);
    let report = verify(&rest, &head);
    assert!(report.intact(), "{report:?}");
    assert_eq!(report.records, 5);
    assert!(
        !verify(&rest, GENESIS).intact(),
        "it no longer starts at the beginning"
    );
    // Appends go on after a prune.
    assert_eq!(ledger.append(event(99)).await.unwrap().count, 16);
}

#[tokio::test]
async fn the_ledger_is_only_for_a_shared_store() {
    let dir = tempfile::tempdir().unwrap();
    let approvals = ApprovalStore::open(dir.path()).await.unwrap();
    assert!(Ledger::beside(&approvals).is_err());
}
