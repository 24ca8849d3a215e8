//! `cargo bench --bench upsert` (or `scripts/bench upsert`): the PostgreSQL upsert sink, measured side by side
//! in one run on one PostgreSQL, printed as a Markdown table and written, with a chart, into docs/benchmarks.md
//! ("Sink", between the `bench:upsert` markers) and docs/benchmarks-upsert.svg.
//!
//! The same 100k changed rows (`public.orders`, 10 rows per transaction, as in the drain bench) are upserted
//! into `public.orders_copy`, which already holds every id with stale values (so every row is a real update),
//! three ways:
//! - **ours**: the real release `handler`, `handler run --once` with `deliveryMode: sink` and a postgres sink,
//!   file state, timed end to end from process start to exit: fetch from the source, the state's two writes
//!   per batch, the sink's fence and upsert statements, one transaction per batch;
//! - **raw**: one `INSERT INTO orders_copy SELECT ... FROM orders ON CONFLICT (id) DO UPDATE` inside the
//!   server, the limit of any client;
//! - **peer**: azure-functions-db 0.8.3's output binding `DbWriter.upsert_many(rows, conflict_columns=["id"])`,
//!   one call per batch, rows read before its clock starts (its best case), in benches/peer/upsert_peer.py.
//!
//! Every contender is checked: afterwards the copy must equal the source on every row.
//!
//! Knobs: BENCH_UPSERT_ROWS (100000), BENCH_UPSERT_BATCHES (1000,5000,10000; ours), BENCH_UPSERT_PEER_BATCH (1000),
//! BENCH_REPEATS (3; ours and raw, median reported), BENCH_SKIP_PEER=1, SQL_PSEUDO_TRIGGER_HANDLER,
//! BENCH_PYTHON (scripts/bench sets both), BENCH_UPSERT_LOG (a log filter for ours, whose log is then printed),
//! BENCH_DOC (the document to write; `0` writes nothing). `cargo test --all-targets` runs this binary without
//! `--bench`; it then does nothing.

#[path = "chart.rs"]
mod chart;

use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::Instant;
use testbed::embedded::{self, EmbeddedPostgres, ScratchDir};

type BenchResult<T> = Result<T, String>;

fn context<E: std::fmt::Display>(what: impl Into<String>) -> impl FnOnce(E) -> String {
    let what = what.into();
    move |e| format!("{what}: {e}")
}

#[derive(Debug)]
struct Options {
    rows: u64,
    batches: Vec<usize>,
    peer_batch: usize,
    repeats: usize,
    handler: PathBuf,
    python: PathBuf,
    peer_script: PathBuf,
    skip_peer: bool,
    /// Where the results go (the chart beside it); `None` with BENCH_DOC=0.
    doc: Option<PathBuf>,
}

impl Options {
    fn from_env() -> BenchResult<Self> {
        let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| manifest.join("target"), PathBuf::from);
        let number = |name: &str, default: u64| -> BenchResult<u64> {
            std::env::var(name)
                .map_or(Ok(default), |t| t.trim().parse().map_err(|_| format!("{name}={t:?} is not a number")))
        };
        let batches = std::env::var("BENCH_UPSERT_BATCHES")
            .unwrap_or_else(|_| "1000,5000,10000".into())
            .split(',')
            .map(|b| b.trim().parse::<usize>().map_err(|_| format!("BENCH_UPSERT_BATCHES: {b:?} is not a number")))
            .collect::<BenchResult<Vec<_>>>()?;
        let path = |name: &str, default: PathBuf| std::env::var_os(name).map_or(default, PathBuf::from);
        Ok(Self {
            rows: number("BENCH_UPSERT_ROWS", 100_000)?,
            batches,
            peer_batch: number("BENCH_UPSERT_PEER_BATCH", 1000)? as usize,
            repeats: number("BENCH_REPEATS", 3)?.max(1) as usize,
            handler: path("SQL_PSEUDO_TRIGGER_HANDLER", target.join("release").join("handler")),
            python: path("BENCH_PYTHON", target.join("bench-venv").join("bin").join("python")),
            peer_script: manifest.join("benches").join("peer").join("upsert_peer.py"),
            skip_peer: std::env::var("BENCH_SKIP_PEER").is_ok_and(|v| v == "1"),
            doc: match std::env::var_os("BENCH_DOC") {
                Some(v) if v == "0" => None,
                Some(v) => Some(PathBuf::from(v)),
                None => Some(manifest.join("docs").join("benchmarks.md")),
            },
        })
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    if !args.iter().any(|a| a == "--bench") {
        eprintln!("upsert: a benchmark, not a test; skipped (run scripts/bench --bench upsert)");
        return ExitCode::SUCCESS;
    }
    let result = Options::from_env().and_then(|options| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(context("runtime"))?;
        runtime.block_on(run(&options))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("upsert: error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// One timed upsert of all rows.
#[derive(Debug, Clone, Copy)]
struct Timing {
    seconds: f64,
    /// Ours: the same command on the drained state (start-up, connections, one empty tick, exit); 0 for others.
    startup_seconds: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

async fn run(options: &Options) -> BenchResult<()> {
    let load_before = loadavg();
    if !options.handler.is_file() {
        return Err(format!(
            "{} does not exist; run `cargo build --release --bin handler` (scripts/bench does) or set SQL_PSEUDO_TRIGGER_HANDLER",
            options.handler.display()
        ));
    }
    let postgres = tokio::task::spawn_blocking(EmbeddedPostgres::start)
        .await
        .map_err(context("join"))?
        .map_err(context("starting PostgreSQL"))?;
    eprintln!("upsert: {} on port {}", postgres.version(), postgres.port());
    let url =
        embedded::create_database(&postgres.url(), "bench_upsert").await.map_err(context("creating a database"))?;
    let db = embedded::connect(&url).await.map_err(context("connecting"))?;
    load(&db, options.rows).await?;

    let mut ours: Vec<(usize, Vec<Timing>)> = options.batches.iter().map(|&b| (b, Vec::new())).collect();
    let mut raw = Vec::new();
    for repeat in 1..=options.repeats {
        for (batch, timings) in ours.iter_mut() {
            reset_copy(&db, options.rows).await?;
            let t = run_ours(options, &url, *batch)?;
            verify(&db, options.rows, &format!("ours b{batch}")).await?;
            eprintln!(
                "upsert: ours b{batch} #{repeat}: {:>9.0} rows/s ({:.3} s, of which {:.3} s start-up)",
                options.rows as f64 / t.seconds,
                t.seconds,
                t.startup_seconds
            );
            timings.push(t);
        }
        reset_copy(&db, options.rows).await?;
        let t = run_raw(&db).await?;
        verify(&db, options.rows, "raw").await?;
        eprintln!("upsert: raw #{repeat}: {:>9.0} rows/s", options.rows as f64 / t.seconds);
        raw.push(t.seconds);
    }
    let peer = if options.skip_peer {
        None
    } else {
        reset_copy(&db, options.rows).await?;
        let (t, version) = run_peer(options, &url)?;
        verify(&db, options.rows, "peer").await?;
        eprintln!("upsert: peer b{}: {:>9.0} rows/s", options.peer_batch, options.rows as f64 / t.seconds);
        Some((t, version))
    };

    let rate = |s: f64| options.rows as f64 / s;
    let raw_s = median(raw);
    let ours_startups: Vec<f64> = ours.iter().flat_map(|(_, t)| t.iter().map(|t| t.startup_seconds)).collect();
    // (batch, median seconds, median seconds without the start-up measured right after each drain)
    let ours: Vec<(usize, f64, f64)> = ours
        .into_iter()
        .map(|(batch, t)| {
            let whole = median(t.iter().map(|t| t.seconds).collect());
            (batch, whole, median(t.iter().map(|t| t.seconds - t.startup_seconds).collect()))
        })
        .collect();
    let startup_ms = 1000.0 * median(ours_startups);
    let mut table = String::new();
    let _ = writeln!(
        table,
        "Run of {} on {} CPU(s) (load average {load_before} before, {} after); {}.\n",
        time::OffsetDateTime::now_utc().date(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
        postgres.version()
    );
    let _ = writeln!(table, "| contender | batch | seconds | rows/s | vs peer | this / raw (time) | without start-up¹: rows/s | without start-up¹: this / raw |");
    let _ = writeln!(table, "|---|---:|---:|---:|---:|---:|---:|---:|");
    let peer_rate = peer.as_ref().map(|(t, _)| rate(t.seconds));
    for (batch, s, net) in &ours {
        let vs_peer = peer_rate.map_or("-".into(), |p| format!("{:.1}×", rate(*s) / p));
        let _ = writeln!(
            table,
            "| ours (`handler run --once`, sink mode) | {batch} | {s:.3} | {:.0} | {vs_peer} | {:.2}× | {:.0} | {:.2}× |",
            rate(*s),
            s / raw_s,
            rate(*net),
            net / raw_s
        );
    }
    let _ = writeln!(
        table,
        "| raw `INSERT ... SELECT ... ON CONFLICT` (one statement) | all | {raw_s:.3} | {:.0} | - | 1.00× | | |",
        rate(raw_s)
    );
    if let Some((t, version)) = &peer {
        let _ = writeln!(
            table,
            "| peer azure-functions-db {version} `upsert_many` | {} | {:.3} | {:.0} | 1.0× | {:.2}× | | |",
            options.peer_batch,
            t.seconds,
            rate(t.seconds),
            t.seconds / raw_s
        );
    }
    let _ = writeln!(
        table,
        "\n{} rows, {} per transaction in the source; ours and raw: median of {} runs; peer: one run, its rows read before its clock starts. Every run checked: afterwards the copy equals the source on every row.\n\n¹ Ours is timed from process start to exit. Right after each drain the same command runs again on the drained state (start-up, connections, catalog, one empty tick, exit: {:.0} ms median); \"without start-up\" subtracts it, which is what the peer's and raw's clocks leave out.\n\n![Upsert throughput, rows per second]({CHART})",
        options.rows,
        ROWS_PER_TRANSACTION,
        options.repeats,
        startup_ms,
    );
    println!("\n{table}");

    if let Some(doc) = &options.doc {
        use chart::{horizontal_bars, Bar, Contender, Group};
        let mut bars: Vec<Bar> = ours
            .iter()
            .map(|(batch, s, _)| Bar { label: format!("ours, batch {batch}"), value: rate(*s), who: Contender::Ours })
            .collect();
        bars.push(Bar { label: "raw INSERT ... ON CONFLICT (limit)".into(), value: rate(raw_s), who: Contender::Raw });
        if let Some((t, version)) = &peer {
            let label = format!("peer {version} upsert_many, batch {}", options.peer_batch);
            bars.push(Bar { label, value: rate(t.seconds), who: Contender::Peer });
        }
        let groups = [Group { heading: "one transaction per batch (ours, peer); one statement (raw)".into(), bars }];
        let svg = horizontal_bars(
            &format!("Upsert of {} changed rows into PostgreSQL: rows per second", options.rows),
            "cargo bench --bench upsert; ours and raw: median of the runs; every run checked row by row",
            &groups,
            |v| format!("{v:.0} rows/s"),
        );
        let path = doc.with_file_name(CHART);
        std::fs::write(&path, svg).map_err(context(format!("writing {}", path.display())))?;
        write_block(doc, &table)?;
        eprintln!("upsert: results written to {} and {}", doc.display(), path.display());
    }
    Ok(())
}

const BEGIN: &str = "<!-- bench:upsert:begin (written by `scripts/bench upsert`; edits inside are overwritten) -->";
const END: &str = "<!-- bench:upsert:end -->";
const CHART: &str = "benchmarks-upsert.svg";

/// Replaces the text between the markers in `doc`, or appends the block when the markers are missing.
fn write_block(doc: &std::path::Path, text: &str) -> BenchResult<()> {
    let block = format!("{BEGIN}\n{text}\n{END}");
    let current = std::fs::read_to_string(doc).unwrap_or_default();
    let updated = match (current.find(BEGIN), current.find(END)) {
        (Some(begin), Some(end)) if begin < end => {
            format!("{}{block}{}", &current[..begin], &current[end + END.len()..])
        }
        _ => format!("{}\n\n{block}\n", current.trim_end()),
    };
    std::fs::write(doc, updated).map_err(context(format!("writing {}", doc.display())))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

const ROWS_PER_TRANSACTION: u64 = 10;

/// The source (the drain bench's table shape) and the copy.
async fn load(db: &tokio_postgres::Client, rows: u64) -> BenchResult<()> {
    db.batch_execute(
        "CREATE TABLE public.orders (
            id bigint PRIMARY KEY, customer text, amount numeric(12,2),
            created_version xid8 NOT NULL DEFAULT pg_current_xact_id(),
            version xid8 NOT NULL DEFAULT pg_current_xact_id(),
            deleted boolean NOT NULL DEFAULT false);
         CREATE INDEX ON public.orders (version, id);
         CREATE TABLE public.orders_copy (id bigint PRIMARY KEY, customer text, amount numeric(12,2));
         CREATE PROCEDURE load_orders(total bigint, per_tx bigint) LANGUAGE plpgsql AS $$
         DECLARE first bigint := 1;
         BEGIN
           WHILE first <= total LOOP
             INSERT INTO public.orders (id, customer, amount)
               SELECT g, 'customer-' || (g % 1000), (g % 100000) / 100.0
               FROM generate_series(first, least(first + per_tx - 1, total)) g;
             COMMIT;
             first := first + per_tx;
           END LOOP;
         END $$;",
    )
    .await
    .map_err(context("creating the tables"))?;
    let started = Instant::now();
    let total = i64::try_from(rows).map_err(context("rows"))?;
    db.execute("CALL load_orders($1, $2)", &[&total, &(ROWS_PER_TRANSACTION as i64)])
        .await
        .map_err(context("loading"))?;
    db.batch_execute("VACUUM (ANALYZE) public.orders").await.map_err(context("VACUUM"))?;
    eprintln!("upsert: loaded {rows} rows in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Every id in the copy, with stale values: each contender's upserts are updates.
async fn reset_copy(db: &tokio_postgres::Client, rows: u64) -> BenchResult<()> {
    let total = i64::try_from(rows).map_err(context("rows"))?;
    db.batch_execute("TRUNCATE public.orders_copy").await.map_err(context("TRUNCATE"))?;
    db.execute("INSERT INTO public.orders_copy SELECT g, 'stale', 0 FROM generate_series(1, $1::bigint) g", &[&total])
        .await
        .map_err(context("seeding the copy"))?;
    db.batch_execute("VACUUM (ANALYZE) public.orders_copy").await.map_err(context("VACUUM"))?;
    db.batch_execute("CHECKPOINT").await.map_err(context("CHECKPOINT"))
}

/// The copy equals the source on every row.
async fn verify(db: &tokio_postgres::Client, rows: u64, who: &str) -> BenchResult<()> {
    let same: i64 = db
        .query_one(
            "SELECT count(*) FROM public.orders o JOIN public.orders_copy c USING (id) \
             WHERE c.customer = o.customer AND c.amount = o.amount",
            &[],
        )
        .await
        .map_err(context("checking the copy"))?
        .get(0);
    if same as u64 != rows {
        return Err(format!("{who}: only {same} of {rows} rows of the copy match the source"));
    }
    Ok(())
}

async fn run_raw(db: &tokio_postgres::Client) -> BenchResult<Timing> {
    let started = Instant::now();
    db.execute(
        "INSERT INTO public.orders_copy (id, customer, amount) SELECT id, customer, amount FROM public.orders \
         ON CONFLICT (id) DO UPDATE SET customer = EXCLUDED.customer, amount = EXCLUDED.amount",
        &[],
    )
    .await
    .map_err(context("the raw upsert"))?;
    Ok(Timing { seconds: started.elapsed().as_secs_f64(), startup_seconds: 0.0 })
}

/// `handler run --once` on a fresh app folder (so it starts from the beginning), timed from spawn to exit.
fn run_ours(options: &Options, url: &str, batch: usize) -> BenchResult<Timing> {
    let dir = ScratchDir::new("bench-upsert").map_err(context("app folder"))?;
    let root = dir.path();
    let write = |path: PathBuf, value: &Value| {
        std::fs::write(&path, serde_json::to_vec_pretty(value).unwrap_or_default())
            .map_err(context(format!("writing {}", path.display())))
    };
    write(root.join("host.json"), &json!({"version": "2.0"}))?;
    let folder = root.join("Mirror");
    std::fs::create_dir_all(&folder).map_err(context("function folder"))?;
    write(
        folder.join("function.json"),
        &json!({"bindings": [{"type": "timerTrigger", "direction": "in", "name": "timer", "schedule": "0 */5 * * * *"}]}),
    )?;
    write(
        folder.join("sqltrigger.json"),
        &json!({
            "source": "postgres-cursor", "tableName": "public.orders", "connectionStringSetting": "Pg",
            "cursorColumn": "version", "insertedColumn": "created_version", "softDeleteColumn": "deleted",
            "columns": ["id", "customer", "amount"], "maxBatchSize": batch, "deliveryMode": "sink",
            "sink": {"type": "postgres", "tableName": "public.orders_copy", "connectionStringSetting": "Pg"}
        }),
    )?;
    let run = || {
        let mut command = Command::new(&options.handler);
        command
            .args(["run", "--once", "--app-root"])
            .arg(root)
            .env("Pg", url)
            .env("Sql_Trigger_StateStore", "file")
            // As in production, where nothing sets it (this shell may; see docs/benchmarks.md on what it costs).
            .env("RUST_BACKTRACE", "0")
            .env("RUST_LOG", std::env::var("BENCH_UPSERT_LOG").unwrap_or_else(|_| "warn".into()));
        let started = Instant::now();
        let output = command.output().map_err(context("running the handler"))?;
        let seconds = started.elapsed().as_secs_f64();
        if std::env::var_os("BENCH_UPSERT_LOG").is_some() {
            eprint!("{}", String::from_utf8_lossy(&output.stderr));
        }
        if !output.status.success() {
            return Err(format!("handler run failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr)));
        }
        Ok(seconds)
    };
    let seconds = run()?;
    // The same command again on the drained state: process start, configuration, connections, catalog
    // discovery, one empty tick and exit. What the drain cost beyond that is the delivery itself.
    let startup_seconds = run()?;
    Ok(Timing { seconds, startup_seconds })
}

fn run_peer(options: &Options, url: &str) -> BenchResult<(Timing, String)> {
    let output = Command::new(&options.python)
        .arg(&options.peer_script)
        .args(["--pg-url", url, "--source", "public.orders", "--target", "public.orders_copy"])
        .args(["--batch", &options.peer_batch.to_string()])
        .output()
        .map_err(context(format!(
            "running {} (scripts/bench makes the venv; or BENCH_SKIP_PEER=1)",
            options.python.display()
        )))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "the peer failed ({}): {stdout}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or_default();
    let result: Value = serde_json::from_str(line).map_err(context(format!("the peer's output {stdout:?}")))?;
    let seconds = result["seconds"].as_f64().ok_or_else(|| format!("no seconds in {line}"))?;
    Ok((Timing { seconds, startup_seconds: 0.0 }, result["version"].as_str().unwrap_or("unknown").to_string()))
}
