"""lazy-plan into PostgreSQL from a table of another database of the same server, through the
``dblink`` extension (``postgres_sink._Dblink``), on the real server: every value as the row
paths land it, refused before the target without dblink, and the source login's password
(``canary-<random>``) in no output, stored record or server log, whatever fails."""

from __future__ import annotations

import contextlib
import logging
import secrets
import sys
import traceback
from pathlib import Path

import psycopg
import pytest
from connectors.test_postgres_bulk import BULK_COLUMNS, make_table, no_rows_read, postgres_texts
from helpers.cli import run_cli
from helpers.postgres_server import PostgresLocation

from dpone_native_transfer.application import new_run_id, transfer
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.connectors.postgres import PostgresSource
from dpone_native_transfer.connectors.postgres_sink import PostgresSink
from dpone_native_transfer.errors import ConfigInvalid, TargetRolledBack

ROUTE = """\
[source]
kind = "postgres"
dsn = "env:SOURCE_DSN"
table = "{table}"
partition_column = "p"
[target]
kind = "postgres"
dsn = "env:TARGET_DSN"
table = "{target}"
[transfer]
strategy = "full_refresh"
path = "{path}"
[store]
path = "checkpoints.db"
"""


class Databases:
    """A source and a target database of the session's server, a role of their own (its
    password a canary) that owns the target and may read the source; dropped after."""

    def __init__(self, admin: str, *, dblink: bool) -> None:
        token = secrets.token_hex(4)
        self.admin, self.role = admin, f"etl_{token}"
        self.password = f"canary-{secrets.token_hex(8)}"
        self.source_db, self.target_db = f"src_{token}", f"tgt_{token}"
        with contextlib.closing(psycopg.connect(admin, autocommit=True)) as conn:
            conn.execute(f"CREATE ROLE {self.role} LOGIN PASSWORD '{self.password}'")
            conn.execute(f"CREATE DATABASE {self.source_db}")
            conn.execute(f"CREATE DATABASE {self.target_db} OWNER {self.role}")
        if dblink:
            with contextlib.closing(
                psycopg.connect(self.dsn(self.target_db), autocommit=True)
            ) as c:
                c.execute("CREATE EXTENSION dblink")

    def dsn(self, database: str, *, role: bool = False) -> str:
        parts = psycopg.conninfo.conninfo_to_dict(self.admin)
        parts["dbname"] = database
        if role:
            return f"postgresql://{self.role}:{self.password}@{parts['host']}:{parts['port']}/{database}"
        return psycopg.conninfo.make_conninfo(**parts)

    def source_table(self, columns) -> str:
        location = PostgresLocation(self.dsn(self.source_db), "s")
        table = make_table(location, columns, index=False)
        with contextlib.closing(psycopg.connect(location.dsn, autocommit=True)) as conn:
            conn.execute(f"GRANT USAGE ON SCHEMA s TO {self.role}")
            conn.execute(f"GRANT SELECT ON s.src TO {self.role}")
        return table

    def drop(self) -> None:
        with contextlib.closing(psycopg.connect(self.admin, autocommit=True)) as conn:
            for database in (self.source_db, self.target_db):
                conn.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
            conn.execute(f"DROP ROLE IF EXISTS {self.role}")


@contextlib.contextmanager
def databases(admin: str, *, dblink: bool = True):
    made = Databases(admin, dblink=dblink)
    try:
        yield made
    finally:
        made.drop()


def run(folder: Path, monkeypatch, dbs: Databases, table: str, target: str, path: str):
    folder.mkdir(parents=True, exist_ok=True)
    text = ROUTE.format(table=table, target=target, path=path)
    (folder / "route.toml").write_text(text, encoding="utf-8")
    monkeypatch.setenv("SOURCE_DSN", dbs.dsn(dbs.source_db, role=True))
    monkeypatch.setenv("TARGET_DSN", dbs.dsn(dbs.target_db, role=True))
    monkeypatch.chdir(folder)
    result, _ = transfer(load_route_config(folder / "route.toml"), new_run_id())
    return result


def test_lazy_plan_from_another_database_lands_every_value_as_the_row_paths_do(
    tmp_path, postgres_dsn, monkeypatch
):
    """The target server reads the source database itself through dblink (Python reads no
    row), in one snapshot, and each value lands as legacy's rows land it."""
    with databases(postgres_dsn) as dbs:
        table = dbs.source_table(BULK_COLUMNS)
        names = ["id", "p", *(c[0] for c in BULK_COLUMNS)]
        with monkeypatch.context() as patched:
            patched.setattr(PostgresSource, "read", no_rows_read)
            patched.setattr(PostgresSource, "read_partitions", no_rows_read)
            pulled = run(tmp_path / "lazy", monkeypatch, dbs, table, "public.pulled", "lazy-plan")
        assert pulled.rows_loaded == 3
        monkeypatch.setattr(PostgresSource, "bulk", lambda self: None)
        rows = run(tmp_path / "rows", monkeypatch, dbs, table, "public.carried", "legacy")
        assert rows.rows_loaded == 3
        target = PostgresLocation(dbs.dsn(dbs.target_db), "public")
        got = postgres_texts(target, "pulled", names)
        assert got == postgres_texts(target, "carried", names)
        by_name = dict(zip(names, zip(*got, strict=True), strict=True))
        assert by_name["n"] == ("12345678901234567890.123456789", "NaN", None)
        assert by_name["tz"] == ("2024-01-05 08:00:00+00", "2024-01-05 11:30:00.5+00", None)
        assert by_name["d15"] == ("0.30000000000000004", "5e-324", None)


def test_lazy_plan_from_another_database_without_dblink_is_refused_before_the_target(
    tmp_path, postgres_dsn, monkeypatch
):
    """No dblink in the target database (only a superuser can create it): config_invalid
    before the target, naming dblink and not the login; no table made, nothing armed."""
    with databases(postgres_dsn, dblink=False) as dbs:
        table = dbs.source_table(BULK_COLUMNS[:2])
        with pytest.raises(ConfigInvalid, match="dblink extension is not installed") as refused:
            run(tmp_path / "run", monkeypatch, dbs, table, "public.pulled", "lazy-plan")
        assert dbs.password not in repr(refused.value) + str(refused.value.diagnostics)
        sink = PostgresSink(dbs.dsn(dbs.target_db, role=True), "public.pulled")
        assert sink.read_ledger() == []
        with contextlib.closing(psycopg.connect(dbs.dsn(dbs.target_db))) as conn:
            assert conn.execute("SELECT to_regclass('public.pulled')").fetchone()[0] is None


def server_log(admin: str) -> bytes:
    """The test server's log (``helpers.postgres_server`` writes it beside the data folder);
    empty for a server given by DPONE_TEST_POSTGRES_DSN."""
    with contextlib.closing(psycopg.connect(admin)) as conn:
        data = conn.execute("SHOW data_directory").fetchone()[0]
    log = Path(data).parent / "server.log"
    with contextlib.suppress(OSError):
        return log.read_bytes()
    return b""


@pytest.mark.parametrize("fault", ["none", "permission revoked", "table dropped"])
def test_the_source_password_dblink_reads_with_is_in_no_output_or_stored_record(
    tmp_path, postgres_dsn, monkeypatch, caplog, fault
):
    """The canary is in no error (message, diagnostics, chain, traceback), log record, CLI
    output, file of the run, ledger row, nor in the server's own log, and dblink leaves no
    connection or user mapping behind; with the source's privilege revoked or its table
    dropped inside the target call, the run fails with a stable code."""
    caplog.set_level(logging.DEBUG)
    with databases(postgres_dsn) as dbs:
        table = dbs.source_table(BULK_COLUMNS[:3])
        real = PostgresSink.load_plan

        def failing(self, *args, **kwargs):
            with contextlib.closing(psycopg.connect(dbs.dsn(dbs.source_db), autocommit=True)) as c:
                if fault == "permission revoked":
                    c.execute(f"REVOKE SELECT ON s.src FROM {dbs.role}")
                elif fault == "table dropped":
                    c.execute("DROP TABLE s.src")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(PostgresSink, "load_plan", failing)
        outputs: list[tuple[str, str]] = []
        try:
            result = run(tmp_path / "run", monkeypatch, dbs, table, "public.pulled", "lazy-plan")
        except Exception as error:
            assert fault != "none"
            outputs += [
                ("error", repr(error)),
                ("chain", "".join(traceback.format_exception(error))),
            ]
            outputs.append(("diagnostics", repr(getattr(error, "diagnostics", None))))
        else:
            assert fault == "none" and result.rows_loaded == 3
        cli = run_cli("run", tmp_path / "run" / "route.toml")
        outputs += [("cli stdout", cli.stdout), ("cli stderr", cli.stderr)]
        outputs += [("log", r.getMessage() + repr(r.__dict__)) for r in caplog.records]
        with contextlib.closing(psycopg.connect(dbs.dsn(dbs.target_db))) as conn:
            for name in ("_dpone_ledger",):
                if conn.execute("SELECT to_regclass(%s)", [f"public.{name}"]).fetchone()[0]:
                    outputs.append((name, repr(conn.execute(f"SELECT * FROM {name}").fetchall())))
            mappings = conn.execute("SELECT count(*) FROM pg_user_mappings").fetchone()[0]
            assert mappings == 0
            links = conn.execute("SELECT dblink_get_connections()").fetchone()[0]
            assert links is None  # this session's; the run's ended with its connection
        for where, text in outputs:
            assert dbs.password not in text, where
        for file in tmp_path.rglob("*"):
            if file.is_file():
                assert dbs.password.encode() not in file.read_bytes(), file
        assert dbs.password.encode() not in server_log(postgres_dsn)


def test_a_dblink_that_cannot_connect_inside_the_load_rolls_back_and_blocks_nothing(
    tmp_path, postgres_dsn, monkeypatch
):
    """The source database refusing the login inside the target call (its CONNECT revoked
    after the plan): the load cannot have been applied, so it is ``TargetRolledBack``, exit 1,
    nothing armed left; the next run loads every row once without an operator."""
    with databases(postgres_dsn) as dbs:
        table = dbs.source_table(BULK_COLUMNS[:3])
        real, admin = PostgresSink.load_plan, dbs.dsn(dbs.source_db)

        def revoked(self, *args, **kwargs):
            with contextlib.closing(psycopg.connect(admin, autocommit=True)) as conn:
                conn.execute(f"REVOKE CONNECT ON DATABASE {dbs.source_db} FROM PUBLIC")
            return real(self, *args, **kwargs)

        monkeypatch.setattr(PostgresSink, "load_plan", revoked)
        with pytest.raises(TargetRolledBack) as failed:
            run(tmp_path / "run", monkeypatch, dbs, table, "public.pulled", "lazy-plan")
        assert failed.value.applied is False and dbs.password not in str(failed.value)
        monkeypatch.setattr(PostgresSink, "load_plan", real)
        with contextlib.closing(psycopg.connect(admin, autocommit=True)) as conn:
            conn.execute(f"GRANT CONNECT ON DATABASE {dbs.source_db} TO PUBLIC")
        result = run(tmp_path / "run", monkeypatch, dbs, table, "public.pulled", "lazy-plan")
        assert result.rows_loaded == 3
        with contextlib.closing(psycopg.connect(dbs.dsn(dbs.target_db))) as conn:
            assert conn.execute("SELECT count(DISTINCT id) FROM public.pulled").fetchone()[0] == 3


def test_appends_from_another_database_load_each_new_row_once(tmp_path, postgres_dsn, monkeypatch):
    """An append with a cursor, through dblink: the second run loads the rows written since,
    and only them (the window's conditions OR-ed in one query of the source database)."""
    with databases(postgres_dsn) as dbs:
        table = dbs.source_table([("c", "bigint", "10", "20")])
        source = dbs.dsn(dbs.source_db)
        with contextlib.closing(psycopg.connect(source, autocommit=True)) as conn:
            conn.execute("UPDATE s.src SET c = 5 WHERE c IS NULL")
        text = ROUTE.replace(
            'partition_column = "p"', 'partition_column = "p"\ncursor_column = "c"'
        )
        text = text.replace('strategy = "full_refresh"', 'strategy = "incremental_append"')
        monkeypatch.setattr(sys.modules[__name__], "ROUTE", text)
        first = run(tmp_path / "run", monkeypatch, dbs, table, "public.pulled", "lazy-plan")
        with contextlib.closing(psycopg.connect(source, autocommit=True)) as conn:
            conn.execute("INSERT INTO s.src (id, p, c) VALUES (4, 0, 30), (5, NULL, 40), (6, 7, 1)")
        second = run(tmp_path / "run", monkeypatch, dbs, table, "public.pulled", "lazy-plan")
        assert (first.rows_loaded, second.rows_loaded) == (3, 2)  # c = 1 is below the watermark
        with contextlib.closing(psycopg.connect(dbs.dsn(dbs.target_db))) as conn:
            ids = [r[0] for r in conn.execute("SELECT id FROM public.pulled ORDER BY id")]
        assert ids == [1, 2, 3, 4, 5]
