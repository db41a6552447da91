"""legacy and file-artifact into DuckDB and chDB: the rows are written, before the target call,
in the format the engine reads itself (an Arrow IPC stream, ``NativeFiles``), and the target
call only reads those files. DuckDB writes them itself from a SQLite source it reads exactly
(``FilePulling``); otherwise the runtime writes the rows it read. Real engines; the wrappers
only watch, hide a capability or inject a fault."""

from __future__ import annotations

import contextlib
import errno
import itertools
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import duckdb
import pyarrow as pa
import pytest
from helpers.routes import Route, make_sink, transfer_once

from dpone_native_transfer import ClickHouseSink, SQLiteSource, artifacts
from dpone_native_transfer.artifacts import file_sha256
from dpone_native_transfer.connectors._arrow import read_ahead
from dpone_native_transfer.connectors.duckdb import bulk as duckdb_bulk
from dpone_native_transfer.connectors.duckdb import sink as duckdb_sink
from dpone_native_transfer.connectors.sqlite_reading import watching_writes
from dpone_native_transfer.errors import ArtifactInvalid, WorkFolderFailed
from dpone_native_transfer.payloads import LoadFile, LoadFiles
from dpone_native_transfer.testing import assert_rows_exactly_once
from dpone_native_transfer.testing.faults import build_sample_source

KINDS = ["duckdb", "clickhouse"]
FILE_PATHS = ["legacy", "file-artifact"]


class Watching:
    """The real sink; ``before_load(payload)`` runs at the start of every load and stage."""

    def __init__(self, inner: Any, before_load: Callable[[Any], None]) -> None:
        self.inner, self.before_load = inner, before_load

    def load(self, payload: Any, **ledger: Any) -> int:
        self.before_load(payload)
        return self.inner.load(payload, **ledger)

    def stage(self, payload: Any) -> int:
        self.before_load(payload)
        return self.inner.stage(payload)

    def engine(self) -> Any:
        """The sink's engine, through this wrapper when it is the sink itself."""
        engine = self.inner.engine()
        return self if engine is self.inner else engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class NotPulling(Watching):
    """The real sink whose engine pulls no file: the runtime writes its load files."""

    def can_pull(self, plan: Any, files: int) -> bool:
        return False


def _route(
    tmp_path: Path, kind: str, before_load: Callable[[Any], None], *, pulling: bool = True
) -> Route:
    wrapper = Watching if pulling else NotPulling
    sink = wrapper(make_sink(kind, tmp_path / f"target-{kind}"), before_load)
    return Route(tmp_path, kind=kind, sink=sink)


@pytest.mark.parametrize("path", FILE_PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_the_target_call_reads_arrow_files_written_before_it(tmp_path, kind, path):
    seen: list[LoadFiles] = []

    artifacts: list[dict[str, tuple[str, int]]] = []

    def check(payload: Any) -> None:
        assert isinstance(payload, LoadFiles) and payload.files
        for file in payload.files:  # every file is already whole, in the engine's format
            assert file.native and file.path.suffix == ".arrows"
            with pa.OSFile(str(file.path)) as handle:
                assert pa.ipc.open_stream(handle).read_all().num_rows == file.rows
            assert file_sha256(file.path) == file.sha256
        seen.append(payload)
        artifacts.append(_partition_files(payload))

    route = _route(tmp_path, kind, check)
    try:
        result = route.runtime().run(route.spec(path))
        [payload] = seen
        assert result.rows_loaded == sum(file.rows for file in payload.files) == 120
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
        if path == "file-artifact":  # one file per partition, its digest in its checkpoint
            recorded = {
                cp.partition_id: (cp.diagnostics["artifact_sha256"], cp.rows_exported)
                for cp in route.latest()
            }
            assert artifacts == [recorded] and len(recorded) == 4
            merged = kind == "clickhouse"  # chDB loads them merged into one file, in one INSERT
            assert sorted(f.path.stem for f in payload.files) == (
                ["merged"] if merged else sorted(recorded)
            )
    finally:
        route.real_store.close()


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_a_chdb_full_refresh_loads_what_chdb_read_without_a_rewrite(tmp_path, path):
    """A full refresh fills a fresh table, where no INSERT is retried: its pulled files
    (file-artifact's merged into one) are loaded as chDB wrote them, each row's tag included,
    and read only for their digests and each partition's count; staged has chDB fill its
    stage from the source, and writes no file. Twice, the source changed between: the
    target holds the source's rows exactly, each partition's checkpoint its count."""
    seen: list[tuple[LoadFile, Any]] = []
    pulled: list[Any] = []

    def read(payload: Any) -> None:
        [file] = payload.files
        with pa.OSFile(str(file.path)) as handle:
            seen.append((file, pa.ipc.open_stream(handle).read_all()))

    route = _route(tmp_path, "clickhouse", read)
    _watch_pulls(route.sink.inner, pulled)
    try:
        for run in ("run-1", "run-2"):
            spec = route.spec(path, run, strategy="full_refresh")
            result = route.runtime().run(spec)
            if path == "staged":
                assert seen == [] and isinstance(pulled.pop(), list)
            else:
                file, table = seen.pop()
                assert "__dpone_bound" in table.column_names and file.native
                assert result.rows_loaded == file.rows == table.num_rows
            assert result.rows_loaded == len(route.source_ids())
            assert route.target_rows() == route.source_rows()
            with sqlite3.connect(route.source_path) as db:
                counts = dict(db.execute("SELECT region, count(*) FROM orders GROUP BY 1"))
            db.close()
            recorded = {
                cp.partition_bounds["partition"]: cp.rows_exported
                for cp in route.real_store.list_latest(spec.route)
                if cp.run_id == run
            }
            assert recorded == counts
            with sqlite3.connect(route.source_path) as db:  # one partition fewer, one new
                db.execute("DELETE FROM orders WHERE region = (SELECT min(region) FROM orders)")
                db.execute("UPDATE orders SET region = 'new' WHERE id % 9 = 0")
            db.close()
    finally:
        route.real_store.close()


@pytest.mark.parametrize("altered", [False, True])
def test_chdb_stages_the_rows_itself_only_where_its_tag_reads_the_source_type(tmp_path, altered):
    """staged into chDB: chDB fills the stage from the source and counts each partition by
    the pull's tag over the staged rows. That holds only where the stage keeps the key as
    chDB reads it: a target whose partition column was made Float32 (two REAL keys become
    one, and the tag would count both rows as the first's) is staged by Python instead, and
    each partition's count is still its own."""
    source_path = tmp_path / "source.db"
    with sqlite3.connect(source_path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, p REAL)")
        keys = [1.5, 1.50000001, 2.5]  # the first two are one Float32
        db.executemany("INSERT INTO t VALUES (?, ?)", [(i, keys[i % 3]) for i in range(30)])
    db.close()
    pulled: list[Any] = []
    route = _route(tmp_path, "clickhouse", lambda payload: None)
    route.source = SQLiteSource(str(source_path), "t", "p")
    route.sink.inner.inner = ClickHouseSink(tmp_path / "chdata", "orders_copy")
    _watch_pulls(route.sink.inner, pulled)
    try:
        if altered:
            with route.sink.inner.client() as client:
                client.command("CREATE TABLE orders_copy (id Nullable(Int64), p Nullable(Float32))"
                               " ENGINE = MergeTree ORDER BY tuple()")  # fmt: skip
        spec = route.spec("staged", strategy="full_refresh")
        assert route.runtime().run(spec).rows_loaded == 30
        assert pulled == ([None] if altered else [[10, 10, 10]])
        counts = {cp.partition_bounds["partition"]: cp.rows_exported
                  for cp in route.real_store.list_latest(spec.route)}  # fmt: skip
        assert counts == dict.fromkeys(keys, 10)
        assert sorted(row[0] for row in route.sink.inner.rows()) == list(range(30))
    finally:
        route.real_store.close()


def _partition_files(payload: LoadFiles) -> dict[str, tuple[str, int]]:
    """Digest and rows of each Arrow file in the load's work folder but a merged one, by name."""
    found = {}
    for path in payload.files[0].path.parent.glob("*.arrows"):
        if path.stem != "merged":
            with pa.OSFile(str(path)) as handle:
                found[path.stem] = (
                    file_sha256(path),
                    pa.ipc.open_stream(handle).read_all().num_rows,
                )
    return found


class NaNSource(SQLiteSource):
    """The real source, with a NaN amount in region-001 (SQLite itself cannot hold one)."""

    def read(self, bounds: Any, *, chunk_rows: int = 10_000) -> Iterator[list[tuple]]:
        for chunk in super().read(bounds, chunk_rows=chunk_rows):
            yield [(i, r, math.nan if r == "region-001" else a, u) for i, r, a, u in chunk]

    def read_partitions(self, bounds: Any, *, chunk_rows: int = 10_000) -> None:
        return None  # the NaN is added by read only


def test_a_value_arrow_cannot_hold_keeps_its_file_in_the_runtime_format(tmp_path):
    """DuckDB gets a NaN as the text ``'nan'`` (its binding would make a float NaN NULL), which
    an Arrow double cannot hold: that partition's file is a spool file, the others Arrow."""
    seen: list[LoadFiles] = []
    route = _route(tmp_path, "duckdb", seen.append, pulling=False)  # DuckDB would read the file
    route.source = NaNSource(str(route.source_path), "orders", "region", "updated_at")
    try:
        assert route.runtime().run(route.spec("file-artifact")).rows_loaded == 120
        [payload] = seen
        native = {file.path.stem: file.native for file in payload.files}
        by_region = {cp.partition_bounds["partition"]: cp.partition_id for cp in route.latest()}
        assert native == {pid: region != "region-001" for region, pid in by_region.items()}
        amounts = {row[0]: row[2] for row in route.target_rows() if row[1] == "region-001"}
        assert amounts and all(math.isnan(amount) for amount in amounts.values())
    finally:
        route.real_store.close()


@pytest.mark.parametrize(
    ("kind", "path"), [(k, p) for k in KINDS for p in FILE_PATHS] + [("sqlite", "legacy")]
)
def test_an_artifact_changed_before_the_engine_reads_it_loads_nothing(tmp_path, kind, path):
    """Bytes appended after the stream's end: the engine would read the same rows, yet the
    digest differs. DuckDB hashes what it reads; chDB's files are checked just before."""
    tampering = [False]

    def tamper(payload: Any) -> None:
        if tampering[0]:
            with open(payload.files[-1].path, "ab") as handle:
                handle.write(b"\0" * 8)

    route = _route(tmp_path, kind, tamper)
    try:
        route.runtime().run(route.spec(path, run_id="r1"))
        route.add_rows(40)
        tampering[0] = True
        with pytest.raises(ArtifactInvalid) as caught:
            route.runtime().run(route.spec(path, run_id="r2"))
        assert set(caught.value.diagnostics) == {"file"}
        assert caught.value.diagnostics["file"].endswith(
            ".sqlite" if kind == "sqlite" else ".arrows"
        )
        assert len(route.target_ids()) == 120  # nothing of the second load
        assert not _reading_ahead()
    finally:
        route.real_store.close()


@pytest.fixture
def full_disk(monkeypatch):
    """Every Arrow load file write fails with ENOSPC once 1 KiB is written, the runtime's and
    DuckDB's own alike (both write through ``DigestWriter``); ``space()`` ends it."""
    real = artifacts.DigestWriter.write
    written = [0]
    full = [True]

    def write(self, data: bytes) -> int:
        written[0] += len(data)
        if full[0] and written[0] > 1024:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data)

    monkeypatch.setattr(artifacts.DigestWriter, "write", write)
    return lambda: full.__setitem__(0, False)


@pytest.mark.parametrize("path", FILE_PATHS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_full_disk_fails_before_the_target_and_the_retry_loads_once(
    tmp_path, kind, path, full_disk
):
    """The load file is written before the target call, so a full disk never blocks the route;
    a pulled file that fails leaves no file behind, and the runtime then writes its own."""
    route = Route(tmp_path, kind=kind, sink=make_sink(kind, tmp_path / f"target-{kind}"))
    try:
        with pytest.raises(WorkFolderFailed) as caught:  # not a raw OSError, since 4be13b6
            route.runtime().run(route.spec(path, run_id="r1"))
        assert caught.value.diagnostics["errno"] == "ENOSPC"
        assert route.sink.target_calls == 0
        full_disk()  # space again
        assert route.runtime().run(route.spec(path, run_id="r2")).rows_loaded == 120
        assert route.sink.target_calls == 1
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
    finally:
        route.real_store.close()


# --- DuckDB writes the load files itself (FilePulling) ---------------------------------------


class Unread(SQLiteSource):
    """The real source; a partition read through Python fails the test. The rows at the top of
    the cursor edge are read (before and after the engine's own read, as for lazy-plan)."""

    def read(self, bounds: Any, *, chunk_rows: int = 10_000) -> Iterator[list[tuple]]:
        if "cursor_from" in bounds:
            return super().read(bounds, chunk_rows=chunk_rows)
        raise AssertionError("a row was read through Python")

    def read_partitions(self, bounds: Any, *, chunk_rows: int = 10_000) -> Any:
        if all("cursor_from" in b for b in bounds):  # the top of the edge, in one scan
            return super().read_partitions(bounds, chunk_rows=chunk_rows)
        raise AssertionError("a row was read through Python")


def _unread_route(tmp_path: Path, seen: list, kind: str = "duckdb") -> Route:
    route = _route(tmp_path, kind, seen.append)
    route.source = Unread(str(route.source_path), "orders", "region", "updated_at")
    return route


# (target, path) where the engine writes the load files itself, one per partition for
# file-artifact.
PULLED = [
    (k, p)
    for k in ("duckdb", "sqlite", "clickhouse")
    for p in ("legacy", "staged", "file-artifact")
]


@pytest.mark.parametrize(("kind", "path"), PULLED)
@pytest.mark.parametrize("index", [False, True], ids=["unindexed", "indexed"])
def test_the_engine_writes_the_load_files_from_sqlite_without_a_row_in_python(
    tmp_path, kind, path, index
):
    seen: list[LoadFiles] = []
    route = _unread_route(tmp_path, seen, kind)
    assert route.sink.engine().pulled_suffix in (".arrows", ".sqlite")  # the engine pulls
    batches: list[int] = []  # of each Arrow file, counted as the load begins
    artifacts: list[dict[str, tuple[str, int]]] = []

    def watch(payload: Any) -> None:
        seen.append(payload)
        if kind == "clickhouse":
            artifacts.append(_partition_files(payload))
        for file in payload.files if kind == "duckdb" else ():
            with pa.OSFile(str(file.path)) as handle:
                batches.append(len(list(pa.ipc.open_stream(handle))))

    route.sink.inner.before_load = watch
    if index:  # each partition's own read seeks it; else one scan reads them all
        with sqlite3.connect(route.source_path) as db:
            db.execute("CREATE INDEX orders_region ON orders (region)")
    try:
        result = route.runtime().run(route.spec(path, run_id="r1"))
        assert result.rows_loaded == 120
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
        with sqlite3.connect(route.source_path) as db:
            counts = dict(db.execute("SELECT region, count(*) FROM orders GROUP BY region"))
        latest = route.latest()
        assert {cp.partition_bounds["partition"]: cp.rows_exported for cp in latest} == counts
        if kind == "clickhouse" and path == "staged":  # chDB stages them itself: no file
            assert seen == []
        else:
            [payload] = seen
            assert all(file.native for file in payload.files)
            assert {file.path.suffix for file in payload.files} == {route.sink.pulled_suffix}
            if path == "file-artifact":
                by_id = {cp.partition_id: cp for cp in latest}
                files = {file.path.stem: (file.sha256, file.rows) for file in payload.files}
                if kind == "clickhouse":  # merged into one file, each checked as it was copied
                    assert [*files] == ["merged"] and files["merged"][1] == 120
                    [files] = artifacts
                for stem, (sha256, rows) in files.items():
                    checkpoint = by_id[stem]
                    assert sha256 == checkpoint.diagnostics["artifact_sha256"]
                    assert rows == checkpoint.rows_exported
                assert len(files) == 4
                if kind == "duckdb":  # gathered: one batch per file, not a slice per scan batch
                    assert batches == [1] * 4
            else:
                assert len(payload.files) == 1
        route.add_rows(40)  # the next window (the cursor edge is tracked) loads only the new
        assert route.runtime().run(route.spec(path, run_id="r2")).rows_loaded == 40
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
    finally:
        route.real_store.close()


@pytest.mark.parametrize("open_files", [None, 250])
@pytest.mark.parametrize(("kind", "path"), PULLED)
def test_hundreds_of_partitions_are_pulled_by_the_engine_not_read_one_by_one(
    tmp_path, kind, path, open_files, monkeypatch
):
    """600 partitions of an unindexed column, a full refresh: the engine pulls them all,
    each partition's count in its checkpoint, each row once, no row read through Python.
    Before, a plan of more than 256 partitions (SQLite's file-artifact: 500) was read a
    partition at a time, a scan of the table each: 1,000 partitions of 1,000,000 rows took
    50-60 s instead of 1-5 s. file-artifact's engine holds a file open per partition: past
    ``open_files_allowed()`` it pulls them in groups (before 2026-12-04, Python read them
    one by one: 6,000 partitions took 75-80 s into DuckDB and chDB). SQLite, which writes
    one file at a time, pulls them all in one read of the source."""
    if open_files is not None:
        from dpone_native_transfer.connectors.clickhouse import sink as clickhouse_sink
        from dpone_native_transfer.paths import _files

        for module in (_files, duckdb_sink, clickhouse_sink):
            monkeypatch.setattr(module, "open_files_allowed", lambda: open_files)
    grouped = open_files is not None and path == "file-artifact" and kind != "sqlite"
    groups = 3 if grouped else 1
    source_path = tmp_path / "many.db"
    with sqlite3.connect(source_path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, p TEXT, v REAL)")
        rows = [(i, f"v{i % 600:03d}", i / 4) for i in range(1800)]
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    location = tmp_path / f"target-{kind}"
    sink = ClickHouseSink(str(location), "orders_copy") if kind == "clickhouse" else None
    sink = Watching(sink or make_sink(kind, location), lambda payload: None)
    route = Route(tmp_path, kind=kind, sink=sink)
    route.source = Unread(str(source_path), "t", "p")
    pulled: list[Any] = []
    _watch_pulls(route.sink.inner, pulled)
    scans: list[Any] = []  # SQLite's: one statement for the plan, else a read per partition
    real_table_sql = SQLiteSource.table_sql

    def table_sql(self: SQLiteSource, bounds: Any, **kwargs: Any) -> Any:
        scans.append(real_table_sql(self, bounds, **kwargs))
        return scans[-1]

    monkeypatch.setattr(SQLiteSource, "table_sql", table_sql)
    try:
        spec = route.spec(path, strategy="full_refresh")
        result = route.runtime().run(spec)
        assert result.rows_loaded == 1800 and len(pulled) == groups + grouped
        assert pulled[:grouped] == [DECLINED] * grouped  # more files than it holds open
        assert all(_succeeded(pull) for pull in pulled[grouped:])
        assert all(scan is not None for scan in scans) and (kind == "sqlite") == bool(scans)
        assert sorted(route.sink.inner.rows()) == rows
        latest = route.real_store.list_latest(spec.route)
        assert {cp.partition_bounds["partition"]: cp.rows_exported for cp in latest} == {
            f"v{k:03d}": 3 for k in range(600)
        }
    finally:
        route.real_store.close()


@pytest.mark.parametrize("journal", ["wal", "delete"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_row_moved_between_two_groups_of_a_pull_is_neither_lost_nor_loaded_twice(
    tmp_path, kind, journal, monkeypatch
):
    """Past ``open_files_allowed()`` file-artifact's engine pulls in groups, a read of the
    source each; the whole pull is kept only when the source was not written meanwhile
    (``WriteWatching``). A writer that moved rows after the first group's pull had a row
    moved into a pulled partition lost and one moved out of it loaded twice. The writer is
    another process, as a writer is: two copies of SQLite in one (chDB's) drop each other's
    locks."""
    from dpone_native_transfer.connectors.clickhouse import sink as clickhouse_sink
    from dpone_native_transfer.paths import _files

    for module in (_files, duckdb_sink, clickhouse_sink):
        monkeypatch.setattr(module, "open_files_allowed", lambda: 2)  # 6 partitions: 3 groups
    source_path = tmp_path / "source.db"
    with contextlib.closing(sqlite3.connect(source_path)) as db:
        db.execute(f"PRAGMA journal_mode = {journal}")
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, p INTEGER, v TEXT)")
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", [(i, i % 6, f"v{i}") for i in range(60)])
        db.commit()
    location = tmp_path / f"target-{kind}"
    sink = ClickHouseSink(str(location), "t_copy") if kind == "clickhouse" else None
    sink = sink or make_sink(kind, location, "t_copy")
    real_pull, pulls = sink.pull_load_files, []

    def pull_then_move(plan: Any, paths: Any) -> Any:
        pulls.append(real_pull(plan, paths))
        if len(pulls) == 1:  # every odd row to the next partition, the first group's too
            move = "UPDATE t SET p = (p + 1) % 6 WHERE id % 2 = 1"
            write = f"import sqlite3; sqlite3.connect({str(source_path)!r}).execute({move!r})"
            subprocess.run([sys.executable, "-c", write + ".connection.commit()"], check=True)
        return pulls[-1]

    sink.pull_load_files = pull_then_move
    source = SQLiteSource(str(source_path), "t", "p")
    result = transfer_once(tmp_path, source, sink, path="file-artifact", strategy="full_refresh")
    assert len(pulls) == 3 and all(_succeeded(pull) for pull in pulls)
    assert sorted(row[0] for row in sink.rows()) == list(range(60))
    assert result.rows_loaded == 60


class CountingReads(SQLiteSource):
    """The real source, counting its reads of single partitions and of several in one scan."""

    reads = scans = 0

    def read(self, bounds: Any, *, chunk_rows: int = 10_000) -> Iterator[list[tuple]]:
        CountingReads.reads += 1
        return super().read(bounds, chunk_rows=chunk_rows)

    def read_partitions(self, bounds: Any, *, chunk_rows: int = 10_000) -> Any:
        scan = super().read_partitions(bounds, chunk_rows=chunk_rows)
        CountingReads.scans += scan is not None
        return scan


@pytest.mark.parametrize("kind", ["duckdb", "sqlite", "clickhouse"])
def test_the_rows_at_the_top_of_the_edge_are_read_in_one_scan_around_a_pull(
    tmp_path, kind, monkeypatch
):
    """An append whose cursor edge is tracked reads the rows at the top of its window before
    and after the engine's pull. From an unindexed source that was a scan per partition each
    time (15.6 s of a 19 s append of 300,000 rows in 100 partitions); it is one scan each
    time, and the next window still loads exactly the new rows."""
    seen: list[Any] = []
    route = _route(tmp_path, kind, seen.append)
    route.source = CountingReads(str(route.source_path), "orders", "region", "updated_at")
    monkeypatch.setattr(CountingReads, "reads", 0)
    monkeypatch.setattr(CountingReads, "scans", 0)
    try:
        assert route.runtime().run(route.spec("legacy", run_id="r1")).rows_loaded == 120
        route.add_rows(40)
        before = CountingReads.reads, CountingReads.scans
        assert route.runtime().run(route.spec("legacy", run_id="r2")).rows_loaded == 40
        assert (CountingReads.reads - before[0], CountingReads.scans - before[1]) == (0, 2)
        assert all(file.native for file in seen[-1].files)  # pulled: no row read through Python
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
    finally:
        route.real_store.close()


@pytest.mark.parametrize("written", ["before the engine reads", "after it read"])
@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
@pytest.mark.parametrize("kind", ["duckdb", "sqlite", "clickhouse"])
def test_rows_written_at_the_top_of_the_window_during_a_pull_are_never_lost(
    tmp_path, kind, path, written
):
    """Rows written at the window's highest cursor value while the engine pulls: which of
    them it read is unknown, so the pull is discarded (its files deleted: Python's own take
    their names) and Python reads the rows, tracking each; the next run loads the rest.
    Keeping the pull lost them for good, with exit 0 and a warning (a hostile run found it)."""
    pulled: list[Any] = []
    route = _route(tmp_path, kind, lambda payload: None)
    route.source = SQLiteSource(str(route.source_path), "orders", "region", "updated_at")
    sink = route.sink.inner
    _watch_pulls(sink, pulled)
    staging = path == "staged" and sink.engine().stages
    pull = "pull_stage" if staging else "pull_load_files"  # the engine's read of the window
    watched = getattr(sink, pull)

    def tie(rows: int) -> None:
        with sqlite3.connect(route.source_path) as db:
            db.executemany(
                "INSERT INTO orders SELECT max(id) + 1, 'region-001', 2.5, max(updated_at)"
                " FROM orders WHERE ? >= 0",
                [(n,) for n in range(rows)],
            )

    def pull_while_writing(*args: Any) -> Any:
        if written.startswith("before"):
            tie(3)
        pulled = watched(*args)
        if written.startswith("after"):
            tie(3)
        return pulled

    try:
        assert route.runtime().run(route.spec(path, run_id="r1")).rows_loaded == 120
        route.add_rows(40)
        setattr(sink, pull, pull_while_writing)
        loaded = route.runtime().run(route.spec(path, run_id="r2")).rows_loaded
        assert _succeeded(pulled[-1]), "the pull itself succeeded"
        assert loaded == 43, "Python read the window, the rows written after the pull too"
        setattr(sink, pull, watched)
        route.runtime().run(route.spec(path, run_id="r3"))
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
        assert len(route.target_ids()) == 163
    finally:
        route.real_store.close()


@pytest.mark.parametrize("path", ["legacy", "file-artifact"])
@pytest.mark.parametrize("kind", ["duckdb", "sqlite", "clickhouse"])
def test_rows_that_change_after_planning_are_pulled_as_each_partition_reads_them(
    tmp_path, kind, path
):
    """Between planning and the pull, a new partition appears (left out, as each partition's
    own read would), one partition is emptied, and a row moves to another: each count is what
    the engine copied, and the target holds exactly the planned partitions' rows."""
    seen: list[LoadFiles] = []
    route = _unread_route(tmp_path, seen, kind)
    real = route.sink.inner.pull_load_files

    def pull_after_changes(plan: Any, paths: Any) -> Any:
        with sqlite3.connect(route.source_path) as db:
            db.execute("INSERT INTO orders VALUES (999, 'region-new', 1.0, 1)")
            db.execute("DELETE FROM orders WHERE region = 'region-002'")
            db.execute(
                "UPDATE orders SET region = 'region-001'"
                " WHERE id = (SELECT min(id) FROM orders WHERE region = 'region-000')"
            )
        return real(plan, paths)

    route.sink.inner.pull_load_files = pull_after_changes
    try:
        loaded = route.runtime().run(route.spec(path)).rows_loaded
        with sqlite3.connect(route.source_path) as db:
            planned = db.execute("SELECT id FROM orders WHERE region <> 'region-new'").fetchall()
            counts = dict(db.execute("SELECT region, count(*) FROM orders GROUP BY region"))
        assert loaded == len(planned) and sorted(route.target_ids()) == sorted(
            i for (i,) in planned
        )
        exported = {cp.partition_bounds["partition"]: cp.rows_exported for cp in route.latest()}
        assert exported == {
            **{r: n for r, n in counts.items() if r != "region-new"},
            "region-002": 0,
        }
        assert exported["region-001"] == exported["region-000"] + 2  # one row moved over
    finally:
        route.real_store.close()


DECLINED = "declined"


@pytest.mark.parametrize("strategy", ["full_refresh", "incremental_append"])
@pytest.mark.parametrize(("kind", "path"), [p for p in PULLED if p[0] != "clickhouse"])
def test_key_ranges_of_an_unindexed_key_are_pulled_by_the_engine(
    tmp_path, kind, path, strategy, monkeypatch
):
    """About 300 ranges of an unindexed key, and rows without a key: the engine pulls them in
    one read, no row read through Python, each range's count that of its own read. Before,
    each range took a statement of its own (a scan each): SQLite's pulls read and counted
    a range at a time, and an append read each range's top rows around DuckDB's pull; 1,000
    ranges of 200,000 rows took 9-30 s instead of 0.6-2.5."""
    per_range: list[str] = []
    for name in ("select_sql", "count_sql", "read"):
        real = getattr(SQLiteSource, name)

        def counted(self: Any, bounds: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            per_range.append(bounds)
            return _real(self, bounds, *args, **kwargs)

        monkeypatch.setattr(SQLiteSource, name, counted)
    source_path = tmp_path / "ranges.db"
    with sqlite3.connect(source_path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k INTEGER, v TEXT)")
        rows = [(i, None if i % 31 == 0 else (i * 7919) % 900, f"v{i}") for i in range(1, 1801)]
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    db.close()
    sink = Watching(make_sink(kind, tmp_path / f"target-{kind}"), lambda payload: None)
    route = Route(tmp_path, kind=kind, sink=sink)
    route.source = Unread(str(source_path), "t", "k", "id", partition_rows=6)
    pulled: list[Any] = []
    _watch_pulls(route.sink.inner, pulled)
    try:
        spec = route.spec(path, strategy=strategy)
        assert route.runtime().run(spec).rows_loaded == 1800
        assert [_succeeded(pull) for pull in pulled] == [True] and per_range == []
        assert sorted(route.sink.inner.rows()) == rows
        latest = route.real_store.list_latest(spec.route)
        assert len(latest) > 250
        plain = SQLiteSource(str(source_path), "t", "k", "id")
        assert all(cp.rows_exported == plain.count(cp.partition_bounds) for cp in latest)
    finally:
        route.real_store.close()


@pytest.mark.parametrize(
    ("kind", "path"),
    [*((kind, "file-artifact") for kind in ("duckdb", "clickhouse")), ("sqlite", "lazy-plan")],
)
def test_a_utf16_sources_text_ranges_are_read_by_sqlite_in_its_own_order(
    tmp_path, kind, path, monkeypatch
):
    """SQLite orders UTF-16le text by its bytes ('a' after 'Ā'), DuckDB and chDB by code point:
    their pull of text key ranges, cut in groups of 16 files, loaded some rows twice and lost
    others, each range's count wrong. Their plans of a UTF-16 source are refused, so SQLite
    reads; lazy-plan, which SQLite cannot attach to a UTF-8 target (it failed inside the
    target call, uncoded; then it was refused), carries the rows itself, as legacy does."""
    from dpone_native_transfer.connectors.clickhouse import sink as clickhouse_sink
    from dpone_native_transfer.paths import _files

    for module in (_files, duckdb_sink, clickhouse_sink):
        monkeypatch.setattr(module, "open_files_allowed", lambda: 16)
    source_path = tmp_path / "utf16.db"
    with contextlib.closing(sqlite3.connect(source_path)) as db:
        db.execute("PRAGMA encoding = 'UTF-16le'")
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, k TEXT, v TEXT)")
        letters = "aZ0~\u00e9\u0100\u0101\u4e2d\uff21\U0001f600"
        pick = random.Random(1).choice
        rows = [(i, "".join(pick(letters) for _ in range(3)), f"v{i}") for i in range(900)]
        db.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
        db.commit()
    location = tmp_path / f"target-{kind}"
    sink = ClickHouseSink(str(location), "orders_copy") if kind == "clickhouse" else None
    route = Route(tmp_path, kind=kind, sink=sink or make_sink(kind, location))
    route.source = SQLiteSource(str(source_path), "t", "k", partition_rows=9)
    try:
        spec = route.spec(path, strategy="full_refresh", run_id="r2")
        assert route.runtime().run(spec).rows_loaded == 900
        assert sorted(row[:3] for row in route.sink.rows()) == rows
        latest = route.real_store.list_latest(spec.route)
        assert len(latest) > 50
        assert all(cp.rows_exported == route.source.count(cp.partition_bounds) for cp in latest)
    finally:
        route.real_store.close()


def _succeeded(pull: Any) -> bool:
    """Whether a pull ``_watch_pulls`` recorded was kept: files and counts, or counts."""
    return isinstance(pull, (tuple, list))


def _watch_pulls(sink: Any, pulled: list) -> None:
    """Append to ``pulled`` what each pull gave: its files and counts (a staged pull's counts),
    None when its read failed, or ``DECLINED`` when the sink declined it (``can_pull``)."""
    can_pull, pull = sink.can_pull, sink.pull_load_files
    if sink.engine().stages:
        stage = sink.pull_stage

        def staging(plan: Any) -> Any:
            pulled.append(stage(plan))
            return pulled[-1]

        sink.pull_stage = staging

    def asked(plan: Any, files: int) -> bool:
        accepted = can_pull(plan, files)
        if not accepted:
            pulled.append(DECLINED)
        return accepted

    def pulling(plan: Any, paths: Any) -> Any:
        pulled.append(pull(plan, paths))
        return pulled[-1]

    sink.can_pull, sink.pull_load_files = asked, pulling


@pytest.mark.parametrize("path", FILE_PATHS)
@pytest.mark.parametrize("kind", ["duckdb", "clickhouse"])
def test_a_column_the_engine_would_misread_is_read_through_python(tmp_path, kind, path):
    """A real stored in an INTEGER column: DuckDB's scanner refuses it, so the pull fails;
    chDB's sqlite() would read 1, so lazy-plan's check, run beside the pull, throws the pull
    away. The runtime then reads the rows (and refuses that value)."""
    pulled: list[Any] = []
    route = _route(tmp_path, kind, lambda payload: None)
    _watch_pulls(route.sink.inner, pulled)
    with sqlite3.connect(route.source_path) as db:
        db.execute("UPDATE orders SET updated_at = 1.5 WHERE id = 1")
    try:
        with pytest.raises(Exception) as caught:
            route.runtime().run(route.spec(path))
        assert pulled == [None]
        found = getattr(caught.value, "code", ""), getattr(caught.value, "diagnostics", None)
        assert found[0] == "native_transfer_value_unsupported", found  # flaky once in CI
        assert route.sink.target_calls == 0
    finally:
        route.real_store.close()


def _pulled_and_read(
    tmp_path: Path, path: str, script: str, kind: str = "duckdb", partition_rows: int | None = None
) -> tuple:
    """The same source (``script`` makes it: table or view ``t``, partitioned by ``p``, in
    ranges of ``partition_rows`` when given) through the pulling sink of ``kind`` and through
    one that cannot pull: each run's outcome (rows loaded and the target's rows, or the error
    code, and each partition's rows), and what each pull gave (``_watch_pulls``)."""
    tmp_path.mkdir(exist_ok=True)
    source_path = tmp_path / "src.db"
    with sqlite3.connect(source_path) as db:
        db.executescript(script)
    outcomes, pulled = {}, []
    for pulling in (True, False):
        folder = tmp_path / ("pulled" if pulling else "python")
        folder.mkdir()
        route = _route(folder, kind, lambda payload: None, pulling=pulling)
        if kind == "clickhouse":  # not partitioned: a REAL key cannot be a partition key
            route.sink.inner.inner = ClickHouseSink(folder / "target-chdb", "orders_copy")
        if pulling:
            _watch_pulls(route.sink.inner, pulled)
        route.source = SQLiteSource(str(source_path), "t", "p", partition_rows=partition_rows)
        try:
            loaded = route.runtime().run(route.spec(path)).rows_loaded
            exported = {cp.partition_id: cp.rows_exported for cp in route.latest()}
            outcomes[pulling] = loaded, route.target_rows(), exported
        except Exception as error:
            outcomes[pulling] = getattr(error, "code", type(error).__name__)
            assert route.sink.target_calls == 0
        finally:
            route.real_store.close()
    return outcomes[True], outcomes[False], pulled


# A value of another storage class than its table column's: DuckDB's scanner refuses it (the
# pull fails, before the target, and Python reads), so no read looks for it first.
SCANNER_REFUSES = [
    ("INTEGER", "1.5"),
    ("INTEGER", "'abc'"),
    ("INTEGER", "x'01'"),
    ("TEXT", "x'01'"),
    ("REAL", "'abc'"),
    ("REAL", "x'01'"),
]
PLAIN = {"INTEGER": "7", "TEXT": "'x'", "REAL": "2.5"}


@pytest.mark.parametrize("path", FILE_PATHS)
@pytest.mark.parametrize(("declared", "odd"), SCANNER_REFUSES)
def test_a_value_the_scanner_refuses_fails_the_pull_and_python_reads(tmp_path, path, declared, odd):
    """Each such value against the same rows read by Python: the same outcome, and the pull
    was tried (not declined by a read of the source first) and gave nothing. Without the
    value, the pull loads."""
    create = f"CREATE TABLE t (id INTEGER PRIMARY KEY, p TEXT, v {declared});"
    for value, folder in ((odd, "odd"), (PLAIN[declared], "plain")):
        script = create + f"INSERT INTO t VALUES (1, 'a', {value}), (2, 'b', {PLAIN[declared]});"
        pulled_run, read_run, pulled = _pulled_and_read(tmp_path / folder, path, script)
        assert pulled_run == read_run
        assert pulled == [None] if value == odd else _succeeded(pulled[0])


def test_a_value_the_scanner_would_misread_is_looked_for_before_the_pull(tmp_path):
    """The scanner reads a BOOLEAN column as the integer it holds, 2 included: the pull is
    declined by the read that finds it, and Python reads (the same outcome)."""
    script = (
        "CREATE TABLE t (id INTEGER PRIMARY KEY, p TEXT, v BOOLEAN);"
        "INSERT INTO t VALUES (1, 'a', 1), (2, 'b', 2);"
    )
    pulled_run, read_run, pulled = _pulled_and_read(tmp_path, "legacy", script)
    assert pulled == [DECLINED] and pulled_run == read_run


# Partitions a chDB pull tags with ``multiIf`` (not one text or integer value each): a row's
# bound is the first whose conditions hold, each condition as lazy-plan's.
MULTI_IF_SOURCES = {
    "integer ranges and a NULL key": (
        "CREATE TABLE t (id INTEGER PRIMARY KEY, p INTEGER, v TEXT);"
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 40)"
        " INSERT INTO t SELECT i, CASE WHEN i % 9 = 0 THEN NULL ELSE (i * 7) % 23 - 5 END,"
        " 'v' || i FROM n;",
        4,
    ),
    "real values": (
        "CREATE TABLE t (id INTEGER PRIMARY KEY, p REAL, v TEXT);"
        "INSERT INTO t VALUES (1, 1.5, 'a'), (2, -0.25, 'b'), (3, 1.5, 'c'), (4, 1e300, 'd'),"
        " (5, NULL, 'e'), (6, 2.0, 'f'), (7, -0.25, 'g');",
        None,
    ),
    "text ranges": (
        "CREATE TABLE t (id INTEGER PRIMARY KEY, p TEXT, v REAL);"
        "INSERT INTO t VALUES (1, 'b', 1.0), (2, 'a''b', 2.0), (3, 'z', 3.0), (4, '', 4.0),"
        " (5, 'ü', 5.0), (6, 'b', 6.0), (7, NULL, 7.0), (8, 'B', 8.0);",
        2,
    ),
}


@pytest.mark.parametrize("path", FILE_PATHS)
@pytest.mark.parametrize("shape", MULTI_IF_SOURCES)
def test_a_chdb_pull_tags_other_partitions_by_their_conditions_exactly(
    tmp_path, path, shape, chdb_statements
):
    """Ranges, reals, a NULL key: chDB's pull tags each row with the first bound whose
    condition holds (``multiIf``), or, for integer ranges, with the range its key rounds down
    to (``roundDown``); it loads what Python's read loads, and counts each partition's rows
    as Python's read counts them."""
    script, partition_rows = MULTI_IF_SOURCES[shape]
    pulled_run, read_run, pulled = _pulled_and_read(
        tmp_path, path, script, "clickhouse", partition_rows
    )
    assert isinstance(pulled_run, tuple) and pulled_run == read_run
    [(files, counts)] = pulled
    assert sum(counts) == pulled_run[0] == sum(file.rows for file in files)
    assert len(counts) > 2
    pulls = [sql for sql in chdb_statements if sql.startswith("INSERT INTO FUNCTION file(")]
    looked_up = "roundDown(" if shape == "integer ranges and a NULL key" else "multiIf("
    assert len(pulls) == 1 and looked_up in pulls[0]


@pytest.mark.parametrize("path", FILE_PATHS)
def test_a_pull_that_fails_midway_leaves_no_file_and_python_reads_the_rows(
    tmp_path, path, monkeypatch
):
    """DuckDB fails after its first batch: its files are removed (the runtime's own would
    collide with one left behind), and the run loads every row once."""
    monkeypatch.setattr(duckdb_bulk, "_BATCH_ROWS", 16)
    monkeypatch.setattr(duckdb_bulk, "_GATHERED_ROWS", 16)  # files written as the scan goes
    real = duckdb_sink.write_tagged
    failed = [False]

    def fail_after_a_batch(conn: Any, pa: Any, *args: Any) -> Any:
        writers: list = []
        original = pa.ipc.new_stream

        class Failing:
            def __init__(self, sink: Any, schema: Any) -> None:
                self.inner = original(sink, schema)
                writers.append(self)

            def write_batch(self, batch: Any) -> None:
                self.inner.write_batch(batch)
                failed[0] = True
                raise duckdb.Error("injected scan failure")

            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc: Any) -> None:
                self.inner.close()

        monkeypatch.setattr(pa.ipc, "new_stream", Failing)
        try:
            return real(conn, pa, *args)
        finally:
            monkeypatch.setattr(pa.ipc, "new_stream", original)

    monkeypatch.setattr(duckdb_sink, "write_tagged", fail_after_a_batch)
    route = _route(tmp_path, "duckdb", lambda payload: None)
    try:
        assert route.runtime().run(route.spec(path)).rows_loaded == 120
        assert failed[0] and route.sink.target_calls == 1
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
        assert not _reading_ahead()  # the pull's scan stopped before its connection closed
    finally:
        route.real_store.close()


@pytest.mark.parametrize(
    ("path", "fails"),
    [
        *((path, "chdb") for path in ("legacy", "staged", "file-artifact")),
        *((path, fails) for path in ("legacy", "file-artifact") for fails in ("rewrite", "keep")),
    ],
)
def test_a_chdb_pull_that_fails_leaves_no_file_and_python_reads_the_rows(
    tmp_path, path, fails, monkeypatch
):
    """chDB's read of the source fails (into a file, or staged's into its stage), or
    rewriting its files does after the first batch, or keeping a full refresh's files does
    once they are linked at their paths: no pulled file is left in the work folder, and the
    run reads the rows through Python and loads each once."""
    from dpone_native_transfer.connectors.clickhouse import chdb_client, pulls
    from dpone_native_transfer.connectors.clickhouse import sink as ch_sink

    monkeypatch.setattr(pulls, "ARROW_BLOCK_ROWS", 7)  # the rewrite writes several batches
    if fails == "chdb":
        real_command = chdb_client.ChdbClient.command

        def command(self: Any, sql: str, params: Any = None) -> None:
            if sql.startswith("INSERT INTO") and " FROM sqlite(" in sql:
                raise RuntimeError("injected chDB failure")
            return real_command(self, sql, params)

        monkeypatch.setattr(chdb_client.ChdbClient, "command", command)
    elif fails == "keep":
        real_keep = ch_sink.kept

        def keep(raws: list[Path], paths: list[Path], bounds: int, *, table: str) -> Any:
            real_keep(raws, paths, bounds, table=table)
            assert all(path.exists() for path in paths)
            raise OSError(errno.EIO, "injected failure once kept")

        monkeypatch.setattr(ch_sink, "kept", keep)
    else:
        real_write = pulls._Cut._write

        def write(self: Any, rows: int) -> None:
            real_write(self, rows)
            raise OSError(errno.EIO, "injected write failure")

        monkeypatch.setattr(pulls._Cut, "_write", write)
    pulled: list[Any] = []
    left: list[list[str]] = []  # the work folder as the load begins

    def watch(payload: Any) -> None:
        if isinstance(payload, LoadFiles):
            left.append(sorted(p.name for p in payload.files[0].path.parent.iterdir()))
        else:
            left.append([])

    route = _route(tmp_path, "clickhouse", watch)
    _watch_pulls(route.sink.inner, pulled)
    try:
        strategy = "full_refresh" if fails == "keep" else "incremental_append"
        assert route.runtime().run(route.spec(path, strategy=strategy)).rows_loaded == 120
        assert pulled == [None] and route.sink.target_calls == 1
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
        [names] = left  # no scratch folder; a pulled file left would collide with Python's
        assert not any(name.startswith(".dpone-pull-") for name in names)
        if path == "legacy":
            assert [name for name in names if name.endswith(".arrows")] == ["legacy.arrows"]
    finally:
        route.real_store.close()


@pytest.mark.parametrize(("kind", "path"), PULLED)
@pytest.mark.parametrize("third", ["c d", "__DPONE_BOUND"])
def test_pulled_files_keep_odd_names_and_values_exact(tmp_path, kind, path, third):
    """Quotes, spaces and unicode in column names; NULL, empty and awkward values, a NULL
    partition: the pulled files load what the runtime's would. A column named as the pull's
    own tag is read through Python instead (as is a double quote in a name, into chDB: its
    sqlite() misreads it)."""
    source_path = tmp_path / "odd.db"
    quoted = "é'x" if kind == "clickhouse" else 'é""x'
    columns = f'"id" INTEGER PRIMARY KEY, "p q" TEXT, "{third}" TEXT, "{quoted}" REAL, b BLOB'
    rows = [
        (1, "a'b", "x", 1.5, b"\x00\xff"),
        (2, None, "", -0.0, b""),
        (3, "a'b", None, float("inf"), None),
        (4, "ü", "y", 2.0**53, b"z"),
    ]
    with sqlite3.connect(source_path) as db:
        db.execute(f"CREATE TABLE t ({columns})")
        db.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
    results, pulled = {}, []
    for pulling in (True, False):
        folder = tmp_path / ("pulled" if pulling else "python")
        folder.mkdir()
        route = _route(folder, kind, lambda payload: None, pulling=pulling)
        if kind == "clickhouse":  # partitioned by the source's partition column
            real = ClickHouseSink(folder / "target-chdb", "orders_copy", partition_by="p q")
            route.sink.inner.inner = real
        if pulling:
            _watch_pulls(route.sink.inner, pulled)
        route.source = SQLiteSource(str(source_path), "t", "p q")
        try:
            assert route.runtime().run(route.spec(path)).rows_loaded == 4
            results[pulling] = route.target_rows()
        finally:
            route.real_store.close()
    declined = kind != "sqlite" and third == "__DPONE_BOUND"
    assert pulled == [DECLINED] if declined else _succeeded(pulled[0])
    assert results[True] == results[False]
    assert [row[0] for row in results[True]] == [1, 2, 3, 4]


@pytest.mark.parametrize("path", FILE_PATHS)
def test_duckdb_loads_the_files_in_inserts_of_bounded_size(tmp_path, path, monkeypatch):
    """Load files go in INSERTs of at most ``_INSERT_ROWS`` rows (one INSERT of everything
    holds twice the memory): every row still once, and a file changed after it was written
    still fails the load before it commits."""
    monkeypatch.setattr(duckdb_bulk, "_BATCH_ROWS", 5)  # batches of 5, INSERTs of up to 3 of them
    monkeypatch.setattr(duckdb_bulk, "_GATHERED_ROWS", 5)  # a pull's files too
    monkeypatch.setattr(duckdb_bulk, "_INSERT_ROWS", 16)
    inserts: list[int] = []
    real = duckdb_bulk._insert_arrow
    monkeypatch.setattr(
        duckdb_bulk, "_insert_arrow", lambda *args: inserts.append(real(*args)) or inserts[-1]
    )
    tampering = [False]

    def tamper(payload: Any) -> None:
        if tampering[0]:
            with open(payload.files[0].path, "ab") as handle:
                handle.write(b"\0" * 8)

    route = _route(tmp_path, "duckdb", tamper)
    try:
        assert route.runtime().run(route.spec(path, run_id="r1")).rows_loaded == 120
        assert len(inserts) > 1 and max(inserts) <= 16 and sum(inserts) == 120
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
        route.add_rows(40)
        tampering[0] = True
        with pytest.raises(ArtifactInvalid):
            route.runtime().run(route.spec(path, run_id="r2"))
        assert len(route.target_ids()) == 120
    finally:
        route.real_store.close()


@pytest.mark.parametrize("path", ["legacy", "file-artifact"])
def test_a_sqlite_pull_that_fails_leaves_no_file_and_python_reads_the_rows(
    tmp_path, path, monkeypatch
):
    """SQLite fails after copying the rows (counting them by value): its files, the work file
    of a sorted scan too, are removed, and the run reads the rows through Python and loads
    each once."""
    from dpone_native_transfer.connectors.sqlite import pulls as sqlite_pulls

    def failing(*args: Any) -> Any:
        raise sqlite3.OperationalError("injected failure")

    monkeypatch.setattr(sqlite_pulls, "_stored_values", failing)
    pulled: list[Any] = []
    left: list[str] = []  # pulled files in the work folder as the load begins

    def watch(payload: Any) -> None:
        left.extend(p.name for p in payload.files[0].path.parent.glob("*.sqlite"))

    route = _route(tmp_path, "sqlite", watch)
    _watch_pulls(route.sink.inner, pulled)
    try:
        assert route.runtime().run(route.spec(path)).rows_loaded == 120
        assert pulled == [None] and route.sink.target_calls == 1 and left == []
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
    finally:
        route.real_store.close()


# Partition values SQLite keeps apart in an untyped column (5, '5' and 5.5 are three), and
# more of them than SQLite attaches at once: a load merges the files first. A text that is not
# UTF-8 is kept, as SQLite's own copy keeps it.
MIXED_PARTITIONS = ["1", "2", "3", "4", "6", "7", "8", "9", "10", "11", "5", "'5'", "5.5", "NULL"]
ODD_VALUES = ["CAST(x'ff41' AS TEXT)", "x'00ff'", "-0.0", "9223372036854775807", "'ü'", "NULL"]
EXACT = "SELECT id, typeof(p), quote(p), typeof(v), hex(v) FROM {} ORDER BY id"


def _mixed_route(tmp_path: Path, values: list[str], index: bool, before_load: Any) -> Route:
    """A SQLite target, and a source ``t(id, p, v)`` of 14 partitions (``MIXED_PARTITIONS``)
    whose rows are spread over the table, ``len(values) ** 2`` rows each; a read of a
    partition through Python fails the test."""
    source_path = tmp_path / "mixed.db"
    with sqlite3.connect(source_path) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, p, v)")
        for name, listed in (("parts", MIXED_PARTITIONS), ("odd", values)):
            rows = "), (".join(listed)
            db.execute(f"CREATE TEMP TABLE {name} AS SELECT * FROM (VALUES ({rows}))")
        db.execute(
            "INSERT INTO t SELECT NULL, parts.column1, odd.column1 FROM odd, parts, odd AS twice"
        )
        if index:
            db.execute("CREATE INDEX t_p ON t (p)")
    route = _route(tmp_path, "sqlite", before_load)
    route.source = Unread(str(source_path), "t", "p")
    return route


@pytest.mark.parametrize("odd_text", [False, True], ids=["utf8", "not-utf8"])
@pytest.mark.parametrize("index", [False, True], ids=["unindexed", "indexed"])
def test_sqlite_file_artifact_pulls_a_file_per_partition_and_loads_them_exactly(
    tmp_path, index, odd_text
):
    """One pulled file per partition (an unindexed source is read in one sorted scan, an
    indexed one a partition at a time), 14 of them: each value as the source stores it, each
    row once, no row read through Python, and no work file left behind."""
    values = [v for v in ODD_VALUES if odd_text or not v.startswith("CAST")]
    pulled: list[Any] = []
    loaded: list[Any] = []  # the load's files, and the files in the work folder, as it begins

    def watch(payload: Any) -> None:
        folder = payload.files[0].path.parent
        loaded.append(([file.path.name for file in payload.files], sorted(folder.iterdir())))

    route = _mixed_route(tmp_path, values, index, watch)
    _watch_pulls(route.sink.inner, pulled)
    try:
        result = route.runtime().run(route.spec("file-artifact"))
        [(files, counts)] = pulled
        assert len(files) == 14 and all(file.native for file in files)
        with sqlite3.connect(tmp_path / "mixed.db") as db:
            source_rows = db.execute(EXACT.format("t")).fetchall()
            per_value = db.execute("SELECT quote(p), count(*) FROM t GROUP BY p").fetchall()
        with sqlite3.connect(tmp_path / "target-sqlite") as db:
            assert db.execute(EXACT.format("orders_copy")).fetchall() == source_rows
        assert result.rows_loaded == len(source_rows) == 14 * len(values) ** 2
        assert sorted(counts) == sorted(rows for _, rows in per_value)
        [(names, work)] = loaded  # merged before the target call, the sorted scan's file gone
        assert names == ["merged.sqlite"]
        assert [p.name for p in work] == sorted([*(f.path.name for f in files), "merged.sqlite"])
    finally:
        route.real_store.close()


@pytest.mark.parametrize("changed", [0, 13])
def test_a_partition_file_changed_before_the_merge_fails_before_the_target(tmp_path, changed):
    """Bytes appended to one of 14 pulled files after its digest was checked, before the merge:
    SQLite would read the same rows, yet the merge refuses the file before the target call, so
    the route is not blocked, and the next run loads every row once."""
    names: list[str] = []

    def tamper(payload: Any, folder: Path) -> Any:
        if not names:  # the first run's files only
            names.append(payload.files[changed].path.name)
            with open(payload.files[changed].path, "ab") as handle:
                handle.write(b"\0" * 8)
        return merge(payload, folder)

    route = _mixed_route(tmp_path, ["1", "2"], False, lambda payload: None)
    merge = route.sink.inner.inner.merge_load_files
    route.sink.inner.merge_load_files = tamper
    try:
        with pytest.raises(ArtifactInvalid) as caught:
            route.runtime().run(route.spec("file-artifact", run_id="r1"))
        assert caught.value.diagnostics == {"file": names[0]}
        assert route.sink.target_calls == 0
        assert route.runtime().run(route.spec("file-artifact", run_id="r2")).rows_loaded == 56
        with sqlite3.connect(tmp_path / "target-sqlite") as db:
            assert db.execute("SELECT count(*) FROM orders_copy").fetchone() == (56,)
    finally:
        route.real_store.close()


def test_a_merged_file_changed_before_the_load_reads_it_loads_nothing(tmp_path):
    """The merged file itself, changed inside the target call: the load refuses it."""

    def tamper(payload: Any) -> None:
        with open(payload.files[0].path, "ab") as handle:
            handle.write(b"\0" * 8)

    route = _mixed_route(tmp_path, ["1", "2"], False, tamper)
    try:
        with pytest.raises(ArtifactInvalid) as caught:
            route.runtime().run(route.spec("file-artifact"))
        assert caught.value.diagnostics == {"file": "merged.sqlite"}
        with sqlite3.connect(tmp_path / "target-sqlite") as db:
            tables = db.execute("SELECT name FROM sqlite_master WHERE name = 'orders_copy'")
            assert tables.fetchall() == []
    finally:
        route.real_store.close()


def test_a_merge_that_fails_fails_before_the_target_and_the_next_run_loads_once(
    tmp_path, monkeypatch
):
    """The disk fills as the pulled files are merged: the attempt fails before the target
    call with the work folder's code (a raw ``sqlite3.OperationalError`` before 4be13b6; an
    error SQLite gives no code is ``EIO``), so the route is not blocked, and the next run
    loads every row once."""
    from dpone_native_transfer.connectors.sqlite import pulls as sqlite_pulls

    real, failing = sqlite_pulls._create_pulled, [True]

    def create(conn: Any, path: Path, *args: Any) -> None:
        if path.name == "merged.sqlite" and failing[0]:
            raise sqlite3.OperationalError("database or disk is full")
        real(conn, path, *args)

    monkeypatch.setattr(sqlite_pulls, "_create_pulled", create)
    route = _mixed_route(tmp_path, ["1", "2"], False, lambda payload: None)
    try:
        with pytest.raises(WorkFolderFailed) as caught:
            route.runtime().run(route.spec("file-artifact", run_id="r1"))
        assert caught.value.diagnostics["errno"] == "EIO"
        assert route.sink.target_calls == 0
        failing[0] = False
        assert route.runtime().run(route.spec("file-artifact", run_id="r2")).rows_loaded == 56
        with sqlite3.connect(tmp_path / "target-sqlite") as db:
            assert db.execute("SELECT count(*) FROM orders_copy").fetchone() == (56,)
    finally:
        route.real_store.close()


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_a_sorted_run_holding_a_value_of_no_partition_fails_the_pull(tmp_path, where, monkeypatch):
    """A row of the sorted scan whose value no bound names (a partition that appeared after
    planning, which the scan's own filter keeps out; here the scan is widened to let it in):
    wherever it sorts, the runs that would leave it out or hold it fail the pull, and Python
    reads the planned rows."""
    from dpone_native_transfer.connectors.sqlite import pulls as sqlite_pulls

    odd = {"first": "0", "middle": "region-001x", "last": "zz"}[where]
    pulled: list[Any] = []
    route = _route(tmp_path, "sqlite", lambda payload: None)
    _watch_pulls(route.sink.inner, pulled)
    real_pull, real_runs = route.sink.inner.pull_load_files, sqlite_pulls._sorted_runs

    def pull_after_a_new_partition(plan: Any, paths: Any) -> Any:
        with sqlite3.connect(route.source_path) as db:
            db.execute("INSERT INTO orders VALUES (999, ?, 1.0, 1)", (odd,))
        return real_pull(plan, paths)

    def widened(conn: Any, source: Any, plan: Any, path: Path, scan: tuple) -> Any:
        sql, params = scan
        return real_runs(
            conn, source, plan, path, (sql.replace(" WHERE ", " WHERE 1 OR ", 1), params)
        )

    route.sink.inner.pull_load_files = pull_after_a_new_partition
    monkeypatch.setattr(sqlite_pulls, "_sorted_runs", widened)
    try:
        assert route.runtime().run(route.spec("file-artifact")).rows_loaded == 120
        assert pulled == [None] and 999 not in route.target_ids()
    finally:
        route.real_store.close()


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
@pytest.mark.parametrize("folder", ["a*b", "a?b", "x{1,2}y"])
@pytest.mark.parametrize("made_by", ["artifact_dir", "TMPDIR"])
def test_chdb_loads_from_a_work_folder_whose_name_is_a_glob(
    tmp_path, path, folder, made_by, monkeypatch
):
    """chDB's file() reads a path with ``*``, ``?`` or ``{a,b}`` as a pattern: ``x{1,2}y``
    loaded nothing and reported every row (exit 0). Such a folder's rows now reach chDB as
    rows (JSON), in the artifact folder and in the system's temp folder alike."""
    route = Route(tmp_path, kind="clickhouse")
    options = {}
    if made_by == "TMPDIR":
        (tmp_path / folder).mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / folder))
    else:
        options["artifact_dir"] = str(tmp_path / folder)
    try:
        assert route.runtime().run(route.spec(path, **options)).rows_loaded == 120
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
    finally:
        route.real_store.close()


# Values chDB's sqlite() would read otherwise than the row paths carry them: lazy-plan's check
# finds them while chDB pulls, and the pull is thrown away.
CHDB_MISREADS = {
    "a blob in a TEXT column": ("TEXT", "x'41'", "'x'"),
    "a text boolean": ("BOOLEAN", "'true'", "1"),
    "a boolean of 2": ("BOOLEAN", "2", "0"),
    "a date with a time": ("DATE", "'2024-01-01 10:00:00'", "'2024-01-02'"),
}


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
@pytest.mark.parametrize("misread", CHDB_MISREADS)
def test_a_chdb_pull_of_a_value_it_misreads_is_thrown_away_and_python_reads(
    tmp_path, path, misread
):
    """The check runs beside the pull, so the pull is tried (not declined) and gives nothing:
    the same outcome as Python's read, no pulled file left in Python's way. Without the value,
    the pull is kept."""
    declared, odd, plain = CHDB_MISREADS[misread]
    create = f"CREATE TABLE t (id INTEGER PRIMARY KEY, p TEXT, v {declared});"
    for value, folder in ((odd, "odd"), (plain, "plain")):
        script = create + f"INSERT INTO t VALUES (1, 'a', {value}), (2, 'b', {plain});"
        pulled_run, read_run, pulled = _pulled_and_read(
            tmp_path / folder, path, script, kind="clickhouse"
        )
        assert pulled_run == read_run
        assert pulled == [None] if value == odd else _succeeded(pulled[0])


@pytest.mark.parametrize("meanwhile", ["nothing", "written"])
@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_a_source_error_in_the_check_beside_a_chdb_pull_fails_before_the_target(
    tmp_path, path, meanwhile, monkeypatch
):
    """The check's own failure (the source unreadable as it reads) is raised as it was, once
    chDB's pull ends: the run fails before the target, and the pulled files (or the stage
    chDB filled, for staged) are gone. When the source was written during the pull, the
    check's failure may be the write's (chDB's SQLite closing the file drops the check's
    lock: "malformed" under a writer failed 3 of 8 runs): the pull is thrown away, Python
    reads, and the run loads every row once."""
    from dpone_native_transfer.connectors.clickhouse import sink as ch_sink
    from dpone_native_transfer.errors import SourceInvalid

    error = SourceInvalid("source table 'orders' could not be read")
    written: list[bool] = []  # the pull's files or stage, as chDB's pull ended
    left: list[bool] = []  # and as the pull raised
    sink_class = ch_sink.ClickHouseSink
    staged = path == "staged"  # chDB fills the stage itself

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise error

    def stage_exists(sink: Any) -> bool:
        with sink.client() as client:
            return ch_sink._exists(client, sink._stage)

    real_pull, real_outer = (
        (sink_class._fill_stage, sink_class.pull_stage)
        if staged
        else (sink_class._pull, sink_class.pull_load_files)
    )

    def pull(self: Any, plan: Any, *paths: Any) -> Any:
        pulled = real_pull(self, plan, *paths)
        written.append(stage_exists(self) if staged else all(p.exists() for p in paths[0]))
        if meanwhile == "written":
            with contextlib.closing(sqlite3.connect(route.source_path)) as db, db:
                db.execute(_MOVE_A_ROW)
        return pulled

    def outer(self: Any, plan: Any, *paths: Any) -> Any:
        try:
            return real_outer(self, plan, *paths)
        finally:
            left.append(stage_exists(self) if staged else any(p.exists() for p in paths[0]))

    monkeypatch.setattr(ch_sink, "refuse_inexact_plan", refuse)
    monkeypatch.setattr(sink_class, "_fill_stage" if staged else "_pull", pull)
    monkeypatch.setattr(sink_class, "pull_stage" if staged else "pull_load_files", outer)
    route = _route(tmp_path, "clickhouse", lambda payload: None)
    _write_ahead_log(route.source_path)  # a writer waits out a rollback journal's readers
    try:
        if meanwhile == "written":
            assert route.runtime().run(route.spec(path)).rows_loaded == 120
            assert_rows_exactly_once(route.source_ids(), route.target_ids())
        else:
            with pytest.raises(SourceInvalid) as caught:
                route.runtime().run(route.spec(path))
            assert caught.value is error and route.sink.target_calls == 0
        assert written == [True] and left == [False]
    finally:
        route.real_store.close()


def _reading_ahead() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == "dpone-read-ahead"]


@pytest.mark.parametrize("depth", [1, 2, 5])
@pytest.mark.parametrize("count", [0, 1, 7, 200])
def test_read_ahead_hands_over_every_item_in_order_then_the_reads_own_error(depth, count):
    """What DuckDB's pull and load read in a thread reaches them whole: every batch in order,
    then the read's error as it was raised (the pull then fails and Python reads)."""
    failure = ValueError("the read failed")

    def items(fails: bool) -> Iterator[int]:
        yield from range(count)
        if fails:
            raise failure

    with read_ahead(items(False), depth) as taken:
        assert list(taken) == list(range(count))
    got: list[int] = []
    with pytest.raises(ValueError) as caught, read_ahead(items(True), depth) as taken:
        got.extend(taken)
    assert got == list(range(count)) and caught.value is failure
    assert not _reading_ahead()


@pytest.mark.parametrize("leaving", ["break", "error"])
def test_leaving_read_ahead_early_stops_its_read_before_the_caller_goes_on(leaving):
    """A pull that fails while writing closes its DuckDB connection next: the thread reading
    it must have ended by then, and it reads at most ``depth`` + 1 items past the caller."""
    produced: list[int] = []

    def endless() -> Iterator[int]:
        for number in itertools.count():
            produced.append(number)
            yield number

    with contextlib.suppress(RuntimeError), read_ahead(endless(), 2) as taken:
        for number in taken:
            if number == 3:
                if leaving == "error":
                    raise RuntimeError("the write failed")
                break
    assert not _reading_ahead()
    assert 4 <= len(produced) <= 4 + 2 + 1


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
@pytest.mark.parametrize("written", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_an_engine_pull_during_which_the_source_is_written_is_thrown_away(
    tmp_path, kind, path, written, monkeypatch
):
    """Neither engine reads the source in one SQLite snapshot: with a row moved to a new rowid
    meanwhile, DuckDB's scanner lost it and chDB's ``sqlite()`` loaded it twice, with exit 0
    (1-4 rows lost, 485 rows twice, of 2,000,000). A commit to the source during the pull now
    throws it away, and the runtime reads every row once; an untouched source keeps its
    pull."""
    owner, name = (duckdb_sink, "write_tagged") if kind == "duckdb" else (ClickHouseSink, "_pull")
    if kind == "clickhouse" and path == "staged":  # chDB stages the rows itself
        name = "_fill_stage"
    real = getattr(owner, name)

    def moving_a_row(*args: Any) -> Any:
        if written:  # as a writer would while the engine reads
            with contextlib.closing(sqlite3.connect(route.source_path)) as db, db:
                db.execute(
                    "UPDATE orders SET id = id + 1000000 WHERE id = (SELECT min(id) FROM orders)"
                )
        return real(*args)

    monkeypatch.setattr(owner, name, moving_a_row)
    route = _route(tmp_path, kind, lambda payload: None)
    _write_ahead_log(route.source_path)  # a writer waits out a rollback journal's readers
    pulled: list = []
    _watch_pulls(route.sink.inner, pulled)
    try:
        assert route.runtime().run(route.spec(path)).rows_loaded == 120
        assert len(pulled) == 1 and (pulled[0] is None) == written
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
    finally:
        route.real_store.close()


_MOVE_A_ROW = "UPDATE orders SET id = id + 1000000 WHERE id = (SELECT min(id) FROM orders)"
_WRITER = (
    "import sqlite3, sys\n"
    "with sqlite3.connect(sys.argv[1], timeout=20) as db:\n"
    f"    db.execute({_MOVE_A_ROW!r})\n"
)


@pytest.mark.parametrize(
    ("meanwhile", "indexed", "strategy"),
    [
        ("nothing", False, "incremental_append"),
        ("moved", False, "incremental_append"),
        ("moved", True, "incremental_append"),
        ("moved", False, "full_refresh"),
        ("locked", False, "incremental_append"),
    ],
)
def test_a_duckdb_lazy_plan_copy_the_source_moved_under_loads_dpones_read(
    tmp_path, meanwhile, indexed, strategy, monkeypatch
):
    """DuckDB's scanner reads the source in rowid ranges: a row moved past the last range
    during lazy-plan's copy was lost, with exit 0 (1-2 of 2,000,000 rows in every run). A
    commit to the source during the copy now rolls it back, and the same target call loads
    the rows as dpone reads them (in one scan, or one read per partition with an index):
    here a row moved after the copy, before its commit, is in the target as it is now.

    ``locked``: a writer in another process waiting for the lock of a rollback-journal
    source makes the scanner, which waits for no lock, fail (the route was blocked); dpone's
    read waits for the writer, and loads the row it moved."""
    real_watch, real_rows = duckdb_sink.watching_writes, duckdb_sink.plan_rows
    reads: list[int] = []

    @contextlib.contextmanager
    def watching(source: Any) -> Iterator[Callable[[], bool]]:
        with real_watch(source) as real_written:
            if meanwhile == "locked":  # another process's writer waits for the watch's lock
                writers.append(subprocess.Popen([sys.executable, "-c", _WRITER, route.source_path]))
                time.sleep(0.5)

            def written() -> bool:  # after the copy: as a writer would while DuckDB reads
                if meanwhile == "moved" and not reads:
                    with contextlib.closing(sqlite3.connect(route.source_path)) as db, db:
                        db.execute(_MOVE_A_ROW)
                return real_written()

            yield written

    def reading(*args: Any) -> Any:
        reads.append(1)
        return real_rows(*args)

    writers: list[subprocess.Popen] = []
    monkeypatch.setattr(duckdb_sink, "watching_writes", watching)
    monkeypatch.setattr(duckdb_sink, "plan_rows", reading)
    route = _route(tmp_path, "duckdb", lambda payload: None)
    if meanwhile != "locked":
        _write_ahead_log(route.source_path)  # a writer waits out a rollback journal's readers
    if indexed:
        with contextlib.closing(sqlite3.connect(route.source_path)) as db:
            db.execute("CREATE INDEX orders_region ON orders (region)")
    try:
        assert route.runtime().run(route.spec("lazy-plan", strategy=strategy)).rows_loaded == 120
        assert len(reads) == (meanwhile != "nothing")
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
        assert sorted(route.sink.inner.rows()) == sorted(route.source_rows())
        assert (min(route.target_ids()) > 1) == (meanwhile != "nothing")
    finally:
        for writer in writers:
            assert writer.wait(timeout=30) == 0
        route.real_store.close()


def _write_ahead_log(path: Path) -> None:
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA journal_mode = wal").fetchone()[0] == "wal"


@pytest.mark.parametrize("journal", ["delete", "wal"])
def test_watching_writes_holds_a_read_lock_on_the_source_until_its_check(tmp_path, journal):
    """The engine that reads the source is a second copy of SQLite in the process, and POSIX
    locks belong to the process: a close of any of dpone's connections to the file while the
    engine read dropped the engine's locks, and chDB then read rows a writer moved twice (274
    and 278 of 2,000,000 in 2 of 4 reads with connections opened and closed beside it; 0 in
    4 with a read transaction held; connectors.md). The watch's read transaction makes
    Python's SQLite defer those closes; it ends at the check, which still sees a commit
    made meanwhile."""
    path = tmp_path / "source.db"
    build_sample_source(path, rows=10)
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(f"PRAGMA journal_mode = {journal}")
    source = SQLiteSource(path, "orders", "region")
    writer = sqlite3.connect(path, timeout=0, isolation_level=None)
    try:
        with watching_writes(source) as written:
            if journal == "delete":  # a writer cannot commit under a reader's lock
                with pytest.raises(sqlite3.OperationalError, match="locked"):
                    writer.execute("BEGIN EXCLUSIVE")
            else:  # a checkpoint cannot pass the reader's snapshot
                writer.execute("UPDATE orders SET amount = 0 WHERE id = 1")
                busy, log, done = writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                assert busy == 1 and done < log
            assert written() == (journal == "wal")
            writer.execute("UPDATE orders SET amount = 1 WHERE id = 2")  # the lock is gone
            assert written()
    finally:
        writer.close()


class _InterruptedQuery:
    """A DuckDB connection whose next query is a real one of about 2 s that Ctrl-C
    interrupts. The SIGINT is sent every 0.2 s until the query ends: one that lands while
    DuckDB is not looking for it is lost, as a Ctrl-C would be. ``armed`` says whether the
    test's handler (``_ctrl_c``) raises; it stops before the sender does, so none lands
    elsewhere. The query is not endless: closing the connection after an interrupt waited,
    at times, for DuckDB's threads to finish it."""

    armed: ClassVar[list[bool]] = [False]

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, *args: Any) -> Any:
        stop = threading.Event()

        def send() -> None:
            while not stop.wait(0.2):
                os.kill(os.getpid(), signal.SIGINT)

        sender = threading.Thread(target=send)
        self.armed[0] = True
        sender.start()
        try:
            return self.conn.execute("SELECT count(*) FROM range(400000000) t(i) WHERE i % 7")
        finally:
            self.armed[0] = False
            stop.set()
            sender.join()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def _ctrl_c(signum: int, frame: Any) -> None:
    if _InterruptedQuery.armed[0]:
        raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("path", "read"), [("legacy", "write_tagged"), ("lazy-plan", "probe_plan_read")]
)
def test_a_ctrl_c_during_a_duckdb_read_of_the_source_stops_the_run(
    tmp_path, monkeypatch, path, read
):
    """DuckDB turns what a signal's handler raised during its query into RuntimeError("Query
    interrupted"). The pull took that for a failed read and read the rows again in Python:
    a SIGTERM'd run finished with exit 0. Lazy-plan's check took it for a value DuckDB
    cannot read (exit 2). Both now stop the run with it, before the target is touched."""
    real = getattr(duckdb_sink, read)
    monkeypatch.setattr(duckdb_sink, read, lambda conn, *rest: real(_InterruptedQuery(conn), *rest))
    route = _route(tmp_path, "duckdb", lambda payload: None)
    previous = signal.signal(signal.SIGINT, _ctrl_c)
    try:
        with pytest.raises(RuntimeError, match="^Query interrupted$"):
            route.runtime().run(route.spec(path))
        assert route.target_ids() == []
        monkeypatch.setattr(duckdb_sink, read, real)
        assert route.runtime().run(route.spec(path, run_id="run-2")).rows_loaded == 120
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
    finally:
        signal.signal(signal.SIGINT, previous)
        route.real_store.close()
