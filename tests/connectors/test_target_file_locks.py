"""dpone's own checks of a target file keep the locks this process holds on it.

A close of any descriptor of a file drops every POSIX lock the process holds on it. The
read-only checks (``_sql.check_writable``, ``drivers.file_failure``) opened and closed the
target file: in a pipeline's threads, one table's check dropped the lock another table's
SQLite transaction or DuckDB connection held, and another process then wrote pages in use
(a corrupted SQLite file; a DuckDB file with wrong rows, exit 0). Found by running two
pipelines, or a reader, against one target file. Each test holds the engine's lock here,
runs the checks, and has another process try to take the lock: it must still be held.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb

from dpone_native_transfer.connectors._sql import check_writable
from dpone_native_transfer.drivers import file_failure


def _checks(path: Path) -> None:
    check_writable(str(path), "t")
    assert file_failure(str(path), writing=True) is None
    assert file_failure(str(path), writing=False) is None


def _other_process(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


def test_the_checks_keep_a_sqlite_write_lock_this_process_holds(tmp_path: Path) -> None:
    path = tmp_path / "target.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (id INTEGER)")
    holder.execute("BEGIN IMMEDIATE")  # another table's transaction, in another thread
    holder.execute("INSERT INTO t VALUES (1)")
    try:
        _checks(path)
        other = _other_process(
            "import sqlite3, sys\n"
            f"db = sqlite3.connect({str(path)!r}, timeout=0, isolation_level=None)\n"
            "try:\n    db.execute('BEGIN IMMEDIATE')\nexcept sqlite3.OperationalError as e:\n"
            "    sys.exit(3 if 'locked' in str(e) else 4)\n"
        )
        assert other.returncode == 3, other.stderr  # still locked: it may not write
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_the_checks_keep_a_duckdb_file_lock_this_process_holds(tmp_path: Path) -> None:
    path = tmp_path / "target.duckdb"
    holder = duckdb.connect(str(path))
    holder.execute("CREATE TABLE t (id INTEGER)")
    try:
        _checks(path)
        other = _other_process(
            "import duckdb, sys\n"
            f"try:\n    duckdb.connect({str(path)!r})\nexcept duckdb.IOException as e:\n"
            "    sys.exit(3 if 'lock' in str(e).lower() else 4)\n"
        )
        assert other.returncode == 3, other.stderr  # still locked: it may not open it
    finally:
        holder.close()
