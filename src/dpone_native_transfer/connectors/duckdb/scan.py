"""DuckDB reading a SQLite source with ``sqlite_scan``: the statements of a lazy plan (one
per cursor window) and of a pull (each row tagged with its bound), and the checks before
them (the scanner's types, a probe read of what could fail the load)."""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from ...payloads import Column, LoadPlan, Predicate, bound_predicates, cursor_window
from .._sql import (
    WINDOW_OPERATORS,
    integer_range_starts,
    partition_predicate_count,
    quote,
    ranges_run_on,
    render_predicates,
)
from ..contract.sqlite_file import SQLiteFile
from ..sqlite_reading import inexact_plan, refuse_inexact_plan
from .columns import MAX_DECIMAL_WIDTH
from .connect import duckdb_driver, reraise_interrupt, run

__all__ = [
    "BOUND_TAG",
    "REFUSING_TYPES",
    "number_tests",
    "plan_conditions",
    "probe_instants",
    "probe_numbers",
    "probe_plan_read",
    "scan_params",
    "scan_types",
    "scanned_instants",
    "scanned_numbers",
    "tagged_scan",
    "text_bound_columns",
]

BOUND_TAG = "__dpone_bound"  # the column of a pulled scan naming each row's bound
# The scanner's type of a column whose every value of another storage class it refuses with an
# error (a real in an INTEGER column, a blob in a TEXT one) instead of misreading it.
REFUSING_TYPES = {"integer": "BIGINT", "real": "DOUBLE", "text": "VARCHAR"}


def scan_params(source: SQLiteFile) -> list[str]:
    return [os.path.abspath(source.path), source.table]


def scanned_numbers(columns: Sequence[Column], types: Mapping[str, str]) -> list[Column]:
    """The ``numeric`` columns (``NUMERIC``, ``DECIMAL(p,s)``) the scanner reads as doubles:
    their numbers DuckDB itself checks (``number_tests``), and it refuses any other value with
    an error (a text, a blob)."""
    return [c for c in columns if c.kind == "numeric" and types.get(c.name) == "DOUBLE"]


_EXACT_DOUBLE = 2**53  # every integer of a smaller magnitude is a double
_UNIQUE_DECIMAL = 2**51  # below it, a double is near one decimal of a given scale at most


def number_tests(numbers: Sequence[Column]) -> list[tuple[str, str]]:
    """Per column of ``scanned_numbers``, its name and a test over the scan, true when some
    double the scanner reads is not what the row paths' carrier gives (``duckdb_carrier``).

    Into ``DECIMAL(p,s)``, a double is exact when DuckDB's cast to the decimal and back
    gives the same double, and the decimal times ``10**s`` stays below ``_UNIQUE_DECIMAL``:
    then it is the one decimal of scale ``s`` the double is nearest to, the one
    ``exact_decimal`` takes from the double's shortest text (``0.30000000000000004`` into
    ``(12,2)`` is no such double; an integer beyond ``2**53`` is read as another double and
    is beyond the bound). Into ``DOUBLE``, an integer of at most ``2**53`` (``as_double``):
    a double of that magnitude or more is taken for a misread integer (a real that large
    then has its rows carried, as they would be)."""
    tests = []
    for column in numbers:
        name = quote(column.name)
        decimal = column.decimal(MAX_DECIMAL_WIDTH)
        if decimal is None:
            exact = f"abs({name}) < {_EXACT_DOUBLE}"
        else:
            precision, scale = decimal
            exact = (
                f"abs({name}) * {10**scale} < {_UNIQUE_DECIMAL} AND CAST(TRY_CAST({name} AS"
                f" DECIMAL({precision},{scale})) AS DOUBLE) = {name}"
            )
        test = f"coalesce(bool_or({name} IS NOT NULL AND NOT coalesce({exact}, false)), false)"
        tests.append((column.name, test))
    return tests


# The scanner reads a DATE or TIMESTAMP column's texts leniently (it drops a time after a date,
# reads ' 2020-01-01' and '2020-1-1' as dates, an integer as days since 1970) and fails on a
# blob or a day no month has. lazy-plan's probe reads such a column as the load does (a failed
# read refuses the plan; a pull's own read fails the pull), and both test its texts read as
# text (``probe_instants``): the form ``_PLAN_MISREAD`` takes,
# a real date (DuckDB's cast and back gives the same text) from year 1 on. DuckDB's scan of
# lineitem's three dates took 0.2 s where SQLite's test took 0.6-0.7 s.
_DATE_TEXT = "[0-9]{4}-[0-9]{2}-[0-9]{2}"
_REAL_DATE = (
    "regexp_full_match({c}, '" + _DATE_TEXT + "') AND substr({c}, 1, 4) <> '0000'"
    " AND CAST(TRY_CAST({c} AS DATE) AS VARCHAR) = {c}"
)
_UP_TO_SECONDS = "replace(substr({c}, 1, 19), 'T', ' ')"
_REAL_INSTANT = (
    "regexp_full_match({c}, '" + _DATE_TEXT + r"[ T][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?"
    r"(Z|\+00:00)?') AND substr({c}, 1, 4) <> '0000'"
    f" AND CAST(TRY_CAST({_UP_TO_SECONDS} AS TIMESTAMP) AS VARCHAR) = {_UP_TO_SECONDS}"
)
_INSTANT_TEXTS = {
    ("date", "DATE"): _REAL_DATE,
    ("timestamp", "TIMESTAMP"): f"({_REAL_DATE}) OR ({_REAL_INSTANT})",
}


def scanned_instants(columns: Sequence[Column], types: Mapping[str, str]) -> list[Column]:
    """The ``date`` and ``timestamp`` columns the scanner reads as DATE and TIMESTAMP, whose
    texts DuckDB checks itself before lazy-plan and pulls (``probe_instants``)."""
    return [c for c in columns if (c.kind, types.get(c.name)) in _INSTANT_TEXTS]


def _instant_tests(instants: Sequence[Column], types: Mapping[str, str]) -> list[tuple[str, str]]:
    """Per column of ``scanned_instants``, a test over a scan reading every column as text,
    true when some value is not a text the carriers keep as the scanner reads it."""
    tests = []
    for column in instants:
        name = quote(column.name)
        exact = _INSTANT_TEXTS[column.kind, types[column.name]].replace("{c}", name)
        test = f"coalesce(bool_or({name} IS NOT NULL AND NOT coalesce({exact}, false)), false)"
        tests.append((column.name, test))
    return tests


def probe_numbers(conn: Any, source: SQLiteFile, numbers: Sequence[Column], table: str) -> None:
    """``number_tests`` in one scan, for a pull (which has no other probe before it)."""
    _probe(conn, source, number_tests(numbers), (), numbers, table)


def probe_plan_read(
    conn: Any,
    source: SQLiteFile,
    columns: Sequence[Column],
    types: Mapping[str, str],
    refusing: Collection[str],
    table: str,
) -> None:
    """Before lazy-plan's target call, read what its load will read that could fail it (the
    route then blocked): every column whose misread values the scanner refuses (a read of
    such a value fails), and every VARCHAR, for a text that is not UTF-8 (the scanner reads
    its bytes; DuckDB's ``decode`` tells); and check the numbers of ``scanned_numbers``
    (``number_tests``). One scan, cheaper than SQLite's own ``typeof`` tests (figures:
    docs/performance.md, fix 30); the columns of ``scanned_instants`` are read in it too,
    and their texts tested in a second scan that reads every column as text. A failed read
    has SQLite name the columns (``refuse_inexact_plan``); the refusal is ``inexact_plan``'s
    either way."""
    instants = scanned_instants(columns, types)
    texts = [column.name for column in columns if types.get(column.name) == "VARCHAR"]
    tests = [
        (
            n,
            f"coalesce(bool_or(try(decode(encode({quote(n)}))) IS NULL AND {quote(n)} IS NOT"
            " NULL), false)",
        )
        for n in texts
    ] + number_tests(scanned_numbers(columns, types))
    tested = {name for name, _ in tests}
    counted = [name for name in refusing if name not in tested]
    counted += [column.name for column in instants if column.name not in counted]
    _probe(conn, source, tests, counted, columns, table)
    probe_instants(conn, source, columns, types, table)


def probe_instants(
    conn: Any, source: SQLiteFile, columns: Sequence[Column], types: Mapping[str, str], table: str
) -> None:
    """The texts of ``scanned_instants``, tested in one scan that reads every column as text.
    Their typed read, which fails on a blob or a day no month has, is the load's or the
    pull's own (``probe_plan_read`` reads them for lazy-plan)."""
    instants = scanned_instants(columns, types)
    if not instants:
        return
    run(conn, "SET SESSION sqlite_all_varchar = true")  # ``RESET`` left every integer failing
    try:
        _probe(conn, source, _instant_tests(instants, types), (), columns, table)
    finally:
        run(conn, "SET SESSION sqlite_all_varchar = false")


def _probe(
    conn: Any,
    source: SQLiteFile,
    tests: Sequence[tuple[str, str]],
    counted: Sequence[str],
    columns: Sequence[Column],
    table: str,
) -> None:
    """One scan of ``tests`` (a column's name, and a test true when the load would not read
    it exactly) and of a read of each ``counted`` column; refused naming the columns found.
    A failed scan is refused naming SQLite's findings (``refuse_inexact_plan``), or else
    the columns read."""
    every = [test for _, test in tests] + [f"count({quote(name)}) < 0" for name in counted]
    if not every:
        return
    try:
        found = run(
            conn, f"SELECT {', '.join(every)} FROM sqlite_scan(?, ?)", scan_params(source)
        ).fetchone()
        failing = [name for (name, _), bad in zip(tests, found, strict=False) if bad]
    except Exception as error:  # DuckDB's, of any type (a message it cannot decode...)
        reraise_interrupt(error)
        refuse_inexact_plan(source, columns, engine="DuckDB", table=table)
        failing = [*(name for name, _ in tests), *counted]  # the scanner cannot read them
    if failing:
        raise inexact_plan("DuckDB", table, failing)


def scan_types(conn: Any, source: SQLiteFile) -> dict[str, str]:
    """Each source column's type as the scanner reads it (``conn`` has the scanner); none when
    it cannot read the file (SQLite's own read then says why, as a ``SourceInvalid``)."""
    try:
        described = run(conn, "DESCRIBE SELECT * FROM sqlite_scan(?, ?)", scan_params(source))
    except duckdb_driver().Error:
        return {}
    return {row[0]: row[1] for row in described.fetchall()}


def text_bound_columns(source: SQLiteFile, bounds: Sequence[Mapping[str, Any]]) -> set[str]:
    """The partition and cursor columns some bound compares with a text value."""
    keys = {
        source.partition_column: ("partition", "partition_from", "partition_below"),
        source.cursor_column: ("cursor_after", "cursor_upto"),
    }
    return {
        column
        for column, names in keys.items()
        if column is not None and any(isinstance(b.get(key), str) for b in bounds for key in names)
    }


def plan_conditions(
    source: SQLiteFile,
    bounds: Sequence[Mapping[str, Any]],
    textual: Collection[str] = (),
) -> list[tuple[str, list[Any], list[Mapping[str, Any]]]]:
    """One condition per cursor window, selecting all of the window's planned partitions,
    with the window's bounds.

    ``sqlite_scan`` pushes no filter down to SQLite, so every statement reads
    the whole table: one statement per window instead of one per partition.
    Columns in ``textual`` are compared as text.
    """

    def name(column: str) -> str:
        return f"CAST({quote(column)} AS VARCHAR)" if column in textual else quote(column)

    def predicates_of(item: Mapping[str, Any]) -> tuple[Predicate, ...]:
        return bound_predicates(
            item, partition_column=source.partition_column, cursor_column=source.cursor_column
        )

    windows: dict[tuple[Any, Any], tuple[list[Predicate], list[Mapping[str, Any]]]] = {}
    for item in bounds:
        predicates = predicates_of(item)  # bad bounds fail here, before the target
        window = [predicate for predicate in predicates if predicate.op in WINDOW_OPERATORS]
        key = (item.get("cursor_after"), item.get("cursor_upto"))
        windows.setdefault(key, (window, []))[1].append(item)
    partition = name(source.partition_column)
    conditions = []
    for window, items in windows.values():
        values = [item["partition"] for item in items if "partition" in item]
        known = [value for value in values if value is not None]
        matches, params = [], []
        if known:
            matches.append(f"{partition} IN (SELECT UNNEST(?))")
            params.append(known)
        if len(known) < len(values):
            matches.append(f"{partition} IS NULL")
        ranges = [item for item in items if "partition" not in item]
        if ranges and not known and ranges_run_on(ranges):  # every key: one test, not an OR each
            matches.append(f"{partition} IS NOT NULL")
            ranges = []
        for item in ranges:  # a key range: its own condition
            ranged = [p for p in predicates_of(item) if p not in window]
            where, range_params = render_predicates(ranged, marker="?", name=name)
            matches.append(f"({where})")
            params += range_params
        where, window_params = render_predicates(window, marker="?", name=name)
        match = "(" + " OR ".join(matches) + ")"
        condition = f"{match} AND {where}" if where else match
        conditions.append((condition, params + window_params, items))
    return conditions


def tagged_scan(source: SQLiteFile, plan: LoadPlan, textual: Collection[str]) -> tuple[str, list]:
    """The plan's rows with the index of the bound each belongs to (``BOUND_TAG``); rows of
    no bound (a partition that appeared after planning) are left out. Partitions of one value
    each in one cursor window are tagged by a hash join on their values (cheaper than a
    ``CASE`` of every value; figures: docs/performance.md, fix 19); other bounds by their own
    conditions."""

    def name(column: str) -> str:
        ref = f"s.{quote(column)}"
        return f"CAST({ref} AS VARCHAR)" if column in textual else ref

    predicates = [
        bound_predicates(
            bounds, partition_column=source.partition_column, cursor_column=source.cursor_column
        )
        for bounds in plan.bounds
    ]
    window = predicates[0][1:]
    values = [p[0].value for p in predicates]
    tag, names = quote(BOUND_TAG), ", ".join(f"s.{quote(c.name)}" for c in plan.columns)
    if all(p[0].op in ("=", "IS NULL") and p[1:] == window for p in predicates) and len(
        {(type(value), value) for value in values}
    ) == len(values):
        where, params = render_predicates(window, marker="?", name=name)
        sql = (
            f"SELECT {names}, b.{tag} FROM sqlite_scan(?, ?) AS s JOIN (SELECT UNNEST(?) AS v,"
            f" UNNEST(range(?)) AS {tag}) AS b ON {name(source.partition_column)}"
            " IS NOT DISTINCT FROM b.v"
        )
        return sql + (f" WHERE {where}" if where else ""), [
            *scan_params(source),
            values,
            len(values),
            *params,
        ]
    ranged = _integer_ranges(source, plan, textual, name)
    if ranged is not None:
        return ranged
    cases, params = [], []
    for index, bound in enumerate(predicates):
        where, bound_params = render_predicates(bound, marker="?", name=name)
        cases.append(f"WHEN {where or 'TRUE'} THEN {index}")
        params += bound_params
    sql = (
        f"SELECT * FROM (SELECT {names}, CASE {' '.join(cases)} END AS {tag}"
        f" FROM sqlite_scan(?, ?) AS s) WHERE {tag} IS NOT NULL"
    )
    return sql, [*params, *scan_params(source)]


def _integer_ranges(
    source: SQLiteFile, plan: LoadPlan, textual: Collection[str], name: Callable[[str], str]
) -> tuple[str, list] | None:
    """``tagged_scan`` of integer key ranges that run on (``integer_range_starts``), and the
    NULL key's partition, in one cursor window: each row tagged by an ``ASOF`` join on the
    ranges' starts, not a ``CASE`` of each range's condition, whose work per row grows with
    the ranges (figures: docs/performance.md, fix 56). None for other plans, or a key DuckDB
    does not read as integers."""
    key_column = source.partition_column
    kinds = {column.name: column.kind for column in plan.columns}
    if kinds.get(key_column) != "integer" or key_column in textual:
        return None
    nulls = [n for n, b in enumerate(plan.bounds) if "partition" in b]
    if len(nulls) > 1 or any(plan.bounds[n]["partition"] is not None for n in nulls):
        return None
    numbers = [n for n in range(len(plan.bounds)) if n not in nulls]
    found = integer_range_starts([plan.bounds[n] for n in numbers])
    windows = [cursor_window(b) for b in plan.bounds]
    if found is None or any(window != windows[0] for window in windows):
        return None
    starts, below = found
    first = plan.bounds[numbers[0]]
    window = bound_predicates(
        first, partition_column=key_column, cursor_column=source.cursor_column
    )[partition_predicate_count(first) :]
    where, params = render_predicates(window, marker="?", name=name)
    key, tag = name(key_column), quote(BOUND_TAG)
    keyed = f"{key} >= ?" + (f" AND {key} < ?" if below is not None else "")
    keys = f"({keyed} OR {key} IS NULL)" if nulls else keyed
    conditions = [keys, *([where] if where else [])]
    names = ", ".join(f"s.{quote(c.name)}" for c in plan.columns)
    null_tag = nulls[0] if nulls else "NULL"
    sql = (
        f"SELECT {names}, CASE WHEN {key} IS NULL THEN {null_tag} ELSE b.{tag} END AS {tag}"
        f" FROM sqlite_scan(?, ?) AS s ASOF LEFT JOIN (SELECT UNNEST(?::BIGINT[]) AS start,"
        f" UNNEST(?::INTEGER[]) AS {tag}) AS b ON {key} >= b.start"
        f" WHERE {' AND '.join(conditions)}"
    )
    return sql, [
        *scan_params(source),
        starts,
        numbers,
        min(starts),
        *([below] if below is not None else []),
        *params,
    ]
