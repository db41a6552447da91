"""A merge on a key (``payloads.Merge``) into ClickHouse: a ``ReplacingMergeTree`` target.

ClickHouse has no transaction and no ``DELETE ... USING`` a load could run with its rows, so a
merge route's table keeps every key's versions and the engine keeps the last: a table dpone
creates is ``ReplacingMergeTree(_dpone_version, _dpone_deleted) ORDER BY <key>``, and a
reader sees the merged rows with ``SELECT ... FROM t FINAL`` (``FINAL`` leaves out a key
whose last row is a delete). Four columns dpone keeps beside the source's:

- ``_dpone_version`` (UInt64): the order in which batches were applied, one number per
  batch, higher than any the table holds; the engine keeps each key's highest.
- ``_dpone_deleted`` (UInt8): 1 for a key the batch deletes (the engine's ``is_deleted``).
- ``_dpone_batch`` (String): the batch id of the row's batch.
- ``_dpone_rows`` (UInt64): how many of its batch's rows the row stands for (its key's
  versions and deletes in the batch): the batch's rows counted by ``_dpone_batch`` add up to
  what dpone sent, which proves a batch after a crash (``Sink.batch_rows``).

One ``INSERT ... SELECT`` per batch, from a plain table of the batch's rows, writes one row
per key of the batch: the batch's winner (ranked as ``_merge.merge_statements`` ranks it),
or, when the merged view holds a newer version of the key (a higher cursor), that version
again. So the cursor decides, exactly as on the other targets and for any cursor type, and
every row of the batch is the highest version of its key: no background merge removes one
before a later batch exists, and none exists before this one is proven (the route is
blocked, and leased, meanwhile). See docs/connectors.md, "Merge on a key".
"""

from __future__ import annotations

from collections.abc import Sequence

from ...payloads import Column, Merge
from .._merge import unmergeable
from .._sql import RESERVED_PREFIX, TableName
from .sql import DEDUPLICATION_WINDOW, column_type, quote

__all__ = [
    "BATCH",
    "DELETED",
    "MERGE_ALIAS",
    "MERGE_COLUMNS",
    "ROWS",
    "VERSION",
    "merge_insert_sql",
    "merge_table_problem",
    "merge_table_sql",
    "orders_as_source",
]

VERSION = RESERVED_PREFIX + "version"
DELETED = RESERVED_PREFIX + "deleted"
BATCH = RESERVED_PREFIX + "batch"
ROWS = RESERVED_PREFIX + "rows"
MERGE_COLUMNS = {VERSION: "UInt64", DELETED: "UInt8", BATCH: "String", ROWS: "UInt64"}
_ENGINE = f"ReplacingMergeTree({VERSION}, {DELETED})"
MERGE_ALIAS = RESERVED_PREFIX + "merge_"  # the statement's own columns: d, del, new, n, rank, rows


def orders_as_source(column: Column) -> bool:
    """Whether ClickHouse orders ``column``'s values as the source does, so it can be a merge
    route's version: a kind it keeps as text orders as text only when it is one (a decimal
    without a precision, an interval or a value of any type is not)."""
    return column_type(column) != "Nullable(String)" or column.kind in ("text", "blob", "time")


def merge_table_sql(table: TableName, columns: Sequence[tuple[str, str]], merge: Merge) -> str:
    """The target table of a merge route: ``columns`` ((name, type): the source's, less the
    deleted column), then dpone's four, ordered by the key (unpartitioned: a background
    merge replaces rows only within one partition)."""
    listed = [f"{quote(name)} {kind}" for name, kind in columns]
    listed += [f"{quote(name)} {kind}" for name, kind in MERGE_COLUMNS.items()]
    key = ", ".join(quote(name) for name in merge.key)
    return (
        f"CREATE TABLE IF NOT EXISTS {table.sql(quote)} ({', '.join(listed)})"
        f" ENGINE = {_ENGINE} ORDER BY ({key})"
        f" SETTINGS allow_nullable_key = 1, {DEDUPLICATION_WINDOW}"
    )


def merge_table_problem(
    table: str,
    engine_full: str,
    sorting_key: str,
    partition_key: str,
    types: dict[str, str],
    key: str,
) -> Exception | None:
    """The refusal of an existing table a merge cannot run on, or None: it must be the table
    ``merge_table_sql`` makes (the engine with dpone's version and deleted columns, ordered
    by exactly the key, ``key`` as ClickHouse formats it, unpartitioned, dpone's columns in
    their types)."""
    made = f"the {_ENGINE} table a merge route makes (docs/connectors.md)"
    if not engine_full.startswith(_ENGINE):
        return unmergeable(table, f"it is not {made}")
    if sorting_key not in (key, f"({key})"):  # ORDER BY (id) is shown so
        return unmergeable(
            table, f"its ORDER BY is not the merge's key, in key order, as in {made}"
        )
    if partition_key:  # a background merge keeps one row per key only within a partition
        return unmergeable(table, f"it is partitioned, unlike {made}")
    for name, kind in MERGE_COLUMNS.items():
        if types.get(name) != kind:
            return unmergeable(table, f"it lacks the column {name} {kind} of {made}")
    return None


def merge_insert_sql(
    target: str,
    batch: str,
    batch_names: Sequence[str],
    target_names: Sequence[str],
    merge: Merge,
    *,
    settings: str,
) -> str:
    """The one ``INSERT ... SELECT`` that merges table ``batch`` (columns ``batch_names``)
    into ``target`` (its columns ``target_names``, dpone's four left out), parameters
    ``{version:UInt64}`` and ``{batch:String}``:

    1. the batch's rows, with a route's cursor also the merged view's rows of the batch's
       keys (``FINAL``: a deleted key has none);
    2. per key, the first by the cursor, highest first, NULL last, then the batch's before
       the target's (a tie goes to the batch), then the batch's other columns in their
       order, each highest first, NULL last (``_merge.merge_statements``' ranking);
    3. that row, its deleted flag, and how many of the batch's rows its key had.
    """
    key, version, deleted = merge.key, merge.version, merge.deleted
    alias = {name: quote(MERGE_ALIAS + name) for name in ("d", "del", "new", "n", "rank", "rows")}
    loaded = [name for name in batch_names if name != deleted]
    # a target column named as the deleted column (another route loaded it) stays unwritten:
    # ``NULL AS`` it would shadow the batch's column in ``flag``, and no delete would apply
    extra = [name for name in target_names if name not in loaded and name != deleted]
    written = [quote(name) for name in loaded + extra]
    flag = (
        "toUInt8(0)" if deleted is None else f"toUInt8(coalesce(toInt64({quote(deleted)}), 0) != 0)"
    )
    batch_side = [quote(name) for name in loaded] + [f"NULL AS {quote(name)}" for name in extra]
    if deleted is not None:
        batch_side.append(f"{quote(deleted)} AS {alias['d']}")
    batch_side += [f"{flag} AS {alias['del']}", f"toUInt8(1) AS {alias['new']}",
                   f"toUInt64(1) AS {alias['n']}"]  # fmt: skip
    rows = f"SELECT {', '.join(batch_side)} FROM {batch}"
    keys = ", ".join(quote(name) for name in key)
    if version is not None:  # the merged view's versions of the batch's keys compete
        target_side = [*written, *(["NULL"] if deleted is not None else [])]
        target_side += [quote(DELETED), "toUInt8(0)", "toUInt64(0)"]
        rows += (
            f" UNION ALL SELECT {', '.join(target_side)} FROM {target} FINAL"
            f" WHERE ({keys}) IN (SELECT {keys} FROM {batch})"
        )
    ranking = [f"{quote(version)} DESC NULLS LAST"] if version is not None else []
    ranking.append(f"{alias['new']} DESC")
    others = [name for name in batch_names if name not in key and name != version]
    ranking += [
        f"{alias['d'] if name == deleted else quote(name)} DESC NULLS LAST" for name in others
    ]
    over = f"PARTITION BY {keys}"
    ranked = (
        f"SELECT {', '.join(written)}, {alias['del']},"
        f" row_number() OVER ({over} ORDER BY {', '.join(ranking)}) AS {alias['rank']},"
        f" sum({alias['n']}) OVER ({over}) AS {alias['rows']} FROM ({rows})"
    )
    dpone = ", ".join(quote(name) for name in MERGE_COLUMNS)
    return (
        f"INSERT INTO {target} ({', '.join(written)}, {dpone}){settings}"
        f" SELECT {', '.join(written)}, {{version:UInt64}}, {alias['del']}, {{batch:String}},"
        f" {alias['rows']} FROM ({ranked}) WHERE {alias['rank']} = 1"
    )
