//! This process's own write during a delivery (the acknowledgement, a lease renewal) that lost its
//! compare-and-swap to an operator's write: applied again on top of the operator's document when that document
//! left everything the write is about as it was.
//!
//! An operator's pause, resume or backfill action landing while a batch is delivered changes fields that the
//! acknowledgement and the renewal do not touch. Giving up the write there would leave the batch unacknowledged
//! and send it again (a duplicate for the consumer, counted as a chunk redone, with no crash behind it). So on a
//! conflict the document is read again and, when it still records the same batch in flight for this process,
//! under the same lease and from the same checkpoint and lineage, the write is applied to it. A document that
//! differs in any of those (a reset or replay, which drop the batch in flight; another instance that took the
//! batch over) is left alone, and the batch is delivered again as before.

use super::super::document::{InFlight, StateDoc};
use super::super::error::TickError;
use super::super::ledger::Ledger;
use super::super::tick::Tick;
use crate::state::Etag;

/// How many times one write is applied again on top of other writers' documents before it gives up.
pub(super) const ATTEMPTS: u32 = 4;

/// Whether `fresh`, read after a lost compare-and-swap, records what `held` (this process's last write) recorded
/// for `owner`: the same batch in flight, the same lease, the same checkpoint and lineage.
fn still_ours(held: &StateDoc, fresh: &StateDoc, owner: &str) -> bool {
    held.in_flight().is_some_and(|f| f.owner == owner)
        && fresh.in_flight() == held.in_flight()
        && fresh.lease() == held.lease()
        && fresh.checkpoint() == held.checkpoint()
        && fresh.lineage() == held.lineage()
}

/// The document as it reads now, when an operator's write left `held`'s batch, lease and checkpoint as they
/// were (`None`: it did not, or there is no document).
pub(super) async fn reread(
    ledger: &Ledger,
    held: &StateDoc,
    owner: &str,
) -> Result<Option<(StateDoc, Etag)>, TickError> {
    Ok(ledger.load().await?.filter(|(fresh, _)| still_ours(held, fresh, owner)))
}

/// Acknowledges `flight` on top of the document as it reads now, when `held` (the document the lost
/// acknowledgement was made on) is still ours there (see the module docs). `true` when written. Nothing is
/// recorded with it: a batch fetched ahead waits for the next tick, which reads the operator's document.
pub(super) async fn acknowledge(ack: &mut Tick<'_>, held: &StateDoc, flight: &InFlight) -> Result<bool, TickError> {
    let trigger = ack.trigger;
    for _ in 0..ATTEMPTS {
        let Some((fresh, etag)) = reread(&trigger.ledger, held, &trigger.owner).await? else { return Ok(false) };
        ack.doc = fresh;
        ack.etag = Some(etag);
        ack.doc.acknowledge(flight, ack.now);
        if ack.commit().await? {
            tracing::info!(function = %trigger.config.name, batch_id = flight.range.batch_id,
                "acknowledged the batch on top of an operator's write made during its delivery");
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::document::Origin;
    use crate::source::BatchRange;
    use serde_json::json;

    fn held() -> StateDoc {
        let origin = Origin { function: "f", source: "s", fingerprint: "fp" };
        let now = time::OffsetDateTime::UNIX_EPOCH;
        let mut doc = StateDoc::new(origin, json!(["1"]), "me", now);
        doc.record_in_flight(InFlight::first_delivery(BatchRange::new(3, json!(["1"]), json!(["9"]), 4), "me", now));
        doc.take_lease("me", std::time::Duration::from_secs(60), now);
        doc
    }

    #[test]
    fn a_pause_or_a_backfill_action_leaves_the_batch_ours_and_a_reset_or_a_takeover_does_not() {
        let held = held();
        let mut paused = held.clone();
        paused.pause();
        assert!(still_ours(&held, &paused, "me"), "a pause touches nothing the acknowledgement writes");
        let mut replayed = held.clone();
        replayed.replay(json!(["0"]));
        assert!(!still_ours(&held, &replayed, "me"), "a replay drops the batch in flight");
        let mut taken = held.clone();
        taken.take_lease("other", std::time::Duration::from_secs(60), time::OffsetDateTime::UNIX_EPOCH);
        assert!(!still_ours(&held, &taken, "me"), "another owner's lease");
        assert!(!still_ours(&held, &held, "other"), "a batch recorded for another process");
    }
}
