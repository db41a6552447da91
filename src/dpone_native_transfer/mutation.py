"""The hook contract's one argument: a ``TargetMutation``, an attempt to mutate the target.

What ``hookspecs.py`` hands its target hooks, beside them: the boundary that fires
the hooks (``boundary.py``), the built-in lifecycle and every plugin import it from
here, and it imports only records.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import attrs

from .checkpoints import PartitionCheckpoint, PartitionCheckpointStatus, RouteKey
from .clock import read_clock
from .stores import CheckpointStore

__all__ = ["AttemptState", "TargetMutation"]


@attrs.define(eq=False)
class AttemptState:
    """What this process knows about the attempt; set by the boundary and the plugins."""

    batch_id: str | None = None
    armed: bool = False
    target_started: bool = False
    target_succeeded: bool = False
    committed_ids: frozenset[str] = frozenset()


@attrs.frozen(kw_only=True, eq=False)
class TargetMutation:
    """What the target hooks see: one attempt to mutate the target for a set of partitions.

    ``candidates`` are the active partitions' checkpoints as extracted (status
    ``exported``, with rows and diagnostics such as ``artifact_sha256``); a
    plugin derives every checkpoint batch it writes from them with :meth:`batch`.
    """

    route: RouteKey
    run_id: str
    path: str
    operation: str
    candidates: tuple[PartitionCheckpoint, ...]
    store: CheckpointStore
    clock: Callable[[], datetime]
    state: AttemptState = attrs.field(factory=AttemptState)

    @property
    def partition_ids(self) -> tuple[str, ...]:
        return tuple(candidate.partition_id for candidate in self.candidates)

    def transition_time(self) -> datetime:
        """Read the injected clock once for one checkpoint batch."""
        return read_clock(self.clock, route=self.route, run_id=self.run_id)

    def batch(
        self,
        status: PartitionCheckpointStatus,
        *,
        at: datetime,
        diagnostics: Mapping[str, Any] | None = None,
    ) -> tuple[PartitionCheckpoint, ...]:
        """One checkpoint per candidate, all stamped ``at``; terminal ones end ``at`` too.

        Each is ``attrs.evolve(candidate, ...)`` spelled out: evolve looks every
        field up by name, for every checkpoint (figures: docs/performance.md,
        fix 53). A test holds the two equal, field by field.
        """
        completed_at = None if status is PartitionCheckpointStatus.EXPORTED else at
        extra = dict(diagnostics or {})
        return tuple(
            PartitionCheckpoint(
                partition_id=candidate.partition_id,
                route=candidate.route,
                status=status,
                run_id=candidate.run_id,
                query_hash=candidate.query_hash,
                schema_hash=candidate.schema_hash,
                partition_bounds=candidate.partition_bounds,
                started_at=at,
                completed_at=completed_at,
                rows_exported=candidate.rows_exported,
                diagnostics={**candidate.diagnostics, **extra},
            )
            for candidate in self.candidates
        )
