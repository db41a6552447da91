"""BulkRead: a source that writes its partitions' rows to files itself (``Source.bulk()``).

A row path then hands the sink's engine the files instead of rows: no value becomes a Python
object on the way. Two formats: PostgreSQL's binary ``COPY``, for a target whose columns have
exactly the source's types (``write_copy_file``, ``EnginePull.copy_types``: the bytes pass
through unconverted), and Arrow (``write_arrow_files``): IPC streams whose columns have the
exact types ``connectors._arrow.exact_type`` names for their kinds (a ``numeric(12,2)`` a
``decimal128(12, 2)``, a ``timestamptz`` a UTC ``timestamp[us]``); an engine that loads
such files exactly says so (``EnginePull.reads_bulk_files``). A value that does not fit its
Arrow type exactly (an infinite date, a year past 9999, a numeric NaN) makes the read give
up: the runtime then reads the rows and carries each value as every row path does, so a
value gets the same outcome, exact or refused before the target, whichever way it came.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ...column_types import Column
    from ...payloads import LoadFile

__all__ = ["BulkRead"]


@runtime_checkable
class BulkRead(Protocol):
    """A source's bulk read of several partitions into Arrow files; reads the source only."""

    @abc.abstractmethod
    def write_arrow_files(
        self,
        bounds: Sequence[Mapping[str, Any]],
        columns: Sequence[Column],
        paths: Sequence[Path],
    ) -> tuple[list[LoadFile], list[int]] | None:
        """The rows of ``bounds`` (exactly what ``Source.read`` gives each) in new private
        files at ``paths``: all in one file (one path) or one file per bound; and each
        bound's row count, known before any target call. Read in the source's snapshot when
        one is held (``Source.snapshot``). None, with no file left, when a column's kind
        has no exact Arrow type or a value does not fit its type: the runtime reads rows."""

    @abc.abstractmethod
    def write_copy_file(
        self,
        bounds: Sequence[Mapping[str, Any]],
        columns: Sequence[Column],
        path: Path,
        types: Sequence[str],
    ) -> tuple[LoadFile, list[int]] | None:
        """The rows of ``bounds`` in one new private file at ``path`` in PostgreSQL's binary
        ``COPY`` format, each value as the source's own type holds it, and each bound's
        count: for a target whose columns have exactly ``types`` (``EnginePull.copy_types``),
        which then takes the bytes as they are. None, with no file left, when the source's
        columns are of other types or it cannot: the runtime writes Arrow files or reads
        rows."""
