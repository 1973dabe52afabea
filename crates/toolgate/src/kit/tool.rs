//! A kit tool: its MCP definition, what the code declares about it (`gated`, `gate_env`,
//! timeout), its handler and its dry run; and the toolset that serves a kit's tools behind the gate.
//!
//! Handlers are typed: the arguments are read into the handler's own type (any
//! `serde::Deserialize`, or `serde_json::Map` for raw access) after the gate has checked them
//! against the input schema, so a handler never sees arguments its schema refuses.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{JsonObject, ToolAnnotations};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use toolgate_core::policy::Declared;
use toolgate_core::redact::Redactor;

use super::context::{Context, Env, Level, Logger};
use super::results::{Output, ToolError};
use crate::toolset::{Call, CallFuture, Catalog, DryRunFuture, Toolset};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
/// A handler or dry run as the toolset calls it: on the arguments as the gate checked them.
type Erased<T> =
    dyn Fn(Map<String, Value>, Context) -> BoxFuture<Result<T, ToolError>> + Send + Sync;
type Handler = Erased<Output>;
type DryRun = Erased<Value>;

/// `typed` behind [`Erased`]: the arguments are read into `A` first, and arguments that fit the
/// schema but not `A` are refused without calling it.
fn erase<A, T, F, Fut>(tool: &str, typed: F) -> Arc<Erased<T>>
where
    A: DeserializeOwned + Send + 'static,
    T: Send + 'static,
    F: Fn(A, Context) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<T, ToolError>> + Send + 'static,
{
    let tool = tool.to_owned();
    Arc::new(
        move |arguments, ctx| match serde_json::from_value::<A>(Value::Object(arguments)) {
            Ok(arguments) => Box::pin(typed(arguments, ctx)),
            Err(why) => Box::pin(std::future::ready(Err(ToolError::invalid_arguments(
                &tool, &why,
            )))),
        },
    )
}

/// One tool of a kit server, built with `Tool::new(name)` and the methods below.
///
/// ```
/// use serde::Deserialize;
/// use serde_json::json;
/// use toolgate::kit::{Tool, ok_result};
///
/// #[derive(Deserialize)]
/// struct Delete {
///     id: String,
/// }
///
/// let tool = Tool::new("delete_note")
///     .description("Permanently delete one note file.")
///     .input_schema(json!({
///         "type": "object",
///         "properties": {"id": {"type": "string"}},
///         "required": ["id"],
///     }))
///     .gated()
///     .dry_run(|Delete { id }, _ctx| async move {
///         Ok(json!({"would": format!("delete the note {id}"), "reversible": false}))
///     })
///     .handler(|Delete { id }, _ctx| async move { ok_result(json!({"deleted": id})) });
/// # drop(tool);
/// ```
#[derive(Clone)]
pub struct Tool {
    definition: rmcp::model::Tool,
    declared: Declared,
    handler: Option<Arc<Handler>>,
    dry_run: Option<Arc<DryRun>>,
    /// What was wrong with the definition (a schema that is not an object): reported by the
    /// server at start, so a builder method never panics.
    problems: Vec<String>,
}

impl fmt::Debug for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.definition.name)
            .field("declared", &self.declared)
            .field("handler", &self.handler.is_some())
            .field("dry_run", &self.dry_run.is_some())
            .finish_non_exhaustive()
    }
}

impl Tool {
    /// A tool named `name` that takes an object with any properties (`{"type": "object"}`) until
    /// [`Tool::input_schema`] or `Tool::input` (feature `schemars`) says otherwise.
    #[must_use]
    pub fn new(name: impl Into<String>) -> Self {
        let mut schema = JsonObject::new();
        schema.insert("type".to_owned(), json!("object"));
        Self {
            definition: rmcp::model::Tool::new(name.into(), String::new(), Arc::new(schema)),
            declared: Declared::default(),
            handler: None,
            dry_run: None,
            problems: Vec::new(),
        }
    }

    /// The tool's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.definition.name
    }

    /// A human-readable title (`title` in `tools/list`).
    #[must_use]
    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.definition.title = Some(title.into());
        self
    }

    /// What the tool does, for the model.
    #[must_use]
    pub fn description(mut self, description: impl Into<String>) -> Self {
        self.definition.description = Some(description.into().into());
        self
    }

    /// The JSON Schema of the arguments (an object schema). The gate checks every call against
    /// it before the handler, or the dry run, is called.
    #[must_use]
    pub fn input_schema(mut self, schema: Value) -> Self {
        match schema {
            Value::Object(object) => self.definition.input_schema = Arc::new(object),
            other => self.problems.push(format!(
                "the input schema must be a JSON object, not {other}"
            )),
        }
        self
    }

    /// The input schema derived from `T` (`schemars`), the way rmcp's `#[tool]` derives it.
    #[cfg(feature = "schemars")]
    #[must_use]
    pub fn input<T: schemars::JsonSchema + 'static>(mut self) -> Self {
        match rmcp::handler::server::common::schema_for_input::<T>() {
            Ok(schema) => self.definition.input_schema = schema,
            Err(why) => self.problems.push(format!("the input schema: {why}")),
        }
        self
    }

    /// The JSON Schema of the result's `structuredContent`, passed to `tools/list` as written.
    #[must_use]
    pub fn output_schema(mut self, schema: Value) -> Self {
        match schema {
            Value::Object(object) => self.definition.output_schema = Some(Arc::new(object)),
            other => self.problems.push(format!(
                "the output schema must be a JSON object, not {other}"
            )),
        }
        self
    }

    /// Annotations (`readOnlyHint`, `destructiveHint`, …), passed to `tools/list` exactly as
    /// written: the kit never adds any (being gated does not make a tool destructive).
    #[must_use]
    pub fn annotations(mut self, annotations: ToolAnnotations) -> Self {
        self.definition.annotations = Some(annotations);
        self
    }

    /// Keeps the tool off until its gate variable (`<NAME>_ALLOW_GATED`, or [`Tool::gate_env`])
    /// is set to an enabling value: until then a call runs no handler and answers with the
    /// tool's dry run.
    #[must_use]
    pub fn gated(mut self) -> Self {
        self.declared.gated = true;
        self
    }

    /// This tool's own gate variable, instead of the server's `<NAME>_ALLOW_GATED`.
    #[must_use]
    pub fn gate_env(mut self, name: impl Into<String>) -> Self {
        self.declared.gate_env = Some(name.into());
        self
    }

    /// This tool's timeout, instead of the server's.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.declared.timeout = Some(timeout);
        self
    }

    /// Does the work. The arguments are read into `A` (the handler's own type); arguments that
    /// fit the schema but not `A` are refused without running it.
    #[must_use]
    pub fn handler<A, F, Fut>(mut self, handler: F) -> Self
    where
        A: DeserializeOwned + Send + 'static,
        F: Fn(A, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Output, ToolError>> + Send + 'static,
    {
        self.handler = Some(erase(&self.definition.name, handler));
        self
    }

    /// Describes what the handler would do, without doing it: called only when the gate refuses
    /// the call (a gated tool whose switch is off). Return an object with at least `would` (a
    /// sentence) and `reversible`, plus whatever helps a person decide (sizes, targets).
    #[must_use]
    pub fn dry_run<A, F, Fut>(mut self, dry_run: F) -> Self
    where
        A: DeserializeOwned + Send + 'static,
        F: Fn(A, Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ToolError>> + Send + 'static,
    {
        self.dry_run = Some(erase(&self.definition.name, dry_run));
        self
    }

    /// What is wrong with the definition, if anything.
    pub(crate) fn problems(&self) -> Vec<String> {
        let mut problems = self.problems.clone();
        if self.handler.is_none() {
            problems.push("it has no handler".to_owned());
        }
        problems
    }

    pub(crate) fn declared(&self) -> &Declared {
        &self.declared
    }
}

/// Shared by every call of one server: what contexts and errors are made with.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) server: Arc<str>,
    pub(crate) env: Env,
    pub(crate) level: Level,
    pub(crate) redactor: Arc<Redactor>,
}

impl Shared {
    fn context(&self, tool: &str, ct: tokio_util::sync::CancellationToken) -> Context {
        Context {
            ct,
            log: Logger::new(self.server.clone(), tool, self.level, self.redactor.clone()),
            env: self.env.clone(),
            principal: None,
        }
    }

    fn redact(&self, text: &str) -> String {
        super::secrets::redact(&self.redactor, text)
    }
}

/// A kit's tools as a toolset the gate serves.
pub(crate) struct KitToolset {
    catalog: Arc<Catalog>,
    tools: HashMap<String, Tool>,
    shared: Arc<Shared>,
}

impl fmt::Debug for KitToolset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KitToolset")
            .field("server", &self.shared.server)
            .field("tools", &self.tools.len())
            .finish_non_exhaustive()
    }
}

impl KitToolset {
    pub(crate) fn new(tools: Vec<Tool>, shared: Arc<Shared>) -> Self {
        let catalog = Catalog::new(tools.iter().map(|t| t.definition.clone()).collect());
        let tools = tools
            .into_iter()
            .map(|t| (t.definition.name.to_string(), t))
            .collect();
        Self {
            catalog: Arc::new(catalog),
            tools,
            shared,
        }
    }
}

impl Toolset for KitToolset {
    fn catalog(&self) -> Arc<Catalog> {
        self.catalog.clone()
    }

    fn call<'a>(&'a self, call: Call<'a>) -> CallFuture<'a> {
        Box::pin(async move {
            let Some(handler) = self.tools.get(call.name).and_then(|t| t.handler.clone()) else {
                return Err(crate::toolset::CallError::unknown(call.name));
            };
            let mut ctx = self.shared.context(call.name, call.ct.clone());
            ctx.principal = Some(call.principal.sub.clone());
            Ok(match handler(call.arguments, ctx).await {
                Ok(output) => output.into_result(),
                Err(error) => error.into_result(|text| self.shared.redact(text)),
            })
        })
    }

    fn dry_run<'a>(&'a self, name: &'a str, arguments: &'a Map<String, Value>) -> DryRunFuture<'a> {
        Box::pin(async move {
            let dry_run = self.tools.get(name)?.dry_run.clone()?;
            let ct = tokio_util::sync::CancellationToken::new();
            let ctx = self.shared.context(name, ct);
            Some(match dry_run(arguments.clone(), ctx).await {
                Ok(preview) => preview,
                Err(error) => json!({
                    "preview_available": false,
                    "error": self.shared.redact(error.message()),
                    "code": error.code(),
                }),
            })
        })
    }
}
