//! Tier 2 for the SQL Server upsert sink: the sink, tiberius and a TDS server (`mssql-mock-tds`) on the wire.
//!
//! What this proves: the sink logs in over TDS and sends, as tiberius puts them on the wire, exactly the
//! reviewed golden statements (`tests/golden/mssql_sink/`) with exactly the expected parameters: one JSON
//! array per statement, at most `maxRowsPerStatement` rows each; that a delivery is one `sp_executesql`
//! request in autocommit mode (its transaction is the `BEGIN TRANSACTION ... COMMIT` inside the reviewed
//! text; no transaction-manager request, no second round trip); how the sink reads the server's answers
//! (status row: written, fenced, already applied; error numbers: transient or rejected, never quoting a
//! value); and a full sink-mode tick of the engine over the wire, resuming from the checkpoint row. What it
//! cannot prove: T-SQL semantics (the mock has no engine: it answers what a test registered); that is
//! tier 3, `tests/mssql_real.rs`.
//!
//! Two limits of the mock shape this file, and a tap between tiberius and the mock works around them:
//! - the mock records neither statements nor parameters, and picks its answer by finding a registered
//!   upper-case text inside the request; the tap records every message the client sends, and the tests
//!   decode the RPC requests (statement and parameters) from those bytes. Answers are registered under a
//!   short upper-case fragment unique to one statement (the sink's statements use lower-case identifiers,
//!   so a whole statement cannot be registered as the source's wire tests do);
//! - the mock answers every TDS packet as a whole request (the packet size it negotiates is 4096 bytes), so
//!   a request split across packets is answered once per packet, and the extra answers are read as the
//!   answers to the next requests on that connection (`a_batch_larger_than_rows_per_statement_...` fails
//!   that way when the tap forwards packets unjoined). The tap hands the mock each multi-packet message
//!   joined into one packet (up to 64 KiB). The recorded bytes are what tiberius sent.

use mssql_mock_tds::{
    ColumnDefinition as Col, ColumnValue as V, MockTdsServer, QueryResponse, Row, SqlDataType as T, TerminalError,
};
use serde_json::{json, Value};
use sql_pseudo_trigger::change::{Change, Operation};
use sql_pseudo_trigger::config::{DeliveryMode, Env, FunctionConfig, SourceSpec, TriggerSettings};
use sql_pseudo_trigger::engine::{OutcomeKind, Trigger};
use sql_pseudo_trigger::sink::{self, Applied, Resume, Sink, SinkBatch, SinkError};
use sql_pseudo_trigger::state::MemoryStore;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testbed::MemorySource;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

// ---------------------------------------------------------------------------------------------------------------
// The mock, the tap, and decoding what the tap saw
// ---------------------------------------------------------------------------------------------------------------

/// TDS message types (MS-TDS 2.2.3.1.1).
const SQL_BATCH: u8 = 0x01;
const RPC: u8 = 0x03;
const TRANSACTION_MANAGER: u8 = 0x0E;
/// `sp_executesql`'s well-known procedure id.
const SP_EXECUTESQL: u16 = 10;

/// Registered fragments (upper case, each found in exactly one of the sink's statements).
const DELIVERY: &str = "SET XACT_ABORT ON;";
const CATALOG: &str = "= OBJECT_ID(@P1) ORDER BY ";
const RESUME: &str = "SELECT (SELECT ";

/// A reviewed golden statement of the sink.
fn golden(name: &str) -> String {
    let path = format!("{}/tests/golden/mssql_sink/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// One message the client sent: its type and its packets' payloads joined.
#[derive(Debug, Clone)]
struct Sent {
    kind: u8,
    payload: Vec<u8>,
}

/// A value of an RPC parameter, as the test reads it.
#[derive(Debug, Clone, PartialEq)]
enum Wire {
    Int(i64),
    Text(String),
    Null,
}

fn text(s: &str) -> Wire {
    Wire::Text(s.to_string())
}

/// An RPC request: procedure id, and its parameters by name in order.
#[derive(Debug, Clone)]
struct Rpc {
    proc_id: u16,
    params: Vec<(String, Wire)>,
}

impl Rpc {
    fn statement(&self) -> &str {
        match &self.params[0] {
            (name, Wire::Text(s)) if name == "stmt" => s,
            other => panic!("sp_executesql's first parameter is the statement, not {other:?}"),
        }
    }

    /// `@P1`, `@P2`, ...: the statement's own parameters, after `stmt` and `params`.
    fn values(&self) -> Vec<Wire> {
        self.params.iter().skip(2).map(|(_, v)| v.clone()).collect()
    }
}

/// Reads little-endian fields off a byte slice.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }
    fn u8(&mut self) -> u8 {
        self.take(1)[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take(2).try_into().expect("2 bytes"))
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().expect("4 bytes"))
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take(8).try_into().expect("8 bytes"))
    }
    fn utf16(&mut self, bytes: usize) -> String {
        let units: Vec<u16> = self.take(bytes).chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        String::from_utf16(&units).expect("UTF-16")
    }
}

/// The ALL_HEADERS block every request starts with: skipped, after checking its transaction descriptor is
/// 0, which is autocommit mode (MS-TDS 2.2.5.3.2): no transaction is open on the connection around the
/// request.
fn skip_all_headers(r: &mut Reader<'_>) {
    let total = r.u32() as usize;
    let mut headers = Reader(r.take(total - 4));
    while !headers.0.is_empty() {
        let length = headers.u32() as usize;
        let kind = headers.u16();
        let data = headers.take(length - 6);
        if kind == 2 {
            assert_eq!(&data[..8], &[0u8; 8], "a request inside a client-side transaction");
        }
    }
}

/// Decodes an RPC request as tiberius encodes `sp_executesql` (IntN and NVarChar values, short or PLP).
fn decode_rpc(payload: &[u8]) -> Rpc {
    let mut r = Reader(payload);
    skip_all_headers(&mut r);
    assert_eq!(r.u16(), 0xFFFF, "a procedure called by id");
    let proc_id = r.u16();
    let _options = r.u16();
    let mut params = Vec::new();
    while !r.0.is_empty() {
        let name_len = r.u8() as usize;
        let name = r.utf16(name_len * 2);
        let _status = r.u8();
        let value = match r.u8() {
            0x26 => {
                let _max = r.u8();
                match r.u8() {
                    0 => Wire::Null,
                    4 => Wire::Int(i64::from(i32::from_le_bytes(r.take(4).try_into().expect("4")))),
                    8 => Wire::Int(i64::from_le_bytes(r.take(8).try_into().expect("8"))),
                    n => panic!("IntN of {n} bytes"),
                }
            }
            0xE7 => {
                let max = r.u16();
                let _collation = r.take(5);
                if max == 0xFFFF {
                    if r.u64() == u64::MAX {
                        Wire::Null
                    } else {
                        let mut s = String::new();
                        loop {
                            let chunk = r.u32() as usize;
                            if chunk == 0 {
                                break;
                            }
                            s.push_str(&r.utf16(chunk));
                        }
                        Wire::Text(s)
                    }
                } else {
                    match r.u16() {
                        0xFFFF => Wire::Null,
                        n => Wire::Text(r.utf16(n as usize)),
                    }
                }
            }
            other => panic!("parameter {name} has type 0x{other:02X}, which the sink never sends"),
        };
        params.push((name, value));
    }
    Rpc { proc_id, params }
}

fn decode_batch(payload: &[u8]) -> String {
    let mut r = Reader(payload);
    skip_all_headers(&mut r);
    let rest = r.0.len();
    r.utf16(rest)
}

/// Forwards TDS between a client and the mock, recording what the client sends (see the module docs).
struct Tap {
    port: u16,
    sent: Arc<Mutex<Vec<Sent>>>,
}

impl Tap {
    async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("tap binds");
        let port = listener.local_addr().expect("tap address").port();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let record = sent.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(Self::pipe(client, upstream, record.clone()));
            }
        });
        Self { port, sent }
    }

    async fn pipe(client: TcpStream, upstream: u16, sent: Arc<Mutex<Vec<Sent>>>) {
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else { return };
        let (mut from_client, mut to_client) = client.into_split();
        let (mut from_server, mut to_server) = server.into_split();
        tokio::spawn(async move {
            let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
        });
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
            let mut joined = *first.get_or_insert(header);
            if header[1] & 0x01 == 0 {
                continue;
            }
            let total = u16::try_from(8 + message.len()).expect("a message the tap can join fits 64 KiB");
            joined[1] |= 0x01;
            joined[2..4].copy_from_slice(&total.to_be_bytes());
            sent.lock().expect("tap record").push(Sent { kind: joined[0], payload: message.clone() });
            let mut packet = joined.to_vec();
            packet.extend_from_slice(&message);
            if to_server.write_all(&packet).await.is_err() {
                return;
            }
            first = None;
            message.clear();
        }
    }

    fn sent(&self) -> Vec<Sent> {
        self.sent.lock().expect("tap record").clone()
    }

    fn rpcs(&self) -> Vec<Rpc> {
        self.sent().iter().filter(|s| s.kind == RPC).map(|s| decode_rpc(&s.payload)).collect()
    }

    /// The delivery requests, recognized by their text.
    fn deliveries(&self) -> Vec<Rpc> {
        self.rpcs().into_iter().filter(|r| r.statement().contains(DELIVERY)).collect()
    }

    fn catalog_reads(&self) -> usize {
        self.rpcs().iter().filter(|r| r.statement().contains(CATALOG)).count()
    }

    fn batches(&self) -> Vec<String> {
        self.sent().iter().filter(|s| s.kind == SQL_BATCH).map(|s| decode_batch(&s.payload)).collect()
    }
}

/// A mock TDS server behind a tap; dropped, the mock shuts down.
struct Server {
    tap: Tap,
    registry: Arc<tokio::sync::Mutex<mssql_mock_tds::QueryRegistry>>,
    _stop: oneshot::Sender<()>,
}

impl Server {
    async fn start() -> Self {
        let mock = MockTdsServer::new("127.0.0.1:0").await.expect("mock server binds");
        let registry = mock.query_registry();
        let tap = Tap::start(mock.local_addr().port()).await;
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(async move {
            let _ = mock.run_with_shutdown(stopped).await;
        });
        Self { tap, registry, _stop: stop }
    }

    fn connection_string(&self) -> String {
        format!(
            "Server=tcp:127.0.0.1,{};Database=appdb;User ID=func;Password=not-a-real-secret;Encrypt=DANGER_PLAINTEXT;Connect Timeout=5;ConnectRetryCount=1",
            self.tap.port
        )
    }

    /// Answers requests that contain `fragment` with `response`.
    async fn answer(&self, fragment: &str, response: QueryResponse) {
        self.registry.lock().await.register(fragment, response);
    }

    /// A sink on `table` with `extra` options, connecting through the tap.
    fn sink(&self, table: &str, extra: Value) -> Arc<dyn Sink> {
        let mut options = json!({ "type": "mssql", "tableName": table, "connectionStringSetting": "TargetDb" });
        if let (Some(o), Some(extra)) = (options.as_object_mut(), extra.as_object()) {
            o.extend(extra.clone());
        }
        let env = Env::from_pairs([("TargetDb".to_string(), self.connection_string())]);
        sink::from_options("F", Some(&options), &env, &Default::default())
            .unwrap_or_else(|e| panic!("a valid sink: {e}"))
    }

    /// Every message sent so far was a login, a plain batch or an RPC in autocommit mode; none asked for a
    /// transaction, and none could be answered by the mock's built-in `SELECT 1` instead of a test's answer.
    fn assert_no_client_transactions_and_no_ambiguous_answers(&self) {
        let sent = self.tap.sent();
        assert!(sent.iter().all(|s| s.kind != TRANSACTION_MANAGER), "a transaction-manager request was sent");
        for rpc in self.tap.rpcs() {
            assert_eq!(rpc.proc_id, SP_EXECUTESQL);
            assert!(!rpc.statement().to_uppercase().contains("SELECT 1"), "{}", rpc.statement());
        }
    }
}

/// One catalog row: name, type, max length, precision, scale, nullable, default, identity, generated, key.
type CatalogRow = (&'static str, &'static str, i32, i32, i32, bool, bool, bool, bool, Option<i32>);

fn catalog(rows: &[CatalogRow]) -> QueryResponse {
    let names = ["name", "type_name", "max_length", "precision", "scale", "is_nullable"];
    let flags = ["has_default", "is_identity", "is_generated", "key_ordinal"];
    let mut columns: Vec<Col> =
        names.iter().enumerate().map(|(i, n)| Col::new(*n, if i < 2 { T::NVarChar } else { T::Int })).collect();
    columns.extend(flags.iter().map(|n| Col::new(*n, T::Int)));
    let rows = rows
        .iter()
        .map(|(n, t, len, p, s, null, def, id, generated, key)| {
            let flag = |b: bool| V::Int(i32::from(b));
            Row::new(vec![
                V::NVarChar((*n).into()),
                V::NVarChar((*t).into()),
                V::Int(*len),
                V::Int(*p),
                V::Int(*s),
                flag(*null),
                flag(*def),
                flag(*id),
                flag(*generated),
                key.map(V::Int).unwrap_or(V::Null),
            ])
        })
        .collect();
    QueryResponse::new(columns, rows)
}

/// `[Sales Ünïcode].[Order]] Lines]` as the golden files know it: key (Id, Line), a reserved word, a quote,
/// a binary column.
const ORDER_LINES: &str = "[Sales Ünïcode].[Order]] Lines]";
const ORDER_LINES_COLUMNS: &[CatalogRow] = &[
    ("Id", "bigint", 8, 19, 0, false, false, false, false, Some(1)),
    ("Line", "int", 4, 10, 0, false, false, false, false, Some(2)),
    ("order", "nvarchar", 200, 0, 0, true, false, false, false, None),
    ("Qty \"x\"", "decimal", 9, 12, 2, true, false, false, false, None),
    ("Photo", "varbinary", -1, 0, 0, true, false, false, false, None),
];

/// The answer of a delivery: `status` (0 written, 1 fenced, 2 already applied) and the stored token.
fn status(status: i32, stored: Option<i64>) -> QueryResponse {
    QueryResponse::new(
        vec![Col::new("status", T::Int), Col::new("stored", T::BigInt)],
        vec![Row::new(vec![V::Int(status), stored.map(V::BigInt).unwrap_or(V::Null)])],
    )
}

fn change(op: Operation, item: &str) -> Change {
    Change::from_json(op, item.to_string()).expect("json")
}

async fn deliver(
    sink: &dyn Sink,
    batch_id: u64,
    fence: u64,
    changes: &[Change],
    range: Option<(&Value, &Value)>,
) -> Result<(), SinkError> {
    sink.deliver(&SinkBatch { app: "app", function: "F", batch_id, fence, changes, range }).await
}

// ---------------------------------------------------------------------------------------------------------------
// What the sink sends
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_delivery_is_one_request_holding_the_golden_batch_with_one_json_parameter_per_statement() {
    // GIVEN the golden table, an exactly-once sink writing two rows per statement, and a server that accepts
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    server.answer(DELIVERY, status(0, None)).await;
    let sink = server.sink(ORDER_LINES, json!({"exactlyOnce": true, "maxRowsPerStatement": 2}));
    let rows: Vec<String> =
        (1..=5).map(|i| format!(r#"{{"Id":{i},"Line":1,"order":"o{i}","Qty \"x\"":1.5,"Photo":"AQID"}}"#)).collect();
    let mut changes = vec![change(Operation::Delete, r#"{"Id":-1,"Line":1}"#)];
    changes.extend(rows.iter().map(|r| change(Operation::Insert, r)));

    // WHEN batch 7, range (null, [9,"x"]], is delivered under fencing token 3
    let (from, to) = (Value::Null, json!([9, "x"]));
    deliver(sink.as_ref(), 7, 3, &changes, Some((&from, &to))).await.expect("written");

    // THEN the sink read the catalog with the golden statement, created its tables with the golden batches,
    let rpcs = server.tap.rpcs();
    assert_eq!(rpcs[0].statement(), golden("catalog_columns.sql"));
    assert_eq!(rpcs[0].values(), vec![text(ORDER_LINES)]);
    assert_eq!(server.tap.batches(), vec![golden("create_fence.sql"), golden("create_checkpoint.sql")]);
    // AND wrote the batch in one request: the golden text, the fixed parameters, and one JSON array per
    // statement of at most two rows (the delete first), every item exactly as the source wrote it
    let deliveries = server.tap.deliveries();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(rpcs.len(), 2, "one catalog read and one delivery");
    assert_eq!(deliveries[0].statement(), golden("delivery_exactly_once_split.sql"));
    let json_array = |items: &[String]| text(&format!("[{}]", items.join(",")));
    assert_eq!(
        deliveries[0].values(),
        vec![
            text("app/F"),
            Wire::Int(3),
            Wire::Int(7),
            text("null"),
            text(r#"[9,"x"]"#),
            Wire::Int(6),
            text(r#"[{"Id":-1,"Line":1}]"#),
            json_array(&rows[0..2]),
            json_array(&rows[2..4]),
            json_array(&rows[4..5]),
        ]
    );
    server.assert_no_client_transactions_and_no_ambiguous_answers();
}

#[tokio::test]
async fn a_batch_larger_than_rows_per_statement_is_split_into_statements_of_1000_rows() {
    // GIVEN an at-least-once sink with the default of 1000 rows per statement
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    server.answer(DELIVERY, status(0, None)).await;
    let sink = server.sink(ORDER_LINES, json!({}));

    // WHEN a batch of 1001 key-only updates is delivered (a request of eleven 4 KiB packets), then again on
    // the same pooled connection
    let items: Vec<String> = (1..=1001).map(|i| format!(r#"{{"Id":{i},"Line":2}}"#)).collect();
    let changes: Vec<Change> = items.iter().map(|i| change(Operation::Update, i)).collect();
    deliver(sink.as_ref(), 1, 1, &changes, None).await.expect("written");
    deliver(sink.as_ref(), 1, 1, &changes, None).await.expect("written again on the same connection");

    // THEN each is the golden key-only delivery with its MERGE twice, for @P7 (1000 rows) and @P8 (the last)
    let key_only = golden("delivery_key_only.sql");
    let merge = key_only.lines().find(|l| l.starts_with("MERGE INTO")).expect("a MERGE line").to_string();
    let expected = key_only.replace(&merge, &format!("{merge}\n{}", merge.replace("@P7", "@P8")));
    let deliveries = server.tap.deliveries();
    assert_eq!(deliveries.len(), 2);
    assert_eq!(deliveries[0].statement(), expected);
    let values = deliveries[0].values();
    assert_eq!(values.len(), 8);
    assert_eq!(values[6], text(&format!("[{}]", items[..1000].join(","))));
    assert_eq!(values[7], text(&format!("[{}]", items[1000])));
    // AND without exactlyOnce no checkpoint table was created
    assert_eq!(server.tap.batches(), vec![golden("create_fence.sql")]);
    server.assert_no_client_transactions_and_no_ambiguous_answers();
}

// ---------------------------------------------------------------------------------------------------------------
// How the sink reads the server's answers
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_fence_refusal_is_fenced_with_both_tokens_and_an_already_applied_batch_is_success() {
    // GIVEN a server whose fence row holds token 9
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    server.answer(DELIVERY, status(1, Some(9))).await;
    let sink = server.sink(ORDER_LINES, json!({"exactlyOnce": true}));
    let changes = [change(Operation::Update, r#"{"Id":1,"Line":2}"#)];
    let (from, to) = (json!([1]), json!([2]));

    // WHEN a deposed owner (token 3) delivers, and later the batch turns out to be applied already
    let fenced = deliver(sink.as_ref(), 4, 3, &changes, Some((&from, &to))).await;
    server.answer(DELIVERY, status(2, Some(3))).await;
    let again = deliver(sink.as_ref(), 4, 3, &changes, Some((&from, &to))).await;

    // THEN the first is Fenced, naming both tokens, and the second succeeds (nothing was written again)
    assert!(matches!(fenced, Err(SinkError::Fenced { ours: 3, stored: 9 })), "{fenced:?}");
    assert!(again.is_ok(), "{again:?}");
    assert_eq!(server.tap.deliveries().len(), 2);
}

#[tokio::test]
async fn server_errors_are_transient_or_rejected_by_number_and_never_quote_a_value() {
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    let sink = server.sink(ORDER_LINES, json!({}));
    let changes = [change(Operation::Update, r#"{"Id":42,"Line":2}"#)];

    // A deadlock victim (1205) is reported as transient at once: the next tick is the retry, not the sink
    server
        .answer(
            DELIVERY,
            QueryResponse::error_only(TerminalError::new(
                1205,
                13,
                "Transaction (Process ID 52) was deadlocked on lock resources with another process and has been chosen as the deadlock victim. Rerun the transaction.",
            )),
        )
        .await;
    let e = deliver(sink.as_ref(), 1, 1, &changes, None).await.unwrap_err();
    assert!(matches!(e, SinkError::Transient(_)), "{e:?}");
    assert!(
        e.to_string().starts_with("SQL Server error 1205 while writing Sales Ünïcode.Order] Lines: Transaction (Process ID 52) was deadlocked"),
        "{e}"
    );
    assert_eq!(server.tap.deliveries().len(), 1, "the batch was sent once");

    // A constraint (547) is rejected with the server's message, which names the constraint and no value
    let check = "The MERGE statement conflicted with the CHECK constraint \"positive_line\". The conflict occurred in database \"appdb\", table \"Sales Ünïcode.Order] Lines\", column 'Line'.";
    server.answer(DELIVERY, QueryResponse::error_only(TerminalError::new(547, 16, check))).await;
    let e = deliver(sink.as_ref(), 1, 1, &changes, None).await.unwrap_err();
    assert!(matches!(e, SinkError::Rejected(_)), "{e:?}");
    assert_eq!(e.to_string(), format!("SQL Server error 547 while writing Sales Ünïcode.Order] Lines: {check}"));

    // A duplicate key (2627) and a conversion (245) quote the value: rejected without the server's message
    let duplicate = "Violation of PRIMARY KEY constraint 'PK_x'. Cannot insert duplicate key in object 'x'. The duplicate key value is (42, secret).";
    server.answer(DELIVERY, QueryResponse::error_only(TerminalError::new(2627, 14, duplicate))).await;
    let e = deliver(sink.as_ref(), 1, 1, &changes, None).await.unwrap_err();
    assert!(matches!(e, SinkError::Rejected(_)) && e.to_string().contains("violates a unique key"), "{e:?}");
    assert!(!e.to_string().contains("secret"), "{e}");
    let conversion = "Conversion failed when converting the nvarchar value 'secret' to data type int.";
    server.answer(DELIVERY, QueryResponse::error_only(TerminalError::new(245, 16, conversion))).await;
    let e = deliver(sink.as_ref(), 1, 1, &changes, None).await.unwrap_err();
    assert!(matches!(e, SinkError::Rejected(_)) && e.to_string().starts_with("SQL Server error 245:"), "{e:?}");
    assert!(!e.to_string().contains("secret"), "{e}");

    // AND each rejection dropped the cached table shape: the catalog was read again before each next write
    assert_eq!(server.tap.catalog_reads(), 3, "first use, then after each of the first two rejections");
    assert!(!format!("{sink:?}").contains("not-a-real-secret"), "the password never shows in Debug");
}

#[tokio::test]
async fn a_missing_table_and_a_table_without_primary_key_are_refused_with_what_to_do() {
    // No catalog answer: the mock returns no rows, as SQL Server does for a table that does not exist
    let server = Server::start().await;
    let e = deliver(server.sink("dbo.nope", json!({})).as_ref(), 1, 1, &[], None).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "sink table dbo.nope does not exist (or the login cannot see it); create it, or check the sink's tableName and grant the login access to it"
    );
    server.answer(CATALOG, catalog(&[("id", "bigint", 8, 19, 0, false, false, false, false, None)])).await;
    let e = deliver(server.sink("dbo.nokey", json!({})).as_ref(), 1, 1, &[], None).await.unwrap_err();
    assert!(
        e.to_string().contains("has no primary key")
            && e.to_string().contains("ALTER TABLE [dbo].[nokey] ADD PRIMARY KEY"),
        "{e}"
    );
}

#[tokio::test]
async fn what_the_sink_recorded_is_read_in_one_statement_with_the_fence_and_the_checkpoint_row() {
    // GIVEN a target whose fence row holds 4 and whose checkpoint row names batch 7, (null, [2,6]]
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    server
        .answer(
            RESUME,
            QueryResponse::new(
                vec![
                    Col::new("fence", T::BigInt),
                    Col::new("batch_id", T::BigInt),
                    Col::new("from_position", T::NVarCharMax),
                    Col::new("to_position", T::NVarCharMax),
                ],
                vec![Row::new(vec![
                    V::BigInt(4),
                    V::BigInt(7),
                    V::NVarCharMax(vec!["null".encode_utf16().collect()]),
                    V::NVarCharMax(vec!["[2,6]".encode_utf16().collect()]),
                ])],
            ),
        )
        .await;
    let sink = server.sink(ORDER_LINES, json!({"exactlyOnce": true}));

    // WHEN sink mode asks
    let resume = sink.resume_position("app", "F").await.expect("answered");

    // THEN it is the golden statement for app/F, read as the fence and the applied batch
    let asked: Vec<Rpc> = server.tap.rpcs().into_iter().filter(|r| r.statement().contains(RESUME)).collect();
    assert_eq!(asked.len(), 1);
    assert_eq!(asked[0].statement(), golden("resume_exactly_once.sql"));
    assert_eq!(asked[0].values(), vec![text("app/F")]);
    assert_eq!(
        resume,
        Some(Resume { fence: 4, applied: Some(Applied { batch_id: 7, from: Value::Null, to: json!([2, 6]) }) })
    );
}

// ---------------------------------------------------------------------------------------------------------------
// The engine in sink mode, over the wire
// ---------------------------------------------------------------------------------------------------------------

fn sink_mode_function(server: &Server) -> FunctionConfig {
    let settings = TriggerSettings {
        polling_interval: Duration::from_millis(5),
        max_attempts: 3,
        delivery_mode: DeliveryMode::Sink,
        ..testbed::config::settings()
    };
    let env = Env::from_pairs([("SqlConnectionString".to_string(), server.connection_string())]);
    let sqltrigger = json!({ "tableName": "dbo.orders", "connectionStringSetting": "SqlConnectionString" });
    FunctionConfig {
        source: SourceSpec::from_json(&sqltrigger, &env).expect("a valid sqltrigger.json"),
        ..testbed::config::function("F", settings)
    }
}

#[tokio::test]
async fn a_sink_mode_tick_without_state_resumes_after_the_checkpoint_row_and_writes_under_a_newer_token() {
    // GIVEN rows 1-8 in three transactions, and a target whose checkpoint row says rows up to [2,6] (the
    // second transaction) were applied as batch 7 under fencing token 4, while the state document is lost
    let server = Server::start().await;
    server
        .answer(
            CATALOG,
            catalog(&[
                ("id", "bigint", 8, 19, 0, false, false, false, false, Some(1)),
                ("v", "bigint", 8, 19, 0, true, false, false, false, None),
            ]),
        )
        .await;
    server
        .answer(
            RESUME,
            QueryResponse::new(
                vec![
                    Col::new("fence", T::BigInt),
                    Col::new("batch_id", T::BigInt),
                    Col::new("from_position", T::NVarChar),
                    Col::new("to_position", T::NVarChar),
                ],
                vec![Row::new(vec![
                    V::BigInt(4),
                    V::BigInt(7),
                    V::NVarChar("[1,3]".into()),
                    V::NVarChar("[2,6]".into()),
                ])],
            ),
        )
        .await;
    server.answer(DELIVERY, status(0, None)).await;
    let source = Arc::new(MemorySource::new());
    source.upsert(1..=3, 1);
    source.upsert(4..=6, 2);
    source.upsert(7..=8, 3);
    let sink = server.sink("dbo.orders_copy", json!({"exactlyOnce": true}));
    let store = Arc::new(MemoryStore::new());
    let trigger = Trigger::new(sink_mode_function(&server), "app", source, store, "owner-1".into());

    // WHEN one sink-mode tick runs
    let out = trigger.tick_into(sink.as_ref()).await.expect("tick");

    // THEN it wrote only rows 7-8, as batch 8 after [2,6], under token 5, and acknowledged them
    assert_eq!((out.kind, out.batch_id), (OutcomeKind::Delivered, Some(8)));
    let deliveries = server.tap.deliveries();
    assert_eq!(deliveries.len(), 1);
    assert_eq!(
        deliveries[0].values(),
        vec![
            text("app/F"),
            Wire::Int(5),
            Wire::Int(8),
            text("[2,6]"),
            text("[3,8]"),
            Wire::Int(2),
            text(r#"[{"id":7,"v":3},{"id":8,"v":3}]"#),
        ]
    );
    let (doc, _) = trigger.load().await.expect("load").expect("state written");
    assert_eq!((doc.checkpoint, doc.in_flight.is_none(), doc.counters.delivered), (json!([3, 8]), true, 2));
    server.assert_no_client_transactions_and_no_ambiguous_answers();
}
