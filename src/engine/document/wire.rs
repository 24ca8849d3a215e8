//! The state document as it is stored: the JSON fields, their order and their defaults, exactly as every
//! release wrote them. [`StateDoc`] reads and writes through this (serde `from`/`into`), so its typed fields
//! (the stopped state, today) change nothing in the stored bytes: `paused` is always written, `halted` when
//! set. Field docs are on [`StateDoc`]; only the storage attributes live here.

use super::{Backfill, Counters, InFlight, Lease, Pace, QuarantineEntry, Seeded, StateDoc, Stopped};
use crate::source::Position;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// The stored form of [`StateDoc`]. Named `StateDoc` to serde too, so an error names the type as before.
#[derive(Serialize, Deserialize)]
#[serde(rename = "StateDoc")]
pub(super) struct Wire {
    schema: u32,
    function: String,
    source: String,
    fingerprint: String,
    checkpoint: Position,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    in_flight: Option<InFlight>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    lease: Option<Lease>,
    #[serde(default)]
    paused: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    halted: Option<String>,
    next_batch_id: u64,
    #[serde(default)]
    counters: Counters,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    quarantine: Vec<QuarantineEntry>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    retry_quarantined: Vec<u64>,
    #[serde(default, with = "time::serde::rfc3339::option", skip_serializing_if = "Option::is_none")]
    progress_at: Option<OffsetDateTime>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pace: Option<Pace>,
    write_id: String,
    #[serde(with = "time::serde::rfc3339")]
    updated_at: OffsetDateTime,
    updated_by: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    lineage: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    seeded: Option<Seeded>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    backfill: Option<Backfill>,
}

impl From<Wire> for StateDoc {
    fn from(w: Wire) -> Self {
        Self {
            schema: w.schema,
            function: w.function,
            source: w.source,
            fingerprint: w.fingerprint,
            checkpoint: w.checkpoint,
            in_flight: w.in_flight,
            lease: w.lease,
            stopped: Stopped::from_fields(w.paused, w.halted),
            next_batch_id: w.next_batch_id,
            counters: w.counters,
            quarantine: w.quarantine,
            retry_quarantined: w.retry_quarantined,
            progress_at: w.progress_at,
            pace: w.pace,
            write_id: w.write_id,
            updated_at: w.updated_at,
            updated_by: w.updated_by,
            lineage: w.lineage,
            seeded: w.seeded,
            backfill: w.backfill,
        }
    }
}

impl From<StateDoc> for Wire {
    fn from(d: StateDoc) -> Self {
        let (paused, halted) = Stopped::into_fields(d.stopped);
        Self {
            schema: d.schema,
            function: d.function,
            source: d.source,
            fingerprint: d.fingerprint,
            checkpoint: d.checkpoint,
            in_flight: d.in_flight,
            lease: d.lease,
            paused,
            halted,
            next_batch_id: d.next_batch_id,
            counters: d.counters,
            quarantine: d.quarantine,
            retry_quarantined: d.retry_quarantined,
            progress_at: d.progress_at,
            pace: d.pace,
            write_id: d.write_id,
            updated_at: d.updated_at,
            updated_by: d.updated_by,
            lineage: d.lineage,
            seeded: d.seeded,
            backfill: d.backfill,
        }
    }
}
