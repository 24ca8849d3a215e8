//! What status asks of the change-tracking source: how many changes wait after a position, and how long ago
//! the first of them committed. Each is one bounded statement, never on a tick's path.

use super::changes::{self, Read};
use super::tracked::{Tracked, Values};
use crate::source::mssql::catalog::{big, int, one_row};
use crate::source::mssql::position::CtPosition;
use crate::source::mssql::read::Reads;
use crate::source::mssql::sql::After;
use crate::source::{Lag, Position, SourceError};
use std::sync::atomic::{AtomicBool, Ordering};

/// SQL Server's answers to a statement the login lacks a permission for: 229 (an object permission), 297 and
/// 300 (a database permission such as VIEW DATABASE STATE).
const PERMISSION_DENIED: &[u32] = &[229, 297, 300];

/// How many changes wait after `after`: the rest of a walk, or the changes after the base, whose base moves up
/// as a fetch's would to stay inside retention.
pub(super) async fn count_pending(t: &Tracked, after: &Position) -> Result<u64, SourceError> {
    let shape = t.shape().await?;
    let ctx = "counting pending changes";
    match changes::parse(t, after).await? {
        CtPosition::Snapshot { key, .. } => {
            let s = shape.walk_pending(key.is_some());
            let params = t.bind(&s, &Values { after_key: key.as_deref(), ..Default::default() })?;
            let row = one_row(t.pool.query(&s.sql, &params, ctx).await?, ctx)?;
            Ok(big(&row, 0, ctx)?.unwrap_or(0).max(0) as u64)
        }
        CtPosition::Changes { base, last } => {
            let mut base = base;
            for _ in 0..2 {
                let s = shape.pending(if last.is_some() { After::Key } else { After::Start });
                let params = t.bind(&s, &Values { base, after: last.as_ref(), ..Default::default() })?;
                let row = one_row(t.pool.query(&s.sql, &params, ctx).await?, ctx)?;
                let min_valid = big(&row, 0, ctx)?;
                let read = Read { current: Some(0), min_valid, rows: Vec::new() };
                if changes::liveness(t, &read, base)? {
                    return Ok(big(&row, 1, ctx)?.unwrap_or(0).max(0) as u64);
                }
                match &last {
                    Some(l) if min_valid.is_some_and(|m| l.version > m) && base != l.version - 1 => {
                        base = l.version - 1
                    }
                    _ => return Err(changes::lost(t, base, min_valid)),
                }
            }
            Err(changes::lost(t, base, None))
        }
    }
}

/// How long ago the first change after `after` committed, or why that is unknown (said in the log once per
/// process: `reason_logged`).
pub(super) async fn date_oldest_pending(
    t: &Tracked,
    reason_logged: &AtomicBool,
    after: &Position,
) -> Result<Lag, SourceError> {
    let shape = t.shape().await?;
    let ctx = "reading the commit time of the oldest pending change";
    let (base, last) = match changes::parse(t, after).await? {
        CtPosition::Changes { base, last } => (base, last),
        CtPosition::Snapshot { .. } => {
            return Ok(Lag::Unknown(
                "the table is being walked (startFrom snapshot or a resync), and its current rows have no commit time; the lag is known again once the walk is done".into(),
            ))
        }
    };
    let s = shape.oldest(if last.is_some() { After::Key } else { After::Start });
    let params = t.bind(&s, &Values { base, after: last.as_ref(), ..Default::default() })?;
    let reason = match t.pool.query_coded(&s.sql, &params, ctx).await {
        Ok(rows) => {
            let Some(row) = rows.first() else { return Ok(Lag::CaughtUp) };
            if let Some(seconds) = int(row, 1, ctx)? {
                return Ok(Lag::Behind(std::time::Duration::from_secs(seconds.max(0) as u64)));
            }
            let version = big(row, 0, ctx)?.map(|v| v.to_string()).unwrap_or_else(|| "?".into());
            if int(row, 2, ctx)? == Some(1) {
                format!("the commit time of version {version} is no longer in sys.dm_tran_commit_table (change-tracking cleanup removed it); the lag is known again once that change is delivered")
            } else {
                let user = t.user();
                format!("the commit time of version {version} is not visible yet: without VIEW SERVER STATE, which login user {user} lacks, sys.dm_tran_commit_table shows a commit only after the next checkpoint; grant VIEW SERVER STATE (SQL Server, Managed Instance) or add the login to ##MS_ServerStateReader## (Azure SQL Database) for a lag that is always known")
            }
        }
        Err((_, Some(code))) if PERMISSION_DENIED.contains(&code) => {
            let user = t.user();
            format!(
                "reading commit times (sys.dm_tran_commit_table) needs VIEW DATABASE STATE, which login user {user} lacks (SQL Server error {code}); run GRANT VIEW DATABASE STATE TO [{}] for a lag",
                user.replace(']', "]]")
            )
        }
        Err((e, _)) => return Err(e),
    };
    if !reason_logged.swap(true, Ordering::Relaxed) {
        tracing::warn!(table = %t.spec.table, "the lag of this function is unknown: {reason}");
    }
    Ok(Lag::Unknown(reason))
}
