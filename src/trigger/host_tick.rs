//! The deferred tick: answer the host, and acknowledge only by proof (see `proof` for the rule and
//! docs/architecture.md for the argument). One tick:
//! 1. The span in flight must be the one this process remembers; otherwise nobody can prove any of it, and it
//!    is all delivered again from the checkpoint.
//! 2. The checkpoint moves over the batches proven written.
//! 3. An owed batch (a retry named it, or it was answered on a final attempt) is quarantined if it is poison,
//!    else answered again; otherwise an operator's retry of a quarantined batch is answered; otherwise the next
//!    batch is fetched after the span.
//! 4. One conditional write records all of it (nothing to record, no write). Only then does this process
//!    remember what it answered, so a tick that fails or loses the race leaves its memory as it was.

use super::proof::{Answered, Sent};
use super::state::{InFlight, QuarantineDoc, QuarantineEntry, StateDoc, QUARANTINE_KEPT};
use super::{failpoint, OutcomeKind, TickError, TickOutcome, Trigger, ADVANCE_EVERY};
use crate::change::{encode_batch, Change};
use crate::config::PoisonAction;
use crate::protocol::Attempt;
use crate::source::Position;
use crate::state::{Etag, StoreError};
use std::sync::Arc;
use time::OffsetDateTime;

/// What a tick answers: the batch, its changes, and whether it was answered before.
struct Answer {
    batch_id: u64,
    changes: Vec<Change>,
    kind: OutcomeKind,
    why: Option<String>,
}

impl Trigger {
    pub(super) async fn deferred_tick(
        &self,
        mut doc: StateDoc,
        etag: Option<Etag>,
        attempt: &Attempt,
        now: OffsetDateTime,
        mut dirty: bool,
        mut out: TickOutcome,
    ) -> Result<TickOutcome, TickError> {
        let settings = &self.config.settings;
        let window = duration(self.config.proof_window);
        let mut memory = self.answered.lock().expect("answered lock").clone();

        // 1. Batches in flight this process does not remember were answered elsewhere (another instance, or
        //    this one before a restart): nobody can prove them, so the whole span is owed, delivered again in
        //    pages of at most MaxBatchSize.
        if !self.remembers(&memory, &doc) {
            memory.span.clear();
            if let Some(flight) = doc.in_flight.take() {
                if flight.owner != self.owner {
                    doc.counters.takeovers += 1;
                }
                match &flight.quarantined {
                    // A retry of a quarantined batch that sink mode recorded: back on the operator's list.
                    Some(key) => {
                        if let Some(batch_id) =
                            quarantined_batch_id(key).filter(|id| !doc.retry_quarantined.contains(id))
                        {
                            doc.retry_quarantined.insert(0, batch_id);
                        }
                    }
                    None => {
                        let mut adopted = Sent::owed_range(
                            flight.batch_id,
                            flight.from.clone(),
                            flight.to.clone(),
                            flight.rows,
                            flight.first_delivered_at,
                            flight.last_delivered_at,
                            flight.deliveries,
                            flight.failures,
                            flight.failing_since,
                        );
                        adopted.answered_by = Some(flight.owner.clone());
                        memory.span.push_back(Arc::new(adopted));
                    }
                }
                tracing::info!(function = %self.config.name, batches = flight.batches, rows = flight.rows, owner = %flight.owner,
                    "batches in flight answered by another process (or before a restart) cannot be proven written: delivering them again");
                dirty = true;
            }
        }
        memory.retries.retain(|r| doc.retry_quarantined.contains(&r.batch_id));
        // An operator's resume clears the failures of the first batch in flight (a halted batch is delivered
        // once more): the document's count is the one to go by when it is lower.
        if let (Some(flight), Some(first)) = (&doc.in_flight, memory.span.front_mut()) {
            if flight.failures < first.failures_recorded {
                let first = Arc::make_mut(first);
                first.failures = flight.failures;
                first.failures_recorded = flight.failures;
                first.failing_since = flight.failing_since;
            }
        }

        // 2. and 3. Quarantine what is poison, then move the checkpoint over what is proven.
        while let Some(sent) = memory.poisoned(settings.max_attempts, duration(settings.poison_after), now) {
            let sent = sent.clone();
            if settings.poison_action == PoisonAction::Halt {
                let reason = format!(
                    "batch {} failed {} time(s) over {} s (Sql_Trigger_MaxAttempts, Sql_Trigger_PoisonAfterMs); halted at it (Sql_Trigger_PoisonAction=halt)",
                    sent.batch_id,
                    sent.failures,
                    sent.failing_since.map_or(0, |t| (now - t).whole_seconds())
                );
                tracing::error!(function = %self.config.name, batch_id = sent.batch_id, "{reason}");
                doc.halted = Some(reason.clone());
                doc.in_flight = self.span(&memory);
                // Recorded so every instance stops; a conflict means someone else decided first.
                if !self.commit(&mut doc, etag.as_ref(), &mut out).await? {
                    return Ok(out);
                }
                *self.answered.lock().expect("answered lock") = memory;
                return Err(TickError::Halted { function: self.config.name.clone(), reason });
            }
            self.quarantine_sent(&mut doc, &sent, now, &mut out).await?;
            if let Some(s) = memory.poisoned(settings.max_attempts, duration(settings.poison_after), now) {
                s.settled = true;
            }
            dirty = true;
        }
        let (proven, proven_retries) = memory.take_proven(now, window);
        // (Proven late batches lie before the checkpoint and were counted when first proven.)
        for sent in proven {
            doc.checkpoint = sent.to.clone();
            doc.progress_at = Some(now);
            if !sent.settled {
                doc.counters.delivered += sent.rows;
                doc.counters.batches += 1;
            }
            dirty = true;
        }
        for sent in proven_retries {
            doc.retry_quarantined.retain(|id| *id != sent.batch_id);
            if !sent.settled {
                doc.counters.delivered += sent.rows;
                doc.counters.batches += 1;
            }
            dirty = true;
        }

        // 3. What to answer: an owed batch first, then an operator's retry, then new changes.
        // The first owed batch of the span, one page at a time: an adopted span (or a batch answered under a
        // larger MaxBatchSize) can hold more than one answer may carry.
        let mut page = None;
        if let Some(index) = memory.owed_in_span() {
            let sent = &memory.span[index];
            if sent.quarantined.is_none() {
                let fetched = self.source.refetch(&sent.from, &sent.to, settings.max_batch_size).await?;
                let page = page.insert(fetched);
                let full = page.changes.len() >= settings.max_batch_size;
                if let Some(last) = page.last.clone().filter(|l| full && *l != sent.to) {
                    let sent = Arc::make_mut(&mut memory.span[index]);
                    let rest = Sent::owed_range(
                        doc.next_batch_id,
                        last.clone(),
                        sent.to.clone(),
                        sent.rows.saturating_sub(page.changes.len() as u64),
                        now,
                        now,
                        0,
                        0,
                        None,
                    );
                    doc.next_batch_id += 1;
                    sent.to = last;
                    sent.rows = page.changes.len() as u64;
                    memory.span.insert(index + 1, Arc::new(rest));
                }
            }
        }
        let page = page.map(|p| p.changes);
        let answer = match memory.owed() {
            Some(sent) => {
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
                Some(Answer { batch_id: sent.batch_id, changes, kind: OutcomeKind::Redelivered, why: Some(why) })
            }
            None => {
                match doc.retry_quarantined.iter().copied().find(|id| !memory.retries.iter().any(|r| r.batch_id == *id))
                {
                    Some(batch_id) => {
                        let (key, q) = self.load_quarantined(batch_id).await?;
                        let changes = q
                            .decode_changes()
                            .map_err(|detail| TickError::CorruptState { key: key.clone(), detail })?;
                        let mut sent = Sent::new(batch_id, q.from, q.to, changes.len() as u64, attempt, now);
                        sent.quarantined = Some(key);
                        memory.retries.push(Arc::new(sent));
                        let why = Some("an operator asked to retry this quarantined batch".to_string());
                        Some(Answer { batch_id, changes, kind: OutcomeKind::Delivered, why })
                    }
                    None => {
                        let from = memory.frontier(&doc.checkpoint).clone();
                        let mut fetched = self.source.fetch(&from, settings.max_batch_size).await?;
                        if fetched.changes.is_empty() {
                            if let Some(advance) = fetched.advance.take() {
                                // Now and then, not every empty tick: an empty tick should cost one read.
                                let stale = doc.progress_at.is_none_or(|at| now - at >= ADVANCE_EVERY);
                                if stale && memory.is_empty() && doc.in_flight.is_none() && advance != doc.checkpoint {
                                    doc.checkpoint = advance;
                                    doc.progress_at = Some(now);
                                    dirty = true;
                                }
                            }
                            None
                        } else {
                            failpoint::hit("after-fetch");
                            let batch_id = doc.next_batch_id;
                            doc.next_batch_id += 1;
                            let to = fetched.last.clone().unwrap_or(Position::Null);
                            let rows = fetched.changes.len() as u64;
                            memory.span.push_back(Arc::new(Sent::new(batch_id, from, to, rows, attempt, now)));
                            Some(Answer { batch_id, changes: fetched.changes, kind: OutcomeKind::Delivered, why: None })
                        }
                    }
                }
            }
        };

        // 4. The document records the span under this process's lease, renewed while anything is unproven.
        let span = self.span(&memory);
        if doc.in_flight != span {
            doc.in_flight = span;
            dirty = true;
        }
        if !memory.is_empty() {
            let ours = doc.lease.as_ref().filter(|l| l.owner == self.owner);
            let half_left = ours.is_some_and(|l| l.expires_at - now >= duration(settings.lease_duration) / 2);
            if answer.is_some() || !half_left {
                self.take_lease(&mut doc, now);
                dirty = true;
            }
        }
        if dirty && !self.commit(&mut doc, etag.as_ref(), &mut out).await? {
            return Ok(out);
        }
        if let (Some(first), Some(flight)) = (memory.span.front_mut(), &doc.in_flight) {
            if first.failures_recorded != flight.failures {
                Arc::make_mut(first).failures_recorded = flight.failures;
            }
        }
        *self.answered.lock().expect("answered lock") = memory;
        let Some(Answer { batch_id, changes, kind, why }) = answer else { return Ok(out) };
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

    /// True when the span the document records in flight is exactly what this process remembers answering.
    fn remembers(&self, memory: &Answered, doc: &StateDoc) -> bool {
        match (&doc.in_flight, memory.span.front(), memory.span.back()) {
            (None, None, _) => true,
            (Some(f), Some(first), Some(last)) => {
                f.owner == self.owner
                    && f.quarantined.is_none()
                    && f.batch_id == last.batch_id
                    && f.from == first.from
                    && f.to == last.to
                    && doc.checkpoint == first.from
            }
            _ => false,
        }
    }

    /// The document's record of the span: one batch in flight from the checkpoint to the last batch answered.
    fn span(&self, memory: &Answered) -> Option<InFlight> {
        let (first, last) = (memory.span.front()?, memory.span.back()?);
        Some(InFlight {
            batch_id: last.batch_id,
            from: first.from.clone(),
            to: last.to.clone(),
            rows: memory.span.iter().map(|s| s.rows).sum(),
            deliveries: first.deliveries,
            failures: first.failures,
            owner: self.owner.clone(),
            final_attempt: memory.span.iter().any(|s| s.owed),
            first_delivered_at: first.first_answered_at,
            last_delivered_at: memory.span.iter().map(|s| s.answered_at).max().unwrap_or(last.answered_at),
            quarantined: None,
            batches: memory.span.len() as u32,
            failing_since: first.failing_since,
        })
    }

    /// The changes of a batch answered before, as they are now (or as quarantined).
    async fn changes_of_sent(&self, sent: &Sent) -> Result<Vec<Change>, TickError> {
        if let Some(key) = &sent.quarantined {
            let doc = self.load_quarantine_key(key).await?;
            return doc.decode_changes().map_err(|detail| TickError::CorruptState { key: key.clone(), detail });
        }
        let limit = (sent.rows as usize).max(self.config.settings.max_batch_size);
        Ok(self.source.refetch(&sent.from, &sent.to, limit).await?.changes)
    }

    /// Writes a poison batch to its quarantine document and lists it in the state; the span passes it when the
    /// batches before it are proven. A retry of a quarantined batch that failed again stays where it is.
    async fn quarantine_sent(
        &self,
        doc: &mut StateDoc,
        sent: &Sent,
        now: OffsetDateTime,
        out: &mut TickOutcome,
    ) -> Result<(), TickError> {
        let reason = format!(
            "batch {} failed {} time(s) over {} s (Sql_Trigger_MaxAttempts, Sql_Trigger_PoisonAfterMs)",
            sent.batch_id,
            sent.failures,
            sent.failing_since.map_or(0, |t| (now - t).whole_seconds())
        );
        if let Some(key) = &sent.quarantined {
            let line = format!("{reason}; it was a retry of quarantined {key} and stays quarantined");
            tracing::error!(function = %self.config.name, batch_id = sent.batch_id, key = %key, "{line}");
            out.logs.push(line);
            return Ok(());
        }
        let changes = self.changes_of_sent(sent).await?;
        let key = self.quarantine_key(sent.batch_id);
        let body = QuarantineDoc {
            function: self.config.name.clone(),
            batch_id: sent.batch_id,
            from: sent.from.clone(),
            to: sent.to.clone(),
            failures: sent.failures,
            reason: reason.clone(),
            at: now,
            changes: encode_batch(&changes),
        };
        let bytes = serde_json::to_vec(&body).expect("quarantine documents serialize");
        match self.store.save_if(&key, &bytes, None).await {
            // An earlier tick wrote it and then lost the race to commit: the document is already there.
            Ok(_) | Err(StoreError::Conflict) => {}
            Err(e) => return Err(e.into()),
        }
        doc.counters.quarantined += 1;
        doc.quarantine.push(QuarantineEntry {
            batch_id: sent.batch_id,
            key: key.clone(),
            rows: changes.len() as u64,
            from: sent.from.clone(),
            to: sent.to.clone(),
            at: now,
        });
        if doc.quarantine.len() > QUARANTINE_KEPT {
            let excess = doc.quarantine.len() - QUARANTINE_KEPT;
            doc.quarantine.drain(..excess);
        }
        let line = format!("{reason}; quarantined {} change(s) to {key} and moving on", changes.len());
        tracing::error!(function = %self.config.name, batch_id = sent.batch_id, key = %key, "{line}");
        out.logs.push(line);
        Ok(())
    }
}

/// The batch id in a quarantine document's key (`.../quarantine/{id:020}.json`).
fn quarantined_batch_id(key: &str) -> Option<u64> {
    key.rsplit('/').next()?.strip_suffix(".json")?.parse().ok()
}

/// A std duration as a time duration (saturating; settings are bounded far below the limit).
pub(super) fn duration(d: std::time::Duration) -> time::Duration {
    time::Duration::try_from(d).unwrap_or(time::Duration::MAX)
}
