//! Two handler processes sharing one state document, fired at the same time over and over while orders are
//! inserted: the scale-out the lease and the compare-and-swap commits exist for. Each process is driven the
//! way its own host would drive it (one firing at a time, with retries), and the two hosts race each other.

use crate::common::*;
use serde_json::json;
use sql_pseudo_trigger::state::StateStore;
use std::time::{Duration, Instant};
use testbed::driver::{AttemptOutcome, HostDriver};

const ROUNDS: usize = 100;
const INSERTING_ROUNDS: usize = 80;
const MAX_BATCH_SIZE: u64 = 5;
const TAKEOVER_ROUND: usize = 50;

#[tokio::test]
async fn two_processes_fired_concurrently_deliver_every_row_and_never_move_the_checkpoint_back() {
    // GIVEN two handler processes on one app (batches of at most 5, leases of 1 s) and one state document
    let orders = Orders::new("concurrency").await;
    let app_name = unique_app_name("concurrency");
    let app = orders_app(
        &orders,
        &app_name,
        json!({"maxBatchSize": MAX_BATCH_SIZE}),
        &[("Sql_Trigger_LeaseDurationMs", "1000")],
    );
    let (p1, p2) = tokio::join!(start(&app), start(&app));
    let store = shared_blob_store();
    let mut next_id = 1;
    let mut checkpoint = position(&serde_json::Value::Null);
    let mut token = 0;

    // WHEN both are fired at once 100 times while orders are inserted, and each host's queue write fails now
    // and then (one injected failure at a time per host, so that every firing succeeds on its first retry)
    let mut failing = [false, false];
    let mut injected = 0;
    for round in 0..ROUNDS {
        for (i, host) in [&p1, &p2].into_iter().enumerate() {
            if round % 10 == 3 + 5 * i && !failing[i] {
                host.fail_output_writes("changes", 1);
                failing[i] = true;
                injected += 1;
            }
        }
        if round == TAKEOVER_ROUND {
            // Half-way, the host of whichever process holds the batch in flight stops firing until the other
            // process takes the batch over (its lease lapses), then both race again: the takeover and the
            // stale owner's return happen under concurrency, not only in the failure-matrix test.
            take_over_the_batch_in_flight(&store, &app_name, [&p1, &p2]).await;
        }
        let first = next_id;
        if round < INSERTING_ROUNDS {
            next_id += 3;
        }
        let (r1, r2, ()) = tokio::join!(p1.run_timer(FUNCTION), p2.run_timer(FUNCTION), async {
            if first < next_id {
                orders.insert(first..next_id).await;
            }
        });
        for (i, host, run) in [(0, &p1, r1), (1, &p2, r2)] {
            let run = run.expect("timer run");
            let outcome = run.attempts.last().map(|a| &a.outcome);
            assert!(run.succeeded, "process {}, round {round}: {outcome:?}\n{}", i + 1, host.output());
            if run.attempts.iter().any(|a| matches!(a.outcome, AttemptOutcome::OutputWriteFailed { .. })) {
                failing[i] = false;
            }
        }

        // THEN after every round the checkpoint is where it was or further, and the fencing token never shrinks
        if let Some((doc, _)) = load_state(&store, &app_name).await {
            let now = position(doc.checkpoint());
            assert!(now >= checkpoint, "round {round}: the checkpoint went back from {checkpoint:?} to {now:?}");
            checkpoint = now;
            let now = doc.lease().map_or(0, |l| l.token);
            assert!(now >= token, "round {round}: the fencing token went back from {token} to {now}");
            token = now;
        }
    }
    let all = ids(1..=next_id - 1);
    let deadline = Instant::now() + Duration::from_secs(15);
    let doc = loop {
        let mut written = p1.delivered("changes");
        written.extend(p2.delivered("changes"));
        let (doc, _) = state(&store, &app_name).await;
        if tally(&written).0.is_superset(&all) && doc.in_flight().is_none() {
            break doc;
        }
        assert!(Instant::now() < deadline, "not all delivered and acknowledged within 15 s: {doc:?}");
        let (r1, r2) = tokio::join!(p1.run_timer(FUNCTION), p2.run_timer(FUNCTION));
        assert!(r1.expect("timer run").succeeded && r2.expect("timer run").succeeded);
    };

    // AND every order was written, and acknowledged exactly once
    let mut written = p1.delivered("changes");
    written.extend(p2.delivered("changes"));
    let (seen, counts) = tally(&written);
    assert_eq!(seen, all);
    assert_eq!(doc.counters().delivered, all.len() as u64, "{:?}", doc.counters());
    assert!(injected >= 4, "only {injected} write failures were injected");
    // AND both processes took part, one taking over the other's batch
    assert!(!p1.delivered("changes").is_empty() && !p2.delivered("changes").is_empty());
    assert!(doc.counters().takeovers >= 1, "{:?}", doc.counters());
    // AND every duplicate comes from a re-delivery (a retry after the injected failures, or a takeover), and
    // a re-delivery repeats at most one batch
    let duplicates = written.len() - all.len();
    let bound = doc.counters().redelivered * MAX_BATCH_SIZE;
    assert!(duplicates as u64 <= bound, "{duplicates} duplicates, more than {bound}: {counts:?} {:?}", doc.counters());
    assert_eq!(position(doc.checkpoint()), checkpoint.max(position(doc.checkpoint())));
}

/// Fires only the process that does not hold the batch in flight until it has taken it over, for at most 10 s.
/// A process's lease owner id carries its pid.
async fn take_over_the_batch_in_flight(store: &dyn StateStore, app_name: &str, processes: [&HostDriver; 2]) {
    let owner_pid = |owner: &str| owner.split('-').rev().nth(1).and_then(|pid| pid.parse::<u32>().ok());
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut holder = None;
    loop {
        let (doc, _) = state(store, app_name).await;
        let owner = doc.in_flight().and_then(|f| owner_pid(&f.owner));
        match (holder, owner) {
            (Some(old), Some(new)) if new != old => return,
            (None, Some(pid)) => holder = Some(pid),
            _ => {}
        }
        assert!(Instant::now() < deadline, "no takeover within 10 s: {doc:?}");
        // Until a batch is in flight, both fire; then only the one that does not hold it.
        for host in processes {
            if holder.is_none() || host.pid() != holder {
                let run = host.run_timer(FUNCTION).await.expect("timer run");
                assert!(run.succeeded, "{:?}\n{}", run.attempts.last().map(|a| &a.outcome), host.output());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
