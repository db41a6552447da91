"""Row chunks as Arrow record batches: the bulk format DuckDB and chDB read natively.

``pyarrow`` comes with the ``duckdb`` and ``clickhouse`` extras and is imported
on first use. A batch is built in C from the row tuples (one struct array), not
value by value in Python; a value Arrow cannot hold exactly as the column's
type (an integer beyond 64 bits, text in a number column) makes the batch
``None``, and the sink takes its slower exact route for it.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from ..artifacts import DigestReader, DigestWriter, create_private
from ..drivers import import_driver
from ..errors import ConfigInvalid
from ..payloads import Column, LoadFile

__all__ = [
    "BULK_BATCH_ROWS",
    "arrow",
    "check_widths",
    "csv_blocks",
    "exact_type",
    "read_ahead",
    "read_stream",
    "read_together",
    "row_batch",
    "row_type",
    "write_stream",
    "write_tagged_batches",
]

_T = TypeVar("_T")

BULK_BATCH_ROWS = 65_536  # rows per record batch of a bulk read's files (``BulkRead``)
_GATHERED_ROWS = 262_144  # rows of all bounds a bulk read holds before writing them
_WIDEST_DECIMAL128 = 38


def exact_type(pa: Any, column: Column) -> Any | None:
    """The Arrow type that holds every value of ``column`` exactly, as a bulk read's files
    give it (``contract.bulk.BulkRead``), or None for a kind without one here (a blob, a
    time, a SQLite number or untyped value: each is read as rows)."""
    declared = column.decimal(_WIDEST_DECIMAL128)
    if column.kind == "decimal":
        return pa.string() if declared is None else pa.decimal128(*declared)
    kinds = {
        "integer": pa.int64,
        "real": pa.float64,
        "text": pa.string,
        "interval": pa.string,  # its text, as the row paths carry it
        "boolean": pa.bool_,
        "date": pa.date32,
        "timestamp": lambda: pa.timestamp("us"),
        "timestamptz": lambda: pa.timestamp("us", tz="UTC"),
    }
    make = kinds.get(column.kind)
    return None if make is None else make()


def write_tagged_batches(
    pa: Any, schema: Any, batches: Iterable[tuple[Any, Any]], paths: Sequence[Path], bounds: int
) -> tuple[list[LoadFile], list[int]]:
    """Write ``(tags, batch)`` pairs, each row of ``batch`` of the bound ``tags`` names (an
    int32 array), to new private files: all to one file as they come, or each bound's rows
    to its own (``paths[index]``), gathered until ``BULK_BATCH_ROWS`` rows of a bound or
    ``_GATHERED_ROWS`` of all wait (a read's batch spread over 100 files would give files of
    tiny batches; memory stays about that many rows). Each bound's rows keep their order.
    The caller reads the batches ahead (``read_together``), so the read runs while the
    files are written; their digests are taken as they are written."""
    pc = import_driver("pyarrow.compute", needed_by="a bulk read")
    counts = [0] * bounds
    with contextlib.ExitStack() as stack:
        writers = [DigestWriter(stack.enter_context(create_private(path))) for path in paths]
        streams = [stack.enter_context(pa.ipc.new_stream(w, schema)) for w in writers]
        waiting: dict[int, list[Any]] = {}

        def flush(index: int) -> None:
            table = pa.Table.from_batches(waiting.pop(index), schema).combine_chunks()
            for batch in table.to_batches():  # one, after combine_chunks
                streams[index].write_batch(batch)

        for tags, batch in batches:
            if len(streams) == 1:
                for entry in pc.value_counts(tags).to_pylist():
                    counts[entry["values"]] += entry["counts"]
                streams[0].write_batch(batch)
                continue
            if not _ascending(pc, tags):  # a scan in key order has its bounds in order
                order = pc.sort_indices(tags)  # stable: each bound keeps the read's order
                tags, batch = tags.take(order), batch.take(order)
            offset = 0
            for entry in pc.value_counts(tags).to_pylist():  # sorted tags: ascending
                index, rows = entry["values"], entry["counts"]
                counts[index] += rows
                waiting.setdefault(index, []).append(batch.slice(offset, rows))
                if sum(part.num_rows for part in waiting[index]) >= BULK_BATCH_ROWS:
                    flush(index)
                offset += rows
            held = sum(part.num_rows for parts in waiting.values() for part in parts)
            if held >= _GATHERED_ROWS:
                for index in sorted(waiting):
                    flush(index)
        for index in sorted(waiting):
            flush(index)
    totals = [sum(counts)] if len(paths) == 1 else counts
    files = [
        LoadFile(path=path, rows=rows, sha256=writer.sha256, native=True)
        for path, rows, writer in zip(paths, totals, writers, strict=True)
    ]
    return files, counts


def _ascending(pc: Any, tags: Any) -> bool:
    """Whether ``tags`` never go down: sorting them would change no row's place."""
    return len(tags) < 2 or bool(pc.all(pc.less_equal(tags[:-1], tags[1:])).as_py())


def csv_blocks(pa: Any, files: Sequence[LoadFile]) -> Iterator[bytes]:
    """The rows of bulk files (``write_tagged_batches``) as CSV, a block per batch, written
    by pyarrow in C: NULL an empty field, every other value quoted (a lone backslash and dot on a
    line would end the data), a double its shortest exact text (``nan``, ``inf``), a UTC
    timestamp with ``+00`` (``_utc_text``); what PostgreSQL's ``COPY ... FROM STDIN (FORMAT
    csv)`` reads back as the same values. Each file's digest is checked after its last
    batch: ``ArtifactInvalid`` when it changed since it was written."""
    csv = import_driver("pyarrow.csv", needed_by="a bulk load")
    options = csv.WriteOptions(include_header=False, quoting_style="all_valid")
    for file in files:
        with DigestReader(file.path, file.sha256) as reader:
            for batch in pa.ipc.open_stream(reader):
                if batch.num_rows:
                    sink = pa.BufferOutputStream()
                    csv.write_csv(_utc_text(pa, batch), sink, options)
                    yield sink.getvalue().to_pybytes()
            reader.verify()


def _utc_text(pa: Any, batch: Any) -> Any:
    """``batch`` with each UTC timestamp column as its text and ``+00``: the CSV writer
    formats a timestamp with a zone through the zone's rules, tens of times slower than
    one without (figures: docs/performance.md, fix 63), and the same instant is written."""
    compute = import_driver("pyarrow.compute", needed_by="a bulk load")
    columns = list(batch.columns)
    for index, column in enumerate(columns):
        if pa.types.is_timestamp(column.type) and column.type.tz == "UTC":
            text = compute.cast(column.cast(pa.timestamp(column.type.unit)), pa.string())
            columns[index] = compute.binary_join_element_wise(text, "+00", "")
    return pa.RecordBatch.from_arrays(columns, names=batch.schema.names)


def arrow(needed_by: str) -> Any:
    return import_driver("pyarrow", needed_by=needed_by)


def row_type(pa: Any, columns: Sequence[tuple[str, str]]) -> Any:
    """The struct type of one row from ``(name, type)`` pairs; a type is a pyarrow type
    factory's name (``"int64"``). Engines that match a file's fields by name see the
    columns' own names."""
    return pa.struct((name, getattr(pa, kind)()) for name, kind in columns)


def row_batch(pa: Any, struct: Any, rows: Sequence[tuple]) -> Any | None:
    """``rows`` as one record batch of ``struct``, or ``None`` when a value does not convert
    exactly (pyarrow refuses rather than truncates for every type this package asks for)."""
    try:
        return pa.RecordBatch.from_struct_array(pa.array(rows, type=struct))
    except (pa.ArrowException, OverflowError, TypeError, ValueError):  # UnicodeError is one
        return None


def check_widths(rows: Sequence[tuple], columns: int, table: str) -> None:
    """Every row has one value per column: a ragged chunk is refused, never padded or cut."""
    if len(set(map(len, rows))) != 1 or len(rows[0]) != columns:
        raise ConfigInvalid(
            f"rows for table {table!r} do not have one value per column",
            diagnostics={"table": table, "columns": columns},
        )


def write_stream(
    pa: Any,
    path: Path,
    struct: Any,
    chunks: Iterable[Sequence[tuple]],
    *,
    batch_rows: int,
    table: str,
) -> LoadFile | Iterator[Sequence[tuple]]:
    """Write the chunks to the new private file ``path`` as one Arrow IPC stream of
    ``batch_rows``-row batches, whatever the chunks were: the file written (its digest taken
    as it is written); or, once a batch does not convert, every row (those written, read
    back, then the rest)."""
    rows, pending, remaining = 0, list[tuple](), iter(chunks)
    with create_private(path) as handle:
        written = DigestWriter(handle)
        with pa.ipc.new_stream(written, pa.schema(struct)) as stream:
            for chunk in itertools.chain(remaining, [[]]):  # the empty chunk flushes the rest
                if chunk:
                    check_widths(chunk, struct.num_fields, table)
                    pending.extend(chunk)
                while pending and (len(pending) >= batch_rows or not chunk):
                    block = pending[:batch_rows]
                    batch = row_batch(pa, struct, block)
                    if batch is None:
                        rest = itertools.chain([pending], remaining)
                        return itertools.chain(read_stream(pa, path), rest)
                    stream.write_batch(batch)
                    rows += len(block)
                    del pending[:batch_rows]
    return LoadFile(path=path, rows=rows, sha256=written.sha256, native=True)


def read_stream(pa: Any, path: Path) -> Iterator[list[tuple]]:
    """The rows of an Arrow stream file ``write_stream`` wrote, one list per batch."""
    with open(path, "rb") as handle:
        for batch in pa.ipc.open_stream(handle):
            yield list(zip(*(column.to_pylist() for column in batch.columns), strict=True))


@contextlib.contextmanager
def read_together(parts: Sequence[Iterable[_T]], depth: int = 2) -> Iterator[Iterator[_T]]:
    """The items of every part, each part read by a thread of its own (as ``read_ahead``
    reads one), interleaved as they come; an error of any part reaches the caller as it was
    raised, and on exit every thread is stopped and joined."""
    if len(parts) == 1:
        with read_ahead(parts[0], depth) as items:
            yield items
        return
    ready: queue.Queue[tuple[int, Any]] = queue.Queue(depth * len(parts))
    stop = threading.Event()
    item_, done, failed = 0, 1, 2

    def read(part: Iterable[_T]) -> None:
        try:
            for item in part:
                ready.put((item_, item))
                if stop.is_set():
                    return
            ready.put((done, None))
        except BaseException as error:  # handed to the caller, as it was raised
            ready.put((failed, error))

    def taken() -> Iterator[_T]:
        left = len(parts)
        while left:
            state, item = ready.get()
            if state == failed:
                raise item
            if state == done:
                left -= 1
                continue
            yield item

    readers = [
        threading.Thread(target=read, args=(part,), name="dpone-read-part", daemon=True)
        for part in parts
    ]
    for reader in readers:
        reader.start()
    try:
        yield taken()
    finally:
        stop.set()
        while any(reader.is_alive() for reader in readers):
            with contextlib.suppress(queue.Empty):
                while True:
                    ready.get_nowait()
            for reader in readers:
                reader.join(0.01)


@contextlib.contextmanager
def read_ahead(items: Iterable[_T], depth: int = 2) -> Iterator[Iterator[_T]]:
    """``items``, read by a thread up to ``depth`` ahead of the caller: an engine's scan then
    runs while the caller writes the batch before (both release the GIL). An error of the
    read reaches the caller as it was raised. On exit the thread is stopped and joined, so
    the caller may close what the items come from."""
    ready: queue.Queue[tuple[bool, Any]] = queue.Queue(depth)
    stop = threading.Event()

    def read() -> None:
        try:
            for item in items:
                ready.put((True, item))
                if stop.is_set():
                    return
            ready.put((False, None))
        except BaseException as error:  # handed to the caller, as it was raised
            ready.put((False, error))

    def taken() -> Iterator[_T]:
        while True:
            more, item = ready.get()
            if not more:
                if item is not None:
                    raise item
                return
            yield item

    reader = threading.Thread(target=read, name="dpone-read-ahead", daemon=True)
    reader.start()
    try:
        yield taken()
    finally:
        stop.set()
        while reader.is_alive():  # a put waiting for room ends, and the read sees stop
            with contextlib.suppress(queue.Empty):
                while True:
                    ready.get_nowait()
            reader.join(0.01)
