use std::sync::Arc;

use tokio::sync::Barrier;

use super::*;

const T0: i64 = 1_700_000_000_000;
const MINUTE: i64 = 60_000;

#[tokio::test]
async fn the_kill_switch_starts_off_and_persists_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).await.unwrap();
    let off = KillSwitch {
        on: false,
        changed_by: None,
        changed_at: None,
    };
    assert_eq!(store.killswitch().await.unwrap(), off);

    let on = store.set_killswitch(true, "human:alice", T0).await.unwrap();
    let expected = KillSwitch {
        on: true,
        changed_by: Some("human:alice".to_owned()),
        changed_at: Some(T0),
    };
    assert_eq!(on, expected);
    store.db.sqlite().close().await;
    drop(store);

    let store = StateStore::open(dir.path()).await.unwrap();
    assert_eq!(store.killswitch().await.unwrap(), expected);
    // Setting it on again does not take the credit from whoever flipped it.
    assert_eq!(
        store
            .set_killswitch(true, "human:bob", T0 + 1)
            .await
            .unwrap(),
        expected
    );
    let off = store
        .set_killswitch(false, "human:bob", T0 + 2)
        .await
        .unwrap();
    assert!(!off.on);
    assert_eq!(off.changed_by.as_deref(), Some("human:bob"));
    assert_eq!(off.changed_at, Some(T0 + 2));
}

#[tokio::test]
async fn the_kill_switch_is_shared_by_every_process_on_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let server = StateStore::open(dir.path()).await.unwrap();
    let cli = StateStore::open(dir.path()).await.unwrap();
    // The same file as the approval queue: opening both must not clash.
    crate::approval::ApprovalStore::open(dir.path())
        .await
        .unwrap();
    cli.set_killswitch(true, "human:alice", T0).await.unwrap();
    assert!(server.killswitch().await.unwrap().on);
}

#[tokio::test]
async fn the_sixth_medium_call_in_the_window_is_over_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).await.unwrap();
    for i in 0..5 {
        assert!(
            store
                .charge_budget("agent:a", 5, MINUTE, T0 + i)
                .await
                .unwrap()
        );
    }
    assert!(
        !store
            .charge_budget("agent:a", 5, MINUTE, T0 + 10)
            .await
            .unwrap()
    );
    // A refused call is not counted, and other principals have their own budget.
    assert!(
        store
            .charge_budget("agent:b", 5, MINUTE, T0 + 10)
            .await
            .unwrap()
    );
    // The window is (now - window, now]: the charge at T0 leaves it at T0 + window.
    assert!(
        !store
            .charge_budget("agent:a", 5, MINUTE, T0 + MINUTE - 1)
            .await
            .unwrap()
    );
    assert!(
        store
            .charge_budget("agent:a", 5, MINUTE, T0 + MINUTE)
            .await
            .unwrap()
    );
    assert!(
        !store
            .charge_budget("agent:a", 5, MINUTE, T0 + MINUTE)
            .await
            .unwrap()
    );
    assert!(
        store
            .charge_budget("agent:a", 5, MINUTE, T0 + 3 * MINUTE)
            .await
            .unwrap()
    );
}

#[tokio::test]
async fn a_charge_stamped_ahead_of_now_still_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).await.unwrap();
    assert!(
        store
            .charge_budget("agent:a", 1, MINUTE, T0 + 500)
            .await
            .unwrap()
    );
    assert!(!store.charge_budget("agent:a", 1, MINUTE, T0).await.unwrap());
}

#[tokio::test]
async fn old_charges_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(dir.path()).await.unwrap();
    for i in 0..5 {
        assert!(
            store
                .charge_budget("agent:a", 5, MINUTE, T0 + i)
                .await
                .unwrap()
        );
    }
    let day = PRUNE_HORIZON_MS;
    assert!(
        store
            .charge_budget("agent:a", 5, MINUTE, T0 + day + 10)
            .await
            .unwrap()
    );
    let (left,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM budget_charges WHERE principal = 'agent:a'")
            .fetch_one(store.db.sqlite())
            .await
            .unwrap();
    assert_eq!(left, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_chargers_never_exceed_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    StateStore::open(dir.path()).await.unwrap();
    let chargers = 32;
    let barrier = Arc::new(Barrier::new(chargers));
    let mut tasks = Vec::new();
    for i in 0..chargers {
        let (dir, barrier) = (dir.path().to_path_buf(), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            // Its own pool, as another process would have.
            let store = StateStore::open(&dir).await.unwrap();
            barrier.wait().await;
            let now = T0 + i64::try_from(i % 4).unwrap();
            store
                .charge_budget("agent:a", 5, MINUTE, now)
                .await
                .unwrap()
        }));
    }
    let mut within = 0;
    for task in tasks {
        within += usize::from(task.await.unwrap());
    }
    assert_eq!(within, 5);
}

#[tokio::test]
async fn a_cached_reader_sees_a_switch_flipped_through_another_handle_on_its_next_read() {
    let dir = tempfile::tempdir().unwrap();
    let server = StateStore::open(dir.path()).await.unwrap();
    let operator = StateStore::open(dir.path()).await.unwrap();
    assert!(!server.killswitch_on().await.unwrap());
    assert!(!server.killswitch_on().await.unwrap(), "cached read");
    for on in [true, false, true] {
        operator.set_killswitch(on, "human:op", 1).await.unwrap();
        assert_eq!(server.killswitch_on().await.unwrap(), on);
    }
}

#[tokio::test]
async fn a_principal_switch_blocks_that_principal_only_and_every_reader_sees_it_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let server = StateStore::open(dir.path()).await.unwrap();
    let operator = StateStore::open(dir.path()).await.unwrap();
    assert_eq!(server.blocks("agent:bot").await.unwrap(), None);
    assert!(
        operator
            .set_principal_killswitch("agent:bot", true, "human:op", T0)
            .await
            .unwrap()
    );
    assert_eq!(
        server.blocks("agent:bot").await.unwrap(),
        Some(Blocked::Principal)
    );
    assert_eq!(server.blocks("agent:other").await.unwrap(), None);
    assert!(!server.killswitch_on().await.unwrap(), "not the global one");
    // Turning it on again changes nothing and keeps who did it first.
    assert!(
        !operator
            .set_principal_killswitch("agent:bot", true, "human:late", T0 + 1)
            .await
            .unwrap()
    );
    let listed = server.principal_switches().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].changed_by, "human:op");
    // The switch for everyone covers every principal; off again, the principal is back.
    operator
        .set_killswitch(true, "human:op", T0 + 2)
        .await
        .unwrap();
    assert_eq!(
        server.blocks("agent:other").await.unwrap(),
        Some(Blocked::All)
    );
    operator
        .set_killswitch(false, "human:op", T0 + 3)
        .await
        .unwrap();
    assert!(
        operator
            .set_principal_killswitch("agent:bot", false, "human:op", T0 + 4)
            .await
            .unwrap()
    );
    assert_eq!(server.blocks("agent:bot").await.unwrap(), None);
}
