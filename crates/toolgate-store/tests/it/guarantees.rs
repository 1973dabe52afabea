//! One suite, three stores: each test states a rule a caller of the gate relies on and checks it
//! on SQLite, PostgreSQL and memory alike, with concurrent callers on separate handles (separate
//! pools: separate processes or replicas) where the rule is about races.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio::sync::Barrier;
use toolgate_store::approval::{DecideError, NewApproval, Status, Verdict};
use toolgate_store::idempotency::{Claim, Key};
use toolgate_store::state::REPLICA_REFRESH;

use crate::backends;

const T0: i64 = 1_700_000_000_000;
const AGENT: &str = "agent:claude";
const KEY: Key<'static> = Key {
    principal: AGENT,
    tool: "create_order",
    key: "req-1",
};

fn new_approval(fingerprint: &str) -> NewApproval {
    NewApproval {
        fingerprint: fingerprint.to_owned(),
        requester: AGENT.to_owned(),
        tool: "refund".to_owned(),
        args_redacted: json!({"amount": 49}),
        tier: "high".to_owned(),
        reason: "a refund over 20".to_owned(),
        dry_run: json!({"would_refund": 49}),
        policy_sha256: "ab".repeat(32),
        expires_at: T0 + 60_000,
        approvers: None,
        approvals_required: 1,
    }
}

/// Runs `body` on `n` handles at once, released together, and returns what each answered.
async fn race<H, F, T>(handles: Vec<H>, body: impl Fn(usize, H) -> F) -> Vec<T>
where
    H: Send + 'static,
    F: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(Barrier::new(handles.len()));
    let tasks: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(i, handle)| {
            let barrier = Arc::clone(&barrier);
            let work = body(i, handle);
            tokio::spawn(async move {
                barrier.wait().await;
                work.await
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("no task panics"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_32_concurrent_claims_of_one_key_exactly_one_runs_and_the_rest_replay() {
    for backend in backends::all().await {
        let handles: Vec<_> = backend.keys(4).await.into_iter().cycle().take(32).collect();
        // Every claimer is the same process run: the others find the key in flight.
        let answers = race(handles.clone(), |_, keys| async move {
            keys.claim(KEY, "sha256:1", "boot_a", false, T0)
                .await
                .unwrap()
        })
        .await;
        let claimed = answers.iter().filter(|a| **a == Claim::Claimed).count();
        assert_eq!(claimed, 1, "{}: {answers:?}", backend.name);
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Claim::Claimed | Claim::InFlight)),
            "{}: {answers:?}",
            backend.name
        );
        let keys = &handles[0];
        assert!(
            keys.complete(KEY, "boot_a", &json!({"order": 7}), T0 + 1)
                .await
                .unwrap()
        );
        for keys in &handles[..4] {
            assert_eq!(
                keys.claim(KEY, "sha256:1", "boot_a", true, T0 + 2)
                    .await
                    .unwrap(),
                Claim::Replay(json!({"order": 7})),
                "{}",
                backend.name
            );
            assert_eq!(
                keys.claim(KEY, "sha256:2", "boot_a", true, T0 + 2)
                    .await
                    .unwrap(),
                Claim::Conflict,
                "{}: other arguments under a used key",
                backend.name
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_runs_key_is_in_doubt_and_of_16_takeovers_exactly_one_claims() {
    for backend in backends::all().await {
        let handles = backend.keys(4).await;
        // boot_dead claimed and never came back: no lease was ever renewed for it.
        assert_eq!(
            handles[0]
                .claim(KEY, "sha256:1", "boot_dead", false, T0)
                .await
                .unwrap(),
            Claim::Claimed
        );
        assert_eq!(
            handles[1]
                .claim(KEY, "sha256:1", "boot_b", false, T0 + 1)
                .await
                .unwrap(),
            Claim::InDoubt,
            "{}: never run again blindly",
            backend.name
        );
        let racers: Vec<_> = handles.into_iter().cycle().take(16).collect();
        // The retries of the run after it (one owner: on SQLite, another owner in flight is dead).
        let answers = race(racers, |_, keys| async move {
            keys.claim(KEY, "sha256:1", "boot_b", true, T0 + 2)
                .await
                .unwrap()
        })
        .await;
        let claimed = answers.iter().filter(|a| **a == Claim::Claimed).count();
        assert_eq!(claimed, 1, "{}: {answers:?}", backend.name);
        assert!(
            answers
                .iter()
                .all(|a| matches!(a, Claim::Claimed | Claim::InFlight)),
            "{}: {answers:?}",
            backend.name
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_8_deciders_on_separate_handles_exactly_one_decides_and_the_rest_are_told_who() {
    for backend in backends::all().await {
        let handles = backend.approvals(8).await;
        let (approval, created) = handles[0].request(new_approval("fp-1"), T0).await.unwrap();
        assert!(created);
        let id = approval.id.clone();
        let answers = race(handles.clone(), |i, store| {
            let id = id.clone();
            async move {
                let verdict = if i % 2 == 0 {
                    Verdict::Approve
                } else {
                    Verdict::Deny
                };
                store
                    .decide(
                        &id,
                        &format!("human:p{i}"),
                        verdict,
                        Some("because"),
                        T0 + 1,
                    )
                    .await
            }
        })
        .await;
        let winners: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{}: {answers:?}", backend.name);
        let winner = winners[0];
        for answer in &answers {
            if let Err(error) = answer {
                assert!(
                    matches!(error, DecideError::AlreadyDecided { status, by, .. }
                        if *status == winner.status && by == &winner.decided_by),
                    "{}: {error:?}",
                    backend.name
                );
            }
        }
        let stored = handles[7].get(&id, T0 + 2).await.unwrap().unwrap();
        assert_eq!(&stored, winner, "{}", backend.name);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approval_runs_once_whoever_consumes_it_and_a_retry_attaches_to_its_request() {
    for backend in backends::all().await {
        let handles = backend.approvals(4).await;
        // 8 retries of one pending call: one row.
        let rows = race(
            handles.iter().cloned().cycle().take(8).collect(),
            |_, store| async move { store.request(new_approval("fp-1"), T0).await.unwrap() },
        )
        .await;
        assert_eq!(
            rows.iter().filter(|(_, created)| *created).count(),
            1,
            "{}",
            backend.name
        );
        let id = rows[0].0.id.clone();
        assert!(rows.iter().all(|(row, _)| row.id == id), "{}", backend.name);
        handles[1]
            .decide(&id, "human:alice", Verdict::Approve, None, T0 + 1)
            .await
            .unwrap();
        let used = race(
            handles.iter().cloned().cycle().take(16).collect(),
            |_, store| {
                let id = id.clone();
                async move { store.consume(&id, T0 + 2).await.unwrap() }
            },
        )
        .await;
        assert_eq!(
            used.iter().filter(|used| **used).count(),
            1,
            "{}",
            backend.name
        );
    }
}

#[tokio::test]
async fn nobody_approves_their_own_request_and_expiry_is_a_denial_a_late_click_cannot_change() {
    for backend in backends::all().await {
        let handles = backend.approvals(2).await;
        let (approval, _) = handles[0].request(new_approval("fp-1"), T0).await.unwrap();
        let own = handles[1]
            .decide(&approval.id, AGENT, Verdict::Approve, None, T0 + 1)
            .await;
        assert!(
            matches!(own, Err(DecideError::SelfApproval { .. })),
            "{}: {own:?}",
            backend.name
        );
        let late = handles[1]
            .decide(
                &approval.id,
                "human:alice",
                Verdict::Approve,
                None,
                approval.expires_at,
            )
            .await;
        assert!(
            matches!(late, Err(DecideError::Expired { .. })),
            "{}: {late:?}",
            backend.name
        );
        let row = handles[0]
            .get(&approval.id, approval.expires_at)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(row.status, Status::Expired, "{}", backend.name);
        assert_eq!(row.decided_by, None, "{}", backend.name);
        assert!(
            !handles[0]
                .consume(&approval.id, approval.expires_at + 1)
                .await
                .unwrap()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_people_must_approve_and_concurrent_votes_of_both_approve_it_once() {
    for backend in backends::all().await {
        let handles = backend.approvals(4).await;
        let mut new = new_approval("fp-2");
        new.approvals_required = 2;
        let (approval, _) = handles[0].request(new, T0).await.unwrap();
        let id = approval.id.clone();
        // alice twice (two browsers), bob twice: one vote each.
        let answers = race(handles.clone(), |i, store| {
            let id = id.clone();
            async move {
                let who = if i % 2 == 0 {
                    "human:alice"
                } else {
                    "human:bob"
                };
                store.decide(&id, who, Verdict::Approve, None, T0 + 1).await
            }
        })
        .await;
        let row = handles[3].get(&id, T0 + 2).await.unwrap().unwrap();
        assert_eq!(
            row.status,
            Status::Approved,
            "{}: {answers:?}",
            backend.name
        );
        assert_eq!(
            handles[2].votes(&id).await.unwrap().len(),
            2,
            "{}",
            backend.name
        );
        assert!(handles[1].consume(&id, T0 + 3).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_24_concurrent_medium_calls_against_a_budget_of_5_exactly_5_are_charged() {
    for backend in backends::all().await {
        let handles: Vec<_> = backend
            .state(4)
            .await
            .into_iter()
            .cycle()
            .take(24)
            .collect();
        let answers = race(handles, |i, state| async move {
            state
                .charge_budget(AGENT, 5, 60_000, T0 + i64::try_from(i).unwrap())
                .await
                .unwrap()
        })
        .await;
        assert_eq!(
            answers.iter().filter(|charged| **charged).count(),
            5,
            "{}: {answers:?}",
            backend.name
        );
        // Another principal has its own budget.
        let state = backend.state(1).await.remove(0);
        assert!(
            state
                .charge_budget("agent:other", 5, 60_000, T0)
                .await
                .unwrap()
        );
        // Out of the window, the budget is back.
        assert!(
            state
                .charge_budget(AGENT, 5, 60_000, T0 + 61_000)
                .await
                .unwrap()
        );
    }
}

#[tokio::test]
async fn a_kill_switch_set_through_one_handle_stops_every_other_within_the_refresh() {
    for backend in backends::all().await {
        let handles = backend.state(3).await;
        // Each handle has read (and cached) the switch off.
        for state in &handles {
            assert_eq!(state.blocks(AGENT).await.unwrap(), None);
        }
        handles[0]
            .set_killswitch(true, "human:sre", T0)
            .await
            .unwrap();
        tokio::time::sleep(REPLICA_REFRESH + Duration::from_millis(50)).await;
        for state in &handles {
            assert!(
                state.killswitch_on().await.unwrap(),
                "{}: a handle still runs calls",
                backend.name
            );
        }
        handles[2]
            .set_killswitch(false, "human:sre", T0 + 1)
            .await
            .unwrap();
        handles[1]
            .set_principal_killswitch(AGENT, true, "human:sre", T0 + 2)
            .await
            .unwrap();
        tokio::time::sleep(REPLICA_REFRESH + Duration::from_millis(50)).await;
        for state in &handles {
            assert_eq!(
                state.blocks(AGENT).await.unwrap(),
                Some(toolgate_store::state::Blocked::Principal),
                "{}",
                backend.name
            );
            assert_eq!(state.blocks("agent:other").await.unwrap(), None);
        }
        let switch = handles[2].killswitch().await.unwrap();
        assert_eq!(
            (switch.on, switch.changed_by.as_deref()),
            (false, Some("human:sre")),
            "{}",
            backend.name
        );
    }
}

/// PostgreSQL replicas are alive beside each other: a key in flight under another replica whose
/// lease is current is that replica's running call (in flight, not in doubt), and only once its
/// lease runs out, as after a SIGKILL, is it in doubt.
#[tokio::test]
async fn on_postgres_a_live_replicas_key_is_in_flight_and_a_dead_ones_is_in_doubt() {
    let location = backends::fresh_postgres().await;
    let toolgate_store::Location::Postgres(url) = &location else {
        unreachable!()
    };
    let keys = IdempotencyStoreHandle::open(&location).await;
    assert_eq!(
        keys.claim(KEY, "sha256:1", "boot_replica_b", false, T0)
            .await
            .unwrap(),
        Claim::Claimed
    );
    let raw = sqlx::postgres::PgPool::connect(url).await.unwrap();
    sqlx::query("INSERT INTO toolgate_owners (owner, alive_until) VALUES ('boot_replica_b', $1)")
        .bind(T0 + 5_000)
        .execute(&raw)
        .await
        .unwrap();
    assert_eq!(
        keys.claim(KEY, "sha256:1", "boot_replica_a", true, T0 + 1_000)
            .await
            .unwrap(),
        Claim::InFlight,
        "a live replica's call is not taken over, even when retries are allowed"
    );
    assert_eq!(
        keys.unresolved_counts("boot_replica_a", T0 + 1_000)
            .await
            .unwrap(),
        (0, 0)
    );
    assert_eq!(
        keys.claim(KEY, "sha256:1", "boot_replica_a", false, T0 + 5_000)
            .await
            .unwrap(),
        Claim::InDoubt,
        "its lease ran out: it died mid-call"
    );
    assert_eq!(
        keys.unresolved_counts("boot_replica_a", T0 + 5_000)
            .await
            .unwrap(),
        (0, 1)
    );
    raw.close().await;
}

/// The idempotency store of a fresh approval queue on `location`.
struct IdempotencyStoreHandle;

impl IdempotencyStoreHandle {
    async fn open(
        location: &toolgate_store::Location,
    ) -> toolgate_store::idempotency::IdempotencyStore {
        let approvals = toolgate_store::approval::ApprovalStore::at(location)
            .await
            .unwrap();
        toolgate_store::idempotency::IdempotencyStore::beside(&approvals)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_starting_together_migrate_a_new_postgres_database_once() {
    let location = backends::fresh_postgres().await;
    let opened = race(vec![location; 6], |_, location| async move {
        toolgate_store::approval::ApprovalStore::at(&location).await
    })
    .await;
    for store in &opened {
        let store = store.as_ref().expect("every replica opens");
        store.answers().await.unwrap();
        assert_eq!(store.backend(), "postgres");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn of_12_concurrent_takes_from_a_bucket_of_3_exactly_3_pass_and_one_comes_back_per_period() {
    for backend in backends::all().await {
        let handles: Vec<_> = backend
            .state(3)
            .await
            .into_iter()
            .cycle()
            .take(12)
            .collect();
        let answers = race(handles.clone(), |_, state| async move {
            state
                .take_rate(AGENT, "lookup_order", 1_000, 3, T0)
                .await
                .unwrap()
        })
        .await;
        assert_eq!(
            answers.iter().filter(|a| a.is_ok()).count(),
            3,
            "{}: {answers:?}",
            backend.name
        );
        // Three spent, one back every second: the next call 1 s from now.
        assert!(
            answers.iter().all(|a| a.is_ok() || *a == Err(1_000)),
            "{}: {answers:?}",
            backend.name
        );
        let state = &handles[0];
        assert_eq!(
            state
                .take_rate(AGENT, "lookup_order", 1_000, 3, T0 + 999)
                .await
                .unwrap(),
            Err(1)
        );
        assert_eq!(
            state
                .take_rate(AGENT, "lookup_order", 1_000, 3, T0 + 1_000)
                .await
                .unwrap(),
            Ok(())
        );
        assert!(
            state
                .take_rate(AGENT, "lookup_order", 1_000, 3, T0 + 1_000)
                .await
                .unwrap()
                .is_err()
        );
        // Another principal, another tool, another quota: other buckets.
        assert_eq!(
            state
                .take_rate("agent:other", "lookup_order", 1_000, 3, T0)
                .await
                .unwrap(),
            Ok(())
        );
        assert_eq!(
            state
                .take_rate(AGENT, "refund", 1_000, 3, T0)
                .await
                .unwrap(),
            Ok(())
        );
        assert_eq!(
            state
                .take_rate(AGENT, "lookup_order", 1_000, 5, T0)
                .await
                .unwrap(),
            Ok(())
        );
    }
}
