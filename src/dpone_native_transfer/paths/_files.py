"""Load files and engine pulls: the rows of an attempt in files before the target call, in the
sink's engine's format when it has one, or pulled by that engine from the source itself
(``Sink.engine()``, ``EnginePull``); and every read an engine makes of the source, between
two reads of the cursor edge's top rows."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar, overload

import attrs

from ..artifacts import create_private, open_files_allowed, read_chunks, write_chunks
from ..cursor_edge import is_edge
from ..errors import PathContractBroken
from ..payloads import LoadFile, LoadFiles, LoadPlan
from ._bulk import bulk_files

if TYPE_CHECKING:
    from ._context import PathContext

__all__ = ["FileMaker"]

T = TypeVar("T")


@attrs.define(eq=False)
class FileMaker:
    """One attempt's load files and engine reads (``PathContext`` hands them to paths)."""

    ctx: PathContext

    def write_load_file(self, name: str, chunks: Iterable[Sequence[tuple]]) -> LoadFile:
        """``chunks`` in a new private file of the work folder, before the target call: in the
        format the sink's engine reads itself (``EnginePull.write_load_file``) when every
        value fits it, otherwise in the runtime's spool format (``artifacts.py``)."""
        ctx = self.ctx
        engine = ctx.sink.engine()
        native = ctx.work_dir / f"{name}.arrows"
        if engine is not None:
            written = engine.write_load_file(native, ctx.shape.columns, chunks)
            if isinstance(written, LoadFile):
                return written
            chunks = written  # every row, read back from ``native`` as the spool is written
        spool = ctx.work_dir / f"{name}.rows"
        with create_private(spool) as handle:
            rows, digest = write_chunks(handle, chunks)
        native.unlink(missing_ok=True)  # an engine may give the rows back without writing it
        return LoadFile(path=spool, rows=rows, sha256=digest, native=False)

    def pulled_files(self, *, per_partition: bool) -> list[LoadFile] | None:
        """The candidates' rows in load files the sink's engine writes from the source itself
        (``EnginePull.pull_load_files``): one file, or one per candidate; each candidate's
        count recorded (``extracted``, with its file's digest when it has one). None when the
        engine cannot read them exactly, or an edge partition's loaded rows must be left out
        (only dpone can): the path then reads the rows itself. A file per candidate is
        pulled in one read when the engine takes them all (SQLite writes one at a time).
        Else, from a source that watches its writes (``features.watches_writes``), in groups
        of at most ``open_files_allowed()`` (an engine holds each group's files open), kept
        only when no write came meanwhile. All between the same two reads of the top rows.
        An engine that cannot read the source gets the files the source writes itself,
        where it writes them (``_bulk.bulk_files``)."""
        ctx = self.ctx
        engine, source, count = ctx.sink.engine(), ctx.source, len(ctx.candidates)
        if engine is None:
            return None

        def plan_of(group: range) -> LoadPlan | None:  # an engine checks one plan at a time
            return self._pull_plan(len(group) if per_partition else 1, group)

        groups = [range(count)]
        first = plan_of(groups[0])
        step, watched = open_files_allowed(), source.features.watches_writes
        if first is None and per_partition and count > step and watched:
            groups = [range(at, min(at + step, count)) for at in range(0, count, step)]
            first = plan_of(groups[0])

        def discard(pulled: tuple[list[LoadFile], Sequence[int]]) -> None:
            for file in pulled[0]:  # Python's own files may take the same names
                file.path.unlink(missing_ok=True)

        if first is None:  # the source writes them, in the attempt's snapshot: the cursor
            # edge's top rows are read around it in that snapshot, else a run recorded no
            # row at the watermark and the next skipped the rows written there since
            return bulk_files(
                ctx,
                per_partition=per_partition,
                around=lambda write: _between_top_reads(ctx, write, discard),
            )
        names = [c.partition_id for c in ctx.candidates] if per_partition else ["load"]
        paths = [ctx.work_dir / f"{name}{engine.pulled_suffix}" for name in names]

        def pull_groups() -> tuple[list[LoadFile], list[int]] | None:
            files: list[LoadFile] = []
            counts: list[int] = []
            for number, group in enumerate(groups):
                plan = first if number == 0 else plan_of(group)
                group_paths = paths[group.start : group.stop] if per_partition else paths
                pulled = None if plan is None else engine.pull_load_files(plan, group_paths)
                if pulled is None:
                    discard((files, counts))
                    return None
                files += pulled[0]
                counts += pulled[1]
            return files, counts

        def pull() -> tuple[list[LoadFile], list[int]] | None:
            if len(groups) == 1:
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
        ctx.extracted_files(files, counts, read="engine", per_partition=per_partition)
        return files

    def pulled_stage(self) -> bool:
        """Whether the sink's engine staged the candidates' rows from the source itself
        (``EnginePull.pull_stage``), each candidate's count recorded; False when it could
        not, as ``pulled_files`` gives None: the path then stages the rows dpone reads."""
        ctx = self.ctx
        engine = ctx.sink.engine()
        plan = None if engine is None or not engine.stages else self._pull_plan(1)
        if engine is None or plan is None:
            return False
        counts = self.read_by_engine(
            lambda: engine.pull_stage(plan), discard=lambda _: ctx.sink.discard_stage()
        )
        if counts is None:
            return False
        for index, rows in enumerate(counts):
            ctx.extracted(index, rows, read="engine")
        return True

    def _pull_plan(self, files: int, numbers: range | None = None) -> LoadPlan | None:
        """The plan of the candidates (those ``numbers``, or all), when the sink's engine can
        pull it into ``files`` files; asked before the cursor edge's rows are read for it."""
        ctx = self.ctx
        engine = ctx.sink.engine()
        if engine is None or ctx.batch_value is not None or ctx.merge is not None:
            # the engine reads the source's columns; the batch column is dpone's, and so is
            # the check of a merge key's values (no NULL), made as dpone reads the rows
            return None
        numbers = range(len(ctx.candidates)) if numbers is None else numbers
        candidates = ctx.candidates[numbers.start : numbers.stop]
        if any(is_edge(candidate.partition_bounds) for candidate in ctx.candidates):
            return None
        plan = LoadPlan(
            source=ctx.source,
            columns=ctx.shape.columns,
            bounds=tuple(candidate.partition_bounds for candidate in candidates),
            replace=ctx.replace,
        )
        return plan if engine.can_pull(plan, files) else None

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
        snapshot = self.ctx.snapshot
        snapshot.end()
        result = _between_top_reads(self.ctx, read, discard)
        if result is None:
            snapshot.begin()
        return result

    def load_files(self, files: Sequence[LoadFile]) -> LoadFiles:
        """The payload of files ``write_load_file`` wrote or the engine pulled: an engine's
        own files are loaded by it, any other as rows (each spool file's digest checked as it
        is read); an engine that takes many files worse than one merges them here, before
        the target call (``EnginePull.merge_load_files``)."""
        ctx = self.ctx
        columns, replace = ctx.shape.columns, ctx.replace
        payload = LoadFiles(
            columns=columns,
            chunks=_spooled_rows(files),
            replace=replace,
            merge=ctx.merge,
            files=tuple(files),
        )
        engine = ctx.sink.engine()
        return payload if engine is None else engine.merge_load_files(payload, ctx.work_dir)


def _between_top_reads(
    ctx: PathContext, read: Callable[[], T | None], discard: Callable[[T], None] | None
) -> T | None:
    """``read()`` between two reads of the cursor edge's top rows; discarded (None) when they
    differ, which a write to the source between them makes."""
    if ctx.edge is None or ctx.edge.top_since is None:
        return read()
    window = (ctx.source, ctx.candidates, ctx.spec.chunk_rows)
    before = ctx.edge.top_rows(*window)
    result = read()
    if result is None:
        return result
    try:
        after = ctx.edge.top_rows(*window)
    except Exception:  # what the engine read is then only unknown
        after = {}
    if discard is not None and after != before:
        discard(result)
        return None
    ctx.edge.confirm_top(before, after, persisted=discard is not None)
    return result


def _spooled_rows(files: Sequence[LoadFile]) -> Iterator[list[tuple]]:
    for file in files:
        if file.native:  # written for an engine only, which reads the file itself
            raise PathContractBroken(
                "a file in a sink's own format reached a sink that reads rows",
                diagnostics={"file": file.path.name},
            )
        yield from read_chunks(file.path, file.sha256)
