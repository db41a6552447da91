"""Cursor edges: which rows at and just below an append route's watermark it has loaded.

An append route with a cursor loads the window ``(watermark, upto]``. A row
written later *at* the watermark value (a tie), below it but within ``lag``
(a late row), or with a NULL cursor (``on_null_cursor = "load_once"``) lies
in no later window. The edge record, kept in the route's source state,
holds a digest of each row the route loaded at the top of its window (cursor
in ``[upto - lag, upto]``) and of each NULL-cursor row it loaded, so the next
run loads exactly the rows there it has not: a multiset difference, so two
identical rows are two rows.

A part of the record that could not be kept exactly (over ``MAX_EDGE_ROWS``
digests, a lazy plan whose top rows changed during its load, a crash between
commit and state on a lazy plan, a dropped digest column) is dropped: the
route then falls back to the exclusive bound, which never loads a row twice
but does not see later ties there. A state without a
record (an older release) means the same for the range; such releases never
loaded NULL-cursor rows, so those are all still to load.
"""

from __future__ import annotations

import datetime
import decimal
import hashlib
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from .checkpoints import PartitionCheckpoint, RouteKey
from .connectors.contract import Source
from .errors import ConfigInvalid, CursorNull
from .payloads import Column, cursor_window
from .source_state import EDGE_KEY, Edge, Seen, SourceState, unknown_edge

__all__ = [
    "EDGE_KEY",
    "EDGE_ROWS_KEY",
    "MAX_EDGE_ROWS",
    "Edge",
    "EdgePlan",
    "EdgeScan",
    "EdgeTracker",
    "advanced_edge",
    "check_lag",
    "is_edge",
    "lag_since",
    "plan_edge",
    "refuse_null_cursor",
    "row_digest",
    "scan_edge",
    "top_of_window",
    "unknown_edge",
]

EDGE_ROWS_KEY = "edge_rows"  # in each checkpoint's diagnostics; ``EDGE_KEY`` in the source state
MAX_EDGE_ROWS = 10_000  # digests kept per part of the record (range, NULLs): ~0.5 MB of state
_LAG_KINDS = frozenset({"integer", "real", "date", "timestamp"})
_INT64_MIN = -(2**63)  # the lowest integer SQLite and PostgreSQL hold


def row_digest(row: Sequence[Any], indexes: Sequence[int]) -> str:
    """A digest of the row's values at ``indexes``: equal rows, equal digests, across runs."""
    values = tuple(bytes(row[i]) if isinstance(row[i], memoryview) else row[i] for i in indexes)
    return hashlib.blake2b(repr(values).encode(), digest_size=12).hexdigest()


def _edge_digest(row: Sequence[Any], indexes: Sequence[int], keyed: Sequence[int]) -> str:
    """A row's digest in the record: ``row_digest``; on a merge route (``keyed``: where its
    key's columns are) after its key's digest and a ``/``. (An earlier release replaced a
    key's versions by it; kept so that the records it wrote still match.)"""
    digest = row_digest(row, indexes)
    return f"{row_digest(row, keyed)}/{digest}" if keyed else digest


def _keyed(columns: Sequence[Column], key: Sequence[str]) -> list[int]:
    names = [column.name for column in columns]
    return [names.index(name) for name in key]


def _key(value: Any, kind: str | None) -> Any:
    """A cursor value as Python compares it like the source: a decimal's text as its number."""
    if kind == "decimal" and isinstance(value, str):
        try:
            return decimal.Decimal(value)
        except decimal.InvalidOperation:
            return value
    return value


def _at_or_above(value: Any, since: Any, kind: str | None) -> bool:
    """Whether a cursor value lies in the tracked top ``[since, ...]`` of a window; NULL never."""
    if value is None or since is None:
        return False
    try:
        return _key(value, kind) >= _key(since, kind)
    except (TypeError, ArithmeticError):  # one kind only (``max_cursor``); a decimal NaN
        return False


def lag_since(upto: Any, lag: float, kind: str | None) -> Any:
    """The lowest cursor value ``lag`` below ``upto``: numbers, dates (days) and timestamps
    (seconds, ISO text as SQLite and the PostgreSQL source give them)."""
    if not lag:
        return upto
    if kind in ("integer", "real") and isinstance(upto, int | float):
        since = upto - lag  # below the lowest SQL integer, a double: every engine binds one
        return float(since) if isinstance(since, int) and since < _INT64_MIN else since
    if kind == "date" and isinstance(upto, str):
        return (datetime.date.fromisoformat(upto) - datetime.timedelta(days=lag)).isoformat()
    if kind == "timestamp" and isinstance(upto, str) and len(upto) >= 19:
        moment = datetime.datetime.fromisoformat(upto) - datetime.timedelta(seconds=lag)
        return moment.isoformat(sep=upto[10], timespec="seconds")
    raise ConfigInvalid(
        "source.lag needs a number, date or timestamp cursor column",
        diagnostics={"key": "source.lag", "cursor_kind": kind},
    )


def check_lag(lag: Any, kind: str | None) -> None:
    """Refuse, before any read, a lag the cursor's kind cannot be moved back by."""
    if lag and kind not in _LAG_KINDS:
        raise ConfigInvalid(
            f"source.lag needs a cursor column of kind {', '.join(sorted(_LAG_KINDS))} "
            f"(this one is {kind})",
            diagnostics={"key": "source.lag", "cursor_kind": kind},
        )


def refuse_null_cursor(route: RouteKey, column: str, unloaded: int) -> None:
    """Refuse NULL-cursor rows that no window will load, under ``on_null_cursor = "error"``."""
    if unloaded:
        raise CursorNull(
            f"cursor column {column!r} is NULL in {unloaded:,} source row(s) that no window "
            "would load; nothing was read into the target. Fill the column, or set "
            '[source] on_null_cursor = "load_once" to load each such row once '
            "(see docs/incremental.md)",
            diagnostics={"route": route.as_dict(), "column": column, "rows": unloaded},
        )


@attrs.define(kw_only=True)
class EdgeScan:
    """The source's rows in the record's edge that the route has not loaded, by partition."""

    # partition values with such rows, in the order found (a dict: a key range's edge may
    # hold a distinct value per row)
    ranged: dict[Any, None] = attrs.field(factory=dict)
    nulled: dict[Any, None] = attrs.field(factory=dict)
    null_rows: int = 0
    # a merge route's: every row the edge holds now, loaded or not (``advanced_edge``)
    present: Seen | None = None


def scan_edge(
    source: Any,
    edge: Edge,
    columns: Sequence[Column],
    *,
    load_nulls: bool,
    chunk_rows: int,
    key: Sequence[str] = (),
) -> tuple[Edge, EdgeScan]:
    """Read the edge (``source.edge_rows``) and subtract the rows the record says are loaded.

    ``edge`` must be ``matching``. Under ``load_once`` a record that does not know
    which NULL-cursor rows were loaded (a restored or reset state, a dropped
    column) takes those the source holds now as loaded, and tracks NULL rows from
    here on; the returned record says so. ``key``: a merge route's (``_edge_digest``), whose
    scan also keeps every row it read (``EdgeScan.present``).
    """
    found = EdgeScan(present=Counter() if key else None)
    indexes, keyed = edge.digest_indexes(columns), _keyed(columns, key)
    names = [column.name for column in columns]
    cursor, partition = names.index(source.cursor_column), names.index(source.partition_column)
    since = None if edge.upto is None else edge.since
    baseline: Seen | None = Counter() if load_nulls and not edge.nulls else None
    seen = Counter(edge.rows)
    # NULL rows always: the error policy counts every unloaded one, load_once loads them
    for chunk in source.edge_rows(since=since, upto=edge.upto, nulls=True, chunk_rows=chunk_rows):
        for row in chunk:
            value = row[cursor]
            digest = (value, _edge_digest(row, indexes, keyed))
            if found.present is not None:
                found.present[digest] += 1
            if value is None and baseline is not None:
                baseline[digest] += 1
            elif seen[digest] > 0:
                seen[digest] -= 1
            elif value is None:
                found.null_rows += 1
                found.nulled[row[partition]] = None
            else:
                found.ranged[row[partition]] = None
    if baseline is not None and len(baseline) <= MAX_EDGE_ROWS:
        edge = attrs.evolve(edge, nulls=True, rows=edge.rows + baseline)
    return edge, found


@attrs.frozen
class EdgePlan:
    """An append route's edge this attempt: the stored record as the source's columns match
    it, and the source's rows there that the route has not loaded."""

    record: Edge
    scan: EdgeScan


def plan_edge(
    route: RouteKey,
    source: Any,
    state: SourceState | None,
    columns: Sequence[Column],
    *,
    kind: str | None,
    lag: float,
    on_null_cursor: str,
    chunk_rows: int,
    key: Sequence[str] = (),
) -> EdgePlan | None:
    """An append route's edge record and the edge rows it has not loaded; None for a route
    without a cursor or a source that cannot read its edge. NULL-cursor rows that
    ``on_null_cursor = "error"`` refuses stop the run here, before the target."""
    cursor = source.cursor_column
    if not route.strategy.incremental or cursor is None:
        return None
    check_lag(lag, kind)
    if not source.features.reads_edges:
        return None
    edge = Edge.of_state(route, state).matching(columns)
    load_nulls = on_null_cursor == "load_once"
    edge, scan = scan_edge(
        source, edge, columns, load_nulls=load_nulls, chunk_rows=chunk_rows, key=key
    )
    if not load_nulls:
        refuse_null_cursor(route, cursor, scan.null_rows)
        scan.nulled.clear()
    return EdgePlan(edge, scan)


def top_of_window(source: Source, upto: Any, lag: float, kind: str | None) -> Any:
    """The lowest cursor value of the next edge record, or None when it is not tracked: a
    cursor column SQLite compares with a collation (equal values Python tells apart)."""
    if upto is None:
        return None
    if source.cursor_column in source.collated_columns():
        return None
    try:
        return lag_since(upto, lag, kind)
    except (ValueError, OverflowError):
        raise ConfigInvalid(
            "source.lag: the cursor's highest value is not an ISO date or timestamp, or the "
            "lag reaches past the calendar",
            diagnostics={"key": "source.lag", "cursor_kind": kind},
        ) from None


def scan_by_window(
    source: Source, bounds: Sequence[Mapping[str, Any]], chunk_rows: int
) -> Iterator[tuple[int, list]] | None:
    """``(index, rows)`` of ``bounds`` in one scan per cursor window (``Source.read_partitions``); a
    window's bounds the source reads apart, or a window of one bound, are read bound by
    bound. None when no window was split. An edge partition beside 1,000 key ranges (a
    NULL cursor kept, or rows late at the top) made the whole attempt a read per range
    (figures: docs/performance.md, fix 57)."""
    if len(bounds) < 2:
        return None
    windows: dict[str, list[int]] = {}
    for index, item in enumerate(bounds):
        windows.setdefault(repr(sorted(cursor_window(item).items())), []).append(index)
    if len(windows) == 1:
        return source.read_partitions(bounds, chunk_rows=chunk_rows)
    scans = [
        (numbers, source.read_partitions([bounds[n] for n in numbers], chunk_rows=chunk_rows))
        for numbers in windows.values()
        if len(numbers) > 1
    ]
    if all(scan is None for _, scan in scans):
        return None
    split = {n for numbers, scan in scans if scan is not None for n in numbers}

    def chained() -> Iterator[tuple[int, list]]:
        for numbers, scan in scans:
            if scan is not None:
                yield from ((numbers[index], rows) for index, rows in scan)
        for number in (n for n in range(len(bounds)) if n not in split):
            for chunk in source.read(bounds[number], chunk_rows=chunk_rows):
                yield number, chunk

    return chained()


def is_edge(bounds: Mapping[str, Any]) -> bool:
    """Whether a partition is an edge partition (rows at or below the watermark, or NULL)."""
    return "cursor_from" in bounds or bounds.get("cursor_null") is True


class EdgeTracker:
    """One attempt's view of the edge: filters loaded rows out of edge partitions, and records
    the digests of the rows it passes that the next record must hold.

    ``key`` (a merge route's): the rows it skips are recorded too, and ``advanced_edge``
    keeps only the loaded rows the source still holds (``EdgeScan.present``)."""

    def __init__(
        self,
        edge: Edge,
        columns: Sequence[Column],
        source: Any,
        *,
        top_since: Any,
        kind: str | None,
        key: Sequence[str] = (),
    ) -> None:
        self.indexes = edge.digest_indexes(columns)
        self.keyed = _keyed(columns, key)
        names = [column.name for column in columns]
        self.cursor = names.index(source.cursor_column)
        self.partition = names.index(source.partition_column)
        self.top_since, self.kind = top_since, kind
        self._seen = Counter(edge.rows)
        self.recorded: dict[str, Seen | None] = {}
        self._unpersisted: set[str] = set()

    def _kept(self, value: Any) -> bool:
        return value is None or _at_or_above(value, self.top_since, self.kind)

    def rows(self, candidate: PartitionCheckpoint, chunks: Iterable[list]) -> Iterator[list]:
        """``chunks`` of ``candidate``: an edge partition's without the rows already loaded."""
        self.recorded[candidate.partition_id] = Counter()
        for chunk in chunks:
            passed = self._passed(candidate, chunk)
            if passed:
                yield passed

    def _top(self, chunk: list) -> list | None:
        """The rows of ``chunk`` that ``_kept`` keeps, compared in one pass without a call per
        row; None when a value needs ``_key`` (a decimal's text) or does not compare with
        the top's (another type, a decimal NaN): the caller then goes row by row."""
        since, cursor = self.top_since, self.cursor
        if self.kind == "decimal":
            return None
        try:
            if since is None:
                return [row for row in chunk if row[cursor] is None]
            return [row for row in chunk if row[cursor] is None or row[cursor] >= since]
        except (TypeError, ArithmeticError):
            return None

    def _record(self, candidate: PartitionCheckpoint, recorded: Seen, rows: list) -> None:
        """Count ``rows`` at the top of the candidate's window, up to ``MAX_EDGE_ROWS`` keys."""
        for row in rows:
            recorded[(row[self.cursor], _edge_digest(row, self.indexes, self.keyed))] += 1
            if len(recorded) > MAX_EDGE_ROWS:
                self.recorded[candidate.partition_id] = None
                return

    def _passed(self, candidate: PartitionCheckpoint, chunk: list) -> list:
        """The rows of ``chunk`` that pass (``rows``), those at the top recorded."""
        edge = is_edge(candidate.partition_bounds)
        bounds = candidate.partition_bounds
        by_value, partition = "partition" in bounds, bounds.get("partition")
        recorded = self.recorded[candidate.partition_id]
        if not edge:  # every row passes: only the rows at the top are recorded
            top = self._top(chunk)
            if top is not None:
                if recorded is not None:
                    self._record(candidate, recorded, top)
                return chunk
        passed = []
        for row in chunk:
            value = row[self.cursor]
            if edge and by_value and row[self.partition] != partition:
                continue  # a collation's other spelling: its own edge partition reads it
            kept = self._kept(value)
            if edge or kept:
                key = (value, _edge_digest(row, self.indexes, self.keyed))
                loaded = edge and self._seen[key] > 0
                if loaded:
                    self._seen[key] -= 1
                if kept and recorded is not None and (self.keyed or not loaded):
                    recorded[key] += 1
                    if len(recorded) > MAX_EDGE_ROWS:
                        recorded = None
                        self.recorded[candidate.partition_id] = None
                if loaded:
                    continue
            passed.append(row)
        return passed

    def top_rows(
        self, source: Any, candidates: Sequence[PartitionCheckpoint], chunk_rows: int
    ) -> dict[str, Seen | None]:
        """The rows at the top of each candidate's window as the source holds them now: in one
        scan when the source reads several partitions so (``Source.read_partitions``), else a read
        each. Without an index, a read each scanned the table twice per partition around an
        engine's read, most of an append's time (figures: docs/performance.md, 'Margins')."""
        windows = [{**c.partition_bounds, "cursor_from": self.top_since} for c in candidates]
        scan = scan_by_window(source, windows, chunk_rows)
        if scan is None:
            scan = (
                (index, chunk)
                for index, bounds in enumerate(windows)
                for chunk in source.read(bounds, chunk_rows=chunk_rows)
            )
        for _ in self.scanned(candidates, scan):
            pass
        return {c.partition_id: self.recorded.pop(c.partition_id) for c in candidates}

    def scanned(
        self, candidates: Sequence[PartitionCheckpoint], scan: Iterable[tuple[int, list]]
    ) -> Iterator[tuple[int, list]]:
        """``rows`` of one scan of every candidate (``(candidate index, rows)``, partitions
        interleaved, each candidate read once), without the rows already loaded."""
        for candidate in candidates:
            self.recorded[candidate.partition_id] = Counter()
        for index, chunk in scan:
            yield index, self._passed(candidates[index], chunk)

    def confirm_top(
        self,
        before: Mapping[str, Seen | None],
        after: Mapping[str, Seen | None],
        *,
        persisted: bool = False,
    ):
        """Record the top rows of an engine's own read: it read the source between the two
        reads, so when they agree (rows are only added) it read exactly those. A lazy plan's
        read is the target call, after the checkpoints are armed: its rows are kept in memory
        only (a crash before the state leaves them unknown, never wrongly known); a pull's,
        done before, may be ``persisted`` in the checkpoints, as rows read by Python are."""
        for partition_id, rows in before.items():
            self.recorded[partition_id] = rows if after.get(partition_id) == rows else None
            if not persisted:
                self._unpersisted.add(partition_id)

    def diagnostics(self, partition_id: str, *, persisted: bool = False) -> dict[str, Any]:
        """The partition's recorded rows (``persisted``: only those a checkpoint may keep)."""
        if partition_id not in self.recorded or (persisted and partition_id in self._unpersisted):
            return {}
        rows = self.recorded[partition_id]
        listed = None if rows is None else [[v, d, n] for (v, d), n in rows.items()]
        return {
            EDGE_ROWS_KEY: None if listed is None else {"since": self.top_since, "rows": listed}
        }


def advanced_edge(
    edge: Edge,
    *,
    upto: Any,
    top_since: Any,
    kind: str | None,
    generation_checkpoints: Sequence[PartitionCheckpoint],
    lost: bool = False,
    present: Seen | None = None,
) -> tuple[Edge, list[str]]:
    """The record for the next generation, and the parts of it that could not be kept.

    ``generation_checkpoints`` are this generation's committed partitions (run
    now or by an earlier attempt); each must carry its recorded rows. ``lost``:
    some were committed under other ids (an earlier schema), so their rows are unknown.

    ``present`` (a merge route's ``EdgeScan.present``: the rows in the old record's range
    now): a merge keeps only the loaded versions the source still holds. A version edited
    away must leave the record, or the same row edited back at the same cursor value was
    skipped as loaded, leaving the edited version in the target. A version the source still
    holds must stay: dropped because another version of its key was loaded (in another
    partition), it was loaded again on a later run, flipping the key between its versions
    or bringing back a key deleted since (exit 0, found by a hostile check).
    """
    untracked: list[str] = []
    recordings = [cp.diagnostics.get(EDGE_ROWS_KEY) for cp in generation_checkpoints]
    recorded: list[dict[str, Any]] = [rec for rec in recordings if isinstance(rec, dict)]
    complete = not lost and len(recorded) == len(recordings)
    # every recording covers the rows at or above its attempt's ``since``: the highest holds
    for rec in recorded if complete else ():
        if top_since is None or _at_or_above(rec["since"], top_since, kind):
            top_since = rec["since"]
    old_range_known = (
        edge.upto is None
        or (edge.since is not None and _at_or_above(top_since, edge.since, kind))
        or (top_since is not None and not _at_or_above(edge.upto, top_since, kind))
    )
    since = top_since if complete else None
    if since is not None and not old_range_known:
        # the old record knows its rows from its own ``since`` up, this generation from below
        # it: both from there (a run with nothing new kept that, and lag came back once the
        # watermark passed it: a window that only set ``since`` to its top lost it for good);
        # without one (or one above the watermark), only this generation's top is known
        above = edge.upto is None or not _at_or_above(edge.upto, upto, kind)
        if edge.since is not None and _at_or_above(upto, edge.since, kind):
            since = edge.since
        else:
            since = upto if above else None
    null_edges = [
        rec
        for cp, rec in zip(generation_checkpoints, recordings, strict=True)
        if cp.partition_bounds.get("cursor_null") is True
    ]
    nulls = edge.nulls and not lost and all(isinstance(rec, dict) for rec in null_edges)
    rows: Seen = Counter()

    def kept(value: Any) -> bool:
        return nulls if value is None else _at_or_above(value, since, kind)

    def scanned(value: Any) -> bool:  # the old record's range, which ``present`` covers
        if value is None or edge.since is None or edge.upto is None:
            return value is None
        return _at_or_above(value, edge.since, kind)

    for (value, digest), n in edge.rows.items():
        if present is not None and scanned(value):
            n = min(n, present[(value, digest)])
        if n and kept(value):
            rows[(value, digest)] += n
    for rec in recorded:
        for value, digest, count in rec["rows"]:
            if not kept(value):
                continue
            if present is None:
                rows[(value, digest)] += count
            else:  # a merge records the rows it skipped as loaded too: counted once
                rows[(value, digest)] = max(rows[(value, digest)], count)
    ranged = sum(1 for value, _ in rows if value is not None)
    if since is not None and ranged > MAX_EDGE_ROWS:
        since = None
        rows = Counter({key: n for key, n in rows.items() if key[0] is None})
    if since is None and top_since is not None:
        untracked.append("range")
    if len(rows) > MAX_EDGE_ROWS or (edge.nulls and not nulls):
        nulls, rows = False, Counter({key: n for key, n in rows.items() if key[0] is not None})
        untracked.append("nulls")
    return Edge(upto=upto, since=since, nulls=nulls, columns=edge.columns, rows=rows), untracked
