//! Every input of every fuzz target's corpus (fuzz/corpus/<target>: the seeds from the tests, what the fuzzer
//! kept, and each crash it found, fixed since) through the same check the target runs
//! (`sql_pseudo_trigger::fuzzing`), as an ordinary test: the suite pays no fuzzer build, and a fixed crash
//! stays fixed. `scripts/fuzz` runs the targets themselves (docs/fuzzing.md).

use std::path::{Path, PathBuf};

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus").join(target)
}

fn replay(target: &str) {
    let check = sql_pseudo_trigger::fuzzing::TARGETS
        .iter()
        .find(|(name, _)| *name == target)
        .map(|(_, check)| *check)
        .unwrap_or_else(|| panic!("no fuzz target named {target}"));
    let dir = corpus(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{}: a corpus needs seeds (found {})", dir.display(), files.len());
    let mut failed = Vec::new();
    for file in &files {
        let data = std::fs::read(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if std::panic::catch_unwind(|| check(&data)).is_err() {
            failed.push(file.display().to_string());
        }
    }
    assert!(failed.is_empty(), "{target}: {} of {} inputs fail their check: {failed:#?}", failed.len(), files.len());
}

#[test]
fn every_target_has_a_corpus_and_a_test_here() {
    let here = include_str!("fuzz_corpora.rs");
    for (name, _) in sql_pseudo_trigger::fuzzing::TARGETS {
        assert!(corpus(name).is_dir(), "fuzz/corpus/{name} is missing");
        assert!(here.contains(&format!("fn {name}()")), "no replay test for {name}");
        let target = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("fuzz/fuzz_targets/{name}.rs"));
        assert!(target.is_file(), "{} is missing", target.display());
    }
}

#[test]
fn invocation() {
    replay("invocation");
}

#[test]
fn pgoutput() {
    replay("pgoutput");
}

#[test]
fn postgres_connection_string() {
    replay("postgres_connection_string");
}

#[test]
fn mssql_connection_string() {
    replay("mssql_connection_string");
}

#[test]
fn storage_connection_string() {
    replay("storage_connection_string");
}

#[test]
fn ncrontab() {
    replay("ncrontab");
}

#[test]
fn function_config() {
    replay("function_config");
}

#[test]
fn state_document() {
    replay("state_document");
}
