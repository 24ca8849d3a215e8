//! A backfill's start and its rows' mark: planning one (`plan`, and `first_doc` for `startFrom: snapshot`), its
//! filter as parsed, and marking the rows a consumer receives (docs/operations.md, "Backfill"). Which tick serves
//! a chunk is `decide::serve` (the share is `decide::backfill`); reading a chunk, first or again, is `fetch.rs`;
//! the document's transitions are `document`'s; why chunks and live changes agree is in docs/architecture.md,
//! "Backfill".
//!
//! A chunk is a batch like any other (`BatchRange::backfill` names its backfill): recorded in flight and
//! acknowledged by a sink tick or an immediate tick, answered and proven by a deferred tick (which keeps
//! unproven chunks apart from its span, `Answered::chunks`). Delivering it again (a crash, a lost answer, a
//! failed write) re-reads the same key range as the rows are now, never more than the chunk's range.

use super::document::Backfill;
use super::error::TickError;
use super::parts::Trigger;
use super::tick::Tick;
use crate::change::Change;
use crate::source::{Filter, Position, SourceError};
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
pub(super) fn filter(b: &Backfill) -> Result<Option<Filter>, TickError> {
    let Some(text) = &b.filter else { return Ok(None) };
    Filter::parse(text).map(Some).map_err(|e| {
        TickError::Source(SourceError::Invalid(format!(
            "the filter of backfill {} ({text:?}) does not parse: {e}; cancel it (handler state backfill <function> --cancel) and start it again",
            b.id
        )))
    })
}

/// The document of a function's first tick: at `startFrom`, and with `startFrom: snapshot` a backfill of the
/// rows that exist, bounded by that start (the source's guarded newest position).
pub(super) async fn first_doc(trigger: &Trigger) -> Result<super::document::StateDoc, TickError> {
    let from = trigger.config.source.start_from;
    let start = trigger.source.start_position(from).await?;
    let mut doc = Tick::new_doc(trigger, start);
    if from == crate::source::StartFrom::Snapshot {
        let now = trigger.ledger.clock().now();
        let b = plan(trigger, doc.checkpoint(), None, "startFrom: snapshot", now).await?;
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
