//! The backfill of the logical source: the rows that already exist, read in primary-key order in chunks, each
//! placed in the live stream right after the live changes already handed to the consumer (`D`,
//! `ChunkRequest::live`). The rule, argued in docs/architecture.md ("Backfill"), is DBLog's watermarks with
//! one step added for PostgreSQL's commit visibility:
//!
//! 1. Take an xid `X` (a statement that commits at once) and wait (a short, bounded poll) until no transaction
//!    older than `X` is in progress: the oldest one a new snapshot sees running (its `xmin`) is `X` or newer.
//!    A transaction's commit record reaches the WAL (and the stream) before its changes become visible to
//!    other sessions; every transaction the stream decoded before the chunk took its xid before `X`, so after
//!    this wait it is visible to the chunk's read. Not `pg_xact_status`: the commit log says "committed"
//!    before the transaction leaves the proc array, while a snapshot taken then still hides it. Not the
//!    running list of a snapshot (`pg_snapshot_xip`) either: it leaves out a running transaction whose xid is
//!    at or above the snapshot's `xmax` (the latest completed xid + 1), which a transaction waiting in its
//!    commit can be.
//! 2. Read the chunk in one statement.
//! 3. Write a transactional logical message and take its end as `H`: its commit is flushed at once, so the WAL
//!    has a flushed record after `H` even on an idle server; wait until the stream has decoded through it.
//!    Every transaction the chunk saw committed before `H`.
//! 4. Leave out of the chunk every key that a change the stream holds after `D` touched (both keys of a key
//!    change; every row after a truncate). Those changes are delivered after the chunk with their row images,
//!    so a key left in the chunk has no change in `(D, H]`: its value is the one the consumer holds after `D`,
//!    and its changes after `H` come after the chunk.
//!
//! A step that cannot finish in time (a long transaction, a stream behind or full, the slot held elsewhere)
//! gives the chunk up for this tick (`ChunkRead::Later`): live changes go first, and the next tick tries again.
//! What this keeps in memory beyond the stream's own bounded buffer: one chunk's rows and the set of keys the
//! buffer's changes after `D` touched (at most `streamBufferChanges` keys).

use super::buffer::Shared;
use super::catalog::{Catalog, Shape};
use super::conn::Conn;
use super::decode::Event;
use super::options::{Options, Reader};
use super::position::{Lsn, Pos};
use super::slot::Slot;
use super::sql::Render;
use super::stream::Stream;
use crate::change::{Change, Operation};
use crate::ident::{Ident, TableName};
use crate::source::postgres::position::{check_iso, Stored};
use crate::source::{
    backfill_key_texts, BackfillPlan, ChunkRead, ChunkRequest, Fetched, Filter, Position, SourceError,
};
use std::collections::HashSet;
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;

/// Raw reads one chunk may take when every row of a read was left out (each key changed while it was read):
/// the walk goes on rather than answer an empty chunk, which would end the backfill.
const READS_PER_CHUNK: usize = 4;

/// How often a chunk waiting for the stream asks the server how far it has sent.
const ASK_EVERY: Duration = Duration::from_millis(5);

/// A new xid, committed at once: every transaction that wrote a commit record before this took an older one.
pub const LOW_WATERMARK: &str = "SELECT pg_current_xact_id()::text";

/// Whether no transaction older than xid `$1` is still in progress (in the proc array, hidden from a snapshot
/// taken now).
pub const OLDER_ENDED: &str = "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= $1::text::xid8";

/// A transactional logical message (pgoutput does not send it: the publication is read without messages): its
/// end is the high watermark. It makes the transaction write WAL, so its commit is flushed at once (a
/// transaction that only takes an xid commits asynchronously, and the stream would wait for the WAL writer,
/// up to `wal_writer_delay`), and the stream can pass the watermark even when nothing else is written.
pub const HIGH_WATERMARK: &str = "SELECT pg_logical_emit_message(true, 'sql-pseudo-trigger/backfill', '')::text";

/// A statement's parameters, in order.
pub(super) type Params = Vec<Box<dyn ToSql + Sync + Send>>;

/// The statement of the chunk read `r` asks for, over `table` (quoted; `name` in errors), with its parameters:
/// the rows after `r.after` (none: from the first key), up to `r.upto` when it re-reads a chunk (else up to the
/// walk's end, the bound's `last`), matching `r.filter`, in key order: the key's texts, then the `Item`
/// (projected as the live path builds it). The parameters are the keys' and the filter's texts, then, unless it
/// re-reads, the limit (`r.limit`): a re-read is not limited, since rows inserted into its range since belong
/// to it. A stored key that does not fit the table's is refused with the fix.
pub(super) fn chunk_sql(
    shape: &Shape,
    table: &str,
    name: &str,
    r: &ChunkRequest<'_>,
) -> Result<(String, Params), SourceError> {
    let after = key_texts(shape, r.after, name)?;
    let upto = r.upto.map(|u| key_texts(shape, u, name)).transpose()?.flatten();
    let last = walk_end(shape, r.bound, name)?;
    let key_type = |k: &Ident| type_of(shape, k).unwrap_or_else(|| "text".into());
    let keys: Vec<String> = shape.key.iter().map(|k| format!("t.{}", k.pg())).collect();
    let keys = keys.join(", ");
    let mut params: Vec<String> = Vec::new();
    let mut preds = Vec::new();
    let bound_key = |texts: &[String], op: &str, params: &mut Vec<String>| {
        let first = params.len();
        let casts: Vec<String> =
            shape.key.iter().enumerate().map(|(i, k)| format!("(${}::text)::{}", first + i + 1, key_type(k))).collect();
        params.extend(texts.iter().cloned());
        format!("({keys}) {op} ({})", casts.join(", "))
    };
    if let Some(after) = after.as_deref() {
        preds.push(bound_key(after, ">", &mut params));
    }
    if let Some(end) = upto.as_deref().or(last.as_deref()) {
        preds.push(bound_key(end, "<=", &mut params));
    }
    if let Some(filter) = r.filter {
        let mut bound = Vec::new();
        preds.push(filter.to_pg(&|c| type_of(shape, c), params.len(), &mut bound));
        params.extend(bound);
    }
    let texts: Vec<String> = shape.key.iter().map(key_text).collect();
    let projected: Vec<String> = shape
        .item_renders
        .iter()
        .map(|(c, render)| match render {
            Render::Plain | Render::Json(_) => format!("t.{} AS {}", c.pg(), c.pg()),
            Render::Base64 => format!("translate(encode(t.{}, 'base64'), E'\\n', '') AS {}", c.pg(), c.pg()),
        })
        .collect();
    let preds = if preds.is_empty() { "true".to_string() } else { preds.join(" AND ") };
    let limited = upto.is_none();
    let limit = if limited { format!(" LIMIT ${}", params.len() + 1) } else { String::new() };
    let sql = format!(
        "SELECT {}, row_to_json(r.*)::text FROM {table} t CROSS JOIN LATERAL (SELECT {}) r WHERE {preds} ORDER BY {keys}{limit}",
        texts.join(", "),
        projected.join(", ")
    );
    let mut params: Params = params.into_iter().map(|t| Box::new(t) as Box<dyn ToSql + Sync + Send>).collect();
    if limited {
        params.push(Box::new(r.limit.max(1) as i64));
    }
    Ok((sql, params))
}

/// Where a backfill's walk ends (the bound's `last`, see [`Backfill::start`]); `None` when the table was empty
/// when it started.
fn walk_end(shape: &Shape, bound: &Position, table: &str) -> Result<Option<Vec<String>>, SourceError> {
    match bound.get("last") {
        Some(Position::Null) => Ok(None),
        Some(last) => key_texts(shape, last, table),
        None => Err(SourceError::Invalid(format!(
            "the stored backfill bound {bound} has no \"last\" key; cancel the backfill (handler state backfill <function> --cancel) and start it again"
        ))),
    }
}

/// A key column as the replication stream writes it: the type's output function (`format('%s', ...)`), which
/// a chunk's keys must equal to be matched with the stream's changes. A cast to text is not always that:
/// `char(n)::text` trims the padding, `boolean::text` is `true` where the output is `t`, `inet::text` adds
/// `/32`; a key read so would never match a change, and a chunk would keep a row a live change had touched.
/// A date or time key's text is the same on both sides whatever the database's defaults: the session contract
/// (`db::postgres::session`) gives the pooled sessions and the stream `DateStyle` ISO, and the stream logs in
/// with the pooled sessions' time zone.
fn key_text(k: &Ident) -> String {
    format!("format('%s', t.{})", k.pg())
}

/// A row's key texts (its first `arity` columns); a NULL in a key (a `primaryKey` named by hand over nullable
/// columns) is refused with the fix: such a row cannot be walked or matched.
fn key_of(row: &tokio_postgres::Row, arity: usize, table: &str) -> Result<Vec<String>, SourceError> {
    (0..arity)
        .map(|c| {
            row.try_get::<_, Option<String>>(c).ok().flatten().ok_or_else(|| {
                SourceError::Invalid(format!(
                    "a row of {table} has a NULL in its key column {}, which a backfill cannot walk; name key columns that are NOT NULL in primaryKey (or give the table a primary key)",
                    c + 1
                ))
            })
        })
        .collect()
}

/// The greatest key of the table: a backfill's walk ends there. A row with a greater key was written after the
/// backfill started (or its key was), so the live path delivers it; without this end, a table whose keys grow
/// under steady inserts would keep a backfill chasing its newest rows.
pub(super) fn last_key_sql(shape: &Shape, table: &str) -> String {
    let texts: Vec<String> = shape.key.iter().map(key_text).collect();
    let desc: Vec<String> = shape.key.iter().map(|k| format!("t.{} DESC", k.pg())).collect();
    format!("SELECT {} FROM {table} t ORDER BY {} LIMIT 1", texts.join(", "), desc.join(", "))
}

/// The count of the rows a backfill will walk (its estimate), with the filter's parameters.
pub(super) fn estimate_sql(shape: &Shape, table: &str, filter: Option<&Filter>) -> (String, Vec<String>) {
    let mut params = Vec::new();
    let preds = filter.map_or_else(|| "true".to_string(), |f| f.to_pg(&|c| type_of(shape, c), 0, &mut params));
    (format!("SELECT count(*) FROM {table} t WHERE {preds}"), params)
}

/// A column's type as SQL spells it.
fn type_of(shape: &Shape, column: &Ident) -> Option<String> {
    shape.catalog.iter().find(|c| c.name == column.as_str()).map(|c| c.filter_type.clone())
}

/// The keys the stream's changes after `D` touched: what step 4 leaves out of a chunk.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Touched {
    keys: HashSet<Vec<String>>,
    /// A truncate after `D`: every row the chunk read is gone or was written after it.
    all: bool,
}

impl Touched {
    /// From the events after `D`, in order. A change whose key the WAL did not carry cannot be matched: the
    /// error says so, and the chunk waits.
    pub fn of<'a>(events: impl Iterator<Item = &'a Event>) -> Result<Self, String> {
        let mut touched = Self::default();
        for event in events {
            match event {
                Event::Change(c) => match &c.key {
                    Some(key) => {
                        touched.keys.insert(key.clone());
                    }
                    None => {
                        return Err(format!(
                            "a change at LSN {} does not carry its key in the WAL, so the chunk cannot be checked against it",
                            c.lsn
                        ))
                    }
                },
                Event::Truncate { .. } => touched.all = true,
                Event::Commit { .. } => {}
            }
        }
        Ok(touched)
    }

    /// Whether a chunk row of `key` stays in the chunk.
    pub fn keeps(&self, key: &[String]) -> bool {
        !self.all && !self.keys.contains(key)
    }
}

/// Reads a backfill's chunks by the rule in the module docs: what it reads through, how long it waits, and which
/// reader the source runs (a backfill needs the stream). The source calls it with the parts a chunk builds on:
/// the catalog (the table's shape), the slot and the stream (the changes a chunk is checked against).
#[derive(Debug)]
pub(super) struct Backfill {
    conn: Conn,
    table: TableName,
    options: Options,
}

impl Backfill {
    pub fn new(conn: Conn, table: TableName, options: Options) -> Self {
        Self { conn, table, options }
    }

    /// The backfill's bound: `{"from": the live position it started at (for the record: the rule needs none,
    /// each chunk is placed at the live position of its own tick), "last": the table's greatest key then (the
    /// walk's end; `null` for an empty table)}`. Refused with the SQL reader, which has no stream to check
    /// chunks against.
    pub async fn start(
        &self,
        catalog: &Catalog,
        checkpoint: &Position,
        filter: Option<&Filter>,
    ) -> Result<BackfillPlan, SourceError> {
        self.check_reader()?;
        let shape = catalog.shape().await?;
        if let Some(filter) = filter {
            filter
                .check_columns(&self.table.to_string(), shape.columns.iter().map(String::as_str))
                .map_err(SourceError::Invalid)?;
        }
        let (sql, params) = estimate_sql(&shape, &self.table.pg(), filter);
        let client = self.conn.client().await?;
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|t| t as &(dyn ToSql + Sync)).collect();
        let count: i64 = client.query_one(&sql, &refs).await.map_err(|e| self.conn.error(e))?.get(0);
        let last =
            client.query_opt(&last_key_sql(&shape, &self.table.pg()), &[]).await.map_err(|e| self.conn.error(e))?;
        let table = self.table.to_string();
        let last = match last {
            Some(row) => {
                Some(key_of(&row, shape.key.len(), &table)?.into_iter().map(Position::String).collect::<Vec<_>>())
            }
            None => None,
        };
        let bound = serde_json::json!({ "from": checkpoint, "last": last });
        Ok(BackfillPlan { bound, estimate: Some(count.max(0) as u64) })
    }

    fn check_reader(&self) -> Result<(), SourceError> {
        match self.options.reader {
            Reader::Stream => Ok(()),
            Reader::Sql => Err(SourceError::Invalid(format!(
                "postgres-logical:{} cannot backfill with \"reader\": \"sql\": a chunk is checked against the changes a replication stream decoded around it. Remove \"reader\" (the stream is the default) to backfill",
                self.table
            ))),
        }
    }

    /// One chunk by the rule in the module docs.
    pub async fn chunk(
        &self,
        catalog: &Catalog,
        slot: &Slot,
        stream: &Stream,
        r: ChunkRequest<'_>,
    ) -> Result<ChunkRead, SourceError> {
        self.check_reader()?;
        let shape = catalog.shape().await?;
        let live = Pos::stored(r.live)?;
        let (arity, table, quoted) = (shape.key.len(), self.table.to_string(), self.table.pg());
        // The request is checked before anything is read: a stored key that does not fit is refused.
        let mut statement = chunk_sql(&shape, &quoted, &table, &r)?;
        if r.bound.get("last") == Some(&Position::Null) {
            // The table was empty when the backfill started: every row is the live path's.
            return Ok(ChunkRead::Rows(Fetched::default()));
        }
        let Some(shared) = stream.serving(catalog, slot, live).await? else {
            return Ok(ChunkRead::Later(format!(
                "replication slot {} is streamed by another session",
                self.options.slot
            )));
        };
        // A re-read of a chunk delivered before (`upto` holds its last key) reads its range once, unlimited.
        let rereads = r.upto.is_some_and(|u| !u.is_null());
        let mut out = Fetched::default();
        let reads = if rereads { 1 } else { READS_PER_CHUNK };
        for _ in 0..reads {
            let client = self.conn.client().await?;
            // 1. Everything the stream decoded so far is visible to the read below.
            if let Some(why) = self.wait_for_snapshot(&client).await? {
                return Ok(ChunkRead::Later(why));
            }
            // 2. The chunk, in one statement.
            let (sql, params) = statement;
            let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref() as &(dyn ToSql + Sync)).collect();
            let rows = client.query(&sql, &refs).await.map_err(|e| self.conn.error(e))?;
            // 3. The high watermark, and the stream through it.
            let row = client.query_one(HIGH_WATERMARK, &[]).await.map_err(|e| self.conn.error(e))?;
            drop(client);
            let high = Lsn::parse(&row.get::<_, String>(0)).ok_or_else(|| {
                SourceError::Invalid("PostgreSQL answered an unreadable WAL position; please report it".into())
            })?;
            let touched = match self.decoded_through(&shared, live, high).await {
                Ok(touched) => touched,
                Err(why) => return Ok(ChunkRead::Later(why)),
            };
            // 4. Leave out what changed after D.
            let Some(last) = rows.last() else { return Ok(ChunkRead::Rows(out)) };
            let last = key_of(last, arity, &table)?;
            for row in &rows {
                let key = key_of(row, arity, &table)?;
                if touched.keeps(&key) {
                    let item: String = row.get(arity);
                    let change = Change::from_json(Operation::Insert, item)
                        .map_err(|e| SourceError::Invalid(format!("PostgreSQL returned invalid row JSON: {e}")))?;
                    out.changes.push(change);
                }
            }
            let left_out = rows.len() - out.changes.len();
            if left_out > 0 {
                tracing::debug!(table = %self.table, rows = rows.len(), left_out, "left out of a backfill chunk the rows whose keys changed while it was read; their changes follow it");
            }
            let walked = Position::Array(last.into_iter().map(Position::String).collect());
            if !out.changes.is_empty() || rereads {
                out.last = Some(walked);
                return Ok(ChunkRead::Rows(out));
            }
            // Every row read was left out: the walk goes on after the last one.
            statement = chunk_sql(&shape, &quoted, &table, &ChunkRequest { after: &walked, ..r })?;
            out.last = Some(walked);
        }
        Ok(ChunkRead::Later(format!(
            "every row of {READS_PER_CHUNK} chunks in a row changed while it was read (its newer change is delivered live)"
        )))
    }

    /// Step 1: takes an xid and waits, at most `streamPollMs`, until no older transaction is in progress.
    /// `Some(why)` when the bound passed.
    async fn wait_for_snapshot(&self, client: &deadpool_postgres::Client) -> Result<Option<String>, SourceError> {
        let x: String = client.query_one(LOW_WATERMARK, &[]).await.map_err(|e| self.conn.error(e))?.get(0);
        let deadline = Instant::now() + Duration::from_millis(self.options.poll_ms);
        let mut pause = Duration::from_millis(1);
        loop {
            let ended: bool = client.query_one(OLDER_ENDED, &[&x]).await.map_err(|e| self.conn.error(e))?.get(0);
            if ended {
                return Ok(None);
            }
            if Instant::now() >= deadline {
                // (Said without xids: the engine logs a reason once, and the xids change from tick to tick.)
                tracing::debug!(table = %self.table, xid = %x, "a backfill chunk waits for transactions older than this xid");
                return Ok(Some(format!(
                    "transactions in progress when the chunk was to be read have not ended within streamPollMs ({} ms), and a chunk read before they end could miss a change the stream already delivered (pg_stat_activity's backend_xid and xact_start name them)",
                    self.options.poll_ms
                )));
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// Step 3: waits, at most `streamPollMs`, until the stream has decoded the WAL through `high`, and answers
    /// the keys its changes after `live` touched; `Err(why)` when it cannot.
    async fn decoded_through(&self, shared: &Shared, live: Option<Pos>, high: Lsn) -> Result<Touched, String> {
        let deadline = tokio::time::Instant::now() + Duration::from_millis(self.options.poll_ms);
        let mut asked: Option<tokio::time::Instant> = None;
        loop {
            let notified = shared.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut b = shared.lock();
                b.last_used = Instant::now();
                if b.ended.is_some() {
                    return Err("the replication stream stopped while the chunk was read".into());
                }
                if !b.serves(live) {
                    return Err("the stream no longer holds every change after the live position".into());
                }
                if b.proven() >= high {
                    return Touched::of(b.after(live));
                }
                if b.paused {
                    return Err("the stream's buffer is full of changes not delivered yet (streamBufferChanges, streamBufferBytes): live changes catch up first".into());
                }
                // A keepalive answer says how far the server has sent. Asked at most every ASK_EVERY: asking on
                // every answer keeps the server answering instead of reading the WAL.
                if asked.is_none_or(|at| at.elapsed() >= ASK_EVERY) {
                    b.reply_wanted = true;
                    asked = Some(tokio::time::Instant::now());
                }
            }
            shared.wake.notify_one();
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(format!(
                    "the stream had not decoded the WAL up to {high} within streamPollMs ({} ms)",
                    self.options.poll_ms
                ));
            }
            let _ = tokio::time::timeout_at(deadline.min(now + ASK_EVERY), notified).await;
        }
    }
}

/// A stored backfill key position's texts (`None`: before the first key), refused when they do not fit the key
/// or hold a date or time written in another DateStyle (`postgres::position`).
fn key_texts(shape: &Shape, p: &Position, table: &str) -> Result<Option<Vec<String>>, SourceError> {
    let texts = backfill_key_texts(p, shape.key.len(), table)?;
    if let Some(t) = &texts {
        let type_of = |k: &Ident| shape.catalog.iter().find(|c| c.name == k.as_str()).map(|c| c.type_name.clone());
        let types: Vec<String> = shape.key.iter().map(|k| type_of(k).unwrap_or_default()).collect();
        check_iso(Stored::Backfill, table, &types, t).map_err(SourceError::Invalid)?;
    }
    Ok(texts)
}

#[cfg(test)]
#[path = "backfill_tests.rs"]
mod tests;
