//! No secret in the output, even at trace level, through the failure paths: the real binary, logging
//! everything it and its libraries log (`Sql_Trigger_LogLevel=Trace`), with a wrong PostgreSQL password against
//! a real server that checks it, unreachable PostgreSQL and SQL Server, a storage account key and a SAS that
//! real Azurite refuses, a SAS sent to storage that does not answer, a webhook sink that does not answer, the
//! admin key on its routes, metrics exporters that cannot export, and a storage client secret that a loopback
//! Microsoft Entra ID authority refuses, fails on or never answers. Every secret kind the configuration
//! reference lists is set to a value found nowhere else, and the whole output (stdout and stderr) must hold
//! none of them. Each failure path is shown to be reached by what it logs.

use crate::common::{http, read_all};
use crate::support::{self, timer_function_json, AppBuilder, AppFolder};
use serde_json::json;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use testbed::embedded::{EmbeddedPostgres, PostgresOptions, ScratchDir};

const PG_WRONG_PASSWORD: &str = "PgWrongPassword-4b1f9e";
const PG_UNREACHABLE_PASSWORD: &str = "PgUnreachablePassword-77c2d0";
const SQL_PASSWORD: &str = "SqlServerPassword-3a9e51";
/// base64 of "account-key-that-azurite-refuses-5d0c": a well-formed key of the wrong account.
const ACCOUNT_KEY: &str = "YWNjb3VudC1rZXktdGhhdC1henVyaXRlLXJlZnVzZXMtNWQwYw==";
const SAS_SIGNATURE: &str = "U2FzU2lnbmF0dXJlUmVmdXNlZDkxZTc";
const SAS_UNREACHABLE_SIGNATURE: &str = "U2FzU2lnbmF0dXJlVW5yZWFjaGFibGU0NGE";
const ADMIN_KEY: &str = "AdminKey-e61b0a77";
const WEBHOOK_CODE: &str = "WebhookQueryCode-19fd3c";
/// Slack, Teams and Discord put the webhook's key in the URL's path.
const WEBHOOK_PATH_TOKEN: &str = "WebhookPathToken-5e2a90";
const WEBHOOK_BEARER: &str = "WebhookBearerToken-c0ffee11";
const INSTRUMENTATION_KEY: &str = "6a1f2b3c-4d5e-4f60-8a7b-9c0d1e2f3a4b";
const OTLP_API_KEY: &str = "OtlpApiKey-8d8e2f";

/// Every secret above, with its kind, for the messages.
const SECRETS: &[(&str, &str)] = &[
    ("a PostgreSQL password refused by the server", PG_WRONG_PASSWORD),
    ("a PostgreSQL password for a server that does not answer", PG_UNREACHABLE_PASSWORD),
    ("a SQL Server password", SQL_PASSWORD),
    ("a storage account key", ACCOUNT_KEY),
    ("a SAS signature", SAS_SIGNATURE),
    ("a SAS signature for storage that does not answer", SAS_UNREACHABLE_SIGNATURE),
    ("the admin key", ADMIN_KEY),
    ("a webhook URL's query key", WEBHOOK_CODE),
    ("a webhook URL's path key", WEBHOOK_PATH_TOKEN),
    ("a webhook header", WEBHOOK_BEARER),
    ("an Application Insights instrumentation key", INSTRUMENTATION_KEY),
    ("an OTLP header", OTLP_API_KEY),
];

fn assert_no_secret(what: &str, output: &str) {
    for (kind, secret) in SECRETS {
        assert!(!output.contains(secret), "{what}: {kind} ({secret}) is in the output:\n{output}");
    }
}

/// A PostgreSQL of this test's own that checks passwords (SCRAM) for every user but its admin, with a user
/// `app` whose password is not [`PG_WRONG_PASSWORD`].
fn postgres_checking_passwords() -> EmbeddedPostgres {
    let hba =
        "local all postgres trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n";
    let server = EmbeddedPostgres::start_with(PostgresOptions::default().file("pg_hba.conf", hba))
        .unwrap_or_else(|e| panic!("cannot start PostgreSQL: {e}"));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    rt.block_on(async {
        let db = testbed::embedded::connect(&server.url()).await.expect("connect as the admin");
        db.batch_execute(testbed::demo::ORDERS_SCHEMA).await.expect("the orders table");
        db.batch_execute(
            "SET password_encryption = 'scram-sha-256'; CREATE ROLE app LOGIN PASSWORD 'the-right-one';
             GRANT SELECT ON public.orders TO app;",
        )
        .await
        .expect("the role");
    });
    server
}

/// `handler` with a clean environment at trace level, in the app `app`, plus `env`.
fn handler(app: &AppFolder, env: &[(&str, String)]) -> Command {
    let mut command = Command::new(support::handler_exe());
    command
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("FUNCTIONS_APP_ROOT_PATH", app.root())
        .env("Sql_Trigger_LogLevel", "Trace")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        command.env(k, v);
    }
    command
}

/// `handler run --once`, giving up after a second of failures; everything it printed.
fn run_once(app: &AppFolder, env: &[(&str, String)]) -> String {
    let output = handler(app, env).args(["run", "--once", "--give-up-after", "1"]).output().expect("the handler runs");
    assert!(!output.status.success(), "a run whose every function fails must fail");
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

fn postgres_function(setting: &str) -> serde_json::Value {
    json!({ "source": "postgres-cursor", "tableName": "public.orders", "connectionStringSetting": setting, "cursorColumn": "version" })
}

#[test]
fn no_secret_is_printed_at_trace_level_through_the_failure_paths() {
    let state = ScratchDir::new("secrets").expect("scratch");
    let file_state = [
        ("Sql_Trigger_StateStore", "file".to_string()),
        ("Sql_Trigger_StateDirectory", state.path().display().to_string()),
    ];

    // 1. A password the server refuses, and servers that do not answer, each function with a webhook sink
    //    whose URL and header carry keys.
    let server = postgres_checking_passwords();
    let webhook = json!({ "type": "webhook", "url": format!("http://127.0.0.1:1/services/T0/{WEBHOOK_PATH_TOKEN}?code={WEBHOOK_CODE}"),
                          "headers": { "Authorization": "%WebhookAuth%" } });
    let mut mssql =
        json!({ "source": "mssql-change-tracking", "tableName": "dbo.Orders", "connectionStringSetting": "Sql" });
    let mut refused = postgres_function("PgRefused");
    let mut unreachable = postgres_function("PgUnreachable");
    for f in [&mut mssql, &mut refused, &mut unreachable] {
        f["sink"] = webhook.clone();
    }
    let app = AppBuilder::new()
        .function("Refused", timer_function_json(Some(3)), Some(refused))
        .function("Unreachable", timer_function_json(Some(3)), Some(unreachable))
        .function("SqlServer", timer_function_json(Some(3)), Some(mssql))
        .write();
    let mut env = file_state.to_vec();
    env.extend([
        ("PgRefused", format!("postgres://app:{PG_WRONG_PASSWORD}@127.0.0.1:{}/postgres?sslmode=disable", server.port())),
        ("PgUnreachable", format!("host=127.0.0.1 port=1 user=app password={PG_UNREACHABLE_PASSWORD} connect_timeout=2")),
        ("Sql", format!("Server=tcp:127.0.0.1,1;Database=shop;User ID=app;Password={SQL_PASSWORD};Encrypt=false;Connect Timeout=2")),
        ("WebhookAuth", format!("Bearer {WEBHOOK_BEARER}")),
        ("Sql_Trigger_AdminKey", ADMIN_KEY.to_string()),
    ]);
    let output = run_once(&app, &env);
    assert!(
        output.contains("password authentication failed"),
        "the refused password's path was not reached:\n{output}"
    );
    assert!(output.contains("Unreachable") && output.contains("SqlServer"), "{output}");
    assert_no_secret("databases", &output);

    // 2. Storage that refuses the account key, refuses the SAS, and does not answer a SAS request.
    let azurite = support::fixture().azurite_blob_endpoint();
    let sas = |endpoint: &str, signature: &str| {
        format!(
            "BlobEndpoint={endpoint};SharedAccessSignature=sv=2025-11-05&ss=b&srt=sco&sp=rwdlac&se=2030-01-01T00:00:00Z&sig={signature}"
        )
    };
    let app = AppBuilder::new().function("Orders", timer_function_json(Some(3)), Some(postgres_function("Pg"))).write();
    for (what, storage, reached) in [
        ("an account key storage refuses", format!("DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY};BlobEndpoint={azurite}"), "403"),
        ("a SAS storage refuses", sas(&azurite, SAS_SIGNATURE), "403"),
        ("a SAS to storage that does not answer", sas("http://127.0.0.1:1/devstoreaccount1", SAS_UNREACHABLE_SIGNATURE), "sig=***"),
    ] {
        // The database answers (as its admin, to the table made above): the tick goes on to the state store.
        let env = [("Pg", format!("{}?sslmode=disable", server.url())), ("AzureWebJobsStorage", storage)];
        let output = run_once(&app, &env);
        assert_no_secret(what, &output);
        assert!(output.contains(reached), "{what}: the failure path was not reached:\n{output}");
    }

    // 3. Under the host: the admin routes with a wrong key and the right one, an invocation whose tick fails,
    //    and metrics exporters that cannot export.
    let app = AppBuilder::new().function("Orders", timer_function_json(Some(3)), Some(postgres_function("Pg"))).write();
    let port = testbed::embedded::free_port().expect("a free port");
    let mut env = file_state.to_vec();
    env.extend([
        ("FUNCTIONS_CUSTOMHANDLER_PORT", port.to_string()),
        ("Pg", format!("postgres://app:{PG_UNREACHABLE_PASSWORD}@127.0.0.1:1/db?connect_timeout=2")),
        ("Sql_Trigger_AdminKey", ADMIN_KEY.to_string()),
        (
            "APPLICATIONINSIGHTS_CONNECTION_STRING",
            format!("InstrumentationKey={INSTRUMENTATION_KEY};IngestionEndpoint=http://127.0.0.1:1/"),
        ),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1".to_string()),
        ("OTEL_EXPORTER_OTLP_HEADERS", format!("api-key={OTLP_API_KEY}")),
        ("Sql_Trigger_MetricsIntervalMs", "200".to_string()),
    ]);
    let mut child = handler(&app, &env).spawn().expect("the handler starts");
    let stdout = read_all(child.stdout.take().expect("stdout"));
    let stderr = read_all(child.stderr.take().expect("stderr"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while http(port, "GET /", "", "") != Some(200) {
        assert!(Instant::now() < deadline, "the handler never answered GET /");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(http(port, "GET /admin?code=wrong", "", ""), Some(401));
    assert_eq!(http(port, "GET /admin", &format!("x-functions-key: {ADMIN_KEY}\r\n"), ""), Some(200));
    assert_eq!(http(port, &format!("GET /admin/functions?code={ADMIN_KEY}"), "", "").map(|s| s < 500), Some(true));
    let invocation = r#"{"Data":{"timer":{"IsPastDue":false}},"Metadata":{"RetryContext":{"RetryCount":0,"MaxRetryCount":3,"Exception":null}}}"#;
    let id =
        "x-azure-functions-invocationid: 5d3f3c2e-41b4-4c1a-9d0e-2b7c6a1f9e10\r\ncontent-type: application/json\r\n";
    assert_eq!(http(port, "POST /Orders", id, invocation), Some(500), "the tick fails: nothing answers at 127.0.0.1:1");
    // SIGTERM: the handler shuts down cleanly, which exports the metrics a last time (and fails to).
    let text = || format!("{}{}", stdout.lock().expect("out"), stderr.lock().expect("err"));
    let term = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill runs");
    assert!(term.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        assert!(Instant::now() < deadline, "the handler did not stop on SIGTERM:\n{}", text());
        std::thread::sleep(Duration::from_millis(20));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while (std::sync::Arc::strong_count(&stdout) > 1 || std::sync::Arc::strong_count(&stderr) > 1)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let output = text();
    assert!(output.contains("admin request refused"), "{output}");
    assert!(output.contains("tick failed"), "{output}");
    assert!(output.contains("metrics export started") && output.contains("shut down"), "{output}");
    assert_no_secret("serving the host", &output);
}

// ---------------------------------------------------------------------------------------------------------------
// The storage identity's client secret
// ---------------------------------------------------------------------------------------------------------------

/// `AzureWebJobsStorage__clientSecret`, shaped like an Entra ID secret (`~` and `.` in it).
const STORAGE_CLIENT_SECRET: &str = "Cs8Q~StorageClientSecret.2b7e-Zq~";
/// The secret as the form body of the token request carries it (`~` percent-encoded).
const STORAGE_CLIENT_SECRET_FORM: &str = "Cs8Q%7EStorageClientSecret.2b7e-Zq%7E";
const TENANT_ID: &str = "72f988bf-86f1-41af-91ab-2d7cd011db47";
const CLIENT_ID: &str = "3c1e9a0d-5b7f-4e2a-8d61-0f9b2c4a7e15";

/// Every form the client secret could take in the output: as set, form-encoded, base64.
fn client_secret_forms() -> Vec<(&'static str, String)> {
    use base64::Engine as _;
    vec![
        ("the storage client secret", STORAGE_CLIENT_SECRET.to_string()),
        ("the storage client secret, form-encoded", STORAGE_CLIENT_SECRET_FORM.to_string()),
        (
            "the storage client secret, base64",
            base64::engine::general_purpose::STANDARD.encode(STORAGE_CLIENT_SECRET).trim_end_matches('=').to_string(),
        ),
    ]
}

fn assert_no_client_secret(what: &str, text: &str) {
    for (kind, secret) in client_secret_forms() {
        assert!(!text.contains(&secret), "{what}: {kind} ({secret}) is in:\n{text}");
    }
}

/// A CA and a server certificate it signed for 127.0.0.1, made with the openssl CLI in a scratch folder.
struct Pki {
    dir: ScratchDir,
}

impl Pki {
    fn new() -> Self {
        let dir = ScratchDir::new("authority-pki").expect("the temp directory is writable");
        let openssl = |args: &[&str]| {
            let output = Command::new("openssl").args(args).current_dir(dir.path()).output().expect("openssl runs");
            assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
        };
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
        let ca = ["-x509", "-days", "2", "-subj", "/CN=test CA", "-keyout", "ca.key", "-out", "ca.pem"];
        let ca_ext = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"];
        openssl(&[&["req"][..], &key, &ca, &ca_ext].concat());
        let server = ["-subj", "/CN=127.0.0.1", "-keyout", "server.key", "-out", "server.csr"];
        openssl(&[&["req"][..], &key, &server].concat());
        let ext = "subjectAltName = IP:127.0.0.1\nbasicConstraints = CA:FALSE\nextendedKeyUsage = serverAuth\n";
        std::fs::write(dir.path().join("server.ext"), ext).expect("write server.ext");
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.pem",
        ]);
        Self { dir }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

/// How the loopback authority answers a token request.
#[derive(Clone, Copy, Debug)]
enum Answer {
    /// 400 invalid_client, as Entra ID answers a wrong or expired secret.
    InvalidClient,
    /// 500 with an Entra ID error body.
    ServerError,
    /// Reads the request and never answers.
    Never,
}

/// One request the authority received: its head (request line and headers) and its body.
struct Received {
    head: String,
    body: String,
}

/// An HTTPS server on 127.0.0.1 standing in for the Microsoft Entra authority (and for storage: the blob
/// endpoint points here too, so a request to storage would be recorded as well). Records every request.
struct Authority {
    port: u16,
    received: Arc<Mutex<Vec<Received>>>,
    stop: Arc<AtomicBool>,
}

impl Authority {
    fn start(pki: &Pki, answer: Answer) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = vec![CertificateDer::from_pem_file(pki.path("server.pem")).expect("server.pem")];
        let key = PrivateKeyDer::from_pem_file(pki.path("server.key")).expect("server.key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .expect("the server certificate");
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port();
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (log, stopped) = (received.clone(), stop.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let (config, log, stopped) = (config.clone(), log.clone(), stopped.clone());
                std::thread::spawn(move || serve(stream, config, answer, &log, &stopped));
            }
        });
        Self { port, received, stop }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    fn received(&self) -> std::sync::MutexGuard<'_, Vec<Received>> {
        self.received.lock().expect("requests")
    }
}

impl Drop for Authority {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Answers the requests of one connection as `answer` says, recording each.
fn serve(
    stream: TcpStream,
    config: Arc<rustls::ServerConfig>,
    answer: Answer,
    log: &Mutex<Vec<Received>>,
    stop: &AtomicBool,
) {
    let Ok(connection) = rustls::ServerConnection::new(config) else { return };
    let mut tls = rustls::StreamOwned::new(connection, stream);
    loop {
        let mut request = Vec::new();
        let mut byte = [0u8; 1];
        while !request.ends_with(b"\r\n\r\n") {
            match tls.read(&mut byte) {
                Ok(1) => request.push(byte[0]),
                _ => return,
            }
        }
        let head = String::from_utf8_lossy(&request).into_owned();
        let length = head
            .lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length").then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0u8; length];
        if tls.read_exact(&mut body).is_err() {
            return;
        }
        log.lock().expect("requests").push(Received { head, body: String::from_utf8_lossy(&body).into_owned() });
        let (status, error) = match answer {
            Answer::InvalidClient => (
                "400 Bad Request",
                r#"{"error":"invalid_client","error_description":"AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID.","error_codes":[7000215]}"#,
            ),
            Answer::ServerError => (
                "500 Internal Server Error",
                r#"{"error":"server_error","error_description":"AADSTS90033: A transient error has occurred. Please try again.","error_codes":[90033]}"#,
            ),
            Answer::Never => {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                return;
            }
        };
        let response = format!(
            "HTTP/1.1 {status}\r\nContent-Type: application/json; charset=utf-8\r\nContent-Length: {}\r\n\r\n{error}",
            error.len()
        );
        if tls.write_all(response.as_bytes()).and_then(|()| tls.flush()).is_err() {
            return;
        }
    }
}

/// The storage identity's client secret (`AzureWebJobsStorage__tenantId`, `__clientId`, `__clientSecret`) through
/// the real binary at trace level, with the Microsoft Entra authority (`AZURE_AUTHORITY_HOST`, as for a
/// sovereign cloud) on loopback refusing the secret, failing, and never answering: the output names the problem
/// and the settings to check and holds the secret in no form; the secret went to the authority, in the token
/// request's body only, and nothing went to storage without a token.
#[test]
fn the_storage_client_secret_goes_only_into_the_token_request_body() {
    let pki = Pki::new();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    let database = rt.block_on(async {
        let url = support::fixture().fresh_database("secrets_client_secret").await;
        let db = testbed::embedded::connect(&url).await.expect("connect");
        db.batch_execute(testbed::demo::ORDERS_SCHEMA).await.expect("the orders table");
        url
    });
    let app = AppBuilder::new().function("Orders", timer_function_json(Some(3)), Some(postgres_function("Pg"))).write();
    let token_path = format!("POST /{TENANT_ID}/oauth2/v2.0/token HTTP/1.1\r\n");

    // A refusal names the settings to fix; a failing or silent authority is transient (the next tick retries).
    let refused = "; check AzureWebJobsStorage__tenantId, AzureWebJobsStorage__clientId and \
                   AzureWebJobsStorage__clientSecret";
    let transient = "could not get an Entra ID token for storage, the authority did not answer or failed";
    for (what, answer, reached, named) in [
        ("an authority refusing the secret", Answer::InvalidClient, "AADSTS7000215", refused),
        ("an authority failing", Answer::ServerError, "AADSTS90033", transient),
        ("an authority that never answers", Answer::Never, "operation timed out", transient),
    ] {
        let authority = Authority::start(&pki, answer);
        let env = [
            ("Pg", database.clone()),
            ("AzureWebJobsStorage__blobServiceUri", format!("{}/devstoreaccount1", authority.url())),
            ("AzureWebJobsStorage__tenantId", TENANT_ID.to_string()),
            ("AzureWebJobsStorage__clientId", CLIENT_ID.to_string()),
            ("AzureWebJobsStorage__clientSecret", STORAGE_CLIENT_SECRET.to_string()),
            ("AZURE_AUTHORITY_HOST", authority.url()),
            ("SSL_CERT_FILE", pki.path("ca.pem")),
        ];
        let started = Instant::now();
        let output = run_once(&app, &env);
        let took = started.elapsed();
        assert_no_client_secret(what, &output);
        assert_no_secret(what, &output);
        assert!(output.contains(reached), "{what}: the failure path was not reached:\n{output}");
        assert!(output.contains(named), "{what}: the problem and its fix are not named:\n{output}");
        let hint = if named == refused { "needs an operator" } else { "transient: the next invocation retries" };
        assert!(output.contains(hint), "{what}: not classified as it should be:\n{output}");
        // Token requests keep storage's bounds: 3 tries of at most 10 s each per attempt, and a transient failure
        // makes `--give-up-after` try a second tick (the SDK's own client would wait 60 s per try, 9 tries).
        assert!(took < Duration::from_secs(90), "{what}: the run took {took:?}");

        let received = authority.received();
        assert!(!received.is_empty(), "{what}: no token request reached the authority:\n{output}");
        assert!(received.len() <= 6, "{what}: {} token requests, more than 2 ticks of 3 tries", received.len());
        for request in received.iter() {
            // Only token requests (storage, at the same address, was never asked anything without a token) ...
            assert!(request.head.starts_with(&token_path), "{what}: not a token request:\n{}", request.head);
            // ... carrying the secret in the body, form-encoded, and nowhere else.
            assert_no_client_secret(what, &request.head);
            let fields: Vec<&str> = request.body.split('&').collect();
            assert!(
                fields.contains(&format!("client_secret={STORAGE_CLIENT_SECRET_FORM}").as_str()),
                "{}",
                request.body
            );
            assert!(fields.contains(&format!("client_id={CLIENT_ID}").as_str()), "{}", request.body);
            assert!(fields.contains(&"grant_type=client_credentials"), "{}", request.body);
        }
    }
}
