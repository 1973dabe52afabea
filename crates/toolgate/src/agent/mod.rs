//! The agent (DESIGN.md §9): seed 003's gated agent loop on this gate. A model behind one small
//! trait ([`Model`]) asks for tools; every call it makes walks the same corridor as a call from an
//! MCP client of `serve` or `proxy`, as the agent's own principal (`agent:NAME`), so tiers,
//! approvals, budgets, idempotency, the kill switch and the audit log are the gate's, not a copy.
//!
//! Files: `run.rs` (the loop, pause and resume), `events.rs` (the run's event lines), `model.rs`
//! (the conversation and the trait), `scripted.rs` (a plan file, for demos and tests), `openai.rs`
//! (any OpenAI-compatible Chat Completions API).

mod events;
mod model;
pub mod openai;
mod run;
pub mod scripted;

pub use events::EventLog;
pub use model::{Action, Arguments, Message, Model, ModelError, ModelFuture, ToolCall, ToolSpec};
pub use run::{Agent, AgentError, DO_NOT_RETRY, Ending, Report, Settings};
