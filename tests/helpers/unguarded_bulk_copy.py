"""A deliberately UNGUARDED copy of the bulk-copy example, for the kit to catch.

It calls the sink itself and then hands ``ctx.mutate`` a lambda that only
returns the row count, so it looks as if it went through the boundary. The
guard is armed only after the target already holds the rows. Never copy this.

Not a test module: ``tests/guard/test_conformance.py`` runs the kit on it in a pytester
sub-run, next to a copy of ``docs/examples/bulk_copy_path.py`` (whose
helpers it imports).
"""

from __future__ import annotations

import tempfile

import pytest
from bulk_copy_path import SPOOL_MEMORY_BYTES, replay, spool_partitions

from dpone_native_transfer import PathContext
from dpone_native_transfer.testing.conformance import GuardConformance


def unguarded_bulk_copy_path(ctx: PathContext) -> int:
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES, dir=ctx.work_dir) as spool:
        ctx.check_governance(spool_partitions(ctx, spool))
        rows = ctx.sink.load(ctx.row_chunks(replay(spool)))  # BUG: the target before the guard
        return ctx.mutate("load", lambda: rows)


class TestUnguardedBulkCopyPath(GuardConformance):
    path_name = "unguarded-bulk-copy"
    ledger = False  # the guard's scenarios alone must catch it (the ledger catches it too)

    @pytest.fixture
    def transfer_path(self):
        return unguarded_bulk_copy_path
