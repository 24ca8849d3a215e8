//! PostgreSQL logical-decoding source: every insert, update, hard delete and truncate of a table, read from
//! the write-ahead log through a replication slot, with no change to the table.
//!
//! # How a tick reads
//! By default ([`stream`]) one logical replication stream per function (`START_REPLICATION SLOT … LOGICAL`,
//! pgoutput protocol 1), opened by the process's first tick and kept across ticks: the server decodes each
//! WAL record once, the process reads ahead into a bounded buffer, and a tick takes its batch from it. The
//! stream reports as flushed only the acknowledged checkpoint ([`Source::acknowledged`]), so the slot never
//! passes what the state stored, and a crash anywhere re-reads and never loses. `"reader": "sql"` keeps the
//! SQL interface (the [`slot`]'s peek) for servers and poolers that refuse a replication connection: each tick peeks, and
//! each peek decodes from the slot's `restart_lsn` again. Status counts pending changes with a peek in both
//! modes (at a temporary copy of the slot while a stream holds it).
//!
//! # Positions
//! See [`position`]: a change is placed by its transaction's commit LSN and its sequence number in it, which
//! orders changes as decoding hands them out ([`decode`]). A transaction larger than a batch is paged; the
//! stream keeps what a tick has not passed (up to its bound), a peek decodes it again.
//!
//! # Values
//! pgoutput sends each value in its type's text form. For a table whose every column has a type on
//! [`item`]'s whitelist, the decoder builds each `Item` from that text, byte for byte the cursor source's
//! JSON; otherwise (and for a value it cannot map with certainty) one statement per batch does
//! (`sql::items`): the same `row_to_json`, so numerics keep every digit, timestamps are ISO 8601, json stays
//! JSON and bytea is base64. A TOAST-ed value an update did not touch is not in the WAL: with
//! `REPLICA IDENTITY FULL` it comes from the old row the WAL carries; otherwise it is read from the table by
//! key (its current value — a later change to it is delivered later, so a consumer converges).
//!
//! # Parts, from the bottom up
//! Each file imports only from files before it in this list, never from this one:
//! - `position`, `pgoutput`, `wire`, `options`, `item`, `sql`: places in the WAL, messages, the `Item` text
//!   rules and the statements' text.
//! - `conn`: the pooled connections every part runs statements on, and how a failed one is worded.
//! - `catalog`: [`Catalog`], which owns the table's shape.
//! - `decode`: pgoutput messages to placed changes; `scan`: a batch out of them, and [`Batches`], which builds
//!   its `Item`s.
//! - `buffer`: what a stream holds between ticks, shared by its reader task and the ticks; `reader`: that task.
//! - `slot`: [`Slot`], the replication slot (its state, start, advance, status) and the SQL reader's peek.
//! - `stream`: [`Stream`], the replication stream this process holds, which spawns its reader task.
//! - `backfill`: [`Backfill`], chunks checked against the stream.
//! - this file: [`PostgresLogical`], the composition of the parts that implements [`Source`] by delegating.

mod backfill;
mod buffer;
mod catalog;
mod conn;
mod decode;
mod item;
mod options;
pub(crate) mod pgoutput;
mod position;
mod reader;
mod scan;
mod slot;
mod sql;
mod stream;
mod wire;

use super::{BackfillPlan, ChunkRead, ChunkRequest, Fetched, Filter, Lag, Position, Source, SourceError, StartFrom};
use crate::config::{PostgresLogicalOptions, SourceSpec};
use crate::db::postgres::shared_pool;
use crate::db::postgres::PostgresTls;
use backfill::Backfill;
use catalog::Catalog;
use conn::Conn;
use decode::commit_unix_seconds;
use options::Reader;
use position::Pos;
use scan::{Batches, Want};
use serde_json::Value;
use slot::Slot;
use std::time::Duration;
use stream::Stream;

/// Messages status reads at most to count pending changes: `pending` must stay one bounded statement.
const PENDING_SCAN: usize = 10_000;

/// The logical source: the parts below, each owning its state, composed. `Source` calls go to the reader the
/// options choose (the [`Stream`], or the [`Slot`]'s peek), the [`Batches`] that turn a scan into a batch, the
/// [`Backfill`]; the [`Catalog`] (the table's shape) is handed to each part that builds on it.
#[derive(Debug)]
pub struct PostgresLogical {
    spec: SourceSpec,
    options: PostgresLogicalOptions,
    catalog: Catalog,
    slot: Slot,
    stream: Stream,
    backfill: Backfill,
    batches: Batches,
}

impl PostgresLogical {
    /// Builds the source from its spec and its own keys (the spec's `SourceOptions::PostgresLogical` payload),
    /// without connecting.
    pub fn new(spec: SourceSpec, options: PostgresLogicalOptions, tls: &PostgresTls) -> Result<Self, SourceError> {
        let pool = shared_pool(&spec.connection_setting, &spec.connection, tls).map_err(SourceError::Invalid)?;
        let conn = Conn::new(pool, spec.connection_setting.clone(), spec.table.clone(), options.slot.clone());
        Ok(Self {
            catalog: Catalog::new(conn.clone(), spec.clone(), options.clone()),
            slot: Slot::new(conn.clone(), options.clone(), spec.table.clone()),
            stream: Stream::new(conn.clone(), spec.clone(), options.clone(), tls.clone()),
            backfill: Backfill::new(conn.clone(), spec.table.clone(), options.clone()),
            batches: Batches::new(conn, spec.table.clone(), options.include_metadata),
            spec,
            options,
        })
    }

    /// A batch, from the reader the options choose.
    async fn read(&self, want: Want) -> Result<Fetched, SourceError> {
        let scan = match self.options.reader {
            Reader::Stream => match self.stream.fetch(&self.catalog, &self.slot, want).await? {
                Some(scan) => scan,
                // Another session holds the slot: nothing to deliver (the stream said so).
                None => return Ok(Fetched::default()),
            },
            Reader::Sql => self.slot.scan(&self.catalog, want, false).await?,
        };
        self.batches.fetched(&self.catalog, scan, want).await
    }
}

#[async_trait::async_trait]
impl Source for PostgresLogical {
    fn name(&self) -> String {
        format!("postgres-logical:{}", self.spec.table)
    }

    /// The slot is part of what a position means: another slot has other positions.
    fn fingerprint(&self) -> String {
        super::fingerprint(&self.spec, Some(&format!("slot {}", self.options.slot)))
    }

    async fn validate(&self) -> Result<(), SourceError> {
        self.catalog.shape().await.map(|_| ())
    }

    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError> {
        self.catalog.shape().await?;
        Ok(Pos::before(self.slot.start_position(from).await?).to_json())
    }

    /// The horizon is `startFrom: now`'s position, before the WAL flushed now; a read that found nothing has
    /// passed it once its proven-empty position has (a refetch would read the stream, and proves nothing).
    async fn reached(&self, horizon: &Position, at: &Position) -> Result<bool, SourceError> {
        let (Some(horizon), at) = (Pos::stored(horizon)?, Pos::stored(at)?) else { return Ok(true) };
        Ok(at.is_some_and(|at| at.resume() >= horizon.resume()))
    }

    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let after = Pos::stored(after)?;
        self.read(Want { after, upto: None, limit: limit.max(1), values: true }).await
    }

    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let after = Pos::stored(after)?;
        let upto = Pos::stored(upto)?;
        let mut fetched = self.read(Want { after, upto, limit: limit.max(1), values: true }).await?;
        fetched.advance = None;
        Ok(fetched)
    }

    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        let after = Pos::stored(after)?;
        let want = Want { after, upto: None, limit: PENDING_SCAN, values: false };
        let scan = self.slot.status_scan(&self.catalog, want).await?;
        Ok(scan.changes.len() as u64)
    }

    async fn oldest_pending_age(&self, after: &Position) -> Result<Lag, SourceError> {
        let after = Pos::stored(after)?;
        let scan = self.slot.status_scan(&self.catalog, Want { after, upto: None, limit: 1, values: false }).await?;
        Ok(match scan.changes.first() {
            None => Lag::CaughtUp,
            Some(c) => Lag::Behind(Duration::from_secs_f64((scan.now - commit_unix_seconds(c.commit_time)).max(0.0))),
        })
    }

    async fn acknowledged(&self, checkpoint: &Position) -> Result<(), SourceError> {
        let Some(pos) = Pos::from_json(checkpoint) else { return Ok(()) };
        match self.options.reader {
            Reader::Stream => self.stream.acknowledged(&self.slot, pos).await,
            Reader::Sql => self.slot.advance(pos.resume()).await,
        }
    }

    async fn backfill_start(
        &self,
        checkpoint: &Position,
        filter: Option<&Filter>,
    ) -> Result<BackfillPlan, SourceError> {
        self.backfill.start(&self.catalog, checkpoint, filter).await
    }

    async fn backfill_chunk(&self, request: ChunkRequest<'_>) -> Result<ChunkRead, SourceError> {
        self.backfill.chunk(&self.catalog, &self.slot, &self.stream, request).await
    }

    async fn health(&self) -> Result<Option<Value>, SourceError> {
        let mut health = self.slot.health().await?;
        if let (Some(Value::Object(h)), Some(stream)) = (health.as_mut(), self.stream.health().await) {
            h.insert("stream".into(), stream);
        }
        Ok(health)
    }
}
