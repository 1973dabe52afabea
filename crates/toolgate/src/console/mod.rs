//! The approvals console (issue 14): where a person sees what is waiting for them and decides,
//! in a browser, with the context seed 003 asks for (arguments, requester, the rule that raised
//! it, the dry run, the time left, the same requester's history with the tool).
//!
//! Owns the console's pages and how a person gets in: a one-time login link (`login.rs`), a
//! session cookie, and the CSRF token every state-changing form carries. It does not own any
//! approval rule: a decision is a vote the approval queue accepts or refuses under its own write
//! lock (first decision wins, no self-approval, expiry is denial, only the policy's approvers,
//! two distinct approvers where asked), and the page shows the queue's refusal as it is.
//!
//! Routes, under the base it is mounted at (nothing standalone, `/console` beside an MCP
//! endpoint): `GET /` the pending requests (live) and recent decisions, `GET /approvals/ID` one
//! request, `POST /approvals/ID` a decision, `GET /events` the live region as server-sent events,
//! `GET /login` sign-in, `POST /logout`, `/static/*` the stylesheet and the small script. Every
//! page without a session redirects to sign-in and every other endpoint answers 401, before any
//! store is read for the request; no decision is ever taken on a GET.
//!
//! Design decision: server-rendered HTML with one small script. The live list is the same HTML
//! fragment the page was rendered with, pushed again over server-sent events when it changes (the
//! stream polls the store: deciders are other processes, with no channel to this one), so the
//! page works with the script off (reload) and the script holds no logic worth attacking. The
//! Content-Security-Policy allows scripts, styles and connections from this origin only, and no
//! framing.

mod login;
mod oidc;
mod page;
#[cfg(test)]
mod tests;

use std::hash::{Hash as _, Hasher as _};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, State};
use axum::middleware::{from_fn_with_state, map_response};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use tokio_util::sync::CancellationToken;
use toolgate_core::time::now_ms;
use toolgate_store::approval::{ApprovalStore, DecideError, Decider, Verdict};
use toolgate_store::console::{ConsoleStore, OidcLogin, Session, Via};

pub use login::{LinkError, mint_link};
pub use oidc::{Oidc, OidcConfig, OidcError};

use crate::http::HttpConfig;
use crate::http::layers::{self, Door};
use login::SignedIn;
use page::Base;

/// How many decided requests the front page lists, and a request's page lists of its history.
const DECIDED_SHOWN: u32 = 20;
const HISTORY_SHOWN: u32 = 10;
/// The longest reason a decision may carry (the form's `maxlength`, checked again here).
const MAX_REASON: usize = 500;
/// How long a person has to finish signing in at the identity provider.
const OIDC_SIGN_IN_TTL: Duration = Duration::from_secs(600);

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

/// The approval-fatigue flag of the front page: a tool approved at least `threshold` of the time
/// once `min_decided` of its requests ended within `window`.
#[derive(Clone, Debug)]
pub struct Fatigue {
    /// Share of ended requests approved at or above which a tool is flagged (the policy's
    /// `defaults.approval_fatigue`).
    pub threshold: f64,
    /// Ended requests a tool needs before it can be flagged.
    pub min_decided: u64,
    /// How far back the table counts.
    pub window: Duration,
}

impl Default for Fatigue {
    fn default() -> Self {
        Self {
            threshold: toolgate_core::policy::Defaults::default().approval_fatigue,
            min_decided: 10,
            window: Duration::from_secs(7 * 86_400),
        }
    }
}

/// The console, configured; [`Console::router`] makes it an axum router.
#[derive(Debug)]
pub struct Console {
    approvals: ApprovalStore,
    logins: ConsoleStore,
    base: String,
    door: Door,
    origins: Vec<String>,
    secure: bool,
    session_ttl: Duration,
    refresh: Duration,
    fatigue: Fatigue,
    shutdown: CancellationToken,
    oidc: Option<Arc<Oidc>>,
}

impl Console {
    /// A console over the approval queue `approvals`, answering the hosts and origins of `http`
    /// (a decision is accepted from those origins only). Served at the root, cookies without
    /// `Secure` (plain http on loopback), sessions of 12 hours, the live list refreshed every
    /// half second.
    #[must_use]
    pub fn new(approvals: ApprovalStore, http: &HttpConfig) -> Self {
        let logins = ConsoleStore::beside(&approvals);
        Self {
            approvals,
            logins,
            base: String::new(),
            door: Door::new(http),
            origins: http
                .allowed_origins
                .iter()
                .filter_map(|o| layers::normal_origin(o))
                .collect(),
            secure: http.resource.starts_with("https:"),
            session_ttl: Duration::from_secs(12 * 3600),
            refresh: Duration::from_millis(500),
            fatigue: Fatigue::default(),
            shutdown: CancellationToken::new(),
            oidc: None,
        }
    }

    /// Lets people sign in with an OpenID provider (found by [`Oidc::discover`]) as well as with
    /// login links.
    #[must_use]
    pub fn with_oidc(mut self, oidc: Oidc) -> Self {
        self.oidc = Some(Arc::new(oidc));
        self
    }

    /// Serves the console under `base` (`/console`), beside other routes.
    #[must_use]
    pub fn mounted_at(mut self, base: &str) -> Self {
        self.base = base.trim_end_matches('/').to_owned();
        self
    }

    /// Marks the session cookie `Secure` (the console is reached over https, perhaps through a
    /// proxy in front of it).
    #[must_use]
    pub fn with_secure_cookies(mut self, secure: bool) -> Self {
        self.secure = secure;
        self
    }

    /// How the approval-fatigue flag is computed.
    #[must_use]
    pub fn with_fatigue(mut self, fatigue: Fatigue) -> Self {
        self.fatigue = fatigue;
        self
    }

    /// How often the live list looks at the queue for changes.
    #[must_use]
    pub fn with_refresh(mut self, refresh: Duration) -> Self {
        self.refresh = refresh;
        self
    }

    /// Live streams end when `shutdown` is cancelled, so a stopping server is not held open by a
    /// browser tab.
    #[must_use]
    pub fn with_shutdown(mut self, shutdown: CancellationToken) -> Self {
        self.shutdown = shutdown;
        self
    }

    /// The store login links are minted in ([`mint_link`]).
    #[must_use]
    pub fn logins(&self) -> &ConsoleStore {
        &self.logins
    }

    /// The console as a router: its routes under its base, each response with the security
    /// headers, each request through the `Host`/`Origin` check of the MCP endpoint.
    pub fn router(self) -> axum::Router {
        let door = Arc::new(self.door);
        let shared = Arc::new(Shared {
            approvals: self.approvals,
            logins: self.logins,
            base: Base(self.base.clone()),
            origins: self.origins,
            secure: self.secure,
            session_ttl: self.session_ttl,
            refresh: self.refresh,
            fatigue: self.fatigue,
            shutdown: self.shutdown,
            oidc: self.oidc,
        });
        let routes = axum::Router::new()
            .route("/", get(index))
            .route("/approvals/{id}", get(detail).post(decide))
            .route("/events", get(events))
            .route("/login", get(login_page))
            .route("/oidc/start", get(oidc_start))
            .route("/oidc/callback", get(oidc_callback))
            .route("/logout", post(logout))
            .route("/static/console.css", get(css))
            .route("/static/console.js", get(js))
            .fallback(not_found)
            .with_state(shared)
            .layer(map_response(security_headers))
            .layer(from_fn_with_state(door, layers::headers));
        if self.base.is_empty() {
            routes
        } else {
            // Its front page is the base itself (`/console`), as axum nests a `/` route; the
            // same with a slash is sent there.
            let home = self.base.clone();
            axum::Router::new()
                .route(
                    &format!("{}/", self.base),
                    get(move || async move { redirect(&home, None) }),
                )
                .nest(&self.base, routes)
        }
    }
}

#[derive(Debug)]
struct Shared {
    approvals: ApprovalStore,
    logins: ConsoleStore,
    base: Base,
    origins: Vec<String>,
    secure: bool,
    session_ttl: Duration,
    refresh: Duration,
    fatigue: Fatigue,
    shutdown: CancellationToken,
    oidc: Option<Arc<Oidc>>,
}

impl Shared {
    /// The signed-in person of a request, or the answer a request without one gets: a redirect
    /// to sign-in for a page, 401 for anything else, 503 when the store cannot say.
    async fn who(&self, headers: &HeaderMap, page: Option<&str>) -> Result<SignedIn, Response> {
        match login::signed_in(&self.logins, headers, now_ms()).await {
            Ok(Some(signed_in)) => Ok(signed_in),
            Ok(None) => Err(match page {
                Some(next) => {
                    let mut to = self.base.at("/login");
                    to.push_str("?next=");
                    to.push_str(
                        &url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>(),
                    );
                    redirect(&to, None)
                }
                None => {
                    (StatusCode::UNAUTHORIZED, "sign in to the console first\n").into_response()
                }
            }),
            Err(error) => Err(self.unavailable(&error)),
        }
    }

    fn page(
        &self,
        status: StatusCode,
        title: &str,
        who: Option<&SignedIn>,
        body: &str,
    ) -> Response {
        let csrf = who.map(SignedIn::csrf);
        let who = who
            .map(|w| w.session.identity.as_str())
            .zip(csrf.as_deref());
        let html = page::layout(&self.base, title, who, body, now_ms());
        (
            status,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            html,
        )
            .into_response()
    }

    /// 503: the store did not answer; nothing was decided.
    fn unavailable(&self, error: &dyn std::error::Error) -> Response {
        tracing::error!(error = %error, "the console cannot read the approval store");
        self.page(
            StatusCode::SERVICE_UNAVAILABLE,
            "Unavailable",
            None,
            &page::message(
                "The approval store is not answering",
                "Nothing was changed. Try again in a moment.",
            ),
        )
    }

    /// The live region as it stands now, with a digest of what it shows but for the time left
    /// (which the page counts down itself): the stream sends the region again only when that
    /// digest changes, so a screen reader is not told of a new region every second.
    async fn live(&self, now: i64) -> Result<(String, u64), toolgate_store::approval::StoreError> {
        let rows = self.approvals.list(false, now).await?;
        let mut pending = Vec::with_capacity(rows.len());
        for row in rows {
            let votes = self.approvals.votes(&row.id).await?;
            pending.push((row, votes));
        }
        let decided = self.approvals.decided(None, DECIDED_SHOWN, now).await?;
        let mut digest = std::hash::DefaultHasher::new();
        for (row, votes) in &pending {
            (&row.id, row.expires_at, votes.len()).hash(&mut digest);
        }
        for row in &decided {
            (&row.id, row.status.as_str(), row.used_at).hash(&mut digest);
        }
        let html = page::live(
            &self.base,
            &page::Live {
                pending: &pending,
                decided: &decided,
                now,
            },
        );
        Ok((html, digest.finish()))
    }

    /// Whether a state-changing form (a decision, a sign-out) was posted from this console's own
    /// page: its origin is ours and it carries the session's CSRF token.
    fn posted_from_own_page(&self, headers: &HeaderMap, form: &Form, who: &SignedIn) -> bool {
        self.same_origin(headers)
            && form
                .get("csrf")
                .is_some_and(|token| login::same_token(token, &who.csrf()))
    }

    /// Whether a state-changing request comes from this console's own pages: an `Origin`, if
    /// sent, must be ours, and so must the fetch metadata's site.
    fn same_origin(&self, headers: &HeaderMap) -> bool {
        let origin_ok = headers.get(header::ORIGIN).is_none_or(|origin| {
            origin
                .to_str()
                .is_ok_and(|o| layers::origin_allowed(o, &self.origins))
        });
        let site_ok = headers
            .get("sec-fetch-site")
            .is_none_or(|site| site.as_bytes() == b"same-origin");
        origin_ok && site_ok
    }
}

async fn index(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    let who = match shared.who(&headers, Some(&shared.base.home())).await {
        Ok(who) => who,
        Err(answer) => return answer,
    };
    let now = now_ms();
    let (live, digest) = match shared.live(now).await {
        Ok(live) => live,
        Err(error) => return shared.unavailable(&error),
    };
    let window_ms = i64::try_from(shared.fatigue.window.as_millis()).unwrap_or(i64::MAX);
    let stats = match shared
        .approvals
        .stats(now.saturating_sub(window_ms), now)
        .await
    {
        Ok(stats) => stats,
        Err(error) => return shared.unavailable(&error),
    };
    let body = format!(
        r#"<h1>Approvals</h1>
<div id="live" aria-live="polite" data-events="{events}">{live}</div>
{fatigue}"#,
        // The stream starts from what this page shows: it sends nothing until that changes.
        events = page::esc(&shared.base.at(&format!("/events?since={digest:016x}"))),
        fatigue = page::fatigue(
            &stats,
            shared.fatigue.threshold,
            shared.fatigue.min_decided,
            &window_label(shared.fatigue.window),
        ),
    );
    shared.page(StatusCode::OK, "Approvals", Some(&who), &body)
}

async fn detail(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let here = shared.base.at(&format!("/approvals/{id}"));
    let who = match shared.who(&headers, Some(&here)).await {
        Ok(who) => who,
        Err(answer) => return answer,
    };
    render_detail(&shared, &who, &id, StatusCode::OK, None).await
}

/// A request's page, with the outcome of a decision just posted.
async fn render_detail(
    shared: &Shared,
    who: &SignedIn,
    id: &str,
    status: StatusCode,
    notice: Option<(bool, String)>,
) -> Response {
    let now = now_ms();
    let row = match shared.approvals.get(id, now).await {
        Ok(Some(row)) => row,
        Ok(None) => {
            return shared.page(
                StatusCode::NOT_FOUND,
                "Not found",
                Some(who),
                &page::message("No such request", "No approval request has this id."),
            );
        }
        Err(error) => return shared.unavailable(&error),
    };
    let votes = match shared.approvals.votes(&row.id).await {
        Ok(votes) => votes,
        Err(error) => return shared.unavailable(&error),
    };
    let history = match shared
        .approvals
        .decided(Some((&row.tool, &row.requester)), HISTORY_SHOWN + 1, now)
        .await
    {
        Ok(history) => history
            .into_iter()
            .filter(|h| h.id != row.id)
            .take(HISTORY_SHOWN as usize)
            .collect::<Vec<_>>(),
        Err(error) => return shared.unavailable(&error),
    };
    let csrf = who.csrf();
    let body = page::detail(
        &shared.base,
        &page::Detail {
            row: &row,
            votes: &votes,
            history: &history,
            csrf: &csrf,
            notice,
            now,
        },
    );
    shared.page(
        status,
        &format!("{} {}", row.tool, row.id),
        Some(who),
        &body,
    )
}

async fn decide(
    State(shared): State<Arc<Shared>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let who = match shared.who(&headers, None).await {
        Ok(who) => who,
        Err(answer) => return answer,
    };
    let form = Form::parse(&body);
    if !shared.posted_from_own_page(&headers, &form, &who) {
        tracing::warn!(approval = %id, decider = %who.session.identity, "a decision without this console's origin or CSRF token refused");
        return (
            StatusCode::FORBIDDEN,
            "refused: the decision did not come from this console's own page\n",
        )
            .into_response();
    }
    let reason = form.get("reason").map(str::trim).filter(|r| !r.is_empty());
    let verdict = match form.get("verdict") {
        Some("approve") => Verdict::Approve,
        Some("deny") => Verdict::Deny,
        _ => {
            return render_detail(
                &shared,
                &who,
                &id,
                StatusCode::UNPROCESSABLE_ENTITY,
                Some((true, "Choose Approve or Deny.".to_owned())),
            )
            .await;
        }
    };
    let refusal = if reason.is_some_and(|r| r.chars().count() > MAX_REASON) {
        Some(format!(
            "The reason is longer than {MAX_REASON} characters."
        ))
    } else if verdict == Verdict::Deny && reason.is_none() {
        Some("A denial needs a reason: the caller is told it.".to_owned())
    } else {
        None
    };
    if let Some(refusal) = refusal {
        return render_detail(
            &shared,
            &who,
            &id,
            StatusCode::UNPROCESSABLE_ENTITY,
            Some((true, refusal)),
        )
        .await;
    }
    let decider = Decider {
        id: who.session.identity.clone(),
        groups: who.session.groups.clone(),
    };
    let (status, notice) = match shared
        .approvals
        .decide_as(&id, &decider, verdict, reason, now_ms())
        .await
    {
        Ok(row) => {
            tracing::info!(approval = %row.id, decider = %decider.id, status = %row.status, "decided in the console");
            let message = match row.status {
                toolgate_store::approval::Status::Pending => format!(
                    "Your approval is counted. {} approvals are needed; the others must come from other approvers.",
                    row.approvals_required
                ),
                toolgate_store::approval::Status::Approved => {
                    "Approved. The call runs once: now if its caller is waiting, otherwise when it asks again.".to_owned()
                }
                _ => "Denied. The caller is told not to retry, with your reason.".to_owned(),
            };
            (StatusCode::OK, (false, message))
        }
        Err(DecideError::Store(error)) => return shared.unavailable(&error),
        Err(refused) => {
            let status = match refused {
                DecideError::NotFound { .. } => StatusCode::NOT_FOUND,
                DecideError::SelfApproval { .. } | DecideError::NotAnApprover { .. } => {
                    StatusCode::FORBIDDEN
                }
                _ => StatusCode::CONFLICT,
            };
            (
                status,
                (true, format!("Refused: {refused}. Nothing was changed.")),
            )
        }
    };
    render_detail(&shared, &who, &id, status, Some(notice)).await
}

/// The live region as server-sent events: a `live` event each time the region changes (at once
/// when the request names no region it already has); the stream ends when the session does or
/// the server stops.
async fn events(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let who = match shared.who(&headers, None).await {
        Ok(who) => who,
        Err(answer) => return answer,
    };
    let digest = login::digest(&who.secret);
    // The digest of the region the page already shows (`since`): nothing is sent until the
    // region differs from it, so the first event is not a copy of the page just loaded.
    let since = Form::query(query.as_deref())
        .get("since")
        .and_then(|since| u64::from_str_radix(since, 16).ok());
    let state = (shared, digest, since);
    let stream = futures_util::stream::unfold(state, |(shared, digest, last)| async move {
        let mut first = last.is_none();
        loop {
            if !first {
                tokio::select! {
                    () = shared.shutdown.cancelled() => return None,
                    () = tokio::time::sleep(shared.refresh) => {}
                }
            }
            first = false;
            let now = now_ms();
            match shared.logins.session(&digest, now).await {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => return None,
            }
            let Ok((html, hash)) = shared.live(now).await else {
                continue;
            };
            if last != Some(hash) {
                let event = Event::default().event("live").data(html);
                return Some((
                    Ok::<_, std::convert::Infallible>(event),
                    (shared, digest, Some(hash)),
                ));
            }
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response()
}

/// `GET /login`: with `?token=`, the link is used (once) and a session opened; without, the
/// sign-in page.
async fn login_page(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let query = Form::query(query.as_deref());
    let next = shared.next_in(&query);
    let Some(token) = query.get("token") else {
        return match login::signed_in(&shared.logins, &headers, now_ms()).await {
            Ok(Some(_)) => redirect(&next, None),
            Ok(None) => shared.page(
                StatusCode::OK,
                "Sign in",
                None,
                &shared.login_body(None, Some(&next)),
            ),
            Err(error) => shared.unavailable(&error),
        };
    };
    let now = now_ms();
    let identity = match shared.logins.redeem_login(&login::digest(token), now).await {
        Ok(Some(identity)) => identity,
        Ok(None) => {
            tracing::warn!("a used, expired or unknown login link was tried");
            return shared.page(
                StatusCode::UNAUTHORIZED,
                "Sign in",
                None,
                &shared.login_body(
                    Some("This login link was used already, has expired, or is not one of ours."),
                    None,
                ),
            );
        }
        Err(error) => return shared.unavailable(&error),
    };
    tracing::info!(identity = %identity, "signed in to the console with a login link");
    shared
        .open_session(identity, Vec::new(), Via::Link, &next, None)
        .await
}

/// `GET /oidc/start`: a new sign-in with the identity provider: its state (bound to this browser
/// by a cookie), nonce and PKCE verifier recorded, and the browser sent to the provider.
async fn oidc_start(State(shared): State<Arc<Shared>>, RawQuery(query): RawQuery) -> Response {
    let Some(oidc) = &shared.oidc else {
        return not_found().await;
    };
    let query = Form::query(query.as_deref());
    let next = shared.next_in(&query);
    let secrets = (
        crate::random_hex(32),
        crate::random_hex(16),
        crate::random_hex(32),
    );
    let (Ok(state), Ok(nonce), Ok(code_verifier)) = secrets else {
        return shared.unavailable(&std::io::Error::other("the random generator failed"));
    };
    let now = now_ms();
    let ttl_ms = i64::try_from(OIDC_SIGN_IN_TTL.as_millis()).unwrap_or(i64::MAX);
    let sign_in = OidcLogin {
        nonce,
        code_verifier,
        next,
    };
    if let Err(error) = shared
        .logins
        .begin_oidc(&login::digest(&state), &sign_in, now + ttl_ms, now)
        .await
    {
        return shared.unavailable(&error);
    }
    let to = oidc.authorize_url(
        &state,
        &sign_in.nonce,
        &sign_in.code_verifier,
        query.get("login_hint"),
    );
    let cookie = shared.oidc_cookie(Some(&state), ttl_ms / 1000);
    redirect(&to, Some(cookie))
}

/// `GET /oidc/callback`: the provider's answer. The state must be the one this browser started
/// (its cookie) and unused (the store takes it once); the code is exchanged with the PKCE
/// verifier; the ID token is checked (`oidc.rs`); the person must be in an allowed group. Any
/// failure is a page that says which, and no session.
async fn oidc_callback(
    State(shared): State<Arc<Shared>>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let Some(oidc) = shared.oidc.clone() else {
        return not_found().await;
    };
    let query = Form::query(query.as_deref());
    let refuse = |status: StatusCode, why: String| {
        tracing::warn!(reason = %why, "an OpenID Connect sign-in was refused");
        let mut response = shared.page(
            status,
            "Sign in",
            None,
            &shared.login_body(Some(&why), None),
        );
        // The sign-in is over either way: its state cookie goes.
        let clear = shared.oidc_cookie(None, 0);
        if let Ok(clear) = HeaderValue::from_str(&clear) {
            response.headers_mut().insert(header::SET_COOKIE, clear);
        }
        response
    };
    if let Some(error) = query.get("error") {
        return refuse(
            StatusCode::UNAUTHORIZED,
            format!("The identity provider refused the sign-in: {error}."),
        );
    }
    let (Some(state), Some(code)) = (query.get("state"), query.get("code")) else {
        return refuse(
            StatusCode::BAD_REQUEST,
            "The identity provider's answer has no code or state.".to_owned(),
        );
    };
    if !login::cookie(&headers, login::OIDC_COOKIE)
        .is_some_and(|mine| login::same_token(&mine, state))
    {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "This sign-in was not started in this browser; start again.".to_owned(),
        );
    }
    let sign_in = match shared
        .logins
        .finish_oidc(&login::digest(state), now_ms())
        .await
    {
        Ok(Some(sign_in)) => sign_in,
        Ok(None) => {
            return refuse(
                StatusCode::UNAUTHORIZED,
                "This sign-in was used already or took too long; start again.".to_owned(),
            );
        }
        Err(error) => return shared.unavailable(&error),
    };
    let identity = match oidc
        .identify(code, &sign_in.code_verifier, &sign_in.nonce)
        .await
    {
        Ok(identity) => identity,
        Err(refusal) => return refuse(StatusCode::UNAUTHORIZED, format!("{refusal}.")),
    };
    if !oidc.admits(&identity) {
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "{} is not in a group allowed to use this console.",
                identity.id
            ),
        );
    }
    tracing::info!(identity = %identity.id, groups = ?identity.groups, "signed in to the console with OpenID Connect");
    let clear = shared.oidc_cookie(None, 0);
    shared
        .open_session(
            identity.id,
            identity.groups,
            Via::Oidc,
            &sign_in.next,
            Some(clear),
        )
        .await
}

impl Shared {
    /// Opens a session for `identity` and sends the browser to `next` with its cookie (and
    /// `also`, another cookie to set).
    async fn open_session(
        &self,
        identity: String,
        groups: Vec<String>,
        via: Via,
        next: &str,
        also: Option<String>,
    ) -> Response {
        let secret = match crate::random_hex(32) {
            Ok(secret) => secret,
            Err(error) => return self.unavailable(&std::io::Error::other(error.to_string())),
        };
        let now = now_ms();
        let ttl_ms = i64::try_from(self.session_ttl.as_millis()).unwrap_or(i64::MAX);
        let session = Session {
            identity,
            groups,
            via,
            expires_at: now.saturating_add(ttl_ms),
        };
        if let Err(error) = self
            .logins
            .open_session(&login::digest(&secret), &session, now)
            .await
        {
            return self.unavailable(&error);
        }
        let cookie = login::set_cookie(
            login::COOKIE,
            Some(&secret),
            ttl_ms / 1000,
            &self.cookie_path(),
            self.secure,
        );
        let mut response = redirect(next, Some(cookie));
        if let Some(also) = also.and_then(|c| HeaderValue::from_str(&c).ok()) {
            response.headers_mut().append(header::SET_COOKIE, also);
        }
        response
    }

    /// The sign-in page's body: `message`, and the provider's button when there is one.
    fn login_body(&self, message: Option<&str>, next: Option<&str>) -> String {
        let provider = self.oidc.as_ref().map(|oidc| {
            let mut start = self.base.at("/oidc/start");
            if let Some(next) = next {
                start.push_str("?next=");
                start.push_str(
                    &url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>(),
                );
            }
            (start, oidc.issuer().to_owned())
        });
        page::login(
            message,
            provider.as_ref().map(|(a, b)| (a.as_str(), b.as_str())),
        )
    }
}

async fn logout(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let who = match shared.who(&headers, None).await {
        Ok(who) => who,
        Err(answer) => return answer,
    };
    let form = Form::parse(&body);
    if !shared.posted_from_own_page(&headers, &form, &who) {
        return (
            StatusCode::FORBIDDEN,
            "refused: not from this console's own page\n",
        )
            .into_response();
    }
    if let Err(error) = shared
        .logins
        .end_session(&login::digest(&who.secret), now_ms())
        .await
    {
        return shared.unavailable(&error);
    }
    let cookie = login::set_cookie(login::COOKIE, None, 0, &shared.cookie_path(), shared.secure);
    redirect(&shared.base.at("/login"), Some(cookie))
}

impl Shared {
    /// Where a sign-in sends the browser: the query's `next` when it is a path of this console,
    /// else the front page.
    fn next_in(&self, query: &Form) -> String {
        query
            .get("next")
            .filter(|next| self.is_ours(next))
            .map_or_else(|| self.base.home(), str::to_owned)
    }

    /// Whether `next` is a path of this console (never another site, `//host` included).
    fn is_ours(&self, next: &str) -> bool {
        let home = self.base.home();
        (next == home || next.starts_with(&self.base.at("/")))
            && !next.starts_with("//")
            && !next.contains('\\')
            && next.bytes().all(|b| b.is_ascii_graphic())
    }

    fn cookie_path(&self) -> String {
        self.base.home()
    }

    /// The `Set-Cookie` of the cookie binding a sign-in's state to this browser (`None`: its
    /// removal), sent only to the sign-in's own paths.
    fn oidc_cookie(&self, state: Option<&str>, max_age_s: i64) -> String {
        login::set_cookie(
            login::OIDC_COOKIE,
            state,
            max_age_s,
            &self.base.at("/oidc"),
            self.secure,
        )
    }
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    ([(header::CONTENT_TYPE, content_type)], body).into_response()
}

async fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

/// 303 See Other to `to`, with a cookie to set.
fn redirect(to: &str, cookie: Option<String>) -> Response {
    let mut response = StatusCode::SEE_OTHER.into_response();
    if let Ok(location) = HeaderValue::from_str(to) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    if let Some(cookie) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    response
}

/// The headers every console response carries: scripts, styles and connections from this origin
/// only, no framing, no sniffing, no referrer to other sites (a login link's token must not leave
/// in one), and nothing cached (pages show arguments and identities).
async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        // Not `no-referrer`: under it a browser sends `Origin: null` with every POST, and the
        // decision forms' origin could not be checked. `same-origin` sends nothing elsewhere.
        (header::REFERRER_POLICY, "same-origin"),
        (header::CACHE_CONTROL, "no-store"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers.insert(
        "cross-origin-opener-policy",
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// A form body or query string, decoded; a name given twice is ambiguous and reads as absent.
struct Form(Vec<(String, String)>);

impl Form {
    fn parse(bytes: &[u8]) -> Self {
        Self(url::form_urlencoded::parse(bytes).into_owned().collect())
    }

    /// A request's query string (none: no fields).
    fn query(query: Option<&str>) -> Self {
        Self::parse(query.unwrap_or_default().as_bytes())
    }

    fn get(&self, name: &str) -> Option<&str> {
        let mut found = self.0.iter().filter(|(n, _)| n == name);
        match (found.next(), found.next()) {
            (Some((_, value)), None) => Some(value),
            _ => None,
        }
    }
}

fn window_label(window: Duration) -> String {
    let secs = window.as_secs();
    if secs.is_multiple_of(86_400) {
        format!("{} days", secs / 86_400)
    } else if secs.is_multiple_of(3600) {
        format!("{} hours", secs / 3600)
    } else {
        format!("{} minutes", secs / 60)
    }
}
