"""PostgreSQL connections kept for the next call of a run (issue 48).

A route connected to PostgreSQL about ten times (each source read and each target
transaction opened and closed its own connection, some 5 ms each). While a run holds
connections (``drivers.holding_connections``), a connection given back is reset to a new
one's state and handed to the next call on its DSN; the last holding block closes them.
Real PostgreSQL throughout; the only wrapper counts the real driver's ``connect`` calls.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.pipelines import (
    build_tables,
    copy_to_postgres,
    duckdb_ids,
    postgres_ids,
    sqlite_ids,
    write_pipeline,
)
from helpers.postgres_server import postgres_url

from dpone_native_transfer.connectors.postgres import PostgresSource
from dpone_native_transfer.drivers import (
    holding_connections,
    postgres_begin,
    postgres_release,
)
from dpone_native_transfer.errors import TargetUnavailable
from dpone_native_transfer.pipeline import load_pipeline
from dpone_native_transfer.pipeline_run import run_tables

TABLES, ROWS = 8, 200


@pytest.fixture
def connects(monkeypatch) -> list[Any]:
    """Every connection the real ``psycopg.connect`` made, in order."""
    made: list[Any] = []
    real = psycopg.connect

    def counting(*args: Any, **kwargs: Any) -> Any:
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(psycopg, "connect", counting)
    return made


def _failed(failure: Any) -> TargetUnavailable:
    return TargetUnavailable("test connection failed")


def _begin(dsn: str, begin: str = "BEGIN") -> Any:
    """A sink's transaction start: ``BEGIN`` and the session's settings in one round trip."""
    return postgres_begin(psycopg, dsn, begin, "SELECT 1", what="test", failed=_failed)


@pytest.mark.parametrize("source_kind", ["sqlite", "postgres"])
def test_a_pipeline_into_postgres_connects_a_few_times_not_per_call(
    tmp_path: Path, postgres_schema, connects, source_kind
):
    dsn, schema = postgres_schema
    url = postgres_url(dsn)
    lite = tmp_path / "shop.db"
    names = build_tables(lite, TABLES, ROWS)
    if source_kind == "postgres":
        copy_to_postgres(lite, dsn, schema, names)
        source, tables, path = {"kind": "postgres", "dsn": url}, f"{schema}.t*", "lazy-plan"
    else:
        source, tables, path = {"path": str(lite)}, "t*", "staged"
    target_schema = f"{schema}_target"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{target_schema}"')
    connects.clear()
    file = write_pipeline(
        tmp_path / "pipeline.toml",
        source=source,
        target={"kind": "postgres", "dsn": url, "table_prefix": f"{target_schema}."},
        store=str(tmp_path / "checkpoints.db"),
        tables=tables,
        defaults={"strategy": "full_refresh", "path": path},
    )
    for run_id in ("run-1", "run-2"):  # the second replaces every table: DDL on kept sessions
        result = run_tables(load_pipeline(file).tables, run_id, jobs=2)
        assert result.exit_code == 0, [(r.table, r.error) for r in result.tables]
    # two runs of 8 tables made about 160 connections; kept, a few per run and job
    assert len(connects) <= 2 * 8
    assert all(conn.closed for conn in connects)  # the run's end closed every kept one
    for run in result.tables:
        name = run.table.rpartition(".")[2]
        loaded = postgres_ids(dsn, f"{target_schema}.{run.target_table.rpartition('.')[2]}")
        if source_kind == "postgres":
            assert loaded == postgres_ids(dsn, f"{schema}.{name}")
        else:
            assert loaded == sqlite_ids(lite, name)
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA "{target_schema}" CASCADE')


def test_a_pipeline_from_postgres_into_duckdb_reads_in_bulk_on_kept_connections(
    tmp_path: Path, postgres_schema, connects
):
    """The bulk reads (``auto``: legacy from the source's COPY into DuckDB) are given back
    and kept like every other read: a few connections per run, not one per table; one
    table's bulk read left mid-COPY (a value Arrow cannot hold: the read gives up and the
    rows are read) is closed, not kept. Every table lands exactly, twice."""
    dsn, schema = postgres_schema
    lite = tmp_path / "shop.db"
    names = build_tables(lite, TABLES, ROWS)
    copy_to_postgres(lite, dsn, schema, names)
    with psycopg.connect(dsn, autocommit=True) as admin:  # t01: a row the CSV cannot convert
        admin.execute(f'CREATE TABLE "{schema}".odd (id bigint PRIMARY KEY, at timestamp)')
        admin.execute(
            f"INSERT INTO \"{schema}\".odd SELECT i, CASE WHEN i = 150000 THEN 'infinity'"
            " ELSE timestamp '2026-01-01' END FROM generate_series(1, 200000) AS i"
        )
    connects.clear()
    file = write_pipeline(
        tmp_path / "pipeline.toml",
        source={"kind": "postgres", "dsn": postgres_url(dsn)},
        target={"kind": "duckdb", "path": str(tmp_path / "target.duckdb")},
        store=str(tmp_path / "checkpoints.db"),
        tables=[f"{schema}.t*", f"{schema}.odd"],
        defaults={"strategy": "full_refresh", "path": "auto"},
    )
    for run_id in ("run-1", "run-2"):
        result = run_tables(load_pipeline(file).tables, run_id, jobs=2)
        assert result.exit_code == 0, [(r.table, r.error) for r in result.tables]
        assert {str(run.path) for run in result.tables} == {"legacy"}
    # 9 tables' bulk reads connected 9 times per run before; kept, a few per run and job
    assert len(connects) <= 2 * 6
    assert all(conn.closed for conn in connects)
    assert len(result.tables) == len(names) + 1
    for run in result.tables:
        landed = duckdb_ids(tmp_path / "target.duckdb", run.target_table)
        assert landed == postgres_ids(dsn, run.table) and sum(landed.values()) == run.rows_loaded
    assert sum(run.rows_loaded for run in result.tables) == TABLES * ROWS + 200_000


def test_a_kept_connection_is_rolled_back_when_given_back_and_closed_at_the_end(
    postgres_schema, connects
):
    dsn, schema = postgres_schema
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        admin.execute(f'CREATE TABLE "{schema}".kept (n int)')
    connects.clear()
    with holding_connections():
        first = _begin(dsn, "BEGIN READ WRITE")
        first.execute(f'INSERT INTO "{schema}".kept VALUES (1)')
        postgres_release(first, dsn)  # an uncommitted insert: rolled back, as a close would
        again = _begin(dsn, "BEGIN READ WRITE")
        assert again is first and len(connects) == 1
        postgres_release(again, dsn)
        assert not first.closed
    assert first.closed  # the last holding block closed it
    with psycopg.connect(dsn) as check:
        assert check.execute(f'SELECT count(*) FROM "{schema}".kept').fetchone()[0] == 0


def test_a_connection_in_a_failed_copy_or_outside_a_run_is_closed(postgres_schema, connects):
    dsn, _ = postgres_schema
    outside = _begin(dsn)
    postgres_release(outside, dsn)  # no run holds connections: closed, never kept
    assert outside.closed
    with holding_connections():
        copying = _begin(dsn)
        statement = "COPY (SELECT generate_series(1, 100000)) TO STDOUT"
        with contextlib.suppress(psycopg.Error), copying.cursor().copy(statement) as copy:
            next(iter(copy))  # mid-COPY: nothing can reset it
            postgres_release(copying, dsn)
        assert copying.closed
        fresh = _begin(dsn)
        assert fresh is not copying
        postgres_release(fresh, dsn)


def test_a_source_read_on_a_kept_connection_finds_a_new_sessions_state(postgres_schema, connects):
    """A source's read begins on a kept connection as a target's transaction does
    (``postgres_begin``): a ``search_path`` another call left on the session would find a
    table of the same name in another schema; the DSN's own path holds again."""
    dsn, schema = postgres_schema
    url = postgres_url(dsn)
    given = f"{url}{'&' if '?' in url else '?'}options=-c%20search_path%3D{schema}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        admin.execute(f'CREATE TABLE "{schema}".items (id bigint, region text)')
        admin.execute(f'CREATE SCHEMA "{schema}_decoy"')
        admin.execute(f'CREATE TABLE "{schema}_decoy".items (decoy bigint)')
    connects.clear()
    with holding_connections():
        first = _begin(given)
        first.execute(f'SET search_path = "{schema}_decoy"')
        first.commit()
        postgres_release(first, given)
        described = PostgresSource(given, "items", "region").describe()
        assert [column.name for column in described.columns] == ["id", "region"]
        assert len(connects) == 1  # the read took the kept connection
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'DROP SCHEMA "{schema}_decoy" CASCADE')


def test_a_transaction_begun_on_a_kept_connection_finds_a_new_sessions_state(
    postgres_schema, connects
):
    """``postgres_begin`` resets a kept session inside the transaction it begins (``DISCARD
    ALL`` may not run in one): settings, temporary tables, prepared statements, cursors and
    session locks a call left are gone; the DSN's own settings stay; READ ONLY holds."""
    dsn, schema = postgres_schema
    given = f"{dsn} options='-c search_path={schema}'"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f'CREATE SCHEMA "{schema}"')
        admin.execute(f'CREATE TABLE "{schema}".kept_begin (n int)')
    connects.clear()
    with holding_connections():
        first = _begin(given)
        for leftover in (
            "SET statement_timeout = '1s'",
            "SET search_path = public",
            "CREATE TEMP TABLE scratch (n int)",
            "PREPARE leftover AS SELECT 1",
            "DECLARE leftover CURSOR WITH HOLD FOR SELECT 1",
            "SELECT pg_advisory_lock(4242)",
        ):
            first.execute(leftover)
        first.commit()
        postgres_release(first, given)
        again = _begin(given, "BEGIN READ ONLY")
        assert again is first and len(connects) == 1
        assert again.execute("SHOW statement_timeout").fetchone()[0] == "0"
        assert again.execute("SHOW search_path").fetchone()[0] == schema
        assert again.execute("SELECT to_regclass('pg_temp.scratch')").fetchone()[0] is None
        assert again.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0] == 0
        assert again.execute("SELECT count(*) FROM pg_cursors").fetchone()[0] == 0
        locks = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = %s"
        assert again.execute(locks, (again.info.backend_pid,)).fetchone()[0] == 0
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction):
            again.execute(f'INSERT INTO "{schema}".kept_begin VALUES (1)')
        postgres_release(again, given)


def test_a_transaction_begun_on_a_connection_the_server_dropped_goes_on_a_new_one(
    postgres_schema, connects
):
    dsn, _ = postgres_schema
    with holding_connections():
        first = _begin(dsn)
        pid = first.info.backend_pid
        first.commit()
        postgres_release(first, dsn)
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        connects.clear()
        again = _begin(dsn)
        assert again is not first and first.closed and len(connects) == 1
        assert again.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        again.rollback()
        postgres_release(again, dsn)
