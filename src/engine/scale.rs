//! A partitioned function seen whole: the status of each of its partitions with the function's totals, and the
//! number of replicas its backlog asks for (what KEDA's `metrics-api` scaler reads from the scale route).
//!
//! A partitioned function has no trigger of its own name: under `handler run` one folder runs as the partition
//! triggers `{group}-p{i}`, under the host each generated folder is a function. Status of the group name reads
//! every partition trigger's [`Status`] and sums them here; the faces (admin routes, `handler state status`)
//! find the triggers with `App::partitions`.

use super::operate::{OpsError, Status};
use super::parts::Trigger;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;

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
    /// The partition's owner in `handler run`'s balancing, where it reports one (see [`super::operate::PartitionView`]).
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
    let count = first.config.partition().map_or(1, |p| p.count.get());
    let per_worker = first.config.settings.max_changes_per_worker.max(1);
    // In rounds of STATUS_FAN_OUT: a window would save a little time and cost a stream whose closure axum's
    // handlers cannot hold across an await (the future would not be `Send` for every lifetime).
    let mut results = Vec::with_capacity(partitions.len());
    for round in partitions.chunks(STATUS_FAN_OUT) {
        results.extend(futures::future::join_all(round.iter().map(|t| t.status())).await);
    }
    let mut entries = Vec::with_capacity(results.len());
    for (t, result) in partitions.iter().zip(results) {
        let index = t.config.partition().map_or(0, |p| p.index);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_replicas_is_the_backlog_over_changes_per_worker_at_most_one_per_partition() {
        // (pending, max changes per worker, partitions, replicas)
        let cases = [
            (0, 1000, 8, 0),
            (1, 1000, 8, 1),
            (1000, 1000, 8, 1),
            (1001, 1000, 8, 2),
            (7999, 1000, 8, 8),
            (1_000_000, 1000, 8, 8),
            (5, 0, 8, 5),
            (5000, 1000, 1, 1),
            (5000, 1000, 0, 1),
        ];
        for (pending, per_worker, partitions, replicas) in cases {
            assert_eq!(
                target_replicas(pending, per_worker, partitions),
                replicas,
                "{pending} {per_worker} {partitions}"
            );
        }
    }

    fn partition(
        index: u32,
        pending: u64,
        lag: Option<f64>,
        pace: Option<f64>,
        error: Option<&str>,
    ) -> PartitionStatus {
        PartitionStatus {
            partition: index,
            function: format!("orders-p{index}"),
            lease_owner: Some(format!("pod-{index}")),
            partition_owner: None,
            pending,
            lag_seconds: lag,
            pace_per_second: pace,
            seconds_since_progress: 0.0,
            paused: false,
            halted: None,
            error: error.map(str::to_string),
        }
    }

    #[test]
    fn totals_add_the_pending_and_pace_and_take_the_largest_lag_of_the_partitions_that_answered() {
        // GIVEN four partitions, one of which could not be read
        let partitions = vec![
            partition(0, 1500, Some(2.0), Some(100.0), None),
            partition(1, 0, Some(0.0), None, None),
            partition(2, 700, None, Some(50.5), None),
            partition(3, 99_999, Some(600.0), Some(1.0), Some("database down")),
        ];
        // WHEN the totals are made
        let group = totals("orders", 4, 1000, partitions);
        // THEN the partition that did not answer counts in none of them, and the scale route refuses it
        assert_eq!((group.pending, group.lag_seconds, group.pace_per_second), (2200, Some(2.0), Some(150.5)));
        assert_eq!((group.partitions, group.served, group.unanswered, group.target_replicas), (4, 4, 1, 3));
        // AND the JSON names each partition, its lease holder and the totals
        let json = serde_json::to_value(&group).expect("serializes");
        assert_eq!(json["partition_status"][0]["lease_owner"], "pod-0");
        assert_eq!(json["partition_status"][3]["error"], "database down");
        assert!(json["partition_status"][0].get("error").is_none(), "{json}");
        assert_eq!(json["target_replicas"], 3);
    }

    #[test]
    fn with_no_lag_or_pace_known_the_totals_say_unknown_not_zero() {
        let group =
            totals("orders", 2, 1000, vec![partition(0, 0, None, None, None), partition(1, 0, None, None, None)]);
        assert_eq!((group.lag_seconds, group.pace_per_second, group.target_replicas), (None, None, 0));
        assert!(group.complete().is_ok());
    }

    #[test]
    fn a_status_that_partitions_did_not_answer_names_each_of_them_and_no_total() {
        let group = totals(
            "orders",
            3,
            1000,
            vec![
                partition(0, 5, None, None, None),
                partition(1, 7, None, None, Some("sorry, too many clients already")),
                partition(2, 0, None, None, Some("bad document")),
            ],
        );
        let missing = group.missing().expect("incomplete");
        assert!(missing.contains("2 of 3 partitions did not answer"), "{missing}");
        assert!(missing.contains("orders-p1 (sorry, too many clients already); orders-p2 (bad document)"), "{missing}");
        assert!(!missing.contains("orders-p0"), "{missing}");
        assert!(totals("orders", 1, 1000, vec![partition(0, 5, None, None, None)]).missing().is_none());
    }

    #[test]
    fn when_no_partition_answered_the_status_fails_naming_every_one_of_them() {
        let partitions = vec![partition(0, 0, None, None, Some("refused")), partition(1, 0, None, None, Some("gone"))];
        let refused = summed("orders", 2, 1000, partitions).expect_err("nothing answered").to_string();
        assert!(
            refused.contains("2 of 2 partitions did not answer: orders-p0 (refused); orders-p1 (gone)."),
            "{refused}"
        );
        let answered = vec![partition(0, 3, None, None, None), partition(1, 0, None, None, Some("gone"))];
        let partial = summed("orders", 2, 1000, answered).expect("one answered: the partial status, for the CLI");
        assert_eq!((partial.pending, partial.unanswered), (3, 1));
    }

    #[test]
    fn a_partition_that_did_not_answer_makes_the_status_incomplete_naming_it_and_its_error() {
        let partitions = vec![partition(0, 5, None, None, None), partition(1, 9, None, None, Some("database down"))];
        let refused = totals("orders", 2, 1000, partitions).complete().expect_err("a partition did not answer");
        assert!(matches!(refused, OpsError::Incomplete(_)), "{refused:?}");
        let refused = refused.to_string();
        assert!(refused.contains("1 of 2 partitions did not answer: orders-p1 (database down)."), "{refused}");
    }
}
