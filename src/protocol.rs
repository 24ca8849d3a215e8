//! The custom-handler wire types: what the Functions host POSTs to `/{function}` and what it expects back.
//!
//! Parsing is lenient on purpose. The host's timer payload varies between versions and call paths:
//! `ScheduleStatus` is null for manual and admin runs, the first run's `Last` is `0001-01-01T00:00:00` with no
//! offset, fractions have seven digits, and `RetryContext` is present only while the host retries under a
//! `retry` policy. None of those details change what a tick does, so they are kept as loose JSON and only the
//! retry context is typed. No logic lives here.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::collections::BTreeMap;

/// The body of `POST /{function}`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct InvocationRequest {
    /// Input binding values by binding name; for a timer, `{"timer": {...}}`.
    #[serde(default)]
    pub data: BTreeMap<String, Value>,
    #[serde(default)]
    pub metadata: Metadata,
}

#[derive(Debug, Default, Deserialize)]
pub struct Metadata {
    /// Present only when function.json has a `retry` policy and the host is retrying this invocation.
    #[serde(rename = "RetryContext", default)]
    pub retry_context: Option<RetryContext>,
    #[serde(rename = "sys", default)]
    pub sys: Option<Value>,
}

/// The host's retry state for this invocation.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct RetryContext {
    /// 0 on the first attempt; 1 on the first retry.
    #[serde(default, deserialize_with = "lenient_i64")]
    pub retry_count: i64,
    /// The policy's maximum; -1 means retry forever.
    #[serde(default, deserialize_with = "lenient_i64")]
    pub max_retry_count: i64,
}

impl RetryContext {
    /// True when the host is re-running an invocation whose earlier attempt failed.
    pub fn is_retry(&self) -> bool {
        self.retry_count > 0
    }

    /// True when the host will not retry again if this attempt's output write fails.
    /// Without a `RetryContext` (a first attempt) the host's policy may still retry, so it is never final.
    pub fn is_final(&self) -> bool {
        self.is_retry() && self.max_retry_count >= 0 && self.retry_count >= self.max_retry_count
    }
}

/// Numbers arrive as JSON numbers, but some proxies and older hosts send them as strings.
fn lenient_i64<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match Value::deserialize(d)? {
        Value::Number(n) => n.as_i64().ok_or_else(|| serde::de::Error::custom("retry count out of range")),
        Value::String(s) => s.trim().parse().map_err(|_| serde::de::Error::custom("retry count is not a number")),
        Value::Null => Ok(0),
        _ => Err(serde::de::Error::custom("retry count is not a number")),
    }
}

impl InvocationRequest {
    /// Decodes a body, tolerating every variant the host sends. An empty body is a manual run.
    pub fn decode(body: &[u8]) -> Result<Self, String> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Self::default());
        }
        let text = std::str::from_utf8(body)
            .map_err(|e| format!("the request body is not UTF-8 ({e}); the host sends JSON"))?;
        serde_json::from_str(text).map_err(|e| {
            format!(
                "the request body is not a Functions invocation ({e}); expected {{\"Data\":{{...}},\"Metadata\":{{...}}}}"
            )
        })
    }

    pub fn retry(&self) -> RetryContext {
        self.metadata.retry_context.unwrap_or_default()
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
mod tests {
    use super::*;

    #[test]
    fn decodes_a_first_run_timer_without_offset() {
        let body = br#"{"Data":{"timer":{"Schedule":{"AdjustForDST":true},"ScheduleStatus":{"Last":"0001-01-01T00:00:00","Next":"2026-11-22T02:50:00+00:00","LastUpdated":"0001-01-01T00:00:00"},"IsPastDue":false}},"Metadata":{"sys":{"MethodName":"OrdersChanged","UtcNow":"2026-11-22T02:50:00.0123456Z","RandGuid":"24ad4c06-24ad-4e5b-8294-3da9714877e9"}}}"#;
        let req = InvocationRequest::decode(body).expect("decodes");
        assert!(!req.retry().is_retry());
        assert!(req.data.contains_key("timer"));
    }

    #[test]
    fn decodes_a_manual_run_with_null_schedule_status() {
        let body = br#"{"Data":{"timer":{"Schedule":null,"ScheduleStatus":null,"IsPastDue":true}},"Metadata":{}}"#;
        assert!(InvocationRequest::decode(body).is_ok());
    }

    #[test]
    fn decodes_a_retry_context_and_knows_the_final_attempt() {
        let body = br#"{"Data":{},"Metadata":{"RetryContext":{"RetryCount":3,"MaxRetryCount":3,"Exception":{"ClassName":"X","Message":"m"}}}}"#;
        let retry = InvocationRequest::decode(body).expect("decodes").retry();
        assert!(retry.is_retry());
        assert!(retry.is_final());
        let forever = RetryContext { retry_count: 9, max_retry_count: -1 };
        assert!(!forever.is_final());
        assert!(!RetryContext::default().is_final(), "a first attempt is never the final one");
    }

    #[test]
    fn an_empty_body_is_a_manual_run() {
        assert!(!InvocationRequest::decode(b"  ").expect("decodes").retry().is_retry());
    }

    #[test]
    fn rejects_non_utf8_and_wrong_shapes_with_a_message() {
        assert!(InvocationRequest::decode(&[0xff, 0xfe]).unwrap_err().contains("UTF-8"));
        assert!(InvocationRequest::decode(b"[1,2]").unwrap_err().contains("not a Functions invocation"));
        assert!(InvocationRequest::decode(br#"{"Metadata":{"RetryContext":{"RetryCount":{}}}}"#).is_err());
    }
}
