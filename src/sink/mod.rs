//! In-handler delivery: where `handler run` sends a batch when no Functions host writes output bindings.
//!
//! # Contract
//! - `deliver` is called with one whole batch, in order, at most once at a time per function.
//! - `Ok(())` means the destination has durably taken the batch; only then does the batch count as delivered
//!   (the next tick acknowledges it). An error means it may or may not have been taken: the same batch, with
//!   the same `batch_id`, is delivered again. Delivery is therefore at-least-once, and a destination that
//!   wants no duplicates deduplicates on `(function, batch_id)` (the webhook's `Idempotency-Key`) or on the
//!   rows' keys (an upsert).
//! - `fence` is the lease token of the instance delivering; it grows with every change of owner, so a
//!   destination that records it can refuse a deposed instance's late write.

mod stdout;
mod webhook;

pub use stdout::StdoutSink;
pub use webhook::WebhookSink;

use crate::change::Change;
use crate::config::ConfigError;
use crate::config::Env;
use serde_json::Value;
use std::fmt;
use std::sync::Arc;

/// One batch on its way to a sink.
#[derive(Debug)]
pub struct SinkBatch<'a> {
    pub app: &'a str,
    pub function: &'a str,
    pub batch_id: u64,
    pub fence: u64,
    pub changes: &'a [Change],
}

impl SinkBatch<'_> {
    /// A key that names this batch across re-deliveries.
    pub fn idempotency_key(&self) -> String {
        format!("{}/{}/{}", self.app, self.function, self.batch_id)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Worth another try (network, 5xx, throttling).
    #[error("{0}")]
    Transient(String),
    /// The destination refused the batch; retrying the same batch will likely fail again (counts as a failure
    /// toward Sql_Trigger_MaxAttempts, then quarantine).
    #[error("{0}")]
    Rejected(String),
}

#[async_trait::async_trait]
pub trait Sink: Send + Sync + fmt::Debug {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), SinkError>;
    /// For logs: the kind and destination, never a secret.
    fn describe(&self) -> String;
}

/// Builds the sink a function's `sqltrigger.json` asks for (`"sink": {"type": ...}`); stdout by default.
pub fn from_options(function: &str, options: Option<&Value>, env: &Env) -> Result<Arc<dyn Sink>, ConfigError> {
    let setting = format!("sink in {function}/sqltrigger.json");
    let Some(options) = options else { return Ok(Arc::new(StdoutSink::new())) };
    let kind = options.get("type").and_then(Value::as_str).unwrap_or("");
    match kind {
        "stdout" => Ok(Arc::new(StdoutSink::new())),
        "webhook" => WebhookSink::from_options(options, env)
            .map(|s| Arc::new(s) as Arc<dyn Sink>)
            .map_err(|e| ConfigError::new(setting, e)),
        other => Err(ConfigError::new(setting, format!("type {other:?} is not a sink; use stdout or webhook"))),
    }
}
