"""The PostgreSQL server of the store tests: DPONE_TEST_POSTGRES_DSN, or a private throwaway one.

The throwaway server is built from this machine's binaries (``initdb`` and
``pg_ctl`` on PATH, else the newest ``/usr/lib/postgresql/*/bin``), listens on
127.0.0.1 only, on a free port, and is removed at the end of the session.
PostgreSQL refuses to run as root, so under root it runs as the ``postgres``
user through ``runuser``. TCP logins need a password (scram-sha-256), so DSNs
carry a real credential, as in production, and a wrong password is refused.

Nothing here skips: without a server the PostgreSQL tests fail, loudly, with
what to install or set. A server given by DPONE_TEST_POSTGRES_DSN must check
passwords on the connection the DSN describes (the bad-password test relies on it).
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple, NoReturn

import pytest

__all__ = [
    "ENV_DSN",
    "PostgresLocation",
    "find_binaries",
    "free_port",
    "isolated_schema",
    "postgres_url",
    "server_dsn",
    "standby_dsn",
]

ENV_DSN = "DPONE_TEST_POSTGRES_DSN"
SERVER_USER = "postgres"
_START_ATTEMPTS = 3  # a free port can be taken between choosing and binding it


class PostgresLocation(NamedTuple):
    """Where one test's store lives: a server and a schema no other test uses."""

    dsn: str
    schema: str


def _fail(message: str) -> NoReturn:
    pytest.fail(f"PostgreSQL tests cannot run: {message}", pytrace=False)


def find_binaries() -> tuple[str, str] | None:
    """(initdb, pg_ctl) from one directory: PATH first, then the newest packaged version."""
    found = shutil.which("initdb")
    directories = [os.path.dirname(os.path.realpath(found))] if found else []
    packaged = glob.glob("/usr/lib/postgresql/*/bin")
    directories += sorted(packaged, key=lambda d: _version(d.split("/")[-2]), reverse=True)
    for directory in directories:
        initdb, pg_ctl = os.path.join(directory, "initdb"), os.path.join(directory, "pg_ctl")
        if os.access(initdb, os.X_OK) and os.access(pg_ctl, os.X_OK):
            return initdb, pg_ctl
    return None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".") if part.isdigit())


def _as_server_user(base: Path) -> list[str]:
    """Command prefix that runs as the server's user; hands ``base`` to that user if needed."""
    if os.geteuid() != 0:
        return []
    runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    try:
        user = pwd.getpwnam(SERVER_USER)
    except KeyError:
        user = None
    if runuser is None or user is None:
        _fail(f"running as root needs `runuser` and a {SERVER_USER!r} user to run the server")
    for path in (base, *base.iterdir()):
        os.chown(path, user.pw_uid, user.pw_gid)
    return [runuser, "-u", SERVER_USER, "--"]


def _run(command: list[str], log: Path, what: str) -> None:
    with open(log, "ab") as out:
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        _fail(f"{what} exited {done.returncode}:\n" + "\n".join(tail))


def free_port() -> int:
    """A loopback TCP port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class _Server(NamedTuple):
    dsn: str
    base: Path  # its data folder's parent, where its socket is
    prefix: list[str]  # runs a command as the server's user
    pg_ctl: str


def _start(prefix: list[str], pg_ctl: str, data: Path, base: Path, *extra: str) -> int:
    """Start the server of ``data`` on a free port (its socket in ``base``); the port."""
    for attempt in range(1, _START_ATTEMPTS + 1):
        port = free_port()
        options = (
            f"-p {port} -k {base} -c listen_addresses=127.0.0.1"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            # dlt's sql_database in section 10 opens a connection per table at once
            " -c max_connections=300"
        )
        start = [*prefix, pg_ctl, "-D", str(data), "-l", str(base / "server.log"), "-w"]
        try:
            _run([*start, "-t", "60", "-o", " ".join([options, *extra]), "start"],
                 base / "pg_ctl.log", "pg_ctl start")  # fmt: skip
            return port
        except pytest.fail.Exception:
            if attempt == _START_ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _stopped(prefix: list[str], pg_ctl: str, data: Path) -> None:
    stop = [*prefix, pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"]
    subprocess.run(stop, capture_output=True, check=False)


@contextlib.contextmanager
def _throwaway() -> Iterator[_Server]:
    binaries = find_binaries()
    if binaries is None:
        _fail(
            "no initdb/pg_ctl on PATH or in /usr/lib/postgresql/*/bin; install the PostgreSQL "
            f"server binaries (Debian: postgresql) or set {ENV_DSN}"
        )
    initdb, pg_ctl = binaries
    base = Path(tempfile.mkdtemp(prefix="dpone-pg-"))
    try:
        password = secrets.token_hex(16)
        (base / "pwfile").write_text(password + "\n")
        prefix = _as_server_user(base)
        data = base / "data"
        _run(
            [*prefix, initdb, "-D", str(data), "-U", "postgres", f"--pwfile={base / 'pwfile'}",
             "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C",
             "--no-sync"],
            base / "initdb.log",
            "initdb",
        )  # fmt: skip
        port = _start(prefix, pg_ctl, data, base)
        try:
            dsn = f"host=127.0.0.1 port={port} dbname=postgres user=postgres password={password}"
            yield _Server(dsn, base, prefix, pg_ctl)
        finally:
            _stopped(prefix, pg_ctl, data)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def _throwaway_server() -> Iterator[str]:
    with _throwaway() as server:
        yield server.dsn


@contextlib.contextmanager
def standby_dsn(*statements: str) -> Iterator[str]:
    """The DSN of a hot standby (a read-only replica, in recovery) of a throwaway server of
    its own, copied by ``pg_basebackup`` after ``statements`` ran there: the same login and
    password, and what they made."""
    import psycopg

    with _throwaway() as primary:
        with contextlib.closing(psycopg.connect(primary.dsn, autocommit=True)) as conn:
            for statement in statements:
                conn.execute(statement)
        basebackup = os.path.join(os.path.dirname(primary.pg_ctl), "pg_basebackup")
        base = Path(tempfile.mkdtemp(prefix="dpone-pg-standby-"))
        try:
            prefix = _as_server_user(base)
            data = base / "data"
            port = primary.dsn.split("port=")[1].split()[0]
            copy = [basebackup, "-h", str(primary.base), "-p", port, "-U", "postgres"]
            copy += ["-D", str(data), "-R"]
            _run([*prefix, *copy, "--no-sync"], base / "basebackup.log", "pg_basebackup")
            standby = _start(prefix, primary.pg_ctl, data, base, "-c hot_standby=on")
            try:
                yield primary.dsn.replace(f"port={port}", f"port={standby}")
            finally:
                _stopped(prefix, primary.pg_ctl, data)
        finally:
            shutil.rmtree(base, ignore_errors=True)


def _check_reachable(dsn: str) -> None:
    try:
        import psycopg
    except ImportError:
        _fail("psycopg is not installed; pip install -e '.[test]'")
    try:
        psycopg.connect(dsn, connect_timeout=10).close()
    except psycopg.Error as exc:
        _fail(f"the server does not accept connections ({type(exc).__name__}, {exc.sqlstate})")


@contextlib.contextmanager
def server_dsn() -> Iterator[str]:
    """The DSN of a running server for the whole session."""
    given = os.environ.get(ENV_DSN)
    if given:
        _check_reachable(given)
        yield given
        return
    with _throwaway_server() as dsn:
        _check_reachable(dsn)
        yield dsn


def postgres_url(dsn: str, **query: str) -> str:
    """The server as a postgresql:// URL: the form PostgresSource takes."""
    import psycopg

    parts = psycopg.conninfo.conninfo_to_dict(dsn)
    user = urllib.parse.quote(parts["user"], safe="")
    password = urllib.parse.quote(parts.get("password") or "", safe="")
    url = f"postgresql://{user}:{password}@{parts['host']}:{parts['port']}/{parts['dbname']}"
    return url + ("?" + urllib.parse.urlencode(query) if query else "")


@contextlib.contextmanager
def isolated_schema(dsn: str) -> Iterator[PostgresLocation]:
    """A schema name no other test uses; dropped afterwards with whatever the test left in it."""
    import psycopg

    schema = f"test_{secrets.token_hex(6)}"
    try:
        yield PostgresLocation(dsn, schema)
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SET lock_timeout = '10s'")
            admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
