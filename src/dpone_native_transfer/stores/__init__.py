"""The store ports, and ``Store``: what the built-in stores are, and the runtime requires.

The checkpoint port (``CheckpointStore``) is what plugins see: deliberately
small, it promises no atomicity (``upsert_many`` writes in order and may fail
part-way), and the guard is written to be correct under exactly that contract.
``Store`` names everything else a run and the operator commands use (the
target table's scope, source state and evidence, audited repairs, leases);
``open_store`` returns one. A third-party store implements all of it, adapting
itself where it must.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable
from urllib.request import pathname2url

from ..checkpoints import PartitionCheckpoint, RouteKey
from ..drivers import POSTGRES_SCHEMES, resolve_env
from ..errors import ConfigInvalid
from ..lease import LeaseClaim, LeaseStore

__all__ = [
    "CheckpointStore",
    "FileStore",
    "OperatorStore",
    "RouteStateStore",
    "Store",
    "TargetScopeStore",
    "new_store_file",
    "open_store",
    "remove_unused_store",
]


@runtime_checkable
class CheckpointStore(Protocol):
    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        """Record ``checkpoint`` as the latest state of its partition (history is kept)."""

    def upsert_many(self, checkpoints: Sequence[PartitionCheckpoint]) -> None:
        """Record each checkpoint in order. May raise part-way: no atomicity is promised."""

    def list_latest(self, route: RouteKey) -> Sequence[PartitionCheckpoint]:
        """Latest checkpoint of every partition ever written for ``route``, sorted by partition id.

        A sequence, read once: the built-in SQLite store returns a lazy view
        (``latest.LatestCheckpoints``) that decodes a payload when it is used.

        Independent of query, schema, run or partition identity: the route scan relies on it.
        """


@runtime_checkable
class TargetScopeStore(Protocol):
    """What a store needs for routes keyed by their databases (``RouteKey`` locations)."""

    def list_target_latest(self, route: RouteKey) -> Sequence[PartitionCheckpoint]:
        """Latest checkpoint of every partition of every route writing ``route``'s target table.

        Located routes with the same target location and table, whatever their
        source or strategy, and, failing closed, unlocated routes whose target
        table has the same name ignoring ASCII case. The route scan reads it.
        """

    def adopt_unlocated(self, route: RouteKey) -> int:
        """Move the latest checkpoints and source state of ``route.unlocated()`` to ``route``.

        One transaction; a checkpoint the located route already has in a newer
        state is kept. Returns how many unlocated checkpoints there were.
        """


@runtime_checkable
class RouteStateStore(Protocol):
    """Where a route's source state (watermark, generation) and run evidence live."""

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        """The last advanced source state of ``route``, or None before the first completed run."""

    def save_source_state(self, route: RouteKey, state: dict[str, Any]) -> None:
        """Atomically replace the source state of ``route``."""

    def record_evidence(self, route: RouteKey, run_id: str, record: dict[str, Any]) -> None:
        """Atomically write the evidence record of one run (a re-run of the same id replaces it)."""

    def list_evidence(self, route: RouteKey) -> list[dict[str, Any]]:
        """Evidence records of ``route``, oldest first."""


@runtime_checkable
class OperatorStore(CheckpointStore, Protocol):
    """What operator commands need beyond the checkpoint port: every route, and audited repairs."""

    def list_routes(self) -> list[RouteKey]:
        """Every route that has at least one checkpoint, sorted by source, target and strategy."""

    def apply_resolution(
        self,
        route: RouteKey,
        checkpoints: Sequence[PartitionCheckpoint],
        audit: dict[str, Any],
        *,
        expected: Sequence[PartitionCheckpoint] = (),
        source_state: dict[str, Any] | None = None,
    ) -> int:
        """Write ``checkpoints`` (of ``route``'s table names) and append ``audit``: all or nothing.

        Compare-and-set: unless each of ``expected`` is still its partition's
        latest checkpoint, raise ``ResolutionConflict`` and write nothing. With
        ``source_state``, also replace the route's source state. Returns the
        audit id the store assigned (ids grow with every record). ``audit`` must
        not hold ``audit_id``; ``list_audit`` adds it.
        """

    def list_audit(self, route: RouteKey) -> list[dict[str, Any]]:
        """Audit records of ``route``, oldest first, each with its ``audit_id``."""


@runtime_checkable
class Store(OperatorStore, TargetScopeStore, RouteStateStore, LeaseStore, Protocol):
    """What the built-in stores are, and what ``TransferRuntime`` requires: the checkpoint
    port, the target table's scope, source state and evidence, the operator port, leases."""

    def upsert_many(
        self, checkpoints: Sequence[PartitionCheckpoint], *, holding: LeaseClaim | None = None
    ) -> None:
        """``CheckpointStore.upsert_many``; with ``holding``, only under that lease
        (``LeaseStore.upsert_many``)."""

    def close(self) -> None:
        """Close the store's connections; the store is not used again."""


@runtime_checkable
class FileStore(Protocol):
    """A store kept in one file (the SQLite store): the runtime refuses a target or source
    in that file, as a route file's check does."""

    @property
    def path(self) -> str:
        """The store's file, absolute."""


def new_store_file(location: str, *, argument: str) -> str | None:
    """The SQLite file ``open_store(location, create=True)`` would create; None when it exists
    or the store is not a file (PostgreSQL)."""
    location = resolve_env(location, argument=argument)
    if location.startswith(POSTGRES_SCHEMES) or os.path.lexists(location):
        return None
    return os.path.abspath(location)


def remove_unused_store(path: str) -> None:
    """Remove the store file ``new_store_file`` named, and its companions, while it holds no
    row: a command made it and wrote nothing (``state restore``); a run that started
    meanwhile writes its lease and checkpoints there, and then it stays."""
    try:
        uri = f"file:{pathname2url(path)}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            tables = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
            if any(db.execute(f'SELECT 1 FROM "{name}" LIMIT 1').fetchone() for (name,) in tables):
                return
    except sqlite3.Error:
        return
    for name in (path, f"{path}-wal", f"{path}-shm", f"{path}-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)


def open_store(location: str, *, create: bool, argument: str, check: bool | None = None) -> Store:
    """Open the store a command line or route file names.

    ``location`` is a SQLite file path, a ``postgresql://`` DSN, or
    ``env:NAME`` to read either from the environment variable ``NAME`` (keep
    credentials out of process lists and route files). With ``create=False``
    a missing SQLite file is refused rather than created: operator commands
    must never conjure an empty store, and a SQLite file is read whole first
    (``check_pages``; ``check``: whether an existing file is, by default when not
    ``create``: ``state restore``, which may create the store, checks one it finds, or it
    called a damaged store in agreement with the target). Errors name ``argument``, never the
    location, which may hold a password.
    """
    # command-line arguments and route-file keys are named the way the rest of the CLI names them
    named = {"argument" if argument.startswith("-") else "key": argument}
    location = resolve_env(location, argument=argument)
    if location.startswith(POSTGRES_SCHEMES):
        from .postgres import PostgresCheckpointStore  # psycopg is optional: import on demand

        return PostgresCheckpointStore(location, create=create)
    if "=" in os.path.basename(location) and " " in location:
        raise ConfigInvalid(
            f"{argument} looks like a key=value connection string; "
            "give PostgreSQL stores as a postgresql:// URL",
            diagnostics=named,
        )
    folder = os.path.dirname(os.path.abspath(location))
    if os.path.exists(location) and not os.path.isfile(location):
        what = "a folder" if os.path.isdir(location) else "a device, a pipe or a socket"
        raise ConfigInvalid(
            f"the checkpoint store given as {argument} is {what}, not a store file",
            diagnostics=named,
        )
    if not (os.path.isfile(location) or (create and os.path.isdir(folder))):
        problem = "is in a folder that does not exist" if create else "does not exist"
        raise ConfigInvalid(
            f"the checkpoint store given as {argument} {problem}", diagnostics=named
        )
    from .sqlite import SQLiteCheckpointStore  # the implementations import this module

    existed = os.path.isfile(location)
    store = SQLiteCheckpointStore(location)
    if existed and (not create if check is None else check):  # an operator's command
        try:
            store.check_pages()
        except BaseException:
            store.close()
            raise
    return store
