//! What most end-to-end tests share: an `orders` table in a fresh database, an app folder whose one function
//! watches it with state in Azurite, and helpers that turn delivered messages into id sets.

use crate::support::{self, AppFolder};
use serde_json::Value;
use sql_pseudo_trigger::driver::HostDriver;
use sql_pseudo_trigger::embedded;
use std::collections::{BTreeMap, BTreeSet};

pub const FUNCTION: &str = "OrdersChanged";

/// A fresh database with the demo `orders` table (xid8 cursor, insert marker, soft delete).
pub struct Orders {
    pub url: String,
    pub db: tokio_postgres::Client,
}

impl Orders {
    pub async fn new(prefix: &str) -> Self {
        let url = support::fixture().fresh_database(prefix).await;
        Self::on(url).await
    }

    /// The orders table in the database at `url` (created if missing).
    pub async fn on(url: String) -> Self {
        let db = embedded::connect(&url).await.expect("connect to the test database");
        let exists: bool =
            db.query_one("SELECT to_regclass('public.orders') IS NOT NULL", &[]).await.expect("catalog query").get(0);
        if !exists {
            db.batch_execute(sql_pseudo_trigger::demo::ORDERS_SCHEMA).await.expect("create orders");
        }
        Self { url, db }
    }

    /// Inserts `ids` in one transaction.
    pub async fn insert(&self, ids: impl IntoIterator<Item = i64>) {
        let ids: Vec<i64> = ids.into_iter().collect();
        self.db
            .execute(
                "INSERT INTO orders (id, customer, amount) SELECT i, 'c' || i, i * 1.25 FROM unnest($1::bigint[]) AS i",
                &[&ids],
            )
            .await
            .expect("insert orders");
    }

    pub async fn set_amount(&self, id: i64, amount: &str) {
        self.db
            .execute("UPDATE orders SET amount = $2::text::numeric WHERE id = $1", &[&id, &amount])
            .await
            .expect("update order");
    }

    pub async fn soft_delete(&self, id: i64) {
        self.db.execute("UPDATE orders SET deleted = true WHERE id = $1", &[&id]).await.expect("delete order");
    }
}

/// The default `sqltrigger.json` for the orders table, with `extra` keys merged in.
pub fn trigger_json(extra: Value) -> Value {
    let mut base: Value = serde_json::from_str(sql_pseudo_trigger::demo::ORDERS_TRIGGER).expect("demo trigger json");
    if let (Some(base), Some(extra)) = (base.as_object_mut(), extra.as_object()) {
        base.extend(extra.clone());
    }
    base
}

/// A unique state name space, so tests sharing one Azurite never see each other's state.
pub fn unique_app_name(prefix: &str) -> String {
    format!("{prefix}-{}", &uuid::Uuid::new_v4().simple().to_string()[..12])
}

/// An app folder with one function on `orders`, blob state in the shared Azurite.
pub fn orders_app(orders: &Orders, app_name: &str, trigger_extra: Value, settings: &[(&str, &str)]) -> AppFolder {
    let azurite = support::fixture().azurite_connection_string();
    let mut all: Vec<(&str, &str)> = vec![
        ("PostgresConnectionString", orders.url.as_str()),
        ("AzureWebJobsStorage", azurite.as_str()),
        ("Sql_Trigger_StateStore", "blob"),
        ("Sql_Trigger_AppName", app_name),
    ];
    all.extend_from_slice(settings);
    support::write_app(FUNCTION, support::timer_function_json(Some(3)), trigger_json(trigger_extra), &all)
}

/// Starts the handler for `app` and waits for readiness.
pub async fn start(app: &AppFolder) -> HostDriver {
    app.start_handler(&[]).await
}

/// `(operation, id)` of each delivered change message, in order.
pub fn ops(messages: &[Value]) -> Vec<(i64, i64)> {
    messages
        .iter()
        .map(|m| {
            let op = m["Operation"].as_i64().unwrap_or_else(|| panic!("no Operation in {m}"));
            let id = m["Item"]["id"].as_i64().unwrap_or_else(|| panic!("no Item.id in {m}"));
            (op, id)
        })
        .collect()
}

/// The set of ids delivered at least once, and how many times each id was delivered.
pub fn tally(messages: &[Value]) -> (BTreeSet<i64>, BTreeMap<i64, usize>) {
    let mut counts = BTreeMap::new();
    for (_, id) in ops(messages) {
        *counts.entry(id).or_insert(0) += 1;
    }
    (counts.keys().copied().collect(), counts)
}

/// Fires the timer until an invocation applies nothing new, returning how many firings it took.
pub async fn drain(host: &HostDriver, max_firings: usize) -> usize {
    for n in 1..=max_firings {
        let run = host.run_timer(FUNCTION).await.expect("timer run");
        assert!(run.succeeded, "timer run failed: {:?}", run.attempts.last().map(|a| &a.outcome));
        if run.applied.get("changes").is_none_or(|m| m.is_empty()) {
            return n;
        }
    }
    panic!("still delivering after {max_firings} firings");
}

/// Range helper for expected id sets.
pub fn ids(range: std::ops::RangeInclusive<i64>) -> BTreeSet<i64> {
    range.collect()
}

/// Fires the timer until an invocation delivers something, for at most `deadline`, and returns that
/// invocation's messages. The xid8 guard holds rows back while any older transaction of the cluster runs
/// (autovacuum's analyze takes an xid too), so the first firing after a write may legitimately deliver
/// nothing; tests wait for the condition instead of assuming the first firing sees it.
pub async fn fire_until_delivered(host: &HostDriver, function: &str) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let run = host.run_timer(function).await.expect("timer run");
        assert!(run.succeeded, "timer run failed: {:?}", run.attempts.last().map(|a| &a.outcome));
        if let Some(messages) = run.applied.get("changes").filter(|m| !m.is_empty()) {
            return messages.clone();
        }
        assert!(std::time::Instant::now() < deadline, "nothing delivered within 10 s:\n{}", host.output());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
