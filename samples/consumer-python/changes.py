"""Applying sql-pseudo-trigger's changes idempotently. Standard library only, so `python3 -m unittest` checks it
anywhere; function_app.py wires it to a queue trigger.

Each queue message is one change, {"Operation": 0|1|2, "Item": {...row...}} (Insert, Update, Delete; a
delete's Item holds only the primary key). Delivery is at-least-once, so the same change can arrive twice, and
queue-triggered functions run several messages at once, so a re-delivered older change can arrive after a
newer one. The rules:

- every change is an upsert (or a delete) by key, never a blind insert: a duplicate changes nothing;
- when the row carries a version (PostgreSQL sources: the xid8 cursor column, e.g. `version`, sent as a
  string), a change at or below the version already applied is ignored;
- a delete leaves a tombstone that keeps the newest version seen, so a re-delivered insert or update of that
  version (or older) does not bring the row back; a genuinely new insert has a higher version;
- without a version the last change to arrive wins: duplicates are still harmless, but order between
  different changes of one key is then whatever order the messages were processed in.
"""

import json
import os
import re
import threading
from dataclasses import dataclass
from typing import Any, Callable, Optional

OPERATIONS = {0: "insert", 1: "update", 2: "delete", "insert": "insert", "update": "update", "delete": "delete"}
INTEGER = re.compile(r"^-?\d+$")


class ChangeError(ValueError):
    """A message that can never be applied: raise it so the host retries, then moves it to the poison queue."""


@dataclass(frozen=True)
class Record:
    """What a store keeps per key. A deleted record is a tombstone: item None, the newest version seen."""

    item: Optional[dict]
    version: Optional[int]
    deleted: bool


@dataclass(frozen=True)
class Result:
    outcome: str  # applied, deleted, duplicate (already applied) or stale (older than what is stored)
    key: str
    operation: str
    version: Optional[int]


def _field(obj: dict, name: str) -> Any:
    lower = name.lower()
    return next((v for k, v in obj.items() if k.lower() == lower), None)


def parse_change(message: Any) -> tuple:
    """(operation, item) of a queue message given as text, bytes or an already parsed dict. The host writes
    each message as indented JSON (Newtonsoft's ToString()), which json.loads reads like any other."""
    value = message
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8-sig")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise ChangeError(f'the queue message is not JSON ({e}); expected {{"Operation":0,"Item":{{...}}}}') from None
    if not isinstance(value, dict):
        raise ChangeError('the queue message is not a JSON object; expected {"Operation":0,"Item":{...}}')
    op = _field(value, "Operation")
    name = op.lower() if isinstance(op, str) else op
    # bool is an int in Python: True must not read as Operation 1.
    operation = OPERATIONS.get(name) if isinstance(name, (int, str)) and not isinstance(name, bool) else None
    if operation is None:
        raise ChangeError(f"Operation is {json.dumps(op)}; expected 0 (insert), 1 (update) or 2 (delete)")
    item = _field(value, "Item")
    if not isinstance(item, dict):
        raise ChangeError("Item is missing or not an object; expected the row (or, for a delete, its key)")
    return operation, item


def key_of(item: dict, key_fields: list) -> str:
    """The row's identity: the values of the key fields, as one string."""
    values = []
    for name in key_fields:
        if item.get(name) is None:
            raise ChangeError(
                f"Item has no key field {json.dumps(name)} (it has {', '.join(item)}); "
                "set ORDERS_KEY_FIELDS to the table's primary key columns"
            )
        values.append(item[name])
    return json.dumps(values, separators=(",", ":"))


def version_of(item: dict, version_field: Optional[str]) -> Optional[int]:
    """The row's version as an int, or None when the field is unset or absent (deletes never carry it).
    xid8 values arrive as strings and are compared as integers, never as text."""
    if not version_field:
        return None
    v = item.get(version_field)
    if v is None:
        return None
    if isinstance(v, int) and not isinstance(v, bool):
        return v
    if isinstance(v, str) and INTEGER.match(v.strip()):
        return int(v.strip())
    raise ChangeError(
        f"version field {json.dumps(version_field)} holds {json.dumps(v)}, not an integer (an xid8 or bigint "
        "column); point ORDERS_VERSION_FIELD at one, or set it empty to go without versions"
    )


def decide(existing: Optional[Record], operation: str, item: dict, version: Optional[int]) -> tuple:
    """(outcome, record to store or None) for one change against the stored record of its key."""
    if operation == "delete":
        if existing is not None and existing.deleted:
            return "duplicate", None
        # A delete carries no version: the tombstone keeps the newest one seen, so anything at or below it
        # that is delivered again stays ignored.
        return "deleted", Record(None, existing.version if existing else None, True)
    if existing is not None and version is not None and existing.version is not None:
        if version < existing.version:
            return "stale", None
        if version == existing.version:
            return ("stale" if existing.deleted else "duplicate"), None
    if existing is not None and not existing.deleted and version is None and existing.item == item:
        return "duplicate", None
    return "applied", Record(item, version, False)


class MemoryStore:
    """Rows in memory, for the tests and for trying the sample. `update` is atomic per store (a lock), as a
    real store's must be per key: a transaction, or one guarded statement (see samples/README.md)."""

    def __init__(self):
        self._records = {}
        self._lock = threading.Lock()

    def update(self, key: str, fn: Callable[[Optional[Record]], tuple]) -> str:
        with self._lock:
            outcome, record = fn(self._records.get(key))
            if record is not None:
                self._records[key] = record
            return outcome

    def rows(self) -> list:
        return [r.item for r in self._records.values() if not r.deleted]


@dataclass(frozen=True)
class Options:
    key_fields: tuple = ("id",)
    version_field: Optional[str] = "version"


def options_from_env(env=os.environ) -> Options:
    """ORDERS_KEY_FIELDS (comma-separated, default id), ORDERS_VERSION_FIELD (default version; set it empty
    for a source without a version column)."""
    keys = tuple(k.strip() for k in (env.get("ORDERS_KEY_FIELDS") or "id").split(",") if k.strip())
    version = env.get("ORDERS_VERSION_FIELD")
    return Options(keys, "version" if version is None else version.strip())


def apply_change(store, message: Any, options: Options = Options()) -> Result:
    """Applies one queue message to `store` (anything with `update(key, fn) -> outcome`). Raises ChangeError
    for a message that can never be applied. The result names keys and versions only: log it, never rows."""
    operation, item = parse_change(message)
    key = key_of(item, list(options.key_fields))
    version = None if operation == "delete" else version_of(item, options.version_field)
    outcome = store.update(key, lambda existing: decide(existing, operation, item, version))
    return Result(outcome, key, operation, version)
