//! The chunk statement's text and the key-drop rule (step 4) on the stream's buffer.

use super::*;
use crate::source::postgres_logical::buffer::Buffer;
use crate::source::postgres_logical::catalog::CatalogColumn;
use crate::source::postgres_logical::decode::Decoded;
use crate::source::postgres_logical::position::Place;
use serde_json::Map;
use std::sync::Mutex;

fn id(s: &str) -> Ident {
    Ident::new(s).expect("a valid name")
}

fn shape() -> Shape {
    let column = |name: &str, type_name: &str| CatalogColumn {
        name: name.into(),
        oid: 0,
        typmod: -1,
        type_name: type_name.into(),
        filter_type: type_name.into(),
    };
    Shape {
        oid: 1,
        key: vec![id("tenant"), id("Id")],
        columns: vec!["tenant".into(), "Id".into(), "blob".into(), "doc".into()],
        catalog: vec![
            column("tenant", "integer"),
            column("Id", "bigint"),
            column("blob", "bytea"),
            column("doc", "jsonb"),
        ],
        item_columns: vec![id("tenant"), id("Id"), id("blob"), id("doc")],
        item_renders: vec![
            (id("tenant"), Render::Plain),
            (id("Id"), Render::Plain),
            (id("blob"), Render::Base64),
            (id("doc"), Render::Json("jsonb".into())),
        ],
        items: String::new(),
        items_path: Mutex::new(None),
        time_zone: "UTC".into(),
    }
}

/// A key position as stored: the key's texts.
fn keys(texts: &[&str]) -> Position {
    Position::Array(texts.iter().map(|t| Position::String(t.to_string())).collect())
}

/// A chunk request after `after`, up to `upto` when it re-reads, of a backfill whose bound is `bound`.
fn request<'a>(
    bound: &'a Position,
    after: &'a Position,
    upto: Option<&'a Position>,
    filter: Option<&'a Filter>,
) -> ChunkRequest<'a> {
    ChunkRequest { bound, after, upto, filter, limit: 100, live: &Position::Null }
}

#[test]
fn a_chunk_walks_the_key_after_the_last_one_projects_items_as_the_live_path_and_binds_the_filter() {
    let filter = Filter::parse("tenant = 7 AND doc IS NOT NULL").expect("parses");
    let after = keys(&["7", "41"]);
    let bound = serde_json::json!({ "last": ["9", "1"] });
    let r = request(&bound, &after, None, Some(&filter));
    let (sql, params) = chunk_sql(&shape(), "\"public\".\"orders\"", "public.orders", &r).expect("a statement");
    assert_eq!(
        sql,
        "SELECT format('%s', t.\"tenant\"), format('%s', t.\"Id\"), row_to_json(r.*)::text FROM \"public\".\"orders\" t CROSS JOIN LATERAL \
(SELECT t.\"tenant\" AS \"tenant\", t.\"Id\" AS \"Id\", translate(encode(t.\"blob\", 'base64'), E'\\n', '') AS \"blob\", t.\"doc\" AS \"doc\") r \
WHERE (t.\"tenant\", t.\"Id\") > (($1::text)::integer, ($2::text)::bigint) AND (t.\"tenant\", t.\"Id\") <= (($3::text)::integer, ($4::text)::bigint) \
AND (t.\"tenant\" = ($5::text)::integer AND t.\"doc\" IS NOT NULL) ORDER BY t.\"tenant\", t.\"Id\" LIMIT $6"
    );
    // the texts, then the limit, bound last
    assert_eq!(format!("{params:?}"), r#"["7", "41", "9", "1", "7", 100]"#);
    // The walk ends at the greatest key when the backfill started: newer keys are the live path's.
    assert_eq!(
        last_key_sql(&shape(), "t"),
        "SELECT format('%s', t.\"tenant\"), format('%s', t.\"Id\") FROM t t ORDER BY t.\"tenant\" DESC, t.\"Id\" DESC LIMIT 1"
    );
}

#[test]
fn a_re_read_is_bounded_by_its_keys_and_not_by_a_limit() {
    // Rows inserted into the range since its first read belong to it: a limit would cut them off, and the
    // acknowledgement of the range would then pass them.
    let (from, upto) = (keys(&["1", "2"]), keys(&["3", "4"]));
    let bound = serde_json::json!({ "last": ["9", "9"] });
    let (sql, params) = chunk_sql(&shape(), "t", "t", &request(&bound, &from, Some(&upto), None)).expect("a statement");
    assert!(
        sql.ends_with(
            "WHERE (t.\"tenant\", t.\"Id\") > (($1::text)::integer, ($2::text)::bigint) AND (t.\"tenant\", t.\"Id\") <= (($3::text)::integer, ($4::text)::bigint) ORDER BY t.\"tenant\", t.\"Id\""
        ),
        "{sql}"
    );
    // no limit is bound
    assert_eq!(format!("{params:?}"), r#"["1", "2", "3", "4"]"#);
    let empty = serde_json::json!({ "last": null });
    let (first, _) = chunk_sql(&shape(), "t", "t", &request(&empty, &Position::Null, None, None)).expect("a statement");
    assert!(first.contains("WHERE true ORDER BY"), "{first}");
    let (count, params) = estimate_sql(&shape(), "t", Some(&Filter::parse("tenant IN (1, 2)").expect("parses")));
    assert_eq!(count, "SELECT count(*) FROM t t WHERE t.\"tenant\" IN (($1::text)::integer, ($2::text)::integer)");
    assert_eq!(params, ["1", "2"]);
}

fn change(commit: u64, seq: u64, key: Option<&[&str]>) -> Event {
    Event::Change(Decoded {
        place: Place { commit: Lsn(commit), seq },
        operation: Operation::Update,
        kind: 0,
        values: Map::new(),
        item: None,
        lsn: Lsn(commit),
        xid: 1,
        commit_time: 0,
        key: key.map(|k| k.iter().map(|s| s.to_string()).collect()),
    })
}

fn commit(at: u64) -> Event {
    Event::Commit { commit: Lsn(at), end: Lsn(at + 10) }
}

fn key(tenant: &str, id: &str) -> Vec<String> {
    vec![tenant.to_string(), id.to_string()]
}

#[test]
fn a_chunk_leaves_out_every_key_a_change_after_the_live_position_touched_and_keeps_the_rest() {
    // GIVEN a stream that decoded, after the live position D (the end of the transaction at 100): an update of
    // (1,2) and a key change of (1,3) to (1,30) (the delete of the old key, then the insert); and before D, a
    // change of (1,1) that the consumer already holds
    let mut b = Buffer::new(Lsn(50), Lsn(50), 1 << 20, 1000);
    for event in [
        change(100, 1, Some(&["1", "1"])),
        commit(100),
        change(200, 1, Some(&["1", "2"])),
        commit(200),
        change(300, 1, Some(&["1", "3"])),
        change(300, 2, Some(&["1", "30"])),
        commit(300),
    ] {
        b.push(event, 10);
    }
    let d = Pos { commit: Lsn(100), seq: 1, end: Some(Lsn(110)) };

    // WHEN a chunk read between them is checked against the changes after D
    let touched = Touched::of(b.after(Some(d))).expect("every change carries its key");

    // THEN the keys changed in (D, H] are left out (their changes follow the chunk), both keys of the key
    // change among them; a key changed only before D, and an untouched key, stay
    assert!(!touched.keeps(&key("1", "2")));
    assert!(!touched.keeps(&key("1", "3")) && !touched.keeps(&key("1", "30")));
    assert!(touched.keeps(&key("1", "1")), "its change is at or before D, visible to the chunk");
    assert!(touched.keeps(&key("1", "4")));
    // AND from before everything, the change before D counts too
    assert!(!Touched::of(b.after(None)).expect("keys").keeps(&key("1", "1")));
}

#[test]
fn a_truncate_after_the_live_position_leaves_out_every_row_and_a_change_without_its_key_holds_the_chunk() {
    let mut b = Buffer::new(Lsn(50), Lsn(50), 1 << 20, 1000);
    b.push(Event::Truncate { place: Place { commit: Lsn(100), seq: 1 }, xid: 9 }, 10);
    b.push(commit(100), 10);
    let touched = Touched::of(b.after(None)).expect("a truncate has no key");
    assert!(!touched.keeps(&key("1", "1")));
    assert!(Touched::of(b.after(Some(Pos::before(Lsn(120))))).expect("nothing after").keeps(&key("1", "1")));

    b.push(change(200, 1, None), 10);
    let refused = Touched::of(b.after(Some(Pos::before(Lsn(120))))).expect_err("an unknown key");
    assert!(refused.contains("does not carry its key"), "{refused}");
}

#[test]
fn the_wait_and_watermark_statements_are_the_ones_the_rule_names() {
    // Step 1 asks a later snapshot's oldest running xid, not the commit log (which says committed before the
    // proc array lets go) nor a snapshot's running list (which leaves out running xids at or above its xmax);
    // step 3 writes a message, so a flushed commit record follows the watermark even on an idle server
    assert!(LOW_WATERMARK.contains("pg_current_xact_id()"));
    assert_eq!(OLDER_ENDED, "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= $1::text::xid8");
    // (a transaction that writes WAL commits synchronously; one that only takes an xid does not)
    assert!(HIGH_WATERMARK.contains("pg_logical_emit_message(true,"));
}

#[test]
fn a_stored_backfill_key_of_a_date_written_in_another_date_style_is_refused_naming_it_and_the_fix() {
    let mut shape = shape();
    shape.catalog[0].type_name = "date".into();
    let key = |day: &str| Position::Array(vec![Position::String(day.into()), Position::String("41".into())]);
    let read = key_texts(&shape, &key("2024-01-02"), "public.orders").expect("ISO passes");
    assert_eq!(read, Some(vec!["2024-01-02".to_string(), "41".to_string()]));
    assert_eq!(key_texts(&shape, &Position::Null, "public.orders").expect("before the first key"), None);
    let refused = key_texts(&shape, &key("02/01/2024"), "public.orders").expect_err("not ISO").to_string();
    assert!(
        refused.contains(r#"public.orders holds the date "02/01/2024""#)
            && refused.contains("handler state backfill <function> --cancel"),
        "{refused}"
    );
}
