"""NativeTransferOperator: one guarded dpone run per Airflow try.

Airflow's retries are welcome: the correctness boundary is the runtime's
target-commit guard, which stops a retry before the target when an earlier
try may have committed. So a failure is re-raised as the very exception the
runtime raised (never turned into ``AirflowFailException``), and Airflow's
BaseException-based timeouts and terminations are not touched at all: the
runtime has already written its best-effort marker when they reach us.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from dpone_native_transfer import Event, TransferResult
from dpone_native_transfer.application import transfer
from dpone_native_transfer.config import RouteConfig

from .task import (
    RouteArgument,
    load_route,
    progress_logger,
    report_failure,
    report_success,
    route_argument,
    run_summary,
    task_run_id,
)

try:
    from airflow.sdk import BaseOperator
except ImportError as missing:  # pragma: no cover - exercised by the no-Airflow subprocess test
    raise ImportError(
        "NativeTransferOperator needs Apache Airflow 3: "
        "pip install 'dpone-native-transfer[airflow]'"
    ) from missing

__all__ = ["NativeTransferOperator"]


class NativeTransferOperator(BaseOperator):
    """Run the route ``route`` (a route TOML file, or a mapping with its sections) once per try.

    The checkpoint store is the route's ``[store] path``: a SQLite file when
    every try runs on one machine, a PostgreSQL DSN (best as ``env:NAME``)
    when tries can land on different workers. Relative files of a mapping
    resolve against ``route_base_dir`` (default: the worker's working folder).
    Returns a small JSON-safe summary (pushed as the task's XCom).
    """

    ui_color = "#d9ecf2"

    def __init__(
        self,
        *,
        route: RouteArgument,
        route_base_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.route = route_argument(route)
        self.route_base_dir = None if route_base_dir is None else os.fspath(route_base_dir)

    def execute(self, context: Any) -> dict[str, Any]:
        config = None
        try:
            config = load_route(self.route, base_dir=self.route_base_dir)
            run_id = _run_id(context)
            result, seconds = self._run_transfer(config, run_id, progress_logger(self.log))
        except Exception as error:
            report_failure(self.log, error, None if config is None else config.route)
            raise
        report_success(self.log, config, run_id, result, seconds)
        return run_summary(config, run_id, result, seconds)

    def _run_transfer(
        self, config: RouteConfig, run_id: str, events: Callable[[Event], None]
    ) -> tuple[TransferResult, float]:
        """The one call into the runtime (the CLI's ``run`` code path).

        The only seam for tests: a subclass may override it to wrap the store
        or the sink (``dpone_native_transfer.application.transfer`` takes
        ``wrap_store`` and ``sink``) and so inject faults or count target calls.
        """
        return transfer(config, run_id, events=events)


def _run_id(context: Any) -> str:
    ti = context["ti"]
    return task_run_id(
        dag_id=ti.dag_id,
        run_id=ti.run_id,
        task_id=ti.task_id,
        try_number=ti.try_number,
        map_index=getattr(ti, "map_index", None),
    )
