//! How the gateway reaches its upstreams: a command to start (stdio) or a Streamable HTTP URL,
//! from a TOML file or from `--upstream NAME=…` on the command line.
//!
//! Upstream credentials belong to the upstream's own entry (`env` for a child process,
//! `bearer_env` for HTTP, read from the gateway's environment at connect time); nothing the
//! gateway's own callers present is ever passed on.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// One upstream MCP server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamSpec {
    /// Names the upstream in audit records, logs, the lock file and (with several upstreams) in
    /// tool names: `NAME__tool`.
    pub name: String,
    pub target: Target,
}

/// Where an upstream is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A child process speaking MCP on its stdio.
    Command {
        program: String,
        args: Vec<String>,
        /// Set on top of the gateway's own environment.
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A Streamable HTTP endpoint.
    Http {
        url: String,
        /// Environment variable holding the upstream's own bearer token, if it needs one.
        bearer_env: Option<String>,
    },
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
pub fn from_file(path: &Path) -> Result<Vec<UpstreamSpec>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read upstream configuration {}: {e}", path.display()))?;
    let raw: RawFile = toml::from_str(&text)
        .map_err(|e| format!("upstream configuration {}: {e}", path.display()))?;
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
                    }
                }
                _ => {
                    return Err(format!(
                        "upstream {name}: give either `command` (with args, env, cwd) or `url` (with bearer_env), not both or neither"
                    ));
                }
            };
            Ok(UpstreamSpec { name, target })
        })
        .collect()
}

/// `NAME=COMMAND ARGS…` (split like a shell would, quotes respected) or `NAME=https://…/mcp`.
///
/// # Errors
/// No `=`, a bad name, an empty command, or unbalanced quotes.
pub fn from_flag(flag: &str) -> Result<UpstreamSpec, String> {
    let (name, rest) = flag
        .split_once('=')
        .ok_or_else(|| format!("--upstream {flag:?}: expected NAME=COMMAND… or NAME=URL"))?;
    check_name(name)?;
    let rest = rest.trim();
    if rest.starts_with("http://") || rest.starts_with("https://") {
        check_url(rest)?;
        return Ok(UpstreamSpec {
            name: name.to_owned(),
            target: Target::Http {
                url: rest.to_owned(),
                bearer_env: None,
            },
        });
    }
    let words =
        shlex::split(rest).ok_or_else(|| format!("--upstream {name}: unbalanced quotes"))?;
    from_command(name, &words)
}

/// An upstream started as `words[0] words[1..]`.
///
/// # Errors
/// A bad name or no command.
pub fn from_command(name: &str, words: &[String]) -> Result<UpstreamSpec, String> {
    check_name(name)?;
    let (program, args) = words
        .split_first()
        .ok_or_else(|| format!("upstream {name}: no command given"))?;
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
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !name.contains("__");
    if ok {
        Ok(())
    } else {
        Err(format!(
            "upstream name {name:?}: use 1-32 letters, digits, '-' or '_' (no '__', which separates it from tool names)"
        ))
    }
}

/// Plain HTTP only to this machine: anything else would send requests (and the upstream's
/// credentials) in the clear.
fn check_url(url: &str) -> Result<(), String> {
    let local = ["http://127.0.0.1", "http://localhost", "http://[::1]"];
    if url.starts_with("https://") || local.iter().any(|p| url.starts_with(p)) {
        Ok(())
    } else {
        Err(format!(
            "upstream URL {url:?}: use https:// (plain http only to 127.0.0.1, localhost or [::1])"
        ))
    }
}
