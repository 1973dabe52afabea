use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::json;
use tokio::sync::Barrier;

use super::*;

const T0: i64 = 1_700_000_000_000;
const TTL: i64 = 60_000;
const AGENT: &str = "agent:claude";

fn new_approval(fingerprint: &str) -> NewApproval {
    NewApproval {
        fingerprint: fingerprint.to_owned(),
        requester: AGENT.to_owned(),
        tool: "delete_branch".to_owned(),
        args_redacted: json!({"branch": "main"}),
        tier: "high".to_owned(),
        reason: "deletes a protected branch".to_owned(),
        dry_run: json!({"would_delete": ["refs/heads/main"]}),
        policy_sha256: "ab".repeat(32),
        expires_at: T0 + TTL,
        approvers: None,
        approvals_required: 1,
    }
}

async fn pending(store: &ApprovalStore, fingerprint: &str) -> Approval {
    let (approval, created) = store.request(new_approval(fingerprint), T0).await.unwrap();
    assert!(created);
    approval
}

async fn approved(store: &ApprovalStore, fingerprint: &str) -> Approval {
    let approval = pending(store, fingerprint).await;
    store
        .decide(&approval.id, "human:alice", Verdict::Approve, None, T0 + 1)
        .await
        .unwrap()
}

/// Opens `n` stores on one file concurrently, each with its own pool, as `n` processes would.
async fn stores(dir: &Path, n: usize) -> Vec<ApprovalStore> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let dir = dir.to_path_buf();
        tasks.push(tokio::spawn(async move { ApprovalStore::open(&dir).await }));
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap().unwrap());
    }
    out
}

#[tokio::test]
async fn request_creates_a_pending_row_with_everything_asked() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    assert!(dir.path().join(DB_FILE).exists());
    let approval = pending(&store, "fp-1").await;

    assert!(approval.id.starts_with("apr_"), "{}", approval.id);
    assert_eq!(approval.id.len(), 16);
    assert!(approval.id[4..].bytes().all(|b| b.is_ascii_hexdigit()));
    let asked = new_approval("fp-1");
    assert_eq!(approval.fingerprint, asked.fingerprint);
    assert_eq!(approval.requester, asked.requester);
    assert_eq!(approval.tool, asked.tool);
    assert_eq!(approval.args_redacted, asked.args_redacted);
    assert_eq!(approval.tier, asked.tier);
    assert_eq!(approval.reason, asked.reason);
    assert_eq!(approval.dry_run, asked.dry_run);
    assert_eq!(approval.policy_sha256, asked.policy_sha256);
    assert_eq!(approval.status, Status::Pending);
    assert_eq!((approval.created_at, approval.expires_at), (T0, T0 + TTL));
    assert_eq!(approval.decided_by, None);
    assert_eq!(approval.used_at, None);
    assert_eq!(approval.result, None);
    assert_eq!(store.get(&approval.id, T0).await.unwrap(), Some(approval));
    assert_eq!(store.get("apr_000000000000", T0).await.unwrap(), None);
}

#[tokio::test]
async fn retry_while_pending_attaches_and_after_a_decision_opens_a_new_row() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let first = pending(&store, "fp-1").await;

    let (again, created) = store.request(new_approval("fp-1"), T0 + 5).await.unwrap();
    assert!(!created);
    assert_eq!(again, first);
    assert_eq!(store.list(true, T0 + 5).await.unwrap(), vec![first.clone()]);

    store
        .decide(&first.id, "human:alice", Verdict::Deny, Some("no"), T0 + 6)
        .await
        .unwrap();
    let (second, created) = store.request(new_approval("fp-1"), T0 + 7).await.unwrap();
    assert!(created);
    assert_ne!(second.id, first.id);
    assert_eq!(second.status, Status::Pending);
    assert_eq!(store.list(true, T0 + 7).await.unwrap().len(), 2);
    assert_eq!(
        store.latest_for("fp-1", T0 + 7).await.unwrap().unwrap().id,
        second.id
    );
}

#[tokio::test]
async fn a_due_pending_row_is_not_attached_to() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let first = pending(&store, "fp-1").await;

    // No expire_due in between: the request itself must not attach to the dead row.
    let (second, created) = store
        .request(new_approval("fp-1"), first.expires_at)
        .await
        .unwrap();
    assert!(created);
    assert_ne!(second.id, first.id);
    let first = store
        .get(&first.id, first.expires_at)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(first.status, Status::Expired);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_for_one_call_open_one_row() {
    let dir = tempfile::tempdir().unwrap();
    ApprovalStore::open(dir.path()).await.unwrap();
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = Vec::new();
    for store in stores(dir.path(), 8).await {
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.request(new_approval("fp-1"), T0).await.unwrap()
        }));
    }
    let mut ids = Vec::new();
    let mut created = 0;
    for task in tasks {
        let (approval, was_created) = task.await.unwrap();
        ids.push(approval.id);
        created += usize::from(was_created);
    }
    assert_eq!(created, 1);
    ids.dedup();
    assert_eq!(ids.len(), 1);
}

async fn first_decision_wins(deciders: usize) {
    let dir = tempfile::tempdir().unwrap();
    let id = pending(&ApprovalStore::open(dir.path()).await.unwrap(), "fp-1")
        .await
        .id;
    let barrier = Arc::new(Barrier::new(deciders));
    let mut tasks = Vec::new();
    for (i, store) in stores(dir.path(), deciders).await.into_iter().enumerate() {
        let (barrier, id) = (Arc::clone(&barrier), id.clone());
        tasks.push(tokio::spawn(async move {
            let decider = format!("human:d{i}");
            let verdict = if i % 2 == 0 {
                Verdict::Approve
            } else {
                Verdict::Deny
            };
            barrier.wait().await;
            let answer = store.decide(&id, &decider, verdict, None, T0 + 1).await;
            (decider, verdict, answer)
        }));
    }
    let mut winners = Vec::new();
    let mut refused = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
            (decider, verdict, Ok(row)) => winners.push((decider, verdict, row)),
            (_, _, Err(e)) => refused.push(e),
        }
    }
    assert_eq!(winners.len(), 1, "refusals: {refused:?}");
    let (winner, verdict, row) = winners.pop().unwrap();
    assert_eq!(row.decided_by.as_deref(), Some(winner.as_str()));
    assert_eq!(row.status, verdict.status());
    assert_eq!(refused.len(), deciders - 1);
    for e in &refused {
        match e {
            DecideError::AlreadyDecided { status, by, .. } => {
                assert_eq!(*status, verdict.status());
                assert_eq!(by.as_deref(), Some(winner.as_str()));
            }
            other => panic!("expected AlreadyDecided, got {other:?}"),
        }
    }
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    assert_eq!(store.get(&id, T0 + 2).await.unwrap(), Some(row));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_decision_wins_among_2_processes() {
    first_decision_wins(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_decision_wins_among_8_processes() {
    first_decision_wins(8).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_decision_wins_among_64_processes() {
    first_decision_wins(64).await;
}

#[tokio::test]
async fn the_requester_cannot_decide_its_own_request() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let before = pending(&store, "fp-1").await;

    for verdict in [Verdict::Approve, Verdict::Deny] {
        let err = store
            .decide(&before.id, AGENT, verdict, None, T0 + 1)
            .await
            .unwrap_err();
        assert!(matches!(err, DecideError::SelfApproval { ref id } if *id == before.id));
    }
    assert_eq!(store.get(&before.id, T0 + 1).await.unwrap(), Some(before));
}

async fn late_decision_changes_nothing(expire_first: bool) {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let asked = pending(&store, "fp-1").await;
    let late = asked.expires_at;
    if expire_first {
        assert_eq!(store.expire_due(late).await.unwrap(), 1);
    }
    let before = sqlx::query("SELECT * FROM approvals WHERE id = ?1")
        .bind(&asked.id)
        .fetch_one(store.db.sqlite())
        .await
        .map(|row| decode(&row).unwrap())
        .unwrap();

    let err = store
        .decide(&asked.id, "human:alice", Verdict::Approve, None, late)
        .await
        .unwrap_err();
    assert!(
        matches!(err, DecideError::Expired { ref id } if *id == asked.id),
        "{err:?}"
    );
    // Byte for byte the row the late click found.
    let after = sqlx::query("SELECT * FROM approvals WHERE id = ?1")
        .bind(&asked.id)
        .fetch_one(store.db.sqlite())
        .await
        .map(|row| decode(&row).unwrap())
        .unwrap();
    assert_eq!(after, before);

    let seen = store.get(&asked.id, late).await.unwrap().unwrap();
    assert_eq!(seen.status, Status::Expired);
    assert_eq!((seen.decided_by, seen.decided_at), (None, None));
    assert!(!store.consume(&asked.id, late).await.unwrap());
}

#[tokio::test]
async fn a_decision_after_expiry_changes_nothing() {
    late_decision_changes_nothing(false).await;
}

#[tokio::test]
async fn a_decision_after_marked_expiry_changes_nothing() {
    late_decision_changes_nothing(true).await;
}

#[tokio::test]
async fn a_decision_just_before_expiry_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let asked = pending(&store, "fp-1").await;
    let row = store
        .decide(
            &asked.id,
            "human:alice",
            Verdict::Approve,
            Some("ok"),
            asked.expires_at - 1,
        )
        .await
        .unwrap();
    assert_eq!(row.status, Status::Approved);
    assert_eq!(row.decided_at, Some(asked.expires_at - 1));
    assert_eq!(row.decision_reason.as_deref(), Some("ok"));
    // An approval decided in time stays usable after the deadline for deciding.
    assert_eq!(store.expire_due(asked.expires_at + 1).await.unwrap(), 0);
    assert!(
        store
            .consume(&asked.id, asked.expires_at + 1)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn refusals_read_well() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let row = approved(&store, "fp-1").await;
    let expired = pending(&store, "fp-2").await;
    let own = pending(&store, "fp-3").await;

    let message = |e: DecideError| {
        e.to_string()
            .replace(&row.id, "ID")
            .replace(&expired.id, "ID")
            .replace(&own.id, "ID")
    };
    let decide = |id: String, by: &'static str, now| {
        let store = store.clone();
        async move {
            store
                .decide(&id, by, Verdict::Deny, None, now)
                .await
                .unwrap_err()
        }
    };
    assert_eq!(
        message(decide("apr_nope".into(), "human:bob", T0).await),
        "no approval with id apr_nope"
    );
    assert_eq!(
        message(decide(row.id.clone(), "human:bob", T0 + 2).await),
        "approval ID was already approved by human:alice"
    );
    assert_eq!(
        message(decide(expired.id.clone(), "human:bob", T0 + TTL).await),
        "approval ID expired before it was decided; the call was denied"
    );
    assert_eq!(
        message(decide(own.id.clone(), AGENT, T0 + 2).await),
        "approval ID cannot be decided by the principal that requested it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_approval_is_consumed_by_exactly_one_execution() {
    let dir = tempfile::tempdir().unwrap();
    let id = approved(&ApprovalStore::open(dir.path()).await.unwrap(), "fp-1")
        .await
        .id;
    let barrier = Arc::new(Barrier::new(16));
    let mut tasks = Vec::new();
    for (i, store) in stores(dir.path(), 16).await.into_iter().enumerate() {
        let (barrier, id) = (Arc::clone(&barrier), id.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store
                .consume(&id, T0 + 10 + i64::try_from(i).unwrap())
                .await
                .unwrap()
        }));
    }
    let mut claimed = 0;
    for task in tasks {
        claimed += usize::from(task.await.unwrap());
    }
    assert_eq!(claimed, 1);
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    assert!(
        store
            .get(&id, T0 + 100)
            .await
            .unwrap()
            .unwrap()
            .used_at
            .is_some()
    );
    assert!(!store.consume(&id, T0 + 100).await.unwrap());
}

#[tokio::test]
async fn only_an_approved_row_can_be_consumed() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let waiting = pending(&store, "fp-pending").await;
    let denied = pending(&store, "fp-denied").await;
    store
        .decide(&denied.id, "human:alice", Verdict::Deny, None, T0 + 1)
        .await
        .unwrap();
    let expired = pending(&store, "fp-expired").await;
    store.expire_due(expired.expires_at).await.unwrap();

    // `waiting` was requested with the same TTL, so consume it before it is due.
    assert!(!store.consume(&waiting.id, T0 + 2).await.unwrap());
    assert!(!store.consume(&denied.id, T0 + 2).await.unwrap());
    assert!(
        !store
            .consume(&expired.id, expired.expires_at)
            .await
            .unwrap()
    );
    assert!(!store.consume("apr_nope", T0 + 2).await.unwrap());
    for id in [&waiting.id, &denied.id, &expired.id] {
        assert_eq!(store.get(id, T0 + 2).await.unwrap().unwrap().used_at, None);
    }
}

#[tokio::test]
async fn the_one_result_is_stored_for_replay() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let row = approved(&store, "fp-1").await;
    let result = json!({"content": [{"type": "text", "text": "deleted"}]});

    assert!(matches!(
        store.store_result(&row.id, &result).await,
        Err(StoreError::NoExecution { .. })
    ));
    assert!(store.consume(&row.id, T0 + 2).await.unwrap());
    store.store_result(&row.id, &result).await.unwrap();
    // The same result again is a retry; another one is not.
    store.store_result(&row.id, &result).await.unwrap();
    assert!(matches!(
        store.store_result(&row.id, &json!({"other": true})).await,
        Err(StoreError::NoExecution { .. })
    ));
    let latest = store.latest_for("fp-1", T0 + 3).await.unwrap().unwrap();
    assert_eq!(latest.result, Some(result));
    assert_eq!(latest.used_at, Some(T0 + 2));
}

#[tokio::test]
async fn list_is_newest_first_and_hides_decided_rows_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let a = pending(&store, "fp-a").await;
    let b = approved(&store, "fp-b").await;
    let c = pending(&store, "fp-c").await;

    let ids = |rows: Vec<Approval>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(
        ids(store.list(false, T0 + 2).await.unwrap()),
        [c.id.clone(), a.id.clone()]
    );
    assert_eq!(
        ids(store.list(true, T0 + 2).await.unwrap()),
        [c.id.clone(), b.id.clone(), a.id.clone()]
    );
    // Listing expires due rows first: nothing is shown as pending past its deadline.
    assert!(store.list(false, T0 + TTL).await.unwrap().is_empty());
    assert!(
        store
            .list(true, T0 + TTL)
            .await
            .unwrap()
            .iter()
            .all(|r| r.status != Status::Pending)
    );
}

#[tokio::test]
async fn expire_due_marks_only_due_pending_rows() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let mut early = new_approval("fp-early");
    early.expires_at = T0 + 10;
    store.request(early, T0).await.unwrap();
    pending(&store, "fp-late").await;
    approved(&store, "fp-approved").await;

    assert_eq!(store.expire_due(T0 + 9).await.unwrap(), 0);
    assert_eq!(store.expire_due(T0 + 10).await.unwrap(), 1);
    assert_eq!(store.expire_due(T0 + 10).await.unwrap(), 0);
    assert_eq!(store.expire_due(T0 + TTL).await.unwrap(), 1);
    let approved = store
        .latest_for("fp-approved", T0 + TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(approved.status, Status::Approved);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_first_opens_of_a_fresh_file_agree() {
    let dir = tempfile::tempdir().unwrap();
    let nested: PathBuf = dir.path().join("data").join("toolgate");
    let stores = stores(&nested, 16).await;
    pending(&stores[0], "fp-1").await;
    assert_eq!(stores[15].list(false, T0).await.unwrap().len(), 1);
    let (mode,): (String,) = sqlx::query_as("PRAGMA journal_mode")
        .fetch_one(stores[3].db.sqlite())
        .await
        .unwrap();
    assert_eq!(mode, "wal");
}

#[tokio::test]
async fn a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    sqlx::query("PRAGMA user_version = 99")
        .execute(store.db.sqlite())
        .await
        .unwrap();
    store.db.sqlite().close().await;
    let err = ApprovalStore::open(dir.path()).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::SchemaTooNew {
                found: 99,
                supported: crate::db::sqlite::SCHEMA_VERSION,
                ..
            }
        ),
        "{err:?}"
    );
}

/// A request only `approvers` may decide, needing `required` distinct approvals.
async fn guarded(store: &ApprovalStore, approvers: &[&str], required: u32) -> Approval {
    let new = NewApproval {
        approvers: Some(approvers.iter().map(|a| (*a).to_owned()).collect()),
        approvals_required: required,
        ..new_approval("fp-guarded")
    };
    let (approval, created) = store.request(new, T0).await.unwrap();
    assert!(created);
    approval
}

fn in_group(id: &str, group: &str) -> Decider {
    Decider {
        id: id.to_owned(),
        groups: vec![group.to_owned()],
    }
}

#[tokio::test]
async fn only_the_named_approvers_decide_and_a_refusal_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let row = guarded(&store, &["group:finance", "user:dana"], 1).await;
    assert_eq!(row.approvers.as_deref().map(<[String]>::len), Some(2));
    // Not in the list: refused, nothing recorded.
    let outsider = store
        .decide_as(
            &row.id,
            &in_group("user:eve", "support"),
            Verdict::Approve,
            None,
            T0 + 1,
        )
        .await;
    assert!(
        matches!(outsider, Err(DecideError::NotAnApprover { .. })),
        "{outsider:?}"
    );
    assert!(store.votes(&row.id).await.unwrap().is_empty());
    // `human:dana` from the terminal is the user dana; a finance login is in by its group.
    let dana = store
        .decide(&row.id, "human:dana", Verdict::Approve, Some("ok"), T0 + 2)
        .await
        .unwrap();
    assert_eq!(dana.status, Status::Approved);
    assert_eq!(dana.decided_by.as_deref(), Some("human:dana"));
}

#[tokio::test]
async fn two_distinct_approvers_are_needed_and_the_same_one_twice_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let row = guarded(&store, &["group:finance"], 2).await;
    let first = store
        .decide_as(
            &row.id,
            &in_group("user:ana", "finance"),
            Verdict::Approve,
            None,
            T0 + 1,
        )
        .await
        .unwrap();
    assert_eq!(first.status, Status::Pending, "one approval of two");
    let again = store
        .decide_as(
            &row.id,
            &in_group("user:ana", "finance"),
            Verdict::Approve,
            None,
            T0 + 2,
        )
        .await;
    assert!(
        matches!(again, Err(DecideError::AlreadyVoted { .. })),
        "{again:?}"
    );
    assert_eq!(
        store.get(&row.id, T0 + 2).await.unwrap().unwrap().status,
        Status::Pending
    );
    let second = store
        .decide_as(
            &row.id,
            &in_group("user:bo", "finance"),
            Verdict::Approve,
            Some("checked"),
            T0 + 3,
        )
        .await
        .unwrap();
    assert_eq!(second.status, Status::Approved);
    assert_eq!(second.decided_by.as_deref(), Some("user:ana, user:bo"));
    assert_eq!(store.votes(&row.id).await.unwrap().len(), 2);
    // Used by exactly one execution, as any approval.
    assert!(store.consume(&row.id, T0 + 4).await.unwrap());
    assert!(!store.consume(&row.id, T0 + 5).await.unwrap());
}

#[tokio::test]
async fn a_denial_after_one_approval_denies() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let row = guarded(&store, &["group:finance"], 2).await;
    store
        .decide_as(
            &row.id,
            &in_group("user:ana", "finance"),
            Verdict::Approve,
            None,
            T0 + 1,
        )
        .await
        .unwrap();
    let denied = store
        .decide_as(
            &row.id,
            &in_group("user:bo", "finance"),
            Verdict::Deny,
            Some("not this one"),
            T0 + 2,
        )
        .await
        .unwrap();
    assert_eq!(denied.status, Status::Denied);
    assert_eq!(denied.decided_by.as_deref(), Some("user:bo"));
    assert!(!store.consume(&row.id, T0 + 3).await.unwrap());
    // Decided: a third approver changes nothing.
    let late = store
        .decide_as(
            &row.id,
            &in_group("user:cy", "finance"),
            Verdict::Approve,
            None,
            T0 + 4,
        )
        .await;
    assert!(
        matches!(late, Err(DecideError::AlreadyDecided { .. })),
        "{late:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deciders_racing_in_separate_handles_count_each_person_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let row = guarded(&store, &["group:finance"], 2).await;
    // Eight handles (as eight processes would): four people, each twice.
    let mut tasks = Vec::new();
    for i in 0..8 {
        let handle = ApprovalStore::open(dir.path()).await.unwrap();
        let id = row.id.clone();
        tasks.push(tokio::spawn(async move {
            let who = in_group(&format!("user:p{}", i % 4), "finance");
            handle
                .decide_as(&id, &who, Verdict::Approve, None, T0 + 1)
                .await
                .is_ok()
        }));
    }
    let mut counted = 0;
    for task in tasks {
        counted += usize::from(task.await.unwrap());
    }
    assert_eq!(counted, 2, "exactly the two votes that approved it");
    let row = store.get(&row.id, T0 + 2).await.unwrap().unwrap();
    assert_eq!(row.status, Status::Approved);
    assert_eq!(store.votes(&row.id).await.unwrap().len(), 2);
}

#[tokio::test]
async fn stats_count_how_each_tools_requests_ended_in_the_window() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    for (i, verdict) in [Verdict::Approve, Verdict::Approve, Verdict::Deny]
        .iter()
        .enumerate()
    {
        let row = pending(&store, &format!("fp-{i}")).await;
        store
            .decide(&row.id, "human:dana", *verdict, None, T0 + 1)
            .await
            .unwrap();
    }
    pending(&store, "fp-expires").await;
    let stats = store.stats(T0, T0 + TTL + 1).await.unwrap();
    assert_eq!(
        stats,
        [ToolStats {
            tool: "delete_branch".to_owned(),
            approved: 2,
            denied: 1,
            expired: 1,
            pending: 0,
        }]
    );
    assert_eq!(stats[0].decided(), 4);
    assert!((stats[0].approval_rate() - 0.5).abs() < f64::EPSILON);
    assert!(
        store.stats(T0 + 1, T0 + TTL + 1).await.unwrap().is_empty(),
        "outside the window"
    );
}

#[tokio::test]
async fn decided_lists_ended_rows_newest_first_and_filters_by_tool_and_requester() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    let first = approved(&store, "fp-1").await;
    let still_pending = pending(&store, "fp-2").await;
    let mut other = new_approval("fp-3");
    other.requester = "agent:other".to_owned();
    let (other, _) = store.request(other, T0).await.unwrap();
    store
        .decide(&other.id, "human:alice", Verdict::Deny, Some("no"), T0 + 2)
        .await
        .unwrap();
    let mut soon = new_approval("fp-4");
    soon.expires_at = T0 + 5;
    let (soon, _) = store.request(soon, T0).await.unwrap();

    let ids = |rows: Vec<Approval>| rows.into_iter().map(|r| r.id).collect::<Vec<_>>();
    // The due row is expired by the read itself, and the pending one is never listed.
    assert_eq!(
        ids(store.decided(None, 10, T0 + 10).await.unwrap()),
        [soon.id.clone(), other.id.clone(), first.id.clone()]
    );
    assert_eq!(
        ids(store.decided(None, 2, T0 + 10).await.unwrap()),
        [soon.id.clone(), other.id]
    );
    assert_eq!(
        ids(store
            .decided(Some(("delete_branch", AGENT)), 10, T0 + 10)
            .await
            .unwrap()),
        [soon.id, first.id]
    );
    assert!(
        store
            .decided(Some(("other_tool", AGENT)), 10, T0 + 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .get(&still_pending.id, T0 + 10)
            .await
            .unwrap()
            .unwrap()
            .status,
        Status::Pending
    );
}

#[tokio::test]
async fn counts_read_each_status_and_count_a_due_pending_row_as_expired_without_writing() {
    let dir = tempfile::tempdir().unwrap();
    let store = ApprovalStore::open(dir.path()).await.unwrap();
    assert_eq!(store.counts(T0).await.unwrap(), StatusCounts::default());
    approved(&store, "fp-approved").await;
    let denied = pending(&store, "fp-denied").await;
    store
        .decide(&denied.id, "human:alice", Verdict::Deny, Some("no"), T0 + 1)
        .await
        .unwrap();
    let waiting = pending(&store, "fp-waiting").await;
    let counts = store.counts(T0 + 2).await.unwrap();
    assert_eq!(
        (
            counts.pending,
            counts.approved,
            counts.denied,
            counts.expired
        ),
        (1, 1, 1, 0)
    );
    // Past its expiry the waiting row counts as expired, and the count wrote nothing.
    let counts = store.counts(T0 + TTL + 1).await.unwrap();
    assert_eq!((counts.pending, counts.expired), (0, 1));
    let row = store.get(&waiting.id, T0 + 2).await.unwrap().unwrap();
    assert_eq!(row.status, Status::Pending);
}
