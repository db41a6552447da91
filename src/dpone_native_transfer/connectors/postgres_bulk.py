"""A PostgreSQL source's bulk read (``contract.bulk.BulkRead``): ``COPY (SELECT ...) TO STDOUT``
in CSV, parsed by pyarrow's CSV reader in C into each column's exact Arrow type
(``_arrow.exact_type``), and written to Arrow files; no value becomes a Python object.

The CSV reader's conversion is the check: it refuses a text its type cannot hold exactly
(``infinity``, a year past 9999 or BC, a numeric NaN or one with more digits than the type)
rather than round it, and then the whole read gives up (``Inexact``) and the runtime reads
rows. The text PostgreSQL writes into the CSV is the output of each type, the same text
``read`` selects with ``::text``, in the session ``read`` sets up (UTC, ISO dates), and
with ``extra_float_digits`` 1, so a double's text is the shortest one that reads back the
same double. Only an unquoted empty field is NULL (``null_values``: PostgreSQL's CSV
writes an empty text as ``""``), so a text "NA" or "NaN" stays text.
"""

from __future__ import annotations

import io
import select
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from ..drivers import import_driver
from ..payloads import Column
from ._arrow import exact_type

__all__ = ["Inexact", "arrow_schema", "copy_batches"]

PLACE = "dpone_place"  # the last field of a placed scan: its bound's place (``_placed_scan``)
_BLOCK_BYTES = 4 << 20  # CSV bytes the reader converts at a time: batches of tens of thousands
_CHUNK_BYTES = 1 << 20  # COPY bytes, of whole rows, the read joins before handing them on
_FLOAT_DIGITS = "SELECT set_config('extra_float_digits', '1', true)"


class Inexact(Exception):
    """A value of the bulk read does not fit its Arrow type exactly: the runtime reads rows."""


def arrow_schema(pa: Any, columns: Sequence[Column], *, placed: bool) -> Any | None:
    """The files' schema (``exact_type`` of each column, named as the columns), with the
    place as a last int32 field when ``placed``; None when a column's kind has none."""
    types = [exact_type(pa, column) for column in columns]
    if any(kind is None for kind in types):
        return None
    fields = [pa.field(column.name, kind) for column, kind in zip(columns, types, strict=True)]
    if placed:
        fields.append(pa.field(PLACE, pa.int32()))
    return pa.schema(fields)


class _CopyReader(io.RawIOBase):
    """The bytes of a ``COPY ... TO STDOUT`` as a file the CSV reader reads from."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._rest = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._rest:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._rest = memoryview(chunk)
        size = min(len(buffer), len(self._rest))
        buffer[:size] = self._rest[:size]
        self._rest = self._rest[size:]
        return size


def copy_batches(pa: Any, conn: Any, sql: str, params: Sequence[Any], schema: Any) -> Iterator[Any]:
    """The record batches of ``COPY (sql) TO STDOUT`` in CSV, typed by ``schema``; ``Inexact``
    when a value does not convert exactly. ``conn`` is in its read's transaction."""
    csv = import_driver("pyarrow.csv", needed_by="PostgresSource")
    conn.execute(_FLOAT_DIGITS)
    chunks = _copy_out(conn, f"COPY ({sql}) TO STDOUT (FORMAT csv)", params)
    first = next(chunks, None)
    if first is None:  # no row: the CSV reader refuses an empty file
        return
    stream = io.BufferedReader(_CopyReader(_chained(first, chunks)), _BLOCK_BYTES)
    options = {
        "read_options": csv.ReadOptions(column_names=schema.names, block_size=_BLOCK_BYTES),
        "parse_options": csv.ParseOptions(newlines_in_values=True),
        "convert_options": csv.ConvertOptions(
            column_types=schema,
            null_values=[""],
            strings_can_be_null=True,
            quoted_strings_can_be_null=False,
            true_values=["t"],
            false_values=["f"],
        ),
    }
    try:
        yield from csv.open_csv(stream, **options)
    except pa.ArrowInvalid:  # a text its type cannot hold exactly; UnicodeError is one
        raise Inexact from None
    finally:
        chunks.close()


def _copy_out(conn: Any, statement: str, params: Sequence[Any]) -> Generator[bytes, None, None]:
    """The bytes of ``statement`` (a ``COPY ... TO STDOUT``) in chunks of about
    ``_CHUNK_BYTES``, read on ``conn``'s libpq connection (``conn.pgconn``, psycopg's
    documented low-level access). Iterating psycopg's ``Copy`` costs a Python generator and
    wait per row (libpq hands a COPY out one row at a time), three times the whole bulk
    read's time; here a row is one C call while rows are at hand. ``params`` are bound
    client-side, as psycopg binds a ``COPY``'s. A server error is the driver's error."""
    driver = import_driver("psycopg", needed_by="PostgresSource")
    pq, pgconn = driver.pq, conn.pgconn
    encoding = conn.info.encoding
    pgconn.send_query(driver.ClientCursor(conn).mogrify(statement, params).encode(encoding))
    while pgconn.flush():
        select.select([], [pgconn.socket], [])
    result = _result(pgconn)
    if result is None or result.status != pq.ExecStatus.COPY_OUT:
        _finish(driver, pgconn, result, encoding)
        raise driver.ProgrammingError("the bulk read's COPY did not start")
    parts: list[bytes] = []
    held = 0
    while True:
        size, data = pgconn.get_copy_data(1)
        if size > 0:
            parts.append(bytes(data))
            held += size
            if held >= _CHUNK_BYTES:
                yield b"".join(parts)
                parts, held = [], 0
        elif size == 0:  # no whole row received yet
            select.select([pgconn.socket], [], [])
            pgconn.consume_input()
        else:  # the end of the rows: the COPY's own result follows
            break
    if parts:
        yield b"".join(parts)
    _finish(driver, pgconn, _result(pgconn), encoding)


def _result(pgconn: Any) -> Any:
    """The next result of ``pgconn``, waiting for the server without holding the GIL."""
    pgconn.consume_input()
    while pgconn.is_busy():
        select.select([pgconn.socket], [], [])
        pgconn.consume_input()
    return pgconn.get_result()


def _finish(driver: Any, pgconn: Any, result: Any, encoding: str) -> None:
    """Drain ``pgconn``'s results after ``result``; the server's error as the driver's."""
    failed = None
    while result is not None:
        if failed is None and result.status == driver.pq.ExecStatus.FATAL_ERROR:
            failed = driver.errors.error_from_result(result, encoding)
        result = _result(pgconn)
    if failed is not None:
        raise failed


def _chained(first: Any, rest: Iterator[Any]) -> Iterator[Any]:
    yield first
    yield from rest
