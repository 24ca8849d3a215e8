//! The session contract on the wire (`src/db/mssql/session.rs`, docs/sql-server.md "Session settings"): every
//! connection a source opens sends the reviewed session batch right after login, before its first statement.
//! The tap refuses a connection that opens with anything else, so every other test here would fail too; these
//! two say it on purpose: the sources pin every connection, and the tap is not lenient about it.

use super::*;
use tokio_util::compat::TokioAsyncWriteCompatExt;

#[tokio::test]
async fn every_connection_a_source_opens_sends_the_session_batch_before_its_first_statement() {
    // GIVEN a tracked table, read through a pool that opens connections as statements need them
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register("ct_fetch_start", changes(42, 10, &[(11, 0, INSERTED, "1")])).await;
    let source = ct_source(&mock, json!({}));

    // WHEN it validates, starts and fetches
    source.validate().await.expect("the catalog checks pass");
    let start = source.start_position(StartFrom::Earliest).await.expect("start position");
    source.fetch(&start, 100).await.expect("fetch");

    // THEN each connection the tap saw opened with the session batch (a connection that did not would have been
    // refused, failing the test when the mock is dropped)
    let ledger = mock.ledger.lock().expect("tap ledger");
    assert!(ledger.connections >= 1, "the source connected");
    assert_eq!(ledger.sessions, ledger.connections, "every connection pinned its session");
    assert!(ledger.refused.is_empty(), "{:?}", ledger.refused);
}

#[tokio::test]
async fn a_connection_that_skips_the_session_batch_is_refused_by_the_tap() {
    // GIVEN a client that logs in and sends a statement at once, as the handler did before the session contract
    let mock = Mock::start().await;
    let config = tiberius::Config::from_ado_string(&mock.connection_string("")).expect("a valid string");
    let tcp = TcpStream::connect(config.get_addr()).await.expect("tcp connect");
    let mut client = tiberius::Client::connect(config, tcp.compat_write()).await.expect("login");

    // WHEN its first request is not the session batch
    let answer = match client.simple_query("SELECT 1").await {
        Ok(stream) => stream.into_results().await.map(|_| ()),
        Err(e) => Err(e),
    };
    let err = answer.expect_err("refused");

    // THEN the tap answered with an error and recorded why, so dropping the mock would fail the test
    assert!(err.to_string().contains("statement not registered with the wire test's mock"), "{err}");
    let refused = std::mem::take(&mut mock.ledger.lock().expect("ledger").refused);
    assert_eq!(refused, vec!["a connection whose first request was not the session batch: SELECT 1".to_string()]);
    assert_eq!(mock.ledger.lock().expect("ledger").sessions, 0);
}
