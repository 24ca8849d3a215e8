//! What the host does around an invocation, as function.json and host.json configure it: the retry policy,
//! the invocation timeout, and the proof window the engine derives from both.

use super::env::Env;
use super::error::ConfigError;
use serde_json::Value;
use std::time::Duration;

/// Added to the proof window for the host's own scheduling (thread pools, logging, the retry's HTTP request).
pub const PROOF_SLACK: Duration = Duration::from_secs(30);

/// function.json's `retry`, as the host reads it (azure-functions-host `RetryPolicy`: `fixedDelay` with
/// `delayInterval`, `exponentialBackoff` with `minimumInterval` and `maximumInterval`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub strategy: RetryStrategy,
    /// -1 means forever.
    pub max_retry_count: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryStrategy {
    /// The same delay before every retry.
    FixedDelay { delay: Duration },
    /// A randomized delay that doubles from `minimum`, never above `maximum` (azure-webjobs-sdk
    /// `ExponentialBackoffRetryAttribute` over `RandomizedExponentialBackoffStrategy`).
    ExponentialBackoff { minimum: Duration, maximum: Duration },
}

impl RetryPolicy {
    /// A fixed-delay policy (tests).
    pub fn fixed(max_retry_count: i64, delay: Duration) -> Self {
        Self { strategy: RetryStrategy::FixedDelay { delay }, max_retry_count }
    }

    /// The longest the host may wait between a failed attempt and its retry.
    pub fn max_delay(&self) -> Duration {
        match self.strategy {
            RetryStrategy::FixedDelay { delay } => delay,
            RetryStrategy::ExponentialBackoff { maximum, .. } => maximum,
        }
    }

    /// Reads function.json's `retry` object; every problem is reported against `file`.
    pub fn parse(retry: &Value, file: &str, errors: &mut Vec<ConfigError>) -> Option<Self> {
        let setting = |key: &str| format!("retry.{key} in {file}");
        let before = errors.len();
        let max_retry_count = match retry.get("maxRetryCount").and_then(Value::as_i64) {
            Some(n) if n >= -1 => n,
            _ => {
                errors.push(ConfigError::new(setting("maxRetryCount"), "must be a whole number, -1 for unlimited"));
                0
            }
        };
        let mut interval = |key: &str| match retry.get(key).and_then(Value::as_str).map(parse_timespan) {
            Some(Some(d)) => d,
            _ => {
                errors.push(ConfigError::new(setting(key), "must be a timespan like \"00:00:05\""));
                Duration::ZERO
            }
        };
        let strategy = match retry.get("strategy").and_then(Value::as_str) {
            Some(s) if s.eq_ignore_ascii_case("fixedDelay") => {
                RetryStrategy::FixedDelay { delay: interval("delayInterval") }
            }
            Some(s) if s.eq_ignore_ascii_case("exponentialBackoff") => {
                let (minimum, maximum) = (interval("minimumInterval"), interval("maximumInterval"));
                if minimum > maximum {
                    errors.push(ConfigError::new(setting("minimumInterval"), "must not be above maximumInterval"));
                }
                RetryStrategy::ExponentialBackoff { minimum, maximum }
            }
            _ => {
                errors.push(ConfigError::new(setting("strategy"), "must be fixedDelay or exponentialBackoff"));
                return None;
            }
        };
        (errors.len() == before).then_some(Self { strategy, max_retry_count })
    }
}

/// Parses a .NET TimeSpan as function.json and host.json write one: `hh:mm:ss[.fff]` or `d.hh:mm:ss[.fff]`.
pub fn parse_timespan(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (days, clock) = match text.split_once('.') {
        Some((days, clock)) if clock.contains(':') => (days.parse::<u64>().ok()?, clock),
        _ => (0, text),
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let [h, m, s] = parts.as_slice() else {
        return None;
    };
    let seconds: f64 = s.parse().ok()?;
    if !seconds.is_finite() || seconds < 0.0 {
        return None;
    }
    // Checked: a hand-written host.json can hold any digits (found by the function-folder fuzz target:
    // `"functionTimeout": "00:05:00888…"` panicked converting the seconds).
    let hours = h.parse::<u64>().ok()?.checked_mul(3_600)?;
    let minutes = m.parse::<u64>().ok()?.checked_mul(60)?;
    let whole = days.checked_mul(86_400)?.checked_add(hours)?.checked_add(minutes)?;
    Duration::from_secs(whole).checked_add(Duration::try_from_secs_f64(seconds).ok()?)
}

/// host.json's `functionTimeout`: how long the host lets an invocation run before it restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionTimeout {
    /// Set in host.json, or the plan's default.
    Bounded(Duration),
    /// `-1`: no limit (Premium and Dedicated plans allow it).
    Unbounded,
}

impl FunctionTimeout {
    /// The plan's default when host.json sets none: 5 minutes on Consumption (`WEBSITE_SKU=Dynamic`), 30 on
    /// Flex Consumption, Premium and Dedicated (learn.microsoft.com, "Function app timeout duration").
    pub fn plan_default(env: &Env) -> Self {
        match env.get("WEBSITE_SKU") {
            Some(sku) if sku.eq_ignore_ascii_case("Dynamic") => Self::Bounded(Duration::from_secs(5 * 60)),
            // Flex Consumption names itself `FlexConsumption`; it shares the 30 minutes of the plans below.
            Some(sku) if sku.eq_ignore_ascii_case("FlexConsumption") => Self::Bounded(Duration::from_secs(30 * 60)),
            _ => Self::Bounded(Duration::from_secs(30 * 60)),
        }
    }
}

/// How long an answer stays unproven: the host's longest path from an answer to the retry that reports its
/// failure (see `engine::decide::proof`). Without a bound on the invocation, 30 minutes are assumed.
pub fn proof_window(timeout: FunctionTimeout, retry: Option<&RetryPolicy>) -> Duration {
    let invocation = match timeout {
        FunctionTimeout::Bounded(d) => d,
        FunctionTimeout::Unbounded => UNBOUNDED_TIMEOUT_ASSUMED,
    };
    invocation + retry.map_or(Duration::ZERO, RetryPolicy::max_delay) + PROOF_SLACK
}

/// What the proof window assumes of an invocation when host.json's functionTimeout is `-1`.
pub const UNBOUNDED_TIMEOUT_ASSUMED: Duration = Duration::from_secs(30 * 60);

#[cfg(test)]
mod tests {
    use super::parse_timespan;
    use std::time::Duration;

    /// Found by the function-folder fuzz target (fuzz/corpus/function_config/regression-function-timeout-*):
    /// seconds of many digits, or components whose product overflows, panicked instead of being refused.
    #[test]
    fn a_timespan_too_large_for_a_duration_is_refused_not_a_panic() {
        assert_eq!(parse_timespan("00:05:00"), Some(Duration::from_secs(300)));
        assert_eq!(parse_timespan("1.02:00:00.5"), Some(Duration::from_secs_f64(93_600.5)));
        assert_eq!(parse_timespan(&format!("00:05:00{}", "8".repeat(400))), None);
        assert_eq!(parse_timespan("18446744073709551615:00:00"), None);
        assert_eq!(parse_timespan("999999999999999.00:00:00"), None);
    }
}
