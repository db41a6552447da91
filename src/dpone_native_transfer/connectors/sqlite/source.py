"""The SQLite source: one table of a SQLite file, read in partitions (a ``SQLiteFile`` the
built-in engines read themselves).

Every call opens its own connection and closes it before returning (within an attempt's
``snapshot``, the attempt's one connection, holding no lock between statements unless the
file is in WAL mode), so other workers and child processes can use the same file between
calls. Identifiers are always quoted and values always bound as
parameters. Errors raised here on purpose name tables and columns only, never the file path
or a sqlite message.
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from ...checkpoints import sha256_digest
from ...drivers import file_failure, file_path
from ...errors import (
    ConfigInvalid,
    SourceAccessRefused,
    SourceInvalid,
    SourceMissing,
    ValueUnsupported,
)
from ...identity import TableIdentity, file_location, fold_ascii, upper_ascii
from ...payloads import Column, Predicate, SourceShape, bound_predicates
from .._sql import (
    RANGE_EDGES,
    TableSource,
    bounds_where,
    check_chunk_rows,
    edge_where,
    one_window_ranges,
    partition_predicate_count,
    range_cuts_sql,
    range_partitions,
    ranges_run_on,
    render_predicates,
)
from .._sql import quote as _quote
from ..contract import DEFAULT_CHUNK_ROWS, SourceFeatures
from ..sqlite_reading import index_seeks, narrow_window, watching_writes
from .common import (
    TIMEOUT,
    as_stored,
    column_list,
    column_ref,
    file_uri,
    is_strict,
    source_invalid,
    table_columns,
)
from .ranges import RangeRoute

__all__ = ["SQLiteSource", "integer_primary_key"]

_KINDS = {"integer": "numbers", "real": "numbers"}  # SQLite compares the two as numbers
# A text cursor's value that reads as a day (``2024-1-5``, `` 2024-01-05``, ``2024-01-05t10``)
# must be in the one form whose text order is time's: ``YYYY-MM-DD``, or with ``[T ]HH:MM:SS``,
# a fraction and a zone suffix.
# A date or timestamp text (its zone suffix cut off, as ``{base}``) written one way: the day,
# a space, the time with its seconds, the fraction without trailing zeros (``check_key``).
_ONE_SPELLING = (
    "substr({base}, 1, 10) || ' ' || CASE length({base}) WHEN 10 THEN '00:00:00'"
    " WHEN 16 THEN substr({base}, 12, 5) || ':00'"
    " ELSE substr({base}, 12, 8) || rtrim(rtrim(substr({base}, 20), '0'), '.') END"
)
_LIKE_A_DAY = re.compile(r"\s*[0-9]{1,4}-[0-9]{1,2}-[0-9]{1,2}", re.ASCII)
_ORDERED_DAY = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}"
    r"(?:[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]+)?(?:Z|[+-][0-9]{2}(?::?[0-9]{2})?)?)?",
    re.ASCII,
)


def integer_primary_key(path: str, table: str) -> str:
    """The column that is ``table``'s rowid (its ``INTEGER PRIMARY KEY``): the range key of a
    route that names no partition column. ``ConfigInvalid`` when it has none."""
    source = SQLiteSource(path, table, "rowid")
    with source.reader() as conn:
        rows = conn.execute("SELECT name, type, pk FROM pragma_table_info(?)", (table,)).fetchall()
    keys = [(name, decltype) for name, decltype, pk in rows if pk]
    if len(keys) == 1 and upper_ascii(keys[0][1].strip()) == "INTEGER":
        return keys[0][0]
    raise ConfigInvalid(
        f"source table {table!r} has no INTEGER PRIMARY KEY to cut into ranges: name a "
        "partition_column (see docs/incremental.md#partitions-that-fit-the-table)",
        diagnostics={"key": "source.partition_column", "table": table},
    )


class SQLiteSource(TableSource):
    """Reads one table of a SQLite file in partitions, optionally windowed by a cursor column:
    a ``SQLiteFile`` the built-in engines read themselves."""

    features = SourceFeatures(watches_writes=True)

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
        self.path = file_path(path)
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
        """One connection for the attempt, which this thread's reads use (``reader``). For a
        file in WAL mode it holds a read transaction. A file in rollback-journal mode is read
        a transaction per statement, as without it: holding its read lock would stop every
        writer for the whole attempt; the connection is kept, idle between statements, so
        that each read does not open the file again and parse its schema (2 ms a read in a
        file of 1,000 tables)."""
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
        self._held = (conn, threading.get_ident())
        try:
            yield
        finally:
            self._held = None
            conn.close()

    @contextlib.contextmanager
    def watching_writes(self) -> Iterator[Callable[[], bool]]:
        """SQLite's ``data_version`` (``sqlite_reading.watching_writes``), or a
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
                raise source_invalid(  # SQLite's error code (SQLITE_BUSY...), not its text
                    f"source table {self.table!r} could not be read",
                    table=self.table,
                    sqlite_error=getattr(exc, "sqlite_errorname", type(exc).__name__),
                ) from None
            raise failure.error(
                f"the source database of table {self.table!r} cannot be read",
                retry=SourceInvalid,
                refused=SourceAccessRefused,
                diagnostics={"table": self.table},
                fix="give this process read access to the source file",
            ) from None

    def _open(self) -> sqlite3.Connection:
        return sqlite3.connect(file_uri(self.path, read_only=True), uri=True, timeout=TIMEOUT)

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

    def primary_key(self) -> tuple[str, ...]:
        """The table's PRIMARY KEY columns in key order (``pragma_table_info``'s ``pk``)."""
        with self.reader() as conn:
            rows = conn.execute("SELECT name, pk FROM pragma_table_info(?)", (self.table,))
            return tuple(name for name, pk in sorted(rows.fetchall(), key=lambda r: r[1]) if pk)

    def describe(self) -> SourceShape:
        """Columns and hashes; raises ``SourceInvalid`` when the table or a named column is gone."""
        with self.reader() as conn:
            columns = table_columns(conn, self.table)
            if is_strict(conn, "main", self.table):  # ANY keeps each value as it is given
                columns = tuple(_strict_any(column) for column in columns)
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
        return column_ref(column, self.table)

    def _template(self, columns: Sequence[Column]) -> str:
        """The extraction query with placeholders: what ``query_hash`` identifies."""
        sql = (
            f"SELECT {column_list(columns, self.table)} FROM {_quote(self.table)}"
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
        """Ranges of about ``partition_rows`` rows of the partition column
        with a cursor in ``(after, upto]`` (one sequential read of the key, by its index)."""
        window, params = self._cursor_window(after, upto)
        key, table = self._ref(self.partition_column), _quote(self.table)

        def exists(condition: str) -> bool:
            sql = f"SELECT EXISTS (SELECT 1 FROM {table} WHERE {condition})"
            return bool(conn.execute(sql, params).fetchone()[0])

        with self.reader() as conn:
            if (self.partition_rows or 0) > 1 and self._sole_primary_key(conn):
                cuts = self._chained_cuts(conn, key, table, window, params)
            else:
                sql = range_cuts_sql(key, table, window, "?")
                cuts = [row[0] for row in conn.execute(sql, (*params, self.partition_rows))]
            keyed = bool(cuts) or exists(" AND ".join([f"{key} IS NOT NULL", *window]))
            has_null = exists(" AND ".join([f"{key} IS NULL", *window]))
        return range_partitions(cuts, keyed=keyed, has_null=has_null)

    def _sole_primary_key(self, conn: sqlite3.Connection) -> bool:
        """Whether the partition column alone is the table's PRIMARY KEY: its values are then
        distinct (NULLs aside), in the order ``ORDER BY`` gives them."""
        rows = conn.execute("SELECT name, pk FROM pragma_table_info(?)", (self.table,))
        keys = [name for name, pk in rows.fetchall() if pk]
        column = self.partition_column or ""
        return len(keys) == 1 and fold_ascii(keys[0]) == fold_ascii(column)

    def _chained_cuts(
        self,
        conn: sqlite3.Connection,
        key: str,
        table: str,
        window: list[str],
        params: Sequence[Any],
    ) -> list[Any]:
        """``range_cuts_sql``'s cuts of a key whose values are distinct, each found from the
        one before it by an ``OFFSET`` along the key's index: one walk of the key in SQLite's
        B-tree code, not its window function's (several times slower on a million rows)."""
        assert self.partition_rows is not None
        where = " AND ".join([f"{key} IS NOT NULL", *window])
        first = f"SELECT {key} FROM {table} WHERE {where} ORDER BY {key} LIMIT 1 OFFSET ?"
        after = (
            f"SELECT {key} FROM {table} WHERE {where} AND {key} > ? ORDER BY {key} LIMIT 1 OFFSET ?"
        )
        cuts: list[Any] = []
        found = conn.execute(first, (*params, self.partition_rows)).fetchone()
        while found is not None:
            cuts.append(found[0])
            found = conn.execute(after, (*params, found[0], self.partition_rows - 1)).fetchone()
        return cuts

    def _partition_values(
        self, conn: sqlite3.Connection, schema: str, *, after: Any = None, upto: Any = None
    ) -> list:
        window, params = self._cursor_window(after, upto)
        column = self._ref(self.partition_column)
        table = f"{_quote(schema)}.{_quote(self.table)}"
        if not window and index_seeks(
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
            sql = f"SELECT {column_list(columns, self.table)} FROM {table}"
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
        return f"SELECT {column_list(columns, self.table)} FROM {table} ORDER BY rowid", ()

    def range_route(
        self, conn: sqlite3.Connection, schema: str, bounds: Sequence[Mapping[str, Any]]
    ) -> RangeRoute | None:
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
        if index_seeks(conn, f"SELECT 1 FROM {table} WHERE {key} >= ?"):
            return None
        declared = columns[names.index(self.partition_column)].decltype
        edges = [bounds[i].get(edge) for i in split[0] for edge in RANGE_EDGES]
        strict = is_strict(conn, schema, self.table)
        stored = as_stored(conn, declared, edges, strict=strict)  # as ``>= ?`` converts one
        return RangeRoute.of(split[0], stored, null_partition=split[1])

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
        ends = (  # each end alone, which SQLite answers from an index of the cursor
            f"SELECT typeof((SELECT MIN({cursor}) FROM {_quote(self.table)})),"
            f" typeof((SELECT MAX({cursor}) FROM {_quote(self.table)}))"
        )
        with self.reader() as conn:
            low, high = (_KINDS.get(kind, kind) for kind in conn.execute(ends).fetchone())
            if low != high:
                raise ConfigInvalid(
                    f"cursor column {self.cursor_column!r} of source table {self.table!r} holds "
                    f"values of more than one kind ({low} and {high}); a cursor's values must "
                    "all be numbers or all be text: fix the column or choose another",
                    diagnostics={"table": self.table, "column": self.cursor_column},
                )
            if isinstance(after, str) and _LIKE_A_DAY.match(after):
                self._refuse_two_spellings(conn, cursor, after)
            found = conn.execute(sql, params).fetchone()[0]
            if isinstance(found, str) and _LIKE_A_DAY.match(found):
                self._refuse_two_spellings(conn, cursor, found, days=False)
            return found

    def _refuse_two_spellings(
        self, conn: sqlite3.Connection, cursor: str, after: str, *, days: bool = True
    ) -> None:
        """SQLite orders timestamp texts as texts: after a watermark ``2024-01-05T10:00:00``,
        a row written ``2024-01-05 11:00:00`` (``' '`` sorts below ``'T'``) fell below it and
        was never loaded, exit 0; so did ``10:00:00.51Z`` after ``10:00:00.5Z``, ``10:00``
        (the same instant) after ``10:00:00``, any text after ``2024-1-11`` (it sorts above
        ``2024-01-12``), and `` 2024-01-06`` (a leading blank sorts below every digit).
        Refused: a watermark (or, with ``days`` False, the window's top) not in the ordered
        form, any text below ``'0'``, and, with ``days``, a row of the watermark's own day in
        another shape than it (its separator, a time of ``HH:MM:SS``, its zone suffix, and
        before a suffix its fraction's length): only that day's rows can fall below it."""
        problem = not _ORDERED_DAY.fullmatch(after)
        # texts below '0' (a range of the index: texts sort above every number; '0' itself a
        # NUMERIC column would take as the number 0)
        problem = problem or self._holds(conn, f"{cursor} >= '' AND {cursor} < ?", ("/\U0010ffff",))
        if days and not problem and len(after) > 10:
            rest = after[19:]
            zone = rest.lstrip(".0123456789")  # '', 'Z', '+02:00'...
            rest_of = f"substr({cursor}, 20)"
            zone_of = f"ltrim({rest_of}, '.0123456789')"
            shape = (
                f"length({cursor}) < 19 OR substr({cursor}, 11, 1) <> ? OR substr({cursor}, 14,"
                f" 1) <> ':' OR substr({cursor}, 17, 1) <> ':' OR {zone_of} <> ? OR (? <> ''"
                f" AND length({rest_of}) - length({zone_of}) <> ?)"
            )
            day = after[:10]
            problem = self._holds(
                conn,
                f"{cursor} >= ? AND {cursor} < ? AND ({shape})",
                (day, day + "\U0010ffff", after[10], zone, zone, len(rest) - len(zone)),
            )
        if problem:
            raise ConfigInvalid(
                f"cursor column {self.cursor_column!r} of source table {self.table!r} holds "
                "timestamps in more than one spelling (or one that does not sort as time: "
                "'2024-1-5', a leading blank, 'T' or ' ' between date and time, a time "
                "without its seconds, another zone suffix); SQLite orders them as text, so "
                "rows later in time would fall below the watermark and never load: write "
                "one spelling, YYYY-MM-DD[ HH:MM:SS], or read the column through a view that "
                "writes one",
                diagnostics={"table": self.table, "column": self.cursor_column},
            )

    def check_key(self, key: Sequence[str]) -> None:
        """No two texts of one instant in a date or timestamp key column (``Source.check_key``):
        ``2024-01-01 10:00:00`` and ``2024-01-01T10:00:00`` were two keys here and one in
        DuckDB, ClickHouse and PostgreSQL, and a merge kept one row of the two (exit 0).
        Texts of one shape (one length, separator, zone suffix and fraction length) are
        distinct instants: one aggregate read of the column proves it. Otherwise each text's
        instant is written one way (``_ONE_SPELLING``: the fraction's trailing zeros dropped,
        a time without seconds given them) and grouped, under one zone suffix only: on merge
        routes with such a key alone."""
        kinds = {column.name: column.kind for column in self._described_columns()}
        for name in key:
            if kinds.get(name) not in ("date", "timestamp", "timestamptz"):
                continue
            ref, table = self._ref(name), _quote(self.table)
            tail = f"substr({ref}, 20)"
            zone = f"ltrim({tail}, '.0123456789')"
            shapes = (
                f"SELECT count(DISTINCT length({ref})), count(DISTINCT substr({ref}, 11, 1)),"
                f" count(DISTINCT length({tail}) - length({zone})), count(DISTINCT {zone})"
                f" FROM {table} WHERE typeof({ref}) = 'text'"
            )
            base = f"substr({ref}, 1, length({ref}) - length({zone}))"
            spelled = _ONE_SPELLING.format(base=base)
            twins = (
                f"SELECT 1 FROM {table} WHERE typeof({ref}) = 'text' GROUP BY {spelled}"
                f" HAVING count(DISTINCT {ref}) > 1 LIMIT 1"
            )
            with self.reader() as conn:
                *shape, zones = conn.execute(shapes).fetchone()
                one = max(*shape, zones) <= 1
                if not one and (zones > 1 or conn.execute(twins).fetchone() is not None):
                    raise ConfigInvalid(
                        f"primary key column {name!r} of source table {self.table!r} holds "
                        "one date or timestamp in more than one spelling ('T' or ' ' between "
                        "date and time, trailing zeros, another zone suffix): SQLite tells "
                        "them apart as texts, the target as instants, so a merge would keep "
                        "one row of two keys. Write one spelling, or merge through a view "
                        "that writes one; nothing was written",
                        diagnostics={
                            "key": "source.primary_key",
                            "table": self.table,
                            "column": name,
                        },
                    )

    def _holds(self, conn: sqlite3.Connection, condition: str, params: tuple = ()) -> bool:
        """Whether a row of the table meets ``condition`` (an index of the cursor answers
        the conditions above by a range)."""
        sql = f"SELECT 1 FROM {_quote(self.table)} WHERE {condition} LIMIT 1"
        return conn.execute(sql, params).fetchone() is not None

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
            f"SELECT {column_list(columns, self.table)} FROM {_quote(schema)}.{_quote(self.table)}"
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
        read, was closed, or in another thread: closing its cursor or connection then raised
        from the collector, a traceback printed after the run's own error. An abandoned read
        has nothing left to report, so its closing errors are dropped."""
        abandoned = False
        try:
            with self.reader() as conn:
                cursor = conn.execute(sql, params)
                try:
                    while chunk := cursor.fetchmany(chunk_rows):
                        try:
                            yield chunk
                        except GeneratorExit:
                            abandoned = True
                            raise
                finally:
                    with contextlib.suppress(sqlite3.Error):  # a read: closing loses nothing
                        cursor.close()
        except SourceInvalid:
            if not abandoned:
                raise

    def read_partitions(
        self, bounds: Sequence[Mapping[str, Any]], *, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[tuple[int, list[tuple]]] | None:
        """Partitions of one value each, all in the same cursor window, in
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
            values = self._scan_values(conn, "main", partitions, columns, window=window)
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
        sql = f"SELECT {column_list(columns, self.table)} FROM {_quote(self.table)}"
        sql += f" WHERE {where} ORDER BY rowid" if where else " ORDER BY rowid"
        position = [column.name for column in columns].index(self.partition_column)
        return _routed(self._chunks(sql, tuple(params), chunk_rows), position, route)

    def _read_ranges(
        self, bounds: Sequence[Mapping[str, Any]], chunk_rows: int
    ) -> Iterator[tuple[int, list[tuple]]] | None:
        """``read_partitions`` of key ranges (``partition_by = "range"``) and the NULL key's
        partition, in one cursor window: one scan, each row given to its range by
        ``range_route``. Read a range at a time, without an index, each range was a scan
        (figures: docs/performance.md, fix 54)."""
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
        *,
        window: Sequence[Predicate] | None = None,
    ) -> list[Any] | None:
        """The partitions' values as the column stores them (its affinity converts ``'5'``
        into 5 in an INTEGER column, as it converts a bound parameter), when one scan of the
        table in ``schema`` tells them apart exactly; otherwise None. Not when the partition
        column has an index to seek (each partition's own read is cheaper), unless the scan
        is of a narrow cursor ``window`` (``narrow_window``), compares other than byte by
        byte, or two bounds name one value."""
        key, table = self._ref(self.partition_column), f"{_quote(schema)}.{_quote(self.table)}"
        names = [column.name for column in columns]
        if self.partition_column not in names:
            return None
        if index_seeks(conn, f"SELECT 1 FROM {table} WHERE {key} = ?") and not (
            window and narrow_window(conn, self.table, window, name=self._ref)
        ):
            return None
        if self.partition_column in self.collated_columns():
            return None
        declared = columns[names.index(self.partition_column)].decltype
        strict = is_strict(conn, schema, self.table)
        values = as_stored(conn, declared, [p.value for p in partitions], strict=strict)
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
            f"SELECT {column_list(columns, self.table)} FROM {_quote(schema)}.{_quote(self.table)}"
            f" WHERE {condition} ORDER BY {order}"
        )
        return sql, (*known, *params)

    def edge_rows(
        self, *, since: Any, upto: Any, nulls: bool, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[list[tuple]]:
        """Rows of every partition with a cursor in ``[since, upto]`` or, when ``nulls``, NULL.
        A cursor declared NOT NULL holds no NULL (SQLite enforces it on every write), and
        asking for one anyway made SQLite scan the whole table instead of seeking its index."""
        if nulls and self._not_null(self._cursor()):
            nulls = False
        where, params = edge_where(self._ref(self._cursor()), "?", since, upto, nulls)
        if not where:
            return iter(())
        columns = self._described_columns()
        sql = (
            f"SELECT {column_list(columns, self.table)} FROM {_quote(self.table)}"
            f" WHERE {where} ORDER BY rowid"
        )
        return self._chunks(sql, tuple(params), chunk_rows)

    def _not_null(self, column: str) -> bool:
        with self.reader() as conn:
            sql = 'SELECT "notnull" FROM pragma_table_info(?) WHERE name = ?'
            found = conn.execute(sql, (self.table, column)).fetchone()
        return bool(found and found[0])

    def count(self, bounds: Mapping) -> int:
        sql, params = self.count_sql(bounds)
        with self.reader() as conn:
            return conn.execute(sql, params).fetchone()[0]

    def count_sql(self, bounds: Mapping, *, schema: str = "main") -> tuple[str, tuple]:
        where, params = self._where(bounds)
        return f"SELECT COUNT(*) FROM {_quote(schema)}.{_quote(self.table)} WHERE {where}", params


def _strict_any(column: Column) -> Column:
    """A STRICT table's ``ANY`` column as an untyped one (kind ``any``): it stores each value
    as given, where a column declared ``ANY`` elsewhere has NUMERIC affinity (a target so
    declared stored the text ``'007'`` as 7, exit 0)."""
    if upper_ascii(column.decltype).strip() != "ANY":
        return column
    return Column(column.name, column.decltype, kind="any")


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


_SEEK_LIMIT = 1_000  # past this many partitions, reading the rest of the index is cheaper


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
