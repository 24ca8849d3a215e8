//! A hook that tells an observer about every finished tick, for metrics.
//!
//! Why a hook and not a poll of [`super::Trigger::last_tick`]: counters and histograms need every tick, and a
//! poll sees only the last one. The hook costs one `OnceLock` read per tick when nothing observes, and the
//! engine knows nothing of what the observer does with the record (OpenTelemetry, in `crate::telemetry`).

use super::decide::liveness::Heard;
use super::error::ErrorKind;
use super::outcome::OutcomeKind;
use std::fmt;
use std::time::Duration;
use time::OffsetDateTime;

/// What one tick did, as an observer sees it. No row values: only counts and timings.
#[derive(Debug, Clone, Copy)]
pub struct TickRecord<'a> {
    pub function: &'a str,
    /// What the tick answered, or the kind of error it failed with.
    pub outcome: Result<OutcomeKind, ErrorKind>,
    /// Changes answered (0 for a failed tick).
    pub rows: usize,
    pub duration: Duration,
    /// State-store operations this tick performed.
    pub store_operations: u64,
}

/// Told about every tick, after it finished and before its answer is returned.
///
/// Called on the tick's task while the function's tick lock is held: an implementation must be quick, must
/// not block and must not call back into the trigger (recording into in-memory instruments is the intended
/// use).
pub trait TickObserver: Send + Sync + fmt::Debug {
    fn tick_finished(&self, record: &TickRecord<'_>);
}

/// This process's view of its ticks, for status and metrics.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct TickStats {
    pub ticks: u64,
    #[serde(with = "time::serde::rfc3339::option")]
    pub at: Option<OffsetDateTime>,
    pub outcome: String,
    pub rows: usize,
    pub duration_ms: f64,
    pub store_operations: u64,
    pub failures_transient: u64,
    pub failures_operator: u64,
    /// Deletes left out because an output binding receives rows (reported in the invocation's logs too).
    pub deletes_not_sent: u64,
    /// When the last tick started: the last invocation (liveness, `decide::liveness`).
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_invocation_at: Option<OffsetDateTime>,
    /// When the last tick that ended without an error ended.
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_success_at: Option<OffsetDateTime>,
    /// Ticks that ended with an error since the last one that did not.
    pub consecutive_failures: u64,
    /// "paused", "halted" or "retired" (re-partitioned) when the last tick found the function stopped on purpose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<&'static str>,
    /// When liveness was first asked for (the watchdog's start): the baseline while nothing was heard.
    #[serde(skip)]
    pub(super) watched_since: Option<OffsetDateTime>,
}

impl TickStats {
    /// What was heard, given the tick budget, if anyone watches or a tick ran; see `Trigger::heard`.
    pub(super) fn heard(&self, budget: time::Duration) -> Option<Heard> {
        // A tick runs when its start is later than the last end (`at`); it is bounded by its budget.
        let ticking = self.last_invocation_at.is_some_and(|started| self.at.is_none_or(|ended| started > ended));
        Some(Heard {
            last_invocation: self.last_invocation_at,
            last_success: self.last_success_at,
            consecutive_failures: self.consecutive_failures,
            stopped: self.stopped,
            watched_since: self.watched_since?,
            last_end: self.at,
            ticking_until: self.last_invocation_at.filter(|_| ticking).map(|started| started.saturating_add(budget)),
        })
    }
}
