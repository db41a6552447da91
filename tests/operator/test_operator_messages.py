"""What an operator reads: messages that name what the tool knows, and say what to do.

The route file and store actually used in every suggested command; who holds a lease, whether
it is alive and when it expires; a read-only target named as such (exit 2, never "busy");
``routes`` listing a route that only holds a lease, and valid JSON when there is nothing.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from pathlib import Path

import pytest
from helpers.cli import run_cli
from helpers.routes import write_route

from dpone_native_transfer import SQLiteCheckpointStore
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.lease import Lease
from dpone_native_transfer.testing import build_sample_source

TARGETS = {"sqlite": "target.db", "duckdb": "target.duckdb", "clickhouse": "chdata"}


def test_routes_lists_a_route_that_only_holds_a_lease_and_prints_json_for_none(
    tmp_path: Path,
) -> None:
    route_file = write_route(tmp_path, rows=40, path="legacy")
    store = tmp_path / "checkpoints.db"
    SQLiteCheckpointStore(store).close()
    empty = run_cli("routes", "--store", store, "--json")
    assert (empty.returncode, json.loads(empty.stdout)) == (0, [])
    assert "no route and no lease" in run_cli("routes", "--store", store).stdout
    config = load_route_config(route_file)
    with SQLiteCheckpointStore(store) as opened:
        with Lease(opened.lease_table(), config.route, run_id="first-run", seconds=60):
            [listed] = json.loads(run_cli("routes", "--store", store, "--json").stdout)
            text = run_cli("routes", "--store", store).stdout
    assert listed["outcome"] == "never run" and listed["lease"]["run_id"] == "first-run"
    assert "never run" in text and "lease held by" in text and "expires at" in text


def test_a_lease_whose_process_is_gone_is_not_shown_as_held(tmp_path: Path) -> None:
    """A run killed on this machine leaves its lease row; the next run takes it at once
    (``check_not_leased``), so ``routes`` and ``state show`` do not name it as the holder
    (they said "lease held by" a dead process). Found by a hostile check."""
    import sys

    route_file = write_route(tmp_path, rows=40, path="legacy")
    store = tmp_path / "checkpoints.db"
    assert run_cli("run", route_file, "--quiet").returncode == 0
    take = (
        "import os, sys\n"
        "from dpone_native_transfer import SQLiteCheckpointStore\n"
        "from dpone_native_transfer.config import load_route_config\n"
        "from dpone_native_transfer.lease import Lease\n"
        "store = SQLiteCheckpointStore(sys.argv[1])\n"
        "Lease(store.lease_table(), load_route_config(sys.argv[2]).route, run_id='killed',"
        " seconds=600).__enter__()\n"
        "os._exit(0)\n"
    )
    done = subprocess.run([sys.executable, "-c", take, str(store), str(route_file)], timeout=60)
    assert done.returncode == 0
    [listed] = json.loads(run_cli("routes", "--store", store, "--json").stdout)
    assert listed["lease"] is None
    shown = json.loads(run_cli("state", "show", route_file, "--json").stdout)
    assert shown["lease"] is None and not shown["target"].startswith("not compared")
    assert run_cli("run", route_file, "--quiet").returncode == 0  # it takes the lease at once
    assert "lease" not in run_cli("routes", "--store", store).stdout


def test_a_busy_route_says_its_holder_is_alive_and_when_its_lease_expires(
    tmp_path: Path,
) -> None:
    route_file = write_route(tmp_path, rows=40, path="legacy")
    config = load_route_config(route_file)
    with SQLiteCheckpointStore(config.store_path) as opened:
        with Lease(opened.lease_table(), config.route, run_id="still-running", seconds=60):
            busy = run_cli("run", route_file)
    assert busy.returncode == 1
    assert "its process on this machine is alive (running, or paused)" in busy.stderr
    assert "its lease expires at 20" in busy.stderr


@contextlib.contextmanager
def immutable(path: Path):
    """``chattr +i``: not even root may write it (the tests run as root)."""
    subprocess.run(["chattr", "+i", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.parametrize("kind", sorted(TARGETS))
def test_a_read_only_target_is_refused_as_such_before_the_target(kind: str, tmp_path: Path) -> None:
    """Not "locked or damaged, a retry may succeed" (exit 1): a retry cannot fix it (exit 2)."""
    target = None if kind == "sqlite" else kind
    route_file = write_route(tmp_path, rows=40, path="legacy", kind=target)
    assert run_cli("run", route_file).returncode == 0
    build_sample_source(tmp_path / "source.db", rows=10, partitions=4, start_id=41)
    with immutable(tmp_path / TARGETS[kind]):
        refused = run_cli("run", route_file)
    assert refused.returncode == 2, refused.stderr
    assert "is read-only (its file or folder" in refused.stderr
    assert str(tmp_path) not in refused.stderr
    assert run_cli("run", route_file).returncode == 0  # writable again: it runs
