//! Where the handler delivers a batch itself: the `"sink"` key of `sqltrigger.json`, typed once at load.
//!
//! ```json
//! "sink": { "type": "postgres", "tableName": "public.orders_copy", "connectionStringSetting": "TargetDb",
//!           "exactlyOnce": false, "checkpointTable": "sql_pseudo_trigger_checkpoint",
//!           "fenceTable": "sql_pseudo_trigger_fence", "maxRowsPerStatement": 5000 }
//! "sink": { "type": "webhook", "url": "%WebhookUrl%", "headers": {"Authorization": "%WebhookAuth%"},
//!           "timeoutMs": 10000, "maxRetries": 0 }
//! ```
//! The fence and checkpoint tables default to the target table's schema. Reading the spec opens nothing:
//! `sink::build` makes the sink, and database sinks connect on their first delivery.

use super::env::Env;
use super::error::ConfigError;
use super::secret::Secret;
use crate::ident::{Ident, TableName};
use serde_json::Value;
use std::time::Duration;

/// The sink types `"sink": {"type": ...}` accepts.
const SINK_TYPES: &[&str] = &["stdout", "webhook", "postgres", "mssql"];

/// The keys the SQL sinks read.
const TABLE_KEYS: &[&str] = &[
    "type",
    "tableName",
    "connectionStringSetting",
    "exactlyOnce",
    "checkpointTable",
    "fenceTable",
    "maxRowsPerStatement",
];

const DEFAULT_FENCE_TABLE: &str = "sql_pseudo_trigger_fence";
const DEFAULT_CHECKPOINT_TABLE: &str = "sql_pseudo_trigger_checkpoint";
/// Beyond this a statement's parameter grows without making the write faster.
const MAX_ROWS_PER_STATEMENT: u64 = 100_000;

/// A function's sink, by kind.
#[derive(Debug, Clone)]
pub enum SinkSpec {
    /// JSON lines on stdout (`handler run` when no sink is named).
    Stdout,
    Webhook(WebhookSpec),
    Postgres(TableTarget),
    Mssql(TableTarget),
}

/// `"type": "webhook"`.
#[derive(Debug, Clone)]
pub struct WebhookSpec {
    /// An http or https URL; a secret, since its query string may carry a key.
    pub url: Secret,
    /// `timeoutMs`, 10 s by default.
    pub timeout: Duration,
    /// `maxRetries` inside one tick, at most 20; none by default.
    pub max_retries: u32,
    /// Valid HTTP header names, with values HTTP can carry (which may be secrets).
    pub headers: Vec<(String, Secret)>,
}

/// Where a SQL sink (`postgres`, `mssql`) writes, and how.
#[derive(Debug, Clone)]
pub struct TableTarget {
    pub table: TableName,
    pub connection_setting: String,
    pub connection: Secret,
    pub fence_table: TableName,
    /// Set with `exactlyOnce`: the table that records the last batch applied, in the rows' transaction.
    pub checkpoint_table: Option<TableName>,
    /// `maxRowsPerStatement`; unset, the dialect's own.
    pub max_rows_per_statement: Option<usize>,
}

impl SinkSpec {
    /// The sink `"sink"` names (`%Name%` references resolved), read against the app settings in `env`. The error
    /// says what to change, without the setting's name (the caller adds `sink in <file>`).
    pub fn parse(options: &Value, env: &Env) -> Result<Self, String> {
        match options.get("type").and_then(Value::as_str).unwrap_or("") {
            "stdout" => Ok(Self::Stdout),
            "webhook" => webhook(options).map(Self::Webhook),
            "postgres" | "postgresql" => table_target(options, env).map(Self::Postgres),
            "mssql" | "sqlserver" => table_target(options, env).map(Self::Mssql),
            other => Err(format!("type {other:?} is not a sink; use {}", SINK_TYPES.join(", "))),
        }
    }

    /// [`Self::parse`] for `function`'s `sqltrigger.json` (stdout when it names none): for tests and tools that
    /// state a sink as its author writes it.
    pub fn from_json(function: &str, options: Option<&Value>, env: &Env) -> Result<Self, ConfigError> {
        match options {
            None => Ok(Self::Stdout),
            Some(options) => Self::parse(options, env)
                .map_err(|e| ConfigError::new(format!("sink in {function}/sqltrigger.json"), e)),
        }
    }
}

fn webhook(options: &Value) -> Result<WebhookSpec, String> {
    let url = options.get("url").and_then(Value::as_str).ok_or("webhook needs \"url\"")?;
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("webhook url is not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("webhook url must be http or https, not {}", parsed.scheme()));
    }
    let timeout = options.get("timeoutMs").and_then(Value::as_u64).unwrap_or(10_000);
    let max_retries = options.get("maxRetries").and_then(Value::as_u64).unwrap_or(0).min(20) as u32;
    // Checked here, not at the first POST: a header reqwest cannot send would fail every delivery as if the
    // receiver were down, and a non-string value would otherwise be dropped without a word.
    let mut headers = Vec::new();
    if let Some(configured) = options.get("headers") {
        let configured = configured.as_object().ok_or("webhook \"headers\" must be an object of strings")?;
        for (name, value) in configured {
            let value = value.as_str().ok_or_else(|| format!("webhook header {name:?} must be a string"))?;
            reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("webhook header name {name:?} is not a valid HTTP header name"))?;
            // The value may be a secret: say which header, never what it holds.
            reqwest::header::HeaderValue::from_str(value)
                .map_err(|_| format!("webhook header {name:?} has a value HTTP cannot carry (a control character?)"))?;
            headers.push((name.clone(), Secret::new(value)));
        }
    }
    Ok(WebhookSpec { url: Secret::new(url), timeout: Duration::from_millis(timeout), max_retries, headers })
}

fn table_target(options: &Value, env: &Env) -> Result<TableTarget, String> {
    let Some(map) = options.as_object() else { return Err("must be an object".into()) };
    if let Some(key) = map.keys().find(|k| !TABLE_KEYS.contains(&k.as_str())) {
        return Err(format!("unknown key {key:?}; known keys: {}", TABLE_KEYS.join(", ")));
    }
    let text = |k: &str| map.get(k).and_then(Value::as_str);
    let table = TableName::parse(text("tableName").ok_or("needs \"tableName\": the table to write to")?)
        .map_err(|e| format!("tableName: {e}"))?;
    let setting = text("connectionStringSetting")
        .ok_or("needs \"connectionStringSetting\": the app setting that holds the target's connection string")?;
    let connection = env.get(setting).ok_or_else(|| {
        format!("connectionStringSetting names app setting {setting:?}, which is not set; add it to the app settings")
    })?;
    let named = |key: &str, default: &str| -> Result<TableName, String> {
        match map.get(key) {
            None => Ok(beside(&table, default)),
            Some(Value::String(t)) => TableName::parse(t).map_err(|e| format!("{key}: {e}")),
            Some(_) => Err(format!("{key} must be a table name (a string)")),
        }
    };
    let exactly_once = match map.get("exactlyOnce") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err("exactlyOnce must be true or false".into()),
    };
    let max_rows_per_statement = match map.get("maxRowsPerStatement") {
        None => None,
        Some(v) => match v.as_u64() {
            Some(n @ 1..=MAX_ROWS_PER_STATEMENT) => Some(n as usize),
            _ => return Err(format!("maxRowsPerStatement must be from 1 to {MAX_ROWS_PER_STATEMENT}, got {v}")),
        },
    };
    Ok(TableTarget {
        fence_table: named("fenceTable", DEFAULT_FENCE_TABLE)?,
        checkpoint_table: if exactly_once { Some(named("checkpointTable", DEFAULT_CHECKPOINT_TABLE)?) } else { None },
        table,
        connection_setting: setting.to_string(),
        connection: Secret::new(connection),
        max_rows_per_statement,
    })
}

/// `name` in `table`'s schema (or unqualified when `table` is).
pub fn beside(table: &TableName, name: &str) -> TableName {
    let name = Ident::new(name).unwrap_or_else(|_| table.table.clone());
    TableName { schema: table.schema.clone(), table: name }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env() -> Env {
        Env::from_pairs([("Target".to_string(), "postgres://u@h/db".to_string())])
    }

    fn target(v: Value) -> Result<TableTarget, String> {
        match SinkSpec::parse(&v, &env())? {
            SinkSpec::Postgres(t) => Ok(t),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn defaults_put_the_fence_beside_the_table_and_exactly_once_adds_the_checkpoint() {
        let t = target(json!({"type":"postgres","tableName":"app.orders","connectionStringSetting":"Target"}))
            .expect("valid");
        assert_eq!(t.fence_table.to_string(), "app.sql_pseudo_trigger_fence");
        assert!(t.checkpoint_table.is_none());
        assert_eq!(t.max_rows_per_statement, None);
        let t = target(json!({"type":"postgres","tableName":"orders","connectionStringSetting":"Target",
            "exactlyOnce":true,"checkpointTable":"ops.cp","maxRowsPerStatement":5000}))
        .expect("valid");
        assert_eq!(t.checkpoint_table.map(|c| c.to_string()), Some("ops.cp".to_string()));
        assert_eq!(t.max_rows_per_statement, Some(5000));
    }

    #[test]
    fn mistakes_are_named() {
        let e = |v: Value| target(v).unwrap_err();
        assert!(e(json!({"type":"postgres","connectionStringSetting":"Target"})).contains("tableName"));
        assert!(e(json!({"type":"postgres","tableName":"t","connectionStringSetting":"Nope"})).contains("\"Nope\""));
        assert!(e(json!({"type":"postgres","tableName":"t","connectionStringSetting":"Target","exactlyonce":true}))
            .contains("unknown key \"exactlyonce\""));
        assert!(e(
            json!({"type":"postgres","tableName":"t","connectionStringSetting":"Target","maxRowsPerStatement":0})
        )
        .contains("maxRowsPerStatement"));
        let e = SinkSpec::from_json("F", Some(&json!({"type": "kafka"})), &env()).unwrap_err().to_string();
        assert!(e.starts_with("sink in F/sqltrigger.json: type \"kafka\" is not a sink; use stdout"), "{e}");
    }

    #[test]
    fn bad_webhook_options_are_refused_with_what_to_fix() {
        let refused = |options: Value| SinkSpec::parse(&options, &Env::default()).expect_err("refused");
        let webhook = |v: Value| {
            let mut o = json!({"type": "webhook"});
            o.as_object_mut().expect("object").extend(v.as_object().cloned().unwrap_or_default());
            o
        };
        assert!(refused(webhook(json!({}))).contains("needs \"url\""));
        assert!(refused(webhook(json!({ "url": "not a url" }))).contains("not a URL"));
        assert!(refused(webhook(json!({ "url": "ftp://x/y" }))).contains("http or https"));
        let bad_header = refused(webhook(json!({ "url": "http://x/y", "headers": { "X-Key": "a\nb" } })));
        assert!(bad_header.contains("X-Key"), "{bad_header}");
        let not_text = refused(webhook(json!({ "url": "http://x/y", "headers": { "X-Retries": 3 } })));
        assert!(not_text.contains("X-Retries"), "{not_text}");
    }
}
