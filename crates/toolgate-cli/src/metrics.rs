//! `--metrics ADDR`: the gate's Prometheus metrics (`Gate::metrics_text`, and for `proxy` each
//! upstream's connection) on a listener of their own, for `serve` and `proxy` on stdio and HTTP
//! alike.
//!
//! Design decision: a separate, opt-in port rather than a path on the MCP endpoint. The metrics
//! name every served tool and count every caller's calls; an MCP endpoint may face the internet
//! with OAuth in front, while a scrape comes from an internal network without a token. The
//! listener accepts only a `Host` naming the address it is bound to (or `localhost` on loopback),
//! so a web page cannot read it through DNS rebinding.

use std::sync::Arc;

use anyhow::Context as _;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use toolgate::gate::upstream_series;
use toolgate::server::Gate;
use toolgate::toolset::Toolset;

#[derive(Clone)]
struct Scrape {
    gate: Gate,
    /// What the gate serves: the gateway's upstreams are its to report.
    toolset: Arc<dyn Toolset>,
    hosts: Arc<Vec<String>>,
}

/// Starts serving `/metrics` on `address` (`PORT` or `HOST:PORT`); the task ends when dropped
/// by the caller's `abort`. Logs the bound address.
///
/// # Errors
/// The address does not parse or cannot be bound.
pub(crate) async fn start(
    gate: &Gate,
    toolset: &Arc<dyn Toolset>,
    address: &str,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let addr = crate::http::parse_address(address).context("--metrics")?;
    let (listener, bound) = crate::http::listen(addr).await?;
    let mut hosts = vec![bound.to_string()];
    if bound.ip().is_loopback() {
        hosts.push(format!("localhost:{}", bound.port()));
    }
    let app = axum::Router::new()
        .route("/metrics", get(scrape))
        .with_state(Scrape {
            gate: gate.clone(),
            toolset: Arc::clone(toolset),
            hosts: Arc::new(hosts),
        });
    tracing::info!(address = %bound, "toolgate serving metrics");
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::warn!(error = %error, "the metrics listener stopped");
        }
    }))
}

async fn scrape(State(scrape): State<Scrape>, headers: HeaderMap) -> Response {
    let host = headers
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .map(str::to_ascii_lowercase);
    if !host.is_some_and(|host| scrape.hosts.contains(&host)) {
        return (StatusCode::FORBIDDEN, "Host is not this listener's\n").into_response();
    }
    (
        [
            (
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            ),
            (header::CACHE_CONTROL, "no-store"),
        ],
        scrape.gate.metrics_text().await + &upstream_series(&scrape.toolset.upstreams()),
    )
        .into_response()
}
