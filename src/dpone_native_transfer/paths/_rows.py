"""Reading an attempt's rows from the source: one pass or partition by partition, spooled,
edge-filtered, and carried for the sink (``PathContext.read``, ``PathContext.extract``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ..checkpoints import PartitionCheckpoint
from ..column_types import Carry, Column, carried_chunks, column_carriers
from ..errors import ValueUnsupported
from ..payloads import Merge
from ..rejects import Reject
from ._one_pass import one_pass, spool_partitions, spooled_chunks

if TYPE_CHECKING:
    from ._context import PathContext

__all__ = ["RowReader"]


@attrs.define(eq=False)
class RowReader:
    """The rows of one attempt's candidates, as the sink will hold them."""

    ctx: PathContext
    _carriers: list[tuple[int, str, Carry]] | None = None
    _spooled: dict[str, Path] | None = None  # a one-pass scan's spool file per partition

    def read(self, candidate: PartitionCheckpoint) -> Iterable[Sequence[tuple]]:
        """The partition's rows from the source, in bounded chunks, carried for the sink.

        Values pass through the sink's carriers (``Sink.carrier``), so every row path
        spools, stages or exports exactly what the target will hold. An edge partition's
        rows the route already loaded are left out (``cursor_edge.py``). A source that reads
        every partition of the attempt in one scan does so at the first read
        (``Source.read_partitions``, ``_one_pass.py``).
        """
        ctx = self.ctx
        rows = ctx.spec.chunk_rows
        if self._spooled is None:
            self._spooled = spool_partitions(ctx.source, ctx.candidates, ctx.work_dir, rows)
        spooled = self._spooled.get(candidate.partition_id)
        if spooled is not None:
            chunks: Iterable[list[tuple]] = spooled_chunks(spooled, rows)
        else:
            chunks = ctx.source.read(candidate.partition_bounds, chunk_rows=rows)
        if ctx.edge is not None:
            chunks = ctx.edge.rows(candidate, chunks)
        return self.carry(chunks, candidate.partition_id)

    def carry(
        self, chunks: Iterable[Sequence[tuple]], partition_id: str | None = None
    ) -> Iterable[Sequence[tuple]]:
        """The rows as the sink holds them; a row the sink cannot hold exactly stops the run,
        or with ``on_bad_value = "quarantine"`` is set aside (``ctx.rejects``)."""
        ctx, spec = self.ctx, self.ctx.spec
        if ctx.batch_value is not None:  # the shape's last column, the batch column
            chunks = _with_value(chunks, ctx.batch_value)
        if ctx.merge is not None:
            chunks = _keyed(chunks, ctx.shape.columns, ctx.merge, ctx.sink.features.name)
        if self._carriers is None:
            self._carriers = column_carriers(ctx.shape.columns, ctx.sink.carrier)
        if not self._carriers:
            return chunks
        target = ctx.sink.features.name
        reject = None
        if spec.on_bad_value == "quarantine":

            def reject(row: tuple, column: str, value: Any) -> None:
                keep = spec.quarantine_values
                found = Reject.of(
                    row, column, value, partition_id=partition_id, target=target, keep_value=keep
                )
                ctx.rejects.append(found)

        spared = _deleted_rows(ctx.shape.columns, ctx.merge, (spec.source.partition_column,))
        return carried_chunks(chunks, self._carriers, target=target, reject=reject, spared=spared)

    def extract(self) -> Iterator[Sequence[tuple]]:
        """Every candidate's rows, carried for the sink, recording each one's count
        (``extracted``) once its rows have all passed.

        From a source that reads the attempt in one scan, the chunks come straight from that
        scan, partitions interleaved in scan order, the edge's rows left out
        (``EdgeTracker.scanned``), and nothing is spooled; otherwise partition by partition,
        as ``read`` gives them.
        """
        ctx = self.ctx
        scan = one_pass(ctx.source, ctx.candidates, ctx.spec.chunk_rows)
        if scan is not None and ctx.edge is not None:
            scan = ctx.edge.scanned(ctx.candidates, scan)
        if scan is None:
            for index, candidate in enumerate(ctx.candidates):
                rows = 0
                for chunk in self.read(candidate):
                    rows += len(chunk)
                    yield chunk
                ctx.extracted(index, rows)
            return
        counts = [0] * len(ctx.candidates)

        def chunks() -> Iterator[list[tuple]]:  # the scan's small groups, joined again
            pending: list[tuple] = []
            for index, rows in scan:
                counts[index] += len(rows)
                pending.extend(rows)
                if len(pending) >= ctx.spec.chunk_rows:
                    yield pending
                    pending = []
            if pending:
                yield pending

        yield from self.carry(chunks())
        for index, rows in enumerate(counts):
            ctx.extracted(index, rows)


def _deleted_rows(
    columns: Sequence[Column], merge: Merge | None, routed: Sequence[str]
) -> Callable[[tuple, int], bool] | None:
    """Whether a value the target cannot hold is in a merge's deleted row, outside its key,
    version, deleted flag and ``routed`` columns (its partition's): a delete writes none of
    them, so such a value refused the delete, or set it aside and left the deleted key in
    the target (exit 0). It is NULL instead (``carried_chunks``)."""
    if merge is None or merge.deleted is None:
        return None
    names = [column.name for column in columns]
    deleted = names.index(merge.deleted)
    used = {*merge.key, merge.version, merge.deleted, *routed}
    kept = {index for index, name in enumerate(names) if name in used}
    return lambda row, index: bool(row[deleted]) and index not in kept


def _keyed(
    chunks: Iterable[Sequence[tuple]], columns: Sequence[Column], merge: Merge, target: str
) -> Iterator[Sequence[tuple]]:
    """A merge route's rows, each with a value in every key column: a NULL key matches no
    row, so its row could never be replaced; refused before the target, naming the column.

    The deleted column must hold NULL, a boolean or an integer: a text (``'true'``) or a
    fraction in a SQLite column is 0 to SQLite's cast (the row kept) and refused by the
    other targets, so it is refused on every target. A non-zero integer is carried as 1:
    the merge casts the column to a 32-bit ``INTEGER`` (the one cast from both a boolean
    and an integer on every engine), which a larger one overflows inside the target call.
    """
    indexes = [(i, column.name) for i, column in enumerate(columns) if column.name in merge.key]
    deleted = next((i for i, c in enumerate(columns) if c.name == merge.deleted), None)
    for chunk in chunks:
        for index, name in indexes:
            if None in map(itemgetter(index), chunk):  # in C: no Python call per row
                raise ValueUnsupported(
                    f"key column {name!r} of a merge route holds NULL, which identifies no "
                    "row; nothing was written. Fill the key, or filter such rows out",
                    diagnostics={"column": name, "target": target},
                )
        if deleted is not None:
            chunk = _deleted_flags(chunk, deleted, str(merge.deleted), target)
        yield chunk


_FLAG_TYPES = {type(None), bool, int}


def _deleted_flags(chunk: Sequence[tuple], index: int, name: str, target: str) -> Sequence[tuple]:
    """``chunk`` with the deleted column's non-zero integers as 1 (as it came if none is
    another); a value that is not NULL, a boolean or an integer refused, naming the column."""
    values = list(map(itemgetter(index), chunk))
    if not set(map(type, values)) <= _FLAG_TYPES:  # in C: a call per row was 40% of it
        raise ValueUnsupported(
            f"deleted column {name!r} of a merge route holds a value that is neither a "
            "boolean nor an integer, so whether it deletes its key is unclear; nothing was "
            "written. Store true/false or 1/0 there",
            diagnostics={"column": name, "target": target},
        )
    if set(values) <= {None, 0, 1}:
        return chunk
    return [
        row if row[index] in (None, 0, 1) else (*row[:index], 1, *row[index + 1 :]) for row in chunk
    ]


def _with_value(chunks: Iterable[Sequence[tuple]], value: Any) -> Iterator[list[tuple]]:
    for chunk in chunks:
        yield [(*row, value) for row in chunk]
