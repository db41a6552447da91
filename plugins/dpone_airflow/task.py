"""What NativeTransferOperator does, without Airflow: load a route, name the run, run it, report.

Kept free of any Airflow import so it can be tested (and reused by other
schedulers) without installing Airflow; ``operator.py`` only wires it into
``BaseOperator``. Everything logged here is safe: stable codes, the
diagnostics the errors define as safe, route names and counts. Never the
text of an exception (it can hold SQL, row values or credentials), nor the
store location (a DSN can hold a password, a file path can be private).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from dpone_native_transfer import (
    ConfigInvalid,
    Event,
    ManualReconciliationRequired,
    NativeTransferError,
    RouteBusy,
    RouteKey,
    StoreTargetMismatch,
    TargetCommitGuardInvalid,
    TargetCommitGuardUnhandled,
    TransferResult,
)
from dpone_native_transfer.config import (
    RouteConfig,
    load_route_config,
    route_config_from_mapping,
)
from dpone_native_transfer.reporting import progress_lines, shortened, summary_line
from dpone_target_commit_guard.policy import scan_hint

__all__ = [
    "RouteArgument",
    "TaskLog",
    "load_route",
    "progress_logger",
    "report_failure",
    "report_success",
    "route_argument",
    "run_summary",
    "task_run_id",
]

RouteArgument = str | os.PathLike[str] | Mapping[str, Any]

# Airflow allows these in run ids by default; anything else is replaced, so the
# run id is safe to print in a shell command line or a log.
_UNSAFE_RUN_ID = re.compile(r"[^A-Za-z0-9_.~:+-]+")


class TaskLog(Protocol):
    """The part of a logger the task uses (Airflow's ``self.log``, or a stdlib logger)."""

    def info(self, msg: str, /, *args: Any) -> object: ...

    def error(self, msg: str, /, *args: Any) -> object: ...


def route_argument(route: Any) -> str | dict[str, Any]:
    """The operator's ``route`` as given in a DAG: a route file path, or its sections as a dict.

    Checked when the DAG is parsed (only the type: the file is read by the
    task, on the worker); a mapping is copied, so the DAG can't change it later.
    """
    if isinstance(route, str | os.PathLike):
        return os.fspath(route)
    if isinstance(route, Mapping):
        return {
            name: dict(table) if isinstance(table, Mapping) else table
            for name, table in route.items()
        }
    raise ConfigInvalid(
        "route must be a route file path (TOML) or a mapping with the route file's sections",
        diagnostics={"key": "route"},
    )


def load_route(route: RouteArgument, *, base_dir: str | None = None) -> RouteConfig:
    """The validated route; relative files in a mapping resolve against ``base_dir``."""
    if isinstance(route, Mapping):
        return route_config_from_mapping(route, base_dir=base_dir)
    return load_route_config(route, argument="route")


def task_run_id(
    *, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int | None = -1
) -> str:
    """``dag/run/task[/map-N]/try-N``: one dpone run id per Airflow try, readable in evidence."""
    parts = [dag_id, run_id, task_id]
    if map_index is not None and map_index >= 0:
        parts.append(f"map-{map_index}")
    parts.append(f"try-{try_number}")
    return "/".join(_UNSAFE_RUN_ID.sub("_", str(part)) or "_" for part in parts)


def progress_logger(log: TaskLog) -> Callable[[Event], None]:
    """The CLI's progress lines (one per extracted partition, one at the target), as log lines."""
    return progress_lines(lambda line: log.info("dpone: %s", line))


def run_summary(
    config: RouteConfig, run_id: str, result: TransferResult, seconds: float
) -> dict[str, Any]:
    """The task's return value (Airflow pushes it as an XCom): small and JSON-safe."""
    return {
        "route": config.route.as_dict(),
        "path": config.path,
        "run_id": run_id,
        "committed_partitions": len(result.committed_partition_ids),
        "skipped_partitions": len(result.skipped_partition_ids),
        "rows_loaded": result.rows_loaded,
        "batch_id": result.batch_id,
        "seconds": round(seconds, 3),
    }


def report_success(
    log: TaskLog, config: RouteConfig, run_id: str, result: TransferResult, seconds: float
) -> None:
    log.info("dpone: %s", summary_line(config, run_id, result, seconds))


def report_failure(log: TaskLog, error: Exception, route: RouteKey | None) -> None:
    """Log what an operator needs about a failed run; the caller re-raises ``error`` itself.

    A dpone error gives its stable code and safe diagnostics; a blocked route
    also gives the command that shows what blocks it. Any other error is named
    by its type only: Airflow's own traceback follows in the same log.
    """
    where = "" if route is None else f" (route {route.label})"
    if not isinstance(error, NativeTransferError):
        log.error(
            "dpone: transfer failed with %s%s; the guard decides at the next attempt's route "
            "scan whether the target may be called again",
            type(error).__name__,
            where,
        )
        return
    log.error("dpone: %s%s%s", error.code, where, _consequence(error))
    short, cut = shortened(error.diagnostics)
    diagnostics = json.dumps(short, sort_keys=True, default=str)
    note = " (lists cut to their first items: guard scan shows all)" if cut else ""
    log.error("dpone: diagnostics: %s%s", diagnostics, note)
    for line in _operator_steps(error, route):
        log.error("dpone: %s", line)


def _consequence(error: NativeTransferError) -> str:
    if isinstance(error, ManualReconciliationRequired | TargetCommitGuardInvalid):
        return (
            ": the route is blocked until an operator reconciles it; every retry stops here, "
            "before the target, so pause the DAG while you work on it"
        )
    if isinstance(error, TargetCommitGuardUnhandled):
        return ": this worker has no target-commit guard plugin; the target was not called"
    if isinstance(error, StoreTargetMismatch):
        return (
            ": the checkpoint store and the target's ledger disagree; every retry stops here, "
            "before the target, so pause the DAG while you work on it"
        )
    if isinstance(error, RouteBusy):
        return ": another attempt is writing the target table; a later retry may succeed"
    if isinstance(error, ConfigInvalid):
        return ": the route configuration is invalid; a retry will fail the same way"
    return ""


def _operator_steps(error: NativeTransferError, route: RouteKey | None) -> list[str]:
    if isinstance(error, TargetCommitGuardUnhandled):
        return ["install or enable the target_commit_guard entry point on every worker"]
    if isinstance(error, StoreTargetMismatch):
        return [
            "see what the target holds with: dpone-transfer guard verify <route file>; "
            "the error above names the command that repairs this case "
            "(docs/checkpoints-and-recovery.md)"
        ]
    if route is None or not isinstance(
        error, ManualReconciliationRequired | TargetCommitGuardInvalid
    ):
        return []
    return [
        f"inspect it with: {scan_hint(route)}",
        "<checkpoint store> is the route's [store] path; compare the blocked partitions with the "
        "target, record what it holds with `dpone-transfer guard resolve`, then clear this task "
        "or let the next DAG run start (docs/checkpoints-and-recovery.md)",
    ]
