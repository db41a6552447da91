"""A DuckDB target opened once per run, shared by the tables of a pipeline (issue 48).

Real DuckDB files throughout; the only wrapper counts the real driver's ``connect`` calls.
A run keeps one database per target file open (``drivers.holding_connections``) and each
call takes a cursor of it, so a pipeline's tables of one file run at once in threads
without DuckDB refusing a second configuration, and their writes take turns so that none
races another to create the file's shared tables.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers.pipelines import build_tables, duckdb_ids, sqlite_ids, write_pipeline

from dpone_native_transfer import SQLiteCheckpointStore, TransferRuntime
from dpone_native_transfer.application import transfer
from dpone_native_transfer.connectors.duckdb import DuckDBSink
from dpone_native_transfer.drivers import holding_connections
from dpone_native_transfer.pipeline import load_pipeline
from dpone_native_transfer.pipeline_run import run_tables

TABLES, ROWS = 6, 300


@pytest.fixture
def opens(monkeypatch) -> dict[str, int]:
    """How many times the real ``duckdb.connect`` opened each file (by its path)."""
    counted: dict[str, int] = {}
    real = duckdb.connect

    def counting(database: Any = ":memory:", *args: Any, **kwargs: Any) -> Any:
        counted[str(database)] = counted.get(str(database), 0) + 1
        return real(database, *args, **kwargs)

    monkeypatch.setattr(duckdb, "connect", counting)
    return counted


def _pipeline(tmp_path: Path, path: str) -> tuple[Path, Path, Path]:
    source, target = tmp_path / "shop.db", tmp_path / "warehouse.duckdb"
    build_tables(source, TABLES, ROWS)
    file = write_pipeline(
        tmp_path / "pipeline.toml",
        source={"path": str(source)},
        target={"kind": "duckdb", "path": str(target)},
        store=str(tmp_path / "checkpoints.db"),
        tables="t*",
        defaults={"strategy": "full_refresh", "path": path},
    )
    return file, source, target


@pytest.mark.parametrize("path", ["lazy-plan", "staged"])
def test_a_pipeline_opens_its_duckdb_file_once_for_all_its_tables(tmp_path, opens, path):
    file, source, target = _pipeline(tmp_path, path)
    result = run_tables(load_pipeline(file).tables, "run-once", jobs=2)
    assert result.exit_code == 0 and result.jobs == 2
    assert opens[str(target)] == 1
    for run in result.tables:  # closed after the run: another configuration opens it
        assert duckdb_ids(target, run.target_table) == sqlite_ids(source, run.table)


def test_a_route_opens_its_duckdb_file_once(tmp_path, opens):
    file, _, target = _pipeline(tmp_path, "lazy-plan")
    table = load_pipeline(file).tables[0]
    transfer(table.config, "run-first")  # creates the file, its ledger and fence
    opens.clear()
    result, _ = transfer(table.config, "run-again")
    assert result.rows_loaded == ROWS and opens[str(target)] == 1
    duckdb.connect(str(target), read_only=True).close()  # released after the route


@pytest.mark.parametrize("path", ["legacy", "lazy-plan"])
def test_a_library_run_opens_its_duckdb_file_once(tmp_path, opens, path):
    """``TransferRuntime.run`` itself holds the file (``DuckDBSink.holding_connection``), not
    only the command line's run: it opened it once per call (seven times for legacy)."""
    file, source, target = _pipeline(tmp_path, path)
    config = load_pipeline(file).tables[0].config
    store = SQLiteCheckpointStore(tmp_path / "library.db")
    try:
        for run_id in ("run-first", "run-again"):
            opens.clear()
            TransferRuntime(store).run(config.spec(run_id))
            assert opens[str(target)] == 1, run_id
    finally:
        store.close()
    assert duckdb_ids(target, config.sink.table) == sqlite_ids(source, config.source.table)
    duckdb.connect(str(target), read_only=True).close()  # released after the run


def test_two_routes_of_one_duckdb_file_run_at_once_in_threads(tmp_path):
    """Each run holds the file open; the second configuration DuckDB refuses never occurs
    (a lazy plan's connection loads the scanner, a read's does not)."""
    file, source, target = _pipeline(tmp_path, "lazy-plan")
    tables = load_pipeline(file).tables[:2]
    staged = load_pipeline(file).tables[2]
    results: dict[str, Any] = {}
    start = threading.Barrier(3)

    def run(table: Any) -> None:
        start.wait()
        try:
            results[table.name] = transfer(table.config, f"run-{table.name}")[0].rows_loaded
        except Exception as error:
            results[table.name] = type(error).__name__

    threads = [threading.Thread(target=run, args=(t,)) for t in [*tables, staged]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {t.name: ROWS for t in [*tables, staged]}
    for table in [*tables, staged]:
        assert duckdb_ids(target, table.name) == sqlite_ids(source, table.name)


def test_tables_of_one_duckdb_file_create_its_fence_at_once(tmp_path):
    """Four tables of a fresh file raise their fences at the same moment, five times over:
    without their writes taking turns, DuckDB fails all but one of the transactions that
    create ``_dpone_fence`` (a conflict at commit)."""
    for trial in range(5):
        path = tmp_path / f"w{trial}.duckdb"
        raised = _fences_at_once(path, 4)
        assert raised == {n: n + 1 for n in range(4)}
        assert [DuckDBSink(path, f"t{n}").fence_epoch() for n in range(4)] == [1, 2, 3, 4]


def _fences_at_once(path: Path, tables: int) -> dict[int, Any]:
    """Table n raises its fence to n + 1, all at the same moment, in threads of one run."""
    start, raised = threading.Barrier(tables), {}

    def fence(n: int) -> None:
        sink = DuckDBSink(path, f"t{n}")
        start.wait()
        try:
            raised[n] = sink.advance_fence(n + 1)
        except Exception as error:
            raised[n] = type(error).__name__

    with holding_connections():
        threads = [threading.Thread(target=fence, args=(n,)) for n in range(tables)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return raised


ROUTE_HELD = """\
[source]
path = "{source}"
table = "t"
partition_column = "p"
cursor_column = "id"
[target]
kind = "duckdb"
path = "{target}"
table = "t"
[transfer]
strategy = "incremental_append"
path = "staged"
[store]
path = "{store}"
lease_seconds = 1
"""


def test_a_worker_stopped_holding_its_duckdb_file_keeps_the_next_run_out_harmlessly(tmp_path):
    """``dpone-transfer run`` holds its DuckDB file for the run: a worker stopped (SIGSTOP)
    past its lease keeps the next run out of the file, which fails before writing anything
    (exit 1, not blocked); resumed, the stopped worker finds its lease lost and writes
    nothing; the run after that loads every row once."""
    source, target = tmp_path / "source.db", tmp_path / "target.duckdb"
    with contextlib.closing(sqlite3.connect(source)) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, p INTEGER, v TEXT)")
        rows = ((i, i % 50, "v" * 40) for i in range(1, 100_001))
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
        db.commit()
    route = tmp_path / "route.toml"
    store = tmp_path / "checkpoints.db"
    route.write_text(ROUTE_HELD.format(source=source, target=target, store=store))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [sys.executable, "-m", "dpone_native_transfer", "run", str(route)]
    assert subprocess.run(command, env=env, capture_output=True, timeout=120).returncode == 0
    with contextlib.closing(sqlite3.connect(source)) as db:  # the file exists: checks open it
        db.execute("UPDATE t SET id = id + 100000")
        db.commit()
    first = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert first.stderr is not None
        for line in first.stderr:  # stopped while it extracts: the file is open, nothing armed
            if "extracted" in line:
                first.send_signal(signal.SIGSTOP)
                break
        time.sleep(2.5)  # past its one-second lease
        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == 1, second.stderr
        assert "native_transfer_target_unavailable" in second.stderr
        first.send_signal(signal.SIGCONT)
        _, rest = first.communicate(timeout=120)
        assert first.returncode == 1 and "native_transfer_lease_lost" in rest, rest
    finally:
        if first.poll() is None:
            first.send_signal(signal.SIGCONT)
            first.kill()
            first.wait()
    third = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stderr
    assert duckdb_ids(target, "t") == Counter(range(1, 200_001))  # both loads, each row once
