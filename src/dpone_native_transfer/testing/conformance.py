"""The guard conformance kit: prove a new transfer path is guarded like the built-in four.

A connector author subclasses :class:`GuardConformance`, names the path and
returns its callable from the ``transfer_path`` fixture::

    class TestBulkCopyPath(GuardConformance):
        path_name = "bulk-copy"

        @pytest.fixture
        def transfer_path(self):
            return bulk_copy_path

Every ``test_*`` method then runs one guard scenario (its docstring says what
it proves) on real parts: a SQLite source, the author's sink (a SQLite sink by
default) wrapped in :class:`~.faults.RecordingSink`, a SQLite checkpoint store
wrapped in :class:`~.faults.FaultyStore`, and a :class:`~.faults.StepClock`.
The runtime gets the path through ``paths=`` and the guard through its entry
point, as in production. Override ``make_sink`` (and ``target_ids``) to run the
kit on a sink of your own database.

This module imports pytest; the runtime never imports it.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

import attrs
import pytest

from ..checkpoints import PartitionCheckpoint, PartitionCheckpointStatus
from ..connectors import SQLiteSink, SQLiteSource
from ..connectors.contract import Sink, Source
from ..connectors.contract.engine import EnginePull
from ..errors import GovernanceGateFailed, ManualReconciliationRequired, StoreTargetMismatch
from ..paths import Governance, PathContext, TransferPath
from ..runtime import TransferResult, TransferRuntime, TransferSpec
from ..stores.memory import MemoryCheckpointStore
from ..stores.sqlite import SQLiteCheckpointStore
from .assertions import (
    assert_blocked_before_target,
    assert_event_order,
    assert_guard_registered,
    assert_no_duplicate_rows,
    assert_one_timestamp_per_batch,
    assert_raises_original,
    assert_rows_exactly_once,
    guard_phases,
)
from .contract import capabilities_of, contract_problems
from .faults import (
    FaultyStore,
    RecordingSink,
    StepClock,
    build_sample_source,
    guard_phase,
    phase_batch,
)

__all__ = ["ConformanceRoute", "GuardConformance"]

APPEND, FULL_REFRESH = "incremental_append", "full_refresh"
FAILED = PartitionCheckpointStatus.FAILED
INCOMPLETE = ["checkpoint_incomplete"]
MANUAL_RECONCILIATION = "native_transfer_manual_reconciliation_required"


@attrs.define(eq=False, kw_only=True)
class ConformanceRoute:
    """One route on real parts for one scenario, with the path under test registered by name."""

    path_name: str
    transfer_path: TransferPath
    source_path: Path
    source: SQLiteSource
    sink: RecordingSink
    store: FaultyStore
    clock: StepClock
    read_target_ids: Callable[[], list[Any]]
    chunk_rows: int
    ledger: bool = True
    path_runs: int = 0

    def runtime(self) -> TransferRuntime:
        """A runtime like production's: guard from the entry point, the path through ``paths=``."""
        runtime = TransferRuntime(
            self.store, clock=self.clock, paths={self.path_name: self._run_path}
        )
        assert_guard_registered(runtime)
        return runtime

    def _run_path(self, ctx: PathContext) -> int:
        self.path_runs += 1  # proves the runtime ran the path under test, not a built-in one
        return self.transfer_path(ctx)

    def spec(self, run_id: str = "run-1", *, strategy: str = APPEND, **kwargs: Any) -> TransferSpec:
        return TransferSpec(
            source=self.source,
            sink=self.sink,
            strategy=strategy,
            path=self.path_name,
            run_id=run_id,
            chunk_rows=self.chunk_rows,
            ledger=self.ledger,
            **kwargs,
        )

    def run(self, run_id: str = "run-1", **kwargs: Any) -> TransferResult:
        return self.runtime().run(self.spec(run_id, **kwargs))

    def latest(self, strategy: str = APPEND) -> list[PartitionCheckpoint]:
        """The durable checkpoints, read past the fault wrapper so no read fault is consumed."""
        return self.store.inner.list_latest(self.spec(strategy=strategy).route)

    def source_ids(self) -> list[Any]:
        with contextlib.closing(sqlite3.connect(self.source_path)) as connection:
            return [row[0] for row in connection.execute("SELECT id FROM orders")]

    def target_ids(self) -> list[Any]:
        return self.read_target_ids()

    def durable_batches_and_phases(self) -> tuple[int, list[str | None]]:
        """What is durable right now; the sink records it at the moment the target is called."""
        return len(self.store.batches), guard_phases(self.latest())


class GuardConformance:
    """The guard's scenarios, run against the path returned by ``transfer_path``.

    Subclass it as ``Test...``, set ``path_name`` to a name of your own and
    override the ``transfer_path`` fixture. The class attributes below size
    the sample route; the defaults keep the whole kit under a second per path.
    """

    path_name: ClassVar[str] = ""
    rows: ClassVar[int] = 120
    partitions: ClassVar[int] = 4
    chunk_rows: ClassVar[int] = 16
    ledger: ClassVar[bool] = True  # the target's ledger, when the sink keeps one

    @pytest.fixture
    def transfer_path(self) -> TransferPath:
        """The path callable under test; every subclass overrides this."""
        pytest.fail(f"{type(self).__name__} must override the transfer_path fixture", pytrace=False)

    @pytest.fixture
    def make_sink(self, tmp_path: Path) -> Any:
        """The real, unwrapped sink the path loads; override it for your database's sink."""
        return SQLiteSink(str(tmp_path / "target.db"), "orders_copy")

    @pytest.fixture
    def sink(self, make_sink: Any) -> RecordingSink:
        return RecordingSink(make_sink)

    @pytest.fixture
    def target_ids(self, sink: RecordingSink) -> Callable[[], list[Any]]:
        """Reads the ``id`` of every row now in the target; override it with ``make_sink``."""
        return lambda: [row[0] for row in sink.inner.rows()]

    @pytest.fixture
    def kit_route(
        self,
        tmp_path: Path,
        transfer_path: TransferPath,
        sink: RecordingSink,
        target_ids: Callable[[], list[Any]],
    ) -> Iterator[ConformanceRoute]:
        """A fresh route on real files under ``tmp_path``; its checkpoint store is closed after."""
        if not self.path_name:
            pytest.fail(f"{type(self).__name__} must set path_name", pytrace=False)
        source_path = tmp_path / "source.db"
        build_sample_source(source_path, rows=self.rows, partitions=self.partitions)
        real_store = SQLiteCheckpointStore(str(tmp_path / "checkpoints.db"))
        made = ConformanceRoute(
            path_name=self.path_name,
            transfer_path=transfer_path,
            source_path=source_path,
            source=SQLiteSource(str(source_path), "orders", "region", "updated_at"),
            sink=sink,
            store=FaultyStore(real_store),
            clock=StepClock(),
            read_target_ids=target_ids,
            chunk_rows=self.chunk_rows,
            ledger=self.ledger,
        )
        yield made
        real_store.close()

    def test_guard_plugin_comes_from_the_entry_point(self, kit_route: ConformanceRoute) -> None:
        """The guard is loaded from its entry point, not assumed: without it every other
        scenario would test the unguarded lifecycle."""
        assert_guard_registered(kit_route.runtime())

    def test_happy_run_arms_before_the_one_target_call(self, kit_route: ConformanceRoute) -> None:
        """Guard before target: when the one target call starts, the armed batch (and only it)
        is durable; the milestone events come in order; every source row lands once."""
        kit_route.sink.observe = kit_route.durable_batches_and_phases
        result = kit_route.run()
        expect("runs of the path under test", kit_route.path_runs, 1)
        assert_event_order(result.events)
        expect("committed partitions", len(result.committed_partition_ids), self.partitions)
        expect(
            "(durable checkpoint batches, guard phases) at each target call; exactly one batch, "
            "the armed one, must be durable when the target is called",
            kit_route.sink.observations,
            [(1, ["armed"] * self.partitions)],
        )
        assert_rows_exactly_once(kit_route.source_ids(), kit_route.target_ids())

    def test_partial_commit_reraises_original_and_blocks_retry(
        self, kit_route: ConformanceRoute
    ) -> None:
        """A commit batch written only in part: the checkpoint store's own exception is re-raised
        unchanged; the committed checkpoint stays committed (never downgraded); the others become
        FAILED / checkpoint_incomplete in one marker batch stamped once; and every
        incremental_append retry (three here, as an orchestrator's) stops before the target."""
        original = kit_route.store.fail_batch(phase_batch("checkpoint_committed"), keep=1)
        incomplete = INCOMPLETE * (self.partitions - 1)
        blocked = expect_failure_then_blocked_retry(
            kit_route, original, "upsert_many", ["checkpoint_committed", *incomplete]
        )
        expect("code of the blocked retry", blocked.code, MANUAL_RECONCILIATION)
        expect("phases the blocked retry names", blocked.diagnostics["phases"], INCOMPLETE[:1])
        for _ in range(2):
            assert_blocked_before_target(lambda: kit_route.run("retry"), kit_route.sink)
        latest = kit_route.latest()
        expect(
            "(status, guard phase) of the durable checkpoints",
            sorted((cp.status.value, guard_phase(cp)) for cp in latest),
            [("committed", "checkpoint_committed")]
            + [("failed", "checkpoint_incomplete")] * (self.partitions - 1),
        )
        expect(
            "error of the incomplete checkpoints",
            {cp.diagnostics.get("error") for cp in latest if cp.status is FAILED},
            {"checkpoint_commit_failed"},
        )
        markers = [b for b in kit_route.store.batches if guard_phases(b[:1]) == INCOMPLETE]
        sizes = [len(batch) for batch in markers]
        expect("sizes of the incomplete-marker batches", sizes, [len(incomplete)])
        assert_one_timestamp_per_batch(markers, kit_route.clock.reads)
        assert_rows_exactly_once(kit_route.source_ids(), kit_route.target_ids())

    def test_partial_commit_with_failed_reconciliation_read_keeps_armed_guards(
        self, kit_route: ConformanceRoute
    ) -> None:
        """A commit batch written only in part, then the read that reconciles it fails: the
        store's first exception is re-raised unchanged, the uncommitted partitions keep their
        durable armed guards, and those block the retry before the target."""
        original = kit_route.store.fail_batch(phase_batch("checkpoint_committed"), keep=1)
        kit_route.store.fail_reads(skip=2)  # the route scan reads; the reconciliation read fails
        armed = ["armed"] * (self.partitions - 1)
        expect_failure_then_blocked_retry(
            kit_route, original, "upsert_many", [*armed, "checkpoint_committed"]
        )
        assert_rows_exactly_once(kit_route.source_ids(), kit_route.target_ids())

    def test_partial_commit_with_failed_incomplete_marker_keeps_armed_guards(
        self, kit_route: ConformanceRoute
    ) -> None:
        """A commit batch written only in part (half of it), then the incomplete-marker write
        fails too: the store's first exception is re-raised unchanged, not the marker's; the
        uncommitted partitions keep their armed guards, which block the retry."""
        half = self.partitions // 2
        original = kit_route.store.fail_batch(phase_batch("checkpoint_committed"), keep=half)
        kit_route.store.fail_batch(phase_batch("checkpoint_incomplete"), error=OSError("marker"))
        armed = ["armed"] * (self.partitions - half)
        expect_failure_then_blocked_retry(
            kit_route, original, "upsert_many", [*armed, *["checkpoint_committed"] * half]
        )
        assert_rows_exactly_once(kit_route.source_ids(), kit_route.target_ids())

    def test_target_raising_before_applying_marks_outcome_unknown(
        self, kit_route: ConformanceRoute
    ) -> None:
        """The target call raises: its own exception object is re-raised with its traceback, and
        every partition becomes FAILED / target_outcome_unknown (error target_call_failed),
        which blocks the retry, although nothing reached the target."""
        kit_route.sink.fail = "before"
        unknown = ["target_outcome_unknown"] * self.partitions
        expect_failure_then_blocked_retry(kit_route, kit_route.sink.error, "target_call", unknown)
        expect(
            "error of the target_outcome_unknown checkpoints",
            {cp.diagnostics.get("error") for cp in kit_route.latest()},
            {"target_call_failed"},
        )
        expect("rows in the target", kit_route.target_ids(), [])

    def test_target_applying_then_raising_blocks_retry(self, kit_route: ConformanceRoute) -> None:
        """The target commits, then its call raises (dpone cannot know it committed): the
        outcome is unknown, and no retry may append the rows a second time."""
        kit_route.sink.fail = "after"
        unknown = ["target_outcome_unknown"] * self.partitions
        expect_failure_then_blocked_retry(kit_route, kit_route.sink.error, "target_call", unknown)
        assert_rows_exactly_once(kit_route.source_ids(), kit_route.target_ids())

    def test_partial_arm_never_calls_the_target_and_retry_succeeds(
        self, kit_route: ConformanceRoute
    ) -> None:
        """The armed batch is written only in part (half of it): the target is never called,
        the store's exception is re-raised unchanged, every partition becomes
        failed_before_target, and that is retryable: the retry loads every row once."""
        original = kit_route.store.fail_batch(phase_batch("armed"), keep=self.partitions // 2)
        assert_raises_original(original, kit_route.run, raised_in="upsert_many")
        expect("target calls without a durable guard", kit_route.sink.target_calls, 0)
        expect_phases(kit_route, ["failed_before_target"] * self.partitions)
        expect("rows in the target before the retry", kit_route.target_ids(), [])
        result = kit_route.run("retry")
        committed = len(result.committed_partition_ids)
        expect("partitions committed by the retry", committed, self.partitions)
        expect("target calls", kit_route.sink.target_calls, 1)
        assert_rows_exactly_once(kit_route.source_ids(), kit_route.target_ids())

    def test_each_checkpoint_batch_has_one_injected_timestamp(
        self, kit_route: ConformanceRoute
    ) -> None:
        """Each checkpoint batch reads the injected clock once: one transition time for the whole
        batch, armed before committed; a terminal checkpoint starts when it completes."""
        kit_route.run()
        batches = kit_route.store.batches
        expect(
            "guard phases of the checkpoint batches",
            [guard_phases(batch) for batch in batches],
            [["armed"] * self.partitions, ["checkpoint_committed"] * self.partitions],
        )
        assert_one_timestamp_per_batch(batches, kit_route.clock.reads)
        armed_at, committed_at = batches[0][0].started_at, batches[1][0].started_at
        ordered = armed_at is not None and committed_at is not None and armed_at < committed_at
        expect("armed before committed", ordered, True)
        expect(
            "completed_at of the durable checkpoints",
            {cp.completed_at for cp in kit_route.latest()},
            {batches[1][0].completed_at},
        )

    def test_rerun_after_success_calls_no_target(self, kit_route: ConformanceRoute) -> None:
        """Resume planning: a rerun with nothing new runs no path and loads nothing."""
        kit_route.run()
        batches = len(kit_route.store.batches)
        again = kit_route.run("run-2")
        expect("partitions committed by the rerun", again.committed_partition_ids, ())
        expect("rows loaded by the rerun", again.rows_loaded, 0)
        expect("runs of the path", kit_route.path_runs, 1)
        expect("target calls", kit_route.sink.target_calls, 1)
        expect("checkpoint batches after the rerun", len(kit_route.store.batches), batches)
        assert_rows_exactly_once(kit_route.source_ids(), kit_route.target_ids())

    def test_full_refresh_replaces_the_target(self, kit_route: ConformanceRoute) -> None:
        """Resume planning, full_refresh: each generation replaces the target as a whole."""
        kit_route.run(strategy=FULL_REFRESH)
        build_sample_source(kit_route.source_path, rows=10, start_id=self.rows + 1)
        second = kit_route.run("run-2", strategy=FULL_REFRESH)
        expect("target calls", kit_route.sink.target_calls, 2)
        expect("rows loaded by the second generation", second.rows_loaded, self.rows + 10)
        assert_rows_exactly_once(kit_route.source_ids(), kit_route.target_ids())

    def test_governance_gate_stops_before_the_target(self, kit_route: ConformanceRoute) -> None:
        """A governance gate that refuses the attempt stops it before the guard is armed: no
        checkpoint batch, no target call, no rows."""
        with pytest.raises(GovernanceGateFailed):
            kit_route.run(governance=Governance(max_rows=self.rows - 1))
        expect("target calls", kit_route.sink.target_calls, 0)
        expect("checkpoint batches of a refused attempt", kit_route.store.batches, [])
        expect("rows in the target", kit_route.target_ids(), [])

    # -- the target's ledger (sinks that keep one: ``SinkFeatures.keeps_ledger``) -------------

    def test_the_ledger_records_each_applied_batch_once(self, kit_route: ConformanceRoute) -> None:
        """The ledger row of a batch commits with its rows; a rerun with nothing new adds none."""
        sink = _ledger_sink(kit_route)
        first = kit_route.run()
        kit_route.run("run-2")
        entries = sink.read_ledger(partitions=True)
        expect("ledger batch ids", [e.batch_id for e in entries], [first.batch_id])
        expect("rows the ledger says were applied", entries[0].rows, first.rows_loaded)
        expect(
            "partitions the ledger lists",
            sorted(p.partition_id for p in entries[0].partitions),
            sorted(first.committed_partition_ids),
        )

    def test_a_target_call_that_raises_before_applying_leaves_no_ledger_row(
        self, kit_route: ConformanceRoute
    ) -> None:
        """Absence proves "not applied" only when the ledger row commits with the rows."""
        sink = _ledger_sink(kit_route)
        kit_route.sink.fail = "before"
        assert_raises_original(kit_route.sink.error, kit_route.run, raised_in="target_call")
        expect("ledger entries", sink.read_ledger(), [])

    def test_the_sink_counts_its_rows_for_the_ledger_checks(
        self, kit_route: ConformanceRoute
    ) -> None:
        """``row_count`` and ``is_empty`` tell a dropped or emptied table from a loaded one."""
        sink = _ledger_sink(kit_route)
        expect("is_empty before any load", sink.is_empty(), True)
        expect("row_count before any load", sink.row_count(), 0)
        first = kit_route.run()
        expect("is_empty after a load", sink.is_empty(), False)
        expect("row_count after a load", sink.row_count(), first.rows_loaded)

    def test_a_lost_store_is_refused_before_the_target(self, kit_route: ConformanceRoute) -> None:
        """A run whose store forgot the target's batches stops before reading the source."""
        _ledger_sink(kit_route)
        kit_route.run()
        build_sample_source(kit_route.source_path, rows=10, start_id=self.rows + 1)
        kit_route.store = FaultyStore(MemoryCheckpointStore())  # the store was lost: a new one
        with pytest.raises(StoreTargetMismatch) as refused:
            kit_route.run("run-2")
        expect("mismatch", refused.value.diagnostics["mismatch"], "target_ahead_of_store")
        expect("target calls", kit_route.sink.target_calls, 1)
        assert_no_duplicate_rows(kit_route.source_ids(), kit_route.target_ids())

    def test_the_connectors_meet_the_connector_contract(self, kit_route: ConformanceRoute) -> None:
        """The source is a ``Source``, the sink a ``Sink`` with its ``features``, its engine an
        ``EnginePull``, and each meets every part it claims (``connectors/contract/``) with
        the parameters the runtime passes."""
        source, sink = kit_route.source, kit_route.sink.inner
        expect("the source is a Source", isinstance(source, Source), True)
        expect("the sink is a Sink", isinstance(sink, Sink), True)
        engine = sink.engine()
        if engine is not None:
            expect("the engine is an EnginePull", isinstance(engine, EnginePull), True)
        problems = [
            problem
            for connector in {id(c): c for c in (source, sink, engine) if c is not None}.values()
            for protocol in capabilities_of(connector)
            for problem in contract_problems(connector, protocol)
        ]
        expect("connector contract problems", problems, [])


def _ledger_sink(route: ConformanceRoute) -> Any:
    """The sink, keeping the target's ledger; the ledger tests do not apply to one without."""
    if not (route.ledger and route.sink.inner.features.keeps_ledger):
        pytest.skip("the sink keeps no target ledger (or the kit runs with ledger = False)")
    return route.sink.inner


def expect(what: str, actual: Any, expected: Any) -> None:
    """``assert actual == expected`` with a message that survives without assert rewriting."""
    if actual != expected:
        raise AssertionError(f"{what}: expected {expected!r}, got {actual!r}")


def expect_phases(route: ConformanceRoute, expected: Sequence[str | None]) -> None:
    actual = guard_phases(route.latest())
    expect("guard phases of the durable checkpoints", actual, sorted(expected, key=str))


def expect_failure_then_blocked_retry(
    route: ConformanceRoute, original: BaseException, raised_in: str, phases: list[str]
) -> ManualReconciliationRequired:
    """The run re-raises ``original`` after its one target call and leaves ``phases`` durable;
    a retry (with the injected target fault cleared, as after a restart) stops before the
    target, adding no rows. Returns the retry's error."""
    assert_raises_original(original, route.run, raised_in=raised_in)
    expect_phases(route, phases)
    expect("target calls of the failed run", route.sink.target_calls, 1)
    route.sink.fail = None
    blocked = assert_blocked_before_target(lambda: route.run("retry"), route.sink)
    assert_no_duplicate_rows(route.source_ids(), route.target_ids())
    return blocked
