//! HTTP POST of each batch to a webhook, with retries and an idempotency key per batch.
//!
//! Body: `{"function","batch_id","fence","changes":[{"Operation":0,"Item":{...}}]}`. Headers:
//! `Idempotency-Key: {app}/{function}/{batch_id}` (the same on every re-delivery of the batch, so the receiver
//! can drop duplicates) and `X-Sql-Trigger-Fence: {fence}`. A 2xx is an acknowledgement. 408, 429 and 5xx and
//! connection failures are retried with exponential backoff within the attempt budget; any other status is a
//! rejection, which counts toward the poison limit.

use super::{Sink, SinkBatch, SinkError};
use crate::config::{Env, Secret};
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
    /// `{"type":"webhook","url":"%WebhookUrl%","headers":{"Authorization":"%WebhookAuth%"},"timeoutMs":10000,"maxRetries":4}`
    /// (`%Setting%` references are resolved by the configuration loader before this sees them).
    pub fn from_options(options: &Value, _env: &Env) -> Result<Self, String> {
        let url = options.get("url").and_then(Value::as_str).ok_or("webhook needs \"url\"")?;
        let parsed = reqwest::Url::parse(url).map_err(|e| format!("webhook url is not a URL ({e})"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("webhook url must be http or https, not {}", parsed.scheme()));
        }
        // Show scheme, host and path only: a query string may carry a key.
        let display = format!("{}://{}{}", parsed.scheme(), parsed.host_str().unwrap_or(""), parsed.path());
        let timeout = options.get("timeoutMs").and_then(Value::as_u64).unwrap_or(10_000);
        let max_retries = options.get("maxRetries").and_then(Value::as_u64).unwrap_or(4).min(20) as u32;
        let headers = options
            .get("headers")
            .and_then(Value::as_object)
            .map(|h| h.iter().filter_map(|(k, v)| Some((k.clone(), Secret::new(v.as_str()?)))).collect())
            .unwrap_or_default();
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(timeout))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        Ok(Self { url: Secret::new(url), display, client, headers, max_retries })
    }
}

#[async_trait::async_trait]
impl Sink for WebhookSink {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), SinkError> {
        let body = format!(
            "{{\"function\":{},\"batch_id\":{},\"fence\":{},\"changes\":{}}}",
            Value::String(batch.function.to_string()),
            batch.batch_id,
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
