"""staged: fill the sink's staging table, govern the staged rows, then finalize the load.

The stage is filled from the rows the runtime reads, or, where the sink's engine writes the
load file itself (``FilePulling``), from that file: no row then passes through Python.
"""

from __future__ import annotations

from ..connectors.contract import Staging
from . import PathContext

__all__ = ["staged_path"]


def staged_path(ctx: PathContext) -> int:
    sink = ctx.sink
    if not isinstance(sink, Staging):
        raise ctx.lacks("a staging table")

    files = ctx.pulled_files(per_partition=False)
    sink.stage(ctx.row_chunks(ctx.extract()) if files is None else ctx.load_files(files))
    try:
        ctx.check_governance(sink.staged_row_count())
    except BaseException:
        sink.discard_stage()
        raise
    return ctx.mutate(
        "finalize_staged_load", lambda: sink.finalize_staged_load(replace=ctx.replace)
    )
