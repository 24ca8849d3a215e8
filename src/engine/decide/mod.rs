//! The engine's decisions, as pure functions of the state document, this process's memory, the invocation and
//! `now` (from the engine's clock, so tests move time by hand): acknowledgement by proof (`proof`), leases,
//! poison, the span in flight, and what a tick serves (`serve`). They return choices; the tick applies each as
//! one transition of the document (`document`), which is the only code that changes it.

pub mod backfill;
pub mod liveness;
mod proof;
pub mod serve;

pub use super::document::{Pace, PACE_HORIZON};
pub use proof::{Answered, Named, Sent, HISTORY_KEPT};

use super::document::{InFlight, Lease, StateDoc};
use super::error::TickError;
use crate::config::PoisonAction;
use crate::protocol::Attempt;
use crate::source::BatchRange;
use time::OffsetDateTime;

/// A batch that is poison: what quarantine needs to know of it.
#[derive(Debug, Clone)]
pub struct Poison {
    pub range: BatchRange,
    pub failures: u32,
    /// Since when its failures have lasted (deferred delivery), for the reason's words.
    pub failing_since: Option<OffsetDateTime>,
    /// An operator's retry of a quarantined batch: its document's key (it stays where it is).
    pub quarantined: Option<String>,
    /// The error of its last known failure, if one was recorded (`InFlight::last_error`).
    pub last_error: Option<String>,
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
    if doc.fingerprint() == configured {
        return Ok(());
    }
    Err(TickError::FingerprintChanged {
        function: function.to_string(),
        stored: doc.fingerprint().to_string(),
        configured: configured.to_string(),
    })
}

/// Another owner's lease that still covers a batch in flight: this process keeps out until it expires.
pub fn lease_held_by_another<'a>(doc: &'a StateDoc, owner: &str, now: OffsetDateTime) -> Option<&'a Lease> {
    // A running backfill's chunks may be answered and unproven with nothing in flight (deferred delivery keeps
    // them in the answering process's memory): the lease guards them too.
    if doc.in_flight().is_none() && !doc.backfill().is_some_and(|b| b.open()) {
        return None;
    }
    doc.lease().filter(|lease| lease.owner != owner && lease.expires_at > now)
}

/// True when `owner`'s lease has less than half of `duration` left (or is not `owner`'s): time to renew it.
pub fn lease_needs_renewal(doc: &StateDoc, owner: &str, duration: std::time::Duration, now: OffsetDateTime) -> bool {
    let half = time::Duration::try_from(duration).unwrap_or(time::Duration::MAX) / 2;
    doc.lease().filter(|l| l.owner == owner).is_none_or(|l| l.expires_at - now < half)
}

/// Why a batch is poison, in the words of the settings that made it so.
pub fn poison_reason(poison: &Poison, now: OffsetDateTime) -> String {
    let settings = match poison.failing_since {
        Some(since) => format!(
            "batch {} failed {} time(s) over {} s (Sql_Trigger_MaxAttempts, Sql_Trigger_PoisonAfterMs)",
            poison.range.batch_id,
            poison.failures,
            (now - since).whole_seconds()
        ),
        None => format!("batch {} failed {} time(s) (Sql_Trigger_MaxAttempts)", poison.range.batch_id, poison.failures),
    };
    match &poison.last_error {
        Some(error) => format!("{settings}; last error: {error}"),
        None => settings,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Deferred delivery: the span in flight and what this process remembers of it
// ---------------------------------------------------------------------------------------------------------------

/// True when the span the document records in flight is exactly what `owner` remembers answering.
pub fn remembers(memory: &Answered, doc: &StateDoc, owner: &str) -> bool {
    match (doc.in_flight(), memory.span.front(), memory.span.back()) {
        (None, None, _) => true,
        (Some(f), Some(first), Some(last)) => {
            f.owner == owner
                && f.quarantined.is_none()
                && f.range.batch_id == last.range.batch_id
                && f.range.from == first.range.from
                && f.range.to == last.range.to
                && *doc.checkpoint() == first.range.from
        }
        _ => false,
    }
}

/// The document's record of the span: one batch in flight from the checkpoint to the last batch answered.
pub fn span_of(memory: &Answered, owner: &str) -> Option<InFlight> {
    let (first, last) = (memory.span.front()?, memory.span.back()?);
    let rows = memory.span.iter().map(|s| s.range.rows).sum();
    Some(InFlight {
        range: BatchRange::new(last.range.batch_id, first.range.from.clone(), last.range.to.clone(), rows),
        deliveries: first.deliveries,
        failures: first.failures,
        owner: owner.to_string(),
        final_attempt: memory.span.iter().any(|s| s.owed),
        first_delivered_at: first.first_answered_at,
        last_delivered_at: memory.span.iter().map(|s| s.answered_at).max().unwrap_or(last.answered_at),
        quarantined: None,
        batches: memory.span.len() as u32,
        failing_since: first.failing_since,
        last_error: None,
    })
}

/// Adopts a span another process answered (or this one before a restart): one owed range, to be delivered
/// again in pages.
pub fn adopt(flight: &InFlight) -> Sent {
    let mut adopted = Sent::owed_range(flight.range.clone(), flight.first_delivered_at);
    adopted.answered_at = flight.last_delivered_at;
    adopted.deliveries = flight.deliveries;
    adopted.failures = flight.failures;
    adopted.failures_recorded = flight.failures;
    adopted.failing_since = flight.failing_since;
    adopted.answered_by = Some(flight.owner.clone());
    adopted
}

/// What to do with a batch found in flight by a tick that does not wait for the host's proof (a sink tick, or
/// immediate delivery): nobody proved it delivered, so it goes again, unless it is poison.
#[derive(Debug)]
pub enum Stuck {
    /// Deliver it again.
    Redeliver,
    /// Poison, and `Sql_Trigger_PoisonAction=halt`: stop the function at it.
    Halt(Poison),
    /// Poison: quarantine it and move on.
    Quarantine(Poison),
}

/// See [`Stuck`]: a batch is poison after `max_attempts` known failures.
pub fn stuck(flight: &InFlight, max_attempts: u32, action: PoisonAction) -> Stuck {
    if flight.failures < max_attempts {
        return Stuck::Redeliver;
    }
    let poison = Poison {
        range: flight.range.clone(),
        failures: flight.failures,
        failing_since: flight.failing_since,
        quarantined: flight.quarantined.clone(),
        last_error: flight.last_error.clone(),
    };
    match action {
        PoisonAction::Halt => Stuck::Halt(poison),
        _ => Stuck::Quarantine(poison),
    }
}

/// What a poison batch of deferred delivery (`sent`) comes to, under `action`.
pub fn poison_of(sent: &Sent) -> Poison {
    Poison {
        range: sent.range.clone(),
        failures: sent.failures,
        failing_since: sent.failing_since,
        quarantined: sent.quarantined.clone(),
        last_error: None,
    }
}

/// What this process last saw of a function's document: its identity (`StateDoc::lineage`), its fencing
/// token, and how many batches it had settled (acknowledged or quarantined), which only grows while it lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lineage {
    pub id: String,
    pub token: u64,
    pub settled: u64,
}

impl Lineage {
    pub fn of(doc: &StateDoc) -> Self {
        Self {
            id: doc.lineage().to_string(),
            token: doc.lease().map_or(0, |l| l.token),
            settled: doc.counters().batches.saturating_add(doc.counters().quarantined),
        }
    }
}

/// Why `doc` cannot follow what this process saw (`seen`), if it cannot: within one lineage its fencing token
/// went back while it settled no fewer batches, so it was edited by hand (tokens only grow, see
/// `StateDoc::take_lease`). Another lineage (a document deleted and created again, or reset by an operator)
/// restarts its tokens on purpose (sink mode then raises them above the destination's), and so does a
/// document that settled fewer batches (written before lineages existed, and recreated).
pub fn token_moved_back(doc: &StateDoc, seen: &Lineage) -> Option<String> {
    let now = Lineage::of(doc);
    let same = now.id == seen.id;
    (same && now.settled >= seen.settled && now.token < seen.token).then(|| {
        format!(
            "field `lease.token` is {}, below the {} this process saw on the same document: fencing tokens never go back, and a lower one would let a deposed owner's writes through",
            now.token, seen.token
        )
    })
}

/// Why the batch in flight cannot be, by the source's order of positions (`order(a, b)`, when the source can
/// tell): its end before its start.
pub fn span_backward(
    doc: &StateDoc,
    order: impl Fn(&crate::source::Position, &crate::source::Position) -> Option<std::cmp::Ordering>,
) -> Option<String> {
    let flight = doc.in_flight()?;
    (order(&flight.range.from, &flight.range.to) == Some(std::cmp::Ordering::Greater)).then(|| {
        format!(
            "field `in_flight.to` ({}) comes before `in_flight.from` ({}): a batch ends after it starts",
            flight.range.to, flight.range.from
        )
    })
}
