//! A partitioned function seen whole: the status of each of its partitions with the function's totals, and the
//! number of replicas its backlog asks for (what KEDA's `metrics-api` scaler reads from the scale route).
//!
//! A partitioned function has no trigger of its own name: under `handler run` one folder runs as the partition
//! triggers `{group}-p{i}`, under the host each generated folder is a function. Status of the group name reads
//! every partition trigger's [`Status`] and sums them here; the faces (admin routes, `handler state status`)
//! find the triggers with `App::partitions`.

use crate::engine::operate::{OpsError, Status};
use crate::engine::Trigger;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

#[cfg(test)]
mod tests;

/// The replicas a function's backlog asks for: `ceil(pending / Sql_Trigger_MaxChangesPerWorker)` (the official
/// trigger's scale rule, as status's `target_workers`), at most one per partition (a partition is delivered by
/// one process at a time, so a replica beyond the partitions would own nothing), and 0 when nothing is pending.
/// Partitions whose status is read at once: each read takes one connection at a time, so a status of the
/// whole function holds at most this many connections to the database (docs/operations.md, "Connections").
pub const STATUS_FAN_OUT: usize = 4;

pub fn target_replicas(pending: u64, max_changes_per_worker: u64, partitions: u32) -> u64 {
    pending.div_ceil(max_changes_per_worker.max(1)).min(u64::from(partitions.max(1)))
}

/// One partition in a partitioned function's status.
#[derive(Debug, Serialize)]
pub struct PartitionStatus {
    pub partition: u32,
    /// The partition trigger's name (`{group}-p{i}`): `handler state status <it>` gives its whole status.
    pub function: String,
    /// The holder of the partition's lease, while it lasts: the process delivering it now.
    pub lease_owner: Option<String>,
    /// The partition's owner in `handler run`'s balancing, where it reports one (see [`crate::engine::operate::PartitionView`]).
    pub partition_owner: Option<String>,
    pub pending: u64,
    pub lag_seconds: Option<f64>,
    pub pace_per_second: Option<f64>,
    pub seconds_since_progress: f64,
    pub paused: bool,
    pub halted: Option<String>,
    /// Why this partition's status could not be read (its numbers are then absent from the totals).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A partitioned function's status: each partition, and the totals.
#[derive(Debug, Serialize)]
pub struct GroupStatus {
    /// The partitioned function's name (`partitionGroup`).
    pub function: String,
    /// How many partitions the function has (`"partitions"`).
    pub partitions: u32,
    /// How many of them this app serves (under the host, the generated folders deployed here).
    pub served: usize,
    /// Pending changes of every partition that answered.
    pub pending: u64,
    /// The largest lag among the partitions that know theirs; `None` when none does.
    pub lag_seconds: Option<f64>,
    /// The partitions' paces added up; `None` until one is known.
    pub pace_per_second: Option<f64>,
    pub max_changes_per_worker: u64,
    /// [`target_replicas`] of the pending changes.
    pub target_replicas: u64,
    /// Partitions whose status could not be read (`error` in their entry).
    pub unanswered: usize,
    pub partition_status: Vec<PartitionStatus>,
}

impl GroupStatus {
    /// The status, or [`OpsError::Incomplete`] naming each partition that did not answer ([`Self::missing`]):
    /// the scale route and the status route must not report a backlog they only partly read.
    pub fn complete(self) -> Result<Self, OpsError> {
        match self.missing() {
            None => Ok(self),
            Some(missing) => Err(OpsError::Incomplete(missing)),
        }
    }

    /// `None` when every partition answered; otherwise why the totals are not the function's, naming each
    /// partition that did not answer and its error (what `handler state status` says instead of a total).
    pub fn missing(&self) -> Option<String> {
        let missing: Vec<String> = self
            .partition_status
            .iter()
            .filter_map(|p| p.error.as_ref().map(|e| format!("{} ({e})", p.function)))
            .collect();
        if missing.is_empty() {
            return None;
        }
        Some(format!(
            "the status of {} is incomplete, so no total is given: {} of {} partitions did not answer: {}. Ask again once they answer (each partition's own status is `handler state status <partition>`)",
            self.function,
            missing.len(),
            self.served,
            missing.join("; ")
        ))
    }
}

/// Reads the status of each of `partitions` (the partition triggers of `group`, from `App::partitions`) in
/// rounds of [`STATUS_FAN_OUT`], and sums them. `owners`: each partition's owner in `handler run`'s balancing,
/// by index, where it is known. Fails only when no partition answered, naming each of them ([`GroupStatus::missing`]).
pub async fn group_status(
    group: &str,
    partitions: &[Arc<Trigger>],
    owners: &BTreeMap<u32, String>,
) -> Result<GroupStatus, OpsError> {
    let Some(first) = partitions.first() else {
        return Err(OpsError::Invalid(format!("{group} has no partition triggers here")));
    };
    let count = first.config().partition().map_or(1, |p| p.count.get());
    let per_worker = first.config().settings.max_changes_per_worker.max(1);
    // In rounds of STATUS_FAN_OUT: a window would save a little time and cost a stream whose closure axum's
    // handlers cannot hold across an await (the future would not be `Send` for every lifetime).
    let mut results = Vec::with_capacity(partitions.len());
    for round in partitions.chunks(STATUS_FAN_OUT) {
        results.extend(futures::future::join_all(round.iter().map(|t| t.status())).await);
    }
    let mut entries = Vec::with_capacity(results.len());
    for (t, result) in partitions.iter().zip(results) {
        let index = t.config().partition().map_or(0, |p| p.index);
        entries.push(match result {
            Ok(status) => entry(index, status, owners.get(&index).cloned()),
            Err(e) => PartitionStatus {
                partition: index,
                function: t.name().to_string(),
                lease_owner: None,
                partition_owner: owners.get(&index).cloned(),
                pending: 0,
                lag_seconds: None,
                pace_per_second: None,
                seconds_since_progress: 0.0,
                paused: false,
                halted: None,
                error: Some(e.to_string()),
            },
        });
    }
    summed(group, count, per_worker, entries)
}

/// [`totals`] of the partitions read, or, when none of them answered, the error naming each of them.
fn summed(group: &str, count: u32, per_worker: u64, partitions: Vec<PartitionStatus>) -> Result<GroupStatus, OpsError> {
    let status = totals(group, count, per_worker, partitions);
    if status.partition_status.iter().all(|p| p.error.is_some()) {
        return status.complete();
    }
    Ok(status)
}

fn entry(index: u32, status: Status, partition_owner: Option<String>) -> PartitionStatus {
    PartitionStatus {
        partition: index,
        function: status.function,
        lease_owner: status.partition.as_ref().and_then(|p| p.lease_owner.clone()),
        partition_owner,
        pending: status.pending,
        lag_seconds: status.lag_seconds,
        pace_per_second: status.pace_per_second,
        seconds_since_progress: status.seconds_since_progress,
        paused: status.paused,
        halted: status.halted,
        error: None,
    }
}

/// The function's totals over the partitions that answered.
fn totals(group: &str, count: u32, per_worker: u64, partitions: Vec<PartitionStatus>) -> GroupStatus {
    let answered = || partitions.iter().filter(|p| p.error.is_none());
    let pending = answered().map(|p| p.pending).sum();
    let lag_seconds = answered().filter_map(|p| p.lag_seconds).reduce(f64::max);
    let pace_per_second = answered().filter_map(|p| p.pace_per_second).reduce(|a, b| a + b);
    GroupStatus {
        function: group.to_string(),
        partitions: count,
        served: partitions.len(),
        pending,
        lag_seconds,
        pace_per_second,
        max_changes_per_worker: per_worker,
        target_replicas: target_replicas(pending, per_worker, count),
        unanswered: partitions.iter().filter(|p| p.error.is_some()).count(),
        partition_status: partitions,
    }
}
