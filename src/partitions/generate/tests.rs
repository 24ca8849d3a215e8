//! `handler partitions generate`: what it writes, what it refuses, and that the folders load under the host.

use super::*;
use serde_json::json;

const FUNCTION_JSON: &str = "{\n  \"bindings\": [{\"type\": \"timerTrigger\", \"direction\": \"in\", \"name\": \"timer\", \"schedule\": \"*/5 * * * * *\"}, {\"type\": \"queue\", \"direction\": \"out\", \"name\": \"changes\", \"queueName\": \"changes\", \"connection\": \"AzureWebJobsStorage\"}],\n  \"retry\": {\"strategy\": \"fixedDelay\", \"maxRetryCount\": 3, \"delayInterval\": \"00:00:05\"}\n}\n";

fn app(trigger: Value) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("Orders");
    std::fs::create_dir(&f).expect("mkdir");
    std::fs::write(f.join("function.json"), FUNCTION_JSON).expect("write");
    std::fs::write(f.join("sqltrigger.json"), serde_json::to_string_pretty(&trigger).expect("json")).expect("write");
    dir
}

fn cursor_trigger() -> Value {
    json!({"source": "postgres-cursor", "tableName": "public.orders", "connectionStringSetting": "Pg", "cursorColumn": "version", "maxBatchSize": 100})
}

/// Every file under `root`, relative, sorted.
fn files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            if e.path().is_dir() {
                dirs.push(e.path());
            } else {
                out.push(e.path().strip_prefix(root).expect("under root").display().to_string());
            }
        }
    }
    out.sort();
    out
}

#[test]
fn generate_writes_one_folder_per_partition_with_the_same_function_json_and_the_partition_keys() {
    // GIVEN a cursor function
    let dir = app(cursor_trigger());
    // WHEN it is split in 3
    let g = generate(dir.path(), "Orders", 3, false).expect("generated");
    // THEN exactly three folders of two files each are written, and the original stays
    assert_eq!(
        files(dir.path()),
        [
            "Orders-p0/function.json",
            "Orders-p0/sqltrigger.json",
            "Orders-p1/function.json",
            "Orders-p1/sqltrigger.json",
            "Orders-p2/function.json",
            "Orders-p2/sqltrigger.json",
            "Orders/function.json",
            "Orders/sqltrigger.json",
        ]
    );
    for i in 0..3u32 {
        let folder = dir.path().join(format!("Orders-p{i}"));
        assert_eq!(std::fs::read_to_string(folder.join("function.json")).expect("read"), FUNCTION_JSON);
        let written: Value =
            serde_json::from_str(&std::fs::read_to_string(folder.join("sqltrigger.json")).expect("read"))
                .expect("json");
        let mut expected = cursor_trigger();
        let o = expected.as_object_mut().expect("object");
        o.insert("partitions".into(), json!(3));
        o.insert("partition".into(), json!(i));
        o.insert("partitionGroup".into(), json!("Orders"));
        assert_eq!(written, expected);
        // The original's keys first, in their order, then the partition keys
        let keys: Vec<String> = written.as_object().expect("object").keys().cloned().collect();
        assert_eq!(keys[keys.len() - 3..], ["partitions", "partition", "partitionGroup"]);
    }
    assert!(!g.removed_original);
    let report = g.report();
    assert!(report.contains("Orders-p2/sqltrigger.json"), "{report}");
    assert!(report.contains("remove the folder Orders before deploying"), "{report}");
    assert!(report.contains("handler partitions change"), "{report}");
}

#[test]
fn remove_original_deletes_the_source_folder_after_writing() {
    let dir = app(cursor_trigger());
    let g = generate(dir.path(), "Orders", 2, true).expect("generated");
    assert!(g.removed_original);
    assert!(!dir.path().join("Orders").exists());
    assert_eq!(files(dir.path()).len(), 4);
    assert!(!g.report().contains("remove the folder"), "{}", g.report());
}

#[test]
fn refusals_name_the_problem_and_write_nothing() {
    let dir = app(cursor_trigger());
    let before = files(dir.path());
    let refused = |f: &str, n: u32| generate(dir.path(), f, n, true).expect_err("refused").to_string();
    let e = refused("Missing", 4);
    assert!(e.contains("no SQL trigger function \"Missing\"") && e.contains("functions here: Orders"), "{e}");
    for n in [0, 1, 257] {
        let e = refused("Orders", n);
        assert!(e.contains("from 2 to 256"), "{n}: {e}");
    }
    assert!(refused("../Orders", 2).contains("not a function folder name"));
    std::fs::create_dir(dir.path().join("Orders-p1")).expect("mkdir");
    let e = refused("Orders", 4);
    assert!(e.contains("Orders-p1") && e.contains("already exist"), "{e}");
    std::fs::remove_dir(dir.path().join("Orders-p1")).expect("rmdir");
    assert_eq!(files(dir.path()), before, "nothing written, the original kept");

    let logical = app(json!({"source": "postgres-logical", "tableName": "public.orders", "slotName": "s"}));
    let e = generate(logical.path(), "Orders", 2, false).expect_err("refused").to_string();
    assert!(e.contains("postgres-logical, which does not support partitions"), "{e}");
    assert_eq!(files(logical.path()).len(), 2);

    let partition = app(json!({"partitions": 2, "partition": 0, "partitionGroup": "X"}));
    let e = generate(partition.path(), "Orders", 2, false).expect_err("refused").to_string();
    assert!(e.contains("already one partition"), "{e}");
}

#[test]
fn the_written_folders_load_as_the_partitions_of_one_group_under_the_host() {
    // The folders must be what the handler accepts under the host: one partition each, sharing the group's
    // state name space.
    let dir = app(cursor_trigger());
    generate(dir.path(), "Orders", 2, true).expect("generated");
    let env = crate::config::Env::from_pairs([("Pg".to_string(), "postgres://u@localhost/db".to_string())]);
    let config = crate::config::AppConfig::load_for(dir.path(), env, crate::config::Mode::Host)
        .unwrap_or_else(|e| panic!("loads: {e}"));
    let mut states: Vec<String> =
        config.functions.iter().flat_map(|f| f.partition_triggers()).map(|f| f.state_name()).collect();
    states.sort();
    assert_eq!(states, ["Orders/partition-0-of-2", "Orders/partition-1-of-2"]);
}
