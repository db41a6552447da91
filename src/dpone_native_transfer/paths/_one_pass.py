"""One scan of the source for all of an attempt's partitions (``Source.read_partitions``).

Without an index on the partition column, reading each partition on its own
scans the whole table once per partition. When the source can split one scan
exactly, a path that takes the rows in any order takes the scan as it comes
(``PathContext.extract``); for a path that reads partition by partition, the
rows are spooled to one private file per partition in the run's work folder as
they arrive (memory stays one chunk), and each partition is then read back from
its file, in the order and chunk size a read of its own gives. Spooling holds
one file open per partition, so it scans at most ``open_files_allowed()``
partitions at a time; a scan taken as it comes has no such bound.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path

from ..artifacts import create_private, open_files_allowed, read_chunks, write_chunks
from ..checkpoints import PartitionCheckpoint
from ..connectors.contract import Source
from ..cursor_edge import scan_by_window

__all__ = ["one_pass", "spool_partitions", "spooled_chunks"]


def one_pass(
    source: Source, candidates: Sequence[PartitionCheckpoint], chunk_rows: int
) -> Iterator[tuple[int, list[tuple]]] | None:
    """The source's scan of the candidates, one per cursor window (``scan_by_window``),
    ``(candidate index, rows)``, or None."""
    bounds = [candidate.partition_bounds for candidate in candidates]
    return scan_by_window(source, bounds, chunk_rows)


def spool_partitions(
    source: Source, candidates: Sequence[PartitionCheckpoint], work_dir: Path, chunk_rows: int
) -> dict[str, Path]:
    """Each candidate's spool file, after one scan per group of as many candidates as
    ``open_files_allowed()`` lets a scan hold open; a candidate left out (its group read
    apart by the source, or alone) is read on its own. Past 256 partitions
    (``ulimit -n`` 1,024) they were once read one by one, a scan each without an index
    (figures: docs/performance.md, fix 55)."""
    spooled: dict[str, Path] = {}
    step = open_files_allowed()
    for first in range(0, len(candidates), step):
        group = candidates[first : first + step]
        scan = one_pass(source, group, chunk_rows)
        if scan is None:
            continue
        files = [work_dir / f"{candidate.partition_id}.scan" for candidate in group]
        with contextlib.ExitStack() as stack:
            handles = [stack.enter_context(create_private(path)) for path in files]
            for index, rows in scan:
                write_chunks(handles[index], [rows])
        spooled.update((c.partition_id, path) for c, path in zip(group, files, strict=True))
    return spooled


def spooled_chunks(path: Path, chunk_rows: int) -> Iterator[list[tuple]]:
    """The spooled rows in chunks of ``chunk_rows`` (the last may be shorter), as a read gives."""
    pending: list[tuple] = []
    for block in read_chunks(path):
        pending.extend(block)
        while len(pending) >= chunk_rows:
            yield pending[:chunk_rows]
            pending = pending[chunk_rows:]
    if pending:
        yield pending
