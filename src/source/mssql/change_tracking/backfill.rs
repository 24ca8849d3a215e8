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

use super::MssqlChangeTracking;
use crate::source::mssql::backfill::{self, Chunk};
use crate::source::mssql::position::CtPosition;
use crate::source::{BackfillPlan, ChunkRequest, Fetched, Filter, Position, SourceError};

impl MssqlChangeTracking {
    /// The version the checkpoint covers: its last delivered change's, or its base; before everything (nothing
    /// recorded yet), the current version, since the live path then starts at the minimum valid version and
    /// delivers every change after it.
    async fn covered(&self, checkpoint: &Position) -> Result<i64, SourceError> {
        let shape = self.shape().await?;
        Ok(match CtPosition::parse(checkpoint, shape.key.len(), &self.table_text())? {
            Some(CtPosition::Changes { last: Some(last), .. }) => last.version,
            Some(CtPosition::Changes { base, last: None }) => base,
            // A walk in progress delivers what the backfill would too: duplicates, never a gap.
            Some(CtPosition::Snapshot { base, .. }) => base,
            None => self.versions().await?.1,
        })
    }

    pub(super) async fn start_backfill(
        &self,
        checkpoint: &Position,
        filter: Option<&Filter>,
    ) -> Result<BackfillPlan, SourceError> {
        let (shape, _, columns) = self.facts().await?;
        let filter = backfill::check_filter(filter, &self.table_text(), columns)?;
        let bound = self.covered(checkpoint).await?;
        let chunk = Chunk { bound, after: None, upto: None, limit: 0, filter: filter.as_ref() };
        let s = shape.backfill_estimate(filter.as_ref());
        let estimate = backfill::estimate(&self.pool, &s, &backfill::bind(&s, &chunk, self.spec.partition)?).await?;
        Ok(BackfillPlan { bound: Position::from(bound), estimate: Some(estimate) })
    }

    pub(super) async fn read_chunk(&self, r: &ChunkRequest<'_>) -> Result<Fetched, SourceError> {
        let (shape, _, columns) = self.facts().await?;
        let table = self.table_text();
        let filter = backfill::check_filter(r.filter, &table, columns)?;
        let Some(chunk) = backfill::requested(r, shape.key.len(), &table, filter.as_ref())? else {
            return Ok(Fetched::default());
        };
        let s = shape.backfill_chunk(chunk.range(), filter.as_ref());
        backfill::read(&self.pool, &s, &backfill::bind(&s, &chunk, self.spec.partition)?, shape.key.len()).await
    }
}
