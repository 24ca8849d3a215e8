//! What a partition's fetch needs from its index, told from the plan and the catalog together.
//!
//! At first use each partition asks the planner how its fetch runs twice: with sequential scans discouraged (does
//! any index serve?) and as the fetch really runs (is it used?). A range scan of an index led by the partition
//! expression both times needs nothing. Otherwise the catalog (`pg_index`, `pg_stats`) says why, and the handler
//! warns once per table and partition count with the one fix that applies:
//! - no index is led by the partition expression, the cursor and the key: the `CREATE INDEX` statement;
//! - there is one but it is invalid (a `CREATE INDEX CONCURRENTLY` that failed or was cancelled: PostgreSQL keeps
//!   it up to date and never reads it): `DROP INDEX CONCURRENTLY` it and create it again;
//! - there is a valid one and the planner does not use it: PostgreSQL has no statistics on the partition
//!   expression (an expression index gets them only from `ANALYZE`, and autovacuum analyzes a table only after
//!   enough of its rows changed, so a freshly loaded table has none), guesses that a partition holds a handful of
//!   rows, and reads the rest of the partition to sort it. The advice is `ANALYZE <table>`, which the handler
//!   does not run itself: on a big table when to read the sample is the operator's call. With statistics, the
//!   planner passing over the index is its informed choice (a small table), and nothing is said.

use super::connection::{db_error, Connection};
use super::sql::{PlanCheck, Shape};
use crate::config::Partition;
use crate::source::SourceError;

/// Every index of a table (`$1`, its oid): its name, whether it is valid, its key columns as PostgreSQL prints
/// them, and whether `pg_stats` holds statistics for it (its expressions').
pub(super) const INDEXES: &str = "SELECT c.oid::regclass::text, i.indisvalid, \
     array(SELECT pg_get_indexdef(i.indexrelid, k, true) FROM generate_series(1, i.indnkeyatts::int) AS k ORDER BY k), \
     EXISTS (SELECT 1 FROM pg_stats s WHERE s.schemaname = n.nspname AND s.tablename = c.relname) \
     FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_namespace n ON n.oid = c.relnamespace \
     WHERE i.indrelid = $1 ORDER BY i.indisvalid DESC, c.oid";

/// One index as [`INDEXES`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Index {
    pub name: String,
    pub valid: bool,
    pub columns: Vec<String>,
    pub statistics: bool,
}

/// What the catalog says about the partition index, when the plan does not use it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Found {
    Missing,
    Invalid(String),
    /// Valid, and unused by the plan: with or without statistics on its expression.
    Unused {
        name: String,
        statistics: bool,
    },
}

/// A definition with everything PostgreSQL adds when it prints one taken out (quotes, parentheses, blanks, the
/// casts of literals and keys to text and bigint), so the statement the handler recommends and the index
/// PostgreSQL prints compare equal.
fn normalize(definition: &str) -> String {
    let kept: String =
        definition.chars().filter(|c| !matches!(c, '"' | '\'' | '(' | ')') && !c.is_whitespace()).collect();
    kept.replace("::bigint", "").replace("::text", "")
}

/// The partition index among `indexes` (a valid one first), for `count` partitions of `shape`'s table: led by
/// the partition expression, then the cursor and the key.
pub(super) fn find(indexes: &[Index], shape: &Shape, count: u32) -> Found {
    let wanted: Vec<String> = std::iter::once(shape.partition_expression(count, ""))
        .chain(std::iter::once(shape.cursor.pg()))
        .chain(shape.key.iter().map(|(k, _)| k.pg()))
        .map(|c| normalize(&c))
        .collect();
    let serves = |ix: &&Index| {
        ix.columns.len() >= wanted.len()
            && ix.columns.iter().map(|c| normalize(c)).take(wanted.len()).eq(wanted.iter().cloned())
    };
    match indexes.iter().find(serves) {
        None => Found::Missing,
        Some(ix) if !ix.valid => Found::Invalid(ix.name.clone()),
        Some(ix) => Found::Unused { name: ix.name.clone(), statistics: ix.statistics },
    }
}

/// The warning for `found`: what is wrong, what a fetch costs meanwhile (`cost`), and the fix.
pub(super) fn advice(found: &Found, p: Partition, table: &str, ddl: &str, cost: &str) -> String {
    match found {
        Found::Missing => format!(
            "no index serves the fetch of {p} of {table}: without one each fetch {cost}. Create it (once for all {} partitions): {ddl}",
            p.count
        ),
        Found::Invalid(name) => format!(
            "the partition index {name} of {table} is invalid (a CREATE INDEX CONCURRENTLY that failed or was cancelled): PostgreSQL keeps it up to date but never reads it, so each fetch of {p} {cost}. Drop it and create it again: DROP INDEX CONCURRENTLY {name}; {ddl}"
        ),
        Found::Unused { name, statistics } => format!(
            "the partition index {name} of {table} exists but PostgreSQL does not use it for the fetch of {p}: {}, so it guesses a partition holds a handful of rows, and each fetch {cost}. Run ANALYZE {table} (the handler does not: on a big table when to read the sample is yours to decide; autovacuum does it too, once enough rows changed)",
            if *statistics {
                "its statistics on the partition expression are out of date"
            } else {
                "it has no statistics on the partition expression (only ANALYZE gathers them)"
            }
        ),
    }
}

/// Tables and partition counts whose partition index was already reported by this process.
static WARNED: std::sync::Mutex<std::collections::BTreeSet<(String, u32)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Checks the plan of partition `p`'s first fetch and, when it is not a range scan, warns once per process
/// for the table and partition count (every partition needs the same index) with the fix the catalog points
/// to (the module docs). `oid`: the table's.
pub(super) async fn check_partition_index(
    conn: &Connection,
    shape: &Shape,
    (p, oid): (Partition, u32),
    keyset_indexed: bool,
) -> Result<(), SourceError> {
    let table = conn.table();
    let limit = 100i64;
    let read = |plan: serde_json::Value| PlanCheck::read(&plan);
    let Some(forced) = read(conn.explain(&shape.fetch_first(), &[&limit], true).await?) else {
        tracing::debug!(table = %table, "the plan of a partition's fetch could not be read; index not checked");
        return Ok(());
    };
    // An index serves when the planner is made to use one; whether it does on its own is the real plan's.
    let chosen = forced.is_range_scan()
        && read(conn.explain(&shape.fetch_first(), &[&limit], false).await?).is_none_or(|c| c.is_range_scan());
    if chosen {
        return Ok(());
    }
    let client = conn.client().await?;
    let indexes: Vec<Index> = client
        .query(INDEXES, &[&oid])
        .await
        .map_err(|e| db_error(e, table))?
        .iter()
        // An index dropped while this reads (`DROP INDEX CONCURRENTLY`, which this very advice may name) has
        // no definition left (NULL columns): it is passed over, not a panic.
        .filter_map(|r| {
            Some(Index {
                name: r.try_get(0).ok()?,
                valid: r.try_get(1).ok()?,
                columns: r.try_get(2).ok()?,
                statistics: r.try_get(3).ok()?,
            })
        })
        .collect();
    let found = find(&indexes, shape, p.count.get());
    // The planner passing over a usable index with statistics in hand is its informed choice (a small table).
    if forced.is_range_scan() && !matches!(found, Found::Unused { statistics: false, .. }) {
        return Ok(());
    }
    let first =
        WARNED.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert((table.to_string(), p.count.get()));
    if !first {
        return Ok(());
    }
    let cost = if keyset_indexed {
        format!(
            "walks the ({}, key) index and reads and discards the other partitions' rows: about {} times the rows of a batch per fetch",
            shape.cursor, p.count
        )
    } else {
        "reads every row of the table and sorts this partition's rows, every batch".to_string()
    };
    let ddl = shape.partition_index_ddl().unwrap_or_default();
    tracing::warn!(table = %table, partitions = p.count.get(), "{}", advice(&found, p, &table.to_string(), &ddl, &cost));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::sql::tests::shape;
    use super::super::sql::Guard;
    use super::*;
    use std::num::NonZeroU32;

    fn partitioned() -> Shape {
        let p = Partition::new(3, NonZeroU32::new(16).expect("16"));
        Shape { partition: p, ..shape(Guard::Xid8) }
    }

    fn index(name: &str, valid: bool, columns: &[&str]) -> Index {
        Index { name: name.into(), valid, columns: columns.iter().map(|c| c.to_string()).collect(), statistics: false }
    }

    /// The partition index as PostgreSQL 16 prints its columns.
    const PRINTED: &str = "((hashtextextended(id::text, 0::bigint) & '9223372036854775807'::bigint) % 16::bigint)";

    #[test]
    fn the_index_is_found_by_its_expression_and_columns_as_postgresql_prints_them() {
        let shape = partitioned();
        let pkey = index("orders_pkey", true, &["id"]);
        let keyset = index("orders_version_id", true, &["version", "id"]);
        assert_eq!(find(&[pkey.clone(), keyset.clone()], &shape, 16), Found::Missing);
        // an index for another count does not serve
        let eight = index("orders_expr_idx", true, &[&PRINTED.replace("% 16", "% 8"), "version", "id"]);
        assert_eq!(find(&[eight], &shape, 16), Found::Missing);
        let ours = index("orders_expr_version_id_idx", true, &[PRINTED, "version", "id"]);
        assert_eq!(
            find(&[pkey, keyset, ours.clone()], &shape, 16),
            Found::Unused { name: "orders_expr_version_id_idx".into(), statistics: false }
        );
        let failed = Index { valid: false, ..ours };
        assert_eq!(find(&[failed], &shape, 16), Found::Invalid("orders_expr_version_id_idx".into()));
    }

    #[test]
    fn each_finding_says_its_one_fix() {
        let p = Partition::new(3, NonZeroU32::new(16).expect("16")).expect("a partition");
        let (table, ddl, cost) = ("public.orders", "CREATE INDEX CONCURRENTLY ON …", "reads the rest");
        assert!(advice(&Found::Missing, p, table, ddl, cost).contains("Create it (once for all 16 partitions): CREATE"));
        let invalid = advice(&Found::Invalid("ix".into()), p, table, ddl, cost);
        assert!(
            invalid.contains("is invalid") && invalid.contains("DROP INDEX CONCURRENTLY ix; CREATE INDEX"),
            "{invalid}"
        );
        let unused = advice(&Found::Unused { name: "ix".into(), statistics: false }, p, table, ddl, cost);
        assert!(
            unused.contains("no statistics on the partition expression")
                && unused.contains("Run ANALYZE public.orders"),
            "{unused}"
        );
        assert!(!unused.contains("CREATE INDEX"), "{unused}");
    }
}
