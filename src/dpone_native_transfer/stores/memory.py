"""In-process checkpoint, route-state and operator store.

It keeps JSON text, not objects, so it behaves like a durable store: what a
caller gets back never aliases what was stored, and a checkpoint that could not
be read back is refused on write instead of poisoning the store.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import attrs

from ..checkpoints import PartitionCheckpoint, RouteKey, checkpoint_from_payload
from ..errors import LeaseLost
from ..identity import fold_ascii
from ..lease import LeaseClaim, clock_epoch
from ._codec import (
    check_run_id,
    encode_batch,
    encode_object,
    encode_resolution,
    route_from_params,
    route_params,
)
from ._records import check_expected

__all__ = ["MemoryCheckpointStore"]


class MemoryCheckpointStore:
    """Checkpoints (latest and full history), source state, run evidence, audit and leases.

    Re-recording evidence for a run id replaces the record in place: ``list_evidence``
    is ordered by the first write of each run id. Leases are shared by every user of
    this one object (one process).
    """

    def __init__(self) -> None:
        self._history: dict[RouteKey, list[str]] = {}
        self._latest: dict[RouteKey, dict[str, tuple[int, str]]] = {}  # pid -> (seq, payload)
        self._source_state: dict[RouteKey, str] = {}
        self._evidence: dict[RouteKey, dict[str, str]] = {}
        self._audit: dict[RouteKey, list[tuple[int, str]]] = {}
        self._audit_ids = 0
        self._seq = 0
        self._leases = _MemoryLeases()

    def upsert(self, checkpoint: PartitionCheckpoint) -> None:
        self.upsert_many([checkpoint])

    def upsert_many(
        self, checkpoints: Iterable[PartitionCheckpoint], *, holding: LeaseClaim | None = None
    ) -> None:
        items = list(checkpoints)
        rows = encode_batch(items)
        with self._leases.holding(holding, items[0].route if items else None):
            self._write(rows)

    def _write(self, rows: list[tuple[str, ...]]) -> None:
        for row in rows:
            route, partition_id, text = route_from_params(row[:5]), row[5], row[6]
            self._seq += 1
            self._history.setdefault(route, []).append(text)
            self._latest.setdefault(route, {})[partition_id] = (self._seq, text)

    def _decoded(self, route: RouteKey) -> list[PartitionCheckpoint]:
        latest = self._latest.get(route, {})
        return [_decode(route, latest[pid][1]) for pid in sorted(latest)]

    def list_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        return self._decoded(route)

    def list_target_latest(self, route: RouteKey) -> list[PartitionCheckpoint]:
        """Every route's latest checkpoints into ``route``'s target table (``TargetScopeStore``)."""
        return [
            checkpoint
            for other in sorted(self._latest, key=route_params)
            if _same_target(other, route)
            for checkpoint in self._decoded(other)
        ]

    def adopt_unlocated(self, route: RouteKey) -> int:
        if not route.located:
            return 0
        twin = route.unlocated()
        rows = self._latest.pop(twin, {})
        own = self._latest.get(route, {})
        moved = [
            attrs.evolve(_decode(twin, text), route=route)
            for pid, (seq, text) in sorted(rows.items())
            if own.get(pid, (-1, ""))[0] < seq
        ]
        self.upsert_many(moved)
        if twin in self._source_state:
            self._source_state.setdefault(route, self._source_state.pop(twin))
        return len(rows)

    def history(self, route: RouteKey) -> list[PartitionCheckpoint]:
        """Every checkpoint written for ``route``, oldest first."""
        return [_decode(route, text) for text in self._history.get(route, [])]

    def load_source_state(self, route: RouteKey) -> dict[str, Any] | None:
        text = self._source_state.get(route)
        return None if text is None else json.loads(text)

    def save_source_state(
        self, route: RouteKey, state: dict[str, Any], *, holding: LeaseClaim | None = None
    ) -> None:
        text = encode_object(state, "source state")
        with self._leases.holding(holding, route):
            self._source_state[route] = text

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
        with self._leases.holding(holding, route):
            self._evidence.setdefault(route, {})[run_id] = text

    def list_evidence(self, route: RouteKey) -> list[dict[str, Any]]:
        return [json.loads(text) for text in self._evidence.get(route, {}).values()]

    def list_routes(self) -> list[RouteKey]:
        return sorted((r for r, latest in self._latest.items() if latest), key=route_params)

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
        rows, record = encode_resolution(
            route, checkpoints, audit, with_state=source_state is not None
        )
        state = None if source_state is None else encode_object(source_state, "source state")
        with self._leases.holding(holding, route):
            check_expected(expected, self._latest_of)
            self._write(rows)
            if state is not None:
                self._source_state[route] = state
            self._audit_ids += 1
            self._audit.setdefault(route, []).append((self._audit_ids, record))
            return self._audit_ids

    def _latest_of(self, checkpoint: PartitionCheckpoint) -> PartitionCheckpoint | None:
        found = self._latest.get(checkpoint.route, {}).get(checkpoint.partition_id)
        return None if found is None else _decode(checkpoint.route, found[1])

    def list_audit(self, route: RouteKey) -> list[dict[str, Any]]:
        return [{**json.loads(text), "audit_id": i} for i, text in self._audit.get(route, [])]

    def close(self) -> None:
        """Nothing to close: the store lives as long as the object."""

    def lease_table(self) -> _MemoryLeases:
        return self._leases


def _decode(route: RouteKey, text: str) -> PartitionCheckpoint:
    return checkpoint_from_payload(json.loads(text), copy_values=False, known_route=route)


def _same_target(route: RouteKey, target: RouteKey) -> bool:
    """``route`` writes ``target``'s table: same database, or unlocated, the name in any case."""
    if route.target_location is None:
        return fold_ascii(route.target_table) == fold_ascii(target.target_table)
    return (route.target_location, route.target_table) == (
        target.target_location,
        target.target_table,
    )


class _MemoryLeases:
    """``LeaseTable`` over a dict; the store's one object serves every lease of the process.

    A row is (token, expires_at, record, epoch); a released one keeps its epoch."""

    def __init__(self) -> None:
        self._rows: dict[str, tuple[str, float, str, int]] = {}
        self._lock = threading.RLock()

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
        with self._lock:
            held = self._rows.get(key, ("", 0.0, "", 0))
            if held[1] > now and held[0] != token and held[2] != replacing:
                return None
            epoch = max(held[3] + 1, clock_epoch(now))
            self._rows[key] = (token, expires_at, record, epoch)
            return epoch

    def raise_epoch(self, key: str, token: str, epoch: int) -> int | None:
        with self._lock:
            held = self._rows.get(key)
            if held is None or held[0] != token:
                return None
            self._rows[key] = (*held[:3], max(held[3], epoch))
            return self._rows[key][3]

    def renew(self, key: str, token: str, expires_at: float, record: str) -> bool:
        with self._lock:
            held = self._rows.get(key)
            if held is None or held[0] != token:
                return False
            self._rows[key] = (token, expires_at, record, held[3])
            return True

    def release(self, key: str, token: str) -> None:
        with self._lock:
            held = self._rows.get(key)
            if held is not None and held[0] == token:
                self._rows[key] = ("", 0.0, held[2], held[3])

    def holder(self, key: str, now: float) -> str | None:
        with self._lock:
            held = self._rows.get(key)
            return None if held is None or held[1] <= now else held[2]

    def holders(self, now: float) -> list[str]:
        with self._lock:
            return [held[2] for _, held in sorted(self._rows.items()) if held[1] > now]

    @contextlib.contextmanager
    def holding(self, claim: LeaseClaim | None, route: RouteKey | None) -> Iterator[None]:
        """Within, ``claim`` holds its lease unexpired (``LeaseLost`` else); no take meanwhile."""
        with self._lock:
            if claim is not None and route is not None:
                held = self._rows.get(claim.key)
                if held is None or held[0] != claim.token or held[1] <= time.time():
                    raise LeaseLost.lost(route)
            yield

    def close(self) -> None:
        """Nothing to close: the leases live as long as the store."""
