"""The commands people reach for: ``routes``, ``state show``, ``run --json``, log levels and the
progress lines, on real SQLite routes run in this process (``helpers.cli.run_cli``)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from typing import Any

import attrs
import pytest
from helpers.cli import run_cli
from helpers.routes import write_route

from dpone_native_transfer import SQLiteCheckpointStore
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.testing import build_sample_source


@pytest.fixture
def route_file(tmp_path):
    return write_route(tmp_path, rows=120, path="legacy")


def test_run_json_prints_the_summary_as_one_object(route_file):
    done = run_cli("run", route_file, "--run-id", "r1", "--json", "--quiet")
    assert done.returncode == 0 and done.stderr == ""
    [line] = done.stdout.splitlines()
    summary = json.loads(line)
    assert summary["route"] == {
        "source_table": "orders", "target_table": "orders_copy", "strategy": "incremental_append"
    }  # fmt: skip
    assert (summary["run_id"], summary["path"], summary["rows_loaded"]) == ("r1", "legacy", 120)
    assert (summary["committed_partitions"], summary["skipped_partitions"]) == (4, 0)
    assert summary["batch_id"].startswith("sha256:") and summary["guarded"] is True
    assert summary["rows_per_second"] > 0 and summary["seconds"] > 0
    again = json.loads(run_cli("run", route_file, "--json", "--quiet").stdout)
    assert (again["rows_loaded"], again["skipped_partitions"], again["batch_id"]) == (0, 0, None)


def test_progress_names_each_partition_by_value_with_rows_so_far_and_a_rate(route_file):
    done = run_cli("run", route_file)
    lines = done.stderr.splitlines()
    extracted = [line for line in lines if " extracted " in line]
    assert len(extracted) == 4
    assert extracted[0].startswith("[1/4] partition region=region-000 (p-")
    assert "extracted 30 rows (30 rows so far, " in extracted[0]
    assert extracted[3].endswith(" rows/s)") and "(120 rows so far, " in extracted[3]
    assert "rows/s" in done.stdout


def test_lazy_plan_reports_each_partition_it_plans(tmp_path):
    done = run_cli("run", write_route(tmp_path, rows=120, path="lazy-plan"))
    planned = [line for line in done.stderr.splitlines() if " planned" in line]
    assert [line[:5] for line in planned] == ["[1/4]", "[2/4]", "[3/4]", "[4/4]"]
    assert "partition region=region-000 (p-" in planned[0]


def test_log_level_warning_hides_progress_and_a_bad_level_is_a_usage_error(route_file):
    quiet = run_cli("run", route_file, "--log-level", "warning")
    assert quiet.returncode == 0 and quiet.stderr == ""
    bad = run_cli("run", route_file, "--log-level", "loud")
    assert bad.returncode == 2


def test_the_library_logs_nothing_unless_its_application_says_so(tmp_path):
    """A listener that raises is logged as a warning; a library caller that configured no
    logging sees nothing on stderr (the package's logger has a NullHandler)."""
    build_sample_source(tmp_path / "s.db", rows=10, partitions=2)
    code = f"""
from dpone_native_transfer import *
store = SQLiteCheckpointStore({str(tmp_path / "c.db")!r})
def boom(event): raise RuntimeError("listener")
spec = TransferSpec(source=SQLiteSource({str(tmp_path / "s.db")!r}, "orders", "region"),
    sink=SQLiteSink({str(tmp_path / "t.db")!r}, "t"), strategy="full_refresh", path="legacy",
    run_id="r")
print(TransferRuntime(store, events=boom).run(spec).rows_loaded)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "10\n", "")


def test_routes_lists_every_route_of_the_store_with_its_outcome(tmp_path, route_file):
    store = tmp_path / "checkpoints.db"
    assert run_cli("run", route_file, "--run-id", "first", "--quiet").returncode == 0
    done = run_cli("routes", "--store", store, "--json")
    assert done.returncode == 0, done.stderr
    [status] = json.loads(done.stdout)  # one JSON array
    assert status["route"]["target_table"] == "orders_copy"
    assert (status["outcome"], status["blocked_by"], status["lease"]) == ("succeeded", None, None)
    assert status["partitions"] == {"committed": 4}
    assert status["last_success"]["run_id"] == "first"
    assert status["last_success"]["rows_loaded"] == 120
    assert (status["watermark"], status["generation"]) == (1_000_120, 1)  # the highest cursor
    assert str(tmp_path) not in done.stdout  # locations are digests, never paths
    text = run_cli("routes", "--store", store).stdout
    assert text.startswith("orders -> orders_copy (incremental_append): succeeded; last success")
    assert "partitions: 4 committed" in text


def test_routes_shows_a_blocked_route_and_state_show_its_source_state(tmp_path, route_file):
    assert run_cli("run", route_file, "--quiet").returncode == 0
    config = load_route_config(route_file)
    with SQLiteCheckpointStore(config.store_path) as store:  # a guard that contradicts itself
        [first, *_] = store.list_latest(config.route)
        guard = {**first.diagnostics["target_commit_guard"], "phase": "armed"}
        store.upsert(attrs.evolve(first, diagnostics={"target_commit_guard": guard}))
    [status] = json.loads(run_cli("routes", "--store", config.store_path, "--json").stdout)
    assert status["outcome"] == "blocked"
    assert status["blocked_by"] == "native_transfer_target_commit_guard_invalid"
    shown = run_cli("state", "show", route_file, "--json")
    assert shown.returncode == 0, shown.stderr
    state = json.loads(shown.stdout)
    assert state["outcome"] == "blocked" and state["source_state"]["generation"] == 1
    assert state["source_state"]["watermark"] == state["watermark"]
    text = run_cli("state", "show", route_file).stdout.splitlines()
    assert "blocked by native_transfer_target_commit_guard_invalid" in text[0]
    assert text[1].startswith("source state: {")


def test_a_route_whose_run_is_in_its_target_call_is_running_not_blocked(route_file):
    """Asked while the run's target call is under way (its partitions armed, its lease held):
    ``routes`` and ``state show`` said "blocked", where ``guard scan`` says in progress."""
    from dpone_native_transfer import TransferRuntime
    from dpone_native_transfer.testing import RecordingSink

    config = load_route_config(route_file)

    def asked() -> tuple[dict, dict]:
        [listed] = json.loads(run_cli("routes", "--store", config.store_path, "--json").stdout)
        shown = run_cli("state", "show", route_file, "--json")
        return listed, json.loads(shown.stdout)

    sink = RecordingSink(config.sink, observe=asked)
    with SQLiteCheckpointStore(config.store_path) as store:
        TransferRuntime(store).run(config.spec("r1", sink=sink))
    [(listed, shown)] = sink.observations
    for status in (listed, shown):
        assert status["outcome"] == "running" and status["blocked_by"] is None
        assert status["lease"]["run_id"] == "r1"
    assert shown["healing"] == [] and shown["target"].startswith("not compared")
    [after] = json.loads(run_cli("routes", "--store", config.store_path, "--json").stdout)
    assert after["outcome"] == "succeeded"


def test_routes_and_state_show_refuse_a_store_that_does_not_exist(tmp_path, route_file):
    missing = run_cli("routes", "--store", tmp_path / "nope.db")
    assert missing.returncode == 2 and str(tmp_path) not in missing.stderr
    never_run = run_cli("state", "show", route_file)
    assert never_run.returncode == 2 and "store" in never_run.stderr


def test_a_run_with_nothing_to_load_succeeds_and_a_run_that_failed_since_shows(
    tmp_path, route_file
):
    """A run that finds nothing new writes its evidence but no checkpoint: the route still
    shows ``succeeded`` (it showed ``failed``, its run id not the newest checkpoint's). A run
    that wrote checkpoints after the last success and failed shows ``failed``."""
    from dpone_native_transfer import TransferRuntime, entry_point_plugins, hookimpl

    store = tmp_path / "checkpoints.db"
    status = functools.partial(lambda *a: _shown_json(*a)[0], "routes", "--store", store)
    assert run_cli("run", route_file, "--run-id", "first", "--quiet").returncode == 0
    assert run_cli("run", route_file, "--run-id", "nothing-new", "--quiet").returncode == 0
    shown = status()
    assert (shown["outcome"], shown["last_success"]["run_id"]) == ("succeeded", "nothing-new")
    assert shown["latest_run_id"] == "first"

    class Veto:  # after the guard armed: the batch is marked failed before the target
        @hookimpl(trylast=True)
        def before_target_mutation(self, mutation):
            raise RuntimeError("vetoed")

    build_sample_source(tmp_path / "source.db", rows=20, partitions=4, start_id=1000)
    config = load_route_config(route_file)
    with SQLiteCheckpointStore(store) as opened:
        runtime = TransferRuntime(opened, plugins=[*entry_point_plugins(), Veto()])
        with pytest.raises(RuntimeError):
            runtime.run(config.spec("vetoed"))
    shown = status()
    assert (shown["outcome"], shown["latest_run_id"]) == ("failed", "vetoed")
    assert shown["last_success"]["run_id"] == "nothing-new"
    assert run_cli("run", route_file, "--run-id", "again", "--quiet").returncode == 0
    assert status()["outcome"] == "succeeded"


def test_state_show_compares_the_store_with_the_target_as_a_run_would(tmp_path, route_file):
    """``routes`` reads the store alone; ``state show`` also reads the target's ledger, so a
    restored or lost store shows as blocked, as every run then exits 3 (it showed
    ``succeeded``, or ``never run``)."""
    import shutil

    store = tmp_path / "checkpoints.db"
    shown = functools.partial(_shown_json, "state", "show", route_file)
    assert run_cli("run", route_file, "--run-id", "first", "--quiet").returncode == 0
    status = shown()
    assert (status["outcome"], status["target"]) == (
        "succeeded",
        "agrees with the checkpoint store",
    )
    shutil.copy(store, tmp_path / "old.db")
    build_sample_source(tmp_path / "source.db", rows=20, partitions=4, start_id=1000)
    assert run_cli("run", route_file, "--run-id", "second", "--quiet").returncode == 0
    shutil.copy(tmp_path / "old.db", store)  # an older backup of the store, restored
    assert run_cli("run", route_file, "--run-id", "third", "--quiet").returncode == 3
    status = shown()
    assert status["outcome"] == "blocked"
    assert status["blocked_by"] == "native_transfer_store_target_mismatch"
    assert status["target"].startswith("disagrees: ")
    assert str(tmp_path) not in json.dumps(status)
    text = run_cli("state", "show", route_file).stdout.splitlines()
    assert "the target line says why" in text[0] and text[2].startswith("target: disagrees")
    from dpone_native_transfer.lease import Lease

    config = load_route_config(route_file)
    with SQLiteCheckpointStore(store) as opened:  # a run under way: its ledger may lead
        with Lease(opened.lease_table(), config.route, run_id="under-way", seconds=60):
            status = shown()
    assert status["target"].startswith("not compared (a run holds the route's lease")
    assert status["lease"]["run_id"] == "under-way"
    store.unlink()  # the store lost: the next run makes an empty one, and refuses
    assert run_cli("run", route_file, "--run-id", "fourth", "--quiet").returncode == 3
    status = shown()
    assert (status["outcome"], status["blocked_by"]) == (
        "blocked",
        "native_transfer_store_target_mismatch",
    )


def test_an_audit_record_missing_its_keys_excuses_no_batch_and_is_named(tmp_path, route_file):
    """A record holding only ``ledger_overrides`` (none of the keys an operator command
    writes) let a run past the store's check against the target, which loaded rows again;
    one holding them as a text was skipped. Every reader now calls it malformed, by its id
    and keys, never a value."""
    import shutil
    import sqlite3

    store = tmp_path / "checkpoints.db"
    assert run_cli("run", route_file, "--quiet").returncode == 0
    shutil.copy(store, tmp_path / "old.db")
    build_sample_source(tmp_path / "source.db", rows=20, partitions=4, start_id=1000)
    second = json.loads(run_cli("run", route_file, "--quiet", "--json").stdout)
    shutil.copy(tmp_path / "old.db", store)  # the store lost the second batch
    route = load_route_config(route_file).route
    forged = json.dumps({"ledger_overrides": [second["batch_id"]], "reason": "SECRET"})
    with sqlite3.connect(store) as db:
        db.execute(
            "INSERT INTO audit (source_table, target_table, strategy, source_location,"
            " target_location, record) VALUES (?, ?, ?, ?, ?, ?)",
            (*route.as_dict().values(), route.source_location, route.target_location, forged),
        )
    db.close()
    said = (
        "native_transfer_checkpoint_store_corrupt: stored audit record #1 of route orders -> "
        "orders_copy (incremental_append) is malformed: at, forced_invalid, operator, "
        "partitions, resolved_as, route missing or not as dpone writes them"
    )
    done = run_cli("run", route_file, "--quiet")
    assert done.returncode == 1 and done.stderr.startswith(f"error: {said}\n"), done.stderr
    shown = run_cli("state", "show", route_file)
    assert shown.stdout.splitlines()[-1] == f"target: not compared ({said})"
    assert "SECRET" not in done.stdout + done.stderr + shown.stdout + shown.stderr
    with sqlite3.connect(tmp_path / "target.db") as db:
        counts = db.execute("SELECT count(*), count(DISTINCT id) FROM orders_copy").fetchone()
    db.close()
    assert counts == (140, 140)


def _shown_json(*command: object) -> Any:
    """``dpone-transfer COMMAND --json``'s one object; the command must succeed."""
    done = run_cli(*command, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
