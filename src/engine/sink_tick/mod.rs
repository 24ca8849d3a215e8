//! Sink delivery mode: the handler delivers each batch itself, and the checkpoint moves only after the sink
//! took it. The guarantee no longer depends on the host's output bindings: at-least-once with any sink,
//! exactly-once with a SQL sink that records what it applied in the rows' transaction.
//!
//! # One tick, and why in this order
//! 1. **Record** (the shared tick path): resolve a batch left in flight, fetch, and record the batch in flight
//!    under this instance's lease with one conditional write. Recording before delivering is what lets a
//!    crash anywhere later be repaired: the next owner finds the batch in flight and delivers the same range
//!    again. A batch found in flight is never acknowledged from memory here: only a sink's `Ok` in the tick
//!    that delivered it proves delivery.
//! 2. **Deliver** the batch with its id, its range and the lease token as fencing token. A heartbeat task
//!    renews the lease meanwhile (four times per lease, as the official trigger renews its 60 s lease every
//!    15 s), so a long delivery is not taken over. The task belongs to a guard: it ends with the tick, also
//!    when the tick is abandoned (timeout), so no lease outlives the work it covers.
//! 3. **Acknowledge** with a second conditional write (checkpoint := batch end). A crash between 2 and 3
//!    (failpoint `after-sink`) re-delivers the batch: the upsert absorbs it, an exactly-once sink skips it.
//!
//! Sink failures: `Rejected` is a known failure, counted toward `Sql_Trigger_MaxAttempts` (then quarantine
//! or halt); `Transient` is not counted (a destination outage must not quarantine batches); `Fenced` means a
//! newer owner already wrote, which is treated like a lost compare-and-swap: nothing acknowledged or counted,
//! unless the state document shows that no owner of it wrote the destination's token (see
//! `raise_fence`): then the token is raised past it and the next tick delivers the batch again.
//!
//! A delivering tick costs two conditional writes (record, acknowledge), plus a read when this process did not
//! write the state last (see `Trigger::run`) and one write per heartbeat; while a backlog drains, one
//! write (see "Chaining").
//!
//! # Chaining
//! While a backlog drains, the acknowledgement of batch N also records batch N+1 (fetched ahead, see below)
//! in flight under the same lease: one conditional write instead of two. The next tick then delivers N+1
//! straight away, from the document this process wrote, without reading or writing the state first. This
//! is the same record step, made earlier: a crash leaves N+1 in flight for the next owner to re-deliver, as
//! a crash during any delivery does. It is used only while the lease has at least half its duration left
//! (else the tick goes the ordinary way and re-records the batch), not while an operator has queued
//! quarantined batches, and a clean stop of `handler run` withdraws an undelivered chained batch so the next
//! instance need not wait out the lease. An operator's pause between the two ticks is seen one batch later:
//! the chained batch is delivered, and its acknowledgement, which fails the compare-and-swap, is applied again
//! on top of the operator's document (`reapply`: the pause left the batch in flight as it was), so nothing is
//! sent twice; the next tick acts on the pause. A reset or replay drops the batch in flight: its
//! acknowledgement is then given up, and the batch is delivered again (the sink absorbs the duplicate).
//!
//! # Resuming from the destination
//! The state document is the engine's memory; an exactly-once SQL sink's checkpoint row is the record of
//! what was applied, written in the rows' own transaction. They can disagree only when the document is
//! new: its blob was deleted or lost, and the tick started over from `startFrom`, which would re-apply
//! (`earliest`) or skip (`now`) batches the destination already has or never got. The fence has the same
//! blind spot: a new document's lease tokens start again at 1, below the token the destination holds, and
//! every write would be refused as fenced. So while the document has acknowledged nothing (no batch
//! delivered or quarantined under it, which is how a new document looks), a delivering tick first asks
//! the sink what it recorded ([`Sink::resume_position`]; one small query, and none once a batch is
//! acknowledged). If the sink's last applied batch ends elsewhere than where this batch starts (and is not
//! this very batch), the batch just recorded is dropped undelivered and the document is rewritten with one
//! conditional write: checkpoint at the end of the applied batch, batch ids after its id, the lease token
//! above any the destination saw (so a writer of the lost document's lineage is refused); the tick then
//! starts again from there. If only the destination's fencing token is larger than this instance's, the
//! same write raises the token and the batch is delivered as recorded. A conditional write that fails
//! means another instance moved first, and the tick delivers nothing. Consequence for operators: to
//! re-apply everything after deleting a function's state, delete its checkpoint row in the target too (a
//! `reset` or `replay` of a document that has acknowledged batches is not affected).
//!
//! # Fetching ahead
//! While a full batch is being delivered (a backlog is draining) the next batch is fetched at the same time,
//! on another connection, and kept for the next tick if that tick starts where this batch ends. A drain then
//! costs about the time of its writes instead of writes plus reads. This is the same as fetching earlier:
//! the late-commit guard means no change can later appear inside the range a fetch returned, and a row
//! changed since is delivered again later with its newer values, exactly as when a delivery is slow. A
//! fetch kept longer than one lease duration is dropped.

mod heartbeat;
mod reapply;
mod reconcile;

pub(super) use reconcile::reconcile;

use super::document::{InFlight, StateDoc};
use super::error::TickError;
use super::outcome::{OutcomeKind, TickOutcome};
use super::parts::{Ahead, Chained, Memory, Trigger};
use super::tick::{Ended, Tick};
use crate::failpoint;
use crate::sink::{Sink, SinkBatch, SinkError};
use crate::source::BatchRange;
use crate::source::{Fetched, Position};
use heartbeat::{Heartbeat, Heldover};

/// The batch the previous tick recorded in flight together with its acknowledgement, ready to deliver without
/// touching the state store, if the document this process wrote last still records it under this process's
/// lease with at least half the lease left (so the heartbeat starts well before it could lapse). Taken either
/// way: a chained batch not used now goes the ordinary way (re-fetched, re-recorded).
pub(super) fn take_chained(trigger: &Trigger, memory: &mut Memory) -> Option<Ended> {
    let chained = memory.take_chained()?;
    let (doc, etag) = memory.last_written().cloned()?;
    let owner = &trigger.owner;
    let flight = doc.in_flight().filter(|f| f.range.batch_id == chained.range.batch_id && f.owner == *owner)?;
    let lease = doc.lease().filter(|l| l.owner == *owner)?;
    let left = lease.expires_at - trigger.ledger.clock().now();
    if left < trigger.config.settings.lease_duration / 2 || doc.paused() || doc.halted().is_some() {
        return None;
    }
    let mut out = TickOutcome {
        kind: OutcomeKind::Delivered,
        batch_id: Some(flight.range.batch_id),
        fence: lease.token,
        ..TickOutcome::default()
    };
    out.logs.push(format!(
        "delivering batch {} with {} change(s), recorded in flight with the previous batch's acknowledgement",
        flight.range.batch_id,
        chained.changes.len()
    ));
    out.changes = chained.changes;
    Some(Ended { out, written: Some((doc, etag)) })
}

/// On a clean stop: a batch recorded in flight with the last acknowledgement and never delivered is withdrawn
/// (nothing in flight, the lease released), so the next instance starts at once instead of waiting out this
/// one's lease. `Ok(false)`: there was none, or the state moved on (then nothing is written and the batch is
/// delivered by whoever holds the state, as after a crash).
pub(super) async fn withdraw_chained(trigger: &Trigger, memory: &mut Memory) -> Result<bool, TickError> {
    let Some(chained) = memory.take_chained() else { return Ok(false) };
    let Some((doc, etag)) = memory.last_written().cloned() else { return Ok(false) };
    let mut tick = Tick::on_written(trigger, memory, doc, etag);
    if !tick.doc.withdraw(chained.range.batch_id, &trigger.owner, tick.now) {
        return Ok(false);
    }
    tick.commit().await
}

/// On a clean stop, after [`withdraw_chained`]: lets this process's lease on the state document lapse now (the
/// lease of the last batch it delivered, acknowledged or not). From the document this process wrote last, else
/// as stored; a write that loses its compare-and-swap is tried again on what is stored then, where the lease
/// may be another owner's (then nothing is written). `Ok(false)`: no live lease of this process to release.
pub(super) async fn release_lease(trigger: &Trigger, memory: &mut Memory) -> Result<bool, TickError> {
    if !memory.ever_wrote() {
        return Ok(false);
    }
    for _ in 0..RELEASE_ATTEMPTS {
        let (doc, etag) = match memory.last_written().cloned() {
            Some(written) => written,
            None => match trigger.ledger.load().await? {
                Some(stored) => stored,
                None => return Ok(false),
            },
        };
        let mut tick = Tick::on_written(trigger, memory, doc, etag);
        if !tick.doc.release_lease(&trigger.owner, tick.now) {
            return Ok(false);
        }
        if tick.commit().await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// How often [`release_lease`] reads and writes again after losing a compare-and-swap.
const RELEASE_ATTEMPTS: usize = 3;

/// Delivers the batch the recording tick put in flight (`recorded`), if any, from the document that tick wrote,
/// and acknowledges it.
pub(super) async fn deliver(
    trigger: &Trigger,
    memory: &mut Memory,
    sink: &dyn Sink,
    recorded: Ended,
) -> Result<TickOutcome, TickError> {
    let Ended { mut out, written } = recorded;
    let (Some(batch_id), Some((doc, etag))) = (out.batch_id, written) else { return Ok(out) };
    let Some(flight) = doc.in_flight().cloned() else { return Ok(out) };

    let heartbeat = Heartbeat::start(trigger, doc, etag);
    let batch = SinkBatch {
        app: trigger.ledger.app(),
        function: &trigger.config.name,
        fence: out.fence,
        changes: &out.changes,
        range: &flight.range,
    };
    let limit = trigger.config.settings.max_batch_size;
    // (A backfill chunk is not followed by live changes fetched ahead: the share decides what comes next.)
    let draining = out.changes.len() >= limit && flight.quarantined.is_none() && flight.range.backfill.is_none();
    let (delivered, ahead) = tokio::join!(
        async {
            // A re-fetched range whose rows all moved on since holds nothing: there is nothing to hand over,
            // and acknowledging it is right (its rows come again later with their newer values).
            if batch.changes.is_empty() {
                Ok(())
            } else {
                sink.deliver(&batch).await
            }
        },
        async {
            match draining {
                true => trigger.source.fetch(&flight.range.to, limit).await.ok().filter(|f| !f.changes.is_empty()),
                false => None,
            }
        }
    );
    let Heldover { doc, etag, lost } = heartbeat.stop().await;
    let held = doc.clone();
    let mut ack = Tick::on_written(trigger, memory, doc, etag);

    match delivered {
        Ok(()) => acknowledge(&mut ack, sink, (&flight, &held), ahead, lost, out).await,
        Err(SinkError::Fenced { ours, stored }) => {
            if lost.is_none() {
                // The destination's token may come from an earlier document of this function (see "Resuming
                // from the destination" for a new one; a document restored from a copy has acknowledged batches
                // and is not reconciled): then the token is raised, and the next tick delivers the batch again
                // under it, as a batch whose delivery is not proven.
                if let Some(token) = raise_fence(&mut ack, (batch_id, ours, stored)).await? {
                    out.kind = OutcomeKind::Conflict;
                    out.changes.clear();
                    out.logs.push(format!(
                        "batch {batch_id} not written: {} holds fencing token {stored}, above this state document's {ours}; no owner of this document wrote it, so the token was raised to {token} and the next tick delivers the batch again",
                        sink.describe()
                    ));
                    return Ok(out);
                }
            }
            let line = format!(
                "batch {batch_id} not written: {} has seen fencing token {stored} from a newer owner (this instance holds {ours}); it lost its lease and delivers nothing",
                sink.describe()
            );
            tracing::warn!(function = %trigger.config.name, batch_id, "{line}");
            out.kind = OutcomeKind::Conflict;
            out.changes.clear();
            out.logs.push(line);
            Ok(out)
        }
        Err(e) => {
            // A known failure of this batch: durable, so that MaxAttempts counts across processes.
            if matches!(e, SinkError::Rejected(_)) && ack.doc.record_failure(&e.to_string()) {
                if let Err(store) = ack.commit().await {
                    tracing::warn!(function = %trigger.config.name, batch_id, error = %store,
                        "could not record the sink's rejection; this failure is not counted");
                }
            }
            Err(TickError::Sink(e))
        }
    }
}

/// The sink took `flight`'s batch: acknowledges it from `ack` (on the document the heartbeat left, `held`) with
/// one conditional write, which also records the batch fetched `ahead` in flight when the next tick would serve
/// live changes first (see "Chaining" in the module docs); else the batch fetched ahead is kept for the next
/// tick. `lost`: why the heartbeat stopped renewing early, if it did.
async fn acknowledge(
    ack: &mut Tick<'_>,
    sink: &dyn Sink,
    (flight, held): (&InFlight, &StateDoc),
    ahead: Option<Fetched>,
    lost: Option<String>,
    mut out: TickOutcome,
) -> Result<TickOutcome, TickError> {
    let trigger = ack.trigger;
    let batch_id = flight.range.batch_id;
    failpoint::hit("after-sink");
    if flight.range.backfill.is_some() {
        // The same point for a backfill's chunk only, so a test can crash inside a backfill while live batches
        // interleave with its chunks.
        failpoint::hit("after-sink-chunk");
    }
    ack.doc.acknowledge(flight, ack.now);
    // Draining: the batch fetched ahead is recorded in flight by this same write (see "Chaining" in the module
    // docs) when the next tick would serve live changes first (`decide::serve`): not while an operator queued
    // quarantined batches, which go first, nor while a running backfill is owed its turn.
    let chainable = ack.serve_recorded().starts_live() && !ack.doc.paused() && ack.doc.halted().is_none();
    let (chain, keep) = if chainable { (ahead, None) } else { (None, ahead) };
    let mut next = chain.map(|fetched| {
        let last = fetched.last.clone().unwrap_or(Position::Null);
        let rows = fetched.changes.len() as u64;
        let range = BatchRange::new(ack.doc.allocate_batch_id(), flight.range.to.clone(), last, rows);
        let next = InFlight::first_delivery(range.clone(), &trigger.owner, ack.now);
        ack.doc.record_in_flight(next);
        ack.doc.take_lease(&trigger.owner, trigger.config.settings.lease_duration, ack.now);
        Chained { range, changes: fetched.changes }
    });
    let mut acknowledged = ack.commit().await?;
    if !acknowledged {
        // An operator's write (a pause, a backfill action) landed during the delivery: acknowledge on top of it
        // when it left this batch as it was, rather than deliver the batch again.
        next = None;
        acknowledged = reapply::acknowledge(ack, held, flight).await?;
    }
    if acknowledged {
        if next.is_some() {
            ack.memory.served_live();
        }
        ack.memory.chain(next);
        if let Some(fetched) = keep {
            let after = flight.range.to.clone();
            ack.memory.fetched_ahead(Ahead { after, fetched, at: ack.now });
        }
        out.logs.push(format!(
            "batch {batch_id} with {} change(s) delivered to {} and acknowledged",
            out.changes.len(),
            sink.describe()
        ));
    } else {
        let why = lost.map(|l| format!(" ({l})")).unwrap_or_default();
        out.logs.push(format!(
            "batch {batch_id} was delivered to {}, but the state changed before its acknowledgement{why}; it will be delivered again and the sink absorbs the duplicate",
            sink.describe()
        ));
    }
    Ok(out)
}

/// A sink refused batch `batch_id`, delivered under lease token `ours`, as fenced by token `stored`: see
/// `StateDoc::raise_fence`. When the document allows it, the token goes above the destination's with one
/// conditional write, and the answer is the token to deliver the same batch under again (not counted as a
/// failure); `None`: this instance was deposed, or the state moved on, and it delivers nothing more of it.
async fn raise_fence(ack: &mut Tick<'_>, (batch_id, ours, stored): (u64, u64, u64)) -> Result<Option<u64>, TickError> {
    let trigger = ack.trigger;
    let lease = trigger.config.settings.lease_duration;
    let Some(token) = ack.doc.raise_fence(&trigger.owner, (batch_id, ours, stored), lease, ack.now) else {
        return Ok(None);
    };
    if !ack.commit().await? {
        return Ok(None);
    }
    tracing::warn!(function = %trigger.config.name, batch_id,
        "the sink holds fencing token {stored}, above this state document's {ours}, which no owner of this document wrote: the document is newer than the sink's record (deleted, lost or restored, its tokens restarted); delivering under token {token}");
    Ok(Some(token))
}
