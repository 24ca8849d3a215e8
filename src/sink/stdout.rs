//! JSON lines on standard output: one line per change, `{"function","batch_id","Operation","Item"}`, plus
//! `"Metadata"` when the source was asked for it (`includeMetadata`).
//! Useful for piping into other tools and for looking at a drain; a write to stdout that fails (closed pipe)
//! is a failed delivery, so nothing is acknowledged that nobody read.

use super::{Sink, SinkBatch, SinkError};
use std::io::Write;

#[derive(Debug, Default)]
pub struct StdoutSink;

impl StdoutSink {
    pub fn new() -> Self {
        Self
    }
}

#[async_trait::async_trait]
impl Sink for StdoutSink {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), SinkError> {
        let mut text = String::with_capacity(batch.changes.len() * 128);
        for c in batch.changes {
            let op = c.operation as u8;
            let metadata = c.metadata.as_ref().map_or(String::new(), |m| format!(",\"Metadata\":{}", m.get()));
            text.push_str(&format!(
                "{{\"function\":{},\"batch_id\":{},\"Operation\":{op},\"Item\":{}{metadata}}}\n",
                serde_json::Value::String(batch.function.to_string()),
                batch.range.batch_id,
                c.item.get()
            ));
        }
        tokio::task::spawn_blocking(move || {
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes()).and_then(|()| out.flush())
        })
        .await
        .map_err(|e| SinkError::Transient(format!("stdout writer failed: {e}")))?
        .map_err(|e| SinkError::Transient(format!("cannot write to stdout: {e}")))
    }

    fn describe(&self) -> String {
        "stdout (JSON lines)".into()
    }
}
