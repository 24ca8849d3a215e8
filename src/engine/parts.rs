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
/// it alone.
#[derive(Debug, Default)]
pub(super) struct Memory {
    /// The document this process wrote last and its etag, so the next tick need not read it back (see
    /// `Trigger::run`). Taken at the start of a tick: any failure leaves it empty and the next tick reads.
    pub(super) written: Option<(StateDoc, Etag)>,
    /// Deferred delivery: the batches answered to the host and not proven written (`decide`).
    pub(super) answered: decide::Answered,
    /// Sink delivery: the batch after the one being delivered, fetched while the sink wrote.
    pub(super) ahead: Option<Ahead>,
    /// The fencing token and settled batches of the document this process last read or wrote: a token that went
    /// back on the same document was edited by hand, and is refused (`decide::token_moved_back`).
    pub(super) lineage: Option<decide::Lineage>,
    /// Sink delivery: the batch recorded in flight by the previous tick's acknowledgement, to deliver next.
    pub(super) chained: Option<Chained>,
    /// Live batches served in a row since the last backfill chunk (`decide::backfill`).
    pub(super) live_in_a_row: u32,
    /// Why the source last could not place a backfill chunk (`ChunkRead::Later`), so the reason is said once.
    pub(super) backfill_later: Option<String>,
    /// Whether this process ever wrote the state document, or tried to and does not know whether it landed: only
    /// then can it hold the document's lease, so a clean stop that never wrote has nothing to release and does
    /// not touch the store (whose failure may be what stopped it).
    pub(super) wrote: bool,
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
