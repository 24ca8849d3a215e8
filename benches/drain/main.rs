//! `cargo bench --bench drain` (run it with `scripts/bench`): the engine's benchmarks, measured side by side in
//! one run on one PostgreSQL and one Azurite, printed as a table and recorded in docs/benchmarks.md.
//!
//! What is measured, and against what:
//! - draining 100k changed rows (10 per transaction, so the xid8 cursor repeats every 10 rows) at batch 100 and
//!   1000 three ways: the real `handler` binary played by the [`HostDriver`] with blob state on Azurite
//!   (`ours`); the bare keyset query loop it is built on (`raw`, the limit); and the peer, azure-functions-db
//!   0.8.3's `PollRunner` + `BlobCheckpointStore` in a Python subprocess (`peer`). Every drain checks the exact
//!   id set: no loss, no duplicate;
//! - blob operations per tick and empty-tick latency, from the handler's own `tick finished` log lines;
//! - the source's fetch at 10 % and 90 % of a 1M-row table, which shows whether catch-up is linear;
//! - where the time goes: CPU per process around every drain (`cpu`), the driver's share of an invocation, and
//!   one drain by a handler started with `RUST_BACKTRACE=1`.
//!
//! Why a `harness = false` binary and not criterion: the quantities are throughput of whole drains and latency
//! distributions of a child process, not nanosecond loops, and the peer is a Python program.
//! `cargo test --all-targets` runs this binary without `--bench`; it then does nothing.
//!
//! [`HostDriver`]: testbed::driver::HostDriver

#[path = "../chart.rs"]
mod chart;
mod cpu;
mod ours;
mod peer;
mod positions;
mod raw;
mod report;
mod setup;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;
use testbed::driver::{DriverOptions, HostDriver};

/// Errors of a benchmark run are messages for the person running it.
type BenchResult<T> = Result<T, String>;

/// Wraps an error with what was being done.
fn context<E: std::fmt::Display>(what: impl Into<String>) -> impl FnOnce(E) -> String {
    let what = what.into();
    move |e| format!("{what}: {e}")
}

/// Knobs, from the environment (scripts/bench sets the paths).
#[derive(Debug, Clone)]
pub struct Options {
    /// Rows of the drain table (ids 1..=rows).
    pub rows: u64,
    /// Rows per inserting transaction: rows sharing one cursor value.
    pub rows_per_transaction: u64,
    /// Rows of the table whose fetch is timed at 10 % and 90 %.
    pub big_rows: u64,
    pub batches: Vec<usize>,
    /// Drains of ours and raw per batch size; the median is reported. The peer drains once (it is slow).
    pub repeats: usize,
    pub empty_ticks: usize,
    pub fetch_samples: usize,
    pub handler: PathBuf,
    pub python: PathBuf,
    pub peer_script: PathBuf,
    pub skip_peer: bool,
    /// Where the results go; `None` prints only.
    pub doc: Option<PathBuf>,
    pub manifest_dir: PathBuf,
}

impl Options {
    fn from_env() -> BenchResult<Self> {
        let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let target_dir =
            std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| manifest_dir.join("target"), PathBuf::from);
        let number = |name: &str, default: u64| -> BenchResult<u64> {
            match std::env::var(name) {
                Ok(text) => text.trim().parse().map_err(|_| format!("{name}={text:?} is not a whole number")),
                Err(_) => Ok(default),
            }
        };
        let path = |name: &str, default: PathBuf| std::env::var_os(name).map_or(default, PathBuf::from);
        let batches = match std::env::var("BENCH_BATCHES") {
            Ok(text) => text
                .split(',')
                .map(|b| b.trim().parse::<usize>().map_err(|_| format!("BENCH_BATCHES={text:?}: use e.g. 100,1000")))
                .collect::<BenchResult<Vec<_>>>()?,
            Err(_) => vec![100, 1000],
        };
        let doc = match std::env::var("BENCH_DOC") {
            Ok(text) if text.is_empty() || text == "0" || text == "none" => None,
            Ok(text) => Some(PathBuf::from(text)),
            Err(_) => Some(manifest_dir.join("docs").join("benchmarks.md")),
        };
        Ok(Self {
            rows: number("BENCH_ROWS", 100_000)?,
            rows_per_transaction: number("BENCH_ROWS_PER_TRANSACTION", 10)?.max(1),
            big_rows: number("BENCH_BIG_ROWS", 1_000_000)?,
            batches,
            repeats: number("BENCH_REPEATS", 3)?.max(1) as usize,
            empty_ticks: number("BENCH_EMPTY_TICKS", 500)? as usize,
            fetch_samples: number("BENCH_FETCH_SAMPLES", 200)?.max(1) as usize,
            handler: path("SQL_PSEUDO_TRIGGER_HANDLER", target_dir.join("release").join("handler")),
            python: path("BENCH_PYTHON", target_dir.join("bench-venv").join("bin").join("python")),
            peer_script: manifest_dir.join("benches").join("peer").join("drain_peer.py"),
            skip_peer: std::env::var("BENCH_SKIP_PEER").is_ok_and(|v| v == "1"),
            doc,
            manifest_dir,
        })
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // The part of libtest's protocol that test runners use: `--list` lists no tests, and a run without `--bench`
    // (`cargo test --all-targets`) is not a benchmark run.
    if args.iter().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    if !args.iter().any(|a| a == "--bench") {
        eprintln!("drain: a benchmark, not a test; skipped (run scripts/bench)");
        return ExitCode::SUCCESS;
    }
    let started = Instant::now();
    match run() {
        Ok(()) => {
            eprintln!("drain: finished in {:.0} s", started.elapsed().as_secs_f64());
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("drain: error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> BenchResult<()> {
    let options = Options::from_env()?;
    if !options.handler.is_file() {
        return Err(format!(
            "the handler binary {} does not exist; build it with `cargo build --release --bin handler` or run \
             scripts/bench, or point SQL_PSEUDO_TRIGGER_HANDLER at it",
            options.handler.display()
        ));
    }
    if !options.skip_peer && !options.python.is_file() {
        return Err(format!(
            "{} does not exist: scripts/bench makes the peer's venv there (or set BENCH_PYTHON, or BENCH_SKIP_PEER=1)",
            options.python.display()
        ));
    }
    let servers = setup::Servers::start()?;
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(context("tokio runtime"))?;
    let results = runtime.block_on(measure(&options, &servers))?;
    report::print(&results);
    if let Some(doc) = &options.doc {
        report::write_doc(doc, &results)?;
        eprintln!("drain: results written to {}", doc.display());
        let svg = doc.with_file_name(report::CHART);
        std::fs::write(&svg, results.chart()).map_err(context(format!("writing {}", svg.display())))?;
        eprintln!("drain: chart written to {}", svg.display());
    }
    Ok(())
}

/// The whole run, in an order that keeps the comparisons fair: the drain table is loaded and walked once before
/// anything is timed (hint bits, buffers), and ours and raw alternate so that background noise hits both.
async fn measure(options: &Options, servers: &setup::Servers) -> BenchResult<report::Results> {
    let mut results = report::Results::new(options, servers);
    results.load_before = loadavg();
    let (url, load_seconds) =
        setup::orders_database(servers, "bench_drain", options.rows, options.rows_per_transaction).await?;
    results.load_seconds = load_seconds;
    let client = testbed::embedded::connect(&url).await.map_err(context("connecting"))?;
    raw::drain(&client, 1000, options.rows).await?.verdict.map_err(context("warm-up walk"))?;

    let functions: Vec<setup::FunctionFolder> = options
        .batches
        .iter()
        .flat_map(|&batch| {
            (1..=options.repeats).map(move |repeat| setup::FunctionFolder {
                name: format!("DrainB{batch}R{repeat}"),
                connection_setting: "Pg",
                max_batch_size: batch,
            })
        })
        .collect();
    let check = setup::FunctionFolder { name: "StatementCheck".into(), connection_setting: "Pg", max_batch_size: 100 };
    // Drained once by a second handler started with RUST_BACKTRACE=1, to show what that setting costs.
    let backtraces = setup::FunctionFolder {
        name: "BacktraceOn".into(),
        connection_setting: "Pg",
        max_batch_size: options.batches[0],
    };
    let app = setup::AppFolder::write(options, &[functions.as_slice(), &[check.clone(), backtraces.clone()]].concat())?;
    let mut env = setup::AppFolder::base_settings();
    env.extend([
        ("Pg".to_string(), url.clone()),
        ("AzureWebJobsStorage".to_string(), servers.azurite.connection_string()),
        ("Sql_Trigger_StateStore".to_string(), "blob".to_string()),
        // The level the product ships with (Sql_Trigger_LogLevel's default), whatever this shell has.
        ("RUST_LOG".to_string(), "info".to_string()),
        // As in production, where nothing sets it; this shell may (RUST_BACKTRACE=1 is common on dev machines,
        // and it makes the blob store slower: see the environment table).
        ("RUST_BACKTRACE".to_string(), "0".to_string()),
    ]);
    let mut driver_options = DriverOptions::new(app.root(), &options.handler);
    driver_options.env = env.clone();
    let driver = HostDriver::start(driver_options).await.map_err(context("starting the handler"))?;
    results.handler_ready = driver.ready_after();
    let watch =
        cpu::Watch { handler: driver.pid(), azurite: servers.azurite.pid(), postmaster: servers.postgres.pid() };

    results.statements = raw::verify_statements(&driver, &client, &check.name).await?;
    if let Err(problem) = &results.statements {
        eprintln!("drain: warning: {problem}");
    }

    for &batch in &options.batches {
        let mut row = report::BatchRow { batch, ours: Vec::new(), raw: Vec::new(), peer: None };
        for repeat in 1..=options.repeats {
            let function = format!("DrainB{batch}R{repeat}");
            let (ours, cpu) = cpu::measure(watch, ours::drain(&driver, &function, options.rows)).await;
            let ours = ours::Drain { cpu, ..ours? };
            eprintln!("drain: ours  b{batch} #{repeat}: {:>9.0} rows/s", ours.rows_per_second());
            row.ours.push(ours);
            let (raw, cpu) = cpu::measure(watch, raw::drain(&client, batch, options.rows)).await;
            let raw = ours::Drain { cpu, ..raw? };
            eprintln!("drain: raw   b{batch} #{repeat}: {:>9.0} rows/s", raw.rows_per_second());
            row.raw.push(raw);
        }
        if !options.skip_peer {
            let azurite = servers.azurite.connection_string();
            let run = async { peer::drain(options, &url, &azurite, batch, options.rows) };
            let (peer, around) = cpu::measure(watch, run).await;
            let mut peer = peer?;
            // The bench process only waits meanwhile; the peer's own CPU comes from the script.
            peer.drain.cpu.extend(around.into_iter().filter(|(role, _)| *role != cpu::Role::Bench));
            eprintln!("drain: peer  b{batch}:    {:>9.0} rows/s", peer.drain.rows_per_second());
            row.peer = Some(peer);
        }
        results.drains.push(row);
    }

    let idle = format!("DrainB{}R1", options.batches[0]);
    results.empty_latency = ours::empty_ticks(&driver, &idle, options.empty_ticks).await?;
    let lines = ours::tick_lines(&driver.output());
    results.profiles = functions.iter().map(|f| ours::TickProfile::of(&lines, &f.name)).collect();
    results.idle_function = idle;
    drop(driver);

    let mut traced_options = DriverOptions::new(app.root(), &options.handler);
    traced_options.env = env.into_iter().filter(|(name, _)| name != "RUST_BACKTRACE").collect();
    traced_options.env.push(("RUST_BACKTRACE".into(), "1".into()));
    let traced = HostDriver::start(traced_options).await.map_err(context("starting the handler"))?;
    let watch = cpu::Watch { handler: traced.pid(), ..watch };
    let (drain, cpu) = cpu::measure(watch, ours::drain(&traced, &backtraces.name, options.rows)).await;
    let drain = ours::Drain { cpu, ..drain? };
    eprintln!("drain: ours  b{} RUST_BACKTRACE=1: {:>9.0} rows/s", backtraces.max_batch_size, drain.rows_per_second());
    results.backtraces = Some((backtraces.max_batch_size, drain));
    drop(traced);

    let (big_url, big_load) =
        setup::orders_database(servers, "bench_big", options.big_rows, options.rows_per_transaction).await?;
    results.big_load_seconds = big_load;
    results.positions = Some(positions::measure(options, &big_url, options.batches[0]).await?);
    results.load_after = loadavg();
    Ok(results)
}

/// `/proc/loadavg`'s 1, 5 and 15 minute averages: how busy the machine was around the run.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
