//! The sources' statements over the shared pool, with a failure in the sources' words: what waiting fixes is
//! `Unavailable` (the tick fails and the next one tries again), the rest is `Invalid` with what to change.

use crate::db::mssql::{describe, Failed, Param, Pool};
use crate::source::SourceError;
use tiberius::Row;

/// The source side of [`Pool`]: every statement a source sends is a single read.
pub(super) trait Reads {
    /// A parameterized statement (`sp_executesql`).
    async fn query(&self, sql: &str, params: &[Param], context: &str) -> Result<Vec<Row>, SourceError>;
    /// [`Self::query`], with SQL Server's error number beside a failure the server reported (for callers that
    /// take one refusal, a missing permission, as an answer).
    async fn query_coded(
        &self,
        sql: &str,
        params: &[Param],
        context: &str,
    ) -> Result<Vec<Row>, (SourceError, Option<u32>)>;
    /// A statement without parameters, sent as a plain batch.
    async fn batch(&self, sql: &str, context: &str) -> Result<Vec<Row>, SourceError>;
}

impl Reads for Pool {
    async fn query(&self, sql: &str, params: &[Param], context: &str) -> Result<Vec<Row>, SourceError> {
        self.execute(sql, params, context).await.map_err(|f| worded(self, &f, context))
    }

    async fn query_coded(
        &self,
        sql: &str,
        params: &[Param],
        context: &str,
    ) -> Result<Vec<Row>, (SourceError, Option<u32>)> {
        self.execute(sql, params, context).await.map_err(|f| (worded(self, &f, context), f.code()))
    }

    async fn batch(&self, sql: &str, context: &str) -> Result<Vec<Row>, SourceError> {
        self.execute_batch(sql, context).await.map_err(|f| worded(self, &f, context))
    }
}

fn worded(pool: &Pool, failed: &Failed, context: &str) -> SourceError {
    let message = describe(&failed.failure, pool.setting(), context);
    if failed.transient {
        SourceError::Unavailable(message)
    } else {
        SourceError::Invalid(message)
    }
}
