"""The stores' batch encoder against the reference: the parser, then ``json.dumps``.

The encoder builds payload text field by field and reuses what the checkpoints
of a batch share. Whatever it is given, it must produce exactly the text of
``json.dumps(checkpoint_to_payload(cp), sort_keys=True, allow_nan=False)`` and
refuse exactly the checkpoints ``checkpoint_from_payload`` refuses.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from dpone_native_transfer import (
    CheckpointPayloadInvalid,
    PartitionCheckpoint,
    RouteKey,
    checkpoint_from_payload,
    checkpoint_to_payload,
)
from dpone_native_transfer.checkpoints import GUARD_DIAGNOSTICS_KEY
from dpone_native_transfer.stores._codec import encode_batch as _encode_batch


def reference(cp: PartitionCheckpoint) -> str:
    payload = checkpoint_to_payload(cp)
    checkpoint_from_payload(payload)  # raises what the reader refuses
    return json.dumps(payload, sort_keys=True, allow_nan=False)


def outcome(action):
    try:
        return action()
    except CheckpointPayloadInvalid as error:
        return ("refused", error.diagnostics.get("field"))


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.sampled_from([1, -1]).map(lambda sign: sign * 10**5000),  # longer than json.dumps writes
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(['quote " and \\ slash', "\x00\x1f", "é€😀", "</script>"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner),  # JSON would read it back as a list: refused
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
        st.dictionaries(st.integers(0, 3), inner, min_size=1, max_size=2),  # non-string keys
    ),
    max_leaves=8,
)
MAPS = st.one_of(
    st.dictionaries(st.text(max_size=6), VALUES, max_size=4),
    st.dictionaries(st.one_of(st.text(max_size=3), st.integers(0, 2)), SCALARS, max_size=3),
    st.sampled_from([[], "not a map", None]),
)
AT = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)
TIMES = st.sampled_from(
    [
        None,
        AT,
        AT.astimezone(timezone(timedelta(hours=5, minutes=30))),  # the same instant, other text
        AT.replace(microsecond=7),
        AT.replace(tzinfo=None),  # naive: refused
    ]
)
TEXTS = st.sampled_from(["run-1", "sha256:" + "a" * 64, "", "ünï", 'q"uote'])
GUARD = {
    "schema_version": "dpone.native_transfer.target_commit_guard.v1",
    "checkpoint_batch_id": "b" * 64,
    "phase": "armed",
    "recovery": "manual_reconciliation_required",
}


@st.composite
def batches(draw) -> list[PartitionCheckpoint]:
    """Checkpoints that share some objects (as a guard batch does) and differ in others."""
    routes = [
        RouteKey("orders", "copy", "incremental_append"),
        RouteKey("orders ü", 'co"py', "full_refresh"),
    ]
    shared_guard = draw(st.sampled_from([GUARD, {**GUARD, "phase": float("inf")}]))
    items = []
    for index in range(draw(st.integers(1, 6))):
        diagnostics = draw(MAPS)
        if isinstance(diagnostics, dict) and draw(st.booleans()):
            diagnostics = {**diagnostics, GUARD_DIAGNOSTICS_KEY: shared_guard}
        cp = PartitionCheckpoint(
            partition_id=f"p-{index}",
            route=draw(st.sampled_from(routes)),
            status=draw(st.sampled_from(["exported", "committed", "failed"])),
            run_id="run-1",
            query_hash=draw(TEXTS),
            schema_hash=draw(TEXTS),
            partition_bounds={"partition": draw(SCALARS)},
            started_at=draw(TIMES),
            completed_at=draw(TIMES),
            rows_exported=draw(st.sampled_from([0, 7, 2**40])),
            diagnostics={},
        )
        # past the constructor's checks, as a buggy caller or a bypass could do
        changes = {"diagnostics": diagnostics}
        if draw(st.integers(0, 5)) == 0:
            changes["rows_exported"] = draw(st.sampled_from([-1, True, 1.5, "3"]))
        if draw(st.integers(0, 5)) == 0:
            changes["partition_bounds"] = draw(MAPS)
        items.append(_bypass(cp, changes))
    return items


def _bypass(cp: PartitionCheckpoint, changes: dict) -> PartitionCheckpoint:
    copy = attrs.evolve(cp)
    for name, value in changes.items():
        object.__setattr__(copy, name, value)
    return copy


@settings(max_examples=400, deadline=None)
@given(batch=batches())
def test_batch_text_is_the_reference_text_and_refusals_match(batch):
    expected = [outcome(lambda cp=cp: reference(cp)) for cp in batch]
    refused = next((e for e in expected if isinstance(e, tuple)), None)
    got = outcome(lambda: [row[-1] for row in _encode_batch(batch)])
    if refused is None:
        assert got == expected
    else:
        assert got == refused  # the first refused checkpoint stops the batch, with its field


def test_equal_instants_with_different_offsets_keep_their_own_text():
    base = PartitionCheckpoint(
        partition_id="p",
        route=RouteKey("orders", "copy", "incremental_append"),
        status="committed",
        run_id="run",
        query_hash="q",
        schema_hash="s",
        started_at=AT,
        completed_at=AT,
    )
    other = attrs.evolve(
        base, partition_id="p2", started_at=AT.astimezone(timezone(timedelta(hours=-3)))
    )
    texts = [row[-1] for row in _encode_batch([base, other])]
    assert json.loads(texts[0])["started_at"] == "2026-03-01T12:30:00+00:00"
    assert json.loads(texts[1])["started_at"] == "2026-03-01T09:30:00-03:00"
