"""chDB pulls a PostgreSQL source itself with ``postgresql()`` (``clickhouse/pg_pulls.py``), on the
real server and a real chDB folder: every value as the source holds it (compared row by row
with the source, and with what the row paths load), or the pull is declined before anything
else reads the rows, and dpone reads them."""

from __future__ import annotations

import contextlib
import datetime
import decimal
import math
import os
import secrets
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from helpers.cli import kill_while_copying
from helpers.postgres_server import postgres_url

from dpone_native_transfer.application import new_run_id, transfer
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.connectors.clickhouse import sink as clickhouse_sink
from dpone_native_transfer.connectors.postgres import PostgresSource
from dpone_native_transfer.errors import NativeTransferError
from dpone_native_transfer.events import EventName

# (name, PostgreSQL type, row 1's value, row 2's value); row 3 is every column NULL
EXACT_COLUMNS = [
    ("big", "bigint", "9223372036854775807", "-9223372036854775808"),
    ("i2", "smallint", "-32768", "32767"),
    ("n2", "numeric(12,2)", "'9999999999.99'", "'-0.01'"),
    ("n38", "numeric(38,10)", "'1234567890123456789012345678.0123456789'", "'0'"),
    ("tz", "timestamptz", "'2024-01-05 10:00:00.123456+02'", "'1900-01-01 00:00:00+00'"),
    ("ts", "timestamp", "'2024-03-31 02:30:00'", "'2299-12-31 23:59:59.999999'"),
    ("d", "date", "'2024-02-29'", "'1900-01-01'"),
    ("b", "boolean", "true", "false"),
    ("t", "text", "'héllo ☃ 𝄞 \"q\"'", "''"),
    ("t2", "text", "E'a,\\tb\\nc\\\\d'", "'NaN'"),
    ("v", "varchar(10)", "'NA'", "' x '"),
    ("c", "char(3)", "'ab'", "''"),
    ("f", "double precision", "0.1::float8 + 0.2::float8", "'1.7976931348623157e308'"),
    ("f2", "double precision", "'NaN'", "'-Infinity'"),
]

ROUTE = """\
[source]
kind = "postgres"
dsn = "env:PULL_DSN"
table = "{table}"
partition_column = "p"
{cursor}
[target]
kind = "clickhouse"
path = "chdata"
table = "copy"
[transfer]
strategy = "{strategy}"
path = "{path}"
[store]
path = "checkpoints.db"
"""

PATHS = ["legacy", "staged", "file-artifact", "lazy-plan"]


def make_table(location, columns, *, name: str = "src") -> str:
    """``name(id, p, columns...)``: two rows of values and one of NULLs, in partitions 0, 1
    and the NULL partition."""
    definitions = ", ".join(f"{column} {pg_type}" for column, pg_type, *_ in columns)
    rows = [
        f"(1, 0, {', '.join(c[2] for c in columns)})",
        f"(2, 1, {', '.join(c[3] for c in columns)})",
        f"(3, NULL, {', '.join('NULL' for _ in columns)})",
    ]
    relation = f'"{location.schema}".{name}'
    with contextlib.closing(psycopg.connect(location.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{location.schema}"')
        conn.execute(f"CREATE TABLE {relation} (id bigint, p integer, {definitions})")
        conn.execute(f"INSERT INTO {relation} VALUES {', '.join(rows)}")
    return f"{location.schema}.{name}"


def route(folder: Path, table: str, path: str, *, strategy="full_refresh", cursor="") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    table = table.replace("\\", "\\\\").replace('"', '\\"')  # a TOML string
    text = ROUTE.format(table=table, path=path, strategy=strategy, cursor=cursor)
    (folder / "route.toml").write_text(text, encoding="utf-8")
    return folder / "route.toml"


def run(folder: Path, monkeypatch, dsn: str, *args, **kwargs):
    """One run of the route in ``folder``; its result (its events among them)."""
    file = route(folder, *args, **kwargs)
    monkeypatch.setenv("PULL_DSN", dsn)
    monkeypatch.chdir(folder)
    result, _ = transfer(load_route_config(file), new_run_id())
    return result


def reads(result) -> set[str]:
    return {e.fields["read"] for e in result.events if e.name == EventName.PARTITION_EXTRACTED}


def target_rows(folder: Path) -> list[tuple]:
    sink = clickhouse_sink.ClickHouseSink(str(folder / "chdata"), "copy")
    return sorted(sink.rows(), key=lambda row: (row[0] is None, row[0]))


def source_rows(location, table: str) -> list[tuple]:
    with contextlib.closing(psycopg.connect(location.dsn)) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        rows = conn.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
    return rows


def same(got, want) -> bool:
    """A target value equals the source's: an instant in UTC, a NaN a NaN."""
    if isinstance(want, float) and isinstance(got, float) and math.isnan(want):
        return math.isnan(got)
    if isinstance(want, datetime.datetime) and want.tzinfo is None and got is not None:
        want = want.replace(tzinfo=datetime.UTC)
    return type(got) is type(want) and got == want


def no_rows_read(*args, **kwargs):
    raise AssertionError("the rows were read in Python")


@pytest.mark.parametrize("path", PATHS)
def test_chdb_pulls_every_value_exactly_as_the_source_holds_it(
    tmp_path, postgres_schema, monkeypatch, path
):
    """chDB reads the rows itself (Python reads none: ``read`` fails if asked, and every
    partition's read is ``engine``), and the target holds, row by row, the source's values:
    big integers, decimals to the last digit, instants in UTC, dates at ClickHouse's limits,
    unicode and control characters, padding, NaN and infinities, NULLs; and the same rows the
    row paths load."""
    table = make_table(postgres_schema, EXACT_COLUMNS)
    dsn = postgres_url(postgres_schema.dsn)
    with monkeypatch.context() as patched:
        patched.setattr(PostgresSource, "read", no_rows_read)
        patched.setattr(PostgresSource, "read_partitions", no_rows_read)
        pulled = run(tmp_path / "pull", monkeypatch, dsn, table, path)
    if path != "lazy-plan":
        assert reads(pulled) == {"engine"}
    assert pulled.rows_loaded == 3
    got = target_rows(tmp_path / "pull")
    want = source_rows(postgres_schema, table)
    assert len(got) == len(want) == 3
    for got_row, want_row in zip(got, want, strict=True):
        for got_value, want_value in zip(got_row, want_row, strict=True):
            assert same(got_value, want_value), (got_value, want_value)
    assert got[0][EXACT_COLUMNS.index(("n2", *EXACT_COLUMNS[2][1:])) + 2] == decimal.Decimal(
        "9999999999.99"
    )
    monkeypatch.setattr(PostgresSource, "engine_login", lambda self: None)
    rows = run(tmp_path / "rows", monkeypatch, dsn, table, path.replace("lazy-plan", "legacy"))
    assert reads(rows) == {"rows"}
    assert repr(target_rows(tmp_path / "rows")) == repr(got)


DECLINED = [
    ("real", [("r", "real", "'0.1'", "'Infinity'")]),
    ("bytea", [("y", "bytea", "'\\x00ff'", "''")]),
    ("numeric without precision", [("n", "numeric", "'1.5'", "'2'")]),
    ("uuid", [("u", "uuid", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'", "NULL")]),
    ("infinite date", [("d", "date", "'infinity'", "'2024-01-01'")]),
    ("BC date", [("d", "date", "'0044-03-15 BC'", "'2024-01-01'")]),
    ("date before 1900", [("d", "date", "'1899-12-31'", "'2024-01-01'")]),
    ("numeric NaN", [("n", "numeric(12,2)", "'NaN'", "'1.5'")]),
    ("denormal double", [("f", "double precision", "'5e-324'", "'1.5'")]),
    ("infinite instant", [("tz", "timestamptz", "'infinity'", "'2024-01-01+00'")]),
]


@pytest.mark.parametrize("case", DECLINED, ids=[case[0] for case in DECLINED])
@pytest.mark.parametrize("path", ["staged", "file-artifact"])
def test_a_kind_or_value_chdb_reads_otherwise_is_read_by_dpone(
    tmp_path, postgres_schema, monkeypatch, path, case
):
    """A column chDB would read otherwise (a real as a Float32, a bytea as its text, a date
    of infinity as 1970-01-01, a BC date without its era), or a value it fails on (a numeric
    NaN): the pull is declined, and the rows are read by dpone (``read`` is ``rows``), with
    the outcome the row paths give, not chDB's."""
    _, columns = case
    table = make_table(postgres_schema, columns)
    dsn = postgres_url(postgres_schema.dsn)
    pulled = outcome(tmp_path / "run", monkeypatch, dsn, table, path)
    monkeypatch.setattr(PostgresSource, "engine_login", lambda self: None)
    assert pulled == outcome(tmp_path / "rows", monkeypatch, dsn, table, path)


@pytest.mark.parametrize("case", DECLINED[4:], ids=[case[0] for case in DECLINED[4:]])
def test_a_value_chdb_reads_otherwise_gets_legacys_outcome_on_lazy_plan(
    tmp_path, postgres_schema, monkeypatch, case
):
    """lazy-plan's read is the target call: a numeric NaN or a subnormal double, which chDB
    fails on, failed inside it and blocked the route (exit 1, then 3). Such values are
    looked for before the call now, and the attempt ends as legacy does: the NaN refused
    before the target, the double loaded as dpone reads it."""
    _, columns = case
    table = make_table(postgres_schema, columns)
    dsn = postgres_url(postgres_schema.dsn)
    lazy = outcome(tmp_path / "lazy", monkeypatch, dsn, table, "lazy-plan")
    monkeypatch.setattr(PostgresSource, "engine_login", lambda self: None)
    assert lazy == outcome(tmp_path / "rows", monkeypatch, dsn, table, "legacy")


def outcome(folder: Path, monkeypatch, dsn: str, table: str, path: str):
    """How a run ends: the rows loaded, each partition's read, and the target's rows; or the
    error code it stopped with, before the target (the target has no table)."""
    try:
        result = run(folder, monkeypatch, dsn, table, path)
    except NativeTransferError as error:
        assert not (folder / "chdata").exists() or target_rows(folder) == []
        return error.code
    return result.rows_loaded, reads(result), repr(target_rows(folder))


def test_lazy_plan_carries_the_rows_of_a_plan_chdb_would_read_otherwise(
    tmp_path, postgres_schema, monkeypatch
):
    """lazy-plan's plan of a real column is ``PlanInexact``: the attempt carries the rows as
    legacy does (Python reads them), before the target call."""
    table = make_table(postgres_schema, DECLINED[0][1])
    result = run(
        tmp_path / "run", monkeypatch, postgres_url(postgres_schema.dsn), table, "lazy-plan"
    )
    assert reads(result) == {"rows"}
    assert [row[2] for row in target_rows(tmp_path / "run")] == [
        0.1,
        math.inf,
        None,
    ]  # not chDB's Float32


def test_a_login_whose_sessions_are_not_in_utc_gets_no_timestamptz_pull(
    tmp_path, postgres_schema, monkeypatch
):
    """chDB drops a ``timestamptz`` text's offset: for a login whose sessions start in another
    zone, the pull is declined, and the instants land in UTC as the row paths carry them."""
    table = make_table(postgres_schema, [EXACT_COLUMNS[4]])
    role = f"{postgres_schema.schema}_tz"
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'tz-pw' IN ROLE pg_read_all_data")
        conn.execute(f"ALTER ROLE {role} SET TimeZone = 'Asia/Kolkata'")
    try:
        base = postgres_url(postgres_schema.dsn)
        dsn = "postgresql://" + f"{role}:tz-pw@" + base.split("@", 1)[1]
        result = run(tmp_path / "run", monkeypatch, dsn, table, "file-artifact")
        assert reads(result) == {"rows"}
        got = [row[2] for row in target_rows(tmp_path / "run")]
        assert got[0] == datetime.datetime(2024, 1, 5, 8, 0, 0, 123456, tzinfo=datetime.UTC)
    finally:
        with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {role}")


def test_a_row_written_during_the_pull_is_left_for_the_next_run(
    tmp_path, postgres_schema, monkeypatch
):
    """chDB's read cannot join the attempt's snapshot: the window's upper bound is fixed by the
    plan before the pull, so a row written while chDB pulls (its cursor above the bound) is not
    loaded, nor counted, and the next run loads it, once. The counts recorded are the rows
    the pulled files hold, which the load checks against the target."""
    relation = make_table(postgres_schema, [("ts", "bigint", "10", "20")])
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f"UPDATE {relation} SET ts = 5 WHERE ts IS NULL")
    dsn = postgres_url(postgres_schema.dsn)
    real_pull = clickhouse_sink.ClickHouseSink.pull_load_files
    written = []

    def pull_with_a_writer(self, plan, paths):  # the first pull only
        if not written:
            with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as db:
                db.execute(f"INSERT INTO {relation} (id, p, ts) VALUES (4, 0, 30), (5, NULL, 31)")
        written.append(True)
        return real_pull(self, plan, paths)

    monkeypatch.setattr(clickhouse_sink.ClickHouseSink, "pull_load_files", pull_with_a_writer)
    args = (relation, "file-artifact")
    kwargs = {"strategy": "incremental_append", "cursor": 'cursor_column = "ts"'}
    first = run(tmp_path / "run", monkeypatch, dsn, *args, **kwargs)
    assert written and reads(first) == {"engine"}
    assert first.rows_loaded == 3
    assert sorted(row[0] for row in target_rows(tmp_path / "run")) == [1, 2, 3]
    second = run(tmp_path / "run", monkeypatch, dsn, *args, **kwargs)
    assert second.rows_loaded == 2  # the two written during the first pull, and no other
    ids = sorted(row[0] for row in target_rows(tmp_path / "run"))
    assert ids == [1, 2, 3, 4, 5]
    assert len(written) == 2 and reads(second) == {"engine"}


@pytest.mark.parametrize("collation", ["C", "ci"], ids=["bytewise", "nondeterministic"])
def test_a_text_partition_column_is_pulled_only_where_equal_means_the_same_bytes(
    tmp_path, postgres_schema, monkeypatch, collation
):
    """Text partitions (unicode values too) are pulled by a lookup of each row's bytes, which
    is PostgreSQL's ``=`` under a deterministic collation. Under a nondeterministic one
    ('East' = 'east'), each partition's read holds rows chDB's lookup would leave out: the
    pull is declined, and every row is loaded, as the row paths load it."""
    relation = f'"{postgres_schema.schema}".src'
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA "{postgres_schema.schema}"')
        if collation == "ci":
            conn.execute(
                f'CREATE COLLATION "{postgres_schema.schema}".ci (provider = icu,'
                " locale = 'und-u-ks-level2', deterministic = false)"
            )
        named = f'"{postgres_schema.schema}".ci' if collation == "ci" else '"C"'
        conn.execute(f"CREATE TABLE {relation} (id bigint, p text COLLATE {named}, v integer)")
        conn.execute(
            f"INSERT INTO {relation} VALUES (1, 'East', 1), (2, 'east', 2), (3, 'Zürich ☃', 3),"
            " (4, NULL, 4), (5, '', 5)"
        )
    dsn = postgres_url(postgres_schema.dsn)
    table = f"{postgres_schema.schema}.src"
    result = run(tmp_path / "run", monkeypatch, dsn, table, "file-artifact")
    assert reads(result) == ({"engine"} if collation == "C" else {"rows"})
    assert result.rows_loaded == 5
    assert [row[:2] for row in target_rows(tmp_path / "run")] == [
        (1, "East"), (2, "east"), (3, "Zürich ☃"), (4, None), (5, ""),
    ]  # fmt: skip


@pytest.mark.parametrize("path", ["staged", "file-artifact"])
def test_a_date_chdb_would_misread_written_during_the_pull_is_never_loaded_as_another(
    tmp_path, postgres_schema, monkeypatch, path
):
    """The dates are checked after chDB's read, not only before: an ``infinity`` written while
    chDB pulls (a full refresh reads the table as it is then) would be read as 1970-01-01.
    The pull is thrown away and dpone reads the rows in a new snapshot: the row paths'
    outcome (the value is refused before the target), never another date."""
    relation = make_table(postgres_schema, [("d", "date", "'2024-02-29'", "'1900-01-01'")])
    name = "pull_stage" if path == "staged" else "pull_load_files"
    real_pull = getattr(clickhouse_sink.ClickHouseSink, name)

    def pull_with_a_writer(self, *args):
        with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as db:
            db.execute(f"INSERT INTO {relation} (id, p, d) VALUES (4, 0, 'infinity')")
        return real_pull(self, *args)

    monkeypatch.setattr(clickhouse_sink.ClickHouseSink, name, pull_with_a_writer)
    dsn = postgres_url(postgres_schema.dsn)
    with pytest.raises(NativeTransferError) as refused:
        run(tmp_path / "run", monkeypatch, dsn, relation, path)
    assert refused.value.code == "native_transfer_value_unsupported"
    assert not (tmp_path / "run" / "chdata").exists() or target_rows(tmp_path / "run") == []


def test_a_plan_loaded_twice_is_checked_again_and_the_password_is_in_no_repr(
    tmp_path, postgres_schema
):
    """The sink keeps a checked plan's read for one load: a second load of the same plan (a
    caller's retry) checks it again rather than failing; the login and the read print no
    password."""
    from dpone_native_transfer.connectors.clickhouse.pg_pulls import postgres_read
    from dpone_native_transfer.payloads import LoadPlan

    table = make_table(postgres_schema, EXACT_COLUMNS[:3])
    source = PostgresSource(postgres_url(postgres_schema.dsn), table, "p")
    plan = LoadPlan(
        source=source,
        columns=source.describe().columns,
        bounds=({"partition": 0}, {"partition": 1}),
        replace=False,
    )
    sink = clickhouse_sink.ClickHouseSink(str(tmp_path / "chdata"), "copy")
    sink.check_plan(plan)
    assert sink.load_plan(plan) == 2
    assert sink.load_plan(plan) == 2
    assert sink.row_count() == 4
    password = psycopg.conninfo.conninfo_to_dict(postgres_schema.dsn)["password"]
    login = source.engine_login()
    assert login is not None and login.password == password
    assert password not in repr(login) + repr(postgres_read(plan, table="copy"))


@pytest.mark.parametrize("path", ["file-artifact", "lazy-plan"])
def test_a_worker_killed_inside_chdbs_pull_never_leaves_wrong_rows(tmp_path, postgres_schema, path):
    """SIGKILL while chDB's ``postgresql()`` read streams (its ``COPY`` seen in
    ``pg_stat_activity``, under a login of its own). file-artifact pulls before the target:
    nothing was armed, and the next run loads every row once. lazy-plan's pull is its
    target call (a full refresh fills a fresh table, swapped in only at the end): the next
    run is blocked (ClickHouse's ledger cannot prove an outcome; an operator reconciles, as
    after any chDB target call killed midway) and the target holds no row. Never a partial
    or doubled load."""
    rows, role = 300_000, f"pull_{secrets.token_hex(4)}"
    relation = f'"{postgres_schema.schema}".src'
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE SCHEMA "{postgres_schema.schema}"')
        conn.execute(f"CREATE TABLE {relation} (id bigint, p integer, t text)")
        generated = f"SELECT g, g % 4, md5(g::text) FROM generate_series(1, {rows}) g"
        conn.execute(f"INSERT INTO {relation} {generated}")
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw' IN ROLE pg_read_all_data")
    base = postgres_url(postgres_schema.dsn)
    dsn = f"postgresql://{role}:pw@" + base.split("@", 1)[1]
    file = route(tmp_path, f"{postgres_schema.schema}.src", path)
    env = {**os.environ, "PULL_DSN": dsn}
    script = str(Path(sys.executable).parent / "dpone-transfer")
    kill_while_copying(
        file, dsn=postgres_schema.dsn, who=("usename", role), env={"PULL_DSN": dsn}, cwd=tmp_path
    )
    done = subprocess.run([script, "run", str(file), "--quiet"], env=env, cwd=tmp_path,
                          capture_output=True, text=True)  # fmt: skip
    sink = clickhouse_sink.ClickHouseSink(str(tmp_path / "chdata"), "copy")
    if done.returncode != 0:  # blocked: the killed target call's outcome is unknown to it
        assert path == "lazy-plan" and done.returncode == 3, done.stderr
        assert "native_transfer_manual_reconciliation_required" in done.stderr
        assert sink.row_count() == 0  # the fresh table was never swapped in
        return
    with sink.client() as client:
        found = client.query_rows("SELECT count(), uniqExact(id), min(id), max(id) FROM copy")
    assert found == [(rows, rows, 1, rows)]


@pytest.mark.parametrize(
    ("schema_name", "columns", "read"),
    [
        ("odd sché`ma", ("p", "Ünï cödé", "select", "x`y", "a b"), "engine"),
        ('we"ird', ("p", "v"), "rows"),
        ("plain", ("p", "a\\b", "a\\\\b"), "rows"),
    ],
    ids=["names chDB quotes right", "a double quote", "backslashes"],
)
def test_odd_names_are_pulled_only_where_chdb_names_them_right(
    tmp_path, postgres_schema, monkeypatch, schema_name, columns, read
):
    """ClickHouse names PostgreSQL identifiers with backslash escapes: a column ``a\\b`` is
    sent as ``"a\\\\b"``, which is another column (here one that exists: its values would
    land in the wrong column). Such a name declines the pull; unicode, spaces, backticks
    and reserved words are pulled. Either way each value lands in its own column."""
    schema = f"{postgres_schema.schema}_{schema_name}"

    def ident(name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    relation = f"{ident(schema)}.{ident('t')}"
    with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
        conn.execute(f"CREATE SCHEMA {ident(schema)}")
        defs = ", ".join(f"{ident(c)} integer" for c in columns)
        conn.execute(f"CREATE TABLE {relation} (id bigint, {defs})")
        values = ", ".join(str(10 * (n + 1)) for n in range(len(columns)))
        conn.execute(f"INSERT INTO {relation} VALUES (1, {values}), (2, {values})")
    try:
        file = route(tmp_path / "run", f"{schema}.t", "file-artifact")
        monkeypatch.setenv("PULL_DSN", postgres_url(postgres_schema.dsn))
        monkeypatch.chdir(tmp_path / "run")
        result, _ = transfer(load_route_config(file), new_run_id())
        assert reads(result) == {read}
        want = [(i, *(10 * (n + 1) for n in range(len(columns)))) for i in (1, 2)]
        assert target_rows(tmp_path / "run") == want
    finally:
        with contextlib.closing(psycopg.connect(postgres_schema.dsn, autocommit=True)) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {ident(schema)} CASCADE")
