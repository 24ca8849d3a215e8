//! The change-tracking source's statements: net changes after a position, counted, dated, and the walk of
//! current rows for a snapshot start.

use super::{
    isolation, json_object, keyset, After, ItemColumn, KeyColumn, Params, PartitionFilter, Slot, Statement, Upto,
};
use crate::ident::TableName;

/// The table's shape as the change-tracking source reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtShape {
    pub table: TableName,
    /// Primary key columns in key order (what `CHANGETABLE` returns).
    pub key: Vec<KeyColumn>,
    pub item: Vec<ItemColumn>,
    /// Read under SNAPSHOT isolation (the database allows it).
    pub snapshot: bool,
    pub skip_context: bool,
    /// Return creation version and changed-column mask for `Metadata`.
    pub metadata: bool,
    /// Read only the keys of one partition: the hash of the key columns `CHANGETABLE` returns (or, walking, the
    /// table's), modulo N. `CHANGETABLE(CHANGES ...)` cannot be sought by it: each partition reads every change
    /// of the version range and keeps its own.
    pub partitioned: bool,
}

/// Most arguments `CONCAT` takes (its documentation: "a maximum of 254 input values").
const CONCAT_MAX_ARGS: usize = 254;

/// `CONCAT(N'', parts...)` as text, nested when there are more parts than one `CONCAT` takes (a table of more
/// than 253 Item columns with `includeMetadata`): each inner `CONCAT` takes at most 253 parts after its `N''`.
fn concat(parts: &[String]) -> String {
    let per_call = CONCAT_MAX_ARGS - 1;
    if parts.len() <= per_call {
        return format!("CONCAT(N'', {})", parts.join(", "));
    }
    let chunks: Vec<String> = parts.chunks(per_call).map(concat).collect();
    concat(&chunks)
}

impl CtShape {
    fn key_params(&self, p: &mut Params, version: Slot, key: fn(usize) -> Slot, alias: &str) -> Vec<(String, String)> {
        let mut cols = vec![(format!("{alias}.SYS_CHANGE_VERSION"), p.p(version))];
        for (i, k) in self.key.iter().enumerate() {
            cols.push((format!("{alias}.{}", k.name.mssql()), k.ty.parse_text(&p.p(key(i)))));
        }
        cols
    }

    /// The predicates every read of changes starts with: committed up to `current`, and after `from`.
    fn after(&self, p: &mut Params, current: &str, from: After) -> Vec<String> {
        let mut preds = vec![format!("CT.SYS_CHANGE_VERSION <= {current}")];
        match from {
            After::Start => {}
            After::Version => preds.push(format!("CT.SYS_CHANGE_VERSION > {}", p.p(Slot::AfterVersion))),
            After::Key => preds
                .push(format!("({})", keyset(&self.key_params(p, Slot::AfterVersion, Slot::AfterKey, "CT"), false))),
        }
        preds
    }

    /// The order of changes: version, then key.
    fn change_order(&self) -> Vec<String> {
        std::iter::once("CT.SYS_CHANGE_VERSION".to_string())
            .chain(self.key.iter().map(|k| format!("CT.{}", k.name.mssql())))
            .collect()
    }

    /// This source's partition, over the key columns of `alias`.
    pub(super) fn partition_filter(&self, p: &mut Params, alias: &str) -> Option<String> {
        self.partitioned.then(|| PartitionFilter::Inline.predicate(p, alias, &self.key))
    }

    fn context_filter(&self, p: &mut Params) -> Option<String> {
        self.skip_context
            .then(|| format!("(CT.SYS_CHANGE_CONTEXT IS NULL OR CT.SYS_CHANGE_CONTEXT <> {})", p.p(Slot::Context)))
    }

    /// Net changes after a position, with the current and minimum valid versions read in the same statement.
    ///
    /// Row shape: `CUR, MINV, VER, OP, ITEM, CREATED, MASK, K1..Kn`. The outer query always returns one
    /// row (NULL change columns when there is no change), so an empty read still reports both versions.
    /// `OP` is 2 for a delete, and also when the row is gone from the table although the change says
    /// insert or update (possible only without SNAPSHOT: it was deleted between the two reads, and its
    /// delete follows).
    pub fn changes(&self, from: After, upto: Upto) -> Statement {
        let mut p = Params::default();
        let table = self.table.mssql();
        let table_param = p.p(Slot::Table);
        let limit = p.p(Slot::Limit);
        let base = p.p(Slot::Base);
        let first = self.key[0].name.mssql();
        let gone = format!("CT.SYS_CHANGE_OPERATION = N'D' OR T.{first} IS NULL");
        let op = format!("CAST(CASE WHEN {gone} THEN 2 WHEN CT.SYS_CHANGE_OPERATION = N'I' THEN 0 ELSE 1 END AS INT)");
        let item = format!(
            "CASE WHEN {gone} THEN {} ELSE {} END",
            json_object("CT", self.key.iter().map(|k| (&k.name, &k.ty))),
            json_object("T", self.item.iter().map(|c| (&c.name, &c.ty)))
        );
        let (created, mask) = if self.metadata {
            let bits: Vec<String> = self
                .item
                .iter()
                .map(|c| format!("CHANGE_TRACKING_IS_COLUMN_IN_MASK({}, CT.SYS_CHANGE_COLUMNS)", c.column_id))
                .collect();
            (
                "CT.SYS_CHANGE_CREATION_VERSION".to_string(),
                format!("CASE WHEN CT.SYS_CHANGE_COLUMNS IS NULL THEN NULL ELSE {} END", concat(&bits)),
            )
        } else {
            ("CAST(NULL AS BIGINT)".to_string(), "CAST(NULL AS NVARCHAR(MAX))".to_string())
        };
        let mut select = vec![
            "CT.SYS_CHANGE_VERSION AS VER".to_string(),
            format!("{op} AS OP"),
            format!("{item} AS ITEM"),
            format!("{created} AS CREATED"),
            format!("{mask} AS MASK"),
        ];
        for (i, k) in self.key.iter().enumerate() {
            select.push(format!("{} AS K{}", k.ty.to_text(&format!("CT.{}", k.name.mssql())), i + 1));
        }
        for (i, k) in self.key.iter().enumerate() {
            select.push(format!("CT.{} AS N{}", k.name.mssql(), i + 1));
        }
        let join: Vec<String> =
            self.key.iter().map(|k| format!("T.{} = CT.{}", k.name.mssql(), k.name.mssql())).collect();

        let mut preds = self.after(&mut p, "V.CUR", from);
        match upto {
            Upto::Current => {}
            Upto::Version => preds.push(format!("CT.SYS_CHANGE_VERSION <= {}", p.p(Slot::UptoVersion))),
            Upto::Key => preds
                .push(format!("({})", keyset(&self.key_params(&mut p, Slot::UptoVersion, Slot::UptoKey, "CT"), true))),
        }
        preds.extend(self.context_filter(&mut p));
        preds.extend(self.partition_filter(&mut p, "CT"));

        let order = self.change_order();
        let outer_cols: Vec<String> = ["V.CUR", "V.MINV", "C.VER", "C.OP", "C.ITEM", "C.CREATED", "C.MASK"]
            .iter()
            .map(|s| s.to_string())
            .chain((1..=self.key.len()).map(|i| format!("C.K{i}")))
            .collect();
        let outer_order: Vec<String> =
            std::iter::once("C.VER".to_string()).chain((1..=self.key.len()).map(|i| format!("C.N{i}"))).collect();
        let sql = format!(
            "{}SELECT {} FROM (SELECT CHANGE_TRACKING_CURRENT_VERSION() AS CUR, CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID({table_param})) AS MINV) AS V \
OUTER APPLY (SELECT TOP ({limit}) {} FROM CHANGETABLE(CHANGES {table}, {base}) AS CT LEFT JOIN {table} AS T ON {} WHERE {} ORDER BY {}) AS C \
ORDER BY {}",
            isolation(self.snapshot),
            outer_cols.join(", "),
            select.join(", "),
            join.join(" AND "),
            preds.join(" AND "),
            order.join(", "),
            outer_order.join(", ")
        );
        Statement { sql, slots: p.0 }
    }

    /// How many net changes wait after a position (same predicate as the fetch, counted).
    /// Row shape: `MINV, PENDING`.
    pub fn pending(&self, from: After) -> Statement {
        let mut p = Params::default();
        let table = self.table.mssql();
        let table_param = p.p(Slot::Table);
        let base = p.p(Slot::Base);
        let mut preds = self.after(&mut p, "CHANGE_TRACKING_CURRENT_VERSION()", from);
        preds.extend(self.context_filter(&mut p));
        preds.extend(self.partition_filter(&mut p, "CT"));
        let sql = format!(
            "SELECT CHANGE_TRACKING_MIN_VALID_VERSION(OBJECT_ID({table_param})) AS MINV, COUNT_BIG(*) AS PENDING \
FROM CHANGETABLE(CHANGES {table}, {base}) AS CT WHERE {}",
            preds.join(" AND ")
        );
        Statement { sql, slots: p.0 }
    }

    /// The age of the first pending change after a position (the lag in status): its version is a
    /// `commit_ts` of `sys.dm_tran_commit_table`, whose `commit_time` says when it committed. Same predicate
    /// and order as the fetch, first row only. Row shape: `VER, AGE_S, SERVER_STATE`; no row when nothing
    /// waits, and a NULL `AGE_S` when the view does not show that version: cleanup removed it, or the login
    /// lacks VIEW SERVER STATE (`SERVER_STATE` 0), without which the view shows a commit only after the next
    /// checkpoint (its documentation says so). Reading the view at all needs VIEW DATABASE STATE.
    ///
    /// The view's names must be lower case (a case-sensitive database knows them only so); they come last, in
    /// an `OUTER APPLY` after every bound parameter, so the upper-case part a mock can match holds the whole
    /// predicate. `commit_time` is compared with `SYSUTCDATETIME()`: the view's documentation does not name
    /// its time zone; UTC is assumed (Azure SQL runs in UTC), and only a real server (tier 3) can confirm it.
    pub fn oldest(&self, from: After) -> Statement {
        let mut p = Params::default();
        let table = self.table.mssql();
        let base = p.p(Slot::Base);
        let mut preds = self.after(&mut p, "CHANGE_TRACKING_CURRENT_VERSION()", from);
        preds.extend(self.context_filter(&mut p));
        preds.extend(self.partition_filter(&mut p, "CT"));
        let order = self.change_order();
        let sql = format!(
            "SELECT C.VER, A.AGE_S, CAST(HAS_PERMS_BY_NAME(NULL, NULL, N'VIEW SERVER STATE') AS INT) AS SERVER_STATE FROM (SELECT TOP (1) CT.SYS_CHANGE_VERSION AS VER FROM CHANGETABLE(CHANGES {table}, {base}) AS CT \
WHERE {} ORDER BY {}) AS C \
OUTER APPLY (SELECT DATEDIFF(SECOND, TC.commit_time, SYSUTCDATETIME()) AS AGE_S FROM sys.dm_tran_commit_table AS TC WHERE TC.commit_ts = C.VER) AS A",
            preds.join(" AND "),
            order.join(", ")
        );
        Statement { sql, slots: p.0 }
    }

    /// The current rows in key order, for `startFrom: snapshot` and resync. Row shape: `OP, ITEM, K1..Kn`
    /// with `OP` always 0 (insert), as a first sync reports every existing row.
    pub fn walk(&self, after: bool, upto: bool) -> Statement {
        let mut p = Params::default();
        let limit = p.p(Slot::Limit);
        let cols = |p: &mut Params, key: fn(usize) -> Slot| -> Vec<(String, String)> {
            self.key
                .iter()
                .enumerate()
                .map(|(i, k)| (format!("T.{}", k.name.mssql()), k.ty.parse_text(&p.p(key(i)))))
                .collect()
        };
        let mut preds = Vec::new();
        if after {
            preds.push(format!("({})", keyset(&cols(&mut p, Slot::AfterKey), false)));
        }
        if upto {
            preds.push(format!("({})", keyset(&cols(&mut p, Slot::UptoKey), true)));
        }
        preds.extend(self.partition_filter(&mut p, "T"));
        let mut select = vec![
            "CAST(0 AS INT) AS OP".to_string(),
            format!("{} AS ITEM", json_object("T", self.item.iter().map(|c| (&c.name, &c.ty)))),
        ];
        for (i, k) in self.key.iter().enumerate() {
            select.push(format!("{} AS K{}", k.ty.to_text(&format!("T.{}", k.name.mssql())), i + 1));
        }
        let order: Vec<String> = self.key.iter().map(|k| format!("T.{}", k.name.mssql())).collect();
        let filter = if preds.is_empty() { String::new() } else { format!(" WHERE {}", preds.join(" AND ")) };
        let sql = format!(
            "{}SELECT TOP ({limit}) {} FROM {} AS T{filter} ORDER BY {}",
            isolation(self.snapshot),
            select.join(", "),
            self.table.mssql(),
            order.join(", ")
        );
        Statement { sql, slots: p.0 }
    }

    /// Rows the walk has not reached yet (status only). Row shape: `PENDING`.
    pub fn walk_pending(&self, after: bool) -> Statement {
        let mut p = Params::default();
        let mut preds = Vec::new();
        if after {
            let cols: Vec<(String, String)> = self
                .key
                .iter()
                .enumerate()
                .map(|(i, k)| (format!("T.{}", k.name.mssql()), k.ty.parse_text(&p.p(Slot::AfterKey(i)))))
                .collect();
            preds.push(format!("({})", keyset(&cols, false)));
        }
        preds.extend(self.partition_filter(&mut p, "T"));
        let filter = if preds.is_empty() { String::new() } else { format!(" WHERE {}", preds.join(" AND ")) };
        Statement {
            sql: format!("SELECT COUNT_BIG(*) AS PENDING FROM {} AS T{filter}", self.table.mssql()),
            slots: p.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The argument count of every `CONCAT(` call in `sql`.
    fn concat_arities(sql: &str) -> Vec<usize> {
        let mut out = Vec::new();
        for (start, _) in sql.match_indices("CONCAT(") {
            let (mut depth, mut args) = (0, 1);
            for c in sql[start + "CONCAT".len()..].chars() {
                match c {
                    '(' => depth += 1,
                    ')' if depth == 1 => break,
                    ')' => depth -= 1,
                    ',' if depth == 1 => args += 1,
                    _ => {}
                }
            }
            out.push(args);
        }
        out
    }

    #[test]
    fn the_changed_column_mask_of_a_wide_table_fits_concats_argument_limit() {
        // Issue 15, defect 9: CONCAT(N'', mask1..maskN) failed for more than 253 Item columns.
        let parts: Vec<String> = (1..=600).map(|i| format!("M{i}")).collect();
        let sql = concat(&parts);
        let arities = concat_arities(&sql);
        assert!(arities.iter().all(|n| *n <= CONCAT_MAX_ARGS), "{arities:?}");
        assert_eq!(arities, vec![4, 254, 254, 95], "one outer CONCAT over three chunks");
        let order: Vec<&str> = sql.split(|c: char| !c.is_ascii_alphanumeric()).filter(|w| w.starts_with('M')).collect();
        assert_eq!(order, parts.iter().map(String::as_str).collect::<Vec<_>>(), "the mask keeps column order");
        assert_eq!(concat(&parts[..253]), format!("CONCAT(N'', {})", parts[..253].join(", ")), "253 stay one call");
    }
}
