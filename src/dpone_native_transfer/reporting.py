"""What the command line, the demo and the Airflow adapter report: exit codes, progress, summaries.

Exit codes are the interface schedulers see: 0 success, 1 failure (a retry
may succeed), 2 bad configuration or usage, 3 the route is blocked until an
operator acts (retrying will not help).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from .checkpoints import Strategy
from .errors import (
    AccessRefused,
    ConfigInvalid,
    ManualReconciliationRequired,
    NativeTransferError,
    SourceMissing,
    StoreTargetMismatch,
    TargetCommitGuardInvalid,
    TargetCommitGuardUnhandled,
    TargetRowsMismatch,
    ValueUnsupported,
)
from .events import Event, EventName
from .wording import PROG, plural, shell_word

if TYPE_CHECKING:
    from .config import RouteConfig
    from .runtime import TransferResult

__all__ = [
    "BLOCKING_ERRORS",
    "ROUTE_FILE",
    "STORE",
    "Named",
    "Reached",
    "EXIT_BLOCKED",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "PROG",
    "declined",
    "exit_code_for",
    "failure_lines",
    "plural",
    "progress_lines",
    "progress_logger",
    "progress_printer",
    "run_summary",
    "shortened",
    "summary_line",
]

EXIT_OK, EXIT_FAILED, EXIT_CONFIG, EXIT_BLOCKED = 0, 1, 2, 3
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143  # 128 + SIGTERM, what a shell reports for a process it ended
BLOCKING_ERRORS = (
    ManualReconciliationRequired,
    StoreTargetMismatch,
    TargetCommitGuardInvalid,
    TargetCommitGuardUnhandled,
)


SHOWN_ITEMS = 5  # list items a printed diagnostics line keeps

# What an error's suggested commands hold in place of what only the caller knows: the route
# file and the store it was run with (``Named`` fills them in).
ROUTE_FILE = "<route file>"
STORE = "<checkpoint store>"
# Operator commands that ask before they write: a scheduler's log suggests them with --yes.
_ASKING = ("--operator NAME",)


@attrs.frozen
class Named:
    """What the reader ran: the route file and store, to put into suggested commands, and
    whether they read a scheduler's log (no terminal to confirm on: commands get ``--yes``).

    ``store`` is shown only when it is a file or ``env:NAME``: a DSN may hold a password,
    so then the placeholder stays (the route file's ``[store] path``).
    """

    route_file: str | None = None
    store: str | None = None
    scripted: bool = False

    def fill(self, text: str) -> str:
        if self.route_file is not None:
            text = text.replace(ROUTE_FILE, shell_word(self.route_file))
        if self.store is not None and "://" not in self.store:
            text = text.replace(STORE, shell_word(_shown_path(self.store)))
        if self.scripted:
            for asking in _ASKING:
                text = text.replace(asking, f"{asking} --yes")
        return text


def _shown_path(path: str) -> str:
    """A file as the reader can type it: relative to the working folder when inside it."""
    if path.startswith("env:") or not os.path.isabs(path):
        return path
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


FULL_DIAGNOSTICS = "(the full diagnostics: --json or --log-level debug)"


def failure_lines(
    error: BaseException,
    named: Named,
    *,
    full: bool = False,
    hint: str = FULL_DIAGNOSTICS,
    left_blocked: str | None = None,
) -> list[str]:
    """What a person reads about a failed command, one line each: the code and message (its
    commands naming the reader's route file and store); for a blocked route a line per blocked
    batch, at most ``SHOWN_ITEMS``; and the diagnostics, cut to short lists, or whole with
    ``full`` (``--json``, ``--log-level debug``). A blocked route's diagnostics list every
    partition: only ``full`` shows them, so the one line a person needs stays on top.
    A foreign error is named by its type. ``left_blocked`` (``Reached.left_blocked``) is
    said under the first line."""
    blocked_now = [f"  {left_blocked}"] if left_blocked else []
    if not isinstance(error, NativeTransferError):  # its text may hold SQL, rows, secrets
        return [f"error: transfer failed with {type(error).__name__}", *blocked_now]
    lines = [f"error: {named.fill(str(error))}", *blocked_now]
    if isinstance(error, BLOCKING_ERRORS):
        lines += _blocked_lines(error.diagnostics)
        if isinstance(error, ManualReconciliationRequired) and named.route_file is not None:
            route = shell_word(named.route_file)
            lines.append(
                f"next: `{PROG} guard verify {route}` says what the target proves of each; "
                f"`{PROG} run {route} --recovery from_target` resolves what it proves, audited"
            )
        if not full:
            return [*lines, hint]
    if full:
        return [
            *lines,
            f"diagnostics: {json.dumps(error.diagnostics, sort_keys=True, default=str)}",
        ]
    short, cut = shortened(error.diagnostics)
    lines.append(f"diagnostics: {json.dumps(short, sort_keys=True, default=str)}")
    if cut:
        lines.append(f"(lists cut to their first {SHOWN_ITEMS} items: --json shows all)")
    return lines


class Reached:
    """How far a run got, from its events: what an interrupted run can say it left behind."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def saw(self, event: Event) -> None:
        self.names.add(event.name)

    def said(self) -> str:
        if EventName.SOURCE_STATE_ADVANCED in self.names:
            return "the run had finished; nothing is left to do"
        if EventName.CHECKPOINTS_COMMITTED in self.names:
            return (
                "the target committed the batch and its checkpoints are promoted; the next run "
                "closes the generation without loading it again"
            )
        if EventName.TARGET_STARTED in self.names:
            return (
                "it stopped during or right after the target call, whose outcome is not "
                "recorded: the route is blocked until it is reconciled (`dpone-transfer guard "
                "verify`, or a run with --recovery from_target)"
            )
        return "it stopped before the target was called: nothing was written; a rerun is safe"

    def left_blocked(self, error: BaseException) -> str | None:
        """What a failed run left blocked although ``error`` is not the block's own, for a
        person to read under it: a guarded target call that raised without its sink saying
        it rolled back (``applied`` False), or a committed batch whose checkpoints were not
        all written; None when the next run is not blocked by this one."""
        if EventName.GUARD_ARMED not in self.names or isinstance(error, BLOCKING_ERRORS):
            return None
        if EventName.TARGET_FAILED in self.names:
            if getattr(error, "applied", None) is False:
                return None
            outcome = "the target call raised, so whether it applied the batch is not known"
        elif EventName.TARGET_SUCCEEDED in self.names:
            if EventName.CHECKPOINTS_COMMITTED in self.names:
                return None
            outcome = "the target committed the batch, but the store did not record it"
        else:
            return None
        return blocked_until_reconciled(outcome)


def blocked_until_reconciled(outcome: str) -> str:
    """``outcome``, and what a person does about the block it left (``left_blocked``)."""
    return (
        f"{outcome}: the route is blocked until it is reconciled (`{PROG} guard verify`, "
        "or a run with --recovery from_target)"
    )


def _blocked_lines(diagnostics: dict[str, Any]) -> list[str]:
    """One line per blocked batch (or malformed partition, or disagreeing batch)."""
    items: dict[str, list[str]] = {}
    for part in diagnostics.get("partitions", []):
        if not isinstance(part, dict):
            continue
        if part.get("problem"):
            items[f"partition {part.get('partition_id')}"] = [f"malformed: {part['problem']}"]
            continue
        batch = f"batch {part.get('batch_id')}"
        items.setdefault(batch, []).append(str(part.get("phase")))
    for batch in diagnostics.get("batch_ids", []) if not items else ():
        items[f"batch {batch}"] = []
    lines = [f"  mismatch: {diagnostics['mismatch']}"] if diagnostics.get("mismatch") else []
    for name, phases in list(items.items())[:SHOWN_ITEMS]:
        counted = ", ".join(f"{phases.count(p)} {p}" for p in sorted(set(phases)))
        lines.append(
            f"  {name}" + (f": {plural(len(phases), 'partition')} ({counted})" if phases else "")
        )
    if len(items) > SHOWN_ITEMS:
        lines.append(f"  ... and {len(items) - SHOWN_ITEMS} more")
    return lines


def shortened(diagnostics: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """Diagnostics fit for one line: each long list cut to its first items plus a count.

    A route blocked on 90 partitions printed one 20 KB line; ``guard scan`` shows
    them all. Returns the shortened copy and whether anything was cut.
    """
    short: dict[str, Any] = {}
    cut = False
    for key, value in diagnostics.items():
        if isinstance(value, list) and len(value) > SHOWN_ITEMS:
            short[key] = value[:SHOWN_ITEMS]
            short[f"{key}_total"] = len(value)
            cut = True
        else:
            short[key] = value
    return short, cut


def exit_code_for(error: BaseException) -> int:
    if isinstance(
        error, ConfigInvalid | SourceMissing | ValueUnsupported | TargetRowsMismatch | AccessRefused
    ):
        return EXIT_CONFIG
    if isinstance(error, BLOCKING_ERRORS):
        return EXIT_BLOCKED
    return EXIT_FAILED


def progress_lines(
    emit: Callable[[str], object], *, clock: Callable[[], float] = time.monotonic
) -> Callable[[Event], None]:
    """Event listener passing ``emit`` a line per extracted or planned partition, at the
    target, per warning. A partition is named by its value (``region=eu``) and its id; the
    rows so far come with their rate since the listener was made (the run's start).

    The lines have no newline: ``emit`` may print them (``progress_printer``) or
    log them (``progress_logger``; the Airflow adapter gives each to the task log).
    """
    start, rows = clock(), [0]

    def listener(event: Event) -> None:
        if event.name == EventName.PARTITION_EXTRACTED:
            rows[0] += event.fields["rows"]
            rate = f"{rows[0]:,} rows so far, {rate_of(rows[0], clock() - start)}"
            extracted = plural(event.fields["rows"], "row")
            line: str | None = f"{_partition(event)} extracted {extracted} ({rate})"
        elif event.name == EventName.PARTITION_PLANNED:
            line = f"{_partition(event)} planned: the target engine reads its rows itself"
        else:
            line = _progress_line(event)
        if line is not None:
            emit(line)

    return listener


def _partition(event: Event) -> str:
    fields = event.fields
    where = f"[{fields['done']}/{fields['of']}]"
    return f"{where} partition {fields['partition']} ({fields['partition_id']})"


class LineStream(Protocol):
    """What the progress printer writes to: a text stream (``sys.stderr``, the demo's output)."""

    def write(self, text: str, /) -> object: ...

    def flush(self) -> object: ...


def progress_printer(stream: LineStream, *, indent: str = "") -> Callable[[Event], None]:
    """``progress_lines`` printed to ``stream``, each line after ``indent`` and flushed."""
    return progress_lines(lambda line: print(indent + line, file=stream, flush=True))


def progress_logger(logger: logging.Logger | None = None) -> Callable[[Event], None]:
    """``progress_lines`` logged at INFO, by default to the ``dpone_native_transfer.progress``
    logger (the package's loggers have no handler: an application decides what is shown)."""
    target = logger or logging.getLogger("dpone_native_transfer.progress")
    return progress_lines(target.info)


def _progress_line(event: Event) -> str | None:
    fields = event.fields
    if event.name == EventName.TARGET_STARTED:
        return f"target: {fields['operation']}"
    if event.name == EventName.GUARD_HEALED:
        verdict = fields["verdict"].replace("_", " ")
        return (
            f"recovered: blocked batch {fields['batch_id']} "
            f"({plural(fields['partitions'], 'partition')}) resolved as {verdict}, as the "
            "target's ledger proves (recovery = from_target; an audit record names this run)"
        )
    if event.name == EventName.MANY_PARTITIONS:
        return (
            f"warning: {fields['partitions']:,} partitions by value of {fields['column']!r}: "
            'each is a checkpoint and a query; partition_by = "range" cuts the key into '
            "ranges of partition_rows rows (see docs/incremental.md)"
        )
    if event.name == EventName.CURSOR_EDGE_UNTRACKED:
        what = "NULL-cursor rows" if fields["part"] == "nulls" else "rows at the watermark"
        return (
            f"warning: the cursor edge no longer tracks {what}: such rows written from now on "
            "are not loaded (nothing is loaded twice; see docs/incremental.md)"
        )
    return None


def rate_of(rows: int, seconds: float) -> str:
    """``rows`` per second, readable at any speed: ``12,345 rows/s``, ``0.5 rows/s``."""
    rate = rows / max(seconds, 1e-9)
    return f"{rate:,.0f} rows/s" if rate >= 10 else f"{rate:.2g} rows/s"


def summary_line(config: RouteConfig, run_id: str, result: TransferResult, seconds: float) -> str:
    refreshed = config.strategy is Strategy.FULL_REFRESH and result.committed_partition_ids
    emptied = "the source is empty, so the target was emptied; " if refreshed else ""
    rate = f", {rate_of(result.rows_loaded, seconds)}" if result.rows_loaded and seconds else ""
    set_aside = (
        f"; warning: {plural(result.rows_quarantined, 'row')} the target cannot hold exactly set "
        f"aside (`{PROG} rejects show {ROUTE_FILE}`)"
        if result.rows_quarantined
        else ""
    )
    return (
        (emptied if not result.rows_loaded else "")
        + f"committed {plural(len(result.committed_partition_ids), 'partition')}, "
        f"skipped {len(result.skipped_partition_ids):,}, "
        f"loaded {plural(result.rows_loaded, 'row')} in {seconds:.2f} s{rate} "
        f"(route {config.label}, {config.strategy}, path {_path_ran(config, result)}, "
        f"run {run_id}" + ("" if result.guarded else ", UNGUARDED") + ")" + set_aside
    )


def _path_ran(config: RouteConfig, result: TransferResult) -> str:
    """``auto (lazy-plan)``: the configured path, and ``auto``'s choice when it made one."""
    chosen = result.path not in (None, config.path)
    return f"{config.path} ({result.path})" if chosen else config.path


def run_summary(
    config: RouteConfig, run_id: str, result: TransferResult, seconds: float
) -> dict[str, Any]:
    """A run's closing summary as one small JSON-safe object (``run --json``, Airflow's XCom);
    the route by its identity, never a location."""
    return {
        "route": config.route.as_dict(),
        "path": config.path,
        "path_ran": result.path,  # the path that ran (``auto``'s choice); None: no target call
        "run_id": run_id,
        "committed_partitions": len(result.committed_partition_ids),
        "skipped_partitions": len(result.skipped_partition_ids),
        "rows_loaded": result.rows_loaded,
        "rows_quarantined": result.rows_quarantined,
        "batch_id": result.batch_id,
        "guarded": result.guarded,
        "seconds": round(seconds, 3),
        "rows_per_second": round(result.rows_loaded / seconds) if seconds > 0 else None,
    }


def declined(question: str, *, yes: bool) -> int | None:
    """None when the operator confirmed (or passed ``--yes``), else the exit status, having
    said why nothing was written: a no is 1; no answer at all, because stdin is closed or
    empty (a script, a scheduler), is 2 with the ``--yes`` that such a caller needs."""
    if yes:
        return None
    print(f"{question} [y/N] ", end="", flush=True)
    answer = sys.stdin.readline() if sys.stdin is not None else ""
    if not (answer.endswith("\n") and sys.stdin.isatty()):
        print()  # the answer was not echoed: end the prompt line
    if answer.strip().lower() in ("y", "yes"):
        return None
    if not answer:
        print(
            "nothing written: there was no answer to ask (stdin is closed or empty, as in a "
            "script); repeat with --yes to write without asking",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    print("nothing written", file=sys.stderr)
    return EXIT_FAILED
