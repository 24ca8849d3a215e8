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
//! `GET /{fn}/quarantine` · `GET /{fn}/quarantine/{batch}` · `POST /{fn}/quarantine/{batch}/retry`.

use crate::app::App;
use crate::ops::{self, OpsError, ResetTo};
use crate::trigger::TickError;
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
        return (
            StatusCode::NOT_FOUND,
            json!({ "error": format!("no SQL trigger function named {:?}", parts[0]), "functions": app.function_names() }),
        );
    };
    let t = &*trigger;
    let q = |k: &str| req.query.get(k).cloned();
    let who = req.who.as_str();
    let result: Result<Value, OpsError> = match (method, &parts[1..]) {
        ("GET", []) => ops::show(t).await,
        ("GET", ["status"]) => ops::status(t).await.map(|s| serde_json::to_value(s).unwrap_or(Value::Null)),
        ("POST", ["pause"]) => ops::pause(t, who).await.map(|()| json!({ "function": t.name(), "paused": true })),
        ("POST", ["resume"]) => ops::resume(t, who).await.map(|()| json!({ "function": t.name(), "paused": false })),
        ("POST", ["reset"]) => match q("to").map(|to| ResetTo::parse(&to)) {
            Some(Ok(to)) => ops::reset(t, to, q("confirm").as_deref() == Some("true"), who).await,
            Some(Err(e)) => Err(e),
            None => Err(OpsError::Invalid("reset needs to=earliest|now|<json position>".into())),
        },
        ("POST", ["replay"]) => match q("from").map(|f| serde_json::from_str::<Value>(&f)) {
            Some(Ok(from)) => ops::replay(t, from, who).await,
            Some(Err(e)) => Err(OpsError::Invalid(format!("from is not a JSON position: {e}"))),
            None => Err(OpsError::Invalid("replay needs from=<json position>".into())),
        },
        ("GET", ["quarantine"]) => ops::quarantine_list(t).await,
        ("GET", ["quarantine", batch]) => match batch.parse() {
            Ok(b) => ops::quarantine_show(t, b).await,
            Err(_) => Err(OpsError::Invalid(format!("{batch:?} is not a batch id"))),
        },
        ("POST", ["quarantine", batch, "retry"]) => match batch.parse() {
            Ok(b) => ops::quarantine_retry(t, b, who).await,
            Err(_) => Err(OpsError::Invalid(format!("{batch:?} is not a batch id"))),
        },
        _ => {
            return (
                StatusCode::NOT_FOUND,
                json!({ "error": format!("no admin route {method} /{}", req.path), "routes": ROUTES }),
            )
        }
    };
    match result {
        Ok(body) => (StatusCode::OK, body),
        Err(e) => {
            let status = match &e {
                OpsError::NoState(_) => StatusCode::NOT_FOUND,
                OpsError::Conflict(_) => StatusCode::CONFLICT,
                OpsError::NeedsConfirmation(_) | OpsError::Invalid(_) => StatusCode::BAD_REQUEST,
                OpsError::Tick(TickError::CorruptState { .. }) => StatusCode::NOT_FOUND,
                OpsError::Tick(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            (status, json!({ "error": e.to_string() }))
        }
    }
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
];
