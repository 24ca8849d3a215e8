//! What a tick serves, for each delivery, as the contract says it.

use super::*;
use crate::config::settings::Resolver;
use crate::config::{Env, PoisonAction};
use crate::engine::decide::Sent;
use crate::engine::document::{Backfill, Origin};
use crate::protocol::{Attempt, RetryContext};
use crate::source::BatchRange;
use serde_json::json;
use std::sync::Arc;
use time::OffsetDateTime;

const NOW: OffsetDateTime = OffsetDateTime::UNIX_EPOCH;

fn settings() -> TriggerSettings {
    let env = Env::from_pairs(std::iter::empty());
    let mut errors = vec![];
    let settings = Resolver { env: &env, host_sql: None, function: None }.trigger_settings(&mut errors);
    assert!(errors.is_empty());
    settings
}

fn doc() -> StateDoc {
    let origin = Origin { function: "f", source: "s", fingerprint: "fp" };
    StateDoc::new(origin, json!(["1"]), "me", NOW)
}

fn with_backfill() -> StateDoc {
    let mut doc = doc();
    doc.start_backfill(Backfill::new(json!(["100"]), None, None, "t", NOW)).expect("no backfill yet");
    doc
}

fn recorded_by_default(doc: &StateDoc, live_in_a_row: u32) -> Recorded {
    recorded(doc, live_in_a_row, &settings())
}

#[test]
fn a_recorded_tick_serves_the_batch_in_flight_first_then_a_retry_then_new_changes() {
    let mut doc = doc();
    doc.queue_quarantine_retry(7);
    doc.record_in_flight(InFlight::first_delivery(BatchRange::new(3, json!(["1"]), json!(["9"]), 4), "me", NOW));
    assert!(
        matches!(recorded_by_default(&doc, 0), Recorded::InFlight { ref stuck, .. } if matches!(**stuck, Stuck::Redeliver))
    );
    doc.acknowledge(&InFlight::first_delivery(BatchRange::new(3, json!(["1"]), json!(["9"]), 4), "me", NOW), NOW);
    assert!(matches!(recorded_by_default(&doc, 0), Recorded::Next(Next::QuarantineRetry(7))));
    assert!(!recorded_by_default(&doc, 0).starts_live(), "an operator's retry goes before anything fetched ahead");
    doc.take_quarantine_retry();
    let Recorded::Next(Next::New(new)) = recorded_by_default(&doc, 0) else { panic!("new changes") };
    assert_eq!(new, Fresh { turn: Turn::Live, live: json!(["9"]), after: Position::Null, unacknowledged: false });
}

#[test]
fn a_poison_batch_in_flight_is_quarantined_or_halted_at_by_the_setting() {
    let mut doc = doc();
    doc.record_in_flight(InFlight::first_delivery(BatchRange::new(3, json!(["1"]), json!(["9"]), 4), "me", NOW));
    for _ in 0..settings().max_attempts {
        doc.record_failure("rejected");
    }
    assert!(
        matches!(recorded_by_default(&doc, 0), Recorded::InFlight { ref stuck, .. } if matches!(**stuck, Stuck::Quarantine(_)))
    );
    let halt = TriggerSettings { poison_action: PoisonAction::Halt, ..settings() };
    let decided = recorded(&doc, 0, &halt);
    assert!(matches!(decided, Recorded::InFlight { ref stuck, .. } if matches!(**stuck, Stuck::Halt(_))));
}

#[test]
fn a_running_backfill_gets_a_chunk_first_after_four_live_batches_in_a_row() {
    let doc = with_backfill();
    let Recorded::Next(Next::New(first)) = recorded_by_default(&doc, 0) else { panic!("new changes") };
    assert_eq!(first.turn, Turn::LiveThenChunk);
    assert!(recorded_by_default(&doc, 0).starts_live(), "live first: a sink may chain a batch fetched ahead");
    let Recorded::Next(Next::New(owed)) = recorded_by_default(&doc, share::LIVE_PER_CHUNK) else {
        panic!("new changes")
    };
    assert_eq!(owed.turn, Turn::ChunkThenLive);
    assert_eq!(owed.live, json!(["1"]), "the chunk goes after the live changes handed over: the checkpoint");
    assert!(!recorded_by_default(&doc, share::LIVE_PER_CHUNK).starts_live(), "the chunk's turn: nothing chained");
}

#[test]
fn a_deferred_tick_serves_an_owed_batch_then_an_unanswered_retry_then_changes_after_its_span_and_chunks() {
    let mut doc = with_backfill();
    let id = doc.backfill().map(|b| b.id.clone()).expect("backfill");
    let mut answered = Answered::default();
    // Under a retry policy: the host reports a failed write by retrying, so nothing answered is owed yet.
    let retry = RetryContext { retry_count: 0, max_retry_count: 5, failed_invocation: None };
    let attempt = Attempt::new("a", Some(retry));
    answered.span.push_back(Arc::new(Sent::new(BatchRange::new(3, json!(["1"]), json!(["9"]), 4), &attempt, NOW)));
    let chunk = BatchRange::chunk(4, json!(["0"]), json!(["50"]), 50, &id);
    answered.chunks.push_back(Arc::new(Sent::new(chunk, &attempt, NOW)));
    let Deferred::Next(Next::New(new)) = deferred(&doc, &answered, 0) else { panic!("new changes") };
    assert_eq!(new.live, json!(["9"]), "live changes after the span");
    assert_eq!(new.after, json!(["50"]), "a chunk after the last one answered");
    assert!(new.unacknowledged);

    doc.queue_quarantine_retry(2);
    assert!(matches!(deferred(&doc, &answered, 0), Deferred::Next(Next::QuarantineRetry(2))));
    answered.span.push_back(Arc::new(Sent::owed_range(BatchRange::new(5, json!(["9"]), json!(["12"]), 2), NOW)));
    assert!(matches!(deferred(&doc, &answered, 0), Deferred::Owed));
}
