"""Checkpoint, route-state and operator-audit store on a shared PostgreSQL server (psycopg 3).

For Airflow workers on many machines that share one store. The tables, the
validation and the ordering rules are those of ``SQLiteCheckpointStore``; the
encoding and decoding helpers are the very same functions.

Payloads and records are TEXT holding the JSON the codec wrote, not JSONB.
TEXT gives back exactly the bytes that were written, so a payload round-trips
byte for byte, a corrupt value is detected by the same JSON check as in
SQLite, and nothing depends on how JSONB would re-order keys, rewrite numbers
or reject ``\\u0000``. No query looks inside a payload, so JSONB would buy nothing.

The schema (``dpone`` unless told otherwise) is created on first use, complete
or not at all, in one transaction that holds a transaction-level advisory
lock, so workers that start together cannot race. Its ``meta`` table holds the
schema version. A schema with our tables but no version, an unknown version, or
a table with unexpected columns is reported as corrupt, never silently reused.
Key columns use the ``"C"`` collation so that ordering is by code point, as in
SQLite and in Python, whatever the database's locale.

Each store object holds one connection, autocommit off, and runs every call in
its own explicit transaction. Every write also takes an advisory lock on its
route, so writes to one route are serialised as SQLite serialises all writes:
history order is commit order and evidence order is well defined. That orders
single writes only; it does not stop two workers running one route (see
``docs/compatibility.md``). A connection that breaks is not re-opened: the
call raises ``CheckpointStoreUnavailable`` and the caller opens a new store.
Like the SQLite store, one store object serves one thread at a time.

Errors raised here never carry the DSN, host, user, password or the driver's
message text; diagnostics hold at most the SQLSTATE and the driver's error class.
PostgreSQL text cannot hold NUL, so a route key or partition id containing one
is refused by the driver before anything is written.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ..checkpoints import PartitionCheckpoint, RouteKey
from ..errors import (
    CheckpointStoreCorrupt,
    CheckpointStoreUnavailable,
    ConfigInvalid,
    NativeTransferError,
)
from .memory import (
    _check_run_id,
    _encode_batch,
    _encode_object,
    _encode_resolution,
    _route_params,
)
from .sqlite import RecordReads, _decode_checkpoint, _load_object, _table_corrupt

__all__ = ["CONNECT_TIMEOUT_SECONDS", "SCHEMA_VERSION", "PostgresCheckpointStore"]

SCHEMA_VERSION = 1
CONNECT_TIMEOUT_SECONDS = 10  # used when the DSN sets no connect_timeout (libpq waits forever)

_T = TypeVar("_T")

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_KEY = 'TEXT COLLATE "C" NOT NULL'
_ROUTE_COLUMNS = f"source_table {_KEY}, target_table {_KEY}, strategy {_KEY}"
_ROUTE_KEY = "source_table, target_table, strategy"
_ROUTE = "source_table = %s AND target_table = %s AND strategy = %s"


def _schema_statements(s: str) -> tuple[str, ...]:
    """DDL of schema version 1; ``s`` is the quoted schema name."""
    return (
        f"CREATE SCHEMA IF NOT EXISTS {s}",
        f"CREATE TABLE {s}.meta (key {_KEY} PRIMARY KEY, value TEXT NOT NULL)",
        f"""CREATE TABLE {s}.checkpoint_history (
            seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, {_ROUTE_COLUMNS},
            partition_id {_KEY}, payload TEXT NOT NULL)""",
        f"CREATE INDEX checkpoint_history_by_route ON {s}.checkpoint_history ({_ROUTE_KEY}, seq)",
        f"""CREATE TABLE {s}.checkpoint_latest (
            {_ROUTE_COLUMNS}, partition_id {_KEY}, seq BIGINT NOT NULL, payload TEXT NOT NULL,
            PRIMARY KEY ({_ROUTE_KEY}, partition_id))""",
        f"""CREATE TABLE {s}.source_state (
            {_ROUTE_COLUMNS}, state TEXT NOT NULL, PRIMARY KEY ({_ROUTE_KEY}))""",
        f"""CREATE TABLE {s}.evidence (
            {_ROUTE_COLUMNS}, run_id {_KEY}, seq BIGINT NOT NULL, record TEXT NOT NULL,
            PRIMARY KEY ({_ROUTE_KEY}, run_id))""",
        f"CREATE INDEX evidence_by_route ON {s}.evidence ({_ROUTE_KEY}, seq)",
        f"""CREATE TABLE {s}.audit (
            audit_id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, {_ROUTE_COLUMNS},
            record TEXT NOT NULL)""",
        f"CREATE INDEX audit_by_route ON {s}.audit ({_ROUTE_KEY}, audit_id)",
    )


# "name type[ collate C]" of every column, in order, as information_schema reports them.
_C_ROUTE = ("source_table text C", "target_table text C", "strategy text C")
_TABLES = {
    "meta": ("key text C", "value text"),
    "checkpoint_history": ("seq bigint", *_C_ROUTE, "partition_id text C", "payload text"),
    "checkpoint_latest": (*_C_ROUTE, "partition_id text C", "seq bigint", "payload text"),
    "source_state": (*_C_ROUTE, "state text"),
    "evidence": (*_C_ROUTE, "run_id text C", "seq bigint", "record text"),
    "audit": ("audit_id bigint", *_C_ROUTE, "record text"),
}
_COLUMNS = """SELECT table_name, concat_ws(' ', column_name, data_type, collation_name)
    FROM information_schema.columns WHERE table_schema = %s ORDER BY table_name, ordinal_position"""

# SQLSTATE classes that mean "cannot reach or may not use the server", not "bad data":
# connection exception, invalid authorization, insufficient privilege.
_UNAVAILABLE_SQLSTATES = ("08", "28", "42501")


def _driver() -> Any:
    """psycopg, imported only when a PostgreSQL store is opened (it is an optional extra)."""
    try:
        import psycopg
    except ImportError:
        raise ConfigInvalid(
            "PostgresCheckpointStore needs the psycopg driver: "
            "pip install 'dpone-native-transfer[postgres]'",
            diagnostics={"key": "driver"},
        ) from None
    return psycopg


def _lock_key(*parts: str) -> int:
    """A signed 64-bit advisory-lock key; stable across processes, unlike ``hash``."""
    text = json.dumps(["dpone_native_transfer", *parts])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big", signed=True)


def _store_error(driver: Any, exc: Any, action: str) -> NativeTransferError | None:
    """The store error for a driver error, built from its SQLSTATE and class name only.

    None for a client-side misuse (no SQLSTATE), which propagates unchanged as it does in SQLite.
    """
    sqlstate = exc.sqlstate
    diagnostics = {"action": action, "error_type": type(exc).__name__}
    if sqlstate:
        diagnostics["sqlstate"] = sqlstate
    if isinstance(exc, driver.OperationalError) or (sqlstate or "").startswith(
        _UNAVAILABLE_SQLSTATES
    ):
        return CheckpointStoreUnavailable(
            f"checkpoint store cannot be {action}: the PostgreSQL server is unreachable, "
            "refused the connection or its credentials, or the connection was lost",
            diagnostics=diagnostics,
        )
    if sqlstate is None:
        return None
    return CheckpointStoreCorrupt(f"checkpoint store cannot be {action}", diagnostics=diagnostics)


def _attempt(driver: Any, action: str, work: Callable[[], _T]) -> _T:
    """``work()``, with driver errors translated; raised outside ``except`` so none is chained."""
    try:
        return work()
    except driver.Error as exc:
        error = _store_error(driver, exc, action)
        if error is None:
            raise
    raise error


def _in_transaction(driver: Any, action: str, conn: Any, work: Callable[[Any], _T]) -> _T:
    def run() -> _T:
        with conn.transaction():
            return work(conn)

    return _attempt(driver, action, run)


def _connect(driver: Any, dsn: str) -> Any:
    if not isinstance(dsn, str):
        raise ConfigInvalid("the PostgreSQL DSN must be a string", diagnostics={"key": "dsn"})
    try:
        params = driver.conninfo.conninfo_to_dict(dsn)
    except driver.Error:
        params = None
    if params is None:  # the parser's message quotes the DSN, so it is dropped
        raise ConfigInvalid("the PostgreSQL DSN cannot be parsed", diagnostics={"key": "dsn"})
    extra = {} if "connect_timeout" in params else {"connect_timeout": CONNECT_TIMEOUT_SECONDS}
    return _attempt(driver, "opened", lambda: driver.connect(dsn, autocommit=False, **extra))


def _prepare_schema(conn: Any, schema: str) -> None:
    """Create the schema if it has no tables of ours, else check it; the caller commits."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key("schema", schema),))
    found: dict[str, tuple[str, ...]] = {}
    for table, column in conn.execute(_COLUMNS, (schema,)):
        found[table] = (*found.get(table, ()), column)
    s = f'"{schema}"'
    if "meta" not in found:
        if found.keys() & _TABLES.keys():
            raise CheckpointStoreCorrupt("schema holds checkpoint tables but no schema version")
        for statement in _schema_statements(s):
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO {s}.meta (key, value) VALUES ('schema_version', %s)",
            (str(SCHEMA_VERSION),),
        )
        return
    if found["meta"] != _TABLES["meta"]:
        raise _table_corrupt("meta")
    row = conn.execute(f"SELECT value FROM {s}.meta WHERE key = 'schema_version'").fetchone()
    if row is None:
        raise CheckpointStoreCorrupt("schema is not a checkpoint store (no schema version)")
    if row[0] != str(SCHEMA_VERSION):
        version = int(row[0]) if row[0].isdigit() else None
        raise CheckpointStoreCorrupt(
            f"checkpoint store has an unknown schema version, expected {SCHEMA_VERSION}",
            diagnostics={"schema_version": version, "expected": SCHEMA_VERSION},
        )
    for table, columns in _TABLES.items():
        if found.get(table) != columns:
            raise _table_corrupt(table)


class PostgresCheckpointStore(RecordReads):
    """Checkpoints (latest and full history), source state, evidence and audit in one schema.

    Behaves like ``SQLiteCheckpointStore``: ``upsert_many`` is one transaction,
    ``list_latest`` is one primary-key range read, and re-recording evidence for
    a run id replaces the record but keeps its place.
    """

    def __init__(self, dsn: str, *, schema: str = "dpone") -> None:
        self._conn: Any = None
        if not isinstance(schema, str) or not _SCHEMA_NAME.fullmatch(schema):
            raise ConfigInvalid(
                "schema must be a lowercase PostgreSQL identifier (a-z, 0-9, _)",
                diagnostics={"key": "schema"},
            )
        self._driver = _driver()
        self._schema = schema
        self._s = f'"{schema}"'
        conn = _connect(self._driver, dsn)
        try:
            _in_transaction(self._driver, "opened", conn, lambda c: _prepare_schema(c, schema))
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> PostgresCheckpointStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _transaction(self, action: str, work: Callable[[Any], _T]) -> _T:
        """``work(conn)`` in one transaction, committed or rolled back as a whole."""
        if self._conn is None:
            raise ValueError("checkpoint store is closed")
        return _in_transaction(self._driver, action, self._conn, work)

    _route_filter = _ROUTE

    def _table(self, name: str) -> str:
        return f"{self._s}.{name}"

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        return self._transaction("read", lambda conn: conn.execute(sql, params).fetchall())

    def _lock_routes(self, conn: Any, routes: Iterable[tuple[str, str, str]]) -> None:
        """Serialise writes per route; keys in sorted order, so two batches cannot deadlock."""
        for key in sorted({_lock_key("route", self._schema, *route) for route in routes}):
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))

    def _insert_checkpoints(self, conn: Any, rows: list[tuple[str, ...]]) -> None:
        """History rows, then the latest pointers, in order; the caller commits.

        One ``executemany`` appends the history rows (pipelined, returning each
        ``seq``); one statement then upserts the latest pointers. Where the batch
        holds a partition more than once, only its last row is upserted (one
        statement may not update a row twice), so the later item wins as before.
        """
        if not rows:
            return
        self._lock_routes(conn, (row[:3] for row in rows))
        s = self._s
        with conn.cursor() as cursor:
            cursor.executemany(
                f"INSERT INTO {s}.checkpoint_history ({_ROUTE_KEY}, partition_id, payload)"
                " VALUES (%s, %s, %s, %s, %s) RETURNING seq",
                rows,
                returning=True,
            )
            seqs = []
            while True:
                seqs.append(cursor.fetchone()[0])
                if not cursor.nextset():
                    break
            latest = {row[:4]: (*row[:4], seq, row[4]) for row, seq in zip(rows, seqs, strict=True)}
            columns = list(zip(*latest.values(), strict=True))
            cursor.execute(
                f"INSERT INTO {s}.checkpoint_latest ({_ROUTE_KEY}, partition_id, seq, payload)"
                " SELECT * FROM unnest(%s::text[], %s::text[], %s::text[], %s::text[],"
                " %s::bigint[], %s::text[])"
                f" ON CONFLICT ({_ROUTE_KEY}, partition_id)"
                " DO UPDATE SET seq = excluded.seq, payload = excluded.payload",
                [list(column) for column in columns],
            )

    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        self.upsert_many([checkpoint])

    def upsert_many(self, checkpoints: Iterable[PartitionCheckpoint]) -> None:
        rows = _encode_batch(checkpoints)
        if not rows:
            return
        self._transaction("written", lambda conn: self._insert_checkpoints(conn, rows))

    def list_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        return self._checkpoints("checkpoint_latest", "partition_id", route)

    def history(self, route: RouteKey) -> list[PartitionCheckpoint]:
        """Every checkpoint written for ``route``, oldest first."""
        return self._checkpoints("checkpoint_history", "seq", route)

    def _checkpoints(self, table: str, order: str, route: RouteKey) -> list[PartitionCheckpoint]:
        """One range read of ``route`` on the table's (route, ``order``) index, decoded."""
        rows = self._read(
            f"SELECT partition_id, seq, payload FROM {self._s}.{table} WHERE {_ROUTE}"
            f" ORDER BY {order}",
            _route_params(route),
        )
        return [_decode_checkpoint(route, *row) for row in rows]

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        rows = self._read(
            f"SELECT state FROM {self._s}.source_state WHERE {_ROUTE}", _route_params(route)
        )
        if not rows:
            return None
        return _load_object(rows[0][0], "stored source state", {"route": route.as_dict()})

    def save_source_state(self, route: RouteKey, state: dict[str, Any]) -> None:
        text = _encode_object(state, "source state")
        params = _route_params(route)

        def write(conn: Any) -> None:
            self._lock_routes(conn, [params])
            conn.execute(
                f"INSERT INTO {self._s}.source_state ({_ROUTE_KEY}, state) VALUES (%s, %s, %s, %s)"
                f" ON CONFLICT ({_ROUTE_KEY}) DO UPDATE SET state = excluded.state",
                (*params, text),
            )

        self._transaction("written", write)

    def record_evidence(self, route: RouteKey, run_id: str, record: dict[str, Any]) -> None:
        _check_run_id(run_id)
        text = _encode_object(record, "evidence record")
        params = _route_params(route)
        s = self._s

        def write(conn: Any) -> None:
            self._lock_routes(conn, [params])
            conn.execute(
                f"INSERT INTO {s}.evidence ({_ROUTE_KEY}, run_id, seq, record)"
                f" VALUES (%s, %s, %s, %s,"
                f" (SELECT COALESCE(MAX(seq), 0) + 1 FROM {s}.evidence WHERE {_ROUTE}), %s)"
                f" ON CONFLICT ({_ROUTE_KEY}, run_id) DO UPDATE SET record = excluded.record",
                (*params, run_id, *params, text),
            )

        self._transaction("written", write)

    def apply_resolution(
        self, route: RouteKey, checkpoints: Sequence[PartitionCheckpoint], audit: dict[str, Any]
    ) -> int:
        """One transaction: the checkpoints and the audit record commit together or not at all."""
        rows, record = _encode_resolution(route, checkpoints, audit)

        def write(conn: Any) -> int:
            self._insert_checkpoints(conn, rows)
            return conn.execute(
                f"INSERT INTO {self._s}.audit ({_ROUTE_KEY}, record) VALUES (%s, %s, %s, %s)"
                " RETURNING audit_id",
                (*_route_params(route), record),
            ).fetchone()[0]

        return self._transaction("written", write)
