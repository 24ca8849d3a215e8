//! The backfill's operator actions (docs/operations.md, "Backfill"): start, pause, resume, cancel, and its
//! progress as status shows it. Each is a compare-and-swap write applied again after a lost race (`retry`).

use super::super::document::{Backfill, BackfillState};
use super::super::error::TickError;
use super::super::parts::Trigger;
use super::{load, retry, BackfillControl, OpsError};
use crate::source::{Position, SourceError};
use serde_json::{json, Value};

/// Starts a backfill bounded by the current checkpoint; refused while one is open. The plan (the bound every
/// chunk reads under, from the source) is made again only when an attempt finds the checkpoint moved.
pub(super) async fn start(t: &Trigger, filter: Option<String>, who: &str) -> Result<Value, OpsError> {
    let now = t.ledger.clock().now();
    let by = format!("operator {who}");
    let planned = std::sync::Mutex::new(None::<(Position, Backfill)>);
    let (by, planned) = (by.as_str(), &planned);
    let (_, b) = retry::apply(t, who, "backfill start", || {
        let filter = filter.clone();
        async move {
            let (mut doc, etag) = load(t).await?;
            let cached = planned.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let checkpoint = doc.checkpoint();
            let b = match cached.filter(|(at, _)| at == checkpoint) {
                Some((_, b)) => b,
                None => {
                    let b =
                        super::super::backfill::plan(t, checkpoint, filter, by, now).await.map_err(|e| match e {
                            TickError::Source(SourceError::Invalid(m)) => OpsError::Invalid(m),
                            other => OpsError::Tick(other),
                        })?;
                    *planned.lock().unwrap_or_else(|p| p.into_inner()) = Some((checkpoint.clone(), b.clone()));
                    b
                }
            };
            doc.start_backfill(b.clone()).map_err(OpsError::Invalid)?;
            Ok((doc, Some(etag), b))
        }
    })
    .await?;
    Ok(json!({ "function": t.name(), "backfill": backfill_progress(&b, now) }))
}

/// Pauses, resumes or cancels the open backfill; refused when none is open.
pub(super) async fn control(t: &Trigger, control: BackfillControl, who: &str) -> Result<Value, OpsError> {
    let now = t.ledger.clock().now();
    let action = match control {
        BackfillControl::Pause => "backfill pause",
        BackfillControl::Resume => "backfill resume",
        BackfillControl::Cancel => "backfill cancel",
    };
    let (doc, ()) = retry::apply(t, who, action, || async move {
        let (mut doc, etag) = load(t).await?;
        match control {
            BackfillControl::Pause => doc.pause_backfill(true),
            BackfillControl::Resume => doc.pause_backfill(false),
            BackfillControl::Cancel => doc.cancel_backfill(now),
        }
        .map_err(OpsError::Invalid)?;
        Ok((doc, Some(etag), ()))
    })
    .await?;
    let progress = doc.backfill().map(|b| backfill_progress(b, now));
    Ok(json!({ "function": t.name(), "backfill": progress }))
}

/// A backfill's progress for status: rows done, rows estimated, the rate since it started, and the time to
/// finish at that rate.
pub fn backfill_progress(b: &Backfill, now: time::OffsetDateTime) -> Value {
    let end = b.finished_at.unwrap_or(now);
    let seconds = (end - b.started_at).as_seconds_f64().max(0.0);
    let rate = (seconds > 0.0).then(|| b.rows as f64 / seconds);
    let left = b.estimate.map(|e| e.saturating_sub(b.rows));
    let seconds_to_finish = match (b.state, left, rate) {
        (BackfillState::Done | BackfillState::Cancelled, _, _) => Some(0.0),
        (_, Some(0), _) => Some(0.0),
        (_, Some(left), Some(rate)) if rate > 0.0 => Some(left as f64 / rate),
        _ => None,
    };
    json!({
        "id": b.id, "state": b.state, "filter": b.filter, "rows_done": b.rows, "rows_estimated": b.estimate,
        "chunks": b.chunks, "chunks_redone": b.redone, "after": b.after,
        "rows_per_second": rate, "seconds_to_finish": seconds_to_finish,
        "started_at": b.started_at.format(&time::format_description::well_known::Rfc3339).ok(),
        "started_by": b.started_by,
        "finished_at": b.finished_at.and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok()),
    })
}
