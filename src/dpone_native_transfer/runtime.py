"""TransferRuntime: one guarded, resumable attempt per ``run(spec)``.

Order of work: lease -> route scan (the guard over the target table's
checkpoints, then the store checked against the target's ledger) -> resume
plan -> path (pre-target work, then the target through the boundary) ->
evidence -> source state -> lease released. Evidence and source state come
only after checkpoint promotion, and also when nothing was active, so a run
that failed after promotion heals on the next run without a target call.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from .boundary import TargetBoundary
from .checkpoints import (
    LEASE_EPOCH_KEY,
    LEASE_PROCESS_KEY,
    LEDGER_BATCH_KEY,
    PartitionCheckpoint,
    RouteKey,
    Strategy,
    batch_id_for,
)
from .clock import Clock, read_clock, system_clock
from .connectors.contract import (
    DEFAULT_CHUNK_ROWS,
    ConnectionHolding,
    Fencing,
    LedgerSink,
    RangePartitioned,
    Sink,
    Source,
    TargetChecking,
)
from .cursor_edge import (
    EDGE_KEY,
    NULL_CURSOR_POLICIES,
    EdgeTracker,
    advanced_edge,
    plan_edge,
    top_of_window,
    unknown_edge,
)
from .errors import (
    ConfigInvalid,
    LeaseLost,
    PathContractBroken,
    TargetCommitGuardUnhandled,
    WorkFolderFailed,
)
from .events import Event, EventName, EventRecorder
from .identity import fold_ascii, route_key
from .latest import LatestCheckpoints, as_latest
from .lease import (
    DEFAULT_LEASE_SECONDS,
    HeldStore,
    Lease,
    LeaseStore,
    ProcessMark,
    check_lease_seconds,
    lease_key,
)
from .ledger import (
    LedgerEntry,
    check_store_against_target,
    excused_batches,
    ledger_overrides,
    refresh_in_store,
)
from .paths import Governance, PathContext, SourceSnapshot, TransferPath
from .paths.file_artifact import file_artifact_path
from .paths.lazy_plan import lazy_plan_path
from .paths.legacy import legacy_path
from .paths.staged import staged_path
from .payloads import Column, SourceShape
from .planner import (
    candidate_checkpoints,
    check_definition,
    plan_resume,
    plan_window,
    route_definition,
)
from .plugins import Hooks, make_plugin_manager, scans_routes
from .recovery import Prover, TargetRecovery
from .rejects import ON_BAD_VALUE
from .schema_contract import SCHEMA_CONTRACTS, apply_schema_contract
from .stores import CheckpointStore, RouteStateStore, TargetScopeStore

__all__ = ["BUILTIN_PATHS", "TransferResult", "TransferRuntime", "TransferSpec"]

BUILTIN_PATHS: Mapping[str, TransferPath] = {
    "legacy": legacy_path,
    "staged": staged_path,
    "file-artifact": file_artifact_path,
    "lazy-plan": lazy_plan_path,
}


# More partitions by value than this in one run: a warning suggests ranges (each partition is
# a checkpoint and a query, so an id-like column makes one per row).
MANY_PARTITIONS = 10_000

# Rows held in memory per chunk at most: beyond it a chunk is no longer a bounded buffer
# (and 2**63 overflowed the drivers).
MAX_CHUNK_ROWS = 10_000_000


def _positive(_instance: Any, attribute: attrs.Attribute, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_CHUNK_ROWS:
        raise ConfigInvalid(
            f"{attribute.name} must be a positive integer of at most {MAX_CHUNK_ROWS:,}",
            diagnostics={"key": attribute.name},
        )


def _schema_contract(_instance: Any, _attribute: attrs.Attribute, value: Any) -> None:
    if value not in SCHEMA_CONTRACTS:
        raise ConfigInvalid(
            f"schema_contract must be one of: {', '.join(SCHEMA_CONTRACTS)}",
            diagnostics={"key": "schema_contract"},
        )


def _lag(_instance: Any, _attribute: attrs.Attribute, value: Any) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and 0 <= value < float("inf")):
        raise ConfigInvalid(
            "lag must be a number of cursor units, 0 or more", diagnostics={"key": "source.lag"}
        )


def _null_policy(_instance: Any, _attribute: attrs.Attribute, value: Any) -> None:
    if value not in NULL_CURSOR_POLICIES:
        raise ConfigInvalid(
            f"on_null_cursor must be one of: {', '.join(NULL_CURSOR_POLICIES)}",
            diagnostics={"key": "source.on_null_cursor"},
        )


RECOVERY_MODES = ("manual", "from_target")


def _on_bad_value(_instance: Any, _attribute: attrs.Attribute, value: Any) -> None:
    if value not in ON_BAD_VALUE:
        raise ConfigInvalid(
            f"on_bad_value must be one of: {', '.join(ON_BAD_VALUE)}",
            diagnostics={"key": "transfer.on_bad_value"},
        )


def _batch_column(_instance: Any, _attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip() or "\x00" in value):
        raise ConfigInvalid(
            "batch_column must be a column name", diagnostics={"key": "target.batch_column"}
        )


def _recovery(_instance: Any, _attribute: attrs.Attribute, value: Any) -> None:
    if value not in RECOVERY_MODES:
        raise ConfigInvalid(
            f"recovery must be one of: {', '.join(RECOVERY_MODES)}",
            diagnostics={"key": "guard.recovery"},
        )


def _strategy(value: Any) -> Strategy:
    if value not in Strategy._value2member_map_:
        known = ", ".join(s.value for s in Strategy)
        raise ConfigInvalid(f"strategy must be one of: {known}", diagnostics={"key": "strategy"})
    return Strategy(value)


@attrs.frozen(kw_only=True)
class TransferSpec:
    """One route's transfer: which source, which sink, how, and under which run id."""

    source: Source
    sink: Sink
    strategy: Strategy = attrs.field(converter=_strategy)
    path: str
    run_id: str
    governance: Governance = attrs.field(factory=Governance)
    chunk_rows: int = attrs.field(default=DEFAULT_CHUNK_ROWS, validator=_positive)
    artifact_dir: str | None = None
    ledger: bool = True
    schema_contract: str = attrs.field(default="evolve", validator=_schema_contract)
    lag: float = attrs.field(default=0, validator=_lag)  # cursor units re-read for late rows
    on_null_cursor: str = attrs.field(default="error", validator=_null_policy)
    # "from_target": the route scan first resolves blocked batches the target proves
    recovery: str = attrs.field(default="manual", validator=_recovery)
    # a column of the target that holds each row's batch id (None: none); row paths only
    batch_column: str | None = attrs.field(default=None, validator=_batch_column)
    # "quarantine": a row the target cannot hold exactly goes to _dpone_rejects, not a stop
    on_bad_value: str = attrs.field(default="refuse", validator=_on_bad_value)
    quarantine_values: bool = False  # the rejects table keeps the refused value (repr) too

    def __attrs_post_init__(self) -> None:
        if self.batch_column is not None and self.path == "lazy-plan":
            raise ConfigInvalid(
                "batch_column needs dpone to read the rows (legacy, staged or file-artifact): "
                "on lazy-plan the target's engine reads them itself",
                diagnostics={"key": "target.batch_column"},
            )
        if self.on_bad_value == "quarantine" and not self.ledger:
            raise ConfigInvalid(
                'on_bad_value = "quarantine" writes the rows it sets aside with the batch '
                "and counts them in its ledger row: it needs the target's ledger",
                diagnostics={"key": "transfer.on_bad_value"},
            )
        if self.batch_column is not None and not self.ledger:
            raise ConfigInvalid(
                "batch_column stores the ledger's batch id in every row: it needs the target's "
                "ledger (ledger = true)",
                diagnostics={"key": "target.batch_column"},
            )

    @property
    def route(self) -> RouteKey:
        """The route of the source, sink and strategy, located by their ``identity()``."""
        return route_key(self.source, self.sink, self.strategy)


@attrs.frozen(kw_only=True)
class TransferResult:
    committed_partition_ids: tuple[str, ...]
    skipped_partition_ids: tuple[str, ...]
    rows_loaded: int
    events: tuple[Event, ...]
    batch_id: str | None = None
    guarded: bool = True  # False only when run unguarded on purpose (``plugins=[]``)
    rows_quarantined: int = 0  # rows set aside in the target's rejects table


class TransferRuntime:
    """Runs transfers against one checkpoint store with one set of plugins.

    ``plugins=None`` loads the entry-point plugins (the target-commit guard is
    one); an explicit list replaces them (``[*entry_point_plugins(), mine]``
    adds to them). A run needs a plugin that claims the route scan (the guard),
    or it stops before any I/O: only ``plugins=[]`` or ``unguarded=True`` (with
    other plugins) runs unguarded, on purpose, and only on routes without
    guards. ``paths`` adds connector-provided paths to the built-in four.
    ``lease_seconds`` is how long a target table's lease lasts without a
    heartbeat (a killed worker's lease expires after it).
    """

    def __init__(
        self,
        store: CheckpointStore,
        *,
        clock: Clock | None = None,
        plugins: Iterable[object] | None = None,
        events: Callable[[Event], None] | None = None,
        state_store: RouteStateStore | None = None,
        paths: Mapping[str, TransferPath] | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        unguarded: bool = False,
    ) -> None:
        self.store = store
        states = state_store if state_store is not None else store
        if not isinstance(states, RouteStateStore):
            raise ConfigInvalid(
                "the store keeps no source state; pass state_store=",
                diagnostics={"key": "state_store"},
            )
        self.state_store: RouteStateStore = states
        self.clock = clock or system_clock
        plugins = None if plugins is None else list(plugins)
        self.unguarded = unguarded is True or plugins == []
        self.plugin_manager = make_plugin_manager(plugins)
        self.hooks = Hooks(self.plugin_manager)
        self.paths = {**BUILTIN_PATHS, **(paths or {})}
        self._listener = events
        self.lease_seconds = check_lease_seconds(lease_seconds)

    def run(self, spec: TransferSpec) -> TransferResult:
        path = self.paths.get(spec.path)
        if path is None:
            raise ConfigInvalid(
                f"unknown path {spec.path!r}; known: {', '.join(sorted(self.paths))}",
                diagnostics={"key": "path"},
            )
        route = spec.route if isinstance(self.store, TargetScopeStore) else spec.route.unlocated()
        if not (self.unguarded or scans_routes(self.plugin_manager)):
            raise self._no_guard(route)
        with (
            self._leased(route, spec.run_id) as lease,
            _held(spec.sink),
            SourceSnapshot(spec.source) as snapshot,
        ):
            return self._attempt(spec, path, route, lease, snapshot)

    @contextlib.contextmanager
    def _leased(self, route: RouteKey, run_id: str) -> Iterator[Lease | None]:
        """The target table's lease for the whole attempt, when the store can lease."""
        if not isinstance(self.store, LeaseStore):
            yield None
            return
        lease = Lease(self.store.lease_table(), route, run_id=run_id, seconds=self.lease_seconds)
        with lease:
            yield lease

    def _attempt(
        self,
        spec: TransferSpec,
        path: TransferPath,
        route: RouteKey,
        lease: Lease | None,
        snapshot: SourceSnapshot,
    ) -> TransferResult:
        recorder = EventRecorder(self._listener)
        ledger = self._ledger_sink(spec, route)
        held = self._held(lease)  # what the attempt writes, it writes under its lease
        states = held if self.state_store is self.store else self.state_store
        epoch = None
        recovery = None
        if spec.recovery == "from_target":
            _check_target(spec.sink)
            epoch = self._fenced_epoch(ledger, lease)
            prover = Prover(ledger, epoch=epoch or 0, advance=True, batch_column=spec.batch_column)
            recovery = TargetRecovery(
                store=held, route=route, run_id=spec.run_id, prover=prover, events=recorder
            )
        if isinstance(self.store, TargetScopeStore):
            scope = as_latest(self.store.list_target_latest(route))
            if self._scan_route(route, scope, recovery):
                scope = as_latest(self.store.list_target_latest(route))
            self.store.adopt_unlocated(route)
            latest = as_latest(self.store.list_latest(route))
        else:
            latest = scope = as_latest(self.store.list_latest(route))
            if self._scan_route(route, latest, recovery):
                latest = scope = as_latest(self.store.list_latest(route))
        if recovery is None:
            _check_target(spec.sink)
            epoch = self._fenced_epoch(ledger, lease)
        refreshed = None
        if ledger is not None:
            refreshed = check_store_against_target(
                route,
                scope,
                ledger.read_ledger(),
                overridden=lambda: ledger_overrides(self.store, route),
                cursor_column=spec.source.cursor_column,
                target_empty=ledger.is_empty,
                started=lambda: self.state_store.load_source_state(route) is not None,
            )
        if refreshed is None and isinstance(self.store, TargetScopeStore):
            # a refresh that kept no ledger entry (ledger = false): the store remembers it
            cursor = spec.source.cursor_column
            refreshed = refresh_in_store(route, scope, cursor, ledgered=ledger is not None)
        recorder.emit(EventName.ROUTE_SCANNED, route=route.as_dict(), checkpoints=len(latest))

        shape = spec.source.describe()
        state = self.state_store.load_source_state(route)
        if refreshed is not None:  # another route's full refresh: continue where it ended
            generation = (state or {}).get("generation", 0)
            state = {
                "generation": generation,
                "watermark": refreshed.watermark,
                **unknown_edge(refreshed.watermark),
            }
            recorder.emit(EventName.STATE_REALIGNED, batch_id=refreshed.batch_id)
        definition = route_definition(spec.source, shape.columns)
        check_definition(route, state, latest, definition)
        edge = plan_edge(
            route,
            spec.source,
            state,
            shape.columns,
            kind=definition["cursor_kind"],
            lag=spec.lag,
            on_null_cursor=spec.on_null_cursor,
            chunk_rows=spec.chunk_rows,
        )
        window, bounds = plan_window(
            route, spec.source, state, latest, definition=definition, edge=edge
        )
        ranged = isinstance(spec.source, RangePartitioned) and spec.source.partition_rows
        if len(bounds) > MANY_PARTITIONS and not ranged:
            column = spec.source.partition_column
            recorder.emit(EventName.MANY_PARTITIONS, partitions=len(bounds), column=column)
        candidates = candidate_checkpoints(
            route, spec.run_id, shape.query_hash, shape.schema_hash, bounds, definition=definition
        )
        plan = plan_resume(route, candidates, latest)
        if not candidates and spec.governance.enabled and not spec.source.partition_values():
            spec.governance.check(route, 0)  # an empty source is gated too, before the target

        committed: tuple[str, ...] = ()
        rows_loaded, batch_id, ctx = 0, None, None
        upto = window.advanced_state()["watermark"]
        kind = definition["cursor_kind"]
        top_since = None if edge is None else top_of_window(spec.source, upto, spec.lag, kind)
        if plan.active:
            active = list(plan.active)
            entry, batch = None, None
            if ledger is not None:
                batch = batch_id_for(spec.run_id, [cp.partition_id for cp in active])
                active = _stamped(active, batch, lease)
                entry = LedgerEntry.for_batch(
                    route,
                    spec.run_id,
                    active,
                    **window.advanced_state(),
                    cursor_column=spec.source.cursor_column,
                    at=read_clock(self.clock, route=route, run_id=spec.run_id),
                    definition=dict(definition),
                    epoch=epoch,
                    excused=excused_batches(self.store, route, ledger.read_ledger),
                )
            loaded = _with_batch_column(route, shape, spec.batch_column)
            added = apply_schema_contract(route, spec.sink, loaded.columns, spec.schema_contract)
            if added:
                recorder.emit(EventName.SCHEMA_EVOLVED, columns=added)
            idle = 2 * self.lease_seconds
            with _work_folder(spec, route, leased=lease is not None, idle_seconds=idle) as work:
                ctx = PathContext(
                    spec=spec,
                    route=route,
                    shape=loaded,
                    candidates=active,
                    work_dir=Path(work),
                    store=held,
                    batch_value=None if spec.batch_column is None else batch,
                    clock=self.clock,
                    events=recorder,
                    boundary=TargetBoundary(self.hooks, recorder),
                    ledger_entry=entry,
                    lease=lease,
                    snapshot=snapshot,
                    edge=None
                    if edge is None
                    else EdgeTracker(
                        edge[0],
                        shape.columns,
                        spec.source,
                        top_since=top_since,
                        kind=definition["cursor_kind"],
                    ),
                )
                try:
                    rows_loaded = path(ctx)
                except OSError as error:
                    if ctx.mutation is not None:  # the boundary recorded the target call
                        raise
                    if lease is not None and lease.lost:  # another attempt removed the folder
                        raise LeaseLost.lost(route) from None
                    raise _work_folder_failed(route, error) from None
            if ctx.mutation is None:
                raise PathContractBroken(
                    f"path {spec.path!r} returned without reaching the target boundary; "
                    "nothing was written",
                    diagnostics={"route": route.as_dict(), "path": spec.path},
                )
            state_ids = ctx.mutation.state.committed_ids
            committed = tuple(pid for pid in ctx.mutation.partition_ids if pid in state_ids)
            batch_id = ctx.mutation.state.batch_id
            if len(committed) != len(ctx.mutation.partition_ids):
                raise TargetCommitGuardUnhandled(
                    f"route {route.label}: the target call succeeded but "
                    f"{len(ctx.mutation.partition_ids) - len(committed)} of "
                    f"{len(ctx.mutation.partition_ids)} checkpoints were not promoted by any "
                    "plugin; evidence and source state were not written and the route stays "
                    "blocked until `dpone-transfer guard verify` and `guard resolve`",
                    diagnostics={"route": route.as_dict(), "batch_id": batch_id},
                )

        evidence = {
            "run_id": spec.run_id,
            "route": route.as_dict(),
            "path": spec.path,
            "generation": window.generation,
            "batch_id": batch_id,
            "committed_partition_ids": list(committed),
            "skipped_partition_ids": list(plan.skipped),
            "rows_loaded": rows_loaded,
            "rows_quarantined": 0 if ctx is None else len(ctx.rejects),
            "completed_at": read_clock(self.clock, route=route, run_id=spec.run_id).isoformat(),
        }
        states.record_evidence(route, spec.run_id, evidence)
        recorder.emit(EventName.EVIDENCE_WRITTEN, run_id=spec.run_id)
        state = {**window.advanced_state(), "definition": definition}
        if edge is not None:
            ran = []  # this attempt's committed partitions, with the rows it recorded
            if ctx is not None and ctx.mutation is not None and ctx.edge is not None:
                recorded = ctx.edge.diagnostics
                ran = [
                    attrs.evolve(cp, diagnostics={**cp.diagnostics, **recorded(cp.partition_id)})
                    for cp in ctx.mutation.candidates
                ]
            earlier = latest.checkpoints(plan.skipped)
            record, untracked = advanced_edge(
                edge[0],
                upto=upto,
                top_since=top_since,
                kind=definition["cursor_kind"],
                generation_checkpoints=[*ran, *earlier.values()],
                lost=len(earlier) != len(plan.skipped),
            )
            state[EDGE_KEY] = record.as_state()
            for part in untracked:
                recorder.emit(EventName.CURSOR_EDGE_UNTRACKED, part=part)
        states.save_source_state(route, state)
        recorder.emit(EventName.SOURCE_STATE_ADVANCED, generation=window.generation + 1)
        return TransferResult(
            committed_partition_ids=committed,
            skipped_partition_ids=plan.skipped,
            rows_loaded=rows_loaded,
            events=tuple(recorder.events),
            guarded=not self.unguarded,
            batch_id=batch_id,
            rows_quarantined=0 if ctx is None else len(ctx.rejects),
        )

    def _ledger_sink(self, spec: TransferSpec, route: RouteKey) -> LedgerSink | None:
        """The sink, when it keeps the target's ledger for this run (on by default)."""
        if spec.ledger and route.located and isinstance(spec.sink, LedgerSink):
            return spec.sink
        return None

    @staticmethod
    def _fenced_epoch(ledger: LedgerSink | None, lease: Lease | None) -> int | None:
        """The lease epoch this attempt's batch is fenced with, above the target's fence (a
        store replaced or restored counts from lower); None without a fence or a lease."""
        if lease is None or not isinstance(ledger, Fencing):
            return None
        fence = ledger.fence_epoch()
        if fence >= lease.epoch:
            lease.raise_epoch(fence + 1)
        return lease.epoch

    def _held(self, lease: Lease | None) -> Any:
        """The store as the attempt's hooks write it: under the lease, when there is one."""
        if lease is None or not isinstance(self.store, LeaseStore):
            return self.store
        return HeldStore(self.store, lease)

    def _scan_route(
        self, route: RouteKey, latest: LatestCheckpoints, recovery: TargetRecovery | None
    ) -> bool:
        """Fire the route scan; refuse guards that no registered plugin claimed to read.

        ``latest`` holds every checkpoint of the target table (all its routes). True when
        the scan may have resolved some (``recovery``): they must be read again.
        """
        claims = self.hooks.resume_route_scan(route, latest, recovery)
        if any(claims):
            return recovery is not None
        guarded = latest.guarded_ids()
        if guarded:
            raise TargetCommitGuardUnhandled(
                f"route {route.label} carries "
                f"target-commit guards on {len(guarded)} partition(s) but no guard plugin is "
                "registered; install or enable the target_commit_guard plugin",
                diagnostics={"route": route.as_dict(), "partition_ids": guarded},
            )
        if not self.unguarded:
            raise self._no_guard(route)
        return False

    @staticmethod
    def _no_guard(route: RouteKey) -> TargetCommitGuardUnhandled:
        return TargetCommitGuardUnhandled(
            f"no registered plugin guards route {route.label} (the target_commit_guard entry "
            "point is missing, blocked, or replaced by plugins=); nothing was read or written. "
            "Reinstall dpone-native-transfer, add the guard (plugins=[*entry_point_plugins(), "
            "...]), or run unguarded on purpose with plugins=[] (CLI: run --unguarded)",
            diagnostics={"route": route.as_dict()},
        )


def _check_target(sink: Sink) -> None:
    """Open the target as the target call will, before anything reads it (its ledger, its
    fence): an unreachable, locked or read-only target fails here, never inside the armed
    call, and never as a raw engine error from a read."""
    if isinstance(sink, TargetChecking):
        sink.check_target()


def _held(sink: Sink) -> contextlib.AbstractContextManager[None]:
    """One connection for the attempt, when the sink can hold one (``ConnectionHolding``)."""
    return (
        sink.holding_connection()
        if isinstance(sink, ConnectionHolding)
        else contextlib.nullcontext()
    )


def _with_batch_column(route: RouteKey, shape: SourceShape, name: str | None) -> SourceShape:
    """The shape the target is loaded with: the source's columns, then the batch column."""
    if name is None:
        return shape
    if fold_ascii(name) in {fold_ascii(column.name) for column in shape.columns}:
        raise ConfigInvalid(
            f"route {route.label}: batch_column {name!r} is also a column of the source",
            diagnostics={"route": route.as_dict(), "key": "target.batch_column"},
        )
    return attrs.evolve(shape, columns=(*shape.columns, Column(name, "TEXT", "text")))


def _work_folder(
    spec: TransferSpec, route: RouteKey, *, leased: bool, idle_seconds: float
) -> tempfile.TemporaryDirectory[str]:
    """The attempt's private folder (mode 0700, fresh, removed after it): spool and artifact
    files. Made in ``spec.artifact_dir`` when given, else in the system's temp folder.

    Its name carries a digest of the target table and the process that made it, so under
    the table's lease the folders of earlier attempts on it, left by a killed worker, are
    removed first: those idle for ``idle_seconds`` (a store that is not shared would not
    exclude an attempt of another store on the same table), and never one whose process
    still runs on this machine (a worker paused past its lease reads its files again when
    it resumes, to be refused by the target's fence, not to fail on a missing file).
    """
    parent = spec.artifact_dir
    if parent is not None:
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError:
            raise ConfigInvalid(
                "artifact_dir cannot be created or is not a folder",
                diagnostics={"key": "transfer.artifact_dir"},
            ) from None
    table = hashlib.sha256(lease_key(route).encode()).hexdigest()[:12]
    prefix = f"dpone-transfer-{table}-"
    here = ProcessMark.here()
    if leased:  # no other attempt on this table is running: what is left is a dead one's
        folder = Path(parent if parent is not None else tempfile.gettempdir())
        for leftover in folder.glob(prefix + "*"):
            if not leftover.is_dir() or leftover.is_symlink():
                continue
            alive = _maker_alive(leftover.name.removeprefix(prefix), here)
            if alive is False or (alive is None and _idle(leftover, idle_seconds)):
                shutil.rmtree(leftover, ignore_errors=True)
    mine = f"{prefix}{_machine_of(here)}.{here.pid}.{here.started or 0}-"
    return tempfile.TemporaryDirectory(prefix=mine, dir=parent)


def _machine_of(mark: ProcessMark) -> str:
    return hashlib.sha256(f"{mark.host}\0{mark.machine}".encode()).hexdigest()[:8]


def _maker_alive(rest: str, here: ProcessMark) -> bool | None:
    """Whether the process of this machine that made a folder named
    ``<machine>.<pid>.<start>-...`` still runs; None when the name does not say: an older
    release's, or another machine's sharing the folder (idle then means dead)."""
    made, _, _ = rest.partition("-")
    machine, _, rest = made.partition(".")
    pid, _, started = rest.partition(".")
    if machine != _machine_of(here) or not (here.machine and pid.isdigit() and started.isdigit()):
        return None
    mark = attrs.evolve(here, pid=int(pid), started="" if started == "0" else started)
    return not mark.gone()


def _work_folder_failed(route: RouteKey, error: OSError) -> WorkFolderFailed:
    """A local file error before the target call: the sources and stores name their own, so
    it is the work folder's. Its text names the file (a path): not chained."""
    reason = errno.errorcode.get(error.errno or 0, "an I/O error")
    return WorkFolderFailed(
        f"route {route.label}: the run's work folder could not be written or read ({reason}: "
        "a full disk, a quota, a read-only or vanished folder); nothing was written to the "
        "target and the route is not blocked",
        diagnostics={"route": route.as_dict(), "key": "transfer.artifact_dir", "errno": reason},
    )


def _idle(folder: Path, seconds: float) -> bool:
    """True when nothing in ``folder`` changed for ``seconds``."""
    try:
        newest = max(path.stat().st_mtime for path in (folder, *folder.iterdir()))
    except OSError:
        return False
    return time.time() - newest > seconds


def _stamped(
    candidates: list[PartitionCheckpoint], batch_id: str, lease: Lease | None
) -> list[PartitionCheckpoint]:
    """The candidates, each naming the ledger batch it will be recorded under and the lease
    epoch that arms it (the fence passed it proves the attempt can no longer commit)."""
    stamp: dict[str, Any] = {LEDGER_BATCH_KEY: batch_id}
    if lease is not None:
        stamp[LEASE_EPOCH_KEY] = lease.epoch
        stamp[LEASE_PROCESS_KEY] = lease.process.as_dict()
    return [attrs.evolve(cp, diagnostics={**cp.diagnostics, **stamp}) for cp in candidates]
