//! toolgate-core: the part of the tool-call boundary that must be readable and testable on its own.
//!
//! It owns the policy (v1 JSON, v2 TOML with CEL escalation) and its decisions, JSON Schema
//! validation of arguments, redaction of secrets, the audit chain's format and verifier, and
//! canonical JSON.
//! It must not depend on an async runtime, the MCP SDK, a database or a CLI parser (DESIGN.md §2):
//! the security argument lives here and is checked in milliseconds by unit tests, and an SDK upgrade
//! never touches it.

pub mod answer;
pub mod audit;
pub mod canonical;
pub mod json;
pub mod policy;
pub mod principal;
pub mod redact;
pub mod sanitize;
pub mod schema;
pub mod secret;
pub mod time;
