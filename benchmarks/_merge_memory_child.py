"""Peak memory of one merge run that changes 1% of a DuckDB target (the issue's "flat from
1M to 10M target rows"), dpone's and the floor's: ``python -m benchmarks._merge_memory_child
ROWS FOLDER``.

In FOLDER it builds the merge section's source of ROWS rows and merges it whole into a
DuckDB file (a child process of its own, not measured), copies that file for the floor,
changes 1% of the source as a merge round does, then merges the change in two fresh child
processes and prints the peak RSS (``VmHWM``) and seconds of each as JSON: dpone's guarded
run, and the floor's (the changed rows read by hand, loaded into a temporary table and
merged by DuckDB's own ``MERGE``, as section 11's floor).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path


def _dpone(folder: Path, source: Path) -> int:
    from dpone_native_transfer import (
        DuckDBSink,
        SQLiteCheckpointStore,
        SQLiteSource,
        TransferRuntime,
        TransferSpec,
    )

    from ._common import CHUNK_ROWS

    store = SQLiteCheckpointStore(folder / "checkpoints.db")
    try:
        spec = TransferSpec(
            source=SQLiteSource(source, "orders", "region", "updated_at"),
            sink=DuckDBSink(folder / "target.duckdb", "orders"),
            strategy="merge",
            path="legacy",
            run_id=f"memory-{time.time_ns()}",
            chunk_rows=CHUNK_ROWS,
            deleted_column="is_deleted",
        )
        return TransferRuntime(store).run(spec).rows_loaded
    finally:
        store.close()


def _floor(folder: Path, source: Path, after: int, upto: int) -> int:
    from .merge import _changed_rows, _duckdb_floor

    changed = _changed_rows(source, after, upto)
    _duckdb_floor(folder / "floor.duckdb", changed, table="orders")
    return len(changed)


def _child(argv: list[str]) -> dict:
    from ._memory_child import peak_rss_kib

    started = time.perf_counter()
    folder, source = Path(argv[1]), Path(argv[2])
    if argv[0] == "--dpone":
        rows = _dpone(folder, source)
    else:
        rows = _floor(folder, source, int(argv[3]), int(argv[4]))
    seconds = time.perf_counter() - started
    return {"peak_rss_kib": peak_rss_kib(), "seconds": seconds, "rows": rows}


def measure(rows: int, folder: Path) -> dict:
    """Build, load and change ``rows`` rows in ``folder``; the two merges' peaks."""
    from .merge import _change, _source

    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    source = folder / "source.db"
    shutil.copy(_source(rows), source)
    child = [sys.executable, "-m", "benchmarks._merge_memory_child"]

    def run(*args: object) -> dict:
        done = subprocess.run([*child, *map(str, args)], capture_output=True, text=True)
        if done.returncode:
            raise RuntimeError(f"merge memory child {args[0]}: {done.stderr[-2000:]}")
        return json.loads(done.stdout)

    first = run("--dpone", folder, source)
    shutil.copy(folder / "target.duckdb", folder / "floor.duckdb")
    with contextlib.suppress(FileNotFoundError):
        shutil.copy(folder / "target.duckdb.wal", folder / "floor.duckdb.wal")
    after, upto = _change(source, rows, 1)
    merged = run("--dpone", folder, source)
    floor = run("--floor", folder, source, after, upto)
    return {"target_rows": rows, "first": first, "merge": merged, "floor": floor}


def main(argv: list[str]) -> int:
    if argv[0].startswith("--"):  # a measured child
        print(json.dumps(_child(argv)))
        return 0
    print(json.dumps(measure(int(argv[0]), Path(argv[1]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
