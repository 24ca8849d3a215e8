//! The backfill statements' golden cases (`super::all` includes them): every chunk and estimate with and without a
//! filter, with a one-column and a composite key, and for a partition; and what a chunk must say.

use super::super::*;
use super::{items, items_partition_column, items_with_options, order_lines, orders, orders_partitioned};
use crate::source::{ChunkRequest, Position};

/// A backfill filter checked against `shape_columns` (name, type), as the sources check it at the start.
fn filter(text: &str, columns: &[ItemColumn]) -> MssqlFilter {
    let columns: Vec<(String, SqlType)> = columns.iter().map(|c| (c.name.as_str().to_string(), c.ty.clone())).collect();
    MssqlFilter::new(&crate::source::Filter::parse(text).expect("parses"), "t", &columns).expect("valid filter")
}

/// The filters the wire tests' backfills send, per table.
const ORDERS_FILTER: &str = "NAME = 'Zoë' AND PRICE >= 10.5";
const ORDER_LINES_FILTER: &str = "Qty > 2 OR \"Line №\" IN ('a', 'b')";
const ITEMS_FILTER: &str = "TITLE <> 'draft' AND ID IN (1, 2, 3)";
const ITEM_LOG_FILTER: &str = "Body IS NOT NULL AND At >= '2026-01-01' AND Tenant = 'a'";

/// The backfill statements, by golden file name: every chunk and estimate with and without a filter, with a
/// one-column and a composite key, and for a partition.
pub(super) fn statements() -> Vec<(&'static str, Statement)> {
    let (o, l, r, ro) = (orders(), order_lines(), items(), items_with_options());
    let (fo, fl) = (filter(ORDERS_FILTER, &o.item), filter(ORDER_LINES_FILTER, &l.item));
    let (fr, fro) = (filter(ITEMS_FILTER, &r.item), filter(ITEM_LOG_FILTER, &ro.item));
    let (bound, key, null) = (Position::from(1), serde_json::json!(["1"]), Position::Null);
    let (first, after, range) = requests(&bound, &key, &null);
    let (first, after, range) = (&first, &after, &range);
    vec![
        ("ct_backfill_first", o.backfill_chunk(first, None)),
        ("ct_backfill_after", o.backfill_chunk(after, None)),
        ("ct_backfill_range", o.backfill_chunk(range, None)),
        ("ct_backfill_estimate", o.backfill_estimate(None)),
        ("ct_backfill_filter_first", o.backfill_chunk(first, Some(&fo))),
        ("ct_backfill_filter_after", o.backfill_chunk(after, Some(&fo))),
        ("ct_backfill_filter_estimate", o.backfill_estimate(Some(&fo))),
        ("ct_options_backfill_first", l.backfill_chunk(first, None)),
        ("ct_options_backfill_estimate", l.backfill_estimate(None)),
        ("ct_options_backfill_filter_range", l.backfill_chunk(range, Some(&fl))),
        ("ct_options_backfill_filter_estimate", l.backfill_estimate(Some(&fl))),
        ("ct_part_backfill_first", orders_partitioned().backfill_chunk(first, None)),
        ("ct_part_backfill_estimate", orders_partitioned().backfill_estimate(None)),
        ("rv_backfill_first", r.backfill_chunk(first, None)),
        ("rv_backfill_after", r.backfill_chunk(after, None)),
        ("rv_backfill_range", r.backfill_chunk(range, None)),
        ("rv_backfill_estimate", r.backfill_estimate(None)),
        ("rv_backfill_filter_after", r.backfill_chunk(after, Some(&fr))),
        ("rv_backfill_filter_estimate", r.backfill_estimate(Some(&fr))),
        ("rv_options_backfill_first", ro.backfill_chunk(first, None)),
        ("rv_options_backfill_estimate", ro.backfill_estimate(None)),
        ("rv_options_backfill_filter_range", ro.backfill_chunk(range, Some(&fro))),
        ("rv_options_backfill_filter_estimate", ro.backfill_estimate(Some(&fro))),
        ("rv_part_column_backfill_first", items_partition_column().backfill_chunk(first, None)),
        ("rv_part_column_backfill_estimate", items_partition_column().backfill_estimate(None)),
    ]
}

/// Chunk requests under `bound`: for the first chunk, for the one after `key`, and for a re-read of the range
/// after `key` up to it (the statement's text depends only on which of them a request holds).
fn requests<'a>(
    bound: &'a Position,
    key: &'a Position,
    null: &'a Position,
) -> (ChunkRequest<'a>, ChunkRequest<'a>, ChunkRequest<'a>) {
    let first = ChunkRequest { bound, after: null, upto: None, filter: None, limit: 10, live: null };
    (first, ChunkRequest { after: key, ..first }, ChunkRequest { after: key, upto: Some(key), ..first })
}

#[test]
fn a_backfill_chunk_walks_the_key_below_its_bound_and_binds_the_filter_last() {
    let (bound, key, null) = (Position::from(1), serde_json::json!(["1"]), Position::Null);
    let (_, after, range) = requests(&bound, &key, &null);
    let after = &after;
    let f = filter(ITEMS_FILTER, &items().item);
    let rv = items().backfill_chunk(after, Some(&f));
    assert_eq!(
        rv.sql,
        "SET TRANSACTION ISOLATION LEVEL SNAPSHOT; SELECT TOP (@P1) (SELECT T.[ID] AS [ID], T.[TITLE] AS [TITLE], T.[IS_DELETED] AS [IS_DELETED] \
FOR JSON PATH, INCLUDE_NULL_VALUES, WITHOUT_ARRAY_WRAPPER) AS ITEM, CONVERT(NVARCHAR(MAX), T.[ID]) AS K1 FROM [DBO].[ITEMS] AS T \
WHERE T.[RV] <= CAST(@P2 AS BINARY(8)) AND (T.[ID] > CONVERT(INT, @P3)) AND (T.[IS_DELETED] IS NULL OR T.[IS_DELETED] = 0) \
AND (T.[TITLE] <> CONVERT(NVARCHAR(MAX), @P4) AND T.[ID] IN (CONVERT(INT, @P5), CONVERT(INT, @P6), CONVERT(INT, @P7))) ORDER BY T.[ID]"
    );
    assert_eq!(
        rv.slots,
        [
            Slot::Limit,
            Slot::Bound,
            Slot::AfterKey(0),
            Slot::Filter(0),
            Slot::Filter(1),
            Slot::Filter(2),
            Slot::Filter(3)
        ]
    );
    assert!(!rv.sql.contains("MIN_ACTIVE_ROWVERSION"), "the bound is below the guard already: {}", rv.sql);

    let ct = order_lines().backfill_chunk(&range, None);
    assert!(
        ct.sql.contains(
            "FROM [Sales Ünïcode].[Order]] Lines] AS T OUTER APPLY CHANGETABLE(VERSION [Sales Ünïcode].[Order]] Lines], \
([Order Id], [Line №]), (T.[Order Id], T.[Line №])) AS CT WHERE (CT.SYS_CHANGE_VERSION IS NULL OR CT.SYS_CHANGE_VERSION <= @P2) \
AND (T.[Order Id] >= CONVERT(BIGINT, @P3) AND (T.[Order Id] > CONVERT(BIGINT, @P3) OR (T.[Order Id] = CONVERT(BIGINT, @P3) AND T.[Line №] > CONVERT(NVARCHAR(20), @P4)))) \
AND (T.[Order Id] <= CONVERT(BIGINT, @P5) AND (T.[Order Id] < CONVERT(BIGINT, @P5) OR (T.[Order Id] = CONVERT(BIGINT, @P5) AND T.[Line №] <= CONVERT(NVARCHAR(20), @P6)))) \
ORDER BY T.[Order Id], T.[Line №]"
        ),
        "{}",
        ct.sql
    );
    assert!(!ct.sql.starts_with("SET TRANSACTION"), "READ COMMITTED as the live reads: {}", ct.sql);
    let estimate = orders().backfill_estimate(None);
    assert_eq!(estimate.sql, "SELECT COUNT_BIG(*) AS ESTIMATE FROM [DBO].[ORDERS] AS T");
    assert!(estimate.slots.is_empty());
}
