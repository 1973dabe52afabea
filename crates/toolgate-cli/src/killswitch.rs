//! `toolgate killswitch on | off | status`: block every tool of every server on a data directory,
//! durably, from another process; with `--principal`, every tool for one caller only (an agent,
//! `agent:NAME`, seed 003). A running server reads the switches on each call, so they take effect
//! on the next call without a restart; the server audits the refusals they cause.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use serde_json::json;
use toolgate_core::time::{now_ms, rfc3339};
use toolgate_store::state::{KillSwitch, PrincipalSwitch, StateStore};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// on, off or status.
    #[arg(value_enum)]
    action: Action,
    /// The server's data directory (where toolgate.db lives).
    #[arg(long, value_name = "DIR", default_value = ".")]
    data: PathBuf,
    #[command(flatten)]
    store: crate::store::StoreArgs,
    /// Only this caller's switch (e.g. `agent:support-bot`): every tier blocked for it alone.
    #[arg(long, value_name = "PRINCIPAL")]
    principal: Option<String>,
    /// Who flips it (default `human:<os user>`).
    #[arg(long = "as", value_name = "IDENTITY")]
    identity: Option<String>,
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Action {
    On,
    Off,
    Status,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<ExitCode> {
    let approvals = args.store.approvals(&args.data).await?;
    let store =
        StateStore::beside(&approvals, &args.data).context("cannot open the kill switch")?;
    let identity = args.identity.unwrap_or_else(toolgate::identity::human);
    if let Some(principal) = &args.principal {
        let on = match args.action {
            Action::Status => None,
            Action::On => Some(true),
            Action::Off => Some(false),
        };
        if let Some(on) = on {
            store
                .set_principal_killswitch(principal, on, &identity, now_ms())
                .await
                .context("cannot reach the kill switch")?;
        }
        let switches = store
            .principal_switches()
            .await
            .context("cannot reach the kill switch")?;
        let set = switches.iter().find(|s| &s.principal == principal);
        print_principal(principal, set, args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let switch = match args.action {
        Action::Status => store.killswitch().await,
        Action::On => store.set_killswitch(true, &identity, now_ms()).await,
        Action::Off => store.set_killswitch(false, &identity, now_ms()).await,
    }
    .context("cannot reach the kill switch")?;
    print(&switch, args.json)?;
    Ok(ExitCode::SUCCESS)
}

fn print_principal(
    principal: &str,
    set: Option<&PrincipalSwitch>,
    as_json: bool,
) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if as_json {
        let value = json!({
            "principal": principal,
            "on": set.is_some(),
            "changed_by": set.map(|s| s.changed_by.as_str()),
            "changed_at": set.map(|s| rfc3339(s.changed_at)),
        });
        writeln!(out, "{value}")?;
    } else if let Some(set) = set {
        writeln!(
            out,
            "kill switch ON for {principal}: every tool is blocked for it (set by {} at {})",
            set.changed_by,
            rfc3339(set.changed_at)
        )?;
    } else {
        writeln!(out, "kill switch off for {principal}")?;
    }
    Ok(())
}

fn print(switch: &KillSwitch, as_json: bool) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    if as_json {
        let value = json!({
            "on": switch.on,
            "changed_by": switch.changed_by,
            "changed_at": switch.changed_at.map(rfc3339),
        });
        writeln!(out, "{value}")?;
    } else {
        let state = if switch.on {
            "ON: every tool is blocked"
        } else {
            "off"
        };
        let when = switch.changed_at.map(rfc3339).unwrap_or_default();
        writeln!(
            out,
            "kill switch {state}{}",
            switch
                .changed_by
                .as_deref()
                .map(|b| format!(" (set by {b} at {when})"))
                .unwrap_or_default()
        )?;
    }
    Ok(())
}
