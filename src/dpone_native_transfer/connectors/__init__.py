"""Source and sink connectors: SQLite (stdlib) and the optional engines.

DuckDB, ClickHouse and PostgreSQL are optional extras. Importing a connector
never imports its driver: that happens on first use; importing this package
imports no connector until one is named, so the core needs only
pluggy and attrs. The payloads they accept are connector-neutral and live in
``payloads``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .clickhouse import ClickHouseSink
    from .duckdb import DuckDBSink
    from .postgres import PostgresSource
    from .postgres_sink import PostgresSink
    from .sqlite import SQLiteSink, SQLiteSource

__all__ = [
    "ClickHouseSink",
    "DuckDBSink",
    "PostgresSink",
    "PostgresSource",
    "SQLiteSink",
    "SQLiteSource",
]

# Imported on first use, so ``connectors.contract`` (what the runtime needs) loads no connector.
_MODULES = {
    "ClickHouseSink": ".clickhouse",
    "DuckDBSink": ".duckdb",
    "PostgresSink": ".postgres_sink",
    "PostgresSource": ".postgres",
    "SQLiteSink": ".sqlite",
    "SQLiteSource": ".sqlite",
}


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_MODULES[name], __name__), name)
