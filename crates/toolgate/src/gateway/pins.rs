//! Tool pinning, the defence against a "rug pull": an upstream that changes what a tool says or
//! takes after it was reviewed.
//!
//! `toolgate pin` writes a lock file with the SHA-256 of each upstream tool's canonical definition
//! (name, title, description, input and output schemas, annotations). While a lock file is in
//! use, a tool whose definition no longer matches, or that the lock does not name, is withheld
//! from the list and refused, with an audit record, until someone updates the lock on purpose.
//! An upstream the lock does not name at all has every tool withheld: adding an upstream is a
//! reviewed change too.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use rmcp::model::Tool;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use toolgate_core::canonical;

/// Format version written to and accepted from lock files.
const VERSION: u32 = 1;

/// What a lock file holds: per upstream, per tool (the upstream's own name), the definition hash.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Lock {
    version: u32,
    upstreams: BTreeMap<String, BTreeMap<String, String>>,
}

/// How a tool compares with its pin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pin {
    Matches,
    /// The definition changed since it was pinned.
    Changed {
        pinned: String,
        now: String,
    },
    /// The lock does not name this tool.
    New {
        now: String,
    },
}

/// SHA-256 of the parts of a tool definition a reviewer approved: name, title, description,
/// schemas, annotations. Icons and `_meta` are presentation and left out.
#[must_use]
pub fn definition_sha256(tool: &Tool) -> String {
    canonical::digest(&json!({
        "name": tool.name,
        "title": tool.title,
        "description": tool.description,
        "inputSchema": Value::Object((*tool.input_schema).clone()),
        "outputSchema": tool.output_schema.as_ref().map(|s| Value::Object((**s).clone())),
        "annotations": tool.annotations,
    }))
}

/// The lock file that goes with a policy file: the same path with the extension `lock`.
#[must_use]
pub fn default_path(policy: &Path) -> PathBuf {
    policy.with_extension("lock")
}

impl Lock {
    /// A lock of exactly these tools, per upstream.
    #[must_use]
    pub fn of<'a>(upstreams: impl IntoIterator<Item = (&'a str, &'a [Tool])>) -> Self {
        let upstreams = upstreams
            .into_iter()
            .map(|(name, tools)| {
                let pins = tools
                    .iter()
                    .map(|t| (t.name.to_string(), definition_sha256(t)))
                    .collect();
                (name.to_owned(), pins)
            })
            .collect();
        Self {
            version: VERSION,
            upstreams,
        }
    }

    /// Reads a lock file.
    ///
    /// # Errors
    /// The file cannot be read or is not a version-1 lock.
    pub fn load(path: &Path) -> Result<Self, String> {
        let bytes = std::fs::read(path)
            .map_err(|e| format!("cannot read lock file {}: {e}", path.display()))?;
        let lock: Self = serde_json::from_slice(&bytes)
            .map_err(|e| format!("lock file {}: {e}", path.display()))?;
        if lock.version != VERSION {
            return Err(format!(
                "lock file {}: version {} (this build reads version {VERSION})",
                path.display(),
                lock.version
            ));
        }
        Ok(lock)
    }

    /// Writes the lock atomically (temporary file, fsync, rename, directory fsync).
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let failed = |e: std::io::Error| format!("cannot write lock file {}: {e}", path.display());
        let mut text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        text.push('\n');
        let dir = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| Path::new("."));
        let mut temp = tempfile_in(dir).map_err(failed)?;
        temp.1.write_all(text.as_bytes()).map_err(failed)?;
        temp.1.sync_all().map_err(failed)?;
        std::fs::rename(&temp.0, path).map_err(failed)?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(failed)
    }

    /// How `tool` of `upstream` compares with its pin.
    #[must_use]
    pub fn check(&self, upstream: &str, tool: &Tool) -> Pin {
        let now = definition_sha256(tool);
        match self
            .upstreams
            .get(upstream)
            .and_then(|pins| pins.get(tool.name.as_ref()))
        {
            Some(pinned) if *pinned == now => Pin::Matches,
            Some(pinned) => Pin::Changed {
                pinned: pinned.clone(),
                now,
            },
            None => Pin::New { now },
        }
    }

    /// The pins of one upstream.
    #[must_use]
    pub fn upstream(&self, name: &str) -> Option<&BTreeMap<String, String>> {
        self.upstreams.get(name)
    }
}

/// A new file beside the target, so the rename stays on one file system.
fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    let path = dir.join(format!(".toolgate-lock.{}.tmp", std::process::id()));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)?;
    Ok((path, file))
}
