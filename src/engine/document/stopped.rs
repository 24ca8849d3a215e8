//! Why a function delivers nothing: its stopped state, one enum whose variants say who sets them, and the
//! document's transitions of it (pause, resume, halt, retire).
//!
//! The stored document keeps the two fields it always had, `paused` (a bool) and `halted` (a reason), so
//! documents written by earlier releases and by this one read both ways, byte for byte (`wire.rs` converts).
//! Both can be set at once: an operator may pause a halted or retired function, and a halt or a retirement
//! keeps a pause given before it. The halt prevails (a tick refuses before it looks at the pause); the pause
//! still shows in status and in a re-partition's refusal, so it is kept in the halted variants.

use super::StateDoc;

/// How the halt reason of a document retired by `handler partitions change` starts (see [`StateDoc::retire`]).
pub const RETIRED: &str = "re-partitioned into ";

/// A stopped function, by who stopped it. A document that delivers holds none (`StateDoc::stopped` is `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stopped {
    /// Set by an operator (`handler state pause`, the admin route): ticks answer empty batches until an
    /// operator resumes the function.
    Paused,
    /// Set by the engine: a tick met a poison batch under `Sql_Trigger_PoisonAction=halt`. Ticks refuse with
    /// `reason` (the batch and its error) until an operator resumes or resets the function. `paused`: an
    /// operator paused it as well.
    Halted { reason: String, paused: bool },
    /// Set by an operator's change of the partition count (`handler partitions change`) on each document of the
    /// layout it replaced: the checkpoint lives on in the new layout's `into` partitions, so ticks refuse and a
    /// resume is refused. `reason` is the stored halt reason, `re-partitioned into {into} partitions {detail}`
    /// (kept whole, so a hand-edited one reads back as it was written). An operator's reset clears it, as it
    /// clears a halt. `paused`: an operator paused it as well.
    Retired { into: u32, reason: String, paused: bool },
}

impl Stopped {
    /// The stopped state the stored fields describe (`None`: delivering). A halt reason that reads as a
    /// retirement ([`RETIRED`], then a partition count) is one.
    pub(super) fn from_fields(paused: bool, halted: Option<String>) -> Option<Self> {
        match halted {
            None => paused.then_some(Self::Paused),
            Some(reason) => Some(match retired_into(&reason) {
                Some(into) => Self::Retired { into, reason, paused },
                None => Self::Halted { reason, paused },
            }),
        }
    }

    /// The stored fields of `stopped`: whether an operator paused it, and the halt reason.
    pub(super) fn into_fields(stopped: Option<Self>) -> (bool, Option<String>) {
        match stopped {
            None => (false, None),
            Some(Self::Paused) => (true, None),
            Some(Self::Halted { reason, paused } | Self::Retired { reason, paused, .. }) => (paused, Some(reason)),
        }
    }

    /// Whether an operator paused the function (alone, or beneath a halt).
    pub fn paused(&self) -> bool {
        match self {
            Self::Paused => true,
            Self::Halted { paused, .. } | Self::Retired { paused, .. } => *paused,
        }
    }

    /// The halt reason, a poison halt's or a retirement's; `None` when only paused.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Self::Paused => None,
            Self::Halted { reason, .. } | Self::Retired { reason, .. } => Some(reason),
        }
    }
}

/// How many partitions replaced the layout, when `reason` is a retirement's halt reason.
fn retired_into(reason: &str) -> Option<u32> {
    let rest = reason.strip_prefix(RETIRED)?;
    rest.split(' ').next()?.parse().ok()
}

impl StateDoc {
    /// Why this function delivers nothing; `None` when it delivers.
    pub fn stopped(&self) -> Option<&Stopped> {
        self.stopped.as_ref()
    }

    /// Whether an operator paused the function (whether or not it is halted too).
    pub fn paused(&self) -> bool {
        self.stopped.as_ref().is_some_and(Stopped::paused)
    }

    /// The halt reason: a poison halt's, or a retirement's (see [`StateDoc::retired_into`]).
    pub fn halted(&self) -> Option<&str> {
        self.stopped.as_ref().and_then(Stopped::reason)
    }

    /// How many partitions replaced this document's layout, when a change of the partition count retired it.
    pub fn retired_into(&self) -> Option<u32> {
        match self.stopped {
            Some(Stopped::Retired { into, .. }) => Some(into),
            _ => None,
        }
    }

    /// Ticks answer empty batches until [`StateDoc::resume`]. A halt stays, and prevails. Who: an operator.
    pub fn pause(&mut self) {
        self.stopped = Some(match self.stopped.take() {
            None | Some(Stopped::Paused) => Stopped::Paused,
            Some(Stopped::Halted { reason, .. }) => Stopped::Halted { reason, paused: true },
            Some(Stopped::Retired { into, reason, .. }) => Stopped::Retired { into, reason, paused: true },
        });
    }

    /// Clears a pause and a poison halt; the batch in flight loses its known failures (a halted batch is
    /// delivered once more). Who: an operator (who refuses to resume a retired document before calling it).
    pub fn resume(&mut self) {
        self.stopped = None;
        if let Some(f) = self.in_flight.as_mut() {
            f.failures = 0;
            f.failing_since = None;
            f.last_error = None;
        }
    }

    /// Stops the function at a poison batch (`Sql_Trigger_PoisonAction=halt`), keeping an operator's pause.
    /// Who: a tick meeting a poison batch.
    pub fn halt(&mut self, reason: String) {
        // Read back as the stored field would be (see `retire`).
        self.stopped = Stopped::from_fields(self.paused(), Some(reason));
    }

    /// Stops this document for good: its partition layout was replaced by one of `into` partitions, and its
    /// checkpoint lives on in that layout's documents. A deployment of the old layout that comes back stops here
    /// instead of delivering from a stale checkpoint. The halt reason reads "re-partitioned into {into}
    /// partitions {detail}". Who: an operator's change of the partition count.
    pub fn retire(&mut self, into: u32, detail: &str) {
        let reason = format!("{RETIRED}{into} partitions {detail}");
        // Read back as the stored field would be, so a document in memory and its stored form always agree.
        self.stopped = Stopped::from_fields(self.paused(), Some(reason));
    }

    /// Clears a halt or a retirement, keeping an operator's pause. Who: an operator's reset.
    pub(super) fn clear_halt(&mut self) {
        self.stopped = self.paused().then_some(Stopped::Paused);
    }
}
