//! Tier 2: the SQL Server sources against a TDS server on the wire (`mssql-mock-tds`).
//!
//! What this proves: tiberius connects and logs in, the sources send exactly the reviewed golden statements
//! (`tests/golden/mssql/*.sql`: the mock answers only a registered text), as parameterized RPCs or plain
//! batches, and decode realistic result shapes (bigint versions, int codes, NULLs, nvarchar and
//! nvarchar(max) split across PLP chunks) into the official payload. What it cannot prove: T-SQL semantics
//! (the mock has no engine); that is tier 3, `tests/mssql_real.rs`.
//!
//! The mock answers an unregistered statement with an empty result, not an error, so every test asserts
//! data that only its registered response contains, and the sources treat a missing row as an error.

use mssql_mock_tds::{
    ColumnDefinition as Col, ColumnValue as V, MockTdsServer, QueryResponse, Row, SqlDataType as T, TerminalError,
};
use serde_json::{json, Value};
use sql_pseudo_trigger::change::encode_batch;
use sql_pseudo_trigger::config::{AppConfig, Env, Secret, SourceKind, SourceSpec};
use sql_pseudo_trigger::engine::{OutcomeKind, Trigger};
use sql_pseudo_trigger::ident::Ident;
use sql_pseudo_trigger::protocol::{Attempt, RetryContext};
use sql_pseudo_trigger::source::mssql::{MssqlChangeTracking, MssqlRowversion};
use sql_pseudo_trigger::source::{Lag, Source, SourceError, StartFrom};
use sql_pseudo_trigger::state::MemoryStore;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A golden statement's text (the comment line naming the parameters dropped).
fn golden(name: &str) -> String {
    let path = format!("{}/tests/golden/mssql/{name}.sql", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    text.lines().filter(|l| !l.starts_with("--")).collect::<Vec<_>>().join("\n")
}

/// A running mock server; dropped, it shuts down.
struct Mock {
    port: u16,
    registry: Arc<tokio::sync::Mutex<mssql_mock_tds::QueryRegistry>>,
    registered: Vec<String>,
    _stop: oneshot::Sender<()>,
}

impl Mock {
    async fn start() -> Self {
        let server = MockTdsServer::new("127.0.0.1:0").await.expect("mock server binds");
        let port = server.local_addr().port();
        let registry = server.query_registry();
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(async move {
            let _ = server.run_with_shutdown(stopped).await;
        });
        Self { port, registry, registered: Vec::new(), _stop: stop }
    }

    fn connection_string(&self, extra: &str) -> String {
        format!("Server=tcp:127.0.0.1,{};Database=appdb;User ID=func;Password=not-a-real-secret;Encrypt=DANGER_PLAINTEXT;Connect Timeout=5;{extra}", self.port)
    }

    /// Registers a golden statement. The mock matches parameterized statements by substring, so no
    /// registered text may contain another (nor the mock's default `SELECT 1`).
    async fn register(&mut self, name: &str, response: QueryResponse) {
        let sql = golden(name).to_uppercase();
        for other in self.registered.iter().chain(std::iter::once(&"SELECT 1".to_string())) {
            assert!(
                *other == sql || (!other.contains(&sql) && !sql.contains(other.as_str())),
                "{name}: registered statements must not contain one another"
            );
        }
        self.registered.push(sql.clone());
        self.registry.lock().await.register(sql, response);
    }
}

impl Mock {
    /// Registers the upper-case head of a golden statement that names a system view in lower case (the lag's
    /// `sys.dm_tran_commit_table`, lower case so case-sensitive databases find it). The mock matches a
    /// parameterized statement by its upper-cased text, so only the head can match; the head holds every
    /// parameter and the whole predicate, and the golden test pins the fixed tail.
    async fn register_head(&mut self, name: &str, response: QueryResponse) {
        let text = golden(name);
        let cut = text.find(|c: char| c.is_ascii_lowercase()).unwrap_or(text.len());
        let (head, tail) = text.split_at(cut);
        assert!(!tail.contains("@P"), "{name}: a parameter after the first lower-case name: {tail}");
        let head = head.to_uppercase();
        for other in self.registered.iter().chain(std::iter::once(&"SELECT 1".to_string())) {
            assert!(!other.contains(&head) && !head.contains(other.as_str()), "{name}: registered statements overlap");
        }
        self.registered.push(head.clone());
        self.registry.lock().await.register(head, response);
    }
}

fn nvarchar_max(s: &str) -> V {
    // Two PLP chunks, so the reader has to join them.
    let units: Vec<u16> = s.encode_utf16().collect();
    let mid = units.len() / 2;
    if mid == 0 {
        return V::NVarCharMax(vec![units]);
    }
    V::NVarCharMax(vec![units[..mid].to_vec(), units[mid..].to_vec()])
}

fn spec(mock: &Mock, kind: SourceKind, table: &str, options: Value, extra: &str) -> SourceSpec {
    let mut sqltrigger =
        json!({ "source": kind.as_str(), "tableName": table, "connectionStringSetting": "SqlConnectionString" });
    sqltrigger.as_object_mut().expect("an object").extend(options.as_object().cloned().unwrap_or_default());
    let env = Env::from_pairs([("SqlConnectionString".to_string(), mock.connection_string(extra))]);
    SourceSpec::from_json(&sqltrigger, &env).expect("a valid sqltrigger.json")
}

fn database(ct_version: Option<i64>) -> QueryResponse {
    QueryResponse::new(
        vec![
            Col::new("COMPAT", T::Int),
            Col::new("SNAPSHOT_STATE", T::Int),
            Col::new("RCSI", T::Int),
            Col::new("CT_VERSION", T::BigInt),
            Col::new("RETENTION", T::Int),
            Col::new("RETENTION_UNITS", T::Int),
            Col::new("DB", T::NVarChar),
            Col::new("LOGIN_USER", T::NVarChar),
        ],
        vec![Row::new(vec![
            V::Int(160),
            V::Int(1),
            V::Int(1),
            ct_version.map(V::BigInt).unwrap_or(V::Null),
            V::Int(2),
            V::Int(3),
            V::NVarChar("appdb".into()),
            V::NVarChar("func".into()),
        ])],
    )
}

fn table(min_valid: Option<i64>, can_view_ct: bool) -> QueryResponse {
    QueryResponse::new(
        vec![
            Col::new("ID", T::Int),
            Col::new("IS_TABLE", T::Int),
            Col::new("CAN_SELECT", T::Int),
            Col::new("CAN_VIEW_CT", T::Int),
            Col::new("MINV", T::BigInt),
        ],
        vec![Row::new(vec![
            V::Int(901_578_250),
            V::Int(1),
            V::Int(1),
            V::Int(i32::from(can_view_ct)),
            min_valid.map(V::BigInt).unwrap_or(V::Null),
        ])],
    )
}

fn int_or_null(v: Option<i32>) -> V {
    v.map(V::Int).unwrap_or(V::Null)
}

/// `(name, type, len, prec, scale, datetime precision, column id, pk ordinal)`.
type ColumnRow = (&'static str, &'static str, Option<i32>, Option<i32>, Option<i32>, Option<i32>, i32, Option<i32>);

fn columns(rows: &[ColumnRow]) -> QueryResponse {
    QueryResponse::new(
        vec![
            Col::new("NAME", T::NVarChar),
            Col::new("TYPE", T::NVarChar),
            Col::new("LEN", T::Int),
            Col::new("PREC", T::Int),
            Col::new("SCALE", T::Int),
            Col::new("DT_PREC", T::Int),
            Col::new("COLUMN_ID", T::Int),
            Col::new("PK_ORDINAL", T::Int),
        ],
        rows.iter()
            .map(|(n, t, len, p, s, dt, id, pk)| {
                Row::new(vec![
                    V::NVarChar((*n).into()),
                    V::NVarChar((*t).into()),
                    int_or_null(*len),
                    int_or_null(*p),
                    int_or_null(*s),
                    int_or_null(*dt),
                    V::Int(*id),
                    int_or_null(*pk),
                ])
            })
            .collect(),
    )
}

/// `[DBO].[ORDERS]`: int key, nvarchar, decimal, varbinary(max), datetime2 (the golden `orders` shape).
const ORDERS: &[ColumnRow] = &[
    ("ID", "int", None, Some(10), Some(0), None, 1, Some(1)),
    ("NAME", "nvarchar", Some(100), None, None, None, 2, None),
    ("PRICE", "decimal", None, Some(18), Some(2), None, 3, None),
    ("PHOTO", "varbinary", Some(-1), None, None, None, 4, None),
    ("CREATED_AT", "datetime2", None, None, None, Some(7), 5, None),
];

fn versions(min_valid: i64, current: i64) -> QueryResponse {
    QueryResponse::new(
        vec![Col::new("MINV", T::BigInt), Col::new("CUR", T::BigInt)],
        vec![Row::new(vec![V::BigInt(min_valid), V::BigInt(current)])],
    )
}

/// One change row as the fetch returns it: version, operation, item JSON, key text, creation version, mask.
type ChangeRow<'a> = (i64, i32, &'a str, &'a str, Option<i64>, Option<&'a str>);

/// A change read: `(version, op, item json, key text)` rows under one version row.
fn changes(current: i64, min_valid: i64, rows: &[(i64, i32, &str, &str)]) -> QueryResponse {
    let rows: Vec<ChangeRow<'_>> = rows.iter().map(|(v, o, i, k)| (*v, *o, *i, *k, None, None)).collect();
    changes_with_metadata(current, min_valid, &rows)
}

/// A change read whose rows also carry `CREATED` and `MASK`.
fn changes_with_metadata(current: i64, min_valid: i64, rows: &[ChangeRow<'_>]) -> QueryResponse {
    let cols = vec![
        Col::new("CUR", T::BigInt),
        Col::new("MINV", T::BigInt),
        Col::new("VER", T::BigInt),
        Col::new("OP", T::Int),
        Col::new("ITEM", T::NVarCharMax),
        Col::new("CREATED", T::BigInt),
        Col::new("MASK", T::NVarCharMax),
        Col::new("K1", T::NVarCharMax),
    ];
    let head = |rest: Vec<V>| Row::new([vec![V::BigInt(current), V::BigInt(min_valid)], rest].concat());
    let rows = if rows.is_empty() {
        vec![head(vec![V::Null, V::Null, V::NVarCharMaxNull, V::Null, V::NVarCharMaxNull, V::NVarCharMaxNull])]
    } else {
        rows.iter()
            .map(|(ver, op, item, key, created, mask)| {
                head(vec![
                    V::BigInt(*ver),
                    V::Int(*op),
                    nvarchar_max(item),
                    created.map(V::BigInt).unwrap_or(V::Null),
                    mask.map(nvarchar_max).unwrap_or(V::NVarCharMaxNull),
                    nvarchar_max(key),
                ])
            })
            .collect()
    };
    QueryResponse::new(cols, rows)
}

const INSERTED: &str =
    r#"{"ID":1,"NAME":"Zoë ✓","PRICE":12.50,"PHOTO":"AQID/w==","CREATED_AT":"2026-11-20T10:15:30.1234567"}"#;
const NULLS: &str = r#"{"ID":2,"NAME":null,"PRICE":null,"PHOTO":null,"CREATED_AT":null}"#;
const DELETED: &str = r#"{"ID":3}"#;

async fn catalog(mock: &mut Mock) {
    mock.register("catalog_database", database(Some(42))).await;
    mock.register("catalog_table", table(Some(10), true)).await;
    mock.register("catalog_columns", columns(ORDERS)).await;
}

fn ct_source(mock: &Mock, options: Value) -> MssqlChangeTracking {
    MssqlChangeTracking::new(spec(
        mock,
        SourceKind::MssqlChangeTracking,
        "[DBO].[ORDERS]",
        options,
        "ConnectRetryCount=1",
    ))
    .expect("source builds")
}

#[tokio::test]
async fn a_first_fetch_reads_the_catalog_then_delivers_the_official_payload() {
    // GIVEN a tracked table whose changes are an insert, an update to all-NULL values and a delete
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register(
        "ct_fetch_start",
        changes(42, 10, &[(11, 0, INSERTED, "1"), (12, 1, NULLS, "2"), (13, 2, DELETED, "3")]),
    )
    .await;
    let source = ct_source(&mock, json!({}));

    // WHEN it validates, starts at the earliest position and fetches
    source.validate().await.expect("the catalog checks pass");
    let start = source.start_position(StartFrom::Earliest).await.expect("start position");
    let fetched = source.fetch(&start, 100).await.expect("fetch");

    // THEN the batch is the official shape, and a short batch moves the base to the version read
    assert_eq!(start, json!({"phase": "changes", "base": 10}));
    assert_eq!(
        encode_batch(&fetched.changes).get(),
        format!(
            r#"[{{"Operation":0,"Item":{INSERTED}}},{{"Operation":1,"Item":{NULLS}}},{{"Operation":2,"Item":{DELETED}}}]"#
        )
    );
    assert_eq!(fetched.last, Some(json!({"phase": "changes", "base": 42})));
}

#[tokio::test]
async fn a_full_batch_ends_at_its_last_version_and_key_and_the_next_fetch_seeks_past_it() {
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register("ct_fetch_start", changes(42, 10, &[(11, 0, INSERTED, "1"), (11, 1, NULLS, "2")])).await;
    mock.register("ct_fetch_after_key", changes(42, 10, &[(11, 2, DELETED, "3")])).await;
    let source = ct_source(&mock, json!({}));

    let start = source.start_position(StartFrom::Earliest).await.expect("start");
    let first = source.fetch(&start, 2).await.expect("first batch");
    // One transaction (version 11) larger than the batch: the position splits it by key.
    let last = first.last.expect("a position");
    assert_eq!(last, json!({"phase": "changes", "base": 10, "last": {"version": 11, "key": ["2"]}}));
    let second = source.fetch(&last, 2).await.expect("second batch");
    assert_eq!(encode_batch(&second.changes).get(), format!(r#"[{{"Operation":2,"Item":{DELETED}}}]"#));
    assert_eq!(second.last, Some(json!({"phase": "changes", "base": 42})));
}

#[tokio::test]
async fn a_base_below_the_minimum_valid_version_is_refused_unless_resync_is_asked_for() {
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_fetch_start", changes(90, 50, &[(60, 1, NULLS, "2")])).await;
    let stored = json!({"phase": "changes", "base": 10});

    let err = ct_source(&mock, json!({})).fetch(&stored, 100).await.expect_err("lost");
    let SourceError::PositionLost(message) = err else { panic!("expected PositionLost, got {err:?}") };
    assert!(message.starts_with("change tracking for DBO.ORDERS no longer holds the changes after version 10 (the minimum valid version is 50; retention is 2 DAYS)"), "{message}");
    assert!(message.contains("\"onPositionLost\": \"resync\""), "{message}");

    mock.register(
        "ct_walk_first",
        QueryResponse::new(
            vec![Col::new("OP", T::Int), Col::new("ITEM", T::NVarCharMax), Col::new("K1", T::NVarCharMax)],
            vec![Row::new(vec![V::Int(0), nvarchar_max(INSERTED), nvarchar_max("1")])],
        ),
    )
    .await;
    let resynced = ct_source(&mock, json!({"onPositionLost": "resync"})).fetch(&stored, 100).await.expect("resync");
    assert_eq!(encode_batch(&resynced.changes).get(), format!(r#"[{{"Operation":0,"Item":{INSERTED}}}]"#));
    assert_eq!(resynced.last, Some(json!({"phase": "changes", "base": 90})));
}

#[tokio::test]
async fn metadata_and_the_context_filter_travel_as_one_statement_with_a_varbinary_parameter() {
    // GIVEN a source that skips its own context and asks for metadata
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register(
        "ct_meta_fetch_start",
        changes_with_metadata(
            42,
            10,
            &[(12, 1, NULLS, "2", Some(5), Some("01000")), (13, 0, INSERTED, "1", Some(13), None)],
        ),
    )
    .await;
    let source = ct_source(&mock, json!({"skipOwnChangesContext": "0x4D59415050", "includeMetadata": true}));

    // WHEN it fetches
    let start = source.start_position(StartFrom::Earliest).await.expect("start");
    let fetched = source.fetch(&start, 100).await.expect("fetch");

    // THEN the update names its changed column and the insert has none
    assert_eq!(
        encode_batch(&fetched.changes).get(),
        format!(
            r#"[{{"Operation":1,"Item":{NULLS},"Metadata":{{"Version":12,"CreationVersion":5,"ChangedColumns":["NAME"]}}}},{{"Operation":0,"Item":{INSERTED},"Metadata":{{"Version":13,"CreationVersion":13}}}}]"#
        )
    );
}

#[tokio::test]
async fn validation_errors_arrive_over_the_wire_with_the_statement_to_run() {
    let mut mock = Mock::start().await;
    mock.register("catalog_database", database(None)).await;
    let err = ct_source(&mock, json!({})).validate().await.expect_err("database tracking off").to_string();
    assert!(
        err.starts_with(
            "change tracking is not enabled on database [appdb]: run ALTER DATABASE [appdb] SET CHANGE_TRACKING = ON"
        ),
        "{err}"
    );

    let mut mock = Mock::start().await;
    mock.register("catalog_database", database(Some(42))).await;
    mock.register("catalog_table", table(None, true)).await;
    mock.register("catalog_columns", columns(ORDERS)).await;
    let err = ct_source(&mock, json!({})).validate().await.expect_err("table tracking off").to_string();
    assert_eq!(
        err,
        "change tracking is not enabled on table DBO.ORDERS: run ALTER TABLE [DBO].[ORDERS] ENABLE CHANGE_TRACKING"
    );

    let mut mock = Mock::start().await;
    mock.register("catalog_database", database(Some(42))).await;
    mock.register("catalog_table", table(Some(1), false)).await;
    let err = ct_source(&mock, json!({})).validate().await.expect_err("no permission").to_string();
    assert_eq!(err, "login user [func] may not read the changes of DBO.ORDERS: run GRANT VIEW CHANGE TRACKING ON [DBO].[ORDERS] TO [func]");
}

#[tokio::test]
async fn an_unanswered_catalog_statement_fails_validation_instead_of_passing_it() {
    // Nothing registered: the mock answers every statement with an empty result.
    let mock = Mock::start().await;
    let err =
        ct_source(&mock, json!({})).validate().await.expect_err("empty answers are not a valid catalog").to_string();
    assert_eq!(err, "unexpected answer from SQL Server while reading the database settings: expected one row, got 0");
}

#[tokio::test]
async fn transient_server_errors_are_unavailable_and_others_invalid_both_at_once() {
    let mut mock = Mock::start().await;
    mock.register(
        "catalog_database",
        QueryResponse::error_only(TerminalError::new(
            40613,
            16,
            "Database 'appdb' on server 'x' is not currently available.",
        )),
    )
    .await;
    let err = ct_source(&mock, json!({})).validate().await.expect_err("unavailable");
    let SourceError::Unavailable(message) = err else { panic!("expected Unavailable, got {err:?}") };
    assert_eq!(
        message,
        "SQL Server error 40613 while reading the database settings: Database 'appdb' on server 'x' is not currently available."
    );

    let mut mock = Mock::start().await;
    mock.register(
        "catalog_database",
        QueryResponse::error_only(TerminalError::new(
            229,
            14,
            "The SELECT permission was denied on the object 'databases'.",
        )),
    )
    .await;
    let err = ct_source(&mock, json!({})).validate().await.expect_err("permanent");
    let SourceError::Invalid(message) = err else { panic!("expected Invalid, got {err:?}") };
    assert!(message.starts_with("SQL Server error 229 while reading the database settings"), "{message}");
    assert!(!message.contains("not-a-real-secret"));
}

#[tokio::test]
async fn a_full_tick_against_the_wire_delivers_and_records_the_batch() {
    // GIVEN an app folder whose function watches [DBO].[ORDERS] through the mock
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register("ct_versions", versions(10, 42)).await;
    mock.register("ct_fetch_start", changes(42, 10, &[(11, 0, INSERTED, "1"), (13, 2, DELETED, "3")])).await;
    let root = std::env::temp_dir().join(format!("mssql-wire-{}-{}", std::process::id(), mock.port));
    let dir = root.join("OrdersChanged");
    std::fs::create_dir_all(&dir).expect("app folder");
    std::fs::write(root.join("host.json"), r#"{"version":"2.0"}"#).expect("host.json");
    std::fs::write(
        dir.join("function.json"),
        r#"{"bindings":[{"type":"timerTrigger","direction":"in","name":"timer","schedule":"*/5 * * * * *"},{"type":"queue","direction":"out","name":"changes","queueName":"orders","connection":"AzureWebJobsStorage"}],"retry":{"strategy":"fixedDelay","maxRetryCount":3,"delayInterval":"00:00:05"}}"#,
    )
    .expect("function.json");
    std::fs::write(
        dir.join("sqltrigger.json"),
        r#"{"source":"mssql-change-tracking","tableName":"[DBO].[ORDERS]","connectionStringSetting":"SqlConnectionString"}"#,
    )
    .expect("sqltrigger.json");
    let env = Env::from_pairs([("SqlConnectionString".to_string(), mock.connection_string("ConnectRetryCount=1"))]);
    let config = AppConfig::load_from(&root, env).expect("the app config loads");
    let function = config.functions[0].clone();
    let source = Arc::new(MssqlChangeTracking::new(function.source.clone()).expect("source"));
    let store = Arc::new(MemoryStore::new());
    let trigger = Trigger::new(function, "wire-app", source, store, "owner-1".into());

    // WHEN the host invokes the timer once
    let outcome = trigger.tick(&Attempt::fresh(Some(RetryContext::first(5)))).await.expect("tick");

    // THEN the batch is delivered in the official shape and the state records it in flight
    assert_eq!(outcome.kind, OutcomeKind::Delivered);
    assert_eq!(
        encode_batch(&outcome.changes).get(),
        format!(r#"[{{"Operation":0,"Item":{INSERTED}}},{{"Operation":2,"Item":{DELETED}}}]"#)
    );
    let (doc, _) = trigger.load().await.expect("load").expect("state written");
    let flight = doc.in_flight.expect("batch in flight");
    assert_eq!(flight.from, json!({"phase": "changes", "base": 10}));
    assert_eq!(flight.to, json!({"phase": "changes", "base": 42}));
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn the_rowversion_source_reads_below_min_active_rowversion_over_the_wire() {
    let mut mock = Mock::start().await;
    mock.register("catalog_database", database(None)).await;
    mock.register("catalog_table", table(None, false)).await;
    mock.register(
        "catalog_columns",
        columns(&[
            ("ID", "int", None, Some(10), Some(0), None, 1, Some(1)),
            ("TITLE", "nvarchar", Some(200), None, None, None, 2, None),
            ("IS_DELETED", "bit", None, None, None, None, 3, None),
            ("RV", "timestamp", Some(8), None, None, None, 4, None),
        ]),
    )
    .await;
    mock.register(
        "rv_fetch_start",
        QueryResponse::new(
            vec![
                Col::new("RV", T::BigInt),
                Col::new("OP", T::Int),
                Col::new("ITEM", T::NVarCharMax),
                Col::new("K1", T::NVarCharMax),
            ],
            vec![
                Row::new(vec![
                    V::BigInt(2001),
                    V::Int(1),
                    nvarchar_max(r#"{"ID":1,"TITLE":"a","IS_DELETED":false}"#),
                    nvarchar_max("1"),
                ]),
                Row::new(vec![V::BigInt(2002), V::Int(2), nvarchar_max(r#"{"ID":2}"#), nvarchar_max("2")]),
            ],
        ),
    )
    .await;
    let mut s = spec(
        &mock,
        SourceKind::MssqlRowversion,
        "[DBO].[ITEMS]",
        json!({"softDeleteColumn": "IS_DELETED"}),
        "ConnectRetryCount=0",
    );
    s.columns = Some(vec![
        Ident::new("ID").expect("id"),
        Ident::new("TITLE").expect("id"),
        Ident::new("IS_DELETED").expect("id"),
    ]);
    let source = MssqlRowversion::new(s).expect("source");

    source.validate().await.expect("valid");
    let fetched = source.fetch(&Value::Null, 100).await.expect("fetch");
    assert_eq!(
        encode_batch(&fetched.changes).get(),
        r#"[{"Operation":1,"Item":{"ID":1,"TITLE":"a","IS_DELETED":false}},{"Operation":2,"Item":{"ID":2}}]"#
    );
    assert_eq!(fetched.last, Some(json!({"rv": 2002, "key": ["2"]})));
}

/// The lag read's answer: the first pending change's version and its age in seconds (NULL when undated).
fn oldest(version: i64, age_seconds: Option<i32>) -> QueryResponse {
    QueryResponse::new(
        vec![Col::new("VER", T::BigInt), Col::new("AGE_S", T::Int)],
        vec![Row::new(vec![V::BigInt(version), age_seconds.map(V::Int).unwrap_or(V::Null)])],
    )
}

#[tokio::test]
async fn the_lag_is_the_age_of_the_first_pending_changes_commit_read_over_the_wire() {
    // GIVEN a function that delivered up to version 11, key 1, and whose next change committed 90 s ago
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register_head("ct_oldest_after_key", oldest(12, Some(90))).await;
    let after = json!({"phase": "changes", "base": 10, "last": {"version": 11, "key": ["1"]}});

    // WHEN the lag is read THEN it is those 90 s
    let lag = ct_source(&mock, json!({})).oldest_pending_age(&after).await.expect("lag");
    assert_eq!(lag, Lag::Behind(std::time::Duration::from_secs(90)));
}

#[tokio::test]
async fn a_pending_change_whose_commit_time_was_cleaned_up_has_an_unknown_lag_that_says_so() {
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register_head("ct_oldest_start", oldest(12, None)).await;

    let lag = ct_source(&mock, json!({})).oldest_pending_age(&json!({"phase": "changes", "base": 10})).await;

    let Ok(Lag::Unknown(reason)) = lag else { panic!("expected an unknown lag, got {lag:?}") };
    assert!(reason.starts_with("the commit time of version 12 is no longer in sys.dm_tran_commit_table"), "{reason}");
}

#[tokio::test]
async fn without_view_database_state_the_lag_is_unknown_and_names_the_grant() {
    // GIVEN a login that may read the changes but not the commit table (SQL Server error 300)
    let mut mock = Mock::start().await;
    catalog(&mut mock).await;
    mock.register_head(
        "ct_oldest_start",
        QueryResponse::error_only(TerminalError::new(
            300,
            14,
            "VIEW DATABASE STATE permission denied in database 'appdb'.",
        )),
    )
    .await;

    // WHEN the lag is read
    let lag = ct_source(&mock, json!({})).oldest_pending_age(&json!({"phase": "changes", "base": 10})).await;

    // THEN it is unknown, not an error that would fail the whole status, and says what to grant to whom
    let Ok(Lag::Unknown(reason)) = lag else { panic!("expected an unknown lag, got {lag:?}") };
    assert_eq!(
        reason,
        "reading commit times (sys.dm_tran_commit_table) needs VIEW DATABASE STATE, which login user func lacks (SQL Server error 300); run GRANT VIEW DATABASE STATE TO [func] for a lag"
    );
}

#[tokio::test]
async fn the_rowversion_source_says_it_cannot_date_changes() {
    let mock = Mock::start().await;
    let source =
        MssqlRowversion::new(spec(&mock, SourceKind::MssqlRowversion, "[DBO].[ITEMS]", json!({}), "")).expect("source");
    let Ok(Lag::Unknown(reason)) = source.oldest_pending_age(&Value::Null).await else {
        panic!("a rowversion has no time")
    };
    assert!(reason.contains("use the change-tracking source"), "{reason}");
}

/// A TCP relay between the source and the mock that can cut every connection it carries, as Azure's load
/// balancer cuts one that stayed idle (the client learns it only at its next statement).
struct Relay {
    port: u16,
    accepted: Arc<std::sync::atomic::AtomicUsize>,
    links: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Relay {
    async fn start(to: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("relay binds");
        let port = listener.local_addr().expect("address").port();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let links: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let (count, held) = (accepted.clone(), links.clone());
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let link = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                held.lock().expect("links").push(link);
            }
        });
        Self { port, accepted, links }
    }

    /// Drops both ends of every connection carried so far.
    fn cut(&self) {
        for link in self.links.lock().expect("links").drain(..) {
            link.abort();
        }
    }

    fn accepted(&self) -> usize {
        self.accepted.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[tokio::test]
async fn a_pooled_connection_cut_while_idle_is_replaced_and_without_connect_retry_count_the_tick_fails() {
    for (retry_count, replaced) in [("ConnectRetryCount=1", true), ("ConnectRetryCount=0", false)] {
        // GIVEN a source that reached the mock through a relay, and whose one connection now idles in the pool
        let mut mock = Mock::start().await;
        catalog(&mut mock).await;
        mock.register("ct_versions", versions(10, 42)).await;
        let relay = Relay::start(mock.port).await;
        let mut s = spec(&mock, SourceKind::MssqlChangeTracking, "[DBO].[ORDERS]", json!({}), retry_count);
        s.connection = Secret::new(
            mock.connection_string(retry_count).replace(&format!(",{};", mock.port), &format!(",{};", relay.port)),
        );
        let source = MssqlChangeTracking::new(s).expect("source builds");
        source.start_position(StartFrom::Earliest).await.expect("first statement");
        assert_eq!(relay.accepted(), 1, "{retry_count}: one connection served the catalog and the first read");

        // WHEN the relay cuts it, and the source reads again
        relay.cut();
        let again = source.start_position(StartFrom::Earliest).await;

        // THEN a fresh connection replaces the dead one within the same read, or, with ConnectRetryCount=0,
        // the read fails as transient (the next tick connects afresh)
        if replaced {
            assert_eq!(again.expect("replaced"), json!({"phase": "changes", "base": 10}), "{retry_count}");
            assert_eq!(relay.accepted(), 2, "{retry_count}: exactly one replacement");
        } else {
            let err = again.expect_err("no replacement");
            assert!(
                matches!(&err, SourceError::Unavailable(m) if m.starts_with("SQL Server connection failed while reading")),
                "{err:?}"
            );
            assert_eq!(relay.accepted(), 1, "{retry_count}: nothing reconnected within the read");
            source.start_position(StartFrom::Earliest).await.expect("the next read connects afresh");
            assert_eq!(relay.accepted(), 2, "{retry_count}");
        }
    }
}
