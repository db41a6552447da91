"""A merge on a key in SQL (``payloads.Merge``), shared by the SQLite, DuckDB and PostgreSQL
sinks: the statements that move one batch, loaded into a temporary table, into the target
table, inside the load's own transaction (before its ledger row).

Delete and insert rather than ``INSERT ... ON CONFLICT`` or ``MERGE``: it needs no unique
constraint on the target (a table dpone did not create may have none), deletes a key's
every row (a table that already held duplicates ends with one), and is one plan on all
three engines. A table with a unique index on exactly the key takes one statement instead:
PostgreSQL 15 and later its own ``MERGE`` (``merge_into_statements``), DuckDB and older
PostgreSQL an upsert (``upsert_statements``), each faster there. ``docs/connectors.md``
("Merge") has the measurements behind the choice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from ..errors import ConfigInvalid
from ..payloads import Column, Merge
from ._sql import RESERVED_PREFIX, quote

__all__ = [
    "LOOSE_KEY",
    "LOOSE_VERSION",
    "NARROWER",
    "MERGE_BATCH",
    "MERGE_WINNERS",
    "asks",
    "key_constraint",
    "loosely_compared_key",
    "loosely_ordered_version",
    "merge_into_statements",
    "merge_statements",
    "narrower_unique",
    "unmergeable",
    "upsert_statements",
]

MERGE_BATCH = RESERVED_PREFIX + "merge_batch"  # the batch's rows, every version (temporary)
MERGE_WINNERS = RESERVED_PREFIX + "merge_winners"  # each key's winning row (temporary)
_RANK = RESERVED_PREFIX + "merge_rank"
_TARGET, _WINNER = "dpone_target", "dpone_winner"  # the aliases of the two tables


def key_constraint(merge: Merge | None, *, name: Callable[[str], str] = quote) -> str:
    """The ``PRIMARY KEY`` clause of a target table a merge route creates ("" otherwise)."""
    if merge is None:
        return ""
    return f", PRIMARY KEY ({', '.join(name(column) for column in merge.key)})"


def merge_statements(
    target: str,
    batch: str,
    names: Sequence[str],
    merge: Merge,
    *,
    name: Callable[[str], str] = quote,
    row_id: Sequence[str] = (),
    collated: Mapping[str, str] | None = None,
    distinct_on: bool = False,
) -> list[str]:
    """The statements that merge table ``batch`` (columns ``names``) into table ``target``
    (both quoted, qualified as needed), in order:

    1. each key's winner into ``MERGE_WINNERS``: the highest version, then the other columns
       in their order, each highest first, NULL last (``ROW_NUMBER``: one row per key);
    2. delete the target rows of the winners' keys unless newer than the winner (a higher
       version; a NULL version is the lowest): ``DELETE ... USING``, or with ``row_id``
       (SQLite, which has no ``USING``) by what identifies a row, found by a join: ``rowid``,
       or a ``WITHOUT ROWID`` table's primary key columns (quoted);
    3. insert the winners that are not deleted and whose key has no target row left (one
       left is newer);
    4. drop both temporary tables.

    ``collated``: a column's collation clause wherever it is ordered (PostgreSQL's text
    columns, `` COLLATE "C"``: in byte order, as the other engines and a SQLite source order
    them: the version, and the other columns that break a tie).
    ``distinct_on``: the winners by ``DISTINCT ON`` in the same order (PostgreSQL: 3.9 ms
    against ``ROW_NUMBER``'s 7.6 ms for 10,000 rows; DuckDB's was slower, 7.0 against 4.7).
    """
    key, deleted = merge.key, merge.deleted
    collated = collated or {}
    chosen = _winners(batch, names, merge, name=name, collated=collated, distinct_on=distinct_on)
    winners = f"CREATE TEMP TABLE {name(MERGE_WINNERS)} AS {chosen}"
    same_key, kept, gone = _matched(merge, name, collated)
    if row_id:  # SQLite: no DELETE ... USING; a join finds the rows by the key's index
        found = ", ".join(f"{_TARGET}.{column}" for column in row_id)
        delete = (
            f"DELETE FROM {target} WHERE ({', '.join(row_id)}) IN (SELECT {found} FROM"
            f" {name(MERGE_WINNERS)} AS {_WINNER} JOIN {target} AS {_TARGET}"
            f" ON {same_key}{kept})"
        )
    else:  # a join: DuckDB ran a correlated EXISTS 10x slower (0.26 s against 0.026 s)
        delete = (
            f"DELETE FROM {target} AS {_TARGET} USING {name(MERGE_WINNERS)} AS {_WINNER}"
            f" WHERE {same_key}{kept}"
        )
    loaded = [n for n in names if n != deleted]
    live = "" if deleted is None else f" AND {gone} = 0"
    insert = (
        f"INSERT INTO {target} ({', '.join(name(n) for n in loaded)})"
        f" SELECT {', '.join(f'{_WINNER}.{name(n)}' for n in loaded)}"
        f" FROM {name(MERGE_WINNERS)} AS {_WINNER} LEFT JOIN {target} AS {_TARGET}"
        f" ON {same_key} WHERE {_TARGET}.{name(key[0])} IS NULL{live}"
    )  # an anti-join: SQLite ran NOT EXISTS as a scan of a keyless target per winner
    drops = [f"DROP TABLE {name(MERGE_WINNERS)}", f"DROP TABLE {batch}"]
    return [winners, delete, insert, *drops]


def _winners(
    batch: str,
    names: Sequence[str],
    merge: Merge,
    *,
    name: Callable[[str], str],
    collated: Mapping[str, str],
    distinct_on: bool,
) -> str:
    """The ``SELECT`` of each key's winner in ``batch`` (``merge_statements``, step 1)."""
    key, version = merge.key, merge.version
    order = [n for n in names if n not in key and n != version]
    ranking = [n for n in ([version] if version else []) + order]
    listed = ", ".join(name(n) for n in names)
    keys = ", ".join(name(k) for k in key)
    highest = ", ".join(f"{name(n)}{collated.get(n, '')} DESC NULLS LAST" for n in ranking)
    if distinct_on:
        return (
            f"SELECT DISTINCT ON ({keys}) {listed}"
            f" FROM {batch} ORDER BY {keys}{', ' + highest if highest else ''}"
        )
    rank = _RANK  # a name no source column has: the filter below would read that column
    while rank in names:
        rank += "_"
    over = f"PARTITION BY {keys}{' ORDER BY ' + highest if highest else ''}"
    return (
        f"SELECT {listed} FROM (SELECT {listed}, ROW_NUMBER() OVER ({over}) AS {name(rank)}"
        f" FROM {batch}) AS dpone_ranked WHERE {name(rank)} = 1"
    )


def merge_into_statements(
    target: str,
    batch: str,
    names: Sequence[str],
    merge: Merge,
    *,
    unloaded: Sequence[str] = (),
    name: Callable[[str], str] = quote,
    collated: Mapping[str, str] | None = None,
) -> list[str]:
    """``merge_statements``' effect in one PostgreSQL (15 and later) ``MERGE``, for a target
    with a unique index on exactly the key (as ``upsert_statements``): each key's winner
    (``DISTINCT ON``) matched to its target row, which is deleted (a deleted winner) or
    updated unless newer; a winner with no target row is inserted unless deleted. Then the
    batch's table is dropped. ``unloaded``: as ``upsert_statements``'.

    Measured on a 1,000,000-row target, 10,000 changed rows (``docs/connectors.md``, "Merge"):
    no winners' table, no second join: 0.054 s against the upsert's 0.065 s. PostgreSQL
    estimates a ``DISTINCT`` of a table without statistics at 200 rows, so it looks each
    winner up in the key's index rather than scanning the target."""
    key, deleted = merge.key, merge.deleted
    collated = collated or {}
    chosen = _winners(batch, names, merge, name=name, collated=collated, distinct_on=True)
    same_key, kept, gone = _matched(merge, name, collated)
    loaded = [n for n in names if n != deleted]
    sets = [f"{name(n)} = {_WINNER}.{name(n)}" for n in loaded if n not in key]
    sets += [f"{name(n)} = DEFAULT" for n in unloaded]
    clauses = []
    if deleted is not None:
        clauses.append(f"WHEN MATCHED AND {gone} <> 0{kept} THEN DELETE")
    if sets:  # a deleted winner's row is gone by the clause above, or kept as newer
        clauses.append(f"WHEN MATCHED{kept} THEN UPDATE SET {', '.join(sets)}")
    clauses.append(
        f"WHEN NOT MATCHED{f' AND {gone} = 0' if deleted else ''} THEN INSERT"
        f" ({', '.join(name(n) for n in loaded)})"
        f" VALUES ({', '.join(f'{_WINNER}.{name(n)}' for n in loaded)})"
    )
    statement = (
        f"MERGE INTO {target} AS {_TARGET} USING ({chosen}) AS {_WINNER} ON {same_key} "
        + " ".join(clauses)
    )
    return [statement, f"DROP TABLE {batch}"]


def _matched(
    merge: Merge, name: Callable[[str], str], collated: Mapping[str, str]
) -> tuple[str, str, str]:
    """A winner and a target row compared: the join on the key; `` AND NOT`` the target row
    newer ("" without a version); the winner's deleted column as an integer, 0 when live
    ("" without one): true is a boolean true or an integer other than 0, as integers, which
    every engine casts both to."""
    same_key = " AND ".join(f"{_WINNER}.{name(k)} = {_TARGET}.{name(k)}" for k in merge.key)
    version, deleted = merge.version, merge.deleted
    collate = "" if version is None else collated.get(version, "")
    kept = "" if version is None else f" AND NOT {_newer(name(version), _WINNER, collate)}"
    gone = f"COALESCE(CAST({_WINNER}.{name(deleted)} AS INTEGER), 0)" if deleted else ""
    return same_key, kept, gone


def _newer(version: str, winner: str, collate: str = "") -> str:
    """The target row's version is higher than the winner's (a NULL version is the lowest)."""
    return (
        f"({_TARGET}.{version} IS NOT NULL AND ({winner}.{version} IS NULL"
        f" OR {_TARGET}.{version}{collate} > {winner}.{version}{collate}))"
    )


def upsert_statements(
    target: str,
    batch: str,
    names: Sequence[str],
    merge: Merge,
    *,
    unloaded: Sequence[str] = (),
    name: Callable[[str], str] = quote,
    collated: Mapping[str, str] | None = None,
    around_delete: tuple[Sequence[str], Sequence[str]] = ((), ()),
    distinct_on: bool = False,
) -> list[str]:
    """``merge_statements``' effect, for a PostgreSQL or DuckDB target with a unique index
    on exactly the key (an ``ON CONFLICT`` arbiter; the tables a merge route creates): the
    winners, then the deleted winners' target rows removed unless newer, then ``INSERT ...
    ON CONFLICT DO UPDATE`` of the live winners unless the target row is newer.
    ``unloaded``: target columns the batch lacks, set to their default as a re-inserted row
    would have them.

    ``around_delete``: statements run just before and after the deleted keys' DELETE (the
    PostgreSQL sink steers its plan there: ``postgres_sink._delete_plan``).

    Measured on a 1,000,000-row target (``docs/connectors.md``, "Merge"): DuckDB looks the
    upserted keys up in the key's index instead of joining the whole table."""
    winners, _, _, *drops = merge_statements(
        target, batch, names, merge, name=name, collated=collated, distinct_on=distinct_on
    )
    key, version, deleted = merge.key, merge.version, merge.deleted
    collated = collated or {}
    same_key, kept, gone = _matched(merge, name, collated)
    statements = [winners]
    if deleted is not None:
        delete = (
            f"DELETE FROM {target} AS {_TARGET} USING {name(MERGE_WINNERS)} AS {_WINNER}"
            f" WHERE {same_key} AND {gone} <> 0{kept}"
        )
        before, after = around_delete
        statements += [*before, delete, *after]
    loaded = [n for n in names if n != deleted]
    sets = [f"{name(n)} = EXCLUDED.{name(n)}" for n in loaded if n not in key]
    sets += [f"{name(n)} = DEFAULT" for n in unloaded]
    action = "NOTHING"
    if sets:
        collate = collated.get(version, "") if version else ""
        when = "" if version is None else f" WHERE NOT {_newer(name(version), 'EXCLUDED', collate)}"
        action = f"UPDATE SET {', '.join(sets)}{when}"
    statements.append(
        f"INSERT INTO {target} AS {_TARGET} ({', '.join(name(n) for n in loaded)})"
        f" SELECT {', '.join(f'{_WINNER}.{name(n)}' for n in loaded)}"
        f" FROM {name(MERGE_WINNERS)} AS {_WINNER}"
        f"{'' if deleted is None else f' WHERE {gone} = 0'}"
        f" ON CONFLICT ({', '.join(name(k) for k in key)}) DO {action}"
    )
    return [*statements, *drops]


# Pairs of texts a key tells apart (Python does, and so does the batch's winner ranking):
# a target key column whose comparison finds one pair equal (a case- or accent-insensitive
# collation, trailing spaces ignored, citext) would meet two batch keys as one target key.
# An ``é`` composed and decomposed (``e`` and U+0301): a collation that normalises (DuckDB's
# NFC, a nondeterministic ICU one) meets them as one key.
_TOLD_APART = (("a", "A"), ("e", "\u00e9"), ("a", "a "), ("\u00e9", "e\u0301"))


NARROWER = "a primary key or unique constraint of the table holds only part of the merge's key"


def narrower_unique(
    uniques: Sequence[Sequence[str]], merge: Merge, *, fold: Callable[[str], str] = str
) -> bool:
    """Whether one of the table's unique column sets is a proper part of the merge's key: two
    keys the merge keeps apart (``(a, 1)``, ``(b, 1)``) would then violate it inside the
    target call. ``fold``: the engine's own name matching."""
    key = {fold(name) for name in merge.key}
    return any(set(map(fold, columns)) < key for columns in uniques if columns)


LOOSE_KEY = "it compares a key column more loosely than the merge (texts it finds equal differ)"


# Kinds a target may keep as text although the source compares their values otherwise:
# 1.0 and 1.00 are one numeric, '1 day' and '24:00:00' one interval, but two texts (a key);
# 9 < 10, but '10' < '9' (a cursor). A SQLite column of no type is a key as its values'
# texts are: its mixed values are refused as they are read, where a target keeps text.
_NOT_TEXT_KEY = frozenset({"numeric", "decimal", "interval"})
_NOT_TEXT = _NOT_TEXT_KEY | {"any"}


def refuse_text_compared(
    merge: Merge, columns: Sequence[Column], *, kept_as_text: Callable[[Column], bool], target: str
) -> None:
    """Refuse, before the target call, a key or cursor column of a merge route that the target
    keeps as text (``kept_as_text``) although the source compares its values otherwise, and
    a key or cursor of a case-insensitive source type (``citext``), which no target compares
    so: the merge would keep two versions of one key, miss a delete, or keep an older
    version as the newer (exit 0). ``target``: the target's name in the message."""
    for column in columns:
        role = "primary_key" if column.name in merge.key else None
        role = "cursor_column" if column.name == merge.version else role
        if role is None:
            continue
        kinds = _NOT_TEXT if role == "cursor_column" else _NOT_TEXT_KEY
        texted = column.kind in kinds and kept_as_text(column)
        folded = isinstance(column.decltype, str) and column.decltype.strip().lower() == "citext"
        if texted or folded:
            why = "is case-insensitive (citext)" if folded else f"keeps it as text ({column.kind})"
            raise ConfigInvalid(
                f"source.{role} column {column.name!r} of a merge route cannot be compared as "
                f"the source compares it: {target} {why}, so two versions of one key, or an "
                "older and a newer version, would be told apart otherwise; nothing was "
                "written. Use a column of integers, texts, dates or timestamps, or a view "
                "that casts it",
                diagnostics={"key": f"source.{role}", "column": column.name},
            )


def asks(merge: Merge, columns: Sequence[Column]) -> bool:
    """Whether a target could refuse this merge by ``narrower_unique`` (a key of two columns
    or more), ``loosely_compared_key`` (a text key column) or ``loosely_ordered_version`` (a
    text cursor): if not, a check opens no connection (each costs a run time)."""
    compared = (*merge.key, merge.version)
    text = any(column.name in compared and column.kind == "text" for column in columns)
    return text or len(merge.key) > 1


def loosely_compared_key(
    count: Callable[[str], int],
    target: str,
    merge: Merge,
    columns: Sequence[Column],
    *,
    name: Callable[[str], str] = quote,
) -> str | None:
    """The first text key column the target compares more loosely than the batch, or None:
    ``count(sql)`` runs one query (it reads no row of the target: the column only lends its
    comparison to constants) and returns its one value."""
    for column in columns:
        if column.name not in merge.key or column.kind != "text":
            continue
        for one, other in _TOLD_APART:
            typed = _typed_as(name(column.name), target, one)
            if count(f"{typed} WHERE dpone_probe.dpone_key = '{other}'"):
                return column.name
    return None


def _typed_as(column: str, target: str, text: str) -> str:
    """A count over one row holding ``text`` with ``column``'s type and collation, reading no
    row of ``target`` (the column only lends them to the constant); a condition follows."""
    return (
        f"SELECT count(*) FROM (SELECT {column} AS dpone_key FROM {target}"
        f" WHERE 1 = 0 UNION ALL SELECT '{text}') AS dpone_probe"
    )


INEXACT_TYPE = (
    "a key or cursor column's type does not keep every source value as it is (it rounds, "
    "cuts or normalises some), so two keys could meet as one or an older version be kept"
)


def inexactly_held(
    merge: Merge,
    columns: Sequence[Column],
    target_types: Mapping[str, str],
    holds: Callable[[Column, str], bool],
) -> str | None:
    """The first key or cursor column whose target type (``target_types``, by the batch's
    column name; a column the table lacks is left to the schema check) ``holds`` says does
    not keep each source value as it is, or None. A hand-made ``timestamp(0)`` cursor kept
    ``10:00:01`` for ``10:00:00.6``, and a newer ``10:00:00.9`` lost (exit 0); a ``name`` key
    cut two 64-byte keys to one."""
    compared = (*merge.key, merge.version)
    for column in columns:
        target_type = target_types.get(column.name)
        if column.name in compared and target_type is not None and not holds(column, target_type):
            return column.name
    return None


LOOSE_VERSION = (
    "it orders the cursor column otherwise than by its bytes (a case-insensitive collation or "
    "type), so an older version could be kept as the newer"
)
# Pairs of texts the merge orders, the first higher (byte order): a target cursor column that
# orders one pair otherwise (SQLite or DuckDB NOCASE, PostgreSQL char(n) or citext) would keep
# a target row as newer than the batch's winner (``_newer``), or replace it by an older one.
_ORDERED = (("a", "B"), ("\u00e9", "f"), ("a ", "a"))


def loosely_ordered_version(
    count: Callable[[str], int],
    target: str,
    merge: Merge,
    columns: Sequence[Column],
    *,
    name: Callable[[str], str] = quote,
    collate: str = "",
) -> str | None:
    """The cursor column, when it is text and the target orders it otherwise than plain texts
    (the batch's columns) are ordered, else None; ``count(sql)`` as ``loosely_compared_key``'s
    (no row of the target is read). ``collate``: as ``merge_statements``' (a column type
    that orders case-insensitively whatever its collation, ``citext``, is still found)."""
    if not any(c.name == merge.version and c.kind == "text" for c in columns):
        return None
    version = str(merge.version)
    for one, other in _ORDERED:
        plain = f"SELECT count(*) FROM (SELECT '{one}' AS dpone_key) AS dpone_probe"
        above = f" WHERE dpone_probe.dpone_key{collate} > '{other}'"
        if count(_typed_as(name(version), target, one) + above) != count(plain + above):
            return version
    return None


def unmergeable(table: str, why: str, *, column: str | None = None) -> ConfigInvalid:
    """The refusal of a target table a merge cannot run on exactly, before the target call:
    a retry cannot fix it, so the route is not blocked; the operator changes the table."""
    named = "" if column is None else f" (column {column!r})"
    return ConfigInvalid(
        f'target table {table!r} cannot take [transfer] strategy = "merge": {why}{named}. '
        "Nothing was written; change the table (or let dpone create it), or use another "
        "strategy",
        diagnostics={"table": table, **({} if column is None else {"column": column})},
    )
