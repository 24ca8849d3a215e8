//! The tick of the deliveries that do not wait for the host's proof: a sink's, whose batch is recorded in
//! flight under a lease and acknowledged once the sink took it (`sink_tick`), and `immediate`, which
//! acknowledges before answering (the mode's at-most-once promise). A batch found in flight (a sink tick that
//! did not finish, another instance's) is always delivered again, unless it is poison.

use super::decide::serve::{Next, Recorded};
use super::decide::Stuck;
use super::document::InFlight;
use super::error::TickError;
use super::fetch::{self, Batch};
use super::outcome::OutcomeKind;
use super::tick::{Tick, ADVANCE_EVERY};
use crate::failpoint;
use crate::source::BatchRange;
use crate::source::Position;

/// How a recorded batch is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Acknowledge {
    /// At once, before answering (immediate delivery).
    AtOnce,
    /// After the sink took it: recorded in flight under this process's lease until then.
    AfterSink,
}

/// One recorded tick: resolve a batch left in flight, else take an operator's retry of a quarantined batch or
/// fetch the next batch (what `decide::serve` says, read by `fetch`), and record it with one conditional write.
pub(super) async fn record(tick: &mut Tick<'_>, ack: Acknowledge) -> Result<(), TickError> {
    let next = match tick.serve_recorded() {
        Recorded::Next(next) => next,
        Recorded::InFlight { flight, stuck } => {
            match *stuck {
                Stuck::Redeliver => return redeliver(tick, ack, *flight).await,
                Stuck::Halt(poison) => return tick.halt(&poison).await,
                Stuck::Quarantine(poison) => {
                    let live = tick.doc.checkpoint().clone();
                    let changes = fetch::again(tick, &flight.range, flight.quarantined.as_deref(), &live).await?;
                    tick.quarantine(&poison, changes).await?;
                    tick.doc.pass_quarantined(&flight);
                }
            }
            // Nothing is in flight now: what comes next is decided on the document as it is.
            tick.serve_after_flight()
        }
    };

    // A quarantined batch an operator asked to retry goes before new changes; it does not move the checkpoint,
    // which passed it when it was quarantined. Then live changes and a backfill's chunks share the tick
    // (`decide::backfill`); nothing is in flight here, so a chunk read that finds nothing ends the backfill.
    // The live changes handed over end at the checkpoint (a batch fetched ahead was not handed over, and goes
    // after the chunk).
    let Batch { mut fetched, from, chunk, quarantined } = match next {
        Next::QuarantineRetry(batch_id) => {
            tick.doc.take_quarantine_retry();
            tick.dirty = true;
            fetch::quarantined(tick, batch_id).await?
        }
        Next::New(fresh) => fetch::fresh(tick, &fresh).await?,
    };
    let fetched_advance = fetched.advance.take();
    if fetched.changes.is_empty() {
        if quarantined.is_none() && chunk.is_none() {
            tick.out.proven = Some(fetched_advance.clone().unwrap_or_else(|| tick.doc.checkpoint().clone()));
        }
        if let Some(advance) = fetched_advance {
            tick.dirty |= tick.doc.advance_quiet(advance, tick.now, ADVANCE_EVERY);
        }
        tick.commit_if_dirty().await?;
        return Ok(());
    }
    failpoint::hit("after-fetch");
    let last = fetched.last.clone().unwrap_or(Position::Null);
    let (id, rows) = (tick.doc.allocate_batch_id(), fetched.changes.len() as u64);
    let range = match &chunk {
        Some(backfill) => BatchRange::chunk(id, from, last, rows, backfill),
        None => BatchRange::new(id, from, last, rows),
    };
    let flight = InFlight { quarantined, ..InFlight::first_delivery(range, &tick.trigger.owner, tick.now) };
    let batch_id = flight.range.batch_id;
    record_delivery(tick, flight, ack);
    if !tick.commit().await? {
        return Ok(());
    }
    failpoint::hit("after-commit");
    match chunk {
        Some(_) => tick.memory.served_chunk(),
        None => tick.memory.served_live(),
    }
    let line = match &chunk {
        Some(id) => {
            format!("delivering batch {batch_id}, a chunk of backfill {id}, with {} row(s)", fetched.changes.len())
        }
        None => format!("delivering batch {batch_id} with {} change(s)", fetched.changes.len()),
    };
    tick.answer(OutcomeKind::Delivered, batch_id, fetched.changes, line);
    Ok(())
}

/// Records that `flight` is being delivered: in flight under a lease (a sink's tick), or acknowledged at once.
fn record_delivery(tick: &mut Tick<'_>, flight: InFlight, ack: Acknowledge) {
    match ack {
        Acknowledge::AtOnce => tick.doc.acknowledge(&flight, tick.now),
        Acknowledge::AfterSink => {
            tick.doc.record_in_flight(flight);
            tick.doc.take_lease(&tick.trigger.owner, tick.trigger.config.settings.lease_duration, tick.now);
        }
    }
}

/// Sends a batch in flight again: the same range as the rows are now, or the stored changes of a quarantined
/// batch.
async fn redeliver(tick: &mut Tick<'_>, ack: Acknowledge, flight: InFlight) -> Result<(), TickError> {
    // The batch in flight is the only one after the checkpoint handed over.
    let live = tick.doc.checkpoint().clone();
    let changes = fetch::again(tick, &flight.range, flight.quarantined.as_deref(), &live).await?;
    let owner = tick.trigger.owner.clone();
    let why = if flight.owner != owner {
        format!("it was answered by {} and its outcome is unknown", flight.owner)
    } else {
        "its delivery was not acknowledged".to_string()
    };
    tick.doc.count_redelivery(&flight, &owner);
    let again = InFlight {
        owner,
        deliveries: flight.deliveries + 1,
        final_attempt: false,
        last_delivered_at: tick.now,
        ..flight.clone()
    };
    record_delivery(tick, again, ack);
    if !tick.commit().await? {
        return Ok(());
    }
    let line = format!(
        "re-delivering batch {} with {} change(s) because {why} (delivery {}, {} known failure(s))",
        flight.range.batch_id,
        changes.len(),
        flight.deliveries + 1,
        flight.failures
    );
    tick.answer(OutcomeKind::Redelivered, flight.range.batch_id, changes, line);
    Ok(())
}
