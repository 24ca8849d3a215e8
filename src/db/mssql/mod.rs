//! Connections to SQL Server / Azure SQL: Entra ID tokens for managed identity, a small pool, and the one
//! table that decides which failures pass by waiting. The connection string is read in `connection_string`;
//! every connection sends the session batch of `session` after login, before its first statement.
//!
//! Why an own pool: bb8-tiberius and deadpool-tiberius pin tiberius 0.12. This one is a semaphore (at most
//! `Sql_Trigger_MaxConnectionsPerDatabase` connections, shared through `db::pools` by every source and sink of
//! one connection string in the process) over a stack of idle clients. A client that saw any error is dropped, never
//! reused: after a timeout or a broken stream tiberius' connection is out of step with the server. Idle
//! clients older than [`MAX_IDLE`] are dropped too: Azure's load balancers silently cut connections that
//! stay idle for about four minutes.
//!
//! A failed statement is not retried here: it fails the tick at once, worded by [`describe`] and marked
//! transient or not by [`is_transient`], and the tick's caller retries (the host's next firing, or `handler
//! run`'s outage loop). A statement that waited out a 30-second failover inside one invocation would only
//! spend the invocation's time. The one exception is a pooled connection found dead when reused (cut while
//! idle, or the server restarted): it is replaced by a fresh one, at most `ConnectRetryCount` times, as
//! ADO.NET's idle connection resiliency does. That repeats a statement whose connection broke, so every
//! caller's statements must be single reads or atomic, idempotent batches (the sink's delivery is one
//! transaction under `XACT_ABORT`, fenced and optionally exactly once).

pub(crate) mod connection_string;
pub mod session;

pub use connection_string::{Auth, Settings};

use azure_core::credentials::TokenCredential;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiberius::{AuthMethod, Client, Query, Row};
use tokio::net::TcpStream;
use tokio::sync::{OnceCell, Semaphore};
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

pub const MAX_IDLE: Duration = Duration::from_secs(180);
/// Fresh connections that may replace a dead pooled one when `ConnectRetryCount` is not set: ADO.NET's
/// default (`SqlConnectionStringBuilder.ConnectRetryCount`, "Default is 1").
pub const DEFAULT_RECONNECTS: u32 = 1;
/// Azure SQL's scope for Entra ID tokens in the public cloud (`Settings::token_scope` picks the server's cloud).
pub const TOKEN_SCOPE: &str = "https://database.windows.net/.default";
/// Azure SQL redirects a login to the node that hosts the database (the Redirect connection policy).
const MAX_REDIRECTS: usize = 2;

type Tds = Client<Compat<TcpStream>>;

/// Why a statement failed, before its caller words it.
#[derive(Debug)]
pub enum Failure {
    Tds(tiberius::error::Error),
    /// Connecting (TCP) took longer than the connect timeout, or the address did not resolve.
    Connect(String),
    /// No Entra ID token.
    Token(String),
}

/// SQL Server and Azure SQL error numbers that a retry can fix. Sources, so each can be checked: SqlClient's
/// `SqlConfigurableRetryFactory` baseline list, EF Core's `SqlServerTransientExceptionDetector`, and Azure SQL's
/// "List of transient fault error codes" (troubleshoot-common-errors-issues).
/// - locks: 1204 (no lock resource now), 1205 (deadlock victim), 1222 (lock timeout);
/// - Azure SQL reconfiguration and failover: 40613, 40197, 40143, 40540, 4060 (database not available yet),
///   4221 (read-secondary not ready), 615 (stale database id after a detach), 926 (`replicatedmaster` marked
///   SUSPECT for a moment at the end of a reconfiguration);
/// - resource governance and throttling: 10928, 10929 (database limits), 10936 (elastic pool request limit),
///   40501 (service busy), 49918-49920 (too many requests);
/// - a paused or warming Synapse / serverless pool: 42108, 42109;
/// - snapshot reads: 3961 (a concurrent DDL changed the table since the snapshot began; the next read sees
///   the new metadata, and a real shape change then fails on its own number);
/// - network errors the server reports: 10053, 10054, 10060, 233, 64, 121.
pub const TRANSIENT_CODES: &[u32] = &[
    1204, 1205, 1222, 4060, 4221, 615, 926, 3961, 10053, 10054, 10060, 10928, 10929, 10936, 40143, 40197, 40501, 40540,
    40613, 42108, 42109, 49918, 49919, 49920, 233, 64, 121,
];

/// The classifier: does this failure pass by waiting (a later tick may succeed), or does it need a change?
pub fn is_transient(f: &Failure) -> bool {
    match f {
        Failure::Connect(_) | Failure::Token(_) => true,
        Failure::Tds(e) => match e {
            tiberius::error::Error::Io { .. } => true,
            tiberius::error::Error::Server(t) => TRANSIENT_CODES.contains(&t.code()),
            // A stream that ended or desynced mid-response: the connection is gone, a new one may work.
            tiberius::error::Error::Protocol(_) => true,
            _ => false,
        },
    }
}

/// The operator message for a failure, naming the app setting and never a secret.
pub fn describe(f: &Failure, setting: &str, context: &str) -> String {
    match f {
        Failure::Connect(m) => format!("cannot connect to SQL Server (app setting {setting}): {m}"),
        Failure::Token(m) => format!(
            "cannot get an Entra ID token for SQL Server (app setting {setting}): {m}; check the app's managed identity (or `az login` locally) and that it is a user in the database (CREATE USER [app-name] FROM EXTERNAL PROVIDER)"
        ),
        Failure::Tds(tiberius::error::Error::Server(t)) => {
            let hint = match t.code() {
                18456 => "; check User ID and Password in the connection string",
                4060 => "; check Database in the connection string",
                229 | 230 | 297 | 300 => "; grant the login the permission named above",
                208 => "; the table or a column was dropped or renamed: check tableName, then restart the function app",
                207 => "; a column was renamed or dropped since the trigger started: restart the function app",
                22105 | 22106 => "; change tracking was turned off: enable it again (ALTER TABLE ... ENABLE CHANGE_TRACKING) and restart",
                3952 => "; snapshot isolation was turned off since start-up: restart the function app (or ALTER DATABASE ... SET ALLOW_SNAPSHOT_ISOLATION ON)",
                _ => "",
            };
            format!("SQL Server error {} while {context}: {}{hint}", t.code(), t.message())
        }
        Failure::Tds(tiberius::error::Error::Tls(m)) => format!(
            "TLS to SQL Server failed (app setting {setting}): {m}; check the server name and the certificate (TrustServerCertificate=True only for a local test server)"
        ),
        Failure::Tds(e @ tiberius::error::Error::Io { .. }) => format!("SQL Server connection failed while {context}: {e}"),
        Failure::Tds(e) => format!("SQL Server driver error while {context}: {e}"),
    }
}

/// A statement that failed, with the classifier's verdict.
#[derive(Debug)]
pub struct Failed {
    pub failure: Failure,
    /// Whether waiting may fix it ([`is_transient`]).
    pub transient: bool,
}

impl Failed {
    pub fn new(failure: Failure) -> Self {
        let transient = is_transient(&failure);
        Self { failure, transient }
    }

    /// The SQL Server error number, when the server reported the failure.
    pub fn code(&self) -> Option<u32> {
        match &self.failure {
            Failure::Tds(tiberius::error::Error::Server(t)) => Some(t.code()),
            _ => None,
        }
    }
}

/// A statement parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    Int(i64),
    Text(String),
    Bytes(Vec<u8>),
}

/// A handle on the pool of one database: every source and sink of one connection string in the process holds
/// one, over the same connections ([`Shared`], kept by `db::pools`). The handle keeps its own app setting's
/// name, so each caller's messages name the setting it was configured with.
pub struct Pool {
    setting: String,
    shared: Arc<Shared>,
}

/// What the handles of one database's pool share: at most the cap of connections, the idle ones, the token
/// credential.
pub(crate) struct Shared {
    settings: Settings,
    permits: Semaphore,
    idle: Mutex<Vec<(Tds, Instant)>>,
    credential: OnceCell<Arc<dyn TokenCredential>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("setting", &self.setting).field("auth", &self.shared.settings.auth).finish()
    }
}

impl Pool {
    /// The handle of the pool of `settings`' database, shared with every other of the same connection string
    /// (`db::pools`). Opens nothing: connections are made on first use.
    pub fn new(settings: Settings) -> Self {
        let setting = settings.setting.clone();
        let made = super::pools::shared(settings.database, |cap| {
            Ok::<_, std::convert::Infallible>(Shared {
                settings,
                permits: Semaphore::new(cap),
                idle: Mutex::new(Vec::new()),
                credential: OnceCell::new(),
            })
        });
        let shared = match made {
            Ok(shared) => shared,
            Err(never) => match never {},
        };
        Self { setting, shared }
    }

    async fn token(&self) -> Result<Option<String>, Failure> {
        let build = |auth: &Auth| -> azure_core::Result<Arc<dyn TokenCredential>> {
            use azure_identity::{
                DeveloperToolsCredential, ManagedIdentityCredential, ManagedIdentityCredentialOptions, UserAssignedId,
            };
            let managed = |client_id: Option<String>| {
                ManagedIdentityCredential::new(Some(ManagedIdentityCredentialOptions {
                    user_assigned_id: client_id.map(UserAssignedId::ClientId),
                    ..Default::default()
                }))
                .map(|c| c as Arc<dyn TokenCredential>)
            };
            let hosted = std::env::var_os("IDENTITY_ENDPOINT").is_some() || std::env::var_os("MSI_ENDPOINT").is_some();
            match auth {
                Auth::ManagedIdentity { client_id } => managed(client_id.clone()),
                // Hosted in Azure, Default is the managed identity: the user-assigned one named by User ID.
                Auth::Default { client_id } if hosted => managed(client_id.clone()),
                _ => DeveloperToolsCredential::new(None).map(|c| c as Arc<dyn TokenCredential>),
            }
        };
        if self.shared.settings.auth == Auth::SqlPassword {
            return Ok(None);
        }
        let credential = self
            .shared
            .credential
            .get_or_try_init(|| async { build(&self.shared.settings.auth) })
            .await
            .map_err(|e| Failure::Token(e.to_string()))?;
        let token = credential
            .get_token(&[self.shared.settings.token_scope.as_str()], None)
            .await
            .map_err(|e| Failure::Token(e.to_string()))?;
        Ok(Some(token.token.secret().to_string()))
    }

    async fn connect(&self) -> Result<Tds, Failure> {
        let mut config = self.shared.settings.config.clone();
        if let Some(token) = self.token().await? {
            config.authentication(AuthMethod::aad_token(token));
        }
        let mut redirects = 0;
        loop {
            let addr = config.get_addr();
            let tcp = match tokio::time::timeout(self.shared.settings.connect_timeout, TcpStream::connect(&addr)).await
            {
                Ok(Ok(tcp)) => tcp,
                Ok(Err(e)) => return Err(Failure::Connect(format!("{addr}: {e}"))),
                Err(_) => {
                    return Err(Failure::Connect(format!(
                        "{addr}: no answer within {:?} (Connect Timeout)",
                        self.shared.settings.connect_timeout
                    )))
                }
            };
            let _ = tcp.set_nodelay(true);
            match Client::connect(config.clone(), tcp.compat_write()).await {
                Ok(client) => return pin_session(client).await,
                Err(tiberius::error::Error::Routing { host, port }) if redirects < MAX_REDIRECTS => {
                    redirects += 1;
                    config.host(host);
                    config.port(port);
                }
                Err(e) => return Err(Failure::Tds(e)),
            }
        }
    }

    fn take_idle(&self) -> Option<Tds> {
        let mut idle = self.shared.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((client, since)) = idle.pop() {
            if since.elapsed() < MAX_IDLE {
                return Some(client);
            }
        }
        None
    }

    fn put_idle(&self, client: Tds) {
        self.shared.idle.lock().unwrap_or_else(|p| p.into_inner()).push((client, Instant::now()));
    }

    /// Drops every idle client: once one was found dead, the others were most likely cut with it.
    fn drop_idle(&self) {
        self.shared.idle.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// A connection from the pool, the statement, all rows of its first result set. A pooled connection that
    /// turns out dead is replaced (see the module docs); any other failure is answered at once.
    async fn run(&self, sql: &str, params: Option<&[Param]>, context: &str) -> Result<Vec<Row>, Failed> {
        let _permit = self
            .shared
            .permits
            .acquire()
            .await
            .map_err(|_| Failed::new(Failure::Connect("the pool is closed".into())))?;
        let mut replaced = 0;
        loop {
            let (mut client, reused) = match self.take_idle() {
                Some(client) => (client, true),
                None => (self.connect().await.map_err(Failed::new)?, false),
            };
            match send(&mut client, sql, params).await {
                Ok(rows) => {
                    self.put_idle(client);
                    return Ok(rows);
                }
                Err(e) if reused && broke_connection(&e) && replaced < self.shared.settings.reconnects => {
                    // The client is dropped; so are the other idle ones, so the next try opens a fresh one.
                    replaced += 1;
                    self.drop_idle();
                    tracing::debug!(setting = %self.setting, error = %e, context,
                        "a pooled SQL Server connection was dead; replacing it (ConnectRetryCount)");
                }
                // The client is dropped: after any error its stream may be out of step with the server.
                Err(e) => return Err(Failed::new(Failure::Tds(e))),
            }
        }
    }

    /// The app setting this pool connects with, for messages.
    pub fn setting(&self) -> &str {
        &self.setting
    }

    /// A parameterized statement (`sp_executesql`). `context` says what it does, for the debug log.
    pub async fn execute(&self, sql: &str, params: &[Param], context: &str) -> Result<Vec<Row>, Failed> {
        self.run(sql, Some(params), context).await
    }

    /// A statement without parameters, sent as a plain batch.
    pub async fn execute_batch(&self, sql: &str, context: &str) -> Result<Vec<Row>, Failed> {
        self.run(sql, None, context).await
    }
}

/// Sends the session batch ([`session::BATCH`]) on a connection that just logged in, before its first statement.
async fn pin_session(mut client: Tds) -> Result<Tds, Failure> {
    client.simple_query(session::BATCH).await.map_err(Failure::Tds)?.into_results().await.map_err(Failure::Tds)?;
    Ok(client)
}

/// Sends one statement on `client` and reads its first result set.
async fn send(client: &mut Tds, sql: &str, params: Option<&[Param]>) -> Result<Vec<Row>, tiberius::error::Error> {
    match params {
        Some(params) => {
            let mut q = Query::new(sql.to_string());
            for p in params {
                match p {
                    Param::Int(v) => q.bind(*v),
                    Param::Text(v) => q.bind(v.clone()),
                    Param::Bytes(v) => q.bind(v.clone()),
                }
            }
            q.query(client).await?.into_first_result().await
        }
        None => client.simple_query(sql).await?.into_first_result().await,
    }
}

/// True when the connection itself broke (reset, closed, a stream that ended mid-response), as opposed to the
/// server refusing the statement.
fn broke_connection(e: &tiberius::error::Error) -> bool {
    matches!(e, tiberius::error::Error::Io { .. } | tiberius::error::Error::Protocol(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_and_sinks_of_one_connection_string_share_one_pool_each_naming_its_own_setting() {
        let text = format!("Server=tcp:127.0.0.1,1;Database=d{};User ID=u;Password=p", uuid::Uuid::new_v4().simple());
        let parse = |setting: &str, text: &str| {
            Settings::parse(setting, &crate::config::Secret::new(text)).expect("a valid connection string")
        };
        let (source, sink) = (Pool::new(parse("Source", &text)), Pool::new(parse("Sink", &text)));
        let other = Pool::new(parse("Source", &format!("{text}2")));
        assert!(Arc::ptr_eq(&source.shared, &sink.shared), "one database, one pool");
        assert!(!Arc::ptr_eq(&source.shared, &other.shared), "another password is another pool");
        assert_eq!((source.setting(), sink.setting()), ("Source", "Sink"));
        assert_eq!(source.shared.permits.available_permits(), crate::db::pools::max_connections());
    }

    #[test]
    fn the_retry_table_retries_what_a_retry_can_fix() {
        let io = Failure::Tds(tiberius::error::Error::Io {
            kind: std::io::ErrorKind::ConnectionReset,
            message: "reset".into(),
        });
        assert!(is_transient(&io));
        assert!(is_transient(&Failure::Connect("timeout".into())));
        assert!(!is_transient(&Failure::Tds(tiberius::error::Error::Tls("bad certificate".into()))));
        assert!(!is_transient(&Failure::Tds(tiberius::error::Error::Conversion("x".into()))));
        for code in [1205, 40613, 40197, 40501, 49918, 49919, 49920, 4060, 10928, 10929, 10053, 10054, 10060, 233, 64] {
            assert!(TRANSIENT_CODES.contains(&code), "{code}");
        }
        // What issue 15 found missing: lock resources, the elastic pool limit, paused or warming pools, a snapshot
        // read that met a concurrent DDL, and Azure SQL's documented reconfiguration errors.
        for code in [1204, 10936, 42108, 42109, 3961, 926, 615] {
            assert!(TRANSIENT_CODES.contains(&code), "{code} is transient");
        }
        assert!(!TRANSIENT_CODES.contains(&18456), "a failed login is not transient");
    }
}
