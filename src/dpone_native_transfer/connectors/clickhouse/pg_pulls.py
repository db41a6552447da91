"""Engine pulls from PostgreSQL: what the ClickHouse sink sends chDB to read a plan's partitions
with its ``postgresql()`` table function (``postgres_read``), as ``pulls.py`` does with
``sqlite()``. No client is opened here: the sink runs the statements.

chDB reads each value as the text PostgreSQL writes for it and parses it into the type it
infers; a pull takes only the column types it reads exactly (``_READ_EXACTLY``, checked value
by value against the source: ``tests/connectors/test_chdb_postgres_pulls.py``), and is
declined before anything else reads the rows otherwise (dpone then reads them, in bulk or as
rows). Where chDB would read a value otherwise without failing (an ``infinity`` or BC date
becomes another date; a ``timestamptz`` in a session that is not in UTC loses its offset),
the source is asked first (``PostgresTable.holds_outside``, ``EngineLogin.utc``).

The login reaches chDB as query parameters, never in SQL text, and ClickHouse masks the
password argument of ``postgresql()`` in what it logs; an error of a pull is never worded
(the pull is declined, or the target call fails with the error's type only).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import attrs

from ...payloads import LoadPlan
from ..contract import PlanInexact, Unsupported
from ..contract.postgres_table import EngineLogin, PostgresTable
from .pulls import PlanSQL
from .sql import MAX_DECIMAL_PRECISION, column_type, quote

__all__ = ["POSTGRES_READ", "PULL_SETTINGS", "PostgresRead", "outside", "postgres_read"]

POSTGRES_READ = (
    "postgresql({pg_server:String}, {pg_database:String}, {pg_table:String},"
    " {pg_user:String}, {pg_password:String}, {pg_schema:String})"
)
# The pulled DateTime64 columns' zone is the session's: UTC, whatever the process's.
PULL_SETTINGS = "max_threads = 1, session_timezone = 'UTC'"

_INTEGERS = frozenset({"smallint", "integer", "bigint"})
_TEXTS = frozenset({"text", "character varying"})
_TIMESTAMPS = frozenset({"timestamp without time zone", "timestamp with time zone"})
# format_type() names (typmod left out) chDB reads exactly, cast to the target's types; not
# real (chDB reads a Float32, the row paths the double of its text), bytea (its text), json,
# uuid, arrays, intervals or times (other texts), nor numeric without a precision.
_READ_EXACTLY = _INTEGERS | _TEXTS | _TIMESTAMPS | {"character", "double precision"}
_READ_EXACTLY |= {"boolean", "date", "numeric"}
_TEXT_DEPENDENT = _TIMESTAMPS | {"double precision", "date"}  # printed by session settings
_TYPMOD = re.compile(r"\(\d+(,\d+)?\)")
# What ClickHouse's Date32 and DateTime64 hold (a value outside: the pull is declined).
_LIMITS = {
    "date": ("1900-01-01", "2299-12-31"),
    "timestamp without time zone": ("1900-01-01 00:00:00", "2299-12-31 23:59:59.999999"),
    "timestamp with time zone": ("1900-01-01 00:00:00+00", "2299-12-31 23:59:59.999999+00"),
    "numeric": ("-Infinity", "Infinity"),  # its NaN, above Infinity (chDB fails on it)
}
_INSTANT = re.compile(r"(\d{4})-\d\d-\d\d \d\d:\d\d:\d\d(\.\d{1,6})?")
_DATE = re.compile(r"(\d{4})-\d\d-\d\d")
_CURSOR_KEYS = ("cursor_after", "cursor_from", "cursor_upto")
# ClickHouse quotes PostgreSQL identifiers with backslash escapes, which PostgreSQL does not
# read: a name with a backslash or a double quote names another column, or none (chDB 4.4).
_UNSAFE_NAME = re.compile(r'[\\"\x00-\x1f\x7f]')


@attrs.frozen(repr=False)
class PostgresRead:
    """A plan chDB pulls from PostgreSQL: its conditions (``PlanSQL``, with the login among
    its parameters), and each column as the target's type."""

    bounds: PlanSQL
    columns: str
    limits: dict[str, tuple[str, str]]  # date and timestamp columns: what ClickHouse holds
    tiny: tuple[str, ...]  # double columns: chDB fails on a subnormal value (5e-324)

    def __repr__(self) -> str:  # the parameters hold the password
        return "PostgresRead()"


def _base(decltype: str) -> str:
    return _TYPMOD.sub("", decltype).strip()


def postgres_read(plan: LoadPlan, *, table: str, values: bool = True) -> PostgresRead:
    """The plan as chDB reads it from PostgreSQL; ``Unsupported`` when its source is not a
    PostgreSQL table chDB can log in to as the source does, ``PlanInexact`` when chDB would
    read a column, a bound or (``values``) a value otherwise than the row paths carry it.
    Reads the source's catalog, and, with ``values``, scans the partitions once when a date
    or timestamp column is pulled (``outside``; a pull before the target asks after it read
    instead, so that a row written meanwhile is seen too)."""
    source = plan.source
    if not isinstance(source, PostgresTable):
        raise Unsupported("an engine that reads this source", table=table)
    login = source.engine_login()
    if login is None:
        raise Unsupported(
            "a pull by chDB of this source: its DSN names more than one TCP host, database "
            "and login, or the server's text is not UTF8",
            table=table,
        )
    for name in (login.schema, login.table, *(column.name for column in plan.columns)):
        if _UNSAFE_NAME.search(name):
            raise PlanInexact(
                f"a pull by chDB: it would name {name!r} otherwise in PostgreSQL (ClickHouse "
                "escapes backslashes and double quotes PostgreSQL's way does not)",
                diagnostics={"table": table, "identifier": name},
            )
    kinds = {column.name: _base(column.decltype) for column in plan.columns}
    for column in plan.columns:
        base = kinds[column.name]
        exact = base in _READ_EXACTLY
        if base == "numeric":
            decimal = column.decimal(MAX_DECIMAL_PRECISION)
            exact = decimal is not None and decimal[0] <= 38
        if base == "timestamp with time zone" and not login.utc:
            exact = False
        if base in _TEXT_DEPENDENT and not login.exact_text:  # chDB reads them as text
            exact = False
        if not exact:
            raise _inexact(table, column.name)
    partition, cursor = source.partition_column, source.cursor_column
    bounds = [_cursor_bounds(b, kinds.get(cursor or ""), table) for b in plan.bounds]
    keyed = kinds.get(partition)
    ranged = any("partition_from" in b for b in bounds)
    if keyed not in _INTEGERS and (keyed not in _TEXTS or ranged or not login.key_bytewise):
        raise _inexact(table, partition)  # a text's order (ranges) and = are its collation's
    limits = {name: _LIMITS[base] for name, base in kinds.items() if base in _LIMITS}
    tiny = tuple(name for name, base in kinds.items() if base == "double precision")
    if values and outside(plan, limits, tiny):
        raise PlanInexact(
            "a pull by chDB: a value of the partitions is one chDB reads otherwise or fails "
            "on (a date or timestamp outside 1900 to 2299 or infinite, a numeric NaN, a "
            "subnormal double)",
            diagnostics={"table": table},
        )
    read = PlanSQL(
        attrs.evolve(plan, bounds=tuple(bounds)),
        partition_column=partition,
        cursor_column=cursor,
        params=_login_params(login),
    )
    names = ", ".join(
        f"CAST({quote(c.name)} AS {column_type(c)}) AS {quote(c.name)}" for c in plan.columns
    )
    return PostgresRead(bounds=read, columns=names, limits=limits, tiny=tiny)


def outside(plan: LoadPlan, limits: dict[str, tuple[str, str]], tiny: tuple[str, ...]) -> bool:
    """Whether a row of the plan's partitions holds a value chDB would read as another or
    fail on (``PostgresTable.holds_outside``); no scan without such a column."""
    source = plan.source
    return isinstance(source, PostgresTable) and source.holds_outside(
        plan.bounds, limits, tiny=tiny
    )


def _login_params(login: EngineLogin) -> dict[str, Any]:
    return {
        "pg_server": f"{login.host}:{login.port}",
        "pg_database": login.database,
        "pg_table": login.table,
        "pg_user": login.user,
        "pg_password": login.password,
        "pg_schema": login.schema,
    }


def _cursor_bounds(bounds: Mapping[str, Any], base: str | None, table: str) -> Mapping[str, Any]:
    """A bound's cursor values as ClickHouse compares them with the pulled column: integers,
    or a date's or a UTC instant's text (``+00`` left out: the pulled column is UTC)."""
    given = {key: bounds[key] for key in _CURSOR_KEYS if bounds.get(key) is not None}
    if not given:
        return bounds
    changed = dict(bounds)
    for key, value in given.items():
        if base in _INTEGERS and isinstance(value, int) and not isinstance(value, bool):
            continue
        text = value if isinstance(value, str) else ""
        if base == "timestamp with time zone":
            text = text.removesuffix("+00") if text.endswith("+00") else ""
        shape = _DATE if base == "date" else _INSTANT if base in _TIMESTAMPS else None
        found = None if shape is None else shape.fullmatch(text)
        if found is None or not 1900 <= int(found.group(1)) <= 2299:
            raise PlanInexact(
                "a pull by chDB: a cursor bound it would compare otherwise",
                diagnostics={"table": table},
            )
        changed[key] = text
    return changed


def _inexact(table: str, column: str | None) -> PlanInexact:
    return PlanInexact(
        f"a pull by chDB: it would not read column {column!r} exactly as the row paths carry it",
        diagnostics={"table": table, "column": column},
    )
