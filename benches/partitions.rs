//! `cargo bench --bench partitions` (or `scripts/bench partitions`): scaling out with partitions (issue 23), in
//! one run on one PostgreSQL and one Azurite, with the release `handler`:
//!
//! 1. **Under the host's timer.** 2, 4, 8 and 16 partition functions (the folders `handler partitions
//!    generate` writes: one timer function per partition), each on a 1-second schedule with batch 1000, beside
//!    the one unpartitioned function, through the host model (`testbed::driver`) on a simulated clock as
//!    benches/pacing.rs does: every function fires on its own schedule, all at once, and a firing that takes
//!    longer than its period delays the next. The backlog is larger than the span can deliver, so every firing
//!    has a full batch. On the simulated clock the functions fire back to back on the wall clock, so the
//!    machine carries more concurrent firings than a real host would give it: the figure is a lower bound of
//!    host-paced delivery on this machine, not handler capacity.
//! 2. **Under `handler run`.** 1, 2 and 4 processes over 8 partitions, and one process running the unpartitioned
//!    function, draining a backlog into a PostgreSQL sink; the steady rate (between 20 % and 80 % of the backlog
//!    in the sink) and what each part of the system used of the CPUs meanwhile (the handlers, PostgreSQL,
//!    Azurite), read from /proc: on 2 cores, that says what saturates.
//! 3. **A partition's fetch at 10 % and at 90 %** of a 1M-row table (8 partitions): the product's own
//!    `Source::fetch` at both positions, with the partition index and without it (the `(cursor, key)` index
//!    only), and the unpartitioned fetch for reference.
//!
//! Knobs: `BENCH_PARTITIONS_SPAN` (simulated seconds per host scenario, 60), `BENCH_PARTITIONS_RUN_ROWS`
//! (backlog of the `handler run` scenarios, 400000), `BENCH_PARTITIONS_FETCH_ROWS` (1000000),
//! `BENCH_PARTITIONS_PARTS` (`host,run,fetch`: which parts run). `cargo test --all-targets` runs this binary
//! without `--bench`; it then does nothing.

#[allow(dead_code)]
#[path = "shared/host_app.rs"]
mod host_app;

use host_app::{err, handler, insert, number, Result, Servers};
use serde_json::{json, Value};
use sql_pseudo_trigger::app::App;
use sql_pseudo_trigger::config::{AppConfig, Env};
use sql_pseudo_trigger::state::MemoryStore;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use testbed::driver::{DriverOptions, HostDriver};
use testbed::embedded::{self, ScratchDir};

const FUNCTION: &str = "PgOrdersChanged";
const BATCH: u64 = 1000;
const RUN_PARTITIONS: u32 = 8;
const FETCH_PARTITIONS: u32 = 8;
const FETCH_SAMPLES: usize = 100;
const FETCH_SAMPLES_WITHOUT_INDEX: usize = 10;

fn main() -> ExitCode {
    host_app::bench_main("partitions", run)
}

/// The partition expression the cursor source filters on, as its start-up warning spells it, for the index.
fn partition_expression(count: u32) -> String {
    format!("((hashtextextended((id)::text, (0)::bigint) & '9223372036854775807'::bigint) % ({count})::bigint)")
}

/// The index a partitioned fetch needs: `(partition expression, cursor, key)`.
fn partition_index(count: u32) -> String {
    format!("CREATE INDEX orders_partition_{count} ON public.orders ({}, version, id)", partition_expression(count))
}

async fn run() -> Result<String> {
    let parts = std::env::var("BENCH_PARTITIONS_PARTS").unwrap_or_else(|_| "host,run,fetch".into());
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let servers = Servers::start().await?;
    let mut out = String::new();
    if parts.contains("host") {
        out.push_str(&host_paced(&servers).await?);
    }
    if parts.contains("run") {
        out.push_str(&runner(&servers).await?);
    }
    if parts.contains("fetch") {
        out.push_str(&fetch_cost(&servers).await?);
    }
    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let first_three = |s: &str| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    Ok(format!(
        "Run on {} CPU(s), {} (load average {} before, {} after).\n\n{out}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        servers.postgres.version(),
        first_three(&load_before),
        first_three(&load_after),
    ))
}

/// A database `name` with the demo's orders table, `rows` orders in it, and the partition index for `count`
/// partitions (none for 1).
async fn orders_database(
    servers: &Servers,
    name: &str,
    rows: i64,
    count: u32,
) -> Result<(String, tokio_postgres::Client)> {
    let url = embedded::create_database(&servers.postgres.url(), name).await.map_err(err("creating a database"))?;
    let db = embedded::connect(&url).await.map_err(err("connecting"))?;
    db.batch_execute(testbed::demo::ORDERS_SCHEMA).await.map_err(err("creating public.orders"))?;
    for chunk in (1..=rows).step_by(50_000) {
        insert(&db, chunk..=(chunk + 49_999).min(rows)).await?;
    }
    if count > 1 {
        db.batch_execute(&partition_index(count)).await.map_err(err("creating the partition index"))?;
    }
    db.batch_execute("VACUUM (ANALYZE) public.orders").await.map_err(err("VACUUM"))?;
    Ok((url, db))
}

/// The demo's sqltrigger.json with batch 1000, for partition `index` of `count` (`None`: unpartitioned).
fn trigger(partition: Option<(u32, u32)>, extra: &Value) -> Value {
    let mut trigger: Value = serde_json::from_str(testbed::demo::ORDERS_TRIGGER).expect("the demo's trigger");
    trigger["maxBatchSize"] = json!(BATCH);
    if let Some((index, count)) = partition {
        trigger["partitions"] = json!(count);
        trigger["partition"] = json!(index);
        trigger["partitionGroup"] = json!(FUNCTION);
    }
    if let Some(extra) = extra.as_object() {
        for (k, v) in extra {
            trigger[k] = v.clone();
        }
    }
    trigger
}

/// An app folder: this repository's host.json and `functions` (folder name, function.json, sqltrigger.json).
fn app_folder(functions: &[(String, Value, Value)]) -> Result<ScratchDir> {
    let dir = ScratchDir::new("bench-partitions").map_err(err("creating the app folder"))?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(root.join("host.json"), dir.path().join("host.json")).map_err(err("copying host.json"))?;
    for (name, function, trigger) in functions {
        let folder = dir.path().join(name);
        std::fs::create_dir_all(&folder).map_err(err("creating a function folder"))?;
        std::fs::write(folder.join("function.json"), function.to_string()).map_err(err("writing function.json"))?;
        std::fs::write(folder.join("sqltrigger.json"), trigger.to_string()).map_err(err("writing sqltrigger.json"))?;
    }
    Ok(dir)
}

fn template_function() -> Result<Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read(root.join("function-templates").join(FUNCTION).join("function.json"))
        .map_err(err("reading the template's function.json"))?;
    let mut function: Value = serde_json::from_slice(&text).map_err(err("the template's function.json"))?;
    function["bindings"][0]["schedule"] = json!("* * * * * *");
    Ok(function)
}

// -----------------------------------------------------------------------------------------------------------
// 1. Under the host's timer
// -----------------------------------------------------------------------------------------------------------

struct HostRow {
    label: String,
    functions: u32,
    firings: usize,
    failed: usize,
    written: u64,
    distinct: usize,
    rate: f64,
    took_p50: Duration,
    wall: Duration,
}

async fn host_paced(servers: &Servers) -> Result<String> {
    let span = Duration::from_secs(number("BENCH_PARTITIONS_SPAN", 60)?.max(5));
    let handler = handler()?;
    let function = template_function()?;
    let mut rows: Vec<HostRow> = Vec::new();
    // 0: the unpartitioned function, which is N = 1 (one partition is no partition: the configuration refuses
    // `"partitions": 1` beside `"partition"`); 2..: that many partition functions.
    for count in [0u32, 2, 4, 8, 16] {
        let functions_n = count.max(1);
        let backlog = (f64::from(functions_n) * BATCH as f64 * span.as_secs_f64() * 1.1) as i64;
        let name = format!("host_{count}");
        let (url, _db) = orders_database(servers, &name, backlog, count).await?;
        let folders: Vec<(String, Value, Value)> = if count == 0 {
            vec![(FUNCTION.to_string(), function.clone(), trigger(None, &Value::Null))]
        } else {
            (0..count)
                .map(|i| (format!("{FUNCTION}-p{i}"), function.clone(), trigger(Some((i, count)), &Value::Null)))
                .collect()
        };
        let names: Vec<String> = folders.iter().map(|(n, _, _)| n.clone()).collect();
        let dir = app_folder(&folders)?;
        let mut options = DriverOptions::new(dir.path(), &handler);
        options.env = vec![
            ("PostgresConnectionString".into(), url),
            ("AzureWebJobsStorage".into(), servers.azurite.connection_string()),
            ("Sql_Trigger_AppName".into(), name.replace('_', "-")),
            ("Sql_Trigger_LogLevel".into(), "warn".into()),
        ];
        let host = HostDriver::start(options).await.map_err(err("starting the handler"))?;
        let start = time::OffsetDateTime::now_utc().replace_nanosecond(0).map_err(|e| e.to_string())?;
        let started = Instant::now();
        let runs = futures::future::join_all(names.iter().map(|f| host.run_schedule(f, start, span, |_| false))).await;
        let wall = started.elapsed();
        let (mut firings, mut failed, mut written, mut took) = (0, 0, 0u64, Vec::new());
        for paced in runs {
            let paced = paced.map_err(|e| e.to_string())?;
            firings += paced.firings.len();
            failed += paced.firings.iter().filter(|f| !f.run.succeeded).count();
            written += paced.written("changes") as u64;
            took.extend(paced.firings.iter().map(|f| f.took));
        }
        let ids: std::collections::BTreeSet<i64> =
            host.delivered("changes").iter().filter_map(|m| m.pointer("/Item/id").and_then(Value::as_i64)).collect();
        took.sort_unstable();
        host.kill();
        let label = if count == 0 {
            "1: unpartitioned (one function)".to_string()
        } else {
            format!("{count} partition functions")
        };
        eprintln!("partitions: host {label}: {:.0} changes/s", written as f64 / span.as_secs_f64());
        rows.push(HostRow {
            label,
            functions: functions_n,
            firings,
            failed,
            written,
            distinct: ids.len(),
            rate: written as f64 / span.as_secs_f64(),
            took_p50: took.get(took.len() / 2).copied().unwrap_or_default(),
            wall,
        });
    }
    let single = rows.first().map_or(1.0, |r| r.rate);
    let mut out = format!(
        "### Under the host's timer (1-second schedule, batch {BATCH}, {} simulated seconds per row)\n\n| functions | firings | failed | changes written | distinct ids | changes/s under the host | / (N × unpartitioned) | handler time per firing (p50) | wall time |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        span.as_secs()
    );
    for r in &rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | **{:.0}** | {:.2} | {:.1} ms | {:.1} s |\n",
            r.label,
            r.firings,
            r.failed,
            r.written,
            r.distinct,
            r.rate,
            r.rate / (f64::from(r.functions) * single),
            r.took_p50.as_secs_f64() * 1000.0,
            r.wall.as_secs_f64()
        ));
    }
    let worst = rows.iter().skip(1).map(|r| r.rate / (f64::from(r.functions) * single)).fold(f64::INFINITY, f64::min);
    out.push_str(&format!(
        "\nGoal (issue 23): host-paced delivery ≥ 0.8 × N × the unpartitioned rate up to N = 16: lowest ratio {worst:.2} ({}).\n\n",
        if worst >= 0.8 { "met" } else { "missed" }
    ));
    Ok(out)
}

// -----------------------------------------------------------------------------------------------------------
// 2. Under `handler run`
// -----------------------------------------------------------------------------------------------------------

/// CPU seconds (user + system) a process has used so far, from /proc.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return 0.0 };
    // The fields after the command name (which may hold spaces) in parentheses.
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    (ticks(11) + ticks(12)) / 100.0
}

/// The pids whose command name is `comm` (postgres backends, node for Azurite).
fn pids_named(comm: &str) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == comm))
        .collect()
}

/// CPU seconds of every process named `comm`, by pid (a process that ended meanwhile is not counted).
fn cpu_of(comm: &str) -> std::collections::BTreeMap<u32, f64> {
    pids_named(comm).into_iter().map(|p| (p, cpu_seconds(p))).collect()
}

fn cpu_since(before: &std::collections::BTreeMap<u32, f64>, comm: &str) -> f64 {
    cpu_of(comm).iter().map(|(pid, now)| now - before.get(pid).copied().unwrap_or(0.0)).sum()
}

struct RunRow {
    label: String,
    rate: f64,
    total: Duration,
    handler_cpu: f64,
    postgres_cpu: f64,
    azurite_cpu: f64,
}

async fn runner(servers: &Servers) -> Result<String> {
    let rows_n = number("BENCH_PARTITIONS_RUN_ROWS", 400_000)? as i64;
    let handler = handler()?;
    let (url, db) = orders_database(servers, "run", rows_n, RUN_PARTITIONS).await?;
    db.batch_execute("CREATE TABLE public.orders_copy (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12, 2) NOT NULL)")
        .await
        .map_err(err("creating the sink table"))?;
    let mut rows = Vec::new();
    for (label, processes, partitioned) in [
        ("1 process, unpartitioned", 1usize, false),
        ("1 process, 8 partitions", 1, true),
        ("2 processes, 8 partitions", 2, true),
        ("4 processes, 8 partitions", 4, true),
    ] {
        db.batch_execute("TRUNCATE public.orders_copy").await.map_err(err("emptying the sink"))?;
        let extra = json!({
            "columns": ["id", "customer", "amount"],
            "deliveryMode": "sink",
            "leaseDurationMs": 3000,
            "sink": {"type": "postgres", "tableName": "public.orders_copy", "connectionStringSetting": "PostgresConnectionString"},
        });
        let mut trigger = trigger(None, &extra);
        if partitioned {
            trigger["partitions"] = json!(RUN_PARTITIONS);
        }
        let dir = app_folder(&[(FUNCTION.to_string(), template_function()?, trigger)])?;
        let app_name = format!("run-{}-{}", processes, if partitioned { "p" } else { "u" });
        let pg_before = cpu_of("postgres");
        let node_before = cpu_of("node");
        let started = Instant::now();
        let mut children: Vec<Child> = (0..processes)
            .map(|_| {
                Command::new(&handler)
                    .arg("--app-root")
                    .arg(dir.path())
                    .arg("run")
                    .env("PostgresConnectionString", &url)
                    .env("AzureWebJobsStorage", servers.azurite.connection_string())
                    .env("Sql_Trigger_StateStore", "blob")
                    .env("Sql_Trigger_AppName", &app_name)
                    .env("Sql_Trigger_LogLevel", "warn")
                    .env_remove("FUNCTIONS_APP_ROOT_PATH")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .map_err(err("starting handler run"))
            })
            .collect::<Result<_>>()?;
        let (mut at20, mut at80) = (None, None);
        let deadline = Instant::now() + Duration::from_secs(600);
        let mut handler_cpu = 0.0;
        loop {
            let n: i64 = db
                .query_one("SELECT count(*) FROM public.orders_copy", &[])
                .await
                .map_err(err("counting the sink"))?
                .get(0);
            let now = started.elapsed();
            if at20.is_none() && n >= rows_n / 5 {
                at20 = Some((now, n));
            }
            if at80.is_none() && n >= rows_n * 4 / 5 {
                at80 = Some((now, n));
            }
            if n >= rows_n {
                handler_cpu = children.iter().map(|c| cpu_seconds(c.id())).sum();
                break;
            }
            if Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let total = started.elapsed();
        let postgres_cpu = cpu_since(&pg_before, "postgres");
        let azurite_cpu = cpu_since(&node_before, "node");
        for c in &mut children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let (Some((t20, n20)), Some((t80, n80))) = (at20, at80) else {
            return Err(format!("{label}: the sink did not reach 80 % of {rows_n} rows in 600 s"));
        };
        let rate = (n80 - n20) as f64 / (t80 - t20).as_secs_f64();
        eprintln!("partitions: run {label}: {rate:.0} changes/s");
        rows.push(RunRow {
            label: label.to_string(),
            rate,
            total,
            handler_cpu: handler_cpu / total.as_secs_f64(),
            postgres_cpu: postgres_cpu / total.as_secs_f64(),
            azurite_cpu: azurite_cpu / total.as_secs_f64(),
        });
    }
    let single = rows.first().map_or(1.0, |r| r.rate);
    let mut out = format!(
        "### Under `handler run` ({rows_n} orders into a PostgreSQL sink on the same server, batch {BATCH}, lease 3 s)\n\n| processes | changes/s (20 % → 80 %) | / unpartitioned | time to the last row | CPUs used: handlers | PostgreSQL | Azurite |\n|---|---:|---:|---:|---:|---:|---:|\n"
    );
    for r in &rows {
        out.push_str(&format!(
            "| {} | **{:.0}** | {:.2} | {:.1} s | {:.2} | {:.2} | {:.2} |\n",
            r.label,
            r.rate,
            r.rate / single,
            r.total.as_secs_f64(),
            r.handler_cpu,
            r.postgres_cpu,
            r.azurite_cpu
        ));
    }
    out.push('\n');
    Ok(out)
}

// -----------------------------------------------------------------------------------------------------------
// 3. A partition's fetch at 10 % and 90 %
// -----------------------------------------------------------------------------------------------------------

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort_unstable();
    v.get(v.len() / 2).map_or(0.0, |d| d.as_secs_f64() * 1000.0)
}

async fn fetch_cost(servers: &Servers) -> Result<String> {
    let rows_n = number("BENCH_PARTITIONS_FETCH_ROWS", 1_000_000)? as i64;
    let (url, db) = orders_database(servers, "fetch", rows_n, FETCH_PARTITIONS).await?;
    let index: u32 = 3;
    let function = template_function()?;
    let dir = app_folder(&[
        ("Partition".to_string(), function.clone(), trigger(Some((index, FETCH_PARTITIONS)), &Value::Null)),
        ("Whole".to_string(), function, trigger(None, &Value::Null)),
    ])?;
    let env = Env::from_pairs([
        ("PostgresConnectionString".to_string(), url.clone()),
        ("AzureWebJobsStorage".to_string(), servers.azurite.connection_string()),
    ]);
    let config = AppConfig::load_from(dir.path(), env).map_err(err("app config"))?;
    let app = App::with_store(config, Arc::new(MemoryStore::new())).map_err(err("building the app"))?;
    let source =
        |name: &str| -> Result<_> { Ok(app.trigger(name).ok_or("a probe function was not loaded")?.source().clone()) };
    let (partition, whole) = (source("Partition")?, source("Whole")?);
    partition.validate().await.map_err(err("validating the partition's source"))?;
    whole.validate().await.map_err(err("validating the source"))?;

    // Positions at 10 % and 90 % of the partition's own rows, and of the whole table.
    let expression = partition_expression(FETCH_PARTITIONS);
    let in_partition: i64 = db
        .query_one(&format!("SELECT count(*) FROM public.orders WHERE {expression} = {index}"), &[])
        .await
        .map_err(err("counting the partition"))?
        .get(0);
    let position = |filter: String, offset: i64| {
        let db = &db;
        async move {
            let row = db
                .query_one(
                    &format!("SELECT version::text, id::text FROM public.orders {filter} ORDER BY version, id OFFSET $1 LIMIT 1"),
                    &[&offset],
                )
                .await
                .map_err(err("finding a position"))?;
            Ok::<Value, String>(json!([row.get::<_, String>(0), row.get::<_, String>(1)]))
        }
    };
    let filter = format!("WHERE {expression} = {index}");
    let p10 = position(filter.clone(), in_partition / 10).await?;
    let p90 = position(filter, in_partition * 9 / 10).await?;
    let w10 = position(String::new(), rows_n / 10).await?;
    let w90 = position(String::new(), rows_n * 9 / 10).await?;

    let time = |source: Arc<dyn sql_pseudo_trigger::source::Source>, at: Value, samples: usize| async move {
        let mut took = Vec::new();
        for _ in 0..samples {
            let started = Instant::now();
            let fetched = source.fetch(&at, BATCH as usize).await.map_err(err("fetch"))?;
            took.push(started.elapsed());
            if fetched.changes.len() != BATCH as usize {
                return Err(format!("a fetch returned {} changes, expected {BATCH}", fetched.changes.len()));
            }
        }
        Ok::<f64, String>(median(took))
    };
    let with = (
        time(partition.clone(), p10.clone(), FETCH_SAMPLES).await?,
        time(partition.clone(), p90.clone(), FETCH_SAMPLES).await?,
    );
    let unpartitioned =
        (time(whole.clone(), w10, FETCH_SAMPLES).await?, time(whole.clone(), w90, FETCH_SAMPLES).await?);
    db.batch_execute(&format!("DROP INDEX public.orders_partition_{FETCH_PARTITIONS}"))
        .await
        .map_err(err("dropping the partition index"))?;
    let without = (
        time(partition.clone(), p10, FETCH_SAMPLES_WITHOUT_INDEX).await?,
        time(partition, p90, FETCH_SAMPLES_WITHOUT_INDEX).await?,
    );
    let mut out = format!(
        "### A partition's fetch at 10 % and 90 % ({rows_n} orders, partition {index} of {FETCH_PARTITIONS}: {in_partition} rows; batch {BATCH}; `Source::fetch` of the release build, median)\n\n| fetch | at 10 % | at 90 % | 90 % / 10 % |\n|---|---:|---:|---:|\n"
    );
    for (label, (a, b)) in [
        ("partition, with the partition index", with),
        ("partition, without it (the `(version, id)` index only)", without),
        ("unpartitioned, for reference", unpartitioned),
    ] {
        out.push_str(&format!("| {label} | {a:.2} ms | {b:.2} ms | {:.2}× |\n", b / a));
    }
    out.push_str(&format!(
        "\nGoal (issue 23): a partition's fetch costs the same at 90 % as at 10 % (≤ 1.5×): {:.2}× ({}).\n",
        with.1 / with.0,
        if with.1 / with.0 <= 1.5 { "met" } else { "missed" }
    ));
    Ok(out)
}
