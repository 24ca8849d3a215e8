//! From pgoutput messages to placed changes: both readers (the SQL peek and the stream) feed the messages they
//! receive, in WAL order, to a [`Decoder`], which follows transactions and relations and hands out [`Event`]s
//! for the watched table only, each placed as [`position`](super::position) describes.

use super::catalog::Shape;
use super::item::{self, Plan};
use super::options::DeleteItem;
use super::pgoutput::{self, Message, OldKind, Relation, POSTGRES_EPOCH};
use super::position::{Lsn, Place};
use crate::change::Operation;
use crate::source::SourceError;
use serde_json::{Map, Value};
use std::sync::Arc;

/// A change as decoded, before its `Item` is built.
#[derive(Debug, Clone)]
pub(super) struct Decoded {
    pub place: Place,
    pub operation: Operation,
    /// 0 the row, 1 the key, 2 the row with left-out columns read from the table (`sql::items`).
    pub kind: i32,
    pub values: Map<String, Value>,
    /// The `Item` built in the handler (`item`), or `None` when `sql::items` builds it.
    pub item: Option<String>,
    pub lsn: Lsn,
    pub xid: u32,
    pub commit_time: i64,
    /// The texts of the key the change touched (the old key, for the delete half of a key change), in key
    /// order, as the WAL carries them: what a backfill drops from a chunk (`backfill`). `None` when a key
    /// column's value is not in the WAL (status decodes no values).
    pub key: Option<Vec<String>>,
}

/// What the watched table's part of the WAL holds, in order.
#[derive(Debug, Clone)]
pub(super) enum Event {
    /// An insert, update or delete (a key-changing update is two: the delete of the old key, then the insert).
    Change(Decoded),
    /// A TRUNCATE of the table.
    Truncate { place: Place, xid: u32 },
    /// The end of a transaction that held at least one of the events above: its commit record starts at
    /// `commit` and ends at `end`.
    Commit { commit: Lsn, end: Lsn },
}

impl Event {
    /// Where the event sorts: a commit after every change of its transaction.
    pub fn place(&self) -> Place {
        match self {
            Event::Change(d) => d.place,
            Event::Truncate { place, .. } => *place,
            Event::Commit { commit, .. } => Place { commit: *commit, seq: u64::MAX },
        }
    }
}

struct Txn {
    commit: Lsn,
    commit_time: i64,
    xid: u32,
    seq: u64,
}

/// Follows one reader's messages (see the module docs).
pub(super) struct Decoder {
    shape: Arc<Shape>,
    delete_item: DeleteItem,
    /// Build the values (a fetch) or only place and date (status).
    values: bool,
    txn: Option<Txn>,
    relation: Option<Relation>,
    /// How the relation's `Item`s are built in the handler, when they can be.
    plan: Option<Plan>,
    /// The table's columns as the last Relation message described them, to notice a schema change.
    pub columns: Option<Vec<(String, u32)>>,
    /// A Relation message showed columns the shape does not have: the catalog must be read again.
    pub shape_changed: bool,
    /// The end of the last commit record read, of any transaction.
    pub last_end: Lsn,
    table: String,
}

impl Decoder {
    pub fn new(
        shape: Arc<Shape>,
        delete_item: DeleteItem,
        values: bool,
        columns: Option<Vec<(String, u32)>>,
        table: String,
    ) -> Self {
        Self {
            shape,
            delete_item,
            values,
            txn: None,
            relation: None,
            plan: None,
            columns,
            shape_changed: false,
            last_end: Lsn(0),
            table,
        }
    }

    /// The commit LSN of the transaction being read: every transaction that commits before it was read whole.
    pub fn open(&self) -> Option<Lsn> {
        self.txn.as_ref().map(|t| t.commit)
    }

    /// Decodes one message (written at `lsn`), appending what it means for the table to `out`.
    pub fn feed(&mut self, lsn: Lsn, data: &[u8], out: &mut Vec<Event>) -> Result<(), SourceError> {
        let message =
            pgoutput::decode(data).map_err(|e| SourceError::Invalid(format!("{e} at LSN {lsn}; please report it")))?;
        let shape = self.shape.clone();
        match message {
            Message::Begin { final_lsn, commit_time, xid } => {
                self.txn = Some(Txn { commit: final_lsn, commit_time, xid, seq: 0 });
            }
            Message::Commit { end_lsn, .. } => {
                self.last_end = self.last_end.max(end_lsn);
                if let Some(t) = self.txn.take().filter(|t| t.seq > 0) {
                    out.push(Event::Commit { commit: t.commit, end: end_lsn });
                }
            }
            Message::Relation(r) if r.id == shape.oid => {
                let columns: Vec<(String, u32)> = r.columns.iter().map(|c| (c.name.clone(), c.type_oid)).collect();
                if self.columns.as_ref().is_some_and(|known| *known != columns) {
                    tracing::warn!(
                        table = %self.table, lsn = %lsn,
                        "the columns of {} changed (from the WAL at {lsn}): {}; Item follows the new shape",
                        self.table,
                        columns.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
                    );
                    if columns.iter().map(|(n, _)| n).ne(shape.columns.iter()) {
                        self.shape_changed = true;
                    }
                }
                self.columns = Some(columns);
                if self.values {
                    self.plan = self.plan_for(&r);
                }
                self.relation = Some(r);
            }
            Message::Insert { relation: id, .. }
            | Message::Update { relation: id, .. }
            | Message::Delete { relation: id, .. }
                if id == shape.oid =>
            {
                let t = self.txn.as_mut().ok_or_else(|| undecodable("a change outside a transaction", lsn))?;
                let r = self.relation.as_ref().ok_or_else(|| undecodable("a change before its relation", lsn))?;
                // An update that moves a row to another key is two changes, a delete of the old key and an
                // insert of the new row (as change tracking reports it): a consumer keyed by the primary key
                // would otherwise keep the old row for ever.
                let parts = if key_changed(&message, r, &shape) { 2 } else { 1 };
                for part in 0..parts {
                    t.seq += 1;
                    let (operation, kind, values) = match (self.values, parts, part) {
                        (false, _, _) => (Operation::Insert, 0, Map::new()),
                        (true, 2, 0) => old_key(&message, r, &shape, self.delete_item),
                        (true, 2, _) => {
                            let (_, kind, values) = row_values(&message, r, &shape, self.delete_item);
                            (Operation::Insert, kind, values)
                        }
                        (true, _, _) => row_values(&message, r, &shape, self.delete_item),
                    };
                    let key = key_texts(&shape, &values);
                    let item = self.plan.as_ref().and_then(|p| item::build(p, kind, &values));
                    // What the statement would read is not needed once the Item is built.
                    let values = if item.is_some() { Map::new() } else { values };
                    out.push(Event::Change(Decoded {
                        place: Place { commit: t.commit, seq: t.seq },
                        operation,
                        kind,
                        values,
                        item,
                        lsn,
                        xid: t.xid,
                        commit_time: t.commit_time,
                        key,
                    }));
                }
            }
            Message::Truncate { relations, .. } if relations.contains(&shape.oid) => {
                let t = self.txn.as_mut().ok_or_else(|| undecodable("a truncate outside a transaction", lsn))?;
                t.seq += 1;
                out.push(Event::Truncate { place: Place { commit: t.commit, seq: t.seq }, xid: t.xid });
            }
            _ => {}
        }
        Ok(())
    }

    /// The relation's plan, saying (once per process and path) how its `Item`s are built.
    fn plan_for(&self, r: &Relation) -> Option<Plan> {
        let plan = self.shape.plan(r);
        let path = plan.as_ref().map(|_| ()).map_err(Clone::clone);
        let mut logged = self.shape.items_path.lock().unwrap_or_else(|e| e.into_inner());
        if logged.as_ref() != Some(&path) {
            let table = &self.table;
            match &path {
                Ok(()) => {
                    tracing::info!(table = %table, "the Items of {table} are built in the handler from the WAL's values")
                }
                Err(why) => {
                    tracing::info!(table = %table, "the Items of {table} are built by PostgreSQL, one statement per batch: {why}")
                }
            }
            *logged = Some(path);
        }
        plan.ok()
    }
}

/// An insert, update or delete as the operation, what `sql::items` should build, and the column values.
fn row_values(
    message: &Message,
    r: &Relation,
    shape: &Shape,
    delete_item: DeleteItem,
) -> (Operation, i32, Map<String, Value>) {
    match message {
        Message::Insert { new, .. } => (Operation::Insert, 0, tuple_object(new, r, shape, false)),
        Message::Update { new, old, .. } => {
            let mut values = tuple_object(new, r, shape, false);
            let left_out: Vec<usize> =
                new.iter().enumerate().filter(|(_, v)| **v == pgoutput::Value::Unchanged).map(|(i, _)| i).collect();
            let mut kind = 0;
            if !left_out.is_empty() {
                match old {
                    // REPLICA IDENTITY FULL: the old row carries the untouched values.
                    Some((OldKind::Row, old)) => {
                        let old = tuple_object(old, r, shape, false);
                        for i in left_out {
                            let name = &r.columns[i].name;
                            if let Some(v) = old.get(name) {
                                values.insert(name.clone(), v.clone());
                            }
                        }
                    }
                    _ => kind = 2,
                }
            }
            (Operation::Update, kind, values)
        }
        Message::Delete { old: (old_kind, old), .. } => match (delete_item, old_kind) {
            (DeleteItem::Row, OldKind::Row) => (Operation::Delete, 0, tuple_object(old, r, shape, false)),
            _ => (Operation::Delete, 1, tuple_object(old, r, shape, true)),
        },
        // Only inserts, updates and deletes reach here (see `feed`); anything else carries no row.
        _ => (Operation::Insert, 0, Map::new()),
    }
}

/// The delete half of an update that changed the key: the old key (or the whole old row, as a delete's `Item`
/// would be).
fn old_key(
    message: &Message,
    r: &Relation,
    shape: &Shape,
    delete_item: DeleteItem,
) -> (Operation, i32, Map<String, Value>) {
    match message {
        Message::Update { old: Some((OldKind::Row, old)), .. } if delete_item == DeleteItem::Row => {
            (Operation::Delete, 0, tuple_object(old, r, shape, false))
        }
        Message::Update { old: Some((_, old)), .. } => (Operation::Delete, 1, tuple_object(old, r, shape, true)),
        // Only key-changing updates reach here, and they carry the old tuple.
        _ => (Operation::Delete, 1, Map::new()),
    }
}

/// A tuple as the JSON object `sql::items` reads: column name to text (JSON for json columns) or null; a value
/// the WAL left out (an unchanged TOAST-ed value) is left out. `only_key`: the key columns only.
fn tuple_object(tuple: &[pgoutput::Value], r: &Relation, shape: &Shape, only_key: bool) -> Map<String, Value> {
    let mut m = Map::new();
    for (c, v) in r.columns.iter().zip(tuple) {
        if only_key && !shape.key.iter().any(|k| k.as_str() == c.name) {
            continue;
        }
        let value = match v {
            pgoutput::Value::Null => Value::Null,
            pgoutput::Value::Unchanged => continue,
            pgoutput::Value::Text(t) => Value::String(t.clone()),
        };
        m.insert(c.name.clone(), value);
    }
    m
}

/// The key's texts among a change's values, in key order; `None` when one is missing or null.
fn key_texts(shape: &Shape, values: &Map<String, Value>) -> Option<Vec<String>> {
    shape.key.iter().map(|k| values.get(k.as_str()).and_then(Value::as_str).map(str::to_string)).collect()
}

/// Whether an update moved its row to another key: the old tuple (sent when the replica identity changed or
/// is stored out of line, and always with REPLICA IDENTITY FULL) holds other key values than the new one.
fn key_changed(message: &Message, r: &Relation, shape: &Shape) -> bool {
    let Message::Update { old: Some((_, old)), new, .. } = message else { return false };
    r.columns.iter().enumerate().any(|(i, c)| {
        shape.key.iter().any(|k| k.as_str() == c.name)
            && matches!((old.get(i), new.get(i)), (Some(o @ pgoutput::Value::Text(_)), Some(n @ pgoutput::Value::Text(_))) if o != n)
    })
}

fn undecodable(what: &str, lsn: Lsn) -> SourceError {
    SourceError::Invalid(format!("pgoutput sent {what} at LSN {lsn}; please report it"))
}

/// pgoutput's commit time (microseconds since 2000-01-01 UTC) as RFC 3339.
pub(super) fn commit_time_text(micros: i64) -> String {
    let nanos = (i128::from(POSTGRES_EPOCH) * 1_000_000 + i128::from(micros)) * 1_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

/// Seconds since the Unix epoch of pgoutput's commit time.
pub(super) fn commit_unix_seconds(micros: i64) -> f64 {
    POSTGRES_EPOCH as f64 + micros as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_times_are_rfc3339_from_the_postgres_epoch() {
        assert_eq!(commit_time_text(0), "2000-01-01T00:00:00Z");
        assert_eq!(commit_time_text(1_500_000), "2000-01-01T00:00:01.5Z");
        assert_eq!(commit_unix_seconds(-POSTGRES_EPOCH * 1_000_000), 0.0);
    }
}
