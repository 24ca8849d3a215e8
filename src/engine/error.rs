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
    /// The state document does not read back as one this handler wrote: hand-edited, truncated, or from a
    /// newer handler. Refused, never repaired, and nothing is written over it.
    #[error("the state document {key} cannot be used: {detail}. Nothing was written over it. Fix that field by hand, or start function {function} over with `handler state reset {function} --to earliest|now --confirm` (earliest re-delivers what the source still holds, now skips to its end)")]
    CorruptState { function: String, key: String, detail: String },
    /// A quarantine document is missing or does not decode.
    #[error("the quarantine document {key} cannot be used ({detail}); restore it, or empty the function's queue of quarantined batches to retry with `handler state reset <function> --to <its checkpoint> --confirm` (`handler state show` prints the checkpoint)")]
    CorruptQuarantine { key: String, detail: String },
    #[error("the source changed since the state was written (stored {stored}, configured {configured}): stored positions would be misread; run `handler state reset {function} --to earliest|now --confirm` to start over")]
    FingerprintChanged { function: String, stored: String, configured: String },
    #[error("function {function} is halted: {reason}; inspect with `handler state show {function}` and resume with `handler state resume {function}` after dealing with the batch")]
    Halted { function: String, reason: String },
    /// The document was retired by `handler partitions change`: this deployment serves a layout that is gone.
    #[error("function {function} stopped: its state was {reason}")]
    Retired { function: String, reason: String },
    #[error("the tick did not finish within {0:?} (Sql_Trigger_TickTimeoutMs); nothing was committed")]
    Timeout(Duration),
    /// Sink mode: the sink did not take the batch; it stays in flight and is delivered again.
    #[error("sink: {0}; the batch stays in flight and is delivered again")]
    Sink(#[from] SinkError),
    /// `deliveryMode sink` on a trigger built without a sink: a batch recorded for it would never be delivered.
    #[error("function {0} has deliveryMode sink but no sink to deliver to; add \"sink\" to its sqltrigger.json (postgres, mssql or webhook), or use deliveryMode deferred")]
    SinkMissing(String),
}

/// What the driver of a tick (the server answering the host, the runner's loop) does after a failure: the one
/// retry table, read by both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDirective {
    /// Fail this attempt and try again at the next invocation (the runner: after a back-off). Likely to pass
    /// by itself (network, throttling, restarts); nothing committed is lost and no failure is counted.
    RetryLater,
    /// Try again: the batch stays in flight and this failure counts toward `Sql_Trigger_MaxAttempts`, after
    /// which the batch is quarantined or halts the function (a sink's rejection).
    RetryCounted,
    /// Needs an operator: the function makes no progress until this is fixed. A `--once` drain stops here.
    Stop,
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
    /// The retry table: what every failure means, in one place.
    pub fn directive(&self) -> RetryDirective {
        match self {
            Self::Store(StoreError::Unavailable(_) | StoreError::Conflict) => RetryDirective::RetryLater,
            Self::Source(SourceError::Unavailable(_)) => RetryDirective::RetryLater,
            Self::Timeout(_) => RetryDirective::RetryLater,
            Self::Sink(SinkError::Transient(_) | SinkError::Fenced { .. }) => RetryDirective::RetryLater,
            Self::Sink(SinkError::Rejected(_)) => RetryDirective::RetryCounted,
            Self::Store(StoreError::Refused(_))
            | Self::Source(SourceError::Invalid(_) | SourceError::PositionLost(_))
            | Self::CorruptState { .. }
            | Self::CorruptQuarantine { .. }
            | Self::FingerprintChanged { .. }
            | Self::Halted { .. }
            | Self::Retired { .. }
            | Self::SinkMissing(_) => RetryDirective::Stop,
        }
    }

    /// The failure's class for metrics and status: transient, or an operator's (a counted rejection included).
    pub fn kind(&self) -> ErrorKind {
        match self.directive() {
            RetryDirective::RetryLater => ErrorKind::Transient,
            RetryDirective::RetryCounted | RetryDirective::Stop => ErrorKind::Operator,
        }
    }

    /// A short hint for the log line, next to the message.
    pub fn hint(&self) -> &'static str {
        match self.directive() {
            RetryDirective::RetryLater => "transient: the next invocation retries; nothing committed is lost",
            RetryDirective::RetryCounted => {
                "needs an operator: the batch is delivered again until Sql_Trigger_MaxAttempts quarantines it or halts the function"
            }
            RetryDirective::Stop => "needs an operator: the function makes no progress until this is fixed",
        }
    }
}
