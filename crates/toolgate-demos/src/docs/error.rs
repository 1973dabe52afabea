//! The errors of the docs toolset: a configuration that cannot be used ([`DocsConfigError`], for
//! the operator), and a fetch that has no page to show ([`FetchError`], whose message is what the
//! model reads in the tool's error result). The guard's own refusals are [`Refusal`]s.

use std::time::Duration;

use reqwest::StatusCode;
use url::Url;

use super::MAX_REDIRECTS;
use super::guard::Refusal;

/// Why the toolset cannot be built as configured.
#[derive(Debug, thiserror::Error)]
pub enum DocsConfigError {
    #[error("allow-listed host {entry:?} is not a host name or IP address, with an optional :port")]
    Host { entry: String },
    #[error("pinned host {host:?} is not on the allow-list")]
    PinnedHost { host: String },
    #[error("trusted network {cidr:?} is not an address or a CIDR prefix")]
    Network { cidr: String },
    #[error("root certificate is not PEM")]
    RootCertificate(#[source] reqwest::Error),
    #[error("root certificate: no PEM certificate found")]
    NoRootCertificate,
}

/// Why `fetch_doc` returns no page.
#[derive(Debug, thiserror::Error)]
pub(super) enum FetchError {
    #[error("refused: {refusal}")]
    Refused { refusal: Refusal },
    #[error("refused: redirect {hop} to {url}: {refusal}")]
    RedirectRefused {
        hop: usize,
        url: String,
        refusal: Refusal,
    },
    #[error("refused: more than {MAX_REDIRECTS} redirects (the next one to {next})")]
    TooManyRedirects { next: Url },
    #[error("timed out: no complete answer within {after:?}")]
    Timeout { after: Duration },
    #[error("could not set up the HTTP client: {reason}")]
    Client { reason: String },
    #[error("could not fetch {url}: {reason}")]
    Request { url: Url, reason: String },
    #[error("{url} answered HTTP {status} without a usable Location")]
    NoLocation { url: Url, status: StatusCode },
    #[error("{url} redirects to an invalid URL: {reason}")]
    BadLocation { url: Url, reason: url::ParseError },
    #[error("{url} answered HTTP {status}")]
    Status { url: Url, status: StatusCode },
    #[error("refused: {url} is {kind}, not text")]
    NotText { url: Url, kind: String },
    #[error("refused: {url} has no content type")]
    Untyped { url: Url },
    #[error("could not read {url}: {reason}")]
    Read { url: Url, reason: String },
}
