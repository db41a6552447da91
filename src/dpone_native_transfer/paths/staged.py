"""staged: fill the sink's staging table, govern the staged rows, then finalize the load."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from . import PathContext

__all__ = ["staged_path"]


def staged_path(ctx: PathContext) -> int:
    def counted_chunks() -> Iterator[Sequence[tuple]]:
        for index, candidate in enumerate(ctx.candidates):
            rows = 0
            for chunk in ctx.read(candidate):
                rows += len(chunk)
                yield chunk
            ctx.extracted(index, rows)

    ctx.sink.stage(ctx.row_chunks(counted_chunks()))
    try:
        ctx.check_governance(ctx.sink.staged_row_count())
    except BaseException:
        ctx.sink.discard_stage()
        raise
    return ctx.mutate(
        "finalize_staged_load", lambda: ctx.sink.finalize_staged_load(replace=ctx.replace)
    )
