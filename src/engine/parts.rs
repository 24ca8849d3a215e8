//! The trigger's parts and a tick's answer: the types every delivery shares, below the verbs of `mod.rs` and
//! the deliveries that use them. `Trigger` is defined here and its verbs in `mod.rs`, so that a delivery
//! (`host_tick`, `recorded`, `sink_tick`) reads its parts without importing the file that calls it.

use super::decide;
use super::document::StateDoc;
use super::observe::{TickObserver, TickStats};
use super::Ledger;
use crate::change::Change;
use crate::config::{DeliveryMode, FunctionConfig};
use crate::sink::Sink;
use crate::source::{BatchRange, Fetched, Position, Source};
use crate::state::Etag;
use std::sync::Arc;
use time::OffsetDateTime;
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
    pub(super) fn of(mode: DeliveryMode) -> Self {
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

/// What this process remembers between ticks of one function. Held by the tick lock: a tick reads and changes
/// it alone, and only through the methods below, each named for the event that changes it.
#[derive(Debug, Default)]
pub(super) struct Memory {
    /// The document this process wrote last and its etag, so the next tick need not read it back (see
    /// `Trigger::run`). Taken at the start of a tick: any failure leaves it empty and the next tick reads.
    written: Option<(StateDoc, Etag)>,
    /// Deferred delivery: the batches answered to the host and not proven written (`decide`).
    answered: decide::Answered,
    /// Sink delivery: the batch after the one being delivered, fetched while the sink wrote.
    ahead: Option<Ahead>,
    /// The fencing token and settled batches of the document this process last read or wrote: a token that went
    /// back on the same document was edited by hand, and is refused (`decide::token_moved_back`).
    lineage: Option<decide::Lineage>,
    /// Sink delivery: the batch recorded in flight by the previous tick's acknowledgement, to deliver next.
    chained: Option<Chained>,
    /// Live batches served in a row since the last backfill chunk (`decide::backfill`).
    live_in_a_row: u32,
    /// Why the source last could not place a backfill chunk (`ChunkRead::Later`), so the reason is said once.
    backfill_later: Option<String>,
    /// Whether this process ever wrote the state document, or tried to and does not know whether it landed: only
    /// then can it hold the document's lease, so a clean stop that never wrote has nothing to release and does
    /// not touch the store (whose failure may be what stopped it).
    wrote: bool,
}

impl Memory {
    // -- The state document (`Tick::open`, `Tick::commit`, `Trigger::run`) ------------------------------------

    /// The document this process wrote (or read unchanged) last, and its etag.
    pub(super) fn last_written(&self) -> Option<&(StateDoc, Etag)> {
        self.written.as_ref()
    }

    /// Takes the remembered document at the start of a tick: a tick that fails leaves nothing remembered, and
    /// the next one reads.
    pub(super) fn take_written(&mut self) -> Option<(StateDoc, Etag)> {
        self.written.take()
    }

    /// A tick wrote `doc`, now at `etag`.
    pub(super) fn wrote(&mut self, doc: &StateDoc, etag: &Etag) {
        self.wrote = true;
        self.lineage = Some(decide::Lineage::of(doc));
        self.written = Some((doc.clone(), etag.clone()));
    }

    /// A tick's write lost its compare-and-swap: what this process wrote last is stale.
    pub(super) fn lost_write(&mut self) {
        self.written = None;
    }

    /// A tick's write failed and may have landed (an answer lost): this process may hold the lease.
    pub(super) fn write_unknown(&mut self) {
        self.wrote = true;
        self.written = None;
    }

    /// A read found the document this process wrote last unchanged (`doc` at `etag`): the next tick goes on
    /// from it without reading.
    pub(super) fn unchanged(&mut self, doc: StateDoc, etag: Etag) {
        self.written = Some((doc, etag));
    }

    /// Whether this process ever wrote the state document (or may have): only then can it hold its lease.
    pub(super) fn ever_wrote(&self) -> bool {
        self.wrote
    }

    /// What this process last saw of the document's lineage (nothing yet: the default).
    pub(super) fn lineage(&self) -> decide::Lineage {
        self.lineage.clone().unwrap_or_default()
    }

    /// A tick opened on `doc`: its lineage is the one to go by.
    pub(super) fn saw(&mut self, doc: &StateDoc) {
        self.lineage = Some(decide::Lineage::of(doc));
    }

    // -- Deferred delivery (`host_tick`, `Trigger::tick`) ------------------------------------------------------

    /// The batches answered to the host and not proven written.
    pub(super) fn unproven(&self) -> &decide::Answered {
        &self.answered
    }

    /// What a deferred tick answered, kept once its write went through (or at a halt).
    pub(super) fn answered(&mut self, answered: decide::Answered) {
        self.answered = answered;
    }

    /// An invocation arrived: what its retry says about earlier answers, taken in before anything can fail.
    pub(super) fn invoked(&mut self, attempt: &crate::protocol::Attempt, now: OffsetDateTime) -> decide::Named {
        self.answered.note(attempt, now)
    }

    /// Another instance took the batches in flight over: nothing answered is this process's to prove.
    pub(super) fn lease_lost(&mut self) {
        self.answered = decide::Answered::default();
    }

    // -- Sink delivery (`sink_tick`, `fetch`) -------------------------------------------------------------------

    /// The acknowledgement recorded `next` in flight (or nothing) for the next tick to deliver.
    pub(super) fn chain(&mut self, next: Option<Chained>) {
        self.chained = next;
    }

    /// The chained batch, taken either way: one not used now goes the ordinary way.
    pub(super) fn take_chained(&mut self) -> Option<Chained> {
        self.chained.take()
    }

    /// A batch fetched ahead while the sink wrote, kept for the next tick.
    pub(super) fn fetched_ahead(&mut self, ahead: Ahead) {
        self.ahead = Some(ahead);
    }

    /// The batch fetched ahead, taken either way.
    pub(super) fn take_ahead(&mut self) -> Option<Ahead> {
        self.ahead.take()
    }

    // -- The share between live changes and a backfill's chunks (`decide::backfill`, `fetch`) -------------------

    /// Live batches served in a row since the last chunk.
    pub(super) fn live_in_a_row(&self) -> u32 {
        self.live_in_a_row
    }

    /// A tick served a live batch.
    pub(super) fn served_live(&mut self) {
        self.live_in_a_row = decide::backfill::after_batch(self.live_in_a_row, false);
    }

    /// A tick served a backfill's chunk.
    pub(super) fn served_chunk(&mut self) {
        self.live_in_a_row = decide::backfill::after_batch(self.live_in_a_row, true);
    }

    /// The source placed a chunk: a later refusal is said again.
    pub(super) fn chunk_read(&mut self) {
        self.backfill_later = None;
    }

    /// The source could not place a chunk now, for `why`: the attempt counts as the backfill's turn. `true` when
    /// the reason is new (said once per reason).
    pub(super) fn chunk_later(&mut self, why: &str) -> bool {
        // The attempt counts as the backfill's turn: under a live backlog, a source that waits (up to its poll
        // bound) before refusing costs live changes one tick in `LIVE_PER_CHUNK + 1`, not every tick.
        self.live_in_a_row = 0;
        if self.backfill_later.as_deref() == Some(why) {
            return false;
        }
        self.backfill_later = Some(why.to_string());
        true
    }
}

/// The trigger of one function: its configuration, source, ledger and delivery, and this process's memory of
/// what it answered.
#[derive(Debug)]
pub struct Trigger {
    pub(super) config: FunctionConfig,
    pub(super) source: Arc<dyn Source>,
    pub(super) ledger: Arc<Ledger>,
    pub(super) delivery: Delivery,
    /// This process's identity in leases. A restart is a new owner, on purpose: a new process cannot know
    /// whether the old one's last answer reached the host.
    pub(super) owner: String,
    /// One tick at a time per function in this process (a concurrent invocation waits its turn), and what the
    /// process remembers between them.
    pub(super) memory: Mutex<Memory>,
    pub(super) validated: OnceCell<()>,
    /// This process's view of its ticks, readable while a tick runs (status, metrics).
    pub(super) stats: std::sync::Mutex<TickStats>,
    /// Told about every tick (metrics); set at most once, after start-up.
    pub(super) observer: std::sync::OnceLock<Arc<dyn TickObserver>>,
}

/// A batch recorded in flight by the write that acknowledged the batch before it, and its changes.
#[derive(Debug)]
pub(in crate::engine) struct Chained {
    pub(in crate::engine) range: BatchRange,
    pub(in crate::engine) changes: Vec<Change>,
}

/// A batch fetched ahead: the changes after `after`, fetched at `at` (on the engine's clock).
#[derive(Debug)]
pub(in crate::engine) struct Ahead {
    pub after: Position,
    pub fetched: Fetched,
    pub at: time::OffsetDateTime,
}
