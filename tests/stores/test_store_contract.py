"""Conformance tests every checkpoint/route-state store must pass: the memory, SQLite and
PostgreSQL stores, and the operator port (routes, audited resolutions).

A new store joins the suite by appending a factory to ``STORE_FACTORIES``: given the
fixture request, it returns a callable that opens one more store on the test's location.
The stores' own behaviour is in test_stores_sqlite.py, test_stores_postgres.py and
test_stores_durable.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import pytest
from helpers.postgres_server import PostgresLocation
from helpers.stores import OTHER_ROUTE, ROUTE, T0, make_checkpoint

from dpone_native_transfer.checkpoints import RouteKey, Strategy, checkpoint_to_payload
from dpone_native_transfer.errors import CheckpointPayloadInvalid
from dpone_native_transfer.stores import CheckpointStore, OperatorStore, RouteStateStore
from dpone_native_transfer.stores.memory import MemoryCheckpointStore
from dpone_native_transfer.stores.postgres import PostgresCheckpointStore
from dpone_native_transfer.stores.sqlite import SQLiteCheckpointStore

Opener = Callable[[], Any]


def _memory(request: pytest.FixtureRequest) -> Opener:
    return MemoryCheckpointStore


def _sqlite(request: pytest.FixtureRequest) -> Opener:
    path = request.getfixturevalue("tmp_path") / "checkpoints.sqlite3"
    return lambda: SQLiteCheckpointStore(path)


def _postgres(request: pytest.FixtureRequest) -> Opener:
    location: PostgresLocation = request.getfixturevalue("postgres_schema")
    return lambda: PostgresCheckpointStore(location.dsn, schema=location.schema)


STORE_FACTORIES = [
    pytest.param(_memory, id="memory"),
    pytest.param(_sqlite, id="sqlite"),
    pytest.param(_postgres, id="postgres"),
]


@pytest.fixture(params=STORE_FACTORIES)
def store_factory(request: pytest.FixtureRequest) -> Iterator[Opener]:
    """Opens stores on one location and closes every one of them after the test."""
    opened: list[Any] = []
    open_store = request.param(request)

    def make() -> Any:
        store = open_store()
        opened.append(store)
        return store

    yield make
    for store in opened:
        close = getattr(store, "close", None)
        if close is not None:
            close()


@pytest.fixture
def store(store_factory: Callable[[], Any]) -> Any:
    return store_factory()


# --- conformance ---------------------------------------------------------------------------


def test_implements_both_ports(store: Any) -> None:
    assert isinstance(store, CheckpointStore)
    assert isinstance(store, RouteStateStore)


def test_empty_route_lists_nothing(store: Any) -> None:
    assert store.list_latest(ROUTE) == []
    assert store.history(ROUTE) == []


def test_latest_wins_and_history_is_kept(store: Any) -> None:
    first = make_checkpoint(status="exported", rows_exported=1)
    second = attrs.evolve(first, status="committed", rows_exported=2, completed_at=T0)
    store.upsert(first)
    store.upsert(second)
    assert store.list_latest(ROUTE) == [second]
    assert store.history(ROUTE) == [first, second]


def test_list_latest_independent_of_other_routes_and_of_query_schema_run(store: Any) -> None:
    mine = [
        make_checkpoint("p-a", query_hash="sha256:" + "1" * 64),
        make_checkpoint("p-b", schema_hash="sha256:" + "2" * 64),
        make_checkpoint("p-c", run_id="run-9"),
    ]
    theirs = [
        make_checkpoint("p-a", route=OTHER_ROUTE, status="committed"),
        make_checkpoint("p-z", route=OTHER_ROUTE),
    ]
    store.upsert_many(theirs)
    store.upsert_many(mine)
    store.upsert_many(theirs)
    assert store.list_latest(ROUTE) == mine
    assert store.list_latest(OTHER_ROUTE) == theirs
    assert store.history(ROUTE) == mine


def test_list_latest_sorted_by_partition_id(store: Any) -> None:
    ids = ["p-c", "p-a", "p-B", "p-b", "p-10", "p-2"]
    for pid in ids:
        store.upsert(make_checkpoint(pid))
    assert [cp.partition_id for cp in store.list_latest(ROUTE)] == sorted(ids)


def test_upsert_many_writes_in_order_later_item_wins(store: Any) -> None:
    a1 = make_checkpoint("p-a", rows_exported=1)
    b1 = make_checkpoint("p-b", rows_exported=1)
    a2 = make_checkpoint("p-a", rows_exported=2, status="committed")
    store.upsert_many([a1, b1, a2])
    assert store.list_latest(ROUTE) == [a2, b1]
    assert store.history(ROUTE) == [a1, b1, a2]


def test_upsert_many_empty_is_noop(store: Any) -> None:
    store.upsert_many([])
    assert store.list_latest(ROUTE) == []


def test_upsert_many_rejects_non_checkpoints_before_writing(store: Any) -> None:
    good = make_checkpoint("p-a")
    with pytest.raises(TypeError):
        store.upsert_many([good, checkpoint_to_payload(good)])
    assert store.list_latest(ROUTE) == []


def test_unreadable_checkpoint_is_refused_on_write(store: Any) -> None:
    with pytest.raises(CheckpointPayloadInvalid):
        store.upsert_many(
            [make_checkpoint("p-a"), make_checkpoint("p-b", diagnostics={"x": float("nan")})]
        )
    assert store.list_latest(ROUTE) == []


def test_round_trip_with_nested_diagnostics_and_guard(store: Any) -> None:
    diagnostics = {
        "target_commit_guard": {
            "version": 1,
            "status": "pending",
            "batch_id": "b-42",
            "partitions": ["p-1", "p-2"],
            "counts": {"rows": 10, "ratio": 0.5},
            "note": None,
        },
        "phases": [{"name": "export", "ok": True}],
        "unicode": "naïve – ok",
    }
    cp = make_checkpoint(diagnostics=diagnostics, completed_at=T0, status="committed")
    store.upsert(cp)
    [got] = store.list_latest(ROUTE)
    assert got == cp
    assert checkpoint_to_payload(got) == checkpoint_to_payload(cp)
    assert json.dumps(checkpoint_to_payload(got), sort_keys=True) == json.dumps(
        checkpoint_to_payload(cp), sort_keys=True
    )


def test_round_trip_keeps_numbers_and_text_exactly(store: Any) -> None:
    diagnostics = {
        "big": 2**70,
        "negative": -(2**63),
        "floats": [0.1, 1e300, 5e-324, -0.0, 1.0, 12345678.9],
        "text": 'nul \x00 tab \t quote " emoji \U0001f600 accent é',
        "z": {"b": 1, "a": [None, True, False]},
    }
    cp = make_checkpoint(diagnostics=diagnostics, partition_bounds={"id": [2**53 + 1, -1.5]})
    store.upsert(cp)
    [got] = store.list_latest(ROUTE)
    assert got == cp
    exact = [json.dumps(checkpoint_to_payload(c), sort_keys=True) for c in (got, cp)]
    assert exact[0] == exact[1]
    assert str(got.diagnostics["floats"][3]) == "-0.0"
    assert type(got.diagnostics["floats"][4]) is float


def test_no_aliasing(store: Any) -> None:
    diagnostics = {"target_commit_guard": {"status": "pending", "ids": [1, 2]}}
    cp = make_checkpoint(diagnostics=diagnostics)
    store.upsert(cp)
    diagnostics["target_commit_guard"]["status"] = "mutated-before-read"
    [got] = store.list_latest(ROUTE)
    got.diagnostics["target_commit_guard"]["status"] = "mutated"
    got.diagnostics["target_commit_guard"]["ids"].append(3)
    got.partition_bounds["id"] = "mutated"
    store.history(ROUTE)[0].diagnostics.clear()
    [again] = store.list_latest(ROUTE)
    assert again.diagnostics == {"target_commit_guard": {"status": "pending", "ids": [1, 2]}}
    assert again.partition_bounds == {"id": [0, 100]}
    assert store.history(ROUTE)[0] == again


def test_source_state_load_save_replace(store: Any) -> None:
    assert store.load_source_state(ROUTE) is None
    state = {"watermark": "2024-05-01T12:00:00+00:00", "generation": 1, "nested": {"a": [1]}}
    store.save_source_state(ROUTE, state)
    state["generation"] = 99
    assert store.load_source_state(ROUTE) == {
        "watermark": "2024-05-01T12:00:00+00:00",
        "generation": 1,
        "nested": {"a": [1]},
    }
    store.load_source_state(ROUTE)["nested"]["a"].append(2)
    store.save_source_state(ROUTE, {"generation": 2})
    assert store.load_source_state(ROUTE) == {"generation": 2}
    assert store.load_source_state(OTHER_ROUTE) is None


def test_source_state_must_be_json_object(store: Any) -> None:
    with pytest.raises(TypeError):
        store.save_source_state(ROUTE, ["not", "a", "dict"])
    with pytest.raises(ValueError):
        store.save_source_state(ROUTE, {"x": float("inf")})
    with pytest.raises(ValueError):
        store.save_source_state(ROUTE, {"x": (1, 2)})
    assert store.load_source_state(ROUTE) is None


def test_evidence_record_replace_list(store: Any) -> None:
    assert store.list_evidence(ROUTE) == []
    store.record_evidence(ROUTE, "run-1", {"rows": 1})
    store.record_evidence(ROUTE, "run-2", {"rows": 2})
    store.record_evidence(OTHER_ROUTE, "run-1", {"rows": 100})
    store.record_evidence(ROUTE, "run-3", {"rows": 3})
    store.record_evidence(ROUTE, "run-2", {"rows": 22, "retried": True})
    assert store.list_evidence(ROUTE) == [{"rows": 1}, {"rows": 22, "retried": True}, {"rows": 3}]
    assert store.list_evidence(OTHER_ROUTE) == [{"rows": 100}]
    store.list_evidence(ROUTE)[0]["rows"] = "mutated"
    assert store.list_evidence(ROUTE)[0] == {"rows": 1}


def test_evidence_validates_input(store: Any) -> None:
    with pytest.raises(ValueError):
        store.record_evidence(ROUTE, "", {"rows": 1})
    with pytest.raises(TypeError):
        store.record_evidence(ROUTE, "run-1", "not a dict")
    assert store.list_evidence(ROUTE) == []


# --- operator port: routes, audited resolutions ----------------------------------------------

THIRD_ROUTE = RouteKey("a.src", "z.dst", Strategy.INCREMENTAL_APPEND)


def make_audit(**changes: Any) -> dict[str, Any]:
    return {"operator": "alice", "reason": "verified", "partitions": [{"id": "p-a"}], **changes}


def test_implements_the_operator_port(store: Any) -> None:
    assert isinstance(store, OperatorStore)


def test_list_routes_every_route_with_checkpoints_sorted(store: Any) -> None:
    assert store.list_routes() == []
    store.record_evidence(THIRD_ROUTE, "run-1", {"rows": 1})  # evidence alone is no route
    store.upsert_many([make_checkpoint("p-a", route=OTHER_ROUTE), make_checkpoint("p-b")])
    store.upsert_many([make_checkpoint("p-a"), make_checkpoint("p-c", route=THIRD_ROUTE)])
    assert store.list_routes() == [THIRD_ROUTE, OTHER_ROUTE, ROUTE]


def test_apply_resolution_writes_checkpoints_and_one_audit_record(store: Any) -> None:
    before = make_checkpoint("p-a", status="failed")
    store.upsert_many([before, make_checkpoint("p-b")])
    resolved = attrs.evolve(before, status="committed", completed_at=T0)
    first = store.apply_resolution(ROUTE, [resolved], make_audit())
    second = store.apply_resolution(OTHER_ROUTE, [make_checkpoint("p-z", route=OTHER_ROUTE)], {})
    third = store.apply_resolution(ROUTE, [before], make_audit(reason="undo"))
    assert first < second < third
    assert store.list_latest(ROUTE) == [before, make_checkpoint("p-b")]
    assert store.history(ROUTE)[-2:] == [resolved, before]
    assert store.list_audit(ROUTE) == [
        {**make_audit(), "audit_id": first},
        {**make_audit(reason="undo"), "audit_id": third},
    ]
    assert store.list_audit(OTHER_ROUTE) == [{"audit_id": second}]
    assert store.list_audit(THIRD_ROUTE) == []
    store.list_audit(ROUTE)[0]["partitions"].clear()
    assert store.list_audit(ROUTE)[0]["partitions"] == [{"id": "p-a"}]


@pytest.mark.parametrize(
    ("checkpoints", "audit", "error"),
    [
        ([], make_audit(), ValueError),
        ([make_checkpoint("p-a", route=OTHER_ROUTE)], make_audit(), ValueError),
        ([make_checkpoint("p-a"), {"not": "a checkpoint"}], make_audit(), TypeError),
        (
            [make_checkpoint("p-a", diagnostics={"x": float("nan")})],
            make_audit(),
            CheckpointPayloadInvalid,
        ),
        ([make_checkpoint("p-a")], make_audit(audit_id=7), ValueError),
        ([make_checkpoint("p-a")], ["not", "a", "dict"], TypeError),
        ([make_checkpoint("p-a")], make_audit(at=float("inf")), ValueError),
    ],
    ids=["empty", "other-route", "non-checkpoint", "unreadable", "audit-id", "list", "inf"],
)
def test_apply_resolution_refuses_before_writing_anything(
    store: Any, checkpoints: list[Any], audit: Any, error: type[Exception]
) -> None:
    kept = make_checkpoint("p-a", status="failed")
    store.upsert(kept)
    with pytest.raises(error):
        store.apply_resolution(ROUTE, checkpoints, audit)
    assert store.list_latest(ROUTE) == [kept]
    assert store.list_latest(OTHER_ROUTE) == []
    assert store.list_audit(ROUTE) == []
