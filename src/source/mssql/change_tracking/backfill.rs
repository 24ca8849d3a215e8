//! The change-tracking source's backfill (docs/operations.md, "Backfill"): the table's rows in key order, each
//! with its change-tracking row version, keeping the rows not changed since the bound.
//!
//! The bound is the change-tracking version the live checkpoint covers when the backfill starts: everything up
//! to it is either delivered by the live path already or, for rows with no change after it, the chunk's to
//! deliver; a row whose version passed it is the live path's, which reads its current values when it delivers
//! it. Argued in docs/architecture.md, "Backfill".
//!
//! `startFrom: snapshot` is this backfill (the live path starts at the current version, see `start_position`).
//! The older walk (`snapshot`) stays for what it already serves: a state written in its walk phase before
//! backfills existed, and `onPositionLost: resync`, which replaces a lost live position rather than
//! accompanying one.

use super::changes;
use super::tracked::Tracked;
use crate::source::mssql::backfill;
use crate::source::mssql::position::CtPosition;
use crate::source::{BackfillPlan, ChunkRequest, Fetched, Filter, Position, SourceError};

/// The version the checkpoint covers: its last delivered change's, or its base; before everything (nothing
/// recorded yet), the current version, since the live path then starts at the minimum valid version and
/// delivers every change after it.
async fn covered(t: &Tracked, checkpoint: &Position) -> Result<i64, SourceError> {
    let shape = t.shape().await?;
    Ok(match CtPosition::parse(checkpoint, shape.key.len(), &t.table_text())? {
        Some(CtPosition::Changes { last: Some(last), .. }) => last.version,
        Some(CtPosition::Changes { base, last: None }) => base,
        // A walk in progress delivers what the backfill would too: duplicates, never a gap.
        Some(CtPosition::Snapshot { base, .. }) => base,
        None => changes::versions(t).await?.1,
    })
}

/// Starts a backfill while the live checkpoint is `checkpoint`: its bound is the version the checkpoint covers.
pub(super) async fn start(
    t: &Tracked,
    checkpoint: &Position,
    filter: Option<&Filter>,
) -> Result<BackfillPlan, SourceError> {
    let (shape, _, columns) = t.facts().await?;
    let table = t.table_text();
    let checked = backfill::check_filter(filter, &table, columns)?;
    let bound = Position::from(covered(t, checkpoint).await?);
    let s = shape.backfill_estimate(checked.as_ref());
    let params = backfill::bind(
        &s,
        &backfill::whole(&bound, filter),
        (shape.key.len(), &table),
        checked.as_ref(),
        t.spec.partition,
    )?;
    let estimate = backfill::estimate(&t.pool, &s, params).await?;
    Ok(BackfillPlan { bound, estimate: Some(estimate) })
}

/// The chunk `r` asks for. Its rule needs no live position: the version bound leaves every key the live path
/// owes to it.
pub(super) async fn chunk(t: &Tracked, r: &ChunkRequest<'_>) -> Result<Fetched, SourceError> {
    let (shape, _, columns) = t.facts().await?;
    let table = t.table_text();
    let filter = backfill::check_filter(r.filter, &table, columns)?;
    let s = shape.backfill_chunk(r, filter.as_ref());
    let params = backfill::bind(&s, r, (shape.key.len(), &table), filter.as_ref(), t.spec.partition)?;
    backfill::read(&t.pool, &s, params, shape.key.len()).await
}
