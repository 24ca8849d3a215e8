//! The document read back and written again: stored forms, the stopped state's transitions.

/// Found by the state-document fuzz target (fuzz/corpus/state_document/regression-float-position-*): a
/// position holding a number beyond f64's precision read as a float that changed through every write and read.
/// No source writes one, so it is refused by name.
#[test]
fn a_position_holding_a_fractional_or_huge_number_is_refused_by_name() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/state_document");
    let state = std::fs::read(dir.join("regression-float-position-state")).expect("corpus file");
    let e = super::read(&state).expect_err("refused");
    assert!(e.contains("field `checkpoint` holds the number"), "{e}");
    let quarantine = std::fs::read(dir.join("regression-float-position-quarantine")).expect("corpus file");
    let e = super::QuarantineDoc::read(&quarantine).expect_err("refused");
    assert!(e.contains("field `from` holds the number"), "{e}");
}

/// A stored document around `stop` (its `paused` and `halted` fields, each followed by a comma), laid out as
/// every release writes one.
fn stored(stop: &str) -> String {
    format!(
        r#"{{"schema":1,"function":"f","source":"postgres:public.orders","fingerprint":"fp","checkpoint":["1042","17"],{stop}"next_batch_id":4,"counters":{{"delivered":10,"batches":3,"redelivered":0,"quarantined":0,"takeovers":0}},"write_id":"w","updated_at":"2026-01-02T03:04:05Z","updated_by":"tick p1","lineage":"l"}}"#
    )
}

#[test]
fn every_stored_pause_and_halt_reads_as_who_stopped_it_and_writes_back_byte_for_byte() {
    use super::Stopped;
    let retired = "re-partitioned into 4 partitions at 2026-01-02T03:04:05Z by operator me";
    let halted = |reason: &str, paused| Some(Stopped::Halted { reason: reason.into(), paused });
    let cases = [
        (r#""paused":false,"#.to_string(), None),
        (r#""paused":true,"#.to_string(), Some(Stopped::Paused)),
        (
            r#""paused":false,"halted":"batch 3 failed; halted at it","#.into(),
            halted("batch 3 failed; halted at it", false),
        ),
        (
            r#""paused":true,"halted":"batch 3 failed; halted at it","#.into(),
            halted("batch 3 failed; halted at it", true),
        ),
        (
            format!(r#""paused":false,"halted":"{retired}","#),
            Some(Stopped::Retired { into: 4, reason: retired.into(), paused: false }),
        ),
        (
            format!(r#""paused":true,"halted":"{retired}","#),
            Some(Stopped::Retired { into: 4, reason: retired.into(), paused: true }),
        ),
        // Hand-edited reasons read as they always did: a count is a retirement, anything else a halt.
        (r#""paused":false,"halted":"re-partitioned into 04","#.into(), {
            Some(Stopped::Retired { into: 4, reason: "re-partitioned into 04".into(), paused: false })
        }),
        (r#""paused":false,"halted":"re-partitioned into four","#.into(), halted("re-partitioned into four", false)),
    ];
    for (stop, want) in cases {
        // GIVEN a stored document with these fields
        let json = stored(&stop);
        // WHEN it is read
        let doc = super::read(json.as_bytes()).unwrap_or_else(|e| panic!("{json}: {e}"));
        // THEN it says who stopped it, and it writes back as it was stored
        assert_eq!(doc.stopped(), want.as_ref(), "{json}");
        assert_eq!(serde_json::to_string(&doc).expect("serializes"), json);
    }
}

#[test]
fn a_halt_prevails_over_a_pause_and_keeps_it_a_reset_keeps_only_the_pause_and_a_resume_clears_both() {
    use super::{Origin, StateDoc, Stopped};
    // GIVEN a document an operator paused
    let origin = Origin { function: "f", source: "s", fingerprint: "fp" };
    let mut doc = StateDoc::new(origin, serde_json::Value::Null, "tick", time::OffsetDateTime::UNIX_EPOCH);
    doc.pause();
    assert_eq!((doc.paused(), doc.halted()), (true, None));
    // WHEN a tick halts it THEN the halt holds the pause beneath it
    doc.halt("poison".into());
    assert_eq!(doc.stopped(), Some(&Stopped::Halted { reason: "poison".into(), paused: true }));
    // WHEN an operator resets it THEN the halt goes and the pause stays
    doc.reset(serde_json::Value::Null, origin);
    assert_eq!(doc.stopped(), Some(&Stopped::Paused));
    // WHEN a change of the partition count retires it THEN it is retired into the new count, still paused
    doc.retire(4, "at noon");
    assert_eq!((doc.retired_into(), doc.paused()), (Some(4), true));
    assert_eq!(doc.halted(), Some("re-partitioned into 4 partitions at noon"));
    // WHEN an operator resumes it THEN nothing stops it
    doc.resume();
    assert_eq!(doc.stopped(), None);
}
