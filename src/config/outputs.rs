//! Which output binding receives what: the `outputs` key of `sqltrigger.json`, checked against function.json.
//!
//! ```json
//! "outputs": { "changes": { "shape": "changes" }, "audit": { "shape": "batch" }, "copy": { "shape": "rows" } }
//! ```
//! - `changes`: the change objects `{"Operation":0,"Item":{...}}` as an array; the host sends one message per
//!   element. The default for every binding but `sql`.
//! - `rows`: the items only, as an array (one row or message each). Deletes cannot be expressed as a row, so
//!   they are left out, reported in the invocation's logs once per batch and counted. The default, and the
//!   only shape, for `sql`: the host's SQL output binding upserts rows.
//! - `batch`: the whole batch as one message `{"changes":[...]}`. For bindings that send one message per
//!   array element (queue, serviceBus, eventHub, ...) it is wrapped in a one-element array; for the others
//!   (blob, ...) it is the object itself.
//!
//! With `messageFormat` `json` values are always objects or arrays, never bare strings: the host base64-decodes
//! strings for some bindings. (`text` sends strings on purpose, safe from that step: see `engine::outputs`.)
//! A blob output gets each batch as one blob at its `path`, so [`check_blob_paths`] requires `{rand-guid}`.
//! `outputs` is checked at load into [`OutputShapes`]; the routes are derived from it and the bindings each
//! time they are needed (a few entries).

use super::env::Env;
use super::error::ConfigError;
use serde_json::{Map, Value};

/// One output binding of function.json: where the host writes what the handler answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputBinding {
    pub name: String,
    /// The binding type as function.json spells it (`queue`, `serviceBus`, `eventHub`, `sql`, `blob`, ...).
    pub kind: String,
}

/// What one output binding receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OutputShape {
    Changes,
    Rows,
    Batch,
}

impl OutputShape {
    const NAMES: &'static [(&'static str, OutputShape)] =
        &[("changes", Self::Changes), ("rows", Self::Rows), ("batch", Self::Batch)];

    /// The shape a binding of this type gets when `outputs` does not name it.
    pub fn default_for(kind: &str) -> Self {
        if kind.eq_ignore_ascii_case("sql") {
            Self::Rows
        } else {
            Self::Changes
        }
    }
}

/// Binding types whose output value may be an array that the host sends as one message (or row) per
/// element. Anything else receives the value as one item.
pub const COLLECTOR_TYPES: &[&str] = &["queue", "serviceBus", "eventHub", "eventGrid", "sql", "cosmosDB", "signalR"];

/// One binding and what it receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRoute {
    pub binding: String,
    pub shape: OutputShape,
    /// True when the host splits an array value into one message per element.
    pub collector: bool,
}

/// `outputs` in sqltrigger.json, checked against function.json's output bindings: the shape of each binding it
/// names. Empty (every binding gets its type's default) when the key is absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutputShapes(Vec<(String, OutputShape)>);

impl OutputShapes {
    fn get(&self, binding: &str) -> Option<OutputShape> {
        self.0.iter().find(|(name, _)| name == binding).map(|(_, shape)| *shape)
    }
}

/// Reads `outputs` (the key's value, when present) against `bindings`. `Err` lists every problem, each naming
/// the binding and what to change.
pub fn check(
    bindings: &[OutputBinding],
    configured: Option<&Value>,
    file: &str,
) -> Result<OutputShapes, Vec<ConfigError>> {
    let mut errors = Vec::new();
    let setting = |binding: &str| format!("outputs.{binding} in {file}");
    let empty = Map::new();
    let configured = match configured {
        None => &empty,
        Some(Value::Object(m)) => m,
        Some(_) => {
            return Err(vec![ConfigError::new(
                format!("outputs in {file}"),
                "must be an object: {\"<binding name>\": {\"shape\": \"changes\" | \"rows\" | \"batch\"}}",
            )])
        }
    };
    for name in configured.keys() {
        if !bindings.iter().any(|b| &b.name == name) {
            let known: Vec<&str> = bindings.iter().map(|b| b.name.as_str()).collect();
            errors.push(ConfigError::new(
                setting(name),
                format!(
                    "names output binding {name:?}, which function.json does not have (its output bindings: {})",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ),
            ));
        }
    }
    let mut shapes = Vec::new();
    for b in bindings {
        let Some(entry) = configured.get(&b.name) else { continue };
        let shape = match parse_entry(entry) {
            Ok(shape) => shape,
            Err(problem) => {
                errors.push(ConfigError::new(setting(&b.name), problem));
                continue;
            }
        };
        if b.kind.eq_ignore_ascii_case("sql") && shape != OutputShape::Rows {
            errors.push(ConfigError::new(
                setting(&b.name),
                "is a sql output binding, which upserts rows: its shape can only be rows (for deletes, use deliveryMode sink with a postgres or mssql sink)",
            ));
            continue;
        }
        shapes.push((b.name.clone(), shape));
    }
    if errors.is_empty() {
        Ok(OutputShapes(shapes))
    } else {
        Err(errors)
    }
}

/// The routes of every output binding: the shape `shapes` gives it, the default by type otherwise.
pub fn routes(bindings: &[OutputBinding], shapes: &OutputShapes) -> Vec<OutputRoute> {
    bindings
        .iter()
        .map(|b| OutputRoute {
            binding: b.name.clone(),
            shape: shapes.get(&b.name).unwrap_or_else(|| OutputShape::default_for(&b.kind)),
            collector: COLLECTOR_TYPES.iter().any(|t| t.eq_ignore_ascii_case(&b.kind)),
        })
        .collect()
}

/// A blob output binding writes the whole batch as one blob at its `path`, which the host resolves on every
/// write (Azure/azure-functions-host `FunctionBinding.BindStreamAsync`). Only `{rand-guid}` (or
/// `{sys.randguid}`) makes that name new each time (azure-webjobs-sdk `BindingParameterResolver`,
/// `SystemBindingData.RandGuid`); `{DateTime}` and `{sys.utcnow}` change once a second
/// (`BindingDataPathHelper.ConvertParameterValueToString`: `yyyy-MM-ddTHH-mm-ssK`). Without either, every batch
/// overwrites the last, lost to a consumer that had not read it yet: an error. With the time alone, two
/// invocations within a second (a retry, a manual run) overwrite each other: a warning. `%Setting%` references
/// are resolved from the app settings first; a path whose setting is missing is left to the host to refuse.
pub fn check_blob_paths(bindings: &[Value], env: &Env, file: &str) -> (Vec<ConfigError>, Vec<ConfigError>) {
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    let text = |b: &Value, key: &str| b.get(key).and_then(Value::as_str).map(str::to_string);
    for binding in bindings {
        let is_blob_output = text(binding, "type").is_some_and(|t| t.eq_ignore_ascii_case("blob"))
            && text(binding, "direction").is_some_and(|d| d.eq_ignore_ascii_case("out"));
        let (true, Some(path)) = (is_blob_output, text(binding, "path")) else { continue };
        let Some(resolved) = resolve_settings(&path, env) else { continue };
        let name = text(binding, "name").unwrap_or_default();
        let lower = resolved.to_ascii_lowercase();
        let setting = format!("bindings.{name}.path in {file}");
        if lower.contains("{rand-guid") || lower.contains("{sys.randguid}") {
            continue;
        }
        if lower.contains("{datetime") || lower.contains("{sys.utcnow}") {
            warnings.push(ConfigError::new(
                setting,
                format!("is {path:?}: blob names change once a second, so two invocations within a second (a host retry, a manual run) write the same blob and the later batch overwrites the earlier; add {{rand-guid}}, for example \"changes/{{DateTime}}-{{rand-guid}}.json\""),
            ));
        } else {
            errors.push(ConfigError::new(
                setting,
                format!("is {path:?}, the same blob for every invocation: each batch would overwrite the last before a consumer read it; add {{rand-guid}} to the path, for example \"changes/{{rand-guid}}.json\""),
            ));
        }
    }
    (errors, warnings)
}

/// `%Name%` replaced by app settings, as the host does for function.json values; `None` when one is missing.
fn resolve_settings(text: &str, env: &Env) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('%') {
        let end = rest[start + 1..].find('%')? + start + 1;
        out.push_str(&rest[..start]);
        out.push_str(env.get(&rest[start + 1..end])?);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

fn parse_entry(entry: &Value) -> Result<OutputShape, String> {
    let names = || OutputShape::NAMES.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
    let Some(map) = entry.as_object() else {
        return Err(format!("must be an object such as {{\"shape\": \"batch\"}} (shapes: {})", names()));
    };
    if let Some(key) = map.keys().find(|k| k.as_str() != "shape") {
        return Err(format!("unknown key {key:?}; the only key is \"shape\""));
    }
    let shape =
        map.get("shape").and_then(Value::as_str).ok_or_else(|| format!("needs \"shape\": one of {}", names()))?;
    OutputShape::NAMES
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(shape))
        .map(|(_, s)| *s)
        .ok_or_else(|| format!("shape {shape:?} is not a shape; use {}", names()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bindings() -> Vec<OutputBinding> {
        vec![
            OutputBinding { name: "q".into(), kind: "queue".into() },
            OutputBinding { name: "copy".into(), kind: "sql".into() },
            OutputBinding { name: "archive".into(), kind: "blob".into() },
        ]
    }

    #[test]
    fn defaults_send_changes_to_message_bindings_and_rows_to_sql() {
        let shapes = check(&bindings(), None, "f/sqltrigger.json").expect("valid");
        assert_eq!(shapes, OutputShapes::default());
        let r = routes(&bindings(), &shapes);
        let shapes: Vec<(&str, OutputShape, bool)> =
            r.iter().map(|r| (r.binding.as_str(), r.shape, r.collector)).collect();
        assert_eq!(
            shapes,
            vec![
                ("q", OutputShape::Changes, true),
                ("copy", OutputShape::Rows, true),
                ("archive", OutputShape::Changes, false)
            ]
        );
    }

    #[test]
    fn a_mapping_overrides_the_default_per_binding() {
        let o = json!({"q": {"shape": "batch"}, "archive": {"shape": "rows"}});
        let r = routes(&bindings(), &check(&bindings(), Some(&o), "f/sqltrigger.json").expect("valid"));
        assert_eq!(r[0].shape, OutputShape::Batch);
        assert_eq!(r[2].shape, OutputShape::Rows);
    }

    #[test]
    fn a_blob_path_that_names_the_same_blob_every_time_is_refused_naming_the_fix() {
        let env = Env::from_pairs([("ArchivePath".to_string(), "archive/latest.json".to_string())]);
        let blob = |name: &str, path: &str| json!({"type": "blob", "direction": "out", "name": name, "path": path});
        let bindings = vec![
            blob("fixed", "archive/batch.json"),
            blob("setting", "%ArchivePath%"),
            blob("timed", "archive/{DateTime}.json"),
            blob("unique", "archive/{rand-guid}.json"),
            blob("unique_sys", "archive/{sys.randguid}.json"),
            blob("unresolved", "%Missing%"),
            json!({"type": "queue", "direction": "out", "name": "q", "queueName": "q"}),
        ];
        let (errors, warnings) = check_blob_paths(&bindings, &env, "f/function.json");
        let errors: Vec<String> = errors.iter().map(ToString::to_string).collect();
        let warnings: Vec<String> = warnings.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 2, "{errors:#?}");
        assert!(
            errors[0].starts_with(
                "bindings.fixed.path in f/function.json: is \"archive/batch.json\", the same blob for every invocation"
            ),
            "{}",
            errors[0]
        );
        assert!(errors[0].contains("add {rand-guid} to the path"), "{}", errors[0]);
        assert!(errors[1].starts_with("bindings.setting.path"), "{}", errors[1]);
        assert_eq!(warnings.len(), 1, "{warnings:#?}");
        assert!(
            warnings[0].starts_with("bindings.timed.path") && warnings[0].contains("once a second"),
            "{}",
            warnings[0]
        );
    }

    #[test]
    fn every_mistake_is_reported_naming_the_binding() {
        let o = json!({
            "nope": {"shape": "rows"}, "q": {"shape": "lines"}, "copy": {"shape": "changes"}, "archive": "batch"
        });
        let errors = check(&bindings(), Some(&o), "f/sqltrigger.json").unwrap_err();
        let text: Vec<String> = errors.iter().map(ToString::to_string).collect();
        assert_eq!(errors.len(), 4, "{text:#?}");
        assert!(text[0].starts_with("outputs.nope in f/sqltrigger.json: names output binding \"nope\""), "{}", text[0]);
        assert!(text[0].contains("q, copy, archive"), "{}", text[0]);
        assert!(text.iter().any(|t| t.contains("shape \"lines\" is not a shape")), "{text:#?}");
        assert!(text.iter().any(|t| t.contains("outputs.copy") && t.contains("can only be rows")), "{text:#?}");
        assert!(text.iter().any(|t| t.contains("outputs.archive") && t.contains("must be an object")), "{text:#?}");
    }
}
