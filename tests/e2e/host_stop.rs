//! SIGTERM to `handler serve` (the mode the Functions host runs): once the invocation in flight has finished,
//! the process releases the lease of every function it holds, so the next instance goes on at once and
//! `handler partitions change` need not wait the leases out. A batch answered to the host and not yet proven
//! stays recorded in flight: the next process delivers it again, exactly as after the lease's expiry.

use crate::common::*;
use crate::operations::handler_cli;
use crate::partitions::{generate, index_ddl};
use serde_json::json;
use sql_pseudo_trigger::engine::document::StateDoc;
use sql_pseudo_trigger::state::StateStore;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

/// A lease far longer than any wait in these tests: a lease left live by the stop shows as a timeout.
const LONG_LEASE_MS: u64 = 120_000;

/// The state document at `key`, which must exist.
async fn doc_at(store: &impl StateStore, key: &str) -> StateDoc {
    let stored = store.load(key).await.expect("load").unwrap_or_else(|| panic!("{key} exists"));
    serde_json::from_slice(&stored.bytes).unwrap_or_else(|e| panic!("{key} is a state document: {e}"))
}

/// Whether `doc` has a lease that has not expired by the wall clock every process here shares.
fn leased(doc: &StateDoc) -> bool {
    doc.lease().is_some_and(|l| l.expires_at > time::OffsetDateTime::now_utc())
}

#[tokio::test]
async fn sigterm_under_the_host_releases_every_partition_lease_so_partitions_change_goes_on_at_once() {
    // GIVEN four partition functions under the host, each of which answered a batch under a long lease that the
    // host has not proven yet
    let orders = Orders::new("host-stop-partitions").await;
    orders.db.batch_execute(&index_ddl(4)).await.expect("create the partition index");
    let app_name = unique_app_name("host-stop-partitions");
    let app = orders_app(&orders, &app_name, json!({ "leaseDurationMs": LONG_LEASE_MS, "maxBatchSize": 5 }), &[]);
    generate(&app, 4);
    orders.insert(1..=40).await;
    let host = start(&app).await;
    let store = shared_blob_store();
    let key = |i: u32| format!("{app_name}/{FUNCTION}/partition-{i}-of-4.json");
    for i in 0..4 {
        fire_until_delivered(&host, &format!("{FUNCTION}-p{i}")).await;
        let doc = doc_at(&store, &key(i)).await;
        assert!(leased(&doc) && doc.in_flight().is_some(), "partition {i} answered under a live lease: {doc:?}");
    }

    // WHEN the handler gets SIGTERM
    let stopping = Instant::now();
    let status = host.terminate().await.expect("the handler stops");
    let stopped_in = stopping.elapsed();
    assert!(status.success(), "exit status {status:?}\n{}", host.output());

    // THEN changing to 8 partitions right away is made at the first attempt
    let args: Vec<String> = ["partitions", "change", FUNCTION, "--to", "8"].iter().map(|a| a.to_string()).collect();
    let output = handler_cli(app.root(), &args).await;
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "partitions change refused:\n{stderr}\n{stdout}");
    assert!(stdout.contains(&format!("{FUNCTION}: partition count changed from 4 to 8")), "{stdout}");
    assert_eq!(stdout.lines().filter(|l| l.ends_with("written")).count(), 8, "{stdout}");
    // AND no old partition is leased any more, and each still records the batch the host was answered (the new
    // partitions start at the checkpoints, so it is delivered again)
    for i in 0..4 {
        let doc = doc_at(&store, &key(i)).await;
        assert!(!leased(&doc), "partition {i}'s lease is released: {:?}\n{}", doc.lease(), host.output());
        assert!(doc.in_flight().is_some(), "partition {i}'s unproven batch stays recorded: {doc:?}");
    }
    eprintln!("SIGTERM to exit with 4 partition leases released: {stopped_in:?}");
}

#[tokio::test]
async fn sigterm_under_the_host_lets_the_next_process_go_on_at_once_re_delivering_only_the_unproven_batch() {
    // GIVEN a function under the host with a long lease, which answered two batches of 10 of 30 orders: the first
    // proven by the invocation that answered the second, the second not yet
    let orders = Orders::new("host-stop").await;
    let app_name = unique_app_name("host-stop");
    let app = orders_app(&orders, &app_name, json!({ "leaseDurationMs": LONG_LEASE_MS, "maxBatchSize": 10 }), &[]);
    orders.insert(1..=30).await;
    let host = start(&app).await;
    let first: BTreeSet<i64> = ids_of(&fire_until_delivered(&host, FUNCTION).await).into_iter().collect();
    let second: BTreeSet<i64> = ids_of(&fire_until_delivered(&host, FUNCTION).await).into_iter().collect();
    assert_eq!((first.len(), second.len(), first.is_disjoint(&second)), (10, 10, true), "{first:?} {second:?}");

    // WHEN the handler gets SIGTERM (the state document read as it left it)
    let status = host.terminate().await.expect("the handler stops");
    assert!(status.success(), "exit status {status:?}\n{}", host.output());
    let (stopped, _) = state(&shared_blob_store(), &app_name).await;

    // AND the next process starts and its timer fires
    host.restart().await.expect("the next process starts");
    let started = Instant::now();
    let counts = fire_until_all_delivered(&host, &ids(1..=30)).await;
    let took = started.elapsed();

    // THEN it goes on at once (`fire_until_all_delivered` waits at most 15 s, far within the lease), and the host
    // wrote every order once but those of the second batch, written again as nobody proved them: nothing lost,
    // nothing else repeated
    let expected: BTreeMap<i64, usize> = (1..=30).map(|id| (id, 1 + usize::from(second.contains(&id)))).collect();
    assert_eq!(counts, expected, "\n{}", host.output());
    // AND that is because the stopped process released its lease and left the second batch recorded in flight
    // (the host's write of it unproven: only that process's next invocation could have proven it)
    assert!(!leased(&stopped), "the lease is released: {:?}", stopped.lease());
    let flight = stopped.in_flight().unwrap_or_else(|| panic!("the second batch stays in flight: {stopped:?}"));
    assert_eq!(flight.range.rows, 10, "{flight:?}");
    eprintln!("the next process delivered everything {took:?} after it started");
}

#[tokio::test]
async fn sigterm_under_the_host_releases_the_lease_only_after_the_invocation_in_flight_answered() {
    // GIVEN a function under the host, and the host's retry of its first batch stuck in the batch's re-fetch
    // behind another session's lock on the table (on a private server: an open transaction holds back the guard
    // of every database in a cluster)
    let server = private_postgres().await;
    let url = testbed::embedded::create_database(&server.url(), "host_stop_drain").await.expect("database");
    let orders = Orders::on(url).await;
    orders.insert(1..=3).await;
    let app_name = unique_app_name("host-stop-drain");
    let app = orders_app(&orders, &app_name, json!({ "leaseDurationMs": LONG_LEASE_MS }), &[]);
    let host = Arc::new(start(&app).await);
    let first = invoke_until_answered(&host, FUNCTION).await;
    let locker = testbed::embedded::connect(&orders.url).await.expect("connect");
    locker.batch_execute("BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE").await.expect("lock");
    let retrying = {
        let (host, first) = (host.clone(), first.clone());
        tokio::spawn(async move { host.retry(FUNCTION, 1, &first).await })
    };
    let waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = 'orders'::regclass";
    poll_until("the retry waits for the lock", &host, async || {
        locker.query_one(waiting, &[]).await.expect("pg_locks").get::<_, i64>(0) > 0
    })
    .await;

    // WHEN SIGTERM arrives while the retry is in flight, and the lock is released once the handler is stopping
    let terminating = {
        let host = host.clone();
        tokio::spawn(async move { host.terminate().await })
    };
    poll_until("the handler is stopping", &host, async || host.output().contains("shutting down")).await;
    locker.batch_execute("COMMIT").await.expect("unlock");

    // THEN the retry is answered with the first batch again, and the process exits cleanly
    let answer = retrying.await.expect("join").expect("the retry in flight is answered");
    assert_eq!((answer.status, ids_of(&answered_changes(&answer))), (200, vec![1, 2, 3]), "{}", answer.body);
    let status = terminating.await.expect("join").expect("terminates");
    assert!(status.success(), "exit status {status:?}\n{}", host.output());
    // AND the lease that answer renewed was released after it: the batch is recorded in flight, its failed write
    // counted, and nobody holds it
    let (doc, _) = state(&shared_blob_store(), &app_name).await;
    assert!(!leased(&doc), "the lease is released: {:?}\n{}", doc.lease(), host.output());
    let flight = doc.in_flight().unwrap_or_else(|| panic!("the batch stays in flight: {doc:?}"));
    assert_eq!((flight.range.rows, flight.failures), (3, 1), "{flight:?}");
}

/// Polls `condition` every 20 ms until it holds, failing after 10 s with `what` and the handler's output.
async fn poll_until(what: &str, host: &testbed::driver::HostDriver, condition: impl AsyncFn() -> bool) {
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    while !condition().await {
        assert!(Instant::now() < deadline, "{what}: not within 10 s\n{}", host.output());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
