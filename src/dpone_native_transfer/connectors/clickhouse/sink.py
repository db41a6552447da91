"""ClickHouseSink: the target table in ClickHouse, through the client port.

ClickHouse has no multi-statement transaction. What is atomic, and how each
load uses it:

- A full refresh (``replace``) by ``load()`` fills a fresh table beside the
  target and swaps it in with ``EXCHANGE TABLES`` (one atomic rename); a load
  that fails before the swap leaves the target as it was.
- An append by ``load()`` INSERTs into the target. An INSERT is cut into
  blocks, and a block into one part per partition; each part appears
  atomically, the INSERT as a whole does not. A failed append may leave
  some rows behind: the outcome is unknown, which is what the guard is for.
- ``finalize_staged_load()`` moves a governed staging table into the target
  with partition operations: ``REPLACE PARTITION ... FROM`` (each atomic) plus
  ``DROP PARTITION`` for partitions the stage no longer has, when replacing;
  ``INSERT ... SELECT`` when appending. The sequence is not atomic.

The target's ledger (``LedgerSink``): ClickHouse has no multi-table
transaction, so the ledger row is inserted into ``_dpone_ledger`` after the
rows (``ledger_atomic`` is False). A ledger row proves its batch was applied;
a missing one proves nothing (the rows may be there, in part). Each INSERT of
a batch's rows carries a deduplication token (batch id and statement number)
on a MergeTree table with a deduplication window, so repeating an insert of
the same batch (same run id, same partitions) after a partial append adds
only what is missing. See docs/connectors.md for what is and is not proven.

Each method opens a client and closes it before returning: chDB serves one
data path per process at a time.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ...artifacts import (
    DigestReader,
    DigestWriter,
    check_digest,
    create_private,
    open_files_allowed,
    read_chunks,
)
from ...column_types import Carry
from ...drivers import ServerFailure, clickhouse_failure, import_driver
from ...errors import (
    ConfigInvalid,
    InternalInvariantBroken,
    NativeTransferError,
    SourceInvalid,
    TargetAccessRefused,
    TargetRowsUnproven,
    TargetUnavailable,
)
from ...identity import TableIdentity, file_location, server_location
from ...ledger import LEDGER_TABLE, LedgerEntry, ledger_query, ledger_table_sql
from ...payloads import Column, LoadFile, LoadFiles, LoadPlan, RowChunks, bound_predicates
from ...rejects import REJECTS_TABLE, rejects_query, rejects_table_sql, write_rejects
from .._arrow import arrow
from .._sql import (
    STAGE_PREFIX,
    ColumnDifference,
    TableName,
    check_target_table,
    check_writable,
    difference,
    integer_range_starts,
    parse_table,
    partition_predicate_count,
    payload_refused,
    refuse_reserved_schema,
    unavailable,
)
from ..contract import PendingLedger, PlanInexact, SQLiteFile
from ..sqlite import pulled_file, refuse_inexact_plan, watching_writes
from .client import CHDB, ClickHouseClient, open_client, parse_location
from .sql import (
    ARROW_BLOCK_ROWS,
    DEDUPLICATION_WINDOW,
    MADE_TYPES,
    NARROW_INTEGERS,
    column_carrier,
    column_list,
    column_type,
    create_table_sql,
    file_pattern,
    holds_int64,
    insert_settings,
    partition_id_literal,
    quote,
    type_literal,
    where_sql,
    write_arrow_stream,
)

__all__ = ["ClickHouseSink"]

T = TypeVar("T")

_FRESH_PREFIX = "_dpone_new_"
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # an Arrow IPC stream's last 8 bytes
_BOUND_TAG = "__dpone_bound"  # the column of a pulled file naming each row's bound
# A lazy plan's partitions per INSERT ... SELECT: without an index, each statement reads the
# whole SQLite file, so as few statements as chDB parses: at most 256 OR-ed conditions, and at
# most _CONDITION_BYTES of them, each (long column names make long conditions). Partitions a
# lookup finds (_PlanSQL.lookup) take one statement up to _LOOKUP_BOUNDS: their values'
# placeholders stay below max_query_size (262,144 bytes) too. A statement longer than
# _STATEMENT_BYTES is refused before the target call. A pull reads all its partitions in one
# statement (and keeps a file writer open for each, for file-artifact).
_PLAN_BOUNDS_PER_INSERT = 256
_CONDITION_BYTES = 100_000
_LOOKUP_BOUNDS = 2048
_STATEMENT_BYTES = 200_000
# ClickHouse's sqlite() engine quotes SQLite identifiers its own way: a backslash or a double
# quote in a name reads a wrong column (or its name as a string) or fails; checked on chDB 4.4.
_SQLITE_FUNCTION_UNSAFE = re.compile(r'[\\"\x00-\x1f\x7f]')

# ClickHouse's own databases; chDB's holds its temporary tables.
_RESERVED_DATABASES = ("system", "information_schema", "_temporary_and_external_tables")
# ClickHouse names a table's metadata files by its name escaped (a byte other than
# [A-Za-z0-9_] is %XX): ``<table>.sql.detached``, and ``<database>.<table>.<uuid>.sql`` once
# dropped. With 255-byte file names, a longer one cannot be created (206 in chDB's default).
_NAME_MAX = 255
_UUID = "00000000-0000-0000-0000-000000000000"
_WORD_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

Fill = Callable[[ClickHouseClient, TableName, "_Tokens"], int]
_LEDGER = TableName(None, LEDGER_TABLE)


class ClickHouseSink:
    """One target table in chDB (``location`` a path) or on a server (a URL).

    ``partition_by`` names the partition column (the route's source partition
    column): tables are then ``MergeTree PARTITION BY`` it; without it they
    are unpartitioned MergeTree tables.
    """

    ledger_atomic = False  # the ledger row follows the rows; its absence proves nothing
    pulled_suffix = ".arrows"  # FilePulling: an Arrow IPC stream, as write_load_file writes

    def __init__(self, location: Any, table: str, *, partition_by: str | None = None) -> None:
        check_target_table(table)
        if partition_by is not None:
            quote(partition_by)
        self._location = parse_location(location)
        self.table = table
        # database.table; chDB's one database is "default", so default.t is t
        default = "default" if self._location.kind == CHDB else None
        self._target = parse_table(table, default_schema=default)
        refuse_reserved_schema(self._target, _RESERVED_DATABASES, engine="ClickHouse")
        _check_name_length(self._stage, table)  # the longest name it makes beside the target
        self.partition_by = partition_by
        self._ledger = PendingLedger()
        self._checked: LoadPlan | None = None  # the last plan check_plan passed
        self._checking: tuple[LoadPlan, Future[None]] | None = None  # can_pull's, running
        self._holding = False  # within holding_connection
        self._held: ClickHouseClient | None = None  # its client, once a call opened it

    def ledger_batch(self, entry: LedgerEntry) -> contextlib.AbstractContextManager[None]:
        return self._ledger.handed(entry)

    def __repr__(self) -> str:
        return f"ClickHouseSink(table={self.table!r}, engine={self._location.kind!r})"

    def identity(self) -> TableIdentity:
        """chDB: the data folder's resolved path; a server: host, port, database (no user).

        ClickHouse table names are case-sensitive.
        """
        table = self._target.canonical(fold=False)
        if self._location.kind == CHDB:
            return TableIdentity(file_location("chdb", self._location.target), table)
        location = server_location(
            "clickhouse", self._location.target, default_port=8123, default_database="default"
        )
        return TableIdentity(location, table)

    @property
    def engine(self) -> str:
        """``chdb`` or ``server``."""
        return self._location.kind

    @property
    def _stage(self) -> TableName:
        return self._target.sibling(STAGE_PREFIX)

    @property
    def _fresh(self) -> TableName:
        return self._target.sibling(_FRESH_PREFIX)

    @contextlib.contextmanager
    def holding_connection(self) -> Iterator[None]:
        """``ConnectionHolding``: one session for the attempt's calls (opened by the first)."""
        if self._holding:  # already held, by an outer attempt's scope
            yield
            return
        self._holding = True
        try:
            yield
        finally:
            held, self._held, self._holding = self._held, None, False
            if held is not None:
                with contextlib.suppress(Exception):
                    held.close()

    @contextlib.contextmanager
    def client(self) -> Iterator[ClickHouseClient]:
        """A client open for one call, closed afterwards even when the call fails; within
        ``holding_connection``, the one held client."""
        if self._holding:
            if self._held is None:
                self._held = open_client(self._location)
            yield self._held
            return
        client = open_client(self._location)
        try:
            yield client
        finally:
            with contextlib.suppress(Exception):
                client.close()

    def check_target(self) -> None:
        """Before the target call: the server answers (or chDB opens its data path, which it
        may write: a read-only one is refused, exit 2)."""
        if self.engine == "chdb" and os.path.isdir(self._location.target):
            check_writable(self._location.target, self.table)
        try:
            with self.client() as client:
                client.query_rows("SELECT 1")
        except NativeTransferError:
            raise
        except Exception as exc:  # the driver's text may hold the URL: it is not chained
            failure = clickhouse_failure(exc)
        else:
            return
        raise self._failed(failure)

    def _failed(self, failure: ServerFailure | None, *, to: str | None = None) -> Exception:
        """``TargetUnavailable`` (exit 1), or ``TargetAccessRefused`` (exit 2) when the
        server refused the login, has no such database, or the login lacks a privilege."""
        if failure is None:
            return unavailable(self.table) if to is None else unavailable(self.table, to=to)
        return failure.error(
            f"the target database of table {self.table!r} cannot {to or 'be used'}",
            retry=TargetUnavailable,
            refused=TargetAccessRefused,
            diagnostics={"table": self.table},
            fix="fix the target URL (its user, password or database) or the login's grants",
        )

    # --- loads ----------------------------------------------------------------------------

    def load(self, payload: RowChunks | LoadPlan) -> int:
        """Write the payload into the target and return the rows written."""
        fill: Fill
        if isinstance(payload, LoadFiles):
            fill = self._files_fill(payload)
        elif isinstance(payload, RowChunks):
            fill = self._rows_fill(payload)
        elif isinstance(payload, LoadPlan):
            fill = self._plan_fill(payload)
        else:
            raise payload_refused(self.table)
        create = create_table_sql(self._target, payload.columns, self.partition_by)  # checks
        entry = self._ledger.take()
        tokens = _Tokens(entry)
        with self.client() as client:
            if payload.replace:
                rows = self._replace(client, payload.columns, fill, tokens)
                before = 0
            else:
                _create(client, self._target, create)
                if entry is not None:  # a table of an older release may have no window yet
                    window = f"MODIFY SETTING {DEDUPLICATION_WINDOW}"
                    client.command(f"ALTER TABLE {_ref(self._target)} {window}")
                before = _count(client, self._target)
                rows = fill(client, self._target, tokens)
            _check_gained(client, entry, self._target, before)
            return _record(client, entry, rows)

    @staticmethod
    def _rows_fill(payload: RowChunks) -> Fill:
        return lambda client, table, tokens: client.insert_rows(
            _ref(table), payload.columns, payload.chunks, token=tokens.next()
        )

    def write_load_file(
        self, path: Path, columns: Sequence[Column], chunks: Iterable[Sequence[tuple]]
    ) -> LoadFile | Iterator[Sequence[tuple]]:
        """``NativeFiles``: the Arrow stream ``insert_rows`` writes, in fixed-size batches; the
        rows themselves when ``file()`` would read the path as a pattern."""
        if file_pattern(path):
            return iter(chunks)
        return write_arrow_stream(path, columns, chunks, table=self.table)

    def merge_load_files(self, payload: LoadFiles, folder: Path) -> LoadFiles:
        """``MergingLoadFiles``: Arrow files (file-artifact's, one per partition) are copied in
        order into one new ``merged.arrows`` in ``folder``, each file's digest checked as it is
        read. An INSERT costs chDB about 15 ms whatever its size: one per partition was most
        of file-artifact's time. The record batches are copied as IPC messages, bytes as
        written (``_copy_messages``), so each stays a block of its own and a retried load
        deduplicates as before. Files in the runtime's format are kept."""
        native = [file for file in payload.files if file.native]
        if len(native) < 2:
            return payload
        pa, path = arrow("the ClickHouse sink"), folder / "merged.arrows"
        with contextlib.ExitStack() as stack:
            writer = DigestWriter(stack.enter_context(create_private(path)))
            schema = None
            for file in native:
                with DigestReader(file.path, file.sha256) as reader:
                    try:
                        schema = _copy_messages(pa, reader, writer, schema, table=self.table)
                    except Exception:  # of a cut file too: told as changed, when it is
                        reader.verify()
                        raise
                    reader.verify()
            writer.write(_END_OF_STREAM)
        rows = sum(file.rows for file in native)
        merged = LoadFile(path=path, rows=rows, sha256=writer.sha256, native=True)
        others = tuple(file for file in payload.files if not file.native)
        return attrs.evolve(payload, files=(*others, merged))

    @staticmethod
    def _files_fill(payload: LoadFiles) -> Fill:
        """One INSERT per file, each with its own deduplication token. chDB reads a native
        file itself, so every native file's digest is checked before the first INSERT (the
        loads are not one transaction), not as the engine reads it."""

        def fill(client: ClickHouseClient, table: TableName, tokens: _Tokens) -> int:
            for file in payload.files:
                if file.native:
                    check_digest(file.path, file.sha256)
            for file in payload.files:
                token = tokens.next()
                if file.native:
                    client.insert_file(_ref(table), payload.columns, file.path, token=token)
                else:
                    chunks = read_chunks(file.path, file.sha256)
                    client.insert_rows(_ref(table), payload.columns, chunks, token=token)
            return sum(file.rows for file in payload.files)

        return fill

    def _replace(
        self, client: ClickHouseClient, columns: Sequence[Column], fill: Fill, tokens: _Tokens
    ) -> int:
        """Fill a fresh table, then swap it in; a failure before the swap leaves the target."""
        fresh, target = _ref(self._fresh), _ref(self._target)
        client.command(f"DROP TABLE IF EXISTS {fresh} SYNC")
        exists = _exists(client, self._target)
        if exists:
            client.command(f"CREATE TABLE {fresh} AS {target}")
        else:
            _create(client, self._fresh, create_table_sql(self._fresh, columns, self.partition_by))
        try:
            rows = fill(client, self._fresh, tokens)
        except BaseException:
            with contextlib.suppress(Exception):
                client.command(f"DROP TABLE IF EXISTS {fresh} SYNC")
            raise
        if not exists:
            client.command(f"RENAME TABLE {fresh} TO {target}")
            return rows
        client.command(f"EXCHANGE TABLES {fresh} AND {target}")
        with contextlib.suppress(Exception):  # the old rows; a leftover is dropped next time
            client.command(f"DROP TABLE IF EXISTS {fresh} SYNC")
        return rows

    def carrier(self, column: Column) -> Carry | None:
        return column_carrier(column)

    def column_difference(self, columns: Sequence[Column]) -> ColumnDifference | None:
        """``SchemaEvolving``: ClickHouse column names are case-sensitive. A column of a type
        dpone makes takes only a source column it would make that type for; a type made by
        hand is left to ClickHouse's own conversion."""
        with self.client() as client:
            existing = _columns(client, self._target)
            if not existing:
                return None
            names = sorted({column_type(column) for column in columns} | set(MADE_TYPES))
            casts = ", ".join(f"toTypeName(CAST(NULL, {type_literal(name)}))" for name in names)
            spelled = dict(zip(names, client.query_rows(f"SELECT {casts}")[0], strict=True))
        made = {spelled[name] for name in MADE_TYPES} | NARROW_INTEGERS

        def takes(column: Column, target_type: str) -> bool:
            if spelled[column_type(column)] == target_type:
                return True
            if column.kind == "integer" and holds_int64(target_type):
                return True  # wider: every Int64 fits
            return not (target_type in made or target_type.startswith("Nullable(Decimal("))

        return difference(existing, columns, takes=takes)

    def add_columns(self, columns: Sequence[Column]) -> None:
        """One ALTER for all of them; ClickHouse adds columns as a metadata change."""
        added = ", ".join(f"ADD COLUMN {quote(c.name)} {column_type(c)}" for c in columns)
        with self.client() as client:
            client.command(f"ALTER TABLE {_ref(self._target)} {added}")

    def check_plan(self, plan: LoadPlan) -> None:
        """Refuse a plan the engine cannot pull, before anything touches the target."""
        source = _with_safe_names(plan, table=self.table)
        refuse_inexact_plan(source, plan.columns, engine="ClickHouse", table=self.table)
        _plan_inserts(plan, source, table=self.table)
        self._checked = plan  # the load of this very plan need not check it again

    def _plan_fill(self, payload: LoadPlan) -> Fill:
        """The engine pulls the partitions from the SQLite file with its sqlite() table function,
        in as few INSERTs as ``_PlanSQL.statements`` allows: it reads the whole file for each
        statement when the partition column has no index."""
        if self._checked is not payload:
            self.check_plan(payload)
        source = pulled_file(payload, engine="ClickHouse", table=self.table)
        bounds, names, wheres = _plan_inserts(payload, source, table=self.table)

        def fill(client: ClickHouseClient, table: TableName, tokens: _Tokens) -> int:
            before = _count(client, table)
            for where in wheres:
                client.command(
                    f"INSERT INTO {_ref(table)} ({names}){insert_settings(tokens.next())}"
                    f" SELECT {names} FROM {_SQLITE_READ} WHERE {where}",
                    bounds.params,
                )
            return _written(client, table, before)

        return fill

    def can_pull(self, plan: LoadPlan, files: int) -> bool:
        """``FilePulling``, on chDB (a server cannot write the client's files): partitions one
        statement reads (``_PlanSQL.statements``), at most ``open_files_allowed()`` files (chDB
        holds each open while it writes), and no source column named as the pull's tag.
        Lazy-plan's checks, that the engine reads every value as the row paths carry it, start
        here in a thread of their own: SQLite reads the source for them while chDB pulls it
        (both release the GIL; 0.15-0.2 s of a 1M-row pull), and ``pull_load_files`` keeps the
        pull only when they accept the plan."""
        if self._location.kind != CHDB or files not in (1, len(plan.bounds)):
            return False
        if files > open_files_allowed():
            return False
        if _BOUND_TAG in {column.name.lower() for column in plan.columns}:
            return False
        try:
            bounds = _PlanSQL(plan, _with_safe_names(plan, table=self.table))
        except ConfigInvalid:  # a bound value ClickHouse parameters do not take, too
            return False
        if len(bounds.statements(listed=plan.replace)) > 1:
            return False
        self._checking = (plan, _in_background(lambda: self.check_plan(plan)))
        return True

    def pull_load_files(
        self, plan: LoadPlan, paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        """``FilePulling``: one ``INSERT INTO FUNCTION file(..., 'ArrowStream') SELECT ... FROM
        sqlite()`` of the plan's partitions (lazy-plan's conditions and read, so the same rows
        and values), each row tagged with its bound's index, into a scratch folder: one file,
        or one per bound (``PARTITION BY`` the tag). Each is rewritten at its path without the
        tag, in the batches ``write_load_file`` writes (``_recut``), so a retried INSERT
        deduplicates block by block; a full refresh's files are kept as written
        (``_kept``). None when chDB's read failed or the source was written meanwhile
        (``watching_writes``); no file is left."""
        return self._read_checked(plan, lambda: self._pull(plan, paths), lambda: _unlink(paths))

    def pull_stage(self, plan: LoadPlan) -> list[int] | None:
        """``StagePulling``: one ``INSERT INTO`` the fresh stage ``SELECT ... FROM sqlite()`` of
        the plan's partitions (the pull's conditions and read), then each bound's count by
        the pull's tag over the staged rows; no file is written or read. None, and no stage
        left, when chDB's read failed, the source was written meanwhile, or the stage holds
        a partition or cursor column in a type other than chDB reads it as (the tag could
        then differ from the pull's). A 1M-row staged full refresh into chDB: 0.57 s against
        0.74 s through the pulled file."""

        def drop() -> None:
            with contextlib.suppress(Exception):
                self.discard_stage()

        return self._read_checked(plan, lambda: self._fill_stage(plan), drop)

    def _read_checked(
        self, plan: LoadPlan, read: Callable[[], T | None], undo: Callable[[], None]
    ) -> T | None:
        """``read()`` of a plan ``can_pull`` accepted, kept (else ``undo()``) when lazy-plan's
        checks, started by ``can_pull``, accept the plan and the source was not written
        while chDB read it. A write comes first: chDB's SQLite closing the file drops the
        check's lock, and SQLite then found the file "malformed" under a writer, which failed
        runs that Python's own read then completes."""
        checking, self._checking = self._checking, None
        if checking is None or checking[0] is not plan or self._location.kind != CHDB:
            raise InternalInvariantBroken(
                "ClickHouseSink was asked to pull a plan can_pull did not accept",
                diagnostics={"table": self.table},
            )
        source, kept = pulled_file(plan, engine="ClickHouse", table=self.table), None
        try:
            with watching_writes(source) as written:
                result = read()
                error = checking[1].exception()  # waits for the check to end
                if written() or isinstance(error, ConfigInvalid):  # a value chDB misreads
                    return None
                if error is not None:  # the source's own, as a read would raise it
                    raise error
            kept = result
            return kept
        finally:
            if kept is None:
                undo()

    def _fill_stage(self, plan: LoadPlan) -> list[int] | None:
        source = pulled_file(plan, engine="ClickHouse", table=self.table)
        bounds, stage = _PlanSQL(plan, source), _ref(self._stage)
        where = bounds.where(range(len(plan.bounds)), listed=plan.replace)
        names = column_list([column.name for column in plan.columns])
        keys = [key for key in (source.partition_column, source.cursor_column) if key is not None]
        try:
            with self.client() as client:
                described = client.query_rows(f"DESCRIBE TABLE {_SQLITE_READ}", bounds.params)
                self._new_stage(client, plan.columns)
                staged = dict(_columns(client, self._stage))
                read = {name.lower(): (name, type_) for name, type_, *_ in described}
                for key in keys:  # SQLite matches names case-insensitively
                    name, type_ = read.get(key.lower(), (key, None))
                    if type_ is None or staged.get(name) not in (type_, f"Nullable({type_})"):
                        return None  # NOT NULL in SQLite: T, where dpone makes Nullable(T)
                client.command(
                    f"INSERT INTO {stage} ({names}) SELECT {names} FROM {_SQLITE_READ}"
                    f" WHERE {where} SETTINGS max_threads = 1",
                    bounds.params,
                )
                tagged = client.query_rows(
                    f"SELECT toInt32({bounds.index()}) AS i, count() FROM {stage} GROUP BY i",
                    bounds.params,
                )
        except Exception:  # of any type: chDB's own
            return None
        counts = [0] * len(plan.bounds)
        for index, rows in tagged:
            if not 0 <= index < len(counts):  # a staged row of no bound: the stage is not read
                return None
            counts[index] += rows
        return counts

    def _pull(
        self, plan: LoadPlan, paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        if file_pattern(paths[0].parent):  # file() would write elsewhere: Python reads
            return None
        source = pulled_file(plan, engine="ClickHouse", table=self.table)
        bounds = _PlanSQL(plan, source)
        where = bounds.where(range(len(plan.bounds)), listed=plan.replace)
        params = dict(bounds.params)
        names, tag = column_list([column.name for column in plan.columns]), quote(_BOUND_TAG)
        split = f" PARTITION BY {tag}" if len(paths) > 1 else ""
        try:
            with tempfile.TemporaryDirectory(prefix=".dpone-pull-", dir=paths[0].parent) as folder:
                raws = [Path(folder, f"{index}.arrows") for index in range(len(paths))]
                params["pull_file"] = str(
                    Path(folder, "{_partition_id}.arrows" if split else "0.arrows")
                )
                with self.client() as client:
                    client.command(
                        f"INSERT INTO FUNCTION file({{pull_file:String}}, 'ArrowStream'){split}"
                        f" SELECT {names}, toInt32({bounds.index()}) AS {tag}"
                        f" FROM {_SQLITE_READ} WHERE {where} SETTINGS max_threads = 1",
                        params,
                    )
                rewrite = _kept if plan.replace else _recut
                return rewrite(raws, paths, len(plan.bounds), table=self.table)
        except Exception:  # of any type: chDB's own, or a file it wrote that does not read
            return None

    # --- staging ----------------------------------------------------------------------------

    def stage(self, payload: RowChunks) -> int:
        """Fill a fresh staging table shaped like the target; the target is not touched. Load
        files (``LoadFiles``, pulled by chDB) are read as ``load`` reads them."""
        if not isinstance(payload, RowChunks):
            raise ConfigInvalid("a staged load takes RowChunks")
        stage = _ref(self._stage)
        with self.client() as client:
            self._new_stage(client, payload.columns)
            try:
                if isinstance(payload, LoadFiles):
                    return self._files_fill(payload)(client, self._stage, _Tokens(None))
                return client.insert_rows(stage, payload.columns, payload.chunks, token=None)
            except BaseException:
                with contextlib.suppress(Exception):
                    client.command(f"DROP TABLE IF EXISTS {stage} SYNC")
                raise

    def _new_stage(self, client: ClickHouseClient, columns: Sequence[Column]) -> None:
        """A fresh, empty staging table shaped like the target (made from ``columns`` when
        there is no target yet)."""
        create = create_table_sql(self._stage, columns, self.partition_by)  # checks
        client.command(f"DROP TABLE IF EXISTS {_ref(self._stage)} SYNC")
        if _exists(client, self._target):
            client.command(f"CREATE TABLE {_ref(self._stage)} AS {_ref(self._target)}")
        else:
            _create(client, self._stage, create)

    def staged_row_count(self) -> int:
        with self.client() as client:
            return _count(client, self._stage)

    def finalize_staged_load(self, *, replace: bool = False) -> int:
        """Move the staged rows into the target with partition operations; drop the stage.

        ``replace``: ``REPLACE PARTITION ... FROM`` the stage for every staged
        partition, then ``DROP PARTITION`` for target partitions the stage does
        not hold. Otherwise ``INSERT ... SELECT`` from the stage.
        """
        stage, target = _ref(self._stage), _ref(self._target)
        entry = self._ledger.take()
        with self.client() as client:
            if not _exists(client, self._stage):
                raise ConfigInvalid(
                    f"no staged load exists for target table {self.table!r}",
                    diagnostics={"table": self.table},
                )
            if not _exists(client, self._target):
                client.command(f"CREATE TABLE {target} AS {stage}")
            before = 0 if replace else _count(client, self._target)
            staged = _count(client, self._stage)
            if replace:
                staged_ids = _partition_ids(client, self._stage)
                for partition_id in staged_ids:
                    literal = partition_id_literal(partition_id)
                    client.command(
                        f"ALTER TABLE {target} REPLACE PARTITION ID {literal} FROM {stage}"
                    )
                for partition_id in _partition_ids(client, self._target):
                    if partition_id not in staged_ids:
                        literal = partition_id_literal(partition_id)
                        client.command(f"ALTER TABLE {target} DROP PARTITION ID {literal}")
            else:
                names = column_list([name for name, _ in _columns(client, self._stage)])
                token = insert_settings(_Tokens(entry).next())
                client.command(f"INSERT INTO {target} ({names}){token} SELECT {names} FROM {stage}")
            client.command(f"DROP TABLE {stage} SYNC")
            _check_gained(client, entry, self._target, before)
            return _record(client, entry, staged)

    def discard_stage(self) -> None:
        with self.client() as client:
            client.command(f"DROP TABLE IF EXISTS {_ref(self._stage)} SYNC")

    def read_ledger(self, *, partitions: bool = False) -> list[LedgerEntry]:
        """The ledger entries of this target table, oldest first; ``[]`` without a ledger.
        A server that does not answer is ``TargetUnavailable`` (the route scan asks first)."""
        try:
            with self.client() as client:
                if not _exists(client, _LEDGER):
                    return []
                rows = client.query_rows(
                    ledger_query("{table:String}", partitions=partitions),
                    {"table": self.identity().table},
                )
        except NativeTransferError:
            raise
        except Exception as exc:  # the driver's text may hold the URL: it is not chained
            failure = clickhouse_failure(exc)
        else:
            return [LedgerEntry.from_row(*row) for row in rows]
        raise self._failed(failure, to="have its ledger read")

    # --- reading back -----------------------------------------------------------------------

    def read_rejects(self) -> list[tuple]:
        """``Quarantining``: this table's rows set aside. Reads only."""
        rejects = TableName(None, REJECTS_TABLE)
        with self.client() as client:
            if not _exists(client, rejects):
                return []
            sql = rejects_query(quote(REJECTS_TABLE), "{t:String}")
            return client.query_rows(sql, {"t": self.identity().table})

    @property
    def inserts_end_with_their_process(self) -> bool:
        """``BatchCounting``: chDB runs in the worker's process, so a dead worker has no
        insert left in flight; a server may still be running one it was sent."""
        return self.engine == "chdb"

    def batch_rows(self, column: str, batch_id: str) -> int:
        """``BatchCounting``: the rows of the target table whose ``column`` holds
        ``batch_id`` (0 when the table or the column does not exist). Reads only."""
        with self.client() as client:
            names = [name for name, _ in _columns(client, self._target)]
            if column not in names:
                return 0
            found = client.query_rows(
                f"SELECT count() FROM {_ref(self._target)} WHERE {quote(column)} = {{b:String}}",
                {"b": batch_id},
            )
            return int(found[0][0])

    def row_count(self) -> int:
        with self.client() as client:
            return _count(client, self._target)

    def is_empty(self) -> bool:
        return self.row_count() == 0  # MergeTree counts from part metadata

    def rows(self) -> list[tuple]:
        """Every row, ordered by all columns (ClickHouse keeps no insertion order)."""
        with self.client() as client:
            columns = _columns(client, self._target)
            if not columns:
                return []
            names = column_list([name for name, _ in columns])
            return client.query_rows(f"SELECT {names} FROM {_ref(self._target)} ORDER BY {names}")


def _escaped_length(name: str) -> int:
    """The length of ClickHouse's ``escapeForFileName(name)``."""
    return sum(1 if byte in _WORD_BYTES else 3 for byte in name.encode("utf-8"))


def _check_name_length(table: TableName, configured: str) -> None:
    """Refuse, before any I/O, a table name too long for ClickHouse to create in its database
    (``_NAME_MAX``): the target call would fail on it and block the route."""
    database = table.schema or "default"
    dropped = _NAME_MAX - _escaped_length(database) - len("..") - len(_UUID) - len(".sql")
    longest = min(_NAME_MAX - len(".sql.detached"), dropped)
    if _escaped_length(table.name) > longest:
        raise ConfigInvalid(
            f"target table {configured!r} or its staging table {table.name!r} has a name longer "
            f"than ClickHouse can create in database {database!r} ({longest} characters, a "
            "character other than A-Z, a-z, 0-9 and _ counting 3 per UTF-8 byte); choose a "
            "shorter name",
            diagnostics={"key": "target.table"},
        )


class _Tokens:
    """The deduplication tokens of one target call's INSERTs: batch id and a counter."""

    def __init__(self, entry: LedgerEntry | None) -> None:
        self._batch = None if entry is None else entry.batch_id.removeprefix("sha256:")
        self._number = 0

    def next(self) -> str | None:
        if self._batch is None:
            return None
        self._number += 1
        return f"{self._batch}-{self._number}"


def _check_gained(
    client: ClickHouseClient, entry: LedgerEntry | None, table: TableName, before: int
) -> None:
    """``TargetRowsUnproven`` (the route blocks) when the table gained another number of rows
    than the batch sent: counted after the insert, as no transaction spans it (a count of a
    MergeTree table is read from its parts' metadata)."""
    if entry is None or entry.sent is None:
        return
    gained = _count(client, table) - before
    if gained != entry.sent:
        raise TargetRowsUnproven.counted(
            entry.target_table, entry.batch_id, sent=entry.sent, applied=gained
        )


def _record(client: ClickHouseClient, entry: LedgerEntry | None, rows: int) -> int:
    """The batch's ledger row, after its rows (no transaction spans both); returns ``rows``."""
    if entry is not None:
        ledger = quote(LEDGER_TABLE)
        order = " ENGINE = MergeTree ORDER BY (target_table, seq)"
        client.command(
            ledger_table_sql(ledger, seq="UInt64", integer="UInt64", text="String", tail=order)
        )
        target, batch, text, partitions = entry.row()
        client.command(
            f"INSERT INTO {ledger} SELECT (SELECT count() + 1 FROM {ledger}), {{t:String}},"
            " {b:String}, {r:UInt64}, {e:String}, {p:String}",
            {"t": target, "b": batch, "r": rows, "e": text, "p": partitions},
        )
        if entry.rejects:  # after the rows too, one INSERT of all of them
            table = quote(REJECTS_TABLE)
            order = " ENGINE = MergeTree ORDER BY (target_table, batch_id)"
            sql = rejects_table_sql(table, text="String", nullable="Nullable(String)", tail=order)
            client.command(sql)
            write_rejects(
                lambda sql, values: _insert_values(client, sql, values),
                entry.rejects, target_table=target, batch_id=batch, table=table, marker="%s",
            )  # fmt: skip
    return rows


def _insert_values(client: ClickHouseClient, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """``sql`` (an INSERT ... VALUES of ``%s`` marks) once for all ``rows``, bound by name."""
    head, _, values = sql.partition(" VALUES ")
    width = values.count("%s")
    params: dict[str, Any] = {}
    groups = []
    for number, row in enumerate(rows):
        marks = []
        for index, value in enumerate(row[:width]):
            name = f"v{number}_{index}"
            marks.append("NULL" if value is None else f"{{{name}:String}}")
            if value is not None:
                params[name] = value
        groups.append("(" + ", ".join(marks) + ")")
    client.command(f"{head} VALUES {', '.join(groups)}", params)


_SQLITE_READ = "sqlite({src_path:String}, {src_table:String})"


class _PlanSQL:
    """A lazy plan's bounds as conditions on ``sqlite()``'s columns, and their parameters."""

    def __init__(self, plan: LoadPlan, source: SQLiteFile) -> None:
        if not os.path.isfile(source.path):
            raise SourceInvalid(
                f"source database for table {source.table!r} does not exist",
                diagnostics={"table": source.table},
            )
        self.params: dict[str, Any] = {
            "src_path": os.path.abspath(source.path),
            "src_table": source.table,
        }
        found = [
            bound_predicates(
                bounds, partition_column=source.partition_column, cursor_column=source.cursor_column
            )
            for bounds in plan.bounds
        ]
        self.conditions = []
        for number, predicates in enumerate(found):
            where, own = where_sql(predicates, prefix=f"b{number}_")
            self.conditions.append(f"({where})")
            self.params.update(own)
        # In one cursor window, at most one NULL key and either one value each (all texts or
        # all integers) or contiguous integer key ranges: a row's bound is then found by a
        # lookup of its value, or of the start of its range (``index``).
        windows = [
            predicates[partition_predicate_count(b) :]
            for b, predicates in zip(plan.bounds, found, strict=True)
        ]
        nulls = [
            n for n, b in enumerate(plan.bounds) if "partition" in b and b["partition"] is None
        ]
        self.keyed = [n for n in range(len(found)) if n not in nulls]
        self.null_bound = nulls[0] if len(nulls) == 1 else None
        self.lookup: str | None = None  # the values' parameter type, or "range"
        self.window: str | None = None  # with a lookup: the cursor window all bounds share
        self.envelope = ""  # with ranges: their keys, from the first one's start to the last's end
        if len(nulls) > 1 or not self.keyed or any(w != windows[0] for w in windows):
            return
        self.column = quote(source.partition_column)
        keyed = [plan.bounds[number] for number in self.keyed]
        values = [bounds.get("partition") for bounds in keyed]
        kinds = {type(value) for value in values}
        ranges = integer_range_starts(keyed)
        if ranges is not None:
            self.lookup, (starts, below) = "range", ranges
            self.params.update(
                (f"r{number}", start) for number, start in zip(self.keyed, starts, strict=True)
            )
            self.params["r_from"] = min(starts)
            limits = [f"{self.column} >= {{r_from:Int64}}"]  # roundDown lifts a lower key
            if below is not None:
                self.params["r_below"] = below
                limits.append(f"{self.column} < {{r_below:Int64}}")
            self.envelope = " AND ".join(limits)
        elif kinds in ({str}, {int}) and len(set(values)) == len(values):
            self.lookup = "String" if kinds == {str} else "Int64"
            self.params.update(
                (f"v{number}", value) for number, value in zip(self.keyed, values, strict=True)
            )
        else:
            return
        if windows[0]:
            self.window, own = where_sql(windows[0], prefix="w_")
            self.params.update(own)

    def statements(self, *, listed: bool) -> list[range]:
        """The bounds each statement reads: all in one when ``where`` finds them by the lookup
        (``listed`` as there) and there are at most ``_LOOKUP_BOUNDS``; otherwise OR-ed
        conditions, at most ``_PLAN_BOUNDS_PER_INSERT`` and ``_CONDITION_BYTES`` of them each
        (a condition longer than that alone). 1,000 partitions of 1,000,000 rows into chDB,
        legacy: 1.3 s in one statement, 52 s read by Python when pulls took 256."""
        count = len(self.conditions)
        looked_up = self.lookup is not None and (listed or self.window is not None)
        if looked_up and count <= _LOOKUP_BOUNDS:
            return [range(count)]
        parts, first, size = [], 0, 0
        for number, condition in enumerate(self.conditions):
            length = len(condition.encode())
            full = number - first == _PLAN_BOUNDS_PER_INSERT or size + length > _CONDITION_BYTES
            if number > first and full:
                parts.append(range(first, number))
                first, size = number, 0
            size += length
        return [*parts, range(first, count)] if count else []

    def where(self, numbers: range, *, listed: bool = False) -> str:
        """The condition that selects the rows of the bounds ``numbers``, which chDB pushes down
        to SQLite. As an OR of each bound's condition, SQLite tests each row against every
        bound. When nearly every row SQLite reads is planned, chDB keeps them by a lookup of
        each row's value instead (``index``, the same rows), and SQLite tests only the cursor
        window all bounds share: when the bounds are every partition listed (``listed``, a
        full refresh's), or share a cursor window (its partitions are those listed in it).
        1,000,000 rows in 100 partitions into chDB, legacy: a refresh 0.09 s less, a first
        append with a cursor 0.96 s against 1.87 s. An append without a window plans only
        the values not loaded yet, which an index on the column lets SQLite read alone."""
        whole = numbers == range(len(self.conditions))
        if self.lookup is not None and whole and (listed or self.window is not None):
            window = "" if self.window is None else f" AND ({self.window})"
            return f"{self.index()} != -1{window}"
        return " OR ".join(self.conditions[number] for number in numbers)

    def index(self) -> str:
        """The index of the bound a row belongs to, -1 for none: a lookup of the partition
        value (``transform``) when ``lookup``, else the first bound whose condition holds
        (``multiIf``, which took 0.15 s more of 1,000,000 rows in 100 bounds). The ``where``
        of the same bounds leaves out every row of none."""
        if self.lookup is None:
            tests = ", ".join(f"{condition}, {n}" for n, condition in enumerate(self.conditions))
            return f"multiIf({tests}, -1)"
        numbers = ", ".join(str(number) for number in self.keyed)
        if self.lookup == "range":  # the start of the range the key is in, if any is
            starts = "[" + ", ".join(f"{{r{number}:Int64}}" for number in self.keyed) + "]"
            found = f"transform(roundDown({self.column}, {starts}), {starts}, [{numbers}], -1)"
            lookup = f"if({self.envelope}, {found}, -1)"
        else:
            values = ", ".join(f"{{v{number}:{self.lookup}}}" for number in self.keyed)
            lookup = f"transform({self.column}, [{values}], [{numbers}], -1)"
        if self.null_bound is None:
            return lookup  # a NULL key: -1
        return f"if(isNull({self.column}), {self.null_bound}, {lookup})"


def _recut(
    raws: Sequence[Path], paths: Sequence[Path], bounds: int, *, table: str
) -> tuple[list[LoadFile], list[int]]:
    """Each pulled file (``raws``; a bound chDB found no row of has none) rewritten at its
    path as ``write_arrow_stream`` writes rows: without the tag, in ``ARROW_BLOCK_ROWS``-row
    batches, digested as written; and each bound's row count, from the tags."""
    pa, schema = arrow("the ClickHouse sink"), _pulled_schema(raws)
    width = schema.get_field_index(_BOUND_TAG)
    schema, counts, files = schema.remove(width), [0] * bounds, []
    for raw, path in zip(raws, paths, strict=True):
        with contextlib.ExitStack() as stack:
            writer = DigestWriter(stack.enter_context(create_private(path)))
            stream = stack.enter_context(pa.ipc.new_stream(writer, schema))
            cut = _Cut(pa, stream)
            if raw.exists():
                for batch in pa.ipc.open_stream(stack.enter_context(pa.OSFile(str(raw)))):
                    _count_tags(batch, counts, table=table)
                    cut.add(batch.select(range(width)))
            cut.flush()
        files.append(LoadFile(path=path, rows=cut.rows, sha256=writer.sha256, native=True))
    return _split_checked(files, counts, table=table)


def _kept(
    raws: Sequence[Path], paths: Sequence[Path], bounds: int, *, table: str
) -> tuple[list[LoadFile], list[int]]:
    """A full refresh's pulled files, kept as chDB wrote them, tag and batches: its load
    fills a fresh table, where no INSERT is retried, and reads the columns by name. Each
    file is read once, for its bounds' counts and the digest of those same bytes, and
    linked at its path (never over a file there); a bound chDB found no row of gets an
    empty stream. The rewrite ``_recut`` makes cost a 1M-row pull 0.05-0.1 s. Only the tag
    column is decoded (and decompressed): 0.022-0.024 s for a 1M-row file, against
    0.055-0.068 s decoding all its columns."""
    pa, schema = arrow("the ClickHouse sink"), _pulled_schema(raws)
    counts, files = [0] * bounds, []
    tag_only = pa.ipc.IpcReadOptions(included_fields=[schema.get_field_index(_BOUND_TAG)])
    for raw, path in zip(raws, paths, strict=True):
        if not raw.exists():
            with create_private(raw) as handle, pa.ipc.new_stream(handle, schema):
                pass
        before = sum(counts)
        with DigestReader(raw) as reader:
            for batch in pa.ipc.open_stream(reader, options=tag_only):
                _count_tags(batch, counts, table=table)
            sha256 = reader.digest()
        os.link(raw, path)
        os.chmod(path, 0o600)
        files.append(LoadFile(path=path, rows=sum(counts) - before, sha256=sha256, native=True))
    return _split_checked(files, counts, table=table)


def _copy_messages(
    pa: Any, reader: DigestReader, writer: DigestWriter, schema: Any, *, table: str
) -> Any:
    """Copy the Arrow IPC stream ``reader`` reads into ``writer``, message for message, without
    its end-of-stream marker; its schema message too when ``schema`` is None (the first file),
    else only checked equal to ``schema``. The schema it read is returned. Batches are not
    decoded or re-encoded (nor decompressed and compressed again): merging chDB's 100 files
    of 1,000,000 rows in all took 0.11-0.12 s that way, 0.04 s this way. A stream of
    dictionary batches, which no writer of load files makes, cannot be concatenated so."""
    messages = iter(pa.ipc.MessageReader.open_stream(reader))
    first = next(messages, None)
    if first is None:
        raise InternalInvariantBroken("a load file to merge is empty", diagnostics={"table": table})
    own = pa.ipc.read_schema(first)
    if schema is None:
        writer.write(first.serialize())
    elif not own.equals(schema):
        raise InternalInvariantBroken(
            "load files to merge differ in schema", diagnostics={"table": table}
        )
    for message in messages:
        if message.type != "record batch":
            raise InternalInvariantBroken(
                "a load file to merge holds a dictionary batch", diagnostics={"table": table}
            )
        writer.write(message.serialize())
    return own


def _pulled_schema(raws: Sequence[Path]) -> Any:
    """The Arrow schema chDB wrote its pulled files in, tag included."""
    found = [raw for raw in raws if raw.exists()]
    if not found:
        raise FileNotFoundError("chDB wrote no file")  # no row: Python reads, cheaply
    pa = arrow("the ClickHouse sink")
    with pa.OSFile(str(found[0])) as handle:
        return pa.ipc.open_stream(handle).schema


def _split_checked(
    files: list[LoadFile], counts: list[int], *, table: str
) -> tuple[list[LoadFile], list[int]]:
    """``(files, counts)``, once each of several files holds exactly its own bound's rows."""
    if len(files) > 1 and [file.rows for file in files] != counts:
        raise InternalInvariantBroken(
            "a pulled file holds another bound's rows", diagnostics={"table": table}
        )
    return files, counts


def _count_tags(batch: Any, counts: list[int], *, table: str) -> None:
    """Add a pulled batch's rows to their bounds' ``counts``, by the tag of each row."""
    pc: Any = import_driver("pyarrow.compute", needed_by="the ClickHouse sink")
    for entry in pc.value_counts(batch.column(_BOUND_TAG)).to_pylist():
        if not 0 <= entry["values"] < len(counts):  # -1: a row of no bound
            raise InternalInvariantBroken("a pulled row has no bound", diagnostics={"table": table})
        counts[entry["values"]] += entry["counts"]


class _Cut:
    """Batches written to ``stream`` in ``ARROW_BLOCK_ROWS``-row batches, whatever they came in:
    ClickHouse makes a block of each, and deduplicates a retried INSERT block by block."""

    def __init__(self, pa: Any, stream: Any) -> None:
        self.pa, self.stream = pa, stream
        self.pending: list[Any] = []
        self.waiting = self.rows = 0

    def add(self, batch: Any) -> None:
        self.pending.append(batch)
        self.waiting += batch.num_rows
        while self.waiting >= ARROW_BLOCK_ROWS:
            self._write(ARROW_BLOCK_ROWS)

    def flush(self) -> None:
        if self.waiting:
            self._write(self.waiting)

    def _write(self, rows: int) -> None:
        table = self.pa.Table.from_batches(self.pending)
        self.stream.write_batch(table.slice(0, rows).combine_chunks().to_batches()[0])
        self.pending = table.slice(rows).to_batches()
        self.waiting -= rows
        self.rows += rows


def _plan_inserts(
    plan: LoadPlan, source: SQLiteFile, *, table: str
) -> tuple[_PlanSQL, str, list[str]]:
    """lazy-plan's INSERTs: the plan's conditions, the column list and each statement's
    ``WHERE``; ``ConfigInvalid`` when a statement would be longer than chDB parses (long
    column names or bound values), before the target call: it would fail inside it."""
    bounds = _PlanSQL(plan, source)
    names = column_list([column.name for column in plan.columns])
    listed = plan.replace
    wheres = [bounds.where(part, listed=listed) for part in bounds.statements(listed=listed)]
    if any(len(where.encode()) + 2 * len(names.encode()) > _STATEMENT_BYTES for where in wheres):
        raise ConfigInvalid(
            f"lazy-plan into ClickHouse table {table!r} cannot name these partitions in a "
            "statement chDB parses (its column names or partition conditions are too long): "
            "use the legacy, staged or file-artifact path",
            diagnostics={"table": table},
        )
    return bounds, names, wheres


def _with_safe_names(plan: LoadPlan, *, table: str) -> SQLiteFile:
    """The plan's source, when ``sqlite()`` can name its table and columns: it mis-quotes
    backslashes, double quotes and control characters. No read of the source."""
    source = pulled_file(plan, engine="ClickHouse", table=table)
    columns = [column.name for column in plan.columns]
    for name in (source.table, source.partition_column, source.cursor_column, *columns):
        if name is not None and _SQLITE_FUNCTION_UNSAFE.search(name):
            raise PlanInexact(
                f"lazy-plan into ClickHouse cannot read source identifier {name!r}: the "
                "sqlite() table function mis-quotes backslashes, double quotes and control "
                "characters (use another path)",
                diagnostics={"table": table, "identifier": name},
            )
    return source


def _in_background(call: Callable[[], None]) -> Future[None]:
    """``call()`` started in a daemon thread; the future holds its outcome (its exception
    untouched). Daemon: a run that fails before waiting for it does not wait at exit."""
    future: Future[None] = Future()

    def run() -> None:
        try:
            call()
        except BaseException as error:  # handed to whoever waits, as it was raised
            future.set_exception(error)
        else:
            future.set_result(None)

    threading.Thread(target=run, name="dpone-chdb-check", daemon=True).start()
    return future


def _unlink(paths: Iterable[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _ref(table: TableName) -> str:
    return table.sql(quote)


def _create(client: ClickHouseClient, table: TableName, create: str) -> None:
    """Run ``create`` for ``table``, making its database first when it names one."""
    if table.schema is not None:
        client.command(f"CREATE DATABASE IF NOT EXISTS {quote(table.schema)}")
    client.command(create)


def _in_database(table: TableName) -> tuple[str, dict[str, str]]:
    """The ``system.*`` condition of a table's database (the one it names, else the
    client's current one) and of its name, with their parameters."""
    if table.schema is None:
        return "database = currentDatabase() AND table = {table:String}", {"table": table.name}
    condition = "database = {database:String} AND table = {table:String}"
    return condition, {"database": table.schema, "table": table.name}


def _exists(client: ClickHouseClient, table: TableName) -> bool:
    return bool(_columns(client, table))


def _columns(client: ClickHouseClient, table: TableName) -> list[tuple[str, str]]:
    condition, params = _in_database(table)
    rows = client.query_rows(
        f"SELECT name, type FROM system.columns WHERE {condition} ORDER BY position", params
    )
    return [(name, kind) for name, kind in rows]


def _count(client: ClickHouseClient, table: TableName) -> int:
    if not _exists(client, table):
        return 0
    return int(client.query_rows(f"SELECT count() FROM {_ref(table)}")[0][0])


def _written(client: ClickHouseClient, table: TableName, before: int) -> int:
    """Rows an engine-side INSERT wrote: the count now minus ``before``.

    Drivers differ in reporting written rows (clickhouse-connect's chdb
    backend reports none); ``count()`` is cheap on MergeTree and the
    difference is exact while dpone is the table's only writer.
    """
    return _count(client, table) - before


def _partition_ids(client: ClickHouseClient, table: TableName) -> list[str]:
    condition, params = _in_database(table)
    rows = client.query_rows(
        f"SELECT DISTINCT partition_id FROM system.parts WHERE {condition}"
        " AND active ORDER BY partition_id",
        params,
    )
    return [row[0] for row in rows]
