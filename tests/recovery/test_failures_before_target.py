"""Issue 14.4: failures that provably wrote nothing never block the route.

Each failure class x 4 paths x the targets it applies to, with the ledger on
and off, through ``dpone-transfer run``: the run stops before the target with
a stable code, no checkpoint is left in a guard phase (``guard scan`` exits
0), and once the cause is gone the next run loads every source row once.
"""

from __future__ import annotations

import contextlib
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import routes
from helpers.cli import run_cli
from helpers.routes import PATHS

from dpone_native_transfer import SQLiteSink
from dpone_native_transfer.testing import build_sample_source

FILES, SINKS = routes.TARGET_FILES, routes.SINKS


def write_route(folder: Path, kind: str, path: str, target: str, ledger: bool) -> Path:
    """The sample route's file, its target at ``target`` (a URL or a path), ledger on or off."""
    location = {"path": None, "url": target} if target.startswith("http") else {"path": target}
    sections = {"target": {**location, "ledger": ledger}}
    return routes.write_route(folder, kind=kind, path=path, sections=sections)


def assert_refused_before_the_target(folder: Path, route_file: Path, code: str, status: int):
    done = run_cli("run", route_file)
    assert done.returncode == status, done.stdout + done.stderr
    assert code in done.stderr
    assert "Traceback" not in done.stderr
    store = folder / "checkpoints.db"
    if not store.exists():  # refused with the route file, before the store was opened
        return
    scan = run_cli("guard", "scan", "--store", store)
    assert scan.returncode == 0, scan.stdout + scan.stderr  # nothing armed, nothing blocked


def assert_heals(folder: Path, route_file: Path, kind: str, target: str) -> None:
    done = run_cli("run", route_file)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "loaded 40 rows" in done.stdout
    assert SINKS[kind](folder / target, "orders_copy").row_count() == 40


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    build_sample_source(tmp_path / "source.db", rows=40, partitions=2)
    return tmp_path


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb", "clickhouse"])
def test_a_missing_target_folder(folder: Path, kind: str, path: str, ledger: bool) -> None:
    target = f"missing/{FILES[kind]}"
    route_file = write_route(folder, kind, path, target, ledger)
    assert_refused_before_the_target(folder, route_file, "native_transfer_config_invalid", 2)
    (folder / "missing").mkdir()
    assert_heals(folder, route_file, kind, target)


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_a_target_file_that_is_not_a_database(
    folder: Path, kind: str, path: str, ledger: bool
) -> None:
    route_file = write_route(folder, kind, path, FILES[kind], ledger)
    (folder / FILES[kind]).write_bytes(b"not a database " * 400)
    assert_refused_before_the_target(folder, route_file, "native_transfer_target_unavailable", 1)
    (folder / FILES[kind]).unlink()
    assert_heals(folder, route_file, kind, FILES[kind])


@contextlib.contextmanager
def held(program: str, target: Path) -> Iterator[None]:
    """``program`` holding ``target`` in another process until the block ends."""
    holder = subprocess.Popen(
        [sys.executable, "-c", program, str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()


HOLD_SQLITE = (
    "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None);"
    " c.execute('BEGIN IMMEDIATE'); print('held', flush=True); time.sleep(60)"
)
HOLD_DUCKDB = (
    "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]);"
    " print('held', flush=True); time.sleep(60)"
)


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_a_target_locked_by_another_process(
    folder: Path, kind: str, path: str, ledger: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("dpone_native_transfer.connectors.sqlite.sink.TIMEOUT", 0.2)
    route_file = write_route(folder, kind, path, FILES[kind], ledger)
    if kind == "sqlite":
        with contextlib.closing(sqlite3.connect(folder / FILES[kind])) as db:
            db.execute("CREATE TABLE unrelated (a)")
    with held(HOLD_SQLITE if kind == "sqlite" else HOLD_DUCKDB, folder / FILES[kind]):
        assert_refused_before_the_target(
            folder, route_file, "native_transfer_target_unavailable", 1
        )
    assert_heals(folder, route_file, kind, FILES[kind])


@pytest.mark.parametrize("ledger", [True, False], ids=["ledger", "no-ledger"])
@pytest.mark.parametrize("path", PATHS)
def test_an_unreachable_clickhouse_server(folder: Path, path: str, ledger: bool) -> None:
    """With the ledger on, the route scan reads the ledger first: that read fails the same way."""
    route_file = write_route(folder, "clickhouse", path, "http://127.0.0.1:9", ledger=ledger)
    assert_refused_before_the_target(folder, route_file, "native_transfer_target_unavailable", 1)


@pytest.mark.parametrize("path", PATHS)
def test_a_missing_duckdb_driver_is_found_before_the_target(
    folder: Path, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the Python API (a route file checks the extra when it is read): the first
    driver import is in ``check_target``, so the route is not blocked by it."""
    from dpone_native_transfer import (
        ConfigInvalid,
        DuckDBSink,
        SQLiteCheckpointStore,
        SQLiteSource,
        TransferRuntime,
        TransferSpec,
    )

    source = SQLiteSource(str(folder / "source.db"), "orders", "region", "updated_at")
    sink = DuckDBSink(str(folder / "target.duckdb"), "orders_copy")
    store = SQLiteCheckpointStore(str(folder / "checkpoints.db"))

    def run(run_id: str) -> int:
        spec = TransferSpec(
            source=source, sink=sink, strategy="incremental_append", path=path, run_id=run_id
        )
        return TransferRuntime(store).run(spec).rows_loaded

    try:
        with monkeypatch.context() as without:
            without.setitem(sys.modules, "duckdb", None)
            with pytest.raises(ConfigInvalid, match=r"dpone-native-transfer\[duckdb\]"):
                run("run-1")
        assert run("run-2") == 40  # not blocked: nothing was armed
    finally:
        store.close()


def test_a_postgres_dsn_that_cannot_be_parsed_is_refused_when_the_source_is_made() -> None:
    from dpone_native_transfer import ConfigInvalid, PostgresSource

    with pytest.raises(ConfigInvalid, match="cannot be parsed") as refused:
        PostgresSource("postgresql://bob:s3cret@[::1/db", "orders", "region")
    assert "s3cret" not in str(refused.value) and refused.value.__cause__ is None


@pytest.mark.parametrize("path", PATHS)
def test_ctrl_c_while_the_target_is_opened_exits_130_and_stays_retryable(
    folder: Path, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    route_file = write_route(folder, "sqlite", path, FILES["sqlite"], ledger=True)
    check = SQLiteSink.check_target

    def interrupted(self: SQLiteSink) -> None:
        check(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(SQLiteSink, "check_target", interrupted)
    done = run_cli("run", route_file)
    assert done.returncode == 130, done.stdout + done.stderr
    scan = run_cli("guard", "scan", "--store", folder / "checkpoints.db")
    assert scan.returncode == 0, scan.stdout + scan.stderr
    monkeypatch.setattr(SQLiteSink, "check_target", check)
    assert_heals(folder, route_file, "sqlite", FILES["sqlite"])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_a_target_path_that_is_a_folder(folder: Path, kind: str, path: str) -> None:
    """It was taken for a database not made yet, and the target call failed (blocked); it is
    refused with the route file now, before the store is opened."""
    route_file = write_route(folder, kind, path, FILES[kind], ledger=False)
    (folder / FILES[kind]).mkdir()
    assert_refused_before_the_target(folder, route_file, "native_transfer_config_invalid", 2)
    assert not (folder / "checkpoints.db").exists()
    (folder / FILES[kind]).rmdir()
    assert_heals(folder, route_file, kind, FILES[kind])


HOLD_READ = (
    "import sqlite3, sys, time; c = sqlite3.connect(sys.argv[1], isolation_level=None);"
    " c.execute('BEGIN'); c.execute('SELECT * FROM unrelated').fetchall();"
    " print('held', flush=True); time.sleep(60)"
)


@pytest.mark.parametrize("path", PATHS)
def test_a_sqlite_target_a_reader_holds_past_the_timeout(
    folder: Path, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BEGIN IMMEDIATE passed beside a reader; the load's COMMIT then timed out (blocked)."""
    monkeypatch.setattr("dpone_native_transfer.connectors.sqlite.sink.TIMEOUT", 0.2)
    route_file = write_route(folder, "sqlite", path, FILES["sqlite"], ledger=False)
    with contextlib.closing(sqlite3.connect(folder / FILES["sqlite"])) as db:
        db.execute("CREATE TABLE unrelated (a)")
        db.commit()
    with held(HOLD_READ, folder / FILES["sqlite"]):
        assert_refused_before_the_target(
            folder, route_file, "native_transfer_target_unavailable", 1
        )
    assert_heals(folder, route_file, "sqlite", FILES["sqlite"])


HOLD_CHDB = (
    "import sys, time; from chdb import session; s = session.Session(sys.argv[1]);"
    " s.query('SELECT 1'); print('held', flush=True); time.sleep(60)"
)


@pytest.mark.parametrize("path", ["staged", "lazy-plan"])
def test_a_chdb_folder_another_process_holds(folder: Path, path: str) -> None:
    """It was a configuration error (exit 2), though a retry once the other process ends works."""
    route_file = write_route(folder, "clickhouse", path, FILES["clickhouse"], ledger=True)
    with held(HOLD_CHDB, folder / FILES["clickhouse"]):
        assert_refused_before_the_target(
            folder, route_file, "native_transfer_target_unavailable", 1
        )
    assert_heals(folder, route_file, "clickhouse", FILES["clickhouse"])


def test_a_chdb_folder_taken_between_the_probe_and_the_open(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs started at once into one new data path: the probe found no lock (no folder
    yet), the other process took the path before this one opened it. A retry can work, so it
    is unavailable, not a configuration error."""
    from dpone_native_transfer.connectors.clickhouse import chdb_client
    from dpone_native_transfer.errors import TargetUnavailable

    real_probe, probes = chdb_client._held_by_another, []

    def probe(path: str) -> bool:
        probes.append(path)
        return False if len(probes) == 1 else real_probe(path)

    monkeypatch.setattr(chdb_client, "_held_by_another", probe)
    data = folder / FILES["clickhouse"]
    with held(HOLD_CHDB, data), pytest.raises(TargetUnavailable) as caught:
        chdb_client.ChdbClient(str(data))
    assert len(probes) == 2 and str(data) not in str(caught.value)
