"""Section 6: partitions that fit the table (issue 14.6).

The same rows are transferred twice per round, alternating: partitioned by a
column of 100 values (the baseline), and cut into ranges of a key with
``partition_keys`` distinct values (``partition_by = "range"``, default
``partition_rows``). The ranges must run within 1.5x of the baseline, and the
checkpoint store they leave must stay under 5% of the source file's size.
Partitioning that key by value (one partition per key) is not timed: it is
the case the ranges replace (270 s for 210,000 keys when it was found).
"""

from __future__ import annotations

from pathlib import Path

from dpone_native_transfer import SQLiteCheckpointStore, SQLiteSink, TransferRuntime, TransferSpec
from dpone_native_transfer.connectors.sqlite import SQLiteSource

from ._common import CHUNK_ROWS, TARGET_TABLE, Row, Sizes, cached_source, median, scratch, timed

TABLE = "events"
TIME_LIMIT = 1.5
STORE_LIMIT_PERCENT = 5.0


def _source(rows: int, keys: int) -> Path:
    """A cached source ``events(id, account, region, amount)``: ``account`` has ``keys``
    distinct values in id order and is indexed; ``region`` has 100."""
    return cached_source(
        f"events-{rows}-{keys}",
        [
            f"CREATE TABLE {TABLE} (id INTEGER PRIMARY KEY, account INTEGER NOT NULL,"
            " region TEXT NOT NULL, amount REAL)",
            f"INSERT INTO {TABLE} WITH RECURSIVE n(i) AS"
            f" (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})"
            f" SELECT i, (i - 1) * {keys} / {rows}, printf('region-%03d', (i - 1) * 100 / {rows}),"
            " round(i * 1.25, 2) FROM n",
            f"CREATE INDEX {TABLE}_by_account ON {TABLE} (account)",
            f"CREATE INDEX {TABLE}_by_region ON {TABLE} (region)",
        ],
    )


def _run(source: Path, column: str, partition_rows: int | None, rows: int) -> tuple[float, float]:
    """One staged transfer on fresh files: (seconds, checkpoint store bytes)."""
    with scratch(f"partitioning-{column}") as folder:
        store = SQLiteCheckpointStore(folder / "checkpoints.db")
        try:
            spec = TransferSpec(
                source=SQLiteSource(source, TABLE, column, partition_rows=partition_rows),
                sink=SQLiteSink(folder / "target.db", TARGET_TABLE),
                strategy="full_refresh",
                path="staged",
                run_id="bench-run",
                chunk_rows=CHUNK_ROWS,
            )
            seconds, result = timed(lambda: TransferRuntime(store).run(spec))
        finally:
            store.close()
        if result.rows_loaded != rows:
            raise AssertionError(f"{column}: loaded {result.rows_loaded} rows, expected {rows}")
        size = sum(p.stat().st_size for p in folder.glob("checkpoints.db*"))
        return seconds, size


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    rows, keys = sizes.partition_table_rows, sizes.partition_keys
    source = _source(rows, keys)
    by_value, by_range, store_sizes = [], [], []
    for _ in range(sizes.runs):
        by_value.append(_run(source, "region", None, rows)[0])
        seconds, size = _run(source, "account", 100_000, rows)
        by_range.append(seconds)
        store_sizes.append(size)
    baseline, value = median(by_value), median(by_range)
    percent = 100 * median(store_sizes) / source.stat().st_size
    case = f"{rows:,} rows: ranges of a {keys:,}-key column vs 100 values (staged)"
    return [
        Row(
            "6 partitioning",
            case,
            value,
            "s",
            baseline,
            value / baseline,
            f"<= {TIME_LIMIT}x",
            value / baseline <= TIME_LIMIT,
        ),  # fmt: skip
        Row(
            "6 partitioning",
            "checkpoint store / source size",
            percent,
            "%",
            None,
            None,
            f"<= {STORE_LIMIT_PERCENT:g}%",
            percent <= STORE_LIMIT_PERCENT,
        ),  # fmt: skip
    ], {
        "runs": sizes.runs,
        "by_value_s": by_value,
        "by_range_s": by_range,
        "store_bytes": store_sizes,
        "source_bytes": source.stat().st_size,
    }
