//! What a function watches: the source half of `sqltrigger.json`, with `%Name%` app-setting references
//! resolved, typed once at load (the kinds' own keys in `source_options`).

use super::source_options::{
    self, ChangeTrackingOptions, CursorGuard, PostgresCursorOptions, PostgresLogicalOptions, RowversionOptions,
};
use super::{ConfigError, ConfigErrors, Env, Secret};
use crate::ident::{Ident, TableName};
use serde_json::{Map, Value};
use std::time::Duration;

mod capabilities;
pub use capabilities::{Capabilities, NoPartitions};

/// Where a function starts when it has no state yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// Every change the source still has (the official trigger's behaviour).
    Earliest,
    /// Only changes made after the first tick.
    Now,
    /// The rows that exist when the function first runs, delivered by a backfill (docs/operations.md,
    /// "Backfill"), and every change after them (every source: postgres-cursor, postgres-logical and both SQL
    /// Server sources).
    Snapshot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// PostgreSQL table polled by a cursor column plus primary key.
    PostgresCursor,
    /// PostgreSQL table read from the write-ahead log through a replication slot (logical decoding).
    PostgresLogical,
    /// SQL Server / Azure SQL change tracking (the official trigger's mechanism).
    MssqlChangeTracking,
    /// SQL Server table polled by a rowversion column below MIN_ACTIVE_ROWVERSION().
    MssqlRowversion,
}

impl SourceKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::PostgresCursor => "postgres-cursor",
            Self::PostgresLogical => "postgres-logical",
            Self::MssqlChangeTracking => "mssql-change-tracking",
            Self::MssqlRowversion => "mssql-rowversion",
        }
    }

    /// The kind a `"source"` value names (absent: mssql-change-tracking, the official trigger's; `postgres` and
    /// `mssql` are short names); `None` when it names no source.
    pub fn from_name(name: Option<&str>) -> Option<Self> {
        match name.unwrap_or("mssql-change-tracking") {
            "postgres-cursor" | "postgres" => Some(Self::PostgresCursor),
            "postgres-logical" => Some(Self::PostgresLogical),
            "mssql-change-tracking" | "mssql" => Some(Self::MssqlChangeTracking),
            "mssql-rowversion" => Some(Self::MssqlRowversion),
            _ => None,
        }
    }
}

/// What each kind of source reads besides its table and connection: the kind, with its own keys typed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SourceOptions {
    PostgresCursor(PostgresCursorOptions),
    PostgresLogical(PostgresLogicalOptions),
    MssqlChangeTracking(ChangeTrackingOptions),
    MssqlRowversion(RowversionOptions),
}

impl SourceOptions {
    pub fn kind(&self) -> SourceKind {
        match self {
            Self::PostgresCursor(_) => SourceKind::PostgresCursor,
            Self::PostgresLogical(_) => SourceKind::PostgresLogical,
            Self::MssqlChangeTracking(_) => SourceKind::MssqlChangeTracking,
            Self::MssqlRowversion(_) => SourceKind::MssqlRowversion,
        }
    }
}

/// What to watch and how, typed at load: what every source reads, and its kind with the kind's own keys.
#[derive(Debug, Clone)]
pub struct SourceSpec {
    pub table: TableName,
    pub connection_setting: String,
    pub connection: Secret,
    pub primary_key: Option<Vec<Ident>>,
    pub columns: Option<Vec<Ident>>,
    pub start_from: StartFrom,
    /// The kind of source and its own keys.
    pub options: SourceOptions,
    /// The one partition of the table's keys this source reads (`None`: all of them). Set per partition trigger
    /// from the function's [`super::Partitioning`]; each source turns it into its own predicate.
    pub partition: Option<super::Partition>,
}

impl SourceSpec {
    pub fn kind(&self) -> SourceKind {
        self.options.kind()
    }

    /// Reads the source half of a `sqltrigger.json` given as JSON (`%Name%` references resolved), against the app
    /// settings in `env`, reporting every problem at once: for tests and tools that state a function as its
    /// author writes it, through the same parser the handler uses.
    pub fn from_json(sqltrigger: &Value, env: &Env) -> Result<Self, ConfigErrors> {
        let file = "sqltrigger.json";
        let mut errors = Vec::new();
        let Some(object) = sqltrigger.as_object() else {
            return Err(ConfigErrors(vec![ConfigError::new(file, "must be a JSON object")]));
        };
        let resolved = resolve_references(object, env, file, &mut errors);
        let spec = source_spec(&resolved, env, file, &mut errors);
        match spec {
            Some(spec) if errors.is_empty() => Ok(spec),
            _ => Err(ConfigErrors(errors)),
        }
    }
}

pub(super) fn source_spec(
    o: &Map<String, Value>,
    env: &Env,
    file: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<SourceSpec> {
    let text = |k: &str| o.get(k).and_then(Value::as_str).map(str::to_string);
    let mut problem = |key: &str, msg: String| errors.push(ConfigError::new(format!("{key} in {file}"), msg));

    let source = text("source");
    let Some(kind) = SourceKind::from_name(source.as_deref()) else {
        let other = source.as_deref().unwrap_or_default();
        problem(
            "source",
            format!("{other:?} is not a source; use mssql-change-tracking, mssql-rowversion, postgres-cursor or postgres-logical"),
        );
        return None;
    };
    let table = table(text("tableName"), &mut problem);
    let connection_setting = text("connectionStringSetting");
    let connection = connection(connection_setting.as_deref(), env, &mut problem);
    let cursor_column = ident(o, "cursorColumn", &mut problem);
    let inserted_column = ident(o, "insertedColumn", &mut problem);
    let soft_delete_column = ident(o, "softDeleteColumn", &mut problem);
    let primary_key = ident_list(o, "primaryKey", &mut problem);
    let columns = ident_list(o, "columns", &mut problem);
    let cursor_guard = cursor_guard(text("cursorGuard").as_deref(), &mut problem);
    let safety_lag = safety_lag(o.get("safetyLagMs"), &mut problem);
    let start_from = start_from(text("startFrom").as_deref(), &mut problem);
    if kind == SourceKind::PostgresCursor && cursor_column.is_none() && o.get("cursorColumn").is_none() {
        problem("cursorColumn", "is required for postgres-cursor: an xid8 (recommended), bigint or timestamp column that every insert and update sets".into());
    }
    let partition_column = source_options::partition_column(o, kind, file, errors);
    let options = match kind {
        SourceKind::PostgresCursor => cursor_column.map(|cursor_column| {
            SourceOptions::PostgresCursor(PostgresCursorOptions {
                cursor_column,
                cursor_guard,
                safety_lag,
                inserted_column,
                soft_delete_column,
            })
        }),
        SourceKind::PostgresLogical => {
            source_options::postgres_logical(o, file, errors).map(SourceOptions::PostgresLogical)
        }
        SourceKind::MssqlChangeTracking => {
            source_options::change_tracking(o, file, errors).map(SourceOptions::MssqlChangeTracking)
        }
        SourceKind::MssqlRowversion => Some(SourceOptions::MssqlRowversion(RowversionOptions {
            cursor_column,
            inserted_column,
            soft_delete_column,
            partition_column,
        })),
    };
    Some(SourceSpec {
        table: table?,
        connection_setting: connection_setting?,
        connection: connection?,
        primary_key,
        columns,
        start_from,
        options: options?,
        partition: None,
    })
}

/// Where `problem` reports a key's error, in the order the keys are read.
type Problem<'a> = dyn FnMut(&str, String) + 'a;

/// `tableName`: required, a schema-qualified name.
fn table(text: Option<String>, problem: &mut Problem<'_>) -> Option<TableName> {
    match text.map(|t| TableName::parse(&t)) {
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => {
            problem("tableName", e);
            None
        }
        None => {
            problem("tableName", "is required (the table to watch, e.g. dbo.Orders)".into());
            None
        }
    }
}

/// `connectionStringSetting`: required, the name of an app setting that is set; its value, as a secret.
fn connection(setting: Option<&str>, env: &Env, problem: &mut Problem<'_>) -> Option<Secret> {
    match setting {
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
    }
}

/// An optional column name under `key`.
fn ident(o: &Map<String, Value>, key: &str, problem: &mut Problem<'_>) -> Option<Ident> {
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
}

/// An optional non-empty list of column names under `key`.
fn ident_list(o: &Map<String, Value>, key: &str, problem: &mut Problem<'_>) -> Option<Vec<Ident>> {
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
}

/// `cursorGuard`: xid8, lag or none (`None` when not set: the source picks by the column's type).
fn cursor_guard(text: Option<&str>, problem: &mut Problem<'_>) -> Option<CursorGuard> {
    match text {
        None => None,
        Some("xid8") => Some(CursorGuard::Xid8),
        Some("lag") => Some(CursorGuard::Lag),
        Some("none") => Some(CursorGuard::Unguarded),
        Some(g) => {
            problem("cursorGuard", format!("{g:?} is not a guard; use xid8, lag or none"));
            None
        }
    }
}

/// `safetyLagMs`: 5 s unless set, at most a day.
fn safety_lag(v: Option<&Value>, problem: &mut Problem<'_>) -> Duration {
    match v {
        None => Duration::from_millis(5000),
        Some(v) => match v.as_u64().or_else(|| v.as_str().and_then(|s| s.parse().ok())) {
            Some(ms) if ms <= 86_400_000 => Duration::from_millis(ms),
            _ => {
                problem("safetyLagMs", format!("must be milliseconds from 0 to 86400000, got {v}"));
                Duration::ZERO
            }
        },
    }
}

/// `startFrom`: earliest unless set.
fn start_from(text: Option<&str>, problem: &mut Problem<'_>) -> StartFrom {
    match text {
        None | Some("earliest") => StartFrom::Earliest,
        Some("now") => StartFrom::Now,
        // A backfill of the rows that exist beside the changes after them (docs/operations.md, "Backfill"):
        // every source can backfill.
        Some("snapshot") => StartFrom::Snapshot,
        Some(other) => {
            problem("startFrom", format!("{other:?} is not a start; use earliest, now or snapshot"));
            StartFrom::Earliest
        }
    }
}

/// Replaces `%Name%` in every string value with the app setting's value. Connection strings are never
/// resolved this way into the spec (they come through connectionStringSetting), so no secret is copied.
pub(super) fn resolve_references(
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

/// `%Name%` references in `s` replaced by app settings; the name of a missing one as the error.
pub(super) fn resolve_text(s: &str, env: &Env) -> Result<String, String> {
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

    #[test]
    fn start_from_snapshot_is_a_backfill_for_every_source() {
        let env = Env::from_pairs([("Db".to_string(), "unused".to_string())]);
        let start = |kind: SourceKind| {
            let json = serde_json::json!({"source": kind.as_str(), "tableName": "dbo.t", "connectionStringSetting": "Db",
                "cursorColumn": "v", "startFrom": "snapshot"});
            let json = match kind {
                SourceKind::PostgresCursor => json,
                SourceKind::PostgresLogical => serde_json::json!({"source": kind.as_str(), "tableName": "dbo.t",
                    "connectionStringSetting": "Db", "slotName": "s", "startFrom": "snapshot"}),
                _ => serde_json::Value::Object(
                    json.as_object()
                        .expect("an object")
                        .clone()
                        .into_iter()
                        .filter(|(k, _)| k != "cursorColumn")
                        .collect(),
                ),
            };
            SourceSpec::from_json(&json, &env).map(|s| s.start_from)
        };
        for kind in [
            SourceKind::PostgresCursor,
            SourceKind::PostgresLogical,
            SourceKind::MssqlChangeTracking,
            SourceKind::MssqlRowversion,
        ] {
            assert_eq!(start(kind).expect("valid"), StartFrom::Snapshot, "{kind:?}");
        }
    }
}
