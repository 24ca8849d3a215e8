//! Sink mode against its contract, over a [`MemorySource`], a shared [`MemoryStore`] behind one
//! [`FaultyStore`] per process, and a scripted sink that records what it took.
//!
//! Leases: `Duration::ZERO` is a lease that expired when it was granted (another process may take over at
//! once, and no heartbeat runs); an hour never expires within a test. The heartbeat tests use real time in
//! hundreds of milliseconds, because leases are wall-clock times that `tokio::time::pause` cannot move.

use crate::hand_edit;
use serde_json::{json, Value};
use sql_pseudo_trigger::config::{DeliveryMode, FunctionConfig, RetryPolicy, TriggerSettings};
use sql_pseudo_trigger::engine::document::StateDoc;
use sql_pseudo_trigger::engine::{OutcomeKind, TickError, Trigger};
use sql_pseudo_trigger::sink::{Resume, Sink, SinkBatch, SinkError};
use sql_pseudo_trigger::state::{MemoryStore, StateStore};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testbed::{Fault, FaultyStore, MemorySource, StoreOp};
use time::OffsetDateTime;

const APP: &str = "app";

fn settings() -> TriggerSettings {
    TriggerSettings {
        polling_interval: Duration::from_millis(5),
        max_attempts: 3,
        delivery_mode: DeliveryMode::Sink,
        ..testbed::config::settings()
    }
}

fn config(settings: TriggerSettings) -> FunctionConfig {
    FunctionConfig {
        retry: Some(RetryPolicy::fixed(5, std::time::Duration::from_secs(5))),
        ..testbed::config::function("orders", settings)
    }
}

/// What the next delivery does.
#[derive(Debug, Clone)]
enum Step {
    Take,
    Transient,
    Reject,
    Fence(u64),
    /// Takes the batch after this long.
    Slow(Duration),
    /// Never answers.
    Hang,
    /// Takes the batch, then makes the process's next state write fail (as if it crashed before the
    /// acknowledgement).
    TakeThenStoreFails(Arc<FaultyStore>),
    /// Another owner takes the state over (lease and token + 1) while the batch is in hand and writes the
    /// destination under its token, so this write is refused as fenced.
    DeposedThenFence(Arc<MemoryStore>),
}

/// One delivery the sink saw: batch id, fence, ids, range, and whether it took the batch.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    batch_id: u64,
    fence: u64,
    ids: Vec<i64>,
    range: Option<(serde_json::Value, serde_json::Value)>,
    taken: bool,
}

/// Follows its script, then takes every batch.
#[derive(Debug, Default)]
struct ScriptedSink {
    script: Mutex<VecDeque<Step>>,
    seen: Mutex<Vec<Seen>>,
}

impl ScriptedSink {
    fn with(steps: impl IntoIterator<Item = Step>) -> Self {
        Self { script: Mutex::new(steps.into_iter().collect()), ..Default::default() }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    /// Ids taken, in order, one entry per time taken.
    fn taken(&self) -> Vec<i64> {
        self.seen().into_iter().filter(|s| s.taken).flat_map(|s| s.ids).collect()
    }
}

#[async_trait::async_trait]
impl Sink for ScriptedSink {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), SinkError> {
        let step = self.script.lock().expect("script").pop_front().unwrap_or(Step::Take);
        let result = match step {
            Step::Take => Ok(()),
            Step::Transient => Err(SinkError::Transient("scripted outage".into())),
            Step::Reject => Err(SinkError::Rejected("scripted rejection".into())),
            Step::Fence(stored) => Err(SinkError::Fenced { ours: batch.fence, stored }),
            Step::Slow(d) => {
                tokio::time::sleep(d).await;
                Ok(())
            }
            Step::Hang => std::future::pending().await,
            Step::DeposedThenFence(store) => {
                let v = store.load("app/orders.json").await.expect("load").expect("a state document");
                let mut doc: StateDoc = serde_json::from_slice(&v.bytes).expect("readable");
                let mut stored = 0;
                hand_edit(&mut doc, |json| {
                    let lease = json.get_mut("lease").expect("a lease");
                    stored = lease["token"].as_u64().expect("a token") + 1;
                    (lease["owner"], lease["token"]) = (json!("newer-owner"), json!(stored));
                });
                let bytes = serde_json::to_vec(&doc).expect("serializes");
                store.save_if("app/orders.json", &bytes, Some(&v.etag)).await.expect("the takeover");
                Err(SinkError::Fenced { ours: batch.fence, stored })
            }
            Step::TakeThenStoreFails(store) => {
                store.fail_next(StoreOp::Save, Fault::Unavailable, 1);
                Ok(())
            }
        };
        let ids = batch
            .changes
            .iter()
            .map(|c| {
                let item: serde_json::Value = serde_json::from_str(c.item.get()).expect("items are JSON");
                item["id"].as_i64().expect("an id")
            })
            .collect();
        self.seen.lock().expect("seen").push(Seen {
            batch_id: batch.range.batch_id,
            fence: batch.fence,
            ids,
            range: Some((batch.range.from.clone(), batch.range.to.clone())),
            taken: result.is_ok(),
        });
        result
    }

    fn describe(&self) -> String {
        "scripted sink".into()
    }
}

#[derive(Default)]
struct World {
    source: Arc<MemorySource>,
    store: Arc<MemoryStore>,
}

struct Process {
    trigger: Trigger,
    store: Arc<FaultyStore>,
}

impl World {
    fn process(&self, owner: &str, settings: TriggerSettings) -> Process {
        let store = Arc::new(FaultyStore::new(self.store.clone()));
        let trigger = Trigger::new(config(settings), APP, self.source.clone(), store.clone(), owner.to_string());
        Process { trigger, store }
    }

    async fn state(&self) -> StateDoc {
        let v = self.store.load("app/orders.json").await.expect("load").expect("a state document");
        serde_json::from_slice(&v.bytes).expect("readable")
    }
}

fn ids(range: std::ops::RangeInclusive<i64>) -> Vec<i64> {
    range.collect()
}

#[tokio::test]
async fn a_batch_is_delivered_with_its_range_and_fence_and_acknowledged_in_the_same_tick() {
    // GIVEN three committed rows
    let w = World::default();
    w.source.upsert(1..=3, 1);
    let p = w.process("p1", settings());
    let sink = ScriptedSink::default();

    // WHEN one sink-mode tick runs
    let out = p.trigger.tick_into(&sink).await.expect("tick");

    // THEN the sink took batch 1 under fence 1 with its range, and the checkpoint moved in the same tick
    assert_eq!((out.kind, out.batch_id, out.changes.len()), (OutcomeKind::Delivered, Some(1), 3));
    let seen = sink.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!((seen[0].batch_id, seen[0].fence, seen[0].ids.clone()), (1, 1, ids(1..=3)));
    let doc = w.state().await;
    assert!(doc.in_flight().is_none(), "{:?}", doc.in_flight());
    assert_eq!(seen[0].range, Some((serde_json::Value::Null, doc.checkpoint().clone())));
    assert_eq!(doc.counters().delivered, 3);
    // AND it cost one read and two conditional writes
    assert_eq!(out.store_operations, 3);

    // AND the next tick finds nothing
    let out = p.trigger.tick_into(&sink).await.expect("tick");
    assert_eq!(out.kind, OutcomeKind::Empty);
    assert_eq!(sink.taken(), ids(1..=3));
}

#[tokio::test]
async fn a_rejected_batch_is_redelivered_under_its_id_and_quarantined_at_max_attempts() {
    // GIVEN a sink that rejects three times, MaxAttempts 3, and rows 1-3 then 4
    let w = World::default();
    w.source.upsert(1..=3, 1);
    let p = w.process("p1", settings());
    let sink = ScriptedSink::with([Step::Reject, Step::Reject, Step::Reject]);

    // WHEN ticks run: three deliveries of batch 1 fail
    for attempt in 1..=3u32 {
        let e = p.trigger.tick_into(&sink).await.unwrap_err();
        assert!(matches!(e, TickError::Sink(SinkError::Rejected(_))), "{e}");
        assert_eq!(e.kind(), sql_pseudo_trigger::engine::ErrorKind::Operator);
        let doc = w.state().await;
        let flight = doc.in_flight().expect("still in flight");
        assert_eq!((flight.range.batch_id, flight.failures, flight.deliveries), (1, attempt, attempt));
    }
    w.source.upsert([4], 2);

    // THEN the next tick quarantines batch 1 and delivers the rows after it
    let out = p.trigger.tick_into(&sink).await.expect("tick");
    assert_eq!((out.kind, out.batch_id), (OutcomeKind::Delivered, Some(2)));
    assert_eq!(sink.taken(), vec![4]);
    let doc = w.state().await;
    assert_eq!(doc.counters().quarantined, 1);
    assert_eq!(doc.quarantine()[0].range.batch_id, 1);
}

#[tokio::test]
async fn a_transient_sink_failure_is_not_counted_toward_max_attempts() {
    // GIVEN a destination that is down for five deliveries, with MaxAttempts 3
    let w = World::default();
    w.source.upsert(1..=2, 1);
    let p = w.process("p1", settings());
    let sink = ScriptedSink::with(std::iter::repeat_n(Step::Transient, 5));

    // WHEN it comes back
    for _ in 0..5 {
        let e = p.trigger.tick_into(&sink).await.unwrap_err();
        assert_eq!(e.kind(), sql_pseudo_trigger::engine::ErrorKind::Transient);
    }
    let out = p.trigger.tick_into(&sink).await.expect("tick");

    // THEN batch 1 is delivered, not quarantined
    assert_eq!((out.kind, out.batch_id), (OutcomeKind::Redelivered, Some(1)));
    assert_eq!(sink.taken(), ids(1..=2));
    let doc = w.state().await;
    assert_eq!((doc.counters().quarantined, doc.counters().delivered), (0, 2));
}

#[tokio::test]
async fn a_deposed_owners_fenced_write_acknowledges_nothing_and_counts_nothing() {
    // GIVEN a sink that, while the batch is in hand, sees another owner take over and write under its token
    let w = World::default();
    w.source.upsert(1..=2, 1);
    let p = w.process("p1", TriggerSettings { lease_duration: Duration::ZERO, ..settings() });
    let sink = ScriptedSink::with([Step::DeposedThenFence(w.store.clone())]);

    // WHEN the tick delivers
    let out = p.trigger.tick_into(&sink).await.expect("a fenced write is not an error");

    // THEN it reports a conflict, delivers nothing, and leaves the batch in flight uncounted and the token the
    // newer owner's
    assert_eq!(out.kind, OutcomeKind::Conflict);
    assert!(out.changes.is_empty());
    assert!(out.logs.iter().any(|l| l.contains("fencing token 2 from a newer owner")), "{:?}", out.logs);
    let doc = w.state().await;
    assert_eq!(doc.in_flight().expect("still in flight").failures, 0);
    assert_eq!(doc.lease().map(|l| (l.owner.clone(), l.token)), Some(("newer-owner".to_string(), 2)));
}

#[tokio::test]
async fn a_fence_no_owner_of_this_document_wrote_is_raised_past_and_the_batch_delivered_again() {
    // GIVEN a document that has acknowledged batches (as one restored from a copy would), and a sink that
    // holds token 7 from a later life of the function
    let w = World::default();
    w.source.upsert(1..=2, 1);
    let p = w.process("p1", settings());
    p.trigger.tick_into(&ScriptedSink::default()).await.expect("batch 1");
    w.source.upsert(3..=4, 2);
    let sink = ScriptedSink::with([Step::Fence(7)]);

    // WHEN the tick delivers batch 2 under token 1 and the sink refuses it
    let out = p.trigger.tick_into(&sink).await.expect("a fenced write is not an error");

    // THEN nothing is delivered or counted, and the token goes to 8
    assert_eq!(out.kind, OutcomeKind::Conflict);
    assert!(out.changes.is_empty());
    assert!(out.logs.iter().any(|l| l.contains("raised to 8")), "{:?}", out.logs);
    let doc = w.state().await;
    assert_eq!(doc.in_flight().map(|f| (f.range.batch_id, f.failures)), Some((2, 0)));
    // AND the next tick delivers batch 2 again under token 8, and acknowledges it
    let again = p.trigger.tick_into(&sink).await.expect("tick");
    assert_eq!(again.batch_id, Some(2));
    let last = sink.seen().last().cloned().expect("a delivery");
    assert_eq!((last.batch_id, last.fence, last.ids, last.taken), (2, 8, ids(3..=4), true));
    let doc = w.state().await;
    assert!(doc.in_flight().is_none());
    assert_eq!(doc.counters().delivered, 4);
}

#[tokio::test]
async fn a_crash_between_the_sink_and_the_acknowledgement_redelivers_the_batch_to_the_next_owner() {
    // GIVEN a process whose acknowledgement never reaches the store after the sink took batch 1
    let w = World::default();
    w.source.upsert(1..=3, 1);
    let expired = TriggerSettings { lease_duration: Duration::ZERO, ..settings() };
    let p1 = w.process("p1", expired.clone());
    let sink = ScriptedSink::with([Step::TakeThenStoreFails(p1.store.clone())]);
    let e = p1.trigger.tick_into(&sink).await.unwrap_err();
    assert!(matches!(e, TickError::Store(_)), "{e}");

    // WHEN the same process ticks again, and then another process does after it
    let again = p1.trigger.tick_into(&sink).await.expect("tick");
    w.source.upsert([4], 2);
    let p2 = w.process("p2", expired);
    let next = p2.trigger.tick_into(&sink).await.expect("tick");

    // THEN the same process does not acknowledge from memory: it delivers batch 1 again (a duplicate, never
    // a loss), and the new owner goes on with the next batch under a larger fencing token
    assert_eq!((again.kind, again.batch_id), (OutcomeKind::Redelivered, Some(1)));
    assert_eq!((next.kind, next.batch_id), (OutcomeKind::Delivered, Some(2)));
    assert_eq!(sink.taken(), vec![1, 2, 3, 1, 2, 3, 4]);
    let fences: Vec<u64> = sink.seen().iter().map(|s| s.fence).collect();
    assert_eq!(fences, vec![1, 1, 2]);
}

#[tokio::test]
async fn a_host_style_tick_on_a_sink_mode_trigger_without_a_sink_refuses_and_records_nothing() {
    // GIVEN a function configured for sink delivery whose trigger was built without a sink
    let w = World::default();
    w.source.upsert(1..=2, 1);
    let p = w.process("p1", settings());

    // WHEN the host-style tick runs (it has nowhere to deliver), then a tick through a sink
    let refused = p.trigger.tick(&testbed::attempts::first()).await.expect_err("nowhere to deliver");
    let after_refusal = w.store.load("app/orders.json").await.expect("load");
    let sink = ScriptedSink::default();
    let delivered = p.trigger.tick_into(&sink).await.expect("tick");

    // THEN the refusal names the fix and records no batch (before, it recorded batch 1 in flight and answered
    // it to nobody); the sink tick then delivers batch 1 as new and acknowledges it
    assert!(matches!(refused, TickError::SinkMissing(_)), "{refused}");
    assert!(refused.to_string().contains("add \"sink\""), "{refused}");
    assert!(after_refusal.is_none(), "nothing written by a refused tick");
    assert_eq!((delivered.kind, delivered.batch_id), (OutcomeKind::Delivered, Some(1)));
    assert_eq!(sink.taken(), ids(1..=2));
    assert!(w.state().await.in_flight().is_none());
}

#[tokio::test]
async fn the_heartbeat_keeps_the_lease_through_a_long_delivery_and_ends_with_the_tick() {
    // GIVEN a lease of 400 ms and a delivery that takes 1.2 s
    let w = World::default();
    w.source.upsert(1..=2, 1);
    let lease = TriggerSettings { lease_duration: Duration::from_millis(400), ..settings() };
    let p1 = Arc::new(w.process("p1", lease.clone()));
    let slow = Arc::new(ScriptedSink::with([Step::Slow(Duration::from_millis(1200))]));
    let task = {
        let (p1, slow) = (p1.clone(), slow.clone());
        tokio::spawn(async move { p1.trigger.tick_into(slow.as_ref()).await })
    };

    // WHEN another process ticks after the lease it was first given has expired
    tokio::time::sleep(Duration::from_millis(700)).await;
    let p2 = w.process("p2", lease);
    let other = ScriptedSink::default();
    let out = p2.trigger.tick_into(&other).await.expect("tick");

    // THEN the renewed lease still holds it off, and the first delivery finishes and is acknowledged
    assert_eq!(out.kind, OutcomeKind::LeaseHeld, "{:?}", out.logs);
    assert!(other.seen().is_empty());
    let done = task.await.expect("join").expect("tick");
    assert_eq!(done.kind, OutcomeKind::Delivered);
    assert!(w.state().await.in_flight().is_none());
    // AND the heartbeat ended with its tick: no write happens afterwards
    let writes = p1.store.operations();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(p1.store.operations(), writes);
}

#[tokio::test]
async fn an_abandoned_tick_stops_renewing_its_lease() {
    // GIVEN a sink that never answers, a 200 ms lease (renewed every 50 ms) and a 300 ms tick budget
    let w = World::default();
    w.source.upsert(1..=2, 1);
    let s = TriggerSettings {
        lease_duration: Duration::from_millis(200),
        tick_timeout: Duration::from_millis(300),
        ..settings()
    };
    let p = w.process("p1", s);
    let sink = ScriptedSink::with([Step::Hang]);

    // WHEN the tick runs out of time
    let e = p.trigger.tick_into(&sink).await.unwrap_err();
    assert!(matches!(e, TickError::Timeout(_)), "{e}");
    let after = p.store.operations();
    assert!(after >= 4, "the heartbeat renewed during the delivery ({after} operations)");

    // THEN the renewals stop with it, and the lease lapses so another instance can take the batch over
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(p.store.operations(), after);
    let lease = w.state().await.lease().cloned().expect("a lease");
    assert!(lease.expires_at < OffsetDateTime::now_utc());
}

#[tokio::test]
async fn a_draining_backlog_fetches_the_next_batch_while_the_sink_writes() {
    // GIVEN 250 rows and batches of 100
    let w = World::default();
    w.source.upsert(1..=250, 1);
    let p = w.process("p1", settings());
    let sink = ScriptedSink::default();

    // WHEN three ticks deliver the backlog
    for _ in 0..3 {
        p.trigger.tick_into(&sink).await.expect("tick");
    }

    // THEN every row arrived once, in order, and the source was read three times, not four: the second and
    // third batches were fetched while the one before them was being written
    assert_eq!(sink.taken(), ids(1..=250));
    assert_eq!(w.source.fetches(), 3);
    assert_eq!(p.trigger.tick_into(&sink).await.expect("tick").kind, OutcomeKind::Empty);
}

#[tokio::test]
async fn a_batch_fetched_ahead_is_dropped_when_the_state_moved_on_without_it() {
    // GIVEN p1 delivered rows 1-100 and fetched 101-200 ahead, and then p2 delivered 101-200 itself
    let w = World::default();
    w.source.upsert(1..=250, 1);
    let expired = TriggerSettings { lease_duration: Duration::ZERO, ..settings() };
    let (p1, p2) = (w.process("p1", expired.clone()), w.process("p2", expired));
    let sink = ScriptedSink::default();
    p1.trigger.tick_into(&sink).await.expect("tick");
    p2.trigger.tick_into(&sink).await.expect("tick");

    // WHEN p1 ticks again
    let out = p1.trigger.tick_into(&sink).await.expect("tick");

    // THEN it fetched after where the state is now, not where its own fetch ahead started
    assert_eq!(out.changes.len(), 50);
    assert_eq!(sink.taken(), ids(1..=250));
}

/// Takes every batch and records what an exactly-once SQL sink records in its target: the last batch
/// applied (id and range) and the largest fencing token that wrote; `resume_position` answers it. With
/// `fence_only`, it records the fence alone, as an at-least-once SQL sink does.
#[derive(Debug, Default)]
struct RecordingSink {
    fence_only: bool,
    recorded: Mutex<Resume>,
    taken: Mutex<Vec<(u64, u64, Vec<i64>)>>,
    asked: Mutex<u32>,
    unreachable: Mutex<bool>,
}

impl RecordingSink {
    fn at_least_once_with_fence(fence: u64) -> Self {
        Self { fence_only: true, recorded: Mutex::new(Resume { fence, applied: None }), ..Default::default() }
    }

    /// `(batch_id, fence, ids)` of every batch taken.
    fn taken(&self) -> Vec<(u64, u64, Vec<i64>)> {
        self.taken.lock().expect("taken").clone()
    }

    fn ids(&self) -> Vec<i64> {
        self.taken().into_iter().flat_map(|(_, _, ids)| ids).collect()
    }

    fn asked(&self) -> u32 {
        *self.asked.lock().expect("asked")
    }
}

#[async_trait::async_trait]
impl Sink for RecordingSink {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), SinkError> {
        let mut recorded = self.recorded.lock().expect("recorded");
        if batch.fence < recorded.fence {
            return Err(SinkError::Fenced { ours: batch.fence, stored: recorded.fence });
        }
        recorded.fence = batch.fence;
        if !self.fence_only {
            let (from, to) = (&batch.range.from, &batch.range.to);
            recorded.applied = Some(Applied { batch_id: batch.range.batch_id, from: from.clone(), to: to.clone() });
        }
        let ids = batch
            .changes
            .iter()
            .map(|c| serde_json::from_str::<serde_json::Value>(c.item.get()).expect("json")["id"].as_i64().expect("id"))
            .collect();
        self.taken.lock().expect("taken").push((batch.range.batch_id, batch.fence, ids));
        Ok(())
    }

    fn describe(&self) -> String {
        "recording sink".into()
    }

    async fn resume_position(&self, _app: &str, _function: &str) -> Result<Option<Resume>, SinkError> {
        *self.asked.lock().expect("asked") += 1;
        if *self.unreachable.lock().expect("unreachable") {
            return Err(SinkError::Transient("scripted outage".into()));
        }
        Ok(Some(self.recorded.lock().expect("recorded").clone()))
    }
}

use sql_pseudo_trigger::sink::Applied;

/// A process of `w`'s function on its own, empty state store: the state document is lost.
fn process_with_lost_state(w: &World, owner: &str) -> Process {
    let lost = World { source: w.source.clone(), store: Arc::new(MemoryStore::new()) };
    lost.process(owner, TriggerSettings { max_batch_size: 3, ..settings() })
}

#[tokio::test]
async fn a_lost_state_document_resumes_after_the_last_batch_the_sink_applied() {
    // GIVEN rows 1-6 applied exactly once in two batches of three, under fencing token 1
    let w = World::default();
    w.source.upsert(1..=3, 1);
    w.source.upsert(4..=6, 1);
    let p1 = w.process("p1", TriggerSettings { max_batch_size: 3, ..settings() });
    let sink = RecordingSink::default();
    for _ in 0..2 {
        p1.trigger.tick_into(&sink).await.expect("tick");
    }
    assert_eq!(sink.ids(), ids(1..=6));

    // WHEN the state document is lost, rows 7-8 arrive, and a process ticks with no state (startFrom earliest)
    w.source.upsert(7..=8, 2);
    let p2 = process_with_lost_state(&w, "p2");
    let out = p2.trigger.tick_into(&sink).await.expect("tick");

    // THEN that very tick continues after batch 2, as batch 3, under a token above the sink's: rows 1-6 are
    // not applied again and nothing is skipped
    assert_eq!((out.kind, out.batch_id), (OutcomeKind::Delivered, Some(3)));
    assert_eq!(sink.ids(), ids(1..=8));
    assert_eq!(sink.taken().last().map(|(b, f, _)| (*b, *f)), Some((3, 2)));
    assert!(
        out.logs.iter().any(|l| l.contains("recording sink records batch 2 as applied up to [2,6]")),
        "{:?}",
        out.logs
    );
    // AND once a batch is acknowledged under the new document, the sink is not asked again
    let asked = sink.asked();
    w.source.upsert([9], 3);
    p2.trigger.tick_into(&sink).await.expect("tick");
    assert_eq!(sink.ids(), ids(1..=9));
    assert_eq!(sink.asked(), asked);
}

#[tokio::test]
async fn a_lost_state_document_raises_its_lease_token_above_the_fence_the_destination_holds() {
    // GIVEN an at-least-once SQL destination that has seen fencing token 5 from this function's earlier life
    let w = World::default();
    w.source.upsert(1..=2, 1);
    let sink = RecordingSink::at_least_once_with_fence(5);

    // WHEN a process ticks with no state
    let p = process_with_lost_state(&w, "p1");
    let out = p.trigger.tick_into(&sink).await.expect("tick");

    // THEN the batch is written under token 6 instead of being refused as fenced forever (from startFrom:
    // an at-least-once sink records no position)
    assert_eq!((out.kind, out.batch_id), (OutcomeKind::Delivered, Some(1)));
    assert_eq!(sink.taken(), vec![(1, 6, ids(1..=2))]);
    assert!(
        out.logs.iter().any(|l| l.contains("recording sink holds fencing token 5, above this state document's 1")),
        "{:?}",
        out.logs
    );
}

#[tokio::test]
async fn a_first_batch_applied_before_its_acknowledgement_was_lost_is_delivered_again_not_skipped() {
    // GIVEN a new function whose first batch the sink applied, and whose acknowledgement never reached the store
    let w = World::default();
    w.source.upsert(1..=3, 1);
    let expired = TriggerSettings { lease_duration: Duration::ZERO, ..settings() };
    let p1 = w.process("p1", expired.clone());
    let sink = RecordingSink::default();
    let outage = ScriptedSink::with([Step::Transient]);
    p1.trigger.tick_into(&outage).await.expect_err("the sink is down after batch 1 is recorded");
    let (doc, _) = p1.trigger.load().await.expect("load").expect("doc");
    let flight = doc.in_flight().expect("in flight");
    *sink.recorded.lock().expect("recorded") = Resume {
        fence: 1,
        applied: Some(Applied { batch_id: 1, from: flight.range.from.clone(), to: flight.range.to.clone() }),
    };

    // WHEN another process takes it over
    let p2 = w.process("p2", expired);
    let out = p2.trigger.tick_into(&sink).await.expect("tick");

    // THEN the sink's record names this very batch: it is delivered again (an exactly-once sink skips it)
    assert_eq!((out.kind, out.batch_id), (OutcomeKind::Redelivered, Some(1)));
    assert_eq!(sink.taken(), vec![(1, 2, ids(1..=3))]);
    assert!(w.state().await.in_flight().is_none());
}

#[tokio::test]
async fn while_the_sink_cannot_say_what_it_recorded_a_new_document_delivers_nothing_and_counts_nothing() {
    // GIVEN a new function whose destination is down
    let w = World::default();
    w.source.upsert(1..=2, 1);
    let p = w.process("p1", settings());
    let sink = RecordingSink::default();
    *sink.unreachable.lock().expect("unreachable") = true;

    // WHEN it ticks, and again once the destination is back
    let e = p.trigger.tick_into(&sink).await.unwrap_err();
    let failures = w.state().await.in_flight().expect("recorded in flight").failures;
    *sink.unreachable.lock().expect("unreachable") = false;
    p.trigger.tick_into(&sink).await.expect("tick");

    // THEN the first tick failed transiently without delivering or counting, and the next delivered
    assert_eq!(e.kind(), sql_pseudo_trigger::engine::ErrorKind::Transient);
    assert_eq!(failures, 0);
    assert_eq!(sink.ids(), ids(1..=2));
}

impl World {
    /// An operator's edit of the state document, through the same compare-and-swap.
    async fn edit_state(&self, edit: impl FnOnce(&mut StateDoc)) {
        let v = self.store.load("app/orders.json").await.expect("load").expect("a state document");
        let mut doc: StateDoc = serde_json::from_slice(&v.bytes).expect("readable");
        edit(&mut doc);
        let bytes = serde_json::to_vec(&doc).expect("serializes");
        self.store.save_if("app/orders.json", &bytes, Some(&v.etag)).await.expect("the operator's write");
    }
}

#[tokio::test]
async fn a_draining_backlog_records_each_next_batch_with_the_acknowledgement_of_the_one_before() {
    // GIVEN 350 rows and batches of 100
    let w = World::default();
    w.source.upsert(1..=350, 1);
    let p = w.process("p1", settings());
    let sink = ScriptedSink::default();

    // WHEN the backlog drains
    let mut costs = Vec::new();
    loop {
        let out = p.trigger.tick_into(&sink).await.expect("tick");
        costs.push((out.kind, out.changes.len(), out.store_operations));
        if out.kind == OutcomeKind::Empty {
            break;
        }
    }

    // THEN every row arrived once, in order, in batches 1-4 under one fencing token
    assert_eq!(sink.taken(), ids(1..=350));
    let batches: Vec<(u64, u64)> = sink.seen().iter().map(|s| (s.batch_id, s.fence)).collect();
    assert_eq!(batches, vec![(1, 1), (2, 1), (3, 1), (4, 1)]);
    // AND the first tick read, recorded and acknowledged (recording batch 2 with it); every later batch cost
    // one write: its acknowledgement, which recorded the next; the last empty tick one read
    use OutcomeKind::{Delivered, Empty};
    assert_eq!(
        costs,
        vec![(Delivered, 100, 3), (Delivered, 100, 1), (Delivered, 100, 1), (Delivered, 50, 1), (Empty, 0, 1)]
    );
    // AND the state says so: nothing in flight, four batches, no re-delivery
    let doc = w.state().await;
    assert!(doc.in_flight().is_none(), "{:?}", doc.in_flight());
    assert_eq!((doc.counters().batches, doc.counters().delivered, doc.counters().redelivered), (4, 350, 0));
}

#[tokio::test]
async fn a_clean_stop_withdraws_a_chained_batch_so_the_next_instance_starts_at_once() {
    // GIVEN p1 delivered rows 1-100 and recorded 101-200 in flight under its one-hour lease
    let w = World::default();
    w.source.upsert(1..=250, 1);
    let p1 = w.process("p1", settings());
    let sink = ScriptedSink::default();
    p1.trigger.tick_into(&sink).await.expect("tick");
    let recorded = w.state().await.in_flight().cloned().expect("batch 2 recorded with batch 1's acknowledgement");
    assert_eq!((recorded.range.batch_id, recorded.range.rows, recorded.owner.as_str()), (2, 100, "p1"));

    // WHEN p1 stops cleanly
    assert!(p1.trigger.withdraw_chained().await.expect("withdraw"));

    // THEN nothing is in flight and the lease is released; the checkpoint stays after row 100
    let doc = w.state().await;
    assert!(doc.in_flight().is_none(), "{:?}", doc.in_flight());
    assert!(doc.lease().expect("a lease").expires_at <= OffsetDateTime::now_utc());
    // AND a new instance delivers rows 101-250 at once, each once, under a new fencing token
    let p2 = w.process("p2", settings());
    let out = p2.trigger.tick_into(&sink).await.expect("tick");
    assert_eq!((out.kind, out.changes.len(), out.fence), (OutcomeKind::Delivered, 100, 2));
    while p2.trigger.tick_into(&sink).await.expect("tick").kind != OutcomeKind::Empty {}
    assert_eq!(sink.taken(), ids(1..=250));
    // AND withdrawing twice, or with nothing chained, writes nothing
    let writes = p1.store.operations();
    assert!(!p1.trigger.withdraw_chained().await.expect("withdraw"));
    assert_eq!(p1.store.operations(), writes);
}

#[tokio::test]
async fn a_crash_with_a_chained_batch_in_flight_hands_it_to_the_next_owner_and_loses_nothing() {
    // GIVEN p1 delivered rows 1-100, recorded 101-200 in flight, and died (its lease lapses at once)
    let w = World::default();
    w.source.upsert(1..=250, 1);
    let expired = TriggerSettings { lease_duration: Duration::ZERO, ..settings() };
    let p1 = w.process("p1", expired.clone());
    let sink = ScriptedSink::default();
    p1.trigger.tick_into(&sink).await.expect("tick");
    assert_eq!(w.state().await.in_flight().map(|f| f.range.batch_id), Some(2));
    drop(p1);

    // WHEN another instance drains
    let p2 = w.process("p2", expired);
    let first = p2.trigger.tick_into(&sink).await.expect("tick");
    while p2.trigger.tick_into(&sink).await.expect("tick").kind != OutcomeKind::Empty {}

    // THEN it took batch 2 over (same id, same range) and every row arrived exactly once
    assert_eq!((first.kind, first.batch_id, first.fence), (OutcomeKind::Redelivered, Some(2), 2));
    assert_eq!(sink.taken(), ids(1..=250));
    let doc = w.state().await;
    assert_eq!((doc.counters().takeovers, doc.counters().delivered), (1, 250));
    assert!(doc.in_flight().is_none(), "{:?}", doc.in_flight());
}

#[tokio::test]
async fn a_pause_between_two_chained_batches_acknowledges_the_batch_in_hand_holds_the_function_and_resends_nothing() {
    // GIVEN p1 delivered rows 1-100 and recorded 101-200 with that acknowledgement
    let w = World::default();
    w.source.upsert(1..=250, 1);
    let p = w.process("p1", settings());
    let sink = ScriptedSink::default();
    p.trigger.tick_into(&sink).await.expect("tick");

    // WHEN an operator pauses the function
    w.edit_state(|doc| doc.pause()).await;
    // THEN the chained batch is delivered, and its acknowledgement, which lost its compare-and-swap to the pause,
    // is applied again on top of it (the pause left the batch, the lease and the checkpoint alone)
    let chained = p.trigger.tick_into(&sink).await.expect("tick");
    assert_eq!((chained.kind, chained.batch_id), (OutcomeKind::Delivered, Some(2)));
    let doc = w.state().await;
    assert!(doc.paused(), "the pause was overwritten");
    assert!(doc.in_flight().is_none(), "batch 2 was not acknowledged: {:?}", doc.in_flight());
    // AND the next tick reads the pause and delivers nothing
    assert_eq!(p.trigger.tick_into(&sink).await.expect("tick").kind, OutcomeKind::Paused);
    assert_eq!(sink.taken(), ids(1..=200));

    // WHEN the operator resumes it THEN the rest follows, and no row is sent twice
    w.edit_state(|doc| hand_edit(doc, |json| (json["paused"], json["halted"]) = (json!(false), Value::Null))).await;
    while p.trigger.tick_into(&sink).await.expect("tick").kind != OutcomeKind::Empty {}
    assert_eq!(sink.taken(), ids(1..=250));
    assert!(w.state().await.in_flight().is_none());
}

#[tokio::test]
async fn a_chained_batch_whose_lease_lapsed_is_not_delivered_from_memory() {
    // GIVEN p1 delivered rows 1-100 and recorded 101-200 under a lease that lapsed, and p2 took that batch
    // over, delivered it and recorded the next under its own lease
    let w = World::default();
    w.source.upsert(1..=250, 1);
    let p1 = w.process("p1", TriggerSettings { lease_duration: Duration::ZERO, ..settings() });
    let p2 = w.process("p2", settings());
    let sink = ScriptedSink::default();
    p1.trigger.tick_into(&sink).await.expect("tick");
    let taken_over = p2.trigger.tick_into(&sink).await.expect("tick");
    assert_eq!((taken_over.kind, taken_over.batch_id), (OutcomeKind::Redelivered, Some(2)));

    // WHEN p1 ticks again, still remembering the batch it chained
    let out = p1.trigger.tick_into(&sink).await.expect("tick");

    // THEN it reads the state instead, finds p2's batch under p2's lease and delivers nothing
    assert_eq!((out.kind, out.changes.len()), (OutcomeKind::LeaseHeld, 0));
    assert_eq!(sink.taken(), ids(1..=200));
}

#[tokio::test]
async fn a_document_seeded_by_a_partition_change_ignores_the_old_layouts_checkpoint_row_and_raises_the_fence() {
    use sql_pseudo_trigger::clock::SystemClock;
    use sql_pseudo_trigger::engine::document::Origin;
    use sql_pseudo_trigger::engine::Ledger;
    use sql_pseudo_trigger::partitions::change::{Repartition, Request};
    // GIVEN rows 1-6, and 2 partitions of `orders` stopped at [1,2] and [1,4]
    let w = World::default();
    w.source.upsert(1..=6, 1);
    for (i, checkpoint) in [(0, serde_json::json!([1, 2])), (1, serde_json::json!([1, 4]))] {
        let ledger = Ledger::new(w.store.clone(), APP, &format!("orders/partition-{i}-of-2"), Arc::new(SystemClock));
        let origin = Origin { function: "orders", source: "memory:rows", fingerprint: "memory-v1" };
        let mut doc = StateDoc::new(origin, checkpoint, "old", OffsetDateTime::now_utc());
        ledger.save(&mut doc, None, "old").await.expect("old partition");
    }
    // AND a destination whose row under the name `orders` (an earlier, unpartitioned life) says applied up to
    // [1,5], under fencing token 4
    let sink = RecordingSink::default();
    *sink.recorded.lock().expect("recorded") = Resume {
        fence: 4,
        applied: Some(Applied { batch_id: 3, from: serde_json::json!([1, 3]), to: serde_json::json!([1, 5]) }),
    };
    // WHEN the 2 partitions are changed into 1 (seeded at the earlier checkpoint, [1,2]) and it ticks
    let repartition = Repartition {
        store: w.store.clone(),
        app: APP.into(),
        group: "orders".into(),
        source: w.source.clone(),
        clock: Arc::new(SystemClock),
    };
    let request = Request {
        to: std::num::NonZeroU32::MIN,
        from: None,
        missing_from_earliest: false,
        quarantine_handled: false,
        who: "test".into(),
    };
    repartition.change(&request).await.expect("changed");
    let p = w.process("p1", TriggerSettings { max_batch_size: 10, ..settings() });
    let out = p.trigger.tick_into(&sink).await.expect("tick");
    // THEN it delivers from [1,2], not after the row's [1,5] (which would skip 3 and 4), above token 4
    assert_eq!(out.kind, OutcomeKind::Delivered, "{:?}", out.logs);
    assert_eq!(sink.ids(), ids(3..=6));
    assert_eq!(sink.taken()[0].1, 5, "the fence is raised above the destination's");
}
