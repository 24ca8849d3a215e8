//! The output mapping (`outputs` in sqltrigger.json): which binding receives changes, rows or the whole batch,
//! as the host writes them, and deletes a rows binding cannot take reported rather than dropped silently.

use crate::common::*;
use crate::support;
use serde_json::json;

#[tokio::test]
async fn each_binding_receives_its_shape_and_unsent_deletes_are_reported_once_per_batch() {
    // GIVEN a function with three queue outputs: the changes (default), the whole batch as one message, and rows
    let orders = Orders::new("outputs").await;
    let app_name = unique_app_name("outputs");
    let mut function = support::timer_function_json(Some(3));
    function["bindings"].as_array_mut().expect("bindings").extend([
        json!({ "type": "queue", "direction": "out", "name": "audit", "queueName": "audit", "connection": "AzureWebJobsStorage" }),
        json!({ "type": "queue", "direction": "out", "name": "rows", "queueName": "rows", "connection": "AzureWebJobsStorage" }),
    ]);
    let trigger = trigger_json(json!({
        "columns": ["id", "customer"],
        "outputs": { "audit": { "shape": "batch" }, "rows": { "shape": "rows" } }
    }));
    let azurite = support::fixture().azurite_connection_string();
    let app = support::write_app(
        FUNCTION,
        function,
        trigger,
        &[
            ("PostgresConnectionString", orders.url.as_str()),
            ("AzureWebJobsStorage", azurite.as_str()),
            ("Sql_Trigger_StateStore", "blob"),
            ("Sql_Trigger_AppName", app_name.as_str()),
        ],
    );
    let host = start(&app).await;
    orders.insert(1..=2).await;
    fire_until_delivered(&host, FUNCTION).await;

    // WHEN order 1 changes and order 2 is deleted
    orders.db.execute("UPDATE orders SET customer = 'renamed' WHERE id = 1", &[]).await.expect("update");
    orders.soft_delete(2).await;
    let changes = fire_until_delivered(&host, FUNCTION).await;

    // THEN `changes` got one message per change, `audit` one message per batch, `rows` the rows without the delete
    assert_eq!(ops(&changes), vec![(1, 1), (2, 2)]);
    let audit = host.delivered("audit");
    assert_eq!(audit.len(), 2, "one message per batch: {audit:?}");
    assert_eq!(audit[1], json!({ "changes": changes }));
    let rows = host.delivered("rows");
    assert_eq!(
        rows,
        vec![
            json!({"id": 1, "customer": "c1"}),
            json!({"id": 2, "customer": "c2"}),
            json!({"id": 1, "customer": "renamed"})
        ]
    );
    // AND the invocation's logs said so once, naming the binding
    let last = host.invoke(FUNCTION, None).await.expect("invoke");
    assert!(last.outputs.is_empty());
    let output = host.output();
    assert_eq!(output.matches("1 delete(s) not sent to output binding \"rows\"").count(), 1, "{output}");
}
