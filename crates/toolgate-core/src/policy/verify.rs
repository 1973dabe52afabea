//! Postconditions (seed 000's execute-verify-stop; DESIGN.md §1 step 8, §3): for a tool that
//! changes things, the read that shows what really remained, the condition that read must meet,
//! and the compensating call to make when it does not.
//!
//! This module owns the rule and its expressions, nothing of the call: the corridor makes the read
//! and the compensating call through the gate, each a call of its own, and asks here only to build
//! their arguments and to judge the read's result.
//!
//! Design decision: every expression is checked at load for the variables it reads (an argument
//! expression sees `args`, the condition `args` and `result`), and against the served tools'
//! argument names at start, so a typo such as `reslt.notes` is a start-up error rather than a
//! postcondition that can never be evaluated and stops every call. What cannot be known before a
//! call (a field the read's result lacks, an optional argument left out) is decided at call time
//! and fails towards STOP: a postcondition that cannot be decided never lets the caller go on.

use std::collections::{BTreeMap, BTreeSet};

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use cel::{Context, Program, Value as CelValue};
use serde::Serialize;
use serde_json::{Map, Value};

use super::condition::{collect_args, env};
use super::raw::RawVerify;
use super::{ConditionError, PolicyError, Tier, ToolRule, invalid};

/// What an argument expression may read.
const ARGUMENT_VARIABLES: (&[&str], &str) = (&["args"], "`args`");

/// What the condition may read.
const EXPECT_VARIABLES: (&[&str], &str) = (&["args", "result"], "`args` and `result`");

/// A compiled CEL expression of a postcondition: an argument of the read or of the compensating
/// call (any JSON value, over `args`), or the condition (a boolean, over `args` and `result`).
#[derive(Debug)]
pub struct Expression {
    source: String,
    program: Program,
    /// Top-level arguments of the verified call it reads (`args.NAME`, `args["NAME"]`).
    args: BTreeSet<String>,
}

impl Expression {
    /// Compiles `source`, which may read only the variables named in `allowed`.
    fn compile(source: &str, allowed: (&[&str], &'static str)) -> Result<Self, ConditionError> {
        let program = Program::compile(source).map_err(ConditionError::Syntax)?;
        let mut free = BTreeSet::new();
        free_variables(program.expression(), &mut Vec::new(), &mut free);
        if let Some(name) = free.into_iter().find(|v| !allowed.0.contains(&v.as_str())) {
            return Err(ConditionError::UnknownVariable {
                name,
                allowed: allowed.1,
            });
        }
        let mut args = BTreeSet::new();
        collect_args(program.expression(), &mut args);
        Ok(Self {
            source: source.to_owned(),
            program,
            args,
        })
    }

    /// The expression as written in the policy file.
    #[must_use]
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The arguments of the verified call it reads.
    #[must_use]
    pub fn arguments(&self) -> &BTreeSet<String> {
        &self.args
    }

    /// The value of an argument expression for a call with `args`.
    ///
    /// # Errors
    /// It could not be evaluated, or its value has no JSON form.
    pub fn value(&self, args: &Map<String, Value>) -> Result<Value, ConditionError> {
        let value = self.evaluate(args, None::<&Value>)?;
        to_json(&value).ok_or_else(|| ConditionError::NotJson {
            value: format!("{value:?}"),
        })
    }

    /// Whether the condition holds for a call with `args` whose read gave `result`.
    ///
    /// # Errors
    /// It could not be evaluated (a field `result` lacks, a comparison of the wrong types), or it
    /// is not a boolean.
    pub fn holds(&self, args: &Map<String, Value>, result: &Value) -> Result<bool, ConditionError> {
        match self.evaluate(args, Some(result))? {
            CelValue::Bool(holds) => Ok(holds),
            other => Err(ConditionError::NotBoolean {
                value: format!("{other:?}"),
            }),
        }
    }

    fn evaluate(
        &self,
        args: &Map<String, Value>,
        result: Option<impl Serialize>,
    ) -> Result<CelValue, ConditionError> {
        let mut context = Context::with_env(env());
        let args = cel::to_value(args).map_err(|error| ConditionError::Convert {
            variable: "args",
            error,
        })?;
        context.add_variable_from_value("args", args);
        if let Some(result) = result {
            let result = cel::to_value(result).map_err(|error| ConditionError::Convert {
                variable: "result",
                error,
            })?;
            context.add_variable_from_value("result", result);
        }
        self.program
            .execute(&context)
            .map_err(|error| ConditionError::Evaluation(Box::new(error)))
    }
}

/// `[tools.NAME.verify]`: after a call to the tool succeeds, the gate calls `read` (through the
/// corridor, as the same caller) and judges its result with `expect`. CONTINUE when it holds;
/// otherwise ROLLBACK when `rollback` is set, else STOP.
#[derive(Debug)]
pub struct Postcondition {
    /// The tool that reads the state back.
    pub read: String,
    /// The read's arguments, each an expression over the verified call's `args`.
    pub args: BTreeMap<String, Expression>,
    /// The condition, over `args` and `result` (the read's structured content, or its text when
    /// that is JSON).
    pub expect: Expression,
    /// The compensating call for a postcondition that does not hold, if the policy names one.
    pub rollback: Option<Compensation>,
}

/// A compensating call: the tool that undoes a mutation, and its arguments.
#[derive(Debug)]
pub struct Compensation {
    /// The compensating tool, called through the gate as the same caller.
    pub tool: String,
    /// Its arguments, each an expression over the verified call's `args`.
    pub args: BTreeMap<String, Expression>,
}

impl Postcondition {
    /// The read's arguments for a call with `args`.
    ///
    /// # Errors
    /// [`ConditionError::Argument`]: the first argument whose expression gave no value.
    pub fn read_arguments(
        &self,
        args: &Map<String, Value>,
    ) -> Result<Map<String, Value>, ConditionError> {
        build(&self.args, args)
    }

    /// Every expression of the rule, with the field it is written at (below `verify.`).
    fn expressions(&self) -> impl Iterator<Item = (String, &Expression)> {
        let read = self.args.iter().map(|(n, e)| (format!("args.{n}"), e));
        let expect = std::iter::once(("expect".to_owned(), &self.expect));
        let rollback = self.rollback.iter().flat_map(|r| {
            r.args
                .iter()
                .map(|(n, e)| (format!("rollback_args.{n}"), e))
        });
        read.chain(expect).chain(rollback)
    }
}

impl Compensation {
    /// The compensating call's arguments for a call with `args`.
    ///
    /// # Errors
    /// [`ConditionError::Argument`]: the first argument whose expression gave no value.
    pub fn arguments(
        &self,
        args: &Map<String, Value>,
    ) -> Result<Map<String, Value>, ConditionError> {
        build(&self.args, args)
    }
}

fn build(
    expressions: &BTreeMap<String, Expression>,
    args: &Map<String, Value>,
) -> Result<Map<String, Value>, ConditionError> {
    expressions
        .iter()
        .map(|(name, expression)| {
            let value = expression
                .value(args)
                .map_err(|detail| ConditionError::Argument {
                    name: name.clone(),
                    detail: Box::new(detail),
                })?;
            Ok((name.clone(), value))
        })
        .collect()
}

/// `[tools.TOOL.verify]` as written, compiled: every expression compiles and reads only what its
/// place defines.
pub(super) fn postcondition(tool: &str, raw: RawVerify) -> Result<Postcondition, PolicyError> {
    let field = |f: &str| format!("tools.{tool}.verify.{f}");
    let compile = |at: String, source: &str, allowed| {
        Expression::compile(source, allowed).map_err(|detail| PolicyError::Verify {
            field: at,
            expression: source.to_owned(),
            detail,
        })
    };
    let arguments = |place: &str, raw: &BTreeMap<String, String>| {
        raw.iter()
            .map(|(name, source)| {
                let at = field(&format!("{place}.{name}"));
                Ok((name.clone(), compile(at, source, ARGUMENT_VARIABLES)?))
            })
            .collect::<Result<BTreeMap<_, _>, PolicyError>>()
    };
    let args = arguments("args", &raw.args)?;
    let expect = compile(field("expect"), &raw.expect, EXPECT_VARIABLES)?;
    let rollback = match raw.rollback {
        Some(undo) => Some(Compensation {
            args: arguments("rollback_args", &raw.rollback_args)?,
            tool: undo,
        }),
        None if !raw.rollback_args.is_empty() => {
            return Err(invalid(
                &field("rollback_args"),
                "is given without `rollback`, the tool it would be passed to".to_owned(),
            ));
        }
        None => None,
    };
    Ok(Postcondition {
        read: raw.read,
        args,
        expect,
        rollback,
    })
}

/// Checks every postcondition against the rest of the policy: the verified tool can run, and the
/// read and compensating tools are tools the policy names and does not block. The read is not the
/// tool itself (reading would repeat the mutation) and has no idempotency key (a second read would
/// replay the first observation instead of looking again).
pub(super) fn check_policy(
    tools: &BTreeMap<String, ToolRule>,
    default_tier: Tier,
) -> Result<(), PolicyError> {
    let tier = |name: &str| tools.get(name).and_then(|r| r.tier).unwrap_or(default_tier);
    for (name, rule) in tools {
        let Some(verify) = &rule.verify else {
            continue;
        };
        let field = |f: &str| format!("tools.{name}.verify{f}");
        if tier(name) == Tier::Blocked {
            return Err(invalid(
                &field(""),
                format!("{name} is blocked, so it never runs and there is nothing to verify"),
            ));
        }
        let called = |target: &str, at: &str| match tools.get(target) {
            None => Err(invalid(
                &field(at),
                format!(
                    "names `{target}`, which the policy does not name: add a [tools.{target}] entry"
                ),
            )),
            Some(_) if tier(target) == Tier::Blocked => Err(invalid(
                &field(at),
                format!(
                    "names `{target}`, which the policy blocks: it could never be called, and every call to {name} would stop"
                ),
            )),
            Some(_) => Ok(()),
        };
        called(&verify.read, ".read")?;
        if verify.read == *name {
            return Err(invalid(
                &field(".read"),
                format!("{name} cannot be its own read: reading would repeat the mutation"),
            ));
        }
        if tools
            .get(&verify.read)
            .is_some_and(|r| r.idempotency_key.is_some())
        {
            return Err(invalid(
                &field(".read"),
                format!(
                    "`{}` has an idempotency_key, so a second read would replay the first observation instead of looking again",
                    verify.read
                ),
            ));
        }
        if let Some(rollback) = &verify.rollback {
            called(&rollback.tool, ".rollback")?;
        }
    }
    Ok(())
}

/// Checks a postcondition of `tool` (whose arguments are `properties`) against the tools really
/// served (`served`: name → argument names → JSON types): every `args.NAME` it reads is an
/// argument of `tool`, and every argument it passes is one the read or compensating tool takes.
/// A read or compensating tool that is not served is a warning: every call to `tool` would stop.
pub(super) fn check_served(
    tool: &str,
    verify: &Postcondition,
    properties: &BTreeMap<String, Vec<String>>,
    served: &BTreeMap<String, BTreeMap<String, Vec<String>>>,
    warnings: &mut Vec<String>,
) -> Result<(), PolicyError> {
    for (at, expression) in verify.expressions() {
        if let Some(arg) = expression
            .arguments()
            .iter()
            .find(|a| !properties.contains_key(*a))
        {
            return Err(PolicyError::Verify {
                field: format!("tools.{tool}.verify.{at}"),
                expression: expression.source().to_owned(),
                detail: ConditionError::UnknownArgument {
                    arg: arg.clone(),
                    tool: tool.to_owned(),
                },
            });
        }
    }
    let mut targets = vec![("read", "args", &verify.read, &verify.args)];
    if let Some(rollback) = &verify.rollback {
        targets.push(("rollback", "rollback_args", &rollback.tool, &rollback.args));
    }
    for (role, place, target, args) in targets {
        let Some(takes) = served.get(target) else {
            warnings.push(format!(
                "policy tools.{tool}.verify.{role} names `{target}`, which the served tools do not include: every call to {tool} will stop unverified"
            ));
            continue;
        };
        if let Some(arg) = args.keys().find(|a| !takes.contains_key(*a)) {
            return Err(invalid(
                &format!("tools.{tool}.verify.{place}.{arg}"),
                format!("{target} has no argument `{arg}`"),
            ));
        }
    }
    Ok(())
}

/// Collects the variables `node` reads that no enclosing comprehension binds (`n` in
/// `result.notes.exists(n, …)` is bound; CEL's own accumulators start with `@`).
fn free_variables<'e>(node: &'e IdedExpr, bound: &mut Vec<&'e str>, out: &mut BTreeSet<String>) {
    match &node.expr {
        Expr::Ident(name) => {
            if !name.starts_with('@') && !bound.contains(&name.as_str()) {
                out.insert(name.clone());
            }
        }
        Expr::Select(select) => free_variables(&select.operand, bound, out),
        Expr::Call(call) => {
            if let Some(target) = &call.target {
                free_variables(target, bound, out);
            }
            for arg in &call.args {
                free_variables(arg, bound, out);
            }
        }
        Expr::Comprehension(c) => {
            free_variables(&c.iter_range, bound, out);
            free_variables(&c.accu_init, bound, out);
            let depth = bound.len();
            bound.push(&c.iter_var);
            if let Some(second) = &c.iter_var2 {
                bound.push(second);
            }
            bound.push(&c.accu_var);
            for part in [&c.loop_cond, &c.loop_step, &c.result] {
                free_variables(part, bound, out);
            }
            bound.truncate(depth);
        }
        Expr::List(list) => {
            for element in &list.elements {
                free_variables(element, bound, out);
            }
        }
        Expr::Map(map) => {
            for entry in &map.entries {
                if let EntryExpr::MapEntry(e) = &entry.expr {
                    free_variables(&e.key, bound, out);
                    free_variables(&e.value, bound, out);
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &s.entries {
                if let EntryExpr::StructField(f) = &entry.expr {
                    free_variables(&f.value, bound, out);
                }
            }
        }
        Expr::Literal(_) | Expr::Unspecified => {}
    }
}

/// A CEL value as JSON, when it has a JSON form (not a function, a type, bytes, a NaN).
fn to_json(value: &CelValue) -> Option<Value> {
    Some(match value {
        CelValue::Null => Value::Null,
        CelValue::Bool(b) => Value::Bool(*b),
        CelValue::Int(i) => Value::from(*i),
        CelValue::UInt(u) => Value::from(*u),
        CelValue::Float(f) => Value::Number(serde_json::Number::from_f64(*f)?),
        CelValue::String(s) => Value::String(s.as_str().to_owned()),
        CelValue::List(items) => Value::Array(items.iter().map(to_json).collect::<Option<_>>()?),
        CelValue::Map(map) => Value::Object(
            map.map
                .iter()
                .map(|(key, v)| Some((key.to_string(), to_json(v)?)))
                .collect::<Option<_>>()?,
        ),
        _ => return None,
    })
}
