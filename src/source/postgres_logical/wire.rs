//! The client side of PostgreSQL's streaming replication protocol, only as much as a logical stream needs:
//! start-up with `replication=database`, TLS through the handler's own connector (`PostgresTls`, so the same
//! certificates are trusted as everywhere else), password, MD5 and SCRAM-SHA-256(-PLUS) authentication
//! (`postgres-protocol`'s SCRAM, the one tokio-postgres uses), `START_REPLICATION SLOT … LOGICAL`, and the
//! CopyBoth messages: XLogData (`w`) and keepalives (`k`) in, standby status updates (`r`) out.
//!
//! Why not a crate: tokio-postgres has no replication protocol; `pgwire-replication` brings its own TLS
//! configuration (webpki roots and certificate files, not our verifier and settings) and `pg_walstream`'s TLS
//! needs aws-lc-rs or libpq. What is here is a few hundred lines over crates the tree already has.
//!
//! Layouts: PostgreSQL's "Frontend/Backend Protocol" and "Streaming Replication Protocol" chapters.

use super::pgoutput::POSTGRES_EPOCH;
use super::position::Lsn;
use crate::db::postgres::PostgresTls;
use bytes::{Buf, BufMut, BytesMut};
use postgres_protocol::authentication::{md5_hash, sasl};
use postgres_protocol::message::frontend;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_postgres::config::{ChannelBinding, Host, SslMode};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::Config;

/// The largest message accepted: a row of pgoutput text values can be large (1 GB fields), but not larger.
const MAX_MESSAGE: usize = 1 << 30;

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Why the connection failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum WireError {
    /// The server said no: its SQLSTATE and message.
    Server { code: String, message: String },
    /// The connection broke or could not be made; the next attempt may work.
    Broken(String),
    /// Only an operator can fix it (TLS, an authentication method, the connection string).
    Misconfigured(String),
}

impl From<std::io::Error> for WireError {
    fn from(e: std::io::Error) -> Self {
        WireError::Broken(format!("the replication connection broke: {e}"))
    }
}

/// One message from the server.
#[derive(Debug)]
pub(super) struct Backend {
    pub tag: u8,
    pub body: BytesMut,
}

/// A replication connection.
pub(super) struct Wire {
    io: Box<dyn Io>,
    buf: BytesMut,
    out: BytesMut,
    /// The server process serving it: what `pg_replication_slots.active_pid` shows while it streams.
    pub pid: i32,
    /// The TLS session's `tls-server-end-point`, for SCRAM-SHA-256-PLUS.
    end_point: Option<Vec<u8>>,
}

impl std::fmt::Debug for Wire {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Wire(pid {})", self.pid)
    }
}

impl Wire {
    /// Connects to the first host of `config` that answers, and logs in as a replication connection with the
    /// `session` settings (name, value) besides its own.
    pub async fn connect(
        config: &Config,
        tls: &PostgresTls,
        application_name: &str,
        session: &[(&str, &str)],
    ) -> Result<Self, WireError> {
        let timeout = config.get_connect_timeout().copied().unwrap_or(Duration::from_secs(10));
        let ports = config.get_ports();
        let mut last = WireError::Misconfigured("the connection string names no host".into());
        for (i, host) in config.get_hosts().iter().enumerate() {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            let attempt = async {
                let (io, end_point) = open(config, tls, host, i, port).await?;
                let mut wire =
                    Wire { io, buf: BytesMut::with_capacity(64 << 10), out: BytesMut::new(), pid: 0, end_point };
                wire.login(config, application_name, session).await?;
                Ok::<_, WireError>(wire)
            };
            match tokio::time::timeout(timeout, attempt).await {
                Ok(Ok(wire)) => return Ok(wire),
                Ok(Err(e @ (WireError::Server { .. } | WireError::Misconfigured(_)))) => return Err(e),
                Ok(Err(e)) => last = e,
                Err(_) => {
                    last = WireError::Broken(format!("no answer within {} s (connect_timeout)", timeout.as_secs()))
                }
            }
        }
        Err(last)
    }

    async fn login(
        &mut self,
        config: &Config,
        application_name: &str,
        session: &[(&str, &str)],
    ) -> Result<(), WireError> {
        let user =
            config.get_user().ok_or_else(|| WireError::Misconfigured("the connection string names no user".into()))?;
        let database = config.get_dbname().unwrap_or(user);
        let params = [
            ("user", user),
            ("database", database),
            ("application_name", application_name),
            ("replication", "database"),
            ("client_encoding", "UTF8"),
        ];
        // The connection string's options with the session contract after them (`db::postgres::session`): the
        // walsender writes every value of the stream with its output functions, under these settings.
        let options = config.get_options().map(|o| ("options", o));
        frontend::startup_message(params.iter().copied().chain(options).chain(session.iter().copied()), &mut self.out)?;
        self.flush().await?;
        let password = config.get_password();
        let need_password = || {
            password.ok_or_else(|| {
                WireError::Misconfigured("the server asks for a password, and the connection string has none".into())
            })
        };
        let mut scram: Option<sasl::ScramSha256> = None;
        loop {
            let m = self.read().await?;
            match m.tag {
                b'R' => {
                    let mut body = m.body;
                    let code = body.try_get_i32().map_err(|_| bad("an authentication request"))?;
                    match code {
                        0 => {}
                        3 => {
                            let mut p = need_password()?.to_vec();
                            p.push(0);
                            frontend::password_message(&p, &mut self.out)?;
                            self.flush().await?;
                        }
                        5 => {
                            let salt: [u8; 4] = body.get(..4).and_then(|s| s.try_into().ok()).ok_or_else(|| bad("an MD5 salt"))?;
                            let hash = md5_hash(user.as_bytes(), need_password()?, salt);
                            frontend::password_message(format!("{hash}\0").as_bytes(), &mut self.out)?;
                            self.flush().await?;
                        }
                        10 => {
                            let offered: Vec<&[u8]> = body[..].split(|b| *b == 0).filter(|m| !m.is_empty()).collect();
                            let plus = offered.contains(&&b"SCRAM-SHA-256-PLUS"[..]);
                            let (mechanism, binding) = match (self.end_point.clone(), config.get_channel_binding()) {
                                (Some(ep), ChannelBinding::Prefer | ChannelBinding::Require) if plus => {
                                    ("SCRAM-SHA-256-PLUS", sasl::ChannelBinding::tls_server_end_point(ep))
                                }
                                (_, ChannelBinding::Require) => {
                                    return Err(WireError::Misconfigured("channel_binding=require, but the server or the TLS session offers no SCRAM-SHA-256-PLUS".into()))
                                }
                                (Some(_), _) => ("SCRAM-SHA-256", sasl::ChannelBinding::unrequested()),
                                (None, _) => ("SCRAM-SHA-256", sasl::ChannelBinding::unsupported()),
                            };
                            if !offered.contains(&mechanism.as_bytes()) {
                                return Err(WireError::Misconfigured("the server offers no SASL mechanism this client speaks (SCRAM-SHA-256)".into()));
                            }
                            let s = sasl::ScramSha256::new(need_password()?, binding);
                            frontend::sasl_initial_response(mechanism, s.message(), &mut self.out)?;
                            self.flush().await?;
                            scram = Some(s);
                        }
                        11 | 12 => {
                            let s = scram.as_mut().ok_or_else(|| bad("a SASL message before SASL began"))?;
                            if code == 11 {
                                s.update(&body).map_err(|e| WireError::Misconfigured(format!("SCRAM: {e}")))?;
                                frontend::sasl_response(s.message(), &mut self.out)?;
                                self.flush().await?;
                            } else {
                                s.finish(&body).map_err(|e| WireError::Misconfigured(format!("SCRAM: the server's proof failed ({e})")))?;
                            }
                        }
                        other => {
                            return Err(WireError::Misconfigured(format!(
                                "the server asks for authentication method {other}, which the replication connection does not speak; use scram-sha-256 (or md5, password) in pg_hba.conf for replication connections"
                            )))
                        }
                    }
                }
                b'K' => self.pid = m.body.clone().try_get_i32().unwrap_or(0),
                b'E' => return Err(server_error(&m.body)),
                b'Z' => return Ok(()),
                _ => {}
            }
        }
    }

    /// `START_REPLICATION SLOT … LOGICAL` at `at`: pgoutput protocol 1 over `publication`.
    pub async fn start(&mut self, slot: &str, publication: &str, at: Lsn) -> Result<(), WireError> {
        // Both names are [a-z0-9_] (options), so they are written as they are.
        let command = format!(
            "START_REPLICATION SLOT {slot} LOGICAL {at} (proto_version '1', publication_names '\"{publication}\"')"
        );
        frontend::query(&command, &mut self.out)?;
        self.flush().await?;
        loop {
            let m = self.read().await?;
            match m.tag {
                b'W' => return Ok(()),
                b'E' => return Err(server_error(&m.body)),
                _ => {}
            }
        }
    }

    /// A standby status update: `flush` as written, flushed and applied; `reply` asks for a keepalive back.
    pub async fn status(&mut self, flush: Lsn, reply: bool) -> Result<(), WireError> {
        let micros = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_micros() as i64)
            - POSTGRES_EPOCH * 1_000_000;
        let mut body = BytesMut::with_capacity(34);
        body.put_u8(b'r');
        for _ in 0..3 {
            body.put_u64(flush.0);
        }
        body.put_i64(micros);
        body.put_u8(u8::from(reply));
        self.out.put_u8(b'd');
        self.out.put_i32(4 + body.len() as i32);
        self.out.extend_from_slice(&body);
        self.flush().await
    }

    /// Ends the session politely (Terminate); the server releases the slot.
    pub async fn close(mut self) {
        frontend::terminate(&mut self.out);
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            let _ = self.flush().await;
            let _ = self.io.shutdown().await;
        })
        .await;
    }

    async fn flush(&mut self) -> Result<(), WireError> {
        let out = self.out.split();
        self.io.write_all(&out).await?;
        self.io.flush().await?;
        Ok(())
    }

    /// The next message from the server. Cancel-safe: a read cut short keeps what arrived for the next call.
    pub async fn read(&mut self) -> Result<Backend, WireError> {
        loop {
            if let Some(m) = self.next_buffered()? {
                return Ok(m);
            }
            if self.io.read_buf(&mut self.buf).await? == 0 {
                return Err(WireError::Broken("the server closed the replication connection".into()));
            }
        }
    }

    /// A message already received whole, if any.
    pub fn next_buffered(&mut self) -> Result<Option<Backend>, WireError> {
        if self.buf.len() < 5 {
            return Ok(None);
        }
        let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]);
        let len = usize::try_from(len)
            .ok()
            .filter(|l| (4..=MAX_MESSAGE).contains(l))
            .ok_or_else(|| bad("a message length"))?;
        if self.buf.len() < 1 + len {
            self.buf.reserve(1 + len - self.buf.len());
            return Ok(None);
        }
        let mut m = self.buf.split_to(1 + len);
        let tag = m[0];
        m.advance(5);
        Ok(Some(Backend { tag, body: m }))
    }
}

/// The socket to `host` (TLS as `sslmode` says; Unix sockets never use TLS, as with libpq), and the TLS
/// session's channel binding data.
type Opened = (Box<dyn Io>, Option<Vec<u8>>);

async fn open(config: &Config, tls: &PostgresTls, host: &Host, i: usize, port: u16) -> Result<Opened, WireError> {
    let name = match host {
        Host::Tcp(name) => name.clone(),
        #[cfg(unix)]
        Host::Unix(dir) => {
            let path = dir.join(format!(".s.PGSQL.{port}"));
            return Ok((Box::new(tokio::net::UnixStream::connect(path).await?), None));
        }
    };
    let tcp = match config.get_hostaddrs().get(i) {
        Some(addr) => tokio::net::TcpStream::connect((*addr, port)).await?,
        None => tokio::net::TcpStream::connect((name.as_str(), port)).await?,
    };
    tcp.set_nodelay(true)?;
    let mode = config.get_ssl_mode();
    if matches!(mode, SslMode::Disable) {
        return Ok((Box::new(tcp), None));
    }
    let mut tcp = tcp;
    let mut request = BytesMut::new();
    frontend::ssl_request(&mut request);
    tcp.write_all(&request).await?;
    let answer = tcp.read_u8().await?;
    if answer != b'S' {
        if matches!(mode, SslMode::Require) {
            return Err(WireError::Misconfigured(
                "the server does not support TLS, but the connection string requires it (sslmode=require, verify-ca or verify-full); turn TLS on at the server, or lower sslmode to prefer where a plaintext connection is acceptable".into(),
            ));
        }
        return Ok((Box::new(tcp), None));
    }
    let mut maker = tls.clone();
    let connect = MakeTlsConnect::<tokio::net::TcpStream>::make_tls_connect(&mut maker, &name)
        .map_err(|e| WireError::Misconfigured(e.to_string()))?;
    let stream = connect.connect(tcp).await.map_err(|e| {
        let text = format!("cannot open the replication connection: {e}");
        if e.needs_operator() {
            WireError::Misconfigured(text)
        } else {
            WireError::Broken(text)
        }
    })?;
    let end_point = stream.server_end_point();
    Ok((Box::new(stream), end_point))
}

fn bad(what: &str) -> WireError {
    WireError::Broken(format!("the server sent an unreadable {what} on the replication connection"))
}

/// An ErrorResponse's SQLSTATE and message.
pub(super) fn server_error(body: &[u8]) -> WireError {
    let (mut code, mut message, mut detail) = (String::new(), String::new(), String::new());
    let mut rest = body;
    while let Some((&field, tail)) = rest.split_first() {
        if field == 0 {
            break;
        }
        let end = tail.iter().position(|b| *b == 0).unwrap_or(tail.len());
        let text = String::from_utf8_lossy(&tail[..end]).into_owned();
        match field {
            b'C' => code = text,
            b'M' => message = text,
            b'D' => detail = format!(" ({text})"),
            _ => {}
        }
        rest = tail.get(end + 1..).unwrap_or_default();
    }
    WireError::Server { code, message: format!("{message}{detail}") }
}
