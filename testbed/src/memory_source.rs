//! An in-memory source: a table of rows kept in `(version, key)` order, for engine tests and the examples
//! in the docs. It keeps the [`Source`] contract, including a late-commit guard: rows written by an
//! uncommitted "transaction" ([`MemorySource::begin`]) stay invisible, and nothing at or above the oldest
//! open transaction's version is returned, exactly like the xid8 guard of the PostgreSQL source. Each row keeps
//! its commit time, so the lag can be dated as the PostgreSQL source dates it with commit timestamps.

use sql_pseudo_trigger::change::{Change, Operation};
use sql_pseudo_trigger::source::{Fetched, Lag, Position, Source, SourceError, StartFrom};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use time::OffsetDateTime;

/// A committed row: its version, whether it is soft-deleted, its item JSON and when it was committed.
#[derive(Debug, Clone)]
struct Row {
    version: u64,
    deleted: bool,
    item: String,
    committed_at: OffsetDateTime,
}

#[derive(Debug, Default)]
struct Inner {
    /// Committed rows by key.
    rows: BTreeMap<i64, Row>,
    /// Versions of open transactions and their pending writes.
    open: BTreeMap<u64, Vec<(i64, bool, String)>>,
    next_version: u64,
    /// Fault injection: the next N fetches fail as if the database were down.
    failures: u32,
    fetches: u64,
    /// Every backfill chunk read: its `after` and `upto`.
    chunk_reads: Vec<(Position, Option<Position>)>,
    /// The live position each chunk read was given (`ChunkRequest::live`).
    chunk_lives: Vec<Position>,
    /// When set, every chunk read answers `ChunkRead::Later` with this text.
    chunks_later: Option<String>,
}

#[derive(Debug, Default)]
pub struct MemorySource {
    inner: Mutex<Inner>,
}

impl MemorySource {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every backfill chunk read so far: `(after, upto)`.
    pub fn chunk_reads(&self) -> Vec<(Position, Option<Position>)> {
        self.inner.lock().expect("memory source lock").chunk_reads.clone()
    }

    /// The live position each backfill chunk read was given, in order.
    pub fn chunk_live_positions(&self) -> Vec<Position> {
        self.inner.lock().expect("memory source lock").chunk_lives.clone()
    }

    /// While `why` is set, every chunk read answers that no chunk can be placed now (as the logical source does
    /// while a transaction of its window is still in progress).
    pub fn refuse_chunks(&self, why: Option<&str>) {
        self.inner.lock().expect("memory source lock").chunks_later = why.map(str::to_string);
    }

    /// Starts a transaction and returns its version; its writes are invisible until [`Self::commit`].
    pub fn begin(&self) -> u64 {
        let mut i = self.inner.lock().expect("memory source lock");
        i.next_version += 1;
        let v = i.next_version;
        i.open.insert(v, Vec::new());
        v
    }

    /// Writes a row in an open transaction; `deleted` marks a soft delete.
    pub fn write(&self, tx: u64, key: i64, deleted: bool, item: serde_json::Value) {
        let mut i = self.inner.lock().expect("memory source lock");
        if let Some(w) = i.open.get_mut(&tx) {
            w.push((key, deleted, item.to_string()));
        }
    }

    pub fn commit(&self, tx: u64) {
        self.commit_at(tx, OffsetDateTime::now_utc());
    }

    /// Commits as if at `at`: a commit time the test knows, to date the lag against.
    pub fn commit_at(&self, tx: u64, at: OffsetDateTime) {
        let mut i = self.inner.lock().expect("memory source lock");
        if let Some(writes) = i.open.remove(&tx) {
            for (key, deleted, item) in writes {
                i.rows.insert(key, Row { version: tx, deleted, item, committed_at: at });
            }
        }
    }

    /// One committed transaction writing `{"id": key, "v": value}` for each key.
    pub fn upsert(&self, keys: impl IntoIterator<Item = i64>, value: i64) {
        let tx = self.begin();
        for k in keys {
            self.write(tx, k, false, serde_json::json!({ "id": k, "v": value }));
        }
        self.commit(tx);
    }

    /// [`Self::upsert`] committed at `at`.
    pub fn upsert_at(&self, keys: impl IntoIterator<Item = i64>, value: i64, at: OffsetDateTime) {
        let tx = self.begin();
        for k in keys {
            self.write(tx, k, false, serde_json::json!({ "id": k, "v": value }));
        }
        self.commit_at(tx, at);
    }

    pub fn delete(&self, key: i64) {
        let tx = self.begin();
        self.write(tx, key, true, serde_json::json!({ "id": key }));
        self.commit(tx);
    }

    /// Makes the next `n` fetches fail with [`SourceError::Unavailable`].
    pub fn fail_next_fetches(&self, n: u32) {
        self.inner.lock().expect("memory source lock").failures = n;
    }

    pub fn fetches(&self) -> u64 {
        self.inner.lock().expect("memory source lock").fetches
    }

    fn position(p: &Position) -> Result<Option<(u64, i64)>, SourceError> {
        if p.is_null() {
            return Ok(None);
        }
        let a = p.as_array().filter(|a| a.len() == 2);
        let v = a.and_then(|a| Some((a[0].as_u64()?, a[1].as_i64()?)));
        v.map(Some).ok_or_else(|| SourceError::Invalid(format!("bad position {p}")))
    }

    /// A fetch: counted, and failing while failures are injected.
    fn read(&self, after: &Position, upto: Option<&Position>, limit: usize) -> Result<Fetched, SourceError> {
        {
            let mut i = self.inner.lock().expect("memory source lock");
            i.fetches += 1;
            if i.failures > 0 {
                i.failures -= 1;
                return Err(SourceError::Unavailable("injected: database unavailable".into()));
            }
        }
        self.scan(after, upto, limit)
    }

    /// The committed rows after `after` (up to `upto`) below the horizon, in position order. Neither counted
    /// nor failed by injection: status reads (pending) must not use up a failure a test aimed at a tick.
    fn scan(&self, after: &Position, upto: Option<&Position>, limit: usize) -> Result<Fetched, SourceError> {
        let after = Self::position(after)?;
        let upto = upto.map(Self::position).transpose()?.flatten();
        let i = self.inner.lock().expect("memory source lock");
        let horizon = i.open.keys().next().copied().unwrap_or(u64::MAX);
        let ordered: BTreeSet<(u64, i64)> = i.rows.iter().map(|(k, r)| (r.version, *k)).collect();
        let mut fetched = Fetched::default();
        for (v, k) in ordered {
            if v >= horizon || after.is_some_and(|a| (v, k) <= a) || upto.is_some_and(|u| (v, k) > u) {
                continue;
            }
            if fetched.changes.len() == limit {
                break;
            }
            let row = &i.rows[&k];
            let op = if row.deleted { Operation::Delete } else { Operation::Update };
            let change = Change::from_json(op, row.item.clone()).map_err(|e| SourceError::Invalid(e.to_string()))?;
            fetched.changes.push(change);
            fetched.last = Some(serde_json::json!([v, k]));
        }
        Ok(fetched)
    }
}

#[async_trait::async_trait]
impl Source for MemorySource {
    fn position_order(&self, a: &Position, b: &Position) -> Option<std::cmp::Ordering> {
        Some(Self::position(a).ok()?.cmp(&Self::position(b).ok()?))
    }

    fn name(&self) -> String {
        "memory:rows".into()
    }

    fn fingerprint(&self) -> String {
        "memory-v1".into()
    }

    async fn validate(&self) -> Result<(), SourceError> {
        Ok(())
    }

    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError> {
        match from {
            StartFrom::Earliest => Ok(Position::Null),
            StartFrom::Now | StartFrom::Snapshot => {
                Ok(self.read(&Position::Null, None, usize::MAX)?.last.unwrap_or(Position::Null))
            }
        }
    }

    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError> {
        self.read(after, None, limit)
    }

    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError> {
        self.read(after, Some(upto), limit)
    }

    /// The cursor source's rule over this table: bound = the checkpoint's version; a chunk holds the committed,
    /// not deleted rows whose version is at most the bound, in key order. Positions are `[key]`.
    async fn backfill_start(
        &self,
        checkpoint: &Position,
        _filter: Option<&sql_pseudo_trigger::source::Filter>,
    ) -> Result<sql_pseudo_trigger::source::BackfillPlan, SourceError> {
        let bound = Self::position(checkpoint)?.map_or(Position::Null, |(v, _)| serde_json::json!(v));
        Ok(sql_pseudo_trigger::source::BackfillPlan { bound, estimate: None })
    }

    async fn backfill_chunk(
        &self,
        request: sql_pseudo_trigger::source::ChunkRequest<'_>,
    ) -> Result<sql_pseudo_trigger::source::ChunkRead, SourceError> {
        let sql_pseudo_trigger::source::ChunkRequest { bound, after, upto, limit, .. } = request;
        let key = |p: &Position| p.as_array().and_then(|a| a.first()).and_then(|k| k.as_i64());
        let mut i = self.inner.lock().expect("memory source lock");
        i.chunk_lives.push(request.live.clone());
        if let Some(why) = &i.chunks_later {
            return Ok(sql_pseudo_trigger::source::ChunkRead::Later(why.clone()));
        }
        i.chunk_reads.push((after.clone(), upto.cloned()));
        let Some(bound) = bound.as_u64() else {
            return Ok(sql_pseudo_trigger::source::ChunkRead::Rows(Fetched::default()));
        };
        let (after, upto) = (key(after), upto.and_then(key));
        let mut fetched = Fetched::default();
        for (k, r) in i.rows.iter() {
            if after.is_some_and(|a| *k <= a) || upto.is_some_and(|u| *k > u) || r.deleted || r.version > bound {
                continue;
            }
            if fetched.changes.len() >= limit {
                break;
            }
            fetched.changes.push(Change::from_json(Operation::Insert, r.item.clone()).expect("row json"));
            fetched.last = Some(serde_json::json!([k]));
        }
        Ok(sql_pseudo_trigger::source::ChunkRead::Rows(fetched))
    }

    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        Ok(self.scan(after, None, usize::MAX)?.changes.len() as u64)
    }

    /// The commit time of the first committed row after `after`, the guard's horizon ignored, as the
    /// PostgreSQL source dates its first pending row.
    async fn oldest_pending_age(&self, after: &Position) -> Result<Lag, SourceError> {
        let after = Self::position(after)?;
        let i = self.inner.lock().expect("memory source lock");
        let first = i
            .rows
            .iter()
            .filter(|(k, r)| after.is_none_or(|a| (r.version, **k) > a))
            .min_by_key(|(k, r)| (r.version, **k));
        Ok(match first {
            None => Lag::CaughtUp,
            Some((_, r)) => {
                let age = (OffsetDateTime::now_utc() - r.committed_at).max(time::Duration::ZERO);
                Lag::Behind(age.unsigned_abs())
            }
        })
    }
}
