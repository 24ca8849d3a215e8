//! Reading `partitions`, `partition` and `partitionGroup`: what each folder serves, and every refusal.

use super::*;
use serde_json::json;

fn parse(v: Value, host: bool) -> (Partitioning, Vec<String>) {
    let mut errors = Vec::new();
    let p = Partitioning::parse(
        v.as_object().expect("object"),
        "orders",
        Some(SourceKind::PostgresCursor),
        host,
        "orders/sqltrigger.json",
        &mut errors,
    );
    (p, errors.iter().map(|e| e.to_string()).collect())
}

#[test]
fn a_folder_without_partitions_is_one_partition_named_by_itself() {
    let (p, errors) = parse(json!({}), true);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(p, Partitioning::single("orders"));
    assert!(!p.is_partitioned());
}

#[test]
fn under_handler_run_a_partitioned_folder_serves_every_partition() {
    let (p, errors) = parse(json!({"partitions": 4}), false);
    assert!(errors.is_empty(), "{errors:?}");
    let names: Vec<String> = p.served().iter().map(|s| s.function_name("orders")).collect();
    assert_eq!(names, ["orders-p0", "orders-p1", "orders-p2", "orders-p3"]);
    assert_eq!(p.served()[2].state_name("orders"), "orders/partition-2-of-4");
}

#[test]
fn under_the_host_a_partitioned_folder_must_be_generated_per_partition() {
    let (_, errors) = parse(json!({"partitions": 4}), true);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("handler partitions generate orders 4"), "{errors:?}");
    let (p, errors) = parse(json!({"partitions": 4, "partition": 3, "partitionGroup": "orders"}), true);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(p.served(), [Partition { index: 3, count: NonZeroU32::new(4).unwrap() }]);
}

#[test]
fn out_of_range_values_are_refused_with_the_rule() {
    for bad in [json!({"partitions": 0}), json!({"partitions": 257}), json!({"partitions": "4"})] {
        let (_, errors) = parse(bad.clone(), false);
        assert!(errors.iter().any(|e| e.contains("from 1 to 256")), "{bad}: {errors:?}");
    }
    for bad in [json!({"partitions": 4, "partition": 4}), json!({"partition": 0})] {
        let (_, errors) = parse(bad.clone(), false);
        assert!(errors.iter().any(|e| e.contains("below \"partitions\"")), "{bad}: {errors:?}");
    }
    let (_, errors) = parse(json!({"partitions": 4, "partitionGroup": "x"}), false);
    assert!(errors.iter().any(|e| e.contains("only beside \"partition\"")), "{errors:?}");
    let (_, errors) = parse(json!({"partitions": 4, "partition": 1, "partitionGroup": "a/b"}), false);
    assert!(errors.iter().any(|e| e.contains("partitionGroup")), "{errors:?}");
}

#[test]
fn the_logical_source_refuses_partitions_and_says_why() {
    let mut errors = Vec::new();
    let o = json!({"partitions": 2});
    Partitioning::parse(o.as_object().unwrap(), "f", Some(SourceKind::PostgresLogical), false, "f", &mut errors);
    assert!(errors.iter().any(|e| e.to_string().contains("decode the whole WAL N times")), "{errors:?}");
}
