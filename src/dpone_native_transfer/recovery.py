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

from .checkpoints import LEDGER_BATCH_KEY, PartitionCheckpoint, PartitionCheckpointStatus, RouteKey
from .connectors.contract import LedgerSink
from .errors import ConfigInvalid, NativeTransferError, RouteBusy
from .lease import Lease, LeaseStore, read_holder
from .lease import lease_key as _lease_key
from .ledger import LedgerEntry, restored_checkpoints

__all__ = [
    "RestorePlan",
    "check_not_leased",
    "ledger_of",
    "operator_lease",
    "plan_restore",
]


def ledger_of(
    sink: Any, *, partitions: bool = False
) -> tuple[list[LedgerEntry] | None, str | None]:
    """The target's ledger entries, or None and the (safe) reason they cannot be read."""
    if sink is None:
        return None, "the store does not say where the target is: give the route file"
    if not isinstance(sink, LedgerSink):
        return None, "this target keeps no ledger"
    try:
        return sink.read_ledger(partitions=partitions), None
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
    """What ``state restore`` writes: committed checkpoints and the source state they imply."""

    route: RouteKey
    checkpoints: tuple[PartitionCheckpoint, ...]
    replaced: tuple[PartitionCheckpoint, ...]  # the latest checkpoints they replace (CAS)
    source_state: dict[str, Any] | None
    previous_state: dict[str, Any] | None
    entries: int


def plan_restore(store: Any, route: RouteKey, entries: Sequence[LedgerEntry]) -> RestorePlan:
    """The store's view of ``route`` rebuilt from its ledger entries (with their partitions).

    The route's entries are those it wrote; when it wrote none, those of the one
    other source database with the same source table and strategy (the source
    file was moved or copied). A partition the store already holds as committed
    in the same ledger batch is left alone; one it holds otherwise in that batch
    (blocked, or resolved as not applied) is refused: ``guard resolve`` decides
    those. Every other ledger partition gets a committed checkpoint. The source
    state becomes that of the route's last batch, unless the store's is of a
    later generation (runs that find nothing new advance it without a batch).
    """
    mine = [entry for entry in entries if entry.of_route(route)]
    if not mine:
        mine = _moved_source(route, entries)
    latest = {cp.partition_id: cp for cp in store.list_latest(route)}
    wanted, disputed = [], []
    for checkpoint in restored_checkpoints(route, mine):
        held = latest.get(checkpoint.partition_id)
        batch = checkpoint.diagnostics[LEDGER_BATCH_KEY]
        if held is None or held.diagnostics.get(LEDGER_BATCH_KEY) != batch:
            wanted.append(checkpoint)
        elif held.status is not PartitionCheckpointStatus.COMMITTED:
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
    last = max(mine, key=lambda entry: entry.seq)
    previous = store.load_source_state(route)
    state: dict[str, Any] | None = {"generation": last.generation, "watermark": last.watermark}
    generation = previous.get("generation") if isinstance(previous, dict) else None
    if isinstance(generation, int) and generation >= last.generation:
        state = previous
    return RestorePlan(
        route=route,
        checkpoints=tuple(wanted),
        replaced=tuple(latest[cp.partition_id] for cp in wanted if cp.partition_id in latest),
        source_state=None if state == previous else state,
        previous_state=previous,
        entries=len(mine),
    )


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
    if not named:
        raise ConfigInvalid(
            f"the target's ledger holds no batch of route {route.label}; nothing to restore",
            diagnostics={"route": route.as_dict()},
        )
    return [attrs.evolve(entry, source_location=route.source_location) for entry in named]
