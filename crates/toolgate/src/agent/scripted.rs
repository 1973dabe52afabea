//! The scripted model (seed 003's `ScriptedModel`): replays a fixed plan of tool calls, then
//! summarises what became of them. For demos and tests: it needs no API key and no network, and a
//! run driven by it is reproducible.
//!
//! A plan is a JSON file: `{"steps": [STEP, …], "final": "optional answer"}`, where a step is one
//! call `{"name": "refund", "arguments": {"order_id": "ord_1001", "amount": 10}}` or an array of
//! calls made in one message. `arguments` may also be a string: the raw text a model sent, which
//! is read as a real model's would be (so a plan can send invalid JSON).
//!
//! The model is a function of the conversation, as [`Model`] requires: the next step is the plan's
//! entry at the number of assistant turns so far, so a resumed run asks again and gets the step it
//! would have had.

use std::path::Path;

use serde::Deserialize;
use serde_json::{Map, Value};

use super::model::{
    Action, Arguments, Message, Model, ModelError, ModelFuture, ToolCall, ToolSpec,
};

/// A model that replays a plan.
#[derive(Clone, Debug)]
pub struct Scripted {
    steps: Vec<Vec<PlannedCall>>,
    last: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Plan {
    steps: Vec<Step>,
    #[serde(rename = "final")]
    last: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Step {
    One(PlannedCall),
    Several(Vec<PlannedCall>),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlannedCall {
    name: String,
    #[serde(default)]
    arguments: PlannedArguments,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum PlannedArguments {
    Object(Map<String, Value>),
    Raw(String),
}

impl Default for PlannedArguments {
    fn default() -> Self {
        Self::Object(Map::new())
    }
}

impl Scripted {
    /// The plan in `text` (JSON, as described in the module documentation).
    ///
    /// # Errors
    /// [`ModelError::Plan`]: not a plan, or a step with no call.
    pub fn from_json(text: &str) -> Result<Self, ModelError> {
        let plan: Plan =
            serde_json::from_str(text).map_err(|e| ModelError::Plan(format!("not a plan: {e}")))?;
        let steps = plan
            .steps
            .into_iter()
            .enumerate()
            .map(|(i, step)| match step {
                Step::One(call) => Ok(vec![call]),
                Step::Several(calls) if !calls.is_empty() => Ok(calls),
                Step::Several(_) => Err(ModelError::Plan(format!("step {} has no call", i + 1))),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            steps,
            last: plan.last,
        })
    }

    /// The plan in the file at `path`.
    ///
    /// # Errors
    /// [`ModelError::Plan`]: the file cannot be read or is not a plan.
    pub fn from_file(path: &Path) -> Result<Self, ModelError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ModelError::Plan(format!("cannot read {}: {e}", path.display())))?;
        Self::from_json(&text)
    }

    fn step(&self, messages: &[Message]) -> Action {
        let taken = messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant { .. }))
            .count();
        let Some(calls) = self.steps.get(taken) else {
            return Action::Final(self.last.clone().unwrap_or_else(|| summary(messages)));
        };
        let calls = calls
            .iter()
            .enumerate()
            .map(|(i, call)| ToolCall {
                id: format!("call_{}_{}", taken + 1, i + 1),
                name: call.name.clone(),
                arguments: match &call.arguments {
                    PlannedArguments::Object(map) => Arguments::from(map.clone()),
                    PlannedArguments::Raw(raw) => Arguments::parse(raw),
                },
            })
            .collect();
        Action::Call {
            content: None,
            calls,
        }
    }
}

impl Model for Scripted {
    fn next<'a>(&'a self, messages: &'a [Message], _tools: &'a [ToolSpec]) -> ModelFuture<'a> {
        let action = self.step(messages);
        Box::pin(std::future::ready(Ok(action)))
    }
}

/// The seed's closing line: "Done. Results: " and, per call, the tool and its outcome (the
/// result's `status` or text) or why it was not done.
fn summary(messages: &[Message]) -> String {
    let names: std::collections::HashMap<&str, &str> = messages
        .iter()
        .flat_map(|m| match m {
            Message::Assistant { tool_calls, .. } => tool_calls.as_slice(),
            _ => &[],
        })
        .map(|call| (call.id.as_str(), call.name.as_str()))
        .collect();
    let results: Vec<String> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool {
                tool_call_id,
                content,
            } => {
                let tool = names.get(tool_call_id.as_str()).copied().unwrap_or("?");
                Some(format!("{tool}: {}", describe(content)))
            }
            _ => None,
        })
        .collect();
    format!("Done. Results: {}", results.join("; "))
}

fn describe(content: &Value) -> String {
    if content.get("ran") == Some(&Value::Bool(true)) && content.get("error").is_none() {
        let output = content.get("output").cloned().unwrap_or(Value::Null);
        return match output {
            Value::String(text) => text,
            Value::Object(map) if map.get("status").is_some_and(Value::is_string) => {
                map["status"].as_str().unwrap_or_default().to_owned()
            }
            other => other.to_string(),
        };
    }
    let why = content
        .get("approval")
        .or_else(|| content.get("error"))
        .and_then(Value::as_str)
        .unwrap_or("no reason given");
    format!("not done ({why})")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn plan() -> Scripted {
        Scripted::from_json(
            r#"{"steps": [
                {"name": "lookup_order", "arguments": {"order_id": "ord_1001"}},
                [{"name": "refund", "arguments": {"order_id": "ord_1001", "amount": 10}},
                 {"name": "refund", "arguments": "{\"order_id\": \"ord_1001\", \"amount\": 49"}]
            ]}"#,
        )
        .unwrap()
    }

    #[test]
    fn the_step_follows_from_the_conversation_not_from_a_cursor() {
        let model = plan();
        let user = Message::User {
            content: "refund".into(),
        };
        let first = model.step(std::slice::from_ref(&user));
        assert_eq!(
            first,
            model.step(std::slice::from_ref(&user)),
            "asked twice, same step"
        );
        let Action::Call { calls, .. } = first else {
            panic!("a call")
        };
        assert_eq!(calls[0].name, "lookup_order");
        let turn = Message::Assistant {
            content: None,
            tool_calls: calls,
        };
        let Action::Call { calls, .. } = model.step(&[user.clone(), turn.clone()]) else {
            panic!("two calls")
        };
        assert_eq!(calls.len(), 2);
        assert!(matches!(calls[1].arguments, Arguments::Unparsed { .. }));
        let done = model.step(&[user, turn.clone(), turn]);
        assert!(matches!(done, Action::Final(text) if text.starts_with("Done. Results:")));
    }

    #[test]
    fn the_summary_says_what_ran_and_why_the_rest_did_not() {
        let call = |id: &str, name: &str| ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: Arguments::from(Map::new()),
        };
        let messages = [
            Message::Assistant {
                content: None,
                tool_calls: vec![
                    call("a", "refund"),
                    call("b", "refund"),
                    call("c", "delete_customer"),
                ],
            },
            Message::Tool {
                tool_call_id: "a".into(),
                content: json!({"ran": true, "output": {"status": "refunded", "amount": 10.0}}),
            },
            Message::Tool {
                tool_call_id: "b".into(),
                content: json!({"ran": false, "approval": "expired"}),
            },
            Message::Tool {
                tool_call_id: "c".into(),
                content: json!({"ran": false, "error": "tool denied: delete_customer"}),
            },
        ];
        assert_eq!(
            summary(&messages),
            "Done. Results: refund: refunded; refund: not done (expired); delete_customer: not done (tool denied: delete_customer)"
        );
    }

    #[test]
    fn a_plan_that_is_not_one_is_refused_with_the_reason() {
        for bad in [r#"{"steps": [[]]}"#, r#"{"step": []}"#, "not json"] {
            assert!(
                matches!(Scripted::from_json(bad), Err(ModelError::Plan(_))),
                "{bad}"
            );
        }
    }
}
