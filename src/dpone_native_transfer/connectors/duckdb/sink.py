"""DuckDB sink: one table of a DuckDB file, loaded on all four transfer paths.

Every call takes its own connection and closes it before returning: a cursor of the
file's database kept open while a run holds connections (``connect.target_connection``),
else a connection of its own (DuckDB lets one process at a time write a file). Every
load is one transaction, with its ledger row (and fence, rejects), and writes to one file
take turns in the process (``connect.one_writer``). ``duckdb`` is the
optional ``duckdb`` extra, imported on first use (``connect.py``).

Rows reach DuckDB in bulk (``bulk.py``), each value carried exactly by its column's kind
(``columns.py``). A lazy plan over a SQLite source is pulled by the ``sqlite_scanner``
extension (``scan.py``). Errors raised here on purpose name tables only, never a file
path, SQL or a DuckDB message.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from ...artifacts import open_files_allowed
from ...column_types import Carry, carried_chunks, column_carriers
from ...drivers import holding_connections
from ...errors import (
    ConfigInvalid,
    InternalInvariantBroken,
    NativeTransferError,
    TargetRowsMismatch,
    TargetUnavailable,
)
from ...identity import TableIdentity, file_location, fold_ascii
from ...ledger import (
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
    not_dpones,
    read_fence,
)
from ...payloads import Column, LoadFile, LoadFiles, LoadPlan, Merge, RowChunks
from ...rejects import REJECTS_TABLE, rejects_query, rejects_table_sql, write_rejects
from .._arrow import arrow
from .._merge import (
    INEXACT_TYPE,
    LOOSE_KEY,
    LOOSE_VERSION,
    MERGE_BATCH,
    NARROWER,
    inexactly_held,
    key_constraint,
    loosely_compared_key,
    loosely_ordered_version,
    merge_statements,
    narrower_unique,
    refuse_text_compared,
    unmergeable,
    upsert_statements,
)
from .._sql import (
    OWN_TABLES,
    STAGE_PREFIX,
    ColumnDifference,
    FileTarget,
    TableName,
    before_commit,
    check_target_folder,
    check_target_table,
    check_writable,
    difference,
    load_failures,
    own_name_taken,
    parse_table,
    quote,
    refuse_folded_twins,
    refuse_reserved_schema,
    unavailable,
    unwritable,
)
from ..contract import PlanInexact, SinkFeatures
from ..contract.engine import EnginePull
from ..contract.postgres_table import PostgresTable
from ..contract.sqlite_file import SQLiteFile
from ..sqlite_reading import (
    NOT_A_NUMBER,
    NOT_AN_INTEGER,
    held_as_declared,
    narrow_plan,
    plan_rows,
    pulled_file,
    refuse_inexact_plan,
    watching_writes,
)
from .bulk import insert_files, insert_rows, write_arrow_file, write_tagged
from .columns import DUCKDB_TYPES, MAX_DECIMAL_WIDTH, column_names, duckdb_carrier, duckdb_type
from .connect import (
    binding_ready,
    duckdb_driver,
    one_writer,
    postgres_scanner_loads,
    reraise_interrupt,
    run,
    scratch_connection,
    target_connection,
)
from .scan import (
    BOUND_TAG,
    REFUSING_TYPES,
    plan_conditions,
    probe_instants,
    probe_numbers,
    probe_plan_read,
    scan_params,
    scan_types,
    scanned_instants,
    scanned_numbers,
    tagged_scan,
    text_bound_columns,
)

__all__ = ["DuckDBSink"]

_FENCE_AT: dict[str, Any] = {"table": quote(FENCE_TABLE), "marker": "?"}
_LEDGER = quote(LEDGER_TABLE)
_FENCE: dict[str, Any] = {**_FENCE_AT, "text": "VARCHAR NOT NULL", "integer": "BIGINT NOT NULL"}
_RESERVED_SCHEMAS = ("temp", "system", "information_schema", "pg_catalog")

# Integer types narrower than BIGINT (or unsigned): DuckDB fails or wraps on wider values.
_NARROW_INTEGERS = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT"}
)


def _holds_exactly(column: Column, target_type: str, made: str) -> bool:
    """Whether a merge's key or cursor column of ``target_type`` keeps each source value as
    it is: the type dpone makes (``made``, DuckDB's spelling), any integer for an integer
    (too big a value fails the load), text for text (a collation is checked apart).
    ``FLOAT`` rounds an integer above 2**24, ``TIMESTAMP_S`` a timestamp's fraction."""
    if target_type == made:
        return True
    if column.kind == "integer":
        return (
            target_type in _NARROW_INTEGERS
            or target_type == "HUGEINT"
            or bool(re.fullmatch(r"DECIMAL\(\d+,0\)", target_type))
        )
    return column.kind == "text" and target_type == "VARCHAR"


def _whole(target_type: str) -> bool:
    """A ``DECIMAL(p,0)`` that holds every BIGINT (p >= 19)."""
    found = re.fullmatch(r"DECIMAL\((\d+),0\)", target_type)
    return found is not None and int(found.group(1)) >= 19


def _whole_decimal(column: Column) -> bool:
    """A ``DECIMAL(p,0)`` column: SQLite's NUMERIC affinity keeps a whole real out of an
    ordinary table's, so only a view's can hold one (``NOT_AN_INTEGER``)."""
    decimal = column.decimal(MAX_DECIMAL_WIDTH)
    return decimal is not None and decimal[1] == 0


class DuckDBSink(FileTarget, EnginePull):
    """Writes one target table of a DuckDB file, each load in a single transaction, with its
    ledger row (and fence, rejects) in that transaction. Its engine reads Arrow files and
    pulls SQLite sources itself (``sqlite_scan``)."""

    features = SinkFeatures(name="DuckDB", merges=True)
    pulled_suffix = ".arrows"  # an Arrow IPC stream
    reads_bulk_files = True  # DuckDB casts each exact Arrow type to its column's exactly

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
        if "?" in os.path.dirname(os.path.abspath(self.path)):
            raise ConfigInvalid(  # its commit failed inside the target call: a blocked route
                f"the DuckDB file of target table {table!r} is in a folder whose path holds a "
                "'?': DuckDB makes its write-ahead log's path by cutting there, so every "
                "commit fails; move the file to a folder without one",
                diagnostics={"key": "target.path", "table": table},
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
        driver = duckdb_driver()
        check_target_folder(self.path, self.table)
        check_writable(self.path, self.table)
        if not os.path.isfile(self.path):
            return
        try:
            with target_connection(self.path, self.table) as conn:
                views = _Catalog.of(conn, kind="view")
                view, taken = views.has(self._target), sorted(views.own().values())
        except driver.Error:
            raise unavailable(self.table) from None
        if view:  # a load would create no table beside it and fail inside the target call
            raise TargetRowsMismatch.rewriting(self.table, 1)
        if taken:
            raise own_name_taken(self.table, taken[0])

    def check_merge(self, merge: Merge, columns: Sequence[Column]) -> None:
        """A primary key or unique constraint on part of the key, or a key compared by a looser
        collation than the batch's (``COLLATE NOCASE``), would meet two batch keys as one:
        both inserted, the constraint violated inside the target call. A key or cursor kept
        as text is refused whatever the table (``refuse_text_compared``)."""
        refuse_text_compared(
            merge, columns, kept_as_text=lambda c: duckdb_type(c) == "VARCHAR", target="DuckDB"
        )
        with self._reader() as conn:
            if conn is None or not _table_exists(conn, self._target):
                return
            if _narrower(conn, self._target, merge):
                raise unmergeable(self.table, NARROWER)

            def count(sql: str) -> int:
                return int(conn.execute(sql).fetchone()[0])

            def holds(column: Column, target_type: str) -> bool:
                made = conn.execute(f"SELECT typeof(CAST(NULL AS {duckdb_type(column)}))")
                return _holds_exactly(column, target_type, made.fetchone()[0])

            column = loosely_compared_key(count, self._target.sql(), merge, columns)
            version = loosely_ordered_version(count, self._target.sql(), merge, columns)
            held = {fold_ascii(row[0]): row[1] for row in _described(conn, self._target.sql())}
            typed = {
                c.name: held[fold_ascii(c.name)] for c in columns if fold_ascii(c.name) in held
            }
            inexact = inexactly_held(merge, columns, typed, holds)
        if column is not None:
            raise unmergeable(self.table, LOOSE_KEY, column=column)
        if version is not None:
            raise unmergeable(self.table, LOOSE_VERSION, column=version)
        if inexact is not None:
            raise unmergeable(self.table, INEXACT_TYPE, column=inexact)

    def holding_connection(self) -> contextlib.AbstractContextManager[None]:
        """The attempt's calls share one open of the file (``connect.target_connection``), as
        a run of the command line's already did: a library run opened it seven times, some 9 ms
        each whatever the file's size (docs/performance.md, fix 78)."""
        return holding_connections()

    @contextlib.contextmanager
    def _connect(self, *, scanner: bool = False, writing: bool = True) -> Iterator[Any]:
        """The target file; ``scanner``: with the sqlite scanner loaded. ``writing``: one
        such connection at a time per file in this process (``one_writer``), so that the
        routes of one file running in threads never race to create its shared tables
        (``_dpone_fence``, the ledger) nor read the same next ledger ``seq``."""
        check_target_folder(self.path, self.table)
        with (
            one_writer(self.path) if writing else contextlib.nullcontext(),
            target_connection(self.path, self.table, scanner=scanner) as conn,
        ):
            yield conn

    def _reader(self) -> contextlib.AbstractContextManager[Any]:
        """A connection to read the file (not one writer's; ``TargetUnavailable`` when it cannot
        be opened now), or None while it does not exist."""
        if not os.path.isfile(self.path):
            return contextlib.nullcontext(None)
        check_target_folder(self.path, self.table)
        return self._read_only("table")

    def _refused(self) -> contextlib.AbstractContextManager[None]:
        """Around a target call's transaction: a constraint (``ConstraintException``) or a
        column's type (``ConversionException``, ``OutOfRangeException``: a hand-made ENUM,
        DECIMAL...) refusing a row, rolled back; any other DuckDB error before the COMMIT
        (out of memory, a full disk) rolled back too (``load_failures``)."""
        driver = duckdb_driver()
        refusals = (driver.IntegrityError, driver.DataError)
        return load_failures(self.table, driver.Error, refusals, lambda e: type(e).__name__)

    def load(self, payload: RowChunks, *, ledger: LedgerEntry | None = None) -> int:
        """Write the payload in one transaction and return the rows written: load files as
        DuckDB reads them (Arrow natively), other rows as Arrow batches."""
        table, columns = self._target, payload.columns
        with self._refused(), self._connect() as conn, _transaction(conn):
            catalog = _fence_first(conn, ledger)
            if payload.merge is not None:
                return _record(conn, ledger, _merge_rows(conn, table, payload), catalog)
            _prepare_target(conn, table, columns, replace=payload.replace)
            if isinstance(payload, LoadFiles):
                rows = insert_files(conn, table, columns, payload.files)
            else:
                rows = insert_rows(conn, table, columns, payload.chunks)
            return _record(conn, ledger, rows, catalog)

    def engine(self) -> DuckDBSink:
        return self

    def write_load_file(
        self, path: Path, columns: Sequence[Column], chunks: Iterable[Sequence[tuple]]
    ) -> LoadFile | Iterator[Sequence[tuple]]:
        """The Arrow batches ``load`` would insert, as one IPC stream file."""
        return write_arrow_file(path, columns, chunks, table=self.table)

    def merge_load_files(self, payload: LoadFiles, folder: Path) -> LoadFiles:
        """Before the target call of every load of files: the load will hand DuckDB their
        rows as Arrow, so pandas is imported now, where a signal still stops the run before
        the target (``binding_ready``); lazy-plan hands DuckDB nothing and never imports it."""
        binding_ready()
        return payload

    def can_pull(self, plan: LoadPlan, files: int) -> bool:
        """The plan's checks accept the plan, at most ``open_files_allowed()`` files (a file
        per partition stays open while the scan runs), and no source column is named
        as the pull's tag. A value the scanner refuses itself is not looked for first: the
        pull then fails, before the target, and Python reads."""
        if files not in (1, len(plan.bounds)) or files > open_files_allowed():
            return False
        if BOUND_TAG in {column.name.lower() for column in plan.columns}:
            return False
        if isinstance(plan.source, PostgresTable):
            # DuckDB's postgres scanner, where it loads; no pull of it is built yet (no
            # machine of the tests can load it): the source's bulk read is next
            postgres_scanner_loads()
            return False
        try:
            if narrow_plan(plan):  # dpone reads it through an index; the scanner reads it all
                return False
            self._check(plan, pulling=True)
        except ConfigInvalid:
            return False
        except NativeTransferError:  # the source's own: Python's read would meet it too
            raise
        except Exception as error:  # DuckDB's, of any type (a message it cannot decode...)
            reraise_interrupt(error)
            return False
        return True

    def pull_load_files(
        self, plan: LoadPlan, paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        """One ``sqlite_scan`` of the plan's partitions in a scratch in-memory
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
        sql, params = tagged_scan(source, plan, checked.textual)
        try:
            with contextlib.closing(checked.scratch), watching_writes(source) as written:
                pa = arrow("DuckDBSink")
                pulled = write_tagged(checked.scratch, pa, sql, params, paths, len(plan.bounds))
                if written():
                    raise _ReadThrownAway
                return pulled
        except Exception as error:  # of any type: DuckDB's message of a value may not decode
            reraise_interrupt(error)
            for path in paths:  # a read that failed leaves nothing behind
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return None

    def carrier(self, column: Column) -> Carry | None:
        return duckdb_carrier(column)

    def column_difference(self, columns: Sequence[Column]) -> ColumnDifference | None:
        """DuckDB matches column names case-insensitively (ASCII). A column of
        a type dpone makes takes only a source column it would make that type for; a type made
        by hand is left to DuckDB's own conversion."""
        refuse_folded_twins(columns, self.table, engine="DuckDB")
        with self._reader() as conn:
            if conn is None or not _table_exists(conn, self._target):
                return None
            described = _described(conn, self._target.sql())
            present = {fold_ascii(row[0]) for row in described}
            asked = [column for column in columns if fold_ascii(column.name) in present]
            unwritable = _unwritable(conn, self._target, asked)
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

        required = [row[0] for row in described if row[2] == "NO" and row[4] is None]
        return difference(
            [(row[0], row[1]) for row in described],
            columns,
            fold=fold_ascii,
            takes=takes,
            required=required,
            unwritable=unwritable,
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
        columns whose misread values it refuses (``REFUSING_TYPES``): a pull as it writes its
        files, lazy-plan's check in one read before the target call (``probe_plan_read``);
        SQLite looks for the other misread values. A pull's check keeps its scratch database
        (the scanner loaded, never the target) for the pull."""
        if self._checked is not None:
            self._checked.close()
            self._checked = None
        source = pulled_file(plan, engine="DuckDB", table=self.table)
        scratch = scratch_connection()
        try:
            types = scan_types(scratch, source)
            numbers = {
                c.name: NOT_AN_INTEGER if _whole_decimal(c) else NOT_A_NUMBER
                for c in scanned_numbers(plan.columns, types)
            }
            refusing = [
                c.name for c in plan.columns if types.get(c.name) == REFUSING_TYPES.get(c.kind)
            ] + list(numbers)
            probed = [c.name for c in scanned_instants(plan.columns, types)]
            refuse_inexact_plan(
                source,
                plan.columns,
                engine="DuckDB",
                table=self.table,
                reader_refuses=[*refusing, *probed],  # DuckDB reads and tests the instants
                engine_reads=numbers,
            )
            if not pulling:  # a pull validates what it writes, its numbers checked here
                with source.reader() as conn:  # what SQLite keeps to its type needs no read
                    held = held_as_declared(conn, source.table) or set()
                read = [name for name in refusing if name not in held]
                probe_plan_read(scratch, source, plan.columns, types, read, self.table)
            else:  # the pull's own read is the instants' typed one
                probe_numbers(scratch, source, scanned_numbers(plan.columns, types), self.table)
                probe_instants(scratch, source, plan.columns, types, self.table)
            plan_conditions(source, plan.bounds)  # bad bounds fail here, before any connection
            textual = {
                c for c in text_bound_columns(source, plan.bounds) if types.get(c) != "VARCHAR"
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
        for where, params, window in plan_conditions(source, bounds, textual):
            selected = run(
                conn,
                f"SELECT count(*) FROM sqlite_scan(?, ?) WHERE {where}",
                [*scan_params(source), *params],
            ).fetchone()[0]
            expected = sum(source.count(item) for item in window)
            if selected != expected:
                raise PlanInexact(
                    f"DuckDB cannot select the source's partitions of column(s) "
                    f"{', '.join(sorted(textual))} exactly (DuckDB reads them as another type "
                    "than SQLite stores)",
                    diagnostics={"table": self.table, "columns": sorted(textual)},
                )

    def load_plan(self, plan: LoadPlan, *, ledger: LedgerEntry | None = None) -> int:
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
        names = column_names(plan.columns)
        scan = scan_params(source)
        statements = plan_conditions(source, plan.bounds, textual)
        with self._refused(), self._connect(scanner=True) as conn:
            try:
                with watching_writes(source) as written, _transaction(conn):
                    catalog = _fence_first(conn, ledger)
                    _prepare_target(conn, self._target, plan.columns, replace=plan.replace)
                    try:
                        rows = sum(
                            run(
                                conn,
                                f"INSERT INTO {self._target.sql()} ({names}) SELECT {names}"
                                f" FROM sqlite_scan(?, ?) WHERE {where}",
                                [*scan, *params],
                            ).fetchone()[0]
                            for where, params, _ in statements
                        )
                    except duckdb_driver().Error:
                        raise _ReadThrownAway from None
                    if written():
                        raise _ReadThrownAway
                    return _record(conn, ledger, rows, catalog)
            except _ReadThrownAway:  # the copy was rolled back
                pass
            read = plan_rows(source, plan.bounds, plan.columns)
            carriers = column_carriers(plan.columns, duckdb_carrier)
            chunks = carried_chunks(read, carriers, target="DuckDB")
            with _transaction(conn):
                _prepare_target(conn, self._target, plan.columns, replace=plan.replace)
                rows = insert_rows(conn, self._target, plan.columns, chunks)
                return _record(conn, ledger, rows)

    def stage(self, payload: RowChunks) -> int:
        """Fill a fresh staging table beside the target, from rows or from load files (as
        ``load``); the target is not touched."""
        stage, columns = self._stage, payload.columns
        with self._connect() as conn, _transaction(conn):
            conn.execute(f"DROP TABLE IF EXISTS {stage.sql()}")
            _create_table(conn, stage, columns)
            if isinstance(payload, LoadFiles):
                return insert_files(conn, stage, columns, payload.files)
            return insert_rows(conn, stage, columns, payload.chunks)

    def staged_row_count(self) -> int:
        with self._reader() as conn:
            return 0 if conn is None else _row_count(conn, self._stage)

    def finalize_staged_load(
        self,
        *,
        replace: bool = False,
        ledger: LedgerEntry | None = None,
        merge: Merge | None = None,
    ) -> int:
        """Move staged rows into the target (by column name) and drop the staging table, at once.

        A missing target is the staging table, renamed: it has the columns and types the
        target would be created with, and its rows are not copied again. ``merge``: the
        staged rows are merged into the target on its key (``_merge``), then dropped.
        """
        stage, target = self._stage.sql(), self._target.sql()
        with self._refused(), self._connect() as conn, _transaction(conn):
            catalog = _fence_first(conn, ledger) or _Catalog.of(conn)
            if not catalog.has(self._stage):
                raise ConfigInvalid(
                    f"no staged load exists for target table {self.table!r}",
                    diagnostics={"table": self.table},
                )
            if merge is not None:
                staged = _row_count(conn, self._stage)
                staged_columns = _described(conn, stage)
                names = [row[0] for row in staged_columns]
                _merge(conn, self._target, names, merge, self._stage)
                return _record(conn, ledger, staged, catalog)
            if not catalog.has(self._target):
                conn.execute(f"ALTER TABLE {stage} RENAME TO {quote(self._target.name)}")
                return _record(conn, ledger, _row_count(conn, self._target), catalog)
            if replace:
                conn.execute(f"DELETE FROM {target}")
            moved = conn.execute(f"INSERT INTO {target} BY NAME FROM {stage}").fetchone()[0]
            conn.execute(f"DROP TABLE {stage}")
            return _record(conn, ledger, moved, catalog)

    @contextlib.contextmanager
    def _read_only(self, what: str) -> Iterator[Any]:
        """A connection to the target file to read it, or ``TargetUnavailable``."""
        duckdb = duckdb_driver()
        opened = False
        try:
            with target_connection(self.path, self.table, read_only=True) as conn:
                opened = True
                yield conn
        except duckdb.Error:
            if opened:
                raise
        else:
            return
        raise TargetUnavailable(
            f"the target database of table {self.table!r} cannot be opened to read its "
            f"{what} now (locked or damaged); nothing was written",
            diagnostics={"table": self.table},
        )

    def read_rejects(self) -> list[tuple]:
        """This table's rows set aside, oldest first. Reads only."""
        if not os.path.isfile(self.path):
            return []
        with self._read_only("rejects") as conn:
            sql = rejects_query(quote(REJECTS_TABLE), "?") + " ORDER BY rowid"
            return _read_own(conn, self.table)(sql, [self.identity().table])

    def fence_epoch(self) -> int:
        """The target table's fence in ``_dpone_fence``; 0 without one."""
        if not os.path.isfile(self.path):
            return 0
        with self._read_only("fence") as conn:
            read = _read_own(conn, self.table)
            return read_fence(read, self.identity().table, **_FENCE_AT, ledger=lambda: _LEDGER)

    def advance_fence(self, epoch: int) -> int:
        """Raise the fence to ``epoch`` in a transaction of its own."""
        duckdb = duckdb_driver()
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
        with self._read_only("ledger") as conn:
            read = _read_own(conn, self.table)
            read(f"SELECT rowid FROM {_LEDGER} LIMIT 0", [])  # a view has none: refused
            rows = read(ledger_query("?", partitions=partitions), [self.identity().table])
        return [LedgerEntry.from_row(*row) for row in rows]

    def row_count(self) -> int:
        with self._reader() as conn:
            return 0 if conn is None else _row_count(conn, self._target)

    def is_empty(self) -> bool:
        return self.row_count() == 0  # DuckDB counts from table metadata

    def batch_rows(self, column: str, batch_id: str) -> int:
        """Rows whose ``column`` holds ``batch_id``; 0 without it."""
        with self._reader() as conn:
            if conn is None or not _table_exists(conn, self._target):
                return 0
            names = [row[0] for row in _described(conn, self._target.sql())]
            if column not in names:
                return 0
            sql = f"SELECT count(*) FROM {self._target.sql()} WHERE {quote(column)} = ?"
            return int(run(conn, sql, [batch_id]).fetchone()[0])

    def rows(self) -> list[tuple]:
        with self._reader() as conn:
            if conn is None or not _table_exists(conn, self._target):
                return []
            return conn.execute(f"SELECT * FROM {self._target.sql()} ORDER BY rowid").fetchall()


@contextlib.contextmanager
def _transaction(conn: Any) -> Iterator[None]:
    """BEGIN ... COMMIT; any exception, even a BaseException, rolls back and re-raises. A
    DuckDB error before the COMMIT is marked so (``before_commit``): DuckDB writes a
    transaction only at its COMMIT, so nothing of it was applied."""
    with before_commit(duckdb_driver().Error):  # no transaction began: nothing applied
        conn.execute("BEGIN TRANSACTION")
    try:
        with before_commit(duckdb_driver().Error):
            yield
        conn.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb_driver().Error):
            conn.execute("ROLLBACK")
        raise


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


class _ReadThrownAway(Exception):
    """DuckDB's read of the source cannot be kept: it failed, or another connection committed
    to the source meanwhile."""


def _fence_first(conn: Any, entry: LedgerEntry | None) -> _Catalog | None:
    """``fence_first`` at the start of a load's transaction; the catalog it listed, for the
    transaction's ``_record``."""
    if entry is None or entry.epoch is None:
        return None
    catalog = _Catalog.of(conn)
    fence = _FENCE_AT["table"] if FENCE_TABLE in catalog.own() else None
    fence_first(_query(conn), entry, table=fence, marker="?", ledger=catalog.ledger)
    return catalog


def _query(conn: Any) -> Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]:
    return lambda sql, params: run(conn, sql, params).fetchall()


def _read_own(conn: Any, table: str) -> Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]:
    """``_query`` for a read outside a transaction of dpone's own tables: one that does not
    exist reads as empty. Its catalog error aborts nothing there, and a probe costs a fixed
    0.2 ms where a listing of the catalog grows with the file's tables (1,000: 5-15 ms). One
    the read cannot bind is refused: a view of such a name is ``own_name_taken``, as
    ``check_target`` refuses it (``table``: the target table, for that error); a table of
    other columns is not dpone's (``ledger_unreadable``, ``not_dpones``)."""

    def query(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        driver = duckdb_driver()
        try:
            return run(conn, sql, params).fetchall()
        except driver.CatalogException:
            return []
        except driver.BinderException:
            taken = sorted(_Catalog.of(conn, kind="view").own().values())
            if taken:
                raise own_name_taken(table, taken[0]) from None
            read = next(name for name in OWN_TABLES if quote(name) in sql)
            if read == LEDGER_TABLE:
                check_ledger_columns({row[0] for row in _described(conn, _LEDGER)})
            raise not_dpones(read) from None

    return query


def _record(
    conn: Any, ledger: LedgerEntry | None, rows: int, catalog: _Catalog | None = None
) -> int:
    """Inside the load's transaction: check the rows applied and the fence, then write the
    batch's ledger row; returns ``rows``. ``catalog``: the transaction's listing, if it made
    one (``_fence_first``): dpone's own tables it lists are not created again (a
    ``CREATE TABLE IF NOT EXISTS`` of an existing table took 0.7-0.9 ms, as the listing).

    The next ``seq`` is read first and the row inserted with ``VALUES``: DuckDB binds a text
    parameter of an ``INSERT ... SELECT`` in time that grows with the square of its single
    quotes, and the row's partition list holds every partition's bounds (figures:
    docs/performance.md, 'Figures behind the code's choices')."""
    if ledger is not None:
        check_applied(ledger, rows)
        catalog = catalog or _Catalog.of(conn)
        own = catalog.own()
        fence_batch(
            _query(conn), ledger, **_FENCE, create=FENCE_TABLE not in own, ledger=catalog.ledger
        )
        table = _LEDGER
        if LEDGER_TABLE not in own:
            integer = "BIGINT NOT NULL"
            conn.execute(
                ledger_table_sql(table, seq=integer, integer=integer, text="VARCHAR NOT NULL")
            )
        (seq,) = conn.execute(f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {table}").fetchone()
        target, batch, entry, partitions = ledger.row()
        run(
            conn,
            f"INSERT INTO {table} (seq, target_table, batch_id, rows, entry, partitions)"
            " VALUES (?, ?, ?, ?, ?, ?)",  # a column added by hand is left alone
            [seq, target, batch, rows, entry, partitions],
        )
        if ledger.rejects:
            if REJECTS_TABLE not in own:
                conn.execute(rejects_table_sql(quote(REJECTS_TABLE), text="VARCHAR"))
            binding_ready()  # each reject's values are bound
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


def _merge_rows(conn: Any, table: TableName, payload: RowChunks) -> int:
    """A merge route's load: the batch's rows into a temporary table, then merged into the
    target on its key; the rows the batch holds (what the call was sent)."""
    assert payload.merge is not None
    batch, columns = TableName(None, MERGE_BATCH), payload.columns
    definitions = ", ".join(f"{quote(column.name)} {duckdb_type(column)}" for column in columns)
    conn.execute(f"CREATE TEMP TABLE {batch.sql()} ({definitions})")
    if isinstance(payload, LoadFiles):
        rows = insert_files(conn, batch, columns, payload.files)
    else:
        rows = insert_rows(conn, batch, columns, payload.chunks)
    _merge(conn, table, [c.name for c in columns], payload.merge, batch, columns)
    return rows


def _merge(
    conn: Any,
    table: TableName,
    names: Sequence[str],
    merge: Merge,
    batch: TableName,
    columns: Sequence[Column] | None = None,
) -> None:
    """Merge ``batch`` into ``table``, creating the table with the key as its PRIMARY KEY when
    it does not exist: with ``columns``' types, or as the batch (a stage) has them. A table
    with a primary key, unique constraint or unique index on exactly the key (``_upserts``)
    upserts (``_merge.upsert_statements``: 0.022 s against delete and insert's 0.035 s for
    1% of a 1,000,000-row table, docs/connectors.md "Merge"); any other takes
    ``_merge.merge_statements``."""
    if not _table_exists(conn, table):
        if table.schema is not None:
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote(table.schema)}")
        if columns is None:
            typed = [(row[0], row[1]) for row in _described(conn, batch.sql())]
        else:
            typed = [(column.name, duckdb_type(column)) for column in columns]
        definitions = ", ".join(f"{quote(n)} {t}" for n, t in typed if n != merge.deleted)
        conn.execute(f"CREATE TABLE {table.sql()} ({definitions}{key_constraint(merge)})")
    if _upserts(conn, table, merge):
        given = {fold_ascii(name) for name in names}
        existing = [row[0] for row in _described(conn, table.sql())]
        unloaded = [
            name
            for name in existing
            if fold_ascii(name) not in given and _settable(conn, table, name)
        ]
        statements = upsert_statements(table.sql(), batch.sql(), names, merge, unloaded=unloaded)
    else:
        statements = merge_statements(table.sql(), batch.sql(), names, merge)
    for statement in statements:
        conn.execute(statement)


def _upserts(conn: Any, table: TableName, merge: Merge) -> bool:
    """Whether ``INSERT ... ON CONFLICT`` on the merge's key has an arbiter (``_unique_on``).
    Delete and insert could not take its place on a table with a unique index: after an
    ``UPDATE`` of a row, DuckDB 1.5 refused to insert its key again in the transaction that
    deleted it (a ``ConstraintException`` inside the target call)."""
    return _unique_on(conn, table, merge.key)


def _unique_on(conn: Any, table: TableName, columns: Sequence[str]) -> bool:
    """Whether a primary key, unique constraint or unique index of ``table`` is on exactly
    ``columns``: DuckDB binds ``ON CONFLICT (columns)`` only then. Asked of its binder (a
    unique index's columns are listed only as text); it reads no row, and its refusal leaves
    an open transaction as it was."""
    listed = ", ".join(quote(column) for column in columns)
    try:
        conn.execute(
            f"EXPLAIN INSERT INTO {table.sql()} ({listed}) SELECT {listed} FROM {table.sql()}"
            f" WHERE false ON CONFLICT ({listed}) DO NOTHING"
        )
    except duckdb_driver().BinderException:
        return False
    return True


def _settable(conn: Any, table: TableName, column: str) -> bool:
    """Whether an update may set ``column`` to its default: a generated column may not (it
    follows its row, updated as re-inserted). Asked of the binder: DuckDB's catalog does not
    say which columns are generated."""
    try:
        conn.execute(f"EXPLAIN UPDATE {table.sql()} SET {quote(column)} = DEFAULT")
    except duckdb_driver().BinderException:
        return False
    return True


_PROBED_KEY = 8  # key columns up to which each part is asked of the binder (2**8 - 2 asks)


def _unwritable(conn: Any, table: TableName, columns: Sequence[Column]) -> list[str]:
    """``_sql.unwritable``: DuckDB's ``PREPARE`` binds the insert (a generated column, a
    type the load's cannot be cast to: ``BinderException``)."""
    binder = duckdb_driver().BinderException

    def prepares(statement: str) -> bool:
        try:
            conn.execute(f"PREPARE dpone_writes AS {statement}")
        except binder:
            return False
        conn.execute("DEALLOCATE dpone_writes")
        return True

    return unwritable(table.sql(), columns, name=quote, type_of=duckdb_type, prepares=prepares)


def _narrower(conn: Any, table: TableName, merge: Merge) -> bool:
    """``_merge.narrower_unique`` of the table's primary key and unique constraints, and of
    its unique indexes: each proper part of a key of up to ``_PROBED_KEY`` columns is asked
    of the binder (``_unique_on``) when the table has one."""
    if narrower_unique(_uniques(conn, table), merge, fold=fold_ascii):
        return True
    key = merge.key
    if len(key) > _PROBED_KEY or not _unique_indexes(conn, table):
        return False
    parts = (part for size in range(1, len(key)) for part in itertools.combinations(key, size))
    return any(_unique_on(conn, table, part) for part in parts)


def _unique_indexes(conn: Any, table: TableName) -> bool:
    """Whether ``table`` has a unique index (``CREATE UNIQUE INDEX``), matched as
    ``_table_exists`` matches names."""
    current = "" if table.schema is not None else " AND schema_name = current_schema()"
    rows = conn.execute(
        "SELECT schema_name, table_name FROM duckdb_indexes()"
        f" WHERE is_unique AND database_name = current_database(){current}"
    ).fetchall()
    return any(_is(table, schema, name) for schema, name in rows)


def _prepare_target(
    conn: Any, table: TableName, columns: Sequence[Column], *, replace: bool
) -> None:
    _create_table(conn, table, columns)
    if replace:
        conn.execute(f"DELETE FROM {table.sql()}")


def _uniques(conn: Any, table: TableName) -> list[list[str]]:
    """The table's primary key and unique constraints' column sets (names as DuckDB matches
    them: ASCII case folded, as ``_table_exists``)."""
    rows = run(
        conn,
        "SELECT schema_name, table_name, constraint_column_names FROM duckdb_constraints()"
        " WHERE database_name = current_database()"
        " AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')"
        " AND (? IS NOT NULL OR schema_name = current_schema())",
        [table.schema],
    ).fetchall()
    return [list(names) for schema, name, names in rows if _is(table, schema, name)]


def _table_exists(conn: Any, table: TableName) -> bool:
    return _Catalog.of(conn).has(table)


@attrs.define
class _Catalog:
    """The database's tables (or views) as one listing of DuckDB's catalog found them: each
    ``(schema, name, in the current schema)``. Listed, not probed: a catalog error inside a
    transaction aborts it on DuckDB 2. A listing's time grows with the file's tables, so a
    transaction lists once and asks it again (``_fence_first``, ``_record``): it sees the
    catalog as of its start, changed only by its own statements."""

    rows: list[tuple[str, str, bool]]

    @classmethod
    def of(cls, conn: Any, *, kind: str = "table") -> _Catalog:
        """``kind``: "table" or "view"."""
        return cls(
            conn.execute(
                f"SELECT schema_name, {kind}_name, schema_name = current_schema()"
                f" FROM duckdb_{kind}s() WHERE database_name = current_database()"
            ).fetchall()
        )

    def has(self, table: TableName) -> bool:
        """DuckDB matches table and schema names case-insensitively (ASCII only), even
        quoted; so does this. An unqualified table is looked up in the current schema."""
        return any(
            _is(table, schema, name) and (table.schema is not None or current)
            for schema, name, current in self.rows
        )

    def own(self) -> dict[str, str]:
        """dpone's own names (``OWN_TABLES``) the current schema has, each to the catalog's
        spelling (a view's is named by ``own_name_taken``)."""
        found = {fold_ascii(name): name for _, name, current in self.rows if current}
        return {own: found[fold_ascii(own)] for own in OWN_TABLES if fold_ascii(own) in found}

    def ledger(self) -> str | None:
        """The ledger table's reference; None where it does not exist."""
        return _LEDGER if LEDGER_TABLE in self.own() else None


def _described(conn: Any, name: str) -> list[tuple]:
    """``DESCRIBE`` of the table or view of the SQL name ``name``: its columns' rows (name,
    type, ...). Of a query, so that a table named ``tables`` (or ``databases``) is not read
    as ``SHOW TABLES``, as ``DESCRIBE "tables"`` is even quoted."""
    return conn.execute(f"DESCRIBE SELECT * FROM {name}").fetchall()


def _is(table: TableName, schema: str, name: str) -> bool:
    """Whether the catalog's ``schema``.``name`` is ``table`` (ASCII case folded; an
    unqualified table was looked up in the current schema)."""
    return fold_ascii(name) == fold_ascii(table.name) and (
        table.schema is None or fold_ascii(schema) == fold_ascii(table.schema)
    )


def _row_count(conn: Any, table: TableName) -> int:
    if not _table_exists(conn, table):
        return 0
    return conn.execute(f"SELECT count(*) FROM {table.sql()}").fetchone()[0]
