"""Which workers a pipeline's tables run in (``--workers``), and what a worker process sends
back. The runs themselves, in processes, are in test_pipelines.py (the twenty-table scenario
into PostgreSQL, signals, a worker killed)."""

from __future__ import annotations

import logging
import pickle
import subprocess
import sys

import attrs
import pytest
from helpers.cli import run_cli
from helpers.pipelines import build_tables, sqlite_ids, write_pipeline
from helpers.routes import write_route

from dpone_native_transfer.connectors.sqlite import SQLiteSink
from dpone_native_transfer.errors import ConfigInvalid
from dpone_native_transfer.pipeline import load_pipeline
from dpone_native_transfer.pipeline_run import (
    PROCESS_ROWS,
    TableRun,
    _Foreign,
    _sendable,
    chosen_workers,
    run_tables,
)
from dpone_native_transfer.reporting import Named, failure_lines

SERVER = {"kind": "postgres", "dsn": "postgresql://u:p@127.0.0.1:9/db"}  # never reached


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """t01 and t02 of half ``PROCESS_ROWS`` rows and 10 more; t03 and t04 of 10 rows."""
    path = tmp_path_factory.mktemp("source") / "shop.db"
    build_tables(path, 2, PROCESS_ROWS // 2)
    build_tables(path, 4, 10, start_id=PROCESS_ROWS + 1)
    return path


def _tables(tmp_path, source, target, tables):
    file = write_pipeline(
        tmp_path / "p.toml", source={"path": str(source)}, target=target,
        store=str(tmp_path / "c.db"), tables=tables,
    )  # fmt: skip
    return load_pipeline(file, rows=True).tables


@pytest.mark.parametrize(
    ("tables", "jobs", "target", "expected"),
    [
        (["t01", "t02"], 2, SERVER, "processes"),  # PROCESS_ROWS and 20 rows in all
        (["t01", "t02"], 1, SERVER, "threads"),  # one at a time: nothing to share
        (["t01", "t03", "t04"], 2, SERVER, "threads"),  # too little work for the start
        (["t01", "t02"], 2, {"path": "w.db"}, "threads"),  # a file's writes: not measured
        (["t01", "t02"], 2, {"kind": "duckdb", "path": "w.duckdb"}, "threads"),  # one process
    ],
    ids=["into-postgres", "one-job", "few-rows", "into-sqlite", "into-duckdb"],
)
def test_auto_runs_large_tables_read_in_python_into_a_server_in_processes(
    tmp_path, source, tables, jobs, target, expected
):
    assert chosen_workers(_tables(tmp_path, source, target, tables), jobs) == expected


def test_processes_are_refused_for_a_target_one_process_opens(tmp_path, source):
    tables = _tables(tmp_path, source, {"kind": "duckdb", "path": "w.duckdb"}, ["t01"])
    with pytest.raises(ConfigInvalid, match="--workers processes cannot run table 't01'"):
        chosen_workers(tables, 2, "processes")
    assert chosen_workers(tables, 2, "threads") == "threads"
    done = run_cli("run", tmp_path / "p.toml", "--workers", "processes")
    assert done.returncode == 2
    assert done.stderr.startswith("error: native_transfer_config_invalid: --workers processes")
    assert not (tmp_path / "w.duckdb").exists()  # refused before any table ran


@pytest.mark.parametrize("option", [("--workers", "threads"), ("--jobs", "2"), ("--tables", "t")])
def test_pipeline_options_are_for_a_pipeline_file_and_a_broken_file_says_why(tmp_path, option):
    route = write_route(tmp_path)
    done = run_cli("run", route, *option)
    assert done.returncode == 2
    assert f"{option[0]} is for a pipeline file" in done.stderr
    broken = tmp_path / "pipeline.toml"  # a pipeline file with a key given twice
    broken.write_text('[pipeline]\ntables = ["t"]\n[tables.t]\nlag = 1\nlag = 2\n')
    done = run_cli("run", broken, *option)
    assert done.returncode == 2
    assert done.stderr.startswith(
        "error: native_transfer_config_invalid: the file given as ROUTE is not valid TOML"
    )


class _Unpicklable(Exception):
    """A driver's error that pickles but does not load (its own __init__ arguments)."""

    def __init__(self, code: int, text: str) -> None:
        super().__init__(text)
        self.code = code


def test_a_failure_that_does_not_pickle_is_reported_by_its_type_name():
    try:
        raise _Unpicklable(7, "SELECT secret FROM t")
    except _Unpicklable as error:
        failure = error
    run = TableRun("t01", "t01", "failed", {}, error="_Unpicklable", exit_code=1, failure=failure)
    received = pickle.loads(pickle.dumps(_sendable(run)))
    assert isinstance(received.failure, _Foreign)
    shown = received.failure.standing_in()
    assert type(shown).__name__ == "_Unpicklable"
    assert "secret" not in repr(shown)
    assert failure_lines(shown, Named(None, None, True)) == [
        "error: transfer failed with _Unpicklable"
    ]
    assert any("test_worker_processes.py" in note for note in shown.__notes__)  # its frames
    assert attrs.evolve(received, failure=None) == attrs.evolve(run, failure=None)


def test_a_worker_process_that_cannot_start_fails_its_table_and_the_first_job_runs_here(
    tmp_path, source, monkeypatch
):
    """The first job runs in this process (no interpreter to start); the second job's worker
    cannot start, which fails the table it was given, and nothing else."""
    tables = _tables(tmp_path, source, {"path": "w.db"}, ["t01", "t03"])
    monkeypatch.setattr("sys.executable", str(tmp_path / "no-such-python"))
    result = run_tables(tables, "run-1", jobs=2, workers="processes")
    outcomes = sorted((run.outcome, run.error) for run in result.tables)
    assert outcomes == [("failed", "WorkerProcessEnded"), ("succeeded", None)]
    assert result.exit_code == 1
    ran = next(run.table for run in result.tables if run.outcome == "succeeded")
    assert sqlite_ids(tmp_path / "w.db", ran) == sqlite_ids(source, ran)


def test_one_job_in_processes_starts_no_worker_and_says_threads(tmp_path, source, monkeypatch):
    """The first job runs in this process: with one job no worker starts (none could here),
    and the result does not claim worker processes."""
    tables = _tables(tmp_path, source, {"path": "w.db"}, ["t03", "t04"])
    monkeypatch.setattr("sys.executable", str(tmp_path / "no-such-python"))
    result = run_tables(tables, "run-1", jobs=1, workers="processes")
    assert [run.outcome for run in result.tables] == ["succeeded", "succeeded"]
    assert result.workers == "threads"


def test_a_worker_that_ended_says_whether_its_route_is_blocked_now(tmp_path, source, monkeypatch):
    """A worker process killed inside its table's target call left the route blocked, and
    the summary's ``left_blocked`` said null: the events that tell it died with the worker.
    The store tells it: a table whose worker ended says so when its route is blocked now,
    and says nothing when it is not."""
    file = write_pipeline(
        tmp_path / "p.toml", source={"path": str(source)}, target={"path": "w.db"},
        store=str(tmp_path / "c.db"), tables=["t03", "t04"], defaults={"path": "legacy"},
    )  # fmt: skip
    tables = load_pipeline(file, rows=True).tables

    def ended() -> tuple[str | None, str | None]:  # the first job runs here, t03
        with monkeypatch.context() as patched:  # the second job's worker cannot start
            patched.setattr("sys.executable", str(tmp_path / "no-such-python"))
            runs = run_tables(tables, "run", jobs=2, workers="processes").tables
        return runs[1].error, runs[1].left_blocked

    assert ended() == ("WorkerProcessEnded", None)  # t04's route is not blocked

    def unknown(self, *args, **kwargs):
        raise RuntimeError("the connection dropped mid-load")  # the outcome is not known

    with monkeypatch.context() as patched:  # t04's target call raises: its route blocked
        patched.setattr(SQLiteSink, "load", unknown)
        blocking = run_tables(tables[1:], "run-1", jobs=1, workers="threads")
    assert blocking.tables[0].left_blocked is not None
    error, blocked = ended()
    assert error == "WorkerProcessEnded" and blocked is not None
    assert blocked.startswith("the worker process ended") and "guard verify" in blocked


def test_a_worker_whose_pipeline_process_was_killed_runs_its_table_and_ends_quietly(
    tmp_path, source
):
    """The pipeline's process killed (SIGKILL) while a worker ran a table: the worker's
    answer found no reader, and it printed a BrokenPipeError traceback. It ends quietly now,
    its table loaded and its lease released."""
    tables = _tables(tmp_path, source, {"path": "w.db"}, ["t03"])
    worker = subprocess.Popen(
        [sys.executable, "-m", "dpone_native_transfer.pipeline_worker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    worker.stdout.close()  # as the killed pipeline's end of the pipe is
    pickle.dump(("run-1", None, logging.WARNING), worker.stdin)
    pickle.dump(tables[0], worker.stdin)
    worker.stdin.close()
    with worker.stderr:
        assert worker.wait(timeout=60) == 0
        assert worker.stderr.read() == b""
    assert sqlite_ids(tmp_path / "w.db", "t03") == sqlite_ids(source, "t03")
    assert run_cli("run", tmp_path / "p.toml").returncode == 0  # nothing left held or blocked
