"""staged: fill the sink's staging table, govern the staged rows, then finalize the load.

The stage is filled by the sink's engine from the source itself (``EnginePull.stages``), or
from the load file the engine writes (``EnginePull.pull_load_files``); otherwise, or when
the engine could not read the rows exactly, from the rows the runtime reads.
"""

from __future__ import annotations

import contextlib

from ..errors import LeaseLost
from ._context import PathContext

__all__ = ["staged_path"]


def staged_path(ctx: PathContext) -> int:
    sink, engine = ctx.sink, ctx.sink.engine()
    if engine is not None and engine.stages:  # the engine stages the rows itself, or Python
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
    merging = {} if ctx.merge is None else {"merge": ctx.merge}  # a 0.1 sink takes none
    try:
        return ctx.mutate(
            "finalize_staged_load",
            sink.finalize_staged_load,
            replace=ctx.replace,
            sent=staged,
            **merging,
        )
    except BaseException as error:
        # refused before the target (arming failed): the stage holds a copy of the rows, left
        # for the next run to replace only when another attempt may own it now (lease lost)
        started = ctx.mutation is not None and ctx.mutation.state.target_started
        if not started and not isinstance(error, LeaseLost):
            with contextlib.suppress(Exception):
                sink.discard_stage()
        raise
