"""A route's source state: what the store keeps of it between runs.

One JSON object per route (``RouteStateStore.save_source_state``): the
``generation`` the next run plans, the ``watermark`` its window starts above,
the cursor ``edge`` record (``cursor_edge.py``) and the route ``definition``
(``planner.route_definition``). ``SourceState`` reads it typed and writes the
same keys back; a key this release does not know is kept as it was.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .checkpoints import RouteKey
from .column_types import Column
from .errors import CheckpointStoreCorrupt

__all__ = [
    "DEFINITION_KEY",
    "EDGE_KEY",
    "Edge",
    "Seen",
    "SourceState",
    "plain_value",
    "unknown_edge",
]

EDGE_KEY = "edge"
DEFINITION_KEY = "definition"  # in the source state and in every checkpoint's diagnostics

Seen = Counter  # (cursor value, row digest) -> how many such rows the route loaded


@attrs.frozen(kw_only=True)
class Edge:
    """What the route loaded at its watermark ``upto``.

    Rows with a cursor in ``[since, upto]`` (``since`` None: not tracked) and,
    when ``nulls``, rows with a NULL cursor, that are not in ``rows``, were not
    loaded. ``columns`` are the columns the digests cover.
    """

    upto: Any = None
    since: Any = None
    nulls: bool = True
    columns: tuple[str, ...] = ()
    rows: Seen = attrs.field(factory=Counter)

    @classmethod
    def of_state(cls, route: RouteKey, state: SourceState | None) -> Edge:
        if state is None:  # a new route: nothing loaded yet
            return cls()
        watermark, record = state.watermark, state.edge
        if record is None:  # an older release: the exclusive bound; NULL rows never loaded
            return cls(upto=watermark)
        try:
            rows: Seen = Counter()
            for value, digest, count in record["rows"]:
                if not (isinstance(digest, str) and isinstance(count, int) and count > 0):
                    raise TypeError
                rows[(value, digest)] += count
            edge = cls(
                upto=record["upto"],
                since=record["since"],
                nulls=record["nulls"] is True,
                columns=tuple(str(name) for name in record["columns"]),
                rows=rows,
            )
        except (KeyError, TypeError, ValueError):
            raise _corrupt(route, EDGE_KEY) from None
        if edge.upto != watermark:  # a state rewritten without it: nothing is known
            return cls(upto=watermark, nulls=False)
        return edge

    def as_state(self) -> dict[str, Any]:
        return {
            "upto": self.upto,
            "since": self.since,
            "nulls": self.nulls,
            "columns": list(self.columns),
            "rows": [[value, digest, count] for (value, digest), count in self.rows.items()],
        }

    def matching(self, columns: Sequence[Column]) -> Edge:
        """The record as the source's ``columns`` can match it: a new one digests them all; one
        whose digests cover a column the source no longer has (dropped, renamed) is unknown."""
        names = tuple(column.name for column in columns)
        if not self.columns:
            return attrs.evolve(self, columns=names)
        if set(self.columns) <= set(names):
            return self
        return Edge(upto=self.upto, nulls=False, columns=names)

    def digest_indexes(self, columns: Sequence[Column]) -> list[int]:
        """Where the record's columns are in ``columns`` (a ``matching`` record's are there)."""
        names = [column.name for column in columns]
        return [names.index(name) for name in self.columns]


def _corrupt(route: RouteKey, field: str) -> CheckpointStoreCorrupt:
    return CheckpointStoreCorrupt(
        "the stored source state of the route is malformed",
        diagnostics={"route": route.as_dict(), "field": field},
    )


def plain_value(value: Any) -> bool:
    """NULL, an integer, a finite real or text: what a cursor (or partition) value may be."""
    if value is None or isinstance(value, str):
        return True
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


@attrs.frozen(kw_only=True)
class SourceState:
    """A route's source state, as stored: the next generation, the watermark its window
    starts above, the edge record (read by ``Edge.of_state``) and the route definition
    the state was written under (None: not recorded)."""

    generation: int = 0
    watermark: Any = None
    edge: Any = None
    definition: Any = None

    @classmethod
    def read(cls, route: RouteKey, stored: Mapping[str, Any] | None) -> SourceState | None:
        """The state a store gave (None: the route never completed a run); a generation that
        is not a count, or a watermark that is not a plain value, is a corrupt store."""
        if stored is None:
            return None
        generation = stored.get("generation")
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            raise _corrupt(route, "generation")
        watermark = stored.get("watermark")
        if not plain_value(watermark):  # it is compared in the source's SQL: a plain value only
            raise _corrupt(route, "watermark")
        return cls(
            generation=generation,
            watermark=watermark,
            edge=stored.get(EDGE_KEY),
            definition=stored.get(DEFINITION_KEY),
        )

    def realigned(self, watermark: Any) -> SourceState:
        """The state continued where another route's full refresh of the table ended: its
        watermark, nothing known at the edge, no definition (the checkpoints have it). No
        watermark (a refresh that loaded no row, or a merge route's whole source again):
        the state of a route's first run, at this generation."""
        if watermark is None:
            return SourceState(generation=self.generation)
        edge = Edge(upto=watermark, nulls=False).as_state()
        return SourceState(generation=self.generation, watermark=watermark, edge=edge)

    def stored(self) -> dict[str, Any]:
        """The JSON object the store keeps, with the keys ``read`` reads."""
        state: dict[str, Any] = {"generation": self.generation, "watermark": self.watermark}
        if self.definition is not None:
            state[DEFINITION_KEY] = self.definition
        if self.edge is not None:
            state[EDGE_KEY] = self.edge
        return state


def unknown_edge(watermark: Any) -> dict[str, Any]:
    """The record of a state rewritten by an operator or a refresh: nothing known at the edge,
    so the range falls back to the exclusive bound and, under ``load_once``, the NULL-cursor
    rows the source holds at the next run are taken as loaded (``scan_edge``)."""
    return {EDGE_KEY: Edge(upto=watermark, nulls=False).as_state()}
