//! The state document: one per function, the only durable memory of the trigger.
//!
//! Who writes what: the tick writes everything below in one compare-and-swap; operators (CLI, admin routes)
//! write `paused`, `halted` and `checkpoint` (reset) through the same CAS. `checkpoint` only moves forward
//! except by an explicit operator reset. Every write carries a fresh `write_id`, so no two writes are
//! byte-identical and content-hash etags stay unique.

use super::decide::Pace;
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
}

/// How many quarantine entries the state document keeps; older ones stay listed in the store.
pub const QUARANTINE_KEPT: usize = 50;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct InFlight {
    pub batch_id: u64,
    /// The checkpoint the batch was fetched after (exclusive).
    pub from: Position,
    /// The position of its last change (inclusive).
    pub to: Position,
    pub rows: u64,
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
}

impl InFlight {
    /// A batch delivered for the first time, by `owner` at `now`.
    pub fn first_delivery(
        batch_id: u64,
        from: Position,
        to: Position,
        rows: u64,
        owner: &str,
        now: OffsetDateTime,
    ) -> Self {
        Self {
            batch_id,
            from,
            to,
            rows,
            deliveries: 1,
            failures: 0,
            owner: owner.to_string(),
            final_attempt: false,
            first_delivered_at: now,
            last_delivered_at: now,
            quarantined: None,
            batches: 1,
            failing_since: None,
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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QuarantineEntry {
    pub batch_id: u64,
    /// The store key of the quarantine document holding the batch's changes.
    pub key: String,
    pub rows: u64,
    pub from: Position,
    pub to: Position,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

/// What a quarantine document holds: enough to inspect and to re-deliver the batch.
#[derive(Debug, Serialize, Deserialize)]
pub struct QuarantineDoc {
    pub function: String,
    pub batch_id: u64,
    pub from: Position,
    pub to: Position,
    pub failures: u32,
    pub reason: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The changes as they were when quarantined.
    pub changes: Box<serde_json::value::RawValue>,
}

impl QuarantineDoc {
    pub fn decode_changes(&self) -> Result<Vec<crate::change::Change>, String> {
        serde_json::from_str(self.changes.get()).map_err(|e| format!("the stored changes do not decode: {e}"))
    }
}
