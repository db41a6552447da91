"""What paths hand to connectors: the source's shape, rows, or a plan to pull rows.

These are connector-neutral; a connector for another database accepts the
same payloads.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from .column_types import Column
from .errors import ConfigInvalid
from .wording import one_line

__all__ = [
    "Column",
    "ColumnDifference",
    "LoadFile",
    "LoadFiles",
    "LoadPlan",
    "Merge",
    "Predicate",
    "RowChunks",
    "SourceShape",
    "RANGE_EDGES",
    "UPTO_OR_NULL",
    "bound_predicates",
    "bounds_label",
    "cursor_window",
    "difference",
]

RANGE_EDGES = ("partition_from", "partition_below")  # a key range's bounds keys
_PARTITION_KEYS = ("partition", *RANGE_EDGES)


def cursor_window(bounds: Mapping[str, Any]) -> dict[str, Any]:
    """A partition's cursor window: its bounds without the partition's own keys. Partitions
    with equal windows are read by one scan (``Source.read_partitions``)."""
    return {key: value for key, value in bounds.items() if key not in _PARTITION_KEYS}


@attrs.frozen(kw_only=True)
class SourceShape:
    """The extraction's columns and the hashes that identify its query and schema."""

    columns: tuple[Column, ...]
    query_hash: str
    schema_hash: str


@attrs.frozen(kw_only=True)
class Merge:
    """A merge route's instruction to the sink (``docs/incremental.md``, "Merge"): the batch's
    rows replace the target's rows of the same ``key``.

    Per key the batch's winner is its row with the highest ``version`` (the cursor column;
    NULL lowest), ties broken by the other columns in their order, each highest first,
    NULL last: the same rows give the same winner. The winner replaces the key's target
    rows unless one of them has a higher version (monotonic: an older batch applied again
    changes nothing); a winner whose ``deleted`` column is true (a boolean true, a non-zero
    integer) only removes them. ``deleted`` is never written to the target. Without a
    version the batch's row always wins."""

    key: tuple[str, ...]
    version: str | None = None
    deleted: str | None = None

    def target_columns(self, columns: Sequence[Column]) -> tuple[Column, ...]:
        """The target table's columns: the batch's, less the deleted column."""
        return tuple(column for column in columns if column.name != self.deleted)


@attrs.frozen(kw_only=True)
class RowChunks:
    """Rows for a sink, as bounded chunks consumed once; ``replace`` means full refresh,
    ``merge`` a merge on a key (``Merge``); neither: append."""

    columns: tuple[Column, ...]
    chunks: Iterable[Sequence[tuple]]
    replace: bool = False
    merge: Merge | None = None


@attrs.frozen(kw_only=True)
class LoadPlan:
    """No rows: the sink pulls each partition's rows from ``source`` itself."""

    source: Any  # a connectors.contract.Source (records import no connector)
    columns: tuple[Column, ...]
    bounds: tuple[Mapping[str, Any], ...]
    replace: bool = False  # no merge: a merge route's rows are read by dpone (its keys checked)


@attrs.frozen(kw_only=True)
class LoadFile:
    """One file of rows a path wrote before the target call, and the digest of its bytes.

    ``native``: the engine's own format (``EnginePull.write_load_file``), which the
    engine reads itself; otherwise the runtime's spool format (``artifacts.read_chunks``).
    """

    path: Path
    rows: int
    sha256: str
    native: bool


@attrs.frozen(kw_only=True)
class LoadFiles(RowChunks):
    """Rows already in files a path wrote before the target call. A sink whose engine wrote
    them loads the files themselves, so the call only reads them; any other sink takes
    ``chunks``, the spool files' rows (only such a sink is ever given native files)."""

    files: tuple[LoadFile, ...]


@attrs.frozen
class ColumnDifference:
    """How the source's columns differ from the target table's (``Sink.column_difference``)."""

    added: list[Column]  # source columns the target table lacks
    dropped: list[str]  # target columns the source lacks
    retyped: list[str] = attrs.field(factory=list)  # columns whose target type cannot take them
    # dropped columns an insert must fill: they take no NULL and have no default
    required: list[str] = attrs.field(factory=list)
    # source columns the table has but an insert may not write: computed by the table
    # (generated, identity, materialized), or of a type the load's cannot be assigned to
    unwritable: list[str] = attrs.field(factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.dropped or self.retyped or self.unwritable)


def difference(
    existing: Sequence[tuple[str, str]] | None,
    columns: Sequence[Column],
    *,
    fold: Callable[[str], str] = str,
    takes: Callable[[Column, str], bool] = lambda column, target_type: True,
    required: Sequence[str] = (),
    unwritable: Sequence[str] = (),
) -> ColumnDifference | None:
    """``Sink.column_difference`` from the target table's (name, type) pairs (None or
    empty: no table), matching names after ``fold`` (the engine's own name matching);
    ``takes(column, target_type)`` says whether a target column can hold the source's;
    ``required``: the target columns an insert must fill (NOT NULL, no default);
    ``unwritable``: the target columns an insert may not write (listed among ``existing``
    or not: SQLite's table_info leaves generated columns out)."""
    if not existing:
        return None
    types = {fold(name): target_type for name, target_type in existing}
    computed = {fold(name) for name in unwritable}
    wanted = {fold(column.name) for column in columns}
    dropped = [name for name, _ in existing if fold(name) not in wanted | computed]
    filled = {fold(name) for name in required}
    retyped = [
        column.name
        for column in columns
        if fold(column.name) in types and not takes(column, types[fold(column.name)])
    ]
    return ColumnDifference(
        added=[c for c in columns if fold(c.name) not in types and fold(c.name) not in computed],
        dropped=dropped,
        required=[name for name in dropped if fold(name) in filled],
        retyped=retyped,
        unwritable=[c.name for c in columns if fold(c.name) in computed and c.name not in retyped],
    )


# A full refresh's upper cursor bound: at most the value, or NULL.
UPTO_OR_NULL = "<= OR NULL"


@attrs.frozen
class Predicate:
    """A condition of a partition's bounds: ``=``, ``IS NULL``, ``IS NOT NULL``, ``>``, ``>=``,
    ``<``, ``<=`` or ``<= OR NULL``."""

    column: str
    op: str
    value: Any = None


def bound_predicates(
    bounds: Mapping[str, Any], *, partition_column: str, cursor_column: str | None
) -> tuple[Predicate, ...]:
    """What one partition's bounds select, for a connector to render in its own SQL dialect.

    ``bounds`` is ``{"partition": value, "cursor_after": a, "cursor_upto": b}``
    (cursor keys optional). A NULL partition value means ``IS NULL``. With
    ``"cursor_nulls": true`` (a full refresh's bounds) the upper bound also
    keeps rows whose cursor is NULL: ``<= OR NULL``. An append's edge
    partitions (``cursor_edge.py``) use ``"cursor_from"`` (``>=``) or
    ``"cursor_null": true`` (the cursor ``IS NULL``). A range partition
    (``partition_by = "range"``) has ``"partition_from"`` (``>=``) and
    ``"partition_below"`` (``<``) instead of ``"partition"``; None is unbounded.
    Bounds without a partition, or with a cursor window on a source without a
    cursor column, raise ``ConfigInvalid``.
    """
    ranged = isinstance(bounds, Mapping) and "partition_from" in bounds
    if not isinstance(bounds, Mapping) or ("partition" not in bounds and not ranged):
        raise ConfigInvalid("partition bounds must hold a 'partition' key")
    if ranged:
        limits = (("partition_from", ">="), ("partition_below", "<"))
        predicates = [
            Predicate(partition_column, op, bounds[key])
            for key, op in limits
            if bounds.get(key) is not None
        ] or [Predicate(partition_column, "IS NOT NULL")]  # one range holds every key
    elif bounds["partition"] is None:
        predicates = [Predicate(partition_column, "IS NULL")]
    else:
        predicates = [Predicate(partition_column, "=", bounds["partition"])]
    upto = UPTO_OR_NULL if bounds.get("cursor_nulls") is True else "<="
    window = (("cursor_after", ">"), ("cursor_from", ">="), ("cursor_upto", upto))
    for key, op in (*window, ("cursor_null", "IS NULL")):
        if bounds.get(key) is None or bounds.get(key) is False:  # 0 is a cursor value
            continue
        if cursor_column is None:
            raise ConfigInvalid("a cursor window needs a source with a cursor column")
        predicates.append(Predicate(cursor_column, op, None if op == "IS NULL" else bounds[key]))
    return tuple(predicates)


_LABEL_VALUE = 40  # characters of a value a progress line shows


def bounds_label(bounds: Mapping[str, Any], partition_column: str) -> str:
    """A partition as people name it in progress lines: ``region=eu``, ``region IS NULL``,
    ``id in [100, 200)``; long values are cut. For reading only, never parsed back."""

    def shown(value: Any) -> str:
        text = one_line(str(value))  # a newline in a value cannot split the progress line
        return text if len(text) <= _LABEL_VALUE else text[: _LABEL_VALUE - 1] + "…"

    column = one_line(partition_column)
    if "partition" in bounds:
        value = bounds["partition"]
        return f"{column} IS NULL" if value is None else f"{column}={shown(value)}"
    low, high = bounds.get("partition_from"), bounds.get("partition_below")
    low_text = "-inf" if low is None else shown(low)
    high_text = "+inf" if high is None else shown(high)
    return f"{column} in [{low_text}, {high_text})"
