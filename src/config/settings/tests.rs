use super::*;
use crate::config::Env;
use std::time::Duration;

fn env(pairs: &[(&str, &str)]) -> Env {
    Env::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
}

#[test]
fn defaults_match_the_official_trigger() {
    let e = env(&[]);
    let mut errors = vec![];
    let s = Resolver { env: &e, host_sql: None, function: None }.trigger_settings(&mut errors);
    assert!(errors.is_empty());
    assert_eq!(s.max_batch_size, 100);
    assert_eq!(s.polling_interval, Duration::from_millis(1000));
    assert_eq!(s.max_changes_per_worker, 1000);
    assert_eq!(s.max_attempts, 5);
    assert_eq!(s.delivery_mode, DeliveryMode::Deferred);
    assert_eq!(s.message_format, MessageFormat::Json, "the official payload shape, as JSON values");
}

#[test]
fn app_settings_beat_host_json_and_sqltrigger_json_beats_both() {
    let host = serde_json::json!({"maxBatchSize": 7, "pollingIntervalMs": 50});
    let e = env(&[("Sql_Trigger_MaxBatchSize", "30")]);
    let mut errors = vec![];
    let s = Resolver { env: &e, host_sql: Some(&host), function: None }.trigger_settings(&mut errors);
    assert_eq!((s.max_batch_size, s.polling_interval.as_millis()), (30, 50));
    let f = serde_json::json!({"maxBatchSize": 3});
    let f = f.as_object().expect("object");
    let s = Resolver { env: &e, host_sql: Some(&host), function: Some(("f/sqltrigger.json", f)) }
        .trigger_settings(&mut errors);
    assert_eq!(s.max_batch_size, 3);
    assert!(errors.is_empty());
}

#[test]
fn the_deprecated_batch_size_alias_still_works() {
    let e = env(&[("Sql_Trigger_BatchSize", "42")]);
    let mut errors = vec![];
    let s = Resolver { env: &e, host_sql: None, function: None }.trigger_settings(&mut errors);
    assert_eq!(s.max_batch_size, 42);
}

#[test]
fn log_levels_take_the_hosts_names_and_tracings_and_refuse_anything_else() {
    for (given, filter) in [
        ("Trace", "trace"),
        ("DEBUG", "debug"),
        ("Information", "info"),
        ("information", "info"),
        ("Warning", "warn"),
        ("Error", "error"),
        ("Critical", "error"),
        ("None", "off"),
        ("info", "info"),
        ("warn", "warn"),
        ("off", "off"),
        (" info , sql_pseudo_trigger=Debug ", "info,sql_pseudo_trigger=debug"),
        ("warn,sql_pseudo_trigger::engine=trace", "warn,sql_pseudo_trigger::engine=trace"),
    ] {
        assert_eq!(log_filter(given).as_deref(), Ok(filter), "{given:?}");
        assert!(tracing_subscriber::EnvFilter::try_new(filter).is_ok(), "{filter}");
    }
    for bad in
        ["verbose", "-0", "0", "Informational", "info,verbose", "=debug", "x=loud", ",", "info;debug", "a b=info"]
    {
        let e = log_filter(bad).expect_err(bad).to_string();
        assert!(e.contains("Sql_Trigger_LogLevel") && e.contains("Information"), "{bad:?}: {e}");
    }
}

#[test]
fn every_bad_value_is_reported_with_its_setting() {
    let e = env(&[
        ("Sql_Trigger_MaxBatchSize", "0"),
        ("Sql_Trigger_PollingIntervalMs", "-5"),
        ("Sql_Trigger_DeliveryMode", "yolo"),
    ]);
    let mut errors = vec![];
    Resolver { env: &e, host_sql: None, function: None }.trigger_settings(&mut errors);
    let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(errors.len(), 3, "{text:?}");
    assert!(text[0].contains("Sql_Trigger_MaxBatchSize") && text[0].contains("1 to 100000"));
    assert!(text[1].contains("Sql_Trigger_PollingIntervalMs"));
    assert!(text[2].contains("deferred, immediate, sink"));
}

#[test]
fn the_readme_configuration_reference_matches_the_code() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
    let begin = "<!-- settings:begin -->\n";
    let start = readme.find(begin).expect("begin marker") + begin.len();
    let end = readme.find("<!-- settings:end -->").expect("end marker");
    assert_eq!(
        &readme[start..end],
        reference_markdown(),
        "README.md's configuration reference is stale: regenerate it with `handler settings`"
    );
}
