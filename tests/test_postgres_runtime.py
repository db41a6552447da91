"""Guarded transfers end to end with the PostgreSQL store, and what workers on one route do.

SQLite source and target files, checkpoints on a real PostgreSQL server. A few
of the design's cases run on both durable stores. The concurrency tests run
workers, each with its own store connection, on one route with a SQLite and a
PostgreSQL store: the lease lets one write the target table at a time
(``docs/adr/0024-route-lease.md``).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from helpers.postgres_server import PostgresLocation
from helpers.routes import Route

from dpone_native_transfer import (
    ManualReconciliationRequired,
    PartitionCheckpointStatus,
    PostgresCheckpointStore,
    RouteBusy,
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferResult,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.events import EVENT_ORDER
from dpone_native_transfer.lease import Lease
from dpone_native_transfer.testing import (
    FaultyStore,
    InjectedFault,
    RecordingSink,
    StepClock,
    assert_blocked_before_target,
    assert_guard_registered,
    assert_rows_exactly_once,
    build_sample_source,
    guard_phases,
    phase_batch,
)
from dpone_target_commit_guard.policy import (
    Resolution,
    audit_record,
    blocked_partitions,
    resolution_batch,
    select_blocked,
)

COMMITTED = PartitionCheckpointStatus.COMMITTED


def _open(location: PostgresLocation) -> PostgresCheckpointStore:
    return PostgresCheckpointStore(location.dsn, schema=location.schema)


@pytest.fixture(params=["sqlite", "postgres"])
def store_route(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Route]:
    """The tests' route (``helpers.routes.Route``), its checkpoints on SQLite or PostgreSQL."""
    route = Route(tmp_path)
    if request.param == "postgres":
        route.real_store.close()
        route.real_store = _open(request.getfixturevalue("postgres_schema"))
        route.store = FaultyStore(route.real_store)
    yield route
    route.real_store.close()


def _retry(route: Route, path: str) -> Callable[[], Any]:
    return lambda: route.runtime().run(route.spec(path, run_id="retry"))


# --- a guarded transfer with the PostgreSQL store -------------------------------------------


def test_guarded_transfer_on_the_postgres_store(tmp_path: Path, postgres_schema, path) -> None:
    route = Route(tmp_path)
    route.real_store.close()
    with _open(postgres_schema) as store:
        runtime = TransferRuntime(store, clock=route.clock)
        assert_guard_registered(runtime)
        result = runtime.run(route.spec(path))
        spec = route.spec(path)
        assert [e.name for e in result.events if e.name in EVENT_ORDER] == list(EVENT_ORDER)
        assert len(result.committed_partition_ids) == 4
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
        latest = store.list_latest(spec.route)
        assert guard_phases(latest) == ["checkpoint_committed"] * 4
        assert {cp.status for cp in latest} == {COMMITTED}
        assert len(store.list_evidence(spec.route)) == 1
        assert store.load_source_state(spec.route) is not None
        again = runtime.run(route.spec(path, run_id="again"))
        assert again.committed_partition_ids == ()
        assert route.sink.target_calls == 1


# --- guard scenarios on both durable stores --------------------------------------------------


# a partial commit: every incremental_append retry stops before the target
def test_retry_after_partial_commit_stops_before_the_target(store_route: Route, path) -> None:
    store_route.store.fail_batch(phase_batch("checkpoint_committed"), keep=2)
    with pytest.raises(InjectedFault):
        store_route.runtime().run(store_route.spec(path))
    for _ in range(2):
        assert_blocked_before_target(_retry(store_route, path), store_route.sink)
    assert store_route.sink.target_calls == 1
    assert_rows_exactly_once(store_route.source_ids(), store_route.target_ids())
    assert (
        guard_phases(store_route.latest())
        == ["checkpoint_committed"] * 2 + ["checkpoint_incomplete"] * 2
    )


# a surviving armed record (its target_outcome_unknown write failed) blocks the retry
def test_surviving_armed_record_blocks_retry(store_route: Route) -> None:
    store_route.sink.fail = "after"
    store_route.store.fail_batch(phase_batch("target_outcome_unknown"), error=OSError("down"))
    with pytest.raises(InjectedFault):
        store_route.runtime().run(store_route.spec("staged"))
    assert guard_phases(store_route.latest()) == ["armed"] * 4
    store_route.sink.fail = None
    assert_blocked_before_target(_retry(store_route, "staged"), store_route.sink)
    assert_rows_exactly_once(store_route.source_ids(), store_route.target_ids())


# a partly written armed batch prevents the first target call
def test_partial_guard_persistence_prevents_the_first_target_call(store_route: Route) -> None:
    store_route.store.fail_batch(phase_batch("armed"), keep=2)
    with pytest.raises(InjectedFault):
        store_route.runtime().run(store_route.spec("legacy"))
    assert store_route.sink.target_calls == 0
    assert guard_phases(store_route.latest()) == ["failed_before_target"] * 4
    store_route.runtime().run(store_route.spec("legacy", run_id="retry"))
    assert_rows_exactly_once(store_route.source_ids(), store_route.target_ids())


def test_operator_scan_and_resolve_through_the_python_api(store_route: Route) -> None:
    """``guard scan/resolve`` take a SQLite file; on PostgreSQL an operator uses the same API."""
    store = store_route.real_store
    store_route.store.fail_batch(phase_batch("checkpoint_committed"), keep=1)
    with pytest.raises(InjectedFault):
        store_route.runtime().run(store_route.spec("legacy"))
    [route] = store.list_routes()
    findings = blocked_partitions(store.list_latest(route))
    assert [f.phase.value for f in findings] == ["checkpoint_incomplete"] * 3
    selected = select_blocked(
        store.list_latest(route), partition_ids=[f.partition_id for f in findings]
    )
    now = datetime(2026, 7, 1, tzinfo=UTC)
    resolved = resolution_batch(selected, Resolution.COMMITTED, now)
    audit = audit_record(
        route, selected, resolved, resolved_as=Resolution.COMMITTED, operator="ops",
        reason="rows verified in the target", now=now,
    )  # fmt: skip
    audit_id = store.apply_resolution(route, resolved, audit)
    assert blocked_partitions(store.list_latest(route)) == []
    assert store.list_audit(route) == [{**audit, "audit_id": audit_id}]
    result = store_route.runtime().run(store_route.spec("legacy", run_id="after-resolve"))
    assert result.committed_partition_ids == ()
    assert store_route.sink.target_calls == 1
    assert_rows_exactly_once(store_route.source_ids(), store_route.target_ids())


# --- workers on one route: the lease (docs/adr/0024-route-lease.md) -------------------------


class Worker:
    """One worker process's view: its own store connection, source and sink on shared files."""

    def __init__(self, name: str, open_store: Callable[[], Any], tmp: Path, **sink: Any) -> None:
        self.name = name
        self.store = open_store()
        self.source = SQLiteSource(str(tmp / "source.db"), "orders", "region", "updated_at")
        self.sink = RecordingSink(SQLiteSink(str(tmp / "target.db"), "orders_copy"), **sink)
        self.runtime = TransferRuntime(self.store, clock=StepClock())
        self.attempts = 0

    def spec(self) -> TransferSpec:
        self.attempts += 1
        return TransferSpec(
            source=self.source,
            sink=self.sink,
            strategy="incremental_append",
            path="legacy",
            run_id=f"{self.name}-{self.attempts}",
            chunk_rows=16,
        )

    def run(self) -> TransferResult:
        return self.runtime.run(self.spec())

    def ids(self, which: str) -> list[int]:
        """Row ids of the shared source (``"source"``) or target (``"target"``) table."""
        path, table = {
            "source": (self.source.path, "orders"),
            "target": (self.sink.inner.path, "orders_copy"),
        }[which]
        with sqlite3.connect(path) as conn:
            ids = sorted(row[0] for row in conn.execute(f"SELECT id FROM {table}"))
        conn.close()
        return ids


@pytest.fixture(params=["sqlite", "postgres"])
def workers(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., Worker]]:
    """Workers with a store connection each: one SQLite file, or one PostgreSQL schema."""
    build_sample_source(tmp_path / "source.db", rows=120, partitions=4)
    if request.param == "postgres":
        location = request.getfixturevalue("postgres_schema")
        open_store: Callable[[], Any] = lambda: _open(location)  # noqa: E731
    else:
        open_store = lambda: SQLiteCheckpointStore(tmp_path / "checkpoints.db")  # noqa: E731
    made: list[Worker] = []

    def make(name: str, **sink: Any) -> Worker:
        made.append(Worker(name, open_store, tmp_path, **sink))
        return made[-1]

    yield make
    for worker in made:
        worker.store.close()


def _together(*calls: Callable[[], Any]) -> list[Any]:
    """Start every call at the same moment; each one's result or the exception it raised."""
    start = threading.Barrier(len(calls))

    def outcome(call: Callable[[], Any]) -> Any:
        start.wait(timeout=30)
        try:
            return call()
        except Exception as error:
            return error

    with ThreadPoolExecutor(len(calls)) as pool:
        futures = [pool.submit(outcome, call) for call in calls]
    return [future.result() for future in futures]


def test_four_workers_started_together_one_loads_and_the_others_are_busy(workers) -> None:
    """The lease: whoever takes it loads; the rest stop before reading the source."""
    busy = threading.Semaphore(0)

    def hold_until_the_others_gave_up() -> None:
        for _ in range(3):
            assert busy.acquire(timeout=30), "the other workers did not all stop busy"

    crew = [workers(name, observe=hold_until_the_others_gave_up) for name in "abcd"]

    def run(worker: Worker) -> Any:
        try:
            return worker.run()
        except RouteBusy:
            busy.release()
            raise

    results = _together(*(lambda w=w: run(w) for w in crew))
    loaded = [r for r in results if isinstance(r, TransferResult)]
    refused = [r for r in results if isinstance(r, RouteBusy)]
    assert (len(loaded), len(refused)) == (1, 3), results
    assert len(loaded[0].committed_partition_ids) == 4
    assert sum(w.sink.target_calls for w in crew) == 1
    winner = next(w for w, r in zip(crew, results, strict=True) if r is loaded[0])
    for error in refused:
        assert error.code == "native_transfer_route_busy"
        assert error.diagnostics["holder"]["run_id"] == f"{winner.name}-1"
        assert "since" in str(error) and "retry when that attempt has ended" in str(error)
    assert_rows_exactly_once(crew[0].ids("source"), crew[0].ids("target"))
    for worker in crew:  # the lease is given back: every later run finds nothing to do
        assert worker.run().committed_partition_ids == ()
    assert_rows_exactly_once(crew[0].ids("source"), crew[0].ids("target"))


def test_a_worker_that_starts_while_another_is_in_flight_is_busy(workers) -> None:
    in_target, release = threading.Event(), threading.Event()

    def hold() -> None:
        in_target.set()
        assert release.wait(timeout=30)

    a, b = workers("a", observe=hold), workers("b")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(a.run)
        assert in_target.wait(timeout=30), "worker a never reached its target call"
        try:
            with pytest.raises(RouteBusy) as busy:
                b.run()
            assert b.sink.target_calls == 0
            assert busy.value.diagnostics["holder"]["run_id"] == "a-1"
        finally:
            release.set()
        assert len(first.result().committed_partition_ids) == 4
    assert b.run().committed_partition_ids == (), "once a has finished, b finds nothing to do"
    assert (a.sink.target_calls, b.sink.target_calls) == (1, 0)
    assert_rows_exactly_once(a.ids("source"), a.ids("target"))


def test_an_unresolved_guard_stops_every_later_attempt_of_every_worker(workers) -> None:
    a, b = workers("a", fail="after"), workers("b")
    with pytest.raises(InjectedFault):
        a.run()  # the target committed, then the call raised: outcome unknown
    a.sink.fail = None
    results = _together(a.run, b.run)
    assert all(isinstance(r, ManualReconciliationRequired | RouteBusy) for r in results), results
    assert any(isinstance(r, ManualReconciliationRequired) for r in results), results
    for worker in (a, b, b):
        assert_blocked_before_target(worker.run, worker.sink)
    assert (a.sink.target_calls, b.sink.target_calls) == (1, 0)
    assert_rows_exactly_once(a.ids("source"), a.ids("target"))


def test_a_lease_left_by_a_dead_worker_expires_and_a_normal_run_follows(workers) -> None:
    """A worker that dies holding the lease stops nobody for longer than the lease lasts."""
    a, b = workers("a"), workers("b")
    dead = Lease(a.store.lease_table(), a.spec().route, run_id="dead-1", seconds=0.5)
    dead.acquire()
    dead._stop.set()  # the worker is gone: no heartbeat, no release
    with pytest.raises(RouteBusy) as busy:
        b.run()
    assert busy.value.diagnostics["holder"]["run_id"] == "dead-1"
    time.sleep(0.6)
    assert len(b.run().committed_partition_ids) == 4
    assert_rows_exactly_once(b.ids("source"), b.ids("target"))
    dead.release()  # its token no longer holds the row: this deletes nothing, closes its connection
