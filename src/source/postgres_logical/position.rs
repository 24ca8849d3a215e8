//! Where the logical source stands in the write-ahead log, and how that place orders the changes it decodes.
//!
//! Logical decoding hands out transactions whole, in the order of their commit records, so a change is placed
//! by its transaction's commit LSN (the start of the commit record, pgoutput's Begin "final LSN") and its
//! sequence number inside that transaction (1 for the first change of the watched table). A position is
//! `{"lsn": commit LSN, "n": sequence}` for a change inside a transaction, and carries `"end"` (the end of the
//! commit record) when nothing of that transaction is left after it: the transaction is then done, and the
//! slot may be advanced past it.
//!
//! The slot rule this builds on (PostgreSQL's `SnapBuildXactNeedsSkip`): decoding from a slot whose
//! `confirmed_flush_lsn` is `F` skips exactly the transactions whose commit record starts before `F`. So
//! advancing the slot to a position's [`Pos::resume`] skips only transactions that the position has passed
//! whole, and keeps a transaction the position is in the middle of.

use crate::source::SourceError;
use serde_json::{json, Value};
use std::cmp::Ordering;
use std::fmt;

/// A WAL location, shown as PostgreSQL shows it (`16/B374D848`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Lsn(pub u64);

impl Lsn {
    pub fn parse(text: &str) -> Option<Self> {
        let (hi, lo) = text.split_once('/')?;
        let hi = u32::from_str_radix(hi, 16).ok()?;
        let lo = u32::from_str_radix(lo, 16).ok()?;
        Some(Self((u64::from(hi) << 32) | u64::from(lo)))
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// One change's place: its transaction's commit LSN and its sequence number in that transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Place {
    pub commit: Lsn,
    pub seq: u64,
}

/// A stored position (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    pub commit: Lsn,
    pub seq: u64,
    /// The end of the commit record when the transaction is done.
    pub end: Option<Lsn>,
}

impl Pos {
    /// A position that has passed every transaction whose commit starts before `lsn`: where a slot is created,
    /// or a stretch of WAL proven to hold nothing for this source.
    pub fn before(lsn: Lsn) -> Self {
        Self { commit: lsn, seq: 0, end: Some(lsn) }
    }

    /// Where the slot may be advanced once this position is acknowledged: past the transaction when it is done,
    /// else to the start of its commit record, which keeps it.
    pub fn resume(&self) -> Lsn {
        self.end.unwrap_or(self.commit)
    }

    /// Whether the change at `place` comes after this position.
    pub fn precedes(&self, place: Place) -> bool {
        match self.end {
            Some(end) => place.commit >= end,
            None => place > Place { commit: self.commit, seq: self.seq },
        }
    }

    /// Whether the change at `place` is at or before this position.
    pub fn covers(&self, place: Place) -> bool {
        !self.precedes(place)
    }

    /// Whether this position covers every change `other` covers: a reader that holds everything after `other`
    /// can serve a read after this position. Exact where [`Ord`] is only conservative (a position inside the
    /// transaction that commits at `L` includes `Pos::before(L)`, though it sorts before it).
    pub fn includes(&self, other: Pos) -> bool {
        match (other.end, self.end) {
            (Some(other_end), Some(end)) => end >= other_end,
            (Some(other_end), None) => self.commit >= other_end,
            (None, Some(end)) => end > other.commit,
            (None, None) => (self.commit, self.seq) >= (other.commit, other.seq),
        }
    }

    pub fn to_json(self) -> Value {
        match self.end {
            Some(end) => json!({ "lsn": self.commit.to_string(), "n": self.seq, "end": end.to_string() }),
            None => json!({ "lsn": self.commit.to_string(), "n": self.seq }),
        }
    }

    /// A position the engine handed back (`Null`: before everything), refused with the fix when it is not a
    /// postgres-logical position.
    pub fn stored(p: &Value) -> Result<Option<Self>, SourceError> {
        if p.is_null() {
            return Ok(None);
        }
        Self::from_json(p).map(Some).ok_or_else(|| {
            SourceError::Invalid(format!(
                "stored position {p} is not a postgres-logical position ({{\"lsn\": \"0/16B3748\", \"n\": 1}}); reset the function's state"
            ))
        })
    }

    /// Reads a stored position; `None` for the shape of another source's position.
    pub fn from_json(v: &Value) -> Option<Self> {
        let o = v.as_object()?;
        if o.keys().any(|k| !matches!(k.as_str(), "lsn" | "n" | "end")) {
            return None;
        }
        let commit = Lsn::parse(o.get("lsn")?.as_str()?)?;
        let seq = o.get("n")?.as_u64()?;
        let end = match o.get("end") {
            None => None,
            Some(e) => Some(Lsn::parse(e.as_str()?)?),
        };
        if end.is_some_and(|e| e < commit) {
            return None;
        }
        Some(Self { commit, seq, end })
    }
}

impl PartialOrd for Pos {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Positions in stream order: a done transaction sorts after every change in it.
impl Ord for Pos {
    fn cmp(&self, other: &Self) -> Ordering {
        let key = |p: &Self| (p.commit, p.end.is_some(), p.seq, p.end);
        key(self).cmp(&key(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lsns_read_and_print_as_postgresql_shows_them() {
        let l = Lsn::parse("16/B374D848").expect("an LSN");
        assert_eq!(l.0, 0x16_B374_D848);
        assert_eq!(l.to_string(), "16/B374D848");
        assert_eq!(Lsn::parse("0/0"), Some(Lsn(0)));
        for bad in ["", "16", "16/", "/1", "x/1", "1/100000000", "1/2/3"] {
            assert_eq!(Lsn::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_position_inside_a_transaction_keeps_it_and_a_done_one_passes_it() {
        let c = Lsn(1000);
        let inside = Pos { commit: c, seq: 3, end: None };
        assert!(inside.covers(Place { commit: c, seq: 3 }));
        assert!(inside.precedes(Place { commit: c, seq: 4 }));
        assert!(inside.covers(Place { commit: Lsn(999), seq: 9 }));
        assert!(inside.precedes(Place { commit: Lsn(1001), seq: 1 }));
        // The slot may go to the commit's start, which keeps the transaction (skip is "commit < confirmed").
        assert_eq!(inside.resume(), c);

        let done = Pos { commit: c, seq: 5, end: Some(Lsn(1040)) };
        assert!(done.covers(Place { commit: c, seq: 99 }));
        assert!(done.precedes(Place { commit: Lsn(1040), seq: 1 }));
        assert_eq!(done.resume(), Lsn(1040));
        assert!(inside < done);

        let empty = Pos::before(Lsn(2000));
        assert!(empty.covers(Place { commit: Lsn(1999), seq: 1 }));
        assert!(empty.precedes(Place { commit: Lsn(2000), seq: 1 }));
        assert!(done < empty);
    }

    #[test]
    fn a_position_includes_exactly_what_it_covers_beyond_another() {
        let before = Pos::before(Lsn(1000));
        let inside = Pos { commit: Lsn(1000), seq: 3, end: None };
        let done = Pos { commit: Lsn(1000), seq: 5, end: Some(Lsn(1040)) };
        let earlier = Pos { commit: Lsn(900), seq: 9, end: None };
        assert!(inside.includes(before) && done.includes(inside) && done.includes(before));
        assert!(!before.includes(inside) && !inside.includes(done) && !earlier.includes(before));
        assert!(before.includes(earlier) && inside.includes(inside) && done.includes(done));
        assert!(!Pos { commit: Lsn(1000), seq: 2, end: None }.includes(inside));
        // Checked against `covers` on every place around them.
        let all = [before, inside, done, earlier, Pos::before(Lsn(1040)), Pos { commit: Lsn(1040), seq: 1, end: None }];
        for a in all {
            for b in all {
                let places = (899..1042).flat_map(|c| (0..7).map(move |seq| Place { commit: Lsn(c), seq }));
                let exact = places.clone().all(|p| !b.covers(p) || a.covers(p));
                assert_eq!(a.includes(b), exact, "{a:?} includes {b:?}");
            }
        }
    }

    #[test]
    fn positions_round_trip_and_other_shapes_are_refused() {
        for p in [Pos { commit: Lsn(7), seq: 2, end: None }, Pos { commit: Lsn(7), seq: 2, end: Some(Lsn(9)) }] {
            assert_eq!(Pos::from_json(&p.to_json()), Some(p));
        }
        for bad in [
            json!(["1", "2"]),
            json!({"lsn": "0/7"}),
            json!({"lsn": "0/7", "n": -1}),
            json!({"lsn": "0/9", "n": 1, "end": "0/7"}),
            json!({"lsn": "0/7", "n": 1, "x": 1}),
        ] {
            assert_eq!(Pos::from_json(&bad), None, "{bad}");
        }
    }
}
