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
from collections.abc import Callable, Mapping
from typing import Any, Protocol
from urllib.parse import quote, unquote, urlencode, urlsplit

import attrs

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
    route_config_from_mapping,
)
from dpone_native_transfer.pipeline import REFERENCE, load_pipeline
from dpone_native_transfer.pipeline import load_route as load_route_file
from dpone_native_transfer.reporting import (
    EXIT_CONFIG,
    Named,
    exit_code_for,
    failure_lines,
    progress_lines,
    run_summary,
    summary_line,
)
from dpone_target_commit_guard.policy import scan_hint

__all__ = [
    "CONNECTION_ARGUMENTS",
    "RouteArgument",
    "TaskLog",
    "connection_location",
    "is_config_error",
    "lineage_datasets",
    "load_route",
    "pipeline_reference",
    "pipeline_tables",
    "progress_logger",
    "report_failure",
    "report_success",
    "route_argument",
    "run_summary",
    "task_run_id",
]

RouteArgument = str | os.PathLike[str] | Mapping[str, Any]

# Airflow allows these in run ids by default; anything else is percent-encoded, so the run
# id is safe to print in a shell command line or a log, and two Airflow ids never give one
_SAFE_RUN_ID = "_.~:+-"


class TaskLog(Protocol):
    """The part of a logger the task uses (Airflow's ``self.log``, or a stdlib logger)."""

    def debug(self, msg: str, /, *args: Any) -> object: ...

    def info(self, msg: str, /, *args: Any) -> object: ...

    def error(self, msg: str, /, *args: Any) -> object: ...


def route_argument(
    route: Any, *, pipeline: Any = None, table: Any = None
) -> str | dict[str, Any] | None:
    """The operator's ``route`` as given in a DAG: a route file path, or its sections as a dict;
    None when the DAG gives ``pipeline`` (and ``table``) instead.

    Checked when the DAG is parsed (only the type: the file is read by the
    task, on the worker); a mapping is copied, so the DAG can't change it later.
    """
    if pipeline is not None or table is not None:
        if route is not None or not isinstance(pipeline, str | os.PathLike):
            raise ConfigInvalid(
                "give route, or pipeline (a pipeline file path) and table, not both",
                diagnostics={"key": "pipeline"},
            )
        return None
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


def pipeline_reference(pipeline: str | os.PathLike[str], table: str | None) -> str:
    """The route of ``table`` in the pipeline file ``pipeline``: ``PIPELINE::TABLE``."""
    if not isinstance(table, str) or not table.strip():
        raise ConfigInvalid(
            "table must name one table of the pipeline (a string)", diagnostics={"key": "table"}
        )
    return f"{os.fspath(pipeline)}{REFERENCE}{table}"


def pipeline_tables(pipeline: str | os.PathLike[str]) -> list[str]:
    """The tables of the pipeline file ``pipeline``, in its order, as ``table`` values to map
    ``NativeTransferOperator`` over. It reads the source's catalog (the pipeline's patterns),
    so call it in a task (``operator.pipeline_tables``, which fails a bad file without
    retries; this one raises the error itself), not while the DAG is parsed."""
    return load_pipeline(pipeline, argument="pipeline").names


def load_route(
    route: RouteArgument,
    *,
    base_dir: str | None = None,
    locations: Mapping[str, Mapping[str, str]] | None = None,
) -> RouteConfig:
    """The validated route; relative files in a mapping resolve against ``base_dir``.

    ``locations`` (from Airflow connections) replace the route's own location keys.
    """
    if isinstance(route, Mapping):
        return route_config_from_mapping(route, base_dir=base_dir, locations=locations)
    return load_route_file(route, argument="route", locations=locations)


def is_config_error(error: BaseException) -> bool:
    """The CLI's exit-2 class (bad route, missing table or column): no retry can heal it."""
    return exit_code_for(error) == EXIT_CONFIG


# -- Airflow connections as route locations ---------------------------------------------------

# The operator's connection arguments and the route section each one locates.
CONNECTION_ARGUMENTS = {
    "source_conn_id": "source",
    "target_conn_id": "target",
    "store_conn_id": "store",
}
# (section, connection type) -> the route key the connection's location goes to
_CONNECTION_KEYS = {
    ("source", "postgres"): "dsn",
    ("source", "sqlite"): "path",
    ("target", "sqlite"): "path",
    ("target", "duckdb"): "path",
    ("target", "chdb"): "path",
    ("target", "clickhouse"): "url",
    ("store", "postgres"): "path",
    ("store", "sqlite"): "path",
}
_FILE_TYPES = ("sqlite", "duckdb", "chdb")
# Connection extras passed on as URL query parameters: libpq's, which the store and source use.
_POSTGRES_OPTIONS = (
    "sslmode",
    "sslcert",
    "sslkey",
    "sslrootcert",
    "sslcrl",
    "connect_timeout",
    "application_name",
    "options",
    "target_session_attrs",
)


def connection_location(argument: str, connection: Any) -> dict[str, str]:
    """The route location keys that an Airflow connection stands for, in ``argument``'s section.

    postgres: a ``postgresql://`` URL from host, port, schema (the database),
    login and password, with libpq's extras (``sslmode``...) as its query;
    clickhouse: a ``clickhouse://`` URL from the same fields; sqlite, duckdb,
    chdb: a file (chDB: a data folder), extra ``path`` or else host. Errors
    name the argument and the connection's type, never a field's value.
    """
    section = CONNECTION_ARGUMENTS[argument]
    kind = str(getattr(connection, "conn_type", None) or "")
    key = _CONNECTION_KEYS.get((section, kind))
    if key is None:
        takes = sorted(k for s, k in _CONNECTION_KEYS if s == section)
        raise ConfigInvalid(
            f"{argument} names a connection of type {kind!r}, which the route's {section} "
            f"cannot use; it takes: {', '.join(takes)}",
            diagnostics={"argument": argument, "conn_type": kind},
        )
    extra = getattr(connection, "extra_dejson", None) or {}
    if kind in _FILE_TYPES:
        location = str(extra.get("path") or connection.host or "")
    else:
        location = "" if not connection.host else _server_url(kind, connection, extra)
    if not location:
        what = "no file (extra path, or host)" if kind in _FILE_TYPES else "no host"
        raise ConfigInvalid(
            f"{argument} names a connection of type {kind!r} with {what}",
            diagnostics={"argument": argument, "conn_type": kind},
        )
    return {key: location}


def _server_url(kind: str, connection: Any, extra: Mapping[str, Any]) -> str:
    auth = ""
    if connection.login:
        auth = quote(str(connection.login), safe="")
        if connection.password:
            auth += ":" + quote(str(connection.password), safe="")
        auth += "@"
    port = f":{connection.port}" if connection.port else ""
    database = f"/{quote(str(connection.schema), safe='')}" if connection.schema else ""
    scheme = "postgresql" if kind == "postgres" else kind
    options = _POSTGRES_OPTIONS if kind == "postgres" else ()
    query = urlencode({k: str(extra[k]) for k in options if extra.get(k) not in (None, "")})
    return f"{scheme}://{auth}{connection.host}{port}{database}" + (f"?{query}" if query else "")


# -- OpenLineage datasets ---------------------------------------------------------------------


def lineage_datasets(config: RouteConfig) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The (namespace, name) of the table read and of the table written, as OpenLineage names
    datasets: a server by host and port (never a user or a password), a file by its path."""
    read = _dataset(config.source_location, config.source.table)
    written = _dataset(config.target_location, config.sink.table)
    return ([read] if read else []), ([written] if written else [])


def _dataset(location: str, table: str) -> tuple[str, str] | None:
    if not location:
        return None
    if "://" not in location:  # a file (SQLite, DuckDB) or a folder (chDB)
        return "file", f"{location}/{table}"
    try:
        parts = urlsplit(location)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "localhost").lower()
    database = unquote(parts.path.lstrip("/"))
    if scheme in ("postgres", "postgresql"):
        user = unquote(parts.username or "")
        schema, _, name = table.rpartition(".")
        return (
            f"postgres://{host}:{port or 5432}",
            f"{database or user or 'postgres'}.{schema or 'public'}.{name}",
        )
    if scheme in ("clickhouse", "http", "https"):
        named = table if "." in table else f"{database or 'default'}.{table}"
        return f"clickhouse://{host}:{port or 8123}", named
    return None


def task_run_id(
    *, dag_id: str, run_id: str, task_id: str, try_number: int, map_index: int | None = -1
) -> str:
    """``dag/run/task[/map-N]/try-N``: one dpone run id per Airflow try, readable in evidence;
    a character Airflow does not allow by default is percent-encoded (a ``/`` as ``%2F``)."""
    parts = [dag_id, run_id, task_id]
    if map_index is not None and map_index >= 0:
        parts.append(f"map-{map_index}")
    parts.append(f"try-{try_number}")
    return "/".join(quote(str(part), safe=_SAFE_RUN_ID) for part in parts)


def progress_logger(log: TaskLog) -> Callable[[Event], None]:
    """The CLI's progress lines (one per extracted partition, one at the target), as log lines."""
    return progress_lines(lambda line: log.info("dpone: %s", line))


def report_success(
    log: TaskLog, config: RouteConfig, run_id: str, result: TransferResult, seconds: float
) -> None:
    log.info("dpone: %s", summary_line(config, run_id, result, seconds))


def report_failure(
    log: TaskLog, error: Exception, route: RouteKey | None, named: Named | None = None
) -> None:
    """Log what an operator needs about a failed run; the caller re-raises ``error`` itself.

    A dpone error gives its stable code and the lines ``reporting.failure_lines`` gives a
    person (for a blocked route one per blocked batch, the full diagnostics only at debug),
    its commands naming the route file and store when ``named`` knows them, with ``--yes``:
    the log is read by someone who runs them without a terminal to confirm on. Any other
    error is named by its type only: Airflow's own traceback follows in the same log.
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
    named = attrs.evolve(named or Named(), scripted=True)
    log.error("dpone: %s%s%s", error.code, where, _consequence(error))
    hint = "(the full diagnostics: at DEBUG, below)"
    for line in failure_lines(error, named, hint=hint)[1:]:  # the message: in the traceback
        log.error("dpone: %s", line.strip())
    for line in _operator_steps(error, route):
        log.error("dpone: %s", named.fill(line))
    full = json.dumps(error.diagnostics, sort_keys=True, default=str)
    log.debug("dpone: diagnostics: %s", full)


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
    if is_config_error(error):
        return (
            ": the route cannot run as configured (route, connection, table or column); "
            "a retry would fail the same way, so the task fails without retries"
        )
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
        "compare the blocked partitions with the target, record what it holds with "
        '`dpone-transfer guard resolve` (or let a try with recovery="from_target" resolve '
        "what the target proves), then clear this task or let the next DAG run start "
        "(docs/checkpoints-and-recovery.md)",
    ]
