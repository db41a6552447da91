"""Section 9: key ranges of an unindexed key, against value partitions of the same rows.

``unindexed_key_source_db`` of 1,000,000 rows: the first append over 1,000 key ranges of
``k`` (no index; ``updated_at`` is the cursor), against a full refresh of the same rows in
100 partitions of ``region`` (no index either), each path into SQLite, DuckDB and chDB,
taking turns in each round. Until fix 54 each range was read with a statement of its own
(a scan each), around an engine's read and in SQLite's pulls: 20-30 s for 200,000 rows.
The issue sets no target here: a ratio near 1 says the ranges are read in one pass; an
append also reads the rows at the cursor's top twice around an engine's read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dpone_native_transfer import SQLiteSource

from ._common import PATHS, SOURCE_TABLE, Row, Sizes, unindexed_key_source_db
from .many import ENGINES, RUNS, paired_rows
from .peers import engine_transfer, rounds

RANGES = 1000


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    total = sizes.transfer_rows
    source = unindexed_key_source_db(total)

    def ranges(path: Path) -> SQLiteSource:
        return SQLiteSource(path, SOURCE_TABLE, "k", "updated_at", partition_rows=total // RANGES)

    cases: dict[str, Callable[[], float]] = {}
    for engine in ENGINES:
        for path in PATHS:
            cases[f"{engine} {path} ranges"] = lambda engine=engine, path=path: engine_transfer(
                source, engine, path, total, read=ranges, strategy="incremental_append"
            )
            cases[f"{engine} {path} values"] = lambda engine=engine, path=path: engine_transfer(
                source, engine, path, total
            )
    times = rounds(cases, min(sizes.runs, RUNS), label="key ranges")
    rows = paired_rows(
        "9 unindexed key ranges",
        times,
        ("ranges", "values"),
        lambda path, name: (
            f"{path} into {name}: first append in {RANGES:,} key ranges vs a"
            f" full refresh in 100 partitions ({total:,} unindexed rows)"
        ),
    )
    return rows, {"rows": total, "ranges": RANGES, "seconds": times}
