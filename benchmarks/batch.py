"""Section 4: arm + commit of N partitions through the real boundary, per checkpoint store.

One measurement builds N exported candidates, a fresh empty store and a
``TargetMutation``, and times ``TargetBoundary.run(mutation, target)`` with a
target call that does nothing: the guard's ``before_target_mutation`` (arm:
one ``upsert_many`` of N EXPORTED/armed checkpoints) and
``after_target_success`` (commit: one ``upsert_many`` of N
COMMITTED/checkpoint_committed checkpoints), loaded from the entry point as
the runtime loads it.

Baseline: the same two batches written with raw SQL (the store's statements,
payload JSON prepared beforehand, one transaction per batch): the floor any
store code can reach on this machine.

Both stores run through the same functions, parametrised by a ``_Store``:

- SQLite: a fresh database file per measurement. Transactions are counted
  with a ``sqlite3`` trace callback on the store's connection (COMMIT
  statements). The store runs WAL with ``synchronous=FULL``, so each COMMIT
  is one fsync of the WAL, plus one WAL checkpoint (fsync of the WAL and the
  database) each time the WAL passes 1000 pages.
- PostgreSQL: a fresh schema per measurement on one server:
  ``DPONE_BENCH_POSTGRES_DSN`` if set, else the tests' server
  (``tests/helpers/postgres_server.py``: ``DPONE_TEST_POSTGRES_DSN`` or a throwaway
  one, which runs with ``fsync=off`` and ``synchronous_commit=off``, so its
  commits do not wait for the disk). psycopg has no trace callback, so
  transactions are counted by wrapping the store's ``_transaction`` helper,
  through which every store call runs as one BEGIN ... COMMIT on its single
  connection; only calls that start a top-level transaction and return are
  counted. No target is judged for PostgreSQL; without a server its rows are
  skipped with the reason printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

import attrs

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
from dpone_native_transfer.stores import CheckpointStore
from dpone_native_transfer.stores._codec import ROUTE_NAMES, route_params
from dpone_native_transfer.stores.sqlite import _CACHE_KIB

from ._common import REPO, Row, Sizes, log, median, scratch, timed

BATCH_LIMIT_SECONDS = 1.0
ROUTE = RouteKey("orders", "orders_copy", "incremental_append")
ROUTE_PARAMS = route_params(ROUTE)  # the store's five route columns
_WIDTH = len(ROUTE_PARAMS)
POSTGRES_DSN_ENV = "DPONE_BENCH_POSTGRES_DSN"
_AT = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)

# (source_table, target_table, strategy, partition_id, payload JSON): one checkpoint row
# source, target, strategy, partition id, payload JSON; then the SQLite store's summary
# columns (status, query hash, schema hash, guard JSON), which the PostgreSQL store ignores
RawRow = tuple[Any, ...]
RawWrite = Callable[[list[list[RawRow]]], None]
_KEY = ", ".join(ROUTE_NAMES)


def _marks(count: int, mark: str = "?") -> str:
    return ", ".join([mark] * count)


@attrs.frozen(kw_only=True)
class _Store:
    """One checkpoint store the section measures: so both stores run the very same loop."""

    prefix: str  # case prefix; "" for SQLite, whose case names predate PostgreSQL
    open_empty: Callable[[], AbstractContextManager[CheckpointStore]]
    count_commits: Callable[[Any], Callable[[], int]]  # start counting; call to stop and read
    raw_writer: Callable[[], AbstractContextManager[RawWrite]]  # an empty store's raw writer
    limit: float | None  # the absolute target at the largest size, if any


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


def arm_commit(
    store_kind: _Store, items: tuple[PartitionCheckpoint, ...], *, guarded: bool
) -> tuple[float, int]:
    """Time one boundary run (arm + target no-op + commit); return (seconds, COMMIT count)."""
    with store_kind.open_empty() as store:
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
        stop_counting = store_kind.count_commits(store)
        seconds, _ = timed(lambda: boundary.run(mutation, lambda: len(items)))
        commits = stop_counting()
        if len(mutation.state.committed_ids) != len(items):
            raise AssertionError("not every partition was committed")
        if guarded and not mutation.state.armed:
            raise AssertionError("the guard did not arm")
        latest = store.list_latest(ROUTE)
        if len(latest) != len(items) or any(cp.status != "committed" for cp in latest):
            raise AssertionError("the store does not hold every partition as committed")
    return seconds, commits


def _raw_batches(items: tuple[PartitionCheckpoint, ...]) -> list[list[RawRow]]:
    """The guard's two batches (armed, then committed) as rows with their payload JSON."""
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
            guard = {
                "schema_version": "dpone.native_transfer.target_commit_guard.v1",
                "checkpoint_batch_id": sha256_digest("batch"),
                "phase": phase,
                "recovery": "manual_reconciliation_required",
            }
            payload["diagnostics"][GUARD_DIAGNOSTICS_KEY] = guard
            rows.append(
                (
                    *ROUTE_PARAMS,
                    cp.partition_id,
                    json.dumps(payload, sort_keys=True),
                    status,
                    cp.query_hash,
                    cp.schema_hash,
                    json.dumps(guard, sort_keys=True),
                    None,  # ledger_batch: the batch carries no ledger id here
                )
            )
        batches.append(rows)
    return batches


def raw_sql(store_kind: _Store, items: tuple[PartitionCheckpoint, ...]) -> float:
    """The same two batches as raw SQL with payloads prepared outside the timed region."""
    batches = _raw_batches(items)
    with store_kind.raw_writer() as write:
        seconds, _ = timed(lambda: write(batches))
    return seconds


# --- SQLite -----------------------------------------------------------------


@contextlib.contextmanager
def _sqlite_store() -> Iterator[SQLiteCheckpointStore]:
    with scratch("batch") as folder:
        store = SQLiteCheckpointStore(folder / "checkpoints.db")
        try:
            yield store
        finally:
            store.close()


def _sqlite_commits(store: SQLiteCheckpointStore) -> Callable[[], int]:
    """Count the write transactions at the store's one transaction helper.

    Each ``_transaction`` is BEGIN IMMEDIATE ... COMMIT; one that returns has
    committed. (A ``sqlite3`` trace callback would also count them, but it runs
    for every row of an ``executemany`` and slows the very writes being timed.)
    """
    committed = 0
    inner = store._transaction

    @contextlib.contextmanager
    def counting() -> Iterator[Any]:
        nonlocal committed
        with inner() as conn:
            yield conn
        committed += 1

    store._transaction = counting  # type: ignore[method-assign]

    def stop() -> int:
        del store._transaction
        return committed

    return stop


@contextlib.contextmanager
def _sqlite_raw() -> Iterator[RawWrite]:
    with scratch("batch-raw") as folder:
        path = folder / "checkpoints.db"
        SQLiteCheckpointStore(path).close()
        conn = sqlite3.connect(path, isolation_level=None)
        # the store connection's settings (stores/sqlite.py _open)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")

        def write(batches: list[list[RawRow]]) -> None:
            # the store's statements: history rows, then the latest rows with their summary
            for rows in batches:
                conn.execute("BEGIN IMMEDIATE")
                (before,) = conn.execute(
                    "SELECT COALESCE(MAX(seq), 0) FROM checkpoint_history"
                ).fetchone()
                conn.executemany(
                    f"INSERT INTO checkpoint_history ({_KEY}, partition_id, payload)"
                    f" VALUES ({_marks(_WIDTH + 2)})",
                    (row[: _WIDTH + 2] for row in rows),
                )
                conn.executemany(
                    f"INSERT INTO checkpoint_latest ({_KEY}, partition_id, payload, seq,"
                    " status, query_hash, schema_hash, guard, ledger_batch)"
                    f" VALUES ({_marks(_WIDTH + 8)}) ON CONFLICT ({_KEY}, partition_id)"
                    " DO UPDATE SET seq = excluded.seq, payload = excluded.payload,"
                    " status = excluded.status, query_hash = excluded.query_hash,"
                    " schema_hash = excluded.schema_hash, guard = excluded.guard,"
                    " ledger_batch = excluded.ledger_batch",
                    (
                        (*row[: _WIDTH + 2], before + n, *row[_WIDTH + 2 :])
                        for n, row in enumerate(rows, start=1)
                    ),
                )
                conn.execute("COMMIT")

        try:
            yield write
        finally:
            conn.close()


SQLITE = _Store(
    prefix="",
    open_empty=_sqlite_store,
    count_commits=_sqlite_commits,
    raw_writer=_sqlite_raw,
    limit=BATCH_LIMIT_SECONDS,
)


# --- PostgreSQL -------------------------------------------------------------


def _postgres(dsn: str, isolated_schema: Callable[[str], Any]) -> _Store:
    """The PostgreSQL store on ``dsn``; every store and raw writer gets a schema of its own."""
    import psycopg

    from dpone_native_transfer.stores.postgres import PostgresCheckpointStore, _lock_key

    @contextlib.contextmanager
    def open_empty() -> Iterator[PostgresCheckpointStore]:
        with isolated_schema(dsn) as location:
            store = PostgresCheckpointStore(location.dsn, schema=location.schema)
            try:
                yield store
            finally:
                store.close()

    def count_commits(store: PostgresCheckpointStore) -> Callable[[], int]:
        committed = 0
        inner = store._transaction

        def counting(action: str, work: Callable[[Any], Any]) -> Any:
            nonlocal committed
            # psycopg's transaction() on an idle connection is BEGIN ... COMMIT; nested, a savepoint
            top_level = store._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            result = inner(action, work)
            committed += top_level
            return result

        store._transaction = counting  # type: ignore[method-assign]

        def stop() -> int:
            del store._transaction
            return committed

        return stop

    @contextlib.contextmanager
    def raw_writer() -> Iterator[RawWrite]:
        with isolated_schema(dsn) as location:
            PostgresCheckpointStore(location.dsn, schema=location.schema).close()
            s = f'"{location.schema}"'
            route_lock = _lock_key("route", location.schema, *ROUTE_PARAMS)
            conn = psycopg.connect(location.dsn, autocommit=False)

            def write(batches: list[list[RawRow]]) -> None:
                # the store's statements: route lock, pipelined history insert, one unnest upsert
                for rows in batches:
                    with conn.transaction(), conn.cursor() as cursor:
                        cursor.execute("SELECT pg_advisory_xact_lock(%s)", (route_lock,))
                        cursor.executemany(
                            f"INSERT INTO {s}.checkpoint_history ({_KEY}, partition_id,"
                            f" payload) VALUES ({_marks(_WIDTH + 2, '%s')}) RETURNING seq",
                            [row[: _WIDTH + 2] for row in rows],
                            returning=True,
                        )
                        seqs = []
                        while True:
                            seqs.append(cursor.fetchone()[0])
                            if not cursor.nextset():
                                break
                        latest = [
                            (*row[: _WIDTH + 1], seq, row[_WIDTH + 1])
                            for row, seq in zip(rows, seqs, strict=True)
                        ]
                        arrays = ", ".join(
                            ["%s::text[]"] * (_WIDTH + 1) + ["%s::bigint[]", "%s::text[]"]
                        )
                        cursor.execute(
                            f"INSERT INTO {s}.checkpoint_latest ({_KEY}, partition_id, seq,"
                            f" payload) SELECT * FROM unnest({arrays}) ON CONFLICT ({_KEY},"
                            " partition_id) DO UPDATE SET seq = excluded.seq,"
                            " payload = excluded.payload",
                            [list(column) for column in zip(*latest, strict=True)],
                        )

            try:
                yield write
            finally:
                conn.close()

    return _Store(
        prefix="PostgreSQL ",
        open_empty=open_empty,
        count_commits=count_commits,
        raw_writer=raw_writer,
        limit=None,
    )


def _import_server_helper() -> tuple[Any, Any] | str:
    """(tests' helpers.postgres_server module, psycopg), or why they cannot be imported."""
    # The tests already know how to start a throwaway server (initdb + pg_ctl, as the
    # postgres user under root, on 127.0.0.1 and a free port): reuse that, do not copy it.
    tests = str(REPO / "tests")
    sys.path.insert(0, tests)
    try:
        import psycopg
        from helpers import postgres_server
    except ImportError as exc:
        return f"the server helper or the psycopg driver cannot be imported ({exc})"
    finally:
        sys.path.remove(tests)
    return postgres_server, psycopg


@contextlib.contextmanager
def _postgres_server() -> Iterator[tuple[_Store, dict[str, Any]] | str]:
    """The PostgreSQL store and what its server is, or why there is none (a reason to print)."""
    imported = _import_server_helper()
    if isinstance(imported, str):
        yield imported
        return
    helper, psycopg = imported
    given = os.environ.get(POSTGRES_DSN_ENV)
    with contextlib.ExitStack() as stack:
        found: tuple[_Store, dict[str, Any]] | str
        try:
            if given:
                source, dsn = POSTGRES_DSN_ENV, given
            else:
                source = helper.ENV_DSN if os.environ.get(helper.ENV_DSN) else "throwaway server"
                source += " (tests/helpers/postgres_server.py)"
                dsn = stack.enter_context(helper.server_dsn())
            with psycopg.connect(dsn, connect_timeout=10, autocommit=True) as conn:
                server = {
                    name: conn.execute(f"SHOW {name}").fetchone()[0]
                    for name in ("server_version", "fsync", "synchronous_commit")
                }
            found = _postgres(dsn, helper.isolated_schema), {"source": source, **server}
        except helper.pytest.fail.Exception as exc:  # how the helper reports a missing server
            found = f"{source}: {exc.msg.removeprefix('PostgreSQL tests cannot run: ')}"
        except psycopg.Error as exc:  # the driver's text can name the host: class and SQLSTATE
            found = (
                f"{source}: the server does not accept connections"
                f" ({type(exc).__name__}, SQLSTATE {exc.sqlstate})"
            )
        yield found


def _measure_store(store_kind: _Store, sizes: Sizes, rows: list[Row]) -> dict[str, Any]:
    """One row per size for one store; returns the raw timings by size."""
    raw: dict[str, Any] = {}
    largest = max(sizes.batch_partitions)
    for count in sizes.batch_partitions:
        log(f"batch writes: {store_kind.prefix}{count:,} partitions")
        items = candidates(count)
        samples: dict[str, list[float]] = {"guarded": [], "unguarded": [], "raw_sql": []}
        commits: dict[str, int] = {}
        arm_commit(store_kind, items, guarded=True)  # warm-up, discarded
        for _ in range(sizes.runs):
            seconds, commits["guarded"] = arm_commit(store_kind, items, guarded=True)
            samples["guarded"].append(seconds)
            samples["raw_sql"].append(raw_sql(store_kind, items))
            seconds, commits["unguarded"] = arm_commit(store_kind, items, guarded=False)
            samples["unguarded"].append(seconds)
        guarded = median(samples["guarded"])
        judged = store_kind.limit is not None and count == largest
        rows.append(
            Row(
                section="4 batch writes",
                case=f"{store_kind.prefix}{count:,} partitions: guard arm + commit"
                f" ({commits['guarded']} transactions) vs raw SQL (2)",
                value=guarded,
                unit="s",
                baseline=median(samples["raw_sql"]),
                ratio=median(
                    [g / b for g, b in zip(samples["guarded"], samples["raw_sql"], strict=True)]
                ),
                target=f"<= {store_kind.limit} s" if judged else None,
                met=(guarded <= store_kind.limit) if judged else None,
                extra={
                    "transactions_guarded": commits["guarded"],
                    "transactions_unguarded": commits["unguarded"],
                    "unguarded_commit_only_s": median(samples["unguarded"]),
                },
            )
        )
        raw[str(count)] = {"seconds": samples, "transactions": commits}
    return raw


def measure(sizes: Sizes) -> tuple[list[Row], dict]:
    rows: list[Row] = []
    raw: dict = {"runs": sizes.runs, "sizes": _measure_store(SQLITE, sizes, rows)}
    with _postgres_server() as found:
        if isinstance(found, str):
            print(f"section 4: PostgreSQL rows skipped: {found}", flush=True)
            raw["postgresql"] = {"skipped": found}
        else:
            store_kind, server = found
            log(
                f"batch writes on PostgreSQL {server['server_version']} ({server['source']},"
                f" fsync={server['fsync']}, synchronous_commit={server['synchronous_commit']})"
            )
            raw["postgresql"] = {"server": server, "sizes": _measure_store(store_kind, sizes, rows)}
    return rows, raw
