"""legacy: spool the extraction to a local file, then one ``sink.load()`` of all rows."""

from __future__ import annotations

from ..artifacts import create_private, read_chunks, write_chunks
from . import PathContext

__all__ = ["legacy_path"]


def legacy_path(ctx: PathContext) -> int:
    spool = ctx.work_dir / "legacy.spool"
    with create_private(spool) as handle:
        total, whole = write_chunks(handle, ctx.extract())
    ctx.check_governance(total)
    payload = ctx.row_chunks(read_chunks(spool, whole or None))
    return ctx.mutate("load", lambda: ctx.sink.load(payload))
