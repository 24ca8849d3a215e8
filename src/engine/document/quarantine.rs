//! A poison batch set aside: its entry in the state document, its own quarantine document, and the state
//! document's transitions of the quarantine list and of the operator's queue of batches to retry.

use super::flight::InFlight;
use super::StateDoc;
use crate::source::BatchRange;
use crate::source::Position;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// How many quarantine entries the state document keeps; older ones stay listed in the store.
pub const QUARANTINE_KEPT: usize = 50;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct QuarantineEntry {
    #[serde(flatten)]
    pub range: BatchRange,
    /// The store key of the quarantine document holding the batch's changes.
    pub key: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
}

/// What a quarantine document holds: enough to inspect and to re-deliver the batch.
#[derive(Debug, Serialize, Deserialize)]
pub struct QuarantineDoc {
    pub function: String,
    pub batch_id: u64,
    pub from: Position,
    pub to: Position,
    pub failures: u32,
    pub reason: String,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// The changes as they were when quarantined.
    pub changes: Box<serde_json::value::RawValue>,
}

impl QuarantineDoc {
    /// A quarantine document read back from the store (an operator may have edited it), or what is wrong with it.
    pub fn read(bytes: &[u8]) -> Result<Self, String> {
        let doc: Self = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        super::read::integer_positions(&[("from", &doc.from), ("to", &doc.to)])?;
        Ok(doc)
    }

    pub fn decode_changes(&self) -> Result<Vec<crate::change::Change>, String> {
        serde_json::from_str(self.changes.get()).map_err(|e| format!("the stored changes do not decode: {e}"))
    }
}

/// The quarantine's transitions: a tick setting a batch aside, and the queue of quarantined batches to retry.
impl StateDoc {
    /// Lists a batch written to its quarantine document (the newest [`QUARANTINE_KEPT`] are kept). Who: a tick
    /// quarantining a poison batch.
    pub fn record_quarantined(&mut self, entry: QuarantineEntry) {
        self.counters.quarantined += 1;
        self.quarantine.push(entry);
        if self.quarantine.len() > QUARANTINE_KEPT {
            let excess = self.quarantine.len() - QUARANTINE_KEPT;
            self.quarantine.drain(..excess);
        }
    }

    /// Moves past a quarantined batch in flight: the checkpoint to its end (unless it was itself a retry of a
    /// quarantined batch, which lies before the checkpoint), nothing in flight. Who: a sink or immediate tick,
    /// after quarantining it.
    pub fn pass_quarantined(&mut self, flight: &InFlight) {
        if flight.quarantined.is_none() {
            self.pass(&flight.range);
        }
        self.in_flight = None;
    }

    /// The first quarantined batch an operator asked to retry, taken off the list. Who: a sink or immediate tick.
    pub fn take_quarantine_retry(&mut self) -> Option<u64> {
        (!self.retry_quarantined.is_empty()).then(|| self.retry_quarantined.remove(0))
    }

    /// Puts a quarantined batch back at the head of the operator's retry list (unless listed). Who: the deferred
    /// tick, adopting a retry that sink delivery had recorded in flight.
    pub fn requeue_quarantine_retry(&mut self, batch_id: u64) {
        if !self.retry_quarantined.contains(&batch_id) {
            self.retry_quarantined.insert(0, batch_id);
        }
    }

    /// Queues a quarantined batch for re-delivery before new changes. Who: an operator.
    pub fn queue_quarantine_retry(&mut self, batch_id: u64) {
        if !self.retry_quarantined.contains(&batch_id) {
            self.retry_quarantined.push(batch_id);
        }
    }
}
