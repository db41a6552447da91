"""The checkpoint codec every store shares: payload JSON per batch, and records as JSON objects.

What a store writes must read back exactly: each encoder refuses, before any
write, a value its reader would refuse or change. Route keys go into SQL as
five values (``route_params``): the table names, the strategy and the two
locations, ``""`` for an unlocated route (see ``RouteKey``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from ..checkpoints import (
    _STATUS_VALUES,
    PartitionCheckpoint,
    RouteKey,
    Strategy,
    _is_json_safe,
    _valid_ledger_batch,
    checkpoint_from_payload,
    checkpoint_to_payload,
    format_timestamp,
)

__all__ = [
    "ROUTE_NAMES",
    "check_run_id",
    "encode_batch",
    "encode_object",
    "encode_resolution",
    "route_from_params",
    "route_params",
]

# The route key as stores file it: table names, strategy, locations ("" when unlocated).
ROUTE_NAMES = ("source_table", "target_table", "strategy", "source_location", "target_location")


def _checked(checkpoints: Iterable[PartitionCheckpoint]) -> list[PartitionCheckpoint]:
    """All items, or a TypeError before anything is written."""
    items = list(checkpoints)
    for item in items:
        if not isinstance(item, PartitionCheckpoint):
            raise TypeError(f"expected PartitionCheckpoint, got {type(item).__name__}")
    return items


class _BatchEncoder:
    """Payload JSON for the checkpoints of one batch; refuses what the reader would reject.

    The text is exactly ``json.dumps(checkpoint_to_payload(cp), sort_keys=True,
    allow_nan=False)`` (a test holds it to that). The checkpoints of a batch share
    most fields (route, status, run id, hashes, timestamps), so the text around the
    per-partition fields is checked and built once per distinct combination; dict
    and list values (the guard map) are checked and encoded once per object, which
    is safe because the batch keeps them alive and unchanged while it is encoded.

    The checks are those of ``checkpoint_from_payload``. When one fails, the real
    parser runs on the payload: it raises the reader's precise error (or, should a
    check be stricter than the reader, accepts, and the payload is encoded plainly).
    """

    def __init__(self) -> None:
        self._frames: dict[tuple[Any, ...], tuple[str, str, str] | None] = {}
        self._values: dict[int, str | None] = {}  # id of a dict or list -> JSON, None: unsafe

    def encode(self, cp: PartitionCheckpoint) -> str:
        shared = (
            cp.route, cp.status, cp.run_id, cp.query_hash, cp.schema_hash,
            id(cp.started_at), id(cp.completed_at),
        )  # fmt: skip
        try:
            frame = self._frames.get(shared, _UNSEEN)
        except TypeError:  # an unhashable field: the reader refuses it below
            frame = None
        if frame is _UNSEEN:
            frame = self._frames[shared] = _frame(cp)
        rows = cp.rows_exported
        diagnostics = self._map(cp.diagnostics)
        bounds = self._map(cp.partition_bounds)
        if (
            frame is None
            or diagnostics is None
            or not _valid_ledger_batch(cp.diagnostics)
            or bounds is None
            or type(rows) is not int
            or rows < 0
            or not _nonempty(cp.partition_id)
        ):
            payload = checkpoint_to_payload(cp, copy_values=False)
            checkpoint_from_payload(payload)
            return json.dumps(payload, sort_keys=True, allow_nan=False)
        head, middle, tail = frame
        return (
            f'{head}{diagnostics}, "partition_bounds": {bounds},'
            f' "partition_id": {_ENCODE_STRING(cp.partition_id)}{middle}{rows}{tail}'
        )

    def _map(self, value: Any) -> str | None:
        """A dict's JSON with sorted keys, or None when the reader would refuse it."""
        if not isinstance(value, dict):
            return None
        try:
            keys = sorted(value)
        except TypeError:  # keys of mixed types: not all strings
            return None
        parts = []
        for key in keys:
            if not isinstance(key, str):
                return None
            item = value[key]
            text: str | None
            if type(item) is str:
                text = _ENCODE_STRING(item)
            elif isinstance(item, (dict, list)):
                text = self._values.get(id(item), _UNSEEN)
                if text is _UNSEEN:
                    text = self._values[id(item)] = _checked_json(item)
            else:
                text = _checked_json(item)
            if text is None:
                return None
            parts.append(f"{_ENCODE_STRING(key)}: {text}")
        return "{" + ", ".join(parts) + "}"


_UNSEEN: Any = object()


def _checked_json(value: Any) -> str | None:
    """JSON of a value inside a payload map (depth 1), or None when the reader refuses it."""
    return _ENCODER.encode(value) if _is_json_safe(value, 1) else None


def _frame(cp: PartitionCheckpoint) -> tuple[str, str, str] | None:
    """The payload text around diagnostics, bounds, partition id and row count.

    None when a shared field would be refused by the reader.
    """
    route = cp.route
    started, completed = _timestamp_json(cp.started_at), _timestamp_json(cp.completed_at)
    if not (
        type(route) is RouteKey
        and _nonempty(route.source_table)
        and _nonempty(route.target_table)
        and type(route.strategy) is Strategy
        and cp.status in _STATUS_VALUES
        and _nonempty(cp.run_id)
        and _nonempty(cp.query_hash)
        and _nonempty(cp.schema_hash)
        and started is not None
        and completed is not None
    ):
        return None
    head = f'{{"completed_at": {completed}, "diagnostics": '
    middle = (
        f', "query_hash": {_ENCODE_STRING(cp.query_hash)},'
        f' "route": {_ENCODER.encode(route.as_record())}, "rows_exported": '
    )
    tail = (
        f', "run_id": {_ENCODE_STRING(cp.run_id)},'
        f' "schema_hash": {_ENCODE_STRING(cp.schema_hash)}, "started_at": {started},'
        f' "status": {_ENCODE_STRING(str(cp.status))}}}'
    )
    return head, middle, tail


def _timestamp_json(value: datetime | None) -> str | None:
    """A timestamp's JSON, or None when the reader would refuse it (not canonical, naive)."""
    if value is None:
        return "null"
    raw = format_timestamp(value) or ""
    return _ENCODE_STRING(raw) if _canonical_text(raw) else None


_ENCODER = json.JSONEncoder(sort_keys=True, allow_nan=False)  # what json.dumps(...) builds
_ENCODE_STRING = json.encoder.encode_basestring_ascii


def _nonempty(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


@functools.lru_cache(maxsize=256)  # timestamps repeat across batches too
def _canonical_text(raw: str) -> bool:
    """What ``checkpoint_from_payload`` accepts for a timestamp text."""
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        return False
    return value.utcoffset() is not None and value.isoformat() == raw


def encode_object(value: Any, what: str) -> str:
    """JSON of a dict that reads back equal, so a store never silently changes a value."""
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a dict, got {type(value).__name__}")
    text = json.dumps(value, sort_keys=True, allow_nan=False)
    if json.loads(text) != value:
        raise ValueError(f"{what} must hold only JSON values (str keys, lists, finite numbers)")
    return text


def check_run_id(run_id: Any) -> None:
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("run_id must be a non-empty string")


_Row = tuple[str, ...]  # the five route values, partition id, payload JSON


def encode_batch(checkpoints: Iterable[PartitionCheckpoint]) -> list[_Row]:
    """One row per checkpoint; anything unreadable is refused before any write."""
    encoder = _BatchEncoder()
    return [
        (*route_params(cp.route), cp.partition_id, encoder.encode(cp))
        for cp in _checked(checkpoints)
    ]


def route_params(route: RouteKey) -> tuple[str, str, str, str, str]:
    return (
        route.source_table,
        route.target_table,
        str(route.strategy),
        route.source_location or "",
        route.target_location or "",
    )


def route_from_params(values: Sequence[Any]) -> RouteKey:
    """The route of five stored key values; ``ValueError`` or ``TypeError`` when invalid."""
    source, target, strategy, source_location, target_location = values
    return RouteKey(source, target, strategy, source_location or None, target_location or None)


def encode_resolution(
    route: RouteKey,
    checkpoints: Sequence[PartitionCheckpoint],
    audit: dict[str, Any],
    *,
    with_state: bool = False,
) -> tuple[list[_Row], str]:
    """Checked rows and audit JSON for ``apply_resolution``: every problem before any write.

    A resolution writes at least one checkpoint, unless it writes a source state.
    """
    rows = encode_batch(checkpoints)
    if not rows and not with_state:
        raise ValueError("a resolution writes at least one checkpoint")
    if any(cp.route.as_dict() != route.as_dict() for cp in checkpoints):
        raise ValueError("every resolved checkpoint must belong to the route of the resolution")
    if isinstance(audit, dict) and "audit_id" in audit:
        raise ValueError("the store assigns audit_id; the audit record must not hold it")
    return rows, encode_object(audit, "audit record")
