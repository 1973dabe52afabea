//! The kit: your own tools as a gated MCP server, in a few lines (seed 004, in Rust).
//!
//! A [`Server`] has a name, [`Tool`]s and options, and serves stdio (Streamable HTTP with the
//! `http` feature). A tool that changes things is marked [`Tool::gated`]: it stays off until
//! `<NAME>_ALLOW_GATED` is set to an enabling value in the server's environment, and until then a
//! call runs no handler and answers with the tool's [`Tool::dry_run`], the variable that would
//! enable it and the arguments it received. Handlers get typed arguments and a [`Context`]
//! (cancellation, a redacting logger on stderr, the environment) and answer honestly:
//! [`list_result`], [`collect`], [`empty_result`], [`ok_result`], or a [`ToolError`].
//!
//! It owns the builder and the handler-facing types, nothing of the gate: every call walks the
//! same corridor as `toolgate serve` and `toolgate proxy` (visibility, schema, tiers, approvals,
//! budgets, idempotency keys, timeouts, redaction, the audit chain). A policy file is optional;
//! without one every tool runs, gated tools once their switch is on, and every decision is still
//! audited in the data directory ([`Server::data_dir`]).
//!
//! Design decision: the kit's tools are one more [`Toolset`](crate::toolset::Toolset), and the
//! builder's options become policy rules ([`Policy::for_kit`](toolgate_core::policy::Policy::for_kit),
//! [`Policy::declare`](toolgate_core::policy::Policy::declare)), so there is no second gate to
//! keep in step with the first: what `toolgate policy explain` says about a rule is what a kit
//! does with it.

mod context;
mod results;
mod secrets;
mod server;
mod tool;

pub use crate::stdio::Bare;
pub use context::{Context, Env, Level, Logger};
pub use results::{Lookup, Output, ToolError, collect, empty_result, list_result, ok_result};
pub use secrets::{SecretError, load_secret, register_secret};
pub use server::{Built, KitError, Server};
pub use tool::Tool;
pub use toolgate_store::journal::Durability;
