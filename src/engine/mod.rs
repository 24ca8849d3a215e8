//! The engine: one lease-guarded, compare-and-swap-committed tick per invocation. Knows no SQL dialect and no
//! wire type.
//!
//! The parts, along the seams of a tick:
//! - [`document`]: the state document, every field, and who may set it;
//! - [`Ledger`]: the only reader and writer of the state and quarantine documents (typed, stamped, CAS);
//! - [`decide`]: the pure decisions, functions of the document, this process's memory, the invocation and
//!   `now` from the engine's clock: acknowledge by proof, re-deliver, quarantine, lease, fence;
//! - `tick`: a tick as a value ([`tick::Tick`]): the document it started from, its etag, `now` and its answer,
//!   with the checks every delivery shares, `commit`, `quarantine` and `halt`;
//! - `host_tick`: deferred delivery over a tick, acknowledged by proof (docs/architecture.md, "Acknowledge by
//!   proof");
//! - `recorded`: immediate delivery, and the recording step of a sink's tick, over a tick;
//! - `sink_tick`: the handler's own delivery: deliver, acknowledge; reconciliation, chaining, the heartbeat;
//! - `operate`: operator actions and status, over the ledger.
//!
//! One invocation reads downward: `server.rs` → [`Trigger::invoke`] (this file: which delivery, the remembered
//! document) → `host_tick::deferred` (or `recorded::record`, `sink_tick::deliver`) → `tick.rs` (`commit`) →
//! `ledger.rs`. No file calls back into the one that called it.
//!
//! A [`Trigger`] owns its delivery ([`Delivery`]): the host's output bindings (deferred or immediate), or a
//! sink. What the process remembers between ticks (the document it wrote last, the batches it answered, a batch
//! fetched ahead or chained) is one [`Memory`], held by the tick lock, so one tick at a time reads and changes it.

pub mod decide;
pub mod document;
mod error;
mod host_tick;
mod ledger;
mod observe;
pub mod operate;
mod outputs;
mod recorded;
mod sink_tick;
mod tick;

pub use error::{ErrorKind, RetryDirective, TickError};
pub use ledger::{Ledger, Saved};
pub use observe::{TickObserver, TickRecord, TickStats};
pub use outputs::MappedOutputs;

use crate::change::Change;
use crate::clock::{Clock, SystemClock};
use crate::config::{DeliveryMode, FunctionConfig};
use crate::protocol::Attempt;
use crate::sink::Sink;
use crate::source::{Source, SourceError};
use crate::state::{Etag, StateStore};
use document::StateDoc;
use recorded::Acknowledge;
use std::sync::Arc;
use tick::{Opened, Tick};
use tokio::sync::{Mutex, OnceCell};

/// Where a trigger's batches go, and so how each is acknowledged: the one answer to "who drives a tick".
#[derive(Clone)]
pub enum Delivery {
    /// To the host's output bindings, acknowledged by proof (`host_tick`).
    Deferred,
    /// To the host's output bindings, acknowledged before answering (`recorded`).
    Immediate,
    /// To a sink, by the handler itself, acknowledged after the sink took it (`sink_tick`; every function of
    /// `handler run`).
    Sink(Arc<dyn Sink>),
    /// `deliveryMode sink` with no sink given: every tick refuses (a batch recorded for a sink that does not
    /// exist would never be delivered). Configuration loading never builds one; only a program that builds a
    /// trigger by hand can.
    SinkMissing,
}

impl Delivery {
    /// The delivery `mode` means for a trigger that has no sink.
    fn of(mode: DeliveryMode) -> Self {
        match mode {
            DeliveryMode::Deferred => Self::Deferred,
            DeliveryMode::Immediate => Self::Immediate,
            DeliveryMode::Sink => Self::SinkMissing,
        }
    }
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Deferred => f.write_str("Deferred"),
            Self::Immediate => f.write_str("Immediate"),
            Self::Sink(sink) => write!(f, "Sink({})", sink.describe()),
            Self::SinkMissing => f.write_str("SinkMissing"),
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

impl Trigger {
    /// A trigger that answers the host (deferred or immediate delivery, by its configuration);
    /// [`Trigger::with_sink`] gives it a sink.
    pub fn new(
        config: FunctionConfig,
        app_name: &str,
        source: Arc<dyn Source>,
        store: Arc<dyn StateStore>,
        owner: String,
    ) -> Self {
        let ledger = Arc::new(Ledger::new(store, app_name, &config.name, Arc::new(SystemClock)));
        Self {
            delivery: Delivery::of(config.settings.delivery_mode),
            config,
            source,
            ledger,
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

    /// The function's configuration (plain data: the server decodes invocations against its retry policy).
    pub fn config(&self) -> &FunctionConfig {
        &self.config
    }

    /// The trigger's source, for tests and tools that drive it directly (the faces call the verbs above).
    pub fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }

    /// The sink this trigger delivers through, if it does.
    pub fn sink(&self) -> Option<&Arc<dyn Sink>> {
        match &self.delivery {
            Delivery::Sink(sink) => Some(sink),
            _ => None,
        }
    }

    pub fn state_key(&self) -> &str {
        self.ledger.key()
    }

    pub fn quarantine_prefix(&self) -> &str {
        self.ledger.quarantine_prefix()
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
        let outcome = self.tick(attempt).await?;
        let outputs = match &self.delivery {
            Delivery::Sink(_) => MappedOutputs::default(),
            _ => self.outputs(&outcome.changes),
        };
        Ok(Answer { outcome, outputs })
    }

    /// Runs one tick for the host's `attempt` within the function's time budget, by the trigger's delivery.
    pub async fn tick(&self, attempt: &Attempt) -> Result<TickOutcome, TickError> {
        match &self.delivery {
            Delivery::Sink(sink) => return self.tick_into(sink.as_ref()).await,
            Delivery::SinkMissing => return Err(TickError::SinkMissing(self.config.name.clone())),
            Delivery::Deferred | Delivery::Immediate => {}
        }
        let mut memory = self.memory.lock().await;
        // What a retry says about earlier answers is taken in before anything here can fail: if this tick fails
        // too (the store or the database is down), the batch it named stays owed in this process's memory, and
        // the next invocation answers it again.
        let named = match self.delivery {
            Delivery::Deferred => memory.answered.note(attempt, self.ledger.clock().now()),
            _ => decide::Named::Nothing,
        };
        let line = decide::named_line(&named, attempt, self.config.proof_window);
        if let Some(line) = &line {
            tracing::warn!(function = %self.config.name, invocation = %attempt.id, "{line}");
        }
        let mode = match self.delivery {
            Delivery::Deferred => Mode::Deferred(attempt),
            _ => Mode::Recorded(Acknowledge::AtOnce),
        };
        let mut result = self.timed(self.run(&mut memory, mode)).await;
        if let (Ok(out), Some(line)) = (result.as_mut(), line) {
            out.logs.insert(0, line);
        }
        result
    }

    /// Runs one tick in sink mode: fetch, record the batch in flight (CAS), deliver it to `sink`, acknowledge it
    /// (CAS). See `sink_tick` for the order and what each failure means.
    pub async fn tick_into(&self, sink: &dyn Sink) -> Result<TickOutcome, TickError> {
        let mut memory = self.memory.lock().await;
        self.timed(self.deliver_into(&mut memory, sink)).await
    }

    async fn deliver_into(&self, memory: &mut Memory, sink: &dyn Sink) -> Result<TickOutcome, TickError> {
        if let Some(out) = sink_tick::take_chained(self, memory) {
            return sink_tick::deliver(self, memory, sink, out).await;
        }
        let mode = Mode::Recorded(Acknowledge::AfterSink);
        let mut out = self.run(memory, mode).await?;
        if let Some(logs) = sink_tick::reconcile(self, memory, sink, &mut out).await? {
            // The document now starts where the destination ends: no second reconciliation.
            out = self.run(memory, mode).await?;
            out.logs.splice(0..0, logs);
        }
        sink_tick::deliver(self, memory, sink, out).await
    }

    /// On a clean stop of `handler run`: withdraws a chained batch never delivered (see `sink_tick`).
    pub async fn withdraw_chained(&self) -> Result<bool, TickError> {
        let mut memory = self.memory.lock().await;
        sink_tick::withdraw_chained(self, &mut memory).await
    }

    /// One tick, starting from the document this process wrote last when it has it.
    ///
    /// Skipping the read is safe because every decision a tick makes either ends in a conditional write, which
    /// fails if anyone (another instance, an operator) wrote since, or writes nothing and is then checked: a
    /// tick from the remembered document that wrote nothing reads the document, and its answer stands only if
    /// the etag is still the remembered one; otherwise the tick runs again on what was read. Nothing of a
    /// discarded run is observable: it answered nothing and recorded nothing. A delivering tick in a drain then
    /// costs one write instead of a read and a write; an empty tick still costs one read, so a pause, resume,
    /// reset or replay by an operator is seen at the next tick even on a quiet table.
    async fn run(&self, memory: &mut Memory, mode: Mode<'_>) -> Result<TickOutcome, TickError> {
        self.validated.get_or_try_init(|| self.source.validate()).await?;
        let Some((doc, etag)) = memory.written.take() else {
            if let Some((doc, etag)) = self.load().await? {
                return self.run_on(memory, doc, Some(etag), mode).await;
            }
            let start = self.source.start_position(self.config.source.start_from).await?;
            return self.run_on(memory, Tick::new_doc(self, start), None, mode).await;
        };
        let out = match self.run_on(memory, doc, Some(etag.clone()), mode).await {
            // A refusal read off the remembered document (a halt this process recorded, say) is decided again on
            // the stored one: an operator may have lifted it since, or another instance may have moved on (a
            // source that releases what a checkpoint passed then refuses the older position).
            Err(
                TickError::Halted { .. }
                | TickError::FingerprintChanged { .. }
                | TickError::Source(SourceError::PositionLost(_)),
            ) => {
                if let Some((doc, fresh)) = self.load().await? {
                    return self.run_on(memory, doc, Some(fresh), mode).await;
                }
                TickOutcome::default()
            }
            other => other?,
        };
        if out.committed.is_some() {
            return Ok(out);
        }
        match self.load().await? {
            Some((doc, fresh)) if fresh == etag => {
                memory.written = Some((doc, fresh));
                Ok(out)
            }
            Some((doc, fresh)) => {
                let line = "the state changed since this process last wrote it (another instance or an operator wrote); acting on the state as it is now";
                tracing::info!(function = %self.config.name, "{line}");
                let mut out = self.run_on(memory, doc, Some(fresh), mode).await?;
                out.logs.insert(0, line.to_string());
                Ok(out)
            }
            None => {
                let start = self.source.start_position(self.config.source.start_from).await?;
                self.run_on(memory, Tick::new_doc(self, start), None, mode).await
            }
        }
    }

    /// One tick on `doc` as read at `etag` (`None`: a document never written): the shared checks, then the
    /// delivery.
    async fn run_on(
        &self,
        memory: &mut Memory,
        doc: StateDoc,
        etag: Option<Etag>,
        mode: Mode<'_>,
    ) -> Result<TickOutcome, TickError> {
        let mut tick = match Tick::open(self, memory, doc, etag).await? {
            Opened::Ready(tick) => tick,
            Opened::Answered(out) => return Ok(*out),
        };
        match mode {
            Mode::Deferred(attempt) => host_tick::deferred(&mut tick, attempt).await?,
            Mode::Recorded(ack) => recorded::record(&mut tick, ack).await?,
        }
        Ok(tick.out)
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

    /// Tells `observer` about every later tick. Only the first observer set is kept: `false` if one was already.
    pub fn observe(&self, observer: Arc<dyn TickObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// What the last tick of this process did, and failures so far by kind.
    pub fn last_tick(&self) -> Option<TickStats> {
        let stats = self.stats.lock().expect("stats lock");
        (stats.ticks > 0).then(|| stats.clone())
    }
}

/// How a tick's batch is acknowledged: by proof (the host's deferred delivery), or recorded (immediate, or a
/// sink's record step).
#[derive(Debug, Clone, Copy)]
enum Mode<'a> {
    Deferred(&'a Attempt),
    Recorded(Acknowledge),
}
