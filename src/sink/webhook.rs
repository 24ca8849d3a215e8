//! HTTP POST of each batch to a webhook, with an idempotency key per batch.
//!
//! Body: `{"function","batch_id","fence","changes":[{"Operation":0,"Item":{...}}]}`. Headers:
//! `Idempotency-Key: {app}/{function}/{batch_id}` (the same on every re-delivery of the batch, so the receiver
//! can drop duplicates) and `X-Sql-Trigger-Fence: {fence}`. A 2xx is an acknowledgement. 408, 429, 5xx and a
//! connection failure are transient: the batch stays in flight and the next tick posts it again, so by default
//! one delivery is one POST (the tick's caller is the retry, as for every other sink). `maxRetries` adds
//! retries inside the tick, with exponential backoff from 200 ms to 10 s, for a receiver known to blip; each
//! costs up to `timeoutMs` of the tick's time. Any other status is a rejection, which counts toward the poison
//! limit.

use super::{Sink, SinkBatch, SinkError};
use crate::config::{Secret, WebhookSpec};
use serde_json::Value;
use std::time::Duration;

#[derive(Debug)]
pub struct WebhookSink {
    url: Secret,
    display: String,
    client: reqwest::Client,
    headers: Vec<(String, Secret)>,
    max_retries: u32,
}

impl WebhookSink {
    /// The sink `spec` describes (checked at load: an http or https URL, valid headers), without connecting.
    pub fn new(spec: &WebhookSpec) -> Result<Self, String> {
        let WebhookSpec { url, timeout, max_retries, headers } = spec;
        let parsed = reqwest::Url::parse(url.expose()).map_err(|e| format!("webhook url is not a URL ({e})"))?;
        // Show scheme, host and port only: a query string may carry a key, and so may the path (Slack's, Teams'
        // and Discord's incoming webhooks put theirs there).
        let port = parsed.port().map(|p| format!(":{p}")).unwrap_or_default();
        let path = if parsed.path() == "/" { "/" } else { "/***" };
        let display = format!("{}://{}{port}{path}", parsed.scheme(), parsed.host_str().unwrap_or(""));
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(*timeout)
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self { url: url.clone(), display, client, headers: headers.clone(), max_retries: *max_retries })
    }
}

#[async_trait::async_trait]
impl Sink for WebhookSink {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), SinkError> {
        let body = format!(
            "{{\"function\":{},\"batch_id\":{},\"fence\":{},\"changes\":{}}}",
            Value::String(batch.function.to_string()),
            batch.range.batch_id,
            batch.fence,
            crate::change::encode_batch(batch.changes).get()
        );
        let mut delay = Duration::from_millis(200);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut request = self
                .client
                .post(self.url.expose())
                .header("content-type", "application/json")
                .header("idempotency-key", batch.idempotency_key())
                .header("x-sql-trigger-fence", batch.fence.to_string())
                .body(body.clone());
            for (k, v) in &self.headers {
                request = request.header(k.as_str(), v.expose());
            }
            let outcome = match request.send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => {
                    let status = r.status();
                    let retry = status.is_server_error() || status.as_u16() == 408 || status.as_u16() == 429;
                    let msg = format!("webhook {} answered {status}", self.display);
                    if retry {
                        SinkError::Transient(msg)
                    } else {
                        return Err(SinkError::Rejected(msg));
                    }
                }
                Err(e) => SinkError::Transient(format!("webhook {} did not answer: {}", self.display, e.without_url())),
            };
            if attempt > self.max_retries {
                return Err(outcome);
            }
            tracing::warn!(sink = %self.display, attempt, error = %outcome, "webhook delivery failed; retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
    }

    fn describe(&self) -> String {
        format!("webhook {}", self.display)
    }
}

#[cfg(test)]
mod tests {
    //! The webhook against a local HTTP receiver whose answers each test scripts.
    use super::*;
    use crate::change::{Change, Operation};
    use crate::config::{Env, SinkSpec};
    use crate::source::BatchRange;
    use axum::http::{HeaderMap, StatusCode};
    use serde_json::Value;
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    /// What the receiver saw of one request.
    #[derive(Debug, Clone)]
    struct Seen {
        headers: HeaderMap,
        body: Value,
    }

    /// A receiver on 127.0.0.1 that answers the scripted statuses in order, then 200.
    #[derive(Debug, Clone, Default)]
    struct Receiver {
        script: Arc<Mutex<VecDeque<u16>>>,
        seen: Arc<Mutex<Vec<Seen>>>,
    }

    impl Receiver {
        async fn start(script: impl IntoIterator<Item = u16>) -> (Self, String) {
            let receiver = Self { script: Arc::new(Mutex::new(script.into_iter().collect())), ..Self::default() };
            let state = receiver.clone();
            let app = axum::Router::new().route(
                "/hook",
                axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
                    let state = state.clone();
                    async move {
                        let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        state.seen.lock().expect("seen").push(Seen { headers, body });
                        let status = state.script.lock().expect("script").pop_front().unwrap_or(200);
                        StatusCode::from_u16(status).expect("a status code")
                    }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            let url = format!("http://{}/hook", listener.local_addr().expect("address"));
            tokio::spawn(async move { axum::serve(listener, app).await });
            (receiver, url)
        }

        fn seen(&self) -> Vec<Seen> {
            self.seen.lock().expect("seen").clone()
        }
    }

    fn sink(mut options: Value) -> WebhookSink {
        options["type"] = "webhook".into();
        match SinkSpec::parse(&options, &Env::default()) {
            Ok(SinkSpec::Webhook(spec)) => WebhookSink::new(&spec).expect("valid webhook options"),
            other => panic!("{other:?}"),
        }
    }

    fn changes() -> Vec<Change> {
        serde_json::from_str(r#"[{"Operation":0,"Item":{"id":1,"amount":1.25}},{"Operation":2,"Item":{"id":2}}]"#)
            .expect("changes")
    }

    /// Batch 7 (its positions do not matter to a webhook).
    static RANGE: BatchRange = BatchRange { batch_id: 7, from: Value::Null, to: Value::Null, rows: 2, backfill: None };

    fn batch(changes: &[Change]) -> SinkBatch<'_> {
        SinkBatch { app: "shop", function: "OrdersChanged", fence: 3, changes, range: &RANGE }
    }

    #[tokio::test]
    async fn a_2xx_acknowledges_a_batch_posted_with_its_idempotency_key_fence_and_headers() {
        // GIVEN a receiver and a webhook with an extra header
        let (receiver, url) = Receiver::start([]).await;
        let webhook = sink(serde_json::json!({ "url": url, "headers": { "Authorization": "Bearer t0ken" } }));
        let changes = changes();

        // WHEN a batch is delivered
        webhook.deliver(&batch(&changes)).await.expect("delivered");

        // THEN one POST carried the batch in the documented shape
        let seen = receiver.seen();
        assert_eq!(seen.len(), 1);
        let expected = serde_json::json!({
            "function": "OrdersChanged", "batch_id": 7, "fence": 3,
            "changes": [{"Operation": 0, "Item": {"id": 1, "amount": 1.25}}, {"Operation": 2, "Item": {"id": 2}}]
        });
        assert_eq!(seen[0].body, expected);
        let header = |name: &str| seen[0].headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        assert_eq!(header("idempotency-key").as_deref(), Some("shop/OrdersChanged/7"));
        assert_eq!(header("x-sql-trigger-fence").as_deref(), Some("3"));
        assert_eq!(header("authorization").as_deref(), Some("Bearer t0ken"));
        assert_eq!(header("content-type").as_deref(), Some("application/json"));
        assert_eq!(changes[1].operation, Operation::Delete);
    }

    #[tokio::test]
    async fn by_default_a_server_error_is_one_post_and_the_next_tick_is_the_retry() {
        let (receiver, url) = Receiver::start([503]).await;
        let webhook = sink(serde_json::json!({ "url": url }));
        let changes = changes();
        let err = webhook.deliver(&batch(&changes)).await.expect_err("fails");
        assert!(matches!(&err, SinkError::Transient(m) if m.ends_with("answered 503 Service Unavailable")), "{err:?}");
        assert_eq!(receiver.seen().len(), 1);
        webhook.deliver(&batch(&changes)).await.expect("the next tick's post succeeds");
        assert_eq!(receiver.seen().len(), 2);
    }

    #[tokio::test]
    async fn throttling_and_server_errors_are_retried_with_the_same_key_until_a_2xx() {
        // GIVEN a receiver that answers 503, 429 and 408 before 200
        let (receiver, url) = Receiver::start([503, 429, 408]).await;
        let webhook = sink(serde_json::json!({ "url": url, "maxRetries": 3 }));
        let changes = changes();

        // WHEN a batch is delivered
        webhook.deliver(&batch(&changes)).await.expect("delivered on the fourth attempt");

        // THEN it was posted four times, identically
        let seen = receiver.seen();
        assert_eq!(seen.len(), 4);
        assert!(seen.iter().all(|s| s.body == seen[0].body));
        assert!(seen.iter().all(|s| s.headers.get("idempotency-key") == seen[0].headers.get("idempotency-key")));
    }

    #[tokio::test]
    async fn a_server_error_past_the_retry_budget_is_transient_and_a_4xx_is_a_rejection_without_retry() {
        // GIVEN a receiver that always fails with 500, and a budget of one retry
        let (receiver, url) = Receiver::start([500, 500, 500]).await;
        let webhook = sink(serde_json::json!({ "url": url, "maxRetries": 1 }));
        let changes = changes();
        // THEN delivery is a transient failure after two posts, naming the status
        let err = webhook.deliver(&batch(&changes)).await.expect_err("fails");
        assert!(matches!(&err, SinkError::Transient(m) if m.contains("500")), "{err:?}");
        assert_eq!(receiver.seen().len(), 2);

        // GIVEN a receiver that refuses the batch with 400
        let (receiver, url) = Receiver::start([400]).await;
        let webhook = sink(serde_json::json!({ "url": url, "maxRetries": 4 }));
        // THEN it is rejected at once: retrying the same batch would fail the same way
        let err = webhook.deliver(&batch(&changes)).await.expect_err("rejected");
        assert!(matches!(&err, SinkError::Rejected(m) if m.contains("400")), "{err:?}");
        assert_eq!(receiver.seen().len(), 1);
    }

    #[tokio::test]
    async fn an_unreachable_webhook_is_transient_and_its_error_shows_no_query_string() {
        // GIVEN a port nobody listens on, and a key in the URL's query string
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a port").port();
        let webhook =
            sink(serde_json::json!({ "url": format!("http://127.0.0.1:{port}/hook?code=s3cret"), "maxRetries": 0 }));
        let changes = changes();

        // WHEN a batch is delivered
        let err = webhook.deliver(&batch(&changes)).await.expect_err("nobody answers");

        // THEN the failure is transient and neither it nor the description leaks the key
        assert!(matches!(err, SinkError::Transient(_)), "{err:?}");
        assert!(!err.to_string().contains("s3cret"), "{err}");
        assert!(!webhook.describe().contains("s3cret"), "{}", webhook.describe());
        assert!(!format!("{webhook:?}").contains("s3cret"));
    }

    #[test]
    fn the_description_names_scheme_host_and_port_but_neither_credentials_nor_the_path() {
        let webhook = sink(serde_json::json!({ "url": "https://user:pw@hooks.example.com:8443/in/orders?code=k" }));
        assert_eq!(webhook.describe(), "webhook https://hooks.example.com:8443/***");
        // Slack's incoming webhooks carry their key in the path.
        let slack = sink(serde_json::json!({ "url": "https://hooks.slack.com/services/T0/B0/XyZsecret" }));
        assert_eq!(slack.describe(), "webhook https://hooks.slack.com/***");
        let root = sink(serde_json::json!({ "url": "http://127.0.0.1:8080" }));
        assert_eq!(root.describe(), "webhook http://127.0.0.1:8080/");
    }
}
