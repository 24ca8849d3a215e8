//! `handler state ...`: the operator actions of [`crate::ops`] from a shell, against the same state the
//! handler uses (app settings from the environment, then `local.settings.json`).

use crate::app::App;
use crate::config::{AppConfig, ConfigErrors, Env, Mode};
use crate::ops::{self, Action, BackfillControl, OpsError, ResetTo};
use clap::Subcommand;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Subcommand, Debug)]
pub enum StateCommand {
    /// Print the state document and the quarantine documents.
    Show { function: String },
    /// Pending changes, target workers, progress and counters.
    Status { function: String },
    /// Answer empty batches until resumed.
    Pause { function: String },
    /// Undo a pause, or a halt at a poison batch.
    Resume { function: String },
    /// Move the checkpoint to earliest, now, or a JSON position; drops the batch in flight.
    Reset {
        function: String,
        /// `earliest`, `now`, or a position such as '["1042","17"]'.
        #[arg(long)]
        to: String,
        /// Required: a reset may skip or repeat changes.
        #[arg(long)]
        confirm: bool,
    },
    /// Re-deliver everything after a position, under new batch ids.
    Replay {
        function: String,
        /// A position such as '["1042","17"]' (`null` for the beginning).
        #[arg(long)]
        from: String,
    },
    /// Deliver the rows that exist (in key order, in chunks, beside live changes), or pause, resume or cancel
    /// the open backfill. docs/operations.md, "Backfill".
    Backfill {
        function: String,
        /// Only rows matching this filter: column comparisons with literals, AND/OR, IS [NOT] NULL, [NOT] IN,
        /// e.g. "region = 'eu' AND total > 100".
        #[arg(long = "where", conflicts_with_all = ["pause", "resume", "cancel"])]
        filter: Option<String>,
        #[arg(long, conflicts_with_all = ["resume", "cancel"])]
        pause: bool,
        #[arg(long, conflicts_with = "cancel")]
        resume: bool,
        #[arg(long)]
        cancel: bool,
    },
    /// Quarantined (poison) batches.
    Quarantine {
        #[command(subcommand)]
        command: QuarantineCommand,
    },
}

#[derive(Subcommand, Debug)]
pub enum QuarantineCommand {
    List {
        function: String,
    },
    Show {
        function: String,
        batch_id: u64,
    },
    /// Re-deliver a quarantined batch before new changes.
    Retry {
        function: String,
        batch_id: u64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    #[error("no SQL trigger function named {name:?}; configured: {known}")]
    UnknownFunction { name: String, known: String },
    #[error("{0}")]
    Ops(#[from] OpsError),
}

/// Loads the app as the handler would, from `app_root` or FUNCTIONS_APP_ROOT_PATH or the working directory.
pub fn load_app(app_root: Option<PathBuf>, env: Env) -> Result<App, CliError> {
    let root = app_root.unwrap_or_else(|| AppConfig::app_root(&env));
    let env = env.with_local_settings(&root).map_err(|e| CliError::Config(ConfigErrors(vec![e])))?;
    Ok(AppConfig::load_for(&root, env, Mode::Runner).and_then(App::build)?)
}

fn who() -> String {
    let user = std::env::var("USER").or_else(|_| std::env::var("USERNAME")).unwrap_or_else(|_| "unknown".into());
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "localhost".into());
    format!("{user}@{host} (cli)")
}

pub async fn run(app: Arc<App>, command: StateCommand) -> Result<Value, CliError> {
    let find = |name: &str| {
        app.trigger(name)
            .cloned()
            .ok_or_else(|| CliError::UnknownFunction { name: name.to_string(), known: app.function_names().join(", ") })
    };
    let (function, action) = match command {
        StateCommand::Show { function } => (function, Action::Show),
        StateCommand::Status { function } => (function, Action::Status),
        StateCommand::Pause { function } => (function, Action::Pause),
        StateCommand::Resume { function } => (function, Action::Resume),
        StateCommand::Reset { function, to, confirm } => {
            (function, Action::Reset { to: ResetTo::parse(&to)?, confirm })
        }
        StateCommand::Replay { function, from } => (function, Action::Replay { from: ops::position(&from, "--from")? }),
        StateCommand::Backfill { function, filter, pause, resume, cancel } => {
            let action = match (pause, resume, cancel) {
                (true, _, _) => Action::Backfill(BackfillControl::Pause),
                (_, true, _) => Action::Backfill(BackfillControl::Resume),
                (_, _, true) => Action::Backfill(BackfillControl::Cancel),
                _ => Action::BackfillStart { filter },
            };
            (function, action)
        }
        StateCommand::Quarantine { command } => match command {
            QuarantineCommand::List { function } => (function, Action::QuarantineList),
            QuarantineCommand::Show { function, batch_id } => (function, Action::QuarantineShow { batch_id }),
            QuarantineCommand::Retry { function, batch_id } => (function, Action::QuarantineRetry { batch_id }),
        },
    };
    Ok(find(&function)?.operate(action, &who()).await?)
}
