"""Engine pulls from a SQLite file: what the ClickHouse sink sends chDB to read a lazy plan's
partitions with its ``sqlite()`` table function (``PlanSQL``, ``plan_inserts``), and what it
does with the Arrow files chDB writes for file-artifact (``recut``, ``kept``,
``copy_messages``). No client is opened here: the sink runs the statements.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ...artifacts import DigestReader, DigestWriter, create_private
from ...drivers import import_driver
from ...errors import InternalInvariantBroken, SourceInvalid
from ...payloads import LoadFile, LoadPlan, bound_predicates
from .._arrow import arrow
from .._sql import integer_range_starts, partition_predicate_count
from ..contract import PlanInexact, Unsupported
from ..contract.sqlite_file import SQLiteFile
from ..sqlite_reading import pulled_file
from .sql import ARROW_BLOCK_ROWS, column_list, quote, where_sql

__all__ = [
    "BOUND_TAG",
    "SQLITE_READ",
    "PlanSQL",
    "copy_messages",
    "in_background",
    "kept",
    "plan_inserts",
    "recut",
    "unlink_all",
    "with_safe_names",
]

BOUND_TAG = "__dpone_bound"  # the column of a pulled file naming each row's bound
# A lazy plan's partitions per INSERT ... SELECT: without an index, each statement reads the
# whole SQLite file, so as few statements as chDB parses: at most 256 OR-ed conditions, and at
# most _CONDITION_BYTES of them, each (long column names make long conditions). Partitions a
# lookup finds (PlanSQL.lookup) take one statement up to _LOOKUP_BOUNDS: their values'
# placeholders stay below max_query_size (262,144 bytes) too. A statement longer than
# _STATEMENT_BYTES is refused before the target call. A pull reads all its partitions in one
# statement (and keeps a file writer open for each, for file-artifact).
_PLAN_BOUNDS_PER_INSERT = 256
_CONDITION_BYTES = 100_000
_LOOKUP_BOUNDS = 2048
_STATEMENT_BYTES = 200_000
# ClickHouse's sqlite() engine quotes SQLite identifiers its own way: a backslash or a double
# quote in a name reads a wrong column (or its name as a string) or fails; checked on chDB 4.4.
_SQLITE_FUNCTION_UNSAFE = re.compile(r'[\\"\x00-\x1f\x7f]')

SQLITE_READ = "sqlite({src_path:String}, {src_table:String})"


class PlanSQL:
    """A lazy plan's bounds as conditions on ``sqlite()``'s columns, and their parameters."""

    def __init__(
        self,
        plan: LoadPlan,
        *,
        partition_column: str,
        cursor_column: str | None,
        params: dict[str, Any],
    ) -> None:
        """The conditions of ``plan``'s bounds on the columns the engine reads, with
        ``params`` (the read's own: a file, a login) among their parameters."""
        self.params: dict[str, Any] = dict(params)
        found = [
            bound_predicates(bounds, partition_column=partition_column, cursor_column=cursor_column)
            for bounds in plan.bounds
        ]
        self.conditions = []
        for number, predicates in enumerate(found):
            where, own = where_sql(predicates, prefix=f"b{number}_")
            self.conditions.append(f"({where})")
            self.params.update(own)
        # In one cursor window, at most one NULL key and either one value each (all texts or
        # all integers) or contiguous integer key ranges: a row's bound is then found by a
        # lookup of its value, or of the start of its range (``index``).
        windows = [
            predicates[partition_predicate_count(b) :]
            for b, predicates in zip(plan.bounds, found, strict=True)
        ]
        nulls = [
            n for n, b in enumerate(plan.bounds) if "partition" in b and b["partition"] is None
        ]
        self.keyed = [n for n in range(len(found)) if n not in nulls]
        self.null_bound = nulls[0] if len(nulls) == 1 else None
        self.lookup: str | None = None  # the values' parameter type, or "range"
        self.window: str | None = None  # with a lookup: the cursor window all bounds share
        self.envelope = ""  # with ranges: their keys, from the first one's start to the last's end
        if len(nulls) > 1 or not self.keyed or any(w != windows[0] for w in windows):
            return
        self.column = quote(partition_column)
        keyed = [plan.bounds[number] for number in self.keyed]
        values = [bounds.get("partition") for bounds in keyed]
        kinds = {type(value) for value in values}
        ranges = integer_range_starts(keyed)
        if ranges is not None:
            self.lookup, (starts, below) = "range", ranges
            self.params.update(
                (f"r{number}", start) for number, start in zip(self.keyed, starts, strict=True)
            )
            self.params["r_from"] = min(starts)
            limits = [f"{self.column} >= {{r_from:Int64}}"]  # roundDown lifts a lower key
            if below is not None:
                self.params["r_below"] = below
                limits.append(f"{self.column} < {{r_below:Int64}}")
            self.envelope = " AND ".join(limits)
        elif kinds in ({str}, {int}) and len(set(values)) == len(values):
            self.lookup = "String" if kinds == {str} else "Int64"
            self.params.update(
                (f"v{number}", value) for number, value in zip(self.keyed, values, strict=True)
            )
        else:
            return
        if windows[0]:
            self.window, own = where_sql(windows[0], prefix="w_")
            self.params.update(own)

    @classmethod
    def of_sqlite(cls, plan: LoadPlan, source: SQLiteFile) -> PlanSQL:
        """The plan's conditions on ``sqlite()``'s columns; its file must exist."""
        if not os.path.isfile(source.path):
            raise SourceInvalid(
                f"source database for table {source.table!r} does not exist",
                diagnostics={"table": source.table},
            )
        return cls(
            plan,
            partition_column=source.partition_column,
            cursor_column=source.cursor_column,
            params={"src_path": os.path.abspath(source.path), "src_table": source.table},
        )

    def statements(self, *, listed: bool) -> list[range]:
        """The bounds each statement reads: all in one when ``where`` finds them by the lookup
        (``listed`` as there) and there are at most ``_LOOKUP_BOUNDS``; otherwise OR-ed
        conditions, at most ``_PLAN_BOUNDS_PER_INSERT`` and ``_CONDITION_BYTES`` of them each
        (a condition longer than that alone). Past one statement, the pull is declined and
        each partition read on its own (figures: docs/performance.md, fix 52)."""
        count = len(self.conditions)
        looked_up = self.lookup is not None and (listed or self.window is not None)
        if looked_up and count <= _LOOKUP_BOUNDS:
            return [range(count)]
        parts, first, size = [], 0, 0
        for number, condition in enumerate(self.conditions):
            length = len(condition.encode())
            full = number - first == _PLAN_BOUNDS_PER_INSERT or size + length > _CONDITION_BYTES
            if number > first and full:
                parts.append(range(first, number))
                first, size = number, 0
            size += length
        return [*parts, range(first, count)] if count else []

    def where(self, numbers: range, *, listed: bool = False) -> str:
        """The condition that selects the rows of the bounds ``numbers``, which chDB pushes down
        to SQLite. As an OR of each bound's condition, SQLite tests each row against every
        bound. When nearly every row SQLite reads is planned, chDB keeps them by a lookup of
        each row's value instead (``index``, the same rows), and SQLite tests only the cursor
        window all bounds share: when the bounds are every partition listed (``listed``, a
        full refresh's), or share a cursor window (its partitions are those listed in it)
        (figures: docs/performance.md, fixes 42 and 44). An append without a window plans only
        the values not loaded yet, which an index on the column lets SQLite read alone."""
        whole = numbers == range(len(self.conditions))
        if self.lookup is not None and whole and (listed or self.window is not None):
            window = "" if self.window is None else f" AND ({self.window})"
            return f"{self.index()} != -1{window}"
        return " OR ".join(self.conditions[number] for number in numbers)

    def index(self) -> str:
        """The index of the bound a row belongs to, -1 for none: a lookup of the partition
        value (``transform``) when ``lookup``, else the first bound whose condition holds
        (``multiIf``, slower; figures: docs/performance.md, 'Margins'). The ``where``
        of the same bounds leaves out every row of none."""
        if self.lookup is None:
            tests = ", ".join(f"{condition}, {n}" for n, condition in enumerate(self.conditions))
            return f"multiIf({tests}, -1)"
        numbers = ", ".join(str(number) for number in self.keyed)
        if self.lookup == "range":  # the start of the range the key is in, if any is
            starts = "[" + ", ".join(f"{{r{number}:Int64}}" for number in self.keyed) + "]"
            found = f"transform(roundDown({self.column}, {starts}), {starts}, [{numbers}], -1)"
            lookup = f"if({self.envelope}, {found}, -1)"
        else:
            values = ", ".join(f"{{v{number}:{self.lookup}}}" for number in self.keyed)
            lookup = f"transform({self.column}, [{values}], [{numbers}], -1)"
        if self.null_bound is None:
            return lookup  # a NULL key: -1
        return f"if(isNull({self.column}), {self.null_bound}, {lookup})"


def recut(
    raws: Sequence[Path], paths: Sequence[Path], bounds: int, *, table: str
) -> tuple[list[LoadFile], list[int]]:
    """Each pulled file (``raws``; a bound chDB found no row of has none) rewritten at its
    path as ``write_arrow_stream`` writes rows: without the tag, in ``ARROW_BLOCK_ROWS``-row
    batches, digested as written; and each bound's row count, from the tags."""
    pa, schema = arrow("the ClickHouse sink"), _pulled_schema(raws)
    width = schema.get_field_index(BOUND_TAG)
    schema, counts, files = schema.remove(width), [0] * bounds, []
    for raw, path in zip(raws, paths, strict=True):
        with contextlib.ExitStack() as stack:
            writer = DigestWriter(stack.enter_context(create_private(path)))
            stream = stack.enter_context(pa.ipc.new_stream(writer, schema))
            cut = _Cut(pa, stream)
            if raw.exists():
                for batch in pa.ipc.open_stream(stack.enter_context(pa.OSFile(str(raw)))):
                    _count_tags(batch, counts, table=table)
                    cut.add(batch.select(range(width)))
            cut.flush()
        files.append(LoadFile(path=path, rows=cut.rows, sha256=writer.sha256, native=True))
    return _split_checked(files, counts, table=table)


def kept(
    raws: Sequence[Path], paths: Sequence[Path], bounds: int, *, table: str
) -> tuple[list[LoadFile], list[int]]:
    """A full refresh's pulled files, kept as chDB wrote them, tag and batches: its load
    fills a fresh table, where no INSERT is retried, and reads the columns by name. Each
    file is read once, for its bounds' counts and the digest of those same bytes, and
    linked at its path (never over a file there); a bound chDB found no row of gets an
    empty stream: no rewrite as ``recut`` makes, and only the tag column is decoded (and
    decompressed), not all of them (figures: docs/performance.md, fixes 46 and 51)."""
    pa, schema = arrow("the ClickHouse sink"), _pulled_schema(raws)
    counts, files = [0] * bounds, []
    tag_only = pa.ipc.IpcReadOptions(included_fields=[schema.get_field_index(BOUND_TAG)])
    for raw, path in zip(raws, paths, strict=True):
        if not raw.exists():
            with create_private(raw) as handle, pa.ipc.new_stream(handle, schema):
                pass
        before = sum(counts)
        with DigestReader(raw) as reader:
            for batch in pa.ipc.open_stream(reader, options=tag_only):
                _count_tags(batch, counts, table=table)
            sha256 = reader.digest()
        os.link(raw, path)
        os.chmod(path, 0o600)
        files.append(LoadFile(path=path, rows=sum(counts) - before, sha256=sha256, native=True))
    return _split_checked(files, counts, table=table)


def copy_messages(
    pa: Any, reader: DigestReader, writer: DigestWriter, schema: Any, *, table: str
) -> Any:
    """Copy the Arrow IPC stream ``reader`` reads into ``writer``, message for message, without
    its end-of-stream marker; its schema message too when ``schema`` is None (the first file),
    else only checked equal to ``schema``. The schema it read is returned. Batches are not
    decoded or re-encoded (nor decompressed and compressed again), as the merge once was
    (figures: docs/performance.md, fix 50). A stream of dictionary batches, which no writer
    of load files makes, cannot be concatenated so."""
    messages = iter(pa.ipc.MessageReader.open_stream(reader))
    first = next(messages, None)
    if first is None:
        raise InternalInvariantBroken("a load file to merge is empty", diagnostics={"table": table})
    own = pa.ipc.read_schema(first)
    if schema is None:
        writer.write(first.serialize())
    elif not own.equals(schema):
        raise InternalInvariantBroken(
            "load files to merge differ in schema", diagnostics={"table": table}
        )
    for message in messages:
        if message.type != "record batch":
            raise InternalInvariantBroken(
                "a load file to merge holds a dictionary batch", diagnostics={"table": table}
            )
        writer.write(message.serialize())
    return own


def _pulled_schema(raws: Sequence[Path]) -> Any:
    """The Arrow schema chDB wrote its pulled files in, tag included."""
    found = [raw for raw in raws if raw.exists()]
    if not found:
        raise FileNotFoundError("chDB wrote no file")  # no row: Python reads, cheaply
    pa = arrow("the ClickHouse sink")
    with pa.OSFile(str(found[0])) as handle:
        return pa.ipc.open_stream(handle).schema


def _split_checked(
    files: list[LoadFile], counts: list[int], *, table: str
) -> tuple[list[LoadFile], list[int]]:
    """``(files, counts)``, once each of several files holds exactly its own bound's rows."""
    if len(files) > 1 and [file.rows for file in files] != counts:
        raise InternalInvariantBroken(
            "a pulled file holds another bound's rows", diagnostics={"table": table}
        )
    return files, counts


def _count_tags(batch: Any, counts: list[int], *, table: str) -> None:
    """Add a pulled batch's rows to their bounds' ``counts``, by the tag of each row."""
    pc: Any = import_driver("pyarrow.compute", needed_by="the ClickHouse sink")
    for entry in pc.value_counts(batch.column(BOUND_TAG)).to_pylist():
        if not 0 <= entry["values"] < len(counts):  # -1: a row of no bound
            raise InternalInvariantBroken("a pulled row has no bound", diagnostics={"table": table})
        counts[entry["values"]] += entry["counts"]


class _Cut:
    """Batches written to ``stream`` in ``ARROW_BLOCK_ROWS``-row batches, whatever they came in:
    ClickHouse makes a block of each, and deduplicates a retried INSERT block by block."""

    def __init__(self, pa: Any, stream: Any) -> None:
        self.pa, self.stream = pa, stream
        self.pending: list[Any] = []
        self.waiting = self.rows = 0

    def add(self, batch: Any) -> None:
        self.pending.append(batch)
        self.waiting += batch.num_rows
        while self.waiting >= ARROW_BLOCK_ROWS:
            self._write(ARROW_BLOCK_ROWS)

    def flush(self) -> None:
        if self.waiting:
            self._write(self.waiting)

    def _write(self, rows: int) -> None:
        table = self.pa.Table.from_batches(self.pending)
        self.stream.write_batch(table.slice(0, rows).combine_chunks().to_batches()[0])
        self.pending = table.slice(rows).to_batches()
        self.waiting -= rows
        self.rows += rows


def plan_inserts(
    plan: LoadPlan, source: SQLiteFile, *, table: str
) -> tuple[PlanSQL, str, list[str]]:
    """lazy-plan's INSERTs: the plan's conditions, the column list and each statement's
    ``WHERE``; ``ConfigInvalid`` when a statement would be longer than chDB parses (long
    column names or bound values), before the target call: it would fail inside it."""
    bounds = PlanSQL.of_sqlite(plan, source)
    names = column_list([column.name for column in plan.columns])
    listed = plan.replace
    wheres = [bounds.where(part, listed=listed) for part in bounds.statements(listed=listed)]
    if any(len(where.encode()) + 2 * len(names.encode()) > _STATEMENT_BYTES for where in wheres):
        raise Unsupported(
            "a pull of these partitions: chDB parses no statement that long (the column "
            "names or partition conditions are too long)",
            table=table,
        )
    return bounds, names, wheres


def with_safe_names(plan: LoadPlan, *, table: str) -> SQLiteFile:
    """The plan's source, when ``sqlite()`` can name its table and columns: it mis-quotes
    backslashes, double quotes and control characters. No read of the source."""
    source = pulled_file(plan, engine="ClickHouse", table=table)
    columns = [column.name for column in plan.columns]
    for name in (source.table, source.partition_column, source.cursor_column, *columns):
        if name is not None and _SQLITE_FUNCTION_UNSAFE.search(name):
            raise PlanInexact(
                f"ClickHouse cannot read source identifier {name!r}: the sqlite() table "
                "function mis-quotes backslashes, double quotes and control characters",
                diagnostics={"table": table, "identifier": name},
            )
    return source


def in_background(call: Callable[[], None]) -> Future[None]:
    """``call()`` started in a daemon thread; the future holds its outcome (its exception
    untouched). Daemon: a run that fails before waiting for it does not wait at exit."""
    future: Future[None] = Future()

    def run() -> None:
        try:
            call()
        except BaseException as error:  # handed to whoever waits, as it was raised
            future.set_exception(error)
        else:
            future.set_result(None)

    threading.Thread(target=run, name="dpone-chdb-check", daemon=True).start()
    return future


def unlink_all(paths: Iterable[Path]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
