"""Resume planning and source windows, end to end on real SQLite files, plus a few
direct unit tests of the planner functions."""

from __future__ import annotations

import sqlite3

import attrs
import pytest

from dpone_native_transfer import (
    CheckpointStoreCorrupt,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    SQLiteSource,
)
from dpone_native_transfer.events import EventName
from dpone_native_transfer.planner import candidate_checkpoints, plan_resume, plan_window
from dpone_native_transfer.testing import (
    InjectedFault,
    build_sample_source,
    guard_phase,
    phase_batch,
)

COMMITTED = PartitionCheckpointStatus.COMMITTED
FAILED = PartitionCheckpointStatus.FAILED
FIRST_CURSOR_UPTO = 1_000_120  # build_sample_source: updated_at = 1_000_000 + id, ids 1..120


def insert_rows(route, rows: list[tuple[int, str, float, int]]) -> None:
    with sqlite3.connect(route.source_path) as connection:
        connection.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", rows)
    connection.close()


def execute_on_source(route, sql: str) -> None:
    with sqlite3.connect(route.source_path) as connection:
        connection.execute(sql)
    connection.close()


def without_cursor(route) -> None:
    route.source = SQLiteSource(str(route.source_path), "orders", "region")


def assert_exactly_once(route) -> None:
    target = route.target_ids()
    assert len(target) == len(set(target)), "duplicate rows in the target"
    assert target == route.source_ids()


def state(route) -> dict | None:
    """The route's progress (its definition and cursor edge aside: see test_incremental.py and
    test_cursor_edge.py)."""
    stored = route.real_store.load_source_state(route.spec("legacy").route)
    aside = ("definition", "edge")
    return None if stored is None else {k: v for k, v in stored.items() if k not in aside}


def evidence(route, strategy: str = "incremental_append") -> list[dict]:
    return route.real_store.list_evidence(route.spec("legacy", strategy=strategy).route)


# -- a rerun after success ---------------------------------------------------


@pytest.mark.parametrize("cursor", [True, False], ids=["cursor", "no-cursor"])
def test_rerun_after_success_calls_no_target_but_completes_the_generation(route, path, cursor):
    if not cursor:
        without_cursor(route)
    first = route.runtime().run(route.spec(path))
    assert state(route)["generation"] == 1
    again = route.runtime().run(route.spec(path, run_id="run-2"))
    assert route.sink.target_calls == 1
    assert again.committed_partition_ids == ()
    assert again.rows_loaded == 0 and again.batch_id is None
    # with a cursor the new window is empty; without one, every value is committed
    expected_skipped = () if cursor else first.committed_partition_ids
    assert sorted(again.skipped_partition_ids) == sorted(expected_skipped)
    assert [record["run_id"] for record in evidence(route)] == ["run-1", "run-2"]
    assert state(route)["generation"] == 2
    names = [event.name for event in again.events]
    assert EventName.TARGET_STARTED not in names
    assert names[-2:] == [EventName.EVIDENCE_WRITTEN, EventName.SOURCE_STATE_ADVANCED]
    assert_exactly_once(route)


# -- incremental_append with a cursor ---------------------------------------


def test_appended_rows_are_loaded_once_and_nothing_else(route, path):
    route.runtime().run(route.spec(path))
    build_sample_source(route.source_path, rows=30, start_id=121)
    result = route.runtime().run(route.spec(path, run_id="run-2"))
    assert result.rows_loaded == 30
    assert route.sink.target_calls == 2
    assert state(route) == {"generation": 2, "watermark": 1_000_150}
    assert_exactly_once(route)


def test_a_failed_before_target_retry_reuses_the_pinned_window(route, path):
    route.store.fail_batch(phase_batch("armed"), keep=1)
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec(path))
    failed = route.latest()
    assert {(cp.status, guard_phase(cp)) for cp in failed} == {(FAILED, "failed_before_target")}
    assert {cp.partition_bounds["cursor_upto"] for cp in failed} == {FIRST_CURSOR_UPTO}
    assert state(route) is None

    build_sample_source(route.source_path, rows=20, start_id=121)  # rows arrive meanwhile
    retry = route.runtime().run(route.spec(path, run_id="retry"))
    assert sorted(retry.committed_partition_ids) == sorted(cp.partition_id for cp in failed)
    assert retry.rows_loaded == 120, "the retry loads the pinned window, not the new rows"
    assert {cp.partition_bounds["cursor_upto"] for cp in route.latest()} == {FIRST_CURSOR_UPTO}
    assert route.target_ids() == list(range(1, 121))
    assert state(route) == {"generation": 1, "watermark": FIRST_CURSOR_UPTO}

    following = route.runtime().run(route.spec(path, run_id="run-3"))
    assert following.rows_loaded == 20
    assert not set(following.committed_partition_ids) & set(retry.committed_partition_ids)
    assert_exactly_once(route)


def test_a_window_is_pinned_by_pending_checkpoints_not_by_the_source_maximum(route):
    key = route.spec("legacy").route
    route.store.fail_batch(phase_batch("armed"))
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy"))
    build_sample_source(route.source_path, rows=20, start_id=121)
    window, bounds = plan_window(key, route.source, None, route.latest())
    assert (window.cursor_after, window.cursor_upto) == (None, FIRST_CURSOR_UPTO)
    assert window.advanced_state() == {"generation": 1, "watermark": FIRST_CURSOR_UPTO}
    assert {item["cursor_upto"] for item in bounds} == {FIRST_CURSOR_UPTO}
    fresh_window, _ = plan_window(key, route.source, None, [])
    assert fresh_window.cursor_upto == 1_000_140, "without pending work the window moves on"


# -- incremental_append without a cursor ------------------------------------


def test_without_a_cursor_committed_partition_values_are_never_reloaded(route, path):
    without_cursor(route)
    first = route.runtime().run(route.spec(path))
    insert_rows(route, [(900, "region-000", 1.0, 2_000_000)])  # late row, committed value
    insert_rows(route, [(901, "region-new", 2.0, 2_000_001), (902, "region-new", 3.0, 1)])
    second = route.runtime().run(route.spec(path, run_id="run-2"))
    assert len(second.committed_partition_ids) == 1
    assert sorted(second.skipped_partition_ids) == sorted(first.committed_partition_ids)
    assert second.rows_loaded == 2
    assert route.target_ids() == [*range(1, 121), 901, 902]

    third = route.runtime().run(route.spec(path, run_id="run-3"))
    assert third.committed_partition_ids == () and len(third.skipped_partition_ids) == 5
    assert route.sink.target_calls == 2


# -- full_refresh -------------------------------------------------------------


def test_full_refresh_reloads_and_replaces_on_every_completed_run(route, path):
    route.runtime().run(route.spec(path, strategy="full_refresh"))
    assert_exactly_once(route)
    build_sample_source(route.source_path, rows=15, start_id=121)
    execute_on_source(route, "DELETE FROM orders WHERE id <= 10")
    second = route.runtime().run(route.spec(path, run_id="run-2", strategy="full_refresh"))
    assert second.rows_loaded == 125
    assert second.skipped_partition_ids == ()
    assert len(second.committed_partition_ids) == 4
    assert_exactly_once(route)
    third = route.runtime().run(route.spec(path, run_id="run-3", strategy="full_refresh"))
    assert third.rows_loaded == 125
    assert route.sink.target_calls == 3
    assert_exactly_once(route)
    assert [record["generation"] for record in evidence(route, "full_refresh")] == [0, 1, 2]


def test_full_refresh_partial_generation_reactivates_every_partition(route, path):
    route.store.fail_batch(phase_batch(None), keep=3)  # unguarded commit batch, 3 of 4 durable
    with pytest.raises(InjectedFault):
        route.runtime(plugins=[]).run(route.spec(path, strategy="full_refresh"))
    partial = route.real_store.list_latest(route.spec(path, strategy="full_refresh").route)
    assert [cp.status for cp in partial] == [COMMITTED] * 3
    retry = route.runtime(plugins=[]).run(route.spec(path, run_id="retry", strategy="full_refresh"))
    assert len(retry.committed_partition_ids) == 4
    assert retry.skipped_partition_ids == ()
    assert retry.rows_loaded == 120
    assert_exactly_once(route)


# -- plan_resume, directly ----------------------------------------------------

ROUTE = RouteKey("orders", "orders_copy", "incremental_append")
FULL = RouteKey("orders", "orders_copy", "full_refresh")
QUERY, SCHEMA = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def checkpoints(route: RouteKey, values=("a", "b", "c")) -> list[PartitionCheckpoint]:
    return candidate_checkpoints(
        route, "run-1", QUERY, SCHEMA, [{"partition": value} for value in values]
    )


def committed(candidate: PartitionCheckpoint, **changes) -> PartitionCheckpoint:
    """A stored checkpoint of an earlier run; COMMITTED unless ``status`` says otherwise."""
    return attrs.evolve(candidate, **{"status": COMMITTED, "run_id": "earlier", **changes})


def test_plan_resume_skips_only_same_query_and_schema_commits():
    candidates = checkpoints(ROUTE)
    latest = [committed(cp) for cp in candidates]
    plan = plan_resume(ROUTE, candidates, latest)
    assert plan.active == ()
    assert plan.skipped == tuple(cp.partition_id for cp in candidates)


@pytest.mark.parametrize("changed", ["query_hash", "schema_hash"])
def test_plan_resume_does_not_skip_a_commit_with_another_hash(changed):
    candidates = checkpoints(ROUTE)
    other = {changed: "sha256:" + "9" * 64}
    latest = [committed(candidates[0], **other), *map(committed, candidates[1:])]
    plan = plan_resume(ROUTE, candidates, latest)
    assert plan.active == (candidates[0],)
    assert plan.skipped == tuple(cp.partition_id for cp in candidates[1:])


@pytest.mark.parametrize("status", [FAILED, PartitionCheckpointStatus.EXPORTED])
def test_plan_resume_retries_anything_not_committed(status):
    candidates = checkpoints(ROUTE)
    latest = [committed(candidates[0]), committed(candidates[1], status=status)]
    plan = plan_resume(ROUTE, candidates, latest)
    assert [cp.partition_id for cp in plan.active] == [
        candidates[1].partition_id,
        candidates[2].partition_id,
    ]
    assert plan.skipped == (candidates[0].partition_id,)


def test_plan_resume_full_refresh_reactivates_all_when_one_is_active():
    candidates = checkpoints(FULL)
    latest = [committed(candidates[0]), committed(candidates[1])]
    plan = plan_resume(FULL, candidates, latest)
    assert plan.active == tuple(candidates)
    assert plan.skipped == ()


def test_plan_resume_full_refresh_skips_a_fully_committed_generation():
    candidates = checkpoints(FULL)
    plan = plan_resume(FULL, candidates, [committed(cp) for cp in candidates])
    assert plan.active == ()


def test_partition_ids_are_deterministic_and_depend_on_bounds_query_and_schema():
    again = checkpoints(ROUTE)
    assert [cp.partition_id for cp in again] == [cp.partition_id for cp in checkpoints(ROUTE)]
    bounds = [{"partition": "a"}]
    other_query = candidate_checkpoints(ROUTE, "run-2", "sha256:" + "3" * 64, SCHEMA, bounds)
    other_schema = candidate_checkpoints(ROUTE, "run-2", QUERY, "sha256:" + "4" * 64, bounds)
    ids = {again[0].partition_id, other_query[0].partition_id, other_schema[0].partition_id}
    assert len(ids) == 3
    assert len({cp.partition_id for cp in again}) == 3


# -- malformed source state ---------------------------------------------------


@pytest.mark.parametrize(
    "stored",
    [
        {"watermark": 5},
        {"generation": -1, "watermark": None},
        {"generation": True, "watermark": None},
        {"generation": "1", "watermark": None},
        {"generation": 1.0, "watermark": None},
        {"generation": None},
    ],
    ids=["missing", "negative", "bool", "string", "float", "null"],
)
def test_malformed_source_state_is_corrupt_and_stops_before_any_work(route, stored):
    route.real_store.save_source_state(route.spec("legacy").route, stored)
    with pytest.raises(CheckpointStoreCorrupt) as info:
        route.runtime().run(route.spec("legacy"))
    assert info.value.code == "native_transfer_checkpoint_store_corrupt"
    assert info.value.diagnostics["field"] == "generation"
    assert route.sink.target_calls == 0
    assert route.store.batches == []
