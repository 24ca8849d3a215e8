//! The host's invocation: the decoder `server::host_attempt` and the host's date format.

use crate::config::RetryPolicy;
use crate::protocol::{Attempt, InvocationRequest};
use serde_json::{json, Map, Value};
use std::time::Duration;

/// The invocation decoder (`server::host_attempt`): the first line is the `X-Azure-Functions-InvocationId`
/// header (absent when the line is empty), its first byte picking the function's retry policy; the rest is the
/// body. An attempt it accepts must re-encode, as the host would send it, to the same attempt.
pub fn invocation(data: &[u8]) {
    let (line, body) = match data.iter().position(|b| *b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let policy = match line.first().map(|b| b % 4) {
        Some(0) | None => None,
        Some(1) => Some(RetryPolicy::fixed(-1, Duration::from_secs(1))),
        Some(2) => Some(RetryPolicy::fixed(0, Duration::from_secs(1))),
        Some(_) => Some(RetryPolicy::fixed(5, Duration::from_secs(1))),
    };
    let header = line.get(1..).and_then(|h| std::str::from_utf8(h).ok()).filter(|h| !h.is_empty());
    if let Ok(text) = std::str::from_utf8(body) {
        host_date(text.trim());
    }
    let attempt = match crate::server::host_attempt("timer", policy.as_ref(), header, body) {
        Ok(attempt) => attempt,
        Err(malformed) => {
            assert!(!malformed.0.is_empty(), "a refusal without a message");
            return;
        }
    };
    let id = uuid::Uuid::parse_str(&attempt.id).expect("an accepted id is a GUID");
    assert_eq!(attempt.id, id.hyphenated().to_string(), "ids are kept in one spelling");
    if body.iter().all(u8::is_ascii_whitespace) {
        assert_eq!(attempt.retry, None, "a manual run names no failure");
        return;
    }
    let retry = attempt.retry.as_ref();
    assert_eq!(retry.map(|r| r.max_retry_count), policy.as_ref().map(|p| p.max_retry_count), "the policy's count");
    if let Some(r) = retry {
        assert!(r.retry_count >= 0 && (r.max_retry_count < 0 || r.retry_count <= r.max_retry_count), "{r:?}");
        assert!(r.failed_invocation.is_none() || r.is_retry(), "a first attempt names a failure: {r:?}");
    }
    // Re-encoded as the host sends it, the attempt decodes to itself.
    let again =
        crate::server::host_attempt("timer", policy.as_ref(), Some(&attempt.id.to_uppercase()), &host_body(&attempt))
            .unwrap_or_else(|e| panic!("{attempt:?} re-encoded is refused: {e}"));
    assert_eq!(again, attempt, "re-encoded, the attempt decodes differently");
    // And the body decodes alike on its own.
    let request = InvocationRequest::decode(body).expect("decoded once, decodes again");
    assert_eq!(request.retry, attempt.retry);
}

/// The body the host sends for `attempt` (see `protocol`'s module docs).
fn host_body(attempt: &Attempt) -> Vec<u8> {
    let mut metadata = Map::new();
    metadata.insert("sys".into(), json!({ "MethodName": "F", "UtcNow": "2026-11-22T02:50:00.0123456Z" }));
    if let Some(retry) = &attempt.retry {
        let exception = match (&retry.failed_invocation, retry.is_retry()) {
            (Some(id), _) => json!({ "InstanceId": id.to_uppercase(), "ClassName": "FunctionInvocationException" }),
            (None, true) => json!({ "InstanceId": null }),
            (None, false) => Value::Null,
        };
        metadata.insert(
            "RetryContext".into(),
            json!({ "RetryCount": retry.retry_count, "MaxRetryCount": retry.max_retry_count, "Exception": exception }),
        );
    }
    let body = json!({ "Data": { "timer": { "IsPastDue": false, "ScheduleStatus": null } }, "Metadata": metadata });
    serde_json::to_vec(&body).expect("JSON")
}

/// A date the host writes reads back, written with every digit, as the same instant.
fn host_date(text: &str) {
    let Some(date) = crate::protocol::parse_host_date(text) else { return };
    let offset = date.offset();
    let (h, m, _) = offset.as_hms();
    let written = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:09}{}{:02}:{:02}",
        date.year(),
        u8::from(date.month()),
        date.day(),
        date.hour(),
        date.minute(),
        date.second(),
        date.nanosecond(),
        if offset.is_negative() { '-' } else { '+' },
        h.unsigned_abs(),
        m.unsigned_abs()
    );
    assert_eq!(crate::protocol::parse_host_date(&written), Some(date), "{text:?} written as {written:?}");
}
