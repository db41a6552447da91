"""Sections 2b and 7: an unindexed source, and the analytical engines against their peers.

The source is ``unindexed_source_db``: 1,000,000 rows whose 100 partitions are
spread over the table with no index on the partition column.

- **2b** SQLite -> SQLite: legacy, staged and file-artifact against the bare
  ``fetchmany``/``executemany`` copy, lazy-plan against the bare ``ATTACH`` +
  ``INSERT ... SELECT`` (section 2's baselines, on this source).
- **7** SQLite -> DuckDB and SQLite -> chDB: each path guarded against the same path
  with ``plugins=[]`` (the guard's overhead on these targets), and against the engine's own
  copy of the file (DuckDB ``CREATE TABLE AS SELECT * FROM sqlite_scan``, chDB
  ``INSERT ... SELECT FROM sqlite()``), and on DuckDB against dlt's
  ``sql_database`` with its pyarrow backend, run by ``_dlt_child.py`` in a
  venv of its own (``make bench`` makes it; dlt is never our dependency).

Each round also lists the partitions as every run does before it arms
(``SQLiteSource.partition_values``): the *floor* rows add that listing to the
baseline (the engine's own copy, or SQLite's ``bare-attach``), the least any path
can take while the partitions are known before the target call.

Every case runs once per round, in reverse order every other round (A B C, C B A),
each guarded transfer beside its ``plugins=[]`` twin several times a round
(``GUARD_PAIRS_PER_ROUND``), and each ratio is the median of the per-run ratios.
Transfers are guarded, with the target ledger on (the default), into fresh files.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpone_native_transfer import (
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.connectors.clickhouse import ClickHouseSink
from dpone_native_transfer.connectors.duckdb import DuckDBSink
from dpone_native_transfer.connectors.duckdb.connect import sqlite_extension

from ._common import (
    CHUNK_ROWS,
    PARTITION_COLUMN,
    PATHS,
    REPO,
    SOURCE_TABLE,
    TARGET_TABLE,
    WORK,
    Row,
    Sizes,
    log,
    median,
    scratch,
    timed,
    unindexed_source_db,
)
from .transfer import (
    GUARD_LIMIT,
    PAIRS_PER_ROUND,
    RUNTIME_LIMITS,
    bare_attach,
    bare_copy,
    run_transfer,
)

ENGINE_LIMITS = {
    "duckdb": {"lazy-plan": 1.25, "other": 2.0},
    "chdb": {"lazy-plan": 1.25, "other": 2.5},
}
OWN_COPY = {
    "duckdb": "CREATE TABLE AS SELECT FROM sqlite_scan",
    "chdb": "INSERT ... SELECT FROM sqlite()",
}
DLT_SHARE = 0.25  # every path at least 4x faster than dlt
DLT_PYTHON = Path(os.environ.get("DPONE_BENCH_DLT_PYTHON", WORK / "dlt-venv" / "bin" / "python"))


def engine_transfer(
    source: Path,
    engine: str,
    path: str,
    rows: int,
    *,
    guarded: bool = True,
    read: Callable[[Path], SQLiteSource] | None = None,
    strategy: str = "full_refresh",
) -> float:
    """One transfer (a full refresh by default) into a fresh SQLite or DuckDB file or chDB
    data path, from ``read(source)`` (default: partitioned by ``region``); ``guarded=False``:
    plugins=[]."""
    with scratch(f"peers-{engine}-{path}") as folder:
        store = SQLiteCheckpointStore(folder / "checkpoints.db")
        sink = {
            "sqlite": lambda: SQLiteSink(folder / "target.db", TARGET_TABLE),
            "duckdb": lambda: DuckDBSink(folder / "target.duckdb", TARGET_TABLE),
            "chdb": lambda: ClickHouseSink(folder / "chdb", TARGET_TABLE),
        }[engine]()
        try:
            spec = TransferSpec(
                source=(read or _by_region)(source),
                sink=sink,
                strategy=strategy,
                path=path,
                run_id="bench-run",
                chunk_rows=CHUNK_ROWS,
            )
            runtime = TransferRuntime(store, plugins=None if guarded else [])
            seconds, result = timed(lambda: runtime.run(spec))
        finally:
            store.close()
    if result.rows_loaded != rows:
        raise AssertionError(f"{engine} {path}: loaded {result.rows_loaded} rows, not {rows}")
    return seconds


def _by_region(source: Path) -> SQLiteSource:
    return SQLiteSource(source, SOURCE_TABLE, PARTITION_COLUMN)


def _listing(source: Path, partitions: int) -> float:
    """The source's partition listing, as each run makes it before arming."""
    seconds, values = timed(
        lambda: SQLiteSource(source, SOURCE_TABLE, PARTITION_COLUMN).partition_values()
    )
    if len(values) != partitions:
        raise AssertionError(f"listed {len(values)} partitions, not {partitions}")
    return seconds


def _floor(section: str, times: dict[str, list[float]], baseline: str, name: str) -> Row:
    """Listing the partitions, then ``baseline``: a diagnostic row without a target."""
    floors = [listed + copy for listed, copy in zip(times["listing"], times[baseline], strict=True)]
    ratio = median([floor / copy for floor, copy in zip(floors, times[baseline], strict=True)])
    return Row(section, f"floor (diagnostic): listing the partitions + {name} vs {name}",
               median(floors), "s", median(times[baseline]), ratio)  # fmt: skip


def _duckdb_native(source: Path, rows: int) -> float:
    import duckdb

    with scratch("peers-duckdb-native") as folder:
        conn = duckdb.connect(str(folder / "target.duckdb"))
        try:
            conn.execute("LOAD '" + sqlite_extension(duckdb) + "'")
            scan = f"sqlite_scan('{source}', '{SOURCE_TABLE}')"
            seconds, _ = timed(lambda: conn.execute(f"CREATE TABLE t AS SELECT * FROM {scan}"))
            copied = conn.execute("SELECT count(*) FROM t").fetchone()[0]
        finally:
            conn.close()
    if copied != rows:
        raise AssertionError(f"DuckDB's own copy: {copied} rows, not {rows}")
    return seconds


def _chdb_native(source: Path, rows: int) -> float:
    from chdb import session

    with scratch("peers-chdb-native") as folder:
        chdb = session.Session(str(folder / "chdb"))
        try:
            chdb.query(
                "CREATE TABLE t (id Nullable(Int64), region Nullable(String),"
                " amount Nullable(Float64), updated_at Nullable(Int64))"
                " ENGINE = MergeTree ORDER BY tuple()"
            )
            insert = f"INSERT INTO t SELECT * FROM sqlite('{source}', '{SOURCE_TABLE}')"
            seconds, _ = timed(lambda: chdb.query(insert))
            copied = int(chdb.query("SELECT count() FROM t", "CSV").bytes())
        finally:
            chdb.close()
    if copied != rows:
        raise AssertionError(f"chDB's own copy: {copied} rows, not {rows}")
    return seconds


def run_dlt(request: dict[str, Any], folder: Path, timeout: int = 3600) -> dict[str, Any]:
    """One dlt run (``_dlt_child.py`` in dlt's venv) of ``request``: its seconds and rows."""
    file = folder / "dlt-request.json"
    file.write_text(json.dumps({"backend": "pyarrow", "dataset": "bench", **request}))
    done = subprocess.run(
        [str(DLT_PYTHON), str(REPO / "benchmarks" / "_dlt_child.py"), str(file)],
        capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    if done.returncode:
        raise AssertionError(f"dlt: exit {done.returncode}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def run_connectorx(url: str, tables: list[str], target: Path, folder: Path) -> dict[str, Any]:
    """connectorx -> Arrow -> DuckDB of ``tables`` (``schema.table``) into the file
    ``target``, each in turn (``_connectorx_child.py`` in dlt's venv, which has connectorx):
    the limit issue 47 names for a PostgreSQL source into DuckDB; its seconds and rows."""
    file = folder / "connectorx-request.json"
    file.write_text(json.dumps({"url": url, "tables": tables, "target": str(target)}))
    done = subprocess.run(
        [str(DLT_PYTHON), str(REPO / "benchmarks" / "_connectorx_child.py"), str(file)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode:
        raise AssertionError(f"connectorx: exit {done.returncode}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def _dlt(source: Path, rows: int) -> float:
    with scratch("peers-dlt") as folder:
        result = run_dlt(
            {"source": f"sqlite:///{source}", "tables": [SOURCE_TABLE], "destination": "duckdb",
             "target": str(folder / "target.duckdb"), "work": str(folder / "dlt")},
            folder, timeout=600,
        )  # fmt: skip
    if result["rows"] != rows:
        raise AssertionError(f"dlt: {result['rows']} rows, not {rows}")
    return float(result["seconds"])


# Guarded/unguarded pairs per round: one run of these transfers varies by about 10% on this
# VM, so one pair a round (7 in all) resolved a 5% overhead only roughly (1.07 for a guard
# costing 1%); lazy-plan's short transfer repeats as in section 1. Odd counts, so a round
# and the next, reversed, each start pairs both ways.
GUARD_PAIRS_PER_ROUND = {path: 3 for path in PATHS} | PAIRS_PER_ROUND


def _dlt_missing() -> str | None:
    """Why dlt cannot run here, or None."""
    if not DLT_PYTHON.exists():
        return "no dlt venv: make bench creates it (or set DPONE_BENCH_DLT_PYTHON)"
    return None


def rounds(
    cases: dict[str, Callable[[], float]],
    runs: int,
    pairs: dict[str, str] | None = None,
    *,
    label: str = "peers",
) -> dict[str, list[float]]:
    """Each case once per round, ``runs`` rounds after one warm-up round that is dropped.

    Odd rounds run the cases in reverse order, so no case always follows the same
    one. A case in ``pairs`` runs back to back with its partner (``{guarded:
    unguarded}``), which goes first every other time, ``GUARD_PAIRS_PER_ROUND`` times.
    """
    pairs = pairs or {}
    partners = set(pairs.values())
    times: dict[str, list[float]] = {name: [] for name in cases}
    for round_number in range(runs + 1):
        schedule: list[str] = []
        for name in cases:
            if name in partners:
                continue
            if name not in pairs:
                schedule.append(name)
                continue
            repeats = GUARD_PAIRS_PER_ROUND.get(name, 1)
            for repeat in range(repeats):
                pair = [name, pairs[name]]  # reversed with the schedule on odd rounds
                schedule.extend(pair if repeat % 2 else pair[::-1])
        for name in schedule[::-1] if round_number % 2 else schedule:
            seconds = cases[name]()
            if round_number:
                times[name].append(seconds)
        log(f"{label}: round {round_number} of {runs} done")
    return times


def _ratio(times: dict[str, list[float]], case: str, baseline: str) -> float:
    """The median of the per-run ratios; of the medians when one repeats within a round."""
    if len(times[case]) != len(times[baseline]):
        return median(times[case]) / median(times[baseline])
    return median([a / b for a, b in zip(times[case], times[baseline], strict=True)])


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    rows_total, partitions = sizes.transfer_rows, sizes.transfer_partitions
    source = unindexed_source_db(rows_total, partitions)
    size = f"{rows_total:,} rows / {partitions} unindexed partitions"
    rows: list[Row] = []
    raw: dict = {"source_rows": rows_total, "partitions": partitions}

    listing = functools.partial(_listing, source, partitions)
    sqlite_cases: dict[str, Callable[[], float]] = {
        "listing": listing,
        "bare-copy": lambda: bare_copy(source, rows=rows_total),
        "bare-attach": lambda: bare_attach(source, rows=rows_total),
        **{
            path: (lambda path=path: run_transfer(source, path, guarded=True, rows=rows_total)[0])
            for path in PATHS
        },
    }
    sqlite_times = rounds(sqlite_cases, sizes.runs)
    raw["sqlite"] = sqlite_times
    for path in PATHS:
        baseline = "bare-attach" if path == "lazy-plan" else "bare-copy"
        ratio, limit = _ratio(sqlite_times, path, baseline), RUNTIME_LIMITS[path]
        rows.append(
            Row("2b unindexed source", f"{path} (guarded) vs {baseline} ({size})",
                median(sqlite_times[path]), "s", median(sqlite_times[baseline]), ratio,
                f"<= {limit}", ratio <= limit)
        )  # fmt: skip
    rows.append(_floor("2b unindexed source", sqlite_times, "bare-attach", "bare-attach"))

    dlt_missing = _dlt_missing()
    raw["dlt_skipped"] = dlt_missing
    for engine, native in (("duckdb", _duckdb_native), ("chdb", _chdb_native)):
        cases: dict[str, Callable[[], float]] = {
            "listing": listing,
            "native": lambda native=native: native(source, rows_total),
        }
        for path in PATHS:
            cases[path] = lambda path=path, engine=engine: engine_transfer(
                source, engine, path, rows_total
            )
            cases[f"{path} unguarded"] = lambda path=path, engine=engine: engine_transfer(
                source, engine, path, rows_total, guarded=False
            )
        if engine == "duckdb" and dlt_missing is None:
            cases["dlt"] = lambda: _dlt(source, rows_total)
        times = rounds(cases, sizes.runs, {path: f"{path} unguarded" for path in PATHS})
        raw[engine] = times
        name = {"duckdb": "DuckDB", "chdb": "chDB"}[engine]
        own = OWN_COPY[engine]
        rows.append(_floor(f"7 peers ({name})", times, "native", f"{name}'s own copy"))
        for path in PATHS:
            limit = ENGINE_LIMITS[engine]["lazy-plan" if path == "lazy-plan" else "other"]
            ratio = _ratio(times, path, "native")
            rows.append(
                Row(f"7 peers ({name})", f"{path} (guarded, ledger) vs {name}'s own {own}",
                    median(times[path]), "s", median(times["native"]), ratio,
                    f"<= {limit}", ratio <= limit)
            )  # fmt: skip
            overhead = _ratio(times, path, f"{path} unguarded")
            rows.append(
                Row(f"7 peers ({name})", f"{path}: guarded vs plugins=[] (guard overhead)",
                    median(times[path]), "s", median(times[f"{path} unguarded"]), overhead,
                    f"<= {GUARD_LIMIT}", overhead <= GUARD_LIMIT)
            )  # fmt: skip
        if engine == "duckdb":
            if dlt_missing is not None:
                print(f"section 7: dlt rows skipped: {dlt_missing}", flush=True)
                continue
            version = _dlt_version()
            raw["dlt_version"] = version
            for path in PATHS:
                ratio = _ratio(times, path, "dlt")
                rows.append(
                    Row("7 peers (DuckDB)", f"{path} vs dlt {version} sql_database (pyarrow)",
                        median(times[path]), "s", median(times["dlt"]), ratio,
                        f"<= {DLT_SHARE}", ratio <= DLT_SHARE)
                )  # fmt: skip
    return rows, raw


def _dlt_version() -> str:
    done = subprocess.run(
        [str(DLT_PYTHON), "-c", "import dlt; print(dlt.__version__)"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return done.stdout.strip()
