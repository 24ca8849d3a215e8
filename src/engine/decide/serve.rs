//! What a tick serves, as one pure choice of the state document, this process's memory and the settings: a
//! batch delivered before (the one in flight, or one owed again), an operator's retry of a quarantined batch,
//! or new changes, live or a backfill's chunk in the order the share says (`decide::backfill`). Each delivery
//! asks the question it can meet the answer of (`deferred`, `recorded`, `after_flight`, through `Tick`), so no
//! delivery holds an answer it has no arm for; `fetch.rs` reads what the answer names. No I/O.

use super::backfill::{self as share, Turn};
use super::{stuck, Answered, Stuck};
use crate::config::TriggerSettings;
use crate::engine::document::{InFlight, StateDoc};
use crate::source::Position;

/// Deferred delivery's answer: a batch answered before and owed again (a retry named it, or nobody would
/// report a failure of its last answer), else what comes next.
#[derive(Debug)]
pub enum Deferred {
    Owed,
    Next(Next),
}

/// A recorded delivery's answer (immediate, a sink's): the batch the document records in flight, delivered
/// again or, poison, quarantined (then the tick asks [`after_flight`]) or halted at, else what comes next.
/// (Boxed: the batch and the choice are large beside the rest.)
#[derive(Debug)]
pub enum Recorded {
    InFlight { flight: Box<InFlight>, stuck: Box<Stuck> },
    Next(Next),
}

/// What a tick serves once nothing earlier is owed or in flight.
#[derive(Debug)]
pub enum Next {
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

impl Next {
    /// Whether the tick serves live changes before anything else: what a sink tick may fetch ahead and chain
    /// (no operator's retry, no backfill chunk owed its turn).
    pub fn starts_live(&self) -> bool {
        matches!(self, Next::New(fresh) if fresh.turn != Turn::ChunkThenLive)
    }
}

impl Recorded {
    /// Whether the tick serves live changes before anything else (nothing in flight, and [`Next::starts_live`]).
    pub fn starts_live(&self) -> bool {
        matches!(self, Recorded::Next(next) if next.starts_live())
    }
}

/// Deferred delivery: an owed batch first, then an operator's retry not answered yet, then new changes after
/// the span (the document's batch in flight is the span's record, and `answered` its truth). `live_in_a_row`:
/// live batches served in a row since the last chunk (the share's count).
pub fn deferred(doc: &StateDoc, answered: &Answered, live_in_a_row: u32) -> Deferred {
    if answered.has_owed() {
        return Deferred::Owed;
    }
    let unanswered = |id: &u64| !answered.retries.iter().any(|r| r.range.batch_id == *id);
    if let Some(batch_id) = doc.retry_quarantined().iter().copied().find(unanswered) {
        return Deferred::Next(Next::QuarantineRetry(batch_id));
    }
    // Chunks of this backfill answered and not yet proven: the next starts after the last of them.
    let current = doc.backfill().map(|b| b.id.clone());
    let unproven = answered
        .chunks
        .iter()
        .rfind(|s| s.range.backfill.is_some() && s.range.backfill == current)
        .map(|s| s.range.to.clone());
    Deferred::Next(Next::New(fresh(doc, live_in_a_row, answered.frontier(doc.checkpoint()).clone(), unproven)))
}

/// Immediate and sink delivery: the batch in flight first (nobody proved it delivered), then
/// [`after_flight`].
pub fn recorded(doc: &StateDoc, live_in_a_row: u32, settings: &TriggerSettings) -> Recorded {
    if let Some(flight) = doc.in_flight() {
        let stuck = stuck(flight, settings.max_attempts, settings.poison_action);
        return Recorded::InFlight { flight: Box::new(flight.clone()), stuck: Box::new(stuck) };
    }
    Recorded::Next(after_flight(doc, live_in_a_row))
}

/// A recorded delivery with no batch in flight (none was, or it was just quarantined): an operator's retry,
/// then new changes after the checkpoint (nothing of a backfill is unacknowledged then).
pub fn after_flight(doc: &StateDoc, live_in_a_row: u32) -> Next {
    if let Some(&batch_id) = doc.retry_quarantined().first() {
        return Next::QuarantineRetry(batch_id);
    }
    Next::New(fresh(doc, live_in_a_row, doc.checkpoint().clone(), None))
}

/// New changes after `live`, and a chunk after `unproven` (else the backfill's position).
fn fresh(doc: &StateDoc, live_in_a_row: u32, live: Position, unproven: Option<Position>) -> Fresh {
    let turn = share::turn(doc.backfill(), live_in_a_row);
    let unacknowledged = unproven.is_some();
    let after = unproven.or_else(|| doc.backfill().map(|b| b.after.clone())).unwrap_or_default();
    Fresh { turn, live, after, unacknowledged }
}

#[cfg(test)]
mod tests;
