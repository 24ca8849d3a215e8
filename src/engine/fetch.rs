//! A tick's reads of what it serves, as `decide::serve` named it: new changes ([`fresh`]: live ones, or a
//! backfill's chunk, in the share's order), an operator's retry of a quarantined batch ([`quarantined`]), and a
//! batch delivered before, read again as its rows are now ([`again`]: a live range, or a chunk's key range).
//! Every delivery reads through these (`host_tick`, `recorded`, and so the sink's record step); none of them
//! decides what to serve. Below `tick.rs` and `backfill.rs`; nothing here calls a delivery.

use super::backfill::{filter, mark};
use super::decide::backfill::{self as share, Turn};
use super::decide::serve::Fresh;
use super::error::TickError;
use super::tick::Tick;
use crate::change::Change;
use crate::source::{BatchRange, ChunkRead, ChunkRequest, Fetched, Position, SourceError};

/// A batch read for a tick and not delivered before (under this id): its changes, where it starts, and what it
/// is besides live changes (a chunk of a backfill, an operator's retry of a quarantined batch).
pub(super) struct Batch {
    pub fetched: Fetched,
    pub from: Position,
    /// The id of the backfill this batch is a chunk of.
    pub chunk: Option<String>,
    /// The quarantine document this batch is a retry of.
    pub quarantined: Option<String>,
}

/// Reads the new changes `fresh` describes: live changes after `fresh.live`, or a chunk after `fresh.after`,
/// in the order of `fresh.turn` (a chunk read that finds nothing may end the backfill, see [`next_chunk`]).
/// Empty when there is nothing to serve.
pub(super) async fn fresh(tick: &mut Tick<'_>, fresh: &Fresh) -> Result<Batch, TickError> {
    let first = match fresh.turn {
        Turn::ChunkThenLive => next_chunk(tick, fresh).await?,
        _ => None,
    };
    let (mut fetched, mut chunk) = match first {
        Some((fetched, id)) => (fetched, Some(id)),
        None => (live(tick, &fresh.live).await?, None),
    };
    if chunk.is_none() && fetched.changes.is_empty() && fresh.turn == Turn::LiveThenChunk {
        if let Some((read, id)) = next_chunk(tick, fresh).await? {
            fetched = read;
            chunk = Some(id);
        }
    }
    let from = if chunk.is_some() { fresh.after.clone() } else { fresh.live.clone() };
    Ok(Batch { fetched, from, chunk, quarantined: None })
}

/// An operator's retry of quarantined batch `batch_id`: its changes as quarantined, over its range.
pub(super) async fn quarantined(tick: &Tick<'_>, batch_id: u64) -> Result<Batch, TickError> {
    let key = tick.trigger.ledger.quarantine_key(batch_id);
    let (q, changes) = tick.trigger.ledger.load_quarantined_batch(&key).await?;
    let fetched = Fetched { changes, last: Some(q.to), advance: None };
    Ok(Batch { fetched, from: q.from, chunk: None, quarantined: Some(key) })
}

/// The changes of a batch delivered before, as they are now (or as quarantined, when `quarantined` names its
/// document). `live`: the end of the live changes handed over before it (a chunk is placed after them).
pub(super) async fn again(
    tick: &Tick<'_>,
    range: &BatchRange,
    quarantined: Option<&str>,
    live: &Position,
) -> Result<Vec<Change>, TickError> {
    if let Some(key) = quarantined {
        return Ok(tick.trigger.ledger.load_quarantined_batch(key).await?.1);
    }
    let limit = (range.rows as usize).max(tick.trigger.config.settings.max_batch_size);
    if range.backfill.is_some() {
        return Ok(reread(tick, range, limit, live).await?.changes);
    }
    Ok(tick.trigger.source.refetch(&range.from, &range.to, limit).await?.changes)
}

/// Live changes after `from`: the batch a sink tick fetched ahead (while its sink wrote the batch before) if
/// it starts at `from` and was fetched less than one lease duration ago on the engine's clock (taken either
/// way), else a fetch.
async fn live(tick: &mut Tick<'_>, from: &Position) -> Result<Fetched, TickError> {
    if let Some(ahead) = tick.memory.take_ahead() {
        let fresh = tick.now - ahead.at < tick.trigger.config.settings.lease_duration;
        if ahead.after == *from && fresh {
            return Ok(ahead.fetched);
        }
    }
    Ok(tick.trigger.source.fetch(from, tick.trigger.config.settings.max_batch_size).await?)
}

/// The next chunk of the running backfill after `fresh.after`, marked, with its backfill's id; `None` when
/// there is none to serve (no running backfill; the source cannot place a chunk now; or nothing left: then, if
/// nothing of it is unacknowledged, the backfill is done and the tick must write). The chunk goes right after
/// the live changes already handed to the consumer (`fresh.live`, `ChunkRequest::live`).
async fn next_chunk(tick: &mut Tick<'_>, fresh: &Fresh) -> Result<Option<(Fetched, String)>, TickError> {
    let Some(b) = tick.doc.backfill().cloned().filter(|b| b.state == super::document::BackfillState::Running) else {
        return Ok(None);
    };
    let limit = tick.trigger.config.settings.max_batch_size;
    let filter = filter(&b)?;
    let (after, live) = (&fresh.after, &fresh.live);
    let request = ChunkRequest { bound: &b.bound, after, upto: None, filter: filter.as_ref(), limit, live };
    let mut fetched = match tick.trigger.source.backfill_chunk(request).await? {
        ChunkRead::Rows(fetched) => {
            tick.memory.chunk_read();
            fetched
        }
        ChunkRead::Later(why) => {
            // Said once per reason: a source that waits out a long transaction says so every tick otherwise.
            let name = &tick.trigger.config.name;
            if tick.memory.chunk_later(&why) {
                tracing::info!(function = %name, backfill = %b.id, "no chunk of backfill {} this tick, live changes go first: {why}", b.id);
                tick.out.logs.push(format!("no chunk of backfill {} this tick: {why}", b.id));
            } else {
                tracing::debug!(function = %name, backfill = %b.id, "still no chunk of backfill {}: {why}", b.id);
            }
            return Ok(None);
        }
    };
    if fetched.changes.is_empty() {
        if share::finished(Some(&b), fresh.unacknowledged) {
            tick.doc.finish_backfill(tick.now);
            tick.dirty = true;
            let line = format!("backfill {} is done: {} row(s) in {} chunk(s)", b.id, b.rows, b.chunks);
            tracing::info!(function = %tick.trigger.config.name, "{line}");
            tick.out.logs.push(line);
        }
        return Ok(None);
    }
    mark(&mut fetched.changes, &b.id);
    Ok(Some((fetched, b.id)))
}

/// A chunk delivered before, read again as its rows are now: the same key range, bounded on both sides, placed
/// after the live changes up to `live`. A chunk of a backfill the document no longer holds open (cancelled,
/// replaced) reads nothing. A source that cannot place it now fails the tick (the chunk must go before
/// anything else); the next tick reads it again.
async fn reread(tick: &Tick<'_>, range: &BatchRange, limit: usize, live: &Position) -> Result<Fetched, TickError> {
    let id = range.backfill.as_deref().unwrap_or_default();
    let Some(b) = tick.doc.backfill().filter(|b| b.id == id && b.open()) else {
        return Ok(Fetched::default());
    };
    let filter = filter(b)?;
    let request = ChunkRequest {
        bound: &b.bound,
        after: &range.from,
        upto: Some(&range.to),
        filter: filter.as_ref(),
        limit,
        live,
    };
    let mut fetched = match tick.trigger.source.backfill_chunk(request).await? {
        ChunkRead::Rows(fetched) => fetched,
        ChunkRead::Later(why) => {
            return Err(TickError::Source(SourceError::Unavailable(format!(
                "chunk {} of backfill {} cannot be read again now ({why}); the next tick tries again",
                range.batch_id, b.id
            ))))
        }
    };
    mark(&mut fetched.changes, &b.id);
    Ok(fetched)
}
