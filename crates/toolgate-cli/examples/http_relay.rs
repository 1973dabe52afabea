//! The floor under `toolgate proxy --http`: an HTTP relay built from the proxy's own parts (axum
//! and hyper in front, a pooled reqwest client behind, the proxy's runtime and allocator) that
//! passes every request to the upstream and streams its answer back, with nothing in between: no
//! MCP, no policy, no audit. `bench/proxy.sh --http` runs it as the `relay` configuration, so
//! that what the proxy adds splits into what two HTTP hops through such a process cost on the
//! machine and what the gate costs on top (docs/performance.md, "Gateway over HTTP").
//!
//! ```text
//! http_relay --listen 127.0.0.1:PORT --upstream http://127.0.0.1:UPORT
//! ```
//!
//! The request's method, path, query, headers (but `Host`) and body go to the upstream; the
//! answer's status, headers (but the hop-by-hop ones) and body come back, the body as it arrives,
//! so that an SSE answer streams. It serves until killed; a request the upstream cannot take is
//! answered 502.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderName, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::serve::ListenerExt;

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

#[derive(Clone)]
struct Relay {
    client: reqwest::Client,
    upstream: String,
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
    let (Some(listen), Some(upstream)) = (listen, upstream) else {
        eprintln!("usage: http_relay --listen 127.0.0.1:PORT --upstream http://HOST:PORT");
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
    match runtime.block_on(serve(listen, upstream.trim_end_matches('/').to_owned())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("http_relay: {error}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn serve(listen: SocketAddr, upstream: String) -> std::io::Result<()> {
    // reqwest is built without a TLS provider of its own (the workspace picks ring); plain HTTP
    // needs none, but the builder asks for one.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    // As the gateway's upstream client (`gateway/upstream.rs`): idle connections kept, no Nagle.
    let client = reqwest::Client::builder()
        .tcp_nodelay(true)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(std::io::Error::other)?;
    let app = Router::new()
        .fallback(relay)
        .with_state(Relay { client, upstream });
    // No Nagle on the answers either: a small answer waiting for the client's delayed ACK costs
    // tens of milliseconds.
    let listener = tokio::net::TcpListener::bind(listen).await?.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, app).await
}

async fn relay(State(relay): State<Relay>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_REQUEST).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut headers = parts.headers;
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    let sent = relay
        .client
        .request(parts.method, format!("{}{path}", relay.upstream))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let answer = match sent {
        Ok(answer) => answer,
        Err(error) => {
            eprintln!("http_relay: the upstream did not answer: {error}");
            return StatusCode::BAD_GATEWAY.into_response();
        }
    };
    let status = answer.status();
    let mut headers = answer.headers().clone();
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    (status, headers, Body::from_stream(answer.bytes_stream())).into_response()
}
