"""What the runtime gives engine sinks: JSON-lines artifacts and neutral column kinds."""

from __future__ import annotations

import datetime
import decimal
import io
import json
from pathlib import Path

import pytest

from dpone_native_transfer import ArtifactInvalid, ConfigInvalid
from dpone_native_transfer.artifacts import file_sha256, write_jsonl
from dpone_native_transfer.config import route_config_from_mapping
from dpone_native_transfer.payloads import bound_predicates, column_affinity

NAMES = ["id", "name", "at", "amount", "day", "flag", "ratio"]


def test_jsonl_rows_are_objects_keyed_by_column_with_exact_text_for_dates_and_decimals(tmp_path):
    rows = [
        (
            1,
            "naïve \u2028 line",
            datetime.datetime(2026, 1, 2, 3, 4, 5, 600000),
            decimal.Decimal("12345678901234567890.12"),
            datetime.date(2026, 1, 2),
            True,
            0.1,
        ),
        (2, None, None, None, None, False, -2.5),
    ]
    path = tmp_path / "p.jsonl"
    with open(path, "wb") as handle:
        count, digest = write_jsonl(handle, NAMES, [rows[:1], [], rows[1:]])
    assert count == 2
    assert digest == file_sha256(path)
    lines = path.read_text(encoding="utf-8").split("\n")[:-1]  # \u2028 is not a line break here
    assert [json.loads(line) for line in lines] == [
        {
            "id": 1,
            "name": "naïve \u2028 line",
            "at": "2026-01-02T03:04:05.600000",
            "amount": "12345678901234567890.12",
            "day": "2026-01-02",
            "flag": True,
            "ratio": 0.1,
        },
        {
            "id": 2,
            "name": None,
            "at": None,
            "amount": None,
            "day": None,
            "flag": False,
            "ratio": -2.5,
        },
    ]


@pytest.mark.parametrize(
    "value", [b"\x00secret-bytes", float("nan"), float("inf"), decimal.Decimal("NaN"), object()]
)
def test_a_value_jsonl_cannot_carry_stops_the_export_naming_no_value(value):
    with pytest.raises(ArtifactInvalid) as info:
        write_jsonl(io.BytesIO(), ["id", "secret"], [[(1, value)]])
    assert info.value.diagnostics == {"columns": ["id", "secret"], "format": "jsonl"}
    assert "secret-bytes" not in str(info.value)


def test_a_row_of_the_wrong_width_is_refused():
    with pytest.raises(ArtifactInvalid):
        write_jsonl(io.BytesIO(), ["id", "name"], [[(1,)]])


@pytest.mark.parametrize(
    ("decltype", "kind"),
    [
        ("INTEGER", "integer"),
        ("bigint", "integer"),
        ("bigserial", "integer"),
        ("VARCHAR(20)", "text"),
        ("character varying", "text"),
        ("uuid", "text"),
        ("jsonb", "text"),
        ("BLOB", "blob"),
        ("bytea", "blob"),
        ("", "blob"),
        ("REAL", "real"),
        ("double precision", "real"),
        ("boolean", "boolean"),
        ("timestamp with time zone", "timestamp"),
        ("DATETIME", "timestamp"),
        ("date", "date"),
        ("NUMERIC(12,2)", "numeric"),
    ],
)
def test_column_affinity_follows_sqlite_rules_and_common_postgres_names(decltype, kind):
    assert column_affinity(decltype) == kind


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
