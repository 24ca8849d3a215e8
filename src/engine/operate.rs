//! Operator actions on a function's state: show, status, pause, resume, reset, replay and the quarantine, as
//! one [`Action`] applied by [`Trigger::operate`], the one dispatcher that the CLI (`handler state ...`) and
//! the admin routes both call (`crate::ops` parses their words into an `Action`).
//!
//! Each action is a compare-and-swap write of the state document through the ledger, exactly like a tick's, so
//! an action never overwrites a tick's or another operator's write: one that loses the race reads the document
//! again and applies itself again (`retry`), and fails only when it no longer applies or keeps losing. Every
//! write is logged with who asked. The backfill's actions are in `backfill`.

mod backfill;
mod retry;

use super::document::{Origin, StateDoc, Stopped};
use super::error::TickError;
use super::ledger::Ledger;
use super::parts::Trigger;
use super::tick::Tick;
use crate::source::{Lag, Position, SourceError, StartFrom};
use crate::state::{Etag, StoreError};
pub use backfill::backfill_progress;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    #[error("function {0} has no state yet: it has not run; nothing to change")]
    NoState(String),
    #[error("the state of {0} kept changing while the operation ran (every attempt lost to another writer: a tick or another operator); run it again")]
    Conflict(String),
    #[error("{0}")]
    NeedsConfirmation(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Tick(#[from] TickError),
    /// A partitioned function's status that some partitions did not answer (`GroupStatus::missing`): no total.
    #[error("{0}")]
    Incomplete(String),
}

impl From<StoreError> for OpsError {
    fn from(e: StoreError) -> Self {
        Self::Tick(TickError::Store(e))
    }
}

/// Where `reset` moves the checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum ResetTo {
    Earliest,
    Now,
    Position(Position),
}

impl ResetTo {
    /// `earliest`, `now`, or a position as JSON (e.g. `["1042","17"]`).
    pub fn parse(text: &str) -> Result<Self, OpsError> {
        match text.trim() {
            "earliest" => Ok(Self::Earliest),
            "now" => Ok(Self::Now),
            other => serde_json::from_str(other).map(Self::Position).map_err(|e| {
                OpsError::Invalid(format!(
                    "{other:?} is not earliest, now or a JSON position such as [\"1042\",\"17\"] ({e}); `handler state show` prints the current one"
                ))
            }),
        }
    }
}

/// One operator action, parsed from the CLI's words or an admin route.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// The state document and the quarantine documents in the store.
    Show,
    /// [`Status`].
    Status,
    /// Ticks answer empty batches until `Resume`.
    Pause,
    /// Clears a pause and a poison halt (the halting batch is then delivered once more).
    Resume,
    /// Moves the checkpoint; needs `confirm`: it can skip or repeat changes.
    Reset {
        to: ResetTo,
        confirm: bool,
    },
    /// Re-delivers everything after `from`, under new batch ids.
    Replay {
        from: Position,
    },
    QuarantineList,
    QuarantineShow {
        batch_id: u64,
    },
    /// Queues a quarantined batch for re-delivery before new changes.
    QuarantineRetry {
        batch_id: u64,
    },
    /// Starts a backfill of the rows that exist, optionally filtered (docs/operations.md, "Backfill").
    BackfillStart {
        filter: Option<String>,
    },
    /// Pauses, resumes or cancels the open backfill.
    Backfill(BackfillControl),
}

/// What an operator does to an open backfill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackfillControl {
    Pause,
    Resume,
    Cancel,
}

impl Trigger {
    /// Applies `action`, asked by `who`, and answers what the CLI prints and the admin route returns.
    pub async fn operate(&self, action: Action, who: &str) -> Result<Value, OpsError> {
        match action {
            Action::Show => show(self).await,
            Action::Status => status(self).await.map(|s| serde_json::to_value(s).unwrap_or(Value::Null)),
            Action::Pause => {
                change(self, who, "pause", StateDoc::pause).await?;
                Ok(json!({ "function": self.name(), "paused": true }))
            }
            Action::Resume => {
                // A retired document's checkpoint lives on in the new layout's documents: resuming it would deliver
                // its keys a second time, from a stale position, beside the partitions that now own them.
                if let Some((doc, _)) = self.load().await? {
                    if let Some(Stopped::Retired { reason, .. }) = doc.stopped() {
                        return Err(OpsError::Invalid(format!(
                            "{} is not resumed: its state was {reason}",
                            self.name()
                        )));
                    }
                }
                change(self, who, "resume", StateDoc::resume).await?;
                Ok(json!({ "function": self.name(), "paused": false }))
            }
            Action::Reset { to, confirm } => reset(self, to, confirm, who).await,
            Action::Replay { from } => replay(self, from, who).await,
            Action::QuarantineList => quarantine_list(self).await,
            Action::QuarantineShow { batch_id } => quarantine_show(self, batch_id).await,
            Action::QuarantineRetry { batch_id } => quarantine_retry(self, batch_id, who).await,
            Action::BackfillStart { filter } => backfill::start(self, filter, who).await,
            Action::Backfill(control) => backfill::control(self, control, who).await,
        }
    }

    /// What [`Status`] reports, typed (metrics read it).
    pub async fn status(&self) -> Result<Status, OpsError> {
        status(self).await
    }
}

/// What `status` reports: enough for a dashboard and for scaling decisions.
#[derive(Debug, Serialize)]
pub struct Status {
    pub function: String,
    pub source: String,
    pub delivery_mode: crate::config::DeliveryMode,
    pub paused: bool,
    pub halted: Option<String>,
    /// Changes readable after the checkpoint (the batch in flight included).
    pub pending: u64,
    /// `ceil(pending / Sql_Trigger_MaxChangesPerWorker)`, as the official trigger's scale controller computes.
    pub target_workers: u64,
    /// The lag: seconds the oldest undelivered change has waited (the first change after the checkpoint, the
    /// batch in flight included, and changes the late-commit guard still holds back); 0 when nothing waits.
    /// `None` when the source cannot date its changes; `lag_unknown_reason` then says why and what to change.
    pub lag_seconds: Option<f64>,
    pub lag_unknown_reason: Option<String>,
    /// Seconds since the checkpoint last moved, while changes are pending; 0 when nothing is pending. Unlike
    /// the lag, it says whether the function is moving at all: a function that keeps delivering a backlog
    /// older than an hour has a large lag and a small `seconds_since_progress`.
    pub seconds_since_progress: f64,
    /// Changes acknowledged per second over the last minutes (a decayed average, `engine::decide::Pace`);
    /// `None` until a function has acknowledged batches for a few seconds.
    pub pace_per_second: Option<f64>,
    /// `pending / pace_per_second`: how long the pending changes take at the observed pace. 0 when nothing is
    /// pending; `None` when changes wait and the pace is unknown or zero (the function is not moving).
    pub seconds_to_drain: Option<f64>,
    /// The most the host's timer lets this function deliver: `Sql_Trigger_MaxBatchSize` changes per firing
    /// times the schedule's firings per second (one batch per firing, as the timer never overlaps itself).
    /// `None` under `handler run`, which has no timer.
    pub ceiling_per_second: Option<f64>,
    /// What is in flight: in deferred delivery, every batch answered and not yet proven written (`batches`,
    /// `rows`, the first answered at `since`); `failures` are the first batch's known failures.
    pub in_flight: Option<Value>,
    /// Deferred delivery: how long after its last answer a batch is taken as written (docs/architecture.md).
    pub proof_window_ms: Option<u64>,
    pub counters: Value,
    pub quarantined: usize,
    /// State-store operations this process performed so far.
    pub store_operations: u64,
    pub last_tick: Option<super::TickStats>,
    /// Seconds since this process last ran a tick of the function (an invocation, or a turn of `handler run`'s
    /// loop); since the process started watching when it has not yet. Liveness: docs/operations.md. `None` in a
    /// process that neither ticks nor watches (`handler state status`: ask the running handler's admin routes).
    pub seconds_since_last_invocation: Option<f64>,
    /// Seconds since the last tick of this process that ended without an error (or since it started watching).
    pub seconds_since_last_success: Option<f64>,
    /// Ticks of this process that ended with an error since the last one that did not (`None` as above).
    pub consecutive_failures: Option<u64>,
    /// What the source reports about itself (`Source::health`): for postgres-logical, the replication slot and
    /// the WAL it retains. Absent for sources with nothing to say; `{"error": ...}` when it could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_health: Option<Value>,
    /// The partition this trigger serves, and who holds its lease; absent for an unpartitioned function.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub partition: Option<PartitionView>,
    /// The current or last backfill and its progress (see [`backfill_progress`]); absent when there was none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backfill: Option<Value>,
}

/// Which partition of which function a partition trigger serves, and who delivers it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PartitionView {
    /// The partitioned function's name (`partitionGroup`): the name status and the scale route answer to.
    pub group: String,
    pub index: u32,
    pub count: u32,
    /// The process holding the state document's lease (`Sql_Trigger_LeaseDurationMs`), while it lasts: the one
    /// delivering this partition now. `None` when no lease is held (nobody ticked it lately).
    pub lease_owner: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub lease_expires_at: Option<time::OffsetDateTime>,
    /// The partition's owner in `handler run`'s balancing (its partition ownership document), which can differ
    /// from the lease holder while a partition moves. `None` where nothing reports ownership (under the host,
    /// and until the balancing's owners are passed to `partitions::status::group_status`).
    pub partition_owner: Option<String>,
}

async fn load(t: &Trigger) -> Result<(StateDoc, Etag), OpsError> {
    t.load().await?.ok_or_else(|| OpsError::NoState(t.name().to_string()))
}

/// Applies one transition to the stored document and writes it back (again on a fresh read after a lost race).
async fn change(t: &Trigger, who: &str, action: &str, transition: fn(&mut StateDoc)) -> Result<(), OpsError> {
    retry::apply(t, who, action, || async move {
        let (mut doc, etag) = load(t).await?;
        transition(&mut doc);
        Ok((doc, Some(etag), ()))
    })
    .await
    .map(|_| ())
}

/// Reads one change after a position an operator typed, so that a position the source cannot read is refused
/// now, with the state untouched, instead of being stored and failing every tick until someone resets it.
async fn check_position(t: &Trigger, position: &Position) -> Result<(), OpsError> {
    match t.source.fetch(position, 1).await {
        Ok(_) => Ok(()),
        Err(e @ (SourceError::Invalid(_) | SourceError::PositionLost(_))) => Err(OpsError::Invalid(format!(
            "position {position} cannot be read from {}: {e}; `handler state show` prints the current checkpoint, whose shape a position must have",
            t.source.name()
        ))),
        Err(e) => Err(TickError::from(e).into()),
    }
}

/// The state document and the quarantine documents in the store.
async fn show(t: &Trigger) -> Result<Value, OpsError> {
    let state = t.load().await?.map(|(doc, _)| doc);
    let quarantine = t.ledger.list_quarantine().await?;
    Ok(json!({ "function": t.name(), "state_key": t.state_key(), "state": state, "quarantine_documents": quarantine }))
}

async fn status(t: &Trigger) -> Result<Status, OpsError> {
    let doc = t.load().await?.map(|(doc, _)| doc);
    // A function that never ran starts where its first tick will: `startFrom`, not the beginning of the table.
    let checkpoint = match doc.as_ref() {
        Some(d) => d.checkpoint().clone(),
        None => t.source.start_position(t.config.source.start_from).await.map_err(TickError::from)?,
    };
    let pending = t.source.pending(&checkpoint).await.map_err(TickError::from)?;
    let per_worker = t.config.settings.max_changes_per_worker.max(1);
    let now = t.ledger.clock().now();
    let heard = t.heard();
    let since = doc.as_ref().and_then(|d| d.progress_at().or(Some(d.updated_at())));
    let seconds_since_progress = match (pending, since) {
        (0, _) | (_, None) => 0.0,
        (_, Some(at)) => (now - at).as_seconds_f64().max(0.0),
    };
    let pace_per_second = doc.as_ref().and_then(|d| d.pace()).and_then(|p| p.per_second(now));
    let seconds_to_drain = match (pending, pace_per_second) {
        (0, _) => Some(0.0),
        (_, Some(pace)) if pace > 0.0 => Some(pending as f64 / pace),
        _ => None,
    };
    let ceiling_per_second = t.config.schedule.as_ref().map(|schedule| {
        let from = time::PrimitiveDateTime::new(now.date(), now.time());
        t.config.settings.max_batch_size as f64 * schedule.firings_per_second(from)
    });
    // The lag is extra information: a failure to read it is reported in the answer, never fails the status.
    let (lag_seconds, lag_unknown_reason) = match t.source.oldest_pending_age(&checkpoint).await {
        Ok(Lag::CaughtUp) => (Some(0.0), None),
        Ok(Lag::Behind(age)) => (Some(age.as_secs_f64()), None),
        Ok(Lag::Unknown(reason)) => (None, Some(reason)),
        Err(e) => (None, Some(format!("the lag could not be read: {e}"))),
    };
    let source_health = match t.source.health().await {
        Ok(health) => health,
        Err(e) => Some(json!({ "error": e.to_string() })),
    };
    Ok(Status {
        function: t.name().to_string(),
        source: t.source.name(),
        delivery_mode: t.config.settings.delivery_mode,
        paused: doc.as_ref().is_some_and(|d| d.paused()),
        halted: doc.as_ref().and_then(|d| d.halted()).map(str::to_string),
        pending,
        target_workers: pending.div_ceil(per_worker),
        lag_seconds,
        lag_unknown_reason,
        seconds_since_progress,
        pace_per_second,
        seconds_to_drain,
        ceiling_per_second,
        in_flight: doc.as_ref().and_then(|d| d.in_flight()).map(|f| {
            json!({
                "batch_id": f.range.batch_id, "batches": f.batches, "rows": f.range.rows, "deliveries": f.deliveries,
                "failures": f.failures, "owner": f.owner,
                "since": f.first_delivered_at.format(&time::format_description::well_known::Rfc3339).ok(),
            })
        }),
        proof_window_ms: (t.config.settings.delivery_mode == crate::config::DeliveryMode::Deferred)
            .then_some(t.config.proof_window.as_millis() as u64),
        counters: doc.as_ref().map_or(Value::Null, |d| serde_json::to_value(d.counters()).unwrap_or(Value::Null)),
        quarantined: doc.as_ref().map_or(0, |d| d.counters().quarantined as usize),
        store_operations: t.ledger.store_operations(),
        last_tick: t.last_tick(),
        seconds_since_last_invocation: heard.map(|h| h.seconds_since_invocation(now)),
        seconds_since_last_success: heard.map(|h| h.seconds_since_success(now)),
        consecutive_failures: heard.map(|h| h.consecutive_failures),
        source_health,
        partition: t.config.partition().map(|p| {
            let lease = doc.as_ref().and_then(|d| d.lease()).filter(|l| l.expires_at > now);
            PartitionView {
                group: t.config.partitioning.group.clone(),
                index: p.index,
                count: p.count.get(),
                lease_owner: lease.map(|l| l.owner.clone()),
                lease_expires_at: lease.map(|l| l.expires_at),
                partition_owner: None,
            }
        }),
        backfill: doc.as_ref().and_then(|d| d.backfill()).map(|b| backfill_progress(b, now)),
    })
}

/// Moves the checkpoint, drops the batch in flight and the queue of quarantined batches to retry, clears a halt,
/// adopts the configured source's fingerprint (the way out of a "source changed" refusal) and starts a new
/// lineage (the way out of a refused hand edit). Needs `confirm`: it can skip or repeat changes.
async fn reset(t: &Trigger, to: ResetTo, confirm: bool, who: &str) -> Result<Value, OpsError> {
    if !confirm {
        return Err(OpsError::NeedsConfirmation(format!(
            "reset moves the checkpoint of {} and may skip or repeat changes; repeat with --confirm (admin route: confirm=true)",
            t.name()
        )));
    }
    let position = match to {
        ResetTo::Earliest => t.source.start_position(StartFrom::Earliest).await.map_err(TickError::from)?,
        ResetTo::Now => t.source.start_position(StartFrom::Now).await.map_err(TickError::from)?,
        ResetTo::Position(p) => {
            check_position(t, &p).await?;
            p
        }
    };
    let (source, fingerprint) = (t.source.name(), t.source.fingerprint());
    let (source, fingerprint) = (source.as_str(), fingerprint.as_str());
    retry::apply(t, who, "reset", || {
        let position = position.clone();
        async move {
            let (mut doc, etag) = reset_base(t, &position).await?;
            doc.reset(position, Origin { function: t.name(), source, fingerprint });
            Ok((doc, etag, ()))
        }
    })
    .await?;
    Ok(json!({ "function": t.name(), "checkpoint": position }))
}

/// The document a reset rewrites, and its etag (`None`: there is none, and the reset creates it).
async fn reset_base(t: &Trigger, position: &Position) -> Result<(StateDoc, Option<Etag>), OpsError> {
    Ok(match t.load().await {
        Ok(Some((doc, etag))) => (doc, Some(etag)),
        Ok(None) => (Tick::new_doc(t, position.clone()), None),
        // A document refused as edited by hand: reset it as it reads (its batch ids, counters and quarantine list
        // go on); one that does not read at all is replaced, under its etag, by a new one whose batch ids start
        // after every quarantine document in the store (an id given out again would find the old batch's
        // document there and keep it in place of the new one's changes).
        Err(TickError::CorruptState { .. }) => match t.ledger.load_unchecked().await? {
            Some((doc, etag)) => (doc, Some(etag)),
            None => {
                let mut doc = Tick::new_doc(t, position.clone());
                if let Some(last) =
                    t.ledger.list_quarantine().await?.iter().filter_map(|k| Ledger::quarantine_batch_id(k)).max()
                {
                    doc.continue_ids_after(last);
                }
                (doc, t.ledger.etag().await?)
            }
        },
        Err(e) => return Err(e.into()),
    })
}

/// Re-delivers everything after `from`, under new batch ids. Changes after the current checkpoint are not
/// skipped, so this needs no confirmation: at worst it repeats.
async fn replay(t: &Trigger, from: Position, who: &str) -> Result<Value, OpsError> {
    check_position(t, &from).await?;
    let (_, previous) = retry::apply(t, who, "replay", || {
        let from = from.clone();
        async move {
            let (mut doc, etag) = load(t).await?;
            let previous = doc.replay(from);
            Ok((doc, Some(etag), previous))
        }
    })
    .await?;
    Ok(json!({ "function": t.name(), "checkpoint": from, "previous_checkpoint": previous }))
}

async fn quarantine_list(t: &Trigger) -> Result<Value, OpsError> {
    let keys = t.ledger.list_quarantine().await?;
    let doc = t.load().await?.map(|(d, _)| d);
    let recent = doc.as_ref().map_or(&[][..], |d| d.quarantine());
    Ok(json!({ "function": t.name(), "documents": keys, "recent": recent }))
}

async fn quarantine_show(t: &Trigger, batch_id: u64) -> Result<Value, OpsError> {
    let doc = t.ledger.load_quarantine(&t.ledger.quarantine_key(batch_id)).await?;
    Ok(serde_json::to_value(doc).unwrap_or(Value::Null))
}

/// Queues a quarantined batch for re-delivery before new changes. The checkpoint does not move.
async fn quarantine_retry(t: &Trigger, batch_id: u64, who: &str) -> Result<Value, OpsError> {
    // Fail early, with the key, if there is no such document.
    t.ledger.load_quarantine(&t.ledger.quarantine_key(batch_id)).await?;
    let (doc, ()) = retry::apply(t, who, "quarantine retry", || async move {
        let (mut doc, etag) = load(t).await?;
        doc.queue_quarantine_retry(batch_id);
        Ok((doc, Some(etag), ()))
    })
    .await?;
    Ok(json!({ "function": t.name(), "queued": doc.retry_quarantined() }))
}
