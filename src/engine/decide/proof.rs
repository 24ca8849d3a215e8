//! Deferred delivery's memory and its decisions: which batches this process answered to the host, which of them
//! a retry says failed, and when one is proven written. Pure: every function takes `now`; nothing here does I/O.
//!
//! # The rule (docs/architecture.md, "Acknowledge by proof")
//! The host says an output write failed only by retrying, and each retry names the attempt that failed: its
//! `RetryContext.Exception.InstanceId` is the failed attempt's invocation id. So:
//! - A retry naming an attempt that carried batch B proves B's write failed: B is *owed* (answered again at
//!   the next opportunity, the retry itself first) and the failure is counted.
//! - Any other invocation (a timer firing, a manual run from the portal or the admin API, a retry naming an
//!   attempt that carried no batch, such as the handler's own error answer) proves nothing about B, and needs
//!   to: it is answered with the next batch while B stays remembered. If B's write failed, its retry will name
//!   it later, whenever it comes, and B is answered again then.
//! - An answer given on the host's final attempt can fail without anybody saying so: such a batch is owed at
//!   once. So is everything when a retry names no attempt at all (nothing says which failed).
//! - What a retry can still name lives only in this process. A host that restarts loses its pending retries
//!   and kills this process with it; the new process remembers nothing and starts again from the checkpoint.
//!   So the checkpoint (the durable record) moves past a batch only when no retry can still name it: one
//!   *proof window* after its last answer, with no retry naming it, and not owed. The window is the longest
//!   the host can take from an answer to the retry that reports its failure: functionTimeout (past it the
//!   host restarts, killing this process), plus the policy's longest delay between retries, plus slack.
//!
//! The batches answered and not yet proven form a *span* after the checkpoint: each starts where the one
//! before it ends. The state document records the span as one batch in flight, owned by this process under
//! its lease; another process cannot prove any of it and delivers it all again from the checkpoint.

use crate::protocol::{Attempt, RetryContext};
use crate::source::BatchRange;
use crate::source::Position;
use std::collections::VecDeque;
use std::sync::Arc;
use time::OffsetDateTime;

/// A batch this process answered to the host, not yet proven written.
#[derive(Debug, Clone, PartialEq)]
pub struct Sent {
    pub range: BatchRange,
    /// An operator's retry of a quarantined batch: its quarantine document's key. Its changes come from there,
    /// and it lies before the checkpoint, outside the span.
    pub quarantined: Option<String>,
    /// The invocations it was answered to, the latest last. A retry naming one says that answer's write failed.
    pub invocations: Vec<String>,
    pub first_answered_at: OffsetDateTime,
    pub answered_at: OffsetDateTime,
    pub deliveries: u32,
    /// Must be answered again before it can be proven: a retry named it, or nobody would say if it failed.
    pub owed: bool,
    /// The last answer was on the host's final attempt (or without a retry context): a failure would go
    /// unreported.
    pub final_answer: bool,
    /// Writes known to have failed (retries naming it, and an answer on a final attempt after earlier failures).
    pub failures: u32,
    pub failing_since: Option<OffsetDateTime>,
    /// The failures the state document holds for it (written by this process's last commit): fewer in the
    /// document means an operator cleared them (`handler state resume`).
    pub failures_recorded: u32,
    /// Quarantined (poison): proven as far as the span is concerned; its changes are in the quarantine document.
    pub settled: bool,
    /// Adopted from the state document: the process that answered it (another instance, or this one before
    /// a restart).
    pub answered_by: Option<String>,
}

/// How many invocation ids of one batch are kept; a batch answered more often than this is failing anyway.
const IDS_KEPT: usize = 16;

impl Sent {
    /// A batch first answered to `attempt` at `now`.
    pub fn new(range: BatchRange, attempt: &Attempt, now: OffsetDateTime) -> Self {
        let mut sent = Self::owed_range(range, now);
        sent.answered(attempt, now);
        sent
    }

    /// A range to deliver (again) that nobody has answered yet in this process, as of `now`: the span another
    /// process answered (adopted on a takeover or after a restart: `decide::adopt` carries its history over),
    /// or the rest of a range split into pages.
    pub fn owed_range(range: BatchRange, now: OffsetDateTime) -> Self {
        Self {
            range,
            quarantined: None,
            invocations: Vec::new(),
            first_answered_at: now,
            answered_at: now,
            deliveries: 0,
            owed: true,
            final_answer: false,
            failures: 0,
            failing_since: None,
            failures_recorded: 0,
            settled: false,
            answered_by: None,
        }
    }

    /// True when the last answer went out on an attempt whose failure nobody would report.
    pub fn answered_on_final(&self) -> bool {
        self.final_answer
    }

    /// Records an answer of this batch to `attempt` at `now`. An answer on a final attempt is owed at once.
    pub fn answered(&mut self, attempt: &Attempt, now: OffsetDateTime) {
        self.invocations.push(attempt.id.clone());
        if self.invocations.len() > IDS_KEPT {
            self.invocations.remove(0);
        }
        self.answered_at = now;
        self.deliveries += 1;
        self.final_answer = attempt.is_final();
        self.owed = self.final_answer;
    }

    /// Proven written: not owed, and answered at least one proof window ago without a retry naming it since.
    pub fn proven(&self, now: OffsetDateTime, window: time::Duration) -> bool {
        self.settled || (!self.owed && now - self.answered_at >= window)
    }

    /// Poison: at least `max_attempts` known failures, the first of them at least `after` ago.
    pub fn poisoned(&self, max_attempts: u32, after: time::Duration, now: OffsetDateTime) -> bool {
        self.failures >= max_attempts && self.failing_since.is_some_and(|since| now - since >= after)
    }

    fn failed(&mut self, now: OffsetDateTime) {
        self.owed = true;
        self.failures += 1;
        self.failing_since.get_or_insert(now);
    }
}

/// What a retry's naming meant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// Not a retry.
    Nothing,
    /// A retry naming an attempt that carried this batch: its write failed.
    Batch(u64),
    /// The same, for a batch proven by the window already: the host took longer than the window assumed.
    Late(u64),
    /// A retry naming an attempt that carried no batch of this process (its own error answer, an empty answer,
    /// or an attempt before this process started): no evidence about any batch.
    NoBatch,
    /// A retry that names no attempt: any of the batches remembered may have failed, so all are owed.
    Unnamed,
}

/// How many proven batches are kept for a retry that names one after its proof window (see `Answered::history`).
pub const HISTORY_KEPT: usize = 256;

/// The batches this process answered and has not yet proven written. A tick works on a copy and keeps it only
/// if its write went through; each batch is shared (`Arc`) so that copy costs a reference per batch, and only a
/// batch the tick changes is copied (`Arc::make_mut`): a backlog drained back to back can keep a thousand
/// batches unproven.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Answered {
    /// The span after the checkpoint, in order.
    pub span: VecDeque<Arc<Sent>>,
    /// Operators' retries of quarantined batches, answered and not yet proven.
    pub retries: Vec<Arc<Sent>>,
    /// A backfill's chunks, answered and not yet proven, in key order: proven in order, as the span is, so the
    /// backfill's position only moves forward. Not in the state document: a process that does not remember
    /// them (another instance, or this one after a restart) reads them again from the backfill's position.
    pub chunks: VecDeque<Arc<Sent>>,
    /// Batches proven by the window and then named by a retry after all (the host took longer than the window
    /// assumed): answered again, outside the span (they lie before the checkpoint).
    pub late: Vec<Arc<Sent>>,
    /// The latest batches proven, newest last: a retry that comes after a batch's proof window (a window set
    /// shorter than the host's real bound) still finds what to deliver again while this process lives.
    pub history: VecDeque<Arc<Sent>>,
}

impl Answered {
    /// Nothing answered is waiting for proof.
    pub fn is_empty(&self) -> bool {
        self.span.is_empty() && self.retries.is_empty() && self.late.is_empty() && self.chunks.is_empty()
    }

    fn all_mut(&mut self) -> impl Iterator<Item = &mut Arc<Sent>> {
        self.span.iter_mut().chain(self.retries.iter_mut()).chain(self.late.iter_mut()).chain(self.chunks.iter_mut())
    }

    /// Keeps `sent`, proven, for a late retry.
    pub fn remember_proven(&mut self, sent: Arc<Sent>) {
        self.history.push_back(sent);
        while self.history.len() > HISTORY_KEPT {
            self.history.pop_front();
        }
    }

    /// Takes in what `attempt` says about earlier answers (only a retry says anything).
    pub fn note(&mut self, attempt: &Attempt, now: OffsetDateTime) -> Named {
        let Some(RetryContext { failed_invocation, .. }) = attempt.retry.as_ref().filter(|r| r.is_retry()) else {
            return Named::Nothing;
        };
        let Some(failed) = failed_invocation else {
            for sent in self.all_mut() {
                Arc::make_mut(sent).owed = true;
            }
            return Named::Unnamed;
        };
        let names = |s: &Arc<Sent>| s.invocations.iter().any(|id| id == failed);
        if let Some(sent) = self.all_mut().find(|s| names(s)) {
            let sent = Arc::make_mut(sent);
            sent.failed(now);
            return Named::Batch(sent.range.batch_id);
        }
        match self.history.iter().position(names).and_then(|i| self.history.remove(i)) {
            Some(mut sent) => {
                let late = Arc::make_mut(&mut sent);
                late.settled = false;
                late.failed(now);
                let batch_id = late.range.batch_id;
                self.late.push(sent);
                Named::Late(batch_id)
            }
            None => Named::NoBatch,
        }
    }

    /// Removes and returns the batches proven written: the proven prefix of the span (the checkpoint can move
    /// only in order) and every proven quarantine retry. Proven late batches go back to the history.
    pub fn take_proven(&mut self, now: OffsetDateTime, window: time::Duration) -> (Vec<Arc<Sent>>, Vec<Arc<Sent>>) {
        let mut span = Vec::new();
        while self.span.front().is_some_and(|s| s.proven(now, window)) {
            span.extend(self.span.pop_front());
        }
        // Proven chunks go with the span: acknowledging them moves the backfill's position (`BatchRange::backfill`).
        while self.chunks.front().is_some_and(|s| s.proven(now, window)) {
            span.extend(self.chunks.pop_front());
        }
        let (proven, pending): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.retries).into_iter().partition(|s| s.proven(now, window));
        self.retries = pending;
        let (late, pending): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.late).into_iter().partition(|s| s.proven(now, window));
        self.late = pending;
        for sent in late.into_iter().chain(span.iter().cloned()) {
            self.remember_proven(sent);
        }
        (span, proven)
    }

    /// Whether a batch must be answered again.
    pub fn has_owed(&self) -> bool {
        self.span.iter().chain(&self.retries).chain(&self.late).chain(&self.chunks).any(|s| s.owed && !s.settled)
    }

    /// The first batch that must be answered again.
    pub fn owed(&mut self) -> Option<&mut Sent> {
        self.all_mut().find(|s| s.owed && !s.settled).map(Arc::make_mut)
    }

    /// Where the first owed batch is: in the span at this index, or outside it.
    pub fn owed_in_span(&self) -> Option<usize> {
        self.span.iter().position(|s| s.owed && !s.settled)
    }

    /// The first owed batch that is poison.
    pub fn poisoned(&mut self, max_attempts: u32, after: time::Duration, now: OffsetDateTime) -> Option<&mut Sent> {
        self.all_mut().find(|s| s.owed && !s.settled && s.poisoned(max_attempts, after, now)).map(Arc::make_mut)
    }

    /// Where the next new batch starts: after the span, or at the checkpoint.
    pub fn frontier<'a>(&'a self, checkpoint: &'a Position) -> &'a Position {
        self.span.back().map_or(checkpoint, |s| &s.range.to)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use time::Duration;

    const WINDOW: Duration = Duration::minutes(6);
    const T0: OffsetDateTime = time::macros::datetime!(2026-11-25 10:00 UTC);

    fn attempt(id: &str, count: i64, failed: Option<&str>) -> Attempt {
        let retry = match failed {
            Some(f) => RetryContext::after(count, 5, f),
            None => RetryContext::first(5),
        };
        Attempt::new(id, Some(retry))
    }

    fn sent(batch_id: u64, from: i64, to: i64, id: &str) -> Arc<Sent> {
        Arc::new(Sent::new(
            BatchRange::new(batch_id, json!(from), json!(to), (to - from) as u64),
            &attempt(id, 0, None),
            T0,
        ))
    }

    #[test]
    fn a_retry_naming_an_answer_makes_that_batch_owed_and_counts_one_failure() {
        // GIVEN two batches answered to two invocations (a manual run came between)
        let mut mem = Answered { span: [sent(1, 0, 10, "a"), sent(2, 10, 20, "m")].into(), ..Answered::default() };
        // WHEN the timer's retry names the first
        let named = mem.note(&attempt("r1", 1, Some("a")), T0 + Duration::seconds(5));
        // THEN only that batch is owed, with one failure
        assert_eq!(named, Named::Batch(1));
        let owed: Vec<_> = mem.span.iter().map(|s| (s.range.batch_id, s.owed, s.failures)).collect();
        assert_eq!(owed, vec![(1, true, 1), (2, false, 0)]);
        assert_eq!(mem.owed().map(|s| s.range.batch_id), Some(1));
    }

    #[test]
    fn a_retry_naming_an_attempt_without_a_batch_is_no_evidence() {
        let mut mem = Answered { span: [sent(1, 0, 10, "a")].into(), ..Answered::default() };
        assert_eq!(mem.note(&attempt("r", 1, Some("error-answer")), T0), Named::NoBatch);
        assert!(mem.owed().is_none() && mem.span[0].failures == 0);
        assert_eq!(mem.note(&attempt("b", 0, None), T0), Named::Nothing);
    }

    #[test]
    fn a_retry_that_names_nothing_owes_everything_without_counting_a_failure() {
        let mut mem = Answered { span: [sent(1, 0, 10, "a"), sent(2, 10, 20, "b")].into(), ..Answered::default() };
        let unnamed =
            Attempt::new("r", Some(RetryContext { failed_invocation: None, ..RetryContext::after(1, 5, "") }));
        assert_eq!(mem.note(&unnamed, T0), Named::Unnamed);
        assert!(mem.span.iter().all(|s| s.owed && s.failures == 0));
    }

    #[test]
    fn the_checkpoint_moves_only_over_a_prefix_proven_by_the_window() {
        let mut mem = Answered { span: [sent(1, 0, 10, "a"), sent(2, 10, 20, "b")].into(), ..Answered::default() };
        Arc::make_mut(&mut mem.span[1]).answered_at = T0 + Duration::minutes(1);
        // Before the window nothing is proven
        assert_eq!(mem.take_proven(T0 + WINDOW - Duration::SECOND, WINDOW).0.len(), 0);
        // An owed head blocks what follows, however old
        Arc::make_mut(&mut mem.span[0]).owed = true;
        assert_eq!(mem.take_proven(T0 + WINDOW * 3, WINDOW).0.len(), 0);
        Arc::make_mut(&mut mem.span[0]).owed = false;
        // At the window the first is proven, the second a minute later
        let (proven, _) = mem.take_proven(T0 + WINDOW, WINDOW);
        assert_eq!(proven.iter().map(|s| s.range.batch_id).collect::<Vec<_>>(), vec![1]);
        assert_eq!(mem.frontier(&json!(0)), &json!(20));
        assert_eq!(mem.take_proven(T0 + WINDOW + Duration::minutes(1), WINDOW).0.len(), 1);
        assert_eq!(mem.frontier(&json!(20)), &json!(20));
    }

    #[test]
    fn a_retry_after_the_window_still_finds_the_batch_it_names() {
        // GIVEN a batch proven by a window shorter than the host's real delay
        let mut mem = Answered { span: [sent(1, 0, 10, "a"), sent(2, 10, 20, "b")].into(), ..Answered::default() };
        let (proven, _) = mem.take_proven(T0 + WINDOW, WINDOW);
        assert_eq!(proven.len(), 2);
        // WHEN a retry names its answer after all
        assert_eq!(mem.note(&attempt("r", 1, Some("a")), T0 + WINDOW * 2), Named::Late(1));
        // THEN it is owed again, outside the span, until a window after its new answer
        assert_eq!(mem.owed().map(|s| (s.range.batch_id, s.failures)), Some((1, 1)));
        let retry = attempt("r", 1, Some("a"));
        mem.owed().expect("owed").answered(&retry, T0 + WINDOW * 2);
        assert!(mem.span.is_empty() && !mem.is_empty());
        mem.take_proven(T0 + WINDOW * 3, WINDOW);
        assert!(mem.is_empty() && mem.history.iter().any(|s| s.range.batch_id == 1));
    }

    #[test]
    fn an_answer_on_the_final_attempt_is_owed_at_once() {
        let mut s = Arc::unwrap_or_clone(sent(1, 0, 10, "a"));
        s.answered(&attempt("f", 5, Some("a")), T0);
        assert!(s.owed);
        s.answered(&Attempt::new("blank", None), T0);
        assert!(s.owed, "without a retry context (no policy, a blank body) nobody reports a failure either");
        assert!(!s.proven(T0 + WINDOW * 10, WINDOW));
    }

    #[test]
    fn poison_needs_both_the_failures_and_the_time() {
        let mut s = Arc::unwrap_or_clone(sent(1, 0, 10, "a"));
        let after = Duration::minutes(10);
        for n in 0..5 {
            s.failed(T0 + Duration::seconds(5 * n));
        }
        assert!(!s.poisoned(5, after, T0 + Duration::seconds(25)), "a 25 s outage is no poison");
        assert!(s.poisoned(5, after, T0 + after));
        assert!(!s.poisoned(6, after, T0 + after));
    }
}
