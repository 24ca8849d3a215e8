//! The custom-handler wire format from the host's side: the timer request body with the host's exact time
//! formats, and the lenient decoding of the handler's answer.

use serde_json::{json, Map, Value};
use sql_pseudo_trigger::protocol::RetryContext;
use std::collections::BTreeMap;
use time::format_description::FormatItem;
use time::macros::format_description;
use time::OffsetDateTime;

/// The timer trigger's value for one firing, keyed by the trigger binding's name. `status` is the schedule
/// monitor's (last firing, next occurrence); `None` without a monitor, which the host sends as null.
pub(super) fn timer_data(binding: &str, status: Option<(Option<OffsetDateTime>, OffsetDateTime)>) -> Value {
    let status = status.map_or(Value::Null, |(last_fired, next)| {
        // On the very first firing the host reports DateTime.MinValue without an offset.
        let last = last_fired.map_or_else(|| "0001-01-01T00:00:00".to_string(), |t| format_time(t, WITH_OFFSET));
        json!({ "Last": last, "Next": format_time(next, WHOLE_SECONDS), "LastUpdated": last })
    });
    let mut data = Map::new();
    data.insert(
        binding.to_string(),
        json!({ "Schedule": { "AdjustForDST": true }, "ScheduleStatus": status, "IsPastDue": false }),
    );
    Value::Object(data)
}

/// The trigger value of a manual run (portal Test/Run, `POST /admin/functions/{name}`): the timer binding
/// builds a fresh `TimerInfo` with the monitor's status, null without a monitor, and `IsPastDue` false
/// (azure-webjobs-sdk-extensions `TimerTriggerBinding.BindAsync`).
pub(super) fn manual_timer_data(binding: &str) -> Value {
    let mut data = Map::new();
    data.insert(
        binding.to_string(),
        json!({ "Schedule": { "AdjustForDST": true }, "ScheduleStatus": null, "IsPastDue": false }),
    );
    Value::Object(data)
}

/// The whole `POST /{function}` body: `Data`, and `Metadata` with `sys` and, under a retry policy,
/// `RetryContext` on every attempt as azure-functions-host `SetRetryContext` copies it: `RetryCount`,
/// `MaxRetryCount`, and on a retry the previous attempt's `FunctionInvocationException`, serialized by
/// Newtonsoft through `ISerializable` (its `InstanceId` is the failed attempt's invocation id).
pub(super) fn request(function: &str, data: &Value, retry: Option<&RetryContext>) -> Value {
    let mut metadata = Map::new();
    metadata.insert(
        "sys".into(),
        json!({
            "MethodName": function,
            "UtcNow": format_time(OffsetDateTime::now_utc(), UTC_NOW),
            "RandGuid": uuid::Uuid::new_v4().to_string(),
        }),
    );
    if let Some(retry) = retry {
        let exception = match (&retry.failed_invocation, retry.is_retry()) {
            (Some(failed), _) => json!({
                "InstanceId": failed,
                "MethodName": format!("Host.Functions.{function}"),
                "ClassName": "Microsoft.Azure.WebJobs.Host.FunctionInvocationException",
                "Message": format!("Exception while executing function: Functions.{function}"),
                "Data": null,
                "InnerException": {
                    "ClassName": "System.InvalidOperationException",
                    "Message": "Error while handling parameter _binder after function returned:",
                    "Data": null, "InnerException": null, "HResult": -2146233079
                },
                "HelpURL": null, "StackTraceString": null, "RemoteStackTraceString": null, "RemoteStackIndex": 0,
                "ExceptionMethod": null, "HResult": -2146233088, "Source": "Microsoft.Azure.WebJobs.Host",
                "WatsonBuckets": null
            }),
            (None, true) => json!({
                "ClassName": "System.Exception",
                "Message": "a failure the host reports without an invocation id",
            }),
            (None, false) => Value::Null,
        };
        metadata.insert(
            "RetryContext".into(),
            json!({
                "RetryCount": retry.retry_count,
                "MaxRetryCount": retry.max_retry_count,
                "Exception": exception,
                "Instance": null,
                "State": {},
            }),
        );
    }
    json!({ "Data": data, "Metadata": metadata })
}

pub(super) type Answer = (BTreeMap<String, Value>, Vec<String>, Option<Value>);

/// Decodes `{"Outputs":{...},"Logs":[...],"ReturnValue":...}` as the handler wrote it. Keys match
/// case-insensitively, as the host's JSON reader does; every part may be missing or null. An answer the host's
/// Newtonsoft reader refuses (too deep, an integer past 380 digits, a date past `DateTime.MaxValue`) fails
/// too, as the host fails such an invocation.
pub(super) fn decode_answer(body: &str) -> Result<Answer, String> {
    let value: Value = serde_json::from_str(body)
        .map_err(|err| format!("the handler's 2xx answer is not JSON ({err}); the host fails such an invocation"))?;
    super::newtonsoft::read_answer(body, super::dotnet::HostZone::UTC)
        .map_err(|err| format!("the host cannot read the answer ({err}); it fails such an invocation"))?;
    let Value::Object(fields) = value else {
        return Err("the handler's 2xx answer is not a JSON object; the host fails such an invocation".into());
    };
    let field = |name: &str| {
        fields
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.clone())
            .filter(|value| !value.is_null())
    };
    let outputs = match field("Outputs") {
        None => BTreeMap::new(),
        Some(Value::Object(map)) => map.into_iter().collect(),
        Some(_) => return Err("Outputs must be a JSON object keyed by binding name".into()),
    };
    let logs = match field("Logs") {
        None => Vec::new(),
        Some(Value::Array(lines)) => lines
            .into_iter()
            .map(|line| match line {
                Value::String(s) => s,
                other => other.to_string(),
            })
            .collect(),
        Some(_) => return Err("Logs must be a JSON array of strings".into()),
    };
    Ok((outputs, logs, field("ReturnValue")))
}

const WITH_OFFSET: &[FormatItem<'static>] = format_description!(
    "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:7][offset_hour sign:mandatory]:[offset_minute]"
);
const WHOLE_SECONDS: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second][offset_hour sign:mandatory]:[offset_minute]");
const UTC_NOW: &[FormatItem<'static>] =
    format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:7]Z");

fn format_time(time: OffsetDateTime, format: &[FormatItem<'static>]) -> String {
    time.format(format).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_decode_leniently_and_non_json_is_a_failure() {
        let (outputs, logs, ret) =
            decode_answer(r#"{"outputs":{"changes":[1,2]},"Logs":null,"ReturnValue":{"a":1}}"#).expect("decodes");
        assert_eq!(outputs["changes"], json!([1, 2]));
        assert!(logs.is_empty());
        assert_eq!(ret, Some(json!({"a": 1})));
        assert!(decode_answer("").is_err());
        assert!(decode_answer("[1]").is_err());
        assert!(decode_answer(r#"{"Outputs":[1]}"#).is_err());
    }

    #[test]
    fn host_times_have_seven_digit_fractions_and_offsets() {
        let time = time::macros::datetime!(2026-11-22 02:45:00.0031245 UTC);
        assert_eq!(format_time(time, WITH_OFFSET), "2026-11-22T02:45:00.0031245+00:00");
        assert_eq!(format_time(time, WHOLE_SECONDS), "2026-11-22T02:45:00+00:00");
        assert_eq!(format_time(time, UTC_NOW), "2026-11-22T02:45:00.0031245Z");
    }
}
