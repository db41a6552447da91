"""Resume planning: which partitions this attempt owns, and which it may skip.

A route's work is cut into *generations*: one generation ends when a run
completes evidence and source-state advancement. Inside a generation the
partition set is pinned, so a retry recomputes the same partition ids and
skips what is durably committed:

- incremental_append with a cursor: partitions cover the cursor window
  ``(watermark, upto]``; a retry reuses the pending window's ``upto`` so rows
  that arrived meanwhile never change the ids of work already done. Edge
  partitions add the rows at the watermark, within ``lag`` below it or with a
  NULL cursor that the route has not loaded (``cursor_edge.py``);
- incremental_append without a cursor: partitions are the partition values;
  a committed value is never reloaded (new values are new work);
- full_refresh: bounds carry the generation, so each completed run starts a
  fresh reload, and any retried partition re-activates all of them. With a
  cursor column it loads every row up to the highest cursor at planning (and
  rows whose cursor is NULL), and records that as its watermark, so an
  incremental route of the same source can continue exactly where the refresh
  ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from .checkpoints import (
    FailureCode,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    Strategy,
    partition_id_for,
)
from .connectors._sql import range_partitions
from .connectors.contract import Source
from .cursor_edge import EdgePlan, plan_edge, top_of_window
from .errors import ConfigInvalid, RouteDefinitionChanged
from .latest import LatestCheckpoints, as_latest
from .payloads import Column, Merge, SourceShape
from .source_state import DEFINITION_KEY, SourceState, plain_value
from .spec import TransferSpec

__all__ = [
    "AttemptPlan",
    "ResumePlan",
    "RouteDefinition",
    "SourceWindow",
    "plan_attempt",
    "route_merge",
    "plan_resume",
    "plan_window",
]

# More partitions by value than this in one run: a warning suggests ranges (each partition is
# a checkpoint and a query, so an id-like column makes one per row).
MANY_PARTITIONS = 10_000


@attrs.frozen(kw_only=True)
class SourceWindow:
    """The slice of the source one generation covers."""

    generation: int
    watermark: Any = None
    cursor_after: Any = None
    cursor_upto: Any = None
    replaces: bool = False  # a full refresh: it loads the whole table, up to ``cursor_upto``

    def advanced_state(self) -> dict[str, Any]:
        """Source state to store once this generation's run has completed. A refresh's
        watermark is how far it loaded, None from an empty source: an older one kept there
        had an append route go on above rows the emptied target no longer held (exit 0)."""
        keeps = self.cursor_upto is None and not self.replaces
        watermark = self.watermark if keeps else self.cursor_upto
        return {"generation": self.generation + 1, "watermark": watermark}


@attrs.frozen(kw_only=True)
class ResumePlan:
    active: tuple[PartitionCheckpoint, ...]
    skipped: tuple[str, ...]


@attrs.frozen(kw_only=True)
class RouteDefinition:
    """What the meaning of an append route's state and checkpoints depends on: its partition
    and cursor columns and their kinds (a partition value 1 and 1.0 are other bounds), and
    how the partition column is cut (by value, or into ranges of about so many rows).
    Recorded as ``as_dict()`` in the source state, each checkpoint and the ledger entry."""

    partition_column: str
    cursor_column: str | None
    partition_kind: str | None
    cursor_kind: str | None
    partition_by: str
    partition_rows: int | None
    merge: Merge | None = None  # a merge route's key and deleted column are part of it

    def as_dict(self) -> dict[str, Any]:
        """The recorded form; a route that does not merge records what it did before merges."""
        recorded = attrs.asdict(self, filter=lambda field, _: field.name != "merge")
        if self.merge is not None:
            recorded["primary_key"] = list(self.merge.key)
            recorded["deleted_column"] = self.merge.deleted
        return recorded


def route_definition(
    source: Source, columns: Sequence[Column], merge: Merge | None = None
) -> RouteDefinition:
    """The route's definition as the source and its columns give it now."""
    kinds = {column.name: column.kind for column in columns}
    rows = source.partition_rows
    return RouteDefinition(
        partition_column=source.partition_column,
        cursor_column=source.cursor_column,
        partition_kind=kinds.get(source.partition_column),
        cursor_kind=None if source.cursor_column is None else kinds.get(source.cursor_column),
        partition_by="range" if rows else "value",
        partition_rows=rows or None,
        merge=merge,
    )


_DELETED_KINDS = ("boolean", "integer")  # a deleted column's true: true, or not 0


def route_merge(
    strategy: Strategy,
    source: Source,
    columns: Sequence[Column],
    *,
    primary_key: Sequence[str] | None,
    deleted_column: str | None,
) -> Merge | None:
    """A merge route's ``Merge``: its key (named, else the source table's own primary key),
    its cursor as the version and its deleted column, each a column of the source; None for
    a route that does not merge. Reads the source's catalog only, before any row."""
    if strategy is not Strategy.MERGE:
        return None
    key = tuple(primary_key) if primary_key is not None else source.primary_key()
    if not key:
        raise _merge_invalid(
            "source.primary_key",
            f"is required: source table {source.table!r} has no primary key of its own, so "
            "name the column(s) that identify a row",
        )
    kinds = {column.name: column.kind for column in columns}
    missing = [name for name in key if name not in kinds]
    if missing:
        raise _merge_invalid("source.primary_key", f"names no column of the source: {missing}")
    if deleted_column is not None:
        if deleted_column not in kinds:  # names match exactly, as the key's do
            raise _merge_invalid(
                "source.deleted_column", f"names no column of the source: {deleted_column!r}"
            )
        if kinds[deleted_column] not in _DELETED_KINDS:
            raise _merge_invalid(
                "source.deleted_column",
                "must name a boolean or integer column of the source (true or non-zero: deleted)",
            )
        if deleted_column in key or deleted_column == source.cursor_column:
            raise _merge_invalid("source.deleted_column", "must not be a key or cursor column")
    return Merge(key=key, version=source.cursor_column, deleted=deleted_column)


def _merge_invalid(key: str, problem: str) -> ConfigInvalid:
    return ConfigInvalid(f"{key} {problem}; nothing was read or written", diagnostics={"key": key})


# How partitions are cut: under a cursor the window decides which rows a run loads, and a
# pending window keeps its cuts (``_plan_window``), so only a cursorless route depends on it.
_CUTS = ("partition_by", "partition_rows")


def changed_keys(recorded: Mapping[str, Any], definition: Mapping[str, Any]) -> list[str]:
    """The keys of ``definition`` that differ from the ``recorded`` one and matter: keys an
    older release did not record pass, and so do the cuts of a route with a cursor."""
    windowed = definition.get("cursor_column") is not None
    return sorted(
        key
        for key in definition
        if key in recorded and recorded[key] != definition[key] and not (windowed and key in _CUTS)
    )


def check_definition(
    route: RouteKey,
    state: SourceState | None,
    latest: Iterable[PartitionCheckpoint],
    definition: RouteDefinition,
    *,
    recorded_in: str = "its stored state",
) -> None:
    """Refuse an append route whose partition or cursor column (or its kind) changed, or,
    without a cursor, how its partitions are cut (``changed_keys``).

    The watermark is a value of the old cursor column and committed partitions
    are values (or key ranges) of the old partition column: under new ones a run
    would append rows twice or skip them. The definition is read from the source
    state, or, when the state keeps none (a first run that failed, a restored
    store), from the route's checkpoints. Keys an older release did not record pass.
    """
    if not route.strategy.incremental:
        return
    stored = None if state is None else state.definition
    if not isinstance(stored, Mapping):
        recorded = (cp.diagnostics.get(DEFINITION_KEY) for cp in latest if _counts(cp))
        stored = next((d for d in recorded if isinstance(d, Mapping)), None)
    if stored is None:
        return
    now = definition.as_dict()
    changed = changed_keys(stored, now)
    if changed:
        was = ", ".join(f"{key} {stored.get(key)!r} -> {now[key]!r}" for key in changed)
        raise RouteDefinitionChanged(
            f"route {route.label} changed its {' and '.join(changed)} ({was}) since "
            f"{recorded_in}: a run would append committed rows again or skip rows; nothing was "
            "read or written. Put the old definition back, or start the route afresh on "
            "purpose: `dpone-transfer state reset` (see docs/incremental.md)",
            diagnostics={"route": route.as_dict(), "changed": changed},
        )


def _recorded(checkpoint: PartitionCheckpoint) -> Mapping[str, Any]:
    """The definition a checkpoint recorded (none: an older release's, which passes)."""
    recorded = checkpoint.diagnostics.get(DEFINITION_KEY)
    return recorded if isinstance(recorded, Mapping) else {}


def _counts(checkpoint: PartitionCheckpoint) -> bool:
    """Whether a checkpoint still describes the route (an operator did not forget it)."""
    return checkpoint.diagnostics.get("error") not in (FailureCode.NOT_IN_TARGET, FailureCode.RESET)


def plan_window(
    route: RouteKey,
    source: Source,
    state: SourceState | None,
    latest: Sequence[PartitionCheckpoint],
    *,
    definition: RouteDefinition | None = None,
    edge: EdgePlan | None = None,
) -> tuple[SourceWindow, list[dict[str, Any]]]:
    """The current generation's window and the bounds of each of its partitions.

    ``edge`` (an append with a cursor) adds the edge partitions: the partition
    values with rows at the watermark, within the lag or with a NULL cursor that
    the route has not loaded (``cursor_edge.py``). Their bounds carry the
    generation, so a retry keeps their ids and a later generation gets new ones.
    """
    window, bounds = _plan_window(route, source, state, latest, definition)
    if edge is not None and route.strategy.incremental:
        record, scan = edge.record, edge.scan
        g = window.generation
        ranged = {"cursor_from": record.since, "cursor_upto": record.upto, "generation": g}
        bounds += [{**part, **ranged} for part in _edge_parts(source, list(scan.ranged))]
        nulled = {"cursor_null": True, "generation": g}
        bounds += [{**part, **nulled} for part in _edge_parts(source, list(scan.nulled))]
    for item in bounds:
        for key, value in item.items():
            if key in (*_PART_KEYS, "cursor_after", "cursor_from", "cursor_upto"):
                _check_bound_value(source, key, value)
    return window, bounds


def _check_bound_value(source: Source, key: str, value: Any) -> None:
    """Partition and cursor values are stored in checkpoints and compared by every engine:
    integers, finite reals, text or NULL only. A BLOB or NaN is refused, naming the column."""
    if plain_value(value):
        return
    role, column = (
        ("partition", source.partition_column)
        if key in _PART_KEYS
        else ("cursor", source.cursor_column)
    )
    kind = "BLOB" if isinstance(value, bytes | bytearray | memoryview) else type(value).__name__
    raise ConfigInvalid(
        f"{role} column {column!r} holds a {kind} value; partition and cursor values must be "
        "integers, finite reals, text or NULL: choose another column",
        diagnostics={"column": column, "value_type": kind},
    )


def _plan_window(
    route: RouteKey,
    source: Source,
    state: SourceState | None,
    latest: Sequence[PartitionCheckpoint],
    definition: RouteDefinition | None,
) -> tuple[SourceWindow, list[dict[str, Any]]]:
    generation, watermark = (0, None) if state is None else (state.generation, state.watermark)
    if route.strategy is Strategy.MERGE and source.cursor_column is None:
        # a merge without a cursor reads the whole table each run (its bounds carry the
        # generation): updated rows are found wherever they are, and merged, not replaced
        window = SourceWindow(generation=generation, watermark=watermark)
        return window, [{"generation": generation, **part} for part in _partitions(source)]
    if route.strategy is Strategy.FULL_REFRESH:
        # an empty source is still refreshed: its one (NULL) partition reads no row, and the
        # replace empties the target in one transaction (a min_rows gate stops it first)
        parts = _partitions(source) or [{"partition": None}]
        # every attempt reloads the whole table: it reads up to the cursor's highest value now
        upto = None if source.cursor_column is None else source.max_cursor()
        window = SourceWindow(
            generation=generation, watermark=watermark, cursor_upto=upto, replaces=True
        )
        bounded = {} if upto is None else {"cursor_upto": upto, "cursor_nulls": True}
        return window, [{"generation": generation, **part, **bounded} for part in parts]
    if source.cursor_column is None:
        window = SourceWindow(generation=generation, watermark=watermark)
        return window, _partitions(source)
    # a window begun at this watermark is finished first, unless the target lost it (then the
    # window is planned afresh, up to the cursor's highest value now)
    pending = [
        cp.partition_bounds
        for cp in as_latest(latest).begun_at(watermark)
        if _counts(cp)
        and (definition is None or not changed_keys(_recorded(cp), definition.as_dict()))
    ]
    upto = (
        max(bounds["cursor_upto"] for bounds in pending)
        if pending
        else source.max_cursor(after=watermark)
    )
    window = SourceWindow(
        generation=generation, watermark=watermark, cursor_after=watermark, cursor_upto=upto
    )
    if upto is None:
        return window, []
    # a pending window keeps its partitions when it was cut into ranges, or is cut so now:
    # rows written into it meanwhile must not move a cut, and partitions by value must not
    # become ranges (or back), or what the earlier attempt committed would look new
    ranged = source.partition_rows
    if pending and (ranged or any("partition_from" in bounds for bounds in pending)):
        parts = list({_key(part): part for part in map(_part, pending)}.values())
    else:
        parts = _partitions(source, after=watermark, upto=upto)
    return window, [{**part, "cursor_after": watermark, "cursor_upto": upto} for part in parts]


_PART_KEYS = ("partition", "partition_from", "partition_below")


def _part(bounds: Mapping[str, Any]) -> dict[str, Any]:
    """The partition fragment of a partition's bounds (its value, or its key range)."""
    return {key: bounds[key] for key in _PART_KEYS if key in bounds}


def _key(part: Mapping[str, Any]) -> tuple:
    return tuple((key, repr(part.get(key))) for key in _PART_KEYS)


def _edge_parts(source: Source, values: list[Any]) -> list[dict[str, Any]]:
    """The partitions of an edge's rows of partition ``values``: one per value, or for a key
    cut into ranges one range of every key (and the NULL key's), as the edge is small."""
    if not source.partition_rows:
        return [{"partition": value} for value in values]
    keyed = any(value is not None for value in values)
    return range_partitions([], keyed=keyed, has_null=None in values)


def _partitions(source: Source, *, after: Any = None, upto: Any = None) -> list[dict[str, Any]]:
    """The partitions of the rows with a cursor in ``(after, upto]``: key ranges of a
    source with ``partition_rows``, else one per partition value."""
    if source.partition_rows:
        return source.partition_ranges(after=after, upto=upto)
    return [{"partition": value} for value in source.partition_values(after=after, upto=upto)]


def candidate_checkpoints(
    route: RouteKey,
    run_id: str,
    query_hash: str,
    schema_hash: str,
    bounds: Iterable[Mapping[str, Any]],
    *,
    definition: RouteDefinition | None = None,
) -> list[PartitionCheckpoint]:
    """This attempt's view of every partition in the window, before any resume decision."""
    return [
        PartitionCheckpoint(
            partition_id=partition_id_for(route, query_hash, schema_hash, item),
            route=route,
            status=PartitionCheckpointStatus.EXPORTED,
            run_id=run_id,
            query_hash=query_hash,
            schema_hash=schema_hash,
            partition_bounds=dict(item),
            diagnostics={} if definition is None else {DEFINITION_KEY: definition.as_dict()},
        )
        for item in bounds
    ]


def _committed_by_bounds(
    route: RouteKey,
    candidates: list[PartitionCheckpoint],
    latest: LatestCheckpoints,
    current: set[tuple[str, str]],
) -> set[str]:
    """The candidates whose bounds a checkpoint committed under other hashes covers."""
    done: set[str] = set()
    for hashes in latest.committed_hashes() - current:
        earlier = {
            partition_id_for(route, *hashes, cp.partition_bounds): cp.partition_id
            for cp in candidates
        }
        done |= {earlier[pid] for pid in latest.committed_with(earlier, *hashes)}
    return done


def plan_resume(
    route: RouteKey,
    candidates: Iterable[PartitionCheckpoint],
    latest: Sequence[PartitionCheckpoint],
) -> ResumePlan:
    """Skip partitions committed with the same query and schema; retry everything else.

    An append also skips a candidate whose bounds were committed under other
    hashes (an earlier query or schema of the route): it covers the same rows,
    and loading it again would append them twice. Its id differs only because
    the hashes enter the id.
    """
    latest = as_latest(latest)
    candidates = list(candidates)
    by_hashes: dict[tuple[str, str], list[str]] = {}
    for candidate in candidates:
        hashes = (candidate.query_hash, candidate.schema_hash)
        by_hashes.setdefault(hashes, []).append(candidate.partition_id)
    done = set().union(*(latest.committed_with(ids, *hashes) for hashes, ids in by_hashes.items()))
    if route.strategy is Strategy.INCREMENTAL_APPEND:
        done |= _committed_by_bounds(route, candidates, latest, set(by_hashes))
    active = [candidate for candidate in candidates if candidate.partition_id not in done]
    skipped = [candidate for candidate in candidates if candidate.partition_id in done]
    # the checkpoints of retried partitions are decoded, so a corrupt one stops the run here
    latest.checkpoints([candidate.partition_id for candidate in active])
    if route.strategy is Strategy.FULL_REFRESH and active:
        active, skipped = candidates, []
    return ResumePlan(active=tuple(active), skipped=tuple(cp.partition_id for cp in skipped))


@attrs.frozen(kw_only=True)
class AttemptPlan:
    """What one attempt does, all decided before any target I/O: the route's definition, its
    edge, the window and its partitions, and which of them it loads (``resume.active``)."""

    state: SourceState | None  # as stored (continued after another route's refresh)
    shape: SourceShape  # the source's columns, read once for the attempt
    definition: RouteDefinition
    edge: EdgePlan | None
    window: SourceWindow
    candidates: tuple[PartitionCheckpoint, ...]
    resume: ResumePlan
    top_since: Any  # the lowest cursor value the next edge record tracks (None: untracked)

    @property
    def upto(self) -> Any:
        """The watermark this attempt's window ends at."""
        return self.window.advanced_state()["watermark"]

    @property
    def many_partitions(self) -> bool:
        """Partitions by value beyond ``MANY_PARTITIONS``: ranges would suit the column."""
        return len(self.candidates) > MANY_PARTITIONS and self.definition.partition_by == "value"


def plan_attempt(
    spec: TransferSpec,
    route: RouteKey,
    latest: LatestCheckpoints,
    state: SourceState | None,
    shape: SourceShape,
) -> AttemptPlan:
    """Plan one attempt from the route's checkpoints and stored state: refuse a changed
    definition, read the edge, cut the window into partitions and decide which to load. An
    empty source is gated here too, before the target. Reads the source only."""
    source = spec.source
    merge = route_merge(
        route.strategy,
        source,
        shape.columns,
        primary_key=spec.primary_key,
        deleted_column=spec.deleted_column,
    )
    if merge is not None:
        source.check_key(merge.key)
    definition = route_definition(source, shape.columns, merge)
    check_definition(route, state, latest, definition)
    kind = definition.cursor_kind
    edge = plan_edge(
        route,
        source,
        state,
        shape.columns,
        kind=kind,
        lag=spec.lag,
        on_null_cursor=spec.on_null_cursor,
        chunk_rows=spec.chunk_rows,
        key=() if merge is None else merge.key,
    )
    window, bounds = plan_window(route, source, state, latest, definition=definition, edge=edge)
    candidates = candidate_checkpoints(
        route, spec.run_id, shape.query_hash, shape.schema_hash, bounds, definition=definition
    )
    resume = plan_resume(route, candidates, latest)
    if not candidates and spec.governance.enabled and not source.partition_values():
        spec.governance.check(route, 0)  # an empty source is gated too, before the target
    upto = window.advanced_state()["watermark"]
    return AttemptPlan(
        state=state,
        shape=shape,
        definition=definition,
        edge=edge,
        window=window,
        candidates=tuple(candidates),
        resume=resume,
        top_since=None if edge is None else top_of_window(source, upto, spec.lag, kind),
    )
