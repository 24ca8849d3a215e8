//! What status asks of the change-tracking source: how many changes wait after a position, and how long ago
//! the first of them committed. Each is one bounded statement, never on a tick's path.

use super::{MssqlChangeTracking, Read, Values, PERMISSION_DENIED};
use crate::source::mssql::catalog::{big, int, one_row};
use crate::source::mssql::position::CtPosition;
use crate::source::mssql::read::Reads;
use crate::source::mssql::sql::After;
use crate::source::{Lag, Position, SourceError};
use std::sync::atomic::Ordering;

impl MssqlChangeTracking {
    pub(super) async fn count_pending(&self, after: &Position) -> Result<u64, SourceError> {
        let shape = self.shape().await?;
        let ctx = "counting pending changes";
        match self.parse(after).await? {
            CtPosition::Snapshot { key, .. } => {
                let s = shape.walk_pending(key.is_some());
                let params = self.bind(&s, &Values { after_key: key.as_deref(), ..Default::default() })?;
                let row = one_row(self.pool.query(&s.sql, &params, ctx).await?, ctx)?;
                Ok(big(&row, 0, ctx)?.unwrap_or(0).max(0) as u64)
            }
            CtPosition::Changes { base, last } => {
                let mut base = base;
                for _ in 0..2 {
                    let s = shape.pending(if last.is_some() { After::Key } else { After::Start });
                    let params = self.bind(&s, &Values { base, after: last.as_ref(), ..Default::default() })?;
                    let row = one_row(self.pool.query(&s.sql, &params, ctx).await?, ctx)?;
                    let min_valid = big(&row, 0, ctx)?;
                    let read = Read { current: Some(0), min_valid, rows: Vec::new() };
                    if self.liveness(&read, base)? {
                        return Ok(big(&row, 1, ctx)?.unwrap_or(0).max(0) as u64);
                    }
                    match &last {
                        Some(l) if min_valid.is_some_and(|m| l.version > m) && base != l.version - 1 => {
                            base = l.version - 1
                        }
                        _ => return Err(self.lost(base, min_valid)),
                    }
                }
                Err(self.lost(base, None))
            }
        }
    }

    pub(super) async fn date_oldest_pending(&self, after: &Position) -> Result<Lag, SourceError> {
        let shape = self.shape().await?;
        let ctx = "reading the commit time of the oldest pending change";
        let (base, last) = match self.parse(after).await? {
            CtPosition::Changes { base, last } => (base, last),
            CtPosition::Snapshot { .. } => {
                return Ok(Lag::Unknown(
                    "the table is being walked (startFrom snapshot or a resync), and its current rows have no commit time; the lag is known again once the walk is done".into(),
                ))
            }
        };
        let s = shape.oldest(if last.is_some() { After::Key } else { After::Start });
        let params = self.bind(&s, &Values { base, after: last.as_ref(), ..Default::default() })?;
        let reason = match self.pool.query_coded(&s.sql, &params, ctx).await {
            Ok(rows) => {
                let Some(row) = rows.first() else { return Ok(Lag::CaughtUp) };
                if let Some(seconds) = int(row, 1, ctx)? {
                    return Ok(Lag::Behind(std::time::Duration::from_secs(seconds.max(0) as u64)));
                }
                let version = big(row, 0, ctx)?.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
                if int(row, 2, ctx)? == Some(1) {
                    format!("the commit time of version {version} is no longer in sys.dm_tran_commit_table (change-tracking cleanup removed it); the lag is known again once that change is delivered")
                } else {
                    let user = self
                        .discovered
                        .get()
                        .map(|(_, db, _)| db.user.clone())
                        .unwrap_or_else(|| "the login user".into());
                    format!("the commit time of version {version} is not visible yet: without VIEW SERVER STATE, which login user {user} lacks, sys.dm_tran_commit_table shows a commit only after the next checkpoint; grant VIEW SERVER STATE (SQL Server, Managed Instance) or add the login to ##MS_ServerStateReader## (Azure SQL Database) for a lag that is always known")
                }
            }
            Err((_, Some(code))) if PERMISSION_DENIED.contains(&code) => {
                let user =
                    self.discovered.get().map(|(_, db, _)| db.user.clone()).unwrap_or_else(|| "the login user".into());
                format!(
                    "reading commit times (sys.dm_tran_commit_table) needs VIEW DATABASE STATE, which login user {user} lacks (SQL Server error {code}); run GRANT VIEW DATABASE STATE TO [{}] for a lag",
                    user.replace(']', "]]")
                )
            }
            Err((e, _)) => return Err(e),
        };
        if !self.lag_reason_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(table = %self.spec.table, "the lag of this function is unknown: {reason}");
        }
        Ok(Lag::Unknown(reason))
    }
}
