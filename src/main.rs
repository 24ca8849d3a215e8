//! `handler`: the custom-handler process the Functions host starts (host.json `defaultExecutablePath`).

use clap::{Parser, Subcommand};
use sql_pseudo_trigger::app::App;
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
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the Functions host (the default): listen on FUNCTIONS_CUSTOMHANDLER_PORT.
    Serve,
    /// Print the configuration reference (Markdown), generated from the code's setting definitions.
    Settings,
    /// Run the whole product locally: a private PostgreSQL, the file state store, this handler driven by a
    /// stand-in for the Functions host. Needs nothing but PostgreSQL's server binaries on the machine.
    Demo,
}

fn main() -> ExitCode {
    let started = Instant::now();
    let cli = Cli::parse();
    let env = Env::from_process();
    init_logging(&env);
    // reqwest is built without a default crypto provider so the tree carries one (ring) only.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Some(Command::Settings) => {
            print!("{}", settings::reference_markdown());
            ExitCode::SUCCESS
        }
        Some(Command::Demo) => {
            let exe = match std::env::current_exe() {
                Ok(exe) => exe,
                Err(e) => {
                    eprintln!("error: cannot find this program's path: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match tokio::runtime::Runtime::new()
                .map_err(|e| e.to_string())
                .and_then(|rt| rt.block_on(sql_pseudo_trigger::demo::run(exe)).map_err(|e| e.to_string()))
            {
                Ok(()) => ExitCode::SUCCESS,
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

fn init_logging(env: &Env) {
    let filter = env.get("RUST_LOG").or_else(|| env.get(settings::LOG_LEVEL.name)).unwrap_or("info").to_string();
    let filter = tracing_subscriber::EnvFilter::try_new(&filter).unwrap_or_else(|e| {
        eprintln!("warning: log filter {filter:?} is invalid ({e}); using info");
        tracing_subscriber::EnvFilter::new("info")
    });
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(false).with_target(false).init();
}

async fn serve(env: Env, started: Instant) -> ExitCode {
    let port = match env.get("FUNCTIONS_CUSTOMHANDLER_PORT").or_else(|| env.get("FUNCTIONS_HTTPWORKER_PORT")) {
        None => 8080,
        Some(p) => match p.trim().parse::<u16>() {
            Ok(p) => p,
            Err(_) => {
                tracing::error!("FUNCTIONS_CUSTOMHANDLER_PORT is {p:?}, not a port number; the Functions host sets it");
                return ExitCode::FAILURE;
            }
        },
    };
    let app = match AppConfig::load(env).and_then(App::build) {
        Ok(app) => Arc::new(app),
        Err(errors) => {
            // One message listing every problem; stderr lines with "error" become errors in the host's log.
            eprintln!("error: {errors}");
            tracing::error!("{errors}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
        Ok(l) => l,
        Err(e) => {
            tracing::error!("cannot listen on 127.0.0.1:{port}: {e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(
        port,
        functions = ?app.function_names(),
        state = %app.store.describe(),
        ready_ms = started.elapsed().as_secs_f64() * 1000.0,
        "handler ready"
    );
    for other in &app.config.other_functions {
        tracing::warn!(function = %other, "function folder has no sqltrigger.json; this handler will answer 404 for it");
    }

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, sql_pseudo_trigger::server::router(app))
        .with_graceful_shutdown(async {
            let _ = stop_rx.await;
        })
        .into_future();
    let mut server = Box::pin(server);
    tokio::select! {
        result = &mut server => {
            if let Err(e) = result {
                tracing::error!("server failed: {e}");
                return ExitCode::FAILURE;
            }
            return ExitCode::SUCCESS;
        }
        () = sql_pseudo_trigger::shutdown::signal() => {}
    }
    tracing::info!("shutting down: finishing the invocation in flight (at most {DRAIN_TIMEOUT:?})");
    let _ = stop_tx.send(());
    match tokio::time::timeout(DRAIN_TIMEOUT, server).await {
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
