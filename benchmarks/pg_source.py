"""Section 2c: a PostgreSQL source, and the plan ``PostgresSource`` picks from ``EXPLAIN``.

Two tables of the same rows on a throwaway server (``tests/helpers/postgres_server.py``,
as section 4 starts it): ``spread``, whose 100 partition values are spread over
the table with no index, and ``clustered``, whose rows are clustered by an indexed
partition column. Each is copied into SQLite by the legacy path, guarded, three
ways per round: with the plan the source picks (``read_partitions`` asks the
server's planner whether one scan costs less than the partitions' own reads),
forced to read each partition on its own, and forced to take the one scan. The
picked plan should cost no more than the other: the row says which one it was.
A third case reads ``spread`` in 100 key ranges of its unindexed ``updated_at``
(``partition_rows``): the one scan routes them with ``width_bucket``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from dpone_native_transfer import SQLiteCheckpointStore, SQLiteSink, TransferRuntime, TransferSpec
from dpone_native_transfer.connectors import postgres
from dpone_native_transfer.connectors.postgres import PostgresSource

from ._common import CHUNK_ROWS, Row, Sizes, log, median, scratch, timed
from .batch import _import_server_helper

CHOICE_LIMIT = 1.1  # the picked plan against the other one
RANGES = 100  # key ranges of the "ranges" case
# case: (table, description, partition column, key ranges or None for values)
CASES: dict[str, tuple[str, str, str, int | None]] = {
    "spread": ("spread", "unindexed, values spread over the table", "region", None),
    "clustered": ("clustered", "indexed, rows clustered by partition", "region", None),
    "ranges": ("spread", f"{RANGES} ranges of an unindexed key", "updated_at", RANGES),
}


def _build(dsn: str, schema: str, rows: int, partitions: int, psycopg: Any) -> None:
    per_partition = -(-rows // partitions)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        for table, region in (
            ("spread", f"i % {partitions}"),
            ("clustered", f"(i - 1) / {per_partition}"),
        ):
            conn.execute(
                f'CREATE TABLE "{schema}".{table} (id bigint PRIMARY KEY, region text NOT NULL,'
                " amount double precision, updated_at bigint)"
            )
            conn.execute(
                f"INSERT INTO \"{schema}\".{table} SELECT i, format('region-%s',"
                f" lpad(({region})::text, 4, '0')), round(i * 1.25, 2), 1000000 + i"
                f" FROM generate_series(1, {rows}) AS i"
            )
        conn.execute(f'CREATE INDEX ON "{schema}".clustered (region)')
        conn.execute(f'ANALYZE "{schema}".spread')
        conn.execute(f'ANALYZE "{schema}".clustered')


@contextlib.contextmanager
def _forced(plan: str) -> Iterator[None]:
    """``picked``: as shipped; ``reads``: never one scan; ``scan``: always one scan."""
    real_read, real_cost = PostgresSource.read_partitions, postgres._cost
    if plan == "reads":
        PostgresSource.read_partitions = lambda self, bounds, **kwargs: None  # type: ignore[method-assign]
    elif plan == "scan":
        postgres._cost = lambda conn, sql, params: (
            0.0 if " CASE " in sql or "width_bucket(" in sql else 1.0
        )
    try:
        yield
    finally:
        PostgresSource.read_partitions = real_read  # type: ignore[method-assign]
        postgres._cost = real_cost


def _source(dsn: str, table: str, column: str, ranges: int | None, rows: int) -> PostgresSource:
    rows_per_range = None if ranges is None else -(-rows // ranges)
    return PostgresSource(dsn, table, column, partition_rows=rows_per_range)


def _picked_scan(source: PostgresSource) -> bool:
    """Whether the source, as shipped, takes the one scan for this table's partitions."""
    if source.partition_rows is None:
        bounds = [{"partition": value} for value in source.partition_values()]
    else:
        bounds = source.partition_ranges()
    scan = source.read_partitions(bounds, chunk_rows=CHUNK_ROWS)
    if scan is None:
        return False
    scan.close()  # type: ignore[attr-defined]  # a generator: nothing was read
    return True


def _transfer(dsn: str, case: str, table: str, rows: int, plan: str) -> float:
    with scratch(f"pg-source-{plan}") as folder, _forced(plan):
        store = SQLiteCheckpointStore(folder / "checkpoints.db")
        try:
            spec = TransferSpec(
                source=_source(dsn, table, *CASES[case][2:], rows),
                sink=SQLiteSink(folder / "target.db", "orders"),
                strategy="incremental_append",
                path="legacy",
                run_id="bench-run",
                chunk_rows=CHUNK_ROWS,
            )
            seconds, result = timed(lambda: TransferRuntime(store).run(spec))
        finally:
            store.close()
    if result.rows_loaded != rows:
        raise AssertionError(f"{case} ({plan}): loaded {result.rows_loaded}, expected {rows}")
    return seconds


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    imported = _import_server_helper()
    if isinstance(imported, str):
        print(f"section 2c skipped: {imported}", flush=True)
        return [], {"skipped": imported}
    helper, psycopg = imported
    rows, partitions = sizes.transfer_rows, sizes.transfer_partitions
    raw: dict[str, Any] = {"rows": rows, "partitions": partitions}
    results: list[Row] = []
    with helper.server_dsn() as dsn, helper.isolated_schema(dsn) as location:
        _build(dsn, location.schema, rows, partitions, psycopg)
        url = helper.postgres_url(dsn)
        for case, (table, label, column, ranges) in CASES.items():
            name = f"{location.schema}.{table}"
            picked_scan = _picked_scan(_source(url, name, column, ranges, rows))
            other = "reads" if picked_scan else "scan"
            cases: dict[str, Callable[[], float]] = {
                plan: (
                    lambda plan=plan, case=case, name=name: _transfer(url, case, name, rows, plan)
                )
                for plan in ("picked", other)
            }
            times: dict[str, list[float]] = {plan: [] for plan in cases}
            for round_number in range(sizes.runs + 1):  # round 0 warms the caches
                order = list(cases) if round_number % 2 else list(cases)[::-1]
                for plan in order:
                    seconds = cases[plan]()
                    if round_number:
                        times[plan].append(seconds)
                log(f"postgres source {case}: round {round_number} of {sizes.runs} done")
            ratio = median([a / b for a, b in zip(times["picked"], times[other], strict=True)])
            picked = "one scan" if picked_scan else "a read per partition"
            results.append(
                Row("2c PostgreSQL source",
                    f"{case} ({label}): picked {picked} vs forced"
                    f" {'reads per partition' if other == 'reads' else 'one scan'}"
                    f" ({rows:,} rows / {ranges or partitions} partitions, legacy into SQLite)",
                    median(times["picked"]), "s", median(times[other]), ratio,
                    f"<= {CHOICE_LIMIT}", ratio <= CHOICE_LIMIT,
                    extra={"picked_one_scan": picked_scan})
            )  # fmt: skip
            raw[case] = {"picked_one_scan": picked_scan, "seconds": times}
    return results, raw
