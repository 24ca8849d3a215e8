//! Reading one function folder: `function.json` (the host's bindings) and `sqltrigger.json` beside it (what to
//! watch), into a [`FunctionConfig`]. Called once per folder by `AppConfig::load_for` (after `admin::load`
//! has passed it over).
//!
//! `sqltrigger.json` is shaped like the official `sqlTrigger` binding (`tableName`, `connectionStringSetting`)
//! plus our additions. String values may reference app settings as `%Name%`, as function.json does.

use super::env::Env;
use super::error::ConfigError;
use super::function::FunctionConfig;
use super::host_policy::{proof_window, FunctionTimeout, RetryPolicy, UNBOUNDED_TIMEOUT_ASSUMED};
use super::mode::Mode;
use super::names::valid_path_part;
use super::ncrontab::Schedule;
use super::outputs::{OutputBinding, OutputShapes};
use super::partition::{Partition, Partitioning};
use super::settings::{DeliveryMode, MessageFormat, Resolver, TriggerSettings};
use super::sink_spec::SinkSpec;
use super::source_spec::{resolve_references, resolve_text, source_spec};
use serde_json::{Map, Value};
use std::path::Path;
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

/// What every function folder is read against: the app settings, host.json, and who drives the ticks.
#[derive(Debug, Clone, Copy)]
pub(super) struct Context<'a> {
    pub env: &'a Env,
    /// host.json `extensions.sql`.
    pub host_sql: Option<&'a Value>,
    pub function_timeout: FunctionTimeout,
    pub mode: Mode,
}

/// Loads one folder. `None` when the folder is not ours (no sqltrigger.json) or failed (errors recorded).
/// Problems that do not stop it are pushed to `warnings`. The steps run in this order, which is the order the
/// problems are reported in.
pub(super) fn load(
    dir: &Path,
    context: Context<'_>,
    errors: &mut Vec<ConfigError>,
    warnings: &mut Vec<ConfigError>,
) -> Option<FunctionConfig> {
    let name = dir.file_name()?.to_string_lossy().into_owned();
    let folder = Folder {
        fn_file: format!("{name}/function.json"),
        trig_file: format!("{name}/sqltrigger.json"),
        name,
        context,
    };
    let Context { env, function_timeout, .. } = context;
    let before = errors.len();
    let host_bindings = folder.host_bindings(dir, errors)?;
    let options = folder.options(dir, errors)?;
    let (settings, proof_window_ms) = folder.settings(&options, errors);
    let source = source_spec(&options, env, &folder.trig_file, errors);
    let kind = source.as_ref().map(super::SourceSpec::kind);
    let partitioning = Partitioning::parse(&options, &folder.name, kind, folder.hosted(), &folder.trig_file, errors);
    folder.check_host_delivery(host_bindings.retry.as_ref(), &settings, proof_window_ms, errors, warnings);
    let (sink, output_shapes) = folder.delivery(&options, &host_bindings.outputs, &settings, errors);
    let schedule = folder.schedule(host_bindings.timer_schedule.as_ref(), errors);
    folder.check_host_outputs(&host_bindings, &settings, errors, warnings);

    if errors.len() > before {
        return None;
    }
    let HostBindings { timer_binding, timer_schedule, outputs, retry, .. } = host_bindings;
    let proof_window =
        proof_window_ms.map_or_else(|| proof_window(function_timeout, retry.as_ref()), Duration::from_millis);
    Some(FunctionConfig {
        name: folder.name,
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

/// The host's side of a function folder, read from function.json.
struct HostBindings {
    /// Every binding as function.json lists them (blob output paths are checked against them).
    bindings: Vec<Value>,
    timer_binding: String,
    timer_schedule: Option<String>,
    outputs: Vec<OutputBinding>,
    retry: Option<RetryPolicy>,
}

/// The folder being loaded: its name and files (which messages name) and what it is read against. Each step
/// of [`load`] is one method.
struct Folder<'a> {
    name: String,
    fn_file: String,
    trig_file: String,
    context: Context<'a>,
}

impl Folder<'_> {
    /// Whether the Functions host drives this function (`handler serve`).
    fn hosted(&self) -> bool {
        self.context.mode == Mode::Host
    }

    /// function.json: the timer trigger, the output bindings and the retry policy. `None` when the folder is not
    /// ours (no sqltrigger.json) or cannot be (no usable timer).
    fn host_bindings(&self, dir: &Path, errors: &mut Vec<ConfigError>) -> Option<HostBindings> {
        let Folder { name, fn_file, trig_file, .. } = self;
        let function_json = read_json(&dir.join("function.json"), errors, true)?;
        let bindings = function_json.get("bindings").and_then(Value::as_array).cloned().unwrap_or_default();
        let timer = bindings.iter().find(|b| b.get("type").and_then(Value::as_str) == Some("timerTrigger"));

        if !dir.join("sqltrigger.json").is_file() {
            if timer.is_some() {
                errors.push(ConfigError::new(
                    trig_file.clone(),
                    "is missing: this function has a timer trigger for the SQL trigger handler; add sqltrigger.json with tableName and connectionStringSetting",
                ));
            }
            return None;
        }
        if !valid_path_part(name) {
            errors.push(ConfigError::new(
                fn_file.clone(),
                "the folder name may hold only letters, digits, '-', '_' and '.'",
            ));
        }
        let Some(timer) = timer else {
            errors.push(ConfigError::new(
                fn_file.clone(),
                "has no timerTrigger binding; the SQL trigger runs on a timer",
            ));
            return None;
        };
        let timer_schedule = timer.get("schedule").and_then(Value::as_str).map(str::to_string);
        let Some(timer_binding) =
            timer.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()).map(str::to_string)
        else {
            errors.push(ConfigError::new(
                fn_file.clone(),
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
            Some(retry) => Some(RetryPolicy::parse(retry, fn_file, errors)?),
        };
        Some(HostBindings { bindings, timer_binding, timer_schedule, outputs, retry })
    }

    /// sqltrigger.json, with `%Name%` references resolved and unknown keys reported.
    fn options(&self, dir: &Path, errors: &mut Vec<ConfigError>) -> Option<Map<String, Value>> {
        let trig_file = &self.trig_file;
        let raw = read_json(&dir.join("sqltrigger.json"), errors, true)?;
        let Some(raw) = raw.as_object() else {
            errors.push(ConfigError::new(trig_file.clone(), "must be a JSON object"));
            return None;
        };
        let options = resolve_references(raw, self.context.env, trig_file, errors);
        for key in options.keys() {
            if !KNOWN_KEYS.contains(&key.as_str()) {
                errors.push(ConfigError::new(
                    trig_file.clone(),
                    format!("unknown key {key:?}; known keys: {}", KNOWN_KEYS[1..].join(", ")),
                ));
            }
        }
        Some(options)
    }

    /// The effective trigger settings, and the proof window when a setting gives it.
    fn settings(&self, options: &Map<String, Value>, errors: &mut Vec<ConfigError>) -> (TriggerSettings, Option<u64>) {
        let Context { env, host_sql, function_timeout, .. } = self.context;
        let resolver = Resolver { env, host_sql, function: Some((&self.trig_file, options)) };
        let mut settings = resolver.trigger_settings(errors);
        // Unset, the tick timeout stays below a short functionTimeout by itself: the handler answers an error the host
        // retries, instead of the host cutting the invocation and restarting the worker.
        if let (true, None, FunctionTimeout::Bounded(limit)) =
            (self.hosted(), resolver.raw(&super::settings::TICK_TIMEOUT_MS), function_timeout)
        {
            settings.tick_timeout = settings.tick_timeout.min(limit * 2 / 3);
        }
        let proof_window_ms = resolver.optional_whole(&super::settings::PROOF_WINDOW_MS, 86_400_000, errors);
        (settings, proof_window_ms)
    }

    /// What the host's delivery needs: a retry policy that can prove deferred batches delivered, and a tick
    /// timeout below the host's functionTimeout.
    fn check_host_delivery(
        &self,
        retry: Option<&RetryPolicy>,
        settings: &TriggerSettings,
        proof_window_ms: Option<u64>,
        errors: &mut Vec<ConfigError>,
        warnings: &mut Vec<ConfigError>,
    ) {
        let Folder { name, fn_file, trig_file, .. } = self;
        let function_timeout = self.context.function_timeout;
        // Under the host, deferred delivery learns of failed output writes only through retries, and the batch
        // must go somewhere. `handler run` delivers to its own sinks and plays the host's retries itself.
        let host = self.hosted();
        if host && settings.delivery_mode == DeliveryMode::Deferred {
            match retry {
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
                    let one_loop_reaches =
                        r.max_retry_count < 0 || r.max_retry_count >= i64::from(settings.max_attempts);
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
    }

    /// Where the batches go: the sink the handler delivers to itself, or the shape of each host output binding.
    fn delivery(
        &self,
        options: &Map<String, Value>,
        outputs: &[OutputBinding],
        settings: &TriggerSettings,
        errors: &mut Vec<ConfigError>,
    ) -> (Option<SinkSpec>, OutputShapes) {
        let trig_file = &self.trig_file;
        let host = self.hosted();
        // The handler delivers itself in sink mode, and under `handler run` always; the sink of a function the
        // host's bindings deliver is never built, so it is not read either.
        let raw_sink = options.get("sink");
        let sink = match raw_sink {
            Some(raw) if !host || settings.delivery_mode == DeliveryMode::Sink => {
                SinkSpec::parse(raw, self.context.env)
                    .map_err(|e| errors.push(ConfigError::new(format!("sink in {trig_file}"), e)))
                    .ok()
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
            match super::outputs::check(outputs, options.get("outputs"), trig_file) {
                Ok(shapes) => output_shapes = shapes,
                Err(problems) => errors.extend(problems),
            }
        }
        (sink, output_shapes)
    }

    /// The timer's schedule, `%Name%` resolved: required under the host, read if it can be for an operator's
    /// command, unused by `handler run`.
    fn schedule(&self, timer_schedule: Option<&String>, errors: &mut Vec<ConfigError>) -> Option<Schedule> {
        let (fn_file, env) = (&self.fn_file, self.context.env);
        match (timer_schedule, self.hosted()) {
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
            (Some(text), false) if self.context.mode == Mode::Operator => {
                resolve_text(text, env).ok().and_then(|resolved| Schedule::parse(&resolved).ok())
            }
            (_, false) => None,
        }
    }

    /// What the host's output bindings must be for the batches to reach them: blob paths that never overwrite,
    /// text not given to a sql binding, and at least one binding.
    fn check_host_outputs(
        &self,
        host_bindings: &HostBindings,
        settings: &TriggerSettings,
        errors: &mut Vec<ConfigError>,
        warnings: &mut Vec<ConfigError>,
    ) {
        let Folder { name, fn_file, .. } = self;
        let HostBindings { bindings, outputs, .. } = host_bindings;
        let host = self.hosted();
        if host && settings.delivery_mode != DeliveryMode::Sink {
            let (blob_errors, blob_warnings) = super::outputs::check_blob_paths(bindings, self.context.env, fn_file);
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
    }
}

/// A JSON file, or `None` with the reason recorded (a missing file only when `required`). Reads host.json for
/// `AppConfig::load_for` and each folder's files here.
pub(super) fn read_json(path: &Path, errors: &mut Vec<ConfigError>, required: bool) -> Option<serde_json::Value> {
    match std::fs::read(path) {
        Ok(bytes) => match serde_json::from_slice(&bytes) {
            Ok(v) => Some(v),
            Err(e) => {
                errors.push(ConfigError::new(path.display().to_string(), format!("is not valid JSON: {e}")));
                None
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !required => None,
        Err(e) => {
            errors.push(ConfigError::new(path.display().to_string(), format!("cannot be read: {e}")));
            None
        }
    }
}
