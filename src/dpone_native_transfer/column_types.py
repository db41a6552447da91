"""Column kinds: the one neutral type vocabulary between sources and sinks, and exact values.

A source names each column's *kind* (``Column.kind``); every sink maps a kind
to its own column type and says, per kind, how a source value is carried
exactly (``ValueCarrying`` in ``connectors/contract.py``). A value a target
cannot hold exactly is refused before the target call with
``ValueUnsupported``, naming its column and never the value.

Kinds: ``integer``, ``real`` (IEEE double, NaN and infinities included),
``text``, ``blob``, ``any`` (SQLite's untyped column: any storage class),
``boolean``, ``date``, ``time``, ``timestamp`` (no zone), ``timestamptz`` (an
instant), ``interval``, ``numeric`` (a number as SQLite stores it: an integer
or a double, with an optional declared precision) and ``decimal`` (an exact
decimal, as PostgreSQL's ``numeric`` is, delivered as its text).
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from .errors import ValueUnsupported

__all__ = [
    "KINDS",
    "Carry",
    "as_boolean",
    "as_double",
    "as_text",
    "carried_chunks",
    "declared_precision",
    "exact_decimal",
    "finite_double",
    "instant_as_utc",
    "postgres_kind",
    "sqlite_kind",
]

KINDS = frozenset(
    "integer real text blob any boolean date time timestamp timestamptz interval numeric"
    " decimal".split()
)

Carry = Callable[[Any], Any]
"""One non-NULL source value -> the value a sink writes; ValueError/TypeError to refuse it."""

_PRECISION = re.compile(r"\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)")
_EXACT_DOUBLE_INT = 2**53


def sqlite_kind(decltype: str) -> str:
    """The kind of a SQLite column: SQLite's affinity rules, refined by the common type names.

    INTEGER, TEXT, BLOB and REAL affinities give ``integer``, ``text``, ``blob``
    and ``real``; no declared type gives ``any``; NUMERIC affinity gives
    ``boolean``, ``timestamptz``, ``timestamp``, ``date``, ``time``, ``any``
    (UUID, JSON: text or numbers, as SQLite stores them) by name, or ``numeric``.
    """
    upper = decltype.upper()
    if not upper.strip():
        return "any"
    for needles, kind in (
        (("INT",), "integer"),
        (("CHAR", "CLOB", "TEXT"), "text"),
        (("BLOB",), "blob"),
        (("REAL", "FLOA", "DOUB"), "real"),
        (("BOOL",), "boolean"),
        (("TIMESTAMPTZ", "WITH TIME ZONE"), "timestamptz"),
        (("TIMESTAMP", "DATETIME"), "timestamp"),
        (("DATE",), "date"),
        (("TIME",), "time"),
        (("UUID", "JSON"), "any"),
    ):
        if any(needle in upper for needle in needles):
            return kind
    return "numeric"


_POSTGRES_KINDS = {
    "smallint": "integer",
    "integer": "integer",
    "bigint": "integer",
    "real": "real",
    "double precision": "real",
    "numeric": "decimal",
    "boolean": "boolean",
    "bytea": "blob",
    "date": "date",
    "time without time zone": "time",
    "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamptz",
    "interval": "interval",
}


def postgres_kind(format_type: str) -> str:
    """The kind of a PostgreSQL column from ``format_type()``; anything else is its text."""
    base = _PRECISION.sub("", format_type).strip()
    if base.endswith("[]"):
        return "text"
    return _POSTGRES_KINDS.get(base, "text")


def declared_precision(decltype: str) -> tuple[int, int] | None:
    """``(precision, scale)`` of ``NUMERIC(p[, s])``-style declared types, else None."""
    match = _PRECISION.search(decltype)
    if match is None:
        return None
    precision, scale = int(match[1]), int(match[2] or 0)
    return (precision, scale) if 1 <= precision and scale <= precision else None


# --- carriers: exact conversions shared by the sinks ------------------------------------------


def as_text(value: Any) -> str:
    """An untyped value as text: numbers in their shortest exact form; bytes are refused."""
    if isinstance(value, str):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return repr(value)
    raise TypeError("not text")


_BOOLEAN_TEXT = {"true": True, "t": True, "1": True, "false": False, "f": False, "0": False}


def as_boolean(value: Any) -> bool:
    """SQLite's booleans: 0/1-style integers and the texts true/false/t/f/1/0 (any case)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str):
        return _BOOLEAN_TEXT[value.strip().lower()]  # KeyError is refused below
    raise TypeError("not a boolean")


def as_double(value: Any) -> float:
    """A number as a double, refused when the double would not be the same number."""
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) <= _EXACT_DOUBLE_INT:
        return float(value)
    raise ValueError("not exact as a double")


def finite_double(value: Any) -> Any:
    """Refuse NaN (SQLite would store NULL); anything else passes unchanged."""
    if isinstance(value, float) and math.isnan(value):
        raise ValueError("NaN")
    return value


def exact_decimal(precision: int, scale: int) -> Carry:
    """A carrier into ``DECIMAL(precision, scale)`` that never rounds: the text of the exact
    decimal, or a refusal when the value has more digits or decimals than the type."""
    limit = decimal.Decimal(10) ** (precision - scale)

    def carry(value: Any) -> str:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise TypeError("not a number")
        number = decimal.Decimal(value if isinstance(value, str | int) else repr(value))
        if not number.is_finite() or number.as_tuple().exponent < -scale or abs(number) >= limit:
            raise ValueError("not exact in the declared precision")
        return format(number, "f")

    return carry


def instant_as_utc(value: Any) -> Any:
    """A timestamp text with an offset becomes the same instant in UTC, without the offset;
    text without one passes unchanged (an engine keeps it as written)."""
    if not isinstance(value, str):
        raise TypeError("not a timestamp text")
    try:
        parsed = datetime.datetime.fromisoformat(value)
    except ValueError:
        return value  # not ISO (e.g. 'infinity'): the engine reads it or refuses it
    if parsed.tzinfo is None:
        return value
    return parsed.astimezone(datetime.UTC).replace(tzinfo=None).isoformat(sep=" ")


def carried_chunks(
    chunks: Iterable[Sequence[tuple]],
    carriers: Sequence[tuple[int, str, Carry]],
    *,
    target: str,
) -> Iterator[Sequence[tuple]]:
    """``chunks`` with each ``(index, column, carry)`` applied to that column's non-NULL values.

    A refused value stops the rows with ``ValueUnsupported`` naming the column.
    """
    for chunk in chunks:
        if not chunk or not carriers:
            yield chunk
            continue
        columns = list(zip(*chunk, strict=True))
        for index, name, carry in carriers:
            try:
                columns[index] = [None if v is None else carry(v) for v in columns[index]]
            except (ValueError, TypeError, KeyError, decimal.InvalidOperation):
                raise ValueUnsupported(
                    f"column {name!r} holds a value {target} cannot hold exactly; nothing "
                    "was written (see docs/connectors.md, 'Column kinds and exact values')",
                    diagnostics={"column": name, "target": target},
                ) from None
        yield list(zip(*columns, strict=True))
