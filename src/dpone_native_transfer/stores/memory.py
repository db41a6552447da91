"""In-process checkpoint, route-state and operator store.

It keeps JSON text, not objects, so it behaves like a durable store: what a
caller gets back never aliases what was stored, and a checkpoint that could not
be read back is refused on write instead of poisoning the store.
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
    checkpoint_from_payload,
    checkpoint_to_payload,
)

__all__ = ["MemoryCheckpointStore"]


def _checked(checkpoints: Iterable[PartitionCheckpoint]) -> list[PartitionCheckpoint]:
    """All items, or a TypeError before anything is written."""
    items = list(checkpoints)
    for item in items:
        if not isinstance(item, PartitionCheckpoint):
            raise TypeError(f"expected PartitionCheckpoint, got {type(item).__name__}")
    return items


def _encode_checkpoint(checkpoint: PartitionCheckpoint) -> str:
    """Payload JSON; raises CheckpointPayloadInvalid for anything the reader would reject.

    The payload shares the checkpoint's dicts (``json.dumps`` only reads them).
    :func:`_readable` checks directly what ``checkpoint_from_payload`` would
    enforce on it; only when that check fails is the full round trip run, to
    raise the reader's precise error.
    """
    payload = checkpoint_to_payload(checkpoint, copy_values=False)
    if not _readable(checkpoint, payload):
        checkpoint_from_payload(payload)
    return json.dumps(payload, sort_keys=True, allow_nan=False)


def _readable(checkpoint: PartitionCheckpoint, payload: dict[str, Any]) -> bool:
    """True when ``checkpoint_from_payload(payload)`` would accept ``payload``.

    ``payload`` comes from ``checkpoint_to_payload``, so it has exactly the
    schema's keys. A False answer is conservative: the caller then runs the
    real parser, which either raises or accepts.
    """
    route = checkpoint.route
    if not (
        type(route) is RouteKey
        and _nonempty(route.source_table)
        and _nonempty(route.target_table)
        and type(route.strategy) is Strategy
        and payload["status"] in _STATUS_VALUES
    ):
        return False
    for field in ("partition_id", "run_id", "query_hash", "schema_hash"):
        if not _nonempty(payload[field]):
            return False
    rows = payload["rows_exported"]
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 0:
        return False
    for field in ("partition_bounds", "diagnostics"):
        if not isinstance(payload[field], dict) or not _is_json_safe(payload[field]):
            return False
    return _canonical_timestamp(payload["started_at"]) and _canonical_timestamp(
        payload["completed_at"]
    )


def _nonempty(value: Any) -> bool:
    return isinstance(value, str) and bool(value)


def _canonical_timestamp(raw: Any) -> bool:
    """What ``checkpoint_from_payload`` accepts for a timestamp field."""
    if raw is None:
        return True
    return isinstance(raw, str) and _canonical_text(raw)


@functools.lru_cache(maxsize=256)  # the checkpoints of one batch share their timestamps
def _canonical_text(raw: str) -> bool:
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        return False
    return value.utcoffset() is not None and value.isoformat() == raw


def _encode_object(value: Any, what: str) -> str:
    """JSON of a dict that reads back equal, so a store never silently changes a value."""
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a dict, got {type(value).__name__}")
    text = json.dumps(value, sort_keys=True, allow_nan=False)
    if json.loads(text) != value:
        raise ValueError(f"{what} must hold only JSON values (str keys, lists, finite numbers)")
    return text


def _check_run_id(run_id: Any) -> None:
    if not isinstance(run_id, str) or not run_id:
        raise ValueError("run_id must be a non-empty string")


_Row = tuple[str, str, str, str, str]  # source, target, strategy, partition id, payload JSON


def _encode_batch(checkpoints: Iterable[PartitionCheckpoint]) -> list[_Row]:
    """One row per checkpoint; anything unreadable is refused before any write."""
    return [
        (*_route_params(cp.route), cp.partition_id, _encode_checkpoint(cp))
        for cp in _checked(checkpoints)
    ]


def _route_params(route: RouteKey) -> tuple[str, str, str]:
    return (route.source_table, route.target_table, str(route.strategy))


def _encode_resolution(
    route: RouteKey, checkpoints: Sequence[PartitionCheckpoint], audit: dict[str, Any]
) -> tuple[list[_Row], str]:
    """Checked rows and audit JSON for ``apply_resolution``: every problem before any write."""
    rows = _encode_batch(checkpoints)
    if not rows:
        raise ValueError("a resolution writes at least one checkpoint")
    if any(cp.route != route for cp in checkpoints):
        raise ValueError("every resolved checkpoint must belong to the route of the resolution")
    if isinstance(audit, dict) and "audit_id" in audit:
        raise ValueError("the store assigns audit_id; the audit record must not hold it")
    return rows, _encode_object(audit, "audit record")


class MemoryCheckpointStore:
    """Checkpoints (latest and full history), source state, run evidence and audit, in memory.

    Re-recording evidence for a run id replaces the record in place: ``list_evidence``
    is ordered by the first write of each run id.
    """

    def __init__(self) -> None:
        self._history: dict[RouteKey, list[str]] = {}
        self._latest: dict[RouteKey, dict[str, str]] = {}
        self._source_state: dict[RouteKey, str] = {}
        self._evidence: dict[RouteKey, dict[str, str]] = {}
        self._audit: dict[RouteKey, list[tuple[int, str]]] = {}
        self._audit_ids = 0

    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        self.upsert_many([checkpoint])

    def upsert_many(self, checkpoints: Iterable[PartitionCheckpoint]) -> None:
        self._write(_encode_batch(checkpoints))

    def _write(self, rows: list[_Row]) -> None:
        for *route_params, partition_id, text in rows:
            route = RouteKey(*route_params)
            self._history.setdefault(route, []).append(text)
            self._latest.setdefault(route, {})[partition_id] = text

    def list_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        latest = self._latest.get(route, {})
        return [
            checkpoint_from_payload(json.loads(latest[pid]), copy_values=False, known_route=route)
            for pid in sorted(latest)
        ]

    def history(self, route: RouteKey) -> list[PartitionCheckpoint]:
        """Every checkpoint written for ``route``, oldest first."""
        return [
            checkpoint_from_payload(json.loads(text), copy_values=False, known_route=route)
            for text in self._history.get(route, [])
        ]

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        text = self._source_state.get(route)
        return None if text is None else json.loads(text)

    def save_source_state(self, route: RouteKey, state: dict[str, Any]) -> None:
        self._source_state[route] = _encode_object(state, "source state")

    def record_evidence(self, route: RouteKey, run_id: str, record: dict[str, Any]) -> None:
        _check_run_id(run_id)
        self._evidence.setdefault(route, {})[run_id] = _encode_object(record, "evidence record")

    def list_evidence(self, route: RouteKey) -> list[dict[str, Any]]:
        return [json.loads(text) for text in self._evidence.get(route, {}).values()]

    def list_routes(self) -> list[RouteKey]:
        return sorted((r for r, latest in self._latest.items() if latest), key=_route_params)

    def apply_resolution(
        self, route: RouteKey, checkpoints: Sequence[PartitionCheckpoint], audit: dict[str, Any]
    ) -> int:
        rows, record = _encode_resolution(route, checkpoints, audit)
        self._write(rows)
        self._audit_ids += 1
        self._audit.setdefault(route, []).append((self._audit_ids, record))
        return self._audit_ids

    def list_audit(self, route: RouteKey) -> list[dict[str, Any]]:
        return [{**json.loads(text), "audit_id": i} for i, text in self._audit.get(route, [])]
