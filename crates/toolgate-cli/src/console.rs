//! `toolgate console`: the approvals console in a browser, beside a running server (another
//! process on the same data directory, as `toolgate approvals` is), and `toolgate console link`,
//! another one-time login link for it.
//!
//! For one person on their machine, the way notebook servers do it: the command prints a login
//! link holding a one-time token; opening it signs the browser in as the person who ran the
//! command (`human:<os user>`, or `--as`), and the link is then dead. Bound to 127.0.0.1 unless
//! told otherwise; the page answers its own loopback origin only, and any other `Host` is
//! refused (DNS rebinding). The link goes to stderr, in plain text, for the person at the
//! terminal: it is the one secret this command prints, on purpose, and it works once.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, bail};
use toolgate::console::{self, Console, Fatigue};
use toolgate::http::{self, HttpConfig};
use toolgate_core::time::now_ms;
use toolgate_store::console::ConsoleStore;

/// The file in the data directory where a running console writes its address, so that `console
/// link` can print a whole link.
const URL_FILE: &str = "console.url";

#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct Args {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Print another one-time login link for the running console (a second browser, a phone).
    Link(LinkArgs),
}

#[derive(Debug, clap::Args)]
struct ServeArgs {
    /// The server's data directory (where toolgate.db lives).
    #[arg(long, value_name = "DIR", default_value = ".")]
    data: PathBuf,
    #[command(flatten)]
    store: crate::store::StoreArgs,
    /// Where to listen: `PORT` or `HOST:PORT` (127.0.0.1 when no host is given).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8710")]
    http: String,
    /// The policy: its `defaults.approval_fatigue` sets when a tool is flagged as approved
    /// nearly always.
    #[arg(long, value_name = "FILE")]
    policy: Option<PathBuf>,
    /// Who the printed login link signs in as (default `human:<os user>`).
    #[arg(long = "as", value_name = "IDENTITY")]
    identity: Option<String>,
    /// The console's address as browsers reach it (`https://approvals.example.com`), when a
    /// proxy in front of it terminates TLS: its host and origin are accepted, its links printed,
    /// and cookies marked Secure when it is https.
    #[arg(long, value_name = "URL")]
    public_url: Option<String>,
    /// A Host header value accepted besides loopback names and the public URL's host.
    /// Repeatable.
    #[arg(long = "allow-host", value_name = "HOST")]
    hosts: Vec<String>,
    /// How long the printed login link stays usable: `10m`, `1h`.
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    link_ttl: String,
    #[command(flatten)]
    oidc: OidcArgs,
}

/// Sign-in with the team's OpenID provider, beside login links.
#[derive(Debug, clap::Args)]
pub(crate) struct OidcArgs {
    /// The OpenID provider's issuer URL (https, or http on loopback): people sign in there
    /// (authorization code with PKCE) as `user:SUB`, with the groups of the ID token's `groups`
    /// claim. Register CONSOLE/oidc/callback as the redirect URI.
    #[arg(long, value_name = "URL", requires = "oidc_client_id")]
    oidc_issuer: Option<String>,
    /// The console's client id at the provider.
    #[arg(long, value_name = "ID", requires = "oidc_issuer")]
    oidc_client_id: Option<String>,
    /// A file holding the client secret (none: a public client, PKCE only). Read at start,
    /// never printed.
    #[arg(long, value_name = "FILE", requires = "oidc_issuer")]
    oidc_client_secret_file: Option<PathBuf>,
    /// Only people in this group may sign in with the provider. Repeatable (any one of them);
    /// default: anyone the provider vouches for (the policy's approvers still decide who may
    /// decide what).
    #[arg(long = "oidc-group", value_name = "GROUP", requires = "oidc_issuer")]
    oidc_groups: Vec<String>,
}

impl OidcArgs {
    /// Whether any of these flags was given.
    pub(crate) fn given(&self) -> bool {
        self.oidc_issuer.is_some()
    }

    /// The provider, discovered, when `--oidc-issuer` is given; `base` is the console's URL.
    pub(crate) async fn discover(&self, base: &str) -> anyhow::Result<Option<console::Oidc>> {
        let (Some(issuer), Some(client_id)) = (&self.oidc_issuer, &self.oidc_client_id) else {
            return Ok(None);
        };
        let client_secret = match &self.oidc_client_secret_file {
            Some(file) => {
                let text = std::fs::read_to_string(file).with_context(|| {
                    format!("cannot read the client secret file {}", file.display())
                })?;
                Some(toolgate_core::secret::Secret::new(text.trim().to_owned()))
            }
            None => None,
        };
        let config = console::OidcConfig {
            issuer: issuer.clone(),
            client_id: client_id.clone(),
            client_secret,
            allowed_groups: self.oidc_groups.clone(),
        };
        let oidc = console::Oidc::discover(config, format!("{base}/oidc/callback"))
            .await
            .with_context(|| format!("--oidc-issuer {issuer}"))?;
        Ok(Some(oidc))
    }
}

#[derive(Debug, clap::Args)]
struct LinkArgs {
    /// The server's data directory (where toolgate.db lives).
    #[arg(long, value_name = "DIR", default_value = ".")]
    data: PathBuf,
    #[command(flatten)]
    store: crate::store::StoreArgs,
    /// Who the link signs in as (default `human:<os user>`).
    #[arg(long = "as", value_name = "IDENTITY")]
    identity: Option<String>,
    /// The console's base URL (default: the one the running console wrote in the data
    /// directory).
    #[arg(long, value_name = "URL")]
    url: Option<String>,
    /// How long the link stays usable: `10m`, `1h`.
    #[arg(long, value_name = "DURATION", default_value = "1h")]
    ttl: String,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    match args.command {
        Some(Command::Link(link)) => print_link(link).await,
        None => serve(args.serve).await,
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let addr = crate::http::parse_address(&args.http)?;
    let fatigue = Fatigue {
        threshold: match &args.policy {
            Some(path) => crate::gate::load_policy(path)?.defaults().approval_fatigue,
            None => Fatigue::default().threshold,
        },
        ..Fatigue::default()
    };
    // Checked before anything is bound or written.
    duration(&args.link_ttl, "--link-ttl")?;
    let approvals = args.store.approvals(&args.data).await?;
    let (listener, bound) = crate::http::listen(addr).await?;
    let base = match &args.public_url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => format!("http://{bound}"),
    };
    let mut config =
        HttpConfig::new(&format!("{base}/")).with_context(|| format!("--public-url {base}"))?;
    config.allowed_hosts.extend(args.hosts.iter().cloned());
    if args.public_url.is_some() {
        config.allowed_origins.push(base.clone());
    }
    config = config.with_loopback_origins(bound);

    let shutdown = tokio_util::sync::CancellationToken::new();
    tokio::spawn(http::stop_on_signal(shutdown.clone()));
    let mut console = Console::new(approvals, &config)
        .with_fatigue(fatigue)
        .with_shutdown(shutdown.clone());
    if let Some(oidc) = args.oidc.discover(&base).await? {
        console = console.with_oidc(oidc);
    }
    let identity = args.identity.unwrap_or_else(toolgate::identity::human);
    tracing::info!(address = %bound, url = %base, "toolgate console serving");
    if !bound.ip().is_loopback() && !base.starts_with("https:") {
        tracing::warn!(
            "the console is reachable from other machines over plain http: its session cookie \
             can be read on the way; put it behind TLS and pass --public-url https://…"
        );
    }
    announce(&console, &args.data, &base, &identity, &args.link_ttl).await?;
    http::serve(
        listener,
        console.router(),
        &config,
        shutdown,
        Duration::from_secs(1),
    )
    .await
    .context("HTTP server failed")?;
    Ok(ExitCode::SUCCESS)
}

/// Mints the first login link of a console served at `base` and prints it for the person at the
/// terminal, and writes `base` where `console link` finds it.
pub(crate) async fn announce(
    console: &Console,
    data: &Path,
    base: &str,
    identity: &str,
    ttl_text: &str,
) -> anyhow::Result<()> {
    let token = mint(
        console.logins(),
        identity,
        duration(ttl_text, "--link-ttl")?,
    )
    .await?;
    if let Err(error) = std::fs::write(data.join(URL_FILE), format!("{base}\n")) {
        tracing::warn!(error = %error, "cannot write the console's address for `console link`");
    }
    eprintln!(
        "toolgate console: sign in as {identity} by opening this link (it works once, for {ttl_text}):\n  {base}/login?token={token}"
    );
    Ok(())
}

async fn print_link(args: LinkArgs) -> anyhow::Result<ExitCode> {
    let ttl = duration(&args.ttl, "--ttl")?;
    let base = match args.url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => std::fs::read_to_string(args.data.join(URL_FILE))
            .map(|text| text.trim().to_owned())
            .with_context(|| {
                format!("no console has run on {} (pass --url)", args.data.display())
            })?,
    };
    let approvals = args.store.approvals(&args.data).await?;
    let identity = args.identity.unwrap_or_else(toolgate::identity::human);
    let token = mint(&ConsoleStore::beside(&approvals), &identity, ttl).await?;
    // The link is this command's output: a person or a script reads it.
    #[allow(clippy::print_stdout)]
    {
        println!("{base}/login?token={token}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn mint(store: &ConsoleStore, identity: &str, ttl: Duration) -> anyhow::Result<String> {
    let now = now_ms();
    let ttl_ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
    console::mint_link(store, identity, now.saturating_add(ttl_ms), now)
        .await
        .context("cannot make a login link")
}

fn duration(text: &str, flag: &str) -> anyhow::Result<Duration> {
    let ttl = toolgate_core::policy::parse_duration(text)
        .with_context(|| format!("{flag} {text:?} is not a duration like 10m or 1h"))?;
    if ttl.is_zero() {
        bail!("{flag} must be longer than zero");
    }
    Ok(ttl)
}
