"""The route scan without decoding every payload: ``LatestCheckpoints`` and the SQLite summary.

A run reads each checkpoint's status, hashes and guard text from columns the
SQLite store generates from the payload, and decodes a payload only when it
acts on that partition. These tests pin that the shortcut decides exactly as
reading every checkpoint would, that a store written by an older release is
migrated without loss, and that a corrupt checkpoint a run acts on still stops
it before the target.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from datetime import UTC, datetime
from typing import Any

import attrs
import pytest
from helpers.bad_input import GUARD_CASES
from helpers.stores import make_version_1, make_version_3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpone_native_transfer import (
    CheckpointPayloadInvalid,
    CheckpointStoreCorrupt,
    CheckpointStoreUnavailable,
    ManualReconciliationRequired,
    PartitionCheckpoint,
    RouteKey,
    SQLiteCheckpointStore,
    SQLiteSink,
    SQLiteSource,
    TransferRuntime,
    TransferSpec,
    checkpoint_to_payload,
)
from dpone_native_transfer.checkpoints import GUARD_DIAGNOSTICS_KEY, LEDGER_BATCH_KEY, strict_json
from dpone_native_transfer.latest import LatestCheckpoints, as_latest
from dpone_native_transfer.stores import _sqlite_schema
from dpone_native_transfer.stores import sqlite as sqlite_store
from dpone_native_transfer.testing import RecordingSink, StepClock, build_sample_source
from dpone_target_commit_guard.payload import GuardPhase, build_guard
from dpone_target_commit_guard.policy import blocked_partitions

ROUTE = RouteKey("orders", "orders_copy", "incremental_append")
BATCH = "sha256:" + "ab" * 32


def checkpoint(partition_id: str, status: str = "committed", **diagnostics: Any):
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return PartitionCheckpoint(
        partition_id=partition_id,
        route=ROUTE,
        status=status,
        run_id="run-1",
        query_hash="sha256:" + "1" * 64,
        schema_hash="sha256:" + "2" * 64,
        partition_bounds={"partition": partition_id},
        started_at=at,
        completed_at=at if status == "committed" else None,
        diagnostics=diagnostics,
    )


def guarded(partition_id: str, phase: GuardPhase, status: str):
    return checkpoint(partition_id, status, **{GUARD_DIAGNOSTICS_KEY: build_guard(phase, BATCH)})


class CountingDecoder:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = sqlite_store.decode_checkpoint

        def decode(*args: Any) -> PartitionCheckpoint:
            self.calls += 1
            return real(*args)

        monkeypatch.setattr(sqlite_store, "decode_checkpoint", decode)


# -- the sequence itself ------------------------------------------------------------------


def test_items_are_decoded_only_when_read(tmp_path, monkeypatch):
    decoder = CountingDecoder(monkeypatch)
    with SQLiteCheckpointStore(tmp_path / "c.db") as store:
        store.upsert_many([checkpoint(f"p-{i}") for i in range(5)])
        latest = store.list_latest(ROUTE)
        assert isinstance(latest, LatestCheckpoints) and len(latest) == 5
        assert latest.get("p-1") == checkpoint("p-1") and latest.get("p-missing") is None
        assert sorted(latest.checkpoints(["p-2", "p-3", "p-9"])) == ["p-2", "p-3"]
        assert decoder.calls == 3
        assert latest[1].partition_id == "p-1" and latest[-1].partition_id == "p-4"
        assert [cp.partition_id for cp in latest[1:3]] == ["p-1", "p-2"]
        assert decoder.calls == 3 + 5  # the first positional read decodes all, once
        with pytest.raises(IndexError):
            latest[5]
        assert latest == [checkpoint(f"p-{i}") for i in range(5)]
        assert latest != [checkpoint(f"p-{i}") for i in range(4)]
        assert decoder.calls == 8


def test_summary_answers_without_decoding(tmp_path, monkeypatch):
    decoder = CountingDecoder(monkeypatch)
    hashes = ("sha256:" + "1" * 64, "sha256:" + "2" * 64)
    with SQLiteCheckpointStore(tmp_path / "c.db") as store:
        store.upsert_many(
            [
                checkpoint("p-done"),
                guarded("p-armed", GuardPhase.ARMED, "exported"),
                guarded("p-armed-2", GuardPhase.ARMED, "exported"),
                checkpoint("p-exported", "exported"),
            ]
        )
        latest = store.list_latest(ROUTE)
        ids = ["p-done", "p-exported", "p-armed", "p-new"]
        assert latest.committed_with(ids, *hashes) == {"p-done"}
        assert latest.committed_with(ids, "sha256:" + "9" * 64, hashes[1]) == set()
        assert latest.guarded_ids() == ["p-armed", "p-armed-2"]
        (((status, text), count),) = latest.guard_groups().items()
        assert (status, count) == ("exported", 2)
        assert LatestCheckpoints.parse_guard(text) == build_guard(GuardPhase.ARMED, BATCH)
        assert len(latest) == 4
        assert decoder.calls == 0
        assert [cp.partition_id for cp in latest.in_group(status, text)] == ["p-armed", "p-armed-2"]
        assert decoder.calls == 2


def test_wrapping_decoded_checkpoints_gives_the_same_answers():
    items = [checkpoint("p-a"), guarded("p-b", GuardPhase.ARMED, "exported")]
    latest = as_latest(items)
    assert as_latest(latest) is latest
    assert latest == items and latest.guarded_ids() == ["p-b"]
    assert latest.committed_with(["p-a", "p-b"], items[0].query_hash, items[0].schema_hash) == {
        "p-a"
    }
    assert [f.partition_id for f in blocked_partitions(latest)] == ["p-b"]


def test_a_guard_that_is_not_json_is_read_the_slow_way_and_reported():
    odd = checkpoint("p-odd", "failed", **{GUARD_DIAGNOSTICS_KEY: {1, 2}})  # a set: no JSON
    findings = blocked_partitions(as_latest([checkpoint("p-a"), odd]))
    assert [(f.partition_id, f.problem) for f in findings] == [("p-odd", "not_an_object")]


# -- the guard's grouped scan equals reading every checkpoint ----------------------------


@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(cases=st.lists(GUARD_CASES, min_size=1, max_size=6), legacy=st.integers(0, 3))
def test_grouped_scan_finds_exactly_what_reading_every_checkpoint_finds(
    tmp_path_factory, cases, legacy
):
    folder = tmp_path_factory.mktemp("grouped")
    items = [checkpoint(f"p-legacy-{i}") for i in range(legacy)]
    for i, (value, status) in enumerate(cases):
        items.append(checkpoint(f"p-{i}", status, **{GUARD_DIAGNOSTICS_KEY: value}))
    with SQLiteCheckpointStore(folder / "c.db") as store:
        writable = []
        for item in items:
            try:
                store.upsert(item)
                writable.append(item)
            except CheckpointPayloadInvalid:  # not JSON-safe: the store refuses it
                pass
        fast = blocked_partitions(store.list_latest(ROUTE))
        slow = blocked_partitions(list(store.list_latest(ROUTE)))
    assert [f.as_dict() for f in fast] == [f.as_dict() for f in slow]
    assert len(slow) <= len(writable)


# -- a run touches only what it acts on ---------------------------------------------------


def unwindowed_route(tmp_path):
    """A route without a cursor column: every run plans every partition."""
    build_sample_source(tmp_path / "source.db", rows=200, partitions=20)
    source = SQLiteSource(str(tmp_path / "source.db"), "orders", "region")
    sink = RecordingSink(SQLiteSink(str(tmp_path / "target.db"), "orders_copy"))
    spec = TransferSpec(
        source=source, sink=sink, strategy="incremental_append", path="legacy", run_id="run-1"
    )
    return spec, sink


def test_a_healthy_rerun_decodes_no_checkpoint(tmp_path, monkeypatch):
    spec, sink = unwindowed_route(tmp_path)
    with SQLiteCheckpointStore(tmp_path / "c.db") as store:
        TransferRuntime(store, clock=StepClock()).run(spec)
        decoder = CountingDecoder(monkeypatch)
        again = TransferRuntime(store, clock=StepClock()).run(spec)
    assert len(again.skipped_partition_ids) == 20 and again.rows_loaded == 0
    assert decoder.calls == 0
    assert sink.target_calls == 1


def test_a_corrupt_checkpoint_of_a_partition_the_run_retries_stops_it_before_the_target(
    tmp_path,
):
    spec, sink = unwindowed_route(tmp_path)
    with SQLiteCheckpointStore(tmp_path / "c.db") as store:
        TransferRuntime(store, clock=StepClock()).run(spec)
        first = store.list_latest(spec.route)[0]
    payload = checkpoint_to_payload(first)
    del payload["query_hash"]  # still JSON: SQLite stores it, the summary column becomes NULL
    with contextlib.closing(sqlite3.connect(tmp_path / "c.db", isolation_level=None)) as db:
        db.execute(
            "UPDATE checkpoint_latest SET payload = ? WHERE partition_id = ?",
            (json.dumps(payload), first.partition_id),
        )
    with SQLiteCheckpointStore(tmp_path / "c.db") as store:
        with pytest.raises(CheckpointPayloadInvalid) as info:
            TransferRuntime(store, clock=StepClock()).run(spec)
    assert info.value.diagnostics["partition_id"] == first.partition_id
    assert sink.target_calls == 1  # the first run only


# -- stores written before the summary columns ----------------------------------------------

OLD_COLUMNS = "source_table, target_table, strategy, partition_id, seq, payload"
SUMMARY = [
    "status", "query_hash", "schema_hash", "guard", "source_location", "target_location",
    "ledger_batch",
]  # fmt: skip


def latest_columns(path) -> list[str]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [row[1] for row in db.execute("PRAGMA table_info(checkpoint_latest)")][6:]


def version_1_store(path):
    """A version-1 store of a healthy and a blocked partition: (latest, history) as written."""
    items = [checkpoint("p-a"), guarded("p-b", GuardPhase.TARGET_OUTCOME_UNKNOWN, "failed")]
    with SQLiteCheckpointStore(path) as store:
        store.upsert_many(items)
        history = store.history(ROUTE)
    make_version_1(path)
    return items, history


def test_an_old_store_is_migrated_on_open_without_losing_a_checkpoint(tmp_path):
    path = tmp_path / "c.db"
    items, history = version_1_store(path)
    assert latest_columns(path) == []
    with SQLiteCheckpointStore(path) as store:
        assert store.list_latest(ROUTE) == items
        assert store.history(ROUTE) == history
        assert store.list_latest(ROUTE).guarded_ids() == ["p-b"]
        assert [f.partition_id for f in blocked_partitions(store.list_latest(ROUTE))] == ["p-b"]
    assert latest_columns(path) == SUMMARY
    with contextlib.closing(sqlite3.connect(path)) as db:
        indexes = [row[1] for row in db.execute("PRAGMA index_list(checkpoint_latest)")]
    assert {"checkpoint_latest_by_target", "checkpoint_latest_by_batch"} <= set(indexes)


def test_a_writer_that_ignores_the_summary_columns_still_blocks_the_route(tmp_path):
    """Raw SQL naming only the payload: the store's triggers fill the summary from it."""
    path = tmp_path / "c.db"
    with SQLiteCheckpointStore(path) as store:
        store.upsert(checkpoint("p-armed"))
    armed = guarded("p-armed", GuardPhase.ARMED, "exported")
    text = json.dumps(checkpoint_to_payload(armed), sort_keys=True)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("UPDATE checkpoint_latest SET payload = ?", (text,))
        db.execute("UPDATE checkpoint_latest SET status = 'committed', guard = NULL")
        db.execute(
            f"INSERT INTO checkpoint_latest ({OLD_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?)",
            (
                *(ROUTE.source_table, ROUTE.target_table, str(ROUTE.strategy)),
                "p-b",
                2,
                text.replace("p-armed", "p-b"),
            ),
        )
    with SQLiteCheckpointStore(path) as store:
        findings = blocked_partitions(store.list_latest(ROUTE))
    assert [(f.partition_id, f.phase) for f in findings] == [
        ("p-armed", GuardPhase.ARMED),
        ("p-b", GuardPhase.ARMED),
    ]


def test_a_run_on_an_old_store_is_blocked_by_its_armed_guard(tmp_path):
    spec, sink = unwindowed_route(tmp_path)
    with SQLiteCheckpointStore(tmp_path / "first.db") as store:
        TransferRuntime(store, clock=StepClock()).run(spec)
        first = store.list_latest(spec.route)[0]
    with SQLiteCheckpointStore(tmp_path / "c.db") as store:  # routes of 0.1 had no locations
        armed = guarded(first.partition_id, GuardPhase.ARMED, "exported")
        store.upsert(attrs.evolve(armed, route=spec.route.unlocated()))
    make_version_1(tmp_path / "c.db")
    with SQLiteCheckpointStore(tmp_path / "c.db") as store:
        with pytest.raises(ManualReconciliationRequired):
            TransferRuntime(store, clock=StepClock()).run(spec)
    assert sink.target_calls == 1


@pytest.mark.parametrize(
    "damage",
    [
        "DROP TRIGGER checkpoint_latest_upkeep_on_insert",
        "DROP TRIGGER checkpoint_latest_upkeep_on_update",
        "DROP INDEX checkpoint_latest_by_target",
        "DROP INDEX checkpoint_latest_by_batch",
    ],
)
def test_a_store_missing_what_keeps_the_summary_right_is_corrupt(tmp_path, damage):
    path = tmp_path / "c.db"
    SQLiteCheckpointStore(path).close()
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute(damage)
    with pytest.raises(CheckpointStoreCorrupt):
        SQLiteCheckpointStore(path)


# The keys the summary reads, each of which a payload could hold twice: SQLite reads the first,
# Python the last. Each is given a second ``null``, which schema version 3 missed.
KEY_TWICE = (
    "status", "query_hash", "schema_hash", "diagnostics", GUARD_DIAGNOSTICS_KEY, LEDGER_BATCH_KEY
)  # fmt: skip


def key_twice(payload: str, key: str) -> str:
    """``payload`` with ``key`` given a second time, as ``null``."""
    if key in (GUARD_DIAGNOSTICS_KEY, LEDGER_BATCH_KEY):
        assert payload.count('"diagnostics": {}') == 1
        return payload.replace(
            '"diagnostics": {}', f'"diagnostics": {{"{key}": "x", "{key}": null}}'
        )
    assert payload.endswith("}")
    return payload[:-1] + f', "{key}": null}}'


@pytest.mark.parametrize("where", KEY_TWICE)
def test_a_payload_holding_a_summary_key_twice_is_refused_a_second_null_too(tmp_path, where):
    path = tmp_path / "c.db"
    with SQLiteCheckpointStore(path) as store:
        store.upsert(checkpoint("p-a"))
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        before = db.execute("SELECT * FROM checkpoint_latest").fetchall()
        (payload,) = db.execute("SELECT payload FROM checkpoint_latest").fetchone()
        forged = key_twice(payload, where)
        with pytest.raises(ValueError, match="holds a key twice"):
            strict_json(forged)
        for statement in (
            "UPDATE checkpoint_latest SET payload = ?",
            f"INSERT INTO checkpoint_latest ({OLD_COLUMNS}) VALUES ('orders', 'b', 'full_refresh',"
            " 'p-b', 2, ?)",
        ):
            with pytest.raises(sqlite3.IntegrityError, match="holds a key twice"):
                db.execute(statement, (forged,))
        assert db.execute("SELECT * FROM checkpoint_latest").fetchall() == before


def test_a_version_3_store_is_migrated_and_a_payload_with_a_second_null_key_blocks(tmp_path):
    """Version 3 let ``"status": "committed", "status": null`` in: migrating blocks it."""
    path = tmp_path / "c.db"
    with SQLiteCheckpointStore(path) as store:
        store.upsert_many([checkpoint("p-a"), checkpoint("p-b")])
        history = store.history(ROUTE)
    make_version_3(path)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        (payload,) = db.execute(
            "SELECT payload FROM checkpoint_latest WHERE partition_id = 'p-b'"
        ).fetchone()
        db.execute(  # version 3 accepts it, and reads the summary from the first key
            "UPDATE checkpoint_latest SET payload = ? WHERE partition_id = 'p-b'",
            (key_twice(payload, "status"),),
        )
        assert db.execute("SELECT DISTINCT status, guard FROM checkpoint_latest").fetchall() == [
            ("committed", None)
        ]
    with SQLiteCheckpointStore(path) as store:
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == 5
        triggers = store._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' ORDER BY name"
        ).fetchall()
        assert triggers == [
            ("checkpoint_latest_upkeep_on_insert",),
            ("checkpoint_latest_upkeep_on_update",),
        ]
        assert store.history(ROUTE) == history
        latest = store.list_latest(ROUTE)
        assert latest.get("p-a") == checkpoint("p-a")
        assert latest.guarded_ids() == ["p-b"]  # a guard no reader accepts: the route blocks
        with pytest.raises(CheckpointStoreCorrupt, match="holds a key twice"):
            latest.get("p-b")
        store.upsert(checkpoint("p-b", "failed"))  # a resolution replaces the payload
        assert store.list_latest(ROUTE).guarded_ids() == []


def test_a_migration_stopped_between_two_versions_resumes_at_the_next_open(tmp_path, monkeypatch):
    """Each version's step is its own transaction: a process killed in the last leaves the
    file at the version before, complete, and the next open finishes the migration."""
    path = tmp_path / "c.db"
    items, history = version_1_store(path)

    def killed(conn: sqlite3.Connection) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(_sqlite_schema, "_version_3_to_4", killed)
    with pytest.raises(KeyboardInterrupt):
        SQLiteCheckpointStore(path)
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == 3
    monkeypatch.undo()
    with SQLiteCheckpointStore(path) as store:
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == 5
        assert store.list_latest(ROUTE) == items
        assert store.history(ROUTE) == history
        assert store.list_latest(ROUTE).guarded_ids() == ["p-b"]


def test_a_version_1_store_with_a_payload_sqlite_cannot_read_is_left_as_it_was(tmp_path):
    path = tmp_path / "c.db"
    with SQLiteCheckpointStore(path) as store:
        store.upsert(checkpoint("p-a"))
    make_version_1(path)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("UPDATE checkpoint_latest SET payload = '{broken'")
    before = path.read_bytes()
    with pytest.raises(CheckpointStoreCorrupt):
        SQLiteCheckpointStore(path)
    assert path.read_bytes() == before


def test_too_old_an_sqlite_is_refused_with_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(sqlite_store.sqlite3, "sqlite_version_info", (3, 31, 1))
    with pytest.raises(CheckpointStoreUnavailable) as info:
        SQLiteCheckpointStore(tmp_path / "c.db")
    assert "3.38" in str(info.value)
    assert not (tmp_path / "c.db").exists()
