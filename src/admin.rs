//! The admin routes: the operator actions of [`crate::ops`] over HTTP.
//!
//! Under the Functions host they are served through an HTTP-triggered function (`sqltrigger.json` =
//! `{"admin": true}`, `authLevel: function`), so the host checks function keys before the handler sees a
//! request: `GET https://<app>.azurewebsites.net/api/sqltrigger/OrdersChanged/status?code=<function key>`.
//! Without the host (`handler run`), the same routes are served at `/admin/...` only when
//! `Sql_Trigger_AdminKey` is set, and every request must carry that key (`x-functions-key` header or `code`).
//!
//! Routes (relative to the admin function's route or `/admin`):
//! `GET /` list · `GET /{fn}` show · `GET /{fn}/status` · `POST /{fn}/pause` · `POST /{fn}/resume` ·
//! `POST /{fn}/reset?to=earliest|now|<json>&confirm=true` · `POST /{fn}/replay?from=<json>` ·
//! `GET /{fn}/quarantine` · `GET /{fn}/quarantine/{batch}` · `POST /{fn}/quarantine/{batch}/retry` ·
//! `GET /scale` (the replicas each function's backlog asks for, which KEDA's `metrics-api` scaler reads).
//!
//! A partitioned function answers `GET /{fn}/status` by its own name (its `partitionGroup`) with each
//! partition and the totals, or 503 naming each partition that did not answer (never a partial total); every
//! other action names one partition trigger (`{fn}-p{i}`).
//!
//! `POST /{fn}/backfill[?where=<filter>]` · `POST /{fn}/backfill/pause|resume|cancel`.

use crate::app::{App, ScaleUnit};
use crate::engine::{TickError, Trigger};
use crate::ops::{Action, OpsError};
use crate::partitions::status::{group_status, target_replicas};
use axum::http::StatusCode;
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// One admin request, whichever way it arrived.
#[derive(Debug, Default)]
pub struct AdminRequest {
    pub method: String,
    /// The path below the admin root, e.g. `OrdersChanged/status`.
    pub path: String,
    pub query: BTreeMap<String, String>,
    /// Who asked, for the log line of every write.
    pub who: String,
}

impl AdminRequest {
    /// Reads the request the host hands an HTTP-triggered function (`Data.<binding>`).
    pub fn from_host(req: &Value) -> Self {
        let text = |k: &str| req.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let method = text("Method").to_ascii_uppercase();
        let params = req.get("Params").and_then(Value::as_object);
        // The template's route is `sqltrigger/{*path}`; fall back to the URL's path after `/sqltrigger/`.
        let path =
            params.and_then(|p| p.get("path")).and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| {
                let url = text("Url");
                let path = url.split('?').next().unwrap_or_default();
                path.split_once("/sqltrigger/").map(|(_, rest)| rest.to_string()).unwrap_or_default()
            });
        let query = req
            .get("Query")
            .and_then(Value::as_object)
            .map(|q| q.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
            .unwrap_or_default();
        let headers = req.get("Headers").and_then(Value::as_object);
        let principal = headers
            .and_then(|h| h.iter().find(|(k, _)| k.eq_ignore_ascii_case("x-ms-client-principal-name")))
            .and_then(|(_, v)| v.as_str().or_else(|| v.get(0).and_then(Value::as_str)));
        let who = principal
            .map(|p| format!("{p} (admin route)"))
            .unwrap_or_else(|| "function key holder (admin route)".into());
        Self { method, path, query, who }
    }
}

/// Runs one admin request and returns the HTTP status and JSON body.
pub async fn dispatch(app: &App, req: AdminRequest) -> (StatusCode, Value) {
    let parts: Vec<&str> = req.path.split('/').filter(|p| !p.is_empty()).collect();
    let method = req.method.as_str();
    if parts.is_empty() {
        return (StatusCode::OK, json!({ "functions": app.function_names() }));
    }
    let Some(trigger) = app.trigger(parts[0]).cloned() else {
        let partitions = app.partitions(parts[0]);
        return match (method, &parts[1..]) {
            // A function named `scale` keeps its own routes; the scale route is then `GET /scale` of no one.
            ("GET", []) if parts[0] == "scale" => answer(scale(app).await),
            _ if partitions.is_empty() => (
                StatusCode::NOT_FOUND,
                json!({ "error": format!("no SQL trigger function named {:?}", parts[0]), "functions": app.function_names() }),
            ),
            ("GET", ["status"]) => {
                let owners = app.partition_owners(parts[0]).await;
                // Like `handler state status`: a total over the partitions that answered is not the function's.
                answer(
                    group_status(parts[0], &partitions, &owners)
                        .await
                        .and_then(|s| s.complete())
                        .map(|s| serde_json::to_value(s).unwrap_or(Value::Null)),
                )
            }
            _ => (
                StatusCode::BAD_REQUEST,
                json!({
                    "error": format!(
                        "{} is partitioned: only GET /{}/status answers for the whole function; name one partition for every other action, e.g. {method} /{}",
                        parts[0], parts[0], std::iter::once(partitions[0].name()).chain(parts[1..].iter().copied()).collect::<Vec<_>>().join("/")
                    ),
                    "partitions": partitions.iter().map(|t| t.name()).collect::<Vec<_>>(),
                }),
            ),
        };
    };
    let action = match Action::from_route(method, &parts[1..], &req.query) {
        Ok(Some(action)) => Ok(action),
        Ok(None) => {
            return (
                StatusCode::NOT_FOUND,
                json!({ "error": format!("no admin route {method} /{}", req.path), "routes": ROUTES }),
            )
        }
        Err(e) => Err(e),
    };
    let result = match action {
        Ok(action) => trigger.operate(action, &req.who).await,
        Err(e) => Err(e),
    };
    answer(result)
}

/// The HTTP status and body of an action's result.
fn answer(result: Result<Value, OpsError>) -> (StatusCode, Value) {
    match result {
        Ok(body) => (StatusCode::OK, body),
        Err(e) => {
            let status = match &e {
                OpsError::NoState(_) => StatusCode::NOT_FOUND,
                OpsError::Conflict(_) => StatusCode::CONFLICT,
                OpsError::NeedsConfirmation(_) | OpsError::Invalid(_) => StatusCode::BAD_REQUEST,
                OpsError::Tick(TickError::CorruptState { .. } | TickError::CorruptQuarantine { .. }) => {
                    StatusCode::NOT_FOUND
                }
                OpsError::Tick(_) | OpsError::Incomplete(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            (status, json!({ "error": e.to_string() }))
        }
    }
}

/// What the scale route answers: per function (a partitioned one by its name, with its partitions' totals) its
/// pending changes, partitions and [`target_replicas`], and over all functions the pending changes and the most
/// replicas any function asks for (every replica serves every function, so the busiest one sets the count).
/// Fails, naming the function, when any function's status cannot be read: a backlog read in part would scale in.
pub async fn scale(app: &App) -> Result<Value, OpsError> {
    let mut functions = serde_json::Map::new();
    let (mut pending, mut replicas) = (0u64, 0u64);
    for unit in app.scale_units() {
        let (name, entry) = match unit {
            ScaleUnit::Single(t) => (t.name().to_string(), single(&t).await?),
            ScaleUnit::Partitioned { group, partitions } => {
                let owners = app.partition_owners(&group).await;
                let status = group_status(&group, &partitions, &owners).await?.complete()?;
                let entry = ScaleEntry {
                    pending: status.pending,
                    partitions: status.partitions,
                    max_changes_per_worker: status.max_changes_per_worker,
                    target_replicas: status.target_replicas,
                };
                (group, entry)
            }
        };
        pending += entry.pending;
        replicas = replicas.max(entry.target_replicas);
        functions.insert(name, serde_json::to_value(entry).unwrap_or(Value::Null));
    }
    Ok(json!({ "functions": functions, "pending": pending, "target_replicas": replicas }))
}

/// One function in the scale route's answer.
#[derive(Debug, serde::Serialize)]
struct ScaleEntry {
    pending: u64,
    partitions: u32,
    max_changes_per_worker: u64,
    target_replicas: u64,
}

async fn single(t: &Trigger) -> Result<ScaleEntry, OpsError> {
    let status = t.status().await?;
    let per_worker = t.config().settings.max_changes_per_worker.max(1);
    Ok(ScaleEntry {
        pending: status.pending,
        partitions: 1,
        max_changes_per_worker: per_worker,
        target_replicas: target_replicas(status.pending, per_worker, 1),
    })
}

const ROUTES: &[&str] = &[
    "GET /",
    "GET /{function}",
    "GET /{function}/status",
    "POST /{function}/pause",
    "POST /{function}/resume",
    "POST /{function}/reset?to=earliest|now|<json>&confirm=true",
    "POST /{function}/replay?from=<json>",
    "GET /{function}/quarantine",
    "GET /{function}/quarantine/{batch}",
    "POST /{function}/quarantine/{batch}/retry",
    "GET /scale",
    "POST /{function}/backfill?where=<filter>",
    "POST /{function}/backfill/pause",
    "POST /{function}/backfill/resume",
    "POST /{function}/backfill/cancel",
];

#[cfg(test)]
mod tests {
    //! Request decoding and the route table, over an app whose database is never reachable and whose state
    //! lives in memory: every route that needs only the state store answers for real.
    use super::*;
    use crate::config::{AppConfig, Env};
    use crate::engine::document::{Origin, StateDoc};
    use crate::source::Position;
    use crate::state::MemoryStore;
    use std::sync::Arc;

    /// An app with one PostgreSQL function `Orders` (on a port nobody listens on) and a memory store.
    fn app() -> (Arc<App>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("scratch dir");
        crate::config::write_test_app(dir.path(), "Orders");
        // A port nobody listens on: bound, then released.
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
        let env = Env::from_pairs([("Pg".to_string(), format!("postgres://nobody@127.0.0.1:{port}/none"))]);
        let config = AppConfig::load_from(dir.path(), env).expect("valid config");
        (Arc::new(App::with_store(config, Arc::new(MemoryStore::new())).expect("app builds")), dir)
    }

    fn request(method: &str, path: &str, query: &[(&str, &str)]) -> AdminRequest {
        AdminRequest {
            method: method.into(),
            path: path.into(),
            query: query.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            who: "test".into(),
        }
    }

    /// Writes a fresh state document for `Orders`, as its first tick would.
    async fn first_tick_state(app: &App) {
        let t = app.trigger("Orders").expect("Orders");
        let origin = Origin { function: "Orders", source: "postgres-cursor:public.orders", fingerprint: "test" };
        let doc = StateDoc::new(origin, Position::Null, &app.owner, time::OffsetDateTime::now_utc());
        let bytes = serde_json::to_vec(&doc).expect("serializes");
        app.store.save_if(t.state_key(), &bytes, None).await.expect("save");
    }

    #[test]
    fn a_host_invocation_gives_the_method_path_query_and_caller() {
        let req = json!({
            "Url": "https://x/api/sqltrigger/OrdersChanged/reset?to=now&confirm=true",
            "Method": "post",
            "Query": { "to": "now", "confirm": "true" },
            "Headers": { "X-MS-CLIENT-PRINCIPAL-NAME": ["alice@contoso.com"] },
            "Params": { "path": "OrdersChanged/reset" }
        });
        let r = AdminRequest::from_host(&req);
        assert_eq!((r.method.as_str(), r.path.as_str()), ("POST", "OrdersChanged/reset"));
        assert_eq!(r.query.get("to").map(String::as_str), Some("now"));
        assert_eq!(r.query.get("confirm").map(String::as_str), Some("true"));
        assert_eq!(r.who, "alice@contoso.com (admin route)");
    }

    #[test]
    fn without_the_route_parameter_the_path_comes_from_the_url_and_the_caller_is_the_key_holder() {
        let req = json!({
            "Url": "https://x/api/sqltrigger/OrdersChanged/quarantine/3?code=k",
            "Method": "GET", "Query": {}, "Headers": {}, "Params": {}
        });
        let r = AdminRequest::from_host(&req);
        assert_eq!(r.path, "OrdersChanged/quarantine/3");
        assert_eq!(r.who, "function key holder (admin route)");
        // The admin function's own root lists the functions
        let root = AdminRequest::from_host(&json!({ "Url": "https://x/api/sqltrigger", "Method": "GET" }));
        assert_eq!(root.path, "");
    }

    #[tokio::test]
    async fn the_root_lists_functions_and_unknown_functions_and_routes_are_404_with_what_exists() {
        let (app, _dir) = app();
        let (status, body) = dispatch(&app, request("GET", "", &[])).await;
        assert_eq!((status, &body["functions"]), (StatusCode::OK, &json!(["Orders"])));

        let (status, body) = dispatch(&app, request("GET", "Nope/status", &[])).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body["error"].as_str().is_some_and(|m| m.contains("Nope")), "{body}");
        assert_eq!(body["functions"], json!(["Orders"]));

        // A write route with the wrong method is not run
        let (status, body) = dispatch(&app, request("GET", "Orders/pause", &[])).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body["routes"].as_array().is_some_and(|r| r.len() == ROUTES.len()), "{body}");
    }

    #[tokio::test]
    async fn function_names_are_matched_without_regard_to_case_as_the_host_does() {
        let (app, _dir) = app();
        first_tick_state(&app).await;
        let (status, body) = dispatch(&app, request("POST", "orders/pause", &[])).await;
        assert_eq!((status, &body["paused"]), (StatusCode::OK, &json!(true)), "{body}");
    }

    #[tokio::test]
    async fn bad_or_missing_parameters_are_400_with_what_to_send() {
        let (app, _dir) = app();
        first_tick_state(&app).await;
        // (method, path, query, what the error must say)
        type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: [Case; 6] = [
            ("POST", "Orders/reset", &[], "to=earliest|now"),
            ("POST", "Orders/reset", &[("to", "now")], "confirm=true"),
            ("POST", "Orders/reset", &[("to", "tomorrow")], "earliest, now or a JSON position"),
            ("POST", "Orders/replay", &[], "from=<json position>"),
            ("POST", "Orders/replay", &[("from", "[1,")], "not a JSON position"),
            ("GET", "Orders/quarantine/abc", &[], "not a batch id"),
        ];
        for (method, path, query, expected) in cases {
            let (status, body) = dispatch(&app, request(method, path, query)).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path} {query:?}: {body}");
            let message = body["error"].as_str().unwrap_or_default();
            assert!(message.contains(expected), "{method} {path} {query:?}: {message}");
        }
        // AND none of them wrote anything
        let (_, shown) = dispatch(&app, request("GET", "Orders", &[])).await;
        assert_eq!(shown["state"]["checkpoint"], Value::Null);
    }

    #[tokio::test]
    async fn store_only_actions_answer_and_a_missing_state_or_quarantine_document_is_404() {
        let (app, _dir) = app();
        // A function that never ran: nothing to pause, show has no state
        let (status, body) = dispatch(&app, request("POST", "Orders/pause", &[])).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body["error"].as_str().is_some_and(|m| m.contains("has not run")), "{body}");
        let (status, body) = dispatch(&app, request("GET", "Orders", &[])).await;
        assert_eq!((status, &body["state"]), (StatusCode::OK, &Value::Null));

        // After its first tick: pause, resume and the quarantine listing work
        first_tick_state(&app).await;
        for (method, path) in [("POST", "Orders/pause"), ("POST", "Orders/resume"), ("GET", "Orders/quarantine")] {
            let (status, body) = dispatch(&app, request(method, path, &[])).await;
            assert_eq!(status, StatusCode::OK, "{method} {path}: {body}");
        }
        let (status, body) = dispatch(&app, request("POST", "Orders/quarantine/4/retry", &[])).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
        assert!(body["error"].as_str().is_some_and(|m| m.contains("missing")), "{body}");
    }

    /// An app run by `handler run` with `Audit` and `Orders`, the latter in three partitions; its database is
    /// never reachable.
    fn partitioned_app() -> (Arc<App>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("scratch dir");
        for function in ["Orders", "Audit"] {
            crate::config::write_test_app(dir.path(), function);
        }
        let file = dir.path().join("Orders").join("sqltrigger.json");
        let mut trigger: Value = serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("JSON");
        trigger["partitions"] = json!(3);
        std::fs::write(&file, trigger.to_string()).expect("write");
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
        let env = Env::from_pairs([("Pg".to_string(), format!("postgres://nobody@127.0.0.1:{port}/none"))]);
        let config = AppConfig::load_for(dir.path(), env, crate::config::Mode::Runner).expect("valid config");
        (Arc::new(App::with_store(config, Arc::new(MemoryStore::new())).expect("app builds")), dir)
    }

    #[test]
    fn a_partitioned_function_is_found_by_its_name_as_its_partitions_in_order() {
        let (app, _dir) = partitioned_app();
        // GIVEN no trigger has the partitioned function's own name
        assert!(app.trigger("Orders").is_none());
        // THEN its partitions are found by it, in any case, in order
        let names: Vec<String> = app.partitions("orders").iter().map(|t| t.name().to_string()).collect();
        assert_eq!(names, ["Orders-p0", "Orders-p1", "Orders-p2"]);
        assert!(app.partitions("Audit").is_empty() && app.partitions("Orders-p0").is_empty());
        // AND the scale route sees two functions: one plain, one of three partitions
        let units: Vec<(String, usize)> = app
            .scale_units()
            .into_iter()
            .map(|u| match u {
                ScaleUnit::Single(t) => (t.name().to_string(), 1),
                ScaleUnit::Partitioned { group, partitions } => (group, partitions.len()),
            })
            .collect();
        assert_eq!(units, [("Audit".to_string(), 1), ("Orders".to_string(), 3)]);
    }

    #[tokio::test]
    async fn a_partitioned_function_answers_status_by_its_name_and_names_a_partition_for_other_actions() {
        let (app, _dir) = partitioned_app();
        // WHEN an action other than status is asked of the whole function THEN 400 names the partitions
        let (status, body) = dispatch(&app, request("POST", "Orders/pause", &[])).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(body["error"].as_str().is_some_and(|m| m.contains("POST /Orders-p0/pause")), "{body}");
        assert_eq!(body["partitions"], json!(["Orders-p0", "Orders-p1", "Orders-p2"]));
        // AND its status and the scale route read the database: 503 with the reason while it is down, as a
        // plain function's status is
        for path in ["Orders/status", "orders/status", "scale"] {
            let (status, body) = dispatch(&app, request("GET", path, &[])).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
            assert!(body["error"].as_str().is_some_and(|m| m.contains("PostgreSQL")), "{path}: {body}");
        }
        // AND a name that is neither a function nor a partitioned one is still 404
        let (status, _) = dispatch(&app, request("GET", "Order/status", &[])).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn actions_that_read_the_source_are_503_with_the_reason_while_the_database_is_down() {
        let (app, _dir) = app();
        first_tick_state(&app).await;
        // Status counts pending changes; replay and reset check a position they are given
        for (method, path, query) in [
            ("GET", "Orders/status", &[][..]),
            ("POST", "Orders/replay", &[("from", "null")][..]),
            ("POST", "Orders/reset", &[("to", r#"["1","1"]"#), ("confirm", "true")][..]),
        ] {
            let (status, body) = dispatch(&app, request(method, path, query)).await;
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{method} {path}: {body}");
            assert!(body["error"].as_str().is_some_and(|m| m.contains("PostgreSQL")), "{method} {path}: {body}");
        }
        // AND nothing was written
        let (_, shown) = dispatch(&app, request("GET", "Orders", &[])).await;
        assert_eq!(shown["state"]["updated_by"], app.owner.as_str());
    }
}
