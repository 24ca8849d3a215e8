//! The table as the catalog describes it, checked against the options, and the publication that must publish
//! all of it: [`Catalog`] reads it once per process (and again when the WAL shows the table's columns changed)
//! and hands out its [`Shape`], which every reader, the decoder and the backfill build on.

use super::conn::Conn;
use super::item::{self, Plan};
use super::options::{DeleteItem, Options};
use super::pgoutput::Relation;
use super::sql;
use crate::config::SourceSpec;
use crate::ident::Ident;
use crate::source::SourceError;
use std::sync::{Arc, Mutex};

/// The table as the catalog describes it.
#[derive(Debug)]
pub(super) struct Shape {
    pub oid: u32,
    /// Key columns: a delete's `Item`, and how a left-out TOAST value is read back.
    pub key: Vec<Ident>,
    /// The column names, in table order.
    pub columns: Vec<String>,
    /// Every column, in table order, with its type as the catalog read at start has it (`item::plan`).
    pub catalog: Vec<CatalogColumn>,
    /// The columns of `Item`, in `Item` order.
    pub item_columns: Vec<Ident>,
    /// The same columns with how each reaches `Item` (a backfill's chunk statement projects them alike).
    pub item_renders: Vec<(Ident, sql::Render)>,
    pub items: String,
    /// How the last Relation message said `Item`s are built (logged when it changes).
    pub items_path: Mutex<Option<Result<(), String>>>,
    /// The `TimeZone` of the pooled sessions (read at start): the stream writes times in it.
    pub time_zone: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CatalogColumn {
    pub name: String,
    pub oid: u32,
    pub typmod: i32,
    /// As SQL spells it (`format_type`).
    pub type_name: String,
    /// What a backfill filter's literal for this column is cast to (`sql::COLUMNS`): the type without its
    /// modifier, so the cast keeps the literal as written.
    pub filter_type: String,
}

impl Shape {
    /// The plan for a relation as the WAL describes it, or why its `Item`s are left to the statement. The WAL's
    /// dates and times are ISO in the pooled sessions' time zone whichever reader decoded them: the stream logs in
    /// with that zone, the SQL reader decodes in a pooled session, and both carry the session contract's
    /// `DateStyle` (`db::postgres::session`).
    pub fn plan(&self, r: &Relation) -> Result<Plan, String> {
        let same = r.columns.len() == self.catalog.len()
            && r.columns
                .iter()
                .zip(&self.catalog)
                .all(|(c, k)| c.name == k.name && c.type_oid == k.oid && c.type_modifier == k.typmod);
        if !same {
            return Err("the WAL's columns differ from the catalog's read at start".into());
        }
        let column = |name: &str| -> Result<(String, String, item::Render), String> {
            let k = self
                .catalog
                .iter()
                .find(|k| k.name == name)
                .ok_or_else(|| format!("column {name:?} is not in the WAL"))?;
            let render = item::render_of(k.oid).ok_or_else(|| {
                format!(
                    "column {name:?} is {} (type OID {}), whose JSON the handler does not build",
                    k.type_name, k.oid
                )
            })?;
            Ok((name.to_string(), item::escape_json(name), render))
        };
        let row = self.item_columns.iter().map(|c| column(c.as_str())).collect::<Result<Vec<_>, _>>()?;
        let key = self.key.iter().map(|c| column(c.as_str())).collect::<Result<Vec<_>, _>>()?;
        if let Some((name, _, _)) = key.iter().find(|(_, _, render)| *render == item::Render::Json) {
            return Err(format!("key column {name:?} is json or jsonb"));
        }
        Ok(Plan::new(row, key))
    }
}

/// Owns the table's [`Shape`]: discovered on first use (`validate`, a reader's first read, a backfill's start),
/// cached, and forgotten when a reader sees the WAL's columns differ from it ([`Catalog::forget`]), so the next
/// use reads the catalog again.
#[derive(Debug)]
pub(super) struct Catalog {
    conn: Conn,
    spec: SourceSpec,
    options: Options,
    shape: Mutex<Option<Arc<Shape>>>,
}

impl Catalog {
    pub fn new(conn: Conn, spec: SourceSpec, options: Options) -> Self {
        Self { conn, spec, options, shape: Mutex::new(None) }
    }

    /// The table's shape, discovered when it is not known yet.
    pub async fn shape(&self) -> Result<Arc<Shape>, SourceError> {
        if let Some(shape) = self.shape.lock().expect("shape lock").clone() {
            return Ok(shape);
        }
        let shape = Arc::new(self.discover().await?);
        *self.shape.lock().expect("shape lock") = Some(shape.clone());
        Ok(shape)
    }

    /// A reader saw the table's columns change (a Relation message): the next use reads the catalog again.
    pub fn forget(&self) {
        *self.shape.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Reads the server's settings, the table and the publication, and checks them against the options,
    /// creating the publication when it is missing and the login may.
    async fn discover(&self) -> Result<Shape, SourceError> {
        let client = self.conn.client().await?;
        let table = &self.spec.table;
        let quoted = table.pg();
        let row = client.query_one(sql::WAL_LEVEL, &[]).await.map_err(|e| self.conn.error(e))?;
        let (wal_level, login, replication, version): (String, String, bool, i32) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let time_zone: String = row.get(4);
        if version < 130_000 {
            return Err(SourceError::Invalid(format!(
                "postgres-logical needs PostgreSQL 13 or later (it reads pg_replication_slots.wal_status to tell an invalidated slot), and the server is version {}; use postgres-cursor, or upgrade",
                version / 10_000
            )));
        }
        if wal_level != "logical" {
            return Err(SourceError::Invalid(format!(
                "postgres-logical needs wal_level = logical, and the server runs with {wal_level}. On your own server: ALTER SYSTEM SET wal_level = logical; then restart PostgreSQL. On Azure Database for PostgreSQL flexible server: set the server parameter wal_level to LOGICAL and restart the server (docs/postgres.md). The login {login} also needs the REPLICATION attribute (ALTER ROLE \"{login}\" WITH REPLICATION)"
            )));
        }
        let row = client.query_opt(sql::TABLE, &[&quoted]).await.map_err(|e| self.conn.error(e))?;
        let Some(row) = row else {
            return Err(SourceError::Invalid(format!(
                "table {table} does not exist (or the login cannot see it); check tableName and the search_path"
            )));
        };
        let (oid, identity, schema, name): (u32, String, String, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let rows = client.query(sql::COLUMNS, &[&oid]).await.map_err(|e| self.conn.error(e))?;
        let columns: Vec<(String, String, bool)> = rows.iter().map(|r| (r.get(0), r.get(1), r.get(2))).collect();
        let catalog: Vec<CatalogColumn> = rows
            .iter()
            .map(|r| CatalogColumn {
                name: r.get(0),
                type_name: r.get(1),
                oid: r.get(3),
                typmod: r.get(4),
                filter_type: r.get(5),
            })
            .collect();
        let key = self.key(&client, oid, &columns).await?;
        self.check_identity(&client, oid, &identity, &key).await?;
        let wanted = crate::source::item_column_names(&self.spec, columns.iter().map(|(n, _, _)| n.as_str()))?;
        let mut item_columns = Vec::new();
        for c in &wanted {
            let (_, typname, _) = columns.iter().find(|(n, _, _)| n == c.as_str()).ok_or_else(|| {
                SourceError::Invalid(format!(
                    "column {:?} is not a column of {table}; column names are case-sensitive",
                    c.as_str()
                ))
            })?;
            let json = columns.iter().any(|(n, _, json)| n == c.as_str() && *json);
            let render = match typname.as_str() {
                "bytea" => sql::Render::Base64,
                ty if json => sql::Render::Json(ty.to_string()),
                _ => sql::Render::Plain,
            };
            item_columns.push((c.clone(), render));
        }
        // What else the login lacks, said with the publication's refusal so an operator fixes it all at once.
        let also = (!replication).then(|| {
            format!(
                ". The login {login} also lacks the REPLICATION attribute that reading a slot needs: ALTER ROLE \"{login}\" WITH REPLICATION (or have such a user create the slot: SELECT pg_create_logical_replication_slot('{}', 'pgoutput'))",
                self.options.slot
            )
        });
        let also = also.as_deref().unwrap_or_default();
        self.check_publication(&client, [&quoted, &schema, &name], &columns, also, version >= 150_000).await?;
        Ok(Shape {
            oid,
            items: sql::items(&quoted, &key, &item_columns),
            item_renders: item_columns,
            key,
            columns: columns.into_iter().map(|(n, _, _)| n).collect(),
            catalog,
            item_columns: wanted,
            items_path: Mutex::new(None),
            time_zone,
        })
    }

    /// The key: `primaryKey`, else the table's primary key; each of its columns must be a column of the table.
    async fn key(
        &self,
        client: &deadpool_postgres::Client,
        oid: u32,
        columns: &[(String, String, bool)],
    ) -> Result<Vec<Ident>, SourceError> {
        let table = &self.spec.table;
        let quoted = table.pg();
        let has = |c: &Ident| columns.iter().any(|(n, _, _)| n == c.as_str());
        let key: Vec<Ident> = match &self.spec.primary_key {
            Some(k) => k.clone(),
            None => {
                let names: Vec<String> = client
                    .query(sql::PRIMARY_KEY, &[&oid])
                    .await
                    .map_err(|e| self.conn.error(e))?
                    .iter()
                    .map(|r| r.get(0))
                    .collect();
                if names.is_empty() {
                    return Err(SourceError::Invalid(format!(
                        "table {table} has no primary key; add one, or name a unique, non-null key in primaryKey (and ALTER TABLE {quoted} REPLICA IDENTITY FULL, so the WAL carries it for deletes)"
                    )));
                }
                names.iter().map(|n| Ident::new(n).map_err(SourceError::Invalid)).collect::<Result<_, _>>()?
            }
        };
        for k in &key {
            if !has(k) {
                return Err(SourceError::Invalid(format!(
                    "primary key column {:?} is not a column of {table}; column names are case-sensitive",
                    k.as_str()
                )));
            }
        }
        Ok(key)
    }

    /// The replica identity (`identity`, as `pg_class.relreplident` spells it) must make the WAL carry the key
    /// of every delete, and the whole old row for `deleteItem: row`.
    async fn check_identity(
        &self,
        client: &deadpool_postgres::Client,
        oid: u32,
        identity: &str,
        key: &[Ident],
    ) -> Result<(), SourceError> {
        let table = &self.spec.table;
        let quoted = table.pg();
        // The WAL carries the old row's replica identity only; a delete's Item is built from it.
        let full = format!("ALTER TABLE {quoted} REPLICA IDENTITY FULL");
        match identity {
            "n" => {
                return Err(SourceError::Invalid(format!(
                    "table {table} has REPLICA IDENTITY NOTHING: PostgreSQL refuses updates and deletes on it once it is published, and a delete would carry no key. Run ALTER TABLE {quoted} REPLICA IDENTITY DEFAULT (the primary key) or {full}"
                )))
            }
            "d" if self.spec.primary_key.is_some() => {
                return Err(SourceError::Invalid(format!(
                    "primaryKey is set for {table}, but with REPLICA IDENTITY DEFAULT a delete carries only the table's primary key. Remove primaryKey, or run {full}"
                )))
            }
            "i" => {
                let index: Vec<String> =
                    client.query(sql::IDENTITY_INDEX, &[&oid]).await.map_err(|e| self.conn.error(e))?.iter().map(|r| r.get(0)).collect();
                if let Some(k) = key.iter().find(|k| !index.iter().any(|c| c == k.as_str())) {
                    return Err(SourceError::Invalid(format!(
                        "the replica identity index of {table} does not hold key column {:?}, so a delete would not carry it; set primaryKey to the index's columns ({}) or run {full}",
                        k.as_str(),
                        index.join(", ")
                    )));
                }
            }
            _ => {}
        }
        if self.options.delete_item == DeleteItem::Row && identity != "f" {
            return Err(SourceError::Invalid(format!(
                "deleteItem row needs the whole old row in the WAL, which PostgreSQL writes only with REPLICA IDENTITY FULL: run {full}, or use deleteItem key"
            )));
        }
        Ok(())
    }

    /// The publication must publish every operation of the table (`quoted`, in `schema` as `name`), every row
    /// and every column; created when missing and the login may. `also` is appended to a refusal; `filters`:
    /// the server has row filters and column lists (PostgreSQL 15 and later).
    async fn check_publication(
        &self,
        client: &deadpool_postgres::Client,
        [quoted, schema, name]: [&str; 3],
        columns: &[(String, String, bool)],
        also: &str,
        filters: bool,
    ) -> Result<(), SourceError> {
        let publication = &self.options.publication;
        let create = format!("CREATE PUBLICATION {publication} FOR TABLE {quoted}");
        let row = client.query_opt(sql::PUBLICATION, &[publication]).await.map_err(|e| self.conn.error(e))?;
        let Some(row) = row else {
            return match client.batch_execute(&create).await {
                Ok(()) => {
                    tracing::info!(publication = %publication, table = %self.spec.table, "created publication {publication}");
                    Ok(())
                }
                Err(e) if e.code().is_some_and(|c| c.code() == "42501") => Err(SourceError::Invalid(format!(
                    "publication {publication} does not exist, and this login may not create it ({}). Have the table's owner run: {create}{also}",
                    e.as_db_error().map_or(String::new(), |d| d.message().to_string())
                ))),
                Err(e) => Err(self.conn.error(e)),
            };
        };
        let publishes: [bool; 4] = [row.get(0), row.get(1), row.get(2), row.get(3)];
        if publishes.contains(&false) {
            return Err(SourceError::Invalid(format!(
                "publication {publication} does not publish every operation (insert, update, delete, truncate), so some changes would never reach this function: ALTER PUBLICATION {publication} SET (publish = 'insert, update, delete, truncate')"
            )));
        }
        // Row filters and column lists exist from PostgreSQL 15; before, a published table is published whole.
        let statement = if filters { sql::PUBLISHED } else { sql::PUBLISHED_WHOLE };
        let published =
            client.query_opt(statement, &[publication, &schema, &name]).await.map_err(|e| self.conn.error(e))?;
        let Some(published) = published else {
            return Err(SourceError::Invalid(format!(
                "publication {publication} does not include {}: ALTER PUBLICATION {publication} ADD TABLE {quoted}",
                self.spec.table
            )));
        };
        let (unfiltered, attnames): (bool, Option<Vec<String>>) = (published.get(0), published.get(1));
        let attnames = attnames.unwrap_or_else(|| columns.iter().map(|(c, _, _)| c.clone()).collect());
        if !unfiltered {
            return Err(SourceError::Invalid(format!(
                "publication {publication} filters the rows of {} (a WHERE clause), so changes to other rows would never arrive; publish the table without a row filter",
                self.spec.table
            )));
        }
        if let Some((missing, _, _)) = columns.iter().find(|(c, _, _)| !attnames.contains(c)) {
            return Err(SourceError::Invalid(format!(
                "publication {publication} publishes only some columns of {} ({missing:?} is left out); publish the table without a column list",
                self.spec.table
            )));
        }
        Ok(())
    }
}
