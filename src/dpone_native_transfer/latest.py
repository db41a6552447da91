"""A route's latest checkpoints, queried by the route scan and the planner rather than loaded.

Decoding and validating every payload would cost each run time in proportion to
its partitions (figures: docs/performance.md, fix 5), spent mostly on healthy
committed partitions. So a store may answer the few questions a run asks (how
many, which guards exist, which partitions are committed with these hashes, this
partition's checkpoint) from summary fields it keeps beside each payload, and
decode a payload only when the run acts on that partition. The SQLite store
keeps these fields as summary columns, written from each checkpoint and, for
any other writer, by triggers from the payload. Iterating or indexing still
gives every checkpoint, decoded. A view may hold one route's checkpoints or
those of every route writing one target table (``list_target_latest``).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, overload

from .checkpoints import (
    GUARD_DIAGNOSTICS_KEY,
    LEDGER_BATCH_KEY,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    strict_json,
)

__all__ = ["LatestCheckpoints", "LatestReader", "as_latest", "begun_at", "guard_json"]

_UNREADABLE = ""  # a guard that cannot be summarised: the scan must read the checkpoint itself


class LatestReader(Protocol):
    """What a store answers about one route's latest checkpoints (see ``LatestCheckpoints``)."""

    def count(self) -> int: ...

    def all(self) -> list[PartitionCheckpoint]:
        """Every checkpoint, decoded, sorted by partition id."""

    def guard_groups(self) -> dict[tuple[str, str], int]:
        """Guarded checkpoints counted by (status, guard JSON text)."""

    def in_group(self, status: str, guard: str) -> list[PartitionCheckpoint]:
        """The checkpoints of one guard group, decoded, sorted by partition id."""

    def guarded_ids(self) -> list[str]: ...

    def ledger_batches(self) -> dict[str, tuple[int, int]]:
        """Per ledger batch id: how many checkpoints are committed, how many are not."""

    def summaries(self, partition_ids: Collection[str]) -> dict[str, tuple[str, str, str]]:
        """(status, query hash, schema hash) of those of ``partition_ids`` that exist."""

    def committed_hashes(self) -> set[tuple[str, str]]:
        """The (query hash, schema hash) pairs of the committed checkpoints."""

    def checkpoints(self, partition_ids: Collection[str]) -> dict[str, PartitionCheckpoint]:
        """Those of ``partition_ids`` that exist, decoded."""

    def begun_at(self, watermark: Any) -> list[PartitionCheckpoint]:
        """The checkpoints of windows begun at ``watermark`` (``begun_at``), decoded."""


class LatestCheckpoints(Sequence[PartitionCheckpoint]):
    """Latest checkpoint of every partition of one route, sorted by partition id.

    A ``Sequence``: indexing and iteration decode every checkpoint once. The
    other methods answer without decoding what they do not return.
    """

    __slots__ = ("_all", "_count", "_reader")

    def __init__(self, reader: LatestReader) -> None:
        self._reader = reader
        self._all: list[PartitionCheckpoint] | None = None
        self._count: int | None = None

    @classmethod
    def of(cls, checkpoints: Iterable[PartitionCheckpoint]) -> LatestCheckpoints:
        """Wrap checkpoints that are already decoded (stores without summary fields)."""
        return cls(_DecodedReader(sorted(checkpoints, key=lambda cp: cp.partition_id)))

    def _loaded(self) -> list[PartitionCheckpoint]:
        if self._all is None:
            self._all = self._reader.all()
        return self._all

    def __len__(self) -> int:
        if self._all is not None:
            return len(self._all)
        if self._count is None:
            self._count = self._reader.count()
        return self._count

    @overload
    def __getitem__(self, index: int) -> PartitionCheckpoint: ...

    @overload
    def __getitem__(self, index: slice) -> list[PartitionCheckpoint]: ...

    def __getitem__(self, index: int | slice) -> PartitionCheckpoint | list[PartitionCheckpoint]:
        return self._loaded()[index]

    def __iter__(self) -> Iterator[PartitionCheckpoint]:
        return iter(self._loaded())

    def __eq__(self, other: object) -> bool:
        """Equal to a list or tuple of the same checkpoints, like the list it stands for."""
        if isinstance(other, LatestCheckpoints | list | tuple):
            return self._loaded() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a sequence view, unhashable like a list

    def __repr__(self) -> str:
        return f"LatestCheckpoints({len(self)} partitions)"

    def get(self, partition_id: str) -> PartitionCheckpoint | None:
        return self._reader.checkpoints([partition_id]).get(partition_id)

    def checkpoints(self, partition_ids: Collection[str]) -> dict[str, PartitionCheckpoint]:
        """The checkpoints of those partitions that have one, decoded and validated."""
        return self._reader.checkpoints(partition_ids)

    def committed_with(
        self, partition_ids: Collection[str], query_hash: str, schema_hash: str
    ) -> set[str]:
        """Those of ``partition_ids`` whose checkpoint is COMMITTED with these hashes."""
        committed = (PartitionCheckpointStatus.COMMITTED.value, query_hash, schema_hash)
        found = self._reader.summaries(partition_ids)
        return {pid for pid, summary in found.items() if summary == committed}

    def committed_hashes(self) -> set[tuple[str, str]]:
        """Every (query hash, schema hash) under which a partition was committed."""
        return self._reader.committed_hashes()

    def begun_at(self, watermark: Any) -> list[PartitionCheckpoint]:
        """The checkpoints of the windows begun at ``watermark`` (``begun_at``), sorted by
        partition id: asked of the store, not found by decoding every checkpoint. A route
        keeps one per partition of every window it loaded, and decoding them all made each
        run slower with the route's age (20,000: 1.1 s of a run with nothing new)."""
        return self._reader.begun_at(watermark)

    def guarded_ids(self) -> list[str]:
        """Partition ids whose latest checkpoint carries a guard (of any shape)."""
        return self._reader.guarded_ids()

    def ledger_batches(self) -> dict[str, tuple[int, int]]:
        """Per ledger batch id (``diagnostics["ledger_batch_id"]``): (committed, other) counts."""
        return self._reader.ledger_batches()

    def guard_groups(self) -> dict[tuple[str, str], int]:
        """Guarded checkpoints counted by (status, guard JSON text).

        Whether a guard blocks depends only on its status and guard map, so a
        reader can judge each group once. Steady state: one group per batch.
        """
        return self._reader.guard_groups()

    def in_group(self, status: str, guard: str) -> list[PartitionCheckpoint]:
        return self._reader.in_group(status, guard)

    @staticmethod
    def parse_guard(text: str) -> Any:
        """The guard map of a group key; raises ValueError when the text is not one JSON value."""
        return strict_json(text)


def guard_json(checkpoint: PartitionCheckpoint) -> str | None:
    """The group text of a decoded checkpoint's guard; None without one."""
    if GUARD_DIAGNOSTICS_KEY not in checkpoint.diagnostics:
        return None
    try:
        guard = checkpoint.diagnostics[GUARD_DIAGNOSTICS_KEY]
        return json.dumps(guard, allow_nan=False, sort_keys=True)  # keys sorted as in payloads
    except (TypeError, ValueError, RecursionError):
        return _UNREADABLE


class _DecodedReader:
    """``LatestReader`` over checkpoints already in memory."""

    def __init__(self, items: list[PartitionCheckpoint]) -> None:
        self._items = items
        self._by_id: Mapping[str, PartitionCheckpoint] = {cp.partition_id: cp for cp in items}

    def count(self) -> int:
        return len(self._items)

    def all(self) -> list[PartitionCheckpoint]:
        return list(self._items)

    def _groups(self) -> Iterator[tuple[tuple[str, str], PartitionCheckpoint]]:
        for cp in self._items:
            text = guard_json(cp)
            if text is not None:
                yield (str(cp.status), text), cp

    def guard_groups(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for key, _ in self._groups():
            counts[key] = counts.get(key, 0) + 1
        return counts

    def in_group(self, status: str, guard: str) -> list[PartitionCheckpoint]:
        return [cp for key, cp in self._groups() if key == (status, guard)]

    def guarded_ids(self) -> list[str]:
        return [cp.partition_id for _, cp in self._groups()]

    def ledger_batches(self) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for cp in self._items:
            batch = cp.diagnostics.get(LEDGER_BATCH_KEY)
            if batch is None:
                continue
            done, other = found.get(batch, (0, 0))
            committed = cp.status is PartitionCheckpointStatus.COMMITTED
            found[batch] = (done + 1, other) if committed else (done, other + 1)
        return found

    def summaries(self, partition_ids: Collection[str]) -> dict[str, tuple[str, str, str]]:
        found = self.checkpoints(partition_ids)
        return {pid: (str(cp.status), cp.query_hash, cp.schema_hash) for pid, cp in found.items()}

    def checkpoints(self, partition_ids: Collection[str]) -> dict[str, PartitionCheckpoint]:
        return {pid: self._by_id[pid] for pid in partition_ids if pid in self._by_id}

    def committed_hashes(self) -> set[tuple[str, str]]:
        committed = PartitionCheckpointStatus.COMMITTED
        return {(cp.query_hash, cp.schema_hash) for cp in self._items if cp.status is committed}

    def begun_at(self, watermark: Any) -> list[PartitionCheckpoint]:
        return [cp for cp in self._items if begun_at(cp.partition_bounds, watermark)]


def begun_at(bounds: Mapping[str, Any], watermark: Any) -> bool:
    """Whether a partition's ``bounds`` are of a window begun at ``watermark``: a window's
    (``cursor_upto``) whose ``cursor_after`` is the watermark."""
    return "cursor_upto" in bounds and bounds.get("cursor_after") == watermark


def as_latest(checkpoints: Sequence[PartitionCheckpoint]) -> LatestCheckpoints:
    """What a store returned, as ``LatestCheckpoints`` (third-party stores may return lists)."""
    if isinstance(checkpoints, LatestCheckpoints):
        return checkpoints
    return LatestCheckpoints.of(checkpoints)
