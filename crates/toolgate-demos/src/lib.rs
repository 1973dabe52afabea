//! The built-in toolsets `toolgate serve` runs, written against the library's public toolset
//! contract (`toolgate::toolset`) like any other user of it: the ledger of seed 000, notes,
//! orders, the helpdesk of seed 003 and docs. Not published; the CLI and the tests use it. State
//! lives under the data directory the command line names.

mod docs;
mod helpdesk;
mod ledger;
mod notes;
mod orders;

use std::path::{Path, PathBuf};

pub use docs::{Docs, DocsConfigError, TestEscape};
pub use helpdesk::Helpdesk;
pub use ledger::Ledger;
pub use notes::Notes;
pub use orders::Orders;

use toolgate::toolset::Toolset;

/// What the command line tells the built-in toolsets beyond their data directory.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// docs: the hosts `fetch_doc` may fetch from (empty: its built-in documentation sites).
    pub docs_hosts: Vec<String>,
    /// docs, tests only: pinned hosts that may reach trusted private networks, and an extra root
    /// certificate. Never read from a file, a flag or the environment; see [`TestEscape`].
    pub docs_test_escape: Option<TestEscape>,
}

/// Why [`by_name`] built no toolset. Each message carries its cause, so it reads whole in one line.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("unknown toolset {name:?} (available: docs, helpdesk, ledger, notes, orders)")]
    Unknown { name: String },
    /// The docs toolset's options do not hold (its allow-list, say).
    #[error("docs toolset: {0}")]
    Docs(Box<dyn std::error::Error + Send + Sync>),
    /// A toolset's state under the data directory cannot be opened.
    #[error("{toolset} toolset in {dir}: {error}", dir = dir.display())]
    State {
        toolset: &'static str,
        dir: PathBuf,
        error: std::io::Error,
    },
}

/// Builds the toolset named on the command line. Toolsets that keep state put it under `data`.
///
/// # Errors
/// The name is not a built-in toolset (the message lists the ones there are), or its state cannot
/// be opened.
pub fn by_name(name: &str, data: &Path, options: &Options) -> Result<Box<dyn Toolset>, OpenError> {
    fn state(toolset: &'static str, dir: &Path) -> impl FnOnce(std::io::Error) -> OpenError {
        let dir = dir.to_owned();
        move |error| OpenError::State {
            toolset,
            dir,
            error,
        }
    }
    match name {
        "docs" => Ok(Box::new(
            Docs::from_options(options).map_err(|e| OpenError::Docs(e.into()))?,
        )),
        "ledger" => Ok(Box::new(Ledger::new())),
        "notes" => {
            let dir = data.join("notes");
            Notes::seed_demo(&dir).map_err(state("notes", &dir))?;
            Ok(Box::new(
                Notes::new(dir.clone()).map_err(state("notes", &dir))?,
            ))
        }
        "orders" => {
            let dir = data.join("orders");
            Ok(Box::new(Orders::open(&dir).map_err(state("orders", &dir))?))
        }
        "helpdesk" => {
            let dir = data.join("helpdesk");
            Ok(Box::new(
                Helpdesk::open(&dir).map_err(state("helpdesk", &dir))?,
            ))
        }
        other => Err(OpenError::Unknown {
            name: other.to_owned(),
        }),
    }
}
