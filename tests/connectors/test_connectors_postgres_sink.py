"""PostgreSQL target (issue 17) against the suite's real server: every path and strategy,
lazy-plan from PostgreSQL, the guard's retries, the ledger in the load's transaction, schema
evolution, names, privileges and safe errors. Exact values per type:
tests/connectors/test_type_matrix.py; the conformance kit on every row path:
tests/guard/test_conformance.py (TestKitPostgres)."""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.postgres_server import postgres_url
from helpers.routes import Route
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dpone_native_transfer import PostgresSink, PostgresSource, SQLiteSource
from dpone_native_transfer.column_types import (
    postgres_date,
    postgres_timestamp,
    postgres_timestamptz,
)
from dpone_native_transfer.errors import (
    ConfigInvalid,
    SchemaChanged,
    TargetAccessRefused,
    TargetBusy,
    TargetPrivilegeRefused,
    TargetRolledBack,
    TargetRowsMismatch,
    TargetUnavailable,
    ValueUnsupported,
)
from dpone_native_transfer.payloads import Column, LoadPlan
from dpone_native_transfer.reporting import exit_code_for
from dpone_native_transfer.testing import (
    InjectedFault,
    assert_blocked_before_target,
    assert_rows_exactly_once,
    build_sample_source,
    phase_batch,
)

ROW_PATHS = ("legacy", "staged", "file-artifact")
PATHS = (*ROW_PATHS, "lazy-plan")
STRATEGIES = ("incremental_append", "full_refresh")


def admin(location: Any, sql: str, params: Any = None) -> list[tuple]:
    """One statement as the server's superuser, outside any route."""
    with contextlib.closing(psycopg.connect(location.dsn, autocommit=True)) as conn:
        cursor = conn.execute(sql, params)
        return cursor.fetchall() if cursor.description else []


class SinkRoute(Route):
    """The tests' route into ``schema.orders_copy`` on the server. On lazy-plan the source is
    a PostgreSQL copy of the sample table in the same schema (what the server can pull);
    otherwise the sample SQLite source."""

    def __init__(self, tmp: Path, location: Any, path: str, *, url: str | None = None) -> None:
        self.location, self.path = location, path
        self.url = url or postgres_url(location.dsn)
        sink = PostgresSink(self.url, f"{location.schema}.orders_copy")
        self.pg_source = path == "lazy-plan"
        if not self.pg_source:
            super().__init__(tmp, sink=sink)
            return
        admin(location, f'CREATE SCHEMA IF NOT EXISTS "{location.schema}"')
        admin(
            location,
            f'CREATE TABLE "{location.schema}".orders (id integer PRIMARY KEY, region text'
            " NOT NULL, amount double precision, updated_at bigint)",
        )
        source = PostgresSource(self.url, f"{location.schema}.orders", "region", "updated_at")
        super().__init__(tmp, source=source, sink=sink)
        self._copy_sample(tmp, rows=120, start_id=1)

    def _copy_sample(self, tmp: Path, *, rows: int, start_id: int) -> None:
        """The sample rows ``build_sample_source`` makes, inserted into the PostgreSQL source."""
        scratch = tmp / f"sample-{start_id}.db"
        build_sample_source(scratch, rows=rows, partitions=4, start_id=start_id)
        with contextlib.closing(sqlite3.connect(scratch)) as db:
            sample = db.execute("SELECT * FROM orders").fetchall()
        with contextlib.closing(psycopg.connect(self.location.dsn, autocommit=True)) as conn:
            conn.cursor().executemany(
                f'INSERT INTO "{self.location.schema}".orders VALUES (%s, %s, %s, %s)', sample
            )

    def source_rows(self) -> list[tuple]:
        if not self.pg_source:
            return super().source_rows()
        return admin(self.location, f'SELECT * FROM "{self.location.schema}".orders ORDER BY id')

    def source_ids(self) -> list[int]:
        return [row[0] for row in self.source_rows()]

    def add_rows(self, rows: int = 30) -> None:
        if not self.pg_source:
            super().add_rows(rows)
            return
        self._copy_sample(self.tmp, rows=rows, start_id=max(self.source_ids()) + 1)

    def run(self, run_id: str = "run-1", *, strategy: str = "incremental_append", **kwargs):
        return self.runtime(**kwargs).run(self.spec(self.path, run_id, strategy=strategy))


@pytest.fixture
def location(postgres_schema):
    return postgres_schema


@pytest.fixture(params=PATHS)
def route(request, tmp_path, location):
    made = SinkRoute(tmp_path, location, request.param)
    yield made
    made.real_store.close()


# --- every path, both strategies ------------------------------------------------------------


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_path_and_strategy_loads_each_row_exactly_once(route, strategy):
    """Row paths from SQLite, lazy-plan from PostgreSQL: three runs, new rows before the second;
    every value comes back as the source holds it, and the ledger holds one row per batch."""
    results = [route.run("run-1", strategy=strategy)]
    assert route.target_rows() == route.source_rows()
    route.add_rows(30)
    results.append(route.run("run-2", strategy=strategy))
    results.append(route.run("run-3", strategy=strategy))  # nothing new
    assert route.target_rows() == route.source_rows()
    assert_rows_exactly_once(route.source_ids(), route.target_ids())
    loaded = [result.rows_loaded for result in results]
    assert loaded == ([120, 30, 0] if strategy == "incremental_append" else [120, 150, 150])
    entries = route.sink.inner.read_ledger(partitions=True)
    assert [e.batch_id for e in entries] == [r.batch_id for r in results if r.batch_id]
    assert [e.rows for e in entries] == [rows for rows in loaded if rows]
    assert route.sink.inner.row_count() == 150 and not route.sink.inner.is_empty()
    call = {"staged": "finalize_staged_load", "lazy-plan": "load_plan"}.get(route.path, "load")
    assert route.sink.calls == [call] * len(entries)


def test_a_lazy_plan_is_pulled_by_the_server_not_through_dpone(tmp_path, location):
    """The load is given a plan (no rows): the server copies the source's rows itself."""
    route = SinkRoute(tmp_path, location, "lazy-plan")
    payloads: list[Any] = []
    inner_load = route.sink.inner.load_plan
    route.sink.inner.load_plan = lambda payload, **ledger: (
        payloads.append(payload) or inner_load(payload, **ledger)
    )
    try:
        assert route.run().rows_loaded == 120
    finally:
        route.real_store.close()
    assert [type(payload) for payload in payloads] == [LoadPlan]
    assert route.target_rows() == route.source_rows()


def test_lazy_plan_gives_the_values_the_row_paths_give(tmp_path, location):
    """A ``real`` 0.1 read by the driver is the double 0.1; cast on the server it would be
    0.100000001490116. A ``character(4)`` keeps its padding, which a cast drops. Both paths
    load the same rows into their own tables."""
    schema = location.schema
    admin(location, f'CREATE SCHEMA "{schema}"')
    admin(
        location,
        f'CREATE TABLE "{schema}".src (id integer, p integer, r real, v varchar(5), c char(4))',
    )
    rows = "(1, 0, 0.1, 'ab', 'ab'), (2, 1, 3.4e38, NULL, NULL)"
    admin(location, f'INSERT INTO "{schema}".src VALUES {rows}')
    url = postgres_url(location.dsn)
    source = PostgresSource(url, f"{schema}.src", "p")
    loaded = {}
    for path in ("legacy", "lazy-plan"):
        sink = PostgresSink(url, f"{schema}.copy_{path.replace('-', '_')}")
        route = Route(tmp_path / path, source=source, sink=sink)
        try:
            route.runtime().run(route.spec(path, strategy="full_refresh"))
        finally:
            route.real_store.close()
        loaded[path] = sorted(sink.rows())
    expected = [(1, 0, 0.1, "ab", "ab  "), (2, 1, 3.4e38, None, None)]
    assert loaded["lazy-plan"] == loaded["legacy"] == expected


# --- lazy-plan is refused before the target unless the server can pull the source -----------


def test_lazy_plan_from_a_sqlite_source_is_refused_before_arming(tmp_path, location):
    route = Route(tmp_path, sink=PostgresSink(postgres_url(location.dsn), "orders_copy"))
    try:
        with pytest.raises(
            ConfigInvalid,
            match="path 'lazy-plan' cannot run.*PostgreSQL reads tables of its own database",
        ):
            route.runtime().run(route.spec("lazy-plan"))
        assert route.sink.target_calls == 0
        assert route.store.batches == []  # nothing armed: the route is not blocked
    finally:
        route.real_store.close()


def _plan(source: Any, *columns: Column) -> LoadPlan:
    columns = columns or (Column("id", "integer", "integer"),)
    return LoadPlan(source=source, columns=columns, bounds=({"partition": "a"},))


def test_lazy_plan_from_another_database_without_dblink_is_refused(location):
    """Another database of the server, without dblink in the target's: refused, naming it;
    another server: refused without connecting."""
    url = postgres_url(location.dsn)
    elsewhere = url.rsplit("/", 1)[0] + "/another_database"
    sink = PostgresSink(url, f"{location.schema}.orders_copy")
    with pytest.raises(ConfigInvalid, match="the dblink extension is not installed"):
        sink.check_plan(_plan(PostgresSource(elsewhere, "orders", "region")))
    other_server = PostgresSink("postgresql://u:p@127.0.0.1:1/x", "orders_copy")  # unreachable
    with pytest.raises(ConfigInvalid, match="or of another database of the same server"):
        other_server.check_plan(_plan(PostgresSource(url, "orders", "region")))


def test_lazy_plan_refuses_the_target_itself_and_bad_bounds(tmp_path, location):
    route = SinkRoute(tmp_path, location, "lazy-plan")
    try:
        route.run()
        schema, url = location.schema, route.url
        itself = PostgresSource(url, f"{schema}.orders_copy", "region")
        with pytest.raises(ConfigInvalid, match="is the target table itself"):
            route.sink.inner.check_plan(_plan(itself))
        bad_bounds = LoadPlan(source=route.source, columns=_plan(None).columns, bounds=({},))
        with pytest.raises(ConfigInvalid, match="partition bounds"):
            route.sink.inner.check_plan(bad_bounds)
    finally:
        route.real_store.close()


# --- the guard: a partial commit blocks the retry; without the guard it duplicates -----------


def test_a_partial_commit_blocks_every_retry_before_the_target(route):
    original = route.store.fail_batch(phase_batch("checkpoint_committed"), keep=1)
    with pytest.raises(InjectedFault) as caught:
        route.run()
    assert caught.value is original
    route.add_rows(30)
    for run_id in ("retry-1", "retry-2"):
        assert_blocked_before_target(lambda run_id=run_id: route.run(run_id), route.sink)
    assert route.sink.target_calls == 1
    assert_rows_exactly_once(route.source_ids()[:120], route.target_ids())
    assert len(route.sink.inner.read_ledger()) == 1  # the batch the target holds, once


def test_without_the_guard_the_same_retry_loads_rows_twice(route):
    """The difference the guard makes, on the same fault: ``plugins=[]``."""
    route.store.fail_batch(phase_batch(None), keep=1)
    with pytest.raises(InjectedFault):
        route.run(plugins=[])
    route.run("retry", plugins=[])
    ids = route.target_ids()
    assert route.sink.target_calls == 2
    assert set(ids) == set(route.source_ids())
    duplicated = len(ids) - len(set(ids))
    assert 0 < duplicated < 120  # the partitions the store lost: loaded again


# --- the ledger commits with the rows; a failed full refresh keeps the old rows -------------


def _refuse_at_commit(location: Any) -> None:
    """A deferred trigger that fails at COMMIT: rows and ledger row are both written, then the
    commit fails, so neither may remain."""
    schema = location.schema
    admin(
        location,
        f'CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS'
        " $$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$",
    )
    admin(
        location,
        f'CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON "{schema}".orders_copy'
        f' DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "{schema}".refuse()',
    )


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_load_failing_at_commit_leaves_neither_rows_nor_a_ledger_row(route, strategy):
    first = route.run(strategy=strategy)
    before = route.target_rows()
    _refuse_at_commit(route.location)
    route.add_rows(30)
    with pytest.raises(psycopg.Error):  # the driver's own error, unchanged
        route.run("run-2", strategy=strategy)
    assert route.sink.target_calls == 2
    assert route.target_rows() == before  # a full refresh keeps the old rows
    assert [e.batch_id for e in route.sink.inner.read_ledger()] == [first.batch_id]
    if strategy == "incremental_append":  # an unknown outcome blocks the append's retry
        assert_blocked_before_target(lambda: route.run("run-3"), route.sink)


def test_a_load_kept_from_the_ledger_lock_past_its_wait_rolls_back_unblocked(route, monkeypatch):
    """Another load into the schema holds the ledger's lock (a worker stopped before its
    commit): the load waits ``LEDGER_WAIT_SECONDS``, then rolls back, ``TargetBusy`` (exit 1):
    not an unknown outcome, so the route is not blocked; the lock freed, the next run loads
    every row once."""
    from dpone_native_transfer.connectors import postgres_sink

    monkeypatch.setattr(postgres_sink, "LEDGER_WAIT_SECONDS", 0.3)
    first = route.run()
    before = route.target_rows()
    route.add_rows(30)
    with psycopg.connect(route.location.dsn) as holder:  # a load stopped inside its _record
        postgres_sink._lock_ledger(holder, route.sink.inner._ledger_table)
        with pytest.raises(TargetBusy) as raised:
            route.run("run-2")
        holder.rollback()
    assert raised.value.code == "native_transfer_target_unavailable"
    ledger = route.sink.inner.read_ledger()
    assert raised.value.diagnostics == {"target_table": ledger[0].target_table}
    assert route.sink.target_calls == 2  # inside the target call
    assert route.target_rows() == before
    assert [entry.batch_id for entry in ledger] == [first.batch_id]
    route.run("run-3")  # not blocked: no one resolved anything
    assert_rows_exactly_once(route.source_ids(), route.target_ids())


def test_a_failed_stage_leaves_the_target_untouched(tmp_path, location):
    route = SinkRoute(tmp_path, location, "staged")
    try:
        route.run()
        with contextlib.closing(sqlite3.connect(route.source_path)) as db:
            db.execute("INSERT INTO orders VALUES (999, 'region-000', 'not a number', 2000000)")
            db.commit()
        with pytest.raises(ValueUnsupported):
            route.run("run-2")
        assert route.sink.target_calls == 1 and len(route.target_ids()) == 120
        assert route.sink.inner.staged_row_count() == 0
    finally:
        route.real_store.close()


def test_a_first_staged_load_renames_the_stage_and_later_ones_copy(location):
    """A missing target is the stage renamed (the same relation: no row copied again), with
    the stage's columns and types; into an existing target the stage's
    rows are copied and the stage dropped."""
    from dpone_native_transfer.payloads import RowChunks

    table = f"{location.schema}.renamed"
    sink = PostgresSink(postgres_url(location.dsn), table)
    columns = (Column("id", "integer", "integer"), Column("name", "text", "text"))
    oid = "SELECT to_regclass(%s)::oid"
    stage = f'"{location.schema}"."_dpone_stage_renamed"'
    assert sink.stage(RowChunks(columns=columns, chunks=[[(1, "a"), (2, None)]])) == 2
    staged = admin(location, oid, [stage])[0][0]
    assert sink.finalize_staged_load() == 2
    assert admin(location, oid, [table])[0][0] == staged
    assert admin(location, oid, [stage])[0][0] is None
    types = admin(
        location,
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute"
        " WHERE attrelid = to_regclass(%s) AND attnum > 0 ORDER BY attnum",
        [table],
    )
    assert types == [("id", "bigint"), ("name", "text")]
    assert sink.stage(RowChunks(columns=columns, chunks=[[(3, "c")]])) == 1
    assert sink.finalize_staged_load() == 1
    assert admin(location, oid, [table])[0][0] == staged and not admin(location, oid, [stage])[0][0]
    assert admin(location, f"SELECT id, name FROM {table} ORDER BY id") == [
        (1, "a"), (2, None), (3, "c"),
    ]  # fmt: skip


# --- schema evolution -----------------------------------------------------------------------


def test_two_tables_creating_their_schema_at_once_both_find_it(location):
    """A pipeline's first two tables into a new schema create it at once: the second
    failed with a unique violation (found by the twenty-table pipeline in processes). The
    second now waits on a lock of the name and finds the schema made."""
    from dpone_native_transfer.connectors._sql import TableName
    from dpone_native_transfer.connectors.postgres_sink import _create_schema

    for attempt in range(5):
        schema = f"{location.schema}_{attempt}"
        meet, failed = threading.Barrier(2), []

        def create(schema: str = schema, meet=meet, failed=failed) -> None:
            with psycopg.connect(location.dsn) as conn:
                meet.wait()
                try:
                    _create_schema(conn, TableName(schema, "t"))
                    conn.commit()
                except psycopg.Error as error:
                    failed.append(error)

        threads = [threading.Thread(target=create) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        with psycopg.connect(location.dsn, autocommit=True) as admin:
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}"')
        assert failed == [], attempt


def test_a_new_source_column_is_added_to_the_target(tmp_path, location):
    route = SinkRoute(tmp_path, location, "legacy")
    try:
        route.run()
        with contextlib.closing(sqlite3.connect(route.source_path)) as db:
            db.execute('ALTER TABLE orders ADD COLUMN "a note %s" TEXT')
            db.execute("INSERT INTO orders VALUES (500, 'region-000', 1.5, 2000000, 'new')")
            db.commit()
        route.run("run-2")
        columns = admin(
            location,
            "SELECT column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = %s AND table_name = 'orders_copy' ORDER BY ordinal_position",
            [location.schema],
        )
        assert columns[-1] == ("a note %s", "text")
        assert (500, "region-000", 1.5, 2000000, "new") in route.target_rows()
        source_columns = route.source.describe().columns
        assert not route.sink.inner.column_difference(source_columns)
    finally:
        route.real_store.close()


def test_a_narrower_hand_made_column_stops_the_run_before_the_target(tmp_path, location):
    schema = location.schema
    admin(location, f'CREATE SCHEMA "{schema}"')
    admin(
        location,
        f'CREATE TABLE "{schema}".orders_copy (id integer, region varchar(40), amount real,'
        " updated_at numeric(20,0))",
    )
    route = SinkRoute(tmp_path, location, "legacy")
    try:
        difference = route.sink.inner.column_difference(route.source.describe().columns)
        assert difference.retyped == ["id", "amount"]  # varchar and a wide numeric take theirs
        with pytest.raises(SchemaChanged):
            route.run()
        assert route.sink.target_calls == 0
    finally:
        route.real_store.close()


_BINARY_VALUES = [  # id, integer, real, text, boolean, blob: what a binary COPY carries
    (1, 2**63 - 1, float("inf"), "é\t\"x'\\.\n\\N", 1, b"\x00\xff"),
    (2, -(2**63), 1e300, "", 0, b""),
    (3, 0, 0.1 + 0.2, "NULL", None, "text as bytes"),
    (4, None, 2**53, None, 1, None),
    (5, 7, float("-inf"), "\\.", 0, b"\\x41"),
]


@pytest.mark.parametrize("path", ROW_PATHS)
@pytest.mark.parametrize("made", [False, True])
def test_rows_in_binary_copy_or_as_text_into_hand_made_types_give_the_same_values(
    tmp_path, location, path, made
):
    """Issue 47: SQLite rows of kinds whose binary form psycopg writes go by binary ``COPY``
    (no text parsed by the server); into a table made by hand with other types they go as text.
    Either way every value is the one the source holds."""
    schema = location.schema
    source = tmp_path / "kinds.db"
    with contextlib.closing(sqlite3.connect(source)) as db:
        db.execute("CREATE TABLE k (id INTEGER PRIMARY KEY, i INTEGER, r REAL, t TEXT,"
                   " f BOOLEAN, b BLOB)")  # fmt: skip
        db.executemany("INSERT INTO k VALUES (?, ?, ?, ?, ?, ?)", _BINARY_VALUES)
        db.commit()
    if made:
        admin(location, f'CREATE SCHEMA "{schema}"')
        admin(location, f'CREATE TABLE "{schema}".k_copy (id numeric, i numeric, r double'
                        " precision, t varchar, f boolean, b bytea)")  # fmt: skip
    sink = PostgresSink(postgres_url(location.dsn), f"{schema}.k_copy")
    route = Route(tmp_path, source=SQLiteSource(source, "k", "id"), sink=sink)
    try:
        result = route.runtime().run(route.spec(path, strategy="full_refresh"))
        assert result.rows_loaded == len(_BINARY_VALUES)
    finally:
        route.real_store.close()
    got = admin(location, f'SELECT id, i, r, t, f, b FROM "{schema}".k_copy ORDER BY id')
    expected = [
        (i, n, float(r), t, None if f is None else bool(f), b.encode() if isinstance(b, str) else b)
        for i, n, r, t, f, b in _BINARY_VALUES
    ]
    assert [(*row[:5], None if row[5] is None else bytes(row[5])) for row in got] == expected
    assert got[2][2] == 0.30000000000000004 and got[1][1] == -(2**63)


# --- names: schemas, case, awkward identifiers ------------------------------------------------


def test_awkward_schema_table_and_column_names(tmp_path, location):
    """Quotes, dots, percent signs (psycopg's placeholders) and case, on every row path."""
    weird_schema = f'{location.schema}"x%s'
    quoted_schema = '"' + weird_schema.replace('"', '""') + '"'
    source = tmp_path / "source.db"
    with contextlib.closing(sqlite3.connect(source)) as db:
        db.execute(
            'CREATE TABLE src ("the id" INTEGER PRIMARY KEY, "part %(p)s" TEXT, "v""%" REAL)'
        )
        db.executemany("INSERT INTO src VALUES (?, ?, ?)", [(1, "a", 0.5), (2, 'b"%', None)])
        db.commit()
    url = postgres_url(location.dsn)
    tables = []
    try:
        for path in ROW_PATHS:
            tables.append(f'Odd.%(t)s "T" {path}')
            sink = PostgresSink(url, f'{quoted_schema}."Odd.%(t)s ""T"" {path}"')
            sqlite = SQLiteSource(str(source), "src", "part %(p)s")
            route = Route(tmp_path / path, source=sqlite, sink=sink)
            try:
                for run_id in ("run-1", "run-2"):  # the second replaces the first's rows
                    route.runtime().run(route.spec(path, run_id, strategy="full_refresh"))
            finally:
                route.real_store.close()
            assert sorted(sink.rows()) == [(1, "a", 0.5), (2, 'b"%', None)]
            assert [entry.rows for entry in sink.read_ledger()] == [2, 2]
        relations = admin(
            location,
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relkind = 'r'",
            [weird_schema],
        )
        dpone_tables = ["_dpone_ledger", "_dpone_fence"]
        assert sorted(row[0] for row in relations) == sorted([*tables, *dpone_tables])
    finally:
        admin(location, f"DROP SCHEMA IF EXISTS {quoted_schema} CASCADE")


def test_identity_names_host_port_database_and_the_table_case_sensitively(location):
    url = postgres_url(location.dsn)
    parts = psycopg.conninfo.conninfo_to_dict(location.dsn)
    other_login = f"postgresql://someone:CANARY@{parts['host']}:{parts['port']}/{parts['dbname']}"
    plain, public = PostgresSink(url, "orders"), PostgresSink(url, "public.orders")
    assert plain.identity() == public.identity()
    assert PostgresSink(other_login, "orders").identity() == plain.identity()
    assert PostgresSink(url, "Orders").identity() != plain.identity()
    assert "CANARY" not in repr(PostgresSink(other_login, "orders"))
    assert "CANARY" not in str(PostgresSink(other_login, "orders").identity())


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("pg_catalog.t", "keeps for itself"),
        ("pg_raw.t", "PostgreSQL reserves for its own schemas"),  # CREATE SCHEMA refuses it
        ("pg_temp_3.t", "PostgreSQL reserves for its own schemas"),
        ("_dpone_stage_t", "reserved"),
        ("a.b.c", "not a table name"),
        ("t" * 60, "longer than PostgreSQL keeps"),
    ],
)
def test_tables_it_cannot_write_are_refused_when_made(location, table, says):
    with pytest.raises(ConfigInvalid, match=says):
        PostgresSink(postgres_url(location.dsn), table)


def test_a_column_name_postgres_would_cut_is_refused_before_the_target(tmp_path, location):
    long = "c" * 64
    source = tmp_path / "source.db"
    with contextlib.closing(sqlite3.connect(source)) as db:
        db.execute(f'CREATE TABLE src (id INTEGER PRIMARY KEY, p TEXT, "{long}" TEXT)')
        db.execute("INSERT INTO src VALUES (1, 'a', 'x')")
        db.commit()
    sink = PostgresSink(postgres_url(location.dsn), f"{location.schema}.copy")
    route = Route(tmp_path / "route", source=SQLiteSource(str(source), "src", "p"), sink=sink)
    try:
        with pytest.raises(ConfigInvalid, match="longer than PostgreSQL keeps") as refused:
            route.runtime().run(route.spec("legacy"))
        assert refused.value.diagnostics["columns"] == [long]
        assert route.sink.target_calls == 0 and route.store.batches == []
    finally:
        route.real_store.close()


# --- privileges and errors: found before the target, never holding credentials ----------------


@pytest.fixture
def login(location):
    """A login of this test's own, with no privilege but what a test grants: (role, URL)."""
    role, password = f"dpone_{secrets.token_hex(6)}", secrets.token_hex(12)
    admin(location, f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
    admin(location, f'CREATE SCHEMA IF NOT EXISTS "{location.schema}"')
    parts = psycopg.conninfo.conninfo_to_dict(location.dsn)
    yield role, f"postgresql://{role}:{password}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    admin(location, f"DROP OWNED BY {role}")
    admin(location, f"DROP ROLE {role}")


def _assert_safe(error: BaseException, *secrets_: str) -> None:
    text = f"{error} {error!r} {getattr(error, 'diagnostics', '')}"
    for secret in secrets_:
        assert secret not in text
    assert error.__context__ is None and error.__cause__ is None


def test_a_login_that_may_not_write_is_refused_before_the_target(tmp_path, location, login):
    role, url = login
    schema = location.schema
    route = SinkRoute(tmp_path, location, "legacy", url=url)
    try:
        with pytest.raises(ConfigInvalid, match="may not write it") as refused:
            route.run()
        _assert_safe(refused.value, url.split("@")[0], "SELECT", "has_")
        assert route.sink.target_calls == 0 and route.store.batches == []
        admin(location, f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO {role}')
        assert route.run("run-2").rows_loaded == 120  # the same route, once it may
    finally:
        route.real_store.close()


def test_a_login_that_may_not_write_the_fence_is_refused_before_the_target(
    tmp_path, location, login
):
    """A load writes the ledger (INSERT) and raises the fence (an upsert: INSERT or UPDATE)
    in its transaction: a login without UPDATE on the fence failed inside the target call,
    and the route was blocked. Raising the fence as recovery does also needed CREATE on the
    schema though the fence existed (CREATE TABLE IF NOT EXISTS), and said "busy"."""
    role, url = login
    schema = location.schema
    admin(location, f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO {role}')
    route = SinkRoute(tmp_path, location, "legacy", url=url)
    fence = f'"{schema}"._dpone_fence'
    try:
        assert route.run().rows_loaded == 120  # makes the table, its ledger and its fence
        admin(location, f"ALTER TABLE {fence} OWNER TO CURRENT_USER")
        admin(location, f"GRANT SELECT, INSERT ON {fence} TO {role}")
        admin(location, f'REVOKE CREATE ON SCHEMA "{schema}" FROM {role}')
        route.add_rows(30)
        with pytest.raises(ConfigInvalid, match="and UPDATE on the fence"):
            route.run("run-2")
        assert route.sink.target_calls == 1  # the first run's only
        admin(location, f"GRANT UPDATE ON {fence} TO {role}")
        assert route.run("run-3").rows_loaded == 30
        epoch = admin(location, f"SELECT max(epoch) FROM {fence}")[0][0]
        assert route.sink.advance_fence(epoch + 1) == epoch + 1
    finally:
        route.real_store.close()


@pytest.mark.parametrize("path", ["legacy", "file-artifact"])
def test_a_privilege_missing_inside_the_load_rolls_back_and_blocks_nothing(
    tmp_path, location, login, path
):
    """A login with INSERT on an existing table but no CREATE on its schema, whose ledger
    does not exist yet: the load's CREATE of the ledger failed inside the target call, and
    the route was blocked (exit 3) for an operator, though the server had aborted the
    transaction. Now exit 2, nothing applied, and once granted the same route loads."""
    role, url = login
    schema = location.schema
    admin(location, f'GRANT USAGE ON SCHEMA "{schema}" TO {role}')
    admin(location, f'CREATE TABLE "{schema}".orders_copy (id bigint, region text,'
                    " amount double precision, updated_at bigint)")  # fmt: skip
    admin(location, f'GRANT SELECT, INSERT ON "{schema}".orders_copy TO {role}')
    route = SinkRoute(tmp_path, location, path, url=url)
    try:
        for run_id in ("run-1", "run-2"):  # the second is not blocked by the first
            with pytest.raises(TargetPrivilegeRefused, match="rolled back") as refused:
                route.run(run_id)
            assert exit_code_for(refused.value) == 2 and refused.value.applied is False
            shown = f"{refused.value} {refused.value.diagnostics}"  # the chain: not shown
            assert "CREATE TABLE" not in shown and role not in shown
            assert refused.value.__cause__ is None and refused.value.__suppress_context__
        assert admin(location, f'SELECT count(*) FROM "{schema}".orders_copy') == [(0,)]
        admin(location, f'GRANT CREATE ON SCHEMA "{schema}" TO {role}')
        assert route.run("run-3").rows_loaded == 120
    finally:
        route.real_store.close()


@pytest.mark.parametrize(
    ("name", "made"),
    [("_dpone_ledger", "VIEW {} AS SELECT 1 AS x"), ("_dpone_fence", "SEQUENCE {}")],
)
def test_an_object_named_as_dpones_own_table_is_refused_before_the_target(
    tmp_path, location, name, made
):
    """A view or a sequence in the target's schema with the ledger's or the fence's name
    failed every load inside the target call, "a retry may succeed"; exit 2 before it now."""
    admin(location, f'CREATE SCHEMA IF NOT EXISTS "{location.schema}"')
    admin(location, "CREATE " + made.format(f'"{location.schema}".{name}'))
    route = SinkRoute(tmp_path, location, "staged")
    try:
        with pytest.raises(ConfigInvalid, match="drop or rename it") as refused:
            route.run()
        assert refused.value.diagnostics["name"] == name
        assert route.sink.target_calls == 0
    finally:
        route.real_store.close()


def test_a_login_whose_sessions_are_read_only_by_default_still_loads(tmp_path, location, login):
    """``default_transaction_read_only`` on for the login: a load's transaction says READ
    WRITE, as psycopg said it (a one-message BEGIN said neither, and every run failed)."""
    role, url = login
    admin(location, f'GRANT USAGE, CREATE ON SCHEMA "{location.schema}" TO {role}')
    admin(location, f"ALTER ROLE {role} SET default_transaction_read_only = on")
    route = SinkRoute(tmp_path, location, "staged", url=url)
    try:
        assert route.run().rows_loaded == 120
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
    finally:
        route.real_store.close()


def test_a_statement_failing_before_the_commit_rolls_back_and_blocks_nothing(
    tmp_path, location, login
):
    """A role's statement_timeout cancelled the load's wait for its ledger (locked elsewhere):
    the driver's QueryCanceled blocked the route (exit 1, then 3), though no COMMIT had been
    sent, so the server could not have committed. Now ``TargetRolledBack``: nothing applied,
    not blocked; once the lock is gone the same route loads what is new, exactly once."""
    role, url = login
    schema = location.schema
    admin(location, f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO {role}')
    admin(location, f"ALTER ROLE {role} SET statement_timeout = '1s'")
    route = SinkRoute(tmp_path, location, "legacy", url=url)
    try:
        assert route.run().rows_loaded == 120
        route.add_rows(30)
        with psycopg.connect(location.dsn) as holder:  # its transaction holds the lock
            holder.execute(f'LOCK TABLE "{schema}"._dpone_ledger IN EXCLUSIVE MODE')
            with pytest.raises(TargetRolledBack, match="before its commit") as failed:
                route.run("run-2")
        assert failed.value.applied is False and exit_code_for(failed.value) == 1
        assert failed.value.diagnostics["cause"] == "SQLSTATE 57014"
        assert route.sink.target_calls == 2
        assert route.run("run-3").rows_loaded == 30  # not blocked
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
    finally:
        route.real_store.close()


@pytest.mark.parametrize("strategy", ["full_refresh", "merge"])
def test_row_level_security_on_the_target_is_refused_before_the_target(
    tmp_path, location, login, strategy
):
    """Policies that hide rows from the login: a refresh's DELETE (and a merge's) left the
    rows they hide, and the load added them again (exit 0, rows twice); COPY refused the
    table inside the target call, blocking the route. Refused before the target now (exit
    2), and loaded exactly once the policies no longer apply."""
    role, url = login
    schema, table = location.schema, f'"{location.schema}".orders_copy'
    admin(location, f'GRANT USAGE, CREATE ON SCHEMA "{schema}" TO {role}')
    admin(location, f"CREATE TABLE {table} (id bigint PRIMARY KEY, region text, amount"
                    " double precision, updated_at bigint)")  # fmt: skip
    admin(location, f"GRANT SELECT, INSERT, UPDATE, DELETE ON {table} TO {role}")
    admin(location, f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY")
    admin(location, f"CREATE POLICY hidden ON {table} TO {role} USING (id <= 60)"
                    " WITH CHECK (true)")  # fmt: skip
    route = SinkRoute(tmp_path, location, "staged", url=url)
    options = {"strategy": strategy}  # a merge on the source's primary key, id
    try:
        with pytest.raises(TargetRowsMismatch, match="row-level security") as refused:
            route.run(**options)
        assert refused.value.applied is False and exit_code_for(refused.value) == 2
        assert route.sink.target_calls == 0
        admin(location, f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY")
        assert route.run("run-2", **options).rows_loaded == 120
        assert route.run("run-3", **options).rows_loaded in (0, 120)
        assert sorted(route.target_ids()) == route.source_ids()
    finally:
        route.real_store.close()


def test_lazy_plan_refuses_a_source_its_login_may_not_read(tmp_path, location, login):
    role, url = login
    route = SinkRoute(tmp_path, location, "lazy-plan", url=url)  # the source as the superuser
    admin(location, f'GRANT USAGE, CREATE ON SCHEMA "{location.schema}" TO {role}')
    superuser = postgres_url(location.dsn)
    route.source = PostgresSource(superuser, route.source.table, "region", "updated_at")
    try:
        with pytest.raises(ConfigInvalid, match="which its login may not read"):
            route.run()
        assert route.sink.target_calls == 0 and route.store.batches == []
        admin(location, f'GRANT SELECT ON "{location.schema}".orders TO {role}')
        assert route.run("run-2").rows_loaded == 120
    finally:
        route.real_store.close()


def test_a_wrong_password_or_no_server_is_target_unavailable_without_credentials(location):
    """Both ``TargetUnavailable``'s code; a wrong password is its exit-2 subclass."""
    url = postgres_url(location.dsn).replace("@", "x-CANARY-PW@", 1)
    table = f"{location.schema}.orders_copy"
    nowhere = "postgresql://u:CANARY-PW@127.0.0.1:1/x"
    refused = {"failure": "login_refused", "sqlstate": "28P01"}
    for sink, failure in ((PostgresSink(url, table), refused),
                          (PostgresSink(nowhere, table), {"failure": "unreachable"})):  # fmt: skip
        for call in (sink.check_target, sink.read_ledger, sink.row_count, sink.is_empty):
            with pytest.raises(TargetUnavailable) as caught:
                call()
            _assert_safe(caught.value, "CANARY", "postgresql://", "FATAL", "127.0.0.1")
            assert caught.value.diagnostics == {"table": table, **failure}
            assert isinstance(caught.value, TargetAccessRefused) is (failure == refused)


def test_dsn_forms(location, monkeypatch):
    with pytest.raises(ConfigInvalid, match="PostgreSQL target as a postgresql:// URL") as caught:
        PostgresSink("host=127.0.0.1 dbname=x user=u password=CANARY-PW", "t")
    _assert_safe(caught.value, "CANARY")
    with pytest.raises(ConfigInvalid, match="DPONE_TEST_UNSET_TARGET"):
        PostgresSink("env:DPONE_TEST_UNSET_TARGET", "t")
    monkeypatch.setenv("DPONE_TEST_TARGET", postgres_url(location.dsn))
    from_env = PostgresSink("env:DPONE_TEST_TARGET", f"{location.schema}.t")
    direct = PostgresSink(postgres_url(location.dsn), f"{location.schema}.t")
    assert from_env.identity() == direct.identity()
    from_env.check_target()  # the server answers; the schema does not exist yet: it may create it


def test_a_failing_read_is_target_unavailable_without_sql_or_driver_text(location):
    schema = location.schema
    admin(location, f'CREATE SCHEMA "{schema}"')
    admin(location, f'CREATE VIEW "{schema}".orders_copy AS SELECT 1 / 0 AS broken')
    sink = PostgresSink(postgres_url(location.dsn), f"{schema}.orders_copy")
    with pytest.raises(TargetUnavailable) as caught:
        sink.rows()
    _assert_safe(caught.value, "division", "SELECT", 'orders_copy"')


# --- the route file ---------------------------------------------------------------------------


def test_a_route_file_with_a_postgres_target_runs(tmp_path, location):
    from helpers.cli import run_cli
    from helpers.routes import write_route

    route_file = write_route(tmp_path, rows=40, path="file-artifact", kind="postgres",
                             target="unused", table=f"{location.schema}.orders_copy")  # fmt: skip
    text = route_file.read_text().replace('path = "unused"', 'dsn = "env:PG_TARGET_FOR_TEST"')
    route_file.write_text(text)
    env = {"PG_TARGET_FOR_TEST": postgres_url(location.dsn)}
    done = run_cli("run", route_file, "--quiet", env=env)
    assert done.returncode == 0, done.stderr
    sink = PostgresSink(env["PG_TARGET_FOR_TEST"], f"{location.schema}.orders_copy")
    assert sink.row_count() == 40 and len(sink.read_ledger()) == 1
    assert env["PG_TARGET_FOR_TEST"] not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("target", "key", "says"),
    [
        ({"path": "target.db"}, "target.path", "is not used by target.kind = 'postgres'"),
        ({}, "target.dsn", "is required"),
        ({"dsn": "env:DPONE_TEST_UNSET_TARGET_DSN"}, "target.dsn", "is not set"),
    ],
)
def test_a_postgres_target_needs_its_dsn_alone(target, key, says):
    from dpone_native_transfer.config import route_config_from_mapping

    route = {
        "source": {"path": "source.db", "table": "orders", "partition_column": "region"},
        "target": {"kind": "postgres", "table": "orders_copy", **target},
        "transfer": {"strategy": "incremental_append", "path": "legacy"},
        "store": {"path": "checkpoints.db"},
    }
    with pytest.raises(ConfigInvalid, match=says) as refused:
        route_config_from_mapping(route)
    assert refused.value.diagnostics["key"] == key


def test_a_run_connects_once_for_its_checks_and_its_target_call(route, monkeypatch):
    """The attempt's calls (the checks, the ledger, the fence, the target call) reuse the
    connections the sink keeps for the attempt (``holding_connection``): one, or two where
    a call runs inside another (lazy-plan), all closed when the attempt ends. Each connect
    costs a run 0.02-0.03 s (docs/connectors.md, "Merge")."""
    from dpone_native_transfer.connectors import postgres_sink

    handed: list[Any] = []
    begin = postgres_sink.postgres_begin

    def counted(*args: Any, **kwargs: Any) -> Any:
        handed.append(begin(*args, **kwargs))
        return handed[-1]

    monkeypatch.setattr(postgres_sink, "postgres_begin", counted)
    route.run("run-1")
    opened = {id(conn): conn for conn in handed}.values()
    assert len(handed) >= 4 and len(opened) <= 2, (len(handed), len(opened))
    assert all(conn.closed for conn in opened)
    assert route.target_rows() == route.source_rows()


# --- days beyond Python's years ------------------------------------------------------------

_CARRIERS_BY_TYPE = {
    "date": postgres_date,
    "timestamp": postgres_timestamp,
    "timestamptz": postgres_timestamptz,
}


@st.composite
def postgres_day_texts(draw) -> str:
    """Texts of PostgreSQL's own form around its range's ends, leap days and BC years."""
    year = draw(st.integers(0, 6_000_000) | st.sampled_from([0, 1, 44, 45, 4713, 4714, 10000]))
    year_text = f"{year:04d}" if year < 294_280 else str(year)
    month, day = draw(st.integers(0, 13)), draw(st.integers(0, 32))
    text = f"{year_text}-{month:02d}-{day:02d}"
    time = draw(st.sampled_from(["", "", " 10:00:00", " 23:59:59.999999", " 24:00:00", " 7:00"]))
    offset = draw(st.sampled_from(["", "+00", "Z", "+00:00", "+05"])) if time else ""
    return text + time + offset + draw(st.sampled_from(["", " BC"]))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=postgres_day_texts(), pg_type=st.sampled_from(sorted(_CARRIERS_BY_TYPE)))
@example(text="4714-11-24 BC", pg_type="date")
@example(text="4714-11-23 BC", pg_type="date")
@example(text="5874897-12-31", pg_type="date")
@example(text="5874898-01-01", pg_type="date")
@example(text="0045-02-29 BC", pg_type="date")
@example(text="0044-02-29 BC", pg_type="date")
@example(text="11900-02-29", pg_type="date")
@example(text="12000-02-29", pg_type="date")
@example(text="4714-11-23 23:59:59 BC", pg_type="timestamp")
@example(text="294276-12-31 23:59:59.999999", pg_type="timestamp")
@example(text="294277-01-01 00:00:00", pg_type="timestamp")
@example(text="294276-12-31 23:59:59.999999+00", pg_type="timestamptz")
@example(text="0001-01-01 00:00:00+00 BC", pg_type="timestamptz")
def test_postgres_carriers_take_the_days_postgresql_holds_and_keep_each_one(
    postgres_dsn, text, pg_type
):
    """A day beyond Python's years (BC, year 10000 on) is carried when PostgreSQL holds it
    as the same value, and refused when PostgreSQL would not read it, or read it as another
    value (a date's time dropped): PostgreSQL's own parser is the judge. Refused though
    PostgreSQL reads them: hour 24, an hour of one digit, an offset other than zero, and a
    timestamp without its time, beyond Python's years."""
    carry = _CARRIERS_BY_TYPE[pg_type]
    try:
        carried = carry(text)
    except ValueError:
        carried = None
    with contextlib.closing(psycopg.connect(postgres_dsn, autocommit=True)) as conn:
        conn.execute("SET TimeZone = 'UTC'")

        def held(value: str, read_as: str = pg_type) -> str | None:
            try:
                return conn.execute(f"SELECT (%s::{read_as})::text", [value]).fetchone()[0]
            except psycopg.errors.DataError:
                return None

        # a text with an offset is an instant: into a timestamp, its wall time in UTC
        offset = pg_type == "timestamp" and any(z in text for z in ("+00", "Z", "+05"))
        as_postgres_reads_it = held(text, "timestamptz AT TIME ZONE 'UTC'" if offset else pg_type)
        if carried is not None:
            assert held(carried) == as_postgres_reads_it is not None
            if pg_type == "date":
                assert ":" not in text  # PostgreSQL would drop the time
        elif as_postgres_reads_it is not None:  # refused only outside the forms carried
            a_form_not_carried = (":" in text) == (pg_type == "date")  # a date's time, or none
            assert a_form_not_carried or any(odd in text for odd in (" 24:", " 7:", "+05"))
