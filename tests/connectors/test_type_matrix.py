"""Issue 13, items 6 and 7: exact values on every target and path, or a refusal before the target.

Each source type is loaded through ``dpone-transfer run`` into SQLite, DuckDB,
ClickHouse (chDB) and PostgreSQL on every path the source allows, and every value is
compared after the round trip, as the target engine itself renders it as text.
A value a target cannot hold exactly must stop the run with exit 2 before the
target is touched: no target table, nothing blocked, and the route retryable.
One source value gets one outcome on every path of a target: loaded as the same
value, or refused so (``test_an_odd_value_gets_one_outcome_on_every_path``).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.cli import run_cli

PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")
TARGET_FILES = {"sqlite": "target.db", "duckdb": "target.duckdb", "clickhouse": "chdata"}

ROUTE = """\
[source]
{source}
table = "{table}"
partition_column = "p"
[target]
kind = "{kind}"
{target}
[transfer]
strategy = "full_refresh"
path = "{path}"
[store]
path = "checkpoints.db"
"""


def run(folder: Path, source: str, table: str, kind: str, path: str, *, env=None, target=None):
    """One run; ``target``: the ``[target]`` location and table lines (default: the file)."""
    target = target or f'path = "{TARGET_FILES.get(kind)}"\ntable = "copy"'
    (folder / "route.toml").write_text(
        ROUTE.format(source=source, table=table, kind=kind, target=target, path=path)
    )
    return run_cli("run", folder / "route.toml", "--quiet", env=env)  # in this process


def target_texts(folder: Path, kind: str, columns: list[str]) -> list[tuple]:
    """Every row of the target, ordered by id, each value as the engine renders it as text."""
    if kind == "sqlite":
        exprs = ", ".join(f"nullif(quote(\"{c}\"), 'NULL')" for c in columns)
        with contextlib.closing(sqlite3.connect(folder / "target.db")) as db:
            return db.execute(f"SELECT {exprs} FROM copy ORDER BY id").fetchall()
    if kind == "duckdb":
        import duckdb

        exprs = ", ".join(f'CAST("{c}" AS VARCHAR)' for c in columns)
        target = str(folder / "target.duckdb")
        with contextlib.closing(duckdb.connect(target, read_only=True)) as db:
            return db.execute(f"SELECT {exprs} FROM copy ORDER BY id").fetchall()
    from dpone_native_transfer import ClickHouseSink

    exprs = ", ".join(f"toString(`{c}`)" for c in columns)
    with ClickHouseSink(folder / "chdata", "copy").client() as client:
        return client.query_rows(f"SELECT {exprs} FROM copy ORDER BY id")


def assert_refused_before_target(done: subprocess.CompletedProcess, folder: Path, column: str):
    assert done.returncode == 2, done.stdout + done.stderr
    assert "native_transfer_value_unsupported" in done.stderr
    assert f"column {column!r}" in done.stderr
    assert "target_outcome_unknown" not in done.stdout + done.stderr
    from dpone_native_transfer import ClickHouseSink, DuckDBSink, SQLiteSink

    sinks = {"sqlite": SQLiteSink, "duckdb": DuckDBSink, "clickhouse": ClickHouseSink}
    for kind, name in TARGET_FILES.items():  # no target table was created or changed
        if (folder / name).exists():
            assert sinks[kind](folder / name, "copy").row_count() == 0


# --- SQLite source: every affinity and the common declared types ------------------------------

# (name, declared type, row 1 value, row 2 value); row 3 holds NULLs.
SQLITE_COLUMNS = [
    ("i", "INTEGER", 2**62, -1),
    ("r", "REAL", float("inf"), 0.1),
    ("t", "TEXT", "é\t\"x'", ""),
    ("b", "BLOB", b"\xff\x00", b""),
    ("u", "", "3.5", "x"),  # an untyped column's text; a number in it is refused (ODD)
    ("n", "NUMERIC(12,2)", 1.1, -7),
    ("m", "NUMERIC", 12, 2.5),
    ("f", "BOOLEAN", 1, 0),  # SQLite's TRUE and FALSE; a text or a 2 is refused (ODD)
    ("d", "DATE", "2024-02-29", "1900-01-01"),
    ("ts", "TIMESTAMP", "2024-01-05 10:00:00+02:00", "2024-01-05 10:00:00.123456"),
    ("tm", "TIME", "23:59:59.5", "00:00:00"),
    ("tz", "TIMESTAMP WITH TIME ZONE", "2024-01-05 10:00:00+02:00", "2024-01-05T10:00:00Z"),
]

SQLITE_EXPECTED = {  # None: the target's NULL
    "duckdb": [
        ("4611686018427387904", "-1"),
        ("inf", "0.1"),
        ("é\t\"x'", ""),
        ("\\xFF\\x00", ""),
        ("3.5", "x"),
        ("1.10", "-7.00"),
        ("12.0", "2.5"),
        ("true", "false"),
        ("2024-02-29", "1900-01-01"),
        ("2024-01-05 08:00:00", "2024-01-05 10:00:00.123456"),
        ("23:59:59.5", "00:00:00"),
        ("2024-01-05 08:00:00+00", "2024-01-05 10:00:00+00"),
    ],
    "clickhouse": [
        ("4611686018427387904", "-1"),
        ("inf", "0.1"),
        ("é\t\"x'", ""),
        ("\udcff\x00", ""),
        ("3.5", "x"),
        ("1.1", "-7"),
        ("12", "2.5"),
        ("true", "false"),
        ("2024-02-29", "1900-01-01"),
        ("2024-01-05 08:00:00.000000", "2024-01-05 10:00:00.123456"),
        ("23:59:59.5", "00:00:00"),
        ("2024-01-05 08:00:00.000000", "2024-01-05 10:00:00.000000"),
    ],
}
# Kinds an engine's own SQLite reader does not read as the row paths carry them: lazy-plan
# carries their rows as legacy does (PlanInexact), and DuckDB's pulls leave them to Python.
CARRIED = {"u", "n", "m", "ts", "tm", "tz"}
# DuckDB's scanner reads NUMERIC and DECIMAL(p,s) as doubles, and DuckDB checks them (issue 47).
CARRIED_BY_DUCKDB = CARRIED - {"n", "m"}


def sqlite_source(folder: Path, columns: list[tuple]) -> None:
    definitions = ", ".join(f'"{name}" {decl}' for name, decl, *_ in columns)
    rows = [
        (1, 0, *[c[2] for c in columns]),
        (2, 1, *[c[3] for c in columns]),
        (3, 1, *[None for _ in columns]),
    ]
    with contextlib.closing(sqlite3.connect(folder / "source.db")) as db:
        db.execute(f"CREATE TABLE src (id INTEGER PRIMARY KEY, p INTEGER, {definitions})")
        db.executemany(f"INSERT INTO src VALUES ({', '.join('?' * len(rows[0]))})", rows)
        db.commit()


@pytest.mark.parametrize("path", PATHS)
def test_sqlite_to_sqlite_keeps_every_value_and_storage_class(tmp_path: Path, path: str) -> None:
    sqlite_source(tmp_path, SQLITE_COLUMNS)
    done = run(tmp_path, 'path = "source.db"', "src", "sqlite", path)
    assert done.returncode == 0, done.stderr
    again = run(tmp_path, 'path = "source.db"', "src", "sqlite", path)  # the table it made
    assert again.returncode == 0, again.stderr  # takes every column: no retype is seen
    names = ["id", *(c[0] for c in SQLITE_COLUMNS)]
    exprs = ", ".join(f'quote("{c}"), typeof("{c}")' for c in names)
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        expected = db.execute(f"SELECT {exprs} FROM src ORDER BY id").fetchall()
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as db:
        assert db.execute(f"SELECT {exprs} FROM copy ORDER BY id").fetchall() == expected


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["duckdb", "clickhouse"])
def test_sqlite_to_engines_value_by_value(tmp_path: Path, kind: str, path: str) -> None:
    columns = SQLITE_COLUMNS
    expected = SQLITE_EXPECTED[kind]
    sqlite_source(tmp_path, columns)
    done = run(tmp_path, 'path = "source.db"', "src", kind, path)
    assert done.returncode == 0, done.stderr
    again = run(tmp_path, 'path = "source.db"', "src", kind, path)  # the table it made
    assert again.returncode == 0, again.stderr  # takes every column: no retype is seen
    got = target_texts(tmp_path, kind, [c[0] for c in columns])
    by_column = list(zip(*got, strict=True))
    for (name, decl, *_), want, values in zip(columns, expected, by_column, strict=True):
        assert values == (*want, None), f"{name} {decl}"


@pytest.mark.parametrize("path", ["legacy", "file-artifact"])
def test_sqlite_to_duckdb_files_duckdb_writes_itself_value_by_value(
    tmp_path: Path, path: str, monkeypatch
) -> None:
    """With only kinds DuckDB's scanner reads exactly, DuckDB writes the load files itself
    (``FilePulling``): every value is still the one the other paths load."""
    from dpone_native_transfer import DuckDBSink

    pulled: list[bool] = []
    real = DuckDBSink.pull_load_files

    def spy(self, plan, paths):
        files = real(self, plan, paths)
        pulled.append(files is not None)
        return files

    monkeypatch.setattr(DuckDBSink, "pull_load_files", spy)
    keep = [index for index, c in enumerate(SQLITE_COLUMNS) if c[0] not in CARRIED_BY_DUCKDB]
    columns = [SQLITE_COLUMNS[i] for i in keep]
    expected = [SQLITE_EXPECTED["duckdb"][i] for i in keep]
    sqlite_source(tmp_path, columns)
    for _ in range(2):  # the second run loads into the table the first made
        done = run(tmp_path, 'path = "source.db"', "src", "duckdb", path)
        assert done.returncode == 0, done.stderr
    assert pulled == [True, True]
    got = target_texts(tmp_path, "duckdb", [c[0] for c in columns])
    for (name, decl, *_), want, values in zip(
        columns, expected, zip(*got, strict=True), strict=True
    ):
        assert values == (*want, None), f"{name} {decl}"


@pytest.mark.parametrize("kind", ["duckdb", "clickhouse"])
def test_lazy_plan_carries_the_rows_its_engine_would_read_otherwise(
    tmp_path: Path, kind: str, monkeypatch
) -> None:
    """Such a plan was refused (exit 2) where the row paths loaded it: now lazy-plan carries
    its rows, and loads what legacy loads."""
    from dpone_native_transfer.paths import lazy_plan

    carried: list[bool] = []
    real = lazy_plan.legacy_path
    monkeypatch.setattr(lazy_plan, "legacy_path", lambda ctx: carried.append(True) or real(ctx))
    sqlite_source(tmp_path, [c for c in SQLITE_COLUMNS if c[0] in CARRIED])
    done = run(tmp_path, 'path = "source.db"', "src", kind, "lazy-plan")
    assert done.returncode == 0, done.stdout + done.stderr
    assert carried == [True]
    expected = [w for c, w in zip(SQLITE_COLUMNS, SQLITE_EXPECTED[kind], strict=True)
                if c[0] in CARRIED]  # fmt: skip
    got = target_texts(tmp_path, kind, [c[0] for c in SQLITE_COLUMNS if c[0] in CARRIED])
    assert list(zip(*got, strict=True)) == [(*want, None) for want in expected]


def test_lazy_plan_reads_integer_booleans_and_naive_timestamps(tmp_path: Path) -> None:
    """The misread checks look at stored values: 0/1 booleans and offset-free text pass."""
    columns = [("f", "BOOLEAN", 1, 0), ("ts", "TIMESTAMP", "2024-01-05 10:00:00", "2024-01-06")]
    sqlite_source(tmp_path, columns)
    done = run(tmp_path, 'path = "source.db"', "src", "duckdb", "lazy-plan")
    assert done.returncode == 0, done.stderr
    assert target_texts(tmp_path, "duckdb", ["f", "ts"]) == [
        ("true", "2024-01-05 10:00:00"),
        ("false", "2024-01-06 00:00:00"),
        (None, None),
    ]


# Real schemas' kinds DuckDB's scanner now reads itself (issue 47, item 5): decimals, which it
# reads as doubles and checks in one scan, and instants at UTC's own offset (``Z``, ``+00:00``).
REAL_KINDS = [
    ("n", "DECIMAL(15,2)", 1.1, -7),
    ("big", "NUMERIC(38,4)", 123456789.1234, 10**9),
    ("m", "NUMERIC", 12, 2.5),
    ("ts", "TIMESTAMP", "2013-01-01T10:00:00Z", "2013-01-01T10:00:00.25+00:00"),
    ("dt", "DATETIME", "2013-01-01T10:00:00.123456Z", "2013-01-01T10:00:00"),
]
REAL_KINDS_EXPECTED = {
    "duckdb": [
        ("1.10", "-7.00"),
        ("123456789.1234", "1000000000.0000"),
        ("12.0", "2.5"),
        ("2013-01-01 10:00:00", "2013-01-01 10:00:00.25"),
        ("2013-01-01 10:00:00.123456", "2013-01-01 10:00:00"),
    ],
    "clickhouse": [
        ("1.1", "-7"),
        ("123456789.1234", "1000000000"),
        ("12", "2.5"),
        ("2013-01-01 10:00:00.000000", "2013-01-01 10:00:00.250000"),
        ("2013-01-01 10:00:00.123456", "2013-01-01 10:00:00.000000"),
    ],
}


def _spy_carried(monkeypatch) -> list[bool]:
    from dpone_native_transfer.paths import lazy_plan

    carried: list[bool] = []
    real = lazy_plan.legacy_path
    monkeypatch.setattr(lazy_plan, "legacy_path", lambda ctx: carried.append(True) or real(ctx))
    return carried


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["duckdb", "clickhouse"])
def test_real_kinds_reach_the_engines_exactly_and_lazy_plan_has_them_read(
    tmp_path: Path, kind: str, path: str, monkeypatch
) -> None:
    """Lazy-plan into DuckDB and ClickHouse has the engine read decimals and ``Z``
    timestamps itself (its rows are not carried), legacy and file-artifact have it write
    their load files, and every path loads the same values."""
    from dpone_native_transfer import ClickHouseSink, DuckDBSink

    carried = _spy_carried(monkeypatch)
    sink = DuckDBSink if kind == "duckdb" else ClickHouseSink
    pulled: list[bool] = []
    real = sink.pull_load_files

    def spy(self, plan, paths):
        files = real(self, plan, paths)
        pulled.append(files is not None)
        return files

    monkeypatch.setattr(sink, "pull_load_files", spy)
    sqlite_source(tmp_path, REAL_KINDS)
    done = run(tmp_path, 'path = "source.db"', "src", kind, path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert carried == []
    if path in ("legacy", "file-artifact"):  # the engine wrote the load files itself
        assert pulled == [True]
    got = target_texts(tmp_path, kind, [c[0] for c in REAL_KINDS])
    assert list(zip(*got, strict=True)) == [(*want, None) for want in REAL_KINDS_EXPECTED[kind]]


# A value of a kind DuckDB's scanner reads that it would not read as the row paths carry it:
# lazy-plan carries the plan's rows, and the value gets the row paths' outcome (None: loaded).
SCANNED_ODD = [
    ("n", "DECIMAL(15,2)", 99.999, "refused"),  # DuckDB's cast would round it to 100.00
    ("n", "DECIMAL(15,2)", 0.1 + 0.2, "refused"),  # 0.30000000000000004, not 0.30
    ("n", "DECIMAL(30,2)", 2**53 + 1, "9007199254740993.00"),  # the scanner's double: ...992
    ("n", "DECIMAL(15,2)", "abc", "refused"),  # the scanner refuses a text with an error
    ("n", "DECIMAL(15,2)", b"\x01", "refused"),
    ("m", "NUMERIC", 2**53 + 1, "refused"),
    ("ts", "TIMESTAMP", "2013-01-01T10:00:00+02:00", "2013-01-01 08:00:00"),  # DuckDB drops it
    ("ts", "TIMESTAMP", "2013-01-01T10:00:00.1234567Z", "refused"),
]


@pytest.mark.parametrize(("column", "decl", "value", "outcome"), SCANNED_ODD)
def test_lazy_plan_into_duckdb_carries_a_value_its_scanner_would_misread(
    tmp_path: Path, column: str, decl: str, value: Any, outcome: str, monkeypatch
) -> None:
    carried = _spy_carried(monkeypatch)
    sqlite_source(tmp_path, [(column, decl, value, None)])
    done = run(tmp_path, 'path = "source.db"', "src", "duckdb", "lazy-plan")
    assert carried == [True]
    if outcome == "refused":
        assert_refused_before_target(done, tmp_path, column)
    else:
        assert done.returncode == 0, done.stdout + done.stderr
        assert target_texts(tmp_path, "duckdb", [column]) == [(outcome,), (None,), (None,)]
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    sqlite_source(legacy, [(column, decl, value, None)])
    again = run(legacy, 'path = "source.db"', "src", "duckdb", "legacy")
    assert again.returncode == done.returncode, again.stdout + again.stderr


@pytest.mark.parametrize(("column", "decl", "value", "_"), SCANNED_ODD)
def test_lazy_plan_into_clickhouse_loads_what_legacy_loads_of_odd_numbers_and_instants(
    tmp_path: Path, column: str, decl: str, value: Any, _: str
) -> None:
    """ClickHouse's ``sqlite()`` reads SQLite's text of each value (a real's has 15 digits):
    lazy-plan carries a plan holding a number that text would not carry exactly, so each
    value gets the outcome legacy gives it."""
    outcomes = []
    for path in ("lazy-plan", "legacy"):
        folder = tmp_path / path
        folder.mkdir()
        sqlite_source(folder, [(column, decl, value, None)])
        done = run(folder, 'path = "source.db"', "src", "clickhouse", path)
        loaded = target_texts(folder, "clickhouse", [column]) if done.returncode == 0 else None
        outcomes.append((done.returncode, loaded))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] in (0, 2)


# (column, declared type, a value that target cannot hold exactly, targets that refuse it)
SQLITE_REFUSED = [
    ("n", "NUMERIC(12,2)", 99.999, ("duckdb", "clickhouse")),  # would round to 100.00 / 99.99
    ("m", "NUMERIC", 2**60 + 1, ("duckdb", "clickhouse")),  # a double would lose the last digit
    ("f", "BOOLEAN", "yes", ("duckdb", "clickhouse")),
    ("u", "", b"\x00", ("duckdb", "clickhouse")),  # an untyped column holds text only
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(("column", "decl", "value", "targets"), SQLITE_REFUSED)
def test_a_value_a_target_cannot_hold_is_refused_before_the_target(
    tmp_path: Path, path: str, column: str, decl: str, value: Any, targets: tuple
) -> None:
    for kind in ("sqlite", "duckdb", "clickhouse"):
        folder = tmp_path / kind
        folder.mkdir()
        sqlite_source(folder, [(column, decl, value, None)])
        done = run(folder, 'path = "source.db"', "src", kind, path)
        if kind in targets:
            assert_refused_before_target(done, folder, column)
            with contextlib.closing(sqlite3.connect(folder / "checkpoints.db")) as store:
                guarded = "SELECT count(*) FROM checkpoint_latest WHERE guard IS NOT NULL"
                assert store.execute(guarded).fetchone() == (0,)  # nothing blocks a rerun
        else:
            assert done.returncode == 0, done.stderr


# --- PostgreSQL source: every common type ---------------------------------------------------

# (name, PostgreSQL type, row 1 literal, row 2 literal)
PG_COLUMNS = [
    ("i", "integer", "2147483647", "-1"),
    ("bi", "bigint", "9223372036854775807", "0"),
    ("n", "numeric", "12345678901234567890.123456789", "-0.5"),
    ("np", "numeric(12,2)", "9999999999.99", "1.10"),
    ("re", "real", "'NaN'", "1.5"),
    ("dp", "double precision", "'-Infinity'", "'Infinity'"),
    ("t", "text", "E'\\u00e9\\t'", "''"),
    ("by", "bytea", "'\\xff00'::bytea", "''::bytea"),
    ("bo", "boolean", "true", "false"),
    ("d", "date", "'2024-02-29'", "'1900-01-01'"),
    ("tm", "time", "'23:59:59.5'", "'00:00:00'"),
    ("ts", "timestamp", "'2024-01-05 10:00:00.123456'", "'1999-12-31 23:59:59'"),
    ("tz", "timestamptz", "'2024-01-05 10:00:00+02'", "'2024-01-05 10:00:00.5-01:30'"),
    ("iv", "interval", "'1 day 02:00:00'", "'1 year 2 mons'"),
    (
        "u",
        "uuid",
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
        "'00000000-0000-0000-0000-0000000000ff'",
    ),
    ("j", "json", "'{\"a\": 1.50}'", "'5'"),
    ("jb", "jsonb", "'{\"b\": [1, 2]}'", "'1.50'"),
    ("ar", "integer[]", "'{1,2}'", "'{}'"),
]

PG_EXPECTED = {
    "sqlite": [
        ("2147483647", "-1"),
        ("9223372036854775807", "0"),
        ("'12345678901234567890.123456789'", "'-0.5'"),
        ("'9999999999.99'", "'1.10'"),
        (None, "1.5"),  # a NaN is refused on SQLite: see the refusal test; row 1 is NULL here
        ("-Inf", "Inf"),
        ("'é\t'", "''"),
        ("X'FF00'", "X''"),
        ("1", "0"),
        ("'2024-02-29'", "'1900-01-01'"),
        ("'23:59:59.5'", "'00:00:00'"),
        ("'2024-01-05 10:00:00.123456'", "'1999-12-31 23:59:59'"),
        ("'2024-01-05 08:00:00+00'", "'2024-01-05 11:30:00.5+00'"),
        ("'1 day 02:00:00'", "'1 year 2 mons'"),
        ("'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "'00000000-0000-0000-0000-0000000000ff'"),
        ("'{\"a\": 1.50}'", "'5'"),
        ("'{\"b\": [1, 2]}'", "'1.50'"),
        ("'{1,2}'", "'{}'"),
    ],
    "duckdb": [
        ("2147483647", "-1"),
        ("9223372036854775807", "0"),
        ("12345678901234567890.123456789", "-0.5"),
        ("9999999999.99", "1.10"),
        ("nan", "1.5"),
        ("-inf", "inf"),
        ("é\t", ""),
        ("\\xFF\\x00", ""),
        ("true", "false"),
        ("2024-02-29", "1900-01-01"),
        ("23:59:59.5", "00:00:00"),
        ("2024-01-05 10:00:00.123456", "1999-12-31 23:59:59"),
        ("2024-01-05 08:00:00+00", "2024-01-05 11:30:00.5+00"),
        ("1 day 02:00:00", "1 year 2 mons"),  # PostgreSQL's text: DuckDB misreads some
        ("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-0000000000ff"),
        ('{"a": 1.50}', "5"),
        ('{"b": [1, 2]}', "1.50"),
        ("{1,2}", "{}"),
    ],
    "clickhouse": [
        ("2147483647", "-1"),
        ("9223372036854775807", "0"),
        ("12345678901234567890.123456789", "-0.5"),
        ("9999999999.99", "1.1"),
        ("nan", "1.5"),
        ("-inf", "inf"),
        ("é\t", ""),
        ("\udcff\x00", ""),
        ("true", "false"),
        ("2024-02-29", "1900-01-01"),
        ("23:59:59.5", "00:00:00"),
        ("2024-01-05 10:00:00.123456", "1999-12-31 23:59:59.000000"),
        ("2024-01-05 08:00:00.000000", "2024-01-05 11:30:00.500000"),
        ("1 day 02:00:00", "1 year 2 mons"),
        ("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-0000000000ff"),
        ('{"a": 1.50}', "5"),
        ('{"b": [1, 2]}', "1.50"),
        ("{1,2}", "{}"),
    ],
}


@pytest.fixture
def pg_table(postgres_schema) -> tuple[str, str]:
    """A table of every common type in a schema of this test's own: (url, qualified name)."""
    from helpers.postgres_server import postgres_url

    schema = postgres_schema.schema
    definitions = ", ".join(f"{name} {pg_type}" for name, pg_type, *_ in PG_COLUMNS)
    rows = [
        f"(1, 0, {', '.join(c[2] for c in PG_COLUMNS)})",
        f"(2, 1, {', '.join(c[3] for c in PG_COLUMNS)})",
        f"(3, 1, {', '.join('NULL' for _ in PG_COLUMNS)})",
    ]
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".src (id integer, p integer, {definitions})')
        conn.execute(f'INSERT INTO "{schema}".src VALUES {", ".join(rows)}')
    return postgres_url(postgres_schema.dsn), f"{schema}.src"


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "clickhouse"])
def test_postgres_to_every_target_value_by_value(
    tmp_path: Path, pg_table: tuple[str, str], kind: str, path: str
) -> None:
    url, table = pg_table
    columns = PG_COLUMNS
    expected = PG_EXPECTED[kind]
    if kind == "sqlite":  # NaN is refused by SQLite (next test): leave it out here
        with contextlib.closing(psycopg.connect(url, autocommit=True)) as conn:
            conn.execute(f"UPDATE {table} SET re = NULL WHERE id = 1")
    done = run(tmp_path, 'kind = "postgres"\ndsn = "env:MATRIX_DSN"', table, kind, path,
               env={"MATRIX_DSN": url})  # fmt: skip
    assert done.returncode == 0, done.stderr
    again = run(tmp_path, 'kind = "postgres"\ndsn = "env:MATRIX_DSN"', table, kind, path,
                env={"MATRIX_DSN": url})  # fmt: skip
    assert again.returncode == 0, again.stderr  # the table it made takes every column
    got = target_texts(tmp_path, kind, [c[0] for c in columns])
    by_column = list(zip(*got, strict=True))
    for (name, pg_type, *_), want, values in zip(columns, expected, by_column, strict=True):
        assert values == (*want, None), f"{name} {pg_type}"


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_a_postgres_nan_is_refused_by_sqlite_which_would_store_null(
    tmp_path: Path, pg_table: tuple[str, str], path: str
) -> None:
    url, table = pg_table
    done = run(tmp_path, 'kind = "postgres"\ndsn = "env:MATRIX_DSN"', table, "sqlite", path,
               env={"MATRIX_DSN": url})  # fmt: skip
    assert_refused_before_target(done, tmp_path, "re")


# --- SQLite's dynamic typing: any value in any column (found by a hostile pass) ---------------

# (declared type, a stored value the column's kind does not mean): the engines converted each
# silently ('0x1A' into BIGINT 26, 1.5 into 2, a date's time dropped, '' into Int64 0, ...) or
# failed inside the target call, which blocked the route.
MISFITS = [
    ("INTEGER", 1.5),
    ("INTEGER", "0x1A"),
    ("INTEGER", ""),
    ("REAL", "inf"),
    ("TEXT", b"A\xffB"),
    ("BLOB", 5),
    ("DATE", "2024-01-05 10:00:00"),
    ("DATE", 20240105),
    ("DATE", "garbage"),
    ("DATE", "2021-02-29"),  # SQLite's date() kept it; chDB loaded 2021-03-01
    ("DATE", "0000-01-01"),
    ("TIME", "10:00:00+02:00"),
    ("TIME", "25:00:00"),
    ("TIMESTAMP", "2024-01-05 10:00:00.1234567"),
    ("TIMESTAMP", "2016-12-31 23:59:60"),
    ("TIMESTAMP", "10:00:00"),
    ("TIMESTAMP", "0001-01-01 00:30:00+01:00"),  # before year 1 in UTC: an OverflowError
    ("TIMESTAMP", "2021-02-29T10:00:00Z"),  # chDB loaded NULL
    ("TIMESTAMP", "2020-01-01 24:00:00"),  # the engines loaded the next day's midnight
    ("TIMESTAMP", "0000-06-01 00:00:00"),  # chDB loaded 2026-01-01
    ("TIMESTAMP", "2020-01-01 10:00"),  # Python took it, chDB loaded NULL
    ("TIMESTAMP", "2020-01-01x10:00:00"),  # PostgreSQL kept the date alone
    ("TIMESTAMP", "2020-01-01 10:00:00\x00"),  # SQLite's test stopped at the NUL: chDB NULL
    ("TIME", "10:00:00,5"),  # DuckDB dropped the fraction
    ("NUMERIC(12,2)", "1_000"),
    ("NUMERIC(12,2)", "\u0661\u0662"),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["duckdb", "clickhouse"])
def test_a_value_its_column_kind_does_not_mean_is_refused_before_the_target(
    tmp_path: Path, kind: str, path: str
) -> None:
    for number, (decl, value) in enumerate(MISFITS):
        folder = tmp_path / str(number)
        folder.mkdir()
        sqlite_source(folder, [("v", decl, value, None)])
        done = run(folder, 'path = "source.db"', "src", kind, path)
        assert_refused_before_target(done, folder, "v")


@pytest.mark.parametrize("kind", ["duckdb", "clickhouse"])
def test_lazy_plan_refuses_a_partition_value_its_engine_would_read_otherwise(
    tmp_path: Path, kind: str
) -> None:
    """Lazy-plan lost the row of a partition value 1.5 stored in an INTEGER column; then it
    refused the plan (config_invalid). It is refused as the row paths refuse it now."""
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE TABLE src (id INTEGER PRIMARY KEY, p INTEGER)")
        db.executemany("INSERT INTO src VALUES (?, ?)", [(1, 1), (2, 1.5)])
        db.commit()
    for path in PATHS:
        assert_refused_before_target(run(tmp_path, 'path = "source.db"', "src", kind, path),
                                     tmp_path, "p")  # fmt: skip


@pytest.mark.parametrize(("kind", "path"), [("clickhouse", "file-artifact"), ("duckdb", "staged")])
def test_a_text_that_is_not_utf8_is_a_value_error_naming_the_table_never_the_text(
    tmp_path: Path, kind: str, path: str
) -> None:
    """Invalid UTF-8 stored as TEXT was native_transfer_source_invalid, exit 1 (retry). A path
    that reads the rows through Python refuses it (chDB's, when its pull is declined: a double
    quote in a column's name), and so does DuckDB's pull."""
    column = '"v""w"' if kind == "clickhouse" else "v"
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute(f"CREATE TABLE src (id INTEGER PRIMARY KEY, p INTEGER, {column} TEXT)")
        db.execute("INSERT INTO src VALUES (1, 0, CAST(x'41ff42' AS TEXT)), (2, 1, 'x')")
        db.commit()
    done = run(tmp_path, 'path = "source.db"', "src", kind, path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "native_transfer_value_unsupported" in done.stderr and "not valid UTF-8" in done.stderr
    assert "\\xff" not in done.stderr and "A\ufffdB" not in done.stderr  # never the text


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
def test_sqlite_copies_a_text_that_is_not_utf8_as_it_stores_it(tmp_path: Path, path: str) -> None:
    """SQLite to SQLite, the paths where SQLite copies the rows itself keep its bytes."""
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE TABLE src (id INTEGER PRIMARY KEY, p INTEGER, v TEXT)")
        db.execute("INSERT INTO src VALUES (1, 0, CAST(x'41ff42' AS TEXT)), (2, 1, 'é')")
        db.commit()
    done = run(tmp_path, 'path = "source.db"', "src", "sqlite", path)
    assert done.returncode == 0, done.stdout + done.stderr
    with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as db:
        copied = db.execute("SELECT id, hex(v), typeof(v) FROM copy ORDER BY id").fetchall()
    assert copied == [(1, "41FF42", "text"), (2, "C3A9", "text")]


@pytest.mark.parametrize("strict", ["", " STRICT"], ids=["table", "strict"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["duckdb", "clickhouse"])
def test_a_text_that_is_not_utf8_is_refused_before_the_engine_reads_it(
    tmp_path: Path, kind: str, path: str, strict: str
) -> None:
    """DuckDB's scanner read such a text into its load file or its lazy plan, and the target
    call failed on it (InvalidInputException, the route blocked). Now every path refuses it
    before the target, and the route runs once it is fixed. chDB's lazy plan and its pulls
    (legacy, staged, file-artifact) copy its bytes into a String, as SQLite's own copies do."""
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute(f"CREATE TABLE src (id INTEGER PRIMARY KEY, p INTEGER, v TEXT){strict}")
        db.execute("INSERT INTO src VALUES (1, 0, 'é'), (2, 0, CAST(x'41ff42' AS TEXT))")
        db.commit()
    done = run(tmp_path, 'path = "source.db"', "src", kind, path)
    if kind == "clickhouse":
        assert done.returncode == 0, done.stdout + done.stderr
        from dpone_native_transfer import ClickHouseSink

        with ClickHouseSink(tmp_path / "chdata", "copy").client() as client:
            copied = client.query_rows("SELECT toString(id), hex(v) FROM copy ORDER BY id")
        assert copied == [("1", "C3A9"), ("2", "41FF42")]
        return
    assert done.returncode == 2, done.stdout + done.stderr
    assert "target_outcome_unknown" not in done.stdout + done.stderr
    assert "\\xff" not in done.stderr and "A\ufffdB" not in done.stderr  # never the text
    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("UPDATE src SET v = 'AB' WHERE id = 2")
        db.commit()
    again = run(tmp_path, 'path = "source.db"', "src", kind, path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert target_texts(tmp_path, kind, ["id", "v"]) == [("1", "é"), ("2", "AB")]


# --- PostgreSQL target: both sources, and lazy-plan from PostgreSQL itself (issue 17) ---------

TARGET_ENV = "MATRIX_TARGET_DSN"

# PostgreSQL -> PostgreSQL: every value as it was, on every path (lazy-plan included).
PG_TO_POSTGRES = [
    ("2147483647", "-1"),
    ("9223372036854775807", "0"),
    ("12345678901234567890.123456789", "-0.5"),
    ("9999999999.99", "1.10"),
    ("NaN", "1.5"),
    ("-Infinity", "Infinity"),
    ("é\t", ""),
    ("\\xff00", "\\x"),
    ("true", "false"),
    ("2024-02-29", "1900-01-01"),
    ("23:59:59.5", "00:00:00"),
    ("2024-01-05 10:00:00.123456", "1999-12-31 23:59:59"),
    ("2024-01-05 08:00:00+00", "2024-01-05 11:30:00.5+00"),
    ("1 day 02:00:00", "1 year 2 mons"),
    ("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "00000000-0000-0000-0000-0000000000ff"),
    ('{"a": 1.50}', "5"),
    ('{"b": [1, 2]}', "1.50"),
    ("{1,2}", "{}"),
]

SQLITE_TO_POSTGRES = [
    ("4611686018427387904", "-1"),
    ("Infinity", "0.1"),
    ("é\t\"x'", ""),
    ("\\xff00", "\\x"),
    ("3.5", "x"),
    ("1.10", "-7.00"),
    ("12", "2.5"),
    ("true", "false"),
    ("2024-02-29", "1900-01-01"),
    ("2024-01-05 08:00:00", "2024-01-05 10:00:00.123456"),
    ("23:59:59.5", "00:00:00"),
    ("2024-01-05 08:00:00+00", "2024-01-05 10:00:00+00"),
]


def postgres_target(location) -> tuple[str, dict[str, str]]:
    """The ``[target]`` lines of table ``copy`` in the test's schema, and the env they read."""
    from helpers.postgres_server import postgres_url

    lines = f'dsn = "env:{TARGET_ENV}"\ntable = "{location.schema}.copy"'
    return lines, {TARGET_ENV: postgres_url(location.dsn)}


def postgres_texts(location, columns: list[str]) -> list[tuple]:
    """Every row of the PostgreSQL target, ordered by id, each value as its text in UTC."""
    exprs = ", ".join(f'"{c}"::text' for c in columns)
    with contextlib.closing(psycopg.connect(location.dsn, autocommit=True)) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        sql = f'SELECT {exprs} FROM "{location.schema}".copy ORDER BY id'
        return conn.execute(sql).fetchall()


def assert_each_value(got: list[tuple], columns: list[tuple], expected: list[tuple]) -> None:
    by_column = list(zip(*got, strict=True))
    for (name, declared, *_), want, values in zip(columns, expected, by_column, strict=True):
        assert values == (*want, None), f"{name} {declared}"


@pytest.mark.parametrize("path", PATHS)
def test_postgres_to_postgres_value_by_value(
    tmp_path: Path, postgres_schema, pg_table: tuple[str, str], path: str
) -> None:
    url, table = pg_table
    target, env = postgres_target(postgres_schema)
    source = 'kind = "postgres"\ndsn = "env:MATRIX_DSN"'
    for _ in range(2):  # the second run loads into the table the first made: no retype
        done = run(tmp_path, source, table, "postgres", path, target=target,
                   env={"MATRIX_DSN": url, **env})  # fmt: skip
        assert done.returncode == 0, done.stderr
    got = postgres_texts(postgres_schema, [c[0] for c in PG_COLUMNS])
    assert_each_value(got, PG_COLUMNS, PG_TO_POSTGRES)


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_sqlite_to_postgres_value_by_value(tmp_path: Path, postgres_schema, path: str) -> None:
    sqlite_source(tmp_path, SQLITE_COLUMNS)
    target, env = postgres_target(postgres_schema)
    for _ in range(2):
        done = run(tmp_path, 'path = "source.db"', "src", "postgres", path, target=target, env=env)
        assert done.returncode == 0, done.stderr
    got = postgres_texts(postgres_schema, [c[0] for c in SQLITE_COLUMNS])
    assert_each_value(got, SQLITE_COLUMNS, SQLITE_TO_POSTGRES)


def test_lazy_plan_from_sqlite_into_postgres_is_refused_before_the_target(
    tmp_path: Path, postgres_schema
) -> None:
    sqlite_source(tmp_path, SQLITE_COLUMNS)
    target, env = postgres_target(postgres_schema)
    done = run(tmp_path, 'path = "source.db"', "src", "postgres", "lazy-plan", target=target,
               env=env)  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "path 'lazy-plan' cannot run" in done.stderr
    assert "PostgreSQL reads tables of its own database only" in done.stderr
    assert "target_outcome_unknown" not in done.stdout + done.stderr
    with contextlib.closing(sqlite3.connect(tmp_path / "checkpoints.db")) as store:
        guarded = "SELECT count(*) FROM checkpoint_latest WHERE guard IS NOT NULL"
        assert store.execute(guarded).fetchone() == (0,)  # nothing blocks a rerun


# Every value the other engines refuse, and what only PostgreSQL refuses: NUL in a text.
POSTGRES_MISFITS = [
    *MISFITS,
    *((decl, value) for _, decl, value, _ in SQLITE_REFUSED),
    ("TEXT", "a\x00b"),
    ("", "a\x00b"),
]


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_a_value_postgres_cannot_hold_is_refused_before_the_target(
    tmp_path: Path, postgres_schema, path: str
) -> None:
    """Every misfit on legacy; the NUL texts on every row path (carriers are path-blind)."""
    from dpone_native_transfer import PostgresSink

    target, env = postgres_target(postgres_schema)
    misfits = POSTGRES_MISFITS if path == "legacy" else POSTGRES_MISFITS[-2:]
    for number, (decl, value) in enumerate(misfits):
        folder = tmp_path / str(number)
        folder.mkdir()
        sqlite_source(folder, [("v", decl, value, None)])
        done = run(folder, 'path = "source.db"', "src", "postgres", path, target=target, env=env)
        assert done.returncode == 2, (decl, value, done.stdout + done.stderr)
        assert "native_transfer_value_unsupported" in done.stderr and "column 'v'" in done.stderr
        assert "target_outcome_unknown" not in done.stdout + done.stderr
    sink = PostgresSink(env[TARGET_ENV], f"{postgres_schema.schema}.copy")
    assert sink.row_count() == 0 and sink.read_ledger() == []


# --- SQLite's odd storage: one outcome per value on every path of a target -------------------

# (column, declared type, row 1, row 2): a value its declared type does not mean, as SQLite
# stores it. Every target but SQLite refuses each, on every path: before, the row paths
# loaded an untyped column's numbers as text (changed values, exit 0) and a BOOLEAN's 'true'
# and 2 as true, where lazy-plan refused them; lazy-plan refused the others as a config error.
ODD = [
    ("untyped_integer", "", 1, -2),
    ("untyped_real", "", 3.5, None),
    ("untyped_bytes", "", b"\x00", None),
    ("json_number", "JSON", "2", None),  # NUMERIC affinity: SQLite stores the integer 2
    ("bool_text", "BOOLEAN", "true", "false"),
    ("bool_two", "BOOLEAN", 2, 0),
    ("numeric_text", "NUMERIC", "abc", 1),
    ("decimal_text", "DECIMAL(10,2)", "x", 1.5),
    ("date_junk", "DATE", "junk", "2024-01-05"),
    ("date_number", "DATE", 20240105, None),
    ("datetime_junk", "DATETIME", "junk", None),
    ("datetime_number", "DATETIME", 1700000000, None),
    ("integer_text", "INTEGER", "abc", 1),
    ("integer_real", "INTEGER", 1.5, None),
]
# Beside them, what every target loads, and how the engines render it (SQLite: as stored).
FITTING = [
    ("untyped_text", "", "x", "1"),  # text stays text in an untyped column
    ("bool_01", "BOOLEAN", 1, 0),
    ("numeric_number", "NUMERIC", 12, 2.5),
    ("decimal_number", "DECIMAL(10,2)", 7, 1.5),
    ("date_iso", "DATE", "2024-01-05", None),
]
FITTING_TEXTS = {
    "duckdb": [("x", "1"), ("true", "false"), ("12.0", "2.5"), ("7.00", "1.50"),
               ("2024-01-05", None)],
    "clickhouse": [("x", "1"), ("true", "false"), ("12", "2.5"), ("7", "1.5"),
                   ("2024-01-05", None)],
    "postgres": [("x", "1"), ("true", "false"), ("12", "2.5"), ("7.00", "1.50"),
                 ("2024-01-05", None)],
}  # fmt: skip
TARGET_LINES = {
    "sqlite": 'path = "target.db"',
    "duckdb": 'path = "target.duckdb"',
    "clickhouse": 'path = "chdata"',
}


def outcome(done: subprocess.CompletedProcess, folder: Path) -> tuple:
    """What a run did: ("loaded",), or the refusal's exit code, error code and column; a
    refusal must leave no guard behind (nothing blocks the route)."""
    if done.returncode == 0:
        return ("loaded",)
    assert "target_outcome_unknown" not in done.stdout + done.stderr
    with contextlib.closing(sqlite3.connect(folder / "checkpoints.db")) as store:
        guarded = "SELECT count(*) FROM checkpoint_latest WHERE guard IS NOT NULL"
        assert store.execute(guarded).fetchone() == (0,)
    code = re.search(r"^error: (native_transfer_\w+): column '(\w+)'", done.stderr, re.M)
    return (done.returncode, *(code.groups() if code else (done.stderr,)))


def odd_runs(tmp_path: Path, kind: str, columns: list[tuple], location=None) -> dict:
    """Each path's outcome of one table of ``columns``, loaded into ``kind`` (PostgreSQL: in
    ``location``'s schema); each path in a folder of its own. Returns the loaded folders'
    values, by path, as the target renders them, or the refusal."""
    env = None
    paths = PATHS if kind != "postgres" else ("legacy", "staged", "file-artifact")
    found = {}
    for path in paths:
        folder = tmp_path / path
        folder.mkdir()
        sqlite_source(folder, columns)
        if kind == "postgres":
            table = f"{location.schema}.{tmp_path.name}_{path.replace('-', '_')}"
            target, env = postgres_target(location)
            target = target.replace(f'"{location.schema}.copy"', f'"{table}"')
        else:
            target = f'{TARGET_LINES[kind]}\ntable = "copy"'
        done = run(folder, 'path = "source.db"', "src", kind, path, env=env, target=target)
        result = outcome(done, folder)
        names = [c[0] for c in columns]
        if result == ("loaded",) and kind == "sqlite":
            exprs = ", ".join(f'quote("{c}") || typeof("{c}")' for c in names)
            with contextlib.closing(sqlite3.connect(folder / "target.db")) as db:
                result = ("loaded", db.execute(f"SELECT {exprs} FROM copy ORDER BY id").fetchall())
        elif result == ("loaded",) and kind == "postgres":
            exprs = ", ".join(f'"{c}"::text' for c in names)
            with contextlib.closing(psycopg.connect(location.dsn, autocommit=True)) as conn:
                rows = conn.execute(f'SELECT {exprs} FROM "{location.schema}".'
                                    f'"{table.split(".")[1]}" ORDER BY id').fetchall()  # fmt: skip
            result = ("loaded", rows)
        elif result == ("loaded",):
            result = ("loaded", target_texts(folder, kind, names))
        found[path] = result
    return found


def test_sqlite_keeps_every_odd_value_as_it_stores_it_on_every_path(tmp_path: Path) -> None:
    columns = ODD + FITTING
    runs = odd_runs(tmp_path, "sqlite", columns)
    exprs = ", ".join(f'quote("{c[0]}") || typeof("{c[0]}")' for c in columns)
    with contextlib.closing(sqlite3.connect(tmp_path / "legacy" / "source.db")) as db:
        stored = db.execute(f"SELECT {exprs} FROM src ORDER BY id").fetchall()
    assert runs == {path: ("loaded", stored) for path in PATHS}


@pytest.mark.parametrize("kind", ["duckdb", "clickhouse", "postgres"])
def test_an_odd_value_gets_one_outcome_on_every_path(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Each odd column alone is refused on every path, naming it; the fitting ones load, the
    same values on every path."""
    location = request.getfixturevalue("postgres_schema") if kind == "postgres" else None
    for column in ODD:
        case = tmp_path / column[0]
        case.mkdir()
        runs = odd_runs(case, kind, [column], location)
        refused = (2, "native_transfer_value_unsupported", column[0])
        assert runs == dict.fromkeys(runs, refused), column
    case = tmp_path / "fitting"
    case.mkdir()
    runs = odd_runs(case, kind, FITTING, location)
    by_column = [(*values, None) for values in FITTING_TEXTS[kind]]
    for path, (loaded, rows) in runs.items():
        assert loaded == "loaded" and list(zip(*rows, strict=True)) == by_column, path


def test_a_refused_plan_names_the_engine_and_columns_never_a_value(tmp_path: Path) -> None:
    """The refusal of a plan whose number ClickHouse's ``sqlite()`` would read otherwise
    (SQLite's 15-digit text of 0.30000000000000004 is ``0.3``) names the engine and the
    column, never the value."""
    from dpone_native_transfer import SQLiteSource
    from dpone_native_transfer.connectors.contract import PlanInexact
    from dpone_native_transfer.connectors.sqlite_reading import (
        number_text_misread,
        refuse_inexact_plan,
    )

    sqlite_source(tmp_path, [("n", "DECIMAL(15,2)", 0.1 + 0.2, 1.5)])
    source = SQLiteSource(tmp_path / "source.db", "src", "p")
    columns = source.describe().columns
    reads = {"n": number_text_misread((15, 2))}
    with pytest.raises(PlanInexact) as refused:
        refuse_inexact_plan(source, columns, engine="ClickHouse", table="copy", engine_reads=reads)
    assert "ClickHouse cannot read source column(s) n exactly" in str(refused.value)
    assert refused.value.diagnostics == {"table": "copy", "columns": ["n"]}
    assert "0.3" not in str(refused.value)


@pytest.mark.parametrize("kind", ["duckdb", "clickhouse"])
def test_a_whole_real_in_a_views_decimal_p_0_column_gets_legacys_outcome(
    tmp_path: Path, kind: str
) -> None:
    """A view can hold a whole real (``12.0``) in a ``DECIMAL(12,0)`` column (an ordinary
    table's NUMERIC affinity stores it as the integer 12). The carriers refuse it (it has a
    decimal); DuckDB's scanner reads every number as a double and could not tell it from
    12, so lazy-plan carries such a view's rows, and it is refused on both paths."""
    outcomes = []
    for path in ("lazy-plan", "legacy"):
        folder = tmp_path / path
        folder.mkdir()
        with contextlib.closing(sqlite3.connect(folder / "source.db")) as db:
            db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, p INTEGER, n DECIMAL(12,0))")
            db.execute("INSERT INTO t VALUES (1, 0, 7)")
            db.execute("CREATE VIEW src AS SELECT id, p, n FROM t UNION ALL SELECT 2, 1, 12.0")
            db.commit()
        done = run(folder, 'path = "source.db"', "src", kind, path)
        outcomes.append(done.returncode)
        assert_refused_before_target(done, folder, "n")
    assert outcomes == [2, 2]
