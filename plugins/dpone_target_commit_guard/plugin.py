"""The target-commit guard: hook implementations; all guard policy lives here.

Promise (bounded, see docs/adr/0022): once a target mutation is armed, no
later automatic attempt calls the sink while any checkpoint of the route
carries an unresolved or malformed guard. This is not a journal, a target
fence or exactly-once delivery.

This module is itself the plugin: the entry point names the module, whose
functions are stateless; per-attempt state lives on the ``TargetMutation``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from dpone_native_transfer.checkpoints import (
    GUARD_DIAGNOSTICS_KEY,
    FailureCode,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
)
from dpone_native_transfer.errors import ManualReconciliationRequired, TargetCommitGuardInvalid
from dpone_native_transfer.hookspecs import hookimpl
from dpone_native_transfer.latest import as_latest

from .operator import Finding, blocked_partitions, scan_hint
from .payload import GuardPhase, batch_id_for, build_guard

if TYPE_CHECKING:
    from dpone_native_transfer.boundary import TargetMutation

_SHOWN_IN_MESSAGE = 5


@hookimpl
def resume_route_scan(route: RouteKey, checkpoints: Sequence[PartitionCheckpoint]) -> bool:
    """Stop the run on any malformed guard, else on any unresolved one; malformed wins.

    ``checkpoints`` are those of every route writing the target table, so a guard
    left by a route of another strategy, source or spelling blocks this one too.
    The classification is ``operator.blocked_partitions``, the one ``guard scan`` shows.
    """
    findings = blocked_partitions(checkpoints)
    malformed = [
        {"partition_id": f.partition_id, "problem": f.problem} for f in findings if f.malformed
    ]
    unresolved: list[dict[str, Any]] = [
        {
            "partition_id": f.partition_id,
            "phase": None if f.phase is None else f.phase.value,  # set unless malformed
            "batch_id": f.batch_id,
            "status": f.status.value,
        }
        for f in findings
        if not f.malformed
    ]
    where = _blocking_routes(route, findings)
    if malformed:
        raise TargetCommitGuardInvalid(
            f"route {route.label} has {len(malformed)} partition(s) with a malformed "
            f"target-commit guard{where.text} ({_first_ids(malformed)}); no target I/O was "
            f"attempted; inspect it with: {scan_hint(where.first)}",
            diagnostics={"route": route.as_dict(), "partitions": malformed, **where.diagnostics},
        )
    if unresolved:
        phases = sorted({str(item["phase"]) for item in unresolved})
        batches = sorted({str(item["batch_id"]) for item in unresolved})
        raise ManualReconciliationRequired(
            f"route {route.label} has {len(unresolved)} partition(s) whose target "
            f"outcome is unresolved{where.text} (phases: {', '.join(phases)}; partitions: "
            f"{_first_ids(unresolved)}); the target was not called. Reconcile the target with "
            "the checkpoints before the route can run again; "
            f"inspect it with: {scan_hint(where.first)}",
            diagnostics={
                "route": route.as_dict(),
                "phases": phases,
                "batch_ids": batches,
                "partitions": unresolved,
                **where.diagnostics,
            },
        )
    return True


@attrs.frozen
class _Where:
    text: str
    first: RouteKey
    diagnostics: dict[str, Any]


def _blocking_routes(route: RouteKey, findings: Sequence[Finding]) -> _Where:
    """Say so when the blocking guards belong to other routes writing the same target table."""
    others = sorted(
        {f.route for f in findings if f.route.as_dict() != route.as_dict()},
        key=lambda other: (other.source_table, str(other.strategy)),
    )
    if not others:
        return _Where("", route, {})
    names = ", ".join(other.label for other in others)
    return _Where(
        f" left by route(s) writing the same target table ({names})",
        others[0],
        {"blocking_routes": [other.as_dict() for other in others]},
    )


def _armed_batch(mutation: TargetMutation) -> str:
    """The batch id the guard armed (after ``before_target_mutation``, always set)."""
    if mutation.state.batch_id is None:
        raise RuntimeError("a target hook ran before the guard armed the batch")  # a bug
    return mutation.state.batch_id


def _first_ids(items: Sequence[Mapping[str, Any]]) -> str:
    ids = [item["partition_id"] for item in items[:_SHOWN_IN_MESSAGE]]
    more = len(items) - len(ids)
    return ", ".join(ids) + (f" and {more} more" if more else "")


def _write_markers(
    mutation: TargetMutation, partition_ids: set[str], phase: GuardPhase, code: FailureCode
) -> None:
    """Best effort: mark those partitions FAILED with ``phase``. Never raises.

    A failure here leaves whatever is durable in place; an armed guard that
    survives keeps blocking, which is the safe outcome.
    """
    if not partition_ids:
        return
    diagnostics = {
        GUARD_DIAGNOSTICS_KEY: build_guard(phase, _armed_batch(mutation)),
        "error": code.value,
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
    ``failed_before_target``.
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
    """Mark the batch ``target_outcome_unknown``, or ``failed_before_target`` if never begun."""
    if mutation.state.batch_id is None:
        return  # vetoed before the guard armed anything: nothing of ours to mark
    if mutation.state.target_started:
        phase, code = GuardPhase.TARGET_OUTCOME_UNKNOWN, FailureCode.TARGET_CALL_FAILED
    else:
        phase, code = GuardPhase.FAILED_BEFORE_TARGET, FailureCode.TARGET_NOT_STARTED
    _write_markers(mutation, set(mutation.partition_ids), phase, code)


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
    """Keep exact durable committed candidates; mark the rest incomplete; never raise.

    If the store cannot be read, nothing is written: the durable armed guards
    keep blocking, which is the safe outcome.
    """
    try:
        latest = as_latest(mutation.store.list_latest(mutation.route))
        stored = latest.checkpoints([cp.partition_id for cp in committed])
        durable = {cp.partition_id for cp in committed if stored.get(cp.partition_id) == cp}
    except Exception:
        return
    mutation.state.committed_ids = frozenset(durable)
    _write_markers(
        mutation,
        set(mutation.partition_ids) - durable,
        GuardPhase.CHECKPOINT_INCOMPLETE,
        FailureCode.CHECKPOINT_COMMIT_FAILED,
    )
