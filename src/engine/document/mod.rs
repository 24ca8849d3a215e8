//! The state document: one per function, the only durable memory of the trigger, and every change of it.
//!
//! The fields are public to read (status, `handler state show`, tests); they change only through the methods
//! below, one per transition, each saying who may call it. Nothing outside this file assigns a field
//! (`a_document_changes_only_through_its_own_methods` checks the source tree). Who writes what: the tick
//! writes everything in one compare-and-swap through the ledger; operators (CLI, admin routes) pause, resume,
//! reset, replay and queue quarantined batches through the same CAS. `checkpoint` only moves forward except by
//! an explicit operator reset or replay. Every write carries a fresh `write_id` ([`StateDoc::stamp`]), so no
//! two writes are byte-identical and content-hash etags stay unique.

mod backfill;
mod pace;
mod quarantine;
mod read;

pub use backfill::{Backfill, BackfillState};
pub use pace::{Pace, PACE_HORIZON};
pub use quarantine::{QuarantineDoc, QuarantineEntry, QUARANTINE_KEPT};
pub use read::read;

use crate::source::BatchRange;
use crate::source::Position;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StateDoc {
    pub schema: u32,
    pub function: String,
    /// `kind:table`, for people reading the document.
    pub source: String,
    /// See `Source::fingerprint`: a mismatch means stored positions no longer mean anything.
    pub fingerprint: String,
    /// Everything at or before this position was delivered and acknowledged. `null` = nothing yet.
    pub checkpoint: Position,
    /// The batch answered to the host (or handed to a sink) and not yet acknowledged. In deferred delivery, the
    /// span of batches answered and not yet proven written, from the checkpoint on, owned by the process that
    /// answered them: nobody else can prove them, so another owner delivers them all again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_flight: Option<InFlight>,
    /// Who may act on `in_flight`, until when, and the fencing token of that owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Lease>,
    /// Set by an operator: ticks answer empty batches.
    #[serde(default)]
    pub paused: bool,
    /// Set when a poison batch stops the function (PoisonAction=halt): the reason and the batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halted: Option<String>,
    pub next_batch_id: u64,
    #[serde(default)]
    pub counters: Counters,
    /// The most recent quarantined batches (newest last, at most [`QUARANTINE_KEPT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantine: Vec<QuarantineEntry>,
    /// Quarantined batches an operator asked to re-deliver, oldest first; served before new changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retry_quarantined: Vec<u64>,
    /// When the checkpoint last moved (or a batch was last acknowledged).
    #[serde(default, with = "time::serde::rfc3339::option", skip_serializing_if = "Option::is_none")]
    pub progress_at: Option<OffsetDateTime>,
    /// Changes acknowledged per second over the last minutes (see `decide::pace`), set with `counters`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pace: Option<Pace>,
    pub write_id: String,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    pub updated_by: String,
    /// This document's identity: minted when it is created and at every operator reset, kept by every other
    /// write. Fencing tokens only grow within one lineage; a deleted and recreated document, or a reset one, is
    /// a new lineage whose tokens may start lower (see `decide::token_moved_back`). Empty in documents written
    /// before it existed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub lineage: String,
    /// Set when `handler partitions change` created this document from the documents of another partition
    /// layout, and kept by every later write: its checkpoint was carried over, not lost. A sink tick therefore
    /// never resumes it from the destination's record, which names a batch of the old layout (another set of
    /// keys under the same function name); and a re-run of the change knows the document as its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seeded: Option<Seeded>,
    /// The function's backfill, the current or the last one (docs/operations.md, "Backfill"). Absent in
    /// documents written before backfills existed, and in functions that never had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill: Option<Backfill>,
}

/// Where a re-partitioned document's checkpoint came from (see [`StateDoc::seeded`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Seeded {
    /// How many partitions the layout it was seeded from had (1: the unpartitioned document).
    pub from_partitions: u32,
    /// The old partitions whose keys this one may hold: its checkpoint is the earliest of theirs.
    pub from: Vec<u32>,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    pub by: String,
}

/// How the halt reason of a document retired by `handler partitions change` starts (see [`StateDoc::retire`]).
pub const RETIRED: &str = "re-partitioned into ";

/// Who is writing, for a new document's fields: the function, the source's name and fingerprint.
#[derive(Debug, Clone, Copy)]
pub struct Origin<'a> {
    pub function: &'a str,
    /// `kind:table`, for people reading the document.
    pub source: &'a str,
    pub fingerprint: &'a str,
}

impl StateDoc {
    /// A document never written, at `checkpoint`. Who: the first tick of a function; an operator's reset of a
    /// document that does not parse.
    pub fn new(origin: Origin<'_>, checkpoint: Position, by: &str, now: OffsetDateTime) -> Self {
        Self {
            schema: SCHEMA,
            function: origin.function.to_string(),
            source: origin.source.to_string(),
            fingerprint: origin.fingerprint.to_string(),
            checkpoint,
            in_flight: None,
            lease: None,
            paused: false,
            halted: None,
            next_batch_id: 1,
            counters: Counters::default(),
            quarantine: Vec::new(),
            retry_quarantined: Vec::new(),
            progress_at: None,
            pace: None,
            write_id: String::new(),
            updated_at: now,
            updated_by: by.to_string(),
            lineage: uuid::Uuid::new_v4().to_string(),
            seeded: None,
            backfill: None,
        }
    }

    /// Marks a write by `by` at `now` with a fresh `write_id`. Who: the ledger, on every save.
    pub(in crate::engine) fn stamp(&mut self, by: &str, now: OffsetDateTime) {
        self.write_id = uuid::Uuid::new_v4().to_string();
        self.updated_at = now;
        self.updated_by = by.to_string();
    }

    // -- The tick ------------------------------------------------------------------------------------------------

    /// The id of a new batch. Who: a tick that fetched one, or that splits an owed range into pages.
    pub fn allocate_batch_id(&mut self) -> u64 {
        let id = self.next_batch_id;
        self.next_batch_id = self.next_batch_id.saturating_add(1);
        id
    }

    /// Records `flight` as the batch in flight. Who: a sink tick recording the batch it is about to deliver
    /// (or chaining the next one to an acknowledgement); the caller takes the lease with it.
    pub fn record_in_flight(&mut self, flight: InFlight) {
        self.in_flight = Some(flight);
    }

    /// Records deferred delivery's unproven span (`None`: nothing unproven). `true` when it changed. Who: the
    /// deferred tick, from what this process remembers answering.
    pub fn record_span(&mut self, span: Option<InFlight>) -> bool {
        let changed = self.in_flight != span;
        self.in_flight = span;
        changed
    }

    /// Takes out the batch in flight that `owner` cannot prove, to deliver it all again, counting a takeover
    /// when another process answered it. Who: the deferred tick, for a span it does not remember.
    pub fn adopt_in_flight(&mut self, owner: &str) -> Option<InFlight> {
        let flight = self.in_flight.take()?;
        if flight.owner != owner {
            self.counters.takeovers += 1;
        }
        Some(flight)
    }

    /// A batch in flight is delivered again, by `owner`. Who: a tick re-delivering a batch it found in flight.
    pub fn count_redelivery(&mut self, flight: &InFlight, owner: &str) {
        if flight.owner != owner {
            self.counters.takeovers += 1;
        }
        self.counters.redelivered += 1;
        self.count_chunk_redone(&flight.range);
    }

    /// An owed batch of deferred delivery (`range`) is answered again. Who: the deferred tick.
    pub fn count_answer_again(&mut self, range: &BatchRange) {
        self.counters.redelivered += 1;
        self.count_chunk_redone(range);
    }

    fn count_chunk_redone(&mut self, range: &BatchRange) {
        if let Some(b) = self.backfill.as_mut().filter(|b| range.backfill.as_ref() == Some(&b.id)) {
            b.redone += 1;
        }
    }

    /// The open backfill has no rows left: it is done. Who: a tick whose chunk read found nothing after the
    /// backfill's position, with no chunk of it in flight.
    pub fn finish_backfill(&mut self, now: OffsetDateTime) {
        if let Some(b) = self.backfill.as_mut().filter(|b| b.state == BackfillState::Running) {
            b.state = BackfillState::Done;
            b.finished_at = Some(now);
        }
    }

    /// Marks `flight` delivered: the checkpoint moves to its end unless it was a retry of a quarantined batch
    /// (the checkpoint passed that one when it was quarantined). Who: an immediate tick before it answers; a
    /// sink tick once its sink took the batch.
    pub fn acknowledge(&mut self, flight: &InFlight, now: OffsetDateTime) {
        if flight.quarantined.is_none() {
            self.pass(&flight.range);
        }
        self.counters.delivered += flight.range.rows;
        self.counters.batches += 1;
        Pace::record(&mut self.pace, flight.range.rows, now);
        self.in_flight = None;
        self.progress_at = Some(now);
    }

    /// Moves past `range`, delivered: the checkpoint to its end, or for a backfill chunk the backfill's
    /// position (a chunk of a backfill cancelled or replaced since moves nothing: its rows were delivered all
    /// the same, and the backfill they belonged to is over).
    fn pass(&mut self, range: &BatchRange) {
        let Some(id) = &range.backfill else {
            self.checkpoint = range.to.clone();
            return;
        };
        if let Some(b) = self.backfill.as_mut().filter(|b| b.id == *id && b.open()) {
            b.after = range.to.clone();
            b.rows += range.rows;
            b.chunks += 1;
        }
    }

    /// Moves the checkpoint (and the counters) over batches proven written: the span's proven prefix, and
    /// operators' retries of quarantined batches (which lie before the checkpoint). Each comes with whether it
    /// was settled (quarantined) already, and so counted. `true` when anything moved. Who: the deferred tick.
    pub fn acknowledge_proven(
        &mut self,
        span: &[(&BatchRange, bool)],
        retries: &[(&BatchRange, bool)],
        now: OffsetDateTime,
    ) -> bool {
        if span.is_empty() && retries.is_empty() {
            return false;
        }
        let counted: u64 = span.iter().chain(retries).filter(|(_, settled)| !settled).map(|(r, _)| r.rows).sum();
        Pace::record(&mut self.pace, counted, now);
        for (range, settled) in span {
            self.pass(range);
            self.progress_at = Some(now);
            if !settled {
                self.counters.delivered += range.rows;
                self.counters.batches += 1;
            }
        }
        for (range, settled) in retries {
            self.retry_quarantined.retain(|id| *id != range.batch_id);
            if !settled {
                self.counters.delivered += range.rows;
                self.counters.batches += 1;
            }
        }
        true
    }

    /// On an empty tick with nothing in flight, records a position the source proved empty up to, now and then
    /// (every `every`, not every empty tick: an empty tick should cost one read). `true` when it did. Who: an
    /// empty tick whose source reported such a position.
    pub fn advance_quiet(&mut self, advance: Position, now: OffsetDateTime, every: time::Duration) -> bool {
        let stale = self.progress_at.is_none_or(|at| now - at >= every);
        if stale && self.in_flight.is_none() && advance != self.checkpoint {
            self.checkpoint = advance;
            self.progress_at = Some(now);
            return true;
        }
        false
    }

    /// Takes (or renews) the lease for `owner` until `now + duration`. The fencing token grows with every
    /// change of owner, so a sink refuses the writes of a deposed one. Who: a tick recording a batch in flight.
    pub fn take_lease(&mut self, owner: &str, duration: std::time::Duration, now: OffsetDateTime) {
        let token = match &self.lease {
            Some(l) if l.owner == owner => l.token,
            Some(l) => l.token + 1,
            None => 1,
        };
        self.lease = Some(Lease { owner: owner.to_string(), token, expires_at: now + duration });
    }

    /// Extends the lease (whoever holds it) to `until`. `false` when there is none. Who: the sink tick's
    /// heartbeat, on the document its owner wrote.
    pub fn extend_lease(&mut self, until: OffsetDateTime) -> bool {
        let Some(lease) = self.lease.as_mut() else { return false };
        lease.expires_at = until;
        true
    }

    /// Withdraws `owner`'s undelivered batch `batch_id` and lets its lease lapse now, so the next owner starts at
    /// once. `false` (nothing changed) when the document no longer records that batch for `owner`. Who: a clean
    /// stop of `handler run`, for a chained batch never delivered.
    pub fn withdraw(&mut self, batch_id: u64, owner: &str, now: OffsetDateTime) -> bool {
        if self.in_flight.as_ref().is_none_or(|f| f.range.batch_id != batch_id || f.owner != owner) {
            return false;
        }
        self.in_flight = None;
        if let Some(lease) = self.lease.as_mut().filter(|l| l.owner == owner) {
            lease.expires_at = now;
        }
        true
    }

    /// Lets `owner`'s live lease lapse now, keeping its token (a batch still in flight stays: the next owner
    /// takes it over at once and delivers it again). `false` (nothing changed) when `owner` holds no live
    /// lease. Who: a clean stop of `handler run`, after its last tick, so the next process, or an operator's
    /// `handler partitions change`, need not wait the lease out.
    pub fn release_lease(&mut self, owner: &str, now: OffsetDateTime) -> bool {
        match self.lease.as_mut().filter(|l| l.owner == owner && l.expires_at > now) {
            Some(lease) => {
                lease.expires_at = now;
                true
            }
            None => false,
        }
    }

    /// A sink refused batch `batch_id`, delivered under lease token `ours`, as fenced by token `stored`. If the
    /// document still gives `owner` the lease under `ours` and holds the batch in flight for it, no owner of
    /// this document wrote under a larger token: the destination's token comes from an earlier document
    /// (deleted, lost, or restored from a copy, its tokens started again at 1). Then the token goes above the
    /// destination's, with the lease extended, and the answer is that token; `None` (nothing changed): this
    /// owner was deposed, or the state moved on. Who: a sink tick whose sink answered `Fenced`.
    pub fn raise_fence(
        &mut self,
        owner: &str,
        (batch_id, ours, stored): (u64, u64, u64),
        duration: std::time::Duration,
        now: OffsetDateTime,
    ) -> Option<u64> {
        let holds = self.lease.as_ref().is_some_and(|lease| lease.token == ours && lease.owner == owner);
        let in_flight = self.in_flight.as_ref().is_some_and(|f| f.range.batch_id == batch_id && f.owner == owner);
        if stored <= ours || !holds || !in_flight {
            return None;
        }
        let token = stored + 1;
        if let Some(lease) = self.lease.as_mut() {
            lease.token = token;
            lease.expires_at = lease.expires_at.max(now + duration);
        }
        Some(token)
    }

    /// The lease's fencing token goes to `token`, the batch in flight staying as it is. Who: a sink tick whose
    /// new document's tokens restarted below the destination's (resuming from the destination).
    pub fn raise_token(&mut self, token: u64) {
        if let Some(lease) = self.lease.as_mut() {
            lease.token = token;
        }
    }

    /// Continues after the batch an exactly-once destination says it applied: the batch in flight is dropped
    /// undelivered (and returned), the checkpoint goes to the applied batch's end, batch ids after its id, and the
    /// lease, released at once, carries `token` (above any the destination saw). Who: a sink tick of a
    /// document that has acknowledged nothing (resuming from the destination).
    pub fn continue_after(
        &mut self,
        applied: &BatchRange,
        owner: &str,
        token: u64,
        now: OffsetDateTime,
    ) -> Option<InFlight> {
        let dropped = self.in_flight.take();
        self.checkpoint = applied.to.clone();
        self.next_batch_id = self.next_batch_id.max(applied.batch_id + 1);
        self.progress_at = Some(now);
        self.lease = Some(Lease { owner: owner.to_string(), token, expires_at: now });
        dropped
    }

    /// One more known failure of the batch in flight (durable, so `Sql_Trigger_MaxAttempts` counts across
    /// processes), with its error (`error`, secret-free like every error, shown in the quarantine document's or
    /// the halt's reason). `false` when nothing is in flight. Who: a sink tick whose sink rejected the batch.
    pub fn record_failure(&mut self, error: &str) -> bool {
        let Some(flight) = self.in_flight.as_mut() else { return false };
        flight.failures += 1;
        flight.last_error = Some(error.to_string());
        true
    }

    /// Stops the function at a poison batch (`Sql_Trigger_PoisonAction=halt`). Who: a tick meeting a poison batch.
    pub fn halt(&mut self, reason: String) {
        self.halted = Some(reason);
    }

    /// Lists a batch written to its quarantine document (the newest [`QUARANTINE_KEPT`] are kept). Who: a tick
    /// quarantining a poison batch.
    pub fn record_quarantined(&mut self, entry: QuarantineEntry) {
        self.counters.quarantined += 1;
        self.quarantine.push(entry);
        if self.quarantine.len() > QUARANTINE_KEPT {
            let excess = self.quarantine.len() - QUARANTINE_KEPT;
            self.quarantine.drain(..excess);
        }
    }

    /// Moves past a quarantined batch in flight: the checkpoint to its end (unless it was itself a retry of a
    /// quarantined batch, which lies before the checkpoint), nothing in flight. Who: a sink or immediate tick,
    /// after quarantining it.
    pub fn pass_quarantined(&mut self, flight: &InFlight) {
        if flight.quarantined.is_none() {
            self.pass(&flight.range);
        }
        self.in_flight = None;
    }

    /// The first quarantined batch an operator asked to retry, taken off the list. Who: a sink or immediate tick.
    pub fn take_quarantine_retry(&mut self) -> Option<u64> {
        (!self.retry_quarantined.is_empty()).then(|| self.retry_quarantined.remove(0))
    }

    /// Puts a quarantined batch back at the head of the operator's retry list (unless listed). Who: the deferred
    /// tick, adopting a retry that sink delivery had recorded in flight.
    pub fn requeue_quarantine_retry(&mut self, batch_id: u64) {
        if !self.retry_quarantined.contains(&batch_id) {
            self.retry_quarantined.insert(0, batch_id);
        }
    }

    // -- Operators (`ops`: the CLI and the admin routes) ------------------------------------------------------

    /// Ticks answer empty batches until [`StateDoc::resume`]. Who: an operator.
    pub fn pause(&mut self) {
        self.paused = true;
    }

    /// Clears `paused` and a poison halt; the batch in flight loses its known failures (a halted batch is
    /// delivered once more). Who: an operator.
    pub fn resume(&mut self) {
        self.paused = false;
        self.halted = None;
        if let Some(f) = self.in_flight.as_mut() {
            f.failures = 0;
            f.failing_since = None;
            f.last_error = None;
        }
    }

    /// Moves the checkpoint to `position`, drops the batch in flight and the queue of quarantined batches to
    /// retry, clears a halt, adopts the configured source (the way out of a "source changed" refusal) and starts
    /// a new lineage (the way out of a refused hand edit). Batch ids, counters and the quarantine list go on.
    /// Who: an operator, with confirmation.
    pub fn reset(&mut self, position: Position, origin: Origin<'_>) {
        self.checkpoint = position;
        self.in_flight = None;
        self.halted = None;
        // The operator's queue of quarantined batches goes too: one whose document is missing would block every
        // tick. The documents stay in the store, to queue again.
        self.retry_quarantined.clear();
        // A new lineage: a token an operator moved back by hand is accepted from here on.
        self.lineage = uuid::Uuid::new_v4().to_string();
        self.fingerprint = origin.fingerprint.to_string();
        self.source = origin.source.to_string();
    }

    /// Re-reads everything after `from`: the checkpoint goes there and the batch in flight is dropped. Answers
    /// the previous checkpoint. Who: an operator.
    pub fn replay(&mut self, from: Position) -> Position {
        self.in_flight = None;
        std::mem::replace(&mut self.checkpoint, from)
    }

    /// Batch ids continue after `batch_id` (at least): a document recreated over a store that holds quarantine
    /// documents must not give their ids out again. Who: an operator's reset of an unreadable document; an
    /// operator's change of the partition count (a function name's batch ids never repeat across layouts,
    /// because destinations deduplicate on them).
    pub fn continue_ids_after(&mut self, batch_id: u64) {
        self.next_batch_id = self.next_batch_id.max(batch_id.saturating_add(1));
    }

    /// Records that this new document's checkpoint was carried over from another partition layout. Who: an
    /// operator's change of the partition count, on a document it creates.
    pub fn seed(&mut self, seeded: Seeded) {
        self.seeded = Some(seeded);
    }

    /// Stops this document for good: its partition layout was replaced by one of `into` partitions, and its
    /// checkpoint lives on in that layout's documents. A deployment of the old layout that comes back stops here
    /// instead of delivering from a stale checkpoint. The halt reason reads "re-partitioned into {into}
    /// partitions {detail}". Who: an operator's change of the partition count.
    pub fn retire(&mut self, into: u32, detail: &str) {
        self.halted = Some(format!("{RETIRED}{into} partitions {detail}"));
    }

    /// How many partitions replaced this document's layout, when a change of the partition count retired it.
    pub fn retired_into(&self) -> Option<u32> {
        let rest = self.halted.as_deref()?.strip_prefix(RETIRED)?;
        rest.split(' ').next()?.parse().ok()
    }

    /// Starts `backfill` (replacing a finished or cancelled one). Refused while one is running or paused. Who: an
    /// operator; the first tick of a `startFrom: snapshot` function.
    pub fn start_backfill(&mut self, backfill: Backfill) -> Result<(), String> {
        if let Some(b) = self.backfill.as_ref().filter(|b| b.open()) {
            return Err(format!(
                "backfill {} of {} is {} since {} ({} row(s) delivered); cancel it first (--cancel)",
                b.id,
                self.function,
                if b.state == BackfillState::Paused { "paused" } else { "running" },
                b.started_at,
                b.rows
            ));
        }
        self.backfill = Some(backfill);
        Ok(())
    }

    /// Pauses (`true`) or resumes (`false`) the open backfill. Who: an operator.
    pub fn pause_backfill(&mut self, pause: bool) -> Result<(), String> {
        let function = self.function.clone();
        let Some(b) = self.backfill.as_mut().filter(|b| b.open()) else {
            return Err(format!(
                "{function} has no backfill running or paused; start one with `handler state backfill {function}`"
            ));
        };
        b.state = if pause { BackfillState::Paused } else { BackfillState::Running };
        Ok(())
    }

    /// Cancels the open backfill: no further chunk; a chunk in flight is delivered but moves nothing. Who: an
    /// operator.
    pub fn cancel_backfill(&mut self, now: OffsetDateTime) -> Result<(), String> {
        let function = self.function.clone();
        let Some(b) = self.backfill.as_mut().filter(|b| b.open()) else {
            return Err(format!("{function} has no backfill running or paused to cancel"));
        };
        b.state = BackfillState::Cancelled;
        b.finished_at = Some(now);
        Ok(())
    }

    /// Queues a quarantined batch for re-delivery before new changes. Who: an operator.
    pub fn queue_quarantine_retry(&mut self, batch_id: u64) {
        if !self.retry_quarantined.contains(&batch_id) {
            self.retry_quarantined.push(batch_id);
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InFlight {
    /// The batch (its id, `from` the checkpoint it was fetched after, `to` its last change, and its rows). In
    /// deferred delivery, the span: `batch_id` is its last batch's.
    #[serde(flatten)]
    pub range: BatchRange,
    /// How many times it was handed to the host or a sink.
    pub deliveries: u32,
    /// How many of those are known to have failed (a host retry, or the host's last retry).
    pub failures: u32,
    /// The instance that answered it last.
    pub owner: String,
    /// Answered on the host's final retry: if that write failed nobody will say so, so re-deliver.
    #[serde(default)]
    pub final_attempt: bool,
    #[serde(with = "time::serde::rfc3339")]
    pub first_delivered_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub last_delivered_at: OffsetDateTime,
    /// Set when this batch is an operator's retry of a quarantined batch: its store key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<String>,
    /// Deferred delivery: how many batches the span holds (answered one after the other, none proven yet;
    /// `batch_id` is the last one's, `failures` and `failing_since` the first one's). 1 in the other modes.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub batches: u32,
    /// When the first known failure of the (first) batch happened: poison needs failures lasting
    /// `Sql_Trigger_PoisonAfterMs`.
    #[serde(default, with = "time::serde::rfc3339::option", skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<OffsetDateTime>,
    /// The error of its last known failure, when the failure came with one (a sink's refusal; a host retry
    /// says nothing of why): the poison reason quotes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

impl InFlight {
    /// A batch delivered for the first time, by `owner` at `now`.
    pub fn first_delivery(range: BatchRange, owner: &str, now: OffsetDateTime) -> Self {
        Self {
            range,
            deliveries: 1,
            failures: 0,
            owner: owner.to_string(),
            final_attempt: false,
            first_delivered_at: now,
            last_delivered_at: now,
            quarantined: None,
            batches: 1,
            failing_since: None,
            last_error: None,
        }
    }
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Lease {
    pub owner: String,
    /// Grows on every change of owner; sinks reject writes carrying a smaller one.
    pub token: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Counters {
    /// Changes acknowledged.
    pub delivered: u64,
    /// Batches acknowledged.
    pub batches: u64,
    /// Deliveries of a batch after its first.
    pub redelivered: u64,
    pub quarantined: u64,
    /// Times an instance took over another's batch after its lease expired.
    pub takeovers: u64,
}

#[cfg(test)]
mod tests;
