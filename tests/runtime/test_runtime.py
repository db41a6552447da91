"""TransferRuntime on real SQLite files: governance, artifacts, evidence and source state,
path plumbing, the result record, safe diagnostics and events."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from dpone_native_transfer import (
    ArtifactInvalid,
    ConfigInvalid,
    Governance,
    GovernanceGateFailed,
    ManualReconciliationRequired,
    PartitionCheckpointStatus,
    PathContractBroken,
)
from dpone_native_transfer.artifacts import file_sha256
from dpone_native_transfer.events import EventName
from dpone_native_transfer.paths import file_artifact
from dpone_native_transfer.paths.legacy import legacy_path
from dpone_native_transfer.testing import (
    InjectedFault,
    build_sample_source,
    guard_phase,
    phase_batch,
)
from dpone_target_commit_guard.payload import batch_id_for

COMMITTED = PartitionCheckpointStatus.COMMITTED
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
PARTITION_ID = re.compile(r"p-[0-9a-f]{24}")


def state(route) -> dict | None:
    """The route's progress (its definition and cursor edge aside: see
    tests/incremental/test_incremental.py and tests/incremental/test_cursor_edge.py)."""
    stored = route.real_store.load_source_state(route.spec("legacy").route)
    aside = ("definition", "edge")
    return None if stored is None else {k: v for k, v in stored.items() if k not in aside}


def evidence_run_ids(route) -> list[str]:
    return [
        record["run_id"] for record in route.real_store.list_evidence(route.spec("legacy").route)
    ]


def target_tables(route) -> set[str]:
    target = route.tmp / "target.db"
    if not target.exists():
        return set()
    with sqlite3.connect(target) as connection:
        tables = connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        names = {row[0] for row in tables}
    connection.close()
    return names


def insert_rows(route, rows) -> None:
    with sqlite3.connect(route.source_path) as connection:
        connection.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", rows)
    connection.close()


# -- governance --------------------------------------------------------------


@pytest.mark.parametrize(
    ("gate", "limit_name"),
    [(Governance(min_rows=121), "min_rows"), (Governance(max_rows=119), "max_rows")],
    ids=["min_rows-too-high", "max_rows-too-low"],
)
def test_a_failed_row_count_gate_stops_before_the_target_and_writes_nothing(
    route, path, gate, limit_name
):
    with pytest.raises(GovernanceGateFailed) as info:
        route.runtime().run(route.spec(path, governance=gate))
    assert info.value.code == "native_transfer_governance_gate_failed"
    assert info.value.diagnostics["gate"] == limit_name
    assert info.value.diagnostics["rows"] == 120
    assert route.sink.target_calls == 0
    assert route.store.batches == [] and route.latest() == []
    assert not any(name.startswith("_dpone_stage_") for name in target_tables(route))
    assert "orders_copy" not in target_tables(route)
    assert state(route) is None and evidence_run_ids(route) == []

    passing = Governance(min_rows=120, max_rows=120)
    result = route.runtime().run(route.spec(path, run_id="retry", governance=passing))
    assert result.rows_loaded == 120
    assert route.sink.target_calls == 1
    assert route.target_ids() == route.source_ids()
    assert target_tables(route) == {"orders_copy", "_dpone_ledger", "_dpone_fence"}


# -- file-artifact -------------------------------------------------------------


def test_a_tampered_artifact_is_refused_before_the_target(route, monkeypatch):
    def tamper_then_hash(path):
        with open(path, "ab") as handle:
            handle.write(b"\x00")
        return file_sha256(path)

    monkeypatch.setattr(file_artifact, "file_sha256", tamper_then_hash)
    with pytest.raises(ArtifactInvalid) as info:
        route.runtime().run(route.spec("file-artifact"))
    assert info.value.code == "native_transfer_artifact_invalid"
    assert PARTITION_ID.fullmatch(info.value.diagnostics["partition_id"])
    assert route.sink.target_calls == 0
    assert route.latest() == []


def test_file_artifact_checkpoints_carry_the_digest_of_each_artifact(route):
    """The digests are those of the files the sink reads; the files go with the run."""
    folder = route.tmp / "artifacts"
    route.sink.observe = lambda: {
        path.stem: file_sha256(path) for path in folder.glob("dpone-transfer-*/p-*")
    }
    route.runtime().run(route.spec("file-artifact", artifact_dir=str(folder)))
    (seen,) = route.sink.observations
    latest = route.latest()
    assert len(latest) == 4 and all(cp.status is COMMITTED for cp in latest)
    for checkpoint in latest:
        digest = checkpoint.diagnostics["artifact_sha256"]
        assert DIGEST.fullmatch(digest)
        assert digest == seen[checkpoint.partition_id]
    assert len({cp.diagnostics["artifact_sha256"] for cp in latest}) == 4
    assert list(folder.iterdir()) == [], "the run's private folder is removed after it"


# -- evidence and source state ---------------------------------------------------


@pytest.mark.parametrize("which", ["evidence", "source_state"])
def test_a_failed_state_write_after_promotion_heals_without_a_target_call(route, path, which):
    error = route.store.fail_state_write(which)
    with pytest.raises(InjectedFault) as info:
        route.runtime().run(route.spec(path))
    assert info.value is error
    assert {(cp.status, guard_phase(cp)) for cp in route.latest()} == {
        (COMMITTED, "checkpoint_committed")
    }
    assert state(route) is None
    assert evidence_run_ids(route) == ([] if which == "evidence" else ["run-1"])

    healed = route.runtime().run(route.spec(path, run_id="run-2"))
    assert route.sink.target_calls == 1
    assert healed.committed_partition_ids == ()
    assert evidence_run_ids(route)[-1] == "run-2"
    assert state(route) == {"generation": 1, "watermark": 1_000_120}
    assert route.target_ids() == route.source_ids()


@pytest.mark.parametrize("guarded", [True, False], ids=["guarded", "unguarded"])
def test_source_state_advances_only_after_promotion(route, guarded):
    plugins = None if guarded else []
    route.runtime(plugins=plugins).run(route.spec("legacy"))
    before = state(route)
    assert before == {"generation": 1, "watermark": 1_000_120}
    build_sample_source(route.source_path, rows=12, start_id=121)
    commit_batch = phase_batch("checkpoint_committed" if guarded else None)
    error = route.store.fail_batch(commit_batch)
    with pytest.raises(InjectedFault) as info:
        route.runtime(plugins=plugins).run(route.spec("legacy", run_id="run-2"))
    assert info.value is error
    assert route.sink.target_calls == 2, "the target was called; only promotion failed"
    assert state(route) == before
    assert evidence_run_ids(route) == ["run-1"]


# -- paths -------------------------------------------------------------------------


def test_an_unknown_path_name_is_a_config_error(route):
    with pytest.raises(ConfigInvalid) as info:
        route.runtime().run(route.spec("teleport"))
    assert info.value.code == "native_transfer_config_invalid"
    assert info.value.diagnostics == {"key": "path"}
    assert "legacy" in str(info.value)
    assert route.store.batches == [] and route.sink.target_calls == 0


def test_a_custom_path_that_never_reaches_the_boundary_is_a_broken_path(route):
    extracted = []

    def noop(ctx):
        extracted.extend(cp.partition_id for cp in ctx.candidates)
        return 0

    with pytest.raises(PathContractBroken) as info:  # a bug in the path, not the route file
        route.runtime(paths={"noop": noop}).run(route.spec("noop"))
    assert info.value.diagnostics["path"] == "noop"
    assert not isinstance(info.value, ConfigInvalid)
    assert len(extracted) == 4, "the custom path was called"
    assert route.sink.target_calls == 0
    assert state(route) is None and evidence_run_ids(route) == []


def test_a_custom_path_may_reach_the_target_only_once(route):
    def twice(ctx):
        rows = legacy_path(ctx)
        ctx.mutate("load", lambda: ctx.sink.load(ctx.row_chunks([])))
        return rows

    with pytest.raises(PathContractBroken, match="twice"):
        route.runtime(paths={"twice": twice}).run(route.spec("twice"))
    assert route.sink.target_calls == 1
    assert route.target_ids() == route.source_ids()
    assert state(route) is None


def test_a_custom_path_through_the_boundary_gets_the_guard(route):
    result = route.runtime(paths={"mine": legacy_path}).run(route.spec("mine"))
    assert len(result.committed_partition_ids) == 4
    assert {guard_phase(cp) for cp in route.latest()} == {"checkpoint_committed"}


# -- the result record ------------------------------------------------------------


def test_transfer_result_fields(route, path):
    events = []
    result = route.runtime(events=events.append).run(route.spec(path))
    latest = route.latest()
    assert sorted(result.committed_partition_ids) == sorted(cp.partition_id for cp in latest)
    assert result.skipped_partition_ids == ()
    assert result.rows_loaded == len(route.source_ids()) == 120
    assert DIGEST.fullmatch(result.batch_id)
    assert {cp.diagnostics["target_commit_guard"]["checkpoint_batch_id"] for cp in latest} == {
        result.batch_id
    }
    assert result.batch_id == batch_id_for("run-1", result.committed_partition_ids)
    assert result.batch_id == batch_id_for("run-1", reversed(result.committed_partition_ids))
    assert result.batch_id != batch_id_for("run-2", result.committed_partition_ids)
    assert result.events == tuple(events)
    record = route.real_store.list_evidence(route.spec(path).route)[-1]
    assert record["batch_id"] == result.batch_id
    assert record["committed_partition_ids"] == list(result.committed_partition_ids)
    assert record["rows_loaded"] == 120


# -- safe diagnostics ---------------------------------------------------------------

ROW_CANARY = "CANARY-ROW-VALUE"
PARTITION_CANARY = "CANARY-PARTITION-VALUE"
EXCEPTION_CANARY = "CANARY-EXCEPTION-TEXT"
SQL_WORDS = ("SELECT", "INSERT", "DELETE")


def store_bytes(route) -> bytes:
    files = [route.tmp / "checkpoints.db", route.tmp / "checkpoints.db-wal"]
    return b"".join(file.read_bytes() for file in files if file.exists())


def test_no_row_value_or_exception_text_reaches_errors_events_or_the_store(route, path):
    insert_rows(
        route,
        [
            (121, "region-001", f"{ROW_CANARY} in amount", 1_000_121),
            (122, f"region-{PARTITION_CANARY}", ROW_CANARY, 1_000_122),
        ],
    )
    route.sink.fail = "after"
    route.sink.error = RuntimeError(
        f"{EXCEPTION_CANARY} near SELECT * FROM orders WHERE amount = '{ROW_CANARY}'"
    )
    events = []
    with pytest.raises(RuntimeError) as failed:
        route.runtime(events=events.append).run(route.spec(path))
    assert failed.value is route.sink.error
    with pytest.raises(ManualReconciliationRequired) as blocked:
        route.runtime(events=events.append).run(route.spec(path, run_id="retry"))
    assert route.sink.target_calls == 1
    assert ROW_CANARY in str(route.sink.inner.rows()), "the canary rows did reach the target"

    error = blocked.value
    # A partition's value names it in progress (``partition``), as in checkpoints, by design;
    # no other field of any event may carry it.
    named = [event.fields["partition"] for event in events if "partition" in event.fields]
    assert any(PARTITION_CANARY in label for label in named)
    unnamed = [{k: v for k, v in e.fields.items() if k != "partition"} for e in events]
    texts = {
        "message": str(error),
        "diagnostics": json.dumps(error.diagnostics),
        "events": repr(
            [(event.name, fields) for event, fields in zip(events, unnamed, strict=True)]
        ),
    }
    for where, text in texts.items():
        for canary in (ROW_CANARY, PARTITION_CANARY, EXCEPTION_CANARY):
            assert canary not in text, f"{canary} leaked into {where}"
    for where in ("message", "diagnostics"):
        for word in SQL_WORDS:
            assert word not in texts[where], f"SQL text {word} in {where}"
    assert any(event.name == EventName.TARGET_FAILED for event in events)

    stored = store_bytes(route)
    assert stored, "the checkpoint store file was read"
    for canary in (ROW_CANARY, EXCEPTION_CANARY):
        assert canary.encode() not in stored, f"{canary} leaked into the checkpoint store file"


def test_a_message_lists_at_most_five_blocked_partitions_and_diagnostics_all(route):
    build_sample_source(route.source_path, rows=9, partitions=9, start_id=200)
    route.sink.fail = "after"
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy"))
    blocked_ids = {cp.partition_id for cp in route.latest()}
    assert len(blocked_ids) == 9
    with pytest.raises(ManualReconciliationRequired) as info:
        route.runtime().run(route.spec("legacy", run_id="retry"))
    message = str(info.value)
    shown = PARTITION_ID.findall(message)
    assert len(shown) == 5 and set(shown) <= blocked_ids
    assert "and 4 more" in message
    assert {item["partition_id"] for item in info.value.diagnostics["partitions"]} == blocked_ids


def test_a_message_with_few_blocked_partitions_lists_them_all(route):
    route.sink.fail = "after"
    with pytest.raises(InjectedFault):
        route.runtime().run(route.spec("legacy"))
    with pytest.raises(ManualReconciliationRequired) as info:
        route.runtime().run(route.spec("legacy", run_id="retry"))
    message = str(info.value)
    assert set(PARTITION_ID.findall(message)) == {cp.partition_id for cp in route.latest()}
    assert "more" not in message


# -- events -----------------------------------------------------------------------------


def test_lazy_plan_without_a_gate_extracts_nothing(route):
    result = route.runtime().run(route.spec("lazy-plan"))
    names = [event.name for event in result.events]
    assert EventName.PARTITION_EXTRACTED not in names
    assert result.rows_loaded == 120


def test_lazy_plan_with_a_gate_counts_every_partition(route):
    result = route.runtime().run(route.spec("lazy-plan", governance=Governance(min_rows=1)))
    extracted = [e for e in result.events if e.name == EventName.PARTITION_EXTRACTED]
    assert [e.fields["done"] for e in extracted] == [1, 2, 3, 4]
    assert {e.fields["of"] for e in extracted} == {4}
    assert sum(e.fields["rows"] for e in extracted) == 120
    assert {e.fields["partition_id"] for e in extracted} == set(result.committed_partition_ids)
    assert {cp.rows_exported for cp in route.latest()} == {30}
