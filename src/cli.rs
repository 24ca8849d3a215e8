//! `handler state ...`: the operator actions of [`crate::ops`] from a shell, against the same state the
//! handler uses (app settings from the environment, then `local.settings.json`); `handler partitions ...`:
//! a partitioned function's layout.

use crate::app::App;
use crate::clock::SystemClock;
use crate::config::{AppConfig, ConfigErrors, Env, Mode};
use crate::ops::{self, Action, BackfillControl, OpsError, ResetTo};
use crate::partitions::change::{Repartition, RepartitionError, Request};
use clap::Subcommand;
use serde_json::Value;
use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Subcommand, Debug)]
pub enum StateCommand {
    /// Print the state document and the quarantine documents.
    Show { function: String },
    /// Pending changes, target workers, progress and counters; for a partitioned function (its name), each
    /// partition's lease holder, pending, lag and pace, and the totals with the replicas the backlog asks for.
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

/// `handler partitions ...`: a partitioned function's layout. `generate` writes folders and needs no app
/// loaded (`main.rs` runs it); `change` loads the app as an operator ([`run_partitions`]).
#[derive(Subcommand, Debug)]
pub enum PartitionsCommand {
    /// Write N function folders <function>-p0 .. <function>-p{N-1} from the folder <function>, for the Functions
    /// host (one timer function per partition): each has the same function.json and a sqltrigger.json equal to
    /// the original plus "partitions": N, "partition": i, "partitionGroup": "<function>". Refuses, writing
    /// nothing, when the function is unknown, N is not 2..=256, a target folder exists, or the source is
    /// postgres-logical. The original folder stays unless --remove-original: remove it before deploying, and
    /// carry its checkpoint over with `handler partitions change` if it already has state. A postgres-cursor
    /// partition's fetch needs an index on the partition expression: the handler logs the CREATE INDEX
    /// statement at start-up when it is missing (docs/postgres.md, "Partitions").
    Generate {
        /// The function folder to split (under --app-root).
        function: String,
        /// How many partitions (2 to 256).
        count: u32,
        /// Delete the original folder once the partition folders are written.
        #[arg(long)]
        remove_original: bool,
    },
    /// Change a function's number of partitions, each new partition starting where the old ones holding its
    /// keys stopped (docs/operations.md, "Changing the number of partitions"). Stop the function first.
    Change(ChangeArgs),
}

/// `handler partitions change`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ChangeArgs {
    /// The function: its folder name, or the partitionGroup of its generated folders.
    pub function: String,
    /// The new number of partitions (1: unpartitioned).
    #[arg(long)]
    pub to: NonZeroU32,
    /// The number of partitions to change from, when the store holds documents of several layouts.
    #[arg(long)]
    pub from: Option<NonZeroU32>,
    /// Start the keys of an old partition that has no state document from the earliest change the source
    /// holds (all of them are delivered again) instead of refusing.
    #[arg(long)]
    pub missing_from_earliest: bool,
    /// The old partitions' quarantined batches were dealt with; their documents stay in the store, where no
    /// new partition can re-deliver them.
    #[arg(long)]
    pub quarantine_handled: bool,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    #[error("no SQL trigger function named {name:?}; configured: {known}")]
    UnknownFunction { name: String, known: String },
    #[error("{0}")]
    Ops(#[from] OpsError),
    #[error("{0}")]
    Repartition(#[from] RepartitionError),
    /// A partitioned function's status that some partitions did not answer: no total is printed.
    #[error("{0}")]
    Incomplete(String),
}

/// Loads the app as the handler would, from `app_root` or FUNCTIONS_APP_ROOT_PATH or the working directory:
/// `Mode::Runner` for `handler run`, `Mode::Operator` for the state and partitions commands.
pub fn load_app(app_root: Option<PathBuf>, env: Env, mode: Mode) -> Result<App, CliError> {
    let root = app_root.unwrap_or_else(|| AppConfig::app_root(&env));
    let env = env.with_local_settings(&root).map_err(|e| CliError::Config(ConfigErrors(vec![e])))?;
    Ok(AppConfig::load_for(&root, env, mode).and_then(App::build)?)
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
    // A partitioned function has no trigger of its own name: its status sums its partitions'.
    if let StateCommand::Status { function } = &command {
        let partitions = app.partitions(function);
        if app.trigger(function).is_none() && !partitions.is_empty() {
            let owners = app.partition_owners(function).await;
            let status = crate::partitions::status::group_status(function, &partitions, &owners).await?;
            if let Some(missing) = status.missing() {
                return Err(CliError::Incomplete(missing));
            }
            return Ok(serde_json::to_value(status).unwrap_or(Value::Null));
        }
    }
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

/// `handler partitions change`: what it prints on success (a table, or JSON with `--json`).
pub async fn run_partitions(app: Arc<App>, change: ChangeArgs) -> Result<String, CliError> {
    let ChangeArgs { function, to, from, missing_from_earliest, quarantine_handled, json } = change;
    let request = Request { to, from, missing_from_earliest, quarantine_handled, who: who() };
    let report = repartition_of(&app, &function, to)?.change(&request).await?;
    Ok(match json {
        true => serde_json::to_string_pretty(&report).unwrap_or_default(),
        false => report.to_string(),
    })
}

/// The partitions of `function` (a folder, or the group of generated folders) as the app configures it: its
/// documents' group, and its source, which orders positions and names the fingerprint the documents must carry.
fn repartition_of(app: &App, function: &str, to: NonZeroU32) -> Result<Repartition, CliError> {
    let folders = &app.config.functions;
    let folder = folders
        .iter()
        .find(|f| f.partitioning.group.eq_ignore_ascii_case(function))
        .or_else(|| folders.iter().find(|f| f.name.eq_ignore_ascii_case(function)));
    let unknown = || {
        let mut groups: Vec<&str> = folders.iter().map(|f| f.partitioning.group.as_str()).collect();
        groups.dedup();
        CliError::UnknownFunction { name: function.to_string(), known: groups.join(", ") }
    };
    let group = folder.ok_or_else(unknown)?.partitioning.group.clone();
    let trigger = app.triggers().find(|t| t.config().partitioning.group == group).ok_or_else(unknown)?;
    let kind = trigger.config().source.kind();
    if let (true, Err(why)) = (to.get() > 1, kind.capabilities().partitions) {
        return Err(CliError::Ops(OpsError::Invalid(why.in_change(function, kind))));
    }
    Ok(Repartition {
        store: app.store.clone(),
        app: app.config.app_name.clone(),
        group,
        source: trigger.source().clone(),
        clock: Arc::new(SystemClock),
    })
}
