//! What the operator asked for ([`Request`]), and the answer when the change refuses or stops midway
//! ([`RepartitionError`], each problem saying what to do).

use crate::engine::TickError;
use std::fmt::Write as _;
use std::num::NonZeroU32;

/// What the operator asked for.
#[derive(Debug, Clone)]
pub struct Request {
    pub to: NonZeroU32,
    /// The layout to change from, when the store holds several.
    pub from: Option<NonZeroU32>,
    /// An old partition without a document starts its keys at the source's earliest position (every change of
    /// them the source still holds is delivered again) instead of refusing.
    pub missing_from_earliest: bool,
    /// The old partitions' quarantined batches were dealt with: they stay in the store, where no new partition
    /// can re-deliver them.
    pub quarantine_handled: bool,
    /// Who asks, for the documents' stamps and the retirement reason.
    pub who: String,
}

/// Why nothing (or not everything) was written.
#[derive(Debug, thiserror::Error)]
pub enum RepartitionError {
    /// Each problem says what to do; `written` lists the documents already written (a re-run finishes).
    #[error("{}", refusal(.problems, .written))]
    Refused { problems: Vec<String>, written: Vec<String> },
    /// The store failed; `written` as above.
    #[error("{}", refusal(&[format!("the state store failed: {}", .error)], .written))]
    Store { error: TickError, written: Vec<String> },
}

impl RepartitionError {
    /// A refusal before anything was written.
    pub(super) fn refused(problems: Vec<String>) -> Self {
        Self::Refused { problems, written: Vec::new() }
    }

    /// A store failure before anything was written.
    pub(super) fn store(error: TickError) -> Self {
        Self::Store { error, written: Vec::new() }
    }
}

fn refusal(problems: &[String], written: &[String]) -> String {
    let mut text = if written.is_empty() {
        "the partition count was not changed; nothing was written:".to_string()
    } else {
        format!(
            "the partition count change stopped midway; written so far: {}. Fix what follows and run the same command again: it keeps what it wrote and finishes:",
            written.join(", ")
        )
    };
    for p in problems {
        let _ = write!(text, "\n- {p}");
    }
    text
}
