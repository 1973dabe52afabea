//! The outcome table of DESIGN.md §4, row by row: each answer's wire form, audit decision/outcome
//! and `executed`, asserted together so that no two of them can drift apart.

use serde_json::json;

use super::{Answer, Executed, Kind, PersonRefusal, Wire};
use crate::audit::{Decision, Outcome};
use crate::policy::Denial;

/// (kind, wire, decision, outcome, executed), as DESIGN.md §4 and the README's table say.
const TABLE: &[(Kind, Wire, Decision, Outcome, Executed)] = &[
    (
        Kind::Denied,
        Wire::RpcError(-32602),
        Decision::Deny,
        Outcome::NotExecuted,
        Executed::No,
    ),
    (
        Kind::Invalid,
        Wire::ErrorResult,
        Decision::Deny,
        Outcome::InvalidArgs,
        Executed::No,
    ),
    (
        Kind::RateLimited,
        Wire::ErrorResult,
        Decision::Deny,
        Outcome::RateLimited,
        Executed::No,
    ),
    (
        Kind::DryRun,
        Wire::ErrorResult,
        Decision::Refuse,
        Outcome::DryRun,
        Executed::No,
    ),
    (
        Kind::Pending,
        Wire::ErrorResult,
        Decision::Approval,
        Outcome::Requested,
        Executed::No,
    ),
    (
        Kind::DeniedByPerson,
        Wire::ErrorResult,
        Decision::Approval,
        Outcome::Denied,
        Executed::No,
    ),
    (
        Kind::Expired,
        Wire::ErrorResult,
        Decision::Approval,
        Outcome::Expired,
        Executed::No,
    ),
    (
        Kind::Ran,
        Wire::Result,
        Decision::Allow,
        Outcome::Committed,
        Executed::Yes,
    ),
    (
        Kind::Replay,
        Wire::Result,
        Decision::Allow,
        Outcome::Replay,
        Executed::Yes,
    ),
    (
        Kind::ToolError,
        Wire::Result,
        Decision::Allow,
        Outcome::Failed,
        Executed::Yes,
    ),
    (
        Kind::Failed,
        Wire::ErrorResult,
        Decision::Allow,
        Outcome::Failed,
        Executed::Yes,
    ),
    (
        Kind::Conflict,
        Wire::ErrorResult,
        Decision::Deny,
        Outcome::Conflict,
        Executed::No,
    ),
    (
        Kind::InDoubt,
        Wire::ErrorResult,
        Decision::Allow,
        Outcome::InDoubt,
        Executed::Unknown,
    ),
    (
        Kind::Timeout,
        Wire::ErrorResult,
        Decision::Allow,
        Outcome::Timeout,
        Executed::Unknown,
    ),
    (
        Kind::InFlight,
        Wire::ErrorResult,
        Decision::Deny,
        Outcome::NotExecuted,
        Executed::Unknown,
    ),
    (
        Kind::Cancelled,
        Wire::NoResponse,
        Decision::Allow,
        Outcome::Cancelled,
        Executed::Unknown,
    ),
    (
        Kind::NotRun,
        Wire::ErrorResult,
        Decision::Deny,
        Outcome::NotExecuted,
        Executed::No,
    ),
    (
        Kind::Rejected,
        Wire::UpstreamError,
        Decision::Allow,
        Outcome::Failed,
        Executed::Yes,
    ),
    (
        Kind::InputRequired,
        Wire::Result,
        Decision::Allow,
        Outcome::InputRequired,
        Executed::No,
    ),
    (
        Kind::Task,
        Wire::Result,
        Decision::Allow,
        Outcome::InDoubt,
        Executed::Unknown,
    ),
];

#[test]
fn every_kind_has_one_row_and_keeps_it() {
    assert_eq!(TABLE.len(), Kind::ALL.len());
    for kind in Kind::ALL {
        let rows: Vec<_> = TABLE.iter().filter(|row| row.0 == kind).collect();
        assert_eq!(rows.len(), 1, "{kind:?} must have exactly one row");
        let (_, wire, decision, outcome, executed) = *rows[0];
        assert_eq!(kind.wire(), wire, "{kind:?} wire");
        assert_eq!(kind.audit(), (decision, outcome), "{kind:?} audit");
        assert_eq!(kind.executed(), executed, "{kind:?} executed");
        assert!(!kind.describe().is_empty());
    }
}

#[test]
fn nothing_that_may_have_run_says_not_executed() {
    for kind in [
        Kind::Timeout,
        Kind::InDoubt,
        Kind::Cancelled,
        Kind::InFlight,
        Kind::Task,
    ] {
        assert_eq!(kind.executed(), Executed::Unknown, "{kind:?}");
    }
    for kind in [Kind::Ran, Kind::ToolError, Kind::Failed] {
        assert_eq!(kind.executed(), Executed::Yes, "{kind:?}");
    }
    assert_eq!(Executed::Unknown.to_json(), json!("unknown"));
    assert_eq!(Executed::No.to_json(), json!(false));
    assert_eq!(Executed::Yes.to_json(), json!(true));
}

#[test]
fn a_timeout_reads_as_in_doubt_not_as_a_refusal() {
    let answer: Answer<()> = Answer::Timeout { after_ms: 250 };
    let text = answer.message("pay").unwrap();
    assert!(
        text.contains("outcome unknown: verify before retrying"),
        "{text}"
    );
}

#[test]
fn a_lost_record_turns_what_ran_into_doubt_and_leaves_refusals_alone() {
    let ran: Answer<u8> = Answer::Ran(7);
    assert_eq!(ran.unrecorded("disk full").kind(), Kind::InDoubt);
    let replay: Answer<u8> = Answer::Replay(7);
    assert_eq!(replay.unrecorded("disk full").kind(), Kind::InDoubt);
    let task: Answer<u8> = Answer::Task {
        task: json!({"taskId": "t1"}),
        replay: false,
    };
    assert_eq!(task.unrecorded("disk full").kind(), Kind::InDoubt);
    let timeout: Answer<u8> = Answer::Timeout { after_ms: 5 };
    assert_eq!(timeout.unrecorded("disk full").kind(), Kind::InDoubt);
    let denied: Answer<u8> = Answer::Denied {
        denial: Denial {
            tool: "rm_rf".to_owned(),
            rule: "deny".to_owned(),
        },
        visible: false,
    };
    assert_eq!(denied.unrecorded("disk full").kind(), Kind::Denied);
    let refused: Answer<u8> = Answer::RefusedByPerson(PersonRefusal {
        approval_id: "a1".to_owned(),
        expired: true,
        decided_by: None,
        reason: None,
        policy_sha256: String::new(),
    });
    assert_eq!(refused.unrecorded("disk full").kind(), Kind::Expired);
    assert_eq!(
        Answer::<u8>::Cancelled.unrecorded("x").kind(),
        Kind::Cancelled
    );
}

#[test]
fn a_hidden_tool_never_names_its_rule() {
    let denial = Denial {
        tool: "delete_customer".to_owned(),
        rule: "tools.delete_customer.tier".to_owned(),
    };
    let hidden: Answer<()> = Answer::Denied {
        denial: denial.clone(),
        visible: false,
    };
    assert_eq!(
        hidden.message("delete_customer").unwrap(),
        "tool denied: delete_customer"
    );
    assert_eq!(hidden.detail("h")["rule"], json!("visibility"));
    let shown: Answer<()> = Answer::Denied {
        denial,
        visible: true,
    };
    assert!(
        shown
            .message("delete_customer")
            .unwrap()
            .contains("tools.delete_customer.tier")
    );
}
