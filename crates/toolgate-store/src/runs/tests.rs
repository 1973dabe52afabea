use serde_json::json;

use super::*;

const T0: i64 = 1_700_000_000_000;

#[tokio::test]
async fn a_run_is_created_once_saved_and_read_back_from_another_handle() {
    let dir = tempfile::tempdir().unwrap();
    let agent = RunStore::open(dir.path()).await.unwrap();
    let other = RunStore::open(dir.path()).await.unwrap();
    let first = json!({"messages": [{"role": "user", "content": "refund A-100"}]});
    let run = agent
        .create("r1", "agent:bot", "refund A-100", &first, T0)
        .await
        .unwrap();
    assert_eq!(run.status, RunStatus::Running);
    assert_eq!(run.state, first);
    assert!(matches!(
        other.create("r1", "agent:bot", "again", &first, T0).await,
        Err(StoreError::RunExists { .. })
    ));
    let paused = json!({"messages": [], "step": 2});
    let progress = Progress {
        status: RunStatus::Paused,
        approval_id: Some("ap-1"),
        state: &paused,
        steps: 2,
        outcome: None,
    };
    assert!(agent.save("r1", progress, T0 + 5).await.unwrap());
    let read = other.get("r1").await.unwrap().unwrap();
    assert_eq!(read.status, RunStatus::Paused);
    assert_eq!(read.approval_id.as_deref(), Some("ap-1"));
    assert_eq!(read.state, paused);
    assert_eq!((read.steps, read.updated_at), (2, T0 + 5));
    assert!(other.get("nope").await.unwrap().is_none());
}

#[tokio::test]
async fn a_finished_run_never_changes_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path()).await.unwrap();
    let state = json!({});
    store
        .create("r1", "agent:bot", "task", &state, T0)
        .await
        .unwrap();
    let done = Progress {
        status: RunStatus::Finished,
        approval_id: None,
        state: &state,
        steps: 1,
        outcome: Some("done"),
    };
    assert!(store.save("r1", done, T0 + 1).await.unwrap());
    let again = Progress {
        status: RunStatus::Running,
        outcome: None,
        ..done
    };
    assert!(!store.save("r1", again, T0 + 2).await.unwrap());
    let run = store.get("r1").await.unwrap().unwrap();
    assert_eq!(run.status, RunStatus::Finished);
    assert_eq!(run.outcome.as_deref(), Some("done"));
}

#[tokio::test]
async fn runs_are_listed_newest_first_and_an_approval_is_kept_only_while_paused() {
    let dir = tempfile::tempdir().unwrap();
    let store = RunStore::open(dir.path()).await.unwrap();
    let state = json!({});
    for id in ["r1", "r2", "r3"] {
        store
            .create(id, "agent:bot", "task", &state, T0)
            .await
            .unwrap();
    }
    let failed = Progress {
        status: RunStatus::Failed,
        approval_id: Some("ap-9"),
        state: &state,
        steps: 0,
        outcome: Some("the model is unavailable"),
    };
    assert!(store.save("r2", failed, T0 + 1).await.unwrap());
    let runs = store.list(10).await.unwrap();
    let ids: Vec<&str> = runs.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["r3", "r2", "r1"]);
    assert_eq!(runs[1].approval_id, None, "only a paused run waits for one");
    assert_eq!(store.list(1).await.unwrap().len(), 1);
}
