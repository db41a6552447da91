"""What paths hand to connectors: the source's shape, rows, or a plan to pull rows.

These are connector-neutral; a connector for another database accepts the
same payloads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

__all__ = ["Column", "LoadPlan", "RowChunks", "SourceShape"]


@attrs.frozen
class Column:
    name: str
    decltype: str


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
