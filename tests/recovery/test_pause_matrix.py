"""Pause matrix: a worker stopped (SIGSTOP) past its lease at every step between the lease's
take and the target's commit, another worker run to its end meanwhile, then the stopped one
resumed: no row twice, none lost, and each worker ends as the design says.

Per case (pause point x path x target x store):

1. Worker A, a child process (``tests/helpers/crash_child.py``, forked warm as the crash
   matrix's are: ``start_forked``), runs a real guarded transfer with a 1 s lease and stops
   itself at the pause point, after writing a marker. The test waits for the marker, for A
   to be stopped, and for A's lease to expire (A's process still exists: only expiry frees
   it, ADR-0024).
2. Worker B runs ``dpone-transfer run`` to its end (manual recovery, the default; a process
   of its own, forked warm too). When that is blocked (exit 3), B runs again with
   ``--recovery from_target``.
3. A is resumed (SIGCONT) and finishes; its exit status and error code are what
   ``dpone-transfer run`` would give.
4. A final plain run, and, where the route is blocked, one with ``--recovery from_target``.

The target then holds every source row exactly once, and its ledger one batch: the one
of the run that loaded it. ``expected()`` says, per case, what the code promises at each
step; the reasons are beside it. Every step is the real thing: stores, sinks, the CLI,
the guard from its entry point; A's wrappers only add the stop.

Where the matrix was cut, and why (the whole matrix is measured in docs/reliability.md):
the PostgreSQL store runs the four pause points on every target for legacy and
lazy-plan only (the store takes part in the lease, its epochs and the writes under the
lease, which do not depend on the path); on a SQLite target stopped inside its load's
transaction, B's ``from_target`` run waits SQLite's 30 s busy timeout for the target's
lock before it gives up, so it runs once (legacy, SQLite store).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
from helpers.crash_child import PAUSE_POINTS, Forked, open_store, start_forked
from helpers.matrix_targets import SOURCE_TABLE, TARGET_KINDS, Place
from helpers.postgres_server import postgres_url

from dpone_native_transfer.lease import lease_key
from dpone_native_transfer.testing import assert_rows_exactly_once
from dpone_target_commit_guard.policy import blocked_partitions

if TYPE_CHECKING:  # imported by pytest as a plugin, so that its asserts are rewritten
    from helpers.pause_report import PauseMatrix, PauseRun

pytest_plugins = ["helpers.pause_report"]

PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")
ROWS, PARTITIONS, CHUNK_ROWS = 400, 4, 50
LEASE_SECONDS = 1  # worker A's
# B's and the final runs' (the route file's): a run removes the work folders of earlier
# attempts on its table idle for twice its lease, so with 1 s it would remove stopped A's
# after 2 s, and A's resumed target call would meet a missing file before the target's
# fence, depending on timing (test_a_resumed_worker_whose_work_folder_was_removed_...)
ROUTE_LEASE_SECONDS = 60
WAITING = 3.0  # seconds a B that waits for A's lock must still be running before A resumes
AUTOMATIC = "dpone-transfer (automatic)"

OK, FAILED, BLOCKED = 0, 1, 3
LEASE_LOST = "native_transfer_lease_lost"
RECONCILE = "native_transfer_manual_reconciliation_required"
UNAVAILABLE = "native_transfer_target_unavailable"


@attrs.frozen(kw_only=True)
class Expected:
    """What the design promises for one case. An outcome is (exit status, error code)."""

    b_manual: tuple[int, str | None]
    b_waits: bool = False  # B waits for a lock A holds, until A resumes
    b_from_target: tuple[int, str | None] | None = None  # None: B runs no from_target run
    a: tuple[int, str | None]  # A, resumed
    a_lease: str | None = "lost"  # A's LeaseLost: "lost" (its store write) or "fenced"
    loader: str  # the run whose batch is the target's only ledger row
    final: tuple[int, ...] = (OK,)  # the final plain run, then from_target if it was blocked
    left_armed: bool = False  # A's batch is still armed once A has ended


def expected(point: str, path: str, target: str, *, b_heals: bool) -> Expected:
    """From the code: runtime.py (the lease, the scan, the fence epoch), the guard plugin,
    recovery.Prover, and each sink's transaction and locks.

    - ``after-lease``, ``extraction`` of a row path: A armed nothing, so B's plain run
      loads every row. A, resumed, finds its lease gone: at the fence epoch (after the
      scan) or at ``mutate``'s ``lease.confirm()`` before arming: ``lease_lost``,
      nothing applied, nothing written.
    - ... except PostgreSQL staged, whose extraction feeds ``stage()``'s COPY: A is
      stopped inside the staging table's transaction, so B waits for its lock on that
      table for the staging table's lock timeout (30 s), then fails (exit 1); A stops at
      ``confirm()``; the final run loads.
    - lazy-plan's ``extraction`` (inside the target call, before the sink opens the
      target) and ``after-armed-batch``: A's armed batch blocks B's plain run (exit 3).
      B's from_target run raises the fence past A's epoch, proves A's batch not applied,
      heals it (audited) and loads every row. A, resumed, calls the target, whose fence
      refuses its batch in its own transaction (``lease_lost``, fenced, rolled back), on
      staged too: ``finalize_staged_load`` checks the fence before it looks for the
      staging table B's run replaced and consumed.
    - ``target-before-commit``: A is stopped inside its load's transaction, the fence
      passed. B's plain run is blocked; its from_target run cannot raise the fence: it
      checks the target first, and SQLite's check waits the 30 s busy timeout for A's write
      lock and DuckDB's file lock refuses it (``target_unavailable``, exit 1: a retry may
      succeed). A, resumed, commits: its rows are in the target, but its promotion is
      refused under the lost lease (``lease_lost``, exit 1) and its batch stays armed. The
      final plain run is blocked; from_target proves the batch applied and heals it without
      loading a row. On PostgreSQL, B's from_target run ends A's session first (its
      ``application_name`` names its older epoch: ``PostgresSink.advance_fence``), so it
      raises the fence, proves A's batch not applied and loads every row; A, resumed,
      finds its session gone (``lease_lost``).
    - DuckDB staged ``after-armed-batch`` is ``target-before-commit``'s case: A staged its
      rows in the target file, which a run keeps open until it ends
      (``DuckDBSink.holding_connection``), so DuckDB's file lock keeps B's from_target run
      out and the fence stays at A's epoch: A, resumed, commits, and the final from_target
      run heals its batch as applied.
    """
    if point == "after-lease" or (point == "extraction" and path != "lazy-plan"):
        if point == "extraction" and (target, path) == ("postgres", "staged"):
            return Expected(b_manual=(FAILED, UNAVAILABLE), b_waits=True, a=(FAILED, LEASE_LOST),
                            loader="final-1")  # fmt: skip
        return Expected(b_manual=(OK, None), a=(FAILED, LEASE_LOST), loader="b-manual")
    held = (point, path, target) == ("after-armed-batch", "staged", "duckdb")
    if point in ("extraction", "after-armed-batch") and not held:
        return Expected(
            b_manual=(BLOCKED, RECONCILE),
            b_from_target=(OK, None),
            a=(FAILED, LEASE_LOST),
            a_lease="fenced",
            loader="b-from-target",
        )
    assert point == "target-before-commit" or held
    if target == "postgres":
        return Expected(
            b_manual=(BLOCKED, RECONCILE),
            b_from_target=(OK, None),
            a=(FAILED, LEASE_LOST),
            loader="b-from-target",
        )
    locked = {"sqlite": (FAILED, UNAVAILABLE), "duckdb": (FAILED, UNAVAILABLE)}
    return Expected(
        b_manual=(BLOCKED, RECONCILE),
        b_from_target=locked[target] if b_heals else None,
        a=(FAILED, LEASE_LOST),
        loader="A",
        final=(BLOCKED, OK),
        left_armed=True,
    )


def cases() -> Iterator[Any]:
    for store in ("sqlite", "postgres"):
        for target in TARGET_KINDS:
            for path in PATHS:
                if store == "postgres" and path not in ("legacy", "lazy-plan"):
                    continue
                for point in PAUSE_POINTS:
                    yield pytest.param(
                        point, path, target, store, id=f"{point}-{path}-{target}-{store}"
                    )


# --- the databases -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def store_database(postgres_dsn: str) -> Iterator[str]:
    """A database of this module's own for the PostgreSQL store: ``dpone-transfer run`` keeps
    a store in the schema ``dpone`` of the database its URL names, so A (a child given the
    same schema) and B share it; each case's route has target and source of its own."""
    import psycopg

    name = f"pause_{os.urandom(6).hex()}"
    with psycopg.connect(postgres_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield psycopg.conninfo.make_conninfo(postgres_dsn, dbname=name)
    finally:
        with psycopg.connect(postgres_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@attrs.frozen
class Stores:
    child: str  # crash_child's --store
    cli: str  # the route file's [store] path


@pytest.fixture
def place_of(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    made: list[Place] = []

    def make(target: str, path: str) -> Place:
        url = schema = None
        if target == "postgres":
            url = postgres_url(request.getfixturevalue("postgres_dsn"))
            schema = f"pause_{os.urandom(6).hex()}"
        place = Place(target=target, path=path, folder=str(tmp_path), url=url, schema=schema)
        made.append(place)
        return place

    yield make
    for place in made:
        place.drop_postgres_schema()


def stores_of(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Stores:
    if kind == "sqlite":
        path = str(tmp_path / "checkpoints.db")
        return Stores(child=f"sqlite:{path}", cli=path)
    dsn = request.getfixturevalue("store_database")
    return Stores(child=f"postgres:{dsn}:dpone", cli=postgres_url(dsn))


# --- the workers ---------------------------------------------------------------------------


@attrs.frozen
class Outcome:
    status: int
    code: str | None
    stderr: str

    @property
    def pair(self) -> tuple[int, str | None]:
        return self.status, self.code

    def cell(self) -> str:
        return f"{self.status} {self.code or 'ok'}".replace("native_transfer_", "")

    def line(self, prefix: str) -> str | None:
        return next((line for line in self.stderr.splitlines() if line.startswith(prefix)), None)


def _outcome(status: int, stderr: str) -> Outcome:
    """The exit status and the error code of ``error: CODE: message`` on stderr."""
    error = next((line for line in stderr.splitlines() if line.startswith("error: ")), None)
    code = None if error is None else error.removeprefix("error: ").split(":", 1)[0]
    return Outcome(status, code, stderr)


@attrs.define(kw_only=True)
class Case:
    place: Place
    stores: Stores
    tmp: Path
    route_lease_seconds: float = ROUTE_LEASE_SECONDS
    route_file: Path = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.route_file = self.tmp / "route.toml"
        text = self.place.route_text(
            store=self.stores.cli, chunk_rows=CHUNK_ROWS, lease_seconds=self.route_lease_seconds
        )
        self.route_file.write_text(text)

    @property
    def env(self) -> dict[str, str]:
        (self.tmp / "work").mkdir(exist_ok=True)
        return {
            **os.environ,
            **self.place.run_env(self.stores.cli),
            "TMPDIR": str(self.tmp / "work"),
        }

    def start_a(self, point: str) -> Forked:
        """Worker A, once it is stopped at ``point`` and its lease has expired."""
        marker = self.tmp / "paused-at"
        case = {
            "place": self.place.as_dict(),
            "run_id": "A",
            "point": point,
            "signal": "stop",
            "lease_seconds": LEASE_SECONDS,
            "chunk_rows": CHUNK_ROWS,
            "marker": str(marker),
        }
        argv = ["--store", self.stores.child, json.dumps(case)]
        child = start_forked(argv, self.env, self.tmp / "a.out")
        _CHILDREN.append(child)
        deadline = time.monotonic() + 60
        while not (marker.is_file() and _stopped(child.pid)):
            if child.poll() is not None:
                pytest.fail(f"A exited {child.returncode} before {point}:\n{child.text()}")
            assert time.monotonic() < deadline, f"A did not stop at {point}"
            time.sleep(0.01)
        assert marker.read_text() == point
        self.wait_for_lease_expiry()
        return child

    def wait_for_lease_expiry(self) -> None:
        store = open_store(self.stores.child)
        table = store.lease_table()
        try:
            deadline = time.monotonic() + 10 * LEASE_SECONDS
            while table.holder(lease_key(self.place.route), time.time()) is not None:
                assert time.monotonic() < deadline, "A's lease did not expire"
                time.sleep(0.05)
        finally:
            table.close()
            store.close()

    def start(self, run_id: str, recovery: str) -> Forked:
        """``dpone-transfer run``, forked warm (``start_forked``)."""
        argv = ["run", str(self.route_file), "--run-id", run_id, "--quiet", "--recovery", recovery]
        child = start_forked(argv, self.env, self.tmp / f"{run_id}.out", cli=True)
        _CHILDREN.append(child)
        return child

    def run(self, run_id: str, recovery: str = "manual") -> Outcome:
        """``dpone-transfer run`` to its end."""
        done = self.start(run_id, recovery)
        return _outcome(done.wait(timeout=120), done.text())

    def run_waiting(self, run_id: str, a: Forked) -> tuple[Outcome, Outcome]:
        """B, which must still wait for A's lock ``WAITING`` seconds on; then A resumes."""
        b = self.start(run_id, "manual")
        try:
            b.wait(timeout=WAITING)
        except subprocess.TimeoutExpired:
            pass
        else:
            pytest.fail(f"B did not wait for A's lock: exit {b.returncode}\n{b.text()}")
        resumed = resume(a)
        return _outcome(b.wait(timeout=120), b.text()), resumed

    def blocked(self) -> int:
        store = open_store(self.stores.child)
        try:
            return len(blocked_partitions(store.list_latest(self.place.route)))
        finally:
            store.close()

    def audits(self) -> list[dict[str, Any]]:
        store = open_store(self.stores.child)
        try:
            return store.list_audit(self.place.route)
        finally:
            store.close()

    def ledger_runs(self) -> list[str]:
        return [entry.run_id for entry in self.place.make_sink().read_ledger()]


_CHILDREN: list[Forked] = []


@pytest.fixture(autouse=True)
def _no_worker_left() -> Iterator[None]:
    """A case that fails midway leaves no stopped worker behind."""
    yield
    while _CHILDREN:
        _CHILDREN.pop().kill()


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        return handle.read().rpartition(")")[2].split()[0] == "T"


def resume(a: Forked) -> Outcome:
    os.kill(a.pid, signal.SIGCONT)
    return _outcome(a.wait(timeout=120), a.text())


def check_rows(place: Place, row: PauseRun) -> None:
    source, target = place.source_ids(), place.target_ids()
    row.duplicates = len(target) - len(set(target))
    row.lost = len(set(source) - set(target))
    assert_rows_exactly_once(source, target)


# --- the matrix ----------------------------------------------------------------------------


@pytest.mark.parametrize(("point", "path", "target", "store_kind"), list(cases()))
def test_a_worker_stopped_past_its_lease_neither_duplicates_nor_loses_rows(
    point: str,
    path: str,
    target: str,
    store_kind: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    place_of: Any,
    pause_matrix: PauseMatrix,
) -> None:
    place = place_of(target, path)
    place.build_source(rows=ROWS, partitions=PARTITIONS)
    case = Case(place=place, stores=stores_of(store_kind, tmp_path, request), tmp=tmp_path)
    b_heals = target != "sqlite" or (path, store_kind) == ("legacy", "sqlite")
    want = expected(point, path, target, b_heals=b_heals)
    with pause_matrix.run(point, path, target, store_kind) as row:
        a = case.start_a(point)

        # B, while A is stopped
        if want.b_waits:
            b, resumed = case.run_waiting("b-manual", a)
        else:
            b = case.run("b-manual")
        row.b_manual = b.cell()
        assert b.pair == want.b_manual, b.stderr
        if b.status == BLOCKED and want.b_from_target is not None:
            healing = case.run("b-from-target", "from_target")
            row.b_from_target = healing.cell()
            assert healing.pair == want.b_from_target, healing.stderr
        if not want.b_waits:
            resumed = resume(a)

        # A, resumed
        row.a_outcome = resumed.cell()
        assert resumed.pair == want.a, resumed.stderr
        if want.a_lease is not None:
            diagnostics = json.loads(resumed.line("diagnostics: ").removeprefix("diagnostics: "))
            assert diagnostics["lease"] == want.a_lease
        runs = case.ledger_runs()
        row.a_applied = "yes" if "A" in runs else "no"
        assert ("A" in runs) is (want.loader == "A")
        row.blocked_after_a = str(case.blocked())
        # a stopped attempt that applied nothing leaves nothing blocked; one that committed
        # after its lease was lost leaves its armed batch for the proof to resolve
        assert case.blocked() == (PARTITIONS if want.left_armed else 0)

        # the final runs
        finals = [case.run("final-1")]
        if finals[0].status == BLOCKED:
            finals.append(case.run("final-2", "from_target"))
        row.final = ", ".join(outcome.cell() for outcome in finals)
        assert tuple(outcome.status for outcome in finals) == want.final, finals[-1].stderr
        check_rows(place, row)
        assert case.ledger_runs() == [want.loader]
        assert case.blocked() == 0
        # every resolution was the automatic one, by the run that proved it
        healed = {}
        if want.b_from_target == (OK, None):
            healed["b-from-target"] = "not_applied"  # the fence raised past A's epoch first
        if len(finals) == 2:
            healed["final-2"] = "applied"  # A's ledger row lists its partitions and rows
        audits = case.audits()
        assert {audit["run_id"]: audit["operator"] for audit in audits} == dict.fromkeys(
            healed, AUTOMATIC
        )
        for audit in audits:
            [proof] = audit["proof"].values()
            assert proof["verdict"] == healed[audit["run_id"]] and proof["heals"] is True


def test_the_run_that_fences_a_stopped_merge_ends_its_session_and_merges_the_same_keys(
    tmp_path: Path, place_of: Any, request: pytest.FixtureRequest
) -> None:
    """A stopped between its merged rows and its ledger row holds those rows' locks, but not
    the ledger's. B's from_target run raises the fence past A's epoch, then merges the same
    keys: without ending A's session (``PostgresSink.advance_fence``) its MERGE waited for
    A's rows until A resumed. A, resumed, finds its session ended: its lease is lost."""
    place = attrs.evolve(place_of("postgres", "legacy"), merge=True)
    place.build_source(rows=ROWS, partitions=PARTITIONS)
    place.add_deleted_column()
    case = Case(place=place, stores=stores_of("sqlite", tmp_path, request), tmp=tmp_path)
    assert case.run("first").pair == (OK, None)
    place.change_source(every=3)  # a third of the keys updated, a third deleted
    a = case.start_a("target-before-ledger")
    assert case.run("b-manual").pair == (BLOCKED, RECONCILE)
    healing = case.start("b-from-target", "from_target")
    try:
        status = healing.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("B's from_target run waited for the stopped worker's rows")
    assert (status, _outcome(status, healing.text()).code) == (OK, None), healing.text()
    resumed = resume(a)
    assert resumed.pair == (FAILED, LEASE_LOST), resumed.stderr
    assert place.target_rows() == place.merged_rows()
    assert case.ledger_runs() == ["first", "b-from-target"]
    assert case.blocked() == 0
    assert case.run("final").pair == (OK, None)
    assert place.target_rows() == place.merged_rows()


# --- what the resumed worker says (known product bugs, reported; see each reason) ------------


def _stopped_then_resumed(case: Case, point: str, *, heal: bool, idle: float = 0) -> Outcome:
    """A stopped at ``point`` (for ``idle`` seconds more once its lease expired); B's plain
    run (and from_target run, if ``heal``); A resumed."""
    a = case.start_a(point)
    time.sleep(idle)
    assert case.run("b-manual").status == BLOCKED
    if heal:
        assert case.run("b-from-target", "from_target").status == OK
    return resume(a)


def test_a_worker_that_committed_after_losing_its_lease_does_not_claim_it_applied_nothing(
    tmp_path: Path, place_of: Any, request: pytest.FixtureRequest
) -> None:
    place = place_of("sqlite", "legacy")
    place.build_source(rows=ROWS, partitions=PARTITIONS)
    case = Case(place=place, stores=stores_of("sqlite", tmp_path, request), tmp=tmp_path)
    resumed = _stopped_then_resumed(case, "target-before-commit", heal=False)
    assert case.ledger_runs() == ["A"]  # A's batch is in the target: it applied it
    assert resumed.pair == (FAILED, LEASE_LOST)
    assert resumed.line("applied: ") != "applied: False"  # applied False: proof of no rows
    assert "applied nothing" not in (resumed.line("error: ") or "")


def test_a_worker_stopped_in_a_duckdb_file_keeps_the_next_run_out_until_it_ends(
    tmp_path: Path, place_of: Any, request: pytest.FixtureRequest
) -> None:
    """A DuckDB file admits one process at a time, and a run keeps its target file open from
    its first use to its end (``DuckDBSink.holding_connection``): against a target that
    exists, A stopped during its extraction holds it. B's run is refused before it writes
    anything (``target_unavailable``, exit 1: a retry may succeed); A, resumed, finds its
    lease lost before it arms; the next run loads each new row once."""
    place = place_of("duckdb", "legacy")
    place.build_source(rows=ROWS, partitions=PARTITIONS)
    case = Case(place=place, stores=stores_of("sqlite", tmp_path, request), tmp=tmp_path)
    assert case.run("first").pair == (OK, None)
    with contextlib.closing(sqlite3.connect(place.source_path)) as db, db:
        db.execute(
            f"INSERT INTO {SOURCE_TABLE} SELECT id + {ROWS}, region, amount, updated_at + {ROWS}"
            f" FROM {SOURCE_TABLE}"
        )
    a = case.start_a("extraction")
    assert case.run("b-manual").pair == (FAILED, UNAVAILABLE)
    assert resume(a).pair == (FAILED, LEASE_LOST)
    assert case.blocked() == 0
    assert case.run("final").pair == (OK, None)
    assert case.ledger_runs() == ["first", "final"]
    assert_rows_exactly_once(place.source_ids(), place.target_ids())
    assert len(place.target_ids()) == 2 * ROWS


# Not DuckDB: A holds the file its stage is in until it ends, so no other run consumes it
# (the matrix's after-armed-batch-staged-duckdb case).
@pytest.mark.parametrize("target", [t for t in TARGET_KINDS if t != "duckdb"])
def test_a_stale_finalize_of_a_consumed_stage_is_reported_as_a_lost_lease(
    target: str, tmp_path: Path, place_of: Any, request: pytest.FixtureRequest
) -> None:
    place = place_of(target, "staged")
    place.build_source(rows=ROWS, partitions=PARTITIONS)
    case = Case(place=place, stores=stores_of("sqlite", tmp_path, request), tmp=tmp_path)
    resumed = _stopped_then_resumed(case, "after-armed-batch", heal=True)
    assert_rows_exactly_once(place.source_ids(), place.target_ids())
    assert resumed.pair == (FAILED, LEASE_LOST), resumed.stderr


def test_a_paused_workers_folder_is_kept_and_resumed_it_reports_its_lost_lease(
    tmp_path: Path, place_of: Any, request: pytest.FixtureRequest
) -> None:
    place = place_of("sqlite", "legacy")
    place.build_source(rows=ROWS, partitions=PARTITIONS)
    stores = stores_of("sqlite", tmp_path, request)
    case = Case(place=place, stores=stores, tmp=tmp_path, route_lease_seconds=LEASE_SECONDS)
    # B's run leaves A's folder, unchanged for more than 2 x 1 s: A's process still runs
    resumed = _stopped_then_resumed(case, "after-armed-batch", heal=True, idle=2.5)
    assert_rows_exactly_once(place.source_ids(), place.target_ids())
    assert case.blocked() == 0
    assert resumed.pair == (FAILED, LEASE_LOST), resumed.stderr
