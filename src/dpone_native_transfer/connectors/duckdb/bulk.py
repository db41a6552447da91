"""Rows into DuckDB in bulk: Arrow batches DuckDB reads itself, or, for a batch Arrow
cannot hold exactly, one ``INSERT ... SELECT UNNEST(...)`` with a list per column; load
files in DuckDB's format (Arrow IPC streams), written from rows or from a pull's tagged
scan, and inserted in bounded ``INSERT``s."""

from __future__ import annotations

import contextlib
import itertools
import secrets
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ...artifacts import DigestReader, DigestWriter, create_private, read_chunks
from ...drivers import import_driver
from ...errors import ArtifactInvalid
from ...payloads import Column, LoadFile
from .._arrow import arrow, check_widths, read_ahead, row_batch, row_type, write_stream
from .._sql import TableName, quote
from .columns import column_names, duckdb_type
from .connect import binding_ready, run
from .scan import BOUND_TAG

__all__ = ["insert_files", "insert_rows", "write_arrow_file", "write_tagged"]

_INSERT_ROWS = 1_000_000  # rows per INSERT of load files (see _insert_native)
_BATCH_ROWS = 50_000  # rows per INSERT: Arrow batches this size load faster than 10,000
_GATHERED_ROWS = 250_000  # a pull's rows held for its files' batches (see _Gathered)


def write_arrow_file(
    path: Path, columns: Sequence[Column], chunks: Iterable[Sequence[tuple]], *, table: str
) -> LoadFile | Iterator[Sequence[tuple]]:
    """``DuckDBSink.write_load_file``: the Arrow batches ``insert_rows`` would insert, as one
    IPC stream file."""
    pa = arrow("DuckDBSink")
    struct = _arrow_row(pa, columns)
    return write_stream(pa, path, struct, chunks, batch_rows=_BATCH_ROWS, table=table)


def write_tagged(
    conn: Any, pa: Any, sql: str, params: list, paths: Sequence[Path], bounds: int
) -> tuple[list[LoadFile], list[int]]:
    """Run ``tagged_scan``'s query on ``conn`` (the scanner loaded) and write its batches
    without the tag: all to one file, or each bound's rows to its own file (``paths[index]``),
    gathered into batches of its own (``_Gathered``)."""
    pc: Any = import_driver("pyarrow.compute", needed_by="DuckDBSink")
    counts = [0] * bounds
    with contextlib.ExitStack() as stack:
        reader = run(conn, sql, params).to_arrow_reader(_BATCH_ROWS)
        width = reader.schema.get_field_index(BOUND_TAG)
        schema = reader.schema.remove(width)
        writers = [DigestWriter(stack.enter_context(create_private(path))) for path in paths]
        streams = [stack.enter_context(pa.ipc.new_stream(w, schema)) for w in writers]
        gathered = _Gathered(pa, streams)
        for batch in stack.enter_context(read_ahead(reader)):
            batch.validate(full=True)  # a SQLite text that is not UTF-8: DuckDB reads its bytes
            tags, data = batch.column(width), batch.select(range(width))
            if len(streams) > 1:
                order = pc.sort_indices(tags)  # stable: each bound keeps the scan's order
                tags, data = tags.take(order), data.take(order)
            offset = 0
            for entry in pc.value_counts(tags).to_pylist():  # sorted tags: in ascending order
                index, rows = entry["values"], entry["counts"]
                counts[index] += rows
                if len(streams) > 1:
                    gathered.add(index, data.slice(offset, rows))
                offset += rows
            if len(streams) == 1:
                streams[0].write_batch(data)
        gathered.flush()
    totals = [sum(counts)] if len(paths) == 1 else counts
    files = [
        LoadFile(path=path, rows=rows, sha256=writer.sha256, native=True)
        for path, rows, writer in zip(paths, totals, writers, strict=True)
    ]
    return files, counts


class _Gathered:
    """Each file's rows of a scan, held until ``_GATHERED_ROWS`` rows of all files wait, then
    written as one batch per file: a scan's batch spread over 100 files gave batches of 500
    rows, and DuckDB loads many small batches slowly. Memory stays about that many rows."""

    def __init__(self, pa: Any, streams: Sequence[Any]) -> None:
        self.pa, self.streams = pa, streams
        self.waiting: dict[int, list[Any]] = {}
        self.rows = 0

    def add(self, index: int, rows: Any) -> None:
        self.waiting.setdefault(index, []).append(rows)
        self.rows += rows.num_rows
        if self.rows >= _GATHERED_ROWS:
            self.flush()

    def flush(self) -> None:
        for index, parts in sorted(self.waiting.items()):
            table = self.pa.Table.from_batches(parts).combine_chunks()
            for batch in table.to_batches():  # one, after combine_chunks
                self.streams[index].write_batch(batch)
        self.waiting, self.rows = {}, 0


def insert_rows(
    conn: Any, table: TableName, columns: Sequence[Column], chunks: Iterable[Sequence[tuple]]
) -> int:
    """Insert row chunks, one statement per batch: an Arrow batch DuckDB reads in bulk, or,
    for a batch Arrow cannot hold exactly, one list per column (``_unnest_batch``)."""
    names = column_names(columns)
    pa = arrow("DuckDBSink")
    struct = _arrow_row(pa, columns)
    written = 0
    for rows in _batches(chunks):
        check_widths(rows, len(columns), table.name)
        batch = row_batch(pa, struct, rows)
        if batch is None:
            written += _unnest_batch(conn, table, names, rows)
        else:
            written += _insert_arrow(conn, table, names, batch)
    return written


def insert_files(
    conn: Any, table: TableName, columns: Sequence[Column], files: Sequence[LoadFile]
) -> int:
    """Each run of native files in one INSERT, their batches straight from the files; a spool
    file's rows as chunks. One INSERT per file would cost a statement each (file-artifact:
    a file per partition)."""
    rows = 0
    for native, group in itertools.groupby(files, key=lambda file: file.native):
        if native:
            rows += _insert_native(conn, table, columns, list(group))
        else:
            for file in group:
                chunks = read_chunks(file.path, file.sha256)
                rows += insert_rows(conn, table, columns, chunks)
    return rows


def _insert_native(
    conn: Any, table: TableName, columns: Sequence[Column], files: Sequence[LoadFile]
) -> int:
    """The files' batches as Arrow streams of up to ``_INSERT_ROWS`` rows, one INSERT each,
    every file hashed as DuckDB reads it and opened only when reached; a file whose digest
    differs fails the load before it commits. One INSERT per file costs a statement each
    (file-artifact: a file per partition); one INSERT of everything holds memory that
    grows with the rows (figures: docs/performance.md, fix 21)."""
    pa = arrow("DuckDBSink")
    changed: list[ArtifactInvalid] = []

    def batches(file: LoadFile) -> Iterator[Any]:
        with DigestReader(file.path, file.sha256) as reader:
            yield from pa.ipc.open_stream(reader)
            try:
                reader.verify()
            except ArtifactInvalid as error:  # raised here, DuckDB would wrap it
                changed.append(error)

    with open(files[0].path, "rb") as first:
        schema = pa.ipc.open_stream(first).schema
    written = 0
    with read_ahead(itertools.chain.from_iterable(batches(file) for file in files)) as stream:
        pending = [next(stream, None)]

        def up_to_limit() -> Iterator[Any]:
            rows = 0
            while pending[0] is not None and (
                not rows or rows + pending[0].num_rows <= _INSERT_ROWS
            ):
                batch = pending[0]
                rows += batch.num_rows
                yield batch
                pending[0] = next(stream, None)

        while pending[0] is not None:
            part = pa.RecordBatchReader.from_batches(schema, up_to_limit())
            written += _insert_arrow(conn, table, column_names(columns), part)
    if changed:
        raise changed[0]
    return written


def _insert_arrow(conn: Any, table: TableName, names: str, data: Any) -> int:
    """``INSERT ... SELECT * FROM`` an Arrow batch or stream reader DuckDB scans in bulk."""
    view = f"__dpone_rows_{secrets.token_hex(8)}"  # never the name of a table of the file
    binding_ready()
    conn.register(view, data)
    try:
        sql = f"INSERT INTO {table.sql()} ({names}) SELECT * FROM {quote(view)}"
        return conn.execute(sql).fetchone()[0]
    finally:
        conn.unregister(view)


def _arrow_row(pa: Any, columns: Sequence[Column]) -> Any:
    """The Arrow struct of one row; DuckDB casts text to every other type on insert, as it
    casts the carriers' text."""
    types = [_ARROW_TYPES.get(duckdb_type(column), "large_string") for column in columns]
    return row_type(pa, [(f"c{index}", kind) for index, kind in enumerate(types)])


_ARROW_TYPES = {"BIGINT": "int64", "DOUBLE": "float64", "BOOLEAN": "bool_", "BLOB": "large_binary"}


def _unnest_batch(conn: Any, table: TableName, names: str, rows: Sequence[tuple]) -> int:
    """One ``INSERT ... SELECT UNNEST($1), ...`` with one list per column: DuckDB converts each
    Python value itself, and casts the text of a NaN back to NaN."""
    by_column = [[row[index] for row in rows] for index in range(len(rows[0]))]
    unnest = ", ".join(f"UNNEST(${number})" for number in range(1, len(by_column) + 1))
    sql = f"INSERT INTO {table.sql()} ({names}) SELECT {unnest}"
    binding_ready()  # lists of Python values, bound
    return conn.execute(sql, by_column).fetchone()[0]


def _batches(chunks: Iterable[Sequence[tuple]]) -> Iterator[Sequence[tuple]]:
    """Chunks joined into batches of about ``_BATCH_ROWS`` rows; a large chunk passes as is."""
    batch: list[tuple] = []
    for chunk in chunks:
        if not batch and len(chunk) >= _BATCH_ROWS:
            yield chunk
            continue
        batch.extend(chunk)
        if len(batch) >= _BATCH_ROWS:
            yield batch
            batch = []
    if batch:
        yield batch
