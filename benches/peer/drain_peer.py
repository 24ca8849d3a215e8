"""Drains a table with the peer, azure-functions-db 0.8.3, and prints one JSON line of figures.

The peer's own tick (`PollRunner.tick`) over its own source (`SqlAlchemySource`, cursor column + primary key)
and its own state store (`BlobCheckpointStore` on Azurite), on the same database the Rust bench drains. Run by
benches/drain (the `drain` bench) from the venv that scripts/bench makes; by hand:

    target/bench-venv/bin/python benches/peer/drain_peer.py --pg-url postgres://postgres@127.0.0.1:5432/bench \
        --azurite-conn "DefaultEndpointsProtocol=http;...;BlobEndpoint=http://127.0.0.1:10000/devstoreaccount1;" \
        --batch 100 --table public.orders --expected 100000

Its best configuration, on purpose: one tick with an unbounded `max_batches_per_tick`, so the whole drain runs
under one lease. With its default (one batch per tick) a drain is paced by the timer, and its lease cannot be
re-acquired for about 5 s after a release, so ticks closer together do nothing. The timed drain ends when a
fetch returns no rows, which the same tick does before it releases its lease.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from azure.storage.blob import ContainerClient
from azure.core.exceptions import ResourceExistsError

from azure_functions_db import BlobCheckpointStore, SqlAlchemySource
from azure_functions_db.trigger.runner import PollRunner
from azure_functions_db.trigger.normalizers import make_normalizer


def sqlalchemy_url(url: str) -> str:
    """postgres://... (what the Rust side uses) as SQLAlchemy's psycopg 3 URL."""
    for prefix in ("postgresql+psycopg://", "postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise SystemExit(f"--pg-url must start with postgres:// or postgresql://, got {url!r}")


def main() -> int:
    # SQLAlchemy does not know xid8 (our cursor columns, unused by the peer) and says so on every reflection.
    warnings.filterwarnings("ignore", message="Did not recognize type")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-url", required=True, help="postgres://user@host:port/database")
    parser.add_argument("--azurite-conn", required=True, help="Azure Storage connection string (Azurite)")
    parser.add_argument("--batch", type=int, required=True, help="batch_size")
    parser.add_argument("--table", required=True, help="schema.table to poll")
    parser.add_argument("--cursor-column", default="changed_at")
    parser.add_argument("--pk", default="id", help="primary key column(s), comma-separated")
    parser.add_argument("--expected", type=int, default=0, help="rows expected (ids 1..N), for the loss check")
    parser.add_argument("--container", default=None, help="blob container for the peer's state")
    parser.add_argument("--max-batches-per-tick", type=int, default=1_000_000_000)
    args = parser.parse_args()

    schema, _, table = args.table.rpartition(".")
    pk_columns = [c.strip() for c in args.pk.split(",") if c.strip()]
    poller = f"bench-b{args.batch}"
    container_name = args.container or f"peer-bench-b{args.batch}"

    # Every request the peer's state store sends, counted at the transport (GET, PUT, ...).
    blob_requests: list[str] = []

    def count_request(response) -> None:  # azure-core raw_response_hook
        blob_requests.append(response.http_request.method)

    container = ContainerClient.from_connection_string(
        args.azurite_conn, container_name, raw_response_hook=count_request
    )
    try:
        container.create_container()
    except ResourceExistsError:
        pass
    blob_requests.clear()

    source = SqlAlchemySource(
        url=sqlalchemy_url(args.pg_url),
        schema=schema or None,
        table=table,
        cursor_column=args.cursor_column,
        pk_columns=pk_columns,
    )
    store = BlobCheckpointStore(
        container_client=container, source_fingerprint=source.source_descriptor.fingerprint
    )

    ids: list[object] = []
    batches = 0

    def handler(events) -> None:
        nonlocal batches
        batches += 1
        for event in events:
            ids.append(event.pk[pk_columns[0]])

    runner = PollRunner(
        name=poller,
        source=source,
        state_store=store,
        normalizer=make_normalizer(cursor_column=args.cursor_column, pk_columns=pk_columns),
        handler=handler,
        batch_size=args.batch,
        max_batches_per_tick=args.max_batches_per_tick,
    )

    started = time.perf_counter()
    cpu_started = time.process_time()
    ticks = 1
    rows = runner.tick()
    seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started

    unique = set(ids)
    in_range = sum(1 for i in unique if isinstance(i, int) and 1 <= i <= args.expected)
    result = {
        "rows": len(ids),
        "tick_returned": rows,
        "unique": len(unique),
        "duplicates": len(ids) - len(unique),
        "in_range": in_range,
        "min_id": min(unique) if unique else None,
        "max_id": max(unique) if unique else None,
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "ticks": ticks,
        "batches": batches,
        "blob_requests": len(blob_requests),
        "blob_requests_per_batch": len(blob_requests) / batches if batches else None,
        "batch": args.batch,
        "max_batches_per_tick": args.max_batches_per_tick,
        "cursor_column": args.cursor_column,
        "version": _peer_version(),
    }
    source.dispose()
    print(json.dumps(result))
    return 0


def _peer_version() -> str:
    try:
        from importlib.metadata import version

        return version("azure-functions-db")
    except Exception:  # noqa: BLE001 - a version string is informational only
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
