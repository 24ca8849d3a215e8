//! `cargo bench --bench backfill` (or `scripts/bench backfill`): a backfill of a large table through `handler run`
//! into a PostgreSQL sink (issue 26), beside the limits of reading and of writing the same rows on the same
//! server, and what a backfill does to the latency of live changes. One PostgreSQL and one Azurite started here
//! on loopback, the release `handler`, blob state.
//!
//! 1. **The limits.** `COPY (SELECT id, customer, amount FROM orders ORDER BY id) TO STDOUT`, the rows in the
//!    order the chunks read them (the limit of reading), and `INSERT INTO orders_limit SELECT ...` into an empty
//!    table shaped like the sink's target (the limit of writing).
//! 2. **The backfill alone.** `startFrom: snapshot` on the table, nothing else writing: wall time from the
//!    process's start to the state document saying `done`, and the rate over the rows it delivered.
//! 3. **The backfill beside a writer.** The same, with a writer inserting new orders at a fixed rate, each in its
//!    own transaction, from the first tick on. A live change's delivery latency is `applied_at - placed_at` in
//!    the target (both read from the server's clock: the insert's transaction start and the sink's write), for
//!    the orders placed while the backfill ran and, with the same process and writer, for those placed after it
//!    was done (no backfill): p50, p95, max. A statement trigger on the target logs each batch, so the table
//!    also says how many batches were chunks and how many live during the backfill: the share the chunk/live
//!    turn (`decide::backfill`) gave.
//!
//! Knobs (environment): `BENCH_BACKFILL_ROWS` (1000000), `BENCH_BACKFILL_BATCH` (maxBatchSize, 1000),
//! `BENCH_BACKFILL_RATE` (the writer's inserts per second, 200), `BENCH_BACKFILL_POLL_MS` (pollingIntervalMs,
//! 100), `BENCH_BACKFILL_AFTER_SECS` (the phase without a backfill, 20). `cargo test --all-targets` runs this
//! binary without `--bench`; it then does nothing.

#[allow(dead_code)]
#[path = "shared/host_app.rs"]
mod host_app;

use host_app::{err, handler, insert, number, Result, Servers};
use serde_json::{json, Value};
use sql_pseudo_trigger::engine::document::{Backfill, BackfillState, StateDoc};
use sql_pseudo_trigger::state::{BlobStore, StateStore};
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};
use testbed::embedded::{self, ScratchDir};

const FUNCTION: &str = "PgOrdersChanged";
/// The state container `handler run` uses by default.
const STATE_CONTAINER: &str = "sql-pseudo-trigger";

/// The sink's target (with `applied_at`, which the sink never writes: its default stamps the first write),
/// the limit's target, and `batch_log`: one row per statement the sink ran on the target (one per batch here),
/// with how many of its rows were live changes (ids above the backfilled ones).
const TARGETS: &str = "
    CREATE TABLE public.orders_copy (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12, 2) NOT NULL,
        placed_at timestamptz NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
    CREATE TABLE public.orders_limit (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12, 2) NOT NULL,
        placed_at timestamptz NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());
    CREATE TABLE public.batch_log (at timestamptz NOT NULL DEFAULT clock_timestamp(), rows bigint NOT NULL,
        live bigint NOT NULL);";

fn main() -> ExitCode {
    host_app::bench_main("backfill", run)
}

/// A database error naming what failed, with the server's message (its `Display` is only "db error").
fn pg(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> String {
    move |e| match e.as_db_error() {
        Some(db) => format!("{what}: {}", db.message()),
        None => format!("{what}: {e}"),
    }
}

/// The knobs of one run.
struct Knobs {
    rows: i64,
    batch: u64,
    rate: u64,
    poll_ms: u64,
    after: Duration,
}

async fn run() -> Result<String> {
    let knobs = Knobs {
        rows: number("BENCH_BACKFILL_ROWS", 1_000_000)? as i64,
        batch: number("BENCH_BACKFILL_BATCH", 1000)?.max(1),
        rate: number("BENCH_BACKFILL_RATE", 200)?.max(1),
        poll_ms: number("BENCH_BACKFILL_POLL_MS", 100)?.max(1),
        after: Duration::from_secs(number("BENCH_BACKFILL_AFTER_SECS", 20)?.max(5)),
    };
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let servers = Servers::start().await?;
    let url =
        embedded::create_database(&servers.postgres.url(), "backfill").await.map_err(err("creating a database"))?;
    let db = embedded::connect(&url).await.map_err(err("connecting"))?;
    db.batch_execute(testbed::demo::ORDERS_SCHEMA).await.map_err(pg("creating public.orders"))?;
    for first in (1..=knobs.rows).step_by(50_000) {
        insert(&db, first..=(first + 49_999).min(knobs.rows)).await?;
    }
    db.batch_execute(TARGETS).await.map_err(pg("creating the targets"))?;
    db.batch_execute(&format!(
        "CREATE FUNCTION public.log_batch() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             INSERT INTO public.batch_log (rows, live) SELECT count(*), count(*) FILTER (WHERE id > {}) FROM new_rows;
             RETURN NULL;
         END $$;
         CREATE TRIGGER log_batch AFTER INSERT ON public.orders_copy REFERENCING NEW TABLE AS new_rows
             FOR EACH STATEMENT EXECUTE FUNCTION public.log_batch();",
        knobs.rows
    ))
    .await
    .map_err(pg("creating the batch log"))?;
    // (Alone: VACUUM cannot run in the transaction a multi-statement query is.)
    db.batch_execute("VACUUM (ANALYZE) public.orders").await.map_err(pg("VACUUM"))?;

    let read = timed(async {
        let stream = db
            .copy_out("COPY (SELECT id, customer, amount FROM public.orders ORDER BY id) TO STDOUT")
            .await
            .map_err(pg("COPY TO STDOUT"))?;
        let mut stream = std::pin::pin!(stream);
        let mut bytes = 0usize;
        while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
            bytes += chunk.map_err(pg("reading COPY"))?.len();
        }
        Ok(bytes)
    })
    .await?;
    let write = timed(async {
        db.execute(
            "INSERT INTO public.orders_limit (id, customer, amount, placed_at) SELECT id, customer, amount, placed_at FROM public.orders",
            &[],
        )
        .await
        .map_err(pg("INSERT ... SELECT"))
    })
    .await?;
    eprintln!("backfill: COPY {:.1} s, INSERT ... SELECT {:.1} s", read.0.as_secs_f64(), write.0.as_secs_f64());

    let empty = "TRUNCATE public.orders_copy, public.batch_log";
    let drain = live_drain(&servers, &url, &db, &knobs).await?;
    db.batch_execute(empty).await.map_err(pg("emptying the target"))?;
    let alone = backfill(&servers, &url, &db, &knobs, "alone", false).await?;
    db.batch_execute(empty).await.map_err(pg("emptying the target"))?;
    let beside = backfill(&servers, &url, &db, &knobs, "writer", true).await?;

    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let first_three = |s: &str| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    let mut out = format!(
        "Run on {} CPU(s), {} (load average {} before, {} after).\n\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        servers.postgres.version(),
        first_three(&load_before),
        first_three(&load_after),
    );
    out.push_str(&report(&knobs, (read.0, write.0, drain), &alone, &beside));
    Ok(out)
}

/// Runs `work`, returning how long it took and what it returned.
async fn timed<T>(work: impl std::future::Future<Output = Result<T>>) -> Result<(Duration, T)> {
    let started = Instant::now();
    let value = work.await?;
    Ok((started.elapsed(), value))
}

/// The latency of live changes over a window: how many, p50, p95 and max, in milliseconds.
#[derive(Debug, Default, Clone)]
struct Latency {
    changes: i64,
    p50: f64,
    p95: f64,
    max: f64,
}

/// One backfill through `handler run`.
struct Backfilled {
    wall: Duration,
    backfill: Backfill,
    /// With a writer: live changes during the backfill, and after it.
    during: Option<Latency>,
    after: Option<Latency>,
    /// Batches the sink wrote while the backfill ran: chunks, live ones.
    batches: (i64, i64),
}

/// An app folder for `handler run`: the template's function.json, the demo's trigger with `startFrom`
/// (`snapshot`: a backfill; `earliest`: the same rows as live changes) and a PostgreSQL sink into `orders_copy`.
fn app_folder(knobs: &Knobs, start_from: &str) -> Result<ScratchDir> {
    let dir = ScratchDir::new("bench-backfill").map_err(err("creating the app folder"))?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(root.join("host.json"), dir.path().join("host.json")).map_err(err("copying host.json"))?;
    let function = std::fs::read(root.join("function-templates").join(FUNCTION).join("function.json"))
        .map_err(err("reading the template's function.json"))?;
    let mut trigger: Value = serde_json::from_str(testbed::demo::ORDERS_TRIGGER).map_err(err("the demo's trigger"))?;
    let extra = json!({
        "startFrom": start_from,
        "maxBatchSize": knobs.batch,
        "pollingIntervalMs": knobs.poll_ms,
        "columns": ["id", "customer", "amount", "placed_at"],
        "deliveryMode": "sink",
        "sink": {"type": "postgres", "tableName": "public.orders_copy", "connectionStringSetting": "PostgresConnectionString"},
    });
    for (k, v) in extra.as_object().into_iter().flatten() {
        trigger[k] = v.clone();
    }
    let folder = dir.path().join(FUNCTION);
    std::fs::create_dir_all(&folder).map_err(err("creating the function folder"))?;
    std::fs::write(folder.join("function.json"), function).map_err(err("writing function.json"))?;
    std::fs::write(folder.join("sqltrigger.json"), trigger.to_string()).map_err(err("writing sqltrigger.json"))?;
    Ok(dir)
}

/// The function's state document, if written.
async fn state(store: &BlobStore, app_name: &str) -> Result<Option<StateDoc>> {
    let key = format!("{app_name}/{FUNCTION}.json");
    let Some(versioned) = store.load(&key).await.map_err(err("reading the state"))? else { return Ok(None) };
    serde_json::from_slice(&versioned.bytes).map(Some).map_err(err("the state document"))
}

/// Inserts orders from `first` on at `rate` per second, each in its own transaction, until `stop`; returns the
/// next id.
async fn write(url: String, first: i64, rate: u64, mut stop: tokio::sync::watch::Receiver<bool>) -> Result<i64> {
    let db = embedded::connect(&url).await.map_err(err("the writer connects"))?;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut id = first;
    loop {
        tokio::select! {
            _ = stop.changed() => return Ok(id),
            _ = tick.tick() => {
                db.execute("INSERT INTO public.orders (id, customer, amount) VALUES ($1, 'live', 1)", &[&id])
                    .await
                    .map_err(pg("the writer's insert"))?;
                id += 1;
            }
        }
    }
}

/// Live changes' latency for the orders placed between `from` and `to` (RFC 3339).
async fn latency(db: &tokio_postgres::Client, above: i64, from: &str, to: &str) -> Result<Latency> {
    let row = db
        .query_one(
            "SELECT count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY ms), percentile_cont(0.95) WITHIN GROUP (ORDER BY ms), max(ms)
             FROM (SELECT extract(epoch FROM applied_at - placed_at)::float8 * 1000 AS ms FROM public.orders_copy
                   WHERE id > $1 AND placed_at >= $2::text::timestamptz AND placed_at < $3::text::timestamptz) l",
            &[&above, &from, &to],
        )
        .await
        .map_err(pg("reading latencies"))?;
    Ok(Latency {
        changes: row.get(0),
        p50: row.get::<_, Option<f64>>(1).unwrap_or(0.0),
        p95: row.get::<_, Option<f64>>(2).unwrap_or(0.0),
        max: row.get::<_, Option<f64>>(3).unwrap_or(0.0),
    })
}

fn rfc3339(t: time::OffsetDateTime) -> Result<String> {
    t.format(&time::format_description::well_known::Rfc3339).map_err(err("formatting a time"))
}

/// `handler run` on the app folder `dir` under state name `app_name`, its log in the folder.
fn spawn(servers: &Servers, url: &str, dir: &ScratchDir, app_name: &str) -> Result<Child> {
    Command::new(handler()?)
        .arg("--app-root")
        .arg(dir.path())
        .arg("run")
        .env("PostgresConnectionString", url)
        .env("AzureWebJobsStorage", servers.azurite.connection_string())
        .env("Sql_Trigger_StateStore", "blob")
        .env("Sql_Trigger_AppName", app_name)
        .env("Sql_Trigger_LogLevel", "warn")
        .env_remove("FUNCTIONS_APP_ROOT_PATH")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("handler.log")).map_err(err("creating the handler's log"))?)
        .spawn()
        .map_err(err("starting handler run"))
}

/// The same rows delivered as live changes (`startFrom: earliest`), for reference: wall time from the process's
/// start until the sink wrote them all (the batch log's rows).
async fn live_drain(servers: &Servers, url: &str, db: &tokio_postgres::Client, knobs: &Knobs) -> Result<Duration> {
    let dir = app_folder(knobs, "earliest")?;
    let started = Instant::now();
    let mut child = spawn(servers, url, &dir, "backfill-live")?;
    let deadline = Instant::now() + Duration::from_secs(3600);
    let result = loop {
        let written: i64 = db
            .query_one("SELECT coalesce(sum(rows), 0)::bigint FROM public.batch_log", &[])
            .await
            .map_err(pg("reading the batch log"))?
            .get(0);
        if written >= knobs.rows {
            break Ok(started.elapsed());
        }
        if Instant::now() > deadline {
            break Err(format!("{written} of {} rows drained within an hour", knobs.rows));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let _ = child.kill();
    let _ = child.wait();
    result.map_err(|e| format!("{e}\n{}", std::fs::read_to_string(dir.path().join("handler.log")).unwrap_or_default()))
}

async fn backfill(
    servers: &Servers,
    url: &str,
    db: &tokio_postgres::Client,
    knobs: &Knobs,
    name: &str,
    with_writer: bool,
) -> Result<Backfilled> {
    let dir = app_folder(knobs, "snapshot")?;
    let app_name = format!("backfill-{name}");
    let secret = sql_pseudo_trigger::config::Secret::new(servers.azurite.connection_string());
    let store = BlobStore::from_connection_string(&secret, STATE_CONTAINER).map_err(err("the state store"))?;
    let log = dir.path().join("handler.log");
    let started = Instant::now();
    let mut child = spawn(servers, url, &dir, &app_name)?;
    let result = watch(&mut child, &store, &app_name, url, db, knobs, with_writer, started).await;
    let _ = child.kill();
    let _ = child.wait();
    result.map_err(|e| format!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default()))
}

/// Waits for the backfill `child` runs to finish (starting the writer once it started, when asked), then for the
/// phase after it; measures.
#[allow(clippy::too_many_arguments)]
async fn watch(
    child: &mut Child,
    store: &BlobStore,
    app_name: &str,
    url: &str,
    db: &tokio_postgres::Client,
    knobs: &Knobs,
    with_writer: bool,
    started: Instant,
) -> Result<Backfilled> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut writer = None;
    let deadline = Instant::now() + Duration::from_secs(3600);
    let (wall, backfill) = loop {
        if let Some(status) = child.try_wait().map_err(err("waiting for handler run"))? {
            return Err(format!("handler run exited ({status}) before the backfill was done"));
        }
        if let Some(b) = state(store, app_name).await?.and_then(|d| d.backfill().cloned()) {
            // The writer starts once the backfill's bound is fixed, so every order it places is a live change.
            if with_writer && writer.is_none() {
                writer = Some(tokio::spawn(write(url.to_string(), knobs.rows + 1, knobs.rate, stopped.clone())));
            }
            if b.state == BackfillState::Done {
                break (started.elapsed(), b);
            }
        }
        if Instant::now() > deadline {
            return Err("the backfill was not done within an hour".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let finished = backfill.finished_at.ok_or("a done backfill has finished_at")?;
    eprintln!("backfill {}: {} rows in {:.1} s", app_name, backfill.rows, wall.as_secs_f64());
    let Some(writer) = writer else {
        return Ok(Backfilled { wall, backfill, during: None, after: None, batches: (0, 0) });
    };
    tokio::time::sleep(knobs.after).await;
    let _ = stop.send(true);
    let next = writer.await.map_err(err("the writer"))??;
    // Every order placed must have arrived before the latencies are read.
    let placed = next - knobs.rows - 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let copied: i64 = db
            .query_one("SELECT count(*) FROM public.orders_copy WHERE id > $1", &[&knobs.rows])
            .await
            .map_err(pg("counting live changes"))?
            .get(0);
        if copied >= placed {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("{copied} of {placed} live changes delivered 60 s after the writer stopped"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (from, to) = (rfc3339(backfill.started_at)?, rfc3339(finished)?);
    let during = latency(db, knobs.rows, &from, &to).await?;
    // A second after the end, so a change placed while the last chunk was delivered is not counted as after.
    let after_from = rfc3339(finished + Duration::from_secs(1))?;
    let after = latency(db, knobs.rows, &after_from, "infinity").await?;
    let row = db
        .query_one(
            "SELECT count(*) FILTER (WHERE live = 0), count(*) FILTER (WHERE live > 0) FROM public.batch_log
             WHERE at >= $1::text::timestamptz AND at <= $2::text::timestamptz",
            &[&from, &to],
        )
        .await
        .map_err(pg("reading the batch log"))?;
    Ok(Backfilled { wall, backfill, during: Some(during), after: Some(after), batches: (row.get(0), row.get(1)) })
}

fn report(
    knobs: &Knobs,
    (read, write, drain): (Duration, Duration, Duration),
    alone: &Backfilled,
    beside: &Backfilled,
) -> String {
    let rows = knobs.rows as f64;
    let per_s = |d: Duration| rows / d.as_secs_f64();
    let mut out = format!(
        "### Backfill of {} rows through `handler run` into a PostgreSQL sink (batch {}, same server)\n\n| what | time | rows/s | the backfill alone takes |\n|---|---:|---:|---:|\n",
        knobs.rows, knobs.batch
    );
    let line = |label: &str, d: Duration| {
        format!(
            "| {label} | {:.1} s | {:.0} | {:.2}× |\n",
            d.as_secs_f64(),
            per_s(d),
            alone.wall.as_secs_f64() / d.as_secs_f64()
        )
    };
    out.push_str(&line("`COPY (SELECT … ORDER BY id) TO STDOUT` (the limit of reading)", read));
    out.push_str(&line("`INSERT … SELECT` into an empty copy (the limit of writing)", write));
    out.push_str(&line("the same rows as live changes, `handler run` (`startFrom: earliest`)", drain));
    out.push_str(&line("**backfill, `handler run`, nothing else writing**", alone.wall));
    out.push_str(&line(&format!("backfill, `handler run`, a writer at {} inserts/s", knobs.rate), beside.wall));
    out.push_str(&format!(
        "\nTime is from the process's start to the state document's `done` (the first tick's row count included); \
         the backfill delivered {} rows in {} chunks alone, {} in {} beside the writer.\n\n",
        alone.backfill.rows, alone.backfill.chunks, beside.backfill.rows, beside.backfill.chunks
    ));
    let (during, after) = (beside.during.clone().unwrap_or_default(), beside.after.clone().unwrap_or_default());
    out.push_str(&format!(
        "### Live changes during the backfill (a writer at {} inserts/s, pollingIntervalMs {})\n\n| phase | live changes | p50 | p95 | max |\n|---|---:|---:|---:|---:|\n",
        knobs.rate, knobs.poll_ms
    ));
    for (label, l) in [("no backfill (after it)", &after), ("during the backfill", &during)] {
        out.push_str(&format!("| {label} | {} | {:.0} ms | {:.0} ms | {:.0} ms |\n", l.changes, l.p50, l.p95, l.max));
    }
    let (chunks, live) = beside.batches;
    out.push_str(&format!(
        "\nDuring the backfill the sink wrote {chunks} chunks and {live} live batches ({:.0} % live).\n\n",
        100.0 * live as f64 / (chunks + live).max(1) as f64
    ));
    let to_write = alone.wall.as_secs_f64() / write.as_secs_f64();
    let p95 = if after.p95 > 0.0 { during.p95 / after.p95 } else { f64::INFINITY };
    let verdict = |met: bool| if met { "met" } else { "missed" };
    out.push_str(&format!(
        "Goals (issue 26): the backfill within 3× of `INSERT … SELECT`: {to_write:.2}× ({}); live p95 during the backfill within 2× of no backfill: {p95:.2}× ({}).\n",
        verdict(to_write <= 3.0),
        verdict(p95 <= 2.0)
    ));
    out
}
