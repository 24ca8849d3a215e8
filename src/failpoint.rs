//! Crash points for tests, compiled only with the `failpoints` feature (which the tests' own build of this
//! package turns on; a normal or release build has none, and `hit` is then an empty function):
//! `SQL_PSEUDO_TRIGGER_FAILPOINTS=after-fetch,after-commit` makes the process abort (as `kill -9` would) when a
//! tick reaches that point. `point@n` aborts at the n-th time the point is reached
//! instead of the first, so a test can crash a process in the middle of a drain. Read once; when unset, each
//! check is one atomic load.
//!
//! Points: `after-fetch` (changes read, nothing committed), `after-commit` (batch recorded in flight, not yet
//! answered to the host or handed to a sink), `sink-before-commit` (a SQL sink wrote the batch in its open
//! transaction, not committed), `after-sink` (the sink committed the batch, the state does not say so yet),
//! `after-sink-chunk` (the same, reached only by a backfill's chunks).

#[cfg(feature = "failpoints")]
use std::sync::atomic::{AtomicU64, Ordering};
#[cfg(feature = "failpoints")]
use std::sync::OnceLock;

pub const ENV: &str = "SQL_PSEUDO_TRIGGER_FAILPOINTS";

/// An armed point: its name, the hit that aborts, and the hits so far.
#[cfg(feature = "failpoints")]
struct Armed {
    point: String,
    at: u64,
    hits: AtomicU64,
}

#[cfg(feature = "failpoints")]
static ARMED: OnceLock<Vec<Armed>> = OnceLock::new();

/// Without the `failpoints` feature: nothing.
#[cfg(not(feature = "failpoints"))]
#[inline(always)]
pub fn hit(_point: &str) {}

/// Aborts the process if `point` is armed (and, with `point@n`, reached for the n-th time).
#[cfg(feature = "failpoints")]
pub fn hit(point: &str) {
    let armed =
        ARMED.get_or_init(|| std::env::var(ENV).map(|v| v.split(',').filter_map(parse).collect()).unwrap_or_default());
    for a in armed.iter().filter(|a| a.point == point) {
        if a.hits.fetch_add(1, Ordering::Relaxed) + 1 == a.at {
            eprintln!("failpoint {point} hit: aborting");
            std::process::abort();
        }
    }
}

#[cfg(feature = "failpoints")]
fn parse(text: &str) -> Option<Armed> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    let (point, at) = match text.split_once('@') {
        Some((point, n)) => (point, n.trim().parse().ok().filter(|n| *n > 0)?),
        None => (text, 1),
    };
    Some(Armed { point: point.trim().to_string(), at, hits: AtomicU64::new(0) })
}

#[cfg(all(test, feature = "failpoints"))]
mod tests {
    use super::*;

    #[test]
    fn a_point_arms_at_its_first_hit_or_at_the_nth() {
        let a = parse(" after-sink ").expect("armed");
        assert_eq!((a.point.as_str(), a.at), ("after-sink", 1));
        let a = parse("after-commit@7").expect("armed");
        assert_eq!((a.point.as_str(), a.at), ("after-commit", 7));
        assert!(parse("after-commit@0").is_none());
        assert!(parse("after-commit@x").is_none());
        assert!(parse("").is_none());
    }
}
