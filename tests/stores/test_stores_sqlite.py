"""The SQLite checkpoint store's own behaviour: pragmas, one transaction per batch, indexed
reads, truncated, garbage and foreign files, locks, and the files of release 0.1."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import pytest
from helpers.stores import OTHER_ROUTE, ROUTE, make_checkpoint, make_version_1, sqlite_raw

from dpone_native_transfer.errors import (
    CheckpointStoreCorrupt,
    CheckpointStoreUnavailable,
    ConfigInvalid,
)
from dpone_native_transfer.lease import HeldStore, Lease
from dpone_native_transfer.stores.sqlite import SQLiteCheckpointStore


@pytest.fixture
def sqlite_store(db_path: Path) -> Iterator[SQLiteCheckpointStore]:
    db_path.parent.mkdir()
    with SQLiteCheckpointStore(db_path) as store:
        yield store


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
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 5
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


def _syncs(statements: list[str]) -> list[str]:
    """Each write transaction's ``synchronous`` level, in order."""
    return [
        statements[i - 1].removeprefix("PRAGMA synchronous=")
        for i, statement in enumerate(statements)
        if statement == "BEGIN IMMEDIATE"
    ]


def test_a_write_outside_acts_on_is_fsynced_a_runs_bookkeeping_waits_for_its_release(
    sqlite_store: SQLiteCheckpointStore,
) -> None:
    """Checkpoints (armed before the target call, promoted before the run reports), a
    resolution, and any write made without a lease are fsynced when they return; the lease's
    take and renewals, evidence and source state under it are fsynced by the release, its
    last write, as the WAL is one file written in order."""
    route = attrs.evolve(ROUTE, source_location="sqlite:/s.db", target_location="sqlite:/t.db")
    table = sqlite_store.lease_table()
    lease_sql: list[str] = []
    table._conn.set_trace_callback(lease_sql.append)  # type: ignore[attr-defined]
    with Lease(table, route, run_id="r-1", seconds=60) as lease:
        held = HeldStore(sqlite_store, lease)

        def under_lease() -> None:
            sqlite_store.adopt_unlocated(route)
            held.record_evidence(route, "r-1", {"run_id": "r-1"})
            held.save_source_state(route, {"generation": 1})
            held.upsert_many([make_checkpoint("p-a", route=route)])
            held.apply_resolution(route, [make_checkpoint("p-b", route=route)], {})

        assert _syncs(_traced(sqlite_store, under_lease)) == ["NORMAL"] * 3 + ["FULL"] * 2
    synced = _syncs(lease_sql)  # its take and renewals, then its release
    assert len(synced) >= 3 and set(synced[:-1]) == {"NORMAL"} and synced[-1] == "FULL"

    def without_lease() -> None:
        sqlite_store.record_evidence(ROUTE, "r-2", {"run_id": "r-2"})
        sqlite_store.save_source_state(ROUTE, {"generation": 2})

    assert _syncs(_traced(sqlite_store, without_lease)) == ["FULL", "FULL"]
    assert sqlite_store.load_source_state(ROUTE) == {"generation": 2}


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


def test_an_operators_command_reads_the_whole_file_and_finds_a_damaged_page(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    """A page of the history damaged: ``guard scan`` and ``routes`` read only the latest
    checkpoints and said "nothing blocks" of a store that ``run`` found corrupt."""
    from dpone_native_transfer.stores import open_store

    big = {"blob": "x" * 2000}
    for _ in range(3):
        sqlite_store.upsert_many(
            [make_checkpoint(f"p-{i:03d}", diagnostics=big) for i in range(50)]
        )
    sqlite_store.close()
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        (root,) = db.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'checkpoint_history'"
        ).fetchone()
        (size,) = db.execute("PRAGMA page_size").fetchone()
    with db_path.open("r+b") as file:
        file.seek((root - 1) * size + 100)
        file.write(b"\xde\xad\xbe\xef" * 64)
    partial = SQLiteCheckpointStore(db_path)  # what a command reading the latest alone sees
    assert [route for route in partial.list_routes()] == [ROUTE]
    partial.close()
    with pytest.raises(CheckpointStoreCorrupt) as excinfo:
        open_store(str(db_path), create=False, argument="--store")
    _assert_corrupt_without_path(excinfo, db_path)
    # ``state restore`` may create the store, and checks one it finds: it said "the store
    # already agrees with the target's ledger" of this one
    with pytest.raises(CheckpointStoreCorrupt):
        open_store(str(db_path), create=True, argument="store.path", check=True)
    open_store(str(db_path), create=True, argument="store.path").close()  # a run's: unread


def test_sqlite_unknown_user_version_is_corrupt(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    sqlite_store.close()
    sqlite_raw(db_path, "PRAGMA user_version = 7")
    excinfo = _open_fails(db_path)
    assert excinfo.value.diagnostics["user_version"] == 7


def test_sqlite_missing_table_is_corrupt(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    sqlite_store.close()
    sqlite_raw(db_path, "DROP TABLE evidence")
    excinfo = _open_fails(db_path)
    assert excinfo.value.diagnostics == {"table": "evidence"}


def test_sqlite_foreign_database_is_a_config_error_and_left_alone(db_path: Path) -> None:
    """Another application's database given as the store: a mistake (exit 2), not damage."""
    db_path.parent.mkdir()
    sqlite_raw(db_path, "CREATE TABLE something_else (x)")
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


def test_sqlite_apply_resolution_is_one_transaction(sqlite_store: SQLiteCheckpointStore) -> None:
    batch = [make_checkpoint("p-a"), make_checkpoint("p-b")]
    statements = _traced(sqlite_store, lambda: sqlite_store.apply_resolution(ROUTE, batch, {}))
    assert _transactions(statements) == ["BEGIN IMMEDIATE", "COMMIT"]
    assert sum(s.startswith("INSERT INTO checkpoint_history") for s in statements) == 2
    assert sum(s.startswith("INSERT INTO audit") for s in statements) == 1


def test_sqlite_v1_file_from_before_the_audit_table_opens_and_gains_it(
    sqlite_store: SQLiteCheckpointStore, db_path: Path
) -> None:
    """A store written by the previous release: the same v1 schema without ``audit``."""
    sqlite_store.upsert(make_checkpoint("p-a"))
    sqlite_store.record_evidence(ROUTE, "run-1", {"rows": 1})
    sqlite_store.close()
    make_version_1(db_path)
    sqlite_raw(db_path, "DROP TABLE audit")
    with SQLiteCheckpointStore(db_path) as reopened:
        assert reopened._conn.execute("PRAGMA user_version").fetchone()[0] == 5
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
    sqlite_raw(db_path, "DROP TABLE audit", "CREATE TABLE audit (id INTEGER, note TEXT)")
    excinfo = _open_fails(db_path)
    assert excinfo.value.diagnostics == {"table": "audit"}
