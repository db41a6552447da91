"""staged: fill the sink's staging table, govern the staged rows, then finalize the load."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..connectors.contract import Staging
from . import PathContext

__all__ = ["staged_path"]


def staged_path(ctx: PathContext) -> int:
    sink = ctx.sink
    if not isinstance(sink, Staging):
        raise ctx.lacks("a staging table")

    def counted_chunks() -> Iterator[Sequence[tuple]]:
        for index, candidate in enumerate(ctx.candidates):
            rows = 0
            for chunk in ctx.read(candidate):
                rows += len(chunk)
                yield chunk
            ctx.extracted(index, rows)

    sink.stage(ctx.row_chunks(counted_chunks()))
    try:
        ctx.check_governance(sink.staged_row_count())
    except BaseException:
        sink.discard_stage()
        raise
    return ctx.mutate(
        "finalize_staged_load", lambda: sink.finalize_staged_load(replace=ctx.replace)
    )
