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

import selectors
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from ..drivers import import_driver
from ..payloads import Column
from ._arrow import exact_type, read_ahead

__all__ = ["Inexact", "arrow_schema", "copy_batches"]

PLACE = "dpone_place"  # the last field of a placed scan: its bound's place (``_placed_scan``)
_CHUNK_BYTES = 8 << 20  # COPY bytes, of whole rows, converted at once: batches of 100,000s
_BLOCK_BYTES = 2 << 20  # CSV bytes a thread of the CSV reader converts at a time
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


def copy_batches(
    pa: Any, conn: Any, sql: str, params: Sequence[Any], schema: Any
) -> Generator[Any, None, None]:
    """The record batches of ``COPY (sql) TO STDOUT`` in CSV, typed by ``schema``; ``Inexact``
    when a value does not convert exactly. ``conn`` is in its read's transaction. The COPY
    is read ahead on a thread (``_copy_out``) while the chunk before is converted here; each
    chunk holds whole rows, so each converts on its own, with no Python call per row."""
    csv = import_driver("pyarrow.csv", needed_by="PostgresSource")
    conn.execute(_FLOAT_DIGITS)
    parse = csv.ParseOptions(newlines_in_values=True)
    convert = csv.ConvertOptions(
        column_types=schema,
        null_values=[""],
        strings_can_be_null=True,
        quoted_strings_can_be_null=False,
        true_values=["t"],
        false_values=["f"],
    )
    with read_ahead(_copy_out(conn, f"COPY ({sql}) TO STDOUT (FORMAT csv)", params)) as chunks:
        for chunk, block in chunks:
            read = csv.ReadOptions(column_names=schema.names, block_size=block)
            try:
                table = csv.read_csv(pa.py_buffer(chunk), read, parse, convert)
            except pa.ArrowInvalid:  # a text its type cannot hold exactly; UnicodeError is one
                raise Inexact from None
            yield from table.to_batches()


def _copy_out(conn: Any, statement: str, params: Sequence[Any]) -> Iterator[tuple[bytearray, int]]:
    """The bytes of ``statement`` (a ``COPY ... TO STDOUT``) in chunks of whole rows, about
    ``_CHUNK_BYTES`` each, with the CSV block size that parses each (a row must fit in one
    block: a row as wide as a block comes alone, in a block of its size).

    Read on ``conn``'s libpq connection (``conn.pgconn``, psycopg's documented low-level
    access): iterating psycopg's ``Copy`` costs a Python generator and a wait per row,
    three times the whole bulk read's time; here a row is one C call while rows are at
    hand. libpq returns a COPY's data one whole row at a time (the protocol sends one
    CopyData per row; psycopg's ``Copy.rows`` relies on it too). ``params`` are bound
    client-side, as psycopg binds a ``COPY``'s. A server error is the driver's error."""
    driver = import_driver("psycopg", needed_by="PostgresSource")
    pgconn, encoding = conn.pgconn, conn.info.encoding
    with selectors.DefaultSelector() as waiting:  # not select(): any descriptor number
        waiting.register(pgconn.socket, selectors.EVENT_READ | selectors.EVENT_WRITE)
        pgconn.send_query(driver.ClientCursor(conn).mogrify(statement, params).encode(encoding))
        while pgconn.flush():  # the query not all sent yet
            _wait(waiting, pgconn)
        waiting.modify(pgconn.socket, selectors.EVENT_READ)
        result = _result(waiting, pgconn)
        if result is None or result.status != driver.pq.ExecStatus.COPY_OUT:
            _finish(driver, waiting, pgconn, result, encoding)
            raise driver.ProgrammingError("the bulk read's COPY did not start")
        rows = bytearray()  # the chunk taking rows: appended to in C, handed on as it is
        while True:
            size, data = pgconn.get_copy_data(1)
            if size >= _BLOCK_BYTES:  # a row as wide as a block: a chunk and a block of its own
                if rows:
                    yield rows, _BLOCK_BYTES
                    rows = bytearray()
                yield bytearray(data), size + 1
            elif size > 0:
                rows += data
                if len(rows) >= _CHUNK_BYTES:
                    yield rows, _BLOCK_BYTES
                    rows = bytearray()
            elif size == 0:  # no whole row received yet
                _wait(waiting, pgconn)
            else:  # the end of the rows: the COPY's own result follows
                break
        if rows:
            yield rows, _BLOCK_BYTES
        _finish(driver, waiting, pgconn, _result(waiting, pgconn), encoding)


def _wait(waiting: selectors.BaseSelector, pgconn: Any) -> None:
    """Wait for the server (the GIL released), then take in what it sent."""
    waiting.select()
    pgconn.consume_input()


def _result(waiting: selectors.BaseSelector, pgconn: Any) -> Any:
    """The next result of ``pgconn``, once the server has sent it whole."""
    pgconn.consume_input()
    while pgconn.is_busy():
        _wait(waiting, pgconn)
    return pgconn.get_result()


def _finish(
    driver: Any, waiting: selectors.BaseSelector, pgconn: Any, result: Any, encoding: str
) -> None:
    """Take ``pgconn``'s results from ``result`` on; the first error the server sent, as
    the driver's error of its SQLSTATE."""
    failed = None
    while result is not None:
        if failed is None and result.status == driver.pq.ExecStatus.FATAL_ERROR:
            failed = driver.errors.error_from_result(result, encoding)
        result = _result(waiting, pgconn)
    if failed is not None:
        raise failed
