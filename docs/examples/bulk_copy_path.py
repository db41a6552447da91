"""bulk-copy: an example fifth transfer path, written to be copied by connector authors.

A path is a callable ``path(ctx) -> int``. It does all of its pre-target work
(read the source, record what it read, run the governance gates) and then
reaches the target exactly once, through ``ctx.mutate(operation, call, *args)``.
It never sees the target-commit guard: ``ctx.mutate`` hands ``invoke`` to the
runtime's one target boundary, which arms the guard before calling it and
promotes the checkpoints after it. A path that calls the sink anywhere else
loses that protection; ``GuardConformance`` (see ``test_bulk_copy_path.py``)
is how you prove yours does not.

This one copies every active partition in one bulk load, the shape of a
``COPY``/``BULK INSERT`` connector: it reads the partitions into one spool
that stays in memory up to ``SPOOL_MEMORY_BYTES`` and spills to a file in the
attempt's work folder beyond that, then streams the spool into one
``sink.load()``.
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Iterator
from typing import IO

from dpone_native_transfer import PathContext

__all__ = ["SPOOL_MEMORY_BYTES", "bulk_copy_path", "replay", "spool_partitions"]

# Memory the spool may use before it moves to disk: a bound, not a limit on rows.
SPOOL_MEMORY_BYTES = 8 << 20


def spool_partitions(ctx: PathContext, spool: IO[bytes]) -> int:
    """Read every active partition into ``spool``; return how many rows were read.

    ``ctx.read`` yields one partition in chunks of at most ``chunk_rows``, so
    no more than a chunk is held at a time. ``ctx.extracted`` records each
    partition's row count on its checkpoint candidate *before* the target is
    called: the guard's checkpoints carry those counts, and the events tell
    operators how far extraction got.
    """
    total = 0
    for index, candidate in enumerate(ctx.candidates):
        rows = 0
        for chunk in ctx.read(candidate):
            pickle.dump(list(chunk), spool)  # process-local working data, read back below
            rows += len(chunk)
        ctx.extracted(index, rows)
        total += rows
    return total


def replay(spool: IO[bytes]) -> Iterator[list[tuple]]:
    """Yield the spooled chunks from the start, one at a time."""
    spool.seek(0)
    while True:
        try:
            yield pickle.load(spool)
        except EOFError:
            return


def bulk_copy_path(ctx: PathContext) -> int:
    """Extract into a bounded spool, pass the gates, then one guarded bulk load."""
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES, dir=ctx.work_dir) as spool:
        total = spool_partitions(ctx, spool)
        # Governance is pre-target work: a refused attempt must not arm the guard or
        # touch the target, so the gate runs before ctx.mutate.
        ctx.check_governance(total)
        # The one target call, handed to the boundary: it arms the guard first and calls
        # sink.load(payload, ledger=...) only if every armed checkpoint is durable.
        # ctx.row_chunks adds the source's columns and, for full_refresh, replace=True.
        return ctx.mutate("load", ctx.sink.load, ctx.row_chunks(replay(spool)))
