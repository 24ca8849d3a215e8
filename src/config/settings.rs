//! The app settings this handler reads: one table of definitions (names, defaults, meaning) that both the
//! parser and the generated configuration reference (`handler settings`, docs/configuration.md) use, so the
//! documentation cannot drift from the code.
//!
//! Precedence for trigger settings, highest first: the function's `sqltrigger.json`, the app setting,
//! host.json `extensions.sql.<camelCase>`, the default. The official trigger's names and defaults are kept.

use super::{ConfigError, Env};
use serde_json::Value;
use std::time::Duration;

/// One documented setting.
#[derive(Debug, Clone, Copy)]
pub struct SettingDef {
    /// The app setting (environment variable) name.
    pub name: &'static str,
    /// The `sqltrigger.json` key that overrides it per function, if any.
    pub function_key: Option<&'static str>,
    /// The host.json `extensions.sql` key, for the official trigger's settings.
    pub host_json_key: Option<&'static str>,
    pub default: &'static str,
    pub doc: &'static str,
}

pub const MAX_BATCH_SIZE: SettingDef = SettingDef {
    name: "Sql_Trigger_MaxBatchSize",
    function_key: Some("maxBatchSize"),
    host_json_key: Some("maxBatchSize"),
    default: "100",
    doc: "Most changes delivered by one invocation. Deprecated alias: Sql_Trigger_BatchSize.",
};
pub const BATCH_SIZE_ALIAS: &str = "Sql_Trigger_BatchSize";
pub const POLLING_INTERVAL_MS: SettingDef = SettingDef {
    name: "Sql_Trigger_PollingIntervalMs",
    function_key: Some("pollingIntervalMs"),
    host_json_key: Some("pollingIntervalMs"),
    default: "1000",
    doc: "Pause between ticks in `handler run` when the last batch was not full. Under the Functions host the timer schedule sets the pace.",
};
pub const MAX_CHANGES_PER_WORKER: SettingDef = SettingDef {
    name: "Sql_Trigger_MaxChangesPerWorker",
    function_key: Some("maxChangesPerWorker"),
    host_json_key: Some("maxChangesPerWorker"),
    default: "1000",
    doc: "Pending changes one worker is expected to handle; status reports ceil(pending / this) as target workers.",
};
pub const MAX_ATTEMPTS: SettingDef = SettingDef {
    name: "Sql_Trigger_MaxAttempts",
    function_key: Some("maxAttempts"),
    host_json_key: None,
    default: "5",
    doc: "Known failures of one batch (a host retry naming the attempt that carried it, a sink's refusal) before it may be a poison batch, together with Sql_Trigger_PoisonAfterMs (see Sql_Trigger_PoisonAction).",
};
pub const POISON_AFTER_MS: SettingDef = SettingDef {
    name: "Sql_Trigger_PoisonAfterMs",
    function_key: Some("poisonAfterMs"),
    host_json_key: None,
    default: "600000",
    doc: "Under the Functions host (deferred delivery): a batch is poison only once its failures have lasted this long since the first, besides numbering Sql_Trigger_MaxAttempts, so an outage of the output binding's service shorter than this never quarantines a healthy batch. 0: the count alone decides.",
};
pub const PROOF_WINDOW_MS: SettingDef = SettingDef {
    name: "Sql_Trigger_ProofWindowMs",
    function_key: Some("proofWindowMs"),
    host_json_key: None,
    default: "host.json functionTimeout + the retry policy's longest delay + 30 s",
    doc: "Deferred delivery: how long after its last answer a batch counts as written when no retry has named it (the checkpoint then moves past it). The default is the longest the host can take to report a failed write; until then a restart re-delivers the batch. Shorter means fewer duplicates after a restart, but a batch whose failure the host reports later than this, in a host that restarts before retrying it, would be lost. 0 is for tests.",
};
pub const POISON_ACTION: SettingDef = SettingDef {
    name: "Sql_Trigger_PoisonAction",
    function_key: Some("poisonAction"),
    host_json_key: None,
    default: "quarantine",
    doc: "`quarantine`: write the poison batch to a quarantine document, log an error naming it, count it and move on. `halt`: stop the function at that batch until an operator acts.",
};
pub const DELIVERY_MODE: SettingDef = SettingDef {
    name: "Sql_Trigger_DeliveryMode",
    function_key: Some("deliveryMode"),
    host_json_key: None,
    default: "deferred",
    doc: "`deferred`: a batch is acknowledged only when a retry naming its invocation could no longer come (at-least-once through the host's output bindings; needs a retry policy in function.json; docs/architecture.md). `immediate`: committed before answering (at-most-once if the host's output write fails). `sink`: delivered by the handler itself, committed after the sink acknowledges (at-least-once).",
};
pub const MESSAGE_FORMAT: SettingDef = SettingDef {
    name: "Sql_Trigger_MessageFormat",
    function_key: Some("messageFormat"),
    host_json_key: None,
    default: "json",
    doc: "How each message (or blob) is handed to the host's output bindings. `json`: the official payload as JSON values, which the host re-reads with Newtonsoft: decimals become doubles (at most 17 digits, 120.00 arrives as 120.0), date-time strings with an offset are moved to the host's zone, messages are re-indented (docs/values.md). `text`: each message is the JSON text the handler built, sent as a string the host passes through untouched: the same payload shape, compact, every value exact. Not for sql output bindings, which take objects only; for exact rows use deliveryMode sink.",
};
pub const LEASE_DURATION_MS: SettingDef = SettingDef {
    name: "Sql_Trigger_LeaseDurationMs",
    function_key: Some("leaseDurationMs"),
    host_json_key: None,
    default: "60000",
    doc: "How long a batch in flight belongs to the instance that fetched it before another instance may take it over and re-deliver it.",
};
pub const TICK_TIMEOUT_MS: SettingDef = SettingDef {
    name: "Sql_Trigger_TickTimeoutMs",
    function_key: Some("tickTimeoutMs"),
    host_json_key: None,
    default: "240000",
    doc: "Longest one invocation may work before it gives up and answers an error. Unset under the host with a bounded host.json functionTimeout: two thirds of functionTimeout when that is below the default, so the handler answers before the host cuts the invocation.",
};
pub const STATE_STORE: SettingDef = SettingDef {
    name: "Sql_Trigger_StateStore",
    function_key: None,
    host_json_key: None,
    default: "blob",
    doc: "`blob`: state in Azure Blob Storage through AzureWebJobsStorage (connection string or identity-based). `file`: state in Sql_Trigger_StateDirectory on local disk (one machine only).",
};
pub const STATE_DIRECTORY: SettingDef = SettingDef {
    name: "Sql_Trigger_StateDirectory",
    function_key: None,
    host_json_key: None,
    default: ".sql-pseudo-trigger",
    doc: "Directory of the file state store, relative to the app root.",
};
pub const STATE_CONTAINER: SettingDef = SettingDef {
    name: "Sql_Trigger_StateContainer",
    function_key: None,
    host_json_key: None,
    default: "sql-pseudo-trigger",
    doc: "Blob container that holds the state documents.",
};
pub const APP_NAME: SettingDef = SettingDef {
    name: "Sql_Trigger_AppName",
    function_key: None,
    host_json_key: None,
    default: "WEBSITE_SITE_NAME, else `local`",
    doc: "Name space of the state documents (`{app}/{function}.json`). Set it explicitly to keep state across app renames and slot swaps.",
};
pub const LOG_LEVEL: SettingDef = SettingDef {
    name: "Sql_Trigger_LogLevel",
    function_key: None,
    host_json_key: None,
    default: "info",
    doc: "Log level: the Functions host's names (`Trace`, `Debug`, `Information`, `Warning`, `Error`, `Critical`, `None`, any case) or tracing's (`trace`, `debug`, `info`, `warn`, `error`, `off`), optionally with per-module directives (`info,sql_pseudo_trigger=debug`). Any other value stops the handler at start-up. RUST_LOG (tracing EnvFilter syntax) wins when set.",
};

/// A level word as tracing's filter spells it: the Functions host's names (host.json `logging.logLevel`) and
/// tracing's own, any case. `Critical` has no tracing level above error, so it is error.
fn level_word(word: &str) -> Option<&'static str> {
    match word.trim().to_ascii_lowercase().as_str() {
        "trace" => Some("trace"),
        "debug" => Some("debug"),
        "information" | "info" => Some("info"),
        "warning" | "warn" => Some("warn"),
        "error" | "critical" => Some("error"),
        "none" | "off" => Some("off"),
        _ => None,
    }
}

/// [`LOG_LEVEL`] as a tracing filter, or why it is refused. tracing's own filter reads a word that is not one
/// of its levels (`Information`, `verbose`, `-0`) as a module name and then logs nothing at all, errors
/// included, so only levels and `module=level` directives are accepted here.
pub fn log_filter(text: &str) -> Result<String, ConfigError> {
    let refuse = || {
        ConfigError::new(
            format!("app setting {}", LOG_LEVEL.name),
            format!(
                "{text:?} is not a log level: use Trace, Debug, Information, Warning, Error, Critical or None (the \
                 Functions host's names, any case), or trace, debug, info, warn, error or off, optionally with \
                 module directives such as info,sql_pseudo_trigger=debug"
            ),
        )
    };
    let module = |m: &str| {
        !m.is_empty() && m.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') && !m.starts_with(':')
    };
    let mut directives = Vec::new();
    for directive in text.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if let Some(level) = level_word(directive) {
            directives.push(level.to_string());
            continue;
        }
        match directive.split_once('=') {
            Some((target, level)) if module(target.trim()) => match level_word(level) {
                Some(level) => directives.push(format!("{}={level}", target.trim())),
                None => return Err(refuse()),
            },
            _ => return Err(refuse()),
        }
    }
    if directives.is_empty() {
        return Err(refuse());
    }
    Ok(directives.join(","))
}

pub const ADMIN_KEY: SettingDef = SettingDef {
    name: "Sql_Trigger_AdminKey",
    function_key: None,
    host_json_key: None,
    default: "(unset: direct admin routes off)",
    doc: "Key for the admin routes served directly at /admin (for `handler run`); requests carry it in x-functions-key, X-API-KEY or Authorization: Bearer (KEDA's apiKey and bearer modes), or code. Under the Functions host use the admin function template instead, which function keys protect.",
};

pub const ADMIN_BIND_ADDRESS: SettingDef = SettingDef {
    name: "Sql_Trigger_AdminBindAddress",
    function_key: None,
    host_json_key: None,
    default: "127.0.0.1",
    doc: "The address `handler run --admin-port` listens on (`--admin-bind` overrides it): 127.0.0.1 serves this machine only; 0.0.0.0 (or a pod's address) lets another pod reach the admin and scale routes, e.g. KEDA's metrics-api scaler. Every request needs Sql_Trigger_AdminKey either way.",
};

pub const POSTGRES_ROOT_CERTIFICATE: SettingDef = SettingDef {
    name: "Sql_Trigger_PostgresRootCertificate",
    function_key: None,
    host_json_key: None,
    default: "(unset: the platform's trusted roots only)",
    doc: "CA certificate(s) that PostgreSQL connections (sources and sinks) trust in addition to the platform's roots, for a server with its own CA: the path of a PEM file (absolute, or relative to the app root) or the PEM text itself. Server certificates and host names are verified whenever TLS is used: with sslmode=require, and with the default sslmode=prefer when the server offers TLS. See docs/operations.md.",
};
pub const POSTGRES_TRUST_SERVER_CERTIFICATE: SettingDef = SettingDef {
    name: "Sql_Trigger_PostgresTrustServerCertificate",
    function_key: None,
    host_json_key: None,
    default: "false",
    doc: "`true`: encrypt PostgreSQL connections without verifying the server's certificate or host name, like SQL Server's TrustServerCertificate. Whoever can intercept the connection can then read the rows and the password; a warning is logged at start-up. Prefer Sql_Trigger_PostgresRootCertificate.",
};

pub const APPLICATIONINSIGHTS_CONNECTION_STRING: SettingDef = SettingDef {
    name: "APPLICATIONINSIGHTS_CONNECTION_STRING",
    function_key: None,
    host_json_key: None,
    default: "(unset)",
    doc: "Export the handler's metrics (`sql_trigger.*`) to this Application Insights resource as custom metrics (instrumentation-key auth). See docs/telemetry.md.",
};
pub const OTEL_EXPORTER_OTLP_ENDPOINT: SettingDef = SettingDef {
    name: "OTEL_EXPORTER_OTLP_ENDPOINT",
    function_key: None,
    host_json_key: None,
    default: "(unset)",
    doc: "Export the handler's metrics over OTLP http/protobuf to `{endpoint}/v1/metrics` (an OpenTelemetry Collector, port 4318). OTEL_EXPORTER_OTLP_METRICS_ENDPOINT gives the full URL instead; OTEL_EXPORTER_OTLP_HEADERS adds headers.",
};
pub const METRICS: SettingDef = SettingDef {
    name: "Sql_Trigger_Metrics",
    function_key: None,
    host_json_key: None,
    default: "auto",
    doc: "`auto`: export metrics to every exporter configured (APPLICATIONINSIGHTS_CONNECTION_STRING, OTEL_EXPORTER_OTLP_ENDPOINT); with none, nothing is started. `otlp` or `appinsights`: that one only. `off`: no metrics (as do OTEL_SDK_DISABLED=true and OTEL_METRICS_EXPORTER=none).",
};
pub const METRICS_INTERVAL_MS: SettingDef = SettingDef {
    name: "Sql_Trigger_MetricsIntervalMs",
    function_key: None,
    host_json_key: None,
    default: "30000",
    doc: "With a metrics exporter configured: how often metrics are exported and the status gauges are refreshed (one state read, one pending-changes query and one lag query per function, off the tick path).",
};

pub const MAX_CONNECTIONS_PER_DATABASE: SettingDef = SettingDef {
    name: "Sql_Trigger_MaxConnectionsPerDatabase",
    function_key: None,
    host_json_key: None,
    default: "10",
    doc: "Most connections one handler process opens to one database (one connection string), from 1 to 1000: one pool shared by every function, partition, source and sink of that database. Per instance: this times the databases, plus one per postgres-logical function's replication stream; `handler state status` takes at most 4. See docs/operations.md, \"Connections\".",
};

/// Every setting, in documentation order.
pub const ALL: &[SettingDef] = &[
    MAX_BATCH_SIZE,
    POLLING_INTERVAL_MS,
    MAX_CHANGES_PER_WORKER,
    MAX_ATTEMPTS,
    POISON_AFTER_MS,
    POISON_ACTION,
    PROOF_WINDOW_MS,
    DELIVERY_MODE,
    MESSAGE_FORMAT,
    LEASE_DURATION_MS,
    TICK_TIMEOUT_MS,
    STATE_STORE,
    STATE_DIRECTORY,
    STATE_CONTAINER,
    APP_NAME,
    LOG_LEVEL,
    ADMIN_KEY,
    ADMIN_BIND_ADDRESS,
    POSTGRES_ROOT_CERTIFICATE,
    POSTGRES_TRUST_SERVER_CERTIFICATE,
    APPLICATIONINSIGHTS_CONNECTION_STRING,
    OTEL_EXPORTER_OTLP_ENDPOINT,
    METRICS,
    METRICS_INTERVAL_MS,
    MAX_CONNECTIONS_PER_DATABASE,
];

/// How a batch reaches its destination, and so what guarantee holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryMode {
    Deferred,
    Immediate,
    Sink,
}

/// How a batch is handed to the host's output bindings (see [`MESSAGE_FORMAT`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MessageFormat {
    /// JSON values, re-read and re-written by the host (the official trigger's payload, as it arrives).
    Json,
    /// Each message as a JSON string holding the message's text, which the host passes through as is.
    Text,
}

/// What happens to a batch that failed `MaxAttempts` times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoisonAction {
    Quarantine,
    Halt,
}

/// The effective trigger settings of one function.
#[derive(Debug, Clone, PartialEq)]
pub struct TriggerSettings {
    pub max_batch_size: usize,
    pub polling_interval: Duration,
    pub max_changes_per_worker: u64,
    pub max_attempts: u32,
    /// Deferred delivery: how long a batch must have been failing before it may be poison.
    pub poison_after: Duration,
    pub poison_action: PoisonAction,
    pub delivery_mode: DeliveryMode,
    /// Deferred and immediate delivery: how the batch is handed to the host's output bindings.
    pub message_format: MessageFormat,
    pub lease_duration: Duration,
    pub tick_timeout: Duration,
}

/// Reads one setting through the precedence chain and reports where the winning value came from, so an
/// error can name it.
#[derive(Debug)]
pub struct Resolver<'a> {
    pub env: &'a Env,
    pub host_sql: Option<&'a Value>,
    pub function: Option<(&'a str, &'a serde_json::Map<String, Value>)>,
}

impl Resolver<'_> {
    pub(super) fn raw(&self, def: &SettingDef) -> Option<(String, String)> {
        if let (Some((file, obj)), Some(key)) = (self.function, def.function_key) {
            if let Some(v) = obj.get(key) {
                return Some((value_text(v), format!("{key} in {file}")));
            }
        }
        if let Some(v) = self.env.get(def.name) {
            return Some((v.to_string(), format!("app setting {}", def.name)));
        }
        if def.name == MAX_BATCH_SIZE.name {
            if let Some(v) = self.env.get(BATCH_SIZE_ALIAS) {
                return Some((v.to_string(), format!("app setting {BATCH_SIZE_ALIAS}")));
            }
        }
        if let (Some(sql), Some(key)) = (self.host_sql, def.host_json_key) {
            if let Some(v) = sql.get(key) {
                return Some((value_text(v), format!("host.json extensions.sql.{key}")));
            }
        }
        None
    }

    /// A positive integer setting, bounded above.
    pub fn positive(&self, def: &SettingDef, max: u64, errors: &mut Vec<ConfigError>) -> u64 {
        let fallback = def.default.parse().unwrap_or(1);
        let Some((text, from)) = self.raw(def) else { return fallback };
        match text.trim().parse::<u64>() {
            Ok(n) if n > 0 && n <= max => n,
            _ => {
                errors.push(ConfigError::new(
                    from,
                    format!("must be a whole number from 1 to {max}, got {text:?} (default {})", def.default),
                ));
                fallback
            }
        }
    }

    /// A whole number setting from 0, bounded above, or `None` when nothing sets it.
    pub fn optional_whole(&self, def: &SettingDef, max: u64, errors: &mut Vec<ConfigError>) -> Option<u64> {
        let (text, from) = self.raw(def)?;
        match text.trim().parse::<u64>() {
            Ok(n) if n <= max => Some(n),
            _ => {
                errors.push(ConfigError::new(from, format!("must be a whole number from 0 to {max}, got {text:?}")));
                None
            }
        }
    }

    /// A whole number setting from 0, bounded above.
    pub fn whole(&self, def: &SettingDef, max: u64, errors: &mut Vec<ConfigError>) -> u64 {
        let fallback = def.default.parse().unwrap_or(0);
        let Some((text, from)) = self.raw(def) else { return fallback };
        match text.trim().parse::<u64>() {
            Ok(n) if n <= max => n,
            _ => {
                errors.push(ConfigError::new(
                    from,
                    format!("must be a whole number from 0 to {max}, got {text:?} (default {})", def.default),
                ));
                fallback
            }
        }
    }

    /// One of a fixed set of words, case-insensitive.
    pub fn choice<T: Copy>(&self, def: &SettingDef, options: &[(&str, T)], errors: &mut Vec<ConfigError>) -> T {
        let pick = |t: &str| options.iter().find(|(name, _)| name.eq_ignore_ascii_case(t.trim())).map(|(_, v)| *v);
        let fallback = pick(def.default).unwrap_or(options[0].1);
        let Some((text, from)) = self.raw(def) else { return fallback };
        pick(&text).unwrap_or_else(|| {
            let names: Vec<&str> = options.iter().map(|(n, _)| *n).collect();
            errors.push(ConfigError::new(from, format!("must be one of {}, got {text:?}", names.join(", "))));
            fallback
        })
    }

    pub fn trigger_settings(&self, errors: &mut Vec<ConfigError>) -> TriggerSettings {
        TriggerSettings {
            max_batch_size: self.positive(&MAX_BATCH_SIZE, 100_000, errors) as usize,
            polling_interval: Duration::from_millis(self.positive(&POLLING_INTERVAL_MS, 86_400_000, errors)),
            max_changes_per_worker: self.positive(&MAX_CHANGES_PER_WORKER, u32::MAX as u64, errors),
            max_attempts: self.positive(&MAX_ATTEMPTS, 1000, errors) as u32,
            poison_after: Duration::from_millis(self.whole(&POISON_AFTER_MS, 7 * 86_400_000, errors)),
            poison_action: self.choice(
                &POISON_ACTION,
                &[("quarantine", PoisonAction::Quarantine), ("halt", PoisonAction::Halt)],
                errors,
            ),
            delivery_mode: self.choice(
                &DELIVERY_MODE,
                &[
                    ("deferred", DeliveryMode::Deferred),
                    ("immediate", DeliveryMode::Immediate),
                    ("sink", DeliveryMode::Sink),
                ],
                errors,
            ),
            message_format: self.choice(
                &MESSAGE_FORMAT,
                &[("json", MessageFormat::Json), ("text", MessageFormat::Text)],
                errors,
            ),
            lease_duration: Duration::from_millis(self.positive(&LEASE_DURATION_MS, 3_600_000, errors).max(1000)),
            tick_timeout: Duration::from_millis(self.positive(&TICK_TIMEOUT_MS, 86_400_000, errors)),
        }
    }
}

fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The configuration reference as Markdown, generated from [`ALL`].
pub fn reference_markdown() -> String {
    let mut out = String::from(
        "| App setting | sqltrigger.json | host.json `extensions.sql` | Default | Meaning |\n|---|---|---|---|---|\n",
    );
    for d in ALL {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            d.name,
            d.function_key.map(|k| format!("`{k}`")).unwrap_or_else(|| "-".into()),
            d.host_json_key.map(|k| format!("`{k}`")).unwrap_or_else(|| "-".into()),
            d.default,
            d.doc
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Env {
        Env::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn defaults_match_the_official_trigger() {
        let e = env(&[]);
        let mut errors = vec![];
        let s = Resolver { env: &e, host_sql: None, function: None }.trigger_settings(&mut errors);
        assert!(errors.is_empty());
        assert_eq!(s.max_batch_size, 100);
        assert_eq!(s.polling_interval, Duration::from_millis(1000));
        assert_eq!(s.max_changes_per_worker, 1000);
        assert_eq!(s.max_attempts, 5);
        assert_eq!(s.delivery_mode, DeliveryMode::Deferred);
        assert_eq!(s.message_format, MessageFormat::Json, "the official payload shape, as JSON values");
    }

    #[test]
    fn app_settings_beat_host_json_and_sqltrigger_json_beats_both() {
        let host = serde_json::json!({"maxBatchSize": 7, "pollingIntervalMs": 50});
        let e = env(&[("Sql_Trigger_MaxBatchSize", "30")]);
        let mut errors = vec![];
        let s = Resolver { env: &e, host_sql: Some(&host), function: None }.trigger_settings(&mut errors);
        assert_eq!((s.max_batch_size, s.polling_interval.as_millis()), (30, 50));
        let f = serde_json::json!({"maxBatchSize": 3});
        let f = f.as_object().expect("object");
        let s = Resolver { env: &e, host_sql: Some(&host), function: Some(("f/sqltrigger.json", f)) }
            .trigger_settings(&mut errors);
        assert_eq!(s.max_batch_size, 3);
        assert!(errors.is_empty());
    }

    #[test]
    fn the_deprecated_batch_size_alias_still_works() {
        let e = env(&[("Sql_Trigger_BatchSize", "42")]);
        let mut errors = vec![];
        let s = Resolver { env: &e, host_sql: None, function: None }.trigger_settings(&mut errors);
        assert_eq!(s.max_batch_size, 42);
    }

    #[test]
    fn log_levels_take_the_hosts_names_and_tracings_and_refuse_anything_else() {
        for (given, filter) in [
            ("Trace", "trace"),
            ("DEBUG", "debug"),
            ("Information", "info"),
            ("information", "info"),
            ("Warning", "warn"),
            ("Error", "error"),
            ("Critical", "error"),
            ("None", "off"),
            ("info", "info"),
            ("warn", "warn"),
            ("off", "off"),
            (" info , sql_pseudo_trigger=Debug ", "info,sql_pseudo_trigger=debug"),
            ("warn,sql_pseudo_trigger::engine=trace", "warn,sql_pseudo_trigger::engine=trace"),
        ] {
            assert_eq!(log_filter(given).as_deref(), Ok(filter), "{given:?}");
            assert!(tracing_subscriber::EnvFilter::try_new(filter).is_ok(), "{filter}");
        }
        for bad in
            ["verbose", "-0", "0", "Informational", "info,verbose", "=debug", "x=loud", ",", "info;debug", "a b=info"]
        {
            let e = log_filter(bad).expect_err(bad).to_string();
            assert!(e.contains("Sql_Trigger_LogLevel") && e.contains("Information"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn every_bad_value_is_reported_with_its_setting() {
        let e = env(&[
            ("Sql_Trigger_MaxBatchSize", "0"),
            ("Sql_Trigger_PollingIntervalMs", "-5"),
            ("Sql_Trigger_DeliveryMode", "yolo"),
        ]);
        let mut errors = vec![];
        Resolver { env: &e, host_sql: None, function: None }.trigger_settings(&mut errors);
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 3, "{text:?}");
        assert!(text[0].contains("Sql_Trigger_MaxBatchSize") && text[0].contains("1 to 100000"));
        assert!(text[1].contains("Sql_Trigger_PollingIntervalMs"));
        assert!(text[2].contains("deferred, immediate, sink"));
    }
}

#[cfg(test)]
mod reference_tests {
    #[test]
    fn the_readme_configuration_reference_matches_the_code() {
        let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README.md");
        let begin = "<!-- settings:begin -->\n";
        let start = readme.find(begin).expect("begin marker") + begin.len();
        let end = readme.find("<!-- settings:end -->").expect("end marker");
        assert_eq!(
            &readme[start..end],
            super::reference_markdown(),
            "README.md's configuration reference is stale: regenerate it with `handler settings`"
        );
    }
}
