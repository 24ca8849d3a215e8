//! Backfill through the real binary under the host model (deferred delivery): `startFrom: snapshot` on the
//! orders table, with writes while it runs (docs/operations.md, "Backfill"). Crashes during a backfill:
//! backfill_crashes.rs.

use crate::common::*;
use crate::operations::handler_cli;
use crate::runner::Runner;
use serde_json::{json, Value};
use sql_pseudo_trigger::engine::document::{BackfillState, StateDoc};
use sql_pseudo_trigger::source::Position;
use sql_pseudo_trigger::state::{Etag, StateStore};
use std::collections::BTreeMap;
use std::time::Duration;

/// The consumer's view after applying every message in order, idempotently (upsert by id, delete by id).
pub(crate) fn view(messages: &[Value]) -> BTreeMap<i64, f64> {
    let mut view = BTreeMap::new();
    for m in messages {
        let id = m["Item"]["id"].as_i64().expect("an id");
        match m["Operation"].as_i64() {
            Some(2) => {
                view.remove(&id);
            }
            _ => {
                view.insert(id, m["Item"]["amount"].as_f64().expect("an amount"));
            }
        }
    }
    view
}

#[tokio::test]
async fn start_from_snapshot_backfills_the_rows_that_exist_beside_live_changes_and_the_consumer_ends_equal_to_the_table(
) {
    // GIVEN ten rows before the function first runs, backfilled in chunks of three
    let orders = Orders::new("backfill").await;
    orders.insert(1..=10).await;
    let app_name = unique_app_name("backfill");
    let app = orders_app(&orders, &app_name, json!({"startFrom": "snapshot", "maxBatchSize": 3}), &[]);
    let host = start(&app).await;
    fire_until_delivered(&host, FUNCTION).await;

    // WHEN rows are updated, inserted and soft-deleted while the backfill runs
    orders.set_amount(8, "99.5").await;
    orders.insert([11]).await;
    orders.soft_delete(9).await;
    orders.set_amount(1, "7.25").await;
    drain(&host, 40).await;
    // (the guard may hold the last writes back a firing or two)
    for _ in 0..5 {
        drain(&host, 40).await;
    }

    // THEN the consumer's view equals the table
    let messages = host.delivered("changes");
    let rows = orders
        .db
        .query("SELECT id, amount::float8 FROM orders WHERE deleted IS NOT TRUE ORDER BY id", &[])
        .await
        .expect("read the table");
    let table: BTreeMap<i64, f64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(view(&messages), table, "{messages:#?}");
    // AND every backfilled row says so, as an insert; no backfilled row comes after a live change of its id
    let backfilled = |m: &Value| m.get("Metadata").and_then(|md| md.get("Backfill")).is_some();
    let mut live_seen = std::collections::BTreeSet::new();
    let mut backfilled_ids = Vec::new();
    for m in &messages {
        let id = m["Item"]["id"].as_i64().expect("an id");
        if backfilled(m) {
            assert_eq!(m["Operation"], 0, "{m}");
            assert!(!live_seen.contains(&id), "backfilled row {id} after a live change of it: {messages:#?}");
            backfilled_ids.push(id);
        } else {
            live_seen.insert(id);
        }
    }
    assert!(!backfilled_ids.is_empty(), "nothing was backfilled: {messages:#?}");
    assert!(backfilled_ids.windows(2).all(|w| w[0] < w[1]), "chunks walk the key in order: {backfilled_ids:?}");
    assert!(backfilled_ids.iter().all(|id| (1..=10).contains(id)), "{backfilled_ids:?}");
    // AND the backfill is done, at the last key it delivered
    let (doc, _) = load_state(&shared_blob_store(), &app_name).await.expect("a state document");
    let b = doc.backfill().expect("a backfill");
    assert_eq!(b.state, BackfillState::Done, "{b:?}");
    assert_eq!(b.after, json!([backfilled_ids.last().expect("one").to_string()]), "{b:?}");
    assert_eq!(b.rows, backfilled_ids.len() as u64, "{b:?}");
}

/// An operator's `--where` compares in the column's type family as written: `amount > 10.555` on a
/// `numeric(12, 2)` column takes 10.56 (cast with the column's modifier, the literal would round to 10.56 and
/// leave it out).
#[tokio::test]
async fn a_filtered_backfill_compares_a_decimal_literal_as_written_not_rounded_to_the_columns_scale() {
    // GIVEN three orders of 10.55, 10.56 and 10.60 written before a function that starts from now
    let orders = Orders::new("backfill_where").await;
    orders.insert(1..=3).await;
    for (id, amount) in [(1, "10.55"), (2, "10.56"), (3, "10.60")] {
        orders.set_amount(id, amount).await;
    }
    let app_name = unique_app_name("backfill-where");
    let app = orders_app(&orders, &app_name, json!({"startFrom": "now"}), &[]);
    let host = start(&app).await;
    drain(&host, 5).await;
    assert!(host.delivered("changes").is_empty(), "startFrom now delivers no existing row");

    // WHEN an operator backfills the orders above 10.555
    let args = ["state", "backfill", FUNCTION, "--where", "amount > 10.555"].map(String::from);
    let output = crate::operations::handler_cli(app.root(), &args).await;
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    drain(&host, 10).await;

    // THEN orders 2 and 3 are backfilled, and 1 is not
    let messages = host.delivered("changes");
    assert_eq!(ids_of(&messages), [2, 3], "{messages:#?}");
    assert!(messages.iter().all(|m| m.pointer("/Metadata/Backfill").is_some()), "{messages:#?}");
}

/// Under `handler run` a running backfill is a backlog: after a tick that delivered a live batch smaller than
/// `maxBatchSize`, the next tick comes at once instead of after the polling interval. Otherwise a trickle of
/// writes (every tick finds a few live changes, and chunks get the ticks that find none, or one in five) holds
/// the backfill to about one chunk per polling interval: with the default second, a million rows in chunks of
/// 1000 would take most of an hour however few the writes. Here the polling interval is a minute, so a
/// backfill of 30 chunks done within 30 s shows the loop did not wait it between them.
#[tokio::test]
async fn under_handler_run_a_trickle_of_live_changes_does_not_hold_a_backfill_to_the_polling_interval() {
    // GIVEN 300 orders, `handler run` with `startFrom: snapshot` in chunks of 10 and a polling interval of a
    // minute, and a writer inserting an order every 5 ms
    let orders = Orders::new("backfill_pace").await;
    orders.insert(1..=300).await;
    let app_name = unique_app_name("backfill-pace");
    let trigger = json!({"startFrom": "snapshot", "maxBatchSize": 10, "pollingIntervalMs": 60000});
    let app = orders_app(&orders, &app_name, trigger, &[]);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn({
        let url = orders.url.clone();
        async move {
            let db = testbed::embedded::connect(&url).await.expect("the writer connects");
            let mut id = 1_000i64;
            while !*stopped.borrow() {
                db.execute("INSERT INTO orders (id, customer, amount) VALUES ($1, 'live', 1)", &[&id])
                    .await
                    .expect("insert");
                id += 1;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        }
    });

    // WHEN `handler run` runs
    let runner = crate::runner::Runner::start(&app, &[]);

    // THEN the backfill is done within 30 s, half one polling interval
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let b = load_state(&shared_blob_store(), &app_name).await.and_then(|(doc, _)| doc.backfill().cloned());
        if b.as_ref().is_some_and(|b| b.state == BackfillState::Done) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the backfill is not done 30 s in: {b:?}\n{}", runner.stderr());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    stop.send(true).expect("the writer listens");
    writer.await.expect("the writer");
}

#[tokio::test]
async fn a_backfill_position_of_a_time_key_written_in_another_date_style_is_refused_naming_it_and_the_fix() {
    // GIVEN orders keyed by (placed_at, id), drained once by `handler run --once`, then a backfill started
    let url = crate::support::fixture().fresh_database("backfill_datestyle").await;
    let db = testbed::embedded::connect(&url).await.expect("connect");
    let schema = testbed::demo::ORDERS_SCHEMA.replace("id bigint PRIMARY KEY,", "id bigint NOT NULL,");
    db.batch_execute(&format!("{schema}\nALTER TABLE public.orders ADD PRIMARY KEY (placed_at, id);"))
        .await
        .expect("create orders keyed by a timestamptz");
    let orders = Orders::on(url).await;
    orders.insert(1..=3).await;
    let app_name = unique_app_name("backfill-datestyle");
    let app = orders_app(&orders, &app_name, json!({ "maxBatchSize": 2 }), &[]);
    let mut once = Runner::start(&app, &["--once"]);
    let exited = once.exit(Duration::from_secs(60)).await;
    assert!(exited.success(), "handler run --once failed ({exited}):\n{}", once.stderr());
    let args: Vec<String> = ["state", "backfill", FUNCTION].iter().map(|a| a.to_string()).collect();
    let started = handler_cli(app.root(), &args).await;
    assert!(started.status.success(), "{}", String::from_utf8_lossy(&started.stderr));

    // WHEN its stored key position holds a time as an earlier handler wrote it under DateStyle `SQL, DMY`
    let store = shared_blob_store();
    let (doc, etag) = state(&store, &app_name).await;
    let stale = Position::Array(vec![Position::String("02/01/2024 03:04:05 UTC".into()), Position::String("1".into())]);
    let mut json = serde_json::to_value(&doc).expect("state serializes");
    *json.pointer_mut("/backfill/after").expect("a backfill") = stale.clone();
    let doc: StateDoc = serde_json::from_value(json).expect("the edited state reads back");
    let bytes = serde_json::to_vec(&doc).expect("state serializes");
    store.save_if(&state_key(&app_name), &bytes, Some(&Etag(etag))).await.expect("rewrite the state");
    let mut again = Runner::start(&app, &["--once"]);
    let exited = again.exit(Duration::from_secs(60)).await;

    // THEN the drain fails naming the value, its type and the fix, and the backfill did not move (nothing read
    // from a position that would mean February the 1st, or January the 2nd, depending on who reads it)
    let stderr = again.stderr();
    assert!(!exited.success(), "a drain over a misread position exited 0:\n{stderr}");
    assert!(
        stderr.contains(r#"the stored backfill position of public.orders holds the timestamp with time zone "02/01/2024 03:04:05 UTC""#)
            && stderr.contains("handler state backfill <function> --cancel"),
        "{stderr}"
    );
    let backfill = state(&store, &app_name).await.0.backfill().cloned().expect("a backfill");
    assert_eq!((backfill.after, backfill.rows, backfill.chunks), (stale, 0, 0));
}

/// Runs `handler args` once and fails the test unless it succeeds at the first attempt.
async fn operator(app: &crate::support::AppFolder, args: &[&str]) -> Value {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let output = crate::operations::handler_cli(app.root(), &args).await;
    assert!(output.status.success(), "handler {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

/// The state of the function's backfill in `app_name`, once it is `want` (at most 60 s).
async fn backfill_until(app_name: &str, want: impl Fn(&sql_pseudo_trigger::engine::document::Backfill) -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let b = load_state(&shared_blob_store(), app_name).await.and_then(|(doc, _)| doc.backfill().cloned());
        if b.as_ref().is_some_and(&want) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "the backfill did not get there within 60 s: {b:?}");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Under `handler run` a tick writes the state several times a second, so an operator's write usually meets
/// one: the command applies itself again to what it reads (src/engine/operate/retry.rs), and a tick whose
/// acknowledgement meets the operator's write acknowledges on top of it (src/engine/sink_tick/reapply.rs)
/// instead of sending the chunk again.
#[tokio::test]
async fn backfill_pause_resume_cancel_and_a_filtered_start_under_fast_ticks_each_succeed_first_time_and_resend_no_chunk(
) {
    // GIVEN 10000 orders and `handler run` backfilling them (`startFrom: snapshot`) into a webhook in chunks of
    // 10, polling every 10 ms, the webhook taking 10 ms per request
    let orders = Orders::new("backfill_ops").await;
    orders.insert(1..=10000).await;
    let app_name = unique_app_name("backfill-ops");
    let hook = crate::runner::Webhook::start(crate::runner::Behaviour {
        delay: std::time::Duration::from_millis(10),
        ..Default::default()
    })
    .await;
    let trigger =
        json!({ "startFrom": "snapshot", "maxBatchSize": 10, "sink": crate::runner::webhook_sink(&hook.url) });
    let app = crate::runner::runner_app(&orders, &app_name, trigger, &[]);
    let runner = crate::runner::Runner::start(&app, &[]);
    backfill_until(&app_name, |b| b.chunks >= 3).await;

    // WHEN an operator pauses and resumes the backfill eight times, cancels it, and starts a filtered one, each
    // command run once while the ticks go on
    for _ in 0..8 {
        let paused = operator(&app, &["state", "backfill", FUNCTION, "--pause"]).await;
        assert_eq!(paused["backfill"]["state"], "paused", "{paused}");
        let resumed = operator(&app, &["state", "backfill", FUNCTION, "--resume"]).await;
        assert_eq!(resumed["backfill"]["state"], "running", "{resumed}");
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    }
    let cancelled = operator(&app, &["state", "backfill", FUNCTION, "--cancel"]).await;
    assert_eq!(cancelled["backfill"]["state"], "cancelled", "{cancelled}");
    let first = cancelled["backfill"]["id"].clone();
    let started = operator(&app, &["state", "backfill", FUNCTION, "--where", "id > 9900"]).await;
    let second = started["backfill"]["id"].clone();
    assert_ne!(first, second);
    backfill_until(&app_name, |b| b.state == BackfillState::Done).await;
    // (the last chunk's acknowledgement is what ends it: every request has been answered by now)

    // THEN no chunk went out twice: every Idempotency-Key is unique, and no chunk counts as redone
    let received = hook.received();
    let keys: std::collections::BTreeSet<&str> = received.iter().map(|r| r.idempotency_key.as_str()).collect();
    assert_eq!(keys.len(), received.len(), "a chunk was sent again\n{}", runner.stderr());
    assert!(received.iter().all(|r| r.status == 200));
    let (doc, _) = load_state(&shared_blob_store(), &app_name).await.expect("a state document");
    assert_eq!(doc.backfill().map(|b| b.redone), Some(0), "{:?}", doc.backfill());
    // AND the first backfill delivered a prefix of the keys, each once, and the second exactly orders 9901-10000
    let rows_of = |id: &Value| -> Vec<i64> {
        received.iter().filter(|r| r.backfill.get("Id") == Some(id)).flat_map(|r| r.ids.clone()).collect()
    };
    let prefix = rows_of(&first);
    assert!(!prefix.is_empty() && prefix.len() < 9900, "{} rows", prefix.len());
    assert_eq!(prefix, (1..=prefix.len() as i64).collect::<Vec<_>>());
    assert_eq!(rows_of(&second), (9901..=10000).collect::<Vec<_>>());
}
