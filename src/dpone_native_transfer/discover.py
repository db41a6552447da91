"""What a source database holds: its tables, their keys, and columns fit to cut or follow.

``read_catalog`` reads a SQLite file or a PostgreSQL database's catalog with
plain queries, read-only: a table's columns, its primary key, the column a
route can cut into key ranges (an integer primary key), candidate cursor
columns (timestamps whose name says they move on a change or an insert, and
the integer key, which only grows) and candidate partition columns (the
first column of an index). Pipelines validate their tables against it, and
``dpone-transfer discover`` prints it or writes a pipeline file from it.
Messages name the database's kind, never its location (a DSN holds a password).
"""

from __future__ import annotations

import contextlib
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from .drivers import (
    import_driver,
    postgres_connect,
    postgres_failure,
    resolve_env,
)
from .errors import SourceAccessRefused, SourceInvalid, SourceMissing
from .identity import fold_ascii, upper_ascii

__all__ = ["INTERNAL_PREFIXES", "TableInfo", "read_catalog"]

INTERNAL_PREFIXES = ("_dpone_", "sqlite_")  # dpone's own tables, SQLite's: never a pipeline's
_SQLITE_TIMEOUT = 30.0
_UPDATED = re.compile(r"(updat|modif|chang|edit|sync)", re.IGNORECASE)
_CREATED = re.compile(r"(creat|insert|added|_at$|_ts$|time)", re.IGNORECASE)
_TIME_TYPES = ("DATE", "TIME")  # SQLite declared types holding them: DATETIME, TIMESTAMP...
_PG_INTEGERS = ("smallint", "integer", "bigint")


@attrs.frozen
class TableInfo:
    """One source table as its catalog describes it."""

    name: str  # as a route names it: ``orders``, or ``sales.orders`` outside ``public``
    rows: int | None  # an estimate (PostgreSQL: the planner's; None when never analysed)
    columns: tuple[str, ...]
    types: tuple[str, ...]  # declared types, lower case
    primary_key: tuple[str, ...]
    indexed: tuple[str, ...]  # first columns of indexes, primary key first

    @property
    def range_key(self) -> str | None:
        """The column a route cuts into key ranges when it names none: a one-column integer
        primary key (SQLite: ``INTEGER PRIMARY KEY``, the rowid)."""
        if len(self.primary_key) != 1:
            return None
        kind = self.type_of(self.primary_key[0])
        return self.primary_key[0] if kind in ("integer", *_PG_INTEGERS) else None

    def type_of(self, column: str) -> str:
        return self.types[self.columns.index(column)]

    @property
    def cursor_candidates(self) -> tuple[str, ...]:
        """Columns that only grow, best first: a timestamp (or an integer time) moved on every
        change (it catches updates), one set on insert, then the integer key (new rows only).
        A guess from names and types: only the table's writers know."""
        growing = [
            c
            for c, t in zip(self.columns, self.types, strict=True)
            if _is_time(t) or t in ("integer", *_PG_INTEGERS)
        ]
        updated = [c for c in growing if _UPDATED.search(c)]
        created = [c for c in growing if c not in updated and _CREATED.search(c)]
        key = [self.range_key] if self.range_key else []
        return tuple(dict.fromkeys([*updated, *created, *key]))

    @property
    def partition_candidates(self) -> tuple[str, ...]:
        """Indexed columns: each partition's read is then an index range, not a scan."""
        return self.indexed

    def has_column(self, name: str, *, folded: bool) -> bool:
        columns = [fold_ascii(c) for c in self.columns] if folded else self.columns
        return (fold_ascii(name) if folded else name) in columns

    def as_dict(self) -> dict[str, Any]:
        return {
            "table": self.name,
            "rows": self.rows,
            "columns": dict(zip(self.columns, self.types, strict=True)),
            "primary_key": list(self.primary_key),
            "range_key": self.range_key,
            "cursor_candidates": list(self.cursor_candidates),
            "partition_candidates": list(self.partition_candidates),
        }


def _is_time(declared: str) -> bool:
    upper = upper_ascii(declared)
    return any(word in upper for word in _TIME_TYPES)


def read_catalog(kind: str, location: str, *, rows: bool = True) -> list[TableInfo]:
    """Every user table of the source, by name; ``rows``: with row estimates (a count per
    table on SQLite). ``location`` is a file (sqlite) or a DSN or ``env:NAME`` (postgres)."""
    if kind == "sqlite":
        return _sqlite_catalog(location, rows=rows)
    return _postgres_catalog(resolve_env(location, argument="source.dsn"), rows=rows)


def _internal(name: str) -> bool:
    return name.split(".")[-1].startswith(INTERNAL_PREFIXES)


# -- SQLite ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _sqlite(path: str) -> Iterator[sqlite3.Connection]:
    if not os.path.isfile(path):
        raise SourceMissing(  # the resolved path, as a route's missing source file shows it
            f"source database {os.path.abspath(path)} does not exist (or is not a file)",
            diagnostics={"key": "source.path"},
        )
    uri = Path(os.path.abspath(path)).as_uri() + "?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=_SQLITE_TIMEOUT)) as conn:
            yield conn
    except sqlite3.Error:
        refused = not os.access(path, os.R_OK)
        error = SourceAccessRefused if refused else SourceInvalid
        raise error(
            "the source database's catalog could not be read"
            + ("; give this process read access to the source file" if refused else ""),
            diagnostics={"key": "source.path"},
        ) from None


def _sqlite_catalog(path: str, *, rows: bool) -> list[TableInfo]:
    found = []
    with _sqlite(path) as conn:
        names = [
            name
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"
            )
            if not _internal(name)
        ]
        for name in names:
            info = conn.execute("SELECT name, type, pk FROM pragma_table_info(?)", (name,))
            described = info.fetchall()
            keys = sorted((pk, column) for column, _, pk in described if pk)
            indexed = [column for _, column in keys][:1]
            for (index,) in conn.execute("SELECT name FROM pragma_index_list(?)", (name,)):
                first = conn.execute(
                    "SELECT name FROM pragma_index_info(?) ORDER BY seqno LIMIT 1", (index,)
                ).fetchone()
                if first and first[0] and first[0] not in indexed:
                    indexed.append(first[0])
            quoted = '"' + name.replace('"', '""') + '"'
            count = conn.execute(f"SELECT count(*) FROM {quoted}").fetchone()[0] if rows else None
            found.append(
                TableInfo(
                    name=name,
                    rows=count,
                    columns=tuple(column for column, _, _ in described),
                    types=tuple(fold_ascii(kind or "") for _, kind, _ in described),
                    primary_key=tuple(column for _, column in keys),
                    indexed=tuple(indexed),
                )
            )
    return found


# -- PostgreSQL --------------------------------------------------------------------------------

_PG_TABLES = """
SELECT c.oid, n.nspname, c.relname, c.reltuples::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'
  AND has_table_privilege(c.oid, 'SELECT')
ORDER BY n.nspname, c.relname
"""
_PG_COLUMNS = """
SELECT attrelid, attname, format_type(atttypid, atttypmod)
FROM pg_attribute WHERE attrelid = ANY(%s) AND attnum > 0 AND NOT attisdropped
ORDER BY attrelid, attnum
"""
_PG_INDEXES = """
SELECT i.indrelid, i.indisprimary, array_agg(a.attname ORDER BY k.ord)
FROM pg_index i
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord)
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
WHERE i.indrelid = ANY(%s)
GROUP BY i.indexrelid, i.indrelid, i.indisprimary
ORDER BY i.indrelid, NOT i.indisprimary, i.indexrelid
"""


def _postgres_failed(failure: Any) -> Any:
    return failure.error(
        "the source database's catalog cannot be read",
        retry=SourceInvalid,
        refused=SourceAccessRefused,
        diagnostics={"key": "source.dsn"},
        fix="fix the source DSN (its user, password or database) or the login's privileges",
    )


def _postgres_catalog(dsn: str, *, rows: bool) -> list[TableInfo]:
    driver = import_driver("psycopg", needed_by="a PostgreSQL source", key="source.kind")
    conn = postgres_connect(driver, dsn, what="PostgreSQL source", failed=_postgres_failed)
    try:
        conn.read_only = True
        tables = conn.execute(_PG_TABLES).fetchall()
        oids = [oid for oid, *_ in tables]
        columns: dict[int, list[tuple[str, str]]] = {}
        for oid, name, kind in conn.execute(_PG_COLUMNS, (oids,)):
            columns.setdefault(oid, []).append((name, kind))
        keys: dict[int, tuple[str, ...]] = {}
        indexed: dict[int, list[str]] = {}
        for oid, primary, names in conn.execute(_PG_INDEXES, (oids,)):
            if primary:
                keys[oid] = tuple(names)
            first = indexed.setdefault(oid, [])
            if names and names[0] not in first:
                first.append(names[0])
    except driver.Error as exc:
        failure = postgres_failure(driver, exc)
        if failure is None:
            raise SourceInvalid(
                "the source database's catalog could not be read",
                diagnostics={"key": "source.dsn"},
            ) from None
        raise _postgres_failed(failure) from None
    finally:
        conn.close()
    found = []
    for oid, schema, name, estimate in tables:
        described = columns.get(oid, [])
        # a route splits a name at its first dot: public's "a.b" is named "public.a.b", or
        # it would name table "b" of schema "a" (another table, or none)
        shown = name if schema == "public" and "." not in name else f"{schema}.{name}"
        if _internal(shown):
            continue
        found.append(
            TableInfo(
                name=shown,
                rows=int(estimate) if rows and estimate is not None and estimate >= 0 else None,
                columns=tuple(column for column, _ in described),
                types=tuple(fold_ascii(kind) for _, kind in described),
                primary_key=keys.get(oid, ()),
                indexed=tuple(indexed.get(oid, ())),
            )
        )
    return found


# -- dpone-transfer discover -------------------------------------------------------------------
