"""dpone-transfer: run a route from its TOML file, or watch the guard stop a duplicate append.

Exit codes are the interface schedulers see: 0 success, 1 failure, 2 bad
configuration or usage, 3 the route is blocked until an operator reconciles
it (retrying will not help). Failures that are not dpone's own errors are
reported by type name only: their messages can hold SQL, credentials or rows.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import sqlite3
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from .config import RouteConfig, load_route_config
from .errors import (
    ConfigInvalid,
    ManualReconciliationRequired,
    NativeTransferError,
    TargetCommitGuardInvalid,
    TargetCommitGuardUnhandled,
)
from .events import Event, EventName
from .runtime import TransferResult, TransferRuntime
from .stores.sqlite import SQLiteCheckpointStore
from .testing import (
    FaultyStore,
    InjectedFault,
    RecordingSink,
    build_sample_source,
    guard_phase,
    phase_batch,
)

__all__ = [
    "BLOCKING_ERRORS",
    "EXIT_BLOCKED",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_OK",
    "build_parser",
    "exit_code_for",
    "main",
    "new_run_id",
    "progress_printer",
    "run_demo",
    "summary_line",
    "transfer",
]

PROG = "dpone-transfer"
EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_BLOCKED = 0, 1, 2, 3
EXIT_INTERRUPTED = 130
BLOCKING_ERRORS = (
    ManualReconciliationRequired,
    TargetCommitGuardInvalid,
    TargetCommitGuardUnhandled,
)

_EPILOG = """\
exit codes:
  0  success
  1  the transfer failed (a retry may succeed)
  2  the route file or the command line is invalid
  3  the route is blocked until an operator reconciles it (a retry will not help)
"""

DEMO_FILES = ("source.db", "target.db", "checkpoints.db", "route.toml")
DEMO_ROUTE = """\
# Written by `dpone-transfer demo`. Paths are relative to this file.
[source]
path = "source.db"
table = "orders"
partition_column = "region"
cursor_column = "updated_at"

[target]
path = "target.db"
table = "orders_copy"

[transfer]
strategy = "incremental_append"
path = "staged"
chunk_rows = 10000

[store]
path = "checkpoints.db"

[gates]
min_rows = 1
"""
_INDENT = "   "


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point: returns the exit code instead of exiting."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else int(stop.code is not None)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as error:
        return _report_failure(error, show_traceback=args.traceback)


def build_parser() -> argparse.ArgumentParser:
    """The parser; each subcommand (run, demo, later guard ...) adds its own subparser."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Checkpointed, guarded table transfers.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {_version()}")
    commands = parser.add_subparsers(
        title="commands", dest="command", metavar="COMMAND", required=True
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--traceback",
        action="store_true",
        help="print the full traceback of a failure (it may contain SQL or data)",
    )
    for add_command in (_add_run_command, _add_demo_command):
        add_command(commands, common)
    return parser


def _add_run_command(commands: Any, common: argparse.ArgumentParser) -> None:
    run = commands.add_parser(
        "run",
        parents=[common],
        help="run one route described by a TOML file",
        description="Run one guarded transfer of the route described by ROUTE.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("route", metavar="ROUTE", help="route file (TOML)")
    run.add_argument(
        "--run-id",
        type=_run_id,
        metavar="ID",
        help="run id recorded in checkpoints and evidence (default: run-<UTC time>-<random>)",
    )
    run.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
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


def _run_id(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("the run id must not be empty")
    return value


def _version() -> str:
    try:
        return metadata.version("dpone-native-transfer")
    except metadata.PackageNotFoundError:
        return "unknown"


def exit_code_for(error: BaseException) -> int:
    if isinstance(error, ConfigInvalid):
        return EXIT_CONFIG
    if isinstance(error, BLOCKING_ERRORS):
        return EXIT_BLOCKED
    return EXIT_FAILED


def _report_failure(error: Exception, *, show_traceback: bool) -> int:
    if show_traceback:
        traceback.print_exception(error, file=sys.stderr)
    if isinstance(error, NativeTransferError):
        diagnostics = json.dumps(error.diagnostics, sort_keys=True, default=str)
        print(f"error: {error}", file=sys.stderr)
        print(f"diagnostics: {diagnostics}", file=sys.stderr)
    elif show_traceback:
        print(f"error: transfer failed with {type(error).__name__}", file=sys.stderr)
    else:
        print(
            f"error: transfer failed with {type(error).__name__}; "
            "rerun with --traceback for details",
            file=sys.stderr,
        )
    return exit_code_for(error)


def new_run_id() -> str:
    return f"run-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{secrets.token_hex(3)}"


def progress_printer(stream: TextIO, *, indent: str = "") -> Callable[[Event], None]:
    """Event listener printing one line per extracted partition and one at the target call."""

    def listener(event: Event) -> None:
        line = _progress_line(event)
        if line is not None:
            print(indent + line, file=stream, flush=True)

    return listener


def _progress_line(event: Event) -> str | None:
    fields = event.fields
    if event.name == EventName.PARTITION_EXTRACTED:
        return (
            f"[{fields['done']}/{fields['of']}] partition {fields['partition_id']} "
            f"extracted {fields['rows']:,} rows"
        )
    if event.name == EventName.TARGET_STARTED:
        return f"target: {fields['operation']}"
    return None


def _plural(count: int, word: str) -> str:
    return f"{count:,} {word}" + ("" if count == 1 else "s")


def summary_line(config: RouteConfig, run_id: str, result: TransferResult, seconds: float) -> str:
    return (
        f"committed {_plural(len(result.committed_partition_ids), 'partition')}, "
        f"skipped {len(result.skipped_partition_ids):,}, "
        f"loaded {_plural(result.rows_loaded, 'row')} in {seconds:.2f} s "
        f"(route {config.label}, {config.strategy}, path {config.path}, run {run_id})"
    )


def transfer(
    config: RouteConfig,
    run_id: str,
    *,
    events: Callable[[Event], None] | None = None,
    wrap_store: Callable[[SQLiteCheckpointStore], Any] | None = None,
    sink: Any = None,
) -> tuple[TransferResult, float]:
    """One guarded run of a configured route; returns the result and its duration in seconds.

    The guard comes from its entry point (``plugins=None``); the store is always closed.
    """
    started = time.perf_counter()
    store = _open_store(config.store_path)
    try:
        runtime = TransferRuntime(store if wrap_store is None else wrap_store(store), events=events)
        result = runtime.run(config.spec(run_id, sink=sink))
    finally:
        store.close()
    return result, time.perf_counter() - started


def _open_store(path: str) -> SQLiteCheckpointStore:
    if not os.path.isdir(os.path.dirname(os.path.abspath(path))):
        raise ConfigInvalid(
            "store.path is in a folder that does not exist", diagnostics={"key": "store.path"}
        )
    return SQLiteCheckpointStore(path)


def _run_command(args: argparse.Namespace) -> int:
    config = load_route_config(args.route)
    run_id = args.run_id or new_run_id()
    events = None if args.quiet else progress_printer(sys.stderr)
    result, seconds = transfer(config, run_id, events=events)
    print(summary_line(config, run_id, result, seconds))
    return EXIT_OK


def _demo_command(args: argparse.Namespace) -> int:
    return run_demo(Path(args.workdir), sys.stdout)


def run_demo(workdir: Path, out: TextIO) -> int:
    """The demo story; 0 only if the retry was blocked and no row was appended twice."""
    route_file = _demo_build_source(workdir, out)
    config = load_route_config(route_file, argument="route.toml")
    _demo_first_run(config, out)
    problems = _demo_failed_promotion(config, out)
    problems += _demo_retry(config, out)
    problems += _demo_counts(config, out)
    if problems:
        print("demo FAILED:", file=out)
        for problem in problems:
            print(f"{_INDENT}- {problem}", file=out)
        return EXIT_FAILED
    print(
        "demo passed: the guard stopped the retry before the target; "
        "every source row is in the target exactly once",
        file=out,
    )
    return EXIT_OK


def _say(out: TextIO, *lines: str) -> None:
    for line in lines:
        print(_INDENT + line, file=out)


def _demo_build_source(workdir: Path, out: TextIO) -> Path:
    print("1. build a sample source: 20,000 rows in 8 partitions", file=out)
    workdir.mkdir(parents=True, exist_ok=True)
    for name in DEMO_FILES:
        for suffix in ("", "-wal", "-shm"):
            (workdir / (name + suffix)).unlink(missing_ok=True)
    build_sample_source(workdir / "source.db", rows=20_000, partitions=8)
    route_file = workdir / "route.toml"
    route_file.write_text(DEMO_ROUTE, encoding="utf-8")
    _say(out, f"route file: {route_file}", f"reuse it:   {PROG} run {route_file}")
    return route_file


def _demo_first_run(config: RouteConfig, out: TextIO) -> None:
    print("2. run a guarded transfer from the route file", file=out)
    run_id = "demo-run-1"
    result, seconds = transfer(config, run_id, events=progress_printer(out, indent=_INDENT))
    _say(out, summary_line(config, run_id, result, seconds))


def _demo_failed_promotion(config: RouteConfig, out: TextIO) -> list[str]:
    print(
        "3. append 5,000 rows, run again, and fail the checkpoint promotion "
        "after the target committed",
        file=out,
    )
    build_sample_source(config.source.path, rows=5_000, partitions=8, start_id=20_001)
    injected = InjectedFault("checkpoint promotion failed (injected by the demo)")

    def with_fault(store: SQLiteCheckpointStore) -> FaultyStore:
        faulty = FaultyStore(store)
        faulty.fail_batch(phase_batch("checkpoint_committed"), keep=3, error=injected)
        return faulty

    events = progress_printer(out, indent=_INDENT)
    try:
        transfer(config, "demo-run-2", events=events, wrap_store=with_fault)
    except Exception as error:
        if error is not injected:
            return [f"step 3 failed with {type(error).__name__}, not the injected fault"]
        _say(out, f"the run failed with {type(error).__name__}: the original exception surfaced")
    else:
        return ["step 3 did not fail although a checkpoint failure was injected"]
    _say(out, f"guard phases in the store: {_phase_counts(config)}")
    return []


def _phase_counts(config: RouteConfig) -> str:
    with contextlib.closing(SQLiteCheckpointStore(config.store_path)) as store:
        latest = store.list_latest(config.route)
    counts = Counter(guard_phase(checkpoint) or "none" for checkpoint in latest)
    return ", ".join(f"{phase} {count}" for phase, count in sorted(counts.items()))


def _demo_retry(config: RouteConfig, out: TextIO) -> list[str]:
    print("4. the automatic retry: a plain new run, no faults", file=out)
    sink = RecordingSink(config.sink)
    problems = []
    try:
        transfer(config, "demo-run-3", sink=sink)
    except ManualReconciliationRequired as error:
        _say(out, f"blocked: {error.code}", f"message: {error.message}")
    except NativeTransferError as error:
        problems.append(f"the retry failed with {error.code}, not a manual-reconciliation block")
    else:
        problems.append("the retry was not blocked")
    if sink.target_calls:
        problems.append(f"the retry called the target {sink.target_calls} time(s)")
    else:
        _say(out, "the target was not called")
    return problems


def _demo_counts(config: RouteConfig, out: TextIO) -> list[str]:
    print("5. compare the target with the source", file=out)
    source, target = _quoted(config.source.table), _quoted(config.sink.table)
    source_rows = _scalar(config.source.path, f"SELECT COUNT(*) FROM {source}")
    target_rows = _scalar(config.sink.path, f"SELECT COUNT(*) FROM {target}")
    duplicates = _scalar(config.sink.path, f"SELECT COUNT(*) - COUNT(DISTINCT id) FROM {target}")
    _say(
        out,
        f"source rows {source_rows:,} | target rows {target_rows:,} | duplicate ids {duplicates:,}",
    )
    problems = []
    if duplicates:
        problems.append(f"the target holds {duplicates:,} duplicate id(s)")
    if target_rows != source_rows:
        problems.append(f"the target holds {target_rows:,} rows, the source {source_rows:,}")
    return problems


def _quoted(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _scalar(path: str, sql: str) -> int:
    with contextlib.closing(sqlite3.connect(path)) as connection:
        return connection.execute(sql).fetchone()[0]
