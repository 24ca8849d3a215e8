//! One function folder: `function.json` (the host's bindings) and `sqltrigger.json` beside it (what to watch).
//!
//! `sqltrigger.json` is shaped like the official `sqlTrigger` binding (`tableName`, `connectionStringSetting`)
//! plus our additions. String values may reference app settings as `%Name%`, as function.json does.

use super::settings::{DeliveryMode, Resolver, TriggerSettings};
use super::{read_json, valid_path_part, ConfigError, Env, Secret};
use crate::ident::{Ident, TableName};
use crate::source::StartFrom;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Keys `sqltrigger.json` understands; anything else is a typo worth reporting.
const KNOWN_KEYS: &[&str] = &[
    "$schema",
    "source",
    "tableName",
    "connectionStringSetting",
    "cursorColumn",
    "cursorGuard",
    "safetyLagMs",
    "insertedColumn",
    "softDeleteColumn",
    "primaryKey",
    "columns",
    "startFrom",
    "maxBatchSize",
    "pollingIntervalMs",
    "maxChangesPerWorker",
    "maxAttempts",
    "poisonAfterMs",
    "poisonAction",
    "proofWindowMs",
    "deliveryMode",
    "leaseDurationMs",
    "tickTimeoutMs",
    "changeTrackingContext",
    "skipOwnChangesContext",
    "includeMetadata",
    "outputs",
    "sink",
    "onPositionLost",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// PostgreSQL table polled by a cursor column plus primary key.
    PostgresCursor,
    /// SQL Server / Azure SQL change tracking (the official trigger's mechanism).
    MssqlChangeTracking,
    /// SQL Server table polled by a rowversion column below MIN_ACTIVE_ROWVERSION().
    MssqlRowversion,
}

impl SourceKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::PostgresCursor => "postgres-cursor",
            Self::MssqlChangeTracking => "mssql-change-tracking",
            Self::MssqlRowversion => "mssql-rowversion",
        }
    }
}

/// What to watch and how; the source module interprets the optional parts for its kind.
#[derive(Debug, Clone)]
pub struct SourceSpec {
    pub kind: SourceKind,
    pub table: TableName,
    pub connection_setting: String,
    pub connection: Secret,
    pub cursor_column: Option<Ident>,
    /// `xid8`, `lag` or `none`; the source picks a default from the cursor column's type.
    pub cursor_guard: Option<String>,
    pub safety_lag: Duration,
    pub inserted_column: Option<Ident>,
    pub soft_delete_column: Option<Ident>,
    pub primary_key: Option<Vec<Ident>>,
    pub columns: Option<Vec<Ident>>,
    pub start_from: StartFrom,
    /// The whole resolved `sqltrigger.json`, for kind-specific options.
    pub options: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputBinding {
    pub name: String,
    /// The binding type as function.json spells it (`queue`, `serviceBus`, `eventHub`, `sql`, `blob`, ...).
    pub kind: String,
}

/// function.json's `retry`, as the host reads it (azure-functions-host `RetryPolicy`: `fixedDelay` with
/// `delayInterval`, `exponentialBackoff` with `minimumInterval` and `maximumInterval`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    pub strategy: RetryStrategy,
    /// -1 means forever.
    pub max_retry_count: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryStrategy {
    /// The same delay before every retry.
    FixedDelay { delay: Duration },
    /// A randomized delay that doubles from `minimum`, never above `maximum` (azure-webjobs-sdk
    /// `ExponentialBackoffRetryAttribute` over `RandomizedExponentialBackoffStrategy`).
    ExponentialBackoff { minimum: Duration, maximum: Duration },
}

impl RetryPolicy {
    /// A fixed-delay policy (tests).
    pub fn fixed(max_retry_count: i64, delay: Duration) -> Self {
        Self { strategy: RetryStrategy::FixedDelay { delay }, max_retry_count }
    }

    /// The longest the host may wait between a failed attempt and its retry.
    pub fn max_delay(&self) -> Duration {
        match self.strategy {
            RetryStrategy::FixedDelay { delay } => delay,
            RetryStrategy::ExponentialBackoff { maximum, .. } => maximum,
        }
    }

    /// Reads function.json's `retry` object; every problem is reported against `file`.
    pub fn parse(retry: &Value, file: &str, errors: &mut Vec<ConfigError>) -> Option<Self> {
        let setting = |key: &str| format!("retry.{key} in {file}");
        let before = errors.len();
        let max_retry_count = match retry.get("maxRetryCount").and_then(Value::as_i64) {
            Some(n) if n >= -1 => n,
            _ => {
                errors.push(ConfigError::new(setting("maxRetryCount"), "must be a whole number, -1 for unlimited"));
                0
            }
        };
        let mut interval = |key: &str| match retry.get(key).and_then(Value::as_str).map(parse_timespan) {
            Some(Some(d)) => d,
            _ => {
                errors.push(ConfigError::new(setting(key), "must be a timespan like \"00:00:05\""));
                Duration::ZERO
            }
        };
        let strategy = match retry.get("strategy").and_then(Value::as_str) {
            Some(s) if s.eq_ignore_ascii_case("fixedDelay") => {
                RetryStrategy::FixedDelay { delay: interval("delayInterval") }
            }
            Some(s) if s.eq_ignore_ascii_case("exponentialBackoff") => {
                let (minimum, maximum) = (interval("minimumInterval"), interval("maximumInterval"));
                if minimum > maximum {
                    errors.push(ConfigError::new(setting("minimumInterval"), "must not be above maximumInterval"));
                }
                RetryStrategy::ExponentialBackoff { minimum, maximum }
            }
            _ => {
                errors.push(ConfigError::new(setting("strategy"), "must be fixedDelay or exponentialBackoff"));
                return None;
            }
        };
        (errors.len() == before).then_some(Self { strategy, max_retry_count })
    }
}

/// Parses a .NET TimeSpan as function.json and host.json write one: `hh:mm:ss[.fff]` or `d.hh:mm:ss[.fff]`.
pub fn parse_timespan(text: &str) -> Option<Duration> {
    let text = text.trim();
    let (days, clock) = match text.split_once('.') {
        Some((days, clock)) if clock.contains(':') => (days.parse::<u64>().ok()?, clock),
        _ => (0, text),
    };
    let parts: Vec<&str> = clock.split(':').collect();
    let [h, m, s] = parts.as_slice() else {
        return None;
    };
    let seconds: f64 = s.parse().ok()?;
    if !seconds.is_finite() || seconds < 0.0 {
        return None;
    }
    let whole = days * 86_400 + h.parse::<u64>().ok()? * 3_600 + m.parse::<u64>().ok()? * 60;
    Some(Duration::from_secs(whole) + Duration::from_secs_f64(seconds))
}

/// host.json's `functionTimeout`: how long the host lets an invocation run before it restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FunctionTimeout {
    /// Set in host.json, or the plan's default.
    Bounded(Duration),
    /// `-1`: no limit (Premium and Dedicated plans allow it).
    Unbounded,
}

impl FunctionTimeout {
    /// The plan's default when host.json sets none: 5 minutes on Consumption (`WEBSITE_SKU=Dynamic`), 30 on
    /// Flex Consumption, Premium and Dedicated (learn.microsoft.com, "Function app timeout duration").
    pub fn plan_default(env: &Env) -> Self {
        match env.get("WEBSITE_SKU") {
            Some(sku) if sku.eq_ignore_ascii_case("Dynamic") => Self::Bounded(Duration::from_secs(5 * 60)),
            _ => Self::Bounded(Duration::from_secs(30 * 60)),
        }
    }
}

/// How long an answer stays unproven: the host's longest path from an answer to the retry that reports its
/// failure (see `trigger::proof`). Without a bound on the invocation, 30 minutes are assumed.
pub fn proof_window(timeout: FunctionTimeout, retry: Option<&RetryPolicy>) -> Duration {
    let invocation = match timeout {
        FunctionTimeout::Bounded(d) => d,
        FunctionTimeout::Unbounded => UNBOUNDED_TIMEOUT_ASSUMED,
    };
    invocation + retry.map_or(Duration::ZERO, RetryPolicy::max_delay) + crate::engine::PROOF_SLACK
}

/// What the proof window assumes of an invocation when host.json's functionTimeout is `-1`.
pub const UNBOUNDED_TIMEOUT_ASSUMED: Duration = Duration::from_secs(30 * 60);

#[derive(Debug, Clone)]
pub struct FunctionConfig {
    pub name: String,
    pub dir: PathBuf,
    /// The timer trigger binding's name: where the host puts the timer under `Data`.
    pub timer_binding: String,
    pub timer_schedule: Option<String>,
    pub outputs: Vec<OutputBinding>,
    pub retry: Option<RetryPolicy>,
    /// Deferred delivery: how long an answered batch stays unproven (see [`proof_window`]).
    pub proof_window: Duration,
    pub source: SourceSpec,
    pub settings: TriggerSettings,
}

impl FunctionConfig {
    /// What each output binding receives (`outputs` in sqltrigger.json over the defaults by binding type).
    /// Checked at load, so the fallback to the defaults is never taken for a loaded configuration.
    pub fn output_routes(&self) -> Vec<super::OutputRoute> {
        let file = format!("{}/sqltrigger.json", self.name);
        super::outputs::routes(&self.outputs, &self.source.options, &file)
            .or_else(|_| super::outputs::routes(&self.outputs, &Map::new(), &file))
            .unwrap_or_default()
    }
}

/// The HTTP-triggered function that serves the admin routes (`sqltrigger.json` = `{"admin": true}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminFunction {
    pub name: String,
    /// The httpTrigger binding's name: where the request arrives in `Data`.
    pub request_binding: String,
    /// The http output binding's name (`$return` answers through `ReturnValue`).
    pub response_binding: String,
}

/// Loads a folder if it is the admin function. `None` when it is not (or failed: errors recorded).
pub(super) fn load_admin(dir: &Path, errors: &mut Vec<ConfigError>) -> Option<AdminFunction> {
    let name = dir.file_name()?.to_string_lossy().into_owned();
    let trig = std::fs::read(dir.join("sqltrigger.json")).ok()?;
    let trig: Value = serde_json::from_slice(&trig).ok()?;
    if trig.get("admin") != Some(&Value::Bool(true)) {
        return None;
    }
    let fn_file = format!("{name}/function.json");
    let function_json = read_json(&dir.join("function.json"), errors, true)?;
    let bindings = function_json.get("bindings").and_then(Value::as_array).cloned().unwrap_or_default();
    let text = |b: &Value, k: &str| b.get(k).and_then(Value::as_str).map(str::to_string);
    let Some(http) = bindings.iter().find(|b| text(b, "type").as_deref() == Some("httpTrigger")) else {
        errors.push(ConfigError::new(fn_file, "is marked admin in sqltrigger.json but has no httpTrigger binding"));
        return None;
    };
    let auth = text(http, "authLevel").unwrap_or_else(|| "function".into()).to_ascii_lowercase();
    if auth == "anonymous" {
        errors.push(ConfigError::new(
            fn_file,
            "serves the admin routes with authLevel anonymous: anyone could pause or reset triggers; set \"authLevel\": \"function\" (or admin) so function keys protect them",
        ));
        return None;
    }
    let response = bindings
        .iter()
        .find(|b| text(b, "type").as_deref() == Some("http") && text(b, "direction").as_deref() == Some("out"))
        .and_then(|b| text(b, "name"));
    let Some(response_binding) = response else {
        errors.push(ConfigError::new(fn_file, "has no http output binding for the admin answers; add {\"type\": \"http\", \"direction\": \"out\", \"name\": \"res\"}"));
        return None;
    };
    Some(AdminFunction { name, request_binding: text(http, "name").unwrap_or_else(|| "req".into()), response_binding })
}

/// What every function folder is read against: the app settings, host.json, and who drives the ticks.
#[derive(Debug, Clone, Copy)]
pub(super) struct Context<'a> {
    pub env: &'a Env,
    /// host.json `extensions.sql`.
    pub host_sql: Option<&'a Value>,
    pub function_timeout: FunctionTimeout,
    pub mode: super::Mode,
}

/// Loads one folder. `None` when the folder is not ours (no sqltrigger.json) or failed (errors recorded).
/// Problems that do not stop it are pushed to `warnings`.
pub(super) fn load(
    dir: &Path,
    context: Context<'_>,
    errors: &mut Vec<ConfigError>,
    warnings: &mut Vec<ConfigError>,
) -> Option<FunctionConfig> {
    let Context { env, host_sql, function_timeout, mode } = context;
    let name = dir.file_name()?.to_string_lossy().into_owned();
    let fn_file = format!("{name}/function.json");
    let trig_file = format!("{name}/sqltrigger.json");
    let before = errors.len();
    let function_json = read_json(&dir.join("function.json"), errors, true)?;
    let bindings = function_json.get("bindings").and_then(Value::as_array).cloned().unwrap_or_default();
    let timer = bindings.iter().find(|b| b.get("type").and_then(Value::as_str) == Some("timerTrigger"));

    if !dir.join("sqltrigger.json").is_file() {
        if timer.is_some() {
            errors.push(ConfigError::new(
                trig_file,
                "is missing: this function has a timer trigger for the SQL trigger handler; add sqltrigger.json with tableName and connectionStringSetting",
            ));
        }
        return None;
    }
    if !valid_path_part(&name) {
        errors
            .push(ConfigError::new(fn_file.clone(), "the folder name may hold only letters, digits, '-', '_' and '.'"));
    }
    let Some(timer) = timer else {
        errors.push(ConfigError::new(fn_file, "has no timerTrigger binding; the SQL trigger runs on a timer"));
        return None;
    };
    let timer_schedule = timer.get("schedule").and_then(Value::as_str).map(str::to_string);
    let Some(timer_binding) = timer.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).map(str::to_string)
    else {
        errors.push(ConfigError::new(
            fn_file,
            "the timerTrigger binding has no \"name\"; the host needs one (\"timer\")",
        ));
        return None;
    };
    let outputs: Vec<OutputBinding> = bindings
        .iter()
        .filter(|b| b.get("direction").and_then(Value::as_str) == Some("out"))
        .filter_map(|b| {
            Some(OutputBinding {
                name: b.get("name")?.as_str()?.to_string(),
                kind: b.get("type").and_then(Value::as_str).unwrap_or("").to_string(),
            })
        })
        .collect();
    let retry = match function_json.get("retry") {
        None | Some(Value::Null) => None,
        Some(retry) => Some(RetryPolicy::parse(retry, &fn_file, errors)?),
    };

    let raw = read_json(&dir.join("sqltrigger.json"), errors, true)?;
    let Some(raw) = raw.as_object() else {
        errors.push(ConfigError::new(trig_file, "must be a JSON object"));
        return None;
    };
    let options = resolve_references(raw, env, &trig_file, errors);
    for key in options.keys() {
        if !KNOWN_KEYS.contains(&key.as_str()) {
            errors.push(ConfigError::new(
                trig_file.clone(),
                format!("unknown key {key:?}; known keys: {}", KNOWN_KEYS[1..].join(", ")),
            ));
        }
    }

    let resolver = Resolver { env, host_sql, function: Some((&trig_file, &options)) };
    let settings = resolver.trigger_settings(errors);
    let proof_window_ms = resolver.optional_whole(&super::settings::PROOF_WINDOW_MS, 86_400_000, errors);
    let source = source_spec(&options, env, &trig_file, errors);

    // Under the host, deferred delivery learns of failed output writes only through retries, and the batch
    // must go somewhere. `handler run` delivers to its own sinks and plays the host's retries itself.
    let host = mode == super::Mode::Host;
    if host && settings.delivery_mode == DeliveryMode::Deferred {
        match &retry {
            None => errors.push(ConfigError::new(
                fn_file.clone(),
                "has no retry policy, which deferred delivery needs: the host tells the handler that an output write failed only by retrying. Add \"retry\": {\"strategy\": \"exponentialBackoff\", \"maxRetryCount\": 5, \"minimumInterval\": \"00:00:05\", \"maximumInterval\": \"00:05:00\"}, or set deliveryMode to sink",
            )),
            Some(r) if r.max_retry_count == 0 => errors.push(ConfigError::new(
                fn_file.clone(),
                "retry.maxRetryCount is 0: every answer would be the host's final attempt, whose failure nobody reports, so no batch could ever be proven delivered; deferred delivery needs at least one retry (or -1 for unlimited)",
            )),
            Some(r) => {
                // The issue this guards against: counted per host retry, one firing's retry loop alone could
                // reach MaxAttempts, so an outage of a few delays would quarantine a healthy batch.
                let one_loop_reaches = r.max_retry_count < 0 || r.max_retry_count >= i64::from(settings.max_attempts);
                if settings.poison_after.is_zero() && one_loop_reaches {
                    warnings.push(ConfigError::new(
                        format!("{fn_file} and {trig_file}"),
                        format!(
                            "the host's retry loop of one firing (maxRetryCount {}) can reach Sql_Trigger_MaxAttempts ({}) by itself while Sql_Trigger_PoisonAfterMs is 0: an outage of the output binding's service lasting {} retry delays would quarantine a healthy batch; set Sql_Trigger_PoisonAfterMs (default 600000) or raise Sql_Trigger_MaxAttempts",
                            r.max_retry_count, settings.max_attempts, settings.max_attempts
                        ),
                    ));
                }
                if function_timeout == FunctionTimeout::Unbounded && proof_window_ms.is_none() {
                    warnings.push(ConfigError::new(
                        "host.json functionTimeout",
                        format!(
                            "is -1 (no limit): deferred delivery proves a batch written once no retry can still name it, and without a bound on an invocation it assumes {} min; set functionTimeout (for example \"00:10:00\") so that bound is the host's own",
                            UNBOUNDED_TIMEOUT_ASSUMED.as_secs() / 60
                        ),
                    ));
                }
            }
        }
    }
    if let (true, FunctionTimeout::Bounded(limit)) = (host, function_timeout) {
        if settings.tick_timeout >= limit {
            warnings.push(ConfigError::new(
                format!("Sql_Trigger_TickTimeoutMs for {name}"),
                format!(
                    "is {} ms, not below host.json functionTimeout ({} s): the host would cut a slow invocation first and restart, instead of the handler answering an error it can explain; lower it (or raise functionTimeout)",
                    settings.tick_timeout.as_millis(),
                    limit.as_secs()
                ),
            ));
        }
    }
    if settings.delivery_mode == DeliveryMode::Sink {
        // The handler answers no outputs in sink mode: a mapping would silently do nothing.
        if options.contains_key("outputs") {
            errors.push(ConfigError::new(
                format!("outputs in {trig_file}"),
                "has no effect with deliveryMode sink (the handler delivers to its sink and answers no outputs); remove it, or use deferred delivery",
            ));
        }
        // Under the host stdout is the host's log, not a destination.
        let sink_type = options.get("sink").map(|s| s.get("type").and_then(Value::as_str).unwrap_or(""));
        if host && matches!(sink_type, None | Some("stdout")) {
            errors.push(ConfigError::new(
                format!("sink in {trig_file}"),
                "deliveryMode sink under the Functions host needs a sink to deliver to: add \"sink\": {\"type\": \"postgres\", \"tableName\": ..., \"connectionStringSetting\": ...} (or mssql, webhook)",
            ));
        }
    } else if options.get("sink").and_then(|s| s.get("exactlyOnce")) == Some(&Value::Bool(true)) {
        errors.push(ConfigError::new(
            format!("sink in {trig_file}"),
            "exactlyOnce needs deliveryMode sink: the batch's checkpoint is written in the sink's transaction; set \"deliveryMode\": \"sink\"",
        ));
    } else if let Err(problems) = super::outputs::routes(&outputs, &options, &trig_file) {
        errors.extend(problems);
    }
    if host && settings.delivery_mode != DeliveryMode::Sink && outputs.is_empty() {
        errors.push(ConfigError::new(
            fn_file.clone(),
            "has no output binding to receive the changes; add one (queue, serviceBus, eventHub, sql, blob) or set deliveryMode to sink",
        ));
    }

    if errors.len() > before {
        return None;
    }
    let proof_window =
        proof_window_ms.map_or_else(|| proof_window(function_timeout, retry.as_ref()), Duration::from_millis);
    Some(FunctionConfig {
        name,
        dir: dir.to_path_buf(),
        timer_binding,
        timer_schedule,
        outputs,
        retry,
        proof_window,
        source: source?,
        settings,
    })
}

fn source_spec(o: &Map<String, Value>, env: &Env, file: &str, errors: &mut Vec<ConfigError>) -> Option<SourceSpec> {
    let text = |k: &str| o.get(k).and_then(Value::as_str).map(str::to_string);
    let mut problem = |key: &str, msg: String| errors.push(ConfigError::new(format!("{key} in {file}"), msg));

    let kind = match text("source").as_deref().unwrap_or("mssql-change-tracking") {
        "postgres-cursor" | "postgres" => SourceKind::PostgresCursor,
        "mssql-change-tracking" | "mssql" => SourceKind::MssqlChangeTracking,
        "mssql-rowversion" => SourceKind::MssqlRowversion,
        other => {
            problem(
                "source",
                format!("{other:?} is not a source; use mssql-change-tracking, mssql-rowversion or postgres-cursor"),
            );
            return None;
        }
    };
    let table = match text("tableName").map(|t| TableName::parse(&t)) {
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => {
            problem("tableName", e);
            None
        }
        None => {
            problem("tableName", "is required (the table to watch, e.g. dbo.Orders)".into());
            None
        }
    };
    let connection_setting = text("connectionStringSetting");
    let connection = match &connection_setting {
        Some(s) => match env.get(s) {
            Some(v) => Some(Secret::new(v)),
            None => {
                problem(
                    "connectionStringSetting",
                    format!("names app setting {s:?}, which is not set; add it to the app settings (Values in local.settings.json)"),
                );
                None
            }
        },
        None => {
            problem(
                "connectionStringSetting",
                "is required: the name of the app setting that holds the connection string".into(),
            );
            None
        }
    };
    let ident = |key: &str, problem: &mut dyn FnMut(&str, String)| -> Option<Ident> {
        let v = o.get(key)?;
        match v.as_str().map(Ident::new) {
            Some(Ok(i)) => Some(i),
            Some(Err(e)) => {
                problem(key, e);
                None
            }
            None => {
                problem(key, "must be a column name (a string)".into());
                None
            }
        }
    };
    let ident_list = |key: &str, problem: &mut dyn FnMut(&str, String)| -> Option<Vec<Ident>> {
        let v = o.get(key)?;
        let items: Option<Vec<&str>> = v.as_array().map(|a| a.iter().filter_map(Value::as_str).collect());
        match items {
            Some(items) if !items.is_empty() && items.len() == v.as_array().map_or(0, Vec::len) => {
                let mut out = Vec::new();
                for i in items {
                    match Ident::new(i) {
                        Ok(i) => out.push(i),
                        Err(e) => problem(key, e),
                    }
                }
                Some(out)
            }
            _ => {
                problem(key, "must be a non-empty array of column names".into());
                None
            }
        }
    };
    let cursor_column = ident("cursorColumn", &mut problem);
    let inserted_column = ident("insertedColumn", &mut problem);
    let soft_delete_column = ident("softDeleteColumn", &mut problem);
    let primary_key = ident_list("primaryKey", &mut problem);
    let columns = ident_list("columns", &mut problem);
    let cursor_guard = text("cursorGuard");
    if let Some(g) = &cursor_guard {
        if !matches!(g.as_str(), "xid8" | "lag" | "none") {
            problem("cursorGuard", format!("{g:?} is not a guard; use xid8, lag or none"));
        }
    }
    let safety_lag = match o.get("safetyLagMs") {
        None => Duration::from_millis(5000),
        Some(v) => match v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())) {
            Some(ms) if ms <= 86_400_000 => Duration::from_millis(ms),
            _ => {
                problem("safetyLagMs", format!("must be milliseconds from 0 to 86400000, got {v}"));
                Duration::ZERO
            }
        },
    };
    let start_from = match text("startFrom").as_deref() {
        None | Some("earliest") => StartFrom::Earliest,
        Some("now") => StartFrom::Now,
        // The SQL Server change-tracking source walks the table first, then follows changes; it reads the
        // option itself, and to the engine the start is "before everything".
        Some("snapshot") if kind == SourceKind::MssqlChangeTracking => StartFrom::Earliest,
        Some("snapshot") => {
            problem("startFrom", "snapshot is available for mssql-change-tracking only; use earliest or now".into());
            StartFrom::Earliest
        }
        Some(other) => {
            problem(
                "startFrom",
                format!("{other:?} is not a start; use earliest, now or (SQL Server change tracking) snapshot"),
            );
            StartFrom::Earliest
        }
    };
    if kind == SourceKind::PostgresCursor && cursor_column.is_none() && o.get("cursorColumn").is_none() {
        problem("cursorColumn", "is required for postgres-cursor: an xid8 (recommended), bigint or timestamp column that every insert and update sets".into());
    }
    Some(SourceSpec {
        kind,
        table: table?,
        connection_setting: connection_setting?,
        connection: connection?,
        cursor_column,
        cursor_guard,
        safety_lag,
        inserted_column,
        soft_delete_column,
        primary_key,
        columns,
        start_from,
        options: o.clone(),
    })
}

/// Replaces `%Name%` in every string value with the app setting's value. Connection strings are never
/// resolved this way into the spec (they come through connectionStringSetting), so no secret is copied.
fn resolve_references(
    raw: &Map<String, Value>,
    env: &Env,
    file: &str,
    errors: &mut Vec<ConfigError>,
) -> Map<String, Value> {
    fn walk(v: &Value, env: &Env, key: &str, file: &str, errors: &mut Vec<ConfigError>) -> Value {
        match v {
            Value::String(s) => Value::String(resolve_text(s, env).unwrap_or_else(|missing| {
                errors.push(ConfigError::new(
                    format!("{key} in {file}"),
                    format!("references app setting %{missing}%, which is not set"),
                ));
                s.clone()
            })),
            Value::Array(a) => Value::Array(a.iter().map(|x| walk(x, env, key, file, errors)).collect()),
            Value::Object(m) => {
                Value::Object(m.iter().map(|(k, x)| (k.clone(), walk(x, env, key, file, errors))).collect())
            }
            other => other.clone(),
        }
    }
    raw.iter().map(|(k, v)| (k.clone(), walk(v, env, k, file, errors))).collect()
}

fn resolve_text(s: &str, env: &Env) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find('%') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('%') else { break };
        let name = &after[..end];
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':')) {
            out.push_str(&rest[..=start]);
            rest = after;
            continue;
        }
        out.push_str(&rest[..start]);
        out.push_str(env.get(name).ok_or_else(|| name.to_string())?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_app_setting_references() {
        let env = Env::from_pairs([("Table".to_string(), "dbo.Orders".to_string())]);
        assert_eq!(resolve_text("%Table%", &env).expect("resolves"), "dbo.Orders");
        assert_eq!(resolve_text("x-%Table%-y", &env).expect("resolves"), "x-dbo.Orders-y");
        assert_eq!(resolve_text("100%", &env).expect("no reference"), "100%");
        assert_eq!(resolve_text("%Missing%", &env).unwrap_err(), "Missing");
    }
}
