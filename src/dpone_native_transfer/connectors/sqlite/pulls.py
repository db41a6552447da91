"""SQLite's engine pulls: a plan's partitions copied from a SQLite source into new SQLite
load files (one, or one per partition) in one read transaction of the source, and pulled
files merged into one when there are more than SQLite attaches at once. What
``SQLiteSink.pull_load_files`` and ``merge_load_files`` do; the sink loads such a file by one
``INSERT ... SELECT`` from its one table (``PULLED_TABLE``)."""

from __future__ import annotations

import bisect
import contextlib
import errno
import itertools
import os
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from ...artifacts import check_digest, create_private, file_sha256
from ...payloads import LoadFile, LoadFiles, LoadPlan
from .._sql import quote as _quote
from ..contract.sqlite_file import SQLiteFile
from .common import TIMEOUT, as_stored, column_list, file_uri, is_strict

__all__ = ["PULLED_TABLE", "merge_pulled", "pull_each", "pull_one"]

PULLED_TABLE = '"rows"'  # the one table of a pulled SQLite load file


@contextlib.contextmanager
def _pulling(source: SQLiteFile) -> Iterator[sqlite3.Connection]:
    """A scratch connection with ``source``'s file attached read-only as ``src``."""
    scratch = sqlite3.connect(":memory:", timeout=TIMEOUT, isolation_level=None)
    with contextlib.closing(scratch) as conn:
        conn.execute("ATTACH DATABASE ? AS src", (file_uri(source.path, read_only=True),))
        yield conn


def _create_pulled(conn: sqlite3.Connection, path: Path, schema: str, names: str) -> None:
    """A new private SQLite file at ``path`` of one untyped table, attached as ``schema``."""
    create_private(path).close()
    conn.execute(f"ATTACH DATABASE ? AS {schema}", (file_uri(os.fspath(path), read_only=False),))
    conn.execute(f"PRAGMA {schema}.journal_mode = OFF")  # a new file: a failure removes it
    conn.execute(f"PRAGMA {schema}.synchronous = OFF")  # its digest is taken after it is closed
    conn.execute(f"CREATE TABLE {schema}.{PULLED_TABLE} ({names})")


def pull_one(plan: LoadPlan, path: Path) -> list[int] | None:
    """The plan's partitions in a new SQLite file at ``path``, each value as the source stores
    it (untyped columns), in one read transaction of the source; each bound's count, or None
    when they cannot be counted (``_counted``).

    The rows are those each partition's own read selects (``select_sql``), or, where the
    source reads the plan in one statement (``table_sql``: one scan of an unindexed table,
    or the whole table), that statement's, counted by partition value afterwards."""
    source = plan.source
    assert isinstance(source, SQLiteFile)  # can_pull
    columns, names = plan.columns, column_list(plan.columns)
    with _pulling(source) as conn:
        _create_pulled(conn, path, "out", names)
        insert = f"INSERT INTO out.{PULLED_TABLE} ({names}) "
        conn.execute("BEGIN")
        whole = source.table_sql(plan.bounds, conn=conn, schema="src", columns=columns)
        counts: list[int] | None
        if whole is None:
            counts = [
                conn.execute(insert + sql, params).rowcount
                for sql, params in (
                    source.select_sql(bounds, schema="src", columns=columns)
                    for bounds in plan.bounds
                )
            ]
        else:
            copied = conn.execute(insert + whole[0], whole[1]).rowcount
            counts = _counted(conn, source, plan)
            if counts is not None and sum(counts) != copied:
                counts = None  # a row of no bound, or of two
        if counts is None:
            conn.execute("ROLLBACK")
            return None
        conn.execute("COMMIT")
    return counts


def pull_each(plan: LoadPlan, paths: Sequence[Path]) -> list[int] | None:
    """Each bound's partition in a new SQLite file of its own (file-artifact), as ``pull_one``
    writes one; each bound's count, or None.

    The source is read in one read transaction, as ``pull_one`` reads it, into a work file:
    a writer moving a row between partitions meanwhile neither loses nor doubles it. An
    attached file's transaction cannot span an ``ATTACH``, so the partition files are cut
    from the work file afterwards, a rowid run each. Where the source reads the plan in one
    scan (``table_sql(by_partition=True)``: an unindexed table), that scan is the copy, in
    partition order, and its runs are found in it (``_sorted_runs``, ``_range_runs``);
    otherwise each partition's own read is copied in turn (an index seeks it), its run
    where the one before ends."""
    source = plan.source
    assert isinstance(source, SQLiteFile)  # can_pull
    columns, names = plan.columns, column_list(plan.columns)
    work = paths[0].with_name("sorted.sqlite")  # partition files are named p-<hex>
    try:
        with _pulling(source) as conn:
            scan = source.table_sql(
                plan.bounds, conn=conn, schema="src", columns=columns, by_partition=True
            )
            run = f"SELECT {names} FROM sorted.{PULLED_TABLE} WHERE rowid BETWEEN ? AND ?"
            ranged = scan is None or any("partition" not in bounds for bounds in plan.bounds)
            runs: list[tuple[int, int, Any]] | None
            if scan is None:
                reads = [source.select_sql(b, schema="src", columns=columns) for b in plan.bounds]
                copied = _copy_scan(conn, plan, work, reads)
                ends = list(itertools.accumulate(copied))
                runs = [(end - rows + 1, end, None) for rows, end in zip(copied, ends, strict=True)]
            else:
                runs = (_range_runs if ranged else _sorted_runs)(conn, source, plan, work, scan)
                if runs is None:
                    return None
            if ranged:  # each row of the run is its bound's (copied as such, or routed to it)
                reads = [(f"{run} ORDER BY rowid", r[:2]) for r in runs]
            else:
                key = _quote(source.partition_column)
                reads = [(f"{run} AND {key} IS ? ORDER BY rowid", r) for r in runs]
            counts = []
            for path, (sql, params) in zip(paths, reads, strict=True):
                _create_pulled(conn, path, "out", names)
                conn.execute("BEGIN")
                counts.append(
                    conn.execute(f"INSERT INTO out.{PULLED_TABLE} ({names}) {sql}", params).rowcount
                )
                conn.execute("COMMIT")
                conn.execute("DETACH DATABASE out")
        if counts != [last - first + 1 for first, last, _ in runs]:
            return None  # a row of the run held another value: the runs were not sorted
        return counts
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(work)


def _sorted_runs(
    conn: sqlite3.Connection,
    source: SQLiteFile,
    plan: LoadPlan,
    path: Path,
    scan: tuple[str, tuple],
) -> list[tuple[int, int, Any]] | None:
    """``scan`` (rows in partition order) copied into a new work file at ``path``, attached as
    ``sorted``; per bound, the rowid range its value should hold there, and the value as the
    column stores it. The ranges are found by bisection, in SQLite's order of the values,
    and run on from rowid 1 to the last, each starting where the one before ends; the caller
    checks each (every row of it holds its value; a range that runs backwards fails that).
    None when two bounds name one stored value, or the first range would not start at 1."""
    (copied,) = _copy_scan(conn, plan, path, [scan])
    stored = _stored_values(conn, source, plan)
    pairs = ", ".join("(?, ?)" for _ in stored)
    ordered = conn.execute(
        f"SELECT column2 FROM (VALUES {pairs}) ORDER BY column1",
        [item for number, value in enumerate(stored) for item in (value, number)],
    ).fetchall()
    rank = {stored[number]: position for position, (number,) in enumerate(ordered)}
    if len(rank) != len(stored):
        return None
    probe = f"SELECT {_quote(source.partition_column)} FROM sorted.{PULLED_TABLE} WHERE rowid = ?"

    def rank_of(rowid: int) -> int:
        value = conn.execute(probe, (rowid,)).fetchone()[0]
        return rank.get(value, -1)

    rowids = range(1, copied + 1)  # a new table: rowids 1..copied, in the scan's order
    starts = [
        bisect.bisect_left(rowids, position, key=rank_of) + 1 for position in range(len(stored))
    ]
    if starts[0] != 1:  # a value of no bound sorted in: bisection is off, rows would be lost
        return None
    ends = [*(start - 1 for start in starts[1:]), copied]  # so the runs cover every row once
    runs = [(0, 0, None)] * len(stored)
    for position, (number,) in enumerate(ordered):
        runs[number] = (starts[position], ends[position], stored[number])
    return runs


def _copy_scan(
    conn: sqlite3.Connection, plan: LoadPlan, path: Path, scans: Sequence[tuple[str, tuple]]
) -> list[int]:
    """The ``scans``' rows copied, in turn and each in its order, into a new work file at
    ``path``, attached as ``sorted``, in one read transaction of the source: rowids 1 on,
    each scan's after the one before; each scan's count."""
    insert = f"INSERT INTO sorted.{PULLED_TABLE} ({column_list(plan.columns)}) "
    _create_pulled(conn, path, "sorted", column_list(plan.columns))
    conn.execute("BEGIN")
    copied = [conn.execute(insert + sql, params).rowcount for sql, params in scans]
    conn.execute("COMMIT")
    return copied


def _range_runs(
    conn: sqlite3.Connection,
    source: SQLiteFile,
    plan: LoadPlan,
    path: Path,
    scan: tuple[str, tuple],
) -> list[tuple[int, int, Any]] | None:
    """``_sorted_runs`` of key ranges: ``scan`` (rows in bound order) copied into a work file,
    then each row's bound found by ``range_route`` in one read of the copied keys. None when
    a row belongs to no bound, or a bound's rows are not one run."""
    _copy_scan(conn, plan, path, [scan])
    route = source.range_route(conn, "src", plan.bounds)
    if route is None:
        return None
    runs: dict[int, list[int]] = {}
    previous = None
    key = _quote(source.partition_column)
    for rowid, value in conn.execute(
        f"SELECT rowid, {key} FROM sorted.{PULLED_TABLE} ORDER BY rowid"
    ):
        number = route(value)
        if number is None or (number != previous and number in runs):
            return None
        runs.setdefault(number, [rowid, rowid])[1] = rowid
        previous = number
    return [(*runs.get(number, (1, 0)), None) for number in range(len(plan.bounds))]


def _counted(conn: sqlite3.Connection, source: SQLiteFile, plan: LoadPlan) -> list[int] | None:
    """Each bound's rows of a ``table_sql`` plan: a plan of key ranges by one read of the
    pulled keys (``range_route``), or each range by its own count of the source in the
    pull's read transaction where an index seeks them; a plan of one value per bound by
    partition value in the pulled file, as the column stores them. None when a row belongs
    to no bound."""
    key = _quote(source.partition_column)
    if any("partition" not in bounds for bounds in plan.bounds):
        route = source.range_route(conn, "src", plan.bounds)
        if route is None:
            statements = (source.count_sql(bounds, schema="src") for bounds in plan.bounds)
            return [conn.execute(sql, params).fetchone()[0] for sql, params in statements]
        counts = [0] * len(plan.bounds)
        for (value,) in conn.execute(f"SELECT {key} FROM out.{PULLED_TABLE}"):
            number = route(value)
            if number is None:
                return None
            counts[number] += 1
        return counts
    stored = _stored_values(conn, source, plan)
    index = {value: number for number, value in enumerate(stored)}
    if len(index) != len(stored):
        return None
    counts = [0] * len(stored)
    for value, rows in conn.execute(
        f"SELECT {key}, count(*) FROM out.{PULLED_TABLE} GROUP BY {key}"
    ):
        if value not in index:
            return None
        counts[index[value]] += rows
    return counts


def _stored_values(conn: sqlite3.Connection, source: SQLiteFile, plan: LoadPlan) -> list[Any]:
    """The plan's partition values (one per bound) as the partition column stores them."""
    column = next(c for c in plan.columns if c.name == source.partition_column)
    strict = is_strict(conn, "src", source.table)
    return as_stored(conn, column.decltype, [b["partition"] for b in plan.bounds], strict=strict)


def merge_pulled(payload: LoadFiles, folder: Path) -> LoadFiles:
    """``payload`` with its pulled files merged into one ``merged.sqlite`` in ``folder``, when
    there are more than SQLite attaches at once (``SQLiteSink.merge_load_files``); else
    ``payload`` itself."""
    native = [file for file in payload.files if file.native]
    with contextlib.closing(sqlite3.connect(":memory:", isolation_level=None)) as conn:
        if len(native) <= conn.getlimit(sqlite3.SQLITE_LIMIT_ATTACHED):
            return payload
        path, names = folder / "merged.sqlite", column_list(payload.columns)
        try:
            _create_pulled(conn, path, "out", names)
            for file in native:
                check_digest(file.path, file.sha256)
                part = file_uri(str(file.path), read_only=True)
                conn.execute("ATTACH DATABASE ? AS part", (part,))
                conn.execute("BEGIN")
                conn.execute(
                    f"INSERT INTO out.{PULLED_TABLE} ({names})"
                    f" SELECT {names} FROM part.{PULLED_TABLE} ORDER BY rowid"
                )
                conn.execute("COMMIT")
                conn.execute("DETACH DATABASE part")
                check_digest(file.path, file.sha256)
        except sqlite3.Error as error:
            full = getattr(error, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL
            raise OSError(errno.ENOSPC if full else errno.EIO, "merged.sqlite") from None
    rows = sum(file.rows for file in native)
    merged = LoadFile(path=path, rows=rows, sha256=file_sha256(path), native=True)
    others = tuple(file for file in payload.files if not file.native)
    return attrs.evolve(payload, files=(*others, merged))
