"""Section 4: arm + commit of N partitions on the SQLite store, through the real boundary.

One measurement builds N exported candidates, a fresh store and a
``TargetMutation``, and times ``TargetBoundary.run(mutation, target)`` with a
target call that does nothing: the guard's ``before_target_mutation`` (arm:
one ``upsert_many`` of N EXPORTED/armed checkpoints) and
``after_target_success`` (commit: one ``upsert_many`` of N
COMMITTED/checkpoint_committed checkpoints), loaded from the entry point as
the runtime loads it.

Baseline: the same two batches written with raw SQL (the store's two
statements per checkpoint, payload JSON prepared beforehand, one transaction
per batch): the floor any store code can reach on this machine.

Transactions are counted with a ``sqlite3`` trace callback on the store's
connection (COMMIT statements). The store runs WAL with ``synchronous=FULL``,
so each COMMIT is one fsync of the WAL, plus one WAL checkpoint (fsync of the
WAL and the database) each time the WAL passes 1000 pages.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

from dpone_native_transfer import (
    PartitionCheckpoint,
    RouteKey,
    SQLiteCheckpointStore,
    TargetMutation,
    checkpoint_to_payload,
)
from dpone_native_transfer.boundary import TargetBoundary
from dpone_native_transfer.checkpoints import GUARD_DIAGNOSTICS_KEY, sha256_digest
from dpone_native_transfer.events import EventRecorder
from dpone_native_transfer.plugins import Hooks, make_plugin_manager

from ._common import Row, Sizes, log, median, scratch, timed

BATCH_LIMIT_SECONDS = 1.0
ROUTE = RouteKey("orders", "orders_copy", "incremental_append")
_AT = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def candidates(count: int) -> tuple[PartitionCheckpoint, ...]:
    query_hash, schema_hash = sha256_digest("query"), sha256_digest("schema")
    return tuple(
        PartitionCheckpoint(
            partition_id=f"p-{index:024x}",
            route=ROUTE,
            status="exported",
            run_id="bench-run",
            query_hash=query_hash,
            schema_hash=schema_hash,
            partition_bounds={"partition": f"region-{index:06d}"},
            rows_exported=10_000,
        )
        for index in range(count)
    )


def _count_commits(store: SQLiteCheckpointStore) -> list[str]:
    # the store keeps its one connection private; tracing it is the only way to count
    # transactions without changing the store (strace is not available here)
    statements: list[str] = []
    store._connection().set_trace_callback(statements.append)
    return statements


def arm_commit(items: tuple[PartitionCheckpoint, ...], *, guarded: bool) -> tuple[float, int]:
    """Time one boundary run (arm + target no-op + commit); return (seconds, COMMIT count)."""
    with scratch("batch") as folder:
        store = SQLiteCheckpointStore(folder / "checkpoints.db")
        try:
            recorder = EventRecorder()
            boundary = TargetBoundary(Hooks(make_plugin_manager(None if guarded else [])), recorder)
            mutation = TargetMutation(
                route=ROUTE,
                run_id="bench-run",
                path="lazy-plan",
                operation="load",
                candidates=items,
                store=store,
                clock=lambda: datetime.now(UTC),
            )
            statements = _count_commits(store)
            seconds, _ = timed(lambda: boundary.run(mutation, lambda: len(items)))
            store._connection().set_trace_callback(None)
            if len(mutation.state.committed_ids) != len(items):
                raise AssertionError("not every partition was committed")
            if guarded and not mutation.state.armed:
                raise AssertionError("the guard did not arm")
            latest = store.list_latest(ROUTE)
            if len(latest) != len(items) or any(cp.status != "committed" for cp in latest):
                raise AssertionError("the store does not hold every partition as committed")
        finally:
            store.close()
    commits = sum(1 for sql in statements if sql.strip().upper().startswith("COMMIT"))
    return seconds, commits


def raw_sql(items: tuple[PartitionCheckpoint, ...]) -> float:
    """The same two batches as raw SQL with payloads prepared outside the timed region."""
    batches = []
    for status, phase, completed in (
        ("exported", "armed", None),
        ("committed", "checkpoint_committed", _AT),
    ):
        rows = []
        for cp in items:
            payload = checkpoint_to_payload(cp)
            payload.update(
                status=status,
                started_at=_AT.isoformat(),
                completed_at=completed.isoformat() if completed else None,
            )
            payload["diagnostics"][GUARD_DIAGNOSTICS_KEY] = {
                "schema_version": "dpone.native_transfer.target_commit_guard.v1",
                "checkpoint_batch_id": sha256_digest("batch"),
                "phase": phase,
                "recovery": "manual_reconciliation_required",
            }
            rows.append(
                (
                    "orders",
                    "orders_copy",
                    "incremental_append",
                    cp.partition_id,
                    json.dumps(payload, sort_keys=True),
                )
            )
        batches.append(rows)
    with scratch("batch-raw") as folder:
        path = folder / "checkpoints.db"
        SQLiteCheckpointStore(path).close()
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")

        def write() -> None:
            for rows in batches:
                conn.execute("BEGIN IMMEDIATE")
                for row in rows:
                    seq = conn.execute(
                        "INSERT INTO checkpoint_history"
                        " (source_table, target_table, strategy, partition_id, payload)"
                        " VALUES (?, ?, ?, ?, ?)",
                        row,
                    ).lastrowid
                    conn.execute(
                        "INSERT INTO checkpoint_latest"
                        " (source_table, target_table, strategy, partition_id, seq, payload)"
                        " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT"
                        " (source_table, target_table, strategy, partition_id)"
                        " DO UPDATE SET seq = excluded.seq, payload = excluded.payload",
                        (*row[:4], seq, row[4]),
                    )
                conn.execute("COMMIT")

        try:
            seconds, _ = timed(write)
        finally:
            conn.close()
    return seconds


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    rows: list[Row] = []
    raw: dict = {"runs": sizes.runs, "sizes": {}}
    largest = max(sizes.batch_partitions)
    for count in sizes.batch_partitions:
        log(f"batch writes: {count:,} partitions")
        items = candidates(count)
        samples: dict[str, list[float]] = {"guarded": [], "unguarded": [], "raw_sql": []}
        commits: dict[str, int] = {}
        arm_commit(items, guarded=True)  # warm-up, discarded
        for _ in range(sizes.runs):
            seconds, commits["guarded"] = arm_commit(items, guarded=True)
            samples["guarded"].append(seconds)
            samples["raw_sql"].append(raw_sql(items))
            seconds, commits["unguarded"] = arm_commit(items, guarded=False)
            samples["unguarded"].append(seconds)
        guarded = median(samples["guarded"])
        is_target = count == largest
        rows.append(
            Row(
                section="4 batch writes",
                case=f"{count:,} partitions: guard arm + commit ({commits['guarded']}"
                " transactions) vs raw SQL (2)",
                value=guarded,
                unit="s",
                baseline=median(samples["raw_sql"]),
                ratio=median(
                    [g / b for g, b in zip(samples["guarded"], samples["raw_sql"], strict=True)]
                ),
                target=f"<= {BATCH_LIMIT_SECONDS} s" if is_target else None,
                met=(guarded <= BATCH_LIMIT_SECONDS) if is_target else None,
                extra={
                    "transactions_guarded": commits["guarded"],
                    "transactions_unguarded": commits["unguarded"],
                    "unguarded_commit_only_s": median(samples["unguarded"]),
                },
            )
        )
        raw["sizes"][str(count)] = {"seconds": samples, "transactions": commits}
    return rows, raw
