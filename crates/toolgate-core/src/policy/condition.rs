//! Escalation conditions: CEL expressions over `args`, `principal` and `tool` (DESIGN.md §3).
//!
//! Compiled once at load. At load time each condition is also tried against the tool's schema: an
//! argument the tool does not have, or a comparison no value of the declared types can make, is a
//! load error. At call time a condition that cannot be evaluated (an optional argument left out, a
//! value of an unexpected shape) counts as *matched*: escalation only raises a tier, so an
//! undecidable condition fails towards more scrutiny, never less.

use std::collections::{BTreeMap, BTreeSet};

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use std::sync::{Arc, OnceLock};

use cel::{Context, Env, ExecutionError, Program, Value as CelValue};
use serde_json::{Map, Value, json};

use super::ConditionError;
use crate::principal::Principal;

/// A compiled `when`.
#[derive(Debug)]
pub struct Condition {
    source: String,
    program: Program,
    /// Top-level argument names the expression reads (`args.NAME` or `args["NAME"]`).
    args: BTreeSet<String>,
    /// Whether it reads `principal` / `tool` at all: what it does not read is not converted.
    uses_principal: bool,
    uses_tool: bool,
}

impl Condition {
    /// Compiles `source`.
    ///
    /// # Errors
    /// The expression does not compile.
    pub fn compile(source: &str) -> Result<Self, ConditionError> {
        let program = Program::compile(source).map_err(ConditionError::Syntax)?;
        let mut args = BTreeSet::new();
        collect_args(program.expression(), &mut args);
        let references = program.references();
        let uses_principal = references.has_variable("principal");
        let uses_tool = references.has_variable("tool");
        Ok(Self {
            source: source.to_owned(),
            program,
            args,
            uses_principal,
            uses_tool,
        })
    }

    /// The expression as written in the policy file.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The arguments the expression reads.
    #[must_use]
    pub fn arguments(&self) -> &BTreeSet<String> {
        &self.args
    }

    /// Evaluates against a call. `Err` carries why it could not be decided.
    ///
    /// # Errors
    /// Evaluation failed or did not give a boolean.
    pub fn eval(
        &self,
        args: &Map<String, Value>,
        principal: &Principal,
        tool: &str,
    ) -> Result<bool, ConditionError> {
        let principal = if self.uses_principal {
            json!({"sub": principal.sub, "scopes": principal.scopes})
        } else {
            Value::Null
        };
        // Only the arguments the expression reads are converted: a call's other arguments (a
        // long note, a document) cost nothing here.
        let read: Map<String, Value> = args
            .iter()
            .filter(|(k, _)| self.args.contains(*k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        self.eval_json(&Value::Object(read), &principal, tool)
    }

    fn eval_json(
        &self,
        args: &Value,
        principal: &Value,
        tool: &str,
    ) -> Result<bool, ConditionError> {
        let mut context = Context::with_env(env());
        let convert = |variable, value: &Value| {
            cel::to_value(value).map_err(|error| ConditionError::Convert { variable, error })
        };
        context.add_variable_from_value("args", convert("args", args)?);
        if self.uses_principal {
            context.add_variable_from_value("principal", convert("principal", principal)?);
        }
        if self.uses_tool {
            context.add_variable_from_value("tool", CelValue::from(tool.to_owned()));
        }
        match self.program.execute(&context) {
            Ok(CelValue::Bool(matched)) => Ok(matched),
            Ok(other) => Err(ConditionError::NotBoolean {
                value: format!("{other:?}"),
            }),
            Err(ExecutionError::NoSuchKey(key)) => Err(ConditionError::MissingArgument {
                name: key.to_string(),
            }),
            Err(error) => Err(ConditionError::Evaluation(Box::new(error))),
        }
    }

    /// Load-time check against the tool's declared argument types (`properties`: name → JSON Schema
    /// type names; an empty list means any type).
    ///
    /// # Errors
    /// Names an argument the tool does not have, never yields a boolean, or fails for every value
    /// of the declared types.
    pub fn check(
        &self,
        tool: &str,
        properties: &BTreeMap<String, Vec<String>>,
    ) -> Result<(), ConditionError> {
        if let Some(missing) = self.args.iter().find(|a| !properties.contains_key(*a)) {
            return Err(ConditionError::UnknownArgument {
                arg: missing.clone(),
                tool: tool.to_owned(),
            });
        }
        // Try every combination of sample values of the declared types (bounded): if none can be
        // evaluated to a boolean, the condition can never be true for real calls either.
        let mut combos: Vec<Map<String, Value>> = vec![Map::new()];
        for arg in &self.args {
            let samples = samples(&properties[arg]);
            combos = combos
                .iter()
                .flat_map(|base| {
                    samples.iter().map(move |s| {
                        let mut next = base.clone();
                        next.insert(arg.clone(), s.clone());
                        next
                    })
                })
                .take(256)
                .collect();
        }
        let principal = json!({"sub": "", "scopes": []});
        let mut last = None;
        for args in combos {
            match self.eval_json(&Value::Object(args), &principal, tool) {
                Ok(_) => return Ok(()),
                Err(why) => last = Some(why),
            }
        }
        // `combos` always holds at least the empty combination, so `last` is set here.
        last.map_or(Ok(()), |last| {
            Err(ConditionError::NeverEvaluates {
                last: Box::new(last),
            })
        })
    }
}

/// CEL's standard environment, built once: building it per call cost ~50 µs.
pub(super) fn env() -> Arc<Env> {
    static ENV: OnceLock<Arc<Env>> = OnceLock::new();
    Arc::clone(ENV.get_or_init(|| Arc::new(Env::stdlib())))
}

/// Representative values of JSON Schema types, chosen to satisfy the usual comparisons both ways.
fn samples(types: &[String]) -> Vec<Value> {
    let all = [
        "string", "number", "integer", "boolean", "array", "object", "null",
    ];
    let types: Vec<&str> = if types.is_empty() {
        all.to_vec()
    } else {
        types.iter().map(String::as_str).collect()
    };
    types
        .into_iter()
        .flat_map(|t| match t {
            "string" => vec![json!(""), json!("x@example.com")],
            "number" => vec![json!(0.5), json!(1_000_000.5)],
            "integer" => vec![json!(0), json!(1_000_000)],
            "boolean" => vec![json!(false), json!(true)],
            "array" => vec![json!([])],
            "object" => vec![json!({})],
            _ => vec![Value::Null],
        })
        .collect()
}

/// Collects `args.NAME` and `args["NAME"]` references anywhere in the expression.
pub(super) fn collect_args(node: &IdedExpr, out: &mut BTreeSet<String>) {
    match &node.expr {
        Expr::Select(select) => {
            if matches!(&select.operand.expr, Expr::Ident(root) if root == "args") {
                out.insert(select.field.clone());
            }
            collect_args(&select.operand, out);
        }
        Expr::Call(call) => {
            if call.func_name == "_[_]"
                && let [target, index] = call.args.as_slice()
                && matches!(&target.expr, Expr::Ident(root) if root == "args")
                && let Expr::Literal(cel::common::ast::LiteralValue::String(key)) = &index.expr
            {
                out.insert(key.to_string());
            }
            if let Some(target) = &call.target {
                collect_args(target, out);
            }
            call.args.iter().for_each(|a| collect_args(a, out));
        }
        Expr::Comprehension(c) => {
            for part in [
                &c.iter_range,
                &c.accu_init,
                &c.loop_cond,
                &c.loop_step,
                &c.result,
            ] {
                collect_args(part, out);
            }
        }
        Expr::List(list) => list.elements.iter().for_each(|e| collect_args(e, out)),
        Expr::Map(map) => {
            for entry in &map.entries {
                if let EntryExpr::MapEntry(e) = &entry.expr {
                    collect_args(&e.key, out);
                    collect_args(&e.value, out);
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &s.entries {
                if let EntryExpr::StructField(f) = &entry.expr {
                    collect_args(&f.value, out);
                }
            }
        }
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
}
