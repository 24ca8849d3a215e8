//! The cursor source's way to its database: the pool it takes connections from, a failed statement in the
//! source's words, and `EXPLAIN` of a statement in a transaction that is rolled back. Every other file of the
//! source reads through a [`Connection`]; nothing here knows the table's shape.

use crate::config::SourceSpec;
use crate::db::postgres::shared_pool;
use crate::db::postgres::{classify, connect_failure, ConnectFailure, PostgresTls, Verdict};
use crate::ident::TableName;
use crate::source::SourceError;
use deadpool_postgres::Pool;
use tokio_postgres::types::ToSql;

/// The pool of one cursor source, and the names its failures are worded with. Built without connecting: the
/// pool opens connections on first use. Owned by `PostgresCursor`, lent to discovery, backfill, the index
/// advice and the position order.
#[derive(Debug)]
pub(super) struct Connection {
    setting: String,
    table: TableName,
    pool: Pool,
}

impl Connection {
    pub fn new(spec: &SourceSpec, tls: &PostgresTls) -> Result<Self, SourceError> {
        let pool = shared_pool(&spec.connection_setting, &spec.connection, tls).map_err(SourceError::Invalid)?;
        Ok(Self { setting: spec.connection_setting.clone(), table: spec.table.clone(), pool })
    }

    /// The table the source reads, as its failures name it.
    pub fn table(&self) -> &TableName {
        &self.table
    }

    /// A failed statement of this source, in its words ([`db_error`]).
    pub fn error(&self, e: tokio_postgres::Error) -> SourceError {
        db_error(e, &self.table)
    }

    /// A pooled connection. A certificate that is not trusted or `sslmode=require` against a server without
    /// TLS needs an operator (`Invalid`); anything else may pass on the next tick.
    pub async fn client(&self) -> Result<deadpool_postgres::Client, SourceError> {
        self.pool.get().await.map_err(|e| match connect_failure(&self.setting, &e) {
            ConnectFailure::Misconfigured(m) => SourceError::Invalid(m),
            ConnectFailure::Unavailable(m) => SourceError::Unavailable(m),
        })
    }

    /// `EXPLAIN (FORMAT JSON)` of `statement` with `params`, in a transaction that is rolled back;
    /// `discourage_seqscan` sets `enable_seqscan = off` for it, so the planner shows whether any index serves.
    pub async fn explain(
        &self,
        statement: &str,
        params: &[&(dyn ToSql + Sync)],
        discourage_seqscan: bool,
    ) -> Result<serde_json::Value, SourceError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(|e| self.error(e))?;
        if discourage_seqscan {
            tx.batch_execute("SET LOCAL enable_seqscan = off").await.map_err(|e| self.error(e))?;
        }
        let row =
            tx.query_one(&format!("EXPLAIN (FORMAT JSON) {statement}"), params).await.map_err(|e| self.error(e))?;
        // Read-only: nothing to keep, and the rollback also ends the SET LOCAL.
        let _ = tx.rollback().await;
        let JsonText(text) = row.get(0);
        serde_json::from_str(&text)
            .map_err(|e| SourceError::Unavailable(format!("PostgreSQL returned a plan that is not JSON: {e}")))
    }
}

/// A `json` value as its text (`EXPLAIN (FORMAT JSON)` answers in type json, whose wire form is its text).
struct JsonText(String);

impl<'a> tokio_postgres::types::FromSql<'a> for JsonText {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Self(std::str::from_utf8(raw)?.to_string()))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        matches!(*ty, tokio_postgres::types::Type::JSON | tokio_postgres::types::Type::TEXT)
    }
}

/// A failed statement in the source's words: what waiting fixes is `Unavailable`, the rest says what to change.
pub(super) fn db_error(e: tokio_postgres::Error, table: &TableName) -> SourceError {
    let Some(db) = e.as_db_error() else {
        return SourceError::Unavailable(format!("PostgreSQL connection failed: {e}"));
    };
    let code = db.code().code();
    let msg = db.message();
    match classify(Some(code)) {
        Verdict::Transient => SourceError::Unavailable(format!("PostgreSQL: {msg} (SQLSTATE {code})")),
        Verdict::Denied => {
            SourceError::Invalid(format!("PostgreSQL: {msg}; grant the login SELECT on {table} (SQLSTATE {code})"))
        }
        Verdict::BadValue | Verdict::Refused => {
            SourceError::Invalid(format!("PostgreSQL: {msg} (SQLSTATE {code}) while reading {table}"))
        }
    }
}
