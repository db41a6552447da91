"""The optional engine drivers, the PostgreSQL connection settings stores and sources share,
and what a server's refusal means (``ServerFailure``).

The core needs only pluggy and attrs: each driver is an extra, imported when a
connector or store first connects, so a missing one is a ``ConfigInvalid``
naming the extra to install, never an ``ImportError``.

A driver error that means the server (or a file) cannot be used is classified here, once,
for every source, target and store: by the server's SQLSTATE (ClickHouse: its error code),
the driver's exception class or an ``OSError``'s errno, never by the driver's text, which
may hold the host, the user, the database or SQL. The class decides the exit code: the
login, the database or a privilege is wrong (exit 2: fix the configuration, a retry cannot
help), or the server is down, busy or restarting (exit 1: a retry may succeed).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import importlib
import os
import re
import selectors
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any, TypeVar

import attrs

from .errors import AccessRefused, ConfigInvalid, NativeTransferError, with_driver_error

__all__ = [
    "CONNECT_TIMEOUT_SECONDS",
    "EXTRAS",
    "POSTGRES_SCHEMES",
    "ServerFailure",
    "clickhouse_failure",
    "connections_held",
    "file_failure",
    "file_path",
    "holding_connections",
    "import_driver",
    "install_hint",
    "postgres_connect",
    "postgres_failure",
    "postgres_release",
    "resolve_env",
]

_E = TypeVar("_E", bound=NativeTransferError)

# the module each optional extra installs
EXTRAS = {"psycopg": "postgres", "duckdb": "duckdb", "chdb": "clickhouse"}
EXTRAS["clickhouse_connect"] = "clickhouse"

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
CONNECT_TIMEOUT_SECONDS = 10  # used when the DSN sets no connect_timeout (libpq waits forever)


def install_hint(extra: str) -> str:
    return f"pip install 'dpone-native-transfer[{extra}]'"


def import_driver(module: str, *, needed_by: str, key: str = "driver") -> ModuleType:
    """``module`` (``"chdb.session"``: a submodule), or ``ConfigInvalid`` naming its extra."""
    package = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigInvalid(
            f"{needed_by} needs the {package} package: {install_hint(EXTRAS[package])}",
            diagnostics={"key": key, "package": package},
        ) from None


# --- what a failure means -------------------------------------------------------------------

CONFIG_FAILURES = ("login_refused", "database_missing", "permission_denied", "read_only")
# kind: what the message says it is
_REASONS = {
    "login_refused": "the server refused the login: authentication failed (a wrong password, "
    "an unknown user, or a login the server does not accept from here)",
    "database_missing": "the database does not exist",
    "permission_denied": "permission denied: the login (or this process) lacks a privilege it "
    "needs",
    "unreachable": "the server cannot be reached: it is down, refused the connection, or its "
    "host is unknown",
    "timed_out": "the connection timed out",
    "too_many_connections": "the server has too many connections (its own limit, the "
    "login's or the database's)",
    "server_unavailable": "the server is starting up, shutting down or in recovery, or "
    "an administrator ended the session",
    "read_only": "the session is read-only (default_transaction_read_only is on for the "
    "login, the database or the DSN's options, or the server is a standby)",
    "statement_timeout": "a statement ran longer than the session's statement_timeout",
    "connection_failed": "the connection failed or was lost",
}


@attrs.frozen
class ServerFailure:
    """What a driver error means: its ``kind`` (a key of ``_REASONS``) and the server's code.

    ``retry`` says whether a retry may succeed; the three ``CONFIG_FAILURES`` kinds need
    the configuration fixed first (exit 2). ``cause`` is the driver's own exception, kept
    for ``--traceback`` alone (``errors.with_driver_error``).
    """

    kind: str
    sqlstate: str | None = None
    clickhouse_code: int | None = None
    cause: BaseException | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def retry(self) -> bool:
        return self.kind not in CONFIG_FAILURES

    def diagnostics(self) -> dict[str, Any]:
        found: dict[str, Any] = {"failure": self.kind}
        if self.sqlstate:
            found["sqlstate"] = self.sqlstate
        if self.clickhouse_code is not None:
            found["clickhouse_code"] = self.clickhouse_code
        return found

    def error(
        self,
        subject: str,
        *,
        retry: type[NativeTransferError],
        refused: type[_E],
        diagnostics: Mapping[str, Any],
        fix: str,
        nothing_written: bool = True,
    ) -> NativeTransferError:
        """The caller's error for this failure: ``retry`` (exit 1) or ``refused`` (an
        ``AccessRefused``, exit 2), its message ``subject: reason; [nothing was written;]
        what to do`` (``fix``: what to fix when a retry cannot help), its diagnostics
        ``diagnostics`` plus the failure's kind and code."""
        if not issubclass(refused, AccessRefused):
            raise TypeError(f"{refused.__name__} is not an AccessRefused")
        advice = "a retry may succeed" if self.retry else f"{fix}, then run again (a retry "
        advice += "" if self.retry else "alone cannot succeed)"
        written = "nothing was written; " if nothing_written else ""
        cls = retry if self.retry else refused
        error = cls(
            f"{subject}: {_REASONS[self.kind]}; {written}{advice}",
            diagnostics={**diagnostics, **self.diagnostics()},
        )
        return error if self.cause is None else with_driver_error(error, self.cause)


def _sqlstate_kind(sqlstate: str) -> str:
    if sqlstate.startswith("28"):  # invalid_authorization_specification, invalid_password
        return "login_refused"
    if sqlstate == "3D000":  # invalid_catalog_name
        return "database_missing"
    if sqlstate == "42501":  # insufficient_privilege
        return "permission_denied"
    if sqlstate == "53300":  # too_many_connections
        return "too_many_connections"
    if sqlstate in ("57P01", "57P02", "57P03"):  # admin/crash shutdown, cannot_connect_now
        return "server_unavailable"
    if sqlstate == "08001":  # sqlclient_unable_to_establish_sqlconnection
        return "unreachable"
    if sqlstate == "25006":  # read_only_sql_transaction: a setting, not a moment
        return "read_only"
    if sqlstate == "57014":  # query_canceled: statement_timeout (or a cancel)
        return "statement_timeout"
    return "connection_failed"


def postgres_failure(driver: Any, exc: BaseException) -> ServerFailure | None:
    """What a psycopg error raised on an open connection means; None when it is not about
    the connection, the login or a privilege (a bad query, a constraint: the caller's own).
    """
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate:
        kind = _sqlstate_kind(sqlstate)
        # 25P03: the server ended a session idle in its transaction (a stopped worker's)
        known = kind != "connection_failed" or sqlstate.startswith(("08", "57P", "25P03"))
        return ServerFailure(kind, sqlstate, cause=exc) if known else None
    if isinstance(exc, driver.OperationalError):  # no SQLSTATE: the connection broke
        return ServerFailure("connection_failed", cause=exc)
    return None


def postgres_connect(
    driver: Any,
    dsn: str,
    *,
    what: str,
    failed: Callable[[ServerFailure], NativeTransferError],
    kept: bool = False,
) -> Any:
    """Connect to ``dsn`` outside autocommit, with a connect timeout unless the DSN sets one.
    ``kept``: one ``postgres_release`` may keep for the next call of the run
    (``postgres_begin``, which hands kept ones out again).

    A DSN the driver cannot parse is ``ConfigInvalid`` naming ``what`` (the
    parser's message quotes the DSN, password included, so it is dropped). A
    connection that fails is ``failed(failure)``, raised with nothing chained:
    ``_connect_failure`` says what it means.
    """
    params = None
    if isinstance(dsn, str):
        try:
            params = driver.conninfo.conninfo_to_dict(dsn)
        except driver.Error:
            params = None
    if params is None:
        raise ConfigInvalid(f"the {what} DSN cannot be parsed", diagnostics={"key": "dsn"})
    extra = {} if "connect_timeout" in params else {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
    # a connection that may be kept prepares no statement: none outlives its call
    settings = {**extra, "prepare_threshold": None} if kept else extra
    try:
        return driver.connect(dsn, autocommit=False, **settings)
    except driver.Error as exc:
        caught = exc
    if kept and _close_kept_postgres():  # a login's last slots may be ours, idle: free them
        try:
            return driver.connect(dsn, autocommit=False, **settings)
        except driver.Error as exc:
            caught = exc
    raise failed(_connect_failure(driver, caught, params, extra))


def _connect_failure(
    driver: Any, exc: BaseException, params: dict[str, Any], extra: dict[str, Any]
) -> ServerFailure:
    """What a failed ``driver.connect`` means.

    psycopg (libpq) gives a login the server refused no SQLSTATE: only its message holds
    what the server said, in the server's language, beside the user and database names.
    So the server is asked once more by ``_refusal_sqlstate``, with libpq reporting the
    SQLSTATE alone. The driver's class tells a timeout; no attempt at all (an unknown
    host) is unreachable; a server that wanted a password the DSN lacks refused the login.
    """
    timeout = getattr(driver.errors, "ConnectionTimeout", None)
    if timeout is not None and isinstance(exc, timeout):
        return ServerFailure("timed_out", cause=exc)
    sqlstate = getattr(exc, "sqlstate", None)
    if sqlstate:
        return ServerFailure(_sqlstate_kind(sqlstate), sqlstate, cause=exc)
    if not isinstance(exc, driver.OperationalError):
        return ServerFailure("connection_failed", cause=exc)
    pgconn = getattr(exc, "pgconn", None)
    if pgconn is None:  # no connection was attempted: the host name did not resolve
        return ServerFailure("unreachable", cause=exc)
    if getattr(pgconn, "needs_password", False):
        return ServerFailure("login_refused", cause=exc)
    seconds = float(params.get("connect_timeout") or extra.get("connect_timeout") or 0)
    conninfo = driver.conninfo.make_conninfo("", **{**params, **extra})
    try:
        answer = _refusal_sqlstate(driver.pq, conninfo, seconds if seconds > 0 else None)
    except Exception:  # asking is a diagnosis only: it never replaces the failure
        answer = None
    if answer == "":
        return ServerFailure("unreachable", cause=exc)
    if answer == _TIMED_OUT:
        return ServerFailure("timed_out", cause=exc)
    if answer is None:  # could not ask, or let in the second time: a passing failure
        return ServerFailure("connection_failed", cause=exc)
    return ServerFailure(_sqlstate_kind(answer), answer, cause=exc)


_PQERRORS_SQLSTATE = 3  # libpq's PGVerbosity: an error's severity and SQLSTATE, no text
_TIMED_OUT = "timed out"
# libpq's text of a server's error in that verbosity ends "SEVERITY:  SQLSTATE"
_SQLSTATE_LINE = re.compile(r":  ([0-9A-Z]{5})$")


def _refusal_sqlstate(pq: Any, conninfo: str, seconds: float | None) -> str | None:
    """Connect once more with libpq set to report a server's error by its SQLSTATE alone;
    the SQLSTATE the server refused with, "" when no server answered, ``_TIMED_OUT``, or
    None (no libpq to ask, or the server let the login in this time).

    The message read here has no text of the server's, so no user, database or password:
    only libpq's own "connection to server at HOST failed:" before the SQLSTATE.
    """
    verbosity = _error_verbosity_setter(pq)
    if verbosity is None:
        return None
    conn = pq.PGconn.connect_start(conninfo.encode())
    try:
        verbosity(conn.pgconn_ptr, _PQERRORS_SQLSTATE)
        deadline = None if seconds is None else time.monotonic() + seconds
        with selectors.DefaultSelector() as waiting:  # not select(): any descriptor number
            while conn.status != pq.ConnStatus.BAD:
                status = conn.connect_poll()
                if status == pq.PollingStatus.OK:
                    return None
                if status == pq.PollingStatus.FAILED:
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return _TIMED_OUT
                reading = status == pq.PollingStatus.READING
                key = waiting.register(
                    conn.socket, selectors.EVENT_READ if reading else selectors.EVENT_WRITE
                )
                waiting.select(left)
                waiting.unregister(key.fileobj)
        lines = conn.error_message.decode("utf-8", "replace").splitlines()
    finally:
        conn.finish()
    found = [match.group(1) for line in lines if (match := _SQLSTATE_LINE.search(line.rstrip()))]
    return found[-1] if found else ""


@functools.cache
def _error_verbosity_setter(pq: Any) -> Callable[[int, int], int] | None:
    """libpq's ``PQsetErrorVerbosity``, from the very libpq psycopg runs on, or None.

    psycopg does not wrap it. A compiled psycopg (``binary``, ``c``) links libpq, so the
    symbol is looked up through the compiled module itself; the ``python`` one loaded libpq
    with ctypes. A libpq of another version than psycopg's is never used on its connections.
    """
    try:
        module = sys.modules[pq.PGconn.__module__]
        if pq.__impl__ == "python":
            library = sys.modules["psycopg.pq._pq_ctypes"].pq
        else:
            library = ctypes.CDLL(module.__file__)
        setter, version = library.PQsetErrorVerbosity, library.PQlibVersion
    except (AttributeError, KeyError, OSError, TypeError):
        return None
    version.restype, version.argtypes = ctypes.c_int, ()
    if version() != pq.version():
        return None
    setter.restype, setter.argtypes = ctypes.c_int, (ctypes.c_void_p, ctypes.c_int)
    return setter


# ClickHouse's error codes (its ``ErrorCodes.cpp``) that mean the login, the database or a
# privilege is wrong, or that the server is busy
_CLICKHOUSE_CODES = {
    81: "database_missing",  # UNKNOWN_DATABASE
    192: "login_refused",  # UNKNOWN_USER
    193: "login_refused",  # WRONG_PASSWORD
    194: "login_refused",  # REQUIRED_PASSWORD
    516: "login_refused",  # AUTHENTICATION_FAILED
    497: "permission_denied",  # ACCESS_DENIED
    202: "too_many_connections",  # TOO_MANY_SIMULTANEOUS_QUERIES
    209: "timed_out",  # SOCKET_TIMEOUT
    210: "unreachable",  # NETWORK_ERROR
}


def clickhouse_failure(exc: BaseException) -> ServerFailure | None:
    """What a clickhouse-connect error means, by its ``code`` (the server's, which the driver
    reads from the ``X-ClickHouse-Exception-Code`` header) and its class; None when it is not
    about the connection, the login or a privilege."""
    module = sys.modules.get("clickhouse_connect.driver.exceptions")
    if module is None or not isinstance(exc, module.Error):
        return None
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code in _CLICKHOUSE_CODES:
        return ServerFailure(_CLICKHOUSE_CODES[code], clickhouse_code=code, cause=exc)
    if isinstance(exc, module.OperationalError) and code is None:  # no answer: the network
        return ServerFailure("unreachable", cause=exc)
    return None


def file_failure(path: str, *, writing: bool) -> ServerFailure | None:
    """Permission denied on ``path`` (a file, or a folder such as chDB's data path), asked of
    the operating system after an engine could not open it: the same class as a server's
    refused privilege (exit 2). ``writing``: the folder must let this process make files
    too (a journal, a WAL). None when it may be opened, or is missing."""
    folder = os.path.dirname(os.path.abspath(path))
    if writing and os.path.isdir(folder) and not _may(folder, os.W_OK | os.X_OK):
        return ServerFailure("permission_denied")
    if os.path.isdir(path):
        mode = os.R_OK | os.X_OK | (os.W_OK if writing else 0)
        return None if _may(path, mode) else ServerFailure("permission_denied")
    if not os.path.exists(path):
        return None
    refused = refused_write(path) == errno.EACCES if writing else not os.access(path, os.R_OK)
    return ServerFailure("permission_denied") if refused else None


def refused_write(path: str) -> int | None:
    """The errno a write of ``path`` would meet: ``EROFS`` (a read-only file system),
    ``EACCES`` (a permission, an immutable flag), or None; asked with access(2). Opening the
    file to find out, then closing it, would drop every POSIX lock this process holds on it
    (a close drops them all): SQLite's and DuckDB's for another thread's transaction of a
    pipeline, letting another process write pages in use. Two pipelines on one target file
    corrupted it so (a DuckDB file with exit 0 and wrong rows)."""
    if os.access(path, os.W_OK):
        return None
    read_only = getattr(os, "ST_RDONLY", 0)
    with contextlib.suppress(OSError):
        if os.statvfs(path).f_flag & read_only:
            return errno.EROFS
    return errno.EACCES


def _may(folder: str, mode: int) -> bool:
    """Whether this process may use ``folder`` so; a read-only mount (EROFS: the disk, not a
    permission, and it may be remounted) counts as allowed here."""
    if os.access(folder, mode):
        return True
    read_only = getattr(os, "ST_RDONLY", 0)
    with contextlib.suppress(OSError, AttributeError):
        if os.statvfs(folder).f_flag & read_only and os.access(folder, mode & ~os.W_OK):
            return True
    return False


def resolve_env(location: str, *, argument: str) -> str:
    """``location``, or the value of the environment variable it names as ``env:NAME``.

    Errors name ``argument`` and the variable, never a value: it may hold a password.
    """
    if not location.startswith("env:"):
        return location
    variable = location.removeprefix("env:")
    value = os.environ.get(variable, "")
    if not value.strip():  # blank: a store named '   ' beside the route, apart from the rest
        named = {"argument" if argument.startswith("-") else "key": argument}
        said = "is not set" if not value else "holds only blanks"
        raise ConfigInvalid(
            f"{argument} names environment variable {variable!r}, which {said}",
            diagnostics=named,
        )
    return value


# -- connections kept open across calls ---------------------------------------------------------

_held = [0]  # how many ``holding_connections`` blocks are open in this process
_held_lock = threading.Lock()
_on_release: list[Callable[[], object]] = []


@contextlib.contextmanager
def holding_connections() -> Iterator[None]:
    """While open, a connector may keep a database it opened for one call open for the next
    (an embedded engine's file is opened once per run instead of once per call). When the
    last block in the process closes, each connector's release closes what it kept. A route's
    run and a pipeline's tables hold; nothing else does, so that a command reading a target
    between runs opens and closes it as before."""
    with _held_lock:
        _held[0] += 1
    try:
        yield
    finally:
        with _held_lock:
            _held[0] -= 1
            last = not _held[0]
            releases = list(_on_release) if last else []
        for release in releases:
            release()


def connections_held(release: Callable[[], object]) -> bool:
    """Whether a ``holding_connections`` block is open; ``release`` (registered once) is
    called when the last one closes."""
    with _held_lock:
        if release not in _on_release:
            _on_release.append(release)
        return _held[0] > 0


# -- PostgreSQL connections kept for the next call of a run ----------------------------------

_KEPT_PER_DSN = 8  # idle connections kept per DSN: more than a run's jobs use at once
_kept_postgres: dict[str, list[Any]] = {}


def postgres_release(conn: Any, dsn: str) -> None:
    """Give back a connection ``postgres_begin`` handed out: closed, or, while connections
    are held, kept for the next call on ``dsn`` when it is healthy: a transaction left open
    is rolled back (what closing it would do). ``postgres_begin`` resets its session when it
    hands it out again. Any doubt closes it."""
    if conn.closed:
        return
    try:
        reset = connections_held(_close_kept_postgres) and _reset(conn)
    except BaseException:  # a signal while resetting: the connection is closed, not kept
        conn.close()
        raise
    if not reset:
        conn.close()
        return
    with _held_lock:
        idle = _kept_postgres.setdefault(dsn, [])
        if _held[0] and len(idle) < _KEPT_PER_DSN:
            idle.append(conn)
            return
    conn.close()


def _reset(conn: Any) -> bool:
    """Whether ``conn`` is back to a new connection's state (autocommit on while idle)."""
    try:
        status = int(conn.info.transaction_status)
        if status not in (_IDLE, _INTRANS, _INERROR) or conn.broken:
            return False
        if conn.prepare_threshold is not None:  # not made to be kept: it may hold statements
            return False
        if status != _IDLE:
            conn.rollback()
        conn.read_only = conn.isolation_level = conn.deferrable = None
        conn.autocommit = True
    except Exception:
        return False
    return True


_IDLE, _INTRANS, _INERROR = 0, 2, 3  # libpq's PGTransactionStatusType


def _take_kept(dsn: str) -> Any:
    """A kept connection of ``dsn`` (autocommit, its session not reset: ``postgres_begin``
    resets it), or None."""
    with _held_lock:
        idle = _kept_postgres.get(dsn)
        return idle.pop() if idle else None


def _closed_on(conn: Any, error: BaseException) -> None:
    """Close a kept connection that failed its reset; a signal is raised on."""
    with contextlib.suppress(Exception):
        conn.close()
    if not isinstance(error, Exception):
        raise error


# What ``DISCARD ALL`` resets that a transaction may (``DISCARD ALL`` itself may not run in
# one): cursors, settings, prepared statements, temporary tables, session locks.
_RESET_IN_TRANSACTION = (
    "CLOSE ALL; RESET ALL; DEALLOCATE ALL; DISCARD TEMP; SELECT pg_advisory_unlock_all()"
)


def postgres_begin(
    driver: Any,
    dsn: str,
    begin: str,
    session: str,
    *,
    what: str,
    failed: Callable[[ServerFailure], NativeTransferError],
) -> Any:
    """A connection of ``dsn`` in a transaction that ``begin`` (``BEGIN ...``) started with
    ``session`` (statements without parameters) run, sent in one round trip: psycopg's own
    ``BEGIN`` and a kept connection's ``DISCARD ALL`` were two more per call. A connection
    kept by ``postgres_release`` is reset in that round trip (``_RESET_IN_TRANSACTION``);
    one that fails it (the server dropped it) is closed and the next one tried. Autocommit
    is on: the caller commits or rolls back, and ``postgres_release`` gives it back."""
    while True:
        kept = _take_kept(dsn) if connections_held(_close_kept_postgres) else None
        if kept is None:  # a new connection
            conn = postgres_connect(driver, dsn, what=what, failed=failed, kept=True)
            statements = [begin, session]
        else:
            conn, statements = kept, [begin, _RESET_IN_TRANSACTION, session]
        try:
            conn.autocommit = True
            conn.execute("; ".join(statements))  # no parameters: one simple query
        except BaseException as error:
            if kept is None or not isinstance(error, driver.Error):
                with contextlib.suppress(Exception):
                    conn.rollback()
                postgres_release(conn, dsn)
                raise
            _closed_on(conn, error)
            continue
        return conn


def _close_kept_postgres() -> bool:
    """Close every kept connection; whether there was any (the last holding block's release)."""
    with _held_lock:
        idle = [conn for conns in _kept_postgres.values() for conn in conns]
        _kept_postgres.clear()
    for conn in idle:
        with contextlib.suppress(Exception):
            conn.close()
    return bool(idle)


def file_path(path: Any, *, argument: str = "path") -> str:
    """``path`` (text or ``os.PathLike`` of text) as text; anything else, bytes too, refused
    (``ConfigInvalid`` naming ``argument``), not a ``TypeError`` at the first read."""
    if isinstance(path, str | os.PathLike):
        found = os.fspath(path)
        if isinstance(found, str) and found:
            return found
    raise ConfigInvalid(
        f"{argument} must be a file path (text or a pathlib.Path), not {type(path).__name__}",
        diagnostics={"argument": argument},
    )
