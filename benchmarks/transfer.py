"""Sections 1 and 2: guard overhead and runtime overhead of one SQLite-to-SQLite transfer.

One round runs, for every path, the guarded transfer (the default:
``plugins=None`` loads the guard from its entry point) and the same transfer
with ``plugins=[]``; and, once per round, the two bare copies. Lazy-plan's
block (its two bare ``ATTACH`` copies, then its pair) repeats within a round
(``PAIRS_PER_ROUND``). Rounds repeat, so every case alternates with its
baseline (A B A B ...). One extra round before the measured ones warms the OS
page cache and is discarded.

Every transfer gets a fresh target and a fresh checkpoint store. The timed
region is ``TransferRuntime.run(spec)`` (the bare copies: connect to commit);
building the runtime (plugin loading) and the store file are outside it.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from dpone_native_transfer import (
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.events import Event, EventName

from ._common import (
    CHUNK_ROWS,
    PARTITION_COLUMN,
    PATHS,
    SOURCE_TABLE,
    TARGET_TABLE,
    Row,
    Sizes,
    log,
    median,
    scratch,
    source_db,
    timed,
)

GUARD_LIMIT = 1.05
# lazy-plan moves no rows through Python: its transfer takes a tenth of the others', and
# one fsync's jitter is several percent of it. Its pair (and its baselines) repeat within
# each round, so its figures rest on about as much measuring time as the other paths'.
PAIRS_PER_ROUND = {"lazy-plan": 5}
RUNTIME_LIMITS = {"legacy": 1.5, "staged": 1.5, "file-artifact": 1.5, "lazy-plan": 1.2}


def run_transfer(source: Path, path: str, *, guarded: bool, rows: int) -> tuple[float, float]:
    """One transfer on fresh files: (seconds, seconds spent in the checkpoint hooks).

    The hook time is read from the runtime's events: the route scan (run start to
    ``route_scanned``), the before-target hook (``pre_target_done`` to
    ``target_started``) and the success hook (``target_succeeded`` to
    ``checkpoints_committed``). Guarded minus unguarded hook time is the guard's own
    work, measured without the noise of the row copy around it.
    """
    marks: dict[str, float] = {}

    def listener(event: Event) -> None:
        marks.setdefault(event.name, time.perf_counter())

    with scratch(f"transfer-{path}") as folder:
        store = SQLiteCheckpointStore(folder / "checkpoints.db")
        try:
            runtime = TransferRuntime(store, plugins=None if guarded else [], events=listener)
            spec = TransferSpec(
                source=SQLiteSource(source, SOURCE_TABLE, PARTITION_COLUMN),
                sink=SQLiteSink(folder / "target.db", TARGET_TABLE),
                strategy="incremental_append",
                path=path,
                run_id="bench-run",
                chunk_rows=CHUNK_ROWS,
            )
            start = time.perf_counter()
            seconds, result = timed(lambda: runtime.run(spec))
        finally:
            store.close()
        if result.rows_loaded != rows:
            raise AssertionError(f"{path}: loaded {result.rows_loaded} rows, expected {rows}")
        hooks = (
            (marks[EventName.ROUTE_SCANNED] - start)
            + (marks[EventName.TARGET_STARTED] - marks[EventName.PRE_TARGET_DONE])
            + (marks[EventName.CHECKPOINTS_COMMITTED] - marks[EventName.TARGET_SUCCEEDED])
        )
        return seconds, hooks


def _read_only(path: Path) -> str:
    return path.resolve().as_uri() + "?mode=ro"


def _target_ddl(source: sqlite3.Connection) -> tuple[str, str]:
    """The target table as SQLiteSink creates it (declared types only), and the column list."""
    columns = source.execute(
        "SELECT name, type FROM pragma_table_info(?, 'main')", (SOURCE_TABLE,)
    ).fetchall()
    names = ", ".join(f'"{name}"' for name, _ in columns)
    definitions = ", ".join(f'"{name}" {decltype}' for name, decltype in columns)
    return f'CREATE TABLE IF NOT EXISTS "{TARGET_TABLE}" ({definitions})', names


def _partitions(conn: sqlite3.Connection, schema: str = "main") -> list:
    """The partition values, as SQLiteSource.partition_values reads them."""
    return [
        row[0]
        for row in conn.execute(
            f'SELECT DISTINCT "{PARTITION_COLUMN}" FROM {schema}."{SOURCE_TABLE}"'
            f' ORDER BY "{PARTITION_COLUMN}" IS NOT NULL, "{PARTITION_COLUMN}"'
        )
    ]


def _selects(names: str, schema: str, partitioned: bool, conn: sqlite3.Connection):
    """The extraction queries: the whole table, or one per partition as SQLiteSource runs them."""
    table = f'{schema}."{SOURCE_TABLE}"'
    if not partitioned:
        return [(f"SELECT {names} FROM {table} ORDER BY rowid", ())]
    qualified = ", ".join(f'"{SOURCE_TABLE}".{name}' for name in names.split(", "))
    return [
        (
            f'SELECT {qualified} FROM {table} WHERE "{SOURCE_TABLE}"."{PARTITION_COLUMN}" = ?'
            " ORDER BY rowid",
            (value,),
        )
        for value in _partitions(conn, schema)
    ]


def bare_copy(source: Path, *, rows: int, partitioned: bool = False) -> float:
    """stdlib sqlite3 only: chunked fetch + executemany, one target transaction, no checkpoints.

    ``partitioned`` reads partition by partition with the source connector's queries
    (a diagnostic baseline: it separates partitioned extraction from runtime overhead).
    """
    with scratch("bare-copy") as folder:

        def copy() -> int:
            src = sqlite3.connect(_read_only(source), uri=True)
            dst = sqlite3.connect(folder / "target.db", isolation_level=None)
            try:
                ddl, names = _target_ddl(src)
                dst.execute("PRAGMA synchronous=FULL")  # as SQLiteSink
                dst.execute("BEGIN IMMEDIATE")
                dst.execute(ddl)
                insert = f'INSERT INTO "{TARGET_TABLE}" ({names}) VALUES (?, ?, ?, ?)'
                copied = 0
                for sql, params in _selects(names, "main", partitioned, src):
                    cursor = src.execute(sql, params)
                    while chunk := cursor.fetchmany(CHUNK_ROWS):
                        copied += dst.executemany(insert, chunk).rowcount
                dst.execute("COMMIT")
                return copied
            finally:
                src.close()
                dst.close()

        seconds, copied = timed(copy)
    if copied != rows:
        raise AssertionError(f"bare copy: {copied} rows, expected {rows}")
    return seconds


def bare_attach(source: Path, *, rows: int, partitioned: bool = False) -> float:
    """stdlib sqlite3 only: one ATTACH + one INSERT ... SELECT, one transaction, no checkpoints.

    ``partitioned``: one INSERT ... SELECT per partition, as SQLiteSink runs a LoadPlan
    (a diagnostic baseline, see ``bare_copy``).
    """
    with scratch("bare-attach") as folder:

        def copy() -> int:
            target = (folder / "target.db").resolve().as_uri()
            dst = sqlite3.connect(target, uri=True, isolation_level=None)
            try:
                dst.execute("PRAGMA synchronous=FULL")  # as SQLiteSink
                dst.execute("ATTACH DATABASE ? AS src", (_read_only(source),))
                src_columns = sqlite3.connect(_read_only(source), uri=True)
                try:
                    ddl, names = _target_ddl(src_columns)
                finally:
                    src_columns.close()
                dst.execute("BEGIN IMMEDIATE")
                dst.execute(ddl)
                copied = 0
                for sql, params in _selects(names, "src", partitioned, dst):
                    copied += dst.execute(
                        f'INSERT INTO "{TARGET_TABLE}" ({names}) {sql}', params
                    ).rowcount
                dst.execute("COMMIT")
                return copied
            finally:
                dst.close()

        seconds, copied = timed(copy)
    if copied != rows:
        raise AssertionError(f"bare attach: {copied} rows, expected {rows}")
    return seconds


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    rows = sizes.transfer_rows
    source = source_db(rows, sizes.transfer_partitions)
    times: dict[str, list[float]] = {
        "bare-copy": [],
        "bare-attach": [],
        "bare-copy-partitioned": [],
        "bare-attach-partitioned": [],
    }
    for path in PATHS:
        for variant in ("guarded", "unguarded"):
            times[f"{path}/{variant}"] = []
            times[f"{path}/{variant}/hooks"] = []
    runs = sizes.transfer_runs
    for round_no in range(runs + 1):  # round 0 warms the caches and is discarded
        log(f"transfers: round {round_no}/{runs}" + (" (warm-up)" if not round_no else ""))
        sample: dict[str, list[float]] = {key: [] for key in times}
        sample["bare-copy"].append(bare_copy(source, rows=rows))
        sample["bare-copy-partitioned"].append(bare_copy(source, rows=rows, partitioned=True))
        for path in PATHS:
            for repeat in range(PAIRS_PER_ROUND.get(path, 1)):
                if path == "lazy-plan":
                    sample["bare-attach"].append(bare_attach(source, rows=rows))
                    sample["bare-attach-partitioned"].append(
                        bare_attach(source, rows=rows, partitioned=True)
                    )
                # alternate which of the pair goes first, so neither always runs on a warmer cache
                order = (True, False) if (round_no + repeat) % 2 else (False, True)
                for guarded in order:
                    key = f"{path}/{'guarded' if guarded else 'unguarded'}"
                    seconds, hooks = run_transfer(source, path, guarded=guarded, rows=rows)
                    sample[key].append(seconds)
                    sample[f"{key}/hooks"].append(hooks)
        if round_no:
            for key, seconds in sample.items():
                times[key].extend(seconds)

    label = f"{rows:,} rows / {sizes.transfer_partitions} partitions"
    guard_rows: list[Row] = []
    runtime_rows: list[Row] = []
    for path in PATHS:
        guarded, unguarded = times[f"{path}/guarded"], times[f"{path}/unguarded"]
        ratio = median([g / u for g, u in zip(guarded, unguarded, strict=True)])
        guard_rows.append(
            Row(
                section="1 guard overhead",
                case=f"{path}: guarded vs plugins=[] ({label})",
                value=median(guarded),
                unit="s",
                baseline=median(unguarded),
                ratio=ratio,
                target=f"<= {GUARD_LIMIT}",
                met=ratio <= GUARD_LIMIT,
            )
        )
        hooks_guarded = median(times[f"{path}/guarded/hooks"])
        hooks_unguarded = median(times[f"{path}/unguarded/hooks"])
        guard_rows.append(
            Row(
                section="1 guard overhead",
                case=f"{path}: time in checkpoint hooks, guarded vs plugins=[] (diagnostic:"
                " 1 + extra hook time / transfer)",
                value=hooks_guarded,
                unit="s",
                baseline=hooks_unguarded,
                ratio=1 + (hooks_guarded - hooks_unguarded) / median(unguarded),
            )
        )
        bare_key = "bare-attach" if path == "lazy-plan" else "bare-copy"
        bare = times[bare_key]
        ratio = median([g / b for g, b in zip(guarded, bare, strict=True)])
        limit = RUNTIME_LIMITS[path]
        runtime_rows.append(
            Row(
                section="2 runtime overhead",
                case=f"{path} (guarded) vs {bare_key} ({label})",
                value=median(guarded),
                unit="s",
                baseline=median(bare),
                ratio=ratio,
                target=f"<= {limit}",
                met=ratio <= limit,
            )
        )
    for path in PATHS:
        bare_key = ("bare-attach" if path == "lazy-plan" else "bare-copy") + "-partitioned"
        guarded, bare = times[f"{path}/guarded"], times[bare_key]
        runtime_rows.append(
            Row(
                section="2 runtime overhead",
                case=f"{path} (guarded) vs {bare_key} (diagnostic: same per-partition queries)",
                value=median(guarded),
                unit="s",
                baseline=median(bare),
                ratio=median([g / b for g, b in zip(guarded, bare, strict=True)]),
            )
        )
    raw = {
        "rows": rows,
        "partitions": sizes.transfer_partitions,
        "chunk_rows": CHUNK_ROWS,
        "runs": runs,
        "pairs_per_round": PAIRS_PER_ROUND,
        "seconds": times,
    }
    return guard_rows + runtime_rows, raw
