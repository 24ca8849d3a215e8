//! `handler partitions generate <function> N`: one function folder per partition, for the Functions host.
//!
//! A timer function runs on one instance at a time, so under the host a partitioned function is N timer
//! functions: `<function>-p0` .. `<function>-p{N-1}`, each a copy of the original's `function.json` and a
//! `sqltrigger.json` equal to the original plus `"partitions": N, "partition": i, "partitionGroup": "<function>"`
//! (the name the partitions' state documents share: `{app}/<function>/partition-{i}-of-{N}.json`).
//!
//! Nothing is written unless everything can be: the function must exist, N be in range, no target folder exist,
//! and the source support partitions. The original folder stays unless `--remove-original` is given: its
//! state (`{app}/<function>.json`) is not the partitions', and carrying its checkpoint over is
//! `handler partitions change`'s job, which an operator runs before the partitions first fire.

use crate::config::{valid_path_part, Partition, MAX_PARTITIONS};
use serde_json::{Map, Value};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

/// A refusal or failure of the command, saying what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct GenerateError(String);

/// What `generate` wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    pub function: String,
    pub count: u32,
    /// The folders written, in partition order.
    pub folders: Vec<PathBuf>,
    /// Whether the original folder was removed (`--remove-original`).
    pub removed_original: bool,
}

impl Generated {
    /// What the command prints: every file written, then the operator's next steps.
    pub fn report(&self) -> String {
        let f = &self.function;
        let n = self.count;
        let mut out = format!("wrote {n} partition function folders for {f}:\n");
        for (i, folder) in self.folders.iter().enumerate() {
            out.push_str(&format!("  {}\n", folder.join("function.json").display()));
            out.push_str(&format!(
                "  {}  (\"partitions\": {n}, \"partition\": {i}, \"partitionGroup\": \"{f}\")\n",
                folder.join("sqltrigger.json").display()
            ));
        }
        if self.removed_original {
            out.push_str(&format!("removed the original folder {f}\n"));
        }
        out.push_str("next steps:\n");
        let mut step = 1;
        if !self.removed_original {
            out.push_str(&format!(
                "  {step}. remove the folder {f} before deploying (or run again with --remove-original): deployed beside its partitions it would deliver every change a second time\n"
            ));
            step += 1;
        }
        out.push_str(&format!(
            "  {step}. if {f} already ran and has state ({{app}}/{f}.json), carry its checkpoint over to the {n} partitions with `handler partitions change` before they first fire; otherwise each partition starts from its startFrom\n"
        ));
        step += 1;
        out.push_str(&format!(
            "  {step}. create the index each partition's fetch needs: a postgres-cursor function logs the exact CREATE INDEX statement at start-up when it is missing (docs/postgres.md, \"Partitions\")\n"
        ));
        step += 1;
        out.push_str(&format!(
            "  {step}. deploy: each partition is its own timer function; its state is {{app}}/{f}/partition-{{i}}-of-{n}.json\n"
        ));
        out
    }
}

/// Writes the partition folders of the function folder `function` under `app_root`, or refuses with nothing
/// written.
pub fn generate(
    app_root: &Path,
    function: &str,
    count: u32,
    remove_original: bool,
) -> Result<Generated, GenerateError> {
    let refuse = |m: String| Err(GenerateError(m));
    if !(2..=MAX_PARTITIONS).contains(&count) {
        return refuse(format!(
            "{count} partitions: the count must be from 2 to {MAX_PARTITIONS} (1 is the function as it is)"
        ));
    }
    let Some(n) = NonZeroU32::new(count) else { return refuse("the count must be above 0".into()) };
    let last = Partition { index: count - 1, count: n }.function_name(function);
    if !valid_path_part(function) || !valid_path_part(&last) {
        return refuse(format!(
            "{function:?} is not a function folder name (letters, digits, '-', '_', '.'; its partition folders, up to {last:?}, at most 128 characters)"
        ));
    }
    let source = app_root.join(function);
    let trigger_path = source.join("sqltrigger.json");
    let function_path = source.join("function.json");
    if !trigger_path.is_file() || !function_path.is_file() {
        return refuse(format!(
            "no SQL trigger function {function:?} in {}: a function folder holds function.json and sqltrigger.json; functions here: {}",
            app_root.display(),
            sql_functions(app_root).join(", ")
        ));
    }
    let read = |p: &Path| std::fs::read(p).map_err(|e| GenerateError(format!("cannot read {}: {e}", p.display())));
    let function_json = read(&function_path)?;
    let trigger_text = read(&trigger_path)?;
    let trigger: Map<String, Value> = match serde_json::from_slice(&trigger_text) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return refuse(format!("{} is not a JSON object", trigger_path.display())),
        Err(e) => return refuse(format!("{} is not valid JSON: {e}", trigger_path.display())),
    };
    if trigger.contains_key("partition") || trigger.contains_key("partitionGroup") {
        return refuse(format!(
            "{function} is already one partition of a partitioned function (its sqltrigger.json names \"partition\"); generate from the original function's folder instead"
        ));
    }
    if trigger.get("source").and_then(Value::as_str) == Some("postgres-logical") {
        return refuse(format!(
            "{function} reads postgres-logical, which does not support partitions: its one replication stream decodes the server's WAL once for the whole function (N partitions would each need their own slot and decode the whole WAL N times); see docs/operations.md, \"Scaling out\""
        ));
    }
    let targets: Vec<PathBuf> =
        (0..count).map(|index| app_root.join(Partition { index, count: n }.function_name(function))).collect();
    let existing: Vec<String> = targets.iter().filter(|t| t.exists()).map(|t| t.display().to_string()).collect();
    if !existing.is_empty() {
        return refuse(format!(
            "{} already exist: remove them first (an earlier generate, or another function's folders) so nothing is overwritten",
            existing.join(", ")
        ));
    }

    let mut written = Vec::new();
    for (index, target) in targets.iter().enumerate() {
        let mut options = trigger.clone();
        options.insert("partitions".into(), Value::from(count));
        options.insert("partition".into(), Value::from(index as u32));
        options.insert("partitionGroup".into(), Value::from(function));
        let mut text = serde_json::to_string_pretty(&Value::Object(options))
            .map_err(|e| GenerateError(format!("cannot write sqltrigger.json: {e}")))?;
        text.push('\n');
        let result = std::fs::create_dir(target).and_then(|()| {
            written.push(target.clone());
            std::fs::write(target.join("function.json"), &function_json)?;
            std::fs::write(target.join("sqltrigger.json"), text)
        });
        if let Err(e) = result {
            // Nothing half-done: the folders this run created go again.
            for folder in &written {
                let _ = std::fs::remove_dir_all(folder);
            }
            return refuse(format!("cannot write {}: {e}; nothing was left behind", target.display()));
        }
    }
    if remove_original {
        std::fs::remove_dir_all(&source).map_err(|e| {
            GenerateError(format!(
                "wrote the {count} partition folders, but cannot remove {}: {e}; remove it by hand before deploying",
                source.display()
            ))
        })?;
    }
    Ok(Generated { function: function.to_string(), count, folders: targets, removed_original: remove_original })
}

/// The function folders under `app_root` with a sqltrigger.json, sorted (for the error naming what exists).
fn sql_functions(app_root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(app_root)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("sqltrigger.json").is_file())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .collect();
    names.sort();
    if names.is_empty() {
        names.push("none".into());
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FUNCTION_JSON: &str = "{\n  \"bindings\": [{\"type\": \"timerTrigger\", \"direction\": \"in\", \"name\": \"timer\", \"schedule\": \"*/5 * * * * *\"}, {\"type\": \"queue\", \"direction\": \"out\", \"name\": \"changes\", \"queueName\": \"changes\", \"connection\": \"AzureWebJobsStorage\"}],\n  \"retry\": {\"strategy\": \"fixedDelay\", \"maxRetryCount\": 3, \"delayInterval\": \"00:00:05\"}\n}\n";

    fn app(trigger: Value) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let f = dir.path().join("Orders");
        std::fs::create_dir(&f).expect("mkdir");
        std::fs::write(f.join("function.json"), FUNCTION_JSON).expect("write");
        std::fs::write(f.join("sqltrigger.json"), serde_json::to_string_pretty(&trigger).expect("json"))
            .expect("write");
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
}
