//! Typed, validated configuration: the app settings, host.json and every function folder, read once at start.
//!
//! Loading never stops at the first problem: it collects every one, each naming the setting or file and what
//! to change, so a misconfigured app is fixed in one round trip instead of one per restart. No database or
//! storage is contacted here; that happens lazily on the first tick.

mod admin;
mod env;
mod error;
mod folder;
mod function;
mod host_policy;
mod mode;
mod names;
pub mod ncrontab;
mod outputs;
mod partition;
mod postgres_trust;
mod secret;
pub mod settings;
mod sink_spec;
mod source_options;
mod source_spec;

pub use admin::AdminFunction;
pub use env::Env;
pub use error::{ConfigError, ConfigErrors};
pub use function::FunctionConfig;
pub use host_policy::{
    parse_timespan, proof_window, FunctionTimeout, RetryPolicy, RetryStrategy, PROOF_SLACK, UNBOUNDED_TIMEOUT_ASSUMED,
};
pub use mode::Mode;
pub(crate) use names::valid_path_part;
pub use outputs::OutputBinding;
pub use outputs::{OutputRoute, OutputShape, OutputShapes};
pub use partition::{Partition, Partitioning, MAX_PARTITIONS};
pub use postgres_trust::PostgresTrust;
pub use secret::Secret;
pub use settings::{DeliveryMode, MessageFormat, PoisonAction, TriggerSettings};
pub use sink_spec::{beside, SinkSpec, TableTarget, WebhookSpec};
pub use source_options::{
    ChangeTrackingOptions, CursorGuard, DeleteItem, OnPositionLost, OnTruncate, PostgresCursorOptions,
    PostgresLogicalOptions, Reader, RowversionOptions,
};
pub use source_spec::{Capabilities, NoPartitions, SourceKind, SourceOptions, SourceSpec, StartFrom};

use folder::read_json;
use names::valid_container_name;
use std::path::{Path, PathBuf};

/// Where state documents live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateStoreKind {
    Blob { container: String },
    File { directory: PathBuf },
}

/// The whole app, validated.
#[derive(Debug, Clone)]
pub struct AppConfig {
    pub app_root: PathBuf,
    /// Name space of state documents.
    pub app_name: String,
    pub state_store: StateStoreKind,
    pub functions: Vec<FunctionConfig>,
    /// HTTP-triggered functions that serve the admin routes.
    pub admin_functions: Vec<AdminFunction>,
    /// Function folders this handler does not serve (no sqltrigger.json); invoking them answers 404.
    pub other_functions: Vec<String>,
    /// What PostgreSQL connections trust (`Sql_Trigger_PostgresRootCertificate`,
    /// `Sql_Trigger_PostgresTrustServerCertificate`), shared by every PostgreSQL source and sink.
    pub postgres_trust: PostgresTrust,
    /// `Sql_Trigger_MaxConnectionsPerDatabase`: the size of each database's one pool in this process.
    pub max_connections_per_database: usize,
    pub env: Env,
    /// Problems that do not stop the handler, logged at start-up (each says what to change).
    pub warnings: Vec<ConfigError>,
    /// Who drives the ticks: the host (`handler serve`) or the handler's own loop (`handler run`); or who reads
    /// the app: an operator's command (the state CLI).
    pub mode: Mode,
}

impl AppConfig {
    /// The app root: `FUNCTIONS_APP_ROOT_PATH`, else the working directory.
    pub fn app_root(env: &Env) -> PathBuf {
        env.get("FUNCTIONS_APP_ROOT_PATH")
            .map(PathBuf::from)
            .or_else(|| std::env::current_dir().ok())
            .unwrap_or_else(|| PathBuf::from("."))
    }

    /// Reads host.json, every function folder and the app settings.
    pub fn load(env: Env) -> Result<Self, ConfigErrors> {
        let root = Self::app_root(&env);
        Self::load_from(&root, env)
    }

    pub fn load_from(root: &Path, env: Env) -> Result<Self, ConfigErrors> {
        Self::load_for(root, env, Mode::Host)
    }

    /// Loads for the host (`serve`) or for `handler run`, whose requirements differ slightly. Every step records
    /// its problems and goes on, so one load reports them all, in the order of the steps.
    pub fn load_for(root: &Path, env: Env, mode: Mode) -> Result<Self, ConfigErrors> {
        let mut errors = Vec::new();
        let host_json = read_json(&root.join("host.json"), &mut errors, false);
        let host_sql = host_json.as_ref().and_then(|h| h.pointer("/extensions/sql")).cloned();
        let function_timeout = function_timeout(host_json.as_ref(), &env, &mut errors);
        let mut warnings = Vec::new();
        let context = folder::Context { env: &env, host_sql: host_sql.as_ref(), function_timeout, mode };
        let Folders { functions, admin_functions, other_functions } =
            Folders::load(root, context, &mut errors, &mut warnings);
        let state_store = state_store(root, &env, &mut errors);
        let postgres_trust = PostgresTrust::from_env(&env, root).unwrap_or_else(|mut problems| {
            errors.append(&mut problems);
            PostgresTrust::default()
        });
        let max_connections_per_database = settings::Resolver { env: &env, host_sql: None, function: None }.positive(
            &settings::MAX_CONNECTIONS_PER_DATABASE,
            settings::MOST_CONNECTIONS_PER_DATABASE as u64,
            &mut errors,
        ) as usize;
        // main refuses a bad level before logging starts; here too, for a level set in local.settings.json.
        if let Some(level) = env.get(settings::LOG_LEVEL.name) {
            if let Err(problem) = settings::log_filter(level) {
                errors.push(problem);
            }
        }
        let app_name = app_name(&env, &mut errors);
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        Ok(Self {
            app_root: root.to_path_buf(),
            app_name,
            state_store,
            functions,
            admin_functions,
            other_functions,
            postgres_trust,
            max_connections_per_database,
            env,
            warnings,
            mode,
        })
    }

    pub fn function(&self, name: &str) -> Option<&FunctionConfig> {
        self.functions.iter().find(|f| f.name.eq_ignore_ascii_case(name))
    }
}

/// host.json `functionTimeout`: how long the host lets one invocation run (the plan's default when unset).
fn function_timeout(
    host_json: Option<&serde_json::Value>,
    env: &Env,
    errors: &mut Vec<ConfigError>,
) -> FunctionTimeout {
    match host_json.and_then(|h| h.get("functionTimeout")) {
        None | Some(serde_json::Value::Null) => FunctionTimeout::plan_default(env),
        Some(serde_json::Value::String(t)) if t.trim() == "-1" => FunctionTimeout::Unbounded,
        Some(serde_json::Value::String(t)) => match parse_timespan(t) {
            Some(d) if !d.is_zero() => FunctionTimeout::Bounded(d),
            _ => {
                errors.push(ConfigError::new(
                    "host.json functionTimeout",
                    format!("{t:?} is not a timespan like \"00:05:00\" (or \"-1\" for no limit)"),
                ));
                FunctionTimeout::plan_default(env)
            }
        },
        Some(_) => {
            errors.push(ConfigError::new("host.json functionTimeout", "must be a string like \"00:05:00\""));
            FunctionTimeout::plan_default(env)
        }
    }
}

/// The app's function folders (those with a function.json), in name order, by what serves them.
struct Folders {
    functions: Vec<FunctionConfig>,
    admin_functions: Vec<AdminFunction>,
    other_functions: Vec<String>,
}

impl Folders {
    fn load(
        root: &Path,
        context: folder::Context<'_>,
        errors: &mut Vec<ConfigError>,
        warnings: &mut Vec<ConfigError>,
    ) -> Self {
        let mut functions = Vec::new();
        let mut other_functions = Vec::new();
        let mut admin_functions = Vec::new();
        let mut dirs: Vec<PathBuf> = match std::fs::read_dir(root) {
            Ok(entries) => entries.flatten().map(|e| e.path()).filter(|p| p.join("function.json").is_file()).collect(),
            Err(e) => {
                errors.push(ConfigError::new(
                    root.display().to_string(),
                    format!("cannot read the app root ({e}); set FUNCTIONS_APP_ROOT_PATH to the folder with host.json"),
                ));
                Vec::new()
            }
        };
        dirs.sort();
        for dir in dirs {
            if let Some(admin) = admin::load(&dir, errors) {
                admin_functions.push(admin);
                continue;
            }
            match folder::load(&dir, context, errors, warnings) {
                Some(f) => functions.push(f),
                None => {
                    if let Some(name) = dir.file_name() {
                        other_functions.push(name.to_string_lossy().into_owned());
                    }
                }
            }
        }
        // Functions whose folder failed validation were reported in `errors` and are neither list's members.
        other_functions.retain(|n| !errors.iter().any(|e| e.setting.starts_with(&format!("{n}/"))));
        Self { functions, admin_functions, other_functions }
    }
}

/// Where state documents live: `Sql_Trigger_StateStore` and its container or directory.
fn state_store(root: &Path, env: &Env, errors: &mut Vec<ConfigError>) -> StateStoreKind {
    let state_store = match env.get(settings::STATE_STORE.name).unwrap_or("blob").trim().to_ascii_lowercase().as_str() {
        "blob" => StateStoreKind::Blob {
            container: env.get(settings::STATE_CONTAINER.name).unwrap_or(settings::STATE_CONTAINER.default).to_string(),
        },
        "file" => {
            let dir = env.get(settings::STATE_DIRECTORY.name).unwrap_or(settings::STATE_DIRECTORY.default);
            StateStoreKind::File { directory: root.join(dir) }
        }
        other => {
            errors.push(ConfigError::new(
                format!("app setting {}", settings::STATE_STORE.name),
                format!("must be blob or file, got {other:?}"),
            ));
            StateStoreKind::File { directory: root.join(settings::STATE_DIRECTORY.default) }
        }
    };
    if let StateStoreKind::Blob { container } = &state_store {
        if !valid_container_name(container) {
            errors.push(ConfigError::new(
                format!("app setting {}", settings::STATE_CONTAINER.name),
                format!("{container:?} is not a valid blob container name (3-63 lowercase letters, digits and single hyphens)"),
            ));
        }
    }
    state_store
}

/// `Sql_Trigger_AppName`, else the site's name, else `local`: the name space of the state documents.
fn app_name(env: &Env, errors: &mut Vec<ConfigError>) -> String {
    let app_name =
        env.get(settings::APP_NAME.name).or_else(|| env.get("WEBSITE_SITE_NAME")).unwrap_or("local").to_string();
    if !valid_path_part(&app_name) {
        errors.push(ConfigError::new(
            format!("app setting {}", settings::APP_NAME.name),
            format!("{app_name:?} may hold only letters, digits, '-', '_' and '.'"),
        ));
    }
    app_name
}

/// Writes below `root` an app folder with one PostgreSQL function `function` (a queue output, a fixed-delay retry
/// policy, connection string in the app setting `Pg`), for tests that load a whole app with
/// [`AppConfig::load_from`] but never reach its database.
#[cfg(test)]
pub(crate) fn write_test_app(root: &Path, function: &str) {
    let dir = root.join(function);
    std::fs::create_dir_all(&dir).expect("the function folder");
    std::fs::write(
        dir.join("function.json"),
        r#"{"bindings":[{"type":"timerTrigger","direction":"in","name":"timer","schedule":"* * * * * *"},
            {"type":"queue","direction":"out","name":"changes","queueName":"q","connection":"AzureWebJobsStorage"}],
            "retry":{"strategy":"fixedDelay","maxRetryCount":3,"delayInterval":"00:00:01"}}"#,
    )
    .expect("function.json");
    std::fs::write(
        dir.join("sqltrigger.json"),
        r#"{"source":"postgres-cursor","tableName":"public.orders","connectionStringSetting":"Pg","cursorColumn":"version"}"#,
    )
    .expect("sqltrigger.json");
}

#[cfg(test)]
mod tests;
