//! The `"sink"` options the SQL sinks share, read and checked once at start-up:
//!
//! ```json
//! "sink": { "type": "postgres", "tableName": "public.orders_copy", "connectionStringSetting": "TargetDb",
//!           "exactlyOnce": false, "checkpointTable": "sql_pseudo_trigger_checkpoint",
//!           "fenceTable": "sql_pseudo_trigger_fence", "maxRowsPerStatement": 5000 }
//! ```
//! The fence and checkpoint tables default to the target table's schema; they are created on first use when
//! missing (docs/sinks.md gives their DDL for logins that may not create tables).

use crate::config::{Env, Secret};
use crate::ident::TableName;
use serde_json::Value;

const KNOWN_KEYS: &[&str] = &[
    "type",
    "tableName",
    "connectionStringSetting",
    "exactlyOnce",
    "checkpointTable",
    "fenceTable",
    "maxRowsPerStatement",
];

pub const DEFAULT_FENCE_TABLE: &str = "sql_pseudo_trigger_fence";
pub const DEFAULT_CHECKPOINT_TABLE: &str = "sql_pseudo_trigger_checkpoint";
/// Beyond this a statement's parameter grows without making the write faster.
pub const MAX_ROWS_PER_STATEMENT: u64 = 100_000;

/// Where a SQL sink writes, and how.
#[derive(Debug, Clone)]
pub struct Target {
    pub table: TableName,
    pub setting: String,
    pub connection: Secret,
    pub fence_table: TableName,
    /// Set with `exactlyOnce`: the table that records the last batch applied, in the rows' transaction.
    pub checkpoint_table: Option<TableName>,
    pub max_rows_per_statement: usize,
}

impl Target {
    /// Reads the options; `default_rows` is the dialect's rows per statement.
    pub fn from_options(options: &Value, env: &Env, default_rows: usize) -> Result<Self, String> {
        let Some(map) = options.as_object() else { return Err("must be an object".into()) };
        if let Some(key) = map.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(format!("unknown key {key:?}; known keys: {}", KNOWN_KEYS.join(", ")));
        }
        let text = |k: &str| map.get(k).and_then(Value::as_str);
        let table = TableName::parse(text("tableName").ok_or("needs \"tableName\": the table to write to")?)
            .map_err(|e| format!("tableName: {e}"))?;
        let setting = text("connectionStringSetting")
            .ok_or("needs \"connectionStringSetting\": the app setting that holds the target's connection string")?;
        let connection = env.get(setting).ok_or_else(|| {
            format!(
                "connectionStringSetting names app setting {setting:?}, which is not set; add it to the app settings"
            )
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
        let max_rows = match map.get("maxRowsPerStatement") {
            None => default_rows,
            Some(v) => match v.as_u64() {
                Some(n @ 1..=MAX_ROWS_PER_STATEMENT) => n as usize,
                _ => return Err(format!("maxRowsPerStatement must be from 1 to {MAX_ROWS_PER_STATEMENT}, got {v}")),
            },
        };
        Ok(Self {
            fence_table: named("fenceTable", DEFAULT_FENCE_TABLE)?,
            checkpoint_table: if exactly_once {
                Some(named("checkpointTable", DEFAULT_CHECKPOINT_TABLE)?)
            } else {
                None
            },
            table,
            setting: setting.to_string(),
            connection: Secret::new(connection),
            max_rows_per_statement: max_rows,
        })
    }
}

/// `name` in `table`'s schema (or unqualified when `table` is).
pub fn beside(table: &TableName, name: &str) -> TableName {
    let name = crate::ident::Ident::new(name).unwrap_or_else(|_| table.table.clone());
    TableName { schema: table.schema.clone(), table: name }
}

/// Splits rows into statements of at most `max_rows` rows and about `max_bytes` bytes of JSON each, and
/// renders each as one JSON array.
pub fn chunks<S: AsRef<str>>(rows: &[S], max_rows: usize, max_bytes: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::from("[");
    let mut n = 0;
    for row in rows {
        let row = row.as_ref();
        if n > 0 && (n >= max_rows || current.len() + row.len() > max_bytes) {
            current.push(']');
            out.push(std::mem::replace(&mut current, String::from("[")));
            n = 0;
        }
        if n > 0 {
            current.push(',');
        }
        current.push_str(row);
        n += 1;
    }
    if n > 0 {
        current.push(']');
        out.push(current);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env() -> Env {
        Env::from_pairs([("Target".to_string(), "postgres://u@h/db".to_string())])
    }

    #[test]
    fn defaults_put_the_fence_beside_the_table_and_exactly_once_adds_the_checkpoint() {
        let t = Target::from_options(
            &json!({"type":"postgres","tableName":"app.orders","connectionStringSetting":"Target"}),
            &env(),
            5000,
        )
        .expect("valid");
        assert_eq!(t.fence_table.to_string(), "app.sql_pseudo_trigger_fence");
        assert!(t.checkpoint_table.is_none());
        assert_eq!(t.max_rows_per_statement, 5000);
        let t = Target::from_options(
            &json!({"type":"postgres","tableName":"orders","connectionStringSetting":"Target","exactlyOnce":true,"checkpointTable":"ops.cp"}),
            &env(),
            5000,
        )
        .expect("valid");
        assert_eq!(t.checkpoint_table.map(|c| c.to_string()), Some("ops.cp".to_string()));
    }

    #[test]
    fn mistakes_are_named() {
        let e = |v: Value| Target::from_options(&v, &env(), 10).unwrap_err();
        assert!(e(json!({"type":"postgres","connectionStringSetting":"Target"})).contains("tableName"));
        assert!(e(json!({"type":"postgres","tableName":"t","connectionStringSetting":"Nope"})).contains("\"Nope\""));
        assert!(e(json!({"type":"postgres","tableName":"t","connectionStringSetting":"Target","exactlyonce":true}))
            .contains("unknown key \"exactlyonce\""));
        assert!(e(
            json!({"type":"postgres","tableName":"t","connectionStringSetting":"Target","maxRowsPerStatement":0})
        )
        .contains("maxRowsPerStatement"));
    }

    #[test]
    fn chunks_bound_rows_and_bytes_and_never_split_a_row() {
        let rows = ["{\"a\":1}", "{\"a\":2}", "{\"a\":3}"];
        assert_eq!(chunks(&rows, 2, 1 << 20), vec!["[{\"a\":1},{\"a\":2}]", "[{\"a\":3}]"]);
        assert_eq!(chunks(&rows, 10, 10), vec!["[{\"a\":1}]", "[{\"a\":2}]", "[{\"a\":3}]"]);
        assert!(chunks::<&str>(&[], 10, 10).is_empty());
    }
}
