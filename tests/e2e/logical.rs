//! The `postgres-logical` source end to end: the real `handler` binary, driven by the host model, reading a
//! table's changes from the WAL through a replication slot (pgoutput; a replication stream kept across
//! firings by default, `pg_logical_slot_peek_binary_changes` with `"reader": "sql"`) of the shared PostgreSQL
//! (or of a private one, for the tests that change server settings), with state in Azurite. A slot a
//! handler streams cannot be dropped until its session ends ([`Db::drop_slot`] ends it first).
//!
//! Every test reserves its own slot name and drops the slot when it ends, passed or failed ([`SlotGuard`]): a
//! leaked slot keeps the shared server's WAL forever. A slot is created by the function's first tick (or by
//! status, or by a reset), and only changes made after it are read, so every test ticks once before it writes
//! the rows it expects.
//!
//! Positions are `{"lsn": commit LSN, "n": sequence in the transaction, "end": end of the commit record}`
//! (`end` once the transaction is done). The slot may be advanced only to what the stored checkpoint has
//! passed ([`resume_lsn`]), and only after the checkpoint is committed: [`assert_slot_within_checkpoint`]
//! checks it between firings.

use crate::common::*;
use crate::operations::handler_cli;
use crate::support::{self, AppFolder};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use sql_pseudo_trigger::engine::document::StateDoc;
use sql_pseudo_trigger::failpoint;
use sql_pseudo_trigger::state::{Etag, StateStore};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};
use testbed::driver::{AttemptOutcome, HostDriver, TimerRun};
use testbed::embedded;

// ---------------------------------------------------------------------------------------------------------------
// The bench: a database, a slot name, an app
// ---------------------------------------------------------------------------------------------------------------

/// The table most tests watch: a plain primary key, no cursor column, no trigger.
pub(crate) const ORDERS: &str = "CREATE TABLE public.orders (
    id bigint PRIMARY KEY,
    customer text NOT NULL,
    amount numeric(12, 2) NOT NULL
);
CREATE TABLE public.other (id bigserial PRIMARY KEY, filler text NOT NULL);";

/// A fresh database with `schema` created, and a replication slot name no other test uses.
pub(crate) struct Db {
    pub(crate) url: String,
    pub(crate) db: tokio_postgres::Client,
    pub(crate) slot: String,
    // Last: drops the slot after everything declared after this `Db` (the handler) is gone.
    _guard: SlotGuard,
}

impl Db {
    /// A database on the shared server.
    pub(crate) async fn shared(prefix: &str, schema: &str) -> Self {
        let url = support::fixture().fresh_database(prefix).await;
        Self::on(url, schema).await
    }

    /// A database on a private server (whose admin URL is `admin`).
    pub(crate) async fn private(admin: &str, prefix: &str, schema: &str) -> Self {
        let name = support::unique_database_name(prefix);
        let url = embedded::create_database(admin, &name).await.unwrap_or_else(|e| panic!("create {name}: {e}"));
        Self::on(url, schema).await
    }

    async fn on(url: String, schema: &str) -> Self {
        let db = embedded::connect(&url).await.expect("connect to the test database");
        db.batch_execute(schema).await.unwrap_or_else(|e| panic!("schema: {e}\n{schema}"));
        let slot = format!("e2e_{}", &uuid::Uuid::new_v4().simple().to_string()[..20]);
        let guard = SlotGuard { url: url.clone(), slot: slot.clone() };
        Self { url, db, slot, _guard: guard }
    }

    /// Inserts `ids` into `orders` in one transaction, in order.
    pub(crate) async fn insert(&self, ids: impl IntoIterator<Item = i64>) {
        let ids: Vec<i64> = ids.into_iter().collect();
        self.db
            .execute(
                "INSERT INTO orders (id, customer, amount)
                 SELECT i, 'c' || i, i * 1.25 FROM unnest($1::bigint[]) WITH ORDINALITY AS u(i, n) ORDER BY n",
                &[&ids],
            )
            .await
            .expect("insert orders");
    }

    /// `(confirmed_flush_lsn, wal_status)` of the test's slot; `None` when it does not exist.
    async fn slot(&self) -> Option<(u64, String)> {
        let row = self
            .db
            .query_opt(
                "SELECT confirmed_flush_lsn::text, coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .expect("read pg_replication_slots")?;
        let confirmed: Option<String> = row.get(0);
        Some((confirmed.map_or(0, |c| lsn(&c)), row.get(1)))
    }

    /// Drops the slot as an operator must while a handler streams it: ends the session that holds it
    /// (`pg_terminate_backend`), then drops it once PostgreSQL has let it go (the session's exit is not
    /// instantaneous: retried until it has, for at most 10 s).
    async fn drop_slot(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            self.db
                .execute(
                    "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = $1 AND active_pid IS NOT NULL",
                    &[&self.slot],
                )
                .await
                .expect("end the session streaming the slot");
            match self.db.execute("SELECT pg_drop_replication_slot($1)", &[&self.slot]).await {
                Ok(_) => return,
                Err(e) if e.code().is_some_and(|c| c.code() == "55006") && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(20)).await
                }
                Err(e) => panic!("drop the slot: {e}"),
            }
        }
    }

    async fn confirmed_flush(&self) -> u64 {
        self.slot().await.unwrap_or_else(|| panic!("slot {} does not exist", self.slot)).0
    }

    /// `pg_current_wal_insert_lsn()`: where the next WAL record goes.
    async fn wal_lsn(&self) -> u64 {
        let text: String =
            self.db.query_one("SELECT pg_current_wal_insert_lsn()::text", &[]).await.expect("wal lsn").get(0);
        lsn(&text)
    }

    /// WAL written since the slot's confirmed position: what the slot keeps the server from recycling, at
    /// least.
    async fn wal_behind_slot(&self) -> i64 {
        self.db
            .query_one(
                "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8 FROM pg_replication_slots WHERE slot_name = $1",
                &[&self.slot],
            )
            .await
            .expect("wal behind the slot")
            .get(0)
    }

    /// About `mb` MB of WAL in a table the function does not watch.
    pub(crate) async fn unrelated_wal(&self, mb: i64) {
        self.db
            .execute(
                "INSERT INTO other (filler) SELECT repeat(md5(g::text), 32) FROM generate_series(1, $1::int8 * 1000) g",
                &[&mb],
            )
            .await
            .expect("write unrelated rows");
    }
}

/// Drops a test's replication slot when the test ends, passed or panicked: a leaked slot keeps the shared
/// server's WAL. It runs on a thread of its own (a `Drop` cannot await), retrying while the slot is active (a
/// handler still peeking at it: SQLSTATE 55006).
struct SlotGuard {
    url: String,
    slot: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let (url, slot) = (self.url.clone(), self.slot.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            runtime.block_on(async move {
                let db = embedded::connect(&url).await.ok()?;
                for _ in 0..50 {
                    let sql =
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1";
                    if db.execute(sql, &[&slot]).await.is_ok() {
                        return Some(());
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                None
            })
        })
        .join();
        if !matches!(dropped, Ok(Some(()))) && !std::thread::panicking() {
            eprintln!("warning: replication slot {} could not be dropped; drop it by hand", self.slot);
        }
    }
}

/// The `sqltrigger.json` of a logical function on `table` through `slot`, with `extra` keys merged in.
fn logical_trigger(table: &str, slot: &str, extra: Value) -> Value {
    let mut trigger = json!({
        "source": "postgres-logical",
        "tableName": table,
        "connectionStringSetting": "PostgresConnectionString",
        "slotName": slot,
        "startFrom": "earliest"
    });
    if let (Some(base), Some(extra)) = (trigger.as_object_mut(), extra.as_object()) {
        base.extend(extra.clone());
    }
    trigger
}

/// An app whose one function ([`FUNCTION`]) watches `table` of `db` through the test's slot, with blob state in
/// the shared Azurite and a zero proof window (a batch is acknowledged by the next invocation).
pub(crate) fn logical_app(db: &Db, table: &str, extra: Value, settings: &[(&str, &str)]) -> (AppFolder, String) {
    let app_name = unique_app_name("logical");
    let trigger = logical_trigger(table, &db.slot, extra);
    let app = app_on(&db.url, &app_name, support::timer_function_json(Some(3)), trigger, settings);
    (app, app_name)
}

// ---------------------------------------------------------------------------------------------------------------
// Reading what happened
// ---------------------------------------------------------------------------------------------------------------

/// A WAL location `X/Y` as a number.
fn lsn(text: &str) -> u64 {
    parse_lsn(text).unwrap_or_else(|| panic!("not an LSN: {text:?}"))
}

fn parse_lsn(text: &str) -> Option<u64> {
    let (hi, lo) = text.split_once('/')?;
    let hi = u32::from_str_radix(hi, 16).ok()?;
    let lo = u32::from_str_radix(lo, 16).ok()?;
    Some((u64::from(hi) << 32) | u64::from(lo))
}

/// Every WAL location written in `text`.
fn lsns_in(text: &str) -> Vec<u64> {
    text.split(|c: char| !(c.is_ascii_hexdigit() || c == '/')).filter_map(parse_lsn).collect()
}

/// Where a slot may be advanced once `position` is acknowledged: past its transaction when it carries `end`,
/// else to the start of its transaction's commit record (which keeps the transaction).
fn resume_lsn(position: &Value) -> u64 {
    let field = |k: &str| position.get(k).and_then(Value::as_str);
    lsn(field("end").or_else(|| field("lsn")).unwrap_or_else(|| panic!("not a postgres-logical position: {position}")))
}

/// The stored checkpoint of [`FUNCTION`] in `app_name`.
async fn checkpoint(app_name: &str) -> Value {
    state(&shared_blob_store(), app_name).await.0.checkpoint().clone()
}

/// The slot never passes what the stored checkpoint has passed (read while no tick runs).
async fn assert_slot_within_checkpoint(db: &Db, app_name: &str, when: &str) {
    let checkpoint = checkpoint(app_name).await;
    let confirmed = db.confirmed_flush().await;
    assert!(
        confirmed <= resume_lsn(&checkpoint),
        "{when}: slot {} is confirmed at {confirmed:X}, past the stored checkpoint {checkpoint} (resume {:X})",
        db.slot,
        resume_lsn(&checkpoint)
    );
}

/// `(Operation, Item)` of each change message.
fn changes(messages: &[Value]) -> Vec<(i64, Value)> {
    messages
        .iter()
        .map(|m| (m["Operation"].as_i64().unwrap_or_else(|| panic!("no Operation in {m}")), m["Item"].clone()))
        .collect()
}

/// Every attempt's failure of a firing and the handler's log, to search for an error message.
pub(crate) fn failure_text(host: &HostDriver, run: &TimerRun) -> String {
    let mut text: Vec<String> = run
        .attempts
        .iter()
        .filter_map(|a| match &a.outcome {
            AttemptOutcome::HandlerFailed { reason } => Some(reason.clone()),
            AttemptOutcome::OutputWriteFailed { reason, .. } => Some(reason.clone()),
            AttemptOutcome::Applied => None,
        })
        .collect();
    text.push(host.output());
    text.join("\n")
}

/// Fires the timer, which must fail at every attempt; the failures and the handler's log.
async fn fire_failing(host: &HostDriver) -> String {
    let run = host.run_timer(FUNCTION).await.expect("timer run");
    assert!(!run.succeeded, "the firing should fail, and wrote {:?}\n{}", run.applied, host.output());
    failure_text(host, &run)
}

/// The first firing: creates the slot (and the publication); nothing can be delivered yet.
pub(crate) async fn first_firing(host: &HostDriver) {
    let run = host.run_timer(FUNCTION).await.expect("timer run");
    assert!(run.succeeded, "the first firing failed: {}", failure_text(host, &run));
    assert!(run.applied.get("changes").is_none_or(|m| m.is_empty()), "delivered before any write: {:?}", run.applied);
}

/// Fires the timer until an invocation writes nothing, and returns every message written so far.
async fn drain_all(host: &HostDriver) -> Vec<Value> {
    drain(host, 50).await;
    host.delivered("changes")
}

/// The raw text of each `Item` an invocation answered, before the host re-reads it: the exact JSON the
/// handler built.
/// An answer it cannot read fails the test, naming the body (never read as "nothing answered").
pub(crate) fn answered_items(invocation: &testbed::driver::Invocation) -> Vec<(i64, String)> {
    let unreadable = |why: &str| -> ! { panic!("the handler's answer is unreadable ({why}): {}", invocation.body) };
    let object = |text: &str, what: &str| -> HashMap<String, Box<RawValue>> {
        serde_json::from_str(text).unwrap_or_else(|e| unreadable(&format!("{what} is not a JSON object: {e}")))
    };
    let field = |map: &HashMap<String, Box<RawValue>>, name: &str| -> String {
        map.get(name).map(|v| v.get().to_string()).unwrap_or_else(|| unreadable(&format!("no {name:?}")))
    };
    let outputs = object(&field(&object(&invocation.body, "the answer"), "Outputs"), "Outputs");
    let changes: Vec<HashMap<String, Box<RawValue>>> = serde_json::from_str(&field(&outputs, "changes"))
        .unwrap_or_else(|e| unreadable(&format!("changes is not an array of objects: {e}")));
    changes
        .iter()
        .map(|c| {
            let op = serde_json::from_str::<i64>(&field(c, "Operation"))
                .unwrap_or_else(|e| unreadable(&format!("an Operation is not a number: {e}")));
            (op, field(c, "Item"))
        })
        .collect()
}

/// `handler state <args>` on the app, as JSON; the error text when it fails.
pub(crate) async fn cli(app: &AppFolder, args: &[&str]) -> Result<Value, String> {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output = handler_cli(app.root(), &args).await;
    if output.status.success() {
        Ok(serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!("handler {args:?} printed no JSON ({e}): {}", String::from_utf8_lossy(&output.stdout))
        }))
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// Finds `key` anywhere in a JSON document (status keys are still settling).
fn find_key<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Object(o) => o.get(key).or_else(|| o.values().find_map(|x| find_key(x, key))),
        Value::Array(a) => a.iter().find_map(|x| find_key(x, key)),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------------------------
// 1. Inserts, updates and hard deletes
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn inserts_updates_and_hard_deletes_arrive_one_change_each_in_commit_order() {
    // GIVEN a logical function on orders, its slot created by a first firing
    let db = Db::shared("logical_ops", ORDERS).await;
    let (app, _) = logical_app(&db, "public.orders", json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN rows are inserted, updated and hard-deleted, some in one transaction (insert, update and delete of
    // the same row included, which net-change tracking would collapse)
    db.insert([1, 2, 3]).await;
    db.db.execute("UPDATE orders SET amount = 9.99, customer = 'renamed' WHERE id = 2", &[]).await.expect("update");
    db.db.execute("DELETE FROM orders WHERE id = 3", &[]).await.expect("delete");
    db.db
        .batch_execute(
            "BEGIN;
             INSERT INTO orders VALUES (4, 'c4', 4.00);
             UPDATE orders SET amount = 44.40 WHERE id = 4;
             DELETE FROM orders WHERE id = 1;
             INSERT INTO orders VALUES (5, 'c5', 5.00);
             DELETE FROM orders WHERE id = 5;
             COMMIT;",
        )
        .await
        .expect("one transaction");
    let delivered = drain_all(&host).await;

    // THEN every change arrives once, in commit order and in statement order within a transaction
    let got: Vec<(i64, i64)> = changes(&delivered)
        .iter()
        .map(|(op, item)| (*op, item["id"].as_i64().unwrap_or_else(|| panic!("no id in {item}"))))
        .collect();
    assert_eq!(got, [(0, 1), (0, 2), (0, 3), (1, 2), (2, 3), (0, 4), (1, 4), (2, 1), (0, 5), (2, 5)], "{delivered:#?}");
    // AND inserts and updates carry the whole new row (amounts as the host re-reads them: doubles)
    let all = changes(&delivered);
    assert_eq!(all[0].1, json!({"id": 1, "customer": "c1", "amount": 1.25}));
    assert_eq!(all[3].1, json!({"id": 2, "customer": "renamed", "amount": 9.99}));
    assert_eq!(all[6].1, json!({"id": 4, "customer": "c4", "amount": 44.4}));
    // AND a delete's Item is the key, exactly
    for (i, id) in [(4, 3), (7, 1), (9, 5)] {
        assert_eq!(all[i].1, json!({ "id": id }), "delete of {id}");
    }
    // AND without includeMetadata there is no Metadata
    assert!(delivered.iter().all(|m| m.get("Metadata").is_none()), "{delivered:#?}");
}

#[tokio::test]
async fn include_metadata_gives_each_change_its_lsn_its_transactions_commit_lsn_xid_and_commit_time() {
    // GIVEN a function with includeMetadata
    let db = Db::shared("logical_meta", ORDERS).await;
    let (app, _) = logical_app(&db, "public.orders", json!({ "includeMetadata": true }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN two transactions write, the test noting each one's xid and the WAL positions around them
    let before = db.wal_lsn().await;
    let mut xids = Vec::new();
    for ids in [[1_i64, 2], [3, 4]] {
        let rows = db
            .db
            .simple_query(&format!(
                "BEGIN; INSERT INTO orders VALUES ({a}, 'a', 1), ({b}, 'b', 2); SELECT txid_current()::text; COMMIT;",
                a = ids[0],
                b = ids[1]
            ))
            .await
            .expect("a transaction");
        let xid = rows
            .iter()
            .find_map(|m| match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(|x| x.parse::<u64>().expect("an xid")),
                _ => None,
            })
            .expect("txid_current");
        xids.push(xid);
    }
    let after = db.wal_lsn().await;
    let invocation = invoke_until_answered(&host, FUNCTION).await;
    let answered = answered_changes(&invocation);

    // THEN every change has Metadata {Lsn, CommitLsn, Xid, CommitTime}, exactly those keys
    assert_eq!(answered.len(), 4, "{answered:#?}");
    let started = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);
    for (i, change) in answered.iter().enumerate() {
        let m = &change["Metadata"];
        let keys: Vec<&str> = m.as_object().map(|o| o.keys().map(String::as_str).collect()).unwrap_or_default();
        assert_eq!(keys, ["Lsn", "CommitLsn", "Xid", "CommitTime"], "{change}");
        // the xid of the transaction (32 bits on the wire: the epoch is 0 on the test servers)
        assert_eq!(m["Xid"].as_u64(), Some(xids[i / 2] & 0xFFFF_FFFF), "{change}");
        let (change_lsn, commit_lsn) =
            (lsn(m["Lsn"].as_str().expect("Lsn")), lsn(m["CommitLsn"].as_str().expect("CommitLsn")));
        assert!(
            before <= change_lsn && change_lsn < commit_lsn && commit_lsn < after,
            "written between {before:X} and {after:X}: {change}"
        );
        let at = time::OffsetDateTime::parse(
            m["CommitTime"].as_str().expect("CommitTime"),
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap_or_else(|e| panic!("CommitTime is not RFC 3339 ({e}): {change}"));
        assert!(at > started && at <= time::OffsetDateTime::now_utc(), "{change}");
        assert!(m["CommitTime"].as_str().is_some_and(|t| t.ends_with('Z')), "UTC: {change}");
    }
    // AND changes of one transaction share its commit LSN and time, in LSN order; the second transaction
    // commits after the first
    let meta = |i: usize| &answered[i]["Metadata"];
    assert_eq!(
        (meta(0)["CommitLsn"].clone(), meta(0)["CommitTime"].clone()),
        (meta(1)["CommitLsn"].clone(), meta(1)["CommitTime"].clone())
    );
    assert_eq!(meta(2)["CommitLsn"], meta(3)["CommitLsn"]);
    assert!(lsn(meta(0)["Lsn"].as_str().unwrap()) < lsn(meta(1)["Lsn"].as_str().unwrap()));
    assert!(lsn(meta(1)["CommitLsn"].as_str().unwrap()) < lsn(meta(2)["Lsn"].as_str().unwrap()));
}

// ---------------------------------------------------------------------------------------------------------------
// 2. A transaction larger than a batch
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_transaction_larger_than_a_batch_is_paged_in_order_and_the_slot_keeps_it_until_its_last_page() {
    // GIVEN batches of 10
    let db = Db::shared("logical_page", ORDERS).await;
    let (app, app_name) = logical_app(&db, "public.orders", json!({ "maxBatchSize": 10 }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN one transaction inserts 25 rows
    db.insert(1..=25).await;

    // THEN firings deliver 10, 10 and 5 of them, in order, each once
    let mut sizes = Vec::new();
    let mut checkpoints = Vec::new();
    for _ in 0..5 {
        let run = host.run_timer(FUNCTION).await.expect("timer run");
        assert!(run.succeeded, "{}", failure_text(&host, &run));
        sizes.push(run.applied.get("changes").map_or(0, Vec::len));
        checkpoints.push(checkpoint(&app_name).await);
        assert_slot_within_checkpoint(&db, &app_name, &format!("after firing {}", sizes.len())).await;
    }
    assert_eq!(sizes, [10, 10, 5, 0, 0], "checkpoints {checkpoints:#?}");
    let delivered = host.delivered("changes");
    assert_eq!(ids_of(&delivered), (1..=25).collect::<Vec<_>>());
    assert!(changes(&delivered).iter().all(|(op, _)| *op == 0));

    // AND the checkpoints inside the transaction carry no end (the slot must keep the transaction), the last
    // one does, and all name the same commit LSN
    assert_eq!(checkpoints[1]["n"], 10, "{checkpoints:#?}");
    assert!(checkpoints[1].get("end").is_none(), "{checkpoints:#?}");
    assert_eq!(checkpoints[2]["n"], 20, "{checkpoints:#?}");
    assert!(checkpoints[2].get("end").is_none(), "{checkpoints:#?}");
    assert_eq!(checkpoints[3]["n"], 25, "{checkpoints:#?}");
    assert!(checkpoints[3].get("end").is_some(), "{checkpoints:#?}");
    assert_eq!(checkpoints[1]["lsn"], checkpoints[3]["lsn"]);
    // AND once acknowledged and a firing later, the slot has passed the whole transaction
    assert_eq!(db.confirmed_flush().await, resume_lsn(&checkpoints[3]));
}

// ---------------------------------------------------------------------------------------------------------------
// 3. TOAST
// ---------------------------------------------------------------------------------------------------------------

const DOCS: &str = "CREATE TABLE public.docs (id bigint PRIMARY KEY, other text NOT NULL, big text);
ALTER TABLE public.docs ALTER COLUMN big SET STORAGE EXTERNAL;";

/// ~100 KB of incompressible text (md5 chunks), stored out of line.
const BIG: &str = "(SELECT string_agg(md5(g::text || random()::text), '') FROM generate_series(1, 3200) g)";

async fn toast_case(replica_identity_full: bool, delete_before_firing: bool) {
    let db = Db::shared("logical_toast", DOCS).await;
    if replica_identity_full {
        db.db.batch_execute("ALTER TABLE docs REPLICA IDENTITY FULL").await.expect("replica identity");
    }
    let (app, _) = logical_app(&db, "public.docs", json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    db.db.batch_execute(&format!("INSERT INTO docs VALUES (1, 'a', {BIG})")).await.expect("insert");
    let big: String = db.db.query_one("SELECT big FROM docs WHERE id = 1", &[]).await.expect("read").get(0);
    let toasted: bool = db
        .db
        .query_one("SELECT pg_column_size(big) < octet_length(big) / 2 OR pg_relation_size(reltoastrelid) > 0 FROM docs, pg_class WHERE id = 1 AND pg_class.oid = 'docs'::regclass", &[])
        .await
        .expect("toast")
        .get(0);
    assert!(big.len() > 100_000 && toasted, "the big text is stored out of line");

    // WHEN an update does not touch the TOAST-ed column (and, in one case, the row is deleted before the
    // function reads the update)
    db.db.execute("UPDATE docs SET other = 'b' WHERE id = 1", &[]).await.expect("update");
    if delete_before_firing {
        db.db.execute("DELETE FROM docs WHERE id = 1", &[]).await.expect("delete");
    }
    let delivered = drain_all(&host).await;

    // THEN the update's Item still has the whole big text
    let all = changes(&delivered);
    let expected_ops: &[i64] = if delete_before_firing { &[0, 1, 2] } else { &[0, 1] };
    assert_eq!(all.iter().map(|(op, _)| *op).collect::<Vec<_>>(), expected_ops);
    assert_eq!(all[0].1["big"].as_str().map(str::len), Some(big.len()));
    assert_eq!(all[1].1["other"], "b");
    assert_eq!(
        all[1].1["big"].as_str().map(str::len),
        Some(big.len()),
        "the update's Item lost the untouched TOAST value: {}",
        all[1].1["big"].to_string().chars().take(80).collect::<String>()
    );
    assert!(all[1].1["big"] == json!(big), "the update's Item has another big text");
    // the insert's Item was built in the handler, the update's by the statement that reads the value back
    assert!(host.output().contains("the Items of public.docs are built in the handler"), "{}", host.output());
}

#[tokio::test]
async fn an_update_that_leaves_a_toasted_column_alone_still_delivers_its_value() {
    toast_case(false, false).await;
}

#[tokio::test]
async fn with_replica_identity_full_a_toasted_value_survives_a_delete_made_before_the_update_is_read() {
    // With REPLICA IDENTITY FULL the WAL carries the old row, TOAST-ed values inline: the update's value does
    // not depend on the row still being in the table when the function reads the update.
    toast_case(true, true).await;
}

#[tokio::test]
async fn without_replica_identity_full_a_toasted_value_of_a_row_deleted_since_is_left_out_of_the_update_not_null() {
    // GIVEN the default replica identity: the WAL does not carry an untouched TOAST-ed value, and the source
    // reads it back from the table by key
    let db = Db::shared("logical_toast_gone", DOCS).await;
    let (app, _) = logical_app(&db, "public.docs", json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    db.db.batch_execute(&format!("INSERT INTO docs VALUES (1, 'a', {BIG})")).await.expect("insert");

    // WHEN an update leaves the big text alone and the row is deleted before the function reads the update
    db.db.execute("UPDATE docs SET other = 'b' WHERE id = 1", &[]).await.expect("update");
    db.db.execute("DELETE FROM docs WHERE id = 1", &[]).await.expect("delete");
    let delivered = drain_all(&host).await;

    // THEN the update's Item leaves the value out (it is unknowable now), rather than claiming it became null
    let all = changes(&delivered);
    assert_eq!(all.iter().map(|(op, _)| *op).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(
        all[1].1,
        json!({"id": 1, "other": "b"}),
        "{}",
        all[1].1.to_string().chars().take(200).collect::<String>()
    );
    assert_eq!(all[2].1, json!({"id": 1}));
}

// ---------------------------------------------------------------------------------------------------------------
// 4. Composite keys, unicode and reserved names; deleteItem row
// ---------------------------------------------------------------------------------------------------------------

const LINES: &str = r#"CREATE SCHEMA "Ventes Été";
CREATE TABLE "Ventes Été"."Order Lines" (
    "order id" bigint NOT NULL,
    "line" int NOT NULL,
    "select" text,
    "Ünïcödé" text,
    "say ""hi""" text,
    PRIMARY KEY ("line", "order id")
);"#;

#[tokio::test]
async fn composite_keys_unicode_and_reserved_column_names_are_delivered_and_a_delete_carries_the_whole_key() {
    // GIVEN a table with a quoted schema and name, a two-column key (declared in another order than the
    // columns), and columns named by a reserved word, in unicode and with a quote
    let db = Db::shared("logical_names", LINES).await;
    let (app, _) = logical_app(&db, r#""Ventes Été"."Order Lines""#, json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN lines are inserted, one updated and one deleted
    db.db
        .batch_execute(
            r#"INSERT INTO "Ventes Été"."Order Lines" VALUES (1, 1, 'from', 'héllo wörld ✓ 🚀', 'x'), (1, 2, 'where', 'ß', NULL), (2, 1, 'join', '日本語', 'y');
               UPDATE "Ventes Été"."Order Lines" SET "select" = 'chosen', "Ünïcödé" = 'ñ' WHERE "order id" = 1 AND "line" = 2;
               DELETE FROM "Ventes Été"."Order Lines" WHERE "order id" = 2 AND "line" = 1;"#,
        )
        .await
        .expect("writes");
    let delivered = drain_all(&host).await;

    // THEN each change arrives with every column under its own name
    let expected = [
        (0, json!({"order id": 1, "line": 1, "select": "from", "Ünïcödé": "héllo wörld ✓ 🚀", "say \"hi\"": "x"})),
        (0, json!({"order id": 1, "line": 2, "select": "where", "Ünïcödé": "ß", "say \"hi\"": null})),
        (0, json!({"order id": 2, "line": 1, "select": "join", "Ünïcödé": "日本語", "say \"hi\"": "y"})),
        (1, json!({"order id": 1, "line": 2, "select": "chosen", "Ünïcödé": "ñ", "say \"hi\"": null})),
        // AND the delete's Item is exactly the composite key
        (2, json!({"order id": 2, "line": 1})),
    ];
    assert_eq!(changes(&delivered), expected);
}

#[tokio::test]
async fn an_update_that_changes_the_key_is_a_delete_of_the_old_key_and_an_insert_of_the_new_row() {
    // GIVEN batches of 3, so the two halves of a key change can fall into two batches
    let db = Db::shared("logical_rekey", ORDERS).await;
    let (app, _) = logical_app(&db, "public.orders", json!({ "maxBatchSize": 3 }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN rows are inserted and two of them move to other keys (one also changing another column)
    db.insert([1, 2]).await;
    db.db.execute("UPDATE orders SET id = 10 WHERE id = 1", &[]).await.expect("rekey");
    db.db.execute("UPDATE orders SET id = 20, amount = 3.00 WHERE id = 2", &[]).await.expect("rekey");
    db.db.execute("UPDATE orders SET amount = 4.00 WHERE id = 20", &[]).await.expect("update");
    let delivered = drain_all(&host).await;

    // THEN each key change is a delete of the old key and an insert of the new row, in order, each once
    assert_eq!(
        changes(&delivered),
        [
            (0, json!({"id": 1, "customer": "c1", "amount": 1.25})),
            (0, json!({"id": 2, "customer": "c2", "amount": 2.5})),
            (2, json!({"id": 1})),
            (0, json!({"id": 10, "customer": "c1", "amount": 1.25})),
            (2, json!({"id": 2})),
            (0, json!({"id": 20, "customer": "c2", "amount": 3.0})),
            (1, json!({"id": 20, "customer": "c2", "amount": 4.0})),
        ]
    );
}

#[tokio::test]
async fn delete_item_row_needs_replica_identity_full_and_then_delivers_the_whole_old_row() {
    // GIVEN deleteItem row on a table without REPLICA IDENTITY FULL
    let db = Db::shared("logical_delrow", ORDERS).await;
    let (app, _) = logical_app(&db, "public.orders", json!({ "deleteItem": "row" }), &[]);
    let host = start(&app).await;

    // THEN the first firing fails and says what to run
    let failure = fire_failing(&host).await;
    assert!(failure.contains("REPLICA IDENTITY FULL"), "{failure}");

    // WHEN the table gets REPLICA IDENTITY FULL (a handler started after it: the table's shape is read once)
    db.db.batch_execute("ALTER TABLE orders REPLICA IDENTITY FULL").await.expect("replica identity");
    host.restart().await.expect("restart");
    first_firing(&host).await;
    db.insert([1, 2]).await;
    db.db.execute("UPDATE orders SET amount = 7.50 WHERE id = 2", &[]).await.expect("update");
    db.db.execute("DELETE FROM orders WHERE id = 2", &[]).await.expect("delete");
    let delivered = drain_all(&host).await;

    // THEN the delete's Item is the whole row as it was
    assert_eq!(
        changes(&delivered),
        [
            (0, json!({"id": 1, "customer": "c1", "amount": 1.25})),
            (0, json!({"id": 2, "customer": "c2", "amount": 2.5})),
            (1, json!({"id": 2, "customer": "c2", "amount": 7.5})),
            (2, json!({"id": 2, "customer": "c2", "amount": 7.5})),
        ]
    );
}

// ---------------------------------------------------------------------------------------------------------------
// 5. TRUNCATE
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_truncate_stops_the_function_by_default_and_on_truncate_skip_then_goes_past_it() {
    // GIVEN a function with the default onTruncate (fail); short leases, for the restart below
    let db = Db::shared("logical_trunc", ORDERS).await;
    let (app, app_name) = logical_app(&db, "public.orders", json!({}), &[("Sql_Trigger_LeaseDurationMs", "1000")]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN rows are inserted, the table truncated, and another row inserted
    db.insert([1, 2]).await;
    let before_truncate = db.wal_lsn().await;
    db.db.batch_execute("TRUNCATE orders").await.expect("truncate");
    let after_truncate = db.wal_lsn().await;
    db.insert([3]).await;

    // THEN the changes before the truncate are delivered, and then every firing fails naming the TRUNCATE
    // and its LSN
    let first = fire_until_delivered(&host, FUNCTION).await;
    assert_eq!(ids_of(&first), [1, 2]);
    for _ in 0..3 {
        let failure = fire_failing(&host).await;
        assert!(failure.contains("TRUNCATE"), "{failure}");
        let named = lsns_in(&failure).into_iter().any(|l| before_truncate < l && l < after_truncate);
        assert!(named, "the failure names the truncate's LSN ({before_truncate:X}..{after_truncate:X}): {failure}");
    }
    // AND nothing after it was delivered or acknowledged: the checkpoint and the slot stay before it
    assert_eq!(ids_of(&host.delivered("changes")), [1, 2]);
    assert!(resume_lsn(&checkpoint(&app_name).await) <= before_truncate);
    assert!(db.confirmed_flush().await <= before_truncate);

    // WHEN the operator sets onTruncate skip and the handler restarts
    let trigger = logical_trigger("public.orders", &db.slot, json!({ "onTruncate": "skip" }));
    std::fs::write(app.root().join(FUNCTION).join("sqltrigger.json"), trigger.to_string())
        .expect("rewrite sqltrigger.json");
    host.restart().await.expect("restart");
    db.insert([4]).await;
    let counts = fire_until_all_delivered(&host, &ids(1..=4)).await;

    // THEN the rows after the truncate are delivered once each (1 and 2, whose acknowledgement the failing
    // firings could not commit, may come again)
    assert_nothing_lost(&counts, &ids(1..=4), &ids(1..=2));
    assert!(host.output().contains("truncated"), "an error line says the truncate was skipped:\n{}", host.output());
}

#[tokio::test]
async fn with_on_truncate_skip_a_truncate_logs_an_error_and_the_changes_after_it_are_delivered() {
    // GIVEN onTruncate skip
    let db = Db::shared("logical_skip", ORDERS).await;
    let (app, _) = logical_app(&db, "public.orders", json!({ "onTruncate": "skip" }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN rows are inserted, the table truncated (alone, and then with inserts in the same transaction)
    db.insert([1, 2]).await;
    db.db.batch_execute("TRUNCATE orders").await.expect("truncate");
    db.insert([3]).await;
    db.db.batch_execute("BEGIN; INSERT INTO orders VALUES (4, 'c4', 1); TRUNCATE orders; INSERT INTO orders VALUES (5, 'c5', 1); COMMIT;").await.expect("truncate in a transaction");
    let delivered = drain_all(&host).await;

    // THEN every insert is delivered once, in order, and nothing stands for the truncates
    assert_eq!(
        changes(&delivered).iter().map(|(op, i)| (*op, i["id"].as_i64().unwrap_or(-1))).collect::<Vec<_>>(),
        [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5)]
    );
    // AND the handler logged an error line for each truncate
    let output = host.output();
    let lines = output.lines().filter(|l| l.contains("ERROR") && l.contains("truncated")).count();
    assert_eq!(lines, 2, "one ERROR line per truncate:\n{output}");
}

// ---------------------------------------------------------------------------------------------------------------
// 6. Hard kills during a drain with concurrent writers
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn kill_9_during_a_drain_with_concurrent_writers_loses_nothing_and_duplicates_only_written_unacknowledged_batches(
) {
    // GIVEN batches of 4 and leases of 1 s (a new process takes a dead one's batch over after that long)
    let db = Db::shared("logical_kill", ORDERS).await;
    let (app, app_name) =
        logical_app(&db, "public.orders", json!({ "maxBatchSize": 4 }), &[("Sql_Trigger_LeaseDurationMs", "1000")]);
    {
        let host = start(&app).await;
        first_firing(&host).await;
        host.kill();
    }
    let writer_db = std::sync::Arc::new(embedded::connect(&db.url).await.expect("connect the writer"));
    let mut next_id = 1_i64;
    let mut written: Vec<Value> = Vec::new();
    let mut extra: BTreeMap<i64, usize> = BTreeMap::new();
    let mut trace: Vec<String> = Vec::new();

    // WHEN each round writes a few rows, then starts a handler process while a writer keeps inserting (one or
    // two rows per transaction), and the process dies at the round's point
    for kill in [
        Kill::AfterWrittenAnswer,
        Kill::AfterFetch,
        Kill::AfterCommit,
        Kill::AfterLostAnswer,
        Kill::AfterWrittenAnswer,
        Kill::WhileIdle,
    ] {
        db.insert(next_id..next_id + 3).await;
        next_id += 3;
        let (from, to) = (next_id, next_id + 12);
        next_id = to;
        let mut writer = {
            let w = writer_db.clone();
            tokio::spawn(async move {
                let mut id = from;
                while id < to {
                    let n = if id % 3 == 0 { 2 } else { 1 }.min(to - id);
                    let ids: Vec<i64> = (id..id + n).collect();
                    w.execute(
                        "INSERT INTO orders (id, customer, amount) SELECT i, 'w', 1 FROM unnest($1::bigint[]) i",
                        &[&ids],
                    )
                    .await
                    .expect("writer insert");
                    id += n;
                    tokio::time::sleep(Duration::from_millis(15)).await;
                }
            })
        };
        let host = match kill.failpoint(Some(2)) {
            Some(point) => app.start_handler(&[(failpoint::ENV, &point)]).await,
            None => start(&app).await,
        };
        if kill == Kill::WhileIdle {
            (&mut writer).await.expect("the writer");
        }
        let note = format!("{kill:?} (writer {from}..{to}){}", kill_at(&host, kill, 40, &mut extra).await);
        if kill != Kill::WhileIdle {
            writer.await.expect("the writer");
        }
        written.extend(host.delivered("changes"));
        trace.push(note);
        // The slot never passed the stored checkpoint, whatever point the process died at.
        assert_slot_within_checkpoint(&db, &app_name, &format!("after {kill:?}")).await;
    }
    let present: Vec<i64> =
        db.db.query("SELECT id FROM orders ORDER BY id", &[]).await.expect("ids").iter().map(|r| r.get(0)).collect();

    // THEN a last process delivers every row: each once, plus once per batch the host wrote before a crash that
    // came before its acknowledgement was committed
    let host = start(&app).await;
    let all: std::collections::BTreeSet<i64> = present.iter().copied().collect();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let mut so_far = written.clone();
        so_far.extend(host.delivered("changes"));
        if tally(&so_far).0.is_superset(&all) {
            break;
        }
        assert!(Instant::now() < deadline, "rows missing after 15 s: {:?}\n{trace:#?}", &all - &tally(&so_far).0);
        let run = host.run_timer(FUNCTION).await.expect("timer run");
        assert!(run.succeeded, "{}", failure_text(&host, &run));
    }
    drain(&host, 20).await;
    written.extend(host.delivered("changes"));
    let expected: BTreeMap<i64, usize> = all.iter().map(|id| (*id, 1 + extra.get(id).copied().unwrap_or(0))).collect();
    assert_eq!(tally(&written).1, expected, "rounds: {trace:#?}");
    assert_slot_within_checkpoint(&db, &app_name, "at the end").await;
}

// ---------------------------------------------------------------------------------------------------------------
// 7. A crash between the state commit and the slot's advance
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_crash_after_the_checkpoint_commit_and_before_the_slot_advance_loses_nothing_and_repeats_nothing() {
    // GIVEN batches of 5 and three transactions (5, 5 and 2 rows); a process armed to abort right after its
    // second answered batch is committed: that commit also acknowledges the first batch (the checkpoint moves),
    // and the slot is advanced only at the start of the next tick, which never comes
    let db = Db::shared("logical_window", ORDERS).await;
    let (app, app_name) =
        logical_app(&db, "public.orders", json!({ "maxBatchSize": 5 }), &[("Sql_Trigger_LeaseDurationMs", "1000")]);
    let host = app.start_handler(&[(failpoint::ENV, "after-commit@2")]).await;
    first_firing(&host).await;
    db.insert(1..=5).await;
    db.insert(6..=10).await;
    db.insert(11..=12).await;

    // WHEN the first batch is written and acknowledged by the firing that dies
    let first = fire_until_delivered(&host, FUNCTION).await;
    assert_eq!(ids_of(&first), [1, 2, 3, 4, 5]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while host.is_running() {
        assert!(Instant::now() < deadline, "no crash within 10 s:\n{}", host.output());
        let run = host.run_timer(FUNCTION).await.expect("timer run");
        assert!(run.applied.get("changes").is_none_or(|m| m.is_empty()), "wrote more than the first batch");
    }
    assert!(host.output().contains("failpoint after-commit"), "{}", host.output());

    // THEN the committed checkpoint has passed the first transaction, and the slot is still before it: the
    // window is real, and the slot never went ahead of the state
    let acknowledged = checkpoint(&app_name).await;
    assert!(acknowledged.get("end").is_some() && acknowledged["n"] == 5, "{acknowledged}");
    let confirmed = db.confirmed_flush().await;
    assert!(confirmed < resume_lsn(&acknowledged), "slot {confirmed:X}, checkpoint {acknowledged}");

    // WHEN a new process takes over
    let host = start(&app).await;
    fire_until_all_delivered(&host, &ids(6..=12)).await;
    drain(&host, 20).await;

    // THEN every row arrives, and none twice (the first batch was acknowledged before the crash; the second
    // was recorded but never answered)
    let mut all = first.clone();
    all.extend(host.delivered("changes"));
    assert_eq!(tally(&all).1, ids(1..=12).into_iter().map(|id| (id, 1)).collect::<BTreeMap<_, _>>());
    // AND the slot caught up with the checkpoint
    run_ok(&host).await;
    let last = checkpoint(&app_name).await;
    assert_eq!(db.confirmed_flush().await, resume_lsn(&last), "{last}");
}

/// One firing that must succeed.
async fn run_ok(host: &HostDriver) -> TimerRun {
    let run = host.run_timer(FUNCTION).await.expect("timer run");
    assert!(run.succeeded, "{}", failure_text(host, &run));
    run
}

// ---------------------------------------------------------------------------------------------------------------
// 8. A dropped slot, an invalidated slot
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_dropped_slot_is_refused_loudly_never_recreated_silently_and_a_reset_to_now_goes_on() {
    // GIVEN a function that delivered once
    let db = Db::shared("logical_dropped", ORDERS).await;
    let (app, app_name) = logical_app(&db, "public.orders", json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    db.insert([1]).await;
    assert_eq!(ids_of(&drain_all(&host).await), [1]);

    // WHEN an operator drops its slot, and rows are written meanwhile
    db.drop_slot().await;
    db.insert([2]).await;

    // THEN every firing fails, saying the slot does not exist and that a reset is the way on
    for _ in 0..2 {
        let failure = fire_failing(&host).await;
        assert!(failure.contains(&db.slot) && failure.contains("does not exist"), "{failure}");
        assert!(failure.contains("state reset"), "names the reset: {failure}");
    }
    // AND the slot was not recreated behind the operator's back, nor the checkpoint moved
    assert_eq!(db.slot().await, None, "the slot was recreated silently");
    let before = checkpoint(&app_name).await;
    // AND status says what is wrong (either refusing with the reason, or showing the slot as missing)
    match cli(&app, &["state", "status", FUNCTION]).await {
        Ok(status) => assert_eq!(find_key(&status, "exists"), Some(&json!(false)), "{status}"),
        Err(e) => assert!(e.contains("does not exist"), "{e}"),
    }
    assert_eq!(db.slot().await, None, "status recreated the slot");

    // WHEN the operator resets the function to now
    let reset = cli(&app, &["state", "reset", FUNCTION, "--to", "now", "--confirm"]).await.expect("reset");
    assert_ne!(reset["checkpoint"], before, "{reset}");
    assert!(db.slot().await.is_some(), "the reset creates the slot");
    db.insert([3]).await;

    // THEN delivery goes on from the reset: 3 arrives, 2 (written while the slot was missing) is not read
    let delivered = drain_all(&host).await;
    assert_eq!(ids_of(&delivered), [1, 3]);
    run_ok(&host).await;
    assert_slot_within_checkpoint(&db, &app_name, "after the reset").await;
}

/// The WAL segments of the private server are recycled past the slot until PostgreSQL invalidates it.
async fn invalidate_slot(db: &Db) {
    db.db.simple_query("ALTER SYSTEM SET max_slot_wal_keep_size = '1MB'").await.expect("max_slot_wal_keep_size");
    db.db.simple_query("SELECT pg_reload_conf()").await.expect("reload");
    for _ in 0..12 {
        db.unrelated_wal(2).await;
        db.db.simple_query("SELECT pg_switch_wal()").await.expect("switch");
        db.db.simple_query("CHECKPOINT").await.expect("checkpoint");
        if db.slot().await.is_some_and(|(_, status)| status == "lost") {
            return;
        }
    }
    panic!("slot {} not invalidated: {:?}", db.slot, db.slot().await);
}

#[tokio::test]
async fn an_invalidated_slot_is_refused_loudly_and_a_reset_to_now_recreates_it() {
    // GIVEN a private server (its WAL settings change) and a function that delivered once
    let server = private_postgres().await;
    let db = Db::private(&server.url(), "logical_lost", ORDERS).await;
    let (app, app_name) = logical_app(&db, "public.orders", json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    db.insert([1]).await;
    assert_eq!(ids_of(&drain_all(&host).await), [1]);

    // WHEN rows are written and the server removes WAL the slot still needs (max_slot_wal_keep_size)
    db.insert([2]).await;
    invalidate_slot(&db).await;

    // THEN firings fail, saying the slot was invalidated and that changes were lost, and name the reset
    for _ in 0..2 {
        let failure = fire_failing(&host).await;
        assert!(failure.contains(&db.slot) && failure.contains("invalidated"), "{failure}");
        assert!(failure.contains("state reset"), "names the reset: {failure}");
    }
    // AND the invalidated slot is left for the operator to see
    assert_eq!(db.slot().await.map(|(_, s)| s), Some("lost".to_string()));
    let before = checkpoint(&app_name).await;

    // WHEN the operator resets to now
    let reset = cli(&app, &["state", "reset", FUNCTION, "--to", "now", "--confirm"]).await.expect("reset");
    assert_ne!(reset["checkpoint"], before, "{reset}");
    assert!(db.slot().await.is_some_and(|(_, s)| s != "lost"), "the reset recreates the slot: {:?}", db.slot().await);
    db.insert([3]).await;

    // THEN delivery goes on
    let delivered = drain_all(&host).await;
    assert_eq!(ids_of(&delivered), [1, 3]);
    run_ok(&host).await;
    assert_slot_within_checkpoint(&db, &app_name, "after the reset").await;
}

// ---------------------------------------------------------------------------------------------------------------
// 9. Values: the cursor source's JSON, exactly
// ---------------------------------------------------------------------------------------------------------------

const VALUES: &str = r#"CREATE TABLE public.vals (
    id bigint PRIMARY KEY,
    n numeric(30, 10),
    ts timestamptz,
    d date,
    j jsonb,
    b bytea,
    u uuid,
    big int8,
    tags text[],
    f float8,
    t text,
    ok boolean,
    iv interval,
    ts0 timestamp
);
DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET timezone TO %L', current_database(), 'Etc/GMT-2'); END $$;"#;

/// The cursor source's projection of `vals` (bytea as base64, the rest as `row_to_json` renders it).
const CURSOR_ITEM: &str = r#"SELECT row_to_json(r)::text FROM public.vals t CROSS JOIN LATERAL (SELECT t.id AS id, t.n AS n,
    t.ts AS ts, t.d AS d, t.j AS j, translate(encode(t.b, 'base64'), E'\n', '') AS b, t.u AS u, t.big AS big,
    t.tags AS tags, t.f AS f, t.t AS t, t.ok AS ok, t.iv AS iv, t.ts0 AS ts0) r WHERE t.id = $1"#;

#[tokio::test]
async fn every_value_is_the_json_the_cursor_source_would_send() {
    // GIVEN a table of many types, in a database whose sessions render timestamptz at +02:00
    let db = Db::shared("logical_values", VALUES).await;
    let (app, _) = logical_app(&db, "public.vals", json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN a row of edge values, a row of nulls, and an update are written
    db.db
        .batch_execute(
            r#"INSERT INTO vals VALUES (1, 12345678901234567890.0123456789, '2024-02-29 23:59:59.123456+05:30',
                '2024-02-29', '{"a": [1, 2, "x", true], "nested": {"k": null}, "s": "é\"\\", "neg": -7}',
                '\x00ff10deadbeef'::bytea, 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 9223372036854775807,
                ARRAY['a', 'b c', 'ü"q', NULL], 1.0000000000000002, E'line\nbreak\ttab "quoted" \\ back', true,
                '1 year 2 mons 3 days 04:05:06.789', '1999-12-31 23:59:59.999999');
               INSERT INTO vals (id) VALUES (2);
               UPDATE vals SET big = -9223372036854775808, f = 'NaN', n = -0.0000000001 WHERE id = 1;"#,
        )
        .await
        .expect("writes");
    let invocation = invoke_until_answered(&host, FUNCTION).await;
    let items = answered_items(&invocation);

    // THEN each answered Item is, byte for byte, the cursor source's row_to_json of the row (read now for the
    // update; the inserted row 1 as it was, from a copy taken before the update)
    let fresh = embedded::connect(&db.url).await.expect("a session with the database's time zone");
    let expected = |id: i64| {
        let fresh = &fresh;
        async move { fresh.query_one(CURSOR_ITEM, &[&id]).await.expect("the cursor's item").get::<_, String>(0) }
    };
    assert_eq!(items.len(), 3, "{items:#?}");
    assert_eq!(items[1], (0, expected(2).await));
    assert_eq!(items[2], (1, expected(1).await));
    // the insert of row 1, rebuilt from the update's values
    fresh
        .batch_execute("UPDATE vals SET big = 9223372036854775807, f = 1.0000000000000002, n = 12345678901234567890.0123456789 WHERE id = 1")
        .await
        .expect("restore row 1");
    assert_eq!(items[0], (0, expected(1).await));
}

#[tokio::test]
async fn json_and_jsonb_columns_keep_their_text_and_exact_numbers_as_the_cursor_source_sends_them() {
    // GIVEN a json column, whose text PostgreSQL keeps as written (key order, duplicate keys, spacing, numbers
    // beyond a double), and a jsonb column with numbers a double cannot hold (jsonb keeps numerics exact,
    // trailing zeros included)
    let db = Db::shared("logical_json", "CREATE TABLE public.docs (id int PRIMARY KEY, js json, jb jsonb)").await;
    let (app, _) = logical_app(&db, "public.docs", json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN a row is inserted
    db.db
        .batch_execute(r#"INSERT INTO docs VALUES (1, '{"b":1,  "a" : 2, "a": 3, "n": 0.10000000000000000000001}', '{"n": 123456789012345678901234567890.5, "m": 2.50, "small": 1e-30, "x": 0.1}')"#)
        .await
        .expect("insert");
    let invocation = invoke_until_answered(&host, FUNCTION).await;

    // THEN the Item is exactly row_to_json of the row
    let expected: String =
        db.db.query_one("SELECT row_to_json(t)::text FROM docs t", &[]).await.expect("row_to_json").get(0);
    assert_eq!(answered_items(&invocation), [(0, expected)]);
}

/// Every type whose `Item` the handler builds itself (int2/4/8, numeric, bool, text, varchar, bpchar, name,
/// uuid, xid8, json, jsonb, date, timestamp, timestamptz), with a name that needs escaping; `{extra}` adds
/// columns. The database's sessions write dates as `SQL, DMY` in a time zone whose offsets had seconds (LMT).
fn handler_built_table(table: &str, extra: &str) -> String {
    format!(
        r#"CREATE TABLE public.{table} (id int8 PRIMARY KEY, i2 int2, i4 int4, i8 int8, n numeric, n2 numeric(12, 2),
            ok bool, t text, v varchar(20), c char(5), nm name, u uuid, js json, jb jsonb, "Odd ""name"" é\" text,
            x8 xid8 DEFAULT pg_current_xact_id(), d date, ts timestamp, tz timestamptz{extra});
        DO $$ BEGIN
            EXECUTE format('ALTER DATABASE %I SET timezone TO %L', current_database(), 'Europe/Amsterdam');
            EXECUTE format('ALTER DATABASE %I SET DateStyle TO %L', current_database(), 'SQL, DMY');
        END $$;"#
    )
}

/// Writes with every tricky value the handler renders itself, one statement (transaction) at a time, to a
/// table made by [`handler_built_table`]; returns the `Item` the cursor source would send for each change,
/// read right after its write (a delete's: its key).
async fn write_tricky_values(db: &Db, table: &str) -> Vec<(i64, String)> {
    // row_to_json of the whole row (no bytea, so the cursor source's projection is the same), in a session
    // with the database's settings
    let cursor_item = format!("SELECT row_to_json(w)::text FROM public.{table} w WHERE w.id = $1");
    let fresh = embedded::connect(&db.url).await.expect("a session with the database's settings");
    let cols = r#"id, i2, i4, i8, n, n2, ok, t, v, c, nm, u, js, jb, "Odd ""name"" é\""#;
    let writes: Vec<(i64, i64, String)> = vec![
        (0, 1, format!(r#"INSERT INTO {table} ({cols}) VALUES (1, -32768, -2147483648, -9223372036854775808,
            123456789012345678901234567890.000000000000000000001, -0.50, true,
            E'quote " back \\ nl \n cr \r tab \t bs \b ff \f ctl \x01 \x1f del \x7f slash / é€😀 \u2028',
            '', 'ab', 'n"m\', 'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11',
            '{{"b":1,  "a" : 2, "a": 3, "s": "\u00e9\n\"", "n": 1E+2, "z": 0.10000000000000000000001}} ',
            '{{"nested": {{"k": [1, "x", null, true, {{}}]}}, "é": "\"\\\n\u0001\u001f", "n": 1.50, "e": 1e-30,
              "big": 123456789012345678901234567890.5, "": [], "neg": -0.0}}', 'x')"#)),
        (0, 2, format!("INSERT INTO {table} (id, i2, i4, i8, n, n2, ok) VALUES (2, 32767, 2147483647, 9223372036854775807, 'NaN', 'NaN', false)")),
        (0, 3, format!("INSERT INTO {table} (id, n) VALUES (3, 'Infinity')")),
        (0, 4, format!("INSERT INTO {table} (id, n) VALUES (4, '-Infinity')")),
        (0, 5, format!(r#"INSERT INTO {table} ({cols}) VALUES (5, 0, 0, 0, -0.0, 0, false, '', '', '', '',
            '00000000-0000-0000-0000-000000000000', '  [ ]  ', '"just a string"', '')"#)),
        (0, 6, format!("INSERT INTO {table} (id, js, jb) VALUES (6, 'null', 'null')")),
        (0, 7, format!("INSERT INTO {table} (id, x8, d, ts, tz) VALUES (7, '18446744073709551615', '2024-02-29',
            '1999-12-31 23:59:59.999999', '2024-02-29 23:59:59.123456+05:30')")),
        (0, 8, format!("INSERT INTO {table} (id, d, ts, tz) VALUES (8, 'infinity', '-infinity', 'infinity')")),
        (0, 9, format!("INSERT INTO {table} (id, d, ts, tz) VALUES (9, '-infinity', 'infinity', '-infinity')")),
        // local mean time (+00:19:32), a summer time, a time zone of minutes, a year of five digits
        (0, 10, format!("INSERT INTO {table} (id, d, ts, tz) VALUES (10, '12345-01-01', '1850-01-01 00:00:00',
            '1850-01-01 00:00:00')")),
        (0, 11, format!("INSERT INTO {table} (id, ts, tz) VALUES (11, '2024-07-01 12:00:00.5', '2024-07-01 12:00:00-03:30')")),
        // BC: left to the statement, value by value
        (0, 12, format!("INSERT INTO {table} (id, d, ts, tz) VALUES (12, '0044-03-15 BC', '0044-03-15 12:00:00 BC',
            '0044-03-15 12:00:00+00 BC')")),
        (1, 1, format!("UPDATE {table} SET t = E'\\\\\"', n = 0.000000000000000000000000000001, jb = '[1, \"two\", 3.0]' WHERE id = 1")),
        (2, 2, format!("DELETE FROM {table} WHERE id = 2")),
        // a new key: the delete of key 3, then the insert of row 30
        (2, 3, format!("UPDATE {table} SET id = 30 WHERE id = 3")),
        (0, 30, String::new()),
    ];
    let mut expected = Vec::new();
    for (op, id, statement) in writes {
        if !statement.is_empty() {
            db.db.batch_execute(&statement).await.unwrap_or_else(|e| panic!("{statement}: {e}"));
        }
        let item = match op {
            2 => format!("{{\"id\":{id}}}"),
            _ => fresh.query_one(&cursor_item, &[&id]).await.expect("the cursor's item").get(0),
        };
        expected.push((op, item));
    }
    expected
}

/// Invokes until `n` changes were answered; their raw `Item`s.
pub(crate) async fn answered_until(host: &HostDriver, n: usize) -> Vec<(i64, String)> {
    let mut items = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while items.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} changes answered within 20 s: {items:#?}\n{}",
            items.len(),
            host.output()
        );
        let invocation = host.invoke(FUNCTION, None).await.expect("invoke");
        assert_eq!(invocation.status, 200, "{}\n{}", invocation.body, host.output());
        if !answered_changes(&invocation).is_empty() {
            items.extend(answered_items(&invocation));
        }
    }
    items
}

/// The same tricky values through a table whose every type the handler renders (`fast`), and through one with
/// a float8 column more, whose Items PostgreSQL builds (`by_sql`): both must be the cursor source's bytes.
async fn handler_built_case(table: &str, extra: &str, built_here: bool) {
    // GIVEN a table of every whitelisted type (and, for the statement's path, a float8 column)
    let db = Db::shared(&format!("logical_{table}"), &handler_built_table(table, extra)).await;
    let (app, _) = logical_app(&db, &format!("public.{table}"), json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN inserts of edge values, nulls and empty strings, an update, a delete and a key change are written
    let expected = write_tricky_values(&db, table).await;
    let items = answered_until(&host, expected.len()).await;

    // THEN every Item is, byte for byte, what the cursor source's row_to_json gives, in order
    assert_eq!(items.len(), expected.len(), "{items:#?}");
    for (i, (got, want)) in items.iter().zip(&expected).enumerate() {
        assert_eq!(got, want, "change {i}");
    }
    // AND the log says which path built them
    let output = host.output();
    let here = format!("the Items of public.{table} are built in the handler from the WAL's values");
    let by_sql = format!("the Items of public.{table} are built by PostgreSQL, one statement per batch: column \"z\" is double precision (type OID 701)");
    assert_eq!(output.contains(&here), built_here, "{output}");
    assert_eq!(output.contains(&by_sql), !built_here, "{output}");
}

#[tokio::test]
async fn items_the_handler_builds_from_the_wal_are_byte_for_byte_the_cursor_sources_json() {
    handler_built_case("fast", "", true).await;
}

#[tokio::test]
async fn the_same_values_in_a_table_with_a_column_of_another_type_are_built_by_postgresql_identically() {
    handler_built_case("by_sql", ", z float8", false).await;
}

// ---------------------------------------------------------------------------------------------------------------
// 10. WAL retention
// ---------------------------------------------------------------------------------------------------------------

/// Sets the stored `progress_at` back by `by`: the clock the engine's quiet-advance period (`ADVANCE_EVERY`,
/// five minutes) is measured on, moved without waiting. The handler sees the change at its next tick (its
/// remembered document's etag no longer matches).
async fn age_progress(app_name: &str, by: time::Duration) {
    let store = shared_blob_store();
    let (doc, etag) = state(&store, app_name).await;
    let at = doc.progress_at().unwrap_or_else(|| panic!("no progress_at in {doc:?}"));
    let mut json = serde_json::to_value(&doc).expect("state serializes");
    json["progress_at"] = json!((at - by).format(&time::format_description::well_known::Rfc3339).expect("a time"));
    let doc: StateDoc = serde_json::from_value(json).expect("the edited state reads back");
    let bytes = serde_json::to_vec(&doc).expect("state serializes");
    store.save_if(&state_key(app_name), &bytes, Some(&Etag(etag))).await.expect("rewrite the state");
}

#[tokio::test]
async fn the_slot_follows_the_checkpoint_and_a_quiet_tables_slot_lets_unrelated_wal_go_within_the_quiet_period() {
    // GIVEN a private server (so the only WAL is this test's), a function, and a table it does not watch
    let server = private_postgres().await;
    let db = Db::private(&server.url(), "logical_wal", ORDERS).await;
    let (app, app_name) = logical_app(&db, "public.orders", json!({ "maxBatchSize": 50 }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN 120 rows are delivered and acknowledged, and a firing follows
    for chunk in 0..4 {
        db.insert(chunk * 30 + 1..=chunk * 30 + 30).await;
    }
    let delivered = drain_all(&host).await;
    assert_eq!(ids_of(&delivered), (1..=120).collect::<Vec<_>>());
    run_ok(&host).await;

    // THEN the slot stands at the checkpoint and keeps almost nothing
    let at = checkpoint(&app_name).await;
    assert_eq!(db.confirmed_flush().await, resume_lsn(&at), "{at}");
    let behind = db.wal_behind_slot().await;
    assert!(behind < 64 * 1024, "after draining the slot keeps {behind} bytes");
    // AND status shows the slot and the WAL it retains
    let status = cli(&app, &["state", "status", FUNCTION]).await.expect("status");
    let retained =
        find_key(&status, "wal_retained_bytes").unwrap_or_else(|| panic!("no wal_retained_bytes in {status}"));
    assert!(retained.as_i64().is_some_and(|b| b >= 0), "{status}");
    assert_eq!(status["pending"], 0, "{status}");

    // WHEN ~4 MB of WAL is written to the other table while the watched one is quiet: within the engine's
    // quiet-advance period (ADVANCE_EVERY, five minutes since the last progress) the checkpoint stays
    db.unrelated_wal(4).await;
    run_ok(&host).await;
    run_ok(&host).await;
    let behind_within_period = db.wal_behind_slot().await;
    assert!(behind_within_period > 3_000_000, "advanced within the period: {behind_within_period}");
    assert_slot_within_checkpoint(&db, &app_name, "within the quiet period").await;
    // ... and once the period has passed: the stored progress time is moved back past it (the handler has
    // no clock to move; the state document is the engine's memory of time). A CHECKPOINT first writes a
    // running-transactions record, from which the slot's restart_lsn can move too.
    db.db.batch_execute("CHECKPOINT").await.expect("checkpoint");
    age_progress(&app_name, time::Duration::minutes(6)).await;
    run_ok(&host).await;
    run_ok(&host).await;

    // THEN the slot lets the unrelated WAL go
    let behind = db.wal_behind_slot().await;
    assert!(behind < 64 * 1024, "past the quiet-advance period the slot still keeps {behind} bytes");
    assert_slot_within_checkpoint(&db, &app_name, "after the quiet advance").await;
    // AND status agrees
    let status = cli(&app, &["state", "status", FUNCTION]).await.expect("status");
    let retained = find_key(&status, "wal_retained_bytes").and_then(Value::as_i64).expect("wal_retained_bytes");
    assert!(retained < 1_000_000, "status says the slot retains {retained} bytes: {status}");
}

// ---------------------------------------------------------------------------------------------------------------
// Set-up: what the function creates, and what it asks for when it may not
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn rows_written_before_the_slot_exists_are_not_delivered_and_the_first_tick_creates_slot_and_publication() {
    // GIVEN rows written before the function ever ran
    let db = Db::shared("logical_before", ORDERS).await;
    db.insert([1, 2]).await;
    let (app, _) = logical_app(&db, "public.orders", json!({}), &[]);
    let host = start(&app).await;

    // WHEN it runs for the first time, and rows are written after
    first_firing(&host).await;
    db.insert([3]).await;

    // THEN it created its slot (pgoutput, this database) and its publication (named after the slot, with
    // the table)
    let (plugin, database, current): (String, String, String) = db
        .db
        .query_one(
            "SELECT plugin::text, database::text, current_database()::text FROM pg_replication_slots WHERE slot_name = $1",
            &[&db.slot],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .expect("the slot exists");
    assert_eq!(database, current);
    assert_eq!(plugin, "pgoutput");
    let published: i64 = db
        .db
        .query_one(
            "SELECT count(*) FROM pg_publication_tables WHERE pubname = $1 AND tablename = 'orders'",
            &[&db.slot],
        )
        .await
        .expect("publication")
        .get(0);
    assert_eq!(published, 1);
    // AND only the row written after the slot arrives
    assert_eq!(ids_of(&drain_all(&host).await), [3]);
}

#[tokio::test]
async fn a_login_that_may_not_create_the_publication_or_the_slot_is_told_the_exact_statements() {
    // GIVEN a login with SELECT on the table but neither ownership nor REPLICATION
    let db = Db::shared("logical_grants", ORDERS).await;
    let role = format!("e2e_reader_{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    db.db
        .batch_execute(&format!("CREATE ROLE {role} LOGIN; GRANT SELECT ON orders TO {role};"))
        .await
        .expect("create the role");
    let url = db.url.replacen("://postgres@", &format!("://{role}@"), 1);
    assert_ne!(url, db.url, "the test URL names the postgres user: {}", db.url);
    let restricted = Db {
        url,
        db: embedded::connect(&db.url).await.expect("connect"),
        slot: db.slot.clone(),
        _guard: SlotGuard { url: db.url.clone(), slot: db.slot.clone() },
    };
    let (app, _) = logical_app(&restricted, "public.orders", json!({}), &[]);
    let host = start(&app).await;

    // THEN the first firing fails with the statement that creates the publication, for the table's owner
    let failure = fire_failing(&host).await;
    let create = format!("CREATE PUBLICATION {} FOR TABLE \"public\".\"orders\"", db.slot);
    assert!(failure.contains(&create), "names {create:?}: {failure}");
    // AND, in the same message, what else the login lacks: the REPLICATION attribute, or the slot made for it
    assert!(failure.contains(&format!("ALTER ROLE \"{role}\" WITH REPLICATION")), "{failure}");
    assert!(
        failure.contains(&format!("SELECT pg_create_logical_replication_slot('{}', 'pgoutput')", db.slot)),
        "{failure}"
    );

    // WHEN the owner creates it, the next firing fails with the statements that create the slot or give the
    // login the REPLICATION attribute
    db.db.batch_execute(&create).await.expect("create the publication");
    host.restart().await.expect("restart");
    let failure = fire_failing(&host).await;
    let slot = format!("SELECT pg_create_logical_replication_slot('{}', 'pgoutput')", db.slot);
    assert!(failure.contains(&slot), "names {slot:?}: {failure}");
    assert!(failure.contains("REPLICATION") && failure.contains("ALTER ROLE"), "{failure}");
    assert_eq!(db.slot().await, None);

    // WHEN the login is given REPLICATION, the function starts
    db.db.batch_execute(&format!("ALTER ROLE {role} WITH REPLICATION")).await.expect("grant replication");
    first_firing(&host).await;
    db.insert([1]).await;
    assert_eq!(ids_of(&drain_all(&host).await), [1]);
    drop(host);
    drop(restricted);
    let _ = db.db.batch_execute(&format!("DROP OWNED BY {role}; DROP ROLE {role};")).await;
}

// ---------------------------------------------------------------------------------------------------------------
// Replay in LSN terms, and a schema change
// ---------------------------------------------------------------------------------------------------------------

#[tokio::test]
async fn a_replay_before_the_slot_is_refused_at_the_command_and_a_new_column_reaches_item() {
    // GIVEN a function that delivered two rows, and a tick after them that released them at the slot
    let db = Db::shared("logical_replay", ORDERS).await;
    let (app, app_name) = logical_app(&db, "public.orders", json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    let start_position = checkpoint(&app_name).await;
    db.insert([1, 2]).await;
    assert_eq!(ids_of(&drain_all(&host).await), [1, 2]);
    run_ok(&host).await;
    let current = checkpoint(&app_name).await;
    assert!(resume_lsn(&current) > resume_lsn(&start_position), "{current} after {start_position}");

    // WHEN an operator asks to replay from before the slot's position
    let refused = cli(&app, &["state", "replay", FUNCTION, "--from", &start_position.to_string()])
        .await
        .expect_err("a replay before the slot is refused");

    // THEN the command refuses, saying how far back it can go, and the state is untouched
    assert!(refused.contains("cannot go back before"), "{refused}");
    assert_eq!(checkpoint(&app_name).await, current);
    // AND a replay from the current checkpoint is accepted
    cli(&app, &["state", "replay", FUNCTION, "--from", &current.to_string()]).await.expect("replay at the checkpoint");

    // WHEN a column is added and a row written with it
    db.db.batch_execute("ALTER TABLE orders ADD COLUMN note text").await.expect("add a column");
    db.db
        .execute("INSERT INTO orders (id, customer, amount, note) VALUES (3, 'c3', 1, 'hello')", &[])
        .await
        .expect("insert with the new column");

    // THEN the row arrives with the new column, and the log says the table's columns changed
    let delivered = drain_all(&host).await;
    assert_eq!(ids_of(&delivered), [1, 2, 3]);
    assert_eq!(delivered[2]["Item"]["note"], json!("hello"), "{}", delivered[2]);
    assert!(host.output().contains("columns of public.orders changed"), "{}", host.output());
}

// ---------------------------------------------------------------------------------------------------------------
// The stream: one session per slot, kept across firings
// ---------------------------------------------------------------------------------------------------------------

impl Db {
    /// The server process streaming the slot, if any.
    async fn active_pid(&self) -> Option<i32> {
        self.db
            .query_opt("SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1", &[&self.slot])
            .await
            .expect("read pg_replication_slots")
            .and_then(|r| r.get(0))
    }

    /// Waits until no session streams the slot, or another than `pid` does (at most 30 s).
    async fn released_by(&self, pid: i32) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.active_pid().await == Some(pid) {
            assert!(Instant::now() < deadline, "session {pid} still streams slot {} after 30 s", self.slot);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

#[tokio::test]
async fn when_another_instance_fires_the_function_it_delivers_once_the_first_releases_the_slot_and_nothing_is_lost() {
    // GIVEN instance A streaming the slot, which delivered rows 1-5 and then stops being fired (the host moved
    // the timer to instance B); a stream idle for 4 s is closed
    let db = Db::shared("logical_owner", ORDERS).await;
    let (app, app_name) = logical_app(
        &db,
        "public.orders",
        json!({ "streamIdleReleaseMs": 4000 }),
        &[("Sql_Trigger_LeaseDurationMs", "1000")],
    );
    let a = start(&app).await;
    first_firing(&a).await;
    db.insert(1..=5).await;
    let from_a = drain_all(&a).await;
    assert_eq!(ids_of(&from_a), [1, 2, 3, 4, 5]);
    let a_pid = db.active_pid().await.expect("A streams the slot");
    db.insert(6..=10).await;

    // WHEN B is fired while A's session still holds the slot
    let b = start(&app).await;
    let mut held_firings = 0;
    while db.active_pid().await == Some(a_pid) {
        let run = b.run_timer(FUNCTION).await.expect("timer run");
        assert!(run.succeeded, "a firing that finds the slot held must not fail: {}", failure_text(&b, &run));
        if db.active_pid().await == Some(a_pid) {
            // THEN while A holds the slot, B answers empty (no failure counted against the function)
            assert!(run.applied.get("changes").is_none_or(|m| m.is_empty()), "B delivered while A held the slot");
            held_firings += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(held_firings > 0, "B was never fired while A held the slot");
    // AND says so once, naming the holder, however many firings it took
    let said = b.output().matches("this instance delivers nothing until it is released").count();
    assert_eq!(said, 1, "{}", b.output());
    assert!(b.output().contains("sql-pseudo-trigger"), "the holder's name: {}", b.output());
    // AND A let the slot go because nobody fired it
    assert!(a.output().contains("without a tick"), "{}", a.output());

    // WHEN B fires after A released the slot
    let from_b = drain_all(&b).await;
    // THEN B delivers exactly what A had not: nothing lost, nothing twice
    assert_eq!(ids_of(&from_b), [6, 7, 8, 9, 10]);
    assert_ne!(db.active_pid().await, Some(a_pid));
    // AND status names the session that holds the slot now (B's stream)
    let status = cli(&app, &["state", "status", FUNCTION]).await.expect("status");
    let held_by = find_key(&status, "held_by").unwrap_or_else(|| panic!("no held_by in {status}"));
    assert!(held_by["application_name"].as_str().is_some_and(|n| n.contains("sql-pseudo-trigger")), "{status}");
    assert_eq!(status["pending"], 0, "{status}");
    assert_slot_within_checkpoint(&db, &app_name, "after the hand-over").await;
}

#[tokio::test]
async fn the_streams_session_killed_by_the_server_mid_drain_restarts_and_loses_and_repeats_nothing() {
    // GIVEN batches of 4 and 40 rows in 10 transactions, a first batch delivered
    let db = Db::shared("logical_terminate", ORDERS).await;
    let (app, app_name) = logical_app(&db, "public.orders", json!({ "maxBatchSize": 4 }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    for t in 0..10 {
        db.insert(t * 4 + 1..=t * 4 + 4).await;
    }
    let first = fire_until_delivered(&host, FUNCTION).await;
    assert_eq!(ids_of(&first), [1, 2, 3, 4]);

    // WHEN an operator (or a failover) ends the stream's session on the server, twice during the drain
    let pid = db.active_pid().await.expect("the stream holds the slot");
    db.db.execute("SELECT pg_terminate_backend($1)", &[&pid]).await.expect("terminate");
    // (the firings after it go on from the buffer until the stream notices, then start a new stream)
    let deadline = Instant::now() + Duration::from_secs(10);
    let second = loop {
        run_ok(&host).await;
        match db.active_pid().await {
            Some(p) if p != pid => break p,
            _ => assert!(Instant::now() < deadline, "no new stream within 10 s:\n{}", host.output()),
        }
    };
    db.db.execute("SELECT pg_terminate_backend($1)", &[&second]).await.expect("terminate");
    drain(&host, 30).await;

    // THEN every row arrives exactly once (every batch was answered and acknowledged)
    let all = host.delivered("changes");
    assert_eq!(tally(&all).1, ids(1..=40).into_iter().map(|id| (id, 1)).collect::<BTreeMap<_, _>>());
    assert!(host.output().contains("starting it again"), "{}", host.output());
    assert_slot_within_checkpoint(&db, &app_name, "after the restarts").await;
}

#[tokio::test]
async fn a_retry_naming_a_batch_after_the_stream_was_closed_gets_the_identical_batch_from_a_new_stream() {
    // GIVEN a stream closed 300 ms after its last use, and a batch answered to the host
    let db = Db::shared("logical_retry", ORDERS).await;
    let (app, _) = logical_app(&db, "public.orders", json!({ "streamIdleReleaseMs": 300 }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    db.insert(1..=4).await;
    let mut first = host.invoke(FUNCTION, None).await.expect("invoke");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !first.outputs.contains_key("changes") {
        assert!(Instant::now() < deadline, "nothing answered within 10 s");
        first = host.invoke(FUNCTION, None).await.expect("invoke");
    }
    // WHEN more rows are written, the stream that served the batch goes (its memory with it), and the host
    // retries the batch (its output write failed)
    db.insert(5..=8).await;
    let pid = db.active_pid().await.expect("the stream holds the slot");
    db.released_by(pid).await;
    let retry = host.retry(FUNCTION, 1, &first).await.expect("invoke");

    // THEN the retry carries the identical batch, read by a new stream from the slot's confirmed position
    assert_eq!(retry.outputs["changes"], first.outputs["changes"]);
    assert!(retry.logs.iter().any(|l| l.contains("re-delivering batch 1")), "{:?}", retry.logs);
    let streams = host.output().matches("streaming replication slot").count();
    assert!(streams >= 2, "the retry did not start a new stream: {}", host.output());
    // AND what follows is the rest, once
    let rest = drain_all(&host).await;
    assert_eq!(ids_of(&rest), [5, 6, 7, 8]);
}

#[tokio::test]
async fn a_transaction_larger_than_the_streams_buffer_is_delivered_whole_in_order_and_once() {
    // GIVEN a stream that holds at most 100 changes, and batches of 30
    let db = Db::shared("logical_bigtx", ORDERS).await;
    let (app, app_name) =
        logical_app(&db, "public.orders", json!({ "maxBatchSize": 30, "streamBufferChanges": 100 }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN one transaction writes 450 rows, and another 5 follow
    db.insert(1..=450).await;
    db.insert(451..=455).await;

    // THEN every row arrives once, in order, in batches of 30 at most
    let mut sizes = Vec::new();
    loop {
        let run = run_ok(&host).await;
        let n = run.applied.get("changes").map_or(0, Vec::len);
        if n == 0 {
            break;
        }
        sizes.push(n);
        assert!(sizes.len() < 100, "still delivering after 100 firings: {sizes:?}");
    }
    let delivered = host.delivered("changes");
    assert_eq!(ids_of(&delivered), (1..=455).collect::<Vec<_>>());
    assert!(sizes.iter().all(|n| *n <= 30), "{sizes:?}");
    // AND the checkpoint passed both transactions, and the slot followed it and no further
    let at = checkpoint(&app_name).await;
    assert!(at.get("end").is_some(), "{at}");
    run_ok(&host).await;
    assert_eq!(db.confirmed_flush().await, resume_lsn(&checkpoint(&app_name).await));
}

#[tokio::test]
async fn the_sql_reader_fallback_delivers_every_change_and_moves_the_slot_with_the_checkpoint() {
    // GIVEN a function that reads the slot over SQL (for servers and poolers that refuse replication
    // connections), in batches of 3
    let db = Db::shared("logical_sqlreader", ORDERS).await;
    let (app, app_name) = logical_app(&db, "public.orders", json!({ "reader": "sql", "maxBatchSize": 3 }), &[]);
    let host = start(&app).await;
    first_firing(&host).await;

    // WHEN rows are inserted, updated and deleted
    db.insert(1..=5).await;
    db.db.execute("UPDATE orders SET amount = 2 WHERE id = 2", &[]).await.expect("update");
    db.db.execute("DELETE FROM orders WHERE id = 4", &[]).await.expect("delete");
    let delivered = drain_all(&host).await;

    // THEN every change arrives once, in order, and no stream ever held the slot
    let got: Vec<(i64, i64)> =
        changes(&delivered).iter().map(|(op, item)| (*op, item["id"].as_i64().unwrap_or(-1))).collect();
    assert_eq!(got, [(0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (1, 2), (2, 4)]);
    assert!(!host.output().contains("streaming replication slot"), "{}", host.output());
    assert_eq!(db.active_pid().await, None);
    // AND the slot was advanced to the checkpoint, and no further
    run_ok(&host).await;
    assert_eq!(db.confirmed_flush().await, resume_lsn(&checkpoint(&app_name).await));
}

#[tokio::test]
async fn on_sigterm_the_process_ends_its_stream_and_the_next_process_streams_the_slot_and_loses_nothing() {
    // GIVEN a process streaming the slot, which delivered rows 1-3; rows 4-6 are written after
    let db = Db::shared("logical_sigterm", ORDERS).await;
    let (app, _) = logical_app(&db, "public.orders", json!({}), &[("Sql_Trigger_LeaseDurationMs", "1000")]);
    let first = start(&app).await;
    first_firing(&first).await;
    db.insert(1..=3).await;
    assert_eq!(ids_of(&drain_all(&first).await), [1, 2, 3]);
    let pid = db.active_pid().await.expect("the stream holds the slot");
    db.insert(4..=6).await;

    // WHEN the host stops the process (SIGTERM, as on a scale-in or a deployment)
    let status = first.terminate().await.expect("the handler stops");
    assert!(status.success(), "the handler exited with {status}:\n{}", first.output());

    // THEN the server lets the slot go, and the next process streams it and delivers exactly the rest
    db.released_by(pid).await;
    let next = start(&app).await;
    fire_until_delivered(&next, FUNCTION).await;
    let rest = drain_all(&next).await;
    assert_eq!(ids_of(&rest), [4, 5, 6]);
    assert!(next.output().contains("streaming replication slot"), "{}", next.output());
}

#[tokio::test]
async fn the_stream_logs_in_with_scram_over_tls_as_every_other_connection_of_the_handler() {
    // GIVEN a server with TLS (a self-signed certificate) that lets the function's login in only over TLS with
    // a SCRAM-SHA-256 password, and a login with REPLICATION and a password
    let certs = tempfile::tempdir().expect("a folder for the certificate");
    let made = std::process::Command::new("openssl")
        .current_dir(certs.path())
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-keyout", "server.key", "-out", "server.pem"])
        .output()
        .expect("the openssl CLI runs");
    assert!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
    let read = |name: &str| std::fs::read(certs.path().join(name)).expect("the certificate's files");
    let options = embedded::PostgresOptions::default()
        .file("server.pem", read("server.pem"))
        .file("server.key", read("server.key"))
        .setting("ssl", "on")
        .setting("ssl_cert_file", "server.pem")
        .setting("ssl_key_file", "server.key")
        .file(
            "pg_hba.conf",
            "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhostssl all streamer 127.0.0.1/32 scram-sha-256\n",
        );
    let server = tokio::task::spawn_blocking(move || embedded::EmbeddedPostgres::start_with(options))
        .await
        .expect("join")
        .unwrap_or_else(|e| panic!("a TLS PostgreSQL starts: {e}"));
    let admin = Db::private(&server.url(), "logical_scram", ORDERS).await;
    admin
        .db
        .batch_execute(&format!(
            "CREATE ROLE streamer LOGIN REPLICATION PASSWORD 'se cret'; GRANT SELECT ON orders TO streamer;
             CREATE PUBLICATION {} FOR TABLE orders;",
            admin.slot
        ))
        .await
        .expect("the login and the publication");
    let dbname: String = admin.db.query_one("SELECT current_database()", &[]).await.expect("name").get(0);
    let streamer = Db {
        url: format!(
            "host=localhost hostaddr=127.0.0.1 port={} user=streamer password='se cret' dbname={dbname} sslmode=require",
            server.port()
        ),
        db: embedded::connect(&admin.url).await.expect("admin connection"),
        slot: admin.slot.clone(),
        _guard: SlotGuard { url: admin.url.clone(), slot: admin.slot.clone() },
    };
    let (app, _) =
        logical_app(&streamer, "public.orders", json!({}), &[("Sql_Trigger_PostgresTrustServerCertificate", "true")]);

    // WHEN the function runs and rows are written
    let host = start(&app).await;
    first_firing(&host).await;
    streamer.insert(1..=3).await;

    // THEN they arrive through the stream, and the server sees the stream's session encrypted
    assert_eq!(ids_of(&drain_all(&host).await), [1, 2, 3]);
    let pid = streamer.active_pid().await.expect("the stream holds the slot");
    let ssl: bool =
        admin.db.query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = $1", &[&pid]).await.expect("pg_stat_ssl").get(0);
    assert!(ssl, "the stream's session is not encrypted");
    assert!(!host.output().contains("se cret"), "the password reached the log");
}

#[tokio::test]
async fn an_idle_watched_table_keeps_no_more_than_the_quiet_period_of_wal_while_another_table_writes_200_mb() {
    // GIVEN a private server (its WAL is this test's only), a function on a table that delivered one row and
    // then stays idle, its stream open
    let server = private_postgres().await;
    let db = Db::private(&server.url(), "logical_idle200", ORDERS).await;
    let (app, app_name) = logical_app(&db, "public.orders", json!({}), &[]);
    let host = start(&app).await;
    first_firing(&host).await;
    db.insert([1]).await;
    assert_eq!(ids_of(&drain_all(&host).await), [1]);

    // WHEN another table writes about 200 MB of WAL, and the engine's quiet-advance period passes (the stored
    // progress time is moved back past it), with a CHECKPOINT after the write (a running-transactions record,
    // from which the slot's restart_lsn may move; on PostgreSQL 13-15 nothing else logs one on demand)
    let before = db.wal_lsn().await;
    // In 50 transactions of about 4 MB, as a busy server's other writers would: each is decoded in memory at its
    // commit (under logical_decoding_work_mem), so the figure measures what the slot keeps, not how fast the
    // server spills and re-reads one 200 MB transaction (a transaction larger than the buffer has its own test).
    for first in (1..=200_000).step_by(4000) {
        db.db
            .execute(
                "INSERT INTO other (filler) SELECT string_agg(md5(g::text || '/' || i::text), '')
                 FROM generate_series($1::int4, $1::int4 + 3999) g, generate_series(1, 32) i GROUP BY g",
                &[&first],
            )
            .await
            .expect("write 200 MB elsewhere");
    }
    db.db.batch_execute("CHECKPOINT").await.expect("checkpoint");
    let written = db.wal_lsn().await;
    let mb = (written - before) >> 20;
    assert!(mb >= 200, "only {mb} MB of WAL written");
    age_progress(&app_name, time::Duration::minutes(6)).await;
    // Each firing waits at most streamPollMs for the stream to pass the WAL flushed before it (the server
    // decodes the 200 MB once); the proven stretch is recorded and then acknowledged. The bound is the server's
    // decoding of the 200 MB: generous for a loaded 2-core machine, and a miss prints the handler's last lines
    // to tell a slow server from a stuck stream.
    let deadline = Instant::now() + Duration::from_secs(360);
    let retained = loop {
        run_ok(&host).await;
        let (restart, confirmed): (i64, i64) = {
            let row = db
                .db
                .query_one(
                    "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::int8,
                        pg_wal_lsn_diff($2::text::pg_lsn, confirmed_flush_lsn)::int8
                     FROM pg_replication_slots WHERE slot_name = $1",
                    &[&db.slot, &format!("{:X}/{:X}", written >> 32, written & 0xFFFF_FFFF)],
                )
                .await
                .expect("the slot");
            (row.get(0), row.get(1))
        };
        if confirmed <= 0 && restart < 16 << 20 {
            break restart;
        }
        assert!(
            Instant::now() < deadline,
            "after 360 s the slot still keeps {restart} bytes ({confirmed} bytes before the write's end unconfirmed); the handler's last lines:\n{}",
            host.output().lines().rev().take(40).collect::<Vec<_>>().join("\n")
        );
    };

    // THEN the slot keeps less than 16 MB of the 200 MB (the figure is printed), and never passed the
    // checkpoint
    eprintln!("an idle watched table's slot keeps {retained} bytes of WAL after {mb} MB written elsewhere");
    assert_slot_within_checkpoint(&db, &app_name, "after the quiet advance").await;
    // AND nothing more was delivered
    assert_eq!(ids_of(&host.delivered("changes")), [1]);
}
