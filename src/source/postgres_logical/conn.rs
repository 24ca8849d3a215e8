//! The pooled connections every part of the logical source runs its statements on, and how a failed statement
//! is worded. One [`Conn`] is built by the source and cloned into the catalog, the slot, the stream, the
//! backfill and the batch builder: each asks it for a client and words its database errors through it.

use crate::db::postgres::{classify, connect_failure, ConnectFailure, Verdict};
use crate::ident::TableName;
use crate::source::SourceError;
use deadpool_postgres::Pool;

/// The source's connection pool, with what its errors name: the app setting, the table and the slot.
#[derive(Debug, Clone)]
pub(super) struct Conn {
    pool: Pool,
    setting: String,
    table: TableName,
    slot: String,
}

impl Conn {
    pub fn new(pool: Pool, setting: String, table: TableName, slot: String) -> Self {
        Self { pool, setting, table, slot }
    }

    /// A pooled client; a failure to connect in the source's words.
    pub async fn client(&self) -> Result<deadpool_postgres::Client, SourceError> {
        self.pool.get().await.map_err(|e| match connect_failure(&self.setting, &e) {
            ConnectFailure::Misconfigured(m) => SourceError::Invalid(m),
            ConnectFailure::Unavailable(m) => SourceError::Unavailable(m),
        })
    }

    /// A failed statement in the source's words: what waiting fixes is `Unavailable`, the rest says what to
    /// change.
    pub fn error(&self, e: tokio_postgres::Error) -> SourceError {
        let (table, slot) = (&self.table, &self.slot);
        let Some(db) = e.as_db_error() else {
            return SourceError::Unavailable(format!("PostgreSQL connection failed: {e}"));
        };
        let code = db.code().code();
        let msg = db.message();
        let detail = db.detail().map_or(String::new(), |d| format!(" ({d})"));
        match classify(Some(code)) {
            Verdict::Transient if code == "55006" => SourceError::Unavailable(format!(
                "PostgreSQL: {msg} (SQLSTATE {code}): another session is reading replication slot {slot} (another instance's status, or a consumer that shares the slot, which must not happen); the next tick tries again"
            )),
            Verdict::Transient => SourceError::Unavailable(format!("PostgreSQL: {msg} (SQLSTATE {code})")),
            Verdict::Denied => SourceError::Invalid(format!(
                "PostgreSQL: {msg} (SQLSTATE {code}); the login needs SELECT on {table} and the REPLICATION attribute (ALTER ROLE <login> WITH REPLICATION)"
            )),
            Verdict::BadValue | Verdict::Refused => {
                SourceError::Invalid(format!("PostgreSQL: {msg}{detail} (SQLSTATE {code}) while reading {table} through slot {slot}"))
            }
        }
    }
}
