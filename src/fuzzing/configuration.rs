//! The app's configuration as the host hands it over: timer schedules (NCRONTAB) and whole function folders.

use super::secrets::assert_no_secret_verbatim;
use crate::config::{AppConfig, Env};
use std::path::PathBuf;
use std::time::Duration;

/// The timer schedule reader: a schedule it accepts answers, from any of a few base times, an occurrence after
/// the base time with none before it.
pub fn ncrontab(data: &[u8]) {
    use crate::config::ncrontab::Schedule;
    use time::macros::datetime;
    let Ok(text) = std::str::from_utf8(data) else { return };
    let schedule = match Schedule::parse(text) {
        Ok(schedule) => schedule,
        Err(message) => {
            assert!(message.contains("schedule"), "{message}");
            return;
        }
    };
    let end = time::PrimitiveDateTime::new(time::Date::MAX, time::Time::MIDNIGHT);
    for base in [datetime!(2026-11-25 10:00:03.7), datetime!(2028-02-28 23:59:59), datetime!(2026-12-31 23:59:59)] {
        let next = schedule.next_after(base);
        if next == end {
            continue; // a schedule that never fires (31 February) answers the end of time, as NCrontab does
        }
        if schedule == Schedule::Every(Duration::ZERO) {
            // A zero time span ("00:00:00", "00:000:0") parses, as the code means it to (firings_per_second
            // answers 0 for it); its next occurrence is its base time. Whether the host accepts it is open.
            assert_eq!(next, base);
            continue;
        }
        assert!(next > base, "{text:?}: after {base} comes {next}");
        if let Schedule::Cron(_) = schedule {
            assert_eq!(next.nanosecond(), 0, "{text:?}: occurrences are on whole seconds");
            let just_before = next - Duration::from_secs(1);
            if just_before > base {
                assert_eq!(schedule.next_after(just_before), next, "{text:?}: an occurrence was skipped after {base}");
            }
        }
    }
    if let Schedule::Every(every) = schedule {
        let pace = schedule.firings_per_second(datetime!(2026-11-25 10:00:00));
        assert!(pace.is_finite() && pace >= 0.0, "{text:?} ({every:?}): pace {pace}");
    }
}

/// The secrets the configuration target always sets, none of which may appear in an error or in `Debug`.
const PG_SECRET: &str = "Pg~Secret~0451";
const SQL_SECRET: &str = "Sql~Secret~0452";
const STORAGE_KEY: &str = "U3RvcmFnZX5LZXl+MDQ1Mw==";
const ADMIN_SECRET: &str = "Admin~Key~0454";

/// The function-folder configuration: the input is function.json, sqltrigger.json, host.json and app settings
/// (`Name=value` lines), separated by 0xFF bytes (which UTF-8 text never holds); a part that is absent leaves
/// its file out. Loading either succeeds or lists problems that each name a setting or file, and neither the
/// problems nor the loaded configuration's `Debug` holds a secret.
pub fn function_config(data: &[u8]) {
    let mut parts = data.split(|b| *b == 0xFF);
    let (function_json, sqltrigger_json, host_json, settings) =
        (parts.next(), parts.next(), parts.next(), parts.next());
    let root = scratch_root();
    let dir = root.join("Orders");
    for (path, part) in [
        (dir.join("function.json"), function_json),
        (dir.join("sqltrigger.json"), sqltrigger_json),
        (root.join("host.json"), host_json),
    ] {
        match part {
            Some(bytes) => std::fs::write(&path, bytes).expect("the scratch folder is writable"),
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let mut env: Vec<(String, String)> = vec![
        ("Pg".into(), format!("postgres://app:{PG_SECRET}@127.0.0.1:1/db")),
        ("Sql".into(), format!("Server=tcp:127.0.0.1,1;Database=d;User ID=u;Password={SQL_SECRET}")),
        (
            "AzureWebJobsStorage".into(),
            format!("DefaultEndpointsProtocol=https;AccountName=acct;AccountKey={STORAGE_KEY}"),
        ),
        ("Sql_Trigger_AdminKey".into(), ADMIN_SECRET.into()),
    ];
    if let Some(settings) = settings {
        for line in String::from_utf8_lossy(settings).lines() {
            if let Some((name, value)) = line.split_once('=') {
                env.push((name.to_string(), value.to_string()));
            }
        }
    }
    let env = Env::from_pairs(env);
    // Each secret, unless the input holds it too (then a message may quote it from where the input put it) or
    // overrides its setting.
    let checked: Vec<&str> = [
        ("Pg", PG_SECRET),
        ("Sql", SQL_SECRET),
        ("AzureWebJobsStorage", STORAGE_KEY),
        ("Sql_Trigger_AdminKey", ADMIN_SECRET),
    ]
    .into_iter()
    .filter(|(name, secret)| {
        env.get(name).is_some_and(|v| v.contains(secret)) && !data.windows(secret.len()).any(|w| w == secret.as_bytes())
    })
    .map(|(_, secret)| secret)
    .collect();
    match AppConfig::load_from(&root, env) {
        Err(errors) => {
            assert!(!errors.0.is_empty(), "a refusal without a problem");
            for e in &errors.0 {
                assert!(!e.setting.is_empty() && !e.problem.is_empty(), "{e:?}");
            }
            assert_no_secret_verbatim("the refusal", &errors.to_string(), &checked);
        }
        Ok(config) => {
            assert_no_secret_verbatim("Debug of the configuration", &format!("{config:?}"), &checked);
            for warning in &config.warnings {
                assert_no_secret_verbatim("a warning", &warning.to_string(), &checked);
            }
        }
    }
}

/// A folder of this process's own for [`function_config`], with the function folder in it.
fn scratch_root() -> PathBuf {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let root = std::env::temp_dir().join(format!("spt-fuzz-config-{}", std::process::id()));
        std::fs::create_dir_all(root.join("Orders")).expect("a scratch folder");
        root
    })
    .clone()
}
