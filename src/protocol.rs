//! The custom-handler wire types: what the Functions host POSTs to `/{function}` and what it expects back.
//!
//! Decoding is strict where a value drives a decision and lenient, on purpose and with a reason, where the
//! host's own output varies. A body that is not a well-formed invocation is refused before any state is read:
//! an answer given to something that is not the host never reaches an output binding, so a batch answered to
//! it would be acknowledged by the next real invocation and lost.
//!
//! What the host sends (azure-functions-host `ScriptInvocationContextExtensions.ToHttpScriptInvocationContext`,
//! serialized by `HttpScriptInvocationContextExtensions.ToHttpRequestMessage` with Newtonsoft at default
//! settings): a JSON object `{"Data": {...}, "Metadata": {...}}`; `Data` holds each input binding's value by
//! binding name (for a timer, the `TimerInfo` object); `Metadata` holds the binding data (`sys`, and others)
//! and, whenever function.json has a `retry` policy, `RetryContext` on *every* attempt, the first included
//! (azure-webjobs-sdk `FunctionExecutorExtensions.TryExecuteAsync` creates it before the first attempt;
//! `SetRetryContext` copies `RetryCount`, `MaxRetryCount` and `Exception`). A retry's `Exception` is the
//! previous attempt's failure, a `FunctionInvocationException` whose `InstanceId` is that attempt's invocation
//! id (`FunctionExecutor.GetExceptionDispatchInfo`), the id the host sent in `X-Azure-Functions-InvocationId`
//! (`DefaultHttpWorkerService.AddHeaders`). No logic lives here.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use time::OffsetDateTime;

/// The header that carries the invocation id; the host sets it on every invocation.
pub const INVOCATION_ID_HEADER: &str = "x-azure-functions-invocationid";

/// The body of `POST /{function}`, checked.
#[derive(Debug, Default)]
pub struct InvocationRequest {
    /// Input binding values by binding name; for a timer, `{"timer": {...}}`.
    pub data: BTreeMap<String, Value>,
    /// `Metadata.RetryContext`: present on every attempt when function.json has a retry policy.
    pub retry: Option<RetryContext>,
}

/// The host's retry state for one attempt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct RetryContext {
    /// 0 on the first attempt; 1 on the first retry.
    pub retry_count: i64,
    /// The policy's maximum; -1 means retry forever.
    pub max_retry_count: i64,
    /// On a retry: the invocation id of the attempt that failed (`Exception.InstanceId`), when the host named
    /// it. Every failure after the handler was invoked is named; `None` only for a failure the host reports
    /// without one.
    #[serde(skip)]
    pub failed_invocation: Option<String>,
}

impl RetryContext {
    /// A first attempt under a policy of `max_retry_count` retries.
    pub fn first(max_retry_count: i64) -> Self {
        Self { retry_count: 0, max_retry_count, failed_invocation: None }
    }

    /// Retry `retry_count` of a policy of `max_retry_count`, after the failure of invocation `failed`.
    pub fn after(retry_count: i64, max_retry_count: i64, failed: impl Into<String>) -> Self {
        Self { retry_count, max_retry_count, failed_invocation: Some(failed.into()) }
    }

    /// True when the host is re-running an invocation whose earlier attempt failed.
    pub fn is_retry(&self) -> bool {
        self.retry_count > 0
    }

    /// True when the host will not retry again if this attempt's output write fails.
    pub fn is_final(&self) -> bool {
        self.max_retry_count >= 0 && self.retry_count >= self.max_retry_count
    }
}

/// One attempt of an invocation as the engine sees it: its id and its retry context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attempt {
    /// `X-Azure-Functions-InvocationId`; a later retry names it when this attempt fails.
    pub id: String,
    /// `None` when function.json has no retry policy (the host then sends none).
    pub retry: Option<RetryContext>,
}

impl Attempt {
    pub fn new(id: impl Into<String>, retry: Option<RetryContext>) -> Self {
        Self { id: id.into(), retry }
    }

    /// An attempt with a new invocation id, as the host makes one (tests and tools that play the host).
    pub fn fresh(retry: Option<RetryContext>) -> Self {
        Self::new(uuid::Uuid::new_v4().to_string(), retry)
    }

    /// A retry: the host is telling that an earlier attempt failed.
    pub fn is_retry(&self) -> bool {
        self.retry.as_ref().is_some_and(RetryContext::is_retry)
    }

    /// If this attempt's output write fails, nobody will say so.
    pub fn is_final(&self) -> bool {
        self.retry.as_ref().is_none_or(RetryContext::is_final)
    }
}

/// Why a request is not a host invocation; the message names the part and what the host sends instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Malformed(pub String);

fn malformed(message: impl Into<String>) -> Malformed {
    Malformed(message.into())
}

/// The JSON kind of a value, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Checks the invocation id header: the host sends a GUID (`Guid.ToString()`) on every invocation.
pub fn invocation_id(header: Option<&str>) -> Result<String, Malformed> {
    let Some(id) = header.map(str::trim).filter(|id| !id.is_empty()) else {
        return Err(malformed(
            "the request has no X-Azure-Functions-InvocationId header: it does not come from the Functions host, which sends one with every invocation",
        ));
    };
    uuid::Uuid::parse_str(id)
        .map(|u| u.hyphenated().to_string())
        .map_err(|_| malformed("the X-Azure-Functions-InvocationId header is not a GUID, as the Functions host sends"))
}

impl InvocationRequest {
    /// Decodes and checks a body; see the module docs for what the host sends.
    pub fn decode(body: &[u8]) -> Result<Self, Malformed> {
        // Lenient: a blank body is a manual run as some host versions and tools send it. It carries no retry
        // context, so it names no failure, and proves nothing the engine relies on.
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let text = std::str::from_utf8(body)
            .map_err(|e| malformed(format!("the request body is not UTF-8 ({e}); the host sends JSON")))?;
        let value: Value = serde_json::from_str(text).map_err(|e| {
            malformed(format!(
                "the request body is not JSON ({e}); the host sends {{\"Data\":{{...}},\"Metadata\":{{...}}}}"
            ))
        })?;
        let Value::Object(top) = value else {
            return Err(malformed(format!(
                "the request body is {}, not an invocation; the host sends a JSON object {{\"Data\":{{...}},\"Metadata\":{{...}}}}",
                kind(&value)
            )));
        };
        // Other top-level keys are ignored: a newer host may add some, and they decide nothing here.
        let data = match top.get("Data") {
            Some(Value::Object(data)) => data.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            Some(other) => return Err(malformed(format!("Data is {}; the host sends an object", kind(other)))),
            None => return Err(malformed("the body has no Data; the host sends the trigger's value under Data")),
        };
        let metadata = match top.get("Metadata") {
            Some(Value::Object(metadata)) => metadata,
            Some(other) => return Err(malformed(format!("Metadata is {}; the host sends an object", kind(other)))),
            None => return Err(malformed("the body has no Metadata; the host sends binding data under Metadata")),
        };
        if let Some(sys) = metadata.get("sys") {
            check_sys(sys)?;
        }
        let retry = match metadata.get("RetryContext") {
            None | Some(Value::Null) => None,
            Some(Value::Object(context)) => Some(retry_context(context)?),
            Some(other) => {
                return Err(malformed(format!("Metadata.RetryContext is {}; the host sends an object", kind(other))))
            }
        };
        Ok(Self { data, retry })
    }

    /// Checks that `Data` holds the timer binding `binding` as the host sends a `TimerInfo`.
    pub fn check_timer(&self, binding: &str) -> Result<(), Malformed> {
        match self.data.get(binding) {
            Some(Value::Object(timer)) => check_timer(binding, timer),
            Some(other) => Err(malformed(format!(
                "Data.{binding} is {}; the host sends the timer as an object (Schedule, ScheduleStatus, IsPastDue)",
                kind(other)
            ))),
            None => Err(malformed(format!(
                "Data has no {binding:?}, this function's timer binding; the host sends the timer under its binding name"
            ))),
        }
    }
}

/// An integer the host serializes from a .NET `int`; anything else is not from the host.
fn whole(context: &Map<String, Value>, key: &str) -> Result<i64, Malformed> {
    match context.get(key) {
        Some(Value::Number(n)) => n
            .as_i64()
            .filter(|n| i32::try_from(*n).is_ok())
            .ok_or_else(|| malformed(format!("Metadata.RetryContext.{key} is {n}, not a whole number the host sends"))),
        Some(other) => {
            Err(malformed(format!("Metadata.RetryContext.{key} is {}; the host sends a number", kind(other))))
        }
        None => Err(malformed(format!("Metadata.RetryContext has no {key}; the host always sends it"))),
    }
}

fn retry_context(context: &Map<String, Value>) -> Result<RetryContext, Malformed> {
    let retry_count = whole(context, "RetryCount")?;
    let max_retry_count = whole(context, "MaxRetryCount")?;
    if retry_count < 0 {
        return Err(malformed(format!("Metadata.RetryContext.RetryCount is {retry_count}; it is never negative")));
    }
    if max_retry_count < -1 {
        return Err(malformed(format!(
            "Metadata.RetryContext.MaxRetryCount is {max_retry_count}; the host sends -1 (forever) or more"
        )));
    }
    if max_retry_count >= 0 && retry_count > max_retry_count {
        return Err(malformed(format!(
            "Metadata.RetryContext.RetryCount {retry_count} is above MaxRetryCount {max_retry_count}; the host never retries past its policy"
        )));
    }
    let exception = match context.get("Exception") {
        None | Some(Value::Null) => None,
        Some(Value::Object(exception)) => Some(exception),
        Some(other) => {
            return Err(malformed(format!(
                "Metadata.RetryContext.Exception is {}; the host sends the failure as an object, or null",
                kind(other)
            )))
        }
    };
    let failed_invocation = match (retry_count, exception) {
        // The host sets Exception only when it retries (FunctionExecutorExtensions): a first attempt has none.
        (0, Some(_)) => {
            return Err(malformed(
                "Metadata.RetryContext has an Exception on a first attempt (RetryCount 0); the host sends one only on retries",
            ))
        }
        (0, None) => None,
        (_, None) => {
            return Err(malformed(
                "Metadata.RetryContext is a retry (RetryCount above 0) without the Exception that made the host retry",
            ))
        }
        (_, Some(exception)) => match exception.get("InstanceId") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) => Some(uuid::Uuid::parse_str(id).map(|u| u.hyphenated().to_string()).map_err(
                |_| malformed("Metadata.RetryContext.Exception.InstanceId is not a GUID, as the host sends"),
            )?),
            Some(other) => {
                return Err(malformed(format!(
                    "Metadata.RetryContext.Exception.InstanceId is {}; the host sends the failed invocation's id as a string",
                    kind(other)
                )))
            }
        },
    };
    Ok(RetryContext { retry_count, max_retry_count, failed_invocation })
}

fn check_sys(sys: &Value) -> Result<(), Malformed> {
    let sys = match sys {
        Value::Object(sys) => sys,
        Value::Null => return Ok(()),
        other => return Err(malformed(format!("Metadata.sys is {}; the host sends an object", kind(other)))),
    };
    for key in ["MethodName", "RandGuid"] {
        if let Some(v) = sys.get(key).filter(|v| !v.is_string() && !v.is_null()) {
            return Err(malformed(format!("Metadata.sys.{key} is {}; the host sends a string", kind(v))));
        }
    }
    if let Some(v) = sys.get("UtcNow").filter(|v| !v.is_null()) {
        date("Metadata.sys.UtcNow", v)?;
    }
    Ok(())
}

fn check_timer(binding: &str, timer: &Map<String, Value>) -> Result<(), Malformed> {
    if let Some(v) = timer.get("IsPastDue").filter(|v| !v.is_boolean()) {
        return Err(malformed(format!("Data.{binding}.IsPastDue is {}; the host sends a boolean", kind(v))));
    }
    if let Some(v) = timer.get("Schedule").filter(|v| !v.is_object() && !v.is_null()) {
        return Err(malformed(format!("Data.{binding}.Schedule is {}; the host sends an object", kind(v))));
    }
    match timer.get("ScheduleStatus") {
        // Lenient: null when the schedule monitor is off (manual runs, and every run of a schedule more frequent
        // than once a minute, for which the timer extension turns `useMonitor` off).
        None | Some(Value::Null) => Ok(()),
        Some(Value::Object(status)) => {
            for key in ["Last", "Next", "LastUpdated"] {
                if let Some(v) = status.get(key) {
                    date(&format!("Data.{binding}.ScheduleStatus.{key}"), v)?;
                }
            }
            Ok(())
        }
        Some(other) => Err(malformed(format!(
            "Data.{binding}.ScheduleStatus is {}; the host sends an object, or null",
            kind(other)
        ))),
    }
}

/// Parses a date as Newtonsoft writes a .NET `DateTime`: ISO 8601 with up to seven fractional digits, and an
/// offset, `Z`, or (lenient: an unspecified `DateTime`, such as the first run's `0001-01-01T00:00:00`) none,
/// read as UTC.
pub fn parse_host_date(text: &str) -> Option<OffsetDateTime> {
    use time::{Date, Month, PrimitiveDateTime, Time, UtcOffset};
    let b = text.as_bytes();
    let digits = |r: std::ops::Range<usize>| -> Option<u32> {
        let s = text.get(r)?;
        (!s.is_empty() && s.bytes().all(|c| c.is_ascii_digit())).then(|| s.parse().ok()).flatten()
    };
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || b[10] != b'T' || b[13] != b':' || b[16] != b':' {
        return None;
    }
    let date = Date::from_calendar_date(
        digits(0..4)? as i32,
        Month::try_from(u8::try_from(digits(5..7)?).ok()?).ok()?,
        u8::try_from(digits(8..10)?).ok()?,
    )
    .ok()?;
    let mut rest = 19;
    let mut nanos = 0u32;
    if b.get(19) == Some(&b'.') {
        let end = (20..b.len()).find(|&i| !b[i].is_ascii_digit()).unwrap_or(b.len());
        let fraction = text.get(20..end)?;
        if fraction.is_empty() || fraction.len() > 9 {
            return None;
        }
        nanos = fraction.parse::<u32>().ok()? * 10u32.pow(9 - fraction.len() as u32);
        rest = end;
    }
    let time = Time::from_hms_nano(
        u8::try_from(digits(11..13)?).ok()?,
        u8::try_from(digits(14..16)?).ok()?,
        u8::try_from(digits(17..19)?).ok()?,
        nanos,
    )
    .ok()?;
    let offset = match &text[rest..] {
        "" | "Z" => UtcOffset::UTC,
        tail => {
            let t = tail.as_bytes();
            if t.len() != 6 || !matches!(t[0], b'+' | b'-') || t[3] != b':' {
                return None;
            }
            let sign = if t[0] == b'-' { -1 } else { 1 };
            let (h, m) = (digits(rest + 1..rest + 3)? as i8, digits(rest + 4..rest + 6)? as i8);
            UtcOffset::from_hms(sign * h, sign * m, 0).ok()?
        }
    };
    Some(PrimitiveDateTime::new(date, time).assume_offset(offset))
}

fn date(what: &str, v: &Value) -> Result<OffsetDateTime, Malformed> {
    match v {
        Value::String(s) => parse_host_date(s).ok_or_else(|| {
            malformed(format!("{what} is {s:?}, not a date as the host writes one (2026-11-22T02:45:00.0031245+00:00)"))
        }),
        other => Err(malformed(format!("{what} is {}; the host sends a date string", kind(other)))),
    }
}

/// The answer to an invocation. `Outputs` feeds output bindings by name; `Logs` are logged by the host under
/// the invocation.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "PascalCase")]
pub struct InvocationResponse {
    pub outputs: BTreeMap<String, Box<RawValue>>,
    pub logs: Vec<String>,
    pub return_value: Option<Box<RawValue>>,
}

#[cfg(test)]
mod tests;
