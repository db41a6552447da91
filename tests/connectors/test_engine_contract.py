"""What the runtime gives engine sinks: neutral column kinds and exact value carriers."""

from __future__ import annotations

import contextlib
import decimal
import math
import sqlite3
from pathlib import Path

import pyarrow.compute  # noqa: F401  (loaded: a few values are carried in bulk too)
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpone_native_transfer import Column, ConfigInvalid, PathContractBroken, ValueUnsupported
from dpone_native_transfer.column_types import (
    as_boolean,
    as_double,
    carried_chunks,
    exact_bytes,
    exact_decimal,
    exact_integer,
    exact_text,
    finite_double,
    instant_as_utc,
    instant_as_utc_or_infinite,
    iso_date,
    iso_date_or_infinite,
    iso_time,
    postgres_kind,
    sqlite_kind,
    utc_instant,
)
from dpone_native_transfer.config import route_config_from_mapping
from dpone_native_transfer.connectors.sqlite import SQLiteSource
from dpone_native_transfer.connectors.sqlite_reading import held_as_declared, refuse_inexact_plan
from dpone_native_transfer.payloads import bound_predicates


@pytest.mark.parametrize(
    ("decltype", "kind"),
    [
        ("INTEGER", "integer"),
        ("bigint", "integer"),
        ("INTERVAL", "integer"),  # SQLite's rule: any type name holding INT
        ("VARCHAR(20)", "text"),
        ("uuid", "any"),  # NUMERIC affinity in SQLite: text or numbers
        ("JSON", "any"),
        ("BLOB", "blob"),
        ("", "any"),
        ("REAL", "real"),
        ("double precision", "real"),
        ("boolean", "boolean"),
        ("timestamp with time zone", "timestamptz"),
        ("DATETIME", "timestamp"),
        ("date", "date"),
        ("TIME", "time"),
        ("NUMERIC(12,2)", "numeric"),
        ("MONEY", "numeric"),
    ],
)
def test_sqlite_kinds_follow_sqlite_affinity_rules_and_common_names(decltype, kind):
    assert sqlite_kind(decltype) == kind
    assert Column("c", decltype).kind == kind  # the default of a source that names no kind


@pytest.mark.parametrize(
    ("format_type", "kind"),
    [
        ("smallint", "integer"),
        ("bigint", "integer"),
        ("numeric", "decimal"),
        ("numeric(12,2)", "decimal"),
        ("double precision", "real"),
        ("interval", "interval"),  # not "INT": the defect of the substring rule
        ("time without time zone", "time"),
        ("time with time zone", "text"),
        ("timestamp without time zone", "timestamp"),
        ("timestamp with time zone", "timestamptz"),
        ("bytea", "blob"),
        ("uuid", "text"),
        ("jsonb", "text"),
        ("integer[]", "text"),
        ("character varying(20)", "text"),
    ],
)
def test_postgres_kinds_come_from_the_type_name_not_a_substring(format_type, kind):
    assert postgres_kind(format_type) == kind


@pytest.mark.parametrize(
    ("carry", "value", "expected"),
    [
        (exact_decimal(12, 2), 1.1, "1.1"),
        (exact_decimal(12, 2), "1.10", "1.10"),
        (exact_decimal(12, 2), 7, "7"),
        (exact_decimal(12, 2), "9999999999.99", "9999999999.99"),
        # the type's highest value, 38 digits: abs() rounded it to 28 and refused it
        (exact_decimal(38, 10), "9" * 28 + ".9999999999", "9" * 28 + ".9999999999"),
        (exact_decimal(38, 10), "-" + "9" * 28 + ".9999999999", "-" + "9" * 28 + ".9999999999"),
        (as_boolean, 1, True),
        (as_boolean, 0, False),
        (as_boolean, False, False),  # a PostgreSQL boolean
        (as_double, 2**53, float(2**53)),
        (instant_as_utc, "2024-01-05 10:00:00+02:00", "2024-01-05 08:00:00"),
        (instant_as_utc, "2024-01-05T23:30:00.5-01:00", "2024-01-06 00:30:00.500000"),
        (instant_as_utc, "2024-01-05 10:00:00", "2024-01-05 10:00:00"),
        (instant_as_utc_or_infinite, "infinity", "infinity"),
        (utc_instant, "2024-01-05 10:00:00", "2024-01-05 10:00:00+00:00"),
        (iso_date, "2024-02-29", "2024-02-29"),
        (iso_time, "23:59:59.5", "23:59:59.5"),
        (exact_bytes, "A", b"A"),
    ],
)
def test_carriers_keep_the_value(carry, value, expected):
    assert carry(value) == expected


@pytest.mark.parametrize(
    ("carry", "value"),
    [
        (exact_decimal(12, 2), 99.999),  # would round to 100.00
        (exact_decimal(12, 2), "10000000000"),  # 11 digits before the point
        (exact_decimal(38, 10), "1" + "0" * 28),  # 29 digits before the point
        # a whole real into DECIMAL(p,0): 18446744073709551615 stored as a REAL was loaded
        # as 18446744073709552000, neither the source's text nor the stored value
        (exact_decimal(20, 0), 1.8446744073709552e19),
        (exact_decimal(12, 2), "NaN"),
        (exact_decimal(12, 2), True),
        (as_boolean, "yes"),
        (as_boolean, 1.5),
        (as_boolean, "true"),  # loaded as true, where lazy-plan's reader refused it
        (as_boolean, 2),  # loaded as true: another value
        (as_boolean, 1.0),
        (exact_text, 3.5),  # an untyped column's number: loaded as the text '3.5'
        (as_double, 2**53 + 1),
        (as_double, "1.5"),
        (finite_double, math.nan),
        (instant_as_utc, 1704448800),
        (instant_as_utc, "infinity"),
        (instant_as_utc, "2016-12-31 23:59:60"),
        (instant_as_utc, "0001-01-01 00:30:00+01:00"),
        (iso_date, "2024-02-30"),
        (iso_date, "0044-03-15 BC"),
        (iso_time, "10:00:00+02:00"),
        # Python's fromisoformat takes these; each engine read them its own way (NULL, the
        # date alone, a failure inside the target call)
        (instant_as_utc, "2020-01-01 10:00"),
        (instant_as_utc, "2020-01-01x10:00:00"),
        (instant_as_utc, "2020-01-01t10:00:00"),
        (instant_as_utc, "2020-01-01 10:00:00,5"),
        (instant_as_utc, "20200101T100000"),
        # fromisoformat took these offsets as 99, 75 and 60 minutes: an invented instant
        (instant_as_utc, "2024-01-05 10:00:00+00:99"),
        (instant_as_utc, "2024-01-05T10:00:00+00:75"),
        (instant_as_utc, "2024-01-05 10:00:00+00:60"),
        (instant_as_utc, "2020-W01-1"),
        (instant_as_utc, "2020-01-01 10:00:00\x00+05:00"),
        (iso_time, "10:00:00,5"),
        (iso_time, "T10:00:00"),
        (exact_integer, 1.5),
        (exact_integer, True),
        (exact_text, b"x"),
        (exact_decimal(12, 2), "1_000"),
    ],
)
def test_carriers_refuse_what_they_cannot_keep_and_the_error_names_only_the_column(carry, value):
    chunks = carried_chunks([[(1, value)]], [(1, "secret_col", carry)], target="DuckDB")
    with pytest.raises(ValueUnsupported) as info:
        list(chunks)
    assert info.value.diagnostics == {"column": "secret_col", "target": "DuckDB"}
    assert repr(value) not in str(info.value)


def test_carried_chunks_leave_nulls_and_other_columns_alone():
    chunks = [[(1, None, "2024-01-05 10:00:00+01:00"), (2, "x", None)], []]
    carried = list(carried_chunks(chunks, [(2, "at", instant_as_utc)], target="DuckDB"))
    assert carried == [[(1, None, "2024-01-05 09:00:00"), (2, "x", None)], []]


def test_bound_predicates_name_null_partitions_and_cursor_windows():
    predicates = bound_predicates(
        {"partition": None, "cursor_after": 5, "cursor_upto": 9},
        partition_column="region",
        cursor_column="updated_at",
    )
    assert [(p.column, p.op, p.value) for p in predicates] == [
        ("region", "IS NULL", None),
        ("updated_at", ">", 5),
        ("updated_at", "<=", 9),
    ]
    with pytest.raises(ConfigInvalid):
        bound_predicates({"cursor_upto": 9}, partition_column="region", cursor_column=None)
    with pytest.raises(ConfigInvalid):
        bound_predicates(
            {"partition": 1, "cursor_upto": 9}, partition_column="r", cursor_column=None
        )


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({"source": {}, 7: {}}, None),
        ({"store": {"path": "c.db"}}, "source"),
        (
            {
                "source": {"path": "s.db", "table": "t", "partition_column": "p"},
                "target": {"path": "t.db", "table": "u"},
                "transfer": {"strategy": "incremental_append", "path": "nowhere"},
                "store": {"path": "c.db"},
            },
            "transfer.path",
        ),
    ],
)
def test_a_route_mapping_is_validated_like_a_route_file(tmp_path: Path, document, key):
    with pytest.raises(ConfigInvalid) as info:
        route_config_from_mapping(document, base_dir=tmp_path)
    assert info.value.diagnostics.get("key") == key
    with pytest.raises(ConfigInvalid):
        route_config_from_mapping(["not", "a", "mapping"])  # type: ignore[arg-type]


def test_carried_chunks_refuse_rows_of_different_lengths():
    """A ragged chunk from a source is a coded error, never zip's ValueError or cut rows."""
    chunks = carried_chunks([[(1, "a"), (2,)]], [(0, "id", exact_integer)], target="DuckDB")
    with pytest.raises(PathContractBroken) as caught:
        list(chunks)
    assert caught.value.diagnostics == {"target": "DuckDB"}


@pytest.mark.parametrize(
    ("stored", "refused"),
    [
        ([1.5, 2, -(2**53), 2**53 + 1], False),  # REAL affinity stores each as a double
        ([1.5, "x"], True),  # text in a REAL column
        ([None, b"\x00"], True),
    ],
)
def test_a_lazy_plan_is_refused_for_a_value_its_engine_reads_otherwise(tmp_path, stored, refused):
    path = tmp_path / "src.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, r REAL)")
        db.executemany("INSERT INTO t (r) VALUES (?)", [(value,) for value in stored])
        db.commit()
    source = SQLiteSource(path, "t", "id")
    columns = source.describe().columns
    if not refused:
        refuse_inexact_plan(source, columns, engine="DuckDB", table="copy")
        return
    with pytest.raises(ConfigInvalid) as caught:
        refuse_inexact_plan(source, columns, engine="DuckDB", table="copy")
    assert caught.value.diagnostics["columns"] == ["r"]


class Traced(SQLiteSource):
    """The real source; every statement its connections run is kept in ``statements``."""

    statements: list[str]

    def _open(self) -> sqlite3.Connection:
        conn = super()._open()
        conn.set_trace_callback(self.statements.append)
        return conn


@pytest.mark.parametrize(
    ("script", "held"),
    [
        ("CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER, w TEXT)", {"id"}),
        ("CREATE TABLE t (id integer, v INTEGER, PRIMARY KEY (id DESC))", {"id"}),
        # SQLite's quirk: this key is an ordinary column with an index, not the rowid
        ("CREATE TABLE t (id INTEGER PRIMARY KEY DESC, v INTEGER)", set()),
        ("CREATE TABLE t (id INT PRIMARY KEY, v INTEGER)", set()),
        ("CREATE TABLE t (id INTEGER, v TEXT, PRIMARY KEY (id, v))", set()),
        (
            "CREATE TABLE t (id INTEGER, v TEXT, w ANY, x REAL, y BLOB) STRICT",
            {"id", "v", "x", "y"},
        ),
        ("CREATE TABLE b (id INTEGER PRIMARY KEY); CREATE VIEW t AS SELECT id FROM b", None),
        ("CREATE VIRTUAL TABLE t USING fts5(v)", None),
    ],
    ids=[
        "rowid",
        "rowid-desc-constraint",
        "desc-quirk",
        "int",
        "composite",
        "strict",
        "view",
        "virtual",
    ],
)
def testheld_as_declared_names_what_sqlite_itself_keeps_to_its_type(tmp_path, script, held):
    with contextlib.closing(sqlite3.connect(tmp_path / "src.db")) as db:
        db.executescript(script)
        assert held_as_declared(db, "t") == held


@pytest.mark.parametrize(
    ("script", "refuses", "scans"),
    [
        ("CREATE TABLE t (id INTEGER PRIMARY KEY, r REAL)", (), True),
        ("CREATE TABLE t (id INTEGER PRIMARY KEY, r REAL) STRICT", (), False),
        ("CREATE TABLE t (id INTEGER PRIMARY KEY, r REAL)", ("r",), False),
        ("CREATE TABLE t (id INTEGER PRIMARY KEY DESC, r REAL)", ("r",), True),
        (
            "CREATE TABLE b (id INTEGER PRIMARY KEY, r REAL);CREATE VIEW t AS SELECT id, r FROM b",
            ("id", "r"),
            True,
        ),
    ],
    ids=["table", "strict", "refused-by-reader", "desc-quirk", "view"],
)
def test_the_misread_read_skips_what_sqlite_or_the_reader_keeps_exact(
    tmp_path, script, refuses, scans
):
    """No read of the rows when every column is held to its type by SQLite or refused by the
    engine's reader when misread; a view's columns are always read."""
    path = tmp_path / "src.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(script)
    source = Traced(path, "t", "id")
    source.statements = []
    columns = source.describe().columns
    source.statements = []
    refuse_inexact_plan(source, columns, engine="DuckDB", table="copy", reader_refuses=refuses)
    assert any("SELECT EXISTS" in sql for sql in source.statements) == scans


_DIGITS = st.text("0123456789", min_size=1, max_size=4)
_INSTANT_PARTS = st.tuples(
    st.sampled_from(["2024", "0001", "0000", "9999", "1970", "10000", "2024"]),
    st.sampled_from(["-02-29", "-02-30", "-01-05", "-12-31", "-13-01", "-1-05", "-01-05T"]),
    st.sampled_from(["", " ", "T", "t", "  "]),
    st.sampled_from(["", "00:00:00", "23:59:59", "24:00:00", "10:00:60", "10:00", "9:00:00"]),
    st.sampled_from(["", ".5", ".123456", ".1234567", ",5", "."]),
    st.sampled_from(
        [
            "",
            "Z",
            "z",
            "+00:00",
            "-00:00",
            "+05:30",
            "-08:00",
            "+23:59",
            "+24:00",
            "+05",
            "+0530",
            "+05:60",
            "-12:00:30",
            " UTC",
            "+5:30",
        ]
    ),  # fmt: skip
)


def _per_value(carry, values):
    """What the carrier gives each value, or None when it refuses one."""
    try:
        return [None if value is None else carry.convert(value) for value in values]
    except (ValueError, TypeError, OverflowError, decimal.InvalidOperation):
        return None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.none(),
            _INSTANT_PARTS.map("".join),
            st.sampled_from(["infinity", "-infinity", "junk", ""]),
            st.text(max_size=12),
            st.integers(),
        ),
        max_size=6,
    )
)
def test_instants_carried_in_bulk_are_what_each_value_gives_or_left_to_it(values):
    """Issue 47 item 4: a column of instants carried at C speed gives exactly the text the
    carrier gives each value (so every path stores the same value), and gives up, leaving the
    values to the carrier, where one is refused or of a form it does not know."""
    for carry in (instant_as_utc, instant_as_utc_or_infinite, utc_instant):
        bulk = carry.in_bulk(values)
        expected = _per_value(carry, values)
        if bulk is not None:
            assert bulk == expected
    offsets = [f"2024-01-05 10:00:00{o}" for o in ("+05:30", "-08:00", "Z", "+00", "")]
    assert utc_instant.in_bulk(offsets) == _per_value(utc_instant, offsets)  # never gives up


def test_carried_chunks_carry_offsets_in_bulk_and_still_refuse_one_bad_value():
    chunks = [[(1, "2024-01-05T10:00:00+05:30"), (2, "2024-01-05 10:00:00.5-08:00")]]
    carried = list(carried_chunks(chunks, [(1, "at", utc_instant)], target="DuckDB"))
    assert carried == [[(1, "2024-01-05 04:30:00+00:00"), (2, "2024-01-05 18:00:00.500000+00:00")]]
    bad = [[(1, "2024-01-05T10:00:00+05:30"), (2, "0001-01-01 00:30:00+01:00")]]
    with pytest.raises(ValueUnsupported):
        list(carried_chunks(bad, [(1, "at", utc_instant)], target="DuckDB"))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.tuples(
                st.sampled_from(["2024", "0001", "0000", "1900", "9999", "024", "２０２４"]),
                st.sampled_from(["-02-29", "-02-30", "-01-05", "-13-01", "-1-05", "-12-31"]),
                st.sampled_from(["", " ", "T00:00", "Z", " BC"]),
            ).map("".join),
            st.sampled_from(["infinity", "-infinity", "2023-02-29", ""]),
            st.integers(),
        ),
        max_size=6,
    )
)
def test_dates_kept_in_bulk_are_exactly_the_columns_each_value_would_keep(values):
    """A column of dates checked at C speed is left as it is only when the carrier keeps
    every value as it is; otherwise each value is carried (and refused) as before."""
    for carry in (iso_date, iso_date_or_infinite):
        if carry.unchanged(values):
            assert _per_value(carry, values) == values
    dates = ["2024-02-29", None, "0001-01-01", "9999-12-31"]
    assert iso_date.unchanged(dates) and not iso_date.unchanged(["0000-01-01"])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([(12, 2), (5, 0), (3, 3), (38, 10), (1, 0)]),
    st.one_of(
        st.lists(st.one_of(st.none(), st.integers(), st.floats()), max_size=6),
        st.lists(
            st.one_of(
                st.none(),
                st.from_regex(r"-?[0-9]{1,8}(\.[0-9]{0,6})?", fullmatch=True),
                st.sampled_from(["-0", "0.00", "007", "+1", ".5", "1e3", "NaN", ""]),
            ),
            max_size=6,
        ),
    ),
)
def test_decimals_carried_in_bulk_are_what_each_value_gives_or_left_to_it(declared, values):
    """Issue 47 item 4: a column of decimals (SQLite's ints and floats, or PostgreSQL's
    texts) carried at C speed gives exactly the texts ``exact_decimal`` gives each value,
    and gives up where one is refused or of another form."""
    carry = exact_decimal(*declared)
    bulk = carry.in_bulk(values)
    if bulk is not None:
        assert bulk == _per_value(carry, values)


def test_a_column_of_plain_decimals_is_carried_in_bulk():
    values = [1.1, -7, None, 0.5, 12, -0.0, 10**9] * 200
    assert exact_decimal(12, 2).in_bulk(values) == _per_value(exact_decimal(12, 2), values)
    assert exact_decimal(12, 2).in_bulk([*values, 99.999]) is None  # then refused per value


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.sampled_from([0, 1, 2, -1, True, False, 1.0, "1"])),
                max_size=8))  # fmt: skip
def test_booleans_carried_in_bulk_are_what_each_value_gives_or_left_to_it(values):
    bulk = as_boolean.in_bulk(values)
    if bulk is not None:
        assert bulk == _per_value(as_boolean, values)
    assert as_boolean.in_bulk([0, 1, None]) == [False, True, None]
