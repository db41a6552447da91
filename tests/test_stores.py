"""Conformance tests every checkpoint/route-state store must pass, plus SQLite durability tests.

A new store joins the suite by appending a factory to ``STORE_FACTORIES``.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import pytest

from dpone_native_transfer.checkpoints import (
    PartitionCheckpoint,
    RouteKey,
    Strategy,
    checkpoint_to_payload,
)
from dpone_native_transfer.errors import CheckpointPayloadInvalid, CheckpointStoreCorrupt
from dpone_native_transfer.stores import CheckpointStore, OperatorStore, RouteStateStore
from dpone_native_transfer.stores.memory import MemoryCheckpointStore
from dpone_native_transfer.stores.sqlite import SQLiteCheckpointStore

ROUTE = RouteKey("src.orders", "dst.orders", Strategy.INCREMENTAL_APPEND)
OTHER_ROUTE = RouteKey("src.orders", "dst.orders", Strategy.FULL_REFRESH)
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)


def _memory(tmp_path: Path) -> MemoryCheckpointStore:
    return MemoryCheckpointStore()


def _sqlite(tmp_path: Path) -> SQLiteCheckpointStore:
    return SQLiteCheckpointStore(tmp_path / "checkpoints.sqlite3")


STORE_FACTORIES = [
    pytest.param(_memory, id="memory"),
    pytest.param(_sqlite, id="sqlite"),
]


@pytest.fixture(params=STORE_FACTORIES)
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Opens stores on one location and closes every one of them after the test."""
    opened: list[Any] = []

    def make() -> Any:
        store = request.param(tmp_path)
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


def make_checkpoint(
    partition_id: str = "p-1", route: RouteKey = ROUTE, **changes: Any
) -> PartitionCheckpoint:
    fields: dict[str, Any] = {
        "partition_id": partition_id,
        "route": route,
        "status": "exported",
        "run_id": "run-1",
        "query_hash": "sha256:" + "a" * 64,
        "schema_hash": "sha256:" + "b" * 64,
        "partition_bounds": {"id": [0, 100]},
        "started_at": T0,
        "completed_at": None,
        "rows_exported": 10,
        "diagnostics": {},
    }
    fields.update(changes)
    return PartitionCheckpoint(**fields)


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


# --- SQLite only ---------------------------------------------------------------------------


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "secret-location" / "checkpoints.sqlite3"


@pytest.fixture
def sqlite_store(db_path: Path) -> Iterator[SQLiteCheckpointStore]:
    db_path.parent.mkdir()
    with SQLiteCheckpointStore(db_path) as store:
        yield store


def _raw(path: Path, *statements: tuple[str, tuple[Any, ...]] | str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in statements:
            sql, params = (statement, ()) if isinstance(statement, str) else statement
            conn.execute(sql, params)
    finally:
        conn.close()


def _raw_journal_mode(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA journal_mode").fetchone()[0]
    finally:
        conn.close()


def _assert_corrupt_without_path(
    excinfo: pytest.ExceptionInfo[CheckpointStoreCorrupt], path: Path
) -> None:
    exc = excinfo.value
    assert exc.code == "native_transfer_checkpoint_store_corrupt"
    for text in (str(exc), repr(exc), exc.message, repr(exc.diagnostics)):
        assert str(path.parent) not in text
        assert "secret-location" not in text
    assert exc.__cause__ is None
    assert exc.__context__ is None or exc.__suppress_context__


def _latest_row(route: RouteKey, partition_id: str, payload: str) -> tuple[str, tuple[Any, ...]]:
    return (
        "INSERT INTO checkpoint_latest VALUES (?, ?, ?, ?, ?, ?)",
        (route.source_table, route.target_table, str(route.strategy), partition_id, 999, payload),
    )


def test_sqlite_survives_reopen(sqlite_store: SQLiteCheckpointStore, db_path: Path) -> None:
    cps = [
        make_checkpoint("p-a"),
        make_checkpoint("p-b"),
        make_checkpoint("p-a", status="committed"),
    ]
    sqlite_store.upsert_many(cps)
    sqlite_store.save_source_state(ROUTE, {"generation": 3})
    sqlite_store.record_evidence(ROUTE, "run-1", {"rows": 1})
    sqlite_store.close()
    sqlite_store.close()
    with pytest.raises(ValueError):
        sqlite_store.list_latest(ROUTE)
    with SQLiteCheckpointStore(db_path) as reopened:
        assert reopened.list_latest(ROUTE) == [cps[2], cps[1]]
        assert reopened.history(ROUTE) == cps
        assert reopened.load_source_state(ROUTE) == {"generation": 3}
        assert reopened.list_evidence(ROUTE) == [{"rows": 1}]


def test_sqlite_pragmas(sqlite_store: SQLiteCheckpointStore) -> None:
    conn = sqlite_store._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000
    assert conn.isolation_level is None


def _traced(store: SQLiteCheckpointStore, action: Callable[[], object]) -> list[str]:
    """The SQL statements ``action`` runs on the store's connection."""
    statements: list[str] = []
    store._conn.set_trace_callback(statements.append)
    try:
        action()
    finally:
        store._conn.set_trace_callback(None)
    return statements


def _transactions(statements: list[str]) -> list[str]:
    return [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")]


def test_sqlite_upsert_many_is_one_transaction(sqlite_store: SQLiteCheckpointStore) -> None:
    batch = [make_checkpoint(f"p-{i}") for i in range(5)]
    statements = _traced(sqlite_store, lambda: sqlite_store.upsert_many(batch))
    assert _transactions(statements) == ["BEGIN IMMEDIATE", "COMMIT"]
    assert sum(s.startswith("INSERT INTO checkpoint_history") for s in statements) == 5


def test_sqlite_failure_mid_batch_rolls_back_whole_batch(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    before = make_checkpoint("p-0")
    sqlite_store.upsert(before)
    _raw(
        db_path,
        "CREATE TRIGGER inject_failure BEFORE INSERT ON checkpoint_history"
        " WHEN NEW.partition_id = 'p-poison' BEGIN SELECT RAISE(ABORT, 'injected'); END",
    )
    batch = [
        make_checkpoint("p-1"),
        make_checkpoint("p-0", status="committed"),
        make_checkpoint("p-poison"),
    ]
    with pytest.raises(CheckpointStoreCorrupt):
        sqlite_store.upsert_many(batch)
    assert not sqlite_store._conn.in_transaction
    assert sqlite_store.list_latest(ROUTE) == [before]
    assert sqlite_store.history(ROUTE) == [before]


def test_sqlite_list_latest_uses_primary_key(sqlite_store: SQLiteCheckpointStore) -> None:
    sqlite_store.upsert_many([make_checkpoint("p-a"), make_checkpoint("p-b", route=OTHER_ROUTE)])
    [query] = _traced(sqlite_store, lambda: sqlite_store.list_latest(ROUTE))
    plan = sqlite_store._conn.execute("EXPLAIN QUERY PLAN " + query).fetchall()
    details = " | ".join(row[-1] for row in plan)
    assert "SEARCH checkpoint_latest USING PRIMARY KEY" in details
    assert "SCAN" not in details
    assert "TEMP B-TREE" not in details


def test_sqlite_non_json_payload_is_corrupt(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    sqlite_store.upsert(make_checkpoint("p-a"))
    _raw(db_path, _latest_row(ROUTE, "p-b", "{not json"))
    with pytest.raises(CheckpointStoreCorrupt) as excinfo:
        sqlite_store.list_latest(ROUTE)
    _assert_corrupt_without_path(excinfo, db_path)
    assert excinfo.value.diagnostics == {
        "route": ROUTE.as_dict(),
        "partition_id": "p-b",
        "seq": 999,
    }


def test_sqlite_payload_failing_schema_propagates(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    payload = checkpoint_to_payload(make_checkpoint("p-b"))
    payload["status"] = "bogus"
    _raw(db_path, _latest_row(ROUTE, "p-b", json.dumps(payload)))
    with pytest.raises(CheckpointPayloadInvalid) as excinfo:
        sqlite_store.list_latest(ROUTE)
    assert excinfo.value.diagnostics["partition_id"] == "p-b"
    assert excinfo.value.diagnostics["field"] == "status"

    del payload["partition_id"]
    _raw(db_path, "DELETE FROM checkpoint_latest", _latest_row(ROUTE, "p-c", json.dumps(payload)))
    with pytest.raises(CheckpointPayloadInvalid) as excinfo:
        sqlite_store.list_latest(ROUTE)
    assert excinfo.value.diagnostics["partition_id"] == "p-c"


def test_sqlite_payload_filed_under_wrong_key_is_corrupt(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    payload = json.dumps(checkpoint_to_payload(make_checkpoint("p-a", route=OTHER_ROUTE)))
    _raw(db_path, _latest_row(ROUTE, "p-a", payload))
    with pytest.raises(CheckpointStoreCorrupt):
        sqlite_store.list_latest(ROUTE)
    payload = json.dumps(checkpoint_to_payload(make_checkpoint("p-other")))
    _raw(db_path, "DELETE FROM checkpoint_latest", _latest_row(ROUTE, "p-a", payload))
    with pytest.raises(CheckpointStoreCorrupt):
        sqlite_store.list_latest(ROUTE)


@pytest.mark.parametrize(
    "table, column, reader",
    [("source_state", "state", "load_source_state"), ("evidence", "record", "list_evidence")],
)
def test_sqlite_corrupt_state_and_evidence(
    sqlite_store: SQLiteCheckpointStore, db_path: Path, table: str, column: str, reader: str
) -> None:
    sqlite_store.save_source_state(ROUTE, {"generation": 1})
    sqlite_store.record_evidence(ROUTE, "run-1", {"rows": 1})
    for bad in ("{oops", "[1, 2]"):
        _raw(db_path, (f"UPDATE {table} SET {column} = ?", (bad,)))
        with pytest.raises(CheckpointStoreCorrupt) as excinfo:
            getattr(sqlite_store, reader)(ROUTE)
        _assert_corrupt_without_path(excinfo, db_path)


def _open_fails(path: Path) -> pytest.ExceptionInfo[CheckpointStoreCorrupt]:
    with pytest.raises(CheckpointStoreCorrupt) as excinfo:
        store = SQLiteCheckpointStore(path)
        try:
            store.list_latest(ROUTE)
        finally:
            store.close()
    _assert_corrupt_without_path(excinfo, path)
    return excinfo


def test_sqlite_truncated_file_is_corrupt(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    big = {"blob": "x" * 2000}
    sqlite_store.upsert_many([make_checkpoint(f"p-{i:04d}", diagnostics=big) for i in range(200)])
    sqlite_store.close()
    data = db_path.read_bytes()
    for size in (len(data) // 2, 4096, 100, 0):
        db_path.write_bytes(data[:size])
        excinfo = _open_fails(db_path)
        assert "malformed" not in str(excinfo.value)


def test_sqlite_garbage_file_is_corrupt(db_path: Path) -> None:
    db_path.parent.mkdir()
    db_path.write_bytes(b"this is not a database, it is a shopping list\n" * 200)
    excinfo = _open_fails(db_path)
    assert "not a database" not in str(excinfo.value)


def test_sqlite_unknown_user_version_is_corrupt(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    sqlite_store.close()
    _raw(db_path, "PRAGMA user_version = 7")
    excinfo = _open_fails(db_path)
    assert excinfo.value.diagnostics["user_version"] == 7


def test_sqlite_missing_table_is_corrupt(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    sqlite_store.close()
    _raw(db_path, "DROP TABLE evidence")
    excinfo = _open_fails(db_path)
    assert excinfo.value.diagnostics == {"table": "evidence"}


def test_sqlite_foreign_database_is_corrupt(db_path: Path) -> None:
    db_path.parent.mkdir()
    _raw(db_path, "CREATE TABLE something_else (x)")
    _open_fails(db_path)
    assert _raw_journal_mode(db_path) == "delete"


def test_sqlite_creation_leaves_no_scratch_files(db_path: Path) -> None:
    db_path.parent.mkdir()
    with SQLiteCheckpointStore(db_path) as first, SQLiteCheckpointStore(db_path) as second:
        first.upsert(make_checkpoint("p-a"))
        assert second.list_latest(ROUTE) == [make_checkpoint("p-a")]
    assert sorted(p.name for p in db_path.parent.iterdir()) == [db_path.name]


def test_sqlite_locked_write_is_not_corruption(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    sqlite_store._conn.execute("PRAGMA busy_timeout = 0")
    holder = sqlite3.connect(db_path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(sqlite3.OperationalError) as excinfo:
            sqlite_store.upsert(make_checkpoint("p-a"))
        assert not isinstance(excinfo.value, CheckpointStoreCorrupt)
        holder.execute("ROLLBACK")
    finally:
        holder.close()
    sqlite_store.upsert(make_checkpoint("p-a"))
    assert sqlite_store.list_latest(ROUTE) == [make_checkpoint("p-a")]


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


def test_sqlite_apply_resolution_is_one_transaction(sqlite_store: SQLiteCheckpointStore) -> None:
    batch = [make_checkpoint("p-a"), make_checkpoint("p-b")]
    statements = _traced(sqlite_store, lambda: sqlite_store.apply_resolution(ROUTE, batch, {}))
    assert _transactions(statements) == ["BEGIN IMMEDIATE", "COMMIT"]
    assert sum(s.startswith("INSERT INTO checkpoint_history") for s in statements) == 2
    assert sum(s.startswith("INSERT INTO audit") for s in statements) == 1


def test_sqlite_failed_audit_insert_rolls_back_the_checkpoints(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    before = make_checkpoint("p-a", status="failed")
    sqlite_store.upsert(before)
    _raw(
        db_path,
        "CREATE TRIGGER inject_failure BEFORE INSERT ON audit"
        " BEGIN SELECT RAISE(ABORT, 'injected'); END",
    )
    with pytest.raises(CheckpointStoreCorrupt):
        sqlite_store.apply_resolution(ROUTE, [make_checkpoint("p-a", status="committed")], {})
    assert not sqlite_store._conn.in_transaction
    assert sqlite_store.list_latest(ROUTE) == [before]
    assert sqlite_store.history(ROUTE) == [before]
    assert sqlite_store.list_audit(ROUTE) == []


def test_sqlite_v1_file_from_before_the_audit_table_opens_and_gains_it(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    """A store written by the previous release: the same v1 schema without ``audit``."""
    sqlite_store.upsert(make_checkpoint("p-a"))
    sqlite_store.record_evidence(ROUTE, "run-1", {"rows": 1})
    sqlite_store.close()
    _raw(db_path, "DROP TABLE audit")
    with SQLiteCheckpointStore(db_path) as reopened:
        assert reopened._conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert reopened.list_latest(ROUTE) == [make_checkpoint("p-a")]
        assert reopened.list_evidence(ROUTE) == [{"rows": 1}]
        assert reopened.list_audit(ROUTE) == []
        audit_id = reopened.apply_resolution(ROUTE, [make_checkpoint("p-a", status="failed")], {})
    with SQLiteCheckpointStore(db_path) as again:
        assert again.list_audit(ROUTE) == [{"audit_id": audit_id}]


def test_sqlite_audit_table_with_unexpected_columns_is_corrupt(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    sqlite_store.close()
    _raw(db_path, "DROP TABLE audit", "CREATE TABLE audit (id INTEGER, note TEXT)")
    excinfo = _open_fails(db_path)
    assert excinfo.value.diagnostics == {"table": "audit"}


def test_sqlite_corrupt_audit_record_and_route_key(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    sqlite_store.apply_resolution(ROUTE, [make_checkpoint("p-a")], {})
    for bad in ("{oops", "[1, 2]"):
        _raw(db_path, ("UPDATE audit SET record = ?", (bad,)))
        with pytest.raises(CheckpointStoreCorrupt) as excinfo:
            sqlite_store.list_audit(ROUTE)
        _assert_corrupt_without_path(excinfo, db_path)
    _raw(db_path, "UPDATE checkpoint_latest SET strategy = 'sideways'")
    with pytest.raises(CheckpointStoreCorrupt) as excinfo:
        sqlite_store.list_routes()
    _assert_corrupt_without_path(excinfo, db_path)
