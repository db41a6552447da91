"""lazy-plan: no rows leave dpone; the sink's engine receives a plan and pulls the rows itself.

Where the engine would read a value otherwise than the row paths carry it (``PlanInexact``),
an edge partition's loaded rows must be left out, or a merge route's key values must be
checked (no NULL key reaches the target), the attempt carries the rows as legacy.
"""

from __future__ import annotations

from ..connectors.contract import PlanInexact, Unsupported
from ..cursor_edge import is_edge
from ..payloads import LoadPlan
from ._context import PathContext
from .legacy import legacy_path

__all__ = ["lazy_plan_path", "pull_plan", "pullable_plan"]


def lazy_plan_path(ctx: PathContext) -> int:
    engine = ctx.sink.engine()
    if engine is None:
        raise ctx.lacks("an engine that pulls the rows itself")
    if ctx.merge is not None or any(is_edge(c.partition_bounds) for c in ctx.candidates):
        # rows of an edge partition that the route already loaded must be left out, which
        # only dpone can do: this attempt carries rows (the same one target call)
        return legacy_path(ctx)
    plan = _plan(ctx)
    # Before the boundary: a plan the engine cannot pull (``Unsupported``) is a configuration
    # error, never a target call of unknown outcome (which blocks the route).
    try:
        engine.check_plan(plan)
    except PlanInexact:  # the engine would read some value otherwise: the rows are carried
        return legacy_path(ctx)  # as legacy carries them, one outcome per value on every path
    return pull_plan(ctx, plan)


def pullable_plan(ctx: PathContext) -> LoadPlan | None:
    """The candidates' plan when the sink's engine pulls it exactly as it is (``auto``'s first
    choice), checked before the target; None when there is no engine, the engine refuses
    the plan (``Unsupported``, ``PlanInexact``), or only dpone can carry the rows (an edge
    partition, a merge key to check, a batch column to fill)."""
    engine = ctx.sink.engine()
    if engine is None or ctx.merge is not None or ctx.spec.batch_column is not None:
        return None
    if any(is_edge(c.partition_bounds) for c in ctx.candidates):
        return None
    plan = _plan(ctx)
    try:
        engine.check_plan(plan)
    except (Unsupported, PlanInexact):
        return None
    return plan


def pull_plan(ctx: PathContext, plan: LoadPlan) -> int:
    """The target call of a plan ``check_plan`` accepted: the engine pulls the rows."""
    engine = ctx.sink.engine()
    assert engine is not None  # a checked plan had one
    if ctx.spec.governance.enabled:  # counting costs a source scan: only when a gate needs it
        counts = [ctx.source.count(candidate.partition_bounds) for candidate in ctx.candidates]
        for index, rows in enumerate(counts):
            ctx.extracted(index, rows, read="engine")
        ctx.check_governance(sum(counts))
    else:
        ctx.planned()
    return ctx.read_by_engine(lambda: ctx.mutate("load", engine.load_plan, plan))


def _plan(ctx: PathContext) -> LoadPlan:
    return LoadPlan(
        source=ctx.source,
        columns=ctx.shape.columns,
        bounds=tuple(candidate.partition_bounds for candidate in ctx.candidates),
        replace=ctx.replace,
    )
