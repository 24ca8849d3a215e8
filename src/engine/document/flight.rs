//! The batch in flight and the counters: what a tick records before it delivers, and how an acknowledgement,
//! a re-delivery, a failure or a resumption from the destination moves the document on. Each transition says
//! which tick calls it.

use super::lease::Lease;
use super::pace::Pace;
use super::StateDoc;
use crate::source::{BatchRange, Position};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// A batch (in deferred delivery, a span of batches) handed out and not yet acknowledged: the document's
/// `in_flight`. Recorded by a tick before it delivers; cleared by the acknowledgement that proves it written.
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

/// What the function did since its document was created, for status and metrics; counted by the tick's
/// transitions only.
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

/// The tick's transitions of the batch in flight, the checkpoint and the counters.
impl StateDoc {
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
    pub(super) fn pass(&mut self, range: &BatchRange) {
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

    /// One more known failure of the batch in flight (durable, so `Sql_Trigger_MaxAttempts` counts across
    /// processes), with its error (`error`, secret-free like every error, shown in the quarantine document's or
    /// the halt's reason). `false` when nothing is in flight. Who: a sink tick whose sink rejected the batch.
    pub fn record_failure(&mut self, error: &str) -> bool {
        let Some(flight) = self.in_flight.as_mut() else { return false };
        flight.failures += 1;
        flight.last_error = Some(error.to_string());
        true
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
}
