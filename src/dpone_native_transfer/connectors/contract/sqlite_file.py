"""SQLiteFile: a source whose table is a SQLite file other engines read themselves.

The optional part of a source that the built-in engines pull from (``EnginePull``):
DuckDB's and chDB's SQLite readers, SQLite's ``ATTACH``. A sink's engine asks
``isinstance(plan.source, SQLiteFile)``; any other source is read by dpone.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from . import Source

if TYPE_CHECKING:
    from ...column_types import Column

__all__ = ["SQLiteFile"]


@runtime_checkable
class SQLiteFile(Source, Protocol):
    """A source whose table lives in a SQLite file an engine can attach and read itself:
    what the built-in engines pull from (chDB and PostgreSQL pull a ``PostgresTable``)."""

    path: str

    def reader(
        self, *, live: bool = False
    ) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """A read-only connection to the file; its errors become ``SourceInvalid``. Within a
        snapshot (``Source.snapshot``), the snapshot's, unless ``live``: one that sees
        what others commit (``watching_writes``)."""

    def select_sql(
        self,
        bounds: Mapping[str, Any],
        *,
        schema: str = "main",
        columns: Sequence[Column] | None = None,
    ) -> tuple[str, tuple]:
        """SQLite text and parameters selecting one partition's ``columns`` from the file
        attached as ``schema``."""

    def count_sql(self, bounds: Mapping[str, Any], *, schema: str = "main") -> tuple[str, tuple]:
        """SQLite text and parameters counting one partition's rows in the file attached as
        ``schema`` (what ``count`` runs)."""

    def table_sql(
        self,
        bounds: Sequence[Mapping[str, Any]],
        *,
        conn: sqlite3.Connection,
        schema: str,
        columns: Sequence[Column],
        by_partition: bool = False,
    ) -> tuple[str, tuple] | None:
        """One statement selecting every partition of ``bounds`` when that is cheaper, or None.
        ``by_partition``: only when it is one scan of the table, its rows ordered by
        partition value (then as they are read)."""

    def range_route(
        self, conn: sqlite3.Connection, schema: str, bounds: Sequence[Mapping[str, Any]]
    ) -> Callable[[Any], int | None] | None:
        """Which of ``bounds`` (key ranges and the NULL key's partition) holds a key value, as
        SQLite's ``>=`` and ``<`` on the file attached as ``schema`` decide; None when each
        range's own count is cheaper (an index seeks it) or Python cannot tell."""
