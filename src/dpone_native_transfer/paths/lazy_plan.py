"""lazy-plan: no rows leave dpone; ``sink.load()`` receives a plan and pulls the rows itself."""

from __future__ import annotations

from ..payloads import LoadPlan
from . import PathContext

__all__ = ["lazy_plan_path"]


def lazy_plan_path(ctx: PathContext) -> int:
    if ctx.spec.governance.enabled:  # counting costs a source scan: only when a gate needs it
        counts = [ctx.source.count(candidate.partition_bounds) for candidate in ctx.candidates]
        for index, rows in enumerate(counts):
            ctx.extracted(index, rows)
        ctx.check_governance(sum(counts))
    plan = LoadPlan(
        source=ctx.source,
        columns=ctx.shape.columns,
        bounds=tuple(candidate.partition_bounds for candidate in ctx.candidates),
        replace=ctx.replace,
    )
    # Before the boundary: a plan the sink cannot pull is a configuration error, and must
    # not be recorded as a target call of unknown outcome (which blocks the route).
    check = getattr(ctx.sink, "check_plan", None)
    if check is not None:
        check(plan)
    return ctx.mutate("load", lambda: ctx.sink.load(plan))
