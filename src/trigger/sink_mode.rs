//! Sink delivery mode: the handler delivers each batch itself, and the checkpoint moves only after the sink
//! took it. The guarantee no longer depends on the host's output bindings: at-least-once with any sink,
//! exactly-once with a SQL sink that records what it applied in the rows' transaction.
//!
//! # One tick, and why in this order
//! 1. **Record** (the shared tick path): resolve a batch left in flight, fetch, and record the batch in flight
//!    under this instance's lease with one conditional write. Recording before delivering is what lets a
//!    crash anywhere later be repaired: the next owner finds the batch in flight and delivers the same range
//!    again. A batch found in flight is never acknowledged from memory here: only a sink's `Ok` in the tick
//!    that delivered it proves delivery.
//! 2. **Deliver** the batch with its id, its range and the lease token as fencing token. A heartbeat task
//!    renews the lease meanwhile (four times per lease, as the official trigger renews its 60 s lease every
//!    15 s), so a long delivery is not taken over. The task belongs to a guard: it ends with the tick, also
//!    when the tick is abandoned (timeout), so no lease outlives the work it covers.
//! 3. **Acknowledge** with a second conditional write (checkpoint := batch end). A crash between 2 and 3
//!    (failpoint `after-sink`) re-delivers the batch: the upsert absorbs it, an exactly-once sink skips it.
//!
//! Sink failures: `Rejected` is a known failure, counted toward `Sql_Trigger_MaxAttempts` (then quarantine
//! or halt); `Transient` is not counted (a destination outage must not quarantine batches); `Fenced` means a
//! newer owner already wrote, which is treated like a lost compare-and-swap: nothing acknowledged or counted,
//! unless the state document shows that no owner of it wrote the destination's token (see
//! [`Trigger::raise_fence`]): then the token is raised past it and the next tick delivers the batch again.
//!
//! A delivering tick costs two conditional writes (record, acknowledge), plus a read when this process did not
//! write the state last (see `Trigger::tick_inner`) and one write per heartbeat; while a backlog drains, one
//! write (see "Chaining").
//!
//! # Chaining
//! While a backlog drains, the acknowledgement of batch N also records batch N+1 (fetched ahead, see below)
//! in flight under the same lease: one conditional write instead of two. The next tick then delivers N+1
//! straight away, from the document this process wrote, without reading or writing the state first. This
//! is the same record step, made earlier: a crash leaves N+1 in flight for the next owner to re-deliver, as
//! a crash during any delivery does. It is used only while the lease has at least half its duration left
//! (else the tick goes the ordinary way and re-records the batch), not while an operator has queued
//! quarantined batches, and a clean stop of `handler run` withdraws an undelivered chained batch so the next
//! instance need not wait out the lease. An operator's pause or reset between the two ticks is seen one batch
//! later: the chained batch is delivered, its acknowledgement fails the compare-and-swap, and the next tick
//! acts on the operator's document (the batch is delivered again when the function resumes; the sink
//! absorbs the duplicate).
//!
//! # Resuming from the destination
//! The state document is the engine's memory; an exactly-once SQL sink's checkpoint row is the record of
//! what was applied, written in the rows' own transaction. They can disagree only when the document is
//! new: its blob was deleted or lost, and the tick started over from `startFrom`, which would re-apply
//! (`earliest`) or skip (`now`) batches the destination already has or never got. The fence has the same
//! blind spot: a new document's lease tokens start again at 1, below the token the destination holds, and
//! every write would be refused as fenced. So while the document has acknowledged nothing (no batch
//! delivered or quarantined under it, which is how a new document looks), a delivering tick first asks
//! the sink what it recorded ([`Sink::resume_position`]; one small query, and none once a batch is
//! acknowledged). If the sink's last applied batch ends elsewhere than where this batch starts (and is not
//! this very batch), the batch just recorded is dropped undelivered and the document is rewritten with one
//! conditional write: checkpoint at the end of the applied batch, batch ids after its id, the lease token
//! above any the destination saw (so a writer of the lost document's lineage is refused); the tick then
//! starts again from there. If only the destination's fencing token is larger than this instance's, the
//! same write raises the token and the batch is delivered as recorded. A conditional write that fails
//! means another instance moved first, and the tick delivers nothing. Consequence for operators: to
//! re-apply everything after deleting a function's state, delete its checkpoint row in the target too (a
//! `reset` or `replay` of a document that has acknowledged batches is not affected).
//!
//! # Fetching ahead
//! While a full batch is being delivered (a backlog is draining) the next batch is fetched at the same time,
//! on another connection, and kept for the next tick if that tick starts where this batch ends. A drain then
//! costs about the time of its writes instead of writes plus reads. This is the same as fetching earlier:
//! the late-commit guard means no change can later appear inside the range a fetch returned, and a row
//! changed since is delivered again later with its newer values, exactly as when a delivery is slow. A
//! fetch kept longer than one lease duration is dropped.

use super::state::{InFlight, Lease, StateDoc};
use super::{acknowledge, failpoint, stamp, OutcomeKind, TickError, TickOutcome, Trigger, Via};
use crate::clock::Clock;
use crate::sink::{Resume, Sink, SinkBatch, SinkError};
use crate::source::{Fetched, Position};
use crate::state::{Etag, StateStore, StoreError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Lease renewals per lease duration while a delivery runs.
pub const RENEWALS_PER_LEASE: u32 = 4;

impl Trigger {
    /// Runs one tick in sink mode: fetch, record the batch in flight (CAS), deliver it to `sink`, acknowledge
    /// it (CAS). See the module docs for the order and what each failure means.
    pub async fn tick_into(&self, sink: &dyn Sink) -> Result<TickOutcome, TickError> {
        let _one_at_a_time = self.lock.lock().await;
        self.timed(self.deliver_into(sink)).await
    }

    /// The batch fetched ahead, if it starts where the next batch starts and is fresh; taken either way.
    pub(super) fn take_ahead(&self, checkpoint: &Position) -> Option<Fetched> {
        let ahead = self.ahead.lock().expect("ahead lock").take()?;
        (ahead.after == *checkpoint && ahead.at.elapsed() < self.config.settings.lease_duration)
            .then_some(ahead.fetched)
    }

    /// The app name space of this function's state key (`{app}/{function}.json`; neither part holds a '/').
    fn app(&self) -> &str {
        self.key.rsplit_once('/').map_or("", |(app, _)| app)
    }

    async fn deliver_into(&self, sink: &dyn Sink) -> Result<TickOutcome, TickError> {
        if let Some(out) = self.take_chained() {
            return self.deliver_batch(sink, out).await;
        }
        let mut out = self.tick_inner(Via::Sink).await?;
        if let Some(logs) = self.reconcile(sink, &mut out).await? {
            // The document now starts where the destination ends: no second reconciliation.
            out = self.tick_inner(Via::Sink).await?;
            out.logs.splice(0..0, logs);
        }
        self.deliver_batch(sink, out).await
    }

    /// See "Resuming from the destination" in the module docs. Leaves `out` to be delivered as it is (its
    /// lease token raised, or replaced by a conflict when another instance moved first), or answers the lines
    /// that say where the document was moved, after which the tick starts again.
    async fn reconcile(&self, sink: &dyn Sink, out: &mut TickOutcome) -> Result<Option<Vec<String>>, TickError> {
        let Some((doc, _)) = out.committed.as_ref() else { return Ok(None) };
        let Some(flight) = doc.in_flight.as_ref() else { return Ok(None) };
        let acknowledged_nothing = doc.counters.batches == 0 && doc.counters.quarantined == 0;
        if out.batch_id.is_none() || !acknowledged_nothing || flight.quarantined.is_some() {
            return Ok(None);
        }
        let Some(Resume { fence, applied }) =
            sink.resume_position(self.app(), &self.config.name).await.map_err(TickError::Sink)?
        else {
            return Ok(None);
        };
        let this_batch =
            |a: &crate::sink::Applied| a.batch_id == flight.batch_id && a.from == flight.from && a.to == flight.to;
        let moved = applied.filter(|a| a.to != flight.from && !this_batch(a));
        if moved.is_none() && fence <= out.fence {
            return Ok(None);
        }

        let (mut doc, etag) = out.committed.take().expect("checked above");
        let now = self.clock.now();
        let ours = out.fence;
        let line = match &moved {
            // The document's lineage is new: its token goes above anything the destination saw, so a writer of
            // the earlier lineage that still holds a batch is refused.
            Some(applied) => {
                let flight = doc.in_flight.take().expect("checked above");
                doc.checkpoint = applied.to.clone();
                doc.next_batch_id = doc.next_batch_id.max(applied.batch_id + 1);
                doc.progress_at = Some(now);
                // Released at once: the next fetch takes it again and keeps the token (same owner).
                doc.lease = Some(Lease { owner: self.owner.clone(), token: ours.max(fence) + 1, expires_at: now });
                format!(
                    "the state document has acknowledged nothing, but {} records batch {} as applied up to {}: continuing after it, under fencing token {} (the {} change(s) fetched after {} are dropped undelivered)",
                    sink.describe(),
                    applied.batch_id,
                    applied.to,
                    ours.max(fence) + 1,
                    flight.rows,
                    flight.from
                )
            }
            // The batch recorded stays as it is (its id and range name it to an exactly-once sink): only the
            // token moves above the destination's.
            None => {
                if let Some(lease) = doc.lease.as_mut() {
                    lease.token = fence + 1;
                }
                format!(
                    "{} holds fencing token {fence}, above this state document's {ours}: a new state document restarted the tokens; batch {} goes under token {}",
                    sink.describe(),
                    out.batch_id.unwrap_or_default(),
                    fence + 1
                )
            }
        };
        tracing::warn!(function = %self.config.name, "{line}");
        let mut rewritten = TickOutcome::default();
        if !self.commit(&mut doc, Some(&etag), &mut rewritten).await? {
            *out = rewritten;
            return Ok(None);
        }
        if moved.is_some() {
            return Ok(Some(vec![line]));
        }
        out.fence = fence + 1;
        out.committed = rewritten.committed;
        out.logs.insert(0, line);
        Ok(None)
    }

    /// The batch the previous tick recorded in flight together with its acknowledgement, ready to deliver
    /// without touching the state store, if the document this process wrote last still records it under this
    /// process's lease with at least half the lease left (so the heartbeat starts well before it could lapse).
    /// Taken either way: a chained batch not used now goes the ordinary way (re-fetched, re-recorded).
    fn take_chained(&self) -> Option<TickOutcome> {
        let chained = self.chained.lock().expect("chained lock").take()?;
        let (doc, etag) = self.written.lock().expect("written lock").clone()?;
        let flight = doc.in_flight.as_ref().filter(|f| f.batch_id == chained.batch_id && f.owner == self.owner)?;
        let lease = doc.lease.as_ref().filter(|l| l.owner == self.owner)?;
        let left = lease.expires_at - self.clock.now();
        if left < self.config.settings.lease_duration / 2 || doc.paused || doc.halted.is_some() {
            return None;
        }
        let mut out = TickOutcome {
            kind: OutcomeKind::Delivered,
            batch_id: Some(flight.batch_id),
            fence: lease.token,
            ..TickOutcome::default()
        };
        out.logs.push(format!(
            "delivering batch {} with {} change(s), recorded in flight with the previous batch's acknowledgement",
            flight.batch_id,
            chained.changes.len()
        ));
        out.changes = chained.changes;
        out.committed = Some((doc, etag));
        Some(out)
    }

    /// On a clean stop: a batch recorded in flight with the last acknowledgement and never delivered is
    /// withdrawn (nothing in flight, the lease released), so the next instance starts at once instead of
    /// waiting out this one's lease. `Ok(false)`: there was none, or the state moved on (then nothing is
    /// written and the batch is delivered by whoever holds the state, as after a crash).
    pub async fn withdraw_chained(&self) -> Result<bool, TickError> {
        let _one_at_a_time = self.lock.lock().await;
        let Some(chained) = self.chained.lock().expect("chained lock").take() else { return Ok(false) };
        let Some((mut doc, etag)) = self.written.lock().expect("written lock").clone() else { return Ok(false) };
        if doc.in_flight.as_ref().is_none_or(|f| f.batch_id != chained.batch_id || f.owner != self.owner) {
            return Ok(false);
        }
        doc.in_flight = None;
        if let Some(lease) = doc.lease.as_mut().filter(|l| l.owner == self.owner) {
            lease.expires_at = self.clock.now();
        }
        let mut out = TickOutcome::default();
        self.commit(&mut doc, Some(&etag), &mut out).await
    }

    /// Delivers the batch `tick_inner` recorded in flight, if any, and acknowledges it.
    async fn deliver_batch(&self, sink: &dyn Sink, mut out: TickOutcome) -> Result<TickOutcome, TickError> {
        let (Some(batch_id), Some((doc, etag))) = (out.batch_id, out.committed.take()) else { return Ok(out) };
        let Some(flight) = doc.in_flight.clone() else { return Ok(out) };

        let heartbeat = Heartbeat::start(self, doc, etag);
        let batch = SinkBatch {
            app: self.app(),
            function: &self.config.name,
            batch_id,
            fence: out.fence,
            changes: &out.changes,
            range: Some((&flight.from, &flight.to)),
        };
        let limit = self.config.settings.max_batch_size;
        let draining = out.changes.len() >= limit && flight.quarantined.is_none();
        let (delivered, ahead) = tokio::join!(
            async {
                // A re-fetched range whose rows all moved on since holds nothing: there is nothing to hand
                // over, and acknowledging it is right (its rows come again later with their newer values).
                if batch.changes.is_empty() {
                    Ok(())
                } else {
                    sink.deliver(&batch).await
                }
            },
            async {
                match draining {
                    true => self.source.fetch(&flight.to, limit).await.ok().filter(|f| !f.changes.is_empty()),
                    false => None,
                }
            }
        );
        let Held { mut doc, etag, lost } = heartbeat.stop().await;

        match delivered {
            Ok(()) => {
                failpoint::hit("after-sink");
                let now = self.clock.now();
                acknowledge(&mut doc, &flight, now);
                // Draining: the batch fetched ahead is recorded in flight by this same write (see "Chaining"
                // in the module docs), unless an operator queued quarantined batches, which go first.
                let chainable = doc.retry_quarantined.is_empty() && !doc.paused && doc.halted.is_none();
                let (chain, keep) = if chainable { (ahead, None) } else { (None, ahead) };
                let next = chain.map(|fetched| {
                    let next = InFlight {
                        batch_id: doc.next_batch_id,
                        from: flight.to.clone(),
                        to: fetched.last.clone().unwrap_or(Position::Null),
                        rows: fetched.changes.len() as u64,
                        deliveries: 1,
                        failures: 0,
                        owner: self.owner.clone(),
                        final_attempt: false,
                        first_delivered_at: now,
                        last_delivered_at: now,
                        quarantined: None,
                        batches: 1,
                        failing_since: None,
                    };
                    doc.next_batch_id += 1;
                    doc.in_flight = Some(next.clone());
                    self.take_lease(&mut doc, now);
                    Chained { batch_id: next.batch_id, changes: fetched.changes }
                });
                let mut ack = TickOutcome::default();
                if self.commit(&mut doc, Some(&etag), &mut ack).await? {
                    *self.chained.lock().expect("chained lock") = next;
                    if let Some(fetched) = keep {
                        let after = flight.to.clone();
                        *self.ahead.lock().expect("ahead lock") = Some(Ahead { after, fetched, at: Instant::now() });
                    }
                    out.logs.push(format!(
                        "batch {batch_id} with {} change(s) delivered to {} and acknowledged",
                        out.changes.len(),
                        sink.describe()
                    ));
                } else {
                    let why = lost.map(|l| format!(" ({l})")).unwrap_or_default();
                    out.logs.push(format!(
                        "batch {batch_id} was delivered to {}, but the state changed before its acknowledgement{why}; it will be delivered again and the sink absorbs the duplicate",
                        sink.describe()
                    ));
                }
                Ok(out)
            }
            Err(SinkError::Fenced { ours, stored }) => {
                if lost.is_none() {
                    // The destination's token may come from an earlier document of this function (see
                    // "Resuming from the destination" for a new one; a document restored from a copy has
                    // acknowledged batches and is not reconciled): then the token is raised, and the next
                    // tick delivers the batch again under it, as a batch whose delivery is not proven.
                    if let Some(token) = self.raise_fence_on(doc, &etag, batch_id, ours, stored).await? {
                        out.kind = OutcomeKind::Conflict;
                        out.changes.clear();
                        out.logs.push(format!(
                            "batch {batch_id} not written: {} holds fencing token {stored}, above this state document's {ours}; no owner of this document wrote it, so the token was raised to {token} and the next tick delivers the batch again",
                            sink.describe()
                        ));
                        return Ok(out);
                    }
                }
                let line = format!(
                    "batch {batch_id} not written: {} has seen fencing token {stored} from a newer owner (this instance holds {ours}); it lost its lease and delivers nothing",
                    sink.describe()
                );
                tracing::warn!(function = %self.config.name, batch_id, "{line}");
                out.kind = OutcomeKind::Conflict;
                out.changes.clear();
                out.logs.push(line);
                Ok(out)
            }
            Err(e) => {
                if let (SinkError::Rejected(_), Some(f)) = (&e, doc.in_flight.as_mut()) {
                    // A known failure of this batch: durable, so that MaxAttempts counts across processes.
                    f.failures += 1;
                    let mut scratch = TickOutcome::default();
                    if let Err(store) = self.commit(&mut doc, Some(&etag), &mut scratch).await {
                        tracing::warn!(function = %self.config.name, batch_id, error = %store,
                            "could not record the sink's rejection; this failure is not counted");
                    }
                }
                Err(TickError::Sink(e))
            }
        }
    }
}

/// A batch recorded in flight by the write that acknowledged the batch before it: its id and its changes.
#[derive(Debug)]
pub(super) struct Chained {
    batch_id: u64,
    changes: Vec<crate::change::Change>,
}

/// A batch fetched ahead: the changes after `after`, fetched at `at`.
#[derive(Debug)]
pub(super) struct Ahead {
    after: Position,
    fetched: Fetched,
    at: Instant,
}

/// What the heartbeat leaves: the latest document this instance wrote, its etag, and why renewing stopped
/// early (another writer changed the state), if it did.
struct Held {
    doc: StateDoc,
    etag: Etag,
    lost: Option<String>,
}

/// Renews the lease on the batch in flight while a delivery runs. Dropping it ends the renewals at once: an
/// abandoned tick must not keep a lease alive.
struct Heartbeat {
    held: Arc<Mutex<Held>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl Heartbeat {
    fn start(trigger: &Trigger, doc: StateDoc, etag: Etag) -> Self {
        let held = Arc::new(Mutex::new(Held { doc, etag, lost: None }));
        let lease = trigger.config.settings.lease_duration;
        let every = lease / RENEWALS_PER_LEASE;
        if every.is_zero() {
            return Self { held, stop: None, task: None };
        }
        let renewal = Renewal {
            clock: trigger.clock.clone(),
            store: trigger.store.clone(),
            key: trigger.key.clone(),
            owner: trigger.owner.clone(),
            function: trigger.config.name.clone(),
            lease,
            held: held.clone(),
        };
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = &mut stopped => return,
                    () = tokio::time::sleep(every) => {}
                }
                if !renewal.renew().await {
                    return;
                }
            }
        });
        Self { held, stop: Some(stop), task: Some(task) }
    }

    /// Ends the renewals (a renewal in progress finishes first) and returns where they left the state.
    async fn stop(mut self) -> Held {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        let held = self.held.lock().expect("heartbeat lock");
        Held { doc: held.doc.clone(), etag: held.etag.clone(), lost: held.lost.clone() }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// One function's lease renewal: everything the heartbeat task needs, owned, so it can outlive a borrow.
struct Renewal {
    clock: Arc<dyn Clock>,
    store: Arc<dyn StateStore>,
    key: String,
    owner: String,
    function: String,
    lease: Duration,
    held: Arc<Mutex<Held>>,
}

impl Renewal {
    /// Extends the lease by one lease duration from now. `false`: stop renewing (the state moved on).
    async fn renew(&self) -> bool {
        let (mut doc, etag) = {
            let held = self.held.lock().expect("heartbeat lock");
            (held.doc.clone(), held.etag.clone())
        };
        let Some(lease) = doc.lease.as_mut() else { return false };
        let now = self.clock.now();
        lease.expires_at = now + self.lease;
        let bytes = stamp(&mut doc, &self.owner, now);
        match self.store.save_if(&self.key, &bytes, Some(&etag)).await {
            Ok(etag) => {
                self.adopt(doc, etag);
                true
            }
            Err(StoreError::Conflict) => {
                let why = "another writer changed the state during the delivery (an operator, or an instance that took the batch over)";
                tracing::warn!(function = %self.function, "lease renewal refused: {why}");
                self.held.lock().expect("heartbeat lock").lost = Some(why.into());
                false
            }
            Err(e) => {
                // The write may have been applied with its answer lost: if the stored document is this very
                // write, continue from it rather than conflict with ourselves at the next write.
                if let Ok(Some(stored)) = self.store.load(&self.key).await {
                    if let Ok(parsed) = serde_json::from_slice::<StateDoc>(&stored.bytes) {
                        if parsed.write_id == doc.write_id {
                            self.adopt(parsed, stored.etag);
                            return true;
                        }
                    }
                }
                tracing::warn!(function = %self.function, error = %e, "could not renew the lease; trying again");
                true
            }
        }
    }

    fn adopt(&self, doc: StateDoc, etag: Etag) {
        let mut held = self.held.lock().expect("heartbeat lock");
        held.doc = doc;
        held.etag = etag;
    }
}
