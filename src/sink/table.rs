//! What the two SQL sinks share around their dialect: the target, the table's shape cached for [`SCHEMA_TTL`]
//! and dropped when the destination refuses a batch (a table changed since discovery is the usual cause worth
//! a second look), and the [`Sink`] contract itself. A dialect says how to discover a table, write a batch
//! in one transaction and read back what it recorded.

use super::target::Target;
use super::upsert::TableShape;
use super::{Resume, Sink, SinkBatch, SinkError};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// How long a discovered table shape is trusted (the official output binding caches for 10 minutes too).
pub const SCHEMA_TTL: Duration = Duration::from_secs(600);

/// One database's way of doing what a SQL sink does.
#[async_trait::async_trait]
pub trait Dialect: Send + Sync + fmt::Debug + 'static {
    /// `postgres` or `mssql`, for descriptions.
    fn name(&self) -> &'static str;
    /// Reads the table's columns and primary key from the catalog, and creates the fence (and checkpoint)
    /// table when missing.
    async fn discover(&self, target: &Target) -> Result<TableShape, SinkError>;
    /// Applies one batch in one transaction: fence, exactly-once check, rows, checkpoint.
    async fn write(&self, target: &Target, shape: &TableShape, batch: &SinkBatch<'_>) -> Result<(), SinkError>;
    /// What the target recorded for `app`/`function`: its fencing token, and with `exactlyOnce` the last
    /// batch applied. Called after discovery, so the bookkeeping tables exist.
    async fn recorded(&self, target: &Target, app: &str, function: &str) -> Result<Resume, SinkError>;
}

/// A SQL sink: a target table written through a dialect.
#[derive(Debug)]
pub struct TableSink<D> {
    target: Target,
    dialect: D,
    shape: Mutex<Option<(Arc<TableShape>, Instant)>>,
}

impl<D: Dialect> TableSink<D> {
    pub fn new(target: Target, dialect: D) -> Self {
        Self { target, dialect, shape: Mutex::new(None) }
    }

    /// The table's shape, from the cache while it is fresh.
    async fn shape(&self) -> Result<Arc<TableShape>, SinkError> {
        let mut cached = self.shape.lock().await;
        if let Some((shape, at)) = cached.as_ref() {
            if at.elapsed() < SCHEMA_TTL {
                return Ok(shape.clone());
            }
        }
        let shape = Arc::new(self.dialect.discover(&self.target).await?);
        *cached = Some((shape.clone(), Instant::now()));
        Ok(shape)
    }
}

#[async_trait::async_trait]
impl<D: Dialect> Sink for TableSink<D> {
    async fn deliver(&self, batch: &SinkBatch<'_>) -> Result<(), SinkError> {
        let result = match self.shape().await {
            Ok(shape) => self.dialect.write(&self.target, &shape, batch).await,
            Err(e) => Err(e),
        };
        if matches!(result, Err(SinkError::Rejected(_))) {
            *self.shape.lock().await = None;
        }
        result
    }

    fn describe(&self) -> String {
        let mode = if self.exactly_once() { ", exactly once" } else { "" };
        format!("{} {} (app setting {}{mode})", self.dialect.name(), self.target.table, self.target.setting)
    }

    fn exactly_once(&self) -> bool {
        self.target.checkpoint_table.is_some()
    }

    async fn resume_position(&self, app: &str, function: &str) -> Result<Option<Resume>, SinkError> {
        // Discovery first: it creates the bookkeeping tables the statements read.
        self.shape().await?;
        self.dialect.recorded(&self.target, app, function).await.map(Some)
    }
}
