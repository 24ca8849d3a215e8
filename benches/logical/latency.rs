//! Delivery latency under the host's timer (issue 24): a writer commits `BENCH_LOGICAL_LATENCY_RATE` (500)
//! changes per second into the watched table for `BENCH_LOGICAL_LATENCY_SECONDS` (600) real seconds, while the
//! host model fires the function on its NCRONTAB schedule `*/1 * * * * *` on the wall clock
//! (`HostDriver::run_schedule_real`: one firing at a time, the next occurrence after each, retries slept), with
//! `maxBatchSize` 1000 and the shipped defaults otherwise (the template's function.json, this repository's
//! host.json, so deferred delivery's proof window; the logical source's stream reader).
//!
//! Per change: from the moment the writer's `INSERT` (its own transaction, 10 rows) returned from COMMIT to the
//! moment the host model received the answer that carries it (the request's send time plus its round trip; the
//! model's output writes come after). Real time on both sides, one process, one monotonic clock: a simulated
//! clock would make the figure meaningless. The delivered set is checked exactly: every id once, as an insert.
//!
//! With `BENCH_LOGICAL_LATENCY_CURSOR=1` (the default) the cursor source runs beside it on the same schedule, in
//! its own database with its own writer at the same rate, in the same handler: both timers fire on the same
//! second, so each run shares the machine with the other.

use crate::host_app::Result;
use crate::{database, err, percentile, Knobs, PUBLICATION};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use testbed::driver::{DriverOptions, HostDriver, Paced};
use testbed::embedded::{self, Azurite, EmbeddedPostgres, ScratchDir};

const SCHEDULE: &str = "*/1 * * * * *";
const BATCH: u64 = 1000;
/// Rows per writer transaction.
const PER_TX: i64 = 10;
/// Firings after the writer stops, so the last commits are delivered.
const TAIL_FIRINGS: u64 = 5;

/// One source's run: what the writer committed and what the host received.
struct Measured {
    label: &'static str,
    /// When each of the writer's transactions returned from COMMIT (transaction k holds ids 10k+1 ..= 10k+10).
    commits: Vec<Instant>,
    writer_seconds: f64,
    paced: Paced,
}

/// Runs the writers and the timers, and reports.
pub async fn run(knobs: &Knobs, postgres: &EmbeddedPostgres, azurite: &Azurite) -> Result<String> {
    let load_before = load_average();
    let mut sources: Vec<(&'static str, &'static str, Value)> = Vec::new();
    let mut env = vec![
        ("AzureWebJobsStorage".to_string(), azurite.connection_string()),
        ("Sql_Trigger_StateStore".to_string(), "blob".to_string()),
        ("Sql_Trigger_AppName".to_string(), "bench-latency".to_string()),
        ("RUST_BACKTRACE".to_string(), "0".to_string()),
        ("PgOrdersChanged_Schedule".to_string(), SCHEDULE.to_string()),
    ];
    let logical_url = database(postgres, "latency_logical").await?;
    let db = embedded::connect(&logical_url).await.map_err(err("connecting"))?;
    db.batch_execute(&format!("CREATE PUBLICATION {PUBLICATION} FOR TABLE public.orders"))
        .await
        .map_err(err("creating the publication"))?;
    env.push(("LatencyLogicalDb".to_string(), logical_url.clone()));
    sources.push((
        "LatencyLogical",
        "`postgres-logical` (stream), shipped defaults",
        json!({
            "source": "postgres-logical",
            "tableName": "public.orders",
            "connectionStringSetting": "LatencyLogicalDb",
            "slotName": "bench_latency",
            "publicationName": PUBLICATION,
            "maxBatchSize": BATCH,
        }),
    ));
    let mut urls = vec![logical_url];
    if knobs.latency_cursor {
        let cursor_url = database(postgres, "latency_cursor").await?;
        env.push(("LatencyCursorDb".to_string(), cursor_url.clone()));
        sources.push((
            "LatencyCursor",
            "`postgres-cursor`, shipped defaults",
            json!({
                "source": "postgres-cursor",
                "tableName": "public.orders",
                "connectionStringSetting": "LatencyCursorDb",
                "cursorColumn": "version",
                "insertedColumn": "created_version",
                "softDeleteColumn": "deleted",
                "maxBatchSize": BATCH,
            }),
        ));
        urls.push(cursor_url);
    }
    let app = app_folder(&sources)?;
    let mut options = DriverOptions::new(app.path(), &knobs.handler);
    options.env = env;
    let host = HostDriver::start(options).await.map_err(err("starting the handler"))?;
    // The first tick creates the logical slot (changes before it are not read), and starts the cursor.
    for (function, _, _) in &sources {
        crate::invoke_until_empty(&host, function).await?;
    }

    let span = Duration::from_secs(knobs.latency_seconds);
    let firings = usize::try_from(knobs.latency_seconds + TAIL_FIRINGS).map_err(err("firings"))?;
    eprintln!(
        "logical: latency: {} s of writing at {} changes/s, {firings} firings on `{SCHEDULE}`, batch {BATCH}: {}",
        knobs.latency_seconds,
        knobs.latency_rate,
        sources.iter().map(|s| s.0).collect::<Vec<_>>().join(", ")
    );
    let started = Instant::now();
    let writers: Vec<_> = urls.iter().map(|url| tokio::spawn(writer(url.clone(), knobs.latency_rate, span))).collect();
    let sampler = tokio::spawn(async move {
        let mut samples = Vec::new();
        while started.elapsed() < span {
            tokio::time::sleep(Duration::from_secs(15)).await;
            samples.push(load_average().split_whitespace().next().and_then(|l| l.parse::<f64>().ok()).unwrap_or(0.0));
        }
        samples
    });
    let timers = futures::future::join_all(sources.iter().map(|(f, _, _)| host.run_schedule_real(f, firings))).await;
    let wall = started.elapsed();
    let mut measured = Vec::new();
    for ((writer, paced), (function, label, _)) in writers.into_iter().zip(timers).zip(&sources) {
        let (commits, writer_seconds) = writer.await.map_err(err("the writer"))??;
        let paced = paced.map_err(|e| format!("{function}: the timer: {e}"))?;
        measured.push(Measured { label, commits, writer_seconds, paced });
    }
    let samples = sampler.await.map_err(err("the load sampler"))?;
    host.kill();
    let load_after = load_average();
    Ok(report(knobs, &measured, wall, (&load_before, &load_after), &samples))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default()
}

/// This repository's host.json; per source the template's function.json (its schedule setting is `*/1`).
fn app_folder(sources: &[(&'static str, &'static str, Value)]) -> Result<ScratchDir> {
    let dir = ScratchDir::new("bench-latency").map_err(err("creating the app folder"))?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(root.join("host.json"), dir.path().join("host.json")).map_err(err("copying host.json"))?;
    let function = std::fs::read(root.join("function-templates/PgOrdersChanged/function.json"))
        .map_err(err("reading the template's function.json"))?;
    for (name, _, trigger) in sources {
        let folder = dir.path().join(name);
        std::fs::create_dir_all(&folder).map_err(err("creating a function folder"))?;
        std::fs::write(folder.join("function.json"), &function).map_err(err("writing function.json"))?;
        std::fs::write(folder.join("sqltrigger.json"), trigger.to_string()).map_err(err("writing sqltrigger.json"))?;
    }
    Ok(dir)
}

/// Commits `PER_TX` new rows per transaction on a fixed timetable (`rate` changes per second; a late
/// transaction goes at once, the timetable is not shifted) for `span`. Returns when each transaction's COMMIT
/// returned, and the seconds the writing took.
async fn writer(url: String, rate: u64, span: Duration) -> Result<(Vec<Instant>, f64)> {
    let db = embedded::connect(&url).await.map_err(err("connecting the writer"))?;
    let insert = db
        .prepare(
            "INSERT INTO public.orders (id, customer, amount)
             SELECT g, 'customer-' || (g % 1000), (g % 100000) / 100.0 FROM generate_series($1::int8, $2::int8) g",
        )
        .await
        .map_err(err("preparing the writer's INSERT"))?;
    let period = Duration::from_secs_f64(PER_TX as f64 / rate as f64);
    let transactions = (span.as_secs_f64() / period.as_secs_f64()).round() as u64;
    let start = tokio::time::Instant::now();
    let mut commits = Vec::with_capacity(transactions as usize);
    for k in 0..transactions {
        tokio::time::sleep_until(start + period.mul_f64(k as f64)).await;
        let lo = k as i64 * PER_TX + 1;
        db.execute(&insert, &[&lo, &(lo + PER_TX - 1)]).await.map_err(err("the writer's INSERT"))?;
        commits.push(Instant::now());
    }
    Ok((commits, start.elapsed().as_secs_f64()))
}

/// One source's figures.
struct Figures {
    committed: u64,
    delivered: u64,
    duplicates: u64,
    missing: u64,
    unexpected: u64,
    /// Changes delivered in an answer received before the writer saw its COMMIT return (counted as 0 ms).
    early: u64,
    latencies: Vec<Duration>,
    firings: usize,
    failed: usize,
    largest_answer: usize,
    took: Vec<Duration>,
}

fn figures(m: &Measured) -> Figures {
    let committed = m.commits.len() as u64 * PER_TX as u64;
    let mut seen: BTreeMap<i64, u64> = BTreeMap::new();
    let (mut latencies, mut unexpected, mut early, mut failed, mut largest) = (Vec::new(), 0u64, 0u64, 0, 0);
    for firing in &m.paced.firings {
        if !firing.run.succeeded {
            failed += 1;
            continue;
        }
        let Some(answer) = firing.run.last_invocation() else { continue };
        let answered = answer.sent_at + answer.elapsed;
        let changes = firing.run.applied.get("changes").map_or(&[][..], Vec::as_slice);
        largest = largest.max(changes.len());
        for change in changes {
            let id = change["Item"]["id"].as_i64().unwrap_or(0);
            let insert = change["Operation"].as_i64() == Some(0);
            let tx = usize::try_from((id - 1) / PER_TX).ok().filter(|_| id >= 1);
            let Some(committed_at) = tx.and_then(|t| m.commits.get(t)).filter(|_| insert) else {
                unexpected += 1;
                continue;
            };
            *seen.entry(id).or_default() += 1;
            latencies.push(answered.checked_duration_since(*committed_at).unwrap_or_else(|| {
                early += 1;
                Duration::ZERO
            }));
        }
    }
    latencies.sort_unstable();
    let mut took: Vec<Duration> = m.paced.firings.iter().map(|f| f.took).collect();
    took.sort_unstable();
    let duplicates = seen.values().map(|n| n - 1).sum();
    let missing = committed - seen.len() as u64;
    Figures {
        committed,
        delivered: latencies.len() as u64,
        duplicates,
        missing,
        unexpected,
        early,
        latencies,
        firings: m.paced.firings.len(),
        failed,
        largest_answer: largest,
        took,
    }
}

fn report(knobs: &Knobs, measured: &[Measured], wall: Duration, load: (&str, &str), samples: &[f64]) -> String {
    let first_three = |s: &str| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    let max_sample = samples.iter().copied().fold(0.0, f64::max);
    let min_sample = samples.iter().copied().fold(f64::INFINITY, f64::min);
    let mut out = format!(
        "Delivery latency under the host's timer: {} s of writing at {} changes/s ({PER_TX} rows per transaction), the host model firing `{SCHEDULE}` on the wall clock {} times per function, batch {BATCH}, shipped defaults otherwise; {:.0} s wall in all. Load average {} before, {} after, 1-minute average sampled every 15 s during the run {:.2}–{:.2} ({} CPU(s)).\n\n",
        knobs.latency_seconds,
        knobs.latency_rate,
        knobs.latency_seconds + TAIL_FIRINGS,
        wall.as_secs_f64(),
        first_three(load.0),
        first_three(load.1),
        if samples.is_empty() { 0.0 } else { min_sample },
        max_sample,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    out.push_str("| source | committed (writer's rate) | delivered | duplicates | missing | unexpected | commit → answer p50 | p99 | max | firings (failed) | largest answer | firing p50 / p99 (HTTP, handler, model's writes) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    let ms = |d: &[Duration], p: f64| format!("{:.0} ms", percentile(d, p));
    let mut verdicts = Vec::new();
    for m in measured {
        let f = figures(m);
        out.push_str(&format!(
            "| {} | {} ({:.1}/s) | {} | {} | {} | {} | **{}** | **{}** | {} | {} ({}) | {} | {:.0} / {:.0} ms |\n",
            m.label,
            f.committed,
            f.committed as f64 / m.writer_seconds,
            f.delivered,
            f.duplicates,
            f.missing,
            f.unexpected,
            ms(&f.latencies, 0.5),
            ms(&f.latencies, 0.99),
            ms(&f.latencies, 1.0),
            f.firings,
            f.failed,
            f.largest_answer,
            percentile(&f.took, 0.5),
            percentile(&f.took, 0.99),
        ));
        let exact = f.duplicates == 0 && f.missing == 0 && f.unexpected == 0 && f.delivered == f.committed;
        verdicts.push(format!(
            "{}: {}{}",
            m.label,
            if exact { "every id exactly once, as an insert" } else { "NOT exact (see the row)" },
            if f.early > 0 {
                format!("; {} changes answered before the writer saw COMMIT return (counted as 0 ms)", f.early)
            } else {
                String::new()
            }
        ));
    }
    out.push_str(&format!("\nChecked: {}.\n", verdicts.join("; ")));
    out
}
