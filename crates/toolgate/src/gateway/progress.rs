//! Progress from upstreams, routed to the caller that asked for it, under the caller's token.
//!
//! rmcp gives every upstream request a progress token of its own, learnt only once the request is
//! sent, and runs each notification handler on a task of its own. So three races are handled
//! here: progress that arrives before its call is registered is kept and replayed when it is;
//! notifications handled out of order within a millisecond of each other are put back in order,
//! and what is still out of order is reduced to an increasing sequence (the spec requires
//! `progress` to increase; a stale one is dropped, never sent backwards); and a call that asked
//! for progress lets notifications already received drain before its answer leaves, so its last
//! step is not lost behind the response.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{ProgressNotificationParam, ProgressToken};
use rmcp::{Peer, RoleServer};

/// Where a caller wants progress for one forwarded call: its connection and its own token.
pub(super) type Target = (Peer<RoleServer>, ProgressToken);

/// Progress for a token nobody registered is kept this long (then it belonged to no call).
const EARLY_KEPT: Duration = Duration::from_secs(30);

/// How long a finished call waits for notification handlers already running.
const DRAIN: Duration = Duration::from_millis(2);

/// How long a notification waits for others of its call handled at about the same time, so that
/// they go out in order: rmcp handles each on a task of its own, and the runtime may run a task
/// spawned later first. Shorter than [`DRAIN`], so a finished call still waits for them.
const REORDER: Duration = Duration::from_millis(1);

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
    /// The last progress value sent; held while sending, so sends are one at a time.
    last: tokio::sync::Mutex<Option<f64>>,
    /// Notifications waiting out [`REORDER`], sent together in order of progress.
    pending: Mutex<Vec<ProgressNotificationParam>>,
    seen: AtomicBool,
}

/// A registered call; [`Registered::finish`] drains, dropping it unregisters.
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
            last: tokio::sync::Mutex::new(None),
            pending: Mutex::default(),
            seen: AtomicBool::new(false),
        });
        // Held from before the route is live until what arrived early is sent: a notification
        // handled meanwhile waits for it, rather than overtaking it and making it stale.
        let mut last = route.last.lock().await;
        let early = {
            let mut table = self.lock();
            table.live.insert(token.clone(), Arc::clone(&route));
            table.early.remove(&token)
        };
        if let Some((_, mut early)) = early {
            early.sort_by(|a, b| a.progress.total_cmp(&b.progress));
            for params in early {
                route.send_locked(&mut last, params).await;
            }
        }
        drop(last);
        Registered {
            routes: Arc::clone(self),
            token,
            route,
        }
    }

    /// A notification from the upstream.
    pub(super) async fn deliver(&self, params: ProgressNotificationParam) {
        let route = {
            let mut table = self.lock();
            if let Some(route) = table.live.get(&params.progress_token) {
                Some(Arc::clone(route))
            } else {
                let now = Instant::now();
                table
                    .early
                    .retain(|_, (since, _)| now.duration_since(*since) < EARLY_KEPT);
                table
                    .early
                    .entry(params.progress_token.clone())
                    .or_insert_with(|| (now, Vec::new()))
                    .1
                    .push(params.clone());
                None
            }
        };
        if let Some(route) = route {
            route.send(params).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        crate::lock(&self.table)
    }
}

impl Route {
    /// Sends `params` with whatever else of the call arrived within [`REORDER`], in order.
    async fn send(&self, params: ProgressNotificationParam) {
        crate::lock(&self.pending).push(params);
        tokio::time::sleep(REORDER).await;
        let mut last = self.last.lock().await;
        let mut batch = std::mem::take(&mut *crate::lock(&self.pending));
        batch.sort_by(|a, b| a.progress.total_cmp(&b.progress));
        for params in batch {
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
        self.seen.store(true, Ordering::Relaxed);
        params.progress_token = token.clone();
        let _ = peer.notify_progress(params).await;
    }
}

impl Registered {
    /// The call's answer arrived: when the caller asked for progress, let notifications the
    /// upstream sent before its answer finish going out first.
    pub(super) async fn finish(&self) {
        if self.route.target.is_none() {
            return;
        }
        tokio::task::yield_now().await;
        let waiting = !crate::lock(&self.route.pending).is_empty();
        if waiting || self.route.seen.load(Ordering::Relaxed) {
            tokio::time::sleep(DRAIN).await;
        }
        drop(self.route.last.lock().await);
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.routes.lock().live.remove(&self.token);
    }
}
