//! A catalog: the tools a toolset offers at one moment, with their input schemas compiled.
//!
//! Kit toolsets build one at start and never change it; the gateway builds a new one whenever an
//! upstream (re)connects or says its list changed, and swaps it in whole, so a call always sees one
//! consistent list. A tool can also be *withheld*: known, but not offered and refused with its own
//! rule (a pinned definition that changed, a schema that does not compile), which the audit names
//! instead of "unknown tool".

use std::collections::{BTreeMap, HashMap};

use rmcp::model::Tool;
use serde_json::Value;
use toolgate_core::schema::ToolSchema;

/// Why a known tool is not offered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Withheld {
    /// The audit rule of the refusal, e.g. `pin.changed`.
    pub rule: String,
    /// A sentence for the log and for `toolgate pin`.
    pub reason: String,
}

/// Tools on offer, by name, with compiled schemas; immutable once built.
#[derive(Debug, Default)]
pub struct Catalog {
    tools: Vec<Tool>,
    index: HashMap<String, usize>,
    schemas: HashMap<String, ToolSchema>,
    withheld: BTreeMap<String, Withheld>,
}

impl Catalog {
    /// Compiles each tool's input schema. A tool whose schema does not compile is withheld (rule
    /// `schema.invalid`): the gate cannot validate its arguments, so it must not forward them.
    #[must_use]
    pub fn new(tools: Vec<Tool>) -> Self {
        let mut catalog = Self::default();
        for tool in tools {
            let schema = Value::Object((*tool.input_schema).clone());
            match ToolSchema::compile(&schema) {
                Ok(compiled) => {
                    catalog.schemas.insert(tool.name.to_string(), compiled);
                    catalog
                        .index
                        .insert(tool.name.to_string(), catalog.tools.len());
                    catalog.tools.push(tool);
                }
                Err(error) => {
                    let reason = format!("input schema does not compile: {error}");
                    catalog.withhold(&tool.name, "schema.invalid", reason);
                }
            }
        }
        catalog
    }

    /// Marks `name` as known but not offered; removes it from the offered tools if it was there.
    pub fn withhold(&mut self, name: &str, rule: &str, reason: String) {
        if let Some(at) = self.index.remove(name) {
            self.tools.remove(at);
            self.schemas.remove(name);
            self.index = self
                .tools
                .iter()
                .enumerate()
                .map(|(i, t)| (t.name.to_string(), i))
                .collect();
        }
        let rule = rule.to_owned();
        self.withheld
            .insert(name.to_owned(), Withheld { rule, reason });
    }

    /// Every offered tool, visible to the caller or not (hiding is the policy's job).
    #[must_use]
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }

    /// The offered tool `name`; `None` when it is unknown or withheld.
    #[must_use]
    pub fn get(&self, name: &str) -> Option<&Tool> {
        self.index.get(name).map(|&i| &self.tools[i])
    }

    /// Whether `name` is offered (a withheld tool is not).
    #[must_use]
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The compiled input schema of the offered tool `name`.
    #[must_use]
    pub fn schema(&self, name: &str) -> Option<&ToolSchema> {
        self.schemas.get(name)
    }

    /// Why `name` is withheld, if it is.
    #[must_use]
    pub fn withheld(&self, name: &str) -> Option<&Withheld> {
        self.withheld.get(name)
    }

    /// Every withheld tool and why.
    #[must_use]
    pub fn all_withheld(&self) -> &BTreeMap<String, Withheld> {
        &self.withheld
    }

    /// Each tool's arguments and their declared JSON types, for the policy's load-time checks.
    #[must_use]
    pub fn argument_types(&self) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
        self.schemas
            .iter()
            .map(|(name, schema)| {
                let types = schema
                    .property_types()
                    .iter()
                    .map(|(arg, types)| {
                        let types = types.iter().map(|t| t.as_str().to_owned()).collect();
                        (arg.clone(), types)
                    })
                    .collect();
                (name.clone(), types)
            })
            .collect()
    }
}
