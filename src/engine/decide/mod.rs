//! The engine's decisions, as pure functions of the state document, this process's memory, the invocation and
//! `now` (from the engine's clock, so tests move time by hand): acknowledgement by proof (`proof`), leases and
//! their fencing tokens, acknowledgement, poison, the fence a sink raises, the span in flight.

mod pace;
mod proof;

pub use pace::{Pace, PACE_HORIZON};
pub use proof::{Answered, Named, Sent, HISTORY_KEPT};

use super::document::{InFlight, Lease, StateDoc};
use super::TickError;
use crate::protocol::Attempt;
use crate::source::Position;
use std::sync::Arc;
use time::OffsetDateTime;

/// A batch that is poison: what quarantine needs to know of it.
#[derive(Debug, Clone)]
pub struct Poison {
    pub batch_id: u64,
    pub from: Position,
    pub to: Position,
    pub failures: u32,
    /// Since when its failures have lasted (deferred delivery), for the reason's words.
    pub failing_since: Option<OffsetDateTime>,
    /// An operator's retry of a quarantined batch: its document's key (it stays where it is).
    pub quarantined: Option<String>,
}

/// The log line for what a retry said, if it said something.
pub fn named_line(named: &Named, attempt: &Attempt, window: std::time::Duration) -> Option<String> {
    let retry_count = attempt.retry.as_ref().map_or(0, |r| r.retry_count);
    match named {
        Named::Batch(batch_id) => Some(format!(
            "the host retried after the write of batch {batch_id} failed (attempt {retry_count}): delivering it again"
        )),
        Named::Late(batch_id) => Some(format!(
            "the host retried after the write of batch {batch_id} failed, later than the proof window ({} ms) assumed: delivering it again; raise Sql_Trigger_ProofWindowMs (or leave it unset) so a host restart in between cannot lose such a batch",
            window.as_millis()
        )),
        Named::Unnamed => Some(
            "the host retried without naming the attempt that failed: every batch not yet proven is delivered again"
                .to_string(),
        ),
        Named::Nothing | Named::NoBatch => None,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The document: what every tick decides on it
// ---------------------------------------------------------------------------------------------------------------

/// Refuses a document whose positions belong to another source: stored positions would be misread.
pub fn check_fingerprint(doc: &StateDoc, function: &str, configured: &str) -> Result<(), TickError> {
    if doc.fingerprint == configured {
        return Ok(());
    }
    Err(TickError::FingerprintChanged {
        function: function.to_string(),
        stored: doc.fingerprint.clone(),
        configured: configured.to_string(),
    })
}

/// Another owner's lease that still covers a batch in flight: this process keeps out until it expires.
pub fn lease_held_by_another<'a>(doc: &'a StateDoc, owner: &str, now: OffsetDateTime) -> Option<&'a Lease> {
    doc.in_flight.as_ref()?;
    doc.lease.as_ref().filter(|lease| lease.owner != owner && lease.expires_at > now)
}

/// Takes (or renews) the lease for `owner` until `now + duration`. The fencing token grows with every change
/// of owner, so a sink refuses the writes of a deposed one.
pub fn take_lease(doc: &mut StateDoc, owner: &str, duration: std::time::Duration, now: OffsetDateTime) {
    let token = match &doc.lease {
        Some(l) if l.owner == owner => l.token,
        Some(l) => l.token + 1,
        None => 1,
    };
    doc.lease = Some(Lease { owner: owner.to_string(), token, expires_at: now + duration });
}

/// True when `owner`'s lease has less than half of `duration` left (or is not `owner`'s): time to renew it.
pub fn lease_needs_renewal(doc: &StateDoc, owner: &str, duration: std::time::Duration, now: OffsetDateTime) -> bool {
    let half = time::Duration::try_from(duration).unwrap_or(time::Duration::MAX) / 2;
    doc.lease.as_ref().filter(|l| l.owner == owner).is_none_or(|l| l.expires_at - now < half)
}

/// Marks `flight` delivered: the checkpoint moves to its end unless it was a retry of a quarantined batch
/// (the checkpoint passed that one when it was quarantined).
pub fn acknowledge(doc: &mut StateDoc, flight: &InFlight, now: OffsetDateTime) {
    if flight.quarantined.is_none() {
        doc.checkpoint = flight.to.clone();
    }
    doc.counters.delivered += flight.rows;
    doc.counters.batches += 1;
    Pace::record(&mut doc.pace, flight.rows, now);
    doc.in_flight = None;
    doc.progress_at = Some(now);
}

/// On an empty tick with nothing in flight, records a position the source proved empty up to, now and then
/// (every `every`, not every empty tick: an empty tick should cost one read). `true` when it did.
pub fn advance_quiet_checkpoint(
    doc: &mut StateDoc,
    advance: Position,
    now: OffsetDateTime,
    every: time::Duration,
) -> bool {
    let stale = doc.progress_at.is_none_or(|at| now - at >= every);
    if stale && doc.in_flight.is_none() && advance != doc.checkpoint {
        doc.checkpoint = advance;
        doc.progress_at = Some(now);
        return true;
    }
    false
}

/// Why a batch is poison, in the words of the settings that made it so.
pub fn poison_reason(poison: &Poison, now: OffsetDateTime) -> String {
    match poison.failing_since {
        Some(since) => format!(
            "batch {} failed {} time(s) over {} s (Sql_Trigger_MaxAttempts, Sql_Trigger_PoisonAfterMs)",
            poison.batch_id,
            poison.failures,
            (now - since).whole_seconds()
        ),
        None => format!("batch {} failed {} time(s) (Sql_Trigger_MaxAttempts)", poison.batch_id, poison.failures),
    }
}

/// A sink refused batch `batch_id`, delivered under lease token `ours`, as fenced by token `stored`. If the
/// document still gives `owner` the lease under `ours` and holds the batch in flight for it, no owner of this
/// document wrote under a larger token: the destination's token comes from an earlier document (deleted, lost,
/// or restored from a copy, its tokens started again at 1). Then the answer is the token to raise to (above the
/// destination's), set in `doc` with the lease extended; `None`: this owner was deposed, or the state moved on.
pub fn raise_fence(
    doc: &mut StateDoc,
    owner: &str,
    (batch_id, ours, stored): (u64, u64, u64),
    duration: std::time::Duration,
    now: OffsetDateTime,
) -> Option<u64> {
    let holds = doc.lease.as_ref().is_some_and(|lease| lease.token == ours && lease.owner == owner);
    let in_flight = doc.in_flight.as_ref().is_some_and(|f| f.batch_id == batch_id && f.owner == owner);
    if stored <= ours || !holds || !in_flight {
        return None;
    }
    let token = stored + 1;
    if let Some(lease) = doc.lease.as_mut() {
        lease.token = token;
        lease.expires_at = lease.expires_at.max(now + duration);
    }
    Some(token)
}

// ---------------------------------------------------------------------------------------------------------------
// Deferred delivery: the span in flight and what this process remembers of it
// ---------------------------------------------------------------------------------------------------------------

/// True when the span the document records in flight is exactly what `owner` remembers answering.
pub fn remembers(memory: &Answered, doc: &StateDoc, owner: &str) -> bool {
    match (&doc.in_flight, memory.span.front(), memory.span.back()) {
        (None, None, _) => true,
        (Some(f), Some(first), Some(last)) => {
            f.owner == owner
                && f.quarantined.is_none()
                && f.batch_id == last.batch_id
                && f.from == first.from
                && f.to == last.to
                && doc.checkpoint == first.from
        }
        _ => false,
    }
}

/// The document's record of the span: one batch in flight from the checkpoint to the last batch answered.
pub fn span_of(memory: &Answered, owner: &str) -> Option<InFlight> {
    let (first, last) = (memory.span.front()?, memory.span.back()?);
    Some(InFlight {
        batch_id: last.batch_id,
        from: first.from.clone(),
        to: last.to.clone(),
        rows: memory.span.iter().map(|s| s.rows).sum(),
        deliveries: first.deliveries,
        failures: first.failures,
        owner: owner.to_string(),
        final_attempt: memory.span.iter().any(|s| s.owed),
        first_delivered_at: first.first_answered_at,
        last_delivered_at: memory.span.iter().map(|s| s.answered_at).max().unwrap_or(last.answered_at),
        quarantined: None,
        batches: memory.span.len() as u32,
        failing_since: first.failing_since,
    })
}

/// Adopts a span another process answered (or this one before a restart): one owed range, to be delivered
/// again in pages.
pub fn adopt(flight: &InFlight) -> Sent {
    let mut adopted = Sent::owed_range(
        flight.batch_id,
        flight.from.clone(),
        flight.to.clone(),
        flight.rows,
        flight.first_delivered_at,
        flight.last_delivered_at,
        flight.deliveries,
        flight.failures,
        flight.failing_since,
    );
    adopted.answered_by = Some(flight.owner.clone());
    adopted
}

/// Moves the checkpoint (and the counters) over batches proven written: the span's proven prefix, and
/// operators' retries of quarantined batches (which lie before the checkpoint). `true` when anything moved.
pub fn apply_proven(doc: &mut StateDoc, span: &[Arc<Sent>], retries: &[Arc<Sent>], now: OffsetDateTime) -> bool {
    let counted: u64 = span.iter().chain(retries).filter(|s| !s.settled).map(|s| s.rows).sum();
    if !span.is_empty() || !retries.is_empty() {
        Pace::record(&mut doc.pace, counted, now);
    }
    for sent in span {
        doc.checkpoint = sent.to.clone();
        doc.progress_at = Some(now);
        if !sent.settled {
            doc.counters.delivered += sent.rows;
            doc.counters.batches += 1;
        }
    }
    for sent in retries {
        doc.retry_quarantined.retain(|id| *id != sent.batch_id);
        if !sent.settled {
            doc.counters.delivered += sent.rows;
            doc.counters.batches += 1;
        }
    }
    !span.is_empty() || !retries.is_empty()
}
