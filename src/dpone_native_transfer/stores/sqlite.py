"""Durable checkpoint, route-state, operator-audit and lease store in one SQLite file (stdlib only).

A store file is created complete or not at all: the schema is built in a
private file that is then linked into place. So any existing file that is not
a store (empty, truncated, foreign, garbage) is reported as corrupt
rather than silently used as a new, empty store, which would let a retry
append data that was already committed. The schema, its versions and their
migrations are in ``_sqlite_schema``.

``checkpoint_latest`` keeps summary columns beside each payload (status,
hashes, guard text, ledger batch), set by the writer from each checkpoint and
by triggers from the payload for any other writer, so a run's route scan
reads no payload it does not act on (see ``latest.py``).

Errors raised here never carry the file path (paths may be secret) or
SQLite's own message text.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sqlite3
import tempfile
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast
from urllib.request import pathname2url

from ..checkpoints import GUARD_DIAGNOSTICS_KEY, LEDGER_BATCH_KEY, PartitionCheckpoint, RouteKey
from ..drivers import connections_held, file_failure, file_path
from ..errors import (
    CheckpointStoreAccessRefused,
    CheckpointStoreCorrupt,
    CheckpointStoreUnavailable,
    LeaseLost,
)
from ..latest import LatestCheckpoints, begun_at, guard_json
from ..lease import LeaseClaim, clock_epoch
from ._codec import check_run_id, encode_batch, encode_object, encode_resolution, route_params
from ._records import (
    OwnConnection,
    RecordReads,
    adopted,
    check_expected,
    decode_checkpoint,
    load_object,
    stored_route,
)
from ._sqlite_schema import (
    ROUTE,
    ROUTE_KEY,
    SCHEMA,
    SCHEMA_VERSION,
    SUMMARY_NAMES,
    TARGET_LOCATED,
    TARGET_UNLOCATED,
    check_schema,
    immediate,
    migrate,
)

__all__ = ["BUSY_TIMEOUT_SECONDS", "SCHEMA_VERSION", "SQLiteCheckpointStore"]

BUSY_TIMEOUT_SECONDS = 30.0
# Page cache of the store's connection; it grows only as pages are used. A batch of
# 10,000 checkpoints touches more pages than SQLite's default cache of 2 MiB holds: they would
# be evicted and read back within the batch (figures: docs/performance.md, fix 9).
_CACHE_KIB = 16_384
_MINIMUM_SQLITE = (3, 38, 0)  # the ->> and -> JSON operators
_ROUTE_VALUES = ", ".join("?" * len(route_params(RouteKey("s", "t", "full_refresh"))))


# SQLite result codes of a store that is fine but cannot be used now, and what to say of them.
_UNAVAILABLE = {
    sqlite3.SQLITE_BUSY: "is locked by another process (for longer than the busy timeout)",
    sqlite3.SQLITE_LOCKED: "is locked by another process (for longer than the busy timeout)",
    sqlite3.SQLITE_FULL: "cannot be written: the disk is full",
    sqlite3.SQLITE_READONLY: "cannot be written: the file or its folder is read-only",
    sqlite3.SQLITE_CANTOPEN: "cannot be opened (permissions, or its folder is gone)",
    sqlite3.SQLITE_IOERR: "hit an I/O error",
    sqlite3.SQLITE_PERM: "cannot be written: permission denied",
}


_OS_PROBLEMS = {
    errno.ENOSPC: _UNAVAILABLE[sqlite3.SQLITE_FULL],
    errno.EROFS: _UNAVAILABLE[sqlite3.SQLITE_READONLY],
    errno.EACCES: _UNAVAILABLE[sqlite3.SQLITE_PERM],
    errno.EPERM: _UNAVAILABLE[sqlite3.SQLITE_PERM],
}


@contextmanager
def _translated(action: str, *, writing: bool = False) -> Iterator[None]:
    """SQLite failures as stable codes: a store that cannot be used now (locked, read-only,
    disk full, I/O) is ``CheckpointStoreUnavailable`` (a retry may succeed); other failures,
    and any failure of a read, are ``CheckpointStoreCorrupt``. Never SQLite's text."""
    try:
        yield
    except sqlite3.ProgrammingError:
        raise
    except OSError as exc:  # making the file itself: a full, read-only or forbidden folder
        raise CheckpointStoreUnavailable(
            f"the checkpoint store {_OS_PROBLEMS.get(exc.errno or 0, 'cannot be created')}; a "
            "retry may succeed once it is free",
            diagnostics={"action": action, "error_type": type(exc).__name__},
        ) from None
    except sqlite3.DatabaseError as exc:
        problem = _UNAVAILABLE.get(getattr(exc, "sqlite_errorcode", 0) & 0xFF)
        if problem is None and writing and isinstance(exc, sqlite3.OperationalError):
            problem = "cannot be written"
        if problem is not None:
            raise CheckpointStoreUnavailable(
                f"the checkpoint store {problem}; a retry may succeed once it is free",
                diagnostics={"action": action, "error_type": type(exc).__name__},
            ) from None
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
            with immediate(conn):
                for statement in SCHEMA:
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
        for leftover in (scratch, scratch + "-wal", scratch + "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


def _require_sqlite() -> None:
    if sqlite3.sqlite_version_info < _MINIMUM_SQLITE:
        raise CheckpointStoreUnavailable(
            "the SQLite checkpoint store needs SQLite "
            f"{'.'.join(map(str, _MINIMUM_SQLITE))} or newer; "
            f"this Python has {sqlite3.sqlite_version}",
            diagnostics={"sqlite_version": sqlite3.sqlite_version},
        )


def _refuse_partial_pages(conn: sqlite3.Connection, path: str) -> None:
    """A database file is whole pages; SQLite would read a cut last page as zeros and go on."""
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    if os.path.getsize(path) % page_size:
        raise CheckpointStoreCorrupt("the checkpoint store file is truncated")


def _connect(path: str) -> sqlite3.Connection:
    uri = f"file:{pathname2url(path)}?mode=rw"
    with _translated("opened"):
        return sqlite3.connect(
            uri,
            uri=True,
            timeout=BUSY_TIMEOUT_SECONDS,
            isolation_level=None,
            check_same_thread=False,
        )


def _open(path: str) -> sqlite3.Connection:
    conn = _connect(path)
    try:
        with _translated("opened"):
            _refuse_partial_pages(conn, path)
            migrate(conn)
            check_schema(conn)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA cache_size=-{_CACHE_KIB}")
            _keep_open(path)
    except BaseException:
        conn.close()
        raise
    return conn


# While a run holds connections (``drivers.holding_connections``), one idle connection per
# store file stays open, so that a route's store closing is never the file's last close:
# SQLite checkpoints the WAL into the file and deletes it at its last close (a write and
# fsyncs of the file and its folder, per table of a pipeline). Every commit is still in the
# WAL, fsynced as ``SQLiteCheckpointStore`` says; SQLite checkpoints as it fills.
_keepers: dict[str, sqlite3.Connection] = {}
_keepers_lock = threading.Lock()


def _keep_open(path: str) -> None:
    if not connections_held(_close_keepers):
        return
    with _keepers_lock:
        if path not in _keepers:
            keeper = _connect(path)
            keeper.execute("PRAGMA schema_version").fetchone()  # opens the file and its WAL
            _keepers[path] = keeper


def _close_keepers() -> None:
    with _keepers_lock:
        keepers = list(_keepers.values())
        _keepers.clear()
    for keeper in keepers:
        with contextlib.suppress(sqlite3.Error):
            keeper.close()


class SQLiteCheckpointStore(OwnConnection, RecordReads):
    """Checkpoints (latest and full history), source state, evidence, audit and leases in one file.

    WAL journal. A write something outside the store acts on survives power loss when it
    returns (``synchronous=FULL``, one fsync): checkpoints (the guard arms a batch before
    the target call and promotes it before the run reports), a resolution, and every write
    made without a lease. A run's other writes under its lease (the lease's take and
    renewals, the scan's adoption, evidence, source state) are fsynced by the next of those,
    at the latest by the lease's release, its last write: a power loss before that loses
    them as a kill before them would, which a run recovers from; each saved an fsync of
    about 1 ms, serialized between a pipeline's workers. ``upsert_many`` is one
    transaction even though the port does not require it. Re-recording evidence for a run
    id replaces the record but keeps its place: ``list_evidence`` is ordered by the first
    write of each run id.
    """

    _route_filter = ROUTE

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._conn: sqlite3.Connection | None = None
        _require_sqlite()
        self._path = os.path.abspath(file_path(path, argument="store path"))
        try:
            if not os.path.exists(self._path):
                with _translated("created", writing=True):
                    _initialise(self._path)
            self._conn = _open(self._path)
        except CheckpointStoreUnavailable:
            failure = file_failure(self._path, writing=True)
            if failure is None:
                raise
        else:
            return
        raise failure.error(  # outside the handler: nothing chained
            "the checkpoint store cannot be opened",
            retry=CheckpointStoreUnavailable,
            refused=CheckpointStoreAccessRefused,
            diagnostics={"action": "opened"},
            fix="give this process read and write access to the store file and its folder",
        )

    @property
    def path(self) -> str:
        """The store's file, absolute (``FileStore``)."""
        return self._path

    @contextmanager
    def _transaction(
        self,
        holding: LeaseClaim | None = None,
        route: RouteKey | None = None,
        *,
        synced: bool = True,
    ) -> Iterator[sqlite3.Connection]:
        """One write transaction; with ``holding``, only while that lease is held."""
        conn = self._connection()
        with _translated("written", writing=True), immediate(conn, synced=synced):
            if holding is not None and route is not None:
                _check_holding(conn, holding, route)
            yield conn

    def _table(self, name: str) -> str:
        return name

    def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        conn = self._connection()
        with _translated("read"):
            return conn.execute(sql, params).fetchall()

    def check_pages(self) -> None:
        """Every page of the file readable (``PRAGMA quick_check``, a read of the whole file):
        an operator's command that reads only some tables said "nothing blocks" of a store a
        run found corrupt. Its constraint findings are not damage: SQLite 3.40 reports
        "NULL value in" columns of WITHOUT ROWID tables that hold none (the rows decode)."""
        found = [row[0] for row in self._read("PRAGMA quick_check", ())]
        # one look per finding: SQLite 3.40 repeats one for every row of a healthy table
        damage = [text for text in dict.fromkeys(found) if text != "ok" and not self._decodes(text)]
        if damage:
            raise CheckpointStoreCorrupt("checkpoint store cannot be read")

    def _decodes(self, finding: str) -> bool:
        """Whether a ``quick_check`` finding is one of SQLite 3.40's about WITHOUT ROWID
        tables (a column "NULL value in" that its rows, read, hold no NULL of), not damage:
        the NULL is looked for (a store swapped in mid-run, its WAL beside it, held one)."""
        if finding.startswith(_CHECK_FAILED):
            return True
        null = _NULL_IN.fullmatch(finding)
        if null is None:
            return False
        table, column = null.groups()
        try:
            return not self._read(f'SELECT 1 FROM "{table}" WHERE "{column}" IS NULL LIMIT 1', ())
        except CheckpointStoreCorrupt:
            return False

    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        self.upsert_many([checkpoint])

    def upsert_many(
        self, checkpoints: Iterable[PartitionCheckpoint], *, holding: LeaseClaim | None = None
    ) -> None:
        """One transaction; with ``holding``, only while that lease is held (``LeaseStore``)."""
        items = list(checkpoints)
        rows = encode_batch(items)
        if not rows:
            return
        with self._transaction(holding, items[0].route) as conn:
            _insert_checkpoints(conn, rows, items)

    def list_latest(self, route: RouteKey) -> LatestCheckpoints:
        """A view answered from the summary columns; payloads are decoded when read.

        Read it while the store is open: its answers come from the store's connection.
        """
        self._connection()  # a closed store refuses now, not at the first question
        return LatestCheckpoints(_LatestRows(self, [(ROUTE, route_params(route))]))

    def list_target_latest(self, route: RouteKey) -> LatestCheckpoints:
        """Every route's latest checkpoints into ``route``'s target table (``TargetScopeStore``)."""
        self._connection()
        table = route.target_table
        parts: list[tuple[str, tuple[Any, ...]]] = [(TARGET_UNLOCATED, (table,))]
        if route.target_location:
            parts.insert(0, (TARGET_LOCATED, (route.target_location, table, table)))
        return LatestCheckpoints(_LatestRows(self, parts))

    def adopt_unlocated(self, route: RouteKey) -> int:
        """Move the unlocated twin's latest checkpoints and source state to ``route``, at once.

        A twin checkpoint replaces the route's own only when it is newer. Returns how
        many twin checkpoints there were.
        """
        twin = route.unlocated()
        if not route.located:
            return 0
        with self._transaction(synced=False) as conn:  # the scan's: under the run's lease
            found, moved = adopted(conn.execute, "checkpoint_latest", ROUTE, route)
            if found:
                _insert_checkpoints(conn, encode_batch(moved), moved)
                conn.execute(f"DELETE FROM checkpoint_latest WHERE {ROUTE}", route_params(twin))
            conn.execute(
                f"INSERT OR IGNORE INTO source_state ({ROUTE_KEY}, state)"
                f" SELECT ?, ?, ?, ?, ?, state FROM source_state WHERE {ROUTE}",
                (*route_params(route), *route_params(twin)),
            )
            conn.execute(f"DELETE FROM source_state WHERE {ROUTE}", route_params(twin))
            return found

    def history(self, route: RouteKey) -> list[PartitionCheckpoint]:
        """Every checkpoint written for ``route``, oldest first."""
        rows = self._read(
            f"SELECT partition_id, seq, payload FROM checkpoint_history WHERE {ROUTE} ORDER BY seq",
            route_params(route),
        )
        return [decode_checkpoint(route, *row) for row in rows]

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        rows = self._read(f"SELECT state FROM source_state WHERE {ROUTE}", route_params(route))
        if not rows:
            return None
        return load_object(rows[0][0], "stored source state", {"route": route.as_dict()})

    def save_source_state(
        self, route: RouteKey, state: dict[str, Any], *, holding: LeaseClaim | None = None
    ) -> None:
        text = encode_object(state, "source state")
        with self._transaction(holding, route, synced=holding is None) as conn:
            _save_state(conn, route, text)

    def record_evidence(
        self,
        route: RouteKey,
        run_id: str,
        record: dict[str, Any],
        *,
        holding: LeaseClaim | None = None,
    ) -> None:
        check_run_id(run_id)
        text = encode_object(record, "evidence record")
        params = route_params(route)
        with self._transaction(holding, route, synced=holding is None) as conn:
            conn.execute(
                f"INSERT INTO evidence ({ROUTE_KEY}, run_id, seq, record)"
                f" VALUES ({_ROUTE_VALUES}, ?,"
                f" (SELECT COALESCE(MAX(seq), 0) + 1 FROM evidence WHERE {ROUTE}), ?)"
                f" ON CONFLICT ({ROUTE_KEY}, run_id) DO UPDATE SET record = excluded.record",
                (*params, run_id, *params, text),
            )

    def apply_resolution(
        self,
        route: RouteKey,
        checkpoints: Sequence[PartitionCheckpoint],
        audit: dict[str, Any],
        *,
        expected: Sequence[PartitionCheckpoint] = (),
        source_state: dict[str, Any] | None = None,
        holding: LeaseClaim | None = None,
    ) -> int:
        """One transaction: the checkpoints, the audit record (and a source state), or nothing.

        ``expected`` makes it a compare-and-set: each of those checkpoints must
        still be its partition's latest, or ``ResolutionConflict`` is raised and
        nothing is written. ``holding``: only while that lease is held.
        """
        rows, record = encode_resolution(
            route, checkpoints, audit, with_state=source_state is not None
        )
        state = None if source_state is None else encode_object(source_state, "source state")
        with self._transaction(holding, route) as conn:
            check_expected(expected, lambda cp: _latest_payload(conn, cp))
            _insert_checkpoints(conn, rows, list(checkpoints))
            if state is not None:
                _save_state(conn, route, state)
            inserted = conn.execute(
                f"INSERT INTO audit ({ROUTE_KEY}, record) VALUES ({_ROUTE_VALUES}, ?)",
                (*route_params(route), record),
            )
            return cast(int, inserted.lastrowid)  # an INSERT's rowid

    def lease_table(self) -> _LeaseTable:
        """Lease operations on a connection of their own (the heartbeat runs in a thread)."""
        self._connection()
        return _LeaseTable(_connect(self._path))


def _save_state(conn: sqlite3.Connection, route: RouteKey, text: str) -> None:
    conn.execute(
        f"INSERT INTO source_state ({ROUTE_KEY}, state) VALUES ({_ROUTE_VALUES}, ?)"
        f" ON CONFLICT ({ROUTE_KEY}) DO UPDATE SET state = excluded.state",
        (*route_params(route), text),
    )


def _latest_payload(conn: sqlite3.Connection, checkpoint: PartitionCheckpoint) -> Any:
    row = conn.execute(
        f"SELECT seq, payload FROM checkpoint_latest WHERE {ROUTE} AND partition_id = ?",
        (*route_params(checkpoint.route), checkpoint.partition_id),
    ).fetchone()
    return (
        None if row is None else decode_checkpoint(checkpoint.route, checkpoint.partition_id, *row)
    )


class _LatestRows:
    """``LatestReader`` over the rows some disjoint conditions select: one route, or one
    target table (its located and unlocated parts, each answered from a covering index)."""

    def __init__(
        self, store: SQLiteCheckpointStore, parts: list[tuple[str, tuple[Any, ...]]]
    ) -> None:
        self._store = store
        self._parts = parts
        self._routes: dict[tuple[Any, ...], RouteKey] = {}

    def _select(self, columns: str, rest: str = "", params: tuple[Any, ...] = ()) -> list[Any]:
        """The rows of every part, concatenated (an aggregate: one row list per part)."""
        return [
            row
            for where, where_params in self._parts
            for row in self._store._read(
                f"SELECT {columns} FROM checkpoint_latest WHERE {where}{rest}",
                (*where_params, *params),
            )
        ]

    def _decoded(self, rest: str, params: tuple[Any, ...] = ()) -> list[PartitionCheckpoint]:
        rows = self._select(f"{ROUTE_KEY}, partition_id, seq, payload", rest, params)
        decoded = [decode_checkpoint(self._route(row[:5]), *row[5:]) for row in rows]
        if len(self._parts) > 1:
            decoded.sort(key=lambda checkpoint: checkpoint.partition_id)
        return decoded

    def _route(self, key: tuple[Any, ...]) -> RouteKey:
        route = self._routes.get(key)
        if route is None:
            route = self._routes[key] = stored_route(key)
        return route

    def count(self) -> int:
        return sum(count for (count,) in self._select("COUNT(*)"))

    def all(self) -> list[PartitionCheckpoint]:
        return self._decoded(" ORDER BY partition_id")

    def guard_groups(self) -> dict[tuple[str, str], int]:
        rows = self._select(
            "status, guard, COUNT(*)", " AND guard IS NOT NULL GROUP BY guard, status"
        )
        groups: dict[tuple[str, str], int] = {}
        for status, guard, count in rows:
            groups[status, guard] = groups.get((status, guard), 0) + count
        return groups

    def in_group(self, status: str, guard: str) -> list[PartitionCheckpoint]:
        return self._decoded(
            " AND guard = ? AND status IS ? ORDER BY partition_id", (guard, status)
        )

    def guarded_ids(self) -> list[str]:
        rows = self._select("partition_id", " AND guard IS NOT NULL")
        return sorted(partition_id for (partition_id,) in rows)

    def ledger_batches(self) -> dict[str, tuple[int, int]]:
        rows = self._select(
            "ledger_batch, status = 'committed', COUNT(*)",
            " AND ledger_batch IS NOT NULL GROUP BY ledger_batch, status",
        )
        found: dict[str, tuple[int, int]] = {}
        for batch, committed, count in rows:
            done, other = found.get(batch, (0, 0))
            found[batch] = (done + count, other) if committed else (done, other + count)
        return found

    def committed_hashes(self) -> set[tuple[str, str]]:
        rows = self._select("DISTINCT query_hash, schema_hash", " AND status = 'committed'")
        return {(query_hash, schema_hash) for query_hash, schema_hash in rows}

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

    def begun_at(self, watermark: Any) -> list[PartitionCheckpoint]:
        """SQLite selects the rows by their bounds' JSON where its comparison is Python's
        (NULL, text, a 64-bit integer), else every window's rows; their decoded bounds
        decide (``latest.begun_at``)."""
        rest = _WINDOWS
        params: tuple[Any, ...] = ()
        if watermark is None:
            rest += f" AND ({_AFTER} IS NULL OR {_AFTER} = 'null')"
        elif type(watermark) is str or (type(watermark) is int and -(2**63) <= watermark < 2**63):
            rest, params = f"{rest} AND {_AFTER_VALUE} = ?", (watermark,)
        found = self._decoded(f"{rest} ORDER BY partition_id", params)
        return [cp for cp in found if begun_at(cp.partition_bounds, watermark)]


_AMONG = " AND partition_id IN (SELECT value FROM json_each(?))"
_WINDOWS = " AND payload -> '$.partition_bounds.cursor_upto' IS NOT NULL"
_AFTER = "payload -> '$.partition_bounds.cursor_after'"  # its JSON text; NULL when missing
_AFTER_VALUE = "payload ->> '$.partition_bounds.cursor_after'"  # its SQL value
_CHECK_FAILED = "CHECK constraint failed"  # quick_check's finding of a row, not a page
_NULL_IN = re.compile(r"NULL value in ([a-z_]+)\.([a-z_]+)")  # of a store table's column


class _LeaseTable:
    """``LeaseTable`` on its own connection to the store file; one call at a time."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._lock = threading.Lock()

    def _write(
        self,
        sql: str,
        params: tuple[Any, ...],
        key: str = "",
        token: str = "",
        *,
        synced: bool = False,
    ) -> Any:
        """Run ``sql``; with ``key``, then the epoch of that key's lease if ``token`` holds it.
        Synced only when asked: the release, the holder's last write, syncs the rest."""
        written = _translated("written", writing=True)
        with self._lock, written, immediate(self._conn, synced=synced):
            changed = self._conn.execute(sql, params).rowcount
            if not key:
                return changed
            row = self._conn.execute(
                "SELECT token, epoch FROM lease WHERE lease_key = ?", (key,)
            ).fetchone()
            return row[1] if row is not None and row[0] == token else None

    def take(
        self,
        key: str,
        token: str,
        expires_at: float,
        record: str,
        now: float,
        *,
        replacing: str | None = None,
    ) -> int | None:
        return cast(
            "int | None",
            self._write(
                "INSERT INTO lease (lease_key, token, expires_at, record, epoch)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (lease_key) DO UPDATE SET"
                " token = excluded.token, expires_at = excluded.expires_at,"
                " record = excluded.record, epoch = MAX(lease.epoch + 1, excluded.epoch)"
                " WHERE lease.expires_at <= ? OR lease.token = excluded.token OR lease.record = ?",
                (key, token, expires_at, record, clock_epoch(now), now, replacing),
                key,
                token,
            ),
        )

    def raise_epoch(self, key: str, token: str, epoch: int) -> int | None:
        return cast(
            "int | None",
            self._write(
                "UPDATE lease SET epoch = MAX(epoch, ?) WHERE lease_key = ? AND token = ?",
                (epoch, key, token),
                key,
                token,
            ),
        )

    def renew(self, key: str, token: str, expires_at: float, record: str) -> bool:
        return 1 == self._write(
            "UPDATE lease SET expires_at = ?, record = ? WHERE lease_key = ? AND token = ?",
            (expires_at, record, key, token),
        )

    def release(self, key: str, token: str) -> None:
        self._write(
            "UPDATE lease SET token = '', expires_at = 0 WHERE lease_key = ? AND token = ?",
            (key, token),
            synced=True,
        )

    def holder(self, key: str, now: float) -> str | None:
        with self._lock, _translated("read"):
            row = self._conn.execute(
                "SELECT record FROM lease WHERE lease_key = ? AND expires_at > ?", (key, now)
            ).fetchone()
        return None if row is None else row[0]

    def holders(self, now: float) -> list[str]:
        with self._lock, _translated("read"):
            rows = self._conn.execute(
                "SELECT record FROM lease WHERE expires_at > ? ORDER BY lease_key", (now,)
            ).fetchall()
        return [row[0] for row in rows]

    def close(self) -> None:
        self._conn.close()


def _check_holding(conn: sqlite3.Connection, claim: LeaseClaim, route: RouteKey) -> None:
    """``LeaseLost`` unless ``claim`` holds its lease unexpired (in the caller's transaction)."""
    held = conn.execute(
        "SELECT 1 FROM lease WHERE lease_key = ? AND token = ? AND expires_at > ?",
        (claim.key, claim.token, time.time()),
    ).fetchone()
    if held is None:
        raise LeaseLost.lost(route)


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
        f"INSERT INTO checkpoint_history ({ROUTE_KEY}, partition_id, payload)"
        f" VALUES ({_ROUTE_VALUES}, ?, ?)",
        rows,
    )
    if _last_seq(conn) != before + len(rows):
        raise CheckpointStoreCorrupt("checkpoint history sequence numbers are not contiguous")
    summary = ", ".join(SUMMARY_NAMES)
    conn.executemany(
        f"INSERT INTO checkpoint_latest ({ROUTE_KEY}, partition_id, payload, seq, {summary})"
        f" VALUES ({_ROUTE_VALUES}, ?, ?, ?, {', '.join('?' * len(SUMMARY_NAMES))})"
        f" ON CONFLICT ({ROUTE_KEY}, partition_id) DO UPDATE SET "
        + ", ".join(f"{name} = excluded.{name}" for name in ("seq", "payload", *SUMMARY_NAMES)),
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
        ledger = cp.diagnostics.get(LEDGER_BATCH_KEY)  # a str when present: the codec checks it
        yield str(cp.status), cp.query_hash, cp.schema_hash, texts[key], ledger


_NO_GUARD = object()


def _last_seq(conn: sqlite3.Connection) -> int:
    """The largest history ``seq`` ever used: the next row gets this plus one."""
    (used,) = conn.execute(
        "SELECT MAX(COALESCE((SELECT MAX(seq) FROM checkpoint_history), 0),"
        " COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'checkpoint_history'), 0))"
    ).fetchone()
    return used
