//! A misconfigured app fails at start with one message that lists every problem, naming each setting or
//! file, and never prints a secret; and what the handler logs reaches the host's log at the right level.

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

/// Reads `pipe` line by line into `lines` until it closes.
fn collect(pipe: impl std::io::Read + Send + 'static, lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(pipe).lines().map_while(Result::ok) {
            lines.lock().expect("lines").push(line);
        }
    });
}

#[test]
fn warnings_and_errors_go_to_stderr_and_everything_else_to_stdout_as_the_host_files_them() {
    // GIVEN an app that starts, warns at start (certificates not verified) and fails its start-up check
    // (nothing listens where the database should be)
    let state = testbed::embedded::ScratchDir::new("levels").expect("scratch");
    let app = AppBuilder::new()
        .function(
            "Orders",
            timer_function_json(Some(3)),
            Some(json!({ "source": "postgres-cursor", "tableName": "orders", "connectionStringSetting": "Pg", "cursorColumn": "version" })),
        )
        .write();
    let mut child = Command::new(support::handler_exe())
        .env_clear()
        .env("FUNCTIONS_APP_ROOT_PATH", app.root())
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", "0")
        .env("Pg", "postgres://app:pw@127.0.0.1:1/db?connect_timeout=1")
        .env("Sql_Trigger_StateStore", "file")
        .env("Sql_Trigger_StateDirectory", state.path())
        .env("Sql_Trigger_PostgresTrustServerCertificate", "true")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("the handler starts");
    let (stdout, stderr) = (std::sync::Arc::default(), std::sync::Arc::default());
    collect(child.stdout.take().expect("stdout"), std::sync::Arc::clone(&stdout));
    collect(child.stderr.take().expect("stderr"), std::sync::Arc::clone(&stderr));
    let has = |lines: &std::sync::Arc<std::sync::Mutex<Vec<String>>>, text: &str| {
        lines.lock().expect("lines").iter().any(|l| l.contains(text))
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !(has(&stdout, "handler ready") && has(&stderr, "start-up check failed")) {
        assert!(std::time::Instant::now() < deadline, "stdout {stdout:?}\nstderr {stderr:?}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();

    // THEN the warning and the error are on stderr, where the host files a line with "warn" as a Warning and any
    // other as an Error; the information lines are on stdout, all of which the host files as Information
    let stderr = stderr.lock().expect("lines").clone();
    let stdout = stdout.lock().expect("lines").clone();
    assert!(stderr.iter().any(|l| l.contains(" WARN ") && l.contains("Sql_Trigger_PostgresTrustServerCertificate")));
    assert!(stderr.iter().any(|l| l.contains("ERROR") && l.contains("start-up check failed")));
    assert!(stderr.iter().all(|l| l.contains(" WARN ") || l.contains("ERROR")), "{stderr:#?}");
    assert!(stdout.iter().all(|l| !l.contains(" WARN ") && !l.contains("ERROR")), "{stdout:#?}");
}
