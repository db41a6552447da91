"""Checkpoint store port, the route-state port and the operator port, with the built-in stores.

The checkpoint port is deliberately small and promises no atomicity:
``upsert_many`` writes in order and may fail part-way. The guard is written to
be correct under exactly that contract. The operator port is separate so the
checkpoint port stays unchanged: only operator tooling needs it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..checkpoints import PartitionCheckpoint, RouteKey

__all__ = ["CheckpointStore", "OperatorStore", "RouteStateStore"]


@runtime_checkable
class CheckpointStore(Protocol):
    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        """Record ``checkpoint`` as the latest state of its partition (history is kept)."""

    def upsert_many(self, checkpoints: Sequence[PartitionCheckpoint]) -> None:
        """Record each checkpoint in order. May raise part-way: no atomicity is promised."""

    def list_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        """Latest checkpoint of every partition ever written for ``route``, sorted by partition id.

        Independent of query, schema, run or partition identity: the route scan relies on it.
        """


@runtime_checkable
class RouteStateStore(Protocol):
    """Where a route's source state (watermark, generation) and run evidence live."""

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        """The last advanced source state of ``route``, or None before the first completed run."""

    def save_source_state(self, route: RouteKey, state: dict[str, Any]) -> None:
        """Atomically replace the source state of ``route``."""

    def record_evidence(self, route: RouteKey, run_id: str, record: dict[str, Any]) -> None:
        """Atomically write the evidence record of one run (a re-run of the same id replaces it)."""

    def list_evidence(self, route: RouteKey) -> list[dict[str, Any]]:
        """Evidence records of ``route``, oldest first."""


@runtime_checkable
class OperatorStore(CheckpointStore, Protocol):
    """What operator commands need beyond the checkpoint port: every route, and audited repairs."""

    def list_routes(self) -> list[RouteKey]:
        """Every route that has at least one checkpoint, sorted by source, target and strategy."""

    def apply_resolution(
        self, route: RouteKey, checkpoints: Sequence[PartitionCheckpoint], audit: dict[str, Any]
    ) -> int:
        """Write ``checkpoints`` (all of ``route``) and append ``audit``: both or neither.

        Returns the audit id the store assigned (ids grow with every record).
        ``audit`` must not hold ``audit_id``; ``list_audit`` adds it.
        """

    def list_audit(self, route: RouteKey) -> list[dict[str, Any]]:
        """Audit records of ``route``, oldest first, each with its ``audit_id``."""
