//! What can go wrong in a tick, and the one table that decides what each failure means.

use crate::sink::SinkError;
use crate::source::SourceError;
use crate::state::StoreError;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum TickError {
    #[error("state store: {0}")]
    Store(#[from] StoreError),
    #[error("source: {0}")]
    Source(#[from] SourceError),
    #[error("the state document {key} is unreadable ({detail}); inspect it, then fix or delete it (deleting restarts from startFrom)")]
    CorruptState { key: String, detail: String },
    #[error("the source changed since the state was written (stored {stored}, configured {configured}): stored positions would be misread; run `handler state reset {function} --to earliest|now --confirm` to start over")]
    FingerprintChanged { function: String, stored: String, configured: String },
    #[error("function {function} is halted: {reason}; inspect with `handler state show {function}` and resume with `handler state resume {function}` after dealing with the batch")]
    Halted { function: String, reason: String },
    #[error("the tick did not finish within {0:?} (Sql_Trigger_TickTimeoutMs); nothing was committed")]
    Timeout(Duration),
    /// Sink mode: the sink did not take the batch; it stays in flight and is delivered again.
    #[error("sink: {0}; the batch stays in flight and is delivered again")]
    Sink(#[from] SinkError),
}

/// How the engine and the HTTP layer treat a failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Will likely pass on the next tick (network, throttling, restarts). Fail the invocation; nothing lost.
    Transient,
    /// Needs a person: configuration, permissions, schema, a lost position, a corrupt or mismatched state.
    Operator,
}

impl TickError {
    /// The retry table: every failure's class in one place.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Store(StoreError::Unavailable(_) | StoreError::Conflict) => ErrorKind::Transient,
            Self::Source(SourceError::Unavailable(_)) => ErrorKind::Transient,
            Self::Timeout(_) => ErrorKind::Transient,
            Self::Sink(SinkError::Transient(_) | SinkError::Fenced { .. }) => ErrorKind::Transient,
            Self::Sink(SinkError::Rejected(_)) => ErrorKind::Operator,
            Self::Store(StoreError::Refused(_))
            | Self::Source(SourceError::Invalid(_) | SourceError::PositionLost(_))
            | Self::CorruptState { .. }
            | Self::FingerprintChanged { .. }
            | Self::Halted { .. } => ErrorKind::Operator,
        }
    }

    /// A short hint for the log line, next to the message.
    pub fn hint(&self) -> &'static str {
        match self.kind() {
            ErrorKind::Transient => "transient: the next invocation retries; nothing committed is lost",
            ErrorKind::Operator => "needs an operator: the function makes no progress until this is fixed",
        }
    }
}
