"""One guarded transfer in a child process that SIGKILLs itself at a chosen kill point.

Run by ``tests/test_crash_matrix.py`` as::

    python tests/helpers/crash_child.py --store sqlite:PATH|postgres:DSN:SCHEMA '<json>'

The JSON names the source and target files, the path, the run id, the kill
point and a marker file. Every part is the real one: the checkpoint store, the
SQLite source and sink, and the guard from its entry point. Thin wrappers add
only the kill; just before it, the child writes the kill point's name to the
marker file, so the test can tell "killed where asked" from "died elsewhere".

The kill points, in the order a run reaches them, and the seam each uses:

- ``extraction``: the source, once the 2nd partition's extraction has begun
  (row paths: after its first chunk was handed on; lazy-plan, which extracts
  inside the target call: when the sink asks for the 2nd partition's query);
- ``armed-batch-partial``: the store writes the armed batch item by item with
  the real store's ``upsert`` and dies after the first (the store port promises
  no atomicity, so such a store is legal);
- ``after-armed-batch``: right after the armed ``upsert_many`` returned;
- ``target-before-commit``: the sink, when SQLite starts executing the target
  transaction's ``COMMIT`` (every row written, none committed), seen through a
  ``sqlite3`` trace callback on the sink's own connection;
- ``target-after-commit``: right after the real sink method returned, before
  the boundary learns of it;
- ``after-target-success``: a plugin's ``after_target_success``, called before
  the guard's promotion;
- ``promotion-partial``: the committed batch, written item by item, dies after
  the first;
- ``after-promotion``: ``record_evidence`` is called (evidence not written);
- ``after-evidence``: ``save_source_state`` is called (evidence written).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import attrs

from dpone_native_transfer import (
    PartitionCheckpoint,
    RouteKey,
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
    hookimpl,
)
from dpone_native_transfer.testing import phase_batch

__all__ = [
    "CHUNK_ROWS",
    "KILL_POINTS",
    "SOURCE_TABLE",
    "TARGET_TABLE",
    "open_store",
    "sqlite_source",
    "transfer_spec",
]

KILL_POINTS = (
    "extraction",
    "armed-batch-partial",
    "after-armed-batch",
    "target-before-commit",
    "target-after-commit",
    "after-target-success",
    "promotion-partial",
    "after-promotion",
    "after-evidence",
)
SOURCE_TABLE, TARGET_TABLE = "orders", "orders_copy"
CHUNK_ROWS = 100  # several chunks per partition, so a kill can fall between two of them
NOT_REACHED = 3  # exit status of a child that finished without reaching its kill point
LEASE_SECONDS = 600.0  # the killed child's lease outlives the test: the next attempt on this
# host takes it at once because the child is gone (ADR-0024), not because it expired

_ARMED, _COMMITTED = phase_batch("armed"), phase_batch("checkpoint_committed")


def sqlite_source(path: str | os.PathLike[str]) -> SQLiteSource:
    return SQLiteSource(path, SOURCE_TABLE, "region", "updated_at")


def transfer_spec(source: Any, sink: Any, *, path: str, run_id: str) -> TransferSpec:
    """The crash matrix's route: orders -> orders_copy, incremental_append on updated_at."""
    return TransferSpec(
        source=source,
        sink=sink,
        strategy="incremental_append",
        path=path,
        run_id=run_id,
        chunk_rows=CHUNK_ROWS,
    )


def open_store(choice: str) -> Any:
    """``sqlite:PATH`` or ``postgres:DSN:SCHEMA`` (the schema is after the last colon)."""
    kind, _, rest = choice.partition(":")
    if kind == "sqlite" and rest:
        return SQLiteCheckpointStore(rest)
    if kind == "postgres" and rest.count(":") >= 1:
        from dpone_native_transfer.stores.postgres import PostgresCheckpointStore

        dsn, _, schema = rest.rpartition(":")
        return PostgresCheckpointStore(dsn, schema=schema)
    raise ValueError("--store must be sqlite:PATH or postgres:DSN:SCHEMA")


@attrs.frozen
class Killer:
    """Knows the one kill point of this child; ``at(point)`` dies there and nowhere else."""

    point: str
    marker: Path

    def at(self, point: str) -> None:
        if point == self.point:
            self.marker.write_text(point)  # written and closed before the signal
            os.kill(os.getpid(), signal.SIGKILL)


class CrashSource(SQLiteSource):
    """The real SQLite source; it dies once the 2nd partition's extraction has begun."""

    def __init__(self, inner: SQLiteSource, killer: Killer) -> None:
        super().__init__(inner.path, inner.table, inner.partition_column, inner.cursor_column)
        self.killer = killer
        self.partitions = 0

    def read(self, bounds: Mapping[str, Any], *, chunk_rows: int = 10_000) -> Iterator[list]:
        chunks = super().read(bounds, chunk_rows=chunk_rows)
        if "cursor_from" in bounds:  # lazy-plan's reads of its windows' top rows, not extraction
            return chunks
        self.partitions += 1
        return self._first_chunk_then_kill(chunks) if self.partitions == 2 else chunks

    def read_partitions(self, bounds: Any, *, chunk_rows: int = 10_000) -> Iterator[Any] | None:
        """One scan for every partition (an unindexed column): dies once rows of a 2nd one came."""
        scan = super().read_partitions(bounds, chunk_rows=chunk_rows)
        return None if scan is None else self._second_partition_then_kill(scan)

    def _second_partition_then_kill(self, scan: Iterator[Any]) -> Iterator[Any]:
        seen: set[int] = set()
        for index, rows in scan:
            yield index, rows
            seen.add(index)
            if len(seen) == 2:
                self.killer.at("extraction")

    def _first_chunk_then_kill(self, chunks: Iterator[list]) -> Iterator[list]:
        yield next(chunks)
        self.killer.at("extraction")  # the path has taken the first chunk and asks for more
        yield from chunks

    def table_sql(self, bounds: Any, *, conn: Any, **kwargs: Any) -> tuple[str, tuple] | None:
        """A pull's one statement for every partition (legacy and staged into SQLite): dies
        partway through it, SQLite's progress handler calling as the statement runs."""
        whole = super().table_sql(bounds, conn=conn, **kwargs)
        if whole is not None:
            conn.set_progress_handler(lambda: self.killer.at("extraction"), 1_000)
        return whole

    def select_sql(self, bounds: Mapping[str, Any], **kwargs: Any) -> tuple[str, tuple]:
        """lazy-plan's extraction: the sink asks for each partition's query inside its call;
        a pull of one statement per partition, before the target call."""
        if "cursor_from" in bounds:  # a read of a window's top rows (above), not extraction
            return super().select_sql(bounds, **kwargs)
        self.partitions += 1
        if self.partitions == 2:
            self.killer.at("extraction")
        return super().select_sql(bounds, **kwargs)


class CrashSink(SQLiteSink):
    """The real SQLite sink; it dies inside its own target transaction, or right after it.

    The seam is ``_connect``, the sink's one connection factory: for
    ``target-before-commit`` it adds a trace callback to the real connection,
    which SQLite calls as it starts each statement. Only statements of a
    target call (``load``, ``finalize_staged_load``) count, so staging's own
    commit passes.
    """

    def __init__(self, path: str, table: str, killer: Killer) -> None:
        super().__init__(path, table)
        self.killer = killer
        self.in_target_call = False

    def load(self, payload: Any) -> int:
        return self._target_call(super().load, payload)

    def finalize_staged_load(self, **kwargs: Any) -> int:
        return self._target_call(super().finalize_staged_load, **kwargs)

    def _target_call(self, call: Any, *args: Any, **kwargs: Any) -> int:
        self.in_target_call = True
        rows = call(*args, **kwargs)
        self.in_target_call = False
        self.killer.at("target-after-commit")
        return rows

    @contextlib.contextmanager
    def _connect(self) -> Iterator[Any]:
        with super()._connect() as conn:
            if self.killer.point == "target-before-commit":
                conn.set_trace_callback(self._on_statement)
            yield conn

    def _on_statement(self, sql: str) -> None:
        if self.in_target_call and sql == "COMMIT":
            self.killer.at("target-before-commit")


class CrashStore:
    """The real checkpoint store; it dies inside or after a chosen write."""

    def __init__(self, inner: Any, killer: Killer) -> None:
        self.inner = inner
        self.killer = killer

    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        self.upsert_many([checkpoint])

    def upsert_many(self, checkpoints: Sequence[PartitionCheckpoint], **held: Any) -> None:
        batch = tuple(checkpoints)
        if _ARMED(batch):
            self._write(batch, held, partial="armed-batch-partial")
            self.killer.at("after-armed-batch")
        elif _COMMITTED(batch):
            self._write(batch, held, partial="promotion-partial")
        else:
            self.inner.upsert_many(batch, **held)

    def _write(
        self, batch: tuple[PartitionCheckpoint, ...], held: dict[str, Any], *, partial: str
    ) -> None:
        """The batch; or, in a child that dies at ``partial``, its first item, then death.

        Item by item is how a store without transactions writes a batch. ``held``: the
        lease the write is made under (``HeldStore``).
        """
        if self.killer.point == partial:
            self.inner.upsert(batch[0])
            self.killer.at(partial)
        self.inner.upsert_many(batch, **held)

    def list_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        return self.inner.list_latest(route)

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        return self.inner.load_source_state(route)

    def record_evidence(
        self, route: RouteKey, run_id: str, record: dict[str, Any], **held: Any
    ) -> None:
        self.killer.at("after-promotion")
        self.inner.record_evidence(route, run_id, record, **held)

    def save_source_state(self, route: RouteKey, state: dict[str, Any], **held: Any) -> None:
        self.killer.at("after-evidence")
        self.inner.save_source_state(route, state, **held)

    def __getattr__(self, name: str) -> Any:
        """The store's other capabilities (target scope, adoption, leases) pass through."""
        return getattr(self.inner, name)

    def list_evidence(self, route: RouteKey) -> list[dict[str, Any]]:
        return self.inner.list_evidence(route)


@attrs.define(eq=False)
class KillBeforePromotion:
    """A plugin beside the guard whose ``after_target_success`` dies before the guard's runs."""

    killer: Killer

    # tryfirst: this must run before the guard's promotion, which is firstresult
    @hookimpl(tryfirst=True)
    def after_target_success(self, mutation: Any, result: Any) -> None:
        self.killer.at("after-target-success")


def plugins_for(killer: Killer) -> list[object] | None:
    """None (the guard from its entry point, as in production), or the guard plus the killer.

    An explicit list replaces the entry points, so the guard is loaded from
    its entry point by hand.
    """
    if killer.point != "after-target-success":
        return None
    guard = metadata.entry_points(group="dpone_native_transfer")["target_commit_guard"].load()
    return [guard, KillBeforePromotion(killer)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, metavar="sqlite:PATH|postgres:DSN:SCHEMA")
    parser.add_argument(
        "case", type=json.loads, help="JSON: source, target, path, run_id, kill_point, marker"
    )
    args = parser.parse_args(argv)
    case = args.case
    if case["kill_point"] not in KILL_POINTS:
        parser.error(f"unknown kill point {case['kill_point']!r}")
    killer = Killer(case["kill_point"], Path(case["marker"]))
    real_store = open_store(args.store)
    spec = transfer_spec(
        CrashSource(sqlite_source(case["source"]), killer),
        CrashSink(case["target"], TARGET_TABLE, killer),
        path=case["path"],
        run_id=case["run_id"],
    )
    try:
        TransferRuntime(
            CrashStore(real_store, killer),
            plugins=plugins_for(killer),
            lease_seconds=LEASE_SECONDS,
        ).run(spec)
    finally:
        real_store.close()
    print(f"the run finished without reaching kill point {killer.point!r}", file=sys.stderr)
    return NOT_REACHED


if __name__ == "__main__":
    sys.exit(main())
