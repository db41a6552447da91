"""Peak memory of one merge run that changes 1% of a target (the issue's "flat from 1M to
10M target rows"): ``python -m benchmarks._merge_memory_child ROWS FOLDER``.

In FOLDER it builds the merge section's source of ROWS rows and merges it whole into a
DuckDB file (a child process of its own, not measured), changes 1% of the source as a
merge round does, then runs that merge in a fresh child process and prints its peak RSS
(``VmHWM``) and seconds as JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path


def _run(folder: Path, source: Path) -> dict:
    from dpone_native_transfer import (
        DuckDBSink,
        SQLiteCheckpointStore,
        SQLiteSource,
        TransferRuntime,
        TransferSpec,
    )

    from ._common import CHUNK_ROWS
    from ._memory_child import peak_rss_kib

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
        started = time.perf_counter()
        result = TransferRuntime(store).run(spec)
        seconds = time.perf_counter() - started
    finally:
        store.close()
    return {"peak_rss_kib": peak_rss_kib(), "seconds": seconds, "rows": result.rows_loaded}


def main(argv: list[str]) -> int:
    if argv[0] == "--run":  # the measured child
        print(json.dumps(_run(Path(argv[1]), Path(argv[2]))))
        return 0
    import shutil

    from .merge import _change, _source

    rows, folder = int(argv[0]), Path(argv[1])
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "source.db"
    shutil.copy(_source(rows), source)
    child = [sys.executable, "-m", "benchmarks._merge_memory_child", "--run"]
    first = subprocess.run([*child, str(folder), str(source)], capture_output=True, text=True)
    _change(source, rows, 1)
    done = subprocess.run([*child, str(folder), str(source)], capture_output=True, text=True)
    if first.returncode or done.returncode:
        raise SystemExit(first.stderr[-2000:] + done.stderr[-2000:])
    print(json.dumps({"target_rows": rows, "first": json.loads(first.stdout),
                      "merge": json.loads(done.stdout)}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
