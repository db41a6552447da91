"""Runs NativeTransferOperator under real Apache Airflow for tests/operator/test_airflow.py.

A separate process because Airflow reads its configuration (AIRFLOW_HOME) and
emits warnings at import, which the pytest process must not see. Usage::

    python tests/helpers/airflow_child.py dag REQUEST.json RESULT.json     # dag.test() on a DAG
    python tests/helpers/airflow_child.py checks REQUEST.json RESULT.json  # the operator, directly

``dag`` runs ``dag.test()`` ``runs`` times on the DAG file: Airflow's own
scheduling loop, so a failed try goes through Airflow's retry handling (state
``up_for_retry``, ``try_number`` + 1). The only instrumentation is the
operator's documented seam, ``NativeTransferOperator._run_transfer``: it
counts the target calls of every try (``RecordingSink``) and, on the first
try only, injects the requested fault. The task log is this process's output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
from airflow.sdk import BaseOperator, Connection
from airflow.sdk.exceptions import AirflowFailException, AirflowTaskTerminated, AirflowTaskTimeout
from routes import write_route  # run as a script: its folder, tests/helpers, is sys.path[0]

from dpone_airflow.operator import NativeTransferOperator
from dpone_airflow.task import _dataset, connection_location
from dpone_native_transfer import SQLiteCheckpointStore
from dpone_native_transfer.application import transfer
from dpone_native_transfer.errors import ConfigInvalid, ManualReconciliationRequired
from dpone_native_transfer.testing import (
    FaultyStore,
    InjectedFault,
    RecordingSink,
    build_sample_source,
    guard_phase,
    phase_batch,
)

# Injected errors carry this text; dpone's own log lines must never repeat an error's text.
CANARY = "CANARY-3f9c-secret-from-a-connector-error"


class FlakySource:
    """A real source whose ``read`` fails: a failure before the target, as a network blip."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def read(self, *args: Any, **kwargs: Any) -> Any:
        raise InjectedFault(CANARY)

    def read_partitions(self, *args: Any, **kwargs: Any) -> Any:
        raise InjectedFault(CANARY)  # one scan of every partition fails the same way


def instrument(fault: str | None, table: str | None = None) -> list[dict[str, Any]]:
    """Replace the operator's seam: count target calls per try, inject ``fault`` on the first
    (with ``table``: on that source table's first try only)."""
    attempts: list[dict[str, Any]] = []

    def _run_transfer(self, config, run_id, events):
        record: dict[str, Any] = {"run_id": run_id, "sink_calls": 0, "error": None, "code": None}
        name = config.source.table
        first = (
            not attempts
            if table is None
            else (name == table and not any(a.get("table") == name for a in attempts))
        )
        if table is not None:  # the attempts are told apart by their table
            record["table"] = name
        attempts.append(record)
        sink, wrap_store = RecordingSink(config.sink), None
        if first and fault == "partial_commit":
            # The target commits, then the commit-checkpoint batch fails after 1 of N writes.
            def wrap_store(store):
                faulty = FaultyStore(store)
                faulty.fail_batch(
                    phase_batch("checkpoint_committed"), keep=1, error=InjectedFault(CANARY)
                )
                return faulty

        elif first and fault == "source_read":
            config = attrs.evolve(config, source=FlakySource(config.source))
        try:
            result, seconds = transfer(
                config, run_id, events=events, wrap_store=wrap_store, sink=sink
            )
        except BaseException as error:
            record["error"], record["code"] = type(error).__name__, getattr(error, "code", None)
            raise
        finally:
            record["sink_calls"] = sink.target_calls
        record["rows_loaded"] = result.rows_loaded
        return result, seconds

    NativeTransferOperator._run_transfer = _run_transfer
    return attempts


def load_dag(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("dpone_dag_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def run_dag(request: dict[str, Any]) -> dict[str, Any]:
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    attempts = instrument(request.get("fault"), request.get("fault_table"))
    dag = load_dag(request["dag_file"])
    runs = []
    for _ in range(request.get("runs", 1)):
        done = len(attempts)
        dag_run = dag.test()
        with create_session() as session:
            history = session.execute(
                select(TaskInstanceHistory.try_number, TaskInstanceHistory.state)
                .where(TaskInstanceHistory.run_id == dag_run.run_id)
                .order_by(TaskInstanceHistory.try_number)
            ).all()
            xcoms = session.execute(
                select(XComModel.value).where(
                    XComModel.run_id == dag_run.run_id, XComModel.key == "return_value"
                )
            ).all()
            instances = [
                {"task_id": ti.task_id, "try_number": ti.try_number, "state": str(ti.state)}
                | ({"map_index": ti.map_index} if ti.map_index >= 0 else {})
                for ti in sorted(
                    dag_run.get_task_instances(session=session), key=lambda ti: ti.map_index
                )
            ]
        runs.append(
            {
                "run_id": dag_run.run_id,
                "state": str(dag_run.state),
                "task_instances": instances,
                "history": [[number, str(state)] for number, state in history],
                "xcom": [XComModel.deserialize_value(SimpleNamespace(value=v)) for (v,) in xcoms],
                "attempts": attempts[done:],
            }
        )
    return {"runs": runs}


# -- checks: the operator called directly, as the task runner calls it ------------------------


class Probe(NativeTransferOperator):
    """The real operator; the seam adds a sink fault and remembers what the runtime raised."""

    sink_fail: str | None = None
    sink_error: BaseException | None = None

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.raised: BaseException | None = None
        self.lines: list[str] = []

    @property
    def log(self) -> Any:  # records what the real task logger is given, and forwards it
        return _Recorder(super().log, self.lines)

    def _run_transfer(self, config, run_id, events):
        sink = None
        if self.sink_fail is not None:
            sink = RecordingSink(config.sink, fail=self.sink_fail, error=self.sink_error)
        try:
            return transfer(config, run_id, events=events, sink=sink)
        except BaseException as error:
            self.raised = error
            raise


@attrs.define
class _Recorder:
    inner: Any
    lines: list[str]

    def info(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args)
        self.inner.info(msg, *args)

    def error(self, msg: str, *args: Any) -> None:
        self.lines.append(msg % args)
        self.inner.error(msg, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def context(try_number: int = 1) -> dict[str, Any]:
    ti = SimpleNamespace(
        dag_id="checks",
        run_id="manual__2026-11-29T10:00:00+00:00",
        task_id="copy_orders",
        try_number=try_number,
        map_index=-1,
    )
    return {"ti": ti}


def outcome(operator: Probe, try_number: int = 1) -> dict[str, Any]:
    """Execute once; what came out, and whether it is the very object the runtime raised."""
    try:
        value = operator.execute(context(try_number))
    except BaseException as error:
        return {
            "raised": type(error).__name__,
            "code": getattr(error, "code", None),
            "same_object": error is operator.raised,
            "is_fail_exception": isinstance(error, AirflowFailException),
            "cause": type(error.__cause__).__name__ if error.__cause__ else None,
            "cause_code": getattr(error.__cause__, "code", None),
            "message": str(error),
            "lines": operator.lines,
        }
    return {"returned": value, "json": json.loads(json.dumps(value)), "lines": operator.lines}


def route_file(folder: Path, *, store: str = "checkpoints.db", rows: int | None = None) -> Path:
    return write_route(folder, store=store, rows=rows)


def phases(folder: Path) -> list[str | None]:
    store = SQLiteCheckpointStore(str(folder / "checkpoints.db"))
    try:
        routes = store.list_routes()
        return sorted(str(guard_phase(cp)) for r in routes for cp in store.list_latest(r))
    finally:
        store.close()


def checks(request: dict[str, Any]) -> dict[str, Any]:
    from airflow.providers_manager import ProvidersManager

    results: dict[str, Any] = {}
    info = ProvidersManager().providers["dpone-native-transfer"]
    modules = [m for item in info.data["operators"] for m in item["python-modules"]]
    operators = [
        f"{name}.{cls.__name__}"
        for name in modules
        for cls in vars(importlib.import_module(name)).values()
        if isinstance(cls, type) and issubclass(cls, BaseOperator) and cls.__module__ == name
    ]
    results["provider"] = {"version": info.version, "data": info.data, "operators": operators}

    folder = Path(request["workdir"])
    build_sample_source(folder / "source.db", rows=60, partitions=3)
    route = route_file(folder)
    results["success"] = outcome(Probe(task_id="copy_orders", route=route))

    # A timeout and a termination raised while the target runs: untouched, marker written.
    for name, error, fail in (
        ("timeout", AirflowTaskTimeout(CANARY), "after"),
        ("terminated", AirflowTaskTerminated(CANARY), "before"),
    ):
        work = folder / name
        work.mkdir()
        build_sample_source(work / "source.db", rows=30, partitions=3)
        probe = Probe(task_id="copy_orders", route=route_file(work))
        probe.sink_fail, probe.sink_error = fail, error
        results[name] = outcome(probe) | {"phases": phases(work)}
        results[name]["same_as_injected"] = probe.raised is error
        results[f"{name}_retry"] = outcome(Probe(task_id="copy_orders", route=route_file(work)), 2)

    mapping = {
        "source": {
            "path": "source.db",
            "table": "orders",
            "partition_column": "region",
            "cursor_column": "updated_at",
        },
        "target": {"path": "mapped.db", "table": "orders_copy"},
        "transfer": {"strategy": "incremental_append", "path": "lazy-plan"},
        "store": {"path": "mapped-checkpoints.db"},
    }
    results["mapping"] = outcome(
        Probe(task_id="copy_orders", route=mapping, route_base_dir=str(folder))
    )
    results["missing_route"] = outcome(
        Probe(task_id="copy_orders", route=folder / f"{CANARY}.toml")
    )
    # Connections: one Airflow does not have, one of a type the section cannot use, and
    # what a PostgreSQL connection becomes (a URL libpq reads back field by field).
    results["unknown_connection"] = outcome(
        Probe(task_id="copy_orders", route=route, source_conn_id="no_such_conn")
    )
    os.environ["AIRFLOW_CONN_DPONE_HTTP"] = json.dumps(
        {"conn_type": "http", "host": "example.invalid", "password": CANARY}
    )
    results["wrong_connection_type"] = outcome(
        Probe(task_id="copy_orders", route=route, store_conn_id="dpone_http")
    )
    password = f"p@ss:w/rd {CANARY}"
    postgres = Connection(
        conn_id="pg", conn_type="postgres", host="db.example", port=6543, login="dpone",
        password=password, schema="shop", extra=json.dumps({"sslmode": "require", "x": "1"}),
    )  # fmt: skip
    dsn = connection_location("source_conn_id", postgres)["dsn"]
    import psycopg

    results["postgres_url"] = {
        "fields": psycopg.conninfo.conninfo_to_dict(dsn)
        == {
            "host": "db.example",
            "port": "6543",
            "user": "dpone",
            "password": password,
            "dbname": "shop",
            "sslmode": "require",
        },  # fmt: skip
        "store": connection_location("store_conn_id", postgres) == {"path": dsn},
    }
    # Lineage of the successful run above, and of a PostgreSQL source (never its password).
    lineage = Probe(task_id="copy_orders", route=route_file(folder / "lineage", rows=20))
    before = lineage.get_openlineage_facets_on_complete(None)
    outcome(lineage)
    facets = lineage.get_openlineage_facets_on_complete(None)
    results["lineage"] = {
        "before": [len(before.inputs), len(before.outputs)],
        "inputs": [[d.namespace, d.name] for d in facets.inputs],
        "outputs": [[d.namespace, d.name] for d in facets.outputs],
        "postgres": list(_dataset(dsn, "sales.orders")),
        "postgres_default_schema": list(_dataset(dsn, "orders")),
    }
    try:
        Probe(task_id="bad", route=42)
    except ConfigInvalid as error:
        results["bad_route_type"] = {"code": error.code, "diagnostics": error.diagnostics}
    results["workdir"] = str(folder)
    results["manual_reconciliation_is_plain"] = not issubclass(
        ManualReconciliationRequired, AirflowFailException
    )
    return results


def main(argv: list[str]) -> int:
    scenario, request_path, result_path = argv
    request = json.loads(Path(request_path).read_text())
    result = {"dag": run_dag, "checks": checks}[scenario](request)
    Path(result_path).write_text(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
