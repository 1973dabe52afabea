//! The short way's own connections to a plain `http://` upstream (`post.rs`): HTTP/1.1 on hyper's
//! client connection, kept open between requests here.
//!
//! reqwest takes each request through layers the short way does not use (redirects, retries),
//! parses the upstream's URL again on every request for its redirect layer, and keys its pool by
//! scheme and host; on the gateway's path that was a tenth of the instructions of a call
//! (docs/performance.md, "Gateway over HTTP"). The short way posts to one endpoint, so its pool
//! is one list of idle connections. It is used for the `http://` endpoints the gateway accepts,
//! which are all on this machine ([`direct`]); HTTPS stays with reqwest, and so does every request
//! rmcp makes. Neither goes through a proxy to such an endpoint (`upstream::http_client`).
//!
//! The rules reqwest's pool kept stay: a connection unused for [`IDLE_CONNECTION`] is not written
//! to again (the upstream may be closing it), a request goes on again on a new connection only if
//! hyper gave it back unwritten, and a connection goes back to the list only once its answer has
//! been read to the end. A redirect is not followed here: the caller sends such a request the
//! rmcp way, whose client follows the redirects the gateway allows.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use http::{HeaderValue, Request, Response, Uri, header};
use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

use super::upstream::IDLE_CONNECTION;
use crate::lock;

type Sender = SendRequest<Full<Bytes>>;

/// Connections to one `http://` endpoint.
pub(super) struct Wire {
    /// `host:port`, to connect to and for the `Host` header.
    authority: HeaderValue,
    /// The endpoint's path and query (origin form).
    target: Uri,
    idle: Mutex<Vec<(Sender, Instant)>>,
}

/// A connection in use: handed back with [`Lease::release`] once its answer is read to the end;
/// dropped before that, the connection closes.
pub(super) struct Lease {
    sender: Sender,
    wire: Arc<Wire>,
}

impl Lease {
    /// The answer was read to the end: the connection may carry the next request.
    pub(super) fn release(self) {
        if !self.sender.is_closed() {
            lock(&self.wire.idle).push((self.sender, Instant::now()));
        }
    }
}

/// Why a request got no answer.
pub(super) enum WireError {
    /// It was never written: nothing reached the upstream.
    NotSent(String),
    /// It was written, or may have been, and no answer came.
    Lost(String),
}

impl Wire {
    /// The connections for `url`, if the short way connects to it itself ([`direct`]).
    pub(super) fn for_url(url: &reqwest::Url) -> Option<Arc<Self>> {
        if !direct(url) {
            return None;
        }
        // An IPv6 address comes in brackets, as `Host` and `connect` take it.
        let authority = format!("{}:{}", url.host_str()?, url.port_or_known_default()?);
        let target = match url.query() {
            Some(query) => format!("{}?{query}", url.path()),
            None => url.path().to_owned(),
        };
        Some(Arc::new(Self {
            authority: HeaderValue::from_str(&authority).ok()?,
            target: target.parse().ok()?,
            idle: Mutex::default(),
        }))
    }

    /// A POST of `body` to the endpoint, with `headers` (and `Host`), on an idle connection if
    /// there is one, else on a new one.
    pub(super) async fn post(
        self: &Arc<Self>,
        headers: http::HeaderMap,
        body: Vec<u8>,
    ) -> Result<(Response<Incoming>, Lease), WireError> {
        let mut request = Request::post(self.target.clone())
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| WireError::NotSent(e.to_string()))?;
        *request.headers_mut() = headers;
        request
            .headers_mut()
            .insert(header::HOST, self.authority.clone());
        while let Some(mut sender) = self.take_idle() {
            // Back in the list as soon as its answer was read; its task may not have turned to
            // wait for the next request yet.
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok((response, self.lease(sender))),
                // Closed by the upstream while idle, before the request was written: try the next.
                Err(mut error) => match error.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(WireError::Lost(error.into_error().to_string())),
                },
            }
        }
        let mut sender = self.connect().await.map_err(WireError::NotSent)?;
        match sender.try_send_request(request).await {
            Ok(response) => Ok((response, self.lease(sender))),
            Err(mut error) => match error.take_message() {
                Some(_) => Err(WireError::NotSent(error.into_error().to_string())),
                None => Err(WireError::Lost(error.into_error().to_string())),
            },
        }
    }

    fn lease(self: &Arc<Self>, sender: Sender) -> Lease {
        Lease {
            sender,
            wire: Arc::clone(self),
        }
    }

    /// The most recently used idle connection that is still open and was used within
    /// [`IDLE_CONNECTION`]; older ones are closed.
    fn take_idle(&self) -> Option<Sender> {
        let mut idle = lock(&self.idle);
        let now = Instant::now();
        idle.retain(|(sender, since)| {
            !sender.is_closed() && now.duration_since(*since) < IDLE_CONNECTION
        });
        idle.pop().map(|(sender, _)| sender)
    }

    /// A new connection, its I/O driven by a task of its own until either side closes it.
    async fn connect(&self) -> Result<Sender, String> {
        let address = self.authority.to_str().map_err(|e| e.to_string())?;
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("connect to {address}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "upstream connection ended");
            }
        });
        Ok(sender)
    }
}

/// Whether requests to `url` go straight to it: plain `http://` to this machine. A proxy named in
/// the environment is not used for them: it would be handed the session and the upstream's token
/// for a connection that never leaves the host, and one elsewhere cannot reach this host's
/// loopback at all.
pub(super) fn direct(url: &reqwest::Url) -> bool {
    url.scheme() == "http" && crate::loopback(url)
}
