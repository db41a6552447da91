"""PostgreSQL source: one table read in partitions through a server-side cursor (psycopg 3).

``dsn`` is a ``postgresql://`` URL or ``env:NAME``, the forms the checkpoint
store takes; a key=value string is refused. ``table`` is ``name`` (found
through the server's ``search_path``) or ``schema.name``, split at the first
dot, so a schema name cannot hold a dot.

Every call opens its own connection, in a read-only transaction, and closes
it before returning; within an attempt (``snapshot``) each transaction imports
the snapshot one held connection exported, so the attempt reads one state.
``read`` declares a named (server-side) cursor and fetches ``chunk_rows``
rows at a time, so a partition is never held in memory whole.

Values come out as the types the transfer paths carry everywhere (the spool
format, SQLite parameters): int, float, str, bool, bytes, None; each column's
kind (``column_types.postgres_kind``) tells the sink how to carry them.
Integer, floating-point, boolean, bytea and character columns keep the
driver's value; every other type (numeric, date, timestamp, uuid, json, ...)
is read as PostgreSQL's text of the value, in a session with TimeZone UTC
and DateStyle ISO, so numerics stay exact and timestamps are ISO 8601.
Partition values and cursors are therefore JSON-safe for checkpoints, and
comparisons still run on the column's own type on the server.

Errors never hold the DSN, the password, SQL or the driver's text: a
connection or SQL failure is ``SourceInvalid`` naming the table only, and
``SourceAccessRefused`` (exit 2) when the server refused the login, has no such
database, or the login may not read (``drivers.ServerFailure`` tells them apart).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ..artifacts import DigestWriter, create_private
from ..checkpoints import sha256_digest
from ..column_types import postgres_kind
from ..drivers import (
    POSTGRES_SCHEMES,
    ServerFailure,
    import_driver,
    postgres_begin,
    postgres_connect,
    postgres_failure,
    postgres_release,
    resolve_env,
)
from ..errors import ConfigInvalid, NativeTransferError, SourceAccessRefused, SourceInvalid
from ..identity import TableIdentity, server_location
from ..payloads import Column, LoadFile, Predicate, SourceShape, bound_predicates
from ._arrow import arrow, read_together, write_tagged_batches
from ._sql import (
    RANGE_EDGES,
    TableSource,
    bounds_where,
    check_chunk_rows,
    edge_where,
    one_window_ranges,
    partition_predicate_count,
    quote,
    range_partitions,
    render_predicates,
)
from .contract import DEFAULT_CHUNK_ROWS
from .contract.postgres_table import EngineLogin
from .postgres_bulk import Inexact, arrow_schema, copy_batches

__all__ = ["PostgresSource"]

_T = TypeVar("_T")

_CURSOR = "dpone_read"
_PLACE = "dpone_place"  # the place ``_placed_scan`` gives each row
_MOST_PARAMETERS = 65_535  # one statement's parameters: the protocol counts them in 16 bits
# format_type() names whose values the driver returns as int, float, bool, bytes or str.
_NATIVE = frozenset(
    {"smallint", "integer", "bigint", "real", "double precision", "boolean", "bytea"}
    | {"text", "name", "character", "character varying"}
)
_COLUMNS = """SELECT a.attname, format_type(a.atttypid, a.atttypmod),
        coalesce(NOT k.collisdeterministic, false)
            OR (SELECT t.typname = 'citext' FROM pg_catalog.pg_type t WHERE t.oid = a.atttypid)
    FROM pg_catalog.pg_attribute a
    LEFT JOIN pg_catalog.pg_collation k ON k.oid = a.attcollation
    WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum"""
_INTEGERS = frozenset({20, 21, 23})  # int8, int2, int4: compared exactly with each other
_NUMERIC = 1700
_WRONG_KIND = "42809"  # wrong_object_type: LOCK TABLE of a materialized view
_SNAPSHOT_ID = re.compile(r"[0-9A-F]+-[0-9A-F]+(-[0-9]+)?")  # pg_export_snapshot()'s
# Every setting that changes a value's text: a login's or database's own default (ALTER ROLE
# ... SET extra_float_digits = -15) made a double's text round it, an interval's ISO 8601.
# ``row_security`` off, as ``pg_dump`` sets it: a table whose row-level security policies
# would hide rows from the login is an error to read, not a silently partial one (exit 0 with
# rows missing); a login that bypasses them (its owner, a superuser) reads every row.
_SESSION = (
    "SELECT set_config('TimeZone', 'UTC', true), set_config('DateStyle', 'ISO, YMD', true),"
    " set_config('extra_float_digits', '1', true), set_config('IntervalStyle', 'postgres', true),"
    " set_config('bytea_output', 'hex', true), set_config('row_security', 'off', true)"
)
# A read in the attempt's snapshot waits this long at most for a lock: the snapshot's holder
# has the table's lock, so a read that waits queues behind DDL that waits for the holder (a
# TRUNCATE, an ALTER), which no deadlock check sees: the run and every reader of the table
# hung for good. Such a read fails (a retry may succeed) and the DDL goes on after the run.
_SNAPSHOT_LOCK_WAIT = "2s"
# What an engine's client takes of a DSN (``engine_login``): anything else it would drop.
_ENGINE_DSN_KEYS = frozenset({"host", "port", "dbname", "user", "password"})
_UTC_ZONES = frozenset(
    {"UTC", "Etc/UTC", "UCT", "Etc/UCT", "GMT", "Etc/GMT", "Zulu", "Etc/Zulu", "Universal"}
)
# The login's default session, as a new connection of an engine gets it (no ``_SESSION``).
_ENGINE_SESSION = """SELECT n.nspname, c.relname, current_database(), session_user,
        current_setting('server_encoding'), current_setting('TimeZone'),
        current_setting('extra_float_digits')::int >= 1
            AND current_setting('DateStyle') LIKE 'ISO%%',
        coalesce((SELECT k.collisdeterministic FROM pg_catalog.pg_attribute a
            JOIN pg_catalog.pg_collation k ON k.oid = a.attcollation
            WHERE a.attrelid = c.oid AND a.attname = %s), true)
    FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE c.oid = to_regclass(%s)"""


def _driver() -> Any:
    return import_driver("psycopg", needed_by="PostgresSource")


def _resolve_dsn(dsn: Any, *, role: str = "source") -> str:
    """The URL ``dsn`` names; errors name the key, never the value (it holds a password)."""
    if isinstance(dsn, str):
        dsn = resolve_env(dsn, argument="dsn")
    if not isinstance(dsn, str) or not dsn.startswith(POSTGRES_SCHEMES):
        raise ConfigInvalid(
            f"give a PostgreSQL {role} as a postgresql:// URL or env:NAME",
            diagnostics={"key": "dsn"},
        )
    return dsn


def _name(column: str) -> str:
    """A quoted identifier for psycopg, whose placeholders are ``%s``: a ``%`` is doubled."""
    return quote(column).replace("%", "%%")


_NOT_FINITE = frozenset({"NaN", "Infinity", "-Infinity"})  # a numeric's text of them
_SMALLEST_NORMAL = "2.2250738585072014e-308"  # of a double: below it (not 0), a subnormal


def _value(column: Column) -> str:
    """The select expression of a column: its value, or the text of a type outside the set."""
    native = column.decltype.split("(")[0].strip() in _NATIVE
    return _name(column.name) if native else f"{_name(column.name)}::text"


# Pauses between tries of a connect after the snapshot's holder gave its slot back.
_SLOT_FREED = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)


class PostgresSource(TableSource):
    """Reads one PostgreSQL table in partitions, optionally windowed by a cursor column."""

    def __init__(
        self,
        dsn: str,
        table: str,
        partition_column: str,
        cursor_column: str | None = None,
        *,
        partition_rows: int | None = None,
        parallel: int = 1,
    ) -> None:
        parts = tuple(table.split(".", 1)) if isinstance(table, str) else (table,)
        for name in (*parts, partition_column):
            quote(name)
        if cursor_column is not None:
            quote(cursor_column)
        self._dsn = _resolve_dsn(dsn)
        self._regclass = ".".join(quote(part) for part in parts)  # a value for to_regclass()
        self._relation = ".".join(_name(part) for part in parts)  # SQL text
        self._lock = f"LOCK TABLE {self._relation} IN ACCESS SHARE MODE"  # see ``_started``
        super().__init__(table, partition_column, cursor_column, partition_rows=partition_rows)
        self._snapshot: str | None = None  # the attempt's exported snapshot (``snapshot``)
        self._holder: Any = None  # and the connection that holds it
        self.parallel = parallel  # connections a bulk read reads over at once, one snapshot
        self.identity()  # a DSN that cannot be parsed is refused now, before any run

    @property
    def regclass(self) -> str:
        """The table as ``to_regclass()`` reads it (a value, never SQL text)."""
        return self._regclass

    def identity(self) -> TableIdentity:
        """Host, port and database of the DSN (no user or password); ``public.`` implied.

        Names are case-sensitive: they are always used quoted.
        """
        location = server_location("postgres", self._dsn, default_port=5432, default_database=None)
        table = self.table if "." in self.table else f"public.{self.table}"
        return TableIdentity(location, table)

    def _invalid(self, message: str) -> SourceInvalid:
        return SourceInvalid(message, diagnostics={"table": self.table})

    def _failed(self, failure: ServerFailure) -> NativeTransferError:
        """``SourceInvalid`` (exit 1), or ``SourceAccessRefused`` (exit 2) when the server
        refused the login, has no such database, or the login may not read."""
        return failure.error(
            f"the database of source table {self.table!r} cannot be read",
            retry=SourceInvalid,
            refused=SourceAccessRefused,
            diagnostics={"table": self.table},
            fix="fix the source DSN (its user, password, database or options)"
            " or the login's privileges or settings",
        )

    def _open(self, driver: Any) -> Any:
        """A new read-only connection, outside autocommit, in the attempt's snapshot's
        isolation when one is held; ``_begin`` starts its transaction, and the caller closes
        it. A server that refuses is ``_failed``."""
        conn = self._connected(
            lambda: postgres_connect(
                driver, self._dsn, what="PostgreSQL source", failed=self._failed
            )
        )
        conn.read_only = True
        if self._snapshot is not None:  # importing a snapshot takes a repeatable read
            conn.isolation_level = driver.IsolationLevel.REPEATABLE_READ
        return conn

    def _started(self, driver: Any, *, repeatable: bool = False) -> Any:
        """A connection the run may keep, in a read-only transaction begun in one round trip
        (``drivers.postgres_begin``; a kept one's reset, psycopg's ``BEGIN``, the snapshot's
        import and the session were four): repeatable read when ``repeatable`` or when the
        attempt holds a snapshot, which it imports first (``SET TRANSACTION SNAPSHOT`` comes
        before any query); UTC and ISO dates. ``postgres_release`` gives it back, and closes
        one a read left mid-stream (its session cannot be reset).

        A repeatable read of its own snapshot locks the table first (``ACCESS SHARE``, as
        ``pg_dump`` does; writers go on): a rewrite of the table (``ALTER ... TYPE``)
        committed after a snapshot is taken shows that snapshot the table empty, and a full
        refresh emptied its target, exit 0. The rewrite now waits for the attempt's end.
        ``LOCK TABLE`` takes no materialized view (or foreign table): one is locked by a
        read of no row, which takes the snapshot first; a ``REFRESH`` committed meanwhile
        wrote its rows frozen, which that snapshot sees, and none can commit after."""

        def begun() -> Any:
            snapshot = self._snapshot
            begin = "BEGIN READ ONLY"
            if repeatable or snapshot is not None:
                begin = "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY"
            if snapshot is not None:  # an id _SNAPSHOT_ID matched: no quote inside
                begin += f"; SET TRANSACTION SNAPSHOT '{snapshot}'"
                begin += f"; SET LOCAL lock_timeout = '{_SNAPSHOT_LOCK_WAIT}'"
            elif repeatable:  # before its snapshot is taken (the session's SELECT), see there
                begin += f"; {self._lock}"
            try:
                return postgres_begin(
                    driver, self._dsn, begin, _SESSION, what="PostgreSQL source",
                    failed=self._failed,
                )  # fmt: skip
            except driver.Error as error:
                locking = repeatable and snapshot is None and self._lock.startswith("LOCK")
                if not (locking and error.sqlstate == _WRONG_KIND):
                    raise
            self._lock = f"SELECT FROM {self._relation} LIMIT 0"  # a materialized view
            return begun()

        # a refused connect (``_failed``) may drop the snapshot (``_connected``); a failed
        # statement, raised as the driver's error, is ``_attempt``'s
        return self._attempt(driver, lambda: self._connected(begun))

    def _connected(self, connect: Callable[[], Any]) -> Any:
        """``connect()``; when the server refuses the connection (``SourceInvalid``) while the
        attempt holds a snapshot, again without it."""
        try:
            return connect()
        except SourceInvalid:
            if self._holder is None:
                raise
        # A login allowed one connection (or the server no more): the snapshot's holder
        # takes it, so the attempt reads on without the snapshot, as it did before it.
        # The server frees the holder's slot once its backend has ended, a moment after
        # the close (a connect at once failed under load): a few tries, 3 s in all.
        self._holder.close()
        self._holder = self._snapshot = None
        for pause in _SLOT_FREED:
            try:
                return connect()
            except SourceInvalid:
                time.sleep(pause)
        return connect()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[None]:
        """``Snapshotting``: a connection holds a repeatable-read transaction for the attempt
        and exports its snapshot (``pg_export_snapshot``); each read within imports it on its
        own connection (``SET TRANSACTION SNAPSHOT``), as a parallel ``pg_dump`` does."""
        if self._snapshot is not None:  # held already: its holder ends it
            yield
            return
        driver = _driver()
        conn = self._started(driver, repeatable=True)
        try:
            exported = self._attempt(
                driver, lambda: conn.execute("SELECT pg_export_snapshot()").fetchone()[0]
            )
            if not isinstance(exported, str) or not _SNAPSHOT_ID.fullmatch(exported):
                raise self._invalid(f"source table {self.table!r} could not be read")
            self._holder, self._snapshot = conn, exported
            try:
                yield
            finally:
                self._holder = self._snapshot = None
        finally:
            postgres_release(conn, self._dsn)

    def _begin(self, conn: Any) -> Any:
        """Start the transaction, in the attempt's snapshot when one is held (``snapshot``)."""
        if self._snapshot is not None:  # an id _SNAPSHOT_ID matched: no quote inside
            conn.execute(f"SET TRANSACTION SNAPSHOT '{self._snapshot}'")
        return _session(conn)

    def _attempt(self, driver: Any, work: Callable[[], _T]) -> _T:
        """``work()``; a driver error becomes ``SourceInvalid`` (or ``SourceAccessRefused``),
        raised with nothing chained."""
        try:
            return work()
        except driver.Error as exc:
            failure = postgres_failure(driver, exc)
        if failure is not None:
            raise self._failed(failure)
        raise self._invalid(f"source table {self.table!r} could not be read")

    def _query(self, work: Callable[[Any], _T]) -> _T:
        """``work(conn)`` in a read-only transaction of its own; the connection is given back
        after (``postgres_release``)."""
        driver = _driver()
        conn = self._started(driver)
        try:
            return self._attempt(driver, lambda: work(conn))
        finally:
            postgres_release(conn, self._dsn)

    def _columns(self, conn: Any) -> tuple[Column, ...]:
        """The table's columns; ``SourceInvalid`` when it or a named column does not exist."""
        rows = conn.execute(_COLUMNS, (self._regclass,)).fetchall()
        columns = tuple(Column(name, kind, postgres_kind(kind)) for name, kind, _ in rows)
        self._check_columns(columns)
        if any(loose and name == self.cursor_column for name, _, loose in rows):
            raise ConfigInvalid(
                f"cursor column {self.cursor_column!r} compares text by a case-insensitive or "
                "other nondeterministic collation (or is citext): values the server holds "
                "equal, dpone orders apart, and the rows at the watermark were loaded again "
                "on every run; use a column of a deterministic collation",
                diagnostics={"key": "source.cursor_column", "column": self.cursor_column},
            )
        return columns

    def _column(self, conn: Any, name: str) -> Column:
        return next(column for column in self._columns(conn) if column.name == name)

    def primary_key(self) -> tuple[str, ...]:
        """The table's PRIMARY KEY columns in key order, from the catalog."""
        rows = self._query(lambda conn: conn.execute(_PRIMARY_KEY, (self._regclass,)).fetchall())
        return tuple(name for (name,) in rows)

    def describe(self) -> SourceShape:
        """Columns with their PostgreSQL type names, and the query and schema hashes."""
        columns = self._query(self._columns)
        window = {} if self.cursor_column is None else {"cursor_after": 0, "cursor_upto": 0}
        template, _ = self._select(columns, {"partition": 0, **window})
        return SourceShape(
            columns=columns,
            query_hash=sha256_digest(template),
            schema_hash=sha256_digest([[c.name, c.decltype] for c in columns]),
        )

    def _where(self, bounds: Mapping) -> tuple[str, list[Any]]:
        return bounds_where(
            bounds,
            partition_column=self.partition_column,
            cursor_column=self.cursor_column,
            marker=self._predicate_marker,
            name=_name,
        )

    def _predicate_marker(self, predicate: Predicate) -> str:
        return self._marker(predicate.column)

    def _marker(self, column: str) -> str:
        """The placeholder of a value compared with ``column``: cast to ``real`` for a
        ``real`` column. Bound as a double, a ``real`` column's 0.3 (0.30000001 as a double)
        was above the watermark 0.3 (read from its text), and a row at the window's top was
        left out for ever, exit 0."""
        found = [c.decltype for c in self._described_columns() if c.name == column]
        return "CAST(%s AS real)" if found == ["real"] else "%s"

    def _select(self, columns: Sequence[Column], bounds: Mapping) -> tuple[str, list[Any]]:
        """The extraction query of one partition (with placeholders: what ``query_hash`` names)."""
        where, params = self._where(bounds)
        select = ", ".join(_value(column) for column in columns)
        return f"SELECT {select} FROM {self._relation} WHERE {where}", params

    def select_sql(
        self, bounds: Mapping[str, Any], *, columns: Sequence[Column]
    ) -> tuple[str, list[Any]]:
        """The ``SELECT`` of one partition's ``columns`` (as ``read`` gives them) with ``%s``
        placeholders, and its values: what ``PostgresSink`` pulls on lazy-plan."""
        return self._select(columns, bounds)

    def select_any_sql(
        self, bounds: Sequence[Mapping[str, Any]], *, columns: Sequence[Column]
    ) -> tuple[str, list[Any]]:
        """One ``SELECT`` of the rows of every partition of ``bounds`` (their conditions
        OR-ed: one scan, each row in at most one partition), as ``select_sql`` gives each."""
        wheres = [self._where(each) for each in bounds]
        select = ", ".join(_value(column) for column in columns)
        within = " OR ".join(f"({where})" for where, _ in wheres)
        params = [value for _, own in wheres for value in own]
        return f"SELECT {select} FROM {self._relation} WHERE {within}", params

    def _window(self, after: Any, upto: Any) -> tuple[str, list[Any]]:
        """`` WHERE`` clause of a cursor window ``(after, upto]``, or nothing."""
        conditions, params = self._window_conditions(after, upto)
        return (" WHERE " + " AND ".join(conditions) if conditions else ""), params

    def _window_conditions(self, after: Any, upto: Any) -> tuple[list[str], list[Any]]:
        if after is None and upto is None:
            return [], []
        cursor = self._cursor(" to window by")
        name, marker = _name(cursor), self._marker(cursor)
        bounds = [(f"{name} > {marker}", after), (f"{name} <= {marker}", upto)]
        given = [(sql, value) for sql, value in bounds if value is not None]
        return [sql for sql, _ in given], [value for _, value in given]

    def partition_ranges(self, *, after: Any = None, upto: Any = None) -> list[dict[str, Any]]:
        """``RangePartitioned``: ranges of about ``partition_rows`` rows of the partition column
        with a cursor in ``(after, upto]``."""
        window, params = self._window_conditions(after, upto)
        key = _name(self.partition_column)

        def ranges(conn: Any) -> list[dict[str, Any]]:
            value = _value(Column("k", self._column(conn, self.partition_column).decltype))
            where = " AND ".join([f"{key} IS NOT NULL", *window])
            keys = f"SELECT {key} AS k FROM {self._relation} WHERE {where}"
            ordered = f"SELECT {value} FROM ({keys}) AS dpone_keys ORDER BY dpone_keys.k"
            cuts = _walked_cuts(conn, ordered, params, self.partition_rows or 1)

            def exists(condition: str) -> bool:
                found = f"SELECT EXISTS (SELECT 1 FROM {self._relation} WHERE {condition})"
                return bool(conn.execute(found, params).fetchone()[0])

            keyed = bool(cuts) or exists(" AND ".join([f"{key} IS NOT NULL", *window]))
            has_null = exists(" AND ".join([f"{key} IS NULL", *window]))
            return range_partitions(cuts, keyed=keyed, has_null=has_null)

        return self._query(ranges)

    def partition_values(self, *, after: Any = None, upto: Any = None) -> list:
        """Partition values with a cursor in ``(after, upto]``; NULL first, then by value."""
        window, params = self._window(after, upto)
        partition = _name(self.partition_column)

        def values(conn: Any) -> list:
            value = _value(self._column(conn, self.partition_column))
            sql = (
                f"SELECT {value} FROM (SELECT DISTINCT {partition} FROM {self._relation}{window})"
                f" AS dpone_values ORDER BY dpone_values.{partition} NULLS FIRST"
            )
            return [row[0] for row in conn.execute(sql, params)]

        return self._query(values)

    def max_cursor(self, *, after: Any = None) -> Any:
        """Highest cursor value above ``after``, or None when nothing is newer."""
        cursor_column = self._cursor()
        window, params = self._window(after, None)

        def highest(conn: Any) -> Any:
            cursor = self._column(conn, cursor_column)
            value = _value(Column("max", cursor.decltype))
            sql = f"SELECT max({_name(cursor.name)}) AS max FROM {self._relation}{window}"
            found = conn.execute(f"SELECT {value} FROM ({sql}) AS m", params).fetchone()[0]
            if cursor.decltype.startswith("numeric") and found in _NOT_FINITE:
                raise ConfigInvalid(
                    f"cursor column {cursor_column!r} of source table {self.table!r} holds NaN "
                    "or an infinity: PostgreSQL orders NaN above every number, so a window "
                    "ending there reloaded its rows on every run and never passed it; fix "
                    "the column or choose another cursor",
                    diagnostics={"table": self.table, "column": cursor_column},
                )
            return found

        return self._query(highest)

    def read(
        self, bounds: Mapping, *, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[list[tuple]]:
        """Rows of one partition in chunks of at most ``chunk_rows``; bad bounds fail on call."""
        check_chunk_rows(chunk_rows)
        sql, params = self._select(self._described_columns(), bounds)
        return self._chunks(sql, params, chunk_rows)

    def _chunks(self, sql: str, params: list[Any], chunk_rows: int) -> Iterator[list[tuple]]:
        """Each chunk is one ``FETCH FORWARD chunk_rows`` of a named cursor."""
        driver = _driver()
        conn = self._open(driver)
        cursor = conn.cursor(name=_CURSOR)

        def declare() -> None:
            self._begin(conn)
            cursor.execute(sql, params)

        try:
            self._attempt(driver, declare)
            while chunk := self._attempt(driver, lambda: cursor.fetchmany(chunk_rows)):
                yield chunk
        finally:
            conn.close()
            cursor.close()  # after the connection: nothing is left to send to the server

    def read_partitions(
        self, bounds: Sequence[Mapping[str, Any]], *, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[tuple[int, list[tuple]]] | None:
        """``OnePassReading``: partitions of one value each, or key ranges, all in the same
        cursor window, in one scan, when the server's planner costs that scan below the
        partitions' own reads together (``EXPLAIN``: an index to seek, or a table partitioned
        on the column, keeps the reads). The server places each row (``_read_placed``), or,
        for values ``_read_placed`` declines, routes it with the very conditions each read
        uses (``CASE WHEN k = $1 THEN 0 ...``), so its ``=``, types and collations decide."""
        placed = self._read_placed(bounds, chunk_rows)
        if placed is not None:
            return placed
        split = self._single_values(bounds, chunk_rows)
        if split is None:
            return None
        partitions, window = split
        values = [p.value for p in partitions]
        if len({(type(v), v) for v in values}) < len(values):
            return None  # a partition twice: leave it to the reads
        columns = self._described_columns()
        tests = [self._render([p]) for p in partitions]
        route = " ".join(f"WHEN {sql} THEN {i}" for i, (sql, _) in enumerate(tests))
        within, window_params = self._render(window)
        any_partition = " OR ".join(sql for sql, _ in tests)
        sql = (
            f"SELECT {', '.join(_value(column) for column in columns)}, CASE {route} END"
            f" FROM {self._relation} WHERE {within + ' AND ' if within else ''}({any_partition})"
        )
        test_params = [value for _, test in tests for value in test]
        params = [*test_params, *window_params, *test_params]
        if len(params) > _MOST_PARAMETERS:
            return None

        def cheaper(conn: Any) -> bool:  # and no row of two partitions: CASE takes the first
            key = self._key_type(conn)
            given = [value for value in values if value is not None]
            listed = ", ".join(f"(%s::{key.name})" for _ in given)
            distinct = f"SELECT count(DISTINCT v) FROM (VALUES {listed}) AS u(v)"
            try:
                if not key.deterministic or (
                    given and conn.execute(distinct, given).fetchone()[0] < len(given)
                ):
                    return False  # '1.0' and '1.00', 1 and '1', 'a' and 'A' under citext
            except _driver().Error:  # a value the key's type does not take
                return False
            return self._scan_cheaper(conn, sql, params, bounds)

        if not self._query(cheaper):
            return None
        return _routed(self._chunks(sql, params, chunk_rows))

    def _read_placed(
        self, bounds: Sequence[Mapping[str, Any]], chunk_rows: int
    ) -> Iterator[tuple[int, list[tuple]]] | None:
        """The rows of ``_placed_scan``'s one scan, each with its bound's index."""
        check_chunk_rows(chunk_rows)
        found = self._placed_scan(bounds)
        if found is None:
            return None
        sql, params, places, null_partition = found
        return (
            (index, rows)
            for place, rows in _routed(self._chunks(sql, params, chunk_rows))
            if (index := null_partition if place is None else places[place]) is not None
        )

    def _placed_scan(
        self, bounds: Sequence[Mapping[str, Any]], select: str | None = None
    ) -> tuple[str, list[Any], list[int | None], int | None] | None:
        """Single values or key ranges (``partition_by = "range"``), with the NULL key's
        partition, in one scan when the planner costs it below their own reads. The server
        sorts the values or the ranges' edges (``dense_rank``) and gives each row the place
        ``width_bucket`` finds for its key among them; values keep only rows ``= ANY`` of
        them. Its own ``=``, ``>=`` and ``<``, types and order decide, as in each partition's
        read; rows between ranges are dropped here. A ``CASE`` of every value costs each row
        work that grows with the values, and a read per range a query each, without an index
        a scan (figures: docs/performance.md, fixes 58 and 59).

        None for a key ``width_bucket`` cannot place as its reads compare it
        (``_KeyType.placeable``: a collation other than the database's default, in which
        the edges are sorted, or an array it steps through wrongly), edges of mixed kinds or
        compared in another type than the key's (``_compared_as_key``), values equal on the
        server, and overlapping ranges.

        The scan's SQL (every column as ``read`` selects it, or the ``select`` list given,
        then the place, ``dpone_place``), its values, the bound's index of each place (None:
        no bound's), and the index of the NULL key's bound."""
        singles = self._single_values(bounds, DEFAULT_CHUNK_ROWS)
        if singles is not None:
            predicates, window = singles
            nulls = [i for i, p in enumerate(predicates) if p.op == "IS NULL"]
            members = [i for i, p in enumerate(predicates) if p.op == "="]
            edges = [predicates[i].value for i in members]
        else:
            split = one_window_ranges(bounds)
            if split is None:
                return None
            members, null_partition = split
            nulls = [] if null_partition is None else [null_partition]
            edges = [bounds[i].get(edge) for i in members for edge in RANGE_EDGES]
            first = bounds[members[0]]
            whole = bound_predicates(
                first, partition_column=self.partition_column, cursor_column=self.cursor_column
            )
            window = whole[partition_predicate_count(first) :]
        given = [(n, edge) for n, edge in enumerate(edges) if edge is not None]
        if len(nulls) > 1 or len({type(edge) for _, edge in given}) > 1:
            return None  # one array takes the edges: the driver types it by their kind
        null_partition = nulls[0] if nulls else None
        if select is None:
            select = ", ".join(_value(column) for column in self._described_columns())
        within, window_params = self._render(window)
        name = _name(self.partition_column)

        def plan(conn: Any) -> tuple[str, list[Any], list[int | None]] | None:
            key = self._key_type(conn)
            if not key.placeable:
                return None
            if not given or isinstance(given[0][1], str):  # "unknown" takes the key's type
                array = f"%s::{key.name}[]"
            elif _compared_as_key(conn, [edge for _, edge in given], key.oid):
                array = "%s"
            else:
                return None
            sort = (
                "SELECT n, dense_rank() OVER (ORDER BY v)"
                f" FROM unnest({array}) WITH ORDINALITY AS u(v, n)"
            )
            ranks = {
                given[n - 1][0]: rank for n, rank in conn.execute(sort, [[e for _, e in given]])
            }
            points = [None] * len(set(ranks.values()))  # the distinct edges, in the server's order
            for n, rank in ranks.items():
                points[rank - 1] = edges[n]
            places: list[int | None] = [None] * (len(points) + 1)  # width_bucket's 0..len
            for number, partition in enumerate(members):
                if singles is not None:  # a value's place is its own rank
                    claimed = range(ranks[number], ranks[number] + 1)
                else:
                    claimed = range(
                        ranks.get(2 * number, 0), ranks.get(2 * number + 1, len(places))
                    )
                for place in claimed:
                    if places[place] is not None:
                        return None  # equal values, or ranges that overlap
                    places[place] = partition
            if singles is not None:  # a key between two values is no partition's
                keep = f"{name} = ANY({array})"
                keep = f"({keep} OR {name} IS NULL)" if null_partition is not None else keep
            else:  # a key between two ranges is dropped here
                keep = "" if null_partition is not None else f"{name} IS NOT NULL"
            conditions = " AND ".join(c for c in (within, keep) if c)
            sql = (
                f"SELECT {select}, width_bucket({name}, {array}) AS {_PLACE}"
                f" FROM {self._relation}"
                f" WHERE {conditions or 'true'}"
            )
            params = [points, *window_params, *([points] if singles is not None else [])]
            return (sql, params, places) if self._scan_cheaper(conn, sql, params, bounds) else None

        def planned(conn: Any) -> tuple[str, list[Any], list[int | None]] | None:
            try:
                return plan(conn)
            except _driver().Error:  # an edge or a type the server cannot compare so
                return None

        found = self._query(planned)
        return None if found is None else (*found, null_partition)

    def _scan_cheaper(
        self, conn: Any, sql: str, params: Sequence[Any], bounds: Sequence[Mapping[str, Any]]
    ) -> bool:
        """Whether the planner costs ``sql``, one scan, below the reads of ``bounds`` together
        (``EXPLAIN``; the reads are costed until their sum passes the scan's, since each
        ``EXPLAIN`` takes time; figures: docs/performance.md, fix 58)."""
        scan, reads = _cost(conn, sql, params), 0.0
        columns = self._described_columns()
        for each in bounds:
            reads += _cost(conn, *self._select(columns, each))
            if reads > scan:
                return True
        return False

    def _key_type(self, conn: Any) -> _KeyType:
        """The partition column's type (``_KeyType``), from the catalog."""
        found = conn.execute(_KEY_TYPE, (self._regclass, self.partition_column)).fetchone()
        if found is None:
            return _KeyType("", 0, placeable=False, deterministic=False)
        return _KeyType(found[0].replace("%", "%%"), found[1], found[2], found[3])

    def _render(self, predicates: Iterable[Any]) -> tuple[str, list[Any]]:
        return render_predicates(predicates, marker=self._predicate_marker, name=_name)

    def edge_rows(
        self, *, since: Any, upto: Any, nulls: bool, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> Iterator[list[tuple]]:
        """Rows of every partition with a cursor in ``[since, upto]`` or, when ``nulls``, NULL."""
        cursor = self._cursor()
        where, params = edge_where(_name(cursor), self._marker(cursor), since, upto, nulls)
        if not where:
            return iter(())
        select = ", ".join(_value(column) for column in self._described_columns())
        sql = f"SELECT {select} FROM {self._relation} WHERE {where}"
        return self._chunks(sql, params, chunk_rows)

    def server(self) -> tuple[str, str] | None:
        """The DSN's one host and port (libpq's default port filled in), without connecting;
        None for several hosts or a DSN that does not parse."""
        conninfo = import_driver("psycopg.conninfo", needed_by="PostgresSource")
        return _server(conninfo, self._dsn)

    def engine_login(self) -> EngineLogin | None:
        """``PostgresTable``: the DSN's one TCP host, database and login, when it names
        nothing else (an engine's client would drop ``sslmode`` or ``options``), the table
        exists and the server's text is UTF8; with whether a new session starts in UTC.
        The password stays in the returned value only: nothing here words it."""
        conninfo = import_driver("psycopg.conninfo", needed_by="PostgresSource")
        try:
            parts = conninfo.conninfo_to_dict(self._dsn)
        except Exception:  # its message may quote the DSN
            return None
        host, port = parts.get("host") or "", str(parts.get("port") or "5432")
        if set(parts) - _ENGINE_DSN_KEYS or not host or host.startswith("/") or "," in host:
            return None
        if not port.isdigit() or "," in port:
            return None
        driver = _driver()
        conn = self._open(driver)
        try:
            found = self._attempt(
                driver,
                lambda: conn.execute(
                    _ENGINE_SESSION, (self.partition_column, self._regclass)
                ).fetchone(),
            )
        finally:
            conn.close()
        if found is None or found[4] != "UTF8":
            return None
        schema, table, database, user, _, zone, exact_text, deterministic = found
        return EngineLogin(
            host=host,
            port=int(port),
            database=database,
            user=user,
            password=str(parts.get("password") or ""),
            schema=schema,
            table=table,
            utc=zone in _UTC_ZONES,
            exact_text=bool(exact_text),
            key_bytewise=bool(deterministic),
        )

    def holds_outside(
        self,
        bounds: Sequence[Mapping[str, Any]],
        limits: Mapping[str, tuple[str, str]],
        *,
        tiny: Sequence[str] = (),
    ) -> bool:
        """``PostgresTable``: one ``EXISTS`` over the partitions of ``bounds``, each column of
        ``limits`` compared in its own type (``infinity`` is above every bound, BC below,
        ``NaN`` above ``Infinity``)."""
        if not bounds or not (limits or tiny):
            return False
        wheres = [self._where(each) for each in bounds]
        within = " OR ".join(f"({where})" for where, _ in wheres)
        tests = " OR ".join(
            [f"{_name(column)} < %s OR {_name(column)} > %s" for column in limits]
            + [f"({_name(column)} <> 0 AND abs({_name(column)}) < %s)" for column in tiny]
        )
        params = [value for _, own in wheres for value in own]
        params += [edge for low_high in limits.values() for edge in low_high]
        params += [_SMALLEST_NORMAL] * len(tiny)
        sql = f"SELECT EXISTS (SELECT 1 FROM {self._relation} WHERE ({within}) AND ({tests}))"
        return bool(self._query(lambda conn: conn.execute(sql, params).fetchone()[0]))

    def bulk(self) -> PostgresSource:
        """``BulkRead``: ``write_arrow_files``, ``write_copy_file``."""
        return self

    def write_copy_file(
        self,
        bounds: Sequence[Mapping[str, Any]],
        columns: Sequence[Column],
        path: Path,
        types: Sequence[str],
    ) -> tuple[LoadFile, list[int]] | None:
        """``BulkRead``: the rows in PostgreSQL's binary ``COPY`` format, the server's bytes
        as they come, when every column's type is ``types``' (``format_type``): one bound's
        read, or ``_placed_scan``'s one scan without its place, and each bound's count from
        a ``GROUP BY`` of the same scan, both in one repeatable-read transaction (the
        attempt's snapshot when held), so the counts are the file's. None for other types,
        several bounds the placed scan does not take, or a column named as the place."""
        if [column.decltype for column in columns] != list(types):
            return None
        if any(column.name == _PLACE for column in columns):
            return None
        names = ", ".join(_name(column.name) for column in columns)
        if len(bounds) == 1:
            where, params = self._where(bounds[0])
            copy = f"SELECT {names} FROM {self._relation} WHERE {where}"
            counted = f"SELECT 0, count(*) FROM {self._relation} WHERE {where}"
            places: list[int | None] = [0]
            null_partition = None
            copy_params = count_params = params
        else:
            found = self._placed_scan(bounds, select=names)
            if found is None:
                return None
            sql, params, places, null_partition = found
            wanted = [place for place, index in enumerate(places) if index is not None]
            keep = f"{_PLACE} = ANY(%s::int[])"
            keep = f"({keep} OR {_PLACE} IS NULL)" if null_partition is not None else keep
            copy = f"SELECT {names} FROM ({sql}) AS dpone_rows WHERE {keep}"
            counted = f"SELECT {_PLACE}, count(*) FROM ({sql}) AS dpone_rows GROUP BY 1"
            copy_params, count_params = [*params, wanted], params

        def work(conn: Any) -> tuple[LoadFile, list[int]]:
            counts = [0] * len(bounds)
            for place, rows in conn.execute(counted, count_params):
                index = null_partition if place is None else places[place]
                if index is not None:
                    counts[index] += rows
            statement = f"COPY ({copy}) TO STDOUT (FORMAT binary)"
            with create_private(path) as handle, conn.cursor().copy(statement, copy_params) as out:
                written = DigestWriter(handle)
                for block in out:
                    written.write(block)
            return LoadFile(path=path, rows=sum(counts), sha256=written.sha256, native=True), counts

        try:
            return self._repeatable(work)
        except BaseException:
            _remove([path])
            raise

    def write_arrow_files(
        self, bounds: Sequence[Mapping[str, Any]], columns: Sequence[Column], paths: Sequence[Path]
    ) -> tuple[list[LoadFile], list[int]] | None:
        """``BulkRead``: the partitions in one ``COPY`` of ``_placed_scan``'s scan where it
        takes them, else a ``COPY`` of each one's read, in the attempt's snapshot (one
        repeatable-read transaction without one), as CSV that pyarrow converts in C
        (``postgres_bulk``). With ``parallel`` above 1, over that many connections at once,
        each importing the snapshot (``_parallel_reads``). None, with no file left, for a
        column kind without an exact Arrow type or a value that does not fit its type."""
        pa = arrow("PostgresSource")
        found = self._placed_scan(bounds) if len(bounds) > 1 else None
        schema = arrow_schema(pa, columns, placed=found is not None)
        if schema is None or len(paths) not in (1, len(bounds)):
            return None
        if found is not None:
            sql, params, places, null_partition = found
            lookup = pa.array([*places, null_partition], pa.int32())
            reads: list[tuple[str, list[Any], Any]] = [(sql, params, lookup)]
        else:
            reads = [(*self._select(columns, each), i) for i, each in enumerate(bounds)]
        files_schema = schema.remove(len(columns)) if found is not None else schema
        try:
            with contextlib.ExitStack() as stack:
                if self.parallel > 1:
                    stack.enter_context(self.snapshot())  # held already within an attempt
                parts = [
                    self._copied(pa, part, schema, len(columns))
                    for part in self._parallel_reads(reads)
                ]
                for part in parts:  # after read_together joined its threads: each part's
                    stack.callback(part.close)  # connection given back now, not when collected
                batches = stack.enter_context(read_together(parts))
                return write_tagged_batches(pa, files_schema, batches, paths, len(bounds))
        except Inexact:
            pass
        except BaseException:
            _remove(paths)
            raise
        _remove(paths)
        return None

    def _repeatable(self, work: Callable[[Any], _T]) -> _T:
        """``work(conn)`` in one repeatable-read transaction, every statement in one snapshot
        (the attempt's when it holds one); the connection is given back after."""
        driver = _driver()
        conn = self._started(driver, repeatable=True)
        try:
            return self._attempt(driver, lambda: work(conn))
        finally:
            postgres_release(conn, self._dsn)

    def _parallel_reads(
        self, reads: list[tuple[str, list[Any], Any]]
    ) -> list[list[tuple[str, list[Any], Any]]]:
        """``reads`` split among ``parallel`` connections: one scan cut into as many ranges of
        the table's blocks (``ctid``, a TID range scan from PostgreSQL 14 on: each reads its
        own blocks), or the partitions' reads dealt out. One part when ``parallel`` is 1, or
        the server is older than 14 (each part would scan the whole table)."""
        count = self.parallel
        if count < 2:
            return [reads]
        if len(reads) > 1:
            return [part for part in (reads[n::count] for n in range(count)) if part]

        def blocks(conn: Any) -> tuple[int, int]:
            size = "SELECT pg_relation_size(to_regclass(%s)) / current_setting('block_size')::int"
            found = conn.execute(size, (self._regclass,)).fetchone()[0]
            return int(conn.info.server_version), int(found)

        version, total = self._query(blocks)
        if version < 140000 or total < count:
            return [reads]
        (sql, params, tag), step = reads[0], -(-total // count)
        parts = []
        for number in range(count):
            low, high = number * step, (number + 1) * step
            within = f"{sql} AND ctid >= '({low},0)'::tid"
            within += f" AND ctid < '({high},0)'::tid" if number < count - 1 else ""
            parts.append([(within, params, tag)])
        return parts

    def _copied(
        self, pa: Any, reads: list[tuple[str, list[Any], Any]], schema: Any, width: int
    ) -> Generator[tuple[Any, Any], None, None]:
        """The ``(tags, batch)`` pairs of ``reads``' COPYs, on one connection of its own (one
        the run kept, when it keeps them) in one repeatable-read transaction (in the
        attempt's snapshot when one is held); a driver error is ``SourceInvalid``, as every
        read's. Stopped early, the COPY's read ends (its thread joined) before the
        connection is given back, and so closed."""
        driver = _driver()
        conn = self._started(driver, repeatable=True)
        try:
            for sql, params, tag in reads:
                with contextlib.closing(copy_batches(pa, conn, sql, params, schema)) as batches:
                    taken = partial(next, batches, None)
                    while (batch := self._attempt(driver, taken)) is not None:
                        yield _tags(pa, batch, tag, width)
        finally:
            postgres_release(conn, self._dsn)  # closed unless every COPY ended

    def count(self, bounds: Mapping) -> int:
        where, params = self._where(bounds)
        sql = f"SELECT count(*) FROM {self._relation} WHERE {where}"
        return self._query(lambda conn: conn.execute(sql, params).fetchone()[0])


@attrs.frozen
class _KeyType:
    """The partition column's type: ``name`` as SQL text by its catalog name (no type modifier,
    so an edge is not rounded or cut as ``numeric(6,2)`` or ``character`` would), ``oid``;
    ``placeable`` when ``width_bucket`` places it as ``>=`` and ``=`` compare it (the column
    and its type in the database's default collation or in none, and a fixed length its
    alignment divides: ``width_bucket`` steps a ``timetz`` or ``macaddr`` array by the length,
    misplacing rows); ``deterministic`` when values it holds equal are equal byte for byte."""

    name: str
    oid: int
    placeable: bool
    deterministic: bool


_KEY_TYPE = """SELECT quote_ident(n.nspname) || '.' || quote_ident(t.typname), t.oid,
        a.attcollation IN (0, 100) AND t.typcollation IN (0, 100) AND (t.typlen < 0
            OR t.typlen %% CASE t.typalign WHEN 'd' THEN 8 WHEN 'i' THEN 4 WHEN 's' THEN 2
                ELSE 1 END = 0),
        coalesce(c.collisdeterministic, true)
    FROM pg_catalog.pg_attribute a
    JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
    JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace
    LEFT JOIN pg_catalog.pg_collation c ON c.oid = a.attcollation
    WHERE a.attrelid = to_regclass(%s) AND a.attname = %s"""


def _compared_as_key(conn: Any, edges: list[Any], key_oid: int) -> bool:
    """Whether the driver's array of ``edges`` holds the key's own type, or integers with an
    integer or numeric key: where ``>=`` and ``width_bucket`` compare an edge alike. (A double
    edge of a ``real`` key, or an integer one: ``>=`` and ``width_bucket`` compare in
    different types, and 16777217 or 0.9 fell in another range.)"""
    sql = "SELECT typelem FROM pg_catalog.pg_type WHERE oid = pg_typeof(%s)::oid"
    edge = conn.execute(sql, [edges]).fetchone()[0]
    return bool(edge == key_oid or (edge in _INTEGERS and key_oid in _INTEGERS | {_NUMERIC}))


def _cost(conn: Any, sql: str, params: Sequence[Any]) -> float:
    """The planner's total cost of ``sql`` (``EXPLAIN``; nothing runs)."""
    plan = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", params).fetchone()[0]
    return float(plan[0]["Plan"]["Total Cost"])


def _walked_cuts(conn: Any, sql: str, params: Sequence[Any], rows: int) -> list[Any]:
    """``range_cuts_sql``'s cuts (the key of every ``rows``-th row but the first, in key
    order) by walking a cursor of ``sql`` (the keys in order) ``rows`` at a time: the
    server skips rows in its scan, several times faster than numbering each row with a
    window function (0.04 s against 0.27 s for a million keys by their index). ``rows``
    1 cuts nowhere, as there (no row number is 1 more than a multiple of 1)."""
    cuts: list[Any] = []
    if rows < 2:
        return cuts
    with conn.cursor(name="dpone_cuts") as walk:
        walk.execute(sql, params)
        walk.scroll(rows)
        while (found := walk.fetchone()) is not None:
            cuts.append(found[0])
            walk.scroll(rows - 1)
    return cuts


def _routed(chunks: Iterable[list[tuple]]) -> Iterator[tuple[int, list[tuple]]]:
    """Each chunk's rows grouped by the partition index the server put last in every row."""
    for chunk in chunks:
        groups: dict[int, list[tuple]] = {}
        for row in chunk:
            groups.setdefault(row[-1], []).append(row[:-1])
        yield from groups.items()


def _tags(pa: Any, batch: Any, tag: Any, width: int) -> tuple[Any, Any]:
    """``(tags, rows)`` of a batch of a bulk read: ``tag`` a bound's index for every row, or
    the lookup from a placed scan's place (its last field) to the bound's index, rows of no
    bound's place dropped."""
    if isinstance(tag, int):
        return pa.array([tag] * batch.num_rows, pa.int32()), batch
    compute = import_driver("pyarrow.compute", needed_by="PostgresSource")
    place = batch.column(width)
    if place.null_count:  # NULL: the NULL key's place, the lookup's last
        place = compute.fill_null(place, len(tag) - 1)
    tags = compute.take(tag, place)
    rows = batch.select(range(width))
    if tags.null_count:
        kept = compute.is_valid(tags)
        tags, rows = tags.filter(kept), rows.filter(kept)
    return tags, rows


def _remove(paths: Sequence[Path]) -> None:
    for path in paths:  # a read that gave up leaves nothing behind
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def _server(conninfo: Any, dsn: str) -> tuple[str, str] | None:
    """``(host, port)`` of a DSN naming one host (``PostgresSource.server``)."""
    try:
        parts = conninfo.conninfo_to_dict(dsn)
    except Exception:  # its message may quote the DSN
        return None
    host, port = str(parts.get("host") or ""), str(parts.get("port") or "5432")
    return None if "," in host + port else (host, port)


def _session(conn: Any) -> Any:
    """Start the transaction in UTC and ISO dates, so every text value has one spelling."""
    conn.execute(_SESSION)
    return conn


# The primary key's columns of a table, in key order.
_PRIMARY_KEY = (
    "SELECT a.attname FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY"
    " AS k(attnum, n) JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
    " WHERE i.indrelid = to_regclass(%s) AND i.indisprimary ORDER BY k.n"
)
