//! The table a change-tracking source reads, as that source holds it: its configuration, the pool, and what
//! discovery found on first use (the table's shape, the database's facts, every column). Every other file of the
//! source reads through a [`Tracked`]; it knows no position and no retention rule.

use crate::config::SourceSpec;
use crate::db::mssql::{Param, Pool, Settings};
use crate::source::mssql::catalog;
use crate::source::mssql::options::Options;
use crate::source::mssql::position::Last;
use crate::source::mssql::schema::{self, ColumnFacts, DatabaseFacts};
use crate::source::mssql::sql::{CtShape, Slot, Statement};
use crate::source::SourceError;
use tokio::sync::OnceCell;

/// What discovery found: the table's shape, the database's facts, and every column of the table (a backfill's
/// filter is checked against them).
pub(super) type Discovered = (CtShape, DatabaseFacts, Vec<ColumnFacts>);

/// The table, its options and its pool; discovered once, on first use. Owned by `MssqlChangeTracking`, lent to
/// the change reads, the walk, status and the backfill.
#[derive(Debug)]
pub(super) struct Tracked {
    pub spec: SourceSpec,
    pub options: Options,
    pub pool: Pool,
    discovered: OnceCell<Discovered>,
}

/// Values for a statement's parameter slots.
#[derive(Debug, Default)]
pub(super) struct Values<'a> {
    pub base: i64,
    pub after: Option<&'a Last>,
    pub after_key: Option<&'a [String]>,
    pub upto_version: Option<i64>,
    pub upto_key: Option<&'a [String]>,
    pub limit: i64,
}

impl Tracked {
    /// Parses the connection string; connects on first use.
    pub fn new(spec: SourceSpec, options: Options) -> Result<Self, SourceError> {
        let settings = Settings::parse(&spec.connection_setting, &spec.connection).map_err(SourceError::Invalid)?;
        Ok(Self { spec, options, pool: Pool::new(settings), discovered: OnceCell::new() })
    }

    pub async fn shape(&self) -> Result<&CtShape, SourceError> {
        Ok(&self.facts().await?.0)
    }

    pub async fn facts(&self) -> Result<&Discovered, SourceError> {
        self.discovered.get_or_try_init(|| self.discover()).await
    }

    async fn discover(&self) -> Result<Discovered, SourceError> {
        let db = catalog::database(&self.pool).await?;
        let table = &self.spec.table;
        // A database without change tracking fails here, before the table checks need it.
        schema::change_tracking_database(&self.spec, &db, self.options.include_metadata)?;
        let facts = catalog::table(&self.pool, table).await?;
        schema::change_tracking_table(&self.spec, &db, &facts, self.options.include_metadata)?;
        let columns = catalog::columns(&self.pool, table).await?;
        let shape = schema::change_tracking_shape(
            &self.spec,
            &db,
            &facts,
            &columns,
            self.options.skip_context.is_some(),
            self.options.include_metadata,
        )?;
        tracing::info!(
            table = %table,
            isolation = if shape.snapshot { "snapshot" } else { "read committed" },
            retention = %db.retention_text(),
            partition = %self.spec.partition.map(|p| p.to_string()).unwrap_or_else(|| "all keys".into()),
            "sql server change tracking source ready"
        );
        Ok((shape, db, columns))
    }

    pub fn table_text(&self) -> String {
        self.spec.table.to_string()
    }

    /// The database's quoted name for messages, once discovered.
    pub fn db_name(&self) -> String {
        self.discovered.get().map(|(_, db, _)| db.quoted_name()).unwrap_or_else(|| "[database]".into())
    }

    /// The database's retention for messages, once discovered (empty before).
    pub fn retention_text(&self) -> String {
        self.discovered.get().map(|(_, db, _)| db.retention_text()).unwrap_or_default()
    }

    /// The login's database user for messages, once discovered.
    pub fn user(&self) -> String {
        self.discovered.get().map(|(_, db, _)| db.user.clone()).unwrap_or_else(|| "the login user".into())
    }

    /// The parameters of `s` in its slots' order, from `v` and the source's own values.
    pub fn bind(&self, s: &Statement, v: &Values) -> Result<Vec<Param>, SourceError> {
        let missing =
            |what: &str| SourceError::Invalid(format!("internal error: statement parameter {what} has no value"));
        s.slots
            .iter()
            .map(|slot| {
                Ok(match slot {
                    Slot::Table => Param::Text(self.spec.table.mssql()),
                    Slot::Base => Param::Int(v.base),
                    Slot::AfterVersion => {
                        Param::Int(v.after.map(|l| l.version).ok_or_else(|| missing("after version"))?)
                    }
                    Slot::AfterKey(i) => Param::Text(
                        v.after_key
                            .or(v.after.map(|l| l.key.as_slice()))
                            .and_then(|k| k.get(*i))
                            .cloned()
                            .ok_or_else(|| missing("after key"))?,
                    ),
                    Slot::UptoVersion => Param::Int(v.upto_version.ok_or_else(|| missing("upto version"))?),
                    Slot::UptoKey(i) => {
                        Param::Text(v.upto_key.and_then(|k| k.get(*i)).cloned().ok_or_else(|| missing("upto key"))?)
                    }
                    Slot::Context => Param::Bytes(self.options.skip_context.clone().ok_or_else(|| missing("context"))?),
                    Slot::Limit => Param::Int(v.limit),
                    Slot::PartitionIndex => {
                        Param::Int(self.spec.partition.map(|p| i64::from(p.index)).ok_or_else(|| missing("partition"))?)
                    }
                    Slot::PartitionCount => Param::Int(
                        self.spec.partition.map(|p| i64::from(p.count.get())).ok_or_else(|| missing("partitions"))?,
                    ),
                    Slot::PartitionColumnName | Slot::VersionColumnName | Slot::Bound | Slot::Filter(_) => {
                        return Err(missing("of another statement"))
                    }
                })
            })
            .collect()
    }
}
