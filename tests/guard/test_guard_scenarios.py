"""Guard scenarios beyond the conformance kit's, on every path where they apply.

The kit (``dpone_native_transfer.testing.conformance``; ``test_conformance.py``
runs it on every path and every sink) holds the scenarios any path must pass.
These hold the rest: a partial commit that fails at its last partition, the
unguarded runtime for contrast, interrupts, guard-marker writes that fail,
the route scan's independence from query, schema and partition ids, legacy
checkpoints, malformed guards, the injected clock and payload round trips.
The table in docs/hooks.md names, for each of the feature design's eleven
required cases, the tests that prove it.

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
from dpone_native_transfer.testing import InjectedFault, guard_phase
from dpone_native_transfer.testing import phase_batch as phase

EXPORTED, FAILED = PartitionCheckpointStatus.EXPORTED, PartitionCheckpointStatus.FAILED


def phases(route) -> dict[str, str | None]:
    return {cp.partition_id: guard_phase(cp) for cp in route.latest()}


def assert_blocked(route, *, calls_before: int) -> ManualReconciliationRequired:
    with pytest.raises(ManualReconciliationRequired) as info:
        route.runtime().run(route.spec("legacy", run_id="retry"))
    assert route.sink.target_calls == calls_before, "a blocked retry must not call the target"
    return info.value


# a partial commit that fails at its last partition; the unguarded runtime for contrast
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


# a surviving armed record; an interrupt during the target call
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


def test_interrupt_during_target_is_reraised_and_blocks(route, path):
    route.sink.fail, route.sink.error = "after", KeyboardInterrupt()
    with pytest.raises(KeyboardInterrupt) as info:
        route.runtime().run(route.spec(path))
    assert info.value is route.sink.error
    route.sink.fail = None
    assert_blocked(route, calls_before=1)
    assert route.target_ids() == route.source_ids()


# the route scan ignores the current query, schema and partition ids
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


# a partly written armed batch whose failed_before_target marker fails too
def test_partial_guard_with_failed_marker_leaves_armed_and_blocks(route, path):
    route.store.fail_batch(phase("armed"), keep=1)
    route.store.fail_batch(phase("failed_before_target"), error=OSError("store down"))
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path))
    assert route.sink.target_calls == 0
    assert list(phases(route).values()) == ["armed"]
    assert_blocked(route, calls_before=0)


# legacy (unguarded) checkpoints stay retryable
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


# malformed or unknown guards fail closed
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


# the injected clock is checked before the target
@pytest.mark.parametrize("value", [datetime(2026, 1, 1), "2026-01-01T00:00:00+00:00"])
def test_naive_or_non_datetime_clock_is_refused_before_target(route, value):
    with pytest.raises(ClockInvalid) as info:
        route.runtime(clock=lambda: value).run(route.spec("legacy"))
    assert info.value.code == "native_transfer_clock_invalid"
    assert route.sink.target_calls == 0
    assert route.latest() == []


# checkpoint payloads round-trip without migration
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
