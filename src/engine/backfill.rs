//! A backfill inside a tick: reading the next chunk, re-reading a chunk delivered before, and marking the rows
//! a consumer receives (docs/operations.md, "Backfill"; the share between live changes and chunks is
//! `decide::backfill`; the document's transitions are `document`'s; why chunks and live changes agree is in
//! docs/architecture.md, "Backfill").
//!
//! A chunk is a batch like any other (`BatchRange::backfill` names its backfill): recorded in flight and
//! acknowledged by a sink tick or an immediate tick, answered and proven by a deferred tick (which keeps
//! unproven chunks apart from its span, `Answered::chunks`). Delivering it again (a crash, a lost answer, a
//! failed write) re-reads the same key range as the rows are now, never more than the chunk's range.

use super::decide::backfill::{self as share, Turn};
use super::document::Backfill;
use super::error::TickError;
use super::parts::Trigger;
use super::tick::Tick;
use crate::change::Change;
use crate::source::{BatchRange, ChunkRead, ChunkRequest, Fetched, Filter, Position, SourceError};
use serde_json::value::RawValue;

/// The metadata key that marks a backfilled row (see [`mark`]).
pub const METADATA_KEY: &str = "Backfill";

/// Marks each change as a backfilled row of backfill `id`: its `Metadata` object gains
/// `"Backfill": {"Id": id}` (a change without metadata gets `{"Backfill": {...}}`). Live changes never carry
/// the key, whatever `includeMetadata` says, so a consumer tells the two apart by its presence.
pub fn mark(changes: &mut [Change], id: &str) {
    for change in changes {
        let mut object = change
            .metadata
            .as_ref()
            .and_then(|m| serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(m.get()).ok())
            .unwrap_or_default();
        object.insert(METADATA_KEY.into(), serde_json::json!({ "Id": id }));
        let text = serde_json::Value::Object(object).to_string();
        change.metadata = RawValue::from_string(text).ok();
    }
}

/// The backfill's filter, parsed (it was checked at the start; a document edited by hand is checked again).
fn filter(b: &Backfill) -> Result<Option<Filter>, TickError> {
    let Some(text) = &b.filter else { return Ok(None) };
    Filter::parse(text).map(Some).map_err(|e| {
        TickError::Source(SourceError::Invalid(format!(
            "the filter of backfill {} ({text:?}) does not parse: {e}; cancel it (handler state backfill <function> --cancel) and start it again",
            b.id
        )))
    })
}

/// Which batch this tick serves (see `decide::backfill`).
pub(super) fn turn(tick: &Tick<'_>) -> Turn {
    share::turn(tick.doc.backfill.as_ref(), tick.memory.live_in_a_row)
}

/// The tick served a batch: a chunk or a live one (the share's count).
pub(super) fn served(tick: &mut Tick<'_>, chunk: bool) {
    tick.memory.live_in_a_row = share::after_batch(tick.memory.live_in_a_row, chunk);
}

/// The next chunk of the running backfill after `after`, marked, with its backfill's id; `None` when there is
/// none to serve (no running backfill; the source cannot place a chunk now; or nothing left: then, if nothing
/// of it is `unacknowledged`, the backfill is done and the tick must write). `live` is the end of the live
/// changes already handed to the consumer: the chunk goes right after them (`ChunkRequest::live`).
pub(super) async fn next_chunk(
    tick: &mut Tick<'_>,
    after: &Position,
    unacknowledged: bool,
    live: &Position,
) -> Result<Option<(Fetched, String)>, TickError> {
    let Some(b) = tick.doc.backfill.clone().filter(|b| b.state == super::document::BackfillState::Running) else {
        return Ok(None);
    };
    let limit = tick.trigger.config.settings.max_batch_size;
    let filter = filter(&b)?;
    let request = ChunkRequest { bound: &b.bound, after, upto: None, filter: filter.as_ref(), limit, live };
    let mut fetched = match tick.trigger.source.backfill_chunk(request).await? {
        ChunkRead::Rows(fetched) => {
            tick.memory.backfill_later = None;
            fetched
        }
        ChunkRead::Later(why) => {
            // Said once per reason: a source that waits out a long transaction says so every tick otherwise.
            let name = &tick.trigger.config.name;
            if tick.memory.backfill_later.as_deref() != Some(why.as_str()) {
                tracing::info!(function = %name, backfill = %b.id, "no chunk of backfill {} this tick, live changes go first: {why}", b.id);
                tick.out.logs.push(format!("no chunk of backfill {} this tick: {why}", b.id));
                tick.memory.backfill_later = Some(why);
            } else {
                tracing::debug!(function = %name, backfill = %b.id, "still no chunk of backfill {}: {why}", b.id);
            }
            // The attempt counts as the backfill's turn: under a live backlog, a source that waits (up to its
            // poll bound) before refusing costs live changes one tick in `LIVE_PER_CHUNK + 1`, not every tick.
            tick.memory.live_in_a_row = 0;
            return Ok(None);
        }
    };
    if fetched.changes.is_empty() {
        if share::finished(Some(&b), unacknowledged) {
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
pub(super) async fn reread(
    trigger: &Trigger,
    tick_doc: &super::document::StateDoc,
    range: &BatchRange,
    limit: usize,
    live: &Position,
) -> Result<Fetched, TickError> {
    let id = range.backfill.as_deref().unwrap_or_default();
    let Some(b) = tick_doc.backfill.as_ref().filter(|b| b.id == id && b.open()) else {
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
    let mut fetched = match trigger.source.backfill_chunk(request).await? {
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

/// The document of a function's first tick: at `startFrom`, and with `startFrom: snapshot` a backfill of the
/// rows that exist, bounded by that start (the source's guarded newest position).
pub(super) async fn first_doc(trigger: &Trigger) -> Result<super::document::StateDoc, TickError> {
    let from = trigger.config.source.start_from;
    let start = trigger.source.start_position(from).await?;
    let mut doc = Tick::new_doc(trigger, start);
    if from == crate::source::StartFrom::Snapshot {
        let now = trigger.ledger.clock().now();
        let b = plan(trigger, &doc.checkpoint, None, "startFrom: snapshot", now).await?;
        tracing::info!(function = %trigger.config.name, backfill = %b.id, estimate = ?b.estimate,
            "startFrom snapshot: backfilling the rows that exist beside the changes after them");
        // A new document has no backfill to refuse this one.
        doc.start_backfill(b).map_err(|e| TickError::Source(SourceError::Invalid(e)))?;
    }
    Ok(doc)
}

/// A new backfill of `trigger`'s function while the live checkpoint is `checkpoint`, filtered by `filter`
/// (checked against the table by the source), started by `by` at `now`.
pub(in crate::engine) async fn plan(
    trigger: &Trigger,
    checkpoint: &Position,
    filter: Option<String>,
    by: &str,
    now: time::OffsetDateTime,
) -> Result<Backfill, TickError> {
    let parsed = match &filter {
        Some(text) => Some(
            Filter::parse(text)
                .map_err(|e| TickError::Source(SourceError::Invalid(format!("--where {text:?}: {e}"))))?,
        ),
        None => None,
    };
    let plan = trigger.source.backfill_start(checkpoint, parsed.as_ref()).await?;
    let filter = parsed.map(|f| f.to_string());
    Ok(Backfill::new(plan.bound, filter, plan.estimate, by, now))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Operation;

    #[test]
    fn a_backfilled_row_says_so_in_its_metadata_and_keeps_what_it_had() {
        let mut changes = vec![
            Change::from_json(Operation::Insert, r#"{"id":1}"#.into()).expect("json"),
            Change {
                metadata: RawValue::from_string(r#"{"Version":7}"#.into()).ok(),
                ..Change::from_json(Operation::Insert, r#"{"id":2}"#.into()).expect("json")
            },
        ];
        mark(&mut changes, "abc");
        let text = crate::change::encode_batch(&changes);
        assert_eq!(
            text.get(),
            r#"[{"Operation":0,"Item":{"id":1},"Metadata":{"Backfill":{"Id":"abc"}}},{"Operation":0,"Item":{"id":2},"Metadata":{"Version":7,"Backfill":{"Id":"abc"}}}]"#
        );
    }
}
