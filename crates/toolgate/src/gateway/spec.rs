//! How the gateway reaches its upstreams: a command to start (stdio) or a Streamable HTTP URL,
//! from a TOML file or from `--upstream NAME=…` on the command line; or, for a program that uses
//! the library, an rmcp server of its own run in the same process ([`InProcess`]).
//!
//! Upstream credentials belong to the upstream's own entry (`env` for a child process,
//! `bearer_env` for HTTP); nothing the gateway's own callers present is ever passed on. This
//! module only parses: the token `bearer_env` names is read by whoever owns the environment (the
//! command line) and handed over as a [`Secret`] with [`UpstreamSpec::with_bearer`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rmcp::{ServerHandler, ServiceExt};
use serde::Deserialize;
use toolgate_core::secret::Secret;

use super::error::{SpecError, UrlProblem};

/// One upstream MCP server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamSpec {
    /// Names the upstream in audit records, logs, the lock file and (with several upstreams) in
    /// tool names: `NAME__tool`.
    pub name: String,
    /// Where the upstream is and how it is reached.
    pub target: Target,
}

/// Where an upstream is.
#[derive(Clone, Debug)]
pub enum Target {
    /// A child process speaking MCP on its stdio.
    Command {
        /// The program to start, looked up on `PATH` unless it is a path.
        program: String,
        /// Its arguments, passed as they are (no shell runs in between).
        args: Vec<String>,
        /// Set on top of the gateway's own environment.
        env: BTreeMap<String, String>,
        /// The directory it starts in; the gateway's own when `None`.
        cwd: Option<PathBuf>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        /// The MCP endpoint; [`from_file`] and [`from_flag`] accept only `https`, or `http` to a
        /// loopback host.
        url: String,
        /// Environment variable holding the upstream's own bearer token, if it needs one.
        bearer_env: Option<String>,
        /// That token, once read ([`UpstreamSpec::with_bearer`]). Connecting refuses to go on
        /// without it when `bearer_env` is set.
        bearer: Option<Secret>,
    },
    /// An MCP server in this process, spoken to over an in-memory pipe.
    InProcess(InProcess),
}

/// An rmcp server (any `ServerHandler`, such as one written with rmcp's `#[tool_router]` and
/// `#[tool]` macros) run in this process as an upstream: its tools then walk the gate like any
/// upstream's, without being rewritten. Each connection, and each restart after the server's
/// service ended, serves a fresh clone of it on a new in-memory pipe; nothing crosses a process
/// or a socket.
#[derive(Clone)]
pub struct InProcess {
    start: Arc<dyn Fn(tokio::io::DuplexStream) + Send + Sync>,
}

impl InProcess {
    /// `server`, cloned for each connection.
    pub fn new<S>(server: S) -> Self
    where
        S: ServerHandler + Clone,
    {
        Self {
            start: Arc::new(move |pipe| {
                let server = server.clone();
                tokio::spawn(async move {
                    match server.serve(pipe).await {
                        Ok(running) => {
                            let _ = running.waiting().await;
                        }
                        Err(error) => {
                            tracing::warn!(%error, "in-process upstream did not start");
                        }
                    }
                });
            }),
        }
    }

    /// Serves a fresh clone on `pipe` (the server's end), on a task of its own.
    pub(super) fn start(&self, pipe: tokio::io::DuplexStream) {
        (self.start)(pipe);
    }
}

impl std::fmt::Debug for InProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InProcess")
    }
}

/// Equal when they name the same upstream the same way. Tokens are compared only for being there:
/// [`Secret::expose`] stays the one reader of a secret.
impl PartialEq for Target {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (
                Self::Command {
                    program,
                    args,
                    env,
                    cwd,
                },
                Self::Command {
                    program: p,
                    args: a,
                    env: e,
                    cwd: c,
                },
            ) => (program, args, env, cwd) == (p, a, e, c),
            (
                Self::Http {
                    url,
                    bearer_env,
                    bearer,
                },
                Self::Http {
                    url: u,
                    bearer_env: b,
                    bearer: t,
                },
            ) => (url, bearer_env, bearer.is_some()) == (u, b, t.is_some()),
            (Self::InProcess(a), Self::InProcess(b)) => Arc::ptr_eq(&a.start, &b.start),
            _ => false,
        }
    }
}

impl Eq for Target {}

impl UpstreamSpec {
    /// An rmcp server of this program's own as upstream `name` ([`InProcess`]).
    #[must_use]
    pub fn in_process<S>(name: impl Into<String>, server: S) -> Self
    where
        S: ServerHandler + Clone,
    {
        Self {
            name: name.into(),
            target: Target::InProcess(InProcess::new(server)),
        }
    }

    /// The spec with the token its `bearer_env` names. No effect on an upstream that is not HTTP.
    #[must_use]
    pub fn with_bearer(mut self, token: Secret) -> Self {
        if let Target::Http { bearer, .. } = &mut self.target {
            *bearer = Some(token);
        }
        self
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    upstreams: BTreeMap<String, RawUpstream>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawUpstream {
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    cwd: Option<PathBuf>,
    url: Option<String>,
    bearer_env: Option<String>,
}

/// Upstreams from a TOML file: `[upstreams.NAME]` with `command` + `args` (+ `env`, `cwd`) or
/// `url` (+ `bearer_env`).
///
/// # Errors
/// The file cannot be read or parsed, or an entry is not exactly one of the two shapes.
pub fn from_file(path: &Path) -> Result<Vec<UpstreamSpec>, SpecError> {
    let text = std::fs::read_to_string(path).map_err(|source| SpecError::Read {
        path: path.to_owned(),
        source,
    })?;
    let raw: RawFile = toml::from_str(&text).map_err(|source| SpecError::Parse {
        path: path.to_owned(),
        source,
    })?;
    raw.upstreams
        .into_iter()
        .map(|(name, entry)| {
            check_name(&name)?;
            let target = match (entry.command, entry.url) {
                (Some(program), None) if entry.bearer_env.is_none() => Target::Command {
                    program,
                    args: entry.args,
                    env: entry.env,
                    cwd: entry.cwd,
                },
                (None, Some(url))
                    if entry.args.is_empty() && entry.env.is_empty() && entry.cwd.is_none() =>
                {
                    check_url(&url)?;
                    Target::Http {
                        url,
                        bearer_env: entry.bearer_env,
                        bearer: None,
                    }
                }
                _ => return Err(SpecError::Shape { name }),
            };
            Ok(UpstreamSpec { name, target })
        })
        .collect()
}

/// `NAME=COMMAND ARGS…` (split like a shell would, quotes respected) or `NAME=https://…/mcp`.
///
/// # Errors
/// No `=`, a bad name, an empty command, or unbalanced quotes.
pub fn from_flag(flag: &str) -> Result<UpstreamSpec, SpecError> {
    let (name, rest) = flag.split_once('=').ok_or_else(|| SpecError::Flag {
        flag: flag.to_owned(),
    })?;
    check_name(name)?;
    let rest = rest.trim();
    if rest.starts_with("http://") || rest.starts_with("https://") {
        check_url(rest)?;
        return Ok(UpstreamSpec {
            name: name.to_owned(),
            target: Target::Http {
                url: rest.to_owned(),
                bearer_env: None,
                bearer: None,
            },
        });
    }
    let words = shlex::split(rest).ok_or_else(|| SpecError::Quotes {
        name: name.to_owned(),
    })?;
    from_command(name, &words)
}

/// An upstream started as `words[0] words[1..]`.
///
/// # Errors
/// A bad name or no command.
pub fn from_command(name: &str, words: &[String]) -> Result<UpstreamSpec, SpecError> {
    check_name(name)?;
    let (program, args) = words.split_first().ok_or_else(|| SpecError::NoCommand {
        name: name.to_owned(),
    })?;
    Ok(UpstreamSpec {
        name: name.to_owned(),
        target: Target::Command {
            program: program.clone(),
            args: args.to_vec(),
            env: BTreeMap::new(),
            cwd: None,
        },
    })
}

/// Names become tool-name prefixes and lock-file keys: letters, digits, `-`, `_`, no `__`.
fn check_name(name: &str) -> Result<(), SpecError> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.contains("__");
    if ok {
        Ok(())
    } else {
        Err(SpecError::Name {
            name: name.to_owned(),
        })
    }
}

/// Plain HTTP only to this machine: anything else would send requests (and the upstream's
/// credentials) in the clear.
/// The URL is parsed, not pattern-matched: `http://127.0.0.1.example.com` and
/// `http://localhost@example.com` are remote hosts. Credentials in the URL are refused (they would
/// end up in logs); use `bearer_env`.
fn check_url(text: &str) -> Result<(), SpecError> {
    let refuse = |problem| {
        Err(SpecError::Url {
            url: text.to_owned(),
            problem,
        })
    };
    let Ok(url) = url::Url::parse(text) else {
        return refuse(UrlProblem::NotUrl);
    };
    if !url.username().is_empty() || url.password().is_some() {
        return refuse(UrlProblem::Credentials);
    }
    if url.host().is_none() {
        return refuse(UrlProblem::NoHost);
    }
    match url.scheme() {
        "https" => Ok(()),
        "http" if crate::loopback(&url) => Ok(()),
        _ => refuse(UrlProblem::PlainHttp),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(program: &str, args: &[&str]) -> Target {
        Target::Command {
            program: program.to_owned(),
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            env: BTreeMap::new(),
            cwd: None,
        }
    }

    fn http(url: &str) -> Target {
        Target::Http {
            url: url.to_owned(),
            bearer_env: None,
            bearer: None,
        }
    }

    /// The error's message and the messages of its sources, as the command line prints them.
    fn chain(error: &dyn std::error::Error) -> String {
        let mut text = error.to_string();
        let mut next = error.source();
        while let Some(source) = next {
            text = format!("{text}: {source}");
            next = source.source();
        }
        text
    }

    /// `text` as an upstream configuration file, parsed.
    fn file(text: &str) -> Result<Vec<UpstreamSpec>, SpecError> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("upstreams.toml");
        std::fs::write(&path, text).expect("write config");
        from_file(&path)
    }

    #[test]
    fn a_flag_with_a_command_is_split_like_a_shell_would() {
        let spec = from_flag(r#"a=cmd arg "quoted arg""#).expect("a command flag");
        assert_eq!(spec.name, "a");
        assert_eq!(spec.target, command("cmd", &["arg", "quoted arg"]));
        let spec = from_flag("tb=  /bin/server --dir '/tmp/with space'  ").expect("padded");
        assert_eq!(
            spec.target,
            command("/bin/server", &["--dir", "/tmp/with space"])
        );
    }

    #[test]
    fn a_flag_splits_at_the_first_equals_sign_only() {
        let spec = from_flag("a=env X=1 server").expect("a command with `=` in it");
        assert_eq!(spec.name, "a");
        assert_eq!(spec.target, command("env", &["X=1", "server"]));
    }

    #[test]
    fn a_flag_with_an_https_url_is_an_http_upstream() {
        let spec = from_flag("a=https://x/mcp").expect("https");
        assert_eq!(
            spec,
            UpstreamSpec {
                name: "a".to_owned(),
                target: http("https://x/mcp")
            }
        );
    }

    #[test]
    fn plain_http_is_accepted_to_this_machine() {
        for url in [
            "http://127.0.0.1:1/mcp",
            "http://localhost:8080/mcp",
            "http://[::1]:3001/mcp",
        ] {
            let spec = from_flag(&format!("a={url}")).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(spec.target, http(url), "{url}");
        }
    }

    #[test]
    fn plain_http_to_another_machine_is_refused() {
        let err = chain(&from_flag("a=http://example.com/mcp").expect_err("plain http elsewhere"));
        assert!(err.contains("http://example.com/mcp"), "{err}");
        assert!(err.contains("https://"), "{err}");
    }

    /// `check_url` compares prefixes of the URL text, so a host that merely starts with
    /// `127.0.0.1` or `localhost`, or userinfo before a remote host, passes as local.
    #[test]
    fn plain_http_to_a_host_that_only_looks_local_is_refused() {
        // Each names a host in example.com (`url::Url::host_str`, what reqwest connects to):
        // `127.0.0.1.example.com`, `localhost.example.com`, or `example.com` after userinfo.
        let remote = [
            "http://127.0.0.1.example.com/mcp",
            "http://localhost.example.com/mcp",
            "http://127.0.0.1@example.com/mcp",
            "http://localhost:80@example.com/mcp",
            "http://[::1]@example.com/mcp",
        ];
        let accepted: Vec<&str> = remote
            .into_iter()
            .filter(|url| from_flag(&format!("a={url}")).is_ok())
            .collect();
        assert!(
            accepted.is_empty(),
            "accepted as local, though they send requests in the clear to example.com hosts: {accepted:?}"
        );
    }

    #[test]
    fn bad_names_are_refused() {
        let too_long = "a".repeat(33);
        for name in ["a__b", "", too_long.as_str(), "a b", "a.b", "a/b", "é"] {
            let err = from_flag(&format!("{name}=cmd"))
                .expect_err(&format!("name {name:?} should be refused"))
                .to_string();
            assert!(err.contains("upstream name"), "{name:?}: {err}");
            assert!(
                from_command(name, &["cmd".to_owned()]).is_err(),
                "from_command {name:?}"
            );
        }
    }

    #[test]
    fn names_of_letters_digits_dashes_and_single_underscores_up_to_32_are_accepted() {
        let longest = "a".repeat(32);
        for name in ["a", "A-1", "my_server", "_", longest.as_str()] {
            let spec = from_flag(&format!("{name}=cmd")).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(spec.name, name);
        }
    }

    #[test]
    fn a_flag_without_an_equals_sign_is_refused() {
        let err = chain(&from_flag("cmd --arg").expect_err("no `=`"));
        assert!(err.contains("NAME=COMMAND"), "{err}");
    }

    #[test]
    fn unbalanced_quotes_are_refused() {
        for flag in [r#"a=cmd "oops"#, "a=cmd 'oops"] {
            let err = chain(&from_flag(flag).expect_err(flag));
            assert!(err.contains("unbalanced quotes"), "{flag}: {err}");
        }
    }

    #[test]
    fn an_empty_command_is_refused() {
        for flag in ["a=", "a=   "] {
            let err = chain(&from_flag(flag).expect_err(flag));
            assert!(err.contains("no command given"), "{flag:?}: {err}");
        }
        assert!(from_command("a", &[]).is_err());
    }

    #[test]
    fn a_file_gives_both_shapes_by_name() {
        let specs = file(
            r#"
[upstreams.tb]
command = "/bin/testbed"
args = ["--dir", "/tmp/up"]
env = { TESTBED_LOG = "debug" }
cwd = "/tmp"

[upstreams.ev]
url = "https://ev.example/mcp"
bearer_env = "EV_TOKEN"

[upstreams.local]
url = "http://127.0.0.1:3001/mcp"
"#,
        )
        .expect("a valid file");
        assert_eq!(
            specs,
            [
                UpstreamSpec {
                    name: "ev".to_owned(),
                    target: Target::Http {
                        url: "https://ev.example/mcp".to_owned(),
                        bearer_env: Some("EV_TOKEN".to_owned()),
                        bearer: None,
                    },
                },
                UpstreamSpec {
                    name: "local".to_owned(),
                    target: http("http://127.0.0.1:3001/mcp"),
                },
                UpstreamSpec {
                    name: "tb".to_owned(),
                    target: Target::Command {
                        program: "/bin/testbed".to_owned(),
                        args: vec!["--dir".to_owned(), "/tmp/up".to_owned()],
                        env: BTreeMap::from([("TESTBED_LOG".to_owned(), "debug".to_owned())]),
                        cwd: Some(PathBuf::from("/tmp")),
                    },
                },
            ]
        );
    }

    #[test]
    fn an_empty_file_has_no_upstreams() {
        assert_eq!(file("").expect("an empty file is valid"), []);
    }

    #[test]
    fn an_entry_with_both_or_neither_shape_or_mixed_fields_is_refused() {
        for (what, text) in [
            (
                "command and url",
                "[upstreams.x]\ncommand = \"c\"\nurl = \"https://x/mcp\"\n",
            ),
            ("neither", "[upstreams.x]\nargs = [\"a\"]\n"),
            (
                "url with args",
                "[upstreams.x]\nurl = \"https://x/mcp\"\nargs = [\"a\"]\n",
            ),
            (
                "url with env",
                "[upstreams.x]\nurl = \"https://x/mcp\"\nenv = { A = \"1\" }\n",
            ),
            (
                "url with cwd",
                "[upstreams.x]\nurl = \"https://x/mcp\"\ncwd = \"/tmp\"\n",
            ),
            (
                "command with bearer_env",
                "[upstreams.x]\ncommand = \"c\"\nbearer_env = \"T\"\n",
            ),
        ] {
            let err = chain(&file(text).expect_err(what));
            assert!(err.contains("upstream x"), "{what}: {err}");
            assert!(err.contains("either"), "{what}: {err}");
        }
    }

    #[test]
    fn unknown_fields_are_refused() {
        for (what, text) in [
            (
                "in an entry",
                "[upstreams.x]\ncommand = \"c\"\nargz = [\"a\"]\n",
            ),
            ("at the top", "upstream = 1\n"),
        ] {
            let err = chain(&file(text).expect_err(what));
            assert!(err.contains("unknown field"), "{what}: {err}");
        }
    }

    #[test]
    fn a_file_checks_names_and_urls_like_the_flag() {
        let err = chain(&file("[upstreams.a__b]\ncommand = \"c\"\n").expect_err("bad name"));
        assert!(err.contains("upstream name"), "{err}");
        let err = chain(
            &file("[upstreams.x]\nurl = \"http://example.com/mcp\"\n").expect_err("plain http"),
        );
        assert!(err.contains("https://"), "{err}");
    }

    #[test]
    fn a_token_is_never_printed_with_its_spec() {
        let spec = from_flag("a=https://x/mcp")
            .expect("https")
            .with_bearer(Secret::new("t0ken-in-memory"));
        let printed = format!("{spec:?}");
        assert!(!printed.contains("t0ken-in-memory"), "{printed}");
        assert!(printed.contains("<redacted>"), "{printed}");
        // A command upstream has no bearer token to take.
        let command = from_flag("b=cmd").expect("command");
        assert_eq!(command.clone().with_bearer(Secret::new("x")), command);
    }

    #[test]
    fn a_missing_file_names_its_path() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("nowhere.toml");
        let err = chain(&from_file(&path).expect_err("missing"));
        assert!(err.contains(&path.display().to_string()), "{err}");
    }
}
