"""The target-commit guard's hook implementations: they react, ``policy.py`` decides.

Promise (bounded, see docs/adr/0022): once a target mutation is armed, no
later automatic attempt calls the sink while any checkpoint of the route
carries an unresolved or malformed guard. This is not a journal, a target
fence or exactly-once delivery.

Each hook does what the runtime's moment calls for: arm the batch, promote
it, or write the failure marker ``policy`` names, and at the route scan raise
the refusal ``policy`` returns. What blocks, and what a failure leaves
behind, is decided only in ``policy.py``.

This module is itself the plugin: the entry point names the module, whose
functions are stateless; per-attempt state lives on the ``TargetMutation``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dpone_native_transfer import (
    GUARD_DIAGNOSTICS_KEY,
    InternalInvariantBroken,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    as_latest,
    hookimpl,
)

from .payload import GuardPhase, batch_id_for, build_guard
from .policy import (
    INCOMPLETE_COMMIT,
    Marker,
    durably_committed,
    route_scan_refusal,
    target_error_marker,
)

if TYPE_CHECKING:
    from dpone_native_transfer import LatestCheckpoints, TargetMutation


@hookimpl
def resume_route_scan(route: RouteKey, checkpoints: LatestCheckpoints) -> bool:
    """Raise what ``policy.route_scan_refusal`` decides; else claim the route's guards.

    ``checkpoints`` are those of every route writing the target table.
    """
    refusal = route_scan_refusal(route, checkpoints)
    if refusal is not None:
        raise refusal
    return True


def _armed_batch(mutation: TargetMutation) -> str:
    """The batch id the guard armed (after ``before_target_mutation``, always set)."""
    if mutation.state.batch_id is None:
        raise InternalInvariantBroken("a target hook ran before the guard armed the batch")
    return mutation.state.batch_id


def _write_markers(mutation: TargetMutation, partition_ids: set[str], marker: Marker) -> None:
    """Best effort: mark those partitions FAILED as ``marker`` says. Never raises.

    A failure here leaves whatever is durable in place; an armed guard that
    survives keeps blocking, which is the safe outcome.
    """
    if not partition_ids:
        return
    diagnostics = {
        GUARD_DIAGNOSTICS_KEY: build_guard(marker.phase, _armed_batch(mutation)),
        "error": marker.code.value,
    }
    try:
        batch = mutation.batch(
            PartitionCheckpointStatus.FAILED, at=mutation.transition_time(), diagnostics=diagnostics
        )
        mutation.store.upsert_many([cp for cp in batch if cp.partition_id in partition_ids])
    except Exception:
        return


@hookimpl
def before_target_mutation(mutation: TargetMutation) -> None:
    """Arm every active partition in one batch; without the whole batch, no target call.

    A failed or partial arm raises the store's error: that veto reaches
    ``on_target_error`` with ``target_started`` False, which marks the batch
    as ``policy.target_error_marker`` says.
    """
    mutation.state.batch_id = batch_id_for(mutation.run_id, mutation.partition_ids)
    guard = build_guard(GuardPhase.ARMED, mutation.state.batch_id)
    armed = mutation.batch(
        PartitionCheckpointStatus.EXPORTED,
        at=mutation.transition_time(),
        diagnostics={GUARD_DIAGNOSTICS_KEY: guard},
    )
    mutation.store.upsert_many(armed)
    mutation.state.armed = True


@hookimpl
def on_target_error(mutation: TargetMutation, error: BaseException) -> None:
    """Mark the batch as ``policy.target_error_marker`` says for how far the attempt got."""
    if mutation.state.batch_id is None:
        return  # vetoed before the guard armed anything: nothing of ours to mark
    marker = target_error_marker(target_started=mutation.state.target_started)
    _write_markers(mutation, set(mutation.partition_ids), marker)


@hookimpl
def after_target_success(mutation: TargetMutation, result: Any) -> None:
    """Promote every candidate in one batch; on a partial write, reconcile, then re-raise."""
    committed = mutation.batch(
        PartitionCheckpointStatus.COMMITTED,
        at=mutation.transition_time(),
        diagnostics={
            GUARD_DIAGNOSTICS_KEY: build_guard(
                GuardPhase.CHECKPOINT_COMMITTED, _armed_batch(mutation)
            )
        },
    )
    try:
        mutation.store.upsert_many(committed)
    except BaseException:
        _reconcile_partial_commit(mutation, committed)
        raise
    mutation.state.committed_ids = frozenset(mutation.partition_ids)


def _reconcile_partial_commit(
    mutation: TargetMutation, committed: Sequence[PartitionCheckpoint]
) -> None:
    """Keep what ``policy.durably_committed`` counts; mark the rest incomplete; never raise.

    If the store cannot be read, nothing is written: the durable armed guards
    keep blocking, which is the safe outcome.
    """
    try:
        latest = as_latest(mutation.store.list_latest(mutation.route))
        durable = durably_committed(
            committed, latest.checkpoints([cp.partition_id for cp in committed])
        )
    except Exception:
        return
    mutation.state.committed_ids = durable
    _write_markers(mutation, set(mutation.partition_ids) - durable, INCOMPLETE_COMMIT)
