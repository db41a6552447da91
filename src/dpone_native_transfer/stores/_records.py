"""Reading stored records back, for both SQL stores: strict decoding and the shared reads.

Errors raised here never carry a file path, a DSN or a driver's message text.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import Any, Self

import attrs

from ..checkpoints import PartitionCheckpoint, RouteKey, checkpoint_from_payload, strict_json
from ..errors import (
    CheckpointPayloadInvalid,
    CheckpointStoreCorrupt,
    ResolutionConflict,
    StoreClosed,
)
from ._codec import ROUTE_NAMES, route_from_params, route_params

__all__ = [
    "OwnConnection",
    "RecordReads",
    "adopted",
    "check_expected",
    "decode_checkpoint",
    "load_object",
    "stored_route",
]


def _loads(text: Any, what: str, where: dict[str, Any]) -> Any:
    """Strict JSON: a key twice in one object is as corrupt as text that is not JSON."""
    try:
        return strict_json(text)
    except (TypeError, ValueError, RecursionError):
        raise CheckpointStoreCorrupt(
            f"{what} is not valid JSON (or holds a key twice)", diagnostics=where
        ) from None


def load_object(text: Any, what: str, where: dict[str, Any]) -> dict[str, Any]:
    value = _loads(text, what, where)
    if not isinstance(value, dict):
        raise CheckpointStoreCorrupt(f"{what} is not a JSON object", diagnostics=where)
    return value


def stored_route(values: Sequence[Any]) -> RouteKey:
    """The route of a row's five key columns; a bad one means the store is corrupt."""
    try:
        return route_from_params(values)
    except (TypeError, ValueError):
        raise CheckpointStoreCorrupt("a stored route key is not valid") from None


def decode_checkpoint(
    route: RouteKey, partition_id: Any, seq: Any, text: Any
) -> PartitionCheckpoint:
    """A stored payload, strictly parsed; it must belong to the route and partition filed under."""
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


def adopted(
    execute: Callable[[str, tuple[Any, ...]], Any], table: str, route_filter: str, route: RouteKey
) -> tuple[int, list[PartitionCheckpoint]]:
    """How many latest checkpoints ``route``'s unlocated twin has in ``table``, and those to move
    to ``route``: the ones newer than ``route``'s own of the same partition. ``execute`` runs
    a statement on the caller's connection, inside the caller's transaction."""
    twin = route.unlocated()
    select = f"FROM {table} WHERE {route_filter}"
    rows = execute(f"SELECT partition_id, seq, payload {select}", route_params(twin)).fetchall()
    if not rows:
        return 0, []
    own = dict(execute(f"SELECT partition_id, seq {select}", route_params(route)).fetchall())
    moved = [
        attrs.evolve(decode_checkpoint(twin, *row), route=route)
        for row in rows
        if own.get(row[0], -1) < row[1]
    ]
    return len(rows), moved


def check_expected(
    expected: Sequence[PartitionCheckpoint],
    latest: Callable[[PartitionCheckpoint], PartitionCheckpoint | None],
) -> None:
    """Compare-and-set: refuse unless each expected checkpoint is still its partition's latest."""
    changed = [cp.partition_id for cp in expected if latest(cp) != cp]
    if changed:
        raise ResolutionConflict.changed(expected[0].route, changed)


class OwnConnection:
    """A store's one connection: ``close()`` (a context manager closes it too), and
    ``_connection()``, which refuses a closed store with ``StoreClosed``."""

    _conn: Any = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _connection(self) -> Any:
        if self._conn is None:
            raise StoreClosed.used(self)
        return self._conn


class RecordReads(abc.ABC):
    """Evidence, audit records and the list of routes, read the same way by both SQL stores.

    The template a store class fills in: ``_read`` (one read), ``_table`` (a
    table's name as its SQL needs it) and ``_route_filter`` (its condition on
    the five route key columns, in ``route_params`` order).
    """

    _route_filter: str  # a class attribute of the store

    @abc.abstractmethod
    def _read(self, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        """The rows of one read-only statement, on a connection of the store's own."""

    @abc.abstractmethod
    def _table(self, name: str) -> str:
        """``name`` as the store's SQL names it (PostgreSQL qualifies it with the schema)."""

    def list_evidence(self, route: RouteKey) -> list[dict[str, Any]]:
        records = self._records("evidence", "run_id", "seq", route)
        return [record for _, record in records]

    def list_routes(self) -> list[RouteKey]:
        """Every route with a checkpoint, unlocated ones included, sorted by its key values."""
        key = ", ".join(ROUTE_NAMES)
        rows = self._read(
            f"SELECT DISTINCT {key} FROM {self._table('checkpoint_latest')} ORDER BY {key}", ()
        )
        return [stored_route(row) for row in rows]

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
            route_params(route),
        )
        where = {"route": route.as_dict()}
        what = f"stored {table} record"
        return [(value, load_object(text, what, {**where, key: value})) for value, text in rows]
