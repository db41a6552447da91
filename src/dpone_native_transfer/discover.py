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

import argparse
import contextlib
import json
import os
import re
import sqlite3
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import attrs

from .drivers import (
    POSTGRES_SCHEMES,
    import_driver,
    postgres_connect,
    postgres_failure,
    resolve_env,
)
from .errors import ConfigInvalid, SourceAccessRefused, SourceInvalid, SourceMissing
from .reporting import EXIT_OK, plural

__all__ = [
    "INTERNAL_PREFIXES",
    "TableInfo",
    "add_discover_command",
    "pipeline_text",
    "read_catalog",
]

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
        columns = [c.casefold() for c in self.columns] if folded else self.columns
        return (name.casefold() if folded else name) in columns

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
    upper = declared.upper()
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
                    types=tuple((kind or "").lower() for _, kind, _ in described),
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
        shown = name if schema == "public" else f"{schema}.{name}"
        if _internal(shown):
            continue
        found.append(
            TableInfo(
                name=shown,
                rows=int(estimate) if rows and estimate is not None and estimate >= 0 else None,
                columns=tuple(column for column, _ in described),
                types=tuple(kind.lower() for _, kind in described),
                primary_key=keys.get(oid, ()),
                indexed=tuple(indexed.get(oid, ())),
            )
        )
    return found


# -- dpone-transfer discover -------------------------------------------------------------------

_HEADERS = ("TABLE", "ROWS", "PRIMARY_KEY", "CURSOR_CANDIDATES", "PARTITION_CANDIDATES")


def add_discover_command(commands: Any, common: argparse.ArgumentParser) -> None:
    discover = commands.add_parser(
        "discover",
        parents=[common],
        help="a source's tables, keys and candidate columns; --write: a pipeline file of them",
        description="List the tables of a source database with their row estimates, primary "
        "keys, and candidate cursor and partition columns; with --write, a pipeline file that "
        "moves them all, to edit and run (docs/pipelines.md). Reads only.",
    )
    discover.add_argument(
        "source",
        metavar="SOURCE",
        help="a SQLite file, a postgresql:// URL, or env:NAME naming a variable holding either",
    )
    discover.add_argument("--json", action="store_true", help="one JSON array of tables")
    discover.add_argument("--write", metavar="FILE", help="write a pipeline file of every table")
    discover.add_argument(
        "--target",
        metavar="TARGET",
        help="the written pipeline's target: a file (.duckdb: DuckDB, else SQLite), a "
        "postgresql:// URL or env:NAME (default: warehouse.db beside the pipeline file)",
    )
    discover.add_argument(
        "--target-kind",
        choices=("sqlite", "duckdb", "clickhouse", "postgres"),
        help="the target's kind, when its name does not say it",
    )
    discover.add_argument(
        "--store",
        metavar="STORE",
        help="the written pipeline's checkpoint store (default: checkpoints.db beside it)",
    )
    discover.add_argument("--force", action="store_true", help="replace an existing --write file")
    discover.set_defaults(handler=_discover_command)


def _kind_of(location: str, *, argument: str) -> str:
    value = resolve_env(location, argument=argument)
    return "postgres" if value.startswith(POSTGRES_SCHEMES) else "sqlite"


def _discover_command(args: argparse.Namespace) -> int:
    kind = _kind_of(args.source, argument="SOURCE")
    catalog = read_catalog(kind, args.source)
    if args.write is not None:
        _write(args, kind, catalog)
    if args.json:
        print(json.dumps([table.as_dict() for table in catalog], sort_keys=True))
        return EXIT_OK
    rows = [
        (
            table.name,
            "?" if table.rows is None else f"{table.rows:,}",
            ", ".join(table.primary_key) or "-",
            ", ".join(table.cursor_candidates) or "-",
            ", ".join(table.partition_candidates) or "-",
        )
        for table in catalog
    ]
    widths = [max(len(cell) for cell in column) for column in zip(_HEADERS, *rows, strict=True)]
    for row in (_HEADERS, *rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    print(
        f"{plural(len(catalog), 'table')}"
        + (
            f"; wrote the pipeline file {args.write}"
            if args.write
            else "; --write FILE writes a pipeline file of them"
        )
    )
    return EXIT_OK


def _write(args: argparse.Namespace, kind: str, catalog: list[TableInfo]) -> None:
    """The pipeline file, checked as ``run`` will check it before it is written."""
    from .pipeline import pipeline_from_mapping  # it builds on this module

    file = Path(args.write)
    if file.exists() and not args.force:
        raise ConfigInvalid(
            "--write names a file that exists; pass --force to replace it",
            diagnostics={"argument": "--write"},
        )
    if not catalog:
        raise ConfigInvalid(
            "the source has no table to write a pipeline of", diagnostics={"argument": "SOURCE"}
        )
    folder = Path(os.path.abspath(file)).parent
    text = pipeline_text(
        catalog,
        source=_location_keys(args.source, kind, folder, argument="SOURCE"),
        target=_target_keys(args, folder),
        store="checkpoints.db" if args.store is None else _relative(args.store, folder),
    )
    pipeline_from_mapping(tomllib.loads(text), base_dir=folder, file=args.write)
    try:
        file.write_text(text)
    except OSError:
        raise ConfigInvalid(
            "--write names a file that cannot be written", diagnostics={"argument": "--write"}
        ) from None


def _location_keys(value: str, kind: str, folder: Path, *, argument: str) -> dict[str, str]:
    if kind in ("sqlite", "duckdb", "clickhouse") and not value.startswith("env:"):
        return {"kind": kind, "path": _relative(value, folder)}
    if value.startswith(POSTGRES_SCHEMES) and urlsplit(value).password:
        raise ConfigInvalid(
            f"{argument} holds a password, which --write would put into the file: give it as "
            "env:NAME, a variable holding the URL",
            diagnostics={"argument": argument},
        )
    key = "dsn" if kind == "postgres" else ("url" if kind == "clickhouse" else "path")
    return {"kind": kind, key: value}


def _target_keys(args: argparse.Namespace, folder: Path) -> dict[str, str]:
    if args.target is None:  # beside the pipeline file
        kind = args.target_kind or "sqlite"
        return {"kind": kind, "path": "warehouse.duckdb" if kind == "duckdb" else "warehouse.db"}
    value = args.target
    kind = args.target_kind
    if kind is None:
        if value.startswith(("env:", *POSTGRES_SCHEMES)):
            kind = _kind_of(value, argument="--target")
        else:
            kind = "duckdb" if value.endswith(".duckdb") else "sqlite"
    return _location_keys(value, kind, folder, argument="--target")


def _relative(path: str, folder: Path) -> str:
    """A file as the pipeline file names it: relative to its folder (where it is read from)."""
    if path.startswith(("env:", *POSTGRES_SCHEMES)):
        return path
    return os.path.relpath(os.path.abspath(path), folder)


def pipeline_text(
    catalog: list[TableInfo], *, source: dict[str, str], target: dict[str, str], store: str
) -> str:
    """A pipeline file moving every table of ``catalog``: by key ranges of its integer key
    and, where one is found, with a cursor column; a table with neither is refreshed whole."""
    lines = [
        "# Written by `dpone-transfer discover` from the source's catalog: edit it, then run",
        "# `dpone-transfer run` on it. docs/pipelines.md describes every key.",
        "",
        "[pipeline]",
        f"tables = {_toml(', '.join(_toml(t.name) for t in catalog), raw=True)}",
        "",
        "[source]",
        *(f"{key} = {_toml(value)}" for key, value in source.items()),
        "",
        "[target]",
        *(f"{key} = {_toml(value)}" for key, value in target.items()),
        "",
        "[store]",
        f"path = {_toml(store)}",
        "",
        "[defaults]",
        'strategy = "incremental_append"',
        'path = "staged"',
    ]
    for table in catalog:
        rows = "unknown rows" if table.rows is None else plural(table.rows, "row")
        lines += [
            "",
            f"# {rows}; primary key: {', '.join(table.primary_key) or 'none'}; cursor "
            f"candidates: {', '.join(table.cursor_candidates) or 'none'}; partition candidates: "
            f"{', '.join(table.partition_candidates) or 'none'}",
            f"[tables.{_key(table.name)}]",
            *_table_settings(table),
        ]
    return "\n".join(lines) + "\n"


def _table_settings(table: TableInfo) -> list[str]:
    key = table.range_key
    cursors = [c for c in table.cursor_candidates if c != key]
    column = key or (table.partition_candidates or table.columns)[0]
    settings = [f"partition_column = {_toml(column)}", 'partition_by = "range"']
    if cursors:
        settings.append(f"cursor_column = {_toml(cursors[0])}")
    elif key is None:
        settings.append('strategy = "full_refresh"  # no integer key or cursor column found')
    return settings


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else _toml(name)


def _toml(value: str, *, raw: bool = False) -> str:
    return f"[{value}]" if raw else json.dumps(value)
