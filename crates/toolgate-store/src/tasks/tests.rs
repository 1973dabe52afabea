use serde_json::json;

use super::{NewTask, TaskStatus, TaskStore};
use crate::approval::ApprovalStore;

const T0: i64 = 1_800_000_000_000;
const DAY: i64 = 86_400_000;

fn new_task(id: &str) -> NewTask {
    NewTask {
        id: id.to_owned(),
        principal: "user-alice".to_owned(),
        tool: "refund".to_owned(),
        arguments: json!({"order_id": "ord_1001", "amount": 49})
            .as_object()
            .cloned()
            .unwrap(),
        approval_id: "apr_0123456789ab".to_owned(),
        expires_at: T0 + DAY,
    }
}

#[tokio::test]
async fn a_task_is_its_principals_survives_a_reopen_and_ends_once_without_its_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let store = TaskStore::beside(&ApprovalStore::open(dir.path()).await.unwrap());
    let created = store.create(&new_task("tgt_1"), T0).await.unwrap();
    assert_eq!(created.status, TaskStatus::Working);

    // Another process (a restarted server) reads it back as it was written.
    let reopened = TaskStore::beside(&ApprovalStore::open(dir.path()).await.unwrap());
    assert_eq!(
        reopened.get("tgt_1", "user-alice", T0 + 1).await.unwrap(),
        Some(created)
    );
    assert_eq!(
        reopened.get("tgt_1", "user-bob", T0 + 1).await.unwrap(),
        None
    );

    let result = json!({"content": [], "structuredContent": {"status": "refunded"}});
    let ended = reopened
        .finish(
            "tgt_1",
            "user-alice",
            TaskStatus::Completed,
            Some(&result),
            T0 + 2,
        )
        .await
        .unwrap();
    assert_eq!(
        (ended.status, ended.outcome.as_ref(), ended.arguments.len()),
        (TaskStatus::Completed, Some(&result), 0)
    );
    // A later end (a cancel that came too late, a second poll's run) changes nothing.
    let again = store
        .finish("tgt_1", "user-alice", TaskStatus::Cancelled, None, T0 + 3)
        .await
        .unwrap();
    assert_eq!(
        (again.status, again.outcome),
        (TaskStatus::Completed, Some(result))
    );
    // Another principal cannot end it either: it is not theirs to see.
    assert!(
        store
            .finish("tgt_1", "user-bob", TaskStatus::Cancelled, None, T0 + 4)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_task_past_its_time_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let store = TaskStore::beside(&ApprovalStore::open(dir.path()).await.unwrap());
    store.create(&new_task("tgt_old"), T0).await.unwrap();
    assert_eq!(
        store.get("tgt_old", "user-alice", T0 + DAY).await.unwrap(),
        None
    );
    // The next task forgets it for good.
    store.create(&new_task("tgt_new"), T0 + DAY).await.unwrap();
    let (left,): (i64,) = sqlx::query_as("SELECT count(*) FROM approval_tasks")
        .fetch_one(store.db.sqlite())
        .await
        .unwrap();
    assert_eq!(left, 1);
}
