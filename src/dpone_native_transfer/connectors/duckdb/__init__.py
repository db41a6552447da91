"""DuckDB sink: one table of a DuckDB file, loaded on all four transfer paths.

The modules, by concern: ``sink.py`` (``DuckDBSink``: the loads, the ledger row in each
load's transaction, reading back), ``columns.py`` (column types and carriers), ``bulk.py``
(rows and load files into DuckDB in bulk), ``scan.py`` (reading a SQLite source with
``sqlite_scan``) and ``connect.py`` (the driver, storage versions, the scanner extension).
``duckdb`` is the optional ``duckdb`` extra, imported on first use.
"""

from __future__ import annotations

from .columns import DUCKDB_TYPES, duckdb_carrier, duckdb_type
from .sink import DuckDBSink

__all__ = ["DUCKDB_TYPES", "DuckDBSink", "duckdb_carrier", "duckdb_type"]
