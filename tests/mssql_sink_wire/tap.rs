//! The mock TDS server behind a tap that records what the client sends and makes the mock strict.
//!
//! `mssql-mock-tds` has three limits this file works around, so the tests can trust what they read:
//! - it records neither statements nor parameters: the tap records every message the client sends, and
//!   [`decode_rpc`] / [`decode_batch`] read statements and parameters back from those bytes;
//! - it answers a statement nobody registered with an empty result, which a sink could read as a plausible
//!   answer. The tap answers such a request itself, with an error, and [`Server`]'s `Drop` fails the test
//!   that sent it (as does an RPC that matches two registrations: the mock would pick one at random);
//! - it answers every TDS packet as a whole request (its packet size is 4096 bytes), so a request split
//!   across packets would be answered once per packet, the extra answers read as the answers to the next
//!   requests. The tap forwards the packets as tiberius sent them and passes back only the answer to the
//!   first, the packet the mock matched a registration in (an RPC's statement begins there).
//!
//! A connection's first request must be the session batch (`src/db/mssql/session.rs`): the tap refuses any
//! other, as it refuses an unregistered one.
//!
//! The mock picks its answer by finding a registered upper-case text inside an RPC's first packet, or as
//! the whole text of a SQL batch; the tap applies the same rule to decide whether a request was registered.
pub use crate::tds_reader::Wire;
use crate::tds_reader::{decode_rpc_after_headers, Reader};

use mssql_mock_tds::{MockTdsServer, QueryResponse, TerminalError};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

/// TDS message types (MS-TDS 2.2.3.1.1).
pub const SQL_BATCH: u8 = 0x01;
pub const RPC: u8 = 0x03;
pub const TRANSACTION_MANAGER: u8 = 0x0E;
/// `sp_executesql`'s well-known procedure id.
pub const SP_EXECUTESQL: u16 = 10;
/// What the mock registers by itself (`QueryRegistry::new`): a request matching one of these as well as a
/// test's registration would be answered by either.
const MOCK_DEFAULTS: [&str; 2] = ["SELECT 1", "SELECT CAST(1 AS BIGINT), 2, 3"];

/// One message the client sent: its type and its packets' payloads joined.
#[derive(Debug, Clone)]
pub struct Sent {
    pub kind: u8,
    pub payload: Vec<u8>,
    /// Which connection sent it (the tap numbers them as it accepts them, from 0).
    pub connection: usize,
    /// Whether it was its connection's first request (which must be the session batch).
    pub opening: bool,
}

pub fn text(s: &str) -> Wire {
    Wire::Text(s.to_string())
}

/// An RPC request: procedure id, and its parameters by name in order.
#[derive(Debug, Clone)]
pub struct Rpc {
    pub proc_id: u16,
    pub params: Vec<(String, Wire)>,
}

impl Rpc {
    pub fn statement(&self) -> &str {
        match &self.params[0] {
            (name, Wire::Text(s)) if name == "stmt" => s,
            other => panic!("sp_executesql's first parameter is the statement, not {other:?}"),
        }
    }

    /// `@P1`, `@P2`, ...: the statement's own parameters, after `stmt` and `params`.
    pub fn values(&self) -> Vec<Wire> {
        self.params.iter().skip(2).map(|(_, v)| v.clone()).collect()
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

/// Decodes an RPC request as tiberius encodes `sp_executesql` (IntN and NVarChar values, short or PLP; the sink
/// never sends binary parameters, so one fails the test).
pub fn decode_rpc(payload: &[u8]) -> Rpc {
    let mut r = Reader(payload);
    skip_all_headers(&mut r);
    let (proc_id, params) =
        decode_rpc_after_headers(r).unwrap_or_else(|why| panic!("an RPC the tap cannot read: {why}"));
    if let Some((name, _)) = params.iter().find(|(_, v)| matches!(v, Wire::Bytes(_))) {
        panic!("parameter {name} is binary, which the sink never sends");
    }
    Rpc { proc_id, params }
}

pub fn decode_batch(payload: &[u8]) -> String {
    let mut r = Reader(payload);
    skip_all_headers(&mut r);
    let rest = r.0.len();
    r.utf16(rest)
}

/// What the tap knows of the registrations, and the requests none of them answers.
#[derive(Debug, Default)]
struct Registrations {
    /// Upper-cased registered texts, as the mock keys them.
    keys: Vec<String>,
    /// One line per request no registration (or more than one) answers; each fails the test.
    unanswered: Vec<String>,
}

impl Registrations {
    fn add(&mut self, text: &str) {
        let key = text.to_uppercase();
        if !self.keys.contains(&key) {
            self.keys.push(key);
        }
    }

    /// Why a connection's first request is refused, if it is: anything but the session batch
    /// (`tests/golden/mssql_session/session.sql`), which the mock answers with no result set, as SQL Server
    /// answers `SET`s.
    fn refuses_opening(&self, kind: u8, payload: &[u8]) -> Option<String> {
        let sql = match kind {
            SQL_BATCH => decode_batch(payload),
            RPC => decode_rpc(payload).statement().chars().take(200).collect(),
            _ => return None,
        };
        let session = kind == SQL_BATCH && sql == crate::tds_reader::session_batch();
        (!session).then(|| format!("a connection whose first request was not the session batch: {sql}"))
    }

    /// Why the mock could not answer this request with exactly one registration, if it could not.
    /// `first` is the payload of the message's first packet, the only one the mock matches an RPC in.
    fn refuses(&self, kind: u8, packets: usize, payload: &[u8], first: &[u8]) -> Option<String> {
        match kind {
            SQL_BATCH => {
                let sql = decode_batch(payload);
                let registered = packets == 1 && self.keys.contains(&sql.to_uppercase());
                (!registered).then(|| format!("a SQL batch nobody registered: {sql}"))
            }
            RPC => {
                let utf16 = |s: &str| -> Vec<u8> { s.encode_utf16().flat_map(u16::to_le_bytes).collect() };
                let matches: Vec<&str> = self
                    .keys
                    .iter()
                    .map(String::as_str)
                    .chain(MOCK_DEFAULTS)
                    .filter(|k| {
                        let needle = utf16(k);
                        first.windows(needle.len()).any(|w| w == needle)
                    })
                    .collect();
                let head = || {
                    let statement = decode_rpc(payload).statement().to_string();
                    statement.chars().take(200).collect::<String>()
                };
                match matches.as_slice() {
                    [_] => None,
                    [] => Some(format!("an RPC nobody registered (none in its first packet): {}...", head())),
                    many => Some(format!("an RPC two registrations match ({many:?}): {}...", head())),
                }
            }
            _ => None,
        }
    }
}

/// Forwards TDS between a client and the mock (see the module docs).
pub struct Tap {
    pub port: u16,
    sent: Arc<Mutex<Vec<Sent>>>,
    registrations: Arc<Mutex<Registrations>>,
}

impl Tap {
    async fn start(upstream: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("tap binds");
        let port = listener.local_addr().expect("tap address").port();
        let sent = Arc::new(Mutex::new(Vec::new()));
        let registrations = Arc::new(Mutex::new(Registrations::default()));
        let (record, known) = (sent.clone(), registrations.clone());
        tokio::spawn(async move {
            let mut connection = 0;
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(Self::pipe(client, connection, upstream, record.clone(), known.clone()));
                connection += 1;
            }
        });
        Self { port, sent, registrations }
    }

    /// Reads one packet: its header and its body.
    async fn packet(from: &mut OwnedReadHalf) -> Option<([u8; 8], Vec<u8>)> {
        let mut header = [0u8; 8];
        from.read_exact(&mut header).await.ok()?;
        let length = usize::from(u16::from_be_bytes([header[2], header[3]]));
        let mut body = vec![0u8; length - 8];
        from.read_exact(&mut body).await.ok()?;
        Some((header, body))
    }

    async fn pipe(
        client: TcpStream,
        connection: usize,
        upstream: u16,
        sent: Arc<Mutex<Vec<Sent>>>,
        registrations: Arc<Mutex<Registrations>>,
    ) {
        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else { return };
        let (mut from_client, to_client) = client.into_split();
        let (from_server, mut to_server) = server.into_split();
        let to_client = Arc::new(tokio::sync::Mutex::new(to_client));
        // How many packets each forwarded message had, so as many answers come back for it.
        let (expect, answers) = mpsc::unbounded_channel::<usize>();
        tokio::spawn(Self::answers(from_server, to_client.clone(), answers));
        // Whether this connection sent its first request yet: that one must be the session batch.
        let mut opened = false;
        loop {
            let mut packets = Vec::new();
            let mut payload = Vec::new();
            loop {
                let Some((header, body)) = Self::packet(&mut from_client).await else { return };
                payload.extend_from_slice(&body);
                let last = header[1] & 0x01 != 0;
                packets.push((header, body));
                if last {
                    break;
                }
            }
            let kind = packets[0].0[0];
            let opening = !opened && matches!(kind, SQL_BATCH | RPC);
            opened |= opening;
            sent.lock().expect("tap record").push(Sent { kind, payload: payload.clone(), connection, opening });
            let refused = {
                let known = registrations.lock().expect("registrations");
                if opening {
                    known.refuses_opening(kind, &payload)
                } else {
                    known.refuses(kind, packets.len(), &payload, &packets[0].1)
                }
            };
            if let Some(why) = refused {
                registrations.lock().expect("registrations").unanswered.push(why);
                let error =
                    mssql_mock_tds::protocol::build_query_result(&QueryResponse::error_only(TerminalError::new(
                        50000,
                        16,
                        "no answer is registered for this request (tests/mssql_sink_wire.rs is strict)",
                    )));
                if to_client.lock().await.write_all(&error).await.is_err() {
                    return;
                }
                continue;
            }
            if expect.send(packets.len()).is_err() {
                return;
            }
            for (header, body) in packets {
                if to_server.write_all(&header).await.is_err() || to_server.write_all(&body).await.is_err() {
                    return;
                }
            }
        }
    }

    /// Passes the mock's answer to the first packet of each message back, and drops its answers to the
    /// others.
    async fn answers(
        mut from_server: OwnedReadHalf,
        to_client: Arc<tokio::sync::Mutex<OwnedWriteHalf>>,
        mut expect: mpsc::UnboundedReceiver<usize>,
    ) {
        while let Some(packets) = expect.recv().await {
            for n in 0..packets {
                let mut answer = Vec::new();
                loop {
                    let Some((header, body)) = Self::packet(&mut from_server).await else { return };
                    answer.extend_from_slice(&header);
                    answer.extend_from_slice(&body);
                    if header[1] & 0x01 != 0 {
                        break;
                    }
                }
                if n == 0 && to_client.lock().await.write_all(&answer).await.is_err() {
                    return;
                }
            }
        }
    }

    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().expect("tap record").clone()
    }

    pub fn rpcs(&self) -> Vec<Rpc> {
        self.sent().iter().filter(|s| s.kind == RPC).map(|s| decode_rpc(&s.payload)).collect()
    }

    /// The RPCs whose statement contains `fragment`.
    pub fn rpcs_with(&self, fragment: &str) -> Vec<Rpc> {
        self.rpcs().into_iter().filter(|r| r.statement().contains(fragment)).collect()
    }

    /// The SQL batches sent, but for each connection's opening session batch.
    pub fn batches(&self) -> Vec<String> {
        let batches = self.sent().into_iter().filter(|s| s.kind == SQL_BATCH && !s.opening);
        batches.map(|s| decode_batch(&s.payload)).collect()
    }

    /// Each connection's first request, in the order the connections opened: `(connection, statement)`.
    pub fn openings(&self) -> Vec<(usize, String)> {
        let mut openings: Vec<(usize, String)> = self
            .sent()
            .into_iter()
            .filter(|s| s.opening)
            .map(|s| {
                let statement = match s.kind {
                    SQL_BATCH => decode_batch(&s.payload),
                    _ => decode_rpc(&s.payload).statement().to_string(),
                };
                (s.connection, statement)
            })
            .collect();
        openings.sort();
        openings
    }

    /// How many connections the tap accepted.
    pub fn connections(&self) -> usize {
        self.sent().iter().map(|s| s.connection + 1).max().unwrap_or(0)
    }
}

/// A mock TDS server behind a tap; dropped, the mock shuts down, and the test fails if any request it
/// was sent had no registered answer.
pub struct Server {
    pub tap: Tap,
    registry: Arc<tokio::sync::Mutex<mssql_mock_tds::QueryRegistry>>,
    _stop: oneshot::Sender<()>,
}

impl Server {
    pub async fn start() -> Self {
        let mock = MockTdsServer::new("127.0.0.1:0").await.expect("mock server binds");
        let registry = mock.query_registry();
        let tap = Tap::start(mock.local_addr().port()).await;
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(async move {
            let _ = mock.run_with_shutdown(stopped).await;
        });
        Self { tap, registry, _stop: stop }
    }

    pub fn connection_string(&self) -> String {
        format!(
            "Server=tcp:127.0.0.1,{};Database=appdb;User ID=func;Password=not-a-real-secret;Encrypt=DANGER_PLAINTEXT;Connect Timeout=5;ConnectRetryCount=1",
            self.tap.port
        )
    }

    /// Answers RPCs whose first packet contains `fragment` (upper case, as the mock matches it), and a SQL
    /// batch whose whole text is `fragment`, with `response`. A second call with the same text replaces
    /// the answer.
    pub async fn answer(&self, fragment: &str, response: QueryResponse) {
        self.registry.lock().await.register(fragment, response);
        self.tap.registrations.lock().expect("registrations").add(fragment);
    }

    /// Accepts the SQL batch whose whole text is `batch`, answered with no result set: what SQL Server
    /// answers a batch of DDL, and what the mock answers a batch it holds no response for (DONE only).
    pub fn answer_without_rows(&self, batch: &str) {
        self.tap.registrations.lock().expect("registrations").add(batch);
    }

    /// The requests nobody registered an answer for, so far.
    pub fn unanswered(&self) -> Vec<String> {
        self.tap.registrations.lock().expect("registrations").unanswered.clone()
    }

    /// The requests nobody registered an answer for, taken: a test that sent them on purpose says so.
    pub fn take_unanswered(&self) -> Vec<String> {
        std::mem::take(&mut self.tap.registrations.lock().expect("registrations").unanswered)
    }

    /// Every message sent so far was a login, a plain batch or an RPC in autocommit mode; none asked for a
    /// transaction, and every RPC was `sp_executesql`.
    pub fn assert_no_client_transactions(&self) {
        let sent = self.tap.sent();
        assert!(sent.iter().all(|s| s.kind != TRANSACTION_MANAGER), "a transaction-manager request was sent");
        for rpc in self.tap.rpcs() {
            assert_eq!(rpc.proc_id, SP_EXECUTESQL);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let unanswered = self.unanswered();
        if !unanswered.is_empty() && !std::thread::panicking() {
            panic!("the mock is strict: {} request(s) had no registered answer: {unanswered:#?}", unanswered.len());
        }
    }
}
