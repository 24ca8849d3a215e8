//! What a stream keeps in memory between ticks: the watched table's decoded events from a known position on,
//! bounded in bytes and in changes, and where the stream stands.
//!
//! The buffer holds every event after `base`, up to what the stream received. It lets go of a prefix only
//! when a position passes it: an acknowledged checkpoint at once (it can never be asked for again), a batch a
//! tick fetched past only when the buffer is full (a retry of that batch may still want it; one that finds it
//! gone restarts the stream at the slot's confirmed position, the rare path). When full of what no tick has
//! passed (one transaction larger than the buffer), the stream stops reading until a tick takes a batch.

use super::decode::Event;
use super::options::OnTruncate;
use super::position::{Lsn, Pos};
use super::scan::{Scan, Scanner, Want};
use crate::source::SourceError;
use std::collections::VecDeque;
use std::time::Instant;

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

    pub fn held(&self) -> (usize, usize) {
        (self.changes, self.bytes)
    }
}
