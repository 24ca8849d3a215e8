//! The admin function: the HTTP-triggered folder whose `sqltrigger.json` is `{"admin": true}`, through which the
//! host serves the admin routes behind function keys. Read by `AppConfig::load_for` before a folder is read as a
//! trigger.

use super::error::ConfigError;
use super::folder::read_json;
use serde_json::Value;
use std::path::Path;

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
pub(super) fn load(dir: &Path, errors: &mut Vec<ConfigError>) -> Option<AdminFunction> {
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
