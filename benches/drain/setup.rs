//! The servers, the tables and the app folder every measurement shares.
//!
//! One table shape serves all three contenders: ours reads the xid8 `version` cursor (below the oldest running
//! transaction), the peer reads `changed_at`, a `timestamptz` set to `now()` (the transaction's start), which
//! it supports; both have a `(cursor, id)` index. Rows are inserted `rows_per_transaction` at a time by a
//! procedure that commits after each group, so every cursor value is shared by that many rows, as the issue asks.

use crate::{context, BenchResult, Options};
use serde_json::{json, Value};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;
use testbed::embedded::{self, Azurite, EmbeddedPostgres, ScratchDir};

/// The function folder's template: function.json is copied from it, as a user would.
const TEMPLATE: &str = "function-templates/PgOrdersChanged";
/// The app setting the template's timer schedule names.
const SCHEDULE_SETTING: &str = "PgOrdersChanged_Schedule";

/// One PostgreSQL and one Azurite for the whole run.
#[derive(Debug)]
pub struct Servers {
    pub postgres: EmbeddedPostgres,
    pub azurite: Azurite,
}

impl Servers {
    pub fn start() -> BenchResult<Self> {
        let postgres = EmbeddedPostgres::start().map_err(context("starting PostgreSQL"))?;
        let azurite = Azurite::start().map_err(context("starting Azurite"))?;
        eprintln!("drain: {} on port {}, Azurite on {}", postgres.version(), postgres.port(), azurite.blob_endpoint());
        Ok(Self { postgres, azurite })
    }
}

/// Creates database `name` with table `public.orders` holding ids `1..=rows`; returns its URL and the load time.
pub async fn orders_database(
    servers: &Servers,
    name: &str,
    rows: u64,
    per_transaction: u64,
) -> BenchResult<(String, f64)> {
    let url = embedded::create_database(&servers.postgres.url(), name).await.map_err(context("creating a database"))?;
    let client = embedded::connect(&url).await.map_err(context(format!("connecting to {url}")))?;
    client
        .batch_execute(
            "CREATE TABLE public.orders (
                id bigint PRIMARY KEY,
                customer text,
                amount numeric(12,2),
                created_version xid8 NOT NULL DEFAULT pg_current_xact_id(),
                version xid8 NOT NULL DEFAULT pg_current_xact_id(),
                deleted boolean NOT NULL DEFAULT false,
                changed_at timestamptz NOT NULL DEFAULT now());
             CREATE INDEX ON public.orders (version, id);
             CREATE INDEX ON public.orders (changed_at, id);
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
        .map_err(context("creating public.orders"))?;
    let started = Instant::now();
    let total = i64::try_from(rows).map_err(context("row count"))?;
    let per_tx = i64::try_from(per_transaction).map_err(context("rows per transaction"))?;
    client.execute("CALL load_orders($1, $2)", &[&total, &per_tx]).await.map_err(context("loading public.orders"))?;
    // Fresh statistics, a visibility map and set hint bits, so that no contender pays for the load's leftovers
    // and autovacuum does not start in the middle of a measurement.
    client.batch_execute("VACUUM (ANALYZE) public.orders").await.map_err(context("VACUUM public.orders"))?;
    let seconds = started.elapsed().as_secs_f64();
    eprintln!("drain: loaded {rows} rows into {name} ({per_transaction} per transaction) in {seconds:.1} s");
    Ok((url, seconds))
}

/// One function folder to write.
#[derive(Debug, Clone)]
pub struct FunctionFolder {
    pub name: String,
    pub connection_setting: &'static str,
    pub max_batch_size: usize,
}

/// An app folder: the repository's host.json, and per function the template's function.json and a
/// sqltrigger.json for `public.orders`. Removed when dropped.
#[derive(Debug)]
pub struct AppFolder {
    dir: ScratchDir,
}

impl AppFolder {
    pub fn write(options: &Options, functions: &[FunctionFolder]) -> BenchResult<Self> {
        let dir = ScratchDir::new("bench").map_err(context("creating the app folder"))?;
        let root = dir.path();
        copy(&options.manifest_dir.join("host.json"), &root.join("host.json"))?;
        let function_json = options.manifest_dir.join(TEMPLATE).join("function.json");
        for f in functions {
            let folder = root.join(&f.name);
            fs::create_dir_all(&folder).map_err(context(format!("creating {}", folder.display())))?;
            copy(&function_json, &folder.join("function.json"))?;
            let trigger = json!({
                "source": "postgres-cursor",
                "tableName": "public.orders",
                "connectionStringSetting": f.connection_setting,
                "cursorColumn": "version",
                "insertedColumn": "created_version",
                "softDeleteColumn": "deleted",
                "maxBatchSize": f.max_batch_size,
            });
            write_json(&folder.join("sqltrigger.json"), &trigger)?;
        }
        Ok(Self { dir })
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// App settings the template needs besides the connection strings.
    pub fn base_settings() -> Vec<(String, String)> {
        vec![(SCHEDULE_SETTING.to_string(), "0 */5 * * * *".to_string())]
    }
}

fn copy(from: &Path, to: &Path) -> BenchResult<()> {
    fs::copy(from, to).map(|_| ()).map_err(context(format!("copying {} to {}", from.display(), to.display())))
}

fn write_json(path: &Path, value: &Value) -> BenchResult<()> {
    let text = serde_json::to_string_pretty(value).map_err(context("encoding JSON"))?;
    fs::write(path, text).map_err(context(format!("writing {}", path.display())))
}

/// Checks a drain's received ids against `1..=expected`: every id exactly once.
#[derive(Debug)]
pub struct IdCheck {
    seen: Vec<bool>,
    pub received: u64,
    pub duplicates: u64,
    pub out_of_range: u64,
}

impl IdCheck {
    pub fn new(expected: u64) -> Self {
        Self { seen: vec![false; expected as usize + 1], received: 0, duplicates: 0, out_of_range: 0 }
    }

    pub fn add(&mut self, id: i64) {
        self.received += 1;
        match usize::try_from(id).ok().filter(|&i| i >= 1 && i < self.seen.len()) {
            Some(i) if self.seen[i] => self.duplicates += 1,
            Some(i) => self.seen[i] = true,
            None => self.out_of_range += 1,
        }
    }

    pub fn missing(&self) -> u64 {
        self.seen.iter().skip(1).filter(|s| !**s).count() as u64
    }

    /// `Ok` when every id came exactly once; otherwise what went wrong, for the report.
    pub fn verdict(&self) -> Result<(), String> {
        let missing = self.missing();
        if missing == 0 && self.duplicates == 0 && self.out_of_range == 0 {
            Ok(())
        } else {
            Err(format!("{missing} missing, {} duplicate(s), {} unknown id(s)", self.duplicates, self.out_of_range))
        }
    }
}
