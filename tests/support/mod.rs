//! The shared fixture of the integration tests: one PostgreSQL and one Azurite per test process, app folders,
//! and the path of the `handler` binary under test.
//!
//! Use it from a test binary with `mod support;` and `support::fixture()`. Servers start lazily, on the first
//! test that asks, and live until the process exits: they are spawned by `embedded`'s spawner thread with a
//! parent-death signal, so they die with the process even though the static holding them is never dropped.
//! Under nextest every test is its own process and gets its own servers (about 0.3 s for PostgreSQL here).
//!
//! Set `TEST_POSTGRES_URL` (an admin URL; the fixture's own connections do not use TLS, but the handler under
//! test verifies the certificate of a server that offers TLS, so add `?sslmode=disable` for a server whose
//! certificate this machine does not trust) or `TEST_AZURITE_CONNECTION_STRING` /
//! `TEST_AZURITE_BLOB_URL` to use servers you run yourself instead.
//!
//! Tests that stop or restart a server must start their own (`EmbeddedPostgres::start()`,
//! `Azurite::start_persistent()`): the shared ones are shared by every test of the process.
#![allow(dead_code)] // each test binary uses a different part of this module

use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use testbed::driver::{DriverOptions, HostDriver};
use testbed::embedded::{self, Azurite, EmbeddedPostgres, ScratchDir};

/// The servers shared by the tests of this process.
#[derive(Debug)]
pub struct Fixture {
    postgres: OnceLock<Result<Postgres, String>>,
    azurite: OnceLock<Result<Storage, String>>,
}

#[derive(Debug)]
enum Postgres {
    Embedded(EmbeddedPostgres),
    External(String),
}

#[derive(Debug)]
enum Storage {
    Embedded(Azurite),
    External { connection_string: String, blob_endpoint: String },
}

/// The fixture of this test process.
pub fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| Fixture { postgres: OnceLock::new(), azurite: OnceLock::new() })
}

fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.trim().is_empty())
}

impl Fixture {
    fn postgres(&self) -> &Postgres {
        let started = self.postgres.get_or_init(|| match env_var("TEST_POSTGRES_URL") {
            Some(url) => Ok(Postgres::External(url)),
            None => EmbeddedPostgres::start()
                .map(Postgres::Embedded)
                .map_err(|err| format!("cannot start PostgreSQL for the tests: {err}")),
        });
        match started {
            Ok(postgres) => postgres,
            Err(message) => panic!("{message}"),
        }
    }

    /// The admin URL of the shared server (database `postgres`). Prefer [`fresh_database`](Self::fresh_database).
    pub fn postgres_url(&self) -> String {
        match self.postgres() {
            Postgres::Embedded(server) => server.url(),
            Postgres::External(url) => url.clone(),
        }
    }

    /// True when the tests run against a server launched here, which has `wal_level=logical` and may be
    /// assumed to be otherwise idle.
    pub fn postgres_is_embedded(&self) -> bool {
        matches!(self.postgres(), Postgres::Embedded(_))
    }

    /// Creates a database no other test uses and returns its URL: one fresh database per test.
    pub async fn fresh_database(&self, prefix: &str) -> String {
        let name = unique_database_name(prefix);
        let admin = self.postgres_url();
        match embedded::create_database(&admin, &name).await {
            Ok(url) => url,
            Err(err) => panic!("cannot create test database {name}: {err}"),
        }
    }

    fn azurite(&self) -> &Storage {
        let started = self.azurite.get_or_init(|| {
            let connection_string = env_var("TEST_AZURITE_CONNECTION_STRING");
            let blob_url = env_var("TEST_AZURITE_BLOB_URL");
            match (connection_string, blob_url) {
                (None, None) => Azurite::start()
                    .map(Storage::Embedded)
                    .map_err(|err| format!("cannot start Azurite for the tests: {err}")),
                (Some(connection_string), blob_url) => {
                    let blob_endpoint = blob_url.or_else(|| blob_endpoint_of(&connection_string)).ok_or_else(|| {
                        "TEST_AZURITE_CONNECTION_STRING has no BlobEndpoint=...; add it or set \
                             TEST_AZURITE_BLOB_URL"
                            .to_string()
                    })?;
                    Ok(Storage::External { connection_string, blob_endpoint })
                }
                (None, Some(blob_endpoint)) => {
                    Ok(Storage::External { connection_string: dev_connection_string(&blob_endpoint), blob_endpoint })
                }
            }
        });
        match started {
            Ok(storage) => storage,
            Err(message) => panic!("{message}"),
        }
    }

    /// A full connection string (well-known dev account) for the shared Azurite.
    pub fn azurite_connection_string(&self) -> String {
        match self.azurite() {
            Storage::Embedded(server) => server.connection_string(),
            Storage::External { connection_string, .. } => connection_string.clone(),
        }
    }

    /// `http://127.0.0.1:PORT/devstoreaccount1`
    pub fn azurite_blob_endpoint(&self) -> String {
        match self.azurite() {
            Storage::Embedded(server) => server.blob_endpoint(),
            Storage::External { blob_endpoint, .. } => blob_endpoint.trim_end_matches('/').to_string(),
        }
    }
}

/// `prefix_<pid>_<n>_<random>`, lower-case, at most 63 bytes, valid for [`embedded::create_database`].
pub fn unique_database_name(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut clean: String =
        prefix.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).take(30).collect();
    if !clean.starts_with(|c: char| c.is_ascii_lowercase() || c == '_') {
        clean.insert(0, 't');
    }
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{clean}_{}_{}_{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed), &random[..8])
}

fn blob_endpoint_of(connection_string: &str) -> Option<String> {
    if connection_string.trim().eq_ignore_ascii_case("UseDevelopmentStorage=true") {
        return Some(format!("http://127.0.0.1:10000/{}", embedded::DEV_ACCOUNT));
    }
    connection_string.split(';').find_map(|part| {
        let (key, value) = part.split_once('=')?;
        key.trim().eq_ignore_ascii_case("BlobEndpoint").then(|| value.trim().to_string())
    })
}

fn dev_connection_string(blob_endpoint: &str) -> String {
    format!(
        "DefaultEndpointsProtocol=http;AccountName={};AccountKey={};BlobEndpoint={};",
        embedded::DEV_ACCOUNT,
        embedded::DEV_ACCOUNT_KEY,
        blob_endpoint.trim_end_matches('/')
    )
}

/// The `handler` binary cargo built for this test run.
/// The handler under test: this build's, or `TEST_HANDLER_EXE` (to run the suite against another build, such
/// as the one before a fix, to show a test failing without it).
pub fn handler_exe() -> PathBuf {
    env_var("TEST_HANDLER_EXE").map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_handler")), PathBuf::from)
}

/// An HTTP client for tests. reqwest's rustls backend is built without a crypto provider; install ring.
pub fn http_client() -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a plain reqwest client builds once a crypto provider is installed")
}

// ---------------------------------------------------------------------------------------------------------------
// App folders
// ---------------------------------------------------------------------------------------------------------------

/// A function app folder in a scratch directory, removed on drop.
#[derive(Debug)]
pub struct AppFolder {
    dir: ScratchDir,
}

impl AppFolder {
    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    /// Options that run the real `handler` on this folder; adjust fields before [`HostDriver::start`].
    pub fn driver_options(&self) -> DriverOptions {
        DriverOptions::new(self.root(), handler_exe())
    }

    /// Starts the real `handler` on this folder with extra environment variables.
    pub async fn start_handler(&self, env: &[(&str, &str)]) -> HostDriver {
        let mut options = self.driver_options();
        options.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        match HostDriver::start(options).await {
            Ok(driver) => driver,
            Err(err) => panic!("the handler did not start: {err}"),
        }
    }
}

/// Writes app folders: host.json, function folders, local.settings.json, and any extra file.
#[derive(Debug, Clone)]
pub struct AppBuilder {
    host: Value,
    functions: Vec<(String, Value, Option<Value>)>,
    settings: Vec<(String, String)>,
    files: Vec<(PathBuf, String)>,
}

impl Default for AppBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl AppBuilder {
    /// Starts with the host.json of a custom-handler app and `FUNCTIONS_WORKER_RUNTIME=Custom`.
    pub fn new() -> Self {
        Self {
            host: json!({
                "version": "2.0",
                "functionTimeout": "00:05:00",
                "customHandler": {
                    "description": { "defaultExecutablePath": "handler", "workingDirectory": "", "arguments": [] },
                    "enableForwardingHttpRequest": false
                },
                "extensionBundle": { "id": "Microsoft.Azure.Functions.ExtensionBundle", "version": "[4.*, 5.0.0)" }
            }),
            functions: Vec::new(),
            settings: vec![("FUNCTIONS_WORKER_RUNTIME".into(), "Custom".into())],
            files: Vec::new(),
        }
    }

    pub fn host_json(mut self, host: Value) -> Self {
        self.host = host;
        self
    }

    /// A function folder with its function.json and, when given, its sqltrigger.json.
    pub fn function(mut self, name: &str, function_json: Value, sqltrigger_json: Option<Value>) -> Self {
        self.functions.push((name.to_string(), function_json, sqltrigger_json));
        self
    }

    /// A `local.settings.json` `Values` entry (the host passes each as an environment variable).
    pub fn setting(mut self, key: &str, value: &str) -> Self {
        self.settings.push((key.to_string(), value.to_string()));
        self
    }

    /// Any other file, relative to the app root.
    pub fn file(mut self, relative: &str, contents: &str) -> Self {
        self.files.push((PathBuf::from(relative), contents.to_string()));
        self
    }

    pub fn write(self) -> AppFolder {
        let dir = ScratchDir::new("app").expect("the temp directory is writable");
        let root = dir.path();
        write_json(&root.join("host.json"), &self.host);
        let values: serde_json::Map<String, Value> =
            self.settings.into_iter().map(|(k, v)| (k, Value::String(v))).collect();
        write_json(&root.join("local.settings.json"), &json!({ "IsEncrypted": false, "Values": values }));
        for (name, function_json, sqltrigger_json) in self.functions {
            let folder = root.join(&name);
            std::fs::create_dir_all(&folder).expect("the app folder is writable");
            write_json(&folder.join("function.json"), &function_json);
            if let Some(trigger) = sqltrigger_json {
                write_json(&folder.join("sqltrigger.json"), &trigger);
            }
        }
        for (relative, contents) in self.files {
            let path = root.join(relative);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).expect("the app folder is writable");
            }
            std::fs::write(&path, contents).expect("the app folder is writable");
        }
        AppFolder { dir }
    }
}

/// The common case: host.json, one function folder, local.settings.json with `settings`.
pub fn write_app(function: &str, function_json: Value, sqltrigger_json: Value, settings: &[(&str, &str)]) -> AppFolder {
    let builder = AppBuilder::new().function(function, function_json, Some(sqltrigger_json));
    settings.iter().fold(builder, |b, (k, v)| b.setting(k, v)).write()
}

/// The retry delay of the test functions' policy: short and real (the host model waits it).
pub const TEST_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

/// A timer function.json with a queue output named `changes`, and a fixed-delay retry policy of
/// [`TEST_RETRY_DELAY`] when `max_retry_count` is given.
pub fn timer_function_json(max_retry_count: Option<i64>) -> Value {
    let mut function = json!({
        "bindings": [
            { "type": "timerTrigger", "direction": "in", "name": "timer", "schedule": "*/5 * * * * *" },
            { "type": "queue", "direction": "out", "name": "changes", "queueName": "changes",
              "connection": "AzureWebJobsStorage" }
        ]
    });
    if let (Some(max), Value::Object(fields)) = (max_retry_count, &mut function) {
        fields.insert(
            "retry".into(),
            json!({ "strategy": "fixedDelay", "maxRetryCount": max, "delayInterval": "00:00:00.100" }),
        );
    }
    function
}

fn write_json(path: &Path, value: &Value) {
    let text = serde_json::to_string_pretty(value).expect("a serde_json::Value always serializes");
    std::fs::write(path, text).expect("the app folder is writable");
}
