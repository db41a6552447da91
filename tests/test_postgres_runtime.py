"""Guarded transfers end to end with the PostgreSQL store, and what two workers on one route do.

SQLite source and target files, checkpoints on a real PostgreSQL server. A few
of the design's cases run on both durable stores. The concurrency tests force
each interleaving that ``docs/compatibility.md`` ("Concurrent workers on one
route") describes; that section states exactly what they show.
"""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import Route
from postgres_server import PostgresLocation

from dpone_native_transfer import (
    ManualReconciliationRequired,
    PartitionCheckpointStatus,
    PostgresCheckpointStore,
    RouteKey,
    SQLiteSink,
    SQLiteSource,
    TransferResult,
    TransferRuntime,
    TransferSpec,
    hookimpl,
)
from dpone_native_transfer.events import EVENT_ORDER
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
from dpone_target_commit_guard.operator import (
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
    """The conftest route, its checkpoints on SQLite or on PostgreSQL."""
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


# --- design cases on both durable stores ----------------------------------------------------


# design case 3
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


# design case 4
def test_surviving_armed_record_blocks_retry(store_route: Route) -> None:
    store_route.sink.fail = "after"
    store_route.store.fail_batch(phase_batch("target_outcome_unknown"), error=OSError("down"))
    with pytest.raises(InjectedFault):
        store_route.runtime().run(store_route.spec("staged"))
    assert guard_phases(store_route.latest()) == ["armed"] * 4
    store_route.sink.fail = None
    assert_blocked_before_target(_retry(store_route, "staged"), store_route.sink)
    assert_rows_exactly_once(store_route.source_ids(), store_route.target_ids())


# design case 6
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


# --- two workers on one route (docs/compatibility.md) ----------------------------------------


class Worker:
    """One worker process's view: its own store connection, source and sink on shared files."""

    def __init__(self, name: str, location: PostgresLocation, tmp: Path, **sink: Any) -> None:
        self.name = name
        self.store = _open(location)
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

    def latest(self) -> list[Any]:
        return self.store.list_latest(RouteKey("orders", "orders_copy", "incremental_append"))

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


class MeetBeforeArming:
    """Holds a worker after its route scan, just before the guard arms, until both are there.

    ``seen`` records the route's guard phases as each worker arrived: empty
    means the other worker had not armed yet.
    """

    def __init__(self, barrier: threading.Barrier) -> None:
        self.barrier = barrier
        self.seen: list[list[str | None]] = []

    @hookimpl(tryfirst=True)
    def before_target_mutation(self, mutation: Any) -> None:
        self.seen.append(guard_phases(mutation.store.list_latest(mutation.route)))
        self.barrier.wait(timeout=30)


@pytest.fixture
def workers(tmp_path: Path, postgres_schema: PostgresLocation) -> Iterator[Callable[..., Worker]]:
    build_sample_source(tmp_path / "source.db", rows=120, partitions=4)
    made: list[Worker] = []

    def make(name: str, **sink: Any) -> Worker:
        made.append(Worker(name, postgres_schema, tmp_path, **sink))
        return made[-1]

    yield make
    for worker in made:
        worker.store.close()


def _both(first: Callable[[], Any], second: Callable[[], Any]) -> list[Any]:
    """Run both at once; return each one's result or the exception it raised."""

    def outcome(call: Callable[[], Any]) -> Any:
        try:
            return call()
        except Exception as error:
            return error

    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(outcome, first), pool.submit(outcome, second)]
    return [future.result() for future in futures]


def test_two_workers_that_scan_before_either_arms_both_load(workers) -> None:
    """The documented hazard is real: both pass the route scan, both call the target."""
    a, b = workers("a"), workers("b")
    meet = MeetBeforeArming(threading.Barrier(2))
    for worker in (a, b):
        worker.runtime.plugin_manager.register(meet)
        assert_guard_registered(worker.runtime)
    results = _both(a.run, b.run)
    assert all(isinstance(r, TransferResult) for r in results), results
    assert meet.seen == [[], []], "each worker reached the target boundary before any arming"
    assert (a.sink.target_calls, b.sink.target_calls) == (1, 1)
    source, target = a.ids("source"), a.ids("target")
    assert len(target) == 2 * len(source)
    assert Counter(target) == Counter(source * 2), "every source row is in the target twice"
    latest = a.latest()
    assert guard_phases(latest) == ["checkpoint_committed"] * 4
    assert blocked_partitions(latest) == [], "the guard cannot see the duplicate afterwards"
    history = a.store.history(latest[0].route)
    armed = [cp for cp in history if guard_phases([cp]) == ["armed"]]
    assert len({cp.diagnostics["target_commit_guard"]["checkpoint_batch_id"] for cp in armed}) == 2
    for worker in (a, b):  # later runs find nothing to do: the duplicate stays
        worker.runtime.plugin_manager.unregister(meet)
        assert worker.run().committed_partition_ids == ()
    assert (a.sink.target_calls, b.sink.target_calls) == (1, 1)


def test_a_worker_that_scans_while_another_is_in_flight_stops(workers) -> None:
    """An armed, not yet promoted attempt blocks a worker that starts meanwhile."""
    in_target, release = threading.Event(), threading.Event()

    def hold() -> None:
        in_target.set()
        assert release.wait(timeout=30)

    a, b = workers("a", observe=hold), workers("b")
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(a.run)
        assert in_target.wait(timeout=30), "worker a never reached its target call"
        try:
            assert_blocked_before_target(b.run, b.sink)
        finally:
            release.set()
        assert len(first.result().committed_partition_ids) == 4
    assert b.run().committed_partition_ids == (), "once a has promoted, b finds nothing to do"
    assert (a.sink.target_calls, b.sink.target_calls) == (1, 0)
    assert_rows_exactly_once(a.ids("source"), a.ids("target"))


def test_an_unresolved_guard_stops_every_later_attempt_of_every_worker(workers) -> None:
    a, b = workers("a", fail="after"), workers("b")
    with pytest.raises(InjectedFault):
        a.run()  # the target committed, then the call raised: outcome unknown
    a.sink.fail = None
    results = _both(a.run, b.run)
    assert all(isinstance(r, ManualReconciliationRequired) for r in results), results
    for worker in (a, b, b):
        assert_blocked_before_target(worker.run, worker.sink)
    assert (a.sink.target_calls, b.sink.target_calls) == (1, 0)
    assert_rows_exactly_once(a.ids("source"), a.ids("target"))
