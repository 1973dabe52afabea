use super::{ConsoleStore, OidcLogin, Session, Via};
use crate::approval::ApprovalStore;

const T0: i64 = 1_800_000_000_000;
const HOUR: i64 = 3_600_000;

async fn store(dir: &std::path::Path) -> ConsoleStore {
    ConsoleStore::beside(&ApprovalStore::open(dir).await.unwrap())
}

fn dana(expires_at: i64) -> Session {
    Session {
        identity: "user:dana".to_owned(),
        groups: vec!["finance".to_owned(), "approvers".to_owned()],
        via: Via::Oidc,
        expires_at,
    }
}

#[tokio::test]
async fn a_login_link_opens_once_and_never_after_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    store
        .mint_login("aa", "human:dana", T0 + HOUR, T0)
        .await
        .unwrap();
    store
        .mint_login("bb", "human:lee", T0 + HOUR, T0)
        .await
        .unwrap();

    assert_eq!(
        store.redeem_login("aa", T0 + 1).await.unwrap().as_deref(),
        Some("human:dana")
    );
    assert_eq!(store.redeem_login("aa", T0 + 2).await.unwrap(), None);
    assert_eq!(store.redeem_login("zz", T0 + 2).await.unwrap(), None);
    // At its deadline a link is dead, used or not.
    assert_eq!(store.redeem_login("bb", T0 + HOUR).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_processes_racing_on_one_link_get_one_session_between_them() {
    let dir = tempfile::tempdir().unwrap();
    store(dir.path())
        .await
        .mint_login("race", "human:dana", T0 + HOUR, T0)
        .await
        .unwrap();
    let mut racers = Vec::new();
    for _ in 0..8 {
        // Each its own handle (its own connection), as separate processes would have.
        let store = store(dir.path()).await;
        racers.push(tokio::spawn(async move {
            store.redeem_login("race", T0 + 1).await.unwrap()
        }));
    }
    let mut won = 0;
    for racer in racers {
        if racer.await.unwrap().is_some() {
            won += 1;
        }
    }
    assert_eq!(won, 1);
}

#[tokio::test]
async fn a_session_identifies_its_person_until_it_expires_or_is_ended() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    store
        .open_session("s1", &dana(T0 + HOUR), T0)
        .await
        .unwrap();
    store
        .open_session("s2", &dana(T0 + HOUR), T0)
        .await
        .unwrap();

    assert_eq!(
        store.session("s1", T0 + 1).await.unwrap(),
        Some(dana(T0 + HOUR))
    );
    // Another handle (another process) sees it too.
    let other = ConsoleStore::beside(&ApprovalStore::open(dir.path()).await.unwrap());
    assert_eq!(
        other
            .session("s1", T0 + 1)
            .await
            .unwrap()
            .map(|s| s.identity),
        Some("user:dana".to_owned())
    );
    assert_eq!(store.session("s1", T0 + HOUR).await.unwrap(), None);
    assert_eq!(store.session("unknown", T0).await.unwrap(), None);

    other.end_session("s2", T0 + 2).await.unwrap();
    other.end_session("s2", T0 + 3).await.unwrap();
    assert_eq!(store.session("s2", T0 + 4).await.unwrap(), None);
}

#[tokio::test]
async fn minting_forgets_what_can_no_longer_be_used() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    store
        .mint_login("old", "human:a", T0 + 10, T0)
        .await
        .unwrap();
    store
        .mint_login("used", "human:a", T0 + HOUR, T0)
        .await
        .unwrap();
    store.redeem_login("used", T0 + 1).await.unwrap();
    store
        .open_session("gone", &dana(T0 + 10), T0)
        .await
        .unwrap();
    store
        .mint_login("new", "human:a", T0 + HOUR, T0 + 20)
        .await
        .unwrap();

    let (logins,): (i64,) = sqlx::query_as("SELECT count(*) FROM console_logins")
        .fetch_one(store.db.sqlite())
        .await
        .unwrap();
    let (sessions,): (i64,) = sqlx::query_as("SELECT count(*) FROM console_sessions")
        .fetch_one(store.db.sqlite())
        .await
        .unwrap();
    assert_eq!((logins, sessions), (1, 0));
}

#[tokio::test]
async fn an_oidc_sign_in_finishes_once_and_not_after_its_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = store(dir.path()).await;
    let login = OidcLogin {
        nonce: "n".to_owned(),
        code_verifier: "v".to_owned(),
        next: "/approvals/apr_1".to_owned(),
    };
    store
        .begin_oidc("st", &login, T0 + 600_000, T0)
        .await
        .unwrap();
    store.begin_oidc("late", &login, T0 + 10, T0).await.unwrap();
    assert_eq!(store.finish_oidc("st", T0 + 1).await.unwrap(), Some(login));
    assert_eq!(
        store.finish_oidc("st", T0 + 2).await.unwrap(),
        None,
        "a replayed state"
    );
    assert_eq!(store.finish_oidc("late", T0 + 10).await.unwrap(), None);
    assert_eq!(store.finish_oidc("never", T0).await.unwrap(), None);
}
