//! The engine: one lease-guarded, compare-and-swap-committed tick per invocation. Knows no SQL dialect.
//!
//! # Why a tick is ordered the way it is (deferred delivery, the default)
//! The host writes output bindings *after* the handler answers and never tells the handler whether that
//! write worked; a failed write shows up only as a retry that names the failed attempt. So every batch
//! answered is remembered by the process that answered it, and acknowledged (the checkpoint moves past it)
//! only by proof (`proof`, and docs/architecture.md, "Acknowledge by proof"):
//! 1. Load the state (1 read, or none: the document this process wrote last). Refuse if the source's
//!    fingerprint changed, answer empty if paused or if another instance's unexpired lease covers the batches
//!    in flight.
//! 2. Batches in flight that this process does not remember (answered by another instance, or by this one
//!    before a restart) cannot be proven: they are all delivered again from the checkpoint.
//! 3. The checkpoint moves over the batches proven written: answered a proof window ago, with no retry naming
//!    them since. A batch a retry named (or answered on the host's final attempt) is owed: it is answered
//!    again first; at `MaxAttempts` known failures lasting `PoisonAfterMs` it is quarantined (or the function
//!    halts).
//! 4. Otherwise fetch up to `MaxBatchSize` changes after the last batch answered.
//! 5. One conditional write records the span in flight, the checkpoint and the lease. A conflict means
//!    another tick moved first: deliver nothing, answer empty. Nothing to record: no write.
//!
//! `immediate` delivery commits the checkpoint before answering instead (at-most-once if the host's write
//! fails). `sink` delivery (`sink_mode`) records the batch, hands it to the handler's own sink and
//! acknowledges it in the same tick; a batch it finds in flight is always delivered again.

mod error;
pub mod failpoint;
mod host_tick;
mod observe;
mod outputs;
pub mod proof;
mod sink_mode;
pub mod state;

pub use error::{ErrorKind, TickError};
pub use observe::{TickObserver, TickRecord};
pub use outputs::MappedOutputs;
pub use proof::PROOF_SLACK;

use crate::change::{encode_batch, Change};
use crate::clock::{Clock, SystemClock};
use crate::config::{DeliveryMode, FunctionConfig, PoisonAction};
use crate::protocol::Attempt;
use crate::source::{Position, Source};
use crate::state::{Etag, StateStore, StoreError};
use state::{InFlight, Lease, QuarantineDoc, QuarantineEntry, StateDoc, QUARANTINE_KEPT, SCHEMA};
use std::sync::Arc;
use time::OffsetDateTime;
use tokio::sync::{Mutex, OnceCell};

/// How often an empty tick may record a source's proven-empty position (`Fetched::advance`).
const ADVANCE_EVERY: time::Duration = time::Duration::minutes(5);

/// Who drives a tick, and so how its batch is acknowledged.
#[derive(Debug, Clone, Copy)]
enum Via<'a> {
    /// The host's invocation, in deferred delivery: acknowledged by proof (`host_tick`).
    Host(&'a Attempt),
    /// The host's invocation, in immediate delivery: acknowledged before answering.
    Immediate,
    /// A sink tick (`sink_mode`, and every tick of `handler run`): acknowledged after the sink took it.
    Sink,
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

/// The trigger of one function: its configuration, source, store and this process's memory of what it
/// answered.
#[derive(Debug)]
pub struct Trigger {
    config: FunctionConfig,
    source: Arc<dyn Source>,
    store: Arc<dyn StateStore>,
    key: String,
    quarantine_prefix: String,
    /// This process's identity in leases. A restart is a new owner, on purpose: a new process cannot know
    /// whether the old one's last answer reached the host.
    owner: String,
    clock: Arc<dyn Clock>,
    /// One tick at a time per function in this process; a concurrent invocation waits its turn.
    lock: Mutex<()>,
    /// Deferred delivery: the batches this process answered to the host and has not proven written (`proof`).
    answered: std::sync::Mutex<proof::Answered>,
    validated: OnceCell<()>,
    stats: std::sync::Mutex<TickStats>,
    /// Told about every tick (metrics); set at most once, after start-up.
    observer: std::sync::OnceLock<Arc<dyn TickObserver>>,
    /// Sink mode: the batch after the one being delivered, fetched while the sink wrote (see `sink_mode`).
    ahead: std::sync::Mutex<Option<sink_mode::Ahead>>,
    /// Sink mode: the batch recorded in flight by the previous tick's acknowledgement, to deliver next.
    chained: std::sync::Mutex<Option<sink_mode::Chained>>,
    /// The document this process wrote last and its etag, so the next tick need not read it back (see
    /// `tick_inner`). Taken at the start of a tick: any failure leaves it empty and the next tick reads.
    written: std::sync::Mutex<Option<(StateDoc, Etag)>>,
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
    pub fn new(
        config: FunctionConfig,
        app_name: &str,
        source: Arc<dyn Source>,
        store: Arc<dyn StateStore>,
        owner: String,
    ) -> Self {
        let key = format!("{app_name}/{}.json", config.name);
        let quarantine_prefix = format!("{app_name}/{}/quarantine/", config.name);
        Self {
            config,
            source,
            store,
            key,
            quarantine_prefix,
            owner,
            clock: Arc::new(SystemClock),
            lock: Mutex::new(()),
            answered: std::sync::Mutex::new(proof::Answered::default()),
            validated: OnceCell::new(),
            stats: std::sync::Mutex::new(TickStats::default()),
            observer: std::sync::OnceLock::new(),
            ahead: std::sync::Mutex::new(None),
            chained: std::sync::Mutex::new(None),
            written: std::sync::Mutex::new(None),
        }
    }

    /// Reads the time from `clock` instead of the system's (tests).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// The batches this process answered and has not proven written (deferred delivery), for status.
    pub fn unproven(&self) -> proof::Answered {
        self.answered.lock().expect("answered lock").clone()
    }

    pub fn config(&self) -> &FunctionConfig {
        &self.config
    }

    pub fn source(&self) -> &Arc<dyn Source> {
        &self.source
    }

    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    pub fn state_key(&self) -> &str {
        &self.key
    }

    pub fn quarantine_prefix(&self) -> &str {
        &self.quarantine_prefix
    }

    /// Maps a batch onto this function's output bindings, counting the deletes a binding could not receive.
    pub fn outputs(&self, changes: &[Change]) -> MappedOutputs {
        let mapped = outputs::map(&self.config.output_routes(), changes);
        self.stats.lock().expect("stats lock").deletes_not_sent += mapped.deletes_not_sent();
        mapped
    }

    /// Runs one tick for the host's `attempt` within the function's time budget.
    pub async fn tick(&self, attempt: &Attempt) -> Result<TickOutcome, TickError> {
        let _one_at_a_time = self.lock.lock().await;
        // What a retry says about earlier answers is taken in before anything here can fail: if this tick fails
        // too (the store or the database is down), the batch it named stays owed in this process's memory, and
        // the next invocation answers it again.
        let named = match self.config.settings.delivery_mode {
            DeliveryMode::Deferred => self.answered.lock().expect("answered lock").note(attempt, self.clock.now()),
            DeliveryMode::Immediate | DeliveryMode::Sink => proof::Named::Nothing,
        };
        let line = match named {
            proof::Named::Batch(batch_id) => Some(format!(
                "the host retried after the write of batch {batch_id} failed (attempt {}): delivering it again",
                attempt.retry.as_ref().map_or(0, |r| r.retry_count)
            )),
            proof::Named::Late(batch_id) => Some(format!(
                "the host retried after the write of batch {batch_id} failed, later than the proof window ({} ms) assumed: delivering it again; raise Sql_Trigger_ProofWindowMs (or leave it unset) so a host restart in between cannot lose such a batch",
                self.config.proof_window.as_millis()
            )),
            proof::Named::Unnamed => Some(
                "the host retried without naming the attempt that failed: every batch not yet proven is delivered again"
                    .to_string(),
            ),
            proof::Named::Nothing | proof::Named::NoBatch => None,
        };
        if let Some(line) = &line {
            tracing::warn!(function = %self.config.name, invocation = %attempt.id, "{line}");
        }
        let via = match self.config.settings.delivery_mode {
            DeliveryMode::Deferred => Via::Host(attempt),
            DeliveryMode::Immediate => Via::Immediate,
            DeliveryMode::Sink => Via::Sink,
        };
        let mut result = self.timed(self.tick_inner(via)).await;
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
        let ops_before = self.store.operations();
        let budget = self.config.settings.tick_timeout;
        let result = match tokio::time::timeout(budget, work).await {
            Ok(result) => result,
            Err(_) => Err(TickError::Timeout(budget)),
        };
        let store_operations = self.store.operations() - ops_before;
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
        stats.at = Some(self.clock.now());
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

    /// A sink refused batch `batch_id`, delivered under lease token `ours`, as fenced: it has seen token
    /// `stored` from a newer owner. If the state document (`doc` as read or written at `etag`) still gives this
    /// instance the lease under `ours` and holds the batch in flight for it, no owner of this document wrote
    /// under a larger token: the destination's token comes from an earlier document (deleted, lost, or restored
    /// from a copy, so its tokens started again at 1). Then the token goes above the destination's with one
    /// conditional write, and the answer is the token to deliver the same batch under again (not counted as a
    /// failure). `None`: this instance was deposed, or the state moved on; it delivers nothing more of the batch.
    pub(super) async fn raise_fence_on(
        &self,
        mut doc: StateDoc,
        etag: &Etag,
        batch_id: u64,
        ours: u64,
        stored: u64,
    ) -> Result<Option<u64>, TickError> {
        let holds = doc.lease.as_ref().is_some_and(|lease| lease.token == ours && lease.owner == self.owner);
        let in_flight = doc.in_flight.as_ref().is_some_and(|f| f.batch_id == batch_id && f.owner == self.owner);
        if stored <= ours || !holds || !in_flight {
            return Ok(None);
        }
        let token = stored + 1;
        let now = self.clock.now();
        if let Some(lease) = doc.lease.as_mut() {
            lease.token = token;
            lease.expires_at = lease.expires_at.max(now + self.config.settings.lease_duration);
        }
        let mut out = TickOutcome::default();
        if !self.commit(&mut doc, Some(etag), &mut out).await? {
            return Ok(None);
        }
        tracing::warn!(function = %self.config.name, batch_id,
            "the sink holds fencing token {stored}, above this state document's {ours}, which no owner of this document wrote: the document is newer than the sink's record (deleted, lost or restored, its tokens restarted); delivering under token {token}");
        Ok(Some(token))
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
        let _one_at_a_time = self.lock.lock().await;
        self.validated.get_or_try_init(|| self.source.validate()).await?;
        if let Some((doc, _)) = self.load().await? {
            if doc.fingerprint != self.source.fingerprint() {
                return Err(TickError::FingerprintChanged {
                    function: self.config.name.clone(),
                    stored: doc.fingerprint,
                    configured: self.source.fingerprint(),
                });
            }
        }
        Ok(())
    }

    /// What the last tick of this process did, and failures so far by kind.
    pub fn last_tick(&self) -> Option<TickStats> {
        let stats = self.stats.lock().expect("stats lock");
        (stats.ticks > 0).then(|| stats.clone())
    }

    /// One tick, starting from the document this process wrote last when it has it.
    ///
    /// Skipping the read is safe because every decision a tick makes either ends in a conditional write,
    /// which fails if anyone (another instance, an operator) wrote since, or writes nothing and is then
    /// checked: a tick from the remembered document that wrote nothing reads the document, and its answer
    /// stands only if the etag is still the remembered one; otherwise the tick runs again on what was read.
    /// Nothing of a discarded run is observable: it answered nothing and recorded nothing. A delivering tick
    /// in a drain then costs one write instead of a read and a write; an empty tick still costs one read, so
    /// a pause, resume, reset or replay by an operator is seen at the next tick even on a quiet table.
    async fn tick_inner(&self, via: Via<'_>) -> Result<TickOutcome, TickError> {
        self.validated.get_or_try_init(|| self.source.validate()).await?;
        let remembered = self.written.lock().expect("written lock").take();
        if let Some((doc, etag)) = remembered {
            let out = match self.tick_on(doc, Some(etag.clone()), via).await {
                // A refusal read off the remembered document (a halt this process recorded, say) is decided
                // again on the stored one: an operator may have lifted it since.
                Err(TickError::Halted { .. } | TickError::FingerprintChanged { .. }) => {
                    if let Some((doc, fresh)) = self.load().await? {
                        return self.tick_on(doc, Some(fresh), via).await;
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
                    *self.written.lock().expect("written lock") = Some((doc, fresh));
                    return Ok(out);
                }
                Some((doc, fresh)) => {
                    let line = "the state changed since this process last wrote it (another instance or an operator wrote); acting on the state as it is now";
                    tracing::info!(function = %self.config.name, "{line}");
                    let mut out = self.tick_on(doc, Some(fresh), via).await?;
                    out.logs.insert(0, line.to_string());
                    return Ok(out);
                }
                None => {}
            }
        } else if let Some((doc, etag)) = self.load().await? {
            return self.tick_on(doc, Some(etag), via).await;
        }
        let start = self.source.start_position(self.config.source.start_from).await?;
        self.tick_on(self.new_doc(start), None, via).await
    }

    /// One tick on `doc` as read at `etag` (`None`: a document never written).
    async fn tick_on(&self, doc: StateDoc, etag: Option<Etag>, via: Via<'_>) -> Result<TickOutcome, TickError> {
        let mut out = TickOutcome::default();
        // A document that was never written must be written even if the tick delivers nothing, so that a
        // `startFrom: now` position is fixed at the first tick rather than moving with every tick.
        let dirty = etag.is_none();

        if doc.fingerprint != self.source.fingerprint() {
            return Err(TickError::FingerprintChanged {
                function: self.config.name.clone(),
                stored: doc.fingerprint.clone(),
                configured: self.source.fingerprint(),
            });
        }
        if let Some(reason) = &doc.halted {
            return Err(TickError::Halted { function: self.config.name.clone(), reason: reason.clone() });
        }
        if doc.paused {
            out.kind = OutcomeKind::Paused;
            out.logs.push("function is paused by an operator; answering an empty batch".into());
            return Ok(out);
        }
        let now = self.clock.now();
        if let (Some(lease), Some(_)) = (&doc.lease, &doc.in_flight) {
            if lease.owner != self.owner && lease.expires_at > now {
                // Another instance took the batches in flight over (this process's lease lapsed): it delivers
                // them all again, so nothing this process remembers is still its to prove.
                *self.answered.lock().expect("answered lock") = proof::Answered::default();
                out.kind = OutcomeKind::LeaseHeld;
                out.logs.push(format!(
                    "batch in flight belongs to {} until {}; answering an empty batch",
                    lease.owner, lease.expires_at
                ));
                return Ok(out);
            }
        }
        match via {
            Via::Host(attempt) => self.deferred_tick(doc, etag, attempt, now, dirty, out).await,
            Via::Immediate | Via::Sink => self.recorded_tick(doc, etag, via, now, dirty, out).await,
        }
    }

    /// The tick of the modes that do not wait for the host's proof: `sink`, whose tick delivers and
    /// acknowledges by itself, and `immediate`, which acknowledges before answering. A batch found in flight
    /// (a sink tick that did not finish, another instance's) is always delivered again.
    async fn recorded_tick(
        &self,
        mut doc: StateDoc,
        etag: Option<Etag>,
        via: Via<'_>,
        now: OffsetDateTime,
        mut dirty: bool,
        mut out: TickOutcome,
    ) -> Result<TickOutcome, TickError> {
        if let Some(flight) = doc.in_flight.clone() {
            {
                let failures = flight.failures;
                if failures < self.config.settings.max_attempts {
                    let why = if flight.owner != self.owner {
                        format!("it was answered by {} and its outcome is unknown", flight.owner)
                    } else {
                        "its delivery was not acknowledged".to_string()
                    };
                    return self.redeliver(doc, etag, via, flight, failures, why, out).await;
                }
                self.poison(&mut doc, &flight, failures, &mut out).await?;
                if let Some(reason) = doc.halted.clone() {
                    // Record the halt so every instance stops; a conflict means someone else decided first,
                    // and the next tick acts on what they decided.
                    if !self.commit(&mut doc, etag.as_ref(), &mut out).await? {
                        return Ok(out);
                    }
                    return Err(TickError::Halted { function: self.config.name.clone(), reason });
                }
                dirty = true;
            }
        }

        // A quarantined batch an operator asked to retry goes before new changes; it does not move the
        // checkpoint, which passed it when it was quarantined.
        let mut fetched_advance = None;
        let (batch, quarantined) = match doc.retry_quarantined.first().copied() {
            Some(batch_id) => {
                doc.retry_quarantined.remove(0);
                dirty = true;
                let (key, q) = self.load_quarantined(batch_id).await?;
                let changes =
                    q.decode_changes().map_err(|detail| TickError::CorruptState { key: key.clone(), detail })?;
                let fetched = crate::source::Fetched { changes, last: Some(q.to.clone()), advance: None };
                (Some((fetched, q.from)), Some(key))
            }
            None => {
                let mut fetched = match self.take_ahead(&doc.checkpoint) {
                    Some(fetched) => fetched,
                    None => self.source.fetch(&doc.checkpoint, self.config.settings.max_batch_size).await?,
                };
                fetched_advance = fetched.advance.take();
                let from = doc.checkpoint.clone();
                (Some((fetched, from)), None)
            }
        };
        let Some((fetched, from)) = batch.filter(|(f, _)| !f.changes.is_empty()) else {
            if let Some(advance) = fetched_advance {
                // Now and then, not every empty tick: an empty tick should cost one read.
                let stale = doc.progress_at.is_none_or(|at| now - at >= ADVANCE_EVERY);
                if stale && doc.in_flight.is_none() && advance != doc.checkpoint {
                    doc.checkpoint = advance;
                    doc.progress_at = Some(now);
                    dirty = true;
                }
            }
            if dirty {
                self.commit(&mut doc, etag.as_ref(), &mut out).await?;
            }
            return Ok(out);
        };
        failpoint::hit("after-fetch");
        let last = fetched.last.clone().unwrap_or(Position::Null);

        let batch_id = doc.next_batch_id;
        doc.next_batch_id += 1;
        let flight = InFlight {
            batch_id,
            from,
            to: last,
            rows: fetched.changes.len() as u64,
            deliveries: 1,
            failures: 0,
            owner: self.owner.clone(),
            final_attempt: false,
            first_delivered_at: now,
            last_delivered_at: now,
            quarantined,
            batches: 1,
            failing_since: None,
        };
        self.record_delivery(&mut doc, flight, via, now);
        if !self.commit(&mut doc, etag.as_ref(), &mut out).await? {
            return Ok(out);
        }
        failpoint::hit("after-commit");
        out.fence = doc.lease.as_ref().map_or(0, |l| l.token);
        out.kind = OutcomeKind::Delivered;
        out.batch_id = Some(batch_id);
        out.logs.push(format!("delivering batch {batch_id} with {} change(s)", fetched.changes.len()));
        out.changes = fetched.changes;
        Ok(out)
    }

    /// Records that `flight` is being delivered: in flight under a lease (a sink's tick), or acknowledged at
    /// once (immediate: the mode's at-most-once promise).
    fn record_delivery(&self, doc: &mut StateDoc, flight: InFlight, via: Via<'_>, now: OffsetDateTime) {
        match via {
            Via::Immediate => acknowledge(doc, &flight, now),
            Via::Sink | Via::Host(_) => {
                doc.in_flight = Some(flight);
                self.take_lease(doc, now);
            }
        }
    }

    /// Sends a batch in flight again: the same range as the rows are now, or the stored changes of a
    /// quarantined batch.
    #[allow(clippy::too_many_arguments)]
    async fn redeliver(
        &self,
        mut doc: StateDoc,
        etag: Option<Etag>,
        via: Via<'_>,
        flight: InFlight,
        failures: u32,
        why: String,
        mut out: TickOutcome,
    ) -> Result<TickOutcome, TickError> {
        let now = self.clock.now();
        let changes = self.changes_of(&flight).await?;
        if flight.owner != self.owner {
            doc.counters.takeovers += 1;
        }
        doc.counters.redelivered += 1;
        let again = InFlight {
            owner: self.owner.clone(),
            deliveries: flight.deliveries + 1,
            failures,
            final_attempt: false,
            last_delivered_at: now,
            ..flight.clone()
        };
        self.record_delivery(&mut doc, again, via, now);
        if !self.commit(&mut doc, etag.as_ref(), &mut out).await? {
            return Ok(out);
        }
        out.fence = doc.lease.as_ref().map_or(0, |l| l.token);
        out.logs.push(format!(
            "re-delivering batch {} with {} change(s) because {why} (delivery {}, {failures} known failure(s))",
            flight.batch_id,
            changes.len(),
            flight.deliveries + 1
        ));
        out.kind = OutcomeKind::Redelivered;
        out.batch_id = Some(flight.batch_id);
        out.changes = changes;
        Ok(out)
    }

    /// The changes of a batch in flight, as they are now.
    async fn changes_of(&self, flight: &InFlight) -> Result<Vec<Change>, TickError> {
        if let Some(key) = &flight.quarantined {
            let doc = self.load_quarantine_key(key).await?;
            return doc.decode_changes().map_err(|detail| TickError::CorruptState { key: key.clone(), detail });
        }
        let limit = (flight.rows as usize).max(self.config.settings.max_batch_size);
        Ok(self.source.refetch(&flight.from, &flight.to, limit).await?.changes)
    }

    /// The store key of a quarantined batch's document.
    pub fn quarantine_key(&self, batch_id: u64) -> String {
        format!("{}{:020}.json", self.quarantine_prefix, batch_id)
    }

    async fn load_quarantined(&self, batch_id: u64) -> Result<(String, QuarantineDoc), TickError> {
        let key = self.quarantine_key(batch_id);
        let doc = self.load_quarantine_key(&key).await?;
        Ok((key, doc))
    }

    /// Reads a quarantine document.
    pub async fn load_quarantine_key(&self, key: &str) -> Result<QuarantineDoc, TickError> {
        let Some(v) = self.store.load(key).await? else {
            return Err(TickError::CorruptState {
                key: key.to_string(),
                detail: "the quarantine document is missing".into(),
            });
        };
        serde_json::from_slice(&v.bytes)
            .map_err(|e| TickError::CorruptState { key: key.to_string(), detail: e.to_string() })
    }

    /// A batch that failed `MaxAttempts` times: quarantine it and move on, or halt.
    async fn poison(
        &self,
        doc: &mut StateDoc,
        flight: &InFlight,
        failures: u32,
        out: &mut TickOutcome,
    ) -> Result<(), TickError> {
        let reason = format!("batch {} failed {failures} time(s) (Sql_Trigger_MaxAttempts)", flight.batch_id);
        if self.config.settings.poison_action == PoisonAction::Halt {
            let message = format!("{reason}; halted at it (Sql_Trigger_PoisonAction=halt)");
            tracing::error!(function = %self.config.name, batch_id = flight.batch_id, "{message}");
            doc.halted = Some(message);
            return Ok(());
        }
        let now = self.clock.now();
        if let Some(key) = &flight.quarantined {
            // A quarantined batch an operator retried failed again: it stays where it is.
            doc.in_flight = None;
            let line = format!("{reason}; it was a retry of quarantined {key} and stays quarantined");
            tracing::error!(function = %self.config.name, batch_id = flight.batch_id, key = %key, "{line}");
            out.logs.push(line);
            return Ok(());
        }
        let changes = self.changes_of(flight).await?;
        let key = self.quarantine_key(flight.batch_id);
        let body = QuarantineDoc {
            function: self.config.name.clone(),
            batch_id: flight.batch_id,
            from: flight.from.clone(),
            to: flight.to.clone(),
            failures,
            reason: reason.clone(),
            at: now,
            changes: encode_batch(&changes),
        };
        let bytes = serde_json::to_vec(&body).expect("quarantine documents serialize");
        match self.store.save_if(&key, &bytes, None).await {
            // An earlier tick wrote it and then lost the race to commit: the document is already there.
            Ok(_) | Err(StoreError::Conflict) => {}
            Err(e) => return Err(e.into()),
        }
        doc.checkpoint = flight.to.clone();
        doc.in_flight = None;
        doc.counters.quarantined += 1;
        doc.quarantine.push(QuarantineEntry {
            batch_id: flight.batch_id,
            key: key.clone(),
            rows: changes.len() as u64,
            from: flight.from.clone(),
            to: flight.to.clone(),
            at: now,
        });
        if doc.quarantine.len() > QUARANTINE_KEPT {
            let excess = doc.quarantine.len() - QUARANTINE_KEPT;
            doc.quarantine.drain(..excess);
        }
        let line = format!("{reason}; quarantined {} change(s) to {key} and moving on", changes.len());
        tracing::error!(function = %self.config.name, batch_id = flight.batch_id, key = %key, "{line}");
        out.logs.push(line);
        Ok(())
    }

    fn take_lease(&self, doc: &mut StateDoc, now: OffsetDateTime) {
        let token = match &doc.lease {
            Some(l) if l.owner == self.owner => l.token,
            Some(l) => l.token + 1,
            None => 1,
        };
        let expires_at = now + self.config.settings.lease_duration;
        doc.lease = Some(Lease { owner: self.owner.clone(), token, expires_at });
    }

    /// Writes the document if it is still at `etag`. `Ok(false)`: another tick moved first, and `out` says so.
    async fn commit(&self, doc: &mut StateDoc, etag: Option<&Etag>, out: &mut TickOutcome) -> Result<bool, TickError> {
        let bytes = stamp(doc, &self.owner, self.clock.now());
        match self.store.save_if(&self.key, &bytes, etag).await {
            Ok(etag) => {
                *self.written.lock().expect("written lock") = Some((doc.clone(), etag.clone()));
                out.committed = Some((doc.clone(), etag));
                Ok(true)
            }
            Err(StoreError::Conflict) => {
                *self.written.lock().expect("written lock") = None;
                out.kind = OutcomeKind::Conflict;
                out.changes.clear();
                out.logs
                    .push("another tick committed first (state changed since it was read); delivering nothing".into());
                tracing::info!(function = %self.config.name, "state conflict: another tick committed first");
                Ok(false)
            }
            Err(e) => {
                *self.written.lock().expect("written lock") = None;
                Err(e.into())
            }
        }
    }

    /// Reads and parses the state document.
    pub async fn load(&self) -> Result<Option<(StateDoc, Etag)>, TickError> {
        let Some(v) = self.store.load(&self.key).await? else { return Ok(None) };
        let doc: StateDoc = serde_json::from_slice(&v.bytes)
            .map_err(|e| TickError::CorruptState { key: self.key.clone(), detail: e.to_string() })?;
        if doc.schema > SCHEMA {
            return Err(TickError::CorruptState {
                key: self.key.clone(),
                detail: format!(
                    "schema {} is newer than this handler understands ({SCHEMA}); upgrade the handler",
                    doc.schema
                ),
            });
        }
        Ok(Some((doc, v.etag)))
    }

    /// A fresh document positioned at `checkpoint`.
    pub fn new_doc(&self, checkpoint: Position) -> StateDoc {
        StateDoc {
            schema: SCHEMA,
            function: self.config.name.clone(),
            source: self.source.name(),
            fingerprint: self.source.fingerprint(),
            checkpoint,
            in_flight: None,
            lease: None,
            paused: false,
            halted: None,
            next_batch_id: 1,
            counters: Default::default(),
            quarantine: Vec::new(),
            retry_quarantined: Vec::new(),
            progress_at: None,
            write_id: String::new(),
            updated_at: self.clock.now(),
            updated_by: self.owner.clone(),
        }
    }
}

/// Marks a write of `doc` by `owner` (a fresh `write_id`, so no two writes are byte-identical) and
/// serializes it.
fn stamp(doc: &mut StateDoc, owner: &str, now: OffsetDateTime) -> Vec<u8> {
    doc.write_id = uuid::Uuid::new_v4().to_string();
    doc.updated_at = now;
    doc.updated_by = owner.to_string();
    serde_json::to_vec(doc).expect("state documents serialize")
}

/// Marks `flight` delivered: the checkpoint moves to its end unless it was a retry of a quarantined batch
/// (the checkpoint passed that one when it was quarantined).
fn acknowledge(doc: &mut StateDoc, flight: &InFlight, now: OffsetDateTime) {
    if flight.quarantined.is_none() {
        doc.checkpoint = flight.to.clone();
    }
    doc.counters.delivered += flight.rows;
    doc.counters.batches += 1;
    doc.in_flight = None;
    doc.progress_at = Some(now);
}
