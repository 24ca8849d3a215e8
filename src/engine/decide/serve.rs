//! What a tick serves, as one pure choice of the state document, this process's memory and the settings: a
//! batch delivered before (the one in flight, or one owed again), an operator's retry of a quarantined batch,
//! or new changes, live or a backfill's chunk in the order the share says (`decide::backfill`). Every delivery
//! asks here (`Tick::serve`); `fetch.rs` reads what the answer names. No I/O.

use super::backfill::{self as share, Turn};
use super::{stuck, Answered, Stuck};
use crate::config::TriggerSettings;
use crate::engine::document::{InFlight, StateDoc};
use crate::source::Position;

/// What this process remembers that the choice depends on (read off `Memory` by the tick).
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// Deferred delivery: the batches answered and not proven yet. `None` for the recorded deliveries
    /// (immediate, a sink's), whose batch in flight is on the document.
    pub answered: Option<&'a Answered>,
    /// Live batches served in a row since the last chunk (the share's count).
    pub live_in_a_row: u32,
}

/// What a tick serves, first match first.
#[derive(Debug)]
pub enum Serve {
    /// Recorded deliveries: the batch the document records in flight: delivered again, or, poison, quarantined
    /// (then the tick asks again) or halted at. (Boxed: the batch and the choice are large beside the rest.)
    InFlight { flight: Box<InFlight>, stuck: Box<Stuck> },
    /// Deferred delivery: a batch answered before and owed again (a retry named it, or nobody would report a
    /// failure of its last answer).
    Owed,
    /// An operator's retry of the quarantined batch with this id, from its quarantine document.
    QuarantineRetry(u64),
    /// New changes, read by `fetch::fresh`.
    New(Fresh),
}

/// New changes: live ones after `live`, or a chunk of the running backfill after `after`, in `turn`'s order.
#[derive(Debug, Clone, PartialEq)]
pub struct Fresh {
    pub turn: Turn,
    /// The end of the live changes handed over so far: live changes start here, and a chunk is placed after
    /// them (`ChunkRequest::live`).
    pub live: Position,
    /// Where the next chunk starts: after the last chunk of this backfill answered and not proven yet, else
    /// the backfill's position.
    pub after: Position,
    /// A chunk of this backfill is answered and not proven yet: an empty chunk read does not end it.
    pub unacknowledged: bool,
}

impl Serve {
    /// Whether the tick serves live changes before anything else: what a sink tick may fetch ahead and chain
    /// (no batch in flight or owed, no operator's retry, no backfill chunk owed its turn).
    pub fn starts_live(&self) -> bool {
        matches!(self, Serve::New(fresh) if fresh.turn != Turn::ChunkThenLive)
    }
}

/// See [`Serve`]: the one place that decides what a tick serves.
pub fn serve(doc: &StateDoc, memory: Facts<'_>, settings: &TriggerSettings) -> Serve {
    match memory.answered {
        Some(answered) => deferred(doc, answered, memory.live_in_a_row),
        None => recorded(doc, memory.live_in_a_row, settings),
    }
}

/// Deferred delivery: an owed batch first, then an operator's retry not answered yet, then new changes after
/// the span (the document's batch in flight is the span's record, and `answered` its truth).
fn deferred(doc: &StateDoc, answered: &Answered, live_in_a_row: u32) -> Serve {
    if answered.has_owed() {
        return Serve::Owed;
    }
    let unanswered = |id: &u64| !answered.retries.iter().any(|r| r.range.batch_id == *id);
    if let Some(batch_id) = doc.retry_quarantined.iter().copied().find(unanswered) {
        return Serve::QuarantineRetry(batch_id);
    }
    // Chunks of this backfill answered and not yet proven: the next starts after the last of them.
    let current = doc.backfill.as_ref().map(|b| b.id.clone());
    let unproven = answered
        .chunks
        .iter()
        .rfind(|s| s.range.backfill.is_some() && s.range.backfill == current)
        .map(|s| s.range.to.clone());
    Serve::New(fresh(doc, live_in_a_row, answered.frontier(&doc.checkpoint).clone(), unproven))
}

/// Immediate and sink delivery: the batch in flight first (nobody proved it delivered), then an operator's
/// retry, then new changes after the checkpoint (nothing is in flight, so nothing of a backfill is
/// unacknowledged).
fn recorded(doc: &StateDoc, live_in_a_row: u32, settings: &TriggerSettings) -> Serve {
    if let Some(flight) = &doc.in_flight {
        let stuck = stuck(flight, settings.max_attempts, settings.poison_action);
        return Serve::InFlight { flight: Box::new(flight.clone()), stuck: Box::new(stuck) };
    }
    if let Some(&batch_id) = doc.retry_quarantined.first() {
        return Serve::QuarantineRetry(batch_id);
    }
    Serve::New(fresh(doc, live_in_a_row, doc.checkpoint.clone(), None))
}

/// New changes after `live`, and a chunk after `unproven` (else the backfill's position).
fn fresh(doc: &StateDoc, live_in_a_row: u32, live: Position, unproven: Option<Position>) -> Fresh {
    let turn = share::turn(doc.backfill.as_ref(), live_in_a_row);
    let unacknowledged = unproven.is_some();
    let after = unproven.or_else(|| doc.backfill.as_ref().map(|b| b.after.clone())).unwrap_or_default();
    Fresh { turn, live, after, unacknowledged }
}

#[cfg(test)]
mod tests;
