"""Bad guard payloads, tried on purpose: arbitrary JSON-ish values and mutations of a valid
guard in ``diagnostics["target_commit_guard"]`` end in ``MalformedGuard`` /
``TargetCommitGuardInvalid`` or in the one valid decision an independent oracle (the rules
of docs/compatibility.md, in ``helpers.bad_input``) predicts; never another exception,
never target I/O. Checked on ``read_guard``, on the route scan, and end to end on a real
SQLite store (values the store refuses to write, such as NaN, are planted as raw JSON
text, as a foreign writer would).
"""

from __future__ import annotations

import json

import attrs
import pytest
from helpers.bad_input import (
    FOREIGN_ID,
    FUZZ_CANARY,
    GUARD_CASES,
    PROBLEMS,
    ROUTE,
    SINGLE_DAMAGES,
    UNRESOLVED,
    Site,
    checkpoint_with,
    json_safe,
    site,
    status_damages,
    string_leaves,
    valid_guard,
    valid_guards_with_status,
)
from hypothesis import HealthCheck, event, given, settings

from dpone_native_transfer import (
    CheckpointPayloadInvalid,
    ManualReconciliationRequired,
    NativeTransferError,
    PartitionCheckpoint,
    TargetCommitGuardInvalid,
    checkpoint_to_payload,
)
from dpone_native_transfer.testing import assert_rows_exactly_once
from dpone_target_commit_guard import plugin as guard_plugin
from dpone_target_commit_guard.payload import MalformedGuard, read_guard

UNIT_SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, database=None)
STORE_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    # a real SQLite route per example, by design; huge strings are drawn on purpose
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- (a) units: read_guard and the route scan --------------------------------------------------


def test_every_single_damage_of_every_valid_guard_is_malformed_with_its_problem_code():
    checked = 0
    for guard, status in valid_guards_with_status():
        assert read_guard(checkpoint_with(guard, status)) == valid_guard(guard, status)
        cases = [(name, *damage(guard, status), code) for name, damage, code in SINGLE_DAMAGES]
        mismatched = status_damages(guard, status)
        cases += [("status", g, s, "status_phase_mismatch") for g, s in mismatched]
        for name, damaged, damaged_status, problem in cases:
            assert valid_guard(damaged, damaged_status) is None, f"{name} is not a damage"
            with pytest.raises(MalformedGuard) as info:
                read_guard(checkpoint_with(damaged, damaged_status))
            assert info.value.problem == problem, f"{guard['phase']} with {name}"
            checked += 1
    assert checked == 5 * (len(SINGLE_DAMAGES) + 2)


@UNIT_SETTINGS
@given(case=GUARD_CASES)
def test_read_guard_returns_the_oracles_record_or_raises_malformed_guard(case):
    value, status = case
    expected = valid_guard(value, status)
    event("valid guard" if expected else "malformed guard")
    try:
        record = read_guard(checkpoint_with(value, status))
    except MalformedGuard as malformed:
        assert expected is None, f"a valid {expected.phase} guard was refused as {malformed}"
        assert malformed.problem in PROBLEMS
    else:
        assert expected is not None, f"an invalid guard was accepted as {record}"
        assert record == expected


@UNIT_SETTINGS
@given(case=GUARD_CASES)
def test_route_scan_decides_as_the_oracle_and_echoes_no_guard_text(case):
    value, status = case
    checkpoint = checkpoint_with(value, status)
    expected = valid_guard(value, status)
    try:
        decided = guard_plugin.resume_route_scan(ROUTE, [checkpoint], None)
    except TargetCommitGuardInvalid as error:
        assert expected is None
        assert error.diagnostics["partitions"][0]["problem"] in PROBLEMS
        outputs = str(error) + json.dumps(error.diagnostics)
    except ManualReconciliationRequired as error:
        assert expected is not None and expected.phase.value in UNRESOLVED
        assert error.diagnostics["batch_ids"] == [expected.batch_id]
        outputs = str(error) + json.dumps(error.diagnostics)
    else:
        assert decided is True
        assert expected is not None and expected.phase.value not in UNRESOLVED
        outputs = ""
    assert FUZZ_CANARY not in outputs, "guard text was echoed into an error"
    long_strings = [s for s in string_leaves(value) if len(s) > 80]
    assert not any(s in outputs for s in long_strings)


# -- (b) end to end on a real SQLite store ---------------------------------------------------------


@STORE_SETTINGS
@given(case=GUARD_CASES)
def test_a_fuzzed_guard_in_a_real_store_blocks_fails_closed_or_runs_as_the_oracle_says(case):
    value, status = case
    foreign = checkpoint_with(value, status)
    with site() as s:
        try:
            s.store.upsert(foreign)
            refused = False
        except CheckpointPayloadInvalid:
            refused = True
            plant_raw_payload(s, foreign)
        assert refused == (not json_safe(value)), "the store's write check disagrees with JSON"

        outcome, sink = s.attempt()
        expected = valid_guard(value, status)
        event(f"outcome: {type(outcome).__name__}")
        if refused:
            assert isinstance(outcome, CheckpointPayloadInvalid), repr(outcome)
            assert outcome.diagnostics["partition_id"] == FOREIGN_ID
        elif expected is None:
            assert isinstance(outcome, TargetCommitGuardInvalid), repr(outcome)
        elif expected.phase.value in UNRESOLVED:
            assert isinstance(outcome, ManualReconciliationRequired), repr(outcome)
        else:
            assert not isinstance(outcome, Exception), f"a resolved guard stopped it: {outcome!r}"
            assert sink.target_calls == 1
            assert_rows_exactly_once(s.source_ids(), s.target_ids())
            # planted like a release without locations wrote it; the run adopted it unchanged
            adopted = {cp.partition_id: cp for cp in s.store.list_latest(s.route)}[FOREIGN_ID]
            assert adopted == attrs.evolve(foreign, route=s.route)
            return
        assert sink.target_calls == 0, "the target was called although the run raised"
        assert s.target_ids() == []
        if isinstance(outcome, NativeTransferError):
            assert FUZZ_CANARY not in str(outcome) + json.dumps(outcome.diagnostics)


def plant_raw_payload(s: Site, checkpoint: PartitionCheckpoint) -> None:
    """Write the payload as JSON text (NaN and all) straight into the store's tables."""
    placeholder = attrs.evolve(checkpoint, diagnostics={})
    s.store.upsert(placeholder)
    text = json.dumps(checkpoint_to_payload(checkpoint), sort_keys=True)  # allow_nan: NaN, Infinity
    for table in ("checkpoint_latest", "checkpoint_history"):
        s.sql(f"UPDATE {table} SET payload = ? WHERE partition_id = ?", (text, FOREIGN_ID))


def test_a_diagnostic_integer_too_long_for_json_is_refused_as_payload_invalid(tmp_path):
    """Python cannot print a 5,000-digit int as JSON; the store must refuse it with its code.

    Today the write raises a bare ValueError from ``json.dumps`` instead of
    ``CheckpointPayloadInvalid``, though ``checkpoint_from_payload`` accepts
    the value: writer and reader disagree about what a valid payload is.
    """
    with site(tmp_path) as s:
        huge = checkpoint_with(10**5000, "failed")
        with pytest.raises(CheckpointPayloadInvalid) as info:
            s.store.upsert(huge)
        assert info.value.diagnostics["field"] == "diagnostics"
        assert s.store.list_latest(ROUTE) == [] and s.store.list_latest(s.route) == []
