//! The shipped templates, loaded as a deployment lays them out (this repository's host.json, every folder of
//! function-templates/, the settings of local.settings.json.example) through the handler's own config loader,
//! and the figures docs/operations.md states about them, computed here from what was loaded:
//! - the pace each template allows under the host (`Sql_Trigger_MaxBatchSize` × firings per second), which
//!   must match or beat the official Azure SQL trigger's defaults (100 changes per 1-second poll);
//! - what a host restart costs in deferred delivery: every batch answered within one proof window (the loader's
//!   own `proof_window`: functionTimeout + the retry policy's longest delay + 30 s) comes again, so at most
//!   the timer's firings within one window × the batch.
//!
//! The table rows in docs/operations.md ("The templates: pace and what a restart re-delivers") must be exactly
//! the rows this test builds, so a change to a template, host.json or the proof-window rule that moves a figure
//! fails here until the docs say the new figure.

use sql_pseudo_trigger::config::ncrontab::Schedule;
use sql_pseudo_trigger::config::{parse_timespan, AppConfig, Env, FunctionConfig, Mode};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use time::macros::datetime;

/// The official trigger's default pace: `Sql_Trigger_MaxBatchSize` 100 per `Sql_Trigger_PollingIntervalMs` 1000
/// (../shared/reference/azure-sql-trigger-facts.md).
const OFFICIAL_DEFAULT_PER_SECOND: f64 = 100.0;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("creates the function folder");
    for entry in std::fs::read_dir(from).expect("reads the template folder").flatten() {
        std::fs::copy(entry.path(), to.join(entry.file_name())).expect("copies a template file");
    }
}

/// The app a deployment of every template would be, loaded for the host, and the example's settings.
struct Shipped {
    _root: tempfile::TempDir,
    app: AppConfig,
    settings: BTreeMap<String, String>,
    function_timeout: Duration,
}

fn shipped() -> Shipped {
    let root = tempfile::tempdir().expect("a temporary app root");
    std::fs::copy(repo().join("host.json"), root.path().join("host.json")).expect("copies host.json");
    std::fs::copy(repo().join("local.settings.json.example"), root.path().join("local.settings.json"))
        .expect("copies the example settings");
    for entry in std::fs::read_dir(repo().join("function-templates")).expect("function-templates/").flatten() {
        copy_dir(&entry.path(), &root.path().join(entry.file_name()));
    }
    let env = Env::default().with_local_settings(root.path()).expect("the example settings are JSON");
    let app = AppConfig::load_for(root.path(), env, Mode::Host)
        .unwrap_or_else(|e| panic!("the shipped templates must load under the host:\n{e}"));
    let example = read_json(&repo().join("local.settings.json.example"));
    let settings = example["Values"]
        .as_object()
        .expect("Values")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
        .collect();
    let timeout = read_json(&repo().join("host.json"))["functionTimeout"].as_str().map(str::to_string);
    let function_timeout = timeout.as_deref().and_then(parse_timespan).expect("host.json sets a functionTimeout");
    Shipped { _root: root, app, settings, function_timeout }
}

/// The most firings of `schedule` that fall within any `window` starting at one of its firings: the batches a
/// function answers in one proof window when every firing finds a full batch. Windows start at every firing of
/// an hour, which covers every schedule that repeats within an hour (the templates' repeat every second).
fn firings_within(schedule: &Schedule, window: Duration) -> u64 {
    let window = time::Duration::try_from(window).expect("a window fits");
    let base = datetime!(2026-01-01 00:00:00);
    let (starts_end, horizon) = (base + time::Duration::HOUR, base + time::Duration::HOUR + window);
    let mut firings = Vec::new();
    let mut at = schedule.next_after(base);
    while at < horizon {
        firings.push(at);
        at = schedule.next_after(at);
    }
    let (mut most, mut end) = (0, 0);
    for (i, start) in firings.iter().enumerate().take_while(|(_, s)| **s < starts_end) {
        while end < firings.len() && firings[end] < *start + window {
            end += 1;
        }
        most = most.max(end - i);
    }
    most as u64
}

/// 6500 → "6,500".
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn secs(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{} s", d.as_secs())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// What one timer function of the templates allows and costs.
#[derive(Debug, PartialEq)]
struct Figures {
    schedule: String,
    batch: u64,
    per_second: f64,
    longest_delay: Duration,
    window: Duration,
    firings: u64,
    redelivered: u64,
}

fn figures(shipped: &Shipped, f: &FunctionConfig) -> Figures {
    let setting = f.timer_schedule.as_deref().expect("a timer schedule");
    let expression = match setting.strip_prefix('%').and_then(|s| s.strip_suffix('%')) {
        Some(name) => shipped.settings.get(name).unwrap_or_else(|| panic!("the example sets {name}")).clone(),
        None => setting.to_string(),
    };
    let schedule = f.schedule.as_ref().expect("loaded for the host, the schedule is resolved");
    let batch = f.settings.max_batch_size as u64;
    let firings = firings_within(schedule, f.proof_window);
    Figures {
        schedule: expression,
        batch,
        per_second: batch as f64 * schedule.firings_per_second(datetime!(2026-01-01 00:00:00)),
        longest_delay: f.retry.as_ref().expect("deferred delivery needs a retry policy").max_delay(),
        window: f.proof_window,
        firings,
        redelivered: firings * batch,
    }
}

#[test]
fn the_templates_load_under_the_host_without_a_warning() {
    let shipped = shipped();
    assert!(
        shipped.app.warnings.is_empty(),
        "the shipped templates must start without a warning (e.g. Sql_Trigger_TickTimeoutMs not below functionTimeout): {:?}",
        shipped.app.warnings
    );
    let names: Vec<&str> = shipped.app.functions.iter().map(|f| f.name.as_str()).collect();
    assert!(names.contains(&"OrdersChanged") && names.contains(&"PgOrdersChanged"), "{names:?}");
    assert_eq!(shipped.app.admin_functions.len(), 1, "SqlTriggerAdmin");
    for f in &shipped.app.functions {
        assert!(
            f.settings.tick_timeout < shipped.function_timeout,
            "{}: the tick must give up before the host",
            f.name
        );
    }
}

#[test]
fn unpartitioned_templates_match_or_beat_the_official_triggers_default_pace() {
    let shipped = shipped();
    for f in shipped.app.functions.iter().filter(|f| !f.partitioning.is_partitioned()) {
        let fig = figures(&shipped, f);
        assert!(
            fig.per_second >= OFFICIAL_DEFAULT_PER_SECOND,
            "{}: {} changes/s ({} per firing on {:?}) falls behind the official trigger's 100 per second",
            f.name,
            fig.per_second,
            fig.batch,
            fig.schedule
        );
    }
}

#[test]
fn the_partitioned_template_is_one_complete_generated_set() {
    let shipped = shipped();
    let mut groups: BTreeMap<&str, Vec<&FunctionConfig>> = BTreeMap::new();
    for f in shipped.app.functions.iter().filter(|f| f.partitioning.is_partitioned()) {
        groups.entry(f.partitioning.group.as_str()).or_default().push(f);
    }
    assert_eq!(groups.keys().copied().collect::<Vec<_>>(), ["PgOrdersPartitioned"]);
    for (group, members) in groups {
        let count = members[0].partitioning.count.get();
        let mut served: Vec<u32> = members.iter().filter_map(|f| f.partitioning.only).collect();
        served.sort_unstable();
        assert_eq!(served, (0..count).collect::<Vec<_>>(), "{group}: every partition served exactly once");
        for f in &members {
            let index = f.partitioning.only.expect("a generated folder names its partition");
            assert_eq!(f.name, format!("{group}-p{index}"), "the name `handler partitions generate` writes");
            assert_eq!(f.partitioning.count.get(), count, "{}: one partition count for the group", f.name);
            assert_eq!(
                figures(&shipped, f),
                figures(&shipped, members[0]),
                "{}: partitions differ only by index",
                f.name
            );
        }
    }
}

/// The rows of the table in docs/operations.md, built from the loaded templates.
fn expected_rows(shipped: &Shipped) -> Vec<String> {
    let timeout = secs(shipped.function_timeout);
    let mut rows = Vec::new();
    let mut partitioned: BTreeMap<String, Vec<&FunctionConfig>> = BTreeMap::new();
    for f in &shipped.app.functions {
        if f.partitioning.is_partitioned() {
            partitioned.entry(f.partitioning.group.clone()).or_default().push(f);
            continue;
        }
        let fig = figures(shipped, f);
        rows.push(format!(
            "| `{}` | `{}` | {} | {} | {timeout} | {} | {} | {} | {} |",
            f.name,
            fig.schedule,
            fig.batch,
            thousands(fig.per_second.round() as u64),
            secs(fig.longest_delay),
            secs(fig.window),
            fig.firings,
            thousands(fig.redelivered),
        ));
    }
    for (group, members) in partitioned {
        let fig = figures(shipped, members[0]);
        let n = members.len() as u64;
        rows.push(format!(
            "| `{group}-p0` … `-p{}` ({n} partitions) | `{}` | {} per partition | {} per partition, {} together | {timeout} | {} | {} | {} per partition | {} per partition, {} together |",
            n - 1,
            fig.schedule,
            fig.batch,
            thousands(fig.per_second.round() as u64),
            thousands((fig.per_second * n as f64).round() as u64),
            secs(fig.longest_delay),
            secs(fig.window),
            fig.firings,
            thousands(fig.redelivered),
            thousands(fig.redelivered * n),
        ));
    }
    rows
}

#[test]
fn docs_state_each_templates_pace_and_restart_cost_as_computed_from_the_shipped_files() {
    let shipped = shipped();
    let docs = std::fs::read_to_string(repo().join("docs/operations.md")).expect("docs/operations.md");
    let missing: Vec<String> =
        expected_rows(&shipped).into_iter().filter(|row| !docs.lines().any(|l| l == row)).collect();
    assert!(
        missing.is_empty(),
        "docs/operations.md (\"The templates: pace and what a restart re-delivers\") must hold these rows, computed from the shipped templates:\n{}",
        missing.join("\n")
    );
}

/// The figures themselves, so a change that moves them is a visible decision here and not only in the docs.
#[test]
fn a_restart_re_delivers_at_most_6500_changes_per_template_function() {
    let shipped = shipped();
    for f in &shipped.app.functions {
        let fig = figures(&shipped, f);
        assert_eq!(fig.window, Duration::from_secs(65), "{}: 30 s functionTimeout + 5 s delay + 30 s slack", f.name);
        assert_eq!((fig.firings, fig.redelivered), (65, 6_500), "{}", f.name);
    }
}

#[test]
fn firings_within_a_window_count_a_schedules_occurrences() {
    let every_second = Schedule::parse("* * * * * *").expect("valid");
    let every_five = Schedule::parse("*/5 * * * * *").expect("valid");
    // The figure the templates had before (docs/architecture.md): 5 min 35 s on */5 is 67 firings.
    assert_eq!(firings_within(&every_five, Duration::from_secs(335)), 67);
    assert_eq!(firings_within(&every_second, Duration::from_secs(65)), 65);
    assert_eq!(firings_within(&every_second, Duration::from_millis(65_500)), 66);
    // Uneven: seconds 0 and 1 of every minute; the worst 2-second window holds both.
    let twice = Schedule::parse("0,1 * * * * *").expect("valid");
    assert_eq!(firings_within(&twice, Duration::from_secs(2)), 2);
    assert_eq!(thousands(26_000), "26,000");
    assert_eq!(thousands(100), "100");
}
