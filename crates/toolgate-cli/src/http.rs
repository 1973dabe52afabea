//! `--http ADDR` for `serve` and `proxy`: the flags of the Streamable HTTP endpoint and its OAuth
//! resource server, and the loop that serves it until SIGINT/SIGTERM.
//!
//! Secure by default: bound to 127.0.0.1 when no host is given, tokens required (no flag turns
//! authentication off except `--insecure-no-auth`, and that only on a loopback address), no browser
//! origin allowed until `--allow-origin` names it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use toolgate::GateServer;
use toolgate::http::{self, AuthConfig, HttpConfig, KeySource, Verifier};

#[derive(Debug, clap::Args)]
pub(crate) struct HttpArgs {
    /// Serve Streamable HTTP on this address instead of stdio: `PORT` or `HOST:PORT`, the host an
    /// IP address or `localhost` (127.0.0.1, also the default).
    #[arg(long, value_name = "ADDR")]
    pub(crate) http: Option<String>,
    /// Path of the MCP endpoint.
    #[arg(long, value_name = "PATH", default_value = "/mcp")]
    path: String,
    /// This server's canonical URI: the audience every token must name (RFC 8707) and the
    /// `resource` of its metadata. Default: http://ADDR/PATH as bound.
    #[arg(long, value_name = "URI")]
    resource: Option<String>,
    /// A browser Origin allowed to call (`https://app.example.com`). Repeatable; requests with any
    /// other Origin get 403, but for this server's own origin when it listens on loopback
    /// (`http://127.0.0.1:PORT`, `http://localhost:PORT`, `http://[::1]:PORT`).
    #[arg(long = "allow-origin", value_name = "ORIGIN")]
    origins: Vec<String>,
    /// A Host header value accepted besides loopback names and the resource URI's host.
    /// Repeatable.
    #[arg(long = "allow-host", value_name = "HOST")]
    hosts: Vec<String>,
    /// Largest request body in bytes (413 beyond it).
    #[arg(long, value_name = "BYTES", default_value_t = http::DEFAULT_MAX_BODY)]
    max_body: usize,
    /// Seconds a client has to send a request's headers, and then its body (slow clients are cut
    /// off).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    read_timeout: f64,
    /// The issuer (`iss`) every access token must carry.
    #[arg(long, value_name = "URL")]
    issuer: Option<String>,
    /// Verification keys: a JWKS file, read at start.
    #[arg(long, value_name = "FILE", conflicts_with = "jwks_url")]
    jwks_file: Option<PathBuf>,
    /// Verification keys: a JWKS URL (https, or http on loopback), cached and refreshed.
    #[arg(long, value_name = "URL")]
    jwks_url: Option<String>,
    /// A signature algorithm tokens may use (RS256, ES256, EdDSA, …; never HS* or none).
    /// Repeatable; default RS256, ES256 and EdDSA.
    #[arg(long = "algorithm", value_name = "ALG")]
    algorithms: Vec<String>,
    /// An authorization server named in the protected resource metadata. Repeatable; default:
    /// the issuer.
    #[arg(long = "authorization-server", value_name = "URL")]
    authorization_servers: Vec<String>,
    /// Serve without authentication: every caller is this process's local user. Allowed only on
    /// a loopback address.
    #[arg(long)]
    insecure_no_auth: bool,
    /// Also serve the approvals console at /console on the same address (as `toolgate console`
    /// does on its own), and print a one-time login link for it.
    #[arg(long)]
    console: bool,
    #[command(flatten)]
    oidc: crate::console::OidcArgs,
}

/// A listener on `addr`, and the address it got (the port, when `addr` asked for 0).
pub(crate) async fn listen(
    addr: SocketAddr,
) -> anyhow::Result<(tokio::net::TcpListener, SocketAddr)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let bound = listener
        .local_addr()
        .context("cannot read the bound address")?;
    Ok((listener, bound))
}

/// `--http`'s value: `PORT` or `localhost:PORT` (on 127.0.0.1), or `HOST:PORT` with an IP address.
pub(crate) fn parse_address(text: &str) -> anyhow::Result<SocketAddr> {
    let port = text
        .strip_prefix("localhost:")
        .unwrap_or(text)
        .parse::<u16>();
    if let Ok(port) = port {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    text.parse::<SocketAddr>()
        .with_context(|| format!("--http {text:?}: expected PORT or HOST:PORT"))
}

impl HttpArgs {
    /// Where to listen: `PORT` or `HOST:PORT`.
    fn address(&self) -> anyhow::Result<Option<SocketAddr>> {
        self.http.as_deref().map(parse_address).transpose()
    }

    /// Whether `--http` was given (then the server speaks HTTP, not stdio).
    pub(crate) fn enabled(&self) -> bool {
        self.http.is_some()
    }

    async fn verifier(&self, resource: &str) -> anyhow::Result<Option<Arc<Verifier>>> {
        if self.insecure_no_auth {
            if self.issuer.is_some() || self.jwks_file.is_some() || self.jwks_url.is_some() {
                bail!("--insecure-no-auth cannot be combined with --issuer/--jwks-file/--jwks-url");
            }
            return Ok(None);
        }
        let Some(issuer) = &self.issuer else {
            bail!(
                "--http needs an OAuth issuer and its keys (--issuer URL with --jwks-file FILE or --jwks-url URL), or --insecure-no-auth on a loopback address"
            );
        };
        let keys = match (&self.jwks_file, &self.jwks_url) {
            (Some(file), None) => KeySource::File(file.clone()),
            (None, Some(url)) => {
                KeySource::Url(url::Url::parse(url).with_context(|| format!("--jwks-url {url}"))?)
            }
            _ => bail!("--issuer needs --jwks-file FILE or --jwks-url URL"),
        };
        let names: Vec<&str> = if self.algorithms.is_empty() {
            vec!["RS256", "ES256", "EdDSA"]
        } else {
            self.algorithms.iter().map(String::as_str).collect()
        };
        let algorithms = names
            .into_iter()
            .map(http::auth::algorithm)
            .collect::<Result<Vec<_>, _>>()?;
        let config = AuthConfig {
            issuer: issuer.clone(),
            resource: resource.to_owned(),
            algorithms,
            keys,
            authorization_servers: self.authorization_servers.clone(),
        };
        let verifier = Verifier::new(config)
            .await
            .context("cannot set up token verification")?;
        Ok(Some(Arc::new(verifier)))
    }
}

/// Serves `server` on the address of `args` until SIGINT or SIGTERM; requests already received
/// get `grace` to finish.
pub(crate) async fn serve(
    server: GateServer,
    args: &HttpArgs,
    data: &Path,
    grace: Duration,
) -> anyhow::Result<ExitCode> {
    let addr = args
        .address()?
        .ok_or_else(|| anyhow!("--http is not set"))?;
    if args.insecure_no_auth && !addr.ip().is_loopback() {
        bail!("--insecure-no-auth is allowed only on a loopback address, not {addr}");
    }
    if !args.path.starts_with('/') {
        bail!("--path must start with '/'");
    }
    if args.oidc.given() && !args.console {
        bail!("--oidc-issuer signs people in to the approvals console: it needs --console");
    }
    if [http::HEALTHZ, http::READYZ].contains(&args.path.as_str()) {
        bail!(
            "--path {} is the health probe's path; choose another",
            args.path
        );
    }
    if args.console
        && (args.path == CONSOLE_PATH || args.path.starts_with(&format!("{CONSOLE_PATH}/")))
    {
        bail!(
            "--path {} would be inside the console's {CONSOLE_PATH}",
            args.path
        );
    }
    let (listener, bound) = listen(addr).await?;
    let resource = match &args.resource {
        Some(resource) => resource.clone(),
        None => format!("http://{bound}{}", args.path),
    };
    let mut config = HttpConfig::new(&resource)?;
    if args.resource.is_some() {
        // The endpoint is where we listen; the resource URI may name a front proxy's path.
        config.path.clone_from(&args.path);
    }
    config.allowed_hosts.extend(args.hosts.iter().cloned());
    config.allowed_origins.clone_from(&args.origins);
    config = config.with_loopback_origins(bound);
    config.max_body = args.max_body;
    config.read_timeout = Duration::try_from_secs_f64(args.read_timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .context("--read-timeout must be a positive number of seconds")?;
    let verifier = args.verifier(&config.resource).await?;
    // The server's own token: held calls then answer pending when the server stops, as on stdio.
    let shutdown = server.shutdown();
    tokio::spawn(http::stop_on_signal(shutdown.clone()));
    tracing::info!(
        address = %bound,
        endpoint = %config.path,
        resource = %config.resource,
        auth = verifier.is_some(),
        "toolgate serving Streamable HTTP"
    );
    if verifier.is_none() {
        tracing::warn!(
            "authentication is off (--insecure-no-auth): every caller is the local user"
        );
    }
    let console = if args.console {
        Some(console(&server, &config, bound, data, &args.oidc, shutdown.clone()).await?)
    } else {
        None
    };
    let mut app = http::router(server, config.clone(), verifier, shutdown.clone());
    if let Some(console) = console {
        app = app.merge(console.router());
    }
    http::serve(listener, app, &config, shutdown, grace)
        .await
        .context("HTTP server failed")?;
    Ok(ExitCode::SUCCESS)
}

/// Where `--console` mounts the approvals console beside the MCP endpoint.
const CONSOLE_PATH: &str = "/console";

/// The approvals console over the gate's own approval queue, under [`CONSOLE_PATH`], with its
/// first login link printed.
async fn console(
    server: &GateServer,
    config: &HttpConfig,
    bound: SocketAddr,
    data: &Path,
    oidc: &crate::console::OidcArgs,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<toolgate::console::Console> {
    let gate = server.gate();
    let approvals = gate
        .approvals()
        .context("--console needs the approval queue, and this server has none")?
        .clone();
    let fatigue = toolgate::console::Fatigue {
        threshold: gate.policy().defaults().approval_fatigue,
        ..toolgate::console::Fatigue::default()
    };
    let mut console = toolgate::console::Console::new(approvals, config)
        .mounted_at(CONSOLE_PATH)
        .with_fatigue(fatigue)
        .with_shutdown(shutdown);
    let origin = config
        .resource
        .split_once("://")
        .and_then(|(scheme, rest)| {
            rest.split('/')
                .next()
                .map(|host| format!("{scheme}://{host}"))
        })
        .unwrap_or_else(|| format!("http://{bound}"));
    let base = format!("{origin}{CONSOLE_PATH}");
    if let Some(oidc) = oidc.discover(&base).await? {
        console = console.with_oidc(oidc);
    }
    crate::console::announce(&console, data, &base, &toolgate::identity::human(), "1h").await?;
    Ok(console)
}
