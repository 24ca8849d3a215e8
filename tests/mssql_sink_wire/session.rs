//! The session contract on the sink's wire (`src/db/mssql/session.rs`, docs/sql-server.md "Session settings"):
//! every connection the sink opens sends the reviewed session batch right after login, before its first
//! statement; the tap refuses a connection that opens with anything else.

use super::*;
use tokio_util::compat::TokioAsyncWriteCompatExt;

#[tokio::test]
async fn every_connection_the_sink_opens_sends_the_session_batch_before_its_first_statement() {
    // GIVEN a target the sink reads the catalog of, creates its fence table in and resumes from
    let server = Server::start().await;
    server.answer(CATALOG, catalog(ORDER_LINES_COLUMNS)).await;
    accept_bookkeeping(&server, "[Sales Ünïcode]", false);
    server
        .answer(RESUME, QueryResponse::new(vec![Col::new("fence", T::BigInt)], vec![Row::new(vec![V::BigInt(6)])]))
        .await;
    let sink = sink(&server, ORDER_LINES, json!({}));

    // WHEN sink mode asks what it recorded
    sink.resume_position("app", "F").await.expect("answered");

    // THEN each connection it opened sent the session batch first, and nothing else was refused
    let connections = server.tap.connections();
    assert!(connections >= 1, "the sink connected");
    let session = tds_reader::session_batch();
    let expected: Vec<(usize, String)> = (0..connections).map(|c| (c, session.clone())).collect();
    assert_eq!(server.tap.openings(), expected);
    assert_eq!(server.unanswered(), Vec::<String>::new());
}

#[tokio::test]
async fn a_connection_that_skips_the_session_batch_is_refused_by_the_tap() {
    // GIVEN a client that logs in and sends a registered batch at once, as the sink did before the session contract
    let server = Server::start().await;
    server.answer_without_rows("SELECT 42");
    let config = tiberius::Config::from_ado_string(&server.connection_string()).expect("a valid string");
    let tcp = tokio::net::TcpStream::connect(config.get_addr()).await.expect("tcp connect");
    let mut client = tiberius::Client::connect(config, tcp.compat_write()).await.expect("login");

    // WHEN its first request is not the session batch
    let answer = match client.simple_query("SELECT 42").await {
        Ok(stream) => stream.into_results().await.map(|_| ()),
        Err(e) => Err(e),
    };

    // THEN the tap answered with an error and recorded why (taken here, so that dropping the server passes)
    let err = answer.expect_err("refused");
    assert!(err.to_string().contains("no answer is registered for this request"), "{err}");
    let unanswered = server.take_unanswered();
    assert_eq!(unanswered, vec!["a connection whose first request was not the session batch: SELECT 42".to_string()]);
}
