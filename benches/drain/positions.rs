//! Is catch-up linear? The source's fetch timed at 10 % and at 90 % of a large table: with a keyset the index
//! walk starts at the position, so both cost the same; a predicate PostgreSQL cannot turn into an index range
//! (the peer's `c > :c OR (c = :c AND pk > :p)`) scans from the start, so the 90 % fetch costs ~9x the 10 % one.
//!
//! Ours is timed through the product's own `Source::fetch` (built from the same sqltrigger.json the handler
//! reads, compiled in release with this bench), so it includes decoding rows into changes. The peer's predicate
//! is timed as a plain statement shaped like the one its SQLAlchemy source renders, for contrast.

use crate::setup::{AppFolder, FunctionFolder};
use crate::{context, BenchResult, Options};
use serde_json::json;
use sql_pseudo_trigger::app::App;
use sql_pseudo_trigger::config::{AppConfig, Env};
use sql_pseudo_trigger::state::MemoryStore;
use std::sync::Arc;
use std::time::{Duration, Instant};
use testbed::embedded;

const FUNCTION: &str = "FetchProbe";
/// Samples of the peer's predicate per position: each one scans a large part of the index, so fewer suffice.
const PEER_SAMPLES: usize = 20;

/// Fetch times at two positions.
#[derive(Debug, Clone)]
pub struct Positions {
    pub rows: u64,
    pub batch: usize,
    pub ours_10: Vec<Duration>,
    pub ours_90: Vec<Duration>,
    pub peer_10: Vec<Duration>,
    pub peer_90: Vec<Duration>,
}

pub async fn measure(options: &Options, url: &str, batch: usize) -> BenchResult<Positions> {
    let folder = AppFolder::write(
        options,
        &[FunctionFolder { name: FUNCTION.into(), connection_setting: "PgBig", max_batch_size: batch }],
    )?;
    let mut settings = AppFolder::base_settings();
    settings.push(("PgBig".into(), url.to_string()));
    let config = AppConfig::load_from(&folder.root(), Env::from_pairs(settings)).map_err(context("app config"))?;
    let app = App::with_store(config, Arc::new(MemoryStore::new())).map_err(context("building the app"))?;
    let source = app.trigger(FUNCTION).ok_or("the probe function was not loaded")?.source().clone();
    source.validate().await.map_err(context("validating the source"))?;

    let client = embedded::connect(url).await.map_err(context("connecting"))?;
    let at = |fraction: f64| (options.big_rows as f64 * fraction) as i64;
    let mut ours = Vec::new();
    let mut peer = Vec::new();
    for offset in [at(0.1), at(0.9)] {
        let row = client
            .query_one(
                "SELECT version::text, id::text, changed_at::text FROM public.orders ORDER BY version, id OFFSET $1 LIMIT 1",
                &[&offset],
            )
            .await
            .map_err(context("finding a position"))?;
        ours.push(json!([row.get::<_, String>(0), row.get::<_, String>(1)]));
        let peer_row = client
            .query_one(
                "SELECT changed_at::text, id FROM public.orders ORDER BY changed_at, id OFFSET $1 LIMIT 1",
                &[&offset],
            )
            .await
            .map_err(context("finding a position"))?;
        peer.push((peer_row.get::<_, String>(0), peer_row.get::<_, i64>(1)));
    }

    let fetch = |position: &serde_json::Value| {
        let source = source.clone();
        let position = position.clone();
        async move {
            let started = Instant::now();
            let fetched = source.fetch(&position, batch).await.map_err(context("fetch"))?;
            if fetched.changes.len() != batch {
                return Err(format!("fetch returned {} rows, expected {batch}", fetched.changes.len()));
            }
            Ok::<_, String>(started.elapsed())
        }
    };
    // Warm both positions (plan cache, buffers), then alternate so that drift hits both alike.
    for _ in 0..10 {
        fetch(&ours[0]).await?;
        fetch(&ours[1]).await?;
    }
    let (mut ours_10, mut ours_90) = (Vec::new(), Vec::new());
    for _ in 0..options.fetch_samples {
        ours_10.push(fetch(&ours[0]).await?);
        ours_90.push(fetch(&ours[1]).await?);
    }

    // The peer's predicate, as SQLAlchemy renders its table query (all columns, OR-expanded keyset).
    let statement = client
        .prepare(
            "SELECT orders.id, orders.customer, orders.amount, orders.created_version, orders.version, \
             orders.deleted, orders.changed_at FROM public.orders WHERE orders.changed_at IS NOT NULL AND \
             (orders.changed_at > ($1::text)::timestamptz OR orders.changed_at = ($1::text)::timestamptz AND \
             orders.id > $2) ORDER BY orders.changed_at, orders.id LIMIT $3",
        )
        .await
        .map_err(context("preparing the peer's statement"))?;
    let limit = batch as i64;
    let (mut peer_10, mut peer_90) = (Vec::new(), Vec::new());
    for i in 0..PEER_SAMPLES.min(options.fetch_samples) + 1 {
        for (position, into) in [(&peer[0], &mut peer_10), (&peer[1], &mut peer_90)] {
            let started = Instant::now();
            let rows = client
                .query(&statement, &[&position.0, &position.1, &limit])
                .await
                .map_err(context("the peer's fetch"))?;
            std::hint::black_box(rows);
            // The first round warms up.
            if i > 0 {
                into.push(started.elapsed());
            }
        }
    }
    Ok(Positions { rows: options.big_rows, batch, ours_10, ours_90, peer_10, peer_90 })
}
