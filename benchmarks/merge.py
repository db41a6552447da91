"""Section 11: merge on a key, a run that changes 1% of a 1,000,000-row target.

A SQLite source ``orders(id PRIMARY KEY, region, amount, updated_at, is_deleted)`` is
merged into a DuckDB file, a PostgreSQL schema (a throwaway server, as section 4 starts
it) and a chDB data path once, untimed. Each measured round then changes 1% of the source
(updates, deletes through ``is_deleted``, new keys; every changed row's ``updated_at``
above the last) and times:

- dpone: ``TransferRuntime.run`` of the merge route, guarded, per path (lazy-plan carries
  the rows as legacy on a merge route, so it is not measured apart);
- dpone's append of the same rows (another route, into a table of its own, caught up
  untimed before the round's change, as dlt is): what a run costs besides the merge;
- the floor: the same changed rows read from the source by hand, bulk-loaded into a
  temporary table of the target, and the engine's own ``MERGE`` statement (DuckDB,
  PostgreSQL 15+) into a second 1,000,000-row table, in one transaction; on chDB, which has
  no ``MERGE``, its own way by hand: the rows (an Arrow file, as dpone's) inserted into a
  ``ReplacingMergeTree(updated_at, is_deleted) ORDER BY id`` (the cursor as the version,
  no read of the table), counted with ``FINAL``;
- dlt 1.31's merge (``_dlt_child.py``, in section 7's venv: ``make bench`` makes it,
  or ``DPONE_BENCH_DLT_PYTHON``): ``sql_database`` incremental on ``updated_at``, pyarrow,
  ``write_disposition`` merge with ``delete-insert``, ``primary_key="id"``,
  ``is_deleted`` as its ``hard_delete`` column, into a table and file of its own (first
  load untimed; before its timed round it catches up untimed, so each timed run merges
  one round's 1%, as dpone's do). Its ``pipeline.run`` is timed inside its process, as
  dpone's ``run`` is. Not on chDB (dlt's ClickHouse destination needs a server).

``DPONE_BENCH_MERGE_ENGINES`` (``duckdb,postgres,clickhouse``, the default) names the
engines to measure, to re-measure one alone. The paths, the floor, the append and dlt
alternate within every round. Every round checks
that every table holds the source's rows less deleted ones. At full size, the peak memory
of a 1% merge into DuckDB at 1,000,000 and 10,000,000 target rows, dpone's and the floor's,
each in a fresh process (``_merge_memory_child.py``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dpone_native_transfer import (
    ClickHouseSink,
    DuckDBSink,
    PostgresSink,
    SQLiteCheckpointStore,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.drivers import holding_connections
from dpone_native_transfer.payloads import Column

from ._common import CHUNK_ROWS, WORK, Row, Sizes, cached_source, log, median, timed
from .batch import _import_server_helper
from .peers import _dlt_missing, _dlt_version, run_dlt

TARGET_ROWS = {"full": 1_000_000, "quick": 20_000}
ENGINES = os.environ.get("DPONE_BENCH_MERGE_ENGINES", "duckdb,postgres,clickhouse").split(",")
CHANGED = 0.01  # of the target's rows: 40% updates, 30% deletes, 30% new keys
PATHS = ("legacy", "staged", "file-artifact")
COLUMNS = ("id", "region", "amount", "updated_at", "is_deleted")
FLOOR_LIMIT = 1.5  # dpone against the engine's own MERGE
# The targets are on DuckDB and PostgreSQL; ClickHouse's floor is an INSERT that
# reads nothing back, where dpone's merge reads the merged view of the batch's keys to stay
# monotonic (docs/connectors.md, "ClickHouse: a ReplacingMergeTree"): measured, not judged.
FLOOR_JUDGED = ("duckdb", "postgres")
DLT_SHARE = 1 / 3  # dpone at least 3x faster than dlt's merge
TABLES = ("orders", "floor")  # dpone's target, the floor's
MEMORY_ROWS = (1_000_000, 10_000_000)  # target rows of the peak-memory runs (full size only)
FLAT_LIMIT = 1.2  # peak memory at 10M target rows against 1M, as section 5's (memory.py)


def _source(rows: int) -> Path:
    return cached_source(
        f"merge-{rows}",
        [
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, region TEXT NOT NULL, amount REAL,"
            " updated_at INTEGER NOT NULL, is_deleted BOOLEAN NOT NULL)",
            "INSERT INTO orders WITH RECURSIVE n(i) AS"
            f" (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})"
            " SELECT i, printf('region-%02d', i % 10), round(i * 1.25, 2), i, 0 FROM n",
            "CREATE INDEX orders_by_updated ON orders (updated_at)",
        ],
    )


def _change(path: Path, rows: int, round_: int) -> tuple[int, int]:
    """Change 1% of the rows; returns the cursor window (after, upto] it wrote."""
    changed = max(10, int(rows * CHANGED))
    updates, deletes = changed * 4 // 10, changed * 3 // 10
    news = changed - updates - deletes
    with contextlib.closing(sqlite3.connect(path)) as db:
        top, last = db.execute("SELECT max(updated_at), max(id) FROM orders").fetchone()
        step = rows // changed
        ids = [1 + (round_ * 7 + i * step) % rows for i in range(updates + deletes)]
        db.executemany(
            "UPDATE orders SET amount = amount + 1, updated_at = ? WHERE id = ?",
            [(top + 1 + i, key) for i, key in enumerate(ids[:updates])],
        )
        db.executemany(
            "UPDATE orders SET is_deleted = 1, updated_at = ? WHERE id = ?",
            [(top + 1 + updates + i, key) for i, key in enumerate(ids[updates:])],
        )
        db.executemany(
            "INSERT INTO orders VALUES (?, 'region-new', 1.5, ?, 0)",
            [(last + 1 + i, top + 1 + updates + deletes + i) for i in range(news)],
        )
        db.commit()
    return top, top + changed


def _changed_rows(path: Path, after: int, upto: int) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute(
            "SELECT * FROM orders WHERE updated_at > ? AND updated_at <= ?", (after, upto)
        ).fetchall()


def _live(path: Path) -> int:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return db.execute("SELECT count(*) FROM orders WHERE NOT is_deleted").fetchone()[0]


def _run(store_path: Path, source: Path, sink: Any, path: str, *, append: bool = False) -> float:
    """One guarded run of the merge route (``append``: of an append route of the same rows,
    into a table of its own: what the run costs besides the merge)."""
    store = SQLiteCheckpointStore(store_path)
    try:
        spec = TransferSpec(
            source=SQLiteSource(source, "orders", "region", "updated_at"),
            sink=sink,
            strategy="incremental_append" if append else "merge",
            path=path,
            run_id=f"bench-{path}",
            chunk_rows=CHUNK_ROWS,
            deleted_column=None if append else "is_deleted",
        )
        with holding_connections():  # as `dpone-transfer run` does (application.transfer)
            seconds, _ = timed(lambda: TransferRuntime(store).run(spec))
        return seconds
    finally:
        store.close()


# -- the floors: each engine's own MERGE, by hand ---------------------------------------------

_MERGE = (
    "MERGE INTO {target} AS t USING {batch} AS s ON t.id = s.id"
    " WHEN MATCHED AND s.is_deleted THEN DELETE"
    " WHEN MATCHED AND s.updated_at >= t.updated_at THEN UPDATE SET region = s.region,"
    " amount = s.amount, updated_at = s.updated_at"
    " WHEN NOT MATCHED AND NOT s.is_deleted THEN INSERT (id, region, amount, updated_at)"
    " VALUES (s.id, s.region, s.amount, s.updated_at)"
)


def _duckdb_floor(file: Path, rows: list[tuple], *, table: str = "floor") -> float:
    """DuckDB's own merge of ``rows`` by hand; returns the seconds of its MERGE and commit."""
    import duckdb
    import pyarrow as pa

    batch = pa.table({name: [row[i] for row in rows] for i, name in enumerate(COLUMNS)})
    batch = batch.set_column(4, "is_deleted", pa.array([bool(r[4]) for r in rows]))
    with contextlib.closing(duckdb.connect(str(file))) as db:
        db.execute("BEGIN")
        db.register("arrow_batch", batch)
        db.execute("CREATE TEMP TABLE batch AS SELECT * FROM arrow_batch")
        started = time.perf_counter()
        db.execute(_MERGE.format(target=table, batch="batch"))
        db.execute("COMMIT")
        return time.perf_counter() - started


def _postgres_floor(psycopg: Any, dsn: str, schema: str, rows: list[tuple]) -> float:
    """PostgreSQL's own merge of ``rows`` by hand; returns the seconds of its MERGE and
    commit."""
    with psycopg.connect(dsn) as db:
        db.execute(f'SET search_path = "{schema}"')
        db.execute(
            "CREATE TEMP TABLE batch (id bigint, region text, amount double precision,"
            " updated_at bigint, is_deleted boolean) ON COMMIT DROP"
        )
        with db.cursor() as cursor, cursor.copy("COPY batch FROM STDIN") as copy:
            for row in rows:
                copy.write_row((*row[:4], bool(row[4])))
        started = time.perf_counter()
        db.execute(_MERGE.format(target="floor", batch="batch"))
        db.commit()
        return time.perf_counter() - started


_CHDB_FLOOR = (
    "CREATE TABLE floor (id Int64, region String, amount Nullable(Float64), updated_at UInt64,"
    " is_deleted UInt8) ENGINE = ReplacingMergeTree(updated_at, is_deleted) ORDER BY id"
)


def _chdb_floor(sink: ClickHouseSink, rows: list[tuple]) -> float:
    """ClickHouse's own merge by hand: one INSERT of the rows into the ReplacingMergeTree;
    returns its seconds."""
    declared = ("INTEGER", "TEXT", "REAL", "INTEGER", "INTEGER")
    columns = [Column(name, kind) for name, kind in zip(COLUMNS, declared, strict=True)]
    with sink.client() as client:
        started = time.perf_counter()
        client.insert_rows("floor", columns, [[(*r[:4], int(r[4])) for r in rows]])
        return time.perf_counter() - started


def _dlt(request: dict[str, Any], folder: Path) -> dict[str, Any]:
    """One dlt merge run: its seconds and the rows it then holds."""
    merge = {"cursor": "updated_at", "primary_key": "id", "hard_delete": "is_deleted"}
    return run_dlt({**request, "name": "bench_merge", "tables": ["orders"], "merge": merge}, folder)


# -- the measurement ----------------------------------------------------------------------------


@contextlib.contextmanager
def _targets(rows: int) -> Iterator[dict[str, tuple[Callable[..., Any], Callable, Callable, dict]]]:
    """Per engine: (a new sink, the floor of changed rows, the rows of (dpone, floor), where
    dlt merges: its destination, target and dataset)."""
    folder = WORK / "runs" / "merge"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    found: dict[str, tuple[Callable[..., Any], Callable, Callable, dict]] = {}
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, folder, True)
        import duckdb

        file = folder / "target.duckdb"

        def duck_counts() -> tuple[int, int]:
            with contextlib.closing(duckdb.connect(str(file))) as db:
                found = [db.execute(f"SELECT count(*) FROM {t}").fetchone() for t in TABLES]
                return found[0][0], found[1][0]

        found["duckdb"] = (
            lambda table="orders": DuckDBSink(file, table),
            lambda changed: _duckdb_floor(file, changed),
            duck_counts,
            {
                "destination": "duckdb",
                "target": str(folder / "dlt_target.duckdb"),
                "dataset": "merged",
            },
        )
        imported = _import_server_helper()
        if isinstance(imported, str):
            log(f"merge: no PostgreSQL ({imported})")
        else:
            helper, psycopg = imported
            dsn = stack.enter_context(helper.server_dsn())
            location = stack.enter_context(helper.isolated_schema(dsn))
            schema = location.schema
            with psycopg.connect(dsn, autocommit=True) as db:
                db.execute(f'CREATE SCHEMA "{schema}"')
            url = helper.postgres_url(dsn)

            def pg_counts() -> tuple[int, int]:
                with psycopg.connect(dsn) as db:
                    sql = 'SELECT count(*) FROM "{}".{}'
                    found = [db.execute(sql.format(schema, t)).fetchone() for t in TABLES]
                    return found[0][0], found[1][0]

            found["postgres"] = (
                lambda table="orders": PostgresSink(url, f"{schema}.{table}"),
                lambda changed: _postgres_floor(psycopg, dsn, schema, changed),
                pg_counts,
                {"destination": "postgres", "target": url, "dataset": f"{schema}_dlt"},
            )
        data = folder / "chdata"

        def ch_counts() -> tuple[int, int]:
            with ClickHouseSink(data, "orders").client() as client:
                sql = "SELECT count() FROM {} FINAL"
                found = [client.query_rows(sql.format(t))[0] for t in TABLES]
                return found[0][0], found[1][0]

        found["clickhouse"] = (
            lambda table="orders": ClickHouseSink(data, table),
            lambda changed: _chdb_floor(ClickHouseSink(data, "floor"), changed),
            ch_counts,
            {},  # dlt's ClickHouse destination needs a server
        )
        yield {engine: found[engine] for engine in ENGINES if engine in found}


def _floor_table(engine: str, sink: Any) -> None:
    """The floor's table: a copy of dpone's target after the first load, its key a PRIMARY
    KEY as dpone's. PostgreSQL's planner statistics of both tables are made at once: a
    plan whose statistics autovacuum had or had not made yet ran the floor's MERGE in 0.03
    or 0.19 s."""
    if engine == "clickhouse":
        with sink.client() as client:
            client.command(_CHDB_FLOOR)
            client.command(
                "INSERT INTO floor SELECT id, region, amount, updated_at, 0 FROM orders FINAL"
            )
        return
    if engine == "duckdb":
        import duckdb

        with contextlib.closing(duckdb.connect(str(sink.path))) as db:
            db.execute("CREATE TABLE floor AS SELECT * FROM orders")
            db.execute("ALTER TABLE floor ADD PRIMARY KEY (id)")
        return
    import psycopg

    schema, _ = sink.table.split(".")
    with psycopg.connect(sink._dsn) as db:
        db.execute(f'CREATE TABLE "{schema}".floor (LIKE "{schema}".orders INCLUDING ALL)')
        db.execute(f'INSERT INTO "{schema}".floor SELECT * FROM "{schema}".orders')
    with psycopg.connect(sink._dsn, autocommit=True) as db:
        db.execute(f'ANALYZE "{schema}".floor, "{schema}".orders')


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    rows = TARGET_ROWS["quick" if sizes.transfer_rows < 1_000_000 else "full"]
    rounds = max(3, sizes.runs // 2)
    results: list[Row] = []
    figures: dict[str, Any] = {"target_rows": rows, "changed": CHANGED, "rounds": rounds}
    with _targets(rows) as targets:
        missing = _dlt_missing()
        if missing is not None:
            log(f"merge: dlt not measured ({missing})")
        else:
            figures["dlt"] = _dlt_version()
        for engine, (make_sink, floor, counts, dlt_target) in targets.items():
            source = WORK / "runs" / "merge" / f"source-{engine}.db"
            shutil.copy(_source(rows), source)
            store = WORK / "runs" / "merge" / f"checkpoints-{engine}.db"
            log(f"merge: first load of {rows:,} rows into {engine}")
            _run(store, source, make_sink(), "legacy")
            _floor_table(engine, make_sink())
            appended = make_sink(table="appended")
            _run(store, source, appended, "legacy", append=True)  # its first load, untimed
            dlt = not missing and bool(dlt_target)
            kinds = (*PATHS, "floor", "append", *(("dlt",) if dlt else ()))
            request = {
                **dlt_target,
                "source": f"sqlite:///{source}",
                "work": str(WORK / "runs" / "merge" / f"dlt-{engine}"),
            }
            if dlt:
                log(f"merge: dlt's first load of {rows:,} rows into {engine}")
                _dlt(request, source.parent)
            times: dict[str, list[float]] = {path: [] for path in kinds}
            statements: list[float] = []  # the floor's MERGE and commit alone
            round_ = 0
            for _ in range(rounds):
                for path in kinds:
                    round_ += 1
                    if path == "dlt":  # dlt catches up untimed: its timed run merges 1%
                        _dlt(request, source.parent)
                    elif path == "append":  # as dlt: its timed run appends one round's rows
                        _run(store, source, appended, "legacy", append=True)
                    after, upto = _change(source, rows, round_)
                    if path == "dlt":
                        done = _dlt(request, source.parent)
                        seconds = done["seconds"]
                        if done["rows"] != _live(source):
                            raise AssertionError(f"dlt merge on {engine}: {done['rows']} rows")
                        _run(store, source, make_sink(), "legacy")
                        floor(_changed_rows(source, after, upto))
                    elif path == "append":  # the merge route follows untimed
                        seconds = _run(store, source, appended, "legacy", append=True)
                        _run(store, source, make_sink(), "legacy")
                        floor(_changed_rows(source, after, upto))
                    elif path == "floor":  # the read of the changed rows included, as dpone's
                        seconds, statement = timed(
                            lambda by_hand=floor, window=(source, after, upto): by_hand(
                                _changed_rows(*window)
                            )
                        )
                        statements.append(statement)
                        # the floor saw only this round's rows: bring dpone's target along
                        _run(store, source, make_sink(), "legacy")
                    else:
                        seconds = _run(store, source, make_sink(), path)
                        floor(_changed_rows(source, after, upto))  # and the floor's along
                    times[path].append(seconds)
                    live = _live(source)
                    if counts() != (live, live):
                        raise AssertionError(f"merge on {engine}: {counts()} != {live} rows")
            base = median(times["floor"])
            figures[engine] = {path: median(values) for path, values in times.items()}
            own = "INSERT into a ReplacingMergeTree" if engine == "clickhouse" else "MERGE"
            results.append(Row("merge", f"{engine}: the engine's own {own} (floor)", base, "s"))
            statement = median(statements)
            figures[engine]["statement"] = statement
            results.append(
                Row("merge", f"{engine}: the floor's {own.split()[0]} statement alone (commit"
                    " included)", statement, "s", base, statement / base)
            )  # fmt: skip
            results.append(
                Row("merge", f"{engine}: dpone append of the rows (legacy)",
                    median(times["append"]), "s", base, median(times["append"]) / base)
            )  # fmt: skip
            judged = engine in FLOOR_JUDGED
            for path in PATHS:
                value = median(times[path])
                ratio = value / base if base else None
                met = None if ratio is None or not judged else ratio <= FLOOR_LIMIT
                results.append(
                    Row(
                        "merge",
                        f"{engine}: dpone {path}",
                        value,
                        "s",
                        base,
                        ratio,
                        f"<= {FLOOR_LIMIT}x floor" if judged else None,
                        met,
                    )  # fmt: skip
                )
            if not dlt:
                continue
            theirs = median(times["dlt"])
            if theirs * DLT_SHARE < statement:  # 3x faster than dlt: less than the statement
                results.append(
                    Row("merge", f"{engine}: a third of dlt's time vs the engine's statement"
                        " alone (below it: 3x is below the physical floor)", theirs * DLT_SHARE,
                        "s", statement, theirs * DLT_SHARE / statement)
                )  # fmt: skip
            results.append(
                Row("merge", f"{engine}: dlt {figures['dlt']} merge (delete-insert)", theirs,
                    "s", base, theirs / base)
            )  # fmt: skip
            for path in PATHS:
                share = median(times[path]) / theirs
                results.append(
                    Row("merge", f"{engine}: dpone {path} vs dlt", median(times[path]), "s",
                        theirs, share, f"<= {DLT_SHARE:.2f}x dlt", share <= DLT_SHARE)
                )  # fmt: skip
    if rows >= TARGET_ROWS["full"] and "duckdb" in ENGINES:
        results += _memory(figures)
    return results, figures


def _memory(figures: dict[str, Any]) -> list[Row]:
    """Peak RSS of a 1% merge into DuckDB at 1,000,000 and 10,000,000 target rows, dpone's
    and the floor's, each a fresh process (``_merge_memory_child``)."""
    from ._merge_memory_child import measure as peaks

    found = {}
    for rows in MEMORY_ROWS:
        log(f"merge: peak memory at {rows:,} target rows")
        found[rows] = peaks(rows, WORK / "runs" / "merge-memory")
    shutil.rmtree(WORK / "runs" / "merge-memory", ignore_errors=True)
    figures["memory"] = found
    small, large = (found[rows] for rows in MEMORY_ROWS)
    results = []
    for kind in ("merge", "floor"):
        low, high = small[kind]["peak_rss_kib"] / 1024, large[kind]["peak_rss_kib"] / 1024
        ratio, floor = high / low, kind == "floor"
        results.append(
            Row("merge", f"duckdb: peak RSS of {'the floor' if floor else 'dpone'}'s 1% merge,"
                " 10M vs 1M target rows", high, "MiB", low, ratio,
                None if floor else f"<= {FLAT_LIMIT}", None if floor else ratio <= FLAT_LIMIT)
        )  # fmt: skip
    above = [
        (p["merge"]["peak_rss_kib"] - p["floor"]["peak_rss_kib"]) / 1024 for p in found.values()
    ]
    results.append(
        Row("merge", "duckdb: dpone's peak RSS above the floor's, at 10M (1M)", above[1], "MiB",
            above[0])
    )  # fmt: skip
    return results
