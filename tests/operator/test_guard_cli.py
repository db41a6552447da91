"""``dpone-transfer guard scan|show|resolve``, run as an operator runs them.

Every command goes through the installed console script against real SQLite
stores. The blocked states are produced by real guarded runs with injected
faults (``testing.FaultyStore`` / ``RecordingSink``), never written by hand,
except the malformed guard, which no run can produce.
"""

from __future__ import annotations

import io
import json
import shlex
import sqlite3
import subprocess
import sys
from datetime import datetime, timedelta
from importlib import metadata
from pathlib import Path

import attrs
import pytest

from dpone_native_transfer import (
    ConfigInvalid,
    ManualReconciliationRequired,
    RouteKey,
    SQLiteCheckpointStore,
    TargetCommitGuardInvalid,
    checkpoint_to_payload,
    cli,
)
from dpone_native_transfer.testing import InjectedFault, build_sample_source, guard_phase
from dpone_native_transfer.testing import phase_batch as phase
from dpone_target_commit_guard.payload import batch_id_for

SCRIPT = str(Path(sys.executable).parent / "dpone-transfer")
ROUTE = ("orders", "orders_copy", "incremental_append")
ROUTE_ARGS = ("--route", *ROUTE)
ROUTE_KEY = RouteKey(*ROUTE)
HINT = "inspect it with: dpone-transfer guard scan --store "  # then the store the run used
# the error object's own message: the command line fills in the store it ran with
MESSAGE_HINT = HINT + "<checkpoint store> --route " + " ".join(ROUTE)
AUDIT_KEYS = {
    "audit_id",
    "at",
    "operator",
    "reason",
    "route",
    "resolved_as",
    "forced_invalid",
    "partitions",
    "proof",  # what the target's ledger proved about each resolved batch
}
AUDIT_PARTITION_KEYS = {
    "partition_id",
    "previous_status",
    "previous_phase",
    "previous_problem",
    "new_status",
    "new_phase",
    "batch_id",
}


def dpone(*args: str | Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """The console script; stdin is an empty pipe unless a test types into it."""
    return subprocess.run(
        [SCRIPT, *map(str, args)], input=stdin, capture_output=True, text=True, timeout=120
    )


def store_of(route) -> Path:
    return route.tmp / "checkpoints.db"


def scan(route, *extra: str) -> subprocess.CompletedProcess[str]:
    return dpone("guard", "scan", "--store", store_of(route), *extra)


def show(route) -> subprocess.CompletedProcess[str]:
    return dpone("guard", "show", "--store", store_of(route), *ROUTE_ARGS)


def resolve(store: Path, *extra: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    reason = ("--reason", "checked the target by hand") if "--reason" not in extra else ()
    operator = ("--operator", "alice") if "--operator" not in extra else ()
    command = ("guard", "resolve", "--store", store, *ROUTE_ARGS)
    return dpone(*command, *reason, *operator, *extra, stdin=stdin)


def confirmed(store: Path, resolved_as: str, *selection: str) -> subprocess.CompletedProcess[str]:
    """``guard resolve ... --as RESOLVED_AS --yes`` for the partitions ``selection`` names."""
    return resolve(store, *selection, "--as", resolved_as, "--yes")


def json_lines(done: subprocess.CompletedProcess[str]) -> list[dict]:
    return [json.loads(line) for line in done.stdout.splitlines()]


def stored(opened: SQLiteCheckpointStore, route: RouteKey) -> list[RouteKey]:
    """The store's routes of ``route``'s table names (located in the test's files)."""
    named = [r for r in opened.list_routes() if r.as_dict() == route.as_dict()]
    return named or [route]


def snapshot(store: Path) -> tuple[list, list]:
    """Every checkpoint ever written and every audit record: to prove nothing was written."""
    with SQLiteCheckpointStore(store) as opened:
        routes = stored(opened, ROUTE_KEY)
        return (
            [cp for r in routes for cp in opened.history(r)],
            [a for r in routes for a in opened.list_audit(r)],
        )


def audit_of(store: Path) -> list[dict]:
    with SQLiteCheckpointStore(store) as opened:
        return [record for r in stored(opened, ROUTE_KEY) for record in opened.list_audit(r)]


def latest_of(store: Path, route: RouteKey = ROUTE_KEY) -> dict:
    with SQLiteCheckpointStore(store) as opened:
        return {cp.partition_id: cp for r in stored(opened, route) for cp in opened.list_latest(r)}


# the blocking phases, each produced by a real guarded run -----------------------------


def make_armed(route) -> None:
    """The target committed, then raised, and the outcome marker could not be written."""
    route.sink.fail = "after"
    route.store.fail_batch(phase("target_outcome_unknown"), error=OSError("store down"))
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy"))
    route.sink.fail = None


def make_checkpoint_incomplete(route) -> None:
    """The target committed; only one of four promotions became durable."""
    route.store.fail_batch(phase("checkpoint_committed"), keep=1)
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy"))


def make_target_outcome_unknown(route, fail: str = "before") -> None:
    """The target call raised before touching the table: the target holds none of the rows.

    ``fail="after"``: it raised after committing them (the target's ledger shows it).
    """
    route.sink.fail = fail
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy"))
    route.sink.fail = None


BLOCKING = {
    "armed": (make_armed, 4),
    "checkpoint_incomplete": (make_checkpoint_incomplete, 3),
    "target_outcome_unknown": (make_target_outcome_unknown, 4),
}


def make_malformed(route) -> str:
    """A clean run, then one checkpoint whose guard contradicts its status."""
    route.runtime().run(route.spec("legacy"))
    first = route.latest()[0]
    guard = {**first.diagnostics["target_commit_guard"], "phase": "armed"}
    route.real_store.upsert(attrs.evolve(first, diagnostics={"target_commit_guard": guard}))
    return first.partition_id


def runtime_block(route) -> Exception:
    """What the runtime says about the same store: the scan must name the same partitions."""
    with pytest.raises((ManualReconciliationRequired, TargetCommitGuardInvalid)) as info:
        route.runtime().run(route.spec("legacy", run_id="retry"))
    return info.value


# scan ---------------------------------------------------------------------------------


def test_clean_route_scans_with_exit_0(route):
    route.runtime().run(route.spec("legacy"))
    done = scan(route)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "nothing blocks: no unresolved or malformed guard on 1 route\n"
    assert done.stderr == ""
    as_json = scan(route, "--json")
    assert (as_json.returncode, as_json.stdout) == (0, "")


@pytest.mark.parametrize("blocking_phase", sorted(BLOCKING))
def test_each_blocking_phase_scans_with_exit_3_and_agrees_with_the_runtime(route, blocking_phase):
    make, count = BLOCKING[blocking_phase]
    make(route)
    done = scan(route)
    assert done.returncode == cli.EXIT_BLOCKED, done.stderr
    header, *rows, summary = done.stdout.splitlines()
    assert header.split() == [
        "ROUTE",
        "PARTITION",
        "STATUS",
        "PHASE",
        "BATCH",
        "STARTED_AT",
        "COMPLETED_AT",
    ]
    assert len(rows) == count
    assert all(f" {blocking_phase} " in row for row in rows)
    assert all(row.startswith("orders -> orders_copy (incremental_append)  p-") for row in rows)
    assert summary.startswith(f"{count} blocked partition")
    assert "on 1 of 1 route;" in summary

    found = json_lines(scan(route, "--json"))
    error = runtime_block(route)
    assert {item["partition_id"] for item in found} == {
        item["partition_id"] for item in error.diagnostics["partitions"]
    }
    assert {item["phase"] for item in found} == {blocking_phase}
    assert set(error.diagnostics["batch_ids"]) == {item["batch_id"] for item in found}


def test_a_route_a_run_holds_the_lease_of_is_in_progress_not_blocked(route):
    """While a run holds the route's lease, its armed partitions are its own, under way:
    ``scan`` and ``verify`` said "blocked" (exit 3) and ``verify`` advised a resolve, and on
    DuckDB ``verify``'s open of the file made the run's own open fail. Both say the route is
    in progress now, and leave its target alone. Found by a hostile check."""
    from dpone_native_transfer.lease import Lease

    make_target_outcome_unknown(route)
    verify = ("guard", "verify", "--store", store_of(route), *ROUTE_ARGS)
    key = route.spec("legacy").route  # located, as the run keys its lease
    with Lease(route.real_store.lease_table(), key, run_id="under-way", seconds=60):
        for done in (scan(route), dpone(*verify)):
            assert done.returncode == 0, done.stdout + done.stderr
            assert "in progress: route" in done.stderr and "(1 route in progress" in done.stdout
            assert done.stdout.startswith("nothing blocks") and "partition" not in done.stdout
    assert scan(route).returncode == cli.EXIT_BLOCKED  # the lease released: blocked again
    assert dpone(*verify).returncode == cli.EXIT_BLOCKED


def test_json_lines_carry_the_same_facts_as_the_table(route):
    make_checkpoint_incomplete(route)
    table = scan(route).stdout.splitlines()[1:-1]
    done = scan(route, "--json")
    assert done.returncode == cli.EXIT_BLOCKED
    assert done.stderr.startswith("3 blocked partitions on 1 of 1 route;")
    found = json_lines(done)
    assert len(found) == len(table) == 3
    for item, row in zip(found, table, strict=True):
        assert set(item) == {
            "route",
            "partition_id",
            "status",
            "phase",
            "problem",
            "batch_id",
            "started_at",
            "completed_at",
        }
        assert item["route"] == ROUTE_KEY.as_dict()
        assert item["problem"] is None
        cells = row.split()
        assert cells[4:] == [
            item["partition_id"],
            item["status"],
            item["phase"],
            item["batch_id"],
            item["started_at"],
            item["completed_at"],
        ]
        assert datetime.fromisoformat(item["started_at"]).utcoffset() == timedelta(0)


def rows_after_the_refresh(route) -> None:
    """An append route continues after a refresh of its source table: give it rows to load."""
    build_sample_source(route.source_path, rows=120, partitions=4, start_id=121)


def test_scan_covers_every_route_and_route_limits_it(route):
    route.runtime().run(route.spec("legacy", strategy="full_refresh"))  # a clean second route
    rows_after_the_refresh(route)
    make_target_outcome_unknown(route)
    everything = scan(route)
    assert everything.returncode == cli.EXIT_BLOCKED
    assert everything.stdout.splitlines()[-1].startswith("4 blocked partitions on 1 of 2 routes;")
    other = scan(route, "--route", "orders", "orders_copy", "full_refresh")
    assert (other.returncode, other.stdout.splitlines()[-1]) == (
        0,
        "nothing blocks: no unresolved or malformed guard on 1 route",
    )
    mine = scan(route, *ROUTE_ARGS, "--json")
    assert mine.returncode == cli.EXIT_BLOCKED
    assert len(json_lines(mine)) == 4


def test_malformed_guard_scans_with_its_problem_code_and_exit_3(route):
    partition_id = make_malformed(route)
    done = scan(route)
    assert done.returncode == cli.EXIT_BLOCKED
    [row] = done.stdout.splitlines()[1:-1]
    assert row.split()[4:8] == [partition_id, "committed", "malformed:status_phase_mismatch", "-"]
    [item] = json_lines(scan(route, "--json"))
    assert (item["phase"], item["problem"], item["batch_id"]) == (
        None,
        "status_phase_mismatch",
        None,
    )
    error = runtime_block(route)
    assert isinstance(error, TargetCommitGuardInvalid)
    assert error.message.endswith(MESSAGE_HINT)


# show ---------------------------------------------------------------------------------


def test_show_lists_every_latest_checkpoint_with_phase_bounds_and_no_audit(route):
    make_checkpoint_incomplete(route)
    done = show(route)
    assert done.returncode == 0, done.stderr
    title, where, header, *rows, audit = done.stdout.splitlines()
    assert title == "route orders -> orders_copy (incremental_append): 4 partitions, 3 blocked"
    located = route.spec("legacy").route  # locations are digests: no path is ever printed
    assert where == f"  source {located.source_location}, target {located.target_location}"
    assert str(route.tmp) not in done.stdout
    assert header.split()[:5] == ["PARTITION", "STATUS", "GUARD", "BATCH", "ROWS"]
    assert header.split()[-1] == "BOUNDS"
    assert audit == "audit: 0 records"
    latest = {cp.partition_id: cp for cp in route.latest()}
    assert [row.split()[0] for row in rows] == sorted(latest)
    for row in rows:
        checkpoint = latest[row.split()[0]]
        bounds = json.dumps(checkpoint.partition_bounds, sort_keys=True, separators=(",", ":"))
        assert row.endswith(bounds)
        assert row.split()[1:3] == [checkpoint.status.value, guard_phase(checkpoint)]
        assert row.split()[4] == str(checkpoint.rows_exported)


def test_show_names_legacy_and_malformed_checkpoints(route):
    # unguarded first: once a guard is on the target table, an unguarded run refuses it
    route.runtime(plugins=[]).run(route.spec("legacy", strategy="full_refresh"))
    rows_after_the_refresh(route)
    partition_id = make_malformed(route)
    done = show(route)
    assert f"{partition_id}  committed  malformed: status_phase_mismatch  -" in done.stdout
    legacy = dpone(
        *("guard", "show", "--store", store_of(route)),
        *("--route", "orders", "orders_copy", "full_refresh"),
    )
    assert legacy.returncode == 0
    rows = legacy.stdout.splitlines()[3:-1]
    assert len(rows) == 4
    assert all("  committed  legacy, no guard  -  " in row for row in rows)


# A record as a hand (or a foreign tool) left it in the store: none of these was written by
# dpone, and each was shown as "#2 ? ? resolved 0 partitions as ?: ?" (or its keys ignored).
DAMAGED_AUDIT = {
    "empty": (lambda r: {}, "at, forced_invalid, operator, partitions, reason, resolved_as, route"),
    "no partitions": (lambda r: {k: v for k, v in r.items() if k != "partitions"}, "partitions"),
    "partitions not objects": (lambda r: {**r, "partitions": ["SECRET"]}, "partitions"),
    "overrides not a list": (lambda r: {**r, "ledger_overrides": "SECRET"}, "ledger_overrides"),
    "reason not text": (lambda r: {**r, "reason": ["SECRET"]}, "reason"),
}


@pytest.mark.parametrize("case", sorted(DAMAGED_AUDIT))
def test_show_says_an_audit_record_missing_its_keys_is_malformed_and_prints_no_value(route, case):
    damage, keys = DAMAGED_AUDIT[case]
    make_checkpoint_incomplete(route)
    store = store_of(route)
    assert confirmed(store, "committed", "--batch", scan_batch(route)).returncode == 0
    with sqlite3.connect(store) as db:  # a second record of the route, damaged
        [(record,)] = db.execute("SELECT record FROM audit").fetchall()
        damaged = json.dumps({**damage(json.loads(record)), "note": "SECRET"})
        db.execute(
            "INSERT INTO audit (source_table, target_table, strategy, source_location,"
            " target_location, record) SELECT source_table, target_table, strategy,"
            " source_location, target_location, ? FROM audit",
            (damaged,),
        )
    db.close()
    done = show(route)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    audit = lines.index("audit: 2 records, 1 malformed")
    assert lines[audit + 1].endswith(" alice resolved 3 partitions as committed: checked the "
                                     "target by hand")  # fmt: skip
    assert lines[-1] == f"  #2 malformed audit record: {keys} missing or not as dpone writes them"
    as_json = dpone("guard", "show", "--store", store, *ROUTE_ARGS, "--json")
    assert json_lines(as_json)[-1] == {"audit": {"audit_id": 2, "malformed": keys.split(", ")}}
    assert "SECRET" not in done.stdout + done.stderr + as_json.stdout + as_json.stderr


def scan_batch(route) -> str:
    """The one batch the route's blocked partitions belong to."""
    [batch_id] = {item["batch_id"] for item in json_lines(scan(route, "--json"))}
    return batch_id


# resolve ------------------------------------------------------------------------------


@pytest.fixture
def demo(tmp_path) -> Path:
    """`dpone-transfer demo` in a folder of its own: 5 partitions checkpoint_incomplete.

    Run per test, not copied: a route is keyed by its files' locations, so a copied
    folder is another route (the ledger then refuses it: see
    tests/recovery/test_target_truth.py).
    """
    workdir = tmp_path / "demo"
    done = dpone("demo", "--workdir", workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir


def count_rows(path: Path, sql: str) -> int:
    with sqlite3.connect(path) as connection:
        value = connection.execute(sql).fetchone()[0]
    connection.close()
    return value


def test_demo_resolved_as_committed_then_run_loads_nothing_and_source_equals_target(demo):
    store = demo / "checkpoints.db"
    blocked = dpone("run", demo / "route.toml")
    assert blocked.returncode == cli.EXIT_BLOCKED
    hint = next(line for line in blocked.stderr.splitlines() if HINT in line)
    command = shlex.split(hint.split("inspect it with: ")[1].split(";")[0])
    assert command[5:] == ["--route", *ROUTE] and Path(command[4]).resolve() == store.resolve()
    pointed = dpone(*command[1:])  # the exact command the message names
    assert pointed.returncode == cli.EXIT_BLOCKED
    [batch_id] = {item["batch_id"] for item in json_lines(scan_store(store))}

    done = confirmed(store, "committed", "--batch", batch_id)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "route orders -> orders_copy (incremental_append): resolve as committed"
        " (unchecked: the target's ledger proves nothing here)"
    ), "--store alone does not say where the target is"
    assert len(lines[1:-1]) == 5
    assert all(
        "failed/checkpoint_incomplete -> committed/checkpoint_committed  batch " + batch_id in line
        for line in lines[1:-1]
    )
    assert lines[-1] == "wrote 5 checkpoints and audit record #1"
    assert scan_store(store).returncode == 0

    run = dpone("run", demo / "route.toml", "--run-id", "after-resolve")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("committed 0 partitions, skipped 8, loaded 0 rows")
    source = count_rows(demo / "source.db", "SELECT COUNT(*) FROM orders")
    target = count_rows(demo / "target.db", "SELECT COUNT(*) FROM orders_copy")
    distinct = count_rows(demo / "target.db", "SELECT COUNT(DISTINCT id) FROM orders_copy")
    assert source == target == distinct == 25_000


def scan_store(store: Path) -> subprocess.CompletedProcess[str]:
    return dpone("guard", "scan", "--store", store, "--json")


def test_resolved_as_failed_before_target_then_run_loads_the_rows_exactly_once(route):
    make_target_outcome_unknown(route)
    route_file = route.route_file()
    assert route.target_ids() == []
    blocked = dpone("run", route_file)
    assert blocked.returncode == cli.EXIT_BLOCKED
    assert HINT in blocked.stderr
    [batch_id] = {item["batch_id"] for item in json_lines(scan(route, "--json"))}

    done = confirmed(store_of(route), "failed_before_target", "--batch", batch_id)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("failed/target_outcome_unknown -> failed/failed_before_target") == 4
    run = dpone("run", route_file, "--run-id", "after-resolve")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("committed 4 partitions, skipped 0, loaded 120 rows")
    assert route.target_ids() == route.source_ids()
    again = dpone("run", route_file)
    assert again.stdout.startswith("committed 0 partitions, skipped 0, loaded 0 rows")
    assert route.target_ids() == route.source_ids()


def test_run_proceeds_for_exactly_the_resolved_partitions(route):
    """Half the rows are removed from the target by the operator: two reloaded, two skipped."""
    route.sink.fail = "after"  # the target holds every row, the outcome is unknown
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy"))
    route.sink.fail = None
    by_region = {cp.partition_bounds["partition"]: cp.partition_id for cp in route.latest()}
    removed, kept = sorted(by_region)[:2], sorted(by_region)[2:]
    with sqlite3.connect(route.tmp / "target.db") as connection:
        connection.execute("DELETE FROM orders_copy WHERE region IN (?, ?)", tuple(removed))
    connection.close()
    store = store_of(route)

    route_file = route.route_file()  # the store alone does not say where the target is

    def by_file(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        who = ("--reason", "rows of two regions deleted", "--operator", "alice")
        return dpone("guard", "resolve", route_file, *args, *who, stdin=stdin)

    missing = partition_args(by_region, removed)
    checked = by_file(*missing, "--as", "failed_before_target", "--yes")
    assert checked.returncode == cli.EXIT_CONFIG, "the target's ledger says the rows are there"
    assert "--force" in checked.stderr
    first = by_file(*missing, "--force", "--as", "failed_before_target")
    assert first.returncode == cli.EXIT_CONFIG, "no confirmation on empty stdin: say --yes"
    still = by_file(*missing, "--force", "--as", "failed_before_target", "--yes")
    assert still.returncode == 0, still.stderr
    assert "against the target's ledger (--force)" in still.stdout
    partial = dpone("run", route.route_file())
    assert partial.returncode == cli.EXIT_BLOCKED, "two partitions are still unresolved"
    assert confirmed(store, "committed", *partition_args(by_region, kept)).returncode == 0
    run = dpone("run", route.route_file(), "--run-id", "after-resolve")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("committed 2 partitions, skipped 2, loaded 60 rows")
    assert route.target_ids() == route.source_ids()
    assert [record["resolved_as"] for record in audit_of(store)] == [
        "failed_before_target",
        "committed",
    ]


def partition_args(by_region: dict[str, str], regions: list[str]) -> list[str]:
    return [arg for region in regions for arg in ("--partition", by_region[region])]


def test_resolve_writes_guarded_checkpoints_and_a_complete_audit_record(route):
    make_target_outcome_unknown(route, fail="after")
    store = store_of(route)
    before = latest_of(store)
    chosen = sorted(before)[:2]
    reason, operator = "rows 1-60 found in orders_copy (REASON-TEXT)", "bob (OPERATOR-TEXT)"
    selection = ("--partition", chosen[0], "--partition", chosen[1], "--partition", chosen[0])
    done = resolve(
        store, *selection, "--as", "committed", "--reason", reason, "--operator", operator, "--yes"
    )
    assert done.returncode == 0, done.stderr
    [record] = audit_of(store)
    assert set(record) == AUDIT_KEYS
    at = datetime.fromisoformat(record["at"])
    assert at.utcoffset() == timedelta(0)
    assert abs(datetime.now(at.tzinfo) - at) < timedelta(minutes=5)
    assert (record["operator"], record["reason"]) == (operator, reason)
    assert record["route"] == ROUTE_KEY.as_dict()
    assert (record["resolved_as"], record["forced_invalid"], record["audit_id"]) == (
        "committed",
        False,
        1,
    )
    assert [item["partition_id"] for item in record["partitions"]] == chosen
    after = latest_of(store)
    for item in record["partitions"]:
        assert set(item) == AUDIT_PARTITION_KEYS
        old, new = before[item["partition_id"]], after[item["partition_id"]]
        old_guard = old.diagnostics["target_commit_guard"]
        assert item == {
            "partition_id": old.partition_id,
            "previous_status": "failed",
            "previous_phase": "target_outcome_unknown",
            "previous_problem": None,
            "new_status": "committed",
            "new_phase": "checkpoint_committed",
            "batch_id": old_guard["checkpoint_batch_id"],
        }
        assert new.started_at == new.completed_at == at
        assert new.diagnostics == {
            "target_commit_guard": {**old_guard, "phase": "checkpoint_committed"},
            "ledger_batch_id": old_guard["checkpoint_batch_id"],
            "definition": old.diagnostics["definition"],  # the route's, kept as it was
            "edge_rows": old.diagnostics["edge_rows"],
            "lease_epoch": old.diagnostics["lease_epoch"],
            "lease_process": old.diagnostics["lease_process"],
        }, "the failure code goes when the rows are in the target"
        unchanged = attrs.evolve(
            new,
            status=old.status,
            started_at=old.started_at,
            completed_at=old.completed_at,
            diagnostics=old.diagnostics,
        )
        assert unchanged == old, "only status, timestamps and diagnostics change"
    untouched = sorted(before)[2:]
    assert all(after[pid] == before[pid] for pid in untouched)
    stored = json.dumps([checkpoint_to_payload(cp) for cp in snapshot(store)[0]])
    assert "REASON-TEXT" not in stored and "OPERATOR-TEXT" not in stored


def test_resolving_as_failed_before_target_keeps_the_failure_code(route):
    make_target_outcome_unknown(route)
    store = store_of(route)
    pid = sorted(latest_of(store))[0]
    assert confirmed(store, "failed_before_target", "--partition", pid).returncode == 0
    resolved = latest_of(store)[pid]
    assert resolved.status.value == "failed"
    assert resolved.diagnostics["error"] == "target_call_failed"
    assert resolved.diagnostics["target_commit_guard"]["phase"] == "failed_before_target"


def test_batch_selects_only_the_blocked_partitions_of_that_batch(route):
    make_checkpoint_incomplete(route)
    store = store_of(route)
    [batch_id] = {item["batch_id"] for item in json_lines(scan(route, "--json"))}
    done = confirmed(store, "committed", "--batch", batch_id)
    assert done.returncode == 0, done.stderr
    [record] = audit_of(store)
    assert len(record["partitions"]) == 3, "the durable committed partition is not blocked"
    assert scan(route).returncode == 0


def test_malformed_guard_is_refused_without_force_invalid_and_resolved_with_it(route):
    partition_id = make_malformed(route)
    store = store_of(route)
    untouched = snapshot(store)
    refused = confirmed(store, "committed", "--partition", partition_id)
    assert refused.returncode == cli.EXIT_CONFIG
    assert "malformed guard: " + partition_id in refused.stderr
    assert "--force-invalid" in refused.stderr
    assert snapshot(store) == untouched

    done = confirmed(store, "committed", "--partition", partition_id, "--force-invalid")
    assert done.returncode == 0, done.stderr
    assert f"{partition_id}  committed/malformed:status_phase_mismatch -> committed/" in done.stdout
    [record] = audit_of(store)
    assert record["forced_invalid"] is True
    [item] = record["partitions"]
    assert (item["previous_phase"], item["previous_problem"]) == (None, "status_phase_mismatch")
    resolved = latest_of(store)[partition_id]
    assert item["batch_id"] == batch_id_for(resolved.run_id, [partition_id])
    assert resolved.diagnostics["target_commit_guard"]["checkpoint_batch_id"] == item["batch_id"]
    assert scan(route).returncode == 0
    assert "forced over a malformed guard" in show(route).stdout
    result = route.runtime().run(route.spec("legacy", run_id="after-resolve"))
    assert result.rows_loaded == 0


# refusals and confirmation ------------------------------------------------------------


@pytest.mark.parametrize(
    ("which", "says"),
    [
        ("committed", "(committed, checkpoint_committed)"),
        ("unknown", "p-does-not-exist (unknown on this route)"),
    ],
)
def test_a_partition_that_is_not_blocked_refuses_the_whole_command(route, which, says):
    make_checkpoint_incomplete(route)
    store = store_of(route)
    latest = latest_of(store)
    committed = next(pid for pid, cp in latest.items() if cp.status.value == "committed")
    blocked = next(pid for pid, cp in latest.items() if cp.status.value == "failed")
    named = committed if which == "committed" else "p-does-not-exist"
    untouched = snapshot(store)
    done = resolve(
        store, "--partition", blocked, "--partition", named, "--as", "committed", "--yes"
    )
    assert done.returncode == cli.EXIT_CONFIG
    assert done.stdout == ""
    error, diagnostics = done.stderr.splitlines()
    assert error.startswith("error: native_transfer_config_invalid: refusing to resolve")
    assert says in error and error.endswith("nothing was written")
    assert blocked not in error
    assert json.loads(diagnostics.removeprefix("diagnostics: "))["partition_ids"] == [named]
    assert snapshot(store) == untouched


def test_legacy_and_failed_before_target_partitions_are_not_blocked(route):
    route.runtime(plugins=[]).run(route.spec("legacy", strategy="full_refresh"))  # legacy
    rows_after_the_refresh(route)
    route.store.fail_batch(phase("armed"), keep=2)  # -> failed_before_target
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy"))
    store = store_of(route)
    pid = sorted(latest_of(store))[0]
    done = confirmed(store, "committed", "--partition", pid)
    assert done.returncode == cli.EXIT_CONFIG
    assert f"{pid} (failed, failed_before_target)" in done.stderr
    legacy_id = sorted(latest_of(store, attrs.evolve(ROUTE_KEY, strategy="full_refresh")))[0]
    legacy = dpone(
        *("guard", "resolve", "--store", store, "--route", "orders", "orders_copy", "full_refresh"),
        *("--partition", legacy_id, "--as", "committed", "--reason", "r", "--operator", "o"),
        "--yes",
    )
    assert legacy.returncode == cli.EXIT_CONFIG
    assert f"{legacy_id} (committed, legacy, no guard)" in legacy.stderr


@pytest.mark.parametrize(
    ("drop", "empty"),
    [("--reason", False), ("--operator", False), ("--reason", True), ("--operator", True)],
)
def test_reason_and_operator_are_required_and_not_empty(route, drop, empty):
    make_target_outcome_unknown(route)
    store = store_of(route)
    untouched = snapshot(store)
    pid = sorted(latest_of(store))[0]
    args = {"--reason": "checked", "--operator": "alice"}
    if empty:
        args[drop] = "  "
    else:
        del args[drop]
    done = dpone(
        *("guard", "resolve", "--store", store, *ROUTE_ARGS, "--partition", pid),
        *("--as", "committed", "--yes", *[x for pair in args.items() for x in pair]),
    )
    assert done.returncode == cli.EXIT_CONFIG
    assert drop in done.stderr
    assert snapshot(store) == untouched


@pytest.mark.parametrize(
    ("typed", "written"),
    [
        ("", False),
        ("\n", False),
        ("n\n", False),
        ("nope\n", False),
        ("y\n", True),
        ("YES\n", True),
    ],
)
def test_confirmation_on_stdin(route, typed, written):
    make_target_outcome_unknown(route, fail="after")
    store = store_of(route)
    untouched = snapshot(store)
    pid = sorted(latest_of(store))[0]
    done = resolve(store, "--partition", pid, "--as", "committed", stdin=typed)
    plan, prompt = done.stdout.splitlines()[1:3]
    assert plan.strip().startswith(pid + "  failed/target_outcome_unknown -> committed/")
    assert prompt.startswith("Write 1 checkpoint and one audit record? [y/N] ")
    if written:
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[-1] == "wrote 1 checkpoint and audit record #1"
        assert len(audit_of(store)) == 1
    elif typed:  # an answer that is not yes
        assert done.returncode == cli.EXIT_FAILED
        assert done.stderr == "nothing written\n"
        assert snapshot(store) == untouched
    else:  # no answer at all (stdin closed or empty, as in a script): say --yes, exit 2
        assert done.returncode == cli.EXIT_CONFIG
        assert "nothing written" in done.stderr and "repeat with --yes" in done.stderr
        assert snapshot(store) == untouched


def test_partition_and_batch_are_exclusive_and_one_is_required(route):
    make_target_outcome_unknown(route)
    store = store_of(route)
    neither = resolve(store, "--as", "committed", "--yes")
    both = resolve(store, "--partition", "p-1", "--batch", "b", "--as", "committed", "--yes")
    unknown_batch = resolve(store, "--batch", "sha256:" + "0" * 64, "--as", "committed", "--yes")
    bad_as = resolve(store, "--partition", "p-1", "--as", "maybe", "--yes")
    for done in (neither, both, unknown_batch, bad_as):
        assert done.returncode == cli.EXIT_CONFIG
    assert "not allowed with argument" in both.stderr
    assert "no blocked partition of this route carries the batch id" in unknown_batch.stderr


# stores, exit statuses, what is never printed -----------------------------------------


@pytest.mark.parametrize("action", ["scan", "show", "resolve"])
def test_a_missing_store_is_a_usage_error_and_is_never_created(tmp_path, action):
    extra = {
        "scan": (),
        "show": ROUTE_ARGS,
        "resolve": (
            *(*ROUTE_ARGS, "--partition", "p-1", "--as", "committed"),
            *("--reason", "r", "--operator", "o", "--yes"),
        ),
    }[action]
    for store in (tmp_path / "secret-folder" / "checkpoints.db", tmp_path / "checkpoints.db"):
        done = dpone("guard", action, "--store", store, *extra)
        assert done.returncode == cli.EXIT_CONFIG
        assert done.stderr.splitlines() == [
            "error: native_transfer_config_invalid: the checkpoint store given as --store "
            "does not exist",
            'diagnostics: {"argument": "--store"}',
        ]
    assert list(tmp_path.iterdir()) == []


def test_a_route_files_missing_store_is_named_by_its_key_not_as_store(tmp_path):
    """``guard verify ROUTE_FILE`` before any run said the store "given as --store" did not
    exist, where none was given (found by a hostile check)."""
    from helpers.routes import write_route

    route_file = write_route(tmp_path, rows=10, kind="duckdb", path="legacy")
    for action in ("verify", "scan"):
        done = dpone("guard", action, route_file)
        assert done.returncode == cli.EXIT_CONFIG
        assert done.stderr.splitlines() == [
            "error: native_transfer_config_invalid: the checkpoint store given as store.path "
            "does not exist",
            'diagnostics: {"key": "store.path"}',
        ]
    assert not (tmp_path / "checkpoints.db").exists()


def test_a_corrupt_store_fails_with_exit_1(tmp_path):
    store = tmp_path / "checkpoints.db"
    store.write_bytes(b"not a store" * 100)
    done = dpone("guard", "scan", "--store", store)
    assert done.returncode == cli.EXIT_FAILED
    assert "native_transfer_checkpoint_store_corrupt" in done.stderr
    assert str(tmp_path) not in done.stderr


def test_a_bad_route_strategy_is_a_usage_error(route):
    route.runtime().run(route.spec("legacy"))
    done = dpone("guard", "show", "--store", store_of(route), "--route", "orders", "x", "append")
    assert done.returncode == cli.EXIT_CONFIG
    assert "--route STRATEGY must be one of: incremental_append, full_refresh" in done.stderr


ROW_CANARY = "ROW-CANARY-4711"
ERROR_CANARY = "password=EXCEPTION-CANARY"


def test_scan_show_and_resolve_never_print_row_values_or_exception_text(route):
    with sqlite3.connect(route.source_path) as connection:
        connection.execute("ALTER TABLE orders ADD COLUMN note TEXT")
        connection.execute("UPDATE orders SET note = ?", (ROW_CANARY,))
    connection.close()
    route.sink.error = InjectedFault(f"INSERT failed for {ERROR_CANARY} value {ROW_CANARY}")
    make_target_outcome_unknown(route)
    assert ERROR_CANARY in str(route.sink.error)
    store = store_of(route)
    [batch_id] = {item["batch_id"] for item in json_lines(scan(route, "--json"))}
    outputs = [
        scan(route),
        scan(route, "--json"),
        show(route),
        resolve(store, "--batch", batch_id, "--as", "failed_before_target"),
        dpone("run", route.route_file()),
    ]
    for done in outputs:
        assert done.returncode in (cli.EXIT_BLOCKED, cli.EXIT_CONFIG, cli.EXIT_FAILED, 0)
        for canary in (ROW_CANARY, ERROR_CANARY, "INSERT", "SELECT"):
            assert canary not in done.stdout + done.stderr


# the entry-point group ----------------------------------------------------------------


def test_guard_is_a_command_plugin_entry_point():
    [entry_point] = [
        ep for ep in metadata.entry_points(group=cli.COMMANDS_GROUP) if ep.name == "guard"
    ]
    assert entry_point.value == "dpone_target_commit_guard.commands:add_guard_command"
    usage = dpone("--help")
    assert usage.returncode == 0
    assert "guard" in usage.stdout and "inspect and resolve target-commit guards" in usage.stdout
    help_text = dpone("guard", "resolve", "--help").stdout
    options = ("--partition ID", "--batch BATCH_ID", "--as", "--reason TEXT", "--operator NAME")
    for option in (*options, "--force-invalid", "--yes"):
        assert option in help_text


@pytest.mark.parametrize(
    ("value", "error_type"),
    [
        ("no_such_module_for_dpone:add", "ModuleNotFoundError"),
        ("dpone_native_transfer.cli:_add_run_command", "ArgumentError"),  # clashes with `run`
    ],
)
def test_a_broken_command_plugin_is_a_clear_error_with_exit_2(
    monkeypatch, capsys, value, error_type
):
    broken = metadata.EntryPoint(name="broken", value=value, group=cli.COMMANDS_GROUP)
    real = metadata.entry_points

    def entry_points(**selection):
        found = list(real(**selection))
        return [*found, broken] if selection.get("group") == cli.COMMANDS_GROUP else found

    monkeypatch.setattr(cli.metadata, "entry_points", entry_points)
    assert cli.main(["run", "route.toml"]) == cli.EXIT_CONFIG
    error, diagnostics = capsys.readouterr().err.splitlines()
    assert error == (
        "error: native_transfer_plugin_load_failed: the command plugin 'broken' could not be loaded"
    )
    assert json.loads(diagnostics.removeprefix("diagnostics: ")) == {
        "entry_point": "broken",
        "error_type": error_type,
    }


# in-process: the same commands through ``cli.main``, for the finer cases ----------------


def main(*args: str | Path) -> int:
    return cli.main([str(arg) for arg in args])


def test_in_process_scan_resolve_show_cycle(route, capsys):
    make_checkpoint_incomplete(route)
    store = store_of(route)
    assert main("guard", "scan", "--store", store, "--json") == cli.EXIT_BLOCKED
    found = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    [batch_id] = {item["batch_id"] for item in found}
    args = ("guard", "resolve", "--store", store, *ROUTE_ARGS, "--batch", batch_id)
    assert main(*args, "--as", "committed", "--reason", "why", "--operator", "me", "--yes") == 0
    assert capsys.readouterr().out.endswith("wrote 3 checkpoints and audit record #1\n")
    assert main("guard", "show", "--store", store, *ROUTE_ARGS) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "route orders -> orders_copy (incremental_append): 4 partitions, 0 blocked"
    audit = out.index("audit: 1 record")
    assert out[audit + 1].endswith(" me resolved 3 partitions as committed: why")
    assert len(out[audit + 2 :]) == 3
    assert main("guard", "scan", "--store", store) == 0
    assert route.runtime().run(route.spec("legacy", run_id="after")).rows_loaded == 0


@pytest.mark.parametrize(("stdin", "code"), [("y\n", 0), ("no\n", 1), ("", 2), (None, 2)])
def test_in_process_confirmation(route, capsys, monkeypatch, stdin, code):
    make_target_outcome_unknown(route, fail="after")
    store = store_of(route)
    monkeypatch.setattr(sys, "stdin", None if stdin is None else io.StringIO(stdin))
    pid = sorted(latest_of(store))[0]
    args = ("guard", "resolve", "--store", store, *ROUTE_ARGS, "--partition", pid)
    assert main(*args, "--as", "committed", "--reason", "r", "--operator", "o") == code
    captured = capsys.readouterr()
    assert "Write 1 checkpoint and one audit record? [y/N] \n" in captured.out
    assert len(audit_of(store)) == (1 if code == 0 else 0)
    said = {0: "", 1: "nothing written\n"}.get(code)
    assert captured.err == said if said is not None else "repeat with --yes" in captured.err


def test_in_process_refusals_write_nothing(route, capsys):
    partition_id = make_malformed(route)
    store = store_of(route)
    untouched = snapshot(store)
    base = ("guard", "resolve", "--store", store, *ROUTE_ARGS, "--as", "failed_before_target")
    who = ("--reason", "r", "--operator", "o", "--yes")
    assert main(*base, "--partition", partition_id, *who) == cli.EXIT_CONFIG
    assert "--force-invalid" in capsys.readouterr().err
    other = sorted(latest_of(store))[-1]
    assert main(*base, "--partition", other, *who) == cli.EXIT_CONFIG
    assert f"{other} (committed, checkpoint_committed)" in capsys.readouterr().err
    assert snapshot(store) == untouched
    with_file = ("guard", "resolve", route.route_file(), "--as", "failed_before_target")
    assert main(*with_file, "--partition", partition_id, "--force-invalid", *who) == 2
    assert "the target's ledger proves 1 batch applied" in capsys.readouterr().err
    assert snapshot(store) == untouched
    assert main(*base, "--partition", partition_id, "--force-invalid", *who) == 0
    assert "(unchecked: the target's ledger proves nothing here)" in capsys.readouterr().out
    resolved = latest_of(store)[partition_id]
    assert (resolved.status.value, guard_phase(resolved)) == ("failed", "failed_before_target")
    assert main("guard", "scan", "--store", store, "--route", "a", "b", "sideways") == 2


def test_operator_functions_are_the_runtime_scan(route):
    """The scan policy is one function: the plugin's hook and ``guard scan`` both call it."""
    from dpone_target_commit_guard import plugin
    from dpone_target_commit_guard import policy as operator

    make_checkpoint_incomplete(route)
    latest = route.latest()
    findings = operator.blocked_partitions(latest)
    assert [f.partition_id for f in findings] == [
        cp.partition_id for cp in latest if cp.status.value == "failed"
    ]
    with pytest.raises(ManualReconciliationRequired) as info:
        plugin.resume_route_scan(route=ROUTE_KEY, checkpoints=latest, recovery=None)
    assert [item["partition_id"] for item in info.value.diagnostics["partitions"]] == [
        f.partition_id for f in findings
    ]
    with pytest.raises(ConfigInvalid, match="name the partitions to resolve"):
        operator.select_blocked(latest)


def test_show_blocked_limit_and_json_select_what_it_prints(route):
    make_checkpoint_incomplete(route)  # 4 partitions, 3 blocked
    blocked = json_lines(dpone("guard", "show", "--store", store_of(route), *ROUTE_ARGS,
                               "--blocked", "--json"))  # fmt: skip
    latest = {cp.partition_id: cp for cp in route.latest()}
    assert len(blocked) == 3 and {line["phase"] for line in blocked} == {"checkpoint_incomplete"}
    for line in blocked:
        checkpoint = latest[line["partition_id"]]
        assert line["partition_bounds"] == checkpoint.partition_bounds
        assert line["rows"] == checkpoint.rows_exported and line["status"] == "failed"
    every = json_lines(dpone("guard", "show", "--store", store_of(route), *ROUTE_ARGS, "--json"))
    assert sorted(line["partition_id"] for line in every) == sorted(latest)
    limited = dpone("guard", "show", "--store", store_of(route), *ROUTE_ARGS, "--blocked",
                    "--limit", "2")  # fmt: skip
    title, _, _, *rows, more, audit = limited.stdout.splitlines()
    assert title.endswith("4 partitions, 3 blocked") and len(rows) == 2
    assert [row.split()[0] for row in rows] == sorted(line["partition_id"] for line in blocked)[:2]
    assert more == "(1 more not shown: --limit 2)" and audit == "audit: 0 records"
    bad = dpone("guard", "show", "--store", store_of(route), *ROUTE_ARGS, "--limit", "0")
    assert bad.returncode == 2 and "--limit: must be a whole number" in bad.stderr


def test_a_locked_duckdb_target_refuses_resolve_as_and_reset_until_it_can_be_read(tmp_path):
    """While another process holds the DuckDB target (DuckDB locks the whole file), its ledger
    cannot be read now: ``resolve --as`` wrote its checkpoints "unchecked", as for a target
    that keeps no ledger, and ``state reset`` failed with the driver's class name. Both are
    ``target_unavailable`` (exit 1, nothing written); ``--force`` still resolves by hand.
    Found by a hostile check."""
    import duckdb
    from helpers.routes import write_route

    from dpone_native_transfer.application import transfer
    from dpone_native_transfer.pipeline import load_route
    from dpone_native_transfer.testing import FaultyStore

    route_file = write_route(tmp_path, rows=200, kind="duckdb", path="legacy")
    store, target = tmp_path / "checkpoints.db", tmp_path / "target.duckdb"

    def failing(real):
        faulty = FaultyStore(real)
        faulty.fail_batch(phase("checkpoint_committed"), error=InjectedFault("store down"))
        return faulty

    with pytest.raises(InjectedFault):  # the rows are in the target; its promotion failed
        transfer(load_route(str(route_file)), "applied", wrap_store=failing)
    [batch_id] = {item["batch_id"] for item in json_lines(scan_store(store))}
    before = snapshot(store)
    lock = duckdb.connect(str(target))
    try:
        as_committed = ("guard", "resolve", route_file, "--batch", batch_id, "--as", "committed",
                        "--reason", "checked", "--operator", "alice", "--yes")  # fmt: skip
        refused = dpone(*as_committed)
        assert refused.returncode == 1, refused.stdout + refused.stderr
        assert "native_transfer_target_unavailable" in refused.stderr
        assert snapshot(store) == before
        forced = dpone(*as_committed, "--force")
        assert forced.returncode == 0, forced.stderr
        assert "unchecked" in forced.stdout
        resolved = snapshot(store)
        reset = dpone("state", "reset", route_file, "--reason", "r", "--operator", "o", "--yes")
        assert reset.returncode == 1 and "native_transfer_target_unavailable" in reset.stderr
        assert "Error" not in reset.stderr  # no driver class named
        assert snapshot(store) == resolved
        verify = dpone("guard", "verify", route_file)
        assert verify.returncode == 1, verify.stdout + verify.stderr
        assert "nothing blocks" not in verify.stdout and "could not be compared" in verify.stdout
    finally:
        lock.close()
    ran = dpone("run", route_file)
    assert ran.returncode == 0 and "loaded 0 rows" in ran.stdout, ran.stdout + ran.stderr
    with duckdb.connect(str(target), read_only=True) as db:
        assert db.execute("SELECT count(*), count(DISTINCT id) FROM orders_copy").fetchone() == (
            200,
            200,
        )
