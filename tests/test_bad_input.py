"""Bad input, tried on purpose: fuzzed guard payloads, corrupt stores, planted secrets.

- Guard payloads: arbitrary JSON-ish values and mutations of a valid guard in
  ``diagnostics["target_commit_guard"]`` end in ``MalformedGuard`` /
  ``TargetCommitGuardInvalid`` or in the one valid decision an independent
  oracle (the rules of docs/compatibility.md) predicts; never another
  exception, never target I/O. Checked on ``read_guard``, on the route scan,
  and end to end on a real SQLite store (values the store refuses to write,
  such as NaN, are planted as raw JSON text, as a foreign writer would).
- Corrupt stores: rows that are not JSON, or not checkpoints, a truncated
  file, a garbage file, a store that raises on read: a stable error code (or
  the injected object itself), and the target is never called, although a
  healthy store would have called it.
- Secrets: canaries planted in row values, in the sink's and the store's
  exception messages and in the folder of every file; then every output of
  the Python API and the CLI (errors, diagnostics, events, log records,
  stdout/stderr of ``run`` and ``guard scan|show|resolve``) and the bytes of
  the store are searched.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers.routes import Route, write_route
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from dpone_native_transfer import (
    CheckpointPayloadInvalid,
    CheckpointStoreCorrupt,
    ManualReconciliationRequired,
    NativeTransferError,
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    SQLiteCheckpointStore,
    SQLiteSink,
    TargetCommitGuardInvalid,
    TransferRuntime,
    TransferSpec,
    checkpoint_to_payload,
    cli,
)
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.identity import route_key
from dpone_native_transfer.testing import (
    FaultyStore,
    RecordingSink,
    StepClock,
    assert_rows_exactly_once,
    build_sample_source,
    phase_batch,
)
from dpone_target_commit_guard import plugin as guard_plugin
from dpone_target_commit_guard.payload import (
    GuardPhase,
    GuardRecord,
    MalformedGuard,
    build_guard,
    read_guard,
)

SCRIPT = str(Path(sys.executable).parent / "dpone-transfer")
ROUTE = RouteKey("orders", "orders_copy", "incremental_append")
GUARD_KEY = "target_commit_guard"
FOREIGN_ID = "p-fuzzed-checkpoint"

# The v1 contract, restated from docs/compatibility.md (the oracle does not import it).
SCHEMA_V1 = "dpone.native_transfer.target_commit_guard.v1"
RECOVERY = "manual_reconciliation_required"
GUARD_KEYS = ("schema_version", "checkpoint_batch_id", "phase", "recovery")
PHASE_STATUS = {
    "armed": "exported",
    "failed_before_target": "failed",
    "checkpoint_committed": "committed",
    "checkpoint_incomplete": "failed",
    "target_outcome_unknown": "failed",
}
UNRESOLVED = {"armed", "checkpoint_incomplete", "target_outcome_unknown"}
PROBLEMS = {
    "not_an_object",
    "unknown_schema_version",
    "unexpected_keys",
    "invalid_batch_id",
    "invalid_recovery",
    "unsupported_phase",
    "status_phase_mismatch",
}
HEX = "0123456789abcdef"
FUZZ_CANARY = "CANARY-GUARD-VALUE"

UNIT_SETTINGS = settings(max_examples=400, deadline=None, derandomize=True, database=None)
STORE_SETTINGS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    # a real SQLite route per example, by design; huge strings are drawn on purpose
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# -- the oracle ---------------------------------------------------------------------------


def valid_guard(value: Any, status: str) -> GuardRecord | None:
    """The decision docs/compatibility.md prescribes: a record for a valid v1 guard, else None."""
    if not isinstance(value, dict) or sorted(value) != sorted(GUARD_KEYS):
        return None
    batch_id, phase = value["checkpoint_batch_id"], value["phase"]
    checks = (
        isinstance(value["schema_version"], str) and value["schema_version"] == SCHEMA_V1,
        isinstance(value["recovery"], str) and value["recovery"] == RECOVERY,
        isinstance(batch_id, str)
        and len(batch_id) == len("sha256:") + 64
        and batch_id.startswith("sha256:")
        and all(char in HEX for char in batch_id[len("sha256:") :]),
        isinstance(phase, str) and PHASE_STATUS.get(phase) == status,
    )
    return GuardRecord(GuardPhase(phase), batch_id) if all(checks) else None


def json_safe(value: Any, level: int = 0) -> bool:
    """What the store can write: finite numbers, str keys, at most 32 levels under the guard."""
    if level >= 32:
        return False
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(json_safe(item, level + 1) for item in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and json_safe(v, level + 1) for k, v in value.items())
    return value is None or isinstance(value, (bool, int, str))


def string_leaves(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from string_leaves(item)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from string_leaves(item)


# -- strategies ----------------------------------------------------------------------------

TRICKY_TEXT = st.sampled_from(
    [
        "",
        " ",
        "armed",
        "ARMED",
        "Armed",
        "armed\n",
        " armed",
        "\u0430rmed",  # Cyrillic a
        "checkpoint-committed",
        "failed_before_target\x00",
        SCHEMA_V1.upper(),
        SCHEMA_V1 + " ",
        SCHEMA_V1.replace("v1", "v2"),
        "sha256:" + "0" * 64,
        "sha256:" + "A" * 64,
        "sha256:" + "0" * 63,
        "sha256:" + "0" * 64 + "\n",
        "SHA256:" + "0" * 64,
        "sha256:" + "\u0661" * 64,  # Arabic-Indic digit one
        "\ud800",  # a lone surrogate
        "\U0001f4a5" * 3,
        RECOVERY.upper(),
        "NaN",
        FUZZ_CANARY,
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=10**18, max_value=10**4000),  # huge, still printable as JSON
    st.floats(),  # NaN and +/-inf included
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), max_size=12),
    TRICKY_TEXT,
    st.builds(lambda char, size: char * size, st.characters(), st.integers(1_000, 200_000)),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.text(max_size=12) | st.sampled_from(GUARD_KEYS), children, max_size=5)
    ),
    max_leaves=12,
)
DEEP = st.builds(
    lambda depth, leaf: _nest(depth, leaf), st.integers(28, 40), st.sampled_from([[], {}, 1, "x"])
)


def _nest(depth: int, leaf: Any) -> Any:
    for level in range(depth):
        leaf = [leaf] if level % 2 else {"k": leaf}
    return leaf


STATUSES = st.sampled_from([status.value for status in PartitionCheckpointStatus])
BATCH_IDS = st.text(HEX, min_size=64, max_size=64).map(lambda digits: "sha256:" + digits)
BATCH_ID_DAMAGE = [
    str.upper,
    lambda b: b[:7] + b[7:].upper(),  # upper-case hex digits only
    lambda b: b[:-1],
    lambda b: b + "0",
    lambda b: b + "\n",
    lambda b: b.replace("sha256:", "SHA256:"),
    lambda b: b.replace("sha256:", "sha-256:"),
    lambda b: b.replace("sha256:", ""),
    lambda b: b[:-1] + "\u0663",
    lambda b: b[:-1] + "g",
    lambda b: " " + b,
]
PHASE_DAMAGE = [
    str.upper,
    str.title,
    str.swapcase,
    lambda p: p.replace("_", "-") if "_" in p else "-" + p,
    lambda p: p + "\n",
    lambda p: p.translate(str.maketrans("aceo", "\u0430\u0441\u0435\u043e")),  # Cyrillic
]
MUTATIONS = (
    "drop_key",
    "add_key",
    "retype",
    "phase_case",
    "batch_id",
    "schema_version",
    "status",
    "recovery",
    "plant_canary",
    "wrap",
)


@st.composite
def mutated_guards(draw) -> tuple[Any, str]:
    """A valid guard (and its status), then 0-3 mutations; 0 keeps it valid."""
    phase = draw(st.sampled_from(sorted(PHASE_STATUS)))
    guard: Any = build_guard(GuardPhase(phase), draw(BATCH_IDS))
    status = PHASE_STATUS[phase]
    for mutation in draw(st.lists(st.sampled_from(MUTATIONS), max_size=3)):
        if mutation == "status":
            status = draw(STATUSES.filter(lambda s, current=status: s != current))
        elif mutation == "wrap":
            guard = draw(st.sampled_from([[guard], {GUARD_KEY: guard}, json.dumps(guard)]))
        elif isinstance(guard, dict):
            guard = _mutate(draw, mutation, dict(guard))
    return guard, status


def _mutate(draw, mutation: str, guard: dict[str, Any]) -> dict[str, Any]:
    keys = sorted(guard)
    if mutation == "drop_key" and keys:
        del guard[draw(st.sampled_from(keys))]
    elif mutation == "add_key":
        name = draw(st.sampled_from(["retryable", "Phase", "phase ", "note"]) | st.text(max_size=8))
        guard[name] = draw(JSON_VALUES)
    elif mutation == "retype" and keys:
        guard[draw(st.sampled_from(keys))] = draw(JSON_VALUES)
    elif mutation == "phase_case" and isinstance(guard.get("phase"), str):
        guard["phase"] = draw(st.sampled_from(PHASE_DAMAGE))(guard["phase"])
    elif mutation == "batch_id" and isinstance(guard.get("checkpoint_batch_id"), str):
        damage = draw(st.sampled_from(BATCH_ID_DAMAGE))
        guard["checkpoint_batch_id"] = damage(guard["checkpoint_batch_id"])
    elif mutation == "schema_version":
        guard["schema_version"] = draw(
            st.sampled_from([SCHEMA_V1.replace("v1", "v2"), SCHEMA_V1.upper(), SCHEMA_V1[:-3], 1])
        )
    elif mutation == "recovery":
        guard["recovery"] = draw(st.sampled_from(["automatic", RECOVERY.upper(), None, [RECOVERY]]))
    elif mutation == "plant_canary":
        key = draw(st.sampled_from([*keys, "extra"]))
        guard[key] = FUZZ_CANARY + draw(st.text(max_size=8))
    return guard


def _set(key: str, value: Any):
    return lambda guard, status: ({**guard, key: value}, status)


def _damage(key: str, change):
    return lambda guard, status: ({**guard, key: change(guard[key])}, status)


def _drop(key: str):
    return lambda guard, status: ({k: v for k, v in guard.items() if k != key}, status)


# One damage to an otherwise valid guard, and the problem code it must be reported as.
SINGLE_DAMAGES: list[tuple[str, Any, str]] = [
    *[
        (f"batch id {n}", _damage("checkpoint_batch_id", damage), "invalid_batch_id")
        for n, damage in enumerate(BATCH_ID_DAMAGE)
    ],
    *[
        (f"batch id {value!r}", _set("checkpoint_batch_id", value), "invalid_batch_id")
        for value in (None, 7, ["sha256:" + "0" * 64], "")
    ],
    *[
        (f"phase {n}", _damage("phase", damage), "unsupported_phase")
        for n, damage in enumerate(PHASE_DAMAGE)
    ],
    *[
        (f"phase {value!r}", _set("phase", value), "unsupported_phase")
        for value in (None, 1, "", "committed", ["armed"])
    ],
    *[
        (f"schema {value!r}", _set("schema_version", value), "unknown_schema_version")
        for value in (
            SCHEMA_V1.replace("v1", "v2"),
            SCHEMA_V1.upper(),
            SCHEMA_V1 + " ",
            SCHEMA_V1[:-3],
            None,
            1,
        )
    ],
    *[
        (f"recovery {value!r}", _set("recovery", value), "invalid_recovery")
        for value in ("automatic", RECOVERY.upper(), RECOVERY + "\n", None, [RECOVERY])
    ],
    ("no schema_version", _drop("schema_version"), "unknown_schema_version"),
    *[(f"no {key}", _drop(key), "unexpected_keys") for key in GUARD_KEYS[1:]],
    *[
        (f"extra key {key!r}", _set(key, False), "unexpected_keys")
        for key in ("retryable", "Phase", "phase ", "")
    ],
    ("a list", lambda guard, status: ([guard], status), "not_an_object"),
    ("JSON text", lambda guard, status: (json.dumps(guard), status), "not_an_object"),
    ("null", lambda guard, status: (None, status), "not_an_object"),
]


def valid_guards_with_status() -> list[tuple[dict[str, str], str]]:
    batch_id = "sha256:" + "0123456789abcdef" * 4
    return [(build_guard(GuardPhase(p), batch_id), s) for p, s in sorted(PHASE_STATUS.items())]


def status_damages(guard: dict[str, str], status: str) -> list[tuple[Any, str]]:
    return [(guard, other) for other in sorted(set(PHASE_STATUS.values()) - {status})]


@st.composite
def singly_damaged_guards(draw) -> tuple[Any, str]:
    guard, status = draw(st.sampled_from(valid_guards_with_status()))
    if draw(st.booleans()):
        return draw(st.sampled_from(status_damages(guard, status)))
    _, damage, _ = draw(st.sampled_from(SINGLE_DAMAGES))
    return damage(guard, status)


GUARD_CASES = st.one_of(
    singly_damaged_guards(),
    mutated_guards(),
    st.tuples(JSON_VALUES, STATUSES),
    st.tuples(DEEP, STATUSES),
)


def checkpoint_with(value: Any, status: str) -> PartitionCheckpoint:
    return PartitionCheckpoint(
        partition_id=FOREIGN_ID,
        route=ROUTE,
        status=status,
        run_id="fuzz-run",
        query_hash="sha256:" + "1" * 64,
        schema_hash="sha256:" + "2" * 64,
        partition_bounds={"partition": "fuzz"},
        diagnostics={"artifact_sha256": "sha256:" + "3" * 64, GUARD_KEY: value},
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
        decided = guard_plugin.resume_route_scan(ROUTE, [checkpoint])
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


class Site(Route):
    """The small real route (``helpers.routes.Route``): SQLite source, target and checkpoint
    store in one folder. ``store`` is the real store; each run wraps it afresh.

    ``build=False`` reuses the files already in the folder and leaves the
    store closed (it may be corrupt): ``reopened_attempt`` opens it.
    """

    def __init__(self, folder: Path, *, rows: int = 12, build: bool = True) -> None:
        super().__init__(folder, rows=rows if build else None, partitions=3, open_store=build)
        self.folder = folder
        self.target = self.sink.inner
        self.store = self.real_store
        self.next_id = max(self.source_ids(), default=0) + 1

    def close(self) -> None:
        if self.store is not None:
            self.store.close()
            self.store = None

    @property
    def route(self) -> RouteKey:
        """The route runs use: ``ROUTE`` located in this folder's source and target files."""
        return route_key(self.source, self.target, ROUTE.strategy)

    def run(self, run_id: str, *, store: Any = None, sink: Any = None):
        spec = TransferSpec(
            source=self.source,
            sink=sink or RecordingSink(self.target),
            strategy=ROUTE.strategy,
            path="legacy",
            run_id=run_id,
        )
        return TransferRuntime(store or FaultyStore(self.store), clock=StepClock()).run(spec)

    def attempt(self, run_id: str = "attempt", *, store: Any = None) -> tuple[Any, RecordingSink]:
        """One run; returns what it raised (or its result) and the sink it was given."""
        sink = RecordingSink(self.target)
        try:
            return self.run(run_id, store=store, sink=sink), sink
        except Exception as error:
            return error, sink

    def append(self, rows: int = 6) -> None:
        build_sample_source(self.source_path, rows=rows, partitions=3, start_id=self.next_id)
        self.next_id += rows

    def sql(self, statement: str, params: tuple = ()) -> None:
        """A write by a foreign or broken writer, outside the store's own code."""
        with contextlib.closing(sqlite3.connect(self.store_path, isolation_level=None)) as db:
            db.execute(statement, params)


@contextlib.contextmanager
def site(folder: Path | None = None, **kwargs: Any) -> Iterator[Site]:
    """A Site in ``folder``, or in a private temp folder removed afterwards (for hypothesis)."""
    scratch = None
    if folder is None:
        folder = scratch = Path(tempfile.mkdtemp(prefix="dpone-bad-input-"))
    made = Site(folder, **kwargs)
    try:
        yield made
    finally:
        made.close()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


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


# -- corrupt stores -------------------------------------------------------------------------


def completed_then_new_rows(s: Site) -> None:
    """A route that has run once, plus new rows: a healthy store's next run calls the target."""
    s.run("first")
    s.append()


def latest_row(s: Site) -> tuple[str, int]:
    with contextlib.closing(sqlite3.connect(s.store_path)) as db:
        return db.execute(
            "SELECT partition_id, seq FROM checkpoint_latest ORDER BY partition_id LIMIT 1"
        ).fetchone()


def corrupt_latest_payload(text: Any):
    def corrupt(s: Site) -> None:
        partition_id, _ = latest_row(s)
        statement = "UPDATE checkpoint_latest SET payload = ? WHERE partition_id = ?"
        s.sql(statement, (text, partition_id))

    return corrupt


def rewrite_latest_payload(change):
    def corrupt(s: Site) -> None:
        partition_id, _ = latest_row(s)
        payload = checkpoint_to_payload(
            {cp.partition_id: cp for cp in s.store.list_latest(s.route)}[partition_id]
        )
        change(payload)
        text = json.dumps(payload)
        statement = "UPDATE checkpoint_latest SET payload = ? WHERE partition_id = ?"
        s.sql(statement, (text, partition_id))

    return corrupt


# Payloads that are not JSON at all: the summary columns of ``checkpoint_latest`` are
# generated from the payload, so SQLite itself refuses such a write, whoever makes it.
NOT_JSON = {
    "payload-not-json": corrupt_latest_payload('{"partition_id": "p-'),
    "payload-binary": corrupt_latest_payload(b"\xff\xfe\x00garbage"),
    "payload-nested-too-deep": corrupt_latest_payload("[" * 100_000 + "]" * 100_000),
    "payload-nan": rewrite_latest_payload(lambda p: p["diagnostics"].update(rows=float("nan"))),
}


@pytest.mark.parametrize("case", sorted(NOT_JSON))
def test_sqlite_refuses_a_foreign_write_of_a_payload_that_is_not_json(tmp_path, case):
    with site(tmp_path) as s:
        completed_then_new_rows(s)
        with pytest.raises(sqlite3.OperationalError):
            NOT_JSON[case](s)
        outcome, sink = reopened_attempt(s)
        assert not isinstance(outcome, Exception), repr(outcome)
        assert sink.target_calls == 1
        assert_rows_exactly_once(s.source_ids(), s.target_ids())


CORRUPTIONS = {
    "payload-json-number": (corrupt_latest_payload(7), CheckpointPayloadInvalid),  # TEXT affinity
    "payload-json-array": (corrupt_latest_payload("[1, 2]"), CheckpointPayloadInvalid),
    "payload-missing-key": (
        rewrite_latest_payload(lambda p: p.pop("query_hash")),
        CheckpointPayloadInvalid,
    ),
    "payload-naive-timestamp": (
        rewrite_latest_payload(lambda p: p.update(started_at="2026-01-01T00:00:00")),
        CheckpointPayloadInvalid,
    ),
    "payload-filed-under-another-partition": (
        rewrite_latest_payload(lambda p: p.update(partition_id="p-elsewhere")),
        CheckpointStoreCorrupt,
    ),
    "source-state-not-json": (
        lambda s: s.sql("UPDATE source_state SET state = '{\"generation\": '"),
        CheckpointStoreCorrupt,
    ),
    "source-state-bad-generation": (
        lambda s: s.sql("""UPDATE source_state SET state = '{"generation": "1"}'"""),
        CheckpointStoreCorrupt,
    ),
    "latest-table-dropped": (
        lambda s: s.sql("DROP TABLE checkpoint_latest"),
        CheckpointStoreCorrupt,
    ),
    "unknown-schema-version": (lambda s: s.sql("PRAGMA user_version = 7"), CheckpointStoreCorrupt),
}
# Corruptions of checkpoint rows or of the file: what `guard scan` must refuse too.
SCAN_SEES = {name for name in CORRUPTIONS if not name.startswith("source-state")}


def reopened_attempt(s: Site) -> tuple[Any, RecordingSink]:
    """Close the store, open the (corrupted) file again, run once; what it raised or returned."""
    s.close()
    try:
        s.store = SQLiteCheckpointStore(s.store_path)
    except Exception as error:  # a store that cannot even be opened
        return error, RecordingSink(s.target)
    return s.attempt("after-corruption")


def test_the_corruption_cases_start_from_a_route_whose_next_run_calls_the_target(tmp_path):
    with site(tmp_path) as s:
        completed_then_new_rows(s)
        outcome, sink = reopened_attempt(s)
        assert not isinstance(outcome, Exception)
        assert sink.target_calls == 1
        assert_rows_exactly_once(s.source_ids(), s.target_ids())


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_a_corrupt_store_gives_its_stable_code_and_never_reaches_the_target(tmp_path, case, capsys):
    corrupt, expected = CORRUPTIONS[case]
    with site(tmp_path) as s:
        completed_then_new_rows(s)
        before = s.target_ids()
        corrupt(s)
        outcome, sink = reopened_attempt(s)
        assert type(outcome) is expected, repr(outcome)
        assert sink.target_calls == 0
        assert s.target_ids() == before
        assert "garbage" not in str(outcome) and "[[[" not in str(outcome)
        json.dumps(outcome.diagnostics)  # safe diagnostics are plain JSON
        s.close()

        route_file = write_route(tmp_path, path="legacy")
        assert cli.main(["run", str(route_file), "--quiet"]) == cli.EXIT_FAILED
        assert_clean_failure(capsys.readouterr(), expected.code)
        if case in SCAN_SEES:
            assert cli.main(["guard", "scan", "--store", str(s.store_path)]) == cli.EXIT_FAILED
            assert_clean_failure(capsys.readouterr(), expected.code)
        assert s.target_ids() == before


def assert_clean_failure(captured, code: str) -> None:
    assert captured.out == ""
    assert f"error: {code}: " in captured.err
    assert "Traceback" not in captured.err


def store_file_of_a_completed_route(folder: Path) -> bytes:
    """The bytes of a cleanly closed store (no WAL left) of a route that ran once."""
    with site(folder) as s:
        completed_then_new_rows(s)
    assert not (folder / "checkpoints.db-wal").exists()
    return (folder / "checkpoints.db").read_bytes()


TRUNCATIONS = {
    "empty": lambda size: 0,
    "one-byte": lambda size: 1,
    "inside-the-header": lambda size: 60,
    "header-only": lambda size: 100,
    "first-page": lambda size: 4096,
    "half": lambda size: size // 2,
    "all-but-the-last-page": lambda size: size - 4096,
    "inside-the-last-page": lambda size: size - 100,
    "all-but-one-byte": lambda size: size - 1,
}


@pytest.mark.parametrize("cut", sorted(TRUNCATIONS))
def test_a_truncated_store_file_is_refused_as_corrupt_before_any_target_call(tmp_path, cut):
    """Truncated anywhere, a store is refused: never half-used to call the target.

    Cuts inside the last page are not refused today: SQLite counts a partial
    last page as a whole one and reads the missing bytes as zeros, so the run
    goes ahead, calls the target and commits, and leaves a store that no
    longer reads back. The runbook then says to restore the store from backup
    because "the target was not called"; rerunning on the restored store
    appends those rows a second time.
    """
    data = store_file_of_a_completed_route(tmp_path)
    (tmp_path / "checkpoints.db").write_bytes(data[: TRUNCATIONS[cut](len(data))])
    with site(tmp_path, build=False) as s:
        outcome, sink = reopened_attempt(s)
        assert isinstance(outcome, CheckpointStoreCorrupt), f"ran on a truncated store: {outcome!r}"
        assert sink.target_calls == 0
        assert s.target_ids() == list(range(1, 13))


def test_a_truncated_or_garbage_store_fails_the_console_script_with_its_code(tmp_path):
    data = store_file_of_a_completed_route(tmp_path)
    write_route(tmp_path, path="legacy")
    cases = {
        "truncated": data[: len(data) // 2],
        "garbage": bytes(range(256)) * 64,
        "text": b"password=hunter2\n" * 100,
    }
    for name, content in cases.items():
        (tmp_path / "checkpoints.db").write_bytes(content)
        for command in (["guard", "scan", "--store", "checkpoints.db"], ["run", "route.toml"]):
            done = subprocess.run(
                [SCRIPT, *command], cwd=tmp_path, capture_output=True, text=True, timeout=120
            )
            where = f"{name}: {' '.join(command)}"
            assert done.returncode == cli.EXIT_FAILED, where
            assert "native_transfer_checkpoint_store_corrupt" in done.stderr, where
            assert "Traceback" not in done.stderr and "hunter2" not in done.stderr, where
        with site(tmp_path, build=False) as s:
            assert s.target_ids() == list(range(1, 13)), "the target was touched"


@pytest.mark.parametrize(
    "content",
    [b"", b"SQLite format 3\x00", b"\x00" * 8192, bytes(range(256)) * 32],
    ids=["empty", "magic-only", "zeros", "binary"],
)
def test_a_garbage_store_file_is_refused_as_corrupt(tmp_path, content):
    store_path = tmp_path / "checkpoints.db"
    store_path.write_bytes(content)
    with pytest.raises(CheckpointStoreCorrupt) as info:
        SQLiteCheckpointStore(store_path)
    assert str(tmp_path) not in str(info.value)
    assert store_path.read_bytes() == content, "a corrupt store must not be rewritten"


def test_a_foreign_sqlite_database_is_refused_as_corrupt(tmp_path):
    store_path = tmp_path / "checkpoints.db"
    with contextlib.closing(sqlite3.connect(store_path)) as db:
        db.execute("CREATE TABLE checkpoint_latest (anything TEXT)")
        db.execute("PRAGMA user_version = 1")
    with pytest.raises(CheckpointStoreCorrupt) as info:
        SQLiteCheckpointStore(store_path)
    assert info.value.diagnostics == {"table": "checkpoint_history"}


def test_a_store_that_raises_on_the_route_scan_read_surfaces_that_very_error(tmp_path):
    with site(tmp_path) as s:
        completed_then_new_rows(s)
        store = FaultyStore(s.store)
        error = store.fail_reads(error=RuntimeError("store read refused"))
        outcome, sink = s.attempt(store=store)
        assert outcome is error
        assert sink.target_calls == 0 and store.batches == []
        assert s.target_ids() == list(range(1, 13))


def test_a_store_that_raises_on_the_reconciliation_read_keeps_the_commit_error_and_blocks(tmp_path):
    with site(tmp_path) as s:
        completed_then_new_rows(s)
        store = FaultyStore(s.store)
        commit_error = store.fail_batch(phase_batch("checkpoint_committed"), keep=1)
        store.fail_reads(skip=2, error=RuntimeError("store read refused"))
        outcome, sink = s.attempt(store=store)
        assert outcome is commit_error
        assert sink.target_calls == 1
        blocked, retry = s.attempt("retry")
        assert isinstance(blocked, ManualReconciliationRequired)
        assert retry.target_calls == 0
        assert_rows_exactly_once(s.source_ids(), s.target_ids())


# -- secrets ------------------------------------------------------------------------------

PATH_CANARY = "CANARY-SECRET-PATH"
ROW_CANARY = "CANARY-ROW-VALUE"
SINK_CANARY = "CANARY-SINK-ERROR"
STORE_WRITE_CANARY = "CANARY-STORE-WRITE"
STORE_READ_CANARY = "CANARY-STORE-READ"
PASSWORD_CANARY = "CANARY-PASSWORD"
DSN = f"postgresql://etl:{PASSWORD_CANARY}@warehouse.internal:5432/dwh"
CANARIES = (
    PATH_CANARY,
    ROW_CANARY,
    SINK_CANARY,
    STORE_WRITE_CANARY,
    STORE_READ_CANARY,
    PASSWORD_CANARY,
)
SQL_WORDS = ("SELECT", "INSERT", "ATTACH", "DELETE", "CREATE TABLE")


class Outputs:
    """Every text the system produced during the test, labelled by where it came from."""

    def __init__(self) -> None:
        self.texts: list[tuple[str, str]] = []
        self.events: list[Any] = []
        self.records: list[logging.LogRecord] = []

    def add(self, where: str, text: str) -> None:
        self.texts.append((where, text))

    def error(self, where: str, error: BaseException) -> None:
        """A dpone error's message and diagnostics (an injected error may carry its own text)."""
        assert isinstance(error, NativeTransferError), f"{where}: {error!r} is not dpone's"
        self.add(f"{where} (error)", str(error))
        self.add(f"{where} (diagnostics)", json.dumps(error.diagnostics, default=repr))

    def cli(self, where: str, out: str, err: str) -> None:
        self.add(f"{where} (stdout)", out)
        self.add(f"{where} (stderr)", err)

    def everything(self) -> list[tuple[str, str]]:
        events = [("events", repr([(e.name, dict(e.fields)) for e in self.events]))]
        logs = [("log", _log_text(record)) for record in self.records]
        return self.texts + events + logs


def _log_text(record: logging.LogRecord) -> str:
    parts = [record.getMessage()]
    if record.exc_info:
        parts.append(logging.Formatter().formatException(record.exc_info))
    return "\n".join(parts)


class _Collect(logging.Handler):
    def __init__(self, records: list[logging.LogRecord]) -> None:
        super().__init__(logging.DEBUG)
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def root_logging(records: list[logging.LogRecord]) -> Iterator[None]:
    root, handler = logging.getLogger(), _Collect(records)
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def dpone(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], cwd=folder, capture_output=True, text=True, timeout=120)


def plant_secret_rows(source_path: Path, first_id: int, count: int) -> None:
    """Rows whose non-partition value is a canary (amount holds text: SQLite allows it)."""
    with contextlib.closing(sqlite3.connect(source_path, isolation_level=None)) as db:
        db.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?)",
            [
                (i, f"region-{i % 3:03d}", f"{ROW_CANARY} {DSN}", 1_000_000 + i)
                for i in range(first_id, first_id + count)
            ],
        )


def sink_failing_after_apply(monkeypatch) -> RuntimeError:
    """The real SQLite target methods commit, then raise an error whose text holds secrets."""
    error = RuntimeError(f"{SINK_CANARY}: INSERT INTO orders_copy VALUES ('{ROW_CANARY}') {DSN}")
    for name in ("load", "finalize_staged_load"):
        original = getattr(SQLiteSink, name)

        def failing(self, *args, _original=original, **kwargs):
            _original(self, *args, **kwargs)
            raise error

        monkeypatch.setattr(SQLiteSink, name, failing)
    return error


def stored_json_texts(store_path: Path) -> list[tuple[str, str]]:
    """Every JSON text the store holds: checkpoints, source state, evidence, audit."""
    columns = {
        "checkpoint_history": "payload",
        "checkpoint_latest": "payload",
        "source_state": "state",
        "evidence": "record",
        "audit": "record",
    }
    with contextlib.closing(sqlite3.connect(store_path)) as db:
        return [
            (table, row[0])
            for table, column in columns.items()
            for row in db.execute(f"SELECT {column} FROM {table}")
        ]


class Story:
    """The secret-bearing route of the test below, and every output it produces."""

    ROUTE_ARGS = ("--route", "orders", "orders_copy", "incremental_append")

    def __init__(self, folder: Path, path: str) -> None:
        self.folder = folder
        build_sample_source(folder / "source.db", rows=30, partitions=3)
        self.next_id = 31
        self.plant_rows()
        self.route_file = write_route(folder, path=path)
        self.config = load_route_config(self.route_file)
        self.seen = Outputs()

    def plant_rows(self, count: int = 6) -> None:
        plant_secret_rows(self.folder / "source.db", self.next_id, count)
        self.next_id += count

    def api(self, run_id: str, *, wrap_store=None, sink=None):
        """The Python API (``cli.transfer``: runtime, guard plugin, SQLite store, closed after)."""
        events = self.seen.events.append
        return cli.transfer(self.config, run_id, events=events, wrap_store=wrap_store, sink=sink)

    def api_raises(self, run_id: str, expected: BaseException, **kwargs: Any) -> None:
        with pytest.raises(type(expected)) as info:
            self.api(run_id, **kwargs)
        assert info.value is expected

    def blocked_api(self, run_id: str) -> None:
        with pytest.raises(ManualReconciliationRequired) as info:
            self.api(run_id)
        self.seen.error(f"api {run_id}", info.value)

    def console(self, *args: str, code: int) -> str:
        """The installed console script, run in the route's folder."""
        done = dpone(self.folder, *args)
        assert done.returncode == code, f"{args}: exit {done.returncode}, {done.stderr}"
        self.seen.cli(" ".join(args), done.stdout, done.stderr)
        return done.stdout

    def operator_round(self) -> None:
        """Scan, scan --json, show, a blocked run, then resolve the blocked batch as committed."""
        store = ("--store", "checkpoints.db")
        self.console("guard", "scan", *store, code=cli.EXIT_BLOCKED)
        lines = self.console("guard", "scan", *store, "--json", code=cli.EXIT_BLOCKED)
        self.console("guard", "show", *store, *self.ROUTE_ARGS, code=cli.EXIT_OK)
        self.console("run", "route.toml", code=cli.EXIT_BLOCKED)
        batch = json.loads(lines.splitlines()[0])["batch_id"]
        resolve = ("--batch", batch, "--as", "committed", "--yes")
        who = ("--reason", "rows checked: one copy each", "--operator", "alice")
        self.console("guard", "resolve", *store, *self.ROUTE_ARGS, *resolve, *who, code=0)


def failing_store(*, commit: BaseException | None = None, read: BaseException | None = None):
    """A ``wrap_store`` for ``cli.transfer`` that fails the commit batch part-way, or the scan."""

    def wrap(store):
        wrapped = FaultyStore(store)
        if commit is not None:
            wrapped.fail_batch(phase_batch("checkpoint_committed"), keep=1, error=commit)
        if read is not None:
            wrapped.fail_reads(error=read)
        return wrapped

    return wrap


@pytest.mark.parametrize("path", ["legacy", "staged", "file-artifact", "lazy-plan"])
def test_no_secret_reaches_errors_events_logs_cli_output_or_the_store(
    tmp_path, monkeypatch, capsys, path
):
    folder = tmp_path / PATH_CANARY / "route"
    folder.mkdir(parents=True)
    story = Story(folder, path)
    seen = story.seen

    with root_logging(seen.records):
        # 1. the commit batch fails part-way with a secret-bearing store error; the route blocks
        store_error = RuntimeError(f"{STORE_WRITE_CANARY} {DSN}")
        story.api_raises("api-1", store_error, wrap_store=failing_store(commit=store_error))
        story.blocked_api("api-2")
        read_error = RuntimeError(f"{STORE_READ_CANARY} {DSN}")
        story.api_raises("api-3", read_error, wrap_store=failing_store(read=read_error))
        story.operator_round()

        # 2. new secret rows; the target fails after applying them, with a secret-bearing error
        healed, _ = story.api("api-4")  # completes the resolved generation, no target call
        assert healed.rows_loaded == 0 and len(healed.skipped_partition_ids) == 3
        story.plant_rows()
        sink_error = RuntimeError(f"{SINK_CANARY}: near '{ROW_CANARY}' {DSN}")
        target = RecordingSink(story.config.sink, fail="after", error=sink_error)
        story.api_raises("api-5", sink_error, sink=target)
        story.blocked_api("api-6")
        story.operator_round()

        # 3. the console's own run meets a foreign target failure: reported by type only
        healed, _ = story.api("api-7")
        assert healed.rows_loaded == 0
        story.plant_rows()
        sink_failing_after_apply(monkeypatch)
        assert cli.main(["run", str(story.route_file)]) == cli.EXIT_FAILED
        monkeypatch.undo()
        captured = capsys.readouterr()
        seen.cli("in-process run (foreign failure)", captured.out, captured.err)
        assert "error: transfer failed with RuntimeError" in captured.err
        story.console("run", "route.toml", code=cli.EXIT_BLOCKED)
        story.console("guard", "scan", "--store", "checkpoints.db", code=cli.EXIT_BLOCKED)

    with contextlib.closing(sqlite3.connect(folder / "target.db")) as db:
        loaded = db.execute("SELECT COUNT(*) FROM orders_copy WHERE amount LIKE 'CANARY%'")
        assert loaded.fetchone()[0] == 18, "the secret rows did reach the target"
    names = {event.name for event in seen.events}
    expected = {"route_scanned", "guard_armed", "target_started", "target_failed"}
    assert expected <= names, sorted(names)

    for where, text in seen.everything():
        for canary in CANARIES:
            assert canary not in text, f"{canary} leaked into {where}"
        for word in SQL_WORDS:
            assert word not in text, f"SQL text ({word}) in {where}"

    store_files = [file for file in folder.glob("checkpoints.db*") if file.is_file()]
    stored = b"".join(file.read_bytes() for file in store_files)
    for canary in CANARIES:
        assert canary.encode() not in stored, f"{canary} leaked into the checkpoint store file"
    texts = stored_json_texts(folder / "checkpoints.db")
    assert {table for table, _ in texts} == {
        "checkpoint_history",
        "checkpoint_latest",
        "source_state",
        "evidence",
        "audit",
    }
    for table, text in texts:
        for word in SQL_WORDS:
            assert word not in text, f"SQL text ({word}) persisted in {table}"


def test_a_without_rowid_source_table_is_refused_with_a_clear_error(tmp_path) -> None:
    """It failed on every path as source_invalid "could not be read" (exit 1: retry)."""
    import sqlite3

    from helpers.cli import run_cli

    with contextlib.closing(sqlite3.connect(tmp_path / "source.db")) as db:
        db.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER) WITHOUT ROWID")
        db.execute("INSERT INTO t VALUES ('a', 1)")
        db.commit()
    (tmp_path / "route.toml").write_text(
        '[source]\npath = "source.db"\ntable = "t"\npartition_column = "k"\n'
        '[target]\npath = "target.db"\ntable = "copy"\n'
        '[transfer]\nstrategy = "full_refresh"\npath = "staged"\n'
        '[store]\npath = "checkpoints.db"\n'
    )
    done = run_cli("run", tmp_path / "route.toml")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "native_transfer_config_invalid" in done.stderr and "WITHOUT ROWID" in done.stderr
