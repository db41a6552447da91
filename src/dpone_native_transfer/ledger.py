"""The target's batch ledger, and the cross-check of the checkpoint store against it.

A sink that keeps it (``Sink.read_ledger``) writes one row per batch into
``_dpone_ledger`` in the target database, in the same transaction as the
batch's rows: which route, which batch and run, which partitions, how many
rows, and the source state (generation, watermark) the batch brings the
route to. The ledger is append-only: a full refresh replaces a table's rows,
never its ledger rows. So the target itself records what it holds, and the
store is no longer the only memory:

- the same transaction checks that the target applied the rows the batch sent
  (``check_applied``) and, on a target with a fence (``FENCE_TABLE``), that no
  newer lease epoch reached the target first (``fence_batch``);
- before a run touches the target, ``check_store_against_target`` compares
  the store's view of the route with the ledger (reads only);
- ``recovery.Prover`` tells an operator, or a run, whether a blocked batch was applied;
- ``restored_checkpoints`` rebuilds a lost store's view from it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from .audit import malformed_audit
from .checkpoints import (
    LEDGER_BATCH_KEY,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    Strategy,
    _is_json_safe,
    batch_id_for,
)
from .errors import LeaseFenced, StoreTargetMismatch, TargetRowsMismatch
from .latest import LatestCheckpoints

if TYPE_CHECKING:
    from .rejects import Reject
    from .stores import Store
from .wording import plural

__all__ = [
    "FENCE_TABLE",
    "LEDGER_FORMAT",
    "LEDGER_TABLE",
    "ledger_table_sql",
    "LedgerEntry",
    "LedgerPartition",
    "Proof",
    "advance_fence",
    "check_applied",
    "check_ledger_columns",
    "check_store_against_target",
    "fence_batch",
    "fence_first",
    "read_fence",
    "excused_batches",
    "ledger_query",
    "live_entries",
    "ledger_overrides",
    "restored_checkpoints",
    "unexcused",
]

LEDGER_TABLE = "_dpone_ledger"
# v2 adds the lease epoch the batch was fenced with, the route definition it was loaded
# under and the earlier batches operators excused; v1 rows (without them) are still read.
LEDGER_FORMAT = "dpone.target_ledger.v2"
_V1_FORMAT = "dpone.target_ledger.v1"


@attrs.frozen
class LedgerPartition:
    partition_id: str
    bounds: dict[str, Any]
    rows: int


@attrs.frozen(kw_only=True)
class LedgerEntry:
    """One batch as the target's ledger records it (written by the sink with the rows).

    ``rows`` is what the sink applied (it fills it in); ``seq`` orders a
    table's entries (the sink assigns it). ``partitions`` is empty when read
    without them (``read_ledger(partitions=False)``); ``partition_count`` is not.
    """

    batch_id: str
    run_id: str
    target_table: str
    source_location: str | None
    source_table: str
    strategy: Strategy = attrs.field(converter=Strategy)
    replace: bool
    generation: int
    watermark: Any
    cursor_column: str | None
    query_hash: str
    schema_hash: str
    applied_at: str
    partition_count: int
    partitions: tuple[LedgerPartition, ...] = ()
    rows: int = 0
    seq: int = 0
    epoch: int | None = None  # the lease epoch the target's fence checked (None: no fence)
    sent: int | None = attrs.field(default=None, eq=False)  # rows handed to the target call
    rejected: int = 0  # rows set aside (``on_bad_value = "quarantine"``), written with the batch
    rejects: tuple[Reject, ...] = attrs.field(default=(), eq=False)  # them, to write
    definition: dict[str, Any] | None = None  # the route definition (``planner``) it used
    excused: tuple[str, ...] = ()  # earlier batches operators said the table no longer holds

    @classmethod
    def for_batch(
        cls,
        route: RouteKey,
        run_id: str,
        candidates: Sequence[PartitionCheckpoint],
        *,
        generation: int,
        watermark: Any,
        cursor_column: str | None,
        at: datetime,
        epoch: int | None = None,
        definition: dict[str, Any] | None = None,
        excused: Sequence[str] = (),
    ) -> LedgerEntry:
        """The entry of one attempt, before extraction has counted its rows."""
        first = candidates[0]
        return cls(
            batch_id=batch_id_for(run_id, [cp.partition_id for cp in candidates]),
            run_id=run_id,
            target_table=route.target_table,
            source_location=route.source_location,
            source_table=route.source_table,
            strategy=route.strategy,
            replace=route.strategy is Strategy.FULL_REFRESH,
            generation=generation,
            watermark=watermark,
            cursor_column=cursor_column,
            query_hash=first.query_hash,
            schema_hash=first.schema_hash,
            applied_at=at.isoformat(),
            partition_count=len(candidates),
            partitions=tuple(
                LedgerPartition(cp.partition_id, dict(cp.partition_bounds), cp.rows_exported)
                for cp in candidates
            ),
            epoch=epoch,
            definition=definition,
            excused=tuple(sorted(excused)),
        )

    def with_counts(
        self,
        candidates: Sequence[PartitionCheckpoint],
        *,
        sent: int | None = None,
        rejects: Sequence[Reject] = (),
    ) -> LedgerEntry:
        """The same entry with the partitions' rows as extraction counted them, the rows the
        target call is handed (None when the engine reads them itself: lazy-plan) and the
        rows set aside, which the call writes to the rejects table."""
        rows = {cp.partition_id: cp.rows_exported for cp in candidates}
        partitions = tuple(
            attrs.evolve(p, rows=rows.get(p.partition_id, p.rows)) for p in self.partitions
        )
        return attrs.evolve(
            self, partitions=partitions, sent=sent, rejects=tuple(rejects), rejected=len(rejects)
        )

    @property
    def label(self) -> str:
        """The route that wrote it, as route labels read."""
        return f"{self.source_table} -> {self.target_table} ({self.strategy})"

    def of_route(self, route: RouteKey) -> bool:
        """Written by ``route`` (the ledger lives in the target: its location is implied)."""
        return (self.source_location, self.source_table, self.strategy) == (
            route.source_location,
            route.source_table,
            route.strategy,
        )

    def row(self) -> tuple[str, str, str, str]:
        """(target_table, batch_id, entry JSON, partitions JSON): what a sink inserts, with rows."""
        entry = {
            "format": LEDGER_FORMAT,
            "run_id": self.run_id,
            "source_location": self.source_location,
            "source_table": self.source_table,
            "strategy": str(self.strategy),
            "replace": self.replace,
            "generation": self.generation,
            "watermark": self.watermark,
            "cursor_column": self.cursor_column,
            "query_hash": self.query_hash,
            "schema_hash": self.schema_hash,
            "applied_at": self.applied_at,
            "partition_count": self.partition_count,
            "epoch": self.epoch,
            "definition": self.definition,
            "excused": sorted(self.excused),
            "rejected": self.rejected,
        }
        partitions = [[p.partition_id, p.bounds, p.rows] for p in self.partitions]
        return (
            self.target_table,
            self.batch_id,
            json.dumps(entry, sort_keys=True, allow_nan=False),
            json.dumps(partitions, sort_keys=True, allow_nan=False),
        )

    @classmethod
    def from_row(
        cls, seq: Any, target_table: Any, batch_id: Any, rows: Any, entry: Any, partitions: Any
    ) -> LedgerEntry:
        """Strictly read a ledger row; anything off is a ``StoreTargetMismatch`` (unreadable)."""
        try:
            fields = json.loads(entry)
            listed = [] if partitions is None else json.loads(partitions)
            version = fields.pop("format")
            if version == _V1_FORMAT and set(fields) == _V1_KEYS:
                fields.update(epoch=None, definition=None, excused=[], rejected=0)
            elif version != LEDGER_FORMAT or set(fields) != _ENTRY_KEYS:
                raise ValueError("unknown ledger format")
            if not (_is_json_safe(fields) and isinstance(listed, list)):
                raise ValueError("not JSON")
            return cls(
                batch_id=_text(batch_id),
                target_table=_text(target_table),
                seq=_count(seq),
                rows=_count(rows),
                run_id=_text(fields["run_id"]),
                source_location=_optional_text(fields["source_location"]),
                source_table=_text(fields["source_table"]),
                strategy=fields["strategy"],
                replace=_flag(fields["replace"]),
                generation=_count(fields["generation"]),
                watermark=fields["watermark"],
                cursor_column=_optional_text(fields["cursor_column"]),
                query_hash=_text(fields["query_hash"]),
                schema_hash=_text(fields["schema_hash"]),
                applied_at=_text(fields["applied_at"]),
                partition_count=_count(fields["partition_count"]),
                partitions=tuple(
                    LedgerPartition(_text(pid), dict(bounds), _count(n))
                    for pid, bounds, n in listed
                ),
                epoch=None if fields["epoch"] is None else _count(fields["epoch"]),
                definition=_optional_mapping(fields["definition"]),
                excused=tuple(_text(batch) for batch in _list(fields["excused"])),
                rejected=_count(fields["rejected"]),
            )
        except (TypeError, ValueError, KeyError, AttributeError, RecursionError):
            raise StoreTargetMismatch(
                f"the target's ledger ({LEDGER_TABLE}) holds a row that is not a valid ledger "
                "entry; it cannot be checked against the checkpoint store",
                diagnostics={"mismatch": "ledger_unreadable", "seq": _safe_int(seq)},
            ) from None


_V1_KEYS = frozenset(
    {
        "run_id",
        "source_location",
        "source_table",
        "strategy",
        "replace",
        "generation",
        "watermark",
        "cursor_column",
        "query_hash",
        "schema_hash",
        "applied_at",
        "partition_count",
    }
)
_ENTRY_KEYS = _V1_KEYS | {"epoch", "definition", "excused", "rejected"}


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError("not a non-empty string")
    return value


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError("not a count")
    return value


def _optional_mapping(value: Any) -> dict[str, Any] | None:
    if value is not None and not isinstance(value, dict):
        raise ValueError("not an object")
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError("not a list")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("not a boolean")
    return value


def _safe_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_LEDGER_ORDER = ("seq", "target_table", "batch_id", "rows", "entry", "partitions")
LEDGER_COLUMNS = frozenset(_LEDGER_ORDER)


def ledger_table_sql(table: str, *, seq: str, integer: str, text: str, tail: str = "") -> str:
    """The CREATE of the ledger table ``table`` (quoted), in an engine's types: ``seq`` for
    the entry number, ``integer`` for the row count and ``text`` for the others."""
    types = {"seq": seq, "rows": integer}
    columns = ", ".join(f"{name} {types.get(name, text)}" for name in _LEDGER_ORDER)
    return f"CREATE TABLE IF NOT EXISTS {table} ({columns}){tail}"


def not_dpones(name: str) -> StoreTargetMismatch:
    """``name``, dpone's fence or rejects table, is a table dpone did not make: other columns,
    or values it never writes (edited by hand). Nothing can be proved with it, and no retry
    changes that: found before the target call."""
    again = " (a fence is made again from the ledger's epochs)" if name == FENCE_TABLE else ""
    return StoreTargetMismatch(
        f"the target holds a table named {name} that is not dpone's (its columns or values "
        f"differ); rename it{again}",
        diagnostics={"mismatch": "own_table_unreadable", "name": name},
    )


def check_ledger_columns(columns: set[str]) -> None:
    """Refuse a ``_dpone_ledger`` table that lacks the ledger's columns (not one we wrote)."""
    if not LEDGER_COLUMNS <= columns:
        raise StoreTargetMismatch(
            f"the target holds a table named {LEDGER_TABLE} that is not a ledger (its columns "
            "differ); it cannot be checked against the checkpoint store: rename that table",
            diagnostics={"mismatch": "ledger_unreadable"},
        )


def ledger_query(table_marker: str, *, partitions: bool, ledger: str = f'"{LEDGER_TABLE}"') -> str:
    """The SELECT a sink's ``read_ledger`` runs: the rows ``LedgerEntry.from_row`` reads.

    ``table_marker`` is the engine's placeholder for the target table's name;
    ``ledger`` the ledger table's reference (qualified where it lives in a schema).
    """
    listed = "partitions" if partitions else "NULL"
    return (
        f"SELECT seq, target_table, batch_id, rows, entry, {listed} FROM {ledger}"
        f" WHERE target_table = {table_marker} ORDER BY seq"
    )


# --- what the load's transaction checks --------------------------------------------------------

# The target's fence: per target table, the highest lease epoch that reached it. A sink with
# one (``SinkFeatures.fence``) keeps it in the target database, beside the ledger.
FENCE_TABLE = "_dpone_fence"

Query = Callable[[str, Sequence[Any]], list[tuple[Any, ...]]]


def check_applied(entry: LedgerEntry, applied: int) -> None:
    """``TargetRowsMismatch`` when the engine applied another number of rows than were sent.

    Raised inside the load's transaction, before its ledger row: the sink rolls back.
    """
    if entry.sent is not None and applied != entry.sent:
        raise TargetRowsMismatch.counted(
            entry.target_table, entry.batch_id, sent=entry.sent, applied=applied
        )


def _fence_sql(table: str, marker: str, *, text: str, integer: str) -> tuple[str, str, str]:
    """The fence's CREATE, its SELECT and its upsert (which only raises it), for ``table``."""
    return (
        f"CREATE TABLE IF NOT EXISTS {table} (target_table {text} PRIMARY KEY, epoch {integer})",
        f"SELECT epoch FROM {table} WHERE target_table = {marker}",
        f"INSERT INTO {table} (target_table, epoch) VALUES ({marker}, {marker})"
        " ON CONFLICT (target_table) DO UPDATE SET epoch = CASE"
        f" WHEN {table}.epoch > excluded.epoch THEN {table}.epoch ELSE excluded.epoch END",
    )


def fence_batch(
    query: Query,
    entry: LedgerEntry,
    *,
    table: str,
    marker: str,
    text: str,
    integer: str,
    create: bool = True,
    ledger: Callable[[], str | None] = lambda: None,
) -> None:
    """Inside the load's transaction: refuse a batch whose lease epoch is older than the
    target's fence (``LeaseLost``: the sink rolls back, nothing applied), else raise the fence
    to it. Nothing to do for a batch without an epoch (a store without leases). ``create``:
    whether the fence table may be missing; ``ledger``: the ledger table's reference, or None
    where it does not exist (``_fence_floor``).

    The caller holds what serializes the fence's writes (PostgreSQL's lock on the ledger,
    SQLite's write lock, DuckDB's one writer), so the row read is raised by a plain INSERT or
    UPDATE: DuckDB's ``ON CONFLICT`` took 1.5-1.8 ms where they took 0.25-0.35."""
    if entry.epoch is None:
        return
    make, select, _ = _fence_sql(table, marker, text=text, integer=integer)
    if create:
        query(make, ())
    target, epoch = entry.target_table, entry.epoch
    found = query(select, (target,))
    fence = int(found[0][0]) if found else _fence_floor(query, target, marker, ledger())
    if fence > epoch:
        raise LeaseFenced.fenced(target, entry.batch_id)
    if not found:
        query(
            f"INSERT INTO {table} (target_table, epoch) VALUES ({marker}, {marker})",
            (target, epoch),
        )
    elif epoch > fence:
        query(f"UPDATE {table} SET epoch = {marker} WHERE target_table = {marker}", (epoch, target))


def _fence_floor(query: Query, target_table: str, marker: str, ledger: str | None) -> int:
    """The fence of a table without a fence row: the highest lease epoch its ledger's batches
    were fenced with. A fence row deleted by hand, or its table dropped, let a worker stopped
    past its lease apply its older batch after a newer holder's (exit 0, its rows twice)."""
    if ledger is None:
        return 0
    found = query(f"SELECT entry FROM {ledger} WHERE target_table = {marker}", (target_table,))
    epochs = [0]
    for (text,) in found:
        try:
            epoch = json.loads(text).get("epoch")
        except (TypeError, ValueError, AttributeError):
            continue  # an unreadable row: the ledger's reader refuses it (``from_row``)
        if isinstance(epoch, int) and not isinstance(epoch, bool):
            epochs.append(epoch)
    return max(epochs)


def fence_first(
    query: Query,
    entry: LedgerEntry | None,
    *,
    table: str | None,
    marker: str,
    ledger: Callable[[], str | None] = lambda: None,
) -> None:
    """At the start of the load's transaction: refuse at once a batch a newer holder's epoch
    already passed (``LeaseFenced``), before the load fails on what that holder changed (a
    stage it consumed). ``table``: the fence table, None where it does not exist; ``ledger``:
    as ``fence_batch``'s, which still decides, at its end."""
    if entry is None or entry.epoch is None:
        return
    fence = read_fence(query, entry.target_table, table=table, marker=marker, ledger=ledger)
    if fence > entry.epoch:
        raise LeaseFenced.fenced(entry.target_table, entry.batch_id)


def read_fence(
    query: Query,
    target_table: str,
    *,
    table: str | None,
    marker: str,
    ledger: Callable[[], str | None] = lambda: None,
) -> int:
    """The target table's fence: its row of the fence table ``table`` (None: that table does
    not exist), else ``_fence_floor`` (0 for a table no fenced batch reached); reads only."""
    found = []
    if table is not None:
        found = query(f"SELECT epoch FROM {table} WHERE target_table = {marker}", (target_table,))
    if not found:
        return _fence_floor(query, target_table, marker, ledger())
    epoch = found[0][0]
    if isinstance(epoch, bool) or not isinstance(epoch, int | str) or not str(epoch).isdecimal():
        raise not_dpones(FENCE_TABLE)  # dpone writes a whole number
    return int(epoch)


def advance_fence(
    query: Query, target_table: str, epoch: int, *, table: str, marker: str, text: str,
    integer: str, create: bool = True,
) -> int:  # fmt: skip
    """In a transaction of its own: raise the fence to at least ``epoch``; the fence now. Once
    committed, no batch of an older epoch can commit (``fence_batch``), so a ledger read
    after it proves what such a batch did. ``create``: as ``fence_batch``'s."""
    make, select, upsert = _fence_sql(table, marker, text=text, integer=integer)
    if create:
        query(make, ())
    query(upsert, (target_table, epoch))
    return int(query(select, (target_table,))[0][0])


# --- the cross-check -------------------------------------------------------------------------


_RESTORE = "dpone-transfer state restore <route file> --reason TEXT --operator NAME"
_VERIFY = "dpone-transfer guard verify <route file>"
_RESET = "dpone-transfer state reset <route file> --reason TEXT --operator NAME"


def _mismatch(route: RouteKey, kind: str, message: str, **diagnostics: Any) -> StoreTargetMismatch:
    return StoreTargetMismatch(
        f"route {route.label}: {message}; nothing was read from the source or written to "
        "the target",
        diagnostics={"route": route.as_dict(), "mismatch": kind, **diagnostics},
    )


class TargetTable(Protocol):
    """What the cross-check asks of the target table (a ``Sink`` answers both)."""

    def is_empty(self) -> bool: ...

    def column_difference(self, columns: Sequence[Any]) -> Any: ...


def table_missing(target: TargetTable) -> bool:
    """Whether the target table does not exist (``Sink.column_difference``: None)."""
    return target.column_difference(()) is None


def check_store_against_target(
    route: RouteKey,
    scope: LatestCheckpoints,
    entries: Sequence[LedgerEntry],
    *,
    overridden: Callable[[], set[str]],
    cursor_column: str | None = None,
    target: TargetTable | None = None,
    started: Callable[[], bool] | None = None,
) -> LedgerEntry | None:
    """Refuse the run when the store and the target's ledger disagree (reads only).

    ``scope`` is the store's view of every route writing the target table (they
    share one store), ``entries`` the ledger of that table, ``overridden()`` the
    batch ids an operator recorded against the ledger (``guard resolve
    --force``, read only when something disagrees). Each refusal names the
    command that repairs it. Checked in order:

    1. every batch in the ledger since the table was last replaced (older rows are
       gone) is one the store holds as committed (else the
       store was lost, replaced, restored from an older backup, or is another
       store; or the target was moved or copied, its ledger naming batches the
       store knows under another location);
    2. every committed ledger batch of the store is in the ledger (else the
       target was replaced, restored, or is another database);
    3. the ``target`` table holds rows when its ledger records some since it was last
       replaced (asked only then, and not of a full refresh, which loads every row again;
       else it was dropped, renamed or emptied); a merge
       batch's rows may all be deleted by later ones, so after merges only a missing
       table is refused: a merge never drops its table;
    4. an append route with no batch of its own yet appends into no table holding
       another source database's batches of its source table: if that database is
       this one under another name or address, its rows would be loaded twice. It
       is new unless ``started()`` (the store holds its source state: a run, or an
       operator's ``state restore`` or ``state reset``, started it) or, without
       ``started``, the store holds a checkpoint of it;
    5. no other route replaced the table after this route's last batch (a full
       refresh, or a strategy switch), unless this route replaces it too; for a
       route with no batch yet, no refresh of its own source table did. A full
       refresh of the same source table that recorded how far it loaded this
       route's cursor column is returned instead: the route continues from its
       watermark (no row the target holds is appended again, none is skipped).
    """
    stored = scope.ledger_batches()
    in_ledger = {entry.batch_id for entry in entries}
    live = _since_last_replace(entries)
    unknown = [e.batch_id for e in live if stored.get(e.batch_id, (0, 0)) == (0, 0)]
    contradicted = [e.batch_id for e in live if stored.get(e.batch_id, (0, 0))[1] > 0]
    behind = sorted(b for b, (done, _) in stored.items() if done and b not in in_ledger)
    if unknown or contradicted or behind:
        excused = overridden()
        unknown, contradicted, behind = (
            sorted(set(found) - excused) for found in (unknown, contradicted, behind)
        )
    if unknown:
        found = [e for e in live if e.batch_id in unknown]
        others = sorted({e.label for e in found if not e.of_route(route)})
        repair = (  # only other routes' batches: this route's own restore finds none
            f"rebuild the store's view of this route from the target with: {_RESTORE}"
            + _for_other_routes(others)
            if any(e.of_route(route) for e in found)
            else f"they are other routes' ({'; '.join(others)}): rebuild the store's view of "
            "each from the target with its own route file, then run this route again: "
            + _RESTORE.replace("<route file>", "<its route file>")
        )
        raise _mismatch(
            route,
            "target_ahead_of_store",
            f"the target's ledger holds {plural(len(unknown), 'batch')} that the checkpoint "
            "store does not know (the store was lost, replaced, restored from an older "
            "backup, copied without its -wal file or is another store; or the target was "
            f"moved or copied); {repair}",
            batch_ids=unknown,
        )
    if contradicted:
        raise _mismatch(
            route,
            "store_contradicts_target",
            f"the checkpoint store records {plural(len(contradicted), 'batch')} as not (or not "
            "wholly) applied that the target's ledger holds as applied (resolved by hand, or "
            "an unguarded run failed after its target call); record what the target holds "
            f"with: {_RESTORE}",
            batch_ids=contradicted,
        )
    if behind:
        others = sorted(
            {cp.route.label for cp in scope if cp.diagnostics.get(LEDGER_BATCH_KEY) in behind}
            - {route.label}
        )
        raise _mismatch(
            route,
            "store_ahead_of_target",
            f"the checkpoint store records {plural(len(behind), 'committed batch')} of this target "
            "table that its ledger does not hold (the target was replaced, restored from an "
            "older backup or moved, or this is another database with the same table name); "
            f"see them with: {_VERIFY}; if this is the right target, make the store agree "
            f"with it (they are loaded again) with: {_RESTORE}" + _for_other_routes(others),
            batch_ids=behind,
        )
    claimed = [entry for entry in live if entry.rows]
    replaces = route.strategy is Strategy.FULL_REFRESH  # it loads the whole table again anyway
    if claimed and target is not None and not replaces and target.is_empty():
        merged = [entry for entry in claimed if entry.strategy is Strategy.MERGE]
        if merged and not table_missing(target):
            claimed = [entry for entry in claimed if entry not in merged]
        excused = overridden()
        claimed = [entry for entry in claimed if entry.batch_id not in excused]
        if claimed:
            routes = sorted({entry.label for entry in claimed})
            raise _mismatch(
                route,
                "target_emptied",
                f"the target table is missing or empty, but its ledger records "
                f"{plural(sum(entry.rows for entry in claimed), 'row')} in "
                f"{plural(len(claimed), 'batch')} since it was last replaced (the table was "
                "dropped, renamed or emptied behind the ledger's back); if that was on "
                f"purpose, mark them for loading again with: {_RESTORE}, for each route that "
                f"wrote them ({'; '.join(routes)})",
                batch_ids=sorted(entry.batch_id for entry in claimed),
            )
    mine = [entry for entry in entries if entry.of_route(route)]
    if replaces:
        return None
    if not mine:
        _refuse_another_source(route, live, scope, started)
    last = max((entry.seq for entry in mine), default=-1)
    if route.strategy is not Strategy.MERGE:
        _refuse_merged(route, [e for e in live if e.seq > last and _same_source(e, route)])
    replaced = [e for e in entries if e.replace and e.seq > last and not e.of_route(route)]
    if not mine:  # a new route: only a refresh of its own source table holds its rows
        replaced = [e for e in replaced if _same_source(e, route)]
    if not replaced:
        return None
    by = replaced[-1]
    if _continues(by, route, cursor_column):
        return by
    raise _mismatch(
        route,
        "replaced_by_another_route",
        f"another route ({by.source_table} -> {by.target_table}, {by.strategy}) replaced the "
        "target table after this route's last batch, so this route's state no longer "
        "describes what the target holds and appending from it could duplicate or skip "
        "rows (a route continues after a refresh only from the same source table, with the "
        "same cursor column and a recorded watermark); keep loading the table with that "
        "route, or see what the "
        f"target holds with: {_VERIFY}",
        batch_ids=[by.batch_id],
    )


def _refuse_merged(route: RouteKey, since: Sequence[LedgerEntry]) -> None:
    """An append route after a merge route of its own source into its table: the merge
    loaded the rows of the append route's next windows too (it read the whole source), so
    appending them again would hold each twice (exit 0 before). Refused before the target;
    a merge route's first run into an append route's table is how a route changes to merge
    (docs/incremental.md, 'From append to merge')."""
    merged = [entry for entry in since if entry.strategy is Strategy.MERGE]
    if not merged:
        return
    raise _mismatch(
        route,
        "replaced_by_another_route",
        f"a merge route of the same source table ({merged[-1].label}) merged into the target "
        "table after this route's last batch, so it already holds the rows this route would "
        "append next, and appending them could hold them twice; keep loading the table with "
        "the merge route, or load this route into another table",
        batch_ids=[entry.batch_id for entry in merged],
    )


def _refuse_another_source(
    route: RouteKey,
    live: Sequence[LedgerEntry],
    scope: LatestCheckpoints,
    started: Callable[[], bool] | None,
) -> None:
    """Step 4 of ``check_store_against_target``: a new append route, and the table holds
    batches of its source table read from another source database."""
    others = [
        e for e in live if e.source_table == route.source_table and not _same_source(e, route)
    ]
    if not others:
        return
    if started() if started is not None else any(cp.route == route for cp in scope):
        return
    raise _mismatch(
        route,
        "same_table_other_source",
        f"the target table holds {plural(len(others), 'batch')} of this route's source table "
        f"read from another source database ({'; '.join(sorted({e.label for e in others}))}) "
        "and this route has loaded none yet: if that database is this route's source under "
        "another name or address (a host name and its address, a socket, a replica, a moved "
        "or copied file, or a route of a release that located them apart), appending would "
        f"load its rows twice. If it is the same source, adopt that route's history with: "
        f"{_RESTORE}; if it is another database whose rows belong in this table too, start "
        f"this route on purpose with: {_RESET}",
        batch_ids=sorted(entry.batch_id for entry in others),
    )


def refresh_in_store(
    route: RouteKey,
    scope: LatestCheckpoints,
    cursor_column: str | None,
    *,
    ledgered: bool,
) -> LedgerEntry | None:
    """The store's own memory of a refresh that kept no ledger entry (``ledger = false``): the
    latest committed full refresh into ``route``'s target table, newer (by the workers'
    clocks) than every committed partition of ``route`` (an append route; a route with none
    counts only a refresh of its own source table). With ``ledgered``, the ledger orders the
    others, so only refreshes without a ledger batch count.

    Returned as a ledger entry carrying its watermark (the highest ``cursor_upto`` it
    loaded), so the route continues where it ended; refused as
    ``replaced_by_another_route`` when it cannot continue from it (another source table, no
    cursor column, or another one)."""
    if route.strategy is Strategy.FULL_REFRESH:
        return None
    if ledgered and sum(map(sum, scope.ledger_batches().values())) == len(scope):
        return None  # every checkpoint names its ledger batch: nothing to decode
    committed = [
        (cp.completed_at, cp)
        for cp in scope
        if cp.status is PartitionCheckpointStatus.COMMITTED and cp.completed_at is not None
    ]
    mine = [at for at, cp in committed if cp.route == route]
    dated = [
        (at, cp)
        for at, cp in committed
        if cp.route.strategy is Strategy.FULL_REFRESH
        and (at > max(mine) if mine else _same_source(cp.route, route))
        and not (ledgered and cp.diagnostics.get(LEDGER_BATCH_KEY))
    ]
    if not dated:
        return None
    at, newest = max(dated, key=lambda item: item[0])
    refreshes = [cp for _, cp in dated if cp.route == newest.route]
    generation = newest.partition_bounds.get("generation")
    loaded = [cp for cp in refreshes if cp.partition_bounds.get("generation") == generation]
    definition = newest.diagnostics.get("definition") or {}
    watermark = max((cp.partition_bounds.get("cursor_upto") for cp in loaded), default=None,
                    key=lambda value: (value is not None, value))  # fmt: skip
    entry = LedgerEntry.for_batch(
        newest.route,
        newest.run_id,
        loaded,
        generation=generation if isinstance(generation, int) else 0,
        watermark=watermark,
        cursor_column=definition.get("cursor_column"),
        at=at,
    )
    if not _continues(entry, route, cursor_column, rows=sum(cp.rows_exported for cp in loaded)):
        raise _mismatch(
            route,
            "replaced_by_another_route",
            f"a full refresh ({newest.route.label}) replaced the target table after this "
            "route's last partition, and this route cannot continue from it (another source "
            "table, no cursor column or another one, or rows loaded with no cursor value): "
            "its state no longer describes what the target holds; keep loading the table "
            "with that route, or start this one afresh on purpose",
        )
    return entry


def _for_other_routes(labels: Sequence[str]) -> str:
    if not labels:
        return ""
    return (
        f"; some are of other routes writing this table ({'; '.join(labels)}): restore each "
        "with its own route file"
    )


def _continues(
    by: LedgerEntry, route: RouteKey, cursor_column: str | None, *, rows: int | None = None
) -> bool:
    """Whether ``route`` may go on after ``by``'s refresh of its own source table. A merge
    route merges the whole source again (realigned to no watermark): by key, so what the refresh
    loaded is replaced, and a soft-deleted row it loaded as live is deleted. Another route
    appends above the refresh's watermark of the same cursor column, which is None only when
    the refresh loaded no row (``rows``: ``by.rows`` unless given). A merge after a refresh
    went on from its watermark before and kept those rows (exit 0)."""
    if not _same_source(by, route):
        return False
    if route.strategy is Strategy.MERGE:
        return True
    loaded = by.rows if rows is None else rows
    return (
        cursor_column is not None
        and by.cursor_column == cursor_column
        and (by.watermark is not None or loaded == 0)
    )


def _same_source(entry: LedgerEntry | RouteKey, route: RouteKey) -> bool:
    return (entry.source_location, entry.source_table) == (
        route.source_location,
        route.source_table,
    )


def live_entries(entries: Sequence[LedgerEntry], excused: set[str]) -> list[LedgerEntry]:
    """The entries whose rows the table should hold now (``excused``: operators said not)."""
    return [entry for entry in _since_last_replace(entries) if entry.batch_id not in excused]


def _since_last_replace(entries: Sequence[LedgerEntry]) -> list[LedgerEntry]:
    """The entries whose rows the table may still hold: from its last full replace on, less
    those a later entry excused (``unexcused``)."""
    last = max((entry.seq for entry in entries if entry.replace), default=-1)
    return [entry for entry in unexcused(entries) if entry.seq >= last]


def unexcused(entries: Sequence[LedgerEntry]) -> list[LedgerEntry]:
    """The entries in ledger order, less those a later entry lists as ``excused``: operators
    said the table no longer holds them, and the target remembers it when the store that
    recorded it is lost."""
    ordered = sorted(entries, key=lambda entry: entry.seq)
    excused_at = {batch: entry.seq for entry in ordered for batch in entry.excused}
    return [entry for entry in ordered if excused_at.get(entry.batch_id, -1) < entry.seq]


def ledger_overrides(store: Store, route: RouteKey, *, gone: bool = False) -> set[str]:
    """Batch ids operators resolved against the ledger (``ledger_overrides`` in audit records).

    Read from every route of the store writing ``route``'s target table; a
    store without audit records has none. ``gone``: only those whose rows the
    table no longer holds, so not a ``state reset --from-now``'s (it keeps them). A
    malformed record is ``CheckpointStoreCorrupt``: which batches it lets through is unknown.
    """
    if not (hasattr(store, "list_routes") and hasattr(store, "list_audit")):
        return set()
    target = (route.target_location, route.target_table)
    found: set[str] = set()
    for other in store.list_routes():
        if (other.target_location, other.target_table) != target:
            continue
        for record in store.list_audit(other):
            if (malformed := malformed_audit(other, record)) is not None:
                raise malformed
            if not (gone and record.get("from_now")):
                found.update(record.get("ledger_overrides", ()))
    return found


def excused_batches(
    store: Store, route: RouteKey, read_ledger: Callable[[], Sequence[LedgerEntry]]
) -> list[str]:
    """What a new ledger entry records as ``excused``: the batches of its target table whose
    rows operators said the table no longer holds (``ledger_overrides(gone=True)``) and that
    the ledger still holds as live. The ledger is read only when there are some."""
    gone = ledger_overrides(store, route, gone=True)
    if not gone:
        return []
    return sorted(
        entry.batch_id for entry in _since_last_replace(read_ledger()) if entry.batch_id in gone
    )


# --- proofs and restores ---------------------------------------------------------------------


@attrs.frozen
class Proof:
    """What the target proves of a blocked batch: ``applied``, ``not_applied`` or ``unknown``.

    ``heals``: the proof is conclusive enough for ``recovery = "from_target"`` to resolve the
    batch without a person (``recovery.Prover`` says when). ``unlisted``: applied, though the
    ledger lacks its row (counted by the batch column): its resolution is recorded against
    the ledger, which the store/target check then accepts.
    """

    verdict: str
    reason: str
    rows: int | None = None
    applied_at: str | None = None
    heals: bool = False
    unlisted: bool = False

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


APPLIED, NOT_APPLIED, UNKNOWN = "applied", "not_applied", "unknown"


def restored_checkpoints(
    route: RouteKey, entries: Sequence[LedgerEntry]
) -> list[PartitionCheckpoint]:
    """Committed checkpoints for every partition of this route's ledger entries.

    They carry the entry's ledger batch id and no guard: the ledger, not a
    guard, proves them. A later entry's checkpoint of the same partition wins.
    """
    restored: dict[str, PartitionCheckpoint] = {}
    for entry in sorted((e for e in entries if e.of_route(route)), key=lambda e: e.seq):
        at = datetime.fromisoformat(entry.applied_at)
        for part in entry.partitions:
            restored[part.partition_id] = PartitionCheckpoint(
                partition_id=part.partition_id,
                route=route,
                status=PartitionCheckpointStatus.COMMITTED,
                run_id=entry.run_id,
                query_hash=entry.query_hash,
                schema_hash=entry.schema_hash,
                partition_bounds=dict(part.bounds),
                started_at=at,
                completed_at=at,
                rows_exported=part.rows,
                diagnostics={LEDGER_BATCH_KEY: entry.batch_id},
            )
    return list(restored.values())
