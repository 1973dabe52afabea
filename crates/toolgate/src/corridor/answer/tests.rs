//! Every [`Answer`] on the wire, asserted with its audit decision/outcome and `executed` in one
//! row, against DESIGN.md §4 and the README's table: one table, so the three can never disagree.

use rmcp::model::{CallToolResponse, CallToolResult, ContentBlock};
use serde_json::{Value, json};
use toolgate_core::answer::{Check, Pending, PersonRefusal, Rollback, Unverified};
use toolgate_core::audit::{Decision, Outcome};
use toolgate_core::policy::Denial;

use super::{Answer, EXECUTED_META, Kind, to_wire};

/// What a client sees: a JSON-RPC error code, an `isError` result with its `executed`, a plain
/// result, or nothing.
#[derive(Debug, PartialEq)]
enum Seen {
    RpcError(i32),
    ErrorResult(Value),
    Result,
    InputRequired,
    Task,
    Nothing,
}

fn seen(answer: Answer<CallToolResult>) -> (Seen, Option<CallToolResult>) {
    match to_wire(answer, "pay", "p0") {
        Err(error) if error.code.0 == -32603 => (Seen::Nothing, None),
        Err(error) => (Seen::RpcError(error.code.0), None),
        Ok(CallToolResponse::InputRequired(_)) => (Seen::InputRequired, None),
        Ok(CallToolResponse::Task(_)) => (Seen::Task, None),
        Ok(CallToolResponse::Complete(result)) if result.is_error == Some(true) => {
            let structured = result.structured_content.clone().unwrap_or_default();
            let meta = result.meta.clone().unwrap_or_default();
            assert_eq!(
                meta.0.get(EXECUTED_META),
                structured.get("executed"),
                "_meta and structured content agree on executed"
            );
            (
                Seen::ErrorResult(structured["executed"].clone()),
                Some(result),
            )
        }
        Ok(CallToolResponse::Complete(result)) => (Seen::Result, Some(result)),
        Ok(other) => panic!("not a response the corridor makes: {other:?}"),
    }
}

/// The result of a wire form that must be a complete result.
fn complete(wire: Result<CallToolResponse, rmcp::ErrorData>) -> CallToolResult {
    match wire {
        Ok(CallToolResponse::Complete(result)) => result,
        other => panic!("a complete result, got {other:?}"),
    }
}

fn ok() -> CallToolResult {
    CallToolResult::structured(json!({"paid": 49}))
}

fn tool_said_no() -> CallToolResult {
    let mut result = CallToolResult::structured_error(json!({"error": "card declined"}));
    result.content = vec![ContentBlock::text("card declined")];
    result
}

fn every_answer() -> Vec<Answer<CallToolResult>> {
    let denial = Denial {
        tool: "pay".to_owned(),
        rule: "tools.pay.args.amount.max_len".to_owned(),
    };
    let refusal = |expired| {
        Answer::RefusedByPerson(PersonRefusal {
            approval_id: "a-1".to_owned(),
            expired,
            decided_by: (!expired).then(|| "human:dana".to_owned()),
            reason: None,
            policy_sha256: "p0".to_owned(),
        })
    };
    vec![
        Answer::Denied {
            denial,
            visible: true,
        },
        Answer::Invalid {
            rule: "schema".to_owned(),
            reason: "invalid arguments for pay: amount: not a number".to_owned(),
        },
        Answer::RateLimited { retry_after_s: 2 },
        Answer::DryRun {
            rule: "tools.pay.gated".to_owned(),
            gate_env: "SHOP_ALLOW_GATED".to_owned(),
            preview: json!({"would": "pay 49", "reversible": false}),
            tool_description: Some("Pay an invoice.".to_owned()),
            arguments: json!({"amount": 49}),
        },
        Answer::Pending(Pending {
            approval_id: "a-1".to_owned(),
            expires_at_ms: 0,
            tier: "high".to_owned(),
            reason: "the tool is high risk".to_owned(),
            policy_sha256: "p0".to_owned(),
        }),
        refusal(false),
        refusal(true),
        Answer::Ran(ok()),
        Answer::Replay(ok()),
        Answer::ToolError(tool_said_no()),
        Answer::Failed {
            reason: "pay failed: upstream said no".to_owned(),
        },
        Answer::Conflict {
            key: "k1".to_owned(),
            rule: "tools.pay.idempotency_key".to_owned(),
        },
        Answer::InDoubt {
            why: "the upstream died mid-call".to_owned(),
        },
        Answer::Timeout { after_ms: 250 },
        Answer::InFlight {
            key: "k1".to_owned(),
        },
        Answer::Cancelled,
        Answer::NotRun {
            rule: "approvals_unavailable".to_owned(),
            why: "no queue".to_owned(),
        },
        Answer::Rejected {
            code: -32021,
            message: "the client lacks elicitation".to_owned(),
            data: Some(json!({"requiredCapabilities": {"elicitation": {}}})),
        },
        Answer::InputRequired(json!({
            "resultType": "input_required",
            "inputRequests": {"confirm": {"method": "roots/list", "params": {}}},
            "requestState": "s1",
        })),
        Answer::Task {
            task: json!({
                "resultType": "task", "taskId": "t-1", "status": "working",
                "createdAt": "2026-08-01T00:00:00Z", "lastUpdatedAt": "2026-08-01T00:00:00Z",
                "ttlMs": 60000,
            }),
            replay: false,
        },
        Answer::Unverified(Unverified {
            decision: Check::Rollback,
            diverged: true,
            why: "read_invoice shows a state where `result.paid == 49` is false".to_owned(),
            observed: json!({"paid": 0}),
            expected: "result.paid == 49".to_owned(),
            rollback: Some(Rollback {
                tool: "refund".to_owned(),
                done: true,
                why: "it ran and reported success".to_owned(),
            }),
        }),
    ]
}

/// (kind, what the client sees, audit decision, audit outcome): DESIGN.md §4, one row each.
fn table() -> Vec<(Kind, Seen, Decision, Outcome)> {
    let error = |executed: Value| Seen::ErrorResult(executed);
    vec![
        (
            Kind::Denied,
            Seen::RpcError(-32602),
            Decision::Deny,
            Outcome::NotExecuted,
        ),
        (
            Kind::Invalid,
            error(json!(false)),
            Decision::Deny,
            Outcome::InvalidArgs,
        ),
        (
            Kind::RateLimited,
            error(json!(false)),
            Decision::Deny,
            Outcome::RateLimited,
        ),
        (
            Kind::DryRun,
            error(json!(false)),
            Decision::Refuse,
            Outcome::DryRun,
        ),
        (
            Kind::Pending,
            error(json!(false)),
            Decision::Approval,
            Outcome::Requested,
        ),
        (
            Kind::DeniedByPerson,
            error(json!(false)),
            Decision::Approval,
            Outcome::Denied,
        ),
        (
            Kind::Expired,
            error(json!(false)),
            Decision::Approval,
            Outcome::Expired,
        ),
        (Kind::Ran, Seen::Result, Decision::Allow, Outcome::Committed),
        (Kind::Replay, Seen::Result, Decision::Allow, Outcome::Replay),
        // The tool's own error passes as it was, marked as having run.
        (
            Kind::ToolError,
            error(json!(true)),
            Decision::Allow,
            Outcome::Failed,
        ),
        (
            Kind::Failed,
            error(json!(true)),
            Decision::Allow,
            Outcome::Failed,
        ),
        (
            Kind::Conflict,
            error(json!(false)),
            Decision::Deny,
            Outcome::Conflict,
        ),
        (
            Kind::InDoubt,
            error(json!("unknown")),
            Decision::Allow,
            Outcome::InDoubt,
        ),
        (
            Kind::Timeout,
            error(json!("unknown")),
            Decision::Allow,
            Outcome::Timeout,
        ),
        (
            Kind::InFlight,
            error(json!("unknown")),
            Decision::Deny,
            Outcome::NotExecuted,
        ),
        (
            Kind::Cancelled,
            Seen::Nothing,
            Decision::Allow,
            Outcome::Cancelled,
        ),
        (
            Kind::NotRun,
            error(json!(false)),
            Decision::Deny,
            Outcome::NotExecuted,
        ),
        (
            Kind::Rejected,
            Seen::RpcError(-32021),
            Decision::Allow,
            Outcome::Failed,
        ),
        (
            Kind::InputRequired,
            Seen::InputRequired,
            Decision::Allow,
            Outcome::InputRequired,
        ),
        (Kind::Task, Seen::Task, Decision::Allow, Outcome::InDoubt),
        // It ran: its own record says committed; the `verify / rollback` record is the step's.
        (
            Kind::Unverified,
            error(json!(true)),
            Decision::Allow,
            Outcome::Committed,
        ),
    ]
}

#[test]
fn every_answer_has_one_wire_form_audit_and_executed() {
    let table = table();
    let answers = every_answer();
    assert_eq!(answers.len(), Kind::ALL.len(), "one answer per kind");
    for answer in answers {
        let kind = answer.kind();
        let row = table
            .iter()
            .find(|row| row.0 == kind)
            .unwrap_or_else(|| panic!("{kind:?} has a row"));
        let (seen, result) = seen(answer);
        assert_eq!(seen, row.1, "{kind:?} on the wire");
        assert_eq!(kind.audit(), (row.2, row.3), "{kind:?} audit");
        if let (Seen::ErrorResult(executed), Some(result)) = (&seen, &result) {
            assert_eq!(*executed, kind.executed().to_json(), "{kind:?} executed");
            let text = match &result.content[0] {
                ContentBlock::Text(text) => text.text.clone(),
                other => panic!("{kind:?}: text first, got {other:?}"),
            };
            assert!(!text.is_empty(), "{kind:?} says why in words");
        }
    }
}

#[test]
fn what_may_have_happened_is_never_answered_as_not_executed() {
    for answer in [
        Answer::Timeout { after_ms: 250 },
        Answer::InDoubt {
            why: "its audit record could not be written".to_owned(),
        },
        Answer::Ran(ok()).unrecorded("the audit log is unavailable"),
    ] {
        let result = complete(to_wire(answer, "pay", "p0"));
        let structured = result.structured_content.expect("structured");
        assert_eq!(structured["executed"], json!("unknown"));
        assert!(
            [json!("in_doubt"), json!("timeout")].contains(&structured["status"]),
            "{structured}"
        );
        let text = serde_json::to_string(&result.content).unwrap();
        assert!(
            text.contains("outcome unknown: verify before retrying"),
            "{text}"
        );
    }
}

#[test]
fn a_replay_is_the_stored_result_marked_replay() {
    let result = complete(to_wire(Answer::Replay(ok()), "pay", "p0"));
    assert_eq!(result.structured_content, Some(json!({"paid": 49})));
    let meta = result.meta.expect("meta");
    assert_eq!(meta.0["io.toolgate/status"], json!("replay"));
}

#[test]
fn a_tool_that_said_what_happened_keeps_its_word() {
    let mut result =
        CallToolResult::structured_error(json!({"error": "half done", "executed": "unknown"}));
    result.content = vec![ContentBlock::text("half done")];
    let wire = complete(to_wire(Answer::ToolError(result), "pay", "p0"));
    assert_eq!(
        wire.structured_content.unwrap()["executed"],
        json!("unknown")
    );
}

#[test]
fn an_unverified_call_is_an_error_that_ran_and_says_stop_with_observed_and_expected() {
    let answer = every_answer()
        .into_iter()
        .find(|a| a.kind() == Kind::Unverified)
        .expect("one");
    let result = complete(to_wire(answer, "pay", "p0"));
    assert_eq!(result.is_error, Some(true));
    let structured = result.structured_content.clone().expect("structured");
    assert_eq!(structured["executed"], json!(true));
    assert_eq!(structured["status"], json!("unverified"));
    assert_eq!(structured["decision"], json!("rollback"));
    assert_eq!(structured["rolled_back"], json!(true));
    assert_eq!(structured["observed"], json!({"paid": 0}));
    assert_eq!(structured["expected"], json!("result.paid == 49"));
    let ContentBlock::Text(text) = &result.content[0] else {
        panic!("text first: {result:?}");
    };
    assert!(
        text.text
            .starts_with("pay ran but its postcondition did not hold"),
        "{}",
        text.text
    );
    assert!(text.text.contains("Stop: do not continue"), "{}", text.text);
}
