//! No secret in the output, even at trace level, through the failure paths: the real binary, logging
//! everything it and its libraries log (`Sql_Trigger_LogLevel=Trace`), with a wrong PostgreSQL password against
//! a real server that checks it, unreachable PostgreSQL and SQL Server, a storage account key and a SAS that
//! real Azurite refuses, a SAS sent to storage that does not answer, a webhook sink that does not answer, the
//! admin key on its routes and metrics exporters that cannot export. Every secret kind the configuration
//! reference lists is set to a value found nowhere else, and the whole output (stdout and stderr) must hold
//! none of them. Each failure path is shown to be reached by what it logs.

use crate::common::{http, read_all};
use crate::support::{self, timer_function_json, AppBuilder, AppFolder};
use serde_json::json;
use std::process::{Command, Stdio};
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
