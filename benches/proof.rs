//! `cargo bench --bench proof` (or `scripts/bench proof`): what acknowledgement by proof costs, measured with the
//! real `handler` (release build), real PostgreSQL and Azurite, and the host model of `src/driver.rs` (retry
//! contexts naming the failed attempt, the policy's delay, manual runs outside the timer's lock).
//!
//! The quantities are counts, not times: changes per firing (the pace a timer allows), duplicates in a steady
//! run with failing writes and manual runs, and duplicates after a restart in the middle of a drain, with the
//! default proof window beside a zero window (the trade the setting makes). The function is the template's
//! (`function-templates/PgOrdersChanged`: batch 100, `fixedDelay` × 5) with the retry delay cut from 5 s to
//! 100 ms so the run takes seconds; the window is this repository's host.json's (`functionTimeout` 30 s):
//! 60.1 s. `cargo test --all-targets` runs this binary without `--bench`; it then does nothing.

#[allow(dead_code)]
#[path = "shared/host_app.rs"]
mod host_app;

use host_app::{insert, Result, Servers, FUNCTION};
use std::collections::BTreeMap;
use std::process::ExitCode;
use testbed::driver::{AttemptOutcome, HostDriver, TimerRun};

const BATCH: i64 = 100;

fn main() -> ExitCode {
    host_app::bench_main("proof", run)
}

/// The template function with a 100 ms retry delay, every 5 s; `window` sets the proof window. A restarted
/// process waits out the dead one's lease before it takes its batches over: one second here instead of 60.
async fn start(
    servers: &Servers,
    name: &str,
    window: Option<&str>,
) -> Result<(HostDriver, tokio_postgres::Client, testbed::embedded::ScratchDir)> {
    let mut settings = vec![("PgOrdersChanged_Schedule", "*/5 * * * * *"), ("Sql_Trigger_LeaseDurationMs", "1000")];
    if let Some(window) = window {
        settings.push(("Sql_Trigger_ProofWindowMs", window));
    }
    host_app::start(servers, name, "00:00:00.100", &settings).await
}

/// Times each id reached the queue.
fn tally(host: &HostDriver) -> BTreeMap<i64, usize> {
    let mut counts = BTreeMap::new();
    for m in host.delivered("changes") {
        if let Some(id) = m["Item"]["id"].as_i64() {
            *counts.entry(id).or_insert(0) += 1;
        }
    }
    counts
}

fn duplicates(counts: &BTreeMap<i64, usize>) -> usize {
    counts.values().map(|n| n - 1).sum()
}

fn written(run: &TimerRun) -> usize {
    run.applied.get("changes").map_or(0, Vec::len)
}

async fn run() -> Result<String> {
    let servers = Servers::start().await?;
    let mut rows = Vec::new();

    // 1. Pace and steady-state duplicates: a backlog of 3,000 drained by firings, a fifth of whose first writes
    //    fail, with a manual run between every few firings.
    let (host, db, _dir) = start(&servers, "pace", None).await?;
    insert(&db, 1..=3000).await?;
    let (mut firings, mut failed_writes, mut manual_runs, mut per_firing) = (0, 0, 0, Vec::new());
    while tally(&host).len() < 3000 && firings < 200 {
        if firings % 5 == 1 {
            host.fail_output_writes("changes", 1);
        }
        let run = host.run_timer(FUNCTION).await.map_err(|e| e.to_string())?;
        failed_writes +=
            run.attempts.iter().filter(|a| matches!(a.outcome, AttemptOutcome::OutputWriteFailed { .. })).count();
        per_firing.push(written(&run));
        firings += 1;
        if firings % 7 == 0 {
            host.run_manual(FUNCTION).await.map_err(|e| e.to_string())?;
            manual_runs += 1;
        }
    }
    let counts = tally(&host);
    let full = per_firing.iter().filter(|n| **n == BATCH as usize).count();
    rows.push(format!(
        "| pace: 3,000 changes, a write failure every 5th firing, a manual run every 7th | {firings} firings + {manual_runs} manual runs; {full} firings wrote a full batch of {BATCH}; {failed_writes} failed writes | {} | {} |",
        duplicates(&counts),
        3000 - counts.len()
    ));

    // 2. A restart (kill -9) in the middle of a drain, with the default window and with a zero window.
    for (label, window) in [("default (60.1 s)", None), ("0 (`Sql_Trigger_ProofWindowMs=0`)", Some("0"))] {
        let name = if window.is_some() { "restart_zero" } else { "restart_default" };
        let (host, db, _dir) = start(&servers, name, window).await?;
        insert(&db, 1..=2000).await?;
        let mut before = 0;
        while tally(&host).len() < 1000 {
            host.run_timer(FUNCTION).await.map_err(|e| e.to_string())?;
            before += 1;
        }
        host.restart().await.map_err(|e| e.to_string())?;
        let mut after = 0;
        while tally(&host).len() < 2000 && after < 400 {
            let run = host.run_timer(FUNCTION).await.map_err(|e| e.to_string())?;
            after += 1;
            if written(&run) == 0 {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
        let counts = tally(&host);
        rows.push(format!(
            "| restart (kill -9) after {before} firings (1,000 changes written), window {label} | {after} firings after the restart (the first ones wait out the lease) | {} | {} |",
            duplicates(&counts),
            2000 - counts.len()
        ));
    }

    Ok(format!("| scenario | firings | duplicates | lost |\n|---|---|---:|---:|\n{}", rows.join("\n")))
}
