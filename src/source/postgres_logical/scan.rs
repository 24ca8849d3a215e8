//! A batch out of a run of [`Event`]s, whichever reader produced them: what a position has passed is skipped,
//! at most `limit` changes are taken, and the event after the last one says whether its transaction is done
//! ([`Scanner`]). Then [`Batches`] turns the scan into the batch the engine delivers, one statement per batch
//! building the `Item`s the decoder could not.

use super::catalog::Catalog;
use super::conn::Conn;
use super::decode::{commit_time_text, Decoded, Event};
use super::options::OnTruncate;
use super::position::{Lsn, Place, Pos};
use crate::change::Change;
use crate::ident::TableName;
use crate::source::{Fetched, Position, SourceError};
use serde_json::json;

/// How far a scan goes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Want {
    pub after: Option<Pos>,
    pub upto: Option<Pos>,
    pub limit: usize,
    /// Build the values (a fetch) or only count and date (status).
    pub values: bool,
}

/// What one scan found.
#[derive(Debug, Default)]
pub(super) struct Scan {
    pub changes: Vec<Decoded>,
    /// The end of the last change's transaction, when the change is its transaction's last.
    pub last_end: Option<Lsn>,
    /// A skipped TRUNCATE after the last change (`onTruncate: skip`): the position passes it.
    pub passed: Option<Place>,
    /// Everything up to here was read and holds nothing more (the reader reached the WAL's flush position).
    pub proven_to: Option<Lsn>,
    /// The server's clock, in Unix seconds (status's lag).
    pub now: f64,
    /// The truncates passed (`onTruncate: skip`), said once the batch is taken.
    pub skipped_truncates: Vec<(Place, u32)>,
}

/// Takes events one at a time (see the module docs).
pub(super) struct Scanner<'a> {
    want: Want,
    pub out: Scan,
    looking_ahead: bool,
    /// The batch is whole: what follows it was seen, or `upto` was reached.
    pub complete: bool,
    /// The last event taken was a change the position had passed.
    pub skipped: bool,
    on_truncate: OnTruncate,
    table: &'a str,
}

impl<'a> Scanner<'a> {
    pub fn new(want: Want, on_truncate: OnTruncate, table: &'a str) -> Self {
        Self { want, out: Scan::default(), looking_ahead: false, complete: false, skipped: false, on_truncate, table }
    }

    /// Takes one event; once `complete` is set, the rest must not be offered.
    pub fn push(&mut self, event: &Event) -> Result<(), SourceError> {
        self.skipped = false;
        match event {
            Event::Commit { commit, end } => {
                if self.out.changes.last().is_some_and(|c| c.place.commit == *commit) {
                    self.out.last_end = Some(*end);
                }
                if self.looking_ahead {
                    self.complete = true;
                }
            }
            Event::Change(change) => {
                if self.looking_ahead {
                    self.complete = true;
                    return Ok(());
                }
                if self.want.after.is_some_and(|a| a.covers(change.place)) {
                    self.skipped = true;
                    return Ok(());
                }
                if self.want.upto.is_some_and(|u| !u.covers(change.place)) {
                    self.complete = true;
                    return Ok(());
                }
                self.out.changes.push(change.clone());
                self.out.last_end = None;
                self.out.passed = None;
                if self.out.changes.len() >= self.want.limit {
                    self.looking_ahead = true;
                }
            }
            Event::Truncate { place, xid } => {
                if self.looking_ahead {
                    self.complete = true;
                    return Ok(());
                }
                if self.want.after.is_some_and(|a| a.covers(*place)) {
                    return Ok(());
                }
                if self.want.upto.is_some_and(|u| !u.covers(*place)) {
                    self.complete = true;
                    return Ok(());
                }
                let table = self.table;
                match self.on_truncate {
                    OnTruncate::Fail if self.out.changes.is_empty() => {
                        return Err(SourceError::Invalid(format!(
                            "table {table} was truncated (TRUNCATE in transaction {xid} committed at LSN {}): a truncate removes every row without a change per row, so a consumer that mirrors the table is now out of step. Resync the consumer, then either set onTruncate to \"skip\" in sqltrigger.json to go on past it, or run handler state reset <function> --to now --confirm",
                            place.commit
                        )))
                    }
                    // Deliver what came before it first; the next fetch stops at it.
                    OnTruncate::Fail => self.complete = true,
                    OnTruncate::Skip => {
                        self.out.passed = Some(*place);
                        self.out.skipped_truncates.push((*place, *xid));
                    }
                }
            }
        }
        Ok(())
    }
}

/// Builds the batch a scan found (either reader's): its `Item`s, its metadata when `includeMetadata` asks for
/// it, and its last position, or with no change what the scan proved. Held by the source, which calls
/// [`Batches::fetched`] after each read.
#[derive(Debug)]
pub(super) struct Batches {
    conn: Conn,
    table: TableName,
    include_metadata: bool,
}

impl Batches {
    pub fn new(conn: Conn, table: TableName, include_metadata: bool) -> Self {
        Self { conn, table, include_metadata }
    }

    /// Builds the changes of a scan: the `Item`s the decoder built (`item`), and one statement for the rest.
    async fn changes(&self, catalog: &Catalog, scan: &Scan) -> Result<Vec<Change>, SourceError> {
        let rest: Vec<&Decoded> = scan.changes.iter().filter(|c| c.item.is_none()).collect();
        let mut built = self.items_by_sql(catalog, &rest).await?.into_iter();
        let mut out = Vec::with_capacity(scan.changes.len());
        for decoded in &scan.changes {
            let item = match &decoded.item {
                Some(item) => item.clone(),
                None => {
                    built.next().ok_or_else(|| SourceError::Invalid("an Item went missing; please report it".into()))?
                }
            };
            let mut change = Change::from_json(decoded.operation, item)
                .map_err(|e| SourceError::Invalid(format!("an Item is not valid JSON: {e}")))?;
            if self.include_metadata {
                let metadata = json!({
                    "Lsn": decoded.lsn.to_string(),
                    "CommitLsn": decoded.place.commit.to_string(),
                    "Xid": decoded.xid,
                    "CommitTime": commit_time_text(decoded.commit_time),
                });
                change.metadata = serde_json::value::to_raw_value(&metadata).ok();
            }
            out.push(change);
        }
        Ok(out)
    }

    /// The `Item`s of changes the decoder could not build, in order: one statement (`sql::items`).
    async fn items_by_sql(&self, catalog: &Catalog, changes: &[&Decoded]) -> Result<Vec<String>, SourceError> {
        if changes.is_empty() {
            return Ok(Vec::new());
        }
        let shape = catalog.shape().await?;
        let client = self.conn.client().await?;
        let objects =
            changes.iter().map(|c| serde_json::to_string(&c.values)).collect::<Result<Vec<String>, _>>().map_err(
                |e| SourceError::Invalid(format!("a change's values do not serialize ({e}); please report it")),
            )?;
        let kinds: Vec<i32> = changes.iter().map(|c| c.kind).collect();
        let statement = client.prepare_cached(&shape.items).await.map_err(|e| self.conn.error(e))?;
        let rows = client.query(&statement, &[&objects, &kinds]).await.map_err(|e| self.conn.error(e))?;
        if rows.len() != changes.len() {
            return Err(SourceError::Invalid(format!(
                "building the items of {} changes returned {} rows; please report it",
                changes.len(),
                rows.len()
            )));
        }
        Ok(rows.iter().map(|r| r.get(0)).collect())
    }

    /// The batch a scan found, with its `Item`s: its last position, or with no change what the scan proved.
    pub async fn fetched(&self, catalog: &Catalog, scan: Scan, want: Want) -> Result<Fetched, SourceError> {
        let table = &self.table;
        for (place, xid) in &scan.skipped_truncates {
            tracing::error!(
                table = %table, xid = xid, lsn = %place.commit,
                "table {table} was truncated (transaction {xid} committed at LSN {}); onTruncate is skip, so no change is delivered for it",
                place.commit
            );
        }
        let changes = self.changes(catalog, &scan).await?;
        if !changes.is_empty() {
            return Ok(Fetched { last: last(&scan), changes, advance: None });
        }
        // Nothing to deliver: a skipped truncate is passed, else the stretch read is proven empty.
        let advance = match scan.passed {
            Some(place) => Some(Pos { commit: place.commit, seq: place.seq, end: None }.to_json()),
            None => scan
                .proven_to
                .filter(|to| want.after.is_none_or(|a| a.resume() < *to))
                .map(|to| Pos::before(to).to_json()),
        };
        Ok(Fetched { changes, last: None, advance })
    }
}

/// The position after a scan's last change (or a skipped truncate after it).
fn last(scan: &Scan) -> Option<Position> {
    if let Some(place) = scan.passed {
        return Some(Pos { commit: place.commit, seq: place.seq, end: None }.to_json());
    }
    let c = scan.changes.last()?;
    Some(Pos { commit: c.place.commit, seq: c.place.seq, end: scan.last_end }.to_json())
}
