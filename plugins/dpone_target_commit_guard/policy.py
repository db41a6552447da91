"""The guard's policy: what blocks a route, what the guard records when an attempt fails,
and how an operator's repair is written.

The one home of these decisions. Pure functions over checkpoints, shared by
the route scan (``plugin.py``, which only reacts to the hooks: it writes the
markers decided here and raises the refusal decided here) and the
``dpone-transfer guard`` commands (``commands.py``), so what the operator is
shown and what the runtime refuses can never disagree. Nothing here repairs
anything on its own: every repair is an explicit, audited act, of an operator or, with
``recovery = "from_target"``, of a run the target's own proof allows
(``automatic_resolution``).
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

import attrs

from dpone_native_transfer import (
    GUARD_DIAGNOSTICS_KEY,
    ConfigInvalid,
    FailureCode,
    LatestCheckpoints,
    ManualReconciliationRequired,
    NativeTransferError,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    TargetCommitGuardInvalid,
    format_timestamp,
)
from dpone_native_transfer.wording import PROG

from .payload import (
    PHASE_STATUS,
    GuardPhase,
    MalformedGuard,
    batch_id_for,
    build_guard,
    judge_guard,
    read_guard,
)

__all__ = [
    "INCOMPLETE_COMMIT",
    "ROLLED_BACK",
    "UNRESOLVED_PHASES",
    "Finding",
    "Marker",
    "Resolution",
    "audit_record",
    "automatic_resolution",
    "blocked_batches",
    "blocked_partitions",
    "durably_committed",
    "inspect_checkpoint",
    "resolution_batch",
    "route_scan_refusal",
    "scan_hint",
    "select_blocked",
    "target_error_marker",
]

# Phases after which the target's state cannot be inferred: every later run must stop.
UNRESOLVED_PHASES = frozenset(
    {GuardPhase.ARMED, GuardPhase.CHECKPOINT_INCOMPLETE, GuardPhase.TARGET_OUTCOME_UNKNOWN}
)
_SHOWN_IN_MESSAGE = 5


class Resolution(StrEnum):
    """What the operator found in the target (``--as``)."""

    COMMITTED = "committed"  # the rows are in the target
    FAILED_BEFORE_TARGET = "failed_before_target"  # they are not: a retry may load them

    @property
    def phase(self) -> GuardPhase:
        if self is Resolution.COMMITTED:
            return GuardPhase.CHECKPOINT_COMMITTED
        return GuardPhase.FAILED_BEFORE_TARGET


@attrs.frozen(kw_only=True)
class Finding:
    """The guard state of one latest checkpoint: only identities, never values or error text.

    ``problem`` is the bounded code of a malformed guard (then ``phase`` and
    ``batch_id`` are None); a legacy checkpoint has neither phase nor problem.
    """

    route: RouteKey
    partition_id: str
    status: PartitionCheckpointStatus
    phase: GuardPhase | None
    batch_id: str | None
    problem: str | None
    started_at: datetime | None
    completed_at: datetime | None

    @property
    def malformed(self) -> bool:
        return self.problem is not None

    @property
    def unresolved(self) -> bool:
        return self.phase in UNRESOLVED_PHASES

    @property
    def blocked(self) -> bool:
        """True when this checkpoint stops every run of its route."""
        return self.malformed or self.unresolved

    def guard_label(self, malformed: str = "malformed:") -> str:
        """The phase, ``legacy, no guard``, or ``malformed`` followed by the problem code."""
        if self.problem is not None:
            return malformed + self.problem
        return "legacy, no guard" if self.phase is None else self.phase.value

    def as_dict(self) -> dict[str, Any]:
        """JSON-safe; the keys of ``guard scan --json``."""
        return {
            "route": self.route.as_dict(),
            "partition_id": self.partition_id,
            "status": self.status.value,
            "phase": None if self.phase is None else self.phase.value,
            "problem": self.problem,
            "batch_id": self.batch_id,
            "started_at": format_timestamp(self.started_at),
            "completed_at": format_timestamp(self.completed_at),
        }


def inspect_checkpoint(checkpoint: PartitionCheckpoint) -> Finding:
    """Read one checkpoint's guard without raising: malformed guards become a problem code."""
    try:
        record = read_guard(checkpoint)
    except MalformedGuard as bad:
        return _finding(checkpoint, None, None, bad.problem)
    if record is None:
        return _finding(checkpoint, None, None, None)
    return _finding(checkpoint, record.phase, record.batch_id, None)


def blocked_partitions(checkpoints: Iterable[PartitionCheckpoint]) -> list[Finding]:
    """Every checkpoint whose guard is malformed or unresolved, in the given order.

    The guard is read first; a ``Finding`` is built only for a blocked checkpoint.
    Given ``LatestCheckpoints``, each (status, guard) group is judged once from
    the store's summary and only the checkpoints of doubtful groups are decoded
    and read one by one, which gives the same findings.
    """
    if isinstance(checkpoints, LatestCheckpoints):
        latest = checkpoints
        doubtful = (
            checkpoint
            for status, text in latest.guard_groups()
            if not _group_clear(status, text)
            for checkpoint in latest.in_group(status, text)
        )
        checkpoints = sorted(doubtful, key=lambda checkpoint: checkpoint.partition_id)
    findings = []
    for checkpoint in checkpoints:
        try:
            record = read_guard(checkpoint)
        except MalformedGuard as bad:
            findings.append(_finding(checkpoint, None, None, bad.problem))
            continue
        if record is not None and record.phase in UNRESOLVED_PHASES:
            findings.append(_finding(checkpoint, record.phase, record.batch_id, None))
    return findings


def blocked_batches(
    checkpoints: Iterable[PartitionCheckpoint],
) -> dict[tuple[RouteKey, str], list[tuple[PartitionCheckpoint, Finding]]]:
    """The blocked checkpoints with a well-formed guard, by route and guard batch id: what a
    proof of the target may resolve (a malformed guard names no batch it can prove)."""
    findings = blocked_partitions(checkpoints)
    wanted = {(f.route, f.partition_id) for f in findings if not f.malformed}
    batches: dict[tuple[RouteKey, str], list[tuple[PartitionCheckpoint, Finding]]] = {}
    if not wanted:
        return batches
    by_key = {(f.route, f.partition_id): f for f in findings}
    for checkpoint in checkpoints:  # decoded only when something blocks
        finding = by_key.get((checkpoint.route, checkpoint.partition_id))
        if finding is not None and not finding.malformed and finding.batch_id is not None:
            batches.setdefault((finding.route, finding.batch_id), []).append((checkpoint, finding))
    return batches


def _group_clear(status: str, text: str) -> bool:
    """True only when every checkpoint with this status and guard text is certainly clear."""
    try:
        record = judge_guard(PartitionCheckpointStatus(status), LatestCheckpoints.parse_guard(text))
    except ValueError:  # an unknown status, bad JSON, or a MalformedGuard
        return False
    return record.phase not in UNRESOLVED_PHASES


def _finding(
    checkpoint: PartitionCheckpoint,
    phase: GuardPhase | None,
    batch_id: str | None,
    problem: str | None,
) -> Finding:
    return Finding(
        route=checkpoint.route,
        partition_id=checkpoint.partition_id,
        status=checkpoint.status,
        phase=phase,
        batch_id=batch_id,
        problem=problem,
        started_at=checkpoint.started_at,
        completed_at=checkpoint.completed_at,
    )


def route_scan_refusal(
    route: RouteKey, checkpoints: Iterable[PartitionCheckpoint]
) -> NativeTransferError | None:
    """What stops a run of ``route`` before the target, or None when nothing blocks it.

    Any malformed guard refuses with ``TargetCommitGuardInvalid``, else any
    unresolved one with ``ManualReconciliationRequired``: malformed wins.
    ``checkpoints`` are those of every route writing the target table, so a guard
    left by a route of another strategy, source or spelling blocks this one too.
    The findings are ``blocked_partitions``, the ones ``guard scan`` shows.
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
        return TargetCommitGuardInvalid(
            f"route {route.label} has {len(malformed)} partition(s) with a malformed "
            f"target-commit guard{where.text} ({_first_ids(malformed)}); no target I/O was "
            f"attempted; inspect it with: {scan_hint(where.first)}",
            diagnostics={"route": route.as_dict(), "partitions": malformed, **where.diagnostics},
        )
    if unresolved:
        phases = sorted({str(item["phase"]) for item in unresolved})
        batches = sorted({str(item["batch_id"]) for item in unresolved})
        return ManualReconciliationRequired(
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
    return None


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


def _first_ids(items: Sequence[Mapping[str, Any]]) -> str:
    ids = [item["partition_id"] for item in items[:_SHOWN_IN_MESSAGE]]
    more = len(items) - len(ids)
    return ", ".join(ids) + (f" and {more} more" if more else "")


@attrs.frozen
class Marker:
    """What the guard records on the partitions of a failed attempt: a phase and a failure code."""

    phase: GuardPhase
    code: FailureCode


def target_error_marker(*, target_started: bool, applied: bool | None = None) -> Marker:
    """A target call that raised leaves its outcome unknown, which blocks; a veto does not,
    nor a call whose error proves it rolled back (``applied`` False: the sink's own word)."""
    if not target_started:
        return Marker(GuardPhase.FAILED_BEFORE_TARGET, FailureCode.TARGET_NOT_STARTED)
    if applied is False:
        return ROLLED_BACK
    return Marker(GuardPhase.TARGET_OUTCOME_UNKNOWN, FailureCode.TARGET_CALL_FAILED)


# The target call raised after rolling its transaction back (its fence, a row-count check).
ROLLED_BACK = Marker(GuardPhase.FAILED_BEFORE_TARGET, FailureCode.TARGET_ROLLED_BACK)


def automatic_resolution(verdict: str, heals: bool) -> Resolution | None:
    """How a run with ``recovery = "from_target"`` resolves a blocked batch the target proved
    (``verdict`` and ``heals`` of its ``Proof``), or None: it stays blocked for a person."""
    if not heals:
        return None
    return {"applied": Resolution.COMMITTED, "not_applied": Resolution.FAILED_BEFORE_TARGET}.get(
        verdict
    )


# The target committed but the promotion to COMMITTED was written only in part: what is
# not durable as committed blocks until an operator compares it with the target.
INCOMPLETE_COMMIT = Marker(GuardPhase.CHECKPOINT_INCOMPLETE, FailureCode.CHECKPOINT_COMMIT_FAILED)


def durably_committed(
    committed: Sequence[PartitionCheckpoint], stored: Mapping[str, PartitionCheckpoint]
) -> frozenset[str]:
    """The partitions whose stored checkpoint is exactly the committed one built: only those
    count as promoted after a partial write; any other stored state is not a commit."""
    return frozenset(cp.partition_id for cp in committed if stored.get(cp.partition_id) == cp)


def scan_hint(route: RouteKey) -> str:
    """The command that shows what blocks ``route``; the store path stays a placeholder."""
    names = (route.source_table, route.target_table, str(route.strategy))
    return f"{PROG} guard scan --store <checkpoint store> --route " + " ".join(
        shlex.quote(name) for name in names
    )


def select_blocked(
    checkpoints: Sequence[PartitionCheckpoint],
    *,
    partition_ids: Sequence[str] = (),
    batch_id: str | None = None,
    force_invalid: bool = False,
) -> list[tuple[PartitionCheckpoint, Finding]]:
    """The latest checkpoints an operator named, each with its finding; refuses the whole lot.

    Named by partition id or by batch id (every blocked partition of that
    batch). A named partition that is unknown or not blocked refuses the
    command; so does a malformed guard unless ``force_invalid``.
    """
    by_id = {cp.partition_id: (cp, inspect_checkpoint(cp)) for cp in checkpoints}
    if batch_id is not None:
        chosen = [pid for pid, (_, f) in by_id.items() if f.blocked and f.batch_id == batch_id]
        if not chosen:
            raise ConfigInvalid(
                "no blocked partition of this route carries the batch id given as --batch",
                diagnostics={"key": "--batch", "batch_id": batch_id},
            )
    else:
        chosen = list(dict.fromkeys(partition_ids))
        if not chosen:
            raise ConfigInvalid(
                "name the partitions to resolve with --partition or --batch",
                diagnostics={"key": "--partition"},
            )
    refused = [pid for pid in chosen if pid not in by_id or not by_id[pid][1].blocked]
    if refused:
        described = ", ".join(_not_blocked(pid, by_id.get(pid)) for pid in refused)
        raise ConfigInvalid(
            f"refusing to resolve partition(s) that are not blocked: {described}; "
            "nothing was written",
            diagnostics={"key": "--partition", "partition_ids": refused},
        )
    malformed = [pid for pid in chosen if by_id[pid][1].malformed]
    if malformed and not force_invalid:
        raise ConfigInvalid(
            f"refusing to resolve partition(s) with a malformed guard: {', '.join(malformed)}; "
            "check them against the target, then repeat with --force-invalid",
            diagnostics={"key": "--force-invalid", "partition_ids": malformed},
        )
    return [by_id[pid] for pid in chosen]


def _not_blocked(partition_id: str, known: tuple[PartitionCheckpoint, Finding] | None) -> str:
    if known is None:
        return f"{partition_id} (unknown on this route)"
    return f"{partition_id} ({known[1].status.value}, {known[1].guard_label()})"


def resolution_batch(
    selected: Sequence[tuple[PartitionCheckpoint, Finding]], resolved_as: Resolution, now: datetime
) -> list[PartitionCheckpoint]:
    """The new latest checkpoint of each selected partition, stamped ``now`` (start == end).

    A valid guard keeps its batch id; a malformed one gets a fresh one for its
    run and partition. Resolving as committed drops the failure code.
    """
    status = PHASE_STATUS[resolved_as.phase]
    resolved = []
    for checkpoint, finding in selected:
        batch_id = finding.batch_id or batch_id_for(checkpoint.run_id, [checkpoint.partition_id])
        diagnostics = {
            **checkpoint.diagnostics,
            GUARD_DIAGNOSTICS_KEY: build_guard(resolved_as.phase, batch_id),
        }
        if resolved_as is Resolution.COMMITTED:
            diagnostics.pop("error", None)
        resolved.append(
            attrs.evolve(
                checkpoint,
                status=status,
                started_at=now,
                completed_at=now,
                diagnostics=diagnostics,
            )
        )
    return resolved


def audit_record(
    route: RouteKey,
    selected: Sequence[tuple[PartitionCheckpoint, Finding]],
    resolved: Sequence[PartitionCheckpoint],
    *,
    resolved_as: str,
    operator: str,
    reason: str,
    now: datetime,
    proofs: dict[str, dict[str, Any]] | None = None,
    overrides: Sequence[str] = (),
) -> dict[str, Any]:
    """Who, when, why, and every partition's previous and new state; the store adds the id.

    ``resolved_as`` is ``committed``, ``failed_before_target`` or ``from_target``
    (each partition as the target's ledger proved it). ``proofs`` records what the
    ledger proved per batch; ``overrides`` the batches resolved against it (``--force``).
    """
    partitions = []
    for (_, before), after in zip(selected, resolved, strict=True):
        guard = after.diagnostics[GUARD_DIAGNOSTICS_KEY]
        partitions.append(
            {
                "partition_id": before.partition_id,
                "previous_status": before.status.value,
                "previous_phase": None if before.phase is None else before.phase.value,
                "previous_problem": before.problem,
                "new_status": after.status.value,
                "new_phase": guard["phase"],
                "batch_id": guard["checkpoint_batch_id"],
            }
        )
    record: dict[str, Any] = {
        "at": now.isoformat(),
        "operator": operator,
        "reason": reason,
        "route": route.as_dict(),
        "resolved_as": resolved_as,
        "forced_invalid": any(before.malformed for _, before in selected),
        "partitions": partitions,
    }
    if proofs:
        record["proof"] = proofs
    if overrides:
        record["ledger_overrides"] = sorted(overrides)
    return record
