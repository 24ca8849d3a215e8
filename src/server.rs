//! The HTTP face the Functions host talks to. Thin on purpose: decode the invocation, run the tick, encode
//! the answer. `GET /` answers as soon as the socket is bound (the host's readiness probe); nothing here
//! touches a database at start.

use crate::app::App;
use crate::protocol::{InvocationRequest, InvocationResponse};
use crate::trigger::{ErrorKind, OutcomeKind};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
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
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(app)
}

async fn ready(State(app): State<Arc<App>>) -> Json<serde_json::Value> {
    Json(json!({ "status": "ready", "functions": app.function_names() }))
}

/// An error answer: a status and a JSON body that says what went wrong and what to do.
fn error(status: StatusCode, message: String, extra: serde_json::Value) -> Response {
    let mut body = json!({ "error": message, "Outputs": {}, "Logs": [message], "ReturnValue": null });
    if let (Some(obj), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        obj.extend(extra.clone());
    }
    (status, Json(body)).into_response()
}

async fn invoke(State(app): State<Arc<App>>, Path(function): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let invocation_id = headers
        .get("x-azure-functions-invocationid")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
        .chars()
        .take(64)
        .collect::<String>();
    let span = tracing::info_span!("invocation", function = %function, invocation_id = %invocation_id);
    async move {
        let Some(trigger) = app.trigger(&function).cloned() else {
            tracing::warn!("invocation of an unknown function");
            return error(
                StatusCode::NOT_FOUND,
                format!("no SQL trigger function named {function:?} is configured here"),
                json!({ "functions": app.function_names() }),
            );
        };
        let request = match InvocationRequest::decode(&body) {
            Ok(r) => r,
            Err(message) => {
                tracing::warn!(error = %message, "malformed invocation body");
                return error(StatusCode::BAD_REQUEST, message, json!({}));
            }
        };
        let started = Instant::now();
        let retry = request.retry();
        match trigger.tick(retry).await {
            Ok(outcome) => {
                let mapped = trigger.outputs(&outcome.changes);
                let mut logs = outcome.logs;
                for (binding, n) in &mapped.dropped_deletes {
                    logs.push(format!(
                        "{n} delete(s) not sent to output binding {binding:?}: the host's SQL output binding cannot delete; use deliveryMode sink or a message binding for deletes"
                    ));
                }
                let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
                for line in &logs {
                    tracing::info!("{line}");
                }
                tracing::info!(
                    batch_id = outcome.batch_id.unwrap_or(0),
                    rows = outcome.changes.len(),
                    outcome = ?outcome.kind,
                    store_operations = outcome.store_operations,
                    elapsed_ms,
                    retry_count = retry.retry_count,
                    "tick finished"
                );
                if outcome.kind == OutcomeKind::Conflict {
                    tracing::info!("another tick committed first; answered an empty batch");
                }
                let response = InvocationResponse { outputs: mapped.outputs, logs, return_value: None };
                (StatusCode::OK, Json(response)).into_response()
            }
            Err(e) => {
                let kind = e.kind();
                match kind {
                    ErrorKind::Transient => tracing::warn!(error = %e, hint = e.hint(), "tick failed"),
                    ErrorKind::Operator => tracing::error!(error = %e, hint = e.hint(), "tick failed"),
                }
                error(StatusCode::INTERNAL_SERVER_ERROR, format!("{e} ({})", e.hint()), json!({}))
            }
        }
    }
    .instrument(span)
    .await
}
