//! The share between live changes and a backfill's chunks (docs/operations.md and docs/architecture.md,
//! "Backfill"). One tick answers one batch, so the share is a choice of which batch a tick serves:
//! - live first: a tick fetches live changes, and serves a chunk only when that fetch comes back empty, so a
//!   function that keeps up sees its backfill run at full speed in the ticks that would have been empty;
//! - but never more than [`LIVE_PER_CHUNK`] live batches in a row while a backfill runs: the next tick serves
//!   a chunk first (and fetches live changes only if the backfill has nothing left). Under a sustained live
//!   backlog the backfill still gets one batch in `LIVE_PER_CHUNK + 1`, and live changes keep at least
//!   `LIVE_PER_CHUNK` in `LIVE_PER_CHUNK + 1`: their latency grows by at most one chunk's delivery in five.
//!
//! Why not alternate strictly: a backfill of a large table would then double the latency of every live change
//! even while live changes trickle in; the empty ticks are free. Why not live only: a busy table would never
//! be backfilled. The counter lives in the process's memory (a restart starts it at 0), since the share is a
//! matter of pace, not of correctness: every rule that keeps chunks and live changes consistent holds
//! whatever the order of batches.

use crate::engine::document::{Backfill, BackfillState};

/// Live batches in a row after which a running backfill is served first.
pub const LIVE_PER_CHUNK: u32 = 4;

/// Which batch a tick serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Live changes only (no backfill running).
    Live,
    /// Live changes; a chunk if there are none.
    LiveThenChunk,
    /// A chunk; live changes if the backfill has nothing left.
    ChunkThenLive,
}

/// See the module docs: `live_in_a_row` live batches were served since the last chunk.
pub fn turn(backfill: Option<&Backfill>, live_in_a_row: u32) -> Turn {
    match backfill {
        Some(b) if b.state == BackfillState::Running => {
            if live_in_a_row >= LIVE_PER_CHUNK {
                Turn::ChunkThenLive
            } else {
                Turn::LiveThenChunk
            }
        }
        _ => Turn::Live,
    }
}

/// The count of live batches in a row after a tick that served `chunk` (a chunk) or a live batch.
pub fn after_batch(live_in_a_row: u32, chunk: bool) -> u32 {
    if chunk {
        0
    } else {
        live_in_a_row.saturating_add(1)
    }
}

/// A chunk read came back empty: the backfill is done if nothing of it is still waiting to be acknowledged
/// (`unacknowledged`: a chunk of it in flight, or answered and not yet proven).
pub fn finished(backfill: Option<&Backfill>, unacknowledged: bool) -> bool {
    backfill.is_some_and(|b| b.state == BackfillState::Running) && !unacknowledged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::Position;

    fn backfill(state: BackfillState) -> Backfill {
        let mut b = Backfill::new(Position::Null, None, None, "t", time::OffsetDateTime::UNIX_EPOCH);
        b.state = state;
        b
    }

    #[test]
    fn live_goes_first_and_a_backfill_gets_one_batch_in_five_under_a_backlog() {
        let running = backfill(BackfillState::Running);
        assert_eq!(turn(None, 99), Turn::Live);
        assert_eq!(turn(Some(&backfill(BackfillState::Paused)), 99), Turn::Live);
        assert_eq!(turn(Some(&backfill(BackfillState::Done)), 99), Turn::Live);
        // A sustained backlog: every live fetch is full. Count what 100 ticks serve.
        let (mut in_a_row, mut chunks) = (0, 0);
        for _ in 0..100 {
            let chunk = turn(Some(&running), in_a_row) == Turn::ChunkThenLive;
            chunks += u32::from(chunk);
            in_a_row = after_batch(in_a_row, chunk);
        }
        assert_eq!(chunks, 20, "one batch in LIVE_PER_CHUNK + 1");
        assert_eq!(turn(Some(&running), 0), Turn::LiveThenChunk);
    }

    #[test]
    fn a_backfill_finishes_only_with_nothing_of_it_unacknowledged() {
        let running = backfill(BackfillState::Running);
        assert!(finished(Some(&running), false));
        assert!(!finished(Some(&running), true));
        assert!(!finished(Some(&backfill(BackfillState::Paused)), false));
        assert!(!finished(None, false));
    }
}
