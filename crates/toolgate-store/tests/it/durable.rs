//! The stores that must outlive a process (tasks held for a person, agents' runs, console logins)
//! on both databases that keep them, SQLite and PostgreSQL; memory refuses them by name.

use serde_json::{Map, json};
use toolgate_store::approval::StoreError;
use toolgate_store::console::ConsoleStore;
use toolgate_store::runs::{Progress, RunStatus, RunStore};
use toolgate_store::tasks::{NewTask, TaskStatus, TaskStore};

use crate::backends;

const T0: i64 = 1_700_000_000_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_ends_once_a_run_that_finished_never_changes_and_a_login_link_works_once() {
    for backend in backends::all().await {
        let handles = backend.approvals(2).await;
        if backend.name == "memory" {
            let refused = TaskStore::beside(&handles[0])
                .get("task-1", "agent:a", T0)
                .await;
            assert!(
                matches!(refused, Err(StoreError::NotInMemory { .. })),
                "{refused:?}"
            );
            continue;
        }
        let name = backend.name;

        // Tasks: the first end written stands, and only its principal sees it.
        let (tasks, other) = (
            TaskStore::beside(&handles[0]),
            TaskStore::beside(&handles[1]),
        );
        let mut arguments = Map::new();
        arguments.insert("amount".to_owned(), json!(49));
        let new = NewTask {
            id: "task-1".to_owned(),
            principal: "agent:a".to_owned(),
            tool: "refund".to_owned(),
            arguments,
            approval_id: "apr_1".to_owned(),
            expires_at: T0 + 60_000,
        };
        tasks.create(&new, T0).await.unwrap();
        let done = other
            .finish(
                "task-1",
                "agent:a",
                TaskStatus::Completed,
                Some(&json!({"ok": 1})),
                T0 + 1,
            )
            .await
            .unwrap();
        let late = tasks
            .finish("task-1", "agent:a", TaskStatus::Cancelled, None, T0 + 2)
            .await
            .unwrap();
        assert_eq!(
            (done.status, late.status),
            (TaskStatus::Completed, TaskStatus::Completed),
            "{name}"
        );
        assert!(
            late.arguments.is_empty(),
            "{name}: arguments cleared at the end"
        );
        assert_eq!(
            other.get("task-1", "agent:b", T0 + 3).await.unwrap(),
            None,
            "{name}"
        );

        // Runs: a finished run is final, whoever saves after.
        let (runs, later) = (RunStore::beside(&handles[0]), RunStore::beside(&handles[1]));
        runs.create(
            "run-1",
            "support-bot",
            "refund order 1",
            &json!({"turn": 0}),
            T0,
        )
        .await
        .unwrap();
        assert!(matches!(
            later
                .create("run-1", "support-bot", "again", &json!({}), T0)
                .await,
            Err(StoreError::RunExists { .. })
        ));
        let finish = Progress {
            status: RunStatus::Finished,
            approval_id: None,
            state: &json!({"turn": 3}),
            steps: 3,
            outcome: Some("refunded"),
        };
        assert!(runs.save("run-1", finish, T0 + 1).await.unwrap(), "{name}");
        let reopen = Progress {
            status: RunStatus::Running,
            outcome: None,
            ..finish
        };
        assert!(
            !later.save("run-1", reopen, T0 + 2).await.unwrap(),
            "{name}"
        );
        assert_eq!(
            later.get("run-1").await.unwrap().map(|r| r.status),
            Some(RunStatus::Finished),
            "{name}"
        );

        // Console: a login link is redeemed once, by any process.
        let (minted, redeemer) = (
            ConsoleStore::beside(&handles[0]),
            ConsoleStore::beside(&handles[1]),
        );
        minted
            .mint_login("digest-1", "human:dana", T0 + 60_000, T0)
            .await
            .unwrap();
        let first = redeemer.redeem_login("digest-1", T0 + 1).await.unwrap();
        let again = minted.redeem_login("digest-1", T0 + 2).await.unwrap();
        assert_eq!(
            (first.as_deref(), again),
            (Some("human:dana"), None),
            "{name}"
        );
    }
}
