//! What every tick shares: starting from the document this process wrote last, the checks every mode makes,
//! the commit, quarantine, and the recorded tick of the modes that do not wait for the host's proof
//! (`immediate`, which acknowledges before answering, and a sink's tick, which acknowledges after its sink
//! took the batch).

use super::decide::{self, Poison};
use super::document::{InFlight, QuarantineDoc, QuarantineEntry, StateDoc, QUARANTINE_KEPT, SCHEMA};
use super::ledger::Saved;
use super::{failpoint, Memory, OutcomeKind, TickError, TickOutcome, Trigger, Via};
use crate::change::{encode_batch, Change};
use crate::config::PoisonAction;
use crate::source::{Fetched, Position, SourceError};
use crate::state::Etag;
use time::OffsetDateTime;

/// How often an empty tick may record a source's proven-empty position (`Fetched::advance`).
pub(super) const ADVANCE_EVERY: time::Duration = time::Duration::minutes(5);

impl Trigger {
    /// One tick, starting from the document this process wrote last when it has it.
    ///
    /// Skipping the read is safe because every decision a tick makes either ends in a conditional write,
    /// which fails if anyone (another instance, an operator) wrote since, or writes nothing and is then
    /// checked: a tick from the remembered document that wrote nothing reads the document, and its answer
    /// stands only if the etag is still the remembered one; otherwise the tick runs again on what was read.
    /// Nothing of a discarded run is observable: it answered nothing and recorded nothing. A delivering tick
    /// in a drain then costs one write instead of a read and a write; an empty tick still costs one read, so
    /// a pause, resume, reset or replay by an operator is seen at the next tick even on a quiet table.
    pub(super) async fn tick_inner(&self, memory: &mut Memory, via: Via<'_>) -> Result<TickOutcome, TickError> {
        self.validated.get_or_try_init(|| self.source.validate()).await?;
        if let Some((doc, etag)) = memory.written.take() {
            let out = match self.tick_on(memory, doc, Some(etag.clone()), via).await {
                // A refusal read off the remembered document (a halt this process recorded, say) is decided
                // again on the stored one: an operator may have lifted it since, or another instance may have
                // moved on (a source that releases what a checkpoint passed then refuses the older position).
                Err(
                    TickError::Halted { .. }
                    | TickError::FingerprintChanged { .. }
                    | TickError::Source(SourceError::PositionLost(_)),
                ) => {
                    if let Some((doc, fresh)) = self.load().await? {
                        return self.tick_on(memory, doc, Some(fresh), via).await;
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
                    return Ok(out);
                }
                Some((doc, fresh)) => {
                    let line = "the state changed since this process last wrote it (another instance or an operator wrote); acting on the state as it is now";
                    tracing::info!(function = %self.config.name, "{line}");
                    let mut out = self.tick_on(memory, doc, Some(fresh), via).await?;
                    out.logs.insert(0, line.to_string());
                    return Ok(out);
                }
                None => {}
            }
        } else if let Some((doc, etag)) = self.load().await? {
            return self.tick_on(memory, doc, Some(etag), via).await;
        }
        let start = self.source.start_position(self.config.source.start_from).await?;
        self.tick_on(memory, self.new_doc(start), None, via).await
    }

    /// One tick on `doc` as read at `etag` (`None`: a document never written).
    async fn tick_on(
        &self,
        memory: &mut Memory,
        doc: StateDoc,
        etag: Option<Etag>,
        via: Via<'_>,
    ) -> Result<TickOutcome, TickError> {
        let mut out = TickOutcome::default();
        // A document that was never written must be written even if the tick delivers nothing, so that a
        // `startFrom: now` position is fixed at the first tick rather than moving with every tick.
        let dirty = etag.is_none();
        decide::check_fingerprint(&doc, &self.config.name, &self.source.fingerprint())?;
        if let Some(reason) = &doc.halted {
            return Err(TickError::Halted { function: self.config.name.clone(), reason: reason.clone() });
        }
        if doc.paused {
            out.kind = OutcomeKind::Paused;
            out.logs.push("function is paused by an operator; answering an empty batch".into());
            return Ok(out);
        }
        let now = self.clock().now();
        if let Some(lease) = decide::lease_held_by_another(&doc, &self.owner, now) {
            // Another instance took the batches in flight over (this process's lease lapsed): it delivers
            // them all again, so nothing this process remembers is still its to prove.
            memory.answered = decide::Answered::default();
            out.kind = OutcomeKind::LeaseHeld;
            out.logs.push(format!(
                "batch in flight belongs to {} until {}; answering an empty batch",
                lease.owner, lease.expires_at
            ));
            return Ok(out);
        }
        // The checkpoint of a stored document is acknowledged: a source holding changes upstream may let go of
        // what it passed. Only here, by the lease holder, on a document read or written at `etag`.
        if etag.is_some() {
            if let Err(e) = self.source.acknowledged(&doc.checkpoint).await {
                tracing::warn!(function = %self.config.name, "could not release what the checkpoint passed at the source (the next tick tries again): {e}");
            }
        }
        match via {
            Via::Host(attempt) => self.deferred_tick(memory, doc, etag, attempt, now, dirty, out).await,
            Via::Immediate | Via::Sink => self.recorded_tick(memory, doc, etag, via, now, dirty, out).await,
        }
    }

    /// The tick of the modes that do not wait for the host's proof: `sink`, whose tick delivers and
    /// acknowledges by itself, and `immediate`, which acknowledges before answering. A batch found in flight
    /// (a sink tick that did not finish, another instance's) is always delivered again.
    #[allow(clippy::too_many_arguments)]
    async fn recorded_tick(
        &self,
        memory: &mut Memory,
        mut doc: StateDoc,
        etag: Option<Etag>,
        via: Via<'_>,
        now: OffsetDateTime,
        mut dirty: bool,
        mut out: TickOutcome,
    ) -> Result<TickOutcome, TickError> {
        if let Some(flight) = doc.in_flight.clone() {
            if flight.failures < self.config.settings.max_attempts {
                return self.redeliver(memory, doc, etag, via, flight, out).await;
            }
            let poison = Poison {
                batch_id: flight.batch_id,
                from: flight.from.clone(),
                to: flight.to.clone(),
                failures: flight.failures,
                failing_since: flight.failing_since,
                quarantined: flight.quarantined.clone(),
            };
            if self.config.settings.poison_action == PoisonAction::Halt {
                return self.halt(memory, doc, etag, &poison, &mut out).await;
            }
            let changes = self.changes_of(&flight).await?;
            self.quarantine(&mut doc, &poison, changes, now, &mut out).await?;
            if poison.quarantined.is_none() {
                doc.checkpoint = flight.to.clone();
            }
            doc.in_flight = None;
            dirty = true;
        }

        // A quarantined batch an operator asked to retry goes before new changes; it does not move the
        // checkpoint, which passed it when it was quarantined.
        let mut fetched_advance = None;
        let (batch, quarantined) = match doc.retry_quarantined.first().copied() {
            Some(batch_id) => {
                doc.retry_quarantined.remove(0);
                dirty = true;
                let key = self.ledger.quarantine_key(batch_id);
                let q = self.ledger.load_quarantine(&key).await?;
                let changes =
                    q.decode_changes().map_err(|detail| TickError::CorruptState { key: key.clone(), detail })?;
                let fetched = Fetched { changes, last: Some(q.to.clone()), advance: None };
                (Some((fetched, q.from)), Some(key))
            }
            None => {
                let mut fetched = match self.take_ahead(memory, &doc.checkpoint) {
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
                dirty |= decide::advance_quiet_checkpoint(&mut doc, advance, now, ADVANCE_EVERY);
            }
            if dirty {
                self.commit(memory, &mut doc, etag.as_ref(), &mut out).await?;
            }
            return Ok(out);
        };
        failpoint::hit("after-fetch");
        let last = fetched.last.clone().unwrap_or(Position::Null);

        let batch_id = doc.next_batch_id;
        doc.next_batch_id += 1;
        let flight = InFlight {
            quarantined,
            ..InFlight::first_delivery(batch_id, from, last, fetched.changes.len() as u64, &self.owner, now)
        };
        self.record_delivery(&mut doc, flight, via, now);
        if !self.commit(memory, &mut doc, etag.as_ref(), &mut out).await? {
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
            Via::Immediate => decide::acknowledge(doc, &flight, now),
            Via::Sink | Via::Host(_) => {
                doc.in_flight = Some(flight);
                decide::take_lease(doc, &self.owner, self.config.settings.lease_duration, now);
            }
        }
    }

    /// Sends a batch in flight again: the same range as the rows are now, or the stored changes of a
    /// quarantined batch.
    async fn redeliver(
        &self,
        memory: &mut Memory,
        mut doc: StateDoc,
        etag: Option<Etag>,
        via: Via<'_>,
        flight: InFlight,
        mut out: TickOutcome,
    ) -> Result<TickOutcome, TickError> {
        let now = self.clock().now();
        let changes = self.changes_of(&flight).await?;
        let why = if flight.owner != self.owner {
            doc.counters.takeovers += 1;
            format!("it was answered by {} and its outcome is unknown", flight.owner)
        } else {
            "its delivery was not acknowledged".to_string()
        };
        doc.counters.redelivered += 1;
        let again = InFlight {
            owner: self.owner.clone(),
            deliveries: flight.deliveries + 1,
            final_attempt: false,
            last_delivered_at: now,
            ..flight.clone()
        };
        self.record_delivery(&mut doc, again, via, now);
        if !self.commit(memory, &mut doc, etag.as_ref(), &mut out).await? {
            return Ok(out);
        }
        out.fence = doc.lease.as_ref().map_or(0, |l| l.token);
        out.logs.push(format!(
            "re-delivering batch {} with {} change(s) because {why} (delivery {}, {} known failure(s))",
            flight.batch_id,
            changes.len(),
            flight.deliveries + 1,
            flight.failures
        ));
        out.kind = OutcomeKind::Redelivered;
        out.batch_id = Some(flight.batch_id);
        out.changes = changes;
        Ok(out)
    }

    /// The changes of a batch in flight, as they are now.
    async fn changes_of(&self, flight: &InFlight) -> Result<Vec<Change>, TickError> {
        if let Some(key) = &flight.quarantined {
            return self.quarantined_changes(key).await;
        }
        let limit = (flight.rows as usize).max(self.config.settings.max_batch_size);
        Ok(self.source.refetch(&flight.from, &flight.to, limit).await?.changes)
    }

    /// The changes a quarantine document holds.
    pub(super) async fn quarantined_changes(&self, key: &str) -> Result<Vec<Change>, TickError> {
        let doc = self.ledger.load_quarantine(key).await?;
        doc.decode_changes().map_err(|detail| TickError::CorruptState { key: key.to_string(), detail })
    }

    /// Stops the function at a poison batch (`Sql_Trigger_PoisonAction=halt`): the halt is recorded so every
    /// instance stops; a conflict means someone else decided first, and the next tick acts on what they did.
    pub(super) async fn halt(
        &self,
        memory: &mut Memory,
        mut doc: StateDoc,
        etag: Option<Etag>,
        poison: &Poison,
        out: &mut TickOutcome,
    ) -> Result<TickOutcome, TickError> {
        let reason = format!(
            "{}; halted at it (Sql_Trigger_PoisonAction=halt)",
            decide::poison_reason(poison, self.clock().now())
        );
        tracing::error!(function = %self.config.name, batch_id = poison.batch_id, "{reason}");
        doc.halted = Some(reason.clone());
        if !self.commit(memory, &mut doc, etag.as_ref(), out).await? {
            return Ok(std::mem::take(out));
        }
        Err(TickError::Halted { function: self.config.name.clone(), reason })
    }

    /// Writes a poison batch's changes to its quarantine document and lists it in the state; the caller moves
    /// the checkpoint (or the span) past it. A retry of a quarantined batch that failed again stays where it is.
    pub(super) async fn quarantine(
        &self,
        doc: &mut StateDoc,
        poison: &Poison,
        changes: Vec<Change>,
        now: OffsetDateTime,
        out: &mut TickOutcome,
    ) -> Result<(), TickError> {
        let reason = decide::poison_reason(poison, now);
        if let Some(key) = &poison.quarantined {
            let line = format!("{reason}; it was a retry of quarantined {key} and stays quarantined");
            tracing::error!(function = %self.config.name, batch_id = poison.batch_id, key = %key, "{line}");
            out.logs.push(line);
            return Ok(());
        }
        let rows = changes.len() as u64;
        let key = self
            .ledger
            .write_quarantine(&QuarantineDoc {
                function: self.config.name.clone(),
                batch_id: poison.batch_id,
                from: poison.from.clone(),
                to: poison.to.clone(),
                failures: poison.failures,
                reason: reason.clone(),
                at: now,
                changes: encode_batch(&changes),
            })
            .await?;
        doc.counters.quarantined += 1;
        doc.quarantine.push(QuarantineEntry {
            batch_id: poison.batch_id,
            key: key.clone(),
            rows,
            from: poison.from.clone(),
            to: poison.to.clone(),
            at: now,
        });
        if doc.quarantine.len() > QUARANTINE_KEPT {
            let excess = doc.quarantine.len() - QUARANTINE_KEPT;
            doc.quarantine.drain(..excess);
        }
        let line = format!("{reason}; quarantined {rows} change(s) to {key} and moving on");
        tracing::error!(function = %self.config.name, batch_id = poison.batch_id, key = %key, "{line}");
        out.logs.push(line);
        Ok(())
    }

    /// Writes the document through the ledger if it is still at `etag`, and remembers it as this process's last
    /// write. `Ok(false)`: another tick moved first, and `out` says so.
    pub(super) async fn commit(
        &self,
        memory: &mut Memory,
        doc: &mut StateDoc,
        etag: Option<&Etag>,
        out: &mut TickOutcome,
    ) -> Result<bool, TickError> {
        match self.ledger.save(doc, etag, &self.owner).await {
            Ok(Saved::Written(etag)) => {
                memory.written = Some((doc.clone(), etag.clone()));
                out.committed = Some((doc.clone(), etag));
                Ok(true)
            }
            Ok(Saved::Conflict) => {
                memory.written = None;
                out.kind = OutcomeKind::Conflict;
                out.changes.clear();
                out.logs
                    .push("another tick committed first (state changed since it was read); delivering nothing".into());
                tracing::info!(function = %self.config.name, "state conflict: another tick committed first");
                Ok(false)
            }
            Err(e) => {
                memory.written = None;
                Err(e)
            }
        }
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
            pace: None,
            write_id: String::new(),
            updated_at: self.clock().now(),
            updated_by: self.owner.clone(),
        }
    }
}
