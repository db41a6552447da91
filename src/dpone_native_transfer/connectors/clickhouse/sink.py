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
- A merge (``payload.merge``, ``merge=``) fills a plain table of the batch's rows, then one
  ``INSERT ... SELECT`` writes one row per key into the ``ReplacingMergeTree`` target that
  readers query with ``FINAL`` (``merge.py``); the batch's rows carry its id, so counting
  them proves it.

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
import tempfile
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
from ...drivers import ServerFailure, clickhouse_failure
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
from ...payloads import Column, LoadFile, LoadFiles, LoadPlan, Merge, RowChunks
from ...rejects import REJECTS_TABLE, rejects_query, rejects_table_sql, write_rejects
from .._arrow import arrow
from .._merge import refuse_text_compared, unmergeable
from .._sql import (
    STAGE_PREFIX,
    ColumnDifference,
    TableName,
    check_target_table,
    check_writable,
    difference,
    parse_table,
    refuse_reserved_schema,
    unavailable,
)
from ..contract import Sink, SinkFeatures, Unsupported
from ..contract.engine import EnginePull
from ..contract.postgres_table import PostgresTable
from ..sqlite_reading import (
    narrow_plan,
    number_text_misread,
    pulled_file,
    refuse_inexact_plan,
    watching_writes,
)
from .chdb_client import ChdbClient
from .client import CHDB, ClickHouseClient, Location, parse_location
from .merge import (
    BATCH,
    MERGE_ALIAS,
    MERGE_COLUMNS,
    ROWS,
    VERSION,
    merge_insert_sql,
    merge_table_problem,
    merge_table_sql,
    orders_as_source,
)
from .pg_pulls import POSTGRES_READ, PULL_SETTINGS, PostgresRead, outside, postgres_read
from .pulls import (
    BOUND_TAG,
    SQLITE_READ,
    PlanSQL,
    copy_messages,
    in_background,
    kept,
    plan_inserts,
    recut,
    unlink_all,
    with_safe_names,
)
from .server_client import ServerClient
from .sql import (
    DEDUPLICATION_WINDOW,
    MADE_TYPES,
    MAX_DECIMAL_PRECISION,
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
    write_arrow_stream,
)

__all__ = ["ClickHouseSink", "open_client"]

T = TypeVar("T")

_FRESH_PREFIX = "_dpone_new_"
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"  # an Arrow IPC stream's last 8 bytes

# ClickHouse's own databases; chDB's holds its temporary tables.
_RESERVED_DATABASES = ("system", "information_schema", "_temporary_and_external_tables")
# The engines an append or a full refresh loads: they keep every row they are sent. Others
# keep fewer: the MergeTrees that collapse rows of one key (Replacing, Summing...), Join,
# Set, EmbeddedRocksDB and KeeperMap one row per key, Null none.
_KEEPING_EVERY_ROW = frozenset(
    {"MergeTree", "ReplicatedMergeTree", "SharedMergeTree", "Log", "TinyLog", "StripeLog",
     "Memory"}
)  # fmt: skip
# ClickHouse names a table's metadata files by its name escaped (a byte other than
# [A-Za-z0-9_] is %XX): ``<table>.sql.detached``, and ``<database>.<table>.<uuid>.sql`` once
# dropped. With 255-byte file names, a longer one cannot be created (206 in chDB's default).
_NAME_MAX = 255
_UUID = "00000000-0000-0000-0000-000000000000"
_WORD_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")

Fill = Callable[[ClickHouseClient, TableName, "_Tokens"], int]
_LEDGER = TableName(None, LEDGER_TABLE)


def open_client(location: Location) -> ClickHouseClient:
    """Open the adapter for ``location``; the caller closes it."""
    if location.kind == CHDB:
        return ChdbClient(location.target)
    return ServerClient(location.target)


def _pulled_columns(columns: Sequence[Column]) -> str:
    """A pull's columns, each ``timestamp`` and ``numeric`` one cast to its target type as
    lazy-plan's ``INSERT ... SELECT`` casts it: ``sqlite()`` reads them as texts, which
    ClickHouse's ``ArrowStream`` reader would convert otherwise (it made ``Z`` instants
    NULL)."""
    return ", ".join(
        f"CAST({quote(c.name)} AS {column_type(c)}) AS {quote(c.name)}"
        if c.kind in ("timestamp", "numeric")
        else quote(c.name)
        for c in columns
    )


_CHDB_PATTERN = "*?{"  # what makes chDB read a table's name as a file path pattern


class ClickHouseSink(Sink, EnginePull):
    """One target table in chDB (``location`` a path) or on a server (a URL).

    ``partition_by`` names the partition column (the route's source partition
    column): tables are then ``MergeTree PARTITION BY`` it; without it they
    are unpartitioned MergeTree tables.
    """

    pulled_suffix = ".arrows"  # an Arrow IPC stream, as write_load_file writes
    stages = True  # chDB fills the stage from a SQLite source itself (``pull_stage``)

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
        if self._location.kind == CHDB and any(char in table for char in _CHDB_PATTERN):
            # chDB (clickhouse-local) reads such a name as a file's path pattern: every
            # statement on the table failed, the first one inside the target call
            raise ConfigInvalid(
                f"target table {table!r} holds *, ? or {{, which chDB reads as a file path "
                "pattern, not a table name; choose another name",
                diagnostics={"key": "target.table"},
            )
        _check_name_length(self._stage, table)  # the longest name it makes beside the target
        self.partition_by = partition_by
        # the ledger row follows the rows, so its absence proves nothing, and nothing keeps a
        # fence; chDB runs in the worker's process, so a dead worker has no insert left in
        # flight, while a server may still be running one it was sent
        self.features = SinkFeatures(
            name="ClickHouse",
            ledger_atomic=False,
            fence=False,
            inserts_end_with_their_process=self._location.kind == CHDB,
            merges=True,  # into a ReplacingMergeTree, one INSERT per batch (merge.py)
            merge_batch_column=BATCH,
        )
        self._checked: LoadPlan | None = None  # the last plan check_plan passed
        self._checking: tuple[LoadPlan, Future[None]] | None = None  # can_pull's, running
        self._postgres: tuple[LoadPlan, PostgresRead] | None = None  # a PostgreSQL plan's read
        self._holding = False  # within holding_connection
        self._held: ClickHouseClient | None = None  # its client, once a call opened it

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
    def kind(self) -> str:
        """``chdb`` or ``server``."""
        return self._location.kind

    def engine(self) -> ClickHouseSink:
        return self

    @property
    def _stage(self) -> TableName:
        return self._target.sibling(STAGE_PREFIX)

    @property
    def _fresh(self) -> TableName:
        return self._target.sibling(_FRESH_PREFIX)

    @contextlib.contextmanager
    def holding_connection(self) -> Iterator[None]:
        """One session for the attempt's calls (opened by the first)."""
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
        if self.kind == "chdb" and os.path.isdir(self._location.target):
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

    def load(self, payload: RowChunks, *, ledger: LedgerEntry | None = None) -> int:
        """Write the payload into the target and return the rows written: load files as the
        engine reads them (Arrow natively), other rows as Arrow batches. A merge's rows go
        into a plain table of their own first (``_dpone_new_<table>``), merged from there."""
        if isinstance(payload, LoadFiles):
            fill = self._files_fill(payload)
        else:
            fill = self._rows_fill(payload)
        if payload.merge is None:
            return self._load(payload, fill, ledger)
        batch = self._fresh
        create = create_table_sql(batch, payload.columns, None)  # checks
        with self.client() as client:
            client.command(f"DROP TABLE IF EXISTS {_ref(batch)} SYNC")
            _create(client, batch, create)
            try:
                fill(client, batch, _Tokens(None))
                rows = self._merge(client, batch, payload.merge, ledger)
            finally:
                with contextlib.suppress(Exception):
                    client.command(f"DROP TABLE IF EXISTS {_ref(batch)} SYNC")
            return _record(client, ledger, rows)

    def _merge(
        self, client: ClickHouseClient, batch: TableName, merge: Merge, entry: LedgerEntry | None
    ) -> int:
        """Merge table ``batch`` into the target (``merge.merge_insert_sql``, creating the
        target first), then prove it: the rows of the batch, counted by ``_dpone_batch``,
        stand for every row sent (``TargetRowsUnproven`` otherwise, as when ``batch`` holds
        another number, found before the target is touched). The rows received."""
        columns = _columns(client, batch)
        received = _count(client, batch)
        sent = None if entry is None else entry.sent
        if entry is not None and sent is not None and received != sent:
            raise TargetRowsUnproven.counted(
                entry.target_table, entry.batch_id, sent=sent, applied=received
            )
        if not _exists(client, self._target):
            kept = [(name, kind) for name, kind in columns if name != merge.deleted]
            _create(client, self._target, merge_table_sql(self._target, kept, merge))
        elif entry is not None:  # a table made by hand may have no window yet
            window = f"MODIFY SETTING {DEDUPLICATION_WINDOW}"
            client.command(f"ALTER TABLE {_ref(self._target)} {window}")
        names = [name for name, _ in _columns(client, self._target) if name not in MERGE_COLUMNS]
        found = client.query_rows(f"SELECT max({quote(VERSION)}) FROM {_ref(self._target)}")
        batch_id = "" if entry is None else entry.batch_id
        sql = merge_insert_sql(
            _ref(self._target), _ref(batch), [name for name, _ in columns], names, merge,
            settings=insert_settings(_Tokens(entry).next()),
        )  # fmt: skip
        client.command(sql, {"version": int(found[0][0] or 0) + 1, "batch": batch_id})
        if entry is not None and sent is not None:
            applied = _batch_rows(client, self._target, BATCH, batch_id)
            if applied != sent:
                raise TargetRowsUnproven.counted(
                    entry.target_table, entry.batch_id, sent=sent, applied=applied
                )
        return received

    def load_plan(self, plan: LoadPlan, *, ledger: LedgerEntry | None = None) -> int:
        """The engine pulls the plan's partitions from the SQLite source (``_plan_fill``)."""
        return self._load(plan, self._plan_fill(plan), ledger)

    def _load(self, payload: RowChunks | LoadPlan, fill: Fill, entry: LedgerEntry | None) -> int:
        create = create_table_sql(self._target, payload.columns, self.partition_by)  # checks
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
        """The Arrow stream ``insert_rows`` writes, in fixed-size batches; the
        rows themselves when ``file()`` would read the path as a pattern."""
        if file_pattern(path):
            return iter(chunks)
        return write_arrow_stream(path, columns, chunks, table=self.table)

    def merge_load_files(self, payload: LoadFiles, folder: Path) -> LoadFiles:
        """Arrow files (one per partition) are copied in
        order into one new ``merged.arrows`` in ``folder``, each file's digest checked as it is
        read. An INSERT costs chDB a fixed time whatever its size: one per partition was most
        of file-artifact's time (figures: docs/performance.md, fix 32). The record batches
        are copied as IPC messages, bytes as written (``copy_messages``), so each stays a
        block of its own and a retried load deduplicates as before. Files in the runtime's
        format are kept."""
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
                        schema = copy_messages(pa, reader, writer, schema, table=self.table)
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
            named = {column.name for column in columns}  # one of them: check_merge refuses
            existing = [
                (name, kind)
                for name, kind in _columns(client, self._target)
                if name not in MERGE_COLUMNS or name in named
            ]
            if not existing:
                return None
            condition, params = _in_database(self._target)
            computed = client.query_rows(  # an INSERT names neither kind
                f"SELECT name FROM system.columns WHERE {condition}"
                " AND default_kind IN ('MATERIALIZED', 'ALIAS')",
                params,
            )
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

        unwritable = [name for (name,) in computed]
        return difference(existing, columns, takes=takes, unwritable=unwritable)

    def check_merge(self, merge: Merge, columns: Sequence[Column]) -> None:
        """Refuse, before the target call, a source column of the name of one of dpone's
        (``merge.MERGE_COLUMNS``), and an existing table that is not the one a merge route
        makes (``merge.merge_table_problem``): a plain MergeTree table would keep every
        version, and another ``ORDER BY`` would replace rows of other keys. A key kept as
        text, or ``citext``, as the other targets (``refuse_text_compared``)."""
        refuse_text_compared(
            merge, columns, target="ClickHouse",
            kept_as_text=lambda c: column_type(c) in ("String", "Nullable(String)"),
        )  # fmt: skip
        for column in columns:
            if column.name in MERGE_COLUMNS or column.name.startswith(MERGE_ALIAS):
                raise unmergeable(self.table, "a source column has the name of a column dpone "
                                  "keeps in a merge route's table", column=column.name)  # fmt: skip
            if column.name == merge.version and not orders_as_source(column):
                raise ConfigInvalid(
                    f"source.cursor_column {column.name!r} of a merge route into ClickHouse "
                    f"table {self.table!r} is of a kind ClickHouse keeps as text ({column.kind}),"
                    " which would compare versions otherwise than the source does; nothing was"
                    " written; use a cursor of integers, numbers, texts, dates or timestamps",
                    diagnostics={"key": "source.cursor_column", "column": column.name},
                )
        compared = {
            c.name: column_type(c) for c in columns if c.name in (*merge.key, merge.version)
        }
        with self.client() as client:
            condition, params = _in_database(self._target)
            found = client.query_rows(
                "SELECT engine_full, sorting_key, partition_key FROM system.tables"
                f" WHERE {condition}",
                params,
            )
            if not found:
                return
            types = dict(_columns(client, self._target))
            listed = ", ".join(quote(name) for name in merge.key)
            key = client.query_rows(
                "SELECT formatQuerySingleLine({q:String})", {"q": f"SELECT {listed}"}
            )[0][0].removeprefix("SELECT ")
        engine, sorting, partition = found[0]
        problem = merge_table_problem(self.table, engine, sorting, partition, types, key)
        if problem is not None:
            raise problem
        for name, made in compared.items():  # the key and the version compare as dpone's
            if types.get(name) not in (made, made.removeprefix("Nullable(")[:-1]):
                why = "a key or cursor column is of another type than dpone makes it"
                raise unmergeable(self.table, why, column=name)

    def check_keeps_rows(self, columns: Sequence[Column]) -> None:
        """An append or full refresh into a table of an engine that keeps fewer rows than it
        is sent (a merge route's ``ReplacingMergeTree``, a hand-made ``SummingMergeTree``,
        ``Join``, ``Null``) would lose rows: at once, and the count then came short inside
        the target call and blocked the route, or later, in a background merge, silently."""
        with self.client() as client:
            condition, params = _in_database(self._target)
            found = client.query_rows(f"SELECT engine FROM system.tables WHERE {condition}", params)
        engine = found[0][0] if found else "MergeTree"  # none yet: dpone makes a MergeTree
        if engine not in _KEEPING_EVERY_ROW:
            raise ConfigInvalid(
                f"target table {self.table!r} is of engine {engine}, which does not keep every"
                " row it is sent; nothing was written; an append or full refresh route needs a"
                " table that keeps them (MergeTree, Log, Memory), and a ReplacingMergeTree"
                " table a merge route made is loaded by that merge route only",
                diagnostics={"table": self.table, "engine": engine},
            )

    def add_columns(self, columns: Sequence[Column]) -> None:
        """One ALTER for all of them; ClickHouse adds columns as a metadata change."""
        added = ", ".join(f"ADD COLUMN {quote(c.name)} {column_type(c)}" for c in columns)
        with self.client() as client:
            client.command(f"ALTER TABLE {_ref(self._target)} {added}")

    def check_plan(self, plan: LoadPlan) -> None:
        """Refuse a plan the engine cannot pull, before anything touches the target: of a
        PostgreSQL source, on chDB only (``postgres_read``)."""
        if isinstance(plan.source, PostgresTable):
            if self._location.kind != CHDB:
                raise Unsupported("a pull of a PostgreSQL source by a ClickHouse server")
            self._postgres = (plan, postgres_read(plan, table=self.table))
            self._checked = plan
            return
        source = with_safe_names(plan, table=self.table)
        engine_reads = {
            column.name: number_text_misread(column.decimal(MAX_DECIMAL_PRECISION))
            for column in plan.columns
            if column.kind == "numeric"
        }
        refuse_inexact_plan(
            source, plan.columns, engine="ClickHouse", table=self.table, engine_reads=engine_reads
        )
        plan_inserts(plan, source, table=self.table)
        self._checked = plan  # the load of this very plan need not check it again

    def _plan_fill(self, payload: LoadPlan) -> Fill:
        """The engine pulls the partitions from the SQLite file with its sqlite() table function,
        in as few INSERTs as ``PlanSQL.statements`` allows: it reads the whole file for each
        statement when the partition column has no index."""
        if isinstance(payload.source, PostgresTable):
            if self._postgres is None or self._postgres[0] is not payload:
                self.check_plan(payload)  # a load without the check, or a second one
            return self._postgres_fill(payload, self._postgres_read(payload))
        if self._checked is not payload:
            self.check_plan(payload)
        source = pulled_file(payload, engine="ClickHouse", table=self.table)
        bounds, names, wheres = plan_inserts(payload, source, table=self.table)

        def fill(client: ClickHouseClient, table: TableName, tokens: _Tokens) -> int:
            before = _count(client, table)
            for where in wheres:
                client.command(
                    f"INSERT INTO {_ref(table)} ({names}){insert_settings(tokens.next())}"
                    f" SELECT {names} FROM {SQLITE_READ} WHERE {where}",
                    bounds.params,
                )
            return _written(client, table, before)

        return fill

    def _postgres_fill(self, plan: LoadPlan, read: PostgresRead) -> Fill:
        """lazy-plan from PostgreSQL: chDB reads the partitions with ``postgresql()``, one
        ``INSERT ... SELECT`` per statement of ``PlanSQL.statements``, each with its own
        deduplication token, as from SQLite."""
        bounds, listed = read.bounds, plan.replace
        names = column_list([column.name for column in plan.columns])
        wheres = [bounds.where(part, listed=listed) for part in bounds.statements(listed=listed)]

        def fill(client: ClickHouseClient, table: TableName, tokens: _Tokens) -> int:
            before = _count(client, table)
            for where in wheres:
                try:
                    client.command(
                        f"INSERT INTO {_ref(table)} ({names}){insert_settings(tokens.next())}"
                        f" SELECT {read.columns} FROM {POSTGRES_READ} WHERE {where}"
                        f" SETTINGS {PULL_SETTINGS}",
                        bounds.params,
                    )
                except NativeTransferError:
                    raise
                except Exception:  # chDB's text may quote a row's value: never chained
                    pass
                else:
                    continue
                raise SourceInvalid(
                    f"chDB could not read the source rows of target table {self.table!r} "
                    "from PostgreSQL (the table, the login's privileges or the server)",
                    diagnostics={"table": self.table},
                )
            return _written(client, table, before)

        return fill

    def _postgres_read(self, plan: LoadPlan) -> PostgresRead:
        """The read ``check_plan`` or ``can_pull`` made of this very plan."""
        checked, self._postgres = self._postgres, None
        if checked is None or checked[0] is not plan:
            raise InternalInvariantBroken(
                "ClickHouseSink was asked to pull a plan it did not check",
                diagnostics={"table": self.table},
            )
        return checked[1]

    def _can_pull_postgres(self, plan: LoadPlan, files: int) -> bool:
        """A PostgreSQL source's plan, when ``postgres_read`` takes it and one statement reads
        it; its read kept for the pull. Reads the source's catalog (and, with a date or
        timestamp column, scans the partitions once)."""
        try:
            read = postgres_read(plan, table=self.table, values=False)  # asked after the pull
        except ConfigInvalid:  # PlanInexact, Unsupported, a bound parameters do not take
            return False
        if len(read.bounds.statements(listed=plan.replace)) > 1:
            return False
        self._postgres = (plan, read)
        return True

    def can_pull(self, plan: LoadPlan, files: int) -> bool:
        """On chDB (a server cannot write the client's files): partitions one
        statement reads (``PlanSQL.statements``), at most ``open_files_allowed()`` files (chDB
        holds each open while it writes), and no source column named as the pull's tag.
        Lazy-plan's checks, that the engine reads every value as the row paths carry it, start
        here in a thread of their own: SQLite reads the source for them while chDB pulls it
        (both release the GIL, so the two overlap; figures: docs/performance.md, fix 34), and
        ``pull_load_files`` keeps the pull only when they accept the plan."""
        if self._location.kind != CHDB or files not in (1, len(plan.bounds)):
            return False
        if files > open_files_allowed():
            return False
        if BOUND_TAG in {column.name.lower() for column in plan.columns}:
            return False
        if isinstance(plan.source, PostgresTable):
            return self._can_pull_postgres(plan, files)
        if narrow_plan(plan):  # dpone reads it through an index; sqlite() reads it all
            return False
        try:
            bounds = PlanSQL.of_sqlite(plan, with_safe_names(plan, table=self.table))
        except ConfigInvalid:  # a bound value ClickHouse parameters do not take, too
            return False
        if len(bounds.statements(listed=plan.replace)) > 1:
            return False
        self._checking = (plan, in_background(lambda: self.check_plan(plan)))
        return True

    def pull_load_files(
        self, plan: LoadPlan, paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        """One ``INSERT INTO FUNCTION file(..., 'ArrowStream') SELECT ... FROM
        sqlite()`` of the plan's partitions (lazy-plan's conditions and read, so the same rows
        and values), each row tagged with its bound's index, into a scratch folder: one file,
        or one per bound (``PARTITION BY`` the tag). Each is rewritten at its path without the
        tag, in the batches ``write_load_file`` writes (``recut``), so a retried INSERT
        deduplicates block by block; a full refresh's files are kept as written
        (``kept``). None when chDB's read failed or the source was written meanwhile
        (``watching_writes``); no file is left. From PostgreSQL, ``postgresql()``'s one
        statement reads every bound in one snapshot of its own (no write to watch)."""
        if isinstance(plan.source, PostgresTable):
            read = self._postgres_read(plan)
            try:
                pulled = self._pull(plan, paths, read.bounds, POSTGRES_READ, read.columns,
                                    PULL_SETTINGS)  # fmt: skip
                if pulled is not None and not outside(plan, read.limits, read.tiny):
                    return pulled  # else a value chDB read otherwise: thrown away
            except BaseException:
                unlink_all(paths)
                raise
            unlink_all(paths)
            return None
        return self._read_checked(plan, lambda: self._pull(plan, paths), lambda: unlink_all(paths))

    def pull_stage(self, plan: LoadPlan) -> list[int] | None:
        """One ``INSERT INTO`` the fresh stage ``SELECT ... FROM sqlite()`` of
        the plan's partitions (the pull's conditions and read), then each bound's count by
        the pull's tag over the staged rows; no file is written or read. None, and no stage
        left, when chDB's read failed, the source was written meanwhile, or the stage holds
        a partition or cursor column in a type other than chDB reads it as (the tag could
        then differ from the pull's). Faster than staging through the pulled file (figures:
        docs/performance.md, fix 47). From PostgreSQL: ``postgresql()``'s one statement.
        """

        def drop() -> None:
            with contextlib.suppress(Exception):
                self.discard_stage()

        if isinstance(plan.source, PostgresTable):
            read = self._postgres_read(plan)
            try:
                staged = self._fill_stage_postgres(plan, read)
                if staged is not None and not outside(plan, read.limits, read.tiny):
                    return staged  # else a value chDB read otherwise: thrown away
            except BaseException:
                drop()
                raise
            drop()
            return None

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

    def _fill_stage_postgres(self, plan: LoadPlan, read: PostgresRead) -> list[int] | None:
        """The stage filled by ``postgresql()``, each bound's count by the pull's tag over the
        staged rows, when the stage holds the partition and cursor columns in the types the
        pull casts them to (a stage made as an older target may not)."""
        bounds, stage = read.bounds, _ref(self._stage)
        where = bounds.where(range(len(plan.bounds)), listed=plan.replace)
        names = column_list([column.name for column in plan.columns])
        source = plan.source
        keys = {source.partition_column, source.cursor_column} - {None}
        made = {c.name: column_type(c) for c in plan.columns if c.name in keys}
        try:
            with self.client() as client:
                self._new_stage(client, plan.columns)
                staged = dict(_columns(client, self._stage))
                if any(staged.get(name) != type_ for name, type_ in made.items()):
                    return None
                client.command(
                    f"INSERT INTO {stage} ({names}) SELECT {read.columns} FROM {POSTGRES_READ}"
                    f" WHERE {where} SETTINGS {PULL_SETTINGS}",
                    bounds.params,
                )
                tagged = client.query_rows(
                    f"SELECT toInt32({bounds.index()}) AS i, count() FROM {stage} GROUP BY i",
                    bounds.params,
                )
        except Exception:  # of any type: chDB's own, never worded (it may quote a value)
            return None
        counts = [0] * len(plan.bounds)
        for index, rows in tagged:
            if not 0 <= index < len(counts):
                return None
            counts[index] += rows
        return counts

    def _fill_stage(self, plan: LoadPlan) -> list[int] | None:
        source = pulled_file(plan, engine="ClickHouse", table=self.table)
        bounds, stage = PlanSQL.of_sqlite(plan, source), _ref(self._stage)
        where = bounds.where(range(len(plan.bounds)), listed=plan.replace)
        names = column_list([column.name for column in plan.columns])
        keys = [key for key in (source.partition_column, source.cursor_column) if key is not None]
        try:
            with self.client() as client:
                described = client.query_rows(f"DESCRIBE TABLE {SQLITE_READ}", bounds.params)
                self._new_stage(client, plan.columns)
                staged = dict(_columns(client, self._stage))
                read = {name.lower(): (name, type_) for name, type_, *_ in described}
                for key in keys:  # SQLite matches names case-insensitively
                    name, type_ = read.get(key.lower(), (key, None))
                    if type_ is None or staged.get(name) not in (type_, f"Nullable({type_})"):
                        return None  # NOT NULL in SQLite: T, where dpone makes Nullable(T)
                client.command(
                    f"INSERT INTO {stage} ({names}) SELECT {names} FROM {SQLITE_READ}"
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
        self,
        plan: LoadPlan,
        paths: Sequence[Path],
        bounds: PlanSQL | None = None,
        read: str = SQLITE_READ,
        names: str | None = None,
        settings: str = "max_threads = 1",
    ) -> tuple[list[LoadFile], list[int]] | None:
        """The pull into files (``pull_load_files``): from ``read`` (``sqlite()`` of the plan's
        file, unless another read, its conditions and columns are given)."""
        if file_pattern(paths[0].parent):  # file() would write elsewhere: Python reads
            return None
        if bounds is None:
            bounds = PlanSQL.of_sqlite(
                plan, pulled_file(plan, engine="ClickHouse", table=self.table)
            )
        where = bounds.where(range(len(plan.bounds)), listed=plan.replace)
        params = dict(bounds.params)
        names, tag = names or _pulled_columns(plan.columns), quote(BOUND_TAG)
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
                        f" FROM {read} WHERE {where} SETTINGS {settings}",
                        params,
                    )
                rewrite = kept if plan.replace else recut
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
            self._new_stage(client, payload.columns, plain=payload.merge is not None)
            try:
                if isinstance(payload, LoadFiles):
                    return self._files_fill(payload)(client, self._stage, _Tokens(None))
                return client.insert_rows(stage, payload.columns, payload.chunks, token=None)
            except BaseException:
                with contextlib.suppress(Exception):
                    client.command(f"DROP TABLE IF EXISTS {stage} SYNC")
                raise

    def _new_stage(
        self, client: ClickHouseClient, columns: Sequence[Column], *, plain: bool = False
    ) -> None:
        """A fresh, empty staging table shaped like the target (made from ``columns`` when
        there is no target yet, or ``plain``: a merge's batch, every column of the rows)."""
        create = create_table_sql(self._stage, columns, None if plain else self.partition_by)
        client.command(f"DROP TABLE IF EXISTS {_ref(self._stage)} SYNC")
        if not plain and _exists(client, self._target):
            client.command(f"CREATE TABLE {_ref(self._stage)} AS {_ref(self._target)}")
        else:
            _create(client, self._stage, create)

    def staged_row_count(self) -> int:
        with self.client() as client:
            return _count(client, self._stage)

    def finalize_staged_load(
        self,
        *,
        replace: bool = False,
        ledger: LedgerEntry | None = None,
        merge: Merge | None = None,
    ) -> int:
        """Move the staged rows into the target with partition operations; drop the stage.

        ``replace``: ``REPLACE PARTITION ... FROM`` the stage for every staged
        partition, then ``DROP PARTITION`` for target partitions the stage does
        not hold. Otherwise ``INSERT ... SELECT`` from the stage. ``merge``: the stage (a
        plain table of the batch's rows) is merged into the target as ``load`` merges.
        """
        stage, target, entry = _ref(self._stage), _ref(self._target), ledger
        if merge is not None:
            with self.client() as client:
                if not _exists(client, self._stage):
                    raise ConfigInvalid(
                        f"no staged load exists for target table {self.table!r}",
                        diagnostics={"table": self.table},
                    )
                rows = self._merge(client, self._stage, merge, entry)
                client.command(f"DROP TABLE {stage} SYNC")
                return _record(client, entry, rows)
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
        """This table's rows set aside. Reads only."""
        rejects = TableName(None, REJECTS_TABLE)
        with self.client() as client:
            if not _exists(client, rejects):
                return []
            sql = rejects_query(quote(REJECTS_TABLE), "{t:String}")
            return client.query_rows(sql, {"t": self.identity().table})

    def batch_rows(self, column: str, batch_id: str) -> int:
        """The rows of the target table whose ``column`` holds
        ``batch_id`` (0 when the table or the column does not exist); a merge route's table
        counts the batch's rows its rows stand for (``_dpone_rows``). Reads only."""
        with self.client() as client:
            return _batch_rows(client, self._target, column, batch_id)

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


def _batch_rows(client: ClickHouseClient, table: TableName, column: str, batch_id: str) -> int:
    """The rows of ``table`` whose ``column`` holds ``batch_id``, every row not ``FINAL``:
    on a merge route's table (``_dpone_batch``) the sum of their ``_dpone_rows``."""
    names = [name for name, _ in _columns(client, table)]
    if column not in names:
        return 0
    counted = "count()"
    if column == BATCH and ROWS in names:
        counted = f"toUInt64(sum({quote(ROWS)}))"
    found = client.query_rows(
        f"SELECT {counted} FROM {_ref(table)} WHERE {quote(column)} = {{b:String}}",
        {"b": batch_id},
    )
    return int(found[0][0])


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
