//! A partitioned function's status: the replicas its backlog asks for, and the totals over the partitions that answered.

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
        assert_eq!(target_replicas(pending, per_worker, partitions), replicas, "{pending} {per_worker} {partitions}");
    }
}

fn partition(index: u32, pending: u64, lag: Option<f64>, pace: Option<f64>, error: Option<&str>) -> PartitionStatus {
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
    let group = totals("orders", 2, 1000, vec![partition(0, 0, None, None, None), partition(1, 0, None, None, None)]);
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
    assert!(refused.contains("2 of 2 partitions did not answer: orders-p0 (refused); orders-p1 (gone)."), "{refused}");
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
