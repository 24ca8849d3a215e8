//! Whole apps loaded from folders: what deferred delivery needs of the host's retry policy and timeout, the
//! timer's schedule, and what start-up refuses about output bindings.

mod retry {
    //! What deferred delivery needs of function.json's retry policy and host.json's functionTimeout.
    use super::super::*;
    use std::time::Duration;

    /// Loads an app with one PostgreSQL function whose function.json has `retry`, under `host` and `settings`.
    fn load(retry: serde_json::Value, host: serde_json::Value, settings: &[(&str, &str)]) -> Result<AppConfig, String> {
        let root = std::env::temp_dir().join(format!("spt-retry-{}", uuid::Uuid::new_v4().simple()));
        write_test_app(&root, "Orders");
        let function = root.join("Orders/function.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&function).expect("function.json")).expect("JSON");
        json["retry"] = retry;
        std::fs::write(&function, json.to_string()).expect("write");
        std::fs::write(root.join("host.json"), host.to_string()).expect("host.json");
        let mut pairs = vec![("Pg".to_string(), "postgres://nobody@127.0.0.1:1/none".to_string())];
        pairs.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let loaded = AppConfig::load_from(&root, Env::from_pairs(pairs)).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&root);
        loaded
    }

    fn fixed(max: i64, delay: &str) -> serde_json::Value {
        serde_json::json!({ "strategy": "fixedDelay", "maxRetryCount": max, "delayInterval": delay })
    }

    #[test]
    fn the_proof_window_is_the_hosts_timeout_plus_its_longest_retry_delay_plus_slack() {
        let host = serde_json::json!({ "version": "2.0", "functionTimeout": "00:05:00" });
        let app = load(fixed(5, "00:00:05"), host.clone(), &[]).expect("valid");
        assert_eq!(app.functions[0].proof_window, Duration::from_secs(300 + 5 + 30));
        let backoff = serde_json::json!({ "strategy": "exponentialBackoff", "maxRetryCount": 5,
            "minimumInterval": "00:00:05", "maximumInterval": "00:05:00" });
        assert_eq!(
            load(backoff, host.clone(), &[]).expect("valid").functions[0].proof_window,
            Duration::from_secs(300 + 300 + 30)
        );
        // Without functionTimeout: the plan's default (5 minutes on Consumption, 30 elsewhere)
        let bare = serde_json::json!({ "version": "2.0" });
        let consumption = load(fixed(5, "00:00:05"), bare.clone(), &[("WEBSITE_SKU", "Dynamic")]).expect("valid");
        assert_eq!(consumption.functions[0].proof_window, Duration::from_secs(335));
        let premium = load(fixed(5, "00:00:05"), bare, &[("WEBSITE_SKU", "ElasticPremium")]).expect("valid");
        assert_eq!(premium.functions[0].proof_window, Duration::from_secs(1835));
        // An explicit setting wins
        let set = load(fixed(5, "00:00:05"), host, &[("Sql_Trigger_ProofWindowMs", "1500")]).expect("valid");
        assert_eq!(set.functions[0].proof_window, Duration::from_millis(1500));
    }

    #[test]
    fn the_connections_per_database_are_10_unless_set_from_1_to_1000_and_anything_else_is_refused() {
        let host = serde_json::json!({ "version": "2.0", "functionTimeout": "00:05:00" });
        assert_eq!(load(fixed(5, "00:00:05"), host.clone(), &[]).expect("valid").max_connections_per_database, 10);
        let set = [("Sql_Trigger_MaxConnectionsPerDatabase", "3")];
        assert_eq!(load(fixed(5, "00:00:05"), host.clone(), &set).expect("valid").max_connections_per_database, 3);
        for bad in ["0", "1001", "ten", "-1"] {
            let set = [("Sql_Trigger_MaxConnectionsPerDatabase", bad)];
            let err = load(fixed(5, "00:00:05"), host.clone(), &set).expect_err("refused");
            assert!(
                err.contains("app setting Sql_Trigger_MaxConnectionsPerDatabase")
                    && err.contains("must be a whole number from 1 to 1000"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn a_policy_deferred_delivery_cannot_work_with_is_refused_naming_the_fix() {
        let host = serde_json::json!({ "version": "2.0", "functionTimeout": "00:05:00" });
        let zero = load(fixed(0, "00:00:05"), host.clone(), &[]).expect_err("refused");
        assert!(zero.contains("maxRetryCount is 0") && zero.contains("at least one retry"), "{zero}");
        let strategy = serde_json::json!({ "strategy": "linear", "maxRetryCount": 3 });
        let err = load(strategy, host.clone(), &[]).expect_err("refused");
        assert!(err.contains("retry.strategy") && err.contains("fixedDelay or exponentialBackoff"), "{err}");
        let err = load(fixed(3, "five seconds"), host.clone(), &[]).expect_err("refused");
        assert!(err.contains("retry.delayInterval") && err.contains("00:00:05"), "{err}");
        let err = load(fixed(3, "00:00:05"), serde_json::json!({ "functionTimeout": "later" }), &[]).expect_err("x");
        assert!(err.contains("host.json functionTimeout"), "{err}");
    }

    /// Loads the test app with its timer schedule set to `schedule`, under the app settings `settings`.
    fn with_schedule(schedule: &str, settings: &[(&str, &str)]) -> Result<AppConfig, String> {
        let root = std::env::temp_dir().join(format!("spt-schedule-{}", uuid::Uuid::new_v4().simple()));
        write_test_app(&root, "Orders");
        let function = root.join("Orders/function.json");
        let mut json: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&function).expect("function.json")).expect("JSON");
        json["bindings"][0]["schedule"] = schedule.into();
        std::fs::write(&function, json.to_string()).expect("write");
        let mut pairs = vec![("Pg".to_string(), "postgres://nobody@127.0.0.1:1/none".to_string())];
        pairs.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let loaded = AppConfig::load_from(&root, Env::from_pairs(pairs)).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&root);
        loaded
    }

    #[test]
    fn the_timer_schedule_is_read_as_the_host_reads_it_and_a_bad_one_is_refused() {
        let app = with_schedule("%Orders_Schedule%", &[("Orders_Schedule", "*/10 * * * * *")]).expect("valid");
        assert_eq!(app.functions[0].schedule, Some(ncrontab::Schedule::parse("*/10 * * * * *").expect("valid")));
        let err = with_schedule("%Orders_Schedule%", &[]).expect_err("unset");
        assert!(err.contains("references app setting %Orders_Schedule%, which is not set"), "{err}");
        let err = with_schedule("*/5 * * * * 7", &[]).expect_err("day 7");
        assert!(
            err.contains("Orders/function.json: schedule \"*/5 * * * * 7\" is not a valid NCRONTAB expression: 7 is out of range in the day of week field"),
            "{err}"
        );
    }

    #[test]
    fn settings_that_would_misbehave_under_the_host_are_warned_about_at_start() {
        // GIVEN one firing's retries reaching MaxAttempts with no poison duration, and an unbounded timeout
        let unbounded = serde_json::json!({ "version": "2.0", "functionTimeout": "-1" });
        let app = load(fixed(5, "00:00:05"), unbounded, &[("Sql_Trigger_PoisonAfterMs", "0")]).expect("valid");
        let warnings: Vec<String> = app.warnings.iter().map(ToString::to_string).collect();
        // THEN each is named with its fix
        assert!(warnings
            .iter()
            .any(|w| w.contains("can reach Sql_Trigger_MaxAttempts") && w.contains("PoisonAfterMs")));
        assert!(warnings.iter().any(|w| w.contains("functionTimeout") && w.contains("30 min")), "{warnings:?}");
        assert_eq!(app.functions[0].proof_window, Duration::from_secs(30 * 60 + 5 + 30));
        // AND a tick timeout set at or above a functionTimeout the host would cut first is warned about too
        let short = serde_json::json!({ "version": "2.0", "functionTimeout": "00:01:00" });
        let set = [("Sql_Trigger_TickTimeoutMs", "60000")];
        let app = load(fixed(5, "00:00:05"), short.clone(), &set).expect("valid");
        assert!(app.warnings.iter().any(|w| w.to_string().contains("Sql_Trigger_TickTimeoutMs")), "{:?}", app.warnings);
        // AND left unset, it is two thirds of that functionTimeout, with nothing to warn about
        let app = load(fixed(5, "00:00:05"), short, &[]).expect("valid");
        assert!(app.warnings.is_empty(), "{:?}", app.warnings);
        assert_eq!(app.functions[0].settings.tick_timeout, Duration::from_secs(40));
        // AND the shipped defaults warn about nothing
        let default = serde_json::json!({ "version": "2.0", "functionTimeout": "00:05:00" });
        assert!(load(fixed(5, "00:00:05"), default, &[]).expect("valid").warnings.is_empty());
    }
}

mod outputs {
    //! What start-up refuses about output bindings the host would feed wrongly.
    use super::super::*;

    /// Loads an app with one PostgreSQL function whose function.json also has `extra` output bindings and
    /// whose sqltrigger.json has `options` merged in.
    pub(super) fn load(extra: serde_json::Value, options: serde_json::Value) -> Result<AppConfig, String> {
        let root = std::env::temp_dir().join(format!("spt-outputs-{}", uuid::Uuid::new_v4().simple()));
        write_test_app(&root, "Orders");
        let edit = |file: &str, change: &dyn Fn(&mut serde_json::Value)| {
            let path = root.join("Orders").join(file);
            let mut json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&path).expect("read")).expect("JSON");
            change(&mut json);
            std::fs::write(&path, json.to_string()).expect("write");
        };
        edit("function.json", &|f| {
            let bindings = f["bindings"].as_array_mut().expect("bindings");
            bindings.extend(extra.as_array().cloned().unwrap_or_default());
        });
        edit("sqltrigger.json", &|t| {
            let object = t.as_object_mut().expect("object");
            object.extend(options.as_object().cloned().unwrap_or_default());
        });
        std::fs::write(root.join("host.json"), r#"{"version":"2.0","functionTimeout":"00:05:00"}"#).expect("host.json");
        let env = Env::from_pairs([("Pg".to_string(), "postgres://nobody@127.0.0.1:1/none".to_string())]);
        let loaded = AppConfig::load_from(&root, env).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&root);
        loaded
    }

    #[test]
    fn a_blob_output_without_a_unique_name_is_refused_and_a_timed_one_warned_about() {
        let blob =
            |path: &str| serde_json::json!([{"type": "blob", "direction": "out", "name": "archive", "path": path}]);
        let err = load(blob("archive/batch.json"), serde_json::json!({})).expect_err("refused");
        assert!(err.contains("bindings.archive.path in Orders/function.json") && err.contains("{rand-guid}"), "{err}");
        let app = load(blob("archive/{DateTime}.json"), serde_json::json!({})).expect("valid");
        assert!(app.warnings.iter().any(|w| w.to_string().contains("once a second")), "{:?}", app.warnings);
        let app = load(blob("archive/{rand-guid}.json"), serde_json::json!({})).expect("valid");
        assert!(app.warnings.is_empty(), "{:?}", app.warnings);
        // AND in sink mode the blob binding receives nothing from the handler, so its path does not matter
        let sink =
            serde_json::json!({"deliveryMode": "sink", "sink": {"type": "webhook", "url": "http://127.0.0.1:1/"}});
        load(blob("archive/batch.json"), sink).expect("valid");
    }

    #[test]
    fn text_messages_are_refused_for_a_sql_output_which_would_drop_them() {
        let sql = serde_json::json!([{"type": "sql", "direction": "out", "name": "copy", "commandText": "dbo.Copy",
            "connectionStringSetting": "Sql"}]);
        let err = load(sql.clone(), serde_json::json!({"messageFormat": "text"})).expect_err("refused");
        assert!(err.contains("messageFormat for Orders: is text, but output binding \"copy\" is sql"), "{err}");
        assert!(err.contains("deliveryMode sink"), "{err}");
        let app = load(sql, serde_json::json!({})).expect("json is the default and fine");
        assert_eq!(app.functions[0].settings.message_format, MessageFormat::Json);
        let app = load(serde_json::json!([]), serde_json::json!({"messageFormat": "TEXT"})).expect("valid");
        assert_eq!(app.functions[0].settings.message_format, MessageFormat::Text);
    }
}

mod typed {
    //! sqltrigger.json is typed once, at load: each kind's own keys and the sink, with their mistakes in the one
    //! list of problems.
    use super::super::*;
    use super::outputs::load;
    use serde_json::json;

    #[test]
    fn the_source_and_the_sink_are_typed_at_load() {
        let sink =
            json!({"type": "postgres", "tableName": "copy", "connectionStringSetting": "Pg", "exactlyOnce": true});
        let app = load(json!([]), json!({"cursorGuard": "lag", "deliveryMode": "sink", "sink": sink})).expect("valid");
        let f = &app.functions[0];
        let SourceOptions::PostgresCursor(cursor) = &f.source.options else { panic!("{:?}", f.source.options) };
        assert_eq!((cursor.cursor_column.as_str(), cursor.cursor_guard), ("version", Some(CursorGuard::Lag)));
        assert_eq!(cursor.safety_lag, std::time::Duration::from_secs(5));
        let Some(SinkSpec::Postgres(target)) = &f.sink else { panic!("{:?}", f.sink) };
        assert_eq!(
            target.checkpoint_table.as_ref().map(ToString::to_string).as_deref(),
            Some("sql_pseudo_trigger_checkpoint")
        );
        assert!(!f.partitioning.is_partitioned());
        // AND the host's bindings deliver a deferred function, whose sink is neither read nor built
        let app = load(json!([]), json!({"sink": {"type": "webhook"}})).expect("valid");
        assert!(app.functions[0].sink.is_none());
    }

    #[test]
    fn the_kinds_own_keys_and_the_sinks_are_checked_at_load_in_the_one_list() {
        // GIVEN a logical source with a bad slot name and a cursor key, and a sink with a misspelt key
        let err = load(
            json!([]),
            json!({"source": "postgres-logical", "slotName": "Bad-Name", "deliveryMode": "sink",
                "sink": {"type": "postgres", "tableName": "copy", "connectionStringSetting": "Pg", "exactlyonce": true}}),
        )
        .expect_err("refused");
        // THEN each is named, with its file, before any source or sink is built
        assert!(err.contains("slotName in Orders/sqltrigger.json: is \"Bad-Name\"; use 1 to 63 lower-case"), "{err}");
        assert!(err.contains("cursorColumn in Orders/sqltrigger.json: is for postgres-cursor"), "{err}");
        assert!(err.contains("sink in Orders/sqltrigger.json: unknown key \"exactlyonce\""), "{err}");
        // AND "partitions" under the host names the command that writes a folder per partition
        let err = load(json!([]), json!({"partitions": 2})).expect_err("refused");
        assert!(err.contains("handler partitions generate Orders 2"), "{err}");
    }

    #[test]
    fn a_partition_column_travels_typed_to_a_rowversion_partition_and_is_refused_without_partitions() {
        // GIVEN the folder of partition 1 of 4 of a rowversion function naming its partition column
        let rowversion = json!({"source": "mssql-rowversion", "tableName": "dbo.Items", "partitions": 4,
            "partition": 1, "partitionGroup": "Orders", "partitionColumn": "sqltrigger_p4"});
        let app = load(json!([]), rowversion).expect("valid");
        // THEN its one partition trigger's source reads partition 1 of 4 through the column
        let triggers = app.functions[0].partition_triggers();
        let source = &triggers[0].source;
        assert_eq!(source.partition.map(|p| (p.index, p.count.get())), Some((1, 4)));
        let SourceOptions::MssqlRowversion(options) = &source.options else { panic!("{:?}", source.options) };
        assert_eq!(options.partition_column.as_ref().map(|c| c.as_str()), Some("sqltrigger_p4"));
        // AND without partitions the key is refused, naming why
        let err =
            load(json!([]), json!({"source": "mssql-rowversion", "tableName": "dbo.Items", "partitionColumn": "p"}))
                .expect_err("refused");
        assert!(err.contains("partitionColumn in Orders/sqltrigger.json: names the computed column"), "{err}");
    }
}
