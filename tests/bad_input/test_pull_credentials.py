"""A real PostgreSQL login's password (``canary-<random>``) reaches chDB's ``postgresql()`` pull,
and nowhere else: runs that succeed, and runs with failures injected at the pull (a table chDB
cannot find, the login's privilege revoked, the server stopped), on a path whose pull is before
the target call (file-artifact: the pull is declined, dpone reads) and on lazy-plan (the pull
is the target call); then stdout, stderr, log records, events, the error and its chain, and
the bytes of every file the run left (store, ledger, chDB's folder, work files) are searched,
and the target's ledger and the store's tables are read back."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import sqlite3
import time
import traceback
from pathlib import Path

import attrs
import psycopg
import pytest
from helpers.cli import run_cli
from helpers.postgres_server import _throwaway_server

from dpone_native_transfer.application import new_run_id, transfer
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.connectors.clickhouse.sink import ClickHouseSink
from dpone_native_transfer.connectors.postgres import PostgresSource

ROUTE = """\
[source]
kind = "postgres"
dsn = "env:CANARY_DSN"
table = "{schema}.src"
partition_column = "p"
[target]
kind = "clickhouse"
path = "chdata"
table = "copy"
[transfer]
strategy = "full_refresh"
path = "{path}"
[store]
path = "checkpoints.db"
"""

FAULTS = ["none", "missing table", "permission revoked", "server stopped"]


def login(admin_dsn: str, schema: str) -> tuple[str, str]:
    """A role with a ``canary-<random>`` password that may read ``schema.src``; its DSN."""
    password, role = f"canary-{secrets.token_hex(8)}", f"etl_{secrets.token_hex(4)}"
    with contextlib.closing(psycopg.connect(admin_dsn, autocommit=True)) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
        conn.execute(f"CREATE TABLE {schema}.src (id bigint, p integer, t text, n numeric(12,2))")
        rows = "SELECT g, g % 3, 'v' || g, g FROM generate_series(1, 50) g"
        conn.execute(f"INSERT INTO {schema}.src {rows}")
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        conn.execute(f"GRANT SELECT ON {schema}.src TO {role}")
    parts = psycopg.conninfo.conninfo_to_dict(admin_dsn)
    url = f"postgresql://{role}:{password}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    return password, url


def inject(fault: str, path: str, admin_dsn: str, role_url: str, schema: str, monkeypatch) -> None:
    """Make chDB's read fail: at the pull before the target (file-artifact), or inside the
    target call (lazy-plan's ``load_plan``)."""
    role = psycopg.conninfo.conninfo_to_dict(role_url)["user"]
    if fault == "missing table":
        real_login = PostgresSource.engine_login

        def elsewhere(self):
            found = real_login(self)
            return None if found is None else attrs.evolve(found, table="no_such_table")

        monkeypatch.setattr(PostgresSource, "engine_login", elsewhere)
        return
    if fault == "none":
        return
    name = "load_plan" if path == "lazy-plan" else "pull_load_files"
    real = getattr(ClickHouseSink, name)

    def failing(self, *args, **kwargs):
        with contextlib.closing(psycopg.connect(admin_dsn, autocommit=True)) as conn:
            if fault == "permission revoked":
                conn.execute(f"REVOKE SELECT ON {schema}.src FROM {role}")
            else:
                data = conn.execute("SHOW data_directory").fetchone()[0]
                pid = int(Path(data, "postmaster.pid").read_text().split()[0])
                os.kill(pid, signal.SIGINT)  # fast shutdown: every session ends
                with contextlib.suppress(OSError):
                    for _ in range(100):  # until it is gone
                        os.kill(pid, 0)
                        time.sleep(0.1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(ClickHouseSink, name, failing)


def texts_of(folder: Path) -> list[tuple[str, bytes]]:
    """The bytes of every file under ``folder``, and the store's tables as text."""
    found = [(str(p), p.read_bytes()) for p in folder.rglob("*") if p.is_file()]
    store = folder / "checkpoints.db"
    if store.exists():
        with contextlib.closing(sqlite3.connect(store)) as conn:
            for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
                rows = conn.execute(f'SELECT * FROM "{table}"').fetchall()
                found.append((f"store table {table}", repr(rows).encode()))
    return found


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("path", ["file-artifact", "lazy-plan"])
def test_the_password_chdb_reads_with_is_in_no_output_or_stored_record(
    tmp_path, monkeypatch, caplog, postgres_dsn, path, fault
):
    """The canary is nowhere: not in the CLI's output, a log record, an event, the error (its
    message, diagnostics, chained errors and traceback), the store, the target's ledger, nor
    any file of the run's folder, chDB's data folder included. And the run's outcome is a
    real one: rows loaded exactly, or a stable error code."""
    with contextlib.ExitStack() as stack:  # a server of its own, for the one it stops
        own = fault == "server stopped"
        admin = stack.enter_context(_throwaway_server()) if own else postgres_dsn
        schema = f"canary_{secrets.token_hex(4)}"
        password, url = login(admin, schema)
        inject(fault, path, admin, url, schema, monkeypatch)
        caplog.set_level(logging.DEBUG)
        folder = tmp_path / "run"
        folder.mkdir()
        (folder / "route.toml").write_text(ROUTE.format(path=path, schema=schema), encoding="utf-8")
        monkeypatch.chdir(folder)
        monkeypatch.setenv("CANARY_DSN", url)
        outputs: list[tuple[str, str]] = []
        events: list = []
        try:
            result, _ = transfer(
                load_route_config(folder / "route.toml"), new_run_id(), events=events.append
            )
        except Exception as error:
            chain = "".join(traceback.format_exception(error))
            outputs += [("error", repr(error)), ("traceback", chain)]
            outputs.append(("diagnostics", repr(getattr(error, "diagnostics", None))))
            code = getattr(error, "code", None)
            assert code is not None, chain  # a stable code, never a bare driver error
        else:
            assert result.rows_loaded == 50
            code = None
        if fault == "none" or (fault == "missing table" and path == "file-artifact"):
            assert code is None  # declined pull: dpone read the rows
        cli = run_cli("run", folder / "route.toml", env={"CANARY_DSN": url})
        outputs += [("cli stdout", cli.stdout), ("cli stderr", cli.stderr)]
        outputs += [("event", repr(event)) for event in events]
        outputs += [
            ("log", record.getMessage() + repr(record.__dict__)) for record in caplog.records
        ]
        if (folder / "chdata").exists():
            with contextlib.suppress(Exception):
                ledger = ClickHouseSink(str(folder / "chdata"), "copy").read_ledger(partitions=True)
                outputs.append(("ledger", repr(ledger)))
        for where, text in outputs:
            assert password not in text, where
        for where, data in texts_of(tmp_path):
            assert password.encode() not in data, where
