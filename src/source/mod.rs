//! Where changes come from. A [`Source`] turns "everything after this position" into an ordered batch.
//!
//! # Contract
//! - A position is opaque JSON owned by the source. The engine stores it, hands it back, and never compares
//!   positions; the source guarantees that `fetch(after)` returns changes strictly after `after`, in a total
//!   order (cursor or change version first, then primary key), and that `Fetched::last` is the position of
//!   the last change returned. Positions therefore only move forward.
//! - A change is returned only once it can never be followed by an earlier, still-invisible one (the
//!   late-commit guard): a transaction that commits after newer rows were read must not be skipped.
//! - `refetch(after, upto)` returns the changes in `(after, upto]` as they are now. A row updated since the
//!   first fetch has moved past `upto` and will come again later with its newer values; nothing is lost.
//! - Delivery is at-least-once: the engine may ask for the same range several times.
//! - Sources connect lazily: nothing here runs at process start.
//! - `pending` and `oldest_pending_age` are for status only: they are never called on a tick's path, and each
//!   must cost one bounded query (a count, or the first row of the keyset range), not a walk of the backlog.

pub mod filter;
pub mod mssql;
pub mod postgres;
pub mod postgres_logical;

use crate::change::Change;
use crate::config::{SourceOptions, SourceSpec};
use crate::db::postgres::PostgresTls;
use crate::ident::Ident;
pub use filter::Filter;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// An opaque, serializable place in a source's change stream. `Value::Null` is "before everything".
pub type Position = Value;

/// One batch: its id and where it lies in the source, after `from` (exclusive) up to `to` (inclusive), with its
/// row count. The one model of a batch's range: the state document's batch in flight and quarantine entries,
/// deferred delivery's memory of answered batches, a poison batch, and sink mode's chained and fetched-ahead
/// batches all carry one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BatchRange {
    pub batch_id: u64,
    /// After this position (exclusive)...
    pub from: Position,
    /// ...up to this one (inclusive).
    pub to: Position,
    pub rows: u64,
    /// Set when the batch is a chunk of a backfill (the rows that already exist, docs/operations.md
    /// "Backfill"): the backfill's id. `from` and `to` are then positions of the backfill's key walk
    /// ([`Source::backfill_chunk`]), not of the change stream, and acknowledging the batch moves the backfill,
    /// not the checkpoint. Absent in every live batch (and in documents written before backfills existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backfill: Option<String>,
}

impl BatchRange {
    pub fn new(batch_id: u64, from: Position, to: Position, rows: u64) -> Self {
        Self { batch_id, from, to, rows, backfill: None }
    }

    /// A chunk of backfill `id`.
    pub fn chunk(batch_id: u64, from: Position, to: Position, rows: u64, id: &str) -> Self {
        Self { backfill: Some(id.to_string()), ..Self::new(batch_id, from, to, rows) }
    }

    /// Another batch of the same kind (live, or a chunk of the same backfill).
    pub fn like(&self, batch_id: u64, from: Position, to: Position, rows: u64) -> Self {
        Self { backfill: self.backfill.clone(), ..Self::new(batch_id, from, to, rows) }
    }
}

/// What a backfill reads under, fixed when it starts ([`Source::backfill_start`]).
#[derive(Debug, Clone, PartialEq)]
pub struct BackfillPlan {
    /// Source-owned: what every chunk of this backfill is bounded by (postgres-cursor: the live checkpoint's
    /// cursor when the backfill started; mssql-rowversion: its rowversion; mssql-change-tracking: the version it
    /// covers). `Null`: there is nothing to backfill (the live path delivers every row, or the table is empty).
    pub bound: Position,
    /// How many rows the backfill is expected to deliver (the table changes meanwhile), when known.
    pub estimate: Option<u64>,
}

/// One chunk read of a backfill ([`Source::backfill_chunk`]).
#[derive(Debug, Clone, Copy)]
pub struct ChunkRequest<'a> {
    /// What the backfill reads under ([`BackfillPlan::bound`]).
    pub bound: &'a Position,
    /// After this key position (`Null`: from the first key)...
    pub after: &'a Position,
    /// ...up to this one, inclusive, when re-reading a chunk delivered before.
    pub upto: Option<&'a Position>,
    pub filter: Option<&'a Filter>,
    pub limit: usize,
    /// The end of the live changes already handed to the consumer (the checkpoint, or under deferred delivery
    /// the end of the answered span): the chunk is delivered right after them and before every live change
    /// after it. A source whose rule needs it (postgres-logical) reads it; the others need not.
    pub live: &'a Position,
}

/// What a chunk read found.
#[derive(Debug)]
pub enum ChunkRead {
    /// The chunk: rows (possibly none, at the end of the walk) and the last key read.
    Rows(Fetched),
    /// No chunk can be placed now without breaking the source's rule; the text says why. Nothing was read
    /// that the backfill must remember: the next tick asks again.
    Later(String),
}

/// A backfill's key position as stored: the key's texts (`["7", "b"]`), `None` for `Null` (before the first key).
/// A stored value that does not fit a key of `key_len` columns (a document edited by hand) is refused with the
/// fix.
pub fn backfill_key_texts(p: &Position, key_len: usize, table: &str) -> Result<Option<Vec<String>>, SourceError> {
    if p.is_null() {
        return Ok(None);
    }
    let texts: Option<Vec<String>> =
        p.as_array().and_then(|a| a.iter().map(|v| v.as_str().map(str::to_string)).collect());
    match texts {
        Some(t) if t.len() == key_len => Ok(Some(t)),
        _ => Err(backfill_key_misfit(p, key_len, table)),
    }
}

/// The refusal of a stored backfill key position `p` that does not fit a key of `key_len` columns.
pub fn backfill_key_misfit(p: &Position, key_len: usize, table: &str) -> SourceError {
    SourceError::Invalid(format!(
        "stored backfill position {p} does not fit the key of {table} (expected {key_len} text value(s)); cancel the backfill (handler state backfill <function> --cancel) and start it again"
    ))
}

/// The error of a source that cannot backfill, naming the ones that can.
pub fn cannot_backfill(name: &str) -> SourceError {
    SourceError::Invalid(format!(
        "{name} cannot backfill (yet): {} sources can; see docs/operations.md, \"Backfill\"",
        crate::config::SourceKind::listed(|c| c.backfill)
    ))
}

/// Where a function starts when it has no state yet: configuration, read by `config`, answered by sources.
pub use crate::config::StartFrom;

/// One fetched batch.
#[derive(Debug, Default)]
pub struct Fetched {
    pub changes: Vec<Change>,
    /// The position of the last change returned; `None` when `changes` is empty.
    pub last: Option<Position>,
    /// With no changes: a later position the source proved empty up to, which the engine may record now and
    /// then so a quiet table's stored position does not age out of the source's retention (SQL Server change
    /// tracking). `None` when the source has nothing to say.
    pub advance: Option<Position>,
}

/// How long the oldest undelivered change has waited: the lag an operator alerts on. Unlike "time since the
/// checkpoint last moved", it grows while a function is stuck *and* while it keeps up with a slowly aging
/// backlog, and it is zero as soon as nothing is waiting.
#[derive(Debug, Clone, PartialEq)]
pub enum Lag {
    /// Nothing is waiting after the position.
    CaughtUp,
    /// The first change waiting after the position was committed (or stamped) this long ago.
    Behind(Duration),
    /// Changes may be waiting but the source cannot date them; the text says why and what would make it able to.
    Unknown(String),
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The source's configuration or schema cannot work; retrying will not help. The message says what to do.
    #[error("{0}")]
    Invalid(String),
    /// The database could not be reached or the statement failed transiently (connection, timeout, deadlock).
    #[error("{0}")]
    Unavailable(String),
    /// The stored position is no longer served by the source (for example change-tracking retention passed
    /// it): changes were lost upstream, and only an explicit reset may continue.
    #[error("{0}")]
    PositionLost(String),
}

/// A change stream over one table. See the module docs for the contract.
#[async_trait::async_trait]
pub trait Source: Send + Sync + fmt::Debug {
    /// `kind:schema.table`, shown in state and status.
    fn name(&self) -> String;
    /// A digest of everything that gives a position its meaning (table, key and cursor columns, strategy).
    /// A changed fingerprint makes stored positions meaningless, so the engine refuses to continue.
    fn fingerprint(&self) -> String;
    /// Checks the table and settings against the database; called on first use, not at start-up.
    async fn validate(&self) -> Result<(), SourceError>;
    /// The position to start from when a function has no state.
    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError>;
    /// Up to `limit` changes strictly after `after`, in order.
    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError>;
    /// The changes in `(after, upto]` as they are now, for re-delivery of a known batch.
    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError>;
    /// How many changes are waiting after `after` (for status and scaling).
    async fn pending(&self, after: &Position) -> Result<u64, SourceError>;
    /// The age of the first change after `after`, in delivery order (for status and the lag gauge). Unlike
    /// `pending`, it includes changes the late-commit guard still holds back: a change that is committed but
    /// not yet deliverable is waiting all the same, and a guard stuck behind an open transaction must show as
    /// a growing lag, not as nothing to do. Sources that cannot date a change answer [`Lag::Unknown`] (the
    /// default) rather than a guess.
    async fn oldest_pending_age(&self, after: &Position) -> Result<Lag, SourceError> {
        let _ = after;
        Ok(Lag::Unknown(format!("{} does not record when a change was made", self.name())))
    }
    /// The order of two positions of this source, when it can tell without asking the database (`None`: it
    /// cannot, and nothing is checked). The engine refuses a state document whose batch in flight ends before
    /// it starts (edited by hand).
    fn position_order(&self, _a: &Position, _b: &Position) -> Option<std::cmp::Ordering> {
        None
    }
    /// A position no later than every one of `positions` (acknowledged checkpoints of this source's partitions):
    /// where a partition that merges their keys starts (`handler partitions change`, 8 → 4). Delivering after it
    /// may repeat changes, never skip one. Asked only when [`Source::position_order`] cannot pick the earliest
    /// (checkpoints of one transaction or change version); a source may ask its database. `Ok(None)`: it cannot
    /// name one, and the change is refused. Default: cannot.
    async fn no_later_than(&self, positions: &[Position]) -> Result<Option<Position>, SourceError> {
        let _ = positions;
        Ok(None)
    }
    /// The engine committed `checkpoint` (a stored, acknowledged position): a source that holds changes for
    /// us upstream (a replication slot) may release what the checkpoint has passed. Called by the lease
    /// holder at the start of a tick, after the state was read; never with a position that is not yet
    /// acknowledged. A failure is logged and changes nothing: the next tick calls again.
    async fn acknowledged(&self, checkpoint: &Position) -> Result<(), SourceError> {
        let _ = checkpoint;
        Ok(())
    }
    /// Starts a backfill (docs/operations.md "Backfill") while the live checkpoint is `checkpoint`: checks the
    /// filter against the table and answers the bound every chunk reads under, stored in the state document.
    /// The rule that makes chunks and live changes agree is the source's (docs/architecture.md, "Backfill").
    /// Default: this source cannot backfill, and the error names the ones that can.
    async fn backfill_start(
        &self,
        checkpoint: &Position,
        filter: Option<&Filter>,
    ) -> Result<BackfillPlan, SourceError> {
        let _ = (checkpoint, filter);
        Err(cannot_backfill(&self.name()))
    }
    /// Up to `request.limit` rows of the backfill started with `request.bound`, after key position
    /// `request.after` (`Null`: from the first key) and, when re-reading a chunk delivered before, up to
    /// `request.upto` (inclusive); in key order, as they are now, each an insert (operation 0).
    /// `Fetched::last` is the last key position read (a source may leave out rows it read: their keys' newer
    /// changes come through the live path, `request.live`). Reads in one statement: nothing is held open
    /// between chunks. [`ChunkRead::Later`]: the source cannot place a chunk right now (it says why), and the
    /// tick serves live changes instead.
    async fn backfill_chunk(&self, request: ChunkRequest<'_>) -> Result<ChunkRead, SourceError> {
        let _ = request;
        Err(cannot_backfill(&self.name()))
    }
    /// For a drain (`handler run --once`, docs/operations.md "Running without the Functions host"): the
    /// database's position now, which the drain must pass before it may stop, so that every change present when
    /// it started is delivered even when a fetch comes back empty before it got there (a replication stream
    /// still decoding other tables' WAL, a late-commit guard holding rows back). `None`: nothing is there to
    /// pass (an empty table). Default: where `startFrom: now` would start ([`Source::start_position`]).
    async fn horizon(&self) -> Result<Option<Position>, SourceError> {
        let now = self.start_position(StartFrom::Now).await?;
        Ok((!now.is_null()).then_some(now))
    }
    /// Whether a drain that must pass `horizon` is done, now that a fetch after `at` found nothing to deliver:
    /// `at` is the checkpoint, or the later position that fetch proved empty up to ([`Fetched::advance`]).
    /// Default: `at` is at or past `horizon` by [`Source::position_order`], or no change is left in
    /// `(at, horizon]` as the table is now ([`Source::refetch`], which no late-commit guard holds back).
    async fn reached(&self, horizon: &Position, at: &Position) -> Result<bool, SourceError> {
        if at == horizon || self.position_order(at, horizon).is_some_and(|o| o.is_ge()) {
            return Ok(true);
        }
        Ok(self.refetch(at, horizon, 1).await?.changes.is_empty())
    }
    /// What the source wants an operator to see in status beside pending and lag (a slot's retained WAL).
    async fn health(&self) -> Result<Option<Value>, SourceError> {
        Ok(None)
    }
}

/// The columns of `Item`: the `columns` option when set, else every column of the table, in table order.
pub(crate) fn item_column_names<'a>(
    spec: &SourceSpec,
    table_columns: impl Iterator<Item = &'a str>,
) -> Result<Vec<Ident>, SourceError> {
    match &spec.columns {
        Some(cols) => Ok(cols.clone()),
        None => table_columns.map(|n| Ident::new(n).map_err(SourceError::Invalid)).collect(),
    }
}

/// The registry of source kinds: the source a function's `spec` names, built from its kind's options (no
/// connection is opened here). A new kind adds its folder's `mod` line above and its arm here.
pub fn open(spec: &SourceSpec, postgres_tls: &PostgresTls) -> Result<Arc<dyn Source>, SourceError> {
    Ok(match &spec.options {
        SourceOptions::PostgresCursor(o) => {
            Arc::new(postgres::PostgresCursor::new(spec.clone(), o.clone(), postgres_tls)?)
        }
        SourceOptions::PostgresLogical(o) => {
            Arc::new(postgres_logical::PostgresLogical::new(spec.clone(), o.clone(), postgres_tls)?)
        }
        SourceOptions::MssqlChangeTracking(o) => Arc::new(mssql::MssqlChangeTracking::new(spec.clone(), o.clone())?),
        SourceOptions::MssqlRowversion(o) => Arc::new(mssql::MssqlRowversion::new(spec.clone(), o.clone())?),
    })
}

/// What [`Source::fingerprint`] digests: the kind, the table, the cursor column (for the kinds that have one)
/// and the key columns, one per line; the first 8 bytes of its SHA-256, in hex. The text is frozen: a stored
/// state whose fingerprint no longer matches is refused, so changing it would stop every deployed function.
pub fn fingerprint(spec: &SourceSpec, cursor: Option<&str>) -> String {
    let key = match &spec.primary_key {
        Some(k) => k.iter().map(Ident::as_str).collect::<Vec<_>>().join(","),
        None => "(primary key)".into(),
    };
    let mut text = format!("{}\n{}\n", spec.kind().as_str(), spec.table);
    if let Some(cursor) = cursor {
        text.push_str(cursor);
        text.push('\n');
    }
    text.push_str(&key);
    Sha256::digest(text.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The order of two positions by a leading integer each has (`number`: how to read it from a position), when
/// both have one and they differ; `None` otherwise (equal leading integers need the rest of the position, whose
/// order is the database's).
pub(crate) fn order_by_leading_integer(
    a: &Position,
    b: &Position,
    number: impl Fn(&Position) -> Option<i128>,
) -> Option<std::cmp::Ordering> {
    let (a, b) = (number(a)?, number(b)?);
    (a != b).then(|| a.cmp(&b))
}

#[cfg(test)]
mod tests;
