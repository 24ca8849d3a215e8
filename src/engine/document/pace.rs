//! The observed pace: changes acknowledged per second, over the last few minutes, kept in the state document so
//! every instance and every status poll sees the same figure.
//!
//! A decayed sum, not a list of samples: each acknowledgement adds its rows, and the sum decays by
//! `e^(-dt/τ)` with τ = [`PACE_HORIZON`]. The rate is the sum over τ, corrected for an observation shorter
//! than τ (`τ·(1 − e^(−elapsed/τ))`), so a function that has run for 30 s is not reported at a tenth of its
//! speed. Three numbers in the document, one multiplication per acknowledgement.
//!
//! Acknowledged, not answered: under deferred delivery a batch counts once proven written, so the pace lags
//! the answers by the proof window but measures what really reached the consumer; `pending` (status) counts
//! the unproven span too, so `pending / pace` is the time to drain at this pace.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use time::OffsetDateTime;

/// τ: how far back the pace looks (a change acknowledged τ ago weighs e⁻¹ ≈ 37 %).
pub const PACE_HORIZON: Duration = Duration::from_secs(300);
/// Below this much observation the pace is not reported: one batch in two seconds says little.
const MIN_OBSERVED: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Pace {
    /// The decayed sum of acknowledged rows, as of `at`.
    pub rows: f64,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    /// When observing began: the first acknowledgement (whose rows only start the clock, since they were
    /// produced over an unknown time before it).
    #[serde(with = "time::serde::rfc3339")]
    pub since: OffsetDateTime,
}

impl Pace {
    /// Adds an acknowledgement of `rows` at `now`.
    pub fn record(pace: &mut Option<Pace>, rows: u64, now: OffsetDateTime) {
        match pace {
            None => *pace = Some(Pace { rows: 0.0, at: now, since: now }),
            Some(p) => {
                p.rows = p.decayed(now) + rows as f64;
                p.at = now.max(p.at);
            }
        }
    }

    /// Changes acknowledged per second at `now`; `None` until [`MIN_OBSERVED`] has passed.
    pub fn per_second(&self, now: OffsetDateTime) -> Option<f64> {
        let observed = seconds(now - self.since);
        if observed < MIN_OBSERVED.as_secs_f64() {
            return None;
        }
        let tau = PACE_HORIZON.as_secs_f64();
        Some(self.decayed(now) / (tau * (1.0 - (-observed / tau).exp())))
    }

    fn decayed(&self, now: OffsetDateTime) -> f64 {
        self.rows * (-seconds(now - self.at) / PACE_HORIZON.as_secs_f64()).exp()
    }
}

/// Seconds of a (possibly negative, when clocks disagree) interval, never below zero.
fn seconds(d: time::Duration) -> f64 {
    d.as_seconds_f64().max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    /// Acknowledges `rows` every `every` for `count` times from `start`.
    fn steady(rows: u64, every: u64, count: u64, start: OffsetDateTime) -> Option<Pace> {
        let mut pace = None;
        for i in 0..count {
            Pace::record(&mut pace, rows, start + Duration::from_secs(i * every));
        }
        pace
    }

    #[test]
    fn a_steady_flow_is_measured_at_its_rate_whether_it_ran_a_minute_or_an_hour() {
        let start = datetime!(2026-11-25 10:00:00 UTC);
        // 100 changes every 5 s is 20 changes/s.
        for count in [13, 61, 721] {
            let pace = steady(100, 5, count, start).expect("recorded");
            let now = start + Duration::from_secs((count - 1) * 5);
            let rate = pace.per_second(now).expect("observed long enough");
            assert!((rate - 20.0).abs() < 20.0 * 0.1, "{count} batches: {rate}");
        }
    }

    #[test]
    fn the_pace_fades_when_nothing_is_acknowledged_and_is_unknown_at_first() {
        let start = datetime!(2026-11-25 10:00:00 UTC);
        let pace = steady(100, 5, 721, start).expect("recorded");
        let last = start + Duration::from_secs(3600);
        let later = pace.per_second(last + PACE_HORIZON).expect("known");
        let at_last = pace.per_second(last).expect("known");
        assert!((later / at_last - (-1f64).exp()).abs() < 0.01, "{later} vs {at_last}");
        let young = steady(100, 1, 3, start).expect("recorded");
        assert_eq!(young.per_second(start + Duration::from_secs(2)), None);
    }
}
