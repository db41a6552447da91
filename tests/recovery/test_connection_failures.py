"""Connection failures by class, never with the secret: a real PostgreSQL server refuses a
login, has no such database, lacks a privilege, is full, is shutting down, is stopped,
or never answers; each as the source, the target and the store of ``dpone-transfer run``.

The login, database and privilege classes exit 2 (fix the configuration: a retry cannot
help, and the Airflow operator fails without retrying); the others exit 1 (a retry may
succeed). Each run writes nothing. A canary password (and a canary user and database
name) never appears in stdout, stderr, the diagnostics, the error's text or its
traceback; with ``--traceback`` the driver's own error is shown, still without the
password. Classified by the server's SQLSTATE and the driver's class (``drivers.py``).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import pickle
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers import postgres_server
from helpers.cli import SCRIPT, run_cli
from helpers.postgres_server import free_port
from helpers.routes import make_sink, write_route

from dpone_native_transfer import (
    AccessRefused,
    CheckpointStoreAccessRefused,
    ClickHouseSink,
    NativeTransferError,
    PostgresCheckpointStore,
    PostgresSink,
    PostgresSource,
    SourceAccessRefused,
    TargetAccessRefused,
)
from dpone_native_transfer.drivers import postgres_failure
from dpone_native_transfer.errors import driver_error
from dpone_native_transfer.reporting import EXIT_CONFIG, EXIT_FAILED, exit_code_for
from dpone_native_transfer.testing import build_sample_source

PASSWORD_CANARY = f"CANARY-PW-{secrets.token_hex(4)}"
USER_CANARY = f"canary_user_{secrets.token_hex(4)}"
DATABASE_CANARY = f"canary_db_{secrets.token_hex(4)}"
CANARIES = (PASSWORD_CANARY, USER_CANARY, DATABASE_CANARY)


def url(parts: dict[str, Any], **changes: Any) -> str:
    """The server as a postgresql:// URL, with ``changes`` to its user, password, database,
    port or query."""
    p = {**parts, **changes}
    user, password = (urllib.parse.quote(str(p[key]), safe="") for key in ("user", "password"))
    query = f"?{p['query']}" if p.get("query") else ""
    return f"postgresql://{user}:{password}@{p['host']}:{p['port']}/{p['dbname']}{query}"


class Server:
    """The session's server, with the logins and databases each failure needs."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.parts = psycopg.conninfo.conninfo_to_dict(dsn)
        tag = secrets.token_hex(4)
        self.schema = f"connfail_{tag}"
        self.full, self.outsider = f"dpone_full_{tag}", f"dpone_outsider_{tag}"
        self.locked = f"dpone_locked_{tag}"
        self.admin(
            f'CREATE SCHEMA "{self.schema}"',
            f'CREATE TABLE "{self.schema}".orders (id int PRIMARY KEY, region text,'
            " amount int, updated_at int)",
            f"INSERT INTO \"{self.schema}\".orders SELECT i, 'r' || (i % 3), i, i"
            " FROM generate_series(1, 30) AS i",
            # a login whose every connection is one too many
            f"CREATE ROLE {self.full} LOGIN PASSWORD 'full-pw' CONNECTION LIMIT 0",
            # a login that may not connect to the database below
            f"CREATE ROLE {self.outsider} LOGIN PASSWORD 'outsider-pw'",
            f"CREATE DATABASE {self.locked}",
            f"REVOKE CONNECT ON DATABASE {self.locked} FROM PUBLIC",
        )

    def admin(self, *statements: str) -> list[Any]:
        with contextlib.closing(psycopg.connect(self.dsn, autocommit=True)) as conn:
            cursors = [conn.execute(statement) for statement in statements]
            return [cursor.fetchall() if cursor.description else [] for cursor in cursors]

    def drop(self) -> None:
        self.admin(
            f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE',
            f"DROP DATABASE IF EXISTS {self.locked}",
            f"DROP ROLE IF EXISTS {self.full}",
            f"DROP ROLE IF EXISTS {self.outsider}",
        )

    def table_exists(self, name: str) -> bool:
        (row,) = self.admin(f"SELECT to_regclass('\"{self.schema}\".{name}') IS NOT NULL")
        return bool(row[0][0])


@pytest.fixture(scope="module")
def server(postgres_dsn: str) -> Iterator[Server]:
    made = Server(postgres_dsn)
    try:
        yield made
    finally:
        made.drop()


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    """A loopback port that accepts TCP connections and never answers: a server that hangs."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield listener.getsockname()[1]


@pytest.fixture(scope="module")
def shutting_down() -> Iterator[dict[str, Any]]:
    """A throwaway server of its own, in a smart shutdown that one open session holds up: it
    refuses new logins with SQLSTATE 57P03. ``stop()`` ends the session, so it stops."""
    with postgres_server._throwaway_server() as dsn:
        held = psycopg.connect(dsn, autocommit=True)
        directory = held.execute("SHOW data_directory").fetchone()[0]
        pid = int(Path(directory, "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGTERM)  # a smart shutdown: it waits for the open session
        parts = psycopg.conninfo.conninfo_to_dict(dsn)

        def stop() -> None:
            held.close()
            deadline = time.monotonic() + 30
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not _alive(pid), "the server did not stop"

        yield {"parts": parts, "stop": stop}
        held.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "Z" not in _state(pid)


def _state(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    return "Z"


# failure -> (the URL's changes, the exit code, the diagnostics' failure and sqlstate)
FAILURES: dict[str, tuple[Callable[[Server, int], dict[str, Any]], int, dict[str, str]]] = {
    "wrong password": (
        lambda s, _: {"password": PASSWORD_CANARY},
        EXIT_CONFIG,
        {"failure": "login_refused", "sqlstate": "28P01"},
    ),
    "unknown user": (
        lambda s, _: {"user": USER_CANARY, "password": PASSWORD_CANARY},
        EXIT_CONFIG,
        {"failure": "login_refused", "sqlstate": "28P01"},
    ),
    "no password": (  # libpq's own refusal: the server asked for one (no SQLSTATE)
        lambda s, _: {"password": ""},
        EXIT_CONFIG,
        {"failure": "login_refused"},
    ),
    "missing database": (
        lambda s, _: {"dbname": DATABASE_CANARY},
        EXIT_CONFIG,
        {"failure": "database_missing", "sqlstate": "3D000"},
    ),
    "no CONNECT privilege": (
        lambda s, _: {"user": s.outsider, "password": "outsider-pw", "dbname": s.locked},
        EXIT_CONFIG,
        {"failure": "permission_denied", "sqlstate": "42501"},
    ),
    "too many connections": (
        lambda s, _: {"user": s.full, "password": "full-pw"},
        EXIT_FAILED,
        {"failure": "too_many_connections", "sqlstate": "53300"},
    ),
    "closed port": (
        lambda s, _: {"port": free_port(), "password": PASSWORD_CANARY},
        EXIT_FAILED,
        {"failure": "unreachable"},
    ),
    "no answer": (
        lambda s, port: {"port": port, "password": PASSWORD_CANARY, "query": "connect_timeout=2"},
        EXIT_FAILED,
        {"failure": "timed_out"},
    ),
}


class Route:
    """The sample route with one component on PostgreSQL (``env:`` DSNs) and the others in
    SQLite files of ``folder``."""

    def __init__(self, folder: Path, server: Server, component: str) -> None:
        self.folder, self.server, self.component = folder, server, component
        self.variable = f"DPONE_TEST_{component.upper()}"
        sections: dict[str, dict[str, Any]] = {}
        on_server = {"kind": "postgres", "dsn": f"env:{self.variable}", "path": None}
        if component == "source":
            sections["source"] = {**on_server, "table": f"{server.schema}.orders"}
        elif component == "target":
            sections["target"] = {**on_server, "table": f"{server.schema}.orders_copy"}
        store = f"env:{self.variable}" if component == "store" else "checkpoints.db"
        self.file = write_route(folder, rows=30, path="legacy", store=store, sections=sections)

    def run(self, location: str, *options: str) -> subprocess.CompletedProcess[str]:
        return run_cli("run", self.file, *options, env={self.variable: location})

    def nothing_written(self) -> None:
        target = self.folder / "target.db"
        if target.exists():
            with contextlib.closing(sqlite3.connect(target)) as db:
                tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                assert "orders_copy" not in {name for (name,) in tables}
        assert not self.server.table_exists("orders_copy")
        store = self.folder / "checkpoints.db"
        if store.exists():
            with contextlib.closing(sqlite3.connect(store)) as db:
                assert db.execute("SELECT COUNT(*) FROM checkpoint_history").fetchone() == (0,)


def _assert_no_canary(where: str, text: str, *canaries: str) -> None:
    for canary in canaries:
        assert canary not in text, f"{canary} leaked into {where}"


def _diagnostics(stderr: str) -> dict[str, Any]:
    (line,) = [line for line in stderr.splitlines() if line.startswith("diagnostics: ")]
    return json.loads(line.removeprefix("diagnostics: "))


CODES = {
    "source": "native_transfer_source_invalid",
    "target": "native_transfer_target_unavailable",
    "store": "native_transfer_checkpoint_store_unavailable",
}


@pytest.mark.parametrize("failure", sorted(FAILURES))
@pytest.mark.parametrize("component", ["source", "target", "store"])
def test_each_failure_class_exits_by_its_class_writes_nothing_and_shows_no_secret(
    tmp_path, server, silent_port, component, failure
):
    changes, code, expected = FAILURES[failure]
    route = Route(tmp_path, server, component)
    location = url(server.parts, **changes(server, silent_port))

    done = route.run(location)
    assert done.returncode == code, done.stderr
    assert f"error: {CODES[component]}: " in done.stderr
    diagnostics = _diagnostics(done.stderr)
    assert {key: diagnostics.get(key) for key in expected} == expected
    assert set(diagnostics) - {"table", "action", "error_type"} == set(expected)
    advice = "a retry may succeed" if code == EXIT_FAILED else "a retry alone cannot succeed"
    assert advice in done.stderr
    for where, text in (("stdout", done.stdout), ("stderr", done.stderr)):
        _assert_no_canary(where, text, *CANARIES, location, "127.0.0.1", "FATAL")
    route.nothing_written()

    shown = route.run(location, "--traceback")  # the driver's text, on purpose
    assert shown.returncode == code
    assert "the driver's own error it was made from" in shown.stderr
    assert "psycopg." in shown.stderr  # its class and its text
    _assert_no_canary("--traceback", shown.stdout + shown.stderr, PASSWORD_CANARY)
    route.nothing_written()


def test_a_stopped_server_and_one_shutting_down_may_be_retried(tmp_path, server, shutting_down):
    """57P03 while the server shuts down, then nothing listening once it has stopped."""
    parts = shutting_down["parts"]
    for component in ("source", "target", "store"):
        route = Route(tmp_path / component, server, component)
        done = route.run(url(parts, password=PASSWORD_CANARY))
        assert done.returncode == EXIT_FAILED, done.stderr
        assert _diagnostics(done.stderr)["failure"] == "server_unavailable"
        assert _diagnostics(done.stderr)["sqlstate"] == "57P03"
        assert "starting up, shutting down or in recovery" in done.stderr
        _assert_no_canary("stderr", done.stdout + done.stderr, PASSWORD_CANARY, "127.0.0.1")
        route.nothing_written()
    shutting_down["stop"]()
    for component in ("source", "target", "store"):
        route = Route(tmp_path / f"{component}-stopped", server, component)
        done = route.run(url(parts))
        assert done.returncode == EXIT_FAILED, done.stderr
        assert _diagnostics(done.stderr)["failure"] == "unreachable"
        route.nothing_written()


# --- the errors themselves: what a library caller, a log or a traceback holds ---------------


def _components(location: str, server: Server) -> dict[str, Callable[[], Any]]:
    table = f"{server.schema}.orders"
    return {
        "source": lambda: PostgresSource(location, table, "region").describe(),
        "target": lambda: PostgresSink(location, f"{server.schema}.orders_copy").check_target(),
        "store": lambda: PostgresCheckpointStore(location).close(),
    }


REFUSED = {
    "source": SourceAccessRefused,
    "target": TargetAccessRefused,
    "store": CheckpointStoreAccessRefused,
}


@pytest.mark.parametrize("failure", ["wrong password", "unknown user", "missing database"])
def test_the_error_its_traceback_and_its_pickle_hold_no_secret_nor_driver_text(server, failure):
    changes, _, expected = FAILURES[failure]
    location = url(server.parts, **changes(server, 0))
    for component, call in _components(location, server).items():
        with pytest.raises(NativeTransferError) as caught:
            call()
        error = caught.value
        assert isinstance(error, REFUSED[component]) and isinstance(error, AccessRefused)
        assert exit_code_for(error) == EXIT_CONFIG
        assert error.__cause__ is None and error.__context__ is None
        default = "".join(traceback.format_exception(error))  # Airflow's, a log's
        texts = {
            "str": str(error),
            "repr": repr(error),
            "diagnostics": json.dumps(error.diagnostics),
            "traceback": default,
        }
        for where, text in texts.items():
            _assert_no_canary(where, text, *CANARIES, location, "FATAL", "psycopg")
        assert expected["sqlstate"] in texts["diagnostics"]
        # the driver's error is kept for --traceback alone: never chained, never pickled
        kept = driver_error(error)
        assert isinstance(kept, psycopg.OperationalError)
        assert PASSWORD_CANARY not in "".join(traceback.format_exception(kept))
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and copy.diagnostics == error.diagnostics
        assert driver_error(copy) is None


def test_a_login_that_may_not_read_the_source_table_is_refused(tmp_path, server):
    """42501 on a query, not at the login: the same class, the same exit."""
    reader = f"dpone_reader_{secrets.token_hex(4)}"
    server.admin(
        f"CREATE ROLE {reader} LOGIN PASSWORD 'reader-pw'",
        f'GRANT USAGE ON SCHEMA "{server.schema}" TO {reader}',
    )
    try:
        route = Route(tmp_path, server, "source")
        done = route.run(url(server.parts, user=reader, password="reader-pw"))
        assert done.returncode == EXIT_CONFIG, done.stderr
        assert _diagnostics(done.stderr) == {
            "failure": "permission_denied",
            "sqlstate": "42501",
            "table": f"{server.schema}.orders",
        }
        route.nothing_written()
    finally:
        server.admin(f'REVOKE ALL ON SCHEMA "{server.schema}" FROM {reader}',
                     f"DROP ROLE {reader}")  # fmt: skip


def test_a_store_whose_sessions_are_read_only_is_refused_by_name(tmp_path, server):
    """SQLSTATE 25006 (a login's default_transaction_read_only, or a standby) is a setting, not
    a moment: exit 2 saying the session is read-only; it was "cannot be written now", exit 1,
    for ever. A statement timeout (57014) is named too, and may be retried."""
    reader = f"dpone_ro_{secrets.token_hex(4)}"
    server.admin(
        f"CREATE ROLE {reader} LOGIN PASSWORD 'ro-pw'",
        f'GRANT ALL ON SCHEMA "{server.schema}" TO {reader}',
        f"ALTER ROLE {reader} SET default_transaction_read_only = on",
    )
    try:
        route = Route(tmp_path, server, "store")
        done = route.run(url(server.parts, user=reader, password="ro-pw"))
        assert done.returncode == EXIT_CONFIG, done.stderr
        assert "the session is read-only" in done.stderr
        assert _diagnostics(done.stderr)["failure"] == "read_only"
        with psycopg.connect(url(server.parts, user=reader, password="ro-pw")) as conn:
            conn.execute("SET statement_timeout = '1ms'")
            with pytest.raises(psycopg.Error) as timed_out:
                conn.execute("SELECT pg_sleep(1)")
        failure = postgres_failure(psycopg, timed_out.value)
        assert failure is not None and (failure.kind, failure.retry) == ("statement_timeout", True)
    finally:
        server.admin(f'REVOKE ALL ON SCHEMA "{server.schema}" FROM {reader}',
                     f"DROP ROLE {reader}")  # fmt: skip


def test_a_standby_is_read_as_a_source_and_refused_by_name_as_a_target(tmp_path):
    """A hot standby (a read-only replica) is read like its primary. As a target, its
    ``BEGIN READ WRITE`` fails with SQLSTATE 0A000, not 25006: the run said "cannot be
    written now", exit 1, retried for ever. It is ``read_only`` now, exit 2, before anything
    is written."""
    made = [
        "CREATE SCHEMA replica",
        "CREATE TABLE replica.orders (id int PRIMARY KEY, region text, amount int, updated_at int)",
        "INSERT INTO replica.orders SELECT i, 'r' || (i % 3), i, i"
        " FROM generate_series(1, 30) AS i",
    ]
    with postgres_server.standby_dsn(*made) as dsn:
        env = {"DPONE_TEST_STANDBY": url(psycopg.conninfo.conninfo_to_dict(dsn))}
        on_server = {"kind": "postgres", "dsn": "env:DPONE_TEST_STANDBY", "path": None}
        source = {**on_server, "table": "replica.orders"}
        reading = write_route(
            tmp_path / "read", path="legacy", store="checkpoints.db", sections={"source": source}
        )
        done = run_cli("run", reading, env=env)
        assert done.returncode == 0, done.stderr
        with contextlib.closing(sqlite3.connect(tmp_path / "read" / "target.db")) as db:
            assert db.execute("SELECT count(*), sum(id) FROM orders_copy").fetchone() == (30, 465)
        target = {**on_server, "table": "replica.copy"}
        writing = write_route(tmp_path / "write", rows=30, path="legacy", store="checkpoints.db",
                              sections={"target": target})  # fmt: skip
        done = run_cli("run", writing, env=env)
        assert done.returncode == EXIT_CONFIG, done.stderr
        assert "the session is read-only" in done.stderr and "standby" in done.stderr
        assert _diagnostics(done.stderr) == {"failure": "read_only", "table": "replica.copy"}
        with contextlib.closing(sqlite3.connect(tmp_path / "write" / "checkpoints.db")) as db:
            assert db.execute("SELECT count(*) FROM checkpoint_history").fetchone() == (0,)


def test_psycopg_without_its_compiled_module_classifies_the_same(server, tmp_path):
    """psycopg's ``python`` implementation (libpq through ctypes) gives the same SQLSTATE."""
    script = (
        "import sys; from dpone_native_transfer import PostgresCheckpointStore as S\n"
        "import psycopg; assert psycopg.pq.__impl__ == 'python', psycopg.pq.__impl__\n"
        "try:\n    S(sys.argv[1])\nexcept Exception as e:\n    print(e.diagnostics)\n"
    )
    location = url(server.parts, dbname=DATABASE_CANARY)
    env = {**os.environ, "PSYCOPG_IMPL": "python"}
    done = subprocess.run([sys.executable, "-c", script, location], env=env,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "'failure': 'database_missing', 'sqlstate': '3D000'" in done.stdout


# --- files: no login, but a file this process may not open is the same class -----------------


def _denied_to_this_process() -> list[str]:
    """A command prefix under which ``chmod 000`` denies this process: root reads any file,
    so under root the command runs without the capabilities that override file modes."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "running as root, these tests need setpriv (util-linux) to drop its rights"
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]


FILES = {
    ("sqlite", "source"): "source.db",
    ("sqlite", "target"): "target.db",
    ("sqlite", "store"): "checkpoints.db",
    ("duckdb", "target"): "target.duckdb",
    ("clickhouse", "target"): "chdata",
}
# a target file's permissions are checked before the target (``_sql.check_writable``)
FILE_CODES = {**CODES, "target": "native_transfer_config_invalid"}


@pytest.mark.parametrize(("kind", "component"), sorted(FILES))
def test_a_file_this_process_may_not_open_is_permission_denied(tmp_path, kind, component):
    """Exit 2 and ``failure`` ``permission_denied``, as a server's refused privilege; before:
    a SQLite source or store exited 1 ("could not be read", "a retry may succeed")."""
    route_file = write_route(
        tmp_path, rows=30, path="legacy", kind=None if kind == "sqlite" else kind
    )

    def run(*prefix: str) -> subprocess.CompletedProcess[str]:
        command = [*prefix, SCRIPT, "run", str(route_file)]
        return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)

    first = run()
    assert first.returncode == 0, first.stderr
    build_sample_source(tmp_path / "source.db", rows=10, partitions=4, start_id=31)
    denied = tmp_path / FILES[kind, component]
    os.chmod(denied, 0)
    try:
        done = run(*_denied_to_this_process())
    finally:
        os.chmod(denied, 0o755 if denied.is_dir() else 0o644)
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert f"error: {FILE_CODES[component]}: " in done.stderr
    said = "read-only (its file or folder: permissions" if component == "target" else "permission"
    assert said in done.stderr and str(tmp_path) not in done.stderr
    assert _diagnostics(done.stderr)["failure"] == "permission_denied"
    sink = make_sink(kind, tmp_path / FILES[kind, "target"])
    assert sink.row_count() == 30  # the 10 new rows were not loaded


def test_a_clickhouse_server_that_refuses_the_login_exits_2():
    """UNVERIFIED against a real ClickHouse server (none runs here): a loopback HTTP server
    answers as ClickHouse does (status and ``X-ClickHouse-Exception-Code`` 516, or 81), and
    the real clickhouse-connect driver reads that code; a closed port is unreachable."""
    for code, failure in ((516, "login_refused"), (81, "database_missing")):
        with _clickhouse_answering(code) as port:
            sink = ClickHouseSink(f"http://bob:{PASSWORD_CANARY}@127.0.0.1:{port}/db", "t")
            for call in (sink.check_target, sink.read_ledger):
                with pytest.raises(TargetAccessRefused) as caught:
                    call()
                assert caught.value.diagnostics == {
                    "table": "t",
                    "failure": failure,
                    "clickhouse_code": code,
                }
                assert exit_code_for(caught.value) == EXIT_CONFIG
                text = f"{caught.value} {''.join(traceback.format_exception(caught.value))}"
                _assert_no_canary("the error", text, PASSWORD_CANARY, "bob", "DB::Exception")
    sink = ClickHouseSink(f"http://bob:{PASSWORD_CANARY}@127.0.0.1:{free_port()}/db", "t")
    with pytest.raises(NativeTransferError) as caught:
        sink.check_target()
    assert not isinstance(caught.value, AccessRefused)
    assert caught.value.diagnostics == {"table": "t", "failure": "unreachable"}


@contextlib.contextmanager
def _clickhouse_answering(code: int) -> Iterator[int]:
    class Refusing(http.server.BaseHTTPRequestHandler):
        def answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = f"Code: {code}. DB::Exception: bob: refused. (version 24.8.1.1)\n".encode()
            self.send_response(code if code >= 500 else 500)
            self.send_header("X-ClickHouse-Exception-Code", str(code))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = answer

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_the_server_is_asked_again_whatever_the_descriptor_numbers(server):
    """A long-lived worker may hold over 1,024 open files: the second ask waits on the socket
    without ``select()``, which refuses such descriptor numbers (it raised ValueError)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 1_200
    if soft < wanted:
        assert hard >= wanted, f"this test needs {wanted} open files (hard limit {hard})"
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    held = []
    try:
        while not held or held[-1] < 1_100:
            held.append(os.open(os.devnull, os.O_RDONLY))
        with pytest.raises(CheckpointStoreAccessRefused) as caught:
            PostgresCheckpointStore(url(server.parts, password=PASSWORD_CANARY))
        assert caught.value.diagnostics["sqlstate"] == "28P01"
    finally:
        for descriptor in held:
            os.close(descriptor)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
