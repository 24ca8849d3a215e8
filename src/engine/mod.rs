//! The engine: one lease-guarded, compare-and-swap-committed tick per invocation. Knows no SQL dialect and no
//! wire type.
//!
//! The parts, along the seams of a tick:
//! - [`document`]: the state document, every field, and who may set it;
//! - [`Ledger`]: the only reader and writer of the state and quarantine documents (typed, stamped, CAS);
//! - [`decide`]: the pure decisions, functions of the document, this process's memory, the invocation and
//!   `now` from the engine's clock: acknowledge by proof, re-deliver, quarantine, lease, fence;
//! - `tick`: what every tick shares (the remembered document, the checks, the recorded tick of `immediate`
//!   delivery and of a sink, quarantine);
//! - `host_tick`: deferred delivery, acknowledged by proof (docs/architecture.md, "Acknowledge by proof");
//! - `sink_tick`: the handler's own delivery: record, deliver, acknowledge; reconciliation, chaining, the
//!   heartbeat.
//!
//! A [`Trigger`] owns its delivery ([`Delivery`]): the host's output bindings, or a sink. What the process
//! remembers between ticks (the document it wrote last, the batches it answered, a batch fetched ahead or
//! chained) is one [`Memory`], held by the tick lock, so one tick at a time reads and changes it.

pub mod decide;
pub mod document;
mod error;
pub mod failpoint;
mod host_tick;
mod ledger;
mod observe;
mod outputs;
mod sink_tick;
mod tick;

pub use error::{ErrorKind, TickError};
pub use ledger::{Ledger, Saved};
pub use observe::{TickObserver, TickRecord};
pub use outputs::MappedOutputs;

use crate::change::Change;
use crate::clock::{Clock, SystemClock};
use crate::config::{DeliveryMode, FunctionConfig};
use crate::protocol::Attempt;
use crate::sink::Sink;
use crate::source::Source;
use crate::state::{Etag, StateStore};
use document::StateDoc;
use std::sync::Arc;
use time::OffsetDateTime;
use tokio::sync::{Mutex, OnceCell};

/// Who drives a tick, and so how its batch is acknowledged.
#[derive(Debug, Clone, Copy)]
enum Via<'a> {
    /// The host's invocation, in deferred delivery: acknowledged by proof (`host_tick`).
    Host(&'a Attempt),
    /// The host's invocation, in immediate delivery: acknowledged before answering.
    Immediate,
    /// A sink tick (`sink_tick`, and every tick of `handler run`): acknowledged after the sink took it.
    Sink,
}

/// Where a trigger's batches go.
#[derive(Clone)]
pub enum Delivery {
    /// To the host, which writes them to the function's output bindings (deferred or immediate delivery).
    Host,
    /// To a sink, by the handler itself (sink delivery; every function of `handler run`).
    Sink(Arc<dyn Sink>),
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Host => f.write_str("Host"),
            Self::Sink(sink) => write!(f, "Sink({})", sink.describe()),
        }
    }
}

/// What one tick produced.
#[derive(Debug, Default)]
pub struct TickOutcome {
    pub changes: Vec<Change>,
    pub batch_id: Option<u64>,
    pub kind: OutcomeKind,
    /// Lines for the invocation's `Logs` (also written to the process log).
    pub logs: Vec<String>,
    /// State-store operations this tick performed.
    pub store_operations: u64,
    /// The lease token this batch was answered under (0 when none); sinks use it as a fencing token.
    pub fence: u64,
    /// The document this tick last wrote and its new etag: where sink mode's acknowledgement continues from.
    committed: Option<(StateDoc, Etag)>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum OutcomeKind {
    /// A new batch.
    Delivered,
    /// A batch delivered before, sent again.
    Redelivered,
    /// Nothing to send.
    #[default]
    Empty,
    /// Another tick committed first; this one sends nothing.
    Conflict,
    /// Another instance holds the batch in flight.
    LeaseHeld,
    Paused,
}

/// What an invocation answers the host: the tick, and what each output binding receives (nothing when the
/// trigger delivers through a sink).
#[derive(Debug)]
pub struct Answer {
    pub outcome: TickOutcome,
    pub outputs: MappedOutputs,
}

/// What this process remembers between ticks of one function. Held by the tick lock: a tick reads and changes
/// it alone.
#[derive(Debug, Default)]
struct Memory {
    /// The document this process wrote last and its etag, so the next tick need not read it back (see
    /// `tick::tick_inner`). Taken at the start of a tick: any failure leaves it empty and the next tick reads.
    written: Option<(StateDoc, Etag)>,
    /// Deferred delivery: the batches answered to the host and not proven written (`decide`).
    answered: decide::Answered,
    /// Sink delivery: the batch after the one being delivered, fetched while the sink wrote.
    ahead: Option<sink_tick::Ahead>,
    /// Sink delivery: the batch recorded in flight by the previous tick's acknowledgement, to deliver next.
    chained: Option<sink_tick::Chained>,
}

/// The trigger of one function: its configuration, source, ledger and delivery, and this process's memory of
/// what it answered.
#[derive(Debug)]
pub struct Trigger {
    config: FunctionConfig,
    source: Arc<dyn Source>,
    ledger: Arc<Ledger>,
    delivery: Delivery,
    /// This process's identity in leases. A restart is a new owner, on purpose: a new process cannot know
    /// whether the old one's last answer reached the host.
    owner: String,
    /// One tick at a time per function in this process (a concurrent invocation waits its turn), and what the
    /// process remembers between them.
    memory: Mutex<Memory>,
    validated: OnceCell<()>,
    /// This process's view of its ticks, readable while a tick runs (status, metrics).
    stats: std::sync::Mutex<TickStats>,
    /// Told about every tick (metrics); set at most once, after start-up.
    observer: std::sync::OnceLock<Arc<dyn TickObserver>>,
}

/// This process's view of its ticks, for status and metrics.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TickStats {
    pub ticks: u64,
    #[serde(with = "time::serde::rfc3339::option")]
    pub at: Option<OffsetDateTime>,
    pub outcome: String,
    pub rows: usize,
    pub duration_ms: f64,
    pub store_operations: u64,
    pub failures_transient: u64,
    pub failures_operator: u64,
    /// Deletes left out because an output binding receives rows (reported in the invocation's logs too).
    pub deletes_not_sent: u64,
}

impl Trigger {
    /// A trigger that answers the host (deferred or immediate delivery); [`Trigger::with_sink`] gives it a sink.
    pub fn new(
        config: FunctionConfig,
        app_name: &str,
        source: Arc<dyn Source>,
        store: Arc<dyn StateStore>,
        owner: String,
    ) -> Self {
        let ledger = Arc::new(Ledger::new(store, app_name, &config.name, Arc::new(SystemClock)));
        Self {
            config,
            source,
            ledger,
            delivery: Delivery::Host,
            owner,
            memory: Mutex::new(Memory::default()),
            validated: OnceCell::new(),
            stats: std::sync::Mutex::new(TickStats::default()),
            observer: std::sync::OnceLock::new(),
        }
    }

    /// Delivers through `sink`, by the handler itself.
    pub fn with_sink(mut self, sink: Arc<dyn Sink>) -> Self {
        self.delivery = Delivery::Sink(sink);
        self
    }

    /// Reads the time from `clock` instead of the system's (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.ledger = Arc::new(self.ledger.with_clock(clock));
        self
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    pub fn config(&self) -> &FunctionConfig {
        &self.config
    }

    pub fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }

    pub fn delivery(&self) -> &Delivery {
        &self.delivery
    }

    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    pub fn state_key(&self) -> &str {
        self.ledger.key()
    }

    pub fn quarantine_prefix(&self) -> &str {
        self.ledger.quarantine_prefix()
    }

    fn clock(&self) -> &Arc<dyn Clock> {
        self.ledger.clock()
    }

    /// The state document and its etag, through the ledger.
    pub async fn load(&self) -> Result<Option<(StateDoc, Etag)>, TickError> {
        self.ledger.load().await
    }

    /// The batches this process answered and has not proven written (deferred delivery).
    pub async fn unproven(&self) -> decide::Answered {
        self.memory.lock().await.answered.clone()
    }

    /// Maps a batch onto this function's output bindings, counting the deletes a binding could not receive.
    pub fn outputs(&self, changes: &[Change]) -> MappedOutputs {
        let mapped = outputs::map(&self.config.output_routes(), changes, self.config.settings.message_format);
        self.stats.lock().expect("stats lock").deletes_not_sent += mapped.deletes_not_sent();
        mapped
    }

    /// One invocation by the host: a tick that answers the host's bindings, or one that delivers through the
    /// trigger's sink (and answers no outputs).
    pub async fn invoke(&self, attempt: &Attempt) -> Result<Answer, TickError> {
        match &self.delivery {
            Delivery::Host => {
                let outcome = self.tick(attempt).await?;
                let outputs = self.outputs(&outcome.changes);
                Ok(Answer { outcome, outputs })
            }
            Delivery::Sink(sink) => {
                let outcome = self.tick_into(sink.as_ref()).await?;
                Ok(Answer { outcome, outputs: MappedOutputs::default() })
            }
        }
    }

    /// Runs one tick for the host's `attempt` within the function's time budget.
    pub async fn tick(&self, attempt: &Attempt) -> Result<TickOutcome, TickError> {
        let mut memory = self.memory.lock().await;
        // What a retry says about earlier answers is taken in before anything here can fail: if this tick fails
        // too (the store or the database is down), the batch it named stays owed in this process's memory, and
        // the next invocation answers it again.
        let named = match self.config.settings.delivery_mode {
            DeliveryMode::Deferred => memory.answered.note(attempt, self.clock().now()),
            DeliveryMode::Immediate | DeliveryMode::Sink => decide::Named::Nothing,
        };
        let line = decide::named_line(&named, attempt, self.config.proof_window);
        if let Some(line) = &line {
            tracing::warn!(function = %self.config.name, invocation = %attempt.id, "{line}");
        }
        let via = match self.config.settings.delivery_mode {
            DeliveryMode::Deferred => Via::Host(attempt),
            DeliveryMode::Immediate => Via::Immediate,
            DeliveryMode::Sink => Via::Sink,
        };
        let mut result = self.timed(self.tick_inner(&mut memory, via)).await;
        if let (Ok(out), Some(line)) = (result.as_mut(), line) {
            out.logs.insert(0, line);
        }
        result
    }

    /// Runs a tick's work within the function's time budget and records what it did (stats, observer).
    /// Called with the tick lock held.
    async fn timed(
        &self,
        work: impl std::future::Future<Output = Result<TickOutcome, TickError>>,
    ) -> Result<TickOutcome, TickError> {
        let started = std::time::Instant::now();
        let ops_before = self.ledger.store_operations();
        let budget = self.config.settings.tick_timeout;
        let result = match tokio::time::timeout(budget, work).await {
            Ok(result) => result,
            Err(_) => Err(TickError::Timeout(budget)),
        };
        let store_operations = self.ledger.store_operations() - ops_before;
        let duration = started.elapsed();
        if let Some(observer) = self.observer.get() {
            observer.tick_finished(&TickRecord {
                function: &self.config.name,
                outcome: result.as_ref().map(|o| o.kind).map_err(TickError::kind),
                rows: result.as_ref().map_or(0, |o| o.changes.len()),
                duration,
                store_operations,
            });
        }
        let mut stats = self.stats.lock().expect("stats lock");
        stats.ticks += 1;
        stats.at = Some(self.clock().now());
        stats.duration_ms = duration.as_secs_f64() * 1000.0;
        stats.store_operations = store_operations;
        match result {
            Ok(mut outcome) => {
                outcome.store_operations = store_operations;
                stats.rows = outcome.changes.len();
                stats.outcome = format!("{:?}", outcome.kind);
                Ok(outcome)
            }
            Err(e) => {
                stats.rows = 0;
                stats.outcome = "Failed".into();
                match e.kind() {
                    ErrorKind::Transient => stats.failures_transient += 1,
                    ErrorKind::Operator => stats.failures_operator += 1,
                }
                Err(e)
            }
        }
    }

    /// Tells `observer` about every later tick. Only the first observer set is kept: `false` if one was already.
    pub fn observe(&self, observer: Arc<dyn TickObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// Start-up checks, run in the background once the handler is listening (the host's readiness probe must
    /// not wait for a database): the source's table and settings, and whether the stored state still fits the
    /// configured source. Problems are reported by the caller; ticks refuse with the same errors.
    pub async fn preflight(&self) -> Result<(), TickError> {
        // Under the tick lock, so its state read never lands inside a tick's operation count.
        let _one_at_a_time = self.memory.lock().await;
        self.validated.get_or_try_init(|| self.source.validate()).await?;
        if let Some((doc, _)) = self.load().await? {
            decide::check_fingerprint(&doc, &self.config.name, &self.source.fingerprint())?;
        }
        Ok(())
    }

    /// What the last tick of this process did, and failures so far by kind.
    pub fn last_tick(&self) -> Option<TickStats> {
        let stats = self.stats.lock().expect("stats lock");
        (stats.ticks > 0).then(|| stats.clone())
    }
}
