//! Each form of connection string users write, and what the driver is given for it; the refusals, and that
//! none of them repeats a password.

use super::*;
use tokio_postgres::config::{Host, SslMode};

/// What a connection string says, as the driver's `Config` holds it.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    hosts: Vec<String>,
    hostaddrs: Vec<String>,
    ports: Vec<u16>,
    user: Option<String>,
    password: Option<String>,
    dbname: Option<String>,
    ssl: SslMode,
}

fn seen(text: &str) -> Seen {
    let config = parse("Pg", text).unwrap_or_else(|e| panic!("{text:?} must parse: {e}"));
    Seen {
        hosts: config
            .get_hosts()
            .iter()
            .map(|host| match host {
                Host::Tcp(name) => name.clone(),
                Host::Unix(path) => path.display().to_string(),
            })
            .collect(),
        hostaddrs: config.get_hostaddrs().iter().map(ToString::to_string).collect(),
        ports: config.get_ports().to_vec(),
        user: config.get_user().map(str::to_owned),
        password: config.get_password().map(|p| String::from_utf8(p.to_vec()).expect("a UTF-8 password")),
        dbname: config.get_dbname().map(str::to_owned),
        ssl: config.get_ssl_mode(),
    }
}

/// The server, database and login most tests expect: only the user and password vary.
fn shop(user: &str, password: &str, ssl: SslMode) -> Seen {
    Seen {
        hosts: vec!["db.example.com".into()],
        hostaddrs: vec![],
        ports: vec![5432],
        user: Some(user.into()),
        password: Some(password.into()),
        dbname: Some("shop".into()),
        ssl,
    }
}

fn refusal(text: &str) -> String {
    parse("Pg", text).map(|_| ()).expect_err("must be refused")
}

// ---------------------------------------------------------------------------------------------------------------
// The two forms
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn the_uri_form_reads_every_part() {
    assert_eq!(
        seen("postgres://app:Secret1@db.example.com:5432/shop?sslmode=require"),
        shop("app", "Secret1", SslMode::Require)
    );
    assert_eq!(
        seen("postgresql://app:Secret1@db.example.com/shop"),
        shop("app", "Secret1", SslMode::Prefer),
        "postgresql:// too; the port defaults to 5432 and sslmode to prefer"
    );
}

#[test]
fn the_key_value_form_reads_every_part_with_spaces_around_equals_and_quoted_values() {
    assert_eq!(
        seen("host=db.example.com port=5432 dbname=shop user=app password=Secret1 sslmode=require"),
        shop("app", "Secret1", SslMode::Require)
    );
    assert_eq!(
        seen("  host = db.example.com port= 5432 dbname ='shop' user=app password = 'Secret 1'  sslmode=require "),
        shop("app", "Secret 1", SslMode::Require)
    );
}

#[test]
fn verify_full_and_verify_ca_are_read_as_require_in_both_forms() {
    for mode in ["verify-full", "verify-ca"] {
        // GIVEN libpq's verifying modes, as psql users write them
        let uri = format!("postgres://app:Secret1@db.example.com/shop?sslmode={mode}");
        let key_value = format!("host=db.example.com port=5432 dbname=shop user=app password=Secret1 sslmode={mode}");
        let quoted = format!("host=db.example.com port=5432 dbname=shop user=app password=Secret1 sslmode = '{mode}'");
        // WHEN read THEN each is require, which verifies the certificate and the host name here
        for text in [uri, key_value, quoted] {
            assert_eq!(seen(&text), shop("app", "Secret1", SslMode::Require), "{text}");
        }
    }
    // libpq's JDBC spelling in a URI
    assert_eq!(seen("postgres://app:Secret1@db.example.com/shop?ssl=true"), shop("app", "Secret1", SslMode::Require));
}

#[test]
fn only_the_sslmode_option_is_rewritten_never_a_value_that_mentions_it() {
    // A password that reads like an option stays as it is, and the options around sslmode are kept.
    let text = "host=db.example.com port=5432 dbname=shop user=app password='a sslmode=verify-full' \
                sslmode=verify-ca application_name=orders";
    assert_eq!(seen(text), shop("app", "a sslmode=verify-full", SslMode::Require));
    let config = parse("Pg", text).expect("parses");
    assert_eq!(config.get_application_name(), Some("orders"));

    let uri =
        "postgres://app:Secret1@db.example.com/shop?application_name=orders&sslmode=verify-full&connect_timeout=5";
    let config = parse("Pg", uri).expect("parses");
    assert_eq!(config.get_ssl_mode(), SslMode::Require);
    assert_eq!(config.get_application_name(), Some("orders"));
    assert_eq!(config.get_connect_timeout(), Some(&std::time::Duration::from_secs(5)));
}

#[test]
fn disable_prefer_and_require_are_read_as_written() {
    for (mode, expected) in [("disable", SslMode::Disable), ("prefer", SslMode::Prefer), ("require", SslMode::Require)]
    {
        assert_eq!(seen(&format!("host=db.example.com sslmode={mode}")).ssl, expected, "{mode}");
        assert_eq!(seen(&format!("postgres://db.example.com/shop?sslmode={mode}")).ssl, expected, "{mode}");
    }
}

#[test]
fn hostaddr_gives_the_address_to_dial_and_host_the_name_to_verify() {
    let expected = Seen { hostaddrs: vec!["10.0.0.5".into()], ..shop("app", "Secret1", SslMode::Require) };
    assert_eq!(
        seen("host=db.example.com hostaddr=10.0.0.5 port=5432 dbname=shop user=app password=Secret1 sslmode=require"),
        expected
    );
    assert_eq!(seen("postgres://app:Secret1@db.example.com/shop?hostaddr=10.0.0.5&sslmode=require"), expected);
}

// ---------------------------------------------------------------------------------------------------------------
// Azure Single Server's user names (user@server)
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn azure_user_at_server_names_read_in_both_forms() {
    let azure = |ssl| Seen {
        hosts: vec!["myserver.postgres.database.azure.com".into()],
        ..shop("myadmin@myserver", "Secret1", ssl)
    };
    assert_eq!(
        seen(
            "host=myserver.postgres.database.azure.com port=5432 dbname=shop user=myadmin@myserver \
             password=Secret1 sslmode=verify-full"
        ),
        azure(SslMode::Require)
    );
    assert_eq!(
        seen("postgres://myadmin%40myserver:Secret1@myserver.postgres.database.azure.com:5432/shop?sslmode=require"),
        azure(SslMode::Require),
        "percent-encoded in the URI's user name"
    );
    assert_eq!(
        seen("postgres://myserver.postgres.database.azure.com:5432/shop?user=myadmin@myserver&password=Secret1"),
        azure(SslMode::Prefer),
        "in the query, where libpq reads an @ as it is"
    );
}

#[test]
fn tokio_postgres_alone_misreads_an_unencoded_at_which_is_why_it_is_checked_first() {
    // With a password, the rest of the user name and the password become host and port: the port is refused.
    let error = "postgres://myadmin@myserver:Secret1@myserver.postgres.database.azure.com/shop"
        .parse::<Config>()
        .expect_err("tokio-postgres refuses it");
    assert_eq!(error.source().map(ToString::to_string).as_deref(), Some("invalid value for option `port`"));
    // Without one, it would dial a host named myserver@myserver...
    let config = "postgres://myadmin@myserver@myserver.postgres.database.azure.com/shop"
        .parse::<Config>()
        .expect("tokio-postgres takes it");
    assert_eq!(config.get_hosts(), [Host::Tcp("myserver@myserver.postgres.database.azure.com".into())]);
    // An @ in the query (where libpq reads it as it is) ends tokio-postgres's user name.
    let config = "postgres://myserver.postgres.database.azure.com/shop?user=myadmin@myserver"
        .parse::<Config>()
        .expect("tokio-postgres takes it");
    assert_eq!(config.get_user(), Some("myserver.postgres.database.azure.com/shop?user=myadmin"));
}

#[test]
fn an_unencoded_at_in_a_uri_user_name_is_refused_with_how_to_encode_it() {
    let expected = "app setting Pg: the user name or password of the connection string holds an @ that is not \
                    percent-encoded, so part of it would be read as the host; in a URI, percent-encode the special \
                    characters of the user name and password (@ as %40, / as %2F, : as %3A, ? as %3F, # as %23, % \
                    as %25, a space as %20), or use the key=value form: host=... user=... password='...' (Azure \
                    Single Server's user name myadmin@myserver is written myadmin%40myserver)";
    for text in [
        "postgres://myadmin@myserver:Tango7@myserver.postgres.database.azure.com/shop",
        "postgres://myadmin@myserver@myserver.postgres.database.azure.com/shop",
        "postgres://app:Tan@go7@db.example.com/shop",
    ] {
        assert_eq!(refusal(text), expected, "{text}");
    }
}

// ---------------------------------------------------------------------------------------------------------------
// Passwords with special characters
// ---------------------------------------------------------------------------------------------------------------

/// Every character that needs care somewhere: URI delimiters, the percent sign, a space, both quotes and a
/// backslash.
const SPECIAL: &str = r#"p@s:s/w#o?r%d &='q"\"#;

#[test]
fn a_password_with_special_characters_reads_percent_encoded_in_a_uri() {
    let text = "postgres://app:p%40s%3As%2Fw%23o%3Fr%25d%20%26%3D%27q%22%5C@db.example.com/shop";
    assert_eq!(seen(text), shop("app", SPECIAL, SslMode::Prefer));
}

#[test]
fn a_password_with_special_characters_reads_single_quoted_in_key_value_form() {
    let text = r#"host=db.example.com port=5432 dbname=shop user=app password='p@s:s/w#o?r%d &=\'q"\\'"#;
    assert_eq!(seen(text), shop("app", SPECIAL, SslMode::Prefer));
    // Unquoted, a backslash escapes the next character, a space included, as in libpq.
    assert_eq!(
        seen(r"host=db.example.com port=5432 dbname=shop user=app password=a\ b\\c").password.as_deref(),
        Some(r"a b\c")
    );
}

#[test]
fn a_uri_password_may_hold_colon_question_mark_hash_and_space_unencoded_as_libpq_reads_it() {
    assert_eq!(seen("postgres://app:a:b?c#d e@db.example.com/shop"), shop("app", "a:b?c#d e", SslMode::Prefer));
}

// ---------------------------------------------------------------------------------------------------------------
// Refusals
// ---------------------------------------------------------------------------------------------------------------

#[test]
fn an_unquoted_password_with_a_space_is_refused_naming_the_option_not_the_words() {
    assert_eq!(
        refusal("host=db.example.com user=app password=Tango7 Foxtrot8"),
        "app setting Pg is not a PostgreSQL connection string: text that is not key=value follows the value of \
         option password; single-quote a value that holds spaces (password='my secret'), writing \\' for a quote \
         and \\\\ for a backslash inside it"
    );
}

#[test]
fn an_unterminated_quote_and_a_missing_value_name_their_option() {
    assert_eq!(
        refusal("host=db.example.com user=app password='Tango7"),
        "app setting Pg: the value of option password opens a quote (') that is never closed; single-quote a \
         value that holds spaces (password='my secret'), writing \\' for a quote and \\\\ for a backslash inside it"
    );
    assert_eq!(
        refusal("host=db.example.com user=app password="),
        "app setting Pg: option password has no value after its =; write '' for an empty value"
    );
    assert_eq!(
        seen("host=db.example.com port=5432 dbname=shop user=app password=''").password.as_deref(),
        Some(""),
        "'' is an empty value"
    );
}

#[test]
fn a_pair_without_a_key_is_refused_where_tokio_postgres_would_stop_reading() {
    assert!("host=db.example.com =Tango7 sslmode=require".parse::<Config>().is_ok(), "tokio-postgres ignores the rest");
    assert_eq!(
        refusal("host=db.example.com =Tango7 sslmode=require"),
        "app setting Pg is not a PostgreSQL connection string: text that is not key=value follows the value of \
         option host; single-quote a value that holds spaces (password='my secret'), writing \\' for a quote and \
         \\\\ for a backslash inside it"
    );
}

#[test]
fn the_sslmodes_are_listed_when_one_is_unknown() {
    assert_eq!(
        refusal("host=db.example.com sslmode=allow"),
        "app setting Pg: sslmode must be disable, prefer, require, verify-ca or verify-full (require and both \
         verify modes verify the certificate and host name here; libpq's allow is not supported: use prefer)"
    );
}

#[test]
fn sslrootcert_in_the_connection_string_points_to_the_app_setting() {
    assert_eq!(
        refusal("postgres://app:Secret1@db.example.com/shop?sslmode=verify-full&sslrootcert=/certs/ca.pem"),
        "app setting Pg: the connection string cannot carry sslrootcert; remove it and give the CA certificate \
         in app setting Sql_Trigger_PostgresRootCertificate"
    );
}

#[test]
fn an_unknown_option_is_named_only_when_it_is_libpqs() {
    assert_eq!(
        refusal("host=db.example.com user=app password=Secret1 sslcompression=1"),
        "app setting Pg: libpq's option sslcompression is not supported here (the driver, tokio-postgres, does \
         not implement it); remove it from the connection string"
    );
    // A word of a password whose quotes were forgotten reads as an option: it is not repeated.
    assert_eq!(
        refusal("host=db.example.com user=app password=Tango7 Foxtrot8=9"),
        "app setting Pg: the connection string holds an option libpq does not know, not named here in case it is \
         part of a password; check the spelling of each option, and single-quote a value that holds spaces \
         (password='my secret'), writing \\' for a quote and \\\\ for a backslash inside it"
    );
    assert_eq!(
        refusal("postgres://app@db.example.com/shop?password=Tango7&Foxtrot8=9"),
        "app setting Pg: the connection string holds an option libpq does not know, not named here in case it is \
         part of a password; check the spelling of each option, and percent-encode & as %26 and = as %3D inside \
         a value"
    );
}

#[test]
fn a_bad_port_says_how_to_encode_a_uri_password_whose_slash_ended_the_user_information() {
    // libpq reads app:Tango/7@... as host app, port Tango: the / ends the user information.
    assert_eq!(
        refusal("postgres://app:Tango/7@db.example.com/shop"),
        "app setting Pg: the connection string's port has an invalid value; in a URI, percent-encode the special \
         characters of the user name and password (@ as %40, / as %2F, : as %3A, ? as %3F, # as %23, % as %25, a \
         space as %20), or use the key=value form: host=... user=... password='...'"
    );
    assert_eq!(
        refusal("host=db.example.com port=Tango7"),
        "app setting Pg: the connection string's port has an invalid value; a port is a number (port=5432)"
    );
    assert_eq!(
        refusal("host=db.example.com hostaddr=db.example.com"),
        "app setting Pg: the connection string's hostaddr has an invalid value; hostaddr takes an IP address \
         (hostaddr=10.0.0.5), host= takes a name"
    );
}

#[test]
fn other_drivers_forms_are_recognised_and_converted_in_words() {
    assert_eq!(
        refusal(
            "Server=myserver.postgres.database.azure.com;Database=shop;Port=5432;User Id=app;Password=Tango7;\
             Ssl Mode=Require;"
        ),
        "app setting Pg holds an ADO.NET connection string (Server=...;Database=...); write it in libpq's form: \
         host=... port=5432 dbname=... user=... password='...' sslmode=require"
    );
    assert_eq!(
        refusal("jdbc:postgresql://db.example.com:5432/shop?user=app&password=Tango7&sslmode=require"),
        "app setting Pg holds a JDBC URL (jdbc:postgresql://...); remove the jdbc: prefix, which leaves the URI \
         form postgres://host:5432/db?user=...&password=..."
    );
}

#[test]
fn no_refusal_repeats_any_part_of_a_password() {
    for text in [
        "host=db.example.com user=app password=Tango7 Foxtrot8",
        "host=db.example.com user=app password=Tango7 Foxtrot8=9",
        "host=db.example.com user=app password='Tango7 Foxtrot8",
        "host=db.example.com user=app password=Tango7 =Foxtrot8",
        "Tango7 Foxtrot8",
        "Tango7=Foxtrot8",
        "postgres://app:Tango7@Foxtrot8@db.example.com/shop",
        "postgres://app:Tango7/Foxtrot8@db.example.com/shop",
        "postgres://app@db.example.com/shop?password=Tango7&Foxtrot8",
        "postgres://app@db.example.com/shop?password=Tango7&Foxtrot8=1",
        "postgres://app:Tango7%FF@db.example.com/shop?Foxtrot8",
        "Server=db;Password=Tango7 Foxtrot8;",
        "jdbc:postgresql://db/shop?password=Tango7Foxtrot8",
    ] {
        let message = refusal(text);
        for fragment in ["Tango", "Foxtrot"] {
            assert!(!message.contains(fragment), "{text}: {message}");
        }
    }
}
