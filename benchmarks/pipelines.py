"""Section 10: pipelines: many tables in one run, --jobs 1 against --jobs 2, and dlt.

Two shapes of source (``Sizes.pipeline_shapes``; full: 100 tables of 10,000 rows and 10
tables of 1,000,000), each in a SQLite file and in a PostgreSQL schema, copied into a
DuckDB file and into a PostgreSQL schema: a full refresh of every table into a fresh
target and a fresh store per run, timed from reading the pipeline file (its check of the
source's catalog included) to the last table's commit. Per case:

- ``jobs 1`` and ``jobs 2``: ``run_tables``, as ``dpone-transfer run --jobs N`` runs them
  (threads of one process, or worker processes where ``--workers auto`` takes them:
  the workers that ran are in the raw results, ``workers``);
- ``2 processes``: the tables split in two halves, each ``dpone-transfer run --tables``
  in a process of its own, both at once: the alternative to threads, measured to pick
  between them (into DuckDB it cannot run: one process at a time opens a DuckDB file);
- ``own copy`` (a diagnostic floor, where the target engine reads the source itself): the
  engine copying the same tables with nothing else, DuckDB's ``CREATE TABLE AS SELECT *
  FROM sqlite_scan`` per table, PostgreSQL's ``CREATE TABLE AS SELECT *`` per table: the
  least any tool's run can take there, and so the least ratio to dlt there can be;
- ``rows by hand`` (a diagnostic floor from SQLite into PostgreSQL, which cannot read SQLite
  itself): two processes, each moving half the tables with nothing else, per table a
  ``CREATE TABLE``, the rows read with ``sqlite3`` and written by one binary ``COPY`` with
  psycopg, and a commit: no store, lease, check, ledger or fence (``_by_hand``). What any
  tool moving rows through Python takes there, and what is left for the guard's work;
- ``limit`` (PostgreSQL into DuckDB, where dlt's venv has connectorx): connectorx -> Arrow ->
  DuckDB, each table in turn, nothing else (``_connectorx_child.py``): the limit issue 47
  measures a row path against (target: within 1.5x);
- dlt 1.31's ``sql_database(table_names=...)`` into the same target, with its pyarrow and
  its connectorx backend (``_dlt_child.py``, in dlt's own venv); the faster of the
  two is the baseline. Target: dpone's faster jobs setting at most a third of dlt's time.

``DPONE_BENCH_PIPELINE_CASES`` (all, the default) names the cases to measure, to re-measure
one alone in minutes, not the section's hour: comma-separated ``TABLESxROWS:SOURCE>TARGET``,
e.g. ``100x10000:sqlite>postgres``.

The path is ``auto``, a pipeline table's default: per table, the path measured fastest for
its engine pair (lazy-plan where the target engine reads the source itself: SQLite into
DuckDB, PostgreSQL into PostgreSQL; legacy from PostgreSQL's bulk files into DuckDB; staged
from SQLite into PostgreSQL). The paths that ran are in the raw results (``paths``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dpone_native_transfer.connectors.duckdb.connect import sqlite_extension
from dpone_native_transfer.pipeline import load_pipeline
from dpone_native_transfer.pipeline_run import chosen_workers, run_tables

from ._common import Row, Sizes, cached_source, log, median, scratch, timed
from .batch import _import_server_helper
from .peers import _dlt_missing, rounds, run_connectorx, run_dlt

DLT_SHARE = 1 / 3  # at least 3x faster than dlt
RUNS = 5
BACKENDS = ("pyarrow", "connectorx")
OWN_COPY = {("sqlite", "duckdb"), ("postgres", "postgres")}  # the target engine reads the source
BY_HAND = {("sqlite", "postgres")}  # rows through Python by hand, no guard (``_by_hand``)
LIMIT = {("postgres", "duckdb")}  # connectorx -> Arrow -> DuckDB, in dlt's venv
LIMIT_SHARE = 1.5  # a row path within 1.5x the limit (issue 47)
CASES = os.environ.get("DPONE_BENCH_PIPELINE_CASES")  # None: every case
PATH = "auto"  # each table's path chosen by dpone, as a pipeline table's default


def _names(tables: int) -> list[str]:
    return [f"t{n:03d}" for n in range(1, tables + 1)]


def _sqlite_source(tables: int, rows: int) -> Path:
    statements = []
    for name in _names(tables):
        statements += [
            f"CREATE TABLE {name} (id INTEGER PRIMARY KEY, region TEXT NOT NULL, amount REAL,"
            " updated_at INTEGER)",
            f"INSERT INTO {name} WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n"
            f" WHERE i < {rows}) SELECT i, printf('region-%02d', i % 10), round(i * 1.25, 2),"
            " 1000000 + i FROM n",
        ]
    return cached_source(f"pipeline-{tables}x{rows}", statements)


def _postgres_source(dsn: str, schema: str, tables: int, rows: int, psycopg: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        for name in _names(tables):
            relation = f'"{schema}".{name}'
            conn.execute(
                f"CREATE TABLE {relation} (id bigint PRIMARY KEY, region text NOT NULL, amount"
                " double precision, updated_at bigint)"
            )
            conn.execute(
                f"INSERT INTO {relation} SELECT i, format('region-%s', i % 10), round(i * 1.25,"
                f" 2), 1000000 + i FROM generate_series(1, {rows}) AS i"
            )
            conn.execute(f"ANALYZE {relation}")


def _pipeline_file(
    folder: Path, source: dict[str, str], target: dict[str, str], tables: str, path: str
) -> Path:
    lines = ["[pipeline]", f"tables = [{json.dumps(tables)}]", "[source]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in source.items()]
    lines += ["[target]", *(f"{k} = {json.dumps(v)}" for k, v in target.items())]
    lines += ["[store]", f'path = "{folder / "checkpoints.db"}"']
    lines += ["[defaults]", 'strategy = "full_refresh"', f'path = "{path}"']
    file = folder / "pipeline.toml"
    file.write_text("\n".join(lines) + "\n")
    return file


class _Case:
    """One source, target and shape: makes a fresh target per run and counts its rows."""

    def __init__(self, source: str, target: str, tables: int, rows: int, env: dict[str, Any]):
        self.source, self.target, self.tables, self.rows, self.env = (
            source, target, tables, rows, env,
        )  # fmt: skip
        self.names = _names(tables)
        self.paths_ran: list[str] = []  # the paths auto chose in the last dpone run
        self.workers: dict[int, str] = {}  # per jobs, what --workers auto chose

    @contextlib.contextmanager
    def fresh(self, label: str) -> Iterator[tuple[Path, dict[str, str], str]]:
        """A scratch folder, the target's pipeline keys, and where dlt writes (a file, or the
        server with the schema as its dataset)."""
        with scratch(f"pipelines-{label}") as folder:
            if self.target == "duckdb":
                yield folder, {"kind": "duckdb", "path": str(folder / "w.duckdb")}, ""
                return
            schema = f"bench_target_{label.replace('-', '_')}"
            admin = self.env["psycopg"].connect(self.env["dsn"], autocommit=True)
            try:
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                admin.execute(f'CREATE SCHEMA "{schema}"')
                keys = {"kind": "postgres", "dsn": self.env["url"], "table_prefix": f"{schema}."}
                yield folder, keys, schema
            finally:
                admin.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                admin.close()

    def source_keys(self) -> tuple[dict[str, str], str]:
        if self.source == "sqlite":
            return {"path": str(self.env["sqlite"][(self.tables, self.rows)])}, "t*"
        return {"kind": "postgres", "dsn": self.env["url"]}, f"{self.env['schema']}.t*"

    def dpone(self, jobs: int) -> float:
        with self.fresh(f"dpone-{jobs}") as (folder, target, _):
            source, tables = self.source_keys()
            file = _pipeline_file(folder, source, target, tables, PATH)

            def run() -> Any:
                tables = load_pipeline(file, rows=True).tables
                workers = chosen_workers(tables, jobs)  # as `dpone-transfer run` chooses
                return run_tables(tables, "bench", jobs=jobs, workers=workers)

            seconds, result = timed(run)
            self.workers[jobs] = result.workers
            loaded = sum(table.rows_loaded for table in result.tables)
            self.paths_ran = sorted({str(table.path) for table in result.tables})
        if result.exit_code or loaded != self.tables * self.rows:
            raise AssertionError(f"dpone jobs {jobs}: exit {result.exit_code}, {loaded} rows")
        return seconds

    def processes(self) -> float:
        """The tables in two halves, a ``dpone-transfer run --tables`` process each, at once."""
        with self.fresh("dpone-processes") as (folder, target, _):
            source, tables = self.source_keys()
            file = _pipeline_file(folder, source, target, tables, PATH)
            prefix = f"{self.env['schema']}." if self.source == "postgres" else ""
            halves = [self.names[::2], self.names[1::2]]
            command = [sys.executable, "-m", "dpone_native_transfer", "run", str(file), "--quiet"]

            def run() -> list[int]:
                children = [
                    subprocess.Popen(
                        [*command, "--jobs", "1", "--tables", ",".join(prefix + n for n in half)],
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                    )
                    for half in halves
                ]
                return [child.wait() for child in children]

            seconds, codes = timed(run)
        if codes != [0, 0]:
            raise AssertionError(f"2 processes: exit statuses {codes}")
        return seconds

    def own_copy(self) -> float:
        """The target engine copying every table itself (``OWN_COPY`` pairs only)."""
        with self.fresh("own-copy") as (folder, target, schema):
            if self.target == "duckdb":
                import duckdb

                source = self.env["sqlite"][(self.tables, self.rows)]

                def run() -> int:
                    conn = duckdb.connect(target["path"])
                    try:
                        conn.execute("LOAD '" + sqlite_extension(duckdb) + "'")
                        for name in self.names:
                            conn.execute(
                                f"CREATE TABLE {name} AS SELECT * FROM sqlite_scan('{source}',"
                                f" '{name}')"
                            )
                        return sum(
                            conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
                            for name in self.names
                        )
                    finally:
                        conn.close()

            else:

                def run() -> int:
                    with self.env["psycopg"].connect(self.env["dsn"], autocommit=True) as conn:
                        for name in self.names:
                            conn.execute(
                                f'CREATE TABLE "{schema}".{name} AS SELECT * FROM'
                                f' "{self.env["schema"]}".{name}'
                            )
                        return sum(
                            conn.execute(f'SELECT count(*) FROM "{schema}".{name}').fetchone()[0]
                            for name in self.names
                        )

            seconds, copied = timed(run)
        if copied != self.tables * self.rows:
            raise AssertionError(f"own copy: {copied} rows")
        return seconds

    def by_hand(self) -> float:
        """The tables in two halves, a spawned process each (``_by_hand``), both at once."""
        import multiprocessing

        with self.fresh("by-hand") as (folder, target, schema):
            source = str(self.env["sqlite"][(self.tables, self.rows)])
            halves = [(self.env["dsn"], source, schema, self.names[k::2]) for k in (0, 1)]

            def run() -> int:
                with multiprocessing.get_context("spawn").Pool(2) as pool:
                    return sum(pool.map(_by_hand, halves))

            seconds, copied = timed(run)
        if copied != self.tables * self.rows:
            raise AssertionError(f"rows by hand: {copied} rows")
        return seconds

    def limit(self) -> float:
        """connectorx -> Arrow -> DuckDB of every table in turn (``LIMIT`` pairs only)."""
        with self.fresh("limit") as (folder, target, _):
            tables = [f'"{self.env["schema"]}".{name}' for name in self.names]
            result = run_connectorx(self.env["url"], tables, Path(target["path"]), folder)
        if result["rows"] != self.tables * self.rows:
            raise AssertionError(f"limit: {result['rows']} rows")
        return float(result["seconds"])

    def dlt(self, backend: str) -> float:
        with self.fresh(f"dlt-{backend}") as (folder, target, schema):
            if self.source == "sqlite":
                source, source_schema = (
                    f"sqlite:///{self.env['sqlite'][(self.tables, self.rows)]}",
                    None,
                )
            else:
                # SQLAlchemy 2.1 reads postgresql:// with psycopg 3; dlt's extra brings psycopg2
                url = self.env["url"].replace("postgresql://", "postgresql+psycopg2://", 1)
                source, source_schema = url, self.env["schema"]
            destination = "duckdb" if self.target == "duckdb" else "postgres"
            request = {
                "source": source, "schema": source_schema, "tables": self.names,
                "backend": backend, "destination": destination,
                "target": target.get("path") or self.env["url"],
                "dataset": schema or "bench", "work": str(folder / "dlt"),
            }  # fmt: skip
            result = run_dlt({**request, "name": "bench_pipeline"}, folder)
        if result["rows"] != self.tables * self.rows:
            raise AssertionError(f"dlt {backend}: {result['rows']} rows")
        return result["seconds"]


def _by_hand(work: tuple[str, str, str, list[str]]) -> int:
    """``rows by hand``: each table of ``names`` from the SQLite file into a new table of
    ``schema``, its rows read by ``sqlite3`` and written by one binary ``COPY``, committed;
    the rows the server wrote. The benchmark's tables only (their four columns)."""
    import sqlite3

    import psycopg

    dsn, source, schema, names = work
    copied = 0
    with contextlib.closing(sqlite3.connect(source)) as db, psycopg.connect(dsn) as conn:
        for name in names:
            table = f'"{schema}".{name}'
            conn.execute(f"CREATE TABLE {table} (id bigint, region text, amount double"
                         " precision, updated_at bigint)")  # fmt: skip
            with conn.cursor() as cursor:
                with cursor.copy(f"COPY {table} FROM STDIN (FORMAT binary)") as copy:
                    copy.set_types(["int8", "text", "float8", "int8"])
                    rows = db.execute(f"SELECT id, region, amount, updated_at FROM {name}")
                    while chunk := rows.fetchmany(10_000):
                        for row in chunk:
                            copy.write_row(row)
                copied += cursor.rowcount
            conn.commit()
    return copied


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    imported = _import_server_helper()
    if isinstance(imported, str):
        raise AssertionError(f"section 10 needs PostgreSQL: {imported}")
    helper, psycopg = imported
    dlt_missing = _dlt_missing()
    if dlt_missing is not None:
        print(f"section 10: dlt rows skipped: {dlt_missing}", flush=True)
    rows: list[Row] = []
    raw: dict[str, Any] = {"dlt_skipped": dlt_missing, "seconds": {}, "dlt_backend": {}}
    with helper.server_dsn() as dsn, helper.isolated_schema(dsn) as location:
        env: dict[str, Any] = {
            "dsn": dsn, "url": helper.postgres_url(dsn), "schema": location.schema,
            "psycopg": psycopg, "sqlite": {},
        }  # fmt: skip
        for shape, (tables, per_table) in enumerate(sizes.pipeline_shapes):
            pairs = [
                (source, target)
                for source in ("sqlite", "postgres")
                for target in ("duckdb", "postgres")
                if CASES is None or f"{tables}x{per_table}:{source}>{target}" in CASES.split(",")
            ]
            if not pairs:
                continue
            env["sqlite"][(tables, per_table)] = _sqlite_source(tables, per_table)
            env["schema"] = f"{location.schema}_{shape}"
            with contextlib.ExitStack() as stack:
                if any(source == "postgres" for source, _ in pairs):
                    log(f"PostgreSQL source: {tables} tables of {per_table:,} rows")
                    stack.callback(_drop, dsn, env["schema"], psycopg)
                    _postgres_source(dsn, env["schema"], tables, per_table, psycopg)
                for source, target in pairs:
                    case = _Case(source, target, tables, per_table, env)
                    label = f"{tables} x {per_table:,} rows, {source} into {target}"
                    rows += _measure_case(case, label, min(sizes.runs, RUNS), dlt_missing, raw)
    return rows, raw


def _drop(dsn: str, schema: str, psycopg: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _measure_case(
    case: _Case, label: str, runs: int, dlt_missing: str | None, raw: dict[str, Any]
) -> list[Row]:
    cases: dict[str, Callable[[], float]] = {
        "jobs 1": lambda: case.dpone(1),
        "jobs 2": lambda: case.dpone(2),
    }
    if case.target != "duckdb":
        cases["2 processes"] = case.processes
    if (case.source, case.target) in OWN_COPY:
        cases["own copy"] = case.own_copy
    if (case.source, case.target) in BY_HAND:
        cases["rows by hand"] = case.by_hand
    if dlt_missing is None:
        cases |= {f"dlt {b}": (lambda b=b: case.dlt(b)) for b in BACKENDS}
        if (case.source, case.target) in LIMIT:
            cases["limit"] = case.limit
    times = rounds(cases, runs, label=f"pipelines {label}")
    raw["seconds"][label] = times
    raw.setdefault("paths", {})[label] = case.paths_ran
    raw.setdefault("workers", {})[label] = case.workers
    section = "10 pipelines"
    jobs1, jobs2 = median(times["jobs 1"]), median(times["jobs 2"])
    rows = [Row(section, f"{label}: jobs 2 ({case.workers[2]}) vs jobs 1", jobs2, "s", jobs1,
                jobs2 / jobs1)]  # fmt: skip
    if "2 processes" in times:
        value = median(times["2 processes"])
        rows.append(Row(section, f"{label}: 2 processes by hand vs jobs 2 ({case.workers[2]})",
                        value, "s", jobs2, value / jobs2))  # fmt: skip
    if dlt_missing is None:
        backend = min(BACKENDS, key=lambda b: median(times[f"dlt {b}"]))
        raw["dlt_backend"][label] = backend
        dlt = median(times[f"dlt {backend}"])
        best = min(jobs1, jobs2)
        rows.append(
            Row(section, f"{label}: dpone vs dlt 1.31 sql_database ({backend})", best, "s", dlt,
                best / dlt, target=f"<= {DLT_SHARE:.2f}", met=best / dlt <= DLT_SHARE)
        )  # fmt: skip
        floor = next((name for name in ("own copy", "rows by hand") if name in times), None)
        if floor is not None:
            own = median(times[floor])
            rows.append(Row(section, f"{label}: floor (diagnostic): {_FLOORS[floor]} vs dlt",
                            own, "s", dlt, own / dlt))  # fmt: skip
    if "limit" in times:
        limit = median(times["limit"])
        rows.append(
            Row(section, f"{label}: dpone's faster jobs vs the limit (connectorx -> Arrow ->"
                " DuckDB)", min(jobs1, jobs2), "s", limit, min(jobs1, jobs2) / limit,
                target=f"<= {LIMIT_SHARE}", met=min(jobs1, jobs2) / limit <= LIMIT_SHARE)
        )  # fmt: skip
    for floor, name in _FLOORS.items():
        if floor in times:
            own = median(times[floor])
            rows.append(Row(section, f"{label}: dpone's faster jobs vs {name}",
                            min(jobs1, jobs2), "s", own, min(jobs1, jobs2) / own))  # fmt: skip
    return rows


_FLOORS = {"own copy": "the engine's own copy",
           "rows by hand": "rows by hand in 2 processes, no guard"}  # fmt: skip


__all__ = ["measure"]
