"""A SQLite store file kept open for a run (issue 48).

SQLite checkpoints the WAL into the file and deletes it at the file's last close: for a
pipeline, once per table (a write and fsyncs of the file and its folder). While a run
holds connections, one idle connection per store file stays open, so a route's store
closing is never the last; every commit is still fsynced in the WAL before it returns,
and the run's end closes the file as before. Real SQLite files; a second process reads
what each store wrote.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.stores import ROUTE, make_checkpoint

from dpone_native_transfer.drivers import holding_connections
from dpone_native_transfer.stores.sqlite import SQLiteCheckpointStore


def _read_elsewhere(path: Path) -> int:
    """The checkpoints another process reads from the file (its WAL included)."""
    code = (
        "import sqlite3, sys; conn = sqlite3.connect(sys.argv[1]);"
        " print(conn.execute('SELECT count(*) FROM checkpoint_latest').fetchone()[0])"
    )
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_a_run_keeps_the_store_file_open_between_its_routes(tmp_path: Path):
    path = tmp_path / "checkpoints.db"
    wal = Path(f"{path}-wal")
    SQLiteCheckpointStore(path).close()
    with holding_connections():
        for number in range(3):
            store = SQLiteCheckpointStore(path)
            store.upsert_many([make_checkpoint(f"p-{number}")])
            store.close()
            assert wal.exists()  # not the file's last close: no checkpoint, no delete
            assert _read_elsewhere(path) == number + 1  # committed, whoever reads it
    assert not wal.exists()  # the run's end closed the file: SQLite checkpointed it
    with SQLiteCheckpointStore(path) as store:
        assert len(store.list_latest(ROUTE)) == 3


def test_outside_a_run_a_store_closes_its_file(tmp_path: Path):
    path = tmp_path / "checkpoints.db"
    store = SQLiteCheckpointStore(path)
    store.upsert_many([make_checkpoint("p-0")])
    store.close()
    assert not Path(f"{path}-wal").exists()
