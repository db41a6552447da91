"""staged: fill the sink's staging table, govern the staged rows, then finalize the load.

The stage is filled by the sink's engine from the source itself (``StagePulling``), or from
the load file the engine writes (``FilePulling``); otherwise, or when the engine could not
read the rows exactly, from the rows the runtime reads.
"""

from __future__ import annotations

import contextlib

from ..connectors.contract import StagePulling, Staging
from ..errors import LeaseLost
from . import PathContext

__all__ = ["staged_path"]


def staged_path(ctx: PathContext) -> int:
    sink = ctx.sink
    if not isinstance(sink, Staging):
        raise ctx.lacks("a staging table")

    if isinstance(sink, StagePulling):  # the engine stages the rows itself, or Python reads
        if not ctx.pulled_stage():
            sink.stage(ctx.row_chunks(ctx.extract()))
    else:
        files = ctx.pulled_files(per_partition=False)
        sink.stage(ctx.row_chunks(ctx.extract()) if files is None else ctx.load_files(files))
    try:
        staged = sink.staged_row_count()
        ctx.check_governance(staged)
    except BaseException:
        sink.discard_stage()
        raise
    try:
        return ctx.mutate(
            "finalize_staged_load",
            lambda: sink.finalize_staged_load(replace=ctx.replace),
            sent=staged,
        )
    except BaseException as error:
        # refused before the target (arming failed): the stage holds a copy of the rows, left
        # for the next run to replace only when another attempt may own it now (lease lost)
        started = ctx.mutation is not None and ctx.mutation.state.target_started
        if not started and not isinstance(error, LeaseLost):
            with contextlib.suppress(Exception):
                sink.discard_stage()
        raise
