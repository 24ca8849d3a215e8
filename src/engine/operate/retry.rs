//! An operator's write that meets a tick's: re-read, apply the action again, write again.
//!
//! Under `handler run` a function's ticks write its state document several times a second (record,
//! acknowledge, heartbeat), so an operator's compare-and-swap usually loses a race or two. Losing one is the
//! normal case, not an error: the action is applied again to the document as it now reads, and it fails only
//! when the action itself no longer applies (the backfill it pauses has ended, say: the transition says so) or
//! when every attempt lost, which takes a writer that never stops (then the conflict is reported).

use super::super::document::StateDoc;
use super::super::ledger::Saved;
use super::super::parts::Trigger;
use super::OpsError;
use crate::state::Etag;
use std::time::Duration;

/// How many times an operator's action is applied before its conflicts are reported.
pub(super) const ATTEMPTS: u32 = 12;
/// The first pause after a lost compare-and-swap; each further one is longer, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(20);
const MAX_PAUSE: Duration = Duration::from_millis(400);

/// Writes what `step` answers (a compare-and-swap on the etag it read), again after every lost race, up to
/// [`ATTEMPTS`] times. `step` reads the document and applies the action to it, answering the document, the
/// etag it read (`None`: a document never written, created by the write) and what to tell the operator; it
/// refuses with the error to report when the action no longer applies. It runs once per attempt, each time on
/// a fresh read.
pub(super) async fn apply<F, T>(
    t: &Trigger,
    who: &str,
    action: &str,
    mut step: impl FnMut() -> F,
) -> Result<(StateDoc, T), OpsError>
where
    F: std::future::Future<Output = Result<(StateDoc, Option<Etag>, T), OpsError>>,
{
    for attempt in 1..=ATTEMPTS {
        let (mut doc, etag, answer) = step().await?;
        match t.ledger.save(&mut doc, etag.as_ref(), &format!("operator {who}")).await? {
            Saved::Written(_) => {
                tracing::info!(function = %t.name(), who = %who, action = %action, attempt, "operator action applied");
                return Ok((doc, answer));
            }
            Saved::Conflict => {
                tracing::debug!(function = %t.name(), action = %action, attempt,
                    "the state changed while the operator action was applied (a tick wrote it); applying it again");
                tokio::time::sleep(pause(attempt)).await;
            }
        }
    }
    Err(OpsError::Conflict(t.name().to_string()))
}

/// The pause after lost attempt `attempt` (1 first): doubling from [`FIRST_PAUSE`] up to [`MAX_PAUSE`], with up
/// to half of it added at random, so two operators (or an operator and a tick on a fixed cadence) that collided
/// once do not collide again in step.
fn pause(attempt: u32) -> Duration {
    let base = FIRST_PAUSE.saturating_mul(1 << attempt.saturating_sub(1).min(8)).min(MAX_PAUSE);
    let nanos = time::OffsetDateTime::now_utc().nanosecond();
    base + base.mul_f64(f64::from(nanos % 1000) / 2000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pauses_grow_from_twenty_milliseconds_to_at_most_six_hundred_and_add_up_to_about_four_seconds() {
        assert!((FIRST_PAUSE..FIRST_PAUSE.mul_f64(1.5)).contains(&pause(1)), "{:?}", pause(1));
        assert!(pause(3) >= Duration::from_millis(80));
        assert!((MAX_PAUSE..=MAX_PAUSE.mul_f64(1.5)).contains(&pause(40)), "no overflow at a large attempt");
        let total: Duration = (1..ATTEMPTS).map(pause).sum();
        assert!(total <= Duration::from_millis(5_000), "an operator waits seconds at most: {total:?}");
    }
}
