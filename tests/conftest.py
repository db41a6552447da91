"""Real parts for every test: SQLite source and target files, a SQLite checkpoint store,
wrapped only where a test injects a fault."""

from __future__ import annotations

import contextlib
import io
import os
import sqlite3
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path

import postgres_server
import pytest

from dpone_native_transfer import (
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.testing import FaultyStore, RecordingSink, StepClock, build_sample_source

pytest_plugins = ["pytester"]

PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")


def run_cli(*args: object, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
    """``dpone-transfer ARGS`` in this process (so coverage measures it), with ``env`` added to
    the environment for the call; returns what a subprocess run would."""
    from dpone_native_transfer import cli

    out, err = io.StringIO(), io.StringIO()
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli.main([str(arg) for arg in args])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


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


@pytest.fixture
def route(tmp_path):
    made = Route(tmp_path)
    yield made
    made.real_store.close()


@pytest.fixture(params=PATHS)
def path(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A PostgreSQL server for the session: DPONE_TEST_POSTGRES_DSN, or a throwaway one.

    Started only when a test asks for it; fails (never skips) when there is none.
    """
    with postgres_server.server_dsn() as dsn:
        yield dsn


@pytest.fixture
def postgres_schema(postgres_dsn: str) -> Iterator[postgres_server.PostgresLocation]:
    """The server and a schema of this test's own, dropped after the test."""
    with postgres_server.isolated_schema(postgres_dsn) as location:
        yield location
