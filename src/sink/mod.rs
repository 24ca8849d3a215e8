//! In-handler delivery: where a batch goes when the handler delivers it itself (`deliveryMode: sink` under the
//! Functions host, and `handler run`) instead of answering it to the host's output bindings.
//!
//! # Contract
//! - `deliver` is called with one whole batch, in order, at most once at a time per function.
//! - `Ok(())` means the destination has durably taken the batch; only then does the batch count as delivered
//!   (in sink mode the same tick acknowledges it, after `deliver` returns). An error means it may or may not
//!   have been taken: the same batch, with the same `batch_id` and range, is delivered again. Delivery is
//!   therefore at-least-once, and a destination that wants no duplicates deduplicates on `(function,
//!   batch_id)` (the webhook's `Idempotency-Key`), on the rows' keys (an upsert), or on the batch's range (the
//!   SQL sinks' exactly-once checkpoint row).
//! - `fence` is the lease token of the instance delivering; it grows with every change of owner, so a
//!   destination that records it can refuse a deposed instance's late write ([`SinkError::Fenced`]), which
//!   the engine treats like a lost compare-and-swap: nothing is acknowledged, nothing is counted as failed.
//! - [`SinkError::Rejected`] counts toward `Sql_Trigger_MaxAttempts` (then quarantine or halt);
//!   [`SinkError::Transient`] does not, so an outage of the destination never quarantines a batch.
//! - `resume_position` says what the destination recorded for a function (the fence token, and an
//!   exactly-once sink's last applied batch). Sink mode asks only while the function's state document has
//!   acknowledged nothing, which is how a lost document shows, so the target's record wins over `startFrom`
//!   (see `engine::sink_tick::reconcile`). Sinks that record nothing keep the default, `None`.

mod mssql;
mod postgres;
mod stdout;
mod table;
mod target;
mod upsert;
mod webhook;

pub use mssql::MssqlSink;
pub use postgres::PostgresSink;
pub use stdout::StdoutSink;
pub use table::{Dialect, TableSink};
pub use webhook::WebhookSink;

use crate::change::Change;
use crate::config::{ConfigError, Env, SinkSpec};
use crate::db::postgres::PostgresTls;
use crate::source::BatchRange;
use crate::source::Position;
use serde_json::Value;
use std::fmt;
use std::sync::Arc;

/// One batch on its way to a sink.
#[derive(Debug)]
pub struct SinkBatch<'a> {
    pub app: &'a str,
    pub function: &'a str,
    pub fence: u64,
    pub changes: &'a [Change],
    /// The batch: its id and its range in the source, `(from, to]`, what names this batch exactly across
    /// re-deliveries and restarts (the engine's one model of a batch, as its state document records it).
    pub range: &'a BatchRange,
}

impl SinkBatch<'_> {
    /// A key that names this batch across re-deliveries.
    pub fn idempotency_key(&self) -> String {
        format!("{}/{}/{}", self.app, self.function, self.range.batch_id)
    }

    /// The key SQL sinks record fences and checkpoints under: one row per app and function.
    pub fn owner_key(&self) -> String {
        format!("{}/{}", self.app, self.function)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Worth another try (network, 5xx, throttling, deadlock). Not counted as a failure of the batch.
    #[error("{0}")]
    Transient(String),
    /// The destination refused the batch; retrying the same batch will likely fail again (counts as a failure
    /// toward Sql_Trigger_MaxAttempts, then quarantine).
    #[error("{0}")]
    Rejected(String),
    /// A newer owner of the function (a larger fencing token) already wrote to the destination: this
    /// instance was deposed while it held the batch, and its write was refused. Nothing was written.
    #[error("the destination refused the write of fencing token {ours}: it has seen token {stored} from a newer owner of this function; this instance lost its lease and writes nothing")]
    Fenced { ours: u64, stored: u64 },
}

/// What a destination recorded for one function (see [`Sink::resume_position`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Resume {
    /// The largest fencing token that wrote to the destination for this function (0: none yet).
    pub fence: u64,
    /// An exactly-once sink's checkpoint row: the last batch applied, in the rows' own transaction.
    pub applied: Option<Applied>,
}

/// A batch an exactly-once sink applied: its id and its range in the source, `(from, to]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub batch_id: u64,
    pub from: Position,
    pub to: Position,
}

#[async_trait::async_trait]
pub trait Sink: Send + Sync + fmt::Debug {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), SinkError>;
    /// For logs: the kind and destination, never a secret.
    fn describe(&self) -> String;
    /// True when the sink applies each batch exactly once by itself (it records what it applied in the
    /// destination, in the same transaction as the rows); it then needs the batch's `range`.
    fn exactly_once(&self) -> bool {
        false
    }
    /// What the destination recorded for `app`/`function`: the fence token that last wrote and, for an
    /// exactly-once sink, its checkpoint row. `None` (the default): this sink records nothing. Reads only
    /// (creating a missing bookkeeping table is allowed); an error is reported like a failed delivery, and
    /// sink mode delivers nothing until the destination answers.
    async fn resume_position(&self, _app: &str, _function: &str) -> Result<Option<Resume>, SinkError> {
        Ok(None)
    }
}

/// Builds the sink `spec` names for `function` (the configuration chose and checked it at load). Opens no
/// connection: database sinks connect on their first delivery. The error names `function`'s sqltrigger.json.
pub fn build(function: &str, spec: &SinkSpec, postgres_tls: &PostgresTls) -> Result<Arc<dyn Sink>, ConfigError> {
    let built: Result<Arc<dyn Sink>, String> = match spec {
        SinkSpec::Stdout => Ok(Arc::new(StdoutSink::new())),
        SinkSpec::Webhook(webhook) => WebhookSink::new(webhook).map(|s| Arc::new(s) as Arc<dyn Sink>),
        SinkSpec::Postgres(target) => postgres::new(target, postgres_tls).map(|s| Arc::new(s) as Arc<dyn Sink>),
        SinkSpec::Mssql(target) => mssql::new(target).map(|s| Arc::new(s) as Arc<dyn Sink>),
    };
    built.map_err(|e| ConfigError::new(format!("sink in {function}/sqltrigger.json"), e))
}

/// Reads and builds the sink a `sqltrigger.json` states (`"sink": {"type": ...}`; stdout when `None`), through
/// the configuration's parser: for tests and tools that state a sink as its author writes it.
pub fn from_options(
    function: &str,
    options: Option<&Value>,
    env: &Env,
    postgres_tls: &PostgresTls,
) -> Result<Arc<dyn Sink>, ConfigError> {
    build(function, &SinkSpec::from_json(function, options, env)?, postgres_tls)
}

/// The SQL Server sink a `"sink"` of type mssql states, with a request's rows in at most `max_row_params`
/// parameters: for the wire tests only (see `mssql::packing_rows_into`).
#[doc(hidden)]
pub fn mssql_packing_rows_into(options: &Value, env: &Env, max_row_params: usize) -> Result<MssqlSink, String> {
    match SinkSpec::parse(options, env)? {
        SinkSpec::Mssql(target) => mssql::packing_rows_into(&target, max_row_params),
        other => Err(format!("not an mssql sink: {other:?}")),
    }
}
