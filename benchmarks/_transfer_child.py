"""One guarded transfer in a process of its own, for the real-schema section.

``python _transfer_child.py SOURCE.db TABLE PARTITION_COLUMN ENGINE PATH FOLDER`` runs a full
refresh of ``TABLE`` into a fresh ``FOLDER`` (``duckdb`` or ``chdb``) with the dpone that
``PYTHONPATH`` names (this checkout's, or another commit's, to compare code in one run), and
prints a JSON line: the seconds ``runtime.run`` took (imports excluded) and the rows loaded.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    source, table, partition, engine, path, folder = sys.argv[1:7]
    from dpone_native_transfer import (
        SQLiteCheckpointStore,
        SQLiteSource,
        TransferRuntime,
        TransferSpec,
    )
    from dpone_native_transfer.connectors.clickhouse import ClickHouseSink
    from dpone_native_transfer.connectors.duckdb import DuckDBSink

    work = Path(folder)
    store = SQLiteCheckpointStore(work / "checkpoints.db")
    sink = (
        DuckDBSink(work / "target.duckdb", "copy")
        if engine == "duckdb"
        else ClickHouseSink(work / "chdb", "copy")
    )
    spec = TransferSpec(
        source=SQLiteSource(Path(source), table, partition),
        sink=sink,
        strategy="full_refresh",
        path=path,
        run_id="bench-run",
        chunk_rows=10_000,
    )
    try:
        start = time.perf_counter()
        result = TransferRuntime(store).run(spec)
        seconds = time.perf_counter() - start
    finally:
        store.close()
    print(json.dumps({"seconds": seconds, "rows": result.rows_loaded}))


if __name__ == "__main__":
    main()
