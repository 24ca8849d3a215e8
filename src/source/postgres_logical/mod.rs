//! PostgreSQL logical-decoding source: every insert, update, hard delete and truncate of a table, read from
//! the write-ahead log through a replication slot, with no change to the table.
//!
//! # How a tick reads
//! By default ([`stream`]) one logical replication stream per function (`START_REPLICATION SLOT … LOGICAL`,
//! pgoutput protocol 1), opened by the process's first tick and kept across ticks: the server decodes each
//! WAL record once, the process reads ahead into a bounded buffer, and a tick takes its batch from it. The
//! stream reports as flushed only the acknowledged checkpoint ([`Source::acknowledged`]), so the slot never
//! passes what the state stored, and a crash anywhere re-reads and never loses. `"reader": "sql"` keeps the
//! SQL interface ([`peek`]) for servers and poolers that refuse a replication connection: each tick peeks, and
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

mod backfill;
mod buffer;
mod catalog;
mod decode;
mod item;
mod options;
mod peek;
pub(crate) mod pgoutput;
mod position;
mod reader;
mod scan;
mod slot;
mod sql;
mod stream;
mod wire;

use super::{Fetched, Lag, Position, Source, SourceError, StartFrom};
use crate::config::SourceSpec;
use crate::db::pools;
use crate::db::postgres::{connect_failure, ConnectFailure, PostgresTls};
use catalog::Shape;
use deadpool_postgres::Pool;
use decode::commit_unix_seconds;
use options::{Options, Reader};
use position::{Lsn, Pos};
use scan::{Scan, Want};
use serde_json::Value;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Messages status reads at most to count pending changes: `pending` must stay one bounded statement.
const PENDING_SCAN: usize = 10_000;

#[derive(Debug)]
pub struct PostgresLogical {
    spec: SourceSpec,
    options: Options,
    pool: Pool,
    tls: PostgresTls,
    shape: Mutex<Option<Arc<Shape>>>,
    /// One statement on the slot at a time in this process: a slot serves one backend at a time, and status
    /// runs beside ticks.
    slot: tokio::sync::Mutex<SlotMemory>,
    streams: stream::Streams,
    retained_warned: AtomicBool,
}

#[derive(Debug, Default)]
struct SlotMemory {
    /// Where the slot was last seen or put: an acknowledgement that does not pass it costs no statement.
    at: Option<Lsn>,
    /// The table's columns as the last Relation message described them, to notice a schema change.
    columns: Option<Vec<(String, u32)>>,
    /// How many messages the last peek read before its first change after the position.
    skipped: usize,
}

impl PostgresLogical {
    /// Builds the source without connecting.
    pub fn new(spec: SourceSpec, tls: &PostgresTls) -> Result<Self, SourceError> {
        let options = Options::from_spec(&spec)?;
        let pool = pools::postgres(&spec.connection_setting, &spec.connection, tls).map_err(SourceError::Invalid)?;
        Ok(Self {
            spec,
            options,
            pool,
            tls: tls.clone(),
            shape: Mutex::new(None),
            slot: tokio::sync::Mutex::new(SlotMemory::default()),
            streams: stream::Streams::default(),
            retained_warned: AtomicBool::new(false),
        })
    }

    async fn client(&self) -> Result<deadpool_postgres::Client, SourceError> {
        self.pool.get().await.map_err(|e| match connect_failure(&self.spec.connection_setting, &e) {
            ConnectFailure::Misconfigured(m) => SourceError::Invalid(m),
            ConnectFailure::Unavailable(m) => SourceError::Unavailable(m),
        })
    }

    fn error(&self, e: tokio_postgres::Error) -> SourceError {
        slot::db_error(e, &self.spec.table, &self.options)
    }

    fn position(&self, p: &Position) -> Result<Option<Pos>, SourceError> {
        if p.is_null() {
            return Ok(None);
        }
        Pos::from_json(p).map(Some).ok_or_else(|| {
            SourceError::Invalid(format!(
                "stored position {p} is not a postgres-logical position ({{\"lsn\": \"0/16B3748\", \"n\": 1}}); reset the function's state"
            ))
        })
    }

    /// A batch, from the reader the options choose.
    async fn read(&self, want: Want) -> Result<Fetched, SourceError> {
        match self.options.reader {
            Reader::Stream => self.stream_fetch(want).await,
            Reader::Sql => {
                let scan = self.scan(want, false).await?;
                self.fetched_from(scan, want).await
            }
        }
    }

    /// A peek for status: at the slot, or at a temporary copy of it while a stream (ours or another
    /// instance's) holds it.
    async fn status_scan(&self, want: Want) -> Result<Scan, SourceError> {
        match self.scan(want, false).await {
            Err(SourceError::Unavailable(m)) if m.contains("SQLSTATE 55006") => self.scan(want, true).await,
            other => other,
        }
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
        self.shape().await.map(|_| ())
    }

    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError> {
        self.shape().await?;
        let mut memory = self.slot.lock().await;
        let client = self.client().await?;
        let confirmed = self.ensure_slot(&client, true).await?;
        memory.at = Some(confirmed);
        let at = match from {
            // Snapshot: the live path starts where earliest does, and the engine starts a backfill of the rows
            // that exist beside it; whatever changes meanwhile, each chunk is checked against the stream.
            StartFrom::Earliest | StartFrom::Snapshot => confirmed,
            StartFrom::Now => {
                let flush: String = client.query_one(sql::FLUSH, &[]).await.map_err(|e| self.error(e))?.get(0);
                Lsn::parse(&flush).unwrap_or(confirmed).max(confirmed)
            }
        };
        Ok(Pos::before(at).to_json())
    }

    /// The horizon is `startFrom: now`'s position, before the WAL flushed now; a read that found nothing has
    /// passed it once its proven-empty position has (a refetch would read the stream, and proves nothing).
    async fn reached(&self, horizon: &Position, at: &Position) -> Result<bool, SourceError> {
        let (Some(horizon), at) = (self.position(horizon)?, self.position(at)?) else { return Ok(true) };
        Ok(at.is_some_and(|at| at.resume() >= horizon.resume()))
    }

    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let after = self.position(after)?;
        self.read(Want { after, upto: None, limit: limit.max(1), values: true }).await
    }

    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError> {
        let after = self.position(after)?;
        let upto = self.position(upto)?;
        let mut fetched = self.read(Want { after, upto, limit: limit.max(1), values: true }).await?;
        fetched.advance = None;
        Ok(fetched)
    }

    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        let after = self.position(after)?;
        let scan = self.status_scan(Want { after, upto: None, limit: PENDING_SCAN, values: false }).await?;
        Ok(scan.changes.len() as u64)
    }

    async fn oldest_pending_age(&self, after: &Position) -> Result<Lag, SourceError> {
        let after = self.position(after)?;
        let scan = self.status_scan(Want { after, upto: None, limit: 1, values: false }).await?;
        Ok(match scan.changes.first() {
            None => Lag::CaughtUp,
            Some(c) => Lag::Behind(Duration::from_secs_f64((scan.now - commit_unix_seconds(c.commit_time)).max(0.0))),
        })
    }

    async fn acknowledged(&self, checkpoint: &Position) -> Result<(), SourceError> {
        let Some(pos) = Pos::from_json(checkpoint) else { return Ok(()) };
        if self.options.reader == Reader::Stream {
            return self.stream_acknowledged(pos).await;
        }
        let target = pos.resume();
        let mut memory = self.slot.lock().await;
        if memory.at.is_some_and(|at| at >= target) {
            return Ok(());
        }
        self.advance_over_sql(&mut memory, target).await
    }

    async fn backfill_start(
        &self,
        checkpoint: &Position,
        filter: Option<&super::Filter>,
    ) -> Result<super::BackfillPlan, SourceError> {
        self.start_backfill(checkpoint, filter).await
    }

    async fn backfill_chunk(&self, request: super::ChunkRequest<'_>) -> Result<super::ChunkRead, SourceError> {
        self.read_chunk(request).await
    }

    async fn health(&self) -> Result<Option<Value>, SourceError> {
        let mut health = self.slot_health().await?;
        if let (Some(Value::Object(h)), Some(stream)) = (health.as_mut(), self.stream_health().await) {
            h.insert("stream".into(), stream);
        }
        Ok(health)
    }
}
