"""The small real route the tests run on: SQLite source and target files, a real store."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from dpone_native_transfer import (
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.testing import FaultyStore, RecordingSink, StepClock, build_sample_source

PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")


class Route:
    """One route on real files: source table -> target table, with a real checkpoint store."""

    def __init__(self, tmp: Path, *, rows: int = 120, partitions: int = 4) -> None:
        self.tmp = tmp
        self.source_path = tmp / "source.db"
        build_sample_source(self.source_path, rows=rows, partitions=partitions)
        self.source = SQLiteSource(str(self.source_path), "orders", "region", "updated_at")
        self.sink = RecordingSink(SQLiteSink(str(tmp / "target.db"), "orders_copy"))
        self.real_store = SQLiteCheckpointStore(str(tmp / "checkpoints.db"))
        self.store = FaultyStore(self.real_store)
        self.clock = StepClock()

    def runtime(self, **kwargs) -> TransferRuntime:
        kwargs.setdefault("clock", self.clock)
        return TransferRuntime(self.store, **kwargs)

    def spec(self, path: str, run_id: str = "run-1", **kwargs) -> TransferSpec:
        kwargs.setdefault("strategy", "incremental_append")
        kwargs.setdefault("chunk_rows", 16)
        return TransferSpec(source=self.source, sink=self.sink, path=path, run_id=run_id, **kwargs)

    def latest(self):
        return self.real_store.list_latest(self.spec("legacy").route)

    def target_ids(self) -> list[int]:
        return sorted(row[0] for row in self.sink.inner.rows())

    def source_ids(self) -> list[int]:
        with sqlite3.connect(self.source_path) as connection:
            ids = sorted(row[0] for row in connection.execute("SELECT id FROM orders"))
        connection.close()
        return ids
