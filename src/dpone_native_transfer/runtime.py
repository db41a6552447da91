"""TransferRuntime: one guarded, resumable attempt per ``run(spec)``.

Order of work: lease -> route scan (the guard over the target table's
checkpoints, then the store checked against the target's ledger) -> resume
plan -> path (pre-target work, then the target through the boundary) ->
evidence -> source state -> lease released. Evidence and source state come
only after checkpoint promotion, and also when nothing was active, so a run
that failed after promotion heals on the next run without a target call.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
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
from .connectors.contract import Sink, Unsupported
from .cursor_edge import EdgeTracker, advanced_edge
from .errors import (
    ConfigInvalid,
    LeaseLost,
    NativeTransferError,
    PathContractBroken,
    StoreTargetMismatch,
    TargetCommitGuardUnhandled,
    TargetRolledBack,
    WorkFolderFailed,
)
from .events import Event, EventName, EventRecorder
from .identity import file_location, fold_ascii
from .latest import LatestCheckpoints, as_latest
from .lease import (
    DEFAULT_LEASE_SECONDS,
    HeldStore,
    Lease,
    ProcessMark,
    lease_key,
)
from .ledger import (
    LedgerEntry,
    check_store_against_target,
    excused_batches,
    ledger_overrides,
    refresh_in_store,
)
from .paths import PathContext, SourceSnapshot, TransferPath
from .paths.auto import auto_path
from .paths.file_artifact import file_artifact_path
from .paths.lazy_plan import lazy_plan_path
from .paths.legacy import legacy_path
from .paths.staged import staged_path
from .payloads import Column, Merge, SourceShape
from .planner import AttemptPlan, plan_attempt
from .plugins import Hooks, make_plugin_manager, scans_routes
from .recovery import Prover, TargetRecovery
from .schema_contract import apply_schema_contract
from .source_state import SourceState
from .spec import TransferSpec, check_option
from .stores import FileStore, RouteStateStore, Store

__all__ = ["BUILTIN_PATHS", "TransferResult", "TransferRuntime", "TransferSpec"]  # the spec is
# ``spec.py``'s, named here too for the callers that found it here

BUILTIN_PATHS: Mapping[str, TransferPath] = {
    "legacy": legacy_path,
    "staged": staged_path,
    "file-artifact": file_artifact_path,
    "lazy-plan": lazy_plan_path,
    "auto": auto_path,  # one of the four, chosen per table
}


@attrs.frozen(kw_only=True)
class TransferResult:
    committed_partition_ids: tuple[str, ...]
    skipped_partition_ids: tuple[str, ...]
    rows_loaded: int
    events: tuple[Event, ...]
    batch_id: str | None = None
    guarded: bool = True  # False only when run unguarded on purpose (``plugins=[]``)
    rows_quarantined: int = 0  # rows set aside in the target's rejects table
    path: str | None = None  # the path that ran (``auto``'s choice); None: no target call


class TransferRuntime:
    """Runs transfers against one checkpoint store with one set of plugins.

    ``plugins=None`` loads the entry-point plugins (the target-commit guard is
    one); an explicit list replaces them (``[*entry_point_plugins(), mine]``
    adds to them). A run needs a plugin that claims the route scan (the guard),
    or it stops before any I/O: only ``plugins=[]`` or ``unguarded=True`` (with
    other plugins) runs unguarded, on purpose, and only on routes without
    guards. ``paths`` adds connector-provided paths to the built-in ones.
    ``lease_seconds`` is how long a target table's lease lasts without a
    heartbeat (a killed worker's lease expires after it). ``store`` is a ``stores.Store``
    (what ``open_store`` returns); ``state_store`` keeps the source state and evidence
    elsewhere.
    """

    def __init__(
        self,
        store: Store,
        *,
        clock: Clock | None = None,
        plugins: Iterable[object] | None = None,
        events: Callable[[Event], None] | None = None,
        state_store: RouteStateStore | None = None,
        paths: Mapping[str, TransferPath] | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        unguarded: bool = False,
    ) -> None:
        if not isinstance(store, Store):
            raise ConfigInvalid(
                f"the store ({type(store).__name__}) is not a dpone store: it must do all that "
                "dpone_native_transfer.stores.Store names (open one with open_store)",
                diagnostics={"key": "store"},
            )
        self.store: Store = store
        self.state_store: RouteStateStore = state_store if state_store is not None else store
        self.clock = clock or system_clock
        plugins = None if plugins is None else list(plugins)
        self.unguarded = unguarded is True or plugins == []
        self.plugin_manager = make_plugin_manager(plugins)
        self.hooks = Hooks(self.plugin_manager)
        self.paths = {**BUILTIN_PATHS, **(paths or {})}
        self._listener = events
        check_option("lease_seconds", "seconds", lease_seconds)
        self.lease_seconds = float(lease_seconds)

    def run(self, spec: TransferSpec) -> TransferResult:
        path = self.paths.get(spec.path)
        if path is None:
            raise ConfigInvalid(
                f"unknown path {spec.path!r}; known: {', '.join(sorted(self.paths))}",
                diagnostics={"key": "path"},
            )
        route = spec.route
        if not (self.unguarded or scans_routes(self.plugin_manager)):
            raise self._no_guard(route)
        _check_files_apart(route, self.store.path if isinstance(self.store, FileStore) else None)
        with (
            self._leased(route, spec.run_id) as lease,
            spec.sink.holding_connection(),
            SourceSnapshot(spec.source) as snapshot,
        ):
            return self._attempt(spec, path, route, lease, snapshot)

    def _leased(self, route: RouteKey, run_id: str) -> Lease:
        """The target table's lease, for the whole attempt."""
        return Lease(self.store.lease_table(), route, run_id=run_id, seconds=self.lease_seconds)

    def _attempt(
        self,
        spec: TransferSpec,
        path: TransferPath,
        route: RouteKey,
        lease: Lease,
        snapshot: SourceSnapshot,
    ) -> TransferResult:
        store = self._held(lease)  # what the attempt writes, it writes under its lease
        attempt = _Attempt(
            spec=spec,
            route=route,
            lease=lease,
            snapshot=snapshot,
            events=EventRecorder(self._listener),
            store=store,
            states=store if self.state_store is self.store else self.state_store,
            ledger=self._ledger_sink(spec, route),
        )
        try:
            latest, refreshed, epoch = self._scan(attempt)
        except StoreTargetMismatch:
            # a source file that is not there is that (source_invalid, exit 2), not a route
            # of another source that the target's ledger does not know (blocked, exit 3)
            spec.source.describe()
            raise
        shape = spec.source.describe()
        state = SourceState.read(route, self.state_store.load_source_state(route))
        if refreshed is not None:  # another route's full refresh: continue where it ended
            merges = route.strategy is Strategy.MERGE  # all again (``ledger._continues``)
            state = (state or SourceState()).realigned(None if merges else refreshed.watermark)
            # this route's checkpoints predate the refresh: none is a window of its now (one
            # with the same bounds was skipped as committed, and its rows never loaded again)
            latest = as_latest(())
            # kept before the target call: a run killed after its commit, before its state,
            # left the older state, and the next run (no longer realigned: its batch is
            # newer than the refresh) appended the refreshed rows again (exit 0)
            attempt.states.save_source_state(route, state.stored())
            attempt.events.emit(EventName.STATE_REALIGNED, batch_id=refreshed.batch_id)
        plan = plan_attempt(spec, route, latest, state, shape)
        if plan.many_partitions:
            column = spec.source.partition_column
            attempt.events.emit(
                EventName.MANY_PARTITIONS, partitions=len(plan.candidates), column=column
            )
        outcome = self._execute(attempt, path, plan, epoch) if plan.resume.active else _Outcome()
        self._settle(attempt, plan, latest, outcome)
        return TransferResult(
            committed_partition_ids=outcome.committed,
            skipped_partition_ids=plan.resume.skipped,
            rows_loaded=outcome.rows_loaded,
            events=tuple(attempt.events.events),
            guarded=not self.unguarded,
            batch_id=outcome.batch_id,
            rows_quarantined=outcome.rows_quarantined,
            path=outcome.path,
        )

    def _scan(self, attempt: _Attempt) -> tuple[LatestCheckpoints, LedgerEntry | None, int | None]:
        """The route scan (the guard, then the store against the target's ledger): the route's
        checkpoints, another route's full refresh of the table to continue from, and the epoch
        this attempt's batch is fenced with. With ``recovery = "from_target"`` the target is
        checked and fenced first, so the scan may resolve what the target proves."""
        spec, route, ledger, events = attempt.spec, attempt.route, attempt.ledger, attempt.events
        epoch = recovery = None
        if spec.recovery == "from_target":
            _check_target(spec.sink)
            epoch = self._fenced_epoch(ledger, attempt.lease)
            prover = Prover(
                ledger,
                epoch=epoch or 0,
                advance=True,
                batch_column=spec.batch_column,
                batch_route=route,
            )
            recovery = TargetRecovery(
                store=attempt.store, route=route, run_id=spec.run_id, prover=prover, events=events
            )
        scope = as_latest(self.store.list_target_latest(route))
        if self._scan_route(route, scope, recovery):
            scope = as_latest(self.store.list_target_latest(route))
        self.store.adopt_unlocated(route)
        latest = as_latest(self.store.list_latest(route))
        if recovery is None:
            _check_target(spec.sink)
            epoch = self._fenced_epoch(ledger, attempt.lease)
        refreshed = None
        if ledger is not None:
            refreshed = check_store_against_target(
                route,
                scope,
                ledger.read_ledger(),
                overridden=lambda: ledger_overrides(self.store, route),
                cursor_column=spec.source.cursor_column,
                target=ledger,
                started=lambda: self.state_store.load_source_state(route) is not None,
            )
        if refreshed is None:
            # a refresh that kept no ledger entry (ledger = false): the store remembers it
            cursor = spec.source.cursor_column
            refreshed = refresh_in_store(route, scope, cursor, ledgered=ledger is not None)
        events.emit(EventName.ROUTE_SCANNED, route=route.as_dict(), checkpoints=len(latest))
        return latest, refreshed, epoch

    def _execute(
        self, attempt: _Attempt, path: TransferPath, plan: AttemptPlan, epoch: int | None
    ) -> _Outcome:
        """Load the plan's active partitions: the path's pre-target work, then its one target
        call through the boundary; what the guard promoted is what was committed."""
        spec, route, lease, ledger = attempt.spec, attempt.route, attempt.lease, attempt.ledger
        active, entry, batch = list(plan.resume.active), None, None
        if ledger is not None:
            batch = batch_id_for(spec.run_id, [cp.partition_id for cp in active])
            active = _stamped(active, batch, lease)
            entry = LedgerEntry.for_batch(
                route,
                spec.run_id,
                active,
                **plan.window.advanced_state(),
                cursor_column=spec.source.cursor_column,
                at=read_clock(self.clock, route=route, run_id=spec.run_id),
                definition=plan.definition.as_dict(),
                epoch=epoch,
                excused=excused_batches(self.store, route, ledger.read_ledger),
            )
        shape = _with_batch_column(route, plan.shape, spec.batch_column)
        merge = plan.definition.merge
        _check_target_columns(attempt, shape, merge)
        idle = 2 * self.lease_seconds
        with _work_folder(spec, route, idle_seconds=idle) as work:
            ctx = PathContext(
                spec=spec,
                route=route,
                shape=shape,
                candidates=active,
                work_dir=Path(work),
                store=attempt.store,
                batch_value=None if spec.batch_column is None else batch,
                clock=self.clock,
                events=attempt.events,
                boundary=TargetBoundary(self.hooks, attempt.events),
                ledger_entry=entry,
                lease=lease,
                snapshot=attempt.snapshot,
                edge=_edge_tracker(spec, plan),
                merge=merge,
            )
            try:
                rows_loaded = path(ctx)
            except Unsupported as refused:  # a connector cannot: the route is not blocked
                if ctx.mutation is not None:
                    raise
                raise ctx.lacks(refused.what, **refused.diagnostics) from None
            except OSError as error:
                if ctx.mutation is not None:  # the boundary recorded the target call
                    raise
                if lease.lost:  # another attempt removed the folder
                    raise LeaseLost.lost(route) from None
                raise _work_folder_failed(route, error) from None
            except Exception as error:
                if _failed_in_target_call(ctx, error) and lease.lost:
                    # a newer holder raised the fence and ended this load's session
                    # (``Sink.advance_fence``): what failed it is the lease, lost before
                    raise LeaseLost.lost(route) from None
                raise
        return _Outcome.of(ctx, rows_loaded)

    def _settle(
        self, attempt: _Attempt, plan: AttemptPlan, latest: LatestCheckpoints, outcome: _Outcome
    ) -> None:
        """Evidence, then the source state advanced past the window: only after the guard
        promoted the checkpoints, and also when nothing was active (a run that failed after
        promotion heals here without a target call)."""
        spec, route, events = attempt.spec, attempt.route, attempt.events
        evidence = {
            "run_id": spec.run_id,
            "route": route.as_dict(),
            "path": outcome.path or spec.path,
            "generation": plan.window.generation,
            "batch_id": outcome.batch_id,
            "committed_partition_ids": list(outcome.committed),
            "skipped_partition_ids": list(plan.resume.skipped),
            "rows_loaded": outcome.rows_loaded,
            "rows_quarantined": outcome.rows_quarantined,
            "completed_at": read_clock(self.clock, route=route, run_id=spec.run_id).isoformat(),
        }
        attempt.states.record_evidence(route, spec.run_id, evidence)
        events.emit(EventName.EVIDENCE_WRITTEN, run_id=spec.run_id)
        advanced = plan.window.advanced_state()
        state = SourceState(**advanced, definition=plan.definition.as_dict())
        if plan.edge is not None:
            earlier = latest.checkpoints(plan.resume.skipped)
            record, untracked = advanced_edge(
                plan.edge.record,
                upto=plan.upto,
                top_since=plan.top_since,
                kind=plan.definition.cursor_kind,
                generation_checkpoints=[*outcome.ran, *earlier.values()],
                lost=len(earlier) != len(plan.resume.skipped),
                present=plan.edge.scan.present,
            )
            state = attrs.evolve(state, edge=record.as_state())
            for part in untracked:
                events.emit(EventName.CURSOR_EDGE_UNTRACKED, part=part)
        attempt.states.save_source_state(route, state.stored())
        events.emit(EventName.SOURCE_STATE_ADVANCED, generation=plan.window.generation + 1)

    def _ledger_sink(self, spec: TransferSpec, route: RouteKey) -> Sink | None:
        """The sink, when it keeps the target's ledger for this run (on by default)."""
        if spec.ledger and route.located and spec.sink.features.keeps_ledger:
            return spec.sink
        return None

    @staticmethod
    def _fenced_epoch(ledger: Sink | None, lease: Lease) -> int | None:
        """The lease epoch this attempt's batch is fenced with, above the target's fence (a
        store replaced or restored counts from lower); None without a fence."""
        if ledger is None or not ledger.features.fence:
            return None
        fence = ledger.fence_epoch()
        if fence >= lease.epoch:
            lease.raise_epoch(fence + 1)
        return lease.epoch

    def _held(self, lease: Lease) -> Any:
        """The store as the attempt's hooks write it: under the lease."""
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


@attrs.frozen(kw_only=True)
class _Attempt:
    """One attempt's parts: what it runs, under which lease, and where it writes."""

    spec: TransferSpec
    route: RouteKey
    lease: Lease
    snapshot: SourceSnapshot
    events: EventRecorder
    store: Any  # the checkpoint store, under the lease when there is one
    states: Any  # where the source state and evidence go (the store, or state_store)
    ledger: Sink | None  # the sink, when this run keeps the target's ledger


@attrs.frozen(kw_only=True)
class _Outcome:
    """What the target call committed: nothing, when no partition was active."""

    committed: tuple[str, ...] = ()
    batch_id: str | None = None
    rows_loaded: int = 0
    rows_quarantined: int = 0
    ran: tuple[PartitionCheckpoint, ...] = ()  # the committed candidates, edge rows recorded
    path: str | None = None  # the path that ran (``auto``'s choice)

    @classmethod
    def of(cls, ctx: PathContext, rows_loaded: int) -> _Outcome:
        """The outcome of a path that returned: it must have reached the target, and every
        checkpoint of its call must have been promoted by a plugin."""
        spec, route, mutation = ctx.spec, ctx.route, ctx.mutation
        if mutation is None:
            raise PathContractBroken(
                f"path {spec.path!r} returned without reaching the target boundary; "
                "nothing was written",
                diagnostics={"route": route.as_dict(), "path": spec.path},
            )
        state_ids = mutation.state.committed_ids
        committed = tuple(pid for pid in mutation.partition_ids if pid in state_ids)
        if len(committed) != len(mutation.partition_ids):
            raise TargetCommitGuardUnhandled(
                f"route {route.label}: the target call succeeded but "
                f"{len(mutation.partition_ids) - len(committed)} of "
                f"{len(mutation.partition_ids)} checkpoints were not promoted by any "
                "plugin; evidence and source state were not written and the route stays "
                "blocked until `dpone-transfer guard verify` and `guard resolve`",
                diagnostics={"route": route.as_dict(), "batch_id": mutation.state.batch_id},
            )
        ran: tuple[PartitionCheckpoint, ...] = ()
        if ctx.edge is not None:  # the committed partitions, with the edge rows recorded
            recorded = ctx.edge.diagnostics
            ran = tuple(
                attrs.evolve(cp, diagnostics={**cp.diagnostics, **recorded(cp.partition_id)})
                for cp in mutation.candidates
            )
        return cls(
            committed=committed,
            batch_id=mutation.state.batch_id,
            rows_loaded=rows_loaded,
            rows_quarantined=len(ctx.rejects),
            ran=ran,
            path=ctx.path_name,
        )


def _edge_tracker(spec: TransferSpec, plan: AttemptPlan) -> EdgeTracker | None:
    """The attempt's view of its edge, filtering the rows the route already loaded."""
    if plan.edge is None:
        return None
    kind = plan.definition.cursor_kind
    merge = plan.definition.merge
    return EdgeTracker(
        plan.edge.record, plan.shape.columns, spec.source, top_since=plan.top_since, kind=kind,
        key=() if merge is None else merge.key,
    )  # fmt: skip


def _check_target(sink: Sink) -> None:
    """Open the target as the target call will, before anything reads it (its ledger, its
    fence): an unreachable, locked or read-only target fails here, never inside the armed
    call, and never as a raw engine error from a read."""
    sink.check_target()


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
    spec: TransferSpec, route: RouteKey, *, idle_seconds: float
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
    # under the lease no other attempt on this table runs: what is left is a dead one's
    folder = Path(parent if parent is not None else tempfile.gettempdir())
    for leftover in folder.glob(prefix + "*"):
        if not leftover.is_dir() or leftover.is_symlink():
            continue
        alive = _maker_alive(leftover.name.removeprefix(prefix), here)
        if alive is False or (alive is None and _idle(leftover, idle_seconds)):
            shutil.rmtree(leftover, ignore_errors=True)
    mine = f"{prefix}{_machine_of(here)}.{here.pid}.{here.started or 0}-"
    try:
        return tempfile.TemporaryDirectory(prefix=mine, dir=parent)
    except OSError as error:  # a folder no folder can be made in (/proc), read-only, full
        raise _work_folder_failed(route, error) from None


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


def _failed_in_target_call(ctx: PathContext, error: Exception) -> bool:
    """Whether ``error`` came from inside the target call and is not one this package
    raised (those say what they mean): a driver's, or a driver's the sink knows failed
    before its COMMIT (``TargetRolledBack``), whose cause may be the lost lease."""
    state = None if ctx.mutation is None else ctx.mutation.state
    started = state is not None and state.target_started and not state.target_succeeded
    foreign = not isinstance(error, NativeTransferError) or isinstance(error, TargetRolledBack)
    return started and foreign


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


def _check_files_apart(route: RouteKey, store_path: str | None) -> None:
    """What a route file's checks refuse (``config._check_target_file``), for the library too:
    a SQLite target or store in the source's own file, or a store in the target's, by the
    route's locations. The store and the target in one file would be lost or restored
    together, and the guard's cross-check of each against the other would prove nothing."""
    located = {"source": route.source_location, "target": route.target_location}
    target = located["target"]
    if target is not None and target == located["source"] and target.startswith("sqlite:"):
        raise ConfigInvalid(
            "target.path is the source's own file: give the target a file of its own",
            diagnostics={"key": "target.path"},
        )
    store = None if store_path is None else file_location("sqlite", store_path)
    for name, location in located.items():
        if store is not None and location == store:
            raise ConfigInvalid(
                f"store.path is the {name}'s own file: give the store a file of its own",
                diagnostics={"key": "store.path"},
            )


def _check_target_columns(attempt: _Attempt, shape: SourceShape, merge: Merge | None) -> None:
    """Before the target call: the schema contract on the columns the target gets (a merge
    route's less its deleted column), and what a merge needs of the target table, or an
    append or refresh (every row kept)."""
    spec = attempt.spec
    target = shape.columns if merge is None else merge.target_columns(shape.columns)
    added = apply_schema_contract(attempt.route, spec.sink, target, spec.schema_contract)
    if added:
        attempt.events.emit(EventName.SCHEMA_EVOLVED, columns=added)
    if merge is not None:
        spec.sink.check_merge(merge, target)
    else:
        spec.sink.check_keeps_rows(target)


def _stamped(
    candidates: list[PartitionCheckpoint], batch_id: str, lease: Lease
) -> list[PartitionCheckpoint]:
    """The candidates, each naming the ledger batch it will be recorded under and the lease
    epoch that arms it (the fence passed it proves the attempt can no longer commit)."""
    stamp = {
        LEDGER_BATCH_KEY: batch_id,
        LEASE_EPOCH_KEY: lease.epoch,
        LEASE_PROCESS_KEY: lease.process.as_dict(),
    }
    return [attrs.evolve(cp, diagnostics={**cp.diagnostics, **stamp}) for cp in candidates]
