"""Section 8: many partitions: the same unindexed rows in 10 times as many partitions.

``unindexed_source_db`` of 1,000,000 rows in 1,000 partitions against the same rows in 100,
each path into SQLite, DuckDB and chDB (a guarded full refresh into fresh files), the two
taking turns in each round. Until fix 52 a plan of more than 256 partitions (SQLite's
file-artifact: 500) was declined by every engine's pull and read a partition at a time, a
scan of the table each: 19-60 s instead of 1-5 s. The issue sets no target here: a ratio
near 1 says the partitions are still read in one pass; what grows with them is the
checkpoints, and file-artifact's one file per partition.
"""

from __future__ import annotations

from collections.abc import Callable

from ._common import PATHS, Row, Sizes, median, unindexed_source_db
from .peers import engine_transfer, rounds

ENGINES = {"sqlite": "SQLite", "duckdb": "DuckDB", "chdb": "chDB"}
RUNS = 5  # every figure is a median of at least 5; 24 transfers of 1-5 s a round
FACTOR = 10  # the many-partition source has this many times the partitions


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    total, few = sizes.transfer_rows, sizes.transfer_partitions
    many = few * FACTOR
    sources = {count: unindexed_source_db(total, count) for count in (few, many)}
    cases: dict[str, Callable[[], float]] = {
        f"{engine} {path} {count}": (
            lambda engine=engine, path=path, count=count: engine_transfer(
                sources[count], engine, path, total
            )
        )
        for engine in ENGINES
        for path in PATHS
        for count in (many, few)
    }
    times = rounds(cases, min(sizes.runs, RUNS), label="many partitions")
    rows = paired_rows(
        "8 many partitions",
        times,
        (many, few),
        lambda path, name: (
            f"{path} into {name}: {many:,} vs {few} partitions ({total:,} unindexed rows)"
        ),
    )
    return rows, {"rows": total, "partitions": [few, many], "seconds": times}


def paired_rows(
    section: str,
    times: dict[str, list[float]],
    pair: tuple[object, object],
    case: Callable[[str, str], str],
) -> list[Row]:
    """A row per path and engine: cases ``"{engine} {path} {pair[0]}"`` against the same
    with ``pair[1]``, the ratio the median of the rounds' ratios."""
    rows = []
    for engine, name in ENGINES.items():
        for path in PATHS:
            mine = times[f"{engine} {path} {pair[0]}"]
            base = times[f"{engine} {path} {pair[1]}"]
            ratio = median([a / b for a, b in zip(mine, base, strict=True)])
            rows.append(Row(section, case(path, name), median(mine), "s", median(base), ratio))
    return rows
