//! `handler run --once` drains to the position the source had when it started: an empty tick ends a drain
//! only once the source has passed it (src/runner/drain.rs). Real binary, real PostgreSQL, state in Azurite.

use crate::common::*;
use crate::logical::{logical_app, Db, ORDERS};
use crate::runner::Runner;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// Runs `handler run --once` to its exit (at most two minutes) and answers its status and stdout lines.
async fn run_drain(app: &crate::support::AppFolder) -> (std::process::ExitStatus, Vec<Value>, String) {
    let mut runner = Runner::start(app, &["--once"]);
    let status = runner.exit(Duration::from_secs(120)).await;
    let lines = runner
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    (status, lines, runner.stderr())
}

#[tokio::test]
async fn run_once_after_wal_written_elsewhere_delivers_every_row_present_at_its_start() {
    // GIVEN a logical function at the default streamPollMs whose slot exists (a first drain, with nothing to
    // deliver, created it), then 64 MB of WAL written to another table and 3 rows inserted after it
    let db = Db::shared("drain_logical", ORDERS).await;
    let (app, _) = logical_app(&db, "public.orders", json!({}), &[]);
    let (status, lines, stderr) = run_drain(&app).await;
    assert!(status.success() && lines.is_empty(), "the first drain ({status}): {lines:?}\n{stderr}");
    db.unrelated_wal(64).await;
    db.insert(1..=3).await;

    // WHEN one `handler run --once` runs
    let (status, lines, stderr) = run_drain(&app).await;

    // THEN it exits 0 having delivered each of the 3 rows exactly once: the stream read past the 64 MB first
    assert!(status.success(), "handler run --once failed ({status}):\n{stderr}");
    let counts: BTreeMap<i64, usize> = tally(&lines).1;
    assert_eq!(counts, BTreeMap::from([(1, 1), (2, 1), (3, 1)]), "{lines:?}\n{stderr}");
    assert!(stderr.contains("drained: passed the source's position at the start"), "{stderr}");
}
