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
    doc.lease.as_ref().is_some_and(|l| l.expires_at > time::OffsetDateTime::now_utc())
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
        assert!(leased(&doc) && doc.in_flight.is_some(), "partition {i} answered under a live lease: {doc:?}");
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
        assert!(!leased(&doc), "partition {i}'s lease is released: {:?}\n{}", doc.lease, host.output());
        assert!(doc.in_flight.is_some(), "partition {i}'s unproven batch stays recorded: {doc:?}");
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
    assert!(!leased(&stopped), "the lease is released: {:?}", stopped.lease);
    let flight = stopped.in_flight.as_ref().unwrap_or_else(|| panic!("the second batch stays in flight: {stopped:?}"));
    assert_eq!(flight.range.rows, 10, "{flight:?}");
    eprintln!("the next process delivered everything {took:?} after it started");
}
