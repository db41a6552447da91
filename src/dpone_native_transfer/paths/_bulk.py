"""A source's bulk read: the candidates' rows in files the source writes itself, for an engine
that loads them (``Source.bulk()``, ``BulkRead``; ``EnginePull.reads_bulk_files``), where no
engine pull exists (``_files.FileMaker.pulled_files`` asks here next)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeAlias

from ..artifacts import open_files_allowed
from ..cursor_edge import is_edge
from ..payloads import LoadFile

if TYPE_CHECKING:
    from ..connectors.contract.bulk import BulkRead
    from ._context import PathContext

__all__ = ["bulk_files"]

Written: TypeAlias = tuple[list[LoadFile], Sequence[int]]  # the files and each candidate's rows


def bulk_files(
    ctx: PathContext,
    *,
    per_partition: bool,
    around: Callable[[Callable[[], Written | None]], Written | None] = lambda write: write(),
) -> list[LoadFile] | None:
    """The candidates' rows in files the source writes itself, in bulk, in the attempt's
    snapshot (``Source.bulk()``, ``BulkRead``), for an engine that loads them
    (``EnginePull.reads_bulk_files``): one file of the source's own binary ``COPY``
    bytes where the engine's columns are of the source's types (``_copy_file``), else
    Arrow files, one or one per candidate; each candidate's count recorded. None when
    the source or the engine cannot, an edge partition's loaded rows must be left out,
    the batch column added or a merge key checked (only dpone can), or a value does not
    fit its Arrow type: the path then reads rows and carries each value. ``around``: what
    the write runs inside once the files will be written (the cursor edge's top reads,
    which must not read an edge partition: they would count its loaded rows as seen)."""
    engine, bulk = ctx.sink.engine(), ctx.source.bulk()
    if engine is None or bulk is None or not engine.reads_bulk_files:
        return None
    if ctx.batch_value is not None or ctx.merge is not None:
        return None  # the batch column and a merge key's check are dpone's, as it reads
    if any(is_edge(c.partition_bounds) for c in ctx.candidates):
        return None
    if per_partition and len(ctx.candidates) > open_files_allowed():
        return None

    def write() -> Written | None:
        if not per_partition:
            copied = _copy_file(ctx, bulk)
            if copied is not None:
                return copied
        names = [c.partition_id for c in ctx.candidates] if per_partition else ["load"]
        paths = [ctx.work_dir / f"{name}.arrows" for name in names]
        bounds = [candidate.partition_bounds for candidate in ctx.candidates]
        return bulk.write_arrow_files(bounds, ctx.shape.columns, paths)

    written = around(write)
    if written is None:
        return None
    files, counts = written
    ctx.extracted_files(files, counts, read="bulk", per_partition=per_partition)
    return files


def _copy_file(ctx: PathContext, bulk: BulkRead) -> Written | None:
    """The candidates' rows in one file of PostgreSQL's binary ``COPY`` format, the
    source's bytes, for an engine that loads such files into columns of exactly the
    source's types (``EnginePull.copy_types``, ``BulkRead.write_copy_file``), and each
    candidate's count. None when either cannot: Arrow files are next."""
    engine = ctx.sink.engine()
    columns = ctx.shape.columns
    types = None if engine is None else engine.copy_types(columns)
    if not types:
        return None
    bounds = [candidate.partition_bounds for candidate in ctx.candidates]
    written = bulk.write_copy_file(bounds, columns, ctx.work_dir / "load.pgcopy", types)
    if written is None:
        return None
    file, counts = written
    return [file], counts
