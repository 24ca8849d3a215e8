//! What each output binding really receives from a handler's answer: the host's steps from `Outputs[name]` to
//! the destination, for the binding types the trigger feeds (queue, serviceBus, eventHub, sql, blob).
//!
//! The steps, in the host's order (file names are in Azure/azure-functions-host unless said otherwise):
//! 1. The body is read by Newtonsoft ([`super::newtonsoft::read_answer`]): numbers, dates and duplicates
//!    change there already.
//! 2. `HttpScriptInvocationResultExtensions.GetOutputValue` takes `Outputs[binding name]` (exact key), and
//!    `GetBindingValue` base64-decodes it when it is a string that `Convert.FromBase64String` accepts, unless
//!    the binding's `dataType` is `binary`. With no `$return` binding, a `ReturnValue` object's members replace
//!    outputs of the same name, undecoded (`WorkerFunctionInvoker.HandleOutputDictionary`).
//! 3. `WorkerFunctionInvoker.BindOutputsAsync` skips null values and binds the others, all bindings at once.
//! 4. `ExtensionBinding.BindAsync` picks the binding's default type, which the extension's rules decide
//!    (azure-webjobs-sdk `JobHostMetadataProvider.GetDefaultType`, `AsyncCollectorBindingProvider.GetDefaultType`:
//!    the first of `byte[]`, `JObject`, `string` the extension converts from):
//!    - queue: `IAsyncCollector<byte[]>` (azure-sdk-for-net `QueuesExtensionConfigProvider`: a `byte[]`
//!      converter to `QueueMessage`); Event Hubs likewise (`EventHubExtensionConfigProvider`);
//!    - serviceBus: `IAsyncCollector<string>` (`ServiceBusExtensionConfigProvider` binds output with a plain
//!      `IBindingProvider`, which has no rules, so `GetDefaultType` falls back to string);
//!    - sql: `IAsyncCollector<JObject>` (Azure/azure-functions-sql-extension `SqlBindingConfigProvider`:
//!      `BindToCollector<SQLObjectOpenType>`, which matches `JObject` but not `byte[]`);
//!    - blob: `Stream` (`BlobsExtensionConfigProvider`: `BindToStream(..., FileAccess.ReadWrite)`).
//! 5. A collector gets `FunctionBinding.ReadAsEnumerable(value)`: a `JArray`'s elements; a string that looks
//!    like JSON (`Utility.IsJson`) parsed again by `JToken.Parse`; anything else as one item. Each item is
//!    converted by `FunctionBinding.BindAsyncCollectorAsync<T>`: `byte[]` as is, else `ToString()` (indented
//!    JSON for objects and arrays, the bare text of a string) as UTF-8 for `byte[]` or as the string; for
//!    `JObject` an object as is and anything else `null`, which `SqlAsyncCollector.AddAsync` skips: strings,
//!    numbers and arrays sent to a sql binding are dropped silently.
//! 6. A `Stream` gets `FunctionBinding.ConvertValueToStream(value)`: bytes, a string's UTF-8, a token's compact
//!    JSON (`ToString(Formatting.None)`), and for plain numbers their binary form (`BitConverter`); a date has
//!    no conversion and the write throws.
//! 7. The SQL extension writes the rows it collected as one JSON text (`SqlAsyncCollector.GenerateDataQueryForMerge`,
//!    `Utils.JsonSerializeObject` with `DateFormatString = "yyyy'-'MM'-'dd'T'HH':'mm':'ss'.'fffZ"`): dates keep
//!    milliseconds only, with a literal `Z`. Before that it reads the first row as `Dictionary<string, string>`
//!    (`GetExtraProperties`, `GetColumnNamesFromItem`), which throws when that row holds an object or array.

use super::app::Binding;
use super::dotnet::{self, HostZone};
use super::newtonsoft::{self, DateFormat, Formatting, HostAnswer, JToken, ReadOptions};
use serde_json::Value;

/// The host process the model plays: its time zone and newline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostModel {
    pub zone: HostZone,
    /// `Environment.NewLine`, which `JToken.ToString()` indents with: `\n` on Linux, `\r\n` on Windows.
    pub newline: &'static str,
}

impl Default for HostModel {
    /// A Linux host in UTC: the Functions default (no `WEBSITE_TIME_ZONE` / `TZ`).
    fn default() -> Self {
        Self { zone: HostZone::UTC, newline: "\n" }
    }
}

/// One thing a binding delivered to its destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// A queue, Service Bus or Event Hubs message body. (The queue client then base64-encodes it: a queue
    /// message holds at most 48 KiB of these bytes.)
    Message(Vec<u8>),
    /// One row a sql binding upserts: the JSON the SQL extension hands SQL Server for it (`OPENJSON ... WITH`
    /// then converts each value to its column's type; that step is SQL Server's and not modelled).
    Row(String),
    /// One blob, written whole, at its resolved path.
    Blob { path: String, content: Vec<u8> },
}

impl Received {
    /// The body as text (lossy where it is not UTF-8).
    pub fn text(&self) -> String {
        match self {
            Self::Message(bytes) | Self::Blob { content: bytes, .. } => String::from_utf8_lossy(bytes).into_owned(),
            Self::Row(text) => text.clone(),
        }
    }

    /// What a consumer that parses the body as JSON gets (`serde_json`); a body that is not JSON is a string.
    pub fn to_value(&self) -> Value {
        let text = self.text();
        serde_json::from_str(&text).unwrap_or(Value::String(text))
    }
}

/// What the host hands a binding after `GetBindingValue`.
#[derive(Debug, Clone, PartialEq)]
pub enum BindingValue {
    Token(JToken),
    /// A string that was valid base64, decoded.
    Bytes(Vec<u8>),
}

/// The binding types the model knows, by the default type the host binds them to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindingKind {
    Queue,
    ServiceBus,
    EventHub,
    Sql,
    Blob,
}

impl BindingKind {
    /// function.json's `type`, compared as the host does (case-insensitively).
    pub fn of(binding_type: &str) -> Option<Self> {
        [("queue", Self::Queue), ("serviceBus", Self::ServiceBus), ("eventHub", Self::EventHub), ("sql", Self::Sql)]
            .into_iter()
            .chain([("blob", Self::Blob)])
            .find(|(name, _)| name.eq_ignore_ascii_case(binding_type))
            .map(|(_, kind)| kind)
    }

    /// Whether a failed write can leave a prefix of the batch written. Queue messages are sent one by one as
    /// they are added (`QueueAsyncCollector.AddAsync`); Event Hubs sends whole batches of events
    /// (`EventHubAsyncCollector`), approximated here per message; a sql batch is one transaction
    /// (`SqlAsyncCollector.UpsertRowsAsync`) and a blob one upload, so a failure writes nothing.
    pub fn writes_partially(&self) -> bool {
        matches!(self, Self::Queue | Self::ServiceBus | Self::EventHub)
    }
}

/// The value of `binding` in `answer`, after the host's base64 step; `None` when the host binds nothing.
pub fn binding_value(outputs: &[Binding], binding: &Binding, answer: &HostAnswer) -> Option<BindingValue> {
    let binary = binding
        .raw
        .as_object()
        .and_then(|raw| raw.iter().find(|(key, _)| key.eq_ignore_ascii_case("dataType")))
        .and_then(|(_, value)| value.as_str())
        .is_some_and(|data_type| data_type.eq_ignore_ascii_case("binary"));
    let decoded = |value: &JToken| match value {
        JToken::String(s) if !binary => {
            dotnet::from_base64(s).map_or_else(|| BindingValue::Token(value.clone()), BindingValue::Bytes)
        }
        _ => BindingValue::Token(value.clone()),
    };
    let has_return = outputs.iter().any(|b| b.name == "$return");
    let value = if binding.name == "$return" {
        answer.return_value.as_ref().map(decoded)
    } else {
        let from_return = match (&answer.return_value, has_return) {
            (Some(JToken::Object(members)), false) => {
                members.iter().find(|(key, _)| *key == binding.name).map(|(_, v)| BindingValue::Token(v.clone()))
            }
            _ => None,
        };
        from_return.or_else(|| answer.output(&binding.name).map(decoded))
    };
    value.filter(|v| *v != BindingValue::Token(JToken::Null))
}

/// What `binding` writes for `value`; `Err` is the exception that fails the write (nothing written).
pub fn receive(binding: &Binding, value: &BindingValue, model: &HostModel) -> Result<Vec<Received>, String> {
    let kind = BindingKind::of(&binding.kind).ok_or_else(|| {
        format!(
            "the host model does not know what a {:?} binding receives (it models queue, serviceBus, eventHub, sql and blob)",
            binding.kind
        )
    })?;
    match kind {
        BindingKind::Queue | BindingKind::EventHub => {
            Ok(items(value, model)?.iter().map(|item| Received::Message(item_bytes(item, model))).collect())
        }
        BindingKind::ServiceBus => Ok(items(value, model)?
            .iter()
            .map(|item| Received::Message(item_string(item, model).into_bytes()))
            .collect()),
        BindingKind::Sql => sql_rows(value, model),
        BindingKind::Blob => {
            let content = stream_bytes(value, model)?;
            let path = binding.raw.get("path").and_then(Value::as_str).unwrap_or_default();
            Ok(vec![Received::Blob { path: resolve_path(path), content }])
        }
    }
}

/// `FunctionBinding.ReadAsEnumerable`.
fn items(value: &BindingValue, model: &HostModel) -> Result<Vec<BindingValue>, String> {
    Ok(match value {
        BindingValue::Token(JToken::Array(items)) => items.iter().cloned().map(BindingValue::Token).collect(),
        BindingValue::Token(JToken::String(s)) if is_json(s) => {
            let options = ReadOptions { zone: model.zone, max_depth: newtonsoft::DEFAULT_MAX_DEPTH };
            match newtonsoft::parse(s, options).map_err(|e| format!("JToken.Parse of the output string: {e}"))? {
                JToken::Array(items) => items.into_iter().map(BindingValue::Token).collect(),
                token => vec![BindingValue::Token(token)],
            }
        }
        other => vec![other.clone()],
    })
}

/// `Utility.IsJson`: trimmed, starts with `{` and ends with `}`, or `[` and `]`.
fn is_json(s: &str) -> bool {
    let s = s.trim();
    (s.starts_with('{') && s.ends_with('}')) || (s.starts_with('[') && s.ends_with(']'))
}

/// `BindAsyncCollectorAsync<byte[]>`: bytes as is, anything else its `ToString()` in UTF-8.
fn item_bytes(item: &BindingValue, model: &HostModel) -> Vec<u8> {
    match item {
        BindingValue::Bytes(bytes) => bytes.clone(),
        BindingValue::Token(token) => newtonsoft::to_display_string(token, model.newline, model.zone).into_bytes(),
    }
}

/// `BindAsyncCollectorAsync<string>`: `value.ToString()`, which for a byte array is its type name.
fn item_string(item: &BindingValue, model: &HostModel) -> String {
    match item {
        BindingValue::Bytes(_) => "System.Byte[]".into(),
        BindingValue::Token(token) => newtonsoft::to_display_string(token, model.newline, model.zone),
    }
}

/// `BindAsyncCollectorAsync<JObject>` into `SqlAsyncCollector<JObject>`.
fn sql_rows(value: &BindingValue, model: &HostModel) -> Result<Vec<Received>, String> {
    let rows: Vec<JToken> = items(value, model)?
        .into_iter()
        .filter_map(|item| match item {
            BindingValue::Token(token @ JToken::Object(_)) => Some(token),
            _ => None, // converted to null, which AddAsync skips
        })
        .collect();
    if let Some(JToken::Object(first)) = rows.first() {
        if let Some((column, value)) = first.iter().find(|(_, v)| matches!(v, JToken::Object(_) | JToken::Array(_))) {
            let token = if matches!(value, JToken::Object(_)) { "StartObject" } else { "StartArray" };
            return Err(format!(
                "Error reading string. Unexpected token: {token}. Path '{column}' (the SQL extension reads the first row as Dictionary<string, string>)"
            ));
        }
    }
    Ok(rows
        .iter()
        .map(|row| Received::Row(newtonsoft::write_with_dates(row, DateFormat::SqlExtension, model.zone)))
        .collect())
}

/// `FunctionBinding.ConvertValueToStream`.
fn stream_bytes(value: &BindingValue, model: &HostModel) -> Result<Vec<u8>, String> {
    match value {
        BindingValue::Bytes(bytes) => Ok(bytes.clone()),
        BindingValue::Token(token) => match token {
            JToken::String(s) => Ok(s.clone().into_bytes()),
            // a long is cut to an int first: `BitConverter.GetBytes(unchecked((int)value))`
            JToken::Integer(n) => Ok((*n as i32).to_le_bytes().to_vec()),
            JToken::Boolean(b) => Ok(vec![u8::from(*b)]),
            JToken::Float(x) => Ok(x.to_le_bytes().to_vec()),
            JToken::Object(_) | JToken::Array(_) => {
                Ok(newtonsoft::write(token, Formatting::None, model.zone).into_bytes())
            }
            JToken::Date(_) | JToken::BigInteger(_) | JToken::Null => {
                Err("Value cannot be null. (Parameter 'buffer'): the host has no stream conversion for this value"
                    .into())
            }
        },
    }
}

/// A blob path with its per-write expressions resolved: `{rand-guid}` (and `{rand-guid:format}`) and
/// `{sys.randguid}` get a new GUID each time, `{datetime}` and `{sys.utcnow}` the time to the second
/// (azure-webjobs-sdk `BindingParameterResolver`, `SystemBindingData`, `BindingDataPathHelper`:
/// `yyyy-MM-ddTHH-mm-ssK`). Anything else is left as written.
pub fn resolve_path(path: &str) -> String {
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else { break };
        out.push_str(&rest[..open]);
        let expr = &rest[open + 1..open + close];
        let lower = expr.to_ascii_lowercase();
        if lower.starts_with("rand-guid") || lower == "sys.randguid" {
            let id = uuid::Uuid::new_v4();
            out.push_str(&if lower.ends_with(":n") { id.simple().to_string() } else { id.to_string() });
        } else if lower.starts_with("datetime") || lower == "sys.utcnow" {
            let now = time::OffsetDateTime::now_utc();
            let format = time::macros::format_description!("[year]-[month]-[day]T[hour]-[minute]-[second]Z");
            out.push_str(&now.format(format).unwrap_or_default());
        } else {
            out.push_str(&rest[open..=open + close]);
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[path = "receive_tests.rs"]
mod tests;
