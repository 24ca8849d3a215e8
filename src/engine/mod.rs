//! The engine: one lease-guarded, compare-and-swap-committed tick per invocation. Knows no SQL dialect and no
//! wire type.
//!
//! The parts, along the seams of a tick:
//! - [`document`]: the state document, every field, and who may set it;
//! - [`Ledger`]: the only reader and writer of the state and quarantine documents (typed, stamped, CAS);
//! - [`decide`]: the pure decisions, functions of the document, this process's memory, the invocation and
//!   `now` from the engine's clock: what a tick serves (`decide::serve`), acknowledge by proof, re-deliver,
//!   quarantine, lease, fence;
//! - `tick`: a tick as a value ([`tick::Tick`]): the document it started from, its etag, `now` and its answer,
//!   with the checks every delivery shares, `serve`, `commit`, `quarantine` and `halt`, and its end
//!   (`tick::Ended`: the answer and the document it wrote, what a sink's delivery goes on from);
//! - `fetch`: reading what a tick serves (new changes, live or a backfill's chunk; an operator's retry; a batch
//!   delivered before, again), for every delivery;
//! - `host_tick`: deferred delivery over a tick, acknowledged by proof (docs/architecture.md, "Acknowledge by
//!   proof");
//! - `recorded`: immediate delivery, and the recording step of a sink's tick, over a tick;
//! - `sink_tick`: the handler's own delivery: deliver, acknowledge; reconciliation, chaining, the heartbeat;
//! - `operate`: operator actions and status, over the ledger.
//!
//! What spans a function's partitions (ownership, balance, changing N, a group's status) is the partitions wing
//! (`crate::partitions`), above the engine.
//!
//! One invocation reads downward: `server.rs` → [`Trigger::invoke`] (this file: which delivery, the remembered
//! document) → `host_tick::deferred` (or `recorded::record`, `sink_tick::deliver`) → `fetch.rs` (what
//! `Tick::serve_*` said) → `tick.rs` (`commit`) → `ledger.rs`. No file calls back into the one that called it.
//!
//! A [`Trigger`] owns its delivery ([`Delivery`]): the host's output bindings (deferred or immediate), or a
//! sink. What the process remembers between ticks (the document it wrote last, the batches it answered, a batch
//! fetched ahead or chained) is one [`Memory`], held by the tick lock, so one tick at a time reads and changes it,
//! through its own methods only.

mod backfill;
pub mod decide;
pub mod document;
mod error;
mod fetch;
mod host_tick;
mod ledger;
mod observe;
pub mod operate;
mod outcome;
mod outputs;
mod parts;
mod recorded;
mod sink_tick;
mod tick;

pub use error::{ErrorKind, RetryDirective, TickError};
pub use ledger::{Ledger, Saved};
pub use observe::{TickObserver, TickRecord, TickStats};
pub use outcome::{Answer, OutcomeKind, Released, TickOutcome};
pub use outputs::MappedOutputs;
use parts::Memory;
pub use parts::{Delivery, Trigger};

use crate::change::Change;
use crate::clock::{Clock, SystemClock};
use crate::config::FunctionConfig;
use crate::protocol::Attempt;
use crate::sink::Sink;
use crate::source::{Source, SourceError};
use crate::state::{Etag, StateStore};
use document::StateDoc;
use recorded::Acknowledge;
use std::sync::Arc;
use tick::{Ended, Opened, Tick};
use tokio::sync::{Mutex, OnceCell};

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
        let ledger = Arc::new(Ledger::new(store, app_name, &config.state_name(), Arc::new(SystemClock)));
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
        self.memory.lock().await.unproven().clone()
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
            Delivery::SinkMissing => {
                let refused = TickError::SinkMissing(self.config.name.clone());
                return self.timed(async { Err(refused) }).await;
            }
            Delivery::Deferred | Delivery::Immediate => {}
        }
        let mut memory = self.memory.lock().await;
        // What a retry says about earlier answers is taken in before anything here can fail: if this tick fails
        // too (the store or the database is down), the batch it named stays owed in this process's memory, and
        // the next invocation answers it again.
        let named = match self.delivery {
            Delivery::Deferred => memory.invoked(attempt, self.ledger.clock().now()),
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
        let mut result = self.timed(async { Ok(self.run(&mut memory, mode).await?.out) }).await;
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
        let mut out = match sink_tick::take_chained(self, memory) {
            Some(chained) => sink_tick::deliver(self, memory, sink, chained).await?,
            None => {
                let mode = Mode::Recorded(Acknowledge::AfterSink);
                let mut recorded = self.run(memory, mode).await?;
                if let Some(logs) = sink_tick::reconcile(self, memory, sink, &mut recorded).await? {
                    // The document now starts where the destination ends: no second reconciliation.
                    recorded = self.run(memory, mode).await?;
                    recorded.out.logs.splice(0..0, logs);
                }
                sink_tick::deliver(self, memory, sink, recorded).await?
            }
        };
        // Read off the document this process holds (written or read last): no store operation.
        out.backfill_running = memory
            .last_written()
            .is_some_and(|(doc, _)| doc.backfill().is_some_and(|b| b.state == document::BackfillState::Running));
        Ok(out)
    }

    /// On a clean stop of `handler run`: withdraws a chained batch never delivered (see `sink_tick`).
    pub async fn withdraw_chained(&self) -> Result<bool, TickError> {
        let mut memory = self.memory.lock().await;
        sink_tick::withdraw_chained(self, &mut memory).await
    }

    /// On a clean stop of `handler run`, after the last tick: withdraws a chained batch never delivered, then lets
    /// this process's lease on the state document lapse, so the next process, or `handler partitions change`,
    /// need not wait it out. A batch delivered and not acknowledged stays in flight: whoever comes next delivers
    /// it again at once.
    pub async fn release_on_stop(&self) -> Result<Released, TickError> {
        let mut memory = self.memory.lock().await;
        let withdrew = sink_tick::withdraw_chained(self, &mut memory).await?;
        let released = sink_tick::release_lease(self, &mut memory).await?;
        Ok(Released { withdrew, released })
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
    async fn run(&self, memory: &mut Memory, mode: Mode<'_>) -> Result<Ended, TickError> {
        self.validated.get_or_try_init(|| self.source.validate()).await?;
        let Some((doc, etag)) = memory.take_written() else {
            if let Some((doc, etag)) = self.load().await? {
                return self.run_on(memory, doc, Some(etag), mode).await;
            }
            return self.run_on(memory, backfill::first_doc(self).await?, None, mode).await;
        };
        let ended = match self.run_on(memory, doc, Some(etag.clone()), mode).await {
            // A refusal read off the remembered document (a halt this process recorded, say) is decided again on
            // the stored one: an operator may have lifted it since, or another instance may have moved on (a
            // source that releases what a checkpoint passed then refuses the older position).
            Err(
                TickError::Halted { .. }
                | TickError::Retired { .. }
                | TickError::FingerprintChanged { .. }
                | TickError::Source(SourceError::PositionLost(_)),
            ) => {
                if let Some((doc, fresh)) = self.load().await? {
                    return self.run_on(memory, doc, Some(fresh), mode).await;
                }
                Ended { out: TickOutcome::default(), written: None }
            }
            other => other?,
        };
        if ended.written.is_some() {
            return Ok(ended);
        }
        match self.load().await? {
            Some((doc, fresh)) if fresh == etag => {
                memory.unchanged(doc, fresh);
                Ok(ended)
            }
            Some((doc, fresh)) => {
                let line = "the state changed since this process last wrote it (another instance or an operator wrote); acting on the state as it is now";
                tracing::info!(function = %self.config.name, "{line}");
                let mut ended = self.run_on(memory, doc, Some(fresh), mode).await?;
                ended.out.logs.insert(0, line.to_string());
                Ok(ended)
            }
            None => self.run_on(memory, backfill::first_doc(self).await?, None, mode).await,
        }
    }

    /// One tick on `doc` as read at `etag` (`None`: a document never written): the shared checks, then the
    /// delivery; its end is what it answers and what it wrote.
    async fn run_on(
        &self,
        memory: &mut Memory,
        doc: StateDoc,
        etag: Option<Etag>,
        mode: Mode<'_>,
    ) -> Result<Ended, TickError> {
        let mut tick = match Tick::open(self, memory, doc, etag).await? {
            Opened::Ready(tick) => tick,
            Opened::Answered(out) => return Ok(Ended { out: *out, written: None }),
        };
        match mode {
            Mode::Deferred(attempt) => host_tick::deferred(&mut tick, attempt).await?,
            Mode::Recorded(ack) => recorded::record(&mut tick, ack).await?,
        }
        Ok(tick.end())
    }

    /// Runs a tick's work within the function's time budget and records what it did (stats, observer).
    /// Called with the tick lock held.
    async fn timed(
        &self,
        work: impl std::future::Future<Output = Result<TickOutcome, TickError>>,
    ) -> Result<TickOutcome, TickError> {
        {
            let now = self.ledger.clock().now();
            let mut stats = self.stats.lock().expect("stats lock");
            stats.last_invocation_at = Some(now);
            // A trigger nobody watched yet counts from its first tick.
            stats.watched_since.get_or_insert(now);
        }
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
        let now = self.ledger.clock().now();
        stats.at = Some(now);
        stats.duration_ms = duration.as_secs_f64() * 1000.0;
        stats.store_operations = store_operations;
        match result {
            Ok(mut outcome) => {
                outcome.store_operations = store_operations;
                stats.rows = outcome.changes.len();
                stats.outcome = format!("{:?}", outcome.kind);
                stats.last_success_at = Some(now);
                stats.consecutive_failures = 0;
                stats.stopped = (outcome.kind == OutcomeKind::Paused).then_some("paused");
                Ok(outcome)
            }
            Err(e) => {
                stats.rows = 0;
                stats.outcome = "Failed".into();
                stats.consecutive_failures += 1;
                stats.stopped = match e {
                    TickError::Halted { .. } => Some("halted"),
                    TickError::Retired { .. } => Some("retired"),
                    _ => None,
                };
                match e.kind() {
                    ErrorKind::Transient => stats.failures_transient += 1,
                    ErrorKind::Operator => stats.failures_operator += 1,
                }
                Err(e)
            }
        }
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

    /// `handler run` with partitions: this process does not run this partition now (another process owns it,
    /// or nobody yet), so its quiet is expected and the watchdog says nothing. The next tick clears it.
    pub fn mark_owned_elsewhere(&self) {
        self.stats.lock().expect("stats lock").stopped = Some(OWNED_ELSEWHERE);
    }

    /// What this process heard from the function's ticks, for the watchdog, status and metrics. The first call
    /// fixes `watched_since` (the baseline while nothing was heard) at the trigger's `now`.
    pub fn liveness(&self) -> decide::liveness::Heard {
        let now = self.ledger.clock().now();
        let mut stats = self.stats.lock().expect("stats lock");
        stats.watched_since.get_or_insert(now);
        stats.heard(self.budget()).expect("watched since now")
    }

    /// What this process heard, if it ticked or watches the function; `None` in a process that does neither
    /// (`handler state status` runs no ticks: its "seconds since" would be counted from its own start).
    pub fn heard(&self) -> Option<decide::liveness::Heard> {
        self.stats.lock().expect("stats lock").heard(self.budget())
    }

    /// A tick's time budget (`Sql_Trigger_TickTimeoutMs`).
    fn budget(&self) -> time::Duration {
        time::Duration::try_from(self.config.settings.tick_timeout).unwrap_or(time::Duration::MAX)
    }

    /// The trigger's `now` (its clock: the system's, or a test's).
    pub fn now(&self) -> time::OffsetDateTime {
        self.ledger.clock().now()
    }

    /// What the last tick of this process did, and failures so far by kind.
    pub fn last_tick(&self) -> Option<TickStats> {
        let stats = self.stats.lock().expect("stats lock");
        (stats.ticks > 0).then(|| stats.clone())
    }
}

/// Why a partition trigger of `handler run` does not tick in this process ([`Trigger::mark_owned_elsewhere`]).
pub const OWNED_ELSEWHERE: &str = "owned by another process";

/// How a tick's batch is acknowledged: by proof (the host's deferred delivery), or recorded (immediate, or a
/// sink's record step).
#[derive(Debug, Clone, Copy)]
enum Mode<'a> {
    Deferred(&'a Attempt),
    Recorded(Acknowledge),
}
