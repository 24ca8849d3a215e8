//! PostgreSQL over TLS, against a real server: a throwaway CA and a server certificate for `localhost` and
//! 127.0.0.1 (or a self-signed one as Debian's ssl-cert makes it) made with the openssl CLI at test time, a
//! PostgreSQL of the test's own with `ssl=on`, and the cursor source built from an app folder exactly as the
//! handler builds it (app settings, sqltrigger.json).
//! The last tests run the real `handler` binary the same way.
//!
//! What each sslmode means with the verifying connector is in `src/db/postgres/tls.rs`; these tests pin
//! it: `require` and the default `prefer` verify the certificate and host name, `disable` is plaintext, and
//! the plain test servers everyone else uses keep working with the default.
//!
//! Connection strings name `localhost` (the name the certificate must list) and dial `hostaddr=127.0.0.1`:
//! `localhost` may also resolve to ::1, where the server does not listen, and tokio-postgres reports only the
//! last address's error, which would then hide the TLS error under test.

mod support;

use serde_json::{json, Value};
use sql_pseudo_trigger::app::App;
use sql_pseudo_trigger::config::PostgresTrust;
use sql_pseudo_trigger::config::{AppConfig, Env, Mode, Secret};
use sql_pseudo_trigger::db::postgres::{self as pg, ConnectFailure, PostgresTls};
use sql_pseudo_trigger::source::{Source, SourceError};
use std::path::Path;
use std::process::Command;
use support::{timer_function_json, AppBuilder, AppFolder};
use testbed::embedded::{self, EmbeddedPostgres, PostgresOptions, ScratchDir};

const FUNCTION: &str = "Orders";
/// What every refused certificate's message ends with, after the way out that fixes the certificate or the trust.
const OTHER_WAYS_OUT: &str = "(2) sslmode=disable in the connection string, where plaintext is acceptable (a local \
    server, a trusted network); (3) app setting Sql_Trigger_PostgresTrustServerCertificate=true, which encrypts \
    without verifying the certificate (for development only)";
const UNTRUSTED: &str = "the certificate of PostgreSQL server localhost is not signed by a certificate authority \
    this handler trusts; certificates are verified whenever TLS is used, with the default sslmode=prefer too. Ways \
    out: (1) set app setting Sql_Trigger_PostgresRootCertificate to the certificate of the CA that signed it, a PEM \
    file or the PEM text (for a self-signed certificate, the certificate itself; Debian's and Ubuntu's is \
    /etc/ssl/certs/ssl-cert-snakeoil.pem); (2) sslmode=disable in the connection string, where plaintext is \
    acceptable (a local server, a trusted network); (3) app setting Sql_Trigger_PostgresTrustServerCertificate=true, \
    which encrypts without verifying the certificate (for development only)";

// ---------------------------------------------------------------------------------------------------------------
// Fixtures: certificates, a TLS server, an app folder
// ---------------------------------------------------------------------------------------------------------------

/// A CA and a server certificate it signed (with `digest`), for `localhost` and 127.0.0.1, in a scratch folder.
struct Pki {
    dir: ScratchDir,
}

impl Pki {
    fn new(digest: &str) -> Self {
        let dir = ScratchDir::new("pki").expect("the temp directory is writable");
        let run = |args: &[&str]| openssl(dir.path(), args);
        let ec = "ec_paramgen_curve:P-256";
        run(&["req", "-x509", "-newkey", "ec", "-pkeyopt", ec, "-nodes", "-keyout", "ca.key", "-out", "ca.pem"]);
        run(&["req", "-newkey", "ec", "-pkeyopt", ec, "-nodes", "-keyout", "server.key", "-out", "server.csr"]);
        let ext = "subjectAltName = DNS:localhost, IP:127.0.0.1\nbasicConstraints = CA:FALSE\n\
                   keyUsage = critical, digitalSignature\nextendedKeyUsage = serverAuth\n";
        std::fs::write(dir.path().join("server.ext"), ext).expect("write server.ext");
        run(&[
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
            &format!("-{digest}"),
            "-out",
            "server.pem",
        ]);
        Self { dir }
    }

    /// A self-signed certificate for `name` made as Debian's and Ubuntu's ssl-cert makes the "snakeoil" one their
    /// PostgreSQL packages serve (its template and command: CN and subjectAltName DNS:`name`, no address,
    /// CA:FALSE, RSA 2048), as server.pem and server.key.
    fn snakeoil(name: &str) -> Self {
        let dir = ScratchDir::new("pki").expect("the temp directory is writable");
        let template = format!(
            "[ req ]\ndefault_bits = 2048\ndistinguished_name = req_distinguished_name\nprompt = no\n\
             x509_extensions = v3_req\n[ req_distinguished_name ]\ncommonName = {name}\n[ v3_req ]\n\
             basicConstraints = CA:FALSE\nsubjectAltName = DNS:{name}\n"
        );
        std::fs::write(dir.path().join("snakeoil.cnf"), template).expect("write snakeoil.cnf");
        let req = ["req", "-config", "snakeoil.cnf", "-new", "-x509", "-days", "2", "-nodes", "-sha256"];
        openssl(dir.path(), &[&req[..], &["-out", "server.pem", "-keyout", "server.key"]].concat());
        Self { dir }
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(name)).expect("a generated file")
    }
}

/// Runs the openssl CLI in `dir`. `req` gets the CA's subject and extensions, or the server's subject, unless
/// it names a configuration file that says everything itself.
fn openssl(dir: &Path, args: &[&str]) {
    let mut command = Command::new("openssl");
    command.args(args).current_dir(dir);
    match args {
        ["req", "-config", ..] => &mut command,
        ["req", "-x509", ..] => command.args(["-days", "2", "-subj", "/CN=sql-pseudo-trigger test CA"]).args([
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]),
        ["req", ..] => command.args(["-subj", "/CN=localhost"]),
        _ => &mut command,
    };
    let output = command.output().expect("the openssl CLI runs");
    assert!(output.status.success(), "openssl {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
}

/// A PostgreSQL of this test's own with `ssl=on` and the certificate of `pki`. `hba` replaces pg_hba.conf.
fn tls_server(pki: &Pki, hba: Option<&str>) -> EmbeddedPostgres {
    let mut options = PostgresOptions::default()
        .file("server.pem", pki.read("server.pem"))
        .file("server.key", pki.read("server.key"))
        .setting("ssl", "on")
        .setting("ssl_cert_file", "server.pem")
        .setting("ssl_key_file", "server.key");
    if let Some(hba) = hba {
        options = options.file("pg_hba.conf", hba);
    }
    EmbeddedPostgres::start_with(options).unwrap_or_else(|e| panic!("cannot start a TLS PostgreSQL: {e}"))
}

/// A fresh database on the server at `admin_url` with the demo `orders` table and orders 1, 2 and 3; its name.
async fn orders_database(admin_url: &str) -> String {
    let name = support::unique_database_name("tls");
    let url = embedded::create_database(admin_url, &name).await.expect("create the database");
    let db = embedded::connect(&url).await.expect("connect in plaintext as the admin");
    db.batch_execute(testbed::demo::ORDERS_SCHEMA).await.expect("create orders");
    db.batch_execute("INSERT INTO orders (id, customer, amount) VALUES (1, 'a', 1), (2, 'b', 2), (3, 'c', 3)")
        .await
        .expect("insert orders");
    name
}

/// An app folder with one function on `orders`, file state, `Pg` = `connection` and extra `settings`; the
/// CA of `pki` is at certs/ca.pem in it, for settings that name it.
fn orders_app(pki: &Pki, connection: &str, settings: &[(&str, &str)]) -> AppFolder {
    let mut trigger: Value = serde_json::from_str(testbed::demo::ORDERS_TRIGGER).expect("demo trigger");
    trigger["connectionStringSetting"] = json!("Pg");
    let builder = AppBuilder::new()
        .function(FUNCTION, timer_function_json(Some(3)), Some(trigger))
        .file("certs/ca.pem", &pki.read("ca.pem"))
        .setting("Pg", connection)
        .setting("Sql_Trigger_StateStore", "file");
    settings.iter().fold(builder, |b, (k, v)| b.setting(k, v)).write()
}

/// The app in `folder`, loaded as the handler loads it.
fn load(folder: &AppFolder) -> App {
    let env = Env::from_pairs([]).with_local_settings(folder.root()).expect("local.settings.json");
    AppConfig::load_for(folder.root(), env, Mode::Host).and_then(App::build).unwrap_or_else(|e| panic!("{e}"))
}

fn source(app: &App) -> &dyn Source {
    app.trigger(FUNCTION).expect("the function is loaded").source().as_ref()
}

/// The ids the source reads from the start.
async fn fetch_ids(source: &dyn Source) -> Result<Vec<i64>, SourceError> {
    let fetched = source.fetch(&Value::Null, 10).await?;
    Ok(fetched
        .changes
        .iter()
        .map(|c| {
            let item: Value = serde_json::from_str(c.item.get()).expect("item JSON");
            item["id"].as_i64().expect("an id")
        })
        .collect())
}

/// Whether the connections named `application_name` in the server at `admin_url` are encrypted, as the server
/// sees them (pg_stat_ssl).
async fn encrypted_sessions(admin_url: &str, application_name: &str) -> Vec<bool> {
    let admin = embedded::connect(admin_url).await.expect("admin connection");
    admin
        .query(
            "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.application_name = $1",
            &[&application_name],
        )
        .await
        .expect("pg_stat_ssl")
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Connects through `pool()` as sources and sinks do and asks the server whether this session is encrypted.
async fn session_is_encrypted(connection: &str, tls: &PostgresTls) -> Result<bool, ConnectFailure> {
    let pool = pg::pool("Pg", &Secret::new(connection), 1, tls).expect("a valid connection string");
    let client = pool.get().await.map_err(|e| pg::connect_failure("Pg", &e))?;
    let row =
        client.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[]).await.expect("pg_stat_ssl");
    Ok(row.get(0))
}

fn tls_from(pairs: &[(&str, &str)], root: &Path) -> PostgresTls {
    let env = Env::from_pairs(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    PostgresTrust::from_env(&env, root).map(PostgresTls::new).unwrap_or_else(|e| panic!("{e:?}"))
}

// ---------------------------------------------------------------------------------------------------------------
// The source against a TLS server
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn with_the_private_ca_configured_the_source_reads_rows_over_verified_tls() {
    // GIVEN a TLS server whose certificate a private CA signed, and the app trusting that CA by file path
    let pki = Pki::new("sha256");
    let server = tls_server(&pki, None);
    let db = orders_database(&server.url()).await;
    let connection = format!(
        "host=localhost hostaddr=127.0.0.1 port={} user=postgres dbname={db} sslmode=require application_name=tls_verified",
        server.port()
    );
    let app = load(&orders_app(&pki, &connection, &[("Sql_Trigger_PostgresRootCertificate", "certs/ca.pem")]));

    // WHEN the source reads from the start
    let ids = fetch_ids(source(&app)).await;

    // THEN it reads every row, and the server sees the source's session as encrypted
    assert_eq!(ids.expect("the source connects"), [1, 2, 3]);
    assert_eq!(encrypted_sessions(&server.url(), "tls_verified").await, [true]);
}

#[tokio::test]
async fn without_the_ca_the_source_refuses_the_server_and_names_the_setting_that_adds_one() {
    // GIVEN the same kind of server, and an app that does not trust its CA
    let pki = Pki::new("sha256");
    let server = tls_server(&pki, None);
    let db = orders_database(&server.url()).await;
    let connection =
        format!("host=localhost hostaddr=127.0.0.1 port={} user=postgres dbname={db} sslmode=require", server.port());
    let app = load(&orders_app(&pki, &connection, &[]));

    // WHEN the source checks the table (the handler's start-up check)
    let error = source(&app).validate().await.expect_err("an untrusted certificate must not connect");

    // THEN an operator is told what is wrong and which setting fixes it
    match error {
        SourceError::Invalid(message) => {
            assert_eq!(message, format!("cannot connect to PostgreSQL (app setting Pg): {UNTRUSTED}"))
        }
        other => panic!("expected Invalid (needs an operator), got {other:?}"),
    }
}

#[tokio::test]
async fn the_default_sslmode_prefer_verifies_too_when_the_server_offers_tls() {
    // GIVEN no sslmode in the connection string (prefer) and no CA: stricter than libpq's prefer, on purpose
    let pki = Pki::new("sha256");
    let server = tls_server(&pki, None);
    let connection = format!("host=localhost hostaddr=127.0.0.1 port={} user=postgres", server.port());

    // WHEN a connection is opened
    let result = session_is_encrypted(&connection, &PostgresTls::default()).await;

    // THEN the unverifiable certificate fails it; there is no fallback to plaintext
    assert_eq!(
        result,
        Err(ConnectFailure::Misconfigured(format!("cannot connect to PostgreSQL (app setting Pg): {UNTRUSTED}")))
    );
}

#[tokio::test]
async fn sslmode_disable_connects_in_plaintext_to_a_server_that_offers_tls() {
    // GIVEN a TLS server and no CA, but sslmode=disable
    let pki = Pki::new("sha256");
    let server = tls_server(&pki, None);
    let db = orders_database(&server.url()).await;
    let connection = format!(
        "host=localhost hostaddr=127.0.0.1 port={} user=postgres dbname={db} sslmode=disable application_name=tls_plain",
        server.port()
    );

    // WHEN the source reads
    let app = load(&orders_app(&pki, &connection, &[]));
    let ids = fetch_ids(source(&app)).await;

    // THEN it reads every row over a plaintext session, as does any pool connection
    assert_eq!(ids.expect("plaintext connects"), [1, 2, 3]);
    assert_eq!(encrypted_sessions(&server.url(), "tls_plain").await, [false]);
    assert_eq!(session_is_encrypted(&connection, &PostgresTls::default()).await, Ok(false));
}

#[tokio::test]
async fn a_host_name_the_certificate_does_not_list_is_refused_with_the_names_it_does_list() {
    // GIVEN the CA trusted, but a host name that is not in the certificate (hostaddr dials the right server)
    let pki = Pki::new("sha256");
    let server = tls_server(&pki, None);
    let tls = tls_from(&[("Sql_Trigger_PostgresRootCertificate", "ca.pem")], pki.dir.path());
    let connection =
        format!("host=db.example.test hostaddr=127.0.0.1 port={} user=postgres sslmode=require", server.port());

    // WHEN a connection is opened
    let result = session_is_encrypted(&connection, &tls).await;

    // THEN the mismatch is named, with the names the certificate is for
    assert_eq!(
        result,
        Err(ConnectFailure::Misconfigured(format!(
            "cannot connect to PostgreSQL (app setting Pg): the certificate of PostgreSQL server db.example.test is \
             not valid for the name db.example.test (it is for localhost, 127.0.0.1). Ways out: (1) connect with a \
             host name the certificate lists (hostaddr= can give the address to dial), or reissue it with \
             db.example.test in its subjectAltName; {OTHER_WAYS_OUT}"
        )))
    );
    // AND the same server verifies by the address the certificate lists
    let by_address = format!("host=127.0.0.1 port={} user=postgres sslmode=require", server.port());
    assert_eq!(session_is_encrypted(&by_address, &tls).await, Ok(true));
}

#[tokio::test]
async fn an_address_without_a_host_name_cannot_be_verified_and_says_to_add_one() {
    // GIVEN a TLS server dialled by hostaddr alone: there is no name to check the certificate against
    let pki = Pki::new("sha256");
    let server = tls_server(&pki, None);
    let tls = tls_from(&[("Sql_Trigger_PostgresRootCertificate", "ca.pem")], pki.dir.path());
    let connection = format!("hostaddr=127.0.0.1 port={} user=postgres", server.port());

    // WHEN a connection is opened with the default sslmode
    let result = session_is_encrypted(&connection, &tls).await;

    // THEN it is refused, saying which key to add
    assert_eq!(
        result,
        Err(ConnectFailure::Misconfigured(
            "cannot connect to PostgreSQL (app setting Pg): the server offers TLS, but the connection string gives \
             no host name to verify its certificate against (hostaddr= alone); add host= with the name the \
             certificate lists"
                .into()
        ))
    );
}

/// Issue 18's case: a stock Debian or Ubuntu PostgreSQL (ssl = on, ssl-cert's self-signed certificate for the
/// machine's name), reached at 127.0.0.1 with no sslmode, which psql accepts because its prefer verifies nothing.
#[tokio::test]
async fn a_self_signed_certificate_reached_by_address_names_every_way_out_and_each_one_connects() {
    // GIVEN a server whose certificate is self-signed for pg.example.test and lists no address
    let pki = Pki::snakeoil("pg.example.test");
    let server = tls_server(&pki, None);
    let by_address = format!("postgres://postgres@127.0.0.1:{}/postgres", server.port());

    // WHEN the handler connects by address, with the default sslmode and the platform's roots only
    let refused = session_is_encrypted(&by_address, &PostgresTls::default()).await;

    // THEN it is refused, and the message names every way out, with the name the certificate lists
    assert_eq!(
        refused,
        Err(ConnectFailure::Misconfigured(format!(
            "cannot connect to PostgreSQL (app setting Pg): the certificate of PostgreSQL server 127.0.0.1 is not \
             signed by a certificate authority this handler trusts; certificates are verified whenever TLS is used, \
             with the default sslmode=prefer too. Ways out: (1) set app setting Sql_Trigger_PostgresRootCertificate \
             to the certificate of the CA that signed it, a PEM file or the PEM text (for a self-signed certificate, \
             the certificate itself; Debian's and Ubuntu's is /etc/ssl/certs/ssl-cert-snakeoil.pem), and connect \
             with a host name it lists (pg.example.test) rather than 127.0.0.1 (hostaddr=127.0.0.1 keeps dialling \
             that address); {OTHER_WAYS_OUT}"
        )))
    );

    // AND way (1): the certificate trusted, by a name it lists, dialling the same address, connects encrypted
    let trusted = tls_from(&[("Sql_Trigger_PostgresRootCertificate", "server.pem")], pki.dir.path());
    let by_name =
        format!("host=pg.example.test hostaddr=127.0.0.1 port={} user=postgres dbname=postgres", server.port());
    assert_eq!(session_is_encrypted(&by_name, &trusted).await, Ok(true));
    // AND trusted but still by address, the certificate's name is what is missing, and the message says so
    let still_by_address = session_is_encrypted(&by_address, &trusted).await.expect_err("127.0.0.1 is not listed");
    assert!(
        still_by_address.message().contains("not valid for the name 127.0.0.1 (it is for pg.example.test)"),
        "{still_by_address:?}"
    );
    // AND way (2): sslmode=disable connects in plaintext
    let plaintext = format!("{by_address}?sslmode=disable");
    assert_eq!(session_is_encrypted(&plaintext, &PostgresTls::default()).await, Ok(false));
    // AND way (3): trusting any certificate connects encrypted, by address
    let any = tls_from(&[("Sql_Trigger_PostgresTrustServerCertificate", "true")], pki.dir.path());
    assert_eq!(session_is_encrypted(&by_address, &any).await, Ok(true));
}

#[tokio::test]
async fn trusting_any_certificate_encrypts_without_verifying_issuer_or_name() {
    // GIVEN Sql_Trigger_PostgresTrustServerCertificate=true, no CA, and a name the certificate does not list
    let pki = Pki::new("sha256");
    let server = tls_server(&pki, None);
    let tls = tls_from(&[("Sql_Trigger_PostgresTrustServerCertificate", "true")], pki.dir.path());
    let connection =
        format!("host=db.example.test hostaddr=127.0.0.1 port={} user=postgres sslmode=require", server.port());

    // WHEN a connection is opened THEN it is encrypted all the same
    assert_eq!(session_is_encrypted(&connection, &tls).await, Ok(true));
}

// ---------------------------------------------------------------------------------------------------------------
// Plain servers (no TLS)
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn the_plain_test_servers_keep_working_with_the_default_sslmode() {
    // GIVEN the shared embedded server, which has no TLS, and a connection string without sslmode
    let url = support::fixture().postgres_url();

    // WHEN a connection is opened through the verifying connector THEN the server declines TLS and it is plain
    assert_eq!(session_is_encrypted(&url, &PostgresTls::default()).await, Ok(false));
}

#[tokio::test]
async fn sslmode_require_against_a_server_without_tls_says_so() {
    // GIVEN a server without TLS and sslmode=require
    let connection = format!("{}?sslmode=require", support::fixture().postgres_url());

    // WHEN a connection is opened
    let result = session_is_encrypted(&connection, &PostgresTls::default()).await;

    // THEN the error says the server has no TLS and what to change
    assert_eq!(
        result,
        Err(ConnectFailure::Misconfigured(
            "cannot connect to PostgreSQL (app setting Pg): the server does not support TLS, but the connection \
             string requires it (sslmode=require, verify-ca or verify-full); turn TLS on at the server (ssl = on, \
             with a certificate), or lower sslmode to prefer where a plaintext connection is acceptable"
                .into()
        ))
    );
}

// ---------------------------------------------------------------------------------------------------------------
// SCRAM channel binding
// ---------------------------------------------------------------------------------------------------------------

const HBA: &str = "local all all trust\n\
                   hostssl all binder 127.0.0.1/32 scram-sha-256\n\
                   host all postgres 127.0.0.1/32 trust\n";

#[tokio::test]
async fn scram_is_bound_to_the_tls_session_for_sha256_and_sha384_signed_certificates() {
    for digest in ["sha256", "sha384"] {
        // GIVEN a server that lets `binder` in only over TLS with SCRAM, its certificate signed with `digest`
        let pki = Pki::new(digest);
        let server = tls_server(&pki, Some(HBA));
        let admin = embedded::connect(&server.url()).await.expect("admin connection");
        admin.batch_execute("CREATE ROLE binder LOGIN PASSWORD 'Binder-Pass-42'").await.expect("create role");
        let tls = tls_from(&[("Sql_Trigger_PostgresRootCertificate", "ca.pem")], pki.dir.path());
        let connection = |password: &str| {
            format!(
                "host=localhost hostaddr=127.0.0.1 port={} user=binder password={password} dbname=postgres sslmode=require \
                 channel_binding=require",
                server.port()
            )
        };

        // WHEN binder connects demanding channel binding (SCRAM-SHA-256-PLUS, tls-server-end-point)
        let bound = session_is_encrypted(&connection("Binder-Pass-42"), &tls).await;

        // THEN the server accepted the binding computed from the certificate's signature hash
        assert_eq!(bound, Ok(true), "{digest}");
        // AND a wrong password fails with the server's words, never the password
        let refused = session_is_encrypted(&connection("Wrong-Pass-13"), &tls).await.expect_err("wrong password");
        assert!(refused.message().contains("password authentication failed for user \"binder\""), "{refused:?}");
        assert!(!refused.message().contains("Wrong-Pass-13"), "a password leaked: {refused:?}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// The real handler
// ---------------------------------------------------------------------------------------------------------------

fn delivered_ids(messages: &[Value]) -> Vec<i64> {
    messages.iter().map(|m| m["Item"]["id"].as_i64().unwrap_or_else(|| panic!("no Item.id in {m}"))).collect()
}

#[tokio::test]
async fn the_handler_delivers_from_a_tls_server_whose_ca_is_given_as_pem_text() {
    // GIVEN a TLS server, the CA's PEM text itself in Sql_Trigger_PostgresRootCertificate, and libpq's
    // sslmode=verify-full as psql users write it
    let pki = Pki::new("sha256");
    let server = tls_server(&pki, None);
    let db = orders_database(&server.url()).await;
    let connection =
        format!("postgres://postgres@localhost:{}/{db}?sslmode=verify-full&hostaddr=127.0.0.1", server.port());
    let app = orders_app(&pki, &connection, &[("Sql_Trigger_PostgresRootCertificate", &pki.read("ca.pem"))]);
    let host = app.start_handler(&[]).await;

    // WHEN the timer fires
    let run = host.run_timer(FUNCTION).await.expect("timer run");

    // THEN the three orders are delivered
    assert!(run.succeeded, "{:?}\n{}", run.attempts.last().map(|a| &a.outcome), host.output());
    assert_eq!(delivered_ids(&run.applied["changes"]), [1, 2, 3]);
}

#[tokio::test]
async fn the_handler_reports_an_untrusted_certificate_at_start_up_with_the_setting_to_fix_it() {
    // GIVEN a TLS server whose CA the app does not trust, and a password in the connection string
    let pki = Pki::new("sha256");
    let server = tls_server(&pki, None);
    let db = orders_database(&server.url()).await;
    let connection = format!(
        "postgres://postgres:Never-Logged-7@localhost:{}/{db}?sslmode=require&hostaddr=127.0.0.1",
        server.port()
    );
    let app = orders_app(&pki, &connection, &[]);

    // WHEN the handler starts (its start-up check connects) and the timer fires
    let host = app.start_handler(&[]).await;
    let run = host.run_timer(FUNCTION).await.expect("timer run");

    // THEN nothing is delivered, the log names the problem and the setting, and no secret is printed
    assert!(!run.succeeded, "an untrusted server must not deliver");
    let log = host.output();
    assert!(log.contains(UNTRUSTED), "the log lacks the certificate error:\n{log}");
    assert!(!log.contains("Never-Logged-7"), "a password leaked:\n{log}");
}

#[tokio::test]
async fn trusting_any_certificate_delivers_and_is_warned_about_at_start_up() {
    // GIVEN the escape hatch, and a server whose CA nobody configured
    let pki = Pki::new("sha256");
    let server = tls_server(&pki, None);
    let db = orders_database(&server.url()).await;
    let connection = format!("postgres://postgres@localhost:{}/{db}?sslmode=require&hostaddr=127.0.0.1", server.port());
    let app = orders_app(&pki, &connection, &[("Sql_Trigger_PostgresTrustServerCertificate", "true")]);

    // WHEN the handler starts and the timer fires
    let host = app.start_handler(&[]).await;
    let run = host.run_timer(FUNCTION).await.expect("timer run");

    // THEN the orders are delivered, and the start-up log warned that nothing is verified
    assert!(run.succeeded, "{:?}\n{}", run.attempts.last().map(|a| &a.outcome), host.output());
    assert_eq!(delivered_ids(&run.applied["changes"]), [1, 2, 3]);
    let log = host.output();
    assert!(
        log.lines().any(|l| l.contains("WARN")
            && l.contains(
                "Sql_Trigger_PostgresTrustServerCertificate=true: PostgreSQL server certificates and host \
                           names are not verified"
            )),
        "no start-up warning in:\n{log}"
    );
}
