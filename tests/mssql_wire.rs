//! Tier 2: the SQL Server sources against a TDS server on the wire (`mssql-mock-tds`), through a strict tap.
//!
//! What this proves: tiberius connects and logs in, the sources send exactly the reviewed golden statements
//! (`tests/golden/mssql/*.sql`), as parameterized RPCs (`sp_executesql`) with exactly as many values as the
//! golden file names, or as plain batches, and decode realistic result shapes (bigint versions, int codes,
//! NULLs, nvarchar and nvarchar(max) split across PLP chunks) into the official payload. What it cannot prove:
//! T-SQL semantics (the mock has no engine); that is tier 3, `tests/mssql_real.rs`.
//!
//! The mock alone answers a statement nobody registered with an empty result, and matches a parameterized
//! statement by finding a registered upper-case text inside the request. So every connection goes through a
//! tap that reads each request the client sends, compares its statement with the registered golden texts
//! exactly (case and all), and hands the mock a one-line batch naming the registered answer instead. A
//! statement nobody registered is answered with an error and fails the test when the mock is dropped; so
//! does a registered statement that no request used (the test would not prove what it registers), and an RPC
//! whose values do not match the golden file's parameter list. `every_golden_statement_is_registered_by_a_test`
//! checks that each golden file is registered somewhere here; with the two checks above, every statement is
//! sent by a source, over the wire, in some test. The tap also refuses a connection whose first request is not
//! the session batch (`tests/golden/mssql_session/session.sql`): every connection pins its session first.

use mssql_mock_tds::{
    ColumnDefinition as Col, ColumnValue as V, MockTdsServer, QueryResponse, Row, SqlDataType as T, TerminalError,
};
use serde_json::{json, Value};
use sql_pseudo_trigger::change::encode_batch;
use sql_pseudo_trigger::clock::ManualClock;
use sql_pseudo_trigger::config::{AppConfig, Env, Partition, Secret, SourceKind, SourceOptions, SourceSpec};
use sql_pseudo_trigger::engine::{OutcomeKind, Trigger};
use sql_pseudo_trigger::ident::Ident;
use sql_pseudo_trigger::protocol::{Attempt, RetryContext};
use sql_pseudo_trigger::source::mssql::{MssqlChangeTracking, MssqlRowversion};
use sql_pseudo_trigger::source::{Lag, Source, SourceError, StartFrom};
use sql_pseudo_trigger::state::MemoryStore;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

#[path = "mssql_wire/backfill.rs"]
mod backfill;
#[path = "mssql_wire/session.rs"]
mod session;
mod tds_reader;
use tds_reader::{decode_rpc_after_headers, Reader, Wire};

fn golden_path(name: &str) -> String {
    format!("{}/tests/golden/mssql/{name}.sql", env!("CARGO_MANIFEST_DIR"))
}

/// A golden statement's text (the comment line naming the parameters dropped).
fn golden(name: &str) -> String {
    let path = golden_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines().filter(|l| !l.starts_with("--")).collect::<Vec<_>>().join("\n")
}

/// How many parameters a golden statement binds, from its comment line (`-- @P1 = Table, @P2 = Limit`).
fn golden_parameters(name: &str) -> usize {
    let path = golden_path(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines().next().map_or(0, |l| l.matches("@P").count())
}

// ---------------------------------------------------------------------------------------------------------------
// The tap: reads every request, answers only registered golden statements
// ---------------------------------------------------------------------------------------------------------------

/// TDS message types (MS-TDS 2.2.3.1.1).
const SQL_BATCH: u8 = 0x01;
const RPC: u8 = 0x03;
/// `sp_executesql`'s well-known procedure id (MS-TDS 2.2.6.6).
const SP_EXECUTESQL: u16 = 10;
/// The one-line batch the mock answers for a statement nobody registered: an error naming the tap.
const UNREGISTERED: &str = "-- UNREGISTERED STATEMENT";

/// A request the tap saw: which golden statement, and the values bound to `@P1`, `@P2`, ...
#[derive(Debug, Clone)]
struct Sent {
    name: String,
    values: Vec<Wire>,
}

fn utf16(bytes: &[u8]) -> String {
    Reader(bytes).utf16(bytes.len())
}

/// The length of the ALL_HEADERS block every request starts with.
fn all_headers_len(payload: &[u8]) -> usize {
    u32::from_le_bytes(payload[..4].try_into().expect("ALL_HEADERS length")) as usize
}

/// Decodes an RPC request as tiberius encodes `sp_executesql`: the procedure id and its parameters' values in order.
fn decode_rpc(payload: &[u8]) -> Result<(u16, Vec<Wire>), String> {
    let (proc_id, params) = decode_rpc_after_headers(Reader(&payload[all_headers_len(payload)..]))?;
    Ok((proc_id, params.into_iter().map(|(_, value)| value).collect()))
}

/// What the tap knows: the registered statements, what was sent, and what nobody registered.
#[derive(Debug, Default)]
struct Ledger {
    /// Exact statement text -> golden name.
    registered: HashMap<String, String>,
    /// Golden name -> how many requests used it.
    served: HashMap<String, usize>,
    sent: Vec<Sent>,
    /// Statements nobody registered, and requests that did not fit their golden file.
    refused: Vec<String>,
    /// Connections the tap accepted, and how many of them opened with the session batch.
    connections: usize,
    sessions: usize,
}

impl Ledger {
    /// The batch the mock is handed for the first request of a connection: the session batch itself (the mock
    /// answers a batch nobody registered with no result set, as SQL Server answers `SET`s), or a refusal.
    fn open(&mut self, kind: u8, payload: &[u8]) -> String {
        let session = tds_reader::session_batch();
        match request(kind, payload) {
            Ok((statement, _)) if kind == SQL_BATCH && statement == session => {
                self.sessions += 1;
                session
            }
            Ok((statement, _)) => {
                self.refuse(format!("a connection whose first request was not the session batch: {statement}"))
            }
            Err(why) => self.refuse(why),
        }
    }

    /// The batch the mock is handed for one request (the request's ALL_HEADERS, then a one-line text).
    fn answer(&mut self, kind: u8, payload: &[u8]) -> String {
        let (statement, values) = match request(kind, payload) {
            Ok(request) => request,
            Err(why) => return self.refuse(why),
        };
        let Some(name) = self.registered.get(&statement).cloned() else {
            return self.refuse(format!("a statement nobody registered: {statement}"));
        };
        let expected = golden_parameters(&name);
        if (kind == RPC && values.len() != expected) || (kind == SQL_BATCH && expected != 0) {
            return self.refuse(format!("{name} sent with {} values; its golden file names {expected}", values.len()));
        }
        *self.served.entry(name.clone()).or_default() += 1;
        self.sent.push(Sent { name: name.clone(), values });
        key(&name)
    }

    fn refuse(&mut self, why: String) -> String {
        eprintln!("mssql wire tap: {why}");
        self.refused.push(why);
        UNREGISTERED.into()
    }
}

/// A request's statement and the values bound to `@P1`, `@P2`, ... (none for a plain batch).
fn request(kind: u8, payload: &[u8]) -> Result<(String, Vec<Wire>), String> {
    match kind {
        SQL_BATCH => Ok((utf16(&payload[all_headers_len(payload)..]), Vec::new())),
        _ => match decode_rpc(payload) {
            Ok((SP_EXECUTESQL, mut params)) if params.len() >= 2 => {
                let values = params.split_off(2);
                match &params[0] {
                    Wire::Text(statement) => Ok((statement.clone(), values)),
                    other => Err(format!("sp_executesql with a statement of {other:?}")),
                }
            }
            Ok((proc_id, _)) => Err(format!("an RPC to procedure {proc_id}, not sp_executesql")),
            Err(why) => Err(format!("an RPC the tap cannot read: {why}")),
        },
    }
}

/// The text under which the mock holds a golden statement's answer.
fn key(name: &str) -> String {
    format!("-- GOLDEN {name}")
}

/// Forwards one client connection to the mock, rewriting each SQL batch and RPC into the batch the ledger
/// chose. Messages the client splits across packets are joined first (the mock answers every packet).
async fn pipe(client: TcpStream, upstream: u16, ledger: Arc<Mutex<Ledger>>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else { return };
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });
    ledger.lock().expect("tap ledger").connections += 1;
    // Whether this connection sent its first request yet: that one must be the session batch.
    let mut opened = false;
    let mut first: Option<[u8; 8]> = None;
    let mut message = Vec::new();
    loop {
        let mut header = [0u8; 8];
        if from_client.read_exact(&mut header).await.is_err() {
            return;
        }
        let length = usize::from(u16::from_be_bytes([header[2], header[3]]));
        let mut body = vec![0u8; length - 8];
        if from_client.read_exact(&mut body).await.is_err() {
            return;
        }
        message.extend_from_slice(&body);
        let head = *first.get_or_insert(header);
        if header[1] & 0x01 == 0 {
            continue;
        }
        let (kind, payload) = match head[0] {
            kind @ (SQL_BATCH | RPC) => {
                let text = {
                    let mut ledger = ledger.lock().expect("tap ledger");
                    if opened {
                        ledger.answer(kind, &message)
                    } else {
                        ledger.open(kind, &message)
                    }
                };
                opened = true;
                let mut payload = message[..all_headers_len(&message)].to_vec();
                payload.extend(text.encode_utf16().flat_map(u16::to_le_bytes));
                (SQL_BATCH, payload)
            }
            other => (other, std::mem::take(&mut message)),
        };
        let total = u16::try_from(8 + payload.len()).expect("a message the tap forwards fits one packet");
        let mut packet = vec![kind, head[1] | 0x01];
        packet.extend_from_slice(&total.to_be_bytes());
        packet.extend_from_slice(&head[4..8]);
        packet.extend_from_slice(&payload);
        if to_server.write_all(&packet).await.is_err() {
            return;
        }
        first = None;
        message.clear();
    }
}

/// A running mock server behind the strict tap; dropped, it shuts down and checks what the tap saw.
struct Mock {
    /// The tap's port: what the sources connect to.
    port: u16,
    registry: Arc<tokio::sync::Mutex<mssql_mock_tds::QueryRegistry>>,
    ledger: Arc<Mutex<Ledger>>,
    _stop: oneshot::Sender<()>,
}

impl Mock {
    async fn start() -> Self {
        let server = MockTdsServer::new("127.0.0.1:0").await.expect("mock server binds");
        let upstream = server.local_addr().port();
        let registry = server.query_registry();
        registry.lock().await.register(
            UNREGISTERED,
            QueryResponse::error_only(TerminalError::new(
                50000,
                16,
                "statement not registered with the wire test's mock (see the test's stderr)",
            )),
        );
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(async move {
            let _ = server.run_with_shutdown(stopped).await;
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("tap binds");
        let port = listener.local_addr().expect("tap address").port();
        let ledger: Arc<Mutex<Ledger>> = Arc::default();
        let shared = ledger.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(pipe(client, upstream, shared.clone()));
            }
        });
        Self { port, registry, ledger, _stop: stop }
    }

    fn connection_string(&self, extra: &str) -> String {
        format!("Server=tcp:127.0.0.1,{};Database=appdb;User ID=func;Password=not-a-real-secret;Encrypt=DANGER_PLAINTEXT;Connect Timeout=5;{extra}", self.port)
    }

    /// Registers the answer to a golden statement (again: replaces the answer).
    async fn register(&mut self, name: &str, response: QueryResponse) {
        self.ledger.lock().expect("tap ledger").registered.insert(golden(name), name.to_string());
        self.registry.lock().await.register(key(name), response);
    }

    /// Every request so far that used golden statement `name`, in order.
    fn sent(&self, name: &str) -> Vec<Sent> {
        self.ledger.lock().expect("tap ledger").sent.iter().filter(|s| s.name == name).cloned().collect()
    }

    /// The values bound to the last request that used golden statement `name`.
    fn values(&self, name: &str) -> Vec<Wire> {
        self.sent(name).pop().unwrap_or_else(|| panic!("{name} was never sent")).values
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let ledger = self.ledger.lock().expect("tap ledger");
        assert!(ledger.refused.is_empty(), "the tap refused requests:\n{}", ledger.refused.join("\n"));
        let mut unused: Vec<&String> =
            ledger.registered.values().filter(|name| !ledger.served.contains_key(*name)).collect();
        unused.sort();
        assert!(unused.is_empty(), "registered but never sent (the test does not prove them): {unused:?}");
    }
}

#[test]
fn every_golden_statement_is_registered_by_a_test() {
    let this = [include_str!("mssql_wire.rs"), include_str!("mssql_wire/backfill.rs")].concat();
    let dir = format!("{}/tests/golden/mssql", env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("golden dir").flatten() {
        let file = entry.file_name().to_string_lossy().into_owned();
        if let Some(stem) = file.strip_suffix(".sql") {
            if !this.contains(&format!("\"{stem}\"")) {
                missing.push(stem.to_string());
            }
        }
    }
    missing.sort();
    assert!(missing.is_empty(), "golden statements no wire test sends: {missing:?}");
}

fn nvarchar_max(s: &str) -> V {
    // Two PLP chunks, so the reader has to join them.
    let units: Vec<u16> = s.encode_utf16().collect();
    let mid = units.len() / 2;
    if mid == 0 {
        return V::NVarCharMax(vec![units]);
    }
    V::NVarCharMax(vec![units[..mid].to_vec(), units[mid..].to_vec()])
}

fn spec(mock: &Mock, kind: SourceKind, table: &str, options: Value, extra: &str) -> SourceSpec {
    let mut sqltrigger =
        json!({ "source": kind.as_str(), "tableName": table, "connectionStringSetting": "SqlConnectionString" });
    sqltrigger.as_object_mut().expect("an object").extend(options.as_object().cloned().unwrap_or_default());
    let env = Env::from_pairs([("SqlConnectionString".to_string(), mock.connection_string(extra))]);
    SourceSpec::from_json(&sqltrigger, &env).expect("a valid sqltrigger.json")
}

fn database(ct_version: Option<i64>) -> QueryResponse {
    database_with(ct_version, true)
}

/// The database facts, with SNAPSHOT isolation allowed or not (READ COMMITTED reads).
fn database_with(ct_version: Option<i64>, snapshot: bool) -> QueryResponse {
    QueryResponse::new(
        vec![
            Col::new("COMPAT", T::Int),
            Col::new("SNAPSHOT_STATE", T::Int),
            Col::new("RCSI", T::Int),
            Col::new("CT_VERSION", T::BigInt),
            Col::new("RETENTION", T::Int),
            Col::new("RETENTION_UNITS", T::Int),
            Col::new("DB", T::NVarChar),
            Col::new("LOGIN_USER", T::NVarChar),
        ],
        vec![Row::new(vec![
            V::Int(160),
            V::Int(i32::from(snapshot)),
            V::Int(1),
            ct_version.map(V::BigInt).unwrap_or(V::Null),
            V::Int(2),
            V::Int(3),
            V::NVarChar("appdb".into()),
            V::NVarChar("func".into()),
        ])],
    )
}

fn table(min_valid: Option<i64>, can_view_ct: bool) -> QueryResponse {
    QueryResponse::new(
        vec![
            Col::new("ID", T::Int),
            Col::new("IS_TABLE", T::Int),
            Col::new("CAN_SELECT", T::Int),
            Col::new("CAN_VIEW_CT", T::Int),
            Col::new("MINV", T::BigInt),
        ],
        vec![Row::new(vec![
            V::Int(901_578_250),
            V::Int(1),
            V::Int(1),
            V::Int(i32::from(can_view_ct)),
            min_valid.map(V::BigInt).unwrap_or(V::Null),
        ])],
    )
}

fn int_or_null(v: Option<i32>) -> V {
    v.map(V::Int).unwrap_or(V::Null)
}

/// `(name, type, len, prec, scale, datetime precision, column id, pk ordinal)`.
type ColumnRow = (&'static str, &'static str, Option<i32>, Option<i32>, Option<i32>, Option<i32>, i32, Option<i32>);

/// The catalog's columns. `COLL` is what a server would report: a collation for character columns only;
/// `varchar` columns here are Greek (another code page than the database's, as defect 4 of issue 15 needs).
/// It is sent as nvarchar(max): the mock writes a NULL only for that string type (the server's is sysname).
fn columns(rows: &[ColumnRow]) -> QueryResponse {
    let collation = |ty: &str| match ty {
        "char" | "varchar" => nvarchar_max("Greek_100_CI_AS"),
        "nchar" | "nvarchar" => nvarchar_max("SQL_Latin1_General_CP1_CI_AS"),
        _ => V::NVarCharMaxNull,
    };
    QueryResponse::new(
        vec![
            Col::new("NAME", T::NVarChar),
            Col::new("TYPE", T::NVarChar),
            Col::new("LEN", T::Int),
            Col::new("PREC", T::Int),
            Col::new("SCALE", T::Int),
            Col::new("DT_PREC", T::Int),
            Col::new("COLUMN_ID", T::Int),
            Col::new("PK_ORDINAL", T::Int),
            Col::new("COLL", T::NVarCharMax),
        ],
        rows.iter()
            .map(|(n, t, len, p, s, dt, id, pk)| {
                Row::new(vec![
                    V::NVarChar((*n).into()),
                    V::NVarChar((*t).into()),
                    int_or_null(*len),
                    int_or_null(*p),
                    int_or_null(*s),
                    int_or_null(*dt),
                    V::Int(*id),
                    int_or_null(*pk),
                    collation(t),
                ])
            })
            .collect(),
    )
}

/// `[DBO].[ORDERS]`: int key, nvarchar, decimal, varbinary(max), datetime2 (the golden `orders` shape).
const ORDERS: &[ColumnRow] = &[
    ("ID", "int", None, Some(10), Some(0), None, 1, Some(1)),
    ("NAME", "nvarchar", Some(100), None, None, None, 2, None),
    ("PRICE", "decimal", None, Some(18), Some(2), None, 3, None),
    ("PHOTO", "varbinary", Some(-1), None, None, None, 4, None),
    ("CREATED_AT", "datetime2", None, None, None, Some(7), 5, None),
];

/// `[Sales Ünïcode].[Order]] Lines]`: a composite key (bigint, nvarchar) with a space, `№` and `]` in the names,
/// a column left out of Item (the golden `order_lines` shape, read under READ COMMITTED).
const ORDER_LINES: &[ColumnRow] = &[
    ("Order Id", "bigint", None, Some(19), Some(0), None, 1, Some(1)),
    ("Line №", "nvarchar", Some(20), None, None, None, 2, Some(2)),
    ("Note", "nvarchar", Some(-1), None, None, None, 3, None),
    ("Qty", "int", None, Some(10), Some(0), None, 4, None),
];

/// The change-tracking source on the order lines with every option: context filter ("MYAPP"), metadata,
/// column selection. Its catalog must be registered with `database_with(.., false)` and `ORDER_LINES`.
fn order_lines_source(mock: &Mock) -> MssqlChangeTracking {
    new_change_tracking(spec(
        mock,
        SourceKind::MssqlChangeTracking,
        "[Sales Ünïcode].[Order]] Lines]",
        json!({"skipOwnChangesContext": "0x4D59415050", "includeMetadata": true, "columns": ["Order Id", "Line №", "Qty"]}),
        "",
    ))
    .expect("source builds")
}

async fn order_lines_catalog(mock: &mut Mock) {
    mock.register("catalog_database", database_with(Some(42), false)).await;
    mock.register("catalog_table", table(Some(10), true)).await;
    mock.register("catalog_columns", columns(ORDER_LINES)).await;
}

fn versions(min_valid: i64, current: i64) -> QueryResponse {
    QueryResponse::new(
        vec![Col::new("MINV", T::BigInt), Col::new("CUR", T::BigInt)],
        vec![Row::new(vec![V::BigInt(min_valid), V::BigInt(current)])],
    )
}

/// One change row as the fetch returns it: version, operation, item JSON, key text, creation version, mask.
type ChangeRow<'a> = (i64, i32, &'a str, &'a str, Option<i64>, Option<&'a str>);

/// A change read: `(version, op, item json, key text)` rows under one version row.
fn changes(current: i64, min_valid: i64, rows: &[(i64, i32, &str, &str)]) -> QueryResponse {
    let rows: Vec<ChangeRow<'_>> = rows.iter().map(|(v, o, i, k)| (*v, *o, *i, *k, None, None)).collect();
    changes_with_metadata(current, min_valid, &rows)
}

/// A change read whose rows also carry `CREATED` and `MASK`.
fn changes_with_metadata(current: i64, min_valid: i64, rows: &[ChangeRow<'_>]) -> QueryResponse {
    let cols = vec![
        Col::new("CUR", T::BigInt),
        Col::new("MINV", T::BigInt),
        Col::new("VER", T::BigInt),
        Col::new("OP", T::Int),
        Col::new("ITEM", T::NVarCharMax),
        Col::new("CREATED", T::BigInt),
        Col::new("MASK", T::NVarCharMax),
        Col::new("K1", T::NVarCharMax),
    ];
    let head = |rest: Vec<V>| Row::new([vec![V::BigInt(current), V::BigInt(min_valid)], rest].concat());
    let rows = if rows.is_empty() {
        vec![head(vec![V::Null, V::Null, V::NVarCharMaxNull, V::Null, V::NVarCharMaxNull, V::NVarCharMaxNull])]
    } else {
        rows.iter()
            .map(|(ver, op, item, key, created, mask)| {
                head(vec![
                    V::BigInt(*ver),
                    V::Int(*op),
                    nvarchar_max(item),
                    created.map(V::BigInt).unwrap_or(V::Null),
                    mask.map(nvarchar_max).unwrap_or(V::NVarCharMaxNull),
                    nvarchar_max(key),
                ])
            })
            .collect()
    };
    QueryResponse::new(cols, rows)
}

/// One change row of a two-column key: version, operation, item json, key texts, changed-column mask.
type ChangeRow2<'a> = (i64, i32, &'a str, [&'a str; 2], Option<&'a str>);

/// A change read of a two-column key.
fn changes2(current: i64, min_valid: i64, rows: &[ChangeRow2<'_>]) -> QueryResponse {
    let mut cols = vec![
        Col::new("CUR", T::BigInt),
        Col::new("MINV", T::BigInt),
        Col::new("VER", T::BigInt),
        Col::new("OP", T::Int),
        Col::new("ITEM", T::NVarCharMax),
        Col::new("CREATED", T::BigInt),
        Col::new("MASK", T::NVarCharMax),
    ];
    cols.extend([Col::new("K1", T::NVarCharMax), Col::new("K2", T::NVarCharMax)]);
    let rows = rows
        .iter()
        .map(|(ver, op, item, key, mask)| {
            Row::new(vec![
                V::BigInt(current),
                V::BigInt(min_valid),
                V::BigInt(*ver),
                V::Int(*op),
                nvarchar_max(item),
                V::BigInt(*ver),
                mask.map(nvarchar_max).unwrap_or(V::NVarCharMaxNull),
                nvarchar_max(key[0]),
                nvarchar_max(key[1]),
            ])
        })
        .collect();
    QueryResponse::new(cols, rows)
}

/// A walk of a two-column key: `(item json, [key texts])` rows.
fn walk2(rows: &[(&str, [&str; 2])]) -> QueryResponse {
    QueryResponse::new(
        vec![
            Col::new("OP", T::Int),
            Col::new("ITEM", T::NVarCharMax),
            Col::new("K1", T::NVarCharMax),
            Col::new("K2", T::NVarCharMax),
        ],
        rows.iter()
            .map(|(item, key)| {
                Row::new(vec![V::Int(0), nvarchar_max(item), nvarchar_max(key[0]), nvarchar_max(key[1])])
            })
            .collect(),
    )
}

/// A walk of current rows: `(item json, key text)` rows, every one an insert.
fn walk(rows: &[(&str, &str)]) -> QueryResponse {
    QueryResponse::new(
        vec![Col::new("OP", T::Int), Col::new("ITEM", T::NVarCharMax), Col::new("K1", T::NVarCharMax)],
        rows.iter().map(|(item, key)| Row::new(vec![V::Int(0), nvarchar_max(item), nvarchar_max(key)])).collect(),
    )
}

const INSERTED: &str =
    r#"{"ID":1,"NAME":"Zoë ✓","PRICE":12.50,"PHOTO":"AQID/w==","CREATED_AT":"2026-11-20T10:15:30.1234567"}"#;
const NULLS: &str = r#"{"ID":2,"NAME":null,"PRICE":null,"PHOTO":null,"CREATED_AT":null}"#;
const DELETED: &str = r#"{"ID":3}"#;

async fn catalog(mock: &mut Mock) {
    mock.register("catalog_database", database(Some(42))).await;
    mock.register("catalog_table", table(Some(10), true)).await;
    mock.register("catalog_columns", columns(ORDERS)).await;
}

fn ct_source(mock: &Mock, options: Value) -> MssqlChangeTracking {
    new_change_tracking(spec(mock, SourceKind::MssqlChangeTracking, "[DBO].[ORDERS]", options, "ConnectRetryCount=1"))
        .expect("source builds")
}

#[tokio::test]
async fn a_first_fetch_reads_the_catalog_then_delivers_the_official_payload() {
    // GIVEN a tracked table whose changes are an insert, an update to all-NULL values and a delete
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register(
        "ct_fetch_start",
        changes(42, 10, &[(11, 0, INSERTED, "1"), (12, 1, NULLS, "2"), (13, 2, DELETED, "3")]),
    )
    .await;
    let source = ct_source(&mock, json!({}));

    // WHEN it validates, starts at the earliest position and fetches
    source.validate().await.expect("the catalog checks pass");
    let start = source.start_position(StartFrom::Earliest).await.expect("start position");
    let fetched = source.fetch(&start, 100).await.expect("fetch");

    // THEN the batch is the official shape, and a short batch moves the base to the version read
    assert_eq!(start, json!({"phase": "changes", "base": 10}));
    assert_eq!(
        encode_batch(&fetched.changes).get(),
        format!(
            r#"[{{"Operation":0,"Item":{INSERTED}}},{{"Operation":1,"Item":{NULLS}}},{{"Operation":2,"Item":{DELETED}}}]"#
        )
    );
    assert_eq!(fetched.last, Some(json!({"phase": "changes", "base": 42})));
}

#[tokio::test]
async fn a_full_batch_ends_at_its_last_version_and_key_and_the_next_fetch_seeks_past_it() {
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register("ct_fetch_start", changes(42, 10, &[(11, 0, INSERTED, "1"), (11, 1, NULLS, "2")])).await;
    mock.register("ct_fetch_after_key", changes(42, 10, &[(11, 2, DELETED, "3")])).await;
    let source = ct_source(&mock, json!({}));

    let start = source.start_position(StartFrom::Earliest).await.expect("start");
    let first = source.fetch(&start, 2).await.expect("first batch");
    // One transaction (version 11) larger than the batch: the position splits it by key.
    let last = first.last.expect("a position");
    assert_eq!(last, json!({"phase": "changes", "base": 10, "last": {"version": 11, "key": ["2"]}}));
    let second = source.fetch(&last, 2).await.expect("second batch");
    assert_eq!(encode_batch(&second.changes).get(), format!(r#"[{{"Operation":2,"Item":{DELETED}}}]"#));
    assert_eq!(second.last, Some(json!({"phase": "changes", "base": 42})));
}

#[tokio::test]
async fn a_base_below_the_minimum_valid_version_is_refused_unless_resync_is_asked_for() {
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_fetch_start", changes(90, 50, &[(60, 1, NULLS, "2")])).await;
    let stored = json!({"phase": "changes", "base": 10});

    let err = ct_source(&mock, json!({})).fetch(&stored, 100).await.expect_err("lost");
    let SourceError::PositionLost(message) = err else { panic!("expected PositionLost, got {err:?}") };
    assert!(message.starts_with("change tracking for DBO.ORDERS no longer holds the changes after version 10 (the minimum valid version is 50; retention is 2 DAYS)"), "{message}");
    assert!(message.contains("\"onPositionLost\": \"resync\""), "{message}");

    mock.register(
        "ct_walk_first",
        QueryResponse::new(
            vec![Col::new("OP", T::Int), Col::new("ITEM", T::NVarCharMax), Col::new("K1", T::NVarCharMax)],
            vec![Row::new(vec![V::Int(0), nvarchar_max(INSERTED), nvarchar_max("1")])],
        ),
    )
    .await;
    let resynced = ct_source(&mock, json!({"onPositionLost": "resync"})).fetch(&stored, 100).await.expect("resync");
    assert_eq!(encode_batch(&resynced.changes).get(), format!(r#"[{{"Operation":0,"Item":{INSERTED}}}]"#));
    assert_eq!(resynced.last, Some(json!({"phase": "changes", "base": 90})));
}

#[tokio::test]
async fn a_resync_that_finds_the_table_empty_replaces_the_lost_position_instead_of_walking_every_tick() {
    // GIVEN a stored base (10) that retention has passed (minimum valid 50), on a table that is now empty
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_fetch_start", changes(90, 50, &[])).await;
    mock.register("ct_walk_first", walk(&[])).await;
    let stored = json!({"phase": "changes", "base": 10});
    let source = ct_source(&mock, json!({"onPositionLost": "resync"}));

    // WHEN two ticks fetch from the stored position (the engine records the advance only now and then)
    let first = source.fetch(&stored, 100).await.expect("resync");
    let second = source.fetch(&stored, 100).await.expect("after the resync");

    // THEN the first walks once and offers the version read before the walk as the new position; the second
    // reads changes after that version and walks no more (issue 15, defect 12)
    assert!(first.changes.is_empty() && first.last.is_none());
    assert_eq!(first.advance, Some(json!({"phase": "changes", "base": 90})));
    assert!(second.changes.is_empty());
    assert_eq!(mock.sent("ct_walk_first").len(), 1, "the walk is not repeated");
    let bases: Vec<Wire> = mock.sent("ct_fetch_start").iter().map(|s| s.values[2].clone()).collect();
    assert_eq!(bases, vec![Wire::Int(10), Wire::Int(90)]);
}

#[tokio::test]
async fn a_batch_in_flight_is_read_again_up_to_its_recorded_end_from_each_kind_of_position() {
    // GIVEN batches recorded from a base or a key, ending at a drained version or inside a version
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_refetch_start_to_version", changes(60, 10, &[(11, 0, INSERTED, "1")])).await;
    mock.register("ct_refetch_start_to_key", changes(60, 10, &[(11, 0, INSERTED, "1")])).await;
    mock.register("ct_refetch_key_to_version", changes(60, 10, &[(13, 2, DELETED, "3")])).await;
    mock.register("ct_refetch_key_to_key", changes(60, 10, &[(12, 1, NULLS, "2")])).await;
    let source = ct_source(&mock, json!({}));
    let base = json!({"phase": "changes", "base": 10});
    let at_key =
        |version: i64, key: &str| json!({"phase": "changes", "base": 10, "last": {"version": version, "key": [key]}});

    // WHEN each is read again
    let a = source.refetch(&base, &json!({"phase": "changes", "base": 42}), 100).await.expect("base to version");
    let b = source.refetch(&base, &at_key(11, "1"), 100).await.expect("base to key");
    let c =
        source.refetch(&at_key(11, "1"), &json!({"phase": "changes", "base": 42}), 100).await.expect("key to version");
    let d = source.refetch(&at_key(11, "1"), &at_key(12, "2"), 100).await.expect("key to key");

    // THEN each returns its rows and keeps the recorded end, and the bounds go over the wire as parameters
    assert_eq!(encode_batch(&a.changes).get(), format!(r#"[{{"Operation":0,"Item":{INSERTED}}}]"#));
    assert_eq!(b.last, Some(at_key(11, "1")));
    assert_eq!(encode_batch(&c.changes).get(), format!(r#"[{{"Operation":2,"Item":{DELETED}}}]"#));
    assert_eq!(encode_batch(&d.changes).get(), format!(r#"[{{"Operation":1,"Item":{NULLS}}}]"#));
    let table = Wire::Text("[DBO].[ORDERS]".into());
    assert_eq!(
        mock.values("ct_refetch_start_to_version"),
        vec![table.clone(), Wire::Int(100), Wire::Int(10), Wire::Int(42)]
    );
    assert_eq!(
        mock.values("ct_refetch_key_to_key"),
        vec![
            table,
            Wire::Int(100),
            Wire::Int(10),
            Wire::Int(11),
            Wire::Text("1".into()),
            Wire::Int(12),
            Wire::Text("2".into())
        ]
    );
}

#[tokio::test]
async fn pending_counts_from_a_base_or_a_key_and_from_a_walk() {
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    let minv_pending = |n: i64| {
        QueryResponse::new(
            vec![Col::new("MINV", T::BigInt), Col::new("PENDING", T::BigInt)],
            vec![Row::new(vec![V::BigInt(10), V::BigInt(n)])],
        )
    };
    mock.register("ct_pending_start", minv_pending(5)).await;
    mock.register("ct_pending_after_key", minv_pending(4)).await;
    mock.register("ct_walk_pending_first", count(300)).await;
    mock.register("ct_walk_pending_after", count(200)).await;
    let source = ct_source(&mock, json!({}));

    assert_eq!(source.pending(&json!({"phase": "changes", "base": 10})).await.expect("pending"), 5);
    let after = json!({"phase": "changes", "base": 10, "last": {"version": 11, "key": ["1"]}});
    assert_eq!(source.pending(&after).await.expect("pending"), 4);
    assert_eq!(source.pending(&json!({"phase": "snapshot", "base": 42})).await.expect("pending"), 300);
    assert_eq!(source.pending(&json!({"phase": "snapshot", "base": 42, "key": ["100"]})).await.expect("pending"), 200);
    assert_eq!(mock.values("ct_walk_pending_after"), vec![Wire::Text("100".into())]);
}

#[tokio::test]
async fn a_walk_recorded_before_backfills_existed_walks_on_in_key_order_then_follows_the_changes_made_since() {
    // GIVEN a function whose state was written in the walk phase (startFrom: snapshot before it became a
    // backfill, or a resync), at the version read before its walk began
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_walk_first", walk(&[(INSERTED, "1"), (NULLS, "2")])).await;
    mock.register("ct_walk_after", walk(&[(DELETED, "3")])).await;
    mock.register("ct_fetch_start", changes(50, 10, &[(45, 1, NULLS, "2")])).await;
    mock.register("ct_walk_upto", walk(&[(INSERTED, "1"), (NULLS, "2")])).await;
    mock.register("ct_walk_range", walk(&[(DELETED, "3")])).await;
    let source = ct_source(&mock, json!({}));

    // WHEN it walks on in pages of two, and follows on
    let start = json!({"phase": "snapshot", "base": 42});
    let first = source.fetch(&start, 2).await.expect("walk");
    let first_end = first.last.clone().expect("a position");
    let second = source.fetch(&first_end, 2).await.expect("walk ends");
    let third = source.fetch(&second.last.clone().expect("a position"), 2).await.expect("changes");

    // THEN every current row is an Insert, the walk ends at the version read before it, and the change made
    // during the walk follows
    assert_eq!(first_end, json!({"phase": "snapshot", "base": 42, "key": ["2"]}));
    assert_eq!(encode_batch(&second.changes).get(), format!(r#"[{{"Operation":0,"Item":{DELETED}}}]"#));
    assert_eq!(second.last, Some(json!({"phase": "changes", "base": 42})));
    assert_eq!(encode_batch(&third.changes).get(), format!(r#"[{{"Operation":1,"Item":{NULLS}}}]"#));
    assert_eq!(mock.values("ct_fetch_start")[2], Wire::Int(42));

    // AND the walk's batches are read again up to their recorded ends (a resync's first batch, and a later one)
    let resync = source.refetch(&json!({"phase": "changes", "base": 10}), &first_end, 2).await.expect("resync batch");
    assert_eq!(resync.changes.len(), 2);
    let later = source.refetch(&first_end, &json!({"phase": "snapshot", "base": 42, "key": ["3"]}), 2).await;
    assert_eq!(
        encode_batch(&later.expect("walk range").changes).get(),
        format!(r#"[{{"Operation":0,"Item":{DELETED}}}]"#)
    );
    assert_eq!(mock.values("ct_walk_range"), vec![Wire::Int(2), Wire::Text("2".into()), Wire::Text("3".into())]);
}

#[tokio::test]
async fn every_option_at_once_travels_as_the_reviewed_statements_under_read_committed() {
    // GIVEN the order lines: composite key with odd names, column selection, context filter, metadata
    let mut mock = Mock::start().await;
    order_lines_catalog(&mut mock).await;
    let line = r#"{"Order Id":7,"Line №":"b","Qty":3}"#;
    mock.register("ct_options_fetch_after_key", changes2(60, 10, &[(12, 1, line, ["7", "b"], Some("001"))])).await;
    mock.register("ct_options_refetch_key_to_key", changes2(60, 10, &[(12, 1, line, ["7", "b"], Some("001"))])).await;
    mock.register(
        "ct_options_pending_after_key",
        QueryResponse::new(
            vec![Col::new("MINV", T::BigInt), Col::new("PENDING", T::BigInt)],
            vec![Row::new(vec![V::BigInt(10), V::BigInt(1)])],
        ),
    )
    .await;
    mock.register("ct_options_walk_range", walk2(&[(line, ["7", "b"])])).await;
    let source = order_lines_source(&mock);
    let after = json!({"phase": "changes", "base": 10, "last": {"version": 11, "key": ["7", "a"]}});
    let upto = json!({"phase": "changes", "base": 10, "last": {"version": 12, "key": ["7", "b"]}});

    // WHEN it fetches, re-reads, counts and re-walks
    let fetched = source.fetch(&after, 1).await.expect("fetch");
    let again = source.refetch(&after, &upto, 1).await.expect("refetch");
    let pending = source.pending(&after).await.expect("pending");
    let walked = source
        .refetch(
            &json!({"phase": "snapshot", "base": 42, "key": ["7", "a"]}),
            &json!({"phase": "snapshot", "base": 42, "key": ["7", "b"]}),
            1,
        )
        .await
        .expect("walk range");

    // THEN the batch names its changed column, the context travels as varbinary, the key as two texts
    let expected = format!(
        r#"[{{"Operation":1,"Item":{line},"Metadata":{{"Version":12,"CreationVersion":12,"ChangedColumns":["Qty"]}}}}]"#
    );
    assert_eq!(encode_batch(&fetched.changes).get(), expected);
    assert_eq!(fetched.last, Some(upto.clone()));
    assert_eq!(encode_batch(&again.changes).get(), expected);
    assert_eq!(pending, 1);
    assert_eq!(walked.changes.len(), 1);
    assert_eq!(
        mock.values("ct_options_fetch_after_key"),
        vec![
            Wire::Text("[Sales Ünïcode].[Order]] Lines]".into()),
            Wire::Int(1),
            Wire::Int(10),
            Wire::Int(11),
            Wire::Text("7".into()),
            Wire::Text("a".into()),
            Wire::Bytes(b"MYAPP".to_vec()),
        ]
    );
}

#[tokio::test]
async fn a_hostile_table_and_key_name_are_quoted_in_the_statement_the_server_receives() {
    // GIVEN a table named `x]; DROP TABLE y;--` keyed by `id]; --` (a uniqueidentifier) with a date column
    let mut mock = Mock::start().await;
    mock.register("catalog_database", database(Some(42))).await;
    mock.register("catalog_table", table(Some(10), true)).await;
    mock.register(
        "catalog_columns",
        columns(&[
            ("id]; --", "uniqueidentifier", None, None, None, None, 1, Some(1)),
            ("v", "date", None, None, None, Some(0), 2, None),
        ]),
    )
    .await;
    let guid = "0f8fad5b-d9cb-469f-a165-70867728950e";
    let item = format!(r#"{{"id]; --":"{guid}","v":"2026-01-02T00:00:00"}}"#);
    mock.register("ct_hostile_fetch_after_key", changes(60, 10, &[(12, 0, &item, &guid.to_uppercase())])).await;
    let source =
        new_change_tracking(spec(&mock, SourceKind::MssqlChangeTracking, "[x]]; DROP TABLE y;--]", json!({}), ""))
            .expect("source builds");
    let after = json!({"phase": "changes", "base": 10, "last": {"version": 11, "key": [guid.to_uppercase()]}});

    // WHEN it fetches THEN the reviewed, quoted statement was what the server received, and the row decodes
    let fetched = source.fetch(&after, 1).await.expect("fetch");
    assert_eq!(encode_batch(&fetched.changes).get(), format!(r#"[{{"Operation":0,"Item":{item}}}]"#));
    assert_eq!(mock.values("ct_hostile_fetch_after_key")[0], Wire::Text("[x]]; DROP TABLE y;--]".into()));
}

#[tokio::test]
async fn metadata_and_the_context_filter_travel_as_one_statement_with_a_varbinary_parameter() {
    // GIVEN a source that skips its own context and asks for metadata
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register(
        "ct_meta_fetch_start",
        changes_with_metadata(
            42,
            10,
            &[(12, 1, NULLS, "2", Some(5), Some("01000")), (13, 0, INSERTED, "1", Some(13), None)],
        ),
    )
    .await;
    let source = ct_source(&mock, json!({"skipOwnChangesContext": "0x4D59415050", "includeMetadata": true}));

    // WHEN it fetches
    let start = source.start_position(StartFrom::Earliest).await.expect("start");
    let fetched = source.fetch(&start, 100).await.expect("fetch");

    // THEN the update names its changed column and the insert has none
    assert_eq!(
        encode_batch(&fetched.changes).get(),
        format!(
            r#"[{{"Operation":1,"Item":{NULLS},"Metadata":{{"Version":12,"CreationVersion":5,"ChangedColumns":["NAME"]}}}},{{"Operation":0,"Item":{INSERTED},"Metadata":{{"Version":13,"CreationVersion":13}}}}]"#
        )
    );
}

#[tokio::test]
async fn validation_errors_arrive_over_the_wire_with_the_statement_to_run() {
    let mut mock = Mock::start().await;
    mock.register("catalog_database", database(None)).await;
    let err = ct_source(&mock, json!({})).validate().await.expect_err("database tracking off").to_string();
    assert!(
        err.starts_with(
            "change tracking is not enabled on database [appdb]: run ALTER DATABASE [appdb] SET CHANGE_TRACKING = ON"
        ),
        "{err}"
    );

    let mut mock = Mock::start().await;
    mock.register("catalog_database", database(Some(42))).await;
    mock.register("catalog_table", table(None, true)).await;
    mock.register("catalog_columns", columns(ORDERS)).await;
    let err = ct_source(&mock, json!({})).validate().await.expect_err("table tracking off").to_string();
    assert_eq!(
        err,
        "change tracking is not enabled on table DBO.ORDERS: run ALTER TABLE [DBO].[ORDERS] ENABLE CHANGE_TRACKING"
    );

    let mut mock = Mock::start().await;
    mock.register("catalog_database", database(Some(42))).await;
    mock.register("catalog_table", table(Some(1), false)).await;
    let err = ct_source(&mock, json!({})).validate().await.expect_err("no permission").to_string();
    assert_eq!(err, "login user [func] may not read the changes of DBO.ORDERS: run GRANT VIEW CHANGE TRACKING ON [DBO].[ORDERS] TO [func]");
}

#[tokio::test]
async fn an_empty_catalog_answer_fails_validation_instead_of_passing_it() {
    // GIVEN a server that answers the database read with its columns and no row
    let mut mock = Mock::start().await;
    let columns = database(Some(42)).columns;
    mock.register("catalog_database", QueryResponse::new(columns, Vec::new())).await;

    // WHEN the source validates THEN it refuses the answer rather than reading defaults into it
    let err = ct_source(&mock, json!({})).validate().await.expect_err("an empty answer is not a catalog").to_string();
    assert_eq!(err, "unexpected answer from SQL Server while reading the database settings: expected one row, got 0");
}

#[tokio::test]
async fn a_statement_nobody_registered_is_refused_by_the_tap_and_fails_the_test() {
    // GIVEN a mock with nothing registered
    let mock = Mock::start().await;

    // WHEN a source sends its first statement
    let err = ct_source(&mock, json!({})).validate().await.expect_err("refused").to_string();

    // THEN the tap answered with an error instead of an empty result, and recorded the statement, so dropping
    // the mock would fail the test
    assert!(err.starts_with("SQL Server error 50000 while reading the database settings"), "{err}");
    let refused = std::mem::take(&mut mock.ledger.lock().expect("ledger").refused);
    assert_eq!(refused, vec![format!("a statement nobody registered: {}", golden("catalog_database"))]);
}

#[tokio::test]
async fn transient_server_errors_are_unavailable_and_others_invalid_both_at_once() {
    let mut mock = Mock::start().await;
    mock.register(
        "catalog_database",
        QueryResponse::error_only(TerminalError::new(
            40613,
            16,
            "Database 'appdb' on server 'x' is not currently available.",
        )),
    )
    .await;
    let err = ct_source(&mock, json!({})).validate().await.expect_err("unavailable");
    let SourceError::Unavailable(message) = err else { panic!("expected Unavailable, got {err:?}") };
    assert_eq!(
        message,
        "SQL Server error 40613 while reading the database settings: Database 'appdb' on server 'x' is not currently available."
    );

    let mut mock = Mock::start().await;
    mock.register(
        "catalog_database",
        QueryResponse::error_only(TerminalError::new(
            229,
            14,
            "The SELECT permission was denied on the object 'databases'.",
        )),
    )
    .await;
    let err = ct_source(&mock, json!({})).validate().await.expect_err("permanent");
    let SourceError::Invalid(message) = err else { panic!("expected Invalid, got {err:?}") };
    assert!(message.starts_with("SQL Server error 229 while reading the database settings"), "{message}");
    assert!(!message.contains("not-a-real-secret"));
}

/// An app folder whose one function watches `[DBO].[ORDERS]` through the mock, loaded as the handler loads it.
fn orders_function(mock: &Mock) -> (std::path::PathBuf, sql_pseudo_trigger::config::FunctionConfig) {
    let root = std::env::temp_dir().join(format!("mssql-wire-{}-{}", std::process::id(), mock.port));
    let dir = root.join("OrdersChanged");
    std::fs::create_dir_all(&dir).expect("app folder");
    std::fs::write(root.join("host.json"), r#"{"version":"2.0"}"#).expect("host.json");
    std::fs::write(
        dir.join("function.json"),
        r#"{"bindings":[{"type":"timerTrigger","direction":"in","name":"timer","schedule":"*/5 * * * * *"},{"type":"queue","direction":"out","name":"changes","queueName":"orders","connection":"AzureWebJobsStorage"}],"retry":{"strategy":"fixedDelay","maxRetryCount":3,"delayInterval":"00:00:05"}}"#,
    )
    .expect("function.json");
    std::fs::write(
        dir.join("sqltrigger.json"),
        r#"{"source":"mssql-change-tracking","tableName":"[DBO].[ORDERS]","connectionStringSetting":"SqlConnectionString"}"#,
    )
    .expect("sqltrigger.json");
    let env = Env::from_pairs([("SqlConnectionString".to_string(), mock.connection_string("ConnectRetryCount=1"))]);
    let config = AppConfig::load_from(&root, env).expect("the app config loads");
    let function = config.functions[0].clone();
    (root, function)
}

#[tokio::test]
async fn a_quiet_table_outlives_its_retention_because_empty_ticks_record_the_version_they_proved() {
    // GIVEN a quiet table: its change-tracking version moves (other tables change) but it has no change
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register("ct_fetch_start", changes(42, 10, &[])).await;
    let (root, function) = orders_function(&mock);
    let store = Arc::new(MemoryStore::new());
    let clock = ManualClock::default();
    let process = |function: &sql_pseudo_trigger::config::FunctionConfig| {
        let source = Arc::new(new_change_tracking(function.source.clone()).expect("source"));
        Trigger::new(function.clone(), "wire-app", source, store.clone(), "owner-1".into())
            .with_clock(Arc::new(clock.clone()))
    };

    // WHEN one process ticks on it, and after the retention window passed (cleanup moved the minimum valid
    // version to 30, past the start, 10) a new process (nothing in memory) ticks six minutes later
    let first = process(&function).tick(&Attempt::fresh(Some(RetryContext::first(3)))).await.expect("first tick");
    let recorded = checkpoint(&process(&function)).await;
    mock.register("ct_fetch_start", changes(60, 30, &[])).await;
    clock.advance(std::time::Duration::from_secs(6 * 60));
    let later = process(&function);
    let second = later.tick(&Attempt::fresh(Some(RetryContext::first(3)))).await;

    // THEN the empty tick recorded the version it proved (42), so the later one is not a lost position, and it
    // records the newer one (issue 15, item 15: the engine advances a quiet checkpoint every ADVANCE_EVERY)
    assert_eq!(first.kind, OutcomeKind::Empty);
    assert_eq!(recorded, json!({"phase": "changes", "base": 42}));
    assert_eq!(second.expect("no position lost").kind, OutcomeKind::Empty);
    assert_eq!(checkpoint(&later).await, json!({"phase": "changes", "base": 60}));
    assert_eq!(mock.values("ct_fetch_start")[2], Wire::Int(42), "the later process read after the recorded version");
    let _ = std::fs::remove_dir_all(&root);
}

/// The checkpoint of the state document a trigger's store holds.
async fn checkpoint(trigger: &Trigger) -> Value {
    trigger.load().await.expect("load").expect("state written").0.checkpoint().clone()
}

#[tokio::test]
async fn a_full_tick_against_the_wire_delivers_and_records_the_batch() {
    // GIVEN an app folder whose function watches [DBO].[ORDERS] through the mock
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register("ct_fetch_start", changes(42, 10, &[(11, 0, INSERTED, "1"), (13, 2, DELETED, "3")])).await;
    let (root, function) = orders_function(&mock);
    let source = Arc::new(new_change_tracking(function.source.clone()).expect("source"));
    let store = Arc::new(MemoryStore::new());
    let trigger = Trigger::new(function, "wire-app", source, store, "owner-1".into());

    // WHEN the host invokes the timer once
    let outcome = trigger.tick(&Attempt::fresh(Some(RetryContext::first(5)))).await.expect("tick");

    // THEN the batch is delivered in the official shape and the state records it in flight
    assert_eq!(outcome.kind, OutcomeKind::Delivered);
    assert_eq!(
        encode_batch(&outcome.changes).get(),
        format!(r#"[{{"Operation":0,"Item":{INSERTED}}},{{"Operation":2,"Item":{DELETED}}}]"#)
    );
    let (doc, _) = trigger.load().await.expect("load").expect("state written");
    let flight = doc.in_flight().expect("batch in flight");
    assert_eq!(flight.range.from, json!({"phase": "changes", "base": 10}));
    assert_eq!(flight.range.to, json!({"phase": "changes", "base": 42}));
    let _ = std::fs::remove_dir_all(&root);
}

/// `[DBO].[ITEMS]` as the rowversion source sees it (the golden `items` shape).
const ITEMS: &[ColumnRow] = &[
    ("ID", "int", None, Some(10), Some(0), None, 1, Some(1)),
    ("TITLE", "nvarchar", Some(200), None, None, None, 2, None),
    ("IS_DELETED", "bit", None, None, None, None, 3, None),
    ("RV", "timestamp", Some(8), None, None, None, 4, None),
];

async fn items_source(mock: &mut Mock) -> MssqlRowversion {
    mock.register("catalog_database", database(None)).await;
    mock.register("catalog_table", table(None, false)).await;
    mock.register("catalog_columns", columns(ITEMS)).await;
    let mut s = spec(
        mock,
        SourceKind::MssqlRowversion,
        "[DBO].[ITEMS]",
        json!({"softDeleteColumn": "IS_DELETED"}),
        "ConnectRetryCount=0",
    );
    s.columns = Some(vec![
        Ident::new("ID").expect("id"),
        Ident::new("TITLE").expect("id"),
        Ident::new("IS_DELETED").expect("id"),
    ]);
    new_rowversion(s).expect("source")
}

/// A rowversion read: `(rowversion, operation, item json, key texts)` rows.
fn rv_rows(rows: &[(i64, i32, &str, &[&str])]) -> QueryResponse {
    let keys = rows.first().map_or(1, |r| r.3.len());
    let mut cols = vec![Col::new("RV", T::BigInt), Col::new("OP", T::Int), Col::new("ITEM", T::NVarCharMax)];
    cols.extend((1..=keys).map(|i| Col::new(format!("K{i}"), T::NVarCharMax)));
    QueryResponse::new(
        cols,
        rows.iter()
            .map(|(rv, op, item, key)| {
                let mut values = vec![V::BigInt(*rv), V::Int(*op), nvarchar_max(item)];
                values.extend(key.iter().map(|k| nvarchar_max(k)));
                Row::new(values)
            })
            .collect(),
    )
}

fn count(n: i64) -> QueryResponse {
    QueryResponse::new(vec![Col::new("PENDING", T::BigInt)], vec![Row::new(vec![V::BigInt(n)])])
}

const ITEM_1: &str = r#"{"ID":1,"TITLE":"a","IS_DELETED":false}"#;
const ITEM_3: &str = r#"{"ID":3,"TITLE":"c","IS_DELETED":false}"#;

#[tokio::test]
async fn the_rowversion_source_reads_below_min_active_rowversion_over_the_wire() {
    let mut mock = Mock::start().await;
    let source = items_source(&mut mock).await;
    mock.register("rv_fetch_start", rv_rows(&[(2001, 1, ITEM_1, &["1"]), (2002, 2, r#"{"ID":2}"#, &["2"])])).await;

    source.validate().await.expect("valid");
    let fetched = source.fetch(&Value::Null, 100).await.expect("fetch");
    assert_eq!(
        encode_batch(&fetched.changes).get(),
        r#"[{"Operation":1,"Item":{"ID":1,"TITLE":"a","IS_DELETED":false}},{"Operation":2,"Item":{"ID":2}}]"#
    );
    assert_eq!(fetched.last, Some(json!({"rv": 2002, "key": ["2"]})));
    assert_eq!(mock.values("rv_fetch_start"), vec![Wire::Int(100)]);
}

#[tokio::test]
async fn a_rowversion_start_from_now_pages_after_the_version_then_after_the_key_and_counts_what_waits() {
    // GIVEN a table whose newest readable rowversion is 2000, then two changed rows, then one more
    let mut mock = Mock::start().await;
    let source = items_source(&mut mock).await;
    mock.register(
        "rv_newest",
        QueryResponse::new(vec![Col::new("RV", T::BigInt)], vec![Row::new(vec![V::BigInt(2000)])]),
    )
    .await;
    mock.register("rv_fetch_after_version", rv_rows(&[(2001, 1, ITEM_1, &["1"]), (2001, 1, ITEM_3, &["3"])])).await;
    mock.register("rv_fetch_after_key", rv_rows(&[(2003, 2, r#"{"ID":2}"#, &["2"])])).await;
    mock.register("rv_pending_start", count(7)).await;
    mock.register("rv_pending_after_version", count(3)).await;
    mock.register("rv_pending_after_key", count(1)).await;

    // WHEN it starts from now and fetches two batches of two
    let start = source.start_position(StartFrom::Now).await.expect("start");
    let first = source.fetch(&start, 2).await.expect("first");
    let first_end = first.last.clone().expect("a position");
    let second = source.fetch(&first_end, 2).await.expect("second");

    // THEN the start is the newest readable rowversion; a full batch ends at its last key, still under the
    // backlog's base, and a drained one starts the next backlog from its last rowversion
    assert_eq!(start, json!({"rv": 2000}));
    assert_eq!(first_end, json!({"rv": 2001, "key": ["3"], "base": 2000}));
    assert_eq!(second.last, Some(json!({"rv": 2003, "key": ["2"]})));
    assert_eq!(encode_batch(&second.changes).get(), r#"[{"Operation":2,"Item":{"ID":2}}]"#);
    // The positions' values go over the wire as parameters: limit, then the rowversion, then the key text.
    assert_eq!(mock.values("rv_fetch_after_version"), vec![Wire::Int(2), Wire::Int(2000)]);
    assert_eq!(mock.values("rv_fetch_after_key"), vec![Wire::Int(2), Wire::Int(2001), Wire::Text("3".into())]);

    // AND status counts what waits after each kind of position
    assert_eq!(source.pending(&Value::Null).await.expect("pending"), 7);
    assert_eq!(source.pending(&start).await.expect("pending"), 3);
    assert_eq!(source.pending(&first_end).await.expect("pending"), 1);
    assert_eq!(mock.values("rv_pending_after_key"), vec![Wire::Int(2001), Wire::Text("3".into())]);
}

#[tokio::test]
async fn a_rowversion_batch_in_flight_is_read_again_up_to_its_recorded_end() {
    let mut mock = Mock::start().await;
    let source = items_source(&mut mock).await;
    mock.register("rv_refetch_start_to_key", rv_rows(&[(2001, 1, ITEM_1, &["1"])])).await;
    mock.register("rv_refetch_version_to_key", rv_rows(&[(2002, 1, ITEM_3, &["3"])])).await;
    mock.register("rv_refetch_key_to_key", rv_rows(&[(2004, 1, ITEM_3, &["3"])])).await;
    let upto = json!({"rv": 2002, "key": ["3"], "base": 0});

    // WHEN each kind of batch is re-read
    let from_start = source.refetch(&Value::Null, &upto, 10).await.expect("from the start");
    let from_version = source.refetch(&json!({"rv": 2000}), &upto, 10).await.expect("from a version");
    let from_key = source.refetch(&json!({"rv": 2002, "key": ["3"]}), &json!({"rv": 2004, "key": ["3"]}), 10).await;

    // THEN each ends where the batch was recorded to end, whatever the re-read returned
    assert_eq!(from_start.last, Some(upto.clone()));
    assert_eq!(from_version.last, Some(upto));
    assert_eq!(
        encode_batch(&from_key.expect("from a key").changes).get(),
        format!(r#"[{{"Operation":1,"Item":{ITEM_3}}}]"#)
    );
    assert_eq!(
        mock.values("rv_refetch_key_to_key"),
        vec![Wire::Int(10), Wire::Int(2002), Wire::Text("3".into()), Wire::Int(2004), Wire::Text("3".into())]
    );
    // A batch recorded without an end key cannot be bounded: refused, and nothing is sent.
    let err = source.refetch(&Value::Null, &json!({"rv": 2002}), 10).await.expect_err("no end key").to_string();
    assert!(err.contains("ends at a position without a key"), "{err}");
}

/// `[app].[Item Log]`: composite key (varchar, datetime2), a soft-delete column that is not `bit`, an
/// `insertedColumn`, READ COMMITTED (the golden `items_with_options` shape).
const ITEM_LOG: &[ColumnRow] = &[
    ("Tenant", "varchar", Some(10), None, None, None, 1, Some(1)),
    ("At", "datetime2", None, None, None, Some(7), 2, Some(2)),
    ("Body", "nvarchar", Some(-1), None, None, None, 3, None),
    ("Deleted At", "datetime2", None, None, None, Some(7), 4, None),
    ("Created Version", "binary", Some(8), None, None, None, 5, None),
    ("Row Version", "timestamp", Some(8), None, None, None, 6, None),
];

#[tokio::test]
async fn inserts_are_labelled_from_the_backlogs_base_not_the_moving_position() {
    // GIVEN the item log, polled with insertedColumn and a soft-delete column under READ COMMITTED
    let mut mock = Mock::start().await;
    mock.register("catalog_database", database_with(None, false)).await;
    mock.register("catalog_table", table(None, false)).await;
    mock.register("catalog_columns", columns(ITEM_LOG)).await;
    let source = new_rowversion(spec(
        &mock,
        SourceKind::MssqlRowversion,
        "[app].[Item Log]",
        json!({"softDeleteColumn": "Deleted At", "insertedColumn": "Created Version", "columns": ["Tenant", "At", "Body"]}),
        "",
    ))
    .expect("source");
    let item = r#"{"Tenant":"t","At":"2026-01-02T00:00:00","Body":"b"}"#;
    let at = "2026-01-02 00:00:00.0000000";
    mock.register("rv_options_fetch_start", rv_rows(&[(3001, 0, item, &["a", at]), (3002, 0, item, &["b", at])])).await;
    mock.register("rv_options_fetch_after_key_first_backlog", rv_rows(&[(3003, 0, item, &["c", at])])).await;

    // WHEN the first backlog is paged in batches of two
    let first = source.fetch(&Value::Null, 2).await.expect("first").last.expect("a position");
    let second = source.fetch(&first, 2).await.expect("second").last.expect("a position");

    // THEN the whole first backlog is new (base 0: every row an Insert), and its drained end starts the next
    assert_eq!(first, json!({"rv": 3002, "key": ["b", at], "base": 0}));
    assert_eq!(second, json!({"rv": 3003, "key": ["c", at]}));

    // AND WHEN a later backlog is paged from the middle
    mock.register("rv_options_fetch_after_key", rv_rows(&[(3010, 0, item, &["d", at]), (3011, 1, item, &["e", at])]))
        .await;
    let mid = json!({"rv": 3008, "key": ["c", at], "base": 3003});
    let next = source.fetch(&mid, 2).await.expect("mid-backlog").last.expect("a position");

    // THEN the label compares with the backlog's base (3003), not the position (3008): a row inserted with
    // DEFAULT @@DBTS right after the last delivered row carries that row's rowversion, and is still an Insert
    let values = mock.values("rv_options_fetch_after_key");
    assert_eq!(values[..2], [Wire::Int(2), Wire::Int(3008)]);
    assert_eq!(values[4], Wire::Int(3003), "@P5 is the base: {values:?}");
    assert_eq!(next, json!({"rv": 3011, "key": ["e", at], "base": 3003}));
}

/// The lag read's answer: the first pending change's version and its age in seconds (NULL when undated), from
/// a login with VIEW SERVER STATE.
fn oldest(version: i64, age_seconds: Option<i32>) -> QueryResponse {
    oldest_seen_by(version, age_seconds, true)
}

fn oldest_seen_by(version: i64, age_seconds: Option<i32>, server_state: bool) -> QueryResponse {
    QueryResponse::new(
        vec![Col::new("VER", T::BigInt), Col::new("AGE_S", T::Int), Col::new("SERVER_STATE", T::Int)],
        vec![Row::new(vec![
            V::BigInt(version),
            age_seconds.map(V::Int).unwrap_or(V::Null),
            V::Int(i32::from(server_state)),
        ])],
    )
}

#[tokio::test]
async fn the_lag_is_the_age_of_the_first_pending_changes_commit_read_over_the_wire() {
    // GIVEN a function that delivered up to version 11, key 1, and whose next change committed 90 s ago
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_oldest_after_key", oldest(12, Some(90))).await;
    let after = json!({"phase": "changes", "base": 10, "last": {"version": 11, "key": ["1"]}});

    // WHEN the lag is read THEN it is those 90 s
    let lag = ct_source(&mock, json!({})).oldest_pending_age(&after).await.expect("lag");
    assert_eq!(lag, Lag::Behind(std::time::Duration::from_secs(90)));
}

#[tokio::test]
async fn a_pending_change_whose_commit_time_was_cleaned_up_has_an_unknown_lag_that_says_so() {
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_oldest_start", oldest(12, None)).await;

    let lag = ct_source(&mock, json!({})).oldest_pending_age(&json!({"phase": "changes", "base": 10})).await;

    let Ok(Lag::Unknown(reason)) = lag else { panic!("expected an unknown lag, got {lag:?}") };
    assert!(reason.starts_with("the commit time of version 12 is no longer in sys.dm_tran_commit_table"), "{reason}");
}

#[tokio::test]
async fn without_view_server_state_a_fresh_change_has_an_unknown_lag_that_names_the_permission() {
    // GIVEN a login without VIEW SERVER STATE, to which the commit table shows a commit only after a checkpoint
    let mut mock = Mock::start().await;
    order_lines_catalog(&mut mock).await;
    mock.register("ct_options_oldest_after_key", oldest_seen_by(12, None, false)).await;
    let after = json!({"phase": "changes", "base": 10, "last": {"version": 11, "key": ["7", "b"]}});

    // WHEN the lag of the pending change is read
    let lag = order_lines_source(&mock).oldest_pending_age(&after).await;

    // THEN it is unknown for that reason, not "cleanup removed it" (issue 15, defect 13)
    let Ok(Lag::Unknown(reason)) = lag else { panic!("expected an unknown lag, got {lag:?}") };
    assert!(
        reason.starts_with(
            "the commit time of version 12 is not visible yet: without VIEW SERVER STATE, which login user func lacks"
        ),
        "{reason}"
    );
    assert_eq!(
        mock.values("ct_options_oldest_after_key"),
        vec![
            Wire::Int(10),
            Wire::Int(11),
            Wire::Text("7".into()),
            Wire::Text("b".into()),
            Wire::Bytes(b"MYAPP".to_vec())
        ]
    );
}

#[tokio::test]
async fn without_view_database_state_the_lag_is_unknown_and_names_the_grant() {
    // GIVEN a login that may read the changes but not the commit table (SQL Server error 300)
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register(
        "ct_oldest_start",
        QueryResponse::error_only(TerminalError::new(
            300,
            14,
            "VIEW DATABASE STATE permission denied in database 'appdb'.",
        )),
    )
    .await;

    // WHEN the lag is read
    let lag = ct_source(&mock, json!({})).oldest_pending_age(&json!({"phase": "changes", "base": 10})).await;

    // THEN it is unknown, not an error that would fail the whole status, and says what to grant to whom
    let Ok(Lag::Unknown(reason)) = lag else { panic!("expected an unknown lag, got {lag:?}") };
    assert_eq!(
        reason,
        "reading commit times (sys.dm_tran_commit_table) needs VIEW DATABASE STATE, which login user func lacks (SQL Server error 300); run GRANT VIEW DATABASE STATE TO [func] for a lag"
    );
}

#[tokio::test]
async fn the_rowversion_source_says_it_cannot_date_changes() {
    let mock = Mock::start().await;
    let source =
        new_rowversion(spec(&mock, SourceKind::MssqlRowversion, "[DBO].[ITEMS]", json!({}), "")).expect("source");
    let Ok(Lag::Unknown(reason)) = source.oldest_pending_age(&Value::Null).await else {
        panic!("a rowversion has no time")
    };
    assert!(reason.contains("use the change-tracking source"), "{reason}");
}

/// A TCP relay between the source and the mock that can cut every connection it carries, as Azure's load
/// balancer cuts one that stayed idle (the client learns it only at its next statement).
struct Relay {
    port: u16,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    links: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Relay {
    async fn start(to: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("relay binds");
        let port = listener.local_addr().expect("address").port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let links: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (count, held) = (accepted.clone(), links.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let link = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                held.lock().expect("links").push(link);
            }
        });
        Self { port, accepted, links }
    }

    /// Drops both ends of every connection carried so far.
    fn cut(&self) {
        for link in self.links.lock().expect("links").drain(..) {
            link.abort();
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_pooled_connection_cut_while_idle_is_replaced_and_without_connect_retry_count_the_tick_fails() {
    for (retry_count, replaced) in [("ConnectRetryCount=1", true), ("ConnectRetryCount=0", false)] {
        // GIVEN a source that reached the mock through a relay, and whose one connection now idles in the pool
        let mut mock = Mock::start().await;
        catalog(&mut mock).await;
        mock.register("ct_versions", versions(10, 42)).await;
        let relay = Relay::start(mock.port).await;
        let mut s = spec(&mock, SourceKind::MssqlChangeTracking, "[DBO].[ORDERS]", json!({}), retry_count);
        s.connection = Secret::new(
            mock.connection_string(retry_count).replace(&format!(",{};", mock.port), &format!(",{};", relay.port)),
        );
        let source = new_change_tracking(s).expect("source builds");
        source.start_position(StartFrom::Earliest).await.expect("first statement");
        assert_eq!(relay.accepted(), 1, "{retry_count}: one connection served the catalog and the first read");

        // WHEN the relay cuts it, and the source reads again
        relay.cut();
        let again = source.start_position(StartFrom::Earliest).await;

        // THEN a fresh connection replaces the dead one within the same read, or, with ConnectRetryCount=0,
        // the read fails as transient (the next tick connects afresh)
        if replaced {
            assert_eq!(again.expect("replaced"), json!({"phase": "changes", "base": 10}), "{retry_count}");
            assert_eq!(relay.accepted(), 2, "{retry_count}: exactly one replacement");
        } else {
            let err = again.expect_err("no replacement");
            assert!(
                matches!(&err, SourceError::Unavailable(m) if m.starts_with("SQL Server connection failed while reading")),
                "{err:?}"
            );
            assert_eq!(relay.accepted(), 1, "{retry_count}: nothing reconnected within the read");
            source.start_position(StartFrom::Earliest).await.expect("the next read connects afresh");
            assert_eq!(relay.accepted(), 2, "{retry_count}");
        }
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Partitions (issue 23): each partition's reads carry its hash filter, with its index (and count) bound
// ---------------------------------------------------------------------------------------------------------------

/// One partition of `count`.
fn partition(index: u32, count: u32) -> Option<Partition> {
    Partition::new(index, NonZeroU32::new(count).expect("a count above 0"))
}

/// The folder `handler partitions generate` writes for partition `index` of `count` of the orders function,
/// loaded as the handler loads it: its one partition trigger's source spec.
fn generated_partition_spec(mock: &Mock, index: u32, count: u32) -> SourceSpec {
    let root = std::env::temp_dir().join(format!("mssql-wire-part-{}-{}", std::process::id(), mock.port));
    let dir = root.join(format!("OrdersChanged-p{index}"));
    std::fs::create_dir_all(&dir).expect("app folder");
    std::fs::write(root.join("host.json"), r#"{"version":"2.0"}"#).expect("host.json");
    std::fs::write(
        dir.join("function.json"),
        r#"{"bindings":[{"type":"timerTrigger","direction":"in","name":"timer","schedule":"*/5 * * * * *"},{"type":"queue","direction":"out","name":"changes","queueName":"orders","connection":"AzureWebJobsStorage"}],"retry":{"strategy":"fixedDelay","maxRetryCount":3,"delayInterval":"00:00:05"}}"#,
    )
    .expect("function.json");
    let sqltrigger = json!({"source": "mssql-change-tracking", "tableName": "[DBO].[ORDERS]",
        "connectionStringSetting": "SqlConnectionString", "partitions": count, "partition": index,
        "partitionGroup": "OrdersChanged"});
    std::fs::write(dir.join("sqltrigger.json"), sqltrigger.to_string()).expect("sqltrigger.json");
    let env = Env::from_pairs([("SqlConnectionString".to_string(), mock.connection_string("ConnectRetryCount=1"))]);
    let config = AppConfig::load_from(&root, env).expect("the app config loads");
    let triggers = config.functions[0].partition_triggers();
    let _ = std::fs::remove_dir_all(&root);
    assert_eq!(triggers.len(), 1, "a generated folder serves one partition");
    triggers[0].source.clone()
}

#[tokio::test]
async fn a_partitioned_change_tracking_function_filters_every_read_by_its_partitions_key_hash() {
    // GIVEN the folder of partition 2 of 4 of the orders function, and a tracked table
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register("ct_part_fetch_start", changes(42, 10, &[(11, 0, INSERTED, "1"), (12, 1, NULLS, "2")])).await;
    mock.register("ct_part_fetch_after_key", changes(42, 10, &[(13, 2, DELETED, "3")])).await;
    mock.register("ct_part_refetch_key_to_key", changes(42, 10, &[(13, 2, DELETED, "3")])).await;
    mock.register(
        "ct_part_pending_after_key",
        QueryResponse::new(
            vec![Col::new("MINV", T::BigInt), Col::new("PENDING", T::BigInt)],
            vec![Row::new(vec![V::BigInt(10), V::BigInt(1)])],
        ),
    )
    .await;
    mock.register("ct_part_oldest_after_key", oldest(13, Some(30))).await;
    let spec = generated_partition_spec(&mock, 2, 4);
    assert_eq!(spec.partition, partition(2, 4));
    let source = new_change_tracking(spec).expect("source builds");

    // WHEN it starts, fetches two batches, reads the second again, counts and dates what waits
    let start = source.start_position(StartFrom::Earliest).await.expect("start");
    let first = source.fetch(&start, 2).await.expect("first batch");
    let at = first.last.clone().expect("a position");
    let second = source.fetch(&at, 2).await.expect("second batch");
    let again = source
        .refetch(&at, &json!({"phase": "changes", "base": 10, "last": {"version": 13, "key": ["3"]}}), 2)
        .await
        .expect("refetch");
    let pending = source.pending(&at).await.expect("pending");
    let lag = source.oldest_pending_age(&at).await.expect("lag");

    // THEN every read is the partitioned statement, with the partition count (4) and index (2) bound last
    assert_eq!(encode_batch(&second.changes).get(), encode_batch(&again.changes).get());
    assert_eq!((pending, lag), (1, Lag::Behind(std::time::Duration::from_secs(30))));
    let table = Wire::Text("[DBO].[ORDERS]".into());
    assert_eq!(
        mock.values("ct_part_fetch_start"),
        vec![table.clone(), Wire::Int(2), Wire::Int(10), Wire::Int(4), Wire::Int(2)]
    );
    assert_eq!(
        mock.values("ct_part_fetch_after_key"),
        vec![
            table.clone(),
            Wire::Int(2),
            Wire::Int(10),
            Wire::Int(12),
            Wire::Text("2".into()),
            Wire::Int(4),
            Wire::Int(2)
        ]
    );
    let tail = |name: &str| mock.values(name).split_off(mock.values(name).len() - 2);
    for name in ["ct_part_refetch_key_to_key", "ct_part_pending_after_key", "ct_part_oldest_after_key"] {
        assert_eq!(tail(name), vec![Wire::Int(4), Wire::Int(2)], "{name}");
    }
}

#[tokio::test]
async fn a_partitioned_walk_walks_and_counts_only_its_partitions_rows() {
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_part_walk_first", walk(&[(INSERTED, "1")])).await;
    mock.register("ct_part_walk_pending_first", count(25)).await;
    let mut spec = spec(&mock, SourceKind::MssqlChangeTracking, "[DBO].[ORDERS]", json!({}), "");
    spec.partition = partition(0, 8);
    let source = new_change_tracking(spec).expect("source builds");

    // A walk recorded before backfills existed (or a resync's) goes on in its partition.
    let start = json!({"phase": "snapshot", "base": 42});
    let walked = source.fetch(&start, 100).await.expect("walk");
    let waiting = source.pending(&start).await.expect("pending");

    assert_eq!(encode_batch(&walked.changes).get(), format!(r#"[{{"Operation":0,"Item":{INSERTED}}}]"#));
    assert_eq!(waiting, 25);
    assert_eq!(mock.values("ct_part_walk_first"), vec![Wire::Int(100), Wire::Int(8), Wire::Int(0)]);
    assert_eq!(mock.values("ct_part_walk_pending_first"), vec![Wire::Int(8), Wire::Int(0)]);
}

#[tokio::test]
async fn a_partitioned_composite_key_is_hashed_over_every_key_column_after_the_context_filter() {
    let mut mock = Mock::start().await;
    order_lines_catalog(&mut mock).await;
    let line = r#"{"Order Id":7,"Line №":"b","Qty":1}"#;
    mock.register("ct_part_options_fetch_after_key", changes2(60, 10, &[(12, 1, line, ["7", "b"], Some("001"))])).await;
    let mut spec = spec(
        &mock,
        SourceKind::MssqlChangeTracking,
        "[Sales Ünïcode].[Order]] Lines]",
        json!({"skipOwnChangesContext": "0x4D59415050", "includeMetadata": true, "columns": ["Order Id", "Line №", "Qty"]}),
        "",
    );
    spec.partition = partition(5, 16);
    let source = new_change_tracking(spec).expect("source builds");
    let at = json!({"phase": "changes", "base": 10, "last": {"version": 11, "key": ["7", "a"]}});
    let fetched = source.fetch(&at, 1).await.expect("fetch");
    assert_eq!(fetched.changes.len(), 1);
    let values = mock.values("ct_part_options_fetch_after_key");
    assert_eq!(values[values.len() - 3..], [Wire::Bytes(b"MYAPP".to_vec()), Wire::Int(16), Wire::Int(5)]);
}

/// What the handler logs while it is alive, on this thread (the tests run on a current-thread runtime).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("logs").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn capture() -> (Self, tracing::subscriber::DefaultGuard) {
        let logs = Self::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("logs")).into_owned()
    }
}

/// `[DBO].[ITEMS]` with the partition column `P8` a partitioned rowversion source reads through.
const ITEMS_P8: &[ColumnRow] = &[
    ("ID", "int", None, Some(10), Some(0), None, 1, Some(1)),
    ("TITLE", "nvarchar", Some(200), None, None, None, 2, None),
    ("IS_DELETED", "bit", None, None, None, None, 3, None),
    ("RV", "timestamp", Some(8), None, None, None, 4, None),
    ("P8", "int", None, Some(10), Some(0), None, 5, None),
];

/// The partition column's catalog answer: its stored definition, whether persisted, how many indexes lead with it.
fn partition_column_facts(definition: &str, persisted: bool, indexes: i32) -> QueryResponse {
    QueryResponse::new(
        vec![Col::new("DEF", T::NVarCharMax), Col::new("IS_PERSISTED", T::Int), Col::new("INDEXED", T::Int)],
        vec![Row::new(vec![nvarchar_max(definition), V::Int(i32::from(persisted)), V::Int(indexes)])],
    )
}

/// The items source as partition `index` of 8, reading through `P8` (or, `column` false, hashing inline).
async fn partitioned_items_source(mock: &mut Mock, index: u32, column: bool) -> MssqlRowversion {
    mock.register("catalog_database", database(None)).await;
    mock.register("catalog_table", table(None, false)).await;
    mock.register("catalog_columns", columns(ITEMS_P8)).await;
    let options = if column {
        json!({"softDeleteColumn": "IS_DELETED", "partitions": 8, "partitionColumn": "P8", "columns": ["ID", "TITLE", "IS_DELETED"]})
    } else {
        json!({"softDeleteColumn": "IS_DELETED", "partitions": 8, "columns": ["ID", "TITLE", "IS_DELETED"]})
    };
    let mut s = spec(mock, SourceKind::MssqlRowversion, "[DBO].[ITEMS]", options, "ConnectRetryCount=0");
    s.partition = partition(index, 8);
    new_rowversion(s).expect("source")
}

/// How SQL Server stores `(CHECKSUM([ID]) & 2147483647) % 8` as a computed column's definition.
const P8_DEFINITION: &str = "((checksum([ID])&(2147483647))%(8))";

#[tokio::test]
async fn a_partition_column_with_its_index_turns_every_rowversion_read_into_an_equality_on_it() {
    // GIVEN partition 3 of 8 of a table with the persisted column P8 and an index leading with (P8, RV)
    let mut mock = Mock::start().await;
    let source = partitioned_items_source(&mut mock, 3, true).await;
    mock.register("catalog_partition_column", partition_column_facts(P8_DEFINITION, true, 1)).await;
    mock.register("rv_part_column_fetch_start", rv_rows(&[(2001, 1, ITEM_1, &["1"]), (2002, 1, ITEM_3, &["3"])])).await;
    mock.register("rv_part_column_fetch_after_key", rv_rows(&[(2005, 1, ITEM_1, &["1"])])).await;
    mock.register("rv_part_column_refetch_key_to_key", rv_rows(&[(2005, 1, ITEM_1, &["1"])])).await;
    mock.register("rv_part_column_pending_after_key", count(1)).await;

    // WHEN it validates, fetches two batches, reads the second again and counts what waits
    source.validate().await.expect("the partition column is what 8 partitions need");
    let first = source.fetch(&Value::Null, 2).await.expect("first");
    let at = first.last.clone().expect("a position");
    let second = source.fetch(&at, 2).await.expect("second");
    let again = source.refetch(&at, second.last.as_ref().expect("an end"), 2).await.expect("refetch");
    let pending = source.pending(&at).await.expect("pending");

    // THEN the catalog was asked about P8 beside RV, and each read bound the partition's index (3), no count
    assert_eq!(
        mock.values("catalog_partition_column"),
        vec![Wire::Text("[DBO].[ITEMS]".into()), Wire::Text("P8".into()), Wire::Text("RV".into())]
    );
    assert_eq!(mock.values("rv_part_column_fetch_start"), vec![Wire::Int(2), Wire::Int(3)]);
    assert_eq!(
        mock.values("rv_part_column_fetch_after_key"),
        vec![Wire::Int(2), Wire::Int(3), Wire::Int(2002), Wire::Text("3".into())]
    );
    assert_eq!(encode_batch(&second.changes).get(), encode_batch(&again.changes).get());
    assert_eq!(pending, 1);
    assert_eq!(
        mock.values("rv_part_column_pending_after_key"),
        vec![Wire::Int(3), Wire::Int(2002), Wire::Text("3".into())]
    );
}

#[tokio::test]
async fn a_partition_column_without_an_index_is_used_and_one_with_another_expression_is_refused() {
    // Without an index the reads are right but slow: the source starts (and warns, see schema.rs's tests).
    let mut mock = Mock::start().await;
    let source = partitioned_items_source(&mut mock, 3, true).await;
    mock.register("catalog_partition_column", partition_column_facts(P8_DEFINITION, false, 0)).await;
    let (logs, guard) = Logs::capture();
    source.validate().await.expect("no index is a warning, not a refusal");
    drop(guard);
    let said = logs.text();
    assert!(said.contains("WARN"), "{said}");
    assert!(said.contains("partitionColumn [P8] of DBO.ITEMS has no index leading with ([P8], [RV])"), "{said}");
    assert!(
        said.contains(
            "Run CREATE INDEX [IX_ITEMS_P8] ON [DBO].[ITEMS] ([P8], [RV], [ID]) (and make the column PERSISTED"
        ),
        "{said}"
    );
    drop(mock);

    // A column for 4 partitions under 8 would leave keys unread: refused, with the DDL for 8.
    let mut mock = Mock::start().await;
    let source = partitioned_items_source(&mut mock, 3, true).await;
    mock.register("catalog_partition_column", partition_column_facts("((checksum([ID])&(2147483647))%(4))", true, 1))
        .await;
    let err = source.validate().await.expect_err("another expression");
    assert!(
        err.to_string().contains("is defined as ((checksum([ID])&(2147483647))%(4)), but 8 partitions of the key need ((CHECKSUM([ID]) & 2147483647) % 8)"),
        "{err}"
    );
    assert!(err.to_string().contains("ALTER TABLE [DBO].[ITEMS] ADD [sqltrigger_p8] AS ((CHECKSUM([ID]) & 2147483647) % 8) PERSISTED; CREATE INDEX [IX_ITEMS_sqltrigger_p8] ON [DBO].[ITEMS] ([sqltrigger_p8], [RV], [ID])"), "{err}");
    drop(mock);

    // A plain column (no row in sys.computed_columns) is refused too.
    let mut mock = Mock::start().await;
    let source = partitioned_items_source(&mut mock, 3, true).await;
    mock.register(
        "catalog_partition_column",
        QueryResponse::new(
            vec![Col::new("DEF", T::NVarCharMax), Col::new("IS_PERSISTED", T::Int), Col::new("INDEXED", T::Int)],
            vec![],
        ),
    )
    .await;
    let err = source.validate().await.expect_err("not computed");
    assert!(err.to_string().contains("partitionColumn \"P8\" of DBO.ITEMS is not a computed column"), "{err}");
}

#[tokio::test]
async fn without_a_partition_column_the_rowversion_source_hashes_each_key_inline() {
    let mut mock = Mock::start().await;
    let source = partitioned_items_source(&mut mock, 7, false).await;
    mock.register("rv_part_inline_fetch_start", rv_rows(&[(2001, 1, ITEM_1, &["1"])])).await;
    mock.register("rv_part_inline_pending_start", count(4)).await;

    let (logs, guard) = Logs::capture();
    source.validate().await.expect("valid: slow, not wrong");
    drop(guard);
    let said = logs.text();
    assert!(said.contains("DBO.ITEMS is split into 8 partitions without a partition column"), "{said}");
    assert!(
        said.contains("ALTER TABLE [DBO].[ITEMS] ADD [sqltrigger_p8] AS ((CHECKSUM([ID]) & 2147483647) % 8) PERSISTED"),
        "{said}"
    );
    let fetched = source.fetch(&Value::Null, 100).await.expect("fetch");
    let pending = source.pending(&Value::Null).await.expect("pending");

    assert_eq!(fetched.changes.len(), 1);
    assert_eq!(pending, 4);
    assert_eq!(mock.values("rv_part_inline_fetch_start"), vec![Wire::Int(100), Wire::Int(8), Wire::Int(7)]);
    assert_eq!(mock.values("rv_part_inline_pending_start"), vec![Wire::Int(8), Wire::Int(7)]);
}

/// A change-tracking source built from `spec` as the handler builds it (`app.rs`): with its kind's options.
fn new_change_tracking(spec: SourceSpec) -> Result<MssqlChangeTracking, SourceError> {
    let SourceOptions::MssqlChangeTracking(options) = spec.options.clone() else { panic!("{:?}", spec.options) };
    MssqlChangeTracking::new(spec, options)
}

/// A rowversion source built from `spec` as the handler builds it (`app.rs`): with its kind's options.
fn new_rowversion(spec: SourceSpec) -> Result<MssqlRowversion, SourceError> {
    let SourceOptions::MssqlRowversion(options) = spec.options.clone() else { panic!("{:?}", spec.options) };
    MssqlRowversion::new(spec, options)
}
