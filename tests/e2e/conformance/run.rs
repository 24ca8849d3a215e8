//! Drives each path over the conformance table, with the helpers the other end-to-end tests use: the host
//! driver for the cursor and logical sources and for sink mode, `handler run` ([`Runner`]) for the stdout and
//! webhook sinks. Each function returns what the path delivered, as raw text, for the test to compare.

use super::oracle;
use super::schema::{self, Column, ROWS, TOAST_ROW};
use crate::common::*;
use crate::logical::{answered_items, answered_until, first_firing, logical_app, Db};
use crate::runner::Runner;
use crate::support::{self, AppFolder};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::driver::{AttemptOutcome, Received};

/// The database the rows live in: created with PostgreSQL's defaults, or with the hostile ones.
#[derive(Debug, Clone, Copy)]
pub enum Defaults {
    Default,
    Hostile,
}

impl Defaults {
    pub const BOTH: [Defaults; 2] = [Defaults::Default, Defaults::Hostile];

    pub fn label(self) -> &'static str {
        match self {
            Defaults::Default => "default database",
            Defaults::Hostile => "hostile database",
        }
    }

    /// The database's own settings, which every new session of it (the handler's) starts with.
    fn sql(self) -> &'static str {
        match self {
            Defaults::Default => "",
            Defaults::Hostile => {
                "DO $$ BEGIN
                    EXECUTE format('ALTER DATABASE %I SET timezone TO %L', current_database(), 'Asia/Kolkata');
                    EXECUTE format('ALTER DATABASE %I SET DateStyle TO %L', current_database(), 'SQL, DMY');
                    EXECUTE format('ALTER DATABASE %I SET IntervalStyle TO %L', current_database(), 'postgres_verbose');
                    EXECUTE format('ALTER DATABASE %I SET extra_float_digits TO %L', current_database(), '0');
                    EXECUTE format('ALTER DATABASE %I SET bytea_output TO %L', current_database(), 'escape');
                END $$;"
            }
        }
    }
}

/// The schema of a database of the suite: the types, `conf` of `columns` (and `extra` column definitions), and
/// the database settings.
fn ddl(defaults: Defaults, columns: &[&Column], extra: &str) -> String {
    format!("{}{}\n{}", schema::TYPES, schema::create_table("conf", columns, extra), defaults.sql())
}

/// A fresh database for the cursor source and the sinks: `conf` with an xid8 cursor and its rows, and an empty
/// `conf_copy` of the same columns for the PostgreSQL sink. Its URL.
pub async fn cursor_database(defaults: Defaults) -> String {
    let url = support::fixture().fresh_database("conformance").await;
    let db = testbed::embedded::connect(&url).await.expect("connect");
    let cursor = ", created_version xid8 NOT NULL DEFAULT pg_current_xact_id(), \
                  version xid8 NOT NULL DEFAULT pg_current_xact_id()";
    let all = schema::columns(false);
    let copy = schema::create_table("conf_copy", &all, "");
    db.batch_execute(&format!("{}\n{copy}", ddl(defaults, &all, cursor)))
        .await
        .unwrap_or_else(|e| panic!("schema: {e}"));
    db.batch_execute(&schema::insert_rows("conf", &all)).await.unwrap_or_else(|e| panic!("rows: {e}"));
    url
}

/// The cursor source's sqltrigger.json on `conf` (the conformance columns only), with `extra` keys.
fn cursor_trigger(extra: Value) -> Value {
    let columns: Vec<&str> = std::iter::once("id").chain(schema::names()).collect();
    let mut trigger = json!({
        "source": "postgres-cursor", "tableName": "public.conf", "connectionStringSetting": "PostgresConnectionString",
        "cursorColumn": "version", "insertedColumn": "created_version", "startFrom": "earliest", "columns": columns
    });
    if let (Some(t), Some(extra)) = (trigger.as_object_mut(), extra.as_object()) {
        t.extend(extra.clone());
    }
    trigger
}

/// An app of one function on `url`'s `conf`, blob state in the shared Azurite (file state with `file_state`).
fn app(url: &str, function: Value, trigger: Value, file_state: bool) -> AppFolder {
    let state = if file_state { "file" } else { "blob" };
    app_on(
        url,
        &unique_app_name("conformance"),
        function,
        trigger,
        &[("TargetDb", url), ("Sql_Trigger_StateStore", state)],
    )
}

/// What one run of the cursor source through the host gave: the Items the handler answered (raw) and the
/// message bodies the queue received.
pub struct HostRun {
    pub answered: Vec<String>,
    pub received: Vec<String>,
}

/// The cursor source on `url` through the host, with `messageFormat` `format`: timer firings until the queue
/// received a message per row (at most 30 s).
pub async fn cursor_through_the_host(url: &str, format: &str) -> HostRun {
    let trigger = cursor_trigger(json!({ "messageFormat": format }));
    let app = app(url, support::timer_function_json(Some(3)), trigger, false);
    let host = start(&app).await;
    let mut answered = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while host.received("changes").len() < ROWS {
        assert!(Instant::now() < deadline, "not every row within 30 s:\n{}", tail(&host.output()));
        let run = host.run_timer(FUNCTION).await.expect("timer run");
        assert!(
            run.succeeded,
            "timer run failed: {:?}\n{}",
            run.attempts.last().map(|a| &a.outcome),
            tail(&host.output())
        );
        for attempt in run.attempts.iter().filter(|a| matches!(a.outcome, AttemptOutcome::Applied)) {
            let invocation = attempt.invocation.as_ref().expect("an applied attempt was invoked");
            if format == "json" && !answered_changes(invocation).is_empty() {
                answered.extend(answered_items(invocation).into_iter().map(|(_, item)| item));
            }
        }
    }
    let received = host
        .received("changes")
        .into_iter()
        .map(|r| match r {
            Received::Message(bytes) => String::from_utf8(bytes).expect("a UTF-8 message"),
            other => panic!("a queue receives messages, got {other:?}"),
        })
        .collect();
    HostRun { answered, received }
}

/// What a logical source answered, what the oracle says it should have, and the handler's log.
pub struct LogicalRun {
    pub got: Vec<(i64, String)>,
    pub expected: Vec<(i64, String)>,
    pub log: String,
}

/// A logical source over a fresh `conf` of every column, or of the [`schema::HANDLER_BUILT`] ones (`reader`
/// `stream` or `sql`): the changes it answered for the inserts of every row and an update of [`TOAST_ROW`]
/// leaving its 1 MB values alone, and the oracle's Items for them (the inserts as inserted, the update as
/// updated), both as `(Operation, Item)` in commit order.
pub async fn logical(defaults: Defaults, reader: &str, handler_built: bool) -> LogicalRun {
    let columns = schema::columns(handler_built);
    let db = Db::shared("conformance_logical", &ddl(defaults, &columns, "")).await;
    let (app, _) = logical_app(&db, "public.conf", json!({ "reader": reader }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    let canonical = oracle::canonical_session(&db.url).await;
    db.db.batch_execute(&schema::insert_rows("conf", &columns)).await.unwrap_or_else(|e| panic!("rows: {e}"));
    let inserted = oracle::items(&canonical, "conf", &columns).await;
    db.db.batch_execute(&schema::update_leaving_toast("conf")).await.expect("update");
    let updated = oracle::items(&canonical, "conf", &columns).await;
    let mut expected: Vec<(i64, String)> = inserted.into_values().map(|item| (0, item)).collect();
    expected.push((1, updated[&TOAST_ROW].clone()));
    let got = answered_until(&host, expected.len()).await;
    LogicalRun { got, expected, log: host.output() }
}

/// The PostgreSQL sink in sink mode, one row per batch, from `conf` into `conf_copy` of the database at `url`:
/// fires until the copy has every row (at most 20 s). The ids missing then, and the handler's log.
pub async fn postgres_sink(url: &str, target: &tokio_postgres::Client) -> (Vec<i64>, String) {
    let sink = json!({ "type": "postgres", "tableName": "public.conf_copy", "connectionStringSetting": "TargetDb" });
    let trigger = cursor_trigger(json!({ "deliveryMode": "sink", "sink": sink, "maxBatchSize": 1 }));
    let function = json!({ "bindings": [
        { "type": "timerTrigger", "direction": "in", "name": "timer", "schedule": "*/5 * * * * *" }
    ]});
    let app = app(url, function, trigger, false);
    let host = start(&app).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ids: Vec<i64> = target
            .query("SELECT id FROM public.conf_copy", &[])
            .await
            .expect("read the copy")
            .iter()
            .map(|r| r.get(0))
            .collect();
        let missing: Vec<i64> = (1..=ROWS as i64).filter(|id| !ids.contains(id)).collect();
        if missing.is_empty() || Instant::now() > deadline {
            return (missing, tail(&host.output()));
        }
        // A failing batch fails the firing: the test reports the rows it kept out, not the firing.
        host.run_timer(FUNCTION).await.expect("timer run");
    }
}

/// `handler run --once` on `app` until `count(all output)` reaches [`ROWS`] (at most 30 s: the xid8 guard may
/// hold fresh rows back); every run's stdout, concatenated.
async fn run_until(app: &AppFolder, count: impl Fn(&str) -> usize) -> String {
    let mut stdout = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&stdout) < ROWS {
        assert!(Instant::now() < deadline, "not every row within 30 s:\n{}", oracle::preview(&stdout));
        let mut runner = Runner::start(app, &["--once"]);
        let status = runner.exit(Duration::from_secs(60)).await;
        assert!(status.success(), "handler run --once failed ({status}):\n{}", tail(&runner.stderr()));
        stdout.push_str(&runner.stdout());
    }
    stdout
}

/// The stdout sink (`handler run`'s default) over `conf`: everything it printed.
pub async fn stdout_sink(url: &str) -> String {
    let app = app(url, support::timer_function_json(Some(3)), cursor_trigger(json!({})), true);
    run_until(&app, |out| out.matches("\"Operation\":").count()).await
}

/// The webhook sink over `conf`, posting to a receiver here: the body of every POST.
pub async fn webhook_sink(url: &str) -> Vec<String> {
    let bodies: Arc<Mutex<Vec<String>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the webhook");
    let hook = format!("http://{}/hook", listener.local_addr().expect("address"));
    let recorded = Arc::clone(&bodies);
    let router = axum::Router::new()
        .route(
            "/hook",
            axum::routing::post(move |body: String| {
                recorded.lock().expect("bodies").push(body);
                async { axum::http::StatusCode::OK }
            }),
        )
        // A batch with the 1 MB values is larger than axum's default limit of 2 MB.
        .layer(axum::extract::DefaultBodyLimit::disable());
    tokio::spawn(async move { axum::serve(listener, router).await });
    let sink = json!({ "type": "webhook", "url": hook, "maxRetries": 0, "timeoutMs": 5000 });
    let app = app(url, support::timer_function_json(Some(3)), cursor_trigger(json!({ "sink": sink })), true);
    let seen = Arc::clone(&bodies);
    run_until(&app, move |_| seen.lock().expect("bodies").iter().map(|b| b.matches("\"Operation\":").count()).sum())
        .await;
    let all = bodies.lock().expect("bodies").clone();
    all
}

/// The Items of webhook bodies (`{"function","batch_id","fence","changes":[...]}`), raw, in order.
pub fn webhook_items(bodies: &[String]) -> Vec<(i64, String)> {
    #[derive(serde::Deserialize)]
    struct Body {
        changes: Vec<Box<serde_json::value::RawValue>>,
    }
    bodies
        .iter()
        .flat_map(|b| {
            let body: Body =
                serde_json::from_str(b).unwrap_or_else(|e| panic!("a webhook body ({e}): {}", oracle::preview(b)));
            body.changes.into_iter().map(|c| oracle::item_of(c.get())).collect::<Vec<_>>()
        })
        .collect()
}

/// The last 4,000 characters of a log.
fn tail(log: &str) -> String {
    let start = log.len().saturating_sub(4000);
    let start = (start..=log.len()).find(|&i| log.is_char_boundary(i)).unwrap_or(log.len());
    log[start..].to_string()
}

/// The oracle's Items of `conf` in the database at `url`, by id.
pub async fn oracle_items(url: &str) -> BTreeMap<i64, String> {
    oracle::items(&oracle::canonical_session(url).await, "conf", &schema::columns(false)).await
}
