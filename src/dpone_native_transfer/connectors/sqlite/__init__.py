"""SQLite source and sink connectors (stdlib ``sqlite3``).

The modules, by concern: ``source.py`` (``SQLiteSource``: one table read in partitions),
``ranges.py`` (which key range holds a key, as SQLite orders keys), ``sink.py``
(``SQLiteSink``: one target table, each load one transaction with its ledger row),
``pulls.py`` (the sink's engine: a plan copied from a SQLite source into SQLite load files)
and ``common.py`` (what they share). What other engines do with a SQLite source they read
themselves is ``connectors/sqlite_reading.py``. The payloads they take are the
connector-neutral ones of ``payloads``.
"""

from __future__ import annotations

from .sink import SQLiteSink
from .source import SQLiteSource, integer_primary_key

__all__ = ["SQLiteSink", "SQLiteSource", "integer_primary_key"]
