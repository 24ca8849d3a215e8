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

use crate::config::{valid_path_part, Partition, SourceKind, MAX_PARTITIONS};
use serde_json::{Map, Value};
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

#[cfg(test)]
mod tests;

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
    // A name that is no source is left to the handler's own check when the folders load.
    let kind = SourceKind::from_name(trigger.get("source").and_then(Value::as_str));
    if let Some((kind, Err(why))) = kind.map(|k| (k, k.capabilities().partitions)) {
        return refuse(why.in_generate(function, kind));
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
