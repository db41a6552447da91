"""DuckDB's columns: the type a target column of each kind gets, how each value reaches
it exactly (its carrier), and a column list."""

from __future__ import annotations

from collections.abc import Sequence

from ...column_types import (
    ENGINE_CARRIERS,
    Carry,
    double_nan_as_text,
    exact_decimal,
    instant_as_utc_or_infinite,
    iso_date_or_infinite,
    utc_instant,
)
from ...errors import ConfigInvalid
from ...payloads import Column
from .._sql import quote

__all__ = ["DUCKDB_TYPES", "MAX_DECIMAL_WIDTH", "column_names", "duckdb_carrier", "duckdb_type"]

DUCKDB_TYPES = {
    "integer": "BIGINT",
    "real": "DOUBLE",
    "text": "VARCHAR",
    "blob": "BLOB",
    "any": "VARCHAR",
    "boolean": "BOOLEAN",
    "date": "DATE",
    "time": "TIME",
    "timestamp": "TIMESTAMP",
    "timestamptz": "TIMESTAMPTZ",
    "interval": "VARCHAR",  # PostgreSQL's text: DuckDB cannot read every interval it writes
    "numeric": "DOUBLE",
    "decimal": "VARCHAR",
}
"""The DuckDB type of each column kind (``column_types.py``).

``numeric`` and ``decimal`` become ``DECIMAL(p,s)`` when the source declares
a precision DuckDB can hold (at most 38): see :func:`duckdb_type`. Otherwise
a SQLite number is a DOUBLE (an integer beyond 2**53 is refused) and an exact
decimal stays its exact text.
"""

MAX_DECIMAL_WIDTH = 38


def duckdb_type(column: Column) -> str:
    """The DuckDB type a target column gets; built from fixed names, never from source text."""
    decimal = column.decimal(MAX_DECIMAL_WIDTH)
    if decimal is not None:
        return f"DECIMAL({decimal[0]},{decimal[1]})"
    return DUCKDB_TYPES[column.kind]


def duckdb_carrier(column: Column) -> Carry | None:
    """How a value of ``column`` reaches DuckDB exactly (``Sink.carrier``)."""
    decimal = column.decimal(MAX_DECIMAL_WIDTH)
    if decimal is not None:
        return exact_decimal(*decimal)
    return _CARRIERS.get(column.kind)


_CARRIERS: dict[str, Carry] = {
    **ENGINE_CARRIERS,
    "real": double_nan_as_text,  # its Python binding makes a bound NaN NULL
    "date": iso_date_or_infinite,
    "timestamp": instant_as_utc_or_infinite,
    "timestamptz": utc_instant,  # never the worker's time zone
}


def column_names(columns: Sequence[Column]) -> str:
    if not columns:
        raise ConfigInvalid("at least one column is required")
    return ", ".join(quote(column.name) for column in columns)
