//! Changing the partition count (`partitions::change`, `handler partitions change`) over an in-memory store
//! and source: where each new partition starts, every refusal (nothing written), and a re-run after a crash
//! between writes. The old layout's documents are written through the ledger as a deployment would leave them.

use serde_json::{json, Value};
use sql_pseudo_trigger::clock::{Clock, ManualClock};
use sql_pseudo_trigger::config::{Partition, TriggerSettings};
use sql_pseudo_trigger::engine::document::{Origin, QuarantineDoc, StateDoc};
use sql_pseudo_trigger::engine::{Ledger, Saved, TickError, Trigger};
use sql_pseudo_trigger::ops::{Action, OpsError};
use sql_pseudo_trigger::partitions::change::{Repartition, RepartitionError, Report, Request};
use sql_pseudo_trigger::source::{Fetched, Position, Source, SourceError, StartFrom};
use sql_pseudo_trigger::state::{MemoryStore, StateStore};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use testbed::faulty::{Fault, StoreOp};
use testbed::{FaultyStore, MemorySource};
use time::OffsetDateTime;

const APP: &str = "app";
const GROUP: &str = "orders";

struct World {
    inner: Arc<MemoryStore>,
    store: Arc<FaultyStore>,
    clock: ManualClock,
    source: Arc<dyn Source>,
}

fn world() -> World {
    world_over(Arc::new(MemorySource::new()))
}

fn world_over(source: Arc<dyn Source>) -> World {
    let inner = Arc::new(MemoryStore::new());
    let store = Arc::new(FaultyStore::new(inner.clone()));
    let clock = ManualClock::new(OffsetDateTime::from_unix_timestamp(1_800_000_000).expect("a time"));
    World { inner, store, clock, source }
}

fn name(i: u32, n: u32) -> String {
    if n == 1 {
        GROUP.to_string()
    } else {
        format!("{GROUP}/partition-{i}-of-{n}")
    }
}

fn at(v: u64, k: i64) -> Value {
    json!([v, k])
}

fn request(to: u32) -> Request {
    Request {
        to: NonZeroU32::new(to).expect("not zero"),
        from: None,
        missing_from_earliest: false,
        quarantine_handled: false,
        who: "alice@ops".into(),
    }
}

impl World {
    fn ledger(&self, i: u32, n: u32) -> Ledger {
        Ledger::new(self.inner.clone(), APP, &name(i, n), Arc::new(self.clock.clone()))
    }

    fn repartition(&self) -> Repartition {
        Repartition {
            store: self.store.clone(),
            app: APP.into(),
            group: GROUP.into(),
            source: self.source.clone(),
            clock: Arc::new(self.clock.clone()),
        }
    }

    /// Old partition `i` of `n` as a deployment left it: at `checkpoint`, `next_batch_id` 7, then `edit`ed.
    async fn old(&self, i: u32, n: u32, checkpoint: Value, edit: impl FnOnce(&mut StateDoc)) {
        let origin = Origin { function: "orders", source: "memory:rows", fingerprint: "memory-v1" };
        let mut doc = StateDoc::new(origin, checkpoint, "handler-1", self.clock.now());
        for _ in 0..6 {
            doc.allocate_batch_id();
        }
        edit(&mut doc);
        let saved = self.ledger(i, n).save(&mut doc, None, "handler-1").await.expect("save");
        assert!(matches!(saved, Saved::Written(_)));
    }

    async fn layout(&self, n: u32, checkpoints: impl Fn(u32) -> Value) {
        for i in 0..n {
            self.old(i, n, checkpoints(i), |_| {}).await;
        }
    }

    async fn doc(&self, i: u32, n: u32) -> Option<StateDoc> {
        self.ledger(i, n).load().await.expect("load").map(|(d, _)| d)
    }

    async fn keys(&self) -> Vec<String> {
        self.inner.list("").await.expect("list")
    }

    async fn change(&self, request: &Request) -> Result<Report, RepartitionError> {
        self.repartition().change(request).await
    }

    /// Every new document starts where `expected` says, seeded from `n`, its ids after every old one; every old
    /// document is retired into `m`.
    async fn assert_changed(&self, n: u32, m: u32, expected: impl Fn(u32) -> Value) {
        for j in 0..m {
            let doc = self.doc(j, m).await.unwrap_or_else(|| panic!("new partition {j} of {m} written"));
            assert_eq!(*doc.checkpoint(), expected(j), "new partition {j} of {m}");
            let seeded = doc.seeded().expect("seeded");
            assert_eq!(seeded.from_partitions, n);
            assert_eq!(doc.next_batch_id(), 7, "batch ids continue after the old ones");
            assert!(doc.halted().is_none() && doc.lease().is_none() && doc.in_flight().is_none());
            assert_eq!(doc.fingerprint(), "memory-v1");
            let function = if m == 1 { GROUP.to_string() } else { format!("{GROUP}-p{j}") };
            assert_eq!(doc.function(), function);
        }
        for i in 0..n {
            // A partition without a document (--missing-from-earliest) has nothing to retire.
            let Some(doc) = self.doc(i, n).await else { continue };
            assert_eq!(doc.retired_into(), Some(m), "old partition {i} of {n} retired: {:?}", doc.halted());
            let reason = doc.halted().unwrap_or_default();
            assert!(reason.contains("by alice@ops") && reason.contains("do not resume"), "{reason}");
        }
    }
}

/// Refused with a message containing every one of `words`, and the store as it was.
async fn assert_refused(w: &World, request: &Request, words: &[&str]) -> String {
    let before = w.keys().await;
    let e = w.change(request).await.expect_err("refused");
    let text = e.to_string();
    assert!(matches!(&e, RepartitionError::Refused { written, .. } if written.is_empty()), "{text}");
    assert!(text.contains("nothing was written"), "{text}");
    for word in words {
        assert!(text.contains(word), "{word:?} not in: {text}");
    }
    assert_eq!(w.keys().await, before, "a refusal writes nothing");
    text
}

#[tokio::test]
async fn one_to_four_seeds_every_partition_from_the_unpartitioned_document_and_retires_it() {
    // GIVEN an unpartitioned function at [10, 3]
    let w = world();
    w.old(0, 1, at(10, 3), |_| {}).await;
    // WHEN it is changed into 4 partitions
    let report = w.change(&request(4)).await.expect("changed");
    // THEN every new partition starts at [10, 3], and the old document is retired
    w.assert_changed(1, 4, |_| at(10, 3)).await;
    assert_eq!((report.from_partitions, report.to_partitions, report.already_done), (1, 4, false));
    assert_eq!(report.retired, ["app/orders.json"]);
    assert!(report.redelivered[0].starts_with("nothing"), "{:?}", report.redelivered);
    let table = report.to_string();
    assert!(table.contains("orders: partition count changed from 1 to 4"), "{table}");
    let row = table.lines().find(|l| l.starts_with("3 of 4")).unwrap_or_default();
    assert!(row.contains("[10,3]") && row.contains("0: [10,3]") && row.ends_with("written"), "{table}");
}

#[tokio::test]
async fn four_to_eight_carries_each_old_checkpoint_over_exactly() {
    let w = world();
    w.layout(4, |i| at(10 + u64::from(i), i64::from(i))).await;
    let report = w.change(&request(8)).await.expect("changed");
    w.assert_changed(4, 8, |j| at(10 + u64::from(j % 4), i64::from(j % 4))).await;
    assert_eq!(report.partitions[6].from.len(), 1);
    assert_eq!(report.partitions[6].from[0].index, 2);
    assert!(report.redelivered[0].starts_with("nothing"), "{:?}", report.redelivered);
}

#[tokio::test]
async fn eight_to_four_starts_each_new_partition_at_the_earlier_of_its_two_old_ones() {
    // GIVEN 8 partitions whose checkpoints are out of step: partition i at [(7 i) mod 10 + 1, i]
    let w = world();
    let checkpoint = |i: u32| at(u64::from((7 * i) % 10 + 1), i64::from(i));
    w.layout(8, checkpoint).await;
    let report = w.change(&request(4)).await.expect("changed");
    // THEN new j starts at the earlier of old j and old j + 4
    let earlier = |j: u32| {
        let (a, b) = (checkpoint(j), checkpoint(j + 4));
        if a[0].as_u64() <= b[0].as_u64() {
            a
        } else {
            b
        }
    };
    w.assert_changed(8, 4, earlier).await;
    // AND what the later one had passed is named as delivered again
    assert_eq!(report.redelivered.len(), 4, "{:?}", report.redelivered);
    assert!(report.redelivered.iter().all(|l| l.contains("after") && l.contains("up to")), "{:?}", report.redelivered);
}

#[tokio::test]
async fn four_to_six_starts_each_new_partition_at_the_earliest_of_the_old_ones_sharing_its_parity() {
    // GIVEN 4 partitions at [40,0], [10,1], [30,2], [20,3]
    let w = world();
    let checkpoints = [at(40, 0), at(10, 1), at(30, 2), at(20, 3)];
    w.layout(4, |i| checkpoints[i as usize].clone()).await;
    w.change(&request(6)).await.expect("changed");
    // THEN (gcd 2) even new partitions hold keys of old 0 and 2 only, odd ones of old 1 and 3
    w.assert_changed(4, 6, |j| if j % 2 == 0 { at(30, 2) } else { at(10, 1) }).await;
}

#[tokio::test]
async fn a_live_lease_refuses_until_it_expires_and_says_how_to_stop_the_function() {
    let w = world();
    w.layout(4, |i| at(5, i64::from(i))).await;
    w.store.fail_next(StoreOp::Save, Fault::Unavailable, 0);
    let now = w.clock.now();
    let ledger = w.ledger(2, 4);
    let (mut doc, etag) = ledger.load().await.expect("load").expect("doc");
    doc.take_lease("runner-7", Duration::from_secs(60), now);
    ledger.save(&mut doc, Some(&etag), "runner-7").await.expect("lease taken");
    let text =
        assert_refused(&w, &request(8), &["partition 2 of 4 is leased to runner-7", "orders-p0 … orders-p3"]).await;
    assert!(text.contains("disable its partition functions") && text.contains("stop its processes"), "{text}");
    // WHEN the lease has expired THEN the change goes through
    w.clock.advance(Duration::from_secs(61));
    w.change(&request(8)).await.expect("changed once the lease expired");
    w.assert_changed(4, 8, |j| at(5, i64::from(j % 4))).await;
}

#[tokio::test]
async fn quarantined_batches_refuse_by_id_until_handled_and_a_queued_retry_refuses_anyway() {
    let w = world();
    w.layout(4, |i| at(5, i64::from(i))).await;
    let quarantined = QuarantineDoc {
        function: "orders-p1".into(),
        batch_id: 4,
        from: at(2, 1),
        to: at(3, 1),
        failures: 5,
        reason: "rejected".into(),
        at: w.clock.now(),
        changes: serde_json::value::RawValue::from_string("[]".into()).expect("raw"),
    };
    let key = w.ledger(1, 4).write_quarantine(&quarantined).await.expect("quarantined");
    assert_refused(
        &w,
        &request(8),
        &["partition 1 of 4 has quarantined batches (4)", "handler state quarantine retry orders-p1"],
    )
    .await;
    // A retry queued and not yet delivered refuses even when the documents were dealt with.
    let ledger = w.ledger(1, 4);
    let (mut doc, etag) = ledger.load().await.expect("load").expect("doc");
    doc.queue_quarantine_retry(4);
    ledger.save(&mut doc, Some(&etag), "operator").await.expect("queued");
    let handled = Request { quarantine_handled: true, ..request(8) };
    assert_refused(&w, &handled, &["queued for re-delivery (4)"]).await;
    // Once delivered (the queue empty), --quarantine-handled lets the change through and names what is left.
    let (mut doc, etag) = ledger.load().await.expect("load").expect("doc");
    doc.take_quarantine_retry();
    ledger.save(&mut doc, Some(&etag), "handler-1").await.expect("retried");
    let report = w.change(&handled).await.expect("changed");
    assert_eq!(report.quarantine_left, [key]);
}

#[tokio::test]
async fn a_missing_old_document_refuses_unless_its_keys_start_from_the_earliest_position() {
    let w = world();
    for i in [0, 1, 3] {
        w.old(i, 4, at(9, i64::from(i)), |_| {}).await;
    }
    assert_refused(
        &w,
        &request(8),
        &["partition 2 of 4 has no state document (app/orders/partition-2-of-4.json)", "--missing-from-earliest"],
    )
    .await;
    let report = w.change(&Request { missing_from_earliest: true, ..request(8) }).await.expect("changed");
    assert_eq!(report.retired.len(), 3);
    assert!(w.doc(2, 4).await.is_none(), "no document is made up for the missing partition");
    // The memory source's earliest position is null: everything of partition 2's keys again.
    w.assert_changed(4, 8, |j| if j % 4 == 2 { Value::Null } else { at(9, i64::from(j % 4)) }).await;
    assert!(report.redelivered.iter().any(|l| l.contains("(no document)")), "{:?}", report.redelivered);
}

#[tokio::test]
async fn an_existing_new_layout_not_made_by_a_change_refuses() {
    let w = world();
    w.layout(4, |i| at(5, i64::from(i))).await;
    // A deployment with 8 partitions ran already and wrote partition 5's document from startFrom.
    w.old(5, 8, at(50, 5), |_| {}).await;
    assert_refused(
        &w,
        &request(8),
        &["the new layout exists already: app/orders/partition-5-of-8.json", "delete the documents"],
    )
    .await;
    // Two layouts in use: the one to change from must be named.
    assert_refused(&w, &request(2), &["several partition layouts of orders", "--from N"]).await;
    // Asking for the count it already runs with changes nothing.
    let only_four = world();
    only_four.layout(4, |i| at(5, i64::from(i))).await;
    assert_refused(&only_four, &request(4), &["orders already runs with 4 partition(s)"]).await;
    // No state at all: nothing to carry over.
    assert_refused(&world(), &request(4), &["has no state documents", "Set \"partitions\" to 4"]).await;
}

#[tokio::test]
async fn paused_or_halted_old_partitions_refuse_and_say_so() {
    let w = world();
    w.layout(4, |i| at(5, i64::from(i))).await;
    let ledger = w.ledger(0, 4);
    let (mut doc, etag) = ledger.load().await.expect("load").expect("doc");
    doc.pause();
    ledger.save(&mut doc, Some(&etag), "operator").await.expect("paused");
    let ledger3 = w.ledger(3, 4);
    let (mut doc, etag) = ledger3.load().await.expect("load").expect("doc");
    doc.halt("batch 6 is poison".into());
    ledger3.save(&mut doc, Some(&etag), "handler-1").await.expect("halted");
    assert_refused(&w, &request(8), &["partition 0 of 4 is paused", "partition 3 of 4 is halted (batch 6 is poison)"])
        .await;
}

#[tokio::test]
async fn an_open_backfill_refuses_because_its_position_is_a_key_of_the_old_layout() {
    let w = world();
    w.layout(4, |i| at(5, i64::from(i))).await;
    let ledger = w.ledger(2, 4);
    let (mut doc, etag) = ledger.load().await.expect("load").expect("doc");
    let now = time::OffsetDateTime::now_utc();
    let backfill = sql_pseudo_trigger::engine::document::Backfill::new(at(5, 2), None, Some(100), "operator", now);
    doc.start_backfill(backfill).expect("started");
    ledger.save(&mut doc, Some(&etag), "operator").await.expect("saved");
    let refusal = assert_refused(&w, &request(8), &["partition 2 of 4 has backfill", "--cancel"]).await;
    assert!(refusal.contains("not carried over"), "{refusal}");
}

/// The memory source with an order that cannot tell any two positions apart, as a real source cannot tell
/// positions of one cursor value apart without its database; and the position it names as no later than any
/// (`None`: it cannot name one).
#[derive(Debug)]
struct Unordered(MemorySource, Option<Position>);

#[async_trait::async_trait]
impl Source for Unordered {
    fn name(&self) -> String {
        self.0.name()
    }
    fn fingerprint(&self) -> String {
        self.0.fingerprint()
    }
    async fn validate(&self) -> Result<(), SourceError> {
        self.0.validate().await
    }
    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError> {
        self.0.start_position(from).await
    }
    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError> {
        self.0.fetch(after, limit).await
    }
    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError> {
        self.0.refetch(after, upto, limit).await
    }
    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        self.0.pending(after).await
    }
    async fn no_later_than(&self, _positions: &[Position]) -> Result<Option<Position>, SourceError> {
        Ok(self.1.clone())
    }
}

#[tokio::test]
async fn positions_the_source_cannot_order_refuse_a_count_that_is_not_a_multiple_but_not_one_that_is() {
    let w = world_over(Arc::new(Unordered(MemorySource::new(), None)));
    w.layout(4, |i| at(5, i64::from(i))).await;
    assert_refused(
        &w,
        &request(6),
        &["new partition 0 of 6 may hold keys of old partitions 0 and 2", "a multiple of 4"],
    )
    .await;
    assert_refused(&w, &request(2), &["can neither order nor name a position before"]).await;
    // 4 → 8 compares nothing: each new partition has one old one.
    w.change(&request(8)).await.expect("changed");
    w.assert_changed(4, 8, |j| at(5, i64::from(j % 4))).await;
}

#[tokio::test]
async fn positions_of_one_transaction_merge_at_the_position_the_source_names_before_them() {
    // GIVEN 4 partitions stopped inside one transaction (cursor 5), which the source orders only in its database,
    // where it names [4, 0] as no later than any of them
    let w = world_over(Arc::new(Unordered(MemorySource::new(), Some(at(4, 0)))));
    w.layout(4, |i| at(5, i64::from(i))).await;
    // WHEN they merge into 2
    let report = w.change(&request(2)).await.expect("changed");
    // THEN both new partitions start there, and what they deliver again is named per old checkpoint
    w.assert_changed(4, 2, |_| at(4, 0)).await;
    assert_eq!(report.redelivered.len(), 4, "{:?}", report.redelivered);
    assert!(report.redelivered[0].contains("old partition 0 of 4 after [4,0] up to [5,0]"), "{:?}", report.redelivered);
}

#[tokio::test]
async fn a_crash_between_writes_is_finished_by_running_the_change_again() {
    // GIVEN 4 partitions, and a store that fails the third write (two new documents written) and, on the second
    // run, the tenth (the six other new documents and two retirements written)
    let w = world();
    w.layout(4, |i| at(20 + u64::from(i), i64::from(i))).await;
    w.store.fail_next(StoreOp::Save, Fault::Pass, 2);
    w.store.fail_next(StoreOp::Save, Fault::Unavailable, 1);
    let e = w.change(&request(8)).await.expect_err("stopped midway");
    let text = e.to_string();
    assert!(
        matches!(&e, RepartitionError::Store { written, .. } if written.len() == 2)
            && text.contains("run the same command again"),
        "{text}"
    );
    // The old deployment, had it come back now, would still run: nothing is retired.
    assert!(w.doc(0, 4).await.expect("old").halted().is_none());
    // WHEN run again, failing once more after eight writes
    w.store.fail_next(StoreOp::Save, Fault::Pass, 8);
    w.store.fail_next(StoreOp::Save, Fault::Ambiguous, 1);
    let e = w.change(&request(8)).await.expect_err("stopped again");
    assert!(matches!(&e, RepartitionError::Store { written, .. } if written.len() == 8), "{e}");
    // THEN a third run finishes: the documents of the earlier runs are kept, the rest retired
    let report = w.change(&request(8)).await.expect("finished");
    assert!(report.partitions.iter().all(|p| !p.written), "every new document came from an earlier run");
    assert!(!report.already_done && !report.retired.is_empty() && report.retired.len() < 4, "{:?}", report.retired);
    w.assert_changed(4, 8, |j| at(20 + u64::from(j % 4), i64::from(j % 4))).await;
    // AND a fourth run reports it done and writes nothing
    let before = w.keys().await;
    let report = w.change(&request(8)).await.expect("done");
    assert!(report.already_done && report.retired.is_empty(), "{report:?}");
    assert!(report.to_string().contains("was already changed from 4 to 8"), "{report}");
    assert_eq!(w.keys().await, before);
}

#[tokio::test]
async fn an_old_deployment_that_comes_back_stops_at_its_retired_document_and_cannot_be_resumed() {
    let w = world();
    w.layout(4, |i| at(5, i64::from(i))).await;
    w.change(&request(8)).await.expect("changed");
    // GIVEN the trigger of old partition 1 of 4, as `handler run` with the old folder builds it
    let mut config = testbed::config::function("orders-p1", TriggerSettings { ..testbed::config::settings() });
    let four = NonZeroU32::new(4).expect("4");
    config.partitioning = sql_pseudo_trigger::config::Partitioning { count: four, only: Some(1), group: GROUP.into() };
    config.source.partition = Partition::new(1, four);
    let source = Arc::new(MemorySource::new());
    source.upsert([1, 2, 3], 1);
    let trigger =
        Trigger::new(config, APP, source, w.inner.clone(), "old-runner".into()).with_clock(Arc::new(w.clock.clone()));
    assert_eq!(trigger.state_key(), "app/orders/partition-1-of-4.json");
    // WHEN it ticks THEN it stops, saying where the state went; nothing is delivered
    let e = trigger.tick(&testbed::attempts::first()).await.expect_err("stopped");
    assert!(matches!(e, TickError::Retired { .. }), "{e}");
    assert!(e.to_string().contains("re-partitioned into 8 partitions"), "{e}");
    // AND an operator's resume is refused
    let e = trigger.operate(Action::Resume, "bob").await.expect_err("refused");
    assert!(matches!(e, OpsError::Invalid(_)) && e.to_string().contains("is not resumed"), "{e}");
}

// ---------------------------------------------------------------------------------------------------------------
// Delivery across a change: partition triggers over a source that reads only their keys
// ---------------------------------------------------------------------------------------------------------------

/// The memory source read by one partition: only keys with `key mod count == index` (the key is its own hash),
/// at the memory source's positions. What a real source's partition predicate does, so that a new partition
/// starting later than it should would never see the changes in between.
#[derive(Debug)]
struct PartitionOf {
    inner: Arc<MemorySource>,
    index: i64,
    count: i64,
}

impl PartitionOf {
    fn mine(&self, change: &sql_pseudo_trigger::change::Change) -> bool {
        let item: Value = serde_json::from_str(change.item.get()).expect("json");
        item["id"].as_i64().expect("id").rem_euclid(self.count) == self.index
    }

    /// Up to `limit` of this partition's changes after `after` (up to `upto`), one of the inner source's at a time,
    /// so each change's position is known.
    async fn read(&self, after: &Position, upto: Option<&Position>, limit: usize) -> Result<Fetched, SourceError> {
        let mut out = Fetched::default();
        let mut at = after.clone();
        while out.changes.len() < limit {
            let one = match upto {
                Some(upto) => self.inner.refetch(&at, upto, 1).await?,
                None => self.inner.fetch(&at, 1).await?,
            };
            let (Some(change), Some(last)) = (one.changes.into_iter().next(), one.last) else { break };
            if self.mine(&change) {
                out.changes.push(change);
                out.last = Some(last.clone());
            }
            at = last;
        }
        Ok(out)
    }
}

#[async_trait::async_trait]
impl Source for PartitionOf {
    fn name(&self) -> String {
        self.inner.name()
    }
    fn fingerprint(&self) -> String {
        self.inner.fingerprint()
    }
    fn position_order(&self, a: &Position, b: &Position) -> Option<std::cmp::Ordering> {
        self.inner.position_order(a, b)
    }
    async fn validate(&self) -> Result<(), SourceError> {
        Ok(())
    }
    async fn start_position(&self, from: StartFrom) -> Result<Position, SourceError> {
        self.inner.start_position(from).await
    }
    async fn fetch(&self, after: &Position, limit: usize) -> Result<Fetched, SourceError> {
        self.read(after, None, limit).await
    }
    async fn refetch(&self, after: &Position, upto: &Position, limit: usize) -> Result<Fetched, SourceError> {
        self.read(after, Some(upto), limit).await
    }
    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        Ok(self.read(after, None, usize::MAX).await?.changes.len() as u64)
    }
}

/// A destination that keeps the last value delivered for each key.
#[derive(Debug, Default)]
struct Latest(std::sync::Mutex<std::collections::BTreeMap<i64, i64>>);

#[async_trait::async_trait]
impl sql_pseudo_trigger::sink::Sink for Latest {
    async fn deliver(
        &self,
        batch: &sql_pseudo_trigger::sink::SinkBatch<'_>,
    ) -> Result<(), sql_pseudo_trigger::sink::SinkError> {
        let mut latest = self.0.lock().expect("latest");
        for change in batch.changes {
            let item: Value = serde_json::from_str(change.item.get()).expect("json");
            latest.insert(item["id"].as_i64().expect("id"), item["v"].as_i64().expect("v"));
        }
        Ok(())
    }
    fn describe(&self) -> String {
        "latest".into()
    }
}

/// The sink-mode trigger of partition `index` of `count` of `orders` over `source`, on `store`.
fn partition_trigger(source: &Arc<MemorySource>, store: &Arc<MemoryStore>, index: u32, count: u32) -> Trigger {
    let settings = TriggerSettings {
        max_batch_size: 2,
        delivery_mode: sql_pseudo_trigger::config::DeliveryMode::Sink,
        // Expired as soon as granted: the stopped processes leave no lease to wait out.
        lease_duration: Duration::ZERO,
        ..testbed::config::settings()
    };
    let count_nz = NonZeroU32::new(count).expect("a count");
    let mut config = testbed::config::function(&format!("{GROUP}-p{index}"), settings);
    if count > 1 {
        config.partitioning =
            sql_pseudo_trigger::config::Partitioning { count: count_nz, only: Some(index), group: GROUP.into() };
        config.source.partition = Partition::new(index, count_nz);
    } else {
        config.name = GROUP.into();
    }
    let partition = PartitionOf { inner: source.clone(), index: i64::from(index), count: i64::from(count) };
    Trigger::new(config, APP, Arc::new(partition), store.clone(), format!("process-{index}-of-{count}"))
}

/// Changes a function's partitions from `n` to `m` between two runs and checks that every key's last value
/// arrives: partition i of the old layout runs i + 1 ticks of 2 changes (so their checkpoints are out of step,
/// with changes waiting behind the first ones), the new layout then drains. The keys a skip would lose: `Err`.
async fn delivers_every_last_value_across(n: u32, m: u32) -> Result<(), Vec<i64>> {
    let source = Arc::new(MemorySource::new());
    let store = Arc::new(MemoryStore::new());
    let sink = Latest::default();
    // Three rounds over 48 keys, each round in transactions of 8 keys.
    for round in 1..=3 {
        for chunk in (1..=48).collect::<Vec<i64>>().chunks(8) {
            source.upsert(chunk.iter().copied(), round);
        }
    }
    for i in 0..n {
        let trigger = partition_trigger(&source, &store, i, n);
        for _ in 0..=i {
            trigger.tick_into(&sink).await.expect("old tick");
        }
    }
    // A fourth round for half of the keys while the function is stopped.
    source.upsert((1..=48).filter(|k| k % 2 == 0), 4);
    let repartition = Repartition {
        store: store.clone(),
        app: APP.into(),
        group: GROUP.into(),
        source: Arc::new(PartitionOf { inner: source.clone(), index: 0, count: 1 }),
        clock: Arc::new(sql_pseudo_trigger::clock::SystemClock),
    };
    repartition.change(&request(m)).await.unwrap_or_else(|e| panic!("{n} → {m}: {e}"));
    for j in 0..m {
        let trigger = partition_trigger(&source, &store, j, m);
        for _ in 0..100 {
            if trigger.tick_into(&sink).await.expect("new tick").changes.is_empty() {
                break;
            }
        }
    }
    let latest = sink.0.lock().expect("latest").clone();
    let stale: Vec<i64> = (1..=48).filter(|k| latest.get(k).copied() != Some(if k % 2 == 0 { 4 } else { 3 })).collect();
    if stale.is_empty() {
        Ok(())
    } else {
        Err(stale)
    }
}

#[tokio::test]
async fn partition_triggers_deliver_every_last_value_across_a_change_of_the_count() {
    let mut lost = Vec::new();
    for (n, m) in [(1, 4), (4, 8), (8, 4), (4, 6), (6, 4), (3, 1), (2, 3)] {
        if let Err(keys) = delivers_every_last_value_across(n, m).await {
            lost.push(format!("{n} → {m}: keys {keys:?} never got their last value"));
        }
    }
    assert!(lost.is_empty(), "{lost:#?}");
}
