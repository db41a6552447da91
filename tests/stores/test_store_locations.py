"""Where a command finds its store: a SQLite file, a postgresql:// DSN, or env:NAME.

Operators of a shared PostgreSQL store use the same commands as SQLite users.
The DSN carries a password, so it is read from the environment and never printed.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from dpone_native_transfer import (
    PostgresCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.testing import (
    FaultyStore,
    InjectedFault,
    build_sample_source,
    phase_batch,
)

CLI = Path(sys.executable).parent / "dpone-transfer"
ROUTE = ["--route", "orders", "orders_copy", "incremental_append"]


@pytest.fixture
def default_schema_dsn(postgres_dsn):
    """The test server as a postgresql:// URL (the form --store accepts), on the store's
    default schema, which is dropped again afterwards."""
    parts = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    yield (
        f"postgresql://{parts['user']}:{parts['password']}@{parts['host']}:{parts['port']}"
        f"/{parts['dbname']}"
    )
    with contextlib.closing(psycopg.connect(postgres_dsn, autocommit=True)) as admin:
        admin.execute('DROP SCHEMA IF EXISTS "dpone" CASCADE')


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, env=env, check=False)


def route_file(tmp_path: Path) -> Path:
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    path = tmp_path / "route.toml"
    path.write_text(
        '[source]\npath = "source.db"\ntable = "orders"\npartition_column = "region"\n'
        'cursor_column = "updated_at"\n[target]\npath = "target.db"\ntable = "orders_copy"\n'
        '[transfer]\nstrategy = "incremental_append"\npath = "legacy"\n'
        '[store]\npath = "env:DPONE_STORE"\n',
        encoding="utf-8",
    )
    return path


def test_run_and_guard_commands_use_a_postgres_store_named_by_environment(
    tmp_path, default_schema_dsn, monkeypatch
):
    env = {"DPONE_STORE": default_schema_dsn, "PATH": str(CLI.parent)}
    route = route_file(tmp_path)
    first = cli("run", str(route), "--quiet", env=env)
    assert first.returncode == 0, first.stderr
    assert "committed 2 partitions" in first.stdout

    # a failed promotion, written by a worker through the Python API, on the same store
    build_sample_source(tmp_path / "source.db", rows=10, partitions=2, start_id=100)
    with contextlib.closing(PostgresCheckpointStore(default_schema_dsn)) as real:
        store = FaultyStore(real)
        store.fail_batch(phase_batch("checkpoint_committed"), keep=1)
        spec = TransferSpec(
            source=SQLiteSource(str(tmp_path / "source.db"), "orders", "region", "updated_at"),
            sink=SQLiteSink(str(tmp_path / "target.db"), "orders_copy"),
            strategy="incremental_append",
            path="legacy",
            run_id="worker-2",
        )
        with pytest.raises(InjectedFault):
            TransferRuntime(store).run(spec)

    outputs = []
    scan = cli("guard", "scan", "--store", "env:DPONE_STORE", *ROUTE, env=env)
    assert scan.returncode == 3 and "checkpoint_incomplete" in scan.stdout
    blocked = cli("run", str(route), "--quiet", env=env)
    assert blocked.returncode == 3
    batch = next(w for w in scan.stdout.split() if w.startswith("sha256:"))
    resolve = cli(
        "guard",
        "resolve",
        "--store",
        "env:DPONE_STORE",
        *ROUTE,
        "--batch",
        batch,
        "--as",
        "committed",
        "--reason",
        "rows checked",
        "--operator",
        "ops",
        "--yes",
        env=env,
    )
    assert resolve.returncode == 0, resolve.stderr
    rerun = cli("run", str(route), "--quiet", env=env)
    assert rerun.returncode == 0 and "loaded 0 rows" in rerun.stdout
    outputs += [first, scan, blocked, resolve, rerun]
    password = psycopg.conninfo.conninfo_to_dict(default_schema_dsn)["password"]
    for done in outputs:
        assert password not in done.stdout + done.stderr


def test_an_unset_store_variable_is_a_usage_error_naming_the_argument(tmp_path):
    done = cli("guard", "scan", "--store", "env:DPONE_NOT_SET", env={"PATH": str(CLI.parent)})
    assert done.returncode == 2
    assert "--store names environment variable 'DPONE_NOT_SET', which is not set" in done.stderr
    route = route_file(tmp_path)
    done = cli("run", str(route), env={"PATH": str(CLI.parent)})
    assert done.returncode == 2 and '"key": "store.path"' in done.stderr


def test_a_blank_store_variable_is_refused_not_a_private_store_beside_the_route(tmp_path):
    """A variable of blanks named a store file '   ' beside the route, apart from the
    shared store (its lease and guard), exit 0. Refused as an unset one is."""
    route = route_file(tmp_path)
    done = cli("run", str(route), env={"PATH": str(CLI.parent), "DPONE_STORE": "   "})
    assert done.returncode == 2 and "which holds only blanks" in done.stderr
    assert not (tmp_path / "   ").exists()


def test_an_unreachable_postgres_store_reports_no_credentials(tmp_path):
    dsn = "postgresql://ops:CANARY-PASSWORD@127.0.0.1:1/warehouse"
    done = cli("guard", "scan", "--store", "env:DPONE_STORE", env={"DPONE_STORE": dsn})
    assert done.returncode == 1
    assert "native_transfer_checkpoint_store_unavailable" in done.stderr
    assert "CANARY-PASSWORD" not in done.stdout + done.stderr


def test_a_key_value_connection_string_is_refused_not_created_as_a_file(tmp_path):
    conninfo = "host=127.0.0.1 dbname=warehouse user=ops password=CANARY-PASSWORD"
    for args in (
        ["guard", "scan", "--store", conninfo],
        ["guard", "show", "--store", conninfo, *ROUTE],
    ):
        done = subprocess.run([str(CLI), *args], capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 2
        assert "postgresql:// URL" in done.stderr and "CANARY-PASSWORD" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_store_dsn_pointed_at_another_database_is_refused_then_restored(
    tmp_path, default_schema_dsn
):
    """Issue 12: the DSN is edited to name another (empty) database. The target's ledger
    knows the route's batches, so the run stops before the target instead of appending
    the whole table again; ``state restore`` rebuilds the new store from the ledger."""
    other = f"dpone_other_{tmp_path.name[-8:].lower().replace('-', '_')}"
    with contextlib.closing(psycopg.connect(default_schema_dsn, autocommit=True)) as admin:
        admin.execute(f'CREATE DATABASE "{other}"')
    try:
        first_dsn = default_schema_dsn
        other_dsn = first_dsn.rsplit("/", 1)[0] + f"/{other}"
        route = route_file(tmp_path)
        assert cli("run", str(route), "--quiet", env={"DPONE_STORE": first_dsn}).returncode == 0
        build_sample_source(tmp_path / "source.db", rows=10, partitions=2, start_id=100)
        env = {"DPONE_STORE": other_dsn}
        refused = cli("run", str(route), "--quiet", env=env)
        assert refused.returncode == 3, refused.stderr
        assert "native_transfer_store_target_mismatch" in refused.stderr
        assert "mismatch: target_ahead_of_store" in refused.stderr
        with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
            assert target.execute("SELECT count(*) FROM orders_copy").fetchone() == (40,)
        restored = cli(
            "state", "restore", str(route), "--reason", "dsn moved", "--operator", "ops", "--yes",
            env=env,
        )  # fmt: skip
        assert restored.returncode == 0, restored.stdout + restored.stderr
        rerun = cli("run", str(route), "--quiet", env=env)
        assert rerun.returncode == 0 and "loaded 10 rows" in rerun.stdout, rerun.stderr
        with contextlib.closing(sqlite3.connect(tmp_path / "target.db")) as target:
            ids = [row[0] for row in target.execute("SELECT id FROM orders_copy")]
        assert sorted(ids) == list(range(1, 41)) + list(range(100, 110))
        for done in (refused, restored, rerun):
            assert psycopg.conninfo.conninfo_to_dict(first_dsn)["password"] not in (
                done.stdout + done.stderr
            )
    finally:
        with contextlib.closing(psycopg.connect(default_schema_dsn, autocommit=True)) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')


def test_operator_commands_never_create_a_store_in_another_database(tmp_path, default_schema_dsn):
    """Issue 13: guard scan given the DSN of another database made a store there, and said
    it was clean."""
    other = f"dpone_empty_{tmp_path.name[-8:].lower().replace('-', '_')}"
    with contextlib.closing(psycopg.connect(default_schema_dsn, autocommit=True)) as admin:
        admin.execute(f'CREATE DATABASE "{other}"')
    other_dsn = default_schema_dsn.rsplit("/", 1)[0] + f"/{other}"
    try:
        for args in (["guard", "scan"], ["guard", "verify"], ["guard", "show", *ROUTE]):
            done = cli(*args, "--store", "env:DPONE_STORE", env={"DPONE_STORE": other_dsn})
            assert done.returncode == 2, (args, done.stdout, done.stderr)
            assert "holds no checkpoint store" in done.stderr
        with contextlib.closing(psycopg.connect(other_dsn)) as conn:
            schemas = conn.execute(
                "SELECT count(*) FROM information_schema.schemata WHERE schema_name = 'dpone'"
            ).fetchone()
        assert schemas == (0,)
    finally:
        with contextlib.closing(psycopg.connect(default_schema_dsn, autocommit=True)) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{other}" WITH (FORCE)')


def test_a_store_that_is_a_pipe_or_a_device_is_a_usage_error(tmp_path):
    """A pipe as the store exited 1 ("a retry may succeed"); it never will."""
    pipe = tmp_path / "checkpoints.db"
    os.mkfifo(pipe)
    for store in (pipe, "/dev/null"):
        done = cli("guard", "scan", "--store", str(store), env={"PATH": str(CLI.parent)})
        assert done.returncode == 2, done.stderr
        assert "is a device, a pipe or a socket, not a store file" in done.stderr
