//! Operator actions end to end: `handler state ...` as a subprocess, the admin function the host invokes
//! (function-templates/SqlTriggerAdmin), and the direct `/admin/...` route guarded by `Sql_Trigger_AdminKey`,
//! each against the real handler serving timer invocations over real PostgreSQL and Azurite.
//!
//! The three ways in run the same actions ([`Action`]) and are read back the same way ([`Answer`]), so one
//! scenario checks all three.

use crate::common::*;
use crate::support::{self, AppFolder};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};
use testbed::driver::HostDriver;

pub const ADMIN_FUNCTION: &str = "SqlTriggerAdmin";
pub const ADMIN_KEY: &str = "e2e-admin-key-7c1d";

/// How an operator reaches the handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// `handler --app-root <app> state ...`, a separate process on the same state.
    Cli,
    /// `POST /SqlTriggerAdmin` with the host's HTTP-trigger invocation body (the host checked the key).
    AdminFunction,
    /// `/admin/...` on the handler's port with `x-functions-key`.
    DirectRoute,
}

const CHANNELS: [Channel; 3] = [Channel::Cli, Channel::AdminFunction, Channel::DirectRoute];

/// One operator action.
#[derive(Debug, Clone)]
pub enum Action {
    Show,
    Status,
    Pause,
    Resume,
    Reset { to: String, confirm: bool },
    Replay { from: String },
    QuarantineList,
    QuarantineShow(u64),
    QuarantineRetry(u64),
}

impl Action {
    fn cli_args(&self, function: &str) -> Vec<String> {
        let f = function.to_string();
        let words: Vec<String> = match self {
            Action::Show => vec!["show".into(), f],
            Action::Status => vec!["status".into(), f],
            Action::Pause => vec!["pause".into(), f],
            Action::Resume => vec!["resume".into(), f],
            Action::Reset { to, confirm } => {
                let mut w = vec!["reset".into(), f, "--to".into(), to.clone()];
                if *confirm {
                    w.push("--confirm".into());
                }
                w
            }
            Action::Replay { from } => vec!["replay".into(), f, "--from".into(), from.clone()],
            Action::QuarantineList => vec!["quarantine".into(), "list".into(), f],
            Action::QuarantineShow(b) => vec!["quarantine".into(), "show".into(), f, b.to_string()],
            Action::QuarantineRetry(b) => vec!["quarantine".into(), "retry".into(), f, b.to_string()],
        };
        std::iter::once("state".to_string()).chain(words).collect()
    }

    /// Method, path below the admin root, query.
    fn http(&self, function: &str) -> (&'static str, String, Vec<(String, String)>) {
        let q = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        match self {
            Action::Show => ("GET", function.to_string(), vec![]),
            Action::Status => ("GET", format!("{function}/status"), vec![]),
            Action::Pause => ("POST", format!("{function}/pause"), vec![]),
            Action::Resume => ("POST", format!("{function}/resume"), vec![]),
            Action::Reset { to, confirm } => {
                let mut query = q(&[("to", to)]);
                if *confirm {
                    query.push(("confirm".into(), "true".into()));
                }
                ("POST", format!("{function}/reset"), query)
            }
            Action::Replay { from } => ("POST", format!("{function}/replay"), q(&[("from", from)])),
            Action::QuarantineList => ("GET", format!("{function}/quarantine"), vec![]),
            Action::QuarantineShow(b) => ("GET", format!("{function}/quarantine/{b}"), vec![]),
            Action::QuarantineRetry(b) => ("POST", format!("{function}/quarantine/{b}/retry"), vec![]),
        }
    }
}

/// What an action answered, whichever way it went.
#[derive(Debug, Clone)]
pub struct Answer {
    pub ok: bool,
    /// The HTTP status (the admin function's `statusCode`); for the CLI 200 on success and 0 on failure.
    pub status: u16,
    /// The JSON answer on success.
    pub body: Value,
    /// The error message on failure.
    pub error: String,
}

impl Answer {
    #[track_caller]
    fn expect_ok(self, what: &str) -> Value {
        assert!(self.ok, "{what} failed: {} ({})", self.error, self.status);
        self.body
    }

    #[track_caller]
    fn expect_refused(self, what: &str, status: u16, message: &str) {
        assert!(!self.ok, "{what} should be refused: {}", self.body);
        assert!(self.error.contains(message), "{what}: {:?} does not say {message:?}", self.error);
        if self.status != 0 {
            assert_eq!(self.status, status, "{what}: {}", self.error);
        }
    }
}

/// `handler --app-root <root> <args>`, as an operator runs it; the app settings come from local.settings.json.
pub async fn handler_cli(root: &Path, args: &[String]) -> std::process::Output {
    tokio::process::Command::new(support::handler_exe())
        .arg("--app-root")
        .arg(root)
        .args(args)
        .env_remove("FUNCTIONS_APP_ROOT_PATH")
        .env("Sql_Trigger_LogLevel", "warn")
        .kill_on_drop(true)
        .output()
        .await
        .expect("the handler CLI runs")
}

/// Runs `action` on `function` through `channel`.
pub async fn act(
    channel: Channel,
    app: &AppFolder,
    host: Option<&HostDriver>,
    function: &str,
    action: &Action,
) -> Answer {
    match channel {
        Channel::Cli => {
            let output = handler_cli(app.root(), &action.cli_args(function)).await;
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
            if output.status.success() {
                let body =
                    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("CLI stdout is not JSON ({e}): {stdout}"));
                Answer { ok: true, status: 200, body, error: String::new() }
            } else {
                Answer { ok: false, status: 0, body: Value::Null, error: stderr }
            }
        }
        Channel::AdminFunction => {
            let host = host.expect("the admin function needs the handler running");
            let (method, path, query) = action.http(function);
            let query_string: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let body = json!({
                "Data": { "req": {
                    "Url": format!("https://x/api/sqltrigger/{path}?{}", query_string.join("&")),
                    "Method": method,
                    "Query": query.iter().cloned().collect::<BTreeMap<_, _>>(),
                    "Headers": { "X-MS-CLIENT-PRINCIPAL-NAME": ["operator@e2e"] },
                    "Params": { "path": path }
                }},
                "Metadata": {}
            });
            let response = support::http_client()
                .post(format!("{}/{ADMIN_FUNCTION}", host.base_url()))
                .json(&body)
                .send()
                .await
                .expect("the handler answers the admin invocation");
            assert_eq!(response.status().as_u16(), 200, "the invocation itself succeeds; the route's status is inside");
            let invocation: Value = response.json().await.expect("an invocation response");
            let http = &invocation["Outputs"]["res"];
            let status = http["statusCode"].as_u64().unwrap_or_else(|| panic!("no statusCode in {invocation}")) as u16;
            let answer: Value = serde_json::from_str(http["body"].as_str().unwrap_or("null")).expect("a JSON body");
            from_http(status, answer)
        }
        Channel::DirectRoute => {
            let host = host.expect("the direct route needs the handler running");
            let (method, path, query) = action.http(function);
            let response = direct(host, method, &path, &query, Some(ADMIN_KEY)).await;
            let status = response.status().as_u16();
            from_http(status, response.json().await.unwrap_or(Value::Null))
        }
    }
}

fn from_http(status: u16, body: Value) -> Answer {
    if (200..300).contains(&status) {
        Answer { ok: true, status, body, error: String::new() }
    } else {
        let error = body["error"].as_str().unwrap_or_default().to_string();
        Answer { ok: false, status, body, error }
    }
}

/// A request to `/admin/{path}` with `key` in `x-functions-key` (none when `None`).
async fn direct(
    host: &HostDriver,
    method: &str,
    path: &str,
    query: &[(String, String)],
    key: Option<&str>,
) -> reqwest::Response {
    let root = format!("{}/admin", host.base_url());
    let url = if path.is_empty() { root } else { format!("{root}/{path}") };
    let url = reqwest::Url::parse_with_params(&url, query).expect("a URL");
    let client = support::http_client();
    let mut request = match method {
        "GET" => client.get(url),
        _ => client.post(url),
    };
    if let Some(key) = key {
        request = request.header("x-functions-key", key);
    }
    request.send().await.expect("the handler answers")
}

/// Copies the admin function template into `root/SqlTriggerAdmin`, as an app that wants the admin routes does.
pub fn add_admin_function(root: &Path) {
    let template = Path::new(env!("CARGO_MANIFEST_DIR")).join("function-templates").join(ADMIN_FUNCTION);
    let target = root.join(ADMIN_FUNCTION);
    std::fs::create_dir_all(&target).expect("the app folder is writable");
    for file in ["function.json", "sqltrigger.json"] {
        std::fs::copy(template.join(file), target.join(file)).expect("the template is readable");
    }
}

/// The orders app with the admin function and the direct admin key.
fn admin_app(orders: &Orders, app_name: &str, trigger_extra: Value, settings: &[(&str, &str)]) -> AppFolder {
    let mut all = vec![("Sql_Trigger_AdminKey", ADMIN_KEY)];
    all.extend_from_slice(settings);
    let app = orders_app(orders, app_name, trigger_extra, &all);
    add_admin_function(app.root());
    app
}

/// Asks for status until `pending` is `expected`, for at most 10 s (the xid8 guard may hold fresh rows back
/// while any older transaction of the cluster runs), and returns that status.
async fn status_when_pending(channel: Channel, app: &AppFolder, host: Option<&HostDriver>, expected: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let status = act(channel, app, host, FUNCTION, &Action::Status).await.expect_ok("status");
        if status["pending"] == expected {
            return status;
        }
        assert!(Instant::now() < deadline, "{channel:?}: pending never reached {expected}: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn counts(messages: &[Value]) -> BTreeMap<i64, usize> {
    tally(messages).1
}

fn times(ids: impl IntoIterator<Item = i64>, n: usize) -> BTreeMap<i64, usize> {
    ids.into_iter().map(|id| (id, n)).collect()
}

// ---------------------------------------------------------------------------------------------------------------
// Every action, three ways in
// ---------------------------------------------------------------------------------------------------------------

/// The whole life of a function under an operator: status, pause, resume, replay, reset, quarantine listing.
async fn every_action_through(channel: Channel) {
    let orders = Orders::new(&format!("ops_{channel:?}")).await;
    let app_name = unique_app_name("ops");
    let app = admin_app(&orders, &app_name, json!({}), &[]);
    let host = start(&app).await;
    let h = Some(&host);
    let store = shared_blob_store();

    // GIVEN a function that has not run: show has no state, status reports nothing pending, pause is refused
    let shown = act(channel, &app, h, FUNCTION, &Action::Show).await.expect_ok("show");
    assert_eq!(shown["state"], Value::Null);
    let status = act(channel, &app, h, FUNCTION, &Action::Status).await.expect_ok("status");
    assert_eq!((&status["pending"], &status["target_workers"]), (&json!(0), &json!(0)), "{status}");
    act(channel, &app, h, FUNCTION, &Action::Pause).await.expect_refused(
        "pause before the first tick",
        404,
        "has not run",
    );

    // WHEN it ticks once and 5 orders arrive THEN status reports exactly 5 pending for 1 worker
    drain(&host, 2).await;
    orders.insert(1..=5).await;
    let status = status_when_pending(channel, &app, h, 5).await;
    assert_eq!(status["target_workers"], 1, "{status}");
    assert_eq!(status["paused"], false);

    // WHEN paused THEN invocations answer empty, say why, and deliver nothing
    let paused = act(channel, &app, h, FUNCTION, &Action::Pause).await.expect_ok("pause");
    assert_eq!(paused["paused"], true);
    for _ in 0..2 {
        let invocation = host.invoke(FUNCTION, None).await.expect("invoke");
        assert!(invocation.outputs.is_empty(), "a paused function delivered: {}", invocation.body);
        assert!(invocation.logs.iter().any(|l| l.contains("paused")), "{:?}", invocation.logs);
    }
    assert!(host.delivered("changes").is_empty());
    let status = act(channel, &app, h, FUNCTION, &Action::Status).await.expect_ok("status");
    assert_eq!((&status["paused"], &status["pending"]), (&json!(true), &json!(5)), "{status}");

    // WHEN resumed THEN deliveries continue with exactly the 5 orders
    act(channel, &app, h, FUNCTION, &Action::Resume).await.expect_ok("resume");
    assert_eq!(ids_of(&fire_until_delivered(&host, FUNCTION).await), vec![1, 2, 3, 4, 5]);
    drain(&host, 3).await;
    let after_first =
        act(channel, &app, h, FUNCTION, &Action::Show).await.expect_ok("show")["state"]["checkpoint"].clone();
    assert!(after_first.is_array(), "{after_first}");

    // WHEN orders 6-7 are delivered and the operator replays from the checkpoint before them
    orders.insert(6..=7).await;
    assert_eq!(ids_of(&fire_until_delivered(&host, FUNCTION).await), vec![6, 7]);
    drain(&host, 3).await;
    let replayed =
        act(channel, &app, h, FUNCTION, &Action::Replay { from: after_first.to_string() }).await.expect_ok("replay");
    assert_eq!(replayed["checkpoint"], after_first);
    // THEN exactly orders 6-7 come again, under a new batch id
    let batches_before = state(&store, &app_name).await.0.next_batch_id();
    assert_eq!(ids_of(&fire_until_delivered(&host, FUNCTION).await), vec![6, 7]);
    drain(&host, 3).await;
    assert!(state(&store, &app_name).await.0.next_batch_id() > batches_before);

    // WHEN the operator resets without confirming THEN it is refused with how to confirm, and nothing moves
    let checkpoint = state(&store, &app_name).await.0.checkpoint().clone();
    let how = if channel == Channel::Cli { "--confirm" } else { "confirm=true" };
    act(channel, &app, h, FUNCTION, &Action::Reset { to: "now".into(), confirm: false }).await.expect_refused(
        "reset without confirm",
        400,
        how,
    );
    assert_eq!(*state(&store, &app_name).await.0.checkpoint(), checkpoint);

    // WHEN orders 8-9 arrive and the operator resets to now, confirmed
    orders.insert(8..=9).await;
    let reset =
        act(channel, &app, h, FUNCTION, &Action::Reset { to: "now".into(), confirm: true }).await.expect_ok("reset");
    assert!(reset["checkpoint"].is_array(), "{reset}");
    // THEN orders 8-9 are skipped and order 10 is the next delivered
    orders.insert([10]).await;
    assert_eq!(ids_of(&fire_until_delivered(&host, FUNCTION).await), vec![10]);
    drain(&host, 3).await;

    // AND nothing was quarantined, and status shows nothing pending, the counters and this process's last tick
    let listed = act(channel, &app, h, FUNCTION, &Action::QuarantineList).await.expect_ok("quarantine list");
    assert_eq!(listed["documents"], json!([]), "{listed}");
    let status = act(channel, &app, h, FUNCTION, &Action::Status).await.expect_ok("status");
    assert_eq!((&status["pending"], &status["target_workers"]), (&json!(0), &json!(0)), "{status}");
    assert_eq!(status["counters"]["delivered"], 10, "{status}");
    if channel != Channel::Cli {
        assert!(status["last_tick"]["ticks"].as_u64().is_some_and(|n| n > 0), "{status}");
    }
    // AND every order arrived exactly as the operator steered it
    let mut expected = times(1..=5, 1);
    expected.extend(times(6..=7, 2));
    expected.insert(10, 1);
    assert_eq!(counts(&host.delivered("changes")), expected);
}

#[tokio::test]
async fn every_state_action_works_through_the_cli() {
    every_action_through(Channel::Cli).await;
}

#[tokio::test]
async fn every_state_action_works_through_the_admin_function() {
    every_action_through(Channel::AdminFunction).await;
}

#[tokio::test]
async fn every_state_action_works_through_the_direct_admin_route() {
    every_action_through(Channel::DirectRoute).await;
}

#[tokio::test]
async fn status_reports_exact_pending_and_target_workers_for_a_large_backlog() {
    // GIVEN MaxChangesPerWorker 1000 and 2,500 orders
    let orders = Orders::new("ops_scale").await;
    let app =
        admin_app(&orders, &unique_app_name("ops-scale"), json!({}), &[("Sql_Trigger_MaxChangesPerWorker", "1000")]);
    let host = start(&app).await;
    orders.insert(1..=2500).await;

    // WHEN any way in asks for status THEN 2,500 are pending, for ceil(2500 / 1000) = 3 workers
    for channel in CHANNELS {
        let status = status_when_pending(channel, &app, Some(&host), 2500).await;
        assert_eq!(status["target_workers"], 3, "{channel:?}: {status}");
    }

    // WHEN one batch of 100 is in flight THEN it still counts; once acknowledged, 2,400 remain
    assert_eq!(fire_until_delivered(&host, FUNCTION).await.len(), 100);
    let status = act(Channel::Cli, &app, None, FUNCTION, &Action::Status).await.expect_ok("status");
    assert_eq!((&status["pending"], &status["in_flight"]["rows"]), (&json!(2500), &json!(100)), "{status}");
    host.run_timer(FUNCTION).await.expect("timer");
    let status = act(Channel::Cli, &app, None, FUNCTION, &Action::Status).await.expect_ok("status");
    assert_eq!((&status["pending"], &status["target_workers"]), (&json!(2400), &json!(3)), "{status}");
}

// ---------------------------------------------------------------------------------------------------------------
// Quarantine
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn quarantine_retry_redelivers_exactly_the_quarantined_changes_and_keeps_the_checkpoint() {
    let orders = Orders::new("ops_quarantine").await;
    let app_name = unique_app_name("ops-q");
    let poison = [("Sql_Trigger_MaxAttempts", "2"), ("Sql_Trigger_PoisonAfterMs", "0")];
    let app = admin_app(&orders, &app_name, json!({}), &poison);
    let host = start(&app).await;
    let store = shared_blob_store();

    // GIVEN orders 1-3 quarantined as batch 1 (two failed writes), then orders 4-5 delivered
    orders.insert(1..=3).await;
    host.fail_output_writes("changes", 2);
    fire_until_answered(&host, FUNCTION).await;
    orders.insert(4..=5).await;
    assert_eq!(ids_of(&fire_until_delivered(&host, FUNCTION).await), vec![4, 5]);
    drain(&host, 3).await;
    let checkpoint = state(&store, &app_name).await.0.checkpoint().clone();
    let key = format!("{}{:020}.json", quarantine_prefix(&app_name), 1);

    for channel in CHANNELS {
        // WHEN the operator lists and shows the quarantine
        let listed = act(channel, &app, Some(&host), FUNCTION, &Action::QuarantineList).await.expect_ok("list");
        let shown = act(channel, &app, Some(&host), FUNCTION, &Action::QuarantineShow(1)).await.expect_ok("show");
        // THEN batch 1 is there with exactly orders 1-3
        assert_eq!(listed["documents"], json!([key]), "{channel:?}: {listed}");
        assert_eq!(listed["recent"][0]["rows"], 3, "{channel:?}: {listed}");
        assert_eq!((&shown["batch_id"], &shown["failures"]), (&json!(1), &json!(2)), "{channel:?}: {shown}");
        let quarantined: Vec<Value> = serde_json::from_value(shown["changes"].clone()).expect("changes");
        assert_eq!(ids_of(&quarantined), vec![1, 2, 3]);

        // WHEN it is retried
        let queued = act(channel, &app, Some(&host), FUNCTION, &Action::QuarantineRetry(1)).await.expect_ok("retry");
        assert_eq!(queued["queued"], json!([1]), "{channel:?}: {queued}");
        // THEN exactly orders 1-3 are delivered again, and the checkpoint never moves
        assert_eq!(ids_of(&fire_until_delivered(&host, FUNCTION).await), vec![1, 2, 3], "{channel:?}");
        assert_eq!(*state(&store, &app_name).await.0.checkpoint(), checkpoint);
        drain(&host, 3).await;
        let (doc, _) = state(&store, &app_name).await;
        assert_eq!(*doc.checkpoint(), checkpoint, "{channel:?}");
        assert!(doc.in_flight().is_none() && doc.retry_quarantined().is_empty(), "{channel:?}: {doc:?}");
    }
    // AND each retry delivered the quarantined orders once more, and nothing else moved
    let mut expected = times(1..=3, 3);
    expected.extend(times(4..=5, 1));
    assert_eq!(counts(&host.delivered("changes")), expected);

    // AND an unknown batch is refused with the document it looked for
    act(Channel::DirectRoute, &app, Some(&host), FUNCTION, &Action::QuarantineRetry(42)).await.expect_refused(
        "retry of an unknown batch",
        404,
        "00000000000000000042.json",
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Pauses and races
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_pause_between_a_failed_write_and_its_retry_does_not_lose_the_batch() {
    let orders = Orders::new("ops_pause_retry").await;
    let app = admin_app(&orders, &unique_app_name("ops-pr"), json!({}), &[]);
    let host = start(&app).await;

    // GIVEN batch 1 (orders 1-3) answered, and the host's write of it failed
    orders.insert(1..=3).await;
    let failed = invoke_until_answered(&host, FUNCTION).await;
    // AND the operator pauses before the host's retry (naming the failed attempt), which is answered empty
    act(Channel::Cli, &app, None, FUNCTION, &Action::Pause).await.expect_ok("pause");
    let retry = host.retry(FUNCTION, 1, &failed).await.expect("retry");
    assert!(answered_changes(&retry).is_empty(), "{}", retry.body);

    // WHEN the operator resumes and the timer fires
    act(Channel::Cli, &app, None, FUNCTION, &Action::Resume).await.expect_ok("resume");
    let delivered = fire_until_delivered(&host, FUNCTION).await;

    // THEN batch 1 is delivered, not taken as written
    assert_eq!(ids_of(&delivered), vec![1, 2, 3]);
}

#[tokio::test]
async fn concurrent_actions_and_ticks_conflict_cleanly_and_never_lose_a_write() {
    let orders = Orders::new("ops_race").await;
    let app_name = unique_app_name("ops-race");
    let app = admin_app(&orders, &app_name, json!({}), &[]);
    let host = start(&app).await;
    let store = shared_blob_store();

    // GIVEN orders 1-3 delivered and acknowledged
    orders.insert(1..=3).await;
    fire_until_delivered(&host, FUNCTION).await;
    drain(&host, 3).await;
    let end = state(&store, &app_name).await.0.checkpoint().clone();
    assert!(end.is_array());

    let mut conflicts = 0;
    for round in 0..8 {
        // WHEN a pause, a replay from the beginning and a timer invocation race
        let replay_from_start = Action::Replay { from: "null".into() };
        let (pause, replay, _tick) = tokio::join!(
            act(Channel::DirectRoute, &app, Some(&host), FUNCTION, &Action::Pause),
            act(Channel::AdminFunction, &app, Some(&host), FUNCTION, &replay_from_start),
            host.invoke(FUNCTION, None),
        );
        // THEN each action either held or failed with a conflict that says to run it again...
        for (name, answer) in [("pause", &pause), ("replay", &replay)] {
            if !answer.ok {
                conflicts += 1;
                assert_eq!(answer.status, 409, "round {round}: {name}: {}", answer.error);
                assert!(answer.error.contains("run it again"), "round {round}: {name}: {}", answer.error);
            }
        }
        // ...and every action that reported success is in the final state (a tick never touches either field)
        let (doc, _) = state(&store, &app_name).await;
        assert_eq!(doc.paused(), pause.ok, "round {round}: pause answered {pause:?} but paused = {}", doc.paused());
        let expected_checkpoint = if replay.ok { Value::Null } else { end.clone() };
        assert_eq!(*doc.checkpoint(), expected_checkpoint, "round {round}: replay answered {replay:?}");

        // Back to the start for the next round: unpaused, at the end, nothing in flight
        act(Channel::DirectRoute, &app, Some(&host), FUNCTION, &Action::Resume).await.expect_ok("resume");
        act(Channel::DirectRoute, &app, Some(&host), FUNCTION, &Action::Reset { to: end.to_string(), confirm: true })
            .await
            .expect_ok("reset");
    }
    eprintln!("concurrent actions: {conflicts} conflict(s) in 8 rounds");

    // AND two CLI pauses racing each other both end paused, or one says to run it again
    let (a, b) = tokio::join!(
        act(Channel::Cli, &app, None, FUNCTION, &Action::Pause),
        act(Channel::Cli, &app, None, FUNCTION, &Action::Pause)
    );
    assert!(a.ok || b.ok, "{a:?} {b:?}");
    for answer in [&a, &b].into_iter().filter(|a| !a.ok) {
        assert!(answer.error.contains("run it again"), "{}", answer.error);
    }
    assert!(state(&store, &app_name).await.0.paused());
}

// ---------------------------------------------------------------------------------------------------------------
// Who may act
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_direct_admin_request_without_the_key_or_with_a_wrong_key_is_401_and_changes_nothing() {
    let orders = Orders::new("ops_keys").await;
    let app_name = unique_app_name("ops-keys");
    let app = admin_app(&orders, &app_name, json!({}), &[]);
    let host = start(&app).await;
    drain(&host, 2).await;
    let store = shared_blob_store();
    let code = |key: &str| vec![("code".to_string(), key.to_string())];

    // WHEN pause is sent with no key, a wrong header key, a wrong code, or a key that only starts right
    let refused = [
        direct(&host, "POST", "OrdersChanged/pause", &[], None).await,
        direct(&host, "POST", "OrdersChanged/pause", &[], Some("wrong")).await,
        direct(&host, "POST", "OrdersChanged/pause", &code("wrong"), None).await,
        direct(&host, "POST", "OrdersChanged/pause", &[], Some(&ADMIN_KEY[..ADMIN_KEY.len() - 1])).await,
        direct(&host, "GET", "", &[], None).await,
    ];
    // THEN each is 401 with what to send, and the function is not paused
    for response in refused {
        assert_eq!(response.status().as_u16(), 401);
        let body: Value = response.json().await.expect("JSON");
        assert!(body["error"].as_str().is_some_and(|m| m.contains("x-functions-key")), "{body}");
    }
    assert!(!state(&store, &app_name).await.0.paused());
    // AND the key in `code` works as well as in the header
    let listed = direct(&host, "GET", "", &code(ADMIN_KEY), None).await;
    assert_eq!(listed.status().as_u16(), 200);
    assert_eq!(listed.json::<Value>().await.expect("JSON")["functions"], json!([FUNCTION]));
    // AND the root with a trailing slash answers the same, with the key and without it
    let url = format!("{}/admin/", host.base_url());
    let slash = support::http_client().get(&url).header("x-functions-key", ADMIN_KEY).send().await.expect("answer");
    assert_eq!(slash.status().as_u16(), 200);
    assert_eq!(slash.json::<Value>().await.expect("JSON")["functions"], json!([FUNCTION]));
    let refused = support::http_client().get(&url).send().await.expect("answer");
    assert_eq!(refused.status().as_u16(), 401);
    // AND the CLI names the configured functions when asked about another
    let output = handler_cli(app.root(), &Action::Status.cli_args("Nope")).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("\"Nope\"") && stderr.contains(FUNCTION), "{stderr}");
}

#[tokio::test]
async fn without_an_admin_key_the_direct_routes_are_404_and_the_admin_function_still_answers() {
    // GIVEN an app with the admin function and no Sql_Trigger_AdminKey
    let orders = Orders::new("ops_nokey").await;
    let app = orders_app(&orders, &unique_app_name("ops-nokey"), json!({}), &[]);
    add_admin_function(app.root());
    let host = start(&app).await;

    // WHEN the direct route is called, with or without some key
    for key in [None, Some("anything")] {
        let response = direct(&host, "GET", "OrdersChanged/status", &[], key).await;
        // THEN it is 404 and says how to turn it on
        assert_eq!(response.status().as_u16(), 404);
        let body: Value = response.json().await.expect("JSON");
        let message = body["error"].as_str().unwrap_or_default();
        assert!(message.contains("Sql_Trigger_AdminKey") && message.contains("admin function"), "{body}");
    }
    // AND the admin function, which the host's function keys protect, still answers
    let status = act(Channel::AdminFunction, &app, Some(&host), FUNCTION, &Action::Status).await.expect_ok("status");
    assert_eq!(status["function"], FUNCTION);
}

#[tokio::test]
async fn an_admin_function_with_anonymous_auth_is_refused_at_start_up() {
    // GIVEN the admin template with authLevel anonymous
    let orders = Orders::new("ops_anon").await;
    let app = orders_app(&orders, &unique_app_name("ops-anon"), json!({}), &[]);
    add_admin_function(app.root());
    let path = app.root().join(ADMIN_FUNCTION).join("function.json");
    let text = std::fs::read_to_string(&path).expect("template");
    std::fs::write(&path, text.replace("\"function\"", "\"anonymous\"")).expect("write");

    // WHEN the handler starts under the host THEN it exits before it is ready, saying why and what to set
    let err = HostDriver::start(app.driver_options()).await.expect_err("an anonymous admin function is refused");
    let message = err.to_string();
    assert!(message.contains("SqlTriggerAdmin/function.json"), "{message}");
    assert!(message.contains("authLevel anonymous") && message.contains("\"authLevel\": \"function\""), "{message}");
    // AND the CLI refuses the app the same way
    let output = handler_cli(app.root(), &Action::Status.cli_args(FUNCTION)).await;
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("authLevel anonymous"));
}

// ---------------------------------------------------------------------------------------------------------------
// Positions an operator types
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn replay_or_reset_to_a_position_the_source_cannot_read_is_refused_and_changes_nothing() {
    let orders = Orders::new("ops_badpos").await;
    let app_name = unique_app_name("ops-badpos");
    let app = admin_app(&orders, &app_name, json!({}), &[]);
    let host = start(&app).await;
    let store = shared_blob_store();
    orders.insert(1..=2).await;
    fire_until_delivered(&host, FUNCTION).await;
    drain(&host, 3).await;
    let (before, _) = state(&store, &app_name).await;

    // WHEN an operator replays or resets to positions that do not fit the orders table's (xid8, id) cursor
    for position in ["42", r#"["1"]"#, r#"{"xid":"1"}"#] {
        for action in [Action::Replay { from: position.into() }, Action::Reset { to: position.into(), confirm: true }] {
            // THEN the action is refused and names the position
            let answer = act(Channel::Cli, &app, None, FUNCTION, &action).await;
            assert!(!answer.ok, "{action:?} was accepted: {}", answer.body);
            assert!(answer.error.contains("position"), "{action:?}: {}", answer.error);
        }
    }
    // AND the function still works from where it was
    let (after, _) = state(&store, &app_name).await;
    assert_eq!((after.checkpoint(), after.write_id()), (before.checkpoint(), before.write_id()));
    orders.insert([3]).await;
    assert_eq!(ids_of(&fire_until_delivered(&host, FUNCTION).await), vec![3]);
    assert_eq!(tally(&host.delivered("changes")).0, BTreeSet::from([1, 2, 3]));
}
