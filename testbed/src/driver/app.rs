//! The app folder as the host reads it at start-up: host.json, local.settings.json, and one folder per function
//! with its function.json (bindings, retry policy, timer schedule).

use super::{DriverError, DEFAULT_FUNCTION_TIMEOUT};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A binding's direction in function.json.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    In,
    Out,
    InOut,
}

/// One entry of function.json's `bindings`.
#[derive(Debug, Clone)]
pub struct Binding {
    /// `type`, e.g. `timerTrigger`, `queue`, `sql`.
    pub kind: String,
    pub direction: Direction,
    pub name: String,
    /// The whole entry, for binding-specific keys (`queueName`, `schedule`, ...).
    pub raw: Value,
}

impl Binding {
    pub fn is_trigger(&self) -> bool {
        self.kind.to_ascii_lowercase().ends_with("trigger")
    }
}

use sql_pseudo_trigger::config::parse_timespan;
pub use sql_pseudo_trigger::config::{RetryPolicy, RetryStrategy};

/// One function folder.
#[derive(Debug, Clone)]
pub struct FunctionSpec {
    pub name: String,
    pub bindings: Vec<Binding>,
    pub retry: Option<RetryPolicy>,
}

impl FunctionSpec {
    pub fn trigger(&self) -> Option<&Binding> {
        self.bindings.iter().find(|b| b.is_trigger())
    }

    /// The timer's NCRONTAB schedule as written (possibly `%Setting%`); not evaluated.
    pub fn schedule(&self) -> Option<&str> {
        self.trigger()?.raw.get("schedule")?.as_str()
    }

    /// Output bindings in function.json order, the order in which the host writes them.
    pub fn outputs(&self) -> impl Iterator<Item = &Binding> {
        self.bindings.iter().filter(|b| matches!(b.direction, Direction::Out | Direction::InOut) && !b.is_trigger())
    }
}

/// host.json, local.settings.json and every function folder.
#[derive(Debug, Clone)]
pub struct App {
    pub root: PathBuf,
    pub functions: BTreeMap<String, FunctionSpec>,
    /// `local.settings.json` `Values`, in file order.
    pub settings: Vec<(String, String)>,
    /// `customHandler.description.arguments`.
    pub arguments: Vec<String>,
    /// `functionTimeout`; `None` when unset or `-1`.
    pub function_timeout: Option<Duration>,
}

impl App {
    /// Reads an app folder the way the host does at start-up.
    pub fn load(root: &Path) -> Result<Self, DriverError> {
        let host = read_json(&root.join("host.json"))?;
        let host_path = root.join("host.json");
        let arguments = match host.pointer("/customHandler/description/arguments") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => items
                .iter()
                .map(|item| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Ok(other.to_string()),
                })
                .collect::<Result<_, DriverError>>()?,
            Some(_) => {
                return Err(bad(&host_path, "customHandler.description.arguments must be an array of strings"));
            }
        };
        let function_timeout = match host.get("functionTimeout") {
            None | Some(Value::Null) => Some(DEFAULT_FUNCTION_TIMEOUT),
            Some(Value::String(text)) if text.trim() == "-1" => None,
            Some(Value::String(text)) => Some(parse_timespan(text).ok_or_else(|| {
                bad(&host_path, &format!("functionTimeout {text:?} is not a timespan like \"00:05:00\""))
            })?),
            Some(_) => return Err(bad(&host_path, "functionTimeout must be a string like \"00:05:00\"")),
        };

        let settings_path = root.join("local.settings.json");
        let settings = if settings_path.is_file() {
            let settings = read_json(&settings_path)?;
            match settings.get("Values") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Object(values)) => values
                    .iter()
                    .map(|(key, value)| match value {
                        Value::String(s) => (key.clone(), s.clone()),
                        // The host's settings are strings; Core Tools stringifies numbers and booleans.
                        other => (key.clone(), other.to_string()),
                    })
                    .collect(),
                Some(_) => return Err(bad(&settings_path, "Values must be an object of strings")),
            }
        } else {
            Vec::new()
        };

        let mut functions = BTreeMap::new();
        let entries = fs::read_dir(root).map_err(|source| DriverError::ReadApp { path: root.to_path_buf(), source })?;
        for entry in entries.flatten() {
            let function_json = entry.path().join("function.json");
            if !function_json.is_file() {
                continue;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let spec = parse_function(&name, &function_json, &read_json(&function_json)?)?;
            functions.insert(name, spec);
        }
        Ok(Self { root: root.to_path_buf(), functions, settings, arguments, function_timeout })
    }

    pub fn function(&self, name: &str) -> Result<&FunctionSpec, DriverError> {
        self.functions.get(name).ok_or_else(|| DriverError::UnknownFunction {
            name: name.to_string(),
            app_root: self.root.clone(),
            known: if self.functions.is_empty() {
                "none (no folder holds a function.json)".to_string()
            } else {
                self.functions.keys().cloned().collect::<Vec<_>>().join(", ")
            },
        })
    }
}

fn bad(path: &Path, reason: &str) -> DriverError {
    DriverError::BadAppFile { path: path.to_path_buf(), reason: reason.to_string() }
}

fn read_json(path: &Path) -> Result<Value, DriverError> {
    let text = fs::read_to_string(path).map_err(|source| DriverError::ReadApp { path: path.to_path_buf(), source })?;
    serde_json::from_str(&text).map_err(|err| bad(path, &format!("not JSON: {err}")))
}

fn parse_function(name: &str, path: &Path, doc: &Value) -> Result<FunctionSpec, DriverError> {
    let Some(items) = doc.get("bindings").and_then(Value::as_array) else {
        return Err(bad(path, "it needs a \"bindings\" array"));
    };
    let mut bindings = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let field = |key: &str| {
            item.get(key)
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad(path, &format!("bindings[{index}] needs a string \"{key}\"")))
        };
        let direction = match field("direction")?.to_ascii_lowercase().as_str() {
            "in" => Direction::In,
            "out" => Direction::Out,
            "inout" => Direction::InOut,
            other => {
                return Err(bad(
                    path,
                    &format!("bindings[{index}].direction is {other:?}; use \"in\", \"out\" or \"inout\""),
                ))
            }
        };
        bindings.push(Binding { kind: field("type")?, direction, name: field("name")?, raw: item.clone() });
    }
    // The host reads the policy with the handler's own rules (one reader: `RetryPolicy::parse`).
    let retry = match doc.get("retry") {
        None | Some(Value::Null) => None,
        Some(policy) => {
            let mut errors = Vec::new();
            let parsed = RetryPolicy::parse(policy, &path.display().to_string(), &mut errors);
            if let Some(first) = errors.first() {
                return Err(bad(path, &first.to_string()));
            }
            parsed
        }
    };
    Ok(FunctionSpec { name: name.to_string(), bindings, retry })
}

/// Expands `%Name%` from the handler's environment, as the host does for host.json `arguments`.
pub(super) fn expand_settings(text: &str, lookup: impl Fn(&str) -> Option<String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('%') {
        let after = &rest[start + 1..];
        match after.find('%') {
            Some(end) if end > 0 => {
                out.push_str(&rest[..start]);
                match lookup(&after[..end]) {
                    Some(value) => out.push_str(&value),
                    None => out.push_str(&rest[start..start + end + 2]),
                }
                rest = &after[end + 1..];
            }
            _ => {
                out.push_str(&rest[..=start]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn timespans_parse_like_dotnet() {
        assert_eq!(parse_timespan("00:05:00"), Some(Duration::from_secs(300)));
        assert_eq!(parse_timespan("1.02:00:30"), Some(Duration::from_secs(86_400 + 7_200 + 30)));
        assert_eq!(parse_timespan("00:00:01.5"), Some(Duration::from_millis(1_500)));
        assert_eq!(parse_timespan("five minutes"), None);
        assert_eq!(parse_timespan("00:05"), None);
    }

    #[test]
    fn settings_in_arguments_are_expanded_and_unknown_ones_kept() {
        let lookup = |name: &str| (name == "Port").then(|| "7071".to_string());
        assert_eq!(expand_settings("--port=%Port%", lookup), "--port=7071");
        assert_eq!(expand_settings("%Missing% 100% %%", lookup), "%Missing% 100% %%");
    }

    #[test]
    fn function_json_parses_bindings_and_retry_and_rejects_nonsense() {
        let path = Path::new("OrdersChanged/function.json");
        let doc = json!({
            "bindings": [
                { "type": "timerTrigger", "direction": "in", "name": "timer", "schedule": "%S%" },
                { "type": "queue", "direction": "out", "name": "changes", "queueName": "q" }
            ],
            "retry": { "strategy": "fixedDelay", "maxRetryCount": 3, "delayInterval": "00:00:05" }
        });
        let spec = parse_function("OrdersChanged", path, &doc).expect("valid");
        assert_eq!(spec.schedule(), Some("%S%"));
        assert_eq!(spec.outputs().map(|b| b.name.as_str()).collect::<Vec<_>>(), ["changes"]);
        assert_eq!(spec.retry.as_ref().map(|r| r.max_retry_count), Some(3));

        let missing_name = json!({ "bindings": [{ "type": "queue", "direction": "out" }] });
        let err = parse_function("F", path, &missing_name).expect_err("invalid").to_string();
        assert!(err.contains("bindings[0] needs a string \"name\""), "{err}");
        let bad_retry = json!({ "bindings": [], "retry": { "strategy": "fixedDelay", "maxRetryCount": -5 } });
        assert!(parse_function("F", path, &bad_retry).is_err());
    }
}
