//! The backfill statements of both SQL Server sources (docs/operations.md, "Backfill"): one chunk of the
//! table's rows in primary-key order after a key, and the count taken as the estimate when a backfill starts.
//! Why each source's bound keeps chunks and live changes consistent is in docs/architecture.md, "Backfill".
//!
//! Both read the table itself (alias `T`) with `TOP (@P1)` and `ORDER BY` the key: a seek on the clustered
//! primary key, one statement per chunk, so no transaction or snapshot outlives it. Row shape of a chunk:
//! `ITEM, K1..Kn` (the `Item` JSON, then the key's texts, the chunk's last position).

use super::{
    isolation, json_object, keyset, CtShape, KeyColumn, MssqlFilter, Params, PartitionFilter, RvShape, Slot, Statement,
};
use crate::source::ChunkRequest;

/// The key-walk predicates over `T` of the chunk `r` asks for (`None`: no chunk, the whole walk, as an estimate
/// counts it): after a key when `r.after` holds one (`Slot::AfterKey`; `Null`: from the first key), and up to and
/// including a key when `r.upto` holds one (`Slot::UptoKey`: re-reading a chunk delivered before), as the walk's
/// keyset. Which key the slots take is `backfill::bind`'s.
fn walk(p: &mut Params, key: &[KeyColumn], r: Option<&ChunkRequest<'_>>) -> Vec<String> {
    let after = r.is_some_and(|r| !r.after.is_null());
    let upto = r.and_then(|r| r.upto).is_some_and(|u| !u.is_null());
    let cols = |p: &mut Params, slot: fn(usize) -> Slot| -> Vec<(String, String)> {
        key.iter().enumerate().map(|(i, k)| (format!("T.{}", k.name.mssql()), k.ty.parse_text(&p.p(slot(i))))).collect()
    };
    let mut preds = Vec::new();
    if after {
        preds.push(format!("({})", keyset(&cols(p, Slot::AfterKey), false)));
    }
    if upto {
        preds.push(format!("({})", keyset(&cols(p, Slot::UptoKey), true)));
    }
    preds
}

/// `SELECT TOP (@P1) ITEM, K1..Kn FROM <from> WHERE <preds> ORDER BY <key>`.
fn chunk(snapshot: bool, limit: &str, item: String, key: &[KeyColumn], from: String, preds: &[String]) -> String {
    let mut select = vec![format!("{item} AS ITEM")];
    for (i, k) in key.iter().enumerate() {
        select.push(format!("{} AS K{}", k.ty.to_text(&format!("T.{}", k.name.mssql())), i + 1));
    }
    let order: Vec<String> = key.iter().map(|k| format!("T.{}", k.name.mssql())).collect();
    let filter = if preds.is_empty() { String::new() } else { format!(" WHERE {}", preds.join(" AND ")) };
    format!(
        "{}SELECT TOP ({limit}) {} FROM {from}{filter} ORDER BY {}",
        isolation(snapshot),
        select.join(", "),
        order.join(", ")
    )
}

fn count(table: String, preds: &[String]) -> String {
    let filter = if preds.is_empty() { String::new() } else { format!(" WHERE {}", preds.join(" AND ")) };
    format!("SELECT COUNT_BIG(*) AS ESTIMATE FROM {table} AS T{filter}")
}

impl RvShape {
    /// The conditions every row of a rowversion backfill meets: its rowversion at most the bound (the
    /// checkpoint's, `Slot::Bound`), of this source's partition, not soft-deleted, matching the filter.
    ///
    /// No `MIN_ACTIVE_ROWVERSION()` here: the bound was below it when the live path read it, so every rowversion
    /// at or below the bound belongs to a transaction that had ended then (docs/architecture.md, "Backfill").
    fn backfill_predicates(
        &self,
        p: &mut Params,
        r: Option<&ChunkRequest<'_>>,
        filter: Option<&MssqlFilter>,
    ) -> Vec<String> {
        let mut preds = vec![format!("T.{} <= {}", self.version.mssql(), Self::rv_param(p, Slot::Bound))];
        preds.extend(walk(p, &self.key, r));
        preds.extend(self.partition.as_ref().map(|f: &PartitionFilter| f.predicate(p, "T", &self.key)));
        preds.extend(self.soft_delete.as_ref().map(|(c, is_bit)| {
            if *is_bit {
                format!("(T.{0} IS NULL OR T.{0} = 0)", c.mssql())
            } else {
                format!("T.{} IS NULL", c.mssql())
            }
        }));
        preds.extend(filter.map(|f| f.render(p, "T")));
        preds
    }

    /// One chunk of a backfill, in key order. Row shape: `ITEM, K1..Kn`. Read under the isolation live reads
    /// use: either is sound here (a row the chunk may read was committed before the backfill started, and one
    /// written since has a rowversion above the bound, whichever version of it a statement sees).
    pub fn backfill_chunk(&self, r: &ChunkRequest<'_>, filter: Option<&MssqlFilter>) -> Statement {
        let mut p = Params::default();
        let limit = p.p(Slot::Limit);
        let preds = self.backfill_predicates(&mut p, Some(r), filter);
        let item = json_object("T", self.item.iter().map(|c| (&c.name, &c.ty)));
        let sql = chunk(self.snapshot, &limit, item, &self.key, format!("{} AS T", self.table.mssql()), &preds);
        Statement { sql, slots: p.0 }
    }

    /// How many rows the backfill will deliver, counted when it starts (its estimate). Row shape: `ESTIMATE`.
    pub fn backfill_estimate(&self, filter: Option<&MssqlFilter>) -> Statement {
        let mut p = Params::default();
        let preds = self.backfill_predicates(&mut p, None, filter);
        Statement { sql: count(self.table.mssql(), &preds), slots: p.0 }
    }
}

impl CtShape {
    /// One chunk of a backfill, in key order: the table's rows with their change-tracking row version
    /// (`CHANGETABLE(VERSION ...)`), keeping only rows whose version is NULL (no change tracked, or its record
    /// cleaned up) or at most the bound (the checkpoint's version, `Slot::Bound`): a row changed since is the live
    /// path's, which delivers it with its newest values. Row shape: `ITEM, K1..Kn`.
    ///
    /// `OUTER APPLY`, not the documentation's `CROSS APPLY`: a row for which the function returned no row at all
    /// would otherwise be dropped, while NULL is exactly "nothing tracked since", which the chunk must keep.
    pub fn backfill_chunk(&self, r: &ChunkRequest<'_>, filter: Option<&MssqlFilter>) -> Statement {
        let mut p = Params::default();
        let limit = p.p(Slot::Limit);
        let mut preds =
            vec![format!("(CT.SYS_CHANGE_VERSION IS NULL OR CT.SYS_CHANGE_VERSION <= {})", p.p(Slot::Bound))];
        preds.extend(walk(&mut p, &self.key, Some(r)));
        preds.extend(self.backfill_filters(&mut p, filter));
        let table = self.table.mssql();
        let names: Vec<String> = self.key.iter().map(|k| k.name.mssql()).collect();
        let values: Vec<String> = self.key.iter().map(|k| format!("T.{}", k.name.mssql())).collect();
        let from = format!(
            "{table} AS T OUTER APPLY CHANGETABLE(VERSION {table}, ({}), ({})) AS CT",
            names.join(", "),
            values.join(", ")
        );
        let item = json_object("T", self.item.iter().map(|c| (&c.name, &c.ty)));
        let sql = chunk(self.snapshot, &limit, item, &self.key, from, &preds);
        Statement { sql, slots: p.0 }
    }

    /// The estimate: the table's rows of this partition matching the filter, counted without looking up each
    /// row's version (that lookup is a join per row; the estimate is a count at the start of a backfill whose
    /// table changes meanwhile anyway, and the rows changed since the checkpoint are the few the live path has
    /// not delivered yet). Row shape: `ESTIMATE`.
    pub fn backfill_estimate(&self, filter: Option<&MssqlFilter>) -> Statement {
        let mut p = Params::default();
        let preds = self.backfill_filters(&mut p, filter);
        Statement { sql: count(self.table.mssql(), &preds), slots: p.0 }
    }

    fn backfill_filters(&self, p: &mut Params, filter: Option<&MssqlFilter>) -> Vec<String> {
        let mut preds: Vec<String> = self.partition_filter(p, "T").into_iter().collect();
        preds.extend(filter.map(|f| f.render(p, "T")));
        preds
    }
}
