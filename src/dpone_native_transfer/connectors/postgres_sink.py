"""PostgreSQL sink: one table of a PostgreSQL database, loaded on all four transfer paths.

``dsn`` takes the forms ``PostgresSource`` takes (a ``postgresql://`` URL or
``env:NAME``). ``table`` is ``name`` or ``schema.name`` (``_sql.parse_table``:
a part holding a dot is quoted); a name without a schema is in ``public``,
never looked up through ``search_path``, so the route identity names the
table that is written. Names are case-sensitive: they are always quoted.

Every call opens its own connection and closes it before returning; every
load is one transaction, in a UTC, ISO session, and writes its ledger row
(``_dpone_ledger``, in the target's schema) in that same transaction. Rows
arrive by ``COPY ... FROM STDIN`` (psycopg's ``write_row``, in binary where the kinds
allow), each value carried exactly by its column's kind (:func:`postgres_carrier`). A lazy plan
is pulled by the server itself (``INSERT ... SELECT``) from a PostgreSQL
source in the same database, or, through the ``dblink`` extension, from
another database of the same server (``_Dblink``); any other plan is refused
before the target.

Errors raised here name tables only, never the DSN, a password, SQL or the
driver's text. Driver errors inside the target call (``load``,
``finalize_staged_load``) propagate unchanged, as the Sink contract asks;
outside it they become ``TargetUnavailable`` with nothing chained, or
``TargetAccessRefused`` (exit 2) when the server refused the login, has no such
database, or the login lacks a privilege (``drivers.ServerFailure``). A
connection that cannot be opened is one of those two, inside the call too.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from ..artifacts import DigestReader
from ..column_types import (
    ENGINE_CARRIERS,
    Carry,
    Passing,
    decimal_text,
    exact_decimal,
    exact_text,
    postgres_date,
    postgres_timestamp,
    postgres_timestamptz,
    without_nul,
)
from ..drivers import (
    ServerFailure,
    holding_connections,
    import_driver,
    postgres_begin,
    postgres_failure,
    postgres_release,
)
from ..errors import (
    ConfigInvalid,
    NativeTransferError,
    TargetAccessRefused,
    TargetBusy,
    TargetPrivilegeRefused,
    TargetRolledBack,
    TargetRowsMismatch,
    TargetUnavailable,
    with_driver_error,
)
from ..identity import TableIdentity, server_location
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
from ..payloads import Column, LoadFile, LoadFiles, LoadPlan, Merge, RowChunks
from ..rejects import REJECTS_TABLE, rejects_query, rejects_table_sql, write_rejects
from ._arrow import arrow, check_widths, csv_blocks
from ._merge import (
    INEXACT_TYPE,
    LOOSE_KEY,
    LOOSE_VERSION,
    MERGE_BATCH,
    MERGE_WINNERS,
    NARROWER,
    inexactly_held,
    key_constraint,
    loosely_compared_key,
    loosely_ordered_version,
    merge_into_statements,
    merge_statements,
    narrower_unique,
    refuse_text_compared,
    unmergeable,
    upsert_statements,
)
from ._sql import (
    OWN_TABLES,
    RESERVED_PREFIX,
    STAGE_PREFIX,
    ColumnDifference,
    TableName,
    before_commit,
    check_target_table,
    difference,
    load_failures,
    own_name_taken,
    parse_table,
    quote,
    refuse_reserved_prefix,
    refuse_reserved_schema,
    unavailable,
    unwritable,
)
from .contract import Sink, SinkFeatures, Unsupported
from .contract.engine import EnginePull
from .contract.postgres_table import EngineLogin
from .postgres import _NATIVE, _SESSION, PostgresSource, _name, _resolve_dsn, _server

__all__ = ["POSTGRES_TYPES", "PostgresSink", "postgres_carrier", "postgres_type"]

_T = TypeVar("_T")

POSTGRES_TYPES = {
    "integer": "bigint",
    "real": "double precision",
    "text": "text",
    "blob": "bytea",
    "any": "text",
    "boolean": "boolean",
    "date": "date",
    "time": "time without time zone",
    "timestamp": "timestamp without time zone",
    "timestamptz": "timestamp with time zone",
    "interval": "interval",
    "numeric": "double precision",
    "decimal": "numeric",
}
"""The PostgreSQL type of each column kind (``column_types.py``), spelled as ``format_type()``
spells it. ``numeric`` and ``decimal`` become ``numeric(p,s)`` when the source declares a
precision (at most 1000): see :func:`postgres_type`."""

DEFAULT_SCHEMA = "public"
_RESERVED_SCHEMAS = ("pg_catalog", "information_schema", "pg_toast", "pg_temp")
_MAX_DECIMAL_WIDTH = 1000
COPY_SUFFIX = ".pgcopy"  # a file in PostgreSQL's binary COPY format (``copy_types``)
_COPY_BLOCK = 1 << 20
_MAX_NAME_BYTES = 63  # PostgreSQL cuts a longer identifier silently (NAMEDATALEN - 1)
# Types narrower than the ones dpone makes: a target column of one cannot take every value.
_NARROW = frozenset({"smallint", "integer", "real"})

_CARRIERS: dict[str, Carry] = {
    **ENGINE_CARRIERS,
    "text": without_nul(exact_text),
    "any": without_nul(exact_text),
    "interval": without_nul(exact_text),
    "decimal": decimal_text,
    "date": postgres_date,  # BC and year 10000 on included
    "timestamp": postgres_timestamp,
    "timestamptz": postgres_timestamptz,  # never the worker's time zone
}

# A table's columns by its exact schema and name (never to_regclass(), which fails in a
# schema the login may not use: such a table reads as missing, and check_target says why).
_COLUMNS = """SELECT a.attname, format_type(a.atttypid, a.atttypmod)
    FROM pg_catalog.pg_attribute a
    JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum"""
# Whether a table exists, found as ``_COLUMNS`` finds it without reading its columns: a round
# trip of 0.35 ms, not 0.55, and a staged load's transaction asks up to four times.
_EXISTS = """SELECT EXISTS (SELECT FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s)"""
# Which of some names are tables of a schema, found as ``_EXISTS`` finds one.
_EXISTING = """SELECT c.relname FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = ANY(%s)"""
# A table's primary key and unique indexes, each its column names (an expression: NULL).
_UNIQUES = """SELECT array_agg(a.attname ORDER BY k.n) FROM pg_index i
    CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
    LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indrelid = to_regclass(%s) AND i.indisunique GROUP BY i.indexrelid"""
# The unique indexes an ON CONFLICT on their columns can use (``_arbiter``); an expression's
# column (attnum 0) makes a NULL name, which matches no key.
_ARBITERS = """SELECT array_agg(a.attname ORDER BY k.n) FROM pg_index i
    CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
    LEFT JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
    WHERE i.indrelid = to_regclass(%s) AND i.indisunique AND i.indimmediate AND i.indisvalid
    AND i.indpred IS NULL GROUP BY i.indexrelid"""
# The columns an insert must fill: no NULL, no default, not an identity or generated column.
_REQUIRED = """SELECT a.attname FROM pg_catalog.pg_attribute a
    JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
    AND a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = ''"""
# Whether a column's type is ordered by a collation.
_COLLATABLE = """SELECT a.attname FROM pg_attribute a
    WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND a.attcollation <> 0
    AND NOT a.attisdropped"""
# Whether the login may read and delete a table's rows, as a merge does.
_MERGEABLE = "SELECT has_table_privilege(%s, 'SELECT') AND has_table_privilege(%s, 'DELETE')"
# Enabled user triggers on an INSERT, UPDATE or DELETE of the table (tgtype bits 4, 16, 8),
# before or after: an append counts the table around an AFTER trigger, but a merge replaces
# and deletes rows, so no count says what a trigger deleted or rewrote (exit 0, rows lost).
_ROW_TRIGGERS = """SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = to_regclass(%s)
    AND NOT t.tgisinternal AND t.tgenabled <> 'D' AND t.tgtype & 28 <> 0"""
_TRIGGERED = (
    "it has a trigger on inserts, updates or deletes, which may delete or rewrite rows the "
    "merge wrote where no count can tell"
)
# Whether the login may write a table: INSERT on it, or CREATE where it would be created.
# USAGE on its schema is asked first: to_regclass() fails in a schema the login cannot use.
_WRITABLE = """SELECT CASE
    WHEN to_regnamespace(%(schema)s) IS NULL
        THEN has_database_privilege(current_database(), 'CREATE')
    WHEN NOT has_schema_privilege(to_regnamespace(%(schema)s), 'USAGE') THEN false
    WHEN to_regclass(%(table)s) IS NOT NULL
        THEN has_table_privilege(to_regclass(%(table)s), 'INSERT')
    ELSE has_schema_privilege(to_regnamespace(%(schema)s), 'CREATE') END,
    pg_catalog.pg_is_in_recovery()"""
# Whether the login may write the schema's ledger and fence where they exist, as a load does
# in its transaction (INSERT into the ledger; the fence's upsert INSERTs or UPDATEs): without,
# the load failed inside the target call, and the route was blocked.
_LEDGER_WRITABLE = """SELECT
    (to_regclass(%(ledger)s) IS NULL OR (has_table_privilege(to_regclass(%(ledger)s), 'SELECT')
        AND has_table_privilege(to_regclass(%(ledger)s), 'INSERT')))
    AND (to_regclass(%(fence)s) IS NULL OR (has_table_privilege(to_regclass(%(fence)s), 'SELECT')
        AND has_table_privilege(to_regclass(%(fence)s), 'INSERT')
        AND has_table_privilege(to_regclass(%(fence)s), 'UPDATE')))"""
# What may change the rows a load hands the target, found before the target call: enabled user
# triggers that run BEFORE or INSTEAD OF (tgtype bits 2, 64) an INSERT, DELETE or TRUNCATE
# (bits 4, 8, 32), rules, a relation that is not a table, or row-level security that applies
# to the login (a refresh's or a merge's DELETE leaves the rows its policies hide, exit 0
# with them twice; COPY refuses such a table). No row: no table yet.
_REWRITING = """SELECT
    (SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal
        AND t.tgenabled <> 'D' AND t.tgtype & 44 <> 0 AND t.tgtype & 66 <> 0)
    + (SELECT count(*) FROM pg_rewrite r WHERE r.ev_class = c.oid AND r.rulename <> '_RETURN')
    + CASE WHEN c.relkind IN ('r', 'p') THEN 0 ELSE 1 END
    + CASE WHEN row_security_active(c.oid) THEN 1 ELSE 0 END
    FROM pg_class c WHERE c.oid = to_regclass(%(table)s)"""
# dpone's own tables' names in the schema held by a view, an index, a sequence... (one name).
_OWN_NAME_TAKEN = """SELECT min(c.relname) FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema_name)s AND c.relname = ANY(%(own)s) AND c.relkind <> 'r'"""
# ``check_target``'s answers once ``_WRITABLE`` said yes (so the login may use the schema), in
# one round trip: PostgreSQL runs a query's scalar subqueries whatever branch asks for them.
_OWN_AND_REWRITING = f"SELECT ({_LEDGER_WRITABLE}), ({_REWRITING}), ({_OWN_NAME_TAKEN})"
# Enabled user triggers that run AFTER an INSERT or DELETE of the table: they cannot change the
# rows handed to it, but may add or delete others, so a load with them counts the table.
_AFTER_TRIGGERS = """SELECT count(*) FROM pg_trigger t WHERE t.tgrelid = to_regclass(%s)
    AND NOT t.tgisinternal AND t.tgenabled <> 'D' AND t.tgtype & 12 <> 0
    AND t.tgtype & 66 = 0"""
# Whether the login may read a lazy plan's source table, and whether that is the target itself.
# The schema of the dblink extension in the target database, when its login may run it.
_DBLINK = """WITH found AS MATERIALIZED (
        SELECT quote_ident(n.nspname) AS name FROM pg_catalog.pg_extension e
        JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'dblink')
    SELECT name FROM found
    WHERE has_function_privilege(name || '.dblink(text, text)', 'EXECUTE')
        AND has_function_privilege(name || '.dblink_connect(text, text)', 'EXECUTE')"""
# A session dblink opens reads as ``PostgresSource`` reads: one snapshot, UTC, ISO, exact floats.
_DBLINK_SESSION = (
    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
    "SET TimeZone = 'UTC'",
    "SET DateStyle = 'ISO, YMD'",
    "SET extra_float_digits = 1",
)
_DBLINK_NAME = "dpone_pull"
_MOST_PARAMETERS = 65_535  # one statement's parameters: the protocol counts them in 16 bits


class _Dblink:
    """A pull from another database of the server through the ``dblink`` extension (in
    ``schema``): one connection of the source's login for the load, in one repeatable-read
    snapshot of the source database, each partition's ``SELECT`` (the source's own, as
    ``read`` gives it) read through ``dblink()`` and typed as the source's columns. The
    connection string (the password in it) is a bound parameter, never SQL text: it is in
    no statement the server shows or logs, except where the server logs parameters
    (``log_statement`` with ``log_parameter_max_length``, docs/connectors.md)."""

    def __init__(self, schema: str, login: EngineLogin) -> None:
        self.schema = schema.replace("%", "%%")  # quoted already; psycopg reads % marks
        self._login = login

    def __repr__(self) -> str:
        return "_Dblink()"

    @contextlib.contextmanager
    def connected(self, conn: Any, table: str) -> Iterator[None]:
        login = self._login
        parts = {
            "host": login.host,
            "port": str(login.port),
            "dbname": login.database,
            "user": login.user,
            "password": login.password,
        }
        text = " ".join(f"{key}={_conninfo_value(value)}" for key, value in parts.items())
        try:
            _run_query(conn, f"SELECT {self.schema}.dblink_connect(%s, %s)", _DBLINK_NAME, text)
        except _driver().Error:
            pass  # its text may name the login: not chained
        else:
            text = ""
        if text:  # inside the load's transaction, before its COMMIT: rolled back
            raise TargetRolledBack(
                f"the target database of table {table!r} could not open the source's "
                "database through dblink (its login, password or privileges); the load was "
                "rolled back and nothing was applied",
                diagnostics={"table": table},
            )
        try:
            for statement in _DBLINK_SESSION:
                _run_query(
                    conn, f"SELECT {self.schema}.dblink_exec(%s, %s)", _DBLINK_NAME, statement
                )
            yield
        finally:
            with contextlib.suppress(Exception):
                _run_query(conn, f"SELECT {self.schema}.dblink_disconnect(%s)", _DBLINK_NAME)

    def read(
        self, conn: Any, select: str, params: Sequence[Any], columns: Sequence[Column]
    ) -> tuple[str, list[Any]]:
        """``FROM`` text reading ``select`` through the connection, and its parameters (the
        connection's name, the query with its values in it); each column typed as the
        source's select gives it (its own type, or text), aliased ``c0``, ``c1``..."""
        client = import_driver("psycopg", needed_by="PostgresSink").ClientCursor(conn)
        query = client.mogrify(select, list(params))
        types = ", ".join(
            f"c{i} {c.decltype if c.decltype.split('(')[0].strip() in _NATIVE else 'text'}"
            for i, c in enumerate(columns)
        )
        return f"{self.schema}.dblink(%s, %s) AS dpone_rows ({types})", [_DBLINK_NAME, query]


def _conninfo_value(value: str) -> str:
    """A libpq connection string's value, quoted (``'`` and ``\\`` escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


_PULLABLE = """SELECT coalesce(has_table_privilege(to_regclass(%s), 'SELECT'), false),
    coalesce(to_regclass(%s) = to_regclass(%s), false)"""


def postgres_type(column: Column) -> str:
    """The PostgreSQL type a target column gets; built from fixed names, never from source text."""
    decimal = column.decimal(_MAX_DECIMAL_WIDTH)
    if decimal is not None:
        return f"numeric({decimal[0]},{decimal[1]})"
    return POSTGRES_TYPES[column.kind]


def postgres_carrier(column: Column) -> Carry | None:
    """How a value of ``column`` reaches PostgreSQL exactly (``Sink.carrier``)."""
    decimal = column.decimal(_MAX_DECIMAL_WIDTH)
    if decimal is not None:
        return _or_nan(exact_decimal(*decimal))
    return _CARRIERS.get(column.kind)


def _or_nan(carry: Passing) -> Passing:
    """``carry``, and PostgreSQL's ``NaN``, which its ``numeric(p,s)`` holds (an infinity it
    does not): the row paths refused a PostgreSQL source's NaN that lazy-plan loaded."""

    def convert(value: Any) -> Any:
        return value if value == "NaN" else carry.convert(value)

    return Passing(convert, carry.unchanged, carry.in_bulk)


def _failure_code(error: Any) -> str:
    """A driver error's code for a message: its SQLSTATE, which a lost connection has not."""
    return f"SQLSTATE {error.sqlstate}" if error.sqlstate else "the connection was lost"


def _driver() -> Any:
    return import_driver("psycopg", needed_by="PostgresSink")


def _holds_exactly(column: Column, target_type: str) -> bool:
    """Whether a merge's key or cursor column of ``target_type`` keeps each source value as
    it is: the type dpone makes or the source's own, a whole number for an integer, any
    varchar for text (a value too big or too long fails the load; none is rounded or cut).
    ``name`` cuts at 63 bytes, ``timestamp(0)`` and ``numeric(p,s)`` round, ``real`` too."""
    if target_type in (postgres_type(column), column.decltype):
        return True
    if column.kind in ("integer", "decimal") and target_type == "numeric":
        return True  # every value fits
    if column.kind == "integer":
        return (
            target_type in _WHOLE_TYPES
            or re.fullmatch(r"numeric\(\d+,0\)", target_type) is not None
        )
    return column.kind == "text" and target_type.startswith("character varying")


_WHOLE_TYPES = frozenset({"bigint", "integer", "smallint"})


def _whole(target_type: str) -> bool:
    """A ``numeric(p,0)`` that holds every bigint (p >= 19)."""
    found = re.fullmatch(r"numeric\((\d+),0\)", target_type)
    return found is not None and int(found.group(1)) >= 19


def _base(decltype: Any) -> str:
    return decltype.split("(")[0].strip() if isinstance(decltype, str) else ""


class PostgresSink(Sink, EnginePull):
    """Writes one target table of a PostgreSQL database, each load in a single transaction,
    with its ledger row (and fence, rejects) in that transaction. The server pulls a source
    table of its own database itself (``INSERT ... SELECT``)."""

    # the server may still run an insert whose client is gone
    features = SinkFeatures(name="PostgreSQL", inserts_end_with_their_process=False, merges=True)
    reads_bulk_files = True  # a source's Arrow files, as CSV its COPY reads exactly

    def __init__(self, dsn: str, table: str) -> None:
        check_target_table(table)
        parsed = parse_table(table)
        self._target = TableName(parsed.schema or DEFAULT_SCHEMA, parsed.name)
        refuse_reserved_schema(self._target, _RESERVED_SCHEMAS, engine="PostgreSQL")
        refuse_reserved_prefix(self._target.schema or "", "pg_", engine="PostgreSQL", part="schema")
        parts = (self._target.schema or "", self._stage.name)
        if max(len(part.encode("utf-8")) for part in parts) > _MAX_NAME_BYTES:
            raise ConfigInvalid(
                f"target table {table!r} or its staging table {self._stage.name!r} has a name "
                f"longer than PostgreSQL keeps ({_MAX_NAME_BYTES} bytes); choose a shorter name",
                diagnostics={"key": "target.table"},
            )
        self._dsn = _resolve_dsn(dsn, role="target")
        self.table = table
        self._checked: LoadPlan | None = None  # the last plan check_plan passed
        self._staged: int | None = None  # the rows ``stage`` counted, until read once
        self._dblinked: _Dblink | None = None  # its pull through dblink, from another database
        self.identity()  # a DSN that cannot be parsed is refused now, before any run

    def __repr__(self) -> str:
        return f"PostgresSink(table={self.table!r})"

    def identity(self) -> TableIdentity:
        """Host, port and database of the DSN (no user or password); names case-sensitive."""
        location = server_location("postgres", self._dsn, default_port=5432, default_database=None)
        return TableIdentity(location, self._target.canonical(fold=False))

    @property
    def _stage(self) -> TableName:
        return self._target.sibling(STAGE_PREFIX)

    @property
    def _ledger_table(self) -> TableName:
        return TableName(self._target.schema, LEDGER_TABLE)

    # --- connections ------------------------------------------------------------------------

    @contextlib.contextmanager
    def holding_connection(self) -> Iterator[None]:
        """The attempt's calls share their connections (``drivers.holding_connections``): one
        given back is kept for the next call and all are closed when the attempt ends (a run
        made six connects, 0.02-0.03 s each). A kept connection is an idle session between two
        calls, holding no transaction and no lock; the target call has a transaction of its
        own."""
        with holding_connections():
            yield

    @contextlib.contextmanager
    def _transaction(self, *, read_only: bool = False) -> Iterator[Any]:
        """A connection in one transaction (UTC, ISO dates), committed when the block ends;
        any exception, even a BaseException, rolls it back and is re-raised unchanged."""
        # READ WRITE said, as psycopg said it: a login's default_transaction_read_only does
        # not make a load's transaction read-only
        driver, begin = _driver(), "BEGIN READ ONLY" if read_only else "BEGIN READ WRITE"
        with before_commit(driver.Error):  # the server cannot commit without it
            conn = postgres_begin(
                driver, self._dsn, begin, _SESSION, what="PostgreSQL target", failed=self._failed
            )
        try:
            with before_commit(driver.Error):
                yield conn
            conn.commit()
        except BaseException:
            with contextlib.suppress(Exception):
                conn.rollback()
            raise
        finally:
            postgres_release(conn, self._dsn)

    def _outside_call(
        self, work: Callable[[Any], _T], *, read_only: bool = True, to: str = "be read"
    ) -> _T:
        """``work(conn)`` in a transaction of its own, outside the target call: a driver error
        becomes ``TargetUnavailable``, with nothing chained (its text may hold SQL or values)."""
        driver = _driver()
        try:
            with self._transaction(read_only=read_only) as conn:
                return work(conn)
        except driver.Error as exc:
            failure = postgres_failure(driver, exc)
        if failure is not None:
            raise self._failed(failure)
        raise unavailable(self.table, to=to)

    def _failed(self, failure: ServerFailure) -> NativeTransferError:
        """``TargetUnavailable`` (exit 1), or ``TargetAccessRefused`` (exit 2) when the server
        refused the login, has no such database, or the login lacks a privilege."""
        return failure.error(
            f"the target database of table {self.table!r} cannot be used",
            retry=TargetUnavailable,
            refused=TargetAccessRefused,
            diagnostics={"table": self.table},
            fix="fix the target DSN (its user, password, database or options)"
            " or the login's privileges or settings",
        )

    def check_target(self) -> None:
        """Before the target call: the server answers, the login is accepted, the server is not
        a standby (``read_only``, exit 2), and the login may write the target table (INSERT on
        it, or CREATE where it will be created)."""

        def writable(conn: Any) -> tuple[bool | None, int, str | None]:
            names = {
                "table": self._target.sql(),
                "schema": quote(self._target.schema),
                "ledger": self._ledger_table.sql(),
                "fence": TableName(self._target.schema, FENCE_TABLE).sql(),
                "schema_name": self._target.schema,
                "own": list(OWN_TABLES),
            }
            allowed, standby = conn.execute(_WRITABLE, names).fetchone()
            if standby or not allowed:
                return None if standby else False, 0, None
            own, rewriting, taken = conn.execute(_OWN_AND_REWRITING, names).fetchone()
            return bool(own), (rewriting or 0) if own else 0, taken

        allowed, rewriting, taken = self._outside_call(writable, to="be reached")
        if allowed is None:  # BEGIN READ WRITE fails there, not as read-only (25006) but 0A000
            raise self._failed(ServerFailure("read_only"))
        if taken is not None:
            raise own_name_taken(self.table, taken)
        if not allowed:
            raise ConfigInvalid(
                f"the login of target table {self.table!r} may not write it (it needs INSERT on "
                "the table, or CREATE on the schema to create it, and where they exist, read "
                "and INSERT rights on the schema's _dpone_ledger and _dpone_fence, and UPDATE "
                "on the fence); nothing was written",
                diagnostics={"table": self.table},
            )
        if rewriting:
            raise TargetRowsMismatch.rewriting(self.table, rewriting)

    def check_merge(self, merge: Merge, columns: Sequence[Column]) -> None:
        """A merge also reads and deletes the table's rows (an append only inserts), joins
        them on the key with the batch's types (a hand-made type may have no ``=`` with
        them), and a unique index on part of the key, or a key compared more loosely than
        the batch's (a nondeterministic collation, ``citext``, ``char(n)``), would meet two
        batch keys as one. Each failed inside the target call, or merged wrongly. A key or
        cursor kept as text, or ``citext``, is refused whatever the table
        (``refuse_text_compared``)."""
        refuse_text_compared(
            merge, columns, kept_as_text=lambda c: postgres_type(c) == "text", target="PostgreSQL"
        )
        driver = _driver()

        def problem(conn: Any) -> tuple[str, str | None] | None:
            if not _exists(conn, self._target):
                return None
            if not conn.execute(_MERGEABLE, [self._target.sql()] * 2).fetchone()[0]:
                return "the login may not read and delete its rows (SELECT, DELETE)", None
            if conn.execute(_ROW_TRIGGERS, [self._target.sql()]).fetchone()[0]:
                return _TRIGGERED, None
            uniques = [names for (names,) in conn.execute(_UNIQUES, [self._target.sql()])]
            if narrower_unique(uniques, merge):
                return NARROWER, None
            table = self._target.sql(_name)

            def count(sql: str) -> int:
                with conn.transaction():  # a savepoint: a refused probe leaves the rest
                    return int(conn.execute(sql).fetchone()[0])

            for column in columns:
                if column.name not in merge.key:
                    continue
                try:
                    count(
                        f"SELECT count(*) FROM {table} AS t WHERE 1 = 0"
                        f" AND t.{_name(column.name)} = CAST(NULL AS {postgres_type(column)})"
                    )
                except driver.Error:
                    return "a key column's type has no equality with the source's", column.name
            loose = loosely_compared_key(count, table, merge, columns, name=_name)
            if loose is not None:
                return LOOSE_KEY, loose
            version = loosely_ordered_version(
                count, table, merge, columns, name=_name, collate=BYTE_ORDER
            )
            if version is not None:
                return LOOSE_VERSION, version
            held = dict(_columns(conn, self._target))
            inexact = inexactly_held(merge, columns, held, _holds_exactly)
            return None if inexact is None else (INEXACT_TYPE, inexact)

        found = self._outside_call(problem)
        if found is not None:
            raise unmergeable(self.table, found[0], column=found[1])

    # --- loads ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _refused(self) -> Iterator[None]:
        """Around a target call's transaction: a constraint (SQLSTATE class 23) or a column's
        type (class 22: a hand-made enum, varchar(n), numeric(p,s)...) refusing a row, or a
        privilege the login lacks (42501), rolled back: the server aborted the transaction
        at the statement (a COMMIT checks no privilege). Any other error before the COMMIT
        was sent (a statement timeout, the session ended) rolled it back too; one at the
        COMMIT leaves the outcome unknown and propagates unchanged. The SQLSTATE is named,
        never the server's message."""
        driver = _driver()
        refusals = (driver.IntegrityError, driver.DataError)
        with load_failures(self.table, driver.Error, refusals, _failure_code):
            try:
                yield
            except driver.errors.InsufficientPrivilege as error:
                refused = TargetPrivilegeRefused.rolled_back(self.table)
                raise with_driver_error(refused, error) from None

    def load(self, payload: RowChunks, *, ledger: LedgerEntry | None = None) -> int:
        """Write the payload in one transaction and return the rows written (``LoadFiles`` as
        rows: the spool's)."""
        with self._refused(), self._transaction() as conn:
            self._fence_first(conn, ledger)
            if payload.merge is not None:
                rows = _merge_rows(conn, self._target, payload)
                return _record(conn, self._ledger_table, ledger, rows)
            _prepare_target(conn, self._target, payload.columns, replace=payload.replace)
            counted = _applied_counter(conn, self._target, replace=payload.replace)
            rows = counted(_copy_payload(conn, self._target, payload))
            return _record(conn, self._ledger_table, ledger, rows)

    def engine(self) -> PostgresSink:
        return self

    def carrier(self, column: Column) -> Carry | None:
        return postgres_carrier(column)

    def copy_types(self, columns: Sequence[Column]) -> list[str]:
        """``EnginePull.copy_types``: the types this sink makes for ``columns``; ``[]`` when
        the target table exists with another type for one of them (the stage is made with
        the types this sink makes, a load writes the table's own: both must be these)."""
        made = [postgres_type(column) for column in columns]
        existing = dict(self._outside_call(lambda conn: _columns(conn, self._target)))
        if existing and any(existing.get(c.name) != t for c, t in zip(columns, made, strict=True)):
            return []
        return made

    def check_plan(self, plan: LoadPlan) -> None:
        """Refuse a plan this server cannot pull, before anything touches the target: a source
        that is not a PostgreSQL table of this database, one the target's login may not read,
        or the target table itself; from another database of this server, one ``dblink``
        cannot read (``_dblink``)."""
        self._dblinked = self._dblink(plan)
        if self._dblinked is not None:
            self._checked = plan
            return
        source = self._pulled(plan)
        for bounds in plan.bounds:  # bad bounds fail here, before any connection
            source.select_sql(bounds, columns=plan.columns)
        relation = source.regclass

        def pullable(conn: Any) -> tuple[bool, bool]:
            params = [relation, relation, self._target.sql()]
            readable, itself = conn.execute(_PULLABLE, params).fetchone()
            return bool(readable), bool(itself)

        readable, itself = self._outside_call(pullable)
        if itself or not readable:
            problem = "is the target table itself" if itself else "its login may not read"
            raise Unsupported(f"a pull of its source table, which {problem}", table=self.table)
        self._checked = plan  # the load of this very plan need not check it again

    def _dblink(self, plan: LoadPlan) -> _Dblink | None:
        """The plan's pull through ``dblink`` when its source is a table of another database
        of this server (None for one of this database); ``Unsupported`` naming the reason
        when it cannot be: not this server (by the DSNs' host and port), a DSN dblink
        cannot take as it is (``PostgresTable.engine_login``) or without the password
        dblink asks of a login that is not a superuser, or no ``dblink`` in the target
        database that its login may run (``CREATE EXTENSION dblink`` takes a superuser)."""
        source = plan.source
        if not isinstance(source, PostgresSource):
            return None
        if source.identity().location == self.identity().location:
            return None
        conninfo = import_driver("psycopg.conninfo", needed_by="PostgresSink")
        server = source.server()
        if server is None or server != _server(conninfo, self._dsn):
            raise Unsupported(
                "an engine that reads this source (PostgreSQL reads tables of its own "
                "database, or of another database of the same server, by the same host and "
                "port)",
                table=self.table,
            )
        schema = self._outside_call(lambda conn: _run_query(conn, _DBLINK))
        if not schema:
            raise Unsupported(
                "a pull of its source table from another database: the dblink extension is "
                "not installed in the target database, or its login may not run it (a "
                "superuser runs CREATE EXTENSION dblink)",
                table=self.table,
            )
        login = source.engine_login()
        if login is None or not login.password:
            raise Unsupported(
                "a pull of its source table from another database: its DSN names options "
                "dblink would drop, or no password, which dblink asks of a login that is not "
                "a superuser",
                table=self.table,
            )
        for bounds in plan.bounds:  # bad bounds fail here, before any connection
            source.select_sql(bounds, columns=plan.columns)
        return _Dblink(schema[0][0], login)

    def _pulled(self, plan: LoadPlan) -> PostgresSource:
        """The plan's source, when this server can pull it: a table of the same database."""
        source = plan.source
        if isinstance(source, PostgresSource):
            if source.identity().location == self.identity().location:
                return source
        raise Unsupported(
            "an engine that reads this source (PostgreSQL reads tables of its own database only)",
            table=self.table,
        )

    def load_plan(self, plan: LoadPlan, *, ledger: LedgerEntry | None = None) -> int:
        """The server copies each planned partition with ``INSERT ... SELECT``: the source's own
        select (its values as ``read`` gives them), cast to the target's types."""
        if self._checked is not plan:
            self.check_plan(plan)
        dblink = self._dblinked
        source = plan.source if dblink is not None else self._pulled(plan)
        assert isinstance(source, PostgresSource)
        names = ", ".join(_name(column.name) for column in plan.columns)
        aliases = ", ".join(f"c{index}" for index in range(len(plan.columns)))
        values = ", ".join(_pulled_value(f"c{i}", column) for i, column in enumerate(plan.columns))
        insert = f"INSERT INTO {self._target.sql(_name)} ({names}) SELECT {values} FROM"
        # one statement, one scan of the source table (a statement per partition scanned it
        # once each without an index), while its parameters fit the protocol's count
        statements = [source.select_any_sql(plan.bounds, columns=plan.columns)]
        if len(statements[0][1]) > _MOST_PARAMETERS and dblink is None:
            statements = [source.select_sql(b, columns=plan.columns) for b in plan.bounds]
        with self._refused(), self._transaction() as conn:
            self._fence_first(conn, ledger)
            _prepare_target(conn, self._target, plan.columns, replace=plan.replace)
            counted = _applied_counter(conn, self._target, replace=plan.replace)
            rows = 0
            with contextlib.ExitStack() as stack:
                if dblink is not None:
                    stack.enter_context(dblink.connected(conn, self.table))
                for select, params in statements:
                    pulled = f"({select}) AS dpone_rows ({aliases})"
                    if dblink is not None:
                        pulled, params = dblink.read(conn, select, params, plan.columns)
                    rows += _run(conn, f"{insert} {pulled}", *params)
            return _record(conn, self._ledger_table, ledger, counted(rows))

    # --- staging ----------------------------------------------------------------------------

    def stage(self, payload: RowChunks) -> int:
        """Fill a fresh staging table beside the target; the target is not touched. Its rows
        are counted in the same transaction, for the ``staged_row_count`` that follows (a
        transaction of its own was one more per load)."""
        self._staged = None

        def fill(conn: Any) -> tuple[int, int]:
            # a stage another attempt holds (one paused past its lease) is waited for a while,
            # not for ever: TargetUnavailable, retryable
            _run(conn, f"SET LOCAL lock_timeout = '{_STAGE_WAIT}'")
            _run(conn, f"DROP TABLE IF EXISTS {self._stage.sql(_name)}")
            _create_table(conn, self._stage, payload.columns, dropped=True)
            copied = _copy_payload(conn, self._stage, payload, made=True)
            return copied, _count(conn, self._stage)

        copied, self._staged = self._outside_call(fill, read_only=False, to="be written")
        return copied

    def staged_row_count(self) -> int:
        """The rows ``stage`` counted as it committed them, once; else counted now."""
        counted, self._staged = self._staged, None
        if counted is not None:
            return counted
        return self._outside_call(lambda conn: _row_count(conn, self._stage))

    def discard_stage(self) -> None:
        self._staged = None
        drop = f"DROP TABLE IF EXISTS {self._stage.sql(_name)}"
        self._outside_call(lambda conn: _run(conn, drop), read_only=False, to="be written")

    def finalize_staged_load(
        self,
        *,
        replace: bool = False,
        ledger: LedgerEntry | None = None,
        merge: Merge | None = None,
    ) -> int:
        """Move staged rows into the target (by column name) and drop the staging table, at once.

        A missing target: the staging table is renamed to it (made by the same statement as
        the target would be, beside it), instead of copying every row once more. ``merge``:
        the staged rows are merged into the target on its key (``_merge``), then dropped.
        """
        stage, target = self._stage.sql(_name), self._target.sql(_name)
        with self._refused(), self._transaction() as conn:
            self._fence_first(conn, ledger)
            staged = [name for name, _ in _columns(conn, self._stage)]
            if not staged:
                raise ConfigInvalid(
                    f"no staged load exists for target table {self.table!r}",
                    diagnostics={"table": self.table},
                )
            if merge is not None:
                moved = _count(conn, self._stage)
                _merge(conn, self._target, self._stage, staged, merge)
                return _record(conn, self._ledger_table, ledger, moved)
            if not _exists(conn, self._target):
                moved = _count(conn, self._stage)
                _run(conn, f"ALTER TABLE {stage} RENAME TO {_name(self._target.name)}")
                return _record(conn, self._ledger_table, ledger, moved)
            if replace:
                _run(conn, f"DELETE FROM {target}")
            counted = _applied_counter(conn, self._target, replace=replace)
            names = ", ".join(_name(name) for name in staged)
            moved = _run(conn, f"INSERT INTO {target} ({names}) SELECT {names} FROM {stage}")
            _run(conn, f"DROP TABLE {stage}")
            return _record(conn, self._ledger_table, ledger, counted(moved))

    # --- schema evolution -------------------------------------------------------------------

    def column_difference(self, columns: Sequence[Column]) -> ColumnDifference | None:
        """Names match exactly (always quoted). A column of a type dpone
        makes takes only a source column it would make that type for (or a wider numeric);
        a type made by hand is left to PostgreSQL's own conversion. A column an insert may
        not write is ``unwritable`` (``_unwritable``)."""
        _refuse_long_names(columns, self.table)  # before the target call: the runtime asks here

        def read(conn: Any) -> tuple[list[tuple[str, str]], list[str], list[str]]:
            required = _run_query(conn, _REQUIRED, self._target.schema, self._target.name)
            existing = _columns(conn, self._target)
            asked = [column for column in columns if column.name in dict(existing)]
            unwritable = _unwritable(conn, self._target, asked)
            return existing, [name for (name,) in required], unwritable

        existing, required, unwritable = self._outside_call(read)
        made = set(POSTGRES_TYPES.values()) | _NARROW

        def takes(column: Column, target_type: str) -> bool:
            if target_type == postgres_type(column):
                return True
            if column.kind in ("integer", "decimal") and target_type == "numeric":
                return True  # wider: every value fits
            if column.kind == "integer" and _whole(target_type):
                return True
            return not (target_type in made or target_type.startswith("numeric("))

        return difference(existing, columns, takes=takes, required=required, unwritable=unwritable)

    def add_columns(self, columns: Sequence[Column]) -> None:
        def add(conn: Any) -> None:
            for column in columns:
                _run(
                    conn,
                    f"ALTER TABLE {self._target.sql(_name)} ADD COLUMN {_name(column.name)}"
                    f" {postgres_type(column)}",
                )

        self._outside_call(add, read_only=False, to="be altered")

    # --- ledger and reads -------------------------------------------------------------------

    def read_ledger(self, *, partitions: bool = False) -> list[LedgerEntry]:
        """The ledger entries of this target table, oldest first (a read-only transaction)."""
        ledger = self._ledger_table

        def read(conn: Any) -> list[tuple]:
            columns = _columns(conn, ledger)
            if not columns:
                return []
            check_ledger_columns({name for name, _ in columns})
            query = ledger_query("%s", partitions=partitions, ledger=ledger.sql(_name))
            return conn.execute(query, [self.identity().table]).fetchall()

        return [LedgerEntry.from_row(*row) for row in self._outside_call(read)]

    def read_rejects(self) -> list[tuple]:
        """This table's rows set aside, oldest first. Reads only."""
        rejects = TableName(self._target.schema, REJECTS_TABLE)

        def read(conn: Any) -> list[tuple]:
            if not _exists(conn, rejects):
                return []
            sql = rejects_query(rejects.sql(_name), "%s") + " ORDER BY ctid"
            return _run_query(conn, sql, self.identity().table)

        return self._outside_call(read)

    def _fence_first(self, conn: Any, entry: LedgerEntry | None) -> None:
        """In the load's transaction, before its work: a batch already fenced out stops; one
        that goes on names its lease's epoch in its session (``_holder``), so that a later
        holder that raises the fence past it can end it (``advance_fence``)."""
        if entry is None or entry.epoch is None:
            return
        holder = _holder(entry.target_table, entry.epoch)
        _run(conn, "SELECT set_config('application_name', %s, true)", holder)
        fence_first(_query(conn), entry, **_fence_read(conn, self._target.schema))

    def fence_epoch(self) -> int:
        """The target table's fence in ``_dpone_fence`` of its schema (``read_fence``)."""
        schema = self._target.schema

        def read(conn: Any) -> int:
            return read_fence(_query(conn), self.identity().table, **_fence_read(conn, schema))

        return self._outside_call(read, to="have its fence read")

    def advance_fence(self, epoch: int) -> int:
        """Raise the fence to ``epoch`` in a transaction of its own, under the ledger's lock.

        The loads of older epochs into this table still open are ended first
        (``_end_older_loads``): a holder whose lease expired, stopped inside its load (SIGSTOP,
        a frozen VM), held the ledger's lock, or the rows this holder's load then meets, for
        as long as it was stopped. Ending it loses nothing: it rolls back, or it had
        committed, and the ledger read after the fence says which. Any other holder of the
        lock is waited for ``_FENCE_WAIT`` at most: then this fails and nothing is proven."""
        fence = TableName(self._target.schema, FENCE_TABLE)

        def advance(conn: Any) -> int:
            _end_older_loads(conn, self.identity().table, epoch)
            _run(conn, f"SET LOCAL lock_timeout = '{_FENCE_WAIT}'")
            _lock_ledger(conn, self._ledger_table)
            _create_schema(conn, fence)
            table, create = self.identity().table, not _exists(conn, fence)  # as in _record
            return advance_fence(_query(conn), table, epoch, **_fence(fence), create=create)

        return self._outside_call(advance, read_only=False, to="have its fence raised")

    def row_count(self) -> int:
        return self._outside_call(lambda conn: _row_count(conn, self._target))

    def batch_rows(self, column: str, batch_id: str) -> int:
        """Rows whose ``column`` holds ``batch_id``; 0 without it."""

        def count(conn: Any) -> int:
            if column not in {name for name, _ in _columns(conn, self._target)}:
                return 0
            sql = f"SELECT count(*) FROM {self._target.sql(_name)} WHERE {_name(column)} = %s"
            return int(_run_query(conn, sql, batch_id)[0][0])

        return self._outside_call(count)

    def is_empty(self) -> bool:
        def empty(conn: Any) -> bool:
            if not _exists(conn, self._target):
                return True
            found = _run_query(conn, f"SELECT EXISTS (SELECT 1 FROM {self._target.sql(_name)})")
            return not found[0][0]

        return self._outside_call(empty)

    def rows(self) -> list[tuple]:
        """Every row of the target table, in no particular order (tests and operators)."""

        def every(conn: Any) -> list[tuple]:
            if not _exists(conn, self._target):
                return []
            return _run_query(conn, f"SELECT * FROM {self._target.sql(_name)}")

        return self._outside_call(every)


# Statements always pass a parameter list, so psycopg reads ``%%`` in a quoted name (``_name``)
# as ``%``; COPY takes no parameters and uses ``quote``.


def _run(conn: Any, sql: str, *params: Any) -> int:
    """Execute one statement; the rows it affected."""
    return conn.execute(sql, list(params)).rowcount


def _run_query(conn: Any, sql: str, *params: Any) -> list[tuple]:
    return conn.execute(sql, list(params)).fetchall()


def _columns(conn: Any, table: TableName) -> list[tuple[str, str]]:
    """The table's (name, ``format_type``) pairs in order; ``[]`` when it does not exist."""
    return [(name, kind) for name, kind in _run_query(conn, _COLUMNS, table.schema, table.name)]


def _exists(conn: Any, table: TableName) -> bool:
    return bool(_run_query(conn, _EXISTS, table.schema, table.name)[0][0])


def _create_schema(conn: Any, table: TableName) -> None:
    """Create the table's schema unless it exists (CREATE SCHEMA IF NOT EXISTS would need the
    CREATE privilege on the database even then). Two tables of a pipeline creating it at
    once: the second waits on a transaction lock of the name, then finds it (both creating
    it, one failed with a unique violation)."""
    exists = "SELECT to_regnamespace(%s) IS NOT NULL"
    if table.schema is None or _run_query(conn, exists, quote(table.schema))[0][0]:
        return
    _run(conn, "SELECT pg_advisory_xact_lock(hashtext(%s))", f"dpone schema {table.schema}")
    # read from the catalog table: the name lookup above may keep its miss in a cache
    made = "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = %s)"
    if not _run_query(conn, made, table.schema)[0][0]:
        _run(conn, f"CREATE SCHEMA {_name(table.schema)}")


def _create_table(
    conn: Any, table: TableName, columns: Sequence[Column], *, key: str = "", dropped: bool = False
) -> None:
    """Create the table unless it exists (checked first, unless it was ``dropped`` just before:
    CREATE TABLE IF NOT EXISTS would need the CREATE privilege on the schema even then);
    ``key``: its PRIMARY KEY clause."""
    if not columns:
        raise ConfigInvalid("at least one column is required")
    _refuse_long_names(columns, table.name)
    if not dropped and _exists(conn, table):
        return
    _create_schema(conn, table)
    definitions = ", ".join(f"{_name(column.name)} {postgres_type(column)}" for column in columns)
    _run(conn, f"CREATE TABLE {table.sql(_name)} ({definitions}{key})")


def _merge_rows(conn: Any, table: TableName, payload: RowChunks) -> int:
    """A merge route's load: the batch's rows copied into a temporary table (dropped at the
    latest on commit), then merged into the target on its key; the rows the batch holds
    (what the call was sent: the server's count of the copy)."""
    merge, columns = payload.merge, payload.columns
    assert merge is not None
    _refuse_long_names(columns, table.name)
    batch = TableName(None, MERGE_BATCH)
    definitions = ", ".join(f"{_name(column.name)} {postgres_type(column)}" for column in columns)
    _run(conn, f"CREATE TEMP TABLE {batch.sql(_name)} ({definitions}) ON COMMIT DROP")
    rows = _copy_rows(conn, batch, columns, payload.chunks, made=True)
    target = merge.target_columns(columns)
    _create_table(conn, table, target, key=key_constraint(merge, name=_name))
    _merge(conn, table, batch, [column.name for column in columns], merge)
    return rows


def _merge(
    conn: Any, table: TableName, batch: TableName, names: Sequence[str], merge: Merge
) -> None:
    """Merge ``batch`` into ``table``; a missing target is created with the batch's columns
    and types (less the deleted column) and the key as its PRIMARY KEY. A table with a unique
    index on exactly the key takes one ``MERGE`` (``_merge.merge_into_statements``; before
    PostgreSQL 15, which has none, ``_merge.upsert_statements``), any other
    ``_merge.merge_statements``."""
    existing = [n for n, _ in _columns(conn, table)]
    arbiter = bool(existing) and _arbiter(conn, table, merge)
    if not existing:
        _create_schema(conn, table)
        typed = [(n, t) for n, t in _columns(conn, batch) if n != merge.deleted]
        definitions = ", ".join(f"{_name(n)} {t}" for n, t in typed)
        key = key_constraint(merge, name=_name)
        _run(conn, f"CREATE TABLE {table.sql(_name)} ({definitions}{key})")
        arbiter = True
    target, rows = table.sql(_name), batch.sql(_name)
    collated = dict.fromkeys(_collatable(conn, batch), BYTE_ORDER)
    unloaded = [n for n in existing if n not in names]
    if arbiter and conn.info.server_version >= MERGE_SINCE:
        statements = merge_into_statements(
            target, rows, names, merge, unloaded=unloaded, name=_name, collated=collated
        )
    elif arbiter:
        around = _delete_plan(conn, table, batch, merge)
        statements = upsert_statements(
            target, rows, names, merge, unloaded=unloaded, name=_name, collated=collated,
            around_delete=around, distinct_on=True,
        )  # fmt: skip
    else:
        statements = merge_statements(
            target, rows, names, merge, name=_name, collated=collated, distinct_on=True
        )
    for statement in statements:
        _run(conn, statement)


def _delete_plan(
    conn: Any, table: TableName, batch: TableName, merge: Merge
) -> tuple[Sequence[str], Sequence[str]]:
    """The statements around an upsert's DELETE of the deleted keys (``upsert_statements``).

    PostgreSQL cannot tell how few the deleted keys are (it estimates the deleted column's
    filter at 99.5% of the winners) and prices an index lookup as a disk read, so on a
    1,000,000-row table it scanned the whole table for 3,000 deleted keys: 0.08 s with the
    winners counted (``ANALYZE``), 0.18 s without, against 0.01-0.02 s looked up one by one
    in the key's index. When the batch deletes fewer keys than the table has pages (a
    lookup took ~4 us, the scan of a page of 100-odd rows ~10 us), hash and merge joins are
    off for that one statement; otherwise the winners are counted first."""
    if merge.deleted is None:
        return (), ()
    gone = f"COALESCE(CAST({_name(merge.deleted)} AS INTEGER), 0) <> 0"
    deleted, pages = conn.execute(
        f"SELECT count(*) FILTER (WHERE {gone}), pg_relation_size(to_regclass(%s))"
        f" / current_setting('block_size')::bigint FROM {batch.sql(_name)}",
        [table.sql(_name)],
    ).fetchone()
    if pages is not None and deleted < pages:
        return _LOOKUPS, _JOINS
    return (f"ANALYZE {_name(MERGE_WINNERS)}",), ()


MERGE_SINCE = 150000  # the first server version with MERGE (``server_version``'s number)
_LOOKUPS = ("SET LOCAL enable_hashjoin = off", "SET LOCAL enable_mergejoin = off")
_JOINS = ("RESET enable_hashjoin", "RESET enable_mergejoin")


# A text cursor is ordered by bytes, as SQLite, DuckDB and ClickHouse order it and a SQLite
# source's windows do: a database collated en_US or ICU ranked 'a' below 'B' and kept the
# older version (exit 0).
BYTE_ORDER = ' COLLATE "C"'


def _collatable(conn: Any, table: TableName) -> list[str]:
    """The columns of ``table`` whose type a collation orders (text, varchar...): the
    version and the columns that break a tie are ordered by their bytes there, as on the
    other targets (a database collated ICU ``en-US`` ranked ``'B'`` above ``'a'``, and gave
    another winner of a tie)."""
    return [name for (name,) in conn.execute(_COLLATABLE, [table.sql(_name)])]


def _arbiter(conn: Any, table: TableName, merge: Merge) -> bool:
    """Whether ``INSERT ... ON CONFLICT`` on the merge's key can use one of the table's
    indexes: unique, checked at once (not deferrable), whole (not partial), valid, and on
    exactly the key's columns."""
    return any(set(names) == set(merge.key) for (names,) in conn.execute(_ARBITERS, [table.sql()]))


def _unwritable(conn: Any, table: TableName, columns: Sequence[Column]) -> list[str]:
    """``_sql.unwritable``: PostgreSQL's ``PREPARE`` refuses the insert with SQLSTATE 42804
    (no assignment cast, as from text to an enum made by hand) or 428C9 (a generated or
    ``GENERATED ALWAYS`` identity column)."""

    def prepares(statement: str) -> bool:
        try:
            with conn.transaction():  # a savepoint: a refused statement leaves the rest
                _run(conn, f"PREPARE {RESERVED_PREFIX}writes AS {statement}")
                _run(conn, f"DEALLOCATE {RESERVED_PREFIX}writes")
        except _driver().Error as error:
            if getattr(error, "sqlstate", None) not in ("42804", "428C9"):
                raise
            return False
        return True

    return unwritable(
        table.sql(_name), columns, name=_name, type_of=postgres_type, prepares=prepares
    )


def _refuse_long_names(columns: Sequence[Column], table: str) -> None:
    """Column names PostgreSQL would cut (more than 63 bytes) are a configuration error: two
    could become one name, or a cut name miss the column the route means."""
    long = [c.name for c in columns if len(c.name.encode("utf-8")) > _MAX_NAME_BYTES]
    if long:
        raise ConfigInvalid(
            f"column(s) {', '.join(long)} of target table {table!r} have names longer than "
            f"PostgreSQL keeps ({_MAX_NAME_BYTES} bytes); rename them in the source",
            diagnostics={"table": table, "columns": long},
        )


def _prepare_target(
    conn: Any, table: TableName, columns: Sequence[Column], *, replace: bool
) -> None:
    _create_table(conn, table, columns)
    if replace:  # DELETE, not TRUNCATE: readers with an older snapshot keep seeing the old rows
        _run(conn, f"DELETE FROM {table.sql(_name)}")


def _applied_counter(conn: Any, table: TableName, *, replace: bool) -> Callable[[int], int]:
    """What the load applied: the server's count of the rows it wrote; or, on a table with AFTER
    triggers on inserts or deletes, which may add or delete other rows, the rows the table
    gained (a refresh: holds) in this transaction, counted before and after."""
    if not _run_query(conn, _AFTER_TRIGGERS, table.sql())[0][0]:
        return lambda rows: rows
    before = 0 if replace else _row_count(conn, table)
    return lambda _rows: _row_count(conn, table) - before


def _copy_payload(conn: Any, table: TableName, payload: RowChunks, *, made: bool = False) -> int:
    """The payload's rows through ``COPY ... FROM STDIN``: a source's binary ``COPY`` files
    (``BulkRead.write_copy_file``) byte for byte, its Arrow files (``BulkRead``) as CSV
    written in C (``_arrow.csv_blocks``), any other rows one by one (``made``: ``table`` was
    just created from the payload's columns)."""
    files = payload.files if isinstance(payload, LoadFiles) else ()
    if not files or not all(file.native for file in files):
        return _copy_rows(conn, table, payload.columns, payload.chunks, made=made)
    names = ", ".join(quote(column.name) for column in payload.columns)
    if all(file.path.suffix == COPY_SUFFIX for file in files):
        return sum(_copy_binary(conn, table, names, file) for file in files)
    with conn.cursor() as cursor:
        with cursor.copy(f"COPY {table.sql()} ({names}) FROM STDIN (FORMAT csv)") as copy:
            for block in csv_blocks(arrow("PostgresSink"), files):
                copy.write(block)
        return int(cursor.rowcount)  # the server's count: rows a trigger skipped are not in it


def _copy_binary(conn: Any, table: TableName, names: str, file: LoadFile) -> int:
    """One binary ``COPY ... FROM STDIN`` of ``file``'s bytes as they are; its digest checked
    after its last byte (``ArtifactInvalid`` rolls the load back)."""
    with conn.cursor() as cursor, DigestReader(file.path, file.sha256) as reader:
        with cursor.copy(f"COPY {table.sql()} ({names}) FROM STDIN (FORMAT binary)") as copy:
            while block := reader.read(_COPY_BLOCK):
                copy.write(block)
            reader.verify()
        return int(cursor.rowcount)


# The target types whose binary ``COPY`` form psycopg writes, in C, from the Python type each
# kind's carrier gives (int, float, str, bool, bytes): the server parses no text for them.
_BINARY_COPY = {
    "bigint": "int8",
    "double precision": "float8",
    "text": "text",
    "boolean": "bool",
    "bytea": "bytea",
}


def _binary_types(
    conn: Any, table: TableName, columns: Sequence[Column], *, made: bool
) -> list[str] | None:
    """The types of a binary ``COPY`` of ``columns`` into ``table``, when each is one of
    ``_BINARY_COPY`` and the table has exactly the types dpone makes for them (binary input
    of another type fails; ``made``: it was just created from them, not looked up); None:
    the rows go as text (the server converts each)."""
    kinds = [postgres_type(column) for column in columns]
    if not all(kind in _BINARY_COPY for kind in kinds):
        return None
    if not made:
        existing = dict(_columns(conn, table))
        if any(existing.get(c.name) != kind for c, kind in zip(columns, kinds, strict=True)):
            return None
    return [_BINARY_COPY[kind] for kind in kinds]


def _copy_rows(
    conn: Any,
    table: TableName,
    columns: Sequence[Column],
    chunks: Iterable[Sequence[tuple]],
    *,
    made: bool = False,
) -> int:
    """Every row of ``chunks`` through one ``COPY ... FROM STDIN``, in binary where the column
    kinds allow (``_binary_types``: the COPY 2.2-2.4 times faster, docs/performance.md, fix
    69), else as text; the rows the server wrote."""
    names = ", ".join(quote(column.name) for column in columns)
    types = _binary_types(conn, table, columns, made=made)
    binary = "" if types is None else " (FORMAT binary)"
    with conn.cursor() as cursor:
        with cursor.copy(f"COPY {table.sql()} ({names}) FROM STDIN{binary}") as copy:
            if types is not None:
                copy.set_types(types)
            for chunk in chunks:
                if not chunk:
                    continue
                check_widths(chunk, len(columns), table.name)
                for row in chunk:
                    copy.write_row(row)
        return int(cursor.rowcount)  # the server's count: rows a trigger skipped are not in it


def _pulled_value(alias: str, column: Column) -> str:
    """A lazy plan's value of one column, cast to the target type, as the driver reads it on
    the other paths: a ``real`` through its text (``0.1``, not 0.100000001490116), a
    ``character(n)`` through its output text (``concat``: a cast would drop the padding)."""
    base = _base(column.decltype)
    padded = f"CASE WHEN {alias} IS NULL THEN NULL ELSE concat({alias}) END"  # concat(NULL): ''
    value = {"real": f"{alias}::text", "character": padded}.get(base, alias)
    return f"CAST({value} AS {postgres_type(column)})"


_FENCE_WAIT = "5s"


def _holder(target_table: str, epoch: int) -> str:
    """The ``application_name`` of a load's session: its target table (a digest: any name
    fits the 63 bytes, and none is shown) and its lease's epoch."""
    digest = hashlib.sha256(target_table.encode()).hexdigest()[:16]
    return f"{_HOLDER} {digest} epoch {epoch}"


_HOLDER = "dpone load"


def _end_older_loads(conn: Any, target_table: str, epoch: int) -> int:
    """End the sessions of this login and database loading ``target_table`` under a lease
    epoch older than ``epoch`` (``_holder``), waiting up to ``_END_WAIT_MS`` for each to go
    (PostgreSQL 14 and later; before, the lock's wait covers it); the sessions ended. Only
    the login's own: ending another login's needs a privilege it may lack."""
    prefix = _holder(target_table, 0).removesuffix("0")
    wait = ", %s" if conn.info.server_version >= 140000 else ""
    older = (
        "CASE WHEN substr(application_name, %s) ~ '^[0-9]{1,18}$'"
        " THEN substr(application_name, %s)::bigint END < %s"
    )
    params = [_END_WAIT_MS] if wait else []
    sql = (
        f"SELECT count(*) FILTER (WHERE pg_terminate_backend(pid{wait}))"
        " FROM pg_catalog.pg_stat_activity WHERE datname = current_database()"
        " AND usename = current_user AND pid <> pg_backend_pid()"
        f" AND starts_with(application_name, %s) AND {older}"
    )
    start = len(prefix) + 1
    return int(_run_query(conn, sql, *params, prefix, start, start, epoch)[0][0])


_END_WAIT_MS = 5000
LEDGER_WAIT_SECONDS = 60.0  # a load's wait for the ledger's lock (``_record``)
_LEDGER_HELD = (
    "another load into its schema held the ledger's lock (a worker stopped before its commit, "
    "or a lock taken by hand)"
)
_STAGE_WAIT = "30s"


def _fence_at(fence: TableName) -> dict[str, str]:
    return {"table": fence.sql(_name), "marker": "%s"}


def _fence_read(conn: Any, schema: str | None) -> dict[str, Any]:
    """``read_fence``'s and ``fence_first``'s fence and ledger tables, each where it exists."""
    fence, ledger = TableName(schema, FENCE_TABLE), TableName(schema, LEDGER_TABLE)
    found = _own_tables(conn, schema)
    return {
        **_fence_at(fence),
        "table": fence.sql(_name) if FENCE_TABLE in found else None,
        "ledger": lambda: ledger.sql(_name) if LEDGER_TABLE in found else None,
    }


def _own_tables(conn: Any, schema: str | None) -> set[str]:
    """Which of the schema's ledger and fence exist: one round trip for both."""
    names = [FENCE_TABLE, LEDGER_TABLE]
    return {name for (name,) in _run_query(conn, _EXISTING, schema, names)}


def _fence(fence: TableName) -> dict[str, str]:
    return {**_fence_at(fence), "text": "text NOT NULL", "integer": "bigint NOT NULL"}


def _query(conn: Any) -> Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]:
    def run(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        cursor = conn.execute(sql, list(params))
        return cursor.fetchall() if cursor.description else []

    return run


def _lock_ledger(conn: Any, ledger: TableName) -> None:
    """The transaction lock that serializes the ledger's and the fence's writes."""
    _run(conn, "SELECT pg_advisory_xact_lock(hashtext(%s))", ledger.sql())


def _record(conn: Any, ledger: TableName, entry: LedgerEntry | None, rows: int) -> int:
    """Inside the load's transaction: check the rows applied and the fence, then write the
    batch's ledger row; returns ``rows``.

    A transaction lock on the ledger serializes its creation and its ``seq`` between loads
    of different tables of the schema (one table's loads hold the route's lease), and the
    fence's reads and writes. It is waited for ``LEDGER_WAIT_SECONDS`` at most (its holder
    normally commits within milliseconds; a worker stopped before its commit holds it for as
    long as it is stopped): past that, ``TargetBusy``, the load not committed."""
    if entry is not None:
        check_applied(entry, rows)
        table = ledger.sql(_name)
        _run(conn, f"SET LOCAL lock_timeout = '{LEDGER_WAIT_SECONDS * 1000:.0f}ms'")
        try:
            _lock_ledger(conn, ledger)
        except _driver().errors.LockNotAvailable:
            held = TargetBusy.waited(entry.target_table, LEDGER_WAIT_SECONDS, held=_LEDGER_HELD)
            raise held from None  # the driver's text is never chained
        fence, found = TableName(ledger.schema, FENCE_TABLE), _own_tables(conn, ledger.schema)
        fence_batch(
            _query(conn), entry, **_fence(fence), create=FENCE_TABLE not in found,
            ledger=lambda: table if LEDGER_TABLE in found else None,
        )  # fmt: skip
        if LEDGER_TABLE not in found:
            _create_schema(conn, ledger)
            integer = "bigint NOT NULL"
            _run(conn, ledger_table_sql(table, seq=integer, integer=integer, text="text NOT NULL"))
        target, batch, fields, partitions = entry.row()
        _run(
            conn,
            f"INSERT INTO {table} (seq, target_table, batch_id, rows, entry, partitions)"
            f" VALUES ((SELECT COALESCE(MAX(seq), 0) + 1 FROM {table}), %s, %s, %s, %s, %s)",
            target, batch, rows, fields, partitions,
        )  # fmt: skip
        if entry.rejects:
            rejects = TableName(ledger.schema, REJECTS_TABLE)
            if not _exists(conn, rejects):
                _run(conn, rejects_table_sql(rejects.sql(_name), text="text"))
            with conn.cursor() as cursor:
                write_rejects(cursor.executemany, entry.rejects, target_table=target,
                              batch_id=batch, table=rejects.sql(_name), marker="%s")  # fmt: skip
    return rows


def _row_count(conn: Any, table: TableName) -> int:
    """The table's rows; 0 when it does not exist."""
    return _count(conn, table) if _exists(conn, table) else 0


def _count(conn: Any, table: TableName) -> int:
    return _run_query(conn, f"SELECT count(*) FROM {table.sql(_name)}")[0][0]
