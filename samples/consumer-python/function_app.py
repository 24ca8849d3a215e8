"""The queue-triggered function (Azure Functions Python programming model v2): one message per change that
sql-pseudo-trigger's function wrote to the `orders-changes` queue. The logic is in changes.py; the tests
import that, never this file, so they need no azure-functions package."""

import logging
import os

import azure.functions as func

from changes import ChangeError, apply_change, options_from_env
from sqlite_store import SqliteStore

app = func.FunctionApp()

# SQLite on the instance's local disk so the sample runs as it is; each instance then has its own copy.
# Replace it with your database (samples/README.md: one guarded upsert per change) before relying on it.
store = SqliteStore(os.environ.get("ORDERS_SQLITE_PATH", "/tmp/orders-copy.sqlite3"))
options = options_from_env()


@app.queue_trigger(arg_name="msg", queue_name="orders-changes", connection="AzureWebJobsStorage")
def orders_changes(msg: func.QueueMessage) -> None:
    try:
        r = apply_change(store, msg.get_body(), options)
    except ChangeError as e:
        # Raised, the message is retried and after maxDequeueCount (host.json) moved to orders-changes-poison.
        logging.error("cannot apply message %s: %s", msg.id, e)
        raise
    # Keys and versions only: never row values.
    logging.info("%s %s version %s: %s", r.operation, r.key, r.version if r.version is not None else "-", r.outcome)
