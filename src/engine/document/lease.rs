//! Who may act on the batch in flight: the lease, its fencing token, and the transitions that take, renew,
//! release and raise it. Each says which tick (or which stop of `handler run`) calls it.

use super::StateDoc;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// Who may act on the batch in flight, until when, under which fencing token (a sink refuses a smaller one).
/// Taken by a tick recording a batch; extended by the sink tick's heartbeat; released by a clean stop.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Lease {
    pub owner: String,
    /// Grows on every change of owner; sinks reject writes carrying a smaller one.
    pub token: u64,
    #[serde(with = "time::serde::rfc3339")]
    pub expires_at: OffsetDateTime,
}

/// The lease's transitions.
impl StateDoc {
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
}
