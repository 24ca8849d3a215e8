//! The change-tracking source: `CHANGETABLE(CHANGES t, @base)` read in `(SYS_CHANGE_VERSION, key)` order,
//! keyset-paged from the stored position, the official trigger's mechanism without its database-wide app
//! lock or lease tables.
//!
//! # How a position moves
//! A position is a base version B (the argument of `CHANGETABLE`) plus the last delivered `(version, key)`.
//! The base stays fixed while a backlog is paged through, so `Operation` stays relative to one point: a row
//! created after B is an Insert even when its insert and later updates are delivered in different batches
//! (it may then arrive as Insert twice, which at-least-once consumers handle anyway; moving the base
//! mid-backlog, as the official trigger does, would instead report a never-delivered insert as an Update).
//! When a read returns fewer rows than asked, everything up to the version read at the start of that
//! statement has been delivered, and the next position is simply that version as the new base.
//!
//! # Consistency
//! Each read is one statement that takes `CHANGE_TRACKING_CURRENT_VERSION()` and
//! `CHANGE_TRACKING_MIN_VALID_VERSION()` and reads changes up to that current version, so a batch is bounded
//! by a version captured at its start. Under SNAPSHOT isolation (used when the database allows it) the
//! changes and the joined current rows are one consistent view. Under READ COMMITTED the joined row can be
//! newer than its change: it is then delivered with newer values and delivered again when its newer change
//! comes (a duplicate, never a loss), and a row deleted in between is reported as a Delete.
//!
//! # Retention
//! If cleanup has passed the stored base, changes may be gone. This source refuses with
//! `SourceError::PositionLost` (the official trigger silently skips ahead) unless `onPositionLost` is
//! `resync`, which walks the table again. Two cases are not losses and continue silently: a backlog whose
//! last delivered version is still valid (the base moves up to just below it), and a table that was polled
//! empty by this process since the base (the base moves to the version that poll proved empty).
//!
//! # Layout
//! [`MssqlChangeTracking`] holds the parts and answers [`Source`]; each file below it owns one concern and
//! imports only from the files under it: `tracked` (the table, its options and pool, what discovery found,
//! binding a statement's slots), `payload` (a change row and its `Operation`, `Item` and metadata), `snapshot`
//! (the walk of the current rows), `changes` (change reads, the version and retention rules, a lost
//! position, and [`changes::Idle`]), `status` (pending and lag) and `backfill` (its bound and chunks).

mod backfill;
mod changes;
mod payload;
mod snapshot;
mod status;
mod tracked;

use super::options::{OnPositionLost, Options};
use super::position::CtPosition;
use crate::config::SourceSpec;
use crate::source::{
    BackfillPlan, ChunkRead, ChunkRequest, Fetched, Filter, Lag, Position, Source, SourceError, StartFrom,
};
use changes::{Idle, Until};
use std::sync::atomic::AtomicBool;
use tracked::Tracked;

/// The change-tracking source of one function: the [`Tracked`] table, what this process proved delivered by an
/// empty poll ([`Idle`]), and whether the log already said why the lag is unknown (status is polled every few
/// seconds). Built by `app.rs` from the `mssql-change-tracking` variant of `SourceOptions`; called by the engine
/// through [`Source`].
#[derive(Debug)]
pub struct MssqlChangeTracking {
    table: Tracked,
    idle: Idle,
    lag_reason_logged: AtomicBool,
}

impl MssqlChangeTracking {
    /// Parses the connection string; connects on first use.
    pub fn new(spec: SourceSpec, options: Options) -> Result<Self, SourceError> {
        Ok(Self {
            table: Tracked::new(spec, options)?,
            idle: Idle::default(),
            lag_reason_logged: AtomicBool::new(false),
        })
    }
}

#[async_trait::async_trait]
impl Source for MssqlChangeTracking {
    /// Ordered by change-tracking version (the last change's, or the base's) when the two differ.
    fn position_order(&self, a: &Position, b: &Position) -> Option<std::cmp::Ordering> {
        let version = |p: &Position| {
            let last = p.get("last").and_then(|l| l.get("version")).and_then(Position::as_i64);
            last.or_else(|| p.get("base")?.as_i64()).map(i128::from)
        };
        crate::source::order_by_leading_integer(a, b, version)
    }

    /// One version before the smallest (`position.rs`, `ct_no_later_than`).
    async fn no_later_than(&self, positions: &[Position]) -> Result<Option<Position>, SourceError> {
        Ok(crate::source::mssql::position::ct_no_later_than(positions))
    }

    fn name(&self) -> String {
        format!("mssql-change-tracking:{}", self.table.spec.table)
    }

    fn fingerprint(&self) -> String {
        crate::source::fingerprint(&self.table.spec, None)
    }

    async fn validate(&self) -> Result<(), SourceError> {
        self.table.shape().await.map(|_| ())
    }

    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError> {
        self.table.shape().await?;
        let (min_valid, current) = changes::versions(&self.table).await?;
        let pos = match from {
            // What the official trigger does: replay everything retention still holds.
            StartFrom::Earliest => CtPosition::Changes { base: min_valid, last: None },
            // `Snapshot`: the live path follows the changes after the current version, and the engine backfills
            // the rows as they are at or below it (`backfill_start` takes it as the bound). Functions whose state
            // was written in the walk phase before backfills existed go on walking (`fetch`, `snapshot`).
            StartFrom::Now | StartFrom::Snapshot => CtPosition::Changes { base: current, last: None },
        };
        Ok(pos.to_json())
    }

    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let (t, idle) = (&self.table, &self.idle);
        let shape = t.shape().await?;
        let limit = limit.max(1);
        match changes::parse(t, after).await? {
            CtPosition::Changes { base, last } => {
                changes::fetch_changes(t, idle, shape, after, (base, last.as_ref()), limit).await
            }
            CtPosition::Snapshot { base, key } => {
                let (rows, last_key) = snapshot::walk(t, shape, key.as_deref(), None, limit).await?;
                if rows.is_empty() {
                    // The walk is complete: continue with the changes made since it began.
                    let next = CtPosition::Changes { base, last: None }.to_json();
                    return changes::fetch_changes(t, idle, shape, &next, (base, None), limit).await;
                }
                Ok(snapshot::walk_result(rows, last_key, base, limit))
            }
        }
    }

    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let t = &self.table;
        let shape = t.shape().await?;
        let limit = limit.max(1);
        let from = changes::parse(t, after).await?;
        let to = CtPosition::parse(upto, shape.key.len(), &t.table_text())?.ok_or_else(|| {
            SourceError::Invalid("a batch in flight has no end position; reset the function's state".into())
        })?;
        let rows = match (&from, &to) {
            (CtPosition::Snapshot { key: a, .. }, CtPosition::Snapshot { key: u, .. }) => {
                snapshot::walk(t, shape, a.as_deref(), u.as_deref(), limit).await?.0
            }
            (CtPosition::Snapshot { base, key }, CtPosition::Changes { base: ub, last: ul }) => {
                let mut rows = snapshot::walk(t, shape, key.as_deref(), None, limit).await?.0;
                let until = match ul {
                    Some(l) => Some(Until::Key(l)),
                    None if ub > base => Some(Until::Version(*ub)),
                    None => None,
                };
                if let (Some(until), true) = (until, rows.len() < limit) {
                    match changes::range(t, shape, (*base, None), until, limit - rows.len()).await? {
                        Ok(more) => rows.extend(more),
                        Err(read) => return Err(changes::lost(t, *base, read.min_valid)),
                    }
                }
                rows
            }
            // The batch was a resync walk: walk again up to where it ended.
            (CtPosition::Changes { .. }, CtPosition::Snapshot { key, .. }) => {
                snapshot::walk(t, shape, None, key.as_deref(), limit).await?.0
            }
            (CtPosition::Changes { base, last }, CtPosition::Changes { base: ub, last: ul }) => {
                let until = match ul {
                    Some(l) => Until::Key(l),
                    None => Until::Version(*ub),
                };
                match changes::range(t, shape, (*base, last.as_ref()), until, limit).await? {
                    Ok(rows) => rows,
                    Err(_) if t.options.on_position_lost == OnPositionLost::Resync => {
                        snapshot::walk(t, shape, None, None, limit).await?.0
                    }
                    Err(read) => return Err(changes::lost(t, *base, read.min_valid)),
                }
            }
        };
        // Re-deliveries keep the batch's recorded end; `last` is informational here.
        Ok(Fetched { changes: rows, last: Some(upto.clone()), advance: None })
    }

    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        status::count_pending(&self.table, after).await
    }

    async fn oldest_pending_age(&self, after: &Position) -> Result<Lag, SourceError> {
        status::date_oldest_pending(&self.table, &self.lag_reason_logged, after).await
    }

    async fn backfill_start(
        &self,
        checkpoint: &Position,
        filter: Option<&Filter>,
    ) -> Result<BackfillPlan, SourceError> {
        backfill::start(&self.table, checkpoint, filter).await
    }

    /// Its rule needs no live position: the version bound leaves every key the live path owes to it.
    async fn backfill_chunk(&self, r: ChunkRequest<'_>) -> Result<ChunkRead, SourceError> {
        backfill::chunk(&self.table, &r).await.map(ChunkRead::Rows)
    }
}
