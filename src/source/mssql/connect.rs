//! Connections to SQL Server / Azure SQL: the ADO.NET connection string as Azure gives it, Entra ID tokens
//! for managed identity, a small pool, and the one table that decides which failures are retried.
//!
//! Why an own pool: bb8-tiberius and deadpool-tiberius pin tiberius 0.12. This one is a semaphore (at most
//! [`POOL_SIZE`] connections) over a stack of idle clients. A client that saw any error is dropped, never
//! reused: after a timeout or a broken stream tiberius' connection is out of step with the server. Idle
//! clients older than [`MAX_IDLE`] are dropped too: Azure's load balancers silently cut connections that
//! stay idle for about four minutes, and a cut connection costs a failed statement to discover.
//!
//! Every statement runs through [`Pool::query`] / [`Pool::batch`]: transient failures (broken connection,
//! timeout, deadlock, Azure SQL's reconfiguration and throttling codes) are retried with exponential
//! backoff inside [`RETRY_BUDGET`] (and at most `ConnectRetryCount` times, a connection-string key
//! borrowed from ADO.NET; 0 turns retries off); everything else is `SourceError::Invalid` at once with a message that
//! says what to change. The sources' statements are single reads, so a retry repeats no side effect.
//! [`Pool::execute`] is the same loop for other callers (the upsert sink), returning the [`Failed`] statement
//! so they word and classify it themselves; it may retry only statements that are atomic and idempotent
//! (the sink's delivery is one transaction under `XACT_ABORT`, fenced and optionally exactly once).

use crate::config::Secret;
use crate::source::SourceError;
use azure_core::credentials::TokenCredential;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tiberius::{AuthMethod, Client, Config, Query, Row};
use tokio::net::TcpStream;
use tokio::sync::{OnceCell, Semaphore};
use tokio_util::compat::{Compat, TokioAsyncWriteCompatExt};

pub const POOL_SIZE: usize = 4;
pub const MAX_IDLE: Duration = Duration::from_secs(180);
/// How long one statement may keep retrying transient failures before the tick reports them.
pub const RETRY_BUDGET: Duration = Duration::from_secs(20);
/// Retries of one statement when `ConnectRetryCount` is not set; the budget usually ends them first.
pub const DEFAULT_RETRIES: u32 = 8;
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(4);
/// Azure SQL's scope for Entra ID tokens.
pub const TOKEN_SCOPE: &str = "https://database.windows.net/.default";
/// Azure SQL redirects a login to the node that hosts the database (the Redirect connection policy).
const MAX_REDIRECTS: usize = 2;

type Tds = Client<Compat<TcpStream>>;

/// How the login authenticates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Auth {
    /// User ID and Password in the connection string.
    SqlPassword,
    /// `Authentication=Active Directory Managed Identity` (or `... MSI`): the system-assigned identity, or
    /// the user-assigned one whose client id is in `User ID`, as Microsoft.Data.SqlClient reads it.
    ManagedIdentity { client_id: Option<String> },
    /// `Authentication=Active Directory Default`: the managed identity when hosted in Azure, else the
    /// developer's Azure CLI / azd sign-in.
    Default,
}

/// A parsed connection string. Holds the password inside tiberius' `Config`, which redacts it in `Debug`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub config: Config,
    pub auth: Auth,
    pub connect_timeout: Duration,
    /// `ConnectRetryCount`: how many times a transient failure is retried (within [`RETRY_BUDGET`]).
    pub max_retries: u32,
    /// The app setting's name, for messages (never its value).
    pub setting: String,
}

/// `key=value` pairs of an ADO.NET connection string: keys lower-cased without spaces, values unquoted.
/// Only used to read the keys tiberius does not know (`Authentication`, timeouts) and to scrub values from
/// error messages; tiberius parses the string itself.
pub fn pairs(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ';' || c.is_whitespace()) {
            chars.next();
        }
        let mut key = String::new();
        for c in chars.by_ref() {
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if key.trim().is_empty() {
            return out;
        }
        while chars.peek().is_some_and(|c| *c == ' ') {
            chars.next();
        }
        let mut value = String::new();
        match chars.peek().copied() {
            Some(q @ ('\'' | '"')) => {
                chars.next();
                while let Some(c) = chars.next() {
                    if c == q {
                        if chars.peek() == Some(&q) {
                            chars.next();
                            value.push(q);
                            continue;
                        }
                        break;
                    }
                    value.push(c);
                }
                for c in chars.by_ref() {
                    if c == ';' {
                        break;
                    }
                }
            }
            Some('{') => {
                chars.next();
                for c in chars.by_ref() {
                    if c == '}' {
                        break;
                    }
                    value.push(c);
                }
                for c in chars.by_ref() {
                    if c == ';' {
                        break;
                    }
                }
            }
            _ => {
                for c in chars.by_ref() {
                    if c == ';' {
                        break;
                    }
                    value.push(c);
                }
            }
        }
        let key: String = key.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase();
        out.push((key, value.trim().to_string()));
    }
}

/// Replaces every value of the connection string that appears in `text` with `***`, so a driver message
/// that quotes a fragment never carries a password into a log.
fn scrub(text: &str, pairs: &[(String, String)]) -> String {
    let mut out = text.to_string();
    for (_, v) in pairs {
        if v.len() >= 3 {
            out = out.replace(v.as_str(), "***");
        }
    }
    out
}

impl Settings {
    pub fn parse(setting: &str, connection: &Secret) -> Result<Self, SourceError> {
        let text = connection.expose();
        let kv = pairs(text);
        let get = |keys: &[&str]| kv.iter().find(|(k, _)| keys.contains(&k.as_str())).map(|(_, v)| v.clone());
        let bad = |why: String| {
            SourceError::Invalid(format!(
                "app setting {setting} is not a usable SQL Server connection string ({}); use the ADO.NET form Azure shows, e.g. Server=tcp:myserver.database.windows.net,1433;Database=mydb;User ID=...;Password=...;Encrypt=True",
                scrub(&why, &kv)
            ))
        };
        if text.trim_start().starts_with("postgres") {
            return Err(bad("it looks like a PostgreSQL URL; use source postgres-cursor for PostgreSQL".into()));
        }
        let mut config = Config::from_ado_string(text).map_err(|e| bad(e.to_string()))?;
        if get(&["server", "datasource", "address", "addr", "networkaddress"]).is_none() {
            return Err(bad("it has no Server".into()));
        }
        let auth = match get(&["authentication"]).map(|a| a.to_ascii_lowercase().replace([' ', '-'], "")) {
            None => Auth::SqlPassword,
            Some(a) if a == "sqlpassword" => Auth::SqlPassword,
            Some(a) if a == "activedirectorymanagedidentity" || a == "activedirectorymsi" => {
                Auth::ManagedIdentity { client_id: get(&["userid", "uid", "user", "username"]).filter(|v| !v.is_empty()) }
            }
            Some(a) if a == "activedirectorydefault" => Auth::Default,
            Some(other) => {
                return Err(bad(format!(
                    "Authentication={other} is not supported; use Active Directory Managed Identity, Active Directory Default, or SQL authentication (User ID and Password)"
                )))
            }
        };
        let seconds = |keys: &[&str], default: u64| -> Result<Duration, SourceError> {
            match get(keys) {
                None => Ok(Duration::from_secs(default)),
                Some(v) => match v.parse::<u64>() {
                    Ok(0) => Ok(Duration::from_secs(default)),
                    Ok(n) if n <= 3600 => Ok(Duration::from_secs(n)),
                    _ => Err(bad(format!("{} must be seconds from 0 to 3600", keys[0]))),
                },
            }
        };
        let connect_timeout = seconds(&["connecttimeout", "connectiontimeout", "timeout"], 15)?;
        let command_timeout = seconds(&["commandtimeout"], 30)?;
        let max_retries = match get(&["connectretrycount"]) {
            None => DEFAULT_RETRIES,
            Some(v) => v
                .parse::<u32>()
                .ok()
                .filter(|n| *n <= 255)
                .ok_or_else(|| bad("ConnectRetryCount must be 0 to 255".into()))?,
        };
        config.handshake_timeout(Some(connect_timeout));
        config.command_timeout(Some(command_timeout));
        if get(&["applicationname"]).is_none() {
            config.application_name("sql-pseudo-trigger");
        }
        Ok(Self { config, auth, connect_timeout, max_retries, setting: setting.to_string() })
    }
}

/// Why a statement failed, before it becomes a `SourceError`.
#[derive(Debug)]
pub enum Failure {
    Tds(tiberius::error::Error),
    /// Connecting (TCP) took longer than the connect timeout, or the address did not resolve.
    Connect(String),
    /// No Entra ID token.
    Token(String),
}

/// SQL Server and Azure SQL error numbers that a retry can fix: deadlock victim, lock and login timeouts,
/// Azure SQL reconfiguration (40613, 40197, 4060 database unavailable, 10928/10929 resource limits,
/// 40501 throttling, 49918-49920 too many requests) and network errors reported by the server.
pub const TRANSIENT_CODES: &[u32] = &[
    1205, 1222, 4060, 4221, 10053, 10054, 10060, 10928, 10929, 40143, 40197, 40501, 40540, 40613, 49918, 49919, 49920,
    233, 64, 121,
];

/// The retry table: is this failure worth another attempt?
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

/// A statement that failed for good: at once when the retry table says a retry cannot help, or when the
/// retries of a transient failure ran out.
#[derive(Debug)]
pub struct Failed {
    pub failure: Failure,
    /// What the retry table said about the last failure.
    pub transient: bool,
    pub attempts: u32,
}

impl Failed {
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

/// A pool of connections to one database.
pub struct Pool {
    settings: Settings,
    permits: Semaphore,
    idle: Mutex<Vec<(Tds, Instant)>>,
    credential: OnceCell<Arc<dyn TokenCredential>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("setting", &self.settings.setting).field("auth", &self.settings.auth).finish()
    }
}

impl Pool {
    /// Opens nothing: connections are made on first use.
    pub fn new(settings: Settings) -> Self {
        Self { settings, permits: Semaphore::new(POOL_SIZE), idle: Mutex::new(Vec::new()), credential: OnceCell::new() }
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
            match auth {
                Auth::ManagedIdentity { client_id } => managed(client_id.clone()),
                _ if std::env::var_os("IDENTITY_ENDPOINT").is_some() || std::env::var_os("MSI_ENDPOINT").is_some() => {
                    managed(None)
                }
                _ => DeveloperToolsCredential::new(None).map(|c| c as Arc<dyn TokenCredential>),
            }
        };
        if self.settings.auth == Auth::SqlPassword {
            return Ok(None);
        }
        let credential = self
            .credential
            .get_or_try_init(|| async { build(&self.settings.auth) })
            .await
            .map_err(|e| Failure::Token(e.to_string()))?;
        let token = credential.get_token(&[TOKEN_SCOPE], None).await.map_err(|e| Failure::Token(e.to_string()))?;
        Ok(Some(token.token.secret().to_string()))
    }

    async fn connect(&self) -> Result<Tds, Failure> {
        let mut config = self.settings.config.clone();
        if let Some(token) = self.token().await? {
            config.authentication(AuthMethod::aad_token(token));
        }
        let mut redirects = 0;
        loop {
            let addr = config.get_addr();
            let tcp = match tokio::time::timeout(self.settings.connect_timeout, TcpStream::connect(&addr)).await {
                Ok(Ok(tcp)) => tcp,
                Ok(Err(e)) => return Err(Failure::Connect(format!("{addr}: {e}"))),
                Err(_) => {
                    return Err(Failure::Connect(format!(
                        "{addr}: no answer within {:?} (Connect Timeout)",
                        self.settings.connect_timeout
                    )))
                }
            };
            let _ = tcp.set_nodelay(true);
            match Client::connect(config.clone(), tcp.compat_write()).await {
                Ok(client) => return Ok(client),
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
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some((client, since)) = idle.pop() {
            if since.elapsed() < MAX_IDLE {
                return Some(client);
            }
        }
        None
    }

    fn put_idle(&self, client: Tds) {
        self.idle.lock().unwrap_or_else(|p| p.into_inner()).push((client, Instant::now()));
    }

    /// One attempt: a connection from the pool, the statement, all rows of its first result set.
    async fn attempt(&self, sql: &str, params: Option<&[Param]>) -> Result<Vec<Row>, Failure> {
        let _permit = self.permits.acquire().await.map_err(|_| Failure::Connect("the pool is closed".into()))?;
        let mut client = match self.take_idle() {
            Some(c) => c,
            None => self.connect().await?,
        };
        let result = match params {
            Some(params) => {
                let mut q = Query::new(sql.to_string());
                for p in params {
                    match p {
                        Param::Int(v) => q.bind(*v),
                        Param::Text(v) => q.bind(v.clone()),
                        Param::Bytes(v) => q.bind(v.clone()),
                    }
                }
                match q.query(&mut client).await {
                    Ok(stream) => stream.into_first_result().await,
                    Err(e) => Err(e),
                }
            }
            None => match client.simple_query(sql).await {
                Ok(stream) => stream.into_first_result().await,
                Err(e) => Err(e),
            },
        };
        match result {
            Ok(rows) => {
                self.put_idle(client);
                Ok(rows)
            }
            // The client is dropped: after any error its stream may be out of step with the server.
            Err(e) => Err(Failure::Tds(e)),
        }
    }

    /// The retry loop: attempts until success, a failure the retry table does not retry, or the end of the
    /// budget. `context` words the warning logged before each retry.
    async fn run_raw(&self, sql: &str, params: Option<&[Param]>, context: &str) -> Result<Vec<Row>, Failed> {
        let started = Instant::now();
        let mut backoff = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            match self.attempt(sql, params).await {
                Ok(rows) => return Ok(rows),
                Err(f) => {
                    let transient = is_transient(&f);
                    if !transient || attempt > self.settings.max_retries || started.elapsed() + backoff > RETRY_BUDGET {
                        return Err(Failed { failure: f, transient, attempts: attempt });
                    }
                    let message = describe(&f, &self.settings.setting, context);
                    tracing::warn!(setting = %self.settings.setting, attempt, error = %message, "transient sql server failure; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    attempt += 1;
                }
            }
        }
    }

    /// [`Self::run_raw`] with its failure worded as a source error, beside SQL Server's error number when the
    /// server refused the statement (for callers that treat one refusal, a missing permission, as an answer).
    async fn run(
        &self,
        sql: &str,
        params: Option<&[Param]>,
        context: &str,
    ) -> Result<Vec<Row>, (SourceError, Option<u32>)> {
        self.run_raw(sql, params, context).await.map_err(|failed| {
            let message = describe(&failed.failure, &self.settings.setting, context);
            let error = if failed.transient {
                SourceError::Unavailable(format!("{message} (gave up after {} attempt(s))", failed.attempts))
            } else {
                SourceError::Invalid(message)
            };
            (error, failed.code())
        })
    }

    /// The app setting this pool connects with, for messages.
    pub fn setting(&self) -> &str {
        &self.settings.setting
    }

    /// A parameterized statement (`sp_executesql`), retried while its failures are transient, answering the
    /// failure itself: for callers that are not a source and word their errors themselves. See the module
    /// docs for which statements may be retried.
    pub async fn execute(&self, sql: &str, params: &[Param], context: &str) -> Result<Vec<Row>, Failed> {
        self.run_raw(sql, Some(params), context).await
    }

    /// A statement without parameters, sent as a plain batch, answering the failure itself.
    pub async fn execute_batch(&self, sql: &str, context: &str) -> Result<Vec<Row>, Failed> {
        self.run_raw(sql, None, context).await
    }

    /// A parameterized statement (`sp_executesql`), retried while its failures are transient.
    pub async fn query(&self, sql: &str, params: &[Param], context: &str) -> Result<Vec<Row>, SourceError> {
        self.run(sql, Some(params), context).await.map_err(|(e, _)| e)
    }

    /// [`Self::query`], with SQL Server's error number beside a failure the server reported.
    pub async fn query_coded(
        &self,
        sql: &str,
        params: &[Param],
        context: &str,
    ) -> Result<Vec<Row>, (SourceError, Option<u32>)> {
        self.run(sql, Some(params), context).await
    }

    /// A statement without parameters, sent as a plain batch.
    pub async fn batch(&self, sql: &str, context: &str) -> Result<Vec<Row>, SourceError> {
        self.run(sql, None, context).await.map_err(|(e, _)| e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(cs: &str) -> Result<Settings, SourceError> {
        Settings::parse("SqlConnectionString", &Secret::new(cs))
    }

    #[test]
    fn reads_the_connection_string_azure_shows() {
        let s = parse("Server=tcp:myserver.database.windows.net,1433;Initial Catalog=mydb;Persist Security Info=False;User ID=app;Password=p@ss=w0rd=;MultipleActiveResultSets=False;Encrypt=True;TrustServerCertificate=False;Connection Timeout=30;")
            .expect("parses");
        assert_eq!(s.auth, Auth::SqlPassword);
        assert_eq!(s.connect_timeout, Duration::from_secs(30));
        assert_eq!(s.config.get_addr(), "myserver.database.windows.net:1433");
    }

    #[test]
    fn managed_identity_takes_the_client_id_from_user_id() {
        let s = parse("Server=tcp:x.database.windows.net,1433;Database=db;Authentication=Active Directory Managed Identity;User Id=1111-2222")
            .expect("parses");
        assert_eq!(s.auth, Auth::ManagedIdentity { client_id: Some("1111-2222".into()) });
        let s = parse("Server=tcp:x,1433;Authentication=\"Active Directory Default\"").expect("parses");
        assert_eq!(s.auth, Auth::Default);
        let e = parse("Server=tcp:x,1433;Authentication=Active Directory Password;User ID=u;Password=hunter22")
            .unwrap_err()
            .to_string();
        assert!(e.contains("activedirectorypassword is not supported") && !e.contains("hunter22"), "{e}");
    }

    #[test]
    fn bad_strings_name_the_setting_and_never_the_password() {
        let e = parse("Server=tcp:x,1433;Password=s3cr3t-value;Connection Timeout=soon").unwrap_err().to_string();
        assert!(e.starts_with("app setting SqlConnectionString is not a usable SQL Server connection string"), "{e}");
        assert!(!e.contains("s3cr3t-value"), "{e}");
        let e = parse("postgres://u:pw@h/db").unwrap_err().to_string();
        assert!(e.contains("PostgreSQL"), "{e}");
        assert!(parse("Database=db;User ID=u").unwrap_err().to_string().contains("no Server"));
    }

    #[test]
    fn quoted_values_keep_their_semicolons() {
        let kv = pairs("Server=a;Password='x;y''z';Authentication={Active Directory Default};");
        assert_eq!(kv[1], ("password".into(), "x;y'z".into()));
        assert_eq!(kv[2], ("authentication".into(), "Active Directory Default".into()));
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
        assert!(!TRANSIENT_CODES.contains(&18456), "a failed login is not transient");
    }
}
