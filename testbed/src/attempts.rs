//! Host attempts for tests that call the engine directly, as the host makes them.

use sql_pseudo_trigger::protocol::{Attempt, RetryContext};

/// A first attempt under a policy of five retries, with a fresh invocation id.
pub fn first() -> Attempt {
    Attempt::fresh(Some(RetryContext::first(5)))
}

/// Retry `n` of five after `failed` failed, with a fresh invocation id.
pub fn retry_after(n: i64, failed: &Attempt) -> Attempt {
    Attempt::fresh(Some(RetryContext::after(n, 5, failed.id.clone())))
}
