"""The ``dpone-transfer demo`` story: a failure after the target committed, then a blocked retry.

Self-checking, on local SQLite files: it exits 0 only if the guard stopped the
retry before the target and every source row is in the target exactly once.
It runs the route as ``dpone-transfer run`` does, through ``application.py``
and the lines of ``reporting.py``; it never imports ``cli``, which imports
this module only when the demo runs.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections import Counter
from pathlib import Path
from typing import TextIO

from .application import transfer
from .config import RouteConfig, load_route_config
from .connectors._sql import quote
from .errors import ManualReconciliationRequired, NativeTransferError
from .reporting import EXIT_FAILED, EXIT_OK, PROG, progress_printer, summary_line
from .stores.sqlite import SQLiteCheckpointStore
from .testing import (
    FaultyStore,
    InjectedFault,
    RecordingSink,
    build_sample_source,
    guard_phase,
    phase_batch,
)

__all__ = ["DEMO_FILES", "DEMO_ROUTE", "run_demo"]

DEMO_FILES = ("source.db", "target.db", "checkpoints.db", "route.toml")
DEMO_ROUTE = """\
# Written by `dpone-transfer demo`. Paths are relative to this file.
[source]
path = "source.db"
table = "orders"
partition_column = "region"
cursor_column = "updated_at"

[target]
path = "target.db"
table = "orders_copy"

[transfer]
strategy = "incremental_append"
path = "staged"
chunk_rows = 10000

[store]
path = "checkpoints.db"

[gates]
min_rows = 1
"""
_INDENT = "   "


def run_demo(workdir: Path, out: TextIO) -> int:
    """The demo story; 0 only if the retry was blocked and no row was appended twice."""
    route_file = _demo_build_source(workdir, out)
    config = load_route_config(route_file, argument="route.toml")
    _demo_first_run(config, out)
    problems = _demo_failed_promotion(config, out)
    problems += _demo_retry(config, out)
    problems += _demo_counts(config, out)
    if problems:
        print("demo FAILED:", file=out)
        for problem in problems:
            print(f"{_INDENT}- {problem}", file=out)
        return EXIT_FAILED
    print(
        "demo passed: the guard stopped the retry before the target; "
        "every source row is in the target exactly once",
        file=out,
    )
    return EXIT_OK


def _say(out: TextIO, *lines: str) -> None:
    for line in lines:
        print(_INDENT + line, file=out)


def _demo_build_source(workdir: Path, out: TextIO) -> Path:
    print("1. build a sample source: 20,000 rows in 8 partitions", file=out)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in DEMO_FILES:
        for suffix in ("", "-wal", "-shm"):
            (workdir / (name + suffix)).unlink(missing_ok=True)
    build_sample_source(workdir / "source.db", rows=20_000, partitions=8)
    route_file = workdir / "route.toml"
    route_file.write_text(DEMO_ROUTE, encoding="utf-8")
    _say(out, f"route file: {route_file}", f"reuse it:   {PROG} run {route_file}")
    return route_file


def _demo_first_run(config: RouteConfig, out: TextIO) -> None:
    print("2. run a guarded transfer from the route file", file=out)
    run_id = "demo-run-1"
    result, seconds = transfer(config, run_id, events=progress_printer(out, indent=_INDENT))
    _say(out, summary_line(config, run_id, result, seconds))


def _demo_failed_promotion(config: RouteConfig, out: TextIO) -> list[str]:
    print(
        "3. append 5,000 rows, run again, and fail the checkpoint promotion "
        "after the target committed",
        file=out,
    )
    build_sample_source(config.source.path, rows=5_000, partitions=8, start_id=20_001)
    injected = InjectedFault("checkpoint promotion failed (injected by the demo)")

    def with_fault(store: SQLiteCheckpointStore) -> FaultyStore:
        faulty = FaultyStore(store)
        faulty.fail_batch(phase_batch("checkpoint_committed"), keep=3, error=injected)
        return faulty

    events = progress_printer(out, indent=_INDENT)
    try:
        transfer(config, "demo-run-2", events=events, wrap_store=with_fault)
    except Exception as error:
        if error is not injected:
            return [f"step 3 failed with {type(error).__name__}, not the injected fault"]
        _say(out, f"the run failed with {type(error).__name__}: the original exception surfaced")
    else:
        return ["step 3 did not fail although a checkpoint failure was injected"]
    _say(out, f"guard phases in the store: {_phase_counts(config)}")
    return []


def _phase_counts(config: RouteConfig) -> str:
    with contextlib.closing(SQLiteCheckpointStore(config.store_path)) as store:
        latest = list(store.list_latest(config.route))
    counts = Counter(guard_phase(checkpoint) or "none" for checkpoint in latest)
    return ", ".join(f"{phase} {count}" for phase, count in sorted(counts.items()))


def _demo_retry(config: RouteConfig, out: TextIO) -> list[str]:
    print("4. the automatic retry: a plain new run, no faults", file=out)
    sink = RecordingSink(config.sink)
    problems = []
    try:
        transfer(config, "demo-run-3", sink=sink)
    except ManualReconciliationRequired as error:
        _say(out, f"blocked: {error.code}", f"message: {error.message}")
    except NativeTransferError as error:
        problems.append(f"the retry failed with {error.code}, not a manual-reconciliation block")
    else:
        problems.append("the retry was not blocked")
    if sink.target_calls:
        problems.append(f"the retry called the target {sink.target_calls} time(s)")
    else:
        _say(out, "the target was not called")
    return problems


def _demo_counts(config: RouteConfig, out: TextIO) -> list[str]:
    print("5. compare the target with the source", file=out)
    source, target = quote(config.source.table), quote(config.sink.table)
    source_rows = _scalar(config.source.path, f"SELECT COUNT(*) FROM {source}")
    target_rows = _scalar(config.sink.path, f"SELECT COUNT(*) FROM {target}")
    duplicates = _scalar(config.sink.path, f"SELECT COUNT(*) - COUNT(DISTINCT id) FROM {target}")
    _say(
        out,
        f"source rows {source_rows:,} | target rows {target_rows:,} | duplicate ids {duplicates:,}",
    )
    problems = []
    if duplicates:
        problems.append(f"the target holds {duplicates:,} duplicate id(s)")
    if target_rows != source_rows:
        problems.append(f"the target holds {target_rows:,} rows, the source {source_rows:,}")
    return problems


def _scalar(path: str, sql: str) -> int:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        return connection.execute(sql).fetchone()[0]
