//! toolgate-core: the part of the tool-call boundary that must be readable and testable on its own.
//!
//! It owns what decides a call and what records it, with no I/O of its own:
//!
//! - [`policy`]: the policy (v1 JSON, v2 TOML with CEL escalation), its tiers, argument rules,
//!   gated tools, budgets and rate limits, and the [`Verdict`](policy::Verdict) for one call;
//! - [`schema`]: a tool's `inputSchema` compiled once, and each call's arguments checked against it
//!   with messages the model can act on;
//! - [`answer`]: the one value a call ends in, from which its audit decision and outcome, whether
//!   it executed, its wire form and the model's message all follow;
//! - [`audit`]: the audit chain's record format, sealing, and the streaming verifier;
//! - [`redact`] and [`secret`]: secrets held so they cannot be printed, and redaction of registered
//!   values and credential shapes in text and JSON;
//! - [`sanitize`]: an untrusted tool's output stripped of invisible characters, redacted, capped
//!   and wrapped as data;
//! - [`canonical`] and [`json`]: the canonical JSON that hashes and digests are taken over, and a
//!   parser that refuses text two readers could read differently;
//! - [`principal`] and [`time`]: who is calling, and the clock conversions policy facts need.
//!
//! It must not depend on an async runtime, the MCP SDK, a database or a CLI parser (DESIGN.md §2):
//! the security argument lives here and is checked in milliseconds by unit tests, and an SDK upgrade
//! never touches it.
//!
//! # Example
//!
//! Load a version 2 policy, take one call through the policy's steps, and redact a line before it
//! is logged:
//!
//! ```
//! use serde_json::{Map, Value, json};
//! use toolgate_core::policy::{Action, Policy, Tier};
//! use toolgate_core::principal::Principal;
//! use toolgate_core::redact::Redactor;
//! use toolgate_core::secret::Secret;
//!
//! let policy = Policy::from_bytes(
//!     br#"
//! version = 2
//! name = "shop"
//!
//! [tools.lookup_order]
//! tier = "low"
//!
//! [tools.refund]
//! tier = "medium"
//! escalate = [{ when = "args.amount > 100", tier = "high" }]
//! args.order_id = { min_len = 4 }
//!
//! [tools.delete_customer]
//! tier = "blocked"
//! "#,
//! )?;
//! let alice = Principal::new("local:alice");
//! let args = |value: Value| -> Map<String, Value> { value.as_object().cloned().unwrap() };
//!
//! // A large refund passes the argument rules, then escalation sends it to a person.
//! let large = args(json!({"order_id": "o-1042", "amount": 250}));
//! assert!(policy.admit("refund", &large).is_ok());
//! let assessment = policy.assess("refund", &large, &alice);
//! assert_eq!((assessment.declared, assessment.tier), (Tier::Medium, Tier::High));
//! let verdict = policy.decide("refund", &assessment, false);
//! assert_eq!(verdict.action, Action::NeedsApproval);
//! assert_eq!(verdict.rule, "tools.refund.escalate[0]");
//!
//! // A small one stays medium: it runs while the caller's budget of medium calls has room.
//! let small = args(json!({"order_id": "o-1043", "amount": 20}));
//! let verdict = policy.decide("refund", &policy.assess("refund", &small, &alice), false);
//! assert_eq!(verdict.action, Action::ChargeBudget);
//! assert_eq!(verdict.charged(true).action, Action::Run);
//!
//! // Blocked tools, and tools the policy does not name, do not exist for the caller.
//! assert!(!policy.visible("delete_customer"));
//! assert!(!policy.visible("drop_database"));
//! let denial = policy.admit("delete_customer", &Map::new()).unwrap_err();
//! assert_eq!(denial.rule, "tools.delete_customer.tier");
//!
//! // Redaction: registered secrets exactly, and common credential shapes.
//! let redactor = Redactor::new(vec![Secret::new("shop-db-passphrase-7731")]);
//! let line = "login as shop-db-passphrase-7731 failed; Authorization: Bearer 9f8e7d6c5b4a";
//! assert_eq!(
//!     redactor.redact(line),
//!     "login as [REDACTED] failed; Authorization: Bearer [REDACTED]"
//! );
//! # Ok::<(), toolgate_core::policy::PolicyError>(())
//! ```

#![deny(missing_docs)]

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
