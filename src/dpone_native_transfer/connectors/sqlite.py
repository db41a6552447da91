"""SQLite source and sink connectors.

Every call opens its own connection and closes it before returning, so other
workers and child processes can use the same files between calls. Identifiers
are always quoted and values always bound as parameters. Errors raised here on
purpose name tables and columns only, never the file path or a sqlite message.
The payloads they take are the connector-neutral ones of ``payloads``.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import itertools
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from ..artifacts import check_digest, create_private, file_sha256, read_chunks
from ..checkpoints import sha256_digest
from ..column_types import Carry, finite_double, sqlite_kind
from ..drivers import file_failure
from ..errors import (
    ConfigInvalid,
    SourceAccessRefused,
    SourceInvalid,
    SourceMissing,
    TargetRowsMismatch,
    ValueUnsupported,
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
    SourceShape,
    bound_predicates,
)
from ..rejects import REJECTS_TABLE, rejects_query, rejects_table_sql, write_rejects
from ._sql import (
    RANGE_EDGES,
    STAGE_PREFIX,
    ColumnDifference,
    FileTarget,
    TableSource,
    bounds_where,
    check_chunk_rows,
    check_target_folder,
    check_target_table,
    check_writable,
    difference,
    edge_where,
    one_window_ranges,
    parse_table,
    partition_predicate_count,
    payload_refused,
    range_cuts_sql,
    range_partitions,
    ranges_run_on,
    refuse_reserved_prefix,
    refuse_schema,
    render_predicates,
    unavailable,
)
from ._sql import quote as _quote
from .contract import DEFAULT_CHUNK_ROWS, OnePassReading, PlanInexact, SQLiteFile

__all__ = ["SQLiteSink", "SQLiteSource"]

_TIMEOUT = 30
_TYPE_TOKEN = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*|\(\s*[+-]?\d+\s*(?:,\s*[+-]?\d+\s*)?\))")
# Words that end a type name and begin a column constraint (SQLite's grammar).
_CONSTRAINT_WORDS = frozenset(
    "CONSTRAINT PRIMARY NOT NULL UNIQUE CHECK DEFAULT COLLATE REFERENCES GENERATED AS".split()
)


def parsed_type(decltype: str) -> str:
    """The type name of a declared type, as SQLite parses it: words and ``(n[, m])`` only.

    SQLite reports a quoted or odd type verbatim (``INTEGER GENERATED ALWAYS AS (1)``,
    ``REAL DEFAULT (42)``); the target's DDL takes only the type name, never the
    text after it, so no default, check, reference or generated value is copied.
    """
    words: list[str] = []
    position = 0
    while match := _TYPE_TOKEN.match(decltype, position):
        token = match.group(1)
        if token.upper() in _CONSTRAINT_WORDS or (token.startswith("(") and not words):
            break
        words.append(token)
        position = match.end()
        if token.startswith("("):
            break
    return " ".join(words).replace(" (", "(")


# The SQLite type of each column kind, for a declared type whose affinity does not fit it.
_SQLITE_TYPES = {
    "integer": "INTEGER",
    "real": "REAL",
    "text": "TEXT",
    "blob": "BLOB",
    "any": "",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "time": "TIME",
    "timestamp": "TIMESTAMP",
    "timestamptz": "TEXT",
    "interval": "TEXT",
    "numeric": "NUMERIC",
    "decimal": "TEXT",  # an exact decimal's text; NUMERIC affinity would make it a double
}


def sqlite_type(column: Column) -> str:
    """The target's declared type: the source's own type name when SQLite gives it the same
    kind (so a SQLite table is copied as declared), else the kind's type (``_SQLITE_TYPES``):
    PostgreSQL's ``numeric``, ``interval`` or ``jsonb`` must not get NUMERIC or INTEGER
    affinity, which would change their text."""
    if not isinstance(column.decltype, str):
        raise ConfigInvalid(
            f"column {column.name!r} has an unsupported declared type",
            diagnostics={"column": column.name},
        )
    declared = parsed_type(column.decltype)
    return declared if sqlite_kind(declared) == column.kind else _SQLITE_TYPES[column.kind]


def _column_sql(column: Column) -> str:
    """Column definition for CREATE TABLE, from fixed or parsed type names only."""
    return f"{_quote(column.name)} {sqlite_type(column)}".rstrip()


def _column_list(columns: Sequence[Column], table: str | None = None) -> str:
    if not columns:
        raise ConfigInvalid("at least one column is required")
    return ", ".join(_ref(column.name, table) for column in columns)


def _ref(column: str, table: str | None = None) -> str:
    """Column reference; qualified, a missing column fails instead of reading as a string."""
    return _quote(column) if table is None else f"{_quote(table)}.{_quote(column)}"


def _uri(path: str, *, read_only: bool) -> str:
    """Absolute percent-encoded file URI, so no path is ever read as URI syntax."""
    uri = Path(os.path.abspath(path)).as_uri()
    return uri + "?mode=ro" if read_only else uri


def _table_columns(conn: sqlite3.Connection, table: str) -> tuple[Column, ...]:
    rows = conn.execute("SELECT name, type FROM pragma_table_info(?, 'main')", (table,))
    return tuple(Column(name, decltype or "") for name, decltype in rows)


_KINDS = {"integer": "numbers", "real": "numbers"}  # SQLite compares the two as numbers


def _source_invalid(message: str, **diagnostics: Any) -> SourceInvalid:
    return SourceInvalid(message, diagnostics=diagnostics)


def integer_primary_key(path: str, table: str) -> str:
    """The column that is ``table``'s rowid (its ``INTEGER PRIMARY KEY``): the range key of a
    route that names no partition column. ``ConfigInvalid`` when it has none."""
    source = SQLiteSource(path, table, "rowid")
    with source.reader() as conn:
        rows = conn.execute("SELECT name, type, pk FROM pragma_table_info(?)", (table,)).fetchall()
    keys = [(name, decltype) for name, decltype, pk in rows if pk]
    if len(keys) == 1 and keys[0][1].strip().upper() == "INTEGER":
        return keys[0][0]
    raise ConfigInvalid(
        f"source table {table!r} has no INTEGER PRIMARY KEY to cut into ranges: name a "
        "partition_column (see docs/incremental.md#partitions-that-fit-the-table)",
        diagnostics={"key": "source.partition_column", "table": table},
    )


class SQLiteSource(TableSource):
    """Reads one table of a SQLite file in partitions, optionally windowed by a cursor column."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        table: str,
        partition_column: str,
        cursor_column: str | None = None,
        *,
        partition_rows: int | None = None,
    ) -> None:
        _quote(table)
        _quote(partition_column)
        if cursor_column is not None:
            _quote(cursor_column)
        self.path = os.fspath(path)
        super().__init__(table, partition_column, cursor_column, partition_rows=partition_rows)
        self._held: tuple[sqlite3.Connection, int] | None = None  # ``snapshot``'s, and its thread

    def identity(self) -> TableIdentity:
        """The file's resolved path; SQLite matches table names case-insensitively (ASCII)."""
        return TableIdentity(file_location("sqlite", self.path), fold_ascii(self.table))

    @contextlib.contextmanager
    def reader(self, *, live: bool = False) -> Iterator[sqlite3.Connection]:
        """A read-only connection; sqlite errors become ``SourceInvalid`` without their text.
        Within ``snapshot``, in its thread, the attempt's connection, unless ``live``."""
        held = self._held
        if held is not None and not live and held[1] == threading.get_ident():
            with self._source_errors():
                yield held[0]
            return
        self._check_file()
        with self._source_errors(), contextlib.closing(self._open()) as conn:
            yield conn

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """``Snapshotting``, for a file in WAL mode: one connection holds a read transaction
        for the attempt, and this thread's reads use it (``reader``). A file in rollback-
        journal mode is read a transaction per statement, as without it: holding its read
        lock would stop every writer for the whole attempt."""
        if self._held is not None or not os.path.isfile(self.path):
            yield  # held already, or each read reports the missing file
            return
        with self._source_errors():
            conn = self._open()
            try:
                wal = str(conn.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal"
                if wal:
                    conn.execute("BEGIN")
                    conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # the snapshot
            except BaseException:
                conn.close()
                raise
        if not wal:
            conn.close()
            yield
            return
        self._held = (conn, threading.get_ident())
        try:
            yield
        finally:
            self._held = None
            conn.close()

    @contextlib.contextmanager
    def watching_writes(self) -> Iterator[Callable[[], bool]]:
        """``WriteWatching``: SQLite's ``data_version`` (the module's ``watching_writes``), or a
        change to the file or its WAL. An engine's own copy of SQLite in this process may
        delete the WAL and its index under the watch (chDB, closing the file after a read,
        takes the locks of this process's connections for none), and ``data_version`` is then
        blind to later writes: that deletion counts as a write too."""
        before = _file_marks(self.path)
        with watching_writes(self) as written:
            yield lambda: written() | (_file_marks(self.path) != before)

    def _check_file(self) -> None:
        if not os.path.isfile(self.path):
            raise SourceMissing(  # the resolved path: where the route file's path points
                f"source database {os.path.abspath(self.path)} for table {self.table!r} does "
                "not exist (or is not a file)",
                diagnostics={"table": self.table},
            )

    @contextlib.contextmanager
    def _source_errors(self) -> Iterator[None]:
        """sqlite errors as ``SourceInvalid`` (or ``ValueUnsupported``), without their text; a
        file this process may not read is ``SourceAccessRefused`` (exit 2), the class of a
        server's refused privilege."""
        try:
            yield
        except sqlite3.Error as exc:
            if isinstance(exc, sqlite3.OperationalError) and str(exc).startswith(
                "Could not decode to UTF-8"  # the text holds the value
            ):
                raise ValueUnsupported(
                    f"source table {self.table!r} holds a text value that is not valid UTF-8; "
                    "nothing was written",
                    diagnostics={"table": self.table},
                ) from None
            failure = file_failure(self.path, writing=False)
            if failure is None:
                raise _source_invalid(
                    f"source table {self.table!r} could not be read", table=self.table
                ) from None
            raise failure.error(
                f"the source database of table {self.table!r} cannot be read",
                retry=SourceInvalid,
                refused=SourceAccessRefused,
                diagnostics={"table": self.table},
                fix="give this process read access to the source file",
            ) from None

    def _open(self) -> sqlite3.Connection:
        return sqlite3.connect(_uri(self.path, read_only=True), uri=True, timeout=_TIMEOUT)

    def collated_columns(self) -> list[str]:
        """The partition and cursor columns SQLite compares other than byte by byte.

        A column declared ``COLLATE NOCASE`` or ``RTRIM`` (or with a collation of its
        own) matches values another engine would not: a plan filtered by DuckDB or
        ClickHouse would then select other rows than the source's own partitioning.
        Probed without reading a row: a compound select takes its comparison
        collation from its first, empty, arm.
        """
        found = []
        with self.reader() as conn:
            for name in (self.partition_column, self.cursor_column):
                if name is None:
                    continue
                probe = (
                    f"SELECT v = 'a', v = 'A', v = 'a ' FROM (SELECT {_quote(name)} AS v"
                    f" FROM {_quote(self.table)} WHERE 0 UNION ALL SELECT 'a')"
                )
                if conn.execute(probe).fetchone() != (1, 0, 0):
                    found.append(name)
        return found

    def describe(self) -> SourceShape:
        """Columns and hashes; raises ``SourceInvalid`` when the table or a named column is gone."""
        with self.reader() as conn:
            columns = _table_columns(conn, self.table)
            try:  # every read orders by rowid: a WITHOUT ROWID table has none
                conn.execute(f"SELECT rowid FROM {_quote(self.table)} LIMIT 0")
                rowid = True
            except sqlite3.OperationalError:  # or no such table: reported below
                rowid = not columns
        if not rowid:
            raise ConfigInvalid(
                f"source table {self.table!r} is a WITHOUT ROWID table, which this source "
                "cannot read yet (its reads keep rowid order); copy it into a rowid table",
                diagnostics={"table": self.table},
            )
        self._check_columns(columns)
        return SourceShape(
            columns=columns,
            query_hash=sha256_digest(self._template(columns)),
            schema_hash=sha256_digest([[c.name, c.decltype] for c in columns]),
        )

    def _ref(self, column: str) -> str:
        return _ref(column, self.table)

    def _template(self, columns: Sequence[Column]) -> str:
        """The extraction query with placeholders: what ``query_hash`` identifies."""
        sql = (
            f"SELECT {_column_list(columns, self.table)} FROM {_quote(self.table)}"
            f" WHERE {self._ref(self.partition_column)} = ?"
        )
        if self.cursor_column is not None:
            cursor = self._ref(self.cursor_column)
            sql += f" AND {cursor} > ? AND {cursor} <= ?"
        return sql + " ORDER BY rowid"

    def _cursor_window(self, after: Any, upto: Any) -> tuple[list[str], list[Any]]:
        if after is None and upto is None:
            return [], []
        cursor = self._ref(self._cursor(" to window by"))
        predicates: list[str] = []
        params: list[Any] = []
        if after is not None:
            predicates.append(f"{cursor} > ?")
            params.append(after)
        if upto is not None:
            predicates.append(f"{cursor} <= ?")
            params.append(upto)
        return predicates, params

    def _where(self, bounds: Mapping) -> tuple[str, tuple]:
        where, params = bounds_where(
            bounds,
            partition_column=self.partition_column,
            cursor_column=self.cursor_column,
            marker="?",
            name=self._ref,
        )
        return where, tuple(params)

    def partition_values(self, *, after: Any = None, upto: Any = None) -> list:
        """Partition values with a cursor in ``(after, upto]``; NULL first, then by value."""
        with self.reader() as conn:
            return self._partition_values(conn, "main", after=after, upto=upto)

    def partition_ranges(self, *, after: Any = None, upto: Any = None) -> list[dict[str, Any]]:
        """``RangePartitioned``: ranges of about ``partition_rows`` rows of the partition column
        with a cursor in ``(after, upto]`` (one sequential read of the key, by its index)."""
        window, params = self._cursor_window(after, upto)
        key, table = self._ref(self.partition_column), _quote(self.table)

        def exists(condition: str) -> bool:
            sql = f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {condition})"
            return bool(conn.execute(sql, params).fetchone()[0])

        with self.reader() as conn:
            sql = range_cuts_sql(key, table, window, "?")
            cuts = [row[0] for row in conn.execute(sql, (*params, self.partition_rows))]
            keyed = bool(cuts) or exists(" AND ".join([f"{key} IS NOT NULL", *window]))
            has_null = exists(" AND ".join([f"{key} IS NULL", *window]))
        return range_partitions(cuts, keyed=keyed, has_null=has_null)

    def _partition_values(
        self, conn: sqlite3.Connection, schema: str, *, after: Any = None, upto: Any = None
    ) -> list:
        window, params = self._cursor_window(after, upto)
        column = self._ref(self.partition_column)
        table = f"{_quote(schema)}.{_quote(self.table)}"
        if not window and _index_seeks(
            conn, f"SELECT min({column}) FROM {table} WHERE {column} > ?"
        ):
            return _seek_distinct(conn, table, column)
        sql = f"SELECT DISTINCT {column} FROM {table}"
        if window:
            sql += " WHERE " + " AND ".join(window)
        sql += f" ORDER BY {column} IS NOT NULL, {column}"
        return [row[0] for row in conn.execute(sql, params)]

    def table_sql(
        self,
        bounds: Sequence[Mapping],
        *,
        conn: sqlite3.Connection,
        schema: str,
        columns: Sequence[Column],
        by_partition: bool = False,
    ) -> tuple[str, tuple] | None:
        """One query for the whole plan, or None (then one query per partition).

        Without an index on the partition column, each partition's query scans the
        table: a plan of single values in one cursor window is one scan that keeps
        the rows whose value is one of the plan's (``IN``, values as the column stores
        them, so it matches what ``=`` would). Key ranges (``partition_by = "range"``) in
        one cursor window that run on from the lowest key to the highest, each starting
        where the one before ends, select every key of the window: one query, with the
        NULL key's rows when the plan has its partition. Otherwise, when no bound has a
        cursor window and ``conn`` sees exactly the planned partition values, the union
        of the partition queries is the table: one sequential read instead of one index
        range per partition. A windowed plan of values keeps its partition queries, which
        an index bounds to the rows it needs. The caller runs this inside its transaction,
        so the check and the copy see the same rows; a partition that appeared after
        planning fails the check, and is not loaded. ``by_partition`` asks for one scan only,
        its rows ordered by partition value (ranges: by bound, through ``range_route``),
        then rowid: None when an index reads each partition.
        """
        scan = self._plan_scan(
            bounds, conn=conn, schema=schema, columns=columns, by_partition=by_partition
        )
        if scan is not None:
            return scan
        table, key = f"{_quote(schema)}.{_quote(self.table)}", self._ref(self.partition_column)
        ranges = one_window_ranges(bounds)
        if ranges is not None and ranges_run_on([bounds[i] for i in ranges[0]]):
            order = "rowid"
            if by_partition:  # in the bounds' order, by the route ``range_route`` gives
                route = self.range_route(conn, schema, bounds)
                if route is None:
                    return None
                conn.create_function(_RANGE_FUNCTION, 1, route, deterministic=True)
                order = f"{_RANGE_FUNCTION}({key}), rowid"
            where, params = render_predicates(self._window(bounds[0]), marker="?", name=self._ref)
            conditions = [where] if where else []
            if ranges[1] is None:  # no partition holds the NULL key's rows
                conditions.append(f"{key} IS NOT NULL")
            sql = f"SELECT {_column_list(columns, self.table)} FROM {table}"
            sql += f" WHERE {' AND '.join(conditions)}" if conditions else ""
            return f"{sql} ORDER BY {order}", tuple(params)
        if by_partition:
            return None
        if any(
            "partition" not in b
            or b.get("cursor_after") is not None
            or b.get("cursor_upto") is not None
            for b in bounds
        ):
            return None  # ranges that do not run on, or a window
        values = [b["partition"] for b in bounds]
        found = self._partition_values(conn, schema)
        try:
            if len(found) != len(values) or set(found) != set(values):
                return None
        except TypeError:  # an unhashable bound: leave it to the partition queries
            return None
        return f"SELECT {_column_list(columns, self.table)} FROM {table} ORDER BY rowid", ()

    def range_route(
        self, conn: sqlite3.Connection, schema: str, bounds: Sequence[Mapping[str, Any]]
    ) -> _RangeRoute | None:
        """Which of ``bounds`` (key ranges and the NULL key's partition, ``one_window_ranges``)
        holds a key, decided in Python as SQLite's ``>=`` and ``<`` would; None when the key
        has an index to seek (each range's own read or count is then cheaper), or Python
        cannot tell: a collation other than ``BINARY``, a database not in UTF-8 (``BINARY``
        then compares UTF-16 bytes, not code points), ranges that overlap."""
        split = one_window_ranges(bounds)
        if split is None:
            return None
        columns = self._described_columns()
        names = [column.name for column in columns]
        if self.partition_column not in names or self.partition_column in self.collated_columns():
            return None
        key, table = self._ref(self.partition_column), f"{_quote(schema)}.{_quote(self.table)}"
        if conn.execute(f"PRAGMA {_quote(schema)}.encoding").fetchone()[0] != "UTF-8":
            return None
        if _index_seeks(conn, f"SELECT 1 FROM {table} WHERE {key} >= ?"):
            return None
        declared = parsed_type(columns[names.index(self.partition_column)].decltype)
        edges = [bounds[i].get(edge) for i in split[0] for edge in RANGE_EDGES]
        stored = _as_stored(conn, declared, edges)  # as ``>= ?`` converts a parameter
        return _RangeRoute.of(split[0], stored, null_partition=split[1])

    def max_cursor(self, *, after: Any = None) -> Any:
        """Highest cursor value above ``after``, or None when nothing is newer."""
        cursor_column = self._cursor()
        window, params = self._cursor_window(after, None)
        cursor = self._ref(cursor_column)
        sql = f"SELECT MAX({cursor}) FROM {_quote(self.table)}"
        if window:
            sql += " WHERE " + " AND ".join(window)
        # SQLite orders numbers before text before BLOBs: a column holding two of these kinds
        # has them at its two ends (an index answers both). Such a cursor would stall the
        # route at a text value, so it is refused.
        ends = f"SELECT typeof(MIN({cursor})), typeof(MAX({cursor})) FROM {_quote(self.table)}"
        with self.reader() as conn:
            low, high = (_KINDS.get(kind, kind) for kind in conn.execute(ends).fetchone())
            if low != high:
                raise ConfigInvalid(
                    f"cursor column {self.cursor_column!r} of source table {self.table!r} holds "
                    f"values of more than one kind ({low} and {high}); a cursor's values must "
                    "all be numbers or all be text: fix the column or choose another",
                    diagnostics={"table": self.table, "column": self.cursor_column},
                )
            return conn.execute(sql, params).fetchone()[0]

    def select_sql(
        self,
        bounds: Mapping,
        *,
        schema: str = "main",
        columns: Sequence[Column] | None = None,
    ) -> tuple[str, tuple]:
        """The extraction query of one partition; ``columns`` defaults to the described ones."""
        if columns is None:
            columns = self._described_columns()
        where, params = self._where(bounds)
        sql = (
            f"SELECT {_column_list(columns, self.table)} FROM {_quote(schema)}.{_quote(self.table)}"
            f" WHERE {where} ORDER BY rowid"
        )
        return sql, params

    def read(
        self, bounds: Mapping, *, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[list[tuple]]:
        """Rows of one partition in chunks of at most ``chunk_rows``; bad bounds fail on call."""
        check_chunk_rows(chunk_rows)
        sql, params = self.select_sql(bounds)
        return self._chunks(sql, params, chunk_rows)

    def _chunks(self, sql: str, params: tuple, chunk_rows: int) -> Iterator[list[tuple]]:
        """The rows of ``sql`` in chunks. A read left unfinished (its consumer failed) may be
        closed only when it is collected, after the attempt's snapshot, whose connection it
        read, was closed: closing the cursor then raised from the collector, a traceback
        printed after the run's own error."""
        with self.reader() as conn:
            cursor = conn.execute(sql, params)
            try:
                while chunk := cursor.fetchmany(chunk_rows):
                    yield chunk
            finally:
                with contextlib.suppress(sqlite3.ProgrammingError):  # its connection closed
                    cursor.close()

    def read_partitions(
        self, bounds: Sequence[Mapping[str, Any]], *, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[tuple[int, list[tuple]]] | None:
        """``OnePassReading``: partitions of one value each, all in the same cursor window, in
        one ``rowid``-ordered scan, when the partition column has no index to seek and compares
        byte by byte. Each row goes to the partition whose value it equals as SQLite's ``=``
        would match it: the values pass through a column of the partition column's declared
        type first, so they get the same affinity conversion a bound parameter gets."""
        split = self._single_values(bounds, chunk_rows)
        if split is None:
            return self._read_ranges(bounds, chunk_rows)
        partitions, window = split
        columns = self._described_columns()
        with self.reader() as conn:
            values = self._scan_values(conn, "main", partitions, columns)
        if values is None:
            return None
        route = {value: index for index, value in enumerate(values)}.get
        return self._routed_scan(window, columns, route, chunk_rows)

    def _routed_scan(
        self,
        window: Sequence[Predicate],
        columns: Sequence[Column],
        route: Callable[[Any], int | None],
        chunk_rows: int,
    ) -> Iterator[tuple[int, list[tuple]]]:
        """The rows of the cursor ``window`` in ``rowid`` order, each given to the partition
        ``route`` names for its partition value (rows of none are left out)."""
        where, params = render_predicates(window, marker="?", name=self._ref)
        sql = f"SELECT {_column_list(columns, self.table)} FROM {_quote(self.table)}"
        sql += f" WHERE {where} ORDER BY rowid" if where else " ORDER BY rowid"
        position = [column.name for column in columns].index(self.partition_column)
        return _routed(self._chunks(sql, tuple(params), chunk_rows), position, route)

    def _read_ranges(
        self, bounds: Sequence[Mapping[str, Any]], chunk_rows: int
    ) -> Iterator[tuple[int, list[tuple]]] | None:
        """``read_partitions`` of key ranges (``partition_by = "range"``) and the NULL key's
        partition, in one cursor window: one scan, each row given to its range by
        ``range_route``. Read a range at a time, without an index, 1,000 ranges of 200,000
        rows took 20-30 s for an append."""
        check_chunk_rows(chunk_rows)
        with self.reader() as conn:
            route = self.range_route(conn, "main", bounds)
        if route is None:
            return None
        return self._routed_scan(
            self._window(bounds[0]), self._described_columns(), route, chunk_rows
        )

    def _window(self, bounds: Mapping[str, Any]) -> tuple[Predicate, ...]:
        """The cursor window of one partition's ``bounds``: its predicates but the partition's."""
        predicates = bound_predicates(
            bounds, partition_column=self.partition_column, cursor_column=self.cursor_column
        )
        return predicates[partition_predicate_count(bounds) :]

    def _scan_values(
        self,
        conn: sqlite3.Connection,
        schema: str,
        partitions: Sequence[Predicate],
        columns: Sequence[Column],
    ) -> list[Any] | None:
        """The partitions' values as the column stores them (its affinity converts ``'5'``
        into 5 in an INTEGER column, as it converts a bound parameter), when one scan of the
        table in ``schema`` tells them apart exactly; otherwise None. Not when the partition
        column has an index to seek (each partition's own read is cheaper), compares other
        than byte by byte, or two bounds name one value."""
        key, table = self._ref(self.partition_column), f"{_quote(schema)}.{_quote(self.table)}"
        names = [column.name for column in columns]
        if self.partition_column not in names:
            return None
        if _index_seeks(conn, f"SELECT 1 FROM {table} WHERE {key} = ?"):
            return None
        if self.partition_column in self.collated_columns():
            return None
        declared = parsed_type(columns[names.index(self.partition_column)].decltype)
        values = _as_stored(conn, declared, [p.value for p in partitions])
        return values if len(set(values)) == len(values) else None

    def _plan_scan(
        self,
        bounds: Sequence[Mapping],
        *,
        conn: sqlite3.Connection,
        schema: str,
        columns: Sequence[Column],
        by_partition: bool = False,
    ) -> tuple[str, tuple] | None:
        """The plan as one scan of an unindexed table (``table_sql``), or None."""
        split = self._single_values(bounds, DEFAULT_CHUNK_ROWS)
        if split is None:
            return None
        partitions, window = split
        where, params = render_predicates(window, marker="?", name=self._ref)
        if len(partitions) + len(params) > conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER):
            return None  # the IN list's values are parameters of one statement
        values = self._scan_values(conn, schema, partitions, columns)
        if values is None:
            return None
        key = self._ref(self.partition_column)
        known = [value for value, p in zip(values, partitions, strict=True) if p.op == "="]
        matches = [f"{key} IN ({', '.join('?' * len(known))})"] if known else []
        if len(known) < len(values):
            matches.append(f"{key} IS NULL")
        condition = " OR ".join(matches)
        if where:
            condition = f"({condition}) AND {where}"
        order = f"{key}, rowid" if by_partition else "rowid"  # the column's own collation: BINARY
        sql = (
            f"SELECT {_column_list(columns, self.table)} FROM {_quote(schema)}.{_quote(self.table)}"
            f" WHERE {condition} ORDER BY {order}"
        )
        return sql, (*known, *params)

    def edge_rows(
        self, *, since: Any, upto: Any, nulls: bool, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[list[tuple]]:
        """Rows of every partition with a cursor in ``[since, upto]`` or, when ``nulls``, NULL."""
        where, params = edge_where(self._ref(self._cursor()), "?", since, upto, nulls)
        if not where:
            return iter(())
        columns = self._described_columns()
        sql = (
            f"SELECT {_column_list(columns, self.table)} FROM {_quote(self.table)}"
            f" WHERE {where} ORDER BY rowid"
        )
        return self._chunks(sql, tuple(params), chunk_rows)

    def count(self, bounds: Mapping) -> int:
        sql, params = self.count_sql(bounds)
        with self.reader() as conn:
            return conn.execute(sql, params).fetchone()[0]

    def count_sql(self, bounds: Mapping, *, schema: str = "main") -> tuple[str, tuple]:
        where, params = self._where(bounds)
        return f"SELECT COUNT(*) FROM {_quote(schema)}.{_quote(self.table)} WHERE {where}", params


# Kinds another engine's own SQLite reader (DuckDB's scanner, ClickHouse's sqlite()) reads
# exactly as the row paths carry them; other kinds need ``ValueCarrying``, so lazy-plan carries
# their rows (``PlanInexact``) and a pull is declined.
_PLAN_KINDS = frozenset({"integer", "real", "text", "blob", "boolean", "date", "timestamp"})
_DATE = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"
_ISO_DATE = f"({{c}} GLOB '{_DATE}' AND date({{c}}) IS {{c}})"
_ISO_TIMESTAMP = (  # YYYY-MM-DD[ T]HH:MM:SS[.f{1,6}], a real instant, no offset
    f"({{c}} GLOB '{_DATE}[ T][0-9][0-9]:[0-9][0-9]:[0-9][0-9]*'"
    " AND strftime('%Y-%m-%d %H:%M:%S', {c}) IS replace(substr({c}, 1, 19), 'T', ' ')"
    " AND (length({c}) = 19 OR (substr({c}, 20, 1) = '.' AND length({c}) BETWEEN 21 AND 26"
    " AND substr({c}, 21) NOT GLOB '*[^0-9]*')))"
)
# Per kind, a SQL test of one stored value that such a reader would read otherwise than the
# row paths' carriers accept (SQLite keeps any value in any column): one read of the source.
# Each test sees a value that is not NULL (``_misread_test``): ``typeof(c) <> 'integer'``
# after ``c IS NOT NULL`` costs two thirds of ``typeof(c) NOT IN ('integer', 'null')``.
_PLAN_MISREAD = {
    "integer": "typeof({c}) <> 'integer'",
    "real": "typeof({c}) <> 'real'"  # a real passes at the first test
    " AND (typeof({c}) <> 'integer' OR abs({c}) > 9007199254740992)",
    "text": "typeof({c}) <> 'text'",
    "blob": "typeof({c}) NOT IN ('blob', 'text')",
    "boolean": "typeof({c}) <> 'integer' OR {c} NOT IN (0, 1)",
    "date": f"typeof({{c}}) <> 'text' OR NOT {_ISO_DATE}",
    "timestamp": f"typeof({{c}}) <> 'text' OR NOT ({_ISO_DATE} OR {_ISO_TIMESTAMP})",
}


def _misread_test(column: Column) -> str:
    """``_PLAN_MISREAD``'s test of ``column``, true of a value the reader would misread."""
    name = _quote(column.name)
    return f"{name} IS NOT NULL AND ({_PLAN_MISREAD[column.kind].format(c=name)})"


@contextlib.contextmanager
def watching_writes(source: SQLiteFile) -> Iterator[Callable[[], bool]]:
    """A check whether another connection committed to ``source`` since entering: SQLite's
    ``data_version``, read on a connection of its own. An engine's read of the source is not
    one SQLite snapshot (DuckDB's scanner missed a row moved to a new rowid meanwhile), so a
    read during which the source was written is thrown away and dpone reads the rows itself
    (connectors.md, "DuckDB target").

    Until the check, that connection holds a read transaction. The engine's SQLite is a
    second copy of SQLite in this process, and POSIX locks belong to the process: closing any
    of dpone's connections to the file dropped the engine's locks, and chDB then read rows a
    writer moved twice (SQLite's "multiple copies of SQLite" hazard). While one of its
    connections holds a lock, Python's SQLite defers such a close."""

    def version() -> int:
        return int(watch.execute("PRAGMA data_version").fetchone()[0])

    def written() -> bool:
        if watch.in_transaction:
            watch.execute("COMMIT")
        return version() != before

    with source.reader(live=True) as watch:
        before = version()
        watch.execute("BEGIN")
        watch.execute("SELECT count(*) FROM sqlite_master").fetchone()  # takes the read lock
        yield written


def _file_marks(path: str) -> list[tuple[int, int, int] | None]:
    """The file's and its WAL's inode, size and modification time (None: no such file): a
    commit appends to the WAL, a checkpoint writes the file, a rollback journal's commit too."""
    marks: list[tuple[int, int, int] | None] = []
    for name in (path, f"{path}-wal"):
        try:
            found = os.stat(name)
        except FileNotFoundError:
            marks.append(None)
        else:
            marks.append((found.st_ino, found.st_size, found.st_mtime_ns))
    return marks


def plan_rows(
    source: SQLiteFile, bounds: Sequence[Mapping[str, Any]], columns: Sequence[Column]
) -> Iterator[list[tuple]]:
    """The ``columns`` of a plan's ``bounds`` as the row paths read them, for a sink that
    threw its engine's read of the source away (``watching_writes``): in one scan when the
    source splits one (``OnePassReading``, which reads the described columns), otherwise
    one statement per bound."""
    if isinstance(source, OnePassReading) and len(bounds) >= 2:
        if [c.name for c in columns] == [c.name for c in source.describe().columns]:
            scan = source.read_partitions(bounds)
            if scan is not None:
                yield from (rows for _, rows in scan)
                return
    for each in bounds:
        sql, params = source.select_sql(each, columns=columns)
        with source.reader() as conn:
            cursor = conn.execute(sql, params)
            while chunk := cursor.fetchmany(DEFAULT_CHUNK_ROWS):
                yield chunk


def pulled_file(plan: LoadPlan, *, engine: str, table: str) -> SQLiteFile:
    """The plan's source, when ``engine`` can pull it: a table in a SQLite file."""
    if not isinstance(plan.source, SQLiteFile):
        raise ConfigInvalid(
            f"lazy-plan on {engine} reads SQLite sources only; target table {table!r} cannot "
            "pull from this source: use legacy, staged or file-artifact",
            diagnostics={"table": table, "path": "lazy-plan"},
        )
    return plan.source


def refuse_inexact_plan(
    source: SQLiteFile,
    columns: Sequence[Column],
    *,
    engine: str,
    table: str,
    reader_refuses: Collection[str] = (),
) -> None:
    """``PlanInexact`` for a lazy plan another engine would not read exactly as the row
    paths carry it (lazy-plan then carries the rows itself; a pull is declined).

    Such are: a source whose text is UTF-16 (SQLite orders it otherwise than by code
    point); partition or cursor columns it would filter differently
    (``collated_columns``); columns of a kind outside what its SQLite reader
    carries exactly; and columns holding a value it would misread (a real in
    an integer column, a text boolean, a date with a time, a timestamp with an
    offset), found by one read of the source.

    The read skips the columns of a table that SQLite itself keeps free of such
    values (``_held_as_declared``), and, in an ordinary table, the columns named
    in ``reader_refuses``: those whose every misread value the engine's reader
    refuses with an error (a REAL column's affinity keeps integers out of it).
    Only a caller whose failed read costs nothing may name any: a pull before the
    target call (``FilePulling``), or a check that has the reader read those
    columns itself before it (DuckDB's ``_probe_plan_read``).
    """
    with source.reader() as conn:
        utf16 = conn.execute("PRAGMA encoding").fetchone()[0] != "UTF-8"
    if utf16:  # a grouped pull of text key ranges loaded some rows twice and lost others
        raise PlanInexact(
            f"lazy-plan into {engine} cannot filter the source's text as SQLite does: the "
            "source database's text is UTF-16, which SQLite orders by its bytes, not by code "
            f"point as {engine} does; use legacy, staged or file-artifact (read by SQLite "
            "itself)",
            diagnostics={"table": table, "path": "lazy-plan"},
        )
    collated = source.collated_columns()
    if collated:
        raise PlanInexact(
            f"lazy-plan into {engine} cannot filter source column(s) {', '.join(collated)} as "
            "SQLite does: they are declared with a collation (COLLATE NOCASE, RTRIM or another), "
            f"so {engine} would select other rows than the source's partitions; use legacy, "
            "staged or file-artifact (read by SQLite itself)",
            diagnostics={"table": table, "columns": collated, "path": "lazy-plan"},
        )
    inexact = [column.name for column in columns if column.kind not in _PLAN_KINDS]
    if not inexact:
        with source.reader() as conn:
            inexact = _misread_columns(conn, source.table, columns, reader_refuses)
    if inexact:
        raise inexact_plan(engine, table, inexact)


def inexact_plan(engine: str, table: str, columns: Sequence[str]) -> PlanInexact:
    """The refusal of a lazy plan whose ``columns`` the engine would not read exactly."""
    return PlanInexact(
        f"lazy-plan into {engine} cannot read source column(s) {', '.join(columns)} exactly "
        f"({engine} reads them by their declared type, which differs from what the other "
        "paths carry); use legacy, staged or file-artifact",
        diagnostics={"table": table, "columns": list(columns), "path": "lazy-plan"},
    )


def _misread_columns(
    conn: sqlite3.Connection,
    table: str,
    columns: Sequence[Column],
    reader_refuses: Collection[str],
) -> list[str]:
    """The columns holding a value ``_PLAN_MISREAD`` finds, in one scan that stops at the first
    (``refuse_inexact_plan``)."""
    held = _held_as_declared(conn, table)
    if held is None:  # a view or a virtual table: any value in any column
        held, reader_refuses = set(), ()
    tests = [
        (column.name, _misread_test(column))
        for column in columns
        if column.kind in _PLAN_MISREAD
        and column.name not in held
        and column.name not in reader_refuses
    ]
    if not tests:
        return []
    anything = " OR ".join(f"({test})" for _, test in tests)
    if not conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM {_quote(table)} WHERE {anything})"
    ).fetchone()[0]:
        return []
    checks = ", ".join(f"coalesce(max({test}), 0)" for _, test in tests)
    found = conn.execute(f"SELECT {checks} FROM {_quote(table)}").fetchone()
    return [name for (name, _), misread in zip(tests, found, strict=True) if misread]


def _held_as_declared(conn: sqlite3.Connection, table: str) -> set[str] | None:
    """The columns of an ordinary table that SQLite itself keeps to their declared storage
    class: its rowid (an ``INTEGER PRIMARY KEY`` without its own index), and every typed
    column of a ``STRICT`` table. None for a view or a virtual table, whose declared types
    bind no value (a view's column can hold what any arm of a ``UNION`` gives)."""
    try:
        listed = conn.execute(
            "SELECT type, wr, strict FROM pragma_table_list WHERE schema = 'main' AND name = ?",
            (table,),
        ).fetchone()
    except sqlite3.OperationalError:  # before SQLite 3.37: no table_list
        return None
    if listed is None or listed[0] != "table":
        return None
    _, without_rowid, strict = listed
    info = conn.execute("SELECT name, type, pk FROM pragma_table_info(?)", (table,)).fetchall()
    held = {name for name, declared, _ in info if strict and declared.upper() != "ANY"}
    keys = [(name, declared) for name, declared, pk in info if pk]
    indexed_key = conn.execute(
        "SELECT 1 FROM pragma_index_list(?) WHERE origin = 'pk'", (table,)
    ).fetchone()
    if len(keys) == 1 and keys[0][1].upper() == "INTEGER" and not without_rowid and not indexed_key:
        held.add(keys[0][0])  # the rowid (``INTEGER PRIMARY KEY DESC`` gets an index: not it)
    return held


class SQLiteSink(FileTarget):
    """Writes one target table of a SQLite file, each load in a single durable transaction.

    Each load also writes its ledger row (``LedgerSink``) in that transaction.
    """

    pulled_suffix = ".sqlite"  # FilePulling: a SQLite file of one table

    def __init__(self, path: str | os.PathLike[str], table: str) -> None:
        check_target_table(table)
        hint = 'a SQLite file is one schema; a name holding a dot is written quoted: "raw.t"'
        name = parse_table(table, default_schema="main")
        refuse_schema(name, engine="SQLite", hint=hint)
        refuse_reserved_prefix(name.name, "sqlite_", engine="SQLite", part="table", fold=True)
        super().__init__(path, name.name)  # main.t is t; "raw.t" is the table raw.t

    def identity(self) -> TableIdentity:
        """The file's resolved path; SQLite matches table names case-insensitively (ASCII)."""
        return TableIdentity(file_location("sqlite", self.path), fold_ascii(self.table))

    @property
    def _stage(self) -> str:
        return STAGE_PREFIX + self.table

    def _stage_sql(self) -> str:
        return _quote(self._stage)

    def check_target(self) -> None:
        """Before the target call: the folder exists and an existing file is a database this
        process can lock for writing now (``BEGIN EXCLUSIVE``, rolled back: a reader holding
        the file longer than the timeout would make the load's commit fail)."""
        check_target_folder(self.path, self.table)
        check_writable(self.path, self.table)
        if not os.path.isfile(self.path):
            return
        try:
            with self._connect() as conn:
                conn.execute("BEGIN EXCLUSIVE")
                conn.execute("PRAGMA schema_version").fetchone()
                (rewriting,) = conn.execute(_REWRITING, (self.table, self.table)).fetchone()
                conn.execute("ROLLBACK")
        except sqlite3.Error:
            raise unavailable(self.table) from None
        if rewriting:
            raise TargetRowsMismatch.rewriting(self.table, rewriting)

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """Autocommit connection with FULL sync; transactions are explicit."""
        check_target_folder(self.path, self.table)
        uri = _uri(self.path, read_only=False)
        with contextlib.closing(
            sqlite3.connect(uri, uri=True, timeout=_TIMEOUT, isolation_level=None)
        ) as conn:
            conn.execute("PRAGMA synchronous=FULL")
            yield conn

    def column_difference(self, columns: Sequence[Column]) -> ColumnDifference | None:
        """``SchemaEvolving``: SQLite matches column names case-insensitively (ASCII). A column
        takes a source column of its kind, or any value when it has no type (``any``): SQLite's
        affinity would convert the others (``'12'`` into an INTEGER column becomes 12)."""
        with self._reader() as conn:
            existing = [] if conn is None else _table_columns(conn, self.table)
        pairs = [(column.name, column.decltype) for column in existing]

        def takes(column: Column, declared: str) -> bool:
            kind = sqlite_kind(declared)
            return kind in (column.kind, "any") or parsed_type(declared) == sqlite_type(column)

        return difference(pairs, columns, fold=fold_ascii, takes=takes)

    def add_columns(self, columns: Sequence[Column]) -> None:
        with self._connect() as conn, _transaction(conn):
            for column in columns:
                conn.execute(f"ALTER TABLE {_quote(self.table)} ADD COLUMN {_column_sql(column)}")

    def carrier(self, column: Column) -> Carry | None:
        """A NaN is refused: SQLite would store it as NULL. Other values are SQLite's own."""
        return finite_double if column.kind == "real" else None

    def load(self, payload: RowChunks | LoadPlan) -> int:
        """Write the payload in one transaction and return the rows written."""
        if isinstance(payload, LoadPlan):
            return self._load_plan(payload)
        if isinstance(payload, RowChunks):
            with self._connect() as conn, _transaction(conn):
                _fence_first(conn, self._ledger.peek())
                _prepare_target(conn, self.table, payload.columns, replace=payload.replace)
                rows = _insert(conn, self.table, payload)
                return _record(conn, self._ledger.take(), rows)
        raise payload_refused(self.table)

    def can_pull(self, plan: LoadPlan, files: int) -> bool:
        """``FilePulling``: from a SQLite source, into one load file (legacy, staged) or one
        per partition (file-artifact). SQLite copies each value as it stores it, so nothing
        is misread."""
        return isinstance(plan.source, SQLiteFile)

    def pull_load_files(
        self, plan: LoadPlan, paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        """``FilePulling``: SQLite copies the plan's partitions from the source into new SQLite
        files (``_pull``, ``_pull_each``), with each bound's count; None when that fails. Each
        value is copied as SQLite stores it, as lazy-plan copies it: a text that is not UTF-8
        too, which the paths that read through Python refuse."""
        try:
            counts = _pull(plan, paths[0]) if len(paths) == 1 else _pull_each(plan, paths)
        except (sqlite3.Error, OSError):
            counts = None
        if counts is None:
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            return None
        rows = [sum(counts)] if len(paths) == 1 else counts
        files = [
            LoadFile(path=path, rows=count, sha256=file_sha256(path), native=True)
            for path, count in zip(paths, rows, strict=True)
        ]
        return files, counts

    def merge_load_files(self, payload: LoadFiles, folder: Path) -> LoadFiles:
        """``MergingLoadFiles``: more pulled files than SQLite attaches at once (file-artifact's,
        one per partition) are copied, in order, into one new ``merged.sqlite`` in ``folder``
        by a connection of their own, each file's digest checked before SQLite reads it and
        after; the merged file is digested once closed, and loaded as any pulled file. A
        SQLite error writing it (a full disk) is the work folder's: an ``OSError``."""
        native = [file for file in payload.files if file.native]
        with contextlib.closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
            if len(native) <= conn.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED):
                return payload
            path, names = folder / "merged.sqlite", _column_list(payload.columns)
            try:
                _create_pulled(conn, path, "out", names)
                for file in native:
                    check_digest(file.path, file.sha256)
                    part = _uri(str(file.path), read_only=True)
                    conn.execute("ATTACH DATABASE ? AS part", (part,))
                    conn.execute("BEGIN")
                    conn.execute(
                        f"INSERT INTO out.{_PULLED} ({names}) SELECT {names} FROM part.{_PULLED}"
                        " ORDER BY rowid"
                    )
                    conn.execute("COMMIT")
                    conn.execute("DETACH DATABASE part")
                    check_digest(file.path, file.sha256)
            except sqlite3.Error as error:
                full = getattr(error, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL
                raise OSError(errno.ENOSPC if full else errno.EIO, "merged.sqlite") from None
        rows = sum(file.rows for file in native)
        merged = LoadFile(path=path, rows=rows, sha256=file_sha256(path), native=True)
        others = tuple(file for file in payload.files if not file.native)
        return attrs.evolve(payload, files=(*others, merged))

    def read_ledger(self, *, partitions: bool = False) -> list[LedgerEntry]:
        """The ledger entries of this target table, oldest first.

        The connection may write, though this reads only: a read-only one cannot
        roll back the hot journal a killed load leaves, and would refuse the file.
        """
        if not os.path.isfile(self.path):
            return []
        try:
            with contextlib.closing(
                sqlite3.connect(_uri(self.path, read_only=False), uri=True, timeout=_TIMEOUT)
            ) as conn:
                columns = _table_columns(conn, LEDGER_TABLE)
                if not columns:
                    return []
                check_ledger_columns({column.name for column in columns})
                rows = conn.execute(
                    ledger_query("?", partitions=partitions), (self.identity().table,)
                ).fetchall()
        except sqlite3.Error:
            raise unavailable(self.table, to="have its ledger read") from None
        return [LedgerEntry.from_row(*row) for row in rows]

    def read_rejects(self) -> list[tuple]:
        """``Quarantining``: this table's rows set aside, oldest first. Reads only."""
        with self._reader() as conn:
            if conn is None or not _table_columns(conn, REJECTS_TABLE):
                return []
            sql = rejects_query(_quote(REJECTS_TABLE), "?") + " ORDER BY rowid"
            return conn.execute(sql, (self.identity().table,)).fetchall()

    def fence_epoch(self) -> int:
        """``Fencing``: the target table's fence in ``_dpone_fence``; 0 without one."""
        if not os.path.isfile(self.path):
            return 0
        try:
            with contextlib.closing(
                sqlite3.connect(_uri(self.path, read_only=False), uri=True, timeout=_TIMEOUT)
            ) as conn:
                if not _table_columns(conn, FENCE_TABLE):
                    return 0
                return read_fence(_query(conn), self.identity().table, **_FENCE_AT)
        except sqlite3.Error:
            raise unavailable(self.table, to="have its fence read") from None

    def advance_fence(self, epoch: int) -> int:
        """``Fencing``: raise the fence to ``epoch`` in a transaction of its own."""
        try:
            with self._connect() as conn, _transaction(conn):
                return advance_fence(_query(conn), self.identity().table, epoch, **_FENCE)
        except sqlite3.Error:
            raise unavailable(self.table, to="have its fence raised") from None

    def check_plan(self, plan: LoadPlan) -> None:
        """Refuse a plan this sink cannot pull, before anything touches the target: SQLite
        attaches only a source whose text encoding is the target's (a UTF-16 source failed
        inside the target call, with SQLite's own error)."""
        source = pulled_file(plan, engine="SQLite", table=self.table)
        with source.reader() as conn:
            encoding = conn.execute("PRAGMA encoding").fetchone()[0]
        try:
            with self._reader() as conn:
                target = "UTF-8" if conn is None else conn.execute("PRAGMA encoding").fetchone()[0]
        except sqlite3.Error:  # the load reports what is wrong with the target
            return
        if encoding != target:
            raise PlanInexact(
                f"lazy-plan into SQLite table {self.table!r} cannot attach the source database: "
                f"its text is {encoding} and the target's {target}; use legacy, staged or "
                "file-artifact",
                diagnostics={"table": self.table, "path": "lazy-plan"},
            )

    def _load_plan(self, payload: LoadPlan) -> int:
        source = pulled_file(payload, engine="SQLite", table=self.table)
        statements = [
            source.select_sql(bounds, schema="src", columns=payload.columns)
            for bounds in payload.bounds
        ]
        if not os.path.isfile(source.path):
            raise _source_invalid(
                f"source database for table {source.table!r} does not exist", table=source.table
            )
        prefix = f"INSERT INTO {_quote(self.table)} ({_column_list(payload.columns)}) "
        with self._connect() as conn:
            conn.execute("ATTACH DATABASE ? AS src", (_uri(source.path, read_only=True),))
            try:
                with _transaction(conn):
                    _fence_first(conn, self._ledger.peek())
                    _prepare_target(conn, self.table, payload.columns, replace=payload.replace)
                    whole = source.table_sql(
                        payload.bounds, conn=conn, schema="src", columns=payload.columns
                    )
                    if whole is not None:
                        statements = [whole]
                    rows = sum(conn.execute(prefix + sql, p).rowcount for sql, p in statements)
                    return _record(conn, self._ledger.take(), rows)
            finally:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("DETACH DATABASE src")

    def stage(self, payload: RowChunks) -> int:
        """Fill a fresh staging table beside the target, from rows or from load files (as
        ``load``); the target is not touched."""
        with self._connect() as conn, _transaction(conn):
            conn.execute(f"DROP TABLE IF EXISTS {_quote(self._stage)}")
            _create_table(conn, self._stage, payload.columns)
            return _insert(conn, self._stage, payload)

    def staged_row_count(self) -> int:
        with self._reader() as conn:
            return 0 if conn is None else _row_count(conn, self._stage)

    def finalize_staged_load(self, *, replace: bool = False) -> int:
        """Move staged rows into the target and drop the staging table, in one transaction.

        When the target does not exist, or ``replace`` is set and the target is
        exactly what this sink would create (same definition, no index, and no
        view or trigger in the database), the staging table is renamed to the
        target instead of copying its rows: same columns, types and rows.
        Otherwise the rows are copied (appended, or after emptying the target).
        """
        with self._connect() as conn, _transaction(conn):
            _fence_first(conn, self._ledger.peek())
            columns = _table_columns(conn, self._stage)
            if not columns:
                raise ConfigInvalid(
                    f"no staged load exists for target table {self.table!r}",
                    diagnostics={"table": self.table},
                )
            if self._stage_can_become_target(conn, columns, replace=replace):
                moved = _row_count(conn, self._stage)
                if replace:  # an append never drops the target
                    conn.execute(f"DROP TABLE IF EXISTS {_quote(self.table)}")
                conn.execute(f"ALTER TABLE {_quote(self._stage)} RENAME TO {_quote(self.table)}")
                return _record(conn, self._ledger.take(), moved)
            _prepare_target(conn, self.table, columns, replace=replace)
            names = _column_list(columns)
            moved = conn.execute(
                f"INSERT INTO {_quote(self.table)} ({names})"
                f" SELECT {names} FROM {_quote(self._stage)} ORDER BY rowid"
            ).rowcount
            conn.execute(f"DROP TABLE {_quote(self._stage)}")
            return _record(conn, self._ledger.take(), moved)

    def _stage_can_become_target(
        self, conn: sqlite3.Connection, columns: Sequence[Column], *, replace: bool
    ) -> bool:
        """True when renaming the staging table gives the same target as copying into it."""
        schema = conn.execute("SELECT type, name, tbl_name, sql FROM sqlite_master").fetchall()
        if any(kind in ("view", "trigger") for kind, *_ in schema):
            return False  # a rename re-parses them; keep the plain copy
        definitions = ", ".join(_column_sql(column) for column in columns)
        # SQLite resolves table names case-insensitively (ASCII): so does this lookup
        tables = {fold_ascii(name): sql for kind, name, _, sql in schema if kind == "table"}
        stage, target = fold_ascii(self._stage), fold_ascii(self.table)
        if tables.get(stage) != f"CREATE TABLE {_quote(self._stage)} ({definitions})":
            return False
        if target not in tables:
            return True
        indexed = any(kind == "index" and fold_ascii(tbl) == target for kind, _, tbl, _ in schema)
        if not replace or indexed:
            return False
        return tables[target] == f"CREATE TABLE {_quote(self.table)} ({definitions})"

    def row_count(self) -> int:
        with self._reader() as conn:
            return 0 if conn is None else _row_count(conn, self.table)

    inserts_end_with_their_process = True  # BatchCounting: the load runs in the worker

    def batch_rows(self, column: str, batch_id: str) -> int:
        """``BatchCounting``: rows whose ``column`` holds ``batch_id``; 0 without it."""
        with self._reader() as conn:
            names = [] if conn is None else [c.name for c in _table_columns(conn, self.table)]
            if column not in names:
                return 0
            sql = f"SELECT count(*) FROM {_quote(self.table)} WHERE {_quote(column)} = ?"
            return int(conn.execute(sql, (batch_id,)).fetchone()[0])

    def is_empty(self) -> bool:
        with self._reader() as conn:
            if conn is None or not _table_columns(conn, self.table):
                return True
            return conn.execute(f"SELECT 1 FROM {_quote(self.table)} LIMIT 1").fetchone() is None

    def rows(self) -> list[tuple]:
        with self._reader() as conn:
            if conn is None or not _table_columns(conn, self.table):
                return []
            return conn.execute(f"SELECT * FROM {_quote(self.table)} ORDER BY rowid").fetchall()


_SEEK_LIMIT = 1_000  # past this many partitions, reading the rest of the index is cheaper


def _as_stored(conn: sqlite3.Connection, declared: str, values: Sequence[Any]) -> list[Any]:
    """``values`` as a column declared ``declared`` stores them (its affinity converts
    ``'5'`` into 5 in an INTEGER column), through a temporary table of this connection."""
    conn.execute(f"CREATE TEMP TABLE dpone_values (value {declared})")
    try:
        conn.executemany("INSERT INTO temp.dpone_values VALUES (?)", [(v,) for v in values])
        return [
            row[0] for row in conn.execute("SELECT value FROM temp.dpone_values ORDER BY rowid")
        ]
    finally:
        conn.execute("DROP TABLE temp.dpone_values")


def _routed(
    chunks: Iterable[list[tuple]], position: int, route: Callable[[Any], int | None]
) -> Iterator[tuple[int, list[tuple]]]:
    """Each chunk's rows, grouped by the partition ``route`` gives their value at ``position``
    (in scan order within each partition); rows of no listed partition are left out."""
    for chunk in chunks:
        groups: dict[int, list[tuple]] = {}
        for row in chunk:
            index = route(row[position])
            if index is not None:
                groups.setdefault(index, []).append(row)
        yield from groups.items()


_RANGE_FUNCTION = "dpone_range"  # a key's bound number (``range_route``), for ``table_sql``


def _sqlite_order(value: Any) -> tuple:
    """``value``'s place in SQLite's BINARY order: NULL, numbers (integers and reals compared
    exactly, as Python does), texts (UTF-8 bytes: code points), BLOBs (bytes). TypeError for
    a value SQLite does not store."""
    if value is None:
        return (0,)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    if isinstance(value, bytes):
        return (3, value)
    raise TypeError(type(value).__name__)


@attrs.frozen
class _RangeRoute:
    """Which of sorted, disjoint key ranges holds a value, by bisection of their lower edges."""

    lows: list[tuple]
    highs: list[tuple | None]
    partitions: list[int]
    null_partition: int | None
    # The edges as numbers (unbounded: infinite), when all are integers: an integer key is
    # then placed without ``_sqlite_order`` (1,000,000 keys: 0.5 s instead of 1.5 s).
    numbers: tuple[list[float], list[float]] | None = None

    @classmethod
    def of(
        cls, ranges: Sequence[int], edges: Sequence[Any], *, null_partition: int | None
    ) -> _RangeRoute | None:
        """The route of the ranges numbered ``ranges``, whose ``(from, below)`` edges are
        ``edges`` in turn (as the key stores them); None when they overlap or SQLite would
        order an edge otherwise than ``_sqlite_order`` does."""
        try:
            cuts = sorted(
                (
                    _sqlite_order(low),  # an unbounded low is (0,): below every key
                    None if high is None else _sqlite_order(high),
                    partition,
                )
                for partition, low, high in zip(ranges, edges[::2], edges[1::2], strict=True)
            )
        except TypeError:
            return None
        for (_, high, _), (low, _, _) in itertools.pairwise(cuts):
            if high is None or high > low:
                return None  # overlapping ranges: a row would belong to two
        lows, highs = [c[0] for c in cuts], [c[1] for c in cuts]
        numbers = None
        if all(type(edge) is int for edge in edges if edge is not None):
            infinite = float("inf")
            numbers = (
                [-infinite if low == (0,) else low[1] for low in lows],
                [infinite if high is None else high[1] for high in highs],
            )
        return cls(lows, highs, [c[2] for c in cuts], null_partition, numbers)

    def __call__(self, value: Any) -> int | None:
        if value is None:
            return self.null_partition
        if self.numbers is not None and type(value) is int:
            lows, highs = self.numbers
            at = bisect.bisect_right(lows, value) - 1
            return self.partitions[at] if at >= 0 and value < highs[at] else None
        order = _sqlite_order(value)
        at = bisect.bisect_right(self.lows, order) - 1
        if at < 0:
            return None
        high = self.highs[at]
        return self.partitions[at] if high is None or order < high else None


def _index_seeks(conn: sqlite3.Connection, sql: str) -> bool:
    """Whether SQLite answers ``sql`` (one ``?``) by seeking an index, not by a scan."""
    plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}", (None,)).fetchall()
    return len(plan) == 1 and plan[0][3].startswith("SEARCH") and " USING " in plan[0][3]


def _seek_distinct(conn: sqlite3.Connection, table: str, column: str) -> list:
    """Distinct values, NULL first, by seeking the index from each value to the next.

    SQLite's DISTINCT reads every index entry; with few partitions per row this
    loose index scan reads one entry per partition. After ``_SEEK_LIMIT`` values
    the rest is read in one pass.
    """
    has_null = conn.execute(f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {column} IS NULL)")
    values: list = [None] if has_null.fetchone()[0] else []
    value = conn.execute(f"SELECT min({column}) FROM {table}").fetchone()[0]
    while value is not None:
        values.append(value)
        if len(values) >= _SEEK_LIMIT:
            rest = f"SELECT DISTINCT {column} FROM {table} WHERE {column} > ? ORDER BY {column}"
            values.extend(row[0] for row in conn.execute(rest, (value,)))
            break
        value = conn.execute(
            f"SELECT min({column}) FROM {table} WHERE {column} > ?", (value,)
        ).fetchone()[0]
    return values


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE ... COMMIT; any exception, even a BaseException, rolls back and re-raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


# What may change the rows a load hands the target: any trigger on the table (SQLite's fire
# on INSERT, DELETE or UPDATE, BEFORE or AFTER), or a view of its name (INSTEAD OF triggers).
_REWRITING = (
    "SELECT count(*) FROM sqlite_master WHERE (type = 'trigger' AND tbl_name = ? COLLATE NOCASE)"
    " OR (type = 'view' AND name = ? COLLATE NOCASE)"
)
_FENCE_AT: dict[str, Any] = {"table": _quote(FENCE_TABLE), "marker": "?"}
_FENCE: dict[str, Any] = {**_FENCE_AT, "text": "TEXT NOT NULL", "integer": "INTEGER NOT NULL"}


def _fence_first(conn: sqlite3.Connection, entry: LedgerEntry | None) -> None:
    if entry is not None and _table_columns(conn, FENCE_TABLE):
        fence_first(_query(conn), entry, **_FENCE_AT)


def _query(conn: sqlite3.Connection) -> Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]:
    return lambda sql, params: conn.execute(sql, params).fetchall()


def _record(conn: sqlite3.Connection, ledger: LedgerEntry | None, rows: int) -> int:
    """Inside the load's transaction: check the rows applied and the fence, then write the
    batch's ledger row; returns ``rows``."""
    if ledger is not None:
        check_applied(ledger, rows)
        fence_batch(_query(conn), ledger, **_FENCE)
        conn.execute(
            ledger_table_sql(
                _quote(LEDGER_TABLE),
                seq="INTEGER PRIMARY KEY",
                integer="INTEGER NOT NULL",
                text="TEXT NOT NULL",
            )
        )
        target, batch, entry, partitions = ledger.row()
        conn.execute(
            f"INSERT INTO {_quote(LEDGER_TABLE)} (target_table, batch_id, rows, entry, partitions)"
            " VALUES (?, ?, ?, ?, ?)",
            (target, batch, rows, entry, partitions),
        )
        if ledger.rejects:
            conn.execute(rejects_table_sql(_quote(REJECTS_TABLE), text="TEXT"))
            write_rejects(conn.executemany, ledger.rejects, target_table=target, batch_id=batch,
                          table=_quote(REJECTS_TABLE), marker="?")  # fmt: skip
    return rows


def _create_table(conn: sqlite3.Connection, table: str, columns: Sequence[Column]) -> None:
    if not columns:
        raise ConfigInvalid("at least one column is required")
    definitions = ", ".join(_column_sql(column) for column in columns)
    conn.execute(f"CREATE TABLE IF NOT EXISTS {_quote(table)} ({definitions})")


def _prepare_target(
    conn: sqlite3.Connection, table: str, columns: Sequence[Column], *, replace: bool
) -> None:
    _create_table(conn, table, columns)
    if replace:
        conn.execute(f"DELETE FROM {_quote(table)}")


def _insert(conn: sqlite3.Connection, table: str, payload: RowChunks) -> int:
    """Insert the payload's rows, in this connection's transaction: a pulled SQLite file
    (``LoadFile.native``) by one ``INSERT ... SELECT`` from it, attached read-only, its digest
    checked before SQLite reads it and again after, before the load commits (a file changed
    in between fails the load); other rows as chunks. More pulled files than SQLite attaches
    at once were merged before the target call (``merge_load_files``)."""
    names = _column_list(payload.columns)
    marks = ", ".join("?" * len(payload.columns))
    insert = f"INSERT INTO {_quote(table)} ({names}) VALUES ({marks})"
    if not isinstance(payload, LoadFiles) or not any(file.native for file in payload.files):
        return sum(conn.executemany(insert, chunk).rowcount for chunk in payload.chunks)
    rows = 0
    for number, file in enumerate(payload.files):
        if not file.native:
            chunks = read_chunks(file.path, file.sha256)
            rows += sum(conn.executemany(insert, chunk).rowcount for chunk in chunks)
            continue
        check_digest(file.path, file.sha256)
        schema = f"dpone_load_{number}"
        try:
            conn.execute(f"ATTACH DATABASE ? AS {schema}", (_uri(str(file.path), read_only=True),))
            rows += conn.execute(
                f"INSERT INTO {_quote(table)} ({names}) SELECT {names} FROM {schema}.{_PULLED}"
                " ORDER BY rowid"
            ).rowcount
        except sqlite3.DatabaseError:
            check_digest(file.path, file.sha256)  # a file changed while it was read says so
            raise
        check_digest(file.path, file.sha256)
    return rows


_PULLED = '"rows"'  # the one table of a pulled SQLite load file


@contextlib.contextmanager
def _pulling(source: SQLiteFile) -> Iterator[sqlite3.Connection]:
    """A scratch connection with ``source``'s file attached read-only as ``src``."""
    scratch = sqlite3.connect(":memory:", timeout=_TIMEOUT, isolation_level=None)
    with contextlib.closing(scratch) as conn:
        conn.execute("ATTACH DATABASE ? AS src", (_uri(source.path, read_only=True),))
        yield conn


def _create_pulled(conn: sqlite3.Connection, path: Path, schema: str, names: str) -> None:
    """A new private SQLite file at ``path`` of one untyped table, attached as ``schema``."""
    create_private(path).close()
    conn.execute(f"ATTACH DATABASE ? AS {schema}", (_uri(os.fspath(path), read_only=False),))
    conn.execute(f"PRAGMA {schema}.journal_mode = OFF")  # a new file: a failure removes it
    conn.execute(f"PRAGMA {schema}.synchronous = OFF")  # its digest is taken after it is closed
    conn.execute(f"CREATE TABLE {schema}.{_PULLED} ({names})")


def _pull(plan: LoadPlan, path: Path) -> list[int] | None:
    """The plan's partitions in a new SQLite file at ``path``, each value as the source stores
    it (untyped columns), in one read transaction of the source; each bound's count, or None
    when they cannot be counted (``_counted``).

    The rows are those each partition's own read selects (``select_sql``), or, where the
    source reads the plan in one statement (``table_sql``: one scan of an unindexed table,
    or the whole table), that statement's, counted by partition value afterwards."""
    source = plan.source
    assert isinstance(source, SQLiteFile)  # can_pull
    columns, names = plan.columns, _column_list(plan.columns)
    with _pulling(source) as conn:
        _create_pulled(conn, path, "out", names)
        insert = f"INSERT INTO out.{_PULLED} ({names}) "
        conn.execute("BEGIN")
        whole = source.table_sql(plan.bounds, conn=conn, schema="src", columns=columns)
        counts: list[int] | None
        if whole is None:
            counts = [
                conn.execute(insert + sql, params).rowcount
                for sql, params in (
                    source.select_sql(bounds, schema="src", columns=columns)
                    for bounds in plan.bounds
                )
            ]
        else:
            copied = conn.execute(insert + whole[0], whole[1]).rowcount
            counts = _counted(conn, source, plan)
            if counts is not None and sum(counts) != copied:
                counts = None  # a row of no bound, or of two
        if counts is None:
            conn.execute("ROLLBACK")
            return None
        conn.execute("COMMIT")
    return counts


def _pull_each(plan: LoadPlan, paths: Sequence[Path]) -> list[int] | None:
    """Each bound's partition in a new SQLite file of its own (file-artifact), as ``_pull``
    writes one; each bound's count, or None.

    The source is read in one read transaction, as ``_pull`` reads it, into a work file:
    a writer moving a row between partitions meanwhile neither loses nor doubles it. An
    attached file's transaction cannot span an ``ATTACH``, so the partition files are cut
    from the work file afterwards, a rowid run each. Where the source reads the plan in one
    scan (``table_sql(by_partition=True)``: an unindexed table), that scan is the copy, in
    partition order, and its runs are found in it (``_sorted_runs``, ``_range_runs``);
    otherwise each partition's own read is copied in turn (an index seeks it), its run
    where the one before ends."""
    source = plan.source
    assert isinstance(source, SQLiteFile)  # can_pull
    columns, names = plan.columns, _column_list(plan.columns)
    work = paths[0].with_name("sorted.sqlite")  # partition files are named p-<hex>
    try:
        with _pulling(source) as conn:
            scan = source.table_sql(
                plan.bounds, conn=conn, schema="src", columns=columns, by_partition=True
            )
            run = f"SELECT {names} FROM sorted.{_PULLED} WHERE rowid BETWEEN ? AND ?"
            ranged = scan is None or any("partition" not in bounds for bounds in plan.bounds)
            runs: list[tuple[int, int, Any]] | None
            if scan is None:
                reads = [source.select_sql(b, schema="src", columns=columns) for b in plan.bounds]
                copied = _copy_scan(conn, plan, work, reads)
                ends = list(itertools.accumulate(copied))
                runs = [(end - rows + 1, end, None) for rows, end in zip(copied, ends, strict=True)]
            else:
                runs = (_range_runs if ranged else _sorted_runs)(conn, source, plan, work, scan)
                if runs is None:
                    return None
            if ranged:  # each row of the run is its bound's (copied as such, or routed to it)
                reads = [(f"{run} ORDER BY rowid", r[:2]) for r in runs]
            else:
                key = _quote(source.partition_column)
                reads = [(f"{run} AND {key} IS ? ORDER BY rowid", r) for r in runs]
            counts = []
            for path, (sql, params) in zip(paths, reads, strict=True):
                _create_pulled(conn, path, "out", names)
                conn.execute("BEGIN")
                counts.append(
                    conn.execute(f"INSERT INTO out.{_PULLED} ({names}) {sql}", params).rowcount
                )
                conn.execute("COMMIT")
                conn.execute("DETACH DATABASE out")
        if counts != [last - first + 1 for first, last, _ in runs]:
            return None  # a row of the run held another value: the runs were not sorted
        return counts
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(work)


def _sorted_runs(
    conn: sqlite3.Connection,
    source: SQLiteFile,
    plan: LoadPlan,
    path: Path,
    scan: tuple[str, tuple],
) -> list[tuple[int, int, Any]] | None:
    """``scan`` (rows in partition order) copied into a new work file at ``path``, attached as
    ``sorted``; per bound, the rowid range its value should hold there, and the value as the
    column stores it. The ranges are found by bisection, in SQLite's order of the values,
    and run on from rowid 1 to the last, each starting where the one before ends; the caller
    checks each (every row of it holds its value; a range that runs backwards fails that).
    None when two bounds name one stored value, or the first range would not start at 1."""
    (copied,) = _copy_scan(conn, plan, path, [scan])
    stored = _stored_values(conn, source, plan)
    pairs = ", ".join("(?, ?)" for _ in stored)
    ordered = conn.execute(
        f"SELECT column2 FROM (VALUES {pairs}) ORDER BY column1",
        [item for number, value in enumerate(stored) for item in (value, number)],
    ).fetchall()
    rank = {stored[number]: position for position, (number,) in enumerate(ordered)}
    if len(rank) != len(stored):
        return None
    probe = f"SELECT {_quote(source.partition_column)} FROM sorted.{_PULLED} WHERE rowid = ?"

    def rank_of(rowid: int) -> int:
        value = conn.execute(probe, (rowid,)).fetchone()[0]
        return rank.get(value, -1)

    rowids = range(1, copied + 1)  # a new table: rowids 1..copied, in the scan's order
    starts = [
        bisect.bisect_left(rowids, position, key=rank_of) + 1 for position in range(len(stored))
    ]
    if starts[0] != 1:  # a value of no bound sorted in: bisection is off, rows would be lost
        return None
    ends = [*(start - 1 for start in starts[1:]), copied]  # so the runs cover every row once
    runs = [(0, 0, None)] * len(stored)
    for position, (number,) in enumerate(ordered):
        runs[number] = (starts[position], ends[position], stored[number])
    return runs


def _copy_scan(
    conn: sqlite3.Connection, plan: LoadPlan, path: Path, scans: Sequence[tuple[str, tuple]]
) -> list[int]:
    """The ``scans``' rows copied, in turn and each in its order, into a new work file at
    ``path``, attached as ``sorted``, in one read transaction of the source: rowids 1 on,
    each scan's after the one before; each scan's count."""
    insert = f"INSERT INTO sorted.{_PULLED} ({_column_list(plan.columns)}) "
    _create_pulled(conn, path, "sorted", _column_list(plan.columns))
    conn.execute("BEGIN")
    copied = [conn.execute(insert + sql, params).rowcount for sql, params in scans]
    conn.execute("COMMIT")
    return copied


def _range_runs(
    conn: sqlite3.Connection,
    source: SQLiteFile,
    plan: LoadPlan,
    path: Path,
    scan: tuple[str, tuple],
) -> list[tuple[int, int, Any]] | None:
    """``_sorted_runs`` of key ranges: ``scan`` (rows in bound order) copied into a work file,
    then each row's bound found by ``range_route`` in one read of the copied keys. None when
    a row belongs to no bound, or a bound's rows are not one run."""
    _copy_scan(conn, plan, path, [scan])
    route = source.range_route(conn, "src", plan.bounds)
    if route is None:
        return None
    runs: dict[int, list[int]] = {}
    previous = None
    key = _quote(source.partition_column)
    for rowid, value in conn.execute(f"SELECT rowid, {key} FROM sorted.{_PULLED} ORDER BY rowid"):
        number = route(value)
        if number is None or (number != previous and number in runs):
            return None
        runs.setdefault(number, [rowid, rowid])[1] = rowid
        previous = number
    return [(*runs.get(number, (1, 0)), None) for number in range(len(plan.bounds))]


def _counted(conn: sqlite3.Connection, source: SQLiteFile, plan: LoadPlan) -> list[int] | None:
    """Each bound's rows of a ``table_sql`` plan: a plan of key ranges by one read of the
    pulled keys (``range_route``), or each range by its own count of the source in the
    pull's read transaction where an index seeks them; a plan of one value per bound by
    partition value in the pulled file, as the column stores them. None when a row belongs
    to no bound."""
    key = _quote(source.partition_column)
    if any("partition" not in bounds for bounds in plan.bounds):
        route = source.range_route(conn, "src", plan.bounds)
        if route is None:
            statements = (source.count_sql(bounds, schema="src") for bounds in plan.bounds)
            return [conn.execute(sql, params).fetchone()[0] for sql, params in statements]
        counts = [0] * len(plan.bounds)
        for (value,) in conn.execute(f"SELECT {key} FROM out.{_PULLED}"):
            number = route(value)
            if number is None:
                return None
            counts[number] += 1
        return counts
    stored = _stored_values(conn, source, plan)
    index = {value: number for number, value in enumerate(stored)}
    if len(index) != len(stored):
        return None
    counts = [0] * len(stored)
    for value, rows in conn.execute(f"SELECT {key}, count(*) FROM out.{_PULLED} GROUP BY {key}"):
        if value not in index:
            return None
        counts[index[value]] += rows
    return counts


def _stored_values(conn: sqlite3.Connection, source: SQLiteFile, plan: LoadPlan) -> list[Any]:
    """The plan's partition values (one per bound) as the partition column stores them."""
    column = next(c for c in plan.columns if c.name == source.partition_column)
    return _as_stored(conn, parsed_type(column.decltype), [b["partition"] for b in plan.bounds])


def _row_count(conn: sqlite3.Connection, table: str) -> int:
    if not _table_columns(conn, table):
        return 0
    return conn.execute(f"SELECT COUNT(*) FROM {_quote(table)}").fetchone()[0]
