//! Operator actions against an in-memory source and store. A second [`Trigger`] on the same store plays
//! another process (a handler instance or another operator); a [`FaultyStore`] hook lets it write between
//! an action's read and its compare-and-swap.
use crate::hand_edit;
use serde_json::{json, Value};
use sql_pseudo_trigger::clock::ManualClock;
use sql_pseudo_trigger::config::ncrontab::Schedule;
use sql_pseudo_trigger::config::{FunctionConfig, TriggerSettings};
use sql_pseudo_trigger::engine::document::StateDoc;
use sql_pseudo_trigger::engine::Trigger;
use sql_pseudo_trigger::ops::*;
use sql_pseudo_trigger::protocol::Attempt;
use sql_pseudo_trigger::source::{Position, SourceError, StartFrom};
use sql_pseudo_trigger::state::{MemoryStore, StateStore};
use std::sync::Arc;
use testbed::{FaultyStore, MemorySource};
use time::OffsetDateTime;

/// How the host calls: a first attempt, or the first retry after the previous attempt failed.
#[derive(Debug, Clone, Copy)]
enum Call {
    First,
    Retry,
}
const NORMAL: Call = Call::First;
const FIRST_RETRY: Call = Call::Retry;

fn config(max_attempts: u32) -> FunctionConfig {
    testbed::config::function("orders", TriggerSettings { max_attempts, ..testbed::config::settings() })
}

struct World {
    source: Arc<MemorySource>,
    inner: Arc<MemoryStore>,
    store: Arc<FaultyStore>,
    trigger: Trigger,
    max_attempts: u32,
    /// The host's last attempt: what a retry names.
    last: std::sync::Mutex<Attempt>,
}

fn world(max_attempts: u32) -> World {
    let source = Arc::new(MemorySource::new());
    let inner = Arc::new(MemoryStore::new());
    let store = Arc::new(FaultyStore::new(inner.clone()));
    let trigger = Trigger::new(config(max_attempts), "app", source.clone(), store.clone(), "handler-1".into());
    World { source, inner, store, trigger, max_attempts, last: std::sync::Mutex::new(testbed::attempts::first()) }
}

impl World {
    /// Another process on the same source and store, unaffected by this one's injected faults.
    fn other(&self, owner: &str) -> Arc<Trigger> {
        let trigger =
            Trigger::new(config(self.max_attempts), "app", self.source.clone(), self.inner.clone(), owner.into());
        Arc::new(trigger)
    }

    async fn doc(&self) -> StateDoc {
        self.trigger.load().await.expect("load").expect("a state document").0
    }

    /// The attempt the host makes for `call`.
    fn attempt(&self, call: Call) -> Attempt {
        let mut last = self.last.lock().expect("last attempt");
        *last = match call {
            Call::First => testbed::attempts::first(),
            Call::Retry => testbed::attempts::retry_after(1, &last),
        };
        last.clone()
    }

    /// One tick; the ids it answered.
    async fn tick(&self, call: Call) -> Vec<i64> {
        let outcome = self.trigger.tick(&self.attempt(call)).await.expect("tick");
        ids(&outcome.changes)
    }
}

fn ids(changes: &[sql_pseudo_trigger::change::Change]) -> Vec<i64> {
    changes
        .iter()
        .map(|c| {
            let item: Value = serde_json::from_str(c.item.get()).expect("items are JSON");
            item["id"].as_i64().expect("an id")
        })
        .collect()
}

#[tokio::test]
async fn an_action_that_loses_the_race_to_another_operator_applies_itself_again_and_loses_no_write() {
    // GIVEN a function that delivered rows 1-3
    let w = world(5);
    w.source.upsert(1..=3, 1);
    assert_eq!(w.tick(NORMAL).await, vec![1, 2, 3]);
    // AND another operator whose replay lands between this pause's read and its write
    let other = w.other("operator-2");
    w.store.before_next_save(move || async move {
        replay(&other, Position::Null, "operator 2").await.expect("the other operator wins");
    });

    // WHEN this operator pauses, once
    pause(&w.trigger, "operator 1").await.expect("the pause applies itself to what the replay left");

    // THEN both writes hold: the replay that won, and the pause on top of it
    let doc = w.doc().await;
    assert!(doc.paused());
    assert_eq!(*doc.checkpoint(), Position::Null);
    assert!(doc.in_flight().is_none());
}

#[tokio::test]
async fn an_action_that_loses_the_race_to_a_tick_applies_itself_again_and_leaves_the_ticks_batch_in_flight() {
    // GIVEN a drained function and two new rows
    let w = world(5);
    w.source.upsert(1..=3, 1);
    w.tick(NORMAL).await;
    assert!(w.tick(NORMAL).await.is_empty());
    w.source.upsert(4..=5, 2);
    // AND another instance whose tick commits between this pause's read and its write
    let instance = w.other("handler-2");
    let answered = Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = answered.clone();
    w.store.before_next_save(move || async move {
        let outcome = instance.tick(&testbed::attempts::first()).await.expect("the other instance's tick");
        *seen.lock().expect("seen") = ids(&outcome.changes);
    });

    // WHEN this operator pauses, once
    pause(&w.trigger, "operator").await.expect("the pause applies itself to what the tick left");

    // THEN the pause holds, and the tick's batch (rows 4, 5) stays recorded in flight
    assert_eq!(*answered.lock().expect("answered"), vec![4, 5]);
    let doc = w.doc().await;
    assert!(doc.paused());
    let in_flight = doc.in_flight().expect("the tick's batch is in flight");
    assert_eq!((in_flight.range.batch_id, in_flight.range.rows, in_flight.owner.as_str()), (2, 2, "handler-2"));
}

#[tokio::test]
async fn actions_on_a_function_that_never_ran_say_so() {
    let w = world(5);
    for err in [
        pause(&w.trigger, "op").await.expect_err("no state"),
        resume(&w.trigger, "op").await.expect_err("no state"),
        replay(&w.trigger, Position::Null, "op").await.map(|_| ()).expect_err("no state"),
    ] {
        assert!(matches!(err, OpsError::NoState(_)), "{err:?}");
        assert!(err.to_string().contains("has not run"), "{err}");
    }
    // Status and show still answer: nothing pending yet, no state
    let s = status(&w.trigger).await.expect("status");
    assert_eq!((s.pending, s.target_workers, s.paused), (0, 0, false));
    assert_eq!(show(&w.trigger).await.expect("show")["state"], Value::Null);
}

#[tokio::test]
async fn a_function_that_never_ran_counts_pending_changes_from_where_its_first_tick_starts() {
    // GIVEN 3 rows in the table and a function that never ran
    let mut w = world(5);
    w.source.upsert(1..=3, 1);
    // THEN with startFrom earliest all 3 are pending
    assert_eq!(status(&w.trigger).await.expect("status").pending, 3);

    // AND with startFrom now none is: the first tick starts after them
    let mut now = config(5);
    now.source.start_from = sql_pseudo_trigger::source::StartFrom::Now;
    w.trigger = Trigger::new(now, "app", w.source.clone(), w.store.clone(), "handler-1".into());
    let s = status(&w.trigger).await.expect("status");
    assert_eq!((s.pending, s.lag_seconds), (0, Some(0.0)));
    // (Until the first tick writes the state, "now" is each status call's now: nothing is pending.)
}

#[tokio::test]
async fn status_counts_pending_changes_and_the_workers_they_need() {
    // GIVEN a function with nothing pending
    let w = world(5);
    let s = status(&w.trigger).await.expect("status");
    assert_eq!((s.pending, s.target_workers), (0, 0));
    // WHEN 5 rows arrive THEN 5 are pending, for one worker (MaxChangesPerWorker 1000)
    w.source.upsert(1..=5, 1);
    let s = status(&w.trigger).await.expect("status");
    assert_eq!((s.pending, s.target_workers), (5, 1));
    // WHEN 2,495 more arrive THEN 2,500 need ceil(2500 / 1000) = 3 workers
    w.source.upsert(6..=2500, 2);
    let s = status(&w.trigger).await.expect("status");
    assert_eq!((s.pending, s.target_workers), (2500, 3));
    // AND a batch in flight still counts as pending until it is acknowledged
    assert_eq!(w.tick(NORMAL).await.len(), 100);
    assert_eq!(status(&w.trigger).await.expect("status").pending, 2500);
    w.tick(NORMAL).await;
    let s = status(&w.trigger).await.expect("status");
    assert_eq!((s.pending, s.in_flight.is_some()), (2400, true));
    assert!(s.seconds_since_progress >= 0.0);
}

#[tokio::test]
async fn status_reports_the_pace_the_time_to_drain_at_it_and_the_ceiling_of_the_schedule() {
    // GIVEN 10,000 changes, a function fired every 5 s (100 per firing) on a manual clock
    let clock = Arc::new(ManualClock::new(OffsetDateTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000)));
    let mut function = config(5);
    function.schedule = Some(Schedule::parse("*/5 * * * * *").expect("valid"));
    let source = Arc::new(MemorySource::new());
    let store = Arc::new(MemoryStore::new());
    let trigger = Trigger::new(function, "app", source.clone(), store, "handler-1".into()).with_clock(clock.clone());
    source.upsert(1..=10_000, 1);
    let s = status(&trigger).await.expect("status");
    // THEN before anything is acknowledged the pace and the drain time are unknown; the ceiling is 100 per 5 s
    assert_eq!((s.pace_per_second, s.seconds_to_drain, s.ceiling_per_second), (None, None, Some(20.0)));

    // WHEN it runs five minutes of firings, each acknowledging the batch before it (proof window 0)
    for _ in 0..61 {
        trigger.tick(&testbed::attempts::first()).await.expect("tick");
        clock.advance(std::time::Duration::from_secs(5));
    }
    // THEN the pace is the 20 changes per second it moves at, and the drain time is what is left at that pace
    let s = status(&trigger).await.expect("status");
    let pace = s.pace_per_second.expect("known after five minutes");
    assert!((pace - 20.0).abs() < 2.0, "pace {pace}");
    assert_eq!(s.pending, 10_000 - 60 * 100);
    assert_eq!(s.seconds_to_drain, Some(s.pending as f64 / pace));
}

/// Reads status, and the seconds since `at` measured just before and just after: the bounds any age of a
/// change committed at `at` that status computes must fall between.
async fn status_with_age_bounds(t: &Trigger, at: OffsetDateTime) -> (Status, std::ops::RangeInclusive<f64>) {
    let before = (OffsetDateTime::now_utc() - at).as_seconds_f64();
    let s = status(t).await.expect("status");
    let after = (OffsetDateTime::now_utc() - at).as_seconds_f64();
    (s, before..=after)
}

#[tokio::test]
async fn the_lag_is_the_age_of_the_oldest_undelivered_change_until_it_is_acknowledged() {
    // GIVEN rows 1-2 committed an hour ago
    let w = world(5);
    let hour_ago = OffsetDateTime::now_utc() - time::Duration::hours(1);
    w.source.upsert_at(1..=2, 1, hour_ago);

    // WHEN status is read THEN the lag is their age, an hour
    let (s, bounds) = status_with_age_bounds(&w.trigger, hour_ago).await;
    let lag = s.lag_seconds.expect("the memory source dates its changes");
    assert!(bounds.contains(&lag), "lag {lag} not in {bounds:?}");
    assert_eq!(s.lag_unknown_reason, None);

    // WHEN they are delivered but not yet acknowledged THEN they still wait: the lag is still their age
    assert_eq!(w.tick(NORMAL).await, vec![1, 2]);
    let (s, bounds) = status_with_age_bounds(&w.trigger, hour_ago).await;
    assert!(s.lag_seconds.is_some_and(|lag| bounds.contains(&lag)), "{:?} not in {bounds:?}", s.lag_seconds);

    // WHEN row 3, committed a minute ago, is delivered and that acknowledges rows 1-2
    let minute_ago = OffsetDateTime::now_utc() - time::Duration::minutes(1);
    w.source.upsert_at([3], 2, minute_ago);
    assert_eq!(w.tick(NORMAL).await, vec![3]);

    // THEN the lag is row 3's minute
    let (s, bounds) = status_with_age_bounds(&w.trigger, minute_ago).await;
    assert!(s.lag_seconds.is_some_and(|lag| bounds.contains(&lag)), "{:?} not in {bounds:?}", s.lag_seconds);

    // WHEN row 3 is acknowledged THEN nothing waits and the lag is 0
    assert!(w.tick(NORMAL).await.is_empty());
    let s = status(&w.trigger).await.expect("status");
    assert_eq!((s.pending, s.lag_seconds, s.lag_unknown_reason), (0, Some(0.0), None));
}

#[tokio::test]
async fn a_change_the_late_commit_guard_holds_back_counts_toward_the_lag_but_not_as_pending() {
    // GIVEN a drained function, a transaction left open, and a later one committed ten minutes ago
    let w = world(5);
    w.tick(NORMAL).await;
    let open = w.source.begin();
    let ten_minutes_ago = OffsetDateTime::now_utc() - time::Duration::minutes(10);
    w.source.upsert_at([7], 1, ten_minutes_ago);

    // WHEN status is read
    let (s, bounds) = status_with_age_bounds(&w.trigger, ten_minutes_ago).await;

    // THEN nothing is deliverable yet, but the held-back change has waited ten minutes: a stuck guard shows
    assert_eq!(s.pending, 0);
    assert!(s.lag_seconds.is_some_and(|lag| bounds.contains(&lag)), "{:?} not in {bounds:?}", s.lag_seconds);
    // AND once the open transaction ends, the change is delivered and the lag is 0
    w.source.commit(open);
    assert_eq!(w.tick(NORMAL).await, vec![7]);
    w.tick(NORMAL).await;
    assert_eq!(status(&w.trigger).await.expect("status").lag_seconds, Some(0.0));
}

/// A source that cannot date its changes: the memory source behind the trait's default lag.
#[derive(Debug)]
struct Undated(Arc<MemorySource>);

#[async_trait::async_trait]
impl sql_pseudo_trigger::source::Source for Undated {
    fn name(&self) -> String {
        "undated:rows".into()
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
    async fn fetch(&self, after: &Position, limit: usize) -> Result<sql_pseudo_trigger::source::Fetched, SourceError> {
        self.0.fetch(after, limit).await
    }
    async fn refetch(
        &self,
        after: &Position,
        upto: &Position,
        limit: usize,
    ) -> Result<sql_pseudo_trigger::source::Fetched, SourceError> {
        self.0.refetch(after, upto, limit).await
    }
    async fn pending(&self, after: &Position) -> Result<u64, SourceError> {
        self.0.pending(after).await
    }
}

#[tokio::test]
async fn a_source_that_cannot_date_its_changes_reports_no_lag_and_says_why() {
    // GIVEN a source without dates, with rows waiting
    let source = Arc::new(MemorySource::new());
    source.upsert(1..=3, 1);
    let undated = Arc::new(Undated(source));
    let trigger = Trigger::new(config(5), "app", undated, Arc::new(MemoryStore::new()), "handler-1".into());

    // WHEN status is read THEN the lag is unknown, the reason names the source, and the rest still answers
    let s = status(&trigger).await.expect("status");
    assert_eq!(s.lag_seconds, None);
    assert_eq!(s.lag_unknown_reason.as_deref(), Some("undated:rows does not record when a change was made"));
    assert_eq!(s.pending, 3);
    // AND the JSON carries both fields
    let json = serde_json::to_value(&s).expect("json");
    assert_eq!(
        (&json["lag_seconds"], &json["lag_unknown_reason"]),
        (&Value::Null, &json!("undated:rows does not record when a change was made"))
    );
}

#[tokio::test]
async fn reset_refuses_without_confirmation_and_changes_nothing() {
    let w = world(5);
    w.source.upsert(1..=3, 1);
    w.tick(NORMAL).await;
    let before = w.doc().await;

    let err = reset(&w.trigger, ResetTo::Now, false, "op").await.expect_err("needs confirmation");

    assert!(matches!(err, OpsError::NeedsConfirmation(_)), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("--confirm") && message.contains("confirm=true"), "{message}");
    assert_eq!(w.doc().await.write_id(), before.write_id());
}

#[tokio::test]
async fn reset_to_now_skips_every_existing_row_even_before_the_first_tick() {
    // GIVEN rows 1-3 and a function that never ran
    let w = world(5);
    w.source.upsert(1..=3, 1);
    // WHEN it is reset to now
    let answer = reset(&w.trigger, ResetTo::Now, true, "op").await.expect("reset");
    assert_eq!(answer["checkpoint"], serde_json::json!([1, 3]));
    // THEN rows 1-3 are never delivered, and a later row is
    assert!(w.tick(NORMAL).await.is_empty());
    w.source.upsert([4], 2);
    assert_eq!(w.tick(NORMAL).await, vec![4]);
}

#[tokio::test]
async fn reset_drops_the_batch_in_flight_and_clears_a_halt() {
    let w = world(5);
    w.source.upsert(1..=3, 1);
    w.tick(NORMAL).await;
    let store = w.inner.clone();
    let (mut doc, etag) = w.trigger.load().await.expect("load").expect("state");
    doc.halt("test halt".into());
    store.save_if(w.trigger.state_key(), &serde_json::to_vec(&doc).expect("json"), Some(&etag)).await.expect("save");

    reset(&w.trigger, ResetTo::Earliest, true, "op").await.expect("reset");

    let doc = w.doc().await;
    assert!(doc.in_flight().is_none() && doc.halted().is_none());
    assert_eq!(*doc.checkpoint(), Position::Null);
    assert_eq!(w.tick(NORMAL).await, vec![1, 2, 3]);
}

#[tokio::test]
async fn replay_redelivers_exactly_the_changes_after_the_position_under_new_batch_ids() {
    // GIVEN rows 1-3 then 4-5, both delivered and acknowledged
    let w = world(5);
    w.source.upsert(1..=3, 1);
    assert_eq!(w.tick(NORMAL).await, vec![1, 2, 3]);
    w.source.upsert(4..=5, 2);
    assert_eq!(w.tick(NORMAL).await, vec![4, 5]);
    assert!(w.tick(NORMAL).await.is_empty());
    let after_first = serde_json::json!([1, 3]);

    // WHEN the operator replays from after row 3
    let answer = replay(&w.trigger, after_first.clone(), "op").await.expect("replay");

    // THEN the answer says where from and where it was, and exactly rows 4-5 come again as batch 3
    assert_eq!(answer["checkpoint"], after_first);
    assert_eq!(answer["previous_checkpoint"], serde_json::json!([2, 5]));
    let outcome = w.trigger.tick(&w.attempt(NORMAL)).await.expect("tick");
    assert_eq!((ids(&outcome.changes), outcome.batch_id), (vec![4, 5], Some(3)));
    assert!(w.tick(NORMAL).await.is_empty());
}

#[tokio::test]
async fn quarantine_retry_redelivers_exactly_the_quarantined_changes_and_keeps_the_checkpoint() {
    // GIVEN batch 1 (rows 1-3) quarantined after one known failure (MaxAttempts 1), and row 4 delivered
    let w = world(1);
    w.source.upsert(1..=3, 1);
    assert_eq!(w.tick(NORMAL).await, vec![1, 2, 3]);
    assert!(w.tick(FIRST_RETRY).await.is_empty());
    w.source.upsert([4], 2);
    assert_eq!(w.tick(NORMAL).await, vec![4]);
    assert!(w.tick(NORMAL).await.is_empty());
    let before = w.doc().await;
    assert_eq!(before.counters().quarantined, 1);
    let listed = quarantine_list(&w.trigger).await.expect("list");
    assert_eq!(listed["documents"], serde_json::json!(["app/orders/quarantine/00000000000000000001.json"]));
    assert_eq!(quarantine_show(&w.trigger, 1).await.expect("show")["batch_id"], 1);

    // WHEN the operator asks for it twice
    quarantine_retry(&w.trigger, 1, "op").await.expect("retry");
    let answer = quarantine_retry(&w.trigger, 1, "op").await.expect("retry again");

    // THEN it is queued once, re-delivered once with exactly its rows, and the checkpoint never moves
    assert_eq!(answer["queued"], serde_json::json!([1]));
    assert_eq!(w.tick(NORMAL).await, vec![1, 2, 3]);
    assert_eq!(w.doc().await.checkpoint(), before.checkpoint());
    assert!(w.tick(NORMAL).await.is_empty());
    let after = w.doc().await;
    assert_eq!(after.checkpoint(), before.checkpoint());
    assert!(after.retry_quarantined().is_empty() && after.in_flight().is_none());
}

#[tokio::test]
async fn quarantine_actions_on_an_unknown_batch_name_the_missing_document() {
    let w = world(5);
    w.tick(NORMAL).await;
    for err in [
        quarantine_show(&w.trigger, 9).await.expect_err("no such batch"),
        quarantine_retry(&w.trigger, 9, "op").await.expect_err("no such batch"),
    ] {
        let message = err.to_string();
        assert!(message.contains("00000000000000000009.json") && message.contains("missing"), "{message}");
    }
    assert!(w.doc().await.retry_quarantined().is_empty());
}

#[tokio::test]
async fn resume_clears_a_halt_and_the_failure_count_of_the_halting_batch() {
    let w = world(5);
    w.source.upsert(1..=2, 1);
    w.tick(NORMAL).await;
    let (mut doc, etag) = w.trigger.load().await.expect("load").expect("state");
    doc.halt("poison".into());
    hand_edit(&mut doc, |json| json.get_mut("in_flight").expect("in flight")["failures"] = json!(5));
    w.inner.save_if(w.trigger.state_key(), &serde_json::to_vec(&doc).expect("json"), Some(&etag)).await.expect("save");

    resume(&w.trigger, "op").await.expect("resume");

    let doc = w.doc().await;
    assert!(doc.halted().is_none() && !doc.paused());
    assert_eq!(doc.in_flight().map(|f| f.failures), Some(0));
    assert!(doc.updated_by().contains("op"), "{}", doc.updated_by());
}

#[tokio::test]
async fn replay_or_reset_to_a_position_the_source_cannot_read_is_refused_and_writes_nothing() {
    let w = world(5);
    w.source.upsert(1..=3, 1);
    w.tick(NORMAL).await;
    let before = w.doc().await;
    for position in [serde_json::json!(42), serde_json::json!(["x", 1]), serde_json::json!([1])] {
        let errors = [
            replay(&w.trigger, position.clone(), "op").await.expect_err("replay refused"),
            reset(&w.trigger, ResetTo::Position(position.clone()), true, "op").await.expect_err("reset refused"),
        ];
        for err in errors {
            assert!(matches!(err, OpsError::Invalid(_)), "{position}: {err:?}");
            assert!(err.to_string().contains(&format!("position {position} cannot be read")), "{err}");
        }
    }
    assert_eq!(w.doc().await.write_id(), before.write_id());
}

#[test]
fn reset_to_reads_earliest_now_and_json_positions_and_explains_anything_else() {
    assert_eq!(ResetTo::parse(" earliest ").expect("earliest"), ResetTo::Earliest);
    assert_eq!(ResetTo::parse("now").expect("now"), ResetTo::Now);
    assert_eq!(
        ResetTo::parse(r#"["1042","17"]"#).expect("a position"),
        ResetTo::Position(serde_json::json!(["1042", "17"]))
    );
    let err = ResetTo::parse("yesterday").expect_err("not a position");
    assert!(err.to_string().contains("earliest, now or a JSON position"), "{err}");
}
