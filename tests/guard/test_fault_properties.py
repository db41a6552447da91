"""Exhaustive fault injection: a hypothesis state machine over real SQLite files.

Each example draws a route (path, strategy, partition count, row count; a merge
route's target: SQLite, DuckDB, PostgreSQL or ClickHouse (chDB, read through its
merged view, ``FINAL``), the others' SQLite) and
then a sequence of steps: attempts, each after 0-40 new source rows and with
at most one injected fault (plus, for faults that trigger a best-effort
marker or a reconciliation read, optionally a second fault in that follow-up
write or read), and operator resolutions done the way ``guard resolve`` does
them, after the target was inspected. After every step it checks the guard's
promises:

- the target never holds a row twice, nor a row the source does not have;
- an attempt that raises surfaces the injected object itself, with the
  injection site in its traceback, or, when the route was already blocked,
  ``ManualReconciliationRequired`` without any target call or store write;
- a blocked route stays blocked, with the same findings, until a resolve;
- every checkpoint batch is stamped with one reading of the injected clock
  (terminal checkpoints: ``started_at == completed_at``);
- (incremental_append) a checkpoint the planner would retry never covers rows
  the target already holds, and a committed one covers rows it holds once;
- a successful attempt leaves the target equal to the source up to the
  advanced watermark (full_refresh: equal to the source it just loaded; merge: each
  key whose source row is at or below the watermark holds exactly it, or nothing if it
  deletes; a key changed again since holds nothing or one of its earlier versions, from a
  log of every version the source ever held, kept by the test);
- (merge) a blocked batch's target holds the rows with it or without it, never part.

A merge route's source changes between runs too: a quarter of the arriving count updates
live keys, an eighth deletes them (``gone``), each at a new cursor value.

At the end of every example the route is resolved if blocked and driven to
completion with clean retries: the target must then hold every source row
exactly once. Merge routes are drawn among the others, and also run on their own into
each target (``test_merge_routes_under_faults_on_each_target``), so that every target is
covered whatever the draws.

The default profile is deterministic (``derandomize``) and fast enough for
``make test``. ``DPONE_SOAK=1`` selects the soak profile: random seeds, more
and longer examples (``DPONE_SOAK_EXAMPLES`` overrides the example count)::

    DPONE_SOAK=1 .venv/bin/python -m pytest tests/guard/test_fault_properties.py -q

The figures of the run (examples, steps, attempts, distinct fault points,
blocked routes, resolves, duplicates) are printed in pytest's terminal
summary and written to ``reports/fault-properties.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import tempfile
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers.postgres_server import postgres_url
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from dpone_native_transfer import (
    ClickHouseSink,
    DuckDBSink,
    ManualReconciliationRequired,
    PartitionCheckpointStatus,
    PostgresSink,
    RouteKey,
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferResult,
    TransferRuntime,
    TransferSpec,
    entry_point_plugins,
    hookimpl,
)
from dpone_native_transfer.spec import route_key
from dpone_native_transfer.testing import (
    FaultyStore,
    InjectedFault,
    RecordingSink,
    StepClock,
    assert_event_order,
    assert_one_timestamp_per_batch,
    assert_rows_exactly_once,
    build_sample_source,
    phase_batch,
)
from dpone_target_commit_guard.policy import (
    Resolution,
    audit_record,
    blocked_partitions,
    inspect_checkpoint,
    resolution_batch,
    select_blocked,
)

PATHS = ("legacy", "staged", "file-artifact", "lazy-plan")
STRATEGIES = ("incremental_append", "full_refresh", "merge")
TARGETS = ("sqlite", "duckdb", "postgres", "clickhouse")  # a merge route's; others: SQLite
POSTGRES: dict[str, str] = {}  # "url": the session's server (set by the test, from its fixture)
SOURCE_TABLE, TARGET_TABLE = "orders", "orders_copy"
COMMITTED = PartitionCheckpointStatus.COMMITTED

# -- profiles ------------------------------------------------------------------------------

settings.register_profile(
    "dpone-faults",
    max_examples=60,
    stateful_step_count=10,
    deadline=None,
    derandomize=True,  # the same examples on every CI run
    database=None,  # no .hypothesis/ folder in the work tree
)
settings.register_profile(
    "dpone-faults-soak",
    max_examples=int(os.environ.get("DPONE_SOAK_EXAMPLES", "2000")),
    stateful_step_count=20,
    deadline=None,
    derandomize=False,
    database=None,
    print_blob=True,  # a failure prints the @reproduce_failure blob to replay it
)
SOAK = os.environ.get("DPONE_SOAK") == "1"
PROFILE = "dpone-faults-soak" if SOAK else "dpone-faults"

# -- figures of the run --------------------------------------------------------------------

STATS: Counter[str] = Counter()
FAULT_POINTS: set[str] = set()
ROUTE_SHAPES: set[tuple[str, str]] = set()
MERGE_TARGETS: set[str] = set()
FORCED_MERGE: dict[str, str] = {}  # "engine": every route a merge route into it (see below)
MERGE_EXAMPLES = 8  # of each target's own run
HOSTILE = ("none", "listener", "plugin")
HOSTILE_SEEN: set[str] = set()


class AnswersFirst:
    """A third-party plugin whose after-call hooks answer before the guard's (issue 13.8)."""

    @hookimpl(tryfirst=True)
    def after_target_success(self, mutation, result):
        return "answered first"

    @hookimpl(tryfirst=True)
    def on_target_error(self, mutation, error):
        return "answered first"


def _raising_listener(event: Any) -> None:
    raise RuntimeError("a hostile progress listener")


# -- faults ---------------------------------------------------------------------------------


@attrs.frozen
class Fault:
    """One injected fault, and optionally one more in the write or read it triggers.

    kind/where: ``none``; ``write`` armed | checkpoint_committed (``keep``
    checkpoints of the batch are durable, then it raises); ``read`` scan (the
    route scan's read); ``sink`` before | after (the target call raises
    before it applies, or after it committed); ``state`` evidence |
    source_state. ``secondary`` is a marker batch (failed_before_target,
    target_outcome_unknown, checkpoint_incomplete, written with
    ``secondary_keep`` durable) or ``reconcile_read`` (the read after a
    partial commit).
    """

    kind: str
    where: str = ""
    keep: int = 0
    secondary: str | None = None
    secondary_keep: int = 0


KEEP = st.integers(0, 6)  # clamped to the batch size; keep == size: all durable, then it raises


def _faults() -> st.SearchStrategy[Fault]:
    def write(where: str, secondaries: tuple[str | None, ...]) -> st.SearchStrategy[Fault]:
        return st.builds(
            Fault,
            kind=st.just("write"),
            where=st.just(where),
            keep=KEEP,
            secondary=st.sampled_from(secondaries),
            secondary_keep=KEEP,
        )

    return st.one_of(
        st.just(Fault("none")),
        write("armed", (None, "failed_before_target")),
        write("checkpoint_committed", (None, "checkpoint_incomplete", "reconcile_read")),
        st.just(Fault("read", "scan")),
        st.builds(
            Fault,
            kind=st.just("sink"),
            where=st.sampled_from(["before", "after"]),
            secondary=st.sampled_from([None, "target_outcome_unknown"]),
            secondary_keep=KEEP,
        ),
        st.builds(
            Fault, kind=st.just("state"), where=st.sampled_from(["evidence", "source_state"])
        ),
    )


FAULTS = _faults()

# Where the injected error must still be raised from: proof its traceback was kept.
INJECTION_SITE = {
    "write": "upsert_many",
    "read": "list_target_latest",  # a run's first read: the route scan over the target table
    "sink": "target_call",
    "state": {"evidence": "record_evidence", "source_state": "save_source_state"},
}
PRIMARY_POINTS = {
    "write:armed",
    "write:checkpoint_committed",
    "read:scan",
    "sink:before",
    "sink:after",
    "state:evidence",
    "state:source_state",
}
SECONDARY_ERROR = "secondary fault: must never surface"


@attrs.define
class Probe:
    """Whether a planned batch fault fired, and on how many checkpoints."""

    fired: bool = False
    size: int = 0

    def matcher(self, phase: str):
        matches = phase_batch(phase)

        def probe(batch) -> bool:
            if matches(batch):
                self.fired, self.size = True, len(batch)
                return True
            return False

        return probe


class ProbedStore(FaultyStore):
    """FaultyStore that also counts the calls, so a test knows which planned fault fired."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()

    def list_latest(self, route: RouteKey):
        self.calls["list_latest"] += 1
        return super().list_latest(route)

    def record_evidence(
        self, route: RouteKey, run_id: str, record: dict[str, Any], **held: Any
    ) -> None:
        self.calls["evidence"] += 1
        super().record_evidence(route, run_id, record, **held)

    def save_source_state(self, route: RouteKey, state: dict[str, Any], **held: Any) -> None:
        self.calls["source_state"] += 1
        super().save_source_state(route, state, **held)


@attrs.define
class Armed:
    """The faults planned on one attempt: the primary error object and the probes."""

    primary: BaseException | None = None
    write: Probe = attrs.field(factory=Probe)
    marker: Probe = attrs.field(factory=Probe)


def traceback_functions(error: BaseException) -> set[str]:
    names, tb = set(), error.__traceback__
    while tb is not None:
        names.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


# -- the machine ----------------------------------------------------------------------------


class FaultMachine(RuleBasedStateMachine):
    """One route on real files in a private temp folder; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="dpone-fault-props-"))
        self.real_store: SQLiteCheckpointStore | None = None
        self.batches: list[tuple] = []
        self.checked_batches = 0
        self.attempts = 0
        self.blocked = False
        self.retried_while_blocked = False
        self.in_step = False  # True while a step runs: a failed step skips the final drain
        self.versions: list[tuple] = []  # merge: every (id, region, amount, updated_at, gone)
        self.unapplied: list[tuple] = []  # merge: the target's rows before the blocked batch
        self.target, self.schema = "sqlite", ""
        STATS["examples"] += 1

    # set-up ----------------------------------------------------------------------------

    @initialize(
        path=st.sampled_from(PATHS),
        # incremental_append twice as often: it is where a retry can append twice
        strategy=st.sampled_from(("incremental_append", *STRATEGIES)),
        partitions=st.integers(1, 6),
        rows=st.integers(0, 200),
        hostile=st.sampled_from(HOSTILE),
        engine=st.sampled_from(TARGETS),
    )
    def build_route(
        self, path: str, strategy: str, partitions: int, rows: int, hostile: str, engine: str
    ) -> None:
        if FORCED_MERGE:  # a run of merge routes into one target (test_merge_routes_...)
            strategy, engine = "merge", FORCED_MERGE["engine"]
        self.path, self.strategy = path, strategy
        ROUTE_SHAPES.add((path, strategy))
        if strategy == "merge":
            self.target = engine
            MERGE_TARGETS.add(engine)
            STATS[f"merge_examples:{engine}"] += 1
        HOSTILE_SEEN.add(hostile)
        # Issue 13.8, kept under faults: a listener that raises on every event, or a
        # third-party plugin answering the after-call hooks before the guard, changes nothing.
        self.runtime_options: dict[str, Any] = {
            "none": {},
            "listener": {"events": _raising_listener},
            "plugin": {"plugins": [*entry_point_plugins(), AnswersFirst()]},
        }[hostile]
        self.source_path = self.tmp / "source.db"
        self.target_path = self.tmp / "target.db"
        build_sample_source(self.source_path, table=SOURCE_TABLE, rows=rows, partitions=partitions)
        self.next_id = rows + 1
        if strategy == "merge":
            self.query(
                self.source_path,
                f"ALTER TABLE {SOURCE_TABLE} ADD COLUMN gone INTEGER NOT NULL DEFAULT 0",
            )
            self.versions = self.query(self.source_path, f"SELECT * FROM {SOURCE_TABLE}")
        self.source = SQLiteSource(str(self.source_path), SOURCE_TABLE, "region", "updated_at")
        self.sink = RecordingSink(self.make_sink())
        self.real_store = SQLiteCheckpointStore(self.tmp / "checkpoints.db")
        self.clock = StepClock()
        self.route = route_key(self.source, self.sink, strategy)  # located in these files

    def make_sink(self) -> Any:
        """The target: a SQLite or DuckDB file, a chDB data folder, or a table in a PostgreSQL
        schema of its own."""
        if self.target == "duckdb":
            return DuckDBSink(str(self.tmp / "target.duckdb"), TARGET_TABLE)
        if self.target == "clickhouse":  # as a route file makes it
            return ClickHouseSink(str(self.tmp / "chdata"), TARGET_TABLE, partition_by="region")
        if self.target == "postgres":
            self.schema = f"faults_{os.urandom(6).hex()}"
            self.postgres(f'CREATE SCHEMA "{self.schema}"')
            return PostgresSink(POSTGRES["url"], f"{self.schema}.{TARGET_TABLE}")
        return SQLiteSink(str(self.target_path), TARGET_TABLE)

    def postgres(self, sql: str) -> None:
        import psycopg

        with contextlib.closing(psycopg.connect(POSTGRES["url"], autocommit=True)) as conn:
            conn.execute(sql)

    def teardown(self) -> None:
        try:
            if self.real_store is not None and not self.in_step:
                self.drain()
        finally:
            if self.real_store is not None:
                self.real_store.close()
            if self.schema:
                self.postgres(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')
            shutil.rmtree(self.tmp, ignore_errors=True)

    # reading the world -----------------------------------------------------------------

    def spec(self, run_id: str) -> TransferSpec:
        merge = {"primary_key": ("id",), "deleted_column": "gone"} if self.merging else {}
        return TransferSpec(
            source=self.source,
            sink=self.sink,
            strategy=self.strategy,
            path=self.path,
            run_id=run_id,
            chunk_rows=16,
            **merge,
        )

    @property
    def merging(self) -> bool:
        return self.strategy == "merge"

    def query(self, path: Path, sql: str, params: Iterable[Any] = ()) -> list[tuple]:
        with contextlib.closing(sqlite3.connect(path)) as connection:
            found = connection.execute(sql, tuple(params)).fetchall()
            connection.commit()
            return found

    def check_merged(self, watermark: Any) -> None:
        """A merge route's target after a run that advanced to ``watermark``: a key whose
        source row (its last version) is at or below it holds exactly that row, or nothing if
        it deletes; any other key is not covered yet, and holds nothing or one of its own
        earlier live versions (read before it changed again). Nothing else."""
        rows = self.target_rows()
        target = {row[0]: row for row in rows}
        assert len(target) == len(rows), "a key held twice"
        current = {version[0]: version for version in self.versions}
        assert set(target) <= set(current), "a key the source never had"
        for key, version in current.items():
            if watermark is not None and version[3] <= watermark:
                want = None if version[4] else version[:4]
                assert target.get(key) == want, (key, target.get(key), want)
            elif key in target:
                earlier = {v[:4] for v in self.versions if v[0] == key and not v[4]}
                assert target[key] in earlier, (key, target[key])

    def target_rows(self) -> list[tuple]:
        """Every target row, sorted, read with the engine's own client; on ClickHouse the
        rows a reader sees, in the merged view (``FINAL``), without dpone's columns."""
        if self.target == "clickhouse":
            return self.clickhouse_rows()
        if self.target != "duckdb":
            return sorted(tuple(row) for row in self.sink.inner.rows())
        path = self.tmp / "target.duckdb"
        if not path.is_file():
            return []
        import duckdb

        with contextlib.closing(duckdb.connect(str(path))) as conn:
            sql = "SELECT count(*) FROM information_schema.tables WHERE table_name = ?"
            if not conn.execute(sql, [TARGET_TABLE]).fetchone()[0]:
                return []
            return sorted(conn.execute(f"SELECT * FROM {TARGET_TABLE}").fetchall())

    def clickhouse_rows(self) -> list[tuple]:
        with self.sink.inner.client() as client:
            found = client.query_rows(
                "SELECT count() FROM system.tables WHERE database = currentDatabase()"
                " AND name = {t:String}",
                {"t": TARGET_TABLE},
            )
            if not found[0][0]:
                return []
            sql = f"SELECT id, region, amount, updated_at FROM {TARGET_TABLE} FINAL"
            return sorted(tuple(row) for row in client.query_rows(sql))

    def watermark(self) -> Any:
        state = self.real_store.load_source_state(self.route)
        return None if state is None else state["watermark"]

    def source_ids(self) -> list[int]:
        return [row[0] for row in self.query(self.source_path, f"SELECT id FROM {SOURCE_TABLE}")]

    def source_ids_upto(self, watermark: Any) -> list[int]:
        """Source rows at or below the watermark (none before the first advanced watermark)."""
        if watermark is None:
            return []
        sql = f"SELECT id FROM {SOURCE_TABLE} WHERE updated_at <= ?"
        return [row[0] for row in self.query(self.source_path, sql, [watermark])]

    def ids_in(self, bounds: dict[str, Any]) -> list[int]:
        """The source rows a partition covers, by the test's own SQL (an independent oracle)."""
        sql, params = f"SELECT id FROM {SOURCE_TABLE} WHERE region = ?", [bounds["partition"]]
        if bounds.get("cursor_after") is not None:
            sql, params = sql + " AND updated_at > ?", [*params, bounds["cursor_after"]]
        if bounds.get("cursor_upto") is not None:
            sql, params = sql + " AND updated_at <= ?", [*params, bounds["cursor_upto"]]
        return [row[0] for row in self.query(self.source_path, sql, params)]

    def target_ids(self) -> list[int]:
        return [row[0] for row in self.target_rows()]

    def latest(self):
        return self.real_store.list_latest(self.route)

    def findings(self) -> list[dict[str, Any]]:
        return [finding.as_dict() for finding in blocked_partitions(self.latest())]

    def history_size(self) -> int:
        return len(self.real_store.history(self.route))

    # steps ------------------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self):
        self.in_step = True
        STATS["steps"] += 1
        yield
        self.in_step = False

    def append(self, rows: int, partitions: int) -> None:
        if self.merging:
            self.change(rows, partitions)
            return
        build_sample_source(
            self.source_path,
            table=SOURCE_TABLE,
            rows=rows,
            partitions=partitions,
            start_id=self.next_id,
        )
        self.next_id += rows
        STATS["appends"] += 1

    def change(self, rows: int, partitions: int) -> None:
        """A merge route's source: ``rows`` new keys; a quarter as many live keys updated (to
        a partition of the new spread), an eighth deleted; every version at a new cursor."""
        top = max((version[3] for version in self.versions), default=1_000_000)
        live = sorted({v[0]: v for v in self.versions}.values())  # each key's last version
        live = [version for version in live if not version[4]]
        stride = max(1, len(live) // max(1, rows // 4))
        updated, deleted = live[::stride][: rows // 4], live[1::stride][: rows // 8]
        changed = [
            *(
                (row_id, f"region-{n % partitions:03d}", amount + 1, 0)
                for n, (row_id, _, amount, *_) in enumerate(updated)
            ),
            *(
                (row_id, region, amount, 1)
                for row_id, region, amount, *_ in deleted
                if row_id not in {u[0] for u in updated}
            ),
            *((self.next_id + n, f"region-{n % partitions:03d}", 1.5, 0) for n in range(rows)),
        ]
        versions = [
            (row_id, region, amount, top + 1 + n, gone)
            for n, (row_id, region, amount, gone) in enumerate(changed)
        ]
        with contextlib.closing(sqlite3.connect(self.source_path)) as db:
            db.executemany(
                f"INSERT OR REPLACE INTO {SOURCE_TABLE} VALUES (?, ?, ?, ?, ?)", versions
            )
            db.commit()
        self.versions += versions
        self.next_id += rows
        STATS["appends"] += 1

    @precondition(lambda self: self.blocked and self.retried_while_blocked)
    @rule()
    def resolve(self) -> None:
        """The operator compares every blocked partition with the target and records it.

        Only after the orchestrator has retried the blocked route at least once,
        so every blocked route is also shown to stay blocked.
        """
        with self.step():
            self.resolve_blocked()
            STATS["resolves"] += 1

    @rule(fault=FAULTS, arriving=st.integers(0, 40), spread=st.integers(1, 6))
    def run_attempt(self, fault: Fault, arriving: int, spread: int) -> None:
        """A scheduled run; ``arriving`` rows, over ``spread`` partition values, came first.

        New rows arrive in a live source between runs, blocked or not; new
        partition values give new partition ids, which must not unblock a route.
        """
        with self.step():
            if arriving:
                self.append(arriving, spread)
            self.attempt(fault)

    # one attempt ------------------------------------------------------------------------

    def arm(self, store: ProbedStore, fault: Fault, number: int) -> Armed:
        armed = Armed()
        label = f"injected {fault.kind}:{fault.where} fault #{number}"
        if fault.kind == "write":
            armed.primary = store.fail_batch(
                armed.write.matcher(fault.where), keep=fault.keep, error=InjectedFault(label)
            )
        elif fault.kind == "read":
            armed.primary = store.fail_reads(error=InjectedFault(label))
        elif fault.kind == "sink":
            self.sink.fail, self.sink.error = fault.where, InjectedFault(label)
            armed.primary = self.sink.error
        elif fault.kind == "state":
            armed.primary = store.fail_state_write(fault.where, InjectedFault(label))
        if fault.secondary == "reconcile_read":
            store.fail_reads(skip=2, error=OSError(SECONDARY_ERROR))
        elif fault.secondary is not None:
            store.fail_batch(
                armed.marker.matcher(fault.secondary),
                keep=fault.secondary_keep,
                error=OSError(SECONDARY_ERROR),
            )
        return armed

    def attempt(self, fault: Fault) -> None:
        self.attempts += 1
        STATS["attempts"] += 1
        store = ProbedStore(self.real_store)
        armed = self.arm(store, fault, self.attempts)
        before = self.findings()
        held = self.target_rows() if self.merging else []
        history, calls = self.history_size(), self.sink.target_calls
        result: TransferResult | None = None
        raised: Exception | None = None
        try:
            runtime = TransferRuntime(store, clock=self.clock, **self.runtime_options)
            result = runtime.run(self.spec(f"try-{self.attempts}"))
        except Exception as error:  # every injected fault is an Exception
            raised = error
        finally:
            self.sink.fail = None
        self.batches.extend(store.batches)
        called = self.sink.target_calls - calls

        if before:
            self.retried_while_blocked = True
            self.check_blocked_attempt(fault, armed, raised, before, store, history, called)
        else:
            self.check_open_attempt(fault, armed, raised, result, store, called)

        after = self.findings()
        if raised is None:
            assert not after, "a successful attempt left the route blocked"
        if after and not before:
            STATS["blocked_routes"] += 1
            self.unapplied = held
        self.blocked = bool(after)

    def check_blocked_attempt(
        self,
        fault: Fault,
        armed: Armed,
        raised: Exception | None,
        before: list[dict[str, Any]],
        store: ProbedStore,
        history: int,
        called: int,
    ) -> None:
        """A blocked route: stopped at the route scan, nothing written, no target call."""
        STATS["blocked_attempts"] += 1
        assert called == 0, "a blocked route called the target"
        assert store.batches == [], "a blocked attempt wrote checkpoints"
        assert self.history_size() == history
        if fault.kind == "read":  # the scan's own read failed first: that error surfaces
            assert raised is armed.primary
        else:
            assert isinstance(raised, ManualReconciliationRequired), (
                f"a blocked route raised {type(raised).__name__}, not ManualReconciliationRequired"
            )
        assert self.findings() == before, "a blocked route changed without a resolve"

    def check_open_attempt(
        self,
        fault: Fault,
        armed: Armed,
        raised: Exception | None,
        result: TransferResult | None,
        store: ProbedStore,
        called: int,
    ) -> None:
        """An open route: any raise is the injected object; success leaves a complete target."""
        fired = {
            "none": False,
            "write": armed.write.fired,
            "read": True,
            "sink": called > 0,
            "state": store.calls[fault.where] > 0,
        }[fault.kind]
        if fired:
            assert raised is armed.primary, (
                f"the injected fault fired but {type(raised).__name__} surfaced: {raised!r}"
            )
            self.record_fault_point(fault, armed, store)
        if raised is not None:
            assert raised is armed.primary, (
                f"an open route raised {type(raised).__name__} that was not injected: {raised!r}"
            )
            site = INJECTION_SITE[fault.kind]
            site = site[fault.where] if isinstance(site, dict) else site
            assert site in traceback_functions(raised), f"the traceback no longer reaches {site}()"
            assert str(SECONDARY_ERROR) not in repr(raised)
            return
        assert called <= 1, "one attempt reaches the target at most once"
        if self.strategy == "incremental_append":
            state = self.real_store.load_source_state(self.route)
            watermark = None if state is None else state["watermark"]
            assert_rows_exactly_once(self.source_ids_upto(watermark), self.target_ids())
        elif self.merging:
            self.check_merged(self.watermark())
        elif called:
            assert_rows_exactly_once(self.source_ids(), self.target_ids())
        if called:
            assert_event_order(result.events)

    def record_fault_point(self, fault: Fault, armed: Armed, store: ProbedStore) -> None:
        point = f"{fault.kind}:{fault.where}"
        if fault.kind == "write":
            point += f":keep={min(fault.keep, armed.write.size)}/{armed.write.size}"
        if fault.secondary == "reconcile_read" and store.calls["list_latest"] >= 2:
            point += "+read:reconcile"
        elif armed.marker.fired:
            keep = min(fault.secondary_keep, armed.marker.size)
            point += f"+write:{fault.secondary}:keep={keep}/{armed.marker.size}"
        FAULT_POINTS.add(point)

    # the operator ------------------------------------------------------------------------

    def resolve_blocked(self) -> None:
        """What the runbook says: ``guard resolve --from-target``, as the target's ledger proves.

        The row count is the independent oracle: for an append route, a batch the
        ledger holds has every row of its partitions in the target once, and one it
        does not hold has none of them.
        """
        latest = {cp.partition_id: cp for cp in self.latest()}
        found = blocked_partitions(latest.values())
        assert found, "resolve was called on a route that does not block"
        in_ledger = {entry.batch_id for entry in self.sink.inner.read_ledger()}
        target = Counter(self.target_ids())
        verdicts: dict[Resolution, list[str]] = {r: [] for r in Resolution}
        for finding in found:
            applied = finding.batch_id in in_ledger
            if self.strategy == "incremental_append":
                ids = self.ids_in(latest[finding.partition_id].partition_bounds)
                counts = {target[row_id] for row_id in ids}
                assert counts <= ({1} if applied else {0}), (finding.batch_id, applied, counts)
            elif self.merging:  # the rows with the batch or without it, never part of it
                STATS["merge_resolved_partitions"] += 1
                STATS[f"merge_resolved_partitions:{self.target}"] += 1
                upto = latest[finding.partition_id].partition_bounds.get("cursor_upto")
                if applied:
                    self.check_merged(upto)
                else:
                    assert self.target_rows() == self.unapplied, finding.batch_id
            resolved_as = Resolution.COMMITTED if applied else Resolution.FAILED_BEFORE_TARGET
            verdicts[resolved_as].append(finding.partition_id)
        for resolved_as, partition_ids in verdicts.items():
            if partition_ids:
                self.apply(resolved_as, partition_ids)
        assert self.findings() == [], "the route still blocks after every partition was resolved"
        self.blocked = self.retried_while_blocked = False

    def apply(self, resolved_as: Resolution, partition_ids: list[str]) -> None:
        """``guard resolve --partition ... --as ...`` through the same functions, audited."""
        selected = select_blocked(self.latest(), partition_ids=partition_ids)
        now = self.clock()
        resolved = resolution_batch(selected, resolved_as, now)
        audit = audit_record(
            self.route,
            selected,
            resolved,
            resolved_as=resolved_as,
            operator="property-test",
            reason="the target's ledger proves it",
            now=now,
        )
        self.real_store.apply_resolution(self.route, resolved, audit)
        stored = {cp.partition_id: cp for cp in self.latest()}
        for checkpoint in resolved:
            assert stored[checkpoint.partition_id] == checkpoint
            assert checkpoint.started_at == checkpoint.completed_at == now

    # the route finishes ------------------------------------------------------------------

    def drain(self) -> None:
        """Resolve what blocks, then clean retries: the route must end with every row once."""
        if self.findings():
            self.resolve_blocked()
        result = None
        for number in range(3):
            store = FaultyStore(self.real_store)
            result = TransferRuntime(store, clock=self.clock).run(self.spec(f"drain-{number}"))
            self.batches.extend(store.batches)
            STATS["drain_runs"] += 1
        self.guard_invariants()
        if self.merging:  # every key covered: each key's source row, less deleted ones
            assert self.watermark() == max((v[3] for v in self.versions), default=None)
            self.check_merged(self.watermark())
        else:
            assert_rows_exactly_once(self.source_ids(), self.target_ids())
        if self.strategy in ("incremental_append", "merge"):
            assert result.rows_loaded == 0, "two clean runs should have loaded every row"

    # invariants -------------------------------------------------------------------------

    @invariant()
    def guard_invariants(self) -> None:
        self.in_step = True  # a failed invariant skips the final drain too
        self.no_duplicate_in_target()
        self.one_timestamp_per_batch()
        if self.strategy == "incremental_append":
            self.checkpoints_agree_with_target()
        self.in_step = False

    def no_duplicate_in_target(self) -> None:
        counts = Counter(self.target_ids())
        duplicated = sorted(row_id for row_id, seen in counts.items() if seen > 1)
        STATS["duplicates"] += len(duplicated)
        assert not duplicated, f"rows in the target twice: {duplicated[:10]}"
        foreign = set(counts) - set(self.source_ids())
        assert not foreign, f"target rows the source never had: {sorted(foreign)[:10]}"

    def one_timestamp_per_batch(self) -> None:
        assert_one_timestamp_per_batch(self.batches[self.checked_batches :], self.clock.reads)
        self.checked_batches = len(self.batches)

    def checkpoints_agree_with_target(self) -> None:
        """A retryable checkpoint covers no target row; a committed one covers each once."""
        target = Counter(self.target_ids())
        for checkpoint in self.latest():
            ids = self.ids_in(checkpoint.partition_bounds)
            if checkpoint.status is COMMITTED:
                assert all(target[row_id] == 1 for row_id in ids), (
                    f"{checkpoint.partition_id} is committed but its rows are not all in the target"
                )
            elif not inspect_checkpoint(checkpoint).blocked:
                assert not any(target[row_id] for row_id in ids), (
                    f"{checkpoint.partition_id} would be retried, yet the target holds its rows: "
                    "the retry would append them twice"
                )


# -- the test and its figures ------------------------------------------------------------------


def test_single_faults_and_retries_never_duplicate_and_blocked_routes_stay_blocked(request):
    POSTGRES["url"] = postgres_url(request.getfixturevalue("postgres_dsn"))
    started = time.perf_counter()
    try:
        run_state_machine_as_test(FaultMachine, settings=settings.get_profile(PROFILE))
    finally:
        report(request.config, time.perf_counter() - started)
    assert STATS["duplicates"] == 0
    assert STATS["attempts"] > STATS["examples"], "every example should make several attempts"
    assert STATS["blocked_routes"] > 0 and STATS["resolves"] > 0, "no route was ever blocked"
    assert {path for path, _ in ROUTE_SHAPES} == set(PATHS), "not every path ran"
    assert HOSTILE_SEEN == set(HOSTILE), "a hostile listener or plugin never ran"
    assert {strategy for _, strategy in ROUTE_SHAPES} == set(STRATEGIES), "a strategy never ran"
    assert STATS["merge_resolved_partitions"] > 0, "no merge route was ever blocked and resolved"
    fired = {point.split("+")[0].split(":keep=")[0] for point in FAULT_POINTS}
    assert fired == PRIMARY_POINTS, f"faults that never fired: {sorted(PRIMARY_POINTS - fired)}"


@pytest.mark.parametrize("engine", TARGETS)
def test_merge_routes_under_faults_on_each_target(request, engine):
    """The machine above draws a merge route's target, and a derandomized run's draws change
    with the code (one left SQLite and ClickHouse out): this runs merge routes only, into
    each target in turn, with the same faults and invariants."""
    POSTGRES["url"] = postgres_url(request.getfixturevalue("postgres_dsn"))
    before = Counter(STATS)
    FORCED_MERGE["engine"] = engine
    try:
        profile = settings(settings.get_profile(PROFILE), max_examples=MERGE_EXAMPLES)
        run_state_machine_as_test(FaultMachine, settings=profile)
    finally:
        FORCED_MERGE.clear()
    assert STATS["duplicates"] == before["duplicates"] == 0
    assert STATS[f"merge_examples:{engine}"] > before[f"merge_examples:{engine}"]
    assert STATS["attempts"] > before["attempts"]


def figures(seconds: float) -> dict[str, Any]:
    kinds = Counter(point.split(":")[0] for point in FAULT_POINTS)
    return {
        "profile": PROFILE,
        "seconds": round(seconds, 1),
        "examples": STATS["examples"],
        "steps": STATS["steps"],
        "attempts": STATS["attempts"],
        "attempts_on_blocked_routes": STATS["blocked_attempts"],
        "appends": STATS["appends"],
        "blocked_routes": STATS["blocked_routes"],
        "resolves": STATS["resolves"],
        "merge_resolved_partitions": STATS["merge_resolved_partitions"],
        "drain_runs": STATS["drain_runs"],
        "duplicates": STATS["duplicates"],
        "distinct_fault_points": len(FAULT_POINTS),
        "fault_points_by_kind": dict(sorted(kinds.items())),
        "route_shapes": sorted(f"{path}/{strategy}" for path, strategy in ROUTE_SHAPES),
        "merge_targets": sorted(MERGE_TARGETS),
        "merge_by_target": {  # examples, and merge partitions blocked then resolved
            target: [
                STATS[f"merge_examples:{target}"],
                STATS[f"merge_resolved_partitions:{target}"],
            ]
            for target in TARGETS
        },
        "hostile_hooks": sorted(HOSTILE_SEEN),
        "fault_points": sorted(FAULT_POINTS),
    }


class FaultFigures:
    """A pytest plugin registered at run time: prints the figures in the terminal summary."""

    name = "dpone-fault-properties-figures"

    def __init__(self, data: dict[str, Any], written: Path) -> None:
        self.data, self.written = data, written

    def pytest_terminal_summary(self, terminalreporter) -> None:
        data = self.data
        terminalreporter.write_sep("-", f"fault-injection properties ({data['profile']})")
        terminalreporter.write_line(
            f"{data['examples']} examples (seeds), {data['steps']} steps, "
            f"{data['attempts']} attempts ({data['attempts_on_blocked_routes']} on blocked "
            f"routes), {data['drain_runs']} drain runs, in {data['seconds']} s"
        )
        by_kind = ", ".join(f"{kind} {n}" for kind, n in data["fault_points_by_kind"].items())
        terminalreporter.write_line(
            f"{data['distinct_fault_points']} distinct fault points exercised ({by_kind}); "
            f"{data['blocked_routes']} routes blocked, {data['resolves']} resolves, "
            f"{data['duplicates']} duplicate rows found"
        )
        terminalreporter.write_line(f"figures written to {self.written}")


def report(config, seconds: float) -> None:
    data = figures(seconds)
    written = Path(config.rootpath) / "reports" / "fault-properties.json"
    written.parent.mkdir(exist_ok=True)
    written.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    manager = config.pluginmanager
    if manager.has_plugin(FaultFigures.name):
        manager.unregister(name=FaultFigures.name)
    manager.register(FaultFigures(data, written), FaultFigures.name)
