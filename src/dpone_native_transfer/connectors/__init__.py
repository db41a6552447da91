"""Source and sink connectors; SQLite is the built-in pair."""

from __future__ import annotations

from .sqlite import Column, LoadPlan, RowChunks, SourceShape, SQLiteSink, SQLiteSource

__all__ = [
    "Column",
    "LoadPlan",
    "RowChunks",
    "SQLiteSink",
    "SQLiteSource",
    "SourceShape",
]
