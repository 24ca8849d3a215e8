//! The deferred tick: answer the host, and acknowledge only by proof (see `decide` for the rule and
//! docs/architecture.md for the argument). One tick:
//! 1. The span in flight must be the one this process remembers; otherwise nobody can prove any of it, and it
//!    is all delivered again from the checkpoint.
//! 2. The checkpoint moves over the batches proven written.
//! 3. An owed batch (a retry named it, or it was answered on a final attempt) is quarantined if it is poison,
//!    else answered again; otherwise an operator's retry of a quarantined batch is answered; otherwise the next
//!    batch is fetched after the span.
//! 4. One conditional write records all of it (nothing to record, no write). Only then does this process
//!    remember what it answered, so a tick that fails or loses the race leaves its memory as it was.

use super::decide::Poison;
use super::decide::{self, Answered, Sent};
use super::document::StateDoc;
use super::tick::ADVANCE_EVERY;
use super::{failpoint, Memory, OutcomeKind, TickError, TickOutcome, Trigger};
use crate::change::Change;
use crate::config::PoisonAction;
use crate::protocol::Attempt;
use crate::source::Position;
use crate::state::Etag;
use std::sync::Arc;
use time::OffsetDateTime;

/// What a tick answers: the batch, its changes, and whether it was answered before.
struct Reply {
    batch_id: u64,
    changes: Vec<Change>,
    kind: OutcomeKind,
    why: Option<String>,
}

impl Trigger {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn deferred_tick(
        &self,
        memory: &mut Memory,
        mut doc: StateDoc,
        etag: Option<Etag>,
        attempt: &Attempt,
        now: OffsetDateTime,
        mut dirty: bool,
        mut out: TickOutcome,
    ) -> Result<TickOutcome, TickError> {
        let settings = &self.config.settings;
        // Worked on as a copy, kept only if the tick's write goes through (each batch is shared, so the copy is
        // cheap, see `Answered`).
        let mut answered = memory.answered.clone();

        // 1. Batches in flight this process does not remember were answered elsewhere (another instance, or
        //    this one before a restart): nobody can prove them, so the whole span is owed, delivered again in
        //    pages of at most MaxBatchSize.
        if !decide::remembers(&answered, &doc, &self.owner) {
            answered.span.clear();
            if let Some(flight) = doc.in_flight.take() {
                if flight.owner != self.owner {
                    doc.counters.takeovers += 1;
                }
                match &flight.quarantined {
                    // A retry of a quarantined batch that sink mode recorded: back on the operator's list.
                    Some(key) => {
                        if let Some(id) = quarantined_batch_id(key).filter(|id| !doc.retry_quarantined.contains(id)) {
                            doc.retry_quarantined.insert(0, id);
                        }
                    }
                    None => answered.span.push_back(Arc::new(decide::adopt(&flight))),
                }
                tracing::info!(function = %self.config.name, batches = flight.batches, rows = flight.rows, owner = %flight.owner,
                    "batches in flight answered by another process (or before a restart) cannot be proven written: delivering them again");
                dirty = true;
            }
        }
        answered.retries.retain(|r| doc.retry_quarantined.contains(&r.batch_id));
        // An operator's resume clears the failures of the first batch in flight (a halted batch is delivered
        // once more): the document's count is the one to go by when it is lower.
        if let (Some(flight), Some(first)) = (&doc.in_flight, answered.span.front_mut()) {
            if flight.failures < first.failures_recorded {
                let first = Arc::make_mut(first);
                first.failures = flight.failures;
                first.failures_recorded = flight.failures;
                first.failing_since = flight.failing_since;
            }
        }

        // 2. and 3. Quarantine what is poison, then move the checkpoint over what is proven.
        let poison_after = duration(settings.poison_after);
        while let Some(sent) = answered.poisoned(settings.max_attempts, poison_after, now) {
            let poison = Poison {
                batch_id: sent.batch_id,
                from: sent.from.clone(),
                to: sent.to.clone(),
                failures: sent.failures,
                failing_since: sent.failing_since,
                quarantined: sent.quarantined.clone(),
            };
            if settings.poison_action == PoisonAction::Halt {
                doc.in_flight = decide::span_of(&answered, &self.owner);
                memory.answered = answered;
                return self.halt(memory, doc, etag, &poison, &mut out).await;
            }
            sent.settled = true;
            let snapshot = sent.clone();
            let changes = match &poison.quarantined {
                Some(_) => Vec::new(),
                None => self.changes_of_sent(&snapshot).await?,
            };
            self.quarantine(&mut doc, &poison, changes, now, &mut out).await?;
            dirty = true;
        }
        let (proven, proven_retries) = answered.take_proven(now, duration(self.config.proof_window));
        // (Proven late batches lie before the checkpoint and were counted when first proven.)
        dirty |= decide::apply_proven(&mut doc, &proven, &proven_retries, now);

        // 3. What to answer: an owed batch first, then an operator's retry, then new changes.
        let reply = match self.owed_reply(&mut doc, &mut answered, attempt, now).await? {
            Some(reply) => Some(reply),
            None => self.next_reply(&mut doc, &mut answered, attempt, now, &mut dirty).await?,
        };

        // 4. The document records the span under this process's lease, renewed while anything is unproven.
        let span = decide::span_of(&answered, &self.owner);
        if doc.in_flight != span {
            doc.in_flight = span;
            dirty = true;
        }
        let lease = settings.lease_duration;
        if !answered.is_empty() && (reply.is_some() || decide::lease_needs_renewal(&doc, &self.owner, lease, now)) {
            decide::take_lease(&mut doc, &self.owner, lease, now);
            dirty = true;
        }
        if dirty && !self.commit(memory, &mut doc, etag.as_ref(), &mut out).await? {
            return Ok(out);
        }
        if let (Some(first), Some(flight)) = (answered.span.front_mut(), &doc.in_flight) {
            if first.failures_recorded != flight.failures {
                Arc::make_mut(first).failures_recorded = flight.failures;
            }
        }
        memory.answered = answered;
        let Some(Reply { batch_id, changes, kind, why }) = reply else { return Ok(out) };
        failpoint::hit("after-commit");
        out.fence = doc.lease.as_ref().map_or(0, |l| l.token);
        out.kind = kind;
        out.batch_id = Some(batch_id);
        out.logs.push(match (kind, why) {
            (OutcomeKind::Redelivered, Some(why)) => {
                format!("re-delivering batch {batch_id} with {} change(s) because {why}", changes.len())
            }
            (_, Some(why)) => format!("delivering batch {batch_id} with {} change(s) because {why}", changes.len()),
            (_, None) => format!("delivering batch {batch_id} with {} change(s)", changes.len()),
        });
        out.changes = changes;
        Ok(out)
    }

    /// The first owed batch, answered again: one page at a time, since an adopted span (or a batch answered
    /// under a larger MaxBatchSize) can hold more than one answer may carry.
    async fn owed_reply(
        &self,
        doc: &mut StateDoc,
        answered: &mut Answered,
        attempt: &Attempt,
        now: OffsetDateTime,
    ) -> Result<Option<Reply>, TickError> {
        let limit = self.config.settings.max_batch_size;
        let mut page = None;
        if let Some(index) = answered.owed_in_span() {
            let sent = &answered.span[index];
            if sent.quarantined.is_none() {
                let fetched = self.source.refetch(&sent.from, &sent.to, limit).await?;
                let full = fetched.changes.len() >= limit;
                if let Some(last) = fetched.last.clone().filter(|l| full && *l != sent.to) {
                    let sent = Arc::make_mut(&mut answered.span[index]);
                    let rows = sent.rows.saturating_sub(fetched.changes.len() as u64);
                    let rest =
                        Sent::owed_range(doc.next_batch_id, last.clone(), sent.to.clone(), rows, now, now, 0, 0, None);
                    doc.next_batch_id += 1;
                    sent.to = last;
                    sent.rows = fetched.changes.len() as u64;
                    answered.span.insert(index + 1, Arc::new(rest));
                }
                page = Some(fetched.changes);
            }
        }
        let Some(sent) = answered.owed() else { return Ok(None) };
        let changes = match page {
            Some(changes) => changes,
            None => self.changes_of_sent(sent).await?,
        };
        if sent.answered_on_final() && sent.failures > 0 {
            // Its earlier answers failed, and the last one, on the host's final attempt, is assumed to.
            sent.failures += 1;
        }
        let why = if let Some(owner) = sent.answered_by.as_ref().filter(|_| sent.invocations.is_empty()) {
            format!("it was answered by {owner} and its outcome is unknown")
        } else if sent.failures > 0 {
            format!("its write failed ({} known failure(s))", sent.failures)
        } else {
            "nobody would report a failure of its last answer".to_string()
        };
        sent.answered(attempt, now);
        doc.counters.redelivered += 1;
        Ok(Some(Reply { batch_id: sent.batch_id, changes, kind: OutcomeKind::Redelivered, why: Some(why) }))
    }

    /// Nothing owed: an operator's retry of a quarantined batch, else the next batch after the span.
    async fn next_reply(
        &self,
        doc: &mut StateDoc,
        answered: &mut Answered,
        attempt: &Attempt,
        now: OffsetDateTime,
        dirty: &mut bool,
    ) -> Result<Option<Reply>, TickError> {
        let retry =
            doc.retry_quarantined.iter().copied().find(|id| !answered.retries.iter().any(|r| r.batch_id == *id));
        if let Some(batch_id) = retry {
            let key = self.ledger.quarantine_key(batch_id);
            let q = self.ledger.load_quarantine(&key).await?;
            let changes = q.decode_changes().map_err(|detail| TickError::CorruptState { key: key.clone(), detail })?;
            let mut sent = Sent::new(batch_id, q.from, q.to, changes.len() as u64, attempt, now);
            sent.quarantined = Some(key);
            answered.retries.push(Arc::new(sent));
            let why = Some("an operator asked to retry this quarantined batch".to_string());
            return Ok(Some(Reply { batch_id, changes, kind: OutcomeKind::Delivered, why }));
        }
        let from = answered.frontier(&doc.checkpoint).clone();
        let mut fetched = self.source.fetch(&from, self.config.settings.max_batch_size).await?;
        if fetched.changes.is_empty() {
            if let Some(advance) = fetched.advance.take().filter(|_| answered.is_empty()) {
                *dirty |= decide::advance_quiet_checkpoint(doc, advance, now, ADVANCE_EVERY);
            }
            return Ok(None);
        }
        failpoint::hit("after-fetch");
        let batch_id = doc.next_batch_id;
        doc.next_batch_id += 1;
        let to = fetched.last.clone().unwrap_or(Position::Null);
        let rows = fetched.changes.len() as u64;
        answered.span.push_back(Arc::new(Sent::new(batch_id, from, to, rows, attempt, now)));
        Ok(Some(Reply { batch_id, changes: fetched.changes, kind: OutcomeKind::Delivered, why: None }))
    }

    /// The changes of a batch answered before, as they are now (or as quarantined).
    async fn changes_of_sent(&self, sent: &Sent) -> Result<Vec<Change>, TickError> {
        if let Some(key) = &sent.quarantined {
            return self.quarantined_changes(key).await;
        }
        let limit = (sent.rows as usize).max(self.config.settings.max_batch_size);
        Ok(self.source.refetch(&sent.from, &sent.to, limit).await?.changes)
    }
}

/// The batch id in a quarantine document's key (`.../quarantine/{id:020}.json`).
fn quarantined_batch_id(key: &str) -> Option<u64> {
    key.rsplit('/').next()?.strip_suffix(".json")?.parse().ok()
}

/// A std duration as a time duration (saturating; settings are bounded far below the limit).
fn duration(d: std::time::Duration) -> time::Duration {
    time::Duration::try_from(d).unwrap_or(time::Duration::MAX)
}
