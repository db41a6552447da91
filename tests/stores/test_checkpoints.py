"""The checkpoint payload codec: strict, fail-closed parsing and exact round trips."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import attrs
import pytest

from dpone_native_transfer import (
    CheckpointPayloadInvalid,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    TargetMutation,
    checkpoint_from_payload,
    checkpoint_to_payload,
)
from dpone_native_transfer.checkpoints import partition_id_for, sha256_digest

VALID = {
    "partition_id": "p-1",
    "route": {"source_table": "orders", "target_table": "copy", "strategy": "full_refresh"},
    "status": "exported",
    "run_id": "run-1",
    "query_hash": "sha256:" + "1" * 64,
    "schema_hash": "sha256:" + "2" * 64,
    "partition_bounds": {"generation": 0, "partition": None},
    "started_at": "2026-01-01T00:00:00+00:00",
    "completed_at": None,
    "rows_exported": 0,
    "diagnostics": {},
}


def with_field(field, value):
    payload = copy.deepcopy(VALID)
    if value is DELETE:
        del payload[field]
    else:
        payload[field] = value
    return payload


DELETE = object()
BROKEN = [
    ("status", "STATUS", "status"),
    ("status", "unknown", "status"),
    ("run_id", "", "run_id"),
    ("partition_id", 7, "partition_id"),
    ("query_hash", None, "query_hash"),
    ("route", {"source_table": "orders"}, "route"),
    ("route", {"source_table": "", "target_table": "t", "strategy": "full_refresh"}, "route"),
    ("route", {"source_table": "s", "target_table": "t", "strategy": "append"}, "route"),
    ("route", "orders", "route"),
    ("rows_exported", -1, "rows_exported"),
    ("rows_exported", True, "rows_exported"),
    ("rows_exported", 1.5, "rows_exported"),
    ("partition_bounds", [], "partition_bounds"),
    ("diagnostics", {"x": float("nan")}, "diagnostics"),
    ("diagnostics", {"x": {1: "non-string key"}}, "diagnostics"),
    ("diagnostics", {"x": object()}, "diagnostics"),
    ("started_at", "yesterday", "started_at"),
    ("started_at", "2026-01-01T00:00:00", "started_at"),
    ("started_at", "2026-01-01T00:00:00Z", "started_at"),
    ("completed_at", 1767225600, "completed_at"),
    ("diagnostics", DELETE, "diagnostics"),
    ("unexpected", "x", "unexpected"),
]


@pytest.mark.parametrize(("field", "value", "named"), BROKEN)
def test_malformed_payloads_fail_closed_naming_the_field(field, value, named):
    with pytest.raises(CheckpointPayloadInvalid) as info:
        checkpoint_from_payload(with_field(field, value))
    assert info.value.code == "native_transfer_checkpoint_payload_invalid"
    assert info.value.diagnostics["field"] == named


@pytest.mark.parametrize("payload", [None, [], "payload", 3])
def test_a_payload_must_be_an_object(payload):
    with pytest.raises(CheckpointPayloadInvalid):
        checkpoint_from_payload(payload)


def test_a_valid_payload_round_trips_exactly_and_is_copied():
    payload = copy.deepcopy(VALID)
    checkpoint = checkpoint_from_payload(payload)
    assert checkpoint_to_payload(checkpoint) == VALID
    payload["partition_bounds"]["partition"] = "changed"
    assert checkpoint.partition_bounds["partition"] is None, "no aliasing with the input"


def test_deeply_nested_diagnostics_are_refused_not_recursed_forever():
    nested: dict = {}
    for _ in range(100):
        nested = {"n": nested}
    with pytest.raises(CheckpointPayloadInvalid):
        checkpoint_from_payload(with_field("diagnostics", nested))


def test_partition_ids_and_digests_are_deterministic_and_sensitive():
    route = RouteKey("orders", "copy", "incremental_append")
    first = partition_id_for(route, "q", "s", {"partition": "emea"})
    assert first == partition_id_for(route, "q", "s", {"partition": "emea"})
    assert first != partition_id_for(route, "q2", "s", {"partition": "emea"})
    assert first != partition_id_for(route, "q", "s", {"partition": "apac"})
    assert sha256_digest(["a", ["x", "y"]]).startswith("sha256:")
    assert len(sha256_digest("a")) == len("sha256:") + 64


def test_a_route_label_is_one_line_whatever_the_table_names_hold():
    """Labels go into summary lines, task logs and messages: a newline or an escape sequence
    in a table name is shown escaped, never written raw; printable names are unchanged."""
    from dpone_native_transfer import RouteKey

    odd = RouteKey("orders\nINFO forged", "copy\r\x1b[2J\u2028", "full_refresh")
    assert odd.label == "orders\\nINFO forged -> copy\\r\\x1b[2J\\u2028 (full_refresh)"
    assert odd.label.isprintable()
    assert RouteKey("Bestellungen", "zakázky", "full_refresh").label == (
        "Bestellungen -> zakázky (full_refresh)"
    )


@pytest.mark.parametrize("status", list(PartitionCheckpointStatus))
def test_a_mutation_batch_is_attrs_evolve_of_each_candidate_field_by_field(status):
    """``TargetMutation.batch`` spells ``attrs.evolve`` out: a field it forgot fails here."""
    at = datetime(2026, 1, 2, 3, 4, tzinfo=UTC)
    candidate = PartitionCheckpoint(
        partition_id="p-7",
        route=RouteKey("orders", "copy", "incremental_append", "src", "tgt"),
        status="exported",
        run_id="run-7",
        query_hash="sha256:" + "1" * 64,
        schema_hash="sha256:" + "2" * 64,
        partition_bounds={"partition": "region-7"},
        started_at=datetime(2025, 1, 1, tzinfo=UTC),
        completed_at=datetime(2025, 1, 2, tzinfo=UTC),
        rows_exported=7,
        diagnostics={"artifact_sha256": "sha256:" + "3" * 64, "shared": "candidate"},
    )
    defaults = PartitionCheckpoint(
        partition_id="x", route=candidate.route, status="failed", run_id="x", query_hash="",
        schema_hash="",
    )  # fmt: skip
    untouched = {"route", "query_hash", "schema_hash"}  # required, so a dropped one cannot pass
    for field in attrs.fields(PartitionCheckpoint):
        if field.name not in untouched:  # the candidate tells a dropped field from its default
            assert getattr(candidate, field.name) != getattr(defaults, field.name), field.name
    mutation = TargetMutation(
        route=candidate.route,
        run_id="run-7",
        path="staged",
        operation="load",
        candidates=(candidate,),
        store=None,
        clock=lambda: at,
    )
    extra = {"shared": "batch", "guard": {"phase": "armed"}}
    (built,) = mutation.batch(status, at=at, diagnostics=extra)
    expected = attrs.evolve(
        candidate,
        status=status,
        started_at=at,
        completed_at=None if status is PartitionCheckpointStatus.EXPORTED else at,
        diagnostics={**candidate.diagnostics, **extra},
    )
    for field in attrs.fields(PartitionCheckpoint):
        assert getattr(built, field.name) == getattr(expected, field.name), field.name
    assert candidate.diagnostics["shared"] == "candidate"  # the candidate is not changed
