"""Corrupt checkpoint stores, tried on purpose: rows that are not JSON, or not checkpoints,
a truncated file, a garbage file, a store that raises on read give a stable error code (or
the injected object itself), and the target is never called, although a healthy store
would have called it. A run decodes the checkpoints it acts on (its window's, a guard's),
not every window the route ever loaded: a damaged checkpoint of a finished window leaves
its rows exact, and the operator's ``guard scan`` refuses it.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
from pathlib import Path
from typing import Any

import pytest
from helpers.bad_input import Site, site
from helpers.cli import SCRIPT
from helpers.routes import write_route

from dpone_native_transfer import (
    CheckpointPayloadInvalid,
    CheckpointStoreCorrupt,
    ManualReconciliationRequired,
    SQLiteCheckpointStore,
    checkpoint_to_payload,
    cli,
)
from dpone_native_transfer.errors import TargetConstraintRefused
from dpone_native_transfer.testing import (
    FaultyStore,
    RecordingSink,
    assert_rows_exactly_once,
    phase_batch,
)


def completed_then_new_rows(s: Site) -> None:
    """A route that has run once, plus new rows whose window an attempt began and the target
    refused (nothing applied): a healthy store's next run retries that window, and calls
    the target."""
    s.run("first")
    s.append()
    refused = TargetConstraintRefused.refused(s.target.table, constraint="CHECK")
    with pytest.raises(TargetConstraintRefused):
        s.run("refused", sink=RecordingSink(s.target, fail="before", error=refused))


def latest_row(s: Site, *, order: str = "seq DESC") -> tuple[str, int]:
    """The newest checkpoint row (one of the window the next run retries), or the first by
    ``order``."""
    with contextlib.closing(sqlite3.connect(s.store_path)) as db:
        return db.execute(
            f"SELECT partition_id, seq FROM checkpoint_latest ORDER BY {order} LIMIT 1"
        ).fetchone()


def corrupt_latest_payload(text: Any):
    def corrupt(s: Site) -> None:
        partition_id, _ = latest_row(s)
        statement = "UPDATE checkpoint_latest SET payload = ? WHERE partition_id = ?"
        s.sql(statement, (text, partition_id))

    return corrupt


def rewrite_latest_payload(change, *, order: str = "seq DESC"):
    def corrupt(s: Site) -> None:
        partition_id, _ = latest_row(s, order=order)
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


# Damage to a checkpoint of a window the route finished: no run acts on it again.
FINISHED_WINDOW = {
    "payload-filed-under-another-partition": (
        lambda p: p.update(partition_id="p-elsewhere"),
        CheckpointStoreCorrupt,
    ),
    "payload-missing-key": (lambda p: p.pop("query_hash"), CheckpointPayloadInvalid),
    "payload-naive-timestamp": (
        lambda p: p.update(started_at="2026-01-01T00:00:00"),
        CheckpointPayloadInvalid,
    ),
}


@pytest.mark.parametrize("case", sorted(FINISHED_WINDOW))
def test_a_damaged_checkpoint_of_a_finished_window_leaves_the_rows_exact_and_guard_scan_refuses(
    tmp_path, case, capsys
):
    change, expected = FINISHED_WINDOW[case]
    with site(tmp_path) as s:
        s.run("first")
        s.append()
        rewrite_latest_payload(change, order="seq")(s)  # a checkpoint of the first window
        outcome, sink = reopened_attempt(s)
        assert not isinstance(outcome, Exception), repr(outcome)
        assert sink.target_calls == 1
        assert_rows_exactly_once(s.source_ids(), s.target_ids())
        s.close()
        assert cli.main(["guard", "scan", "--store", str(s.store_path)]) == cli.EXIT_FAILED
        assert_clean_failure(capsys.readouterr(), expected.code)


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
