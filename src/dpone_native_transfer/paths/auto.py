"""auto: per table, the path measured fastest for its source and target, chosen before the
target (docs/connectors.md, "Choosing a path").

1. ``lazy-plan``, when the sink's engine accepts the plan (``check_plan``: it reads this
   source itself, every value exactly): no row passes through Python.
2. ``legacy``, when the source writes the rows in bulk files the engine loads
   (``Source.bulk()``, ``EnginePull.reads_bulk_files``): PostgreSQL's own ``COPY``. (staged
   fills its stage from the same files, but for an engine that stages rows itself, chDB,
   which would have staged read them in Python.)
3. ``staged`` otherwise: dpone reads the rows and the target call is the stage's swap.

A choice refused by its check falls to the next before anything reaches the target; the
path that ran is reported (``PathContext.path_name``: the evidence, the run's summary).
"""

from __future__ import annotations

from ..cursor_edge import is_edge
from ._context import PathContext
from .lazy_plan import pull_plan, pullable_plan
from .legacy import legacy_path
from .staged import staged_path

__all__ = ["auto_path", "bulk_readable"]


def auto_path(ctx: PathContext) -> int:
    plan = pullable_plan(ctx)
    if plan is not None:
        ctx.path_name = "lazy-plan"
        return pull_plan(ctx, plan)
    if bulk_readable(ctx):
        ctx.path_name = "legacy"
        return legacy_path(ctx)
    ctx.path_name = "staged"
    return staged_path(ctx)


def bulk_readable(ctx: PathContext) -> bool:
    """Whether the source reads the rows in bulk into files the sink's engine loads, as
    ``_bulk.bulk_files`` does them: not where only dpone can carry the rows."""
    engine = ctx.sink.engine()
    if engine is None or not engine.reads_bulk_files or ctx.source.bulk() is None:
        return False
    if ctx.batch_value is not None or ctx.merge is not None:
        return False
    return not any(is_edge(c.partition_bounds) for c in ctx.candidates)
