//! The cursor source's statement texts, and `shape`, the table the other modules' tests build statements over.

use super::*;

/// The orders table's shape (xid8 cursor, bigint key) under `guard`; other modules' tests build on it.
pub(in crate::source::postgres) fn shape(guard: Guard) -> Shape {
    let id = |s: &str| Ident::new(s).expect("valid");
    Shape {
        table: "\"public\".\"orders\"".into(),
        cursor: id("version"),
        cursor_type: "xid8".into(),
        key: vec![(id("id"), "bigint".into())],
        columns: vec![(id("id"), false), (id("blob"), true)],
        soft_delete: Some((id("deleted"), true)),
        inserted: Some(id("created")),
        guard,
        age: Age::CommitTimestamp,
        partition: None,
    }
}

#[test]
fn fetch_uses_a_row_value_keyset_below_the_oldest_running_transaction() {
    assert_eq!(
        shape(Guard::Xid8).fetch_after(),
        "SELECT t.\"version\"::text, t.\"id\"::text, (CASE WHEN t.\"deleted\" IS TRUE THEN 2 WHEN (t.\"created\", t.\"id\") > (($1::text)::xid8, ($2::text)::bigint) THEN 0 ELSE 1 END)::int4, \
CASE WHEN t.\"deleted\" IS TRUE THEN (SELECT row_to_json(k.*)::text FROM (SELECT t.\"id\" AS \"id\") k) ELSE row_to_json(r.*)::text END \
FROM \"public\".\"orders\" t CROSS JOIN LATERAL (SELECT t.\"id\" AS \"id\", translate(encode(t.\"blob\", 'base64'), E'\\n', '') AS \"blob\") r \
WHERE (t.\"version\", t.\"id\") > (($1::text)::xid8, ($2::text)::bigint) AND t.\"version\" < pg_snapshot_xmin(pg_current_snapshot()) \
ORDER BY t.\"version\", t.\"id\" LIMIT $3"
    );
}

#[test]
fn a_lag_guard_reads_only_below_now_minus_the_lag() {
    let s = shape(Guard::Lag { seconds: 5.0, with_time_zone: true });
    assert!(s.fetch_first().contains("WHERE t.\"version\" < now() - make_interval(secs => 5.000) ORDER BY"));
    let s = shape(Guard::None);
    assert!(!s.fetch_first().contains("WHERE"));
}

#[test]
fn the_lag_dates_the_first_row_of_the_keyset_range_ignoring_the_guard() {
    // An xid8 cursor is dated by its row's commit timestamp, and not at all while those are off
    assert_eq!(
        shape(Guard::Xid8).oldest_after(true),
        "SELECT EXTRACT(EPOCH FROM now() - pg_xact_commit_timestamp(t.xmin))::float8 FROM \"public\".\"orders\" t \
WHERE (t.\"version\", t.\"id\") > (($1::text)::xid8, ($2::text)::bigint) ORDER BY t.\"version\", t.\"id\" LIMIT 1"
    );
    assert_eq!(
        shape(Guard::Xid8).oldest_first(false),
        "SELECT NULL::float8 FROM \"public\".\"orders\" t ORDER BY t.\"version\", t.\"id\" LIMIT 1"
    );
    // A timestamp cursor is its own date, compared in its own kind of time
    let stamped = |with_time_zone| Shape {
        cursor_type: "timestamp with time zone".into(),
        age: Age::Cursor { with_time_zone },
        ..shape(Guard::Lag { seconds: 5.0, with_time_zone })
    };
    assert_eq!(
        stamped(true).oldest_first(true),
        "SELECT EXTRACT(EPOCH FROM now() - t.\"version\")::float8 FROM \"public\".\"orders\" t ORDER BY t.\"version\", t.\"id\" LIMIT 1"
    );
    assert!(stamped(false).oldest_first(true).starts_with("SELECT EXTRACT(EPOCH FROM localtimestamp - t.\"version\")"));
    assert!(!stamped(true).oldest_after(true).contains("make_interval"), "the safety lag does not hide a waiting row");
}

fn partitioned(index: u32, count: u32) -> Shape {
    let count = std::num::NonZeroU32::new(count).expect("count");
    Shape { partition: Partition::new(index, count), ..shape(Guard::Xid8) }
}

#[test]
fn a_partition_reads_its_keys_by_a_literal_hash_before_the_keyset() {
    let p = partitioned(2, 4);
    let expr = "((hashtextextended(t.\"id\"::text, 0) & 9223372036854775807) % 4) = 2";
    // The equality comes first, then the row-value keyset, then the guard: one range of the partition index
    assert!(
        p.fetch_after().contains(&format!(
            "WHERE {expr} AND (t.\"version\", t.\"id\") > (($1::text)::xid8, ($2::text)::bigint) AND t.\"version\" < pg_snapshot_xmin"
        )),
        "{}",
        p.fetch_after()
    );
    assert!(p.fetch_first().contains(&format!("WHERE {expr} AND t.\"version\" < pg_snapshot_xmin")));
    assert!(p.fetch_range().contains(&format!("WHERE {expr} AND (t.\"version\", t.\"id\") > ")));
    assert!(p.fetch_range_first().contains(&format!("WHERE {expr} AND (t.\"version\", t.\"id\") <= ")));
    assert!(p.newest().contains(&format!("t WHERE {expr} ORDER BY t.\"version\" DESC")));
    assert!(p.pending_after().contains(&format!("t WHERE {expr} AND (t.\"version\", t.\"id\") > ")));
    assert!(p
        .pending_all()
        .ends_with(&format!("t WHERE {expr} AND t.\"version\" < pg_snapshot_xmin(pg_current_snapshot())")));
    assert!(p.oldest_first(true).contains(&format!("t WHERE {expr} ORDER BY")));
    assert!(p.oldest_after(true).contains(&format!("t WHERE {expr} AND (t.\"version\", t.\"id\") > ")));
    // Parameters are unchanged: the count and index are literals, not parameters
    assert!(p.fetch_after().ends_with("LIMIT $3"));
    assert!(p.fetch_range().ends_with("LIMIT $5"));
}

#[test]
fn an_unpartitioned_source_reads_every_key() {
    let s = shape(Guard::Xid8);
    for q in [s.fetch_after(), s.fetch_first(), s.newest(), s.pending_all(), s.oldest_first(true)] {
        assert!(!q.contains("hashtextextended"), "{q}");
    }
    assert_eq!(s.partition_index_ddl(), None);
}

#[test]
fn a_composite_key_hashes_its_columns_joined_by_commas_and_the_index_leads_with_the_hash() {
    let id = |s: &str| Ident::new(s).expect("valid");
    let p = Shape { key: vec![(id("region"), "text".into()), (id("Id"), "integer".into())], ..partitioned(0, 8) };
    assert_eq!(
        p.partition_expression(8, "t."),
        "((hashtextextended(t.\"region\"::text || ',' || t.\"Id\"::text, 0) & 9223372036854775807) % 8)"
    );
    assert_eq!(
        p.partition_index_ddl().as_deref(),
        Some("CREATE INDEX CONCURRENTLY ON \"public\".\"orders\" (((hashtextextended(\"region\"::text || ',' || \"Id\"::text, 0) & 9223372036854775807) % 8), \"version\", \"region\", \"Id\")")
    );
}

#[test]
fn a_plan_is_a_range_scan_only_with_the_hash_in_the_index_condition_and_no_sort() {
    let plan = |p: serde_json::Value| PlanCheck::read(&serde_json::json!([{ "Plan": p }])).expect("a plan");
    let h = "((hashtextextended((id)::text, '0'::bigint) & '9223372036854775807'::bigint) % '4'::bigint) = 2";
    let indexed = plan(serde_json::json!({"Node Type": "Limit", "Plans": [
        {"Node Type": "Index Scan", "Index Cond": format!("(({h}) AND (ROW(version, id) > ROW('5'::xid8, '1'::bigint)))")}
    ]}));
    assert!(indexed.is_range_scan(), "{indexed:?}");
    let filtered = plan(serde_json::json!({"Node Type": "Limit", "Plans": [
        {"Node Type": "Index Scan", "Index Cond": "(version < pg_snapshot_xmin(pg_current_snapshot()))", "Filter": format!("({h})")}
    ]}));
    assert!(!filtered.is_range_scan() && filtered.expression_filtered, "{filtered:?}");
    let sorted = plan(serde_json::json!({"Node Type": "Limit", "Plans": [{"Node Type": "Incremental Sort", "Plans": [
        {"Node Type": "Index Scan", "Index Cond": format!("({h})")}
    ]}]}));
    assert!(!sorted.is_range_scan() && sorted.sorts, "{sorted:?}");
    assert_eq!(PlanCheck::read(&serde_json::json!({"not": "a plan"})), None);
}

#[test]
fn range_refetch_is_bounded_on_both_sides() {
    let q = shape(Guard::Xid8).fetch_range();
    assert!(q.contains("> (($1::text)::xid8, ($2::text)::bigint) AND (t.\"version\", t.\"id\") <= (($3::text)::xid8, ($4::text)::bigint)"));
    assert!(q.ends_with("LIMIT $5"));
}
