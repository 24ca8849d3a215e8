//! `cargo bench --bench logical` (or `scripts/bench logical`): the `postgres-logical` source (logical decoding
//! through a pgoutput slot) beside the `postgres-cursor` source on an equivalent load, and beside the raw limit:
//! `pg_logical_slot_get_binary_changes` in a loop on one connection, decoding nothing on the client.
//!
//! And beside the stream's own limit: `pg_recvlogical` streaming the same span of its own slot to /dev/null.
//!
//! One PostgreSQL (with `pg_stat_statements`, to say where the handler's time goes on the server) and one
//! Azurite; the release `handler` serves both functions through the host model (`testbed::driver`), invoked
//! back to back (handler capacity, not delivery under the host's timer), with blob state on Azurite.
//!
//! The load is 100k changes, 10 per transaction, in rounds of 20 transactions: 12 inserting, then 5 updating
//! 10 of the rows just inserted, then 3 deleting 10 others: 60k inserts, 25k updates, 15k deletes in all.
//! - logical: hard deletes. It delivers every change: 100k, each id's changes in order (checked exactly);
//! - cursor: the same load on the benches/drain table shape, a soft delete (`deleted = true`) for each delete.
//!   A cursor sees each row once, as it is at the drain: 60k changes (45k inserts or updates, an updated row
//!   being an insert when its batch began before the row was created, and 15k deletes; checked exactly);
//! - raw: its own slot on the logical database, created before the load; `get` with `upto_nchanges` set to the
//!   messages of one batch (begin, 10 changes and commit per transaction), until empty (checked: 100k changes).
//!
//! Also measured: an idle tick (nothing changed) as the host sees it, on a slot at the last change and on a
//! slot with another database's WAL after it; the WAL the slot retains after the drain and one more tick.
//! Knobs: `BENCH_LOGICAL_REPEATS` (3), `BENCH_LOGICAL_BATCH` (1000), `BENCH_LOGICAL_IDLE_TICKS` (200),
//! `BENCH_LOGICAL_SLOW_IDLE_TICKS` (20: idle ticks on a slot behind, each of which decodes megabytes).
//!
//! Then delivery under the host's timer (benches/logical/latency.rs): a writer at 500 changes/s, the host model
//! firing the function every second on the wall clock, batch 1000, shipped defaults; latency from commit to
//! answer, for 10 real minutes (`BENCH_LOGICAL_LATENCY_SECONDS`, `BENCH_LOGICAL_LATENCY_RATE`,
//! `BENCH_LOGICAL_LATENCY_CURSOR`: 1 runs the cursor source beside it). One part only: `cargo bench --bench
//! logical latency` (or `drains`; `scripts/bench logical latency`).
//! `cargo test --all-targets` runs this binary without `--bench`; it then does nothing.

#[allow(dead_code)]
#[path = "shared/host_app.rs"]
mod host_app;
#[path = "logical/latency.rs"]
mod latency;

use host_app::{err, Result};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use testbed::driver::{DriverOptions, HostDriver};
use testbed::embedded::{self, Azurite, EmbeddedPostgres, PostgresOptions, ScratchDir};

const ROUNDS: i64 = 500;
const PER_TX: i64 = 10;
/// Per round: transactions that insert, update and delete `PER_TX` rows each.
const INSERT_TX: i64 = 12;
const UPDATE_TX: i64 = 5;
const DELETE_TX: i64 = 3;
const INSERTS: i64 = ROUNDS * INSERT_TX * PER_TX;
const UPDATES: i64 = ROUNDS * UPDATE_TX * PER_TX;
const DELETES: i64 = ROUNDS * DELETE_TX * PER_TX;
const PUBLICATION: &str = "bench_pub";

/// The drain table of benches/drain (the demo's), with a procedure that writes the mixed load. `soft` turns
/// each delete into `deleted = true`, which a cursor can see.
const LOAD: &str = r#"
CREATE PROCEDURE load_mixed(rounds bigint, per_tx bigint, soft boolean) LANGUAGE plpgsql AS $$
DECLARE base bigint; t bigint; lo bigint;
BEGIN
  FOR r IN 0 .. rounds - 1 LOOP
    base := r * 12 * per_tx;
    FOR t IN 0 .. 11 LOOP
      INSERT INTO public.orders (id, customer, amount)
        SELECT g, 'customer-' || (g % 1000), (g % 100000) / 100.0
        FROM generate_series(base + t * per_tx + 1, base + (t + 1) * per_tx) g;
      COMMIT;
    END LOOP;
    FOR t IN 0 .. 4 LOOP
      lo := base + t * per_tx + 1;
      UPDATE public.orders SET amount = amount + 1 WHERE id BETWEEN lo AND lo + per_tx - 1;
      COMMIT;
    END LOOP;
    FOR t IN 5 .. 7 LOOP
      lo := base + t * per_tx + 1;
      IF soft THEN
        UPDATE public.orders SET deleted = true WHERE id BETWEEN lo AND lo + per_tx - 1;
      ELSE
        DELETE FROM public.orders WHERE id BETWEEN lo AND lo + per_tx - 1;
      END IF;
      COMMIT;
    END LOOP;
  END LOOP;
END $$;
"#;

/// Whether id `id` (1-based) is updated, deleted, or neither by the load.
fn fate(id: i64) -> Fate {
    match (id - 1) % (INSERT_TX * PER_TX) {
        k if k < UPDATE_TX * PER_TX => Fate::Updated,
        k if k < (UPDATE_TX + DELETE_TX) * PER_TX => Fate::Deleted,
        _ => Fate::Kept,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Kept,
    Updated,
    Deleted,
}

const INSERT: u8 = 0;
const UPDATE: u8 = 1;
const DELETE: u8 = 2;

#[derive(Debug, Clone)]
struct Knobs {
    repeats: usize,
    batch: usize,
    idle_ticks: usize,
    /// Idle ticks where each one decodes megabytes (a slot behind): fewer, or the run takes minutes.
    slow_idle_ticks: usize,
    handler: PathBuf,
    /// Which parts run: the drains (everything above) and the delivery latency under the host's timer.
    drains: bool,
    latency: bool,
    /// The latency run: seconds of writing, the writer's changes per second, and the cursor source beside it.
    latency_seconds: u64,
    latency_rate: u64,
    latency_cursor: bool,
}

impl Knobs {
    fn from_env() -> Result<Self> {
        let number = host_app::number::<usize>;
        let handler = host_app::handler()?;
        // `cargo bench --bench logical latency` (or `drains`): the filter cargo passes, to run one part only.
        let only: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
        Ok(Self {
            repeats: number("BENCH_LOGICAL_REPEATS", 3)?.max(1),
            batch: number("BENCH_LOGICAL_BATCH", 1000)?.max(10),
            idle_ticks: number("BENCH_LOGICAL_IDLE_TICKS", 200)?.max(1),
            slow_idle_ticks: number("BENCH_LOGICAL_SLOW_IDLE_TICKS", 20)?.max(1),
            handler,
            drains: !only.contains(&"latency".to_string()) || only.contains(&"drains".to_string()),
            latency: !only.contains(&"drains".to_string()) || only.contains(&"latency".to_string()),
            latency_seconds: number("BENCH_LOGICAL_LATENCY_SECONDS", 600)?.max(1) as u64,
            latency_rate: number("BENCH_LOGICAL_LATENCY_RATE", 500)?.max(PER_TX as usize) as u64,
            latency_cursor: number("BENCH_LOGICAL_LATENCY_CURSOR", 1)? != 0,
        })
    }
}

fn main() -> ExitCode {
    host_app::bench_main("logical", run)
}

/// One drain: changes delivered and the time from the first call to the answer that found nothing.
#[derive(Debug, Clone, Copy)]
struct Drain {
    changes: u64,
    seconds: f64,
    calls: u64,
    http_seconds: f64,
}

impl Drain {
    fn per_second(&self) -> f64 {
        self.changes as f64 / self.seconds
    }
}

/// The WAL a slot keeps after the drain and one more tick.
#[derive(Debug, Clone)]
struct Retained {
    /// `confirmed_flush_lsn` minus the end of the load's last commit: 0 or more when the slot is at or past the
    /// last acknowledged change.
    confirmed_past_load: i64,
    /// `pg_current_wal_lsn()` minus `confirmed_flush_lsn`, and minus `restart_lsn`.
    behind_confirmed: i64,
    behind_restart: i64,
    /// WAL written on the server after the load's last commit (other databases, VACUUM, checkpoints).
    written_since_load: i64,
}

/// One figure of [`Retained`], for the rows of its table.
type RetainedField = fn(&Retained) -> i64;

/// Server time of the handler's statements during one logical drain (pg_stat_statements).
#[derive(Debug, Clone, Default)]
struct Statements {
    /// (label, calls, total ms)
    rows: Vec<(String, i64, f64)>,
}

/// One drain of a logical function, and what it shows.
#[derive(Debug, Clone)]
struct Profile {
    drain: Drain,
    statements: Statements,
    /// Mean ms per delivering tick inside the handler (its `tick finished` lines), and blob operations per tick.
    tick_ms: f64,
    blob_ops: f64,
    retained: Retained,
}

#[derive(Debug, Default)]
struct Repeat {
    /// `proofWindowMs: 0`: the checkpoint, and so the slot, follow each batch at the next tick.
    logical: Option<Profile>,
    cursor: Option<Drain>,
    /// Of the cursor's changes, how many were updates (the rest of the updated rows arrived as inserts).
    cursor_updates: u64,
    raw: Option<Drain>,
    /// `pg_recvlogical` over the load's span of its own slot.
    recv: Option<Drain>,
}

/// Idle ticks: their sorted round trips, the WAL between the slot and the flush position before them, and per
/// tick the bytes the slot decoded (`pg_stat_replication_slots.total_bytes`) and the WAL written meanwhile.
type Idle = (Vec<Duration>, i64, (f64, f64));

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1000.0
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn run() -> Result<String> {
    let knobs = Knobs::from_env()?;
    let load_avg_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let (postgres, azurite) = tokio::task::spawn_blocking(|| -> Result<(EmbeddedPostgres, Azurite)> {
        let options = PostgresOptions::default()
            .setting("shared_preload_libraries", "pg_stat_statements")
            .setting("pg_stat_statements.track_planning", "off");
        Ok((
            EmbeddedPostgres::start_with(options).map_err(err("starting PostgreSQL"))?,
            Azurite::start().map_err(err("starting Azurite"))?,
        ))
    })
    .await
    .map_err(err("starting the servers"))??;
    eprintln!("logical: {} on port {}", postgres.version(), postgres.port());
    if !knobs.drains {
        return latency::run(&knobs, &postgres, &azurite).await;
    }

    // Every database first: the handler reads its app folder once.
    let mut env = vec![
        ("AzureWebJobsStorage".to_string(), azurite.connection_string()),
        ("Sql_Trigger_StateStore".to_string(), "blob".to_string()),
        ("Sql_Trigger_AppName".to_string(), "bench-logical".to_string()),
        ("RUST_BACKTRACE".to_string(), "0".to_string()),
        // The template's schedule setting (the drains invoke back to back; the schedule is not used).
        ("PgOrdersChanged_Schedule".to_string(), "*/5 * * * * *".to_string()),
    ];
    let mut dbs = Vec::new();
    for r in 1..=knobs.repeats {
        let (logical, cursor) = (format!("logical_{r}"), format!("cursor_{r}"));
        let logical_url = database(&postgres, &logical).await?;
        let cursor_url = database(&postgres, &cursor).await?;
        let db = embedded::connect(&logical_url).await.map_err(err("connecting"))?;
        db.batch_execute(&format!(
            "CREATE PUBLICATION {PUBLICATION} FOR TABLE public.orders; CREATE EXTENSION pg_stat_statements"
        ))
        .await
        .map_err(err("creating the publication"))?;
        env.push((format!("LogicalDb{r}"), logical_url.clone()));
        env.push((format!("CursorDb{r}"), cursor_url.clone()));
        dbs.push((logical_url, cursor_url));
    }
    let app = app_folder(&knobs)?;
    let mut options = DriverOptions::new(app.path(), &knobs.handler);
    options.env = env;
    let host = HostDriver::start(options).await.map_err(err("starting the handler"))?;

    let mut repeats = Vec::new();
    let mut default_window = None;
    let (mut idle_quiet, mut idle_default, mut idle_busy): (Idle, Idle, Idle) = Default::default();
    for (i, (logical_url, cursor_url)) in dbs.iter().enumerate() {
        let r = i + 1;
        let mut repeat = Repeat::default();
        let db = embedded::connect(logical_url).await.map_err(err("connecting"))?;
        let logical_fn = format!("Logical{r}");
        let default_fn = "LogicalDefaultWindow";
        // The first tick creates the slot: changes before it are not read.
        let mut first_ticks = vec![logical_fn.as_str()];
        if r == 1 {
            first_ticks.push(default_fn);
        }
        for f in first_ticks {
            let first = invoke_until_empty(&host, f).await?;
            if first.changes != 0 {
                return Err(format!("{f}: the first tick delivered {} changes", first.changes));
            }
        }
        // Like for like with `pg_recvlogical`, which decodes the load's span after the load: the handler's stream,
        // opened by the first tick, must not read the load ahead while it is written. It closes once no tick used
        // it for `streamIdleReleaseMs` (the default, 30 s), so the drain's first tick opens a new stream at the
        // slot's confirmed position and decodes the whole span while the drain runs.
        let mut slots = vec![format!("bench_logical_{r}")];
        if r == 1 {
            slots.push("bench_logical_default".into());
        }
        for slot in &slots {
            wait_released(&db, slot).await?;
        }
        let raw_slot = format!("raw_{r}");
        let recv_slot = format!("recv_{r}");
        for slot in [&raw_slot, &recv_slot] {
            db.query_one("SELECT pg_create_logical_replication_slot($1, 'pgoutput')", &[slot])
                .await
                .map_err(err("creating the raw slots"))?;
        }
        let loaded = Instant::now();
        db.execute("CALL load_mixed($1, $2, false)", &[&ROUNDS, &PER_TX]).await.map_err(err("loading"))?;
        let load_end: String = db
            .query_one("SELECT pg_current_wal_insert_lsn()::text", &[])
            .await
            .map_err(err("reading the WAL position"))?
            .get(0);
        let wal_of_load: i64 = db
            .query_one(
                "SELECT pg_wal_lsn_diff($1::text::pg_lsn, confirmed_flush_lsn)::int8 FROM pg_replication_slots WHERE slot_name = $2",
                &[&load_end, &raw_slot],
            )
            .await
            .map_err(err("reading the load's WAL"))?
            .get(0);
        // No VACUUM here (unlike the cursor's table): decoding does not read the table, and its WAL would sit
        // between the slot and the flush position for the idle ticks below.
        eprintln!(
            "logical: repeat {r}: {} changes loaded in {:.1} s ({:.1} MB of WAL)",
            INSERTS + UPDATES + DELETES,
            loaded.elapsed().as_secs_f64(),
            wal_of_load as f64 / 1e6
        );

        // Ours and raw, alternating which goes first.
        let ours_first = i % 2 == 0;
        for turn in 0..2 {
            if (turn == 0) == ours_first {
                repeat.logical =
                    Some(profile(&host, &db, &logical_fn, &format!("bench_logical_{r}"), &load_end).await?);
            } else {
                repeat.raw = Some(drain_raw(&db, &raw_slot, knobs.batch).await?);
                db.query_one("SELECT pg_drop_replication_slot($1)", &[&raw_slot])
                    .await
                    .map_err(err("dropping the raw slot"))?;
            }
        }
        repeat.recv = Some(drain_recv(logical_url, &recv_slot, &load_end).await?);
        db.query_one("SELECT pg_drop_replication_slot($1)", &[&recv_slot]).await.map_err(err("dropping the slot"))?;
        if r == 1 {
            idle_quiet = idle(&host, &db, &logical_fn, "bench_logical_1", knobs.idle_ticks).await?;
            // The shipped default: deferred delivery's proof window (5 min 30.1 s with this host.json) keeps the
            // checkpoint, and so the slot, where it was before the drain.
            default_window = Some(profile(&host, &db, default_fn, "bench_logical_default", &load_end).await?);
            idle_default = idle(&host, &db, default_fn, "bench_logical_default", knobs.slow_idle_ticks).await?;
        }

        // The cursor source on the same load with soft deletes, in its own database.
        let cdb = embedded::connect(cursor_url).await.map_err(err("connecting"))?;
        cdb.execute("CALL load_mixed($1, $2, true)", &[&ROUNDS, &PER_TX]).await.map_err(err("loading"))?;
        cdb.batch_execute("VACUUM (ANALYZE) public.orders").await.map_err(err("VACUUM"))?;
        if r == 1 {
            // The slot has not moved since the drain (an empty tick records the stretch it proved empty at
            // most every 5 minutes), so each idle peek now reads the other database's WAL too.
            idle_busy = idle(&host, &db, &logical_fn, "bench_logical_1", knobs.slow_idle_ticks).await?;
        }
        let (cursor, updates) = drain_cursor(&host, &format!("Cursor{r}")).await?;
        repeat.cursor = Some(cursor);
        repeat.cursor_updates = updates;
        eprintln!(
            "logical: repeat {r}: logical {:.0}/s, cursor {:.0}/s, raw {:.0}/s",
            repeat.logical.as_ref().map_or(0.0, |p| p.drain.per_second()),
            repeat.cursor.as_ref().map_or(0.0, Drain::per_second),
            repeat.raw.as_ref().map_or(0.0, Drain::per_second)
        );
        repeats.push(repeat);
    }
    host.kill();
    let load_avg_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let idles = [&idle_quiet, &idle_default, &idle_busy];
    let mut out =
        report(&knobs, &postgres, &repeats, default_window.as_ref(), idles, (&load_avg_before, &load_avg_after));
    if knobs.latency {
        out.push('\n');
        out.push_str(&latency::run(&knobs, &postgres, &azurite).await?);
    }
    Ok(out)
}

async fn database(postgres: &EmbeddedPostgres, name: &str) -> Result<String> {
    let url = embedded::create_database(&postgres.url(), name).await.map_err(err("creating a database"))?;
    let db = embedded::connect(&url).await.map_err(err("connecting"))?;
    db.batch_execute(testbed::demo::ORDERS_SCHEMA).await.map_err(err("creating public.orders"))?;
    db.batch_execute(LOAD).await.map_err(err("creating load_mixed"))?;
    Ok(url)
}

/// This repository's host.json; per repeat a logical and a cursor function with the template's function.json.
fn app_folder(knobs: &Knobs) -> Result<ScratchDir> {
    let dir = ScratchDir::new("bench-logical").map_err(err("creating the app folder"))?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(root.join("host.json"), dir.path().join("host.json")).map_err(err("copying host.json"))?;
    let function = std::fs::read(root.join("function-templates/PgOrdersChanged/function.json"))
        .map_err(err("reading the template's function.json"))?;
    let mut functions = vec![(
        "LogicalDefaultWindow".to_string(),
        json!({
            "source": "postgres-logical",
            "tableName": "public.orders",
            "connectionStringSetting": "LogicalDb1",
            "slotName": "bench_logical_default",
            "publicationName": PUBLICATION,
            "maxBatchSize": knobs.batch,
        }),
    )];
    for r in 1..=knobs.repeats {
        let logical = json!({
            "source": "postgres-logical",
            "tableName": "public.orders",
            "connectionStringSetting": format!("LogicalDb{r}"),
            "slotName": format!("bench_logical_{r}"),
            "publicationName": PUBLICATION,
            "maxBatchSize": knobs.batch,
            // The checkpoint passes a batch at the next tick instead of after the proof window.
            "proofWindowMs": 0,
        });
        let cursor = json!({
            "source": "postgres-cursor",
            "tableName": "public.orders",
            "connectionStringSetting": format!("CursorDb{r}"),
            "cursorColumn": "version",
            "insertedColumn": "created_version",
            "softDeleteColumn": "deleted",
            "maxBatchSize": knobs.batch,
        });
        functions.push((format!("Logical{r}"), logical));
        functions.push((format!("Cursor{r}"), cursor));
    }
    for (name, trigger) in functions {
        let folder = dir.path().join(name);
        std::fs::create_dir_all(&folder).map_err(err("creating a function folder"))?;
        std::fs::write(folder.join("function.json"), &function).map_err(err("writing function.json"))?;
        std::fs::write(folder.join("sqltrigger.json"), trigger.to_string()).map_err(err("writing sqltrigger.json"))?;
    }
    Ok(dir)
}

/// The part of an answer the drains check.
#[derive(serde::Deserialize)]
struct Answer {
    #[serde(rename = "Outputs", default)]
    outputs: Outputs,
}

#[derive(serde::Deserialize, Default)]
struct Outputs {
    #[serde(default)]
    changes: Vec<AnswerChange>,
}

#[derive(serde::Deserialize)]
struct AnswerChange {
    #[serde(rename = "Operation")]
    operation: u8,
    #[serde(rename = "Item")]
    item: AnswerItem,
}

#[derive(serde::Deserialize)]
struct AnswerItem {
    id: i64,
}

/// Invokes `function` back to back until it answers an empty batch, handing each change to `seen`.
async fn drain_with(host: &HostDriver, function: &str, mut seen: impl FnMut(u8, i64)) -> Result<Drain> {
    let (mut changes, mut calls, mut http) = (0u64, 0u64, Duration::ZERO);
    let started = Instant::now();
    loop {
        let invocation = host.invoke_raw(function).await.map_err(|e| format!("invoking {function}: {e}"))?;
        calls += 1;
        http += invocation.elapsed;
        if !invocation.succeeded() {
            let log = host.output();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            return Err(format!(
                "{function} failed on invocation {calls} ({}): {}\nhandler log tail:\n{}",
                invocation.status,
                invocation.body,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            ));
        }
        let answer: Answer = serde_json::from_str(&invocation.body)
            .map_err(|e| format!("{function}: an answer without Outputs.changes[].Item.id: {e}"))?;
        if answer.outputs.changes.is_empty() {
            break;
        }
        for c in answer.outputs.changes {
            changes += 1;
            seen(c.operation, c.item.id);
        }
    }
    Ok(Drain { changes, seconds: started.elapsed().as_secs_f64(), calls, http_seconds: http.as_secs_f64() })
}

async fn invoke_until_empty(host: &HostDriver, function: &str) -> Result<Drain> {
    drain_with(host, function, |_, _| {}).await
}

/// Drains the logical function; every id's changes must be exactly its insert, then its update or delete.
async fn drain_logical(host: &HostDriver, function: &str) -> Result<Drain> {
    let mut by_id: BTreeMap<i64, Vec<u8>> = BTreeMap::new();
    let drain = drain_with(host, function, |op, id| by_id.entry(id).or_default().push(op)).await?;
    let mut wrong = Vec::new();
    for id in 1..=INSERTS {
        let expected = match fate(id) {
            Fate::Kept => vec![INSERT],
            Fate::Updated => vec![INSERT, UPDATE],
            Fate::Deleted => vec![INSERT, DELETE],
        };
        let got = by_id.remove(&id).unwrap_or_default();
        if got != expected && wrong.len() < 5 {
            wrong.push(format!("id {id}: {got:?}, expected {expected:?}"));
        }
    }
    let expected = (INSERTS + UPDATES + DELETES) as u64;
    if !wrong.is_empty() || !by_id.is_empty() || drain.changes != expected {
        return Err(format!(
            "{function}: {} changes, expected {expected}; {} unexpected ids; {}",
            drain.changes,
            by_id.len(),
            wrong.join("; ")
        ));
    }
    Ok(drain)
}

/// Drains the cursor function; every id exactly once, as the row is at the drain.
async fn drain_cursor(host: &HostDriver, function: &str) -> Result<(Drain, u64)> {
    let mut by_id: BTreeMap<i64, Vec<u8>> = BTreeMap::new();
    let drain = drain_with(host, function, |op, id| by_id.entry(id).or_default().push(op)).await?;
    let (mut wrong, mut updates) = (Vec::new(), 0u64);
    for id in 1..=INSERTS {
        let got = by_id.remove(&id).unwrap_or_default();
        // An updated row is an insert when its batch starts before the row was created (new to the consumer),
        // else an update: which one depends on where batches end, so either is right, once.
        let right = match fate(id) {
            Fate::Kept => got == [INSERT],
            Fate::Updated => got == [INSERT] || got == [UPDATE],
            Fate::Deleted => got == [DELETE],
        };
        if got == [UPDATE] {
            updates += 1;
        }
        if !right && wrong.len() < 5 {
            let expected = fate(id);
            wrong.push(format!("id {id}: {got:?}, its fate {expected:?}"));
        }
    }
    if !wrong.is_empty() || !by_id.is_empty() || drain.changes != INSERTS as u64 {
        return Err(format!(
            "{function}: {} changes, expected {INSERTS}; {} unexpected ids; {}",
            drain.changes,
            by_id.len(),
            wrong.join("; ")
        ));
    }
    Ok((drain, updates))
}

/// `pg_recvlogical` of this PostgreSQL (`PG_BIN_DIR`, the Debian layout, or the PATH).
fn recvlogical() -> PathBuf {
    if let Some(dir) = std::env::var_os("PG_BIN_DIR") {
        return PathBuf::from(dir).join("pg_recvlogical");
    }
    let debian = std::fs::read_dir("/usr/lib/postgresql").into_iter().flatten().flatten();
    let mut found: Vec<PathBuf> = debian.map(|d| d.path().join("bin/pg_recvlogical")).filter(|p| p.is_file()).collect();
    found.sort();
    found.pop().unwrap_or_else(|| PathBuf::from("pg_recvlogical"))
}

/// Waits until no connection streams `slot` (the handler's stream released it), at most a minute.
async fn wait_released(db: &tokio_postgres::Client, slot: &str) -> Result<()> {
    let started = Instant::now();
    loop {
        let active: bool = db
            .query_one("SELECT active FROM pg_replication_slots WHERE slot_name = $1", &[&slot])
            .await
            .map_err(err("reading the slot"))?
            .get(0);
        if !active {
            eprintln!("logical: slot {slot} released after {:.1} s", started.elapsed().as_secs_f64());
            return Ok(());
        }
        if started.elapsed() > Duration::from_secs(60) {
            return Err(format!("slot {slot} still streamed after 60 s: the handler's stream was not released"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The stream's limit: `pg_recvlogical` streaming the load's span of its own slot (pgoutput, the same
/// publication) to /dev/null, until the load's end LSN. The server decodes and sends; the client writes nothing.
async fn drain_recv(url: &str, slot: &str, load_end: &str) -> Result<Drain> {
    let publications = format!("publication_names={PUBLICATION}");
    let started = Instant::now();
    let out = tokio::process::Command::new(recvlogical())
        .args(["-d", url, "--slot", slot, "--start", "-o", "proto_version=1", "-o", &publications])
        .args(["--endpos", load_end, "-f", "/dev/null", "--no-loop"])
        .output()
        .await
        .map_err(err("running pg_recvlogical"))?;
    let seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(format!("pg_recvlogical failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(Drain { changes: (INSERTS + UPDATES + DELETES) as u64, seconds, calls: 1, http_seconds: 0.0 })
}

/// The raw limit: `get` until empty on one connection, `upto_nchanges` = the messages of one batch; the server
/// decodes (pgoutput), the client only counts.
async fn drain_raw(db: &tokio_postgres::Client, slot: &str, batch: usize) -> Result<Drain> {
    let messages = (batch as i64 / PER_TX) * (PER_TX + 2);
    let statement = db
        .prepare(&format!(
            "SELECT count(*), count(*) FILTER (WHERE get_byte(data, 0) = 73), count(*) FILTER (WHERE get_byte(data, 0) = 85),
                count(*) FILTER (WHERE get_byte(data, 0) = 68)
             FROM pg_logical_slot_get_binary_changes($1, NULL, $2::int4, 'proto_version', '1', 'publication_names', '{PUBLICATION}')"
        ))
        .await
        .map_err(err("preparing the raw statement"))?;
    let messages = i32::try_from(messages).map_err(err("messages per batch"))?;
    let (mut counts, mut calls) = ([0i64; 3], 0u64);
    let started = Instant::now();
    loop {
        let row = db.query_one(&statement, &[&slot, &messages]).await.map_err(err("the raw loop"))?;
        calls += 1;
        let total: i64 = row.get(0);
        if total == 0 {
            break;
        }
        for (k, c) in counts.iter_mut().enumerate() {
            *c += row.get::<_, i64>(k + 1);
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    if counts != [INSERTS, UPDATES, DELETES] {
        return Err(format!(
            "raw: decoded {counts:?} inserts, updates, deletes; expected {INSERTS}, {UPDATES}, {DELETES}"
        ));
    }
    Ok(Drain { changes: counts.iter().sum::<i64>() as u64, seconds, calls, http_seconds: 0.0 })
}

async fn retained(db: &tokio_postgres::Client, slot: &str, load_end: &str) -> Result<Retained> {
    let row = db
        .query_one(
            "SELECT pg_wal_lsn_diff(confirmed_flush_lsn, $2::text::pg_lsn)::int8,
                pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8,
                pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8,
                pg_wal_lsn_diff(pg_current_wal_lsn(), $2::text::pg_lsn)::int8
             FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot, &load_end],
        )
        .await
        .map_err(err("reading the slot"))?;
    Ok(Retained {
        confirmed_past_load: row.get(0),
        behind_confirmed: row.get(1),
        behind_restart: row.get(2),
        written_since_load: row.get(3),
    })
}

/// The handler's statements in this database since the last reset, grouped by what they are.
async fn statements(db: &tokio_postgres::Client) -> Result<Statements> {
    let rows = db
        .query(
            "SELECT query, calls, total_exec_time FROM pg_stat_statements
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
               AND query NOT LIKE '%pg_stat_statements%'",
            &[],
        )
        .await
        .map_err(err("reading pg_stat_statements"))?;
    let mut grouped: BTreeMap<&'static str, (i64, f64)> = BTreeMap::new();
    for row in rows {
        let query: String = row.get(0);
        let label = if query.contains("pg_logical_slot_peek_binary_changes") {
            "1 peek (pg_logical_slot_peek_binary_changes)"
        } else if query.contains("jsonb_populate_record") {
            "2 items (jsonb_populate_record, one per batch)"
        } else if query.contains("pg_replication_slot_advance") {
            "4 advance (pg_replication_slot_advance)"
        } else if query.contains("pg_replication_slots") {
            "3 slot state (pg_replication_slots)"
        } else if query.trim() == "SELECT pg_current_wal_flush_lsn()::text" {
            "5 flush position (pg_current_wal_flush_lsn, a tick that waits for the stream)"
        } else {
            "6 other (catalog, settings)"
        };
        let e = grouped.entry(label).or_default();
        e.0 += row.get::<_, i64>(1);
        e.1 += row.get::<_, f64>(2);
    }
    Ok(Statements { rows: grouped.into_iter().map(|(l, (c, ms))| (l[2..].to_string(), c, ms)).collect() })
}

/// Mean ms inside the handler and blob operations of the delivering ticks in a log slice.
fn delivering_ticks(log: &str, function: &str) -> (f64, f64) {
    let (mut n, mut ms, mut ops) = (0.0, 0.0, 0.0);
    for line in log.lines() {
        let Some((head, fields)) = line.split_once("tick finished") else { continue };
        if !head.contains(&format!("function={function}")) {
            continue;
        }
        let field = |key: &str| -> Option<f64> {
            fields.split_whitespace().find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
        };
        if field("rows").unwrap_or(0.0) > 0.0 {
            n += 1.0;
            ms += field("elapsed_ms").unwrap_or(0.0);
            ops += field("store_operations").unwrap_or(0.0);
        }
    }
    if n == 0.0 {
        (0.0, 0.0)
    } else {
        (ms / n, ops / n)
    }
}

/// Drains a logical function (statistics reset first), reads its statements and ticks, ticks once more (which
/// acknowledges the last batch at the slot, when the checkpoint passed it) and reads what the slot keeps.
async fn profile(
    host: &HostDriver,
    db: &tokio_postgres::Client,
    function: &str,
    slot: &str,
    load_end: &str,
) -> Result<Profile> {
    db.batch_execute("SELECT pg_stat_statements_reset()").await.map_err(err("resetting statistics"))?;
    let log_before = host.output().len();
    let drain = drain_logical(host, function).await?;
    let statements = statements(db).await?;
    let (tick_ms, blob_ops) = delivering_ticks(&host.output()[log_before..], function);
    invoke_until_empty(host, function).await?;
    let retained = retained(db, slot, load_end).await?;
    eprintln!("logical: {function}: {:.0} changes/s", drain.per_second());
    Ok(Profile { drain, statements, tick_ms, blob_ops, retained })
}

/// WAL bytes between the slot's `confirmed_flush_lsn` and the flush position: what an idle peek reads.
async fn behind_flush(db: &tokio_postgres::Client, slot: &str) -> Result<i64> {
    Ok(db
        .query_one(
            "SELECT pg_wal_lsn_diff(pg_current_wal_flush_lsn(), confirmed_flush_lsn)::int8 FROM pg_replication_slots WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(err("reading the slot"))?
        .get(0))
}

/// What the slot has decoded (`pg_stat_replication_slots.total_bytes`), and the WAL written so far.
async fn decoded(db: &tokio_postgres::Client, slot: &str) -> Result<(i64, i64)> {
    let row = db
        .query_one(
            "SELECT coalesce((SELECT total_bytes FROM pg_stat_replication_slots WHERE slot_name = $1), 0)::int8,
                pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::int8",
            &[&slot],
        )
        .await
        .map_err(err("reading pg_stat_replication_slots"))?;
    Ok((row.get(0), row.get(1)))
}

/// `count` invocations that find nothing, and the WAL between the slot and the flush position before them.
async fn idle(
    host: &HostDriver,
    db: &tokio_postgres::Client,
    function: &str,
    slot: &str,
    count: usize,
) -> Result<Idle> {
    let behind = behind_flush(db, slot).await?;
    let before = decoded(db, slot).await?;
    let mut took = Vec::with_capacity(count);
    for _ in 0..count {
        let invocation = host.invoke_raw(function).await.map_err(|e| format!("invoking {function}: {e}"))?;
        let answer: Answer = serde_json::from_str(&invocation.body).map_err(|e| format!("{function}: {e}"))?;
        if !invocation.succeeded() || !answer.outputs.changes.is_empty() {
            return Err(format!("{function}: an idle tick was expected, got {}", invocation.body));
        }
        took.push(invocation.elapsed);
    }
    took.sort_unstable();
    // The walsender reports its statistics when it sends a transaction or stops; what it decoded for these
    // ticks shows once it has.
    let after = decoded(db, slot).await?;
    let per_tick = |a: i64, b: i64| (a - b).max(0) as f64 / count as f64;
    Ok((took, behind, (per_tick(after.0, before.0), per_tick(after.1, before.1))))
}

fn report(
    knobs: &Knobs,
    postgres: &EmbeddedPostgres,
    repeats: &[Repeat],
    default_window: Option<&Profile>,
    idles: [&Idle; 3],
    load: (&str, &str),
) -> String {
    let rates = |f: &dyn Fn(&Repeat) -> Option<Drain>| -> Vec<Drain> { repeats.iter().filter_map(f).collect() };
    let logical = rates(&|r| r.logical.as_ref().map(|p| p.drain));
    let cursor = rates(&|r| r.cursor);
    let raw = rates(&|r| r.raw);
    let recv = rates(&|r| r.recv);
    let med = |d: &[Drain]| median(d.iter().map(Drain::per_second).collect());
    let ms_per = |d: &[Drain]| median(d.iter().map(|d| d.seconds * 1000.0 / d.calls as f64).collect());
    let each =
        |d: &[Drain]| d.iter().map(|d| format!("{:.1}k", d.per_second() / 1000.0)).collect::<Vec<_>>().join(", ");
    let raw_rate = med(&raw);
    let recv_rate = med(&recv);
    let total = INSERTS + UPDATES + DELETES;
    let first_three = |s: &str| s.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    let mut out = format!(
        "Run on {} CPU(s) (load average {} before, {} after): {}; batch {}; the median of {} drains, the default proof window drained once.\n\n",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        first_three(load.0),
        first_three(load.1),
        postgres.version(),
        knobs.batch,
        repeats.len()
    );
    out.push_str("Like for like: every contender decodes the load's span after the load. The handler's stream was released before the load (its slot inactive: `streamIdleReleaseMs` passed), so each drain's first tick opens a new stream at the slot's confirmed position, as `pg_recvlogical` starts at its slot's.\n\n");
    out.push_str("| contender | delivers | changes/s | ms per call | each drain | time per change / raw's | / pg_recvlogical's |\n|---|---|---:|---:|---|---:|---:|\n");
    let every = format!("every change: {INSERTS} inserts, {UPDATES} updates, {DELETES} deletes = {total}");
    out.push_str(&format!(
        "| ours, `postgres-logical` (stream), `proofWindowMs: 0` (handler, HTTP, blob) | {every} | {:.1}k | {:.2} | {} | {:.2}× | {:.2}× |\n",
        med(&logical) / 1000.0,
        ms_per(&logical),
        each(&logical),
        raw_rate / med(&logical),
        recv_rate / med(&logical)
    ));
    if let Some(p) = default_window {
        let d = [p.drain];
        out.push_str(&format!(
            "| ours, `postgres-logical` (stream), shipped defaults (proof window 5 min 30.1 s) | {every} | {:.1}k | {:.2} | {} | {:.2}× | {:.2}× |\n",
            med(&d) / 1000.0,
            ms_per(&d),
            each(&d),
            raw_rate / med(&d),
            recv_rate / med(&d)
        ));
    }
    out.push_str(&format!(
        "| ours, `postgres-cursor` (handler, HTTP, blob), soft deletes | each row once, as it is at the drain: {} inserts and {} updates (an updated row is an insert when its batch began before the row was created), {DELETES} deletes = {INSERTS} | {:.1}k | {:.2} | {} | {:.2}× | {:.2}× |\n",
        INSERTS - DELETES - repeats.first().map_or(0, |r| r.cursor_updates as i64),
        repeats.first().map_or(0, |r| r.cursor_updates),
        med(&cursor) / 1000.0,
        ms_per(&cursor),
        each(&cursor),
        raw_rate / med(&cursor),
        recv_rate / med(&cursor)
    ));
    out.push_str(&format!(
        "| raw: `pg_logical_slot_get_binary_changes` loop, {} messages per call | every change (counted on the server) = {total} | {:.1}k | {:.2} | {} | 1.00× | {:.2}× |\n",
        (knobs.batch as i64 / PER_TX) * (PER_TX + 2),
        raw_rate / 1000.0,
        ms_per(&raw),
        each(&raw),
        recv_rate / raw_rate
    ));
    out.push_str(&format!(
        "| raw: `pg_recvlogical` to /dev/null, to the load's end LSN | the load's span (not counted) | {:.1}k | {:.2} | {} | {:.2}× | 1.00× |\n\n",
        recv_rate / 1000.0,
        ms_per(&recv),
        each(&recv),
        raw_rate / recv_rate
    ));
    out.push_str("Every drain checked: logical, each id's changes exactly (its insert, then its update or delete, nothing else); cursor, each id exactly once with the operation its row shows; raw, the exact numbers of inserts, updates and deletes; pg_recvlogical, its exit status only.\n\n");

    let mut profiles: Vec<(&str, &Profile)> = Vec::new();
    if let Some(p) = repeats.first().and_then(|r| r.logical.as_ref()) {
        profiles.push(("`proofWindowMs: 0`, repeat 1", p));
    }
    if let Some(p) = default_window {
        profiles.push(("shipped defaults", p));
    }
    out.push_str("Where a logical drain's time goes, per invocation (mean): the driver's wall time, the tick inside the handler (its `tick finished` lines, delivering ticks), and the server time of the handler's statements (pg_stat_statements, whole drain divided by its invocations):\n\n| drain | invocations | wall ms | HTTP round trip ms | tick in handler ms | blob ops per tick |");
    let labels: Vec<String> = profiles
        .iter()
        .flat_map(|(_, p)| p.statements.rows.iter().map(|(l, _, _)| l.clone()))
        .fold(Vec::new(), |mut v, l| {
            if !v.contains(&l) {
                v.push(l);
            }
            v
        });
    for l in &labels {
        out.push_str(&format!(" {l} ms (calls) |"));
    }
    out.push_str("\n|---|---:|---:|---:|---:|---:|");
    out.push_str(&"---:|".repeat(labels.len()));
    out.push('\n');
    for (name, p) in &profiles {
        let calls = p.drain.calls as f64;
        out.push_str(&format!(
            "| {name} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            p.drain.calls,
            p.drain.seconds * 1000.0 / calls,
            p.drain.http_seconds * 1000.0 / calls,
            p.tick_ms,
            p.blob_ops
        ));
        for l in &labels {
            match p.statements.rows.iter().find(|(x, _, _)| x == l) {
                Some((_, c, ms)) => out.push_str(&format!(" {:.2} ({c}) |", ms / calls)),
                None => out.push_str(" - |"),
            }
        }
        out.push('\n');
    }
    out.push('\n');

    out.push_str("| WAL after the drain and one more tick |");
    for (name, _) in &profiles {
        out.push_str(&format!(" {name} |"));
    }
    for r in 2..=repeats.len() {
        out.push_str(&format!(" `proofWindowMs: 0`, repeat {r} |"));
    }
    let mut retained: Vec<&Retained> = profiles.iter().map(|(_, p)| &p.retained).collect();
    retained.extend(repeats.iter().skip(1).filter_map(|r| r.logical.as_ref()).map(|p| &p.retained));
    out.push_str("\n|---|");
    out.push_str(&"---:|".repeat(retained.len()));
    out.push('\n');
    let kb = |v: i64| format!("{:.1} kB", v as f64 / 1024.0);
    let rows: [(&str, RetainedField); 4] = [
        (
            "`confirmed_flush_lsn` − end of the load's last commit (≥ 0: the slot passed every delivered change)",
            |x| x.confirmed_past_load,
        ),
        ("`pg_current_wal_lsn()` − `confirmed_flush_lsn`", |x| x.behind_confirmed),
        ("`pg_current_wal_lsn()` − `restart_lsn` (what the server keeps for the slot)", |x| x.behind_restart),
        ("WAL written on the server since the load's last commit", |x| x.written_since_load),
    ];
    for (label, f) in rows {
        out.push_str(&format!("| {label} | {} |\n", retained.iter().map(|x| kb(f(x))).collect::<Vec<_>>().join(" | ")));
    }
    out.push('\n');

    out.push_str("Idle ticks (nothing changed in the table), HTTP round trip as the host sees it, and per tick the bytes the slot decoded (`pg_stat_replication_slots.total_bytes`) beside the WAL written meanwhile:\n\n| slot | ticks | WAL between the slot and the flush position | p50 ms | p95 ms | max ms | decoded per tick | WAL written per tick |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
    let idle_labels = [
        "`proofWindowMs: 0`, right after its drain",
        "shipped defaults, right after the drain (within the proof window)",
        "`proofWindowMs: 0`, after another database's load (the cursor's)",
    ];
    for (label, (took, behind, (decoded, written))) in idle_labels.iter().zip(idles) {
        out.push_str(&format!(
            "| {label} | {} | {:.1} MB | {:.2} | {:.2} | {:.2} | {:.0} B | {:.0} B |\n",
            took.len(),
            *behind as f64 / 1e6,
            percentile(took, 0.5),
            percentile(took, 0.95),
            percentile(took, 1.0),
            decoded,
            written
        ));
    }
    let met = |ok: bool| if ok { "met" } else { "missed" };
    let ratio = recv_rate / med(&logical);
    let default_ratio = default_window.map(|p| recv_rate / p.drain.per_second());
    let quiet = percentile(&idles[0].0, 0.5);
    let busy = percentile(&idles[2].0, 0.5);
    out.push_str(&format!(
        "\nGoals (issue 24): time per change within 1.5× of `pg_recvlogical` at batch {}: {ratio:.2}× with `proofWindowMs: 0` ({}), {} with the shipped defaults; the defaults' drain within 1.2× of the `0` drain: {}; idle tick p50 ≤ 3 ms right after a drain: {quiet:.2} ms ({}), after another database wrote: {busy:.2} ms ({}); no WAL kept before the last acknowledged batch: {}.\n",
        knobs.batch,
        met(ratio <= 1.5),
        default_ratio.map_or("-".into(), |r| format!("{r:.2}× ({})", met(r <= 1.5))),
        default_ratio.map_or("-".into(), |r| format!("{:.2}× ({})", r / ratio, met(r / ratio <= 1.2))),
        met(quiet <= 3.0),
        met(busy <= 3.0),
        if retained.iter().all(|x| x.confirmed_past_load >= 0) { "none kept (met)" } else { "some kept (see above)" }
    ));
    out
}
