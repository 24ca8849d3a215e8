//! Backfill of the `postgres-logical` source through the real binary under the host model (deferred delivery):
//! `startFrom: snapshot` under a concurrent writer, an operator's filtered backfill, and the wait that keeps a
//! chunk from reading past a transaction the stream already delivered (docs/architecture.md, "Backfill").
//!
//! Every write sets `v` from one sequence, so a larger `v` is a newer version of a row: a consumer's view is
//! checked against the table, and a backfilled row against the live changes of its key delivered before it.

use crate::common::*;
use crate::logical::{cli, first_firing, logical_app, Db};
use serde_json::{json, Value};
use sql_pseudo_trigger::engine::document::BackfillState;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The watched table: a key and a version that every write takes from one sequence.
const ITEMS: &str = "CREATE SEQUENCE public.ver;
CREATE TABLE public.items (id bigint PRIMARY KEY, v bigint NOT NULL DEFAULT nextval('public.ver'));";

fn backfilled(m: &Value) -> bool {
    m.get("Metadata").and_then(|md| md.get("Backfill")).is_some()
}

fn id_of(m: &Value) -> i64 {
    m["Item"]["id"].as_i64().unwrap_or_else(|| panic!("no id in {m}"))
}

/// The consumer's view after applying every message in order, idempotently (upsert by id, delete by id).
fn view(messages: &[Value]) -> BTreeMap<i64, i64> {
    let mut view = BTreeMap::new();
    for m in messages {
        match m["Operation"].as_i64() {
            Some(2) => {
                view.remove(&id_of(m));
            }
            _ => {
                view.insert(id_of(m), m["Item"]["v"].as_i64().unwrap_or_else(|| panic!("no v in {m}")));
            }
        }
    }
    view
}

async fn table(db: &Db) -> BTreeMap<i64, i64> {
    let rows = db.db.query("SELECT id, v FROM items ORDER BY id", &[]).await.expect("read the table");
    rows.iter().map(|r| (r.get(0), r.get(1))).collect()
}

/// No backfilled row is older than a live change of its key delivered before it: the chunk was placed after
/// those changes, and its value is at least theirs. Answers the backfilled ids, in delivery order.
fn assert_no_backfilled_row_older_than_live(messages: &[Value]) -> Vec<i64> {
    let mut live: BTreeMap<i64, i64> = BTreeMap::new();
    let mut ids = Vec::new();
    for m in messages {
        let id = id_of(m);
        if backfilled(m) {
            assert_eq!(m["Operation"], 0, "{m}");
            let v = m["Item"]["v"].as_i64().expect("a version");
            if let Some(newer) = live.get(&id).filter(|l| **l > v) {
                panic!("backfilled row {id} at version {v} after a live change at version {newer}: {messages:#?}");
            }
            ids.push(id);
        } else if let Some(v) = m["Item"]["v"].as_i64() {
            live.insert(id, v);
        }
    }
    ids
}

/// The backfill of the function's state document (its state, rows, after).
async fn backfill_state(app_name: &str) -> sql_pseudo_trigger::engine::document::Backfill {
    let (doc, _) = load_state(&shared_blob_store(), app_name).await.expect("a state document");
    doc.backfill().cloned().expect("a backfill")
}

/// Whether the function's backfill is done (no state document yet: not done).
async fn backfill_done(app_name: &str) -> bool {
    let doc = load_state(&shared_blob_store(), app_name).await;
    doc.is_some_and(|(d, _)| d.backfill().is_some_and(|b| b.state == BackfillState::Done))
}

/// Fires until the backfill is done and a firing delivers nothing.
async fn drain_backfill(host: &testbed::driver::HostDriver, app_name: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        drain(host, 2000).await;
        let b = backfill_state(app_name).await;
        if b.state == BackfillState::Done {
            drain(host, 2000).await;
            return;
        }
        assert!(Instant::now() < deadline, "the backfill is not done after 60 s: {b:?}\n{}", host.output());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A deterministic mix of writes, until `stop` is set or after `rounds` transactions: inserts of new ids (from
/// `first_new_id`), updates, deletes and key changes of ids among the first `span` (the table's, so a key is
/// often written twice while a chunk covering it is read), one to three statements per transaction.
async fn write_mix(db: tokio_postgres::Client, stop: Arc<AtomicBool>, rounds: u64, span: i64, first_new_id: i64) {
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next_id = first_new_id;
    for _ in 0..rounds {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut statements = Vec::new();
        for _ in 0..(1 + seed % 3) {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let target = 1 + (seed >> 33) as i64 % span;
            statements.push(match (seed >> 20) % 4 {
                0 => {
                    next_id += 1;
                    format!("INSERT INTO items (id) VALUES ({next_id})")
                }
                1 => format!("UPDATE items SET v = nextval('ver') WHERE id = {target}"),
                2 => format!("DELETE FROM items WHERE id = {target}"),
                _ => {
                    next_id += 1;
                    format!("UPDATE items SET id = {next_id}, v = nextval('ver') WHERE id = {target}")
                }
            });
        }
        db.batch_execute(&format!("BEGIN; {}; COMMIT;", statements.join("; "))).await.expect("a write");
        // As fast as the server takes them: a live backlog builds, and a chunk read on the backfill's turn
        // (one batch in five) then lies far ahead of the live changes handed over, over keys they change.
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn start_from_snapshot_backfills_a_logical_function_under_a_concurrent_writer_and_the_consumer_ends_equal_to_the_table(
) {
    backfill_under_a_writer("logical_backfill", ITEMS).await;
}

/// The same with a key whose text as a cast (`true`) is not the text the stream writes (`t`): chunk rows are
/// matched to the stream's changes by the key's output text, or a changed key would never be left out of a
/// chunk and an older value would follow a newer one (`char(n)` and `inet` differ the same way).
#[tokio::test]
async fn a_logical_backfill_matches_a_boolean_key_by_the_text_the_stream_writes() {
    const BOOLEAN_KEY: &str = "CREATE SEQUENCE public.ver;
CREATE TABLE public.items (id bigint NOT NULL, live boolean NOT NULL DEFAULT true,
    v bigint NOT NULL DEFAULT nextval('public.ver'), PRIMARY KEY (live, id));";
    backfill_under_a_writer("logical_backfill_bool", BOOLEAN_KEY).await;
}

async fn backfill_under_a_writer(name: &str, schema: &str) {
    // GIVEN 150 rows before the function first runs, backfilled in chunks of 10
    let db = Db::shared(name, schema).await;
    db.db.execute("INSERT INTO items (id) SELECT g FROM generate_series(1, 150) g", &[]).await.expect("rows");
    let (app, app_name) = logical_app(&db, "public.items", json!({ "startFrom": "snapshot", "maxBatchSize": 10 }), &[]);
    let host = start(&app).await;

    // WHEN a writer inserts, updates, deletes and changes keys for as long as the backfill runs
    let writer_db = testbed::embedded::connect(&db.url).await.expect("connect the writer");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write_mix(writer_db, stop.clone(), 20_000, 150, 10_000));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !backfill_done(&app_name).await && !writer.is_finished() {
        for _ in 0..5 {
            let run = host.run_timer(FUNCTION).await.expect("timer run");
            assert!(run.succeeded, "a firing failed: {}", crate::logical::failure_text(&host, &run));
        }
        assert!(Instant::now() < deadline, "the backfill is not done after 60 s\n{}", host.output());
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("the writer");
    drain_backfill(&host, &app_name).await;

    // THEN the consumer's view equals the table
    let messages = host.delivered("changes");
    assert_eq!(view(&messages), table(&db).await, "{}", host.output());
    // AND no backfilled row is older than a live change of its key delivered before it; chunks walk the key
    let ids = assert_no_backfilled_row_older_than_live(&messages);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "chunks walk the key in order: {ids:?}");
    assert!(!ids.is_empty(), "the backfill delivered the rows the writer left alone");
    assert!(messages.iter().any(|m| !backfilled(m)), "live changes flowed beside the backfill");
    // AND no key's value ever goes back (a chunk holds a key's value as of the live changes before it, never a
    // newer one that a live change delivered after it would undo)
    assert_no_key_goes_back(&messages);
    // AND the backfill is done, and counted what it delivered
    let b = backfill_state(&app_name).await;
    assert_eq!(b.rows, ids.len() as u64, "{b:?}");
}

/// Every write takes a newer `v`, so the values a consumer receives for one key only grow (a delete is not a
/// value; a key's re-insert takes a newer one).
fn assert_no_key_goes_back(messages: &[Value]) {
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    for (n, m) in messages.iter().enumerate() {
        let Some(v) = m["Item"]["v"].as_i64().filter(|_| m["Operation"] != 2) else { continue };
        if let Some(before) = last.insert(id_of(m), v).filter(|before| *before > v) {
            panic!("message {n} takes key {} back from version {before} to {v}: {m}", id_of(m));
        }
    }
}

#[tokio::test]
async fn an_operators_filtered_backfill_of_a_logical_function_delivers_the_matching_rows_that_predate_its_slot() {
    // GIVEN rows written before the function's slot existed (the stream never carries them), and a function
    // that runs from its slot
    let db = Db::shared("logical_backfill_where", ITEMS).await;
    db.db.execute("INSERT INTO items (id, v) SELECT g, g FROM generate_series(1, 30) g", &[]).await.expect("rows");
    let (app, app_name) = logical_app(&db, "public.items", json!({ "maxBatchSize": 4 }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    db.db.execute("UPDATE items SET v = 100 WHERE id = 3", &[]).await.expect("a live change");
    drain(&host, 20).await;

    // WHEN an operator backfills the rows with id above 20 or equal to 3
    let started = cli(&app, &["state", "backfill", FUNCTION, "--where", "id > 20 OR id = 3"]).await.expect("backfill");
    assert!(started.to_string().contains("running"), "{started}");
    drain_backfill(&host, &app_name).await;

    // THEN exactly those rows arrive, marked, in key order, with their current values; the live change first
    let messages = host.delivered("changes");
    let live: Vec<(i64, i64)> =
        messages.iter().filter(|m| !backfilled(m)).map(|m| (id_of(m), m["Item"]["v"].as_i64().expect("v"))).collect();
    assert_eq!(live, [(3, 100)], "{messages:#?}");
    let got: Vec<(i64, i64)> =
        messages.iter().filter(|m| backfilled(m)).map(|m| (id_of(m), m["Item"]["v"].as_i64().expect("v"))).collect();
    let expected: Vec<(i64, i64)> = std::iter::once((3, 100)).chain((21..=30).map(|i| (i, i))).collect();
    assert_eq!(got, expected, "{messages:#?}");
    let b = backfill_state(&app_name).await;
    assert_eq!((b.rows, b.estimate), (11, Some(11)), "{b:?}");
    assert_eq!(b.filter.as_deref(), Some("(\"id\" > 20) OR (\"id\" = 3)"), "the filter as parsed: {b:?}");
    let ids: BTreeSet<i64> = got.iter().map(|(id, _)| *id).collect();
    assert_eq!(ids.len(), 11);
}

/// A filter's decimal literal is compared as written: `price > 10.555` on a `numeric(12, 2)` column takes 10.56
/// (cast with the column's modifier, the literal would round to 10.56 and leave it out).
#[tokio::test]
async fn a_filtered_logical_backfill_compares_a_decimal_literal_as_written_not_rounded_to_the_columns_scale() {
    // GIVEN three prices written before the function's slot existed
    let db = Db::shared(
        "logical_backfill_decimal",
        "CREATE TABLE public.prices (id bigint PRIMARY KEY, price numeric(12, 2) NOT NULL);",
    )
    .await;
    db.db.execute("INSERT INTO prices VALUES (1, 10.55), (2, 10.56), (3, 10.60)", &[]).await.expect("rows");
    let (app, app_name) = logical_app(&db, "public.prices", json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN an operator backfills the prices above 10.555
    cli(&app, &["state", "backfill", FUNCTION, "--where", "price > 10.555"]).await.expect("backfill");
    drain_backfill(&host, &app_name).await;

    // THEN prices 2 and 3 arrive, backfilled, and 1 does not
    let messages = host.delivered("changes");
    assert!(messages.iter().all(backfilled), "{messages:#?}");
    assert_eq!(messages.iter().map(id_of).collect::<Vec<_>>(), [2, 3], "{messages:#?}");
}

#[tokio::test]
async fn a_chunk_waits_for_a_transaction_the_stream_delivered_before_it_became_visible() {
    // GIVEN a private server where a session that commits with synchronous_commit = on waits for a standby that
    // never comes: its commit record is in the WAL (the stream decodes it) while the transaction stays in the
    // proc array (no other session sees it yet). Every other session of the database commits locally.
    let server = private_postgres().await;
    let db = Db::private(&server.url(), "logical_backfill_s0", ITEMS).await;
    let name: String = db.db.query_one("SELECT current_database()::text", &[]).await.expect("name").get(0);
    db.db
        .batch_execute(&format!(
            "SET synchronous_commit = local; ALTER DATABASE \"{name}\" SET synchronous_commit = local;
             INSERT INTO items (id, v) SELECT g, g FROM generate_series(1, 5) g;"
        ))
        .await
        .expect("settings");
    // (ALTER SYSTEM refuses to run in the implicit transaction of a multi-statement query)
    db.db.batch_execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'").await.expect("alter system");
    db.db.batch_execute("SELECT pg_reload_conf()").await.expect("reload");
    let (app, app_name) = logical_app(&db, "public.items", json!({ "maxBatchSize": 10, "streamPollMs": 100 }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN a transaction updates row 3 and hangs in its commit, after the record reached the WAL
    let blocker = testbed::embedded::connect(&db.url).await.expect("connect the blocker");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let names: String = blocker.query_one("SHOW synchronous_standby_names", &[]).await.expect("a setting").get(0);
        if names == "nobody" {
            break;
        }
        assert!(Instant::now() < deadline, "the server did not reload its settings");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid: i32 = blocker.query_one("SELECT pg_backend_pid()", &[]).await.expect("pid").get(0);
    let hung = tokio::spawn(async move {
        let _ = blocker.batch_execute("SET synchronous_commit = on; UPDATE items SET v = 999 WHERE id = 3").await;
        blocker
    });
    // (the stream delivers it: the live consumer holds 999 for row 3)
    let live = fire_until_delivered(&host, FUNCTION).await;
    assert_eq!(live.iter().map(|m| (id_of(m), m["Item"]["v"].as_i64())).collect::<Vec<_>>(), [(3, Some(999))]);
    // AND an operator starts a backfill while it is still invisible to other sessions
    let seen: i64 = db.db.query_one("SELECT v FROM items WHERE id = 3", &[]).await.expect("row 3").get(0);
    assert_eq!(seen, 3, "the update is not visible yet");
    cli(&app, &["state", "backfill", FUNCTION]).await.expect("backfill");
    for _ in 0..3 {
        let run = host.run_timer(FUNCTION).await.expect("timer run");
        assert!(run.succeeded, "a firing failed: {}", crate::logical::failure_text(&host, &run));
        assert!(
            run.applied.get("changes").is_none_or(|m| m.is_empty()),
            "a chunk went out: {:?}\n{}",
            run.applied,
            host.output()
        );
    }
    assert!(host.output().contains("have not ended within streamPollMs"), "{}", host.output());

    // THEN once the transaction leaves the proc array, the chunk reads its value: no backfilled row is older
    // than the live change delivered before it
    db.db.execute("SELECT pg_cancel_backend($1)", &[&pid]).await.expect("release the commit");
    hung.await.expect("the blocker");
    drain_backfill(&host, &app_name).await;
    let messages = host.delivered("changes");
    assert_no_backfilled_row_older_than_live(&messages);
    let got: Vec<(i64, i64)> =
        messages.iter().filter(|m| backfilled(m)).map(|m| (id_of(m), m["Item"]["v"].as_i64().expect("v"))).collect();
    assert_eq!(got, [(1, 1), (2, 2), (3, 999), (4, 4), (5, 5)], "{messages:#?}");
    assert_eq!(view(&messages), table(&db).await);
}

#[tokio::test]
async fn kill_9_during_a_logical_backfill_under_a_writer_redoes_at_most_a_chunk_per_crash_and_the_consumer_ends_equal()
{
    // GIVEN 300 rows backfilled in chunks of 10, leases of 1 s (a new process takes a dead one's work over
    // after that long)
    let db = Db::shared("logical_backfill_kill", ITEMS).await;
    db.db.execute("INSERT INTO items (id) SELECT g FROM generate_series(1, 300) g", &[]).await.expect("rows");
    let (app, app_name) = logical_app(
        &db,
        "public.items",
        json!({ "startFrom": "snapshot", "maxBatchSize": 10 }),
        &[("Sql_Trigger_LeaseDurationMs", "1000")],
    );
    let mut messages: Vec<Value> = Vec::new();
    let mut notes = Vec::new();
    let kills =
        [Kill::AfterFetch, Kill::AfterWrittenAnswer, Kill::AfterCommit, Kill::AfterLostAnswer, Kill::AfterFetch];

    // WHEN each round starts a process while a writer writes, and the process dies at the round's point
    // (a failpoint at its third fetch or commit, or kill -9 after an answer), chunks and live batches alike
    for (round, kill) in kills.into_iter().enumerate() {
        let writer_db = testbed::embedded::connect(&db.url).await.expect("connect the writer");
        let stop = Arc::new(AtomicBool::new(false));
        let writer = tokio::spawn(write_mix(writer_db, stop, 60, 300, 10_000 + 1000 * round as i64));
        let host = match kill.failpoint(Some(3)) {
            Some(point) => app.start_handler(&[(sql_pseudo_trigger::failpoint::ENV, &point)]).await,
            None => start(&app).await,
        };
        let mut ignored = BTreeMap::new();
        notes.push(format!("{kill:?}{}", kill_at(&host, kill, 40, &mut ignored).await));
        writer.await.expect("the writer");
        messages.extend(host.delivered("changes"));
    }

    // THEN a last process finishes: the consumer's view (every process's writes in order) equals the table
    let host = start(&app).await;
    drain_backfill(&host, &app_name).await;
    messages.extend(host.delivered("changes"));
    assert_eq!(view(&messages), table(&db).await, "{notes:?}");
    // AND no backfilled row is older than a live change of its key delivered before it
    assert_no_backfilled_row_older_than_live(&messages);
    // AND each crash redid at most the one chunk it had answered and not seen proven: counted in the rows a
    // consumer received more than once as backfilled (a chunk holds at most maxBatchSize rows), and in status
    let mut backfilled_times: BTreeMap<i64, u64> = BTreeMap::new();
    for m in messages.iter().filter(|m| backfilled(m)) {
        *backfilled_times.entry(id_of(m)).or_default() += 1;
    }
    let repeated: u64 = backfilled_times.values().map(|n| n - 1).sum();
    assert!(repeated <= 10 * kills.len() as u64, "{repeated} backfilled rows repeated: {backfilled_times:?} {notes:?}");
    let b = backfill_state(&app_name).await;
    assert!(b.redone <= kills.len() as u64, "{b:?} {notes:?}");
}

/// The same with a key led by a `timestamptz`, in a database whose sessions default to `DateStyle` `SQL, DMY` in
/// a zone written `IST` (which reads back as Israel time): the session contract has the pooled sessions write
/// the key as the stream does (ISO), so chunk rows match the stream's changes and a chunk's bounds read back
/// as the instants they were.
#[tokio::test]
async fn a_logical_backfill_keyed_by_a_timestamptz_works_in_a_database_whose_sessions_default_to_sql_dates() {
    const TIME_KEY: &str = "CREATE SEQUENCE public.ver;
CREATE TABLE public.items (id bigint NOT NULL, at timestamptz NOT NULL DEFAULT '2024-01-02 03:04:05+00',
    v bigint NOT NULL DEFAULT nextval('public.ver'), PRIMARY KEY (at, id));
DO $$ BEGIN
    EXECUTE format('ALTER DATABASE %I SET DateStyle TO %L', current_database(), 'SQL, DMY');
    EXECUTE format('ALTER DATABASE %I SET timezone TO %L', current_database(), 'Asia/Kolkata');
END $$;";
    backfill_under_a_writer("logical_backfill_sqldates", TIME_KEY).await;
}

#[tokio::test]
async fn handler_run_backfills_a_logical_function_into_its_sink_under_a_writer_and_the_sink_ends_equal_to_the_table() {
    // GIVEN 150 rows, and a logical function that `handler run` delivers to its (stdout) sink: each chunk is
    // placed after the checkpoint, the one batch recorded in flight at a time
    let db = Db::shared("logical_backfill_run", ITEMS).await;
    db.db.execute("INSERT INTO items (id) SELECT g FROM generate_series(1, 150) g", &[]).await.expect("rows");
    let extra = json!({ "startFrom": "snapshot", "maxBatchSize": 10, "pollingIntervalMs": 10 });
    let (app, app_name) = logical_app(&db, "public.items", extra, &[]);
    let mut runner = crate::runner::Runner::start(&app, &[]);

    // WHEN a writer writes for as long as the backfill runs
    let writer_db = testbed::embedded::connect(&db.url).await.expect("connect the writer");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(write_mix(writer_db, stop.clone(), 20_000, 150, 10_000));
    let deadline = Instant::now() + Duration::from_secs(60);
    while !backfill_done(&app_name).await {
        assert!(Instant::now() < deadline && !writer.is_finished(), "the backfill is not done\n{}", runner.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::Relaxed);
    writer.await.expect("the writer");

    // THEN once the backfill is done and the sink caught up, the lines it printed, applied in order, equal the
    // table; no backfilled row is older than a live change before it, and no key goes back
    let table = table(&db).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    let lines = loop {
        // (whole lines only: the sink may be writing the last one)
        let lines: Vec<Value> = runner
            .stdout()
            .split_inclusive('\n')
            .filter(|l| l.ends_with('\n'))
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l}")))
            .collect();
        if view(&lines) == table {
            break lines;
        }
        assert!(Instant::now() < deadline, "the sink did not catch up within 60 s\n{}", runner.stderr());
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    runner.terminate();
    runner.exit(Duration::from_secs(20)).await;
    assert_no_backfilled_row_older_than_live(&lines);
    assert_no_key_goes_back(&lines);
    assert!(lines.iter().any(backfilled) && lines.iter().any(|l| !backfilled(l)), "both kinds were delivered");
}
