//! A poison batch set aside: its entry in the state document and its own quarantine document.

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
