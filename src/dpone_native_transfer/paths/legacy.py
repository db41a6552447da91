"""legacy: spool the extraction to a local file, then one ``sink.load()`` of all rows."""

from __future__ import annotations

from ..artifacts import read_chunks, write_chunks
from . import PathContext

__all__ = ["legacy_path"]


def legacy_path(ctx: PathContext) -> int:
    spool = ctx.work_dir / "legacy.spool"
    total = 0
    with open(spool, "wb") as handle:
        for index, candidate in enumerate(ctx.candidates):
            rows, _ = write_chunks(handle, ctx.read(candidate))
            ctx.extracted(index, rows)
            total += rows
    ctx.check_governance(total)
    payload = ctx.row_chunks(read_chunks(spool))
    return ctx.mutate("load", lambda: ctx.sink.load(payload))
