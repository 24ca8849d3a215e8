//! Tier 3 of the session contract (`src/db/mssql/session.rs`, docs/sql-server.md "Session settings"): what only a
//! server can say, that a connection of the handler's pool really runs under the pinned settings, and that they
//! win over a login whose default language would change the text of a date.

use super::Ctx;
use sql_pseudo_trigger::config::Secret;
use sql_pseudo_trigger::db::mssql::{Pool, Settings};

/// A fresh pool of the handler's, on the suite's connection string.
fn pool(ctx: &Ctx) -> Pool {
    let settings = Settings::parse("MSSQL_CONNECTION_STRING", &Secret::new(ctx.cs.clone())).expect("the string parses");
    Pool::new(settings)
}

/// One row of text columns, read through `pool` as the handler reads (a plain batch).
async fn texts(pool: &Pool, sql: &str) -> Vec<String> {
    let rows =
        pool.execute_batch(sql, "reading the session").await.unwrap_or_else(|e| panic!("{sql}: {:?}", e.failure));
    let row = rows.first().unwrap_or_else(|| panic!("{sql}: no row"));
    (0..row.len())
        .map(|i| row.get::<&str, usize>(i).unwrap_or_else(|| panic!("{sql}: column {i} is NULL")).to_string())
        .collect()
}

const FACTS: &str = "SELECT CONVERT(nvarchar(100), @@LANGUAGE), CONVERT(nvarchar(10), @@DATEFIRST), \
    CONVERT(nvarchar(10), s.date_format), CONVERT(nvarchar(20), @@TEXTSIZE), \
    CONVERT(nvarchar(10), SESSIONPROPERTY('ANSI_WARNINGS')), CONVERT(nvarchar(10), SESSIONPROPERTY('NUMERIC_ROUNDABORT')) \
    FROM sys.dm_exec_sessions s WHERE s.session_id = @@SPID";

/// How a date reads under the session: a style-less conversion (month names follow the language), and text read
/// into a `datetime` (its order follows DATEFORMAT).
const DATES: &str = "SELECT CONVERT(nvarchar(100), CAST('2024-03-01T00:00:00' AS datetime)), \
    CONVERT(nvarchar(30), CAST('2024-01-02 03:04:05' AS datetime), 126)";

pub async fn a_pooled_connection_runs_under_the_pinned_session_whatever_the_logins_language(ctx: &mut Ctx) {
    // GIVEN the handler's pool WHEN it reads its own session THEN every pinned setting holds
    let expected = ["us_english", "7", "ymd", "2147483647", "1", "0"].map(String::from).to_vec();
    assert_eq!(texts(&pool(ctx), FACTS).await, expected);

    // AND under a login whose default language is Deutsch (DATEFORMAT dmy, German month names), where the
    // suite's login may change its own default
    let mut admin = super::connect(&ctx.cs).await;
    let rows = admin
        .simple_query(
            "SELECT CONVERT(nvarchar(128), SUSER_SNAME()), CONVERT(nvarchar(128), default_language_name), \
             CONVERT(int, HAS_PERMS_BY_NAME(NULL, NULL, 'ALTER ANY LOGIN')) \
             FROM sys.server_principals WHERE name = SUSER_SNAME()",
        )
        .await
        .expect("login facts")
        .into_first_result()
        .await
        .expect("login facts");
    let Some(row) = rows.first().filter(|r| r.get::<i32, usize>(2) == Some(1)) else {
        println!("real-server scenario: the login may not change its default language; the Deutsch part is skipped");
        return;
    };
    let login = row.get::<&str, usize>(0).expect("a login").replace(']', "]]");
    let before = row.get::<&str, usize>(1).unwrap_or("us_english").replace(']', "]]");
    ctx.exec(&format!("ALTER LOGIN [{login}] WITH DEFAULT_LANGUAGE = [Deutsch]")).await;
    // A connection of the suite's own (no session batch) sees the German session ...
    let mut raw = super::connect(&ctx.cs).await;
    let german = raw.simple_query(DATES).await.expect("dates").into_first_result().await.expect("dates");
    let german: Vec<String> = (0..2).map(|i| german[0].get::<&str, usize>(i).unwrap_or("").to_string()).collect();
    // ... and the handler's does not
    let pinned = texts(&pool(ctx), DATES).await;
    ctx.exec(&format!("ALTER LOGIN [{login}] WITH DEFAULT_LANGUAGE = [{before}]")).await;
    assert_eq!(
        german,
        vec!["Mär  1 2024 12:00AM".to_string(), "2024-02-01T03:04:05".to_string()],
        "the login is Deutsch"
    );
    assert_eq!(pinned, vec!["Mar  1 2024 12:00AM".to_string(), "2024-01-02T03:04:05".to_string()]);
}
