//! Operator actions: the words of the two faces (the CLI's `handler state ...`, the admin routes) parsed into
//! one [`Action`], which [`Trigger::operate`] applies (`engine/operate.rs`: each action one compare-and-swap
//! write of the state document, logged with who asked).

pub use crate::engine::operate::{Action, BackfillControl, OpsError, ResetTo, Status};

use crate::engine::Trigger;
use crate::source::Position;
use serde_json::Value;
use std::collections::BTreeMap;

impl Action {
    /// The action an admin route names (`method` and the path after the function's name), with its query;
    /// `Ok(None)`: no such route.
    pub fn from_route(method: &str, rest: &[&str], query: &BTreeMap<String, String>) -> Result<Option<Self>, OpsError> {
        let q = |k: &str| query.get(k);
        let batch = |text: &str| text.parse().map_err(|_| OpsError::Invalid(format!("{text:?} is not a batch id")));
        Ok(Some(match (method, rest) {
            ("GET", []) => Self::Show,
            ("GET", ["status"]) => Self::Status,
            ("POST", ["pause"]) => Self::Pause,
            ("POST", ["resume"]) => Self::Resume,
            ("POST", ["reset"]) => match q("to") {
                Some(to) => {
                    Self::Reset { to: ResetTo::parse(to)?, confirm: q("confirm").map(String::as_str) == Some("true") }
                }
                None => return Err(OpsError::Invalid("reset needs to=earliest|now|<json position>".into())),
            },
            ("POST", ["replay"]) => match q("from") {
                Some(from) => Self::Replay { from: position(from, "from")? },
                None => return Err(OpsError::Invalid("replay needs from=<json position>".into())),
            },
            ("GET", ["quarantine"]) => Self::QuarantineList,
            ("GET", ["quarantine", id]) => Self::QuarantineShow { batch_id: batch(id)? },
            ("POST", ["quarantine", id, "retry"]) => Self::QuarantineRetry { batch_id: batch(id)? },
            ("POST", ["backfill"]) => Self::BackfillStart { filter: q("where").cloned() },
            ("POST", ["backfill", "pause"]) => Self::Backfill(BackfillControl::Pause),
            ("POST", ["backfill", "resume"]) => Self::Backfill(BackfillControl::Resume),
            ("POST", ["backfill", "cancel"]) => Self::Backfill(BackfillControl::Cancel),
            _ => return Ok(None),
        }))
    }
}

/// A position as JSON text, named as the face spells its argument (`from`, `--from`).
pub fn position(text: &str, argument: &str) -> Result<Position, OpsError> {
    serde_json::from_str(text)
        .map_err(|e| OpsError::Invalid(format!("{argument} {text:?} is not a JSON position: {e}")))
}

/// The state document and the quarantine documents in the store.
pub async fn show(t: &Trigger) -> Result<Value, OpsError> {
    t.operate(Action::Show, "").await
}

pub async fn status(t: &Trigger) -> Result<Status, OpsError> {
    t.status().await
}

/// Ticks answer empty batches until `resume`.
pub async fn pause(t: &Trigger, who: &str) -> Result<(), OpsError> {
    t.operate(Action::Pause, who).await.map(drop)
}

/// Clears `paused` and a poison `halted` (the halting batch is then re-delivered once more).
pub async fn resume(t: &Trigger, who: &str) -> Result<(), OpsError> {
    t.operate(Action::Resume, who).await.map(drop)
}

/// Moves the checkpoint, drops the batch in flight, clears a halt, and adopts the configured source's
/// fingerprint (the way out of a "source changed" refusal). Needs `confirm`: it can skip or repeat changes.
pub async fn reset(t: &Trigger, to: ResetTo, confirm: bool, who: &str) -> Result<Value, OpsError> {
    t.operate(Action::Reset { to, confirm }, who).await
}

/// Re-delivers everything after `from`, under new batch ids.
pub async fn replay(t: &Trigger, from: Position, who: &str) -> Result<Value, OpsError> {
    t.operate(Action::Replay { from }, who).await
}

pub async fn quarantine_list(t: &Trigger) -> Result<Value, OpsError> {
    t.operate(Action::QuarantineList, "").await
}

pub async fn quarantine_show(t: &Trigger, batch_id: u64) -> Result<Value, OpsError> {
    t.operate(Action::QuarantineShow { batch_id }, "").await
}

/// Queues a quarantined batch for re-delivery before new changes. The checkpoint does not move.
pub async fn quarantine_retry(t: &Trigger, batch_id: u64, who: &str) -> Result<Value, OpsError> {
    t.operate(Action::QuarantineRetry { batch_id }, who).await
}
