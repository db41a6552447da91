"""Both durable checkpoint stores, SQLite and PostgreSQL: reopening, damaged rows and
failed writes."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
from helpers.postgres_server import PostgresLocation
from helpers.stores import OTHER_ROUTE, ROUTE, make_checkpoint, postgres_raw, sqlite_raw

from dpone_native_transfer.checkpoints import RouteKey, checkpoint_to_payload
from dpone_native_transfer.errors import CheckpointPayloadInvalid, CheckpointStoreCorrupt
from dpone_native_transfer.stores.postgres import PostgresCheckpointStore
from dpone_native_transfer.stores.sqlite import SQLiteCheckpointStore


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
    postgres_raw(
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
                execute=lambda *statements: sqlite_raw(db_path, *statements),
                fail_inserts=lambda table, condition: sqlite_raw(
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
            execute=lambda *statements: postgres_raw(location, *statements),
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
