//! Tests of the test bed itself: the embedded PostgreSQL and Azurite, the shared fixture, and the host driver.
//!
//! The driver is tested here against a stand-in handler (a 30-line Python HTTP server written into the app
//! folder), because these tests are about what the *driver* does: readiness, the host's request body, retries,
//! fault injection, kill/restart/terminate. End-to-end tests of the real `handler` binary live in their own test
//! binaries and use `support::handler_exe()`.

mod support;

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use sql_pseudo_trigger::protocol::RetryContext;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use support::{fixture, AppBuilder, AppFolder};
use testbed::driver::{AttemptOutcome, DriverError, DriverOptions, HostDriver};
use testbed::embedded::{self, Azurite, EmbeddedPostgres, LaunchError};

// ---------------------------------------------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn postgres_starts_and_answers_a_query_in_a_fresh_database() {
    // GIVEN the shared server WHEN two tests ask for fresh databases
    let first = fixture().fresh_database("testbed").await;
    let second = fixture().fresh_database("testbed").await;
    assert_ne!(first, second);

    // THEN each answers queries as its own database
    let db = embedded::connect(&first).await.expect("connects");
    let row = db.query_one("SELECT current_database(), 40 + 2", &[]).await.expect("answers");
    assert!(first.ends_with(row.get::<_, &str>(0)));
    assert_eq!(row.get::<_, i32>(1), 42);
    if fixture().postgres_is_embedded() {
        let wal_level = db.query_one("SHOW wal_level", &[]).await.expect("answers");
        assert_eq!(wal_level.get::<_, &str>(0), "logical");
    }
}

#[tokio::test]
async fn postgres_restart_and_immediate_stop_keep_committed_data_on_the_same_port() {
    // GIVEN a server of our own with a committed row
    let launched = Instant::now();
    let mut pg = EmbeddedPostgres::start().expect("starts");
    println!("{}: launched in {:?}, ready {:?} after spawn", pg.version(), launched.elapsed(), pg.started_in());
    let port = pg.port();
    let url = pg.create_database("kept").expect("creates");
    let db = embedded::connect(&url).await.expect("connects");
    db.batch_execute("CREATE TABLE t (id int PRIMARY KEY); INSERT INTO t VALUES (1)").await.expect("writes");

    // WHEN it restarts cleanly THEN the row is there and the old connection is gone
    pg.restart().expect("restarts");
    assert_eq!(pg.port(), port);
    assert!(db.simple_query("SELECT 1").await.is_err());
    let db = embedded::connect(&url).await.expect("reconnects");
    assert_eq!(db.query_one("SELECT count(*) FROM t", &[]).await.expect("reads").get::<_, i64>(0), 1);

    // WHEN it is stopped crash-like (immediate shutdown) and started again THEN recovery keeps the data too
    db.batch_execute("INSERT INTO t VALUES (2)").await.expect("writes");
    pg.stop_immediately().expect("stops");
    assert!(!pg.is_running());
    assert!(embedded::connect(&url).await.is_err());
    pg.start_again().expect("recovers");
    println!("recovered from an immediate stop in {:?}", pg.started_in());
    let db = embedded::connect(&url).await.expect("reconnects");
    assert_eq!(db.query_one("SELECT count(*) FROM t", &[]).await.expect("reads").get::<_, i64>(0), 2);

    // AND dropping the server removes its data directory
    let data = pg.data_dir();
    drop(pg);
    assert!(!data.exists());
}

#[tokio::test]
async fn create_database_refuses_names_that_need_quoting() {
    let err = embedded::create_database(&fixture().postgres_url(), "Robert'); DROP").await.expect_err("refused");
    assert!(matches!(err, LaunchError::BadDatabaseName { .. }), "{err}");
}

#[test]
fn a_wrong_pg_bin_dir_is_an_error_that_names_the_fix() {
    // Run in a child process: changing the environment of this multi-threaded process would race.
    let output = run_role("wrong_pg_bin_dir_role", &[("PG_BIN_DIR", "/nonexistent")]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("PG_BIN_DIR=/nonexistent does not hold both initdb and postgres"), "{stdout}");
}

#[test]
#[ignore = "a role played in a child process by a_wrong_pg_bin_dir_is_an_error_that_names_the_fix"]
fn wrong_pg_bin_dir_role() {
    if !playing("wrong_pg_bin_dir_role") {
        return;
    }
    if let Err(err) = EmbeddedPostgres::start() {
        println!("{err}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Azurite
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn azurite_answers_and_checks_signatures() {
    let endpoint = fixture().azurite_blob_endpoint();
    assert!(fixture().azurite_connection_string().contains(&format!("BlobEndpoint={endpoint}")));

    // An unsigned request is refused by Azurite itself, not by something else on the port.
    let response = support::http_client().get(format!("{endpoint}?comp=list")).send().await.expect("answers");
    assert_eq!(response.status().as_u16(), 403);

    // A signed one is served.
    let response = signed(reqwest::Method::GET, &endpoint, "?comp=list", &[], Vec::new()).await;
    assert_eq!(response.status().as_u16(), 200, "{:?}", response.text().await);
}

#[tokio::test]
async fn persistent_azurite_keeps_blobs_across_a_restart_and_in_memory_azurite_does_not() {
    for persistent in [true, false] {
        // GIVEN an Azurite of our own holding one blob
        let launched = Instant::now();
        let mut azurite = if persistent { Azurite::start_persistent() } else { Azurite::start() }.expect("starts");
        println!("azurite (persistent: {persistent}) launched in {:?}", launched.elapsed());
        let endpoint = azurite.blob_endpoint();
        let created = signed(reqwest::Method::PUT, &endpoint, "/state?restype=container", &[], Vec::new()).await;
        assert_eq!(created.status().as_u16(), 201);
        let blob_type = [("x-ms-blob-type", "BlockBlob")];
        let put = signed(reqwest::Method::PUT, &endpoint, "/state/f.json", &blob_type, b"{\"v\":1}".to_vec()).await;
        assert_eq!(put.status().as_u16(), 201);

        // WHEN it stops and starts again on the same port
        let port = azurite.port();
        azurite.stop().expect("stops");
        assert!(support::http_client().get(&endpoint).send().await.is_err());
        azurite.start_again().expect("starts again");
        assert_eq!(azurite.port(), port);

        // THEN the blob survives only when persistent
        let got = signed(reqwest::Method::GET, &endpoint, "/state/f.json", &[], Vec::new()).await;
        if persistent {
            assert_eq!(got.status().as_u16(), 200);
            assert_eq!(got.text().await.expect("body"), "{\"v\":1}");
        } else {
            assert_eq!(got.status().as_u16(), 404);
        }
    }
}

/// A SharedKey-signed request with the dev account, enough to create containers and blobs.
async fn signed(
    method: reqwest::Method,
    endpoint: &str,
    path_and_query: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
) -> reqwest::Response {
    let url = reqwest::Url::parse(&format!("{endpoint}{path_and_query}")).expect("a valid URL");
    let date = time::OffsetDateTime::now_utc()
        .format(time::macros::format_description!(
            "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
        ))
        .expect("formats");
    let mut ms_headers: Vec<(String, String)> =
        vec![("x-ms-date".into(), date), ("x-ms-version".into(), "2025-11-05".into())];
    ms_headers.extend(headers.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.to_string())));
    ms_headers.sort();
    let length = if body.is_empty() { String::new() } else { body.len().to_string() };
    let mut query: Vec<(String, String)> = url.query_pairs().map(|(k, v)| (k.to_ascii_lowercase(), v.into())).collect();
    query.sort();
    let mut to_sign = format!("{method}\n\n\n{length}\n\n\n\n\n\n\n\n\n");
    for (name, value) in &ms_headers {
        to_sign.push_str(&format!("{name}:{value}\n"));
    }
    // Path-style URLs name the account twice: once as the account, once as the first path segment.
    to_sign.push_str(&format!("/{}{}", embedded::DEV_ACCOUNT, url.path()));
    for (name, value) in &query {
        to_sign.push_str(&format!("\n{name}:{value}"));
    }
    let key =
        base64::engine::general_purpose::STANDARD.decode(embedded::DEV_ACCOUNT_KEY).expect("the dev key is base64");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key length");
    mac.update(to_sign.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());

    let mut request = support::http_client().request(method, url);
    for (name, value) in &ms_headers {
        request = request.header(name, value);
    }
    request
        .header("Authorization", format!("SharedKey {}:{signature}", embedded::DEV_ACCOUNT))
        .body(body)
        .send()
        .await
        .expect("Azurite answers")
}

// ---------------------------------------------------------------------------------------------------------------
// Children die with the test process
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn children_die_with_the_test_process() {
    // GIVEN a child test process that starts PostgreSQL (as another user, when root) and Azurite, then aborts
    let output = run_role("orphaning_parent_role", &[]);
    assert!(!output.status.success(), "the role process aborts");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let pids: Vec<u32> = stdout
        .lines()
        // libtest prints "test orphaning_parent_role ... " on the same line as the first pid.
        .filter_map(|line| line.split_once("child pid: ").map(|(_, pid)| pid))
        .filter_map(|pid| pid.trim().parse().ok())
        .collect();
    assert_eq!(pids.len(), 2, "both servers started: {stdout}\n{}", String::from_utf8_lossy(&output.stderr));

    // THEN the kernel takes both servers down with it
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|pid| process_alive(*pid)) {
        assert!(Instant::now() < deadline, "children {pids:?} outlived their parent");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "a role played in a child process by children_die_with_the_test_process"]
fn orphaning_parent_role() {
    if !playing("orphaning_parent_role") {
        return;
    }
    let pg = EmbeddedPostgres::start().expect("PostgreSQL starts");
    let azurite = Azurite::start().expect("Azurite starts");
    for pid in [pg.pid(), azurite.pid()].into_iter().flatten() {
        println!("child pid: {pid}");
    }
    // No destructor runs: only the parent-death signal can stop the servers now.
    std::process::abort();
}

/// Runs one `#[ignore]`d role test of this binary in a child process.
fn run_role(role: &str, env: &[(&str, &str)]) -> std::process::Output {
    Command::new(std::env::current_exe().expect("the test binary knows its path"))
        .args(["--exact", role, "--include-ignored", "--nocapture", "--test-threads=1"])
        .env("TESTBED_ROLE", role)
        .envs(env.iter().copied())
        .output()
        .expect("the test binary runs")
}

/// Roles run only in the child process made for them, never under `cargo test -- --include-ignored`.
fn playing(role: &str) -> bool {
    std::env::var("TESTBED_ROLE").is_ok_and(|r| r == role)
}

/// Alive and not a zombie: a container's init may be slow to reap.
fn process_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit(") ").next().is_some_and(|rest| !rest.starts_with('Z')),
        Err(_) => false,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The host driver, against a stand-in handler
// ---------------------------------------------------------------------------------------------------------------

/// A stand-in custom handler: answers GET with 404, fails the first `STANDIN_FAIL_FIRST` POSTs with 500, and
/// answers the others with `STANDIN_MESSAGES` (default 1) `changes` messages plus an `echo` of what it
/// received (an output with no binding, which the host ignores). Exits 0 on SIGTERM.
const STANDIN: &str = r#"#!/usr/bin/env python3
import json, os, signal, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
time.sleep(int(os.environ.get("STANDIN_DELAY_MS", "0")) / 1000)
fail_first, posts = int(os.environ.get("STANDIN_FAIL_FIRST", "0")), 0
messages = int(os.environ.get("STANDIN_MESSAGES", "1"))
post_delay = int(os.environ.get("STANDIN_POST_DELAY_MS", "0")) / 1000
class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args): pass
    def reply(self, code, data):
        self.send_response(code); self.send_header("Content-Length", str(len(data))); self.end_headers()
        self.wfile.write(data)
    def do_GET(self): self.reply(404, b"")
    def do_POST(self):
        global posts
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
        posts += 1
        time.sleep(post_delay)
        if posts <= fail_first: return self.reply(500, b"transient failure")
        retry = body["Metadata"].get("RetryContext")
        echo = {"request": body, "path": self.path, "id": self.headers.get("X-Azure-Functions-InvocationId"),
                "setting": os.environ.get("SAMPLE_SETTING"), "cwd": os.getcwd(), "argv": sys.argv[1:],
                "root": os.environ.get("FUNCTIONS_APP_ROOT_PATH")}
        changes = [{"post": posts, "retry": retry and retry["RetryCount"]} for _ in range(messages)]
        for n, change in enumerate(changes):
            if messages > 1: change["n"] = n
        out = {"Outputs": {"changes": changes, "echo": echo},
               "Logs": ["post %d" % posts], "ReturnValue": None}
        self.reply(200, json.dumps(out).encode())
port = int(os.environ["FUNCTIONS_CUSTOMHANDLER_PORT"])
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
"#;

const FUNCTION: &str = "OrdersChanged";

/// An app with one timer function, a stand-in handler script, and `SAMPLE_SETTING` in local.settings.json.
fn standin_app(max_retry_count: Option<i64>) -> (AppFolder, PathBuf) {
    standin_app_with(support::timer_function_json(max_retry_count))
}

/// [`standin_app`] with its own function.json.
fn standin_app_with(function_json: Value) -> (AppFolder, PathBuf) {
    let app = AppBuilder::new()
        .host_json(json!({
            "version": "2.0",
            "functionTimeout": "00:00:30",
            "customHandler": { "description": { "defaultExecutablePath": "standin.py", "arguments": ["--mode=%SAMPLE_SETTING%"] } }
        }))
        .function(FUNCTION, function_json, None)
        .setting("SAMPLE_SETTING", "from-local-settings")
        .file("standin.py", STANDIN)
        .write();
    let script = app.root().join("standin.py");
    make_executable(&script);
    (app, script)
}

fn make_executable(path: &Path) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
}

async fn start_standin(app: &AppFolder, script: &Path, env: &[(&str, &str)]) -> HostDriver {
    let mut options = DriverOptions::new(app.root(), script);
    options.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    HostDriver::start(options).await.expect("the stand-in handler starts")
}

#[tokio::test]
async fn driver_waits_for_the_first_answer_and_passes_the_host_environment() {
    // GIVEN a handler that takes 300 ms to listen, a setting both in local.settings.json and the options, and a
    // timer every five minutes (one the host keeps a schedule monitor for)
    let mut function_json = support::timer_function_json(None);
    function_json["bindings"][0]["schedule"] = json!("0 */5 * * * *");
    let (app, script) = standin_app_with(function_json);
    let driver = start_standin(&app, &script, &[("STANDIN_DELAY_MS", "300")]).await;

    // THEN readiness waited for it
    assert!(driver.ready_after() >= Duration::from_millis(300), "{:?}", driver.ready_after());

    // WHEN the timer fires
    let invocation = driver.invoke(FUNCTION, None).await.expect("answers");
    assert!(invocation.succeeded(), "{invocation:?}");
    let echo = &invocation.outputs["echo"];

    // THEN the handler saw the host's environment, folder, arguments, path and header
    assert_eq!(echo["setting"], "from-local-settings");
    assert_eq!(echo["argv"], json!(["--mode=from-local-settings"]));
    let root = app.root().display().to_string();
    assert_eq!(echo["root"], root.as_str());
    assert_eq!(echo["cwd"], root.as_str());
    assert_eq!(echo["path"], format!("/{FUNCTION}"));
    assert_eq!(echo["id"], invocation.invocation_id.as_str());
    assert_eq!(invocation.logs, ["post 1"]);

    // AND the body is the host's timer body: first run's Last has no offset, no RetryContext
    let body = &echo["request"];
    assert_eq!(body["Data"]["timer"]["ScheduleStatus"]["Last"], "0001-01-01T00:00:00");
    let next = body["Data"]["timer"]["ScheduleStatus"]["Next"].as_str().expect("a string");
    let minute: u32 = next[14..16].parse().expect("minutes");
    assert_eq!((next.len(), minute % 5, &next[17..]), (25, 0, "00+00:00"), "the next five-minute mark: {next}");
    assert_eq!(body["Data"]["timer"]["Schedule"]["AdjustForDST"], true);
    assert_eq!(body["Data"]["timer"]["IsPastDue"], false);
    assert_eq!(body["Metadata"]["sys"]["MethodName"], FUNCTION);
    let utc_now = body["Metadata"]["sys"]["UtcNow"].as_str().expect("a string");
    assert_eq!((utc_now.len(), &utc_now[19..20], &utc_now[27..]), (28, ".", "Z"), "{utc_now}");
    assert!(body["Metadata"].get("RetryContext").is_none());

    // WHEN it fires again, as a retry THEN Last is the previous firing and the retry context names the attempt
    // that failed, as the host's FunctionInvocationException does
    let retry = RetryContext::after(1, 3, invocation.invocation_id.clone());
    let again = driver.invoke(FUNCTION, Some(retry)).await.expect("answers");
    let body = &again.outputs["echo"]["request"];
    let last = body["Data"]["timer"]["ScheduleStatus"]["Last"].as_str().expect("a string");
    assert_eq!((last.len(), &last[19..20], &last[27..]), (33, ".", "+00:00"), "{last}");
    let context = &body["Metadata"]["RetryContext"];
    assert_eq!((&context["RetryCount"], &context["MaxRetryCount"]), (&json!(1), &json!(3)));
    assert_eq!(context["Exception"]["ClassName"], "Microsoft.Azure.WebJobs.Host.FunctionInvocationException");
    assert_eq!(context["Exception"]["InstanceId"], invocation.invocation_id.as_str());
    assert_eq!((&context["Instance"], &context["State"]), (&Value::Null, &json!({})));
    assert_ne!(again.invocation_id, invocation.invocation_id);

    // AND invoke alone applies nothing
    assert!(driver.delivered("changes").is_empty());
}

#[tokio::test]
async fn a_simulated_hour_of_firings_every_five_seconds_is_720_firings_on_the_schedules_seconds() {
    // GIVEN a schedule of */5 * * * * * (the templates' before issue 23), under a minute: no schedule monitor
    let (app, script) = standin_app(None);
    let driver = start_standin(&app, &script, &[]).await;
    let start = time::macros::datetime!(2026-11-25 10:00:00 UTC);

    // WHEN the model fires it for an hour of simulated time
    let paced = driver.run_schedule(FUNCTION, start, Duration::from_secs(3600), |_| false).await.expect("runs");

    // THEN it fired at every fifth second after the start, up to and including the end, and wrote one message each
    let expected: Vec<_> = (1..=720).map(|k| start + Duration::from_secs(5 * k)).collect();
    assert_eq!(paced.firings.iter().map(|f| f.at).collect::<Vec<_>>(), expected);
    assert_eq!(paced.written("changes"), 720);
    assert_eq!(paced.per_second("changes"), 0.2);
    let first = paced.firings[0].run.last_invocation().expect("answered");
    let body = &first.outputs["echo"]["request"];
    assert_eq!(body["Data"]["timer"]["ScheduleStatus"], Value::Null, "no monitor for a sub-minute schedule");
}

#[tokio::test]
async fn a_firing_that_outlasts_the_period_is_followed_at_once_and_missed_occurrences_are_not_caught_up() {
    // GIVEN a timer every second and a handler that takes 1.1 s to answer
    let mut function_json = support::timer_function_json(None);
    function_json["bindings"][0]["schedule"] = json!("* * * * * *");
    let (app, script) = standin_app_with(function_json);
    let driver = start_standin(&app, &script, &[("STANDIN_POST_DELAY_MS", "1100")]).await;
    let start = time::macros::datetime!(2026-11-25 10:00:00 UTC);

    // WHEN the model fires it for 4.5 simulated seconds
    let paced = driver.run_schedule(FUNCTION, start, Duration::from_millis(4500), |_| false).await.expect("runs");

    // THEN the first firing is on the first second, and each next one comes the moment the previous ended
    // (TimerListener: a negative interval becomes one tick), never two for the occurrences it missed
    assert_eq!(paced.firings[0].at, start + Duration::from_secs(1));
    for pair in paced.firings.windows(2) {
        assert!(pair[0].took >= Duration::from_millis(1100), "{:?}", pair[0].took);
        assert_eq!(pair[1].at, pair[0].at + pair[0].took + pair[0].run.waited);
    }
    assert!((3..=4).contains(&paced.firings.len()), "{} firings in 4.5 s", paced.firings.len());
}

#[tokio::test]
async fn on_real_seconds_the_model_fires_on_the_schedules_seconds_never_early() {
    // GIVEN a timer every second (the one slow test of the schedule: three real seconds)
    let mut function_json = support::timer_function_json(None);
    function_json["bindings"][0]["schedule"] = json!("* * * * * *");
    let (app, script) = standin_app_with(function_json);
    let driver = start_standin(&app, &script, &[]).await;

    // WHEN it fires three times on the wall clock
    let paced = driver.run_schedule_real(FUNCTION, 3).await.expect("runs");

    // THEN each firing came at or after a whole second, in three successive seconds
    let seconds: Vec<i64> = paced.firings.iter().map(|f| f.at.unix_timestamp()).collect();
    assert_eq!(seconds.len(), 3);
    assert!(seconds.windows(2).all(|w| w[1] == w[0] + 1), "{seconds:?}");
    assert!(paced.firings.iter().all(|f| f.at.nanosecond() < 500_000_000), "late by half a second or more");
    assert_eq!(paced.written("changes"), 3);
}

#[tokio::test]
async fn options_env_wins_over_local_settings() {
    let (app, script) = standin_app(None);
    let driver = start_standin(&app, &script, &[("SAMPLE_SETTING", "from-options")]).await;
    let invocation = driver.invoke(FUNCTION, None).await.expect("answers");
    assert_eq!(invocation.outputs["echo"]["setting"], "from-options");
}

#[tokio::test]
async fn run_timer_retries_a_failing_handler_and_applies_only_the_successful_attempt() {
    // GIVEN a retry policy of 3 and a handler whose first two answers are 500
    let (app, script) = standin_app(Some(3));
    let driver = start_standin(&app, &script, &[("STANDIN_FAIL_FIRST", "2")]).await;

    // WHEN the timer fires
    let started = std::time::Instant::now();
    let run = driver.run_timer(FUNCTION).await.expect("runs");
    let elapsed = started.elapsed();

    // THEN the host sent a RetryContext on every attempt, each retry naming the attempt before it, waited the
    // policy's delay before each retry, and wrote only the third answer
    assert!(run.succeeded);
    assert_eq!(run.attempt_count(), 3);
    assert!(matches!(run.attempts[0].outcome, AttemptOutcome::HandlerFailed { .. }));
    assert_eq!(run.attempts[0].retry, Some(RetryContext::first(3)));
    let ids: Vec<String> = run.attempts.iter().flat_map(|a| &a.invocation).map(|i| i.invocation_id.clone()).collect();
    assert_eq!(run.attempts[1].retry, Some(RetryContext::after(1, 3, ids[0].clone())));
    assert_eq!(run.attempts[2].retry, Some(RetryContext::after(2, 3, ids[1].clone())));
    assert_eq!(run.attempts[2].outcome, AttemptOutcome::Applied);
    assert!(elapsed >= support::TEST_RETRY_DELAY * 2, "{elapsed:?}: the host waits the delay before each retry");
    assert_eq!(driver.delivered("changes"), [json!({ "post": 3, "retry": 2 })]);
    assert_eq!(run.applied["changes"], [json!({ "post": 3, "retry": 2 })]);
    // The retries carried the first attempt's trigger data, as the host does.
    let requests: Vec<&Value> = run.attempts.iter().flat_map(|a| &a.invocation).map(|i| &i.request).collect();
    assert!(requests.iter().all(|r| r["Data"] == requests[0]["Data"]));
    // Outputs without a binding (`echo`) are not written anywhere.
    assert!(driver.delivered("echo").is_empty());
}

#[tokio::test]
async fn a_failed_output_write_is_retried_and_written_once() {
    // GIVEN a retry policy and a queue that fails the next write
    let (app, script) = standin_app(Some(2));
    let driver = start_standin(&app, &script, &[]).await;
    driver.fail_output_writes("changes", 1);

    // WHEN the timer fires
    let run = driver.run_timer(FUNCTION).await.expect("runs");

    // THEN the handler answered twice, the first answer was lost, the second written
    assert!(run.succeeded);
    assert!(
        matches!(&run.attempts[0].outcome, AttemptOutcome::OutputWriteFailed { binding, .. } if binding == "changes")
    );
    assert_eq!(run.attempts[1].outcome, AttemptOutcome::Applied);
    assert_eq!(driver.delivered("changes"), [json!({ "post": 2, "retry": 1 })]);
}

#[tokio::test]
async fn exponential_backoff_waits_as_the_host_s_randomized_strategy_does() {
    // GIVEN an exponentialBackoff policy from 100 ms to 400 ms, and a handler whose first four answers are 500
    let mut function = support::timer_function_json(Some(5));
    function["retry"] = json!({
        "strategy": "exponentialBackoff", "maxRetryCount": 5, "minimumInterval": "00:00:00.100",
        "maximumInterval": "00:00:00.400"
    });
    let (app, script) = standin_app_with(function);
    let driver = start_standin(&app, &script, &[("STANDIN_FAIL_FIRST", "4")]).await;

    // WHEN the timer fires
    let run = driver.run_timer(FUNCTION).await.expect("runs");

    // THEN the gaps follow RandomizedExponentialBackoffStrategy: the minimum first, then the minimum plus a
    // doubling of it randomized by 20 %, never above the maximum
    assert_eq!(run.attempt_count(), 5);
    let sent: Vec<Instant> = run.attempts.iter().flat_map(|a| &a.invocation).map(|i| i.sent_at).collect();
    let gaps: Vec<Duration> = sent.windows(2).map(|w| w[1] - w[0]).collect();
    let ms = |n| Duration::from_millis(n);
    let bounds = [(ms(100), ms(100)), (ms(180), ms(220)), (ms(260), ms(340)), (ms(400), ms(400))];
    for (gap, (low, high)) in gaps.iter().zip(bounds) {
        // The lower bound is the host's delay; above it, this process's scheduling adds a little.
        assert!(*gap >= low && *gap <= high + ms(150), "gaps {gaps:?}");
    }
}

#[tokio::test]
async fn a_manual_run_comes_outside_the_timer_s_lock_even_during_a_retry_delay() {
    // GIVEN a policy with a 100 ms delay, and a handler whose first answer is a 500
    let (app, script) = standin_app(Some(3));
    let driver = std::sync::Arc::new(start_standin(&app, &script, &[("STANDIN_FAIL_FIRST", "1")]).await);

    // WHEN a manual run starts 50 ms into the firing
    let firing = tokio::spawn({
        let driver = driver.clone();
        async move { driver.run_timer(FUNCTION).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let manual = driver.run_manual(FUNCTION).await.expect("a manual run");
    let firing = firing.await.expect("join").expect("a firing");

    // THEN the manual run was sent during the firing's retry delay, as a first attempt of its own loop, with
    // the trigger value a manual run binds (no schedule status)
    let failed = firing.attempts[0].invocation.as_ref().expect("answered");
    let retried = firing.attempts[1].invocation.as_ref().expect("answered");
    let manual = manual.attempts[0].invocation.as_ref().expect("answered");
    assert!(manual.sent_at > failed.sent_at + failed.elapsed && manual.sent_at < retried.sent_at);
    assert_eq!(manual.request["Metadata"]["RetryContext"]["RetryCount"], 0);
    assert_eq!(manual.request["Data"]["timer"]["ScheduleStatus"], Value::Null);
    // AND the firing's retry names its own failed attempt, not the manual run
    assert_eq!(retried.request["Metadata"]["RetryContext"]["Exception"]["InstanceId"], failed.invocation_id.as_str());
}

#[tokio::test]
async fn a_failed_write_may_be_partial_and_a_refused_message_fails_every_write_that_holds_it() {
    // GIVEN a handler that answers three messages per invocation
    let (app, script) = standin_app(Some(3));
    let driver = start_standin(&app, &script, &[("STANDIN_MESSAGES", "3")]).await;

    // WHEN the next write fails after one message
    driver.fail_output_writes_after("changes", 1, 1);
    let run = driver.run_timer(FUNCTION).await.expect("runs");

    // THEN that message reached the destination, and the retry's three came after it
    assert_eq!(run.attempt_count(), 2);
    let posts: Vec<(i64, i64)> = driver
        .delivered("changes")
        .iter()
        .map(|m| (m["post"].as_i64().expect("post"), m["n"].as_i64().expect("n")))
        .collect();
    assert_eq!(posts, [(1, 0), (2, 0), (2, 1), (2, 2)]);

    // WHEN the destination refuses every message numbered 1
    driver.refuse_messages("changes", |m| m["n"] == json!(1));
    let run = driver.run_timer(FUNCTION).await.expect("runs");

    // THEN every attempt writes the message before it and fails, and the firing fails
    assert!(!run.succeeded);
    assert_eq!(run.attempt_count(), 4);
    assert_eq!(driver.delivered("changes").len(), 4 + 4, "one message per attempt got through");
}

#[tokio::test]
async fn without_a_retry_policy_a_failed_write_loses_that_firing() {
    let (app, script) = standin_app(None);
    let driver = start_standin(&app, &script, &[]).await;
    driver.fail_output_writes("changes", 1);

    let lost = driver.run_timer(FUNCTION).await.expect("runs");
    assert!(!lost.succeeded);
    assert_eq!(lost.attempt_count(), 1);
    assert!(driver.delivered("changes").is_empty());

    let next = driver.run_timer(FUNCTION).await.expect("runs");
    assert!(next.succeeded);
    assert_eq!(driver.delivered("changes"), [json!({ "post": 2, "retry": null })]);
}

#[tokio::test]
async fn kill_restart_and_terminate_control_the_handler_process() {
    let (app, script) = standin_app(Some(1));
    let driver = start_standin(&app, &script, &[]).await;
    let first_pid = driver.pid().expect("running");

    // WHEN killed THEN the process is gone and timers cannot fire
    driver.kill();
    assert!(!process_alive(first_pid));
    assert!(matches!(driver.run_timer(FUNCTION).await, Err(DriverError::NotRunning)));

    // WHEN restarted THEN it serves again, sinks kept
    driver.restart().await.expect("restarts");
    assert_ne!(driver.pid(), Some(first_pid));
    assert!(driver.run_timer(FUNCTION).await.expect("runs").succeeded);
    assert_eq!(driver.delivered("changes").len(), 1);

    // WHEN terminated THEN it exits by itself (the stand-in exits 0 on SIGTERM)
    let status = driver.terminate().await.expect("exits");
    assert!(status.success(), "{status}");
    assert!(!driver.is_running());
}

#[tokio::test]
async fn a_handler_that_exits_at_start_is_reported_with_its_output() {
    let (app, _) = standin_app(None);
    let script = app.root().join("crash.sh");
    std::fs::write(&script, "#!/bin/sh\necho 'cannot read settings' >&2\nexit 3\n").expect("writes");
    make_executable(&script);

    let err = HostDriver::start(DriverOptions::new(app.root(), &script)).await.expect_err("fails");
    assert!(matches!(err, DriverError::ExitedBeforeReady { .. }), "{err}");
    assert!(err.to_string().contains("cannot read settings"), "{err}");
}

#[tokio::test]
async fn a_handler_that_never_listens_times_out_and_is_killed() {
    let (app, _) = standin_app(None);
    let script = app.root().join("mute.sh");
    std::fs::write(&script, "#!/bin/sh\nexec sleep 60\n").expect("writes");
    make_executable(&script);
    let mut options = DriverOptions::new(app.root(), &script);
    options.ready_timeout = Duration::from_millis(300);

    let started = Instant::now();
    let err = HostDriver::start(options).await.expect_err("times out");
    assert!(matches!(err, DriverError::NotReady { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[tokio::test]
async fn bad_app_folders_are_reported_with_the_file_and_the_fix() {
    let missing_host = AppBuilder::new().write();
    std::fs::remove_file(missing_host.root().join("host.json")).expect("removes");
    let err = HostDriver::start(DriverOptions::new(missing_host.root(), "/bin/true")).await.expect_err("fails");
    assert!(err.to_string().contains("host.json"), "{err}");

    let bad_function = AppBuilder::new().function("F", json!({ "bindings": {} }), None).write();
    let err = HostDriver::start(DriverOptions::new(bad_function.root(), "/bin/true")).await.expect_err("fails");
    assert!(err.to_string().contains("function.json is not valid"), "{err}");

    let (app, script) = standin_app(None);
    let driver = start_standin(&app, &script, &[]).await;
    let err = driver.run_timer("Nope").await.expect_err("unknown");
    assert!(err.to_string().contains(&format!("functions found: {FUNCTION}")), "{err}");

    let err =
        HostDriver::start(DriverOptions::new(app.root(), app.root().join("no-such-handler"))).await.expect_err("fails");
    assert!(err.to_string().contains("cargo build --bin handler"), "{err}");
}
