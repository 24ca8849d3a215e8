//! A partitioned function's status and the scale route KEDA reads, from the real `handler run` binary: per
//! partition and in total, through the admin listener bound beyond loopback, with the key in each of the ways
//! KEDA sends it, and refused without it.

use crate::common::*;
use crate::operations::handler_cli;
use crate::runner::Runner;
use crate::support::{self, AppFolder};
use serde_json::{json, Value};
use sql_pseudo_trigger::state::StateStore;
use std::time::{Duration, Instant};
use testbed::embedded;

const KEY: &str = "scale-route-key-0123456789abcdef";
const PARTITIONS: u64 = 4;

/// `handler <args>` as an operator runs it, its stdout as JSON.
async fn cli_json(app: &AppFolder, args: &[&str]) -> Value {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output = handler_cli(app.root(), &args).await;
    assert!(output.status.success(), "handler {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

/// `GET http://127.0.0.1:{port}{path}` with `headers`: the status and the JSON body.
async fn get(port: &str, path: &str, headers: &[(&str, &str)]) -> (u16, Value) {
    let mut request = support::http_client().get(format!("http://127.0.0.1:{port}{path}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("the admin listener answers");
    (response.status().as_u16(), response.json::<Value>().await.unwrap_or(Value::Null))
}

/// Waits until the admin listener answers (the runner binds it after loading the app).
async fn admin_ready(runner: &Runner, port: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(response) =
            support::http_client().get(format!("http://127.0.0.1:{port}/admin")).header("X-API-KEY", KEY).send().await
        {
            assert_eq!(response.status().as_u16(), 200, "{}", runner.stderr());
            return;
        }
        assert!(Instant::now() < deadline, "the admin listener did not answer within 10 s:\n{}", runner.stderr());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An app whose function `OrdersChanged` has four partitions, file state, the admin key and one worker per
/// pending change (so the backlog asks for a replica per partition).
fn partitioned_app(orders: &Orders, name: &str, settings: &[(&str, &str)]) -> AppFolder {
    let mut all = vec![("Sql_Trigger_StateStore", "file"), ("Sql_Trigger_MaxChangesPerWorker", "1")];
    all.extend_from_slice(settings);
    orders_app(orders, &unique_app_name(name), json!({ "partitions": PARTITIONS, "pollingIntervalMs": 10 }), &all)
}

#[tokio::test]
async fn the_scale_route_answers_keda_with_the_key_as_header_or_bearer_and_status_lists_each_partition() {
    // GIVEN a function with four partitions that has run once (each partition has its state), then is paused
    // partition by partition, and orders 1-5 written after the pause, so they stay pending
    let orders = Orders::new("scale_route").await;
    let app = partitioned_app(&orders, "scale-route", &[("Sql_Trigger_AdminKey", KEY)]);
    let mut once = Runner::start(&app, &["--once"]);
    let exited = once.exit(Duration::from_secs(60)).await;
    assert!(exited.success(), "handler run --once failed ({exited}):\n{}", once.stderr());
    let names: Vec<String> = (0..PARTITIONS).map(|i| format!("{FUNCTION}-p{i}")).collect();
    for name in &names {
        cli_json(&app, &["state", "pause", name]).await;
    }
    orders.insert(1..=5).await;

    // WHEN `handler run` serves its admin routes on every interface
    let port = embedded::free_port().expect("a free port").to_string();
    let runner = Runner::start(&app, &["--admin-port", &port, "--admin-bind", "0.0.0.0"]);
    admin_ready(&runner, &port).await;

    // THEN the scale route answers with KEDA's apiKey header, and with the key as a bearer token, alike
    let (code, scale) = get(&port, "/admin/scale", &[("X-API-KEY", KEY)]).await;
    assert_eq!(code, 200, "{scale}");
    let (code, bearer) = get(&port, "/admin/scale", &[("Authorization", &format!("Bearer {KEY}"))]).await;
    assert_eq!((code, &bearer["functions"][FUNCTION]["partitions"]), (200, &json!(PARTITIONS)), "{bearer}");
    // AND it names the function by its own name (no trigger has it), with its partitions and a replica per
    // partition: 5 pending changes at one per worker ask for more than the 4 partitions, so 4
    let function = &scale["functions"][FUNCTION];
    assert_eq!(scale["functions"].as_object().map(|f| f.len()), Some(1), "{scale}");
    assert_eq!(function["partitions"], PARTITIONS, "{scale}");
    assert_eq!(function["max_changes_per_worker"], 1, "{scale}");
    assert_eq!((&function["target_replicas"], &scale["target_replicas"]), (&json!(PARTITIONS), &json!(PARTITIONS)));
    let pending = scale["pending"].as_u64().expect("a pending count");
    assert!(pending >= 5, "{scale}");
    assert_eq!(function["pending"], pending, "{scale}");

    // AND the status of the function lists each partition, and its totals are the scale route's numbers
    let (code, status) = get(&port, &format!("/admin/{FUNCTION}/status"), &[("x-functions-key", KEY)]).await;
    assert_eq!(code, 200, "{status}");
    let listed: Vec<&str> = status["partition_status"]
        .as_array()
        .expect("partitions")
        .iter()
        .filter_map(|p| p["function"].as_str())
        .collect();
    assert_eq!(listed, names, "{status}");
    assert_eq!((&status["partitions"], &status["served"], &status["unanswered"]), (&json!(4), &json!(4), &json!(0)));
    assert_eq!((&status["pending"], &status["target_replicas"]), (&json!(pending), &json!(PARTITIONS)), "{status}");
    let partitions = status["partition_status"].as_array().expect("partitions");
    let sum: u64 = partitions.iter().map(|p| p["pending"].as_u64().expect("pending")).sum();
    assert_eq!(sum, pending, "{status}");
    for (i, p) in partitions.iter().enumerate() {
        assert_eq!((&p["partition"], &p["paused"]), (&json!(i), &json!(true)), "{p}");
        assert!(p.get("lease_owner").is_some() && p.get("partition_owner").is_some(), "{p}");
    }
    // AND a partition's own status says which partition of which function it is
    let (_, one) = get(&port, &format!("/admin/{FUNCTION}-p2/status"), &[("X-API-KEY", KEY)]).await;
    assert_eq!(
        (&one["partition"]["group"], &one["partition"]["index"], &one["partition"]["count"]),
        (&json!(FUNCTION), &json!(2), &json!(4)),
        "{one}"
    );
    // AND `handler state status` gives the same partitions from a shell
    let cli = cli_json(&app, &["state", "status", FUNCTION]).await;
    let from_cli: Vec<&str> =
        cli["partition_status"].as_array().expect("partitions").iter().filter_map(|p| p["function"].as_str()).collect();
    assert_eq!((from_cli, &cli["pending"]), (names.iter().map(String::as_str).collect(), &json!(pending)), "{cli}");

    // AND without the key, with a wrong one, or with the key in a scheme KEDA's bearer mode does not use, every
    // admin route is refused, the scale route included
    let wrong_bearer = "Bearer not-the-key".to_string();
    let basic = format!("Basic {KEY}");
    let refused: [(&str, &[(&str, &str)]); 4] = [
        ("/admin/scale", &[]),
        ("/admin/scale", &[("X-API-KEY", "not-the-key")]),
        ("/admin/scale", &[("Authorization", &wrong_bearer), ("Authorization", &basic)]),
        ("/admin", &[]),
    ];
    for (path, headers) in refused {
        let (code, body) = get(&port, path, headers).await;
        assert_eq!(code, 401, "{path} {headers:?}: {body}");
    }
    // AND a partitioned function's other actions name a partition instead
    let (code, body) = get(&port, &format!("/admin/{FUNCTION}/quarantine"), &[("X-API-KEY", KEY)]).await;
    assert_eq!(code, 400, "{body}");
    assert!(body["error"].as_str().is_some_and(|e| e.contains(&format!("{FUNCTION}-p0/quarantine"))), "{body}");
    // AND the listener beyond loopback serves the admin routes only: no readiness page, no invocation route
    let (code, _) = get(&port, "/", &[("X-API-KEY", KEY)]).await;
    assert_eq!(code, 404);
    // AND the key was never logged
    assert!(!runner.stderr().contains(KEY) && !runner.stdout().contains(KEY), "the key is in the log");
}

#[tokio::test]
async fn the_status_route_of_a_function_some_partitions_did_not_answer_names_them_and_gives_no_total() {
    // GIVEN a function of four partitions (state in Azurite) with orders pending, whose partitions 1 and 3 have
    // damaged state documents
    let orders = Orders::new("status_route_missing").await;
    orders.insert(1..=5).await;
    let app_name = unique_app_name("status-route-missing");
    let trigger = json!({ "partitions": PARTITIONS, "pollingIntervalMs": 10 });
    let app = orders_app(&orders, &app_name, trigger, &[("Sql_Trigger_AdminKey", KEY)]);
    let store = shared_blob_store();
    for i in [1, 3] {
        let key = format!("{app_name}/{FUNCTION}/partition-{i}-of-{PARTITIONS}.json");
        store.save_if(&key, b"{ not a state document", None).await.expect("write the damaged document");
    }

    // WHEN `handler run` serves its admin routes and an operator asks for the status of the whole function
    let port = embedded::free_port().expect("a free port").to_string();
    let runner = Runner::start(&app, &["--admin-port", &port]);
    admin_ready(&runner, &port).await;
    let (code, status) = get(&port, &format!("/admin/{FUNCTION}/status"), &[("X-API-KEY", KEY)]).await;

    // THEN it answers 503 like any unavailable dependency, naming each partition that did not answer and why,
    // and no total (as `handler state status` does), never a total of the two that answered
    assert_eq!(code, 503, "{status}");
    let error = status["error"].as_str().unwrap_or_else(|| panic!("an error: {status}"));
    assert!(error.contains("2 of 4 partitions did not answer"), "{error}");
    for (i, named) in [(0, false), (1, true), (2, false), (3, true)] {
        assert_eq!(error.contains(&format!("{FUNCTION}-p{i} (")), named, "partition {i} in {error}");
    }
    assert_eq!(status.as_object().map(|o| o.len()), Some(1), "only the error: {status}");
    // AND the scale route refuses the partial backlog alike
    let (code, scale) = get(&port, "/admin/scale", &[("X-API-KEY", KEY)]).await;
    assert_eq!(code, 503, "{scale}");
}

#[tokio::test]
async fn run_bound_beyond_loopback_without_a_key_or_to_no_address_refuses_to_start_naming_the_setting() {
    let orders = Orders::new("scale_nokey").await;
    let port = embedded::free_port().expect("a free port").to_string();
    // (the app's settings, the arguments after --admin-port, what stderr must say)
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a [&'a str]);
    let cases: [Case; 3] = [
        (
            &[],
            &["--admin-bind", "0.0.0.0"],
            &["--admin-port on 0.0.0.0", "Sql_Trigger_AdminBindAddress", "Sql_Trigger_AdminKey"],
        ),
        (&[("Sql_Trigger_AdminBindAddress", "0.0.0.0")], &[], &["--admin-port on 0.0.0.0", "Sql_Trigger_AdminKey"]),
        (
            &[("Sql_Trigger_AdminKey", KEY)],
            &["--admin-bind", "pod.local"],
            &["--admin-bind is \"pod.local\", not an IP address"],
        ),
    ];
    // GIVEN orders waiting
    orders.insert(1..=2).await;
    for (settings, args, expected) in cases {
        let app = partitioned_app(&orders, "scale-nokey", settings);
        // WHEN `handler run --admin-port` starts so
        let mut all = vec!["--admin-port", port.as_str()];
        all.extend_from_slice(args);
        let mut runner = Runner::start(&app, &all);
        let status = runner.exit(Duration::from_secs(10)).await;
        // THEN it exits non-zero before doing anything, naming the setting
        assert!(!status.success(), "{settings:?} {args:?} started: {}", runner.stderr());
        let stderr = runner.stderr();
        for text in expected {
            assert!(stderr.contains(text), "{settings:?} {args:?}: {stderr}");
        }
        assert!(runner.stdout().is_empty(), "{}", runner.stdout());
        assert!(!app.root().join(".sql-pseudo-trigger").exists(), "state was written");
    }
}
