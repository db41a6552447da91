"""Source and sink connectors: SQLite (stdlib) and the optional engines.

DuckDB, ClickHouse and PostgreSQL are optional extras. Importing a connector
never imports its driver: that happens on first use, so the core needs only
pluggy and attrs. The payloads they accept are connector-neutral and live in
``payloads``.
"""

from __future__ import annotations

from .clickhouse import ClickHouseSink
from .duckdb import DuckDBSink
from .postgres import PostgresSource
from .sqlite import SQLiteSink, SQLiteSource

__all__ = ["ClickHouseSink", "DuckDBSink", "PostgresSource", "SQLiteSink", "SQLiteSource"]
