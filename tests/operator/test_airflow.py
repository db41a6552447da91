"""NativeTransferOperator under real Apache Airflow 3, and the runtime's independence from it.

Airflow is an optional extra (``airflow``), outside the default ``test``
extra; these tests fail, never skip, when it is missing. Every real-Airflow
scenario runs in a child process (``helpers/airflow_child.py``) with its own
AIRFLOW_HOME, because Airflow reads its configuration and emits warnings at
import. The metadata database is migrated once per session and copied for
each test. ``dag.test()`` drives Airflow's own scheduling loop, so failed
tries go through Airflow's retry handling; the task log is the child's output.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import tomllib
from collections import Counter
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import psycopg
import pytest
from helpers.postgres_server import free_port

from dpone_airflow.task import (
    progress_logger,
    report_failure,
    route_argument,
    task_run_id,
)
from dpone_native_transfer import PostgresCheckpointStore, RouteKey
from dpone_native_transfer.application import transfer
from dpone_native_transfer.config import load_route_config
from dpone_native_transfer.errors import (
    CheckpointStoreUnavailable,
    ConfigInvalid,
    ManualReconciliationRequired,
    TargetCommitGuardUnhandled,
)
from dpone_native_transfer.testing import build_sample_source, guard_phase

ROOT = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
CHILD = TESTS / "helpers" / "airflow_child.py"
DOC = ROOT / "docs" / "airflow.md"
DOC_DAG = ROOT / "docs" / "examples" / "airflow" / "orders_copy_dag.py"
DOC_ROUTE = ROOT / "docs" / "examples" / "airflow" / "routes" / "orders.toml"
SHOP_DAG = ROOT / "docs" / "examples" / "airflow" / "shop_copy_dag.py"
MAPPING_DAG = TESTS / "airflow_dags" / "orders_mapping_dag.py"
CLI = str(Path(sys.executable).parent / "dpone-transfer")
CODE = "native_transfer_manual_reconciliation_required"
SCAN = (
    "dpone-transfer guard scan --store <checkpoint store> "
    "--route orders orders_copy incremental_append"
)
CHILD_TIMEOUT = 300


# -- the runtime domain does not need Airflow -----------------------------------------------

# Modules that must never import Airflow: the runtime, the guard, and the parts of the
# adapter that Airflow itself imports (provider.py) or that hold the Airflow-free logic.
AIRFLOW_FREE = [
    *sorted((ROOT / "src" / "dpone_native_transfer").rglob("*.py")),
    *sorted((ROOT / "plugins" / "dpone_target_commit_guard").rglob("*.py")),
    *(ROOT / "plugins" / "dpone_airflow" / name for name in ("__init__.py", "provider.py")),
    ROOT / "plugins" / "dpone_airflow" / "task.py",
]


def _imported_modules(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
        ):
            modules.add(str(node.args[0].value))
    return modules


def test_no_module_of_the_runtime_or_the_guard_imports_airflow():
    assert len(AIRFLOW_FREE) > 30
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in _imported_modules(path) if _is_airflow(m))
        for path in AIRFLOW_FREE
    }
    assert {path: found for path, found in offenders.items() if found} == {}


def _is_airflow(module: str) -> bool:
    return module == "airflow" or module.startswith("airflow.")


BLOCKED_AIRFLOW = textwrap.dedent(
    """
    import importlib.abc, json, sqlite3, sys

    class NoAirflow(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "airflow" or name.startswith("airflow."):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)

    sys.meta_path.insert(0, NoAirflow())
    import dpone_native_transfer, dpone_target_commit_guard, dpone_airflow
    from dpone_native_transfer import SQLiteCheckpointStore, SQLiteSink, SQLiteSource
    from dpone_native_transfer import TransferRuntime, TransferSpec
    from dpone_native_transfer.cli import build_parser
    from dpone_native_transfer.testing import build_sample_source, guard_phase
    from dpone_airflow.provider import get_provider_info
    from dpone_airflow.task import load_route, task_run_id
    try:
        import airflow
    except ModuleNotFoundError:
        blocked = True
    else:
        blocked = False
    build_parser()  # loads the guard's command plugin through its entry point
    build_sample_source("source.db", rows=40, partitions=2)
    store = SQLiteCheckpointStore("checkpoints.db")
    spec = TransferSpec(
        source=SQLiteSource("source.db", "orders", "region", cursor_column="updated_at"),
        sink=SQLiteSink("target.db", "orders_copy"),
        strategy="incremental_append",
        path="staged",
        run_id="no-airflow",
    )
    result = TransferRuntime(store).run(spec)
    route = spec.route
    guards = [cp.diagnostics["target_commit_guard"]["phase"] for cp in store.list_latest(route)]
    store.close()
    try:
        import dpone_airflow.operator
    except ImportError as error:
        operator_import = str(error)
    else:
        operator_import = None
    print(json.dumps({
        "blocked": blocked,
        "rows_loaded": result.rows_loaded,
        "guards": sorted(guards),
        "airflow_modules": sorted(m for m in sys.modules if m.split(".")[0] == "airflow"),
        "provider": get_provider_info()["package-name"],
        "operator_import": operator_import,
    }))
    """
)


def test_the_runtime_guard_and_cli_run_a_transfer_while_airflow_cannot_be_imported(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", BLOCKED_AIRFLOW],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert report["blocked"] is True
    assert report["rows_loaded"] == 40
    assert report["guards"] == ["checkpoint_committed", "checkpoint_committed"]
    assert report["airflow_modules"] == []
    assert report["provider"] == "dpone-native-transfer"
    assert "pip install 'dpone-native-transfer[airflow]'" in report["operator_import"]


# -- the operator's logic, without Airflow ----------------------------------------------------


def test_each_airflow_try_gets_its_own_shell_safe_run_id():
    one = task_run_id(
        dag_id="orders_copy",
        run_id="manual__2026-11-29T10:00:00+00:00",
        task_id="copy_orders",
        try_number=1,
    )
    assert one == "orders_copy/manual__2026-11-29T10:00:00+00:00/copy_orders/try-1"
    two = task_run_id(
        dag_id="orders_copy",
        run_id="manual__2026-11-29T10:00:00+00:00",
        task_id="copy_orders",
        try_number=2,
        map_index=3,
    )
    assert two == "orders_copy/manual__2026-11-29T10:00:00+00:00/copy_orders/map-3/try-2"
    odd = task_run_id(dag_id="d", run_id="a b/$(rm -rf)'\"", task_id="t", try_number=1)
    assert odd == "d/a%20b%2F%24%28rm%20-rf%29%27%22/t/try-1"
    assert task_run_id(dag_id="d", run_id="", task_id="t", try_number=1, map_index=None) == (
        "d//t/try-1"
    )
    others = ["\u00fc \u00f6", "\u00e4 \u00e5", "a/b", "a_b", "a%2Fb", "\n", "\t", "_"]
    made = [task_run_id(dag_id="d", run_id=r, task_id="t", try_number=1) for r in others]
    assert len(set(made)) == len(others)  # each its own: they were all "_" or "a_b" before
    assert all(run_id.isprintable() and " " not in run_id for run_id in made)


def test_the_route_argument_is_a_path_string_or_a_copied_mapping():
    assert route_argument(Path("/routes/orders.toml")) == "/routes/orders.toml"
    sections = {"source": {"path": "s.db"}, "store": {"path": "c.db"}}
    copied = route_argument(sections)
    sections["source"]["path"] = "changed.db"
    assert copied == {"source": {"path": "s.db"}, "store": {"path": "c.db"}}
    with pytest.raises(ConfigInvalid) as caught:
        route_argument(["orders.toml"])
    assert caught.value.diagnostics == {"key": "route"}


def test_a_bad_pipeline_file_fails_the_listing_task_without_retries(tmp_path):
    """The listing task raised ``ConfigInvalid``, which Airflow retries as any error; the
    file fails the same way each time, so ``operator.pipeline_tables`` raises
    ``AirflowFailException``, as the operator's tasks do for a bad route (a hostile check)."""
    from airflow.sdk.exceptions import AirflowFailException

    from dpone_airflow.operator import pipeline_tables

    bad = tmp_path / "pipeline.toml"
    bad.write_text("[pipeline]\ntables = 3\n")
    with pytest.raises(AirflowFailException) as caught:
        pipeline_tables(bad)
    assert isinstance(caught.value.__cause__, ConfigInvalid)
    assert str(tmp_path) not in str(caught.value)


@pytest.fixture
def task_log(caplog):
    caplog.set_level(logging.INFO, logger="dpone_airflow.test")
    return logging.getLogger("dpone_airflow.test")


ROUTE = RouteKey("orders", "orders_copy", "incremental_append")


def test_a_blocked_route_logs_its_code_diagnostics_and_the_scan_command_not_the_message(
    task_log, caplog
):
    diagnostics = {"route": ROUTE.as_dict(), "phases": ["checkpoint_incomplete"]}
    error = ManualReconciliationRequired("CANARY message text", diagnostics=diagnostics)
    caplog.set_level(logging.DEBUG, logger="dpone_airflow.test")
    report_failure(task_log, error, ROUTE)
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == (
        f"dpone: {CODE} (route orders -> orders_copy (incremental_append)): the route is blocked "
        "until an operator reconciles it; every retry stops here, before the target, so pause "
        "the DAG while you work on it"
    )
    assert lines[1] == "dpone: (the full diagnostics: at DEBUG, below)"
    assert lines[2] == f"dpone: inspect it with: {SCAN}"
    assert "guard resolve" in lines[3]
    assert lines[4] == "dpone: diagnostics: " + json.dumps(diagnostics, sort_keys=True)
    levels = [record.levelno for record in caplog.records]
    assert levels == [logging.ERROR] * 4 + [logging.DEBUG]
    assert "CANARY" not in caplog.text


def test_other_failures_log_only_their_code_or_type(task_log, caplog):
    report_failure(task_log, RuntimeError("CANARY password=hunter2"), ROUTE)
    report_failure(task_log, CheckpointStoreUnavailable("CANARY dsn"), ROUTE)
    report_failure(task_log, ConfigInvalid("CANARY", diagnostics={"key": "route"}), None)
    report_failure(task_log, TargetCommitGuardUnhandled("CANARY"), ROUTE)
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0].startswith(
        "dpone: transfer failed with RuntimeError "
        "(route orders -> orders_copy (incremental_append))"
    )
    assert lines[1:3] == [
        "dpone: native_transfer_checkpoint_store_unavailable "
        "(route orders -> orders_copy (incremental_append))",
        "dpone: diagnostics: {}",
    ]
    assert lines[3] == (
        "dpone: native_transfer_config_invalid: the route cannot run as configured (route, "
        "connection, table or column); a retry would fail the same way, so the task fails "
        "without retries"
    )
    assert lines[4] == 'dpone: diagnostics: {"key": "route"}'
    assert "no target-commit guard plugin" in lines[5]
    assert lines[7] == (
        "dpone: install or enable the target_commit_guard entry point on every worker"
    )
    assert "CANARY" not in caplog.text and "hunter2" not in caplog.text
    assert "guard scan" not in caplog.text


def test_progress_goes_to_the_task_log_as_the_cli_prints_it(tmp_path, task_log, caplog):
    build_sample_source(tmp_path / "source.db", rows=30, partitions=3)
    route = tmp_path / "route.toml"
    _write_route(route, _route_sections(tmp_path))
    result, _ = transfer(load_route_config(route), "run-1", events=progress_logger(task_log))
    lines = [record.getMessage() for record in caplog.records]
    assert result.rows_loaded == 30
    assert len(lines) == 4
    progress = (
        r"dpone: \[\d/3\] partition region=region-\d{3} \(p-\w+\) extracted 10 rows"
        r" \(\d+ rows so far, [\d,]+ rows/s\)"
    )
    assert all(re.fullmatch(progress, line) for line in lines[:3])
    assert lines[3] == "dpone: target: finalize_staged_load"


# -- real Airflow ---------------------------------------------------------------------------


def _require_airflow() -> None:
    """Fail (never skip) without Airflow 3: the `airflow` extra is part of the test set-up."""
    try:
        version = metadata.version("apache-airflow")
    except metadata.PackageNotFoundError:
        pytest.fail(
            "Apache Airflow is not installed; install the `airflow` extra "
            "(pip install -e '.[test,airflow]', as `make test` does)",
            pytrace=False,
        )
    if not version.startswith("3."):
        pytest.fail(f"these tests need Apache Airflow 3.x, found {version}", pytrace=False)


def _airflow_env(home: Path, dags: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PYTHONWARNINGS"))}
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(dags),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{home / 'airflow.db'}",
        # Retries run at once in tests; a DAG that sets no retry_delay takes this default.
        AIRFLOW__CORE__DEFAULT_TASK_RETRY_DELAY="0",
    )
    return env


@pytest.fixture(scope="session")
def migrated_airflow_db(tmp_path_factory) -> Path:
    """``airflow db migrate`` once per session; each test starts from a copy of the result."""
    _require_airflow()
    home = tmp_path_factory.mktemp("airflow-migrated")
    done = subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        env=_airflow_env(home, home / "dags"),
        cwd=home,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    return home / "airflow.db"


class Airflow:
    """A fresh AIRFLOW_HOME with a migrated metadata DB and an empty DAGs folder."""

    def __init__(self, root: Path, migrated_db: Path) -> None:
        self.root = root
        self.home = root / "airflow-home"
        self.dags = root / "dags"
        self.home.mkdir()
        self.dags.mkdir()
        shutil.copy(migrated_db, self.home / "airflow.db")
        self.env = _airflow_env(self.home, self.dags)
        self.calls = 0

    def run(self, scenario: str, **request: Any) -> tuple[dict[str, Any], str]:
        """Run the child; its JSON result, and its output: Airflow's log, the task log included."""
        self.calls += 1
        stem = self.root / f"{scenario}-{self.calls}"
        request_path, result_path, log_path = (
            stem.with_suffix(s) for s in (".request.json", ".result.json", ".log")
        )
        request_path.write_text(json.dumps(request))
        with open(log_path, "w") as log:
            done = subprocess.run(
                [sys.executable, str(CHILD), scenario, str(request_path), str(result_path)],
                env=self.env,
                cwd=self.root,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=CHILD_TIMEOUT,
            )
        output = log_path.read_text()
        assert done.returncode == 0, output[-6000:]
        return json.loads(result_path.read_text()), output


@pytest.fixture
def airflow(tmp_path, migrated_airflow_db) -> Airflow:
    return Airflow(tmp_path, migrated_airflow_db)


def _route_sections(folder: Path) -> dict[str, dict[str, Any]]:
    """The documented route file, pointed at this test's files."""
    sections = tomllib.loads(DOC_ROUTE.read_text())
    sections["source"]["path"] = str(folder / "source.db")
    sections["target"]["path"] = str(folder / "target.db")
    sections["store"]["path"] = str(folder / "checkpoints.db")
    return sections


def _write_route(path: Path, sections: dict[str, dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for name, table in sections.items():
        lines.append(f"[{name}]")
        lines.extend(f"{key} = {json.dumps(value)}" for key, value in table.items())
    path.write_text("\n".join(lines) + "\n")


def _ids(path: Path, table: str) -> Counter[int]:
    connection = sqlite3.connect(path)
    try:
        return Counter(row[0] for row in connection.execute(f"SELECT id FROM {table}"))
    finally:
        connection.close()


def _exactly_once(folder: Path) -> None:
    source, target = _ids(folder / "source.db", "orders"), _ids(folder / "target.db", "orders_copy")
    assert set(source) == set(target)
    assert set(target.values()) == {1}


def _dpone(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([CLI, *argv], capture_output=True, text=True, timeout=120)


_TASK_LINE = re.compile(r"\] (dpone: .*?)\s+\[airflow\.task\.operators\.dpone_airflow\.")


def _task_lines(log: str) -> list[str]:
    """The operator's own lines in the task log, without the log record decoration."""
    return [match[1] for match in _TASK_LINE.finditer(log)]


def test_airflow_retries_after_a_partial_commit_stop_before_the_sink_until_resolved(
    airflow, tmp_path
):
    data = tmp_path / "data"
    data.mkdir()
    build_sample_source(data / "source.db", rows=400, partitions=4)
    dag_file = airflow.dags / DOC_DAG.name
    shutil.copy(DOC_DAG, dag_file)
    _write_route(airflow.dags / "routes" / "orders.toml", _route_sections(data))

    # Try 1 loads the target, then fails writing the commit checkpoints (1 of 4 written).
    result, log = airflow.run("dag", dag_file=str(dag_file), fault="partial_commit")
    (run,) = result["runs"]
    assert run["state"] == "failed"
    assert run["task_instances"] == [{"task_id": "copy_orders", "try_number": 3, "state": "failed"}]
    assert [number for number, _ in run["history"]] == [1, 2]  # Airflow archived tries 1, 2
    assert log.count("new_state=up_for_retry") == 2  # not AirflowFailException's fail-fast
    tries = run["attempts"]
    assert [a["run_id"].rsplit("/", 1)[1] for a in tries] == ["try-1", "try-2", "try-3"]
    assert tries[0] | {"run_id": None} == {
        "run_id": None,
        "sink_calls": 1,
        "error": "InjectedFault",
        "code": None,
    }
    for stopped in tries[1:]:
        assert (stopped["error"], stopped["code"], stopped["sink_calls"]) == (
            "ManualReconciliationRequired",
            CODE,
            0,
        )
    _exactly_once(data)

    # The task log: Airflow's traceback of the original errors, and dpone's own lines.
    assert log.count(f"ManualReconciliationRequired: {CODE}:") == 2
    assert "AirflowFailException" not in log
    lines = _task_lines(log)
    blocked = [line for line in lines if line.startswith(f"dpone: {CODE}")]
    assert len(blocked) == 2
    # the commands to run name the store the route used (its file), with --yes: no terminal
    shown = [line for line in lines if line.startswith("dpone: inspect it with: ")]
    assert len(shown) == 2 and all(
        line.endswith("/checkpoints.db --route orders orders_copy incremental_append")
        for line in shown
    ), shown
    assert any(line.startswith("dpone: transfer failed with InjectedFault") for line in lines)
    commands = [line for line in lines if "dpone-transfer " in line]
    assert not [line for line in lines if "CANARY" in line]
    assert not [line for line in lines if str(data) in line and line not in commands]
    _doc_excerpt_matches(lines)

    # The operator's procedure, with the real CLI: scan, resolve the batch, scan again.
    store = str(data / "checkpoints.db")
    scan = _dpone("guard", "scan", "--store", store, "--json")
    assert scan.returncode == 3, scan.stderr
    findings = [json.loads(line) for line in scan.stdout.splitlines()]
    assert {f["phase"] for f in findings} == {"checkpoint_incomplete"}
    assert len(findings) == 3
    (batch,) = {f["batch_id"] for f in findings}
    route = ["--route", "orders", "orders_copy", "incremental_append"]
    resolve = _dpone(
        "guard", "resolve", "--store", store, *route, "--batch", batch, "--as", "committed",
        "--reason", "400 rows checked in orders_copy, one copy each", "--operator", "ci", "--yes",
    )  # fmt: skip
    assert resolve.returncode == 0, resolve.stderr
    assert _dpone("guard", "scan", "--store", store).returncode == 0

    # New DAG runs succeed: the first skips the resolved partitions (and closes their
    # generation without a target call), the second loads the rows added since.
    build_sample_source(data / "source.db", rows=100, partitions=4, start_id=401)
    result, log = airflow.run("dag", dag_file=str(dag_file), runs=2)
    healed, later = result["runs"]
    for run in (healed, later):
        assert run["state"] == "success"
        assert run["task_instances"] == [
            {"task_id": "copy_orders", "try_number": 1, "state": "success"}
        ]
    assert [a["sink_calls"] for a in healed["attempts"]] == [0]
    assert [a["sink_calls"] for a in later["attempts"]] == [1]
    (summary,) = healed["xcom"]
    assert summary | {"run_id": None, "seconds": None} == {
        "route": ROUTE.as_dict(),
        "path": "staged",
        "path_ran": None,  # nothing new: no target call
        "run_id": None,
        "committed_partitions": 0,
        "skipped_partitions": 4,
        "rows_loaded": 0,
        "rows_quarantined": 0,
        "batch_id": None,
        "guarded": True,
        "seconds": None,
        "rows_per_second": 0,
    }
    assert summary["run_id"] == f"orders_copy/{healed['run_id']}/copy_orders/try-1"
    assert later["xcom"][0]["rows_loaded"] == 100
    assert later["xcom"][0]["committed_partitions"] == 4
    _exactly_once(data)
    assert any(line.startswith("dpone: committed 4 partitions") for line in _task_lines(log))


@pytest.fixture
def postgres_store_url(postgres_dsn) -> Iterator[str]:
    """The test server as the postgresql:// URL a route names; its store schema is dropped."""
    parts = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    url = (
        f"postgresql://{parts['user']}:{parts['password']}@{parts['host']}:{parts['port']}"
        f"/{parts['dbname']}"
    )
    drop = 'DROP SCHEMA IF EXISTS "dpone" CASCADE'
    with contextlib.closing(psycopg.connect(postgres_dsn, autocommit=True)) as admin:
        admin.execute(drop)
    yield url
    with contextlib.closing(psycopg.connect(postgres_dsn, autocommit=True)) as admin:
        admin.execute(drop)


def test_airflow_retries_still_heal_a_failure_before_the_target(airflow, postgres_store_url):
    data = airflow.dags / "data"
    data.mkdir()
    build_sample_source(data / "source.db", rows=300, partitions=3)
    dag_file = airflow.dags / MAPPING_DAG.name
    shutil.copy(MAPPING_DAG, dag_file)
    airflow.env["DPONE_STORE"] = postgres_store_url  # the workers' environment

    result, log = airflow.run("dag", dag_file=str(dag_file), fault="source_read")
    (run,) = result["runs"]
    assert run["state"] == "success"
    assert run["task_instances"] == [
        {"task_id": "copy_orders", "try_number": 2, "state": "success"}
    ]
    assert [number for number, _ in run["history"]] == [1]  # Airflow archived try 1
    assert log.count("new_state=up_for_retry") == 1
    first, second = run["attempts"]
    assert (first["error"], first["sink_calls"]) == ("InjectedFault", 0)
    assert (second["error"], second["sink_calls"], second["rows_loaded"]) == (None, 1, 300)
    assert run["xcom"][0]["rows_loaded"] == 300
    _exactly_once(data)
    with contextlib.closing(PostgresCheckpointStore(postgres_store_url)) as store:
        [route] = [r for r in store.list_routes() if r.as_dict() == ROUTE.as_dict()]
        latest = store.list_latest(route)
    assert [guard_phase(cp) for cp in latest] == ["checkpoint_committed"] * 3
    assert {cp.run_id for cp in latest} == {second["run_id"]}
    password = psycopg.conninfo.conninfo_to_dict(postgres_store_url)["password"]
    assert password not in log
    assert not [line for line in _task_lines(log) if "CANARY" in line]


def test_a_refused_store_login_fails_at_once_and_an_unreachable_store_is_retried(
    airflow, postgres_dsn
):
    """A wrong password (SQLSTATE 28P01) is a configuration error: ``AirflowFailException``,
    no retry, and neither the password nor the user shows in the task log. A store that
    does not answer (a closed port) keeps Airflow's retries (``retries=2``)."""
    data = airflow.dags / "data"
    data.mkdir()
    build_sample_source(data / "source.db", rows=30, partitions=3)
    dag_file = airflow.dags / MAPPING_DAG.name
    shutil.copy(MAPPING_DAG, dag_file)
    parts = psycopg.conninfo.conninfo_to_dict(postgres_dsn)
    password, user = "CANARY-AIRFLOW-PW", "canary_airflow_user"
    server = f"{parts['host']}:{parts['port']}/{parts['dbname']}"

    airflow.env["DPONE_STORE"] = f"postgresql://{user}:{password}@{server}"
    result, log = airflow.run("dag", dag_file=str(dag_file))
    (run,) = result["runs"]
    assert run["state"] == "failed"
    assert run["task_instances"] == [{"task_id": "copy_orders", "try_number": 1, "state": "failed"}]
    assert "new_state=up_for_retry" not in log
    assert [(a["error"], a["code"]) for a in run["attempts"]] == [
        ("CheckpointStoreAccessRefused", "native_transfer_checkpoint_store_unavailable")
    ]
    assert "AirflowFailException: native_transfer_checkpoint_store_unavailable" in log
    assert "the server refused the login: authentication failed" in log
    assert '"failure": "login_refused", "sqlstate": "28P01"' in log
    assert password not in log and user not in log and "FATAL" not in log

    airflow.env["DPONE_STORE"] = f"postgresql://{user}:{password}@127.0.0.1:{free_port()}/x"
    result, log = airflow.run("dag", dag_file=str(dag_file))
    (run,) = result["runs"]
    assert run["state"] == "failed"
    assert run["task_instances"] == [{"task_id": "copy_orders", "try_number": 3, "state": "failed"}]
    assert log.count("new_state=up_for_retry") == 2
    assert {a["error"] for a in run["attempts"]} == {"CheckpointStoreUnavailable"}
    assert "AirflowFailException" not in log
    assert password not in log and user not in log
    assert not (data / "target.db").exists()


def _connection(**fields: Any) -> str:
    """An Airflow connection in the JSON form its ``AIRFLOW_CONN_<ID>`` variable takes."""
    return json.dumps(fields)


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_documented_mapped_dag_runs_each_route_on_the_connections_databases(
    airflow, postgres_store_url
):
    """docs/examples/airflow/shop_copy_dag.py as written: its route files name /srv/data, which
    does not exist here; the connections name this test's files and the PostgreSQL store."""
    data = airflow.root / "data"
    data.mkdir()
    build_sample_source(data / "shop.db", rows=200, partitions=4)
    build_sample_source(data / "shop.db", table="customers", rows=60, partitions=3)
    dag_file = airflow.dags / SHOP_DAG.name
    shutil.copy(SHOP_DAG, dag_file)
    shutil.copytree(DOC_ROUTE.parent, airflow.dags / "routes")
    store = psycopg.conninfo.conninfo_to_dict(postgres_store_url)
    airflow.env.update(
        AIRFLOW_CONN_SHOP_DB=_connection(conn_type="sqlite", host=str(data / "shop.db")),
        AIRFLOW_CONN_WAREHOUSE_DB=_connection(
            conn_type="sqlite", extra={"path": str(data / "warehouse.db")}
        ),
        AIRFLOW_CONN_DPONE_STORE=_connection(
            conn_type="postgres",
            host=store["host"],
            port=int(store["port"]),
            login=store["user"],
            password=store["password"],
            schema=store["dbname"],
        ),
        AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(
            {"type": "file", "log_file_path": str(airflow.root / "lineage.jsonl"), "append": True}
        ),
    )

    result, log = airflow.run("dag", dag_file=str(dag_file))
    (run,) = result["runs"]
    assert run["state"] == "success"
    assert run["task_instances"] == [
        {"task_id": "copy", "try_number": 1, "state": "success", "map_index": index}
        for index in (0, 1)
    ]
    assert sorted(a["run_id"] for a in run["attempts"]) == [
        f"shop_copy/{run['run_id']}/copy/map-{index}/try-1" for index in (0, 1)
    ]
    assert sorted(x["rows_loaded"] for x in run["xcom"]) == [60, 200]
    for table in ("orders", "customers"):
        assert _ids(data / "shop.db", table) == _ids(data / "warehouse.db", f"{table}_copy")
    assert not Path("/srv/data").exists()  # the route files' own locations were never used
    with contextlib.closing(PostgresCheckpointStore(postgres_store_url)) as checkpoints:
        targets = sorted(route.target_table for route in checkpoints.list_routes())
    assert targets == ["customers_copy", "orders_copy"]
    assert store["password"] not in log

    # OpenLineage: each try's COMPLETE event names the table it read and the table it wrote.
    lineage = (airflow.root / "lineage.jsonl").read_text()
    assert store["password"] not in lineage
    complete = [
        event
        for event in _events(airflow.root / "lineage.jsonl")
        if event["eventType"] == "COMPLETE" and event["job"]["name"] == "shop_copy.copy"
    ]
    datasets = sorted(
        ([(d["namespace"], d["name"]) for d in event["inputs"]],
         [(d["namespace"], d["name"]) for d in event["outputs"]])
        for event in complete
    )  # fmt: skip
    assert datasets == [
        ([("file", f"{data}/shop.db/{table}")], [("file", f"{data}/warehouse.db/{table}_copy")])
        for table in ("customers", "orders")
    ]

    # A route naming a table the source lacks fails at once: Airflow does not retry it.
    customers = airflow.dags / "routes" / "customers.toml"
    customers.write_text(customers.read_text().replace('"customers"', '"no_such_table"'))
    result, log = airflow.run("dag", dag_file=str(dag_file))
    (run,) = result["runs"]
    assert run["state"] == "failed"
    assert run["task_instances"] == [
        {"task_id": "copy", "try_number": 1, "state": "success", "map_index": 0},
        {"task_id": "copy", "try_number": 1, "state": "failed", "map_index": 1},
    ]
    assert "new_state=up_for_retry" not in log
    assert "AirflowFailException: native_transfer_source_invalid" in log
    assert store["password"] not in log


PIPELINE_DAG = ROOT / "docs" / "examples" / "airflow" / "shop_pipeline_dag.py"
PIPELINE_FILE = ROOT / "docs" / "examples" / "airflow" / "pipelines" / "shop.toml"


def test_the_documented_pipeline_dag_maps_a_guarded_task_per_table(airflow, postgres_store_url):
    """docs/examples/airflow/shop_pipeline_dag.py as written, its pipeline file pointed at this
    test's files: a task per table; ``customers`` fails after its target commit on its first
    try, so its retries stop before the target and only its task fails; the PostgreSQL store
    (env:DPONE_STORE) is what every worker shares."""
    data = airflow.root / "data"
    data.mkdir()
    build_sample_source(data / "shop.db", rows=200, partitions=4)
    build_sample_source(data / "shop.db", table="customers", rows=60, partitions=3)
    build_sample_source(data / "shop.db", table="events", rows=90, partitions=3)
    build_sample_source(data / "shop.db", table="scratch_tmp", rows=5, partitions=1)
    dag_file = airflow.dags / PIPELINE_DAG.name
    shutil.copy(PIPELINE_DAG, dag_file)
    (airflow.dags / "pipelines").mkdir()
    (airflow.dags / "pipelines" / "shop.toml").write_text(
        PIPELINE_FILE.read_text().replace("/srv/data", str(data))
        + '[tables.customers]\npartition_column = "region"\n'  # 3 partitions: 1 promoted
    )
    airflow.env["DPONE_STORE"] = postgres_store_url

    result, log = airflow.run("dag", dag_file=str(dag_file), fault="partial_commit",
                              fault_table="customers")  # fmt: skip
    (run,) = result["runs"]
    assert run["state"] == "failed"
    assert run["task_instances"] == [
        {"task_id": "tables", "try_number": 1, "state": "success"},
        {"task_id": "copy", "try_number": 3, "state": "failed", "map_index": 0},  # customers
        {"task_id": "copy", "try_number": 1, "state": "success", "map_index": 1},  # events
        {"task_id": "copy", "try_number": 1, "state": "success", "map_index": 2},  # orders
    ]  # fmt: skip
    customers = [a for a in run["attempts"] if a["table"] == "customers"]
    assert [(a["code"], a["sink_calls"]) for a in customers] == [
        (None, 1),  # the target committed; the commit checkpoints failed
        (CODE, 0),
        (CODE, 0),
    ]
    for table in ("orders", "customers", "events"):  # every row exactly once
        source, target = _ids(data / "shop.db", table), _ids(data / "warehouse.db", f"{table}_copy")
        assert set(source) == set(target) and set(target.values()) == {1}
    assert not Path("/srv/data").exists()
    with contextlib.closing(PostgresCheckpointStore(postgres_store_url)) as checkpoints:
        targets = sorted(route.target_table for route in checkpoints.list_routes())
    assert targets == ["customers_copy", "events_copy", "orders_copy"]
    assert "dpone-transfer guard scan --store <checkpoint store> --route customers" in log
    assert postgres_store_url.split("@")[0].split(":")[-1] not in log  # the password


# -- the operator called directly, with Airflow imported ------------------------------------


@pytest.fixture(scope="module")
def checks(tmp_path_factory, migrated_airflow_db) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("airflow-checks")
    airflow = Airflow(root, migrated_airflow_db)
    airflow.env["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"  # execute() outside the task runner
    workdir = root / "work"
    workdir.mkdir()
    result, _ = airflow.run("checks", workdir=str(workdir))
    return result


def test_airflow_finds_the_provider_and_its_operator_through_the_entry_point(checks):
    provider = checks["provider"]
    assert provider["version"] == metadata.version("dpone-native-transfer")
    assert provider["data"]["package-name"] == "dpone-native-transfer"
    assert provider["operators"] == ["dpone_airflow.operator.NativeTransferOperator"]


def test_a_successful_try_returns_a_small_json_safe_summary(checks):
    success = checks["success"]
    assert success["returned"] == success["json"]
    timed = {"seconds": None, "batch_id": None, "rows_per_second": None}
    assert success["returned"] | timed == {
        "route": ROUTE.as_dict(),
        "path": "staged",
        "path_ran": "staged",
        "run_id": "checks/manual__2026-11-29T10:00:00+00:00/copy_orders/try-1",
        "committed_partitions": 3,
        "skipped_partitions": 0,
        "rows_loaded": 60,
        "rows_quarantined": 0,
        "batch_id": None,
        "guarded": True,
        "seconds": None,
        "rows_per_second": None,
    }
    assert success["returned"]["batch_id"].startswith("sha256:")
    assert checks["mapping"]["returned"]["rows_loaded"] == 60
    assert checks["mapping"]["returned"]["path"] == "lazy-plan"


@pytest.mark.parametrize("name", ["timeout", "terminated"])
def test_airflow_timeouts_and_terminations_pass_through_untouched_after_the_marker(checks, name):
    outcome = checks[name]
    expected = {"timeout": "AirflowTaskTimeout", "terminated": "AirflowTaskTerminated"}[name]
    assert outcome["raised"] == expected
    assert outcome["same_object"] and outcome["same_as_injected"]
    # Progress up to the target call, then nothing: the error was neither caught nor reported.
    assert outcome["lines"][-1] == "dpone: target: finalize_staged_load"
    assert len(outcome["lines"]) == 4
    assert outcome["phases"] == ["target_outcome_unknown"] * 3
    retry = checks[f"{name}_retry"]
    assert (retry["raised"], retry["code"]) == ("ManualReconciliationRequired", CODE)
    assert retry["same_object"] and not retry["is_fail_exception"]
    assert any(line.startswith("dpone: inspect it with: dpone-transfer guard scan --store ")
               for line in retry["lines"])  # fmt: skip
    assert checks["manual_reconciliation_is_plain"]


def test_a_bad_route_fails_with_its_code_and_never_logs_the_path(checks):
    missing = checks["missing_route"]
    assert missing["raised"] == "AirflowFailException"  # Airflow does not retry it
    assert (missing["cause"], missing["cause_code"]) == (
        "ConfigInvalid",
        "native_transfer_config_invalid",
    )
    assert missing["message"].startswith("native_transfer_config_invalid: ")
    assert "CANARY" not in missing["message"]
    assert missing["lines"][1] == 'dpone: diagnostics: {"argument": "route"}'
    assert not [line for line in missing["lines"] if "CANARY" in line]
    assert checks["bad_route_type"] == {
        "code": "native_transfer_config_invalid",
        "diagnostics": {"key": "route"},
    }


def test_connections_that_cannot_locate_the_route_fail_without_retries_or_secrets(checks):
    unknown, wrong = checks["unknown_connection"], checks["wrong_connection_type"]
    for failed in (unknown, wrong):
        assert failed["raised"] == "AirflowFailException"
        assert failed["cause_code"] == "native_transfer_config_invalid"
        assert not [line for line in failed["lines"] if "CANARY" in line]
        assert "CANARY" not in failed["message"]
    assert unknown["lines"][1] == 'dpone: diagnostics: {"argument": "source_conn_id"}'
    assert wrong["lines"][1] == (
        'dpone: diagnostics: {"argument": "store_conn_id", "conn_type": "http"}'
    )
    assert checks["postgres_url"] == {"fields": True, "store": True}


def test_lineage_names_the_tables_read_and_written_as_openlineage_does(checks):
    lineage = checks["lineage"]
    assert lineage["before"] == [0, 0]  # nothing is reported before a try succeeded
    folder = Path(checks["workdir"]) / "lineage"
    assert lineage["inputs"] == [["file", f"{folder}/source.db/orders"]]
    assert lineage["outputs"] == [["file", f"{folder}/target.db/orders_copy"]]
    server = "postgres://db.example:6543"
    assert lineage["postgres"] == [server, "shop.sales.orders"]
    assert lineage["postgres_default_schema"] == [server, "shop.public.orders"]


NO_OPENLINEAGE = textwrap.dedent(
    """
    import importlib.abc, json, sys
    from types import SimpleNamespace

    BLOCKED = ("openlineage", "airflow.providers.openlineage",
               "airflow.providers.common.compat.openlineage")

    class NoOpenLineage(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.startswith(BLOCKED):
                raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)

    from dpone_airflow.operator import NativeTransferOperator
    from dpone_native_transfer.testing import build_sample_source

    # Airflow's own provider discovery has loaded it: from here on it is as if uninstalled.
    for name in [m for m in sys.modules if m.startswith(BLOCKED)]:
        del sys.modules[name]
    sys.meta_path.insert(0, NoOpenLineage())

    build_sample_source("source.db", rows=20, partitions=2)
    sections = {
        "source": {"path": "source.db", "table": "orders", "partition_column": "region"},
        "target": {"path": "target.db", "table": "orders_copy"},
        "transfer": {"strategy": "incremental_append", "path": "staged"},
        "store": {"path": "checkpoints.db"},
    }
    operator = NativeTransferOperator(task_id="copy", route=sections, run_id="nightly 7")
    ti = SimpleNamespace(dag_id="d", run_id="manual", task_id="copy", try_number=1, map_index=-1)
    summary = operator.execute({"ti": ti})
    print(json.dumps({
        "rows_loaded": summary["rows_loaded"],
        "run_id": summary["run_id"],
        "facets": operator.get_openlineage_facets_on_complete(None),
        "loaded": sorted(m for m in sys.modules if "openlineage" in m),
        "template_fields": list(operator.template_fields),
    }))
    """
)


def test_without_the_openlineage_provider_the_operator_runs_and_reports_no_lineage(airflow):
    airflow.env["AIRFLOW__CORE__UNIT_TEST_MODE"] = "True"  # execute() outside the task runner
    done = subprocess.run(
        [sys.executable, "-c", NO_OPENLINEAGE],
        env=airflow.env,
        cwd=airflow.root,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["rows_loaded"] == 20
    assert report["run_id"] == "d/nightly%207/copy/try-1"  # the given run id, shell-safe
    assert report["facets"] is None
    assert report["loaded"] == []
    # and the operator module imports the provider only in that method, never at import
    top_level = ast.parse((ROOT / "plugins" / "dpone_airflow" / "operator.py").read_text())
    imported = {
        node.module for node in top_level.body if isinstance(node, ast.ImportFrom) and node.module
    } | {
        node.module
        for block in top_level.body if isinstance(block, ast.Try)
        for node in block.body if isinstance(node, ast.ImportFrom) and node.module
    }  # fmt: skip
    assert [module for module in imported if "openlineage" in module] == []
    assert {"route", "run_id", "source_conn_id", "store_conn_id"} <= set(report["template_fields"])


# -- docs/airflow.md ------------------------------------------------------------------------


def test_the_airflow_doc_shows_the_tested_dag_and_route_files():
    doc = DOC.read_text()
    assert DOC_DAG.read_text().strip() in doc
    assert SHOP_DAG.read_text().strip() in doc
    assert PIPELINE_DAG.read_text().strip() in doc
    customers = tomllib.loads((DOC_ROUTE.parent / "customers.toml").read_text())
    orders = tomllib.loads(DOC_ROUTE.read_text())
    orders["source"]["table"], orders["target"]["table"] = "customers", "customers_copy"
    assert customers == orders  # "laid out like orders.toml", as the doc says
    (route,) = re.findall(r"```toml\n(.*?)```", doc, flags=re.DOTALL)
    assert tomllib.loads(route) == tomllib.loads(DOC_ROUTE.read_text())
    assert "pip install 'dpone-native-transfer[airflow]'" in doc


def _doc_excerpt_matches(lines: list[str]) -> None:
    """Every ``dpone:`` line of the doc's log excerpt is a line of the real task log."""
    excerpt = _task_lines(DOC.read_text())
    assert len(excerpt) >= 4
    normalise = _normaliser()
    real = {normalise(line) for line in lines}
    missing = [line for line in excerpt if normalise(line) not in real]
    assert missing == [], "\n".join(sorted(real))


def _normaliser():
    hashes = re.compile(r"sha256:[0-9a-f]{64}|sha256:\.\.\.")
    partitions = re.compile(r"p-[0-9a-f]{24}|p-\.\.\.")
    rates = re.compile(r"[\d,]+ rows/s")  # the rate of the run that wrote the excerpt
    stores = re.compile(r"--store \S+/checkpoints\.db")  # the test's own folder

    def normalise(line: str) -> str:
        line = stores.sub("--store /srv/data/checkpoints.db", line)
        return rates.sub("N rows/s", partitions.sub("p-…", hashes.sub("sha256:…", line)))

    return normalise
