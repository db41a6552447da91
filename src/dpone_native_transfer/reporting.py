"""What the command line, the demo and the Airflow adapter report: exit codes, progress, summaries.

Exit codes are the interface schedulers see: 0 success, 1 failure (a retry
may succeed), 2 bad configuration or usage, 3 the route is blocked until an
operator acts (retrying will not help).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .checkpoints import Strategy
from .errors import (
    AccessRefused,
    ConfigInvalid,
    ManualReconciliationRequired,
    SourceMissing,
    StoreTargetMismatch,
    TargetCommitGuardInvalid,
    TargetCommitGuardUnhandled,
    TargetRowsMismatch,
    ValueUnsupported,
)
from .events import Event, EventName

if TYPE_CHECKING:
    from .config import RouteConfig
    from .runtime import TransferResult

__all__ = [
    "BLOCKING_ERRORS",
    "EXIT_BLOCKED",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_TERMINATED",
    "PROG",
    "confirmed",
    "exit_code_for",
    "plural",
    "progress_lines",
    "progress_logger",
    "progress_printer",
    "run_summary",
    "shortened",
    "summary_line",
]

PROG = "dpone-transfer"
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
            elapsed = max(clock() - start, 1e-9)
            rate = f"{rows[0]:,} rows so far, {rows[0] / elapsed:,.0f} rows/s"
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


def plural(count: int, word: str) -> str:
    suffix = "es" if word.endswith(("ch", "sh", "s", "x")) else "s"
    return f"{count:,} {word}" + ("" if count == 1 else suffix)


def summary_line(config: RouteConfig, run_id: str, result: TransferResult, seconds: float) -> str:
    refreshed = config.strategy is Strategy.FULL_REFRESH and result.committed_partition_ids
    emptied = "the source is empty, so the target was emptied; " if refreshed else ""
    rate = f", {result.rows_loaded / seconds:,.0f} rows/s" if result.rows_loaded and seconds else ""
    return (
        (emptied if not result.rows_loaded else "")
        + f"committed {plural(len(result.committed_partition_ids), 'partition')}, "
        f"skipped {len(result.skipped_partition_ids):,}, "
        f"loaded {plural(result.rows_loaded, 'row')} in {seconds:.2f} s{rate} "
        f"(route {config.label}, {config.strategy}, path {config.path}, run {run_id}"
        + ("" if result.guarded else ", UNGUARDED")
        + ")"
    )


def run_summary(
    config: RouteConfig, run_id: str, result: TransferResult, seconds: float
) -> dict[str, Any]:
    """A run's closing summary as one small JSON-safe object (``run --json``, Airflow's XCom);
    the route by its identity, never a location."""
    return {
        "route": config.route.as_dict(),
        "path": config.path,
        "run_id": run_id,
        "committed_partitions": len(result.committed_partition_ids),
        "skipped_partitions": len(result.skipped_partition_ids),
        "rows_loaded": result.rows_loaded,
        "batch_id": result.batch_id,
        "guarded": result.guarded,
        "seconds": round(seconds, 3),
        "rows_per_second": round(result.rows_loaded / seconds) if seconds > 0 else None,
    }


def confirmed(question: str) -> bool:
    """Ask on stdin; anything but y/yes, an empty line or no stdin at all, is a no."""
    print(f"{question} [y/N] ", end="", flush=True)
    answer = sys.stdin.readline() if sys.stdin is not None else ""
    if not (answer.endswith("\n") and sys.stdin.isatty()):
        print()  # the answer was not echoed: end the prompt line
    return answer.strip().lower() in ("y", "yes")
