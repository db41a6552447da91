"""Durable checkpoint, route-state and operator-audit store in one SQLite file (stdlib only).

A store file is created complete or not at all: the schema is built in a
private file that is then linked into place. So any existing file that is not
a store (empty, truncated, foreign, garbage) is reported as corrupt
rather than silently used as a new, empty store, which would let a retry
append data that was already committed.

The ``audit`` table (operator resolutions) is an additive part of schema
version 1, so ``user_version`` stays 1: a v1 file written before the table
existed gets it, empty, the first time it is opened, and older releases that
do not know the table still open the file (they check only their own tables).
A present ``audit`` table with unexpected columns is corrupt, like any other.

Version 2 adds summary columns to ``checkpoint_latest`` (status, hashes and
guard text, set by the writer from each checkpoint and by triggers from the
payload for any other writer) and an index over them, so a run's route scan
reads no payload it does not act on; see ``latest.py``.
Opening a version-1 file migrates it in one transaction. Older releases refuse
a version-2 file ("unknown schema version"), which is the safe outcome: a
mixed-version fleet is unsafe anyway (drain old workers first).

Errors raised here never carry the file path (paths may be secret) or
SQLite's own message text.
"""

from __future__ import annotations

import json
import os
import sqlite3
import tempfile
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.request import pathname2url

from ..checkpoints import (
    GUARD_DIAGNOSTICS_KEY,
    PartitionCheckpoint,
    RouteKey,
    checkpoint_from_payload,
)
from ..errors import CheckpointPayloadInvalid, CheckpointStoreCorrupt, CheckpointStoreUnavailable
from ..latest import LatestCheckpoints, guard_json
from .memory import (
    _check_run_id,
    _encode_batch,
    _encode_object,
    _encode_resolution,
    _route_params,
)

__all__ = ["BUSY_TIMEOUT_SECONDS", "SCHEMA_VERSION", "RecordReads", "SQLiteCheckpointStore"]

SCHEMA_VERSION = 2
BUSY_TIMEOUT_SECONDS = 30.0
# Page cache of the store's connection; it grows only as pages are used. A batch of
# 10,000 checkpoints touches about 15 MiB of pages; with SQLite's default 2 MiB they are
# evicted and read back within the batch (arm + commit of 10,000: 0.89 s -> 0.75 s).
_CACHE_KIB = 16_384

_ROUTE = "source_table = ? AND target_table = ? AND strategy = ?"
_ROUTE_COLUMNS = "source_table TEXT NOT NULL, target_table TEXT NOT NULL, strategy TEXT NOT NULL"
_ROUTE_KEY = "source_table, target_table, strategy"

# What the route scan and the planner read instead of payloads (``latest.py``): SQL over
# the payload, kept current by the writer and, for any other writer, by triggers.
_SUMMARY = (
    ("status", "{p} ->> '$.status'"),
    ("query_hash", "{p} ->> '$.query_hash'"),
    ("schema_hash", "{p} ->> '$.schema_hash'"),
    ("guard", "{p} -> '$.diagnostics." + GUARD_DIAGNOSTICS_KEY + "'"),
)
_SUMMARY_NAMES = tuple(name for name, _ in _SUMMARY)


def _summary_of(payload: str) -> list[str]:
    return [sql.format(p=payload) for _, sql in _SUMMARY]


# The store's writer sets the summary from each checkpoint. These triggers cover any other
# writer: a row inserted without a summary, or a row changed in place (the store's own
# writes always move ``seq`` to a new history row), gets its summary from the payload.
_SUMMARY_FROM_PAYLOAD = ", ".join(
    f"{column} = {sql}"
    for column, sql in zip(_SUMMARY_NAMES, _summary_of("NEW.payload"), strict=True)
)
_SUMMARY_TRIGGERS = tuple(
    f"""CREATE TRIGGER checkpoint_latest_summary_{name} AFTER {event} ON checkpoint_latest
        WHEN {when}
        BEGIN UPDATE checkpoint_latest SET {_SUMMARY_FROM_PAYLOAD} WHERE rowid = NEW.rowid; END"""
    for name, event, when in (
        ("on_insert", "INSERT", " AND ".join(f"NEW.{c} IS NULL" for c in _SUMMARY_NAMES)),
        ("on_update", f"UPDATE OF payload, {', '.join(_SUMMARY_NAMES)}", "NEW.seq IS OLD.seq"),
    )
)
# A rowid table: an upsert writes its row (about 1 KB) once and two small index entries;
# WITHOUT ROWID would keep whole rows in the key's B-tree and write about twice as much.
_LATEST_TABLE = f"""CREATE TABLE {{name}} (
    {_ROUTE_COLUMNS}, partition_id TEXT NOT NULL, seq INTEGER NOT NULL, payload TEXT NOT NULL,
    {", ".join(f"{name} TEXT" for name in _SUMMARY_NAMES)})"""
_LATEST_UPKEEP = (
    "CREATE UNIQUE INDEX checkpoint_latest_by_partition"
    f" ON checkpoint_latest ({_ROUTE_KEY}, partition_id)",
    # the route scan's index: guard groups, each in partition order, without the rows
    "CREATE INDEX checkpoint_latest_by_guard"
    f" ON checkpoint_latest ({_ROUTE_KEY}, guard, status, partition_id)",
    *_SUMMARY_TRIGGERS,
)
_MINIMUM_SQLITE = (3, 38, 0)  # the ->> and -> JSON operators

_SCHEMA = (
    f"""CREATE TABLE checkpoint_history (
        seq INTEGER PRIMARY KEY AUTOINCREMENT, {_ROUTE_COLUMNS},
        partition_id TEXT NOT NULL, payload TEXT NOT NULL)""",
    f"CREATE INDEX checkpoint_history_by_route ON checkpoint_history ({_ROUTE_KEY}, seq)",
    _LATEST_TABLE.format(name="checkpoint_latest"),
    *_LATEST_UPKEEP,
    f"""CREATE TABLE source_state (
        {_ROUTE_COLUMNS}, state TEXT NOT NULL,
        PRIMARY KEY ({_ROUTE_KEY})) WITHOUT ROWID""",
    f"""CREATE TABLE evidence (
        {_ROUTE_COLUMNS}, run_id TEXT NOT NULL,
        seq INTEGER NOT NULL, record TEXT NOT NULL,
        PRIMARY KEY ({_ROUTE_KEY}, run_id)) WITHOUT ROWID""",
    f"CREATE INDEX evidence_by_route ON evidence ({_ROUTE_KEY}, seq)",
)

# Additive to version 1: created by _initialise for new files and by _open for older v1 files.
_AUDIT_SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS audit (
        audit_id INTEGER PRIMARY KEY AUTOINCREMENT, {_ROUTE_COLUMNS}, record TEXT NOT NULL)""",
    f"CREATE INDEX IF NOT EXISTS audit_by_route ON audit ({_ROUTE_KEY}, audit_id)",
)

_ROUTE_NAMES = ("source_table", "target_table", "strategy")
_TABLES = {
    "checkpoint_history": ("seq", *_ROUTE_NAMES, "partition_id", "payload"),
    "checkpoint_latest": (*_ROUTE_NAMES, "partition_id", "seq", "payload", *_SUMMARY_NAMES),
    "source_state": (*_ROUTE_NAMES, "state"),
    "evidence": (*_ROUTE_NAMES, "run_id", "seq", "record"),
}
_VERSION_1_TABLES = {
    **_TABLES,
    "checkpoint_latest": (*_ROUTE_NAMES, "partition_id", "seq", "payload"),
}
_AUDIT_COLUMNS = ("audit_id", *_ROUTE_NAMES, "record")


def _is_busy(exc: sqlite3.DatabaseError) -> bool:
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    return code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction, rolled back on any failure."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextmanager
def _translated(action: str, *, writing: bool = False) -> Iterator[None]:
    """SQLite failures become CheckpointStoreCorrupt, except busy/locked and write-side I/O."""
    try:
        yield
    except sqlite3.ProgrammingError:
        raise
    except sqlite3.DatabaseError as exc:
        if _is_busy(exc) or (writing and isinstance(exc, sqlite3.OperationalError)):
            raise
        raise CheckpointStoreCorrupt(f"checkpoint store cannot be {action}") from None


def _fsync_directory(directory: str) -> None:
    if not hasattr(os, "O_DIRECTORY"):
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _initialise(path: str) -> None:
    """Build a complete store in a private file and link it to ``path`` (a no-op if taken)."""
    directory = os.path.dirname(path)
    fd, scratch = tempfile.mkstemp(dir=directory, prefix=".checkpoints-", suffix=".init")
    os.close(fd)
    try:
        conn = sqlite3.connect(scratch, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            with _immediate(conn):
                for statement in (*_SCHEMA, *_AUDIT_SCHEMA):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        finally:
            conn.close()
        try:
            os.link(scratch, path)
        except FileExistsError:
            return
        _fsync_directory(directory)
    finally:
        os.unlink(scratch)


def _columns(conn: sqlite3.Connection, table: str) -> tuple[str, ...]:
    return tuple(row[1] for row in conn.execute(f"PRAGMA table_info({table})"))


def _table_corrupt(table: str) -> CheckpointStoreCorrupt:
    return CheckpointStoreCorrupt(
        f"checkpoint store table {table!r} is missing or has unexpected columns",
        diagnostics={"table": table},
    )


def _check_schema(conn: sqlite3.Connection) -> None:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == 0:
        raise CheckpointStoreCorrupt("file is not a checkpoint store (no schema version)")
    if version != SCHEMA_VERSION:
        raise CheckpointStoreCorrupt(
            f"checkpoint store has unknown schema version {version}, expected {SCHEMA_VERSION}",
            diagnostics={"user_version": version, "expected": SCHEMA_VERSION},
        )
    _check_tables(conn, _TABLES)


def _check_tables(conn: sqlite3.Connection, tables: dict[str, tuple[str, ...]]) -> None:
    for table, columns in tables.items():
        if _columns(conn, table) != columns:
            raise _table_corrupt(table)


def _migrate_from_version_1(conn: sqlite3.Connection) -> None:
    """Rebuild ``checkpoint_latest`` as version 2 has it, in one write transaction.

    The version is read again inside the transaction: another process may
    have migrated first. A payload SQLite cannot read as JSON fails the whole
    migration, and the file stays as it was.
    """
    if conn.execute("PRAGMA user_version").fetchone()[0] != 1:
        return
    with _immediate(conn):
        if conn.execute("PRAGMA user_version").fetchone()[0] != 1:
            return
        _check_tables(conn, _VERSION_1_TABLES)
        conn.execute("ALTER TABLE checkpoint_latest RENAME TO checkpoint_latest_v1")
        conn.execute(_LATEST_TABLE.format(name="checkpoint_latest"))
        conn.execute(
            f"INSERT INTO checkpoint_latest ({_ROUTE_KEY}, partition_id, seq, payload,"
            f" {', '.join(_SUMMARY_NAMES)}) SELECT {_ROUTE_KEY}, partition_id, seq, payload,"
            f" {', '.join(_summary_of('payload'))} FROM checkpoint_latest_v1"
        )
        conn.execute("DROP TABLE checkpoint_latest_v1")
        for statement in _LATEST_UPKEEP:
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _check_summary_upkeep(conn: sqlite3.Connection) -> None:
    """The indexes and triggers of ``checkpoint_latest`` must all be there."""
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
    if not {_upkeep_name(statement) for statement in _LATEST_UPKEEP} <= names:
        raise _table_corrupt("checkpoint_latest")


def _upkeep_name(statement: str) -> str:
    """The object a CREATE INDEX or CREATE TRIGGER statement makes."""
    words = statement.split()
    return words[words.index("INDEX" if "INDEX" in words[:3] else "TRIGGER") + 1]


def _require_sqlite() -> None:
    if sqlite3.sqlite_version_info < _MINIMUM_SQLITE:
        raise CheckpointStoreUnavailable(
            "the SQLite checkpoint store needs SQLite "
            f"{'.'.join(map(str, _MINIMUM_SQLITE))} or newer; "
            f"this Python has {sqlite3.sqlite_version}",
            diagnostics={"sqlite_version": sqlite3.sqlite_version},
        )


def _ensure_audit_table(conn: sqlite3.Connection) -> None:
    """Give a v1 file from before the audit table an empty one; refuse a foreign one."""
    found = _columns(conn, "audit")
    if found == _AUDIT_COLUMNS:
        return
    if found:
        raise _table_corrupt("audit")
    with _immediate(conn):
        for statement in _AUDIT_SCHEMA:
            conn.execute(statement)


def _refuse_partial_pages(conn: sqlite3.Connection, path: str) -> None:
    """A database file is whole pages; SQLite would read a cut last page as zeros and go on."""
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    if os.path.getsize(path) % page_size:
        raise CheckpointStoreCorrupt("the checkpoint store file is truncated")


def _open(path: str) -> sqlite3.Connection:
    uri = f"file:{pathname2url(path)}?mode=rw"
    with _translated("opened"):
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_SECONDS, isolation_level=None)
    try:
        with _translated("opened"):
            _refuse_partial_pages(conn, path)
            _migrate_from_version_1(conn)
            _check_schema(conn)
            _check_summary_upkeep(conn)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
            _ensure_audit_table(conn)
    except BaseException:
        conn.close()
        raise
    return conn


def _loads(text: Any, what: str, where: dict[str, Any]) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError, RecursionError):
        raise CheckpointStoreCorrupt(f"{what} is not valid JSON", diagnostics=where) from None


def _load_object(text: Any, what: str, where: dict[str, Any]) -> dict[str, Any]:
    value = _loads(text, what, where)
    if not isinstance(value, dict):
        raise CheckpointStoreCorrupt(f"{what} is not a JSON object", diagnostics=where)
    return value


def _decode_checkpoint(
    route: RouteKey, partition_id: Any, seq: Any, text: Any
) -> PartitionCheckpoint:
    where = {"route": route.as_dict(), "partition_id": partition_id, "seq": seq}
    payload = _loads(text, "stored checkpoint payload", where)
    try:
        # json.loads output is private to this call: no copies, and the route is the caller's.
        checkpoint = checkpoint_from_payload(payload, copy_values=False, known_route=route)
    except CheckpointPayloadInvalid as exc:
        for key, value in where.items():
            exc.diagnostics.setdefault(key, value)
        raise
    if checkpoint.route != route or checkpoint.partition_id != partition_id:
        raise CheckpointStoreCorrupt(
            "stored checkpoint payload disagrees with the route or partition it is filed under",
            diagnostics=where,
        )
    return checkpoint


class RecordReads:
    """The reads both SQL stores share: evidence, audit records and the list of routes.

    A store provides ``_read(sql, params)``, ``_table(name)`` (the table's
    name as its SQL needs it) and ``_route_filter`` (its route condition).
    """

    _route_filter = _ROUTE

    def _table(self, name: str) -> str:
        return name

    def list_evidence(self, route: RouteKey) -> list[dict[str, Any]]:
        records = self._records("evidence", "run_id", "seq", route)
        return [record for _, record in records]

    def list_routes(self) -> list[RouteKey]:
        rows = self._read(
            f"SELECT DISTINCT {_ROUTE_KEY} FROM {self._table('checkpoint_latest')}"
            f" ORDER BY {_ROUTE_KEY}",
            (),
        )
        return [_route_from_row(row) for row in rows]

    def list_audit(self, route: RouteKey) -> list[dict[str, Any]]:
        records = self._records("audit", "audit_id", "audit_id", route)
        return [{**record, "audit_id": audit_id} for audit_id, record in records]

    def _records(
        self, table: str, key: str, order: str, route: RouteKey
    ) -> list[tuple[Any, dict[str, Any]]]:
        """(key, JSON object) of every ``record`` of ``route`` in ``table``, in ``order``."""
        rows = self._read(
            f"SELECT {key}, record FROM {self._table(table)} WHERE {self._route_filter}"
            f" ORDER BY {order}",
            _route_params(route),
        )
        where = {"route": route.as_dict()}
        what = f"stored {table} record"
        return [(value, _load_object(text, what, {**where, key: value})) for value, text in rows]


class SQLiteCheckpointStore(RecordReads):
    """Checkpoints (latest and full history), source state, evidence and audit in one SQLite file.

    WAL journal and ``synchronous=FULL``: a returned write survives power loss, and
    ``upsert_many`` is one transaction (one fsync) even though the port does not
    require it. Re-recording evidence for a run id replaces the record but keeps
    its place: ``list_evidence`` is ordered by the first write of each run id.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._conn: sqlite3.Connection | None = None
        _require_sqlite()
        path = os.path.abspath(os.fspath(path))
        if not os.path.exists(path):
            _initialise(path)
        self._conn = _open(path)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> SQLiteCheckpointStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ValueError("checkpoint store is closed")
        return self._conn

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        conn = self._connection()
        with _translated("written", writing=True), _immediate(conn):
            yield conn

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        conn = self._connection()
        with _translated("read"):
            return conn.execute(sql, params).fetchall()

    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        self.upsert_many([checkpoint])

    def upsert_many(self, checkpoints: Iterable[PartitionCheckpoint]) -> None:
        items = list(checkpoints)
        rows = _encode_batch(items)
        if not rows:
            return
        with self._transaction() as conn:
            _insert_checkpoints(conn, rows, items)

    def list_latest(self, route: RouteKey) -> LatestCheckpoints:
        """A view answered from the summary columns; payloads are decoded when read.

        Read it while the store is open: its answers come from the store's connection.
        """
        self._connection()  # a closed store refuses now, not at the first question
        return LatestCheckpoints(_LatestOfRoute(self, route))

    def history(self, route: RouteKey) -> list[PartitionCheckpoint]:
        """Every checkpoint written for ``route``, oldest first."""
        rows = self._read(
            f"SELECT partition_id, seq, payload FROM checkpoint_history WHERE {_ROUTE}"
            " ORDER BY seq",
            _route_params(route),
        )
        return [_decode_checkpoint(route, *row) for row in rows]

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        rows = self._read(f"SELECT state FROM source_state WHERE {_ROUTE}", _route_params(route))
        if not rows:
            return None
        return _load_object(rows[0][0], "stored source state", {"route": route.as_dict()})

    def save_source_state(self, route: RouteKey, state: dict[str, Any]) -> None:
        text = _encode_object(state, "source state")
        with self._transaction() as conn:
            conn.execute(
                f"INSERT INTO source_state ({_ROUTE_KEY}, state) VALUES (?, ?, ?, ?)"
                f" ON CONFLICT ({_ROUTE_KEY}) DO UPDATE SET state = excluded.state",
                (*_route_params(route), text),
            )

    def record_evidence(self, route: RouteKey, run_id: str, record: dict[str, Any]) -> None:
        _check_run_id(run_id)
        text = _encode_object(record, "evidence record")
        params = _route_params(route)
        with self._transaction() as conn:
            conn.execute(
                f"INSERT INTO evidence ({_ROUTE_KEY}, run_id, seq, record) VALUES (?, ?, ?, ?,"
                f" (SELECT COALESCE(MAX(seq), 0) + 1 FROM evidence WHERE {_ROUTE}), ?)"
                f" ON CONFLICT ({_ROUTE_KEY}, run_id) DO UPDATE SET record = excluded.record",
                (*params, run_id, *params, text),
            )

    def apply_resolution(
        self, route: RouteKey, checkpoints: Sequence[PartitionCheckpoint], audit: dict[str, Any]
    ) -> int:
        """One transaction: the checkpoints and the audit record commit together or not at all."""
        rows, record = _encode_resolution(route, checkpoints, audit)
        with self._transaction() as conn:
            _insert_checkpoints(conn, rows, list(checkpoints))
            return conn.execute(
                f"INSERT INTO audit ({_ROUTE_KEY}, record) VALUES (?, ?, ?, ?)",
                (*_route_params(route), record),
            ).lastrowid


class _LatestOfRoute:
    """``LatestReader`` of one route: summary columns and the guard index, payloads on demand."""

    def __init__(self, store: SQLiteCheckpointStore, route: RouteKey) -> None:
        self._store = store
        self._route = route

    def _select(self, columns: str, rest: str = "", params: tuple[Any, ...] = ()) -> list[Any]:
        return self._store._read(
            f"SELECT {columns} FROM checkpoint_latest WHERE {_ROUTE}{rest}",
            (*_route_params(self._route), *params),
        )

    def _decoded(self, rest: str, params: tuple[Any, ...] = ()) -> list[PartitionCheckpoint]:
        rows = self._select("partition_id, seq, payload", rest, params)
        return [_decode_checkpoint(self._route, *row) for row in rows]

    def count(self) -> int:
        return self._select("COUNT(*)")[0][0]

    def all(self) -> list[PartitionCheckpoint]:
        return self._decoded(" ORDER BY partition_id")

    def guard_groups(self) -> dict[tuple[str, str], int]:
        rows = self._select(
            "status, guard, COUNT(*)", " AND guard IS NOT NULL GROUP BY guard, status"
        )
        return {(status, guard): count for status, guard, count in rows}

    def in_group(self, status: str, guard: str) -> list[PartitionCheckpoint]:
        return self._decoded(
            " AND guard = ? AND status IS ? ORDER BY partition_id", (guard, status)
        )

    def guarded_ids(self) -> list[str]:
        rows = self._select("partition_id", " AND guard IS NOT NULL")
        return sorted(partition_id for (partition_id,) in rows)

    def summaries(self, partition_ids: Collection[str]) -> dict[str, tuple[str, str, str]]:
        rows = self._select(
            "partition_id, status, query_hash, schema_hash",
            _AMONG,
            (json.dumps(list(partition_ids)),),
        )
        return {partition_id: tuple(summary) for partition_id, *summary in rows}

    def checkpoints(self, partition_ids: Collection[str]) -> dict[str, PartitionCheckpoint]:
        found = self._decoded(_AMONG, (json.dumps(list(partition_ids)),))
        return {cp.partition_id: cp for cp in found}


_AMONG = " AND partition_id IN (SELECT value FROM json_each(?))"


def _insert_checkpoints(
    conn: sqlite3.Connection, rows: list[tuple[str, ...]], checkpoints: list[PartitionCheckpoint]
) -> None:
    """History rows, then the latest pointers, in order; the caller owns the transaction.

    ``rows`` are the encoded ``checkpoints``. AUTOINCREMENT gives the new history
    rows the next ``seq`` values in order (the caller's write transaction excludes
    other writers; a different count is refused), so each latest pointer is
    upserted with its ``seq`` and the summary taken from the checkpoint itself,
    which the triggers then find already right. A later row for the same
    partition wins.
    """
    before = _last_seq(conn)
    conn.executemany(
        f"INSERT INTO checkpoint_history ({_ROUTE_KEY}, partition_id, payload)"
        " VALUES (?, ?, ?, ?, ?)",
        rows,
    )
    if _last_seq(conn) != before + len(rows):
        raise CheckpointStoreCorrupt("checkpoint history sequence numbers are not contiguous")
    conn.executemany(
        f"INSERT INTO checkpoint_latest ({_ROUTE_KEY}, partition_id, payload, seq,"
        f" {', '.join(_SUMMARY_NAMES)}) VALUES ({', '.join('?' * (6 + len(_SUMMARY_NAMES)))})"
        f" ON CONFLICT ({_ROUTE_KEY}, partition_id) DO UPDATE SET "
        + ", ".join(f"{name} = excluded.{name}" for name in ("seq", "payload", *_SUMMARY_NAMES)),
        (
            (*row, before + number, *summary)
            for number, (row, summary) in enumerate(
                zip(rows, _summaries(checkpoints), strict=True), start=1
            )
        ),
    )


def _summaries(checkpoints: list[PartitionCheckpoint]) -> Iterator[tuple[Any, ...]]:
    """Each checkpoint's summary columns. A batch shares one guard map: its text is made once."""
    texts: dict[int, str | None] = {}
    for cp in checkpoints:
        key = id(cp.diagnostics.get(GUARD_DIAGNOSTICS_KEY, _NO_GUARD))
        if key not in texts:
            texts[key] = guard_json(cp)
        yield str(cp.status), cp.query_hash, cp.schema_hash, texts[key]


_NO_GUARD = object()


def _last_seq(conn: sqlite3.Connection) -> int:
    """The largest history ``seq`` ever used: the next row gets this plus one."""
    (used,) = conn.execute(
        "SELECT MAX(COALESCE((SELECT MAX(seq) FROM checkpoint_history), 0),"
        " COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'checkpoint_history'), 0))"
    ).fetchone()
    return used


def _route_from_row(row: tuple[Any, ...]) -> RouteKey:
    try:
        return RouteKey(*row)
    except (TypeError, ValueError):
        raise CheckpointStoreCorrupt("a stored route key is not valid") from None
