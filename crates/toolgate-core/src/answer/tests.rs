//! The outcome table of DESIGN.md §4, row by row: each answer's wire form, audit decision/outcome
//! and `executed`, asserted together so that no two of them can drift apart.

use serde_json::json;

use super::{
    Answer, Check, Executed, Kind, OBSERVED_MAX_CHARS, PersonRefusal, Rollback, Unverified, Wire,
};
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
    // The mutation happened (allow / committed); its `verify / stop|rollback` record is separate.
    (
        Kind::Unverified,
        Wire::ErrorResult,
        Decision::Allow,
        Outcome::Committed,
        Executed::Yes,
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

fn unverified(diverged: bool, rollback: Option<Rollback>) -> Answer<()> {
    Answer::Unverified(Unverified {
        decision: if rollback.is_some() {
            Check::Rollback
        } else {
            Check::Stop
        },
        diverged,
        why: "read_ledger shows no note req-0001".to_owned(),
        observed: json!({"notes": []}),
        expected: "result.notes.size() == 1".to_owned(),
        rollback,
    })
}

#[test]
fn an_unverified_mutation_says_it_ran_what_diverged_and_stop() {
    let stop = unverified(true, None);
    let text = stop.message("write_note").unwrap();
    assert!(
        text.starts_with("write_note ran but its postcondition did not hold"),
        "{text}"
    );
    assert!(
        text.contains("read_ledger shows no note req-0001"),
        "{text}"
    );
    assert!(text.contains("Stop: do not continue"), "{text}");
    let detail = stop.detail("p0");
    assert_eq!(detail["decision"], json!("stop"));
    assert_eq!(detail["observed"], json!({"notes": []}));
    assert_eq!(detail["expected"], json!("result.notes.size() == 1"));
    assert!(detail.get("rolled_back").is_none(), "{detail:?}");
    assert_eq!(stop.kind().executed(), Executed::Yes);
    assert_eq!(stop.kind().status(), "unverified");

    let unreadable = unverified(false, None);
    let text = unreadable.message("write_note").unwrap();
    assert!(text.contains("could not be checked"), "{text}");
    assert!(text.contains("Stop:"), "{text}");

    let undone = unverified(
        true,
        Some(Rollback {
            tool: "delete_note".to_owned(),
            done: true,
            why: "committed".to_owned(),
        }),
    );
    let text = undone.message("write_note").unwrap();
    assert!(text.contains("rolled back with delete_note"), "{text}");
    assert_eq!(undone.detail("p0")["decision"], json!("rollback"));
    assert_eq!(undone.detail("p0")["rolled_back"], json!(true));
    let failed = unverified(
        true,
        Some(Rollback {
            tool: "delete_note".to_owned(),
            done: false,
            why: "delete_note failed: not found".to_owned(),
        }),
    );
    let text = failed.message("write_note").unwrap();
    assert!(text.contains("did not succeed"), "{text}");
    assert!(text.contains("may still be there"), "{text}");
    assert_eq!(failed.detail("p0")["rolled_back"], json!(false));
    // Its handler ran: a lost record makes it in doubt, never a refusal.
    assert_eq!(failed.unrecorded("disk full").kind(), Kind::InDoubt);
}

#[test]
fn a_long_observation_is_cut_and_says_so() {
    let short = json!({"notes": [{"text": "a"}]});
    assert_eq!(Unverified::observed_capped(short.clone()), short);
    let long = json!({"text": "x".repeat(OBSERVED_MAX_CHARS * 2)});
    let capped = Unverified::observed_capped(long);
    assert_eq!(capped["truncated"], json!(true));
    assert_eq!(
        capped["head"].as_str().unwrap().chars().count(),
        OBSERVED_MAX_CHARS
    );
    assert!(capped["chars"].as_u64().unwrap() > OBSERVED_MAX_CHARS as u64);
}

#[test]
fn a_check_names_its_verify_outcome() {
    assert_eq!(Check::Continue.as_str(), "continue");
    assert_eq!(Check::Stop.outcome(), Outcome::Stop);
    assert_eq!(Check::Rollback.as_str(), "rollback");
    assert_eq!(Decision::Verify.as_str(), "verify");
}
