//! SQL the docs tell users to run, run as written on real PostgreSQL: a block marked `<!-- docs_sql: NAME -->` in
//! a doc is taken from the doc itself (not a copy), so a doc that drifts from what works fails here.

use crate::support;
use testbed::embedded;

/// The SQL block right after the marker `<!-- docs_sql: {name} -->` in `doc`.
fn block(doc: &str, name: &str) -> String {
    let marker = format!("<!-- docs_sql: {name} -->");
    let after = doc.split_once(&marker).unwrap_or_else(|| panic!("no {marker} in the doc")).1;
    let body =
        after.trim_start().strip_prefix("```sql\n").unwrap_or_else(|| panic!("{marker} is not followed by ```sql"));
    body.split_once("\n```").unwrap_or_else(|| panic!("the block after {marker} does not end")).0.to_string()
}

/// `(id, version, created_version)` of every order, the xid8 values as text.
async fn orders(db: &tokio_postgres::Client) -> Vec<(i64, String, String)> {
    let rows = db
        .query("SELECT id, version::text, created_version::text FROM public.orders ORDER BY id", &[])
        .await
        .expect("read orders");
    rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect()
}

/// Runs `sql` in a transaction of its own and returns that transaction's id, as text.
async fn in_transaction(db: &mut tokio_postgres::Client, sql: &str) -> String {
    let tx = db.transaction().await.expect("begin");
    tx.batch_execute(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    let xid: String = tx.query_one("SELECT pg_current_xact_id()::text", &[]).await.expect("xid").get(0);
    tx.commit().await.expect("commit");
    xid
}

#[tokio::test]
async fn the_cursor_column_sql_of_docs_postgres_keeps_version_at_the_last_writers_transaction() {
    // GIVEN an existing table with a row, and the block of docs/postgres.md run on it as written
    let url = support::fixture().fresh_database("docs_sql").await;
    let mut db = embedded::connect(&url).await.expect("connect");
    db.batch_execute("CREATE TABLE public.orders (id bigint PRIMARY KEY, customer text NOT NULL)")
        .await
        .expect("table");
    let before = in_transaction(&mut db, "INSERT INTO public.orders VALUES (1, 'ada')").await;
    let sql = block(include_str!("../../docs/postgres.md"), "cursor-column");
    let added = in_transaction(&mut db, &sql).await;
    // THEN the existing row carries the transaction that added the columns
    assert_ne!(before, added);
    assert_eq!(orders(&db).await, vec![(1, added.clone(), added.clone())]);

    // WHEN a row is inserted THEN both columns are its transaction's id
    let inserted = in_transaction(&mut db, "INSERT INTO public.orders (id, customer) VALUES (2, 'grace')").await;
    // WHEN the first is updated, even by a statement that tries to set the cursor itself, THEN its version moves
    // to the updating transaction and its created_version stays
    let updated =
        in_transaction(&mut db, "UPDATE public.orders SET customer = 'ada l', version = '1'::xid8 WHERE id = 1").await;
    assert_eq!(orders(&db).await, vec![(1, updated.clone(), added.clone()), (2, inserted.clone(), inserted.clone())]);
    let xid = |s: &str| s.parse::<u64>().expect("an xid8 prints as a number");
    assert!(xid(&added) < xid(&inserted) && xid(&inserted) < xid(&updated), "{added} < {inserted} < {updated}");

    // AND the index the doc creates is the one each fetch reads: (version, id)
    let index: String = db
        .query_one("SELECT indexdef FROM pg_indexes WHERE indexname = 'orders_version_id'", &[])
        .await
        .expect("the index exists")
        .get(0);
    assert!(index.ends_with("USING btree (version, id)"), "{index}");
}
