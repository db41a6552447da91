"""dpone-transfer: run a route from its TOML file, or watch the guard stop a duplicate append.

Exit codes are the interface schedulers see: 0 success, 1 failure, 2 bad
configuration or usage, 3 the route is blocked until an operator reconciles
it (retrying will not help). Failures that are not dpone's own errors are
reported by type name only: their messages can hold SQL, credentials or rows.

Plugins add subcommands through the entry-point group
``dpone_native_transfer.commands`` (the guard's operator commands live there,
because the runtime never imports the guard): each entry point is a function
``add(commands, common)`` shaped like ``_add_run_command`` below.

Argument wiring only: running a route is ``application.py``, what is printed
(exit codes, progress, summaries) is ``reporting.py``. No module of the
package or of its plugins imports this one: it is the console script.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

import attrs

from . import __version__
from .application import new_run_id, transfer
from .discover_command import add_discover_command
from .errors import ConfigInvalid, NativeTransferError, PluginLoadFailed, driver_error
from .events import Event
from .pipeline import PipelineTable, is_pipeline_file, load_pipeline, load_route
from .pipeline_run import (
    DEFAULT_JOBS,
    MAX_JOBS,
    WORKERS,
    TableRun,
    chosen_workers,
    pipeline_summary,
    pipeline_summary_lines,
    run_tables,
    table_progress_line,
)
from .rejects_command import add_rejects_command
from .reporting import (
    EXIT_BLOCKED,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    PROG,
    Named,
    Reached,
    exit_code_for,
    failure_lines,
    plural,
    progress_logger,
    run_summary,
    summary_line,
)
from .route_status import add_routes_command
from .state_commands import add_state_command
from .wording import one_line

# The exit codes are the command's interface (see the epilog), so they are named here too;
# they are defined, with the rest of what is printed, in ``reporting.py``.
__all__ = [
    "COMMANDS_GROUP",
    "EXIT_BLOCKED",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "PROG",
    "build_parser",
    "main",
]

COMMANDS_GROUP = "dpone_native_transfer.commands"

_EPILOG = """\
exit codes:
  0    success
  1    the transfer failed (a retry may succeed)
  2    the route file or the command line is invalid (a retry will not help)
  3    the route is blocked until an operator reconciles it (a retry will not help)
  130  interrupted (Ctrl-C)
  143  terminated (SIGTERM)
"""


class _OutputStream:
    """stdout or stderr whose reader may go away (``| head``): output never changes the outcome.

    After a broken pipe the rest of the output is dropped (the descriptor is
    pointed at /dev/null, so the interpreter's last flush does not fail either)
    and the command finishes as it would have, with its own exit status.
    Only ``main`` installs it, on the console process's own streams: a library
    caller or a scheduler owns its streams, so it lives here, not in ``reporting``.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point: returns the exit code instead of exiting."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, _OutputStream):
            setattr(sys, name, _OutputStream(stream))
    try:
        parser = build_parser()
    except PluginLoadFailed as error:
        _report_failure(error)
        return EXIT_CONFIG
    given = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(given)
    except _UsageError as usage:
        return _report_usage(usage, as_json="--json" in given)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    arrived: set[int] = set()
    try:
        with (
            _signals_raised(arrived),
            _logging_to_stderr("warning" if getattr(args, "quiet", False) else args.log_level),
        ):
            return args.handler(args)
    except (_Terminated, KeyboardInterrupt, Exception) as error:
        if isinstance(error, Exception) and not arrived:
            return _report_failure(error, args)
        # an engine may have wrapped it in its own error: DuckDB's query raises RuntimeError
        reached = getattr(args, "reached", None)
        said = "" if reached is None else f": {reached.said()}"
        if isinstance(error, _Terminated) or signal.SIGTERM in arrived:
            return _report_stop("terminated", f"terminated (SIGTERM){said}", args)
        return _report_stop("interrupted", f"interrupted{said}", args)


def _report_stop(kind: str, message: str, args: argparse.Namespace) -> int:
    """A stop by a signal the command did not summarise itself: its line on stderr, and with
    ``--json`` one JSON object on stdout, as a failure's (``_report_failure``)."""
    code = EXIT_TERMINATED if kind == "terminated" else EXIT_INTERRUPTED
    print(f"error: {message}", file=sys.stderr)
    if getattr(args, "json", False) and not getattr(args, "json_printed", False):
        print(json.dumps({"error": kind, "message": message, "exit_code": code}, sort_keys=True))
    return code


class _UsageError(Exception):
    """A command line argparse refused: raised by ``_Parser.error`` instead of its exit."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser, self.message = parser, message


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose usage error ``main`` reports (one JSON object too, with
    ``--json``: a script reading stdout gets an object, not nothing)."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(self, message)


def _report_usage(usage: _UsageError, *, as_json: bool) -> int:
    """argparse's own lines on stderr; with ``--json``, the error as ``config_invalid``."""
    usage.parser.print_usage(sys.stderr)
    message = one_line(usage.message)
    print(f"{usage.parser.prog}: error: {message}", file=sys.stderr)
    if as_json:
        shown = {"error": ConfigInvalid.code, "message": message, "diagnostics": {}}
        print(json.dumps(shown, sort_keys=True))
    return EXIT_CONFIG


class _Terminated(BaseException):
    """SIGTERM, raised in the main thread like Ctrl-C's KeyboardInterrupt."""


@contextlib.contextmanager
def _signals_raised(arrived: set[int]) -> Any:
    """SIGTERM (what schedulers, ``timeout`` and Kubernetes send) ends the command as Ctrl-C
    does: the attempt cleans up (its work folder of source rows, its lease) instead of dying
    where it stands. A second SIGTERM kills at once. Each of the two that arrives is added to
    ``arrived``, so that one an engine wrapped in its own error is still reported as itself.
    Only the main thread can take signals; a signal the process ignores, or that a host
    program handles outside Python (or in its own Python handler, for SIGINT), is left alone."""

    def terminate(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        arrived.add(signum)
        raise _Terminated

    def interrupt(signum: int, frame: Any) -> None:
        arrived.add(signum)
        raise KeyboardInterrupt

    ours: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        if signal.getsignal(signal.SIGTERM) not in (signal.SIG_IGN, None):
            ours[signal.SIGTERM] = terminate
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            ours[signal.SIGINT] = interrupt
    previous = {signum: signal.signal(signum, handler) for signum, handler in ours.items()}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def build_parser() -> argparse.ArgumentParser:
    """The parser: the built-in commands, then one per ``dpone_native_transfer.commands`` plugin.

    A command plugin that fails to load (or clashes with a command name)
    raises ``PluginLoadFailed`` naming the entry point, never a traceback.
    """
    parser = _Parser(
        prog=PROG,
        description="Checkpointed, guarded table transfers.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(
        title="commands", dest="command", metavar="COMMAND", required=True
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--traceback",
        action="store_true",
        help="print the full traceback of a failure (it may contain SQL or data)",
    )
    common.add_argument(
        "--log-level",
        choices=_LOG_LEVELS,
        default="info",
        help="what the package logs to stderr (default: info, with progress lines)",
    )
    built_in = (
        _add_run_command,
        _add_demo_command,
        add_discover_command,
        add_routes_command,
        add_state_command,
        add_rejects_command,
    )
    for add_command in built_in:
        add_command(commands, common)
    for entry_point in sorted(metadata.entry_points(group=COMMANDS_GROUP), key=lambda e: e.name):
        try:
            entry_point.load()(commands, common)
        except Exception as error:
            raise PluginLoadFailed(
                f"the command plugin {entry_point.name!r} could not be loaded",
                diagnostics={"entry_point": entry_point.name, "error_type": type(error).__name__},
            ) from None
    return parser


def _add_run_command(commands: Any, common: argparse.ArgumentParser) -> None:
    run = commands.add_parser(
        "run",
        parents=[common],
        help="run a route file, or the tables of a pipeline file",
        description="Run one guarded transfer of the route described by ROUTE, or of each "
        "table of the pipeline file ROUTE (docs/pipelines.md), at most --jobs at once; one "
        "table of a pipeline is PIPELINE::TABLE.",
        epilog=_EPILOG + _PIPELINE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("route", metavar="ROUTE", help="route file or pipeline file (TOML)")
    run.add_argument(
        "--tables",
        type=_table_names,
        action="extend",
        metavar="A,B",
        help="a pipeline's tables to run (comma-separated, repeatable; default: all of them)",
    )
    run.add_argument(
        "--jobs",
        type=_jobs,
        metavar="N",
        help=f"a pipeline's tables run at most N at once (default: {DEFAULT_JOBS} on this "
        "machine; tables sharing a target table run one after another)",
    )
    run.add_argument(
        "--workers",
        choices=WORKERS,
        help="a pipeline's tables run in threads of this process, or in worker processes "
        "(the first job in this process, each other in a worker); default: auto, processes "
        "into PostgreSQL from 100,000 source rows in all (docs/pipelines.md)",
    )
    run.add_argument(
        "--run-id",
        type=_run_id,
        metavar="ID",
        help="run id recorded in checkpoints and evidence (default: run-<UTC time>-<random>)",
    )
    run.add_argument(
        "--quiet", action="store_true", help="no progress lines on stderr (--log-level warning)"
    )
    run.add_argument(
        "--json", action="store_true", help="print the closing summary as one JSON object"
    )
    run.add_argument(
        "--recovery",
        choices=("manual", "from_target"),
        help="what this run does with batches a crash left blocked: manual (an operator "
        "resolves them; the default) or from_target (resolve those the target's ledger "
        "proves, with an audit record, then run); overrides the route file's [guard] recovery",
    )
    run.add_argument(
        "--unguarded",
        action="store_true",
        help="run without the target-commit guard, on purpose (refused on routes with guards; "
        "a retry after a failure may then append rows twice)",
    )
    run.set_defaults(handler=_run_command)


def _add_demo_command(commands: Any, common: argparse.ArgumentParser) -> None:
    demo = commands.add_parser(
        "demo",
        parents=[common],
        help="show, on local SQLite files, a retry being blocked instead of duplicating rows",
        description="A self-checking story: a failure after the target committed, then a "
        "retry that the guard blocks before it can append the same rows again.",
    )
    demo.add_argument(
        "--workdir",
        default="demo-work",
        metavar="DIR",
        help="folder for the demo's files (default: demo-work); only its own files are replaced",
    )
    demo.set_defaults(handler=_demo_command)


_PIPELINE_EPILOG = """\
  a pipeline exits 3 if any table is blocked, else 1 if any failed, else 0; 2 when the
  pipeline file is invalid, before any table runs
"""


def _table_names(value: str) -> list[str]:
    names = [name.strip() for name in value.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError("give table names separated by commas")
    return names


def _jobs(value: str) -> int:
    try:
        jobs = int(value)
    except ValueError:
        jobs = 0
    if not 1 <= jobs <= MAX_JOBS:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to {MAX_JOBS}")
    return jobs


def _run_id(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("the run id must not be empty")
    if not value.isprintable():  # shown in summaries and `routes`: it could forge a line
        raise argparse.ArgumentTypeError("the run id must hold no newline or control character")
    return value


def _report_failure(error: Exception, args: argparse.Namespace | None = None) -> int:
    """The failure's lines on stderr (``reporting.failure_lines``: its commands naming the
    route file and store run, the full diagnostics with ``--json`` or ``--log-level debug``),
    and with ``run --json`` the error as one JSON object on stdout; the exit status."""
    show_traceback = bool(getattr(args, "traceback", False))
    as_json = bool(getattr(args, "json", False))
    full = as_json or getattr(args, "log_level", None) == "debug"
    if show_traceback:
        traceback.print_exception(error, file=sys.stderr)
        cause = driver_error(error)  # kept off the error's chain: only --traceback shows it
        if cause is not None:
            print(
                "\nthe driver's own error it was made from (its text may hold the host, the "
                "user, the database or SQL):",
                file=sys.stderr,
            )
            traceback.print_exception(cause, file=sys.stderr)
    named = getattr(args, "named", None) or _named(args)
    reached = getattr(args, "reached", None)
    left_blocked = None if reached is None else reached.left_blocked(error)
    lines = failure_lines(error, named, full=full, left_blocked=left_blocked)
    if not isinstance(error, NativeTransferError) and not show_traceback:
        lines[0] += "; rerun with --traceback for details"
    for line in lines:
        print(line, file=sys.stderr)
    if as_json and isinstance(error, NativeTransferError):
        shown = {"error": error.code, "message": named.fill(error.message)}
        print(json.dumps({**shown, "diagnostics": error.diagnostics}, sort_keys=True, default=str))
    elif as_json:  # a foreign error: named by its type alone (its text may hold SQL, rows)
        failed = {"error": "transfer_failed", "exception": type(error).__name__}
        print(json.dumps({**failed, "message": lines[0].removeprefix("error: ")}, sort_keys=True))
    return exit_code_for(error)


def _named(args: argparse.Namespace | None) -> Named:
    """The route file and store the command line named, for the commands a message suggests."""
    route_file = getattr(args, "route", None) or getattr(args, "route_file", None)
    # --store, or the store of the route file a command loaded (``state``: ``route_store``)
    store = getattr(args, "store", None) or getattr(args, "route_store", None)
    return Named(
        route_file=route_file if isinstance(route_file, str) else None,
        store=store if isinstance(store, str) else None,
        scripted=not (sys.stdin is not None and sys.stdin.isatty()),
    )


def _run_command(args: argparse.Namespace) -> int:
    if is_pipeline_file(args.route):
        return _run_pipeline(args)
    config = load_route(args.route)  # first: a file that is not TOML says so
    for given, option in (
        (args.tables, "--tables"),
        (args.jobs, "--jobs"),
        (args.workers, "--workers"),
    ):
        if given:
            raise ConfigInvalid(
                f"{option} is for a pipeline file; ROUTE is a route file (one route)",
                diagnostics={"argument": option},
            )
    args.named = attrs.evolve(_named(args), store=config.store_path)
    args.reached = Reached()
    progress = progress_logger()

    def events(event: Event) -> None:
        args.reached.saw(event)
        progress(event)

    run_id = args.run_id or new_run_id()
    result, seconds = transfer(
        config, run_id, events=events, unguarded=args.unguarded, recovery=args.recovery
    )
    if args.json:
        print(json.dumps(run_summary(config, run_id, result, seconds), sort_keys=True))
    else:
        print(args.named.fill(summary_line(config, run_id, result, seconds)))
    return EXIT_OK


def _run_pipeline(args: argparse.Namespace) -> int:
    """Every selected table of the pipeline; the summary, each failed table's lines (its
    commands naming ``PIPELINE::TABLE``), and the exit status of the worst outcome."""
    if args.unguarded:
        raise ConfigInvalid(
            "--unguarded runs one route file, not a pipeline",
            diagnostics={"argument": "--unguarded"},
        )
    pipeline = load_pipeline(args.route, argument="ROUTE", rows=True)
    tables = pipeline.selected(args.tables)
    run_id = args.run_id or new_run_id()
    progress = logging.getLogger("dpone_native_transfer.progress")

    def report(event: str, number: int, table: PipelineTable, run: TableRun | None) -> None:
        progress.info(table_progress_line(number, len(tables), table.name, run))

    jobs = args.jobs or DEFAULT_JOBS
    workers = chosen_workers(tables, jobs, args.workers or "auto")
    result = run_tables(
        tables, run_id, jobs=jobs, recovery=args.recovery, report=report, workers=workers
    )
    if args.json:
        print(json.dumps(pipeline_summary(result, run_id), sort_keys=True, default=str))
        args.json_printed = True  # a stop's own object would be a second one
    else:
        for line in pipeline_summary_lines(result, run_id):
            print(line)
    full = args.json or args.log_level == "debug"
    scripted = _named(args).scripted
    for run in result.tables:
        if run.failure is None:
            continue
        if args.traceback:
            traceback.print_exception(run.failure, file=sys.stderr)
        store = pipeline.table(run.table, argument="ROUTE").config.store_path
        named = Named(pipeline.reference(run.table), store, scripted)
        for line in failure_lines(run.failure, named, full=full, left_blocked=run.left_blocked):
            print(f"{one_line(run.table)}: {line}", file=sys.stderr)
    if result.interrupted is not None:
        finished = sum(run.outcome in ("succeeded", "failed", "blocked") for run in result.tables)
        args.reached = _Said(
            f"{finished} of {plural(len(tables), 'table')} had finished (the summary above "
            "says which); each table it stopped stops as a single route does"
        )
        raise result.interrupted
    return result.exit_code


@attrs.frozen
class _Said:
    """What an interrupted pipeline says it left behind (``Reached.said`` of a route)."""

    text: str

    def said(self) -> str:
        return self.text

    def left_blocked(self, error: BaseException) -> None:
        return None


_LOG_LEVELS = ("debug", "info", "warning", "error")
_LOGGERS = ("dpone_native_transfer",)  # plugins log under it, as the runtime's own modules


@contextlib.contextmanager
def _logging_to_stderr(level: str) -> Any:
    """The package's log records, at ``level`` and up, as plain lines on stderr, while a
    command runs: the command owns the console, so it adds the handler a library leaves to
    its application, and takes it away again (``main`` may run in-process more than once).
    A driver's own records (psycopg's warning on a lost connection quotes its text) go to a
    null handler on the root logger, not to Python's last-resort handler on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    loggers = [logging.getLogger(name) for name in _LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(level.upper())
    unshown = logging.NullHandler()
    logging.getLogger().addHandler(unshown)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(unshown)
        for logger, old in zip(loggers, levels, strict=True):
            logger.removeHandler(handler)
            logger.setLevel(old)


def _demo_command(args: argparse.Namespace) -> int:
    from .demo import run_demo  # on use only: the demo loads the testing helpers

    return run_demo(Path(args.workdir), sys.stdout)


if __name__ == "__main__":  # python -m dpone_native_transfer.cli
    sys.exit(main())
