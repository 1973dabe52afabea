//! Policy reload for `serve` and `proxy`: on SIGHUP, or when the policy file changes (checked once
//! a second), the file is read, parsed and checked against the tools served, and only then put in
//! force ([`Gate::reload`]: recorded with the old and the new hash, for calls that start after
//! it). A file that does not load, or does not fit the tools, changes nothing: the policy in force
//! stays, the log says why, and the refusal is recorded too.
//!
//! Design decision: the file is watched by its status (modification time, size, inode) rather than
//! by inotify, so that an editor's rename-into-place, a ConfigMap's symlink swap and a plain write
//! are all seen, with no platform code; a second of delay is nothing beside a person's edit.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use toolgate::server::Gate;
use toolgate::toolset::Toolset;
use toolgate_core::canonical;
use toolgate_core::policy::Policy;

/// How often the file's status is read.
const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Reloads until dropped.
#[derive(Debug)]
pub(crate) struct Reloader(tokio::task::JoinHandle<()>);

impl Drop for Reloader {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Watches `path` and SIGHUP for `gate`'s policy, which serves `toolset`.
pub(crate) fn start(
    gate: Gate,
    toolset: Arc<dyn Toolset>,
    path: PathBuf,
) -> anyhow::Result<Reloader> {
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
    Ok(Reloader(tokio::spawn(async move {
        let mut seen = status(&path);
        let mut ticks = tokio::time::interval(WATCH_EVERY);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let by = tokio::select! {
                _ = hangups.recv() => "signal:SIGHUP",
                _ = ticks.tick() => {
                    let now = status(&path);
                    if now == seen {
                        continue;
                    }
                    seen = now;
                    "file"
                }
            };
            reload(&gate, toolset.as_ref(), &path, by).await;
        }
    })))
}

/// What identifies one version of the file.
type Status = Option<(SystemTime, u64, u64)>;

fn status(path: &Path) -> Status {
    std::fs::metadata(path).ok().map(|m| {
        (
            m.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            m.len(),
            m.ino(),
        )
    })
}

/// One attempt: the new policy in force, or the old one kept and the reason logged and recorded.
pub(crate) async fn reload(gate: &Gate, toolset: &dyn Toolset, path: &Path, by: &str) {
    let bytes = match tokio::fs::read(path).await {
        Ok(bytes) => bytes,
        Err(error) => {
            tracing::error!(error = %error, file = %path.display(), "policy not reloaded: the file cannot be read; the policy in force stays");
            return;
        }
    };
    let checked = Policy::from_bytes(&bytes)
        .map_err(|error| format!("{error:#}"))
        .and_then(|policy| {
            crate::gate::check_policy(&policy, toolset)
                .map(|warnings| (policy, warnings))
                .map_err(|error| format!("{error:#}"))
        });
    let (policy, warnings) = match checked {
        Ok(checked) => checked,
        Err(why) => {
            tracing::error!(reason = %why, file = %path.display(), "policy not reloaded; the policy in force stays");
            let sha256 = canonical::sha256_hex(&bytes);
            if let Err(error) = gate.record_refused_policy(&sha256, by, &why).await {
                tracing::error!(error = %error, "the refused reload could not be recorded");
            }
            return;
        }
    };
    for warning in warnings {
        tracing::warn!(%warning, "reloaded policy");
    }
    match gate.reload(policy, by).await {
        Ok(reloaded) => {
            tracing::info!(old = %reloaded.old_sha256, new = %reloaded.new_sha256, by, "policy reloaded");
        }
        Err(toolgate::server::ReloadError::Unchanged) => {
            tracing::debug!("policy file touched, content unchanged");
        }
        Err(error) => {
            tracing::error!(error = %error, "policy not reloaded; the policy in force stays");
        }
    }
}
