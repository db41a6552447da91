"""Guarded transfers end to end with the PostgreSQL store, and what workers on one route do.

SQLite source and target files, checkpoints on a real PostgreSQL server. A few
of the design's cases run on both durable stores. The concurrency tests run
workers, each with its own store connection, on one route with a SQLite and a
PostgreSQL store: the lease lets one write the target table at a time
(``docs/adr/0024-route-lease.md``).
"""

from __future__ import annotations

import contextlib
import hashlib
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.cli import run_cli
from helpers.postgres_server import PostgresLocation
from helpers.routes import Route, write_route

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
from dpone_native_transfer.config import load_route_config
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


# --- one PostgreSQL server under its usual spellings (found by an attacker: 1,000 duplicates) ---


class PgSource:
    """A 1,000-row ``orders`` table on the test server (which runs on this machine), and route
    files reading it under a given host spelling into one SQLite target and store."""

    def __init__(self, folder: Path, location: PostgresLocation) -> None:
        self.folder, self.admin, self.schema = folder, location.dsn, location.schema
        self.parts = psycopg.conninfo.conninfo_to_dict(location.dsn)
        self.sql(f'CREATE SCHEMA "{self.schema}"')
        self.sql(f'CREATE TABLE "{self.schema}".orders (id integer PRIMARY KEY, region text,'
                 " updated_at integer)")  # fmt: skip
        self.next_id = 1
        self.add(1000)

    def sql(self, statement: str, params: Any = None) -> list[tuple]:
        with contextlib.closing(psycopg.connect(self.admin, autocommit=True)) as conn:
            cursor = conn.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    def add(self, rows: int) -> None:
        ids = range(self.next_id, self.next_id + rows)
        with contextlib.closing(psycopg.connect(self.admin, autocommit=True)) as conn:
            conn.cursor().executemany(
                f'INSERT INTO "{self.schema}".orders VALUES (%s, %s, %s)',
                [(i, f"region-{i % 4}", 1000 + i) for i in ids],
            )
        self.next_id += rows

    def url(self, host: str) -> str:
        """The server as a URL naming ``host`` (a name, an address or a socket directory)."""
        p = self.parts
        if host.startswith("/"):  # a socket: local logins are trusted, no password
            return f"postgresql://{p['user']}@/{p['dbname']}?host={host}&port={p['port']}"
        return f"postgresql://{p['user']}:{p['password']}@{host}:{p['port']}/{p['dbname']}"

    def route(self, host: str, name: str) -> Path:
        source = {"kind": "postgres", "dsn": self.url(host), "path": None,
                  "table": f"{self.schema}.orders"}  # fmt: skip
        return write_route(self.folder, name=name, path="legacy", source=source)

    def target_ids(self) -> list[int]:
        with contextlib.closing(sqlite3.connect(self.folder / "target.db")) as db:
            return sorted(row[0] for row in db.execute("SELECT id FROM orders_copy"))

    def exactly_once(self) -> None:
        assert self.target_ids() == list(range(1, self.next_id)), len(self.target_ids())


def _run(route: Path, code: int = 0) -> Any:
    done = run_cli("run", route, "--quiet")
    assert done.returncode == code, done.stdout + done.stderr
    return done


def test_one_postgres_source_under_its_usual_spellings_is_one_route(
    tmp_path: Path, postgres_schema
) -> None:
    """Read as 127.0.0.1 and then as localhost, one server's table was two routes, and the
    second appended all 1,000 rows again, exit 0."""
    pg = PgSource(tmp_path, postgres_schema)
    (socket_dir,) = pg.sql("SHOW unix_socket_directories")[0][0].split(",")[:1]
    spellings = ["127.0.0.1", "localhost", socket_dir.strip()]
    routes = [pg.route(host, f"route-{n}.toml") for n, host in enumerate(spellings)]
    assert "loaded 1,000 rows" in _run(routes[0]).stdout
    for route in routes[1:]:
        assert _run(route).stdout.startswith("committed 0 partitions, skipped 0, loaded 0 rows")
    pg.add(100)
    assert "loaded 100 rows" in _run(routes[2]).stdout
    for route in routes:
        assert "loaded 0 rows" in _run(route).stdout
    pg.exactly_once()  # 1,100 rows, each once


def _old_location(pg: PgSource, host: str) -> str:
    """A route's source location as the release before this one digested it: the host as
    spelled (lowercased), its port, the database."""
    normalized = f"{host}:{pg.parts['port']}/{pg.parts['dbname']}"
    return "postgres:" + hashlib.sha256(f"postgres\0{normalized}".encode()).hexdigest()[:24]


def _as_written_before(files: list[Path], new: str, old: str) -> None:
    """Rewrite every text holding location ``new`` into ``old``: the store and the target's
    ledger as that release wrote them (the digest is all it did differently)."""
    for file in files:
        with contextlib.closing(sqlite3.connect(file)) as db:
            tables = [row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE "
                      "type = 'table' AND name NOT LIKE 'sqlite_%'")]  # fmt: skip
            for table in tables:
                for column in [row[1] for row in db.execute(f'PRAGMA table_info("{table}")')]:
                    db.execute(f'UPDATE "{table}" SET "{column}" = replace("{column}", ?, ?) '
                               f'WHERE typeof("{column}") = \'text\'', (new, old))  # fmt: skip
            db.commit()


def test_a_store_of_the_release_before_keeps_a_route_spelled_by_address_working(
    tmp_path: Path, postgres_schema
) -> None:
    """The release before digested 127.0.0.1 apart from localhost: its store keys the route
    by that digest. The route's next run is refused, names the one command that adopts its
    history, and after it continues without a duplicate."""
    pg = PgSource(tmp_path, postgres_schema)
    route = pg.route("127.0.0.1", "route.toml")
    assert "loaded 1,000 rows" in _run(route).stdout
    new = load_route_config(route).route.source_location
    old = _old_location(pg, "127.0.0.1")
    assert new != old
    _as_written_before([tmp_path / "checkpoints.db", tmp_path / "target.db"], new, old)
    pg.add(100)
    done = _run(route, code=3)
    assert "native_transfer_store_target_mismatch" in done.stderr
    assert "mismatch: same_table_other_source" in done.stderr
    assert "state restore" in done.stderr and "127.0.0.1" not in done.stderr
    assert len(pg.target_ids()) == 1000
    restored = run_cli("state", "restore", route, "--reason", "upgraded", "--operator", "ops",
                       "--yes")  # fmt: skip
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "loaded 100 rows" in _run(route).stdout
    assert "loaded 0 rows" in _run(pg.route("localhost", "local.toml")).stdout
    pg.exactly_once()
