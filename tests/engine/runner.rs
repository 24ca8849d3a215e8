//! The runner loop over an in-memory source and store, with a scripted sink standing in for the webhook.
use sql_pseudo_trigger::config::{DeliveryMode, FunctionConfig, PoisonAction, TriggerSettings};
use sql_pseudo_trigger::engine::Trigger;
use sql_pseudo_trigger::runner::*;
use sql_pseudo_trigger::sink::{Sink, SinkBatch, SinkError};
use sql_pseudo_trigger::state::MemoryStore;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use testbed::MemorySource;
use tokio::sync::watch;

const APP: &str = "app";

fn config(max_batch_size: usize, max_attempts: u32) -> FunctionConfig {
    config_with(max_batch_size, max_attempts, PoisonAction::Quarantine)
}

fn config_with(max_batch_size: usize, max_attempts: u32, poison_action: PoisonAction) -> FunctionConfig {
    let settings = TriggerSettings {
        max_batch_size,
        // Short, so that the waits between ticks and the retry back-off keep these tests fast.
        polling_interval: Duration::from_millis(5),
        max_attempts,
        poison_action,
        ..testbed::config::settings()
    };
    testbed::config::function("orders", settings)
}

/// One delivery attempt the sink saw: the batch id, the ids in it, and whether it was accepted.
type Attempt = (u64, Vec<i64>, bool);

/// Records every attempt; fails the first `transient` attempts, and rejects any batch holding a poison id.
#[derive(Debug, Default)]
struct ScriptedSink {
    transient: Mutex<u32>,
    poison: BTreeSet<i64>,
    attempts: Mutex<Vec<Attempt>>,
    /// Sent `true` during the first delivery: a SIGTERM arriving while a batch is in hand.
    stop_during_first: Option<watch::Sender<bool>>,
    /// The fencing token the destination holds, as a SQL sink's fence table does: a batch under a lower
    /// token is refused, a higher one is recorded.
    fence: Option<Mutex<u64>>,
}

impl ScriptedSink {
    fn attempts(&self) -> Vec<Attempt> {
        self.attempts.lock().expect("attempts").clone()
    }

    /// How many times each id was accepted.
    fn accepted(&self) -> BTreeMap<i64, usize> {
        let mut counts = BTreeMap::new();
        for (_, ids, ok) in self.attempts() {
            for id in ids.into_iter().filter(|_| ok) {
                *counts.entry(id).or_insert(0) += 1;
            }
        }
        counts
    }
}

#[async_trait::async_trait]
impl Sink for ScriptedSink {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), sql_pseudo_trigger::sink::SinkError> {
        let ids: Vec<i64> = batch
            .changes
            .iter()
            .map(|c| {
                let item: serde_json::Value = serde_json::from_str(c.item.get()).expect("items are JSON");
                item["id"].as_i64().expect("an id")
            })
            .collect();
        if let Some(stop) = &self.stop_during_first {
            let _ = stop.send(true);
        }
        let result = {
            let mut transient = self.transient.lock().expect("transient");
            let mut fence = self.fence.as_ref().map(|f| f.lock().expect("fence"));
            if *transient > 0 {
                *transient -= 1;
                Err(SinkError::Transient("scripted outage".into()))
            } else if let Some(stored) = fence.as_deref_mut().filter(|stored| batch.fence < **stored) {
                Err(SinkError::Fenced { ours: batch.fence, stored: *stored })
            } else if ids.iter().any(|id| self.poison.contains(id)) {
                Err(SinkError::Rejected("scripted rejection".into()))
            } else {
                if let Some(stored) = fence.as_deref_mut() {
                    *stored = batch.fence;
                }
                Ok(())
            }
        };
        self.attempts.lock().expect("attempts").push((batch.range.batch_id, ids, result.is_ok()));
        result
    }

    fn describe(&self) -> String {
        "scripted".into()
    }
}

struct World {
    source: Arc<MemorySource>,
    trigger: Arc<Trigger>,
}

fn world(max_batch_size: usize, max_attempts: u32) -> World {
    world_with(config(max_batch_size, max_attempts))
}

fn world_with(config: FunctionConfig) -> World {
    let source = Arc::new(MemorySource::new());
    let store = Arc::new(MemoryStore::new());
    let trigger = Trigger::new(config, APP, source.clone(), store, "runner-test".into());
    World { source, trigger: Arc::new(trigger) }
}

/// Runs the loop for one function, failing the test if it does not end within 10 s.
async fn run_to_end(w: &World, sink: Arc<ScriptedSink>, once: bool, stop: watch::Receiver<bool>) -> RunSummary {
    run_with(w, sink, RunOptions { once, ..RunOptions::default() }, stop).await
}

async fn run_with(w: &World, sink: Arc<ScriptedSink>, options: RunOptions, stop: watch::Receiver<bool>) -> RunSummary {
    let run = run_one(APP, w.trigger.clone(), sink, options, stop);
    tokio::time::timeout(Duration::from_secs(10), run).await.expect("the run ends within 10 s")
}

fn never_stopped() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    // Keep the sender alive for the whole test: a dropped sender would wake `changed()` at once.
    std::mem::forget(tx);
    rx
}

fn each(ids: impl IntoIterator<Item = i64>) -> BTreeMap<i64, usize> {
    ids.into_iter().map(|id| (id, 1)).collect()
}

#[tokio::test]
async fn once_drains_the_backlog_in_full_batches_and_leaves_nothing_in_flight() {
    // GIVEN 250 rows and batches of 100
    let w = world(100, 5);
    w.source.upsert(1..=250, 1);
    let sink = Arc::new(ScriptedSink::default());

    // WHEN the runner drains once
    let summary = run_to_end(&w, sink.clone(), true, never_stopped()).await;

    // THEN every row arrived exactly once, in batches 1, 2, 3 of 100, 100, 50
    assert_eq!(sink.accepted(), each(1..=250));
    let sizes: Vec<(u64, usize)> = sink.attempts().iter().map(|(b, ids, _)| (*b, ids.len())).collect();
    assert_eq!(sizes, vec![(1, 100), (2, 100), (3, 50)]);
    assert_eq!((summary.delivered, summary.batches, summary.failed_deliveries), (250, 3, 0));
    assert_eq!(summary.result(), Ok(()), "a clean drain is a success");
    // AND the last batch is acknowledged: nothing is left in flight for the next run to repeat
    let (doc, _) = w.trigger.load().await.expect("load").expect("state");
    assert!(doc.in_flight().is_none(), "{:?}", doc.in_flight());
    assert_eq!(doc.counters().delivered, 250);
}

#[tokio::test]
async fn an_outage_of_the_sink_longer_than_max_attempts_delays_the_batch_but_never_quarantines_it() {
    // GIVEN MaxAttempts 2, and a sink that is down for its first four attempts
    let w = world(100, 2);
    w.source.upsert(1..=3, 1);
    let sink = Arc::new(ScriptedSink { transient: Mutex::new(4), ..Default::default() });

    // WHEN the runner drains once
    let summary = run_to_end(&w, sink.clone(), true, never_stopped()).await;

    // THEN batch 1 was attempted five times, identically, and accepted the fifth time
    let ids = vec![1, 2, 3];
    let mut expected = vec![(1, ids.clone(), false); 4];
    expected.push((1, ids, true));
    assert_eq!(sink.attempts(), expected);
    assert_eq!((summary.delivered, summary.failed_deliveries), (3, 4));
    // AND nothing was quarantined: an outage is not the batch's fault
    let (doc, _) = w.trigger.load().await.expect("load").expect("state");
    assert!(doc.in_flight().is_none());
    assert_eq!((doc.counters().quarantined, doc.counters().delivered), (0, 3));
}

#[tokio::test]
async fn a_stop_during_an_outage_leaves_the_batch_in_flight_for_the_next_process() {
    // GIVEN a sink that stays down, and a stop that arrives during the first attempt
    let w = world(100, 5);
    w.source.upsert(1..=3, 1);
    let (tx, rx) = watch::channel(false);
    let sink =
        Arc::new(ScriptedSink { transient: Mutex::new(u32::MAX), stop_during_first: Some(tx), ..Default::default() });

    // WHEN the runner runs
    let summary = run_to_end(&w, sink.clone(), false, rx).await;

    // THEN it stops after that attempt, and the batch is still in flight: not acknowledged, not quarantined
    assert_eq!((summary.delivered, sink.attempts().len()), (0, 1));
    let (doc, _) = w.trigger.load().await.expect("load").expect("state");
    assert_eq!(doc.in_flight().map(|f| f.range.batch_id), Some(1));
    assert_eq!(doc.counters().quarantined, 0);
}

#[tokio::test]
async fn a_poison_last_batch_is_quarantined_and_a_once_run_still_ends() {
    // GIVEN rows 1-10 in batches of 5, and a sink that rejects any batch holding row 8
    let w = world(5, 2);
    w.source.upsert(1..=10, 1);
    let sink = Arc::new(ScriptedSink { poison: [8].into(), ..Default::default() });

    // WHEN the runner drains once (the poison batch is the last one)
    let summary = run_to_end(&w, sink.clone(), true, never_stopped()).await;

    // THEN rows 1-5 arrived, batch 2 was attempted MaxAttempts times and quarantined, and the run ended
    assert_eq!(sink.accepted(), each(1..=5));
    assert_eq!(sink.attempts().iter().filter(|(b, _, ok)| *b == 2 && !ok).count(), 2);
    assert_eq!(summary.failed_deliveries, 2);
    let (doc, _) = w.trigger.load().await.expect("load").expect("state");
    assert_eq!(doc.counters().quarantined, 1);
    assert_eq!(doc.quarantine().iter().map(|q| (q.range.batch_id, q.range.rows)).collect::<Vec<_>>(), vec![(2, 5)]);
    assert!(doc.in_flight().is_none());

    // AND a later row is delivered by the next run, as a first attempt
    w.source.upsert([11], 2);
    let sink = Arc::new(ScriptedSink::default());
    run_to_end(&w, sink.clone(), true, never_stopped()).await;
    assert_eq!(sink.accepted(), each([11]));
}

#[tokio::test]
async fn a_once_run_that_stops_at_a_halt_names_the_function_and_the_halt_in_its_result() {
    // GIVEN PoisonAction halt, MaxAttempts 2, and a sink that rejects the only batch
    let w = world_with(config_with(100, 2, PoisonAction::Halt));
    w.source.upsert(1..=3, 1);
    let sink = Arc::new(ScriptedSink { poison: [2].into(), ..Default::default() });

    // WHEN the runner drains once
    let summary = run_to_end(&w, sink.clone(), true, never_stopped()).await;

    // THEN it stopped at the halt, after two refusals, and its result is an error that says so
    assert_eq!(sink.attempts().len(), 2);
    assert_eq!(summary.stopped.len(), 1, "{:?}", summary.stopped);
    assert_eq!(summary.stopped[0].function, "orders");
    assert!(summary.stopped[0].error.starts_with("function orders is halted"), "{}", summary.stopped[0].error);
    let error = summary.result().expect_err("a halted drain is not a success");
    assert!(
        error.contains("stopped before the end of the backlog") && error.contains("handler state resume orders"),
        "{error}"
    );
}

#[tokio::test]
async fn a_once_run_of_a_paused_function_ends_without_delivering() {
    // GIVEN a function that ran once and was then paused, with rows waiting
    let w = world(100, 5);
    run_to_end(&w, Arc::new(ScriptedSink::default()), true, never_stopped()).await;
    sql_pseudo_trigger::ops::pause(&w.trigger, "test").await.expect("pause");
    w.source.upsert(1..=3, 1);

    // WHEN the runner drains once
    let sink = Arc::new(ScriptedSink::default());
    let summary = run_to_end(&w, sink.clone(), true, never_stopped()).await;

    // THEN it ends at once and delivers nothing; a pause is the operator's choice, not a failure
    assert_eq!(summary.delivered, 0);
    assert!(sink.attempts().is_empty());
    assert_eq!(summary.result(), Ok(()));
}

#[tokio::test]
async fn a_stop_during_a_delivery_finishes_that_batch_and_acknowledges_it() {
    // GIVEN 300 rows, and a stop signal that arrives while the first batch is being delivered
    let w = world(100, 5);
    w.source.upsert(1..=300, 1);
    let (tx, rx) = watch::channel(false);
    let sink = Arc::new(ScriptedSink { stop_during_first: Some(tx), ..Default::default() });

    // WHEN the runner runs (not once)
    let summary = run_to_end(&w, sink.clone(), false, rx).await;

    // THEN the batch in hand was delivered, no other batch was started
    assert_eq!(summary.batches, 1);
    assert_eq!(sink.accepted(), each(1..=100));
    // AND it is acknowledged and the lease released, so the next process goes on from row 101
    let (doc, _) = w.trigger.load().await.expect("load").expect("state");
    assert!(doc.in_flight().is_none(), "{:?}", doc.in_flight());
    assert_eq!(*doc.checkpoint(), serde_json::json!([1, 100]));
    let lease = doc.lease().expect("a lease was taken");
    assert!(lease.expires_at <= time::OffsetDateTime::now_utc());
}

#[tokio::test]
async fn a_stop_after_a_batch_with_nothing_chained_releases_the_lease_of_that_batch() {
    // GIVEN 50 rows, less than a batch (so nothing is fetched ahead and chained), and a stop that arrives while
    // that batch is being delivered
    let w = world(100, 5);
    w.source.upsert(1..=50, 1);
    let (tx, rx) = watch::channel(false);
    let sink = Arc::new(ScriptedSink { stop_during_first: Some(tx), ..Default::default() });

    // WHEN the runner runs and stops
    let summary = run_to_end(&w, sink.clone(), false, rx).await;

    // THEN the batch was delivered and acknowledged
    assert_eq!((summary.batches, sink.accepted()), (1, each(1..=50)));
    let (doc, _) = w.trigger.load().await.expect("load").expect("state");
    assert!(doc.in_flight().is_none(), "{:?}", doc.in_flight());
    assert_eq!(*doc.checkpoint(), serde_json::json!([1, 50]));
    // AND the lease of that batch ended with the process, not `leaseDurationMs` later
    let lease = doc.lease().expect("a lease was taken");
    assert!(lease.expires_at <= time::OffsetDateTime::now_utc(), "the lease outlives the stop: {lease:?}");
}

#[tokio::test]
async fn a_new_state_document_goes_above_the_token_the_sink_holds_instead_of_quarantining_every_batch() {
    // GIVEN a sink that recorded fencing token 7 under an earlier state document of this function (since
    // deleted: the new document's tokens start again at 1), MaxAttempts 2, and 250 rows in batches of 100
    let w = world(100, 2);
    w.source.upsert(1..=250, 1);
    let sink = Arc::new(ScriptedSink { fence: Some(Mutex::new(7)), ..Default::default() });

    // WHEN the runner drains once in deferred mode
    let summary = run_to_end(&w, sink.clone(), true, never_stopped()).await;

    // THEN batch 1 was refused once under token 1, then every row was accepted exactly once under token 8
    let refused: Vec<u64> = sink.attempts().iter().filter(|(_, _, ok)| !ok).map(|(b, _, _)| *b).collect();
    assert_eq!(refused, vec![1]);
    assert_eq!(sink.accepted(), each(1..=250));
    assert_eq!(*sink.fence.as_ref().expect("a fence").lock().expect("fence"), 8);
    // AND the refusal was not counted: nothing quarantined, nothing failed, the document holds token 8
    assert_eq!((summary.delivered, summary.failed_deliveries), (250, 0));
    let (doc, _) = w.trigger.load().await.expect("load").expect("state");
    assert_eq!((doc.counters().quarantined, doc.counters().delivered), (0, 250));
    assert!(doc.in_flight().is_none(), "{:?}", doc.in_flight());
    assert_eq!(doc.lease().map(|l| l.token), Some(8));
}

/// A drain that gives up after 100 ms of failures without a break.
const IMPATIENT: RunOptions = RunOptions { once: true, give_up_after: Duration::from_millis(100) };

#[tokio::test]
async fn a_drain_gives_up_on_a_destination_that_stays_down_naming_it_and_leaves_the_batch_in_flight() {
    // GIVEN a sink that stays down
    let w = world(100, 2);
    w.source.upsert(1..=3, 1);
    let sink = Arc::new(ScriptedSink { transient: Mutex::new(u32::MAX), ..Default::default() });

    // WHEN a drain that gives up after 100 ms runs
    let summary = run_with(&w, sink.clone(), IMPATIENT, never_stopped()).await;

    // THEN it stopped at the outage, with an exit status that names the function and the error
    assert_eq!(summary.stopped.len(), 1, "{:?}", summary.stopped);
    let error = summary.result().expect_err("a drain that gave up is not a success");
    assert!(error.contains("function orders: still failing after") && error.contains("scripted outage"), "{error}");
    // AND batch 1 is still in flight for the next run, never quarantined however often it failed
    assert!(sink.attempts().len() > 2, "attempted more than MaxAttempts times: {:?}", sink.attempts());
    let (doc, _) = w.trigger.load().await.expect("load").expect("state");
    assert_eq!(doc.in_flight().map(|f| f.range.batch_id), Some(1));
    assert_eq!(doc.counters().quarantined, 0);
}

#[tokio::test]
async fn a_drain_gives_up_on_a_source_that_stays_down() {
    // GIVEN a source whose fetches keep failing
    let w = world(100, 5);
    w.source.upsert(1..=3, 1);
    w.source.fail_next_fetches(u32::MAX);

    // WHEN a drain that gives up after 100 ms runs
    let sink = Arc::new(ScriptedSink::default());
    let summary = run_with(&w, sink.clone(), IMPATIENT, never_stopped()).await;

    // THEN it stopped naming the source's error, having delivered nothing
    assert_eq!(summary.stopped.len(), 1, "{:?}", summary.stopped);
    assert!(summary.stopped[0].error.starts_with("still failing after"), "{}", summary.stopped[0].error);
    assert!(sink.attempts().is_empty());
}

#[tokio::test]
async fn a_drain_in_sink_mode_gives_up_on_a_source_that_stays_down() {
    let mut config = config(100, 5);
    config.settings.delivery_mode = DeliveryMode::Sink;
    let w = world_with(config);
    w.source.upsert(1..=3, 1);
    w.source.fail_next_fetches(u32::MAX);

    let summary = run_with(&w, Arc::new(ScriptedSink::default()), IMPATIENT, never_stopped()).await;

    assert_eq!(summary.stopped.len(), 1, "{:?}", summary.stopped);
    assert!(summary.stopped[0].error.starts_with("still failing after"), "{}", summary.stopped[0].error);
}
