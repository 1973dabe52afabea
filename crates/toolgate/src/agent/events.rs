//! The run's event log (seed 003's "what should you log?"): one JSON object per line for every
//! decision, each with the run's id, redacted by the gate's redactor before it is written.
//!
//! These lines are the operator's view of a run, written as it happens; the audit log stays the
//! system of record (every call the agent makes is recorded there by the corridor, durably, before
//! the agent sees its answer).

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Map, Value, json};
use toolgate_core::redact::Redactor;
use toolgate_core::time::{now_ms, rfc3339};

/// Where a run's events go.
#[derive(Clone)]
pub struct EventLog {
    sink: Arc<Mutex<Box<dyn Write + Send>>>,
}

impl std::fmt::Debug for EventLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventLog").finish_non_exhaustive()
    }
}

impl EventLog {
    /// Events written to `sink`, one line each, flushed per event.
    pub fn new(sink: impl Write + Send + 'static) -> Self {
        Self {
            sink: Arc::new(Mutex::new(Box::new(sink))),
        }
    }

    /// Events written to this process's standard output.
    #[must_use]
    pub fn stdout() -> Self {
        Self::new(std::io::stdout())
    }

    /// Writes `event` of run `run_id` with `fields`, redacted. A sink that fails is logged, not
    /// fatal: the audit log, not this one, is the record a run cannot go on without.
    pub(super) fn emit(&self, redactor: &Redactor, event: &str, run_id: &str, fields: Value) {
        let mut line = Map::new();
        line.insert("ts".to_owned(), json!(rfc3339(now_ms())));
        line.insert("event".to_owned(), json!(event));
        line.insert("run_id".to_owned(), json!(run_id));
        if let Value::Object(fields) = redactor.redact_value(&fields) {
            line.extend(fields);
        }
        let mut sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        let written = writeln!(sink, "{}", Value::Object(line)).and_then(|()| sink.flush());
        if let Err(error) = written {
            tracing::warn!(error = %error, event, "agent event not written");
        }
    }
}
