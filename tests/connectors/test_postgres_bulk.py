"""A PostgreSQL source's bulk read (``Source.bulk()``, ``postgres_bulk.py``): ``COPY ... TO
STDOUT`` parsed by pyarrow into exact Arrow files DuckDB loads, on the real server and DuckDB.

Each value must land as the row paths land it, or the read gives up and the rows are read
and carried as before; either way the outcome is the row paths' own."""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
from pathlib import Path

import duckdb
import psycopg
import pyarrow as pa
import pytest
from helpers.cli import kill_while_copying, run_cli
from helpers.postgres_server import postgres_url

from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.connectors import postgres as postgres_module
from dpone_native_transfer.connectors import postgres_bulk
from dpone_native_transfer.connectors.postgres import PostgresSource
from dpone_native_transfer.payloads import Column

# (name, PostgreSQL type, row 1's value, row 2's value); row 3 is every column NULL
BULK_COLUMNS = [
    ("i4", "integer", "2147483647", "-1"),
    ("i8", "bigint", "9223372036854775807", "-9223372036854775808"),
    ("n", "numeric", "'12345678901234567890.123456789'", "'NaN'"),
    ("n2", "numeric(12,2)", "'9999999999.99'", "'-0.01'"),
    ("n38", "numeric(38,10)", "'1234567890123456789012345678.0123456789'", "'0'"),
    ("re", "double precision", "'NaN'", "'-Infinity'"),
    ("r4", "real", "'0.1'", "'Infinity'"),
    ("d15", "double precision", "0.1::float8 + 0.2::float8", "'5e-324'"),
    ("t", "text", "'NA'", "''"),
    ("t2", "text", "E'a,\"b\"\\nc\\\\d'", "'NaN'"),
    ("b", "boolean", "true", "false"),
    ("d", "date", "'2024-02-29'", "'0001-01-01'"),
    ("ts", "timestamp", "'2024-01-05 10:00:00.123456'", "'1999-12-31 23:59:59'"),
    ("tz", "timestamptz", "'2024-01-05 10:00:00+02'", "'2024-01-05 11:30:00.5+00'"),
    ("iv", "interval", "'1 day 02:00:00'", "'1 year 2 mons'"),
    (
        "u",
        "uuid",
        "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
        "'00000000-0000-0000-0000-0000000000ff'",
    ),
    ("j", "jsonb", "'{\"b\": [1, 2]}'", "'1.50'"),
]

ROUTE = """\
[source]
kind = "postgres"
dsn = "env:BULK_DSN"
table = "{table}"
partition_column = "p"
[target]
{target}
[transfer]
strategy = "full_refresh"
path = "{path}"
[store]
path = "checkpoints.db"
"""


def make_table(location, columns: list[tuple[str, str, str, str]], *, index: bool) -> str:
    """``src(id, p, columns...)`` in the test's schema: two rows of values, one of NULLs, in
    partitions 0 and 1 and the NULL partition; the partition column indexed or not."""
    definitions = ", ".join(f"{name} {pg_type}" for name, pg_type, *_ in columns)
    rows = [
        f"(1, 0, {', '.join(c[2] for c in columns)})",
        f"(2, 1, {', '.join(c[3] for c in columns)})",
        f"(3, NULL, {', '.join('NULL' for _ in columns)})",
    ]
    with contextlib.closing(psycopg.connect(location.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{location.schema}"')
        conn.execute(f'CREATE TABLE "{location.schema}".src (id integer, p integer, {definitions})')
        conn.execute(f'INSERT INTO "{location.schema}".src VALUES {", ".join(rows)}')
        if index:
            conn.execute(f'CREATE INDEX ON "{location.schema}".src (p)')
        conn.execute(f'ANALYZE "{location.schema}".src')
    return f"{location.schema}.src"


DUCKDB = 'kind = "duckdb"\npath = "target.duckdb"\ntable = "copy"'


def run(folder: Path, location, table: str, path: str, target: str = DUCKDB):
    folder.mkdir(parents=True, exist_ok=True)
    route = ROUTE.format(table=table, path=path, target=target)
    (folder / "route.toml").write_text(route, encoding="utf-8")
    env = {"BULK_DSN": postgres_url(location.dsn)}
    return run_cli("run", folder / "route.toml", "--quiet", env=env)


def postgres_target(location, name: str) -> str:
    """A ``[target]`` of table ``name`` in the test's schema (another table of the server)."""
    return f'kind = "postgres"\ndsn = "env:BULK_DSN"\ntable = "{location.schema}.{name}"'


def target_texts(folder: Path, names: list[str]) -> list[tuple]:
    exprs = ", ".join(f'CAST("{name}" AS VARCHAR)' for name in names)
    with contextlib.closing(duckdb.connect(str(folder / "target.duckdb"), read_only=True)) as db:
        return db.execute(f"SELECT {exprs} FROM copy ORDER BY id").fetchall()


def postgres_texts(location, name: str, names: list[str]) -> list[tuple]:
    exprs = ", ".join(f'"{column}"::text' for column in names)
    with contextlib.closing(psycopg.connect(location.dsn)) as db:
        table = f'"{location.schema}"."{name}"'
        return db.execute(f"SELECT {exprs} FROM {table} ORDER BY id").fetchall()


def no_rows_read(*args, **kwargs):
    raise AssertionError("the rows were read in Python")


@pytest.mark.parametrize("index", [False, True], ids=["one scan", "a read per partition"])
@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_postgres_into_duckdb_in_bulk_lands_every_value_as_the_row_paths_do(
    tmp_path, postgres_schema, monkeypatch, path, index
):
    """The bulk read takes these kinds whole (Python reads no row: ``read`` and
    ``read_partitions`` fail if asked), and the target holds, value for value, what the row
    paths load: NULL only for NULL (a text "NA" or "" stays text), NaN and infinities, a
    numeric's every digit, an instant in UTC."""
    table = make_table(postgres_schema, BULK_COLUMNS, index=index)
    names = ["id", "p", *(c[0] for c in BULK_COLUMNS)]
    with monkeypatch.context() as patched:
        patched.setattr(PostgresSource, "read", no_rows_read)
        patched.setattr(PostgresSource, "read_partitions", no_rows_read)
        bulk = run(tmp_path / "bulk", postgres_schema, table, path)
    assert bulk.returncode == 0, bulk.stderr
    monkeypatch.setattr(PostgresSource, "bulk", lambda self: None)
    rows = run(tmp_path / "rows", postgres_schema, table, path)
    assert rows.returncode == 0, rows.stderr
    got = target_texts(tmp_path / "bulk", names)
    assert got == target_texts(tmp_path / "rows", names)
    by_name = dict(zip(names, zip(*got, strict=True), strict=True))
    assert by_name["t"] == ("NA", "", None)
    assert by_name["t2"] == ('a,"b"\nc\\d', "NaN", None)
    assert by_name["n"] == ("12345678901234567890.123456789", "NaN", None)
    assert by_name["n38"] == ("1234567890123456789012345678.0123456789", "0.0000000000", None)
    assert by_name["re"] == ("nan", "-inf", None)
    assert by_name["d15"] == ("0.30000000000000004", "5e-324", None)
    assert by_name["tz"][0].startswith("2024-01-05 08:00:00")


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_postgres_into_postgres_in_bulk_lands_every_value_as_the_row_paths_do(
    tmp_path, postgres_schema, monkeypatch, path
):
    """Into PostgreSQL the bulk files are COPY'd as CSV pyarrow writes (``csv_blocks``): the
    target table holds each value's text as the row paths' ``COPY`` leaves it, with Python
    reading no row."""
    table = make_table(postgres_schema, BULK_COLUMNS, index=False)
    names = ["id", "p", *(c[0] for c in BULK_COLUMNS)]
    with monkeypatch.context() as patched:
        patched.setattr(PostgresSource, "read", no_rows_read)
        patched.setattr(PostgresSource, "read_partitions", no_rows_read)
        target = postgres_target(postgres_schema, "bulk_copy")
        bulk = run(tmp_path / "bulk", postgres_schema, table, path, target)
    assert bulk.returncode == 0, bulk.stderr
    monkeypatch.setattr(PostgresSource, "bulk", lambda self: None)
    target = postgres_target(postgres_schema, "rows_copy")
    rows = run(tmp_path / "rows", postgres_schema, table, path, target)
    assert rows.returncode == 0, rows.stderr
    got = postgres_texts(postgres_schema, "bulk_copy", names)
    assert got == postgres_texts(postgres_schema, "rows_copy", names)
    by_name = dict(zip(names, zip(*got, strict=True), strict=True))
    assert by_name["t"] == ("NA", "", None)
    assert by_name["d15"] == ("0.30000000000000004", "5e-324", None)
    assert by_name["re"] == ("NaN", "-Infinity", None)
    assert by_name["tz"] == ("2024-01-05 08:00:00+00", "2024-01-05 11:30:00.5+00", None)


def test_a_value_without_an_exact_arrow_value_is_read_as_rows(tmp_path, postgres_schema):
    """PostgreSQL's infinite timestamps and dates have no Arrow value: the bulk read gives up
    (no file left) and the rows are read and carried, and DuckDB holds them exactly."""
    columns = [
        ("tz", "timestamptz", "'infinity'", "'2024-01-05 10:00:00+00'"),
        ("d", "date", "'2024-02-29'", "'-infinity'"),
    ]
    table = make_table(postgres_schema, columns, index=False)
    source = PostgresSource(postgres_url(postgres_schema.dsn), table, "p")
    shape = source.describe()
    paths = [tmp_path / "load.arrows"]
    assert (
        source.write_arrow_files([{"partition": 0}, {"partition": 1}], shape.columns, paths) is None
    )
    assert list(tmp_path.iterdir()) == []
    done = run(tmp_path / "run", postgres_schema, table, "staged")
    assert done.returncode == 0, done.stderr
    assert target_texts(tmp_path / "run", ["tz", "d"]) == [
        ("infinity", "2024-02-29"),
        ("2024-01-05 10:00:00+00", "-infinity"),
        (None, None),
    ]


def test_a_numeric_nan_its_decimal_cannot_hold_is_refused_before_the_target(
    tmp_path, postgres_schema
):
    """A NaN in a numeric(12,2) fits no DECIMAL: the bulk read gives up, and the rows' carrier
    refuses it before the target, naming the column, as without the bulk read."""
    table = make_table(postgres_schema, [("n2", "numeric(12,2)", "'1.50'", "'NaN'")], index=False)
    done = run(tmp_path, postgres_schema, table, "legacy")
    assert done.returncode != 0
    assert "'n2'" in done.stderr and "NaN" not in done.stderr
    assert not (tmp_path / "target.duckdb").exists() or not _has_copy(tmp_path / "target.duckdb")


def _has_copy(path: Path) -> bool:
    with contextlib.closing(duckdb.connect(str(path), read_only=True)) as db:
        return bool(
            db.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'copy'").fetchone()[
                0
            ]
        )


@pytest.mark.parametrize("index", [False, True], ids=["one scan", "a read per partition"])
def test_the_bulk_files_hold_each_partition_and_its_count(tmp_path, postgres_schema, index):
    """One file per bound, each bound's rows and count exactly, in the exact Arrow types; the
    NULL partition too; a partition value no row holds gets an empty file and a count of 0."""
    table = make_table(postgres_schema, BULK_COLUMNS[:4], index=index)
    source = PostgresSource(postgres_url(postgres_schema.dsn), table, "p")
    columns = source.describe().columns
    bounds = [{"partition": None}, {"partition": 0}, {"partition": 1}, {"partition": 7}]
    paths = [tmp_path / f"{number}.arrows" for number in range(len(bounds))]
    written = source.write_arrow_files(bounds, columns, paths)
    assert written is not None
    files, counts = written
    assert counts == [1, 1, 1, 0] and [file.rows for file in files] == counts
    ids = []
    for file in files:
        with pa.ipc.open_stream(pa.OSFile(str(file.path))) as stream:
            read = stream.read_all()
        assert read.schema.field("n2").type == pa.decimal128(12, 2)
        assert read.schema.field("i8").type == pa.int64()
        ids.append(read.column("id").to_pylist())
    assert ids == [[3], [1], [2], []]
    one = source.write_arrow_files(bounds, columns, [tmp_path / "all.arrows"])
    assert one is not None and one[1] == [1, 1, 1, 0] and one[0][0].rows == 3
    single = source.write_arrow_files([{"partition": 1}], columns, [tmp_path / "one.arrows"])
    assert single is not None and single[1] == [1]  # one bound: its own read's COPY


def test_columns_without_an_exact_arrow_type_are_not_read_in_bulk(tmp_path, postgres_schema):
    """A bytea or a time column has no exact Arrow type here: the whole read is left to rows."""
    table = make_table(postgres_schema, [("raw", "bytea", "'\\xff00'", "''")], index=False)
    source = PostgresSource(postgres_url(postgres_schema.dsn), table, "p")
    columns = source.describe().columns
    assert [c.kind for c in columns] == ["integer", "integer", "blob"]
    assert source.write_arrow_files([{"partition": 0}], columns, [tmp_path / "x.arrows"]) is None
    assert not (tmp_path / "x.arrows").exists()
    assert Column("raw", "bytea", "blob") in columns


def spread_table(location, rows: int) -> str:
    """``spread(id, p, note)``: ``rows`` rows over 10 partitions, no index, many blocks."""
    with contextlib.closing(psycopg.connect(location.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{location.schema}"')
        table = f'"{location.schema}".spread'
        conn.execute(f"CREATE TABLE {table} (id integer, p integer, note text)")
        conn.execute(
            f"INSERT INTO {table} SELECT i, i % 10, md5(i::text) FROM generate_series(1, {rows}) i"
        )
        conn.execute(f"ANALYZE {table}")
    return f"{location.schema}.spread"


def read_ids(files) -> list[list[int]]:
    found = []
    for file in files:
        with pa.ipc.open_stream(pa.OSFile(str(file.path))) as stream:
            found.append(sorted(stream.read_all().column("id").to_pylist()))
    return found


@pytest.mark.parametrize("parallel", [1, 2, 3])
def test_a_writer_during_a_parallel_read_changes_no_row_it_loads(
    tmp_path, postgres_schema, parallel
):
    """The connections of a parallel bulk read share the attempt's snapshot: a writer that
    moves rows between partitions, deletes and adds rows after the snapshot began changes
    nothing the read loads; every row is in its partition's file once, as the snapshot saw
    it. The one scan is cut into a range of blocks per connection."""
    table = spread_table(postgres_schema, 30_000)
    source = PostgresSource(postgres_url(postgres_schema.dsn), table, "p", parallel=parallel)
    columns = source.describe().columns
    bounds = [{"partition": value} for value in range(10)]
    paths = [tmp_path / f"{value}.arrows" for value in range(10)]
    expected = [sorted(i for i in range(1, 30_001) if i % 10 == value) for value in range(10)]
    with source.snapshot():
        with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as writer:
            relation = f'"{postgres_schema.schema}".spread'
            writer.execute(f"UPDATE {relation} SET p = (p + 1) % 10 WHERE id % 7 = 0")
            writer.execute(f"DELETE FROM {relation} WHERE id % 11 = 0")
            writer.execute(f"INSERT INTO {relation} VALUES (40001, 3, 'new'), (40002, 4, 'new')")
        found = source._placed_scan(bounds)
        assert found is not None  # no index: the one scan
        parts = source._parallel_reads([(found[0], found[1], None)])
        assert len(parts) == parallel
        written = source.write_arrow_files(bounds, columns, paths)
    assert written is not None
    files, counts = written
    assert counts == [len(ids) for ids in expected]
    assert read_ids(files) == expected


def test_a_route_file_sets_a_postgres_sources_parallel_reads(
    tmp_path, postgres_schema, monkeypatch
):
    """``[source] parallel = 2`` reaches the source, and the route runs with it."""
    table = spread_table(postgres_schema, 100)
    route = ROUTE.format(table=table, path="staged", target=DUCKDB).replace(
        'partition_column = "p"', 'partition_column = "p"\nparallel = 2'
    )
    (tmp_path / "route.toml").write_text(route, encoding="utf-8")
    monkeypatch.setenv("BULK_DSN", postgres_url(postgres_schema.dsn))
    assert load_route_config(tmp_path / "route.toml").source.parallel == 2
    done = run_cli("run", tmp_path / "route.toml", "--quiet")
    assert done.returncode == 0, done.stderr
    assert target_texts(tmp_path, ["id"]) == [(str(i),) for i in range(1, 101)]


@pytest.mark.parametrize("parallel", [1, 2])
@pytest.mark.parametrize("path", ["legacy", "file-artifact"])
def test_a_connection_lost_inside_the_copy_stops_before_the_target(
    tmp_path, postgres_schema, monkeypatch, path, parallel
):
    """The server drops the connection after the COPY's first batch (injected): the run stops
    with ``native_transfer_source_invalid`` naming the table only (no driver text), before
    the target is called, so the route is not blocked; the rerun loads every row once."""
    table = spread_table(postgres_schema, 5_000)
    real = postgres_module.copy_batches

    def dropped(*args, **kwargs):
        with contextlib.closing(real(*args, **kwargs)) as batches:  # its read ends first,
            yield next(batches)  # as a read failing inside copy_batches ends it
        raise psycopg.OperationalError("server closed the connection: secret-canary")

    monkeypatch.setattr(postgres_module, "copy_batches", dropped)
    route = ROUTE.format(table=table, path=path, target=DUCKDB).replace(
        'partition_column = "p"', f'partition_column = "p"\nparallel = {parallel}'
    )
    (tmp_path / "route.toml").write_text(route, encoding="utf-8")
    env = {"BULK_DSN": postgres_url(postgres_schema.dsn)}
    failed = run_cli("run", tmp_path / "route.toml", "--quiet", env=env)
    assert failed.returncode == 1
    assert "native_transfer_source_invalid" in failed.stderr
    assert "secret-canary" not in failed.stderr and "COPY" not in failed.stderr
    assert not (tmp_path / "target.duckdb").exists() or not _has_copy(tmp_path / "target.duckdb")
    monkeypatch.setattr(postgres_module, "copy_batches", real)
    done = run_cli("run", tmp_path / "route.toml", "--quiet", env=env)
    assert done.returncode == 0, done.stderr
    assert target_texts(tmp_path, ["id"]) == [(str(i),) for i in range(1, 5_001)]


# (name, PostgreSQL type the target makes for it too, row 1's value, row 2's value)
SAME_TYPES = [
    ("i8", "bigint", "9223372036854775807", "-1"),
    ("n2", "numeric(12,2)", "'9999999999.99'", "'NaN'"),
    ("n", "numeric", "'12345678901234567890.123456789'", "'-Infinity'"),
    ("re", "double precision", "'NaN'", "'5e-324'"),
    ("t", "text", "E'a,\"b\"\\nc\\\\d'", "''"),
    ("raw", "bytea", "'\\xff00'", "''"),
    ("b", "boolean", "true", "false"),
    ("d", "date", "'infinity'", "'4713-01-01 BC'"),
    ("ts", "timestamp without time zone", "'2024-01-05 10:00:00.123456'", "'-infinity'"),
    ("tz", "timestamp with time zone", "'2024-01-05 10:00:00+02'", "'294276-12-31 23:59:59+00'"),
    ("iv", "interval", "'1 day 02:00:00'", "'-178000000 years'"),
]


@pytest.mark.parametrize("path", ["legacy", "staged"])
def test_postgres_into_postgres_of_the_same_types_passes_the_copy_bytes_through(
    tmp_path, postgres_schema, monkeypatch, path
):
    """Columns whose types the target makes alike go through binary COPY byte for byte:
    values no Arrow type holds (a numeric NaN in a numeric(12,2), infinite and BC dates,
    bytea) land as they are, and neither Python nor pyarrow reads a row (``read``,
    ``read_partitions`` and ``write_arrow_files`` fail if asked)."""
    table = make_table(postgres_schema, SAME_TYPES, index=False)
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f'ALTER TABLE "{postgres_schema.schema}".src ALTER id TYPE bigint')
        conn.execute(f'ALTER TABLE "{postgres_schema.schema}".src ALTER p TYPE bigint')
    names = ["id", "p", *(c[0] for c in SAME_TYPES)]
    with monkeypatch.context() as patched:
        patched.setattr(PostgresSource, "read", no_rows_read)
        patched.setattr(PostgresSource, "read_partitions", no_rows_read)
        patched.setattr(PostgresSource, "write_arrow_files", no_rows_read)
        target = postgres_target(postgres_schema, "bytes_copy")
        done = run(tmp_path, postgres_schema, table, path, target)
    assert done.returncode == 0, done.stderr
    source = postgres_texts(postgres_schema, "src", names)
    assert postgres_texts(postgres_schema, "bytes_copy", names) == source
    assert [row[names.index("n2")] for row in source] == ["9999999999.99", "NaN", None]


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
def test_a_numeric_nan_lands_in_a_postgres_numeric_of_a_precision_on_every_path(
    tmp_path, postgres_schema, path
):
    """PostgreSQL's ``numeric(12,2)`` holds NaN (not an infinity): lazy-plan loaded it, and
    the row paths refused it before the target, exit 2. One outcome on every path now."""
    table = make_table(postgres_schema, [("n2", "numeric(12,2)", "'1.50'", "'NaN'")], index=False)
    done = run(tmp_path, postgres_schema, table, path, postgres_target(postgres_schema, "copy"))
    assert done.returncode == 0, done.stderr
    copied = postgres_texts(postgres_schema, "copy", ["id", "n2"])
    assert copied == postgres_texts(postgres_schema, "src", ["id", "n2"])
    assert [n2 for _, n2 in copied] == ["1.50", "NaN", None]


BEYOND_PYTHONS_YEARS = [
    ("d", "date", "'4713-01-01 BC'", "'5874897-12-31'"),
    ("ts", "timestamp", "'4713-01-01 00:00:00 BC'", "'294276-12-31 23:59:59.999999'"),
    ("tz", "timestamptz", "'0045-02-29 10:00:00.5+00 BC'", "'12000-02-29 10:00:00+00'"),
]


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_postgres_days_beyond_pythons_years_load_exactly_on_every_row_path(
    tmp_path, postgres_schema, path
):
    """BC days and years past 9999, carried as rows (the target makes ``id`` a bigint, so no
    byte copy), load as they are, as lazy-plan loads them; they were refused before the
    target as values PostgreSQL cannot hold."""
    table = make_table(postgres_schema, BEYOND_PYTHONS_YEARS, index=False)
    done = run(tmp_path, postgres_schema, table, path, postgres_target(postgres_schema, "copy"))
    assert done.returncode == 0, done.stderr
    names = ["id", "p", *(c[0] for c in BEYOND_PYTHONS_YEARS)]
    copied = postgres_texts(postgres_schema, "copy", names)
    assert copied == postgres_texts(postgres_schema, "src", names)
    bc = ("4713-01-01 BC", "4713-01-01 00:00:00 BC", "0045-02-29 10:00:00.5+00 BC")
    assert copied[0][2:] == bc


def test_a_target_of_other_types_takes_no_copy_bytes(tmp_path, postgres_schema):
    """The target's own types decide: a table made with a wider numeric takes Arrow files
    (``copy_types`` is empty), and a source whose types differ writes no binary file."""
    from dpone_native_transfer.connectors.postgres_sink import PostgresSink

    table = make_table(postgres_schema, [("n2", "numeric(12,2)", "'1.50'", "'2'")], index=False)
    source = PostgresSource(postgres_url(postgres_schema.dsn), table, "p")
    columns = source.describe().columns
    sink = PostgresSink(postgres_url(postgres_schema.dsn), f"{postgres_schema.schema}.other")
    assert sink.copy_types(columns) == ["bigint", "bigint", "numeric(12,2)"]
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(
            f'CREATE TABLE "{postgres_schema.schema}".other (id bigint, p bigint, n2 numeric(14,2))'
        )
    assert sink.copy_types(columns) == []
    path = tmp_path / "load.pgcopy"
    made = ["bigint", "bigint", "numeric(12,2)"]  # the source's id and p are integer
    assert source.write_copy_file([{"partition": 0}], columns, path, made) is None
    assert not path.exists()


def test_a_worker_killed_inside_the_bulk_copy_is_not_blocked_and_loads_once(
    tmp_path, postgres_schema
):
    """SIGKILL while the bulk read's COPY streams (seen in ``pg_stat_activity``): the guard
    had armed nothing, so the next run is not blocked (the dead worker's lease is taken at
    once on its own machine), and it loads every row exactly once."""
    rows = 500_000
    table = spread_table(postgres_schema, rows)
    tag = f"dpone-kill-{secrets.token_hex(4)}"
    route = ROUTE.format(table=table, path="legacy", target=DUCKDB)
    (tmp_path / "route.toml").write_text(route, encoding="utf-8")
    env = {**os.environ, "BULK_DSN": postgres_url(postgres_schema.dsn, application_name=tag)}
    kill_while_copying(
        tmp_path / "route.toml",
        dsn=postgres_schema.dsn,
        who=("application_name", tag),
        env={"BULK_DSN": env["BULK_DSN"]},
    )
    done = run_cli("run", tmp_path / "route.toml", "--quiet", env={"BULK_DSN": env["BULK_DSN"]})
    assert done.returncode == 0, done.stderr
    with contextlib.closing(duckdb.connect(str(tmp_path / "target.duckdb"), read_only=True)) as db:
        found = db.execute("SELECT count(*), count(DISTINCT id), min(id), max(id) FROM copy")
        assert found.fetchone() == (rows, rows, 1, rows)


def test_duckdb_without_its_postgres_scanner_reads_the_bulk_files(
    tmp_path, postgres_schema, monkeypatch
):
    """DuckDB's postgres extension is in no wheel and this machine cannot download it: the
    detection (once per process, autoinstall off) finds it does not load, downloads nothing,
    and every partition is read by the source's bulk read (the events say ``bulk``), with
    Python reading no row."""
    from dpone_native_transfer.application import new_run_id, transfer
    from dpone_native_transfer.connectors.duckdb import connect
    from dpone_native_transfer.events import EventName

    table = make_table(postgres_schema, BULK_COLUMNS[:4], index=False)
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "route.toml").write_text(
        ROUTE.format(table=table, path="file-artifact", target=DUCKDB), encoding="utf-8"
    )
    monkeypatch.setenv("BULK_DSN", postgres_url(postgres_schema.dsn))
    monkeypatch.chdir(folder)
    monkeypatch.setattr(PostgresSource, "read", no_rows_read)
    monkeypatch.setattr(PostgresSource, "read_partitions", no_rows_read)
    connect.postgres_scanner_loads.cache_clear()
    result, _ = transfer(load_route_config(folder / "route.toml"), new_run_id())
    reads = [e.fields["read"] for e in result.events if e.name == EventName.PARTITION_EXTRACTED]
    assert reads == ["bulk"] * 3 and result.rows_loaded == 3
    asked = connect.postgres_scanner_loads.cache_info()
    assert (asked.misses, asked.currsize) == (1, 1)  # detected once, for every partition
    assert connect.postgres_scanner_loads() is False
    import duckdb

    version = duckdb.__version__
    downloaded = list(Path.home().glob(f".duckdb/extensions/v{version}/*/postgres*"))
    assert downloaded == []  # autoinstall off: nothing was fetched


# -- copy_batches itself: COPY rows read through libpq in chunks of whole rows --------------

ODD_TEXTS = [
    "",
    "NA",
    "NaN",
    "a,b",
    'say "hi"',
    '""',
    "line\nbreak",
    "crlf\r\nend",
    "trailing\n",
    "\\N",
    "ünïcødé ✓",
    ',\n"',
]


def copy_table(location, rows: list[str | None]) -> str:
    """``odd(id, t, "pct%")`` in the test's schema: ``rows`` as ``t`` in ``id`` order, and
    ``pct%`` twice ``id``."""
    with contextlib.closing(psycopg.connect(location.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{location.schema}"')
        conn.execute(f'CREATE TABLE "{location.schema}".odd (id bigint, t text, "pct%" bigint)')
        with conn.cursor().copy(f'COPY "{location.schema}".odd FROM STDIN') as copy:
            for number, text in enumerate(rows):
                copy.write_row((number, text, 2 * number))
    return f'"{location.schema}".odd'


def copied(location, sql: str, params: list, schema: pa.Schema) -> list[tuple]:
    """The rows ``copy_batches`` reads, and the connection still usable after it."""
    with contextlib.closing(psycopg.connect(location.dsn)) as conn:
        batches = list(postgres_bulk.copy_batches(pa, conn, sql, params, schema))
        assert conn.execute("SELECT 1").fetchone() == (1,)
    table = pa.Table.from_batches(batches, schema)
    return list(zip(*(column.to_pylist() for column in table.columns), strict=True))


ODD_SCHEMA = pa.schema([("id", pa.int64()), ("t", pa.string()), ("pct%", pa.int64())])


@pytest.mark.parametrize(
    ("chunk", "block"),
    [(postgres_bulk._CHUNK_BYTES, postgres_bulk._BLOCK_BYTES), (40, 64), (1, 16)],
    ids=["default chunks", "rows split among chunks", "a row a chunk"],
)
def test_copied_rows_are_the_servers_whatever_the_chunks(
    postgres_schema, monkeypatch, chunk, block
):
    """Texts with quotes, commas, line breaks and the CSV's NULL spellings, and NULL, come out
    as the server holds them, whether a chunk holds many rows, a few, or one (and a row
    wider than a block comes alone); the ``%`` of a quoted name is escaped as every read's."""
    monkeypatch.setattr(postgres_bulk, "_CHUNK_BYTES", chunk)
    monkeypatch.setattr(postgres_bulk, "_BLOCK_BYTES", block)
    texts: list[str | None] = [*ODD_TEXTS, None] * 40 + ["x" * 300, *ODD_TEXTS]
    relation = copy_table(postgres_schema, texts)
    sql = f'SELECT id, t, "pct%%" FROM {relation} WHERE id >= %s ORDER BY id'
    assert copied(postgres_schema, sql, [0], ODD_SCHEMA) == [
        (number, text, 2 * number) for number, text in enumerate(texts)
    ]
    with_no_params = f'SELECT id, t, "pct%%" FROM {relation} ORDER BY id'
    assert len(copied(postgres_schema, with_no_params, [], ODD_SCHEMA)) == len(texts)


def test_a_row_wider_than_a_block_is_read_in_bulk(postgres_schema):
    """A 5 MB text between small rows (wider than the CSV reader's block) lands whole."""
    wide = ('wide,"\n' * 700_000)[: 5 << 20]
    assert len(wide.encode()) > postgres_bulk._BLOCK_BYTES
    texts = ["a", wide, "b", wide + "!", "c"]
    relation = copy_table(postgres_schema, texts)
    sql = f'SELECT id, t, "pct%%" FROM {relation} WHERE id >= %s ORDER BY id'
    rows = copied(postgres_schema, sql, [0], ODD_SCHEMA)
    assert [text for _, text, _ in rows] == texts


def test_an_empty_read_has_no_batch(postgres_schema):
    relation = copy_table(postgres_schema, ["a", "b"])
    sql = f'SELECT id, t, "pct%%" FROM {relation} WHERE id > %s'
    assert copied(postgres_schema, sql, [10], ODD_SCHEMA) == []


def test_a_value_past_the_first_chunk_that_does_not_fit_gives_up_the_read(
    postgres_schema, monkeypatch
):
    """Chunks convert one at a time: a text its type cannot hold, in a later chunk than
    batches already handed on, still makes the whole read ``Inexact``."""
    monkeypatch.setattr(postgres_bulk, "_CHUNK_BYTES", 64)
    relation = copy_table(postgres_schema, ["1"] * 50 + ["not a number"] + ["2"] * 5)
    schema = pa.schema([("t", pa.int64())])
    sql = f"SELECT t FROM {relation} WHERE id >= %s ORDER BY id"
    with contextlib.closing(psycopg.connect(postgres_schema.dsn)) as conn:
        batches = postgres_bulk.copy_batches(pa, conn, sql, [0], schema)
        assert next(batches).num_rows > 0
        with pytest.raises(postgres_bulk.Inexact):
            list(batches)


@pytest.mark.parametrize(
    ("sql", "error"),
    [
        ("SELECT 1 / (i - 150000) FROM generate_series(1, 200000) AS i WHERE i > %s",
         psycopg.errors.DivisionByZero),
        ("SELEC 1 WHERE 1 > %s", psycopg.errors.SyntaxError),
    ],
    ids=["inside the rows", "before the first row"],
)  # fmt: skip
def test_a_server_error_is_the_drivers_error_of_its_sqlstate(postgres_schema, sql, error):
    """An error the server sends mid-COPY or at its start is raised as the driver's error
    (which every read turns into ``native_transfer_source_invalid``), never ``Inexact``."""
    with contextlib.closing(psycopg.connect(postgres_schema.dsn)) as conn:
        with pytest.raises(error):
            list(postgres_bulk.copy_batches(pa, conn, sql, [0], pa.schema([("x", pa.int64())])))


def test_a_read_stopped_early_leaves_no_thread_and_the_connection_closes(postgres_schema):
    """The caller stops after the first batch (a failing target file, a stop): the read's
    thread ends, and the connection, mid-COPY, closes."""
    before = threading.active_count()
    sql = "SELECT i FROM generate_series(1, 3000000) AS i WHERE i > %s"
    conn = psycopg.connect(postgres_schema.dsn)
    batches = postgres_bulk.copy_batches(pa, conn, sql, [0], pa.schema([("i", pa.int64())]))
    assert next(batches).num_rows > 0
    batches.close()
    assert threading.active_count() == before
    conn.close()
    assert conn.closed


@pytest.mark.parametrize(
    "tags",
    [[0, 0, 1, 1, 1, 2], [2, 0, 1, 0, 2, 1], [1, 1, 1, 1, 1, 1], [2, 1, 0, 0, 1, 2]],
    ids=["in order", "mixed", "one bound", "down then up"],
)
def test_tagged_batches_land_in_their_bounds_files_in_read_order(tmp_path, tags):
    """Each row lands in its bound's file in the order it was read, whether a batch's tags
    come in order (no sort needed) or not; the counts are each bound's."""
    from dpone_native_transfer.connectors._arrow import write_tagged_batches

    schema = pa.schema([("n", pa.int64())])
    batches = [
        (pa.array(tags, pa.int32()), pa.record_batch([pa.array(range(6))], schema=schema)),
        (
            pa.array(tags[::-1], pa.int32()),
            pa.record_batch([pa.array(range(6, 12))], schema=schema),
        ),
    ]
    paths = [tmp_path / f"{n}.arrows" for n in range(3)]
    files, counts = write_tagged_batches(pa, schema, batches, paths, 3)
    every = tags + tags[::-1]
    for bound, path in enumerate(paths):
        with pa.ipc.open_stream(path) as stream:
            landed = stream.read_all().column("n").to_pylist()
        assert landed == [n for n, tag in enumerate(every) if tag == bound]
        assert counts[bound] == files[bound].rows == every.count(bound)


def test_a_bulk_read_stopped_early_ends_its_copys_thread_before_closing(postgres_schema):
    """A bulk read's consumer stops after one batch (a target file that failed, a stop):
    the COPY's reading thread is joined before its connection closes, none is left."""
    table = spread_table(postgres_schema, 300_000)
    source = PostgresSource(postgres_url(postgres_schema.dsn), table, "p")
    schema = pa.schema([("id", pa.int64())])
    sql = f"SELECT id FROM {source._relation} WHERE id > %s"
    before = threading.active_count()
    pairs = source._copied(pa, [(sql, [0], 0)], schema, 1)
    tags, batch = next(pairs)
    assert batch.num_rows == len(tags) > 0
    pairs.close()
    assert threading.active_count() == before


@pytest.mark.parametrize("target", ["duckdb", "postgres"])
@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact"])
def test_rows_written_at_the_watermark_after_a_bulk_read_are_loaded_next_run(
    tmp_path, postgres_schema, monkeypatch, path, target
):
    """A bulk read (the source writes the files) recorded no row at the cursor's watermark,
    so the next run, finding the edge record incomplete, dropped it and read above the
    watermark: a row written at it since was never loaded, exit 0 (SQLite and chDB targets,
    whose engines pull, kept it). The top rows are now read around the bulk read in its
    snapshot. Found by a hostile check."""
    schema = postgres_schema.schema
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".src (id integer, p integer, c integer)')
        conn.execute(f'INSERT INTO "{schema}".src VALUES (1, 0, 1), (2, 1, 5), (3, 0, 5)')
    places = {"duckdb": DUCKDB, "postgres": postgres_target(postgres_schema, "copy")}
    route = (
        ROUTE.format(table=f"{schema}.src", path=path, target=places[target])
        .replace('strategy = "full_refresh"', 'strategy = "incremental_append"')
        .replace('partition_column = "p"', 'partition_column = "p"\ncursor_column = "c"')
    )
    (tmp_path / "route.toml").write_text(route, encoding="utf-8")
    env = {"BULK_DSN": postgres_url(postgres_schema.dsn)}
    from dpone_native_transfer.paths import _files

    bulk: list[object] = []

    def spied(*args, **kwargs):
        bulk.append(_files_bulk(*args, **kwargs))
        return bulk[-1]

    _files_bulk = _files.bulk_files
    with monkeypatch.context() as patched:  # the first run's rows: the bulk read's
        patched.setattr(_files, "bulk_files", spied)
        first = run_cli("run", tmp_path / "route.toml", "--quiet", env=env)
    assert first.returncode == 0, first.stderr
    assert bulk and bulk[0] is not None
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f'INSERT INTO "{schema}".src VALUES (4, 1, 5), (5, 0, 6)')
    second = run_cli("run", tmp_path / "route.toml", "--quiet", env=env)
    assert second.returncode == 0, second.stderr
    assert "no longer tracks" not in second.stderr
    if target == "duckdb":
        ids = [row[0] for row in target_texts(tmp_path, ["id"])]
    else:
        ids = [row[0] for row in postgres_texts(postgres_schema, "copy", ["id"])]
    assert ids == ["1", "2", "3", "4", "5"]
