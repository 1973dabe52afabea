//! Progress from upstreams, routed to the caller that asked for it, under the caller's token.
//!
//! rmcp gives every upstream request a progress token of its own, learnt only once the request is
//! sent, and runs each notification handler on a task of its own, in whatever order the runtime
//! picks. So the order is not taken from the handlers: the upstream's transport is wrapped
//! ([`Queued`]) and queues each progress notification as it arrives, which is the order the
//! upstream sent them; a handler only flushes its call's queue, and whichever flush runs first
//! sends everything queued, in that order. Progress that arrives before its call is registered is
//! kept and queued first when it is. A call that asked for progress flushes its queue itself
//! before its answer leaves: the transport hands rmcp one message at a time, so everything the
//! upstream sent before the answer is already queued, and its last step is never lost behind the
//! response. A `progress` that does not increase is dropped (the spec requires it to increase),
//! never sent backwards.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{
    ProgressNotificationParam, ProgressToken, ServerJsonRpcMessage, ServerNotification,
};
use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::Transport;
use rmcp::{Peer, RoleClient, RoleServer};

use super::post::Injected;

/// Where a caller wants progress for one forwarded call: its connection and its own token.
pub(super) type Target = (Peer<RoleServer>, ProgressToken);

/// Progress for a token nobody registered is kept this long (then it belonged to no call).
const EARLY_KEPT: Duration = Duration::from_secs(30);

/// Every upstream call in flight, by the upstream-side token.
#[derive(Debug, Default)]
pub(super) struct Routes {
    table: Mutex<Table>,
}

#[derive(Debug, Default)]
struct Table {
    live: HashMap<ProgressToken, Arc<Route>>,
    early: HashMap<ProgressToken, (Instant, Vec<ProgressNotificationParam>)>,
}

#[derive(Debug)]
struct Route {
    target: Option<Target>,
    /// Received and not yet sent, in the upstream's order.
    queue: Mutex<VecDeque<ProgressNotificationParam>>,
    /// The last progress value sent; held while flushing, so that sends are one at a time and
    /// in queue order.
    last: tokio::sync::Mutex<Option<f64>>,
}

/// A registered call; [`Registered::finish`] flushes, dropping it unregisters.
#[derive(Debug)]
pub(super) struct Registered {
    routes: Arc<Routes>,
    token: ProgressToken,
    route: Arc<Route>,
}

impl Routes {
    /// Registers the call that the upstream knows by `token` (every call is registered, so that
    /// only truly early progress is kept aside), and sends what arrived before it.
    pub(super) async fn register(
        self: &Arc<Self>,
        token: ProgressToken,
        target: Option<Target>,
    ) -> Registered {
        let route = Arc::new(Route {
            target,
            queue: Mutex::default(),
            last: tokio::sync::Mutex::new(None),
        });
        {
            // Under the table's lock, so that nothing arriving meanwhile overtakes the early ones.
            let mut table = self.lock();
            table.live.insert(token.clone(), Arc::clone(&route));
            if let Some((_, early)) = table.early.remove(&token) {
                crate::lock(&route.queue).extend(early);
            }
        }
        route.flush().await;
        Registered {
            routes: Arc::clone(self),
            token,
            route,
        }
    }

    /// The transport received a notification: queued in arrival order, or kept aside until its
    /// call registers.
    pub(super) fn arrived(&self, params: ProgressNotificationParam) {
        let mut table = self.lock();
        if let Some(route) = table.live.get(&params.progress_token) {
            crate::lock(&route.queue).push_back(params);
            return;
        }
        let now = Instant::now();
        table
            .early
            .retain(|_, (since, _)| now.duration_since(*since) < EARLY_KEPT);
        table
            .early
            .entry(params.progress_token.clone())
            .or_insert_with(|| (now, Vec::new()))
            .1
            .push(params);
    }

    /// rmcp handled a notification for `token`: send what its call has queued.
    pub(super) async fn flush(&self, token: &ProgressToken) {
        let route = self.lock().live.get(token).cloned();
        if let Some(route) = route {
            route.flush().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        crate::lock(&self.table)
    }
}

impl Route {
    /// Sends everything queued, in order.
    async fn flush(&self) {
        let mut last = self.last.lock().await;
        loop {
            let Some(params) = crate::lock(&self.queue).pop_front() else {
                return;
            };
            self.send_locked(&mut last, params).await;
        }
    }

    /// Sends `params` unless it is not past `last` (the route's, whose lock the caller holds).
    async fn send_locked(&self, last: &mut Option<f64>, mut params: ProgressNotificationParam) {
        let Some((peer, token)) = &self.target else {
            return;
        };
        if last.is_some_and(|sent| params.progress <= sent) {
            return;
        }
        *last = Some(params.progress);
        params.progress_token = token.clone();
        let _ = peer.notify_progress(params).await;
    }
}

impl Registered {
    /// The call's answer arrived: send every notification the upstream sent before it first.
    pub(super) async fn finish(&self) {
        self.route.flush().await;
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.routes.lock().live.remove(&self.token);
    }
}

/// An upstream's transport that queues its progress notifications for their calls as they
/// arrive ([`Routes`]); every message still goes to rmcp as it came. Messages the gateway read
/// from the upstream itself (`post.rs`) come in through `injected`, before the transport's own.
pub(super) struct Queued<T> {
    inner: T,
    routes: Arc<Routes>,
    injected: Option<Injected>,
}

impl<T> Queued<T> {
    pub(super) fn new(inner: T, routes: Arc<Routes>, injected: Option<Injected>) -> Self {
        Self {
            inner,
            routes,
            injected,
        }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for Queued<T> {
    type Error = T::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<RxJsonRpcMessage<RoleClient>> {
        let message = match &mut self.injected {
            Some(injected) => tokio::select! {
                biased;
                Some(message) = injected.recv() => return Some(message),
                message = self.inner.receive() => message?,
            },
            None => self.inner.receive().await?,
        };
        if let ServerJsonRpcMessage::Notification(notification) = &message
            && let ServerNotification::ProgressNotification(progress) = &notification.notification
        {
            self.routes.arrived(progress.params.clone());
        }
        Some(message)
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}
