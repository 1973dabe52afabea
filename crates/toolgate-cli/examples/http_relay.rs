//! The floor under `toolgate proxy --http`: an HTTP relay built from the proxy's own parts (axum
//! and hyper in front; behind, hyper's HTTP/1.1 client connections kept open in a list of idle
//! ones, as the proxy's short way keeps them, `gateway/wire.rs`; the proxy's runtime and
//! allocator) that
//! passes every request to the upstream and streams its answer back, with nothing in between: no
//! MCP, no policy, no audit. `bench/proxy.sh --http` runs it as the `relay` configuration, so
//! that what the proxy adds splits into what two HTTP hops through such a process cost on the
//! machine and what the gate costs on top (docs/performance.md, "Gateway over HTTP").
//!
//! ```text
//! http_relay --listen 127.0.0.1:PORT --upstream http://127.0.0.1:UPORT
//! ```
//!
//! The request's method, path, query, headers (but the hop-by-hop ones; `Host` is the upstream's)
//! and body go to the upstream; the answer's status, headers (but the hop-by-hop ones) and body
//! come back, the body as it arrives, so that an SSE answer streams. A connection carries the
//! next request once its answer has been read to the end. It serves until killed; a request the
//! upstream cannot take is answered 502.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;
use http_body_util::Full;
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;

/// Largest request body relayed (the proxy's own limit is smaller).
const MAX_REQUEST: usize = 16 * 1024 * 1024;

/// Headers of one connection, not of the message: never relayed.
const HOP_BY_HOP: [HeaderName; 5] = [
    header::CONNECTION,
    header::HOST,
    header::TRANSFER_ENCODING,
    header::CONTENT_LENGTH,
    header::UPGRADE,
];

/// The binary's allocator (`src/main.rs`), so that the floor is measured with it.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

type Sender = SendRequest<Full<Bytes>>;

struct Relay {
    /// The upstream's `host:port`: where to connect, and its `Host`.
    authority: HeaderValue,
    /// Connections whose last answer was read to the end.
    idle: Mutex<Vec<Sender>>,
}

fn main() -> std::process::ExitCode {
    let mut listen = None;
    let mut upstream = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        match flag.as_str() {
            "--listen" => listen = args.next(),
            "--upstream" => upstream = args.next(),
            other => {
                eprintln!("http_relay: unknown argument {other}");
                return std::process::ExitCode::from(2);
            }
        }
    }
    let usage = "usage: http_relay --listen 127.0.0.1:PORT --upstream http://HOST:PORT";
    let (Some(listen), Some(upstream)) = (listen, upstream) else {
        eprintln!("{usage}");
        return std::process::ExitCode::from(2);
    };
    let authority = upstream
        .strip_prefix("http://")
        .map(|rest| rest.trim_end_matches('/'))
        .and_then(|authority| HeaderValue::from_str(authority).ok());
    let Some(authority) = authority else {
        eprintln!("http_relay: --upstream {upstream} is not http://HOST:PORT; {usage}");
        return std::process::ExitCode::from(2);
    };
    let Ok(listen) = listen.parse::<SocketAddr>() else {
        eprintln!("http_relay: --listen {listen} is not an address and port");
        return std::process::ExitCode::from(2);
    };
    // The proxy's runtime shape (`src/runtime.rs`): one worker on a host of two CPUs or fewer,
    // unless TOKIO_WORKER_THREADS says otherwise; tokio's default elsewhere.
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    let small_host = std::thread::available_parallelism().map_or(true, |cpus| cpus.get() <= 2);
    // tokio's own variable still decides when it is set, as it does for every tokio program.
    #[allow(clippy::disallowed_methods)]
    let workers_set = std::env::var_os("TOKIO_WORKER_THREADS").is_some();
    if small_host && !workers_set {
        builder.worker_threads(1);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("http_relay: cannot start the runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(serve(listen, authority)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("http_relay: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(listen: SocketAddr, authority: HeaderValue) -> std::io::Result<()> {
    let relay = Arc::new(Relay {
        authority,
        idle: Mutex::default(),
    });
    let app = Router::new().fallback(relay_one).with_state(relay);
    // No Nagle on the answers either: a small answer waiting for the client's delayed ACK costs
    // tens of milliseconds.
    let listener = tokio::net::TcpListener::bind(listen).await?.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await
}

async fn relay_one(State(relay): State<Arc<Relay>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_REQUEST).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let target = parts
        .uri
        .path_and_query()
        .map_or_else(|| Uri::from_static("/"), |p| Uri::from(p.clone()));
    let mut upstream = hyper::Request::new(Full::new(body));
    *upstream.method_mut() = parts.method;
    *upstream.uri_mut() = target;
    *upstream.headers_mut() = parts.headers;
    for name in &HOP_BY_HOP {
        upstream.headers_mut().remove(name);
    }
    upstream
        .headers_mut()
        .insert(header::HOST, relay.authority.clone());
    let (answer, sender) = match relay.send(upstream).await {
        Ok(sent) => sent,
        Err(error) => {
            eprintln!("http_relay: the upstream did not answer: {error}");
            return StatusCode::BAD_GATEWAY.into_response();
        }
    };
    let (mut parts, body) = answer.into_parts();
    for name in &HOP_BY_HOP {
        parts.headers.remove(name);
    }
    let body = Returning {
        body,
        sender: Some(sender),
        relay,
    };
    Response::from_parts(parts, Body::new(body))
}

impl Relay {
    /// Sends `request` on an idle connection that takes it, else on a new one.
    async fn send(
        &self,
        mut request: hyper::Request<Full<Bytes>>,
    ) -> Result<(hyper::Response<Incoming>, Sender), String> {
        while let Some(mut sender) = self.take_idle() {
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(answer) => return Ok((answer, sender)),
                Err(mut error) => match error.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(error.into_error().to_string()),
                },
            }
        }
        let address = self.authority.to_str().map_err(|e| e.to_string())?;
        let stream = tokio::net::TcpStream::connect(address)
            .await
            .map_err(|e| format!("connect to {address}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let (mut sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(connection);
        let answer = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        Ok((answer, sender))
    }

    fn take_idle(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        idle.retain(|sender| !sender.is_closed());
        idle.pop()
    }
}

/// An answer's body on its way back; its connection goes back to the idle list once it has been
/// read to the end (dropped before that, the connection closes with it).
struct Returning {
    body: Incoming,
    sender: Option<Sender>,
    relay: Arc<Relay>,
}

impl hyper::body::Body for Returning {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled
            && let Some(sender) = self.sender.take()
        {
            let mut idle = self
                .relay
                .idle
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            idle.push(sender);
        }
        polled
    }
}
