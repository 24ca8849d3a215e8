//! Backfills killed during their chunks, through the real binary, with a writer of inserts, updates and soft
//! deletes running throughout: under `handler run` into a PostgreSQL sink, and under the host model (deferred
//! delivery). At the end the consumer's view equals the table, no order was ever given an older version than
//! one it had already received (so no backfilled row came after a newer live change of it), and at most one
//! chunk was delivered again per crash (docs/operations.md, "Backfill"; the argument is docs/architecture.md's).
//!
//! The cursor source cannot see hard deletes, nor key changes (a key change is a hard delete of the old key and
//! an insert of the new one): the writer makes neither (docs/operations.md, "Backfill", says so to users); the
//! logical source's backfill tests cover both.

use crate::common::*;
use crate::runner::Runner;
use serde_json::json;
use sql_pseudo_trigger::engine::document::BackfillState;
use sql_pseudo_trigger::failpoint;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Orders that exist before the function first runs (what the backfill walks).
const RUN_ROWS: i64 = 6000;
/// `maxBatchSize`: the rows of a chunk, and of a live batch.
const RUN_BATCH: usize = 40;

/// The mirror's target: the columns the trigger sends, the cursor `version` among them (so every write the sink
/// makes says which version of its row it carries), and `copy_log`, every write the sink made in the order it
/// made them, with the transaction (one per delivered batch) that made it.
const RUN_TARGET: &str = "
    CREATE TABLE public.orders_copy (id bigint PRIMARY KEY, customer text NOT NULL, amount numeric(12, 2) NOT NULL,
        version xid8 NOT NULL);
    CREATE TABLE public.copy_log (seq bigserial PRIMARY KEY, tx xid8 NOT NULL DEFAULT pg_current_xact_id(),
        op text NOT NULL, id bigint NOT NULL, version xid8);
    CREATE FUNCTION public.log_copy() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP = 'DELETE' THEN
            INSERT INTO public.copy_log (op, id) VALUES ('delete', OLD.id);
        ELSE
            INSERT INTO public.copy_log (op, id, version) VALUES ('upsert', NEW.id, NEW.version);
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER log_copy AFTER INSERT OR UPDATE OR DELETE ON public.orders_copy
        FOR EACH ROW EXECUTE FUNCTION public.log_copy();";

/// `handler run`'s app: `startFrom: snapshot`, chunks of [`RUN_BATCH`], sink delivery into `orders_copy` in the
/// same database, state in the shared Azurite, a 1 s lease so a killed process's batch is taken over quickly.
fn run_app(orders: &Orders, app_name: &str) -> crate::support::AppFolder {
    let trigger = trigger_json(json!({
        "startFrom": "snapshot",
        "maxBatchSize": RUN_BATCH,
        "pollingIntervalMs": 10,
        "leaseDurationMs": 1000,
        "deliveryMode": "sink",
        "columns": ["id", "customer", "amount", "version"],
        "sink": { "type": "postgres", "tableName": "public.orders_copy", "connectionStringSetting": "TargetDb" },
    }));
    let function = json!({ "bindings": [
        { "type": "timerTrigger", "direction": "in", "name": "timer", "schedule": "*/5 * * * * *" }
    ]});
    let azurite = crate::support::fixture().azurite_connection_string();
    crate::support::write_app(
        FUNCTION,
        function,
        trigger,
        &[
            ("PostgresConnectionString", orders.url.as_str()),
            ("TargetDb", orders.url.as_str()),
            ("AzureWebJobsStorage", azurite.as_str()),
            ("Sql_Trigger_StateStore", "blob"),
            ("Sql_Trigger_AppName", app_name),
        ],
    )
}

/// xorshift64: a seeded generator, so a failing run can be replayed (`SQL_PSEUDO_TRIGGER_BACKFILL_SEED`).
struct Dice(u64);

impl Dice {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The seed of a run's writer and kills, printed so a failing run can be replayed.
fn seed() -> u64 {
    let seed = std::env::var("SQL_PSEUDO_TRIGGER_BACKFILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| uuid::Uuid::new_v4().as_u128() as u64);
    eprintln!("backfill crash test seed: {seed} (SQL_PSEUDO_TRIGGER_BACKFILL_SEED={seed} replays it)");
    seed
}

/// Writes to `orders` at `url` (holding orders 1..=`existing`) until `stop` turns true, one change every `every`,
/// each in its own transaction: an insert of a new id, an update of the amount or a soft delete of a random id,
/// on either side of the backfill's position. Returns how many of each.
async fn write_until(
    url: String,
    existing: i64,
    every: Duration,
    seed: u64,
    stop: tokio::sync::watch::Receiver<bool>,
) -> [u64; 3] {
    let db = testbed::embedded::connect(&url).await.expect("the writer connects");
    let mut dice = Dice(seed | 1);
    let (mut next_id, mut counts) = (existing + 1, [0u64; 3]);
    let mut tick = tokio::time::interval(every);
    while !*stop.borrow() {
        tick.tick().await;
        let id = 1 + dice.below(next_id as u64 - 1) as i64;
        let kind = match dice.below(20) {
            0..=5 => 0,
            6..=16 => 1,
            _ => 2,
        };
        let (statement, id) = match kind {
            0 => {
                next_id += 1;
                ("INSERT INTO orders (id, customer, amount) VALUES ($1, 'written', 1.25)", next_id - 1)
            }
            1 => ("UPDATE orders SET amount = amount + 1 WHERE id = $1", id),
            _ => ("UPDATE orders SET deleted = true WHERE id = $1", id),
        };
        db.execute(statement, &[&id]).await.expect("the writer's change");
        counts[kind] += 1;
    }
    counts
}

/// One write the sink made to `orders_copy`.
#[derive(Debug)]
struct Write {
    id: i64,
    /// The row's cursor, for an upsert; `None` for a delete (whose item is the key only).
    version: Option<u64>,
}

/// The sink's writes, one entry per transaction (a delivered batch), in the order they were made.
async fn deliveries(orders: &Orders) -> Vec<Vec<Write>> {
    let rows = orders
        .db
        .query("SELECT tx::text, id, version::text FROM copy_log ORDER BY seq", &[])
        .await
        .expect("read the log");
    let mut out: Vec<(String, Vec<Write>)> = Vec::new();
    for r in &rows {
        let tx: String = r.get(0);
        let version = r.get::<_, Option<String>>(2).map(|v| v.parse().expect("an xid8"));
        let write = Write { id: r.get(1), version };
        match out.last_mut() {
            Some((last, writes)) if *last == tx => writes.push(write),
            _ => out.push((tx, vec![write])),
        }
    }
    out.into_iter().map(|(_, w)| w).collect()
}

/// id -> (customer, amount, version) of the rows that are not soft-deleted, or of the copy.
async fn rows_of(orders: &Orders, table: &str) -> BTreeMap<i64, (String, String, String)> {
    let filter = if table == "orders" { " WHERE NOT deleted" } else { "" };
    let query = format!("SELECT id, customer, amount::text, version::text FROM {table}{filter}");
    let rows = orders.db.query(&query, &[]).await.expect("read rows");
    rows.iter().map(|r| (r.get(0), (r.get(1), r.get(2), r.get(3)))).collect()
}

/// The backfill in [`FUNCTION`]'s state document, once the first tick wrote it.
async fn backfill_of(app_name: &str) -> Option<sql_pseudo_trigger::engine::document::Backfill> {
    load_state(&shared_blob_store(), app_name).await.and_then(|(doc, _)| doc.backfill().cloned())
}

/// Fails the test if, in the order the consumer applied them, any order was given an older version than one it
/// already had, or a backfilled row after a live change of it (a soft delete, which only the live path sends,
/// counts as one). `applied` holds `(order, version, backfilled)`, the version `None` for a delete (whose item is
/// the key only); `at` names an entry for the failure message.
fn assert_never_older(applied: impl IntoIterator<Item = (i64, Option<u64>, bool)>, at: impl Fn(usize) -> String) {
    // Per order: the last version applied, and whether a live change of it was applied.
    let mut seen: BTreeMap<i64, (Option<u64>, bool)> = BTreeMap::new();
    for (n, (id, version, backfilled)) in applied.into_iter().enumerate() {
        let (last, live) = seen.entry(id).or_default();
        assert!(!(backfilled && *live), "order {id} backfilled ({}) after a live change of it", at(n));
        match version {
            Some(v) => {
                assert!(
                    (*last).is_none_or(|l| v >= l),
                    "order {id} given version {v} after version {last:?} ({}): an older value overwrote a newer one",
                    at(n)
                );
                *last = Some(v);
            }
            None => assert!(!backfilled, "a backfilled delete of order {id} ({})", at(n)),
        }
        *live |= !backfilled;
    }
}

/// What the sink's log says about the backfill whose bound is `bound`: the chunks in the order they were first
/// delivered (each its keys, sorted) and the deliveries that repeated one (a chunk redone). A live change's
/// cursor is above the bound, a chunk row's at or below it. Fails the test if a delivery mixes chunk rows and
/// live changes, if distinct chunks do not walk the key in order, or if [`assert_never_older`] fails.
fn chunks_in(log: &[Vec<Write>], bound: u64) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let (mut chunks, mut redone): (Vec<Vec<i64>>, Vec<Vec<i64>>) = (Vec::new(), Vec::new());
    let backfilled = |w: &Write| w.version.is_some_and(|v| v <= bound);
    let mut applied = Vec::new();
    for (n, delivery) in log.iter().enumerate() {
        let chunk = delivery.iter().all(backfilled);
        assert!(
            chunk || !delivery.iter().any(backfilled),
            "delivery {n} mixes chunk rows and live changes: {delivery:?}"
        );
        applied.extend(delivery.iter().map(|w| (n, (w.id, w.version, chunk))));
        if !chunk {
            continue;
        }
        let mut keys: Vec<i64> = delivery.iter().map(|w| w.id).collect();
        keys.sort_unstable();
        match chunks.last() {
            Some(previous) if keys.iter().all(|k| previous.binary_search(k).is_ok()) => redone.push(keys),
            previous => {
                assert!(
                    previous.is_none_or(|p| p.last() < keys.first()),
                    "chunk (delivery {n}) {keys:?} does not start after the chunk before it {previous:?}"
                );
                assert!(keys.len() <= RUN_BATCH, "a chunk of {} rows (delivery {n})", keys.len());
                chunks.push(keys);
            }
        }
    }
    let deliveries: Vec<usize> = applied.iter().map(|(n, _)| *n).collect();
    assert_never_older(applied.into_iter().map(|(_, a)| a), |i| format!("delivery {}", deliveries[i]));
    (chunks, redone)
}

/// A backfill under `handler run` into a PostgreSQL sink while a writer inserts, updates and soft-deletes orders
/// on both sides of the backfill's position, with five processes in turn killed during its chunks: three right
/// after the sink committed a chunk and before the state acknowledged it (failpoint `after-sink-chunk`: the
/// crash that makes a chunk be delivered again), two by SIGKILL at whatever the process was doing once the
/// backfill had moved two chunks further. The sink logs every write with its transaction and the row's
/// cursor, so the test reads which deliveries were chunks (cursor at or below the backfill's bound) and which
/// were live changes, in the order the consumer applied them. (No hard deletes or key changes: see the module.)
#[tokio::test]
async fn handler_run_backfills_under_a_writer_and_kill_9_during_chunks_and_redoes_at_most_one_chunk_per_crash() {
    // GIVEN 6,000 orders before the function first runs, mirrored into orders_copy with `startFrom: snapshot` in
    // chunks of 40, and a writer changing them throughout (SQL_PSEUDO_TRIGGER_BACKFILL_SEED replays a run)
    let orders = Orders::new("backfill_run").await;
    orders.db.batch_execute(RUN_TARGET).await.expect("create the target");
    orders.insert(1..=RUN_ROWS).await;
    let app_name = unique_app_name("backfill-run");
    let app = run_app(&orders, &app_name);
    let seed = seed();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_until(orders.url.clone(), RUN_ROWS, Duration::from_millis(4), seed, stopped));
    let mut dice = Dice(seed.rotate_left(17) | 1);
    let progress = || async { backfill_of(&app_name).await.map_or(0, |b| b.chunks) };

    // WHEN five processes in turn are killed during the backfill's chunks
    let mut crashes = Vec::new();
    for round in 0..5 {
        if round % 2 == 0 {
            let point = format!("after-sink-chunk@{}", 2 + dice.below(3));
            let mut runner = Runner::start_with(&app, &[], &[(failpoint::ENV, point.as_str())]);
            let status = runner.exit(Duration::from_secs(60)).await;
            assert!(
                runner.stderr().contains("failpoint after-sink-chunk hit"),
                "{point}: {status}\n{}",
                runner.stderr()
            );
            crashes.push(point);
        } else {
            let before = progress().await;
            let mut runner = Runner::start(&app, &[]);
            let deadline = Instant::now() + Duration::from_secs(60);
            while progress().await < before + 2 {
                assert!(Instant::now() < deadline, "no two chunks within 60 s: {crashes:?}\n{}", runner.stderr());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let after = Duration::from_millis(dice.below(40));
            tokio::time::sleep(after).await;
            runner.kill();
            crashes.push(format!("SIGKILL {after:?} after two more chunks"));
        }
        let b = backfill_of(&app_name).await.expect("a backfill");
        assert_eq!(b.state, BackfillState::Running, "the backfill ended before crash {round}: {crashes:?}");
    }

    // AND the writer stops, and a last process runs until the backfill is done and the copy caught up
    stop.send(true).expect("the writer listens");
    let written = writer.await.expect("the writer");
    let mut runner = Runner::start(&app, &[]);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let settled = load_state(&shared_blob_store(), &app_name).await.is_some_and(|(doc, _)| {
            doc.in_flight().is_none() && doc.backfill().is_some_and(|b| b.state == BackfillState::Done)
        });
        if settled && rows_of(&orders, "orders_copy").await == rows_of(&orders, "orders").await {
            break;
        }
        assert!(Instant::now() < deadline, "not done within 120 s: {crashes:?}\n{}", runner.stderr());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    runner.terminate();
    assert!(runner.exit(Duration::from_secs(10)).await.success(), "{}", runner.stderr());
    eprintln!("writer: {written:?} inserts, updates, soft deletes; crashes: {crashes:?}");

    // THEN the consumer's view (the copy, every delivered change applied in order) equals the table: every order
    // with its last values and version, none of the soft-deleted ones
    let table = rows_of(&orders, "orders").await;
    assert_eq!(rows_of(&orders, "orders_copy").await, table, "crashes: {crashes:?}");
    // AND no order was ever written with an older version than before it (so no backfilled row came after a
    // live change of it), and the chunks walked the key in order
    let b = backfill_of(&app_name).await.expect("a backfill");
    let bound: u64 = b.bound.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bound {:?}", b.bound));
    let (chunks, redone) = chunks_in(&deliveries(&orders).await, bound);
    // AND every order the writer never touched was delivered by exactly one chunk
    let delivered: std::collections::BTreeSet<i64> = chunks.iter().flatten().copied().collect();
    let untouched: Vec<i64> =
        table.iter().filter(|(_, (_, _, v))| v.parse::<u64>().is_ok_and(|v| v <= bound)).map(|(id, _)| *id).collect();
    assert!(untouched.len() > RUN_ROWS as usize / 2, "the writer touched most orders: {}", untouched.len());
    let missing: Vec<&i64> = untouched.iter().filter(|id| !delivered.contains(id)).collect();
    assert!(missing.is_empty(), "orders never backfilled: {missing:?}");
    assert_eq!(b.chunks, chunks.len() as u64, "chunks acknowledged vs delivered: {b:?}");
    // AND at most one chunk was delivered again per crash, and each `after-sink-chunk` crash did redo its chunk
    let rows_twice: usize = redone.iter().map(Vec::len).sum();
    let at_sink = crashes.iter().filter(|c| c.starts_with("after-sink-chunk")).count();
    assert!(
        (at_sink..=crashes.len()).contains(&redone.len()),
        "{} chunk(s) redone after {} crash(es), {at_sink} of them after a chunk's commit: {redone:?}; {crashes:?}",
        redone.len(),
        crashes.len()
    );
    assert!(rows_twice <= crashes.len() * RUN_BATCH, "{rows_twice} rows backfilled twice: {redone:?}");
    assert!((redone.len() as u64..=crashes.len() as u64).contains(&b.redone), "status's chunks redone: {b:?}");
    eprintln!(
        "{} chunks, {} redone ({rows_twice} rows twice) after {} crashes; {} rows backfilled",
        chunks.len(),
        redone.len(),
        crashes.len(),
        delivered.len()
    );
}

// ---------------------------------------------------------------------------------------------------------------
// Under the host model (deferred delivery)
// ---------------------------------------------------------------------------------------------------------------

/// Orders before the host-model function first runs, and its `maxBatchSize`.
const HOST_ROWS: i64 = 1500;
const HOST_BATCH: usize = 20;

/// Whether a delivered message is a backfilled row (`Metadata.Backfill`).
fn is_backfilled(m: &serde_json::Value) -> bool {
    m.get("Metadata").and_then(|md| md.get("Backfill")).is_some()
}

/// A message's row cursor (`Item.version`, text or number), `None` for a delete (its item is the key only).
fn version_of(m: &serde_json::Value) -> Option<u64> {
    let v = m["Item"].get("version")?;
    Some(v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or_else(|| panic!("version of {m}")))
}

/// One handler process played as the host by hand: first attempts until the `nth` is answered with a chunk,
/// recording in `written` what the host writes for every answer before it; the chunk's writes too when
/// `written_chunk` (else its answer is lost with the instance); then kill -9. Returns the chunk's ids.
async fn run_until_a_chunk_then_kill(
    app: &crate::support::AppFolder,
    nth: usize,
    written_chunk: bool,
    written: &mut Vec<serde_json::Value>,
) -> Vec<i64> {
    let host = start(app).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut chunks = 0;
    loop {
        assert!(Instant::now() < deadline, "no chunk answered within 30 s\n{}", host.output());
        let invocation = host.invoke(FUNCTION, None).await.expect("invoke");
        assert_eq!(invocation.status, 200, "{}\n{}", invocation.body, host.output());
        let writes = written_by_host(&host, &invocation);
        chunks += usize::from(writes.iter().any(is_backfilled));
        if chunks == nth {
            let ids = ids_of(&writes);
            if written_chunk {
                written.extend(writes);
            }
            host.kill();
            return ids;
        }
        written.extend(writes);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The same under the host model (deferred delivery, a zero proof window, a 1 s lease): five handler processes
/// in turn are killed right after answering a chunk, three after the host wrote it (nothing can prove it any
/// more: the next owner answers it again) and two with the answer lost with the instance. The test plays the
/// host by hand and keeps what it wrote, in order: the consumer's queue, where backfilled rows say so in their
/// metadata.
#[tokio::test]
async fn under_the_host_a_backfill_killed_after_answering_chunks_redoes_at_most_one_chunk_per_crash() {
    // GIVEN 1,500 orders before the function first runs, `startFrom: snapshot` in chunks of 20, and a writer
    // changing them throughout
    let orders = Orders::new("backfill_host").await;
    orders.insert(1..=HOST_ROWS).await;
    let app_name = unique_app_name("backfill-host");
    let trigger = json!({"startFrom": "snapshot", "maxBatchSize": HOST_BATCH});
    let app = orders_app(&orders, &app_name, trigger, &[("Sql_Trigger_LeaseDurationMs", "1000")]);
    let seed = seed();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_until(orders.url.clone(), HOST_ROWS, Duration::from_millis(25), seed, stopped));

    // WHEN five processes in turn are killed right after answering their first, second or third chunk, its
    // answer written, lost, written, lost, written
    let mut written = Vec::new();
    let (mut crashes, mut written_chunks) = (Vec::new(), std::collections::BTreeSet::new());
    let mut dice = Dice(seed.rotate_left(17) | 1);
    for round in 0..5 {
        let (nth, written_chunk) = (1 + dice.below(3) as usize, round % 2 == 0);
        let chunk = run_until_a_chunk_then_kill(&app, nth, written_chunk, &mut written).await;
        let what = if written_chunk { "written" } else { "lost" };
        crashes.push(format!("chunk {nth} of the process {what}: {chunk:?}"));
        if written_chunk {
            written_chunks.extend(chunk);
        }
        let b = backfill_of(&app_name).await.expect("a backfill");
        assert_eq!(b.state, BackfillState::Running, "the backfill ended before crash {round}: {crashes:?}");
    }

    // AND the writer stops, and a last process runs until the backfill is done and the queue caught up
    stop.send(true).expect("the writer listens");
    let changed = writer.await.expect("the writer");
    let table = || async {
        let rows = orders
            .db
            .query("SELECT id, amount::float8, version::text FROM orders WHERE NOT deleted", &[])
            .await
            .expect("read the table");
        rows.iter()
            .map(|r| (r.get::<_, i64>(0), (r.get::<_, f64>(1), r.get::<_, String>(2))))
            .collect::<BTreeMap<_, _>>()
    };
    let amounts = |t: &BTreeMap<i64, (f64, String)>| t.iter().map(|(k, (a, _))| (*k, *a)).collect::<BTreeMap<_, _>>();
    let host = start(&app).await;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let invocation = host.invoke(FUNCTION, None).await.expect("invoke");
        assert_eq!(invocation.status, 200, "{}\n{}", invocation.body, host.output());
        written.extend(written_by_host(&host, &invocation));
        let done = backfill_of(&app_name).await.is_some_and(|b| b.state == BackfillState::Done);
        if done && crate::backfill::view(&written) == amounts(&table().await) {
            break;
        }
        assert!(Instant::now() < deadline, "not done within 120 s: {crashes:?}\n{}", host.output());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eprintln!("writer: {changed:?} inserts, updates, soft deletes; crashes: {crashes:?}");

    // THEN the consumer's view (every written message applied in order) equals the table
    let table = table().await;
    assert_eq!(crate::backfill::view(&written), amounts(&table), "crashes: {crashes:?}");
    // AND backfilled rows are inserts at or below the backfill's bound, live upserts above it; and no order was
    // ever given an older version than it had (so no backfilled row came after a live change of it)
    let b = backfill_of(&app_name).await.expect("a backfill");
    let bound: u64 = b.bound.as_str().and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("bound {:?}", b.bound));
    for m in &written {
        match (is_backfilled(m), version_of(m)) {
            (true, v) => assert!(m["Operation"] == 0 && v.is_some_and(|v| v <= bound), "{m}"),
            (false, Some(v)) => assert!(v > bound, "a live change at or below the bound {bound}: {m}"),
            (false, None) => assert_eq!(m["Operation"], 2, "{m}"),
        }
    }
    let applied = written.iter().map(|m| (m["Item"]["id"].as_i64().expect("an id"), version_of(m), is_backfilled(m)));
    assert_never_older(applied, |n| format!("message {n}: {}", written[n]));
    // AND every order the writer never touched was backfilled
    let backfilled: BTreeMap<i64, usize> =
        written.iter().filter(|m| is_backfilled(m)).fold(BTreeMap::new(), |mut c, m| {
            *c.entry(m["Item"]["id"].as_i64().expect("an id")).or_insert(0) += 1;
            c
        });
    let untouched: Vec<i64> =
        table.iter().filter(|(_, (_, v))| v.parse::<u64>().is_ok_and(|v| v <= bound)).map(|(id, _)| *id).collect();
    let missing: Vec<&i64> = untouched.iter().filter(|id| !backfilled.contains_key(id)).collect();
    assert!(missing.is_empty(), "orders never backfilled: {missing:?}");
    // AND at most one chunk was delivered again per crash: only rows of the chunks the host wrote right before a
    // crash were backfilled more than once (a lost answer was never written, so its chunk comes once), and the
    // extra deliveries are at most one such chunk's rows per crash (a chunk can be redone by consecutive
    // crashes, once each); and the status counts one redone chunk per crash at most
    let twice: Vec<i64> = backfilled.iter().filter(|(_, n)| **n > 1).map(|(id, _)| *id).collect();
    let unexplained: Vec<&i64> = twice.iter().filter(|id| !written_chunks.contains(id)).collect();
    assert!(
        unexplained.is_empty(),
        "backfilled twice outside the chunks written before a crash: {unexplained:?}; {crashes:?}"
    );
    let extra: usize = backfilled.values().map(|n| n - 1).sum();
    let written_crashes = crashes.iter().filter(|c| c.contains("written")).count();
    assert!(extra <= written_crashes * HOST_BATCH, "{extra} extra backfilled deliveries: {backfilled:?}; {crashes:?}");
    // (A new process does not remember the chunks its predecessor answered: it reads them again from the last
    // proven one as new chunks, which the status does not count as redone.)
    assert!(b.redone <= crashes.len() as u64, "status's chunks redone: {b:?}; {crashes:?}");
    eprintln!("{} chunks, {} redone ({extra} rows again) after {} crashes", b.chunks, b.redone, crashes.len());
}
