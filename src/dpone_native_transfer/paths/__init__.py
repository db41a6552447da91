"""Transfer paths and the context they work in.

A path is a callable ``path(ctx: PathContext) -> int`` that does its
pre-target work (extract, stage, export, govern) and then reaches the target
exactly once, through :meth:`PathContext.mutate`. It returns the rows the
target reported loading. Paths never see the guard; the hooks fired by the
boundary give every path the same guard behaviour.
"""

from __future__ import annotations

from ..spec import MAX_GATE_ROWS, Governance
from ._context import PathContext, SourceSnapshot, TransferPath

__all__ = ["MAX_GATE_ROWS", "Governance", "PathContext", "SourceSnapshot", "TransferPath"]
