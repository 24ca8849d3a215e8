//! The state document: one per function, the only durable memory of the trigger, and every change of it.
//!
//! The fields are private: everyone outside this folder reads them through the accessors below (status,
//! `handler state show`, the tick's decisions, tests), and they change only through the transitions, one method
//! per transition, each saying who may call it. Who writes what: the tick writes everything in one
//! compare-and-swap through the ledger; operators (CLI, admin routes) pause, resume, reset, replay and queue
//! quarantined batches through the same CAS. `checkpoint` only moves forward except by an explicit operator reset
//! or replay. Every write carries a fresh `write_id` ([`StateDoc::stamp`]), so no two writes are byte-identical
//! and content-hash etags stay unique.
//!
//! One file per concern, each holding its types and the transitions of them: `flight` (the batch in flight,
//! acknowledgements, counters), `lease`, `quarantine`, `backfill`, `stopped` (pause, halt, retirement); this
//! file holds the document, its accessors and the operator's resets. `wire` is the stored form, `read` the
//! checks of a document read back.

mod backfill;
mod flight;
mod lease;
mod pace;
mod quarantine;
mod read;
mod stopped;
mod wire;

pub use backfill::{Backfill, BackfillState};
pub use flight::{Counters, InFlight};
pub use lease::Lease;
pub use pace::{Pace, PACE_HORIZON};
pub use quarantine::{QuarantineDoc, QuarantineEntry, QUARANTINE_KEPT};
pub use read::read;
pub use stopped::{Stopped, RETIRED};

use crate::source::Position;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

pub const SCHEMA: u32 = 1;

/// One function's (or one partition's) durable memory. Read and written as `wire.rs` lays it out (serde
/// `from`/`into`), so the stored JSON is the same as every release wrote.
///
/// The fields are private, so the compiler enforces the document's one rule: nothing outside `engine/document/`
/// changes a field, only the transitions do (a test that stands for an operator's hand edit edits the stored
/// JSON). Each field's accessor has its name.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(from = "wire::Wire", into = "wire::Wire")]
pub struct StateDoc {
    schema: u32,
    function: String,
    /// `kind:table`, for people reading the document.
    source: String,
    /// See `Source::fingerprint`: a mismatch means stored positions no longer mean anything.
    fingerprint: String,
    /// Everything at or before this position was delivered and acknowledged. `null` = nothing yet.
    checkpoint: Position,
    /// The batch answered to the host (or handed to a sink) and not yet acknowledged. In deferred delivery, the
    /// span of batches answered and not yet proven written, from the checkpoint on, owned by the process that
    /// answered them: nobody else can prove them, so another owner delivers them all again.
    in_flight: Option<InFlight>,
    /// Who may act on `in_flight`, until when, and the fencing token of that owner.
    lease: Option<Lease>,
    /// Why ticks deliver nothing, and who stopped them (`None`: delivering): an operator's pause, a poison halt
    /// (PoisonAction=halt: the reason and the batch), or a retirement by a change of the partition count. Stored
    /// as the fields `paused` and `halted` (see [`Stopped`]); changed by `pause`, `resume`, `halt`, `retire` and
    /// `reset`.
    stopped: Option<Stopped>,
    next_batch_id: u64,
    counters: Counters,
    /// The most recent quarantined batches (newest last, at most [`QUARANTINE_KEPT`]).
    quarantine: Vec<QuarantineEntry>,
    /// Quarantined batches an operator asked to re-deliver, oldest first; served before new changes.
    retry_quarantined: Vec<u64>,
    /// When the checkpoint last moved (or a batch was last acknowledged).
    progress_at: Option<OffsetDateTime>,
    /// Changes acknowledged per second over the last minutes (see `decide::pace`), set with `counters`.
    pace: Option<Pace>,
    write_id: String,
    updated_at: OffsetDateTime,
    updated_by: String,
    /// This document's identity: minted when it is created and at every operator reset, kept by every other
    /// write. Fencing tokens only grow within one lineage; a deleted and recreated document, or a reset one, is
    /// a new lineage whose tokens may start lower (see `decide::token_moved_back`). Empty in documents written
    /// before it existed.
    lineage: String,
    /// Set when `handler partitions change` created this document from the documents of another partition
    /// layout, and kept by every later write: its checkpoint was carried over, not lost. A sink tick therefore
    /// never resumes it from the destination's record, which names a batch of the old layout (another set of
    /// keys under the same function name); and a re-run of the change knows the document as its own.
    seeded: Option<Seeded>,
    /// The function's backfill, the current or the last one (docs/operations.md, "Backfill"). Absent in
    /// documents written before backfills existed, and in functions that never had one.
    backfill: Option<Backfill>,
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
            stopped: None,
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

    // -- Readers (status, `handler state show`, the tick's decisions, tests) ------------------------------------

    /// The schema version the document was written with ([`SCHEMA`]).
    pub fn schema(&self) -> u32 {
        self.schema
    }

    pub fn function(&self) -> &str {
        &self.function
    }

    /// `kind:table`, for people reading the document.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The source's fingerprint when the document was written (`Source::fingerprint`).
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Everything at or before this position was delivered and acknowledged (`null`: nothing yet).
    pub fn checkpoint(&self) -> &Position {
        &self.checkpoint
    }

    /// The batch (in deferred delivery, the span) answered and not yet acknowledged.
    pub fn in_flight(&self) -> Option<&InFlight> {
        self.in_flight.as_ref()
    }

    pub fn lease(&self) -> Option<&Lease> {
        self.lease.as_ref()
    }

    /// The id the next batch gets.
    pub fn next_batch_id(&self) -> u64 {
        self.next_batch_id
    }

    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// The most recent quarantined batches, newest last.
    pub fn quarantine(&self) -> &[QuarantineEntry] {
        &self.quarantine
    }

    /// Quarantined batches an operator queued for re-delivery, oldest first.
    pub fn retry_quarantined(&self) -> &[u64] {
        &self.retry_quarantined
    }

    /// When the checkpoint last moved (or a batch was last acknowledged).
    pub fn progress_at(&self) -> Option<OffsetDateTime> {
        self.progress_at
    }

    pub fn pace(&self) -> Option<&Pace> {
        self.pace.as_ref()
    }

    /// The last write's id (see [`StateDoc::stamp`]).
    pub fn write_id(&self) -> &str {
        &self.write_id
    }

    pub fn updated_at(&self) -> OffsetDateTime {
        self.updated_at
    }

    pub fn updated_by(&self) -> &str {
        &self.updated_by
    }

    /// The document's identity (see the field); empty in documents written before it existed.
    pub fn lineage(&self) -> &str {
        &self.lineage
    }

    /// Where a re-partitioned document's checkpoint came from.
    pub fn seeded(&self) -> Option<&Seeded> {
        self.seeded.as_ref()
    }

    /// The current or the last backfill.
    pub fn backfill(&self) -> Option<&Backfill> {
        self.backfill.as_ref()
    }

    // -- Operators (`ops`: the CLI and the admin routes) ------------------------------------------------------
    // (pause and resume: `stopped.rs`; backfills: `backfill.rs`; the quarantine queue: `quarantine.rs`)

    /// Moves the checkpoint to `position`, drops the batch in flight and the queue of quarantined batches to
    /// retry, clears a halt, adopts the configured source (the way out of a "source changed" refusal) and starts
    /// a new lineage (the way out of a refused hand edit). Batch ids, counters and the quarantine list go on.
    /// Who: an operator, with confirmation.
    pub fn reset(&mut self, position: Position, origin: Origin<'_>) {
        self.checkpoint = position;
        self.in_flight = None;
        self.clear_halt();
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
}

#[cfg(test)]
mod tests;
