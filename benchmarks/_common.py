"""Shared helpers: sizes, the work folder, cached generated data, timing, the result table."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "benchmarks" / "work"  # gitignored: cached sources and stores, run scratch
RESULTS = REPO / "benchmarks" / "results"

SOURCE_TABLE = "orders"
TARGET_TABLE = "orders_copy"
PARTITION_COLUMN = "region"
PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")
CHUNK_ROWS = 10_000


@attrs.frozen(kw_only=True)
class Sizes:
    """What each section measures; ``full`` is the issue's sizes, ``quick`` a smoke run."""

    runs: int
    # Sections 1-2: the guard's 5% is within the run-to-run noise of a multi-second
    # transfer, so they take more pairs than the other sections need.
    transfer_runs: int
    transfer_rows: int
    transfer_partitions: int
    scan_partitions: tuple[int, ...]
    scan_history: int
    scan_other_rows: int
    batch_partitions: tuple[int, ...]
    memory_rows: tuple[int, int]
    memory_partitions: int
    partition_table_rows: int
    partition_keys: int
    pipeline_shapes: tuple[tuple[int, int], ...]  # section 10: (tables, rows per table)
    pg_wire_rows: int = 2_000_000  # section 2d: the PostgreSQL workload of issue 47


FULL = Sizes(
    runs=7,
    transfer_runs=11,
    transfer_rows=1_000_000,
    transfer_partitions=100,
    scan_partitions=(1_000, 10_000, 100_000),
    scan_history=10,
    scan_other_rows=1_000_000,
    batch_partitions=(10, 1_000, 10_000),
    memory_rows=(1_000_000, 10_000_000),
    memory_partitions=100,
    partition_table_rows=1_000_000,
    partition_keys=200_000,
    pipeline_shapes=((100, 10_000), (10, 1_000_000)),
)

QUICK = Sizes(
    runs=5,
    transfer_runs=5,
    transfer_rows=20_000,
    transfer_partitions=10,
    scan_partitions=(100, 1_000),
    scan_history=10,
    scan_other_rows=10_000,
    batch_partitions=(10, 100, 1_000),
    memory_rows=(20_000, 200_000),
    memory_partitions=10,
    partition_table_rows=20_000,
    partition_keys=4_000,
    pipeline_shapes=((20, 2_000), (4, 50_000)),
    pg_wire_rows=20_000,
)


def median(values: list[float]) -> float:
    return statistics.median(values)


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


@contextlib.contextmanager
def scratch(name: str) -> Iterator[Path]:
    """A fresh, empty folder for one measurement, removed afterwards."""
    folder = WORK / "runs" / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def log(message: str) -> None:
    print(f"  . {message}", file=sys.stderr, flush=True)


def cached_source(name: str, statements: list[str]) -> Path:
    """``WORK/sources/NAME.db``, built once by SQLite itself from ``statements`` (in one
    transaction) and reused by later runs; a build that was interrupted is started again."""
    path = WORK / "sources" / f"{name}.db"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    building = path.with_suffix(".building")
    building.unlink(missing_ok=True)
    log(f"generating source: {name}")
    conn = sqlite3.connect(building, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=OFF")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("BEGIN")
        for statement in statements:
            conn.execute(statement)
        conn.execute("COMMIT")
    finally:
        conn.close()
    os.replace(building, path)
    return path


def source_db(rows: int, partitions: int) -> Path:
    """A cached SQLite source ``orders(id, region, amount, updated_at)``.

    Rows are clustered by partition (``region`` = ``region-000`` ... in id
    order) and ``region`` is indexed, as a partitioned source table would be,
    so each partition read is one index range and never a full scan.
    """
    per_partition = -(-rows // partitions)
    return cached_source(
        f"orders-{rows}-{partitions}",
        [
            f"CREATE TABLE {SOURCE_TABLE} (id INTEGER PRIMARY KEY, region TEXT NOT NULL,"
            " amount REAL, updated_at INTEGER)",
            f"INSERT INTO {SOURCE_TABLE} WITH RECURSIVE n(i) AS"
            f" (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})"
            f" SELECT i, printf('region-%04d', (i - 1) / {per_partition}),"
            " round(i * 1.25, 2), 1000000 + i FROM n",
            f"CREATE INDEX {SOURCE_TABLE}_by_region ON {SOURCE_TABLE} (region)",
        ],
    )


def unindexed_source_db(rows: int, partitions: int) -> Path:
    """A cached source shaped like ``source_db``'s, but as real tables often are: the
    partition column has no index and its values are spread over the table
    (``region-%04d`` of ``id % partitions``), so a read of one partition scans it all."""
    return cached_source(
        f"orders-unindexed-{rows}-{partitions}",
        [
            f"CREATE TABLE {SOURCE_TABLE} (id INTEGER PRIMARY KEY, region TEXT NOT NULL,"
            " amount REAL, updated_at INTEGER)",
            f"INSERT INTO {SOURCE_TABLE} WITH RECURSIVE n(i) AS"
            f" (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})"
            f" SELECT i, printf('region-%04d', i % {partitions}),"
            " round(i * 1.25, 2), 1000000 + i FROM n",
        ],
    )


def unindexed_key_source_db(rows: int) -> Path:
    """``unindexed_source_db``'s table with one more column, ``k``: a key with as many
    distinct values as rows, spread over the table (``id * 7919 % rows``) and without an
    index, for key ranges (``partition_by = "range"``) a range's read would scan for."""
    return cached_source(
        f"orders-unindexed-key-{rows}",
        [
            f"CREATE TABLE {SOURCE_TABLE} (id INTEGER PRIMARY KEY, k INTEGER NOT NULL,"
            " region TEXT NOT NULL, amount REAL, updated_at INTEGER)",
            f"INSERT INTO {SOURCE_TABLE} WITH RECURSIVE n(i) AS"
            f" (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})"
            f" SELECT i, i * 7919 % {rows}, printf('region-%04d', i % 100),"
            " round(i * 1.25, 2), 1000000 + i FROM n",
        ],
    )


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_gib = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory_gib = round(int(line.split()[1]) / 1024 / 1024, 1)
    commit, dirty = None, None
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        commit = _git("rev-parse", "--short", "HEAD").strip()
        # the measured code is the working tree: name what differs from the commit
        dirty = sorted(
            line[3:] for line in _git("status", "--porcelain", "--", "src", "plugins").splitlines()
        )
    return {
        "nproc": os.cpu_count(),
        "cpu_model": cpu,
        "memory_gib": memory_gib,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "git_commit": commit,
        "uncommitted_code_changes": dirty,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
    }


@attrs.define
class Row:
    """One line of the result table (and one entry of the JSON)."""

    section: str
    case: str
    value: float  # seconds, MiB or a ratio, see ``unit``
    unit: str
    baseline: float | None = None
    ratio: float | None = None
    target: str | None = None
    met: bool | None = None
    extra: dict[str, Any] = attrs.field(factory=dict)


def verdict(met: bool | None) -> str:
    return {True: "met", False: "NOT met", None: ""}[met]


def format_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "s":
        if value >= 0.01:
            return f"{value:.3f} s"
        return f"{value * 1000:.2f} ms" if value >= 0.001 else f"{value * 1e6:.1f} us"
    if unit == "MiB":
        return f"{value:.1f} MiB"
    return f"{value:.2f}{unit}"


def print_table(rows: list[Row], judged: bool) -> None:
    header = ("section", "case", "median", "baseline", "ratio", "target", "verdict")
    lines = [
        (
            r.section,
            r.case,
            format_value(r.value, r.unit),
            format_value(r.baseline, r.unit),
            "-" if r.ratio is None else f"{r.ratio:.3f}",
            r.target or "",
            verdict(r.met) if judged else ("" if r.met is None else "(quick)"),
        )
        for r in rows
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines, strict=False)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    print(fmt.format(*header))
    print("  ".join("-" * w for w in widths))
    previous = None
    for line in lines:
        if previous is not None and line[0] != previous:
            print()
        previous = line[0]
        print(fmt.format(*line))
