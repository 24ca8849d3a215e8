//! `Sql_Trigger_LogLevel` through the real binary: the Functions host's level names (as host.json spells them,
//! any case) and tracing's set the level; anything else stops the handler at start with a message on stderr;
//! and every refusal to start is printed whatever the level, `None` included.

use crate::common::{http, read_all};
use crate::support::{self, timer_function_json, AppBuilder, AppFolder};
use serde_json::json;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An app whose one function's database is unreachable (its start-up check fails at once) and whose state is on
/// local disk, so the handler starts with nothing but this machine.
fn app() -> (AppFolder, testbed::embedded::ScratchDir) {
    let state = testbed::embedded::ScratchDir::new("log-levels").expect("scratch");
    (orders_app().write(), state)
}

/// The app's one function, for callers that add files.
fn orders_app() -> AppBuilder {
    AppBuilder::new().function(
        "Orders",
        timer_function_json(Some(3)),
        Some(json!({ "source": "postgres-cursor", "tableName": "orders", "connectionStringSetting": "Pg", "cursorColumn": "version" })),
    )
}

fn command(app: &AppFolder, state: &testbed::embedded::ScratchDir, port: u16, level: &str) -> Command {
    let mut command = Command::new(support::handler_exe());
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FUNCTIONS_APP_ROOT_PATH", app.root())
        .env("FUNCTIONS_CUSTOMHANDLER_PORT", port.to_string())
        .env("Pg", "postgres://app:pw@127.0.0.1:1/db?connect_timeout=1")
        .env("Sql_Trigger_StateStore", "file")
        .env("Sql_Trigger_StateDirectory", state.path())
        .env("Sql_Trigger_LogLevel", level)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

struct Run {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Run {
    fn text(&self) -> (String, String) {
        (self.stdout.lock().expect("stdout").clone(), self.stderr.lock().expect("stderr").clone())
    }

    /// Waits until `done` holds for (stdout, stderr), failing with both after 20 s.
    fn wait_for(&self, what: &str, done: impl Fn(&str, &str) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (out, err) = self.text();
            if done(&out, &err) {
                return;
            }
            assert!(Instant::now() < deadline, "waiting for {what}\nstdout:\n{out}\nstderr:\n{err}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the handler and returns all it printed.
    fn stop(mut self) -> (String, String) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The pipes close with the process: wait for the readers to see the end.
        let deadline = Instant::now() + Duration::from_secs(10);
        while Arc::strong_count(&self.stdout) + Arc::strong_count(&self.stderr) > 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.text()
    }
}

/// Starts the handler at `level`, waits until it answers the readiness probe, and sends it one request that is
/// not a host invocation, which it refuses (400) after logging a warning.
fn start_and_refuse_one_request(level: &str) -> Run {
    let (app, state) = app();
    let port = testbed::embedded::free_port().expect("a free port");
    let mut child = command(&app, &state, port, level).spawn().expect("the handler starts");
    let stdout = read_all(child.stdout.take().expect("stdout"));
    let stderr = read_all(child.stderr.take().expect("stderr"));
    let mut run = Run { child, stdout, stderr };
    let deadline = Instant::now() + Duration::from_secs(20);
    while http(port, "GET /", "", "") != Some(200) {
        if let Ok(Some(status)) = run.child.try_wait() {
            let (out, err) = run.text();
            panic!(
                "level {level:?}: the handler exited ({status}) instead of starting\nstdout:\n{out}\nstderr:\n{err}"
            );
        }
        assert!(Instant::now() < deadline, "level {level:?}: the handler never answered GET /");
        std::thread::sleep(Duration::from_millis(20));
    }
    let status = http(
        port,
        "POST /Orders",
        "X-Azure-Functions-InvocationId: 5d3f3c2e-41b4-4c1a-9d0e-2b7c6a1f9e10\r\nContent-Type: application/json\r\n",
        "not json",
    );
    assert_eq!(status, Some(400), "level {level:?}");
    // Keep the folders until the process is gone.
    std::mem::forget((app, state));
    run
}

const READY: &str = "handler ready";
const REFUSED: &str = "refused a request that is not a host invocation";
const CHECK_FAILED: &str = "start-up check failed";

#[test]
fn the_hosts_level_names_and_tracings_set_the_level_in_any_case() {
    // Information and below: the readiness line (Information) and the warning for the refused request.
    for level in ["Trace", "debug", "Information", "INFORMATION", "info"] {
        let run = start_and_refuse_one_request(level);
        run.wait_for("the start-up check's error", |_, err| err.contains(CHECK_FAILED));
        let (out, err) = run.stop();
        assert!(out.contains(READY), "level {level:?}: no {READY:?} on stdout:\n{out}\nstderr:\n{err}");
        assert!(err.contains(REFUSED), "level {level:?}: no warning on stderr:\n{err}");
    }
    // Warning: the warning and the error, no information.
    for level in ["Warning", "warning", "warn"] {
        let run = start_and_refuse_one_request(level);
        run.wait_for("the start-up check's error", |_, err| err.contains(CHECK_FAILED));
        let (out, err) = run.stop();
        assert!(err.contains(REFUSED), "level {level:?}: no warning on stderr:\n{err}");
        assert!(!out.contains(READY), "level {level:?}: an information line was logged:\n{out}");
    }
    // Error and Critical: the error only.
    for level in ["Error", "critical", "Critical"] {
        let run = start_and_refuse_one_request(level);
        run.wait_for("the start-up check's error", |_, err| err.contains(CHECK_FAILED));
        let (out, err) = run.stop();
        assert!(!err.contains(REFUSED), "level {level:?}: a warning was logged:\n{err}");
        assert!(!out.contains(READY), "level {level:?}: an information line was logged:\n{out}");
    }
    // None: nothing at all, though the handler serves (it answered the probe and refused the request).
    for level in ["None", "none", "off"] {
        let (out, err) = start_and_refuse_one_request(level).stop();
        assert!(out.is_empty() && err.is_empty(), "level {level:?} logged:\nstdout:\n{out}\nstderr:\n{err}");
    }
}

#[test]
fn a_value_that_is_not_a_level_stops_the_handler_with_a_message_on_stderr() {
    let (app, state) = app();
    for bad in ["verbose", "-0", "Informational", "info,verbose", "0", "sql_pseudo_trigger=loud"] {
        let output = command(&app, &state, 0, bad).stdout(Stdio::piped()).output().expect("the handler runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{bad:?} started the handler; stderr:\n{stderr}");
        assert!(
            stderr.contains("Sql_Trigger_LogLevel")
                && stderr.contains(&format!("{bad:?}"))
                && stderr.contains("Information"),
            "{bad:?}: the refusal does not name the setting, the value and the accepted names:\n{stderr}"
        );
    }
}

#[test]
fn every_refusal_to_start_is_printed_whatever_the_level() {
    let (app, state) = app();
    for level in ["None", "Critical", "Error"] {
        // A configuration error.
        let output = command(&app, &state, 0, level).env("Sql_Trigger_MaxBatchSize", "0").output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(stderr.contains("Sql_Trigger_MaxBatchSize"), "level {level:?}: the refusal is missing:\n{stderr}");
        // A port the host would never set.
        let output =
            command(&app, &state, 0, level).env("FUNCTIONS_CUSTOMHANDLER_PORT", "http").output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(stderr.contains("FUNCTIONS_CUSTOMHANDLER_PORT"), "level {level:?}: the refusal is missing:\n{stderr}");
        // A port taken by someone else.
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = taken.local_addr().expect("address").port();
        let output = command(&app, &state, port, level).output().expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(stderr.contains(&format!("cannot listen on 127.0.0.1:{port}")), "level {level:?}:\n{stderr}");
        // `handler run`, whose settings may come from local.settings.json.
        let output = command(&app, &state, 0, level)
            .arg("run")
            .arg("--once")
            .env("Sql_Trigger_MaxBatchSize", "0")
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success());
        assert!(stderr.contains("Sql_Trigger_MaxBatchSize"), "level {level:?}: `run` printed nothing:\n{stderr}");
    }
}

#[test]
fn a_bad_level_in_local_settings_json_stops_handler_run() {
    let state = testbed::embedded::ScratchDir::new("log-levels").expect("scratch");
    let app = orders_app().file("local.settings.json", r#"{"Values": {"Sql_Trigger_LogLevel": "verbose"}}"#).write();
    let output = Command::new(support::handler_exe())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FUNCTIONS_APP_ROOT_PATH", app.root())
        .env("Pg", "postgres://app:pw@127.0.0.1:1/db?connect_timeout=1")
        .env("Sql_Trigger_StateStore", "file")
        .env("Sql_Trigger_StateDirectory", state.path())
        .args(["run", "--once"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("Sql_Trigger_LogLevel") && stderr.contains("\"verbose\""), "{stderr}");
}
