"""The target's fence, rows applied equal rows sent, and certified automatic recovery (issue 43).

On every transactional target (SQLite, DuckDB, PostgreSQL), a batch of an older lease epoch
is rolled back inside its own transaction, a target that applies another number of rows
than it was sent is rolled back, and a run with ``recovery = "from_target"`` resolves what
the target's ledger proves before it touches the target, and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
from helpers.cli import run_cli as dpone
from helpers.postgres_server import postgres_url
from helpers.routes import PATHS, Route

from dpone_native_transfer import (
    LEASE_EPOCH_KEY,
    ConfigInvalid,
    LeaseLost,
    ManualReconciliationRequired,
    PostgresSink,
    TargetRowsMismatch,
)
from dpone_native_transfer.events import EventName
from dpone_native_transfer.lease import clock_epoch
from dpone_native_transfer.payloads import RowChunks
from dpone_native_transfer.testing import (
    InjectedFault,
    RecordingSink,
    assert_rows_exactly_once,
    phase_batch,
)
from dpone_target_commit_guard.policy import blocked_partitions

TRANSACTIONAL = ("sqlite", "duckdb", "postgres")


def target(kind: str, tmp_path: Path, request: pytest.FixtureRequest, **recording: Any) -> Route:
    """The sample route into a real ``kind`` target; a PostgreSQL one in a schema of its own."""
    if kind == "postgres":
        location = request.getfixturevalue("postgres_schema")
        with contextlib.closing(psycopg.connect(location.dsn, autocommit=True)) as conn:
            conn.execute(f'CREATE SCHEMA "{location.schema}"')
        inner = PostgresSink(postgres_url(location.dsn), f"{location.schema}.orders_copy")
        route = Route(tmp_path, sink=inner)
        route.location = location
    else:
        route = Route(tmp_path, kind=kind)
    route.sink = RecordingSink(route.sink.inner, **recording)
    return route


def blocked(route: Route) -> list[Any]:
    return blocked_partitions(route.latest())


def audits(route: Route) -> list[dict[str, Any]]:
    return route.real_store.list_audit(route.spec("legacy").route)


# --- the fence ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TRANSACTIONAL)
def test_a_newer_holder_reaching_the_target_first_rolls_the_stale_batch_back(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A worker paused past its lease while a newer holder reached the target: the target's fence
    refuses its batch inside its own transaction; nothing is applied, the route is not blocked,
    and the next run (epoch above the fence) loads every row once."""
    route = target(kind, tmp_path, request)
    sink = route.sink.inner
    newer = clock_epoch(time.time()) + 600_000  # the newer holder's epoch
    route.sink.observe = lambda: sink.advance_fence(newer)
    with pytest.raises(LeaseLost) as raised:
        route.runtime().run(route.spec("legacy"))
    assert raised.value.applied is False and raised.value.diagnostics["lease"] == "fenced"
    assert route.target_ids() == [] and sink.read_ledger() == []
    assert sink.fence_epoch() == newer
    assert blocked(route) == []
    phases = {cp.diagnostics["target_commit_guard"]["phase"] for cp in route.latest()}
    assert phases == {"failed_before_target"}

    route.sink.observe = None
    route.runtime().run(route.spec("legacy", run_id="run-2"))
    assert_rows_exactly_once(route.source_ids(), route.target_ids())
    [entry] = sink.read_ledger()
    assert entry.epoch == newer + 1 == sink.fence_epoch()


@pytest.mark.parametrize("kind", TRANSACTIONAL)
def test_the_fence_only_grows_and_is_read_by_the_next_run(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    route = target(kind, tmp_path, request)
    sink = route.sink.inner
    assert sink.fence_epoch() == 0
    high = clock_epoch(time.time()) + 60_000  # a fence above the clock's epoch
    assert sink.advance_fence(high) == high
    assert sink.advance_fence(3) == high
    route.runtime().run(route.spec("staged"))
    [armed] = {cp.diagnostics[LEASE_EPOCH_KEY] for cp in route.latest()}
    assert armed == high + 1 == sink.fence_epoch()


def _tamper(route: Route, kind: str, statement: str) -> None:
    """``statement`` on the target's fence table, by hand (in the route's schema)."""
    if kind == "postgres":
        table = f'"{route.location.schema}"._dpone_fence'
        with contextlib.closing(psycopg.connect(route.location.dsn, autocommit=True)) as conn:
            conn.execute(statement.format(fence=table))
    elif kind == "duckdb":
        import duckdb

        with contextlib.closing(duckdb.connect(str(route.target_path))) as conn:
            conn.execute(statement.format(fence="_dpone_fence"))
    else:
        with contextlib.closing(sqlite3.connect(route.target_path)) as conn:
            conn.execute(statement.format(fence="_dpone_fence"))
            conn.commit()


@pytest.mark.parametrize("statement", ["DELETE FROM {fence}", "DROP TABLE {fence}"])
@pytest.mark.parametrize("kind", TRANSACTIONAL)
def test_a_fence_removed_by_hand_still_refuses_a_batch_older_than_the_ledgers(
    kind: str, statement: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The fence's row deleted (or its table dropped) behind dpone's back: a worker stopped
    past its lease then applied its older batch after a newer holder's, exit 0 with its rows
    twice (a hostile check). The ledger's batches carry the epochs they were fenced with: the
    fence is at least the highest, for the load's check and for the next run's epoch."""
    route = target(kind, tmp_path, request)
    sink = route.sink.inner
    route.runtime().run(route.spec("legacy"))  # the newer holder's batch
    [entry] = sink.read_ledger()
    _tamper(route, kind, statement)
    assert entry.epoch is not None and sink.fence_epoch() == entry.epoch > 0
    stale = attrs.evolve(entry, batch_id="stale-batch", epoch=entry.epoch - 1, sent=None)
    columns = route.spec("legacy").source.describe().columns
    with pytest.raises(LeaseLost):
        sink.load(RowChunks(columns=columns, chunks=[route.source_rows()]), ledger=stale)
    assert route.target_ids() == route.source_ids()
    assert [e.batch_id for e in sink.read_ledger()] == [entry.batch_id]
    route.add_rows()
    route.runtime().run(route.spec("legacy", run_id="run-2"))  # above the ledger's epoch
    assert_rows_exactly_once(route.source_ids(), route.target_ids())
    assert sink.read_ledger()[-1].epoch > entry.epoch


@pytest.mark.parametrize("kind", ["sqlite", "duckdb"])
def test_a_store_that_forgot_epochs_gives_a_stopped_workers_away_no_more(
    kind: str, tmp_path: Path
) -> None:
    """A worker took the next epoch and stopped before its target call; the store was then
    lost (or restored from a backup older than the last batch) and restored from the target.
    The next run's epoch from the store that forgot was the stopped worker's own: both
    batches were applied, exit 0 then the rows twice (a hostile check on PostgreSQL). An
    epoch is at least the clock's milliseconds (``clock_epoch``), so the stopped worker's
    batch is fenced out."""
    route = Route(tmp_path, kind=kind)
    route_file = route.route_file()
    route.real_store.close()
    assert dpone("run", route_file).returncode == 0
    sink = route.sink.inner
    [entry] = sink.read_ledger()
    assert entry.epoch is not None
    stopped = attrs.evolve(entry, batch_id="stopped-batch", epoch=entry.epoch + 1, sent=None)
    for file in tmp_path.glob("checkpoints.db*"):  # the store, lost
        file.unlink()
    restored = dpone(
        "state", "restore", route_file, "--reason", "lost", "--operator", "me", "--yes"
    )
    assert restored.returncode == 0, restored.stderr
    route.add_rows()
    assert dpone("run", route_file).returncode == 0
    assert sink.fence_epoch() > stopped.epoch
    columns = route.spec("legacy").source.describe().columns
    with pytest.raises(LeaseLost):
        sink.load(RowChunks(columns=columns, chunks=[route.source_rows()]), ledger=stopped)
    assert_rows_exactly_once(route.source_ids(), route.target_ids())


# --- rows applied equal rows sent ------------------------------------------------------------


def _drop_every_tenth(route: Route, kind: str) -> None:
    """A trigger that silently drops rows, made after the target was checked."""
    if kind == "sqlite":
        with contextlib.closing(sqlite3.connect(route.target_path)) as conn:
            conn.execute(
                "CREATE TRIGGER drop_tenth BEFORE INSERT ON orders_copy"
                " WHEN NEW.id % 10 = 0 BEGIN SELECT RAISE(IGNORE); END"
            )
            conn.commit()
        return
    schema = route.location.schema
    with contextlib.closing(psycopg.connect(route.location.dsn, autocommit=True)) as conn:
        conn.execute(
            f'CREATE FUNCTION "{schema}".drop_tenth() RETURNS trigger LANGUAGE plpgsql AS'
            " $$ BEGIN IF NEW.id % 10 = 0 THEN RETURN NULL; END IF; RETURN NEW; END $$"
        )
        conn.execute(
            f'CREATE TRIGGER drop_tenth BEFORE INSERT ON "{schema}".orders_copy FOR EACH ROW'
            f' EXECUTE FUNCTION "{schema}".drop_tenth()'
        )


@pytest.mark.parametrize("path", ("legacy", "staged", "file-artifact"))
@pytest.mark.parametrize("kind", ("sqlite", "postgres"))
def test_a_target_that_drops_rows_in_the_load_is_rolled_back_not_believed(
    kind: str, path: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    route = target(kind, tmp_path, request)
    route.runtime().run(route.spec(path))  # the table exists now, with 120 rows
    route.add_rows(60)
    route.sink.observe = lambda: _drop_every_tenth(route, kind)
    with pytest.raises(TargetRowsMismatch) as raised:
        route.runtime().run(route.spec(path, run_id="run-2"))
    assert raised.value.code == "native_transfer_target_rows_mismatch"
    assert raised.value.diagnostics["sent"] == 60 and raised.value.diagnostics["applied"] == 54
    assert set(raised.value.diagnostics) == {"target_table", "batch_id", "sent", "applied"}
    assert len(route.target_ids()) == 120 and len(route.sink.inner.read_ledger()) == 1
    assert blocked(route) == []  # rolled back: nothing to reconcile

    # the trigger is found before the target now: refused, nothing written, still not blocked
    route.sink.observe = None
    with pytest.raises(TargetRowsMismatch) as again:
        route.runtime().run(route.spec(path, run_id="run-3"))
    assert again.value.diagnostics["rewriting"] == 1
    assert route.sink.target_calls == 2 and blocked(route) == []


# --- certified automatic recovery -------------------------------------------------------------


def _crash(route: Route, path: str, when: str) -> None:
    """An attempt whose target call raised ``before`` or ``after`` the target applied the batch:
    its outcome is unknown to the store, so the route is blocked."""
    route.sink.fail = when
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path))
    route.sink.fail = None
    assert blocked(route), "a target call of unknown outcome blocks the route"


# lazy-plan into PostgreSQL pulls a PostgreSQL source only:
# tests/stores/test_postgres_runtime.py has it
CASES = [(k, p) for k in TRANSACTIONAL for p in PATHS if (k, p) != ("postgres", "lazy-plan")]


@pytest.mark.parametrize("when", ("before", "after"))
@pytest.mark.parametrize(("kind", "path"), CASES)
def test_from_target_heals_what_the_ledger_proves_and_loads_each_row_once(
    kind: str, path: str, when: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    route = target(kind, tmp_path, request)
    _crash(route, path, when)
    calls = route.sink.target_calls
    with pytest.raises(ManualReconciliationRequired):  # the design's default: a person decides
        route.runtime().run(route.spec(path, run_id="manual"))
    assert route.sink.target_calls == calls

    healed = route.runtime().run(route.spec(path, run_id="healing", recovery="from_target"))
    assert_rows_exactly_once(route.source_ids(), route.target_ids())
    assert blocked(route) == []
    assert route.sink.target_calls == calls + (1 if when == "before" else 0)
    [event] = [e for e in healed.events if e.name == EventName.GUARD_HEALED]
    assert event.fields["verdict"] == ("not_applied" if when == "before" else "applied")
    [audit] = audits(route)
    assert audit["operator"] == "dpone-transfer (automatic)" and audit["run_id"] == "healing"
    assert audit["resolved_as"] == "from_target"
    [proof] = audit["proof"].values()
    assert proof["verdict"] == event.fields["verdict"] and proof["heals"] is True


def test_from_target_leaves_a_batch_the_ledger_disagrees_with_blocked(tmp_path: Path) -> None:
    """The ledger holds the batch, but with other row counts than the store armed: no proof."""
    route = Route(tmp_path, kind="sqlite", rows=120)
    route.sink = RecordingSink(route.sink.inner)
    _crash(route, "legacy", "after")
    with contextlib.closing(sqlite3.connect(route.target_path)) as conn:
        conn.execute("UPDATE _dpone_ledger SET partitions = replace(partitions, ', 30]', ', 31]')")
        conn.commit()
    with pytest.raises(ManualReconciliationRequired):
        route.runtime().run(route.spec("legacy", run_id="healing", recovery="from_target"))
    assert blocked(route) and audits(route) == []


@pytest.mark.parametrize("when", ("before", "after"))
def test_from_target_leaves_clickhouse_and_ledgerless_routes_blocked(
    when: str, tmp_path: Path
) -> None:
    """No proof without a ledger written with the rows, so those routes still need a person."""
    for kind, ledger in (("clickhouse", True), ("sqlite", False)):
        route = Route(tmp_path / f"{kind}-{ledger}", kind=kind, rows=120)
        route.sink = RecordingSink(route.sink.inner)
        route.sink.fail = when
        with pytest.raises(InjectedFault):
            route.runtime().run(route.spec("legacy", ledger=ledger))
        route.sink.fail = None
        spec = route.spec("legacy", run_id="healing", ledger=ledger, recovery="from_target")
        with pytest.raises(ManualReconciliationRequired):
            route.runtime().run(spec)
        assert blocked(route) and audits(route) == []
        route.real_store.close()


def test_recovery_is_refused_when_misspelt(tmp_path: Path) -> None:
    route = Route(tmp_path, kind="sqlite", rows=10)
    with pytest.raises(ConfigInvalid) as raised:
        route.spec("legacy", recovery="from-target")
    assert raised.value.diagnostics == {"key": "guard.recovery"}


def test_the_operator_is_told_what_heals_by_itself_and_a_run_heals_it(tmp_path: Path) -> None:
    """``state show`` and ``guard verify`` say, per blocked batch, whether from_target heals it;
    ``run --recovery from_target`` then does, saying so, with no operator command."""
    route = Route(tmp_path, kind="sqlite", rows=120)
    route.sink = RecordingSink(route.sink.inner)
    _crash(route, "legacy", "after")
    route.real_store.close()
    route_file = route.route_file(path="legacy")

    shown = dpone("state", "show", route_file)
    assert shown.returncode == 0, shown.stderr
    [line] = [line for line in shown.stdout.splitlines() if line.startswith("blocked batch")]
    assert "target proves applied" in line and "recovery = from_target heals it" in line
    verified = dpone("guard", "verify", route_file, "--json")
    assert verified.returncode == 3
    [proof] = [json.loads(line) for line in verified.stdout.splitlines()]
    assert proof["proof"]["heals"] is True

    assert dpone("run", route_file).returncode == 3  # the default stays manual
    healed = dpone("run", route_file, "--recovery", "from_target")
    assert healed.returncode == 0, healed.stderr
    assert "recovered: blocked batch" in healed.stderr and "resolved as applied" in healed.stderr
    assert "loaded 0 rows" in healed.stdout
    assert_rows_exactly_once(route.source_ids(), route.target_ids())


# --- the batch column: proof where the ledger row proves nothing (ClickHouse) ----------------


@pytest.mark.parametrize("kind", ("sqlite", "duckdb", "clickhouse"))
@pytest.mark.parametrize("path", ("legacy", "staged", "file-artifact"))
def test_the_batch_column_holds_each_rows_batch_on_every_target(
    kind: str, path: str, tmp_path: Path
) -> None:
    route = Route(tmp_path, kind=kind, rows=120)
    first = route.runtime().run(route.spec(path, batch_column="_dpone_batch_id"))
    route.add_rows(30)
    second = route.runtime().run(route.spec(path, run_id="run-2", batch_column="_dpone_batch_id"))
    sink = route.sink.inner
    if kind == "clickhouse":
        batches = [sink.batch_rows("_dpone_batch_id", r.batch_id) for r in (first, second)]
        assert batches == [120, 30]
    rows = route.target_rows()
    assert sorted(row[0] for row in rows) == route.source_ids()
    assert {row[-1] for row in rows} == {first.batch_id, second.batch_id}
    assert sum(row[-1] == second.batch_id for row in rows) == 30


def test_the_batch_column_is_refused_where_dpone_does_not_read_the_rows(tmp_path: Path) -> None:
    route = Route(tmp_path, kind="sqlite", rows=10)
    for options in ({"path": "lazy-plan"}, {"path": "legacy", "ledger": False}):
        with pytest.raises(ConfigInvalid) as raised:
            route.spec(options.pop("path"), batch_column="_dpone_batch_id", **options)
        assert raised.value.diagnostics == {"key": "target.batch_column"}
    with pytest.raises(ConfigInvalid) as clash:  # a column the source has already
        route.runtime().run(route.spec("legacy", batch_column="REGION"))
    assert clash.value.diagnostics["key"] == "target.batch_column"
    assert route.sink.target_calls == 0 and route.latest() == []


_CRASH_BEFORE_CHDB = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from helpers.routes import Route
    from dpone_native_transfer.testing import InjectedFault, RecordingSink
    route = Route(Path(sys.argv[1]), kind="clickhouse", rows=None)
    route.sink = RecordingSink(route.sink.inner, fail="before")
    try:
        route.runtime().run(route.spec("legacy", batch_column="_dpone_batch_id"))
    except InjectedFault:
        sys.exit(0)
    sys.exit(1)
    """
)


def test_on_chdb_the_batch_column_heals_both_outcomes_the_ledger_cannot_prove(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed between its rows and its ledger row (applied), or by a process now gone before
    its rows (not applied): a from_target run counts the batch's rows and heals it."""
    from dpone_native_transfer.connectors.clickhouse import sink as chdb_sink

    route = Route(tmp_path / "applied", kind="clickhouse", rows=120)
    spec = {"batch_column": "_dpone_batch_id"}
    with monkeypatch.context() as patched:
        patched.setattr(chdb_sink, "_record", _raise_injected)
        with pytest.raises(InjectedFault):
            route.runtime().run(route.spec("legacy", **spec))
    assert blocked(route) and route.sink.inner.read_ledger() == []
    route.runtime().run(route.spec("legacy", run_id="healing", recovery="from_target", **spec))
    [audit] = audits(route)
    assert (
        audit["ledger_overrides"] and audit["partitions"][0]["new_phase"] == "checkpoint_committed"
    )
    route.runtime().run(route.spec("legacy", run_id="next", **spec))  # the ledger check accepts
    assert_rows_exactly_once(route.source_ids(), route.target_ids())
    route.real_store.close()

    gone = Route(tmp_path / "gone", kind="clickhouse", rows=120, open_store=False)
    child = subprocess.run(
        [sys.executable, "-c", _CRASH_BEFORE_CHDB, str(gone.tmp)],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert child.returncode == 0, child.stderr
    gone = Route(tmp_path / "gone", kind="clickhouse", rows=None)
    assert blocked(gone)
    healed = gone.runtime().run(
        gone.spec("legacy", run_id="healing", recovery="from_target", **spec)
    )
    assert [e.fields["verdict"] for e in healed.events if e.name == EventName.GUARD_HEALED] == [
        "not_applied"
    ]
    assert_rows_exactly_once(gone.source_ids(), gone.target_ids())


@pytest.mark.parametrize("merge", (False, True))
def test_on_chdb_a_batch_promoted_in_part_is_counted_whole(tmp_path: Path, merge: bool) -> None:
    """Its promotion failed after one of four partitions: the batch column counts the whole
    batch, every partition its ledger row lists, not only the three still blocked (against
    those it said unknown, and from_target stayed blocked). A merge route's own column too."""
    route = Route(tmp_path, kind="clickhouse", rows=120)
    if merge:
        spec: dict[str, Any] = {"strategy": "merge", "primary_key": ("id",)}
    else:
        spec = {"batch_column": "_dpone_batch_id"}
    route.store.fail_batch(phase_batch("checkpoint_committed"), keep=1)
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy", **spec))
    key = route.spec("legacy", **spec).route
    assert len(blocked_partitions(route.real_store.list_latest(key))) == 3
    healed = route.runtime().run(
        route.spec("legacy", run_id="healing", recovery="from_target", **spec)
    )
    assert [
        (e.fields["verdict"], e.fields["partitions"])
        for e in healed.events
        if e.name == EventName.GUARD_HEALED
    ] == [("applied", 3)]
    assert healed.rows_loaded == 0
    assert_rows_exactly_once(route.source_ids(), route.target_ids())


def _raise_injected(*_: Any) -> int:
    raise InjectedFault("killed between the rows and the ledger row")


def test_verify_compares_each_applied_batch_with_the_rows_the_target_holds(
    tmp_path: Path,
) -> None:
    """Where the target can tell (a batch column), rows deleted behind dpone's back show."""
    route = Route(tmp_path, kind="duckdb", rows=120)
    route.real_store.close()
    route_file = route.route_file(
        path="legacy", sections={"target": {"batch_column": "_dpone_batch_id"}}
    )
    assert dpone("run", route_file).returncode == 0
    assert dpone("guard", "verify", route_file).returncode == 0
    import duckdb

    with contextlib.closing(duckdb.connect(str(route.target_path))) as conn:
        conn.execute("DELETE FROM orders_copy WHERE id <= 3")
    verified = dpone("guard", "verify", route_file, "--json")
    assert verified.returncode == 3
    [count] = [json.loads(line) for line in verified.stdout.splitlines()]
    assert (count["ledger_rows"], count["target_rows"]) == (120, 117)


def _after_insert(route: Route, body: str) -> None:
    schema = route.location.schema
    with contextlib.closing(psycopg.connect(route.location.dsn, autocommit=True)) as conn:
        conn.execute(f'CREATE TABLE "{schema}".audit (id integer)')
        conn.execute(
            f'CREATE FUNCTION "{schema}".after_insert() RETURNS trigger LANGUAGE plpgsql AS'
            f" $$ BEGIN {body}; RETURN NULL; END $$"
        )
        conn.execute(
            f'CREATE TRIGGER after_insert AFTER INSERT ON "{schema}".orders_copy FOR EACH ROW'
            f' EXECUTE FUNCTION "{schema}".after_insert()'
        )


@pytest.mark.parametrize("path", ("legacy", "staged"))
def test_after_triggers_on_postgres_are_allowed_and_counted(
    path: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An AFTER trigger cannot change the rows handed to the table, but may add or delete
    others: a table with one is counted inside the load. An audit trigger loads; one that
    copies each row into the table again is rolled back."""
    route = target("postgres", tmp_path, request)
    route.runtime().run(route.spec(path))
    schema = route.location.schema
    _after_insert(route, f'INSERT INTO "{schema}".audit VALUES (NEW.id)')
    route.add_rows(30)
    route.runtime().run(route.spec(path, run_id="run-2"))
    assert_rows_exactly_once(route.source_ids(), route.target_ids())

    with contextlib.closing(psycopg.connect(route.location.dsn, autocommit=True)) as conn:
        conn.execute(
            f'CREATE OR REPLACE FUNCTION "{schema}".after_insert() RETURNS trigger LANGUAGE'
            f' plpgsql AS $$ BEGIN IF NEW.id > 0 THEN INSERT INTO "{schema}".orders_copy'
            " (id) VALUES (-NEW.id); END IF; RETURN NULL; END $$"
        )
    route.add_rows(10)
    with pytest.raises(TargetRowsMismatch) as raised:
        route.runtime().run(route.spec(path, run_id="run-3"))
    assert (raised.value.diagnostics["sent"], raised.value.diagnostics["applied"]) == (10, 20)
    assert len(route.target_ids()) == 150 and blocked(route) == []
