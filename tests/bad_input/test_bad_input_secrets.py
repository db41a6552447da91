"""Planted secrets: canaries in row values, in the sink's and the store's exception
messages and in the folder of every file; then every output of the Python API and the
CLI (errors, diagnostics, events, log records, stdout/stderr of ``run`` and ``guard
scan|show|resolve``) and the bytes of the store are searched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.cli import SCRIPT
from helpers.routes import write_route

from dpone_native_transfer import ManualReconciliationRequired, NativeTransferError, SQLiteSink, cli
from dpone_native_transfer.application import transfer
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.testing import (
    FaultyStore,
    RecordingSink,
    build_sample_source,
    phase_batch,
)

PATH_CANARY = "CANARY-SECRET-PATH"
ROW_CANARY = "CANARY-ROW-VALUE"
SINK_CANARY = "CANARY-SINK-ERROR"
STORE_WRITE_CANARY = "CANARY-STORE-WRITE"
STORE_READ_CANARY = "CANARY-STORE-READ"
PASSWORD_CANARY = "CANARY-PASSWORD"
DSN = f"postgresql://etl:{PASSWORD_CANARY}@warehouse.internal:5432/dwh"
CANARIES = (
    PATH_CANARY,
    ROW_CANARY,
    SINK_CANARY,
    STORE_WRITE_CANARY,
    STORE_READ_CANARY,
    PASSWORD_CANARY,
)
SQL_WORDS = ("SELECT", "INSERT", "ATTACH", "DELETE", "CREATE TABLE")


class Outputs:
    """Every text the system produced during the test, labelled by where it came from."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []
        self.events: list[Any] = []
        self.records: list[logging.LogRecord] = []

    def add(self, where: str, text: str) -> None:
        self.texts.append((where, text))

    def error(self, where: str, error: BaseException) -> None:
        """A dpone error's message and diagnostics (an injected error may carry its own text)."""
        assert isinstance(error, NativeTransferError), f"{where}: {error!r} is not dpone's"
        self.add(f"{where} (error)", str(error))
        self.add(f"{where} (diagnostics)", json.dumps(error.diagnostics, default=repr))

    def cli(self, where: str, out: str, err: str) -> None:
        self.add(f"{where} (stdout)", out)
        self.add(f"{where} (stderr)", err)

    def everything(self) -> list[tuple[str, str]]:
        events = [("events", repr([(e.name, dict(e.fields)) for e in self.events]))]
        logs = [("log", _log_text(record)) for record in self.records]
        return self.texts + events + logs


def _log_text(record: logging.LogRecord) -> str:
    parts = [record.getMessage()]
    if record.exc_info:
        parts.append(logging.Formatter().formatException(record.exc_info))
    return "\n".join(parts)


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def root_logging(records: list[logging.LogRecord]) -> Iterator[None]:
    root, handler = logging.getLogger(), _Collect(records)
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def dpone(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], cwd=folder, capture_output=True, text=True, timeout=120)


def plant_secret_rows(source_path: Path, first_id: int, count: int) -> None:
    """Rows whose non-partition value is a canary (amount holds text: SQLite allows it)."""
    with contextlib.closing(sqlite3.connect(source_path, isolation_level=None)) as db:
        db.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?)",
            [
                (i, f"region-{i % 3:03d}", f"{ROW_CANARY} {DSN}", 1_000_000 + i)
                for i in range(first_id, first_id + count)
            ],
        )


def sink_failing_after_apply(monkeypatch) -> RuntimeError:
    """The real SQLite target methods commit, then raise an error whose text holds secrets."""
    error = RuntimeError(f"{SINK_CANARY}: INSERT INTO orders_copy VALUES ('{ROW_CANARY}') {DSN}")
    for name in ("load", "finalize_staged_load", "load_plan"):
        original = getattr(SQLiteSink, name)

        def failing(self, *args, _original=original, **kwargs):
            _original(self, *args, **kwargs)
            raise error

        monkeypatch.setattr(SQLiteSink, name, failing)
    return error


def stored_json_texts(store_path: Path) -> list[tuple[str, str]]:
    """Every JSON text the store holds: checkpoints, source state, evidence, audit."""
    columns = {
        "checkpoint_history": "payload",
        "checkpoint_latest": "payload",
        "source_state": "state",
        "evidence": "record",
        "audit": "record",
    }
    with contextlib.closing(sqlite3.connect(store_path)) as db:
        return [
            (table, row[0])
            for table, column in columns.items()
            for row in db.execute(f"SELECT {column} FROM {table}")
        ]


class Story:
    """The secret-bearing route of the test below, and every output it produces."""

    ROUTE_ARGS = ("--route", "orders", "orders_copy", "incremental_append")

    def __init__(self, folder: Path, path: str) -> None:
        self.folder = folder
        build_sample_source(folder / "source.db", rows=30, partitions=3)
        self.next_id = 31
        self.plant_rows()
        self.route_file = write_route(folder, path=path)
        self.config = load_route_config(self.route_file)
        self.seen = Outputs()

    def plant_rows(self, count: int = 6) -> None:
        plant_secret_rows(self.folder / "source.db", self.next_id, count)
        self.next_id += count

    def api(self, run_id: str, *, wrap_store=None, sink=None):
        """The Python API (``application.transfer``: runtime, guard, SQLite store, closed after)."""
        events = self.seen.events.append
        return transfer(self.config, run_id, events=events, wrap_store=wrap_store, sink=sink)

    def api_raises(self, run_id: str, expected: BaseException, **kwargs: Any) -> None:
        with pytest.raises(type(expected)) as info:
            self.api(run_id, **kwargs)
        assert info.value is expected

    def blocked_api(self, run_id: str) -> None:
        with pytest.raises(ManualReconciliationRequired) as info:
            self.api(run_id)
        self.seen.error(f"api {run_id}", info.value)

    def console(self, *args: str, code: int) -> str:
        """The installed console script, run in the route's folder."""
        done = dpone(self.folder, *args)
        assert done.returncode == code, f"{args}: exit {done.returncode}, {done.stderr}"
        self.seen.cli(" ".join(args), done.stdout, done.stderr)
        return done.stdout

    def operator_round(self) -> None:
        """Scan, scan --json, show, a blocked run, then resolve the blocked batch as committed."""
        store = ("--store", "checkpoints.db")
        self.console("guard", "scan", *store, code=cli.EXIT_BLOCKED)
        lines = self.console("guard", "scan", *store, "--json", code=cli.EXIT_BLOCKED)
        self.console("guard", "show", *store, *self.ROUTE_ARGS, code=cli.EXIT_OK)
        self.console("run", "route.toml", code=cli.EXIT_BLOCKED)
        batch = json.loads(lines.splitlines()[0])["batch_id"]
        resolve = ("--batch", batch, "--as", "committed", "--yes")
        who = ("--reason", "rows checked: one copy each", "--operator", "alice")
        self.console("guard", "resolve", *store, *self.ROUTE_ARGS, *resolve, *who, code=0)


def failing_store(*, commit: BaseException | None = None, read: BaseException | None = None):
    """A ``wrap_store`` for ``application.transfer``: it fails the commit batch part-way,
    or the scan."""

    def wrap(store):
        wrapped = FaultyStore(store)
        if commit is not None:
            wrapped.fail_batch(phase_batch("checkpoint_committed"), keep=1, error=commit)
        if read is not None:
            wrapped.fail_reads(error=read)
        return wrapped

    return wrap


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
def test_no_secret_reaches_errors_events_logs_cli_output_or_the_store(
    tmp_path, monkeypatch, capsys, path
):
    folder = tmp_path / PATH_CANARY / "route"
    folder.mkdir(parents=True)
    story = Story(folder, path)
    seen = story.seen

    with root_logging(seen.records):
        # 1. the commit batch fails part-way with a secret-bearing store error; the route blocks
        store_error = RuntimeError(f"{STORE_WRITE_CANARY} {DSN}")
        story.api_raises("api-1", store_error, wrap_store=failing_store(commit=store_error))
        story.blocked_api("api-2")
        read_error = RuntimeError(f"{STORE_READ_CANARY} {DSN}")
        story.api_raises("api-3", read_error, wrap_store=failing_store(read=read_error))
        story.operator_round()

        # 2. new secret rows; the target fails after applying them, with a secret-bearing error
        healed, _ = story.api("api-4")  # completes the resolved generation, no target call
        assert healed.rows_loaded == 0 and len(healed.skipped_partition_ids) == 3
        story.plant_rows()
        sink_error = RuntimeError(f"{SINK_CANARY}: near '{ROW_CANARY}' {DSN}")
        target = RecordingSink(story.config.sink, fail="after", error=sink_error)
        story.api_raises("api-5", sink_error, sink=target)
        story.blocked_api("api-6")
        story.operator_round()

        # 3. the console's own run meets a foreign target failure: reported by type only
        healed, _ = story.api("api-7")
        assert healed.rows_loaded == 0
        story.plant_rows()
        sink_failing_after_apply(monkeypatch)
        assert cli.main(["run", str(story.route_file)]) == cli.EXIT_FAILED
        monkeypatch.undo()
        captured = capsys.readouterr()
        seen.cli("in-process run (foreign failure)", captured.out, captured.err)
        assert "error: transfer failed with RuntimeError" in captured.err
        story.console("run", "route.toml", code=cli.EXIT_BLOCKED)
        story.console("guard", "scan", "--store", "checkpoints.db", code=cli.EXIT_BLOCKED)

    with contextlib.closing(sqlite3.connect(folder / "target.db")) as db:
        loaded = db.execute("SELECT COUNT(*) FROM orders_copy WHERE amount LIKE 'CANARY%'")
        assert loaded.fetchone()[0] == 18, "the secret rows did reach the target"
    names = {event.name for event in seen.events}
    expected = {"route_scanned", "guard_armed", "target_started", "target_failed"}
    assert expected <= names, sorted(names)

    for where, text in seen.everything():
        for canary in CANARIES:
            assert canary not in text, f"{canary} leaked into {where}"
        for word in SQL_WORDS:
            assert word not in text, f"SQL text ({word}) in {where}"

    store_files = [file for file in folder.glob("checkpoints.db*") if file.is_file()]
    stored = b"".join(file.read_bytes() for file in store_files)
    for canary in CANARIES:
        assert canary.encode() not in stored, f"{canary} leaked into the checkpoint store file"
    texts = stored_json_texts(folder / "checkpoints.db")
    assert {table for table, _ in texts} == {
        "checkpoint_history",
        "checkpoint_latest",
        "source_state",
        "evidence",
        "audit",
    }
    for table, text in texts:
        for word in SQL_WORDS:
            assert word not in text, f"SQL text ({word}) persisted in {table}"
