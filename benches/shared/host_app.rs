//! What the host-model benchmarks share: real PostgreSQL and Azurite, and the template function
//! (`function-templates/PgOrdersChanged`) under this repository's host.json, run by the release `handler`
//! through the host model (`testbed::driver`).

use serde_json::{json, Value};
use std::future::Future;
use std::path::PathBuf;
use std::process::ExitCode;
use testbed::driver::{DriverOptions, HostDriver};
use testbed::embedded::{self, Azurite, EmbeddedPostgres, ScratchDir};

pub const FUNCTION: &str = "PgOrdersChanged";

pub type Result<T> = std::result::Result<T, String>;

#[derive(Debug)]
pub struct Servers {
    pub postgres: EmbeddedPostgres,
    pub azurite: Azurite,
}

impl Servers {
    pub async fn start() -> Result<Self> {
        tokio::task::spawn_blocking(|| -> Result<Servers> {
            Ok(Servers {
                postgres: EmbeddedPostgres::start().map_err(|e| e.to_string())?,
                azurite: Azurite::start().map_err(|e| e.to_string())?,
            })
        })
        .await
        .map_err(|e| e.to_string())?
    }
}

/// The app folder: this repository's host.json, the template's function.json with `retry_delay`.
fn app(dir: &ScratchDir, retry_delay: &str) -> Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let host = std::fs::read_to_string(root.join("host.json")).map_err(|e| e.to_string())?;
    std::fs::write(dir.path().join("host.json"), host).map_err(|e| e.to_string())?;
    let template = root.join("function-templates").join(FUNCTION).join("function.json");
    let mut function: Value =
        serde_json::from_slice(&std::fs::read(template).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    function["retry"]["delayInterval"] = json!(retry_delay);
    let folder = dir.path().join(FUNCTION);
    std::fs::create_dir_all(&folder).map_err(|e| e.to_string())?;
    std::fs::write(folder.join("function.json"), function.to_string()).map_err(|e| e.to_string())?;
    let trigger: Value = serde_json::from_str(testbed::demo::ORDERS_TRIGGER).map_err(|e| e.to_string())?;
    std::fs::write(folder.join("sqltrigger.json"), trigger.to_string()).map_err(|e| e.to_string())
}

/// A database `name` with the demo's orders table, and the release handler serving the template function on it
/// with blob state on Azurite, `settings` added to the app settings.
pub async fn start(
    servers: &Servers,
    name: &str,
    retry_delay: &str,
    settings: &[(&str, &str)],
) -> Result<(HostDriver, tokio_postgres::Client, ScratchDir)> {
    let url = embedded::create_database(&servers.postgres.url(), name).await.map_err(|e| e.to_string())?;
    let db = embedded::connect(&url).await.map_err(|e| e.to_string())?;
    db.batch_execute(testbed::demo::ORDERS_SCHEMA).await.map_err(|e| e.to_string())?;
    let dir = ScratchDir::new("host-bench").map_err(|e| e.to_string())?;
    app(&dir, retry_delay)?;
    let mut options = DriverOptions::new(dir.path(), handler()?);
    options.env = vec![
        ("PostgresConnectionString".into(), url),
        ("AzureWebJobsStorage".into(), servers.azurite.connection_string()),
        ("Sql_Trigger_AppName".into(), name.replace('_', "-")),
        ("Sql_Trigger_LogLevel".into(), "warn".into()),
    ];
    options.env.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let host = HostDriver::start(options).await.map_err(|e| e.to_string())?;
    Ok((host, db, dir))
}

/// An error mapper naming what failed: `.map_err(err("connecting"))`.
pub fn err<E: std::fmt::Display>(what: &'static str) -> impl FnOnce(E) -> String {
    move |e| format!("{what}: {e}")
}

/// A whole-number knob from the environment, `default` when unset.
pub fn number<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(t) => t.trim().parse().map_err(|_| format!("{name}={t:?} is not a whole number")),
        Err(_) => Ok(default),
    }
}

/// The release `handler` (or `SQL_PSEUDO_TRIGGER_HANDLER`), which must exist.
pub fn handler() -> Result<PathBuf> {
    let path = std::env::var_os("SQL_PSEUDO_TRIGGER_HANDLER")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/release/handler"), PathBuf::from);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("{} is missing: cargo build --release --bin handler", path.display()))
    }
}

/// Inserts orders `ids` in one statement.
pub async fn insert(db: &tokio_postgres::Client, ids: std::ops::RangeInclusive<i64>) -> Result<()> {
    let ids: Vec<i64> = ids.collect();
    db.execute(
        "INSERT INTO orders (id, customer, amount) SELECT i, 'c' || i, i FROM unnest($1::bigint[]) AS i",
        &[&ids],
    )
    .await
    .map(|_| ())
    .map_err(|e| e.to_string())
}

/// A benchmark's `main`: runs `run` and prints its table when invoked with `--bench`; `cargo test --all-targets`
/// runs bench binaries without it, and then nothing is done.
pub fn bench_main<F: Future<Output = Result<String>>>(name: &str, run: impl FnOnce() -> F) -> ExitCode {
    if !std::env::args().any(|a| a == "--bench") {
        return ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{name}: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(table) => {
            println!("{table}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
