"""Hard-kill crash matrix: SIGKILL a real guarded transfer at every boundary, then recover.

For each kill point x path x target x store x recovery, a child process
(``tests/helpers/crash_child.py``, forked from an interpreter that imported it once:
``run_forked``) runs one transfer on real databases (a SQLite
source; a SQLite, DuckDB, PostgreSQL or ClickHouse (chDB) target) and SIGKILLs itself
at the kill point. This process then plays the scheduler: it runs the next attempt on the
same databases with a fresh runtime (guard from its entry point, target in a
RecordingSink).

- With ``recovery = "manual"`` (the default) the attempt either completes, or is
  blocked with ManualReconciliationRequired before the target is called; then it
  plays the operator of ``docs/checkpoints-and-recovery.md``: it counts each
  blocked partition's rows in the target and the source, checks that the target's
  ledger proves the same, records ``committed`` or ``failed_before_target`` with the
  guard's operator API, and lets the scheduler retry.
- With ``recovery = "from_target"`` no operator acts: every kill on the
  transactional targets leaves an outcome the target's ledger (and fence) proves,
  so the first attempt after the kill must complete, resolving what blocked it
  itself, with audit records naming ``dpone-transfer (automatic)``. ClickHouse
  writes its ledger row after the rows: there the rows, counted by their batch
  column (``target.batch_column``; a merge route's own), prove it. A kill whose
  outcome is truly unknown stays blocked: a route without the ledger
  (``test_without_the_ledger_from_target_leaves_a_kill_blocked``), and a
  ClickHouse append route on lazy-plan (which refuses a batch column), where the
  operator counts after a second blocked attempt.

After the kill and after every attempt the target must hold no row twice; at the
end it holds every source row exactly once. Zero duplicate rows is the only pass.
The matrix is reported by ``tests/helpers/crash_report.py``, with the kills that
healed by themselves per target.

The cut, for CI's time (measured in docs/reliability.md): every kill point x path
x recovery runs on the SQLite, DuckDB and PostgreSQL targets with the SQLite store,
and on the SQLite target with the PostgreSQL store too. On ClickHouse every kill
point runs on legacy (batch column) and lazy-plan (none); staged and file-artifact
run the two kills where they differ from legacy (extraction, which leaves their stage
or files behind, and their own target call, killed before its ledger row); the
guard's own kills do not depend on the path.

Merge routes (``test_hard_kill_of_a_merge_batch_then_retry_leaves_each_key_latest_version``)
run the kill points whose outcome the target decides, after a first whole run and a 1%
change of the source, on every path and target, ClickHouse (its merged view, ``FINAL``)
too: the target must hold the rows without the killed batch or with it, and after
recovery each key's latest source row, less deleted keys.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest
from helpers.crash_child import KILL_POINTS, open_store, run_forked, transfer_spec
from helpers.matrix_targets import CRASH_TARGET_KINDS, Place
from helpers.postgres_server import postgres_url
from helpers.routes import write_route

from dpone_native_transfer import ManualReconciliationRequired, RouteKey, TransferRuntime
from dpone_native_transfer.events import EventName
from dpone_native_transfer.lease import Lease, lease_key, read_holder
from dpone_native_transfer.recovery import AUTOMATIC_OPERATOR, Prover
from dpone_native_transfer.testing import (
    RecordingSink,
    assert_guard_registered,
    assert_no_duplicate_rows,
    assert_rows_exactly_once,
)
from dpone_target_commit_guard.policy import (
    Finding,
    Resolution,
    audit_record,
    blocked_partitions,
    resolution_batch,
    select_blocked,
)

if TYPE_CHECKING:  # imported by pytest as a plugin, so that its asserts are rewritten
    from helpers.crash_report import CrashMatrix, CrashRun

pytest_plugins = ["helpers.crash_report"]

ROWS, PARTITIONS = 2_000, 4
PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")
RECOVERIES = ("manual", "from_target")
MAX_ATTEMPTS = 3
LEASE_SECONDS = 600.0  # the killed child's lease outlives the test: the next attempt on this
# host takes it at once because the child is gone (ADR-0024), not because it expired
COMMITTED, NOT_THERE = Resolution.COMMITTED, Resolution.FAILED_BEFORE_TARGET
OPERATOR = "crash-matrix"
VERDICTS = {COMMITTED: "applied", NOT_THERE: "not_applied"}


@attrs.frozen
class Expected:
    """What the design guarantees for the attempts after a kill."""

    outcome: str  # the first manual attempt after the kill: "blocked" or "complete"
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
    # The engine rolls the open target transaction back: armed, and the rows are not there.
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


# ClickHouse (chDB) has no transaction: its "before the commit" kill falls after the rows and
# before the ledger row (``crash_child.py``), so the batch is in the target, which only the
# rows' batch column proves (a merge route's ``_dpone_batch``, an append's ``BATCH_COLUMN``).
CLICKHOUSE = {"target-before-commit": EXPECTED["target-after-commit"]}


def expected(kill_point: str, path: str, target: str = "sqlite") -> Expected:
    if kill_point == "extraction" and path == "lazy-plan":
        return LAZY_PLAN_EXTRACTION
    if target == "clickhouse":
        return CLICKHOUSE.get(kill_point, EXPECTED[kill_point])
    return EXPECTED[kill_point]


# ClickHouse's staged and file-artifact cells: the kills where the path decides what chDB does.
CLICKHOUSE_PATH_POINTS = ("extraction", "target-before-commit")


def cases() -> list[Any]:
    """Every kill point x path x recovery on every target with the SQLite store (ClickHouse:
    ``CLICKHOUSE_PATH_POINTS`` on staged and file-artifact); the SQLite target with the
    PostgreSQL store too."""
    made = []
    for target in CRASH_TARGET_KINDS:
        for store in ("sqlite", "postgres") if target == "sqlite" else ("sqlite",):
            for recovery in RECOVERIES:
                for path in PATHS:
                    cut = target == "clickhouse" and path in ("staged", "file-artifact")
                    for point in CLICKHOUSE_PATH_POINTS if cut else KILL_POINTS:
                        name = f"{point}-{path}-{target}-{store}-{recovery}"
                        made.append(pytest.param(point, path, target, store, recovery, id=name))
    return made


@attrs.frozen(kw_only=True)
class Attempt:
    """One automatic attempt, and what the operator then found and recorded if it was blocked;
    ``healed``: the blocked batches the attempt resolved itself (recovery = from_target)."""

    outcome: str
    target_calls: int
    run_id: str
    blocked: tuple[Finding, ...] = ()
    found: Mapping[str, Resolution] = attrs.field(factory=dict)
    healed: tuple[tuple[str, int], ...] = ()  # (verdict, partitions) per healed batch


@attrs.define(kw_only=True)
class CrashRoute:
    """The matrix's route in ``place``; ``store`` says how to open its store."""

    place: Place
    store: str
    tmp: Path
    ledger: bool = True
    # a merge route: the target's rows without and with the killed batch
    unmerged: list[tuple] = attrs.field(factory=list)
    merged: list[tuple] = attrs.field(factory=list)

    @property
    def route(self) -> RouteKey:
        return self.place.route

    @contextlib.contextmanager
    def opened_store(self) -> Iterator[Any]:
        store = open_store(self.store)
        try:
            yield store
        finally:
            store.close()

    def run_child(self, kill_point: str) -> None:
        """One transfer in a child process, which must die by SIGKILL at ``kill_point``."""
        marker, child_tmp = self.tmp / "killed-at", self.tmp / "child-tmp"
        child_tmp.mkdir()  # the child's work dir, left behind by the kill, stays under tmp
        case = {
            "place": self.place.as_dict(),
            "run_id": "run-1",
            "point": kill_point,
            "signal": "kill",
            "lease_seconds": LEASE_SECONDS,
            "ledger": self.ledger,
            "marker": str(marker),
        }
        output = self.tmp / "child-output"
        status = run_forked(
            ["--store", self.store, json.dumps(case)],
            {**os.environ, "TMPDIR": str(child_tmp)},
            output,
            timeout=120,
        )
        assert status == -signal.SIGKILL, (
            f"the child exited with {status}, not by SIGKILL:\n{output.read_text()[-3000:]}"
        )
        assert marker.is_file() and marker.read_text() == kill_point, (
            f"the child was killed, but not at {kill_point!r}"
        )

    def dead_childs_lease_is_taken_at_once(self) -> None:
        """The killed child held the target table's lease for a long while: on its host, its
        process being gone, the lease is taken at once (ADR-0024), with a higher epoch."""
        with self.opened_store() as store:
            table = store.lease_table()
            record = read_holder(table.holder(lease_key(self.route), time.time()))
            assert record is not None and record.process is not None and record.process.gone()
            with Lease(table, self.route, run_id="next", seconds=60) as lease:
                assert lease.epoch > record.epoch

    def attempt(self, run_id: str, recovery: str) -> Attempt:
        """The scheduler's next attempt: a fresh runtime, the guard from its entry point.

        On SQLite and DuckDB it names the target table as another spelling the engine
        resolves to the same table (issue 13.1: an append once dropped a table whose
        stored name differed in case), so every recovery also proves a respelt table is
        neither dropped nor taken for another route.
        """
        sink = RecordingSink(self.place.make_sink(self.place.respelt_target_table))
        spec = transfer_spec(
            self.place.make_source(),
            sink,
            path=self.place.path,
            run_id=run_id,
            recovery=recovery,
            ledger=self.ledger,
            **self.place.spec_options(),
        )
        with self.opened_store() as store:
            runtime = TransferRuntime(store)
            assert_guard_registered(runtime)
            try:
                result = runtime.run(spec)
            except ManualReconciliationRequired:
                assert sink.target_calls == 0, "the attempt was blocked only after the target call"
                return Attempt(outcome="blocked", target_calls=0, run_id=run_id)
        healed = tuple(
            (event.fields["verdict"], event.fields["partitions"])
            for event in result.events
            if event.name == EventName.GUARD_HEALED
        )
        outcome = "healed" if healed else "complete"
        calls = sink.target_calls
        return Attempt(outcome=outcome, target_calls=calls, run_id=run_id, healed=healed)

    def reconcile(self, attempt: Attempt) -> Attempt:
        """The runbook: what the target's ledger proves (``guard verify``), checked against a
        count of each blocked partition's rows, then recorded (``guard resolve``)."""
        with self.opened_store() as store:
            latest = store.list_latest(self.route)
            blocked = tuple(blocked_partitions(latest))
            bounds = {cp.partition_id: cp.partition_bounds for cp in latest}
            if self.place.merge:  # a merge batch's rows are no partition's: the rows, whole
                found = self.merge_holds(blocked)
            else:
                found = {f.partition_id: self.target_holds(bounds[f.partition_id]) for f in blocked}
            listed: set[str] = set()
            if self.ledger:
                listed = {entry.batch_id for entry in self.place.make_sink().read_ledger()}
                proven = self.proven(latest, blocked, listed)
                if not self.place.proves_every_kill:  # where it proves nothing, the count decides
                    proven = {pid: proven[pid] or found[pid] for pid in found}
                assert proven == found, "the ledger's proof and the row count disagree"
            for resolved_as in set(found.values()):
                ids = [pid for pid, holds in found.items() if holds is resolved_as]
                unlisted = {f.batch_id for f in blocked if f.partition_id in ids} - listed
                against = sorted(unlisted) if resolved_as is COMMITTED and self.ledger else []
                resolve(store, self.route, ids, resolved_as, overrides=against)
        return attrs.evolve(attempt, blocked=blocked, found=found)

    def proven(
        self, latest: list[Any], blocked: tuple[Finding, ...], listed: set[str]
    ) -> dict[str, Resolution | None]:
        """What the target proves of each blocked partition: the ledger holds its batch
        (``listed``) or not; where the ledger row follows the rows (ClickHouse), what ``guard
        verify`` reads (``Prover``: the ledger, and the rows counted by their batch column),
        None for a batch it cannot prove."""
        sink = self.place.make_sink()
        if sink.features.ledger_atomic:
            found = {f.partition_id: f.batch_id in listed for f in blocked}
            return {pid: COMMITTED if held else NOT_THERE for pid, held in found.items()}
        column = self.place.spec_options().get("batch_column")
        prover, verdicts = Prover(sink, batch_column=column), {v: r for r, v in VERDICTS.items()}
        proven: dict[str, Resolution | None] = {}
        for batch_id in {f.batch_id for f in blocked}:
            ids = {f.partition_id for f in blocked if f.batch_id == batch_id}
            checkpoints = [cp for cp in latest if cp.partition_id in ids]
            verdict = prover.prove(self.route, batch_id, checkpoints).verdict
            proven.update(dict.fromkeys(ids, verdicts.get(verdict)))
        return proven

    def target_holds(self, bounds: Mapping[str, Any]) -> Resolution:
        """``committed`` if the target holds every source row of ``bounds``, once;
        ``failed_before_target`` if it holds none. Anything else needs a repair first."""
        in_source = self.place.source_partition_ids(bounds)
        in_target = self.place.target_partition_ids(bounds)
        assert len(in_target) == len(set(in_target)), f"partition {bounds} has rows twice"
        assert len(in_target) in (0, len(in_source)), (
            f"the target holds {len(in_target)} of the {len(in_source)} rows of {bounds}: "
            "a partial load"
        )
        return COMMITTED if in_target else NOT_THERE

    def merge_holds(self, blocked: tuple[Finding, ...]) -> dict[str, Resolution]:
        """A merge route's count: the target holds either the rows without the blocked batch
        (not applied) or with it (applied), never a mix."""
        held = self.place.target_rows()
        assert held in (self.unmerged, self.merged), "the target holds part of a merge batch"
        return {f.partition_id: COMMITTED if held == self.merged else NOT_THERE for f in blocked}

    def check_target(self, row: CrashRun) -> None:
        """No row twice and no foreign row; the report keeps the worst duplicate count seen."""
        target = self.place.target_ids()
        row.duplicates = max(row.duplicates or 0, len(target) - len(set(target)))
        row.target_rows = len(target)
        assert_no_duplicate_rows(self.place.source_ids(), target)


def resolve(
    store: Any,
    route: RouteKey,
    partition_ids: list[str],
    resolved_as: Resolution,
    *,
    overrides: list[str] | None = None,
) -> None:
    """What ``dpone-transfer guard resolve --partition ... --as ... --yes`` writes, on any store;
    ``overrides``: the batches it records against the target's ledger (committed, which the
    ledger does not hold)."""
    selected = select_blocked(store.list_latest(route), partition_ids=partition_ids)
    now = datetime.now(UTC)
    resolved = resolution_batch(selected, resolved_as, now)
    audit = audit_record(
        route,
        selected,
        resolved,
        resolved_as=resolved_as,
        operator=OPERATOR,
        reason="counted the partition's rows in the target against the source",
        now=now,
        overrides=overrides or (),
    )
    store.apply_resolution(route, resolved, audit)


@pytest.fixture
def crash_route(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """``make(path, target, store)``: the case's route; a PostgreSQL target gets a schema of
    its own (dropped after), a PostgreSQL store one too (``postgres_schema``)."""
    made: list[Place] = []

    def make(
        path: str,
        target: str = "sqlite",
        store: str = "sqlite",
        *,
        merge: bool = False,
        composite: bool = False,
    ) -> CrashRoute:
        url = schema = None
        if target == "postgres":
            url = postgres_url(request.getfixturevalue("postgres_dsn"))
            schema = f"crash_{os.urandom(6).hex()}"
        folder = str(tmp_path)
        place = Place(
            target=target,
            path=path,
            folder=folder,
            url=url,
            schema=schema,
            merge=merge,
            composite=composite,
        )
        made.append(place)
        place.build_source(rows=ROWS, partitions=PARTITIONS)
        if merge:
            place.add_deleted_column()
        if store == "postgres":  # asked for only here, so SQLite runs start no server
            location = request.getfixturevalue("postgres_schema")
            choice = f"postgres:{location.dsn}:{location.schema}"
        else:
            choice = f"sqlite:{tmp_path / 'checkpoints.db'}"
        return CrashRoute(place=place, store=choice, tmp=tmp_path)

    yield make
    for place in made:
        place.drop_postgres_schema()


def recover(route: CrashRoute, recovery: str, row: CrashRun) -> list[Attempt]:
    """Attempts until one completes (at most MAX_ATTEMPTS); with manual recovery the operator
    acts after a block, and under from_target after a second one where the target cannot
    prove every kill (``Place.proves_every_kill``).

    The target is checked for duplicates after every attempt; ``row`` is filled as we go,
    so a failing run still shows how far it got.
    """
    route.dead_childs_lease_is_taken_at_once()
    attempts: list[Attempt] = []
    for number in range(1, MAX_ATTEMPTS + 1):
        attempt = route.attempt(f"retry-{number}", recovery)
        route.check_target(row)
        unproven = not route.place.proves_every_kill and number > 1
        if attempt.outcome == "blocked" and (recovery == "manual" or unproven):
            attempt = route.reconcile(attempt)
            row.operator_steps += 1
        if number == 1:
            row.outcome = attempt.outcome
            row.blocked_by, row.resolved_as = describe_block(attempt)
            row.healed = _counted([v for v, n in attempt.healed for _ in range(n)])
        attempts.append(attempt)
        row.attempts = len(attempts)
        if attempt.outcome != "blocked":
            break
    return attempts


def describe_block(attempt: Attempt) -> tuple[str, str]:
    """Report cells: the phases that blocked, and what the operator found."""
    phases = sorted(finding.guard_label() for finding in attempt.blocked)
    found = sorted(resolution.value for resolution in attempt.found.values())
    return _counted(phases), _counted(found)


def _counted(values: list[str]) -> str:
    return ", ".join(f"{values.count(value)} {value}" for value in sorted(set(values))) or "-"


def check_recovery(
    route: CrashRoute, want: Expected, recovery: str, attempts: list[Attempt], row: CrashRun
) -> None:
    """What the design guarantees for the attempts after a kill: under manual recovery,
    blocked exactly when an armed batch is left, then complete once the operator recorded
    what the target holds; under from_target, the first attempt resolves what the ledger
    proves itself and completes, audited as dpone's."""
    first = attempts[0]
    with route.opened_store() as store:
        audits = store.list_audit(route.route)
    if recovery == "manual":
        assert first.outcome == want.outcome
        if want.outcome == "blocked":
            labels = [finding.guard_label() for finding in first.blocked]
            assert labels == ["armed"] * want.blocked
            assert set(first.found.values()) == {want.found}
            assert [attempt.outcome for attempt in attempts[1:]] == ["complete"]
        assert {audit["operator"] for audit in audits} <= {OPERATOR}
    elif not route.place.proves_every_kill:
        # nothing proves what the kill left: blocked, again, until a person counted
        outcomes = ["blocked", "blocked", "complete"] if want.outcome == "blocked" else ["complete"]
        assert [attempt.outcome for attempt in attempts] == outcomes
        assert {audit["operator"] for audit in audits} <= {OPERATOR}
    else:
        # no operator: the first attempt resolves what the target proves, and completes
        assert len(attempts) == 1 and row.operator_steps == 0
        if want.outcome == "blocked":
            assert first.outcome == "healed"
            assert first.healed == ((VERDICTS[want.found], want.blocked),)
            [audit] = audits
            assert audit["operator"] == AUTOMATIC_OPERATOR
            assert audit["run_id"] == first.run_id
            assert len(audit["partitions"]) == want.blocked
            [proof] = audit["proof"].values()
            assert proof["verdict"] == VERDICTS[want.found] and proof["heals"] is True
        else:
            assert first.outcome == "complete" and audits == []


@pytest.mark.parametrize(("kill_point", "path", "target", "store_kind", "recovery"), cases())
def test_hard_kill_then_automatic_retry_never_duplicates(
    kill_point: str,
    path: str,
    target: str,
    store_kind: str,
    recovery: str,
    crash_route: Any,
    crash_matrix: CrashMatrix,
) -> None:
    route = crash_route(path, target, store_kind)
    want = expected(kill_point, path, target)
    with crash_matrix.run(kill_point, path, target, store_kind, recovery) as row:
        route.run_child(kill_point)
        if kill_point == "target-before-commit" and target == "sqlite":
            journal = route.place.target_path.with_name(route.place.target_path.name + "-journal")
            assert journal.stat().st_size > 0, "the kill must leave the target transaction open"
        route.check_target(row)

        attempts = recover(route, recovery, row)
        last = attempts[-1]
        check_recovery(route, want, recovery, attempts, row)
        assert last.target_calls == want.target_calls

        # the route is whole: every row exactly once, no guard left, the generation closed
        assert row.duplicates == 0
        assert_rows_exactly_once(route.place.source_ids(), route.place.target_ids())
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


@pytest.mark.parametrize("kill_point", ["target-before-commit", "target-after-commit"])
def test_without_the_ledger_from_target_leaves_a_kill_blocked(
    kill_point: str, crash_route: Any
) -> None:
    """A route without the target's ledger: after a kill inside or right after the target
    call nothing proves what the target holds, so a from_target retry stays blocked, resolves
    nothing, and a person decides (here by counting rows), as with manual recovery."""
    route = crash_route("legacy")
    route.ledger = False
    route.run_child(kill_point)
    route.dead_childs_lease_is_taken_at_once()
    for number in (1, 2):
        blocked = route.attempt(f"retry-{number}", "from_target")
        assert blocked.outcome == "blocked" and blocked.target_calls == 0
    with route.opened_store() as store:
        assert store.list_audit(route.route) == []
    found = route.reconcile(blocked).found
    assert set(found.values()) == {COMMITTED if kill_point == "target-after-commit" else NOT_THERE}
    done = route.attempt("retry-3", "from_target")
    assert done.outcome == "complete"
    assert_rows_exactly_once(route.place.source_ids(), route.place.target_ids())


def _dpone(*args: str) -> subprocess.CompletedProcess[str]:
    """``dpone-transfer`` of this venv, as an operator runs it."""
    script = str(Path(sys.executable).parent / "dpone-transfer")
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=120)


def _verified(route_file: Path) -> dict[str, Any]:
    """``guard verify --json`` of a blocked route (exit 3): its one batch's proof."""
    verified = _dpone("guard", "verify", str(route_file), "--json")
    assert verified.returncode == 3, verified.stderr
    [proof] = [json.loads(line) for line in verified.stdout.splitlines()]
    return proof


@pytest.mark.parametrize(
    ("kill_point", "verdict", "loaded"),
    [("target-after-commit", "applied", 0), ("target-before-commit", "not_applied", ROWS)],
)
def test_after_a_kill_verify_proves_the_batch_and_resolve_from_target_heals_it(
    tmp_path: Path, path: str, kill_point: str, verdict: str, loaded: int, crash_route: Any
) -> None:
    """The operator's commands, as the runbook gives them, after a real SIGKILL."""
    route = crash_route(path)
    route.run_child(kill_point)
    route_file = write_route(tmp_path, path=path)
    proof = _verified(route_file)
    assert proof["proof"]["verdict"] == verdict
    assert len(proof["partition_ids"]) == PARTITIONS
    resolved = _dpone(
        *("guard", "resolve", str(route_file), "--batch", proof["batch_id"], "--from-target"),
        *("--reason", "the ledger proves it", "--operator", "crash-matrix", "--yes"),
    )
    assert resolved.returncode == 0, resolved.stderr
    ran = _dpone("run", str(route_file), "--quiet")
    assert ran.returncode == 0, ran.stderr
    assert f"loaded {loaded:,} rows" in ran.stdout
    assert_rows_exactly_once(route.place.source_ids(), route.place.target_ids())


def test_a_clickhouse_batch_nothing_proves_is_counted_resolved_committed_and_the_route_goes_on(
    tmp_path: Path, crash_route: Any
) -> None:
    """ClickHouse writes its ledger row after the rows. Killed between them on lazy-plan (no
    batch column there), nothing proves the batch: ``verify`` says unknown, a from_target run
    stays blocked, and the operator counts the rows and resolves ``--as committed``. The next
    run must go on and load nothing. Every run refused it (the store ahead of the ledger),
    and ``state restore``, the advice, refuses too (2,000 rows, none in the ledger) unless
    told ``--ignore-row-count``, which would load the batch again."""
    route = crash_route("lazy-plan", "clickhouse")
    route.run_child("target-before-commit")
    assert_rows_exactly_once(route.place.source_ids(), route.place.target_ids())  # applied
    route_file = tmp_path / "route.toml"
    store = route.store.removeprefix("sqlite:")
    text = route.place.route_text(store=store, chunk_rows=100, lease_seconds=LEASE_SECONDS)
    route_file.write_text(text)
    proof = _verified(route_file)
    assert proof["proof"]["verdict"] == "unknown"
    blocked = _dpone("run", str(route_file), "--recovery", "from_target")
    assert blocked.returncode == 3, blocked.stderr
    resolved = _dpone(
        *("guard", "resolve", str(route_file), "--batch", proof["batch_id"], "--as", "committed"),
        *("--reason", "counted every partition's rows", "--operator", "crash-matrix", "--yes"),
    )
    assert resolved.returncode == 0, resolved.stderr
    ran = _dpone("run", str(route_file), "--quiet")
    assert ran.returncode == 0, ran.stderr
    assert "loaded 0 rows" in ran.stdout
    assert_rows_exactly_once(route.place.source_ids(), route.place.target_ids())


# The merge routes: a whole first run, then 1% of the keys changed (updates, a key moving
# partition, deletes, new keys) and the run that merges them killed, at every kill point
# where the outcome changes: before anything is armed, around the target's commit, the
# guard's own writes around it, and after the evidence. On every path and target; lazy-plan
# carries a merge route's rows as legacy does (``paths/lazy_plan.py``), so its cases run the
# composite key (``tenant``, ``id``), with more updates and deletes between the kill and the
# next attempt. A kill that leaves nothing armed never consults the recovery setting: it
# runs once, under from_target (which must then heal nothing).
MERGE_POINTS = ("extraction", "after-armed-batch", "target-before-commit",
                "target-after-commit", "promotion-partial", "after-evidence")  # fmt: skip
COMPOSITE_PATH = "lazy-plan"


def merge_cases() -> list[Any]:
    return [
        pytest.param(point, path, target, recovery, id=f"{point}-{path}-{target}-{recovery}")
        for target in CRASH_TARGET_KINDS
        for path in PATHS
        for point in MERGE_POINTS
        for recovery in (RECOVERIES if EXPECTED[point].outcome == "blocked" else RECOVERIES[1:])
    ]


@pytest.mark.parametrize(("kill_point", "path", "target", "recovery"), merge_cases())
def test_hard_kill_of_a_merge_batch_then_retry_leaves_each_key_latest_version(
    kill_point: str,
    path: str,
    target: str,
    recovery: str,
    crash_route: Any,
    crash_matrix: CrashMatrix,
) -> None:
    """After the kill the target holds the rows without the batch or with it, never part;
    blocked exactly when the kill leaves an armed batch, under manual recovery; healed by
    itself under from_target; after recovery it is the source's latest version of every key,
    less the deleted ones, row by row, with no key twice."""
    composite = path == COMPOSITE_PATH
    route = crash_route(path, target, merge=True, composite=composite)
    want = expected(kill_point, "legacy", target)  # no plan is handed over: rows are carried
    first = route.attempt("run-0", recovery)
    assert first.outcome == "complete"
    route.unmerged = route.place.target_rows()
    assert route.unmerged == route.place.merged_rows() and len(route.unmerged) == ROWS
    before = route.place.top_cursor()
    route.place.change_source(every=100)  # 20 updates, 20 deletes, 20 new keys
    route.merged = route.place.merged_rows()
    assert route.merged != route.unmerged
    shape = f"merge {path}" + (" (tenant, id)" if composite else "")
    with crash_matrix.run(kill_point, shape, target, "sqlite", recovery) as row:
        route.run_child(kill_point)
        applied = want.target_calls == 0  # the killed run's batch is in the target
        assert route.place.target_rows() == (route.merged if applied else route.unmerged)
        # what the attempts after it leave: the killed run's window (a run that left nothing
        # is run again whole), then each key's latest row
        window = route.merged
        if composite:  # more changes before the next attempt, to keys the batch changed
            upto = route.place.top_cursor()
            route.place.change_source(every=200)
            if not applied:  # the batch's window, retried, reads the source as it is now
                window = route.place.window_merged(route.unmerged, after=before, upto=upto)
        latest = route.place.merged_rows()
        if kill_point == "extraction":
            window = latest
        attempts = recover(route, recovery, row)
        last = attempts[-1]
        check_recovery(route, want, recovery, attempts, row)
        assert last.target_calls == want.target_calls  # a batch held is not applied again
        assert row.duplicates == 0
        assert route.place.target_rows() == window
        with route.opened_store() as store:
            assert blocked_partitions(store.list_latest(route.route)) == []
        again = route.attempt("after", recovery)  # what changed since, if anything
        assert again.outcome == "complete" and again.target_calls == int(window != latest)
        assert route.place.target_rows() == latest
