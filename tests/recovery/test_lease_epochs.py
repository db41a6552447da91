"""The lease as a fence's source: epochs that only grow, writes only while it is held, a dead
holder on this machine taken over at once, a live (paused) one never (ADR-0024)."""

from __future__ import annotations

import contextlib
import shutil
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from helpers.routes import Route
from helpers.stores import make_version_4

from dpone_native_transfer import (
    ConfigInvalid,
    LeaseLost,
    MemoryCheckpointStore,
    RouteBusy,
    SQLiteCheckpointStore,
    TransferRuntime,
)
from dpone_native_transfer.lease import Lease, ProcessMark, clock_epoch, lease_key, read_holder
from dpone_native_transfer.testing import FaultyStore, phase_batch

ARMED = phase_batch("armed")


def _stores(tmp_path: Path, request: pytest.FixtureRequest) -> list[Any]:
    from dpone_native_transfer import PostgresCheckpointStore

    location = request.getfixturevalue("postgres_schema")
    return [
        SQLiteCheckpointStore(tmp_path / "store.db"),
        PostgresCheckpointStore(location.dsn, schema=location.schema),
        MemoryCheckpointStore(),
    ]


def test_each_take_gets_the_next_epoch_or_the_clocks_and_a_release_keeps_it(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """One more than the key's last, or the clock's milliseconds when more (``clock_epoch``):
    a store that forgot its epochs does not give a stopped worker's away again."""
    route = Route(tmp_path, kind="sqlite", rows=None).spec("legacy").route
    for store in _stores(tmp_path, request):
        epochs = []
        for run in range(3):  # within one millisecond of the clock, then now
            clock = (lambda: 1_000.0) if run < 2 else time.time
            with Lease(store.lease_table(), route, run_id=f"run-{run}", seconds=3_600_000_000,
                       clock=clock) as lease:  # fmt: skip
                epochs.append(lease.epoch)
                table = store.lease_table()
                holder = read_holder(table.holder(lease_key(route), clock()))
                table.close()
                assert holder is not None and holder.epoch == lease.epoch
        assert epochs[:2] == [1_000_000, 1_000_001], type(store).__name__
        assert epochs[2] >= clock_epoch(time.time()) - 60_000, type(store).__name__
        store.close() if hasattr(store, "close") else None


def test_a_version_4_store_is_migrated_and_counts_epochs_from_its_next_take(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    route = Route(tmp_path, kind="sqlite", rows=None).spec("legacy").route
    with SQLiteCheckpointStore(path) as store, Lease(store.lease_table(), route, run_id="old"):
        pass
    make_version_4(path)
    with SQLiteCheckpointStore(path) as store:
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == 5
        with Lease(store.lease_table(), route, run_id="new", clock=lambda: 0.0) as lease:
            assert lease.epoch == 1  # the key's first: the migration's column starts at 0


class StealingStore(FaultyStore):
    """The real store; just before the write named ``at``, another worker takes the lease, as
    after this worker was paused past it (its row expired, then taken)."""

    def __init__(self, inner: Any, path: Path, at: str) -> None:
        super().__init__(inner)
        self.path, self.at = path, at
        self.thief: Lease | None = None

    def steal(self, route: Any) -> None:
        with contextlib.closing(sqlite3.connect(self.path)) as db:
            db.execute("UPDATE lease SET expires_at = 0")
            db.commit()
        self.thief = Lease(self.inner.lease_table(), route, run_id="thief", seconds=60).acquire()

    def upsert_many(self, checkpoints: Any, **held: Any) -> None:
        batch = tuple(checkpoints)
        if self.at == "arm" and ARMED(batch):
            self.steal(batch[0].route)
        super().upsert_many(batch, **held)

    def save_source_state(self, route: Any, state: Any, **held: Any) -> None:
        if self.at == "state":
            self.steal(route)
        super().save_source_state(route, state, **held)


@pytest.mark.parametrize("path", ("legacy", "staged", "file-artifact", "lazy-plan"))
def test_a_worker_that_lost_its_lease_before_arming_arms_nothing_and_stops(
    path: str, tmp_path: Path
) -> None:
    route = Route(tmp_path, kind="sqlite")
    route.store = StealingStore(route.real_store, route.store_path, at="arm")
    with pytest.raises(LeaseLost) as raised:
        route.runtime().run(route.spec(path))
    assert raised.value.code == "native_transfer_lease_lost"
    assert route.sink.target_calls == 0 and route.latest() == []
    assert route.store.thief is not None
    route.store.thief.release()
    route.store.at = ""
    route.runtime().run(route.spec(path, run_id="run-2"))  # not blocked: loads every row once
    assert route.target_ids() == route.source_ids()


def test_a_worker_that_lost_its_lease_does_not_write_its_older_source_state(
    tmp_path: Path,
) -> None:
    """A paused worker that had nothing to load must not put back the state it planned from
    over the newer holder's: the next run would load a window again."""
    route = Route(tmp_path, kind="sqlite")
    route.runtime().run(route.spec("legacy"))
    spec_route = route.spec("legacy").route
    before = route.real_store.load_source_state(spec_route)
    route.store = StealingStore(route.real_store, route.store_path, at="state")
    with pytest.raises(LeaseLost):
        route.runtime().run(route.spec("legacy", run_id="paused"))
    assert route.real_store.load_source_state(spec_route) == before


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from dpone_native_transfer import RouteKey, SQLiteCheckpointStore
    from dpone_native_transfer.lease import Lease
    store = SQLiteCheckpointStore(sys.argv[1])
    lease = Lease(store.lease_table(), RouteKey("s", "t", "full_refresh"), run_id="holder",
                  seconds=600).acquire()
    print(lease.epoch, flush=True)
    time.sleep(600)
    """
)


def test_a_dead_holder_here_is_taken_at_once_a_paused_one_and_one_elsewhere_are_not(
    tmp_path: Path,
) -> None:
    from dpone_native_transfer import RouteKey

    path = tmp_path / "store.db"
    route = RouteKey("s", "t", "full_refresh")
    SQLiteCheckpointStore(path).close()
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        epoch = int(holder.stdout.readline())
        holder.send_signal(signal.SIGSTOP)  # paused, alive: its lease holds until it expires
        with SQLiteCheckpointStore(path) as store, pytest.raises(RouteBusy) as busy:
            Lease(store.lease_table(), route, run_id="too-soon").acquire()
        assert busy.value.diagnostics["holder"]["process"]["pid"] == holder.pid
        holder.kill()
        holder.wait(timeout=30)
        with SQLiteCheckpointStore(path) as store:
            with Lease(store.lease_table(), route, run_id="next") as lease:
                assert lease.epoch > epoch
            # a holder on another machine is not judged by this one's processes
            elsewhere = Lease(store.lease_table(), route, run_id="elsewhere", seconds=600)
            elsewhere._holder = elsewhere._holder.__class__(
                **{
                    **elsewhere._holder.as_dict(),
                    "process": ProcessMark(host="other", machine="x", pid=1, started="1"),
                }
            )
            elsewhere.acquire()
            try:
                with pytest.raises(RouteBusy):
                    Lease(store.lease_table(), route, run_id="blocked").acquire()
            finally:
                elsewhere.release()
    finally:
        with contextlib.suppress(ProcessLookupError):
            holder.kill()
        holder.wait(timeout=30)
        if holder.stdout is not None:
            holder.stdout.close()


@pytest.mark.parametrize("seconds", (1e-300, 0.5, 0, -1, float("nan"), True))
def test_a_lease_too_short_for_its_heartbeat_is_refused(seconds: Any, tmp_path: Path) -> None:
    with SQLiteCheckpointStore(tmp_path / "store.db") as store, pytest.raises(ConfigInvalid) as bad:
        TransferRuntime(store, lease_seconds=seconds)
    assert bad.value.diagnostics == {"key": "lease_seconds"}


class RemovingSource:
    """The real source; while the 2nd partition is read, another worker takes the lease and
    removes this attempt's work folder as a dead attempt's (this one was paused past it)."""

    def __init__(self, inner: Any, steal: Any, work: Path) -> None:
        self.inner, self.steal, self.work, self.reads = inner, steal, work, 0

    def read(self, bounds: Any, **kwargs: Any) -> Any:
        self.reads += 1
        if self.reads == 2:
            self.steal()
            for folder in self.work.iterdir():
                shutil.rmtree(folder)
        return self.inner.read(bounds, **kwargs)

    def read_partitions(self, bounds: Any, **kwargs: Any) -> None:
        return None  # read partition by partition

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_a_worker_paused_in_extraction_whose_folder_was_removed_stops_as_lease_lost(
    tmp_path: Path,
) -> None:
    """Not as a full disk (``work_folder_failed``): its folder went because it lost its lease."""
    from helpers.routes import NotPulling

    route = Route(tmp_path, kind="sqlite")
    store = StealingStore(route.real_store, route.store_path, at="")
    route.store = store
    work = tmp_path / "work"
    work.mkdir()
    route.sink.inner = NotPulling(route.sink.inner)
    spec_route = route.spec("legacy").route
    route.source = RemovingSource(route.source, lambda: store.steal(spec_route), work)
    with pytest.raises(LeaseLost):
        route.runtime().run(route.spec("file-artifact", artifact_dir=str(work)))
    assert route.sink.target_calls == 0 and route.latest() == []


def test_a_forked_process_marks_its_own_start_not_its_parents():
    """The process's start time is read once per process: a fork, whose start differs, reads
    its own (the parent's kept mark would make a live child look like a reused pid)."""
    import multiprocessing
    import time

    from dpone_native_transfer import lease

    parent = ProcessMark.here()
    assert parent.started == lease._started("self") != ""
    time.sleep(0.05)  # a clock tick or more: the child starts later
    context = multiprocessing.get_context("fork")
    with context.Pool(1) as pool:
        child = pool.apply(ProcessMark.here)
        child_start = pool.apply(lease._started, ("self",))
    assert child.pid != parent.pid
    assert child.started == child_start != parent.started
