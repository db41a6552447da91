"""Range routing: which of a plan's key ranges holds a key value, decided in Python as
SQLite's ``>=`` and ``<`` decide it (``SQLiteSource.range_route``), so one scan of the table
can hand each row to its range."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["RangeRoute"]


def _sqlite_order(value: Any) -> tuple:
    """``value``'s place in SQLite's BINARY order: NULL, numbers (integers and reals compared
    exactly, as Python does), texts (UTF-8 bytes: code points), BLOBs (bytes). TypeError for
    a value SQLite does not store."""
    if value is None:
        return (0,)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    if isinstance(value, bytes):
        return (3, value)
    raise TypeError(type(value).__name__)


@attrs.frozen
class RangeRoute:
    """Which of sorted, disjoint key ranges holds a value, by bisection of their lower edges."""

    lows: list[tuple]
    highs: list[tuple | None]
    partitions: list[int]
    null_partition: int | None
    # The edges as numbers (unbounded: infinite), when all are integers: an integer key is
    # then placed without ``_sqlite_order``, which is slow (figures: docs/performance.md, fix 56).
    numbers: tuple[list[float], list[float]] | None = None

    @classmethod
    def of(
        cls, ranges: Sequence[int], edges: Sequence[Any], *, null_partition: int | None
    ) -> RangeRoute | None:
        """The route of the ranges numbered ``ranges``, whose ``(from, below)`` edges are
        ``edges`` in turn (as the key stores them); None when they overlap or SQLite would
        order an edge otherwise than ``_sqlite_order`` does."""
        try:
            cuts = sorted(
                (
                    _sqlite_order(low),  # an unbounded low is (0,): below every key
                    None if high is None else _sqlite_order(high),
                    partition,
                )
                for partition, low, high in zip(ranges, edges[::2], edges[1::2], strict=True)
            )
        except TypeError:
            return None
        for (_, high, _), (low, _, _) in itertools.pairwise(cuts):
            if high is None or high > low:
                return None  # overlapping ranges: a row would belong to two
        lows, highs = [c[0] for c in cuts], [c[1] for c in cuts]
        numbers = None
        if all(type(edge) is int for edge in edges if edge is not None):
            infinite = float("inf")
            numbers = (
                [-infinite if low == (0,) else low[1] for low in lows],
                [infinite if high is None else high[1] for high in highs],
            )
        return cls(lows, highs, [c[2] for c in cuts], null_partition, numbers)

    def __call__(self, value: Any) -> int | None:
        if value is None:
            return self.null_partition
        if self.numbers is not None and type(value) is int:
            lows, highs = self.numbers
            at = bisect.bisect_right(lows, value) - 1
            return self.partitions[at] if at >= 0 and value < highs[at] else None
        order = _sqlite_order(value)
        at = bisect.bisect_right(self.lows, order) - 1
        if at < 0:
            return None
        high = self.highs[at]
        return self.partitions[at] if high is None or order < high else None
