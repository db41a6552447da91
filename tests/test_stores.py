"""Conformance tests every checkpoint/route-state store must pass, plus durability tests
for SQLite and PostgreSQL.

A new store joins the suite by appending a factory to ``STORE_FACTORIES``: given the
fixture request, it returns a callable that opens one more store on the test's location.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
from helpers import postgres_server
from helpers.postgres_server import PostgresLocation, free_port

from dpone_native_transfer.checkpoints import (
    PartitionCheckpoint,
    RouteKey,
    Strategy,
    checkpoint_to_payload,
)
from dpone_native_transfer.errors import (
    CheckpointPayloadInvalid,
    CheckpointStoreCorrupt,
    CheckpointStoreUnavailable,
    ConfigInvalid,
)
from dpone_native_transfer.stores import CheckpointStore, OperatorStore, RouteStateStore
from dpone_native_transfer.stores.memory import MemoryCheckpointStore
from dpone_native_transfer.stores.postgres import PostgresCheckpointStore
from dpone_native_transfer.stores.sqlite import SQLiteCheckpointStore

ROUTE = RouteKey("src.orders", "dst.orders", Strategy.INCREMENTAL_APPEND)
OTHER_ROUTE = RouteKey("src.orders", "dst.orders", Strategy.FULL_REFRESH)
T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

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


def test_sqlite_pragmas(sqlite_store: SQLiteCheckpointStore) -> None:
    conn = sqlite_store._conn
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 3
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 30000
    assert conn.execute("PRAGMA cache_size").fetchone()[0] == -16384  # KiB: 16 MiB at most
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


def test_sqlite_latest_queries_all_use_an_index(sqlite_store: SQLiteCheckpointStore) -> None:
    """Every question a run asks of a route, or of its target table, is an index search."""
    sqlite_store.upsert_many([make_checkpoint("p-a"), make_checkpoint("p-b", route=OTHER_ROUTE)])
    latest = sqlite_store.list_latest(ROUTE)
    scope = sqlite_store.list_target_latest(ROUTE)

    def ask() -> None:
        len(latest)
        latest.committed_with(["p-a"], "sha256:" + "a" * 64, "sha256:" + "b" * 64)
        latest.checkpoints(["p-a"])
        list(latest)
        len(scope)
        scope.ledger_batches()
        scope.guard_groups()
        scope.in_group("failed", "{}")
        scope.guarded_ids()

    queries = _traced(sqlite_store, ask)
    assert len(queries) == 9
    for query in queries:
        plan = sqlite_store._conn.execute("EXPLAIN QUERY PLAN " + query).fetchall()
        details = " | ".join(row[-1] for row in plan)
        assert "SEARCH checkpoint_latest USING" in details, query
        assert "SCAN checkpoint_latest" not in details, query
        if "ORDER BY" not in query or "guard" in query:
            assert "TEMP B-TREE" not in details, (query, details)


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


def test_sqlite_foreign_database_is_a_config_error_and_left_alone(db_path: Path) -> None:
    """Another application's database given as the store: a mistake (exit 2), not damage."""
    db_path.parent.mkdir()
    _raw(db_path, "CREATE TABLE something_else (x)")
    with pytest.raises(ConfigInvalid, match="another SQLite database") as excinfo:
        SQLiteCheckpointStore(db_path)
    assert str(db_path) not in str(excinfo.value)
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
        with pytest.raises(CheckpointStoreUnavailable) as excinfo:
            sqlite_store.upsert(make_checkpoint("p-a"))
        assert not isinstance(excinfo.value, CheckpointStoreCorrupt)
        assert "locked by another process" in str(excinfo.value)
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


# What release 0.1 wrote as schema version 1 (its summary-less ``checkpoint_latest``).
VERSION_1_SCHEMA = (
    """CREATE TABLE checkpoint_history (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, source_table TEXT NOT NULL,
        target_table TEXT NOT NULL, strategy TEXT NOT NULL,
        partition_id TEXT NOT NULL, payload TEXT NOT NULL)""",
    "CREATE INDEX checkpoint_history_by_route"
    " ON checkpoint_history (source_table, target_table, strategy, seq)",
    """CREATE TABLE checkpoint_latest (
        source_table TEXT NOT NULL, target_table TEXT NOT NULL, strategy TEXT NOT NULL,
        partition_id TEXT NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL,
        PRIMARY KEY (source_table, target_table, strategy, partition_id)) WITHOUT ROWID""",
    """CREATE TABLE source_state (
        source_table TEXT NOT NULL, target_table TEXT NOT NULL, strategy TEXT NOT NULL,
        state TEXT NOT NULL, PRIMARY KEY (source_table, target_table, strategy)) WITHOUT ROWID""",
    """CREATE TABLE evidence (
        source_table TEXT NOT NULL, target_table TEXT NOT NULL, strategy TEXT NOT NULL,
        run_id TEXT NOT NULL, seq INTEGER NOT NULL, record TEXT NOT NULL,
        PRIMARY KEY (source_table, target_table, strategy, run_id)) WITHOUT ROWID""",
    "CREATE INDEX evidence_by_route ON evidence (source_table, target_table, strategy, seq)",
    """CREATE TABLE audit (
        audit_id INTEGER PRIMARY KEY AUTOINCREMENT, source_table TEXT NOT NULL,
        target_table TEXT NOT NULL, strategy TEXT NOT NULL, record TEXT NOT NULL)""",
)
_V1_COLUMNS = {
    "checkpoint_history": "seq, source_table, target_table, strategy, partition_id, payload",
    "checkpoint_latest": "source_table, target_table, strategy, partition_id, seq, payload",
    "source_state": "source_table, target_table, strategy, state",
    "evidence": "source_table, target_table, strategy, run_id, seq, record",
    "audit": "audit_id, source_table, target_table, strategy, record",
}


def make_version_1(path: Path) -> None:
    """Rewrite a store file (of unlocated routes) as release 0.1 wrote it: schema version 1."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        rows = {
            table: db.execute(f"SELECT {columns} FROM {table}").fetchall()
            for table, columns in _V1_COLUMNS.items()
        }
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("BEGIN")
        for statement in VERSION_1_SCHEMA:
            db.execute(statement)
        for table, columns in _V1_COLUMNS.items():
            marks = ", ".join("?" * len(columns.split(",")))
            db.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", rows[table])
        db.execute("PRAGMA user_version = 1")
        db.execute("COMMIT")


def test_sqlite_v1_file_from_before_the_audit_table_opens_and_gains_it(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    """A store written by the previous release: the same v1 schema without ``audit``."""
    sqlite_store.upsert(make_checkpoint("p-a"))
    sqlite_store.record_evidence(ROUTE, "run-1", {"rows": 1})
    sqlite_store.close()
    make_version_1(db_path)
    _raw(db_path, "DROP TABLE audit")
    with SQLiteCheckpointStore(db_path) as reopened:
        assert reopened._conn.execute("PRAGMA user_version").fetchone()[0] == 3
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


# --- PostgreSQL only -------------------------------------------------------------------------

CANARY_PASSWORD = "canary-pw-5f2c9e"  # must never appear in an error


@pytest.fixture
def pg(postgres_schema: PostgresLocation) -> Iterator[PostgresCheckpointStore]:
    with PostgresCheckpointStore(postgres_schema.dsn, schema=postgres_schema.schema) as store:
        yield store


def _pg_raw(location: PostgresLocation, *statements: tuple[str, tuple[Any, ...]] | str) -> None:
    """``_raw`` for PostgreSQL: "?" placeholders, the test's schema first on the search path."""
    with psycopg.connect(location.dsn, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{location.schema}"')
        for statement in statements:
            sql, params = (statement, ()) if isinstance(statement, str) else statement
            conn.execute(sql.replace("?", "%s"), params)


def _pg_open_fails(location: PostgresLocation) -> CheckpointStoreCorrupt:
    with pytest.raises(CheckpointStoreCorrupt) as excinfo:
        PostgresCheckpointStore(location.dsn, schema=location.schema).close()
    assert excinfo.value.__context__ is None and excinfo.value.__cause__ is None
    return excinfo.value


def test_without_a_server_the_postgres_tests_fail_instead_of_skipping(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(postgres_server.ENV_DSN, raising=False)
    monkeypatch.setattr(postgres_server, "find_binaries", lambda: None)
    with pytest.raises(pytest.fail.Exception, match="no initdb/pg_ctl"):
        with postgres_server.server_dsn():
            pass


def test_postgres_stores_opening_together_create_the_schema_once(
    postgres_schema: PostgresLocation,
) -> None:
    workers = 6
    start = threading.Barrier(workers)

    def open_store(_: int) -> PostgresCheckpointStore:
        start.wait(timeout=30)
        return PostgresCheckpointStore(postgres_schema.dsn, schema=postgres_schema.schema)

    with ThreadPoolExecutor(workers) as pool:
        futures = [pool.submit(open_store, i) for i in range(workers)]
    stores = [future.result() for future in futures]  # a lost race would raise here
    try:
        for i, store in enumerate(stores):
            store.upsert(make_checkpoint(f"p-{i}"))
        assert [cp.partition_id for cp in stores[0].list_latest(ROUTE)] == [
            f"p-{i}" for i in range(workers)
        ]
    finally:
        for store in stores:
            store.close()
    with psycopg.connect(postgres_schema.dsn) as conn:
        meta = conn.execute(f'SELECT key, value FROM "{postgres_schema.schema}".meta').fetchall()
    assert meta == [("schema_version", "2")]


def test_postgres_every_call_is_a_closed_transaction(pg: PostgresCheckpointStore) -> None:
    """Autocommit is off, yet no call leaves a transaction open (it would hold locks)."""
    assert pg._conn.autocommit is False
    pg.upsert(make_checkpoint("p-a"))
    pg.list_latest(ROUTE)
    pg.list_routes()
    assert pg._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


_LATEST = {"table": "checkpoint_latest"}
DAMAGED_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "version-7": ("UPDATE meta SET value = '7'", {"schema_version": 7, "expected": 2}),
    "version-garbage": ("UPDATE meta SET value = 'one'", {"schema_version": None, "expected": 2}),
    "no-version-row": ("DELETE FROM meta", {}),
    "no-meta-table": ("DROP TABLE meta", {}),
    "missing-table": ("DROP TABLE evidence", {"table": "evidence"}),
    "missing-column": ("ALTER TABLE audit DROP COLUMN record", {"table": "audit"}),
    "extra-column": ("ALTER TABLE meta ADD COLUMN note text", {"table": "meta"}),
    "wrong-type": ("ALTER TABLE checkpoint_latest ALTER COLUMN seq TYPE integer", _LATEST),
    "wrong-collation": (
        'ALTER TABLE checkpoint_latest ALTER COLUMN partition_id TYPE text COLLATE "POSIX"',
        _LATEST,
    ),
}


@pytest.mark.parametrize("damage", sorted(DAMAGED_SCHEMAS))
def test_postgres_unknown_or_damaged_schema_is_corrupt(
    pg: PostgresCheckpointStore, postgres_schema: PostgresLocation, damage: str
) -> None:
    statement, diagnostics = DAMAGED_SCHEMAS[damage]
    pg.upsert(make_checkpoint("p-a"))
    pg.close()
    _pg_raw(postgres_schema, statement)
    assert _pg_open_fails(postgres_schema).diagnostics == diagnostics


def test_postgres_schema_with_foreign_tables_only_is_used(
    postgres_schema: PostgresLocation,
) -> None:
    """A shared schema may hold other tables; ours are created beside them."""
    _pg_raw(
        postgres_schema, f'CREATE SCHEMA "{postgres_schema.schema}"', "CREATE TABLE other (x int)"
    )
    with PostgresCheckpointStore(postgres_schema.dsn, schema=postgres_schema.schema) as store:
        store.upsert(make_checkpoint("p-a"))
        assert store.list_latest(ROUTE) == [make_checkpoint("p-a")]


def _assert_secret_free(error: Exception, *secrets: str) -> None:
    assert isinstance(error, CheckpointStoreUnavailable)
    assert error.code == "native_transfer_checkpoint_store_unavailable"
    for text in (str(error), repr(error), error.message, repr(error.diagnostics)):
        for secret in secrets:
            assert secret not in text
    assert error.__cause__ is None and error.__context__ is None


def _dsn_with(dsn: str, **changes: Any) -> str:
    return psycopg.conninfo.make_conninfo(dsn, **changes)


def test_postgres_wrong_password_is_unavailable_without_secrets(
    postgres_schema: PostgresLocation,
) -> None:
    bad = _dsn_with(postgres_schema.dsn, password=CANARY_PASSWORD)
    with pytest.raises(CheckpointStoreUnavailable) as excinfo:
        PostgresCheckpointStore(bad, schema=postgres_schema.schema)
    params = psycopg.conninfo.conninfo_to_dict(postgres_schema.dsn)
    _assert_secret_free(excinfo.value, CANARY_PASSWORD, bad, params["host"], "authentication")
    assert excinfo.value.diagnostics == {"action": "opened", "error_type": "OperationalError"}


def test_postgres_unreachable_server_is_unavailable_without_secrets() -> None:
    port = str(free_port())  # nothing listens there
    dsn = f"host=127.0.0.1 port={port} user=canary_user dbname=canary_db password={CANARY_PASSWORD}"
    uri = f"postgresql://canary_user:{CANARY_PASSWORD}@127.0.0.1:{port}/canary_db"
    for given in (dsn, uri):
        with pytest.raises(CheckpointStoreUnavailable) as excinfo:
            PostgresCheckpointStore(given)
        _assert_secret_free(
            excinfo.value, CANARY_PASSWORD, given, "127.0.0.1", port, "canary", "Connection refused"
        )


def test_postgres_unparsable_dsn_is_config_invalid_without_the_dsn() -> None:
    dsn = f"host=127.0.0.1 password={CANARY_PASSWORD} this-is-not-conninfo"
    with pytest.raises(ConfigInvalid) as excinfo:
        PostgresCheckpointStore(dsn)
    assert CANARY_PASSWORD not in str(excinfo.value) and "conninfo" not in str(excinfo.value)
    assert excinfo.value.diagnostics == {"key": "dsn"}
    with pytest.raises(ConfigInvalid):
        PostgresCheckpointStore(b"host=x")  # type: ignore[arg-type]


@pytest.mark.parametrize("schema", ["", "Public", "a-b", "x" * 64, 'dpone"; DROP', None])
def test_postgres_schema_name_must_be_a_plain_identifier(schema: Any) -> None:
    with pytest.raises(ConfigInvalid) as excinfo:
        PostgresCheckpointStore("host=127.0.0.1", schema=schema)
    assert excinfo.value.diagnostics == {"key": "schema"}


def test_postgres_lost_connection_is_unavailable(
    pg: PostgresCheckpointStore, postgres_schema: PostgresLocation
) -> None:
    pg.upsert(make_checkpoint("p-a"))
    pid = pg._conn.info.backend_pid
    _pg_raw(postgres_schema, ("SELECT pg_terminate_backend(%s)", (pid,)))
    with pytest.raises(CheckpointStoreUnavailable) as excinfo:
        pg.list_latest(ROUTE)
    _assert_secret_free(excinfo.value, postgres_schema.dsn, "terminat")
    assert excinfo.value.diagnostics["action"] == "read"
    with pytest.raises(CheckpointStoreUnavailable):
        pg.upsert(make_checkpoint("p-b"))


def test_postgres_text_cannot_hold_nul_so_such_keys_are_refused_unwritten(
    pg: PostgresCheckpointStore,
) -> None:
    """A documented difference from SQLite: the driver refuses NUL before sending anything."""
    with pytest.raises(psycopg.DataError):
        pg.upsert_many([make_checkpoint("p-a"), make_checkpoint("p-\x00")])
    assert pg._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert pg.list_latest(ROUTE) == []


def test_postgres_without_the_driver_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(ConfigInvalid) as excinfo:
        PostgresCheckpointStore("host=127.0.0.1")
    assert "dpone-native-transfer[postgres]" in str(excinfo.value)
    assert excinfo.value.__cause__ is None


def test_importing_the_package_does_not_import_psycopg() -> None:
    code = (
        "import sys; sys.modules['psycopg'] = None; import dpone_native_transfer as d;"
        " from dpone_native_transfer.stores import postgres; print(d.PostgresCheckpointStore)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "PostgresCheckpointStore" in done.stdout


def test_postgres_upsert_many_is_one_transaction(
    pg: PostgresCheckpointStore, postgres_schema: PostgresLocation
) -> None:
    pg.upsert_many([make_checkpoint(f"p-{i}") for i in range(5)])
    with psycopg.connect(postgres_schema.dsn) as conn:
        s = postgres_schema.schema
        xids = conn.execute(
            f'SELECT DISTINCT xmin::text FROM "{s}".checkpoint_history'
            f' UNION SELECT DISTINCT xmin::text FROM "{s}".checkpoint_latest'
        ).fetchall()
    assert len(xids) == 1, "history and latest rows of one batch come from one transaction"


def _recorded(store: PostgresCheckpointStore, action: Callable[[], object]) -> list[tuple]:
    """(query, params) of every statement ``action`` runs on the store's connection."""
    statements: list[tuple] = []

    class Recording(psycopg.Cursor):
        def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
            statements.append((query, params))
            return super().execute(query, params, **kwargs)

    store._conn.cursor_factory = Recording
    try:
        action()
    finally:
        store._conn.cursor_factory = psycopg.Cursor
    return statements


def test_postgres_list_latest_is_a_primary_key_range_read(
    pg: PostgresCheckpointStore, postgres_schema: PostgresLocation
) -> None:
    routes = [RouteKey(f"src.t{i:02d}", "dst", Strategy.INCREMENTAL_APPEND) for i in range(40)]
    for route in [*routes, ROUTE]:
        pg.upsert_many([make_checkpoint(f"p-{j:03d}", route=route) for j in range(50)])
    _pg_raw(postgres_schema, "ANALYZE checkpoint_latest")
    [(query, params)] = _recorded(pg, lambda: pg.list_latest(ROUTE))
    with psycopg.connect(postgres_schema.dsn) as conn:
        plan = "\n".join(row[0] for row in conn.execute("EXPLAIN " + query, params))
    assert "Index Scan using checkpoint_latest_pkey" in plan, plan
    assert "Seq Scan" not in plan and "Sort" not in plan, plan
    assert [cp.partition_id for cp in pg.list_latest(ROUTE)] == [f"p-{j:03d}" for j in range(50)]


def test_postgres_concurrent_writes_to_one_route_keep_history_in_commit_order(
    postgres_schema: PostgresLocation,
) -> None:
    """Writes are serialised per route, so the latest row is always the newest history row."""
    workers, rounds = 4, 15
    start = threading.Barrier(workers)

    def write(worker: int) -> None:
        with PostgresCheckpointStore(postgres_schema.dsn, schema=postgres_schema.schema) as store:
            start.wait(timeout=30)
            for i in range(rounds):
                store.upsert_many(
                    [make_checkpoint(p, run_id=f"w{worker}-{i}") for p in ("p-a", "p-b")]
                )
                store.record_evidence(ROUTE, f"w{worker}-{i}", {"i": i})

    with PostgresCheckpointStore(postgres_schema.dsn, schema=postgres_schema.schema) as store:
        with ThreadPoolExecutor(workers) as pool:
            for future in [pool.submit(write, w) for w in range(workers)]:
                future.result()
        history = store.history(ROUTE)
        newest = {cp.partition_id: cp for cp in history}
        assert store.list_latest(ROUTE) == [newest["p-a"], newest["p-b"]]
        assert len(history) == workers * rounds * 2
        runs = [cp.run_id for cp in history]
        assert runs[0::2] == runs[1::2], "each batch's two rows are adjacent in history"
        assert len(store.list_evidence(ROUTE)) == workers * rounds


# --- both durable stores: reopening, damaged rows, failed writes ------------------------------


@attrs.define
class Durable:
    """A durable store, plus raw SQL on its tables for tests that damage rows or fail writes."""

    store: Any
    reopen: Callable[[], Any]
    execute: Callable[..., None]  # raw statements with "?" placeholders
    fail_inserts: Callable[[str, str], None]  # (table, SQL condition on NEW) -> trigger
    idle: Callable[[], bool]  # no transaction left open on the store's connection
    secrets: tuple[str, ...]  # what no store error may mention

    def latest_row(self, partition_id: str, payload: str) -> tuple[str, tuple[Any, ...]]:
        """A raw ``checkpoint_latest`` row of ROUTE with seq 999."""
        return (
            "INSERT INTO checkpoint_latest"
            " (source_table, target_table, strategy, partition_id, seq, payload)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (*_route_params(ROUTE), partition_id, 999, payload),
        )

    def corrupt(self, read: Callable[[], object]) -> CheckpointStoreCorrupt:
        """``read()`` raises CheckpointStoreCorrupt naming no secret and chaining nothing."""
        with pytest.raises(CheckpointStoreCorrupt) as excinfo:
            read()
        exc = excinfo.value
        for text in (str(exc), repr(exc), exc.message, repr(exc.diagnostics)):
            assert not [secret for secret in self.secrets if secret in text]
        assert exc.__cause__ is None
        assert exc.__context__ is None or exc.__suppress_context__
        return exc


def _route_params(route: RouteKey) -> tuple[str, str, str]:
    return (route.source_table, route.target_table, str(route.strategy))


def _pg_trigger(location: PostgresLocation, table: str, condition: str) -> None:
    _pg_raw(
        location,
        "CREATE FUNCTION inject_failure() RETURNS trigger LANGUAGE plpgsql AS $$"
        f" BEGIN IF {condition} THEN RAISE EXCEPTION 'injected'; END IF; RETURN NEW; END $$",
        f"CREATE TRIGGER inject_failure BEFORE INSERT ON {table}"
        " FOR EACH ROW EXECUTE FUNCTION inject_failure()",
    )


@pytest.fixture(params=["sqlite", "postgres"])
def durable(request: pytest.FixtureRequest, db_path: Path) -> Iterator[Durable]:
    if request.param == "sqlite":
        db_path.parent.mkdir()
        with SQLiteCheckpointStore(db_path) as store:
            yield Durable(
                store,
                reopen=lambda: SQLiteCheckpointStore(db_path),
                execute=lambda *statements: _raw(db_path, *statements),
                fail_inserts=lambda table, condition: _raw(
                    db_path,
                    f"CREATE TRIGGER inject_failure BEFORE INSERT ON {table} WHEN {condition}"
                    " BEGIN SELECT RAISE(ABORT, 'injected'); END",
                ),
                idle=lambda: not store._conn.in_transaction,
                secrets=(str(db_path.parent), "secret-location", "injected"),
            )
        return
    location: PostgresLocation = request.getfixturevalue("postgres_schema")
    password = psycopg.conninfo.conninfo_to_dict(location.dsn).get("password") or location.dsn
    with PostgresCheckpointStore(location.dsn, schema=location.schema) as store:
        yield Durable(
            store,
            reopen=lambda: PostgresCheckpointStore(location.dsn, schema=location.schema),
            execute=lambda *statements: _pg_raw(location, *statements),
            fail_inserts=lambda table, condition: _pg_trigger(location, table, condition),
            idle=lambda: store._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE,
            secrets=(location.dsn, str(password), "injected"),
        )


def test_durable_store_survives_reopen(durable: Durable) -> None:
    store = durable.store
    cps = [
        make_checkpoint("p-a"),
        make_checkpoint("p-b"),
        make_checkpoint("p-a", status="committed"),
    ]
    store.upsert_many(cps)
    store.save_source_state(ROUTE, {"generation": 3})
    store.record_evidence(ROUTE, "run-1", {"rows": 1})
    audit_id = store.apply_resolution(ROUTE, [cps[2]], {"reason": "checked"})
    store.close()
    store.close()
    with pytest.raises(ValueError):
        store.list_latest(ROUTE)
    with durable.reopen() as reopened:
        assert reopened.list_latest(ROUTE) == [cps[2], cps[1]]
        assert reopened.history(ROUTE) == [*cps, cps[2]]
        assert reopened.load_source_state(ROUTE) == {"generation": 3}
        assert reopened.list_evidence(ROUTE) == [{"rows": 1}]
        assert reopened.list_audit(ROUTE) == [{"reason": "checked", "audit_id": audit_id}]


def test_durable_failure_mid_batch_rolls_back_whole_batch(durable: Durable) -> None:
    before = make_checkpoint("p-0")
    durable.store.upsert(before)
    durable.fail_inserts("checkpoint_history", "NEW.partition_id = 'p-poison'")
    batch = [
        make_checkpoint("p-1"),
        make_checkpoint("p-0", status="committed"),
        make_checkpoint("p-poison"),  # the third row fails
        make_checkpoint("p-3"),
    ]
    durable.corrupt(lambda: durable.store.upsert_many(batch))
    assert durable.idle()
    assert durable.store.list_latest(ROUTE) == [before]
    assert durable.store.history(ROUTE) == [before]


def test_durable_failed_audit_insert_rolls_back_the_checkpoints(durable: Durable) -> None:
    before = make_checkpoint("p-a", status="failed")
    durable.store.upsert(before)
    durable.fail_inserts("audit", "TRUE")
    resolved = [make_checkpoint("p-a", status="committed")]
    durable.corrupt(lambda: durable.store.apply_resolution(ROUTE, resolved, {}))
    assert durable.idle()
    assert durable.store.list_latest(ROUTE) == [before]
    assert durable.store.history(ROUTE) == [before]
    assert durable.store.list_audit(ROUTE) == []


def test_durable_non_json_payload_is_corrupt_not_empty(durable: Durable) -> None:
    durable.store.upsert(make_checkpoint("p-a"))
    if isinstance(durable.store, SQLiteCheckpointStore):
        # its summary columns are generated from the payload: SQLite refuses non-JSON itself
        with pytest.raises(sqlite3.OperationalError):
            durable.execute(durable.latest_row("p-b", "{not json"))
        assert durable.store.list_latest(ROUTE) == [make_checkpoint("p-a")]
        return
    durable.execute(durable.latest_row("p-b", "{not json"))
    error = durable.corrupt(lambda: list(durable.store.list_latest(ROUTE)))
    assert error.diagnostics == {"route": ROUTE.as_dict(), "partition_id": "p-b", "seq": 999}
    assert durable.store.list_latest(OTHER_ROUTE) == []


def test_durable_payload_failing_schema_propagates(durable: Durable) -> None:
    payload = checkpoint_to_payload(make_checkpoint("p-b"))
    payload["status"] = "bogus"
    durable.execute(durable.latest_row("p-b", json.dumps(payload)))
    with pytest.raises(CheckpointPayloadInvalid) as excinfo:
        list(durable.store.list_latest(ROUTE))
    assert excinfo.value.diagnostics["partition_id"] == "p-b"
    assert excinfo.value.diagnostics["field"] == "status"

    del payload["partition_id"]
    durable.execute("DELETE FROM checkpoint_latest", durable.latest_row("p-c", json.dumps(payload)))
    with pytest.raises(CheckpointPayloadInvalid) as excinfo:
        list(durable.store.list_latest(ROUTE))
    assert excinfo.value.diagnostics["partition_id"] == "p-c"


def test_durable_payload_filed_under_wrong_key_is_corrupt(durable: Durable) -> None:
    elsewhere = json.dumps(checkpoint_to_payload(make_checkpoint("p-a", route=OTHER_ROUTE)))
    durable.execute(durable.latest_row("p-a", elsewhere))
    durable.corrupt(lambda: list(durable.store.list_latest(ROUTE)))
    other_partition = json.dumps(checkpoint_to_payload(make_checkpoint("p-other")))
    durable.execute("DELETE FROM checkpoint_latest", durable.latest_row("p-a", other_partition))
    durable.corrupt(lambda: list(durable.store.list_latest(ROUTE)))


@pytest.mark.parametrize(
    "table, column, reader",
    [
        ("source_state", "state", "load_source_state"),
        ("evidence", "record", "list_evidence"),
        ("audit", "record", "list_audit"),
    ],
)
def test_durable_corrupt_state_evidence_and_audit(
    durable: Durable, table: str, column: str, reader: str
) -> None:
    durable.store.save_source_state(ROUTE, {"generation": 1})
    durable.store.record_evidence(ROUTE, "run-1", {"rows": 1})
    durable.store.apply_resolution(ROUTE, [make_checkpoint("p-a")], {})
    for bad in ("{oops", "[1, 2]"):
        durable.execute((f"UPDATE {table} SET {column} = ?", (bad,)))
        durable.corrupt(lambda: getattr(durable.store, reader)(ROUTE))


def test_durable_bad_route_key_is_corrupt(durable: Durable) -> None:
    durable.store.upsert(make_checkpoint("p-a"))
    durable.execute("UPDATE checkpoint_latest SET strategy = 'sideways'")
    durable.corrupt(durable.store.list_routes)
