//! Crash points for tests: `SQL_PSEUDO_TRIGGER_FAILPOINTS=after-fetch,after-commit` makes the process abort
//! (as `kill -9` would) when a tick reaches that point. Read once; when unset, each check is one atomic load.
//!
//! Points: `after-fetch` (changes read, nothing committed), `after-commit` (batch recorded in flight, not yet
//! answered to the host).

use std::sync::OnceLock;

pub const ENV: &str = "SQL_PSEUDO_TRIGGER_FAILPOINTS";

static ARMED: OnceLock<Vec<String>> = OnceLock::new();

/// Aborts the process if `point` is armed.
pub fn hit(point: &str) {
    let armed = ARMED.get_or_init(|| {
        std::env::var(ENV)
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default()
    });
    if armed.iter().any(|p| p == point) {
        eprintln!("failpoint {point} hit: aborting");
        std::process::abort();
    }
}
