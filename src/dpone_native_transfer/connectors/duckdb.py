"""DuckDB sink: one table of a DuckDB file, loaded on all four transfer paths.

Like the SQLite sink, every call opens its own connection and closes it
before returning (DuckDB lets one process at a time write a file), and every
load is one transaction. ``duckdb`` is the optional ``duckdb`` extra, imported
on first use.

Rows reach DuckDB in bulk, never by ``executemany`` (a statement per row,
about 2,000 rows/s): each batch of rows is one Arrow record batch DuckDB reads
itself, or, when Arrow cannot hold a value of it exactly, one ``INSERT ...
SELECT UNNEST($1), UNNEST($2), ...`` with one list per column; each value is
carried exactly by its column's kind (:func:`duckdb_carrier`). A lazy plan over a SQLite source is
pulled by the ``sqlite_scanner`` extension, loaded from the ``duckdb-extension-sqlite-scanner``
wheel's file, never downloaded. Errors raised here on purpose name tables
only, never a file path, SQL or a DuckDB message.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import itertools
import os
import re
import secrets
import struct
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ..artifacts import DigestReader, DigestWriter, create_private, open_files_allowed, read_chunks
from ..column_types import (
    ENGINE_CARRIERS,
    Carry,
    carried_chunks,
    column_carriers,
    double_nan_as_text,
    exact_decimal,
    instant_as_utc_or_infinite,
    iso_date_or_infinite,
    utc_instant,
)
from ..drivers import import_driver
from ..errors import (
    ArtifactInvalid,
    ConfigInvalid,
    InternalInvariantBroken,
    NativeTransferError,
    TargetUnavailable,
    TargetVersionUnsupported,
)
from ..identity import TableIdentity, file_location, fold_ascii
from ..ledger import (
    FENCE_TABLE,
    LEDGER_TABLE,
    LedgerEntry,
    advance_fence,
    check_applied,
    check_ledger_columns,
    fence_batch,
    fence_first,
    ledger_query,
    ledger_table_sql,
    read_fence,
)
from ..payloads import (
    Column,
    LoadFile,
    LoadFiles,
    LoadPlan,
    Predicate,
    RowChunks,
    bound_predicates,
    cursor_window,
)
from ..rejects import REJECTS_TABLE, rejects_query, rejects_table_sql, write_rejects
from ._arrow import arrow, check_widths, read_ahead, row_batch, row_type, write_stream
from ._sql import (
    STAGE_PREFIX,
    WINDOW_OPERATORS,
    ColumnDifference,
    FileTarget,
    TableName,
    check_target_folder,
    check_target_table,
    check_writable,
    difference,
    integer_range_starts,
    parse_table,
    partition_predicate_count,
    payload_refused,
    quote,
    ranges_run_on,
    refuse_reserved_schema,
    render_predicates,
    unavailable,
)
from .contract import PlanInexact, SQLiteFile
from .sqlite import (
    inexact_plan,
    plan_rows,
    pulled_file,
    refuse_inexact_plan,
    watching_writes,
)

__all__ = ["DUCKDB_TYPES", "DuckDBSink", "duckdb_carrier", "duckdb_type"]

DUCKDB_TYPES = {
    "integer": "BIGINT",
    "real": "DOUBLE",
    "text": "VARCHAR",
    "blob": "BLOB",
    "any": "VARCHAR",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "time": "TIME",
    "timestamp": "TIMESTAMP",
    "timestamptz": "TIMESTAMPTZ",
    "interval": "VARCHAR",  # PostgreSQL's text: DuckDB cannot read every interval it writes
    "numeric": "DOUBLE",
    "decimal": "VARCHAR",
}
"""The DuckDB type of each column kind (``column_types.py``).

``numeric`` and ``decimal`` become ``DECIMAL(p,s)`` when the source declares
a precision DuckDB can hold (at most 38): see :func:`duckdb_type`. Otherwise
a SQLite number is a DOUBLE (an integer beyond 2**53 is refused) and an exact
decimal stays its exact text.
"""

_LEDGER = TableName(None, LEDGER_TABLE)
_FENCE_AT: dict[str, Any] = {"table": quote(FENCE_TABLE), "marker": "?"}
_FENCE: dict[str, Any] = {**_FENCE_AT, "text": "VARCHAR NOT NULL", "integer": "BIGINT NOT NULL"}
_RESERVED_SCHEMAS = ("temp", "system", "information_schema", "pg_catalog")
_BOUND_TAG = "__dpone_bound"  # the column of a pulled scan naming each row's bound
_INSERT_ROWS = 1_000_000  # rows per INSERT of load files (see _insert_native)
_BATCH_ROWS = 50_000  # rows per INSERT: Arrow batches this size load 2x faster than 10,000
_GATHERED_ROWS = 250_000  # a pull's rows held for its files' batches (see _Gathered)
_MAX_DECIMAL_WIDTH = 38
# The scanner's type of a column whose every value of another storage class it refuses with an
# error (a real in an INTEGER column, a blob in a TEXT one) instead of misreading it.
_REFUSING_TYPES = {"integer": "BIGINT", "real": "DOUBLE", "text": "VARCHAR"}
# Never reach the network for an extension: the sqlite scanner comes from its wheel.
_CONFIG = {"autoinstall_known_extensions": False, "autoload_known_extensions": False}
# A connection that reads SQLite loads the scanner without DuckDB's signature check, which
# hashes its 35 MB on every connection: 75 ms of each transfer, 1 ms without. The file is
# the installed duckdb-extension-sqlite-scanner wheel's (pip checked it at install; whoever
# can change it can change this package too), and nothing else can be loaded: autoloading is
# off and ``_scanner_connection``'s LOAD of that file is the only one.
_SCANNER_CONFIG = {**_CONFIG, "allow_unsigned_extensions": True}


# Integer types narrower than BIGINT (or unsigned): DuckDB fails or wraps on wider values.
_NARROW_INTEGERS = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}
)


def _whole(target_type: str) -> bool:
    """A ``DECIMAL(p,0)`` that holds every BIGINT (p >= 19)."""
    found = re.fullmatch(r"DECIMAL\((\d+),0\)", target_type)
    return found is not None and int(found.group(1)) >= 19


def duckdb_type(column: Column) -> str:
    """The DuckDB type a target column gets; built from fixed names, never from source text."""
    decimal = column.decimal(_MAX_DECIMAL_WIDTH)
    if decimal is not None:
        return f"DECIMAL({decimal[0]},{decimal[1]})"
    return DUCKDB_TYPES[column.kind]


def duckdb_carrier(column: Column) -> Carry | None:
    """How a value of ``column`` reaches DuckDB exactly (see ``ValueCarrying``)."""
    decimal = column.decimal(_MAX_DECIMAL_WIDTH)
    if decimal is not None:
        return exact_decimal(*decimal)
    return _CARRIERS.get(column.kind)


_CARRIERS: dict[str, Carry] = {
    **ENGINE_CARRIERS,
    "real": double_nan_as_text,  # its Python binding makes a bound NaN NULL
    "date": iso_date_or_infinite,
    "timestamp": instant_as_utc_or_infinite,
    "timestamptz": utc_instant,  # never the worker's time zone
}


def _driver() -> Any:
    duckdb = import_driver("duckdb", needed_by="DuckDBSink")
    _import_pandas()
    return duckdb


@functools.cache  # once per process; an import a signal stopped raised, so is not kept
def _import_pandas() -> None:
    """DuckDB imports pandas, when it is installed, at its first query with parameters in a
    process (about 0.3 s), from its own code, which swallows what a signal's handler raises
    meanwhile: a SIGTERM or Ctrl-C then was lost, and the run went on. Imported here first,
    in Python, the signal stops the run; the time is spent either way."""
    with contextlib.suppress(Exception):  # not installed, or broken: DuckDB does without
        importlib.import_module("pandas")


_SCANNER = "duckdb-extension-sqlite-scanner"  # the wheel of DuckDB's sqlite_scanner extension


def _sqlite_extension(duckdb: Any) -> str:
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


def _no_scanner(version: str) -> ConfigInvalid:
    """Lazy-plan into DuckDB cannot run: no sqlite_scanner extension of this DuckDB version
    can be loaded. The other paths read the rows in Python (a pull needs the extension too)."""
    try:
        installed = f"{_SCANNER} {importlib.metadata.version(_SCANNER)} is installed"
    except importlib.metadata.PackageNotFoundError:
        installed = f"{_SCANNER} is not installed"
    return ConfigInvalid(
        f"lazy-plan into DuckDB needs DuckDB's sqlite_scanner extension of the installed DuckDB "
        f"{version} ({installed}): pip install '{_SCANNER}=={version}'. It is published "
        "only for some DuckDB versions, the newest 1.5.5 when this release was made: without "
        "it, use legacy, staged or file-artifact, which load the same rows, or pip install "
        f"'duckdb==1.5.5' '{_SCANNER}==1.5.5'",
        diagnostics={"key": "driver", "package": _SCANNER, "duckdb": version},
    )


def _names(columns: Sequence[Column]) -> str:
    if not columns:
        raise ConfigInvalid("at least one column is required")
    return ", ".join(quote(column.name) for column in columns)


class DuckDBSink(FileTarget):
    """Writes one target table of a DuckDB file, each load in a single transaction.

    Each load also writes its ledger row (``LedgerSink``) in that transaction.
    """

    pulled_suffix = ".arrows"  # FilePulling: an Arrow IPC stream

    def __init__(self, path: str | os.PathLike[str], table: str) -> None:
        check_target_table(table)
        super().__init__(path, table)
        self._target = parse_table(table, default_schema="main")
        catalog = os.path.splitext(os.path.basename(self.path))[0]  # DuckDB's name for the file
        refuse_reserved_schema(self._target, {*_RESERVED_SCHEMAS, catalog}, engine="DuckDB")
        self._checked: _Checked | None = None  # the last plan checked
        if self.path == ":memory:" or not self.path:
            raise ConfigInvalid(
                f"target table {table!r} needs a DuckDB file: an in-memory database "
                "would vanish after each call",
                diagnostics={"table": table},
            )

    def identity(self) -> TableIdentity:
        """The file's resolved path; DuckDB matches table names case-insensitively."""
        return TableIdentity(file_location("duckdb", self.path), self._target.canonical())

    @property
    def _stage(self) -> TableName:
        return self._target.sibling(STAGE_PREFIX)

    def _stage_sql(self) -> str:
        return self._stage.sql()

    def check_target(self) -> None:
        """Before the target call: the folder exists and an existing file is a database this
        process can open for writing now (DuckDB locks the whole file per process). A missing
        driver is found here too, not inside the target call."""
        driver = _driver()
        check_target_folder(self.path, self.table)
        check_writable(self.path, self.table)
        if not os.path.isfile(self.path):
            return
        try:
            _open(self.path, self.table).close()
        except driver.Error:
            raise unavailable(self.table) from None

    @contextlib.contextmanager
    def _connect(self, *, scanner: bool = False) -> Iterator[Any]:
        """The target file; ``scanner``: with the sqlite scanner loaded."""
        check_target_folder(self.path, self.table)
        conn = (
            _scanner_connection(self.path, self.table) if scanner else _open(self.path, self.table)
        )
        try:
            yield conn
        finally:
            conn.close()

    def load(self, payload: RowChunks | LoadPlan) -> int:
        """Write the payload in one transaction and return the rows written."""
        if isinstance(payload, RowChunks):
            table, columns = self._target, payload.columns
            with self._connect() as conn, _transaction(conn):
                _fence_first(conn, self._ledger.peek())
                _prepare_target(conn, table, columns, replace=payload.replace)
                if isinstance(payload, LoadFiles):
                    rows = _insert_files(conn, table, columns, payload.files)
                else:
                    rows = _insert_rows(conn, table, columns, payload.chunks)
                return _record(conn, self._ledger.take(), rows)
        if isinstance(payload, LoadPlan):
            return self._load_plan(payload)
        raise payload_refused(self.table)

    def write_load_file(
        self, path: Path, columns: Sequence[Column], chunks: Iterable[Sequence[tuple]]
    ) -> LoadFile | Iterator[Sequence[tuple]]:
        """``NativeFiles``: the Arrow batches ``load`` would insert, as one IPC stream file."""
        pa = arrow("DuckDBSink")
        struct = _arrow_row(pa, columns)
        return write_stream(pa, path, struct, chunks, batch_rows=_BATCH_ROWS, table=self.table)

    def can_pull(self, plan: LoadPlan, files: int) -> bool:
        """``FilePulling``: lazy-plan's checks accept the plan, at most ``open_files_allowed()``
        files (file-artifact's stay open while the scan runs), and no source column is named
        as the pull's tag. A value the scanner refuses itself is not looked for first: the
        pull then fails, before the target, and Python reads."""
        if files not in (1, len(plan.bounds)) or files > open_files_allowed():
            return False
        if _BOUND_TAG in {column.name.lower() for column in plan.columns}:
            return False
        try:
            self._check(plan, pulling=True)
        except ConfigInvalid:
            return False
        except NativeTransferError:  # the source's own: Python's read would meet it too
            raise
        except Exception as error:  # DuckDB's, of any type (a message it cannot decode...)
            _reraise_interrupt(error)
            return False
        return True

    def pull_load_files(
        self, plan: LoadPlan, paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        """``FilePulling``: one ``sqlite_scan`` of the plan's partitions in a scratch in-memory
        database (never the target), each row tagged with its bound's index (the conditions of
        lazy-plan, so the same rows), its batches validated and written: to one file as they
        come, or split by bound (a stable sort of each batch) and gathered into batches of each
        bound's own file (``_Gathered``). Memory stays about ``_GATHERED_ROWS`` rows. None
        when the read failed or the source was written meanwhile (``watching_writes``)."""
        checked, self._checked = self._checked, None
        if checked is None or checked.plan is not plan or checked.scratch is None:
            raise InternalInvariantBroken(
                "DuckDBSink.pull_load_files was given a plan can_pull did not accept",
                diagnostics={"table": self.table},
            )
        source = pulled_file(plan, engine="DuckDB", table=self.table)
        sql, params = _tagged_scan(source, plan, checked.textual)
        try:
            with contextlib.closing(checked.scratch), watching_writes(source) as written:
                pa = arrow("DuckDBSink")
                pulled = _write_tagged(checked.scratch, pa, sql, params, paths, len(plan.bounds))
                if written():
                    raise _ReadThrownAway
                return pulled
        except Exception as error:  # of any type: DuckDB's message of a value may not decode
            _reraise_interrupt(error)
            for path in paths:  # a read that failed leaves nothing behind
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return None

    def carrier(self, column: Column) -> Carry | None:
        return duckdb_carrier(column)

    def column_difference(self, columns: Sequence[Column]) -> ColumnDifference | None:
        """``SchemaEvolving``: DuckDB matches column names case-insensitively (ASCII). A column of
        a type dpone makes takes only a source column it would make that type for; a type made
        by hand is left to DuckDB's own conversion."""
        with self._reader() as conn:
            if conn is None or not _table_exists(conn, self._target):
                return None
            described = conn.execute(f"DESCRIBE {self._target.sql()}").fetchall()
            wanted = {duckdb_type(column) for column in columns} | set(DUCKDB_TYPES.values())
            names = sorted(wanted)  # DuckDB's own spelling of each (TIMESTAMPTZ, ...)
            casts = ", ".join(f"typeof(CAST(NULL AS {name}))" for name in names)
            spelled = dict(zip(names, conn.execute(f"SELECT {casts}").fetchone(), strict=True))
        made = {spelled[name] for name in DUCKDB_TYPES.values()} | _NARROW_INTEGERS

        def takes(column: Column, target_type: str) -> bool:
            if spelled[duckdb_type(column)] == target_type:
                return True
            if column.kind == "integer" and (target_type == "HUGEINT" or _whole(target_type)):
                return True  # wider: every BIGINT fits
            return not (target_type in made or target_type.startswith("DECIMAL("))

        return difference(
            [(row[0], row[1]) for row in described], columns, fold=fold_ascii, takes=takes
        )

    def add_columns(self, columns: Sequence[Column]) -> None:
        with self._connect() as conn, _transaction(conn):
            for column in columns:
                conn.execute(
                    f"ALTER TABLE {self._target.sql()} ADD COLUMN {quote(column.name)}"
                    f" {duckdb_type(column)}"
                )

    def check_plan(self, plan: LoadPlan) -> None:
        """Refuse a plan this sink cannot pull, before anything touches the target."""
        self._check(plan, pulling=False)

    def _check(self, plan: LoadPlan, *, pulling: bool) -> None:
        """Refuse a plan the scanner would not read exactly; remember the one accepted, so that
        the load of this very plan need not check it again. The scanner itself reads the
        columns whose misread values it refuses (``_REFUSING_TYPES``): a pull as it writes its
        files, lazy-plan's check in one read before the target call (``_probe_plan_read``);
        SQLite looks for the other misread values. A pull's check keeps its scratch database
        (the scanner loaded, never the target) for the pull."""
        if self._checked is not None:
            self._checked.close()
            self._checked = None
        source = pulled_file(plan, engine="DuckDB", table=self.table)
        scratch = _scanner_connection(":memory:")
        try:
            types = _scan_types(scratch, source)
            refusing = [
                c.name for c in plan.columns if types.get(c.name) == _REFUSING_TYPES.get(c.kind)
            ]
            refuse_inexact_plan(
                source,
                plan.columns,
                engine="DuckDB",
                table=self.table,
                reader_refuses=refusing,
            )
            if not pulling:  # a pull validates what it writes
                _probe_plan_read(scratch, source, plan.columns, types, refusing, self.table)
            _plan_conditions(source, plan.bounds)  # bad bounds fail here, before any connection
            textual = {
                c for c in _text_bound_columns(source, plan.bounds) if types.get(c) != "VARCHAR"
            }
            if textual:
                self._check_text_matches(scratch, source, plan.bounds, textual)
        except BaseException:
            scratch.close()
            raise
        if not pulling:
            scratch.close()
            scratch = None
        self._checked = _Checked(plan=plan, textual=textual, scratch=scratch)

    def _check_text_matches(
        self, conn: Any, source: SQLiteFile, bounds: Any, textual: set[str]
    ) -> None:
        """A column DuckDB reads as a DATE or a number but SQLite holds as text is compared as
        text; refuse the plan unless DuckDB then selects exactly SQLite's rows."""
        for where, params, window in _plan_conditions(source, bounds, textual):
            selected = conn.execute(
                f"SELECT count(*) FROM sqlite_scan(?, ?) WHERE {where}", [*_scan(source), *params]
            ).fetchone()[0]
            expected = sum(source.count(item) for item in window)
            if selected != expected:
                raise PlanInexact(
                    f"lazy-plan into DuckDB cannot select the source's partitions of column(s) "
                    f"{', '.join(sorted(textual))} exactly (DuckDB reads them as another type "
                    "than SQLite stores): use legacy, staged or file-artifact",
                    diagnostics={"table": self.table, "columns": sorted(textual)},
                )

    def _load_plan(self, plan: LoadPlan) -> int:
        """DuckDB pulls the plan's partitions from the SQLite file with ``sqlite_scan``. Its
        scanner reads the file in rowid ranges, not in one snapshot: a row moved past the
        last range meanwhile was lost, with exit 0. So when another connection committed to
        the source during the copy (``watching_writes``), or the copy failed (the scanner
        waits for no lock: a writer's failed it), the copy is rolled back and the same target
        call loads the rows dpone reads itself (``plan_rows``), as legacy does."""
        checked = self._checked
        if checked is None or checked.plan is not plan or checked.scratch is not None:
            self.check_plan(plan)  # a pull's check is not lazy-plan's
            checked = self._checked
        assert checked is not None  # check_plan records it
        textual = checked.textual
        source = pulled_file(plan, engine="DuckDB", table=self.table)
        names = _names(plan.columns)
        scan = _scan(source)
        statements = _plan_conditions(source, plan.bounds, textual)
        with self._connect(scanner=True) as conn:
            try:
                with watching_writes(source) as written, _transaction(conn):
                    _fence_first(conn, self._ledger.peek())
                    _prepare_target(conn, self._target, plan.columns, replace=plan.replace)
                    try:
                        rows = sum(
                            conn.execute(
                                f"INSERT INTO {self._target.sql()} ({names}) SELECT {names}"
                                f" FROM sqlite_scan(?, ?) WHERE {where}",
                                [*scan, *params],
                            ).fetchone()[0]
                            for where, params, _ in statements
                        )
                    except _driver().Error:
                        raise _ReadThrownAway from None
                    if written():
                        raise _ReadThrownAway
                    return _record(conn, self._ledger.take(), rows)
            except _ReadThrownAway:  # the copy was rolled back
                pass
            read = plan_rows(source, plan.bounds, plan.columns)
            carriers = column_carriers(plan.columns, duckdb_carrier)
            chunks = carried_chunks(read, carriers, target="DuckDB")
            with _transaction(conn):
                _prepare_target(conn, self._target, plan.columns, replace=plan.replace)
                rows = _insert_rows(conn, self._target, plan.columns, chunks)
                return _record(conn, self._ledger.take(), rows)

    def stage(self, payload: RowChunks) -> int:
        """Fill a fresh staging table beside the target, from rows or from load files (as
        ``load``); the target is not touched."""
        stage, columns = self._stage, payload.columns
        with self._connect() as conn, _transaction(conn):
            conn.execute(f"DROP TABLE IF EXISTS {stage.sql()}")
            _create_table(conn, stage, columns)
            if isinstance(payload, LoadFiles):
                return _insert_files(conn, stage, columns, payload.files)
            return _insert_rows(conn, stage, columns, payload.chunks)

    def staged_row_count(self) -> int:
        with self._reader() as conn:
            return 0 if conn is None else _row_count(conn, self._stage)

    def finalize_staged_load(self, *, replace: bool = False) -> int:
        """Move staged rows into the target (by column name) and drop the staging table, at once.

        A missing target is the staging table, renamed: it has the columns and types the
        target would be created with, and its rows are not copied again.
        """
        stage, target = self._stage.sql(), self._target.sql()
        with self._connect() as conn, _transaction(conn):
            _fence_first(conn, self._ledger.peek())
            if not _table_exists(conn, self._stage):
                raise ConfigInvalid(
                    f"no staged load exists for target table {self.table!r}",
                    diagnostics={"table": self.table},
                )
            if not _table_exists(conn, self._target):
                conn.execute(f"ALTER TABLE {stage} RENAME TO {quote(self._target.name)}")
                return _record(conn, self._ledger.take(), _row_count(conn, self._target))
            if replace:
                conn.execute(f"DELETE FROM {target}")
            moved = conn.execute(f"INSERT INTO {target} BY NAME FROM {stage}").fetchone()[0]
            conn.execute(f"DROP TABLE {stage}")
            return _record(conn, self._ledger.take(), moved)

    def _read_only(self, what: str) -> Any:
        """A read-only connection to the target file, or ``TargetUnavailable``."""
        duckdb = _driver()
        try:
            return _open(self.path, self.table, read_only=True)
        except duckdb.Error:
            pass
        raise TargetUnavailable(
            f"the target database of table {self.table!r} cannot be opened to read its "
            f"{what} now (locked or damaged); nothing was written",
            diagnostics={"table": self.table},
        )

    def read_rejects(self) -> list[tuple]:
        """``Quarantining``: this table's rows set aside, oldest first. Reads only."""
        if not os.path.isfile(self.path):
            return []
        conn = self._read_only("rejects")
        try:
            if not _table_exists(conn, TableName(None, REJECTS_TABLE)):
                return []
            sql = rejects_query(quote(REJECTS_TABLE), "?") + " ORDER BY rowid"
            return conn.execute(sql, [self.identity().table]).fetchall()
        finally:
            conn.close()

    def fence_epoch(self) -> int:
        """``Fencing``: the target table's fence in ``_dpone_fence``; 0 without one."""
        if not os.path.isfile(self.path):
            return 0
        conn = self._read_only("fence")
        try:
            if not _table_exists(conn, TableName(None, FENCE_TABLE)):
                return 0
            return read_fence(_query(conn), self.identity().table, **_FENCE_AT)
        finally:
            conn.close()

    def advance_fence(self, epoch: int) -> int:
        """``Fencing``: raise the fence to ``epoch`` in a transaction of its own."""
        duckdb = _driver()
        try:
            with self._connect() as conn, _transaction(conn):
                return advance_fence(_query(conn), self.identity().table, epoch, **_FENCE)
        except duckdb.Error:
            pass
        raise unavailable(self.table, to="have its fence raised")

    def read_ledger(self, *, partitions: bool = False) -> list[LedgerEntry]:
        """The ledger entries of this target table, oldest first (a read-only connection)."""
        if not os.path.isfile(self.path):
            return []
        conn = self._read_only("ledger")
        try:
            if not _table_exists(conn, _LEDGER):
                return []
            described = conn.execute(f"DESCRIBE {quote(LEDGER_TABLE)}").fetchall()
            check_ledger_columns({row[0] for row in described})
            rows = conn.execute(
                ledger_query("?", partitions=partitions), [self.identity().table]
            ).fetchall()
        finally:
            conn.close()
        return [LedgerEntry.from_row(*row) for row in rows]

    def row_count(self) -> int:
        with self._reader() as conn:
            return 0 if conn is None else _row_count(conn, self._target)

    def is_empty(self) -> bool:
        return self.row_count() == 0  # DuckDB counts from table metadata

    inserts_end_with_their_process = True  # BatchCounting: the load runs in the worker

    def batch_rows(self, column: str, batch_id: str) -> int:
        """``BatchCounting``: rows whose ``column`` holds ``batch_id``; 0 without it."""
        with self._reader() as conn:
            if conn is None or not _table_exists(conn, self._target):
                return 0
            names = [row[0] for row in conn.execute(f"DESCRIBE {self._target.sql()}").fetchall()]
            if column not in names:
                return 0
            sql = f"SELECT count(*) FROM {self._target.sql()} WHERE {quote(column)} = ?"
            return int(conn.execute(sql, [batch_id]).fetchone()[0])

    def rows(self) -> list[tuple]:
        with self._reader() as conn:
            if conn is None or not _table_exists(conn, self._target):
                return []
            return conn.execute(f"SELECT * FROM {self._target.sql()} ORDER BY rowid").fetchall()


@contextlib.contextmanager
def _transaction(conn: Any) -> Iterator[None]:
    """BEGIN ... COMMIT; any exception, even a BaseException, rolls back and re-raises."""
    conn.execute("BEGIN TRANSACTION")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(_driver().Error):
            conn.execute("ROLLBACK")
        raise


def _scan(source: SQLiteFile) -> list[str]:
    return [os.path.abspath(source.path), source.table]


def _scanner_connection(path: str, table: str = "") -> Any:
    """A connection to ``path`` with the sqlite scanner loaded (``_SCANNER_CONFIG``); an
    extension file DuckDB refuses to load (built for another DuckDB) is ``_no_scanner``."""
    duckdb = _driver()
    extension = _sqlite_extension(duckdb)  # a missing wheel fails before any connection
    conn = _open(path, table, config=_SCANNER_CONFIG)
    try:
        conn.execute("LOAD '" + extension.replace("'", "''") + "'")
    except duckdb.Error:
        conn.close()
        raise _no_scanner(duckdb.__version__) from None
    except BaseException:
        conn.close()
        raise
    return conn


def _open(
    path: str, table: str, *, read_only: bool = False, config: Mapping[str, Any] = _CONFIG
) -> Any:
    """``duckdb.connect``; a file this DuckDB cannot read because of its storage version is
    ``TargetVersionUnsupported`` (``_unreadable_version``), any other failure DuckDB's own."""
    duckdb = _driver()
    try:
        return duckdb.connect(path, read_only=read_only, config=dict(config))
    except duckdb.Error as error:
        refused = _unreadable_version(path, table, duckdb.__version__, str(error))
        if refused is not None:
            raise refused from None
        raise


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


@attrs.define(kw_only=True)
class _Checked:
    """A plan ``_check`` accepted. ``textual``: its partition and cursor columns compared as
    text. DuckDB types a column by its declared type (``DATE``, ``TIMESTAMP``, ...), while
    SQLite's partition values are what it stores, often text: comparing a DATE with text
    fails, so such a column is compared as text (``CAST ... AS VARCHAR``), and ``_check``
    proves that this selects exactly SQLite's rows. ``scratch``: a pull's database."""

    plan: LoadPlan
    textual: set[str]
    scratch: Any = None

    def close(self) -> None:
        if self.scratch is not None:
            self.scratch.close()


def _probe_plan_read(
    conn: Any,
    source: SQLiteFile,
    columns: Sequence[Column],
    types: Mapping[str, str],
    refusing: Collection[str],
    table: str,
) -> None:
    """Before lazy-plan's target call, read what its load will read that could fail it (the
    route then blocked): every column whose misread values the scanner refuses (a read of
    such a value fails), and every VARCHAR, for a text that is not UTF-8 (the scanner reads
    its bytes; DuckDB's ``decode`` tells). One scan, 0.09 s per million rows of four columns,
    where SQLite's own ``typeof`` tests took 0.23 s. A failed read has SQLite name the
    columns (``refuse_inexact_plan``); the refusal is ``inexact_plan``'s either way."""
    texts = [column.name for column in columns if types.get(column.name) == "VARCHAR"]
    counted = [name for name in refusing if name not in texts]
    tests = [
        f"coalesce(bool_or(try(decode(encode({quote(n)}))) IS NULL AND {quote(n)} IS NOT NULL),"
        " false)"
        for n in texts
    ] + [f"count({quote(name)}) < 0" for name in counted]
    if not tests:
        return
    try:
        found = conn.execute(f"SELECT {', '.join(tests)} FROM sqlite_scan(?, ?)", _scan(source))
        failing = [name for name, bad in zip(texts, found.fetchone(), strict=False) if bad]
    except Exception as error:  # DuckDB's, of any type (a message it cannot decode...)
        _reraise_interrupt(error)
        refuse_inexact_plan(source, columns, engine="DuckDB", table=table)
        failing = [*texts, *counted]  # SQLite found nothing: the scanner cannot read them
    if failing:
        raise inexact_plan("DuckDB", table, failing)


def _scan_types(conn: Any, source: SQLiteFile) -> dict[str, str]:
    """Each source column's type as the scanner reads it (``conn`` has the scanner); none when
    it cannot read the file (SQLite's own read then says why, as a ``SourceInvalid``)."""
    try:
        described = conn.execute("DESCRIBE SELECT * FROM sqlite_scan(?, ?)", _scan(source))
    except _driver().Error:
        return {}
    return {row[0]: row[1] for row in described.fetchall()}


def _text_bound_columns(source: SQLiteFile, bounds: Sequence[Mapping[str, Any]]) -> set[str]:
    """The partition and cursor columns some bound compares with a text value."""
    keys = {
        source.partition_column: ("partition", "partition_from", "partition_below"),
        source.cursor_column: ("cursor_after", "cursor_upto"),
    }
    return {
        column
        for column, names in keys.items()
        if column is not None and any(isinstance(b.get(key), str) for b in bounds for key in names)
    }


def _plan_conditions(
    source: SQLiteFile,
    bounds: Sequence[Mapping[str, Any]],
    textual: Collection[str] = (),
) -> list[tuple[str, list[Any], list[Mapping[str, Any]]]]:
    """One condition per cursor window, selecting all of the window's planned partitions,
    with the window's bounds.

    ``sqlite_scan`` pushes no filter down to SQLite, so every statement reads
    the whole table: one statement per window instead of one per partition.
    Columns in ``textual`` are compared as text.
    """

    def name(column: str) -> str:
        return f"CAST({quote(column)} AS VARCHAR)" if column in textual else quote(column)

    def predicates_of(item: Mapping[str, Any]) -> tuple[Predicate, ...]:
        return bound_predicates(
            item, partition_column=source.partition_column, cursor_column=source.cursor_column
        )

    windows: dict[tuple[Any, Any], tuple[list[Predicate], list[Mapping[str, Any]]]] = {}
    for item in bounds:
        predicates = predicates_of(item)  # bad bounds fail here, before the target
        window = [predicate for predicate in predicates if predicate.op in WINDOW_OPERATORS]
        key = (item.get("cursor_after"), item.get("cursor_upto"))
        windows.setdefault(key, (window, []))[1].append(item)
    partition = name(source.partition_column)
    conditions = []
    for window, items in windows.values():
        values = [item["partition"] for item in items if "partition" in item]
        known = [value for value in values if value is not None]
        matches, params = [], []
        if known:
            matches.append(f"{partition} IN (SELECT UNNEST(?))")
            params.append(known)
        if len(known) < len(values):
            matches.append(f"{partition} IS NULL")
        ranges = [item for item in items if "partition" not in item]
        if ranges and not known and ranges_run_on(ranges):  # every key: 1,000 ORs took 3 s
            matches.append(f"{partition} IS NOT NULL")
            ranges = []
        for item in ranges:  # a key range: its own condition
            ranged = [p for p in predicates_of(item) if p not in window]
            where, range_params = render_predicates(ranged, marker="?", name=name)
            matches.append(f"({where})")
            params += range_params
        where, window_params = render_predicates(window, marker="?", name=name)
        match = "(" + " OR ".join(matches) + ")"
        condition = f"{match} AND {where}" if where else match
        conditions.append((condition, params + window_params, items))
    return conditions


def _tagged_scan(source: SQLiteFile, plan: LoadPlan, textual: Collection[str]) -> tuple[str, list]:
    """The plan's rows with the index of the bound each belongs to (``_BOUND_TAG``); rows of
    no bound (a partition that appeared after planning) are left out. Partitions of one value
    each in one cursor window are tagged by a hash join on their values (a 100-way ``CASE``
    costs three times as much); other bounds by their own conditions."""

    def name(column: str) -> str:
        ref = f"s.{quote(column)}"
        return f"CAST({ref} AS VARCHAR)" if column in textual else ref

    predicates = [
        bound_predicates(
            bounds, partition_column=source.partition_column, cursor_column=source.cursor_column
        )
        for bounds in plan.bounds
    ]
    window = predicates[0][1:]
    values = [p[0].value for p in predicates]
    tag, names = quote(_BOUND_TAG), ", ".join(f"s.{quote(c.name)}" for c in plan.columns)
    if all(p[0].op in ("=", "IS NULL") and p[1:] == window for p in predicates) and len(
        {(type(value), value) for value in values}
    ) == len(values):
        where, params = render_predicates(window, marker="?", name=name)
        sql = (
            f"SELECT {names}, b.{tag} FROM sqlite_scan(?, ?) AS s JOIN (SELECT UNNEST(?) AS v,"
            f" UNNEST(range(?)) AS {tag}) AS b ON {name(source.partition_column)}"
            " IS NOT DISTINCT FROM b.v"
        )
        return sql + (f" WHERE {where}" if where else ""), [
            *_scan(source),
            values,
            len(values),
            *params,
        ]
    ranged = _integer_ranges(source, plan, textual, name)
    if ranged is not None:
        return ranged
    cases, params = [], []
    for index, bound in enumerate(predicates):
        where, bound_params = render_predicates(bound, marker="?", name=name)
        cases.append(f"WHEN {where or 'TRUE'} THEN {index}")
        params += bound_params
    sql = (
        f"SELECT * FROM (SELECT {names}, CASE {' '.join(cases)} END AS {tag}"
        f" FROM sqlite_scan(?, ?) AS s) WHERE {tag} IS NOT NULL"
    )
    return sql, [*params, *_scan(source)]


def _integer_ranges(
    source: SQLiteFile, plan: LoadPlan, textual: Collection[str], name: Callable[[str], str]
) -> tuple[str, list] | None:
    """``_tagged_scan`` of integer key ranges that run on (``integer_range_starts``), and the
    NULL key's partition, in one cursor window: each row tagged by an ``ASOF`` join on the
    ranges' starts, where a ``CASE`` of each range's condition took 9 s for 1,000 ranges of
    1,000,000 rows. None for other plans, or a key DuckDB does not read as integers."""
    key_column = source.partition_column
    kinds = {column.name: column.kind for column in plan.columns}
    if kinds.get(key_column) != "integer" or key_column in textual:
        return None
    nulls = [n for n, b in enumerate(plan.bounds) if "partition" in b]
    if len(nulls) > 1 or any(plan.bounds[n]["partition"] is not None for n in nulls):
        return None
    numbers = [n for n in range(len(plan.bounds)) if n not in nulls]
    found = integer_range_starts([plan.bounds[n] for n in numbers])
    windows = [cursor_window(b) for b in plan.bounds]
    if found is None or any(window != windows[0] for window in windows):
        return None
    starts, below = found
    first = plan.bounds[numbers[0]]
    window = bound_predicates(
        first, partition_column=key_column, cursor_column=source.cursor_column
    )[partition_predicate_count(first) :]
    where, params = render_predicates(window, marker="?", name=name)
    key, tag = name(key_column), quote(_BOUND_TAG)
    keyed = f"{key} >= ?" + (f" AND {key} < ?" if below is not None else "")
    keys = f"({keyed} OR {key} IS NULL)" if nulls else keyed
    conditions = [keys, *([where] if where else [])]
    names = ", ".join(f"s.{quote(c.name)}" for c in plan.columns)
    null_tag = nulls[0] if nulls else "NULL"
    sql = (
        f"SELECT {names}, CASE WHEN {key} IS NULL THEN {null_tag} ELSE b.{tag} END AS {tag}"
        f" FROM sqlite_scan(?, ?) AS s ASOF LEFT JOIN (SELECT UNNEST(?::BIGINT[]) AS start,"
        f" UNNEST(?::INTEGER[]) AS {tag}) AS b ON {key} >= b.start"
        f" WHERE {' AND '.join(conditions)}"
    )
    return sql, [
        *_scan(source),
        starts,
        numbers,
        min(starts),
        *([below] if below is not None else []),
        *params,
    ]


def _reraise_interrupt(error: Exception) -> None:
    """Re-raise what DuckDB made of a signal during its query: the exception the signal's
    handler raised (Ctrl-C's KeyboardInterrupt, the CLI's SIGTERM, a scheduler's own) becomes
    RuntimeError("Query interrupted"). That is no failed read to fall back from: the pull
    that took it for one read the rows again in Python, and a SIGTERM'd run ended with 0."""
    if type(error) is RuntimeError and str(error) == "Query interrupted":
        raise error


class _ReadThrownAway(Exception):
    """DuckDB's read of the source cannot be kept: it failed, or another connection committed
    to the source meanwhile."""


def _write_tagged(
    conn: Any, pa: Any, sql: str, params: list, paths: Sequence[Path], bounds: int
) -> tuple[list[LoadFile], list[int]]:
    """Run ``_tagged_scan``'s query on ``conn`` (the scanner loaded) and write its batches
    without the tag: all to one file, or each bound's rows to its own file (``paths[index]``),
    gathered into batches of its own (``_Gathered``)."""
    pc: Any = import_driver("pyarrow.compute", needed_by="DuckDBSink")
    counts = [0] * bounds
    with contextlib.ExitStack() as stack:
        reader = conn.execute(sql, params).to_arrow_reader(_BATCH_ROWS)
        width = reader.schema.get_field_index(_BOUND_TAG)
        schema = reader.schema.remove(width)
        writers = [DigestWriter(stack.enter_context(create_private(path))) for path in paths]
        streams = [stack.enter_context(pa.ipc.new_stream(w, schema)) for w in writers]
        gathered = _Gathered(pa, streams)
        for batch in stack.enter_context(read_ahead(reader)):
            batch.validate(full=True)  # a SQLite text that is not UTF-8: DuckDB reads its bytes
            tags, data = batch.column(width), batch.select(range(width))
            if len(streams) > 1:
                order = pc.sort_indices(tags)  # stable: each bound keeps the scan's order
                tags, data = tags.take(order), data.take(order)
            offset = 0
            for entry in pc.value_counts(tags).to_pylist():  # sorted tags: in ascending order
                index, rows = entry["values"], entry["counts"]
                counts[index] += rows
                if len(streams) > 1:
                    gathered.add(index, data.slice(offset, rows))
                offset += rows
            if len(streams) == 1:
                streams[0].write_batch(data)
        gathered.flush()
    totals = [sum(counts)] if len(paths) == 1 else counts
    files = [
        LoadFile(path=path, rows=rows, sha256=writer.sha256, native=True)
        for path, rows, writer in zip(paths, totals, writers, strict=True)
    ]
    return files, counts


class _Gathered:
    """Each file's rows of a scan, held until ``_GATHERED_ROWS`` rows of all files wait, then
    written as one batch per file: a scan's batch spread over 100 files gave batches of 500
    rows, and DuckDB loads many small batches slowly. Memory stays about that many rows."""

    def __init__(self, pa: Any, streams: Sequence[Any]) -> None:
        self.pa, self.streams = pa, streams
        self.waiting: dict[int, list[Any]] = {}
        self.rows = 0

    def add(self, index: int, rows: Any) -> None:
        self.waiting.setdefault(index, []).append(rows)
        self.rows += rows.num_rows
        if self.rows >= _GATHERED_ROWS:
            self.flush()

    def flush(self) -> None:
        for index, parts in sorted(self.waiting.items()):
            table = self.pa.Table.from_batches(parts).combine_chunks()
            for batch in table.to_batches():  # one, after combine_chunks
                self.streams[index].write_batch(batch)
        self.waiting, self.rows = {}, 0


def _fence_first(conn: Any, entry: LedgerEntry | None) -> None:
    if entry is not None and _table_exists(conn, TableName(None, FENCE_TABLE)):
        fence_first(_query(conn), entry, **_FENCE_AT)


def _query(conn: Any) -> Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]:
    return lambda sql, params: conn.execute(sql, list(params)).fetchall()


def _record(conn: Any, ledger: LedgerEntry | None, rows: int) -> int:
    """Inside the load's transaction: check the rows applied and the fence, then write the
    batch's ledger row; returns ``rows``.

    The next ``seq`` is read first and the row inserted with ``VALUES``: DuckDB binds a text
    parameter of an ``INSERT ... SELECT`` in time that grows with the square of its single
    quotes, and the row's partition list holds every partition's bounds (2,048 partitions
    of 4,000-character values took about 200 s)."""
    if ledger is not None:
        check_applied(ledger, rows)
        fence_batch(_query(conn), ledger, **_FENCE)
        table = quote(LEDGER_TABLE)
        integer = "BIGINT NOT NULL"
        conn.execute(ledger_table_sql(table, seq=integer, integer=integer, text="VARCHAR NOT NULL"))
        (seq,) = conn.execute(f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {table}").fetchone()
        target, batch, entry, partitions = ledger.row()
        conn.execute(
            f"INSERT INTO {table} VALUES (?, ?, ?, ?, ?, ?)",
            [seq, target, batch, rows, entry, partitions],
        )
        if ledger.rejects:
            conn.execute(rejects_table_sql(quote(REJECTS_TABLE), text="VARCHAR"))
            write_rejects(conn.executemany, ledger.rejects, target_table=target, batch_id=batch,
                          table=quote(REJECTS_TABLE), marker="?")  # fmt: skip
    return rows


def _create_table(conn: Any, table: TableName, columns: Sequence[Column]) -> None:
    if not columns:
        raise ConfigInvalid("at least one column is required")
    definitions = ", ".join(f"{quote(column.name)} {duckdb_type(column)}" for column in columns)
    if table.schema is not None:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(table.schema)}")
    conn.execute(f"CREATE TABLE IF NOT EXISTS {table.sql()} ({definitions})")


def _prepare_target(
    conn: Any, table: TableName, columns: Sequence[Column], *, replace: bool
) -> None:
    _create_table(conn, table, columns)
    if replace:
        conn.execute(f"DELETE FROM {table.sql()}")


def _insert_rows(
    conn: Any, table: TableName, columns: Sequence[Column], chunks: Iterable[Sequence[tuple]]
) -> int:
    """Insert row chunks, one statement per batch: an Arrow batch DuckDB reads in bulk, or,
    for a batch Arrow cannot hold exactly, one list per column (``_unnest_batch``)."""
    names = _names(columns)
    pa = arrow("DuckDBSink")
    struct = _arrow_row(pa, columns)
    written = 0
    for rows in _batches(chunks):
        check_widths(rows, len(columns), table.name)
        batch = row_batch(pa, struct, rows)
        if batch is None:
            written += _unnest_batch(conn, table, names, rows)
        else:
            written += _insert_arrow(conn, table, names, batch)
    return written


def _insert_files(
    conn: Any, table: TableName, columns: Sequence[Column], files: Sequence[LoadFile]
) -> int:
    """Each run of native files in one INSERT, their batches straight from the files; a spool
    file's rows as chunks. One INSERT per file would cost a statement each (file-artifact:
    a file per partition)."""
    rows = 0
    for native, run in itertools.groupby(files, key=lambda file: file.native):
        if native:
            rows += _insert_native(conn, table, columns, list(run))
        else:
            for file in run:
                chunks = read_chunks(file.path, file.sha256)
                rows += _insert_rows(conn, table, columns, chunks)
    return rows


def _insert_native(
    conn: Any, table: TableName, columns: Sequence[Column], files: Sequence[LoadFile]
) -> int:
    """The files' batches as Arrow streams of up to ``_INSERT_ROWS`` rows, one INSERT each,
    every file hashed as DuckDB reads it and opened only when reached; a file whose digest
    differs fails the load before it commits. One INSERT per file costs a statement each
    (file-artifact: a file per partition); one INSERT of everything holds twice the memory
    (10,000,000 rows: 640 MiB peak, against 360 MiB in INSERTs of 1,000,000)."""
    pa = arrow("DuckDBSink")
    changed: list[ArtifactInvalid] = []

    def batches(file: LoadFile) -> Iterator[Any]:
        with DigestReader(file.path, file.sha256) as reader:
            yield from pa.ipc.open_stream(reader)
            try:
                reader.verify()
            except ArtifactInvalid as error:  # raised here, DuckDB would wrap it
                changed.append(error)

    with open(files[0].path, "rb") as first:
        schema = pa.ipc.open_stream(first).schema
    written = 0
    with read_ahead(itertools.chain.from_iterable(batches(file) for file in files)) as stream:
        pending = [next(stream, None)]

        def up_to_limit() -> Iterator[Any]:
            rows = 0
            while pending[0] is not None and (
                not rows or rows + pending[0].num_rows <= _INSERT_ROWS
            ):
                batch = pending[0]
                rows += batch.num_rows
                yield batch
                pending[0] = next(stream, None)

        while pending[0] is not None:
            part = pa.RecordBatchReader.from_batches(schema, up_to_limit())
            written += _insert_arrow(conn, table, _names(columns), part)
    if changed:
        raise changed[0]
    return written


def _insert_arrow(conn: Any, table: TableName, names: str, data: Any) -> int:
    """``INSERT ... SELECT * FROM`` an Arrow batch or stream reader DuckDB scans in bulk."""
    view = f"__dpone_rows_{secrets.token_hex(8)}"  # never the name of a table of the file
    conn.register(view, data)
    try:
        sql = f"INSERT INTO {table.sql()} ({names}) SELECT * FROM {quote(view)}"
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.unregister(view)


def _arrow_row(pa: Any, columns: Sequence[Column]) -> Any:
    """The Arrow struct of one row; DuckDB casts text to every other type on insert, as it
    casts the carriers' text."""
    types = [_ARROW_TYPES.get(duckdb_type(column), "large_string") for column in columns]
    return row_type(pa, [(f"c{index}", kind) for index, kind in enumerate(types)])


_ARROW_TYPES = {"BIGINT": "int64", "DOUBLE": "float64", "BOOLEAN": "bool_", "BLOB": "large_binary"}


def _unnest_batch(conn: Any, table: TableName, names: str, rows: Sequence[tuple]) -> int:
    """One ``INSERT ... SELECT UNNEST($1), ...`` with one list per column: DuckDB converts each
    Python value itself, and casts the text of a NaN back to NaN."""
    by_column = [[row[index] for row in rows] for index in range(len(rows[0]))]
    unnest = ", ".join(f"UNNEST(${number})" for number in range(1, len(by_column) + 1))
    sql = f"INSERT INTO {table.sql()} ({names}) SELECT {unnest}"
    return conn.execute(sql, by_column).fetchone()[0]


def _batches(chunks: Iterable[Sequence[tuple]]) -> Iterator[Sequence[tuple]]:
    """Chunks joined into batches of about ``_BATCH_ROWS`` rows; a large chunk passes as is."""
    batch: list[tuple] = []
    for chunk in chunks:
        if not batch and len(chunk) >= _BATCH_ROWS:
            yield chunk
            continue
        batch.extend(chunk)
        if len(batch) >= _BATCH_ROWS:
            yield batch
            batch = []
    if batch:
        yield batch


def _table_exists(conn: Any, table: TableName) -> bool:
    """DuckDB matches table and schema names case-insensitively (ASCII only), even quoted;
    so does this. An unqualified table is looked up in the current schema."""
    rows = conn.execute(
        "SELECT schema_name, table_name FROM duckdb_tables()"
        " WHERE database_name = current_database()"
        " AND (? IS NOT NULL OR schema_name = current_schema())",
        [table.schema],
    ).fetchall()
    wanted = (None if table.schema is None else fold_ascii(table.schema), fold_ascii(table.name))
    return any(
        (wanted[0] is None or fold_ascii(schema) == wanted[0]) and fold_ascii(name) == wanted[1]
        for schema, name in rows
    )


def _row_count(conn: Any, table: TableName) -> int:
    if not _table_exists(conn, table):
        return 0
    return conn.execute(f"SELECT count(*) FROM {table.sql()}").fetchone()[0]
