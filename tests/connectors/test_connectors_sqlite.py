"""SQLite connectors against real files: shape hashes, partition reads, atomic loads."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers.stores import sqlite_lock_free
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpone_native_transfer.connectors import SQLiteSink, SQLiteSource
from dpone_native_transfer.errors import (
    ConfigInvalid,
    SourceInvalid,
    SourceMissing,
    TargetRolledBack,
    driver_error,
)
from dpone_native_transfer.payloads import Column, LoadPlan, RowChunks, SourceShape

ORDERS = [
    (1, "north", 10, "a"),
    (2, "south", 20, "b"),
    (3, None, 30, "c"),
    (4, "north", 40, "d"),
    (5, "O'Brien", 50, "e"),
    (6, "south", 60, "f"),
    (7, "north", 70, "g"),
]


@pytest.fixture(autouse=True)
def track_connections(monkeypatch):
    """Every connection opened during a test must be closed by its end."""
    opened: list[sqlite3.Connection] = []
    real_connect = sqlite3.connect

    def connect(*args, **kwargs):
        conn = real_connect(*args, **kwargs)
        opened.append(conn)
        return conn

    monkeypatch.setattr(sqlite3, "connect", connect)
    yield opened
    leaked = [conn for conn in opened if _is_open(conn)]
    for conn in leaked:
        conn.close()
    assert not leaked


def _traced_statements(monkeypatch) -> list[str]:
    """Every SQL statement run on connections opened from now on, in order."""
    statements: list[str] = []
    connect = sqlite3.connect

    def traced(*args, **kwargs):
        conn = connect(*args, **kwargs)
        conn.set_trace_callback(statements.append)
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced)
    return statements


def _is_open(conn: sqlite3.Connection) -> bool:
    try:
        conn.total_changes  # noqa: B018
    except sqlite3.ProgrammingError:
        return False
    return True


def _execute(path: Path, *statements: str, params: list | None = None) -> None:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        for statement in statements:
            conn.execute(statement)
        if params:
            conn.executemany(params[0], params[1])


def _make_orders(path: Path, table: str = "orders", rows=ORDERS) -> Path:
    _execute(
        path,
        f'CREATE TABLE "{table}" (id INTEGER PRIMARY KEY, region TEXT, updated_at INTEGER, note)',
        params=[f'INSERT INTO "{table}" VALUES (?, ?, ?, ?)', rows],
    )
    return path


@pytest.fixture
def source_db(tmp_path: Path) -> Path:
    return _make_orders(tmp_path / "source.db")


@pytest.fixture
def source(source_db: Path) -> SQLiteSource:
    return SQLiteSource(source_db, "orders", "region", "updated_at")


@pytest.fixture
def sink(tmp_path: Path) -> SQLiteSink:
    return SQLiteSink(tmp_path / "target.db", "orders_copy")


def _all_rows(source: SQLiteSource) -> list[tuple]:
    return [
        row
        for value in source.partition_values()
        for chunk in source.read({"partition": value})
        for row in chunk
    ]


def test_payload_types_are_the_connector_neutral_ones():
    from dpone_native_transfer import payloads

    assert (Column, LoadPlan, RowChunks, SourceShape) == (
        payloads.Column,
        payloads.LoadPlan,
        payloads.RowChunks,
        payloads.SourceShape,
    )


# --- describe ---------------------------------------------------------------------------------


def test_describe_reports_columns_with_declared_types(source):
    shape = source.describe()
    assert isinstance(shape, SourceShape)
    assert shape.columns == (
        Column("id", "INTEGER"),
        Column("region", "TEXT"),
        Column("updated_at", "INTEGER"),
        Column("note", ""),
    )
    assert shape.query_hash.startswith("sha256:") and len(shape.query_hash) == 71
    assert shape.schema_hash.startswith("sha256:") and len(shape.schema_hash) == 71


def test_describe_hashes_are_stable(source, source_db):
    again = SQLiteSource(str(source_db), "orders", "region", "updated_at").describe()
    assert source.describe() == again


def test_describe_hashes_change_when_columns_change(source, source_db):
    before = source.describe()
    _execute(source_db, "ALTER TABLE orders ADD COLUMN extra REAL")
    after = source.describe()
    assert after.schema_hash != before.schema_hash
    assert after.query_hash != before.query_hash


def test_describe_schema_hash_changes_when_a_type_changes(tmp_path):
    first = tmp_path / "first.db"
    second = tmp_path / "second.db"
    _execute(first, "CREATE TABLE t (p TEXT, v INTEGER)")
    _execute(second, "CREATE TABLE t (p TEXT, v REAL)")
    one = SQLiteSource(first, "t", "p").describe()
    two = SQLiteSource(second, "t", "p").describe()
    assert one.schema_hash != two.schema_hash
    assert one.query_hash == two.query_hash


def test_generated_columns_are_not_read_but_a_view_of_them_is(tmp_path):
    """docs/connectors.md: a generated column is left out of the source's columns, on every
    path; a view that selects it makes it an ordinary column of the view."""
    path = tmp_path / "generated.db"
    _execute(
        path,
        "CREATE TABLE t (p TEXT, a INTEGER, b INTEGER GENERATED ALWAYS AS (a * 2) STORED,"
        " c INTEGER GENERATED ALWAYS AS (a * 3) VIRTUAL)",
        "INSERT INTO t (p, a) VALUES ('x', 1)",
        "CREATE VIEW v AS SELECT p, a, b, c FROM t",
    )
    table, view = SQLiteSource(path, "t", "p"), SQLiteSource(path, "v", "p")
    assert [column.name for column in table.describe().columns] == ["p", "a"]
    assert [column.name for column in view.describe().columns] == ["p", "a", "b", "c"]
    assert [list(chunk) for chunk in view.read({"partition": "x"})] == [[("x", 1, 2, 3)]]


def test_query_hash_changes_with_cursor_and_partition_column(source_db):
    with_cursor = SQLiteSource(source_db, "orders", "region", "updated_at").describe()
    without_cursor = SQLiteSource(source_db, "orders", "region").describe()
    other_cursor = SQLiteSource(source_db, "orders", "region", "id").describe()
    other_partition = SQLiteSource(source_db, "orders", "note", "updated_at").describe()
    hashes = {s.query_hash for s in (with_cursor, without_cursor, other_cursor, other_partition)}
    assert len(hashes) == 4
    assert with_cursor.schema_hash == without_cursor.schema_hash


@pytest.mark.parametrize(
    ("table", "partition", "cursor", "named"),
    [
        ("missing", "region", None, "missing"),
        ("orders", "nope", None, "nope"),
        ("orders", "region", "nope", "nope"),
    ],
)
def test_describe_rejects_missing_table_or_column_without_the_path(
    source_db, table, partition, cursor, named
):
    with pytest.raises(SourceInvalid) as caught:
        SQLiteSource(source_db, table, partition, cursor).describe()
    assert caught.value.code == "native_transfer_source_invalid"
    assert named in str(caught.value)
    assert str(source_db) not in str(caught.value)
    assert "source.db" not in str(caught.value)


def test_describe_rejects_a_missing_file_naming_its_resolved_path(tmp_path, monkeypatch):
    """Issue 13: the resolved path tells a new user where the route file points (it is not
    secret); it stays out of the diagnostics, and the file is not created."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SourceMissing) as caught:
        SQLiteSource("sub/../absent.db", "orders", "region").describe()
    assert f"{tmp_path / 'absent.db'} for table 'orders'" in str(caught.value)
    assert caught.value.diagnostics == {"table": "orders"}
    assert not (tmp_path / "absent.db").exists()


def test_describe_hides_sqlite_errors(tmp_path):
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not a database file at all" * 100)
    with pytest.raises(SourceInvalid) as caught:
        SQLiteSource(path, "orders", "region").describe()
    assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert "garbage" not in str(caught.value)
    assert "not a database" not in str(caught.value)


def test_identifiers_with_nul_are_config_errors(tmp_path):
    with pytest.raises(ConfigInvalid):
        SQLiteSource(tmp_path / "s.db", "bad\x00table", "p")
    with pytest.raises(ConfigInvalid):
        SQLiteSource(tmp_path / "s.db", "t", "p\x00")
    with pytest.raises(ConfigInvalid):
        SQLiteSource(tmp_path / "s.db", "t", "p", "c\x00")
    with pytest.raises(ConfigInvalid):
        SQLiteSink(tmp_path / "t.db", "bad\x00table")
    sink = SQLiteSink(tmp_path / "t.db", "t")
    with pytest.raises(ConfigInvalid):
        sink.load(RowChunks(columns=(Column("a\x00b", ""),), chunks=[[(1,)]]))


# --- partitions and cursor --------------------------------------------------------------------


def test_partition_values_put_null_first_then_order_by_value(source):
    assert source.partition_values() == [None, "O'Brien", "north", "south"]


def test_partition_values_are_filtered_by_cursor_window(source):
    assert source.partition_values(after=30) == ["O'Brien", "north", "south"]
    assert source.partition_values(upto=30) == [None, "north", "south"]
    assert source.partition_values(after=10, upto=40) == [None, "north", "south"]
    assert source.partition_values(after=60, upto=70) == ["north"]
    assert source.partition_values(after=70) == []


def test_partition_values_without_cursor_column_reject_a_window(source_db):
    source = SQLiteSource(source_db, "orders", "region")
    assert source.partition_values() == [None, "O'Brien", "north", "south"]
    with pytest.raises(ConfigInvalid):
        source.partition_values(after=1)


_MIXED_VALUES = st.one_of(
    st.none(),
    st.integers(-3, 3),
    st.sampled_from([0.5, -1.25, 2.0, 1e300]),
    st.sampled_from(["", "a", "A", "b", "B ", "10", "2", "é"]),
    st.sampled_from([b"", b"\x00", b"a"]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    values=st.lists(_MIXED_VALUES, max_size=40),
    decltype=st.sampled_from(["TEXT", "INTEGER", "NUMERIC", "REAL", "", "TEXT COLLATE NOCASE"]),
    indexed=st.booleans(),
    seek_limit=st.sampled_from([2, 1_000]),
)
def test_partition_values_match_sqlite_distinct_with_or_without_an_index(
    tmp_path, monkeypatch, values, decltype, indexed, seek_limit
):
    """The index seek walk finds exactly what DISTINCT finds, in the same order."""
    from dpone_native_transfer.connectors.sqlite import source as module

    monkeypatch.setattr(module, "_SEEK_LIMIT", seek_limit)
    path = tmp_path / f"mixed-{uuid.uuid4().hex}.db"
    _execute(
        path,
        f"CREATE TABLE t (id INTEGER PRIMARY KEY, p {decltype})",
        *(["CREATE INDEX t_by_p ON t (p)"] if indexed else []),
        params=["INSERT INTO t (p) VALUES (?)", [(value,) for value in values]],
    )
    with contextlib.closing(sqlite3.connect(path)) as conn:
        expected = [
            row[0] for row in conn.execute("SELECT DISTINCT p FROM t ORDER BY p IS NOT NULL, p")
        ]
        seeks = module.index_seeks(conn, "SELECT min(p) FROM main.t WHERE p > ?")
    assert seeks == indexed
    assert SQLiteSource(path, "t", "p").partition_values() == expected


def test_partition_values_seek_the_index_once_per_partition(tmp_path, monkeypatch):
    path = tmp_path / "indexed.db"
    _execute(
        path,
        "CREATE TABLE t (id INTEGER PRIMARY KEY, p TEXT)",
        "CREATE INDEX t_by_p ON t (p)",
        params=["INSERT INTO t (p) VALUES (?)", [(f"p{i % 5}",) for i in range(5_000)]],
    )
    statements = _traced_statements(monkeypatch)
    assert SQLiteSource(path, "t", "p").partition_values() == [f"p{i}" for i in range(5)]
    assert not any("DISTINCT" in sql for sql in statements)
    assert sum("min(" in sql for sql in statements) == 6  # the first value, then 5 steps


def test_max_cursor(source, source_db):
    assert source.max_cursor() == 70
    assert source.max_cursor(after=40) == 70
    assert source.max_cursor(after=70) is None
    with pytest.raises(ConfigInvalid):
        SQLiteSource(source_db, "orders", "region").max_cursor()


def test_max_cursor_on_empty_table_is_none(tmp_path):
    path = _make_orders(tmp_path / "empty.db", rows=[])
    assert SQLiteSource(path, "orders", "region", "updated_at").max_cursor() is None


# --- select_sql, read and count ---------------------------------------------------------------


def test_select_sql_binds_values_and_ignores_unknown_keys(source):
    sql, params = source.select_sql(
        {"partition": "O'Brien", "cursor_after": 10, "cursor_upto": 60, "generation": 3}
    )
    assert "O'Brien" not in sql and "10" not in sql and "60" not in sql
    assert params == ("O'Brien", 10, 60)
    assert sql == (
        'SELECT "orders"."id", "orders"."region", "orders"."updated_at", "orders"."note"'
        ' FROM "main"."orders" WHERE "orders"."region" = ?'
        ' AND "orders"."updated_at" > ? AND "orders"."updated_at" <= ? ORDER BY rowid'
    )


def test_select_sql_uses_is_null_and_optional_cursor_bounds(source):
    sql, params = source.select_sql({"partition": None}, schema="src")
    assert '"src"."orders"' in sql
    assert '"region" IS NULL' in sql and "updated_at" not in sql.split("WHERE")[1]
    assert params == ()
    sql, params = source.select_sql({"partition": "north", "cursor_upto": 40})
    assert '"updated_at" <= ?' in sql and '"updated_at" > ?' not in sql
    assert params == ("north", 40)


def test_select_sql_rejects_bad_bounds(source, source_db):
    with pytest.raises(ConfigInvalid):
        source.select_sql({"cursor_after": 1})
    with pytest.raises(ConfigInvalid):
        SQLiteSource(source_db, "orders", "region").select_sql({"partition": "x", "cursor_upto": 1})


def test_missing_columns_never_read_as_string_literals(source_db):
    source = SQLiteSource(source_db, "orders", "gone", "also_gone")
    with pytest.raises(SourceInvalid):
        source.partition_values()
    with pytest.raises(SourceInvalid):
        source.max_cursor()
    with pytest.raises(SourceInvalid):
        source.count({"partition": "gone"})


def test_read_partition_with_a_quote_in_its_value(source):
    rows = [row for chunk in source.read({"partition": "O'Brien"}) for row in chunk]
    assert rows == [(5, "O'Brien", 50, "e")]
    assert source.count({"partition": "O'Brien"}) == 1


def test_read_null_partition_and_cursor_window(source):
    assert list(source.read({"partition": None})) == [[(3, None, 30, "c")]]
    window = {"partition": "north", "cursor_after": 10, "cursor_upto": 40}
    assert list(source.read(window)) == [[(4, "north", 40, "d")]]
    assert source.count(window) == 1
    assert source.count({"partition": "north"}) == 3
    assert list(source.read({"partition": "nowhere"})) == []


def test_read_yields_bounded_chunks_with_every_row_once(tmp_path):
    rows = [(i, "p" if i % 2 else "q", i, str(i)) for i in range(1, 24)]
    source = SQLiteSource(_make_orders(tmp_path / "many.db", rows=rows), "orders", "region")
    chunks = list(source.read({"partition": "p"}, chunk_rows=5))
    assert [len(chunk) for chunk in chunks] == [5, 5, 2]
    assert all(isinstance(chunk, list) for chunk in chunks)
    assert [row for chunk in chunks for row in chunk] == [r for r in rows if r[1] == "p"]
    assert sorted(_all_rows(source)) == rows


def test_read_rejects_bad_chunk_rows_at_call_time(source):
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigInvalid):
            source.read({"partition": "north"}, chunk_rows=bad)


def test_read_of_missing_table_fails_at_call_time(source_db):
    with pytest.raises(SourceInvalid):
        SQLiteSource(source_db, "missing", "region").read({"partition": "x"})


def test_read_releases_its_connection_when_closed_early(source, source_db, track_connections):
    chunks = source.read({"partition": "north"}, chunk_rows=1)
    assert next(chunks) == [(1, "north", 10, "a")]
    assert not sqlite_lock_free(source_db)
    chunks.close()
    assert sqlite_lock_free(source_db)
    assert not any(_is_open(conn) for conn in track_connections)


def test_read_releases_its_connection_when_exhausted(source, source_db, track_connections):
    assert len(list(source.read({"partition": "north"}, chunk_rows=2))) == 2
    assert sqlite_lock_free(source_db)
    assert not any(_is_open(conn) for conn in track_connections)
    os.replace(source_db, source_db.with_name("moved.db"))
    assert not source_db.exists()


def test_read_does_not_write_to_the_source(source, source_db):
    before = source_db.read_bytes()
    _all_rows(source)
    source.describe()
    assert source_db.read_bytes() == before


# --- sink loads -------------------------------------------------------------------------------


def _chunks_of(source: SQLiteSource, shape: SourceShape, *, replace: bool = False) -> RowChunks:
    chunks = (
        chunk for value in source.partition_values() for chunk in source.read({"partition": value})
    )
    return RowChunks(columns=shape.columns, chunks=chunks, replace=replace)


def test_load_creates_missing_target_with_source_columns(source, sink):
    shape = source.describe()
    assert sink.row_count() == 0
    assert sink.rows() == []
    assert not Path(sink.path).exists()
    assert sink.load(_chunks_of(source, shape)) == len(ORDERS)
    assert sorted(sink.rows()) == ORDERS
    target = SQLiteSource(sink.path, "orders_copy", "region").describe()
    assert target.columns == shape.columns


def test_row_count_is_zero_for_a_missing_table_in_an_existing_file(tmp_path):
    path = tmp_path / "target.db"
    _execute(path, "CREATE TABLE other (a)")
    assert SQLiteSink(path, "orders_copy").row_count() == 0
    assert SQLiteSink(path, "orders_copy").rows() == []


def test_append_twice_doubles_rows(source, sink):
    shape = source.describe()
    sink.load(_chunks_of(source, shape))
    sink.load(_chunks_of(source, shape))
    assert sink.row_count() == 2 * len(ORDERS)


def test_replace_replaces_target_contents(source, sink):
    shape = source.describe()
    sink.load(_chunks_of(source, shape))
    sink.load(_chunks_of(source, shape))
    written = sink.load(
        RowChunks(columns=shape.columns, chunks=[[(9, "west", 90, "z")]], replace=True)
    )
    assert written == 1
    assert sink.rows() == [(9, "west", 90, "z")]


def test_replace_with_no_rows_empties_target(source, sink):
    shape = source.describe()
    sink.load(_chunks_of(source, shape))
    assert sink.load(RowChunks(columns=shape.columns, chunks=[], replace=True)) == 0
    assert sink.row_count() == 0


class Boom(Exception):
    pass


@pytest.mark.parametrize("replace", [False, True])
def test_load_is_atomic_and_propagates_the_same_exception(source, sink, replace):
    shape = source.describe()
    sink.load(_chunks_of(source, shape))
    before = sink.rows()
    boom = Boom()

    def failing_chunks():
        yield [(100, "x", 1, "x"), (101, "x", 2, "x")]
        yield [(102, "x", 3, "x")]
        raise boom

    with pytest.raises(Boom) as caught:
        sink.load(RowChunks(columns=shape.columns, chunks=failing_chunks(), replace=replace))
    assert caught.value is boom
    assert sink.rows() == before


def test_load_rolls_back_on_base_exception(source, sink):
    shape = source.describe()
    sink.load(_chunks_of(source, shape))

    def interrupted():
        yield [(100, "x", 1, "x")]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sink.load(RowChunks(columns=shape.columns, chunks=interrupted(), replace=True))
    assert sink.row_count() == len(ORDERS)


def test_failed_first_load_leaves_no_target_table(source, sink):
    shape = source.describe()

    def failing():
        yield [(1, "x", 1, "x")]
        raise Boom

    with pytest.raises(Boom):
        sink.load(RowChunks(columns=shape.columns, chunks=failing()))
    assert sink.row_count() == 0
    with contextlib.closing(sqlite3.connect(sink.path)) as conn:
        assert conn.execute("SELECT name FROM sqlite_schema").fetchall() == []


def test_load_consumes_chunks_lazily(source, sink):
    shape = source.describe()
    pulled: list[int] = []

    def chunks():
        for i in range(3):
            pulled.append(i)
            yield [(i, "p", i, "n")]

    payload = RowChunks(columns=shape.columns, chunks=chunks())
    assert pulled == []
    assert sink.load(payload) == 3
    assert pulled == [0, 1, 2]


def test_load_sets_full_synchronous(sink, source, monkeypatch):
    columns = source.describe().columns
    statements = _traced_statements(monkeypatch)
    sink.load(RowChunks(columns=columns, chunks=[[(1, "p", 1, "n")]]))
    assert statements[0] == "PRAGMA synchronous=FULL"
    assert "BEGIN IMMEDIATE" in statements and statements[-1] == "COMMIT"


def test_sink_rejects_missing_parent_folder(tmp_path, source):
    sink = SQLiteSink(tmp_path / "no-such-folder" / "target.db", "orders_copy")
    payload = RowChunks(columns=source.describe().columns, chunks=[[(1, "p", 1, "n")]])
    with pytest.raises(ConfigInvalid) as caught:
        sink.load(payload)
    assert "no-such-folder" not in str(caught.value)
    assert not (tmp_path / "no-such-folder").exists()


def test_sink_takes_only_the_type_name_of_an_unsafe_decltype(sink):
    """The target's DDL is built from the parsed type name, never from the source's text."""
    with sqlite3.connect(sink.path) as conn:
        conn.execute("CREATE TABLE x (keep INTEGER)")
    conn.close()
    columns = (Column("a", "INTEGER); DROP TABLE x; --"),)
    sink.load(RowChunks(columns=columns, chunks=[[(1,)]]))
    assert sink.rows() == [(1,)]
    with sqlite3.connect(sink.path) as conn:
        tables = {row[0]: row[1] for row in conn.execute("SELECT name, sql FROM sqlite_master")}
    conn.close()
    assert "x" in tables and tables[sink.table].endswith('("a" INTEGER)')


def test_load_preserves_declared_types_including_parameterized_ones(tmp_path):
    columns = (Column("a", "DECIMAL(10, 2)"), Column("b", "VARCHAR(255)"), Column("c", ""))
    sink = SQLiteSink(tmp_path / "t.db", "typed")
    sink.load(RowChunks(columns=columns, chunks=[[(1.5, "x", None)]]))
    assert SQLiteSource(sink.path, "typed", "a").describe().columns == columns


# --- LoadPlan ---------------------------------------------------------------------------------


def test_load_plan_matches_row_chunks_load(source, tmp_path):
    shape = source.describe()
    bounds = tuple(
        {"partition": value, "cursor_after": 10, "cursor_upto": 60, "generation": 1}
        for value in source.partition_values(after=10, upto=60)
    )
    by_chunks = SQLiteSink(tmp_path / "chunks.db", "t")
    by_plan = SQLiteSink(tmp_path / "plan.db", "t")
    expected = by_chunks.load(
        RowChunks(
            columns=shape.columns,
            chunks=(chunk for b in bounds for chunk in source.read(b, chunk_rows=2)),
        )
    )
    written = by_plan.load_plan(LoadPlan(source=source, columns=shape.columns, bounds=bounds))
    assert written == expected == 5
    # the plan loads the window in source order, the chunks partition by partition
    assert sorted(by_plan.rows()) == sorted(by_chunks.rows())
    assert (
        SQLiteSource(by_plan.path, "t", "region").describe()
        == SQLiteSource(by_chunks.path, "t", "region").describe()
    )


def test_load_plan_replace_and_detach(source, sink):
    shape = source.describe()
    sink.load(_chunks_of(source, shape))
    plan = LoadPlan(
        source=source, columns=shape.columns, bounds=({"partition": "north"},), replace=True
    )
    assert sink.load_plan(plan) == 3
    assert [row[0] for row in sink.rows()] == [1, 4, 7]
    with contextlib.closing(sqlite3.connect(sink.path)) as conn:
        assert [row[1] for row in conn.execute("PRAGMA database_list")] == ["main"]


def test_load_plan_is_atomic(source, sink, source_db):
    shape = source.describe()
    sink.load(_chunks_of(source, shape))
    bounds = ({"partition": "north"}, {"partition": "south"})
    columns = (*shape.columns, Column("vanished", ""))
    _execute(Path(sink.path), 'ALTER TABLE orders_copy ADD COLUMN "vanished"')
    before = sink.rows()
    with pytest.raises(TargetRolledBack, match="before its commit") as failed:
        sink.load_plan(LoadPlan(source=source, columns=columns, bounds=bounds, replace=True))
    assert failed.value.applied is False  # the guard does not block: nothing was applied
    assert "no such column" in str(driver_error(failed.value))  # for --traceback alone
    assert sink.rows() == before
    assert source.count({"partition": "north"}) == 3


class _FailingBegin:
    """A real connection whose ``BEGIN`` fails (a disk error as the transaction starts)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, *args: object) -> sqlite3.Cursor:
        if sql.startswith("BEGIN"):
            raise sqlite3.OperationalError("disk I/O error")
        return self._conn.execute(sql, *args)

    def __getattr__(self, name: str) -> object:
        return getattr(self._conn, name)


def test_an_error_at_begin_is_before_the_commit(source, sink, monkeypatch):
    """No transaction began, so nothing can have been applied: ``TargetRolledBack``, not
    an error of unknown outcome that would block the route."""
    shape = source.describe()
    sink.load(_chunks_of(source, shape))
    before, real = sink.rows(), SQLiteSink._connect

    @contextlib.contextmanager
    def failing(self):
        with real(self) as conn:
            yield _FailingBegin(conn)

    monkeypatch.setattr(SQLiteSink, "_connect", failing)
    with pytest.raises(TargetRolledBack, match="before its commit") as failed:
        sink.load(_chunks_of(source, shape))
    assert failed.value.applied is False and "disk" not in str(failed.value)
    monkeypatch.undo()
    assert sink.rows() == before


def test_load_plan_with_missing_source_file_is_source_invalid(source, sink, source_db):
    shape = source.describe()
    source_db.unlink()
    plan = LoadPlan(source=source, columns=shape.columns, bounds=({"partition": "north"},))
    with pytest.raises(SourceInvalid) as caught:
        sink.load_plan(plan)
    assert "source.db" not in str(caught.value)
    assert sink.row_count() == 0


def test_load_plan_does_not_write_to_the_source(source, sink, source_db):
    before = source_db.read_bytes()
    shape = source.describe()
    sink.load_plan(LoadPlan(source=source, columns=shape.columns, bounds=({"partition": None},)))
    assert source_db.read_bytes() == before
    assert sink.rows() == [(3, None, 30, "c")]


def _spy_table_sql(monkeypatch, after_check=None) -> list:
    """Record what SQLiteSource.table_sql returns (the real method runs)."""
    returned: list = []
    real = SQLiteSource.table_sql

    def spy(self, bounds, **kwargs):
        statement = real(self, bounds, **kwargs)
        returned.append(statement)
        if after_check is not None:
            after_check()
        return statement

    monkeypatch.setattr(SQLiteSource, "table_sql", spy)
    return returned


def _plan(source: SQLiteSource, after=None, upto=None) -> LoadPlan:
    window = {"cursor_after": after, "cursor_upto": upto} if after or upto else {}
    values = source.partition_values(after=after, upto=upto)
    bounds = tuple({"partition": value, **window} for value in values)
    return LoadPlan(source=source, columns=source.describe().columns, bounds=bounds)


@pytest.fixture
def indexed_source(source_db: Path) -> SQLiteSource:
    _execute(source_db, "CREATE INDEX orders_by_region ON orders (region)")
    return SQLiteSource(source_db, "orders", "region", "updated_at")


@pytest.mark.parametrize("window", [(None, None), (10, 60)])
def test_load_plan_copies_the_whole_table_once_when_it_holds_exactly_the_planned_partitions(
    indexed_source, sink, monkeypatch, window
):
    source = indexed_source
    returned = _spy_table_sql(monkeypatch)
    plan = _plan(source, *window)
    expected = sorted(row for b in plan.bounds for chunk in source.read(b) for row in chunk)
    assert len(expected) == (7 if window == (None, None) else 5)
    assert sink.load_plan(plan) == len(expected)
    assert sorted(sink.rows()) == expected
    # a windowed plan keeps its per-partition queries (an index bounds them to the window)
    assert len(returned) == 1 and (returned[0] is None) == (window != (None, None))
    if returned[0] is not None:
        assert " IN (" not in returned[0][0]  # the whole table, checked: no filter at all


def test_load_plan_skips_a_partition_that_appeared_after_planning(
    indexed_source, sink, source_db, monkeypatch
):
    returned = _spy_table_sql(monkeypatch)
    plan = _plan(indexed_source)
    _execute(source_db, "INSERT INTO orders VALUES (8, 'east', 80, 'h')")
    assert sink.load_plan(plan) == 7
    assert sorted(sink.rows(), key=lambda row: row[0]) == ORDERS
    assert returned == [None]  # the per-partition queries ran


def test_load_plan_handles_a_partition_that_vanished_after_planning(
    indexed_source, sink, source_db, monkeypatch
):
    returned = _spy_table_sql(monkeypatch)
    plan = _plan(indexed_source)
    _execute(source_db, "DELETE FROM orders WHERE region = 'south'")
    assert sink.load_plan(plan) == 5
    assert sorted(sink.rows(), key=lambda row: row[0]) == [r for r in ORDERS if r[1] != "south"]
    assert returned == [None]


def test_an_unindexed_plan_is_one_scan_while_its_values_fit_one_statement(tmp_path):
    """600 partitions of one value (a plan of 500 at most was one scan before): one sorted
    scan whose ``IN`` list holds every value, while they fit the statement's parameters."""
    with sqlite3.connect(tmp_path / "many.db") as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, p TEXT)")
        db.executemany("INSERT INTO t VALUES (?, ?)", [(i, f"v{i % 600:03d}") for i in range(1200)])
    db.close()
    source = SQLiteSource(str(tmp_path / "many.db"), "t", "p")
    bounds = [{"partition": f"v{k:03d}"} for k in range(600)]
    with contextlib.closing(sqlite3.connect(":memory:")) as conn:
        conn.execute("ATTACH DATABASE ? AS src", (str(tmp_path / "many.db"),))
        columns = source.describe().columns

        def scan() -> Any:
            return source.table_sql(
                bounds, conn=conn, schema="src", columns=columns, by_partition=True
            )

        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 599)
        assert scan() is None  # each partition is then read on its own
        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 600)
        sql, params = scan()
        rows = conn.execute(sql, params).fetchall()
    assert rows == sorted(((i, f"v{i % 600:03d}") for i in range(1200)), key=lambda r: (r[1], r[0]))


@pytest.mark.parametrize("window", [(None, None), (10, 60)])
def test_load_plan_of_an_unindexed_table_is_one_scan_of_the_planned_values(
    source, sink, source_db, monkeypatch, window
):
    """Without an index each partition's query would scan the table: the plan is one scan
    that keeps the planned values, windowed or not; a partition that appeared after planning
    is left out, as its own query would leave it out."""
    returned = _spy_table_sql(monkeypatch)
    plan = _plan(source, *window)
    expected = sorted(row for b in plan.bounds for chunk in source.read(b) for row in chunk)
    _execute(source_db, "INSERT INTO orders VALUES (8, 'east', 50, 'h')")
    statements = _traced_statements(monkeypatch)
    assert sink.load_plan(plan) == len(expected) == (7 if window == (None, None) else 5)
    assert sorted(sink.rows()) == expected
    assert len(returned) == 1 and " IN (" in returned[0][0]
    copies = [sql for sql in statements if sql.startswith('INSERT INTO "orders_copy"')]
    assert len(copies) == 1
    assert not any("DISTINCT" in sql for sql in statements)  # no second listing of the values


@pytest.mark.parametrize(
    ("declared", "stored", "bounds"),
    [
        ("INTEGER", [5, "5x", 6, None, 5.5], [{"partition": "5"}, {"partition": None}]),
        ("TEXT", ["5", "6", "O'Brien"], [{"partition": 5}, {"partition": "O'Brien"}]),
        ("NUMERIC", [1, 2.5, "x"], [{"partition": "1.0"}, {"partition": 2.5}]),
        ("BLOB", [b"\x00", "a", 1], [{"partition": b"\x00"}, {"partition": 1}]),
    ],
)
def test_load_plan_scan_matches_the_partition_queries_as_sqlite_compares(
    tmp_path, sink, monkeypatch, declared, stored, bounds
):
    """Bounds whose type is not the stored one match as ``=`` matches them (affinity)."""
    path = tmp_path / "odd.db"
    _execute(
        path,
        f"CREATE TABLE t (id INTEGER PRIMARY KEY, p {declared}, updated_at INTEGER)",
        params=["INSERT INTO t (p, updated_at) VALUES (?, 1)", [(v,) for v in stored * 3]],
    )
    source = SQLiteSource(path, "t", "p", "updated_at")
    returned = _spy_table_sql(monkeypatch)
    plan = LoadPlan(source=source, columns=source.describe().columns, bounds=tuple(bounds))
    expected = sorted(
        (row for b in plan.bounds for chunk in source.read(b) for row in chunk), key=repr
    )
    assert expected  # the case would prove nothing if no bound matched a row
    assert sink.load_plan(plan) == len(expected)
    assert sorted(sink.rows(), key=repr) == expected
    assert returned[0] is not None and " IN (" in returned[0][0]


def test_load_plan_with_partitions_in_different_windows_runs_per_partition(
    source, sink, monkeypatch
):
    returned = _spy_table_sql(monkeypatch)
    bounds = (
        {"partition": "north", "cursor_after": 0, "cursor_upto": 40},
        {"partition": "south", "cursor_after": 40, "cursor_upto": 70},
    )  # the planner never mixes windows; the sink must still load exactly these rows
    plan = LoadPlan(source=source, columns=source.describe().columns, bounds=bounds)
    assert sink.load_plan(plan) == 3
    assert [row[0] for row in sink.rows()] == [1, 4, 6]
    assert returned == [None]


def test_load_plan_check_and_load_read_one_snapshot(source, sink, source_db, monkeypatch):
    """A row a writer commits after the check is invisible to the load in the same transaction."""
    with contextlib.closing(sqlite3.connect(source_db)) as conn:
        conn.execute("PRAGMA journal_mode=WAL")

    def writer_commits_a_new_partition() -> None:
        _execute(source_db, "INSERT INTO orders VALUES (8, 'east', 80, 'h')")

    returned = _spy_table_sql(monkeypatch, after_check=writer_commits_a_new_partition)
    assert sink.load_plan(_plan(source)) == 7
    assert returned[0] is not None
    assert sorted(sink.rows(), key=lambda row: row[0]) == ORDERS
    assert source.count({"partition": "east"}) == 1


# --- staging ----------------------------------------------------------------------------------


def _stage_exists(sink: SQLiteSink) -> bool:
    with contextlib.closing(sqlite3.connect(sink.path)) as conn:
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_schema")}
    return f"_dpone_stage_{sink.table}" in names


def test_stage_then_finalize_moves_rows_and_drops_staging(source, sink):
    shape = source.describe()
    assert sink.staged_row_count() == 0
    assert sink.stage(_chunks_of(source, shape)) == len(ORDERS)
    assert sink.staged_row_count() == len(ORDERS)
    assert sink.row_count() == 0
    assert sink.finalize_staged_load() == len(ORDERS)
    assert sorted(sink.rows()) == ORDERS
    assert sink.staged_row_count() == 0
    assert not _stage_exists(sink)
    assert SQLiteSource(sink.path, "orders_copy", "region").describe().columns == shape.columns


def test_stage_recreates_staging_and_finalize_can_replace(source, sink):
    shape = source.describe()
    sink.load(_chunks_of(source, shape))
    sink.stage(_chunks_of(source, shape))
    sink.stage(RowChunks(columns=shape.columns, chunks=[[(9, "west", 90, "z")]]))
    assert sink.staged_row_count() == 1
    assert sink.finalize_staged_load(replace=True) == 1
    assert sink.rows() == [(9, "west", 90, "z")]


def test_finalize_appends_by_default(source, sink):
    shape = source.describe()
    sink.load(_chunks_of(source, shape))
    sink.stage(_chunks_of(source, shape))
    assert sink.finalize_staged_load() == len(ORDERS)
    assert sink.row_count() == 2 * len(ORDERS)


def test_failed_stage_leaves_no_partial_staging(source, sink):
    shape = source.describe()
    sink.stage(RowChunks(columns=shape.columns, chunks=[[(9, "west", 90, "z")]]))

    def failing():
        yield [(1, "x", 1, "x")]
        raise Boom

    with pytest.raises(Boom):
        sink.stage(RowChunks(columns=shape.columns, chunks=failing()))
    assert sink.staged_row_count() == 1


def test_finalize_without_stage_is_an_error_and_changes_nothing(source, sink):
    shape = source.describe()
    sink.load(_chunks_of(source, shape))
    with pytest.raises(ConfigInvalid):
        sink.finalize_staged_load(replace=True)
    assert sink.row_count() == len(ORDERS)


def test_discard_stage(source, sink):
    sink.discard_stage()
    assert not Path(sink.path).exists()
    shape = source.describe()
    sink.stage(_chunks_of(source, shape))
    sink.discard_stage()
    assert sink.staged_row_count() == 0
    assert not _stage_exists(sink)
    assert sink.row_count() == 0
    sink.discard_stage()


# --- awkward identifiers ----------------------------------------------------------------------


def test_identifiers_with_spaces_and_quotes(tmp_path):
    path = tmp_path / "odd name's.db"
    _execute(
        path,
        'CREATE TABLE "my ""odd"" table" ("the id" INTEGER, "part ""p""" TEXT,'
        ' "cur\'sor" INTEGER, "v a l" BLOB)',
        params=[
            'INSERT INTO "my ""odd"" table" VALUES (?, ?, ?, ?)',
            [(1, "a b", 5, b"\x00"), (2, 'x"y', 6, b"\x01"), (3, "a b", 7, None)],
        ],
    )
    source = SQLiteSource(path, 'my "odd" table', 'part "p"', "cur'sor")
    shape = source.describe()
    assert [c.name for c in shape.columns] == ["the id", 'part "p"', "cur'sor", "v a l"]
    assert source.partition_values(after=5) == ["a b", 'x"y']
    assert source.max_cursor() == 7
    assert source.count({"partition": 'x"y'}) == 1

    sink = SQLiteSink(tmp_path / "target dir's.db", 'copy "of" it')
    bounds = tuple({"partition": value} for value in source.partition_values())
    assert sink.load_plan(LoadPlan(source=source, columns=shape.columns, bounds=bounds)) == 3
    sink.stage(RowChunks(columns=shape.columns, chunks=source.read({"partition": "a b"})))
    assert sink.finalize_staged_load() == 2
    assert sink.row_count() == 5
    assert sorted(sink.rows()[:3]) == [
        (1, "a b", 5, b"\x00"),
        (2, 'x"y', 6, b"\x01"),
        (3, "a b", 7, None),
    ]


def test_paths_that_look_like_uris_are_plain_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _make_orders(tmp_path / "data?mode=memory#x.db")
    source = SQLiteSource("data?mode=memory#x.db", "orders", "region")
    assert source.count({"partition": "north"}) == 3
    sink = SQLiteSink("out%20put.db", "t")
    plan = LoadPlan(
        source=source, columns=source.describe().columns, bounds=({"partition": "south"},)
    )
    sink.load_plan(plan)
    assert (tmp_path / "out%20put.db").exists()
    assert sink.row_count() == 2


def test_a_without_rowid_source_table_is_refused_with_a_clear_error(tmp_path) -> None:
    """It failed on every path as source_invalid "could not be read" (exit 1: retry)."""
    import sqlite3

    from helpers.cli import run_cli

    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER) WITHOUT ROWID")
        db.execute("INSERT INTO t VALUES ('a', 1)")
        db.commit()
    (tmp_path / "route.toml").write_text(
        '[source]\npath = "source.db"\ntable = "t"\npartition_column = "k"\n'
        '[target]\npath = "target.db"\ntable = "copy"\n'
        '[transfer]\nstrategy = "full_refresh"\npath = "staged"\n'
        '[store]\npath = "checkpoints.db"\n'
    )
    done = run_cli("run", tmp_path / "route.toml")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "native_transfer_config_invalid" in done.stderr and "WITHOUT ROWID" in done.stderr


# --- another writer holding the target file --------------------------------------------------


@pytest.mark.parametrize("path", ["legacy", "staged", "lazy-plan"])
def test_a_target_file_another_writer_holds_fails_the_load_unblocked(tmp_path, monkeypatch, path):
    """Another writer holds the target file through the load's wait (found by two pipelines
    run at once on one target file): the load rolled back, so it is ``TargetBusy`` (exit 1),
    not an unknown outcome: the route is not blocked, and the next run, the file free, loads
    every row once."""
    from helpers.routes import Route

    from dpone_native_transfer.connectors.sqlite import sink as module
    from dpone_native_transfer.errors import TargetBusy

    monkeypatch.setattr(module, "TIMEOUT", 0.2)
    target = tmp_path / "target.db"
    holder = sqlite3.connect(target, isolation_level=None)

    class HeldBeforeItsCall(SQLiteSink):
        def _hold(self) -> None:
            if not holder.in_transaction:
                holder.execute("BEGIN IMMEDIATE")

        def load(self, *args: Any, **kwargs: Any) -> int:
            self._hold()
            return super().load(*args, **kwargs)

        def finalize_staged_load(self, *args: Any, **kwargs: Any) -> int:
            self._hold()
            return super().finalize_staged_load(*args, **kwargs)

        def load_plan(self, *args: Any, **kwargs: Any) -> int:
            self._hold()
            return super().load_plan(*args, **kwargs)

    route = Route(tmp_path, sink=HeldBeforeItsCall(str(target), "orders_copy"))
    try:
        with pytest.raises(TargetBusy) as raised:
            route.runtime().run(route.spec(path))
        assert raised.value.code == "native_transfer_target_unavailable"
        assert "orders_copy" in str(raised.value) and str(tmp_path) not in str(raised.value)
        assert route.sink.target_calls == 1  # inside the target call
        holder.execute("ROLLBACK")
        holder.close()
        monkeypatch.setattr(HeldBeforeItsCall, "_hold", lambda self: None)
        route.runtime().run(route.spec(path, "run-2"))  # not blocked: no one resolved it
        assert route.target_ids() == route.source_ids()
    finally:
        holder.close()
        route.real_store.close()
