"""NativeTransferOperator: one guarded dpone run per Airflow try.

Airflow's retries are welcome: the correctness boundary is the runtime's
target-commit guard, which stops a retry before the target when an earlier
try may have committed. So a failure is re-raised as the very exception the
runtime raised, blocked routes included; only a configuration error (the
CLI's exit 2: a bad route, a missing table or column) becomes
``AirflowFailException``, because no retry can heal it. Airflow's
BaseException-based timeouts and terminations are not touched at all: the
runtime has already written its best-effort marker when they reach us.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from dpone_native_transfer import ConfigInvalid, Event, NativeTransferError, TransferResult
from dpone_native_transfer.application import transfer
from dpone_native_transfer.config import RouteConfig
from dpone_native_transfer.reporting import Named

from .task import (
    CONNECTION_ARGUMENTS,
    RouteArgument,
    connection_location,
    is_config_error,
    lineage_datasets,
    load_route,
    pipeline_reference,
    progress_logger,
    report_failure,
    report_success,
    route_argument,
    run_summary,
    task_run_id,
)
from .task import pipeline_tables as _pipeline_tables

try:
    from airflow.sdk import BaseHook, BaseOperator
    from airflow.sdk.exceptions import AirflowFailException, AirflowNotFoundException
except ImportError as missing:  # pragma: no cover - exercised by the no-Airflow subprocess test
    raise ImportError(
        "NativeTransferOperator needs Apache Airflow 3: "
        "pip install 'dpone-native-transfer[airflow]'"
    ) from missing

__all__ = ["NativeTransferOperator", "pipeline_tables"]


def pipeline_tables(pipeline: str | os.PathLike[str]) -> list[str]:
    """The tables of the pipeline file ``pipeline``, in its order, as ``table`` values to map
    ``NativeTransferOperator`` over (``task.pipeline_tables``; call it in a task). A bad
    file fails that task without retries (``AirflowFailException``), as the operator's
    tasks fail on a bad route: it raised the error itself, which Airflow retried."""
    try:
        return _pipeline_tables(pipeline)
    except NativeTransferError as error:
        if not is_config_error(error):
            raise
        raise AirflowFailException(
            f"{error.code}: the pipeline file cannot run as written (see its message); "
            "failing without retries, since a retry would fail the same way"
        ) from error


class NativeTransferOperator(BaseOperator):
    """Run the route ``route`` (a route TOML file, or a mapping with its sections) once per try,
    or the table ``table`` of the pipeline file ``pipeline`` (its route, ``PIPELINE::TABLE``):
    ``NativeTransferOperator.partial(task_id=..., pipeline=...).expand(table=[...])`` maps
    one task per table, each guarded on its own (``dpone_airflow.operator.pipeline_tables`` lists
    them; docs/airflow.md).

    The checkpoint store is the route's ``[store] path``: a SQLite file when
    every try runs on one machine, a PostgreSQL DSN (best as ``env:NAME``)
    when tries can land on different workers. Relative files of a mapping
    resolve against ``route_base_dir`` (default: the worker's working folder).
    ``source_conn_id``, ``target_conn_id`` and ``store_conn_id`` name Airflow
    connections that replace the route's own locations (docs/airflow.md).
    ``run_id`` (templated, default: Airflow's run id) is the middle of each
    try's dpone run id. ``recovery`` (``"manual"`` or ``"from_target"``) overrides the
    route's ``[guard] recovery``: with ``"from_target"`` a try resolves, before it touches
    the target, the batches a killed try left blocked whose outcome the target's ledger
    proves (docs/airflow.md). Returns a small JSON-safe summary (pushed as the task's XCom).
    """

    template_fields: Sequence[str] = (
        "route",
        "pipeline",
        "table",
        "route_base_dir",
        "run_id",
        *CONNECTION_ARGUMENTS,
    )
    ui_color = "#d9ecf2"

    def __init__(
        self,
        *,
        route: RouteArgument | None = None,
        pipeline: str | os.PathLike[str] | None = None,
        table: str | None = None,
        route_base_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        source_conn_id: str | None = None,
        target_conn_id: str | None = None,
        store_conn_id: str | None = None,
        recovery: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.recovery = recovery  # None: the route's [guard] recovery
        self.route = route_argument(route, pipeline=pipeline, table=table)
        self.pipeline = None if pipeline is None else os.fspath(pipeline)
        self.table = table
        self.route_base_dir = None if route_base_dir is None else os.fspath(route_base_dir)
        self.run_id = run_id
        self.source_conn_id = source_conn_id
        self.target_conn_id = target_conn_id
        self.store_conn_id = store_conn_id
        self._lineage: tuple[list[tuple[str, str]], list[tuple[str, str]]] = ([], [])

    def execute(self, context: Any) -> dict[str, Any]:
        config = None
        try:
            locations = self._connection_locations()
            config = load_route(
                self._reference(), base_dir=self.route_base_dir, locations=locations
            )
            run_id = _run_id(context, self.run_id)
            result, seconds = self._run_transfer(config, run_id, progress_logger(self.log))
        except Exception as error:
            reference = self._reference()
            route_file = None if isinstance(reference, dict) else reference
            store = None if config is None else config.store_path
            named = Named(route_file=route_file, store=store, scripted=True)
            report_failure(self.log, error, None if config is None else config.route, named)
            if isinstance(error, NativeTransferError) and is_config_error(error):
                raise AirflowFailException(
                    f"{error.code}: the route cannot run as configured (see the dpone lines "
                    "above); failing without retries, since a retry would fail the same way"
                ) from error
            raise
        self._lineage = lineage_datasets(config)
        report_success(self.log, config, run_id, result, seconds)
        return run_summary(config, run_id, result, seconds)

    def _reference(self) -> str | dict[str, Any]:
        """The route file, its mapping, or the pipeline's table as ``PIPELINE::TABLE``."""
        if self.pipeline is not None:
            return pipeline_reference(self.pipeline, self.table)
        assert self.route is not None  # route_argument refuses neither
        return self.route

    def _connection_locations(self) -> dict[str, dict[str, str]]:
        """The route locations from the named Airflow connections, looked up on the worker."""
        locations = {}
        for argument, section in CONNECTION_ARGUMENTS.items():
            conn_id = getattr(self, argument)
            if not conn_id:
                continue
            try:
                connection = BaseHook.get_connection(conn_id)
            except AirflowNotFoundException:
                raise ConfigInvalid(
                    f"{argument} names a connection that Airflow does not have",
                    diagnostics={"argument": argument},
                ) from None
            locations[section] = connection_location(argument, connection)
        return locations

    def _run_transfer(
        self, config: RouteConfig, run_id: str, events: Callable[[Event], None]
    ) -> tuple[TransferResult, float]:
        """The one call into the runtime (the CLI's ``run`` code path).

        The only seam for tests: a subclass may override it to wrap the store
        or the sink (``dpone_native_transfer.application.transfer`` takes
        ``wrap_store`` and ``sink``) and so inject faults or count target calls.
        """
        return transfer(config, run_id, events=events, recovery=self.recovery)

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The tables read and written, for the OpenLineage provider (None without it)."""
        try:
            from airflow.providers.common.compat.openlineage.facet import Dataset
            from airflow.providers.openlineage.extractors import OperatorLineage
        except ImportError:
            return None
        inputs, outputs = self._lineage
        return OperatorLineage(
            inputs=[Dataset(namespace=space, name=name) for space, name in inputs],
            outputs=[Dataset(namespace=space, name=name) for space, name in outputs],
        )


def _run_id(context: Any, run_id: str | None) -> str:
    ti = context["ti"]
    return task_run_id(
        dag_id=ti.dag_id,
        run_id=run_id or ti.run_id,
        task_id=ti.task_id,
        try_number=ti.try_number,
        map_index=getattr(ti, "map_index", None),
    )
