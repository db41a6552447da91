"""One scan for all partitions of an attempt (``OnePassReading``, ``paths/_one_pass.py``).

Without an index on the partition column, reading each partition on its own scans the
table once per partition. A SQLite source splits one scan instead; every partition must
get exactly the rows, in exactly the order, that its own read gives. Into SQLite, legacy
and staged let SQLite copy the rows itself (``FilePulling``,
``tests/connectors/test_native_files.py``): the sinks here cannot pull, so the runtime reads.
"""

from __future__ import annotations

import contextlib
import gc
import re
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers.routes import MovingRows, NotPulling, transfer_once
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpone_native_transfer import (
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.errors import WorkFolderFailed
from dpone_native_transfer.paths import _one_pass
from dpone_native_transfer.paths._one_pass import spooled_chunks
from dpone_native_transfer.testing import InjectedFault, RecordingSink

ROW_PATHS = ["legacy", "staged", "file-artifact"]


def make_table(path: Path, declared: str, rows: list[tuple[Any, Any]], *, index: bool) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE t (id INTEGER PRIMARY KEY, part {declared}, cur INTEGER)")
        conn.executemany("INSERT INTO t (part, cur) VALUES (?, ?)", rows)
        if index:
            conn.execute("CREATE INDEX t_part ON t (part)")
    conn.close()


def split(source: SQLiteSource, bounds: list[dict[str, Any]]) -> dict[int, list[tuple]] | None:
    scan = source.read_partitions(bounds, chunk_rows=7)
    if scan is None:
        return None
    got: dict[int, list[tuple]] = {}
    for index, rows in scan:
        assert 0 < len(rows) <= 7
        got.setdefault(index, []).extend(rows)
    return got


def each_read(source: SQLiteSource, bounds: list[dict[str, Any]]) -> dict[int, list[tuple]]:
    reads = {
        i: [r for chunk in source.read(b, chunk_rows=7) for r in chunk]
        for i, b in enumerate(bounds)
    }
    return {i: rows for i, rows in reads.items() if rows}


VALUES = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.sampled_from([0.5, -0.0, 2.0, 1e300]),
    st.sampled_from(["a", "A", "a ", "", "1", "01", "2.0", "é"]),
    st.sampled_from([b"a", b"\x00", b""]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    declared=st.sampled_from(["INTEGER", "TEXT", "REAL", "NUMERIC", "", "BLOB", "VARCHAR(3)"]),
    rows=st.lists(st.tuples(VALUES, st.integers(0, 9)), min_size=1, max_size=60),
    as_text=st.booleans(),
    window=st.sampled_from([None, (2, 7)]),
)
def test_one_scan_gives_each_partition_exactly_its_own_reads_rows(
    tmp_path_factory, declared, rows, as_text, window
):
    """Any declared type (so any affinity), mixed stored types, and bound values spelled as
    text (a retry's bounds come back from JSON): SQLite's ``=`` decides, not Python's."""
    path = tmp_path_factory.mktemp("one") / "s.db"
    make_table(path, declared, rows, index=False)
    source = SQLiteSource(str(path), "t", "part", "cur")
    cursor = {} if window is None else {"cursor_after": window[0], "cursor_upto": window[1]}
    values = source.partition_values()
    if as_text:
        values = [v if v is None or isinstance(v, bytes) else str(v) for v in values]
    bounds = [{"partition": value, **cursor} for value in dict.fromkeys(values)]
    got = split(source, bounds)
    if got is None:  # one value twice after the affinity conversion, or a single partition
        return
    assert got == each_read(source, bounds)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    declared=st.sampled_from(["INTEGER", "TEXT", "REAL", "NUMERIC", "", "BLOB", "VARCHAR(3)"]),
    rows=st.lists(st.tuples(VALUES, st.integers(0, 9)), min_size=1, max_size=60),
    edges=st.lists(VALUES.filter(lambda value: value is not None), min_size=1, max_size=5),
    dropped=st.integers(0, 6),
    null=st.booleans(),
    reverse=st.booleans(),
    window=st.sampled_from([None, (2, 7), 4]),
)
def test_one_scan_gives_each_key_range_exactly_its_own_reads_rows(
    tmp_path_factory, declared, rows, edges, dropped, null, reverse, window
):
    """Key ranges (``partition_by = "range"``) cut at any values, in SQLite's order, one of
    them left out, with the NULL key's partition or not, in any cursor window: SQLite's
    ``>=`` and ``<`` decide which range a row belongs to, for any affinity and mixed stored
    types, not Python's order."""
    path = tmp_path_factory.mktemp("ranges") / "s.db"
    make_table(path, declared, rows, index=False)
    with sqlite3.connect(path) as conn:
        arms = " UNION ".join("SELECT ? AS v" for _ in edges)
        edges = [row[0] for row in conn.execute(f"SELECT v FROM ({arms}) ORDER BY v", edges)]
    conn.close()
    source = SQLiteSource(str(path), "t", "part", "cur")
    lows, highs = [None, *edges], [*edges, None]
    bounds = [{"partition_from": a, "partition_below": b} for a, b in zip(lows, highs, strict=True)]
    if len(bounds) > 2:
        del bounds[dropped % len(bounds)]
    bounds += [{"partition": None}] if null else []
    if reverse:
        bounds.reverse()
    if isinstance(window, int):  # an edge's read: rows at or above the cursor's top
        bounds = [{**b, "cursor_from": window} for b in bounds]
    elif window is not None:
        bounds = [{**b, "cursor_after": window[0], "cursor_upto": window[1]} for b in bounds]
    got = split(source, bounds)
    if got is None:  # the edges, as the column stores them, overlap
        return
    assert got == each_read(source, bounds)


@pytest.fixture
def source(tmp_path: Path) -> SQLiteSource:
    rows = [(f"r{i % 5}" if i % 9 else None, i) for i in range(100)]
    make_table(tmp_path / "s.db", "TEXT", rows, index=False)
    return SQLiteSource(str(tmp_path / "s.db"), "t", "part", "cur")


def test_the_split_is_refused_where_reads_are_as_cheap_or_cannot_be_told_apart(tmp_path, source):
    values = [{"partition": v} for v in source.partition_values()]
    assert split(source, values) is not None
    assert split(source, values[:1]) is None  # one partition: one read is one scan
    assert split(source, [*values, {"partition": "r1"}]) is None  # a partition twice
    mixed = [{**values[0], "cursor_after": 3, "cursor_upto": 9}, *values[1:]]
    assert split(source, mixed) is None  # two cursor windows
    ranges = [{"partition_from": None, "partition_below": "r2"}, {"partition_from": "r2"}]
    assert split(source, ranges) == each_read(source, ranges)  # key ranges: one scan too
    null = {"partition": None}
    assert split(source, [*ranges, null]) == each_read(source, [*ranges, null])
    assert split(source, [*ranges, null, null]) is None  # the NULL key's partition twice
    assert split(source, [*ranges, {"partition": "r1"}]) is None  # ranges and a value
    assert split(source, [ranges[0], {**ranges[1], "cursor_from": 3}]) is None  # two windows
    overlapping = [{"partition_from": None, "partition_below": "r3"}, {"partition_from": "r2"}]
    assert split(source, overlapping) is None  # a row would belong to two
    edge = [{**v, "cursor_from": 3} for v in values]
    assert split(source, edge) == each_read(source, edge)  # one window for all: still exact
    make_table(tmp_path / "i.db", "TEXT", [("a", 1), ("b", 2)], index=True)
    indexed = SQLiteSource(str(tmp_path / "i.db"), "t", "part", "cur")
    assert split(indexed, [{"partition": "a"}, {"partition": "b"}]) is None  # seeks are cheap
    assert split(indexed, ranges) is None
    make_table(tmp_path / "c.db", "TEXT COLLATE NOCASE", [("a", 1), ("A", 2)], index=False)
    nocase = SQLiteSource(str(tmp_path / "c.db"), "t", "part", "cur")
    assert split(nocase, [{"partition": "a"}, {"partition": "b"}]) is None
    assert split(nocase, ranges) is None


def test_spooled_chunks_are_read_back_at_the_chunk_size(tmp_path):
    from dpone_native_transfer.artifacts import create_private, write_chunks

    with create_private(tmp_path / "p.scan") as handle:
        for block in ([(1,)], [(2,), (3,), (4,)], [(5,)], [(6,), (7,)]):
            write_chunks(handle, [block])
    assert list(spooled_chunks(tmp_path / "p.scan", 3)) == [
        [(1,), (2,), (3,)],
        [(4,), (5,), (6,)],
        [(7,)],
    ]


class CountingSource(SQLiteSource):
    """The real source, counting the extraction queries it runs (``... ORDER BY rowid``)."""

    scans = 0

    def _open(self) -> sqlite3.Connection:
        conn = super()._open()

        def seen(sql: str) -> None:
            if re.match(r'SELECT .* FROM ("main"\.)?"t" .*ORDER BY rowid$', sql):
                type(self).scans += 1

        conn.set_trace_callback(seen)
        return conn


def run(
    tmp_path: Path,
    path: str,
    *,
    index: bool,
    sink: Any = None,
    values: int = 20,
    partition_rows: int | None = None,
    strategy: str = "full_refresh",
) -> tuple[int, Any]:
    rows = [(i % values if i % 13 else None, i) for i in range(2000)]
    make_table(tmp_path / "s.db", "INTEGER", rows, index=index)
    CountingSource.scans = 0
    source = CountingSource(
        str(tmp_path / "s.db"), "t", "part", "cur", partition_rows=partition_rows
    )
    sink = sink or NotPulling(SQLiteSink(str(tmp_path / "target.db"), "t_copy"))
    result = transfer_once(tmp_path, source, sink, path=path, strategy=strategy)
    return result.rows_loaded, CountingSource.scans


@pytest.mark.parametrize("path", ROW_PATHS)
def test_an_unindexed_partition_column_is_scanned_once_and_every_row_lands_once(tmp_path, path):
    loaded, scans = run(tmp_path, path, index=False)
    assert (loaded, scans) == (2000, 1)
    with sqlite3.connect(tmp_path / "s.db") as src, sqlite3.connect(tmp_path / "target.db") as dst:
        assert sorted(dst.execute("SELECT * FROM t_copy")) == sorted(src.execute("SELECT * FROM t"))


@pytest.mark.parametrize("path", ROW_PATHS)
def test_an_indexed_partition_column_keeps_one_seek_per_partition(tmp_path, path):
    loaded, scans = run(tmp_path, path, index=True)
    assert (loaded, scans) == (2000, 21)  # 20 values and NULL


@pytest.mark.parametrize("path", ROW_PATHS)
@pytest.mark.parametrize(("open_files", "spooling_scans"), [(1000, 1), (100, 4), (150, 3)])
def test_hundreds_of_partitions_are_one_scan_and_spooled_within_the_open_file_limit(
    tmp_path, path, open_files, spooling_scans, monkeypatch
):
    """301 partitions (300 values and NULL): a path that takes the scan as it comes takes
    it whatever the count; spooling holds a file open per partition, so file-artifact
    scans at most ``open_files_allowed()`` partitions at a time (a group of one is its own
    read). Before, any path past 256 partitions read each on its own: a scan each without
    an index; and past ``open_files_allowed()`` file-artifact did, until 2026-12-04."""
    monkeypatch.setattr(_one_pass, "open_files_allowed", lambda: open_files)
    loaded, scans = run(tmp_path, path, index=False, values=300)
    assert (loaded, scans) == (2000, spooling_scans if path == "file-artifact" else 1)
    with sqlite3.connect(tmp_path / "s.db") as src, sqlite3.connect(tmp_path / "target.db") as dst:
        assert sorted(dst.execute("SELECT * FROM t_copy")) == sorted(src.execute("SELECT * FROM t"))


@pytest.mark.parametrize("strategy", ["full_refresh", "incremental_append"])
@pytest.mark.parametrize("path", ROW_PATHS)
def test_unindexed_key_ranges_are_one_scan_and_every_row_lands_once(tmp_path, path, strategy):
    """About 40 key ranges and the NULL key's partition: one scan, where a read a range
    took one each (1,000 ranges of 200,000 rows: 30 s for an append into SQLite)."""
    loaded, scans = run(
        tmp_path, path, index=False, values=2000, partition_rows=50, strategy=strategy
    )
    nulls = strategy == "incremental_append"  # and an append's read of NULL cursors
    assert (loaded, scans) == (2000, 1 + nulls)
    with sqlite3.connect(tmp_path / "s.db") as src, sqlite3.connect(tmp_path / "target.db") as dst:
        assert sorted(dst.execute("SELECT * FROM t_copy")) == sorted(src.execute("SELECT * FROM t"))


@pytest.mark.parametrize("path", ROW_PATHS)
def test_an_append_over_key_ranges_reads_the_cursor_top_in_one_scan_around_a_pull(tmp_path, path):
    """An engine's pull is read between two reads of the rows at the cursor's top
    (``read_by_engine``): each one scan, not a scan per range."""
    from dpone_native_transfer.connectors.duckdb import DuckDBSink

    sink = DuckDBSink(str(tmp_path / "target.duckdb"), "t_copy")
    loaded, scans = run(
        tmp_path,
        path,
        index=False,
        sink=sink,
        values=2000,
        partition_rows=50,
        strategy="incremental_append",
    )
    assert (loaded, scans, sink.row_count()) == (2000, 2 + 1, 2000)  # and NULL cursors


@pytest.mark.parametrize("path", ROW_PATHS)
def test_an_edge_partition_beside_key_ranges_leaves_them_one_scan(tmp_path, path):
    """Rows with a NULL cursor kept (``load_once``) make an edge partition with a window of
    its own beside the ranges: each window is one scan (``scan_by_window``), where the whole
    attempt was a read per range (1,000 ranges of 200,000 rows: 10 s instead of 1.2)."""
    rows = [(i % 2000, None if i % 97 == 0 else i) for i in range(2000)]
    make_table(tmp_path / "s.db", "INTEGER", rows, index=False)
    CountingSource.scans = 0
    source = CountingSource(str(tmp_path / "s.db"), "t", "part", "cur", partition_rows=50)
    sink = NotPulling(SQLiteSink(str(tmp_path / "target.db"), "t_copy"))
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))
    try:
        spec = TransferSpec(
            source=source,
            sink=sink,
            strategy="incremental_append",
            path=path,
            run_id="r",
            on_null_cursor="load_once",
        )
        assert TransferRuntime(store).run(spec).rows_loaded == 2000
        latest = list(store.list_latest(spec.route))
    finally:
        store.close()
    assert len(latest) > 40 and CountingSource.scans <= 3  # the ranges', the edge's, NULLs
    with sqlite3.connect(tmp_path / "s.db") as src, sqlite3.connect(tmp_path / "target.db") as dst:
        assert sorted(dst.execute("SELECT * FROM t_copy")) == sorted(src.execute("SELECT * FROM t"))
    plain = SQLiteSource(str(tmp_path / "s.db"), "t", "part", "cur")
    assert all(cp.rows_exported == plain.count(cp.partition_bounds) for cp in latest)


class FailingScan(CountingSource):
    def read_partitions(self, bounds: Any, *, chunk_rows: int = 10_000) -> Iterator[Any] | None:
        scan = super().read_partitions(bounds, chunk_rows=chunk_rows)
        assert scan is not None

        def failing() -> Iterator[Any]:
            yield next(scan)
            raise InjectedFault("the source failed in the middle of the scan")

        return failing()


def test_a_scan_that_fails_midway_fails_before_the_target_and_the_retry_loads_once(tmp_path):
    make_table(tmp_path / "s.db", "INTEGER", [(i % 4, i) for i in range(400)], index=False)
    sink = RecordingSink(NotPulling(SQLiteSink(str(tmp_path / "target.db"), "t_copy")))
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))

    def attempt(source: SQLiteSource, run_id: str) -> int:
        spec = TransferSpec(
            source=source, sink=sink, strategy="incremental_append", path="legacy", run_id=run_id
        )
        return TransferRuntime(store).run(spec).rows_loaded

    try:
        with pytest.raises(InjectedFault):
            attempt(FailingScan(str(tmp_path / "s.db"), "t", "part", "cur"), "r1")
        assert sink.target_calls == 0
        assert attempt(SQLiteSource(str(tmp_path / "s.db"), "t", "part", "cur"), "r2") == 400
        assert sink.target_calls == 1 and sink.inner.row_count() == 400
    finally:
        store.close()


class MovingSource(MovingRows, SQLiteSource):
    """Moves a row of each partition still to read into the one read, and one of it out."""

    def move(self, done: Any) -> None:
        writer = sqlite3.connect(self.path, timeout=0, isolation_level=None)  # never waits
        try:
            writer.execute(
                "UPDATE t SET part = ? WHERE id IN (SELECT min(id) FROM t"
                " WHERE part IS NOT ? GROUP BY part)",
                (done, done),
            )
            writer.execute(
                "UPDATE t SET part = 99 WHERE id = (SELECT min(id) FROM t WHERE part IS ?)",
                (done,),
            )
        finally:
            writer.close()


@pytest.mark.parametrize("strategy", ["incremental_append", "full_refresh"])
@pytest.mark.parametrize("path", ROW_PATHS)
@pytest.mark.parametrize("journal", ["wal", "delete"])
def test_rows_moved_between_partitions_during_an_attempt_are_read_as_they_were(
    tmp_path, path, strategy, journal
):
    """In WAL mode the attempt reads one snapshot (``Snapshotting``): rows a writer moves from
    a partition not yet read into one already read, and out of it, are neither lost nor
    loaded twice. In rollback-journal mode no read lock is held between reads: the writer,
    which never waits, still writes."""
    db = tmp_path / "source.db"
    make_table(db, "INTEGER", [(i % 4 if i % 9 else None, i) for i in range(40)], index=True)
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA journal_mode = {journal}")
    conn.close()
    source = MovingSource(str(db), "t", "part", "cur")
    sink = NotPulling(SQLiteSink(str(tmp_path / "target.db"), "t_copy"))
    result = transfer_once(tmp_path, source, sink, path=path, strategy=strategy)
    assert source.moved
    if journal == "wal":
        assert result.rows_loaded == 40
        assert sorted(row[0] for row in sink.inner.rows()) == list(range(1, 41))


class MovingPulls(SQLiteSink):
    """The real sink, its pulls recorded (``MovingConnection`` moves rows as they read)."""

    pulls: list[bool]

    def pull_load_files(self, plan: Any, paths: Any) -> Any:
        pulled = super().pull_load_files(plan, paths)
        self.pulls.append(pulled is not None)
        return pulled


class MovingConnection:
    """A pull's connection: after its first copy from the source, a writer moves every odd
    row to the next partition."""

    moved = False

    def __init__(self, conn: sqlite3.Connection, source: str) -> None:
        self.conn, self.source = conn, source

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)

    def execute(self, sql: str, *params: Any) -> Any:
        result = self.conn.execute(sql, *params)
        if sql.startswith("INSERT INTO") and not MovingConnection.moved:
            MovingConnection.moved = True
            writer = sqlite3.connect(self.source, timeout=0, isolation_level=None)
            try:
                writer.execute(  # NULL -> 0 -> 1 -> 2 -> 3 -> NULL: every partition moves
                    "UPDATE t SET part = CASE WHEN part IS NULL THEN 0 WHEN part = 3 THEN NULL"
                    " ELSE part + 1 END WHERE id % 2 = 1"
                )
            finally:
                writer.close()
        return result


@pytest.mark.parametrize("strategy", ["incremental_append", "full_refresh"])
@pytest.mark.parametrize("index", [True, False], ids=["indexed", "unindexed"])
@pytest.mark.parametrize("path", ROW_PATHS)
def test_rows_moved_while_sqlite_pulls_the_partitions_are_copied_as_they_were(
    tmp_path, monkeypatch, path, index, strategy
):
    """SQLite's pull (``FilePulling``) reads the source in one read transaction: file-artifact's
    file per partition too, and more partitions than ``open_files_allowed()`` in one pull.
    Each indexed partition copied in a transaction of its own, or a group of them in a pull
    of its own, lost and doubled the rows a writer moved between them meanwhile."""
    from dpone_native_transfer.connectors.sqlite import pulls as sqlite_pulls
    from dpone_native_transfer.paths import _files as runtime_paths

    db = tmp_path / "source.db"
    make_table(db, "INTEGER", [(i % 4 if i % 9 else None, i) for i in range(40)], index=index)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = wal")
    conn.close()
    real_pulling = sqlite_pulls._pulling

    @contextlib.contextmanager
    def moving_pulling(source: Any) -> Iterator[Any]:
        with real_pulling(source) as conn:
            yield MovingConnection(conn, str(db))

    monkeypatch.setattr(sqlite_pulls, "_pulling", moving_pulling)
    monkeypatch.setattr(runtime_paths, "open_files_allowed", lambda: 2)  # 5 partitions
    MovingConnection.moved = False
    sink = MovingPulls(str(tmp_path / "target.db"), "t_copy")
    sink.pulls = []
    source = SQLiteSource(str(db), "t", "part", "cur")
    result = transfer_once(tmp_path, source, sink, path=path, strategy=strategy)
    assert MovingConnection.moved and all(sink.pulls)
    assert sorted(row[0] for row in sink.rows()) == list(range(1, 41))
    assert result.rows_loaded == 40 and len(sink.pulls) == 1


class FailingPulls(SQLiteSink):
    """The real sink, whose engine's pulls all fail (read, then thrown away): dpone reads."""

    def pull_load_files(self, plan: Any, paths: Any) -> Any:
        for file in super().pull_load_files(plan, paths)[0]:
            file.path.unlink()
        return None


@pytest.mark.parametrize("path", ROW_PATHS)
def test_rows_moved_while_dpone_reads_after_a_failed_pull_are_read_as_they_were(tmp_path, path):
    """The snapshot ends before an engine reads the source (``read_by_engine``). When that
    read fails or is thrown away, dpone reads the rows itself in a snapshot begun again: it
    read them live, and a row a writer moved between two partitions' reads was lost or
    loaded twice."""
    db = tmp_path / "source.db"
    make_table(db, "INTEGER", [(i % 4 if i % 9 else None, i) for i in range(40)], index=True)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = wal")
    conn.close()
    source = MovingSource(str(db), "t", "part", "cur")
    sink = FailingPulls(str(tmp_path / "target.db"), "t_copy")
    result = transfer_once(tmp_path, source, sink, path=path, strategy="full_refresh")
    assert source.moved
    assert sorted(row[0] for row in sink.rows()) == list(range(1, 41))
    assert result.rows_loaded == 40


@pytest.mark.parametrize("pulls", [True, False], ids=["pull-failed", "not-pulling"])
def test_a_read_a_failure_left_unfinished_is_closed_quietly_after_the_snapshot(
    tmp_path, monkeypatch, pulls
):
    """A spool write that fails (a full disk) leaves the partition's read unfinished, held by
    the error's traceback, and it is closed when collected: after the attempt closed its
    snapshot, whose connection the read used. Closing its cursor then raised, and Python
    printed a traceback ("Exception ignored in ... _chunks") after the run's own error."""
    from dpone_native_transfer.paths import _files as runtime_paths

    db = tmp_path / "source.db"
    make_table(db, "INTEGER", [(i % 4, i) for i in range(40)], index=True)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = wal")
    conn.close()

    def full_disk(handle: Any, chunks: Any) -> Any:
        next(iter(chunks))
        raise OSError(28, "No space left on device")

    unraised: list[Any] = []
    monkeypatch.setattr(runtime_paths, "write_chunks", full_disk)
    monkeypatch.setattr(sys, "unraisablehook", unraised.append)
    source = SQLiteSource(str(db), "t", "part", "cur")
    target = str(tmp_path / "target.db")
    sink = FailingPulls(target, "t_copy") if pulls else NotPulling(SQLiteSink(target, "t_copy"))
    with pytest.raises(WorkFolderFailed) as failed:
        transfer_once(tmp_path, source, sink, path="file-artifact", strategy="full_refresh")
    gc.collect()
    assert unraised == []
    assert failed.value.diagnostics["errno"] == "ENOSPC" and failed.value.__cause__ is None
    assert failed.value.__suppress_context__  # the OSError's text names a file: not shown


def test_a_full_disk_under_sqlites_merge_is_the_work_folders_error_and_blocks_nothing(
    tmp_path, monkeypatch
):
    """file-artifact's files pulled into SQLite are merged before the target call (more than
    SQLite attaches at once). SQLite's own "database or disk is full" there was a raw
    ``sqlite3.OperationalError`` ("transfer failed with OperationalError", no code); it is
    ``native_transfer_work_folder_failed`` now, nothing is written and a rerun loads once."""
    from dpone_native_transfer.connectors.sqlite import pulls as sqlite_pulls

    db = tmp_path / "source.db"
    make_table(db, "INTEGER", [(i % 20, i) for i in range(400)], index=False)
    real_create = sqlite_pulls._create_pulled

    def tiny_merge(conn: Any, path: Path, schema: str, names: str) -> None:
        real_create(conn, path, schema, names)
        if path.name == "merged.sqlite":  # the disk is full after two pages
            conn.execute(f"PRAGMA {schema}.max_page_count = 2")

    monkeypatch.setattr(sqlite_pulls, "_create_pulled", tiny_merge)
    source = SQLiteSource(str(db), "t", "part", "cur")
    sink = SQLiteSink(str(tmp_path / "target.db"), "t_copy")
    with pytest.raises(WorkFolderFailed) as failed:
        transfer_once(tmp_path, source, sink, path="file-artifact", strategy="full_refresh")
    assert failed.value.diagnostics["errno"] == "ENOSPC"
    assert sink.row_count() == 0
    monkeypatch.setattr(sqlite_pulls, "_create_pulled", real_create)
    result = transfer_once(tmp_path, source, sink, path="file-artifact", strategy="full_refresh")
    assert result.rows_loaded == 400 and sink.row_count() == 400


class TieWritingSink(SQLiteSink):
    """The real sink; a writer commits a row at the top of the cursor as it is asked to pull,
    after the attempt's snapshot began and before the engine reads the source."""

    source_path = ""
    written = False

    def can_pull(self, plan: Any, files: int) -> bool:
        if not TieWritingSink.written:
            TieWritingSink.written = True
            with sqlite3.connect(self.source_path) as writer:
                writer.execute("INSERT INTO t (part, cur) VALUES (1, 9)")  # cur == the top
            writer.close()
        return super().can_pull(plan, files)


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
def test_a_row_written_at_the_top_before_an_engine_reads_the_source_is_loaded_once(tmp_path, path):
    """An engine reads the source as it is now: the snapshot ends before the reads of the top
    rows around the engine's (``read_by_engine``). Read from the snapshot, both agreed and the
    row written at the top was loaded, not recorded, and loaded again by the next run."""
    db = tmp_path / "source.db"
    make_table(db, "INTEGER", [(i % 3, i) for i in range(10)], index=False)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode = wal")
    conn.close()
    TieWritingSink.source_path, TieWritingSink.written = str(db), False
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))
    target = str(tmp_path / "target.db")
    if path == "lazy-plan":  # the target call reads the source: the write comes before it
        TieWritingSink.check_plan = lambda self, plan: self.can_pull(plan, 1) and None  # type: ignore[method-assign]
    try:
        for run, sink in (
            ("r1", TieWritingSink(target, "t_copy")),
            ("r2", SQLiteSink(target, "t_copy")),
        ):
            spec = TransferSpec(
                source=SQLiteSource(str(db), "t", "part", "cur"), sink=sink,
                strategy="incremental_append", path=path, run_id=run,
            )  # fmt: skip
            TransferRuntime(store).run(spec)
    finally:
        store.close()
        if path == "lazy-plan":
            del TieWritingSink.check_plan
    assert TieWritingSink.written
    assert sorted(row[0] for row in SQLiteSink(target, "t_copy").rows()) == list(range(1, 12))


class PlannedSource(SQLiteSource):
    """The real source, recording SQLite's plan of each statement it runs."""

    plans: list[tuple[str, str]] = []

    def _open(self) -> sqlite3.Connection:
        conn = super()._open()

        def seen(sql: str) -> None:
            if sql.startswith("SELECT") and "pragma_" not in sql:
                with sqlite3.connect(self.path) as probe:
                    found = probe.execute(f"EXPLAIN QUERY PLAN {sql}").fetchall()
                type(self).plans.append((sql, " | ".join(row[-1] for row in found)))

        conn.set_trace_callback(seen)
        return conn


@pytest.mark.parametrize("nullable", [False, True])
def test_the_cursor_edge_is_read_through_the_cursors_index(tmp_path, nullable):
    """The edge read asked for NULL cursors too; on a cursor declared NOT NULL that made SQLite
    scan the whole table instead of seeking the index (35 ms of a 1% merge into 1,000,000
    rows). A nullable cursor still gets its NULL rows."""
    declared = "INTEGER" if nullable else "INTEGER NOT NULL"
    with contextlib.closing(sqlite3.connect(tmp_path / "s.db")) as conn:
        conn.execute(f"CREATE TABLE t (id INTEGER PRIMARY KEY, part TEXT, cur {declared})")
        conn.executemany("INSERT INTO t VALUES (?, 'p', ?)", [(i, i % 500) for i in range(5000)])
        if nullable:
            conn.execute("INSERT INTO t VALUES (9999, 'p', NULL)")
        conn.execute("CREATE INDEX t_cur ON t (cur)")
        conn.commit()
    PlannedSource.plans = []
    source = PlannedSource(str(tmp_path / "s.db"), "t", "part", "cur")
    rows = [row for chunk in source.edge_rows(since=7, upto=8, nulls=True) for row in chunk]
    expected = {row for row in [(i, "p", i % 500) for i in range(5000)] if row[2] in (7, 8)}
    assert set(rows) == expected | ({(9999, "p", None)} if nullable else set())
    assert len(rows) == len(expected) + nullable
    (plan,) = [plan for sql, plan in PlannedSource.plans if "ORDER BY rowid" in sql]
    assert "SCAN t" not in plan and "USING INDEX t_cur" in plan, plan
