"""staged: fill the sink's staging table, govern the staged rows, then finalize the load."""

from __future__ import annotations

from ..connectors.contract import Staging
from . import PathContext

__all__ = ["staged_path"]


def staged_path(ctx: PathContext) -> int:
    sink = ctx.sink
    if not isinstance(sink, Staging):
        raise ctx.lacks("a staging table")

    sink.stage(ctx.row_chunks(ctx.extract()))
    try:
        ctx.check_governance(sink.staged_row_count())
    except BaseException:
        sink.discard_stage()
        raise
    return ctx.mutate(
        "finalize_staged_load", lambda: sink.finalize_staged_load(replace=ctx.replace)
    )
