//! `handler`: the custom-handler process the Functions host starts (host.json `defaultExecutablePath`).

use clap::{Parser, Subcommand};
use sql_pseudo_trigger::app::App;
use sql_pseudo_trigger::cli::PartitionsCommand;
use sql_pseudo_trigger::config::{settings, AppConfig, Env};
use std::future::IntoFuture;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long an invocation in flight may take to finish after SIGTERM before the process exits anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Parser, Debug)]
#[command(name = "handler", version, about = "A SQL trigger for Azure Functions, as a custom handler")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// The function app folder (host.json and function folders); default FUNCTIONS_APP_ROOT_PATH or the
    /// working directory.
    #[arg(long, global = true)]
    app_root: Option<std::path::PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the Functions host (the default): listen on FUNCTIONS_CUSTOMHANDLER_PORT.
    Serve,
    /// Print the configuration reference (Markdown), generated from the code's setting definitions.
    Settings,
    /// Run the functions without the Functions host: tick in a loop and deliver to each function's sink
    /// (`"sink"` in sqltrigger.json: stdout JSON lines by default, or a webhook).
    Run {
        /// Drain each function's backlog, then exit.
        #[arg(long)]
        once: bool,
        /// With --once: give up (exit 1, naming the function and its error) when a function has failed
        /// without a break for this many seconds, its database, state store or destination unavailable.
        #[arg(long, value_name = "SECONDS", default_value_t = 300, requires = "once")]
        give_up_after: u64,
        /// Also serve the admin routes on 127.0.0.1:PORT (needs Sql_Trigger_AdminKey).
        #[arg(long)]
        admin_port: Option<u16>,
        /// With --admin-port: the IP address to listen on (default Sql_Trigger_AdminBindAddress, else
        /// 127.0.0.1); 0.0.0.0 lets another pod (KEDA) reach the admin and scale routes, with the key.
        #[arg(long, value_name = "IP", requires = "admin_port")]
        admin_bind: Option<String>,
    },
    /// Inspect and operate a function's state (the same CAS writes a tick makes).
    State {
        #[command(subcommand)]
        command: sql_pseudo_trigger::cli::StateCommand,
    },
    /// Split a function into partitions (stable hash ranges of its primary key, each with its own state).
    Partitions {
        #[command(subcommand)]
        command: sql_pseudo_trigger::cli::PartitionsCommand,
    },
}

fn main() -> ExitCode {
    let started = Instant::now();
    let cli = Cli::parse();
    let env = Env::from_process();
    // Under the host, stdout is the log; elsewhere stdout carries results (JSON, JSON-lines sinks).
    if let Err(e) = init_logging(&env, !matches!(cli.command, None | Some(Command::Serve))) {
        // Straight to stderr: with no logging there is no level to filter it out.
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    // reqwest is built without a default crypto provider so the tree carries one (ring) only.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Some(Command::Settings) => {
            print!("{}", settings::reference_markdown());
            ExitCode::SUCCESS
        }
        Some(Command::Run { once, give_up_after, admin_port, admin_bind }) => {
            let options =
                sql_pseudo_trigger::runner::RunOptions { once, give_up_after: Duration::from_secs(give_up_after) };
            let result = tokio::runtime::Runtime::new()
                .map_err(|e| e.to_string())
                .and_then(|rt| rt.block_on(run(cli.app_root, env, options, admin_port.map(|port| (port, admin_bind)))));
            match result {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(Command::State { command }) => {
            match operate(cli.app_root, env, |app| sql_pseudo_trigger::cli::run(app, command)) {
                Ok(value) => {
                    println!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(Command::Partitions { command: PartitionsCommand::Change(change) }) => {
            match operate(cli.app_root, env, |app| sql_pseudo_trigger::cli::run_partitions(app, change)) {
                Ok(text) => {
                    println!("{}", text.trim_end());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some(Command::Partitions { command: PartitionsCommand::Generate { function, count, remove_original } }) => {
            let root = cli.app_root.unwrap_or_else(|| AppConfig::app_root(&env));
            match sql_pseudo_trigger::partitions::generate(&root, &function, count, remove_original) {
                Ok(generated) => {
                    print!("{}", generated.report());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        None | Some(Command::Serve) => {
            let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            runtime.block_on(serve(env, started))
        }
    }
}

/// An operator's command (`handler state …`, `handler partitions …`): the app read as an operator reads it
/// (`Mode::Operator`), then `command` on a runtime of its own.
fn operate<T, F>(
    app_root: Option<std::path::PathBuf>,
    env: Env,
    command: impl FnOnce(Arc<App>) -> F,
) -> Result<T, sql_pseudo_trigger::cli::CliError>
where
    F: std::future::Future<Output = Result<T, sql_pseudo_trigger::cli::CliError>>,
{
    let app = sql_pseudo_trigger::cli::load_app(app_root, env, sql_pseudo_trigger::config::Mode::Operator)?;
    let rt = tokio::runtime::Runtime::new().map_err(|e| {
        sql_pseudo_trigger::cli::CliError::Ops(sql_pseudo_trigger::ops::OpsError::Invalid(e.to_string()))
    })?;
    rt.block_on(command(Arc::new(app)))
}

/// Logs to stderr for the commands (their stdout is their answer). Serving the host, warnings and errors go to
/// stderr and the rest to stdout, because that is how the host assigns levels to a custom handler's output:
/// every stdout line is Information, every stderr line an Error unless it contains "warn", then a Warning
/// (azure-functions-host `WorkerProcess.ParseErrorMessageAndLog`, with `UseStdErrorStreamForErrorsOnly` true in
/// `HttpWorkerDescription`). A WARN line on stdout would be filed as Information, an INFO line on stderr as
/// an Error.
fn init_logging(env: &Env, to_stderr: bool) -> Result<(), String> {
    let filter = match (env.get("RUST_LOG"), env.get(settings::LOG_LEVEL.name)) {
        (Some(rust_log), _) => rust_log.to_string(),
        (None, Some(level)) => settings::log_filter(level).map_err(|e| e.to_string())?,
        (None, None) => settings::LOG_LEVEL.default.to_string(),
    };
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).map_err(|e| {
        format!("the log filter {filter:?} is invalid ({e}); fix RUST_LOG or {}", settings::LOG_LEVEL.name)
    })?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_target(false);
    if to_stderr {
        builder.with_writer(std::io::stderr).init();
    } else {
        use tracing_subscriber::fmt::writer::MakeWriterExt;
        let writer = std::io::stderr.with_max_level(tracing::Level::WARN).or_else(std::io::stdout);
        builder.with_writer(writer).init();
    }
    Ok(())
}

/// A refusal to start: on stderr whatever the log level (`None` turns logging off, and a worker that exits
/// without a word leaves the host's log with no reason).
fn refuse_to_start(message: impl std::fmt::Display) -> ExitCode {
    eprintln!("error: {message}");
    ExitCode::FAILURE
}

async fn serve(env: Env, started: Instant) -> ExitCode {
    let port = match env.get("FUNCTIONS_CUSTOMHANDLER_PORT").or_else(|| env.get("FUNCTIONS_HTTPWORKER_PORT")) {
        None => 8080,
        Some(p) => match p.trim().parse::<u16>() {
            Ok(p) => p,
            Err(_) => {
                return refuse_to_start(format!(
                    "FUNCTIONS_CUSTOMHANDLER_PORT is {p:?}, not a port number; the Functions host sets it"
                ))
            }
        },
    };
    let app = match AppConfig::load(env).and_then(App::build) {
        Ok(app) => Arc::new(app),
        // One message listing every problem, on stderr: the host files it as an error.
        Err(errors) => return refuse_to_start(errors),
    };
    // Listening for SIGTERM before saying ready: a stop right after start-up ends the process cleanly.
    let signals = sql_pseudo_trigger::shutdown::listen();
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(l) => l,
        Err(e) => return refuse_to_start(format!("cannot listen on 127.0.0.1:{port}: {e}")),
    };
    tracing::info!(
        port,
        functions = ?app.function_names(),
        state = %app.store.describe(),
        ready_ms = started.elapsed().as_secs_f64() * 1000.0,
        "handler ready"
    );
    // Check every function's table and state now, in the background, so a misconfiguration shows in the log
    // at start rather than at the first timer firing; ticks refuse with the same errors until it is fixed.
    for trigger in app.triggers().cloned().collect::<Vec<_>>() {
        tokio::spawn(async move {
            match trigger.preflight().await {
                Ok(()) => tracing::info!(function = %trigger.name(), "start-up check passed"),
                Err(e) => {
                    tracing::error!(function = %trigger.name(), error = %e, hint = e.hint(), "start-up check failed")
                }
            }
        });
    }
    for other in &app.config.other_functions {
        tracing::warn!(function = %other, "function folder has no sqltrigger.json; this handler will answer 404 for it");
    }
    // Only now, with the listener bound and readiness logged: metrics never delay the host's readiness probe.
    let telemetry = sql_pseudo_trigger::telemetry::start(&app);
    let _watchdog = sql_pseudo_trigger::watchdog::start(&app, sql_pseudo_trigger::config::Mode::Host);

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, sql_pseudo_trigger::server::router(app.clone()))
        .with_graceful_shutdown(async {
            let _ = stop_rx.await;
        })
        .into_future();
    let mut server = Box::pin(server);
    tokio::select! {
        result = &mut server => {
            sql_pseudo_trigger::telemetry::stop(telemetry).await;
            if let Err(e) = result {
                tracing::error!("server failed: {e}");
                return ExitCode::FAILURE;
            }
            return ExitCode::SUCCESS;
        }
        () = signals.recv() => {}
    }
    tracing::info!("shutting down: finishing the invocation in flight (at most {DRAIN_TIMEOUT:?})");
    let _ = stop_tx.send(());
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, server).await;
    // Only after the drain (and a tick still running past it holds its trigger's lock, which the release waits
    // for): the leases this process holds end, so the next instance (or `handler partitions change`) goes on at
    // once instead of waiting them out. Bounded: whoever sent SIGTERM kills soon after.
    app.release_on_stop(sql_pseudo_trigger::app::RELEASE_TIMEOUT).await;
    // After the drain, so the last export includes the tick that finished during it.
    sql_pseudo_trigger::telemetry::stop(telemetry).await;
    match drained {
        Ok(_) => {
            tracing::info!("shut down cleanly");
            ExitCode::SUCCESS
        }
        Err(_) => {
            tracing::warn!(
                "invocation still running after {DRAIN_TIMEOUT:?}; exiting (its batch is re-delivered, not lost)"
            );
            ExitCode::SUCCESS
        }
    }
}

/// `handler run`: the runner loop, optionally with the admin routes (`admin`: `--admin-port` and
/// `--admin-bind`), until SIGTERM (or drained with --once).
async fn run(
    app_root: Option<std::path::PathBuf>,
    env: Env,
    options: sql_pseudo_trigger::runner::RunOptions,
    admin: Option<(u16, Option<String>)>,
) -> Result<(), String> {
    let app = Arc::new(
        sql_pseudo_trigger::cli::load_app(app_root, env, sql_pseudo_trigger::config::Mode::Runner)
            .map_err(|e| e.to_string())?,
    );
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    if let Some((port, bind)) = admin {
        let ip = sql_pseudo_trigger::server::admin_bind_address(
            bind.as_deref(),
            app.config.env.get(settings::ADMIN_BIND_ADDRESS.name),
        )?;
        // Admin routes always require a key; without one they would answer only "off", which looks like a
        // running admin port that refuses everything. Refuse before anything starts instead.
        if app.config.env.get(settings::ADMIN_KEY.name).is_none() {
            return Err(if ip.is_loopback() {
                format!(
                    "--admin-port needs the app setting {}: the admin routes always require a key. Set it (environment or local.settings.json) to a long random value and send it as x-functions-key, or drop --admin-port",
                    settings::ADMIN_KEY.name
                )
            } else {
                format!(
                    "--admin-port on {ip} (--admin-bind or {}) serves the admin routes beyond this machine and needs the app setting {}: set it (a Kubernetes Secret) to a long random value, which KEDA sends as X-API-KEY or a bearer token, or bind 127.0.0.1",
                    settings::ADMIN_BIND_ADDRESS.name,
                    settings::ADMIN_KEY.name
                )
            });
        }
        let listener = tokio::net::TcpListener::bind((ip, port))
            .await
            .map_err(|e| format!("cannot listen on {ip}:{port} for the admin routes: {e}"))?;
        let router = sql_pseudo_trigger::server::admin_router(app.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).await;
        });
        tracing::info!(port, address = %ip, "admin routes served at /admin (Sql_Trigger_AdminKey required)");
    }
    let signals = sql_pseudo_trigger::shutdown::listen();
    tokio::spawn(async move {
        signals.recv().await;
        tracing::info!("stopping: finishing the batch in hand");
        let _ = stop_tx.send(true);
    });
    let telemetry = sql_pseudo_trigger::telemetry::start(&app);
    let _watchdog = sql_pseudo_trigger::watchdog::start(&app, sql_pseudo_trigger::config::Mode::Runner);
    let summary = sql_pseudo_trigger::runner::run(app, options, stop_rx).await;
    sql_pseudo_trigger::telemetry::stop(telemetry).await;
    tracing::info!(
        delivered = summary.delivered,
        batches = summary.batches,
        failed_deliveries = summary.failed_deliveries,
        stopped = summary.stopped.len(),
        "run finished"
    );
    summary.result()
}
