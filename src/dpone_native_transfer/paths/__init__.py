"""Transfer paths and the context they work in.

A path is a callable ``path(ctx: PathContext) -> int`` that does its
pre-target work (extract, stage, export, govern) and then reaches the target
exactly once, through :meth:`PathContext.mutate`. It returns the rows the
target reported loading. Paths never see the guard; the hooks fired by the
boundary give every path the same guard behaviour.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

import attrs

from ..artifacts import create_private, open_files_allowed, read_chunks, write_chunks
from ..boundary import TargetBoundary, TargetMutation
from ..checkpoints import PartitionCheckpoint, RouteKey, Strategy
from ..clock import Clock
from ..column_types import Carry, carried_chunks, column_carriers
from ..connectors.contract import (
    FilePulling,
    LedgerSink,
    MergingLoadFiles,
    NativeFiles,
    Sink,
    Snapshotting,
    Source,
    StagePulling,
    ValueCarrying,
    WriteWatching,
)
from ..cursor_edge import EdgeTracker, is_edge
from ..errors import ConfigInvalid, GovernanceGateFailed, PathContractBroken
from ..events import EventName, EventRecorder
from ..payloads import (
    Column,
    LoadFile,
    LoadFiles,
    LoadPlan,
    RowChunks,
    SourceShape,
    bounds_label,
)
from ..rejects import Reject
from ..stores import CheckpointStore
from ._one_pass import one_pass, spool_partitions, spooled_chunks

if TYPE_CHECKING:
    from ..lease import Lease
    from ..ledger import LedgerEntry
    from ..runtime import TransferSpec

__all__ = ["MAX_GATE_ROWS", "Governance", "PathContext", "SourceSnapshot", "TransferPath"]

T = TypeVar("T")


MAX_GATE_ROWS = 2**63 - 1  # a row count SQL engines hold; a larger gate could never fail


def _gate(_instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    number = isinstance(value, int) and not isinstance(value, bool)
    if value is not None and not (number and 0 <= value <= MAX_GATE_ROWS):
        key = f"gates.{attribute.name}"
        raise ConfigInvalid(
            f"{key} must be an integer from 0 to {MAX_GATE_ROWS:,}", diagnostics={"key": key}
        )


@attrs.frozen(kw_only=True)
class Governance:
    """Pre-target gates. A failed gate stops the attempt before the target and writes nothing."""

    min_rows: int | None = attrs.field(default=None, validator=_gate)
    max_rows: int | None = attrs.field(default=None, validator=_gate)

    @property
    def enabled(self) -> bool:
        return self.min_rows is not None or self.max_rows is not None

    def check(self, route: RouteKey, rows: int) -> None:
        too_few = self.min_rows is not None and rows < self.min_rows
        too_many = self.max_rows is not None and rows > self.max_rows
        if too_few or too_many:
            raise GovernanceGateFailed(
                "the row-count gate refused the attempt before any target I/O",
                diagnostics={
                    "route": route.as_dict(),
                    "gate": "min_rows" if too_few else "max_rows",
                    "rows": rows,
                    "limit": self.min_rows if too_few else self.max_rows,
                },
            )


class SourceSnapshot:
    """The attempt's snapshot of its source, when the source can hold one (``Snapshotting``):
    begun on entering, ended before an engine reads the source (``read_by_engine``), and
    begun again for the reads dpone makes after an engine's read it threw away."""

    def __init__(self, source: Source | None) -> None:
        self._source = source
        self._held = contextlib.ExitStack()

    def begin(self) -> None:
        if isinstance(self._source, Snapshotting):
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
    rejects: list[Reject] = attrs.field(factory=list)  # rows set aside (quarantine)
    snapshot: SourceSnapshot = attrs.field(factory=lambda: SourceSnapshot(None))
    _carriers: list[tuple[int, str, Carry]] | None = attrs.field(default=None, init=False)
    _spooled: dict[str, Path] | None = attrs.field(default=None, init=False)  # one-pass scan

    @property
    def source(self) -> Source:
        return self.spec.source

    @property
    def sink(self) -> Sink:
        return self.spec.sink

    @property
    def replace(self) -> bool:
        return self.route.strategy is Strategy.FULL_REFRESH

    def read(self, candidate: PartitionCheckpoint) -> Iterable[Sequence[tuple]]:
        """The partition's rows from the source, in bounded chunks, carried for the sink.

        Values pass through the sink's carriers (``ValueCarrying``), so every row
        path spools, stages or exports exactly what the target will hold. An edge
        partition's rows the route already loaded are left out (``cursor_edge.py``). A source
        that reads every partition of the attempt in one scan does so at the first read
        (``OnePassReading``, ``_one_pass.py``).
        """
        rows = self.spec.chunk_rows
        if self._spooled is None:
            self._spooled = spool_partitions(self.source, self.candidates, self.work_dir, rows)
        spooled = self._spooled.get(candidate.partition_id)
        if spooled is not None:
            chunks: Iterable[list[tuple]] = spooled_chunks(spooled, rows)
        else:
            chunks = self.source.read(candidate.partition_bounds, chunk_rows=rows)
        if self.edge is not None:
            chunks = self.edge.rows(candidate, chunks)
        return self._carry(chunks, candidate.partition_id)

    def _carry(
        self, chunks: Iterable[Sequence[tuple]], partition_id: str | None = None
    ) -> Iterable[Sequence[tuple]]:
        """The rows as the sink holds them (``ValueCarrying``); a row the sink cannot hold
        exactly stops the run, or with ``on_bad_value = "quarantine"`` is set aside."""
        if self.batch_value is not None:  # the shape's last column, the batch column
            chunks = _with_value(chunks, self.batch_value)
        if self._carriers is None:
            self._carriers = _carriers(self.sink, self.shape.columns)
        if not self._carriers:
            return chunks
        target = type(self.sink).__name__.removesuffix("Sink")
        spec = self.spec
        reject = None
        if spec.on_bad_value == "quarantine":

            def reject(row: tuple, column: str, value: Any) -> None:
                keep = spec.quarantine_values
                found = Reject.of(
                    row, column, value, partition_id=partition_id, target=target, keep_value=keep
                )
                self.rejects.append(found)

        return carried_chunks(chunks, self._carriers, target=target, reject=reject)

    def extract(self) -> Iterator[Sequence[tuple]]:
        """Every candidate's rows, carried for the sink, recording each one's count
        (``extracted``) once its rows have all passed.

        From a source that reads the attempt in one scan (``OnePassReading``), the
        chunks come straight from that scan, partitions interleaved in scan order,
        and nothing is spooled; otherwise partition by partition, as ``read`` gives
        them. An append route whose cursor edge is tracked reads partition by partition.
        """
        scan = None
        if self.edge is None:
            scan = one_pass(self.source, self.candidates, self.spec.chunk_rows)
        if scan is None:
            for index, candidate in enumerate(self.candidates):
                rows = 0
                for chunk in self.read(candidate):
                    rows += len(chunk)
                    yield chunk
                self.extracted(index, rows)
            return
        counts = [0] * len(self.candidates)

        def chunks() -> Iterator[list[tuple]]:  # the scan's small groups, joined again
            pending: list[tuple] = []
            for index, rows in scan:
                counts[index] += len(rows)
                pending.extend(rows)
                if len(pending) >= self.spec.chunk_rows:
                    yield pending
                    pending = []
            if pending:
                yield pending

        yield from self._carry(chunks())
        for index, rows in enumerate(counts):
            self.extracted(index, rows)

    def row_chunks(self, chunks: Iterable[Sequence[tuple]]) -> RowChunks:
        return RowChunks(columns=self.shape.columns, chunks=chunks, replace=self.replace)

    def write_load_file(self, name: str, chunks: Iterable[Sequence[tuple]]) -> LoadFile:
        """``chunks`` in a new private file of the work folder, before the target call: in the
        format the sink's engine reads itself (``NativeFiles``) when every value fits it,
        otherwise in the runtime's spool format (``artifacts.py``)."""
        sink = self.sink
        if isinstance(sink, NativeFiles):
            native = self.work_dir / f"{name}.arrows"
            written = sink.write_load_file(native, self.shape.columns, chunks)
            if isinstance(written, LoadFile):
                return written
            chunks = written  # every row, read back from ``native`` as the spool is written
        spool = self.work_dir / f"{name}.rows"
        with create_private(spool) as handle:
            rows, digest = write_chunks(handle, chunks)
        if isinstance(sink, NativeFiles):
            native.unlink(missing_ok=True)  # a sink may give the rows without writing it
        return LoadFile(path=spool, rows=rows, sha256=digest, native=False)

    def pulled_files(self, *, per_partition: bool) -> list[LoadFile] | None:
        """The candidates' rows in load files the sink's engine writes from the source itself
        (``FilePulling``): one file, or one per candidate; each candidate's count recorded
        (``extracted``, with its file's digest when it has one). None when the engine cannot
        read them exactly, or an edge partition's loaded rows must be left out (only dpone
        can): the path then reads the rows itself. A file per candidate is pulled in one
        read when the sink takes them all (SQLite writes one at a time). Else, from a source
        that watches its writes (``WriteWatching``), in groups of at most
        ``open_files_allowed()`` (an engine holds each group's files open), kept only when
        no write came meanwhile. All between the same two reads of the cursor's top rows."""
        sink = self.sink
        count = len(self.candidates)

        def plan_of(group: range) -> LoadPlan | None:  # a sink checks one plan at a time
            return self._pull_plan(len(group) if per_partition else 1, group)

        groups = [range(count)]
        first = plan_of(groups[0])
        step, source = open_files_allowed(), self.source
        if first is None and per_partition and count > step and isinstance(source, WriteWatching):
            groups = [range(at, min(at + step, count)) for at in range(0, count, step)]
            first = plan_of(groups[0])
        if first is None or not isinstance(sink, FilePulling):
            return None
        names = [c.partition_id for c in self.candidates] if per_partition else ["load"]
        paths = [self.work_dir / f"{name}{sink.pulled_suffix}" for name in names]

        def discard(pulled: tuple[list[LoadFile], list[int]]) -> None:
            for file in pulled[0]:  # Python's own files may take the same names
                file.path.unlink(missing_ok=True)

        def pull_groups() -> tuple[list[LoadFile], list[int]] | None:
            files: list[LoadFile] = []
            counts: list[int] = []
            for number, group in enumerate(groups):
                plan = first if number == 0 else plan_of(group)
                group_paths = paths[group.start : group.stop] if per_partition else paths
                pulled = None if plan is None else sink.pull_load_files(plan, group_paths)
                if pulled is None:
                    discard((files, counts))
                    return None
                files += pulled[0]
                counts += pulled[1]
            return files, counts

        def pull() -> tuple[list[LoadFile], list[int]] | None:
            if len(groups) == 1 or not isinstance(source, WriteWatching):
                return pull_groups()
            with source.watching_writes() as written:
                pulled = pull_groups()
                if pulled is not None and written():  # a row may have moved between groups
                    discard(pulled)
                    return None
                return pulled

        pulled = self.read_by_engine(pull, discard=discard)
        if pulled is None:
            return None
        files, counts = pulled
        for index, rows in enumerate(counts):
            digest = {"artifact_sha256": files[index].sha256} if per_partition else {}
            self.extracted(index, rows, **digest)
        return files

    def pulled_stage(self) -> bool:
        """Whether the sink's engine staged the candidates' rows from the source itself
        (``StagePulling``), each candidate's count recorded; False when it could not, as
        ``pulled_files`` gives None: the path then stages the rows the runtime reads."""
        sink = self.sink
        if not isinstance(sink, StagePulling):
            return False
        plan = self._pull_plan(1)
        if plan is None:
            return False
        counts = self.read_by_engine(
            lambda: sink.pull_stage(plan), discard=lambda _: sink.discard_stage()
        )
        if counts is None:
            return False
        for index, rows in enumerate(counts):
            self.extracted(index, rows)
        return True

    def _pull_plan(self, files: int, numbers: range | None = None) -> LoadPlan | None:
        """The plan of the candidates (those ``numbers``, or all), when the sink's engine can
        pull it (``FilePulling``) into ``files`` files; asked before the cursor edge's rows
        are read for it."""
        sink = self.sink
        if not isinstance(sink, FilePulling) or self.batch_value is not None:
            return None  # the engine reads the source's columns; the batch column is dpone's
        candidates = (
            self.candidates if numbers is None else self.candidates[numbers.start : numbers.stop]
        )
        if any(is_edge(candidate.partition_bounds) for candidate in self.candidates):
            return None
        plan = LoadPlan(
            source=self.source,
            columns=self.shape.columns,
            bounds=tuple(candidate.partition_bounds for candidate in candidates),
            replace=self.replace,
        )
        return plan if sink.can_pull(plan, files) else None

    @overload
    def read_by_engine(self, read: Callable[[], T]) -> T: ...

    @overload
    def read_by_engine(
        self, read: Callable[[], T | None], *, discard: Callable[[T], None]
    ) -> T | None: ...

    def read_by_engine(
        self, read: Callable[[], T | None], *, discard: Callable[[T], None] | None = None
    ) -> T | None:
        """``read()``, in which the engine reads the source itself, between two reads of the
        rows at the top of the cursor edge: when they agree, the engine read exactly those
        (``EdgeTracker.confirm_top``). A ``read`` that gives None read nothing, and records
        nothing.

        When they differ (rows were written at the top meanwhile), which of them the engine
        read is unknown. A read done before the target call (a pull) is then ``discard``ed
        and None returned, so that Python reads the rows, each one tracked: keeping it lost
        the rows written at the top for good. Lazy-plan's read is the target call itself:
        its top rows become unknown (``docs/incremental.md``). A pull that is kept is known
        before the checkpoints are armed, which may then keep its rows, as Python's.

        The engine reads the source as it is now, not as the attempt's snapshot holds it, so
        the snapshot ends first (``SourceSnapshot``): the reads of the top rows around the
        engine's must see what it read (a row written at the top after the snapshot was
        loaded, not recorded, and loaded again by the next run), and so must every read
        after a read kept. When None is returned, dpone reads the rows itself, in a snapshot
        begun again: read live, a row moved between two of its reads was lost or doubled."""
        self.snapshot.end()
        result = self._between_top_reads(read, discard)
        if result is None:
            self.snapshot.begin()
        return result

    def _between_top_reads(
        self, read: Callable[[], T | None], discard: Callable[[T], None] | None
    ) -> T | None:
        if self.edge is None or self.edge.top_since is None:
            return read()
        window = (self.source, self.candidates, self.spec.chunk_rows)
        before = self.edge.top_rows(*window)
        result = read()
        if result is None:
            return result
        try:
            after = self.edge.top_rows(*window)
        except Exception:  # what the engine read is then only unknown
            after = {}
        if discard is not None and after != before:
            discard(result)
            return None
        self.edge.confirm_top(before, after, persisted=discard is not None)
        return result

    def load_files(self, files: Sequence[LoadFile]) -> LoadFiles:
        """The payload of files ``write_load_file`` wrote or the sink pulled: a ``NativeFiles``
        sink loads the files, any other their rows (each spool file's digest checked as it is
        read). A sink that reads only so many of its files at once merges them here, before
        the target call (``MergingLoadFiles``)."""
        chunks = _spooled_rows(files)
        columns, replace = self.shape.columns, self.replace
        payload = LoadFiles(columns=columns, chunks=chunks, replace=replace, files=tuple(files))
        if isinstance(self.sink, MergingLoadFiles):
            return self.sink.merge_load_files(payload, self.work_dir)
        return payload

    def extracted(self, index: int, rows: int, **diagnostics: Any) -> None:
        """Record what extraction produced for ``candidates[index]``."""
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
            done=index + 1,
            of=len(self.candidates),
        )

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

    def lacks(self, capability: str) -> ConfigInvalid:
        """The error of a path whose sink lacks the capability it needs, raised before the
        target (the route is not blocked): ``raise ctx.lacks("a staging table")``."""
        return ConfigInvalid(
            f"path {self.spec.path!r} needs {capability}, which the sink of target table "
            f"{self.sink.table!r} does not have: use another path",
            diagnostics={"route": self.route.as_dict(), "path": self.spec.path},
        )

    def check_governance(self, rows: int) -> None:
        self.spec.governance.check(self.route, rows)

    def mutate(self, operation: str, invoke: Callable[[], T], *, sent: int | None = None) -> T:
        """Reach the target once, through the boundary that fires the guard hooks. ``sent``:
        the rows the call hands the target (counted before it), which the target must apply
        (``ledger.check_applied``); None when the engine reads them itself (lazy-plan)."""
        if self.mutation is not None:
            raise PathContractBroken(
                f"path {self.spec.path!r} tried to reach the target twice in one attempt; the "
                "second call was refused before the target",
                diagnostics={"route": self.route.as_dict(), "path": self.spec.path},
            )
        if self.lease is not None:
            self.lease.confirm()  # a worker paused past its lease stops here, before arming
        self.events.emit(EventName.PRE_TARGET_DONE, partitions=len(self.candidates))
        self.mutation = TargetMutation(
            route=self.route,
            run_id=self.spec.run_id,
            path=self.spec.path,
            operation=operation,
            candidates=tuple(self.candidates),
            store=self.store,
            clock=self.clock,
        )
        if self.ledger_entry is not None:  # every path's target call records its batch
            entry = self.ledger_entry.with_counts(self.candidates, sent=sent, rejects=self.rejects)
            call, sink = invoke, self.sink
            assert isinstance(sink, LedgerSink)  # the runtime makes an entry for one only

            def invoke() -> T:
                with sink.ledger_batch(entry):
                    return call()

        return self.boundary.run(self.mutation, invoke)


def _with_value(chunks: Iterable[Sequence[tuple]], value: Any) -> Iterator[list[tuple]]:
    for chunk in chunks:
        yield [(*row, value) for row in chunk]


def _spooled_rows(files: Sequence[LoadFile]) -> Iterator[list[tuple]]:
    for file in files:
        if file.native:  # written for a NativeFiles sink only, which reads the file itself
            raise PathContractBroken(
                "a file in a sink's own format reached a sink that reads rows",
                diagnostics={"file": file.path.name},
            )
        yield from read_chunks(file.path, file.sha256)


def _carriers(sink: Sink, columns: Sequence[Column]) -> list[tuple[int, str, Carry]]:
    return column_carriers(columns, sink.carrier) if isinstance(sink, ValueCarrying) else []


TransferPath = Callable[[PathContext], int]
