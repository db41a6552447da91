"""One guarded transfer in a fresh process; prints its peak RSS as JSON (see memory.py).

Usage: python -m benchmarks._memory_child PATH SOURCE_DB WORK_FOLDER ROWS [TARGET]
PATH ``idle`` only imports the runtime and the guard; PATH ``native`` runs the engine's
own copy instead of a transfer (DuckDB or chDB); TARGET is sqlite (default), duckdb or
chdb.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
from pathlib import Path


def peak_rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(argv: list[str]) -> int:
    path, source, folder, rows = argv[0], Path(argv[1]), Path(argv[2]), int(argv[3])
    target = argv[4] if len(argv) > 4 else "sqlite"
    from dpone_native_transfer import (
        ClickHouseSink,
        DuckDBSink,
        SQLiteCheckpointStore,
        SQLiteSink,
        SQLiteSource,
        TransferRuntime,
        TransferSpec,
    )

    sinks = {"sqlite": SQLiteSink, "duckdb": DuckDBSink, "chdb": ClickHouseSink}
    files = {"sqlite": "target.db", "duckdb": "target.duckdb", "chdb": "chdb"}

    importlib.metadata.entry_points(group="dpone_native_transfer")["target_commit_guard"].load()
    seconds = 0.0
    if path == "native":  # the engine's own copy, into a fresh target in ``folder``
        from benchmarks.peers import _chdb_native, _duckdb_native

        seconds = {"duckdb": _duckdb_native, "chdb": _chdb_native}[target](source, rows)
    elif path != "idle":
        with SQLiteCheckpointStore(folder / "checkpoints.db") as store:
            runtime = TransferRuntime(store)
            spec = TransferSpec(
                source=SQLiteSource(source, "orders", "region"),
                sink=sinks[target](folder / files[target], "orders_copy"),
                strategy="incremental_append",
                path=path,
                run_id="bench-memory",
                artifact_dir=str(folder / "artifacts"),
            )
            start = time.perf_counter()
            result = runtime.run(spec)
            seconds = time.perf_counter() - start
        if result.rows_loaded != rows:
            raise SystemExit(f"loaded {result.rows_loaded} rows, expected {rows}")
    print(json.dumps({"vmhwm_kib": peak_rss_kib(), "seconds": seconds}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
