"""Section 3: route scan scaling on the SQLite store.

The measured figure is what every run does before any resume decision:
``store.list_target_latest(route)`` (every latest checkpoint of the route's
target table, the superset a run scans) plus the guard's ``resume_route_scan``
over the result (the guard loaded through its entry point, as the runtime
loads it).

Stores are seeded directly with SQL in one transaction, using the store's own
schema and payload format (``checkpoint_to_payload`` JSON, as the store writes
it): the route has P partitions with ``history`` rows each (armed/committed
alternating; the latest is COMMITTED with a ``checkpoint_committed`` guard,
the steady state of a healthy route), and other routes hold
``other_rows`` history rows (100 routes, ``history`` rows per partition).
Each size is measured on a store with the other routes and on one without;
the two alternate (A B A B ...).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

from dpone_native_transfer import (
    PartitionCheckpoint,
    RouteKey,
    SQLiteCheckpointStore,
    checkpoint_to_payload,
)
from dpone_native_transfer.checkpoints import GUARD_DIAGNOSTICS_KEY, sha256_digest

from ._common import WORK, Row, Sizes, log, median, timed

SCAN_LIMIT_SECONDS = 0.3
FLAT_LIMIT = 1.2  # with other routes / without: equal up to the machine's noise
LINEAR_LIMIT = 1.5  # per-partition cost at the largest size / at the smallest
OTHER_ROUTES = 100

ROUTE = RouteKey("orders", "orders_copy", "incremental_append")


def load_guard():
    return importlib.metadata.entry_points(group="dpone_native_transfer")[
        "target_commit_guard"
    ].load()


def _template(phase: str) -> str:
    """The store's JSON text for one checkpoint, with @@ placeholders SQL fills in."""
    committed = phase == "checkpoint_committed"
    at = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    checkpoint = PartitionCheckpoint(
        partition_id="@@PID@@",
        route=RouteKey("@@SRC@@", "@@TGT@@", "incremental_append"),
        status="committed" if committed else "exported",
        run_id="bench-run-0001",
        query_hash=sha256_digest("query"),
        schema_hash=sha256_digest("schema"),
        partition_bounds={"partition": "@@PID@@"},
        started_at=at,
        completed_at=at if committed else None,
        rows_exported=10_000,
        diagnostics={
            GUARD_DIAGNOSTICS_KEY: {
                "schema_version": "dpone.native_transfer.target_commit_guard.v1",
                "checkpoint_batch_id": sha256_digest("batch"),
                "phase": phase,
                "recovery": "manual_reconciliation_required",
            }
        },
    )
    # the text SQLiteCheckpointStore writes for a payload (stores._codec._BatchEncoder)
    return json.dumps(checkpoint_to_payload(checkpoint), sort_keys=True, allow_nan=False)


def _insert_route(
    conn: sqlite3.Connection, source: str, target: str, partitions: int, history: int, base: int
) -> int:
    """``partitions * history`` history rows with seq ``base+1 ...``; returns the next base."""
    total = partitions * history
    if total == 0:
        return base
    conn.execute(
        "INSERT INTO checkpoint_history"
        " (seq, source_table, target_table, strategy, partition_id, payload)"
        " WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < :total - 1)"
        " SELECT :base + i + 1, :src, :tgt, 'incremental_append', printf('p-%024x', i / :h),"
        " replace(replace(replace("
        "   CASE WHEN i % :h % 2 = 1 OR i % :h = :h - 1 THEN :committed ELSE :armed END,"
        "   '@@PID@@', printf('p-%024x', i / :h)), '@@SRC@@', :src), '@@TGT@@', :tgt)"
        " FROM n",
        {
            "total": total,
            "base": base,
            "src": source,
            "tgt": target,
            "h": history,
            "committed": _template("checkpoint_committed"),
            "armed": _template("armed"),
        },
    )
    return base + total


def seeded_store(partitions: int, history: int, other_rows: int) -> Path:
    """A cached store file: the measured route plus ``other_rows`` history rows of other routes."""
    path = WORK / "stores" / f"scan-p{partitions}-h{history}-o{other_rows}.db"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    building = path.with_name(path.name + ".building")
    for leftover in (building, Path(f"{building}-wal"), Path(f"{building}-shm")):
        leftover.unlink(missing_ok=True)
    log(f"seeding store: {partitions:,} partitions x {history} + {other_rows:,} other-route rows")
    SQLiteCheckpointStore(building).close()  # the store's own schema
    conn = sqlite3.connect(building, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode=DELETE")
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("BEGIN")
        other_partitions = other_rows // (OTHER_ROUTES * history)
        base = 0
        for k in range(OTHER_ROUTES // 2):  # other routes sort before the measured one
            base = _insert_route(
                conn, f"archive_{k:03d}", f"archive_{k:03d}_copy", other_partitions, history, base
            )
        base = _insert_route(
            conn, ROUTE.source_table, ROUTE.target_table, partitions, history, base
        )
        for k in range(OTHER_ROUTES // 2, OTHER_ROUTES):  # ... and after it
            base = _insert_route(
                conn, f"sales_{k:03d}", f"sales_{k:03d}_copy", other_partitions, history, base
            )
        # the latest row of each partition is its last history row
        conn.execute(
            "INSERT INTO checkpoint_latest"
            " (source_table, target_table, strategy, partition_id, seq, payload)"
            " SELECT source_table, target_table, strategy, partition_id, seq, payload"
            " FROM checkpoint_history WHERE (seq - 1) % ? = ? - 1",
            (history, history),
        )
        conn.execute("COMMIT")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("ANALYZE")
    finally:
        conn.close()
    os.replace(building, path)
    return path


def _raw_read(path: Path) -> float:
    """Baseline: the same SQL the store runs, rows fetched, nothing decoded."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        seconds, rows = timed(
            lambda: conn.execute(
                "SELECT partition_id, seq, payload FROM checkpoint_latest"
                " WHERE source_table = ? AND target_table = ? AND strategy = ?"
                " ORDER BY partition_id",
                (ROUTE.source_table, ROUTE.target_table, str(ROUTE.strategy)),
            ).fetchall()
        )
    finally:
        conn.close()
    return seconds


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    guard = load_guard()
    history, others = sizes.scan_history, sizes.scan_other_rows
    rows: list[Row] = []
    raw: dict = {"history": history, "other_rows": others, "runs": sizes.runs, "sizes": {}}
    per_partition: dict[int, float] = {}
    for partitions in sizes.scan_partitions:
        paths = {
            "others": seeded_store(partitions, history, others),
            "alone": seeded_store(partitions, history, 0),
        }
        stores = {key: SQLiteCheckpointStore(path) for key, path in paths.items()}
        samples: dict[str, dict[str, list[float]]] = {
            key: {"list_latest": [], "scan": [], "total": [], "raw_sql": []} for key in stores
        }
        try:
            for store in stores.values():  # warm the page cache; not measured
                guard.resume_route_scan(route=ROUTE, checkpoints=store.list_target_latest(ROUTE))
            log(f"route scan: {partitions:,} partitions")
            for run in range(sizes.runs):
                order = ("others", "alone") if run % 2 == 0 else ("alone", "others")
                for key in order:
                    store = stores[key]
                    t_list, latest = timed(lambda store=store: store.list_target_latest(ROUTE))
                    if len(latest) != partitions:
                        raise AssertionError(f"the scan read {len(latest)} checkpoints")
                    t_scan, claimed = timed(
                        lambda latest=latest: guard.resume_route_scan(
                            route=ROUTE, checkpoints=latest
                        )
                    )
                    if claimed is not True:
                        raise AssertionError("the guard did not claim the route scan")
                    del latest
                    samples[key]["list_latest"].append(t_list)
                    samples[key]["scan"].append(t_scan)
                    samples[key]["total"].append(t_list + t_scan)
                    samples[key]["raw_sql"].append(_raw_read(paths[key]))
        finally:
            for store in stores.values():
                store.close()
        with_others = samples["others"]["total"]
        alone = samples["alone"]["total"]
        flat = median([a / b for a, b in zip(with_others, alone, strict=True)])
        total = median(with_others)
        per_partition[partitions] = total / partitions
        rows.append(
            Row(
                section="3 route scan",
                case=f"{partitions:,} partitions x {history}: with {others:,} other-route rows"
                " vs none",
                value=total,
                unit="s",
                baseline=median(alone),
                ratio=flat,
                target=f"flat <= {FLAT_LIMIT}",
                met=flat <= FLAT_LIMIT,
                extra={
                    "list_latest_s": median(samples["others"]["list_latest"]),
                    "guard_scan_s": median(samples["others"]["scan"]),
                },
            )
        )
        raw_sql = samples["others"]["raw_sql"]
        list_s, scan_s = median(samples["others"]["list_latest"]), median(samples["others"]["scan"])
        rows.append(
            Row(
                section="3 route scan",
                case=f"{partitions:,} partitions: list_target_latest {list_s:.3f} s"
                f" + guard scan {scan_s:.3f} s vs raw SQL read",
                value=total,
                unit="s",
                baseline=median(raw_sql),
                ratio=median([a / b for a, b in zip(with_others, raw_sql, strict=True)]),
            )
        )
        raw["sizes"][str(partitions)] = samples
    largest, smallest = max(sizes.scan_partitions), min(sizes.scan_partitions)
    largest_total = per_partition[largest] * largest
    rows.append(
        Row(
            section="3 route scan",
            case=f"{largest:,} partitions: list_target_latest + guard scan (absolute)",
            value=largest_total,
            unit="s",
            target=f"<= {SCAN_LIMIT_SECONDS} s",
            met=largest_total <= SCAN_LIMIT_SECONDS,
        )
    )
    linear = per_partition[largest] / per_partition[smallest]
    rows.append(
        Row(
            section="3 route scan",
            case=f"linearity: time per partition at {largest:,} vs at {smallest:,}",
            value=per_partition[largest],
            unit="s",
            baseline=per_partition[smallest],
            ratio=linear,
            target=f"<= {LINEAR_LIMIT}",
            met=linear <= LINEAR_LIMIT,
        )
    )
    return rows, raw
