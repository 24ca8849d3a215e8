//! Where the engine reads the time. Leases, the proof window, poison durations and retry pacing are decided
//! from `now`, so tests hand the engine a clock they move by hand instead of sleeping.

use std::sync::{Arc, Mutex};
use time::OffsetDateTime;

/// A source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> OffsetDateTime;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> OffsetDateTime {
        OffsetDateTime::now_utc()
    }
}

/// A clock that moves only when told: for tests of leases, proof windows and poison durations.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<Mutex<OffsetDateTime>>);

impl ManualClock {
    pub fn new(start: OffsetDateTime) -> Self {
        Self(Arc::new(Mutex::new(start)))
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: std::time::Duration) {
        let mut now = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *now += by;
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new(OffsetDateTime::now_utc())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> OffsetDateTime {
        *self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}
