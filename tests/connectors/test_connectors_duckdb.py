"""DuckDB sink against real DuckDB files: types, atomic loads, staging, lazy plans,
and guarded transfers through the runtime on all four paths.

The guard's fault scenarios run on this sink in the conformance kit
(``tests/guard/test_conformance.py::TestKitDuckDB``, every path); what is here is DuckDB's own."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import hashlib
import os
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import duckdb
import pytest
from helpers.routes import PATHS, Route
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpone_native_transfer.connectors import SQLiteSink, SQLiteSource
from dpone_native_transfer.connectors.duckdb import DuckDBSink, duckdb_type
from dpone_native_transfer.connectors.duckdb import connect as duckdb_connect
from dpone_native_transfer.connectors.duckdb import sink as duckdb_sink_module
from dpone_native_transfer.errors import (
    ConfigInvalid,
    SourceInvalid,
    StoreTargetMismatch,
    TargetConstraintRefused,
    TargetRolledBack,
    TargetRowsMismatch,
    ValueUnsupported,
    driver_error,
)
from dpone_native_transfer.payloads import Column, LoadPlan, RowChunks
from dpone_native_transfer.testing import (
    assert_rows_exactly_once,
    build_sample_source,
)

COLUMNS = (
    Column("id", "INTEGER"),
    Column("region", "TEXT"),
    Column("amount", "REAL"),
    Column("updated_at", "INTEGER"),
)
ROWS = [
    (1, "north", 1.5, 101),
    (2, "south", 2.5, 102),
    (3, None, None, 103),
    (4, "north", 4.5, 104),
    (5, "O'Brien", 5.5, 105),
]


class Boom(Exception):
    pass


@pytest.fixture
def sink(tmp_path: Path) -> DuckDBSink:
    return DuckDBSink(tmp_path / "target.duckdb", "orders_copy")


@pytest.fixture
def source(tmp_path: Path) -> SQLiteSource:
    path = tmp_path / "source.db"
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, region TEXT, amount REAL,"
            " updated_at INTEGER)"
        )
        conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", ROWS)
    return SQLiteSource(path, "orders", "region", "updated_at")


def _query(sink: DuckDBSink, sql: str, params: list | None = None) -> list[tuple]:
    with contextlib.closing(duckdb.connect(sink.path)) as conn:
        return conn.execute(sql, params or []).fetchall()


def _tables(sink: DuckDBSink) -> list[str]:
    return [row[0] for row in _query(sink, "SELECT table_name FROM duckdb_tables() ORDER BY 1")]


def _chunks(rows=ROWS, *, replace: bool = False, size: int = 2) -> RowChunks:
    chunks = [rows[i : i + size] for i in range(0, len(rows), size)]
    return RowChunks(columns=COLUMNS, chunks=iter(chunks), replace=replace)


# --- types ------------------------------------------------------------------------------------


def test_target_types_follow_the_neutral_column_kinds(sink):
    columns = (
        Column("i", "INTEGER"),
        Column("s", "character varying(20)"),
        Column("r", "double precision"),
        Column("b", "BLOB"),
        Column("untyped", ""),
        Column("flag", "boolean"),
        Column("d", "date"),
        Column("ts", "timestamp without time zone"),
        Column("money", "numeric(12,2)"),
        Column("exact", "DECIMAL(38, 0)"),
        Column("wide", "numeric(40,2)"),
        Column("free", "numeric"),
    )
    row = (
        7,
        "text",
        0.25,
        b"\x00\xff",
        "raw",
        True,
        "2024-02-29",
        "2024-02-29 23:59:59.123456",
        "1234567890.15",
        "12345678901234567890123456789012345678",
        "1.5",
        "2.25",
    )
    assert sink.load(RowChunks(columns=columns, chunks=[[row]])) == 1
    types = _query(
        sink,
        "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'orders_copy'"
        " ORDER BY column_index",
    )
    assert types == [
        ("i", "BIGINT"),
        ("s", "VARCHAR"),
        ("r", "DOUBLE"),
        ("b", "BLOB"),
        ("untyped", "VARCHAR"),
        ("flag", "BOOLEAN"),
        ("d", "DATE"),
        ("ts", "TIMESTAMP"),
        ("money", "DECIMAL(12,2)"),
        ("exact", "DECIMAL(38,0)"),
        ("wide", "DOUBLE"),
        ("free", "DOUBLE"),
    ]
    assert sink.rows() == [
        (
            7,
            "text",
            0.25,
            b"\x00\xff",
            "raw",
            True,
            datetime.date(2024, 2, 29),
            datetime.datetime(2024, 2, 29, 23, 59, 59, 123456),
            decimal.Decimal("1234567890.15"),
            decimal.Decimal("12345678901234567890123456789012345678"),
            1.5,
            2.25,
        )
    ]


def test_a_hostile_declared_type_never_reaches_sql(sink):
    column = Column("a", "INTEGER); DROP TABLE x; --")
    assert duckdb_type(column) == "BIGINT"
    assert duckdb_type(Column("n", "numeric(5,9)")) == "DOUBLE"  # scale above precision
    sink.load(RowChunks(columns=(column,), chunks=[[(1,)]]))
    assert sink.rows() == [(1,)]


# --- legacy loads -----------------------------------------------------------------------------


def test_load_creates_missing_target_and_keeps_values(sink):
    assert not Path(sink.path).exists()
    assert sink.row_count() == 0 and sink.rows() == []
    assert sink.load(_chunks()) == len(ROWS)
    assert sink.rows() == ROWS
    assert sink.row_count() == len(ROWS)


def test_append_twice_doubles_rows_and_replace_replaces(sink):
    sink.load(_chunks())
    sink.load(_chunks())
    assert sink.row_count() == 2 * len(ROWS)
    assert sink.load(_chunks([(9, "west", 9.5, 109)], replace=True)) == 1
    assert sink.rows() == [(9, "west", 9.5, 109)]
    assert sink.load(RowChunks(columns=COLUMNS, chunks=[], replace=True)) == 0
    assert sink.row_count() == 0


def test_small_chunks_are_batched_and_large_loads_are_exact(sink):
    rows = [(i, f"r{i % 7}", i / 4, 1_000 + i) for i in range(25_003)]
    assert sink.load(_chunks(rows, size=16)) == len(rows)
    assert sink.rows() == rows
    assert sink.load(_chunks(rows, size=12_000)) == len(rows)
    assert sink.row_count() == 2 * len(rows)


@pytest.mark.parametrize("replace", [False, True])
def test_load_is_atomic_and_propagates_the_same_exception(sink, replace):
    sink.load(_chunks())
    boom = Boom()

    def failing():
        yield [(100, "x", 1.0, 1), (101, "x", 2.0, 2)]
        raise boom

    with pytest.raises(Boom) as caught:
        sink.load(RowChunks(columns=COLUMNS, chunks=failing(), replace=replace))
    assert caught.value is boom
    assert sink.rows() == ROWS


def test_load_rolls_back_on_base_exception(sink):
    sink.load(_chunks())

    def interrupted():
        yield [(100, "x", 1.0, 1)]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sink.load(RowChunks(columns=COLUMNS, chunks=interrupted(), replace=True))
    assert sink.rows() == ROWS


def test_failed_first_load_leaves_no_target_table(sink):
    def failing():
        yield [(1, "x", 1.0, 1)]
        raise Boom

    with pytest.raises(Boom):
        sink.load(RowChunks(columns=COLUMNS, chunks=failing()))
    assert sink.row_count() == 0
    assert _tables(sink) == []


def test_a_value_duckdb_refuses_is_named_by_its_kind_and_changes_nothing(sink):
    """The load is rolled back: known not applied (exit 2), named by DuckDB's exception
    class, never its message (it quotes the value)."""
    sink.load(_chunks())
    with pytest.raises(TargetConstraintRefused) as refused:
        sink.load(_chunks([(1, "x", 1.0, 1), ("not a number", "y", 2.0, 2)], size=1))
    assert refused.value.diagnostics["constraint"] == "ConversionException"
    assert isinstance(driver_error(refused.value), duckdb.ConversionException)
    assert "not a number" not in str(refused.value)
    assert sink.rows() == ROWS


def test_rows_of_the_wrong_width_are_refused(sink):
    with pytest.raises(ConfigInvalid):
        sink.load(RowChunks(columns=COLUMNS, chunks=[[(1, "a", 1.0)]]))
    with pytest.raises(ConfigInvalid):  # ragged rows: a coded error, not zip's ValueError
        sink.load(RowChunks(columns=COLUMNS, chunks=[[(1, "a", 1.0, 1), (2, "b")]]))
    assert sink.row_count() == 0


@pytest.mark.parametrize("table", ["__dpone_rows", "__dpone_rows_0", "main.__dpone_rows"])
def test_a_target_named_like_the_bulk_batch_loads_on_every_row_call(tmp_path, table):
    """Each Arrow batch is registered under a name of its own, never one a table can have."""
    sink = DuckDBSink(tmp_path / "target.duckdb", table)
    assert sink.load(_chunks()) == len(ROWS)
    assert sink.stage(_chunks()) == len(ROWS)
    assert sink.finalize_staged_load(replace=True) == len(ROWS)
    assert sink.rows() == list(ROWS)


# --- configuration errors ---------------------------------------------------------------------


def test_missing_folder_is_config_invalid_without_the_path(tmp_path):
    sink = DuckDBSink(tmp_path / "no-such-folder" / "target.duckdb", "orders_copy")
    with pytest.raises(ConfigInvalid) as caught:
        sink.load(_chunks())
    assert "no-such-folder" not in str(caught.value)
    assert caught.value.diagnostics == {"table": "orders_copy"}
    assert not (tmp_path / "no-such-folder").exists()


@pytest.mark.parametrize("table", ["", "bad\x00name", None])
def test_bad_table_names_are_refused(tmp_path, table):
    with pytest.raises(ConfigInvalid):
        DuckDBSink(tmp_path / "t.duckdb", table)


def test_in_memory_databases_and_payloads_without_columns_are_refused(tmp_path, sink):
    with pytest.raises(ConfigInvalid):
        DuckDBSink(":memory:", "t")
    with pytest.raises(ConfigInvalid):
        sink.load(RowChunks(columns=(), chunks=[]))


def test_repr_names_the_table_only(tmp_path):
    sink = DuckDBSink(tmp_path / "secret-folder" / "t.duckdb", "orders_copy")
    assert repr(sink) == "DuckDBSink(table='orders_copy')"


# --- staging ----------------------------------------------------------------------------------


def test_stage_then_finalize_moves_rows_and_drops_staging(sink):
    assert sink.staged_row_count() == 0
    assert sink.stage(_chunks()) == len(ROWS)
    assert sink.staged_row_count() == len(ROWS)
    assert sink.row_count() == 0
    assert sink.finalize_staged_load() == len(ROWS)
    assert sink.rows() == ROWS
    assert sink.staged_row_count() == 0
    assert _tables(sink) == ["orders_copy"]


def test_stage_recreates_staging_and_finalize_appends_or_replaces(sink):
    sink.load(_chunks())
    sink.stage(_chunks())
    assert sink.finalize_staged_load() == len(ROWS)
    assert sink.row_count() == 2 * len(ROWS)
    sink.stage(_chunks())
    sink.stage(_chunks([(9, "west", 9.5, 109)]))
    assert sink.staged_row_count() == 1
    assert sink.finalize_staged_load(replace=True) == 1
    assert sink.rows() == [(9, "west", 9.5, 109)]


def test_finalize_matches_columns_by_name_and_keeps_the_targets_definition(sink):
    with contextlib.closing(duckdb.connect(sink.path)) as conn:
        conn.execute(
            "CREATE TABLE orders_copy (updated_at BIGINT, id BIGINT, amount DOUBLE,"
            " region VARCHAR, extra VARCHAR DEFAULT 'kept')"
        )
    sink.stage(_chunks())
    assert sink.finalize_staged_load(replace=True) == len(ROWS)
    assert sink.rows() == [(u, i, a, r, "kept") for i, r, a, u in ROWS]


def test_finalize_without_stage_is_an_error_and_changes_nothing(sink):
    sink.load(_chunks())
    with pytest.raises(ConfigInvalid):
        sink.finalize_staged_load(replace=True)
    assert sink.rows() == ROWS


def test_failed_stage_keeps_the_previous_stage(sink):
    sink.stage(_chunks([(9, "west", 9.5, 109)]))

    def failing():
        yield [(1, "x", 1.0, 1)]
        raise Boom

    with pytest.raises(Boom):
        sink.stage(RowChunks(columns=COLUMNS, chunks=failing()))
    assert sink.staged_row_count() == 1


def test_discard_stage(sink):
    sink.discard_stage()
    assert not Path(sink.path).exists()
    sink.stage(_chunks())
    sink.discard_stage()
    assert sink.staged_row_count() == 0
    assert _tables(sink) == []
    sink.discard_stage()


# --- lazy plans -------------------------------------------------------------------------------


def test_load_plan_matches_a_row_chunks_load(source, tmp_path):
    bounds = tuple(
        {"partition": value, "cursor_after": 101, "cursor_upto": 104, "generation": 1}
        for value in source.partition_values(after=101, upto=104)
    )
    columns = source.describe().columns
    by_chunks = DuckDBSink(tmp_path / "chunks.duckdb", "t")
    by_plan = DuckDBSink(tmp_path / "plan.duckdb", "t")
    expected = by_chunks.load(
        RowChunks(columns=columns, chunks=(c for b in bounds for c in source.read(b)))
    )
    assert (
        by_plan.load_plan(LoadPlan(source=source, columns=columns, bounds=bounds)) == expected == 3
    )
    assert by_chunks.rows() == [ROWS[2], ROWS[3], ROWS[1]]  # partition by partition
    assert by_plan.rows() == [ROWS[1], ROWS[2], ROWS[3]]  # the window in one scan, table order


def test_load_plan_replace_null_partition_and_source_untouched(source, sink):
    before = hashlib.sha256(Path(source.path).read_bytes()).hexdigest()
    columns = source.describe().columns
    sink.load(_chunks())
    plan = LoadPlan(source=source, columns=columns, bounds=({"partition": None},), replace=True)
    assert sink.load_plan(plan) == 1
    assert sink.rows() == [ROWS[2]]
    assert hashlib.sha256(Path(source.path).read_bytes()).hexdigest() == before


def test_load_plan_is_atomic(source, sink):
    """A copy that fails is rolled back and the rows read by dpone instead (the scanner
    waits for no lock); that read fails too here, and the target is as it was."""
    columns = source.describe().columns
    sink.load(_chunks())
    bounds = ({"partition": "north"}, {"partition": "south"})
    vanished = (*columns, Column("vanished", "TEXT"))
    with pytest.raises(SourceInvalid):
        sink.load_plan(LoadPlan(source=source, columns=vanished, bounds=bounds, replace=True))
    assert sink.rows() == ROWS


def test_load_plan_over_another_source_is_config_invalid_before_the_target(sink):
    class OtherSource:
        table = "orders"

    plan = LoadPlan(source=OtherSource(), columns=COLUMNS, bounds=({"partition": "a"},))
    with pytest.raises(ConfigInvalid, match="DuckDB reads SQLite sources only"):
        sink.load_plan(plan)
    with pytest.raises(ConfigInvalid):
        sink.check_plan(plan)
    assert not Path(sink.path).exists()


def test_load_plan_with_missing_source_file_is_source_invalid(source, sink):
    columns = source.describe().columns
    os.unlink(source.path)
    with pytest.raises(SourceInvalid) as caught:
        sink.load_plan(LoadPlan(source=source, columns=columns, bounds=({"partition": "north"},)))
    assert os.path.abspath(source.path) in str(caught.value)  # shown: not secret (issue 13)
    assert "source.db" not in str(caught.value.diagnostics)
    assert not Path(sink.path).exists()


def test_a_scanner_read_failing_before_the_target_refuses_the_plan(source, sink, monkeypatch):
    """The check's probe reads with the scanner what the load will read; when that read fails
    although SQLite finds no misread value, the plan is refused, naming the columns read,
    and the target is never opened (a fault double wraps the real scanner connection)."""
    real = duckdb_connect.scratch_connection

    class FailingProbe:
        def __init__(self, conn):
            self._conn = conn

        def execute(self, sql, *args):
            if "count(" in sql or "decode(" in sql:
                raise duckdb.IOException("injected: the scanner cannot read the file")
            return self._conn.execute(sql, *args)

        def __getattr__(self, name):
            return getattr(self._conn, name)

    monkeypatch.setattr(duckdb_sink_module, "scratch_connection", lambda: FailingProbe(real()))
    plan = LoadPlan(
        source=source, columns=source.describe().columns, bounds=({"partition": "north"},)
    )
    with pytest.raises(ConfigInvalid) as refused:
        sink.check_plan(plan)
    assert refused.value.code == "native_transfer_config_invalid"
    # the rowid ``id`` is not read: SQLite itself keeps it an integer
    assert refused.value.diagnostics["columns"] == ["region", "amount", "updated_at"]
    assert "injected" not in str(refused.value)
    assert not Path(sink.path).exists()
    monkeypatch.setattr(duckdb_sink_module, "scratch_connection", real)
    sink.check_plan(plan)  # the real scanner reads it


def test_load_plan_with_bad_bounds_fails_before_the_target(source, sink):
    plan = LoadPlan(source=source, columns=COLUMNS, bounds=({"cursor_after": 1},))
    with pytest.raises(ConfigInvalid):
        sink.load_plan(plan)
    assert not Path(sink.path).exists()


def test_the_sqlite_scanner_loads_offline_in_a_fresh_process(tmp_path, source):
    """No network and no DuckDB extension folder: the extension comes from its wheel."""
    home = tmp_path / "empty-home"
    home.mkdir()
    script = (
        "from dpone_native_transfer.connectors import SQLiteSource\n"
        "from dpone_native_transfer.connectors.duckdb import DuckDBSink\n"
        "from dpone_native_transfer.payloads import LoadPlan\n"
        f"source = SQLiteSource({source.path!r}, 'orders', 'region')\n"
        f"sink = DuckDBSink({str(tmp_path / 'fresh.duckdb')!r}, 't')\n"
        "plan = LoadPlan(source=source, columns=source.describe().columns,"
        " bounds=({'partition': 'north'},))\n"
        "print(sink.load_plan(plan), sink.rows())\n"
    )
    env = {**os.environ, "HOME": str(home), "no_proxy": "*", "http_proxy": "http://127.0.0.1:9"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "2 [(1, 'north', 1.5, 101), (4, 'north', 4.5, 104)]"
    assert not (home / ".duckdb").exists()


def test_only_connections_reading_sqlite_skip_the_extension_signature_check(tmp_path, sink):
    """The scanner loads without DuckDB's signature check (75 ms a connection), so nothing
    else may load there: autoloading and autoinstalling stay off. A connection that only
    writes the target keeps the check."""
    settings = (
        "SELECT current_setting('allow_unsigned_extensions'),"
        " current_setting('autoload_known_extensions'),"
        " current_setting('autoinstall_known_extensions')"
    )
    reading = duckdb_connect.scanner_connection(str(tmp_path / "reading.duckdb"))
    try:
        assert reading.execute(settings).fetchone() == (True, False, False)
        assert reading.execute(
            "SELECT loaded FROM duckdb_extensions() WHERE extension_name = 'sqlite_scanner'"
        ).fetchone() == (True,)
    finally:
        reading.close()
    with sink._connect() as writing:
        assert writing.execute(settings).fetchone() == (False, False, False)


# --- awkward identifiers ----------------------------------------------------------------------


def test_identifiers_with_spaces_quotes_and_question_marks(tmp_path):
    path = tmp_path / "odd name's.db"
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute(
            'CREATE TABLE "my ""odd"" table" ("the id" INTEGER, "part ""p""?" TEXT,'
            ' "cur\'sor" INTEGER)'
        )
        conn.executemany(
            'INSERT INTO "my ""odd"" table" VALUES (?, ?, ?)',
            [(1, "a b", 5), (2, 'x"y', 6), (3, "a b", 7)],
        )
    source = SQLiteSource(path, 'my "odd" table', 'part "p"?', "cur'sor")
    columns = source.describe().columns
    sink = DuckDBSink(tmp_path / "target dir's.duckdb", 'copy "of" it?')
    bounds = tuple({"partition": value} for value in source.partition_values())
    assert sink.load_plan(LoadPlan(source=source, columns=columns, bounds=bounds)) == 3
    sink.stage(RowChunks(columns=columns, chunks=source.read({"partition": "a b"})))
    assert sink.finalize_staged_load() == 2
    assert sink.rows() == [
        (1, "a b", 5), (2, 'x"y', 6), (3, "a b", 7), (1, "a b", 5), (3, "a b", 7)
    ]  # fmt: skip


# --- guarded transfers through the runtime ----------------------------------------------------


@pytest.fixture
def duck_route(tmp_path: Path):
    made = Route(tmp_path, kind="duckdb")
    yield made
    made.real_store.close()


def test_a_duckdb_error_before_the_commit_rolls_back_and_blocks_nothing(duck_route, monkeypatch):
    """A DuckDB error inside the load, before its COMMIT (a full disk, out of memory: here
    the real insert, then an injected ``IOException``), blocked the route for an operator;
    DuckDB writes a transaction only at its COMMIT. Now ``TargetRolledBack``: nothing
    applied, not blocked, and the next run loads every row once."""

    def full_disk(insert):
        def inserted(*args, **kwargs):
            insert(*args, **kwargs)
            raise duckdb.IOException("No space left on device")

        return inserted

    with monkeypatch.context() as patched:  # the rows' insert and the spool's
        for name in ("insert_rows", "insert_files"):
            patched.setattr(duckdb_sink_module, name, full_disk(getattr(duckdb_sink_module, name)))
        with pytest.raises(TargetRolledBack, match="before its commit") as failed:
            duck_route.runtime().run(duck_route.spec("legacy"))
    assert failed.value.applied is False
    assert failed.value.diagnostics["cause"] == "IOException"
    assert duck_route.sink.inner.rows() == []
    assert duck_route.runtime().run(duck_route.spec("legacy", run_id="run-2")).rows_loaded == 120
    assert_rows_exactly_once(duck_route.source_ids(), duck_route.target_ids())


class _FailingBegin:
    """A real connection whose ``BEGIN`` fails (out of memory as the transaction starts)."""

    def __init__(self, conn) -> None:
        self._conn = conn

    def execute(self, sql, *args):
        if sql.startswith("BEGIN"):
            raise duckdb.OutOfMemoryException("could not allocate")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self._conn, name)


def test_a_duckdb_error_at_begin_rolls_back_and_blocks_nothing(duck_route, monkeypatch):
    """No transaction began, so nothing can have been applied: ``TargetRolledBack``, and the
    next run loads every row once without an operator."""
    real = DuckDBSink._connect

    @contextlib.contextmanager
    def failing(self, **kwargs):
        with real(self, **kwargs) as conn:
            yield _FailingBegin(conn)

    with monkeypatch.context() as patched:
        patched.setattr(DuckDBSink, "_connect", failing)
        with pytest.raises(TargetRolledBack, match="before its commit") as failed:
            duck_route.runtime().run(duck_route.spec("legacy"))
    assert failed.value.applied is False
    assert failed.value.diagnostics["cause"] == "OutOfMemoryException"
    assert duck_route.runtime().run(duck_route.spec("legacy", run_id="run-2")).rows_loaded == 120
    assert_rows_exactly_once(duck_route.source_ids(), duck_route.target_ids())


@pytest.mark.parametrize("table", ["tables", "databases", "s.orders_copy"])
def test_a_target_named_as_duckdb_reads_a_keyword_loads_twice_exactly(tmp_path, table):
    """``DESCRIBE "tables"`` is DuckDB's ``SHOW TABLES``, even quoted: a target table named
    ``tables`` loaded once, then failed its schema check (exit 1). Existence is probed by
    the name since this round; a schema-qualified name too."""
    route = Route(tmp_path, sink=DuckDBSink(tmp_path / "target.duckdb", table))
    try:
        route.runtime().run(route.spec("legacy"))
        route.add_rows(10)
        assert route.runtime().run(route.spec("legacy", run_id="run-2")).rows_loaded == 10
        assert sorted(route.sink.inner.rows()) == route.source_rows()
    finally:
        route.real_store.close()


@pytest.mark.parametrize("table", ["orders_copy", "s.orders_copy"])
def test_a_view_of_the_targets_name_is_refused_before_the_target_even_broken(tmp_path, table):
    """A view whose table was dropped does not resolve: taken for a missing table, the load
    created none beside it and failed inside the target call, the route blocked. Listed,
    it is a view, refused before the target (exit 2) as a working one is."""
    sink = DuckDBSink(tmp_path / "target.duckdb", table)
    with contextlib.closing(duckdb.connect(str(sink.path))) as conn:
        conn.execute("CREATE SCHEMA s; CREATE TABLE base (x INTEGER)")
        conn.execute(f"CREATE VIEW {table} AS SELECT x FROM base; DROP TABLE base")
    route = Route(tmp_path, sink=sink)
    try:
        for run_id in ("run-1", "run-2"):  # the second is refused alike, not blocked
            with pytest.raises(TargetRowsMismatch) as refused:
                route.runtime().run(route.spec("legacy", run_id=run_id))
            assert refused.value.applied is False
        assert route.sink.target_calls == 0
    finally:
        route.real_store.close()


@pytest.mark.parametrize("name", ["_dpone_ledger", "_DPONE_FENCE", "_dpone_rejects"])
@pytest.mark.parametrize("engine", ["duckdb", "sqlite"])
def test_a_view_named_as_dpones_own_table_is_refused_before_the_target(tmp_path, engine, name):
    """A view taking the ledger's, the fence's or the rejects' name failed every load inside
    the target call, "a retry may succeed" each time; refused before the target now (exit 2),
    naming it."""
    path = tmp_path / f"target.{engine}"
    if engine == "duckdb":
        sink: Any = DuckDBSink(path, "orders_copy")
        with contextlib.closing(duckdb.connect(str(path))) as conn:
            conn.execute(f"CREATE VIEW {name} AS SELECT 1 AS x")
    else:
        sink = SQLiteSink(str(path), "orders_copy")
        with contextlib.closing(sqlite3.connect(path)) as conn:
            conn.execute(f"CREATE VIEW {name} AS SELECT 1 AS x")
    route = Route(tmp_path, sink=sink)
    try:
        for run_id in ("run-1", "run-2"):
            with pytest.raises(ConfigInvalid, match="drop or rename it") as refused:
                route.runtime().run(route.spec("legacy", run_id=run_id))
            assert refused.value.diagnostics == {"table": "orders_copy", "name": name}
        assert route.sink.target_calls == 0
    finally:
        route.real_store.close()


@pytest.mark.parametrize("name", ["_dpone_ledger", "_DPONE_FENCE", "_dpone_rejects"])
def test_reads_of_dpones_own_tables_refuse_a_view_of_their_name_by_name(tmp_path, name):
    """The ledger, fence and rejects are read by their own query outside a transaction (a
    missing table reads as empty); a view of such a name cannot be read as one and is
    refused naming it, as ``check_target`` refuses it, not a driver's error."""
    sink = DuckDBSink(tmp_path / "target.duckdb", "orders_copy")
    with contextlib.closing(duckdb.connect(str(sink.path))) as conn:
        conn.execute("CREATE TABLE orders_copy (id INTEGER)")
    assert (sink.read_ledger(), sink.fence_epoch(), sink.read_rejects()) == ([], 0, [])
    with contextlib.closing(duckdb.connect(str(sink.path))) as conn:
        conn.execute(f"CREATE VIEW {name} AS SELECT 1 AS x")
    reading = {"_dpone_ledger": ["read_ledger", "fence_epoch"],  # the fence's floor
               "_DPONE_FENCE": ["fence_epoch"], "_dpone_rejects": ["read_rejects"]}  # fmt: skip
    for read in reading[name]:
        with pytest.raises(ConfigInvalid, match="drop or rename it") as refused:
            getattr(sink, read)()
        assert refused.value.diagnostics == {"table": "orders_copy", "name": name}


def test_a_view_over_a_real_ledger_is_refused_when_read_not_taken_for_the_ledger(duck_route):
    """``guard verify`` read a view named ``_dpone_ledger`` over the real ledger and said
    "agree", while a run refused the view (``check_target``)."""
    duck_route.runtime().run(duck_route.spec("legacy"))
    with contextlib.closing(duckdb.connect(str(duck_route.sink.inner.path))) as conn:
        conn.execute("ALTER TABLE _dpone_ledger RENAME TO kept_ledger")
        conn.execute("CREATE VIEW _dpone_ledger AS SELECT * FROM kept_ledger")
    with pytest.raises(ConfigInvalid, match="drop or rename it"):
        duck_route.sink.inner.read_ledger()


@pytest.mark.parametrize(
    "made",
    [
        "CREATE TABLE _dpone_fence (target_table VARCHAR, x INTEGER)",
        "CREATE TABLE _dpone_fence (target_table VARCHAR, epoch VARCHAR);"
        " INSERT INTO _dpone_fence VALUES ('orders_copy', 'zzz')",
    ],
    ids=["other-columns", "not-a-number"],
)
def test_a_fence_table_dpone_did_not_make_is_refused_before_the_target(tmp_path, made):
    """A ``_dpone_fence`` of other columns, or an epoch that is not a number, failed every
    run with the driver's error or a ValueError, exit 1, "a retry may succeed". Refused
    before the target now (exit 3, ``own_table_unreadable``), naming it."""
    sink = DuckDBSink(tmp_path / "target.duckdb", "orders_copy")
    with contextlib.closing(duckdb.connect(str(sink.path))) as conn:
        conn.execute(made)
    route = Route(tmp_path, sink=sink)
    try:
        with pytest.raises(StoreTargetMismatch) as refused:
            route.runtime().run(route.spec("legacy"))
        assert refused.value.diagnostics == {
            "mismatch": "own_table_unreadable",
            "name": "_dpone_fence",
        }
        assert route.sink.target_calls == 0
    finally:
        route.real_store.close()


def test_a_ledger_with_a_column_added_by_hand_is_written_and_a_bad_rejects_table_refused(
    duck_route,
):
    """The ledger row is inserted by column name: a column added by hand failed every load
    inside the target call, exit 1, for ever. A rejects table of other columns is refused
    by name when read (``rejects show``), not a driver's error."""
    duck_route.runtime().run(duck_route.spec("legacy"))
    with contextlib.closing(duckdb.connect(str(duck_route.sink.inner.path))) as conn:
        conn.execute("ALTER TABLE _dpone_ledger ADD COLUMN note VARCHAR")
        conn.execute("CREATE TABLE _dpone_rejects (a INTEGER)")
    build_sample_source(duck_route.source_path, rows=30, start_id=121)
    second = duck_route.runtime().run(duck_route.spec("legacy", run_id="run-2"))
    assert second.rows_loaded == 30
    assert sorted(duck_route.sink.inner.rows()) == duck_route.source_rows()
    assert len(duck_route.sink.inner.read_ledger()) == 2
    with pytest.raises(StoreTargetMismatch) as refused:
        duck_route.sink.inner.read_rejects()
    assert refused.value.diagnostics["name"] == "_dpone_rejects"


@pytest.mark.parametrize("strategy", ["incremental_append", "full_refresh"])
@pytest.mark.parametrize("path", PATHS)
def test_guarded_transfers_give_exactly_the_source_rows(duck_route, path, strategy):
    first = duck_route.runtime().run(duck_route.spec(path, strategy=strategy))
    assert first.rows_loaded == 120 and len(first.committed_partition_ids) == 4
    assert sorted(duck_route.sink.inner.rows()) == duck_route.source_rows()

    build_sample_source(duck_route.source_path, rows=30, start_id=121)
    second = duck_route.runtime().run(duck_route.spec(path, run_id="run-2", strategy=strategy))
    assert second.rows_loaded == (30 if strategy == "incremental_append" else 150)
    assert sorted(duck_route.sink.inner.rows()) == duck_route.source_rows()
    assert_rows_exactly_once(duck_route.source_ids(), duck_route.target_ids())
    assert duck_route.sink.target_calls == 2
    assert duck_route.sink.inner.staged_row_count() == 0


def test_load_plan_selects_exactly_the_planned_partitions_of_each_window(tmp_path):
    path = tmp_path / "parts.db"
    rows = [(1, "a", 10), (2, "c", 11), (3, None, 12), (4, "a", 13), (5, "c", 14), (6, "b", 15)]
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("CREATE TABLE t (id INTEGER, part TEXT, at INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    source = SQLiteSource(path, "t", "part", "at")
    columns = source.describe().columns
    sink = DuckDBSink(tmp_path / "t.duckdb", "t")
    early = {"cursor_after": 10, "cursor_upto": 13}
    late = {"cursor_after": 13, "cursor_upto": 15}
    bounds = (
        {"partition": None, **early}, {"partition": "c", **early},
        {"partition": "b", **late}, {"partition": "c", **late},
    )  # fmt: skip
    assert sink.load_plan(LoadPlan(source=source, columns=columns, bounds=bounds)) == 4
    assert sink.rows() == [(2, "c", 11), (3, None, 12), (5, "c", 14), (6, "b", 15)]
    values = ({"partition": "a"}, {"partition": "b"})
    assert (
        sink.load_plan(LoadPlan(source=source, columns=columns, bounds=values, replace=True)) == 3
    )
    assert sink.rows() == [(1, "a", 10), (4, "a", 13), (6, "b", 15)]


_COMMON_OFFSETS = ("+05:30", "-08:00", "Z", "", "+14:00", "-00:30", "+00")
_ODD_OFFSETS = ("+0530", "+05:30:15")  # Python reads them; the bulk carrier leaves them


def _offset_rows(rows: int) -> list[tuple]:
    """Instants with offsets: the first half in the forms carried a column at a time, the
    second with some a bulk carrier leaves to the per-value one (chunks holding them go
    value by value); chunks of 1,500 rows, above the bulk carriers' 1,000."""
    made = []
    for n in range(rows):
        forms = _COMMON_OFFSETS + (_ODD_OFFSETS if n >= rows // 2 else ())
        offset = forms[(n // 2) % len(forms)]
        sep = "T" if n % 3 else " "
        fraction = f".{n % 1000:03d}" if n % 5 else ""
        at = f"2013-{1 + n % 12:02d}-{1 + n % 28:02d}{sep}{n % 24:02d}:{n % 60:02d}:07{fraction}"
        made.append((n, f"p{n % 2}", at + offset, at + offset, f"2013-{1 + n % 12:02d}-15"))
    return made


def _utc(text: str) -> datetime.datetime:
    parsed = datetime.datetime.fromisoformat(text)
    if parsed.tzinfo is None:
        return parsed
    return parsed.astimezone(datetime.UTC).replace(tzinfo=None)


@pytest.mark.parametrize("path", PATHS)
def test_instants_with_offsets_in_bulk_reach_duckdb_as_the_same_utc_instants(tmp_path, path):
    """Issue 47 item 4: 3,000 rows of instants with offsets (carried a column at a time) and
    dates (checked a column at a time) land as the same UTC instants on every path; one
    instant before year 1 in UTC is refused before the target, as value by value."""
    source = tmp_path / "offsets.db"
    rows = _offset_rows(3_000)
    with contextlib.closing(sqlite3.connect(source)) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, p TEXT, at TIMESTAMP,"
                   " tz TIMESTAMP WITH TIME ZONE, d DATE)")  # fmt: skip
        db.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
        db.commit()
    sink = DuckDBSink(tmp_path / "t.duckdb", "t_copy")
    route = Route(tmp_path / "run", source=SQLiteSource(source, "t", "p"), sink=sink)
    try:
        result = route.runtime().run(route.spec(path, strategy="full_refresh", chunk_rows=1_500))
        assert result.rows_loaded == len(rows)
        with contextlib.closing(duckdb.connect(str(tmp_path / "t.duckdb"))) as conn:
            got = conn.execute(
                "SELECT id, \"at\", timezone('UTC', tz), d FROM t_copy ORDER BY id"
            ).fetchall()
        assert got == [
            (n, _utc(at), _utc(tz), datetime.date.fromisoformat(d)) for n, _, at, tz, d in rows
        ]
        with contextlib.closing(sqlite3.connect(source)) as db:
            db.execute("UPDATE t SET tz = '0001-01-01 00:30:00+01:00' WHERE id = 2999")
            db.commit()
        with pytest.raises(ValueUnsupported):
            route.runtime().run(route.spec(path, "run-2", strategy="full_refresh"))
        assert route.sink.target_calls == 1  # the refusal came before the target
    finally:
        route.real_store.close()


# Values dpone's statements hand DuckDB, and edges of each type binding distinguishes.
_INLINED = [
    None, True, False, 0, -1, 2**31 - 1, 2**31, -(2**31) - 1, 2**63 - 1, 2**63, 2**64 - 1,
    2**64, -(2**63) - 1, 2**127 - 1, -(2**127), 0.0, -0.0, 1.5, 0.1, 1e308, 5e-324,
    float("inf"), float("-inf"), "", "O'Brien", "it''s", "a?b", '"quoted"', "\\x41", "é 名",
    b"", bytes(range(256)), bytearray(b"'?\\"), ["a", "O'Brien", None], [1, 2**40, None],
    [1.5, 2, 3], [True, None, False], [b"x", b"'"], [2**63, -1],
]  # fmt: skip


@pytest.mark.parametrize("value", _INLINED, ids=repr)
def test_a_parameter_written_into_the_text_is_what_duckdb_binds(value):
    """DuckDB imports pandas (0.3-0.5 s) at a process's first bound parameter, so dpone writes
    parameters into its statements as literals (``connect.inline``). Each must be the value
    and the type binding it gives: a text compared with a DATE or a number stays a text."""
    conn = duckdb.connect()
    sql = "SELECT typeof(a), a, a IS NOT DISTINCT FROM ? FROM (SELECT ? AS a)"
    text = duckdb_connect.inline(sql, [value, value])
    items = value if isinstance(value, list) else [value]
    beyond = any(type(v) is int and not -(2**31) < v < 2**63 for v in items)
    assert (text is None) == beyond  # bound: DuckDB versions type such integers otherwise
    inlined = duckdb_connect.run(conn, sql, [value, value]).fetchall()
    bound = conn.execute(sql, [value, value]).fetchall()
    if value != value or (isinstance(value, float) and value == 0):  # NaN; 0.0 and -0.0
        assert repr(inlined) == repr(bound)
    else:
        assert inlined == bound
    assert inlined[0][2] is True or value is None


def test_a_mark_inside_quotes_stays_and_other_values_are_bound():
    """A ``?`` in a quoted name or text is not a parameter; a value without a literal of the
    type binding gives (a date, a list of texts and numbers, which DuckDB binds as texts),
    or marks that do not match the parameters, leave the statement to be bound."""
    sql = """SELECT '?' AS "a?b", 'it''s ?' AS c, ? AS d"""
    assert duckdb_connect.inline(sql, ["x"]) == """SELECT '?' AS "a?b", 'it''s ?' AS c, 'x' AS d"""
    assert duckdb.connect().execute(duckdb_connect.inline(sql, ["x"])).fetchall() == [
        ("?", "it's ?", "x")
    ]
    unwritten = ([datetime.date(2026, 1, 1)], [[1, "a"]], [[True, 1]], [[]], [[None]], ["a\x00"])
    for values in unwritten:
        assert duckdb_connect.inline(sql, values) is None
    assert duckdb_connect.inline(sql, ["x", "y"]) is None
    assert duckdb_connect.inline(sql, []) is None


@pytest.mark.parametrize(
    ("column", "value"),
    [("DATE '2024-01-06'", "2024-01-05"), ("TIMESTAMP '2024-01-06 10:00:00'", "2024-01-05"),
     ("CAST(1.25 AS DECIMAL(10, 2))", "1.2"), ("CAST(5 AS BIGINT)", "4"),
     ("CAST(5 AS UTINYINT)", 4), ("CAST(0.5 AS FLOAT)", 0.25)],
)  # fmt: skip
def test_a_written_parameter_takes_the_type_of_the_column_it_meets_as_a_bound_one(column, value):
    """Bound beside a column, a parameter takes the column's type (a text compared with a
    DATE is a date); so must its literal, or the comparison fails (a VARCHAR and a DATE).
    Not an integer beside a text column, which DuckDB refuses as a literal: dpone compares
    none (a SQLite column DuckDB reads as text holds texts; one holding both is refused)."""
    conn = duckdb.connect()
    sql = f"SELECT c > ?, c = ?, c < ? FROM (SELECT {column} AS c)"
    assert conn.execute(duckdb_connect.inline(sql, [value] * 3)).fetchall() == (
        conn.execute(sql, [value] * 3).fetchall()
    )


def test_a_file_in_a_folder_whose_path_holds_a_question_mark_is_refused_before_the_target(
    tmp_path,
):
    """DuckDB makes its write-ahead log's path by cutting the file's path at its first
    ``?``: in such a folder every commit failed inside the target call, which blocked the
    route. Refused at once instead; a ``?`` in the file's own name commits."""
    with pytest.raises(ConfigInvalid) as refused:
        DuckDBSink(tmp_path / "a?b" / "target.duckdb", "orders_copy")
    assert refused.value.diagnostics["key"] == "target.path"
    sink = DuckDBSink(tmp_path / "tar?get.duckdb", "orders_copy")
    assert sink.load(RowChunks(columns=COLUMNS, chunks=[ROWS])) == len(ROWS)
    assert sorted(sink.rows(), key=lambda row: row[0]) == ROWS


# --- lazy-plan's probe of DATE and TIMESTAMP texts, against SQLite's own test -------------------

_DAYS = st.tuples(
    st.sampled_from(["2024", "0001", "0000", "1900", "9999", "0050", "024"]),
    st.sampled_from(["-02-29", "-02-30", "-01-05", "-13-01", "-1-05", "-12-31", "-04-31"]),
    st.sampled_from(
        [
            "",
            " ",
            "x",
            "T10:00",
            " 10:00:00",
            "T23:59:59",
            " 24:00:00",
            "T10:00:60",
            "T10:00:00.123456",
            " 10:00:00.1234567",
            " 10:00:00.",
            "T10:00:00Z",
            " 10:00:00+00:00",
            "T10:00:00.5+00:00",
            " 10:00:00+05:30",
            "T10:00:00\x00",
            " 10:00:00Z\x00x",
            "T10:00:00z",
        ]
    ),
).map("".join)


_INTEGERS = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), _DAYS, _INTEGERS, st.floats(allow_nan=False), st.binary()),
            st.one_of(st.none(), _DAYS, _INTEGERS, st.binary(max_size=4)),
        ),
        min_size=1,
        max_size=4,
    )
)
def test_lazy_plans_probe_of_dates_and_timestamps_finds_what_sqlites_test_finds(rows):
    """DuckDB's probe of a DATE or TIMESTAMP column (read as the load reads it, a failed read
    a misread; then its texts tested in a scan reading every column as text) finds a misread
    value exactly when SQLite's own test of the kind does: the two agree on every value."""
    from dpone_native_transfer.connectors.duckdb import scan
    from dpone_native_transfer.connectors.duckdb.connect import scratch_connection
    from dpone_native_transfer.connectors.sqlite_reading import _misread_columns

    columns = [Column("d", "DATE"), Column("t", "TIMESTAMP")]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "source.db"
        with contextlib.closing(sqlite3.connect(path)) as db:
            db.execute("CREATE TABLE src (d DATE, t TIMESTAMP)")
            db.executemany("INSERT INTO src VALUES (?, ?)", rows)
            db.commit()
            expected = set(_misread_columns(db, "src", columns, (), {}))
        source = SQLiteSource(path, "src", "d")
        conn = scratch_connection()
        try:
            types = scan.scan_types(conn, source)
            instants = scan.scanned_instants(columns, types)
            assert [c.name for c in instants] == ["d", "t"]
            found = set()
            for column in instants:
                params = scan.scan_params(source)
                try:
                    conn.execute(f'SELECT count("{column.name}") FROM sqlite_scan(?, ?)', params)
                except duckdb.Error:
                    found.add(column.name)  # the scanner refuses it: the probe's read fails
            conn.execute("SET sqlite_all_varchar = true")
            for name, test in scan._instant_tests(instants, types):
                if conn.execute(f"SELECT {test} FROM sqlite_scan(?, ?)", params).fetchone()[0]:
                    found.add(name)
        finally:
            conn.close()
    assert found == expected


def test_a_run_waits_for_a_reader_holding_the_duckdb_file_for_a_moment(tmp_path):
    """DuckDB locks the whole file for any open process, a reader too: a run whose open met
    ``guard verify``'s (or an analyst's) read failed at once, "cannot be opened for writing
    now" (3 of 20 runs with verify polling, found by a hostile check). It waits a moment now;
    a file held longer is still refused, nothing written."""
    from helpers.routes import write_route

    route_file = write_route(tmp_path, rows=40, kind="duckdb", path="legacy")
    target = tmp_path / "target.duckdb"
    script = Path(sys.executable).parent / "dpone-transfer"
    assert subprocess.run([script, "run", route_file, "--quiet"], timeout=120).returncode == 0
    with subprocess.Popen(  # another process reads the table for a second
        [sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1], "
         "read_only=True); print('open', flush=True); time.sleep(1); c.close()", str(target)],
        stdout=subprocess.PIPE, text=True,
    ) as reader:  # fmt: skip
        assert reader.stdout is not None and reader.stdout.readline() == "open\n"
        done = subprocess.run([script, "run", route_file], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    with contextlib.closing(duckdb.connect(str(target), read_only=True)) as db:
        assert db.execute("SELECT count(*), count(DISTINCT id) FROM orders_copy").fetchone() == (
            40,
            40,
        )
