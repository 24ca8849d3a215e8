//! The HTTP face the Functions host talks to. Thin on purpose: decode the invocation, run the tick, encode
//! the answer. `GET /` answers as soon as the socket is bound (the host's readiness probe); nothing here
//! touches a database at start.

use crate::app::App;
use crate::engine::{Answer, OutcomeKind, RetryDirective};
use crate::protocol::{Attempt, InvocationRequest, InvocationResponse, Malformed, INVOCATION_ID_HEADER};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::Method;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

/// Invocation bodies are small timer payloads; anything near this is not from the host.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// The router; tests call it with `oneshot`, `main` serves it.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/", get(ready))
        .route("/{function}", post(invoke))
        .route("/admin", get(direct_admin).post(direct_admin))
        // `/admin/{*path}` does not match an empty rest: the trailing-slash root needs its own route.
        .route("/admin/", get(direct_admin).post(direct_admin))
        .route("/admin/{*path}", get(direct_admin).post(direct_admin))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

async fn ready(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({ "status": "ready", "functions": app.function_names() }))
}

/// The admin function's invocation: the host checked the function key; answer through its http output.
async fn admin_invocation(app: &App, admin: &crate::config::AdminFunction, body: &[u8]) -> Response {
    let request = match InvocationRequest::decode(body) {
        Ok(r) => r,
        Err(Malformed(message)) => return error(StatusCode::BAD_REQUEST, message, json!({})),
    };
    let Some(req) = request.data.get(&admin.request_binding) else {
        return error(
            StatusCode::BAD_REQUEST,
            format!("the invocation has no request under Data.{}", admin.request_binding),
            json!({}),
        );
    };
    let (status, answer) = crate::admin::dispatch(app, crate::admin::AdminRequest::from_host(req)).await;
    let http = json!({
        "statusCode": status.as_u16(),
        "body": answer.to_string(),
        "headers": { "Content-Type": "application/json" },
    });
    let raw = serde_json::value::to_raw_value(&http).expect("JSON values serialize");
    let mut response = InvocationResponse::default();
    if admin.response_binding == "$return" {
        response.return_value = Some(raw);
    } else {
        response.outputs.insert(admin.response_binding.clone(), raw);
    }
    (StatusCode::OK, Json(response)).into_response()
}

/// The address `handler run`'s admin listener binds: `--admin-bind` (`flag`), else the app setting
/// `Sql_Trigger_AdminBindAddress`, else 127.0.0.1. An IP address, not a host name: a name could resolve to
/// more interfaces than the operator meant to expose.
pub fn admin_bind_address(flag: Option<&str>, setting: Option<&str>) -> Result<std::net::IpAddr, String> {
    let name = crate::config::settings::ADMIN_BIND_ADDRESS.name;
    let (text, from) = match (flag, setting) {
        (Some(flag), _) => (flag, "--admin-bind".to_string()),
        (None, Some(setting)) => (setting, format!("the app setting {name}")),
        (None, None) => return Ok(std::net::Ipv4Addr::LOCALHOST.into()),
    };
    text.trim().parse().map_err(|_| {
        format!("{from} is {text:?}, not an IP address: use 127.0.0.1 (this machine only) or 0.0.0.0 (every interface, e.g. for KEDA in another pod)")
    })
}

/// The router of `handler run`'s admin listener: the admin routes only, so that a listener bound beyond
/// loopback (`--admin-bind`) serves nothing without the key (no readiness page naming the functions, no
/// invocation route that would run a tick).
pub fn admin_router(app: Arc<App>) -> Router {
    Router::new()
        .route("/admin", get(direct_admin).post(direct_admin))
        .route("/admin/", get(direct_admin).post(direct_admin))
        .route("/admin/{*path}", get(direct_admin).post(direct_admin))
        .fallback(admin_not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

async fn admin_not_found(method: Method, uri: axum::http::Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("nothing is served at {method} {}", uri.path()),
        json!({ "routes": ["GET|POST /admin/... (with Sql_Trigger_AdminKey)", "GET /admin/scale (KEDA's metrics-api scaler)"] }),
    )
}

/// Anything no route serves: a 404 that names what is served, instead of an empty body.
async fn not_found(State(app): State<Arc<App>>, method: Method, uri: axum::http::Uri) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!("nothing is served at {method} {}", uri.path()),
        json!({
            "routes": ["GET / (readiness)", "POST /{function} (the host's invocations)", "GET|POST /admin/... (with Sql_Trigger_AdminKey)"],
            "functions": app.function_names(),
        }),
    )
}

/// `/admin/...` without the host: only with `Sql_Trigger_AdminKey` set, and only with that key.
async fn direct_admin(
    State(app): State<Arc<App>>,
    method: Method,
    path: Option<Path<String>>,
    Query(query): Query<std::collections::BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let Some(expected) = app.config.env.get(crate::config::settings::ADMIN_KEY.name) else {
        return error(
            StatusCode::NOT_FOUND,
            "direct admin routes are off; set Sql_Trigger_AdminKey, or use the admin function under the Functions host"
                .into(),
            json!({}),
        );
    };
    if !presented_keys(&headers, &query).iter().any(|k| same_secret(k, expected)) {
        // The key presented is never logged, right or wrong.
        tracing::warn!(path = %path.as_ref().map_or("", |p| p.0.as_str()), "admin request refused: missing or wrong key");
        return error(
            StatusCode::UNAUTHORIZED,
            "a valid admin key is required: x-functions-key or X-API-KEY header, Authorization: Bearer <key>, or code"
                .into(),
            json!({}),
        );
    }
    let request = crate::admin::AdminRequest {
        method: method.as_str().to_string(),
        path: path.map(|Path(p)| p).unwrap_or_default(),
        query,
        who: "admin key holder (direct route)".into(),
    };
    let (status, body) = crate::admin::dispatch(&app, request).await;
    (status, Json(body)).into_response()
}

/// Checks a request to a trigger function as the host sends it (see `protocol`) and makes the engine's
/// attempt of it: the invocation id header, the body, the timer under its binding name, and a retry context
/// that matches function.json's policy (the host sends one on every attempt when there is a policy, with the
/// policy's `maxRetryCount`). A blank body stays a manual run without a retry context (lenient, see
/// `InvocationRequest::decode`).
pub(crate) fn host_attempt(
    timer_binding: &str,
    policy: Option<&crate::config::RetryPolicy>,
    id_header: Option<&str>,
    body: &[u8],
) -> Result<Attempt, Malformed> {
    let id = crate::protocol::invocation_id(id_header)?;
    let request = InvocationRequest::decode(body)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Attempt::new(id, None));
    }
    request.check_timer(timer_binding)?;
    match (policy, &request.retry) {
        (Some(policy), None) => {
            return Err(Malformed(format!(
                "the body has no Metadata.RetryContext, which the host sends on every attempt of a function with a retry policy (maxRetryCount {})",
                policy.max_retry_count
            )))
        }
        (Some(policy), Some(retry)) if retry.max_retry_count != policy.max_retry_count => {
            return Err(Malformed(format!(
                "Metadata.RetryContext.MaxRetryCount is {}, but function.json's retry policy says {}: the host sends its own policy's",
                retry.max_retry_count, policy.max_retry_count
            )))
        }
        (None, Some(_)) => {
            return Err(Malformed(
                "the body has a Metadata.RetryContext, but function.json has no retry policy, without which the host sends none"
                    .into(),
            ))
        }
        _ => {}
    }
    Ok(Attempt::new(id, request.retry))
}

/// The keys a request presents, every way an admin client sends one: `x-functions-key` (the Functions host's
/// own header), `X-API-KEY` (KEDA's `metrics-api` scaler in `apiKey` mode, its default `keyParamName`),
/// `Authorization: Bearer <key>` (KEDA's `bearer` mode) and the `code` query parameter. Header names are
/// matched without regard to case, as HTTP requires.
fn presented_keys(headers: &HeaderMap, query: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    let header = |name: &str| headers.get_all(name).iter().filter_map(|v| v.to_str().ok()).map(str::to_string);
    let bearer = headers
        .get_all(axum::http::header::AUTHORIZATION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer")))
        .map(|(_, token)| token.trim().to_string());
    header("x-functions-key").chain(header("x-api-key")).chain(bearer).chain(query.get("code").cloned()).collect()
}

/// Compares secrets by digest so the time taken does not depend on where they first differ.
fn same_secret(a: &str, b: &str) -> bool {
    use sha2::{Digest, Sha256};
    let (a, b) = (Sha256::digest(a.as_bytes()), Sha256::digest(b.as_bytes()));
    // Every byte is compared whatever the first difference, not `==`, which may stop at it.
    a.iter().zip(b.iter()).fold(0u8, |differ, (x, y)| differ | (x ^ y)) == 0
}

/// An error answer: a status and a JSON body that says what went wrong and what to do.
fn error(status: StatusCode, message: String, extra: serde_json::Value) -> Response {
    let mut body = json!({ "error": message, "Outputs": {}, "Logs": [message], "ReturnValue": null });
    if let (Some(obj), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        obj.extend(extra.clone());
    }
    (status, Json(body)).into_response()
}

async fn invoke(
    State(app): State<Arc<App>>,
    Path(function): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let invocation_id = headers
        .get("x-azure-functions-invocationid")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .chars()
        .take(64)
        .collect::<String>();
    let span = tracing::info_span!("invocation", function = %function, invocation_id = %invocation_id);
    async move {
        if let Some(admin) = app.config.admin_functions.iter().find(|a| a.name.eq_ignore_ascii_case(&function)) {
            return admin_invocation(&app, admin, &body).await;
        }
        let Some(trigger) = app.trigger(&function).cloned() else {
            tracing::warn!("invocation of an unknown function");
            return error(
                StatusCode::NOT_FOUND,
                format!("no SQL trigger function named {function:?} is configured here"),
                json!({ "functions": app.function_names() }),
            );
        };
        // Everything about the request is checked before any state is read: an answer to something that is
        // not the host's invocation never reaches an output binding, and the batch would be lost.
        let config = trigger.config();
        let id_header = headers.get(INVOCATION_ID_HEADER).and_then(|v| v.to_str().ok());
        let attempt = match host_attempt(&config.timer_binding, config.retry.as_ref(), id_header, &body) {
            Ok(attempt) => attempt,
            Err(Malformed(message)) => {
                tracing::warn!(error = %message, "refused a request that is not a host invocation");
                return error(StatusCode::BAD_REQUEST, message, json!({}));
            }
        };
        let started = Instant::now();
        let retry_count = attempt.retry.as_ref().map_or(0, |r| r.retry_count);
        // The trigger delivers as configured: to the host's bindings (mapped outputs), or through its own sink
        // (no outputs).
        match trigger.invoke(&attempt).await {
            Ok(Answer { outcome, outputs: mapped }) => {
                let mut logs = outcome.logs;
                let unsent = mapped.report();
                for line in &unsent {
                    tracing::warn!("{line}");
                }
                let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
                for line in &logs {
                    tracing::info!("{line}");
                }
                logs.extend(unsent);
                tracing::info!(
                    batch_id = outcome.batch_id.unwrap_or(0),
                    rows = outcome.changes.len(),
                    outcome = ?outcome.kind,
                    store_operations = outcome.store_operations,
                    elapsed_ms,
                    retry_count,
                    "tick finished"
                );
                if outcome.kind == OutcomeKind::Conflict {
                    tracing::info!("another tick committed first; answered an empty batch");
                }
                let response = InvocationResponse { outputs: mapped.outputs, logs, return_value: None };
                (StatusCode::OK, Json(response)).into_response()
            }
            Err(e) => {
                match e.directive() {
                    RetryDirective::RetryLater => tracing::warn!(error = %e, hint = e.hint(), "tick failed"),
                    RetryDirective::RetryCounted | RetryDirective::Stop => {
                        tracing::error!(error = %e, hint = e.hint(), "tick failed")
                    }
                }
                error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e} ({})", e.hint()), json!({}))
            }
        }
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{AppConfig, Env};
    use crate::state::MemoryStore;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    /// An app with one PostgreSQL function whose database is never contacted by these tests.
    fn app() -> Arc<App> {
        app_with(&[])
    }

    /// [`app`] with extra app settings.
    fn app_with(settings: &[(&str, &str)]) -> Arc<App> {
        // A folder per call: tests run in parallel, and one writing the app while another reads it would read
        // half a file.
        let root = std::env::temp_dir().join(format!("spt-server-test-{}", uuid::Uuid::new_v4().simple()));
        crate::config::write_test_app(&root, "Orders");
        let mut pairs = vec![("Pg".to_string(), "postgres://nobody@127.0.0.1:1/none".to_string())];
        pairs.extend(settings.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let config = AppConfig::load_from(&root, Env::from_pairs(pairs)).expect("valid config");
        let _ = std::fs::remove_dir_all(&root);
        Arc::new(App::with_store(config, Arc::new(MemoryStore::new())).expect("app builds"))
    }

    async fn send(app: &Arc<App>, method: &str, uri: &str, body: Vec<u8>) -> (StatusCode, serde_json::Value) {
        let request = Request::builder().method(method).uri(uri).body(Body::from(body)).expect("request");
        let response = router(app.clone()).oneshot(request).await.expect("router answers");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("body");
        (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    #[tokio::test]
    async fn readiness_answers_without_touching_the_database() {
        let (status, body) = send(&app(), "GET", "/", vec![]).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["functions"], serde_json::json!(["Orders"]));
    }

    #[tokio::test]
    async fn an_unknown_function_is_404_naming_the_configured_ones() {
        let (status, body) = send(&app(), "POST", "/Nope", b"{}".to_vec()).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body["error"].as_str().expect("message").contains("Nope"));
        assert_eq!(body["functions"], serde_json::json!(["Orders"]));
    }

    #[tokio::test]
    async fn the_admin_root_answers_with_and_without_a_trailing_slash() {
        // GIVEN direct admin routes with a key
        let app = app_with(&[("Sql_Trigger_AdminKey", "k3y")]);
        for uri in ["/admin?code=k3y", "/admin/?code=k3y"] {
            // WHEN the root is asked for THEN both spellings list the functions
            let (status, body) = send(&app, "GET", uri, vec![]).await;
            assert_eq!((status, &body["functions"]), (StatusCode::OK, &serde_json::json!(["Orders"])), "{uri}: {body}");
        }
        // AND without the key both are refused alike
        for uri in ["/admin", "/admin/"] {
            let (status, body) = send(&app, "GET", uri, vec![]).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{uri}: {body}");
        }
    }

    /// `GET uri` with `headers` through `router`.
    async fn get_with(router: Router, uri: &str, headers: &[(&str, &str)]) -> StatusCode {
        let mut request = Request::builder().method("GET").uri(uri);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        router.oneshot(request.body(Body::empty()).expect("request")).await.expect("router answers").status()
    }

    #[tokio::test]
    async fn the_admin_key_is_taken_from_every_header_keda_sends_and_nothing_else() {
        // GIVEN direct admin routes with a key
        let app = app_with(&[("Sql_Trigger_AdminKey", "k3y")]);
        let accepted: [&[(&str, &str)]; 5] = [
            &[("x-functions-key", "k3y")],
            &[("X-API-KEY", "k3y")],
            &[("Authorization", "Bearer k3y")],
            &[("authorization", "bearer k3y")],
            &[("X-API-KEY", "wrong"), ("x-functions-key", "k3y")],
        ];
        for headers in accepted {
            // WHEN the root is asked for with the key THEN it answers
            assert_eq!(get_with(admin_router(app.clone()), "/admin", headers).await, StatusCode::OK, "{headers:?}");
        }
        let refused: [&[(&str, &str)]; 6] = [
            &[],
            &[("X-API-KEY", "k3y ")],
            &[("X-API-KEY", "K3Y")],
            &[("Authorization", "Basic k3y")],
            &[("Authorization", "k3y")],
            &[("X-API-KEY-2", "k3y")],
        ];
        for headers in refused {
            assert_eq!(
                get_with(admin_router(app.clone()), "/admin/scale", headers).await,
                StatusCode::UNAUTHORIZED,
                "{headers:?}"
            );
        }
    }

    #[tokio::test]
    async fn the_admin_listener_serves_the_admin_routes_only() {
        let app = app_with(&[("Sql_Trigger_AdminKey", "k3y")]);
        // The readiness page names the functions and the invocation route runs ticks: neither is served
        for uri in ["/", "/Orders"] {
            assert_eq!(get_with(admin_router(app.clone()), uri, &[("X-API-KEY", "k3y")]).await, StatusCode::NOT_FOUND);
        }
        let request = Request::builder().method("POST").uri("/Orders").body(Body::from("{}")).expect("request");
        let response = admin_router(app).oneshot(request).await.expect("router answers");
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn the_admin_bind_address_is_the_flag_else_the_setting_else_loopback_and_an_ip() {
        let ip = |flag: Option<&str>, setting: Option<&str>| admin_bind_address(flag, setting).map(|a| a.to_string());
        assert_eq!(ip(None, None).as_deref(), Ok("127.0.0.1"));
        assert_eq!(ip(None, Some("0.0.0.0")).as_deref(), Ok("0.0.0.0"));
        assert_eq!(ip(Some("::"), Some("0.0.0.0")).as_deref(), Ok("::"));
        let refused = ip(None, Some("pod.local")).expect_err("a name");
        assert!(refused.contains("Sql_Trigger_AdminBindAddress is \"pod.local\", not an IP address"), "{refused}");
        let refused = ip(Some("*"), None).expect_err("not an address");
        assert!(refused.starts_with("--admin-bind is \"*\""), "{refused}");
    }

    #[test]
    fn secrets_compare_equal_only_when_equal() {
        assert!(same_secret("k3y", "k3y"));
        assert!(!same_secret("k3y", "k3z") && !same_secret("k3y", "k3y ") && !same_secret("", "k3y"));
    }

    #[tokio::test]
    async fn a_path_nothing_serves_is_404_naming_the_routes() {
        let (status, body) = send(&app(), "GET", "/api/whatever", vec![]).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"], "nothing is served at GET /api/whatever");
        assert!(body["routes"].as_array().is_some_and(|r| r.len() == 3), "{body}");
        assert_eq!(body["functions"], serde_json::json!(["Orders"]));
    }

    #[tokio::test]
    async fn hostile_bodies_get_400_and_the_server_keeps_serving() {
        let app = app();
        let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
        let huge_string =
            format!("{{\"Data\":{{\"x\":\"{}\"}},\"Metadata\":{{\"RetryContext\":7}}}}", "a".repeat(500_000));
        let bodies: Vec<Vec<u8>> = vec![
            b"{\"Data\":".to_vec(),
            b"[1,2,3]".to_vec(),
            b"{\"Data\":[],\"Metadata\":{}}".to_vec(),
            b"{\"Metadata\":{\"RetryContext\":{\"RetryCount\":\"lots\"}}}".to_vec(),
            b"{\"Metadata\":{\"RetryContext\":{\"RetryCount\":1e400}}}".to_vec(),
            vec![0xff, 0xfe, 0x00, 0x7b],
            deep.into_bytes(),
            huge_string.into_bytes(),
            b"null".to_vec(),
        ];
        for body in bodies {
            let preview = String::from_utf8_lossy(&body[..body.len().min(40)]).into_owned();
            let (status, answer) = send(&app, "POST", "/Orders", body).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "body {preview:?} answered {answer}");
            assert!(answer["error"].as_str().is_some_and(|m| !m.is_empty()), "body {preview:?}");
        }
        let oversized = vec![b' '; MAX_BODY_BYTES + 1];
        let (status, _) = send(&app, "POST", "/Orders", oversized).await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
        let (status, _) = send(&app, "GET", "/", vec![]).await;
        assert_eq!(status, StatusCode::OK);
    }
}
