"""Upserts rows into a PostgreSQL table with the peer, azure-functions-db 0.8.3, and prints one JSON line.

The peer's output binding, `DbWriter.upsert_many(rows=..., conflict_columns=[...])`, one call per batch (each
call is one transaction of one INSERT ... ON CONFLICT statement per row). Run by benches/upsert.rs (the
`upsert` bench) from the venv that scripts/bench makes; by hand:

    target/bench-venv/bin/python benches/peer/upsert_peer.py --pg-url postgres://postgres@127.0.0.1:5432/bench \
        --source public.orders --target public.orders_copy --batch 1000

Its best case, on purpose: the rows are read from the source before the clock starts, so only the writes are
timed (ours is timed end to end, fetch from the source included).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from sqlalchemy import create_engine, text

from azure_functions_db import DbWriter


def sqlalchemy_url(url: str) -> str:
    """postgres://... (what the Rust side uses) as SQLAlchemy's psycopg 3 URL."""
    for prefix in ("postgresql+psycopg://", "postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    raise SystemExit(f"--pg-url must start with postgres:// or postgresql://, got {url!r}")


def main() -> int:
    warnings.filterwarnings("ignore", message="Did not recognize type")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pg-url", required=True)
    parser.add_argument("--source", required=True, help="schema.table to read id, customer, amount from")
    parser.add_argument("--target", required=True, help="schema.table to upsert into")
    parser.add_argument("--batch", type=int, required=True, help="rows per upsert_many call")
    args = parser.parse_args()

    url = sqlalchemy_url(args.pg_url)
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(text(f"SELECT id, customer, amount FROM {args.source} ORDER BY id"))]
    engine.dispose()

    schema, _, table = args.target.rpartition(".")
    writer = DbWriter(url=url, table=table, schema=schema or None)
    started = time.perf_counter()
    calls = 0
    for i in range(0, len(rows), args.batch):
        writer.upsert_many(rows=rows[i : i + args.batch], conflict_columns=["id"])
        calls += 1
    seconds = time.perf_counter() - started
    writer.close()
    print(json.dumps({"rows": len(rows), "seconds": seconds, "calls": calls, "batch": args.batch, "version": _version()}))
    return 0


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("azure-functions-db")
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
