//! The engine: one lease-guarded, compare-and-swap-committed tick per invocation. Knows no SQL dialect.
//!
//! # Why a tick is ordered the way it is (deferred delivery, the default)
//! The host writes output bindings *after* the handler answers and never tells the handler whether that
//! write worked; a failed write shows up only as a retry of the invocation (`RetryContext`). So a batch is
//! recorded as *in flight* when it is answered, and acknowledged by a later invocation that proves the
//! earlier one succeeded:
//! 1. Load the state (1 read). Refuse if the source's fingerprint changed, answer empty if paused or if another
//!    instance's unexpired lease covers the batch in flight.
//! 2. Resolve the batch in flight. It is acknowledged (checkpoint := its end) only when *this process*
//!    answered it, this invocation is not a retry, and it was not answered on the host's final retry. In every
//!    other case (a retry, a restart, another instance's batch whose lease expired, an ambiguous commit) the
//!    outcome is unknown, so the same range is re-delivered: duplicates are possible, loss is not. Known
//!    failures are counted; at `MaxAttempts` the batch is quarantined (or the function halts).
//! 3. Fetch up to `MaxBatchSize` changes after the checkpoint.
//! 4. Nothing to deliver and nothing acknowledged: no write (an empty tick costs one read and one query).
//! 5. Otherwise one conditional write records the acknowledgement, the new batch in flight and the lease.
//!    A conflict means another tick moved first: deliver nothing, answer empty.
//!
//! `immediate` delivery commits the checkpoint before answering instead (at-most-once if the host's write
//! fails). Both modes use the same fetch and commit path.

mod error;
pub mod failpoint;
mod outputs;
pub mod state;

pub use error::{ErrorKind, TickError};
pub use outputs::MappedOutputs;

use crate::change::{encode_batch, Change};
use crate::config::{DeliveryMode, FunctionConfig, PoisonAction};
use crate::protocol::RetryContext;
use crate::source::{Position, Source};
use crate::state::{Etag, StateStore, StoreError};
use state::{InFlight, Lease, QuarantineDoc, QuarantineEntry, StateDoc, QUARANTINE_KEPT, SCHEMA};
use std::sync::Arc;
use time::OffsetDateTime;
use tokio::sync::{Mutex, OnceCell};

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
    /// One tick at a time per function in this process; a concurrent invocation waits its turn.
    lock: Mutex<()>,
    /// The batch this process answered most recently (and committed before answering).
    answered: std::sync::Mutex<Option<u64>>,
    validated: OnceCell<()>,
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
            lock: Mutex::new(()),
            answered: std::sync::Mutex::new(None),
            validated: OnceCell::new(),
        }
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

    pub fn store(&self) -> &Arc<dyn StateStore> {
        &self.store
    }

    pub fn state_key(&self) -> &str {
        &self.key
    }

    pub fn quarantine_prefix(&self) -> &str {
        &self.quarantine_prefix
    }

    /// Maps a batch onto this function's output bindings.
    pub fn outputs(&self, changes: &[Change]) -> MappedOutputs {
        outputs::map(&self.config.outputs, changes)
    }

    /// Runs one tick within the function's time budget.
    pub async fn tick(&self, retry: RetryContext) -> Result<TickOutcome, TickError> {
        let _one_at_a_time = self.lock.lock().await;
        let ops_before = self.store.operations();
        let budget = self.config.settings.tick_timeout;
        let mut outcome = match tokio::time::timeout(budget, self.tick_inner(retry)).await {
            Ok(result) => result?,
            Err(_) => return Err(TickError::Timeout(budget)),
        };
        outcome.store_operations = self.store.operations() - ops_before;
        Ok(outcome)
    }

    async fn tick_inner(&self, retry: RetryContext) -> Result<TickOutcome, TickError> {
        self.validated.get_or_try_init(|| self.source.validate()).await?;
        let mut out = TickOutcome::default();
        let (mut doc, etag) = match self.load().await? {
            Some((doc, etag)) => (doc, Some(etag)),
            None => {
                let start = self.source.start_position(self.config.source.start_from).await?;
                (self.new_doc(start), None)
            }
        };
        // A document that was never written must be written even if the tick delivers nothing, so that a
        // `startFrom: now` position is fixed at the first tick rather than moving with every tick.
        let mut dirty = etag.is_none();

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

        let now = OffsetDateTime::now_utc();
        if let (Some(lease), Some(_)) = (&doc.lease, &doc.in_flight) {
            if lease.owner != self.owner && lease.expires_at > now {
                out.kind = OutcomeKind::LeaseHeld;
                out.logs.push(format!(
                    "batch in flight belongs to {} until {}; answering an empty batch",
                    lease.owner, lease.expires_at
                ));
                return Ok(out);
            }
        }

        if let Some(flight) = doc.in_flight.clone() {
            let answered_here = *self.answered.lock().expect("answered lock") == Some(flight.batch_id);
            let proven = flight.owner == self.owner && answered_here && !retry.is_retry() && !flight.final_attempt;
            if proven && self.config.settings.delivery_mode == DeliveryMode::Deferred {
                doc.checkpoint = flight.to.clone();
                doc.counters.delivered += flight.rows;
                doc.counters.batches += 1;
                doc.in_flight = None;
                dirty = true;
            } else {
                let known_failure = retry.is_retry() || flight.final_attempt;
                let failures = flight.failures + u32::from(known_failure);
                if failures >= self.config.settings.max_attempts {
                    self.poison(&mut doc, &flight, failures, &mut out).await?;
                    if let Some(reason) = doc.halted.clone() {
                        // Record the halt so every instance stops; a conflict means someone else decided first.
                        self.commit(&mut doc, etag.as_ref(), &mut out).await?;
                        return Err(TickError::Halted { function: self.config.name.clone(), reason });
                    }
                    dirty = true;
                } else {
                    let why = if retry.is_retry() {
                        format!("the host retried (attempt {})", retry.retry_count)
                    } else if flight.final_attempt {
                        "the host's final retry may have failed".to_string()
                    } else if flight.owner != self.owner {
                        format!("it was answered by {} and its outcome is unknown", flight.owner)
                    } else {
                        "this process cannot prove it was answered".to_string()
                    };
                    return self.redeliver(doc, etag, flight, failures, retry, why, out).await;
                }
            }
        }

        let fetched = self.source.fetch(&doc.checkpoint, self.config.settings.max_batch_size).await?;
        if !fetched.changes.is_empty() {
            failpoint::hit("after-fetch");
        }
        let Some(last) = fetched.last.clone().filter(|_| !fetched.changes.is_empty()) else {
            if dirty {
                self.commit(&mut doc, etag.as_ref(), &mut out).await?;
            }
            return Ok(out);
        };

        let batch_id = doc.next_batch_id;
        doc.next_batch_id += 1;
        let rows = fetched.changes.len() as u64;
        match self.config.settings.delivery_mode {
            DeliveryMode::Immediate => {
                doc.checkpoint = last;
                doc.counters.delivered += rows;
                doc.counters.batches += 1;
            }
            DeliveryMode::Deferred | DeliveryMode::Sink => {
                doc.in_flight = Some(InFlight {
                    batch_id,
                    from: doc.checkpoint.clone(),
                    to: last,
                    rows,
                    deliveries: 1,
                    failures: 0,
                    owner: self.owner.clone(),
                    final_attempt: retry.is_final(),
                    first_delivered_at: now,
                    last_delivered_at: now,
                });
                self.take_lease(&mut doc, now);
            }
        }
        if !self.commit(&mut doc, etag.as_ref(), &mut out).await? {
            return Ok(out);
        }
        failpoint::hit("after-commit");
        *self.answered.lock().expect("answered lock") = Some(batch_id);
        out.kind = OutcomeKind::Delivered;
        out.batch_id = Some(batch_id);
        out.logs.push(format!("delivering batch {batch_id} with {rows} change(s)"));
        out.changes = fetched.changes;
        Ok(out)
    }

    /// Sends a batch in flight again: the same range, as the rows are now.
    #[allow(clippy::too_many_arguments)]
    async fn redeliver(
        &self,
        mut doc: StateDoc,
        etag: Option<Etag>,
        flight: InFlight,
        failures: u32,
        retry: RetryContext,
        why: String,
        mut out: TickOutcome,
    ) -> Result<TickOutcome, TickError> {
        let now = OffsetDateTime::now_utc();
        let limit = (flight.rows as usize).max(self.config.settings.max_batch_size);
        let fetched = self.source.refetch(&flight.from, &flight.to, limit).await?;
        if flight.owner != self.owner {
            doc.counters.takeovers += 1;
        }
        doc.counters.redelivered += 1;
        doc.in_flight = Some(InFlight {
            owner: self.owner.clone(),
            deliveries: flight.deliveries + 1,
            failures,
            final_attempt: retry.is_final(),
            last_delivered_at: now,
            ..flight.clone()
        });
        self.take_lease(&mut doc, now);
        if !self.commit(&mut doc, etag.as_ref(), &mut out).await? {
            return Ok(out);
        }
        *self.answered.lock().expect("answered lock") = Some(flight.batch_id);
        out.logs.push(format!(
            "re-delivering batch {} with {} change(s) because {why} (delivery {}, {failures} known failure(s))",
            flight.batch_id,
            fetched.changes.len(),
            flight.deliveries + 1
        ));
        out.kind = OutcomeKind::Redelivered;
        out.batch_id = Some(flight.batch_id);
        out.changes = fetched.changes;
        Ok(out)
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
        let limit = (flight.rows as usize).max(self.config.settings.max_batch_size);
        let fetched = self.source.refetch(&flight.from, &flight.to, limit).await?;
        let key = format!("{}{:020}.json", self.quarantine_prefix, flight.batch_id);
        let now = OffsetDateTime::now_utc();
        let body = QuarantineDoc {
            function: self.config.name.clone(),
            batch_id: flight.batch_id,
            from: flight.from.clone(),
            to: flight.to.clone(),
            failures,
            reason: reason.clone(),
            at: now,
            changes: encode_batch(&fetched.changes),
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
            rows: fetched.changes.len() as u64,
            from: flight.from.clone(),
            to: flight.to.clone(),
            at: now,
        });
        if doc.quarantine.len() > QUARANTINE_KEPT {
            let excess = doc.quarantine.len() - QUARANTINE_KEPT;
            doc.quarantine.drain(..excess);
        }
        let line = format!("{reason}; quarantined {} change(s) to {key} and moving on", fetched.changes.len());
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
        doc.write_id = uuid::Uuid::new_v4().to_string();
        doc.updated_at = OffsetDateTime::now_utc();
        doc.updated_by = self.owner.clone();
        let bytes = serde_json::to_vec(doc).expect("state documents serialize");
        match self.store.save_if(&self.key, &bytes, etag).await {
            Ok(_) => Ok(true),
            Err(StoreError::Conflict) => {
                out.kind = OutcomeKind::Conflict;
                out.changes.clear();
                out.logs
                    .push("another tick committed first (state changed since it was read); delivering nothing".into());
                tracing::info!(function = %self.config.name, "state conflict: another tick committed first");
                Ok(false)
            }
            Err(e) => Err(e.into()),
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
            write_id: String::new(),
            updated_at: OffsetDateTime::now_utc(),
            updated_by: self.owner.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
