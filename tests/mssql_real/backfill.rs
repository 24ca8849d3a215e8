//! Tier 3 scenarios of the SQL Server backfills (docs/operations.md, "Backfill"): what only a server decides,
//! that the bound leaves out exactly the rows changed since the start (change tracking's
//! `CHANGETABLE(VERSION ...)`, the rowversion's comparison), that a filter's literals convert to each column's
//! type (neither cut to a column's length nor rounded to its scale), and that a re-read stops at its chunk's last key.

use super::{drain, new_rowversion, payload, tracked, Ctx};
use serde_json::{json, Value};
use sql_pseudo_trigger::config::SourceKind;
use sql_pseudo_trigger::source::{Filter, Position, Source, StartFrom};
use testbed::chunks::ChunkRows;

fn ids(f: &sql_pseudo_trigger::source::Fetched) -> Vec<i64> {
    payload(f)
        .iter()
        .map(|(op, item)| {
            assert_eq!(*op, 0, "a backfilled row is an insert");
            item["Id"].as_i64().expect("an Id")
        })
        .collect()
}

/// Every chunk of a backfill from the first key, `limit` rows at a time.
async fn chunks(source: &dyn Source, bound: &Value, filter: Option<&Filter>, limit: usize) -> Vec<Vec<i64>> {
    let mut after = Position::Null;
    let mut out = Vec::new();
    for _ in 0..100 {
        let f = source.chunk_rows(bound, &after, None, filter, limit).await.expect("chunk");
        if f.changes.is_empty() {
            return out;
        }
        after = f.last.clone().expect("a key");
        out.push(ids(&f));
    }
    panic!("no end after 100 chunks");
}

pub(super) async fn change_tracking_backfill_leaves_rows_changed_since_its_start_to_the_live_path(ctx: &mut Ctx) {
    let t = tracked(ctx, "ctbf", "Id int PRIMARY KEY, V int, Region varchar(4)").await;
    ctx.exec(&format!("INSERT INTO [dbo].[{t}] VALUES (1, 1, 'eu'), (2, 2, 'us'), (3, 3, 'eu'), (4, 4, 'eu')")).await;
    let source = ctx.ct(&format!("dbo.{t}"), json!({"startFrom": "snapshot"}));
    let start = source.start_position(StartFrom::Snapshot).await.expect("start");
    assert_eq!(start["phase"], "changes", "the live path starts at the current version");
    let plan = source.backfill_start(&start, None).await.expect("backfill starts");
    assert_eq!((plan.bound.clone(), plan.estimate), (start["base"].clone(), Some(4)));

    ctx.exec(&format!("UPDATE [dbo].[{t}] SET V = 20 WHERE Id = 2; INSERT INTO [dbo].[{t}] VALUES (5, 5, 'eu')")).await;
    assert_eq!(chunks(&source, &plan.bound, None, 2).await, vec![vec![1, 3], vec![4]], "2 and 5 changed since");
    let (live, _) = drain(&source, &start, 10).await;
    let live: Vec<(u8, Value)> = live.iter().flat_map(payload).collect();
    assert!(live.contains(&(1, json!({"Id":2,"V":20,"Region":"us"}))), "{live:?}");
    assert!(live.contains(&(0, json!({"Id":5,"V":5,"Region":"eu"}))), "{live:?}");

    let filter = Filter::parse("Region = 'eu' AND V >= 3").expect("a filter");
    let filtered = source.backfill_start(&start, Some(&filter)).await.expect("filtered backfill starts");
    assert_eq!(filtered.estimate, Some(3), "rows 3, 4 and 5 match; the estimate does not look up versions");
    assert_eq!(chunks(&source, &filtered.bound, Some(&filter), 10).await, vec![vec![3, 4]]);
    let again = source.chunk_rows(&plan.bound, &Position::Null, Some(&json!(["3"])), None, 10).await;
    assert_eq!(ids(&again.expect("a re-read")), vec![1, 3], "a re-read stops at its last key");
}

pub(super) async fn rowversion_backfill_leaves_rows_changed_since_its_start_to_the_live_path(ctx: &mut Ctx) {
    let t = ctx.table("rvbf");
    ctx.exec(&format!("CREATE TABLE [dbo].[{t}] (Id int PRIMARY KEY, Title nvarchar(3), Price decimal(9,2), Deleted bit NOT NULL DEFAULT 0, RV rowversion)")).await;
    ctx.exec(&format!("INSERT INTO [dbo].[{t}] (Id, Title, Price) VALUES (1, N'a', 10.55), (2, N'b', 1), (3, N'abc', 10.56), (4, N'd', 1); UPDATE [dbo].[{t}] SET Deleted = 1 WHERE Id = 4")).await;
    let source = new_rowversion(ctx.spec(
        SourceKind::MssqlRowversion,
        &format!("dbo.{t}"),
        json!({"startFrom": "snapshot", "softDeleteColumn": "Deleted", "columns": ["Id", "Title", "Deleted"]}),
    ))
    .expect("source");
    let start = source.start_position(StartFrom::Snapshot).await.expect("start");
    let plan = source.backfill_start(&start, None).await.expect("backfill starts");
    assert_eq!(
        (plan.bound.clone(), plan.estimate),
        (start["rv"].clone(), Some(3)),
        "the soft-deleted row is not counted"
    );

    ctx.exec(&format!("UPDATE [dbo].[{t}] SET Title = N'B' WHERE Id = 2")).await;
    assert_eq!(chunks(&source, &plan.bound, None, 2).await, vec![vec![1, 3]], "2 changed since, 4 is deleted");
    let (live, _) = drain(&source, &start, 10).await;
    let live: Vec<(u8, Value)> = live.iter().flat_map(payload).collect();
    assert_eq!(live, vec![(1, json!({"Id":2,"Title":"B","Deleted":false}))]);

    // A literal longer than the column is not cut to its length: 'abcd' does not equal 'abc'.
    let longer = Filter::parse("Title = 'abcd'").expect("a filter");
    assert!(chunks(&source, &plan.bound, Some(&longer), 10).await.is_empty());
    let exact = Filter::parse("Title = 'abc' AND Deleted = false").expect("a filter");
    assert_eq!(chunks(&source, &plan.bound, Some(&exact), 10).await, vec![vec![3]]);
    // Nor is a decimal rounded to the column's scale: 10.56 > 10.555, 10.55 is not.
    let finer = Filter::parse("Price > 10.555").expect("a filter");
    assert_eq!(chunks(&source, &plan.bound, Some(&finer), 10).await, vec![vec![3]]);
}
