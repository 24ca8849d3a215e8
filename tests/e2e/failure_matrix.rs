//! The failure matrix (cases A-I of the semantics document), end to end: the real `handler`, real PostgreSQL,
//! real Azurite. Each test names its case, breaks the run exactly where the case says, and then asserts the
//! exact multiset of ids that reached the host's output binding: every committed row at least once, and every
//! duplicate inside the case's documented window.
//!
//! Where a case needs the host to do something the driver's `run_timer` cannot (apply part of a batch, lose an
//! answer, retry after the test changed a row), the test plays the host by hand with `invoke` and keeps its
//! own record of what the host wrote.

use crate::common::*;
use serde_json::{json, Value};
use sql_pseudo_trigger::engine::document::QuarantineDoc;
use sql_pseudo_trigger::failpoint;
use sql_pseudo_trigger::state::StateStore;
use std::collections::BTreeMap;
use testbed::driver::AttemptOutcome;
use testbed::embedded::{self, Azurite};

/// How many times each id was written: the host's sink as the consumer sees it.
fn counts(messages: &[Value]) -> BTreeMap<i64, usize> {
    tally(messages).1
}

/// `ids` each written exactly `n` times.
fn each(ids: impl IntoIterator<Item = i64>, n: usize) -> BTreeMap<i64, usize> {
    ids.into_iter().map(|id| (id, n)).collect()
}

fn merged(parts: &[BTreeMap<i64, usize>]) -> BTreeMap<i64, usize> {
    let mut all = BTreeMap::new();
    for part in parts {
        for (id, n) in part {
            *all.entry(*id).or_insert(0) += n;
        }
    }
    all
}

#[tokio::test]
async fn case_a_handler_failure_redelivers_the_batch() {
    // GIVEN three orders, and a host whose next write to the `changes` queue fails
    let orders = Orders::new("case_a").await;
    let app_name = unique_app_name("case-a");
    let app = orders_app(&orders, &app_name, json!({}), &[]);
    let host = start(&app).await;
    let store = shared_blob_store();
    orders.insert(1..=3).await;
    host.fail_output_writes("changes", 1);

    // WHEN the timer fires
    let run = fire_until_answered(&host, FUNCTION).await;

    // THEN the first attempt's write failed, the host retried with a RetryContext, and the retry carried the
    // identical batch, which the host wrote
    assert!(run.succeeded, "{:?}", run.attempts.last().map(|a| &a.outcome));
    assert_eq!(run.attempt_count(), 2, "{:?}", run.attempts);
    assert!(matches!(run.attempts[0].outcome, AttemptOutcome::OutputWriteFailed { .. }), "{:?}", run.attempts[0]);
    let first = run.attempts[0].invocation.as_ref().expect("an answer");
    let retry = run.attempts[1].invocation.as_ref().expect("an answer");
    assert_eq!(run.attempts[1].retry.as_ref().map(|r| r.retry_count), Some(1));
    assert_eq!(ids_of(&answered_changes(first)), vec![1, 2, 3]);
    assert_eq!(retry.outputs["changes"], first.outputs["changes"]);
    assert!(retry.logs.iter().any(|l| l.contains("re-delivering batch 1")), "{:?}", retry.logs);
    // AND the checkpoint did not move: batch 1 is in flight with one known failure
    let (doc, _) = state(&store, &app_name).await;
    assert!(doc.checkpoint().is_null(), "{:?}", doc.checkpoint());
    let flight = doc.in_flight().expect("batch 1 in flight");
    assert_eq!((flight.range.batch_id, flight.deliveries, flight.failures), (1, 2, 1));

    // WHEN a later firing finds a new order
    orders.insert([4]).await;
    let next = fire_until_delivered(&host, FUNCTION).await;

    // THEN batch 1 was acknowledged by it, and every order reached the queue exactly once
    assert_eq!(ops(&next), vec![(0, 4)]);
    assert_eq!(counts(&host.delivered("changes")), each(1..=4, 1));
    let (doc, _) = state(&store, &app_name).await;
    assert_eq!((doc.counters().batches, doc.counters().delivered, doc.counters().redelivered), (1, 3, 1));
}

#[tokio::test]
async fn case_b_handler_success_then_commit_failure_loses_nothing() {
    // GIVEN a private Azurite as the state store, and batch 1 (orders 1-3) answered and written by the host:
    // the handler succeeded, and its acknowledgement is the next invocation's commit
    let azurite = private_azurite().await;
    let cs = azurite.connection_string();
    let store = blob_store(&cs);
    let orders = Orders::new("case_b").await;
    let app_name = unique_app_name("case-b");
    let app = orders_app(&orders, &app_name, json!({}), &[("AzureWebJobsStorage", &cs)]);
    let host = start(&app).await;
    orders.insert(1..=3).await;
    let batch_1 = fire_until_delivered(&host, FUNCTION).await;
    assert_eq!(ids_of(&batch_1), vec![1, 2, 3]);
    let (before, etag_before) = state(&store, &app_name).await;
    assert_eq!(before.in_flight().map(|f| f.range.batch_id), Some(1));

    // WHEN the state store goes down before the next invocation, which would acknowledge batch 1 and deliver
    // orders 4-5 in one commit
    let azurite = on_server(azurite, "stop Azurite", Azurite::stop).await;
    orders.insert(4..=5).await;
    let failed = host.invoke(FUNCTION, None).await.expect("invoke");

    // THEN it fails with a 500 that names the state store, the document, and that nothing committed is lost
    assert_eq!(failed.status, 500, "{}", failed.body);
    let body: Value = serde_json::from_str(&failed.body).expect("a JSON error");
    let message = body["error"].as_str().expect("an error message");
    assert!(message.starts_with("state store: the state store is unavailable"), "{message}");
    assert!(message.contains(&state_key(&app_name)), "{message}");
    assert!(message.contains("nothing committed is lost"), "{message}");

    // WHEN the state store comes back and the host retries the failed invocation, naming it
    let _azurite = on_server(azurite, "start Azurite again", Azurite::start_again).await;
    let (after, etag_after) = state(&store, &app_name).await;
    let retry = host.retry(FUNCTION, 1, &failed).await.expect("invoke");

    // THEN the failed commit had changed nothing, and the retry, whose failed attempt carried no batch (the
    // handler's own error), is no evidence against batch 1: it delivers orders 4-5, and nothing is repeated
    assert_eq!((after, etag_after), (before, etag_before));
    assert_eq!(retry.status, 200, "{}", retry.body);
    assert_eq!(ids_of(&answered_changes(&retry)), vec![4, 5]);
    let mut written = host.delivered("changes");
    written.extend(written_by_host(&host, &retry));
    drain(&host, 5).await;
    written.extend(host.delivered("changes").into_iter().skip(3));
    assert_eq!(counts(&written), each(1..=5, 1));
    let (doc, _) = state(&store, &app_name).await;
    assert_eq!((doc.counters().redelivered, doc.counters().quarantined), (0, 0));
}

#[tokio::test]
async fn case_c_a_commit_attempt_after_lease_loss_cannot_acknowledge_over_the_new_owner() {
    // GIVEN two handler processes on one app and one state document: process 1 holds a batch for 1 s (the
    // shortest lease), process 2 for 60 s, so process 2's lease cannot lapse while the test looks at it
    let orders = Orders::new("case_c").await;
    let app_name = unique_app_name("case-c");
    let app = orders_app(&orders, &app_name, json!({}), &[("Sql_Trigger_LeaseDurationMs", "1000")]);
    let p1 = start(&app).await;
    let p2 = app.start_handler(&[("Sql_Trigger_LeaseDurationMs", "60000")]).await;
    let store = shared_blob_store();
    orders.insert(1..=3).await;

    // AND process 1 answered batch 1 (orders 1-3) and its host wrote it
    assert_eq!(ids_of(&fire_until_delivered(&p1, FUNCTION).await), vec![1, 2, 3]);
    let (doc, _) = state(&store, &app_name).await;
    let p1_lease = doc.lease().cloned().expect("process 1's lease");

    // WHEN process 1's lease expires before its next invocation (waited for on the state document: the
    // takeover below depends on exactly that condition, so polling it cannot race)
    wait_until_lease_expired(&store, &app_name).await;
    // AND process 2 fires
    let takeover = fire_until_answered(&p2, FUNCTION).await;

    // THEN process 2 re-delivers batch 1, whose outcome it cannot know, under a new owner and fencing token
    assert!(takeover.succeeded, "{:?}", takeover.attempts.last().map(|a| &a.outcome));
    let answer = takeover.last_invocation().expect("an answer");
    assert_eq!(ids_of(&answered_changes(answer)), vec![1, 2, 3]);
    assert!(
        answer.logs.iter().any(|l| l.contains("re-delivering batch 1") && l.contains(&p1_lease.owner)),
        "{:?}",
        answer.logs
    );
    let (doc, etag) = state(&store, &app_name).await;
    let lease = doc.lease().cloned().expect("process 2's lease");
    assert_ne!(lease.owner, p1_lease.owner);
    assert_eq!((lease.token, doc.counters().takeovers), (p1_lease.token + 1, 1));
    assert!(doc.checkpoint().is_null(), "{:?}", doc.checkpoint());

    // WHEN process 1, which answered batch 1 and still remembers it, gets its next (non-retry) invocation
    let stale = p1.run_timer(FUNCTION).await.expect("timer run");

    // THEN it neither acknowledges batch 1 nor writes anything over process 2's document
    assert!(stale.succeeded && stale.applied.is_empty(), "{:?}", stale.applied);
    let logs = &stale.last_invocation().expect("an answer").logs;
    assert!(logs.iter().any(|l| l.contains(&format!("belongs to {}", lease.owner))), "{logs:?}");
    assert_eq!(state(&store, &app_name).await.1, etag, "process 1 wrote the state document");

    // WHEN process 2 fires again with order 4 waiting
    orders.insert([4]).await;
    assert_eq!(ops(&fire_until_delivered(&p2, FUNCTION).await), vec![(0, 4)]);

    // THEN batch 1 was acknowledged by its new owner, every order was written, and the only duplicates are
    // batch 1's re-delivery by the new owner
    let written = merged(&[counts(&p1.delivered("changes")), counts(&p2.delivered("changes"))]);
    assert_eq!(written, merged(&[each(1..=3, 2), each([4], 1)]));
    let (doc, _) = state(&store, &app_name).await;
    assert_eq!((doc.counters().batches, doc.counters().delivered), (1, 3));
}

#[tokio::test]
async fn case_d_a_row_updated_after_its_fetch_is_redelivered_only_in_its_latest_state() {
    let orders = Orders::new("case_d").await;
    let app = orders_app(&orders, &unique_app_name("case-d"), json!({}), &[]);
    let host = start(&app).await;
    orders.insert(1..=3).await;

    // GIVEN batch 1 (orders 1-3) answered, and the host's write of it failed
    let first = invoke_until_answered(&host, FUNCTION).await;
    assert_eq!(ids_of(&answered_changes(&first)), vec![1, 2, 3]);
    // AND order 2 updated after it was fetched
    orders.set_amount(2, "99.99").await;

    // WHEN the host retries, naming the attempt whose write failed
    let retry = host.retry(FUNCTION, 1, &first).await.expect("invoke");

    // THEN the re-delivery holds the rows of batch 1's range as they are now: order 2 has left the range
    // (its cursor moved past it), so no stale version of it is sent
    assert_eq!(retry.status, 200, "{}", retry.body);
    assert_eq!(ops(&answered_changes(&retry)), vec![(0, 1), (0, 3)]);
    assert!(retry.logs.iter().any(|l| l.contains("re-delivering batch 1 with 2 change(s)")), "{:?}", retry.logs);
    let mut written = written_by_host(&host, &retry); // the host wrote the retry's answer

    // WHEN the next firings come
    let later = fire_until_delivered(&host, FUNCTION).await;
    drain(&host, 5).await;

    // THEN order 2 arrives once, in its latest state. It is an Update: its insert position lies inside the
    // acknowledged range, so the source cannot tell the consumer never saw the insert (an upsert handles it).
    assert_eq!(ops(&later), vec![(1, 2)]);
    assert_eq!(later[0]["Item"]["amount"].to_string(), "99.99");
    written.extend(host.delivered("changes"));
    assert_eq!(counts(&written), each(1..=3, 1));
    assert!(
        written.iter().all(|m| m["Item"]["id"] != json!(2) || m["Item"]["amount"] == json!(99.99)),
        "a stale version of order 2 was written: {written:?}"
    );
}

#[tokio::test]
async fn case_e_a_crash_after_fetch_before_the_answer_delivers_the_batch_after_restart() {
    let orders = Orders::new("case_e").await;
    let app_name = unique_app_name("case-e");
    let app = orders_app(&orders, &app_name, json!({}), &[]);
    let store = shared_blob_store();

    // GIVEN a handler that aborts (as under kill -9) right after it fetches changes, before committing
    let crashing = app.start_handler(&[(failpoint::ENV, "after-fetch")]).await;
    orders.insert(1..=3).await;

    // WHEN the timer fires
    let error = invoke_until_no_answer(&crashing).await;

    // THEN the invocation gets no answer, so the host writes nothing, and the process is gone
    assert!(error.contains("got no HTTP answer"), "{error}");
    wait_until_exited(&crashing).await;
    assert!(crashing.output().contains("failpoint after-fetch hit"), "{}", crashing.output());
    // AND nothing was committed: no batch in flight, the checkpoint where it was
    if let Some((doc, _)) = load_state(&store, &app_name).await {
        assert!(doc.in_flight().is_none() && doc.checkpoint().is_null(), "{doc:?}");
    }

    // WHEN the handler is started again without the crash point and the timer fires
    let host = start(&app).await;
    let batch = fire_until_delivered(&host, FUNCTION).await;
    drain(&host, 5).await;

    // THEN the same rows are delivered, as a fresh batch, each exactly once
    assert_eq!(ids_of(&batch), vec![1, 2, 3]);
    assert!(crashing.delivered("changes").is_empty());
    assert_eq!(counts(&host.delivered("changes")), each(1..=3, 1));
}

#[tokio::test]
async fn case_f_a_batch_partly_written_before_a_failure_is_redelivered_whole() {
    let orders = Orders::new("case_f").await;
    let app = orders_app(&orders, &unique_app_name("case-f"), json!({}), &[("Sql_Trigger_LeaseDurationMs", "1000")]);
    let host = start(&app).await;
    // What reached the queue, as the consumer sees it: partial writes by hand, then the driver's writes.
    let mut written: Vec<Value> = Vec::new();

    // GIVEN batch 1 (orders 1-4) answered, of which the host wrote two messages before its write failed
    orders.insert(1..=4).await;
    let failed = invoke_until_answered(&host, FUNCTION).await;
    let first = answered_changes(&failed);
    assert_eq!(ids_of(&first), vec![1, 2, 3, 4]);
    written.extend_from_slice(&written_by_host(&host, &failed)[..2]);

    // WHEN the host retries, naming the failed attempt
    let retry = host.retry(FUNCTION, 1, &failed).await.expect("invoke");

    // THEN the whole batch comes again, not just the unwritten half
    assert_eq!(answered_changes(&retry), first);
    written.extend(written_by_host(&host, &retry));

    // GIVEN batch 2 (orders 5-8) answered by the next invocation (which acknowledged batch 1), of which the host
    // wrote two messages before the handler process died (kill -9)
    orders.insert(5..=8).await;
    let second = invoke_until_answered(&host, FUNCTION).await;
    assert_eq!(ids_of(&answered_changes(&second)), vec![5, 6, 7, 8]);
    written.extend_from_slice(&written_by_host(&host, &second)[..2]);
    host.kill();

    // WHEN the handler restarts (a new owner) and the timer fires
    host.restart().await.expect("restart");
    let run = fire_until_answered(&host, FUNCTION).await;

    // THEN once the dead process's lease lapses, batch 2 is re-delivered whole
    assert!(run.succeeded);
    assert_eq!(ids_of(&run.applied["changes"]), vec![5, 6, 7, 8]);
    let logs = &run.last_invocation().expect("an answer").logs;
    assert!(logs.iter().any(|l| l.contains("re-delivering batch 2")), "{logs:?}");
    drain(&host, 5).await;

    // AND every order was written; the only duplicates are the partly written messages
    written.extend(host.delivered("changes"));
    assert_eq!(counts(&written), merged(&[each(1..=2, 2), each(3..=4, 1), each(5..=6, 2), each(7..=8, 1)]));
}

#[tokio::test]
async fn case_g_an_ambiguous_commit_is_redelivered_not_acknowledged() {
    let orders = Orders::new("case_g").await;
    let app_name = unique_app_name("case-g");
    let app = orders_app(&orders, &app_name, json!({}), &[("Sql_Trigger_LeaseDurationMs", "1000")]);
    let store = shared_blob_store();

    // GIVEN a handler that aborts right after its commit recorded a batch in flight, before answering: the
    // commit took effect, but nobody heard back (a commit whose response timed out)
    let crashing = app.start_handler(&[(failpoint::ENV, "after-commit")]).await;
    orders.insert(1..=3).await;

    // WHEN the timer fires
    let error = invoke_until_no_answer(&crashing).await;

    // THEN the host got no answer, and the state says batch 1 is in flight, not acknowledged
    assert!(error.contains("got no HTTP answer"), "{error}");
    wait_until_exited(&crashing).await;
    assert!(crashing.output().contains("failpoint after-commit hit"), "{}", crashing.output());
    let (doc, _) = state(&store, &app_name).await;
    assert!(doc.checkpoint().is_null(), "{:?}", doc.checkpoint());
    let flight = doc.in_flight().cloned().expect("batch 1 in flight");
    assert_eq!((flight.range.batch_id, flight.range.rows, flight.deliveries, doc.counters().batches), (1, 3, 1, 0));

    // WHEN a new handler process starts and the timer fires
    let host = start(&app).await;
    let run = fire_until_answered(&host, FUNCTION).await;

    // THEN it resolves the ambiguity by reloading the state: batch 1 is re-delivered, not acknowledged
    assert!(run.succeeded, "{:?}", run.attempts.last().map(|a| &a.outcome));
    let answer = run.last_invocation().expect("an answer");
    assert!(answer.logs.iter().any(|l| l.contains("re-delivering batch 1")), "{:?}", answer.logs);
    assert_eq!(ids_of(&run.applied["changes"]), vec![1, 2, 3]);
    let (doc, _) = state(&store, &app_name).await;
    assert!(doc.checkpoint().is_null(), "acknowledged without proof: {:?}", doc.checkpoint());
    assert_eq!(doc.in_flight().map(|f| (f.range.batch_id, f.deliveries)), Some((1, 2)));

    // AND after the next firing acknowledges it, every order was written exactly once
    drain(&host, 5).await;
    assert_eq!(counts(&host.delivered("changes")), each(1..=3, 1));
    let (doc, _) = state(&store, &app_name).await;
    assert_eq!((doc.counters().batches, doc.counters().delivered), (1, 3));
    assert_eq!(position(doc.checkpoint()).1, 3);
}

#[tokio::test]
async fn case_h_a_stale_owner_whose_lease_lapsed_mid_tick_is_refused_by_cas_and_the_new_owner_redelivers() {
    // A private PostgreSQL: the test holds a table lock in an open transaction, which on the shared server
    // would hold back every other test's deliveries (the xid8 guard waits for the oldest transaction).
    let server = private_postgres().await;
    let url = embedded::create_database(&server.url(), "case_h").await.expect("database");
    let orders = Orders::on(url).await;
    let app_name = unique_app_name("case-h");
    let app = orders_app(&orders, &app_name, json!({}), &[("Sql_Trigger_LeaseDurationMs", "1000")]);
    let p1 = start(&app).await;
    let p2 = app.start_handler(&[("Sql_Trigger_LeaseDurationMs", "60000")]).await;
    let store = shared_blob_store();

    // GIVEN process 1 answered batch 1 (orders 1-3), its host wrote it, and order 4 is waiting
    orders.insert(1..=3).await;
    assert_eq!(ids_of(&fire_until_delivered(&p1, FUNCTION).await), vec![1, 2, 3]);
    orders.insert([4]).await;
    let p1_pid = p1.pid().expect("process 1 runs");

    // AND process 1's next tick, working from the state it wrote last, is stuck in its fetch behind a table lock
    let locker = embedded::connect(&orders.url).await.expect("connect");
    locker.batch_execute("BEGIN; LOCK TABLE orders IN ACCESS EXCLUSIVE MODE").await.expect("lock");
    let (stale, takeover) = tokio::join!(p1.invoke(FUNCTION, None), async {
        wait_for_a_lock_waiter(&orders.db).await;
        // WHEN process 1 freezes there (the lease has no heartbeat: it simply runs out) and the lock goes away
        signal(p1_pid, "STOP");
        locker.batch_execute("COMMIT").await.expect("unlock");
        // AND its lease lapses, and process 2 takes batch 1 over and its host writes the re-delivery
        wait_until_lease_expired(&store, &app_name).await;
        let takeover = fire_until_answered(&p2, FUNCTION).await;
        // AND process 1 wakes up and finishes its tick: acknowledge batch 1, deliver order 4
        signal(p1_pid, "CONT");
        takeover
    });

    // THEN process 2 re-delivered batch 1
    assert!(takeover.succeeded, "{:?}", takeover.attempts.last().map(|a| &a.outcome));
    assert_eq!(ids_of(&takeover.applied["changes"]), vec![1, 2, 3]);
    // AND process 1's commit was refused (the etag it wrote is gone): it read the state again, found batch 1
    // under process 2's lease and answered an empty batch
    let stale = stale.expect("process 1 answers");
    assert_eq!(stale.status, 200, "{}", stale.body);
    assert!(answered_changes(&stale).is_empty(), "{}", stale.body);
    assert!(
        stale.logs.iter().any(|l| l.contains("the state changed since this process last wrote it")),
        "{:?}",
        stale.logs
    );
    assert!(stale.logs.iter().any(|l| l.contains("batch in flight belongs to")), "{:?}", stale.logs);
    // AND the document is still process 2's: batch 1 in flight under the higher fencing token, not acknowledged
    let (doc, etag) = state(&store, &app_name).await;
    let lease = doc.lease().cloned().expect("a lease");
    assert_eq!(doc.in_flight().map(|f| (f.range.batch_id, f.owner.clone())), Some((1, lease.owner.clone())));
    assert_eq!((lease.token, doc.counters().takeovers), (2, 1));
    assert!(doc.checkpoint().is_null(), "{:?}", doc.checkpoint());

    // WHEN process 1 fires again, still remembering that it answered batch 1
    let again = p1.run_timer(FUNCTION).await.expect("timer run");
    // THEN it stays off process 2's batch and writes nothing
    assert!(again.succeeded && again.applied.is_empty(), "{:?}", again.applied);
    assert_eq!(state(&store, &app_name).await.1, etag);

    // WHEN process 2 fires
    assert_eq!(ops(&fire_until_delivered(&p2, FUNCTION).await), vec![(0, 4)]);
    // THEN every order was written; the only duplicates are batch 1's re-delivery by the new owner
    let written = merged(&[counts(&p1.delivered("changes")), counts(&p2.delivered("changes"))]);
    assert_eq!(written, merged(&[each(1..=3, 2), each([4], 1)]));
}

#[tokio::test]
async fn case_i_a_poison_batch_is_quarantined_and_later_rows_flow() {
    let orders = Orders::new("case_i").await;
    let app_name = unique_app_name("case-i");
    // The count alone decides here (no poison duration): the duration is `outages.rs`'s subject.
    let poison = [("Sql_Trigger_MaxAttempts", "2"), ("Sql_Trigger_PoisonAfterMs", "0")];
    let app = orders_app(&orders, &app_name, json!({}), &poison);
    let host = start(&app).await;
    let store = shared_blob_store();

    // GIVEN orders 1-3, and a host that fails to write them every time (two attempts: MaxAttempts)
    orders.insert(1..=3).await;
    host.fail_output_writes("changes", 2);

    // WHEN the timer fires
    let run = fire_until_answered(&host, FUNCTION).await;

    // THEN after the second known failure the batch is quarantined, and the firing ends with nothing to write
    let outcomes: Vec<_> = run.attempts.iter().map(|a| &a.outcome).collect();
    assert_eq!(run.attempt_count(), 3, "{outcomes:?}");
    assert!(run.succeeded && run.applied.is_empty(), "{outcomes:?}");
    let key = format!("{}{:020}.json", quarantine_prefix(&app_name), 1);
    let logs = &run.last_invocation().expect("an answer").logs;
    assert!(logs.iter().any(|l| l.contains("quarantined 3 change(s)") && l.contains(&key)), "{logs:?}");
    // AND the quarantine document holds exactly that batch's changes
    assert_eq!(store.list(&quarantine_prefix(&app_name)).await.expect("list"), vec![key.clone()]);
    let bytes = store.load(&key).await.expect("load").expect("the quarantine document").bytes;
    let quarantined: QuarantineDoc = serde_json::from_slice(&bytes).expect("a quarantine document");
    let changes: Vec<Value> = serde_json::from_str(quarantined.changes.get()).expect("changes");
    assert_eq!((quarantined.batch_id, quarantined.failures), (1, 2));
    assert_eq!(ops(&changes), vec![(0, 1), (0, 2), (0, 3)]);
    // AND the checkpoint passed it, which the state document records
    let (doc, _) = state(&store, &app_name).await;
    assert!(doc.in_flight().is_none(), "{:?}", doc.in_flight());
    assert_eq!(*doc.checkpoint(), quarantined.to);
    assert_eq!((doc.counters().quarantined, doc.quarantine().len()), (1, 1));

    // WHEN new orders arrive
    orders.insert(4..=5).await;
    let later = fire_until_delivered(&host, FUNCTION).await;
    drain(&host, 5).await;

    // THEN they flow, and every order is either written once or held in quarantine
    assert_eq!(ids_of(&later), vec![4, 5]);
    assert_eq!(counts(&host.delivered("changes")), each(4..=5, 1));
}

#[tokio::test]
async fn case_i_with_poison_action_halt_the_function_stops_at_the_poison_batch() {
    let orders = Orders::new("case_i_halt").await;
    let app_name = unique_app_name("case-i-halt");
    let settings =
        [("Sql_Trigger_MaxAttempts", "2"), ("Sql_Trigger_PoisonAction", "halt"), ("Sql_Trigger_PoisonAfterMs", "0")];
    let app = orders_app(&orders, &app_name, json!({}), &settings);
    let host = start(&app).await;
    let store = shared_blob_store();

    // GIVEN orders 1-3, and a host that fails to write them every time
    orders.insert(1..=3).await;
    host.fail_output_writes("changes", 2);

    // WHEN the timer fires
    let run = fire_until_answered(&host, FUNCTION).await;

    // THEN at the second known failure the function halts: the rest of the firing's attempts fail, naming it
    assert!(!run.succeeded);
    let failed: Vec<&str> = run
        .attempts
        .iter()
        .filter_map(|a| match &a.outcome {
            AttemptOutcome::HandlerFailed { reason } => Some(reason.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(failed.len(), 2, "{:?}", run.attempts);
    assert!(failed.iter().all(|r| r.contains("500") && r.contains("Sql_Trigger_PoisonAction=halt")), "{failed:?}");

    // WHEN new orders arrive and the timer keeps firing
    orders.insert(4..=5).await;
    for _ in 0..3 {
        let invocation = host.invoke(FUNCTION, None).await.expect("invoke");
        // THEN every invocation fails with a message naming the halt, the batch and what to do
        assert_eq!(invocation.status, 500, "{}", invocation.body);
        let body: Value = serde_json::from_str(&invocation.body).expect("a JSON error");
        let message = body["error"].as_str().expect("an error message");
        assert!(message.contains(&format!("function {FUNCTION} is halted")), "{message}");
        assert!(message.contains("batch 1 failed 2 time(s)"), "{message}");
    }

    // AND nothing was written, nothing quarantined, and the batch waits in flight for an operator
    assert!(host.delivered("changes").is_empty());
    assert!(store.list(&quarantine_prefix(&app_name)).await.expect("list").is_empty());
    let (doc, _) = state(&store, &app_name).await;
    assert!(doc.halted().is_some_and(|h| h.contains("halt")), "{:?}", doc.halted());
    assert!(doc.checkpoint().is_null(), "{:?}", doc.checkpoint());
    assert_eq!(doc.in_flight().map(|f| f.range.batch_id), Some(1));
}

/// First attempts until one gets no HTTP answer at all (the process died in the tick); returns that error.
async fn invoke_until_no_answer(host: &testbed::driver::HostDriver) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match host.invoke(FUNCTION, None).await {
            Ok(invocation) => {
                assert_eq!(invocation.status, 200, "{}", invocation.body);
                assert!(answered_changes(&invocation).is_empty(), "answered instead of crashing: {}", invocation.body);
            }
            Err(error) => return error.to_string(),
        }
        assert!(std::time::Instant::now() < deadline, "no crash within 10 s:\n{}", host.output());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until the handler process has exited, for at most 5 s: the kernel closes a dying process's sockets
/// just before the process can be reaped, so the lost connection comes first.
async fn wait_until_exited(host: &testbed::driver::HostDriver) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while host.is_running() {
        assert!(std::time::Instant::now() < deadline, "the handler still runs 5 s after it stopped answering");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Waits until some session waits for a lock on `orders`, for at most 10 s.
async fn wait_for_a_lock_waiter(db: &tokio_postgres::Client) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let waiting: i64 = db
            .query_one(
                "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation \
                 WHERE c.relname = 'orders' AND NOT l.granted",
                &[],
            )
            .await
            .expect("pg_locks")
            .get(0);
        if waiting > 0 {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "nobody waited for the lock within 10 s");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Sends SIGSTOP or SIGCONT to a handler process this test started.
fn signal(pid: u32, name: &str) {
    let status =
        std::process::Command::new("kill").arg(format!("-{name}")).arg(pid.to_string()).status().expect("kill runs");
    assert!(status.success(), "kill -{name} {pid} failed");
}
