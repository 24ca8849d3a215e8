//! The limit: the keyset query loop ours is built on, from one tokio-postgres connection, with nothing else (no
//! HTTP, no state, no JSON beyond what PostgreSQL builds). The statements are the ones
//! src/source/postgres/sql.rs builds for `public.orders` (`fetch_first`, then `fetch_after`): same select list,
//! same `row_to_json` item, same row-value keyset, same late-commit guard.

use crate::ours::Drain;
use crate::setup::IdCheck;
use crate::{context, BenchResult};
use std::time::Instant;
use testbed::driver::HostDriver;
use tokio_postgres::Client;

/// The item's columns, in table order, as the source projects them.
const ROW_SOURCE: &str = "\"public\".\"orders\" t CROSS JOIN LATERAL (SELECT t.\"id\" AS \"id\", t.\"customer\" AS \
    \"customer\", t.\"amount\" AS \"amount\", t.\"created_version\" AS \"created_version\", t.\"version\" AS \
    \"version\", t.\"deleted\" AS \"deleted\", t.\"changed_at\" AS \"changed_at\") r";
const ITEM: &str =
    "CASE WHEN t.\"deleted\" IS TRUE THEN json_build_object('id', t.\"id\")::text ELSE row_to_json(r)::text END";
const ORDER: &str = "ORDER BY t.\"version\", t.\"id\"";
const GUARD: &str = "t.\"version\" < pg_snapshot_xmin(pg_current_snapshot())";

/// `fetch_first`: the only parameter is the limit.
pub fn fetch_first() -> String {
    format!(
        "SELECT t.\"version\"::text, t.\"id\"::text, (CASE WHEN t.\"deleted\" IS TRUE THEN 2 WHEN true THEN 0 ELSE 1 \
         END)::int4, {ITEM} FROM {ROW_SOURCE} WHERE {GUARD} {ORDER} LIMIT $1"
    )
}

/// `fetch_after`: the position's texts (cursor, id), then the limit.
pub fn fetch_after() -> String {
    format!(
        "SELECT t.\"version\"::text, t.\"id\"::text, (CASE WHEN t.\"deleted\" IS TRUE THEN 2 WHEN \
         (t.\"created_version\", t.\"id\") > (($1::text)::xid8, ($2::text)::bigint) THEN 0 ELSE 1 END)::int4, \
         {ITEM} FROM {ROW_SOURCE} WHERE (t.\"version\", t.\"id\") > (($1::text)::xid8, ($2::text)::bigint) AND \
         {GUARD} {ORDER} LIMIT $3"
    )
}

/// Walks the whole table `batch` rows at a time, as fast as one connection can.
pub async fn drain(client: &Client, batch: usize, expected: u64) -> BenchResult<Drain> {
    let limit = i64::try_from(batch).map_err(context("batch size"))?;
    let first = client.prepare(&fetch_first()).await.map_err(context("preparing fetch_first"))?;
    let after = client.prepare(&fetch_after()).await.map_err(context("preparing fetch_after"))?;
    let mut ids = IdCheck::new(expected);
    let mut position: Option<(String, String)> = None;
    let mut queries = 0u64;
    let mut bytes = 0usize;
    let started = Instant::now();
    loop {
        let rows = match &position {
            None => client.query(&first, &[&limit]).await,
            Some((cursor, id)) => client.query(&after, &[cursor, id, &limit]).await,
        }
        .map_err(context("keyset fetch"))?;
        queries += 1;
        let Some(last) = rows.last() else { break };
        for row in &rows {
            let id: &str = row.get(1);
            let item: &str = row.get(3);
            bytes += item.len();
            ids.add(id.parse().map_err(context("id text"))?);
        }
        position = Some((last.get::<_, String>(0), last.get::<_, String>(1)));
    }
    let seconds = started.elapsed().as_secs_f64();
    // Keep the item texts "used" so that nothing could be optimised away; the figure itself is not reported.
    std::hint::black_box(bytes);
    Ok(Drain {
        rows: ids.received,
        seconds,
        invocations: queries,
        http_seconds: 0.0,
        cpu: Default::default(),
        verdict: ids.verdict(),
    })
}

/// Checks that the statements above are the ones the handler runs, from PostgreSQL's own record of each
/// backend's latest statement (`pg_stat_activity.query`): `function` must be fresh, so that its first
/// invocation runs `fetch_first` and its second `fetch_after`. `Err` says which one drifted.
pub async fn verify_statements(
    driver: &HostDriver,
    client: &Client,
    function: &str,
) -> BenchResult<Result<(), String>> {
    let mut problems = Vec::new();
    for (name, expected) in [("fetch_first", fetch_first()), ("fetch_after", fetch_after())] {
        driver.invoke(function, None).await.map_err(context(format!("invoking {function}")))?;
        let seen: Vec<String> = client
            .query(
                "SELECT DISTINCT query FROM pg_stat_activity WHERE application_name = 'sql-pseudo-trigger' \
                 AND query LIKE 'SELECT t.%'",
                &[],
            )
            .await
            .map_err(context("reading pg_stat_activity"))?
            .iter()
            .map(|row| row.get(0))
            .collect();
        if !seen.contains(&expected) {
            problems.push(format!("{name} differs from the handler's; the handler ran: {}", seen.join(" | ")));
        }
    }
    Ok(if problems.is_empty() { Ok(()) } else { Err(problems.join("; ")) })
}
