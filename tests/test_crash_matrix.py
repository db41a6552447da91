"""Hard-kill crash matrix: SIGKILL a real guarded transfer at every boundary, then recover.

For each kill point x path x store, a child process (``tests/helpers/crash_child.py``)
runs one transfer on real files and SIGKILLs itself at the kill point. This
process then plays the scheduler: it runs the next attempt on the same files
with a fresh runtime (guard from its entry point, target in a RecordingSink).
The attempt either completes, or is blocked with ManualReconciliationRequired
before the target is called; then it plays the operator of
``docs/checkpoints-and-recovery.md``: it counts each blocked partition's rows in
the target and the source, records ``committed`` or ``failed_before_target``
with the guard's operator API, and lets the scheduler retry.

After the kill and after every attempt the target must hold no row twice;
at the end it holds every source row exactly once. Zero duplicate rows is the
only pass. The matrix is reported by ``tests/helpers/crash_report.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
from helpers.crash_child import (
    KILL_POINTS,
    SOURCE_TABLE,
    TARGET_TABLE,
    open_store,
    sqlite_source,
    transfer_spec,
)
from helpers.routes import write_route

from dpone_native_transfer import (
    ManualReconciliationRequired,
    RouteKey,
    SQLiteSink,
    TransferRuntime,
)
from dpone_native_transfer.identity import route_key
from dpone_native_transfer.lease import Lease, lease_key, read_holder
from dpone_native_transfer.testing import (
    RecordingSink,
    assert_guard_registered,
    assert_no_duplicate_rows,
    assert_rows_exactly_once,
    build_sample_source,
)
from dpone_target_commit_guard.policy import (
    Finding,
    Resolution,
    audit_record,
    blocked_partitions,
    resolution_batch,
    select_blocked,
)

RESPELT_TARGET_TABLE = TARGET_TABLE.upper()  # the same SQLite table, spelt otherwise

if TYPE_CHECKING:  # imported by pytest as a plugin, so that its asserts are rewritten
    from helpers.crash_report import CrashMatrix, CrashRun

pytest_plugins = ["helpers.crash_report"]

CHILD = Path(__file__).parent / "helpers" / "crash_child.py"
ROWS, PARTITIONS = 2_000, 4
STORES = ("sqlite", "postgres")
MAX_ATTEMPTS = 3
COMMITTED, NOT_THERE = Resolution.COMMITTED, Resolution.FAILED_BEFORE_TARGET


@attrs.frozen
class Expected:
    """What the design guarantees for the attempts after a kill."""

    outcome: str  # the first attempt after the kill: "blocked" or "complete"
    target_calls: int  # target calls of the attempt that completes the route
    blocked: int = 0  # partitions whose armed guard blocks the route
    found: Resolution | None = None  # what the target holds for them


# A kill leaves no failure marker behind: whatever was armed stays armed, and blocks.
EXPECTED = {
    # Nothing armed, nothing in the target: a plain retry loads everything.
    "extraction": Expected("complete", target_calls=1),
    # The one durable armed record blocks; the target was never called.
    "armed-batch-partial": Expected("blocked", target_calls=1, blocked=1, found=NOT_THERE),
    "after-armed-batch": Expected("blocked", target_calls=1, blocked=4, found=NOT_THERE),
    # SQLite rolls the open target transaction back: armed, and the rows are not there.
    "target-before-commit": Expected("blocked", target_calls=1, blocked=4, found=NOT_THERE),
    # The target committed and dpone never learned it: only the guard prevents a second copy.
    "target-after-commit": Expected("blocked", target_calls=0, blocked=4, found=COMMITTED),
    "after-target-success": Expected("blocked", target_calls=0, blocked=4, found=COMMITTED),
    # One committed checkpoint became durable; the other three are still armed.
    "promotion-partial": Expected("blocked", target_calls=0, blocked=3, found=COMMITTED),
    # Every partition is committed: the next run skips them all and closes the generation.
    "after-promotion": Expected("complete", target_calls=0),
    "after-evidence": Expected("complete", target_calls=0),
}
# lazy-plan extracts inside the target call (the sink pulls the rows), so it is armed by then.
LAZY_PLAN_EXTRACTION = Expected("blocked", target_calls=1, blocked=4, found=NOT_THERE)


def expected(kill_point: str, path: str) -> Expected:
    if kill_point == "extraction" and path == "lazy-plan":
        return LAZY_PLAN_EXTRACTION
    return EXPECTED[kill_point]


@attrs.frozen(kw_only=True)
class Attempt:
    """One automatic attempt, and what the operator then found and recorded if it was blocked."""

    outcome: str
    target_calls: int
    blocked: tuple[Finding, ...] = ()
    found: Mapping[str, Resolution] = attrs.field(factory=dict)


@attrs.define(kw_only=True)
class CrashRoute:
    """The matrix's route on real files under ``tmp``; ``store`` says how to open its store."""

    tmp: Path
    store: str

    @property
    def source_path(self) -> Path:
        return self.tmp / "source.db"

    @property
    def target_path(self) -> Path:
        return self.tmp / "target.db"

    @property
    def route(self) -> RouteKey:
        """The route the runs use: located in this case's source and target files."""
        sink = SQLiteSink(str(self.target_path), TARGET_TABLE)
        return route_key(sqlite_source(self.source_path), sink, "incremental_append")

    @contextlib.contextmanager
    def opened_store(self) -> Iterator[Any]:
        store = open_store(self.store)
        try:
            yield store
        finally:
            store.close()

    def run_child(self, path: str, kill_point: str) -> None:
        """One transfer in a child process, which must die by SIGKILL at ``kill_point``."""
        marker, child_tmp = self.tmp / "killed-at", self.tmp / "child-tmp"
        child_tmp.mkdir()  # the child's work dir, left behind by the kill, stays under tmp
        case = {
            "source": str(self.source_path),
            "target": str(self.target_path),
            "path": path,
            "run_id": "run-1",
            "kill_point": kill_point,
            "marker": str(marker),
        }
        done = subprocess.run(
            [sys.executable, str(CHILD), "--store", self.store, json.dumps(case)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "TMPDIR": str(child_tmp)},
        )
        assert done.returncode == -signal.SIGKILL, (
            f"the child exited with {done.returncode}, not by SIGKILL:\n{done.stderr[-3000:]}"
        )
        assert marker.is_file() and marker.read_text() == kill_point, (
            f"the child was killed, but not at {kill_point!r}"
        )

    def dead_childs_lease_is_taken_at_once(self) -> None:
        """The killed child held the target table's lease for a long while: on its host, its
        process being gone, the lease is taken at once (ADR-0024), with the next epoch."""
        with self.opened_store() as store:
            table = store.lease_table()
            record = read_holder(table.holder(lease_key(self.route), time.time()))
            assert record is not None and record.process is not None and record.process.gone()
            with Lease(table, self.route, run_id="next", seconds=60) as lease:
                assert lease.epoch == record.epoch + 1

    def attempt(self, path: str, run_id: str) -> Attempt:
        """The scheduler's next attempt: a fresh runtime, the guard from its entry point.

        It names the target table as another spelling SQLite resolves to the same
        table (issue 13.1: an append once dropped a table whose stored name differed
        in case), so every recovery also proves a respelt table is neither dropped
        nor taken for another route.
        """
        sink = RecordingSink(SQLiteSink(str(self.target_path), RESPELT_TARGET_TABLE))
        spec = transfer_spec(sqlite_source(self.source_path), sink, path=path, run_id=run_id)
        with self.opened_store() as store:
            runtime = TransferRuntime(store)
            assert_guard_registered(runtime)
            try:
                runtime.run(spec)
            except ManualReconciliationRequired:
                assert sink.target_calls == 0, "the attempt was blocked only after the target call"
                return Attempt(outcome="blocked", target_calls=0)
        return Attempt(outcome="complete", target_calls=sink.target_calls)

    def reconcile(self, attempt: Attempt) -> Attempt:
        """The runbook: what the target's ledger proves (``guard verify``), checked against a
        count of each blocked partition's rows, then recorded (``guard resolve --from-target``)."""
        target = SQLiteSink(str(self.target_path), TARGET_TABLE)
        ledger = {entry.batch_id for entry in target.read_ledger()}
        with self.opened_store() as store:
            latest = store.list_latest(self.route)
            blocked = tuple(blocked_partitions(latest))
            bounds = {cp.partition_id: cp.partition_bounds for cp in latest}
            found = {f.partition_id: self.target_holds(bounds[f.partition_id]) for f in blocked}
            proven = {
                f.partition_id: COMMITTED if f.batch_id in ledger else NOT_THERE for f in blocked
            }
            assert proven == found, "the ledger's proof and the row count disagree"
            for resolved_as in set(found.values()):
                ids = [pid for pid, holds in found.items() if holds is resolved_as]
                resolve(store, self.route, ids, resolved_as)
        return attrs.evolve(attempt, blocked=blocked, found=found)

    def target_holds(self, bounds: Mapping[str, Any]) -> Resolution:
        """``committed`` if the target holds every source row of ``bounds``, once;
        ``failed_before_target`` if it holds none. Anything else needs a repair first."""
        in_source, _ = count_rows(self.source_path, SOURCE_TABLE, bounds)
        in_target, distinct = count_rows(self.target_path, TARGET_TABLE, bounds)
        assert in_target == distinct, f"partition {bounds} has rows twice in the target"
        assert in_target in (0, in_source), (
            f"the target holds {in_target} of the {in_source} rows of {bounds}: a partial load"
        )
        return COMMITTED if in_target else NOT_THERE

    def check_target(self, row: CrashRun) -> None:
        """No row twice and no foreign row; the report keeps the worst duplicate count seen."""
        rows, distinct = count_rows(self.target_path, TARGET_TABLE)
        row.duplicates = max(row.duplicates or 0, rows - distinct)
        row.target_rows = rows
        assert_no_duplicate_rows(self.source_ids(), self.target_ids())

    def source_ids(self) -> list[int]:
        return ids_of(self.source_path, SOURCE_TABLE)

    def target_ids(self) -> list[int]:
        return ids_of(self.target_path, TARGET_TABLE)


def resolve(store: Any, route: RouteKey, partition_ids: list[str], resolved_as: Resolution) -> None:
    """What ``dpone-transfer guard resolve --partition ... --as ... --yes`` writes, on any store."""
    selected = select_blocked(store.list_latest(route), partition_ids=partition_ids)
    now = datetime.now(UTC)
    resolved = resolution_batch(selected, resolved_as, now)
    audit = audit_record(
        route,
        selected,
        resolved,
        resolved_as=resolved_as,
        operator="crash-matrix",
        reason="counted the partition's rows in the target against the source",
        now=now,
    )
    store.apply_resolution(route, resolved, audit)


@contextlib.contextmanager
def connected(db: Path) -> Iterator[sqlite3.Connection | None]:
    """A read-write connection (so a hot journal left by a kill is rolled back), or None."""
    if not db.is_file():
        yield None
        return
    with contextlib.closing(sqlite3.connect(db)) as connection:
        yield connection


def has_table(connection: sqlite3.Connection, table: str) -> bool:
    """As SQLite resolves a table name: ASCII case aside (the recovery respells it)."""
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE"
    return connection.execute(sql, (table,)).fetchone() is not None


def count_rows(db: Path, table: str, bounds: Mapping[str, Any] | None = None) -> tuple[int, int]:
    """(rows, distinct ids) in ``table``, or in the partition ``bounds`` of it; (0, 0) if absent."""
    sql, params = f'SELECT COUNT(*), COUNT(DISTINCT id) FROM "{table}"', []
    if bounds is not None:
        sql += " WHERE region = ?"
        params.append(bounds["partition"])
        for operator, key in ((">", "cursor_after"), ("<=", "cursor_upto")):
            if bounds.get(key) is not None:
                sql += f" AND updated_at {operator} ?"
                params.append(bounds[key])
    with connected(db) as connection:
        if connection is None or not has_table(connection, table):
            return 0, 0
        return connection.execute(sql, params).fetchone()


def ids_of(db: Path, table: str) -> list[int]:
    with connected(db) as connection:
        if connection is None or not has_table(connection, table):
            return []
        return sorted(row[0] for row in connection.execute(f'SELECT id FROM "{table}"'))


@pytest.fixture
def store_choice(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """The child's ``--store``: a SQLite file, or a PostgreSQL schema of this test's own."""
    if store_kind == "postgres":  # asked for only here, so SQLite runs start no server
        location = request.getfixturevalue("postgres_schema")
        return f"postgres:{location.dsn}:{location.schema}"
    return f"sqlite:{tmp_path / 'checkpoints.db'}"


def recover(route: CrashRoute, path: str, row: CrashRun) -> list[Attempt]:
    """Attempts until one completes (at most MAX_ATTEMPTS); the operator acts after a block.

    The target is checked for duplicates after every attempt; ``row`` is filled as we go,
    so a failing run still shows how far it got.
    """
    route.dead_childs_lease_is_taken_at_once()
    attempts: list[Attempt] = []
    for number in range(1, MAX_ATTEMPTS + 1):
        attempt = route.attempt(path, run_id=f"retry-{number}")
        route.check_target(row)
        if attempt.outcome == "blocked":
            attempt = route.reconcile(attempt)
        if number == 1:
            row.outcome = attempt.outcome
            row.blocked_by, row.resolved_as = describe_block(attempt)
        attempts.append(attempt)
        row.attempts = len(attempts)
        if attempt.outcome == "complete":
            break
    return attempts


def describe_block(attempt: Attempt) -> tuple[str, str]:
    """Report cells: the phases that blocked, and what the operator found."""
    phases = sorted(finding.guard_label() for finding in attempt.blocked)
    found = sorted(resolution.value for resolution in attempt.found.values())
    return _counted(phases), _counted(found)


def _counted(values: list[str]) -> str:
    return ", ".join(f"{values.count(value)} {value}" for value in sorted(set(values))) or "-"


@pytest.mark.parametrize("store_kind", STORES)
@pytest.mark.parametrize("kill_point", KILL_POINTS)
def test_hard_kill_then_automatic_retry_never_duplicates(
    kill_point: str,
    path: str,
    store_kind: str,
    store_choice: str,
    tmp_path: Path,
    crash_matrix: CrashMatrix,
) -> None:
    route = CrashRoute(tmp=tmp_path, store=store_choice)
    build_sample_source(route.source_path, rows=ROWS, partitions=PARTITIONS)
    want = expected(kill_point, path)
    with crash_matrix.run(kill_point, path, store_kind) as row:
        route.run_child(path, kill_point)
        if kill_point == "target-before-commit":
            journal = route.target_path.with_name(route.target_path.name + "-journal")
            assert journal.stat().st_size > 0, "the kill must leave the target transaction open"
        route.check_target(row)

        attempts = recover(route, path, row)
        first, last = attempts[0], attempts[-1]

        # what the design guarantees after this kill
        assert first.outcome == want.outcome, f"after a kill at {kill_point}"
        if want.outcome == "blocked":
            assert [finding.guard_label() for finding in first.blocked] == ["armed"] * want.blocked
            assert set(first.found.values()) == {want.found}
            assert [attempt.outcome for attempt in attempts[1:]] == ["complete"]
        assert last.target_calls == want.target_calls

        # the route is whole: every row exactly once, no guard left, the generation closed
        assert row.duplicates == 0
        assert_rows_exactly_once(route.source_ids(), route.target_ids())
        with route.opened_store() as store:
            assert blocked_partitions(store.list_latest(route.route)) == []
            state = store.load_source_state(route.route)
        assert state.pop("edge")["upto"] == state["watermark"]  # the edge record is the window's
        assert state == {
            "generation": 1,
            "watermark": 1_000_000 + ROWS,
            "definition": {
                "partition_column": "region",
                "cursor_column": "updated_at",
                "partition_kind": "text",
                "cursor_kind": "integer",
                "partition_by": "value",
                "partition_rows": None,
            },
        }


@pytest.mark.parametrize(
    ("kill_point", "verdict", "loaded"),
    [("target-after-commit", "applied", 0), ("target-before-commit", "not_applied", ROWS)],
)
def test_after_a_kill_verify_proves_the_batch_and_resolve_from_target_heals_it(
    tmp_path: Path, path: str, kill_point: str, verdict: str, loaded: int
) -> None:
    """The operator's commands, as the runbook gives them, after a real SIGKILL."""
    route = CrashRoute(tmp=tmp_path, store=f"sqlite:{tmp_path / 'checkpoints.db'}")
    build_sample_source(route.source_path, rows=ROWS, partitions=PARTITIONS)
    route.run_child(path, kill_point)
    route_file = write_route(tmp_path, path=path)
    script = str(Path(sys.executable).parent / "dpone-transfer")

    def dpone(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([script, *args], capture_output=True, text=True, timeout=120)

    verified = dpone("guard", "verify", str(route_file), "--json")
    assert verified.returncode == 3, verified.stderr
    [proof] = [json.loads(line) for line in verified.stdout.splitlines()]
    assert proof["proof"]["verdict"] == verdict
    assert len(proof["partition_ids"]) == PARTITIONS
    resolved = dpone(
        *("guard", "resolve", str(route_file), "--batch", proof["batch_id"], "--from-target"),
        *("--reason", "the ledger proves it", "--operator", "crash-matrix", "--yes"),
    )
    assert resolved.returncode == 0, resolved.stderr
    ran = dpone("run", str(route_file), "--quiet")
    assert ran.returncode == 0, ran.stderr
    assert f"loaded {loaded:,} rows" in ran.stdout
    assert_rows_exactly_once(route.source_ids(), route.target_ids())
