"""PostgreSQL source against the test suite's real server: shape, partitions, server-side reads,
safe errors, and guarded transfers into SQLite and DuckDB targets."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import secrets
import time
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import psycopg
import pytest
from helpers.postgres_server import postgres_url
from helpers.routes import MovingRows, Route, transfer_once

from dpone_native_transfer import SQLiteCheckpointStore, TransferRuntime, TransferSpec
from dpone_native_transfer.connectors import SQLiteSink
from dpone_native_transfer.connectors.duckdb import DuckDBSink
from dpone_native_transfer.connectors.postgres import PostgresSource
from dpone_native_transfer.errors import ConfigInvalid, SourceAccessRefused, SourceInvalid
from dpone_native_transfer.payloads import Column
from dpone_native_transfer.testing import (
    InjectedFault,
    StepClock,
    assert_blocked_before_target,
    assert_rows_exactly_once,
    phase_batch,
)

TS = datetime.datetime(2024, 1, 1)


def _ts(second: int) -> datetime.datetime:
    return TS + datetime.timedelta(seconds=second)


# (id, region, amount numeric(12,2), updated_at timestamp, flag boolean, note text)
ORDERS = [
    (1, "north", decimal.Decimal("12.50"), _ts(1), True, "a"),
    (2, None, decimal.Decimal("3.25"), _ts(2), False, None),
    (3, "south", None, _ts(3), None, "c"),
    (4, "north", decimal.Decimal("10.00"), _ts(4), True, "O'Brien"),
    (5, "south", decimal.Decimal("-7.05"), _ts(5), False, "e"),
    (6, None, decimal.Decimal("0.00"), _ts(6), True, "f"),
    (7, "north", decimal.Decimal("99.99"), _ts(7), None, None),
]
LATER = [
    (8, "north", decimal.Decimal("1.00"), _ts(8), True, "h"),
    (9, None, None, _ts(9), False, "i"),
    (10, "west", decimal.Decimal("2.50"), _ts(10), None, "j"),
]


class Table(NamedTuple):
    dsn: str  # the admin DSN (key=value), for the test's own statements
    url: str
    schema: str
    name: str  # schema-qualified

    def execute(self, sql: str, params: Any = None) -> list[tuple]:
        with contextlib.closing(psycopg.connect(self.dsn, autocommit=True)) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def insert(self, rows: list[tuple]) -> None:
        with contextlib.closing(psycopg.connect(self.dsn, autocommit=True)) as conn:
            conn.cursor().executemany(
                f'INSERT INTO "{self.schema}".orders VALUES (%s, %s, %s, %s, %s, %s)', rows
            )


@pytest.fixture
def table(postgres_schema) -> Table:
    made = Table(postgres_schema.dsn, postgres_url(postgres_schema.dsn), postgres_schema.schema,
                 f"{postgres_schema.schema}.orders")  # fmt: skip
    made.execute(f'CREATE SCHEMA "{made.schema}"')
    made.execute(
        f'CREATE TABLE "{made.schema}".orders (id integer PRIMARY KEY, region text,'
        " amount numeric(12,2), updated_at timestamp, flag boolean, note text)"
    )
    made.insert(ORDERS)
    return made


@pytest.fixture
def source(table: Table) -> PostgresSource:
    return PostgresSource(table.url, table.name, "region", "updated_at")


def _read_all(source: PostgresSource, **window: Any) -> list[tuple]:
    return [
        row
        for value in source.partition_values(**window)
        for chunk in source.read({"partition": value}, chunk_rows=2)
        for row in chunk
    ]


# --- describe ---------------------------------------------------------------------------------


def test_describe_reports_postgres_type_names_and_stable_hashes(source, table):
    shape = source.describe()
    assert [(c.name, c.decltype) for c in shape.columns] == [
        ("id", "integer"),
        ("region", "text"),
        ("amount", "numeric(12,2)"),
        ("updated_at", "timestamp without time zone"),
        ("flag", "boolean"),
        ("note", "text"),
    ]
    assert [c.kind for c in shape.columns] == [
        "integer", "text", "decimal", "timestamp", "boolean", "text"
    ]  # fmt: skip
    assert shape.query_hash.startswith("sha256:") and shape.schema_hash.startswith("sha256:")
    assert PostgresSource(table.url, table.name, "region", "updated_at").describe() == shape
    without_cursor = PostgresSource(table.url, table.name, "region").describe()
    assert without_cursor.query_hash != shape.query_hash
    assert without_cursor.schema_hash == shape.schema_hash
    table.execute(f'ALTER TABLE "{table.schema}".orders ALTER COLUMN note TYPE varchar(40)')
    changed = source.describe()
    assert changed.schema_hash != shape.schema_hash
    assert changed.columns[-1] == Column("note", "character varying(40)", "text")


def test_an_unqualified_table_is_found_through_the_search_path(table):
    url = postgres_url(table.dsn, options=f"-csearch_path={table.schema}")
    source = PostgresSource(url, "orders", "region")
    assert source.describe().columns[0] == Column("id", "integer", "integer")
    assert source.count({"partition": "north"}) == 3


@pytest.mark.parametrize(
    ("name", "partition", "cursor", "named"),
    [
        ("{schema}.missing", "region", None, "missing"),
        ("no_such_schema.orders", "region", None, "no_such_schema.orders"),
        ("{schema}.orders", "nope", None, "nope"),
        ("{schema}.orders", "region", "nope", "nope"),
    ],
)
def test_missing_table_or_column_is_source_invalid(table, name, partition, cursor, named):
    name = name.format(schema=table.schema)
    with pytest.raises(SourceInvalid) as caught:
        PostgresSource(table.url, name, partition, cursor).describe()
    assert named in str(caught.value)
    assert caught.value.diagnostics["table"] == name


# --- partitions, cursors, reads ---------------------------------------------------------------


def test_partition_values_come_null_first_then_by_value(source, table):
    assert source.partition_values() == [None, "north", "south"]
    window = {"after": _ts(2).isoformat(sep=" "), "upto": _ts(6).isoformat(sep=" ")}
    assert source.partition_values(**window) == [None, "north", "south"]
    assert source.partition_values(after="2024-01-01 00:00:05") == [None, "north"]
    by_amount = PostgresSource(table.url, table.name, "amount")
    assert by_amount.partition_values() == [
        None, "-7.05", "0.00", "3.25", "10.00", "12.50", "99.99"
    ]  # fmt: skip


def test_max_cursor_is_exact_iso_text_in_utc(source, table):
    assert source.max_cursor() == "2024-01-01 00:00:07"
    assert source.max_cursor(after="2024-01-01 00:00:07") is None
    table.insert([(11, "x", None, datetime.datetime(2024, 1, 1, 0, 0, 8, 123456), None, None)])
    assert source.max_cursor(after="2024-01-01 00:00:07") == "2024-01-01 00:00:08.123456"
    with pytest.raises(ConfigInvalid):
        PostgresSource(table.url, table.name, "region").max_cursor()


def test_reads_give_transfer_safe_values_and_respect_bounds(source):
    rows = _read_all(source)
    assert sorted(rows) == [
        (i, region, None if amount is None else str(amount),
         None if at is None else at.isoformat(sep=" "), flag, note)
        for i, region, amount, at, flag, note in ORDERS
    ]  # fmt: skip
    window = {"cursor_after": "2024-01-01 00:00:01", "cursor_upto": "2024-01-01 00:00:06"}
    north = [r for chunk in source.read({"partition": "north", **window}) for r in chunk]
    nulls = [r for chunk in source.read({"partition": None, **window}) for r in chunk]
    assert [r[0] for r in north] == [4]
    assert sorted(r[0] for r in nulls) == [2, 6]
    assert source.count({"partition": None, **window}) == 2
    assert source.count({"partition": "south"}) == 2


def test_a_timestamptz_cursor_reads_back_in_utc(table):
    table.execute(f'ALTER TABLE "{table.schema}".orders ADD COLUMN seen timestamptz')
    table.execute(
        f"UPDATE \"{table.schema}\".orders SET seen = '2024-06-01 12:00:00+02' WHERE id = 1"
    )
    source = PostgresSource(table.url, table.name, "region", "seen")
    assert source.max_cursor() == "2024-06-01 10:00:00+00"
    bounds = {"partition": "north", "cursor_after": "2024-06-01 09:59:59+00",
              "cursor_upto": source.max_cursor()}  # fmt: skip
    assert [row[0] for chunk in source.read(bounds) for row in chunk] == [1]


def test_read_uses_a_server_side_cursor_fetching_chunk_rows_at_a_time(table):
    """Memory stays bounded: the rows stay on the server until each FETCH of chunk_rows."""
    table.insert([(100 + i, "bulk", None, _ts(100 + i), None, None) for i in range(23)])
    tag = f"dpone-test-{secrets.token_hex(4)}"
    source = PostgresSource(postgres_url(table.dsn, application_name=tag), table.name, "region")
    chunks = source.read({"partition": "bulk"}, chunk_rows=5)
    first = next(chunks)
    assert len(first) == 5
    sessions = table.execute(
        "SELECT state, query FROM pg_stat_activity WHERE application_name = %s", (tag,)
    )
    assert len(sessions) == 1
    state, query = sessions[0]
    assert state == "idle in transaction"
    assert query.startswith('FETCH FORWARD 5 FROM "dpone_read"')
    rest = list(chunks)
    assert [len(chunk) for chunk in rest] == [5, 5, 5, 3]
    assert sorted(r[0] for chunk in [first, *rest] for r in chunk) == list(range(100, 123))
    gone = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    assert table.execute(gone, (tag,)) == [(0,)]


def test_a_read_closed_early_releases_its_connection(table):
    tag = f"dpone-test-{secrets.token_hex(4)}"
    source = PostgresSource(postgres_url(table.dsn, application_name=tag), table.name, "region")
    chunks = source.read({"partition": "north"}, chunk_rows=1)
    assert len(next(chunks)) == 1
    count = "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s"
    assert table.execute(count, (tag,)) == [(1,)]
    chunks.close()
    assert table.execute(count, (tag,)) == [(0,)]


def test_read_rejects_bad_chunk_rows_and_bounds_at_call_time(source):
    for bad in (0, -1, True, 2.5):
        with pytest.raises(ConfigInvalid):
            source.read({"partition": "north"}, chunk_rows=bad)
    with pytest.raises(ConfigInvalid):
        source.read({"cursor_after": 1})


def test_awkward_identifiers(table):
    schema = table.schema
    table.execute(
        f'CREATE TABLE "{schema}"."odd %s ""t""" ("the id" int, "part %(p)s" text, "cur\'sor" int)'
    )
    table.execute(
        f'INSERT INTO "{schema}"."odd %s ""t""" VALUES (1, \'a\', 5), (2, \'b"\', 6), (3, \'a\', 7)'
    )
    source = PostgresSource(table.url, f'{schema}.odd %s "t"', "part %(p)s", "cur'sor")
    assert [c.name for c in source.describe().columns] == ["the id", "part %(p)s", "cur'sor"]
    assert source.partition_values(after=5) == ["a", 'b"']
    assert source.max_cursor() == 7
    chunks = list(source.read({"partition": "a"}))
    assert chunks == [[(1, "a", 5), (3, "a", 7)]]


# --- errors are safe --------------------------------------------------------------------------


def _assert_safe(error: BaseException, *secrets_: str) -> None:
    text = f"{error} {error!r} {error.diagnostics}"  # type: ignore[attr-defined]
    for secret in secrets_:
        assert secret not in text
    assert error.__context__ is None and error.__cause__ is None


def test_a_wrong_password_is_source_access_refused_without_credentials(table):
    """Still the code of ``SourceInvalid``, but exit 2: a retry cannot fix a password."""
    url = postgres_url(table.dsn).replace("@", "x-CANARY-PW@", 1)
    source = PostgresSource(url, table.name, "region")
    with pytest.raises(SourceAccessRefused) as caught:
        source.describe()
    _assert_safe(caught.value, "CANARY", "postgresql://", "FATAL", "for user")
    assert caught.value.code == SourceInvalid.code
    assert caught.value.diagnostics == {
        "table": table.name,
        "failure": "login_refused",
        "sqlstate": "28P01",
    }
    assert "CANARY" not in repr(source)


def test_an_unreachable_server_is_source_invalid(table):
    parts = psycopg.conninfo.conninfo_to_dict(table.dsn)
    url = f"postgresql://u:CANARY-PW@127.0.0.1:1/{parts['dbname']}"
    with pytest.raises(SourceInvalid) as caught:
        PostgresSource(url, table.name, "region").partition_values()
    _assert_safe(caught.value, "CANARY", "127.0.0.1")
    assert not isinstance(caught.value, SourceAccessRefused)  # exit 1: a retry may succeed
    assert caught.value.diagnostics == {"table": table.name, "failure": "unreachable"}


def test_a_failing_query_is_source_invalid_without_sql_or_driver_text(table):
    table.execute(
        f'CREATE VIEW "{table.schema}".fragile AS SELECT id, region, 100 / (id - 3) AS ratio'
        f' FROM "{table.schema}".orders'
    )
    source = PostgresSource(table.url, f"{table.schema}.fragile", "region")
    assert source.count({"partition": "north"}) == 3
    chunks = source.read({"partition": "south"})
    with pytest.raises(SourceInvalid) as caught:
        list(chunks)
    _assert_safe(caught.value, "division", "SELECT", "FETCH")


def test_dsn_forms(table, monkeypatch):
    conninfo = "host=127.0.0.1 dbname=x user=u password=CANARY-PW"
    with pytest.raises(ConfigInvalid) as caught:
        PostgresSource(conninfo, table.name, "region")
    _assert_safe(caught.value, "CANARY")
    assert "postgresql:// URL" in str(caught.value)
    with pytest.raises(ConfigInvalid) as caught:
        PostgresSource("env:DPONE_TEST_UNSET_SOURCE", table.name, "region")
    assert "DPONE_TEST_UNSET_SOURCE" in str(caught.value)
    monkeypatch.setenv("DPONE_TEST_SOURCE", table.url)
    source = PostgresSource("env:DPONE_TEST_SOURCE", table.name, "region")
    assert source.count({"partition": None}) == 2
    for bad in (None, 5):
        with pytest.raises(ConfigInvalid):
            PostgresSource(bad, table.name, "region")  # type: ignore[arg-type]
    for name in ("", "bad\x00name", f"{table.schema}."):
        with pytest.raises(ConfigInvalid):
            PostgresSource(table.url, name, "region")


# --- guarded transfers into SQLite and DuckDB -------------------------------------------------


class PgRoute(Route):
    """The tests' route (``helpers.routes.Route``) with a PostgreSQL source."""

    def __init__(self, tmp: Path, table: Table, sink: Any, strategy: str) -> None:
        source = PostgresSource(table.url, table.name, "region", "updated_at")
        super().__init__(tmp, source=source, sink=sink)
        self.table = table
        self.strategy = strategy

    def run(self, path: str, run_id: str):
        runtime = TransferRuntime(self.store, clock=StepClock())
        return runtime.run(
            TransferSpec(source=self.source, sink=self.sink, strategy=self.strategy, path=path,
                         run_id=run_id, chunk_rows=3)
        )  # fmt: skip


def _sqlite_value(row: tuple) -> tuple:
    """A source row as SQLite stores it: an exact decimal as its text, a boolean as 0 or 1."""
    i, region, amount, at, flag, note = row
    amount = None if amount is None else str(amount)
    return i, region, amount, at.isoformat(sep=" "), None if flag is None else int(flag), note


def _expected(sink_kind: str, rows: list[tuple]) -> list[tuple]:
    return sorted(rows if sink_kind == "duckdb" else [_sqlite_value(row) for row in rows])


# --- one scan of every partition (OnePassReading) -----------------------------------------


def _split(source: PostgresSource, bounds: list[dict[str, Any]]) -> dict[int, list] | None:
    scan = source.read_partitions(bounds, chunk_rows=2)
    if scan is None:
        return None
    got: dict[int, list] = {}
    for index, rows in scan:
        assert 0 < len(rows) <= 2
        got.setdefault(index, []).extend(rows)
    return {i: sorted(rows, key=repr) for i, rows in got.items()}


def _each_read(source: PostgresSource, bounds: list[dict[str, Any]]) -> dict[int, list]:
    reads = {i: [r for c in source.read(b) for r in c] for i, b in enumerate(bounds)}
    return {i: sorted(rows, key=repr) for i, rows in reads.items() if rows}


@pytest.mark.parametrize(
    ("declared", "stored", "bounds", "placed"),
    [
        ("text", ["a", "A", "a ", "", None, "é"], ["a", "A", "a ", "", None, "é", "zz"], True),
        ('text COLLATE "C"', ["b", "B", None], ["b", "B"], False),  # not the default collation
        ("numeric(6,2)", ["1.00", "2.5", None], ["1.0", "2.50", None], True),  # equal on the server
        ("integer", [1, 2, 3, None], ["1", 2, "03"], False),  # mixed kinds: a retry's JSON
        ("integer", [1, 2, 3, None], [1, 2, 3, None], True),
        ("date", ["2024-01-01", "2024-02-29"], ["2024-01-01", "2024-02-29"], True),
        ("boolean", [True, False, None], [True, False, None], True),
    ],
)
def test_one_scan_gives_each_partition_exactly_its_own_reads_rows(
    table, monkeypatch, declared, stored, bounds, placed
):
    """The server's own ``=`` routes every row, so spellings Python would not match (``'1.0'``
    and ``1.00``, ``'03'`` and 3) land where each partition's own read puts them: placed by
    ``width_bucket`` among the sorted values, or, where the values' kinds are mixed or the
    key collated otherwise, by a ``CASE`` of each partition's own condition."""
    table.execute(f'CREATE TABLE "{table.schema}".p (id serial, part {declared}, cur integer)')
    for cur, value in enumerate(stored * 3):
        table.execute(f'INSERT INTO "{table.schema}".p (part, cur) VALUES (%s, %s)', (value, cur))
    source = PostgresSource(table.url, f"{table.schema}.p", "part", "cur")
    scans: list[str] = []
    real_chunks = PostgresSource._chunks
    monkeypatch.setattr(
        PostgresSource,
        "_chunks",
        lambda self, sql, *a: scans.append(sql) or real_chunks(self, sql, *a),
    )
    for window in ({}, {"cursor_after": 2, "cursor_upto": 12}):
        partitions = [{"partition": value, **window} for value in bounds]
        scans.clear()
        got = _split(source, partitions)
        assert got is not None and got == _each_read(source, partitions)
        assert ("width_bucket(" in scans[0], " CASE " in scans[0]) == (placed, not placed)


def test_the_planner_chooses_one_scan_unless_the_reads_are_cheaper_or_cannot_be_told_apart(
    table,
):
    table.execute(
        f'CREATE TABLE "{table.schema}".big AS SELECT i AS id, i % 1000 AS part'
        " FROM generate_series(1, 20000) AS i"
    )
    table.execute(f'ANALYZE "{table.schema}".big')
    source = PostgresSource(table.url, f"{table.schema}.big", "part")
    few = [{"partition": 3}, {"partition": 7}]
    assert _split(source, few) == _each_read(source, few)  # no index: one scan
    table.execute(f'CREATE INDEX ON "{table.schema}".big (part)')
    table.execute(f'ANALYZE "{table.schema}".big')
    assert _split(source, few) == _each_read(source, few)  # one scan of the index (BitmapOr)
    assert source.read_partitions([{"partition": 3}, {"partition": 3}]) is None  # one twice
    assert source.read_partitions([{"partition": 3}]) is None
    many = [{"partition": value} for value in range(32_768)]
    scan = source.read_partitions(many)  # one array of values, not two parameters each
    assert scan is not None and sum(len(rows) for _, rows in scan) == 20_000
    mixed = [*many[:-1], {"partition": "32767"}]  # mixed kinds: a CASE of 65,536 parameters
    assert source.read_partitions(mixed) is None

    table.execute(
        f'CREATE TABLE "{table.schema}".split (id integer, part integer) PARTITION BY LIST (part)'
    )
    for value in (3, 7):
        table.execute(
            f'CREATE TABLE "{table.schema}".split_{value} PARTITION OF "{table.schema}".split'
            f" FOR VALUES IN ({value})"
        )
    table.execute(
        f'INSERT INTO "{table.schema}".split SELECT i, 3 + 4 * (i % 2)'
        " FROM generate_series(1, 20000) AS i"
    )
    table.execute(f'ANALYZE "{table.schema}".split')
    split_source = PostgresSource(table.url, f"{table.schema}.split", "part")
    assert split_source.read_partitions(few) is None  # each read prunes to its own table


def _ranges(cuts: list[Any], *, null: bool, window: dict[str, Any]) -> list[dict[str, Any]]:
    edges = [None, *cuts, None]
    ranges = [
        {"partition_from": low, "partition_below": high, **window}
        for low, high in zip(edges, edges[1:], strict=False)
    ]
    return ([{"partition": None, **window}] if null else []) + ranges


@pytest.mark.parametrize(
    ("declared", "stored", "cuts"),
    [
        ("integer", list(range(-5, 40, 3)), ["03", "10", "17", "30"]),  # edges as text
        ("bigint", [-(2**63), -1, 0, 1, 2**63 - 1], [-1, 0, 2**62]),
        ("numeric(6,2)", ["1.00", "2.5", "2.51", "9.99", "-3"], ["1.0", "2.501", "9"]),  # unrounded
        ("character(3)", ["ab", "abc", "b", "B"], ["abc", "b"]),  # not cut to one character
        ("double precision", ["-Infinity", "-0.5", "0", "1e300", "NaN"], [-0.5, 1.0, float("nan")]),
        ("text", ["a", "A", "a ", "", "é", "zz", "b"], ["A", "a", "b"]),  # the default: C here
        ("date", ["2024-01-01", "2024-02-29", "2023-12-31"], ["2024-01-01", "2024-02-29"]),
        (
            "timestamp",
            ["2024-01-01 00:00:00", "2024-01-01 00:00:00.5", "2024-01-02", "2024-03-01 12:00"],
            ["2024-01-01 00:00:00.5", "2024-01-02", "2024-02-01"],
        ),
    ],
)
def test_one_scan_gives_each_key_range_exactly_its_own_reads_rows(table, declared, stored, cuts):
    """Key ranges in any order, one left out, the NULL key's partition, inside cursor windows:
    one scan gives each exactly what its own read (``>=`` and ``<`` on the server) selects, in
    the server's types and order (text edges, ``NaN`` above every number)."""
    table.execute(f'CREATE TABLE "{table.schema}".p (id serial, part {declared}, cur integer)')
    for cur, value in enumerate([*stored, None] * 3):
        table.execute(f'INSERT INTO "{table.schema}".p (part, cur) VALUES (%s, %s)', (value, cur))
    source = PostgresSource(table.url, f"{table.schema}.p", "part", "cur")
    for window in ({}, {"cursor_after": 2, "cursor_upto": 20}):
        every = _ranges(cuts, null=True, window=window)
        for bounds in (every, every[::-1], every[1:], every[:2] + every[3:]):
            got = _split(source, bounds)
            want = _each_read(source, bounds)
            assert got is not None and repr(sorted(got.items())) == repr(sorted(want.items()))


def test_key_ranges_the_server_could_place_otherwise_are_left_to_their_reads(table):
    table.execute(
        f'CREATE TABLE "{table.schema}".r AS SELECT i AS id, i % 1000 AS part,'
        ' (i % 1000)::text COLLATE "POSIX" AS word, (i % 1000 / 7.0)::real AS ratio'
        " FROM generate_series(1, 20000) AS i"
    )
    table.execute(f'ANALYZE "{table.schema}".r')
    source = PostgresSource(table.url, f"{table.schema}.r", "part")
    cut = [{"partition_from": None, "partition_below": 500}, {"partition_from": 500}]
    assert _split(source, cut) == _each_read(source, cut)  # no index: one scan
    overlapping = [{"partition_from": 0, "partition_below": 600}, {"partition_from": 500}]
    assert source.read_partitions(overlapping) is None
    twice = [{"partition_from": 5, "partition_below": 9}, {"partition_from": 5}]
    assert source.read_partitions(twice) is None
    mixed = [{"partition_from": None, "partition_below": "5"}, {"partition_from": 5}]
    assert source.read_partitions(mixed) is None  # one array cannot take both kinds
    for other in (2.5, decimal.Decimal("1.4")):  # ">=" compares them otherwise than an array
        assert source.read_partitions([{"partition_from": None, "partition_below": other},
                                       {"partition_from": other}]) is None  # fmt: skip
    big = [{"partition": 3, "cursor_after": 2**53}, {"partition": 7, "cursor_after": 2.0**53}]
    assert (
        PostgresSource(table.url, f"{table.schema}.r", "part", "id").read_partitions(big) is None
    )  # equal in Python; a bigint against a double in SQL
    windows = [{**cut[0], "cursor_after": 0}, {**cut[1], "cursor_after": False}]
    assert (
        PostgresSource(table.url, f"{table.schema}.r", "part", "id").read_partitions(windows)
        is None
    )  # equal in Python, not in SQL: False adds no condition
    real = PostgresSource(table.url, f"{table.schema}.r", "ratio", partition_rows=2000)
    assert real.read_partitions(real.partition_ranges()) is None  # doubles of a real key
    open_inside = [{"partition_from": None}, {"partition_from": 500, "partition_below": 600}]
    assert source.read_partitions(open_inside) is None
    collated = PostgresSource(table.url, f"{table.schema}.r", "word")
    words = [{"partition_from": None, "partition_below": "5"}, {"partition_from": "5"}]
    assert collated.read_partitions(words) is None  # the edges would be sorted in another


_CI_DOMAIN = (
    "CREATE COLLATION {s}.ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);"
    " CREATE DOMAIN {s}.cidom AS text COLLATE {s}.ci"
)


@pytest.mark.parametrize(
    ("declared", "stored", "bounds"),
    [
        ("numeric", ["1.0", "2"], ["1.0", "1.00"]),  # equal on the server
        ("integer", [1, 2], [1, "1"]),  # a retry's JSON beside a listing
        ("interval", ["1 day", "2 days"], ["1 day", "24 hours"]),
        ("double precision", [float("nan"), 1.0], [float("nan"), float("nan")]),
        ("character(4)", ["a", "b"], ["a", "a  "]),
        ("{s}.cidom", ["a", "A", "b"], ["a", "A"]),  # 'a' = 'A' in the domain's collation
        ("timetz", ["12:00+01", "11:00+00"], ["12:00+01", "11:00+00"]),
        ("macaddr", ["08:00:2b:01:02:01", "08:00:2b:01:02:02"], None),  # ranges, cut below
        ('{s}.cidom COLLATE "default"', ["a", "A", "b", "B"], ["a", "b"]),
    ],
)
def test_partitions_the_server_holds_equal_or_places_otherwise_are_never_mixed_up(
    table, declared, stored, bounds
):
    """Values the server holds equal would share rows that their own reads each return, and
    ``width_bucket`` misplaces a ``timetz`` or ``macaddr`` (its array's elements are aligned
    beyond their length) and compares a domain in its own collation: each is read on its own,
    or by a scan that gives each partition exactly its own read's rows."""
    table.execute(_CI_DOMAIN.format(s=f'"{table.schema}"'))
    declared = declared.format(s=f'"{table.schema}"')
    table.execute(f'CREATE TABLE "{table.schema}".q (id serial, part {declared}, cur integer)')
    for cur, value in enumerate(stored * 20):
        table.execute(f'INSERT INTO "{table.schema}".q (part, cur) VALUES (%s, %s)', (value, cur))
    source = PostgresSource(table.url, f"{table.schema}.q", "part", "cur")
    if bounds is None:
        cut = stored[1]
        partitions = [{"partition_from": None, "partition_below": cut}, {"partition_from": cut}]
    else:
        partitions = [{"partition": value} for value in bounds]
    got, want = _split(source, partitions), _each_read(source, partitions)
    shared = sum(map(len, want.values())) > len(stored) * 20  # a row in two reads
    assert got is None if shared else got in (None, want)


@pytest.mark.parametrize("strategy", ["incremental_append", "full_refresh"])
@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_key_ranges_of_a_postgres_source_are_one_scan_and_every_row_lands_once(
    tmp_path, table, path, strategy
):
    """200 ranges: one scan (no range read on its own), every row once, in two runs."""
    table.execute(
        f'INSERT INTO "{table.schema}".orders (id, region, updated_at) SELECT i,'
        " CASE WHEN i %% 97 = 0 THEN NULL ELSE lpad(((i * 7919) %% 4000)::text, 4, '0') END,"
        f" %s FROM generate_series(100, 4099) AS i",
        (TS,),
    )
    CountingPostgresSource.reads = 0
    source = CountingPostgresSource(
        table.url, table.name, "region", "updated_at", partition_rows=20
    )
    sink = SQLiteSink(tmp_path / "target.db", "orders_copy")
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))
    try:
        runtime = TransferRuntime(store)
        spec = TransferSpec(source=source, sink=sink, strategy=strategy, path=path, run_id="r1")
        first = runtime.run(spec)
        assert len(first.committed_partition_ids) > 150
        table.insert(LATER)
        second = runtime.run(attrs.evolve(spec, run_id="r2"))
    finally:
        store.close()
    ids = [row[0] for row in table.execute(f'SELECT id FROM "{table.schema}".orders')]
    assert CountingPostgresSource.reads == 0
    assert second.rows_loaded == (len(LATER) if strategy == "incremental_append" else len(ids))
    assert_rows_exactly_once(ids, [row[0] for row in sink.rows()])


class CountingPostgresSource(PostgresSource):
    """The real source, counting the partitions it reads on their own."""

    reads = 0

    def read(self, bounds: Any, *, chunk_rows: int = 10_000) -> Any:
        type(self).reads += 1
        return super().read(bounds, chunk_rows=chunk_rows)


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_an_unindexed_postgres_source_is_scanned_once_and_every_row_lands_once(
    tmp_path, table, path
):
    table.execute(
        f"INSERT INTO \"{table.schema}\".orders (id, region) SELECT i, (ARRAY['a', 'b',"
        " NULL])[1 + i % 3] FROM generate_series(100, 2099) AS i"
    )
    CountingPostgresSource.reads = 0
    source = CountingPostgresSource(table.url, table.name, "region")
    sink = SQLiteSink(tmp_path / "target.db", "orders_copy")
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))
    try:
        spec = TransferSpec(
            source=source, sink=sink, strategy="full_refresh", path=path, run_id="r"
        )
        result = TransferRuntime(store).run(spec)
    finally:
        store.close()
    ids = [row[0] for row in table.execute(f'SELECT id FROM "{table.schema}".orders')]
    assert (result.rows_loaded, CountingPostgresSource.reads) == (len(ids), 0)
    assert_rows_exactly_once(ids, [row[0] for row in sink.rows()])


class MovingPostgresSource(MovingRows, PostgresSource):
    """Moves a row of each partition still to read into the one read, and one back."""

    admin: Table

    def move(self, done: Any) -> None:
        name = self.admin.name.replace(".", '"."')
        self.admin.execute(
            f'UPDATE "{name}" SET region = %s WHERE id IN (SELECT min(id) FROM "{name}"'
            " WHERE region IS DISTINCT FROM %s GROUP BY region)",
            (done, done),
        )
        self.admin.execute(
            f'UPDATE "{name}" SET region = %s WHERE id = (SELECT min(id) FROM "{name}"'
            " WHERE region IS NOT DISTINCT FROM %s)",
            ("south" if done != "south" else "north", done),
        )


@pytest.mark.parametrize("strategy", ["incremental_append", "full_refresh"])
@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_rows_moved_between_partitions_during_an_attempt_are_read_as_they_were(
    tmp_path, table, path, strategy
):
    """The attempt reads one snapshot (``Snapshotting``): rows a writer moves from a partition
    not yet read into one already read, and back, are neither lost nor loaded twice."""
    table.insert(LATER)
    start = sorted(row[0] for row in table.execute(f'SELECT id FROM "{table.schema}".orders'))
    MovingPostgresSource.admin = table
    source = MovingPostgresSource(table.url, table.name, "region", "updated_at")
    sink = SQLiteSink(tmp_path / "target.db", "orders_copy")
    result = transfer_once(tmp_path, source, sink, path=path, strategy=strategy)
    assert source.moved and result.rows_loaded == len(start)
    assert_rows_exactly_once(start, [row[0] for row in sink.rows()])


def test_a_login_allowed_one_connection_reads_on_without_the_snapshot(tmp_path, table):
    """The snapshot's holder and each read's own connection take two: a login limited to
    one (``CONNECTION LIMIT 1``) failed every run. The attempt now ends the snapshot at the
    first read it cannot open, and reads on as it did before (a transaction per read)."""
    role = f"one_{secrets.token_hex(4)}"
    table.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' CONNECTION LIMIT 1")
    try:
        table.execute(f'GRANT USAGE ON SCHEMA "{table.schema}" TO {role}')
        table.execute(f'GRANT SELECT ON "{table.schema}".orders TO {role}')
        parts = psycopg.conninfo.conninfo_to_dict(table.dsn)
        login = psycopg.conninfo.make_conninfo(**{**parts, "user": role, "password": "pw"})
        source = PostgresSource(postgres_url(login), table.name, "region", "updated_at")
        sink = SQLiteSink(tmp_path / "target.db", "orders_copy")
        result = transfer_once(tmp_path, source, sink, path="legacy", strategy="full_refresh")
        assert result.rows_loaded == len(ORDERS)
        assert sorted(row[0] for row in sink.rows()) == [row[0] for row in ORDERS]
    finally:
        table.execute(f'REVOKE ALL ON "{table.schema}".orders FROM {role}')
        table.execute(f'REVOKE ALL ON SCHEMA "{table.schema}" FROM {role}')
        table.execute(f"DROP ROLE {role}")


@pytest.fixture(params=["sqlite", "duckdb"])
def sink_kind(request) -> str:
    return request.param


def _sink(kind: str, tmp: Path) -> Any:
    if kind == "duckdb":
        return DuckDBSink(tmp / "target.duckdb", "orders_copy")
    return SQLiteSink(tmp / "target.db", "orders_copy")


@pytest.mark.parametrize("strategy", ["incremental_append", "full_refresh"])
@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_postgres_to_sqlite_and_duckdb(tmp_path, table, sink_kind, path, strategy):
    route = PgRoute(tmp_path, table, _sink(sink_kind, tmp_path), strategy)
    try:
        first = route.run(path, "run-1")
        assert first.rows_loaded == len(ORDERS) and len(first.committed_partition_ids) == 3
        assert sorted(route.sink.inner.rows()) == _expected(sink_kind, ORDERS)

        table.insert(LATER)
        second = route.run(path, "run-2")
        everything = ORDERS + LATER
        if strategy == "incremental_append":  # only the cursor window past the watermark
            assert second.rows_loaded == len(LATER)
            assert len(second.committed_partition_ids) == 3  # NULL, north, west
        else:
            assert second.rows_loaded == len(everything)
        assert sorted(route.sink.inner.rows()) == _expected(sink_kind, everything)
        target_ids = [row[0] for row in route.sink.inner.rows()]
        assert_rows_exactly_once([row[0] for row in everything], target_ids)

        third = route.run(path, "run-3")  # nothing new
        assert third.rows_loaded == (0 if strategy == "incremental_append" else len(everything))
        assert sorted(route.sink.inner.rows()) == _expected(sink_kind, everything)
    finally:
        route.real_store.close()


def test_lazy_plan_from_postgres_into_duckdb_is_config_invalid(tmp_path, table):
    route = PgRoute(tmp_path, table, _sink("duckdb", tmp_path), "incremental_append")
    try:
        with pytest.raises(
            ConfigInvalid, match="path 'lazy-plan' cannot run.*DuckDB reads SQLite sources only"
        ):
            route.run("lazy-plan", "run-1")
        assert not (tmp_path / "target.duckdb").exists()
    finally:
        route.real_store.close()


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_postgres_to_duckdb_partial_commit_blocks_the_retry(tmp_path, table, path):
    route = PgRoute(tmp_path, table, _sink("duckdb", tmp_path), "incremental_append")
    try:
        original = route.store.fail_batch(phase_batch("checkpoint_committed"), keep=1)
        with pytest.raises(InjectedFault) as caught:
            route.run(path, "run-1")
        assert caught.value is original
        table.insert(LATER)
        assert_blocked_before_target(lambda: route.run(path, "retry"), route.sink)
        assert route.sink.target_calls == 1
        assert sorted(route.sink.inner.rows()) == sorted(ORDERS)
    finally:
        route.real_store.close()


@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_lazy_plan_from_postgres_is_refused_before_the_target(tmp_path, table, kind):
    route = PgRoute(tmp_path, table, _sink(kind, tmp_path), "incremental_append")
    try:
        with pytest.raises(
            ConfigInvalid, match="path 'lazy-plan' cannot run.* reads SQLite sources only"
        ):
            route.run("lazy-plan", "run-1")
        assert route.sink.target_calls == 0
        assert route.store.batches == []  # nothing armed: the route is not blocked
        assert route.run("legacy", "run-2").rows_loaded == len(ORDERS)
    finally:
        route.real_store.close()


@pytest.mark.parametrize(
    ("target", "path"),
    [("sqlite", "legacy"), ("clickhouse", "legacy"), ("clickhouse", "lazy-plan")],
)
def test_a_logins_own_text_settings_change_no_value_loaded(postgres_schema, tmp_path, target, path):
    """A login (or database) whose defaults round a double's text (``extra_float_digits =
    -15``) or print intervals in ISO 8601 had its values changed in the target, exit 0:
    ``123456789.12345679`` loaded as ``100000000.0``. The source's sessions set every such
    setting; chDB's own pull, whose sessions take the login's defaults, is declined. Found
    by a hostile check."""
    from dpone_native_transfer.connectors.clickhouse import ClickHouseSink

    schema, role = postgres_schema.schema, f"r_{secrets.token_hex(4)}"
    doubles = [123456789.12345679, 0.30000000000000004, 2.5e-300, 1.7976931348623157e308]
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as admin:
        admin.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        # chDB reads no interval: lazy-plan's table has none, so that chDB would pull it
        interval = path != "lazy-plan"
        admin.execute(
            f'CREATE TABLE "{schema}".t (id integer, p integer, d float8'
            + (", i interval)" if interval else ")")
        )
        admin.execute(
            f'INSERT INTO "{schema}".t (id, p, d) VALUES (1, 0, %s), (2, 0, %s), (3, 1, %s),'
            " (4, 1, %s)",
            doubles,
        )
        if interval:
            admin.execute(f"UPDATE \"{schema}\".t SET i = '1 mon -1 day' WHERE id = 4")
        admin.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
        admin.execute(f"ALTER ROLE {role} SET extra_float_digits = -15")
        admin.execute(f"ALTER ROLE {role} SET intervalstyle = 'iso_8601'")
        admin.execute(f'GRANT USAGE ON SCHEMA "{schema}" TO {role}')
        admin.execute(f'GRANT SELECT ON "{schema}".t TO {role}')
    try:
        dsn = psycopg.conninfo.make_conninfo(postgres_schema.dsn, user=role, password="pw")
        source = PostgresSource(postgres_url(dsn), f"{schema}.t", "p")
        if target == "sqlite":
            sink: Any = SQLiteSink(tmp_path / "t.db", "copy")
        else:
            sink = ClickHouseSink(tmp_path / "chdata", "copy")
        transfer_once(tmp_path, source, sink, path=path, strategy="full_refresh")
        loaded = sorted(sink.rows())
    finally:
        with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")
    assert [row[2] for row in loaded] == doubles
    assert not interval or loaded[3][3] in ("1 mon -1 days", "1 mon -1 day")


@pytest.mark.parametrize("declared", ['text COLLATE "ci"', "citext"])
def test_a_cursor_compared_without_regard_to_case_is_refused_before_the_target(
    postgres_schema, tmp_path, declared
):
    """The server holds ``'B'`` and ``'b'`` equal under a nondeterministic collation (or
    ``citext``); dpone's cursor edge orders them apart, so the rows at the watermark were
    loaded again on every run, exit 0. Refused before any read, naming the key. Found by a
    hostile check."""
    schema = postgres_schema.schema
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as admin:
        admin.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        admin.execute(
            f'CREATE COLLATION IF NOT EXISTS "{schema}".ci'
            " (provider = icu, locale = 'und-u-ks-level2', deterministic = false)"
        )
        admin.execute("CREATE EXTENSION IF NOT EXISTS citext")
        declared = declared.replace('"ci"', f'"{schema}".ci')
        admin.execute(f'CREATE TABLE "{schema}".t (id integer, p integer, c {declared})')
        admin.execute(f"INSERT INTO \"{schema}\".t VALUES (1, 0, 'a'), (2, 0, 'B'), (3, 1, 'b')")
    source = PostgresSource(postgres_url(postgres_schema.dsn), f"{schema}.t", "p", "c")
    with pytest.raises(ConfigInvalid) as refused:
        transfer_once(
            tmp_path, source, SQLiteSink(tmp_path / "t.db", "copy"), path="legacy",
            strategy="incremental_append",
        )  # fmt: skip
    assert refused.value.diagnostics["key"] == "source.cursor_column"
    assert not (tmp_path / "t.db").exists()


def _cursor_table(table: Table, kind: str, values: list[Any]) -> None:
    table.execute(f'CREATE TABLE "{table.schema}".readings (id integer, p integer, c {kind})')
    add_readings(table, values, start=1)


def add_readings(table: Table, values: list[Any], *, start: int) -> None:
    rows = [(start + n, n % 2, value) for n, value in enumerate(values)]
    with contextlib.closing(psycopg.connect(table.dsn, autocommit=True)) as conn:
        sql = f'INSERT INTO "{table.schema}".readings VALUES (%s, %s, %s)'
        conn.cursor().executemany(sql, rows)


@pytest.mark.parametrize("path", ["legacy", "staged", "lazy-plan"])
def test_a_real_cursor_is_compared_as_a_real_and_loads_every_row_once(tmp_path, table, path):
    """A ``real`` cursor's values are read from their text (0.1, 0.3) and were bound as
    doubles: the column's 0.3 (0.30000001 as a double) was above a window's top of 0.3 and
    the row never loaded, exit 0; 0.1 rows sat outside the window and the edge alike. Each
    is compared as a ``real`` now. lazy-plan pulls into PostgreSQL through the same bounds."""
    _cursor_table(table, "real", [0.05, 0.1])
    runs = iter(["r1", "r2", "r3"])
    sink: Any = SQLiteSink(tmp_path / "target.db", "readings")
    if path == "lazy-plan":
        from dpone_native_transfer.connectors.postgres_sink import PostgresSink

        sink = PostgresSink(table.url, f"{table.schema}.readings_copy")
    source = PostgresSource(table.url, f"{table.schema}.readings", "p", "c")
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))
    try:
        runtime = TransferRuntime(store)

        def run() -> Any:
            spec = TransferSpec(
                source=source, sink=sink, strategy="incremental_append", path=path,
                run_id=next(runs),
            )  # fmt: skip
            return runtime.run(spec)

        run()
        add_readings(table, [0.1, 0.3], start=3)
        run()
        assert run().rows_loaded == 0
    finally:
        store.close()
    assert sorted(row[0] for row in sink.rows()) == [1, 2, 3, 4]


def test_a_numeric_cursor_holding_nan_is_refused_before_the_target(tmp_path, table):
    """PostgreSQL orders NaN above every number: a window ending at NaN reloaded its row on
    every run (the target gained a copy each time, exit 0) and rows added later never
    loaded. Refused, naming the column and no value."""
    _cursor_table(table, "numeric", [decimal.Decimal(v) for v in ("1", "NaN", "2")])
    source = PostgresSource(table.url, f"{table.schema}.readings", "p", "c")
    sink = SQLiteSink(tmp_path / "target.db", "readings")
    info = refused_append(tmp_path, source, sink)
    assert info.diagnostics == {"table": f"{table.schema}.readings", "column": "c"}
    assert "NaN" in info.message and not (tmp_path / "target.db").exists()


def test_a_table_rewrite_waits_for_the_attempts_snapshot_which_sees_every_row(table):
    """``ALTER TABLE ... TYPE`` rewrites the table; a snapshot taken before it commits sees
    the rewritten table empty (PostgreSQL's documented hazard), and a full refresh emptied
    its target, exit 0 (found by a hostile check). The attempt's snapshot holds the table's
    ``ACCESS SHARE`` lock, as ``pg_dump`` does: the rewrite waits (writers do not)."""
    source = PostgresSource(table.url, table.name, "region", "updated_at")
    with source.snapshot():
        with contextlib.closing(psycopg.connect(table.dsn, autocommit=True)) as other:
            other.execute("SET lock_timeout = '300ms'")
            other.execute(
                f'INSERT INTO "{table.schema}".orders (id, region) VALUES (100, %s)', ("x",)
            )
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute(f'ALTER TABLE "{table.schema}".orders ALTER note TYPE varchar(40)')
        assert len(_read_all(source)) == len(ORDERS)  # the snapshot's rows, all of them
    table.execute(f'ALTER TABLE "{table.schema}".orders ALTER note TYPE varchar(40)')


def test_a_materialized_view_is_read_under_its_lock_and_a_refresh_waits(tmp_path, table):
    """``LOCK TABLE`` refuses a materialized view: every run of one failed as "could not be
    read" (exit 1, a retry never mended it). It is locked by a read of no row; a ``REFRESH``
    waits for the attempt, and a full refresh loads the view's rows."""
    view = f'"{table.schema}".orders_view'
    table.execute(f'CREATE MATERIALIZED VIEW {view} AS SELECT * FROM "{table.schema}".orders')
    source = PostgresSource(table.url, f"{table.schema}.orders_view", "region", "updated_at")
    with source.snapshot():
        with contextlib.closing(psycopg.connect(table.dsn, autocommit=True)) as other:
            other.execute("SET lock_timeout = '300ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute(f"REFRESH MATERIALIZED VIEW {view}")
        assert len(_read_all(source)) == len(ORDERS)
    sink = SQLiteSink(tmp_path / "target.db", "orders_view")
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))
    try:
        spec = TransferSpec(
            source=source, sink=sink, strategy="full_refresh", path="legacy", run_id="r1"
        )
        assert TransferRuntime(store).run(spec).rows_loaded == len(ORDERS)
    finally:
        store.close()
    assert sorted(row[0] for row in sink.rows()) == sorted(row[0] for row in ORDERS)


def test_ddl_waiting_for_the_snapshot_fails_the_read_instead_of_hanging_it(table):
    """A TRUNCATE waits for the snapshot's lock; a read of the attempt queued behind it (it
    asks the same lock), and the run, the TRUNCATE and every reader of the table hung for
    good (a wait no deadlock check sees). The read gives up, a retry may succeed, and the
    TRUNCATE goes on once the attempt ends."""
    import threading

    source = PostgresSource(table.url, table.name, "region", "updated_at")
    truncated: list[BaseException | None] = []

    def truncate() -> None:
        try:
            with contextlib.closing(psycopg.connect(table.dsn, autocommit=True)) as other:
                other.execute(f'TRUNCATE "{table.schema}".orders')
            truncated.append(None)
        except BaseException as error:  # noqa: BLE001 - reported below
            truncated.append(error)

    with source.snapshot():
        waiting = threading.Thread(target=truncate)
        waiting.start()
        with contextlib.closing(psycopg.connect(table.dsn, autocommit=True)) as watch:
            for _ in range(200):  # until the TRUNCATE waits for the lock
                sql = "SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = %s::regclass"
                if watch.execute(sql, (f'"{table.schema}".orders',)).fetchone()[0]:
                    break
                time.sleep(0.05)
        with pytest.raises(SourceInvalid):
            _read_all(source)
    waiting.join(timeout=30)
    assert truncated == [None]


def test_rows_row_level_security_hides_fail_the_read(tmp_path, table):
    """A policy hiding rows from the source's login: a full refresh loaded the rows it could
    see, exit 0. ``row_security`` is off in the source's session, as ``pg_dump`` sets it:
    the read fails instead; the table's owner reads every row."""
    role = f"rls_{secrets.token_hex(4)}"
    orders = f'"{table.schema}".orders'
    table.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw'")
    try:
        table.execute(f'GRANT USAGE ON SCHEMA "{table.schema}" TO {role}')
        table.execute(f"GRANT SELECT ON {orders} TO {role}")
        table.execute(f"ALTER TABLE {orders} ENABLE ROW LEVEL SECURITY")
        table.execute(f"CREATE POLICY evens ON {orders} USING (id % 2 = 0)")
        dsn = psycopg.conninfo.make_conninfo(table.dsn, user=role, password="pw")
        hidden = PostgresSource(postgres_url(dsn), table.name, "region")
        with pytest.raises((SourceInvalid, SourceAccessRefused)):
            _read_all(hidden)
        owner = PostgresSource(table.url, table.name, "region")
        assert len(_read_all(owner)) == len(ORDERS)
    finally:
        table.execute(f"DROP OWNED BY {role}")
        table.execute(f"DROP ROLE {role}")


@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_columns_one_name_to_the_target_are_refused_before_the_target(tmp_path, table, kind):
    """A PostgreSQL source's ``v`` and ``"V"`` are one name to SQLite and DuckDB: the table
    could not be made, inside the target call (exit 1, "a retry may succeed", never true)."""
    table.execute(f'ALTER TABLE "{table.schema}".orders ADD COLUMN "Note" text')
    source = PostgresSource(table.url, table.name, "region", "updated_at")
    sink: Any = (
        SQLiteSink(tmp_path / "target.db", "orders")
        if kind == "sqlite"
        else DuckDBSink(tmp_path / "target.duckdb", "orders")
    )
    info = refused_append(tmp_path, source, sink)
    assert info.diagnostics == {"table": "orders", "columns": ["note", "Note"]}


def refused_append(tmp_path: Path, source: PostgresSource, sink: Any) -> ConfigInvalid:
    """The ``ConfigInvalid`` a legacy append of ``source`` into ``sink`` stops with."""
    store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))
    try:
        spec = TransferSpec(
            source=source, sink=sink, strategy="incremental_append", path="legacy", run_id="r1"
        )
        with pytest.raises(ConfigInvalid) as info:
            TransferRuntime(store).run(spec)
    finally:
        store.close()
    return info.value
