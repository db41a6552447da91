"""Write the stores of this folder with release 0.1 (store schema v2, no route locations).

Run with that release first on the path, from this folder:

    git worktree add /tmp/release-0.1 6d0bd6a
    PYTHONPATH=/tmp/release-0.1/src:/tmp/release-0.1/plugins python make.py

It leaves two routes, each with its own source, target and store:
- healthy: orders -> orders_copy, incremental_append on updated_at, legacy path;
  one run loaded rows 1-120 and committed.
- blocked: orders -> orders_copy, staged path; rows 1-120 committed, then rows
  121-160 reached the target but only 1 of 4 commit checkpoints was written
  (3 partitions checkpoint_incomplete): the target holds 160 rows.
"""

from __future__ import annotations

import os
from pathlib import Path

import dpone_native_transfer
from dpone_native_transfer import (
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.testing import (
    FaultyStore,
    InjectedFault,
    build_sample_source,
    phase_batch,
)

HERE = Path(__file__).parent
assert "release-0.1" in dpone_native_transfer.__file__, "run with release 0.1 first on the path"


def spec(name: str, path: str, run_id: str) -> TransferSpec:
    return TransferSpec(
        source=SQLiteSource(str(HERE / f"{name}-source.db"), "orders", "region", "updated_at"),
        sink=SQLiteSink(str(HERE / f"{name}-target.db"), "orders_copy"),
        strategy="incremental_append",
        path=path,
        run_id=run_id,
        chunk_rows=16,
    )


for name in ("healthy", "blocked"):
    for suffix in ("source.db", "target.db", "checkpoints.db"):
        for extra in ("", "-wal", "-shm"):
            if os.path.exists(HERE / f"{name}-{suffix}{extra}"):
                os.remove(HERE / f"{name}-{suffix}{extra}")
    build_sample_source(HERE / f"{name}-source.db", rows=120, partitions=4)

with SQLiteCheckpointStore(HERE / "healthy-checkpoints.db") as store:
    TransferRuntime(store).run(spec("healthy", "legacy", "release-0.1-run-1"))

with SQLiteCheckpointStore(HERE / "blocked-checkpoints.db") as store:
    TransferRuntime(store).run(spec("blocked", "staged", "release-0.1-run-1"))
    build_sample_source(HERE / "blocked-source.db", rows=40, partitions=4, start_id=121)
    faulty = FaultyStore(store)
    faulty.fail_batch(phase_batch("checkpoint_committed"), keep=1)
    try:
        TransferRuntime(faulty).run(spec("blocked", "staged", "release-0.1-run-2"))
    except InjectedFault:
        pass
    else:
        raise SystemExit("the commit batch did not fail")
print("written")
