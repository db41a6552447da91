"""What the SQLite connector's modules share: the connection timeout, declared types as the
target's DDL takes them, column lists, file URIs, a table's columns, and values as a column
stores them."""

from __future__ import annotations

import os
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ...column_types import sqlite_kind
from ...errors import ConfigInvalid, SourceInvalid
from ...identity import upper_ascii
from ...payloads import Column
from .._sql import quote as _quote

__all__ = [
    "TIMEOUT",
    "as_stored",
    "column_list",
    "column_ref",
    "file_uri",
    "parsed_type",
    "source_invalid",
    "sqlite_type",
    "table_columns",
]

TIMEOUT = 30
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
        if upper_ascii(token) in _CONSTRAINT_WORDS or (token.startswith("(") and not words):
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


def column_list(columns: Sequence[Column], table: str | None = None) -> str:
    if not columns:
        raise ConfigInvalid("at least one column is required")
    return ", ".join(column_ref(column.name, table) for column in columns)


def column_ref(column: str, table: str | None = None) -> str:
    """Column reference; qualified, a missing column fails instead of reading as a string."""
    return _quote(column) if table is None else f"{_quote(table)}.{_quote(column)}"


def file_uri(path: str, *, read_only: bool) -> str:
    """Absolute percent-encoded file URI, so no path is ever read as URI syntax."""
    uri = Path(os.path.abspath(path)).as_uri()
    return uri + "?mode=ro" if read_only else uri


def table_columns(conn: sqlite3.Connection, table: str) -> tuple[Column, ...]:
    rows = conn.execute("SELECT name, type FROM pragma_table_info(?, 'main')", (table,))
    return tuple(Column(name, decltype or "") for name, decltype in rows)


def source_invalid(message: str, **diagnostics: Any) -> SourceInvalid:
    return SourceInvalid(message, diagnostics=diagnostics)


def _affinity(decltype: str, strict: bool) -> str:
    """The type of a column with the affinity SQLite gives ``decltype``: its rules read the
    whole declared text (``CHAR GENERATED INT`` has INTEGER affinity, where ``parsed_type``
    reads ``CHAR``), and a STRICT table's ``ANY`` converts nothing (declared ``ANY`` in a
    temporary table, it had NUMERIC affinity: the text ``'1'`` became 1, matched no row,
    and a one-scan read left every row out, exit 0). "": no conversion. The rules are
    ``sqlite_kind``'s first four rows; every kind it refines from NUMERIC is NUMERIC."""
    text = decltype if isinstance(decltype, str) else ""
    if not text.strip() or (strict and upper_ascii(text).strip() == "ANY"):
        return ""
    return _AFFINITIES.get(sqlite_kind(text), "NUMERIC")


_AFFINITIES = {"integer": "INTEGER", "text": "TEXT", "blob": "", "real": "REAL"}


def is_strict(conn: sqlite3.Connection, schema: str, table: str) -> bool:
    """Whether ``table`` of ``schema`` is a STRICT table (none before SQLite 3.37)."""
    try:
        found = conn.execute(
            "SELECT strict FROM pragma_table_list WHERE schema = ? AND name = ?", (schema, table)
        ).fetchone()
    except sqlite3.OperationalError:
        return False
    return bool(found and found[0])


def as_stored(
    conn: sqlite3.Connection, decltype: str, values: Sequence[Any], *, strict: bool = False
) -> list[Any]:
    """``values`` as a column declared ``decltype`` (the whole declared text; ``strict``: of
    a STRICT table) stores them (its affinity converts ``'5'`` into 5 in an INTEGER column),
    through a temporary table of this connection declared with the same affinity."""
    conn.execute(f"CREATE TEMP TABLE dpone_values (value {_affinity(decltype, strict)})")
    try:
        conn.executemany("INSERT INTO temp.dpone_values VALUES (?)", [(v,) for v in values])
        return [
            row[0] for row in conn.execute("SELECT value FROM temp.dpone_values ORDER BY rowid")
        ]
    finally:
        conn.execute("DROP TABLE temp.dpone_values")
