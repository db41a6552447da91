"""What paths hand to connectors: the source's shape, rows, or a plan to pull rows.

These are connector-neutral; a connector for another database accepts the
same payloads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

__all__ = ["ArtifactFiles", "Column", "LoadPlan", "RowChunks", "SourceShape", "column_affinity"]


@attrs.frozen
class Column:
    name: str
    decltype: str

    @property
    def affinity(self) -> str:
        return column_affinity(self.decltype)


def column_affinity(decltype: str) -> str:
    """The neutral kind of a source column type, for sinks that must declare their own types.

    SQLite's type-affinity rules, extended with the common PostgreSQL names:
    ``integer``, ``text``, ``blob``, ``real``, ``boolean``, ``date``,
    ``timestamp``, or ``numeric`` for anything else.
    """
    upper = decltype.upper()
    for needle, kind in (
        ("INT", "integer"),
        ("SERIAL", "integer"),
        ("CHAR", "text"),
        ("CLOB", "text"),
        ("TEXT", "text"),
        ("UUID", "text"),
        ("JSON", "text"),
        ("BLOB", "blob"),
        ("BYTEA", "blob"),
        ("REAL", "real"),
        ("FLOA", "real"),
        ("DOUB", "real"),
        ("BOOL", "boolean"),
        ("TIMESTAMP", "timestamp"),
        ("DATETIME", "timestamp"),
        ("DATE", "date"),
    ):
        if needle in upper:
            return kind
    return "blob" if not upper else "numeric"


@attrs.frozen(kw_only=True)
class SourceShape:
    """The extraction's columns and the hashes that identify its query and schema."""

    columns: tuple[Column, ...]
    query_hash: str
    schema_hash: str


@attrs.frozen(kw_only=True)
class RowChunks:
    """Rows for a sink, as bounded chunks consumed once; ``replace`` means full refresh."""

    columns: tuple[Column, ...]
    chunks: Iterable[Sequence[tuple]]
    replace: bool = False


@attrs.frozen(kw_only=True)
class LoadPlan:
    """No rows: the sink pulls each partition's rows from ``source`` itself."""

    source: Any
    columns: tuple[Column, ...]
    bounds: tuple[Mapping[str, Any], ...]
    replace: bool = False


@attrs.frozen(kw_only=True)
class ArtifactFiles:
    """Verified exported files for a sink that reads them with its own engine.

    Offered by the file-artifact path to sinks whose ``artifact_format`` names
    a format they read (``"jsonl"``: one JSON object per row, keyed by column
    name). ``paths`` are absolute, in partition order.
    """

    columns: tuple[Column, ...]
    paths: tuple[str, ...]
    format: str
    replace: bool = False
