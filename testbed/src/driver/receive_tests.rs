//! The host's conversion, row by row: an answer's `Outputs.out` (as the handler wrote it) and what a binding
//! of each type receives. Each row names the host code it comes from (see the module docs of `receive` and
//! `newtonsoft` for the repositories).

use super::*;
use crate::driver::app::Direction;
use serde_json::json;

enum Expect {
    /// Message bodies, as text.
    Messages(&'static [&'static str]),
    /// Raw message bodies.
    Bytes(&'static [&'static [u8]]),
    /// The JSON of each row the sql binding upserts.
    Rows(&'static [&'static str]),
    /// One blob's content.
    Blob(&'static [u8]),
    /// The host binds nothing.
    Nothing,
    /// The write fails, with a reason containing this.
    Fails(&'static str),
}

struct Case {
    source: &'static str,
    binding: &'static str,
    /// function.json `dataType`.
    data_type: Option<&'static str>,
    output: &'static str,
    expect: Expect,
}

const CASES: &[Case] = &[
    Case {
        source: "JsonTextReader.ParseReadNumber (double), JsonConvert.EnsureDecimalPlace, JToken.ToString() indented, BindAsyncCollectorAsync<byte[]>",
        binding: "queue",
        data_type: None,
        output: r#"[{"Operation":0,"Item":{"id":1,"amount":120.00}}]"#,
        expect: Expect::Messages(&["{\n  \"Operation\": 0,\n  \"Item\": {\n    \"id\": 1,\n    \"amount\": 120.0\n  }\n}"]),
    },
    Case {
        source: "double: 17 significant digits at most (Number.Formatting.cs FormatDouble 'R')",
        binding: "queue",
        data_type: None,
        output: r#"[{"n":12345678901234567.89,"f":0.1,"e":1e-7,"big":1e20,"q":1e15,"u":0.000001}]"#,
        expect: Expect::Messages(&[
            "{\n  \"n\": 12345678901234568.0,\n  \"f\": 0.1,\n  \"e\": 1E-07,\n  \"big\": 1E+20,\n  \"q\": 1000000000000000.0,\n  \"u\": 1E-06\n}",
        ]),
    },
    Case {
        source: "integers stay exact: Int64, or BigInteger past it (ParseReadNumber)",
        binding: "queue",
        data_type: None,
        output: r#"[{"max":9223372036854775807,"big":12345678901234567890,"neg":-0}]"#,
        expect: Expect::Messages(&[
            "{\n  \"max\": 9223372036854775807,\n  \"big\": 12345678901234567890,\n  \"neg\": 0\n}",
        ]),
    },
    Case {
        source: "DateTimeUtils.TryParseDateTimeIso: an offset becomes the host's local time (UTC); WriteDateTimeString trims the fraction",
        binding: "queue",
        data_type: None,
        output: r#"[{"tstz":"2024-07-02T03:04:05.120000+02:00","ts":"2024-01-02T03:04:05.123400","utc":"2024-01-02T03:04:05.1234567Z","date":"2024-01-02","time":"12:34:56.789","text":"2024-01-02 03:04:05"}]"#,
        expect: Expect::Messages(&[
            "{\n  \"tstz\": \"2024-07-02T01:04:05.12+00:00\",\n  \"ts\": \"2024-01-02T03:04:05.1234\",\n  \"utc\": \"2024-01-02T03:04:05.1234567Z\",\n  \"date\": \"2024-01-02\",\n  \"time\": \"12:34:56.789\",\n  \"text\": \"2024-01-02 03:04:05\"\n}",
        ]),
    },
    Case {
        source: "JTokenWriter.WritePropertyName: a duplicate key (a json column) replaces the first, at the end",
        binding: "queue",
        data_type: None,
        output: r#"[{"j":{"a":1.10,"b":"NaN","a":2}}]"#,
        expect: Expect::Messages(&["{\n  \"j\": {\n    \"b\": \"NaN\",\n    \"a\": 2\n  }\n}"]),
    },
    Case {
        source: "ReadAsEnumerable: a JArray's string elements are written as their bare text (JValue.ToString()), untouched",
        binding: "queue",
        data_type: None,
        output: r#"["{\"Operation\":0,\"Item\":{\"amount\":12345678901234567.89,\"at\":\"2024-07-02T03:04:05.12+02:00\"}}"]"#,
        expect: Expect::Messages(&[
            r#"{"Operation":0,"Item":{"amount":12345678901234567.89,"at":"2024-07-02T03:04:05.12+02:00"}}"#,
        ]),
    },
    Case {
        source: "ReadAsEnumerable: scalar elements are their .NET ToString() (True, an empty string for null)",
        binding: "queue",
        data_type: None,
        output: r#"[1,1.50,true,null,"x"]"#,
        expect: Expect::Messages(&["1", "1.5", "True", "", "x"]),
    },
    Case {
        source: "GetBindingValue: a top-level string that is not base64 but IsJson is parsed again (JToken.Parse) and split",
        binding: "queue",
        data_type: None,
        output: r#""[{\"a\":1.50},{\"b\":2}]""#,
        expect: Expect::Messages(&["{\n  \"a\": 1.5\n}", "{\n  \"b\": 2\n}"]),
    },
    Case {
        source: "GetBindingValue: a top-level string Convert.FromBase64String accepts is sent decoded",
        binding: "queue",
        data_type: None,
        output: r#""AAEC""#,
        expect: Expect::Bytes(&[&[0, 1, 2]]),
    },
    Case {
        source: "GetBindingValue: dataType binary skips the base64 step; the string is one message",
        binding: "queue",
        data_type: Some("binary"),
        output: r#""AAEC""#,
        expect: Expect::Messages(&["AAEC"]),
    },
    Case {
        source: "GetBindingValue then ReadAsEnumerable: a plain string is one message",
        binding: "queue",
        data_type: None,
        output: r#""hello world""#,
        expect: Expect::Messages(&["hello world"]),
    },
    Case {
        source: "WorkerFunctionInvoker.BindOutputsAsync: a null value binds nothing",
        binding: "queue",
        data_type: None,
        output: "null",
        expect: Expect::Nothing,
    },
    Case {
        source: "BindAsyncCollectorAsync<byte[]> for Event Hubs (EventHubExtensionConfigProvider: byte[] converter)",
        binding: "eventHub",
        data_type: None,
        output: r#"[{"a":1.0}]"#,
        expect: Expect::Messages(&["{\n  \"a\": 1.0\n}"]),
    },
    Case {
        source: "BindAsyncCollectorAsync<string> for Service Bus: objects as indented JSON",
        binding: "serviceBus",
        data_type: None,
        output: r#"[{"a":1.10}]"#,
        expect: Expect::Messages(&["{\n  \"a\": 1.1\n}"]),
    },
    Case {
        source: "BindAsyncCollectorAsync<string>: decoded base64 is a byte[], whose ToString() is its type name",
        binding: "serviceBus",
        data_type: None,
        output: r#""AAEC""#,
        expect: Expect::Messages(&["System.Byte[]"]),
    },
    Case {
        source: "BindAsyncCollectorAsync<JObject>: non-objects become null and SqlAsyncCollector.AddAsync drops them; rows written with DateFormatString ...fffZ",
        binding: "sql",
        data_type: None,
        output: r#"[{"id":1,"at":"2024-07-02T03:04:05.1234567+02:00","ts":"2024-01-02T03:04:05.9999999","amount":1.10},"dropped",5]"#,
        expect: Expect::Rows(&[r#"{"id":1,"at":"2024-07-02T01:04:05.123Z","ts":"2024-01-02T03:04:05.999Z","amount":1.1}"#]),
    },
    Case {
        source: "sql: an array of strings (every element dropped) writes no row at all",
        binding: "sql",
        data_type: None,
        output: r#"["{\"id\":1}"]"#,
        expect: Expect::Rows(&[]),
    },
    Case {
        source: "SqlAsyncCollector.GetExtraProperties: the first row read as Dictionary<string, string> fails on an object value",
        binding: "sql",
        data_type: None,
        output: r#"[{"id":1,"doc":{"a":1}}]"#,
        expect: Expect::Fails("Unexpected token: StartObject"),
    },
    Case {
        source: "ConvertValueToStream: a JArray is one blob of compact JSON (ToString(Formatting.None))",
        binding: "blob",
        data_type: None,
        output: r#"[{"a":1.50,"at":"2024-07-02T03:04:05+02:00"},{"b":2}]"#,
        expect: Expect::Blob(br#"[{"a":1.5,"at":"2024-07-02T01:04:05+00:00"},{"b":2}]"#),
    },
    Case {
        source: "ConvertValueToStream: a string (JSON text, never valid base64) is its UTF-8, untouched",
        binding: "blob",
        data_type: None,
        output: r#""[{\"a\":1.50}]""#,
        expect: Expect::Blob(br#"[{"a":1.50}]"#),
    },
    Case {
        source: "ConvertValueToStream: a long is BitConverter.GetBytes((int)value)",
        binding: "blob",
        data_type: None,
        output: "5",
        expect: Expect::Blob(&[5, 0, 0, 0]),
    },
    Case {
        source: "ConvertValueToStream: a date has no conversion, the write throws",
        binding: "blob",
        data_type: None,
        output: r#""2024-01-02T03:04:05Z""#,
        expect: Expect::Fails("Value cannot be null"),
    },
];

fn binding(kind: &str, data_type: Option<&str>) -> Binding {
    let mut raw = json!({ "type": kind, "direction": "out", "name": "out", "path": "out/{rand-guid}.json" });
    if let Some(data_type) = data_type {
        raw["dataType"] = json!(data_type);
    }
    Binding { kind: kind.into(), direction: Direction::Out, name: "out".into(), raw }
}

#[test]
fn each_binding_type_receives_what_the_host_makes_of_an_answer() {
    let model = HostModel::default();
    for case in CASES {
        let binding = binding(case.binding, case.data_type);
        let body = format!(r#"{{"Outputs":{{"out":{}}},"Logs":[],"ReturnValue":null}}"#, case.output);
        let answer = newtonsoft::read_answer(&body, model.zone).unwrap_or_else(|e| panic!("{}: {e}", case.source));
        let value = binding_value(std::slice::from_ref(&binding), &binding, &answer);
        let got = value.map(|v| receive(&binding, &v, &model));
        let context = format!("{} ({} <- {})", case.source, case.binding, case.output);
        match (&case.expect, got) {
            (Expect::Nothing, None) => {}
            (Expect::Messages(texts), Some(Ok(got))) => {
                let want: Vec<Received> = texts.iter().map(|t| Received::Message(t.as_bytes().to_vec())).collect();
                assert_eq!(got, want, "{context}");
            }
            (Expect::Bytes(bodies), Some(Ok(got))) => {
                let want: Vec<Received> = bodies.iter().map(|b| Received::Message(b.to_vec())).collect();
                assert_eq!(got, want, "{context}");
            }
            (Expect::Rows(rows), Some(Ok(got))) => {
                let want: Vec<Received> = rows.iter().map(|r| Received::Row(r.to_string())).collect();
                assert_eq!(got, want, "{context}");
            }
            (Expect::Blob(content), Some(Ok(got))) => match got.as_slice() {
                [Received::Blob { path, content: got }] => {
                    assert_eq!(got.as_slice(), *content, "{context}");
                    assert!(path.starts_with("out/") && path.len() == "out/.json".len() + 36, "{context}: {path}");
                }
                other => panic!("{context}: expected one blob, got {other:?}"),
            },
            (Expect::Fails(reason), Some(Err(got))) => assert!(got.contains(reason), "{context}: {got}"),
            (_, got) => panic!("{context}: unexpected {got:?}"),
        }
    }
}

#[test]
fn output_names_match_exactly_and_a_return_value_object_overrides_them() {
    let model = HostModel::default();
    let queue = binding("queue", None);
    let answer = newtonsoft::read_answer(r#"{"Outputs":{"Out":[{"a":1}]}}"#, model.zone).expect("reads");
    assert_eq!(
        binding_value(std::slice::from_ref(&queue), &queue, &answer),
        None,
        "Dictionary<string, object> keys are exact"
    );
    // WorkerFunctionInvoker.HandleOutputDictionary: with no $return binding, ReturnValue's members are outputs
    let answer =
        newtonsoft::read_answer(r#"{"Outputs":{"out":[{"a":1}]},"ReturnValue":{"out":[{"b":2}]}}"#, model.zone)
            .expect("reads");
    let value = binding_value(std::slice::from_ref(&queue), &queue, &answer).expect("bound");
    assert_eq!(receive(&queue, &value, &model), Ok(vec![Received::Message(b"{\n  \"b\": 2\n}".to_vec())]));
}

#[test]
fn a_windows_host_indents_with_crlf_and_another_zone_moves_offsets_there() {
    let model = HostModel { zone: HostZone { offset_minutes: 60 }, newline: "\r\n" };
    let queue = binding("queue", None);
    let answer = newtonsoft::read_answer(r#"{"Outputs":{"out":[{"at":"2024-07-02T03:04:05+02:00"}]}}"#, model.zone)
        .expect("reads");
    let value = binding_value(std::slice::from_ref(&queue), &queue, &answer).expect("bound");
    assert_eq!(
        receive(&queue, &value, &model),
        Ok(vec![Received::Message(b"{\r\n  \"at\": \"2024-07-02T02:04:05+01:00\"\r\n}".to_vec())])
    );
}

#[test]
fn blob_paths_resolve_rand_guid_per_write_and_keep_other_expressions() {
    let a = resolve_path("c/{rand-guid}.json");
    let b = resolve_path("c/{rand-guid}.json");
    assert_ne!(a, b);
    assert_eq!(resolve_path("c/{sys.randguid}").len(), "c/".len() + 36);
    assert_eq!(resolve_path("c/{rand-guid:N}").len(), "c/".len() + 32);
    assert_eq!(resolve_path("c/latest.json"), "c/latest.json");
    assert_eq!(resolve_path("c/{sys.methodname}.json"), "c/{sys.methodname}.json");
}
