//! What a stream keeps in memory between ticks: the watched table's decoded events from a known position on,
//! bounded in bytes and in changes, and where the stream stands.
//!
//! The buffer holds every event after `base`, up to what the stream received. It lets go of a prefix only
//! when a position passes it: an acknowledged checkpoint at once (it can never be asked for again), a batch a
//! tick fetched past only when the buffer is full (a retry of that batch may still want it; one that finds it
//! gone restarts the stream at the slot's confirmed position, the rare path). When full of what no tick has
//! passed (one transaction larger than the buffer), the stream stops reading until a tick takes a batch.
//!
//! [`Shared`] is the buffer as the stream's reader task and the ticks share it: the stream (`stream`) holds it
//! and takes batches from it, the reader (`reader`) fills it, a backfill chunk (`backfill`) waits on it. It sits
//! below all three so that none of them reaches into another for it.

use super::decode::Event;
use super::options::OnTruncate;
use super::position::{Lsn, Pos};
use super::scan::{Scan, Scanner, Want};
use crate::source::SourceError;
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;
use tokio::sync::Notify;

/// The buffer of one stream, between its reader task and the ticks.
#[derive(Debug)]
pub(super) struct Shared {
    pub buffer: Mutex<Buffer>,
    /// The buffer changed (events, a keepalive, the end): for waiting ticks.
    pub changed: Notify,
    /// A tick wants the task to look at the buffer again (room, a flush to report, a keepalive to ask for).
    pub wake: Notify,
}

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, Buffer> {
        self.buffer.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Why a stream stopped.
#[derive(Debug)]
pub(super) enum Ended {
    /// No tick used it for `streamIdleReleaseMs`: the slot is free for another instance.
    Idle,
    /// The process is shutting down.
    Shutdown,
    Failed(SourceError),
}

#[derive(Debug)]
pub(super) struct Buffer {
    events: VecDeque<(Event, usize)>,
    bytes: usize,
    changes: usize,
    max_bytes: usize,
    max_changes: usize,
    /// Where the stream started (`Pos::before` the slot's confirmed position then).
    pub start: Pos,
    /// Every event after this is held, up to what was received.
    pub base: Pos,
    /// The WAL position of the server's last keepalive: every commit before it was sent.
    pub keepalive_end: Lsn,
    /// The end of the last commit record received, and the commit LSN of a transaction being received.
    pub last_end: Lsn,
    pub open: Option<Lsn>,
    /// What the stream reports as flushed: the latest acknowledged checkpoint's resume LSN, never further.
    pub flush: Lsn,
    /// The furthest position a tick fetched after (what it has passed may go when the buffer is full).
    pub delivered: Option<Pos>,
    pub ended: Option<Ended>,
    pub shape_changed: bool,
    /// A tick wants a keepalive back (to learn how far the server has sent).
    pub reply_wanted: bool,
    pub last_used: Instant,
    /// The reader stopped reading: the buffer is full of what no position has passed.
    pub paused: bool,
}

impl Buffer {
    pub fn new(start: Lsn, flush: Lsn, max_bytes: usize, max_changes: usize) -> Self {
        let start_pos = Pos::before(start);
        Self {
            events: VecDeque::new(),
            bytes: 0,
            changes: 0,
            max_bytes,
            max_changes,
            start: start_pos,
            base: start_pos,
            keepalive_end: start,
            last_end: start,
            open: None,
            flush,
            delivered: None,
            ended: None,
            shape_changed: false,
            reply_wanted: false,
            last_used: Instant::now(),
            paused: false,
        }
    }

    /// Every transaction that commits before this was received whole.
    pub fn proven(&self) -> Lsn {
        self.open.unwrap_or(self.keepalive_end.max(self.last_end))
    }

    pub fn full(&self) -> bool {
        self.bytes >= self.max_bytes || self.changes >= self.max_changes
    }

    pub fn push(&mut self, event: Event, size: usize) {
        if self.base.covers(event.place()) {
            return;
        }
        if matches!(event, Event::Change(_)) {
            self.changes += 1;
        }
        self.bytes += size;
        self.events.push_back((event, size));
    }

    /// Lets go of what `cover` has passed, when it is at or past `base`.
    pub fn trim(&mut self, cover: Pos) {
        if !cover.includes(self.base) {
            return;
        }
        while let Some((event, size)) = self.events.front() {
            if !cover.covers(event.place()) {
                break;
            }
            self.bytes -= size;
            if matches!(event, Event::Change(_)) {
                self.changes -= 1;
            }
            self.events.pop_front();
        }
        self.base = cover;
    }

    /// Whether the buffer holds everything after `after` that was received.
    pub fn serves(&self, after: Option<Pos>) -> bool {
        match after {
            None => self.base == self.start,
            Some(a) => a.includes(self.base),
        }
    }

    /// The batch `want` asks for out of what is held; whether it is whole.
    pub fn scan(&self, want: Want, on_truncate: OnTruncate, table: &str) -> Result<(Scan, bool), SourceError> {
        let from = match want.after {
            Some(a) => self.events.partition_point(|(e, _)| a.covers(e.place())),
            None => 0,
        };
        let mut scanner = Scanner::new(want, on_truncate, table);
        for (event, _) in self.events.range(from..) {
            scanner.push(event)?;
            if scanner.complete {
                break;
            }
        }
        let complete = scanner.complete;
        Ok((scanner.out, complete))
    }

    /// Every event held after `after` (all of them for `None`), in order: what a backfill checks its chunk
    /// against. Exact only while [`Self::serves`] `after`.
    pub fn after(&self, after: Option<Pos>) -> impl Iterator<Item = &Event> {
        let from = match after {
            Some(a) => self.events.partition_point(|(e, _)| a.covers(e.place())),
            None => 0,
        };
        self.events.range(from..).map(|(e, _)| e)
    }

    pub fn held(&self) -> (usize, usize) {
        (self.changes, self.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::change::Operation;
    use crate::source::postgres_logical::decode::Decoded;
    use crate::source::postgres_logical::position::Place;
    use serde_json::Map;

    fn change(commit: u64, seq: u64) -> Event {
        Event::Change(Decoded {
            place: Place { commit: Lsn(commit), seq },
            operation: Operation::Insert,
            kind: 0,
            values: Map::new(),
            item: None,
            lsn: Lsn(commit),
            xid: 1,
            commit_time: 0,
            key: None,
        })
    }

    /// Two transactions of three changes each, committing at 100 (ends 110) and 200 (ends 210).
    fn filled(max_changes: usize) -> Buffer {
        let mut b = Buffer::new(Lsn(50), Lsn(50), 1 << 20, max_changes);
        for commit in [100, 200] {
            for seq in 1..=3 {
                b.push(change(commit, seq), 10);
            }
            b.push(Event::Commit { commit: Lsn(commit), end: Lsn(commit + 10) }, 10);
        }
        b
    }

    fn want(after: Option<Pos>, limit: usize) -> Want {
        Want { after, upto: None, limit, values: true }
    }

    fn places(scan: &Scan) -> Vec<(u64, u64)> {
        scan.changes.iter().map(|c| (c.place.commit.0, c.place.seq)).collect()
    }

    #[test]
    fn a_batch_skips_what_the_position_passed_and_knows_when_its_transaction_is_done() {
        let b = filled(100);
        let inside = Pos { commit: Lsn(100), seq: 1, end: None };
        let (scan, complete) = b.scan(want(Some(inside), 2), OnTruncate::Fail, "t").expect("a scan");
        assert_eq!(places(&scan), [(100, 2), (100, 3)]);
        assert!(complete, "the commit after the last change was seen");
        assert_eq!(scan.last_end, Some(Lsn(110)));
        let (scan, complete) = b.scan(want(Some(Pos::before(Lsn(150))), 10), OnTruncate::Fail, "t").expect("a scan");
        assert_eq!(places(&scan), [(200, 1), (200, 2), (200, 3)]);
        assert!(!complete, "nothing after the last transaction yet");
    }

    #[test]
    fn an_acknowledged_position_lets_go_of_what_it_passed_and_serves_only_reads_after_it() {
        let mut b = filled(100);
        assert!(b.serves(None) && b.serves(Some(Pos::before(Lsn(50)))));
        assert_eq!(b.held(), (6, 80));
        let done = Pos { commit: Lsn(100), seq: 3, end: Some(Lsn(110)) };
        b.trim(done);
        assert_eq!(b.held(), (3, 40));
        assert!(!b.serves(None) && !b.serves(Some(Pos { commit: Lsn(100), seq: 2, end: None })));
        assert!(b.serves(Some(done)) && b.serves(Some(Pos { commit: Lsn(200), seq: 1, end: None })));
        // An older position lets go of nothing, and what arrives covered by the base is not kept.
        b.trim(Pos::before(Lsn(60)));
        assert_eq!(b.held(), (3, 40));
        b.push(change(100, 9), 10);
        assert_eq!(b.held(), (3, 40));
    }

    #[test]
    fn the_buffer_is_full_at_its_change_bound_and_a_position_inside_a_transaction_keeps_the_rest() {
        let mut b = filled(6);
        assert!(b.full());
        b.trim(Pos { commit: Lsn(200), seq: 1, end: None });
        assert!(!b.full());
        assert_eq!(b.held(), (2, 30), "changes 2 and 3 of the second transaction, and its commit");
        b.last_end = Lsn(210);
        assert_eq!(b.proven(), Lsn(210));
        b.open = Some(Lsn(300));
        assert_eq!(b.proven(), Lsn(300), "inside a transaction, everything committed before it was received");
    }
}
