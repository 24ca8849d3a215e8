//! A clean stop of a deferred function (`Trigger::release_on_stop`, what SIGTERM runs under the host and under
//! `handler run`): the lease this process holds ends now, the batch answered and unproven stays in flight for
//! the next process, and a lease that is no longer this process's is never touched.

use crate::deferred::{assert_answer, rows, settings, Output, World, NORMAL};
use sql_pseudo_trigger::clock::ManualClock;
use sql_pseudo_trigger::engine::{OutcomeKind, Released};
use std::time::Duration;

#[tokio::test]
async fn a_stop_releases_the_lease_and_the_next_process_delivers_the_unproven_batch_again_at_once() {
    // GIVEN a process that answered batch 1 under a one-hour lease, its write not yet proven
    let world = World::new();
    let v = world.upsert(1..=3);
    let p1 = world.process("p1", settings());
    p1.answer(NORMAL, Output::Written).await;

    // WHEN it stops cleanly
    let released = p1.trigger.release_on_stop().await.expect("the store answers");

    // THEN its lease ends and the batch stays in flight
    assert_eq!(released, Released { withdrew: false, released: true });
    let doc = world.state().await;
    assert!(doc.lease().is_some_and(|l| l.owner == "p1" && l.expires_at <= time::OffsetDateTime::now_utc()));
    assert_eq!(doc.in_flight().map(|f| (f.range.batch_id, f.owner.as_str())), Some((1, "p1")));
    // AND the next process delivers that batch again at its first invocation, instead of waiting an hour
    let p2 = world.process("p2", settings());
    let a = p2.answer(NORMAL, Output::Written).await;
    assert_answer(&a, OutcomeKind::Redelivered, Some(1), &rows(1..=3, v));
    assert_eq!(world.batches(), vec![rows(1..=3, v), rows(1..=3, v)]);
}

#[tokio::test]
async fn a_stop_never_releases_a_lease_another_process_took_over() {
    // GIVEN a process that answered batch 1 under a one-hour lease, and a second process whose clock is two hours
    // ahead (skew, or a stop long after), which took the batch over under a lease of its own
    let world = World::new();
    let v = world.upsert(1..=3);
    let (early, late) = (ManualClock::default(), ManualClock::default());
    late.advance(Duration::from_secs(2 * 3600));
    let p1 = world.process_with("p1", settings(), Duration::ZERO, Some(&early));
    p1.answer(NORMAL, Output::Written).await;
    let p2 = world.process_with("p2", settings(), Duration::ZERO, Some(&late));
    let a = p2.answer(NORMAL, Output::Written).await;
    assert_answer(&a, OutcomeKind::Redelivered, Some(1), &rows(1..=3, v));
    let before = world.state().await;

    // WHEN the first process stops cleanly: by the document it wrote last its lease is still live, so it tries,
    // loses the compare-and-swap, and reads the document as it is now
    let released = p1.trigger.release_on_stop().await.expect("the store answers");

    // THEN it releases nothing: the document, the second process's lease included, is as that process wrote it
    assert_eq!(released, Released::default());
    assert_eq!(world.state().await, before);
    assert_eq!(before.lease().map(|l| l.owner.as_str()), Some("p2"));
}
