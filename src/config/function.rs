//! One function folder: `function.json` (the host's bindings) and `sqltrigger.json` beside it (what to watch).
//!
//! `sqltrigger.json` is shaped like the official `sqlTrigger` binding (`tableName`, `connectionStringSetting`)
//! plus our additions. String values may reference app settings as `%Name%`, as function.json does.

use super::host_policy::{proof_window, FunctionTimeout, RetryPolicy, UNBOUNDED_TIMEOUT_ASSUMED};
use super::ncrontab::Schedule;
use super::outputs::OutputShapes;
use super::partition::{Partition, Partitioning};
use super::settings::{DeliveryMode, MessageFormat, Resolver, TriggerSettings};
use super::sink_spec::SinkSpec;
use super::source_spec::{resolve_references, resolve_text, source_spec, SourceSpec};
use super::{read_json, valid_path_part, ConfigError, Env};
use serde_json::Value;
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
    "messageFormat",
    "leaseDurationMs",
    "tickTimeoutMs",
    "changeTrackingContext",
    "skipOwnChangesContext",
    "includeMetadata",
    "outputs",
    "sink",
    "onPositionLost",
    "slotName",
    "publicationName",
    "deleteItem",
    "onTruncate",
    "walRetainedWarnMb",
    "reader",
    "streamBufferMb",
    "streamBufferChanges",
    "streamPollMs",
    "streamIdleReleaseMs",
    "partitions",
    "partition",
    "partitionGroup",
    "partitionColumn",
];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputBinding {
    pub name: String,
    /// The binding type as function.json spells it (`queue`, `serviceBus`, `eventHub`, `sql`, `blob`, ...).
    pub kind: String,
}

#[derive(Debug, Clone)]
pub struct FunctionConfig {
    pub name: String,
    pub dir: PathBuf,
    /// The timer trigger binding's name: where the host puts the timer under `Data`.
    pub timer_binding: String,
    pub timer_schedule: Option<String>,
    /// The schedule the host fires on (`%Name%` resolved), when the handler serves the host or an operator's
    /// command reads the app (when it resolves and parses); `None` under `handler run`, which has no timer.
    pub schedule: Option<Schedule>,
    pub outputs: Vec<OutputBinding>,
    pub retry: Option<RetryPolicy>,
    /// Deferred delivery: how long an answered batch stays unproven (see [`proof_window`]).
    pub proof_window: Duration,
    pub source: SourceSpec,
    pub settings: TriggerSettings,
    /// `outputs` in sqltrigger.json: the shape of each output binding it names (the host's bindings deliver).
    pub output_shapes: OutputShapes,
    /// Where the handler delivers itself: the `"sink"` of sqltrigger.json under deliveryMode sink, and under
    /// `handler run` always (stdout when none is named). `None`: the host's output bindings deliver.
    pub sink: Option<SinkSpec>,
    /// How the function's changes are split into partitions (`"partitions"`, `"partition"`, `"partitionGroup"`).
    pub partitioning: Partitioning,
}

impl FunctionConfig {
    /// The configuration of each partition trigger this folder serves: itself when it is not partitioned; else
    /// one per served partition, each reading only its partition's keys, and named `{group}-p{i}` when the
    /// folder serves them all (`handler run`). A generated folder keeps its own name.
    pub fn partition_triggers(&self) -> Vec<FunctionConfig> {
        if !self.partitioning.is_partitioned() {
            return vec![self.clone()];
        }
        let group = &self.partitioning.group;
        self.partitioning
            .served()
            .into_iter()
            .map(|p| {
                let mut f = self.clone();
                if self.partitioning.only.is_none() {
                    f.name = p.function_name(group);
                }
                f.partitioning.only = Some(p.index);
                f.source.partition = Some(p);
                f
            })
            .collect()
    }

    /// The partition this trigger serves: `None` unless the function is partitioned and this is one of its
    /// partition triggers (see [`FunctionConfig::partition_triggers`]).
    pub fn partition(&self) -> Option<Partition> {
        self.source.partition
    }

    /// The name of this trigger's state document under the app (`{app}/{name}.json`): the function's own name,
    /// or for a partition its group's partition name, shared by a generated folder and `handler run`.
    pub fn state_name(&self) -> String {
        match self.partition() {
            Some(p) => p.state_name(&self.partitioning.group),
            None => self.name.clone(),
        }
    }

    /// What each output binding receives (`outputs` in sqltrigger.json over the defaults by binding type).
    pub fn output_routes(&self) -> Vec<super::OutputRoute> {
        super::outputs::routes(&self.outputs, &self.output_shapes)
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
    let mut settings = resolver.trigger_settings(errors);
    // Unset, the tick timeout stays below a short functionTimeout by itself: the handler answers an error the host
    // retries, instead of the host cutting the invocation and restarting the worker.
    if let (true, None, FunctionTimeout::Bounded(limit)) =
        (mode == super::Mode::Host, resolver.raw(&super::settings::TICK_TIMEOUT_MS), function_timeout)
    {
        settings.tick_timeout = settings.tick_timeout.min(limit * 2 / 3);
    }
    let proof_window_ms = resolver.optional_whole(&super::settings::PROOF_WINDOW_MS, 86_400_000, errors);
    let source = source_spec(&options, env, &trig_file, errors);
    let host = mode == super::Mode::Host;
    let kind = source.as_ref().map(super::SourceSpec::kind);
    let partitioning = Partitioning::parse(&options, &name, kind, host, &trig_file, errors);

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
    // The handler delivers itself in sink mode, and under `handler run` always; the sink of a function the
    // host's bindings deliver is never built, so it is not read either.
    let raw_sink = options.get("sink");
    let sink = match raw_sink {
        Some(raw) if !host || settings.delivery_mode == DeliveryMode::Sink => {
            SinkSpec::parse(raw, env).map_err(|e| errors.push(ConfigError::new(format!("sink in {trig_file}"), e))).ok()
        }
        None if !host => Some(SinkSpec::Stdout),
        _ => None,
    };
    let mut output_shapes = OutputShapes::default();
    if settings.delivery_mode == DeliveryMode::Sink {
        // The handler answers no outputs in sink mode: a mapping would silently do nothing.
        if options.contains_key("outputs") {
            errors.push(ConfigError::new(
                format!("outputs in {trig_file}"),
                "has no effect with deliveryMode sink (the handler delivers to its sink and answers no outputs); remove it, or use deferred delivery",
            ));
        }
        // Under the host stdout is the host's log, not a destination.
        if host && matches!((raw_sink, &sink), (None, _) | (_, Some(SinkSpec::Stdout))) {
            errors.push(ConfigError::new(
                format!("sink in {trig_file}"),
                "deliveryMode sink under the Functions host needs a sink to deliver to: add \"sink\": {\"type\": \"postgres\", \"tableName\": ..., \"connectionStringSetting\": ...} (or mssql, webhook)",
            ));
        }
    } else if raw_sink.and_then(|s| s.get("exactlyOnce")) == Some(&Value::Bool(true)) {
        errors.push(ConfigError::new(
            format!("sink in {trig_file}"),
            "exactlyOnce needs deliveryMode sink: the batch's checkpoint is written in the sink's transaction; set \"deliveryMode\": \"sink\"",
        ));
    } else {
        match super::outputs::check(&outputs, options.get("outputs"), &trig_file) {
            Ok(shapes) => output_shapes = shapes,
            Err(problems) => errors.extend(problems),
        }
    }
    let schedule = match (&timer_schedule, host) {
        (Some(text), true) => match resolve_text(text, env)
            .map_err(|missing| format!("the timer's schedule references app setting %{missing}%, which is not set"))
        {
            Ok(resolved) => Schedule::parse(&resolved).map(Some).unwrap_or_else(|e| {
                errors.push(ConfigError::new(fn_file.clone(), format!("{e}; the host would refuse it too")));
                None
            }),
            Err(e) => {
                errors.push(ConfigError::new(fn_file.clone(), e));
                None
            }
        },
        (None, true) => {
            errors.push(ConfigError::new(
                fn_file.clone(),
                "the timerTrigger binding has no \"schedule\" (an NCRONTAB expression such as \"*/5 * * * * *\")",
            ));
            None
        }
        // The state CLI reads a host app's folders to report what its timer allows (status's
        // `ceiling_per_second`); a schedule it cannot read is the host's to refuse, not the operator's command.
        (Some(text), false) if mode == super::Mode::Operator => {
            resolve_text(text, env).ok().and_then(|resolved| Schedule::parse(&resolved).ok())
        }
        (_, false) => None,
    };
    if host && settings.delivery_mode != DeliveryMode::Sink {
        let (blob_errors, blob_warnings) = super::outputs::check_blob_paths(&bindings, env, &fn_file);
        errors.extend(blob_errors);
        warnings.extend(blob_warnings);
        // The host's sql binding upserts JSON objects only and drops strings silently
        // (FunctionBinding.BindAsyncCollectorAsync<JObject>, SqlAsyncCollector.AddAsync): text would write nothing.
        if settings.message_format == MessageFormat::Text {
            if let Some(sql) = outputs.iter().find(|b| b.kind.eq_ignore_ascii_case("sql")) {
                errors.push(ConfigError::new(
                    format!("messageFormat for {name}"),
                    format!(
                        "is text, but output binding {:?} is sql, which takes each row as a JSON object and silently drops strings, so it would write nothing; use messageFormat json for it (values then pass through Newtonsoft, see docs/values.md), or deliveryMode sink with an mssql or postgres sink for exact rows",
                        sql.name
                    ),
                ));
            }
        }
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
        schedule,
        outputs,
        retry,
        proof_window,
        source: source.map(|mut s| {
            s.partition = partitioning.only.map(|index| Partition { index, count: partitioning.count });
            s
        })?,
        settings,
        output_shapes,
        sink,
        partitioning,
    })
}
