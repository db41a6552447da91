"""PostgresTable: a source whose table lives on a PostgreSQL server other engines read themselves.

The optional part of a source that chDB's ``postgresql()`` table function pulls from
(``EnginePull``), as ``SQLiteFile`` is for a SQLite file. A sink's engine asks
``isinstance(plan.source, PostgresTable)``; any other source is read by dpone. The login
reaches the engine as an ``EngineLogin``, whose password is left out of its ``repr`` and
of every message: an engine gets it as a query parameter, never in SQL text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from . import Source

__all__ = ["EngineLogin", "PostgresTable"]


@attrs.frozen(repr=False)
class EngineLogin:
    """Where an engine connects to read the table itself: one TCP host, a database, a login,
    and the table's schema and name (resolved, never through ``search_path``)."""

    host: str
    port: int
    database: str
    user: str
    password: str
    schema: str
    table: str
    utc: bool  # a new session of the login starts in UTC (``timestamptz`` text is UTC)
    # a new session prints a double's shortest exact text and ISO dates (the login's or
    # database's defaults: ``extra_float_digits`` at least 1, ``DateStyle`` ISO)
    exact_text: bool
    key_bytewise: bool  # the partition column's ``=`` is byte equality (a deterministic collation)

    def __repr__(self) -> str:  # never the password (nor the user's name)
        return f"EngineLogin(database={self.database!r}, table={self.schema}.{self.table})"


@runtime_checkable
class PostgresTable(Source, Protocol):
    """A PostgreSQL table another engine may read itself (chDB's ``postgresql()``)."""

    def engine_login(self) -> EngineLogin | None:
        """The login an engine reads the table with, when its client can take the source's
        connection as it is: one TCP host, no options it would drop (``sslmode``, ``options``,
        a socket path, several hosts); None otherwise (dpone reads the rows). Reads the
        catalog: the table's schema, that the server's text is UTF8, and whether a new
        session of the login starts in UTC (an engine drops a ``timestamptz``'s offset)."""

    def holds_outside(
        self,
        bounds: Sequence[Mapping[str, Any]],
        limits: Mapping[str, tuple[str, str]],
        *,
        tiny: Sequence[str] = (),
    ) -> bool:
        """Whether a row of ``bounds`` holds a value of a column of ``limits`` outside
        ``[low, high]`` (``infinity`` and BC dates are, a numeric's NaN too), or in a column
        of ``tiny`` a double that is not zero yet below the smallest normal one (``5e-324``):
        one scan of those partitions."""
