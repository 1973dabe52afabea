//! The `initialize`-era HTTP sessions of a server, as its front door needs to know them: who
//! opened each (a session id is no bearer credential), the session's client (rmcp's peer, learnt
//! when the client says it is initialized), and the calls the front door answers itself in it
//! (`http/short.rs`), so that a `notifications/cancelled` reaches them.
//!
//! rmcp keeps the sessions themselves (`LocalSessionManager`); this is what toolgate adds beside
//! them, keyed by the same id. It lives here, not in `http`, because the server learns the peer
//! ([`GateServer::on_initialized`](super::GateServer)) and the server is built without the `http`
//! feature too.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::RequestId;
use rmcp::service::NotificationContext;
use rmcp::{Peer, RoleServer};
use tokio_util::sync::CancellationToken;

use crate::lock;

/// The header that names a legacy session.
pub const SESSION_HEADER: &str = "mcp-session-id";

/// Sessions by id; clones share them.
#[derive(Clone, Debug, Default)]
pub struct Sessions(Arc<Mutex<HashMap<String, Session>>>);

#[derive(Debug)]
struct Session {
    /// The subject whose token opened the session (`None` without authentication).
    owner: Option<String>,
    /// The session's client, once it said it is initialized.
    client: Option<Peer<RoleServer>>,
    /// When rmcp's session was last told the session is in use (`Sessions::due_for_touch`).
    touched: Instant,
    /// Calls answered by the front door, still running.
    calls: HashMap<RequestId, CancellationToken>,
}

impl Session {
    fn new() -> Self {
        Self {
            owner: None,
            client: None,
            touched: Instant::now(),
            calls: HashMap::new(),
        }
    }
}

impl Sessions {
    /// Notes the client of the session the `initialized` notification of `context` came in.
    pub fn opened(&self, context: &NotificationContext<RoleServer>) {
        let Some(id) = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|parts| parts.headers.get(SESSION_HEADER))
            .and_then(|id| id.to_str().ok())
        else {
            return;
        };
        let mut sessions = lock(&self.0);
        let session = sessions.entry(id.to_owned()).or_insert_with(Session::new);
        session.client = Some(context.peer.clone());
    }

    /// Records that `owner` opened session `id`; the first owner stays.
    pub fn remember(&self, id: &str, owner: String) {
        let mut sessions = lock(&self.0);
        let session = sessions.entry(id.to_owned()).or_insert_with(Session::new);
        session.owner.get_or_insert(owner);
    }

    /// Whether `sub` may use session `id`: it opened it, or the session is not ours to judge
    /// (an unknown id gets rmcp's 404).
    pub fn is_for(&self, id: &str, sub: &str) -> bool {
        lock(&self.0)
            .get(id)
            .and_then(|session| session.owner.as_deref())
            .is_none_or(|owner| owner == sub)
    }

    /// The live client of session `id`; a session whose client is gone is forgotten.
    pub fn client(&self, id: &str) -> Option<Peer<RoleServer>> {
        let mut sessions = lock(&self.0);
        let client = sessions.get(id)?.client.clone()?;
        if client.is_transport_closed() {
            sessions.remove(id);
            return None;
        }
        Some(client)
    }

    /// Whether rmcp's session `id` should be told it is in use: at most once per `every`. rmcp
    /// ends a session that has seen nothing for its keep-alive (5 minutes), and calls answered
    /// by the front door do not pass through it.
    pub fn due_for_touch(&self, id: &str, every: Duration) -> bool {
        let mut sessions = lock(&self.0);
        let Some(session) = sessions.get_mut(id) else {
            return false;
        };
        if session.touched.elapsed() < every {
            return false;
        }
        session.touched = Instant::now();
        true
    }

    /// Registers call `request` of session `id`, cancelled by `ct`, until the guard drops.
    pub fn running(&self, id: &str, request: RequestId, ct: CancellationToken) -> Running {
        if let Some(session) = lock(&self.0).get_mut(id) {
            session.calls.insert(request.clone(), ct);
        }
        Running {
            sessions: self.clone(),
            id: id.to_owned(),
            request,
        }
    }

    /// Cancels call `request` of session `id`, when the front door is answering it.
    pub fn cancel(&self, id: &str, request: &RequestId) {
        let ct = lock(&self.0)
            .get_mut(id)
            .and_then(|session| session.calls.remove(request));
        if let Some(ct) = ct {
            tracing::info!(id = %request, "cancelled");
            ct.cancel();
        }
    }

    /// Forgets session `id` (it ended).
    pub fn forget(&self, id: &str) {
        lock(&self.0).remove(id);
    }

    /// How many sessions are known.
    pub fn len(&self) -> usize {
        lock(&self.0).len()
    }

    /// Whether no session is known.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps only the sessions `live` says still exist.
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        lock(&self.0).retain(|id, _| live(id));
    }
}

/// A call answered by the front door, registered for cancellation while it runs.
#[derive(Debug)]
pub struct Running {
    sessions: Sessions,
    id: String,
    request: RequestId,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(session) = lock(&self.sessions.0).get_mut(&self.id) {
            session.calls.remove(&self.request);
        }
    }
}
