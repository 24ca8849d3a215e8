//! What most end-to-end tests share: an `orders` table in a fresh database, an app folder whose one function
//! watches it with state in Azurite, and helpers that turn delivered messages into id sets.

use crate::support::{self, AppFolder};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};
use testbed::driver::HostDriver;
use testbed::embedded;

pub const FUNCTION: &str = "OrdersChanged";

/// A fresh database with the demo `orders` table (xid8 cursor, insert marker, soft delete).
pub struct Orders {
    pub url: String,
    pub db: tokio_postgres::Client,
}

impl Orders {
    pub async fn new(prefix: &str) -> Self {
        let url = support::fixture().fresh_database(prefix).await;
        Self::on(url).await
    }

    /// The orders table in the database at `url` (created if missing).
    pub async fn on(url: String) -> Self {
        let db = embedded::connect(&url).await.expect("connect to the test database");
        let exists: bool =
            db.query_one("SELECT to_regclass('public.orders') IS NOT NULL", &[]).await.expect("catalog query").get(0);
        if !exists {
            db.batch_execute(testbed::demo::ORDERS_SCHEMA).await.expect("create orders");
        }
        Self { url, db }
    }

    /// Inserts `ids` in one transaction.
    pub async fn insert(&self, ids: impl IntoIterator<Item = i64>) {
        let ids: Vec<i64> = ids.into_iter().collect();
        self.db
            .execute(
                "INSERT INTO orders (id, customer, amount) SELECT i, 'c' || i, i * 1.25 FROM unnest($1::bigint[]) AS i",
                &[&ids],
            )
            .await
            .expect("insert orders");
    }

    pub async fn set_amount(&self, id: i64, amount: &str) {
        self.db
            .execute("UPDATE orders SET amount = $2::text::numeric WHERE id = $1", &[&id, &amount])
            .await
            .expect("update order");
    }

    pub async fn soft_delete(&self, id: i64) {
        self.db.execute("UPDATE orders SET deleted = true WHERE id = $1", &[&id]).await.expect("delete order");
    }
}

/// The default `sqltrigger.json` for the orders table, with `extra` keys merged in.
pub fn trigger_json(extra: Value) -> Value {
    let mut base: Value = serde_json::from_str(testbed::demo::ORDERS_TRIGGER).expect("demo trigger json");
    if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
        base.extend(extra.clone());
    }
    base
}

/// A unique state name space, so tests sharing one Azurite never see each other's state.
pub fn unique_app_name(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// An app folder with one function on `orders`, blob state in the shared Azurite. Its proof window is zero
/// (a batch is proven by the next invocation that does not name it), so tests about other things see the
/// checkpoint move at once; the tests about the window set `Sql_Trigger_ProofWindowMs` (a later setting wins).
pub fn orders_app(orders: &Orders, app_name: &str, trigger_extra: Value, settings: &[(&str, &str)]) -> AppFolder {
    app_on(&orders.url, app_name, support::timer_function_json(Some(3)), trigger_json(trigger_extra), settings)
}

/// An app folder with one function ([`FUNCTION`]: `function_json` and `trigger`) over the database at `url`
/// (`PostgresConnectionString`), blob state in the shared Azurite under `app_name`, proof window zero as in
/// [`orders_app`], then `settings`.
pub fn app_on(url: &str, app_name: &str, function_json: Value, trigger: Value, settings: &[(&str, &str)]) -> AppFolder {
    let azurite = support::fixture().azurite_connection_string();
    let mut all: Vec<(&str, &str)> = vec![
        ("PostgresConnectionString", url),
        ("AzureWebJobsStorage", azurite.as_str()),
        ("Sql_Trigger_StateStore", "blob"),
        ("Sql_Trigger_AppName", app_name),
        ("Sql_Trigger_ProofWindowMs", "0"),
    ];
    all.extend_from_slice(settings);
    support::write_app(FUNCTION, function_json, trigger, &all)
}

/// Starts the handler for `app` and waits for readiness.
pub async fn start(app: &AppFolder) -> HostDriver {
    app.start_handler(&[]).await
}

/// `(operation, id)` of each delivered change message, in order.
pub fn ops(messages: &[Value]) -> Vec<(i64, i64)> {
    messages
        .iter()
        .map(|m| {
            let op = m["Operation"].as_i64().unwrap_or_else(|| panic!("no Operation in {m}"));
            let id = m["Item"]["id"].as_i64().unwrap_or_else(|| panic!("no Item.id in {m}"));
            (op, id)
        })
        .collect()
}

/// The set of ids delivered at least once, and how many times each id was delivered.
pub fn tally(messages: &[Value]) -> (BTreeSet<i64>, BTreeMap<i64, usize>) {
    let mut counts = BTreeMap::new();
    for (_, id) in ops(messages) {
        *counts.entry(id).or_insert(0) += 1;
    }
    (counts.keys().copied().collect(), counts)
}

/// Fires the timer until an invocation applies nothing new, returning how many firings it took.
pub async fn drain(host: &HostDriver, max_firings: usize) -> usize {
    for n in 1..=max_firings {
        let run = host.run_timer(FUNCTION).await.expect("timer run");
        assert!(run.succeeded, "timer run failed: {:?}", run.attempts.last().map(|a| &a.outcome));
        if run.applied.get("changes").is_none_or(|m| m.is_empty()) {
            return n;
        }
    }
    panic!("still delivering after {max_firings} firings");
}

/// Range helper for expected id sets.
pub fn ids(range: std::ops::RangeInclusive<i64>) -> BTreeSet<i64> {
    range.collect()
}

/// Fires the timer until an invocation delivers something, for at most `deadline`, and returns that
/// invocation's messages. The xid8 guard holds rows back while any older transaction of the cluster runs
/// (autovacuum's analyze takes an xid too), so the first firing after a write may legitimately deliver
/// nothing; tests wait for the condition instead of assuming the first firing sees it.
pub async fn fire_until_delivered(host: &HostDriver, function: &str) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let run = host.run_timer(function).await.expect("timer run");
        assert!(run.succeeded, "timer run failed: {:?}", run.attempts.last().map(|a| &a.outcome));
        if let Some(messages) = run.applied.get("changes").filter(|m| !m.is_empty()) {
            return messages.clone();
        }
        assert!(std::time::Instant::now() < deadline, "nothing delivered within 10 s:\n{}", host.output());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Failure matrix, crashes, concurrency and outages: the state document, host emulation by hand, private servers
// ---------------------------------------------------------------------------------------------------------------

/// The state container every app in these tests uses (`Sql_Trigger_StateContainer` default).
pub const STATE_CONTAINER: &str = "sql-pseudo-trigger";

/// A state store on the Azurite behind `connection_string`, to read what the handler wrote.
pub fn blob_store(connection_string: &str) -> sql_pseudo_trigger::state::BlobStore {
    let secret = sql_pseudo_trigger::config::Secret::new(connection_string);
    sql_pseudo_trigger::state::BlobStore::from_connection_string(&secret, STATE_CONTAINER)
        .expect("a store on the test Azurite")
}

/// A state store on the shared Azurite.
pub fn shared_blob_store() -> sql_pseudo_trigger::state::BlobStore {
    blob_store(&support::fixture().azurite_connection_string())
}

/// `{app}/{function}.json`: where the handler keeps [`FUNCTION`]'s state.
pub fn state_key(app_name: &str) -> String {
    format!("{app_name}/{FUNCTION}.json")
}

/// `{app}/{function}/quarantine/`: where poison batches of [`FUNCTION`] go.
pub fn quarantine_prefix(app_name: &str) -> String {
    format!("{app_name}/{FUNCTION}/quarantine/")
}

/// [`FUNCTION`]'s state document and its etag, if the handler wrote one.
pub async fn load_state(
    store: &dyn sql_pseudo_trigger::state::StateStore,
    app_name: &str,
) -> Option<(sql_pseudo_trigger::engine::document::StateDoc, String)> {
    let key = state_key(app_name);
    let versioned = store.load(&key).await.unwrap_or_else(|e| panic!("cannot read {key}: {e}"))?;
    let doc = serde_json::from_slice(&versioned.bytes).unwrap_or_else(|e| {
        panic!("{key} is not a state document ({e}): {}", String::from_utf8_lossy(&versioned.bytes))
    });
    Some((doc, versioned.etag.0))
}

/// [`load_state`] for a document that must exist.
pub async fn state(
    store: &dyn sql_pseudo_trigger::state::StateStore,
    app_name: &str,
) -> (sql_pseudo_trigger::engine::document::StateDoc, String) {
    load_state(store, app_name).await.unwrap_or_else(|| panic!("no state document at {}", state_key(app_name)))
}

/// A stored position `["xid", "id"]` as numbers, comparable; `null` ("before everything") is the smallest.
pub fn position(p: &Value) -> (u64, i64) {
    if p.is_null() {
        return (0, i64::MIN);
    }
    let part = |i: usize| p.get(i).and_then(Value::as_str).unwrap_or_else(|| panic!("not an [xid, id] position: {p}"));
    let xid = part(0).parse().unwrap_or_else(|e| panic!("xid of {p}: {e}"));
    let id = part(1).parse().unwrap_or_else(|e| panic!("id of {p}: {e}"));
    (xid, id)
}

/// The change messages an invocation answered for the `changes` binding (empty if none, or if the invocation
/// failed). A 2xx answer the host could not read is no answer of nothing: it fails the test, naming the body.
pub fn answered_changes(invocation: &testbed::driver::Invocation) -> Vec<Value> {
    if let Some(why) = &invocation.decode_error {
        panic!("the handler's answer ({}) is unreadable ({why}): {}", invocation.status, invocation.body);
    }
    match invocation.outputs.get("changes") {
        Some(Value::Array(items)) => items.clone(),
        Some(Value::Null) | None => Vec::new(),
        Some(other) => vec![other.clone()],
    }
}

/// The change messages the host writes to the `changes` binding for an invocation's answer (what its queue
/// receives, parsed), for tests that play the host by hand and decide the write happened.
pub fn written_by_host(host: &HostDriver, invocation: &testbed::driver::Invocation) -> Vec<Value> {
    let mut writes = host.writes_for(FUNCTION, invocation).expect("the function exists");
    writes.remove("changes").unwrap_or_default()
}

/// The ids of change messages, in order.
pub fn ids_of(messages: &[Value]) -> Vec<i64> {
    ops(messages).into_iter().map(|(_, id)| id).collect()
}

/// Fires the timer until some attempt of a firing was answered with changes (whether or not the host's write
/// of them worked), for at most 10 s, and returns that firing. Firings before it must have succeeded empty.
pub async fn fire_until_answered(host: &HostDriver, function: &str) -> testbed::driver::TimerRun {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let run = host.run_timer(function).await.expect("timer run");
        if run.attempts.iter().filter_map(|a| a.invocation.as_ref()).any(|i| !answered_changes(i).is_empty()) {
            return run;
        }
        assert!(run.succeeded, "timer run failed: {:?}\n{}", run.attempts.last().map(|a| &a.outcome), host.output());
        assert!(std::time::Instant::now() < deadline, "nothing answered within 10 s:\n{}", host.output());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Plays the host by hand: first attempts (`RetryCount` 0) until one is answered with changes, for at most
/// 10 s. Nothing is written anywhere: the caller decides what the host did with the answer, and must follow
/// it with a retry ([`HostDriver::retry`]) if the host's write is to count as failed.
pub async fn invoke_until_answered(host: &HostDriver, function: &str) -> testbed::driver::Invocation {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let invocation = host.invoke(function, None).await.expect("invoke");
        assert_eq!(invocation.status, 200, "{}\n{}", invocation.body, host.output());
        if !answered_changes(&invocation).is_empty() {
            return invocation;
        }
        assert!(std::time::Instant::now() < deadline, "nothing answered within 10 s:\n{}", host.output());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Waits until the lease on the batch in flight has expired by the wall clock every process here shares, for
/// at most 10 s: the condition another instance's takeover depends on, read from the state document rather
/// than slept for.
pub async fn wait_until_lease_expired(store: &dyn sql_pseudo_trigger::state::StateStore, app_name: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (doc, _) = state(store, app_name).await;
        let lease = doc.lease().expect("a batch in flight has a lease");
        if lease.expires_at < time::OffsetDateTime::now_utc() {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the lease did not expire within 10 s: {lease:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A PostgreSQL server of the test's own, for tests that stop it or hold transactions open (the xid8 guard
/// waits for the oldest transaction of the whole cluster).
pub async fn private_postgres() -> embedded::EmbeddedPostgres {
    tokio::task::spawn_blocking(embedded::EmbeddedPostgres::start)
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("a private PostgreSQL starts: {e}"))
}

/// An Azurite of the test's own that keeps its blobs across a stop and start.
pub async fn private_azurite() -> embedded::Azurite {
    tokio::task::spawn_blocking(embedded::Azurite::start_persistent)
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("a private Azurite starts: {e}"))
}

/// Runs a blocking server operation (`stop`, `start_again`, `restart`) off the async runtime and hands the
/// server back.
pub async fn on_server<S: Send + 'static>(
    mut server: S,
    what: &'static str,
    operation: fn(&mut S) -> Result<(), embedded::LaunchError>,
) -> S {
    tokio::task::spawn_blocking(move || {
        operation(&mut server).unwrap_or_else(|e| panic!("{what}: {e}"));
        server
    })
    .await
    .expect("join")
}

/// Fires the timer until every id in `expected` has been written, for at most 15 s, then once more so the
/// last batch is acknowledged. Firings may fail while a restarted server settles; they are retried.
pub async fn fire_until_all_delivered(host: &HostDriver, expected: &BTreeSet<i64>) -> BTreeMap<i64, usize> {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (seen, counts) = tally(&host.delivered("changes"));
        if seen.is_superset(expected) {
            host.run_timer(FUNCTION).await.expect("timer run");
            return tally(&host.delivered("changes")).1;
        }
        assert!(
            Instant::now() < deadline,
            "missing {:?} after 15 s; written {counts:?}\n{}",
            expected - &seen,
            host.output()
        );
        host.run_timer(FUNCTION).await.expect("timer run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Every id of `expected` written once, except those of `in_flight` (a batch answered before an outage),
/// which may come twice.
pub fn assert_nothing_lost(counts: &BTreeMap<i64, usize>, expected: &BTreeSet<i64>, in_flight: &BTreeSet<i64>) {
    assert_eq!(counts.keys().copied().collect::<BTreeSet<_>>(), *expected, "{counts:?}");
    for (id, n) in counts {
        let allowed = if in_flight.contains(id) { 2 } else { 1 };
        assert!(*n >= 1 && *n <= allowed, "order {id} written {n} times (at most {allowed}): {counts:?}");
    }
}

/// Where a crash round's handler process dies (tests/e2e/crashes.rs, tests/e2e/logical.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kill {
    /// Changes fetched, nothing committed (failpoint `after-fetch`).
    AfterFetch,
    /// Batch recorded in flight (and the one before acknowledged), not answered (failpoint `after-commit`).
    AfterCommit,
    /// Batch answered and written by the host, not yet acknowledged (`kill -9` before the next invocation).
    AfterWrittenAnswer,
    /// Batch answered, then the instance died with the host before it wrote anything (`kill -9`).
    AfterLostAnswer,
    /// No crash: the process delivers until idle and is then killed while idle.
    WhileIdle,
}

impl Kill {
    /// The failpoint that aborts the process, at its `nth` hit (`name@n`) when given.
    pub fn failpoint(self, nth: Option<u32>) -> Option<String> {
        let name = match self {
            Kill::AfterFetch => "after-fetch",
            Kill::AfterCommit => "after-commit",
            _ => return None,
        };
        Some(nth.map_or(name.to_string(), |n| format!("{name}@{n}")))
    }
}

/// Runs `host` (started with `kill.failpoint(..)`) to its kill point and kills it there; counts in `extra`
/// the batches the host wrote that the next owner re-delivers whole. What happened, for failure messages.
pub async fn kill_at(host: &HostDriver, kill: Kill, idle_firings: usize, extra: &mut BTreeMap<i64, usize>) -> String {
    let mut note = String::new();
    let count = |ids: &[i64], extra: &mut BTreeMap<i64, usize>| {
        for id in ids {
            *extra.entry(*id).or_insert(0) += 1;
        }
    };
    match kill {
        Kill::AfterFetch | Kill::AfterCommit => {
            // Firings first finish what a dead process left (re-delivering its batch once its lease lapses)
            // and then fetch the new orders, which is where this process aborts. The batch this process's
            // host wrote last, while no later firing has acknowledged it.
            let mut unacknowledged = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(10);
            while host.is_running() {
                assert!(Instant::now() < deadline, "no crash within 10 s\n{}", host.output());
                let run = host.run_timer(FUNCTION).await.expect("timer run");
                if run.succeeded {
                    // A firing that wrote nothing acknowledged what this process wrote before (or had nothing
                    // of its own): a single process never meets a conflict.
                    unacknowledged = run.applied.get("changes").map(|m| ids_of(m)).unwrap_or_default();
                }
            }
            assert!(host.output().contains("failpoint after-"), "{}", host.output());
            // The acknowledgement of that batch is part of the same write as the next batch: after-fetch dies
            // before that write, so the next owner re-delivers it; after-commit dies after it.
            if kill == Kill::AfterFetch && !unacknowledged.is_empty() {
                count(&unacknowledged, extra);
                note.push_str(&format!(", before acknowledging {unacknowledged:?}"));
            }
        }
        Kill::AfterWrittenAnswer => {
            let batch = ids_of(&fire_until_delivered(host, FUNCTION).await);
            count(&batch, extra);
            note.push_str(&format!(", killed after the host wrote {batch:?}"));
            host.kill();
        }
        Kill::AfterLostAnswer => {
            let answer = invoke_until_answered(host, FUNCTION).await;
            note.push_str(&format!(", killed after answering {:?}", ids_of(&answered_changes(&answer))));
            host.kill();
        }
        Kill::WhileIdle => {
            fire_until_delivered(host, FUNCTION).await;
            drain(host, idle_firings).await;
            host.kill();
        }
    }
    note
}

/// Everything `pipe` writes, until it closes (read on a thread of its own).
pub fn read_all(mut pipe: impl std::io::Read + Send + 'static) -> std::sync::Arc<std::sync::Mutex<String>> {
    let text = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let sink = std::sync::Arc::clone(&text);
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut chunk) {
            sink.lock().expect("text").push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    text
}

/// One HTTP/1.1 request to a handler on 127.0.0.1:`port` (`headers` as `Name: value\r\n` lines); the status
/// code, or `None` when nothing answers.
pub fn http(port: u16, request_line: &str, headers: &str, body: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    let request = format!(
        "{request_line} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    answer.split(' ').nth(1)?.parse().ok()
}
