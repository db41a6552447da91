"""Opening DuckDB: its driver (imported on first use), a connection to a file (a file of a
storage version the installed DuckDB cannot read is refused, saying what to do), and the
``sqlite_scanner`` extension, loaded from its wheel's file, never downloaded."""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import os
import re
import struct
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import attrs

from ...drivers import connections_held, import_driver
from ...errors import TargetVersionUnsupported
from ..contract import Unsupported

__all__ = [
    "binding_ready",
    "duckdb_driver",
    "inline",
    "one_writer",
    "open_database",
    "postgres_scanner_loads",
    "reraise_interrupt",
    "run",
    "scanner_connection",
    "scratch_connection",
    "sqlite_extension",
    "target_connection",
]

# Never reach the network for an extension: the sqlite scanner comes from its wheel.
_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
# A connection that reads SQLite loads the scanner without DuckDB's signature check, which
# hashes the whole file on every connection (figures: docs/performance.md, fix 30). A target
# kept open for a run (``target_connection``) is opened with it too, whether or not it
# pulls: DuckDB refuses a second configuration of an open file. The file is
# the installed duckdb-extension-sqlite-scanner wheel's (pip checked it at install; whoever
# can change it can change this package too), and nothing else can be loaded: autoloading is
# off and ``scanner_connection``'s LOAD of that file is the only one.
_SCANNER_CONFIG = {**_CONFIG, "allow_unsigned_extensions": True}


def duckdb_driver() -> Any:
    """The driver, without pandas: dpone's statements bind no parameter DuckDB would import
    pandas for (``run``)."""
    return import_driver("duckdb", needed_by="DuckDBSink")


def run(conn: Any, sql: str, params: Sequence[Any] = ()) -> Any:
    """``conn.execute(sql, params)``, its ``?`` parameters written into the text as literals
    of the types DuckDB would bind them as (``inline``). DuckDB imports pandas at a process's
    first bound parameter (0.3-0.5 s, most of a small run's time); a value ``inline`` cannot
    write (a list, a date...) is bound, pandas imported first (``binding_ready``)."""
    text = inline(sql, params)
    if text is None:
        binding_ready()
        return conn.execute(sql, list(params))
    return conn.execute(text)


def binding_ready() -> None:
    """Call before DuckDB is handed a Python object: a bound parameter, or data to
    ``register``. DuckDB imports pandas, when it is installed, the first time in a process,
    from its own code, which swallows what a signal's handler raises meanwhile: a SIGTERM or
    Ctrl-C then was lost, and the run went on. Imported here first, in Python, the signal
    stops the run (docs/performance.md, fix 61)."""
    _import_pandas()


@functools.cache  # once per process; an import a signal stopped raised, so is not kept
def _import_pandas() -> None:
    with contextlib.suppress(Exception):  # not installed, or broken: DuckDB does without
        importlib.import_module("pandas")


def literal(value: str) -> str:
    """``value`` as a DuckDB string literal. DuckDB's literals take no backslash escapes: a
    doubled quote is the only one. A NUL is refused (``inline`` then binds it)."""
    if "\x00" in value:
        raise ValueError("a NUL in a DuckDB literal")
    return "'" + value.replace("'", "''") + "'"


def _typed_literal(value: Any) -> str | None:
    """``value`` as a literal DuckDB types as it types the bound value: alone, the type
    binding gives; beside a column, a text or an integer literal takes the column's type as
    a parameter does (``dt > '2024-01-05'`` compares dates), except an integer beside a
    text column, which DuckDB refuses (dpone compares none). None: no such literal."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):  # DuckDB's INTEGER or BIGINT literal, as bound; beyond them
        # DuckDB versions bind it otherwise (1.5: HUGEINT; older: DOUBLE), so it is bound
        return str(int(value)) if -(2**31) < value < 2**63 else None
    if isinstance(value, float):
        return f"CAST('{float(value)!r}' AS DOUBLE)"  # nan, inf and -0.0 spelled as such
    if isinstance(value, str):
        return None if "\x00" in value else literal(str(value))
    if isinstance(value, bytes | bytearray | memoryview):
        escaped = "".join(f"\\x{byte:02X}" for byte in bytes(value))
        return f"CAST('{escaped}' AS BLOB)"
    if isinstance(value, list) and _one_family(value):
        items = [_typed_literal(item) for item in value]
        return None if None in items else f"[{', '.join(map(str, items))}]"
    return None


def _one_family(values: list[Any]) -> bool:
    """Whether a list's values are all texts, blobs, booleans or numbers (and NULLs), at least
    one not NULL: DuckDB then types the list as binding it would. It refuses a list literal
    that mixes them, which it binds (texts and numbers as texts)."""
    found = {_FAMILIES.get(type(value)) for value in values if value is not None}
    return len(found) == 1 and None not in found


_FAMILIES = {str: "text", bytes: "blob", bool: "boolean", int: "number", float: "number"}


def inline(sql: str, params: Sequence[Any]) -> str | None:
    """``sql`` with each ``?`` outside quotes replaced by its parameter's literal
    (``_typed_literal``); None when a parameter has none, or the markers do not match the
    parameters (then binding them says what is wrong)."""
    literals = [_typed_literal(value) for value in params]
    if any(text is None for text in literals):
        return None
    parts = _QUOTED_OR_MARK.split(sql)  # texts, quoted spans and marks in turn
    marks = [i for i, part in enumerate(parts) if part == "?"]
    if len(marks) != len(literals):
        return None
    for index, text in zip(marks, literals, strict=True):
        parts[index] = str(text)
    return "".join(parts)


# A single- or double-quoted span (a doubled quote inside it is part of it), or a ``?``.
_QUOTED_OR_MARK = re.compile(r"""('(?:[^']|'')*'|"(?:[^"]|"")*"|\?)""")


_SCANNER = "duckdb-extension-sqlite-scanner"  # the wheel of DuckDB's sqlite_scanner extension


def sqlite_extension(duckdb: Any) -> str:
    """The sqlite_scanner extension file shipped for this DuckDB version, or ``ConfigInvalid``
    saying what to install. The wheel is published per DuckDB version, up to 1.5.5 (none for
    DuckDB 2.x); one left installed for another DuckDB version has no file for this one."""
    version = duckdb.__version__
    try:
        import duckdb_extension_sqlite_scanner as wheel
    except ImportError:
        wheel = None
    if wheel is not None:
        path = os.path.join(
            os.path.dirname(wheel.__file__),
            "extensions",
            f"v{version}",
            "sqlite_scanner.duckdb_extension",
        )
        if os.path.isfile(path):
            return path
    raise _no_scanner(version)


def _no_scanner(version: str) -> Unsupported:
    """DuckDB cannot read a SQLite source itself: no sqlite_scanner extension of this DuckDB
    version can be loaded. dpone reads the rows in Python instead (a pull needs it too)."""
    try:
        installed = f"{_SCANNER} {importlib.metadata.version(_SCANNER)} is installed"
    except importlib.metadata.PackageNotFoundError:
        installed = f"{_SCANNER} is not installed"
    return Unsupported(
        f"DuckDB's sqlite_scanner extension of the installed DuckDB {version} ({installed}): "
        f"pip install '{_SCANNER}=={version}'. It is published only for some DuckDB versions, "
        f"the newest 1.5.5 when this release was made, or pip install 'duckdb==1.5.5' "
        f"'{_SCANNER}==1.5.5'",
        key="driver",
        package=_SCANNER,
        duckdb=version,
    )


@functools.cache  # once per process: a run asks once, and never waits on a network
def postgres_scanner_loads() -> bool:
    """Whether DuckDB's ``postgres`` extension loads here, from what is installed already:
    it ships in no wheel, and with ``autoinstall_known_extensions`` off a ``LOAD`` of one
    not installed fails at once, with no download tried. Never true on a machine that
    has not installed it (``INSTALL postgres``) for this DuckDB."""
    try:
        conn = duckdb_driver().connect(":memory:", config=_CONFIG)
    except Exception:
        return False
    try:
        conn.execute("LOAD postgres")
    except Exception:  # not installed, or built for another DuckDB
        return False
    finally:
        conn.close()
    return True


def scanner_connection(path: str, table: str = "") -> Any:
    """A connection to ``path`` with the sqlite scanner loaded (``_SCANNER_CONFIG``); an
    extension file DuckDB refuses to load (built for another DuckDB) is ``_no_scanner``."""
    sqlite_extension(duckdb_driver())  # a missing wheel fails before any connection
    conn = open_database(path, table, config=_SCANNER_CONFIG)
    try:
        _load_scanner(conn)
    except BaseException:
        conn.close()
        raise
    return conn


@attrs.define
class _Kept:
    """A target file's database kept open while connections are held: ``users`` calls are
    using a cursor of it; ``scanner``: the sqlite scanner is loaded into it."""

    database: Any
    users: int = 0
    scanner: bool = False


_kept: dict[str, _Kept] = {}
_kept_lock = threading.Lock()


@contextlib.contextmanager
def target_connection(
    path: str,
    table: str,
    *,
    scanner: bool = False,
    read_only: bool = False,
) -> Iterator[Any]:
    """A connection to the target file ``path``, closed on exit; ``scanner``: with the
    sqlite scanner loaded; ``read_only``: the caller only reads (opened read-only when the
    file is not kept).

    While connections are held (``drivers.holding_connections``: a route's run, a pipeline)
    the file is opened once, with the scanner's configuration, and each call gets a cursor
    of it (DuckDB's own connection to the same database): one open of the file per run,
    not one per call, and no second configuration of one file in this process, which DuckDB
    refuses while the first is open. Otherwise each call opens and closes the file, as a
    command that reads a target between runs needs (the file is not kept locked)."""
    if not connections_held(_release_kept):
        conn = (
            scanner_connection(path, table)
            if scanner
            else open_database(path, table, read_only=read_only)
        )
        try:
            yield conn
        finally:
            conn.close()
        return
    key = os.path.abspath(path)
    with _kept_lock:
        kept = _kept.get(key)
        if kept is None:
            kept = _Kept(open_database(path, table, config=_SCANNER_CONFIG))
            _kept[key] = kept
        kept.users += 1
        try:
            if scanner and not kept.scanner:
                _load_scanner(kept.database)
                kept.scanner = True
            cursor = kept.database.cursor()
        except BaseException:
            kept.users -= 1
            raise
    try:
        yield cursor
    finally:
        with _kept_lock:
            try:
                cursor.close()
            finally:
                kept.users -= 1
                if not kept.users and not connections_held(_release_kept):
                    _close(key, kept)


_SCRATCH = ":memory:"  # the kept scratch database's key: no file has this path


def scratch_connection() -> Any:
    """A connection to an in-memory database with the sqlite scanner loaded, never a target:
    where a plan is checked and a pull reads. While connections are held, a cursor of one
    such database kept for the run (its open and the scanner's LOAD once per run, not once
    per table); the caller closes what it gets either way."""
    if not connections_held(_release_kept):
        return scanner_connection(_SCRATCH)
    with _kept_lock:
        kept = _kept.get(_SCRATCH)
        if kept is None:
            kept = _kept[_SCRATCH] = _Kept(scanner_connection(_SCRATCH), scanner=True)
        return kept.database.cursor()


_writers: dict[str, threading.RLock] = {}


def one_writer(path: str) -> threading.RLock:
    """The lock a write to the file ``path`` holds in this process: DuckDB lets concurrent
    transactions of one database write, but two creating the same table conflict, one
    failing at its commit."""
    with _kept_lock:
        return _writers.setdefault(os.path.abspath(path), threading.RLock())


def _release_kept() -> None:
    """The last hold ended: close each kept database no call is using."""
    with _kept_lock:
        if connections_held(_release_kept):
            return
        for key, kept in list(_kept.items()):
            if not kept.users:
                _close(key, kept)


def _close(key: str, kept: _Kept) -> None:
    del _kept[key]
    kept.database.close()


def _load_scanner(conn: Any) -> None:
    """LOAD the sqlite scanner's file into ``conn``'s database, or ``_no_scanner``."""
    duckdb = duckdb_driver()
    extension = sqlite_extension(duckdb)
    try:
        conn.execute("LOAD '" + extension.replace("'", "''") + "'")
    except duckdb.Error:
        raise _no_scanner(duckdb.__version__) from None


def open_database(
    path: str,
    table: str,
    *,
    read_only: bool = False,
    config: Mapping[str, Any] = _CONFIG,
) -> Any:
    """``duckdb.connect``; a file this DuckDB cannot read because of its storage version is
    ``TargetVersionUnsupported`` (``_unreadable_version``), any other failure DuckDB's own.
    A file another process holds open is waited for, up to ``_LOCK_WAIT_SECONDS``."""
    duckdb = duckdb_driver()
    waited, pause = 0.0, 0.02
    while True:
        try:
            return duckdb.connect(path, read_only=read_only, config=dict(config))
        except duckdb.Error as error:
            if _CONFLICTING_LOCK in str(error) and waited < _LOCK_WAIT_SECONDS:
                time.sleep(pause)
                waited, pause = waited + pause, min(pause * 2, 0.25)
                continue
            refused = _unreadable_version(path, table, duckdb.__version__, str(error))
            if refused is not None:
                raise refused from None
            raise


# DuckDB locks a file for as long as a process holds it open, reading too: ``guard verify``,
# ``rejects show`` or an analyst's read of the table made a run's open fail at once ("cannot
# be opened for writing now"; 3 of 20 runs with verify polling). A lock held longer than this
# is that error still.
_CONFLICTING_LOCK = "Conflicting lock is held"
_LOCK_WAIT_SECONDS = 3.0


# The file's main header: checksum, "DUCK", storage version, flags, the creating DuckDB
# version (from 0.10 on; "v2.0.1"), its git hash. DuckDB 1.x writes storage version 64,
# 2.0.1 writes 999 (its format then stands in the database header).
_HEADER = struct.Struct("<8s4sQ32s32s")


def _unreadable_version(
    path: str, table: str, engine: str, message: str
) -> TargetVersionUnsupported | None:
    """The error of a DuckDB file whose storage version the installed DuckDB (``engine``)
    refused to open, or None for any other failure. The version is read from the file's
    header; DuckDB's refusal (``message``) names it ("... version number 999, but we can only
    read ..."), which tells it from a lock or a damaged file (IOException all three)."""
    try:
        with open(path, "rb") as file:
            head = file.read(_HEADER.size)
    except OSError:
        return None
    if len(head) < _HEADER.size:
        return None
    _, magic, storage, _, creator = _HEADER.unpack(head)
    if magic != b"DUCK" or not re.search(rf"version number {storage}\b", message):
        return None
    written = re.match(rb"v(\d+\.\d+\.\d+)", creator)  # none before DuckDB 0.10
    by = written.group(1).decode() if written else None
    if by is not None and _release(by) > _release(engine):
        fix = f"pip install 'duckdb>={by}'"
    else:
        fix = (
            "export it with the DuckDB that wrote it (EXPORT DATABASE) and import it with "
            f"DuckDB {engine} (IMPORT DATABASE): docs/connectors.md, 'DuckDB versions'"
        )
    return TargetVersionUnsupported(
        f"the target database of table {table!r} is a DuckDB file of storage version {storage} "
        f"written by {f'DuckDB {by}' if by else 'an older DuckDB'}, which the installed DuckDB "
        f"{engine} cannot read: {fix}; nothing was written",
        diagnostics={
            "table": table,
            "storage_version": storage,
            "written_by": by,
            "engine": f"duckdb {engine}",
        },
    )


def _release(version: str) -> tuple[int, ...]:
    """``"1.5.5"`` as ``(1, 5, 5)``; a suffix (``"2.1.0.dev3"``) is ignored."""
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def reraise_interrupt(error: Exception) -> None:
    """Re-raise what DuckDB made of a signal during its query: the exception the signal's
    handler raised (Ctrl-C's KeyboardInterrupt, the CLI's SIGTERM, a scheduler's own) becomes
    RuntimeError("Query interrupted"). That is no failed read to fall back from: the pull
    that took it for one read the rows again in Python, and a SIGTERM'd run ended with 0."""
    if type(error) is RuntimeError and str(error) == "Query interrupted":
        raise error
