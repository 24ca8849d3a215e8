//! A misconfigured app fails at start with one message that lists every problem, naming each setting or
//! file, and never prints a secret.

use crate::support::{self, timer_function_json, AppBuilder};
use serde_json::json;
use std::process::Command;

fn start_and_fail(app: &support::AppFolder, env: &[(&str, &str)]) -> String {
    let mut command = Command::new(support::handler_exe());
    command
        .env_clear()
        .env("FUNCTIONS_APP_ROOT_PATH", app.root())
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", "0")
        .env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command.output().expect("the handler runs");
    assert!(!output.status.success(), "a bad configuration must not start");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn every_problem_is_reported_at_once_with_its_setting_and_no_secret() {
    let app = AppBuilder::new()
        .function(
            "Orders",
            timer_function_json(Some(3)),
            Some(json!({
                "source": "postgres-cursor",
                "tableName": "a.b.c",
                "connectionStringSetting": "Pg",
                "cursorColumn": "version",
                "maxBatchSzie": 10
            })),
        )
        .function(
            "NoRetry",
            timer_function_json(None),
            Some(json!({ "source": "postgres-cursor", "tableName": "t", "connectionStringSetting": "Missing", "cursorColumn": "v" })),
        )
        .function("Lonely", timer_function_json(Some(3)), None)
        .write();
    let stderr = start_and_fail(
        &app,
        &[
            ("Pg", "postgres://app:TopSecretPassword@127.0.0.1/db"),
            ("Sql_Trigger_MaxBatchSize", "0"),
            ("Sql_Trigger_PoisonAction", "explode"),
        ],
    );
    for expected in [
        "Sql_Trigger_MaxBatchSize",
        "Sql_Trigger_PoisonAction",
        "tableName in Orders/sqltrigger.json",
        "unknown key \"maxBatchSzie\"",
        "NoRetry/function.json",
        "retry policy",
        "\"Missing\", which is not set",
        "Lonely/sqltrigger.json",
    ] {
        assert!(stderr.contains(expected), "missing {expected:?} in:\n{stderr}");
    }
    assert!(!stderr.contains("TopSecretPassword"), "a secret leaked:\n{stderr}");
}

#[test]
fn a_bad_port_is_a_clear_error() {
    let app = AppBuilder::new().write();
    let mut command = Command::new(support::handler_exe());
    command.env("FUNCTIONS_APP_ROOT_PATH", app.root()).env("FUNCTIONS_CUSTOMHANDLER_PORT", "http");
    let output = command.output().expect("runs");
    assert!(!output.status.success());
    let all = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(all.contains("FUNCTIONS_CUSTOMHANDLER_PORT"), "{all}");
}
