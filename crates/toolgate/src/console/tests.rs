//! The console through `tower::ServiceExt::oneshot`, over a real approval queue in a SQLite file:
//! who gets in, what a request without a session learns (nothing), CSRF, and that every decision
//! is the queue's (first decision wins, no self-approval, two distinct approvers). The browser
//! and real processes are the CLI's tests.

use axum::body::Body;
use http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::json;
use toolgate_core::time::now_ms;
use toolgate_store::approval::{Approval, ApprovalStore, NewApproval, Status};
use tower::ServiceExt;

use super::{Console, mint_link};
use crate::http::HttpConfig;

const ORIGIN: &str = "http://127.0.0.1:8710";

struct Fixture {
    _dir: tempfile::TempDir,
    approvals: ApprovalStore,
    app: axum::Router,
    base: &'static str,
}

async fn fixture(base: &'static str) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let approvals = ApprovalStore::open(dir.path()).await.unwrap();
    let config = HttpConfig::new(&format!("{ORIGIN}/"))
        .unwrap()
        .with_loopback_origins("127.0.0.1:8710".parse().unwrap());
    let mut console = Console::new(approvals.clone(), &config);
    if !base.is_empty() {
        console = console.mounted_at(base);
    }
    Fixture {
        _dir: dir,
        approvals,
        app: console.router(),
        base,
    }
}

fn new_approval(fingerprint: &str, requester: &str) -> NewApproval {
    NewApproval {
        fingerprint: fingerprint.to_owned(),
        requester: requester.to_owned(),
        tool: "refund".to_owned(),
        args_redacted: json!({"order_id": "ord_<script>alert(1)</script>", "amount": 49}),
        tier: "high".to_owned(),
        reason: "tools.refund.escalate[0]: args.amount > 25".to_owned(),
        dry_run: json!({"would": "refund 49.00 to ord_1001"}),
        policy_sha256: "ab".repeat(32),
        expires_at: now_ms() + 60_000,
        approvers: None,
        approvals_required: 1,
    }
}

struct Reply {
    status: StatusCode,
    headers: http::HeaderMap,
    body: String,
}

impl Fixture {
    async fn pending(&self, new: NewApproval) -> Approval {
        self.approvals.request(new, now_ms()).await.unwrap().0
    }

    async fn send(&self, request: Request<Body>) -> Reply {
        let response = self.app.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        Reply {
            status,
            headers,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }

    fn path(&self, rest: &str) -> String {
        format!("{}{rest}", self.base)
    }

    async fn get(&self, path: &str, cookie: Option<&str>) -> Reply {
        let mut request = Request::get(self.path(path)).header(header::HOST, "127.0.0.1:8710");
        if let Some(cookie) = cookie {
            request = request.header(header::COOKIE, cookie);
        }
        self.send(request.body(Body::empty()).unwrap()).await
    }

    async fn post(
        &self,
        path: &str,
        cookie: Option<&str>,
        origin: Option<&str>,
        form: &str,
    ) -> Reply {
        let mut request = Request::post(self.path(path))
            .header(header::HOST, "127.0.0.1:8710")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if let Some(cookie) = cookie {
            request = request.header(header::COOKIE, cookie);
        }
        if let Some(origin) = origin {
            request = request.header(header::ORIGIN, origin);
        }
        self.send(request.body(Body::from(form.to_owned())).unwrap())
            .await
    }

    /// Signs in with a fresh login link as `identity`: the session cookie (`name=value`).
    async fn sign_in(&self, identity: &str) -> String {
        let store = toolgate_store::console::ConsoleStore::beside(&self.approvals);
        let now = now_ms();
        let token = mint_link(&store, identity, now + 60_000, now)
            .await
            .unwrap();
        let reply = self.get(&format!("/login?token={token}"), None).await;
        assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
        let cookie = reply.headers[header::SET_COOKIE].to_str().unwrap();
        cookie.split(';').next().unwrap().to_owned()
    }

    /// The CSRF token on the request's page, as the form carries it.
    async fn csrf(&self, cookie: &str, id: &str) -> String {
        let page = self.get(&format!("/approvals/{id}"), Some(cookie)).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.body);
        let at = page
            .body
            .find(r#"name="csrf" value=""#)
            .expect("a CSRF field")
            + 19;
        page.body[at..at + 64].to_owned()
    }

    async fn status(&self, id: &str) -> Status {
        self.approvals
            .get(id, now_ms())
            .await
            .unwrap()
            .unwrap()
            .status
    }
}

#[tokio::test]
async fn without_a_session_pages_redirect_to_sign_in_and_endpoints_answer_401_saying_nothing() {
    let f = fixture("").await;
    let row = f.pending(new_approval("fp", "agent:shop")).await;
    for path in [
        "/",
        &format!("/approvals/{}", row.id),
        "/approvals/apr_unknown",
    ] {
        let reply = f.get(path, None).await;
        assert_eq!(reply.status, StatusCode::SEE_OTHER, "{path}");
        let location = reply.headers[header::LOCATION].to_str().unwrap();
        assert!(location.starts_with("/login?next=%2F"), "{location}");
        assert!(!reply.body.contains("refund"), "{path}: {}", reply.body);
    }
    let events = f.get("/events", None).await;
    assert_eq!(events.status, StatusCode::UNAUTHORIZED);
    let forged = format!("{}={}", super::login::COOKIE, "ab".repeat(32));
    for cookie in [None, Some(forged.as_str())] {
        let reply = f
            .post(
                &format!("/approvals/{}", row.id),
                cookie,
                Some(ORIGIN),
                "verdict=approve",
            )
            .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert!(!reply.body.contains("refund"));
    }
    assert_eq!(f.status(&row.id).await, Status::Pending);
    let login = f.get("/login", None).await;
    assert_eq!(login.status, StatusCode::OK);
    assert!(!login.body.contains(&row.id));
}

#[tokio::test]
async fn a_login_link_works_once_and_sets_an_http_only_same_site_cookie() {
    let f = fixture("").await;
    let store = toolgate_store::console::ConsoleStore::beside(&f.approvals);
    let now = now_ms();
    let token = mint_link(&store, "human:dana", now + 60_000, now)
        .await
        .unwrap();
    let first = f
        .get(
            &format!("/login?token={token}&next=%2Fapprovals%2Fapr_1"),
            None,
        )
        .await;
    assert_eq!(first.status, StatusCode::SEE_OTHER);
    assert_eq!(first.headers[header::LOCATION], "/approvals/apr_1");
    let cookie = first.headers[header::SET_COOKIE].to_str().unwrap();
    for part in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(cookie.contains(part), "{cookie}");
    }
    assert!(
        !cookie.contains(&token),
        "the session is not the link's token"
    );
    let again = f.get(&format!("/login?token={token}"), None).await;
    assert_eq!(again.status, StatusCode::UNAUTHORIZED);
    assert!(again.headers.get(header::SET_COOKIE).is_none());

    // A `next` elsewhere is not followed.
    let token = mint_link(&store, "human:dana", now + 60_000, now)
        .await
        .unwrap();
    let away = f
        .get(
            &format!("/login?token={token}&next=%2F%2Fevil.example%2F"),
            None,
        )
        .await;
    assert_eq!(away.headers[header::LOCATION], "/");
    // A link past its deadline opens nothing.
    let token = mint_link(&store, "human:dana", now_ms() - 1, now - 120_000)
        .await
        .unwrap();
    let late = f.get(&format!("/login?token={token}"), None).await;
    assert_eq!(late.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn the_front_page_shows_the_context_escaped_with_the_security_headers() {
    let f = fixture("").await;
    let row = f.pending(new_approval("fp", "agent:shop")).await;
    let cookie = f.sign_in("human:dana").await;
    let page = f.get("/", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK);
    for shown in [
        "refund",
        "agent:shop",
        "high",
        "tools.refund.escalate[0]: args.amount &gt; 25",
        "refund 49.00 to ord_1001",
        "data-expires",
        &row.id,
        "Signed in as <strong>human:dana</strong>",
    ] {
        assert!(page.body.contains(shown), "{shown} missing: {}", page.body);
    }
    assert!(!page.body.contains("<script>alert"), "{}", page.body);
    assert!(page.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    let csp = page.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap();
    assert!(csp.contains("frame-ancestors 'none'") && csp.contains("script-src 'self'"));
    assert_eq!(page.headers[header::X_FRAME_OPTIONS], "DENY");
    assert_eq!(page.headers[header::REFERRER_POLICY], "same-origin");
    assert_eq!(page.headers[header::CACHE_CONTROL], "no-store");

    let detail = f
        .get(&format!("/approvals/{}", row.id), Some(&cookie))
        .await;
    assert!(detail.body.contains(r#"<label for="reason">"#));
    assert!(detail.body.contains(r#"name="verdict" value="approve""#));
}

#[tokio::test]
async fn a_decision_without_the_token_or_from_another_origin_is_refused_and_changes_nothing() {
    let f = fixture("").await;
    let row = f.pending(new_approval("fp", "agent:shop")).await;
    let cookie = f.sign_in("human:dana").await;
    let csrf = f.csrf(&cookie, &row.id).await;
    let path = format!("/approvals/{}", row.id);
    let cases: [(Option<&str>, String); 4] = [
        (Some(ORIGIN), "verdict=approve".to_owned()),
        (
            Some(ORIGIN),
            format!("verdict=approve&csrf={}", "0".repeat(64)),
        ),
        (
            Some("http://evil.example"),
            format!("verdict=approve&csrf={csrf}"),
        ),
        // The token twice (another value smuggled beside it) reads as no token.
        (Some(ORIGIN), format!("verdict=approve&csrf={csrf}&csrf=x")),
    ];
    for (origin, form) in &cases {
        let reply = f.post(&path, Some(&cookie), *origin, form).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{origin:?} {form}");
        assert_eq!(f.status(&row.id).await, Status::Pending, "{form}");
    }
    // Fetch metadata saying another site is refused as well.
    let request = Request::post(&path)
        .header(header::HOST, "127.0.0.1:8710")
        .header(header::COOKIE, &cookie)
        .header("sec-fetch-site", "cross-site")
        .body(Body::from(format!("verdict=approve&csrf={csrf}")))
        .unwrap();
    assert_eq!(f.send(request).await.status, StatusCode::FORBIDDEN);
    // A Host that is not ours is refused before anything else (DNS rebinding).
    let request = Request::get("/")
        .header(header::HOST, "attacker.example")
        .header(header::COOKIE, &cookie)
        .body(Body::empty())
        .unwrap();
    assert_eq!(f.send(request).await.status, StatusCode::FORBIDDEN);
    assert_eq!(f.status(&row.id).await, Status::Pending);

    let reply = f
        .post(
            &path,
            Some(&cookie),
            Some(ORIGIN),
            &format!("verdict=approve&csrf={csrf}"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    assert!(reply.body.contains(r#"role="status""#), "{}", reply.body);
    let decided = f.approvals.get(&row.id, now_ms()).await.unwrap().unwrap();
    assert_eq!(
        (decided.status, decided.decided_by.as_deref()),
        (Status::Approved, Some("human:dana"))
    );
}

#[tokio::test]
async fn the_queue_refuses_and_the_page_says_so_plainly() {
    let f = fixture("").await;
    let mine = f.pending(new_approval("fp-1", "human:dana")).await;
    let other = f.pending(new_approval("fp-2", "agent:shop")).await;
    let dana = f.sign_in("human:dana").await;
    let lee = f.sign_in("human:lee").await;

    // Self-approval.
    let csrf = f.csrf(&dana, &mine.id).await;
    let reply = f
        .post(
            &format!("/approvals/{}", mine.id),
            Some(&dana),
            Some(ORIGIN),
            &format!("verdict=approve&csrf={csrf}"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert!(reply.body.contains(r#"role="alert""#));
    assert!(
        reply
            .body
            .contains("cannot be decided by the principal that requested it"),
        "{}",
        reply.body
    );
    assert_eq!(f.status(&mine.id).await, Status::Pending);

    // A denial needs a reason.
    let path = format!("/approvals/{}", other.id);
    let csrf_lee = f.csrf(&lee, &other.id).await;
    let reply = f
        .post(
            &path,
            Some(&lee),
            Some(ORIGIN),
            &format!("verdict=deny&reason=++&csrf={csrf_lee}"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(f.status(&other.id).await, Status::Pending);

    // First decision wins: lee denies, then dana's approval (from a page loaded before) loses.
    let csrf_dana = f.csrf(&dana, &other.id).await;
    let reply = f
        .post(
            &path,
            Some(&lee),
            Some(ORIGIN),
            &format!("verdict=deny&reason=not+this+customer&csrf={csrf_lee}"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    let late = f
        .post(
            &path,
            Some(&dana),
            Some(ORIGIN),
            &format!("verdict=approve&csrf={csrf_dana}"),
        )
        .await;
    assert_eq!(late.status, StatusCode::CONFLICT);
    assert!(
        late.body.contains("was already denied by human:lee"),
        "{}",
        late.body
    );
    let row = f.approvals.get(&other.id, now_ms()).await.unwrap().unwrap();
    assert_eq!(
        (row.status, row.decision_reason.as_deref()),
        (Status::Denied, Some("not this customer"))
    );
    // The decided page shows who, when and why, and has no form.
    let page = f.get(&path, Some(&dana)).await;
    assert!(page.body.contains("not this customer") && page.body.contains("human:lee"));
    assert!(!page.body.contains(r#"name="verdict""#));
}

#[tokio::test]
async fn two_approvers_the_same_one_twice_counts_once_and_a_denial_after_one_approval_denies() {
    let f = fixture("").await;
    let mut new = new_approval("fp", "agent:shop");
    new.approvals_required = 2;
    let row = f.pending(new).await;
    let path = format!("/approvals/{}", row.id);
    let dana = f.sign_in("human:dana").await;
    let dana_again = f.sign_in("human:dana").await;
    let lee = f.sign_in("human:lee").await;
    let form = |csrf: &str, verdict: &str| format!("verdict={verdict}&reason=checked&csrf={csrf}");

    let reply = f
        .post(
            &path,
            Some(&dana),
            Some(ORIGIN),
            &form(&f.csrf(&dana, &row.id).await, "approve"),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    assert!(
        reply.body.contains("2 approvals are needed"),
        "{}",
        reply.body
    );
    assert_eq!(f.status(&row.id).await, Status::Pending);
    // The same person in another browser is still one person.
    let again = f
        .post(
            &path,
            Some(&dana_again),
            Some(ORIGIN),
            &form(&f.csrf(&dana_again, &row.id).await, "approve"),
        )
        .await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(f.status(&row.id).await, Status::Pending);
    let page = f.get(&path, Some(&lee)).await;
    assert!(
        page.body.contains("approved so far by human:dana"),
        "{}",
        page.body
    );
    let denied = f
        .post(
            &path,
            Some(&lee),
            Some(ORIGIN),
            &form(&f.csrf(&lee, &row.id).await, "deny"),
        )
        .await;
    assert_eq!(denied.status, StatusCode::OK);
    assert_eq!(f.status(&row.id).await, Status::Denied);
}

#[tokio::test]
async fn signing_out_ends_the_session_for_every_request_after() {
    let f = fixture("/console").await;
    let row = f.pending(new_approval("fp", "agent:shop")).await;
    let cookie = f.sign_in("human:dana").await;
    let page = f.get("", Some(&cookie)).await;
    assert_eq!(page.status, StatusCode::OK);
    let slash = f.get("/", Some(&cookie)).await;
    assert_eq!(slash.headers[header::LOCATION], "/console");
    assert!(
        page.body
            .contains(&format!("/console/approvals/{}", row.id))
    );
    let csrf = f.csrf(&cookie, &row.id).await;
    let out = f
        .post(
            "/logout",
            Some(&cookie),
            Some(ORIGIN),
            &format!("csrf={csrf}"),
        )
        .await;
    assert_eq!(out.status, StatusCode::SEE_OTHER);
    assert_eq!(out.headers[header::LOCATION], "/console/login");
    let after = f.get("", Some(&cookie)).await;
    assert_eq!(after.status, StatusCode::SEE_OTHER);
    assert!(
        after.headers[header::LOCATION]
            .to_str()
            .unwrap()
            .starts_with("/console/login")
    );
    assert_eq!(
        f.get("/events", Some(&cookie)).await.status,
        StatusCode::UNAUTHORIZED
    );
}
