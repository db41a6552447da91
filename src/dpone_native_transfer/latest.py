"""A route's latest checkpoints as the route scan and the resume planner read them.

Decoding and validating a checkpoint payload costs tens of microseconds; at
100,000 partitions that is seconds before every run, spent mostly on healthy
committed partitions. So a store may hand back, per partition, the few fields
those two readers look at (status, query and schema hashes, the raw guard
JSON) beside the payload, and a payload is decoded, fully validated, only when
its item is read. The SQLite store keeps these fields as generated columns of
the payload, so they can never disagree with it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload

from .checkpoints import GUARD_DIAGNOSTICS_KEY, PartitionCheckpoint, PartitionCheckpointStatus

__all__ = ["LatestCheckpoints", "LatestRow", "as_latest"]

LatestRow = tuple[Any, ...]
"""``(partition_id, status, query_hash, schema_hash, guard_json, *payload)``; ``guard_json``
is None when the checkpoint has no guard. The rest is whatever the store's decoder takes."""

_ID, _STATUS, _QUERY, _SCHEMA, _GUARD = range(5)
_UNREADABLE = ""  # a guard that cannot be summarised: the scan must read the checkpoint itself


class LatestCheckpoints(Sequence[PartitionCheckpoint]):
    """Latest checkpoint of every partition of one route, sorted by partition id, decoded lazily."""

    __slots__ = ("_decode", "_decoded", "_positions", "_rows")

    def __init__(
        self, rows: Sequence[LatestRow], decode: Callable[[LatestRow], PartitionCheckpoint]
    ) -> None:
        self._rows = rows
        self._decode = decode
        self._decoded: dict[int, PartitionCheckpoint] = {}
        self._positions: dict[str, int] | None = None

    @classmethod
    def of(cls, checkpoints: Iterable[PartitionCheckpoint]) -> LatestCheckpoints:
        """Wrap checkpoints that are already decoded (stores without summary fields)."""
        items = list(checkpoints)
        rows = [
            (cp.partition_id, str(cp.status), cp.query_hash, cp.schema_hash, _guard_json(cp), i)
            for i, cp in enumerate(items)
        ]
        return cls(rows, lambda row: items[row[-1]])

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> PartitionCheckpoint: ...

    @overload
    def __getitem__(self, index: slice) -> list[PartitionCheckpoint]: ...

    def __getitem__(self, index: int | slice) -> PartitionCheckpoint | list[PartitionCheckpoint]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self._rows)))]
        position = range(len(self._rows))[index]  # IndexError and negative indexes as a list
        checkpoint = self._decoded.get(position)
        if checkpoint is None:
            checkpoint = self._decoded[position] = self._decode(self._rows[position])
        return checkpoint

    def __iter__(self) -> Iterator[PartitionCheckpoint]:
        return (self[i] for i in range(len(self._rows)))

    def __eq__(self, other: object) -> bool:
        """Equal to a list or tuple of the same checkpoints, like the list it stands for."""
        if isinstance(other, LatestCheckpoints | list | tuple):
            if len(self) != len(other):
                return False
            return all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a sequence view, unhashable like a list

    def __repr__(self) -> str:
        return f"LatestCheckpoints({len(self._rows)} partitions)"

    def get(self, partition_id: str) -> PartitionCheckpoint | None:
        position = self._position(partition_id)
        return None if position is None else self[position]

    def _position(self, partition_id: str) -> int | None:
        if self._positions is None:
            self._positions = {row[_ID]: i for i, row in enumerate(self._rows)}
        return self._positions.get(partition_id)

    def committed_with(self, partition_id: str, query_hash: str, schema_hash: str) -> bool:
        """True when the partition's latest checkpoint is COMMITTED with these hashes.

        Answered from the summary fields; the checkpoint is not decoded.
        """
        position = self._position(partition_id)
        if position is None:
            return False
        row = self._rows[position]
        return (
            row[_STATUS] == PartitionCheckpointStatus.COMMITTED.value
            and row[_QUERY] == query_hash
            and row[_SCHEMA] == schema_hash
        )

    def guarded_ids(self) -> list[str]:
        """Partition ids whose latest checkpoint carries a guard (of any shape)."""
        return [row[_ID] for row in self._rows if row[_GUARD] is not None]

    def guard_groups(self) -> dict[tuple[str, str], list[int]]:
        """Positions of the guarded checkpoints, grouped by (status, guard JSON text).

        Whether a guard blocks depends only on its status and guard map, so a
        reader can judge each group once. Steady state: one group per batch.
        """
        groups: dict[tuple[str, str], list[int]] = {}
        for position, row in enumerate(self._rows):
            if row[_GUARD] is not None:
                groups.setdefault((row[_STATUS], row[_GUARD]), []).append(position)
        return groups

    @staticmethod
    def parse_guard(text: str) -> Any:
        """The guard map of a group key; raises ValueError when the text is not one JSON value."""
        return json.loads(text, object_pairs_hook=_no_duplicates)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        raise ValueError("duplicate key")
    return result


def _guard_json(checkpoint: PartitionCheckpoint) -> str | None:
    if GUARD_DIAGNOSTICS_KEY not in checkpoint.diagnostics:
        return None
    try:
        return json.dumps(checkpoint.diagnostics[GUARD_DIAGNOSTICS_KEY], allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return _UNREADABLE


def as_latest(checkpoints: Sequence[PartitionCheckpoint]) -> LatestCheckpoints:
    """What a store returned, as ``LatestCheckpoints`` (third-party stores may return lists)."""
    if isinstance(checkpoints, LatestCheckpoints):
        return checkpoints
    return LatestCheckpoints.of(checkpoints)
