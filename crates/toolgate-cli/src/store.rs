//! `--store`: where the shared state lives (approvals, the kill switch, budgets, idempotency keys,
//! tasks, agent runs, console logins), the same flag on every command that reads or writes it.
//!
//! Without it the state is `toolgate.db` in the data directory, as it always was: one server and
//! the people's commands beside it. With a `postgres://` URL, every replica of a server and every
//! person's command on any machine share one state. The URL may hold a password, so it can come
//! from `TOOLGATE_STORE` instead of the command line (where `ps` would show it), and it is handed
//! to the redactor as a secret: no log line or error prints it.

use std::path::Path;

use anyhow::Context;
use toolgate_core::secret::Secret;
use toolgate_store::Location;
use toolgate_store::approval::ApprovalStore;

/// The `--store` flag.
#[derive(Clone, Debug, Default, clap::Args)]
#[group(skip)]
pub(crate) struct StoreArgs {
    /// Where approvals, the kill switch, budgets, idempotency keys, tasks and agent runs live:
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB`, shared by every replica (schema created or
    /// upgraded at start). Default: toolgate.db in the data directory.
    #[arg(
        long,
        value_name = "URL",
        global = true,
        env = "TOOLGATE_STORE",
        hide_env_values = true
    )]
    store: Option<String>,
}

impl StoreArgs {
    /// The flag as a location; the data directory's database when it is absent.
    pub(crate) fn location(&self, data: &Path) -> anyhow::Result<Location> {
        let Some(value) = &self.store else {
            return Ok(Location::Dir(data.to_owned()));
        };
        match Location::parse(value) {
            location @ Location::Postgres(_) => Ok(location),
            // Memory is for tests in one process: a person's command could never see it.
            Location::Dir(_) | Location::Memory => anyhow::bail!(
                "--store takes a postgres:// URL (the data directory's database is the default)"
            ),
        }
    }

    /// The URL as a secret for the redactor (its password must never reach a log line).
    pub(crate) fn secret(&self) -> Option<Secret> {
        self.store.as_ref().map(|url| Secret::new(url.clone()))
    }

    /// The approval queue where the flag says (every other store of a command opens beside it).
    pub(crate) async fn approvals(&self, data: &Path) -> anyhow::Result<ApprovalStore> {
        let location = self.location(data)?;
        ApprovalStore::at(&location)
            .await
            .with_context(|| format!("cannot open the approval queue in {location}"))
    }
}
