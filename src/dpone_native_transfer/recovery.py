"""Proof-backed recovery: reading a route's target ledger for operators, and rebuilding a store.

Used by ``dpone-transfer guard verify|resolve`` (the guard plugin's commands)
and ``dpone-transfer state restore``. Reads only, except ``restore`` (one
audited store transaction under the target table's lease).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs

from .checkpoints import (
    LEDGER_BATCH_KEY,
    FailureCode,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
)
from .connectors.contract import LedgerSink
from .cursor_edge import unknown_edge
from .errors import ConfigInvalid, NativeTransferError, RouteBusy, StoreTargetMismatch
from .lease import Lease, LeaseStore, read_holder
from .lease import lease_key as _lease_key
from .ledger import LedgerEntry, live_entries, restored_checkpoints, unexcused
from .reporting import plural

__all__ = [
    "RestorePlan",
    "check_not_leased",
    "ledger_of",
    "operator_lease",
    "plan_restore",
    "recorded_definition",
]


def ledger_of(
    sink: Any, *, partitions: bool = False
) -> tuple[list[LedgerEntry] | None, str | None]:
    """The target's ledger entries, or None and the (safe) reason they cannot be read.

    A ledger that holds an invalid row raises its ``StoreTargetMismatch``
    (``ledger_unreadable``): a run refuses it too, so no operator command may
    treat it as merely unknown.
    """
    if sink is None:
        return None, "the store does not say where the target is: give the route file"
    if not isinstance(sink, LedgerSink):
        return None, "this target keeps no ledger"
    try:
        return sink.read_ledger(partitions=partitions), None
    except StoreTargetMismatch:
        raise
    except NativeTransferError as error:
        return None, f"the target's ledger cannot be read ({error.code})"
    except Exception as error:  # a driver's own error: its text may hold secrets
        return None, f"the target cannot be reached ({type(error).__name__})"


def check_not_leased(store: Any, route: RouteKey) -> None:
    """``RouteBusy`` while an attempt holds the target table's lease (it may still be running)."""
    if not isinstance(store, LeaseStore):
        return
    table = store.lease_table()
    try:
        record = table.holder(_lease_key(route), datetime.now(UTC).timestamp())
    finally:
        table.close()
    if record is not None:
        raise RouteBusy.held_by(route, read_holder(record))


def operator_lease(store: Any, route: RouteKey, *, operator: str, action: str) -> Any:
    """The target table's lease for an operator's write (a context manager; none without one)."""
    if not isinstance(store, LeaseStore):
        return contextlib.nullcontext()
    return Lease(
        store.lease_table(),
        route,
        run_id=f"{action} by {operator}",
        seconds=60,
        owner=f"{socket.gethostname()} pid {os.getpid()} ({action})",
    )


@attrs.frozen(kw_only=True)
class RestorePlan:
    """What ``state restore`` writes: checkpoints and the source state the ledger implies.

    ``checkpoints`` are committed ones for the ledger's partitions, then failed
    ones (``not_in_target``) for committed partitions the ledger does not hold.
    """

    route: RouteKey
    checkpoints: tuple[PartitionCheckpoint, ...]
    replaced: tuple[PartitionCheckpoint, ...]  # the latest checkpoints they replace (CAS)
    source_state: dict[str, Any] | None
    previous_state: dict[str, Any] | None
    entries: int
    overrides: tuple[str, ...] = ()  # ledger batches the emptied table no longer holds
    definition: dict[str, Any] | None = None  # what the route's last batch was loaded under

    @property
    def rolled_back(self) -> int:
        return sum(cp.status is PartitionCheckpointStatus.FAILED for cp in self.checkpoints)


def plan_restore(
    store: Any,
    route: RouteKey,
    entries: Sequence[LedgerEntry],
    *,
    now: datetime,
    target_rows: int,
    excused: set[str],
    ignore_row_count: bool = False,
) -> RestorePlan:
    """The store's view of ``route`` rebuilt from the target's ledger (entries with partitions).

    Both ways: what the store lost comes back, and what the target lost is
    forgotten.

    - The route's entries are those it wrote; when it wrote none, those of the
      one other source database with the same source table and strategy (the
      source file was moved or copied, or the server is named otherwise). Batches
      operators excused (``excused``, or a later ledger entry) are left out: the
      table no longer holds them. Every ledger partition gets a committed
      checkpoint, unless the store holds it as committed in the same batch
      already, or as forgotten by ``state reset``; one the store holds otherwise
      in that batch (blocked, or resolved as not applied) is refused: ``guard
      resolve`` decides those.
    - A partition the store holds as committed in a ledger batch the target does
      not hold (the target was replaced or restored from an older backup) gets a
      failed checkpoint (``not_in_target``): the next run loads it again.
    - The source state becomes that of the route's last batch in the ledger (none
      left: from the start). When nothing was forgotten, a store's state of a
      later generation is kept (runs that find nothing new advance it without a
      batch).

    The ledger is trusted only as far as the table agrees: ``target_rows`` must be
    the rows its ledger records since the table was last replaced, less the batches
    operators said are gone (``excused``, or a later ledger entry), unless
    ``ignore_row_count``. A table
    that is empty while its ledger records rows was dropped or emptied: nothing
    the ledger lists is held, and this route's batches are recorded as overrides.
    """
    live = live_entries(entries, excused)
    ledger_rows = sum(entry.rows for entry in live)
    emptied = target_rows == 0 and ledger_rows > 0
    if not (emptied or ignore_row_count) and target_rows != ledger_rows:
        raise ConfigInvalid(
            f"refusing to restore route {route.label}: the target table holds "
            f"{plural(target_rows, 'row')} but its ledger records {ledger_rows:,} since it was "
            "last replaced (rows loaded before the ledger or with ledger = false, written by "
            "another tool, deleted since, or ledger rows removed), so the ledger is not the "
            "whole truth; compare by hand (`dpone-transfer guard show`), or, if the difference "
            "is known and intended, repeat with --ignore-row-count; nothing was written",
            diagnostics={"route": route.as_dict(), "target_rows": target_rows,
                         "ledger_rows": ledger_rows},
        )  # fmt: skip
    overrides = sorted(entry.batch_id for entry in live if entry.of_route(route))
    entries = [] if emptied else entries
    history = [entry for entry in unexcused(entries) if entry.batch_id not in excused]
    if any(entry.of_route(route) for entry in entries):
        mine = [entry for entry in history if entry.of_route(route)]
    else:
        mine = _moved_source(route, history)
    latest = {cp.partition_id: cp for cp in store.list_latest(route)}
    restored = restored_checkpoints(route, mine)
    wanted, disputed = [], []
    for checkpoint in restored:
        held = latest.get(checkpoint.partition_id)
        batch = checkpoint.diagnostics[LEDGER_BATCH_KEY]
        if held is None or held.diagnostics.get(LEDGER_BATCH_KEY) != batch:
            wanted.append(checkpoint)
        elif held.status is not PartitionCheckpointStatus.COMMITTED and not _reset(held):
            disputed.append(checkpoint)
    if disputed:
        batches = sorted({cp.diagnostics[LEDGER_BATCH_KEY] for cp in disputed})
        raise ConfigInvalid(
            f"refusing to restore route {route.label}: the store holds "
            f"{len(disputed)} partition(s) of ledger batch(es) {', '.join(batches)} as blocked "
            "or not applied; decide them with `dpone-transfer guard verify` and `guard resolve` "
            "first; nothing was written",
            diagnostics={"route": route.as_dict(), "batch_ids": batches},
        )
    in_ledger = {entry.batch_id for entry in entries}
    kept = {cp.partition_id for cp in restored}
    forgotten = [
        forget_checkpoint(held, now, FailureCode.NOT_IN_TARGET)
        for held in latest.values()
        if held.partition_id not in kept
        and held.status is PartitionCheckpointStatus.COMMITTED
        and held.diagnostics.get(LEDGER_BATCH_KEY) not in (None, *in_ledger)
    ]
    if not (mine or forgotten):
        raise ConfigInvalid(
            f"the target's ledger holds no batch of route {route.label} and the store no "
            "batch the target lost; nothing to restore",
            diagnostics={"route": route.as_dict()},
        )
    previous = store.load_source_state(route)
    generation = previous.get("generation") if isinstance(previous, dict) else None
    if mine:
        last = max(mine, key=lambda entry: entry.seq)
        state: dict[str, Any] | None = {
            "generation": last.generation,
            "watermark": last.watermark,
            **unknown_edge(last.watermark),  # which edge rows the target holds is not recorded
        }
    else:
        state = {"generation": generation if isinstance(generation, int) else 0, "watermark": None}
    if not forgotten and isinstance(generation, int) and generation >= (state or {})["generation"]:
        state = previous
    writes = [*wanted, *forgotten]
    return RestorePlan(
        route=route,
        checkpoints=tuple(writes),
        replaced=tuple(latest[cp.partition_id] for cp in writes if cp.partition_id in latest),
        source_state=None if state == previous else state,
        previous_state=previous,
        entries=len(mine),
        overrides=tuple(overrides) if emptied else (),
        definition=recorded_definition(max(mine, key=lambda e: e.seq)) if mine else None,
    )


def recorded_definition(entry: LedgerEntry) -> dict[str, Any]:
    """The route definition a batch was loaded under (``planner.route_definition``): as the
    ledger recorded it, or for an entry of ledger v1 what it tells: its cursor column, and
    from its partitions' bounds whether they were values or key ranges."""
    if entry.definition is not None:
        return dict(entry.definition)
    told: dict[str, Any] = {"cursor_column": entry.cursor_column}
    bounds = [part.bounds for part in entry.partitions]
    if any("partition_from" in b or "partition_below" in b for b in bounds):
        told["partition_by"] = "range"
    elif any(b.get("partition") is not None for b in bounds):
        told["partition_by"] = "value"
    return told


def forget_checkpoint(
    checkpoint: PartitionCheckpoint, now: datetime, error: FailureCode
) -> PartitionCheckpoint:
    """A committed checkpoint that no longer counts as loaded (``error`` says why): the
    target's ledger does not hold it (``not_in_target``), or an operator reset the route.

    No guard: nothing is in flight. Its ledger batch id, if any, is kept.
    """
    batch = {k: v for k, v in checkpoint.diagnostics.items() if k == LEDGER_BATCH_KEY}
    return attrs.evolve(
        checkpoint,
        status=PartitionCheckpointStatus.FAILED,
        started_at=now,
        completed_at=now,
        diagnostics={**batch, "error": error.value},
    )


def _reset(checkpoint: PartitionCheckpoint) -> bool:
    """Forgotten by ``state reset``: the operator's choice, which a restore keeps."""
    return checkpoint.diagnostics.get("error") == FailureCode.RESET


def _moved_source(route: RouteKey, entries: Sequence[LedgerEntry]) -> list[LedgerEntry]:
    """The entries of this route's table names written from one other source database."""
    named = [
        e for e in entries if (e.source_table, e.strategy) == (route.source_table, route.strategy)
    ]
    sources = {entry.source_location for entry in named}
    if len(sources) > 1:
        raise ConfigInvalid(
            f"refusing to restore route {route.label}: the target's ledger holds its source "
            f"table's batches from {len(sources)} other source databases, none of them this "
            "route's; nothing was written",
            diagnostics={"route": route.as_dict(), "sources": sorted(map(str, sources))},
        )
    return [attrs.evolve(entry, source_location=route.source_location) for entry in named]
