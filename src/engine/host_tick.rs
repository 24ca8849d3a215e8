//! The deferred tick: answer the host, and acknowledge only by proof (see `decide` for the rule and
//! docs/architecture.md for the argument). One tick:
//! 1. The span in flight must be the one this process remembers; otherwise nobody can prove any of it, and it
//!    is all delivered again from the checkpoint.
//! 2. The checkpoint moves over the batches proven written.
//! 3. An owed batch (a retry named it, or it was answered on a final attempt) is quarantined if it is poison,
//!    else answered again; otherwise an operator's retry of a quarantined batch is answered; otherwise the next
//!    batch is fetched after the span.
//! 4. One conditional write records all of it (nothing to record, no write). Only then does this process
//!    remember what it answered, so a tick that fails or loses the race leaves its memory as it was.

use super::decide::serve::{Deferred, Fresh, Next};
use super::decide::{self, Answered, Sent};
use super::error::TickError;
use super::fetch::{self, Batch};
use super::ledger::Ledger;
use super::outcome::OutcomeKind;
use super::tick::{Tick, ADVANCE_EVERY};
use crate::change::Change;
use crate::config::PoisonAction;
use crate::failpoint;
use crate::protocol::Attempt;
use crate::source::BatchRange;
use crate::source::Position;
use std::sync::Arc;

/// What a tick answers: the batch, its changes, and whether it was answered before.
struct Reply {
    batch_id: u64,
    changes: Vec<Change>,
    kind: OutcomeKind,
    why: Option<String>,
}

/// One deferred tick on `tick`, answering `attempt` (see the module docs for its four steps).
pub(super) async fn deferred(tick: &mut Tick<'_>, attempt: &Attempt) -> Result<(), TickError> {
    let trigger = tick.trigger;
    let settings = &trigger.config.settings;
    let owner = trigger.owner.as_str();
    // Worked on as a copy, kept only if the tick's write goes through (each batch is shared, so the copy is
    // cheap, see `Answered`).
    let mut answered = tick.memory.unproven().clone();

    // 1. Batches in flight this process does not remember were answered elsewhere (another instance, or this
    //    one before a restart): nobody can prove them, so the whole span is owed, delivered again in pages of
    //    at most MaxBatchSize.
    if !decide::remembers(&answered, &tick.doc, owner) {
        answered.span.clear();
        if let Some(flight) = tick.doc.adopt_in_flight(owner) {
            match &flight.quarantined {
                // A retry of a quarantined batch that sink mode recorded: back on the operator's list.
                Some(key) => {
                    if let Some(id) = Ledger::quarantine_batch_id(key) {
                        tick.doc.requeue_quarantine_retry(id);
                    }
                }
                None => answered.span.push_back(Arc::new(decide::adopt(&flight))),
            }
            tracing::info!(function = %trigger.config.name, batches = flight.batches, rows = flight.range.rows, owner = %flight.owner,
                "batches in flight answered by another process (or before a restart) cannot be proven written: delivering them again");
            tick.dirty = true;
        }
    }
    answered.retries.retain(|r| tick.doc.retry_quarantined().contains(&r.range.batch_id));
    // An operator's resume clears the failures of the first batch in flight (a halted batch is delivered once
    // more): the document's count is the one to go by when it is lower.
    if let (Some(flight), Some(first)) = (tick.doc.in_flight(), answered.span.front_mut()) {
        if flight.failures < first.failures_recorded {
            let first = Arc::make_mut(first);
            first.failures = flight.failures;
            first.failures_recorded = flight.failures;
            first.failing_since = flight.failing_since;
        }
    }

    // 2. and 3. Quarantine what is poison, then move the checkpoint over what is proven.
    let poison_after = duration(settings.poison_after);
    while let Some(sent) = answered.poisoned(settings.max_attempts, poison_after, tick.now) {
        let poison = decide::poison_of(sent);
        if settings.poison_action == PoisonAction::Halt {
            tick.doc.record_span(decide::span_of(&answered, owner));
            tick.memory.answered(answered);
            return tick.halt(&poison).await;
        }
        sent.settled = true;
        let live = answered.frontier(tick.doc.checkpoint()).clone();
        let changes = match &poison.quarantined {
            Some(_) => Vec::new(),
            None => fetch::again(tick, &poison.range, None, &live).await?,
        };
        tick.quarantine(&poison, changes).await?;
    }
    let (proven, proven_retries) = answered.take_proven(tick.now, duration(trigger.config.proof_window));
    // (Proven late batches lie before the checkpoint and were counted when first proven.)
    tick.dirty |= tick.doc.acknowledge_proven(&ranges(&proven), &ranges(&proven_retries), tick.now);

    // 3. What to answer (`decide::serve`): an owed batch first, then an operator's retry, then new changes.
    let reply = match tick.serve_deferred(&answered) {
        Deferred::Owed => owed_reply(tick, &mut answered, attempt).await?,
        Deferred::Next(Next::QuarantineRetry(batch_id)) => {
            Some(retry_reply(tick, &mut answered, attempt, batch_id).await?)
        }
        Deferred::Next(Next::New(fresh)) => fetch_reply(tick, &mut answered, attempt, fresh).await?,
    };

    // 4. The document records the span under this process's lease, renewed while anything is unproven.
    tick.dirty |= tick.doc.record_span(decide::span_of(&answered, owner));
    let lease = settings.lease_duration;
    if !answered.is_empty() && (reply.is_some() || decide::lease_needs_renewal(&tick.doc, owner, lease, tick.now)) {
        tick.doc.take_lease(owner, lease, tick.now);
        tick.dirty = true;
    }
    if !tick.commit_if_dirty().await? {
        return Ok(());
    }
    if let (Some(first), Some(flight)) = (answered.span.front_mut(), tick.doc.in_flight()) {
        if first.failures_recorded != flight.failures {
            Arc::make_mut(first).failures_recorded = flight.failures;
        }
    }
    tick.memory.answered(answered);
    let Some(Reply { batch_id, changes, kind, why }) = reply else { return Ok(()) };
    failpoint::hit("after-commit");
    let line = match (kind, why) {
        (OutcomeKind::Redelivered, Some(why)) => {
            format!("re-delivering batch {batch_id} with {} change(s) because {why}", changes.len())
        }
        (_, Some(why)) => format!("delivering batch {batch_id} with {} change(s) because {why}", changes.len()),
        (_, None) => format!("delivering batch {batch_id} with {} change(s)", changes.len()),
    };
    tick.answer(kind, batch_id, changes, line);
    Ok(())
}

/// The first owed batch, answered again: one page at a time, since an adopted span (or a batch answered under a
/// larger MaxBatchSize) can hold more than one answer may carry.
async fn owed_reply(
    tick: &mut Tick<'_>,
    answered: &mut Answered,
    attempt: &Attempt,
) -> Result<Option<Reply>, TickError> {
    let limit = tick.trigger.config.settings.max_batch_size;
    let mut page = None;
    if let Some(index) = answered.owed_in_span() {
        let sent = &answered.span[index];
        if sent.quarantined.is_none() {
            let fetched = tick.trigger.source.refetch(&sent.range.from, &sent.range.to, limit).await?;
            let full = fetched.changes.len() >= limit;
            if let Some(last) = fetched.last.clone().filter(|l| full && *l != sent.range.to) {
                let sent = Arc::make_mut(&mut answered.span[index]);
                let rows = sent.range.rows.saturating_sub(fetched.changes.len() as u64);
                let rest = BatchRange::new(tick.doc.allocate_batch_id(), last.clone(), sent.range.to.clone(), rows);
                sent.range.to = last;
                sent.range.rows = fetched.changes.len() as u64;
                answered.span.insert(index + 1, Arc::new(Sent::owed_range(rest, tick.now)));
            }
            page = Some(fetched.changes);
        }
    }
    // An owed chunk goes after everything answered so far: the live changes up to the span's end.
    let live = answered.frontier(tick.doc.checkpoint()).clone();
    let Some(sent) = answered.owed() else { return Ok(None) };
    let changes = match page {
        Some(changes) => changes,
        None => fetch::again(tick, &sent.range, sent.quarantined.as_deref(), &live).await?,
    };
    if sent.answered_on_final() && sent.failures > 0 {
        // Its earlier answers failed, and the last one, on the host's final attempt, is assumed to.
        sent.failures += 1;
    }
    let why = if let Some(owner) = sent.answered_by.as_ref().filter(|_| sent.invocations.is_empty()) {
        format!("it was answered by {owner} and its outcome is unknown")
    } else if sent.failures > 0 {
        format!("its write failed ({} known failure(s))", sent.failures)
    } else {
        "nobody would report a failure of its last answer".to_string()
    };
    sent.answered(attempt, tick.now);
    tick.doc.count_answer_again(&sent.range);
    let batch_id = sent.range.batch_id;
    Ok(Some(Reply { batch_id, changes, kind: OutcomeKind::Redelivered, why: Some(why) }))
}

/// An operator's retry of quarantined batch `batch_id`, answered from its quarantine document.
async fn retry_reply(
    tick: &mut Tick<'_>,
    answered: &mut Answered,
    attempt: &Attempt,
    batch_id: u64,
) -> Result<Reply, TickError> {
    let Batch { fetched, from, quarantined, .. } = fetch::quarantined(tick, batch_id).await?;
    let (changes, to) = (fetched.changes, fetched.last.unwrap_or(Position::Null));
    let range = BatchRange::new(batch_id, from, to, changes.len() as u64);
    let mut sent = Sent::new(range, attempt, tick.now);
    sent.quarantined = quarantined;
    answered.retries.push(Arc::new(sent));
    let why = Some("an operator asked to retry this quarantined batch".to_string());
    Ok(Reply { batch_id, changes, kind: OutcomeKind::Delivered, why })
}

/// Nothing owed nor queued: the next batch, live changes after the span or a backfill's chunk after the chunks
/// answered, as `fresh` says (`decide::serve`, which shares the ticks by `decide::backfill`).
async fn fetch_reply(
    tick: &mut Tick<'_>,
    answered: &mut Answered,
    attempt: &Attempt,
    fresh: Fresh,
) -> Result<Option<Reply>, TickError> {
    let Batch { mut fetched, from, chunk, .. } = fetch::fresh(tick, &fresh).await?;
    if fetched.changes.is_empty() {
        if let Some(advance) = fetched.advance.take().filter(|_| answered.is_empty()) {
            tick.dirty |= tick.doc.advance_quiet(advance, tick.now, ADVANCE_EVERY);
        }
        return Ok(None);
    }
    failpoint::hit("after-fetch");
    let to = fetched.last.clone().unwrap_or(Position::Null);
    let (batch_id, rows) = (tick.doc.allocate_batch_id(), fetched.changes.len() as u64);
    match &chunk {
        Some(id) => {
            tick.memory.served_chunk();
            let range = BatchRange::chunk(batch_id, from, to, rows, id);
            answered.chunks.push_back(Arc::new(Sent::new(range, attempt, tick.now)));
        }
        None => {
            tick.memory.served_live();
            let range = BatchRange::new(batch_id, from, to, rows);
            answered.span.push_back(Arc::new(Sent::new(range, attempt, tick.now)));
        }
    }
    let why = chunk.map(|id| format!("it is a chunk of backfill {id}"));
    Ok(Some(Reply { batch_id, changes: fetched.changes, kind: OutcomeKind::Delivered, why }))
}

/// Each batch's range and whether it was settled (quarantined) already, as the document acknowledges them.
fn ranges(sent: &[Arc<Sent>]) -> Vec<(&BatchRange, bool)> {
    sent.iter().map(|s| (&s.range, s.settled)).collect()
}

/// A std duration as a time duration (saturating; settings are bounded far below the limit).
fn duration(d: std::time::Duration) -> time::Duration {
    time::Duration::try_from(d).unwrap_or(time::Duration::MAX)
}
