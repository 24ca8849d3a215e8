//! A hook that tells an observer about every finished tick, for metrics.
//!
//! Why a hook and not a poll of [`super::Trigger::last_tick`]: counters and histograms need every tick, and a
//! poll sees only the last one. The hook costs one `OnceLock` read per tick when nothing observes, and the
//! engine knows nothing of what the observer does with the record (OpenTelemetry, in `crate::telemetry`).

use super::decide::liveness::Heard;
use super::{ErrorKind, OutcomeKind, TickError, TickOutcome, Trigger};
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
    /// "paused" or "halted" when the last tick found the function stopped on purpose.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<&'static str>,
    /// When liveness was first asked for (the watchdog's start): the baseline while nothing was heard.
    #[serde(skip)]
    watched_since: Option<OffsetDateTime>,
}

impl Trigger {
    /// Runs a tick's work within the function's time budget and records what it did (stats, observer).
    /// Called with the tick lock held.
    pub(super) async fn timed(
        &self,
        work: impl std::future::Future<Output = Result<TickOutcome, TickError>>,
    ) -> Result<TickOutcome, TickError> {
        let started = std::time::Instant::now();
        {
            let now = self.ledger.clock().now();
            let mut stats = self.stats.lock().expect("stats lock");
            stats.last_invocation_at = Some(now);
            // A trigger nobody watched yet counts from its first tick.
            stats.watched_since.get_or_insert(now);
        }
        let ops_before = self.ledger.store_operations();
        let budget = self.config.settings.tick_timeout;
        let result = match tokio::time::timeout(budget, work).await {
            Ok(result) => result,
            Err(_) => Err(TickError::Timeout(budget)),
        };
        let store_operations = self.ledger.store_operations() - ops_before;
        let duration = started.elapsed();
        if let Some(observer) = self.observer.get() {
            observer.tick_finished(&TickRecord {
                function: &self.config.name,
                outcome: result.as_ref().map(|o| o.kind).map_err(TickError::kind),
                rows: result.as_ref().map_or(0, |o| o.changes.len()),
                duration,
                store_operations,
            });
        }
        let mut stats = self.stats.lock().expect("stats lock");
        stats.ticks += 1;
        let now = self.ledger.clock().now();
        stats.at = Some(now);
        stats.duration_ms = duration.as_secs_f64() * 1000.0;
        stats.store_operations = store_operations;
        match result {
            Ok(mut outcome) => {
                outcome.store_operations = store_operations;
                stats.rows = outcome.changes.len();
                stats.outcome = format!("{:?}", outcome.kind);
                stats.last_success_at = Some(now);
                stats.consecutive_failures = 0;
                stats.stopped = (outcome.kind == OutcomeKind::Paused).then_some("paused");
                Ok(outcome)
            }
            Err(e) => {
                stats.rows = 0;
                stats.outcome = "Failed".into();
                stats.consecutive_failures += 1;
                stats.stopped = matches!(e, TickError::Halted { .. }).then_some("halted");
                match e.kind() {
                    ErrorKind::Transient => stats.failures_transient += 1,
                    ErrorKind::Operator => stats.failures_operator += 1,
                }
                Err(e)
            }
        }
    }

    /// What this process heard from the function's ticks, for the watchdog, status and metrics. The first call
    /// fixes `watched_since` (the baseline while nothing was heard) at the trigger's `now`.
    pub fn liveness(&self) -> Heard {
        let now = self.ledger.clock().now();
        self.stats.lock().expect("stats lock").watched_since.get_or_insert(now);
        self.heard().expect("watched since now")
    }

    /// What this process heard, if it ticked or watches the function; `None` in a process that does neither
    /// (`handler state status` runs no ticks: its "seconds since" would be counted from its own start).
    pub fn heard(&self) -> Option<Heard> {
        let stats = self.stats.lock().expect("stats lock");
        // A tick runs when its start is later than the last end (`at`); it is bounded by its budget.
        let ticking = stats.last_invocation_at.is_some_and(|started| stats.at.is_none_or(|ended| started > ended));
        let budget = time::Duration::try_from(self.config.settings.tick_timeout).unwrap_or(time::Duration::MAX);
        Some(Heard {
            last_invocation: stats.last_invocation_at,
            last_success: stats.last_success_at,
            consecutive_failures: stats.consecutive_failures,
            stopped: stats.stopped,
            watched_since: stats.watched_since?,
            last_end: stats.at,
            ticking_until: stats.last_invocation_at.filter(|_| ticking).map(|started| started.saturating_add(budget)),
        })
    }

    /// The trigger's `now` (its clock: the system's, or a test's).
    pub fn now(&self) -> OffsetDateTime {
        self.ledger.clock().now()
    }
}
