//! A tick as a value: the document it started from, its etag, `now`, and what it will answer. Opening one makes
//! the checks every delivery shares (the source's fingerprint, a halt, a pause, another owner's lease); the
//! delivery functions (`host_tick::deferred`, `recorded::record`, the sink tick) then ask it what it serves
//! (`Tick::serve_deferred`, `serve_recorded`: `decide::serve`), read that through `fetch.rs`, change its
//! document through the document's own transitions and end with [`Tick::commit`] (or [`Tick::quarantine`]
//! and [`Tick::halt`] on the way). A tick's [`Ended`] value carries what it answers and what it wrote to the
//! next step. Nothing here calls back into a delivery.

use super::decide::serve;
use super::decide::{self, Poison};
use super::document::{Origin, QuarantineDoc, QuarantineEntry, StateDoc};
use super::error::TickError;
use super::ledger::Saved;
use super::outcome::{OutcomeKind, TickOutcome};
use super::parts::{Memory, Trigger};
use crate::change::{encode_batch, Change};
use crate::source::BatchRange;
use crate::source::Position;
use crate::state::Etag;
use time::OffsetDateTime;

/// How often an empty tick may record a source's proven-empty position (`Fetched::advance`).
pub(super) const ADVANCE_EVERY: time::Duration = time::Duration::minutes(5);

/// One tick of one function, on the document as read (or remembered) at `etag`.
pub(super) struct Tick<'a> {
    pub trigger: &'a Trigger,
    /// What this process remembers between ticks, held under the tick lock.
    pub memory: &'a mut Memory,
    pub doc: StateDoc,
    /// `None`: a document never written.
    pub etag: Option<Etag>,
    pub now: OffsetDateTime,
    /// The document must be written even if the delivery changes nothing more: it was never written (so that
    /// a `startFrom: now` position is fixed at the first tick rather than moving with every tick), or a
    /// transition was applied.
    pub dirty: bool,
    /// What the tick answers.
    pub out: TickOutcome,
    /// Whether the tick wrote the document (see [`Ended::written`]).
    wrote: bool,
    /// The document as this tick last wrote it, at its etag, kept when a later commit of the same tick lost its
    /// compare-and-swap: the tick's own `doc` then holds changes that were never written.
    superseded: Option<(StateDoc, Etag)>,
}

/// A tick's end, the value its steps hand on: what it answers and, when it wrote the state document, the
/// document as written and its new etag. A sink's delivery and acknowledgement go on from that document
/// (`sink_tick`); `Trigger::run` need not read back a document the tick wrote.
#[derive(Debug)]
pub(super) struct Ended {
    pub out: TickOutcome,
    pub written: Option<(StateDoc, Etag)>,
}

/// A tick after its shared checks: ready for its delivery, or already answered (paused, another owner's lease).
pub(super) enum Opened<'a> {
    Ready(Box<Tick<'a>>),
    Answered(Box<TickOutcome>),
}

impl<'a> Tick<'a> {
    /// Opens a tick on `doc` as read at `etag`, making the checks every delivery shares.
    pub async fn open(
        trigger: &'a Trigger,
        memory: &'a mut Memory,
        doc: StateDoc,
        etag: Option<Etag>,
    ) -> Result<Opened<'a>, TickError> {
        let name = &trigger.config.name;
        decide::check_fingerprint(&doc, name, &trigger.source.fingerprint())?;
        // A document edited by hand into one no handler writes is refused before anything acts on it.
        let seen = memory.lineage();
        let edited = decide::token_moved_back(&doc, &seen)
            .or_else(|| decide::span_backward(&doc, |a, b| trigger.source.position_order(a, b)));
        if let Some(detail) = edited {
            let (function, key) = (name.clone(), trigger.ledger.key().to_string());
            return Err(TickError::CorruptState { function, key, detail });
        }
        memory.saw(&doc);
        if let (Some(_), Some(reason)) = (doc.retired_into(), doc.halted()) {
            return Err(TickError::Retired { function: name.clone(), reason: reason.to_string() });
        }
        if let Some(reason) = doc.halted() {
            return Err(TickError::Halted { function: name.clone(), reason: reason.to_string() });
        }
        let mut out = TickOutcome::default();
        if doc.paused() {
            out.kind = OutcomeKind::Paused;
            out.logs.push("function is paused by an operator; answering an empty batch".into());
            return Ok(Opened::Answered(Box::new(out)));
        }
        let now = trigger.ledger.clock().now();
        if let Some(lease) = decide::lease_held_by_another(&doc, &trigger.owner, now) {
            // Another instance took the batches in flight over (this process's lease lapsed): it delivers
            // them all again, so nothing this process remembers is still its to prove.
            memory.lease_lost();
            out.kind = OutcomeKind::LeaseHeld;
            out.logs.push(format!(
                "batch in flight belongs to {} until {}; answering an empty batch",
                lease.owner, lease.expires_at
            ));
            return Ok(Opened::Answered(Box::new(out)));
        }
        // The checkpoint of a stored document is acknowledged: a source holding changes upstream may let go of
        // what it passed. Only here, by the lease holder, on a document read or written at `etag`.
        if etag.is_some() {
            if let Err(e) = trigger.source.acknowledged(doc.checkpoint()).await {
                tracing::warn!(function = %name, "could not release what the checkpoint passed at the source (the next tick tries again): {e}");
            }
        }
        let dirty = etag.is_none();
        Ok(Opened::Ready(Box::new(Tick {
            trigger,
            memory,
            doc,
            etag,
            now,
            dirty,
            out,
            wrote: false,
            superseded: None,
        })))
    }

    /// Goes on from a document this process wrote (at `etag`) and still holds: the acknowledgement of a batch a
    /// sink took, a withdrawal, a reconciliation. No checks: the process acts on its own last write, and the
    /// conditional write fails if anyone wrote since.
    pub fn on_written(trigger: &'a Trigger, memory: &'a mut Memory, doc: StateDoc, etag: Etag) -> Self {
        let now = trigger.ledger.clock().now();
        Tick {
            trigger,
            memory,
            doc,
            etag: Some(etag),
            now,
            dirty: false,
            out: TickOutcome::default(),
            wrote: false,
            superseded: None,
        }
    }

    /// A document never written, at `checkpoint`, for `trigger`'s function.
    pub fn new_doc(trigger: &Trigger, checkpoint: Position) -> StateDoc {
        let source = trigger.source.name();
        let fingerprint = trigger.source.fingerprint();
        let origin = Origin { function: &trigger.config.name, source: &source, fingerprint: &fingerprint };
        StateDoc::new(origin, checkpoint, &trigger.owner, trigger.ledger.clock().now())
    }

    /// Writes the document through the ledger if it is still at the tick's etag, and remembers it as this
    /// process's last write; the tick then goes on from the new etag. `Ok(false)`: another tick moved first,
    /// and the answer says so (it answers nothing).
    pub async fn commit(&mut self) -> Result<bool, TickError> {
        let trigger = self.trigger;
        match trigger.ledger.save(&mut self.doc, self.etag.as_ref(), &trigger.owner).await {
            Ok(Saved::Written(etag)) => {
                self.memory.wrote(&self.doc, &etag);
                self.etag = Some(etag);
                self.dirty = false;
                self.wrote = true;
                Ok(true)
            }
            Ok(Saved::Conflict) => {
                if self.wrote {
                    // The memory holds this tick's last write, the one the document as written is.
                    self.superseded = self.memory.take_written();
                }
                self.memory.lost_write();
                self.out.kind = OutcomeKind::Conflict;
                self.out.batch_id = None;
                self.out.changes.clear();
                self.out
                    .logs
                    .push("another tick committed first (state changed since it was read); delivering nothing".into());
                tracing::info!(function = %trigger.config.name, "state conflict: another tick committed first");
                Ok(false)
            }
            Err(e) => {
                // The write may have landed (an answer lost): this process may hold the lease.
                self.memory.write_unknown();
                Err(e)
            }
        }
    }

    /// Commits only when something is to be written (see `dirty`). `Ok(false)`: another tick moved first.
    pub async fn commit_if_dirty(&mut self) -> Result<bool, TickError> {
        if !self.dirty {
            return Ok(true);
        }
        self.commit().await
    }

    /// Stops the function at a poison batch (`Sql_Trigger_PoisonAction=halt`): the halt is recorded so every
    /// instance stops, and the tick fails with it. `Ok(())`: another writer moved first (the answer says so),
    /// and the next tick acts on what they did.
    pub async fn halt(&mut self, poison: &Poison) -> Result<(), TickError> {
        let reason =
            format!("{}; halted at it (Sql_Trigger_PoisonAction=halt)", decide::poison_reason(poison, self.now));
        let function = self.trigger.config.name.clone();
        tracing::error!(function = %function, batch_id = poison.range.batch_id, "{reason}");
        self.doc.halt(reason.clone());
        if !self.commit().await? {
            return Ok(());
        }
        Err(TickError::Halted { function, reason })
    }

    /// Writes a poison batch's changes to its quarantine document and lists it in the state; the caller moves
    /// the checkpoint (or the span) past it. A retry of a quarantined batch that failed again stays where it is.
    pub async fn quarantine(&mut self, poison: &Poison, changes: Vec<Change>) -> Result<(), TickError> {
        let trigger = self.trigger;
        let reason = decide::poison_reason(poison, self.now);
        let batch_id = poison.range.batch_id;
        self.dirty = true;
        if let Some(key) = &poison.quarantined {
            let line = format!("{reason}; it was a retry of quarantined {key} and stays quarantined");
            tracing::error!(function = %trigger.config.name, batch_id, key = %key, "{line}");
            self.out.logs.push(line);
            return Ok(());
        }
        let rows = changes.len() as u64;
        let key = trigger
            .ledger
            .write_quarantine(&QuarantineDoc {
                function: trigger.config.name.clone(),
                batch_id,
                from: poison.range.from.clone(),
                to: poison.range.to.clone(),
                failures: poison.failures,
                reason: reason.clone(),
                at: self.now,
                changes: encode_batch(&changes),
            })
            .await?;
        let range = BatchRange { rows, ..poison.range.clone() };
        self.doc.record_quarantined(QuarantineEntry { range, key: key.clone(), at: self.now });
        let line = format!("{reason}; quarantined {rows} change(s) to {key} and moving on");
        tracing::error!(function = %trigger.config.name, batch_id, key = %key, "{line}");
        self.out.logs.push(line);
        Ok(())
    }

    /// What a deferred tick serves (`decide::serve::deferred`), given the batches answered and not proven.
    pub fn serve_deferred(&self, answered: &decide::Answered) -> serve::Deferred {
        serve::deferred(&self.doc, answered, self.memory.live_in_a_row())
    }

    /// What a recorded tick (immediate, a sink's) serves (`decide::serve::recorded`).
    pub fn serve_recorded(&self) -> serve::Recorded {
        serve::recorded(&self.doc, self.memory.live_in_a_row(), &self.trigger.config.settings)
    }

    /// What a recorded tick serves once its batch in flight was quarantined (`decide::serve::after_flight`).
    pub fn serve_after_flight(&self) -> serve::Next {
        serve::after_flight(&self.doc, self.memory.live_in_a_row())
    }

    /// The tick's end: its answer and what it wrote, if it did (the document as written, at its etag).
    pub fn end(self) -> Ended {
        let written = match (self.wrote, self.superseded, self.etag) {
            (true, Some(last), _) => Some(last),
            (true, None, Some(etag)) => Some((self.doc, etag)),
            _ => None,
        };
        Ended { out: self.out, written }
    }

    /// Sets what the tick answers: a batch, its changes, and the lease token it goes under.
    pub fn answer(&mut self, kind: OutcomeKind, batch_id: u64, changes: Vec<Change>, line: String) {
        self.out.fence = self.doc.lease().map_or(0, |l| l.token);
        self.out.kind = kind;
        self.out.batch_id = Some(batch_id);
        self.out.logs.push(line);
        self.out.changes = changes;
    }
}
