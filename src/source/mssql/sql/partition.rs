//! The catalog read behind the rowversion source's `partitionColumn`: the computed column's definition, whether
//! it is persisted, and whether an index leads with (that column, the rowversion column), which is what keeps a
//! partition's fetch an index seek.

use super::{Params, Slot, Statement};

/// The computed column `@P2` of table `@P1`, and the usable indexes whose first two key columns are it and the
/// rowversion column `@P3`. Row shape: `DEF, IS_PERSISTED, INDEXED`; no row when `@P2` is not a computed column.
///
/// Only the `sys` catalog has a computed column's definition, so the `sys` names are written in lower case (a
/// case-sensitive database knows them only so; `golden::PARTITION_CATALOG_NAMES` lists them). An index counts when it is
/// a rowstore index (clustered or nonclustered), enabled and unfiltered: a filtered or disabled one cannot serve
/// every fetch.
pub fn partition_column() -> Statement {
    let mut p = Params::default();
    let table = p.p(Slot::Table);
    let column = p.p(Slot::PartitionColumnName);
    let version = p.p(Slot::VersionColumnName);
    let key_column = |alias: &str, ordinal: u8, column_id: &str| {
        format!(
            "EXISTS (SELECT 1 FROM sys.index_columns AS {alias} WHERE {alias}.object_id = I.object_id AND {alias}.index_id = I.index_id AND {alias}.key_ordinal = {ordinal} AND {alias}.column_id = {column_id})"
        )
    };
    let sql = format!(
        "SELECT CC.definition AS DEF, CAST(CC.is_persisted AS INT) AS IS_PERSISTED, \
CAST((SELECT COUNT(*) FROM sys.indexes AS I WHERE I.object_id = CC.object_id AND I.type IN (1, 2) AND I.is_disabled = 0 AND I.has_filter = 0 \
AND {} AND {}) AS INT) AS INDEXED \
FROM sys.computed_columns AS CC WHERE CC.object_id = OBJECT_ID({table}) AND CC.name = {column}",
        key_column("A", 1, "CC.column_id"),
        key_column("B", 2, &format!("COLUMNPROPERTY(CC.object_id, {version}, N'COLUMNID')")),
    );
    Statement { sql, slots: p.0 }
}
