"""Proof-backed recovery: what the target proves of blocked batches, and rebuilding a store.

Used by ``dpone-transfer guard verify|resolve`` (the guard plugin's commands),
``dpone-transfer state restore`` and, with ``recovery = "from_target"``, by a
run's route scan (``TargetRecovery``). Reads only, except ``restore`` (one
audited store transaction under the target table's lease) and raising the
target's fence to prove that a blocked batch can no longer be applied
(``Prover``, under the lease).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import attrs

from .checkpoints import (
    LEASE_EPOCH_KEY,
    LEASE_PROCESS_KEY,
    LEDGER_BATCH_KEY,
    FailureCode,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    Strategy,
)
from .errors import ConfigInvalid, NativeTransferError, RouteBusy, StoreTargetMismatch
from .events import EventName, EventRecorder
from .latest import LatestCheckpoints, as_latest
from .lease import Lease, ProcessMark, read_holder
from .lease import lease_key as _lease_key
from .ledger import (
    APPLIED,
    NOT_APPLIED,
    UNKNOWN,
    LedgerEntry,
    Proof,
    live_entries,
    restored_checkpoints,
    unexcused,
)
from .source_state import unknown_edge
from .stores import Store
from .wording import plural

__all__ = [
    "AUTOMATIC_OPERATOR",
    "Prover",
    "RestorePlan",
    "TargetRecovery",
    "check_not_leased",
    "ledger_of",
    "operator_lease",
    "plan_restore",
    "recorded_definition",
]

# Who an automatic recovery's audit records name.
AUTOMATIC_OPERATOR = "dpone-transfer (automatic)"


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
    if not sink.features.keeps_ledger:
        return None, "this target keeps no ledger"
    try:
        return sink.read_ledger(partitions=partitions), None
    except StoreTargetMismatch:
        raise
    except NativeTransferError as error:
        return None, f"the target's ledger cannot be read ({error.code})"
    except Exception as error:  # a driver's own error: its text may hold secrets
        return None, f"the target cannot be reached ({type(error).__name__})"


def check_not_leased(store: Store, route: RouteKey) -> None:
    """``RouteBusy`` while an attempt holds the target table's lease (it may still be running;
    a holder on this host whose process is gone does not count: its lease is taken at once)."""
    table = store.lease_table()
    try:
        record = table.holder(_lease_key(route), datetime.now(UTC).timestamp())
    finally:
        table.close()
    holder = read_holder(record)
    if holder is not None and not (holder.process is not None and holder.process.gone()):
        raise RouteBusy.held_by(route, holder)


def operator_lease(store: Store, route: RouteKey, *, operator: str, action: str) -> Any:
    """The target table's lease for an operator's write (a context manager)."""
    return Lease(
        store.lease_table(),
        route,
        run_id=f"{action} by {operator}",
        seconds=60,
        owner=f"{socket.gethostname()} pid {os.getpid()} ({action})",
    )


class Prover:
    """What one target's ledger (and fence) proves of blocked batches, for the current holder of
    the target table's lease, whose epoch is ``epoch`` (0: none).

    A batch is **applied** when the ledger holds its row for its route, listing every blocked
    partition with the rows the store recorded for it; a row that lists others, or other
    counts, proves nothing. Only a ledger written with the rows (``ledger_atomic``) heals by
    itself: on ClickHouse a person confirms it. It is **not applied** when such a ledger does
    not hold it, the batch was armed with the ledger on, and no attempt can commit it later:
    the target's fence was raised past the epoch that armed it (``advance=True``: raised
    here, once, before the ledger is read again). A batch armed without an epoch (an older
    release, a store without leases) is shown as not applied on the ledger's word alone, as
    before, but never heals by itself: its attempt, paused, could
    still commit it. ``Proof.heals`` says what ``recovery = "from_target"`` may resolve.
    """

    def __init__(
        self,
        sink: Any,
        *,
        epoch: int = 0,
        advance: bool = False,
        batch_column: str | None = None,
        batch_route: RouteKey | None = None,
    ) -> None:
        self._sink = sink
        self._epoch = epoch
        self._advance = advance
        self._batch_column = batch_column
        self._batch_route = batch_route  # whose batches the column counts (None: any route's)
        self._fenced: bool | None = False  # None: raising it failed
        self._entries: list[LedgerEntry] | None = None
        self.reason: str | None = None  # why the ledger could not be read, once it was tried

    def entries(self) -> list[LedgerEntry] | None:
        """The target's ledger entries with partitions (read once); None when unreadable."""
        if self._entries is None and self.reason is None:
            self._entries, self.reason = ledger_of(self._sink, partitions=True)
        return self._entries

    @property
    def unreadable(self) -> bool:
        """Whether the target keeps a ledger that could not be read now (locked, unreachable),
        as opposed to one that proves nothing for good (no ledger, no location)."""
        keeps = self._sink is not None and self._sink.features.keeps_ledger
        return keeps and self.entries() is None

    def prove(
        self, route: RouteKey, batch_id: str, checkpoints: Sequence[PartitionCheckpoint]
    ) -> Proof:
        """What the target proves of batch ``batch_id`` of ``route``, whose blocked
        checkpoints are ``checkpoints``."""
        entries = self.entries()
        if entries is None:
            return Proof(UNKNOWN, self.reason or "the target cannot be read")
        found = _entry(entries, route, batch_id)
        counted = self._counted(route, batch_id, checkpoints, found)
        if counted is not None:
            return counted
        if found is not None:
            proof = _applied(found, checkpoints)
            atomic = self._sink.features.ledger_atomic
            return proof if atomic else attrs.evolve(proof, heals=False)
        if not all(cp.diagnostics.get(LEDGER_BATCH_KEY) == batch_id for cp in checkpoints):
            return Proof(UNKNOWN, "the batch was written without the target's ledger")
        if not self._sink.features.ledger_atomic:
            return Proof(UNKNOWN, "this target's ledger row is not written with the rows")
        epochs = [cp.diagnostics.get(LEASE_EPOCH_KEY) for cp in checkpoints]
        armed_at = [e for e in epochs if isinstance(e, int) and not isinstance(e, bool)]
        if len(armed_at) != len(epochs) or not self._sink.features.fence:
            return Proof(NOT_APPLIED, "the target's ledger does not hold the batch (armed "
                         "without a lease epoch or on a target without a fence: compare the "
                         "target by hand if its worker may still run)")  # fmt: skip
        if not self._advance:
            return Proof(NOT_APPLIED, "the target's ledger does not hold the batch; "
                         "recovery from the target raises the target's fence past its "
                         "attempt first", heals=True)  # fmt: skip
        if self._fenced is None:
            return Proof(UNKNOWN, "the target's fence could not be raised now (busy or "
                         "unreachable)")  # fmt: skip
        if max(armed_at) >= self._epoch:
            return Proof(UNKNOWN, "the target's fence cannot be raised past the attempt that "
                         "armed the batch (its lease epoch is not below this one's)")  # fmt: skip
        if not self._fenced:
            self._fence()
            return self.prove(route, batch_id, checkpoints)
        return Proof(
            NOT_APPLIED,
            "the target's ledger does not hold the batch, and the target's fence is past the "
            "attempt that armed it, which can no longer commit",
            heals=True,
        )

    def _counted(
        self,
        route: RouteKey,
        batch_id: str,
        checkpoints: Sequence[PartitionCheckpoint],
        entry: LedgerEntry | None,
    ) -> Proof | None:
        """What the batch column proves, on a target whose ledger row proves nothing
        (``Sink.batch_rows``, ``features.ledger_atomic`` False): the route's, or on a merge
        route the one the sink keeps (``features.merge_batch_column``); None where it is
        not asked. The column counts the whole batch: when its ledger row (``entry``) lists
        it, every partition it lists, also those already promoted (a kill during the
        promotion leaves only some blocked)."""
        sink, column = self._sink, self._batch_column
        if self._batch_route is not None and route != self._batch_route:
            column = None  # another route's rows of the table: the column is not theirs (a
            # 0 counted for them resolved an applied batch as not applied)
        if column is None and route.strategy is Strategy.MERGE:
            column = getattr(sink.features, "merge_batch_column", None)
        if column is None:
            return None
        if sink.features.ledger_atomic:
            return None
        listed = entry is not None
        expected = sum(cp.rows_exported for cp in checkpoints)
        if entry is not None:
            proof = _applied(entry, checkpoints)
            if proof.verdict != APPLIED:  # it lists other partitions or counts: unknown
                return proof
            expected = sum(part.rows for part in entry.partitions)
        try:
            rows = sink.batch_rows(column, batch_id)
        except Exception:  # a driver's text may hold secrets
            return Proof(UNKNOWN, "the target cannot be read now")
        if rows == expected and (rows or listed):
            return Proof(APPLIED, f"the target holds all {rows:,} rows of the batch (its batch "
                         "column)", rows, heals=True, unlisted=not listed)  # fmt: skip
        if rows:
            return Proof(UNKNOWN, f"the target holds {rows:,} of the batch's {expected:,} rows "
                         "(its batch column): a partial insert, compare by hand")  # fmt: skip
        marks = [cp.diagnostics.get(LEASE_PROCESS_KEY) for cp in checkpoints]
        gone = sink.features.inserts_end_with_their_process and all(
            isinstance(mark, dict) and _gone(mark) for mark in marks
        )
        if gone:
            return Proof(NOT_APPLIED, "the target holds no row of the batch (its batch column) "
                         "and the process that armed it is gone", heals=True)  # fmt: skip
        return Proof(NOT_APPLIED, "the target holds no row of the batch (its batch column); an "
                     "insert of it may still be in flight")  # fmt: skip

    def _fence(self) -> None:
        """Raise the fence to this holder's epoch, then read the ledger again."""
        try:
            self._sink.advance_fence(self._epoch)
        except Exception:  # the target is busy or unreachable: nothing is proven absent
            self._fenced = None
            return
        self._fenced = True
        self._entries = None


def _gone(mark: dict[str, Any]) -> bool:
    try:
        return ProcessMark(**mark).gone()
    except TypeError:  # not a mark this release wrote
        return False


def _entry(entries: Sequence[LedgerEntry], route: RouteKey, batch_id: str) -> LedgerEntry | None:
    return next((e for e in entries if e.batch_id == batch_id and e.of_route(route)), None)


def _applied(entry: LedgerEntry, checkpoints: Sequence[PartitionCheckpoint]) -> Proof:
    """Applied, when the ledger's row lists each blocked partition with the store's rows."""
    listed = {part.partition_id: part.rows for part in entry.partitions}
    if any(listed.get(cp.partition_id) != cp.rows_exported for cp in checkpoints):
        return Proof(
            UNKNOWN,
            "the target's ledger holds the batch with other partitions or row counts than "
            "the checkpoint store",
            entry.rows,
            entry.applied_at,
        )
    return Proof(APPLIED, "the target's ledger holds the batch", entry.rows, entry.applied_at,
                 heals=True)  # fmt: skip


@attrs.define(eq=False, kw_only=True)
class TargetRecovery:
    """What the route scan may use to resolve blocked batches the target proves, before the run
    touches the target (``recovery = "from_target"``; see the ``resume_route_scan`` hookspec).

    ``store`` is the run's checkpoint store (an ``OperatorStore``); ``prover`` holds the run's
    lease epoch and may raise the target's fence.
    """

    store: Any
    route: RouteKey
    run_id: str
    prover: Prover
    events: EventRecorder
    operator: str = AUTOMATIC_OPERATOR

    def prove(
        self, route: RouteKey, batch_id: str, checkpoints: Sequence[PartitionCheckpoint]
    ) -> Proof:
        return self.prover.prove(route, batch_id, checkpoints)

    def latest(self) -> LatestCheckpoints:
        """The target table's latest checkpoints, read again (after resolutions)."""
        reader = getattr(self.store, "list_target_latest", self.store.list_latest)
        return as_latest(reader(self.route))

    def now(self) -> datetime:
        return datetime.now(UTC)

    def healed(self, route: RouteKey, batch_id: str, proof: Proof, partitions: int) -> None:
        """Report one batch resolved by proof (an event; the CLI prints it as a line)."""
        self.events.emit(
            EventName.GUARD_HEALED,
            route=route.as_dict(),
            batch_id=batch_id,
            verdict=proof.verdict,
            partitions=partitions,
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
    target_missing: bool = False,
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
    ``ignore_row_count`` or a merge route wrote some of them (its batches replace and
    delete rows, so no count adds up). A table
    that is empty while its ledger records rows was dropped or emptied: nothing
    the ledger lists is held, and this route's batches are recorded as overrides.
    After merges, whose rows may all have been deleted, only a missing table
    (``target_missing``) says so.
    """
    live = live_entries(entries, excused)
    # a merge batch's rows replace and delete rows: the table's count is not their sum
    merged = any(entry.strategy is Strategy.MERGE for entry in live)
    ledger_rows = sum(entry.rows for entry in live if entry.strategy is not Strategy.MERGE)
    emptied = (target_rows == 0 and ledger_rows > 0) or (
        target_missing and any(entry.rows for entry in live)
    )
    if not (emptied or ignore_row_count or merged) and target_rows != ledger_rows:
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
    # the caller refused a blocked route (the guard's scan): a partition the store holds as
    # not applied (resolved so by hand, or an unguarded run that failed after its target
    # call) of a batch the ledger holds is applied, which the ledger proves
    wanted = []
    for checkpoint in restored:
        held = latest.get(checkpoint.partition_id)
        batch = checkpoint.diagnostics[LEDGER_BATCH_KEY]
        if held is None or held.diagnostics.get(LEDGER_BATCH_KEY) != batch:
            wanted.append(checkpoint)
        elif held.status is not PartitionCheckpointStatus.COMMITTED and not _reset(held):
            wanted.append(checkpoint)
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
