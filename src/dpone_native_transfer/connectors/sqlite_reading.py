"""A SQLite file other engines read: what an engine that reads a ``SQLiteFile`` source
itself (SQLite's ``ATTACH``, DuckDB's ``sqlite_scan``, ClickHouse's ``sqlite()``) checks and
reads around that read.

``contract/sqlite_file.py`` says what such a source offers (``SQLiteFile``, a Protocol);
this module is the engines' side of it: the plan's source as a ``SQLiteFile``
(``pulled_file``), the refusal of a plan an engine would not read exactly
(``refuse_inexact_plan``), the watch for writes during the engine's read
(``watching_writes``), dpone's own read of the rows when that read is thrown away
(``plan_rows``), and when dpone's read of a narrow cursor window is cheaper than the
engine's (``narrow_plan``). It imports no connector: the DuckDB and ClickHouse sinks use
it without loading the SQLite source or sink.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

from ..errors import ConfigInvalid
from ..identity import upper_ascii
from ..payloads import Column, LoadPlan, Predicate, bound_predicates
from ._sql import partition_predicate_count, render_predicates
from ._sql import quote as _quote
from .contract import DEFAULT_CHUNK_ROWS, PlanInexact, Unsupported
from .contract.sqlite_file import SQLiteFile

__all__ = [
    "NOT_AN_INTEGER",
    "NOT_A_NUMBER",
    "index_seeks",
    "held_as_declared",
    "inexact_plan",
    "narrow_plan",
    "narrow_window",
    "number_text_misread",
    "plan_rows",
    "pulled_file",
    "refuse_inexact_plan",
    "watching_writes",
]

# Kinds another engine's own SQLite reader (DuckDB's scanner, ClickHouse's sqlite()) reads
# exactly as the row paths carry them; other kinds need a carrier, so lazy-plan carries
# their rows (``PlanInexact``) and a pull is declined.
_PLAN_KINDS = frozenset({"integer", "real", "text", "blob", "boolean", "date", "timestamp"})
_DATE = "[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]"
# SQLite's date functions take any day up to 31 and hour 24 as they are; ``'+0 days'`` has
# them normalised (``2021-02-29`` is ``2021-03-01``), so a date that is not a real one differs
# from its text. Year 0 (1 BC) is refused, as the carriers refuse it (by ``substr``: a column
# of NUMERIC affinity compares ``c >= '0001'`` with the number 1). Without these tests chDB
# loaded ``2021-02-29`` as 2021-03-01, its timestamp as NULL, and year 0 as 2026 (exit 0).
_REAL_DAY = "substr({c}, 1, 4) <> '0000' AND "
_ISO_DATE = f"({{c}} GLOB '{_DATE}' AND {_REAL_DAY}date({{c}}, '+0 days') IS {{c}})"


def _iso_timestamp(endings: str) -> str:
    """A SQL test of ``YYYY-MM-DD[ T]HH:MM:SS[.f{1,6}]``, a real instant, followed by one of
    ``endings`` (a SQL list of texts). SQLite's text functions stop at a NUL, which chDB
    then read as part of the text (a NULL): the text's bytes are as many as its characters."""
    after_fraction = "ltrim(substr({c}, 21), '0123456789')"
    return (
        f"({{c}} GLOB '{_DATE}[ T][0-9][0-9]:[0-9][0-9]:[0-9][0-9]*' AND {_REAL_DAY}"
        "length(CAST({c} AS BLOB)) = length({c}) AND "
        "strftime('%Y-%m-%d %H:%M:%S', substr({c}, 1, 19), '+0 days') IS"
        " replace(substr({c}, 1, 19), 'T', ' ')"
        f" AND (substr({{c}}, 20) IN {endings} OR (substr({{c}}, 20, 1) = '.'"
        f" AND {after_fraction} IN {endings}"
        f" AND length({{c}}) - length({after_fraction}) BETWEEN 21 AND 26)))"
    )


# Without an offset, or at UTC's own, ``Z`` or ``+00:00`` (``2013-01-01T10:00:00Z``): the
# engines' SQL reads drop that offset (DuckDB's scanner) or apply it (ClickHouse's cast),
# the instant the row paths carry either way. Any other offset is a misread: DuckDB's
# reader drops it, where the row paths apply it.
_ISO_TIMESTAMP = _iso_timestamp("('', 'Z', '+00:00')")

# Per kind, a SQL test of one stored value that such a reader would read otherwise than the
# row paths' carriers accept (SQLite keeps any value in any column): one read of the source.
# Each test sees a value that is not NULL (``_misread_test``): ``typeof(c) <> 'integer'``
# after ``c IS NOT NULL`` costs less than ``typeof(c) NOT IN ('integer', 'null')``.
_PLAN_MISREAD = {
    "integer": "typeof({c}) <> 'integer'",
    "real": "typeof({c}) <> 'real'"  # a real passes at the first test
    " AND (typeof({c}) <> 'integer' OR abs({c}) > 9007199254740992)",
    "text": "typeof({c}) <> 'text'",
    "blob": "typeof({c}) NOT IN ('blob', 'text')",
    "boolean": "typeof({c}) <> 'integer' OR {c} NOT IN (0, 1)",
    "date": f"typeof({{c}}) <> 'text' OR NOT {_ISO_DATE}",
    "timestamp": f"typeof({{c}}) <> 'text' OR NOT ({_ISO_DATE} OR {_ISO_TIMESTAMP})",
}

# Not a number: the test of a ``numeric`` column an engine reads as a double and whose numbers
# it then checks itself (DuckDB's scanner; ``refuse_inexact_plan``'s ``engine_reads``).
NOT_A_NUMBER = "typeof({c}) NOT IN ('integer', 'real')"
# Not an integer: the same for a ``DECIMAL(p,0)`` column, whose carrier refuses a real even
# when it is whole (``12.0`` has a decimal), which the engine, reading doubles, cannot tell.
NOT_AN_INTEGER = "typeof({c}) <> 'integer'"


def number_text_misread(decimal: tuple[int, int] | None) -> str:
    """The test of a ``numeric`` column an engine reads as the text SQLite gives of each
    value (ClickHouse's ``sqlite()``), and converts to ``Decimal(p, s)`` (``decimal``) or to
    ``Float64``: true of a value that text would not carry as the row paths do.

    An integer is its exact digits: misread beyond the decimal's integer digits, or, into
    ``Float64``, beyond ``2**53`` (``as_double``). SQLite's text of a real has 15 significant
    digits: exact when it reads back as the same double, without an exponent, with at most
    ``s`` decimals and fewer integer digits than the decimal holds; then it is the double's
    shortest text, which ``exact_decimal`` and ``as_double`` carry."""
    text = "CAST({c} AS TEXT)"
    real = f"instr({text}, 'e') = 0 AND CAST({text} AS REAL) = {{c}}"
    if decimal is None:
        whole = "{c} BETWEEN -9007199254740992 AND 9007199254740992"
    else:
        precision, scale = decimal
        digits = precision - scale
        whole = f"{{c}} > -1e{digits} AND {{c}} < 1e{digits}" if digits <= 18 else "1"
        real += f" AND length({text}) - instr({text}, '.') <= {scale} AND {{c}} > -1e{digits}"
        real += f" AND {{c}} < 1e{digits}"
    return (
        f"CASE typeof({{c}}) WHEN 'integer' THEN NOT ({whole}) WHEN 'real' THEN NOT ({real})"
        " ELSE 1 END"
    )


def _misread_test(column: Column, engine_reads: Mapping[str, str]) -> str:
    """``_PLAN_MISREAD``'s test of ``column`` (``engine_reads``' for its columns), true of a
    value the reader would misread."""
    name = _quote(column.name)
    test = engine_reads.get(column.name) or _PLAN_MISREAD[column.kind]
    return f"{name} IS NOT NULL AND ({test.format(c=name)})"


@contextlib.contextmanager
def watching_writes(source: SQLiteFile) -> Iterator[Callable[[], bool]]:
    """A check whether another connection committed to ``source`` since entering: SQLite's
    ``data_version``, read on a connection of its own. An engine's read of the source is not
    one SQLite snapshot (DuckDB's scanner missed a row moved to a new rowid meanwhile), so a
    read during which the source was written is thrown away and dpone reads the rows itself
    (connectors.md, "DuckDB target").

    Until the check, that connection holds a read transaction. The engine's SQLite is a
    second copy of SQLite in this process, and POSIX locks belong to the process: closing any
    of dpone's connections to the file dropped the engine's locks, and chDB then read rows a
    writer moved twice (SQLite's "multiple copies of SQLite" hazard). While one of its
    connections holds a lock, Python's SQLite defers such a close."""

    def version() -> int:
        return int(watch.execute("PRAGMA data_version").fetchone()[0])

    def written() -> bool:
        if watch.in_transaction:
            watch.execute("COMMIT")
        return version() != before

    with source.reader(live=True) as watch:
        before = version()
        watch.execute("BEGIN")
        watch.execute("SELECT count(*) FROM sqlite_master").fetchone()  # takes the read lock
        yield written


def plan_rows(
    source: SQLiteFile, bounds: Sequence[Mapping[str, Any]], columns: Sequence[Column]
) -> Iterator[list[tuple]]:
    """The ``columns`` of a plan's ``bounds`` as the row paths read them, for a sink that
    threw its engine's read of the source away (``watching_writes``): in one scan when the
    source splits one (``read_partitions``, which reads the described columns), otherwise
    one statement per bound."""
    if len(bounds) >= 2:
        if [c.name for c in columns] == [c.name for c in source.describe().columns]:
            scan = source.read_partitions(bounds)
            if scan is not None:
                yield from (rows for _, rows in scan)
                return
    for each in bounds:
        sql, params = source.select_sql(each, columns=columns)
        with source.reader() as conn:
            cursor = conn.execute(sql, params)
            while chunk := cursor.fetchmany(DEFAULT_CHUNK_ROWS):
                yield chunk


def pulled_file(plan: LoadPlan, *, engine: str, table: str) -> SQLiteFile:
    """The plan's source, when ``engine`` can pull it: a table in a SQLite file."""
    if not isinstance(plan.source, SQLiteFile):
        raise Unsupported(
            f"an engine that reads this source ({engine} reads SQLite sources only)", table=table
        )
    return plan.source


def refuse_inexact_plan(
    source: SQLiteFile,
    columns: Sequence[Column],
    *,
    engine: str,
    table: str,
    reader_refuses: Collection[str] = (),
    engine_reads: Mapping[str, str] | None = None,
) -> None:
    """``PlanInexact`` for a lazy plan another engine would not read exactly as the row
    paths carry it (lazy-plan then carries the rows itself; a pull is declined).

    ``engine_reads`` maps columns of a kind outside what every such reader carries
    exactly to the test (as in ``_PLAN_MISREAD``) of a value the caller's engine reads
    otherwise: ``NOT_A_NUMBER`` for DuckDB's ``NUMERIC`` and ``DECIMAL(p,s)`` columns, whose
    doubles DuckDB checks itself, ``number_text_misread`` for ClickHouse's.

    Such are: a source whose text is UTF-16 (SQLite orders it otherwise than by code
    point); partition or cursor columns it would filter differently
    (``collated_columns``); columns of a kind outside what its SQLite reader
    carries exactly; and columns holding a value it would misread (a real in
    an integer column, a text boolean, a date with a time, a timestamp with an
    offset), found by one read of the source.

    The read skips the columns of a table that SQLite itself keeps free of such
    values (``held_as_declared``), and, in an ordinary table, the columns named
    in ``reader_refuses``: those whose every misread value the engine's reader
    refuses with an error (a REAL column's affinity keeps integers out of it).
    Only a caller whose failed read costs nothing may name any: a pull before the
    target call (``EnginePull.pull_load_files``), or a check that has the reader read those
    columns itself before it (DuckDB's ``probe_plan_read``, which also tests the texts of
    the dates and timestamps it names here).
    """
    with source.reader() as conn:
        utf16 = conn.execute("PRAGMA encoding").fetchone()[0] != "UTF-8"
    if utf16:  # a grouped pull of text key ranges loaded some rows twice and lost others
        raise PlanInexact(
            f"{engine} cannot filter the source's text as SQLite does: the source database's "
            f"text is UTF-16, which SQLite orders by its bytes, not by code point as {engine} "
            "does",
            diagnostics={"table": table},
        )
    collated = source.collated_columns()
    if collated:
        raise PlanInexact(
            f"{engine} cannot filter source column(s) {', '.join(collated)} as SQLite does: "
            "they are declared with a collation (COLLATE NOCASE, RTRIM or another), so "
            f"{engine} would select other rows than the source's partitions",
            diagnostics={"table": table, "columns": collated},
        )
    tested = dict(engine_reads or {})
    inexact = [
        column.name
        for column in columns
        if column.kind not in _PLAN_KINDS and column.name not in tested
    ]
    if not inexact:
        with source.reader() as conn:
            inexact = _misread_columns(conn, source.table, columns, reader_refuses, tested)
    if inexact:
        raise inexact_plan(engine, table, inexact)


def inexact_plan(engine: str, table: str, columns: Sequence[str]) -> PlanInexact:
    """The refusal of a lazy plan whose ``columns`` the engine would not read exactly."""
    return PlanInexact(
        f"{engine} cannot read source column(s) {', '.join(columns)} exactly ({engine} reads "
        "them by their declared type, which differs from what dpone carries)",
        diagnostics={"table": table, "columns": list(columns)},
    )


def _misread_columns(
    conn: sqlite3.Connection,
    table: str,
    columns: Sequence[Column],
    reader_refuses: Collection[str],
    engine_reads: Mapping[str, str],
) -> list[str]:
    """The columns holding a value ``_PLAN_MISREAD`` finds, in one scan that stops at the first
    (``refuse_inexact_plan``)."""
    held = held_as_declared(conn, table)
    if held is None:  # a view or a virtual table: any value in any column
        held, reader_refuses = set(), ()
    tests = [
        (column.name, _misread_test(column, engine_reads))
        for column in columns
        if (column.kind in _PLAN_MISREAD or column.name in engine_reads)
        and column.name not in held
        and column.name not in reader_refuses
    ]
    if not tests:
        return []
    anything = " OR ".join(f"({test})" for _, test in tests)
    if not conn.execute(
        f"SELECT EXISTS (SELECT 1 FROM {_quote(table)} WHERE {anything})"
    ).fetchone()[0]:
        return []
    checks = ", ".join(f"coalesce(max({test}), 0)" for _, test in tests)
    found = conn.execute(f"SELECT {checks} FROM {_quote(table)}").fetchone()
    return [name for (name, _), misread in zip(tests, found, strict=True) if misread]


def held_as_declared(conn: sqlite3.Connection, table: str) -> set[str] | None:
    """The columns of an ordinary table that SQLite itself keeps to their declared storage
    class: its rowid (an ``INTEGER PRIMARY KEY`` without its own index), and every typed
    column of a ``STRICT`` table. None for a view or a virtual table, whose declared types
    bind no value (a view's column can hold what any arm of a ``UNION`` gives)."""
    try:
        listed = conn.execute(
            "SELECT type, wr, strict FROM pragma_table_list WHERE schema = 'main' AND name = ?",
            (table,),
        ).fetchone()
    except sqlite3.OperationalError:  # before SQLite 3.37: no table_list
        return None
    if listed is None or listed[0] != "table":
        return None
    _, without_rowid, strict = listed
    info = conn.execute("SELECT name, type, pk FROM pragma_table_info(?)", (table,)).fetchall()
    held = {name for name, declared, _ in info if strict and upper_ascii(declared) != "ANY"}
    keys = [(name, declared) for name, declared, pk in info if pk]
    indexed_key = conn.execute(
        "SELECT 1 FROM pragma_index_list(?) WHERE origin = 'pk'", (table,)
    ).fetchone()
    rowid_key = len(keys) == 1 and upper_ascii(keys[0][1]) == "INTEGER"
    if rowid_key and not without_rowid and not indexed_key:
        held.add(keys[0][0])  # the rowid (``INTEGER PRIMARY KEY DESC`` gets an index: not it)
    return held


def index_seeks(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = (None,)) -> bool:
    """Whether SQLite answers ``sql`` (one ``?`` unless ``params``) by seeking an index, not
    by a scan."""
    plan = conn.execute(f"EXPLAIN QUERY PLAN {sql}", tuple(params)).fetchall()
    return len(plan) == 1 and plan[0][3].startswith("SEARCH") and " USING " in plan[0][3]


def narrow_window(
    conn: sqlite3.Connection,
    table: str,
    window: Sequence[Predicate],
    *,
    name: Callable[[str], str],
    share: int = 4,
) -> bool:
    """Whether the cursor ``window`` is a range SQLite seeks in an index, holding under
    ``1/share`` of ``table``'s rows. dpone's read of it through that index then costs less
    than a read per partition through the partition column's index, which SQLite without
    statistics prefers to the cursor's and which reads every row of the partition whatever
    its cursor (a quarter: both are dpone's reads); or than an engine's scan of the whole
    file (DuckDB's and chDB's SQLite readers use no index), whose row costs about a tenth
    of dpone's (``narrow_plan``: a sixteenth). Figures: docs/performance.md, fix 77. A
    window without a lower bound (a first load) is never narrow. ``name``: a column's
    reference in ``table``."""
    if not any(p.op in (">", ">=") for p in window):
        return False
    where, params = render_predicates(window, marker="?", name=name)
    quoted = _quote(table)
    try:
        if not index_seeks(conn, f"SELECT 1 FROM {quoted} WHERE {where}", params):
            return False
        span = conn.execute(  # each end alone: SQLite seeks it
            f"SELECT (SELECT max(rowid) FROM {quoted}) - (SELECT min(rowid) FROM {quoted})"
        ).fetchone()[0]
    except sqlite3.OperationalError:  # a WITHOUT ROWID table, a view: no rowid
        return False
    most = (span or 0) // share
    found = conn.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM {quoted} WHERE {where} LIMIT ?)", (*params, most)
    ).fetchone()[0]
    return found < most


def narrow_plan(plan: LoadPlan) -> bool:
    """Whether a plan of a ``SQLiteFile`` reads one cursor window narrow enough
    (``narrow_window``, a sixteenth) that an engine declines to pull it: dpone reads it
    through the index."""
    source = plan.source
    if not isinstance(source, SQLiteFile) or not plan.bounds:
        return False
    windows = []
    for bounds in plan.bounds:
        try:
            predicates = bound_predicates(
                bounds, partition_column=source.partition_column, cursor_column=source.cursor_column
            )
        except ConfigInvalid:  # refused where the rows are read
            return False
        windows.append(predicates[partition_predicate_count(bounds) :])
    if any(repr(window) != repr(windows[0]) for window in windows):
        return False
    table = source.table

    def name(column: str) -> str:
        return f"{_quote(table)}.{_quote(column)}"

    with source.reader() as conn:
        return narrow_window(conn, table, windows[0], name=name, share=_ENGINE_SHARE)


_ENGINE_SHARE = 16
