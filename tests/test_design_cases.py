"""The feature design's eleven required cases, on every path where they apply.

"No duplicate" is proven by counting target rows against source rows, not
only by counting sink calls.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime

import attrs
import pytest

from dpone_native_transfer import (
    ClockInvalid,
    ManualReconciliationRequired,
    PartitionCheckpointStatus,
    SQLiteSource,
    TargetCommitGuardInvalid,
    checkpoint_from_payload,
    checkpoint_to_payload,
)
from dpone_native_transfer.events import EVENT_ORDER
from dpone_native_transfer.testing import InjectedFault, guard_phase
from dpone_native_transfer.testing import phase_batch as phase

EXPORTED, COMMITTED, FAILED = (
    PartitionCheckpointStatus.EXPORTED,
    PartitionCheckpointStatus.COMMITTED,
    PartitionCheckpointStatus.FAILED,
)


def phases(route) -> dict[str, str | None]:
    return {cp.partition_id: guard_phase(cp) for cp in route.latest()}


def assert_blocked(route, *, calls_before: int) -> ManualReconciliationRequired:
    with pytest.raises(ManualReconciliationRequired) as info:
        route.runtime().run(route.spec("legacy", run_id="retry"))
    assert route.sink.target_calls == calls_before, "a blocked retry must not call the target"
    return info.value


def raised_from(info, function: str) -> bool:
    return any(entry.name == function for entry in info.traceback)


# 1
def test_partial_commit_with_failed_reconciliation_read_preserves_original(route, path):
    original = route.store.fail_batch(phase("checkpoint_committed"), keep=1)
    route.store.fail_reads(skip=2)  # the route scan reads fine; the reconciliation read fails
    with pytest.raises(InjectedFault) as info:
        route.runtime().run(route.spec(path))
    assert info.value is original
    assert raised_from(info, "upsert_many"), "the original traceback must be kept"
    after = phases(route)
    assert sorted(after.values()) == ["armed", "armed", "armed", "checkpoint_committed"]
    assert_blocked(route, calls_before=1)
    assert route.target_ids() == route.source_ids()


# 2
def test_partial_commit_with_failed_incomplete_marker_preserves_original(route, path):
    original = route.store.fail_batch(phase("checkpoint_committed"), keep=2)
    route.store.fail_batch(phase("checkpoint_incomplete"), error=OSError("marker write"))
    with pytest.raises(InjectedFault) as info:
        route.runtime().run(route.spec(path))
    assert info.value is original
    assert sorted(phases(route).values()) == ["armed", "armed"] + ["checkpoint_committed"] * 2
    assert_blocked(route, calls_before=1)
    assert route.target_ids() == route.source_ids()


def test_partial_commit_marks_the_rest_incomplete_and_never_downgrades_committed(route, path):
    original = route.store.fail_batch(phase("checkpoint_committed"), keep=1)
    with pytest.raises(InjectedFault) as info:
        route.runtime().run(route.spec(path))
    assert info.value is original
    latest = route.latest()
    committed = [cp for cp in latest if cp.status is COMMITTED]
    incomplete = [cp for cp in latest if guard_phase(cp) == "checkpoint_incomplete"]
    assert len(committed) == 1 and len(incomplete) == 3
    assert all(cp.status is FAILED for cp in incomplete)
    assert all(cp.diagnostics["error"] == "checkpoint_commit_failed" for cp in incomplete)
    error = assert_blocked(route, calls_before=1)
    assert error.diagnostics["phases"] == ["checkpoint_incomplete"]
    assert guard_phase(next(cp for cp in route.latest() if cp.status is COMMITTED))


# 3
def test_incremental_append_retry_after_partial_commit_stops_before_sink(route, path):
    route.store.fail_batch(phase("checkpoint_committed"), keep=3)
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path))
    for _ in range(3):  # an orchestrator retrying again and again
        error = assert_blocked(route, calls_before=1)
    assert error.code == "native_transfer_manual_reconciliation_required"
    assert route.target_ids() == route.source_ids(), "every source row exactly once"


def test_unguarded_runtime_duplicates_where_the_guard_blocks(route, path):
    """The difference the guard makes, shown on the same fault with plugins=[]."""
    route.store.fail_batch(phase(None), keep=3)
    with pytest.raises(InjectedFault):
        route.runtime(plugins=[]).run(route.spec(path))
    route.runtime(plugins=[]).run(route.spec(path, run_id="retry"))
    assert route.sink.target_calls == 2
    assert len(route.target_ids()) > len(route.source_ids()), "unguarded retry re-appends"


# 4
def test_surviving_armed_record_blocks_retry(route, path):
    route.sink.fail = "after"  # the target commits, then the call raises
    route.store.fail_batch(phase("target_outcome_unknown"), error=OSError("store down"))
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path))
    assert set(phases(route).values()) == {"armed"}
    assert all(cp.status is EXPORTED for cp in route.latest())
    route.sink.fail = None
    error = assert_blocked(route, calls_before=1)
    assert error.diagnostics["phases"] == ["armed"]
    assert len(error.diagnostics["batch_ids"]) == 1
    assert route.target_ids() == route.source_ids()


def test_target_error_marks_outcome_unknown_and_reraises_original(route, path):
    route.sink.fail = "before"
    with pytest.raises(InjectedFault) as info:
        route.runtime().run(route.spec(path))
    assert info.value is route.sink.error
    assert raised_from(info, "target_call")
    latest = route.latest()
    assert {guard_phase(cp) for cp in latest} == {"target_outcome_unknown"}
    assert {cp.diagnostics["error"] for cp in latest} == {"target_call_failed"}
    route.sink.fail = None
    assert_blocked(route, calls_before=1)


def test_interrupt_during_target_is_reraised_and_blocks(route, path):
    route.sink.fail, route.sink.error = "after", KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as info:
        route.runtime().run(route.spec(path))
    assert info.value is route.sink.error
    route.sink.fail = None
    assert_blocked(route, calls_before=1)
    assert route.target_ids() == route.source_ids()


# 5
def test_route_guard_blocks_after_query_schema_and_partition_changes(route, path):
    route.sink.fail = "after"
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path))
    route.sink.fail = None
    blocked_ids = set(phases(route))

    # new rows move the window: new partition ids
    from dpone_native_transfer.testing import build_sample_source

    build_sample_source(route.source_path, rows=10, partitions=7, start_id=1_000)
    assert_blocked(route, calls_before=1)
    # a different query (no cursor) and a different schema (new column)
    route.source = SQLiteSource(str(route.source_path), "orders", "region")
    assert_blocked(route, calls_before=1)
    with sqlite3.connect(route.source_path) as connection:
        connection.execute("ALTER TABLE orders ADD COLUMN note TEXT")
    connection.close()
    assert_blocked(route, calls_before=1)
    # and when the current plan is empty
    with sqlite3.connect(route.source_path) as connection:
        connection.execute("DELETE FROM orders")
    connection.close()
    error = assert_blocked(route, calls_before=1)
    assert {item["partition_id"] for item in error.diagnostics["partitions"]} == blocked_ids


# 6
def test_partial_guard_persistence_prevents_first_target_call(route, path):
    original = route.store.fail_batch(phase("armed"), keep=2)
    with pytest.raises(InjectedFault) as info:
        route.runtime().run(route.spec(path))
    assert info.value is original
    assert route.sink.target_calls == 0
    assert set(phases(route).values()) == {"failed_before_target"}
    assert route.target_ids() == []


def test_partial_guard_with_failed_marker_leaves_armed_and_blocks(route, path):
    route.store.fail_batch(phase("armed"), keep=1)
    route.store.fail_batch(phase("failed_before_target"), error=OSError("store down"))
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path))
    assert route.sink.target_calls == 0
    assert list(phases(route).values()) == ["armed"]
    assert_blocked(route, calls_before=0)


# 7
def test_failed_before_target_is_retryable(route, path):
    route.store.fail_batch(phase("armed"), keep=2)
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path))
    result = route.runtime().run(route.spec(path, run_id="retry"))
    assert len(result.committed_partition_ids) == 4
    assert route.sink.target_calls == 1
    assert route.target_ids() == route.source_ids()


def test_legacy_checkpoints_without_guard_are_retryable(route, path):
    route.sink.fail = "before"
    with pytest.raises(InjectedFault):
        route.runtime(plugins=[]).run(route.spec(path))
    assert {(cp.status, guard_phase(cp)) for cp in route.latest()} == {(FAILED, None)}
    route.sink.fail = None
    result = route.runtime().run(route.spec(path, run_id="retry"))
    assert len(result.committed_partition_ids) == 4
    assert route.target_ids() == route.source_ids()
    assert set(phases(route).values()) == {"checkpoint_committed"}


def test_legacy_committed_partitions_are_skipped_by_the_guarded_runtime(route, path):
    route.runtime(plugins=[]).run(route.spec(path))
    result = route.runtime().run(route.spec(path, run_id="again"))
    assert result.committed_partition_ids == ()
    assert route.sink.target_calls == 1


# 8
MALFORMED = {
    "unknown_schema_version": {"schema_version": "dpone.native_transfer.target_commit_guard.v2"},
    "unsupported_phase": {"phase": "Armed"},
    "status_phase_mismatch": {"phase": "checkpoint_committed"},
    "invalid_batch_id": {"checkpoint_batch_id": "sha256:XYZ"},
    "unexpected_keys": {"retryable": False},
    "invalid_recovery": {"recovery": "automatic"},
}


@pytest.mark.parametrize("problem", sorted(MALFORMED))
def test_malformed_guard_fails_closed(route, problem):
    route.sink.fail = "after"
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy"))
    first = route.latest()[0]  # FAILED / target_outcome_unknown
    guard = {**first.diagnostics["target_commit_guard"], **MALFORMED[problem]}
    route.real_store.upsert(attrs.evolve(first, diagnostics={"target_commit_guard": guard}))
    with pytest.raises(TargetCommitGuardInvalid) as info:
        route.runtime().run(route.spec("legacy", run_id="retry"))
    assert info.value.code == "native_transfer_target_commit_guard_invalid"
    assert {"partition_id": first.partition_id, "problem": problem} in info.value.diagnostics[
        "partitions"
    ], "malformed beats unresolved: the other partitions are still unresolved"
    assert route.sink.target_calls == 1


@pytest.mark.parametrize("guard", [None, "armed", [], 7, {"phase": "armed"}])
def test_non_object_or_partial_guard_fails_closed_on_a_fresh_route(route, guard):
    route.runtime().run(route.spec("legacy"))
    first = route.latest()[0]
    route.real_store.upsert(attrs.evolve(first, diagnostics={"target_commit_guard": guard}))
    with pytest.raises(TargetCommitGuardInvalid):
        route.runtime().run(route.spec("legacy", run_id="again"))
    assert route.sink.target_calls == 1


# 9
def test_each_terminal_batch_uses_one_injected_timestamp(route, path):
    route.runtime().run(route.spec(path))
    armed, committed = route.store.batches
    for batch in (armed, committed):
        assert len({cp.started_at for cp in batch}) == 1
    assert all(cp.completed_at is None for cp in armed)
    assert all(cp.started_at == cp.completed_at for cp in committed)
    assert committed[0].started_at in route.clock.reads
    assert armed[0].started_at < committed[0].started_at
    stored = route.latest()
    assert {cp.completed_at for cp in stored} == {committed[0].completed_at}


def test_marker_batches_use_one_timestamp_each(route, path):
    route.store.fail_batch(phase("checkpoint_committed"), keep=1)
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path))
    markers = [b for b in route.store.batches if guard_phase(b[0]) == "checkpoint_incomplete"]
    assert len(markers) == 1 and len(markers[0]) == 3
    assert len({(cp.started_at, cp.completed_at) for cp in markers[0]}) == 1
    assert markers[0][0].started_at == markers[0][0].completed_at


@pytest.mark.parametrize("value", [datetime(2026, 1, 1), "2026-01-01T00:00:00+00:00"])
def test_naive_or_non_datetime_clock_is_refused_before_target(route, value):
    with pytest.raises(ClockInvalid) as info:
        route.runtime(clock=lambda: value).run(route.spec("legacy"))
    assert info.value.code == "native_transfer_clock_invalid"
    assert route.sink.target_calls == 0
    assert route.latest() == []


# 10
def test_events_prove_guard_before_target_ordering(route, path):
    store_batches_at_call: list[int] = []
    real_load = route.sink.inner.load
    real_finalize = route.sink.inner.finalize_staged_load

    def observed(call):
        def wrapper(*args, **kwargs):
            store_batches_at_call.append(len(route.store.batches))
            return call(*args, **kwargs)

        return wrapper

    route.sink.inner.load = observed(real_load)
    route.sink.inner.finalize_staged_load = observed(real_finalize)
    result = route.runtime().run(route.spec(path))
    names = [event.name for event in result.events if event.name in EVENT_ORDER]
    assert names == list(EVENT_ORDER)
    assert store_batches_at_call == [1], "exactly one batch (armed) is durable before the target"
    assert guard_phase(route.store.batches[0][0]) == "armed"


# 11
def test_payloads_round_trip_without_migration(route, path):
    route.runtime(plugins=[]).run(route.spec(path))  # legacy-shaped, unguarded payloads
    route.sink.fail = "after"
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path, run_id="run-2", strategy="full_refresh"))
    with sqlite3.connect(route.tmp / "checkpoints.db") as connection:
        stored = [
            json.loads(row[0])
            for row in connection.execute("SELECT payload FROM checkpoint_history")
        ]
    connection.close()
    assert any("target_commit_guard" not in p["diagnostics"] for p in stored)
    assert any("target_commit_guard" in p["diagnostics"] for p in stored)
    for payload in stored:
        assert checkpoint_to_payload(checkpoint_from_payload(payload)) == payload


def test_hand_written_legacy_payload_round_trips():
    payload = {
        "partition_id": "p-legacy-0001",
        "route": {
            "source_table": "orders",
            "target_table": "orders_copy",
            "strategy": "incremental_append",
        },
        "status": "failed",
        "run_id": "airflow-2026-06-30",
        "query_hash": "sha256:" + "a" * 64,
        "schema_hash": "sha256:" + "b" * 64,
        "partition_bounds": {"partition": "emea", "cursor_after": None, "cursor_upto": 42},
        "started_at": "2026-06-30T01:02:03.456789+00:00",
        "completed_at": "2026-06-30T01:02:04+00:00",
        "rows_exported": 17,
        "diagnostics": {"artifact_sha256": "sha256:" + "c" * 64, "custom": [1, 2.5, None]},
    }
    text = json.dumps(payload, sort_keys=True)
    again = checkpoint_to_payload(checkpoint_from_payload(json.loads(text)))
    assert json.dumps(again, sort_keys=True) == text
