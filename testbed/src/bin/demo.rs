//! `cargo demo` (an alias in .cargo/config.toml for `cargo run -p testbed --bin demo`): the whole product end
//! to end on this machine, on a private PostgreSQL, with the real `handler` driven by the host model.
//!
//! It builds the `handler` first (the same profile this demo runs under), so the one command works on a fresh
//! clone.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let handler = match build_handler() {
        Ok(path) => path,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = tokio::runtime::Runtime::new()
        .map_err(|e| e.to_string())
        .and_then(|rt| rt.block_on(testbed::demo::run(handler)).map_err(|e| e.to_string()));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Builds the `handler` binary with the cargo that runs this demo and returns its path, next to this program.
fn build_handler() -> Result<PathBuf, String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = Command::new(&cargo)
        .args(["build", "--quiet", "--bin", "handler"])
        .current_dir(&root)
        .status()
        .map_err(|e| format!("cannot run {cargo} to build the handler: {e}"))?;
    if !status.success() {
        return Err(format!("building the handler failed ({status}); run `cargo build --bin handler` to see why"));
    }
    let this = std::env::current_exe().map_err(|e| format!("cannot find this program's path: {e}"))?;
    let dir = this.parent().ok_or("this program has no folder")?;
    let handler = dir.join("handler");
    if handler.is_file() {
        Ok(handler)
    } else {
        Err(format!("the handler was built but is not at {}", handler.display()))
    }
}
