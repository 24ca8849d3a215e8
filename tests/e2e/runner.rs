//! `handler run` end to end: the real binary draining real PostgreSQL into a webhook this test serves (or
//! stdout), with state in the shared Azurite or in files, through outages of the receiver, poison batches and
//! SIGTERM.

use crate::common::*;
use crate::operations::handler_cli;
use crate::support::{self, AppFolder};
use axum::http::{HeaderMap, StatusCode};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::embedded::{self, ScratchDir, Signal};

// ---------------------------------------------------------------------------------------------------------------
// A webhook receiver
// ---------------------------------------------------------------------------------------------------------------

/// One POST the receiver got.
#[derive(Debug, Clone)]
pub(crate) struct Received {
    pub(crate) idempotency_key: String,
    batch_id: u64,
    pub(crate) ids: Vec<i64>,
    pub(crate) status: u16,
    /// The first change's `Metadata.Backfill` (`null` in a live batch).
    pub(crate) backfill: Value,
}

/// How the receiver behaves.
#[derive(Debug, Clone, Default)]
pub(crate) struct Behaviour {
    /// Answer 503 to this many requests first.
    pub(crate) unavailable_first: usize,
    /// Answer 400 to any batch holding this order, forever.
    pub(crate) poison: Option<i64>,
    /// Take this long over each request.
    pub(crate) delay: Duration,
}

/// A webhook on 127.0.0.1 that records every request (body and `Idempotency-Key`) and answers per [`Behaviour`].
#[derive(Debug, Clone)]
pub(crate) struct Webhook {
    pub(crate) url: String,
    behaviour: Arc<Mutex<Behaviour>>,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Webhook {
    pub(crate) async fn start(behaviour: Behaviour) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the webhook");
        let url = format!("http://{}/hooks/orders", listener.local_addr().expect("address"));
        let hook = Self { url, behaviour: Arc::new(Mutex::new(behaviour)), received: Arc::default() };
        let state = hook.clone();
        let app = axum::Router::new().route(
            "/hooks/orders",
            axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                let state = state.clone();
                async move { state.receive(&headers, &body).await }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await });
        hook
    }

    async fn receive(&self, headers: &HeaderMap, body: &[u8]) -> StatusCode {
        let body: Value = serde_json::from_slice(body).expect("the webhook body is JSON");
        let ids = ids_of(body["changes"].as_array().expect("changes"));
        let behaviour = self.behaviour.lock().expect("behaviour").clone();
        tokio::time::sleep(behaviour.delay).await;
        let mut received = self.received.lock().expect("received");
        let status = if received.len() < behaviour.unavailable_first {
            503
        } else if behaviour.poison.is_some_and(|p| ids.contains(&p)) {
            400
        } else {
            200
        };
        received.push(Received {
            idempotency_key: headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .expect("an Idempotency-Key header")
                .to_string(),
            batch_id: body["batch_id"].as_u64().expect("batch_id"),
            ids,
            status,
            backfill: body.pointer("/changes/0/Metadata/Backfill").cloned().unwrap_or(Value::Null),
        });
        StatusCode::from_u16(status).expect("a status")
    }

    pub(crate) fn received(&self) -> Vec<Received> {
        self.received.lock().expect("received").clone()
    }

    fn set(&self, behaviour: Behaviour) {
        *self.behaviour.lock().expect("behaviour") = behaviour;
    }

    /// How many times each order was accepted (answered 200).
    fn accepted(&self) -> BTreeMap<i64, usize> {
        let mut counts = BTreeMap::new();
        for r in self.received().into_iter().filter(|r| r.status == 200) {
            for id in r.ids {
                *counts.entry(id).or_insert(0) += 1;
            }
        }
        counts
    }

    fn accepted_batches(&self) -> usize {
        self.received().iter().filter(|r| r.status == 200).count()
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The runner process
// ---------------------------------------------------------------------------------------------------------------

/// A `handler run` process; killed on drop if it still runs.
pub(crate) struct Runner {
    child: Child,
    logs: ScratchDir,
}

impl Runner {
    pub(crate) fn start(app: &AppFolder, args: &[&str]) -> Self {
        Self::start_with(app, args, &[])
    }

    /// [`Runner::start`] with `env` added to the process's environment (failpoints).
    pub(crate) fn start_with(app: &AppFolder, args: &[&str], env: &[(&str, &str)]) -> Self {
        let logs = ScratchDir::new("runner").expect("a scratch directory");
        let file = |name: &str| std::fs::File::create(logs.path().join(name)).expect("a log file");
        let mut command = Command::new(support::handler_exe());
        command
            .arg("--app-root")
            .arg(app.root())
            .arg("run")
            .args(args)
            .env_remove("FUNCTIONS_APP_ROOT_PATH")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(file("stdout"))
            .stderr(file("stderr"));
        let child = embedded::spawn_owned(command, Signal::Kill).expect("handler run starts");
        Self { child, logs }
    }

    pub(crate) fn stdout(&self) -> String {
        std::fs::read_to_string(self.logs.path().join("stdout")).unwrap_or_default()
    }

    pub(crate) fn stderr(&self) -> String {
        std::fs::read_to_string(self.logs.path().join("stderr")).unwrap_or_default()
    }

    /// Waits for the exit, failing the test after `limit`.
    pub(crate) async fn exit(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for handler run") {
                return status;
            }
            assert!(Instant::now() < deadline, "handler run did not exit within {limit:?}:\n{}", self.stderr());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// SIGTERM, as a container runtime sends on stop.
    pub(crate) fn terminate(&mut self) {
        embedded::send_signal(&mut self.child, Signal::Terminate).expect("SIGTERM");
    }

    /// kill -9, as a node that dies does; returns once the process is gone.
    pub(crate) fn kill(&mut self) {
        embedded::send_signal(&mut self.child, Signal::Kill).expect("SIGKILL");
        let _ = self.child.wait();
    }

    /// The process id (the middle part of its owner id in leases).
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        let _ = embedded::send_signal(&mut self.child, Signal::Kill);
        let _ = self.child.wait();
    }
}

/// Runs `handler run --once` and returns it after a successful exit.
async fn run_once(app: &AppFolder) -> Runner {
    let mut runner = Runner::start(app, &["--once"]);
    let status = runner.exit(Duration::from_secs(60)).await;
    assert!(status.success(), "handler run --once failed ({status}):\n{}", runner.stderr());
    runner
}

/// Waits until `n` orders are readable past the xid8 late-commit guard (at most 10 s). Once all are, they
/// stay so: a drain that starts after this sees every one of them.
async fn wait_until_visible(orders: &Orders, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let visible: i64 = orders
            .db
            .query_one("SELECT count(*) FROM orders WHERE version < pg_snapshot_xmin(pg_current_snapshot())", &[])
            .await
            .expect("count")
            .get(0);
        if visible == n {
            return;
        }
        assert!(Instant::now() < deadline, "only {visible} of {n} orders became visible within 10 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The orders app with `sink` in its sqltrigger.json, a short polling interval and `settings`.
pub(crate) fn runner_app(orders: &Orders, app_name: &str, trigger: Value, settings: &[(&str, &str)]) -> AppFolder {
    let mut extra = json!({ "pollingIntervalMs": 10 });
    if let (Some(extra), Some(trigger)) = (extra.as_object_mut(), trigger.as_object()) {
        extra.extend(trigger.clone());
    }
    orders_app(orders, app_name, extra, settings)
}

pub(crate) fn webhook_sink(url: &str) -> Value {
    // No retries inside the sink: every failure goes back to the runner, which re-delivers as a retry.
    json!({ "type": "webhook", "url": url, "maxRetries": 0, "timeoutMs": 5000 })
}

const FILE_STATE: (&str, &str) = ("Sql_Trigger_StateStore", "file");

async fn cli_json(app: &AppFolder, args: &[&str]) -> Value {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output = handler_cli(app.root(), &args).await;
    assert!(output.status.success(), "handler {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

fn each(ids: impl IntoIterator<Item = i64>) -> BTreeMap<i64, usize> {
    ids.into_iter().map(|id| (id, 1)).collect()
}

// ---------------------------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn run_once_drains_a_backlog_into_a_webhook_with_one_idempotency_key_per_batch() {
    // GIVEN 2,500 orders, batches of 100, a webhook, and state in the shared Azurite
    let orders = Orders::new("run_webhook").await;
    let app_name = unique_app_name("run-hook");
    let hook = Webhook::start(Behaviour::default()).await;
    let app = runner_app(&orders, &app_name, json!({ "maxBatchSize": 100, "sink": webhook_sink(&hook.url) }), &[]);
    orders.insert(1..=2500).await;
    wait_until_visible(&orders, 2500).await;

    // WHEN `handler run --once` drains it
    let started = Instant::now();
    let runner = run_once(&app).await;
    eprintln!("drained 2,500 orders into the webhook in {:?}", started.elapsed());

    // THEN every order arrived exactly once, in 25 batches of 100, each under its own idempotency key
    assert_eq!(hook.accepted(), each(1..=2500));
    let received = hook.received();
    assert_eq!(received.len(), 25);
    assert!(received.iter().all(|r| r.ids.len() == 100 && r.status == 200));
    let keys: BTreeSet<&str> = received.iter().map(|r| r.idempotency_key.as_str()).collect();
    assert_eq!(keys.len(), 25, "idempotency keys repeat: {keys:?}");
    for r in &received {
        assert_eq!(r.idempotency_key, format!("{app_name}/{FUNCTION}/{}", r.batch_id));
    }
    // AND stdout carried nothing but the sink's (none here), the state in Azurite has nothing pending or in flight
    assert!(runner.stdout().is_empty(), "{}", runner.stdout());
    let status = cli_json(&app, &["state", "status", FUNCTION]).await;
    assert_eq!((&status["pending"], &status["in_flight"]), (&json!(0), &Value::Null), "{status}");
    let (doc, _) = state(&shared_blob_store(), &app_name).await;
    assert_eq!(doc.counters().delivered, 2500);
}

#[tokio::test]
async fn run_once_with_the_stdout_sink_prints_one_json_line_per_change_and_keeps_state_in_files() {
    // GIVEN 300 orders (three transactions of 100: see the ignored test below for one split across batches),
    // the default (stdout) sink, and the file state store
    let orders = Orders::new("run_stdout").await;
    let app = runner_app(&orders, &unique_app_name("run-out"), json!({ "maxBatchSize": 100 }), &[FILE_STATE]);
    for first in [1, 101, 201] {
        orders.insert(first..=first + 99).await;
    }
    wait_until_visible(&orders, 300).await;

    // WHEN `handler run --once` drains it
    let runner = run_once(&app).await;

    // THEN stdout is JSON lines, one per change, naming the function and batch, and holding every order once
    let lines: Vec<Value> = runner
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
        .collect();
    assert_eq!(lines.len(), 300);
    for line in &lines {
        assert!(line["function"] == FUNCTION && line["Operation"] == 0, "{line}");
    }
    let batches: BTreeSet<u64> = lines.iter().map(|l| l["batch_id"].as_u64().expect("batch_id")).collect();
    assert_eq!(batches, BTreeSet::from([1, 2, 3]));
    assert_eq!(tally(&lines).1, each(1..=300));
    // AND the logs went to stderr, and the state to a file under the app root
    assert!(runner.stderr().contains("run finished"), "{}", runner.stderr());
    let state_dir = app.root().join(".sql-pseudo-trigger");
    assert!(state_dir.is_dir(), "no file state under {}", app.root().display());
    let shown = cli_json(&app, &["state", "show", FUNCTION]).await;
    assert_eq!(shown["state"]["counters"]["delivered"], 300, "{shown}");
}

#[tokio::test]
async fn a_webhook_unavailable_for_longer_than_max_attempts_gets_the_same_batch_again_and_quarantines_nothing() {
    // GIVEN a webhook that answers 503 to its first 3 requests, MaxAttempts 2, and 20 orders in batches of 10
    let orders = Orders::new("run_503").await;
    let hook = Webhook::start(Behaviour { unavailable_first: 3, ..Behaviour::default() }).await;
    let app = runner_app(
        &orders,
        &unique_app_name("run-503"),
        json!({ "maxBatchSize": 10, "sink": webhook_sink(&hook.url) }),
        &[FILE_STATE, ("Sql_Trigger_MaxAttempts", "2")],
    );
    orders.insert(1..=20).await;
    wait_until_visible(&orders, 20).await;

    // WHEN `handler run --once` drains it
    let runner = run_once(&app).await;

    // THEN batch 1 was posted four times, identically, and taken the fourth time; batch 2 once
    let received = hook.received();
    let summary: Vec<(u64, u16)> = received.iter().map(|r| (r.batch_id, r.status)).collect();
    assert_eq!(summary, vec![(1, 503), (1, 503), (1, 503), (1, 200), (2, 200)]);
    assert!(received[..4].iter().all(|r| r.ids == received[0].ids && r.idempotency_key == received[0].idempotency_key));
    // AND every order was taken exactly once
    assert_eq!(hook.accepted(), each(1..=20));
    assert!(runner.stderr().contains("answered 503 Service Unavailable"), "{}", runner.stderr());
    // AND an outage is not the batch's fault: nothing was quarantined
    let listed = cli_json(&app, &["state", "quarantine", "list", FUNCTION]).await;
    assert_eq!(listed["documents"], json!([]), "{listed}");
}

#[tokio::test]
async fn a_batch_the_webhook_rejects_max_attempts_times_is_quarantined_and_later_orders_still_arrive() {
    // GIVEN 30 orders in batches of 10, a webhook that answers 400 to any batch holding order 15, MaxAttempts 3
    let orders = Orders::new("run_poison").await;
    let app_name = unique_app_name("run-poison");
    let hook = Webhook::start(Behaviour { poison: Some(15), ..Behaviour::default() }).await;
    let app = runner_app(
        &orders,
        &app_name,
        json!({ "maxBatchSize": 10, "sink": webhook_sink(&hook.url) }),
        &[("Sql_Trigger_MaxAttempts", "3")],
    );
    orders.insert(1..=30).await;
    wait_until_visible(&orders, 30).await;

    // WHEN `handler run --once` drains it
    run_once(&app).await;

    // THEN batch 2 (orders 11-20) was refused 3 times and quarantined, and orders 1-10 and 21-30 arrived once
    let refused: Vec<u64> = hook.received().iter().filter(|r| r.status == 400).map(|r| r.batch_id).collect();
    assert_eq!(refused, vec![2, 2, 2]);
    let mut expected = each(1..=10);
    expected.extend(each(21..=30));
    assert_eq!(hook.accepted(), expected);
    let key = format!("{}{:020}.json", quarantine_prefix(&app_name), 2);
    let listed = cli_json(&app, &["state", "quarantine", "list", FUNCTION]).await;
    assert_eq!(listed["documents"], json!([key]), "{listed}");
    let shown = cli_json(&app, &["state", "quarantine", "show", FUNCTION, "2"]).await;
    let quarantined: Vec<Value> = serde_json::from_value(shown["changes"].clone()).expect("changes");
    assert_eq!(ids_of(&quarantined), (11..=20).collect::<Vec<_>>());
    assert_eq!(shown["failures"], 3);

    // WHEN the webhook is fixed, the operator retries the quarantined batch and the runner drains again
    hook.set(Behaviour::default());
    let checkpoint = state(&shared_blob_store(), &app_name).await.0.checkpoint().clone();
    cli_json(&app, &["state", "quarantine", "retry", FUNCTION, "2"]).await;
    let before = hook.received().len();
    run_once(&app).await;

    // THEN exactly orders 11-20 arrive, once, and the checkpoint has not moved
    let again: Vec<Received> = hook.received()[before..].to_vec();
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!((again[0].status, again[0].ids.clone()), (200, (11..=20).collect::<Vec<_>>()));
    assert_eq!(*state(&shared_blob_store(), &app_name).await.0.checkpoint(), checkpoint);
}

#[tokio::test]
async fn sigterm_mid_drain_finishes_the_batch_in_hand_and_the_next_run_delivers_the_rest() {
    // GIVEN 2,000 orders in batches of 50, a webhook that takes 40 ms per batch, and file state
    let orders = Orders::new("run_sigterm").await;
    let hook = Webhook::start(Behaviour { delay: Duration::from_millis(40), ..Behaviour::default() }).await;
    let app = runner_app(
        &orders,
        &unique_app_name("run-term"),
        json!({ "maxBatchSize": 50, "sink": webhook_sink(&hook.url) }),
        &[FILE_STATE],
    );
    orders.insert(1..=2000).await;
    wait_until_visible(&orders, 2000).await;

    // WHEN `handler run` is draining and gets SIGTERM after a few batches
    let mut runner = Runner::start(&app, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while hook.accepted_batches() < 5 {
        assert!(Instant::now() < deadline, "the runner delivered nothing:\n{}", runner.stderr());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    runner.terminate();
    let status = runner.exit(Duration::from_secs(10)).await;

    // THEN it exits 0 before the end of the backlog, having acknowledged its last batch
    assert!(status.success(), "exit after SIGTERM: {status}\n{}", runner.stderr());
    let first = hook.accepted();
    assert!(first.len() < 2000, "the drain finished before SIGTERM; nothing was tested");
    // (each batch is acknowledged by the tick that delivered it; one recorded for the next tick is withdrawn)
    assert!(runner.stderr().contains("stopping: finishing the batch in hand"), "{}", runner.stderr());
    let shown = cli_json(&app, &["state", "show", FUNCTION]).await;
    assert_eq!(shown["state"]["in_flight"], Value::Null, "{shown}");

    // WHEN the runner runs again with --once
    let before = hook.received().len();
    run_once(&app).await;

    // THEN together the two runs delivered every order, and at most the batch in hand twice
    let all = hook.accepted();
    assert_eq!(all.keys().copied().collect::<BTreeSet<_>>(), (1..=2000).collect::<BTreeSet<_>>());
    let duplicates: usize = all.values().map(|n| n - 1).sum();
    assert!(duplicates <= 50, "{duplicates} duplicates");
    eprintln!(
        "SIGTERM after {} orders; the second run delivered {} batches; {duplicates} duplicate(s)",
        first.len(),
        hook.received().len() - before
    );
}

#[tokio::test]
async fn the_admin_routes_of_a_running_runner_pause_and_resume_its_deliveries() {
    // GIVEN `handler run --admin-port` with an admin key, delivering orders 1-5 to a webhook
    let orders = Orders::new("run_admin").await;
    let hook = Webhook::start(Behaviour::default()).await;
    let key = "runner-admin-key";
    let app = runner_app(
        &orders,
        &unique_app_name("run-admin"),
        json!({ "sink": webhook_sink(&hook.url) }),
        &[FILE_STATE, ("Sql_Trigger_AdminKey", key)],
    );
    let port = embedded::free_port().expect("a free port").to_string();
    let mut runner = Runner::start(&app, &["--admin-port", &port]);
    let admin = |method: &str, path: &str| {
        let url = format!("http://127.0.0.1:{port}/admin/{FUNCTION}/{path}");
        let request = if method == "GET" { support::http_client().get(url) } else { support::http_client().post(url) };
        async move {
            let response = request.header("x-functions-key", key).send().await.expect("the admin routes answer");
            (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    // A write racing one of the runner's ticks gets 409 "run it again", as documented: do what it says, a
    // bounded number of times.
    let admin_write = |path: &'static str| {
        let admin = &admin;
        async move {
            for _ in 0..20 {
                let (code, body) = admin("POST", path).await;
                if code != 409 {
                    return (code, body);
                }
            }
            panic!("{path} conflicted 20 times in a row");
        }
    };
    orders.insert(1..=5).await;
    wait_for(&runner, || hook.accepted().len() == 5, "orders 1-5").await;

    // WHEN an operator pauses it through its admin route and orders 6-8 arrive
    assert_eq!(admin_write("pause").await.0, 200);
    orders.insert(6..=8).await;
    wait_until_visible(&orders, 8).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        let (code, status) = admin("GET", "status").await;
        assert_eq!(code, 200, "{status}");
        // Pending counts orders 6-8, and batch 1 too if the pause came before the tick that acknowledges it
        let in_flight = status["in_flight"]["rows"].as_u64().unwrap_or(0);
        if status["last_tick"]["outcome"] == "Paused" && status["pending"] == 3 + in_flight {
            break status;
        }
        assert!(Instant::now() < deadline, "the runner did not report a paused tick: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // AND the runner ticks twice more while paused (an event to wait for, not a time)
    let ticks = status["last_tick"]["ticks"].as_u64().expect("a tick count");
    loop {
        let (_, later) = admin("GET", "status").await;
        assert_eq!(later["last_tick"]["outcome"], "Paused", "{later}");
        if later["last_tick"]["ticks"].as_u64().unwrap_or(0) >= ticks + 2 {
            break;
        }
        assert!(Instant::now() < deadline + Duration::from_secs(10), "the runner stopped ticking: {later}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // THEN status says paused, and nothing more reached the webhook
    assert_eq!(status["paused"], true);
    assert_eq!(hook.accepted(), each(1..=5));

    // WHEN it is resumed THEN orders 6-8 follow, and SIGTERM ends the run cleanly
    assert_eq!(admin_write("resume").await.0, 200);
    wait_for(&runner, || hook.accepted().len() == 8, "orders 6-8").await;
    assert_eq!(hook.accepted(), each(1..=8));
    runner.terminate();
    let status = runner.exit(Duration::from_secs(10)).await;
    assert!(status.success(), "{status}\n{}", runner.stderr());
}

#[tokio::test]
async fn run_with_an_admin_port_but_no_admin_key_refuses_to_start_and_names_the_setting() {
    // GIVEN an app without Sql_Trigger_AdminKey, and orders waiting
    let orders = Orders::new("run_nokey").await;
    let app = runner_app(&orders, &unique_app_name("run-nokey"), json!({}), &[FILE_STATE]);
    orders.insert(1..=3).await;
    let port = embedded::free_port().expect("a free port").to_string();

    // WHEN `handler run --admin-port` starts
    let mut runner = Runner::start(&app, &["--admin-port", &port]);
    let status = runner.exit(Duration::from_secs(10)).await;

    // THEN it exits non-zero before doing anything, naming the setting and the way out
    assert!(!status.success(), "started without an admin key: {}", runner.stderr());
    let stderr = runner.stderr();
    assert!(stderr.contains("error: --admin-port needs the app setting Sql_Trigger_AdminKey"), "{stderr}");
    assert!(stderr.contains("or drop --admin-port"), "{stderr}");
    // AND it delivered nothing and wrote no state
    assert!(runner.stdout().is_empty(), "{}", runner.stdout());
    assert!(!app.root().join(".sql-pseudo-trigger").exists(), "state was written");
}

#[tokio::test]
async fn run_once_that_stops_at_a_halted_function_exits_non_zero_naming_it() {
    // GIVEN PoisonAction halt, MaxAttempts 2, and a webhook that refuses the batch holding order 2
    let orders = Orders::new("run_halt").await;
    let hook = Webhook::start(Behaviour { poison: Some(2), ..Behaviour::default() }).await;
    let app = runner_app(
        &orders,
        &unique_app_name("run-halt"),
        json!({ "sink": webhook_sink(&hook.url) }),
        &[FILE_STATE, ("Sql_Trigger_MaxAttempts", "2"), ("Sql_Trigger_PoisonAction", "halt")],
    );
    orders.insert(1..=3).await;
    wait_until_visible(&orders, 3).await;

    // WHEN `handler run --once` drains it
    let mut runner = Runner::start(&app, &["--once"]);
    let status = runner.exit(Duration::from_secs(30)).await;

    // THEN the batch was refused twice, the function halted, and the exit status says the drain did not finish
    let refused: Vec<u16> = hook.received().iter().map(|r| r.status).collect();
    assert_eq!(refused, vec![400, 400]);
    assert!(!status.success(), "a halted drain exited 0:\n{}", runner.stderr());
    let stderr = runner.stderr();
    assert!(stderr.contains("error: the drain stopped before the end of the backlog"), "{stderr}");
    assert!(stderr.contains(&format!("function {FUNCTION}: function {FUNCTION} is halted")), "{stderr}");
}

#[tokio::test]
async fn run_once_exits_zero_after_a_clean_drain_and_non_zero_once_the_source_changed_under_its_state() {
    // GIVEN a function drained once, cleanly
    let orders = Orders::new("run_changed").await;
    let app = runner_app(&orders, &unique_app_name("run-changed"), json!({}), &[FILE_STATE]);
    orders.insert(1..=3).await;
    wait_until_visible(&orders, 3).await;
    run_once(&app).await;

    // WHEN its cursor column is changed in sqltrigger.json and it drains again
    let path = app.root().join(FUNCTION).join("sqltrigger.json");
    let mut trigger: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    trigger["cursorColumn"] = json!("created_version");
    std::fs::write(&path, trigger.to_string()).expect("write");
    let mut runner = Runner::start(&app, &["--once"]);
    let status = runner.exit(Duration::from_secs(30)).await;

    // THEN it refuses the stored positions and exits non-zero with the error and what to run
    assert!(!status.success(), "a drain that could not start exited 0:\n{}", runner.stderr());
    let stderr = runner.stderr();
    assert!(
        stderr.contains(&format!("function {FUNCTION}: the source changed since the state was written")),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("handler state reset {FUNCTION}")), "{stderr}");
}

/// Polls `done` for at most 10 s while `runner` runs.
async fn wait_for(runner: &Runner, done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "{what} not delivered within 10 s:\n{}", runner.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn inserts_of_one_transaction_split_across_batches_are_all_reported_as_inserts() {
    // GIVEN 20 orders inserted by one transaction, and batches of 10
    let orders = Orders::new("run_split").await;
    let app = runner_app(&orders, &unique_app_name("run-split"), json!({ "maxBatchSize": 10 }), &[FILE_STATE]);
    orders.insert(1..=20).await;
    wait_until_visible(&orders, 20).await;

    // WHEN `handler run --once` drains it to stdout
    let runner = run_once(&app).await;

    // THEN all 20 are inserts, the second batch's included
    let lines: Vec<Value> = runner.stdout().lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert_eq!(ops(&lines), (1..=20).map(|id| (0, id)).collect::<Vec<_>>());
}
