"""What the bad-input tests share (tests/bad_input/test_bad_input_*.py,
tests/stores/test_latest_checkpoints.py): the guard payload oracle, restating the v1 rules
of docs/compatibility.md without importing them; the hypothesis strategies that draw guard
payloads (``GUARD_CASES``); and ``Site``, the small real route whose store a test damages.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from dpone_native_transfer import (
    PartitionCheckpoint,
    PartitionCheckpointStatus,
    RouteKey,
    TransferRuntime,
    TransferSpec,
)
from dpone_native_transfer.spec import route_key
from dpone_native_transfer.testing import FaultyStore, RecordingSink, StepClock, build_sample_source
from dpone_target_commit_guard.payload import GuardPhase, GuardRecord, build_guard

from .routes import Route

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
