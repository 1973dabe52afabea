//! Serving on stdin/stdout, with a bounded grace for calls in flight when stdin closes.
//!
//! stdout carries protocol only (rmcp writes it; nothing else in the process may). On EOF the reader
//! holds back the end of input until every call already received has finished, or the grace period
//! has passed; rmcp then drains the responses still queued and the process exits 0. Without this a
//! client that writes a request and closes stdin would lose the answer (the seed server does).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::ServiceExt;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;

use crate::GateServer;

/// How many calls are being served; cloned into the server and the reader.
#[derive(Clone, Debug, Default)]
pub struct InFlight(Arc<Counter>);

#[derive(Debug, Default)]
struct Counter {
    count: AtomicUsize,
    idle: Notify,
}

/// Marks one call in flight until dropped.
#[derive(Debug)]
pub struct Entered(InFlight);

impl InFlight {
    /// Counts a call until the returned guard is dropped.
    #[must_use]
    pub fn enter(&self) -> Entered {
        self.0.count.fetch_add(1, Ordering::SeqCst);
        Entered(self.clone())
    }

    /// Resolves once no call is in flight.
    pub async fn idle(&self) {
        loop {
            let notified = self.0.idle.notified();
            if self.0.count.load(Ordering::SeqCst) == 0 {
                return;
            }
            notified.await;
        }
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        if self.0.0.count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.0.idle.notify_waiters();
        }
    }
}

/// Serves `server` on this process's stdin and stdout until stdin closes and calls are done.
///
/// # Errors
/// The transport failed to start or the service loop ended abnormally.
pub async fn serve(server: GateServer, grace: Duration) -> io::Result<()> {
    let inflight = server.inflight();
    let (reader, writer) = rmcp::transport::io::stdio_pipes();
    let reader = GraceReader {
        inner: reader,
        inflight,
        grace,
        at_eof: None,
        done: false,
    };
    let running = match server.serve((reader, writer)).await {
        Ok(running) => running,
        // stdin closed before any request: nothing to serve, a clean end.
        Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => return Ok(()),
        Err(error) => return Err(io::Error::other(error)),
    };
    let reason = running.waiting().await.map_err(io::Error::other)?;
    tracing::info!(?reason, "stdio session ended");
    Ok(())
}

type Wait = Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

struct GraceReader<R> {
    inner: R,
    inflight: InFlight,
    grace: Duration,
    at_eof: Option<Wait>,
    done: bool,
}

impl<R: AsyncRead + Unpin> AsyncRead for GraceReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        if self.at_eof.is_none() {
            let before = buf.filled().len();
            match Pin::new(&mut self.inner).poll_read(cx, buf) {
                Poll::Ready(Ok(())) if buf.filled().len() == before => {
                    let (inflight, grace) = (self.inflight.clone(), self.grace);
                    tracing::info!(
                        grace_ms = grace.as_millis(),
                        "stdin closed; finishing calls in flight"
                    );
                    self.at_eof = Some(Box::pin(async move {
                        // Let calls whose request was just read reach their handler before counting.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        if tokio::time::timeout(grace, inflight.idle()).await.is_err() {
                            tracing::warn!("grace period over with calls still in flight");
                        }
                    }));
                }
                other => return other,
            }
        }
        match self.at_eof.as_mut().map(|wait| wait.as_mut().poll(cx)) {
            Some(Poll::Pending) => Poll::Pending,
            _ => {
                self.done = true;
                Poll::Ready(Ok(()))
            }
        }
    }
}
