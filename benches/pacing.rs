//! `cargo bench --bench pacing` (or `scripts/bench pacing`): delivery under the host, as opposed to handler
//! capacity. The release `handler`, real PostgreSQL and Azurite, the template function (deferred delivery, a
//! queue output, `fixedDelay` × 5), and the host model firing it on its NCRONTAB schedule the way the timer
//! listener does (one firing at a time, the next occurrence after each firing; `testbed::driver::schedule`),
//! on a simulated clock: ten minutes of firings take only the time their invocations take.
//!
//! For each schedule and batch size: changes written to the queue per second of host time, beside the
//! ceiling the schedule allows (batch × firings per second) and the time the handler spent per firing, so
//! what limits delivery is visible: the schedule, not the handler. The backlog is larger than ten minutes can
//! deliver, so every firing has a full batch to answer. `cargo test --all-targets` runs this binary without
//! `--bench`; it then does nothing.

#[allow(dead_code)]
#[path = "shared/host_app.rs"]
mod host_app;

use host_app::{insert, Result, Servers, FUNCTION};
use sql_pseudo_trigger::config::ncrontab::Schedule;
use std::process::ExitCode;
use std::time::Duration;

/// Simulated host time per scenario.
const SPAN: Duration = Duration::from_secs(600);

fn main() -> ExitCode {
    host_app::bench_main("pacing", run)
}

/// One scenario: a schedule, a batch size, and the label of the row.
struct Scenario {
    label: &'static str,
    schedule: &'static str,
    batch: u64,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn run() -> Result<String> {
    let servers = Servers::start().await?;
    let scenarios = [
        Scenario { label: "the templates' defaults before issue 23", schedule: "*/5 * * * * *", batch: 100 },
        Scenario { label: "every second: the templates' defaults now", schedule: "* * * * * *", batch: 100 },
        Scenario { label: "every second, batch 1000", schedule: "* * * * * *", batch: 1000 },
        Scenario { label: "every five seconds, batch 1000", schedule: "*/5 * * * * *", batch: 1000 },
    ];
    let mut rows = Vec::new();
    for (i, s) in scenarios.iter().enumerate() {
        let from = time::macros::datetime!(2026-01-01 00:00:00);
        let firings_per_second = Schedule::parse(s.schedule)?.firings_per_second(from);
        let ceiling = s.batch as f64 * firings_per_second;
        let backlog = (ceiling * SPAN.as_secs_f64() * 1.1) as i64;
        let batch = s.batch.to_string();
        let name = format!("pacing_{i}");
        let settings = [("PgOrdersChanged_Schedule", s.schedule), ("Sql_Trigger_MaxBatchSize", batch.as_str())];
        let (host, db, _dir) = host_app::start(&servers, &name, "00:00:05", &settings).await?;
        for chunk in (1..=backlog).step_by(50_000) {
            insert(&db, chunk..=(chunk + 49_999).min(backlog)).await?;
        }
        let start = time::OffsetDateTime::now_utc().replace_nanosecond(0).map_err(|e| e.to_string())?;
        let started = std::time::Instant::now();
        let paced = host.run_schedule(FUNCTION, start, SPAN, |_| false).await.map_err(|e| e.to_string())?;
        let wall = started.elapsed();
        let mut took: Vec<Duration> = paced.firings.iter().map(|f| f.took).collect();
        took.sort_unstable();
        let failed = paced.firings.iter().filter(|f| !f.run.succeeded).count();
        let rate = paced.per_second("changes");
        let p50 = percentile(&took, 0.5);
        rows.push(format!(
            "| {} (`{}`, batch {}) | {} | {} | **{:.1}** | {:.1} | {:.1} ms | {:.2} % | {} | {:.1} s |",
            s.label,
            s.schedule,
            s.batch,
            paced.firings.len(),
            paced.written("changes"),
            rate,
            ceiling,
            p50.as_secs_f64() * 1000.0,
            p50.as_secs_f64() * firings_per_second * 100.0,
            failed,
            wall.as_secs_f64(),
        ));
        host.kill();
    }
    Ok(format!(
        "| schedule and batch | firings in 10 min | changes written | changes/s under the host | ceiling (batch × firings/s) | handler time per firing (p50) | share of the period the handler works | failed firings | wall time of the run |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n{}",
        rows.join("\n")
    ))
}
