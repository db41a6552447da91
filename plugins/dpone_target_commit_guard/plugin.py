"""The target-commit guard's hook implementations: they react, ``policy.py`` decides.

Promise (see docs/adr/0022): once a target mutation is armed, no later
automatic attempt calls the sink while any checkpoint of the route carries an
unresolved or malformed guard. A run with ``recovery = "from_target"`` may
resolve a guard first, but only as the target's own ledger and fence prove,
with an audit record. This is not exactly-once delivery.

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
    audit_record,
    automatic_resolution,
    blocked_batches,
    durably_committed,
    resolution_batch,
    route_scan_refusal,
    target_error_marker,
)

if TYPE_CHECKING:
    from dpone_native_transfer import LatestCheckpoints, TargetMutation, TargetRecovery


@hookimpl
def resume_route_scan(
    route: RouteKey, checkpoints: LatestCheckpoints, recovery: TargetRecovery | None
) -> bool:
    """Raise what ``policy.route_scan_refusal`` decides; else claim the route's guards.

    ``checkpoints`` are those of every route writing the target table. With ``recovery``
    (``recovery = "from_target"``), the blocked batches the target proves are resolved
    first, as ``policy.automatic_resolution`` says, each with an audit record.
    """
    refusal = route_scan_refusal(route, checkpoints)
    if refusal is not None and recovery is not None and _heal(recovery, checkpoints):
        refusal = route_scan_refusal(route, recovery.latest())
    if refusal is not None:
        raise refusal
    return True


def _heal(recovery: TargetRecovery, checkpoints: LatestCheckpoints) -> bool:
    """Resolve each blocked batch the target proves; whether any was resolved."""
    healed = False
    for (route, batch_id), items in blocked_batches(checkpoints).items():
        proof = recovery.prove(route, batch_id, [checkpoint for checkpoint, _ in items])
        resolution = automatic_resolution(proof.verdict, proof.heals)
        if resolution is None:
            continue
        now = recovery.now()
        resolved = resolution_batch(items, resolution, now)
        audit = audit_record(
            route,
            items,
            resolved,
            resolved_as="from_target",
            operator=recovery.operator,
            reason=f"recovery = from_target, run {recovery.run_id}: {proof.reason}",
            now=now,
            proofs={batch_id: proof.as_dict()},
            overrides=[batch_id] if proof.unlisted else (),
        )
        audit["run_id"] = recovery.run_id
        recovery.store.apply_resolution(
            route, resolved, audit, expected=[checkpoint for checkpoint, _ in items]
        )
        recovery.healed(route, batch_id, proof, len(items))
        healed = True
    return healed


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
    marker = target_error_marker(
        target_started=mutation.state.target_started, applied=getattr(error, "applied", None)
    )
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
