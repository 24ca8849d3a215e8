//! `handler demo`: the whole product end to end on this machine with nothing but the Rust toolchain.
//!
//! It starts a private PostgreSQL (the server binaries already on the machine, see `embedded`), creates an
//! `orders` table watched by the PostgreSQL cursor source, writes a function app folder with the file state
//! store, starts the real `handler` process the way the Functions host does, and plays the host: it fires the
//! timer, applies the outputs, and prints what a queue output binding would receive while it inserts, updates
//! and deletes rows, including one failed output write that the host retries. Messages are printed as the host
//! writes them: re-serialized by Newtonsoft, indented, decimals as doubles (the amount 120.00 arrives as 120.0;
//! docs/values.md).

use crate::driver::{AttemptOutcome, DriverOptions, HostDriver, Received, TimerRun};
use crate::embedded::{self, EmbeddedPostgres, ScratchDir};
use std::path::{Path, PathBuf};

/// The demo table: an `xid8` cursor set on every insert and update (the exact late-commit guard), an
/// `xid8` insert marker so inserts and updates are told apart, and a soft-delete flag.
pub const ORDERS_SCHEMA: &str = r#"
CREATE TABLE public.orders (
    id bigint PRIMARY KEY,
    customer text NOT NULL,
    amount numeric(12, 2) NOT NULL,
    placed_at timestamptz NOT NULL DEFAULT now(),
    deleted boolean NOT NULL DEFAULT false,
    created_version xid8 NOT NULL DEFAULT pg_current_xact_id(),
    version xid8 NOT NULL DEFAULT pg_current_xact_id()
);
CREATE INDEX orders_version_id ON public.orders (version, id);
CREATE FUNCTION public.orders_touch() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.version := pg_current_xact_id(); RETURN NEW; END $$;
CREATE TRIGGER orders_touch BEFORE UPDATE ON public.orders FOR EACH ROW EXECUTE FUNCTION public.orders_touch();
"#;

/// The demo's `sqltrigger.json`.
pub const ORDERS_TRIGGER: &str = r#"{
  "source": "postgres-cursor",
  "tableName": "public.orders",
  "connectionStringSetting": "PostgresConnectionString",
  "cursorColumn": "version",
  "insertedColumn": "created_version",
  "softDeleteColumn": "deleted",
  "startFrom": "earliest"
}"#;

/// The demo's `function.json`: a timer, a queue output, and the retry policy deferred delivery relies on.
pub const ORDERS_FUNCTION: &str = r#"{
  "bindings": [
    { "type": "timerTrigger", "direction": "in", "name": "timer", "schedule": "*/5 * * * * *" },
    { "type": "queue", "direction": "out", "name": "changes", "queueName": "orders-changes", "connection": "AzureWebJobsStorage" }
  ],
  "retry": { "strategy": "fixedDelay", "maxRetryCount": 3, "delayInterval": "00:00:01" }
}"#;

const FUNCTION: &str = "OrdersChanged";

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("{0}")]
    Launch(#[from] embedded::LaunchError),
    #[error("{0}")]
    Driver(#[from] crate::driver::DriverError),
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Unexpected(String),
}

/// Writes an app folder (host.json and one function) for the demo table.
pub fn write_app(root: &Path, function_json: &str, trigger_json: &str) -> std::io::Result<()> {
    std::fs::write(
        root.join("host.json"),
        r#"{"version":"2.0","functionTimeout":"00:05:00","customHandler":{"description":{"defaultExecutablePath":"handler"}}}"#,
    )?;
    let dir = root.join(FUNCTION);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("function.json"), function_json)?;
    std::fs::write(dir.join("sqltrigger.json"), trigger_json)?;
    Ok(())
}

pub async fn run(handler_exe: PathBuf) -> Result<(), DemoError> {
    println!("starting a private PostgreSQL on 127.0.0.1 ...");
    let pg = tokio::task::spawn_blocking(EmbeddedPostgres::start)
        .await
        .map_err(|e| DemoError::Unexpected(e.to_string()))??;
    println!("  {} on port {} (ready in {:?})", pg.version(), pg.port(), pg.started_in());
    let url = embedded::create_database(&pg.url(), "shop").await?;
    let db = embedded::connect(&url).await?;
    db.batch_execute(ORDERS_SCHEMA).await?;

    let app = ScratchDir::new("app")?;
    write_app(app.path(), ORDERS_FUNCTION, ORDERS_TRIGGER)?;
    let mut options = DriverOptions::new(app.path(), handler_exe);
    options.env = vec![
        ("PostgresConnectionString".into(), url.clone()),
        ("Sql_Trigger_StateStore".into(), "file".into()),
        ("Sql_Trigger_StateDirectory".into(), "state".into()),
        ("Sql_Trigger_LogLevel".into(), "warn".into()),
    ];
    let host = HostDriver::start(options).await?;
    println!("handler started by the host driver on port {} (ready in {:?})\n", host.port(), host.ready_after());

    println!("== 3 orders are placed");
    db.batch_execute(
        "INSERT INTO orders (id, customer, amount) VALUES (1, 'ada', 12.50), (2, 'grace', 99.99), (3, 'linus', 0.01)",
    )
    .await?;
    fire(&host).await?;

    println!("== order 2 is amended and order 3 is cancelled (soft delete)");
    db.batch_execute("UPDATE orders SET amount = 120.00 WHERE id = 2; UPDATE orders SET deleted = true WHERE id = 3")
        .await?;
    fire(&host).await?;

    println!("== order 4 is placed, and the queue is down for the first write");
    db.batch_execute("INSERT INTO orders (id, customer, amount) VALUES (4, 'barbara', 7.25)").await?;
    host.fail_output_writes("changes", 1);
    fire(&host).await?;

    println!("== nothing changed");
    fire(&host).await?;

    let state = std::fs::read_to_string(app.path().join("state/local").join(format!("{FUNCTION}.json")))?;
    let state: serde_json::Value = serde_json::from_str(&state).map_err(|e| DemoError::Unexpected(e.to_string()))?;
    println!("state document (file store):\n{}", serde_json::to_string_pretty(&state).unwrap_or_default());
    println!(
        "\nThe batches stay in flight, and the checkpoint where it was, for one proof window after each answer \
         (host.json functionTimeout 5 min + the retry delay + 30 s): until then a host retry naming one could \
         still come. See docs/architecture.md, \"Acknowledge by proof\"."
    );
    let delivered = host.delivered("changes").len();
    println!("\n{delivered} change(s) reached the queue binding in all; every change at least once.");
    host.terminate().await?;
    Ok(())
}

/// Fires the timer once and prints what happened and what the queue received from that firing.
async fn fire(host: &HostDriver) -> Result<(), DemoError> {
    let before = host.received("changes").len();
    let run = host.run_timer(FUNCTION).await?;
    show(&run, &host.received("changes")[before..]);
    Ok(())
}

fn show(run: &TimerRun, received: &[Received]) {
    for (i, attempt) in run.attempts.iter().enumerate() {
        let label = if i == 0 { "invocation".to_string() } else { format!("host retry {i}") };
        match &attempt.outcome {
            AttemptOutcome::Applied => {}
            AttemptOutcome::HandlerFailed { reason } => println!("  {label}: the handler failed: {reason}"),
            AttemptOutcome::OutputWriteFailed { binding, reason } => {
                println!("  {label}: the host could not write output {binding:?} ({reason}); it will retry")
            }
        }
    }
    if received.is_empty() {
        println!("  nothing new: the queue receives no message");
    } else {
        println!("  the queue receives {} message(s), as the host writes them:", received.len());
        for message in received {
            for line in message.text().lines() {
                println!("    {line}");
            }
        }
    }
    println!();
}
