use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use sqlx::sqlite::SqliteConnectOptions;
use tokio::sync::Barrier;

use super::*;
use crate::approval::{ApprovalStore, DB_FILE, Status};
use crate::db::sqlite::{SCHEMA_V1, SCHEMA_VERSION};
use crate::state::StateStore;
use sqlx::sqlite::SqlitePool;

const T0: i64 = 1_700_000_000_000;
/// This process run, and the run before it (dead) or another one.
const A: &str = "boot_a";
const B: &str = "boot_b";
const DIGEST: &str = "sha256:1111";
const OTHER_DIGEST: &str = "sha256:2222";
const KEY: Key<'static> = Key {
    principal: "agent:claude",
    tool: "create_order",
    key: "req-1",
};

fn key(key: &str) -> Key<'_> {
    Key { key, ..KEY }
}

/// The row as stored, or `None`.
async fn row(store: &IdempotencyStore, key: Key<'_>) -> Option<Entry> {
    let row =
        sqlx::query("SELECT * FROM idempotency WHERE principal = ?1 AND tool = ?2 AND key = ?3")
            .bind(key.principal)
            .bind(key.tool)
            .bind(key.key)
            .fetch_optional(store.db.sqlite())
            .await
            .unwrap();
    row.as_ref().map(|row| decode(row).unwrap())
}

async fn user_version(pool: &SqlitePool) -> i64 {
    let (version,): (i64,) = sqlx::query_as("PRAGMA user_version")
        .fetch_one(pool)
        .await
        .unwrap();
    version
}

/// Opens `n` stores on one file concurrently, each with its own pool, as `n` processes would.
async fn stores(dir: &Path, n: usize) -> Vec<IdempotencyStore> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let dir = dir.to_path_buf();
        tasks.push(tokio::spawn(
            async move { IdempotencyStore::open(&dir).await },
        ));
    }
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap().unwrap());
    }
    out
}

#[tokio::test]
async fn a_completed_call_is_replayed_and_never_claimed_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    assert_eq!(
        store.claim(KEY, DIGEST, A, false, T0).await.unwrap(),
        Claim::Claimed
    );
    let claimed = row(&store, KEY).await.unwrap();
    assert_eq!(
        claimed,
        Entry {
            principal: KEY.principal.to_owned(),
            tool: KEY.tool.to_owned(),
            key: KEY.key.to_owned(),
            args_digest: DIGEST.to_owned(),
            state: State::InFlight,
            owner: A.to_owned(),
            result: None,
            created_at: T0,
            updated_at: T0,
        }
    );

    let result =
        json!({"content": [{"type": "text", "text": "order 42 created"}], "isError": false});
    assert!(store.complete(KEY, A, &result, T0 + 5).await.unwrap());
    let done = row(&store, KEY).await.unwrap();
    assert_eq!((done.state, done.updated_at), (State::Done, T0 + 5));
    assert_eq!(done.result.as_ref(), Some(&result));

    // Whoever retries, even allowed to retry in doubt, gets the one result and runs nothing.
    for (owner, retry) in [(A, false), (B, false), (B, true)] {
        assert_eq!(
            store
                .claim(KEY, DIGEST, owner, retry, T0 + 10)
                .await
                .unwrap(),
            Claim::Replay(result.clone())
        );
    }
    // A second completion (or any other change of the owner's) finds no row in flight.
    assert!(
        !store
            .complete(KEY, A, &json!("other"), T0 + 11)
            .await
            .unwrap()
    );
    assert!(!store.release(KEY, A).await.unwrap());
    assert!(!store.mark_in_doubt(KEY, A, T0 + 11).await.unwrap());
    assert_eq!(row(&store, KEY).await.unwrap(), done);
}

#[tokio::test]
async fn other_arguments_under_the_same_key_conflict_in_every_state() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    let in_flight = key("in-flight");
    let in_doubt = key("in-doubt");
    let done = key("done");
    for k in [in_flight, in_doubt, done] {
        assert_eq!(
            store.claim(k, DIGEST, A, false, T0).await.unwrap(),
            Claim::Claimed
        );
    }
    assert!(store.mark_in_doubt(in_doubt, A, T0 + 1).await.unwrap());
    assert!(
        store
            .complete(done, A, &json!({"ok": 1}), T0 + 1)
            .await
            .unwrap()
    );

    for k in [in_flight, in_doubt, done] {
        let before = row(&store, k).await.unwrap();
        for (owner, retry) in [(A, false), (A, true), (B, false), (B, true)] {
            assert_eq!(
                store
                    .claim(k, OTHER_DIGEST, owner, retry, T0 + 2)
                    .await
                    .unwrap(),
                Claim::Conflict,
                "{} by {owner} retry={retry}",
                k.key
            );
        }
        assert_eq!(row(&store, k).await.unwrap(), before, "{}", k.key);
    }
}

#[tokio::test]
async fn a_second_copy_in_the_same_run_is_in_flight_even_when_retries_are_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    assert_eq!(
        store.claim(KEY, DIGEST, A, false, T0).await.unwrap(),
        Claim::Claimed
    );
    let before = row(&store, KEY).await.unwrap();
    for retry in [false, true] {
        assert_eq!(
            store.claim(KEY, DIGEST, A, retry, T0 + 1).await.unwrap(),
            Claim::InFlight
        );
    }
    assert_eq!(row(&store, KEY).await.unwrap(), before);
}

#[tokio::test]
async fn a_dead_runs_key_is_in_doubt_until_a_retry_that_may_is_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    // Run A claims, forwards, and dies before recording anything.
    let dead = IdempotencyStore::open(dir.path()).await.unwrap();
    assert_eq!(
        dead.claim(KEY, DIGEST, A, false, T0).await.unwrap(),
        Claim::Claimed
    );
    dead.db.sqlite().close().await;
    drop(dead);

    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    let stale = row(&store, KEY).await.unwrap();
    assert_eq!(
        store.claim(KEY, DIGEST, B, false, T0 + 1).await.unwrap(),
        Claim::InDoubt
    );
    assert_eq!(
        row(&store, KEY).await.unwrap(),
        stale,
        "a refusal writes nothing"
    );

    // The tool is idempotent upstream: run B takes the key over.
    assert_eq!(
        store.claim(KEY, DIGEST, B, true, T0 + 2).await.unwrap(),
        Claim::Claimed
    );
    let taken = row(&store, KEY).await.unwrap();
    assert_eq!((taken.state, taken.owner.as_str()), (State::InFlight, B));
    assert_eq!((taken.created_at, taken.updated_at), (T0, T0 + 2));
    // The row is no longer A's: a late word from run A changes nothing.
    assert!(
        !store
            .complete(KEY, A, &json!("late"), T0 + 3)
            .await
            .unwrap()
    );
    assert!(!store.release(KEY, A).await.unwrap());
    assert!(!store.mark_in_doubt(KEY, A, T0 + 3).await.unwrap());
    assert_eq!(row(&store, KEY).await.unwrap(), taken);
    // And B's own retries of the call are copies in flight, not in doubt.
    assert_eq!(
        store.claim(KEY, DIGEST, B, true, T0 + 4).await.unwrap(),
        Claim::InFlight
    );

    assert!(store.complete(KEY, B, &json!("ok"), T0 + 5).await.unwrap());
    assert_eq!(
        store.claim(KEY, DIGEST, A, true, T0 + 6).await.unwrap(),
        Claim::Replay(json!("ok"))
    );
}

#[tokio::test]
async fn a_key_marked_in_doubt_is_in_doubt_for_every_run_until_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    assert_eq!(
        store.claim(KEY, DIGEST, A, false, T0).await.unwrap(),
        Claim::Claimed
    );
    assert!(
        !store.mark_in_doubt(KEY, B, T0 + 1).await.unwrap(),
        "not B's"
    );
    assert!(store.mark_in_doubt(KEY, A, T0 + 1).await.unwrap());
    let in_doubt = row(&store, KEY).await.unwrap();
    assert_eq!(
        (in_doubt.state, in_doubt.updated_at),
        (State::InDoubt, T0 + 1)
    );

    for owner in [A, B] {
        assert_eq!(
            store
                .claim(KEY, DIGEST, owner, false, T0 + 2)
                .await
                .unwrap(),
            Claim::InDoubt
        );
    }
    // Only a row in flight can be completed, released or marked: in doubt stays in doubt.
    assert!(
        !store
            .complete(KEY, A, &json!("late"), T0 + 3)
            .await
            .unwrap()
    );
    assert!(!store.release(KEY, A).await.unwrap());
    assert!(!store.mark_in_doubt(KEY, A, T0 + 3).await.unwrap());
    assert_eq!(row(&store, KEY).await.unwrap(), in_doubt);

    // Even the run that marked it may take it over, when the tool allows retrying in doubt.
    assert_eq!(
        store.claim(KEY, DIGEST, A, true, T0 + 4).await.unwrap(),
        Claim::Claimed
    );
    assert!(store.complete(KEY, A, &json!("ok"), T0 + 5).await.unwrap());
}

#[tokio::test]
async fn a_released_key_lets_a_retry_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    assert_eq!(
        store.claim(KEY, DIGEST, A, false, T0).await.unwrap(),
        Claim::Claimed
    );
    assert!(!store.release(KEY, B).await.unwrap(), "not B's");
    assert!(store.release(KEY, A).await.unwrap());
    assert_eq!(row(&store, KEY).await, None);
    assert!(!store.release(KEY, A).await.unwrap(), "already gone");

    // The retry may even carry other arguments: the key was never used.
    assert_eq!(
        store
            .claim(KEY, OTHER_DIGEST, B, false, T0 + 1)
            .await
            .unwrap(),
        Claim::Claimed
    );
    let again = row(&store, KEY).await.unwrap();
    assert_eq!(
        (
            again.args_digest.as_str(),
            again.owner.as_str(),
            again.created_at
        ),
        (OTHER_DIGEST, B, T0 + 1)
    );
}

#[tokio::test]
async fn keys_are_scoped_to_the_principal_and_the_tool() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    let other_principal = Key {
        principal: "agent:other",
        ..KEY
    };
    let other_tool = Key {
        tool: "delete_order",
        ..KEY
    };
    for k in [KEY, other_principal, other_tool] {
        assert_eq!(
            store.claim(k, DIGEST, A, false, T0).await.unwrap(),
            Claim::Claimed
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_of_16_concurrent_claimers_in_two_processes_claims() {
    let dir = tempfile::tempdir().unwrap();
    let processes = stores(dir.path(), 2).await;
    let claimers = 16;
    let barrier = Arc::new(Barrier::new(claimers));
    let mut tasks = Vec::new();
    for i in 0..claimers {
        // Each process is its own run, with its own boot id.
        let (store, owner) = (processes[i % 2].clone(), [A, B][i % 2]);
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            let claim = store.claim(KEY, DIGEST, owner, false, T0).await.unwrap();
            (owner, claim)
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let winners: Vec<&str> = answers
        .iter()
        .filter(|(_, claim)| *claim == Claim::Claimed)
        .map(|(owner, _)| *owner)
        .collect();
    assert_eq!(winners.len(), 1, "{answers:?}");
    let winner = winners[0];
    // The others were told the truth: a copy runs in their process, or in another (which, since
    // only one run serves a data directory, they must take for a dead one).
    for (owner, claim) in &answers {
        if *claim != Claim::Claimed {
            let expected = if *owner == winner {
                Claim::InFlight
            } else {
                Claim::InDoubt
            };
            assert_eq!(*claim, expected, "{answers:?}");
        }
    }
    let claimed = row(&processes[0], KEY).await.unwrap();
    assert_eq!(
        (claimed.state, claimed.owner.as_str()),
        (State::InFlight, winner)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exactly_one_of_16_concurrent_takeovers_claims() {
    let dir = tempfile::tempdir().unwrap();
    let processes = stores(dir.path(), 2).await;
    assert_eq!(
        processes[0]
            .claim(KEY, DIGEST, "boot_dead", false, T0)
            .await
            .unwrap(),
        Claim::Claimed
    );
    assert!(
        processes[0]
            .mark_in_doubt(KEY, "boot_dead", T0)
            .await
            .unwrap()
    );

    // The next run retries the call many times at once, through two pools.
    let claimers = 16;
    let barrier = Arc::new(Barrier::new(claimers));
    let mut tasks = Vec::new();
    for i in 0..claimers {
        let store = processes[i % 2].clone();
        let barrier = Arc::clone(&barrier);
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.claim(KEY, DIGEST, B, true, T0 + 1).await.unwrap()
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let claimed = answers.iter().filter(|c| **c == Claim::Claimed).count();
    let in_flight = answers.iter().filter(|c| **c == Claim::InFlight).count();
    assert_eq!((claimed, in_flight), (1, claimers - 1), "{answers:?}");
}

#[tokio::test]
async fn unresolved_lists_what_nobody_recorded_and_forget_lets_a_retry_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    // Oldest first: the dead run's row, then this run's.
    let dead_in_flight = key("k1");
    let ours_in_doubt = key("k2");
    let ours_in_flight = key("k3");
    let done = key("k4");
    assert_eq!(
        store
            .claim(dead_in_flight, DIGEST, B, false, T0)
            .await
            .unwrap(),
        Claim::Claimed
    );
    for (i, k) in [ours_in_doubt, ours_in_flight, done]
        .into_iter()
        .enumerate()
    {
        let at = T0 + 1 + i64::try_from(i).unwrap();
        assert_eq!(
            store.claim(k, DIGEST, A, false, at).await.unwrap(),
            Claim::Claimed
        );
    }
    assert!(
        store
            .mark_in_doubt(ours_in_doubt, A, T0 + 10)
            .await
            .unwrap()
    );
    assert!(
        store
            .complete(done, A, &json!("ok"), T0 + 10)
            .await
            .unwrap()
    );

    let keys = |entries: Vec<Entry>| entries.into_iter().map(|e| e.key).collect::<Vec<_>>();
    assert_eq!(keys(store.unresolved(A).await.unwrap()), ["k1", "k2"]);
    // A person's command is no serving run: it sees every call in flight.
    assert_eq!(
        keys(store.unresolved("boot_cli").await.unwrap()),
        ["k1", "k2", "k3"]
    );
    let listed = store.unresolved(A).await.unwrap();
    assert_eq!(
        (
            listed[1].state,
            listed[1].owner.as_str(),
            listed[1].updated_at
        ),
        (State::InDoubt, A, T0 + 10)
    );

    // A done key is known, never forgotten.
    assert!(!store.forget(KEY.principal, KEY.tool, "k4").await.unwrap());
    assert_eq!(
        store.claim(done, DIGEST, B, true, T0 + 11).await.unwrap(),
        Claim::Replay(json!("ok"))
    );
    assert!(
        !store
            .forget(KEY.principal, KEY.tool, "missing")
            .await
            .unwrap()
    );
    assert!(!store.forget("agent:other", KEY.tool, "k1").await.unwrap());

    assert!(store.forget(KEY.principal, KEY.tool, "k1").await.unwrap());
    assert!(store.forget(KEY.principal, KEY.tool, "k2").await.unwrap());
    assert!(store.unresolved(A).await.unwrap().is_empty());
    for k in [dead_in_flight, ours_in_doubt] {
        assert_eq!(
            store.claim(k, DIGEST, A, false, T0 + 12).await.unwrap(),
            Claim::Claimed
        );
    }
}

#[tokio::test]
async fn results_round_trip_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    let result = json!({
        "content": [{"type": "text", "text": "naïve \u{202e} \"quoted\"\n"}],
        "structuredContent": {"id": 9_007_199_254_740_993_u64, "price": 12.5, "tags": [], "none": null},
        "isError": false
    });
    assert_eq!(
        store.claim(KEY, DIGEST, A, false, T0).await.unwrap(),
        Claim::Claimed
    );
    assert!(store.complete(KEY, A, &result, T0 + 1).await.unwrap());
    assert_eq!(
        store.claim(KEY, DIGEST, A, false, T0 + 2).await.unwrap(),
        Claim::Replay(result)
    );
}

#[tokio::test]
async fn the_store_beside_the_approval_queue_shares_its_file() {
    let dir = tempfile::tempdir().unwrap();
    let approvals = ApprovalStore::open(dir.path()).await.unwrap();
    let store = IdempotencyStore::beside(&approvals);
    assert_eq!(
        store.claim(KEY, DIGEST, A, false, T0).await.unwrap(),
        Claim::Claimed
    );
    let other = IdempotencyStore::open(dir.path()).await.unwrap();
    assert_eq!(
        other.claim(KEY, DIGEST, A, false, T0).await.unwrap(),
        Claim::InFlight
    );
}

#[tokio::test]
async fn a_fresh_file_gets_every_table_at_the_current_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    assert_eq!(user_version(store.db.sqlite()).await, SCHEMA_VERSION);
    assert_eq!(SCHEMA_VERSION, 6);
    let tables: Vec<(String,)> =
        sqlx::query_as("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(store.db.sqlite())
            .await
            .unwrap();
    let tables: Vec<&str> = tables.iter().map(|(name,)| name.as_str()).collect();
    assert_eq!(
        tables,
        [
            "agent_runs",
            "approval_tasks",
            "approval_votes",
            "approvals",
            "budget_charges",
            "console_logins",
            "console_oidc_logins",
            "console_sessions",
            "idempotency",
            "killswitch",
            "killswitch_principals",
            "rate_buckets",
            "toolgate_owners"
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_version_1_file_is_upgraded_in_place_and_keeps_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    // A file as the version 1 code left it: its schema, a pending approval, the switch on.
    let v1 = sqlx::SqlitePool::connect_with(
        SqliteConnectOptions::new()
            .filename(dir.path().join(DB_FILE))
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal),
    )
    .await
    .unwrap();
    let mut tx = v1.begin().await.unwrap();
    sqlx::raw_sql(SCHEMA_V1).execute(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    sqlx::query(
        "INSERT INTO approvals (id, fingerprint, requester, tool, args_redacted, tier, reason,
             dry_run, policy_sha256, status, created_at, expires_at)
         VALUES ('apr_0123456789ab', 'fp-1', 'agent:claude', 'delete_branch', '{\"branch\":\"main\"}',
             'high', 'deletes a protected branch', '{}', ?1, 'pending', ?2, ?3)",
    )
    .bind("ab".repeat(32))
    .bind(T0)
    .bind(T0 + 60_000)
    .execute(&v1)
    .await
    .unwrap();
    sqlx::query("UPDATE killswitch SET engaged = 1, changed_by = 'human:alice', changed_at = ?1")
        .bind(T0)
        .execute(&v1)
        .await
        .unwrap();
    assert_eq!(user_version(&v1).await, 1);
    v1.close().await;

    // Several processes of the new version open it at once: one upgrades, all agree.
    let upgraded = stores(dir.path(), 8).await;
    assert_eq!(user_version(upgraded[5].db.sqlite()).await, SCHEMA_VERSION);
    assert_eq!(
        upgraded[3].claim(KEY, DIGEST, A, false, T0).await.unwrap(),
        Claim::Claimed
    );

    let approvals = ApprovalStore::open(dir.path()).await.unwrap();
    let kept = approvals
        .get("apr_0123456789ab", T0)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (kept.status, kept.requester.as_str(), kept.args_redacted),
        (Status::Pending, "agent:claude", json!({"branch": "main"}))
    );
    let state = StateStore::open(dir.path()).await.unwrap();
    let switch = state.killswitch().await.unwrap();
    assert_eq!(
        (switch.on, switch.changed_by.as_deref()),
        (true, Some("human:alice"))
    );
}

#[tokio::test]
async fn a_file_of_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    assert_eq!(SCHEMA_VERSION, 6);
    sqlx::query("PRAGMA user_version = 7")
        .execute(store.db.sqlite())
        .await
        .unwrap();
    store.db.sqlite().close().await;
    let err = IdempotencyStore::open(dir.path()).await.unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::SchemaTooNew {
                found: 7,
                supported: SCHEMA_VERSION,
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn the_boot_id_is_one_per_process_and_random_looking() {
    let id = boot_id();
    assert_eq!(boot_id(), id);
    let hex = id.strip_prefix("boot_").unwrap();
    assert_eq!(hex.len(), 32, "{id}");
    assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()), "{id}");
    assert_ne!(&hex[..16], &hex[16..], "{id}");
}

#[tokio::test]
async fn unresolved_counts_tell_running_keys_from_those_in_doubt() {
    let dir = tempfile::tempdir().unwrap();
    let store = IdempotencyStore::open(dir.path()).await.unwrap();
    assert_eq!(store.unresolved_counts(A, T0).await.unwrap(), (0, 0));
    for (k, owner) in [("running", A), ("marked", A), ("done", A), ("cut-off", B)] {
        assert_eq!(
            store.claim(key(k), DIGEST, owner, false, T0).await.unwrap(),
            Claim::Claimed
        );
    }
    assert!(store.mark_in_doubt(key("marked"), A, T0 + 1).await.unwrap());
    assert!(
        store
            .complete(key("done"), A, &json!({"ok": 1}), T0 + 1)
            .await
            .unwrap()
    );
    // Ours running; the one marked and the one a dead run left in flight are in doubt.
    assert_eq!(store.unresolved_counts(A, T0).await.unwrap(), (1, 2));
    // Seen from B's run: its own row is running, A's in-flight row is in doubt.
    assert_eq!(store.unresolved_counts(B, T0).await.unwrap(), (1, 2));
}
