"""Write this folder's store with the release before the re-cut of the attempt (dddd429).

Run with that release first on the path, from this folder:

    git worktree add /tmp/before-recut dddd429
    PYTHONPATH=/tmp/before-recut/src:/tmp/before-recut/plugins python make.py

It leaves one SQLite store (store.db) holding the source state of three routes from one
source (source.db), each run twice, so every key a source state has is there:
- edge: incremental_append on updated_at with a lag and NULL cursors loaded once, by
  region: the state has a definition and an edge record with row digests and NULLs;
- ranges: incremental_append without a cursor, the key cut into ranges;
- refresh: full_refresh with a cursor.
The targets are thrown away: the test reads the store only.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from pathlib import Path

from dpone_native_transfer import (
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)

HERE = Path(__file__).parent
SOURCE, STORE = HERE / "source.db", HERE / "store.db"


def rows(conn: sqlite3.Connection, first: int, last: int) -> None:
    conn.executemany(
        "INSERT INTO orders VALUES (?, ?, ?, ?)",
        [
            (i, ("eu", "us", None)[i % 3], None if i % 7 == 0 else f"2026-01-{1 + i % 20:02d}", i)
            for i in range(first, last + 1)
        ],
    )
    conn.commit()


def routes(target: Path) -> dict[str, dict]:
    return {
        "edge": dict(
            source=SQLiteSource(str(SOURCE), "orders", "region", "updated_at"),
            strategy="incremental_append",
            lag=2,
            on_null_cursor="load_once",
        ),
        "ranges": dict(
            source=SQLiteSource(str(SOURCE), "orders", "id", partition_rows=10),
            strategy="incremental_append",
        ),
        "refresh": dict(
            source=SQLiteSource(str(SOURCE), "orders", "region", "updated_at"),
            strategy="full_refresh",
        ),
    }


for name in ("source.db", "store.db"):
    for extra in ("", "-wal", "-shm"):
        if os.path.exists(HERE / f"{name}{extra}"):
            os.remove(HERE / f"{name}{extra}")
with sqlite3.connect(SOURCE) as conn:
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, region TEXT, updated_at DATE, n)")
    rows(conn, 1, 40)
with tempfile.TemporaryDirectory() as folder, SQLiteCheckpointStore(STORE) as store:
    runtime = TransferRuntime(store)
    for run in (1, 2):
        for name, options in routes(Path(folder)).items():
            sink = SQLiteSink(str(Path(folder) / "target.db"), f"orders_{name}")
            runtime.run(TransferSpec(sink=sink, path="legacy", run_id=f"{name}-{run}", **options))
        with sqlite3.connect(SOURCE) as conn:
            rows(conn, 31 + 10 * run, 40 + 10 * run)
with sqlite3.connect(STORE) as conn:
    conn.execute("PRAGMA journal_mode=DELETE")
