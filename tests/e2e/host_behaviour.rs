//! What the real Functions host does that a kinder driver would not, through the real `handler` on real
//! PostgreSQL and Azurite (shared/reference/functions-custom-handler.md has the sources):
//! - a `RetryContext` on every attempt, each retry naming the attempt that failed, after the policy's delay;
//! - manual runs (portal Test/Run, `POST /admin/functions/{name}`) at any moment, during a retry delay too;
//! - an output binding's service down for several firings, and a message its destination always refuses;
//! - anything that is not an invocation refused before any state is read.

use crate::common::*;
use crate::support;
use serde_json::{json, Value};
use sql_pseudo_trigger::state::StateStore;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::driver::{AttemptOutcome, HostDriver, TimerRun};
use testbed::embedded::Azurite;

/// splitmix64, seeded per test: the moments and faults are random but a failure can be replayed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

fn seed() -> u64 {
    std::env::var("SPT_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        let seed =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(7, |d| d.as_nanos() as u64);
        eprintln!("seed {seed} (replay with SPT_SEED={seed})");
        seed
    })
}

/// The answered-then-failed windows of a firing: from each failed attempt's answer to the next attempt.
fn retry_delays(run: &TimerRun) -> Vec<(Instant, Instant)> {
    let sent: Vec<_> = run.attempts.iter().filter_map(|a| a.invocation.as_ref()).collect();
    sent.windows(2).map(|pair| (pair[0].sent_at + pair[0].elapsed, pair[1].sent_at)).collect()
}

/// Attempts answered with changes on the host's final attempt: their failure would go unreported, so the
/// handler delivers them again (the one legitimate source of a duplicate in a run without restarts or
/// partial writes).
fn final_answers(runs: &[TimerRun]) -> usize {
    runs.iter()
        .flat_map(|r| &r.attempts)
        .filter(|a| a.retry.as_ref().is_some_and(|r| r.is_final()))
        .filter(|a| a.invocation.as_ref().is_some_and(|i| !answered_changes(i).is_empty()))
        .count()
}

#[tokio::test]
async fn manual_runs_at_random_moments_during_retry_delays_lose_nothing_while_orders_keep_coming() {
    // GIVEN a function in batches of 5 with a proof window of one second (longer than the 100 ms retry delay,
    // as the default is longer than the host's), and a writer adding 200 orders in small transactions
    let mut rng = Rng(seed());
    let orders = Arc::new(Orders::new("manual_runs").await);
    let app_name = unique_app_name("manual");
    let window = [("Sql_Trigger_ProofWindowMs", "1000")];
    let app = orders_app(&orders, &app_name, json!({ "maxBatchSize": 5 }), &window);
    let host = Arc::new(start(&app).await);
    let total = 200;
    let writer = tokio::spawn({
        let orders = orders.clone();
        let mut rng = Rng(rng.below(u64::MAX));
        async move {
            let mut id = 1;
            while id <= total {
                let last = (id + rng.below(3) as i64).min(total);
                orders.insert(id..=last).await;
                id = last + 1;
                tokio::time::sleep(Duration::from_millis(5 + rng.below(20))).await;
            }
        }
    });

    // WHEN manual runs come at random moments while the timer fires, and a third of the writes fail
    let stop = Arc::new(AtomicBool::new(false));
    let manual_runs = Arc::new(Mutex::new(Vec::new()));
    let manual = tokio::spawn({
        let (host, stop, manual_runs) = (host.clone(), stop.clone(), manual_runs.clone());
        let mut rng = Rng(rng.below(u64::MAX));
        async move {
            while !stop.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10 + rng.below(90))).await;
                let run = host.run_manual(FUNCTION).await.expect("a manual run");
                manual_runs.lock().expect("runs").push(run);
            }
        }
    });
    let mut timer_runs = Vec::new();
    while !writer.is_finished() || timer_runs.len() < 40 {
        if rng.below(3) == 0 {
            host.fail_output_writes("changes", 1);
        }
        timer_runs.push(host.run_timer(FUNCTION).await.expect("a firing"));
        tokio::time::sleep(Duration::from_millis(rng.below(30))).await;
    }
    writer.await.expect("the writer");
    stop.store(true, Ordering::SeqCst);
    manual.await.expect("the manual runs");
    let counts = fire_until_all_delivered(&host, &ids(1..=total)).await;

    // THEN every order reached the queue
    assert_nothing_lost(&counts, &ids(1..=total), &BTreeSet::new());
    // AND manual runs really came during retry delays, and failures really happened
    let manual_runs = std::mem::take(&mut *manual_runs.lock().expect("runs"));
    let delays: Vec<(Instant, Instant)> = timer_runs.iter().flat_map(retry_delays).collect();
    let during = manual_runs
        .iter()
        .filter_map(|r| r.attempts.first()?.invocation.as_ref())
        .filter(|i| delays.iter().any(|(from, to)| i.sent_at > *from && i.sent_at < *to))
        .count();
    let failed = timer_runs
        .iter()
        .chain(&manual_runs)
        .flat_map(|r| &r.attempts)
        .filter(|a| matches!(a.outcome, AttemptOutcome::OutputWriteFailed { .. }))
        .count();
    assert!(failed > 0 && !delays.is_empty(), "no write failed: nothing was tested");
    assert!(
        during > 0,
        "no manual run came during a retry delay ({} manual runs): nothing was tested",
        manual_runs.len()
    );
    // AND a change came twice only where an answer went out on a final attempt (its failure unreported)
    let duplicates: usize = counts.values().map(|n| n - 1).sum();
    let finals = final_answers(&timer_runs) + final_answers(&manual_runs);
    assert!(duplicates <= 5 * finals, "{duplicates} duplicates, {finals} final answers");
    eprintln!(
        "{} firings, {} manual runs ({during} during a retry delay), {failed} failed writes, {duplicates} duplicates",
        timer_runs.len(),
        manual_runs.len()
    );
}

#[tokio::test]
async fn a_queue_down_for_several_firings_quarantines_nothing_and_loses_nothing() {
    // GIVEN the shipped poison rule (MaxAttempts 5, PoisonAfterMs 10 min), a policy of 3 retries, and orders
    let orders = Orders::new("queue_down").await;
    let app_name = unique_app_name("queue-down");
    let app = orders_app(&orders, &app_name, json!({}), &[]);
    let host = start(&app).await;
    orders.insert(1..=10).await;

    // WHEN the queue refuses every write for three whole firings: 12 failed attempts, more than MaxAttempts
    // (a firing that finds nothing yet writes nothing and consumes no failure)
    host.fail_output_writes("changes", 12);
    let (mut failed_firings, deadline) = (0, Instant::now() + Duration::from_secs(10));
    while failed_firings < 3 {
        let run = host.run_timer(FUNCTION).await.expect("a firing");
        if run.succeeded {
            assert!(run.applied.is_empty(), "{:?}", run.applied);
        } else {
            assert_eq!(run.attempt_count(), 4, "{:?}", run.attempts);
            failed_firings += 1;
        }
        assert!(Instant::now() < deadline, "the orders never became visible");
    }

    // THEN nothing was quarantined, and once the queue is back every order arrives exactly once
    let counts = fire_until_all_delivered(&host, &ids(1..=10)).await;
    assert_nothing_lost(&counts, &ids(1..=10), &BTreeSet::new());
    let store = shared_blob_store();
    assert!(store.list(&quarantine_prefix(&app_name)).await.expect("list").is_empty());
    let (doc, _) = state(&store, &app_name).await;
    assert_eq!(doc.counters().quarantined, 0);
}

#[tokio::test]
async fn a_message_the_queue_always_refuses_is_quarantined_in_bounded_time_and_later_orders_flow() {
    // GIVEN batches of 5, MaxAttempts 3 lasting 1.5 s, and a queue that refuses order 13's message every time
    let orders = Orders::new("always_fails").await;
    let app_name = unique_app_name("always");
    let poison = [("Sql_Trigger_MaxAttempts", "3"), ("Sql_Trigger_PoisonAfterMs", "1500")];
    let app = orders_app(&orders, &app_name, json!({ "maxBatchSize": 5 }), &poison);
    let host = start(&app).await;
    host.refuse_messages("changes", |m| m["Item"]["id"] == json!(13));
    orders.insert(1..=20).await;

    // WHEN the timer keeps firing
    let store = shared_blob_store();
    let started = Instant::now();
    let mut firings = 0;
    while store.list(&quarantine_prefix(&app_name)).await.expect("list").is_empty() {
        host.run_timer(FUNCTION).await.expect("a firing");
        firings += 1;
        assert!(started.elapsed() < Duration::from_secs(20), "not quarantined after {firings} firings");
    }

    // THEN the batch holding order 13 (orders 11-15) is quarantined once its failures lasted 1.5 s
    let elapsed = started.elapsed();
    let keys = store.list(&quarantine_prefix(&app_name)).await.expect("list");
    assert_eq!(keys.len(), 1, "{keys:?}");
    let bytes = store.load(&keys[0]).await.expect("load").expect("the document").bytes;
    let quarantined: sql_pseudo_trigger::engine::document::QuarantineDoc = serde_json::from_slice(&bytes).expect("doc");
    let changes: Vec<Value> = serde_json::from_str(quarantined.changes.get()).expect("changes");
    assert_eq!(ids_of(&changes), vec![11, 12, 13, 14, 15]);
    assert!(quarantined.failures >= 3, "{}", quarantined.failures);
    assert!(elapsed >= Duration::from_millis(1500), "quarantined after {elapsed:?}, before the poison duration");
    // AND every other order arrives, and later orders flow
    orders.insert(21..=25).await;
    let expected: BTreeSet<i64> = (1..=25).filter(|id| !(11..=15).contains(id)).collect();
    let counts = fire_until_all_delivered(&host, &expected).await;
    assert!(!counts.contains_key(&13), "the refused message never reached the queue");
    eprintln!("quarantined after {firings} firings, {elapsed:?}");
}

/// Bodies and requests the host never sends. The first four were decoded as invocations before the strict
/// decoder (a JSON array read as a struct's fields; a `RetryContext` array read as a retry).
fn hostile_requests() -> Vec<(&'static str, Option<&'static str>, Vec<u8>)> {
    const ID: Option<&str> = Some("5d3f3c2e-41b4-4c1a-9d0e-2b7c6a1f9e10");
    let retry = |context: Value| {
        serde_json::to_vec(&json!({"Data": {"timer": {"IsPastDue": false}}, "Metadata": {"RetryContext": context}}))
            .expect("JSON")
    };
    vec![
        ("an empty array", ID, b"[]".to_vec()),
        ("an array holding an invocation", ID, br#"[{"Data":{"timer":{}},"Metadata":{}}]"#.to_vec()),
        ("a RetryContext that is an array", ID, retry(json!([1, 3]))),
        ("a RetryCount that is a string", ID, retry(json!({"RetryCount": "1", "MaxRetryCount": 3}))),
        ("no RetryContext under a retry policy", ID, br#"{"Data":{"timer":{}},"Metadata":{}}"#.to_vec()),
        ("another policy's MaxRetryCount", ID, retry(json!({"RetryCount": 0, "MaxRetryCount": 9}))),
        ("a retry past its policy", ID, retry(json!({"RetryCount": 4, "MaxRetryCount": 3, "Exception": {}}))),
        ("a retry without its exception", ID, retry(json!({"RetryCount": 1, "MaxRetryCount": 3}))),
        ("a timer that is a string", ID, br#"{"Data":{"timer":"now"},"Metadata":{}}"#.to_vec()),
        ("no timer", ID, br#"{"Data":{},"Metadata":{"RetryContext":{"RetryCount":0,"MaxRetryCount":3}}}"#.to_vec()),
        ("Data an array", ID, br#"{"Data":[],"Metadata":{}}"#.to_vec()),
        ("null", ID, b"null".to_vec()),
        ("truncated JSON", ID, b"{\"Data\":{\"timer\":".to_vec()),
        ("not UTF-8", ID, vec![0xc3, 0x28, 0xa0, 0xa1]),
        ("no invocation id", None, retry(json!({"RetryCount": 0, "MaxRetryCount": 3}))),
        ("an invocation id that is no GUID", Some("42"), retry(json!({"RetryCount": 0, "MaxRetryCount": 3}))),
    ]
}

#[tokio::test]
async fn anything_that_is_not_an_invocation_is_refused_before_any_state_is_read() {
    // GIVEN orders waiting, and the state store down: a request that read the state would fail with a 500
    let azurite = private_azurite().await;
    let cs = azurite.connection_string();
    let orders = Orders::new("hostile_table").await;
    let app = orders_app(&orders, &unique_app_name("hostile"), json!({}), &[("AzureWebJobsStorage", &cs)]);
    let host = start(&app).await;
    orders.insert(1..=6).await;
    let azurite = on_server(azurite, "stop Azurite", Azurite::stop).await;

    // WHEN each request the host never sends arrives
    for (what, id, body) in hostile_requests() {
        let (status, answer) = post(&host, id, body).await;
        // THEN it is refused with a 400 that says what is wrong, without touching the state store
        assert_eq!(status, 400, "{what}: {answer}");
        let message = serde_json::from_str::<Value>(&answer).expect("JSON")["error"].as_str().map(str::to_string);
        assert!(message.as_deref().is_some_and(|m| !m.contains("state store")), "{what}: {answer}");
    }
    // AND a real invocation does reach the state store (here: down), which shows the 400s never did
    let real = host.invoke(FUNCTION, None).await.expect("invoke");
    assert_eq!(real.status, 500, "{}", real.body);
    assert!(real.body.contains("state store"), "{}", real.body);

    // WHEN the store is back THEN normal invocations deliver every order, once
    let _azurite = on_server(azurite, "start Azurite again", Azurite::start_again).await;
    let counts = fire_until_all_delivered(&host, &ids(1..=6)).await;
    assert_nothing_lost(&counts, &ids(1..=6), &BTreeSet::new());
}

async fn post(host: &HostDriver, id: Option<&str>, body: Vec<u8>) -> (u16, String) {
    let mut request = support::http_client().post(format!("{}/{FUNCTION}", host.base_url())).body(body);
    if let Some(id) = id {
        request = request.header("X-Azure-Functions-InvocationId", id);
    }
    let response = request.send().await.expect("the handler answers");
    (response.status().as_u16(), response.text().await.unwrap_or_default())
}

#[tokio::test]
async fn on_the_hosts_schedule_each_firing_delivers_one_batch_and_a_backlog_drains_at_the_schedules_pace() {
    // GIVEN 1,050 orders and a function like the templates: batch 100, fired every five seconds (their schedule
    // before issue 23)
    let orders = Orders::new("schedule").await;
    orders.insert(1..=1050).await;
    let app = orders_app(&orders, &unique_app_name("schedule"), json!({}), &[]);
    let host = start(&app).await;
    let start_at = time::macros::datetime!(2026-11-25 10:00:00 UTC);

    // WHEN the host's timer fires it for two simulated minutes
    let paced = host.run_schedule(FUNCTION, start_at, Duration::from_secs(120), |_| false).await.expect("runs");

    // THEN it fired every five seconds, the first eleven firings delivered the backlog in batches of 100 (the last
    // one the remaining 50) and the rest found nothing: 1,050 changes in 55 seconds of host time, the pace the
    // schedule allows (20 per second), every order exactly once
    let expected_at: Vec<_> = (1..=24).map(|k| start_at + Duration::from_secs(5 * k)).collect();
    assert_eq!(paced.firings.iter().map(|f| f.at).collect::<Vec<_>>(), expected_at);
    let per_firing: Vec<usize> =
        paced.firings.iter().map(|f| f.run.applied.get("changes").map_or(0, Vec::len)).collect();
    assert_eq!(per_firing[..11], [100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 50]);
    assert!(per_firing[11..].iter().all(|n| *n == 0), "{per_firing:?}");
    let (delivered, counts) = tally(&host.delivered("changes"));
    assert_eq!(delivered, ids(1..=1050));
    assert!(counts.values().all(|n| *n == 1), "no duplicate without a failure");
}
