//! A hook that tells an observer about every finished tick, for metrics.
//!
//! Why a hook and not a poll of [`super::Trigger::last_tick`]: counters and histograms need every tick, and a
//! poll sees only the last one. The hook costs one `OnceLock` read per tick when nothing observes, and the
//! engine knows nothing of what the observer does with the record (OpenTelemetry, in `crate::telemetry`).

use super::{ErrorKind, OutcomeKind};
use std::fmt;
use std::time::Duration;

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
