//! A function's backfill as the state document records it (docs/operations.md, "Backfill"), and the state
//! document's transitions of it: an operator starts, pauses, resumes and cancels it; a tick finishes it and counts
//! a chunk delivered again (a tick's acknowledgement moves its position: `flight.rs`).

use super::StateDoc;
use crate::source::{BatchRange, Position};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// Where a backfill stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackfillState {
    /// Chunks are read and delivered beside live changes.
    Running,
    /// An operator paused it: no new chunk (a chunk in flight still completes); live changes go on.
    Paused,
    /// Every chunk was delivered.
    Done,
    /// An operator cancelled it: no further chunk; a chunk in flight is delivered but moves nothing.
    Cancelled,
}

/// One backfill: the rows that existed, read in key order in chunks, each chunk a batch (`BatchRange::backfill`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Backfill {
    /// Names this backfill in its chunks (`BatchRange::backfill`) and in the rows' metadata.
    pub id: String,
    pub state: BackfillState,
    /// Source-owned, fixed at the start: what every chunk is bounded by (`Source::backfill_start`).
    pub bound: Position,
    /// The operator's `--where`, as typed (parsed and checked again at every chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<String>,
    /// The last key of the last acknowledged chunk: the next chunk starts after it (`null`: at the first key).
    pub after: Position,
    /// Rows delivered and acknowledged.
    pub rows: u64,
    /// Chunks acknowledged.
    pub chunks: u64,
    /// Chunks delivered again (a crash, a lost answer, a failed write): each is re-read from the table.
    #[serde(default)]
    pub redone: u64,
    /// How many rows the source expected at the start (the table changes meanwhile).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate: Option<u64>,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    pub started_by: String,
    #[serde(default, with = "time::serde::rfc3339::option", skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<OffsetDateTime>,
}

impl Backfill {
    /// A backfill starting now, bounded by `bound`.
    pub fn new(bound: Position, filter: Option<String>, estimate: Option<u64>, by: &str, now: OffsetDateTime) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        Self {
            id,
            state: BackfillState::Running,
            bound,
            filter,
            after: Position::Null,
            rows: 0,
            chunks: 0,
            redone: 0,
            estimate,
            started_at: now,
            started_by: by.to_string(),
            finished_at: None,
        }
    }

    /// Whether it still has chunks to deliver (running or paused).
    pub fn open(&self) -> bool {
        matches!(self.state, BackfillState::Running | BackfillState::Paused)
    }
}

/// The backfill's transitions.
impl StateDoc {
    pub(super) fn count_chunk_redone(&mut self, range: &BatchRange) {
        if let Some(b) = self.backfill.as_mut().filter(|b| range.backfill.as_ref() == Some(&b.id)) {
            b.redone += 1;
        }
    }

    /// The open backfill has no rows left: it is done. Who: a tick whose chunk read found nothing after the
    /// backfill's position, with no chunk of it in flight.
    pub fn finish_backfill(&mut self, now: OffsetDateTime) {
        if let Some(b) = self.backfill.as_mut().filter(|b| b.state == BackfillState::Running) {
            b.state = BackfillState::Done;
            b.finished_at = Some(now);
        }
    }

    /// Starts `backfill` (replacing a finished or cancelled one). Refused while one is running or paused. Who: an
    /// operator; the first tick of a `startFrom: snapshot` function.
    pub fn start_backfill(&mut self, backfill: Backfill) -> Result<(), String> {
        if let Some(b) = self.backfill.as_ref().filter(|b| b.open()) {
            return Err(format!(
                "backfill {} of {} is {} since {} ({} row(s) delivered); cancel it first (--cancel)",
                b.id,
                self.function,
                if b.state == BackfillState::Paused { "paused" } else { "running" },
                b.started_at,
                b.rows
            ));
        }
        self.backfill = Some(backfill);
        Ok(())
    }

    /// Pauses (`true`) or resumes (`false`) the open backfill. Who: an operator.
    pub fn pause_backfill(&mut self, pause: bool) -> Result<(), String> {
        let function = self.function.clone();
        let Some(b) = self.backfill.as_mut().filter(|b| b.open()) else {
            return Err(format!(
                "{function} has no backfill running or paused; start one with `handler state backfill {function}`"
            ));
        };
        b.state = if pause { BackfillState::Paused } else { BackfillState::Running };
        Ok(())
    }

    /// Cancels the open backfill: no further chunk; a chunk in flight is delivered but moves nothing. Who: an
    /// operator.
    pub fn cancel_backfill(&mut self, now: OffsetDateTime) -> Result<(), String> {
        let function = self.function.clone();
        let Some(b) = self.backfill.as_mut().filter(|b| b.open()) else {
            return Err(format!("{function} has no backfill running or paused to cancel"));
        };
        b.state = BackfillState::Cancelled;
        b.finished_at = Some(now);
        Ok(())
    }
}
