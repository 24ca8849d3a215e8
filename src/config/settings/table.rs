//! The table of app settings: each one's name, the `sqltrigger.json` and host.json keys that set it per function,
//! its default and its meaning. Read by `resolve` and every module that names a setting in a message;
//! rendered by [`reference_markdown`] for `handler settings` and the README.

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
/// The highest [`MAX_CONNECTIONS_PER_DATABASE`] accepted (the pools clamp to it as well). Here, with the setting,
/// so the configuration never reaches into the connection code for a bound.
pub const MOST_CONNECTIONS_PER_DATABASE: usize = 1000;

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
