"""ClickHouse SQL text: identifiers, column types, tables, bound predicates, row encoding.

Identifiers are always backtick-quoted; values reach the engine as typed
query parameters (``{name:Type}``), never as SQL text. The one exception is a
partition id in ``ALTER TABLE ... PARTITION ID '...'`` (ClickHouse takes no
parameter there); ids come from ``system.parts`` and must match
:data:`PARTITION_ID` before they are inlined.
"""

from __future__ import annotations

import datetime
import decimal
import json
import re
import secrets
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from ...column_types import ENGINE_CARRIERS, Carry, exact_decimal
from ...errors import ConfigInvalid
from ...payloads import Column, LoadFile, Predicate
from .._arrow import arrow, read_stream, row_type, write_stream
from .._sql import TableName, identifier, render_predicates

__all__ = [
    "ARROW_BLOCK_ROWS",
    "MAX_DECIMAL_PRECISION",
    "file_pattern",
    "PARTITION_ID",
    "column_carrier",
    "column_list",
    "column_type",
    "create_table_sql",
    "encode_json_rows",
    "partition_id_literal",
    "quote",
    "structure",
    "where_sql",
    "read_arrow_stream",
    "write_arrow_stream",
]

# A column kind (column_types.py) -> the ClickHouse type, always wrapped in Nullable().
_TYPES = {
    "integer": "Int64",
    "real": "Float64",
    "text": "String",
    "blob": "String",
    "any": "String",
    "boolean": "Bool",
    "date": "Date32",
    "time": "String",
    "timestamp": "DateTime64(6, 'UTC')",
    "timestamptz": "DateTime64(6, 'UTC')",
    "interval": "String",
    "numeric": "Float64",
    "decimal": "String",
}
MAX_DECIMAL_PRECISION = 76
_INT64 = (-(2**63), 2**63 - 1)
PARTITION_ID = re.compile(r"-?[0-9A-Za-z_]+")


def quote(name: Any) -> str:
    """An identifier in backticks, ClickHouse's quoting (a backslash escapes)."""
    return "`" + identifier(name).replace("\\", "\\\\").replace("`", "\\`") + "`"


def column_list(names: Sequence[str]) -> str:
    if not names:
        raise ConfigInvalid("at least one column is required")
    return ", ".join(quote(name) for name in names)


def column_type(column: Column) -> str:
    """The Nullable ClickHouse type of a source column, from its kind.

    ``numeric`` and ``decimal`` become ``Decimal(P, S)`` when the declared type
    states a precision ClickHouse supports (``NUMERIC(12, 2)``); otherwise a
    SQLite number is a ``Float64`` and an exact decimal its exact text.
    """
    quote(column.name)
    if not isinstance(column.decltype, str):
        raise ConfigInvalid(
            f"column {column.name!r} has an unsupported declared type",
            diagnostics={"column": column.name},
        )
    decimal = column.decimal(MAX_DECIMAL_PRECISION)
    if decimal is not None:
        return f"Nullable(Decimal({decimal[0]}, {decimal[1]}))"
    return f"Nullable({_TYPES[column.kind]})"


MADE_TYPES = tuple(sorted({f"Nullable({name})" for name in _TYPES.values()}))
"""The column types this sink makes (besides ``Nullable(Decimal(P, S))``)."""


# Integer types that cannot hold every Int64 (ClickHouse wraps wider values silently).
NARROW_INTEGERS = frozenset(
    f"Nullable({name})"
    for name in ("Int8", "Int16", "Int32", "UInt8", "UInt16", "UInt32", "UInt64")
)


def holds_int64(target_type: str) -> bool:
    """A nullable Int128, Int256 or ``Decimal(P, 0)`` with P >= 19: every Int64 fits."""
    if target_type in ("Nullable(Int128)", "Nullable(Int256)"):
        return True
    found = re.fullmatch(r"Nullable\(Decimal\((\d+), 0\)\)", target_type)
    return found is not None and int(found.group(1)) >= 19


def type_literal(name: str) -> str:
    """One of this module's own type names as a ClickHouse string literal (never source text)."""
    return "'" + name.replace("\\", "\\\\").replace("'", "\\'") + "'"


def column_carrier(column: Column) -> Carry | None:
    """How a value of ``column`` reaches ClickHouse exactly (see ``ValueCarrying``)."""
    decimal = column.decimal(MAX_DECIMAL_PRECISION)
    if decimal is not None:
        return exact_decimal(*decimal)
    return ENGINE_CARRIERS.get(column.kind)


def structure(columns: Sequence[Column]) -> str:
    """``name Type, ...``: the column list of a CREATE TABLE or of a ``file()`` reader."""
    if not columns:
        raise ConfigInvalid("at least one column is required")
    return ", ".join(f"{quote(column.name)} {column_type(column)}" for column in columns)


def create_table_sql(table: TableName, columns: Sequence[Column], partition_by: str | None) -> str:
    """A MergeTree table; partitioned by ``partition_by`` when given.

    Every column is Nullable, so a partitioned table needs the MergeTree
    setting ``allow_nullable_key``: NULL then is a partition of its own,
    instead of sharing one with ``''`` or ``0`` as a ``coalesce()`` key would.
    """
    definition = structure(columns)
    if partition_by is None:
        engine = f"ENGINE = MergeTree ORDER BY tuple() SETTINGS {DEDUPLICATION_WINDOW}"
    else:
        if partition_by not in {column.name for column in columns}:
            raise ConfigInvalid(
                f"partition column {partition_by!r} is not a column of target table {table.name!r}",
                diagnostics={"table": table.name, "column": partition_by},
            )
        engine = (
            f"ENGINE = MergeTree PARTITION BY {quote(partition_by)} ORDER BY tuple()"
            f" SETTINGS allow_nullable_key = 1, {DEDUPLICATION_WINDOW}"
        )
    return f"CREATE TABLE IF NOT EXISTS {table.sql(quote)} ({definition}) {engine}"


# MergeTree keeps the tokens of this many recent inserts: a repeated one is a no-op.
DEDUPLICATION_WINDOW = "non_replicated_deduplication_window = 1000"
_TOKEN = re.compile(r"[0-9a-f]{64}-[0-9]+")


def insert_settings(token: str | None) -> str:
    """An INSERT's ``SETTINGS``: deduplicated by its token, never by its content.

    With a deduplication window MergeTree would otherwise drop a block whose
    content repeats an earlier one: rows that are legitimately equal. So an
    INSERT without a batch token gets a random one (chDB's streamed inserts
    ignore ``insert_deduplicate = 0``; checked on chDB 4.4).
    """
    token = dedup_token(token)
    return f" SETTINGS insert_deduplication_token = '{token}'"


def dedup_token(token: str | None) -> str:
    """``token`` checked, or a random one that repeats no earlier insert."""
    if token is None:
        return f"{secrets.token_hex(32)}-0"
    if not _TOKEN.fullmatch(token):
        raise ConfigInvalid("an insert deduplication token has an unexpected form")
    return token


def partition_id_literal(partition_id: Any) -> str:
    """A ``system.parts`` partition id as a SQL string literal, after a strict format check."""
    if not isinstance(partition_id, str) or not PARTITION_ID.fullmatch(partition_id):
        raise ConfigInvalid("a partition id of the target has an unexpected form")
    return f"'{partition_id}'"


def _param_type(column: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigInvalid(
            f"a bound of column {column!r} has a type ClickHouse parameters do not take here",
            diagnostics={"column": column},
        )
    if isinstance(value, int):
        if not _INT64[0] <= value <= _INT64[1]:
            raise ConfigInvalid(
                f"a bound of column {column!r} is outside Int64", diagnostics={"column": column}
            )
        return "Int64"
    return "Float64" if isinstance(value, float) else "String"


def where_sql(predicates: Sequence[Predicate], *, prefix: str) -> tuple[str, dict[str, Any]]:
    """Render ``payloads.bound_predicates`` as a WHERE condition with typed parameters.

    Parameter names are ``prefix`` plus a counter, so several partitions'
    conditions can share one parameter mapping.
    """
    params: dict[str, Any] = {}

    def marker(predicate: Predicate) -> str:
        name = f"{prefix}{len(params)}"
        params[name] = predicate.value
        return f"{{{name}:{_param_type(predicate.column, predicate.value)}}}"

    where, _ = render_predicates(predicates, marker=marker, name=quote)
    if not where:
        raise ConfigInvalid("partition bounds select nothing")
    return where, params


def _json_default(value: object) -> str:
    """Bytes pass as raw bytes (see :func:`encode_json_rows`); dates and decimals as text."""
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8", "surrogateescape")
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal) and value.is_finite():
        return str(value)
    raise TypeError("not representable as JSON")


_ENCODER = json.JSONEncoder(ensure_ascii=False, allow_nan=True, default=_json_default)


def encode_json_rows(chunk: Sequence[Sequence[Any]]) -> bytes:
    """One chunk of rows as ``JSONCompactEachRow`` bytes (one JSON array per row).

    The C JSON encoder does the work. Bytes that are not UTF-8 are carried
    through ``surrogateescape``, so the engine stores the original bytes in
    the String column; NaN and infinities use the tokens ClickHouse reads.
    """
    if not chunk:
        return b""
    try:
        text = "\n".join(_ENCODER.encode(list(row)) for row in chunk) + "\n"
        return text.encode("utf-8", "surrogateescape")
    except (TypeError, ValueError):
        raise ConfigInvalid("a row holds a value the ClickHouse sink cannot encode") from None


# ClickHouse type -> Arrow type; a blob column is bytes, every other column text, which
# ClickHouse parses into its type (Date32, DateTime64, Decimal) as it parses JSON text.
_ARROW_TYPES = {"Int64": "int64", "Float64": "float64", "Bool": "bool_"}
ARROW_BLOCK_ROWS = 65_536  # rows per record batch, so per block (write_arrow_stream)


def _arrow_type(column: Column) -> str:
    if column.kind == "blob":
        return "large_binary"
    base = column_type(column).removeprefix("Nullable(").removesuffix(")")
    return _ARROW_TYPES.get(base, "large_string")


_FILE_PATTERN = re.compile(r"[*?{}]")


def file_pattern(path: Path | str) -> bool:
    """Whether ClickHouse's ``file()`` would read ``path`` as a pattern (``*``, ``?``,
    ``{a,b}``): it then reads other files, or none and inserts nothing without an error, so
    such a path is never handed to it (checked on chDB 4.4)."""
    return bool(_FILE_PATTERN.search(str(path)))


def write_arrow_stream(
    path: Path, columns: Sequence[Column], chunks: Iterable[Sequence[tuple]], *, table: str
) -> LoadFile | Iterator[Sequence[tuple]]:
    """Write the chunks to the new private file ``path`` as one Arrow IPC stream
    (``_arrow.write_stream``): the file written, or every row once a block would
    not convert (a date or a ``Decimal`` object, an integer beyond 64 bits).

    ClickHouse makes a block of each record batch and deduplicates a repeated INSERT block
    by block; so the batches are ``ARROW_BLOCK_ROWS`` rows each, whatever the chunks were,
    and a retry that reads the same rows in other chunks is deduplicated too. The fields
    carry the columns' names: ``file()`` matches them by name.
    """
    pa = arrow("the ClickHouse sink")
    struct = row_type(pa, [(column.name, _arrow_type(column)) for column in columns])
    return write_stream(pa, path, struct, chunks, batch_rows=ARROW_BLOCK_ROWS, table=table)


def read_arrow_stream(path: Path) -> Iterator[list[tuple]]:
    """The rows of an Arrow stream file ``write_arrow_stream`` wrote, one list per batch."""
    return read_stream(arrow("the ClickHouse sink"), path)
