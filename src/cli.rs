//! `handler state ...`: the operator actions of [`crate::ops`] from a shell, against the same state the
//! handler uses (app settings from the environment, then `local.settings.json`).

use crate::app::App;
use crate::config::{AppConfig, ConfigErrors, Env, Mode};
use crate::ops::{self, OpsError, ResetTo};
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
    let who = who();
    Ok(match command {
        StateCommand::Show { function } => ops::show(&*find(&function)?).await?,
        StateCommand::Status { function } => {
            serde_json::to_value(ops::status(&*find(&function)?).await?).unwrap_or(Value::Null)
        }
        StateCommand::Pause { function } => {
            ops::pause(&*find(&function)?, &who).await?;
            serde_json::json!({ "function": function, "paused": true })
        }
        StateCommand::Resume { function } => {
            ops::resume(&*find(&function)?, &who).await?;
            serde_json::json!({ "function": function, "paused": false })
        }
        StateCommand::Reset { function, to, confirm } => {
            ops::reset(&*find(&function)?, ResetTo::parse(&to)?, confirm, &who).await?
        }
        StateCommand::Replay { function, from } => {
            let from = serde_json::from_str(&from)
                .map_err(|e| OpsError::Invalid(format!("--from {from:?} is not a JSON position: {e}")))?;
            ops::replay(&*find(&function)?, from, &who).await?
        }
        StateCommand::Quarantine { command } => match command {
            QuarantineCommand::List { function } => ops::quarantine_list(&*find(&function)?).await?,
            QuarantineCommand::Show { function, batch_id } => {
                ops::quarantine_show(&*find(&function)?, batch_id).await?
            }
            QuarantineCommand::Retry { function, batch_id } => {
                ops::quarantine_retry(&*find(&function)?, batch_id, &who).await?
            }
        },
    })
}
