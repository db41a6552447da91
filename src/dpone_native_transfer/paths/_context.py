"""The context a transfer path works in: what the hooks and the boundary need, and the
path's target call (``mutate``). Reading rows is ``_rows.py``'s, load files and engine
pulls ``_files.py``'s; the context hands their methods to paths."""

from __future__ import annotations

import contextlib
import inspect
import types
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from ..boundary import TargetBoundary, TargetMutation
from ..checkpoints import PartitionCheckpoint, RouteKey, Strategy
from ..clock import Clock
from ..connectors.contract import Sink, Source
from ..cursor_edge import EdgeTracker
from ..errors import ConfigInvalid, PathContractBroken
from ..events import EventName, EventRecorder
from ..payloads import LoadFile, LoadFiles, LoadPlan, Merge, RowChunks, SourceShape, bounds_label
from ..rejects import Reject
from ..spec import TRANSFER_PATHS, TransferSpec
from ..stores import CheckpointStore
from ._files import FileMaker
from ._rows import RowReader

if TYPE_CHECKING:
    from ..lease import Lease
    from ..ledger import LedgerEntry

__all__ = ["PathContext", "SourceSnapshot", "TransferPath"]

T = TypeVar("T")


class SourceSnapshot:
    """The attempt's snapshot of its source (``Source.snapshot``): begun on entering, ended
    before an engine reads the source (``read_by_engine``), and begun again for the reads
    dpone makes after an engine's read it threw away."""

    def __init__(self, source: Source | None) -> None:
        self._source = source
        self._held = contextlib.ExitStack()

    def begin(self) -> None:
        if self._source is not None:
            self._held.enter_context(self._source.snapshot())

    def end(self) -> None:
        self._held.close()

    def __enter__(self) -> SourceSnapshot:
        self.begin()
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


@attrs.define(eq=False, kw_only=True)
class PathContext:
    """Everything one path needs for one attempt; the path changes only ``candidates``."""

    spec: TransferSpec
    route: RouteKey
    shape: SourceShape
    candidates: list[PartitionCheckpoint]
    work_dir: Path
    store: CheckpointStore
    clock: Clock
    events: EventRecorder
    boundary: TargetBoundary
    mutation: TargetMutation | None = None
    ledger_entry: LedgerEntry | None = None  # the batch's ledger row, when the sink keeps one
    lease: Lease | None = None
    edge: EdgeTracker | None = None  # an append route's cursor edge, when it is tracked
    batch_value: str | None = None  # ``batch_column``: each row's last value, its batch id
    merge: Merge | None = None  # a merge route's key (``payloads.Merge``), for the sink
    rejects: list[Reject] = attrs.field(factory=list)  # rows set aside (quarantine)
    snapshot: SourceSnapshot = attrs.field(factory=lambda: SourceSnapshot(None))
    rows: RowReader = attrs.field(init=False)
    files: FileMaker = attrs.field(init=False)
    path_name: str = attrs.field(init=False)  # the path that runs: ``auto`` names its choice

    def __attrs_post_init__(self) -> None:
        self.rows, self.files = RowReader(self), FileMaker(self)
        self.path_name = self.spec.path

    @property
    def source(self) -> Source:
        return self.spec.source

    @property
    def sink(self) -> Sink:
        return self.spec.sink

    @property
    def replace(self) -> bool:
        return self.route.strategy is Strategy.FULL_REFRESH

    # -- reading rows (``_rows.py``) and making load files (``_files.py``), for paths ------

    def read(self, candidate: PartitionCheckpoint) -> Iterable[Sequence[tuple]]:
        """One partition's rows, carried for the sink (``RowReader.read``)."""
        return self.rows.read(candidate)

    def extract(self) -> Iterator[Sequence[tuple]]:
        """Every candidate's rows, counts recorded (``RowReader.extract``)."""
        return self.rows.extract()

    def row_chunks(self, chunks: Iterable[Sequence[tuple]]) -> RowChunks:
        return RowChunks(
            columns=self.shape.columns, chunks=chunks, replace=self.replace, merge=self.merge
        )

    def write_load_file(self, name: str, chunks: Iterable[Sequence[tuple]]) -> LoadFile:
        """``chunks`` in a load file of the work folder (``FileMaker.write_load_file``)."""
        return self.files.write_load_file(name, chunks)

    def pulled_files(self, *, per_partition: bool) -> list[LoadFile] | None:
        """Load files the sink's engine pulled, or None (``FileMaker.pulled_files``)."""
        return self.files.pulled_files(per_partition=per_partition)

    def pulled_stage(self) -> bool:
        """Whether the sink's engine staged the rows itself (``FileMaker.pulled_stage``)."""
        return self.files.pulled_stage()

    def load_files(self, files: Sequence[LoadFile]) -> LoadFiles:
        """The payload of load files (``FileMaker.load_files``)."""
        return self.files.load_files(files)

    def read_by_engine(self, read: Callable[[], Any], **discard: Any) -> Any:
        """``read()``, the engine reading the source itself (``FileMaker.read_by_engine``)."""
        return self.files.read_by_engine(read, **discard)

    # -- what the hooks and the boundary need -----------------------------------------------

    def extracted(self, index: int, rows: int, *, read: str = "rows", **diagnostics: Any) -> None:
        """Record what extraction produced for ``candidates[index]``, and how its rows were
        read (the event's ``read``): ``rows`` by dpone, ``bulk`` by the source into files
        (``Source.bulk()``), ``engine`` by the sink's engine from the source itself."""
        candidate = self.candidates[index]
        if self.edge is not None:
            diagnostics.update(self.edge.diagnostics(candidate.partition_id, persisted=True))
        self.candidates[index] = attrs.evolve(
            candidate, rows_exported=rows, diagnostics={**candidate.diagnostics, **diagnostics}
        )
        self.events.emit(
            EventName.PARTITION_EXTRACTED,
            partition_id=candidate.partition_id,
            partition=bounds_label(candidate.partition_bounds, self.source.partition_column),
            rows=rows,
            read=read,
            done=index + 1,
            of=len(self.candidates),
        )

    def extracted_files(
        self, files: Sequence[LoadFile], counts: Sequence[int], *, read: str, per_partition: bool
    ) -> None:
        """``extracted`` for files read in bulk or by the engine: one per candidate
        (``per_partition``: each with its digest, checked again at load) or one for all
        (``counts`` per candidate)."""
        for index, rows in enumerate(counts):
            digest = {"artifact_sha256": files[index].sha256} if per_partition else {}
            self.extracted(index, rows, read=read, **digest)

    def planned(self) -> None:
        """Report each candidate as planned for the engine to pull (lazy-plan: no rows pass)."""
        for index, candidate in enumerate(self.candidates):
            self.events.emit(
                EventName.PARTITION_PLANNED,
                partition_id=candidate.partition_id,
                partition=bounds_label(candidate.partition_bounds, self.source.partition_column),
                done=index + 1,
                of=len(self.candidates),
            )

    def lacks(self, what: str, **diagnostics: Any) -> ConfigInvalid:
        """The error of a path whose connector cannot provide ``what`` (it raised
        ``Unsupported``, with its ``diagnostics``), raised before the target, so the route is
        not blocked."""
        others = [name for name in TRANSFER_PATHS if name != self.spec.path]
        return ConfigInvalid(
            f"path {self.spec.path!r} cannot run on target table {self.sink.table!r}: its "
            f"connectors cannot provide {what}; use {', '.join(others[:-1])} or {others[-1]}",
            diagnostics={**diagnostics, "route": self.route.as_dict(), "path": self.spec.path},
        )

    def check_governance(self, rows: int) -> None:
        self.spec.governance.check(self.route, rows)

    def mutate(
        self,
        operation: str,
        call: Callable[..., T],
        /,
        *args: Any,
        sent: int | None = None,
        **kwargs: Any,
    ) -> T:
        """Reach the target once, through the boundary that fires the guard hooks:
        ``call(*args, **kwargs)``, a target call of the contract (``Sink.load``,
        ``Sink.finalize_staged_load``, ``EnginePull.load_plan``), given the batch's ledger
        entry as ``ledger=`` when the route keeps the ledger. ``sent``: the rows the call
        hands the target (counted before it), which the target must apply
        (``ledger.check_applied``); None when the engine reads them itself (lazy-plan)."""
        self._check_target_call(call, args)
        if self.lease is not None:
            self.lease.confirm()  # a worker paused past its lease stops here, before arming
        self.events.emit(EventName.PRE_TARGET_DONE, partitions=len(self.candidates))
        self.mutation = TargetMutation(
            route=self.route,
            run_id=self.spec.run_id,
            path=self.path_name,
            operation=operation,
            candidates=tuple(self.candidates),
            store=self.store,
            clock=self.clock,
        )
        if self.ledger_entry is not None:  # every path's target call records its batch
            entry = self.ledger_entry.with_counts(self.candidates, sent=sent, rejects=self.rejects)
            kwargs["ledger"] = entry
        return self.boundary.run(self.mutation, lambda: call(*args, **kwargs))

    def _check_target_call(self, call: Callable[..., Any], args: tuple[Any, ...]) -> None:
        """Refuse, before the target, a second target call, one that cannot take the batch's
        ledger entry (a path of release 0.1 passed ``lambda: sink.load(...)``), or a payload
        the call does not take: a path's bug, never a call of unknown outcome."""
        named = isinstance(call, (types.FunctionType, types.MethodType))
        wanted = _PAYLOADS.get(call.__name__) if named else None
        problem = None
        if self.mutation is not None:
            problem = "tried to reach the target twice in one attempt; the second call was"
        elif self.ledger_entry is not None and not _takes_ledger(call):
            problem = (
                "made a target call that takes no ledger entry (pass the sink's method: "
                "ctx.mutate(operation, sink.load, payload)); it was"
            )
        elif wanted is not None and not (args and isinstance(args[0], wanted)):
            problem = f"handed {call.__name__} a payload that is not a {wanted.__name__}; it was"
        if problem is not None:
            raise PathContractBroken(
                f"path {self.spec.path!r} {problem} refused before the target",
                diagnostics={"route": self.route.as_dict(), "path": self.spec.path},
            )


# The target calls that take a payload, and its type (``finalize_staged_load`` takes none).
_PAYLOADS: dict[str, type] = {"load": RowChunks, "load_plan": LoadPlan}


def _takes_ledger(call: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(call).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "ledger" or p.kind is p.VAR_KEYWORD for p in parameters)


TransferPath = Callable[[PathContext], int]
