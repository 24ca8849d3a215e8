//! The rowversion source's statements: rows after a position below `MIN_ACTIVE_ROWVERSION()`, captured before
//! the rows are read.

use super::{isolation, json_object, keyset, After, ItemColumn, KeyColumn, Params, PartitionFilter, Slot, Statement};
use crate::ident::{Ident, TableName};

/// How the rowversion source labels Inserts when it has an `insertedColumn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Labels {
    /// Every row is new: the table's first backlog, from before everything.
    All,
    /// Rows whose inserted value is at least the backlog's base rowversion.
    Since,
}

/// The table's shape as the rowversion source reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RvShape {
    pub table: TableName,
    pub key: Vec<KeyColumn>,
    /// The `rowversion` column.
    pub version: Ident,
    pub item: Vec<ItemColumn>,
    /// Soft-delete column, and whether it is `bit` (`= 1`) or anything else (`IS NOT NULL`).
    pub soft_delete: Option<(Ident, bool)>,
    /// A column set once at insert to a value comparable with the rowversion (`binary(8)` or `bigint`).
    pub inserted: Option<(Ident, bool)>,
    pub snapshot: bool,
    /// The one partition of keys this source reads, and how (`None`: every key).
    pub partition: Option<PartitionFilter>,
}

impl RvShape {
    pub(super) fn rv_param(p: &mut Params, slot: Slot) -> String {
        format!("CAST({} AS BINARY(8))", p.p(slot))
    }

    fn key_params(&self, p: &mut Params, version: Slot, key: fn(usize) -> Slot) -> Vec<(String, String)> {
        let mut cols = vec![(format!("T.{}", self.version.mssql()), Self::rv_param(p, version))];
        for (i, k) in self.key.iter().enumerate() {
            cols.push((format!("T.{}", k.name.mssql()), k.ty.parse_text(&p.p(key(i)))));
        }
        cols
    }

    /// Rows changed after a position and below `MIN_ACTIVE_ROWVERSION()`, of this source's partition when it has
    /// one (with a `partitionColumn` and an index on (it, rowversion, key), a seek on the partition and a range
    /// on the rowversion, in the index's order): a row is read only once no
    /// transaction that could still commit a smaller rowversion is open, so a late commit is not skipped.
    /// Row shape: `RV, OP, ITEM, K1..Kn`. `upto` bounds a re-read of a batch.
    ///
    /// The bound is captured in `@BOUND` by a statement of its own before the read: evaluated inside the
    /// read, it could be taken after the read's snapshot began (SNAPSHOT, or READ COMMITTED SNAPSHOT, on by
    /// default in Azure SQL), so a transaction that committed in between would be below the bound yet
    /// invisible to the read, and skipped for good. Captured first, every rowversion below it belongs to a
    /// transaction that committed before the read's snapshot began (in autocommit each statement is its own
    /// transaction, so the snapshot begins with the SELECT).
    ///
    /// `labels` says how `insertedColumn` marks Inserts: every row (`All`, the first backlog of a table), or
    /// rows created at or after the base rowversion of this backlog (`Since`, bound to `Slot::Base`). The base
    /// stays fixed while a backlog is paged: a row inserted right after the last delivered one carries
    /// that row's rowversion in a `DEFAULT @@DBTS` column (`@@DBTS` is the last rowversion used), so a
    /// comparison with the moving position would call it an Update.
    pub fn changes(&self, from: After, upto: bool, labels: Labels) -> Statement {
        let mut p = Params::default();
        let limit = p.p(Slot::Limit);
        let rv = format!("T.{}", self.version.mssql());
        let mut preds = vec![format!("{rv} < @BOUND")];
        preds.extend(self.partition.as_ref().map(|f| f.predicate(&mut p, "T", &self.key)));
        match from {
            After::Start => {}
            After::Version => preds.push(format!("{rv} > {}", Self::rv_param(&mut p, Slot::AfterVersion))),
            After::Key => {
                preds.push(format!("({})", keyset(&self.key_params(&mut p, Slot::AfterVersion, Slot::AfterKey), false)))
            }
        }
        if upto {
            preds.push(format!("({})", keyset(&self.key_params(&mut p, Slot::UptoVersion, Slot::UptoKey), true)));
        }
        let deleted = self.soft_delete.as_ref().map(|(c, is_bit)| {
            if *is_bit {
                format!("T.{} = 1", c.mssql())
            } else {
                format!("T.{} IS NOT NULL", c.mssql())
            }
        });
        let inserted = match (&self.inserted, labels) {
            (Some(_), Labels::All) => Some("1 = 1".to_string()),
            (Some((c, is_binary)), Labels::Since) => {
                let base = if *is_binary { Self::rv_param(&mut p, Slot::Base) } else { p.p(Slot::Base) };
                Some(format!("T.{} >= {base}", c.mssql()))
            }
            (None, _) => None,
        };
        let op = match (&deleted, &inserted) {
            (Some(d), Some(i)) => format!("CASE WHEN {d} THEN 2 WHEN {i} THEN 0 ELSE 1 END"),
            (Some(d), None) => format!("CASE WHEN {d} THEN 2 ELSE 1 END"),
            (None, Some(i)) => format!("CASE WHEN {i} THEN 0 ELSE 1 END"),
            (None, None) => "1".to_string(),
        };
        let row = json_object("T", self.item.iter().map(|c| (&c.name, &c.ty)));
        let item = match &deleted {
            Some(d) => {
                format!(
                    "CASE WHEN {d} THEN {} ELSE {row} END",
                    json_object("T", self.key.iter().map(|k| (&k.name, &k.ty)))
                )
            }
            None => row,
        };
        let mut select =
            vec![format!("CAST({rv} AS BIGINT) AS RV"), format!("CAST({op} AS INT) AS OP"), format!("{item} AS ITEM")];
        for (i, k) in self.key.iter().enumerate() {
            select.push(format!("{} AS K{}", k.ty.to_text(&format!("T.{}", k.name.mssql())), i + 1));
        }
        let order: Vec<String> =
            std::iter::once(rv.clone()).chain(self.key.iter().map(|k| format!("T.{}", k.name.mssql()))).collect();
        let sql = format!(
            "DECLARE @BOUND BINARY(8) = MIN_ACTIVE_ROWVERSION(); {}SELECT TOP ({limit}) {} FROM {} AS T WHERE {} ORDER BY {}",
            isolation(self.snapshot),
            select.join(", "),
            self.table.mssql(),
            preds.join(" AND "),
            order.join(", ")
        );
        Statement { sql, slots: p.0 }
    }

    /// Readable rows after a position (status), of this source's partition. Row shape: `PENDING`.
    pub fn pending(&self, from: After) -> Statement {
        let mut p = Params::default();
        let rv = format!("T.{}", self.version.mssql());
        let mut preds = vec![format!("{rv} < MIN_ACTIVE_ROWVERSION()")];
        preds.extend(self.partition.as_ref().map(|f| f.predicate(&mut p, "T", &self.key)));
        match from {
            After::Start => {}
            After::Version => preds.push(format!("{rv} > {}", Self::rv_param(&mut p, Slot::AfterVersion))),
            After::Key => {
                preds.push(format!("({})", keyset(&self.key_params(&mut p, Slot::AfterVersion, Slot::AfterKey), false)))
            }
        }
        Statement {
            sql: format!(
                "SELECT COUNT_BIG(*) AS PENDING FROM {} AS T WHERE {}",
                self.table.mssql(),
                preds.join(" AND ")
            ),
            slots: p.0,
        }
    }

    /// The newest readable rowversion (for `startFrom: now`): everything below the oldest open transaction.
    /// Row shape: `RV`.
    pub fn newest() -> Statement {
        Statement { sql: "SELECT CAST(MIN_ACTIVE_ROWVERSION() AS BIGINT) - 1 AS RV".into(), slots: vec![] }
    }
}
