"""The v1 guard payload kept in ``PartitionCheckpoint.diagnostics["target_commit_guard"]``.

Reading is strict and fails closed: an unknown schema version, an extra or
missing key, a wrong type, an unknown phase or a phase that contradicts the
checkpoint status is *malformed*, never ignored. What a phase means for the
route (whether it blocks) is ``policy.py``'s to say.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any

import attrs

from dpone_native_transfer import (
    GUARD_DIAGNOSTICS_KEY,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    batch_id_for,  # attempt correlation only: SHA-256 over the run id and sorted partition ids
)

__all__ = [
    "RECOVERY",
    "SCHEMA_VERSION",
    "GuardPhase",
    "GuardRecord",
    "MalformedGuard",
    "batch_id_for",
    "build_guard",
    "judge_guard",
    "read_guard",
]

SCHEMA_VERSION = "dpone.native_transfer.target_commit_guard.v1"
RECOVERY = "manual_reconciliation_required"
_BATCH_ID = re.compile(r"sha256:[0-9a-f]{64}")
_KEYS = frozenset({"schema_version", "checkpoint_batch_id", "phase", "recovery"})


class GuardPhase(StrEnum):
    ARMED = "armed"
    FAILED_BEFORE_TARGET = "failed_before_target"
    CHECKPOINT_COMMITTED = "checkpoint_committed"
    CHECKPOINT_INCOMPLETE = "checkpoint_incomplete"
    TARGET_OUTCOME_UNKNOWN = "target_outcome_unknown"


# The only checkpoint status each phase may appear with.
PHASE_STATUS = {
    GuardPhase.ARMED: PartitionCheckpointStatus.EXPORTED,
    GuardPhase.FAILED_BEFORE_TARGET: PartitionCheckpointStatus.FAILED,
    GuardPhase.CHECKPOINT_COMMITTED: PartitionCheckpointStatus.COMMITTED,
    GuardPhase.CHECKPOINT_INCOMPLETE: PartitionCheckpointStatus.FAILED,
    GuardPhase.TARGET_OUTCOME_UNKNOWN: PartitionCheckpointStatus.FAILED,
}


class MalformedGuard(ValueError):
    """A guard that cannot be trusted; ``problem`` is a bounded code, safe to report."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


@attrs.frozen
class GuardRecord:
    """A well-formed guard: its phase and the batch id it was armed with."""

    phase: GuardPhase
    batch_id: str


def build_guard(phase: GuardPhase, batch_id: str) -> dict[str, str]:
    return {
        "schema_version": SCHEMA_VERSION,
        "checkpoint_batch_id": batch_id,
        "phase": phase.value,
        "recovery": RECOVERY,
    }


def read_guard(checkpoint: PartitionCheckpoint) -> GuardRecord | None:
    """The checkpoint's guard, ``None`` for a legacy checkpoint, or ``MalformedGuard``."""
    if GUARD_DIAGNOSTICS_KEY not in checkpoint.diagnostics:
        return None
    return judge_guard(checkpoint.status, checkpoint.diagnostics[GUARD_DIAGNOSTICS_KEY])


def judge_guard(status: PartitionCheckpointStatus, guard: Any) -> GuardRecord:
    """Read a present guard map; it depends on nothing but the map and the status."""
    if not isinstance(guard, dict):
        raise MalformedGuard("not_an_object")
    if guard.get("schema_version") != SCHEMA_VERSION:
        raise MalformedGuard("unknown_schema_version")
    if set(guard) != _KEYS:
        raise MalformedGuard("unexpected_keys")
    batch_id = guard["checkpoint_batch_id"]
    if not isinstance(batch_id, str) or not _BATCH_ID.fullmatch(batch_id):
        raise MalformedGuard("invalid_batch_id")
    if guard["recovery"] != RECOVERY:
        raise MalformedGuard("invalid_recovery")
    phase_value = guard["phase"]
    if not isinstance(phase_value, str) or phase_value not in GuardPhase._value2member_map_:
        raise MalformedGuard("unsupported_phase")
    phase = GuardPhase(phase_value)
    if PHASE_STATUS[phase] is not status:
        raise MalformedGuard("status_phase_mismatch")
    return GuardRecord(phase, batch_id)
