//! Resuming from the destination: a state document that has acknowledged nothing asks the sink what it
//! recorded (see "Resuming from the destination" in the sink tick's module docs).

use super::super::error::TickError;
use super::super::parts::{Memory, Trigger};
use super::super::tick::{Ended, Tick};
use crate::sink::{Resume, Sink};
use crate::source::BatchRange;

/// See "Resuming from the destination" in the module docs. Leaves the `recorded` tick to be delivered as it is
/// (its lease token raised, or replaced by a conflict when another instance moved first), or answers the lines
/// that say where the document was moved, after which the tick starts again.
pub(in crate::engine) async fn reconcile(
    trigger: &Trigger,
    memory: &mut Memory,
    sink: &dyn Sink,
    recorded: &mut Ended,
) -> Result<Option<Vec<String>>, TickError> {
    let out = &recorded.out;
    let Some((doc, _)) = recorded.written.as_ref() else { return Ok(None) };
    let Some(flight) = doc.in_flight() else { return Ok(None) };
    let acknowledged_nothing = doc.counters().batches == 0 && doc.counters().quarantined == 0;
    if out.batch_id.is_none() || !acknowledged_nothing || flight.quarantined.is_some() {
        return Ok(None);
    }
    let Some(Resume { fence, applied }) =
        sink.resume_position(trigger.ledger.app(), &trigger.config.name).await.map_err(TickError::Sink)?
    else {
        return Ok(None);
    };
    let this_batch = |a: &crate::sink::Applied| {
        a.batch_id == flight.range.batch_id && a.from == flight.range.from && a.to == flight.range.to
    };
    // A document seeded by a change of the partition count knows its checkpoint: the destination's record under
    // this function name may come from a partition of the old layout, another set of keys, whose position would
    // skip this one's changes. Only the fencing token is taken from it.
    let seeded = doc.seeded().is_some();
    let moved = applied.filter(|a| !seeded && a.to != flight.range.from && !this_batch(a));
    if moved.is_none() && fence <= out.fence {
        return Ok(None);
    }

    let Some((doc, etag)) = recorded.written.take() else { return Ok(None) };
    let ours = out.fence;
    let mut tick = Tick::on_written(trigger, memory, doc, etag);
    let line = match &moved {
        // The document's lineage is new: its token goes above anything the destination saw, so a writer of the
        // earlier lineage that still holds a batch is refused.
        Some(applied) => {
            let range = BatchRange::new(applied.batch_id, applied.from.clone(), applied.to.clone(), 0);
            // Released at once: the next fetch takes it again and keeps the token (same owner).
            let dropped = tick.doc.continue_after(&range, &trigger.owner, ours.max(fence) + 1, tick.now);
            let (rows, from) = dropped.map(|f| (f.range.rows, f.range.from)).unwrap_or_default();
            format!(
                "the state document has acknowledged nothing, but {} records batch {} as applied up to {}: continuing after it, under fencing token {} (the {rows} change(s) fetched after {from} are dropped undelivered)",
                sink.describe(),
                applied.batch_id,
                applied.to,
                ours.max(fence) + 1,
            )
        }
        // The batch recorded stays as it is (its id and range name it to an exactly-once sink): only the token
        // moves above the destination's.
        None => {
            tick.doc.raise_token(fence + 1);
            format!(
                "{} holds fencing token {fence}, above this state document's {ours}: a new state document restarted the tokens; batch {} goes under token {}",
                sink.describe(),
                out.batch_id.unwrap_or_default(),
                fence + 1
            )
        }
    };
    tracing::warn!(function = %trigger.config.name, "{line}");
    if !tick.commit().await? {
        *recorded = tick.end();
        return Ok(None);
    }
    if moved.is_some() {
        return Ok(Some(vec![line]));
    }
    recorded.written = tick.end().written;
    recorded.out.fence = fence + 1;
    recorded.out.logs.insert(0, line);
    Ok(None)
}
