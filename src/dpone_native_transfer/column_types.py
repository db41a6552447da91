"""Column kinds: the one neutral type vocabulary between sources and sinks, and exact values.

A source names each column's *kind* (``Column.kind``); every sink maps a kind
to its own column type and says, per kind, how a source value is carried
exactly (``ValueCarrying`` in ``connectors/contract.py``). A value a target
cannot hold exactly is refused before the target call with
``ValueUnsupported``, naming its column and never the value.

Kinds: ``integer``, ``real`` (IEEE double, NaN and infinities included),
``text``, ``blob``, ``any`` (SQLite's untyped column: any storage class; an engine
other than SQLite takes its text only),
``boolean``, ``date``, ``time``, ``timestamp`` (no zone), ``timestamptz`` (an
instant), ``interval``, ``numeric`` (a number as SQLite stores it: an integer
or a double, with an optional declared precision) and ``decimal`` (an exact
decimal, as PostgreSQL's ``numeric`` is, delivered as its text).
"""

from __future__ import annotations

import calendar
import datetime
import decimal
import importlib
import math
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import itemgetter
from typing import Any

import attrs

from .errors import ConfigInvalid, PathContractBroken, ValueUnsupported
from .identity import upper_ascii

__all__ = [
    "ENGINE_CARRIERS",
    "KINDS",
    "Carry",
    "Column",
    "as_boolean",
    "as_double",
    "carried_chunks",
    "column_carriers",
    "declared_precision",
    "decimal_text",
    "double_nan_as_text",
    "exact_bytes",
    "exact_decimal",
    "exact_integer",
    "exact_text",
    "finite_double",
    "instant_as_utc",
    "instant_as_utc_or_infinite",
    "iso_date",
    "iso_date_or_infinite",
    "iso_time",
    "passing",
    "postgres_kind",
    "sqlite_kind",
    "utc_instant",
    "without_nul",
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
    upper = upper_ascii(decltype)
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


def _check_kind(column: Column, attribute: Any, kind: Any) -> None:
    if kind not in KINDS:
        raise ConfigInvalid(
            f"column {column.name!r} has no known kind (see column_types.KINDS)",
            diagnostics={"column": str(column.name)},
        )


def _default_kind(column: Column) -> str:
    return sqlite_kind(column.decltype) if isinstance(column.decltype, str) else "any"


@attrs.frozen
class Column:
    """A source column: its name, the source's own declared type, and its neutral kind.

    ``kind`` is what sinks map to their own types; a source that does not set it
    gets SQLite's rules applied to ``decltype``. Only ``name`` and ``decltype``
    enter the schema hash.
    """

    name: str
    decltype: str
    kind: str = attrs.field(
        default=attrs.Factory(_default_kind, takes_self=True), validator=_check_kind
    )

    def decimal(self, widest: int) -> tuple[int, int] | None:
        """``(precision, scale)`` when this numeric or decimal column declares a precision
        of at most ``widest`` digits (what a target's DECIMAL type can hold), else None."""
        if self.kind not in ("numeric", "decimal") or not isinstance(self.decltype, str):
            return None
        declared = declared_precision(self.decltype)
        return declared if declared is not None and declared[0] <= widest else None


# --- carriers: exact conversions shared by the sinks ------------------------------------------
#
# SQLite stores any value in any column (an INTEGER column may hold 1.5 or 'abc'), and the
# engines convert what they are given silently ('0x1A' -> 26, a date's time dropped). So a
# carrier accepts exactly the values its kind means and refuses everything else. A carrier
# may say which chunk columns it leaves unchanged (``unchanged(values)``, checked at C speed):
# those are not touched value by value.

_NONE = type(None)
_BULK_FROM = 1_000  # values of a column worth importing pyarrow for (``Passing.in_bulk``)


def _all_null(values: Sequence[Any]) -> bool:
    return values.count(None) == len(values)


def _arrow_texts(texts: Sequence[Any]) -> tuple[Any, Any, Any] | None:
    """(pyarrow, pyarrow.compute, ``texts`` as an Arrow string array) for a column worth
    converting in bulk; None (its values are then carried one by one) for a short column
    before pyarrow is loaded (importing it costs more than a few values), a value neither
    text nor NULL, or without pyarrow (it comes with the engines' extras)."""
    if len(texts) < _BULK_FROM and "pyarrow.compute" not in sys.modules:
        return None
    if not set(map(type, texts)) <= {str, _NONE}:
        return None
    try:
        pa, pc = map(importlib.import_module, ("pyarrow", "pyarrow.compute"))
    except ImportError:
        return None
    return pa, pc, pa.array(texts, pa.string())


@attrs.frozen
class Passing:
    """A carrier with a fast path: a column whose values ``unchanged`` accepts is left as it is;
    ``in_bulk(values)``, when given, carries a whole column at C speed, giving exactly what
    ``convert`` gives each value, or None (then ``convert`` runs per value and refuses)."""

    convert: Carry
    unchanged: Callable[[Sequence[Any]], bool]
    in_bulk: Callable[[Sequence[Any]], list[Any] | None] | None = None

    def __call__(self, value: Any) -> Any:
        return self.convert(value)


def passing(*types: type) -> Callable[[Carry], Passing]:
    """Make a carrier ``Passing``: a column of only ``types`` values (and NULLs) is unchanged."""
    allowed = frozenset({*types, _NONE})

    def unchanged(values: Sequence[Any]) -> bool:
        return set(map(type, values)) <= allowed

    return lambda carry: Passing(carry, unchanged)


def _no_nan(values: Sequence[Any]) -> bool:
    doubles = set(map(type, values)) <= {float, _NONE}
    return doubles and not any(map(math.isnan, filter(None, values)))


def _double_nan_as_text(value: Any) -> Any:
    if type(value) is float:
        return "nan" if value != value else value
    return as_double(value)


# A double, NaN as the text ``'nan'`` (DuckDB's Python binding turns a NaN inside a bound
# list into NULL; the text casts back to NaN); an integer a double holds exactly; else refused.
double_nan_as_text = Passing(_double_nan_as_text, _no_nan)


@passing(int)
def exact_integer(value: Any) -> int:
    """An integer as SQLite stores it; a real, a text or bytes in an integer column is refused."""
    if type(value) is int:
        return value
    raise TypeError("not an integer")


@passing(str)
def exact_text(value: Any) -> str:
    """Text; bytes in a text column are refused (an engine would store their escape)."""
    if type(value) is str:
        return value
    raise TypeError("not text")


@passing(bytes)
def exact_bytes(value: Any) -> bytes:
    """Bytes; a text in a blob column becomes its UTF-8 bytes (what SQLite's own readers give)."""
    if type(value) is bytes:
        return value
    if type(value) is str:
        return value.encode("utf-8", "surrogatepass")
    raise TypeError("not bytes")


def _as_boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):
        return value == 1
    raise TypeError("not a boolean")


def _booleans_in_bulk(values: Sequence[Any]) -> list[Any] | None:
    """``as_boolean`` of a column of SQLite's 0 and 1 (and NULLs), with C loops only; None
    (then per value) for any other value."""
    if not set(map(type, values)) <= {int, _NONE} or not set(values) <= {0, 1, None}:
        return None
    return list(map({0: False, 1: True, None: None}.__getitem__, values))


as_boolean = Passing(_as_boolean, passing(bool)(_as_boolean).unchanged, _booleans_in_bulk)
"""A boolean, or SQLite's own: the integers 0 and 1 (``FALSE``, ``TRUE``). Any other
integer (2), a text ('true') or a double is refused: each is another value, and an
engine's own SQLite reader (lazy-plan) refuses it too. A column of 0 and 1 is carried
with C loops only (``_booleans_in_bulk``)."""


@passing(float)
def as_double(value: Any) -> float:
    """A number as a double, refused when the double would not be the same number."""
    if type(value) is float:
        return value
    if type(value) is int and abs(value) <= _EXACT_DOUBLE_INT:
        return float(value)
    raise ValueError("not exact as a double")


def _finite_double(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        raise ValueError("NaN")
    return value


# Refuse NaN (SQLite would store NULL); anything else passes unchanged. A column of doubles
# without a NaN is left as it is without a call per value.
finite_double = Passing(_finite_double, _no_nan)


_DECIMAL_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)


def exact_decimal(precision: int, scale: int) -> Passing:
    """A carrier into ``DECIMAL(precision, scale)`` that never rounds: the text of the exact
    decimal, or a refusal when the value has more digits or decimals than the type. Text must
    be a plain ASCII decimal (no ``1_000``, no other scripts' digits, no NaN)."""
    limit = decimal.Decimal(10) ** (precision - scale)

    def carry(value: Any) -> str:
        if type(value) is str:
            if not _DECIMAL_TEXT.fullmatch(value):
                raise ValueError("not a decimal text")
            number = decimal.Decimal(value)
        elif type(value) is int:
            number = decimal.Decimal(value)
        elif type(value) is float and scale:
            number = decimal.Decimal(repr(value))
        else:  # a real into DECIMAL(p,0): its text beyond 2**53 is not the stored value
            raise TypeError("not a number of the column's kind")
        exponent = number.as_tuple().exponent
        if not isinstance(exponent, int) or exponent < -scale or number.copy_abs() >= limit:
            raise ValueError("not exact in the declared precision")  # or not finite
        return format(number, "f")

    return Passing(carry, _all_null, lambda values: _decimals_in_bulk(values, precision, scale))


# A decimal as ``repr`` writes an int or a float without an exponent, and as PostgreSQL writes
# a numeric: ``format(Decimal(text), "f")`` is the text itself.
_PLAIN_DECIMAL = r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?$"


def _decimals_in_bulk(values: Sequence[Any], precision: int, scale: int) -> list[Any] | None:
    """``exact_decimal(precision, scale)`` of a whole column whose values are all texts, or
    all ints and floats (their ``repr``, a C call each), in the plain form ``_PLAIN_DECIMAL``:
    the digits before and after the point counted in pyarrow's C. The texts are what the
    carrier gives each value; None (then it runs per value, and refuses) for any other
    type or form (an exponent, NaN), too many digits, or without pyarrow."""
    if len(values) < _BULK_FROM and "pyarrow.compute" not in sys.modules:
        return None  # before the reprs: a short column is carried one by one
    kinds = set(map(type, values)) - {_NONE}
    if kinds == {str}:
        texts = list(values)
    elif kinds and kinds <= ({int, float} if scale else {int}):  # as ``exact_decimal``
        texts = [None if value is None else repr(value) for value in values]
    else:
        return None
    arrow = _arrow_texts(texts)
    if arrow is None:
        return None
    pa, pc, text = arrow
    if pc.all(pc.match_substring_regex(text, _PLAIN_DECIMAL)).as_py() is False:
        return None
    length, point = pc.utf8_length(text), pc.find_substring(text, ".")
    without = pc.less(point, 0)
    fraction = pc.if_else(without, 0, pc.subtract(pc.subtract(length, point), 1))
    whole = pc.subtract(pc.if_else(without, length, point), pc.starts_with(text, "-").cast("int32"))
    zero = pc.or_(pc.starts_with(text, "0"), pc.starts_with(text, "-0"))  # below 1: no digit
    digits = pc.if_else(zero, 0, whole)
    most = pc.max(fraction).as_py(), pc.max(digits).as_py()
    if most[0] is not None and (most[0] > scale or most[1] > precision - scale):
        return None
    return texts


_NUMERIC_WORDS = frozenset({"NaN", "Infinity", "-Infinity"})  # PostgreSQL numeric's own


def decimal_text(value: Any) -> str:
    """The text of an exact decimal of any precision: a plain ASCII decimal, or PostgreSQL
    numeric's ``NaN``, ``Infinity`` and ``-Infinity``; other text is refused."""
    if type(value) is str and (value in _NUMERIC_WORDS or _DECIMAL_TEXT.fullmatch(value)):
        return value
    raise ValueError("not a decimal text")


def without_nul(carry: Carry) -> Passing:
    """``carry``, refusing a text holding NUL, which PostgreSQL text cannot store; a column
    ``carry`` leaves unchanged stays unchanged when none of its texts holds one."""

    def convert(value: Any) -> Any:
        carried = carry(value)
        if isinstance(carried, str) and "\x00" in carried:
            raise ValueError("NUL in text")
        return carried

    def unchanged(values: Sequence[Any]) -> bool:
        kept = isinstance(carry, Passing) and carry.unchanged(values)
        return kept and "\x00" not in "".join(filter(None, values))  # texts: in C, not a loop

    return Passing(convert, unchanged)


_DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
# The forms a time and a timestamp are carried in, checked before Python reads them: its
# ``fromisoformat`` also takes any character between date and time, ``T10``, ``10:00:00,5``,
# ``20200101T100000``, week dates and a NUL, each of which an engine then read its own way
# (chDB as NULL, PostgreSQL without its time, DuckDB failing inside the target call). At most
# microseconds. A timestamp has its seconds; an offset (``Z``, ``+HH[:MM[:SS[.f]]]``) makes it
# the same instant in UTC, written as ``isoformat`` writes it.
_SECONDS = r"[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?"
_TIME_TEXT = re.compile(rf"[0-9]{{2}}:[0-9]{{2}}|{_SECONDS}", re.ASCII)
# An offset's hour is below 24 and its minutes and seconds below 60: ``fromisoformat`` took
# ``+00:99`` as 99 minutes, and the engines stored an invented instant (exit 0).
_INSTANT_FORM = re.compile(
    rf"[0-9]{{4}}-[0-9]{{2}}-[0-9]{{2}}(?:[ T]{_SECONDS}"
    r"(?:Z|[+-](?:[01][0-9]|2[0-3])(?::?[0-5][0-9](?::?[0-5][0-9](?:\.[0-9]{1,6})?)?)?)?)?",
    re.ASCII,
)
_INFINITE = frozenset({"infinity", "-infinity"})  # PostgreSQL's; DuckDB reads them


def _iso_date(value: Any) -> str:
    if type(value) is not str or not _DATE_TEXT.fullmatch(value):
        raise ValueError("not an ISO date")
    datetime.date.fromisoformat(value)
    return value


def _iso_date_or_infinite(value: Any) -> str:
    return value if value in _INFINITE else _iso_date(value)


_FIRST_DAY = (datetime.date(1, 1, 1) - datetime.date(1970, 1, 1)).days


def _dates_kept(values: Sequence[Any], *, infinite: bool) -> bool:
    """Whether ``iso_date`` (``infinite``: ``_or_infinite``) keeps every value of a column
    as it is, checked in pyarrow's C: the form by a regular expression, each date by
    Arrow's parser (a real date), and from year 1 on. False (then each value is carried,
    and refused) otherwise, for a short column before pyarrow is loaded, or without it."""
    arrow = _arrow_texts(values)
    if arrow is None:  # a column of NULLs keeps them; any other is carried
        return _all_null(values)
    pa, pc, text = arrow
    if infinite:
        kept = pc.is_in(text, value_set=pa.array(sorted(_INFINITE)))
        text = pc.if_else(kept, pa.scalar(None, pa.string()), text)
    if pc.all(pc.match_substring_regex(text, r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")).as_py() is False:
        return False
    try:
        days = pc.cast(pc.cast(text, pa.date32()), pa.int32())
    except pa.ArrowInvalid:
        return False  # not a real date
    first = pc.min(days).as_py()
    return first is None or first >= _FIRST_DAY


iso_date = Passing(_iso_date, lambda values: _dates_kept(values, infinite=False))
"""A date as ``YYYY-MM-DD`` text (a real date); anything else, BC dates included, refused.
A column of such dates is checked at C speed and left as it is (``_dates_kept``)."""

iso_date_or_infinite = Passing(
    _iso_date_or_infinite, lambda values: _dates_kept(values, infinite=True)
)
"""``iso_date``, or PostgreSQL's ``infinity`` and ``-infinity`` (DuckDB holds them)."""


def iso_time(value: Any) -> str:
    """A time of day as ISO text without an offset, at most microseconds (or ``24:00:00``)."""
    if type(value) is not str:
        raise TypeError("not a time text")
    if value != "24:00:00":
        if not _TIME_TEXT.fullmatch(value):
            raise ValueError("not an ISO time without an offset")
        datetime.time.fromisoformat(value)  # ValueError: hour 25, minute 60...
    return value


def _instant_as_utc(value: Any) -> str:
    if type(value) is not str:
        raise TypeError("not a timestamp text")
    if not _INSTANT_FORM.fullmatch(value):
        raise ValueError("not an ISO timestamp")
    parsed = datetime.datetime.fromisoformat(value)  # ValueError: refused
    if parsed.tzinfo is None:
        return value
    return parsed.astimezone(datetime.UTC).replace(tzinfo=None).isoformat(sep=" ")


def _instant_as_utc_or_infinite(value: Any) -> str:
    return value if value in _INFINITE else _instant_as_utc(value)


def _utc_instant(value: Any) -> str:
    if value in _INFINITE:
        return value
    return _instant_as_utc(value) + "+00:00"


# ``YYYY-MM-DD``, or with ``[ T]HH:MM:SS[.f{1,6}]`` and an optional offset (``Z``, ``+HH``,
# ``+HH:MM`` below 24 hours): the texts ``_instants_in_bulk`` carries; any other goes per value.
_INSTANT_TEXT = (
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}(?:[ T][0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,6})?"
    r"(?:Z|[+-](?:[01][0-9]|2[0-3])(?::[0-5][0-9])?)?)?$"
)
_WITH_OFFSET = r":[0-9]{2}(?:\.[0-9]+)?(?:Z|[+-][0-9]{2}(?::[0-9]{2})?)$"  # after a time
_EPOCH = datetime.datetime(1970, 1, 1)
_FIRST_INSTANT = (datetime.datetime(1, 1, 1) - _EPOCH) // datetime.timedelta(microseconds=1)
_LAST_INSTANT = (datetime.datetime.max - _EPOCH) // datetime.timedelta(microseconds=1)


def _instants_in_bulk(
    values: Sequence[Any], *, infinite: bool, suffix: str = ""
) -> list[Any] | None:
    """``instant_as_utc`` (``infinite``: ``_or_infinite``; ``suffix``: ``utc_instant``'s
    ``+00:00``) of a whole column, in pyarrow's C: the form checked by one regular
    expression, each date, time and offset by Arrow's parser (a real date, hour 0-23, no
    leap second), every instant within years 1-9999 (Python's), and an instant with an
    offset written in UTC as ``isoformat(sep=" ")`` writes it; one without is kept as it is.
    None (the carrier then runs per value, and refuses) for a value of another type or
    form, out of range, or without pyarrow."""
    arrow = _arrow_texts(values)
    if arrow is None:
        return None
    pa, pc, text = arrow
    nothing = pa.scalar(None, pa.string())
    kept = pc.is_in(text, value_set=pa.array(sorted(_INFINITE))) if infinite else None
    finite = text if kept is None else pc.if_else(kept, nothing, text)
    if pc.all(pc.match_substring_regex(finite, _INSTANT_TEXT)).as_py() is False:
        return None  # a text outside the form
    offset = pc.fill_null(pc.match_substring_regex(finite, _WITH_OFFSET), False)
    try:
        walls = pc.cast(pc.if_else(offset, nothing, finite), pa.timestamp("us"))
        instants = pc.cast(pc.if_else(offset, finite, nothing), pa.timestamp("us", tz="UTC"))
    except pa.ArrowInvalid:
        return None  # not a real date or time
    utc = pc.cast(instants, pa.timestamp("us"))
    for each in (walls, utc):
        extremes = pc.min_max(pc.cast(each, pa.int64())).as_py()
        if extremes["min"] is not None and (
            extremes["min"] < _FIRST_INSTANT or extremes["max"] > _LAST_INSTANT
        ):
            return None  # beyond Python's years: refused per value
    written = pc.cast(utc, pa.string())  # always six decimals; isoformat writes none for 0
    whole = pc.fill_null(pc.ends_with(written, ".000000"), False)
    written = pc.if_else(whole, pc.utf8_slice_codeunits(written, 0, -7), written)
    carried = pc.if_else(offset, written, finite)
    if suffix:
        carried = pc.binary_join_element_wise(carried, suffix, "")
    if kept is not None:
        carried = pc.if_else(kept, text, carried)
    return carried.to_pylist()


instant_as_utc = Passing(
    _instant_as_utc, _all_null, lambda values: _instants_in_bulk(values, infinite=False)
)
"""An ISO timestamp text; one with an offset becomes the same instant in UTC, without
the offset. Text that is not an ISO date and time (a bare time, a leap second, hour 25,
more than microseconds, a zone name, a number) is refused. A column of the common forms
is carried in bulk, at C speed (``_instants_in_bulk``)."""

instant_as_utc_or_infinite = Passing(
    _instant_as_utc_or_infinite,
    _all_null,
    lambda values: _instants_in_bulk(values, infinite=True),
)
"""``instant_as_utc``, or PostgreSQL's ``infinity`` and ``-infinity`` (DuckDB holds them)."""

utc_instant = Passing(
    _utc_instant,
    _all_null,
    lambda values: _instants_in_bulk(values, infinite=True, suffix="+00:00"),
)
"""An instant as text with an explicit ``+00:00``: a text without an offset is taken as
UTC, never as the worker's local time."""


# PostgreSQL's own text of a day beyond Python's years 1-9999, as a PostgreSQL source sends it
# (DateStyle ISO, TimeZone UTC): ``0044-03-15 BC``, ``12000-01-01 10:00:00+00``. Only a zero
# offset: another one would need calendar arithmetic Python cannot do on such a year.
_POSTGRES_DAY = re.compile(
    rf"([0-9]{{4,7}})-([0-9]{{2}})-([0-9]{{2}})(?: ({_SECONDS})(\+00(?::?00)?|Z)?)?( BC)?",
    re.ASCII,
)
# PostgreSQL's range as (astronomical year, month, day): from 4714-11-24 BC (Julian day 0)
_POSTGRES_FIRST_DAY = (-4713, 11, 24)
_POSTGRES_LAST_DAY = {"date": (5874897, 12, 31), "timestamp": (294276, 12, 31)}
_MONTH_DAYS = (31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)


def _postgres_day(value: Any, kind: str, zone: str) -> str:
    """``value`` if it is PostgreSQL's text of a real day (proleptic Gregorian, as PostgreSQL
    counts) in its range for ``kind``; with ``zone`` (``+00:00``) in place of any zero offset
    of a time. ValueError otherwise."""
    found = _POSTGRES_DAY.fullmatch(value) if type(value) is str else None
    if found is None or (found[4] is None) != (kind == "date"):  # a date's time: dropped
        raise ValueError("not a PostgreSQL date or timestamp")
    year, month, day, time, _, bc = found.groups()
    on = (1 - int(year) if bc else int(year), int(month), int(day))  # 1 BC is year 0
    if int(year) < 1 or not 1 <= on[1] <= 12 or not 1 <= on[2] <= _MONTH_DAYS[on[1] - 1]:
        raise ValueError("not a real day")
    if on[1:] == (2, 29) and not calendar.isleap(on[0]):  # pure arithmetic: any year
        raise ValueError("not a real day")
    if not _POSTGRES_FIRST_DAY <= on <= _POSTGRES_LAST_DAY[kind]:
        raise ValueError("a day PostgreSQL does not hold")
    if time is None:
        return value
    datetime.time.fromisoformat(time)  # ValueError: hour 24, minute 60...
    return f"{year}-{month}-{day} {time}{zone}{bc or ''}"


def _beyond_python(carry: Passing, kind: str, zone: str = "") -> Passing:
    """``carry``, and a value it refuses taken when it is PostgreSQL's text of a day beyond
    Python's years (``_postgres_day``): a BC date, year 10000 on."""

    def convert(value: Any) -> Any:
        try:
            return carry.convert(value)
        except ValueError:
            return _postgres_day(value, kind, zone)

    return Passing(convert, carry.unchanged, carry.in_bulk)


postgres_date = _beyond_python(iso_date_or_infinite, "date")
postgres_timestamp = _beyond_python(instant_as_utc_or_infinite, "timestamp")
postgres_timestamptz = _beyond_python(utc_instant, "timestamp", "+00:00")
"""PostgreSQL's carriers of its dates and timestamps: every day it holds, BC and year 10000
on included, as a PostgreSQL source sends them; a timestamp with time zone in UTC."""


ENGINE_CARRIERS: dict[str, Carry] = {
    "integer": exact_integer,
    "real": as_double,
    "text": exact_text,
    "blob": exact_bytes,
    "any": exact_text,  # a number or bytes in an untyped column: no one type holds them all
    "boolean": as_boolean,
    "date": iso_date,
    "time": iso_time,
    "timestamp": instant_as_utc,
    "timestamptz": instant_as_utc,
    "interval": exact_text,
    "numeric": as_double,
    "decimal": exact_text,
}
"""A carrier for every kind, for engines that convert what they are given (DuckDB,
ClickHouse): SQLite stores any value in any column, and such an engine would turn a wrong
one into another value silently ('0x1A' into BIGINT 26, '' into Int64 0, a date's time
dropped). Decimals with a precision take ``exact_decimal`` instead."""

_REFUSED = (ValueError, TypeError, KeyError, OverflowError, decimal.InvalidOperation)


def _sorted_out(
    chunks: Iterable[Sequence[tuple]],
    carriers: Sequence[tuple[int, str, Carry]],
    *,
    target: str,
    reject: Callable[[tuple, str, Any], None] | None,
    spared: Callable[[tuple, int], bool] | None,
) -> Iterator[Sequence[tuple]]:
    """``carried_chunks`` whose refused values are ``spared`` (NULL) or their rows given to
    ``reject`` (else refused): a chunk is carried as one while every value fits, and row by
    row only once one does not."""
    for chunk in chunks:
        try:
            yield from carried_chunks([chunk], carriers, target=target)
            continue
        except ValueUnsupported:
            pass
        kept = []
        for row in chunk:
            values = list(row)
            for index, name, carry in carriers:
                if values[index] is None:
                    continue
                try:
                    values[index] = carry(values[index])
                except _REFUSED:
                    if spared is not None and spared(row, index):
                        values[index] = None
                        continue
                    if reject is None:
                        raise _refused(name, target) from None
                    reject(tuple(row), name, row[index])
                    break
            else:
                kept.append(tuple(values))
        if kept:
            yield kept


def _refused(name: str, target: str) -> ValueUnsupported:
    return ValueUnsupported(
        f"column {name!r} holds a value {target} cannot hold exactly; nothing was written "
        "(see docs/connectors.md, 'Column kinds and exact values')",
        diagnostics={"column": name, "target": target},
    )


def column_carriers(
    columns: Sequence[Column], carrier: Callable[[Column], Carry | None]
) -> list[tuple[int, str, Carry]]:
    """The ``(index, column, carry)`` of each of ``columns`` that ``carrier`` gives one."""
    found = ((index, column, carrier(column)) for index, column in enumerate(columns))
    return [(index, column.name, carry) for index, column, carry in found if carry is not None]


def carried_chunks(
    chunks: Iterable[Sequence[tuple]],
    carriers: Sequence[tuple[int, str, Carry]],
    *,
    target: str,
    reject: Callable[[tuple, str, Any], None] | None = None,
    spared: Callable[[tuple, int], bool] | None = None,
) -> Iterator[Sequence[tuple]]:
    """``chunks`` with each ``(index, column, carry)`` applied to that column's non-NULL values.

    A column the carrier's ``unchanged(values)`` accepts is left as it is;
    a chunk no carrier changed is passed on as it came. A refused value stops the
    rows with ``ValueUnsupported`` naming the column, never the value; with ``reject``
    (``on_bad_value = "quarantine"``), its row is handed to ``reject(row, column, value)``
    instead and left out, and the other rows go on. A refused value ``spared(row, index)``
    says the target never holds (a merge's deleted row: only its key is used) is NULL.
    """
    if reject is not None or spared is not None:
        yield from _sorted_out(chunks, carriers, target=target, reject=reject, spared=spared)
        return
    for chunk in chunks:
        if not chunk or not carriers:
            yield chunk
            continue
        if len(set(map(len, chunk))) != 1:
            raise PathContractBroken(
                "the source gave rows of different lengths in one chunk; nothing was written",
                diagnostics={"target": target},
            )
        carried: dict[int, list[Any]] = {}  # only the columns a carrier changed
        for index, name, carry in carriers:
            values = list(map(itemgetter(index), chunk))  # one column, not the chunk transposed
            if isinstance(carry, Passing):
                if carry.unchanged(values):
                    continue
                bulk = None if carry.in_bulk is None else carry.in_bulk(values)
                if bulk is not None:
                    carried[index] = bulk
                    continue
            try:
                carried[index] = [None if v is None else carry(v) for v in values]
            except _REFUSED:
                raise _refused(name, target) from None
        if not carried:
            yield chunk
            continue
        columns = [
            carried[index] if index in carried else [row[index] for row in chunk]
            for index in range(len(chunk[0]))
        ]
        yield list(zip(*columns, strict=True))
