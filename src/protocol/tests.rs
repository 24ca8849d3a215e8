//! The decoder against what the host sends and against everything it never sends.

use super::*;
use serde_json::json;

const ID: &str = "5d3f3c2e-41b4-4c1a-9d0e-2b7c6a1f9e10";

fn body(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).expect("JSON")
}

/// A timer invocation as the host sends it, with `retry` as `Metadata.RetryContext`.
fn host_body(retry: Value) -> Value {
    json!({
        "Data": { "timer": {
            "Schedule": { "AdjustForDST": true },
            "ScheduleStatus": { "Last": "2026-11-22T02:45:00.0031245+00:00", "Next": "2026-11-22T02:50:00+00:00",
                                "LastUpdated": "2026-11-22T02:45:00.0031245+00:00" },
            "IsPastDue": false } },
        "Metadata": {
            "sys": { "MethodName": "OrdersChanged", "UtcNow": "2026-11-22T02:50:00.0123456Z", "RandGuid": ID },
            "RetryContext": retry,
        }
    })
}

fn first_attempt() -> Value {
    json!({"RetryCount": 0, "MaxRetryCount": 5, "Exception": null, "Instance": null, "State": {}})
}

/// A retry as the host serializes it: the previous attempt's FunctionInvocationException through ISerializable.
fn a_retry(count: i64, failed: &str) -> Value {
    json!({"RetryCount": count, "MaxRetryCount": 5, "Instance": null, "State": {}, "Exception": {
        "InstanceId": failed, "MethodName": "Functions.OrdersChanged",
        "ClassName": "Microsoft.Azure.WebJobs.Host.FunctionInvocationException",
        "Message": "Exception while executing function: Functions.OrdersChanged", "Data": null,
        "InnerException": { "ClassName": "System.InvalidOperationException", "Message": "queue down" },
        "HResult": -2146233088 }})
}

#[test]
fn a_first_attempt_carries_a_retry_context_with_count_zero() {
    let req = InvocationRequest::decode(&body(host_body(first_attempt()))).expect("decodes");
    assert_eq!(req.retry, Some(RetryContext::first(5)));
    req.check_timer("timer").expect("a host timer");
}

#[test]
fn a_retry_names_the_invocation_that_failed() {
    let upper = ID.to_uppercase();
    let req = InvocationRequest::decode(&body(host_body(a_retry(2, &upper)))).expect("decodes");
    assert_eq!(req.retry, Some(RetryContext::after(2, 5, ID)), "ids compare in one spelling");
    let final_retry = RetryContext::after(5, 5, ID);
    assert!(final_retry.is_final() && final_retry.is_retry());
    assert!(!RetryContext::after(9, -1, ID).is_final(), "-1 retries forever");
    assert!(!RetryContext::first(5).is_final() && RetryContext::first(0).is_final());
}

#[test]
fn the_lenient_cases_the_host_really_sends_are_accepted() {
    // GIVEN the first run's DateTime.MinValue without an offset, and a null status (monitor off)
    let mut first_run = host_body(first_attempt());
    first_run["Data"]["timer"]["ScheduleStatus"] = json!({"Last": "0001-01-01T00:00:00", "Next": "2026-11-22T02:50:00+01:00", "LastUpdated": "0001-01-01T00:00:00"});
    let mut monitor_off = host_body(first_attempt());
    monitor_off["Data"]["timer"]["ScheduleStatus"] = Value::Null;
    let mut no_policy = host_body(Value::Null);
    no_policy["Metadata"].as_object_mut().expect("object").remove("RetryContext");
    for (what, b) in [("first run", first_run), ("monitor off", monitor_off), ("no retry policy", no_policy)] {
        // THEN each decodes
        let req = InvocationRequest::decode(&body(b)).unwrap_or_else(|e| panic!("{what}: {e}"));
        req.check_timer("timer").unwrap_or_else(|e| panic!("{what}: {e}"));
    }
    // AND a blank body is a manual run without a retry context
    assert!(InvocationRequest::decode(b" \n").expect("blank").retry.is_none());
}

#[test]
fn dates_parse_as_newtonsoft_writes_them() {
    let at = |s: &str| parse_host_date(s).map(|t| (t.unix_timestamp(), t.nanosecond()));
    assert_eq!(at("2026-11-22T02:50:00.0123456Z"), Some((1_795_315_800, 12_345_600)));
    assert_eq!(at("2026-11-22T03:50:00.0123456+01:00"), at("2026-11-22T02:50:00.0123456Z"));
    assert_eq!(at("2026-11-22T02:50:00"), Some((1_795_315_800, 0)), "unspecified is read as UTC");
    assert!(parse_host_date("0001-01-01T00:00:00").is_some());
    for bad in ["2026-11-22", "2026-13-22T02:50:00Z", "2026-11-22T02:50:00.Z", "2026-11-22T02:50:00+1", "soon", ""] {
        assert_eq!(parse_host_date(bad), None, "{bad:?}");
    }
}

/// Bodies the host never sends, each refused with a message naming the part. Before the strict decoder, the
/// first three were decoded as invocations (serde reads a JSON array as a struct's fields in order), and the
/// array `RetryContext` as a retry.
#[test]
fn every_body_the_host_never_sends_is_refused_naming_the_part() {
    let mut cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty array", b"[]".to_vec(), "is an array"),
        ("array of an invocation", body(json!([{"Data": {}}])), "is an array"),
        ("retry context as an array", body(host_body(json!([3, 5]))), "RetryContext is an array"),
        ("number", b"7".to_vec(), "is a number"),
        ("null", b"null".to_vec(), "is null"),
        ("string", b"\"x\"".to_vec(), "is a string"),
        ("no Data", body(json!({"Metadata": {}})), "no Data"),
        ("Data array", body(json!({"Data": [], "Metadata": {}})), "Data is an array"),
        ("no Metadata", body(json!({"Data": {}})), "no Metadata"),
        ("Metadata string", body(json!({"Data": {}, "Metadata": "x"})), "Metadata is a string"),
        (
            "count as a string",
            body(host_body(json!({"RetryCount": "1", "MaxRetryCount": 5}))),
            "RetryCount is a string",
        ),
        ("count fractional", body(host_body(json!({"RetryCount": 1.5, "MaxRetryCount": 5}))), "not a whole number"),
        ("count huge", body(host_body(json!({"RetryCount": 1e300, "MaxRetryCount": 5}))), "not a whole number"),
        ("count missing", body(host_body(json!({"MaxRetryCount": 5}))), "no RetryCount"),
        ("max missing", body(host_body(json!({"RetryCount": 0}))), "no MaxRetryCount"),
        ("count negative", body(host_body(json!({"RetryCount": -1, "MaxRetryCount": 5}))), "never negative"),
        ("max below -1", body(host_body(json!({"RetryCount": 0, "MaxRetryCount": -2}))), "-1 (forever) or more"),
        ("count past max", body(host_body(json!({"RetryCount": 6, "MaxRetryCount": 5}))), "above MaxRetryCount"),
        (
            "retry without exception",
            body(host_body(json!({"RetryCount": 1, "MaxRetryCount": 5}))),
            "without the Exception",
        ),
        (
            "first attempt with exception",
            body(host_body(json!({"RetryCount": 0, "MaxRetryCount": 5, "Exception": {}}))),
            "first attempt",
        ),
        (
            "exception a string",
            body(host_body(json!({"RetryCount": 1, "MaxRetryCount": 5, "Exception": "x"}))),
            "Exception is a string",
        ),
        ("instance id not a guid", body(host_body(a_retry(1, "batch-7"))), "not a GUID"),
        (
            "instance id a number",
            body(host_body(json!({"RetryCount": 1, "MaxRetryCount": 5, "Exception": {"InstanceId": 7}}))),
            "InstanceId is a number",
        ),
        ("sys a list", body(json!({"Data": {}, "Metadata": {"sys": []}})), "sys is an array"),
        ("UtcNow not a date", body(json!({"Data": {}, "Metadata": {"sys": {"UtcNow": "now"}}})), "UtcNow"),
        ("not UTF-8", vec![0xff, 0xfe, 0x7b], "not UTF-8"),
        ("truncated", b"{\"Data\":".to_vec(), "not JSON"),
    ];
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    cases.push(("deep nesting", deep.into_bytes(), "not JSON"));
    for (what, b, expected) in cases {
        let err = InvocationRequest::decode(&b).expect_err(what);
        assert!(err.0.contains(expected), "{what}: {err}");
    }
}

#[test]
fn a_timer_value_of_the_wrong_kind_is_refused_naming_the_binding() {
    let timer =
        |t: Value| InvocationRequest::decode(&body(json!({"Data": {"timer": t}, "Metadata": {}}))).expect("decodes");
    let cases = [
        (json!([]), "Data.timer is an array"),
        (json!({"IsPastDue": "no"}), "IsPastDue is a string"),
        (json!({"ScheduleStatus": []}), "ScheduleStatus is an array"),
        (json!({"ScheduleStatus": {"Last": "yesterday"}}), "ScheduleStatus.Last"),
        (json!({"Schedule": 5}), "Schedule is a number"),
    ];
    for (value, expected) in cases {
        let err = timer(value.clone()).check_timer("timer").expect_err("refused");
        assert!(err.0.contains(expected), "{value}: {err}");
    }
    let err = timer(json!({})).check_timer("tick").expect_err("another binding name");
    assert!(err.0.contains("no \"tick\""), "{err}");
}

#[test]
fn the_invocation_id_header_is_required_and_must_be_a_guid() {
    assert_eq!(invocation_id(Some(&ID.to_uppercase())).expect("a GUID"), ID);
    assert!(invocation_id(None).expect_err("missing").0.contains("no X-Azure-Functions-InvocationId"));
    assert!(invocation_id(Some("  ")).is_err());
    assert!(invocation_id(Some("42")).expect_err("not a GUID").0.contains("not a GUID"));
}
