//! Where a `--once` drain ends: not at its first empty tick, but once the source has passed the position the
//! database had when the drain started (its horizon, `Source::horizon`), or when it gives up, saying so.
//!
//! An empty tick alone proves little: a replication stream that is still decoding other tables' WAL, or a
//! late-commit guard that holds rows back behind an open transaction, answers nothing for a while although
//! changes that existed at the start are still to come. So after an empty tick the drain asks the source
//! whether it has passed the horizon (`Source::reached`), and ticks again while it has not. A source that makes
//! no progress towards it (the position proven empty does not move, nothing is delivered) for
//! `--give-up-after` ends the drain with an error naming the function and both positions: the exit status then
//! says the backlog was not drained.

use crate::engine::{OutcomeKind, TickError, TickOutcome, Trigger};
use crate::source::Position;
use std::time::{Duration, Instant};

/// One function's drain.
#[derive(Debug)]
pub(super) struct Drain {
    /// `None` until read, before the first tick; then the horizon (`None` inside: nothing to pass).
    horizon: Option<Option<Position>>,
    /// When the drain last moved: a delivery, or a position proven empty further on.
    moved: Instant,
    last_proven: Option<Position>,
    give_up_after: Duration,
}

/// What an empty tick means for the drain.
#[derive(Debug, PartialEq)]
pub(super) enum Verdict {
    /// Every change present at the start is delivered (or the function is paused).
    Done,
    /// Not there yet: tick again.
    Going,
    /// No progress for `--give-up-after`: the error to report.
    GaveUp(String),
}

impl Drain {
    pub(super) fn new(give_up_after: Duration) -> Self {
        Self { horizon: None, moved: Instant::now(), last_proven: None, give_up_after }
    }

    /// Reads the horizon once, before the drain's first tick (again before the next tick when it failed).
    pub(super) async fn begin(&mut self, trigger: &Trigger) -> Result<(), TickError> {
        if self.horizon.is_none() {
            let horizon = trigger.source().horizon().await.map_err(TickError::from)?;
            let shown = horizon.as_ref().map_or_else(|| "nothing to pass".to_string(), Position::to_string);
            tracing::info!(function = %trigger.name(), horizon = %shown, "draining up to the source's position at the start");
            self.horizon = Some(horizon);
            self.moved = Instant::now();
        }
        Ok(())
    }

    /// A tick delivered something.
    pub(super) fn delivered(&mut self) {
        self.moved = Instant::now();
    }

    /// After an empty or paused tick: whether the drain is over.
    pub(super) async fn after_empty(&mut self, trigger: &Trigger, outcome: &TickOutcome) -> Result<Verdict, TickError> {
        let Some(Some(horizon)) = &self.horizon else { return Ok(Verdict::Done) };
        if outcome.kind == OutcomeKind::Paused {
            return Ok(Verdict::Done);
        }
        if let Some(at) = &outcome.proven {
            if trigger.source().reached(horizon, at).await.map_err(TickError::from)? {
                tracing::info!(function = %trigger.name(), at = %at, "drained: passed the source's position at the start");
                return Ok(Verdict::Done);
            }
            if self.last_proven.as_ref() != Some(at) {
                self.last_proven = Some(at.clone());
                self.moved = Instant::now();
            }
        }
        if self.moved.elapsed() < self.give_up_after {
            return Ok(Verdict::Going);
        }
        let at = self.last_proven.as_ref().map_or_else(|| "its checkpoint".to_string(), Position::to_string);
        Ok(Verdict::GaveUp(format!(
            "the source did not reach its position at the start of this drain ({horizon}) and stood still at {at} for {} s, so this drain gave up (a transaction held open behind the late-commit guard, or a replication stream that cannot read on, keeps it there); the next run goes on from the last acknowledged batch; --give-up-after sets the wait",
            self.moved.elapsed().as_secs()
        )))
    }
}
