"""The idempotent store on SQLite (in Python's standard library), so the sample keeps its rows across
restarts of one instance. One table: the row as JSON beside its key, version and tombstone flag.

Why a transaction per change (BEGIN IMMEDIATE): several messages are processed at once, and the version
check and the write must see the same row. For PostgreSQL or SQL Server, do the same in one guarded
statement instead (samples/README.md). Versions are kept as decimal text and compared in Python: xid8
values can exceed SQLite's signed 64-bit integers.
"""

import json
import sqlite3
import threading
from typing import Callable, Optional

from changes import Record

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders_copy (
    key TEXT PRIMARY KEY,      -- JSON array of the key fields' values
    item TEXT,                 -- the row as JSON; NULL for a tombstone
    version TEXT,              -- decimal integer, or NULL without versions
    deleted INTEGER NOT NULL   -- 1: a tombstone
)
"""


class SqliteStore:
    def __init__(self, path: str):
        # isolation_level=None: transactions are explicit below, not opened behind our back.
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        self._db.execute(SCHEMA)
        self._lock = threading.Lock()  # one connection, shared by the worker's threads

    def update(self, key: str, fn: Callable[[Optional[Record]], tuple]) -> str:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT item, version, deleted FROM orders_copy WHERE key = ?", (key,)
                ).fetchone()
                existing = None
                if row is not None:
                    item, version, deleted = row
                    existing = Record(
                        json.loads(item) if item is not None else None,
                        int(version) if version is not None else None,
                        bool(deleted),
                    )
                outcome, record = fn(existing)
                if record is not None:
                    self._db.execute(
                        "INSERT INTO orders_copy (key, item, version, deleted) VALUES (?, ?, ?, ?) "
                        "ON CONFLICT (key) DO UPDATE SET item = excluded.item, version = excluded.version, "
                        "deleted = excluded.deleted",
                        (
                            key,
                            json.dumps(record.item) if record.item is not None else None,
                            str(record.version) if record.version is not None else None,
                            int(record.deleted),
                        ),
                    )
                self._db.execute("COMMIT")
                return outcome
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def rows(self) -> list:
        with self._lock:
            return [json.loads(i) for (i,) in self._db.execute("SELECT item FROM orders_copy WHERE deleted = 0 ORDER BY key")]

    def close(self) -> None:
        self._db.close()
