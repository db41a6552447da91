"""The PostgreSQL checkpoint store's own behaviour: schema creation, closed transactions,
damaged schemas, errors that name no secret, lost connections and concurrent writers.

The server is the tests' (``helpers.postgres_server``); without one these tests fail.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
import pytest
from helpers import postgres_server
from helpers.postgres_server import PostgresLocation, free_port
from helpers.stores import ROUTE, make_checkpoint, postgres_raw

from dpone_native_transfer.checkpoints import RouteKey, Strategy
from dpone_native_transfer.errors import (
    CheckpointStoreAccessRefused,
    CheckpointStoreCorrupt,
    CheckpointStoreUnavailable,
    ConfigInvalid,
)
from dpone_native_transfer.reporting import EXIT_CONFIG, exit_code_for
from dpone_native_transfer.stores.postgres import PostgresCheckpointStore

CANARY_PASSWORD = "canary-pw-5f2c9e"  # must never appear in an error


@pytest.fixture
def pg(postgres_schema: PostgresLocation) -> Iterator[PostgresCheckpointStore]:
    with PostgresCheckpointStore(postgres_schema.dsn, schema=postgres_schema.schema) as store:
        yield store


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
    assert meta == [("schema_version", "3")]


def test_postgres_every_call_is_a_closed_transaction(pg: PostgresCheckpointStore) -> None:
    """Autocommit is off, yet no call leaves a transaction open (it would hold locks)."""
    assert pg._conn.autocommit is False
    pg.upsert(make_checkpoint("p-a"))
    pg.list_latest(ROUTE)
    pg.list_routes()
    assert pg._conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


_LATEST = {"table": "checkpoint_latest"}
DAMAGED_SCHEMAS: dict[str, tuple[str, dict[str, Any]]] = {
    "version-7": ("UPDATE meta SET value = '7'", {"schema_version": 7, "expected": 3}),
    "version-garbage": ("UPDATE meta SET value = 'one'", {"schema_version": None, "expected": 3}),
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
    postgres_raw(postgres_schema, statement)
    assert _pg_open_fails(postgres_schema).diagnostics == diagnostics


def test_postgres_schema_with_foreign_tables_only_is_used(
    postgres_schema: PostgresLocation,
) -> None:
    """A shared schema may hold other tables; ours are created beside them."""
    postgres_raw(
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


def test_postgres_wrong_password_is_refused_without_secrets(
    postgres_schema: PostgresLocation,
) -> None:
    """The same code, exit 2 (fix the DSN): the message names the class, not the driver's text."""
    bad = _dsn_with(postgres_schema.dsn, password=CANARY_PASSWORD)
    with pytest.raises(CheckpointStoreAccessRefused) as excinfo:
        PostgresCheckpointStore(bad, schema=postgres_schema.schema)
    params = psycopg.conninfo.conninfo_to_dict(postgres_schema.dsn)
    _assert_secret_free(
        excinfo.value, CANARY_PASSWORD, bad, params["host"], params["user"], "FATAL", "for user"
    )
    assert "the server refused the login: authentication failed" in str(excinfo.value)
    assert exit_code_for(excinfo.value) == EXIT_CONFIG
    assert excinfo.value.diagnostics == {
        "action": "opened",
        "error_type": "OperationalError",
        "failure": "login_refused",
        "sqlstate": "28P01",
    }


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
    postgres_raw(postgres_schema, ("SELECT pg_terminate_backend(%s)", (pid,)))
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
    postgres_raw(postgres_schema, "ANALYZE checkpoint_latest")
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


def test_postgres_a_writer_stopped_inside_its_transaction_is_ended_and_the_next_goes_on(
    postgres_schema: PostgresLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store session stopped inside its write (SIGSTOP; here: a transaction left open on
    the store's own connection) held its route's lock until it resumed or died, and every
    later write waited ``LOCK_WAIT_SECONDS`` and failed (a hostile check). The server ends
    it once idle ``IDLE_SECONDS``, rolled back: the waiting write goes on, and
    the stopped store, resumed, is unavailable and wrote nothing."""
    from dpone_native_transfer.stores import postgres as module
    from dpone_native_transfer.stores._codec import route_params

    monkeypatch.setattr(module, "IDLE_SECONDS", 0.5)
    monkeypatch.setattr(module, "LOCK_WAIT_SECONDS", 20.0)
    key = module._lock_key("route", postgres_schema.schema, *route_params(ROUTE))
    location = {"schema": postgres_schema.schema}
    with PostgresCheckpointStore(postgres_schema.dsn, **location) as stopped:
        stopped.list_latest(ROUTE)  # opened
        stopped._conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))  # held, then idle
        with PostgresCheckpointStore(postgres_schema.dsn, **location) as store:
            store.upsert_many([make_checkpoint("p-a", run_id="went-on")])
            assert [cp.run_id for cp in store.list_latest(ROUTE)] == ["went-on"]
        with pytest.raises(CheckpointStoreUnavailable):
            stopped.upsert_many([make_checkpoint("p-a", run_id="stopped")])
    with PostgresCheckpointStore(postgres_schema.dsn, **location) as store:
        assert [cp.run_id for cp in store.list_latest(ROUTE)] == ["went-on"]


def test_postgres_a_write_kept_waiting_by_a_stopped_writer_fails_unavailable_unwritten(
    postgres_schema: PostgresLocation, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer stopped inside its transaction (SIGSTOP, a frozen VM) holds its route's lock:
    the next write of that route waits ``LOCK_WAIT_SECONDS`` at most, as SQLite's busy
    timeout does, then fails ``CheckpointStoreUnavailable`` with nothing written."""
    from dpone_native_transfer.stores import postgres as module
    from dpone_native_transfer.stores._codec import route_params

    monkeypatch.setattr(module, "LOCK_WAIT_SECONDS", 0.5)
    key = module._lock_key("route", postgres_schema.schema, *route_params(ROUTE))
    with PostgresCheckpointStore(postgres_schema.dsn, schema=postgres_schema.schema) as store:
        with psycopg.connect(postgres_schema.dsn) as stopped:
            stopped.execute("SELECT pg_advisory_xact_lock(%s)", (key,))  # held, uncommitted
            with pytest.raises(CheckpointStoreUnavailable) as caught:
                store.upsert_many([make_checkpoint("p-a", run_id="kept-waiting")])
            assert caught.value.diagnostics["sqlstate"] == "55P03"  # lock_not_available
            assert store.list_latest(ROUTE) == []
        store.upsert_many([make_checkpoint("p-a", run_id="after")])  # the lock is gone
        assert [cp.run_id for cp in store.list_latest(ROUTE)] == ["after"]
