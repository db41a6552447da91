"""Source and sink connectors; SQLite is the built-in pair.

The payloads they accept are connector-neutral and live in ``payloads``.
"""

from __future__ import annotations

from .sqlite import SQLiteSink, SQLiteSource

__all__ = ["SQLiteSink", "SQLiteSource"]
